//! Load on `tinyllm-native serve`: many clients at once against a few slots. Every request
//! must complete (a 503 is allowed only with `Retry-After`, and is retried), answers under
//! load must equal the same greedy answers computed one at a time, and the server's resident
//! memory must stay flat once warmed up (no per-request leak). The queue is kept smaller than
//! the number of clients, so the overload path (503, retry) is part of the load.

#[path = "../../tests/common/mod.rs"]
mod common;
mod serve_support;

use serde_json::{json, Value};
use serve_support::{Server, FIXTURE};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CLIENTS: usize = 16;
const REQUESTS_PER_CLIENT: usize = 5;
const PROMPTS: [&str; 4] = ["alpha", "bravo charlie", "delta echo foxtrot", "golf hotel"];
/// Generous: per-slot KV caches are allocated up front, so steady state should add ~nothing.
const RSS_GROWTH_LIMIT_KB: u64 = 64 * 1024;
/// Bounds on retrying 503s, and on the whole run.
const MAX_RETRIES: usize = 20;
const TIME_LIMIT: Duration = Duration::from_secs(300);

fn body(prompt: &str, stream: bool) -> Value {
    json!({
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": 8,
        "stream": stream,
    })
}

/// One chat completion, retrying a 503 after its `Retry-After`; returns the answer's text.
fn complete(s: &Server, prompt: &str, stream: bool, deadline: Instant) -> Result<(String, usize), String> {
    let mut rejected = 0;
    loop {
        if Instant::now() > deadline {
            return Err(format!("{prompt:?}: past the time limit"));
        }
        let r = s.post("/v1/chat/completions", &body(prompt, stream));
        match r.status {
            200 => return answer(&r, stream).map(|a| (a, rejected)),
            503 => {
                let wait: u64 = r
                    .header("retry-after")
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| format!("503 without a valid Retry-After: {}", r.head))?;
                if wait > 10 {
                    return Err(format!("Retry-After of {wait} s is not a short wait"));
                }
                rejected += 1;
                if rejected > MAX_RETRIES {
                    return Err(format!("{prompt:?}: still 503 after {MAX_RETRIES} retries"));
                }
                std::thread::sleep(Duration::from_secs(wait));
            }
            other => return Err(format!("{prompt:?} stream={stream}: status {other}: {}", r.text())),
        }
    }
}

/// The answer's content, after checking the response is a complete chat completion.
fn answer(r: &serve_support::Response, stream: bool) -> Result<String, String> {
    if !stream {
        let v = r.json();
        let choice = &v["choices"][0];
        if choice["finish_reason"].as_str().is_none() {
            return Err(format!("no finish_reason: {v}"));
        }
        return choice["message"]["content"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("no content: {v}"));
    }
    if !r.head.contains("content-type: text/event-stream") {
        return Err(format!("not an event stream: {}", r.head));
    }
    let events = r.sse_data();
    if events.last().map(String::as_str) != Some("[DONE]") {
        return Err(format!("stream did not end with [DONE]: {events:?}"));
    }
    let mut text = String::new();
    let mut finished = false;
    for e in &events[..events.len() - 1] {
        let c: Value = serde_json::from_str(e).map_err(|err| format!("bad chunk {e:?}: {err}"))?;
        if c.get("error").is_some() {
            return Err(format!("error in stream: {c}"));
        }
        if let Some(t) = c["choices"][0]["delta"]["content"].as_str() {
            text.push_str(t);
        }
        finished |= c["choices"][0]["finish_reason"].is_string();
    }
    if !finished {
        return Err(format!("stream without finish_reason: {events:?}"));
    }
    Ok(text)
}

#[test]
fn sixteen_clients_on_four_slots_complete_with_flat_memory() {
    let s = Arc::new(Server::start(
        &common::golden(FIXTURE),
        &["--parallel", "4", "--queue", "4", "--threads", "2"],
    ));
    let deadline = Instant::now() + TIME_LIMIT;

    // Warm-up, one at a time: the reference answers, and every allocation a request makes
    // the first time (slot caches, scratch buffers, the HTTP runtime) is made.
    let reference: Vec<String> = PROMPTS
        .iter()
        .map(|p| complete(&s, p, false, deadline).unwrap().0)
        .collect();
    for (p, want) in PROMPTS.iter().zip(&reference) {
        let (got, _) = complete(&s, p, true, deadline).unwrap();
        assert_eq!(&got, want, "streamed and non-streamed answers to {p:?} differ");
    }
    // A concurrent warm-up round too, so all four slots have been used.
    let warm: Vec<_> = (0..4)
        .map(|i| {
            let s = s.clone();
            std::thread::spawn(move || complete(&s, PROMPTS[i], i % 2 == 0, deadline))
        })
        .collect();
    for h in warm {
        h.join().unwrap().unwrap();
    }
    let rss_warm = s.rss_kb();

    let started = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let s = s.clone();
            std::thread::spawn(move || {
                (0..REQUESTS_PER_CLIENT)
                    .map(|i| {
                        let p = (c + i) % PROMPTS.len();
                        let stream = (c + i) % 2 == 0;
                        complete(&s, PROMPTS[p], stream, deadline).map(|(text, retries)| (p, stream, text, retries))
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut done = 0;
    let mut retries = 0;
    let mut failures = Vec::new();
    for h in clients {
        for r in h.join().expect("client thread") {
            match r {
                Ok((p, stream, text, n)) => {
                    retries += n;
                    if text == reference[p] {
                        done += 1;
                    } else {
                        failures.push(format!(
                            "{:?} stream={stream}: {text:?} under load, {:?} alone",
                            PROMPTS[p], reference[p]
                        ));
                    }
                }
                Err(e) => failures.push(e),
            }
        }
    }
    let elapsed = started.elapsed();
    assert!(
        failures.is_empty(),
        "{} failures:\n{}\n{}",
        failures.len(),
        failures.join("\n"),
        s.log()
    );
    assert_eq!(done, CLIENTS * REQUESTS_PER_CLIENT);

    let rss_after = s.rss_kb();
    eprintln!(
        "{done} requests in {:.1} s ({retries} retried 503s); VmRSS {rss_warm} kB after warm-up, {rss_after} kB after load",
        elapsed.as_secs_f64()
    );
    assert!(
        rss_after <= rss_warm + RSS_GROWTH_LIMIT_KB,
        "VmRSS grew from {rss_warm} kB to {rss_after} kB under load"
    );
    assert_eq!(
        s.metric("tinyllm_requests_rejected_total"),
        retries as f64,
        "503s counted by the server"
    );
    // Every slot is free again and nothing is left waiting (a slot is released just after
    // its last event is sent, so allow a moment).
    let settle = Instant::now() + Duration::from_secs(5);
    while s.metric("tinyllm_slots_busy") != 0.0 && Instant::now() < settle {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(s.metric("tinyllm_slots_busy"), 0.0);
    assert_eq!(s.metric("tinyllm_requests_queued"), 0.0);
}
