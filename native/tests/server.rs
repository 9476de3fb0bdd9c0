//! `tinyllm-native serve` over real HTTP: the binary is started on an ephemeral port with the
//! tiny golden fixture (fast) or the real Qwen model (tool calls), and spoken to with raw
//! HTTP/1.1 over `TcpStream`, so every byte the server sends is what a client sees.

#[path = "../../tests/common/mod.rs"]
mod common;
mod serve_support;

use common::{golden, real_model};
use serde_json::{json, Value};
use serve_support::{Server, FIXTURE};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The fixture server for these tests: one thread, so results do not depend on scheduling.
fn fixture(extra: &[&str]) -> Server {
    let args: Vec<&str> = ["--threads", "1"].iter().chain(extra).copied().collect();
    Server::start(&golden(FIXTURE), &args)
}

fn chat_body(user: &str, extra: Value) -> Value {
    let mut body = json!({
        "messages": [{"role": "user", "content": user}],
        "temperature": 0,
        "max_tokens": 12,
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// Concatenated content deltas, and the chunks as JSON (without `[DONE]`).
fn stream_content(events: &[String]) -> (String, Vec<Value>) {
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{events:?}");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let text = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    (text, chunks)
}

#[test]
fn info_endpoints_and_page() {
    let s = fixture(&["--parallel", "2"]);
    let r = s.request("GET", "/health", &[], b"");
    assert_eq!((r.status, r.json()), (200, json!({"status": "ok"})));
    let models = s.request("GET", "/v1/models", &[], b"").json();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "qwen2.Q8_0");
    let page = s.request("GET", "/", &[], b"");
    assert_eq!(page.status, 200);
    assert!(page.head.contains("text/html"), "{}", page.head);
    let html = page.text();
    assert!(
        html.contains(r#"<meta name="tinyllm-transport" content="http">"#) && html.contains("./chat.js"),
        "the page is not set up for this server's API: {html}"
    );
    // The page's files: the script streams chat from the API; nothing loads from elsewhere
    // (the vendored libraries mention URLs only in comments and strings that are not fetched).
    let js = s.request("GET", "/chat.js", &[], b"");
    assert_eq!(js.status, 200);
    assert!(js.head.contains("text/javascript"), "{}", js.head);
    let js = js.text();
    assert!(
        js.contains("/v1/chat/completions") && js.contains("[DONE]"),
        "page does not stream chat"
    );
    for text in [&html, &js, &s.request("GET", "/chat.css", &[], b"").text()] {
        assert!(
            !text.contains("http://") && !text.contains("https://"),
            "page loads external resources"
        );
    }
    for lib in ["marked", "purify", "idb-keyval"] {
        let r = s.request("GET", &format!("/vendor/{lib}.js"), &[], b"");
        assert_eq!(r.status, 200, "/vendor/{lib}.js");
        assert!(r.text().contains("export"), "/vendor/{lib}.js is not a module");
    }
    assert_eq!(s.request("GET", "/vendor/missing.js", &[], b"").status, 404);
    assert_eq!(s.metric("tinyllm_slots_total"), 2.0);
    assert_eq!(s.metric("tinyllm_slots_busy"), 0.0);
    assert_eq!(s.metric("tinyllm_requests_queued"), 0.0);
}

/// `/v1/completions` on llama.cpp's prompt ids must give llama.cpp's greedy continuation.
#[test]
fn completions_match_llama_cpp_greedy() {
    let s = fixture(&[]);
    let rows = std::fs::read_to_string(golden("fixtures/qwen2.Q8_0.golden.jsonl")).unwrap();
    for row in rows.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()) {
        let n = row["n_predict"].as_u64().unwrap();
        let v = s.ok(
            "/v1/completions",
            &json!({"prompt": row["prompt_ids"], "max_tokens": n, "temperature": 0, "logprobs": 3}),
        );
        let choice = &v["choices"][0];
        let want = s.ok("/detokenize", &json!({"tokens": row["tokens"]}));
        assert_eq!(choice["text"], want["content"], "{}", row["name"]);
        assert_eq!(choice["finish_reason"], "length");
        assert_eq!(v["usage"]["completion_tokens"], n);
        assert_eq!(v["usage"]["prompt_tokens"], row["prompt_ids"].as_array().unwrap().len());
        // Our top-1 probability against llama.cpp's, token by token.
        let lps = choice["logprobs"]["token_logprobs"].as_array().unwrap();
        assert_eq!(lps.len() as u64, n);
        for (step, (lp, top)) in lps.iter().zip(row["top"].as_array().unwrap()).enumerate() {
            let ours = lp.as_f64().unwrap().exp();
            let theirs = top[0][1].as_f64().unwrap();
            // The golden README's tolerance for Q8_0 fixtures.
            assert!(
                (ours - theirs).abs() <= 0.03,
                "step {step}: p {ours} vs llama.cpp {theirs}"
            );
        }
    }
}

#[test]
fn chat_non_streaming_and_streaming_agree() {
    let s = fixture(&[]);
    let v = s.ok("/v1/chat/completions", &chat_body("Hello there", json!({})));
    assert_eq!(v["object"], "chat.completion");
    let choice = &v["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    let content = choice["message"]["content"].as_str().unwrap().to_string();
    let usage = &v["usage"];
    let completion = usage["completion_tokens"].as_u64().unwrap();
    assert!(completion <= 12);
    // max_tokens ends with "length" unless the model ended first.
    let want_finish = if completion == 12 { "length" } else { "stop" };
    assert_eq!(choice["finish_reason"], want_finish);
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["prompt_tokens"].as_u64().unwrap() + completion
    );
    assert!(usage["prompt_tokens_details"]["cached_tokens"].is_u64());

    let events = s.stream(
        "/v1/chat/completions",
        &chat_body(
            "Hello there",
            json!({"stream": true, "stream_options": {"include_usage": true}}),
        ),
    );
    let (text, chunks) = stream_content(&events);
    assert_eq!(text, content, "greedy stream differs from the whole answer");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk"));
    let finish_chunk = &chunks[chunks.len() - 2];
    assert_eq!(finish_chunk["choices"][0]["finish_reason"], want_finish);
    let last = &chunks[chunks.len() - 1];
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["completion_tokens"], completion);
    assert_eq!(last["usage"]["prompt_tokens"], usage["prompt_tokens"]);

    // Without include_usage there is no usage chunk.
    let events = s.stream(
        "/v1/chat/completions",
        &chat_body("Hello there", json!({"stream": true})),
    );
    let (_, chunks) = stream_content(&events);
    assert!(chunks.iter().all(|c| c.get("usage").is_none_or(Value::is_null)));
}

#[test]
fn max_tokens_gives_length_and_completion_streams() {
    let s = fixture(&[]);
    for (field, n) in [("max_tokens", 3), ("max_completion_tokens", 5)] {
        let v = s.ok(
            "/v1/completions",
            &json!({"prompt": "The sky", "temperature": 0, field: n}),
        );
        assert_eq!(v["usage"]["completion_tokens"], n, "{v}");
        assert_eq!(v["choices"][0]["finish_reason"], "length");
    }
    let whole = s.ok(
        "/v1/completions",
        &json!({"prompt": "The sky", "temperature": 0, "max_tokens": 10}),
    );
    let events = s.stream(
        "/v1/completions",
        &json!({"prompt": "The sky", "temperature": 0, "max_tokens": 10, "stream": true}),
    );
    assert_eq!(events.last().unwrap(), "[DONE]");
    let text: String = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter_map(|c| c["choices"][0]["text"].as_str().map(String::from))
        .collect();
    assert_eq!(text, whole["choices"][0]["text"].as_str().unwrap());
}

#[test]
fn stop_sequences_end_the_answer_and_are_not_emitted() {
    let s = fixture(&[]);
    let prompt = "Write something long";
    let full = s.ok("/v1/chat/completions", &chat_body(prompt, json!({"max_tokens": 24})));
    let text = full["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let chars: Vec<char> = text.chars().collect();
    assert!(chars.len() >= 8, "answer too short to pick a stop string: {text:?}");
    // A stop string from the middle of the answer: likely spans a token boundary.
    let stop: String = chars[4..7].iter().collect();
    let cut = &text[..text.find(&stop).unwrap()];
    for stream in [false, true] {
        let body = chat_body(
            prompt,
            json!({"max_tokens": 24, "stop": ["NEVER-THERE", stop], "stream": stream}),
        );
        let (content, finish) = if stream {
            let (t, chunks) = stream_content(&s.stream("/v1/chat/completions", &body));
            (t, chunks.last().unwrap()["choices"][0]["finish_reason"].clone())
        } else {
            let v = s.ok("/v1/chat/completions", &body);
            let c = v["choices"][0].clone();
            (
                c["message"]["content"].as_str().unwrap().to_string(),
                c["finish_reason"].clone(),
            )
        };
        assert_eq!(content, cut, "stream={stream}, stop {stop:?} in {text:?}");
        assert_eq!(finish, "stop");
    }
    // A single string works too.
    let v = s.ok(
        "/v1/chat/completions",
        &chat_body(prompt, json!({"max_tokens": 24, "stop": stop})),
    );
    assert_eq!(v["choices"][0]["message"]["content"], cut);
}

#[test]
fn chat_logprobs() {
    let s = fixture(&[]);
    let v = s.ok(
        "/v1/chat/completions",
        &chat_body("Hi", json!({"logprobs": true, "top_logprobs": 3, "max_tokens": 6})),
    );
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len() as u64, v["usage"]["completion_tokens"].as_u64().unwrap());
    let mut text = String::new();
    for t in content {
        let top = t["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        let lps: Vec<f64> = top.iter().map(|a| a["logprob"].as_f64().unwrap()).collect();
        assert!(lps.windows(2).all(|w| w[0] >= w[1]) && lps[0] <= 0.0, "{lps:?}");
        assert!(lps.iter().map(|l| l.exp()).sum::<f64>() <= 1.0 + 1e-4);
        // Greedy: the chosen token is the most likely one.
        assert_eq!(t["token"], top[0]["token"]);
        assert!((t["logprob"].as_f64().unwrap() - lps[0]).abs() < 1e-5);
        let bytes: Vec<u8> = t["bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap() as u8)
            .collect();
        text.push_str(&String::from_utf8_lossy(&bytes));
    }
    assert_eq!(text, v["choices"][0]["message"]["content"].as_str().unwrap());
    // Off by default.
    let v = s.ok("/v1/chat/completions", &chat_body("Hi", json!({"max_tokens": 2})));
    assert!(v["choices"][0]["logprobs"].is_null());
}

#[test]
fn every_error_is_an_openai_error_object() {
    let s = fixture(&["--ctx", "128", "--api-key", "sekret", "--max-body-bytes", "4096"]);
    let auth = [("Authorization", "Bearer sekret"), ("Content-Type", "application/json")];
    let post = |body: &str| s.request("POST", "/v1/chat/completions", &auth, body.as_bytes());
    let good = chat_body("hi", json!({"max_tokens": 2})).to_string();

    // Authentication.
    let e = s
        .request("POST", "/v1/chat/completions", &[], good.as_bytes())
        .error(401);
    assert_eq!(e["code"], "invalid_api_key");
    s.request(
        "POST",
        "/v1/chat/completions",
        &[("Authorization", "Bearer nope")],
        good.as_bytes(),
    )
    .error(401);
    s.request("GET", "/v1/models", &[], b"").error(401);
    assert_eq!(s.request("GET", "/health", &[], b"").status, 200);
    // The chat page and its files load without the key (the page asks for it).
    for path in ["/", "/chat.js", "/chat.css", "/vendor/marked.js"] {
        assert_eq!(s.request("GET", path, &[], b"").status, 200, "{path}");
    }
    assert_eq!(post(&good).status, 200);

    // Malformed bodies and fields.
    let e = post("{\"messages\": [").error(400);
    assert!(e["message"].as_str().unwrap().contains("JSON"), "{e}");
    post("[1, 2]").error(400);
    let e = post("{\"temperature\": 0}").error(400);
    assert!(e["message"].as_str().unwrap().contains("messages"), "{e}");
    let e = post(&chat_body("hi", json!({"temperature": "hot"})).to_string()).error(400);
    assert_eq!(e["param"], "temperature");
    let e = post("{\"messages\": [{\"role\": \"user\", \"content\": 5}]}").error(400);
    assert_eq!(e["param"], "messages[0].content");
    let e = post("{\"messages\": [{\"content\": \"x\"}]}").error(400);
    assert!(e["message"].as_str().unwrap().contains("role"), "{e}");
    let e = post(&chat_body("hi", json!({"temperature": -1})).to_string()).error(400);
    assert_eq!(e["param"], "temperature");
    let e = post(&chat_body("hi", json!({"n": 2})).to_string()).error(400);
    assert_eq!(e["param"], "n");
    for (body, param, says) in [
        (json!({"response_format": {"type": "yaml"}}), "response_format", "yaml"),
        (
            json!({"response_format": {"type": "json_schema"}}),
            "response_format",
            "json_schema",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 5}}}),
            "response_format",
            "object",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}}}),
            "response_format",
            "nope",
        ),
        (json!({"grammar": "start: ("}), "grammar", "grammar"),
        (
            json!({"grammar": "start: \"a\"", "response_format": {"type": "json_object"}}),
            "grammar",
            "not both",
        ),
    ] {
        let e = post(&chat_body("hi", body.clone()).to_string()).error(400);
        assert_eq!(e["param"], param, "{body} {e}");
        assert!(e["message"].as_str().unwrap().contains(says), "{body} {e}");
    }
    let e = post(&chat_body("hi", json!({"max_tokens": 0})).to_string()).error(400);
    assert_eq!(e["param"], "max_tokens");
    let e = post(&chat_body("hi", json!({"tool_choice": "sometimes"})).to_string()).error(400);
    assert_eq!(e["param"], "tool_choice");
    let e = post(
        &chat_body(
            "hi",
            json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
        )
        .to_string(),
    )
    .error(400);
    assert!(e["message"].as_str().unwrap().contains("text"), "{e}");

    // Context overflow: the prompt alone does not fit 128 tokens.
    let long = "lorem ipsum dolor sit amet ".repeat(40);
    let e = post(&chat_body(&long, json!({})).to_string()).error(400);
    assert_eq!(e["code"], "context_length_exceeded");

    // Size limit, unknown route, wrong method.
    let big = chat_body(&"x".repeat(5000), json!({})).to_string();
    let e = post(&big).error(413);
    assert_eq!(e["type"], "invalid_request_error");
    s.request("GET", "/v1/nothing", &auth, b"").error(404);
    s.request("GET", "/v1/chat/completions", &auth, b"").error(405);
    let e = s
        .request("POST", "/detokenize", &auth, b"{\"tokens\": [999999]}")
        .error(400);
    assert_eq!(e["param"], "tokens");

    // Still serving after all that.
    assert_eq!(post(&good).status, 200);
    assert!(!s.log().contains("panicked"), "{}", s.log());
}

