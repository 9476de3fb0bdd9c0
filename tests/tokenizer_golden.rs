//! The tokenizers against llama-server's own `/tokenize` and `/detokenize` output for the real models
//! (`tests/golden/tokenizer/`), plus the incremental decoder and id validation.

use std::path::PathBuf;
use tinyllm::gguf::GgufFile;
use tinyllm::tokenizer::{StreamDecoder, Tokenizer, TokenizerError};

const GEMMA: (&str, &str) = ("gemma-3-270m", "gemma-3-270m-q4_k_m.gguf");
const QWEN: (&str, &str) = ("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");

fn models_dir() -> PathBuf {
    match std::env::var_os("TINYLLM_MODELS") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/tinyllm/models"),
    }
}

fn load(file: &str) -> Tokenizer {
    let path = models_dir().join(file);
    assert!(
        path.exists(),
        "model {} is missing: fetch it into $TINYLLM_MODELS (default ~/.cache/tinyllm/models) before running these tests",
        path.display()
    );
    let gguf = GgufFile::open(&path).unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
    Tokenizer::from_gguf(&gguf).unwrap_or_else(|e| panic!("loading the tokenizer of {}: {e}", path.display()))
}

fn golden_lines(name: &str) -> Vec<serde_json::Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden/tokenizer")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: bad JSON line: {e}", path.display())))
        .collect()
}

fn ids_of(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("ids array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn check_tokenize(tok: &Tokenizer, model: &str) {
    let lines = golden_lines(&format!("{model}.tokenize.jsonl"));
    let mut failures = Vec::new();
    for line in &lines {
        let text = line["text"].as_str().expect("text");
        let add_special = line["add_special"].as_bool().expect("add_special");
        let parse_special = line["parse_special"].as_bool().expect("parse_special");
        let expected = ids_of(&line["ids"]);
        let got = tok.encode(text, add_special, parse_special);
        if got != expected {
            failures.push(format!(
                "text {text:?} (add_special {add_special}, parse_special {parse_special})\n  expected {expected:?}\n  got      {got:?}"
            ));
        }
    }
    println!(
        "{model} tokenize: {} lines checked, {} mismatches",
        lines.len(),
        failures.len()
    );
    assert!(!lines.is_empty(), "no golden lines for {model}");
    assert!(
        failures.is_empty(),
        "{model}: {} of {} tokenize lines differ; first ones:\n{}",
        failures.len(),
        lines.len(),
        failures.iter().take(5).cloned().collect::<Vec<_>>().join("\n")
    );
}

fn check_detokenize(tok: &Tokenizer, model: &str) {
    let lines = golden_lines(&format!("{model}.detokenize.jsonl"));
    let mut failures = Vec::new();
    for line in &lines {
        let ids = ids_of(&line["ids"]);
        let expected = line["text"].as_str().expect("text");
        let got = tok.decode(&ids);
        // The stream decoder must produce the same text, piece by piece.
        let mut stream = StreamDecoder::new(tok);
        let mut streamed = String::new();
        for &id in &ids {
            streamed.push_str(&stream.push(id).expect("id in range"));
        }
        streamed.push_str(&stream.finish());
        match got {
            Ok(text) if text == expected && streamed == expected => {}
            other => failures.push(format!(
                "ids {ids:?}\n  expected {expected:?}\n  got      {other:?}, streamed {streamed:?}"
            )),
        }
    }
    println!(
        "{model} detokenize: {} lines checked, {} mismatches",
        lines.len(),
        failures.len()
    );
    assert!(!lines.is_empty(), "no golden lines for {model}");
    assert!(
        failures.is_empty(),
        "{model}: {} of {} detokenize lines differ; first ones:\n{}",
        failures.len(),
        lines.len(),
        failures.iter().take(5).cloned().collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn gemma_matches_llama_cpp() {
    let tok = load(GEMMA.1);
    check_tokenize(&tok, GEMMA.0);
    check_detokenize(&tok, GEMMA.0);
    assert_eq!(tok.bos(), Some(2));
    assert!(tok.add_bos());
    let eot = tok
        .token_id("<end_of_turn>")
        .expect("<end_of_turn> in the gemma vocabulary");
    assert!(tok.is_eog(eot));
}

#[test]
fn qwen_matches_llama_cpp() {
    let tok = load(QWEN.1);
    check_tokenize(&tok, QWEN.0);
    check_detokenize(&tok, QWEN.0);
    assert!(!tok.add_bos());
    let im_end = tok.token_id("<|im_end|>").expect("<|im_end|> in the qwen vocabulary");
    assert!(tok.is_eog(im_end));
    let hello = tok.encode("hello", false, false);
    assert!(!hello.iter().any(|&id| tok.is_eog(id)));
}

/// Byte-fallback sequences arrive one byte per token: the stream must never emit half a character,
/// and what it emits must add up to `decode`.
#[test]
fn stream_decoder_holds_back_partial_utf8() {
    let tok = load(GEMMA.1);
    let byte = |b: u8| tok.token_id(&format!("<0x{b:02X}>")).expect("byte token");
    let hello = tok.token_id("▁Hello").expect("▁Hello");
    for text in ["€", "é", "😀", "𝔘", "a€b😀\n"] {
        let mut ids = vec![hello];
        ids.extend(text.bytes().map(byte));
        ids.push(hello);
        let mut dec = StreamDecoder::new(&tok);
        let mut joined = String::new();
        for &id in &ids {
            let piece = dec.push(id).expect("valid id");
            assert!(
                !piece.contains('\u{FFFD}'),
                "{text:?}: partial character emitted as U+FFFD"
            );
            joined.push_str(&piece);
        }
        joined.push_str(&dec.finish());
        assert_eq!(joined, tok.decode(&ids).expect("valid ids"));
        assert_eq!(joined, format!(" Hello{text} Hello"));
    }
    // A truncated character at the very end is flushed lossily by finish().
    let mut dec = StreamDecoder::new(&tok);
    assert_eq!(dec.push(byte(0xE2)).expect("valid"), "");
    assert_eq!(dec.push(byte(0x82)).expect("valid"), "");
    assert_eq!(dec.finish(), "\u{FFFD}");
}

#[test]
fn out_of_range_id_is_an_error_naming_it() {
    let tok = load(QWEN.1);
    let n = tok.vocab_size() as u32;
    let err = tok.decode(&[1, n]).expect_err("id == vocab size must fail");
    assert!(matches!(err, TokenizerError::IdOutOfRange { id, vocab_size } if id == n && vocab_size == n as usize));
    let msg = err.to_string();
    assert!(msg.contains(&n.to_string()), "{msg}");
    assert!(tok.token_to_piece(u32::MAX).is_err());
    assert!(StreamDecoder::new(&tok).push(n).is_err());
}
