//! The npm package in a real browser: headless Chromium (WebGPU through SwiftShader, the CPU
//! path in wasm) driven by playwright-core (`tests/browser/drive.mjs`), against the package
//! built into `web/pkg/` by `scripts/build-web.sh`, served with the test pages and the models
//! by `support/server.rs`. What the browser computes is compared with the native engine in
//! this process.
//!
//! Needs `/usr/bin/chromium` (or `$CHROMIUM`), `npm ci` in `web/` and a built `web/pkg/`;
//! `scripts/test.sh` and `.ci/run` provide all three. The tests fail, rather than skip,
//! without them.

#![cfg(not(target_arch = "wasm32"))]

#[path = "../../tests/common/mod.rs"]
mod common;
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use support::server::{Options, TestServer};
use tinyllm::backend::cpu::CpuBackend;
use tinyllm::engine::{generate, Engine, Flow, Prepared, Settings};
use tinyllm::gguf::{GgufFile, Value as GgufValue};
use tinyllm::sample::SamplerConfig;

/// Longest a scenario may run (real models on SwiftShader are slow).
const TIME_LIMIT: Duration = Duration::from_secs(900);
/// Greedy tokens must agree until the native run's top-1 / top-2 probability gap drops below
/// this (a near-tie, where last-bit differences between kernels may pick either).
const NEAR_TIE: f64 = 0.01;

const FIXTURES: [&str; 5] = [
    "llama.Q4_K_M.gguf",
    "qwen2.Q8_0.gguf",
    "qwen3.Q4_K_M.gguf",
    "gemma3.Q4_K_M.gguf",
    "qwen35.F16.gguf",
];

fn web_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn chromium() -> PathBuf {
    std::env::var_os("CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"))
}

fn check_setup() {
    assert!(
        chromium().is_file(),
        "{} is missing: `apt-get install chromium` (or set CHROMIUM), as .ci/run does",
        chromium().display()
    );
    assert!(
        web_dir().join("node_modules/playwright-core").is_dir(),
        "playwright-core is missing: run `npm ci` in web/, as scripts/test.sh does"
    );
    assert!(
        web_dir().join("pkg/wasm/tinyllm_web_bg.wasm").is_file(),
        "web/pkg is not built: run scripts/build-web.sh, as scripts/test.sh does"
    );
}

/// A folder of model files for the server (links to the golden fixtures and real models,
/// plus whatever a test writes there).
struct Models {
    dir: tempfile::TempDir,
}

impl Models {
    fn new() -> Models {
        let dir = tempfile::tempdir().unwrap();
        for f in FIXTURES {
            std::os::unix::fs::symlink(common::golden(&format!("fixtures/{f}")), dir.path().join(f)).unwrap();
        }
        for f in common::REAL_MODELS {
            let p = common::models_dir().join(f);
            if p.is_file() {
                std::os::unix::fs::symlink(p, dir.path().join(f)).unwrap();
            }
        }
        Models { dir }
    }

    fn write(&self, name: &str, bytes: &[u8]) {
        std::fs::write(self.dir.path().join(name), bytes).unwrap();
    }

    fn path(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }
}

fn serve(models: &Models, options: Options) -> TestServer {
    check_setup();
    TestServer::start(
        web_dir().join("pkg"),
        web_dir().join("tests/browser"),
        models.path(),
        options,
    )
}

/// Run a Node script with `args` (Chromium at `CHROMIUM`), within [`TIME_LIMIT`]: its exit
/// status (None if it ran past the limit), stdout and stderr.
fn node(args: &[&std::ffi::OsStr]) -> (Option<std::process::ExitStatus>, String, String) {
    let mut cmd = Command::new("node");
    cmd.args(args).env("CHROMIUM", chromium());
    let f = common::run_with_limit(cmd, TIME_LIMIT);
    (f.status, f.stdout, f.stderr)
}

/// Run scenario `name` with `args` in Chromium on `server`'s test page; its JSON result.
fn scenario(server: &TestServer, name: &str, args: Value) -> Value {
    let script = web_dir().join("tests/browser/drive.mjs");
    let page = format!("{}/index.html", server.url);
    let args = args.to_string();
    let (status, out, err) = node(&[script.as_os_str(), page.as_ref(), name.as_ref(), args.as_ref()]);
    eprintln!("--- {name}: browser log\n{err}");
    match status {
        None => panic!("scenario {name} ran past {TIME_LIMIT:?}"),
        Some(st) => assert!(st.success(), "scenario {name} failed ({st}):\n{err}"),
    }
    let last = out.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| panic!("scenario {name}: no JSON result ({e}): {out}"))
}

