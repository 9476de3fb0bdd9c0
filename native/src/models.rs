//! Model names on the command line: a path, or an alias resolved in the model cache.
//!
//! The cache is `$TINYLLM_MODELS`, default `~/.cache/tinyllm/models`; `tinyllm-native pull` (or
//! `scripts/fetch-models.sh`, which CI uses) fills it. [`resolve`] never touches the network, so
//! tests and offline commands behave predictably; [`ensure_model`] is the variant for commands
//! that should fetch the default model on first use.

use crate::aliases::{alias, alias_names};
use crate::error::InputError;
use std::path::PathBuf;

/// The model cache directory.
pub fn cache_dir() -> PathBuf {
    match std::env::var_os("TINYLLM_MODELS") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/tinyllm/models"),
    }
}

/// Resolve `MODEL` (a path or an alias) to a file path, without fetching anything.
pub fn resolve(model: &str) -> Result<PathBuf, InputError> {
    if let Some(alias) = alias(model) {
        let path = cache_dir().join(alias.file);
        if !path.is_file() {
            return Err(InputError(format!(
                "model '{model}' is not in the cache ({}); fetch it with `tinyllm-native pull {model}`",
                path.display()
            )));
        }
        return Ok(path);
    }
    let path = PathBuf::from(model);
    if path.is_file() {
        return Ok(path);
    }
    Err(InputError(format!(
        "model '{model}' is neither a readable file nor a known alias ({})",
        alias_names()
    )))
}

/// Like [`resolve`], but an alias missing from the cache is pulled first (progress on stderr).
/// For commands such as `run` and `serve` that should work on first use with the default model.
pub fn ensure_model(model: &str) -> anyhow::Result<PathBuf> {
    if let Some(alias) = alias(model) {
        let path = cache_dir().join(alias.file);
        if !path.is_file() {
            return Ok(crate::pull::pull_alias(alias, &cache_dir())?.path);
        }
    }
    Ok(resolve(model)?)
}
