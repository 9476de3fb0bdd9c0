//! Helpers shared by the integration tests: where the real models live, and a GGUF writer
//! that can produce both valid files and precisely corrupted ones.
#![allow(dead_code)]

pub mod generation;
pub mod gguf_write;
pub mod gpu_golden;
pub mod rng;
pub mod scripted;

use std::path::PathBuf;

/// The two real models every test machine has after `scripts/fetch-models.sh`.
pub const REAL_MODELS: [&str; 2] = ["gemma-3-270m-q4_k_m.gguf", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"];

/// `$TINYLLM_MODELS`, default `~/.cache/tinyllm/models` (the same rule as the CLI).
pub fn models_dir() -> PathBuf {
    match std::env::var_os("TINYLLM_MODELS") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/tinyllm/models"),
    }
}

/// Path of a real model; panics with the fix when it is missing (tests must not skip silently).
pub fn real_model(name: &str) -> PathBuf {
    let p = models_dir().join(name);
    assert!(p.is_file(), "{} is missing: run scripts/fetch-models.sh", p.display());
    p
}

/// `open()`'s backend, or `None` when it cannot start: then the calling test is skipped. A
/// skip is said on stderr and, when `TINYLLM_SKIP_LOG` names a file (scripts/test.sh sets it),
/// recorded there, so the suite reports the test as skipped rather than passed. With
/// `TINYLLM_REQUIRE_GPU=1` (CI, where lavapipe is installed) a backend that cannot start fails
/// the test instead.
pub fn device_or_skip<B, E: std::fmt::Display>(open: impl FnOnce() -> Result<B, E>) -> Option<B> {
    match open() {
        Ok(b) => Some(b),
        Err(e) => {
            assert!(
                std::env::var("TINYLLM_REQUIRE_GPU").as_deref() != Ok("1"),
                "TINYLLM_REQUIRE_GPU=1 but the GPU backend cannot start: {e}"
            );
            skip(&e);
            None
        }
    }
}

/// Whether this run must find cooperative matrices (`TINYLLM_REQUIRE_COOP=1`, which
/// scripts/test-coop-lavapipe.sh sets on Mesa 26's lavapipe): no skip, no fallback then.
pub fn coop_required() -> bool {
    std::env::var("TINYLLM_REQUIRE_COOP").as_deref() == Ok("1")
}

/// Whether this run is the full tier (`scripts/test.sh --full` sets `TINYLLM_TEST_TIER=full`).
/// A test of the slow tier starts with `if !common::full_tier("...") { return; }`: in a fast
/// run (the default, and CI's) it is recorded as skipped, never counted as passed, with `why`
/// naming what the fast tier runs instead. `#[ignore]` stays for the timing measurements.
pub fn full_tier(why: &str) -> bool {
    if std::env::var("TINYLLM_TEST_TIER").as_deref() == Ok("full") {
        return true;
    }
    skip(&format_args!("full tier only; the fast tier covers it with {why}"));
    false
}

/// Record that the running test skips for `why` (printed, and counted by scripts/test.sh
/// through `TINYLLM_SKIP_LOG`).
pub fn skip(why: &dyn std::fmt::Display) {
    let test = std::thread::current().name().unwrap_or("?").to_string();
    eprintln!("skipping {test}: {why}");
    if let Some(log) = std::env::var_os("TINYLLM_SKIP_LOG") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(log) {
            let _ = writeln!(f, "{test}: {why}");
        }
    }
}

/// A file in the repository's golden data directory (`tests/golden/` at the workspace root;
/// this module is shared by the engine's and the CLI's tests, whose manifest dirs differ).
pub fn golden(rel: &str) -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let root = manifest
        .ancestors()
        .find(|d| d.join("tests/golden").is_dir())
        .unwrap_or(&manifest);
    root.join("tests/golden").join(rel)
}

/// Writes GGUF v3 files field by field, so tests can write any value into any field.
#[derive(Default)]
pub struct GgufWriter {
    kvs: Vec<(String, u32, Vec<u8>)>,
    tensors: Vec<(String, Vec<u64>, u32, u64, u64)>,
    next_offset: u64,
}