/// Native greedy tokens of `ids` on `file` (CPU backend), with each step's top-1 / top-2
/// probability gap.
fn native_greedy(file: &Path, ids: &[u32], n: usize) -> (Vec<u32>, Vec<f64>) {
    let gguf = Arc::new(GgufFile::open(file).unwrap());
    let engine = Engine::load(CpuBackend::new(2).unwrap(), gguf).unwrap();
    let mut session = engine.session(512).unwrap();
    let settings = Settings {
        sampler: SamplerConfig::greedy(),
        max_tokens: Some(n),
        logprobs: Some(2),
        ..Settings::default()
    };
    let mut gen = engine.generation(Prepared::ids(ids.to_vec()), settings).unwrap();
    let mut tokens = Vec::new();
    let mut gaps = Vec::new();
    generate(&mut session, &mut gen, &AtomicBool::new(false), |step| {
        if let (Some(t), Some(lp)) = (step.token, &step.logprob) {
            tokens.push(t);
            let p = |i: usize| lp.top.get(i).map_or(0.0, |x| f64::from(x.2).exp());
            gaps.push(p(0) - p(1));
        }
        Flow::Continue
    })
    .unwrap();
    (tokens, gaps)
}

/// The browser's greedy tokens agree with the native ones up to the first near-tie.
fn assert_same_greedy(what: &str, got: &[u32], want: &[u32], gaps: &[f64]) {
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if g != w {
            assert!(
                gaps[i] < NEAR_TIE,
                "{what}: step {i} gives {g}, native {w} at a clear gap of {:.4}\nbrowser {got:?}\nnative  {want:?}",
                gaps[i]
            );
            eprintln!("{what}: parts at step {i}, a near-tie (gap {:.4})", gaps[i]);
            return;
        }
    }
    assert_eq!(got.len(), want.len(), "{what}: browser {got:?}, native {want:?}");
}

/// A prompt for the fixtures: the first golden case of each file.
fn fixture_prompt(f: &str) -> Vec<u32> {
    let text = std::fs::read_to_string(common::golden(&format!(
        "fixtures/{}",
        f.replace(".gguf", ".golden.jsonl")
    )))
    .unwrap();
    let first: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    first["prompt_ids"]
        .as_array()
        .or_else(|| first["prompt"].as_array())
        .unwrap_or_else(|| panic!("{f}: no prompt ids in {first}"))
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

/// The fixtures' greedy tokens in the browser on `backend` (`options`: more load options, such
/// as the wasm build's kernels or the WebGPU device's features) against native ones. Returns
/// each load's `info`.
fn greedy_in_browser(backend: &str, threads: Option<u32>, isolate: bool, options: Value) -> Vec<Value> {
    let models = Models::new();
    let server = serve(
        &models,
        Options {
            isolate,
            ..Options::default()
        },
    );
    let n = 12;
    let cases: Vec<Value> = FIXTURES
        .iter()
        .map(|f| json!({"url": format!("/models/{f}"), "promptIds": fixture_prompt(f), "maxTokens": n}))
        .collect();
    let got = scenario(
        &server,
        "greedy",
        json!({"models": cases, "backend": backend, "threads": threads, "options": options}),
    );
    let what = format!("{backend} {options}");
    let mut infos = Vec::new();
    for (f, r) in FIXTURES.iter().zip(got.as_array().unwrap()) {
        assert_eq!(r["info"]["backend"], backend, "{f}: {}", r["info"]);
        if let Some(t) = threads {
            assert_eq!(r["info"]["threads"], t, "{f}: {}", r["info"]);
        }
        let ids = fixture_prompt(f);
        let (want, gaps) = native_greedy(&common::golden(&format!("fixtures/{f}")), &ids, n);
        let tokens: Vec<u32> = serde_json::from_value(r["tokens"].clone()).unwrap();
        assert_same_greedy(&format!("{f} on {what}"), &tokens, &want, &gaps);
        eprintln!("{f} on {what} ({}): {tokens:?}", r["info"]["device"]);
        infos.push(r["info"].clone());
    }
    infos
}

/// WebGPU with the device's own features and on a device asked for without shader-f16 (every
/// kernel in f32, as on adapters without the feature): both reproduce the native tokens, and
/// the second device has no f16.
#[test]
fn fixtures_reproduce_native_greedy_tokens_on_webgpu_with_and_without_f16() {
    for f16 in [true, false] {
        let infos = greedy_in_browser("webgpu", None, false, json!({"webgpu": {"f16": f16}}));
        if !f16 {
            for info in infos {
                assert_eq!(info["f16"], false, "asked for no shader-f16: {info}");
            }
        }
    }
}

/// The wasm CPU on one thread, in the SIMD128 build and the relaxed-SIMD one (Chromium runs
/// both): each reproduces the native tokens, and each load says which build ran.
#[test]
fn fixtures_reproduce_native_greedy_tokens_on_the_wasm_cpu() {
    for (kernels, build) in [("simd128", "wasm"), ("relaxed", "wasm-relaxed")] {
        for info in greedy_in_browser("cpu", Some(1), false, json!({"cpuKernels": kernels})) {
            assert_eq!(info["wasm_build"], build, "{info}");
            assert_eq!(info["device"], kernels, "{info}");
        }
    }
}

/// `llm.embeddings.create` in the browser, on the wasm CPU and on WebGPU (with and without
/// f16): every vector of the fixtures' embedding goldens (`scripts/embedding-goldens.py`,
/// llama.cpp's `llama-embedding`) within cosine 0.999, the base64 answer the same vectors, an
/// empty input a typed error.
#[test]
fn embeddings_in_the_browser_match_llama_cpp() {
    let models = Models::new();
    let mut cases = Vec::new();
    let mut goldens = Vec::new();
    for name in ["qwen2.F16", "gemma3.F16"] {
        let file = format!("{name}.gguf");
        models.write(
            &file,
            &std::fs::read(common::golden(&format!("fixtures/{file}"))).unwrap(),
        );
        for pooling in ["mean", "last"] {
            let path = common::golden(&format!("embeddings/{name}.{pooling}.json"));
            let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            cases.push(json!({"url": format!("/models/{file}"), "texts": doc["texts"], "pooling": pooling}));
            goldens.push((format!("{name}.{pooling}"), doc));
        }
    }
    let server = serve(&models, Options::default());
    for (backend, options) in [
        ("cpu", json!({})),
        ("webgpu", json!({"f16": true})),
        ("webgpu", json!({"f16": false})),
    ] {
        let got = scenario(
            &server,
            "embeddings",
            json!({"cases": cases, "backend": backend, "webgpu": options}),
        );
        for ((name, doc), r) in goldens.iter().zip(got.as_array().unwrap()) {
            assert_eq!(r["info"]["backend"], backend, "{name}: {}", r["info"]);
            assert_eq!(r["bad"]["code"], "BAD_REQUEST", "{name}: {}", r["bad"]);
            let mut worst = 1.0f64;
            for (i, want) in doc["embeddings"].as_array().unwrap().iter().enumerate() {
                let want: Vec<f64> = want.as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
                let floats: Vec<f64> = r["floats"]["data"][i]["embedding"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_f64().unwrap())
                    .collect();
                let decoded: Vec<f64> = r["decoded"][i]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_f64().unwrap())
                    .collect();
                assert_eq!(floats.len(), want.len(), "{name} [{i}]");
                assert!(
                    floats
                        .iter()
                        .zip(&decoded)
                        .all(|(a, b)| (a - b).abs() <= 1e-6 * a.abs().max(1e-30)),
                    "{name} [{i}]: base64 and float answers differ"
                );
                let dot: f64 = floats.iter().zip(&want).map(|(a, b)| a * b).sum();
                let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
                worst = worst.min(dot / (norm(&floats) * norm(&want)));
            }
            eprintln!("{name} on {backend} {options}: min cosine {worst:.6}");
            assert!(worst >= 0.999, "{name} on {backend} {options}: min cosine {worst}");
        }
    }
}

