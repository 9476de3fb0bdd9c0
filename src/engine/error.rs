//! The engine's error: what preparing a request or running a session can fail on.

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
