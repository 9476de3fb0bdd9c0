//! The fuzz targets' seed corpora and crash regressions, replayed on stable: every file of
//! `fuzz/corpus/<target>/` and `fuzz/regressions/<target>/` goes through the same function the
//! libFuzzer binary runs (`fuzz/targets.rs`), so an input that once crashed stays fixed in the
//! ordinary test run. `scripts/fuzz.sh` does the fuzzing itself (nightly, cargo-fuzz).

#[path = "../fuzz/targets.rs"]
mod targets;

use std::path::Path;

/// Runs `target` over every file of the target's seed and regression directories; there must
/// be seeds.
fn replay(name: &str, target: fn(&[u8])) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut seeds = 0;
    for dir in ["corpus", "regressions"] {
        let dir = root.join(dir).join(name);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut files: Vec<_> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        files.sort();
        for path in files.iter().filter(|p| p.is_file()) {
            let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let started = std::time::Instant::now();
            target(&data);
            // libFuzzer's limit per input (`scripts/fuzz.sh`), kept here too.
            let took = started.elapsed();
            assert!(took.as_secs() < 10, "{}: {took:?}", path.display());
            seeds += 1;
        }
    }
    assert!(seeds > 0, "no seeds for the {name} target");
}

#[test]
fn gguf() {
    replay("gguf", targets::gguf);
}

#[test]
fn gguf_stream() {
    replay("gguf_stream", targets::gguf_stream);
}

#[test]
fn tokenizer() {
    replay("tokenizer", targets::tokenizer);
}

#[test]
fn chat_template() {
    replay("chat_template", targets::chat_template);
}

#[test]
fn openai_request() {
    replay("openai_request", targets::openai_request);
}

#[test]
fn output_router() {
    replay("output_router", targets::output_router);
}

#[test]
fn grammar() {
    replay("grammar", targets::grammar);
}
