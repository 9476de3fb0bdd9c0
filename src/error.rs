//! The crate-wide error: one variant per module error, so callers can use `?` across modules.

/// Any error from the engine library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Gguf(#[from] crate::gguf::GgufError),
    #[error(transparent)]
    Quant(#[from] crate::quant::QuantError),
    #[error(transparent)]
    Tokenizer(#[from] crate::tokenizer::TokenizerError),
    #[error(transparent)]
    Template(#[from] crate::chat::TemplateError),
    #[error(transparent)]
    Sampler(#[from] crate::sample::SamplerError),
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    #[error(transparent)]
    Backend(#[from] crate::backend::BackendError),
    #[error(transparent)]
    Engine(#[from] crate::engine::EngineError),
}
