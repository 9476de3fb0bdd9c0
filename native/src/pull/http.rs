//! The URL source: a blocking HTTP(S) download (ureq with rustls) into `NAME.part`, resumed with
//! a `Range` request when an earlier run was interrupted.
//!
//! Servers that ignore `Range` answer 200 with the whole file; that body is then written from the
//! start instead, so a resumed download is never corrupted by a server's limitations.

use super::cache::{create_cache, finish, io_err, is_cached, part_path, HashingWriter, PullError, Pulled};
use super::progress::Progress;
use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::path::Path;
use std::time::Duration;
use ureq::http::{header, Response, StatusCode, Uri};

/// Download `url` into `cache` under the URL's file name, checking `sha256` when given.
pub fn pull_url(url: &str, sha256: Option<&str>, cache: &Path) -> Result<Pulled, PullError> {
    let name = file_name(url)?;
    create_cache(cache)?;
    let dest = cache.join(&name);
    if is_cached(&dest, sha256)? {
        return Ok(Pulled {
            path: dest,
            cached: true,
        });
    }
    let part = part_path(&dest);
    let agent = agent();
    let mut have = std::fs::metadata(&part)
        .ok()
        .filter(|m| m.is_file())
        .map_or(0, |m| m.len());

    let response = loop {
        if have > 0 {
            eprintln!("resuming {name} at byte {have}");
        } else {
            eprintln!("fetching {name} from {url}");
        }
        let response = get(&agent, url, have)?;
        let status = response.status();
        if status == StatusCode::PARTIAL_CONTENT && range_start(&response) != Some(have) {
            if have == 0 {
                return Err(PullError::Status {
                    url: url.to_string(),
                    status: status.as_u16(),
                });
            }
            eprintln!("{name}: the server sent a different range than asked for; starting over");
            have = 0;
            continue;
        }
        if status == StatusCode::RANGE_NOT_SATISFIABLE && have > 0 {
            // The part file is as long as the file or longer: it cannot be trusted to be a prefix.
            eprintln!("{name}: the server cannot resume at byte {have}; starting over");
            have = 0;
            continue;
        }
        if !status.is_success() {
            return Err(PullError::Status {
                url: url.to_string(),
                status: status.as_u16(),
            });
        }
        if have > 0 && status != StatusCode::PARTIAL_CONTENT {
            eprintln!("{name}: the server ignored the range request; starting over");
            have = 0;
        }
        break response;
    };

    let total = if have > 0 {
        range_total(&response)
    } else {
        response.body().content_length()
    };
    let file = if have > 0 {
        OpenOptions::new().append(true).open(&part).map_err(io_err(&part))?
    } else {
        File::create(&part).map_err(io_err(&part))?
    };
    let mut out = HashingWriter::new(file);
    if have > 0 {
        let existing = File::open(&part).map_err(io_err(&part))?;
        out.absorb(existing.take(have)).map_err(io_err(&part))?;
    }

    let mut progress = Progress::new(&name, total, have);
    let mut body = response.into_body().into_reader();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = match body.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(error) => {
                progress.finish();
                out.flush().map_err(io_err(&part))?;
                return Err(PullError::Interrupted {
                    url: url.to_string(),
                    have: out.written(),
                    total: total.map_or("?".to_string(), |t| t.to_string()),
                    error,
                });
            }
        };
        out.write_all(&buf[..n]).map_err(io_err(&part))?;
        progress.inc(n as u64);
    }
    progress.finish();
    out.flush().map_err(io_err(&part))?;
    if let Some(expected) = total {
        if out.written() != expected {
            return Err(PullError::Short {
                url: url.to_string(),
                have: out.written(),
                expected,
            });
        }
    }
    let (file, got) = out.into_parts();
    drop(file);
    finish(&part, &dest, &got, sha256)
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        // Statuses are ours to explain (206 vs 200 matters for resuming).
        .http_status_as_error(false)
        .timeout_connect(Some(Duration::from_secs(30)))
        .timeout_recv_response(Some(Duration::from_secs(60)))
        .user_agent(concat!("tinyllm-native/", env!("CARGO_PKG_VERSION")))
        .build()
        .new_agent()
}

