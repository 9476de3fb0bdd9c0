//! Errors from reading a model's configuration or running its graph.

use crate::backend::{BackendError, KvType};
use crate::gguf::GgufError;

/// Errors from reading a model's configuration or running its graph.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("unsupported architecture '{arch}' (supported: {supported})")]
    UnsupportedArch { arch: String, supported: String },
    #[error("metadata key '{key}': {problem}")]
    BadParam { key: String, problem: String },
    #[error("missing tensor '{name}'")]
    MissingTensor { name: String },
    #[error("tensor '{name}' was not placed while the file streamed in")]
    NotPlaced { name: String },
    #[error("tensor '{name}' has shape {actual}, expected {expected}")]
    TensorShape {
        name: String,
        expected: String,
        actual: String,
    },
    #[error("chunk of {rows} rows exceeds the scratch capacity of {capacity}")]
    ChunkTooLarge { rows: usize, capacity: usize },
    #[error("batch sequence {seq}: {problem}")]
    BadBatch { seq: usize, problem: String },
    #[error("cannot go back to {to} of {held} evaluated tokens: {why}")]
    BadRewind { to: usize, held: usize, why: String },
    #[error("a sequence state of another model kind")]
    ForeignState,
    /// The KV cache format asked for cannot hold this model's cache.
    #[error("KV cache type {ty} cannot be used with this model: {problem}")]
    CacheType { ty: KvType, problem: String },
}
