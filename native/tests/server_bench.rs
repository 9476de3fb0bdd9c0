//! Measurements of `tinyllm-native serve` on the real Qwen model, printed, never asserted
//! (timing depends on the machine): run with
//! `cargo test --release -p tinyllm-native --test server_bench -- --ignored --nocapture --test-threads 1`.
//!
//! - aggregate decode throughput of one stream vs four simultaneous streams (continuous
//!   batching: four streams share each forward pass, so the weights are streamed once per
//!   step for all of them);
//! - prefix reuse: time to first token and `cached_tokens` of a conversation's first and
//!   second turn.

#[path = "../../tests/common/mod.rs"]
mod common;
mod serve_support;

use common::real_model;
use serde_json::{json, Value};
use serve_support::Server;
use std::sync::Arc;
use std::time::Instant;

const QWEN: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";

/// What one stream saw, client side.
struct StreamStats {
    /// Seconds from sending to the first content.
    ttft: f64,
    /// Seconds from sending to `[DONE]`.
    total: f64,
    completion_tokens: u64,
    cached_tokens: u64,
    text: String,
    /// Seconds from sending to each non-empty content delta (about one per decoded token).
    deltas: Vec<f64>,
}

fn run_stream(s: &Server, messages: &Value, max_tokens: u64) -> StreamStats {
    let body = json!({
        "messages": messages,
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let started = Instant::now();
    let mut sse = s.open_stream("/v1/chat/completions", &body);
    let mut ttft = None;
    let mut usage = Value::Null;
    let mut text = String::new();
    let mut deltas = Vec::new();
    while let Some(d) = sse.next_data() {
        if d == "[DONE]" {
            break;
        }
        let c: Value = serde_json::from_str(&d).unwrap();
        if let Some(t) = c["choices"][0]["delta"]["content"].as_str().filter(|t| !t.is_empty()) {
            let at = started.elapsed().as_secs_f64();
            ttft.get_or_insert(at);
            deltas.push(at);
            text.push_str(t);
        }
        if c["usage"].is_object() {
            usage = c["usage"].clone();
        }
    }
    let total = started.elapsed().as_secs_f64();
    StreamStats {
        ttft: ttft.unwrap_or(total),
        total,
        completion_tokens: usage["completion_tokens"].as_u64().unwrap_or(0),
        cached_tokens: usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0),
        text,
        deltas,
    }
}

fn user(content: &str) -> Value {
    json!([{"role": "user", "content": content}])
}

const PROMPTS: [&str; 4] = [
    "Write a long, detailed Python tutorial about classes, with many code examples.",
    "Write a long, detailed explanation of how hash maps work, with a C implementation.",
    "Write a long, detailed Rust tutorial about ownership and borrowing, with examples.",
    "Write a long, detailed JavaScript tutorial about promises and async/await.",
];
const DECODE_TOKENS: u64 = 128;

/// Decode tokens per second over all streams while all of them decode: the content deltas
/// of every stream between the last stream's first delta and the first stream's last one,
/// over that window. (The span before it also holds the other streams' prompt passes, and
/// the span after it fewer streams.)
fn steady(stats: &[StreamStats], t0_offsets: &[f64]) -> f64 {
    let start = stats
        .iter()
        .zip(t0_offsets)
        .map(|(s, o)| o + s.deltas.first().copied().unwrap_or(f64::INFINITY))
        .fold(f64::NEG_INFINITY, f64::max);
    let end = stats
        .iter()
        .zip(t0_offsets)
        .map(|(s, o)| o + s.deltas.last().copied().unwrap_or(0.0))
        .fold(f64::INFINITY, f64::min);
    let tokens = stats
        .iter()
        .zip(t0_offsets)
        .map(|(s, o)| s.deltas.iter().filter(|&&t| o + t > start && o + t <= end).count())
        .sum::<usize>();
    tokens as f64 / (end - start)
}

/// Decode tokens per second over all streams: tokens after each stream's first, over the
/// span from the first stream's first token to the last stream's end.
fn aggregate(stats: &[StreamStats], t0_offsets: &[f64]) -> f64 {
    let tokens: u64 = stats.iter().map(|s| s.completion_tokens.saturating_sub(1)).sum();
    let start = stats
        .iter()
        .zip(t0_offsets)
        .map(|(s, o)| o + s.ttft)
        .fold(f64::INFINITY, f64::min);
    let end = stats
        .iter()
        .zip(t0_offsets)
        .map(|(s, o)| o + s.total)
        .fold(0.0, f64::max);
    tokens as f64 / (end - start)
}

#[test]
#[ignore = "measurement: run with --ignored --nocapture"]
fn decode_throughput_one_vs_four_streams() {
    let s = Arc::new(Server::start(&real_model(QWEN), &["--parallel", "4", "--ctx", "1024"]));
    run_stream(&s, &user("Hi"), 8); // warm-up (page in the weights)
    let mut ones = Vec::new();
    let mut fours = Vec::new();
    let mut steadies = Vec::new();
    // Each round measures one stream and then four, back to back, so that their ratio sees
    // the same machine; the summary is the median over the rounds. On a shared machine the
    // rounds scatter: `TINYLLM_BENCH_ROUNDS` (default 4) runs more of them, cycling the prompts.
    let rounds = std::env::var("TINYLLM_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(PROMPTS.len())
        .max(1);
    for (round, prompt) in PROMPTS.iter().cycle().take(rounds).enumerate() {
        // One stream alone.
        let one = run_stream(&s, &user(prompt), DECODE_TOKENS);
        let one_rate = aggregate(std::slice::from_ref(&one), &[0.0]);
        println!(
            "[bench] round {round}: 1 stream: {} tokens, {one_rate:.1} tok/s decode",
            one.completion_tokens
        );
        ones.push(one_rate);
        // Four at once.
        let t0 = Instant::now();
        let handles: Vec<_> = PROMPTS
            .iter()
            .map(|p| {
                let s = s.clone();
                let m = user(p);
                std::thread::spawn(move || {
                    let off = t0.elapsed().as_secs_f64();
                    (off, run_stream(&s, &m, DECODE_TOKENS))
                })
            })
            .collect();
        let (offs, stats): (Vec<f64>, Vec<StreamStats>) = handles.into_iter().map(|h| h.join().unwrap()).unzip();
        let four_rate = aggregate(&stats, &offs);
        let steady_rate = steady(&stats, &offs);
        let per: Vec<u64> = stats.iter().map(|s| s.completion_tokens).collect();
        println!(
            "[bench] round {round}: 4 streams: tokens {per:?}, {four_rate:.1} tok/s decode in all over the whole span, {steady_rate:.1} tok/s while all four decode"
        );
        fours.push(four_rate);
        steadies.push(steady_rate);
    }
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        (v[(v.len() - 1) / 2] + v[v.len() / 2]) / 2.0
    };
    let per_round = |v: &[f64]| -> Vec<f64> {
        v.iter()
            .zip(&ones)
            .map(|(f, o)| (f / o * 100.0).round() / 100.0)
            .collect()
    };
    println!(
        "[bench] decode tok/s, median of {} rounds: 1 stream {:.1}; 4 streams aggregate {:.1} over the whole span (ratio per round {:?}, median x{:.2}), {:.1} while all four decode (ratio per round {:?}, median x{:.2}); passes held up to {} sequences",
        ones.len(),
        median(&ones),
        median(&fours),
        per_round(&fours),
        median(&per_round(&fours)),
        median(&steadies),
        per_round(&steadies),
        median(&per_round(&steadies)),
        s.metric("tinyllm_pass_sequences_max"),
    );
}

#[test]
#[ignore = "measurement: run with --ignored --nocapture"]
fn prefix_reuse_time_to_first_token() {
    let s = Server::start(&real_model(QWEN), &["--parallel", "2", "--ctx", "2048"]);
    run_stream(&s, &user("Hi"), 4); // warm-up
                                    // A first turn with a long prompt (a source file to discuss).
    let code: String = (0..40)
        .map(|i| format!("def f{i}(x):\n    return x * {i} + {}\n\n", i * 7))
        .collect();
    let q1 = format!("Here is a Python module:\n\n{code}\nWhich function returns the largest value for x = 1?");
    let turn1 = vec![json!({"role": "user", "content": q1})];
    let first = run_stream(&s, &Value::Array(turn1.clone()), 24);
    let mut turn2 = turn1;
    turn2.push(json!({"role": "assistant", "content": first.text}));
    turn2.push(json!({"role": "user", "content": "And for x = -1?"}));
    let second = run_stream(&s, &Value::Array(turn2), 24);
    println!(
        "[bench] turn 1: ttft {:.3} s, cached_tokens {}; turn 2: ttft {:.3} s, cached_tokens {}",
        first.ttft, first.cached_tokens, second.ttft, second.cached_tokens
    );
}
