//! Running a model: sessions and the generation pipeline every front end shares.
//!
//! ```text
//! Prompt (chat messages + tools | text | ids)
//!   -> Engine::prepare     template, forced tool call, tokens, routing      (request, core)
//!   -> Session             prefill with prefix reuse, decode passes         (session)
//!   -> Generation          sampler -> stop strings -> streaming detokenizer
//!                          -> output router (content, reasoning, tool calls) -> usage and timings
//! ```
//! A [`Generation`] takes the output head's result after each pass; [`generate`] drives one
//! sequence (CLI, browser), the server's scheduler drives many in batched passes.

mod core;
mod drive;
mod embed;
mod error;
mod generation;
pub mod report;
mod request;
mod session;
mod settings;
mod stop;

pub use self::core::Engine;
#[cfg(not(target_arch = "wasm32"))]
pub use drive::generate;
pub use drive::{check_fits, generate_async, generate_pausing, head_of, Flow};
#[cfg(not(target_arch = "wasm32"))]
pub use embed::embed;
pub use embed::{embed_async, normalize, EmbedLimits, Embedding, Pooling};
pub use error::EngineError;
pub use generation::{Finish, Generation, Head, Step, TokenLogprob, Usage, Want};
pub use request::{tool_names, Prepared, Prompt, Request};
pub use session::{forward_batch, BatchItem, Session, SessionConfig};
pub use settings::Settings;
pub use stop::StopMatcher;
