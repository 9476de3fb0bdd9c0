//! The binary's own error type, below every module that reports one (the CLI, the model
//! cache, `pull`), so none of them imports another for it.

/// An error in what the user gave us (flags, files, ids, messages): exit code 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct InputError(pub String);
