//! [`BackendError`]: what placing weights or running an op can fail with, on every backend.

use crate::gguf::GgufError;
use crate::quant::{GgmlType, QuantError};

/// Errors from placing weights or running ops.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Quant(#[from] QuantError),
    #[error("tensor '{tensor}' has type {ty}, which the {backend} backend cannot multiply")]
    UnsupportedType {
        tensor: String,
        ty: GgmlType,
        backend: &'static str,
    },
    #[error("tensor '{tensor}': {problem}")]
    BadTensor { tensor: String, problem: String },
    #[error("{op}: {problem}")]
    Shape { op: &'static str, problem: String },
    #[error("token id {token} is outside the embedding table ({n_vocab} rows)")]
    TokenOutOfRange { token: u32, n_vocab: usize },
    #[error("cannot start the thread pool: {0}")]
    ThreadPool(String),
    /// The device failed (a GPU backend: a shader that does not build, a lost device, a
    /// mapping that fails), as opposed to arguments that do not fit ([`Self::Shape`]).
    #[error("{op}: the device failed: {problem}")]
    Device { op: &'static str, problem: String },
    /// A backend this build or machine does not offer.
    #[error("backend '{backend}' is not available: {reason}")]
    Unavailable { backend: &'static str, reason: String },
}

/// A [`BackendError::Shape`] of `op`.
pub fn shape(op: &'static str, problem: String) -> BackendError {
    BackendError::Shape { op, problem }
}

/// Error unless a buffer (`what` of `op`) holds at least `need` values.
pub fn need(op: &'static str, what: &str, have: usize, need: usize) -> Result<(), BackendError> {
    if have < need {
        return Err(shape(op, format!("{what} holds {have} values, needs {need}")));
    }
    Ok(())
}