#[test]
fn second_turn_reuses_the_first_turns_cache() {
    let s = fixture(&["--parallel", "2"]);
    let first = s.ok(
        "/v1/chat/completions",
        &chat_body("Tell me a story", json!({"max_tokens": 8})),
    );
    let answer = first["choices"][0]["message"]["content"].as_str().unwrap();
    let turn1 = first["usage"]["prompt_tokens"].as_u64().unwrap();
    // Another conversation in between: it must not evict the first one's slot.
    s.ok(
        "/v1/chat/completions",
        &chat_body("Something else entirely", json!({"max_tokens": 4})),
    );
    let second = s.ok(
        "/v1/chat/completions",
        &json!({
            "messages": [
                {"role": "user", "content": "Tell me a story"},
                {"role": "assistant", "content": answer},
                {"role": "user", "content": "And then?"},
            ],
            "temperature": 0,
            "max_tokens": 4,
        }),
    );
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let prompt = second["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(
        cached >= turn1 && cached < prompt,
        "cached {cached}, turn 1 had {turn1}, turn 2 has {prompt}"
    );
    assert!(s.metric("tinyllm_prompt_tokens_cached_total") >= turn1 as f64);
}

/// A hybrid model (qwen35 fixture) cannot cut its recurrent state back, so a second turn whose
/// history differs from what the slot evaluated (here the client edits the answer) resumes from
/// the checkpoint at the end of the first prompt; without checkpoints it starts over.
#[test]
fn hybrid_second_turn_resumes_from_a_checkpoint() {
    let turns = |s: &Server| {
        let first = s.ok(
            "/v1/chat/completions",
            &chat_body("Tell me a story about the sea", json!({"max_tokens": 6})),
        );
        let turn1 = first["usage"]["prompt_tokens"].as_u64().unwrap();
        let second = s.ok(
            "/v1/chat/completions",
            &json!({
                "messages": [
                    {"role": "user", "content": "Tell me a story about the sea"},
                    {"role": "assistant", "content": "(the answer, edited)"},
                    {"role": "user", "content": "And then?"},
                ],
                "temperature": 0,
                "max_tokens": 4,
            }),
        );
        let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        (turn1, cached, second["choices"][0]["message"]["content"].clone())
    };
    let args = ["--threads", "1", "--parallel", "1", "--prefill-chunk", "16"];
    let model = golden("fixtures/qwen35.Q8_0.gguf");
    let with = Server::start(&model, &[&args[..], &["--checkpoints", "3"]].concat());
    let (turn1, cached, answer) = turns(&with);
    eprintln!("[hybrid] turn 1: {turn1} prompt tokens, turn 2 reused {cached}");
    // Checkpoints sit at chunk ends (multiples of 16) and the first prompt's end.
    assert!(cached > 0 && cached <= turn1, "cached {cached} of turn 1's {turn1}");
    assert!(cached == turn1 || cached % 16 == 0, "cached {cached}: not a checkpoint");
    let held = with.metric("tinyllm_checkpoints");
    assert!((1.0..=3.0).contains(&held), "{held} checkpoints");
    // Each holds the fixture's one recurrent layer: conv 512 x 3 and delta 4 x 64 x 64 (f32).
    let per = ((512 * 3 + 4 * 64 * 64) * 4) as f64;
    assert_eq!(with.metric("tinyllm_checkpoint_bytes"), held * per);

    let without = Server::start(&model, &[&args[..], &["--checkpoints", "0"]].concat());
    let (_, cached, cold_answer) = turns(&without);
    assert_eq!(cached, 0);
    assert_eq!(without.metric("tinyllm_checkpoint_bytes"), 0.0);
    // Resumed or not, the answer is the same.
    assert_eq!(answer, cold_answer);
}

