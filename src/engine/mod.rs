//! Running a model over token streams: the KV cache ([`KvCache`]) and [`Session`] (chunked
//! prefill, decoding, prefix reuse across prompts).

mod generate;
mod kv;
mod session;

pub use generate::{generate, Flow, GenerateParams, Generation, StopReason, Timings, TokenEvent};
pub use kv::KvCache;
pub use session::{forward_batch, forward_batch_candidates, BatchItem, Session, SessionConfig};

use crate::backend::BackendError;
use crate::model::ModelError;

/// Errors from running a session.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("{needed} tokens do not fit the context of {n_ctx} tokens")]
    ContextOverflow { needed: usize, n_ctx: usize },
    #[error("no tokens to evaluate")]
    EmptyInput,
    #[error("the number of tokens to generate must be at least 1")]
    NothingToGenerate,
    #[error("token id {token} is outside the vocabulary ({n_vocab} tokens)")]
    TokenOutOfRange { token: u32, n_vocab: usize },
    #[error("the sessions of one batch must run the same model")]
    MixedModels,
    #[error("asked for logits of the last {wanted} of {given} tokens")]
    TooManyLogits { wanted: usize, given: usize },
}