fn gguf_string(s: &str) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend(s.as_bytes());
    v
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// A metadata entry with a raw type id and raw value bytes.
    pub fn kv_raw(&mut self, key: &str, type_id: u32, value: &[u8]) {
        self.kvs.push((key.to_string(), type_id, value.to_vec()));
    }

    pub fn kv_str(&mut self, key: &str, value: &str) {
        self.kv_raw(key, 8, &gguf_string(value));
    }

    pub fn kv_u32(&mut self, key: &str, value: u32) {
        self.kv_raw(key, 4, &value.to_le_bytes());
    }

    pub fn kv_f32(&mut self, key: &str, value: f32) {
        self.kv_raw(key, 6, &value.to_le_bytes());
    }

    pub fn kv_bool(&mut self, key: &str, value: bool) {
        self.kv_raw(key, 7, &[value as u8]);
    }

    pub fn kv_str_array(&mut self, key: &str, items: &[&str]) {
        let mut v = 8u32.to_le_bytes().to_vec();
        v.extend((items.len() as u64).to_le_bytes());
        for s in items {
            v.extend(gguf_string(s));
        }
        self.kv_raw(key, 9, &v);
    }

    /// A tensor placed after the previous one (32-byte aligned) holding `bytes` bytes.
    pub fn tensor(&mut self, name: &str, shape: &[u64], type_id: u32, bytes: u64) {
        let offset = self.next_offset;
        self.tensor_at(name, shape, type_id, bytes, offset);
    }

    /// A tensor at an explicit offset in the data section.
    pub fn tensor_at(&mut self, name: &str, shape: &[u64], type_id: u32, bytes: u64, offset: u64) {
        self.tensors
            .push((name.to_string(), shape.to_vec(), type_id, offset, bytes));
        if let Some(end) = offset.checked_add(bytes).filter(|&e| e < 1 << 20) {
            self.next_offset = self.next_offset.max(end.div_ceil(32) * 32);
        }
    }

    /// The file: header, tensor table, padding, then data filled with f32 1.0 values.
    pub fn finish(&self) -> Vec<u8> {
        let mut fill = Vec::new();
        for _ in 0..self.next_offset / 4 {
            fill.extend(1f32.to_le_bytes());
        }
        self.finish_with(&fill)
    }

    /// The file with the given bytes as its data section.
    pub fn finish_with(&self, data: &[u8]) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend((self.tensors.len() as u64).to_le_bytes());
        b.extend((self.kvs.len() as u64).to_le_bytes());
        for (k, t, v) in &self.kvs {
            b.extend(gguf_string(k));
            b.extend(t.to_le_bytes());
            b.extend(v);
        }
        for (name, shape, ty, offset, _) in &self.tensors {
            b.extend(gguf_string(name));
            b.extend((shape.len() as u32).to_le_bytes());
            for d in shape {
                b.extend(d.to_le_bytes());
            }
            b.extend(ty.to_le_bytes());
            b.extend(offset.to_le_bytes());
        }
        while !b.len().is_multiple_of(32) {
            b.push(0);
        }
        b.extend(data);
        b
    }
}

/// What a child process left behind: its exit status (`None`: killed after the time limit),
/// stdout and stderr.
pub struct Finished {
    pub status: Option<std::process::ExitStatus>,
    pub stdout: String,
    pub stderr: String,
}

/// Run `cmd` (stdin closed, both pipes read on threads so a chatty child cannot block on a full
/// pipe), killing it after `limit`.
pub fn run_with_limit(mut cmd: std::process::Command, limit: std::time::Duration) -> Finished {
    use std::io::Read;
    use std::process::Stdio;
    let program = cmd.get_program().to_string_lossy().into_owned();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    fn drain(mut p: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = p.read_to_string(&mut s);
            s
        })
    }
    let stdout = drain(child.stdout.take().unwrap());
    let stderr = drain(child.stderr.take().unwrap());
    let deadline = std::time::Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    Finished {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}