#[test]
fn disconnect_frees_the_slot() {
    let s = fixture(&["--parallel", "1"]);
    let body = chat_body("Go on forever", json!({"stream": true, "max_tokens": 1900}));
    let mut sse = s.open_stream("/v1/chat/completions", &body);
    for _ in 0..2 {
        sse.next_data().expect("a chunk");
    }
    drop(sse);
    // With one slot, this request can only run once the abandoned one has stopped.
    let started = Instant::now();
    let v = s.ok("/v1/chat/completions", &chat_body("Quick", json!({"max_tokens": 2})));
    assert_eq!(v["usage"]["completion_tokens"], 2);
    let waited = started.elapsed();
    let log = s.wait_log("interrupted");
    let line = log
        .lines()
        .find(|l| l.contains("interrupted"))
        .unwrap_or_else(|| panic!("no interrupted request in the log:\n{log}"));
    let out: u64 = line
        .split(" tok out")
        .next()
        .and_then(|p| p.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no token count in {line:?}"));
    assert!(out < 1900, "the abandoned request ran to its end: {line}");
    assert!(waited < Duration::from_secs(30), "next request waited {waited:?}");
    assert_eq!(s.metric("tinyllm_slots_busy"), 0.0);
    assert_eq!(s.metric("tinyllm_requests_cancelled_total"), 1.0);
}

/// A long prompt arriving while a stream runs is prefilled in chunks of `--prefill-chunk`
/// tokens, each in a pass that also advances the running stream: the stream is never stalled
/// for the whole prefill.
#[test]
fn long_prompt_is_prefilled_in_chunks_between_decode_steps() {
    let chunk = 8;
    let s = fixture(&["--parallel", "2", "--prefill-chunk", &chunk.to_string()]);
    let body = chat_body("Go on forever", json!({"stream": true, "max_tokens": 1900}));
    let mut running = s.open_stream("/v1/chat/completions", &body);
    for _ in 0..2 {
        running.next_data().expect("a chunk");
    }
    let long = "tell me about the sea and the sky and the wind ".repeat(20);
    let v = s.ok("/v1/chat/completions", &chat_body(&long, json!({"max_tokens": 2})));
    let prompt = v["usage"]["prompt_tokens"].as_f64().unwrap();
    assert!(
        prompt > 100.0 && v["usage"]["prompt_tokens_details"]["cached_tokens"] == 0,
        "{v}"
    );
    running.next_data().expect("the first stream still runs");
    // Passes that held both sequences: at least one per prompt chunk.
    let m = s.metrics(&["tinyllm_pass_sequences_total", "tinyllm_passes_total"]);
    let shared = m[0] - m[1];
    assert_eq!(s.metric("tinyllm_pass_sequences_max"), 2.0);
    assert!(
        shared >= (prompt / chunk as f64).ceil(),
        "{shared} passes held both sequences for a prompt of {prompt} tokens in chunks of {chunk}"
    );
}

#[test]
fn full_queue_answers_503_with_retry_after() {
    // The slot is held by a 1900-token stream, which the fixture decodes in about 1.7 s on
    // an idle machine. On a loaded CI machine it can still finish between the second
    // request queueing and the third arriving, in which case the third is rightly
    // admitted (and nothing is rejected); the scenario then runs again on a fresh server.
    // A server that never rejects fails all attempts. Each request is sent only once the
    // one before is where it should be (running, then queued), read from /metrics.
    for attempt in 1..=4 {
        let s = fixture(&["--parallel", "1", "--queue", "1"]);
        let long = chat_body("Keep going", json!({"stream": true, "max_tokens": 1900}));
        let mut running = s.open_stream("/v1/chat/completions", &long);
        running.next_data().expect("the first request streams");
        // The stream's first chunk can come before the engine took the job off the queue:
        // wait until it holds the slot and the queue is empty again.
        let wait = |what: &str, done: &dyn Fn(&[f64]) -> bool| {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !done(&s.metrics(&["tinyllm_slots_busy", "tinyllm_requests_queued"])) {
                assert!(Instant::now() < deadline, "{what}");
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        wait("the first request never ran", &|m| m[0] == 1.0 && m[1] == 0.0);
        // Takes the only queue place (its answer would start once the slot frees).
        let _waiting = s.send("POST", "/v1/chat/completions", &[], long.to_string().as_bytes());
        wait("the second request never queued", &|m| m[1] >= 1.0);
        let r = s.post("/v1/chat/completions", &chat_body("one more", json!({})));
        if r.status == 200 {
            assert_eq!(s.metric("tinyllm_requests_rejected_total"), 0.0);
            eprintln!("attempt {attempt}: the running stream ended before the third request");
            continue;
        }
        let e = r.error(503);
        assert_eq!(e["code"], "overloaded");
        assert!(r.head.contains("retry-after: 1"), "{}", r.head);
        assert_eq!(s.metric("tinyllm_requests_rejected_total"), 1.0);
        return;
    }
    panic!("the third request was never rejected while the slot and the queue were full");
}

#[test]
fn four_parallel_streams_complete_like_sequential_ones() {
    let s = Arc::new(fixture(&["--parallel", "4"]));
    let prompts = ["alpha", "bravo charlie", "delta echo foxtrot", "golf"];
    let sequential: Vec<String> = prompts
        .iter()
        .map(|p| {
            let v = s.ok("/v1/chat/completions", &chat_body(p, json!({"max_tokens": 40})));
            v["choices"][0]["message"]["content"].as_str().unwrap().to_string()
        })
        .collect();
    let handles: Vec<_> = prompts
        .iter()
        .map(|p| {
            let s = s.clone();
            let body = chat_body(p, json!({"max_tokens": 40, "stream": true}));
            std::thread::spawn(move || stream_content(&s.stream("/v1/chat/completions", &body)).0)
        })
        .collect();
    let parallel: Vec<String> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(parallel, sequential, "slots interfere with each other");
    assert_eq!(s.metric("tinyllm_requests_total"), 8.0);
}

/// `tool_choice` on the real model: `required` and a named function give a call even where
/// the model would answer in words, `none` gives words and no tool rendering, and bad choices
/// are 400s. (`parallel_tool_calls: false` is unit-tested in the chat handler: this small
/// model does not write several well-formed calls.)
#[test]
fn real_qwen_tool_choice_is_enforced() {
    let s = Server::start(
        &real_model("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
        &["--parallel", "1", "--ctx", "2048", "--threads", "2"],
    );
    let tool = |name: &str, what: &str| {
        json!({"type": "function", "function": {
            "name": name,
            "description": format!("Get the current {what} in a city"),
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        }})
    };
    let tools = json!([tool("get_weather", "weather"), tool("get_time", "local time")]);
    let ask = |content: &str, choice: Value, extra: Value| {
        let mut b = json!({
            "messages": [{"role": "user", "content": content}],
            "tools": tools,
            "tool_choice": choice,
            "temperature": 0,
            "max_tokens": 80,
        });
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let calls = |v: &Value| {
        v["choices"][0]["message"]["tool_calls"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };

    // A greeting: with auto the model answers in words, with required it must call a tool.
    let auto = s.ok(
        "/v1/chat/completions",
        &ask("Say hello to me.", json!("auto"), json!({})),
    );
    let required = s.ok(
        "/v1/chat/completions",
        &ask("Say hello to me.", json!("required"), json!({})),
    );
    assert_eq!(required["choices"][0]["finish_reason"], "tool_calls", "{required}");
    let name = calls(&required)[0]["function"]["name"].as_str().unwrap().to_string();
    assert!(["get_weather", "get_time"].contains(&name.as_str()), "{required}");

    // Named: a weather question still calls get_time, with parseable arguments.
    let named = ask(
        "What is the weather in Paris?",
        json!({"type": "function", "function": {"name": "get_time"}}),
        json!({}),
    );
    let v = s.ok("/v1/chat/completions", &named);
    let c = calls(&v);
    assert_eq!(c.len(), 1, "{v}");
    assert_eq!(c[0]["function"]["name"], "get_time", "{v}");
    let args: Value = serde_json::from_str(c[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert!(args.is_object(), "{args}");
    // Streamed, the same call.
    let mut streamed = named.clone();
    streamed["stream"] = json!(true);
    let (_, chunks) = stream_content(&s.stream("/v1/chat/completions", &streamed));
    let names: Vec<&str> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"][0]["function"]["name"].as_str())
        .collect();
    assert_eq!(names, ["get_time"], "{chunks:?}");

    // none: no tools in the prompt, no calls in the answer.
    let none = s.ok(
        "/v1/chat/completions",
        &ask("What is the weather in Paris?", json!("none"), json!({})),
    );
    assert!(calls(&none).is_empty(), "{none}");
    assert_ne!(none["choices"][0]["finish_reason"], "tool_calls", "{none}");
    assert!(
        !none["choices"][0]["message"]["content"].as_str().unwrap().is_empty(),
        "{none}"
    );
    assert!(
        none["usage"]["prompt_tokens"].as_u64() < auto["usage"]["prompt_tokens"].as_u64(),
        "tools were rendered with tool_choice none"
    );

    // Bad choices.
    let unknown = ask(
        "hi",
        json!({"type": "function", "function": {"name": "launch_rocket"}}),
        json!({}),
    );
    let e = s.post("/v1/chat/completions", &unknown).error(400);
    assert_eq!(e["param"], "tool_choice");
    assert!(e["message"].as_str().unwrap().contains("launch_rocket"), "{e}");
    let mut no_tools = ask("hi", json!("required"), json!({}));
    no_tools.as_object_mut().unwrap().remove("tools");
    assert_eq!(
        s.post("/v1/chat/completions", &no_tools).error(400)["param"],
        "tool_choice"
    );
}

/// Continuous batching on the real model: four greedy streams decoded together (one forward
/// pass per step holds all of them) must give exactly the answers each gets alone.
#[test]
fn real_qwen_four_batched_streams_equal_single_streams() {
    let s = Arc::new(Server::start(
        &real_model("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
        &["--parallel", "4", "--ctx", "512", "--threads", "2"],
    ));
    let prompts = [
        "Write a Python function that reverses a string.",
        "What is a linked list?",
        "Explain recursion in one paragraph.",
        "Write a haiku about compilers.",
    ];
    let body = |p: &str, stream: bool| chat_body(p, json!({"max_tokens": 24, "stream": stream}));
    let alone: Vec<String> = prompts
        .iter()
        .map(|p| {
            let v = s.ok("/v1/chat/completions", &body(p, false));
            v["choices"][0]["message"]["content"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(
        s.metric("tinyllm_pass_sequences_max"),
        1.0,
        "requests one at a time were batched"
    );
    let handles: Vec<_> = prompts
        .iter()
        .map(|p| {
            let s = s.clone();
            let b = body(p, true);
            std::thread::spawn(move || stream_content(&s.stream("/v1/chat/completions", &b)).0)
        })
        .collect();
    let together: Vec<String> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(together, alone, "batched streams differ from single ones");
    assert!(
        s.metric("tinyllm_pass_sequences_max") >= 2.0,
        "the streams never shared a forward pass"
    );
}

#[test]
fn tokenize_detokenize_apply_template() {
    let s = fixture(&[]);
    let text = "Hello world, héllo!";
    let ids = s.ok("/tokenize", &json!({"content": text}))["tokens"].clone();
    let cli = Command::new(env!("CARGO_BIN_EXE_tinyllm-native"))
        .args(["tokenize", "-m"])
        .arg(golden(FIXTURE))
        .args(["--no-add-special", text])
        .output()
        .unwrap();
    let cli_ids: Value = serde_json::from_slice(&cli.stdout).unwrap();
    assert_eq!(ids, cli_ids);
    assert_eq!(s.ok("/detokenize", &json!({"tokens": ids}))["content"], text);
    let pieces = s.ok("/tokenize", &json!({"content": text, "with_pieces": true}))["tokens"].clone();
    assert_eq!(pieces.as_array().unwrap().len(), ids.as_array().unwrap().len());
    assert_eq!(pieces[0]["id"], ids[0]);

    let messages = json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]);
    let prompt = s.ok("/apply-template", &json!({"messages": messages}))["prompt"].clone();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.json");
    std::fs::write(&path, messages.to_string()).unwrap();
    let cli = Command::new(env!("CARGO_BIN_EXE_tinyllm-native"))
        .args(["template", "--json", "-m"])
        .arg(golden(FIXTURE))
        .arg("--messages")
        .arg(&path)
        .output()
        .unwrap();
    let cli_prompt: Value = serde_json::from_slice(&cli.stdout).unwrap();
    assert_eq!(prompt, cli_prompt);
    assert!(prompt.as_str().unwrap().ends_with("<|im_start|>assistant\n"));
}

/// The real Qwen model declares a tool call, gets the result back and answers.
#[test]
fn real_qwen_tool_call_round_trip() {
    let s = Server::start(
        &real_model("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
        &["--parallel", "1", "--ctx", "2048", "--threads", "2"],
    );
    let tools = json!([{
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "The city name"}},
                "required": ["city"],
            },
        },
    }]);
    let mut messages = vec![json!({"role": "user", "content": "What is the weather like in Paris right now?"})];
    let v = s.ok(
        "/v1/chat/completions",
        &json!({"messages": messages, "tools": tools, "temperature": 0, "max_tokens": 60}),
    );
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert!(args["city"].as_str().unwrap().contains("Paris"), "{args}");

    // The same answer streamed: id and name first, then the arguments.
    let mut body = json!({"messages": messages, "tools": tools, "temperature": 0, "max_tokens": 60});
    body["stream"] = json!(true);
    let (_, chunks) = stream_content(&s.stream("/v1/chat/completions", &body));
    let deltas: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].get(0))
        .collect();
    assert!(deltas.len() >= 2, "{chunks:?}");
    assert!(
        deltas[0]["id"].as_str().is_some_and(|id| id.starts_with("call_")),
        "{:?}",
        deltas[0]
    );
    assert_eq!(deltas[0]["function"]["arguments"], "");
    assert_eq!(deltas[0]["function"]["name"], "get_weather");
    let streamed: String = deltas
        .iter()
        .filter_map(|d| d["function"]["arguments"].as_str())
        .collect();
    assert_eq!(streamed, call["function"]["arguments"].as_str().unwrap());
    let finish = chunks
        .iter()
        .rev()
        .find_map(|c| c["choices"][0]["finish_reason"].as_str());
    assert_eq!(finish, Some("tool_calls"));

    messages.push(choice["message"].clone());
    messages.push(json!({
        "role": "tool",
        "tool_call_id": call["id"],
        "content": "{\"temperature_c\": 18, \"condition\": \"sunny\"}",
    }));
    let v = s.ok(
        "/v1/chat/completions",
        &json!({"messages": messages, "tools": tools, "temperature": 0, "max_tokens": 60}),
    );
    let choice = &v["choices"][0];
    let answer = choice["message"]["content"].as_str().unwrap_or_default();
    assert!(choice["message"].get("tool_calls").is_none(), "{v}");
    assert!(
        answer.contains("18") || answer.to_lowercase().contains("sunny"),
        "{answer:?}"
    );
    // The second request extends the first conversation in the same slot.
    assert!(v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap() > 0);
}

/// The official `openai` Python client (installed by `.ci/run`) speaks to the server.
#[test]
fn openai_python_client() {
    python_client("server_openai.py", &fixture(&[]), &[], "the fixture");
}

/// Run `tests/SCRIPT BASE_URL ARGS...` (the official Python clients) against `s`; it must
/// succeed (`what` names the case in the failure). Returns its stdout.
fn python_client(script: &str, s: &Server, args: &[&str], what: &str) -> String {
    let script = format!("{}/tests/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("python3")
        .arg(&script)
        .arg(format!("http://{}/v1", s.addr))
        .args(args)
        .output()
        .expect("python3 is needed for this test");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{script} failed on {what} (scripts/setup-test-deps.sh installs openai and jsonschema):\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Structured output through the official `openai` client on both real models
/// (`server_structured.py`, with the `jsonschema` package as the judge): 10 prompts x 3
/// schemas, streamed and not, all parse and validate; `tool_choice: "required"` calls
/// validate against their tool on 10 prompts; under `"auto"` fenced and bare JSON calls of a
/// declared tool become calls and one of an undeclared tool stays content. On qwen2.5-coder
/// also the issue's report as a user meets it: `Use get_weather for Tokyo.`, no grammar,
/// comes back as a tool call.
/// Full tier only: minutes of constrained decoding; the fast tier runs the reduced test below.
#[test]
fn structured_output_on_both_real_models() {
    if !common::full_tier("structured_output_reduced_on_qwen: the same script, 3 prompts a kind on one model") {
        return;
    }
    for (model, extra) in [
        ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", &["--lenient"][..]),
        ("gemma-3-270m-q4_k_m.gguf", &[][..]),
    ] {
        let s = Server::start(&real_model(model), &["--threads", "2"]);
        let counts = python_client("server_structured.py", &s, extra, model);
        eprintln!("{model}: {counts}");
    }
}

/// The fast tier's structured output: `server_structured.py` on qwen2.5-coder with 3 prompts
/// a kind (every schema, streamed and not, `"required"` tool calls, the `"auto"` routing
/// cases), the same judge as the full run above.
#[test]
fn structured_output_reduced_on_qwen() {
    let model = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
    let s = Server::start(&real_model(model), &["--threads", "2"]);
    let args = ["--lenient", "--json-prompts", "3", "--tool-prompts", "3"];
    let counts = python_client("server_structured.py", &s, &args, model);
    eprintln!("{model}: {counts}");
}

/// `serve --backend webgpu` (lavapipe in CI) answers like the CPU server: the same greedy
/// completions of llama.cpp's prompts, and a streamed chat answer with the same text. Without an
/// adapter the test says why and passes, unless `TINYLLM_REQUIRE_GPU=1`.
#[test]
fn webgpu_server_answers_like_the_cpu_server() {
    if common::device_or_skip(tinyllm::backend::webgpu::WebGpuBackend::new).is_none() {
        return;
    }
    let cpu = fixture(&[]);
    let gpu = fixture(&["--backend", "webgpu"]);
    let log = gpu.wait_log("backend webgpu");
    assert!(log.contains("backend webgpu"), "{log}");
    let rows = std::fs::read_to_string(golden("fixtures/qwen2.Q8_0.golden.jsonl")).unwrap();
    for row in rows.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()) {
        let body = json!({"prompt": row["prompt_ids"], "max_tokens": row["n_predict"], "temperature": 0});
        let (a, b) = (cpu.ok("/v1/completions", &body), gpu.ok("/v1/completions", &body));
        assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"], "{}", row["name"]);
        assert_eq!(b["choices"][0]["finish_reason"], "length");
    }
    let body = chat_body("Hello there", json!({"stream": true}));
    let (a, _) = stream_content(&cpu.stream("/v1/chat/completions", &body));
    let (b, chunks) = stream_content(&gpu.stream("/v1/chat/completions", &body));
    assert_eq!(a, b);
    assert!(chunks.len() > 2, "{chunks:?}");
    sampled_text_is_the_same_from_candidates_and_logits(&gpu);
}

/// A seeded, penalized sampling request draws the same tokens whether the server samples from
/// the device's candidates (no logprobs asked) or from the whole logits (logprobs asked).
fn sampled_text_is_the_same_from_candidates_and_logits(s: &Server) {
    let body = |logprobs: bool| {
        chat_body(
            "Tell me something",
            json!({"temperature": 1.2, "top_p": 0.9, "seed": 11, "max_tokens": 40,
                   "presence_penalty": 0.5, "frequency_penalty": 0.3, "logprobs": logprobs}),
        )
    };
    let text = |v: Value| v["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let passes = || s.metric("tinyllm_candidate_passes_total");
    let before = passes();
    let a = text(s.ok("/v1/chat/completions", &body(false)));
    let mid = passes();
    let b = text(s.ok("/v1/chat/completions", &body(true)));
    assert!(
        mid > before,
        "the request without logprobs did not sample from candidates"
    );
    assert_eq!(passes(), mid, "the request with logprobs sampled from candidates");
    assert_eq!(a, b, "candidates and logits drew differently");
    assert!(a.len() > 10, "{a:?}");
}

#[test]
fn cpu_server_samples_the_same_from_candidates_and_logits() {
    sampled_text_is_the_same_from_candidates_and_logits(&fixture(&[]));
}

// ---- Scripted models: tool-call and reasoning formats no random fixture writes ----------------

use common::scripted;

fn scripted_server(name: &str, bytes: Vec<u8>) -> Server {
    Server::start(&scripted::write_model(name, &bytes), &["--threads", "1"])
}

fn weather_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "get_time", "description": "The time",
            "parameters": {"type": "object", "properties": {}}}},
    ])
}

/// What a streamed answer adds up to: reasoning, content, and the calls (id, name, arguments)
/// assembled from their deltas by index, as OpenAI clients do; and the finish reason.
struct Streamed {
    reasoning: String,
    content: String,
    calls: Vec<(String, String, String)>,
    finish: Option<String>,
}

fn streamed(events: &[String]) -> Streamed {
    let (content, chunks) = stream_content(events);
    let mut out = Streamed {
        reasoning: String::new(),
        content,
        calls: Vec::new(),
        finish: None,
    };
    for c in &chunks {
        let choice = &c["choices"][0];
        if let Some(r) = choice["delta"]["reasoning_content"].as_str() {
            out.reasoning.push_str(r);
        }
        for d in choice["delta"]["tool_calls"].as_array().into_iter().flatten() {
            let i = d["index"].as_u64().unwrap() as usize;
            if i == out.calls.len() {
                out.calls.push(Default::default());
            }
            let call = &mut out.calls[i];
            call.0.push_str(d["id"].as_str().unwrap_or_default());
            call.1.push_str(d["function"]["name"].as_str().unwrap_or_default());
            call.2.push_str(d["function"]["arguments"].as_str().unwrap_or_default());
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            out.finish = Some(f.to_string());
        }
    }
    out
}

/// The non-streamed message against the expected reasoning, content and calls, and the same
/// request streamed against the message.
fn check_answer(s: &Server, body: &Value, reasoning: &str, content: Option<&str>, calls: &[(&str, Value)]) {
    let v = s.ok("/v1/chat/completions", body);
    let choice = &v["choices"][0];
    let msg = &choice["message"];
    assert_eq!(msg["reasoning_content"].as_str().unwrap_or_default(), reasoning, "{v}");
    assert_eq!(msg["content"].as_str(), content, "{v}");
    let got = msg["tool_calls"].as_array().cloned().unwrap_or_default();
    assert_eq!(got.len(), calls.len(), "{v}");
    for (call, (name, args)) in got.iter().zip(calls) {
        assert!(call["id"].as_str().unwrap().starts_with("call_"), "{call}");
        assert_eq!(call["type"], "function");
        assert_eq!(call["function"]["name"], *name);
        let parsed: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(&parsed, args);
    }
    let want_finish = if calls.is_empty() { "stop" } else { "tool_calls" };
    assert_eq!(choice["finish_reason"], want_finish, "{v}");

    let mut body = body.clone();
    body["stream"] = json!(true);
    let st = streamed(&s.stream("/v1/chat/completions", &body));
    assert_eq!(st.reasoning, reasoning);
    assert_eq!(st.content, content.unwrap_or_default());
    assert_eq!(st.finish.as_deref(), Some(want_finish));
    let want: Vec<(String, String, String)> = got
        .iter()
        .map(|c| {
            let f = &c["function"];
            (
                c["id"].as_str().unwrap().to_string(),
                f["name"].as_str().unwrap().to_string(),
                f["arguments"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    // Ids are minted per response: compare names and arguments, and that ids look right.
    let strip = |v: &[(String, String, String)]| v.iter().map(|c| (c.1.clone(), c.2.clone())).collect::<Vec<_>>();
    assert_eq!(strip(&st.calls), strip(&want));
    assert!(st.calls.iter().all(|c| c.0.starts_with("call_")), "{:?}", st.calls);
}

/// gpt-oss harmony, end to end: the model (scripted) writes an analysis message, a commentary
/// preamble and a call to `functions.get_weather` ending at `<|call|>`; `<|end|>` must not end
/// the answer (llama.cpp's EOG rule for harmony vocabularies).
#[test]
fn harmony_scripted_reasoning_preamble_and_tool_call() {
    let s = scripted_server("harmony.gguf", scripted::harmony_model());
    let messages = json!([{"role": "user", "content": "What is the weather in Paris?"}]);
    let body = json!({"messages": messages, "tools": weather_tools(), "temperature": 0,
        "chat_template_kwargs": {"reasoning_effort": "low"}});
    check_answer(
        &s,
        &body,
        "The user wants the weather in Paris.",
        Some("Checking the weather."),
        &[("get_weather", json!({"city": "Paris"}))],
    );
    // The prompt is the gpt-oss template's, with the requested effort and the tools.
    let prompt = s.ok("/apply-template", &body)["prompt"].as_str().unwrap().to_string();
    assert!(
        prompt.contains("Reasoning: low") && prompt.contains("type get_weather = (_: {"),
        "{prompt}"
    );
    assert!(prompt.ends_with("<|start|>assistant"), "{prompt}");
    // OpenAI's top-level `reasoning_effort` sets the template's variable, as in llama-server.
    let mut top = body.clone();
    top["reasoning_effort"] = json!("high");
    let prompt_high = s.ok("/apply-template", &top)["prompt"].as_str().unwrap().to_string();
    assert_eq!(prompt_high, prompt.replace("Reasoning: low", "Reasoning: high"));
    top["reasoning_effort"] = json!("none");
    let prompt_none = s.ok("/apply-template", &top)["prompt"].as_str().unwrap().to_string();
    assert_eq!(prompt_none, prompt.replace("Reasoning: low", "Reasoning: medium"));

    // The call's round trip renders (recipient and result in harmony form) and is answered.
    let v = s.ok("/v1/chat/completions", &body);
    let mut turn2 = messages.as_array().unwrap().clone();
    turn2.push(v["choices"][0]["message"].clone());
    turn2.push(
        json!({"role": "tool", "tool_call_id": v["choices"][0]["message"]["tool_calls"][0]["id"],
        "content": "{\"temperature_c\": 18}"}),
    );
    let body2 = json!({"messages": turn2, "tools": weather_tools(), "temperature": 0});
    let prompt2 = s.ok("/apply-template", &body2)["prompt"].as_str().unwrap().to_string();
    assert!(
        prompt2.contains("<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}<|call|>")
            && prompt2.contains("<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"),
        "{prompt2}"
    );
    let v2 = s.ok("/v1/chat/completions", &body2);
    assert_eq!(v2["choices"][0]["finish_reason"], "tool_calls", "{v2}");

    // Without tools the recipient's message is text; analysis is still reasoning.
    let no_tools = json!({"messages": messages, "temperature": 0});
    check_answer(
        &s,
        &no_tools,
        "The user wants the weather in Paris.",
        Some("Checking the weather.<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}"),
        &[],
    );

    // `tool_choice` naming the tool: the prompt ends with the call's opening and the model
    // writes only the arguments.
    let named = json!({"messages": messages, "tools": weather_tools(), "temperature": 0,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}});
    check_answer(&s, &named, "", None, &[("get_weather", json!({"city": "Lyon"}))]);

    // A template variable of the wrong type fails the render: a 400 naming the template.
    let bad = json!({"messages": messages, "chat_template_kwargs": {"reasoning_effort": 5}});
    let r = s.request("POST", "/v1/chat/completions", &[], bad.to_string().as_bytes());
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.json()["error"]["message"].as_str().unwrap().contains("template"),
        "{}",
        r.text()
    );
    // Template variables that are not an object: a 400 naming the field.
    let bad = json!({"messages": messages, "chat_template_kwargs": ["reasoning_effort", "low"]});
    let r = s.request("POST", "/v1/chat/completions", &[], bad.to_string().as_bytes());
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("chat_template_kwargs"), "{}", r.text());
    // A variable the request sets itself: a 400 naming it, never silently replaced.
    let bad = json!({"messages": messages, "chat_template_kwargs": {"messages": []}});
    let r = s.request("POST", "/v1/chat/completions", &[], bad.to_string().as_bytes());
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "chat_template_kwargs", "{}", r.text());
    assert!(r.text().contains("chat_template_kwargs.messages"), "{}", r.text());
}

/// DeepSeek V3.1, end to end: content and two calls after the template's `<think></think>`;
/// with `thinking` on, the prompt opens `<think>` and the answer is reasoning first; after a
/// tool's output the model answers in plain content.
#[test]
fn deepseek_scripted_reasoning_and_tool_calls() {
    let s = scripted_server("deepseek-v3.1.gguf", scripted::deepseek_model());
    let messages = json!([{"role": "user", "content": "What is the weather in Paris?"}]);
    let calls = [("get_weather", json!({"city": "Paris"})), ("get_time", json!({}))];
    let body = json!({"messages": messages, "tools": weather_tools(), "temperature": 0});
    check_answer(&s, &body, "", Some("Let me check."), &calls);

    let thinking = json!({"messages": messages, "tools": weather_tools(), "temperature": 0,
        "chat_template_kwargs": {"thinking": true}});
    check_answer(
        &s,
        &thinking,
        "The user wants the weather.",
        Some("Checking."),
        &calls[..1],
    );

    let v = s.ok("/v1/chat/completions", &body);
    let mut turn2 = messages.as_array().unwrap().clone();
    let msg = v["choices"][0]["message"].clone();
    turn2.push(msg.clone());
    for (i, c) in msg["tool_calls"].as_array().unwrap().iter().enumerate() {
        turn2.push(json!({"role": "tool", "tool_call_id": c["id"], "content": format!("result {i}")}));
    }
    let body2 = json!({"messages": turn2, "tools": weather_tools(), "temperature": 0});
    let prompt2 = s.ok("/apply-template", &body2)["prompt"].as_str().unwrap().to_string();
    assert!(
        prompt2.contains("<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜>")
            && prompt2.ends_with("<｜tool▁output▁begin｜>result 1<｜tool▁output▁end｜>"),
        "{prompt2}"
    );
    check_answer(&s, &body2, "", Some("It is sunny, 18 °C."), &[]);

    // `tool_choice` naming the tool: the model writes only the arguments.
    let named = json!({"messages": messages, "tools": weather_tools(), "temperature": 0,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}});
    check_answer(&s, &named, "", None, &[("get_weather", json!({"city": "Lyon"}))]);
}

/// Tools whose parameters have several schema types: Qwen3-Coder writes every value as text,
/// and the router types it from the schema (`zip` is a string of digits, `days` an integer,
/// `options` an object).
fn qwen_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather forecast for a city",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string"}, "zip": {"type": "string"}, "days": {"type": "integer"},
                "options": {"type": "object"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "get_time", "description": "The time",
            "parameters": {"type": "object", "properties": {}}}},
    ])
}

