//! `pull`: put a model file into the model cache, safely.
//!
//! Every source (an HTTP URL in [`http`], the chunked wheels of an alias in [`registry`]) writes
//! into `NAME.part` next to the final file while hashing what it writes, and then hands over to
//! `cache::finish`, which checks the SHA-256 and renames the file into place. A rename within one
//! directory is atomic, so the cache only ever holds complete files (or leftover `.part` files,
//! which the URL source resumes).
//!
//! A file whose SHA-256 was checked leaves a stamp `.NAME.sha256-ok` beside it, as
//! `scripts/fetch-models.sh` does, so later runs need not hash hundreds of MB again.

mod cache;
mod http;
mod progress;
mod registry;

pub use cache::{parse_sha256, PullError, Pulled};
pub use http::pull_url;
pub use registry::pull_alias;

use std::path::Path;

/// Pull `what`: an alias from the table, or an http(s) URL (with an optional known SHA-256).
pub fn pull(what: &str, sha256: Option<&str>, cache: &Path) -> Result<Pulled, PullError> {
    let sha256 = sha256.map(parse_sha256).transpose()?;
    if let Some(alias) = crate::aliases::alias(what) {
        if let Some(given) = &sha256 {
            if given != alias.sha256 {
                return Err(PullError::AliasPinned {
                    alias: what.to_string(),
                    pinned: alias.sha256,
                });
            }
        }
        return pull_alias(alias, cache);
    }
    let lower = what.to_ascii_lowercase();
    if lower.starts_with("http://") || lower.starts_with("https://") {
        return pull_url(what, sha256.as_deref(), cache);
    }
    Err(PullError::UnknownModel(what.to_string()))
}
