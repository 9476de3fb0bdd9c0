//! Several models behind one `tinyllm-native serve`: routing by the request's `model`, loading
//! on first use, unloading the least recently used idle model under `--max-loaded` and
//! `--memory-budget`, never one in use, and per-model metrics. Each model must answer exactly
//! as a server of its own does.

#[path = "../../tests/common/mod.rs"]
mod common;
mod serve_support;

use common::{golden, real_model};
use serde_json::{json, Value};
use serve_support::{Server, FIXTURE};
use std::process::Command;
use std::time::{Duration, Instant};

/// A second fixture of another family, served beside [`FIXTURE`].
const OTHER: &str = "fixtures/llama.Q8_0.gguf";

fn chat(model: Option<&str>, user: &str, max_tokens: u32) -> Value {
    let mut body = json!({
        "messages": [{"role": "user", "content": user}],
        "temperature": 0,
        "max_tokens": max_tokens,
    });
    if let Some(m) = model {
        body["model"] = json!(m);
    }
    body
}

fn content(answer: &Value) -> String {
    answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("no content: {answer}"))
        .to_string()
}

/// Two fixture models, `qwen` (the default) and `llama`, one thread, with `extra` flags.
fn two_fixtures(extra: &[&str]) -> Server {
    two_fixtures_with_env(extra, &[])
}

fn two_fixtures_with_env(extra: &[&str], env: &[(&str, &str)]) -> Server {
    let second = format!("llama={}", golden(OTHER).display());
    let mut args = vec!["--threads", "1", "-m", &second];
    args.extend_from_slice(extra);
    // The first -m is the harness's: the fixture path, served under its file name.
    Server::start_with_env(&golden(FIXTURE), &args, env)
}

const QWEN: &str = "qwen2.Q8_0";