/// Qwen3-Coder's XML calls, end to end (scripted model output, raw HTTP, streamed and not):
/// content and two calls with typed values; the calls sent back render as the model wrote
/// them; `tool_choice` naming a tool; a call that does not parse comes back as content; a call
/// without its `<tool_call>` tag.
#[test]
fn qwen_coder_scripted_xml_tool_calls() {
    let messages = json!([{"role": "user", "content": "What is the weather in Paris?"}]);
    let body = json!({"messages": messages, "tools": qwen_tools(), "temperature": 0});
    let weather = json!({"city": "Paris", "zip": "75001", "days": 3,
        "options": {"unit": "celsius", "hourly": true}});
    let s = scripted_server(
        "qwen3-coder.gguf",
        scripted::qwen_coder_model(scripted::QWEN_CODER_CALLS),
    );
    check_answer(
        &s,
        &body,
        "",
        Some("Let me check.\n\n"),
        &[("get_weather", weather), ("get_time", json!({}))],
    );
    // The template shows the tools with their types and asks for the XML format.
    let prompt = s.ok("/apply-template", &body)["prompt"].as_str().unwrap().to_string();
    assert!(
        prompt.contains("<name>days</name>\n<type>integer</type>")
            && prompt.contains("<function=example_function_name>"),
        "{prompt}"
    );
    assert!(prompt.ends_with("<|im_start|>assistant\n"), "{prompt}");

    // The round trip: the calls, sent back as the server gave them, render exactly as the model
    // wrote them (typed values turned back into the same text).
    let v = s.ok("/v1/chat/completions", &body);
    let msg = v["choices"][0]["message"].clone();
    let mut turn2 = messages.as_array().unwrap().clone();
    turn2.push(msg.clone());
    for (i, c) in msg["tool_calls"].as_array().unwrap().iter().enumerate() {
        turn2.push(json!({"role": "tool", "tool_call_id": c["id"], "content": format!("result {i}")}));
    }
    let body2 = json!({"messages": turn2, "tools": qwen_tools(), "temperature": 0});
    let prompt2 = s.ok("/apply-template", &body2)["prompt"].as_str().unwrap().to_string();
    let written: String = scripted::QWEN_CODER_CALLS[1..scripted::QWEN_CODER_CALLS.len() - 1].concat();
    assert!(prompt2.contains(&written), "{written:?} not in {prompt2}");
    assert!(
        prompt2.ends_with("<tool_response>\nresult 1\n</tool_response>\n<|im_end|>\n<|im_start|>assistant\n"),
        "{prompt2}"
    );
    drop(s);

    // `tool_choice` naming the tool: the prompt ends with `<tool_call>\n<function=get_weather>\n`
    // and the model writes only the parameters.
    let s = scripted_server(
        "qwen3-coder-forced.gguf",
        scripted::qwen_coder_model(scripted::QWEN_CODER_FORCED),
    );
    let named = json!({"messages": messages, "tools": qwen_tools(), "temperature": 0,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}});
    check_answer(
        &s,
        &named,
        "",
        None,
        &[("get_weather", json!({"city": "Lyon", "days": 2}))],
    );
    drop(s);

    // A call without `</function>` is given back whole, as content.
    let s = scripted_server(
        "qwen3-coder-malformed.gguf",
        scripted::qwen_coder_model(scripted::QWEN_CODER_MALFORMED),
    );
    let text: String = scripted::QWEN_CODER_MALFORMED[..scripted::QWEN_CODER_MALFORMED.len() - 1].concat();
    check_answer(&s, &body, "", Some(&text), &[]);
    drop(s);

    // A call without its `<tool_call>` still counts, as in llama.cpp (Qwen3-Coder only).
    let s = scripted_server(
        "qwen3-coder-untagged.gguf",
        scripted::qwen_coder_model(scripted::QWEN_CODER_UNTAGGED),
    );
    check_answer(
        &s,
        &body,
        "",
        Some("Sure.\n"),
        &[("get_weather", json!({"city": "Paris"}))],
    );
}