/// `backend: 'auto'` never picks a fallback (software) WebGPU adapter such as headless
/// Chromium's SwiftShader: the wasm CPU runs, and `backend_reason` says why. On a page with a
/// hardware adapter it picks WebGPU.
#[test]
fn auto_skips_a_fallback_webgpu_adapter() {
    let models = Models::new();
    let server = serve(&models, Options::default());
    let got = scenario(
        &server,
        "autoChoice",
        json!({"url": format!("/models/{}", FIXTURES[0])}),
    );
    let (adapter, info) = (&got["adapter"], &got["info"]);
    eprintln!("adapter {adapter}, info {info}");
    let software = adapter.is_null()
        || adapter["isFallbackAdapter"] == true
        || adapter.to_string().to_lowercase().contains("swiftshader");
    if software {
        assert_eq!(info["backend"], "cpu", "{got}");
        let reason = info["backend_reason"].as_str().unwrap_or_default();
        assert!(reason.starts_with("auto:"), "{got}");
        if !adapter.is_null() {
            assert!(
                reason.contains("fallback"),
                "the reason names the fallback adapter: {got}"
            );
        }
    } else {
        assert_eq!(info["backend"], "webgpu", "{got}");
    }
    assert_eq!(got["tokens"].as_array().map(Vec::len), Some(2), "{got}");
}

#[test]
fn a_second_load_comes_from_cache_storage() {
    let models = Models::new();
    let server = serve(&models, Options::default());
    let url = format!("/models/{}", FIXTURES[0]);
    let got = scenario(&server, "cache", json!({"url": url, "backend": "cpu"}));
    let loads = got.as_array().unwrap();
    assert_eq!(loads[0]["cached"], false, "{got}");
    assert_eq!(loads[1]["cached"], true, "{got}");
    assert_eq!(loads[0]["tokens"], loads[1]["tokens"], "{got}");
    let gets: Vec<_> = server.hits_of(&url).into_iter().filter(|h| h.method == "GET").collect();
    assert_eq!(gets.len(), 1, "the model was fetched {} times: {gets:?}", gets.len());
}

