//! llama.cpp's generation goldens (`tests/golden/generate`, `tests/golden/fixtures`) and the
//! teacher-forced evaluation every backend's golden test runs against them.

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;
use tinyllm::backend::Backend;
use tinyllm::engine::{Session, SessionConfig};
use tinyllm::gguf::GgufFile;
use tinyllm::model::Model;

/// Fixtures: argmax must agree where the golden top-1 leads top-2 by more than this (DESIGN).
pub const CLEAR_GAP: f64 = 0.05;
/// Real models: the golden README's tolerance on the top-1 probability.
pub const REAL_TOL: f64 = 0.1;

/// One golden prompt with llama.cpp's greedy continuation.
pub struct Case {
    pub name: String,
    pub prompt: Vec<u32>,
    pub tokens: Vec<u32>,
    /// Per step: `(id, prob)` x 10, descending.
    pub top: Vec<Vec<(u32, f64)>>,
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// The cases of one golden `.jsonl` file.
pub fn load_cases(path: &Path) -> Vec<Case> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("golden json");
            let top = v["top"]
                .as_array()
                .expect("top")
                .iter()
                .map(|step| {
                    step.as_array()
                        .expect("step")
                        .iter()
                        .map(|p| (p[0].as_u64().expect("id") as u32, p[1].as_f64().expect("prob")))
                        .collect()
                })
                .collect();
            Case {
                name: v["name"].as_str().unwrap_or("?").to_string(),
                prompt: ids(&v["prompt_ids"]),
                tokens: ids(&v["tokens"]),
                top,
            }
        })
        .collect()
}

/// Load the GGUF at `path` onto `backend`; panics naming the file.
pub fn load_on<B: Backend>(backend: B, path: &Path) -> Arc<Model<B>> {
    let file = GgufFile::open(path).unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
    Arc::new(Model::load(backend, Arc::new(file)).unwrap_or_else(|e| panic!("cannot load {}: {e}", path.display())))
}

pub fn session<B: Backend>(model: &Arc<Model<B>>, n_ctx: usize) -> Session<B> {
    Session::new(
        Arc::clone(model),
        SessionConfig {
            n_ctx,
            ..SessionConfig::default()
        },
    )
    .expect("session")
}

/// Softmax over the full vocabulary, in f64.
pub fn softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let exps: Vec<f64> = logits.iter().map(|&l| (l as f64 - max).exp()).collect();
    let sum: f64 = exps.iter().sum();
    exps.into_iter().map(|e| e / sum).collect()
}

/// First index of the largest value.
pub fn argmax(xs: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in xs.iter().enumerate() {
        if x > xs[best] {
            best = i;
        }
    }
    best as u32
}

/// Teacher-forced logits of every golden step: one prefill of prompt + tokens[..n-1].
pub fn teacher_forced<B: Backend>(sess: &mut Session<B>, case: &Case) -> Vec<Vec<f32>> {
    let n = case.tokens.len();
    let mut input = case.prompt.clone();
    input.extend_from_slice(&case.tokens[..n - 1]);
    sess.reset();
    let flat = sess.forward_tail(&input, n).expect("forward");
    let vocab = flat.len() / n;
    flat.chunks_exact(vocab).map(<[f32]>::to_vec).collect()
}

/// The golden README's |Δp| tolerance for a fixture quantization.
pub fn fixture_tolerance(quant: &str) -> f64 {
    match quant {
        "F16" => 5e-3,
        "Q8_0" => 3e-2,
        _ => 5e-2,
    }
}
