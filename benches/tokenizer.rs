//! Tokenizer throughput on about 1 MB of mixed text (English, code, CJK, emoji, numbers, whitespace
//! runs), for each real model. Prints MB/s (best of several runs, one thread).
//!
//! Run: `cargo bench --bench tokenizer` (models from `$TINYLLM_MODELS`, default ~/.cache/tinyllm/models).

use std::path::PathBuf;
use std::time::Instant;
use tinyllm::gguf::GgufFile;
use tinyllm::tokenizer::Tokenizer;

const PIECES: [&str; 10] = [
    "The quick brown fox jumps over the lazy dog. It's been a long day, hasn't it? ",
    "fn main() {\n    let xs: Vec<u32> = (0..10).map(|i| i * 2).collect();\n    println!(\"{:?}\", xs);\n}\n",
    "def parse(line):\n\treturn [int(x) for x in line.split(',') if x.strip()]\n\n",
    "机器学习是人工智能的一个分支。東京は日本の首都です。한국어 문장도 있습니다. ",
    "Emoji time 😀🎉👍🏽 👨‍👩‍👧‍👦 🇫🇷 — done! ",
    "Numbers: 3.14159 2718281828 42 1000000 0x7fff 1e-9, ",
    "    \n\n\n        \t\t  \r\n   ",
    "Привет, мир! Γειά σου Κόσμε! مرحبا بالعالم ",
    "SELECT id, name FROM users WHERE age > 30 ORDER BY name; ",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null, \"b\": true}} ",
];

/// About `target` bytes of text, in a fixed pseudo-random order (xorshift, fixed seed).
fn corpus(target: usize) -> String {
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut text = String::with_capacity(target + 256);
    while text.len() < target {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        text.push_str(PIECES[(state % PIECES.len() as u64) as usize]);
    }
    text
}

fn models_dir() -> PathBuf {
    match std::env::var_os("TINYLLM_MODELS") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/tinyllm/models"),
    }
}

fn main() {
    let text = corpus(1 << 20);
    let mb = text.len() as f64 / 1e6;
    for file in ["gemma-3-270m-q4_k_m.gguf", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"] {
        let path = models_dir().join(file);
        let gguf = match GgufFile::open(&path) {
            Ok(g) => g,
            Err(e) => {
                eprintln!("{}: cannot open ({e}); fetch the model first", path.display());
                std::process::exit(1);
            }
        };
        let tok = Tokenizer::from_gguf(&gguf).unwrap_or_else(|e| panic!("{file}: {e}"));
        let mut best = f64::INFINITY;
        let mut n_tokens = 0;
        for _ in 0..5 {
            let t = Instant::now();
            let ids = tok.encode(std::hint::black_box(&text), true, false);
            best = best.min(t.elapsed().as_secs_f64());
            n_tokens = ids.len();
        }
        println!(
            "{file}: {mb:.2} MB -> {n_tokens} tokens, best {:.1} ms, {:.2} MB/s",
            best * 1e3,
            mb / best
        );
    }
}