/// Qwen3.5: the same XML calls after reasoning (its template opens `<think>`).
#[test]
fn qwen35_scripted_reasoning_and_xml_tool_call() {
    let s = scripted_server("qwen3.5.gguf", scripted::qwen35_model());
    let messages = json!([{"role": "user", "content": "What is the weather in Paris?"}]);
    let body = json!({"messages": messages, "tools": qwen_tools(), "temperature": 0});
    let prompt = s.ok("/apply-template", &body)["prompt"].as_str().unwrap().to_string();
    assert!(prompt.ends_with("<|im_start|>assistant\n<think>\n"), "{prompt}");
    check_answer(
        &s,
        &body,
        "The user wants the weather.\n",
        Some("Checking.\n\n"),
        &[("get_weather", json!({"city": "Paris", "days": 1}))],
    );
}

/// The official `openai` Python client against the scripted models (streamed and not).
#[test]
fn openai_python_client_reads_reasoning_and_tool_calls() {
    for (name, model, family) in [
        ("harmony-py.gguf", scripted::harmony_model(), "harmony"),
        ("deepseek-py.gguf", scripted::deepseek_model(), "deepseek"),
        (
            "qwen3-coder-py.gguf",
            scripted::qwen_coder_model(scripted::QWEN_CODER_CALLS),
            "qwen3-coder",
        ),
        ("qwen3.5-py.gguf", scripted::qwen35_model(), "qwen3.5"),
    ] {
        python_client(
            "server_openai_tools.py",
            &scripted_server(name, model),
            &[family],
            family,
        );
    }
}

