//! `pull URL` against a small HTTP/1.1 server inside the test (127.0.0.1, ephemeral port) that
//! serves a generated 3 MB file, honours `Range: bytes=N-` with 206, and can drop a connection
//! halfway or ignore `Range`. The server logs every request and counts the body bytes it sent,
//! so the tests check what went over the wire, not only what the CLI says.

use sha2::{Digest, Sha256};
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

const SIZE: usize = 3 * 1024 * 1024;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Mode {
    Normal,
    /// Send the headers and half of the body, then close; later requests are served normally.
    DropHalfOnce,
    /// Answer every request with 200 and the whole file.
    IgnoreRange,
}

#[derive(Debug, Clone)]
struct Req {
    path: String,
    range: Option<u64>,
}

struct State {
    data: Vec<u8>,
    mode: Mutex<Mode>,
    log: Mutex<Vec<Req>>,
    served: AtomicU64,
}

struct Server {
    base: String,
    state: Arc<State>,
}

impl Server {
    fn start(mode: Mode) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(State {
            data: test_data(),
            mode: Mutex::new(mode),
            log: Mutex::new(Vec::new()),
            served: AtomicU64::new(0),
        });
        let s = state.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                // One connection at a time, `Connection: close`: the client is sequential.
                let _ = serve(stream, &s);
            }
        });
        Server { base, state }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn log(&self) -> Vec<Req> {
        self.state.log.lock().unwrap().clone()
    }

    fn served(&self) -> u64 {
        self.state.served.load(Ordering::SeqCst)
    }
}

fn serve(stream: TcpStream, state: &State) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let mut range = None;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.trim().eq_ignore_ascii_case("range") {
                let v = v.trim();
                range = v
                    .strip_prefix("bytes=")
                    .and_then(|r| r.strip_suffix('-'))
                    .and_then(|n| n.parse().ok());
                assert!(range.is_some(), "unexpected Range header {v:?}");
            }
        }
    }
    state.log.lock().unwrap().push(Req {
        path: path.clone(),
        range,
    });
    let mut out = stream;
    if path != "/files/model.bin" {
        return out.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\nConnection: close\r\n\r\nnot found");
    }
    let mode = *state.mode.lock().unwrap();
    let len = state.data.len() as u64;
    let (head, from) = match range {
        Some(n) if mode != Mode::IgnoreRange && n >= len => {
            let head = format!("HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */{len}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
            return out.write_all(head.as_bytes());
        }
        Some(n) if mode != Mode::IgnoreRange => (
            format!(
                "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {n}-{}/{len}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                len - 1,
                len - n
            ),
            n as usize,
        ),
        _ => (format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"), 0),
    };
    out.write_all(head.as_bytes())?;
    let mut body = &state.data[from..];
    if mode == Mode::DropHalfOnce {
        body = &body[..body.len() / 2];
        *state.mode.lock().unwrap() = Mode::Normal;
    }
    for chunk in body.chunks(64 * 1024) {
        out.write_all(chunk)?;
        state.served.fetch_add(chunk.len() as u64, Ordering::SeqCst);
    }
    out.flush()
}

/// 3 MB of deterministic, incompressible-looking bytes.
fn test_data() -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..SIZE)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect()
}

fn sha256_hex(data: &[u8]) -> String {
    Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect()
}

fn pull(cache: &Path, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tinyllm-native"));
    cmd.arg("pull").args(args).env("TINYLLM_MODELS", cache);
    for var in [
        "http_proxy",
        "HTTP_PROXY",
        "https_proxy",
        "HTTPS_PROXY",
        "all_proxy",
        "ALL_PROXY",
    ] {
        cmd.env_remove(var);
    }
    cmd.output().expect("run tinyllm-native")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn assert_ok(out: &Output) -> String {
    assert!(out.status.success(), "exit {:?}: {}", out.status.code(), stderr(out));
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => Vec::new(),
    };
    names.sort();
    names
}

#[test]
fn full_download_with_checksum() {
    let server = Server::start(Mode::Normal);
    let cache = tempfile::tempdir().unwrap();
    let sum = sha256_hex(&server.state.data);
    let out = pull(
        cache.path(),
        &[&server.url("/files/model.bin"), "--sha256", &sum.to_uppercase()],
    );
    let stdout = assert_ok(&out);
    let dest = cache.path().join("model.bin");
    assert_eq!(stdout.trim(), format!("ok {}", dest.display()));
    assert!(
        std::fs::read(&dest).unwrap() == server.state.data,
        "downloaded bytes differ"
    );
    assert_eq!(files_in(cache.path()), [".model.bin.sha256-ok", "model.bin"]);
    assert_eq!(server.log().len(), 1);
    assert_eq!(server.log()[0].path, "/files/model.bin");
    assert_eq!(server.log()[0].range, None);
    assert_eq!(server.served(), SIZE as u64);
}