fn get(agent: &ureq::Agent, url: &str, from: u64) -> Result<Response<ureq::Body>, PullError> {
    let mut request = agent.get(url);
    if from > 0 {
        request = request.header(header::RANGE, format!("bytes={from}-"));
    }
    request.call().map_err(|error| match error {
        ureq::Error::BadUri(reason) => PullError::BadUrl {
            url: url.to_string(),
            reason,
        },
        error => PullError::Http {
            url: url.to_string(),
            error,
        },
    })
}

/// `Content-Range: bytes START-END/TOTAL` of a 206 answer.
fn content_range(response: &Response<ureq::Body>) -> Option<(u64, Option<u64>)> {
    let value = response.headers().get(header::CONTENT_RANGE)?.to_str().ok()?;
    let (range, total) = value.strip_prefix("bytes ")?.split_once('/')?;
    let start = range.split_once('-')?.0.trim().parse().ok()?;
    Some((start, total.trim().parse().ok()))
}

fn range_start(response: &Response<ureq::Body>) -> Option<u64> {
    content_range(response).map(|(start, _)| start)
}

/// The size of the remaining body of a 206 answer, from its `Content-Length` or else its
/// `Content-Range`.
fn range_total(response: &Response<ureq::Body>) -> Option<u64> {
    let (start, total) = content_range(response)?;
    let whole = total.or_else(|| response.body().content_length().map(|len| start + len))?;
    Some(whole)
}

/// The cache file name a URL stands for: its last path segment, percent-decoded, which must be a
/// plain name (no separators, not hidden, not `..`) so nothing is written outside the cache.
pub(super) fn file_name(url: &str) -> Result<String, PullError> {
    let uri: Uri = url
        .parse()
        .map_err(|e: ureq::http::uri::InvalidUri| PullError::BadUrl {
            url: url.to_string(),
            reason: e.to_string(),
        })?;
    if uri.host().is_none_or(str::is_empty) {
        return Err(PullError::BadUrl {
            url: url.to_string(),
            reason: "no host".to_string(),
        });
    }
    let segment = uri.path().rsplit('/').next().unwrap_or("");
    if segment.is_empty() {
        return Err(PullError::NoFileName(url.to_string()));
    }
    let unsafe_name = |name: &str| PullError::UnsafeName {
        url: url.to_string(),
        name: name.to_string(),
    };
    let name = percent_encoding::percent_decode_str(segment)
        .decode_utf8()
        .map_err(|_| unsafe_name(segment))?
        .into_owned();
    let plain = name.len() <= 255
        && !name.starts_with('.')
        && !name.ends_with(".part")
        && !name.chars().any(|c| matches!(c, '/' | '\\' | ':') || c.is_control());
    if !plain {
        return Err(unsafe_name(&name));
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names() {
        assert_eq!(
            file_name("https://h.example/a/b/model-Q4_K_M.gguf?download=true").unwrap(),
            "model-Q4_K_M.gguf"
        );
        assert_eq!(file_name("http://h.example/m%20x.gguf").unwrap(), "m x.gguf");
        assert!(matches!(
            file_name("https://h.example/a/"),
            Err(PullError::NoFileName(_))
        ));
        assert!(matches!(file_name("https://h.example"), Err(PullError::NoFileName(_))));
        for bad in [
            "http://h/..",
            "http://h/a/%2e%2e",
            "http://h/%2e%2e%2fx",
            "http://h/a%2Fb",
            "http://h/.hidden",
            "http://h/x.part",
        ] {
            assert!(matches!(file_name(bad), Err(PullError::UnsafeName { .. })), "{bad}");
        }
    }
}