/// A GGUF whose chat template does not compile: `serve` refuses it with the template's line,
/// as an input error (exit 2), never a panic.
#[test]
fn malformed_gguf_template_is_a_clear_error() {
    let model = scripted::scripted_model(&scripted::Script {
        template: "{% for m in messages %}\n{{ m.content }\n{% endfor %}",
        specials: &[("<s>", scripted::CONTROL), ("</s>", scripted::CONTROL)],
        bos: "<s>",
        eos: "</s>",
        chains: &[],
    });
    let path = scripted::write_model("bad-template.gguf", &model);
    let out = Command::new(env!("CARGO_BIN_EXE_tinyllm-native"))
        .args(["serve", "--port", "0", "-m"])
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("chat template syntax error at line 2"), "{stderr}");
}

/// The `access-control-allow-origin` header of a response, if any.
fn allow_origin(r: &serve_support::Response) -> Option<String> {
    r.head
        .lines()
        .find_map(|l| l.strip_prefix("access-control-allow-origin:"))
        .map(|v| v.trim().to_string())
}

#[test]
fn foreign_web_origins_are_refused_unless_configured() {
    let preflight = |s: &Server, origin: &str| {
        s.request(
            "OPTIONS",
            "/v1/chat/completions",
            &[
                ("Origin", origin),
                ("Access-Control-Request-Method", "POST"),
                ("Access-Control-Request-Headers", "content-type"),
            ],
            b"",
        )
    };
    let post = |s: &Server, origin: &str| {
        let body = chat_body("Hi", json!({"max_tokens": 2})).to_string();
        s.request(
            "POST",
            "/v1/chat/completions",
            &[("Origin", origin), ("Content-Type", "text/plain")],
            body.as_bytes(),
        )
    };
    let evil = "http://evil.example";

    let s = fixture(&[]);
    // A foreign page: its preflight gets no allow-origin, and a "simple" request (one a
    // browser sends without a preflight) is refused before it reaches the model.
    assert_eq!(allow_origin(&preflight(&s, evil)), None);
    let r = post(&s, evil);
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "origin_not_allowed", "{}", r.text());
    assert!(r.text().contains("--cors-origin"), "{}", r.text());
    // Pages from this machine and the server's own page work; clients without an Origin too.
    for origin in [
        "http://localhost:5173",
        "http://127.0.0.1:3000",
        &format!("http://{}", s.addr),
    ] {
        assert_eq!(
            allow_origin(&preflight(&s, origin)).as_deref(),
            Some(origin),
            "{origin}"
        );
        let r = post(&s, origin);
        assert_eq!(r.status, 200, "{origin}: {}", r.text());
    }
    assert_eq!(
        s.post("/v1/chat/completions", &chat_body("Hi", json!({"max_tokens": 2})))
            .status,
        200
    );
    drop(s);

    // Configured: that origin only, or every origin with '*'.
    let s = fixture(&["--cors-origin", evil]);
    assert_eq!(allow_origin(&preflight(&s, evil)).as_deref(), Some(evil));
    assert_eq!(post(&s, evil).status, 200);
    assert_eq!(post(&s, "http://other.example").status, 403);
    drop(s);
    let s = fixture(&["--cors-origin", "*"]);
    assert_eq!(allow_origin(&preflight(&s, evil)).as_deref(), Some("*"));
    assert_eq!(post(&s, evil).status, 200);
    drop(s);

    // Not an origin: refused at startup with a message naming it.
    let out = Command::new(env!("CARGO_BIN_EXE_tinyllm-native"))
        .args([
            "serve",
            "-m",
            &golden(FIXTURE).to_string_lossy(),
            "--port",
            "0",
            "--cors-origin",
            "evil.example",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--cors-origin \"evil.example\""),
        "{out:?}"
    );
}