#[test]
fn split_sets_flaky_downloads_blobs_and_buffers_load_alike() {
    let models = Models::new();
    let fixture = common::golden(&format!("fixtures/{}", FIXTURES[2]));
    let file = GgufFile::open(&fixture).unwrap();
    let parts = common::gguf_write::split(&file, 3);
    let mut urls = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        let name = format!("split-{:05}-of-{:05}.gguf", i + 1, parts.len());
        models.write(&name, p);
        urls.push(format!("/models/{name}"));
    }
    models.write("flaky.gguf", &std::fs::read(&fixture).unwrap());
    let options = Options {
        flaky: ["/models/flaky.gguf".to_string()].into_iter().collect(),
        ..Options::default()
    };
    let server = serve(&models, options);
    let got = scenario(
        &server,
        "sources",
        json!({
            "url": format!("/models/{}", FIXTURES[2]),
            "urls": urls,
            "flakyUrl": "/models/flaky.gguf",
            "backend": "cpu",
            "promptIds": [1, 15, 27, 300],
        }),
    );
    for k in ["split", "flaky", "blob", "buffer"] {
        assert_eq!(got[k], got["whole"], "{k}: {got}");
    }
    let flaky = server.hits_of("/models/flaky.gguf");
    assert!(
        flaky
            .iter()
            .any(|h| h.range.as_deref().is_some_and(|r| r.starts_with("bytes=")) && h.status == 206),
        "no Range request resumed the cut download: {flaky:?}"
    );
}

#[test]
fn bad_input_gives_typed_errors_and_the_worker_answers_after() {
    let models = Models::new();
    let good = common::golden(&format!("fixtures/{}", FIXTURES[1]));
    let bytes = std::fs::read(&good).unwrap();
    models.write("truncated.gguf", &bytes[..bytes.len() * 2 / 3]);
    models.write(
        "page.gguf",
        b"<!doctype html><title>Not a model</title>".repeat(50).as_slice(),
    );
    let file = GgufFile::open(&good).unwrap();
    models.write(
        "mamba.gguf",
        &common::gguf_write::with_metadata(&file, "general.architecture", GgufValue::String("mamba".into())),
    );
    let server = serve(&models, Options::default());
    let other = serve(&models, Options::default()); // another origin (port), no CORS headers
    let got = scenario(
        &server,
        "errors",
        json!({
            "notFound": "/models/missing.gguf",
            "truncated": "/models/truncated.gguf",
            "notGguf": "/models/page.gguf",
            "unsupported": "/models/mamba.gguf",
            "crossOrigin": format!("{}/models/{}", other.url, FIXTURES[1]),
            "good": format!("/models/{}", FIXTURES[1]),
            "backend": "cpu",
        }),
    );
    let code = |k: &str| got[k]["code"].as_str().unwrap_or("").to_string();
    assert_eq!(code("notFound"), "NOT_FOUND", "{got}");
    assert_eq!(code("truncated"), "TRUNCATED", "{got}");
    assert_eq!(code("notGguf"), "NOT_GGUF", "{got}");
    assert_eq!(code("unsupported"), "UNSUPPORTED_ARCH", "{got}");
    assert!(
        got["unsupported"]["message"].as_str().unwrap().contains("mamba"),
        "{got}"
    );
    assert_eq!(code("crossOrigin"), "CORS", "{got}");
    assert_eq!(code("badBackend"), "BAD_REQUEST", "{got}");
    assert_eq!(got["loadedAfter"], "qwen2", "{got}");
    assert_eq!(code("badRequest"), "BAD_REQUEST", "{got}");
    assert_eq!(code("emptyMessages"), "BAD_REQUEST", "{got}");
    assert_eq!(code("badTemperature"), "BAD_REQUEST", "{got}");
    assert_eq!(code("badIds"), "BAD_REQUEST", "{got}");
    assert_eq!(code("tooLong"), "CONTEXT_LENGTH_EXCEEDED", "{got}");
    assert_eq!(code("aborted"), "ABORTED", "{got}");
    assert_eq!(got["aborted"]["name"], "AbortError", "{got}");
    assert!(got["chunksBeforeAbort"].as_u64().unwrap() >= 3, "{got}");
    assert_eq!(got["tokensAfter"].as_array().map(Vec::len), Some(3), "{got}");
    assert_eq!(got["wholeAfter"]["object"], "chat.completion", "{got}");
    // Structured output in the worker: answers follow the schema, streamed and not.
    let valid = |v: &Value| {
        let keys: Vec<&String> = v.as_object().map(|o| o.keys().collect()).unwrap_or_default();
        keys.len() == 2
            && ["red", "green"].contains(&v["color"].as_str().unwrap_or(""))
            && (1..=9).contains(&v["n"].as_i64().unwrap_or(0))
    };
    let answers = got["jsonAnswers"].as_array().expect("jsonAnswers");
    assert_eq!(answers.len(), 2, "{got}");
    for a in answers {
        let v: Value = serde_json::from_str(a.as_str().unwrap_or("")).unwrap_or(Value::Null);
        assert!(valid(&v), "not valid under the schema: {a}");
    }
    assert_eq!(code("badGrammar"), "BAD_REQUEST", "{got}");
    let call = &got["forcedCall"][0]["function"];
    assert_eq!(call["name"], "get_weather", "{got}");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap_or("")).unwrap_or(Value::Null);
    assert!(valid(&args), "forced call arguments not valid: {got}");
    assert_eq!(code("unloaded"), "UNLOADED", "{got}");
}