/// The acceptance case: the two real models in one server, asked by four clients at once (two
/// per model), answer exactly what a server of each model alone answers, greedily.
#[test]
fn two_real_models_from_four_clients_answer_as_two_single_servers() {
    let models = [
        ("qwen", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
        ("gemma", "gemma-3-270m-q4_k_m.gguf"),
    ];
    let prompts = ["Name three colors.", "What is 2 + 2?"];
    let mut want = Vec::new();
    for (_, file) in models {
        let single = Server::start(&real_model(file), &["--threads", "2", "--parallel", "2"]);
        for p in prompts {
            // A single server routes any name to its one model.
            want.push(content(
                &single.ok("/v1/chat/completions", &chat(Some("anything"), p, 16)),
            ));
        }
    }
    let second = format!("gemma={}", real_model(models[1].1).display());
    let first = format!("qwen={}", real_model(models[0].1).display());
    let s = Server::start(
        std::path::Path::new(&first),
        &["-m", &second, "--threads", "2", "--parallel", "2"],
    );
    let listed = s.request("GET", "/v1/models", &[], b"").json();
    let ids: Vec<&str> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["qwen", "gemma"], "{listed}");
    let got: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = models
            .iter()
            .flat_map(|(name, _)| prompts.iter().map(move |p| (*name, *p)))
            .map(|(name, p)| {
                let s = &s;
                scope.spawn(move || content(&s.ok("/v1/chat/completions", &chat(Some(name), p, 16))))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(got, want, "one server of two models vs a server per model");
    for (name, _) in models {
        assert_eq!(s.model_metric("tinyllm_requests_total", name), 2.0, "{name}");
        assert_eq!(s.model_metric("tinyllm_model_loaded", name), 1.0, "{name}");
    }
}

/// With several models the request's `model` routes: each answers as its own server does, an
/// unknown name is a 404 `model_not_found` naming the known ones (in each API's shape), a
/// request without `model` goes to the first, and /v1/models lists them all.
#[test]
fn model_field_routes_and_an_unknown_model_is_model_not_found() {
    let s = two_fixtures(&[]);
    let listed = s.request("GET", "/v1/models", &[], b"").json();
    let data = listed["data"].as_array().unwrap();
    assert_eq!(data.len(), 2, "{listed}");
    assert_eq!(
        (data[0]["id"].as_str(), data[1]["id"].as_str()),
        (Some(QWEN), Some("llama"))
    );
    // Only the first is loaded at startup; the second loads on first use.
    assert_eq!(
        (data[0]["meta"]["loaded"].as_bool(), data[1]["meta"]["loaded"].as_bool()),
        (Some(true), Some(false))
    );
    assert_eq!(s.model_metric("tinyllm_model_loaded", "llama"), 0.0);

    let alone = Server::start(&golden(OTHER), &["--threads", "1"]);
    let want_llama = content(&alone.ok("/v1/chat/completions", &chat(None, "Hello there", 12)));
    let first = Server::start(&golden(FIXTURE), &["--threads", "1"]);
    let want_qwen = content(&first.ok("/v1/chat/completions", &chat(None, "Hello there", 12)));
    assert_ne!(
        want_llama, want_qwen,
        "the two fixtures must answer differently for routing to show"
    );
    assert_eq!(
        content(&s.ok("/v1/chat/completions", &chat(Some("llama"), "Hello there", 12))),
        want_llama
    );
    assert_eq!(
        content(&s.ok("/v1/chat/completions", &chat(Some(QWEN), "Hello there", 12))),
        want_qwen
    );
    assert_eq!(
        content(&s.ok("/v1/chat/completions", &chat(None, "Hello there", 12))),
        want_qwen
    );
    assert_eq!(s.model_metric("tinyllm_model_loaded", "llama"), 1.0);
    assert_eq!(s.model_metric("tinyllm_requests_total", "llama"), 1.0);
    assert_eq!(s.model_metric("tinyllm_requests_total", QWEN), 2.0);
    // The tokenizer routes, /tokenize included: the two vocabularies differ.
    let toks = |m: &str| s.ok("/tokenize", &json!({"content": "Hello there", "model": m}))["tokens"].clone();
    assert_eq!(
        toks("llama"),
        alone.ok("/tokenize", &json!({"content": "Hello there"}))["tokens"]
    );
    assert_eq!(
        toks(QWEN),
        first.ok("/tokenize", &json!({"content": "Hello there"}))["tokens"]
    );

    let e = s
        .post("/v1/chat/completions", &chat(Some("gpt-4o"), "hi", 4))
        .error(404);
    assert_eq!(
        (e["code"].as_str(), e["param"].as_str()),
        (Some("model_not_found"), Some("model")),
        "{e}"
    );
    let msg = e["message"].as_str().unwrap();
    assert!(
        msg.contains("gpt-4o") && msg.contains(QWEN) && msg.contains("llama"),
        "{msg}"
    );
    for (path, field) in [
        ("/v1/completions", "prompt"),
        ("/v1/embeddings", "input"),
        ("/v1/responses", "input"),
        ("/tokenize", "content"),
    ] {
        let body = json!({"model": "nope", field: "a"});
        let e = s.post(path, &body).error(404);
        assert_eq!(e["code"], "model_not_found", "{path}: {e}");
    }
    let r = s.post(
        "/v1/messages",
        &json!({"model": "claude-x", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(r.status, 404, "{}", r.text());
    let v = r.json();
    assert_eq!(v["type"], "error", "Anthropic's error shape: {v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("claude-x"), "{v}");
    let mut bad = chat(None, "hi", 4);
    bad["model"] = json!(5);
    let e = s.post("/v1/chat/completions", &bad).error(400);
    assert_eq!(e["param"], "model", "{e}");
}

/// `--max-loaded 1`: asking for the second model unloads the first (idle) one, and asking for
/// the first again loads it again, answering as before. The reload time is printed.
#[test]
fn max_loaded_one_unloads_the_idle_model_and_reloads_it() {
    let s = two_fixtures(&["--max-loaded", "1"]);
    let before = content(&s.ok("/v1/chat/completions", &chat(Some(QWEN), "Tell me a story", 16)));
    content(&s.ok("/v1/chat/completions", &chat(Some("llama"), "Tell me a story", 16)));
    assert_eq!(s.model_metric("tinyllm_model_loaded", QWEN), 0.0);
    assert_eq!(s.model_metric("tinyllm_model_unloads_total", QWEN), 1.0);
    assert_eq!(s.model_metric("tinyllm_model_loaded", "llama"), 1.0);
    let started = Instant::now();
    let again = content(&s.ok("/v1/chat/completions", &chat(Some(QWEN), "Tell me a story", 16)));
    let reload = started.elapsed();
    assert_eq!(again, before, "the reloaded model answers as before");
    assert_eq!(s.model_metric("tinyllm_model_loads_total", QWEN), 2.0);
    assert_eq!(s.model_metric("tinyllm_model_loaded", "llama"), 0.0);
    // The counters survive the unload: three requests, two of them on the first model.
    assert_eq!(s.model_metric("tinyllm_requests_total", QWEN), 2.0);
    eprintln!(
        "reload of the fixture and its answer: {:.0} ms (load alone {:.0} ms over 2 loads)",
        reload.as_secs_f64() * 1e3,
        s.model_metric("tinyllm_model_load_seconds_total", QWEN) * 1e3
    );
}

/// A model answering a request is never unloaded: under `--max-loaded 1` a request for the
/// other model waits until the stream ends, and the stream completes whole. With
/// `--load-wait 0` the same request is a 503 `models_busy` at once instead.
#[test]
fn a_model_in_use_is_not_unloaded() {
    let s = two_fixtures_with_env(&["--max-loaded", "1"], &Server::SLOW_STEPS);
    let mut body = chat(Some(QWEN), "Count to one hundred", 150);
    body["stream"] = json!(true);
    body["ignore_eos"] = json!(true);
    let mut stream = s.open_stream("/v1/chat/completions", &body);
    assert!(stream.next_data().is_some(), "the stream began");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|scope| {
        let s = &s;
        scope.spawn(move || {
            let answer = s.ok("/v1/chat/completions", &chat(Some("llama"), "hi", 4));
            tx.send((Instant::now(), answer)).unwrap();
        });
        let mut events = 1;
        let mut finish = Value::Null;
        while let Some(data) = stream.next_data() {
            if data == "[DONE]" {
                break;
            }
            events += 1;
            let chunk: Value = serde_json::from_str(&data).unwrap();
            if !chunk["choices"][0]["finish_reason"].is_null() {
                finish = chunk["choices"][0]["finish_reason"].clone();
            }
            assert!(
                rx.try_recv().is_err(),
                "the other model answered while this one streamed"
            );
        }
        let ended = Instant::now();
        assert_eq!(finish, "length", "the stream ran to its limit ({events} events)");
        let (answered, answer) = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the waiting request is answered");
        assert!(answered >= ended, "answered before the stream ended");
        assert!(answer["choices"][0]["message"]["content"].is_string(), "{answer}");
    });
    assert_eq!(s.model_metric("tinyllm_model_unloads_total", QWEN), 1.0);
    assert_eq!(s.model_metric("tinyllm_requests_total", QWEN), 1.0);

    let s = two_fixtures_with_env(&["--max-loaded", "1", "--load-wait", "0"], &Server::SLOW_STEPS);
    let mut stream = s.open_stream("/v1/chat/completions", &body);
    assert!(stream.next_data().is_some());
    let r = s.post("/v1/chat/completions", &chat(Some("llama"), "hi", 4));
    let e = r.error(503);
    assert_eq!(e["code"], "models_busy", "{e}");
    assert!(r.header("retry-after").is_some(), "{}", r.head);
    assert_eq!(s.model_metric("tinyllm_model_loaded", QWEN), 1.0);
    while let Some(d) = stream.next_data() {
        if d == "[DONE]" {
            break;
        }
    }
}

/// `--memory-budget` unloads as `--max-loaded` does, by the sizes `/v1/models` reports; a model
/// larger than the budget alone is refused at startup, naming the flag.
#[test]
fn memory_budget_unloads_by_size_and_refuses_a_model_larger_than_it() {
    let probe = two_fixtures(&[]);
    let sizes: Vec<u64> = probe.request("GET", "/v1/models", &[], b"").json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["meta"]["memory_bytes"].as_u64().unwrap())
        .collect();
    drop(probe);
    assert!(sizes.iter().all(|&b| b > 0), "{sizes:?}");
    // Room for either, not both.
    let budget = (sizes[0].max(sizes[1]) + 1).to_string();
    let s = two_fixtures(&["--memory-budget", &budget]);
    content(&s.ok("/v1/chat/completions", &chat(Some("llama"), "hi", 4)));
    assert_eq!(s.model_metric("tinyllm_model_loaded", QWEN), 0.0);
    assert_eq!(s.model_metric("tinyllm_model_unloads_total", QWEN), 1.0);

    let small = (sizes[0] / 2).to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_tinyllm-native"))
        .args(["serve", "--port", "0", "-m"])
        .arg(golden(FIXTURE))
        .args(["--memory-budget", &small])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--memory-budget"), "{err}");
}

/// `--models-dir` serves every GGUF in a folder under its file name; bad flags are errors
/// that name them.
#[test]
fn models_dir_serves_every_gguf_in_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(golden(FIXTURE), dir.path().join("alpha.gguf")).unwrap();
    std::fs::copy(golden(OTHER), dir.path().join("llama.Q8_0.gguf")).unwrap();
    std::fs::write(dir.path().join("notes.txt"), "not a model").unwrap();
    let s = Server::start(
        &golden(FIXTURE),
        &["--threads", "1", "--models-dir", dir.path().to_str().unwrap()],
    );
    let ids: Vec<String> = s.request("GET", "/v1/models", &[], b"").json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect();
    // The -m model first, then the folder's files in name order.
    assert_eq!(ids, [QWEN, "alpha", "llama.Q8_0"]);
    let answer = s.ok("/v1/chat/completions", &chat(Some("llama.Q8_0"), "hi", 4));
    assert_eq!(answer["model"], "llama.Q8_0");
    let answer = s.ok("/v1/chat/completions", &chat(Some("alpha"), "hi", 4));
    assert_eq!(answer["model"], "alpha");

    for (args, needle) in [
        (vec!["--max-loaded", "0"], "--max-loaded"),
        (vec!["--load-wait", "inf"], "--load-wait"),
        (vec!["--memory-budget", "lots"], "--memory-budget"),
        (vec!["--models-dir", "/nonexistent/models"], "--models-dir"),
        (vec!["-m", "a=x.gguf", "--alias", "b"], "--alias"),
        (
            vec![
                "-m",
                &format!("llama={}", golden(OTHER).display()),
                "-m",
                &format!("llama={}", golden(FIXTURE).display()),
            ],
            "two models are named",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_tinyllm-native"))
            .args(["serve", "--port", "0", "-m"])
            .arg(golden(FIXTURE))
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(needle), "{args:?}: {err}");
    }
}
