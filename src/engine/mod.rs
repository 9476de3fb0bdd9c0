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
mod generation;
pub mod report;
mod request;
mod session;
mod stop;

pub use self::core::Engine;
#[cfg(not(target_arch = "wasm32"))]
pub use drive::generate;
pub use drive::{check_fits, generate_async, generate_pausing, head_of, Flow};
#[cfg(not(target_arch = "wasm32"))]
pub use embed::embed;
pub use embed::{embed_async, normalize, EmbedLimits, Embedding, Pooling};
pub use generation::{Finish, Generation, Head, Settings, Step, TokenLogprob, Usage, Want};
pub use request::{tool_names, Prepared, Prompt, Request};
pub use session::{forward_batch, BatchItem, Session, SessionConfig};
pub use stop::StopMatcher;

use crate::backend::BackendError;
use crate::chat::TemplateError;
use crate::grammar::GrammarError;
use crate::model::ModelError;
use crate::sample::SamplerError;

/// Errors from preparing a request or running a session.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error(transparent)]
    Sampler(#[from] SamplerError),
    #[error(transparent)]
    Grammar(#[from] GrammarError),
    #[error("{needed} tokens do not fit the context of {n_ctx} tokens")]
    ContextOverflow { needed: usize, n_ctx: usize },
    #[error(
        "the prompt has {tokens} tokens, but the context holds {n_ctx} (with room for at least one generated token)"
    )]
    PromptTooLong { tokens: usize, n_ctx: usize },
    #[error("no tokens to evaluate")]
    EmptyInput,
    #[error("the number of tokens to generate must be at least 1")]
    NothingToGenerate,
    #[error("token id {token} is outside the vocabulary ({n_vocab} tokens)")]
    TokenOutOfRange { token: u32, n_vocab: usize },
    #[error("{problem}")]
    Invalid { param: String, problem: String },
    #[error("the sessions of one batch must run the same model")]
    MixedModels,
    #[error("asked for logits of the last {wanted} of {given} tokens")]
    TooManyLogits { wanted: usize, given: usize },
    #[error("the output head returned another kind of result than asked for")]
    WrongResult,
    #[error("the answer has already finished")]
    Finished,
}

impl EngineError {
    /// Whether the caller's request caused it (as opposed to the machine).
    pub fn is_input(&self) -> bool {
        use EngineError::*;
        matches!(
            self,
            ContextOverflow { .. }
                | PromptTooLong { .. }
                | EmptyInput
                | NothingToGenerate
                | TokenOutOfRange { .. }
                | Invalid { .. }
                | Template(_)
                | Sampler(_)
                | Model(ModelError::Backend(BackendError::TokenOutOfRange { .. }))
                | Model(ModelError::CacheType { .. })
        )
    }
}