/// The real models load in the browser and give the native engine's first 8 greedy tokens,
/// exactly: the prompt is one whose first 8 steps have no near-tie natively (checked).
fn real_models_in_browser(backend: &str) {
    let models = Models::new();
    let server = serve(&models, Options::default());
    let n = 8;
    let prompts: Vec<(String, Vec<u32>)> = common::REAL_MODELS
        .iter()
        .map(|f| {
            let file = GgufFile::open(common::real_model(f)).unwrap();
            let tok = tinyllm::tokenizer::Tokenizer::from_gguf(&file).unwrap();
            (f.to_string(), tok.encode("def fibonacci(n):", true, false))
        })
        .collect();
    let cases: Vec<Value> = prompts
        .iter()
        .map(|(f, ids)| json!({"url": format!("/models/{f}"), "promptIds": ids, "maxTokens": n}))
        .collect();
    let got = scenario(
        &server,
        "greedy",
        json!({"models": cases, "backend": backend, "contextSize": 256}),
    );
    for ((f, ids), r) in prompts.iter().zip(got.as_array().unwrap()) {
        assert_eq!(r["info"]["backend"], backend, "{f}: {}", r["info"]);
        let (want, gaps) = native_greedy(&common::real_model(f), ids, n);
        assert!(
            gaps.iter().all(|&g| g >= NEAR_TIE),
            "{f}: the prompt has a near-tie in its first {n} steps natively ({gaps:?}); pick another"
        );
        let tokens: Vec<u32> = serde_json::from_value(r["tokens"].clone()).unwrap();
        assert_eq!(tokens, want, "{f} on {backend}: browser vs native greedy tokens");
        eprintln!(
            "{f} on {backend}: {tokens:?}, prefill {} tok/s, decode {} tok/s",
            r["timings"]["prefill_tok_s"], r["timings"]["decode_tok_s"]
        );
    }
}

/// Full tier only: a real model on SwiftShader (WebGPU emulated on the CPU) takes minutes.
#[test]
fn real_models_give_natives_first_tokens_on_webgpu() {
    if !common::full_tier("the fixtures on WebGPU in the browser and the real models on the wasm CPU") {
        return;
    }
    real_models_in_browser("webgpu");
}

#[test]
fn real_models_give_natives_first_tokens_on_the_wasm_cpu() {
    real_models_in_browser("cpu");
}

/// `TinyLLM.estimate` (the GGUF header alone) against the wasm memory's measured peak after a
/// load, a prefill (300 tokens on the CPU) and a few decoded tokens: within 10% for both real
/// models on the wasm CPU, and on WebGPU in the full tier (SwiftShader is slow).
#[test]
fn the_memory_estimate_is_within_a_tenth_of_the_measured_peak() {
    let models = Models::new();
    let server = serve(&models, Options::default());
    let mut backends = vec!["cpu"];
    if common::full_tier("the memory estimate of the real models on WebGPU") {
        backends.push("webgpu");
    }
    for backend in backends {
        for model in common::REAL_MODELS {
            let got = scenario(
                &server,
                "memory",
                // On WebGPU the activations live on the GPU (and SwiftShader prefills at about
                // a token a second): a short prompt there.
                json!({"url": format!("/models/{model}"), "backend": backend, "contextSize": 1024,
                    "promptTokens": if backend == "cpu" { 300 } else { 8 }, "firstId": 1000}),
            );
            let est = got["estimate"][backend]["wasm_bytes"].as_f64().unwrap();
            let measured = got["measured"].as_f64().unwrap();
            eprintln!(
                "{model} on {backend}: estimate {:.1} MB, measured peak {:.1} MB ({:+.1}%); parts {}",
                est / 1e6,
                measured / 1e6,
                100.0 * (est - measured) / measured,
                got["estimate"]
            );
            assert!(
                (est - measured).abs() <= 0.1 * measured,
                "{model} on {backend}: estimate {est} vs measured {measured}: {got}"
            );
            assert_eq!(got["estimate"]["n_ctx"], 1024, "{got}");
        }
    }
}