#[test]
fn readiness_turns_true_only_after_load_and_warmup() {
    // The load is held back 1.5 s (a test hook) so the probes are seen while it runs.
    let mut s = Server::spawn(
        &golden(FIXTURE),
        &["--threads", "1"],
        &[("TINYLLM_TEST_LOAD_DELAY_MS", "1500")],
    );
    let ready = s.request("GET", "/ready", &[], b"");
    assert_eq!((ready.status, ready.json()), (503, json!({"status": "loading"})));
    let live = s.request("GET", "/health", &[], b"");
    assert_eq!((live.status, live.json()), (200, json!({"status": "loading"})));
    let r = s.post("/v1/chat/completions", &chat_body("Hi", json!({})));
    assert_eq!(r.error(503)["code"], "loading");
    assert!(r.head.contains("retry-after: 1"), "{}", r.head);
    s.wait_ready();
    assert!(s.log().contains("ready: model loaded and warm"), "{}", s.log());
    // A test hook set in the environment is said, so it cannot slow a real server unnoticed.
    assert!(
        s.log()
            .contains("warning: TINYLLM_TEST_LOAD_DELAY_MS=1500 is set: a test hook"),
        "{}",
        s.log()
    );
    assert_eq!(s.request("GET", "/health", &[], b"").json(), json!({"status": "ok"}));
    assert_eq!(s.post("/v1/chat/completions", &chat_body("Hi", json!({}))).status, 200);
    // What an autoscaler reads: the answer's time to first token, and the KV cache it left.
    let m = s.metrics(&[
        "tinyllm_time_to_first_token_seconds_count",
        "tinyllm_kv_cache_tokens",
        "tinyllm_kv_cache_usage_ratio",
        "tinyllm_requests_queued",
    ]);
    assert_eq!(m[0], 1.0, "{m:?}");
    assert!(m[1] > 0.0 && m[2] > 0.0 && m[2] < 1.0 && m[3] == 0.0, "{m:?}");
}

#[test]
fn sigterm_drains_running_streams_and_refuses_new_ones() {
    let mut s = Server::start_with_env(
        &golden(FIXTURE),
        &["--threads", "1", "--parallel", "4", "--drain-timeout", "60"],
        &Server::SLOW_STEPS,
    );
    // Four streams of 600 tokens at 5 ms or more a pass: at least 3 s of decoding, so the
    // signal lands while they run.
    let mut streams: Vec<_> = ["one", "two", "three", "four"]
        .iter()
        .map(|p| {
            let body = chat_body(p, json!({"stream": true, "max_tokens": 600}));
            let mut sse = s.open_stream("/v1/chat/completions", &body);
            sse.next_data().expect("the stream starts");
            sse
        })
        .collect();
    let t0 = Instant::now();
    s.terminate();
    // Readiness drops at once; a new request gets 503 with Retry-After.
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.request("GET", "/ready", &[], b"").status != 503 {
        assert!(Instant::now() < deadline, "/ready stayed 200 after SIGTERM");
        std::thread::sleep(Duration::from_millis(10));
    }
    let r = s.post("/v1/chat/completions", &chat_body("late", json!({})));
    let e = r.error(503);
    assert_eq!(e["code"], "draining", "{e}");
    assert!(r.head.contains("retry-after: 1"), "{}", r.head);
    // In flight: generating in a slot, or handed to the engine and waiting for its next pass.
    let running: f64 = s
        .metrics(&["tinyllm_slots_busy", "tinyllm_requests_queued"])
        .iter()
        .sum();
    // Every running stream ends with [DONE], its length budget spent.
    let handles: Vec<_> = streams
        .drain(..)
        .map(|mut sse| {
            std::thread::spawn(move || {
                let mut last = None;
                let mut finish = None;
                while let Some(d) = sse.next_data() {
                    if let Ok(v) = serde_json::from_str::<Value>(&d) {
                        if let Some(f) = v["choices"][0]["finish_reason"].as_str() {
                            finish = Some(f.to_string());
                        }
                    }
                    last = Some(d);
                }
                (last, finish)
            })
        })
        .collect();
    for h in handles {
        let (last, finish) = h.join().unwrap();
        assert_eq!(last.as_deref(), Some("[DONE]"), "a stream was cut");
        assert!(finish.is_some(), "no finish_reason");
    }
    let st = s
        .wait_exit(Duration::from_secs(60))
        .expect("the server did not exit after draining");
    assert!(st.success(), "exit status {st}\n{}", s.log());
    eprintln!(
        "drain: {running} streams in flight after the 503; all 4 ended with [DONE]; exit 0 after {:.2} s",
        t0.elapsed().as_secs_f64()
    );
    assert!(running >= 1.0, "the streams had ended before the drain was tested");
    let log = s.wait_log("drained: exiting");
    assert!(log.contains("drained: exiting"), "{log}");
}

