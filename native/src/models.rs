//! Model names on the command line: a path, or an alias resolved in the model cache.
//!
//! The cache is `$TINYLLM_MODELS`, default `~/.cache/tinyllm/models`; `scripts/fetch-models.sh`
//! fills it (and later `tinyllm-native pull`).

use crate::cli::InputError;
use std::path::PathBuf;

/// A model known by a short name.
pub struct Alias {
    pub name: &'static str,
    pub file: &'static str,
}

/// The built-in aliases; the first is the default model.
pub const ALIASES: &[Alias] = &[
    Alias { name: "qwen2.5-coder:0.5b", file: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" },
    Alias { name: "gemma3:270m", file: "gemma-3-270m-q4_k_m.gguf" },
];

/// The model cache directory.
pub fn cache_dir() -> PathBuf {
    match std::env::var_os("TINYLLM_MODELS") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/tinyllm/models"),
    }
}

/// Resolve `MODEL` (a path or an alias) to a file path.
pub fn resolve(model: &str) -> Result<PathBuf, InputError> {
    if let Some(alias) = ALIASES.iter().find(|a| a.name == model) {
        let path = cache_dir().join(alias.file);
        if !path.is_file() {
            return Err(InputError(format!(
                "model '{model}' is not in the cache ({}); fetch it with scripts/fetch-models.sh",
                path.display()
            )));
        }
        return Ok(path);
    }
    let path = PathBuf::from(model);
    if path.is_file() {
        return Ok(path);
    }
    let names: Vec<&str> = ALIASES.iter().map(|a| a.name).collect();
    Err(InputError(format!(
        "model '{model}' is neither a readable file nor a known alias ({})",
        names.join(", ")
    )))
}