/// A model whose header claims more than a tab has (a fixture whose trained context is 2^31
/// positions, loaded with its full context: terabytes of KV cache) is refused with
/// INSUFFICIENT_MEMORY naming the numbers, as soon as its header is in; the same file with a
/// small context loads and runs.
#[test]
fn a_model_too_large_for_the_tab_is_refused_with_insufficient_memory() {
    let models = Models::new();
    let mut bytes = std::fs::read(common::golden(&format!("fixtures/{}", FIXTURES[0]))).unwrap();
    // The u32 value after the key `llama.context_length` and its type tag (4: u32).
    let key = b"llama.context_length";
    let at = bytes
        .windows(key.len())
        .position(|w| w == key)
        .expect("context_length key")
        + key.len();
    assert_eq!(&bytes[at..at + 4], &4u32.to_le_bytes(), "a u32 value");
    bytes[at + 4..at + 8].copy_from_slice(&(1u32 << 31).to_le_bytes());
    models.write("huge-context.gguf", &bytes);
    let server = serve(&models, Options::default());
    for backend in ["cpu", "webgpu"] {
        let refused = scenario(
            &server,
            "loadOrError",
            json!({"url": "/models/huge-context.gguf", "backend": backend, "contextSize": 0}),
        );
        assert_eq!(refused["code"], "INSUFFICIENT_MEMORY", "{backend}: {refused}");
        let msg = refused["message"].as_str().unwrap_or_default();
        assert!(
            msg.contains("MB") && msg.contains("2147483648 positions"),
            "{backend}: {msg}"
        );
        let small = scenario(
            &server,
            "loadOrError",
            json!({"url": "/models/huge-context.gguf", "backend": backend, "contextSize": 256}),
        );
        assert_eq!(small["code"], "loaded", "{backend}: {small}");
    }
    // The estimate says the same before any load.
    let est = scenario(
        &server,
        "memory",
        json!({"url": "/models/huge-context.gguf", "backend": "cpu", "contextSize": 256, "promptTokens": 8, "firstId": 1}),
    );
    assert_eq!(est["estimate"]["n_ctx"], 256, "{est}");
}

/// On a cross-origin isolated page the CPU path runs on two Web Workers (the threaded build)
/// and still reproduces the native greedy tokens.
#[test]
fn fixtures_reproduce_native_greedy_tokens_on_two_wasm_threads() {
    for (kernels, build) in [("simd128", "wasm-mt"), ("relaxed", "wasm-mt-relaxed")] {
        for info in greedy_in_browser("cpu", Some(2), true, json!({"cpuKernels": kernels})) {
            assert_eq!(info["wasm_build"], build, "{info}");
        }
    }
}

/// The chat page of the npm package (`pkg/chat/`), its model running in the page's worker on
/// the wasm CPU: the same end-to-end script as under `tinyllm-native serve`
/// (native/tests/browser/chat_page.mjs): send, stream, IndexedDB, stop, reasoning folded,
/// screenshots checked (and kept in `$CARGO_TARGET_TMPDIR/chat-page/`).
#[test]
fn chat_page_in_the_browser_build() {
    let models = Models::new();
    models.write("thinking.gguf", &common::gguf_write::thinking_fixture());
    let server = serve(&models, Options::default());
    let script = web_dir().join("../native/tests/browser/chat_page.mjs");
    assert!(
        script.with_file_name("node_modules/playwright-core").is_dir(),
        "playwright-core is missing: run `npm ci` in native/tests/browser, as scripts/test.sh does"
    );
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("chat-page");
    std::fs::create_dir_all(&shots).unwrap();
    let page = format!(
        "{}/pkg/chat/index.html?model=/models/thinking.gguf&backend=cpu",
        server.url
    );
    let prefix = shots.join("browser");
    let (status, out, err) = node(&[script.as_os_str(), page.as_ref(), prefix.as_os_str()]);
    let report = format!("--- stdout\n{out}--- stderr\n{err}");
    match status {
        None => panic!("chat_page.mjs ran past {TIME_LIMIT:?}\n{report}"),
        Some(st) => assert!(st.success(), "chat_page.mjs failed ({st})\n{report}"),
    }
    assert!(out.contains("chat page: ok") && out.contains("over worker"), "{report}");
    eprintln!("{out}");
}

/// The Vite example app (web/example), built into `web/example/dist` by scripts/test.sh from
/// the package's built output: served as built, it loads a fixture on the wasm CPU and streams
/// the same answer the package gives whole.
#[test]
fn example_app_built_with_vite_answers() {
    check_setup();
    let dist = web_dir().join("example/dist");
    assert!(
        dist.join("tinyllm/tinyllm.js").is_file(),
        "web/example is not built: run `npm ci && npm run build` in web/example, as scripts/test.sh does"
    );
    let models = Models::new();
    let server = TestServer::start(web_dir().join("pkg"), dist, models.path(), Options::default());
    let script = web_dir().join("tests/browser/example.mjs");
    let page = format!(
        "{}/index.html?model=/models/{}&backend=cpu&max_tokens=16",
        server.url, FIXTURES[2]
    );
    let (status, out, err) = node(&[script.as_os_str(), page.as_ref()]);
    let report = format!("--- stdout\n{out}--- stderr\n{err}");
    assert!(status.is_some_and(|s| s.success()), "example.mjs failed\n{report}");
    assert!(out.contains("example: ok"), "{report}");
    eprintln!("{out}");
}