/// `/v1/embeddings` answers a text, texts and token arrays with the library's vectors (the
/// engine's `embed_texts` on the same file, CPU, one thread), as floats or base64, and refuses
/// every bad input with a 400 naming the field.
#[test]
fn embeddings_route_answers_like_the_library() {
    use tinyllm::backend::cpu::CpuBackend;
    use tinyllm::engine::{EmbedLimits, Engine};
    let s = fixture(&["--ctx", "256"]);
    let file = Arc::new(tinyllm::gguf::GgufFile::open(golden(FIXTURE)).unwrap());
    let engine = Engine::load(CpuBackend::new(1).unwrap(), file).unwrap();
    let texts = [
        "Hello world",
        "A second, longer text: it has punctuation and more tokens.",
    ];
    let limits = EmbedLimits {
        n_batch: 512,
        n_ctx: 256,
    };
    let want = engine.embed_texts(&texts, None, limits).unwrap();
    let same = |got: &Value, want: &[f32], what: &str| {
        let got: Vec<f32> = got
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        assert_eq!(got.len(), want.len(), "{what}");
        let worst = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(worst <= 1e-6, "{what}: differs from the library by {worst}");
    };
    let r = s.ok("/v1/embeddings", &json!({"input": texts, "encoding_format": "float"}));
    assert_eq!(r["object"], "list");
    let tokens: usize = want.iter().map(|e| e.tokens).sum();
    assert_eq!(r["usage"]["prompt_tokens"], tokens);
    for (i, w) in want.iter().enumerate() {
        assert_eq!(r["data"][i]["index"], i);
        same(&r["data"][i]["embedding"], &w.vector, &format!("text {i}"));
    }
    // One text; its tokens; base64 (4 bytes per value).
    let one = s.ok("/v1/embeddings", &json!({"input": texts[1]}));
    same(&one["data"][0]["embedding"], &want[1].vector, "a single text");
    let ids = engine.tokenizer.encode(texts[0], true, true);
    let by_ids = s.ok("/v1/embeddings", &json!({"input": [ids.clone(), ids]}));
    same(&by_ids["data"][1]["embedding"], &want[0].vector, "token arrays");
    let b64 = s.ok(
        "/v1/embeddings",
        &json!({"input": texts[0], "encoding_format": "base64"}),
    );
    let n = want[0].vector.len();
    assert_eq!(
        b64["data"][0]["embedding"].as_str().unwrap().len(),
        (n * 4).div_ceil(3) * 4
    );

    let long: Vec<u32> = vec![1; 257];
    let many: Vec<&str> = vec!["x"; 2049];
    for (body, param) in [
        (json!({"input": ""}), "input[0]"),
        (json!({"input": ["ok", ""]}), "input[1]"),
        (json!({"input": []}), "input"),
        (json!({"input": [[]]}), "input[0]"),
        (json!({"input": [999_999_999u32]}), "input[0]"),
        (json!({"input": long}), "input[0]"),
        (json!({"input": many}), "input"),
        (json!({"input": "x", "dimensions": 3}), "dimensions"),
        (json!({"input": "x", "encoding_format": "hex"}), "encoding_format"),
    ] {
        let e = s.post("/v1/embeddings", &body).error(400);
        assert_eq!(e["param"], param, "{body}: {e}");
    }
    s.post("/v1/embeddings", &json!({"input": 5})).error(400);
    s.post("/v1/embeddings", &json!({"text": "x"})).error(400);
}

/// The official `anthropic` Python client on the real Qwen model: a plain answer whole and
/// streamed (the same text), `count_tokens` equal to the answer's input usage, a stop sequence
/// named, a tool round trip whole and streamed, errors in Anthropic's shape.
#[test]
fn anthropic_python_client_on_the_real_model() {
    let s = Server::start(
        &real_model("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
        &["--parallel", "1", "--ctx", "2048", "--threads", "2"],
    );
    python_client("server_anthropic.py", &s, &["real"], "the real Qwen model");
}

/// Every bad Messages API request gets a 4xx in Anthropic's error shape (`{"type": "error",
/// "error": {"type", "message"}}`) naming what is wrong; a missing key too.
#[test]
fn messages_errors_are_anthropic_error_objects() {
    let s = fixture(&["--api-key", "sekret"]);
    let auth = [("x-api-key", "sekret"), ("Content-Type", "application/json")];
    let post = |body: &str| s.request("POST", "/v1/messages", &auth, body.as_bytes());
    let good = json!({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]});
    let r = post(&good.to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["type"], "message");
    // What Claude Code sends: a system message between the turns, adaptive thinking.
    let cc = json!({"max_tokens": 4, "thinking": {"type": "adaptive"}, "messages": [
        {"role": "user", "content": "hi"}, {"role": "system", "content": [{"type": "text", "text": "Be brief."}]}]});
    let r = post(&cc.to_string());
    assert_eq!(r.status, 200, "{}", r.text());
    let e = s.request("POST", "/v1/messages", &[], good.to_string().as_bytes());
    assert_eq!(e.status, 401);
    assert_eq!(e.json()["error"]["type"], "authentication_error", "{}", e.text());
    let user = |content: Value| json!({"max_tokens": 4, "messages": [{"role": "user", "content": content}]});
    for (body, needle) in [
        ("{\"max_tokens\": ".to_string(), "JSON"),
        (
            json!({"messages": [{"role": "user", "content": "hi"}]}).to_string(),
            "max_tokens",
        ),
        (json!({"max_tokens": 4}).to_string(), "messages"),
        (json!({"max_tokens": 4, "messages": []}).to_string(), "messages"),
        (
            json!({"max_tokens": 4, "messages": [{"role": "robot", "content": "x"}]}).to_string(),
            "role",
        ),
        (user(json!([{"type": "image", "source": {}}])).to_string(), "image"),
        (
            user(json!([{"type": "tool_use", "id": "a", "name": "b", "input": {}}])).to_string(),
            "tool_use",
        ),
        (user(json!([{"text": "no type"}])).to_string(), "type"),
        (user(json!(5)).to_string(), "content"),
        (
            json!({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"type": "web_search_20250305", "name": "web_search"}]})
            .to_string(),
            "server tools",
        ),
        (
            json!({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "tool_choice": {"type": "maybe"}})
                .to_string(),
            "tool_choice",
        ),
        (
            json!({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "thinking": {"type": "on"}})
                .to_string(),
            "thinking",
        ),
        (
            json!({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "temperature": -1}).to_string(),
            "temperature",
        ),
        (
            json!({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "stop_sequences": "x"})
                .to_string(),
            "stop_sequences",
        ),
    ] {
        let r = post(&body);
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        let v = r.json();
        assert_eq!(v["type"], "error", "{body}: {v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{body}: {v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(needle), "{body}: {msg:?} does not name {needle:?}");
    }
    // count_tokens needs no max_tokens, and refuses what /v1/messages refuses.
    let r = s.request(
        "POST",
        "/v1/messages/count_tokens",
        &auth,
        json!({"messages": [{"role": "user", "content": "hi"}]})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json()["input_tokens"].as_u64().unwrap() > 0);
    let r = s.request("POST", "/v1/messages/count_tokens", &auth, b"{\"messages\": []}");
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
}

/// The official `openai` client's Responses API on the real Qwen model: a plain answer whole
/// and streamed (the same text), a tool round trip by items and by `previous_response_id`,
/// structured output under a JSON schema, retrieve and delete, and an evicted id refused.
#[test]
fn openai_responses_client_on_the_real_model() {
    let s = Server::start(
        &real_model("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
        &[
            "--parallel",
            "1",
            "--ctx",
            "2048",
            "--threads",
            "2",
            "--responses-store",
            "2",
        ],
    );
    python_client("server_responses.py", &s, &["real"], "the real Qwen model");
}

/// The Responses API hands the thinking fixture's reasoning out as a `reasoning` item, whole
/// and streamed; the Messages API as a `thinking` block.
#[test]
fn reasoning_items_and_thinking_blocks_from_the_thinking_fixture() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("thinking.gguf");
    std::fs::write(&path, common::gguf_write::thinking_fixture()).unwrap();
    let s = Server::start(&path, &["--threads", "1"]);
    python_client("server_responses.py", &s, &["thinking"], "the thinking fixture");
    python_client("server_anthropic.py", &s, &["thinking"], "the thinking fixture");
}

/// Every bad Responses API request gets a typed 4xx naming the field.
#[test]
fn responses_errors_are_openai_error_objects() {
    let s = fixture(&[]);
    for (body, param, status) in [
        (json!({}), "input", 400),
        (json!({"input": 5}), "input", 400),
        (json!({"input": []}), "input", 400),
        (
            json!({"input": [{"type": "message", "role": "robot", "content": "x"}]}),
            "input[0].role",
            400,
        ),
        (json!({"input": [{"type": "computer_call"}]}), "input[0].type", 400),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}),
            "input[0].content[0].type",
            400,
        ),
        (
            json!({"input": [{"type": "function_call", "name": "f"}]}),
            "input[0].call_id",
            400,
        ),
        (
            json!({"input": "x", "tools": [{"type": "teleport"}]}),
            "tools[0].type",
            400,
        ),
        (
            json!({"input": "x", "text": {"format": {"type": "yaml"}}}),
            "text.format.type",
            400,
        ),
        (json!({"input": "x", "max_output_tokens": 0}), "max_output_tokens", 400),
        (
            json!({"input": "x", "previous_response_id": "resp_nope"}),
            "previous_response_id",
            404,
        ),
    ] {
        let e = s.post("/v1/responses", &body).error(status);
        assert_eq!(e["param"], param, "{body}: {e}");
    }
    let r = s.request("GET", "/v1/responses/resp_nope", &[], b"");
    assert_eq!(r.status, 404);
    assert_eq!(r.error(404)["code"], "response_not_found");
    assert_eq!(s.request("DELETE", "/v1/responses/resp_nope", &[], b"").status, 404);
    // store: false keeps nothing.
    let v = s.ok(
        "/v1/responses",
        &json!({"input": "hi", "max_output_tokens": 2, "store": false}),
    );
    let id = v["id"].as_str().unwrap();
    assert_eq!(s.request("GET", &format!("/v1/responses/{id}"), &[], b"").status, 404);
    let v = s.ok("/v1/responses", &json!({"input": "hi", "max_output_tokens": 2}));
    let id = v["id"].as_str().unwrap();
    assert_eq!(
        s.request("GET", &format!("/v1/responses/{id}"), &[], b"").json()["id"],
        id
    );
}