#[test]
fn resumes_after_dropped_connection() {
    let server = Server::start(Mode::DropHalfOnce);
    let cache = tempfile::tempdir().unwrap();
    let url = server.url("/files/model.bin");
    let sum = sha256_hex(&server.state.data);

    let first = pull(cache.path(), &[&url, "--sha256", &sum]);
    assert_eq!(first.status.code(), Some(1), "{}", stderr(&first));
    assert!(stderr(&first).contains("resume"), "{}", stderr(&first));
    let part = cache.path().join("model.bin.part");
    let have = std::fs::metadata(&part).expect("a .part file is left to resume").len();
    assert!(have > 0 && have < SIZE as u64, "part file holds {have} bytes");
    assert!(!cache.path().join("model.bin").exists());

    let second = pull(cache.path(), &[&url, "--sha256", &sum]);
    assert_ok(&second);
    let log = server.log();
    assert_eq!(log.len(), 2, "{log:?}");
    assert_eq!(log[1].range, Some(have), "the second run must ask for the rest only");
    // Half the file, then the rest: about one file's worth in total, not two.
    let served = server.served();
    assert!(
        served >= SIZE as u64 && served < SIZE as u64 + SIZE as u64 / 10,
        "served {served} bytes"
    );
    assert!(std::fs::read(cache.path().join("model.bin")).unwrap() == server.state.data);
    assert!(!part.exists());
}

#[test]
fn server_ignoring_range_restarts_cleanly() {
    let server = Server::start(Mode::IgnoreRange);
    let cache = tempfile::tempdir().unwrap();
    // A leftover part file whose bytes are not the file's: appending to it would corrupt.
    std::fs::write(cache.path().join("model.bin.part"), vec![0xAAu8; 1_000_000]).unwrap();
    let sum = sha256_hex(&server.state.data);
    let out = pull(cache.path(), &[&server.url("/files/model.bin"), "--sha256", &sum]);
    assert_ok(&out);
    assert!(stderr(&out).contains("ignored the range request"), "{}", stderr(&out));
    let log = server.log();
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log[0].range, Some(1_000_000));
    assert!(std::fs::read(cache.path().join("model.bin")).unwrap() == server.state.data);
    assert_eq!(files_in(cache.path()), [".model.bin.sha256-ok", "model.bin"]);
}

#[test]
fn checksum_mismatch_deletes_the_download() {
    let server = Server::start(Mode::Normal);
    let cache = tempfile::tempdir().unwrap();
    let wrong = "0123456789abcdef".repeat(4);
    let out = pull(cache.path(), &[&server.url("/files/model.bin"), "--sha256", &wrong]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("checksum mismatch"), "{err}");
    assert!(err.contains(&wrong), "expected hash missing: {err}");
    assert!(
        err.contains(&sha256_hex(&server.state.data)),
        "actual hash missing: {err}"
    );
    assert!(
        files_in(cache.path()).is_empty(),
        "left behind: {:?}",
        files_in(cache.path())
    );
}

#[test]
fn not_found_is_a_clear_error() {
    let server = Server::start(Mode::Normal);
    let cache = tempfile::tempdir().unwrap();
    let url = server.url("/files/missing.gguf");
    let out = pull(cache.path(), &[&url]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("HTTP 404") && err.contains(&url), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        files_in(cache.path()).is_empty(),
        "left behind: {:?}",
        files_in(cache.path())
    );
}

#[test]
fn cached_file_makes_no_request() {
    let server = Server::start(Mode::Normal);
    let cache = tempfile::tempdir().unwrap();
    let url = server.url("/files/model.bin");
    let dest = cache.path().join("model.bin");
    std::fs::write(&dest, &server.state.data).unwrap();
    let sum = sha256_hex(&server.state.data);
    for args in [vec![url.as_str()], vec![url.as_str(), "--sha256", sum.as_str()]] {
        let stdout = assert_ok(&pull(cache.path(), &args));
        assert!(stdout.contains("ok (cached)"), "{stdout}");
    }
    assert!(server.log().is_empty(), "requests made: {:?}", server.log());
}

#[test]
fn cached_file_with_wrong_hash_is_fetched_again() {
    let server = Server::start(Mode::Normal);
    let cache = tempfile::tempdir().unwrap();
    let dest = cache.path().join("model.bin");
    std::fs::write(&dest, b"stale").unwrap();
    let sum = sha256_hex(&server.state.data);
    let stdout = assert_ok(&pull(
        cache.path(),
        &[&server.url("/files/model.bin"), "--sha256", &sum],
    ));
    assert!(!stdout.contains("cached"), "{stdout}");
    assert_eq!(server.log().len(), 1);
    assert!(std::fs::read(&dest).unwrap() == server.state.data);
}

#[test]
fn connection_refused_is_a_network_error() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let cache = tempfile::tempdir().unwrap();
    let out = pull(cache.path(), &[&format!("http://127.0.0.1:{port}/m.gguf")]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(&format!("127.0.0.1:{port}/m.gguf")), "{err}");
    assert!(
        files_in(cache.path()).is_empty(),
        "left behind: {:?}",
        files_in(cache.path())
    );
}

#[test]
fn bad_input_exits_2() {
    let cache = tempfile::tempdir().unwrap();
    for (args, needle) in [
        (vec!["http://127.0.0.1:9/"], "names no file"),
        (vec!["http://127.0.0.1:9/a/%2e%2e"], "not a plain file name"),
        (vec!["http://127.0.0.1:9/x%2F..%2F..%2Fescape"], "not a plain file name"),
        (vec!["no-such-model:1b"], "not a known alias"),
        (
            vec!["http://127.0.0.1:9/m.gguf", "--sha256", "abc"],
            "not 64 hex digits",
        ),
        (vec!["gemma3:270m", "--sha256", &"0".repeat(64)], "pinned"),
    ] {
        let out = pull(cache.path(), &args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    assert!(
        files_in(cache.path()).is_empty(),
        "left behind: {:?}",
        files_in(cache.path())
    );
}
