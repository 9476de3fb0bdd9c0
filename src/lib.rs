//! tinyllm: one engine for running GGUF language models everywhere.
//!
//! The pieces every target shares: the GGUF loader ([`gguf`]), tensor formats ([`quant`]),
//! tokenizers ([`tokenizer`]), chat-template rendering ([`chat`]) and the sampler
//! ([`sample`]). Builds for native targets and for `wasm32-unknown-unknown`.

pub mod backend;
pub mod chat;
pub mod engine;
mod error;
pub mod gguf;
pub mod model;
pub mod quant;
pub mod sample;
pub mod tokenizer;

pub use error::Error;