/// Speed benchmark, not a test (`--ignored`; `scripts/browser-bench.sh` runs it with the native
/// numbers beside): prefill and decode tok/s of the real models on the package's wasm CPU path
/// (the SIMD128 and the relaxed-SIMD builds) next to @wllama/wllama (llama.cpp in wasm, from
/// web/package.json) on the same GGUF, in the same headless Chromium, with the same threads,
/// alternating within one run; then both on WebGPU (SwiftShader here). Prints a table with the
/// ratios to wllama, and to native tinyllm where `TINYLLM_BENCH_NATIVE` names a JSON file of
/// native rates (`{"<model file>": {"<threads>": {"prefill": .., "decode": ..}}}`), and the
/// memory; writes the raw numbers to `$CARGO_TARGET_TMPDIR/web-bench.json`.
///
///   TINYLLM_BENCH_ROUNDS=3 cargo test --release -p tinyllm-web --test browser bench -- --ignored --nocapture
///
/// More knobs: TINYLLM_BENCH_THREADS=1,2, TINYLLM_BENCH_MODELS=gemma (a substring),
/// TINYLLM_BENCH_WEBGPU=0 (leave WebGPU out: minutes on SwiftShader).
#[test]
#[ignore]
fn bench_cpu_and_webgpu_against_wllama() {
    let rounds: u32 = std::env::var("TINYLLM_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let threads: Vec<u32> = std::env::var("TINYLLM_BENCH_THREADS")
        .ok()
        .map(|v| v.split(',').filter_map(|t| t.parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 2]);
    let native: Value = std::env::var("TINYLLM_BENCH_NATIVE")
        .ok()
        .map(|p| serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap())
        .unwrap_or(Value::Null);
    let models = Models::new();
    let wllama = web_dir().join("node_modules/@wllama/wllama/esm");
    assert!(wllama.is_dir(), "@wllama/wllama is missing: run `npm ci` in web/");
    let server = serve(
        &models,
        Options {
            isolate: true,
            mounts: vec![("/wllama".into(), wllama)],
            ..Options::default()
        },
    );
    // About 130 tokens of prose on either tokenizer; code after it keeps greedy decoding going.
    let prompt = "The history of computing is a story of machines that became smaller, faster and cheaper \
        with every decade. Early computers filled rooms and consumed enormous amounts of power, yet they \
        could only perform a few thousand operations each second. Transistors replaced vacuum tubes, \
        integrated circuits replaced transistors, and microprocessors put an entire computer on a single \
        chip. Today a phone carries more computing power than the machines that guided the first \
        missions to the moon. Here is a small Python program that prints the Fibonacci numbers:\n\ndef fibonacci(n):";
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let rate = |rs: &[Value], key: &str| {
        let mut v: Vec<f64> = rs
            .iter()
            .flat_map(|r| r["runs"].as_array().unwrap().iter().map(|x| x[key].as_f64().unwrap()))
            .collect();
        median(&mut v)
    };
    let mut all = Vec::new();
    // The per-op hand-off of the threaded builds: rayon's wake-up per op against the team's.
    for &t in threads.iter().filter(|&&t| t > 1) {
        for build in ["wasm-mt", "wasm-mt-relaxed"] {
            let got = scenario(
                &server,
                "dispatchOverhead",
                json!({"threads": t, "ops": 20000, "build": build}),
            );
            for d in got.as_array().into_iter().flatten() {
                println!(
                    "hand-off per op, {build}, {t} threads, after {:.1} us of serial work: rayon {:.1} us, team {:.1} us",
                    d["serial_us"].as_f64().unwrap_or(f64::NAN),
                    d["rayon_us"].as_f64().unwrap_or(f64::NAN),
                    d["team_us"].as_f64().unwrap_or(f64::NAN)
                );
                all.push(json!({"dispatch": d, "build": build, "threads": t}));
            }
        }
    }
    println!(
        "| model | path | threads | prefill tok/s | wllama | x wllama | % native | decode tok/s | wllama | x wllama | % native | wasm memory |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut configs: Vec<(&str, u32)> = threads.iter().map(|&t| ("cpu", t)).collect();
    if std::env::var("TINYLLM_BENCH_WEBGPU").as_deref() != Ok("0") {
        configs.push(("webgpu", 1));
    }
    // TINYLLM_BENCH_MODELS=gemma (a substring) picks models.
    let only = std::env::var("TINYLLM_BENCH_MODELS").unwrap_or_default();
    for model in common::REAL_MODELS.iter().filter(|m| m.contains(only.as_str())) {
        let url = format!("{}/models/{model}", server.url);
        for &(path, t) in &configs {
            // SwiftShader runs WebGPU on the CPU, slowly: a short prompt and a few tokens there.
            let (text, decode, n) = match path {
                "webgpu" => (&prompt[..prompt.find('.').unwrap() + 1], 8, 1),
                _ => (prompt, 64, rounds),
            };
            let args = json!({"url": url, "threads": t, "backend": path, "gpu": path == "webgpu",
                "promptText": text, "decodeTokens": decode, "rounds": n});
            // The engines and builds measured here: on the CPU both wasm builds, on WebGPU one.
            let ours: Vec<Option<&str>> = match path {
                "webgpu" => vec![None],
                _ => vec![Some("simd128"), Some("relaxed")],
            };
            let mut runs: Vec<(String, Vec<Value>)> = ours
                .iter()
                .map(|k| (format!("tinyllm {}", k.unwrap_or("webgpu")), Vec::new()))
                .chain([("wllama".to_string(), Vec::new())])
                .collect();
            // Alternate the order, so no engine always gets the cooler machine.
            for turn in 0..2 {
                let mut order: Vec<usize> = (0..runs.len()).collect();
                if turn == 1 {
                    order.reverse();
                }
                for i in order {
                    let r = if runs[i].0 == "wllama" {
                        scenario(&server, "benchWllama", args.clone())
                    } else {
                        let mut a = args.clone();
                        if let Some(k) = ours[i] {
                            a["cpuKernels"] = json!(k);
                        }
                        scenario(&server, "benchTinyllm", a)
                    };
                    runs[i].1.push(r);
                }
            }
            let theirs = runs.pop().unwrap().1;
            let (wp, wd) = (rate(&theirs, "prefill_tok_s"), rate(&theirs, "decode_tok_s"));
            let nat = &native[model][t.to_string()];
            let pct = |v: f64, key: &str| {
                nat[key]
                    .as_f64()
                    .filter(|_| path == "cpu")
                    .map_or("-".to_string(), |n| format!("{:.0}%", 100.0 * v / n))
            };
            for (name, rs) in &runs {
                let (op, od) = (rate(rs, "prefill_tok_s"), rate(rs, "decode_tok_s"));
                let mem = rs
                    .iter()
                    .map(|r| r["wasmBytes"].as_f64().unwrap_or(0.0))
                    .fold(0.0, f64::max);
                println!(
                    "| {model} | {name} | {t} | {op:.1} | {wp:.1} | {:.2}x | {} | {od:.1} | {wd:.1} | {:.2}x | {} | {:.0} MB |",
                    op / wp,
                    pct(op, "prefill"),
                    od / wd,
                    pct(od, "decode"),
                    mem / 1e6
                );
            }
            println!(
                "  wllama page memory: {} MB; native {t} threads: prefill {} / decode {} tok/s",
                theirs[0]["page"]["totalBytes"]
                    .as_f64()
                    .map_or("-".into(), |b| format!("{:.0}", b / 1e6)),
                nat["prefill"],
                nat["decode"]
            );
            all.push(
                json!({"model": model, "path": path, "threads": t, "tinyllm": runs, "wllama": theirs, "native": nat}),
            );
        }
    }
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("web-bench.json");
    std::fs::write(&out, serde_json::to_string_pretty(&all).unwrap()).unwrap();
    println!("raw numbers: {}", out.display());
}

/// Where a decode step's time goes on the wasm CPU at 1 and 2 threads (relaxed builds): the
/// engine's op profile by call site, each op's time and the time the pass spent alone before
/// it, side by side. What the second thread cannot speed up shows as `alone` time.
///
///   TINYLLM_BENCH_MODELS=qwen cargo test --release -p tinyllm-web --test browser profile_decode -- --ignored --nocapture
#[test]
#[ignore]
fn profile_decode_ops_at_one_and_two_threads() {
    let models = Models::new();
    let server = serve(
        &models,
        Options {
            isolate: true,
            ..Options::default()
        },
    );
    let only = std::env::var("TINYLLM_BENCH_MODELS").unwrap_or_default();
    for model in common::REAL_MODELS.iter().filter(|m| m.contains(only.as_str())) {
        let url = format!("{}/models/{model}", server.url);
        let runs: Vec<Value> = [1, 2]
            .iter()
            .map(|t| {
                scenario(
                    &server,
                    "profileTinyllm",
                    json!({"url": url, "threads": t, "cpuKernels": "relaxed", "decodeTokens": 64}),
                )
            })
            .collect();
        println!("{model}");
        for r in &runs {
            let p = &r["profile"];
            let ops: f64 = p["sites"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["op_ms"].as_f64().unwrap())
                .sum();
            let alone: f64 = p["sites"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["alone_ms"].as_f64().unwrap())
                .sum();
            println!(
                "  {} threads ({}): decode {:.1} tok/s; {} passes, {:.1} ms in passes: ops {:.1}, alone {:.1}, tail {:.1}",
                r["info"]["threads"],
                r["info"]["wasm_build"],
                r["timings"]["decode_tok_s"].as_f64().unwrap_or(0.0),
                p["passes"],
                p["pass_ms"].as_f64().unwrap_or(0.0),
                ops,
                alone,
                p["tail_ms"].as_f64().unwrap_or(0.0)
            );
        }
        println!(
            "  {:<44} {:>6} {:>10} {:>10} {:>10} {:>10}",
            "site", "calls", "op 1t", "op 2t", "alone 1t", "alone 2t"
        );
        let site = |r: &Value, name: &str, key: &str| {
            r["profile"]["sites"]
                .as_array()
                .unwrap()
                .iter()
                .find(|s| s["site"] == name)
                .and_then(|s| s[key].as_f64())
                .unwrap_or(0.0)
        };
        for s in runs[0]["profile"]["sites"].as_array().unwrap() {
            let name = s["site"].as_str().unwrap();
            println!(
                "  {:<44} {:>6} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
                name,
                s["calls"],
                site(&runs[0], name, "op_ms"),
                site(&runs[1], name, "op_ms"),
                site(&runs[0], name, "alone_ms"),
                site(&runs[1], name, "alone_ms")
            );
        }
    }
}
