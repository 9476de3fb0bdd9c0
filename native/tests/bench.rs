//! `bench` end to end on a tiny golden fixture: the JSON report has the agreed shape and
//! self-consistent numbers, and bad flags exit 2 with a message. Speed is never asserted.

#[path = "../../tests/common/mod.rs"]
mod common;

use common::golden;
use serde_json::Value;
use std::process::{Command, Output};

fn fixture() -> String {
    golden("fixtures/llama.Q8_0.gguf").to_string_lossy().into_owned()
}

fn tinyllm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tinyllm-native"))
        .args(args)
        .output()
        .expect("run tinyllm-native")
}

fn bench_json(extra: &[&str]) -> Value {
    let model = fixture();
    let mut args = vec!["bench", "-m", &model, "--threads", "2", "--json"];
    args.extend_from_slice(extra);
    let out = tinyllm(&args);
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("bench --json prints one JSON object")
}

fn num(row: &Value, key: &str) -> f64 {
    row[key]
        .as_f64()
        .unwrap_or_else(|| panic!("'{key}' is not a number in {row}"))
}

#[test]
fn json_report_has_one_sane_row_per_prompt_length() {
    let j = bench_json(&[
        "--prompt-tokens",
        "8,33,96",
        "--decode-tokens",
        "6",
        "--repetitions",
        "2",
    ]);
    assert_eq!(j["model"].as_str(), Some(fixture().as_str()));
    assert_eq!(j["threads"].as_u64(), Some(2));
    assert_eq!(j["backend"].as_str(), Some("cpu"));
    let rows = j["results"].as_array().expect("results array");
    let lengths: Vec<u64> = rows.iter().map(|r| r["prompt_tokens"].as_u64().unwrap()).collect();
    assert_eq!(lengths, [8, 33, 96]);
    for r in rows {
        for key in [
            "ttft_s",
            "prefill_tok_s",
            "decode_tok_s",
            "decode_p50_ms",
            "decode_p95_ms",
        ] {
            let v = num(r, key);
            assert!(v.is_finite() && v > 0.0, "{key} = {v} in {r}");
        }
        assert!(num(r, "decode_p95_ms") >= num(r, "decode_p50_ms"), "p95 < p50 in {r}");
        // The prefill rate is prompt_tokens over the prefill time, which TTFT includes.
        let prefill_s = r["prompt_tokens"].as_f64().unwrap() / num(r, "prefill_tok_s");
        assert!(
            prefill_s <= num(r, "ttft_s") * (1.0 + 1e-9),
            "prefill time {prefill_s}s exceeds TTFT in {r}"
        );
        // A decode step's median latency and the decode rate describe the same steps.
        let p50_rate = 1e3 / num(r, "decode_p50_ms");
        let rate = num(r, "decode_tok_s");
        assert!(
            rate < p50_rate * 20.0 && rate > p50_rate / 20.0,
            "decode {rate} tok/s is inconsistent with p50 {p50_rate} tok/s in {r}"
        );
    }
}

/// `--cache-type f16,q8_0`: each prompt length measured with both KV caches, the rows side by
/// side, each with the cache's bytes per token. The fixture (llama: 2 layers, K and V rows of
/// 2 heads of 64) keeps 2 · 2 · 128 values per token: 1024 bytes in f16, 544 in Q8_0 blocks
/// (34 bytes per 32 values).
#[test]
fn cache_types_are_measured_side_by_side() {
    let j = bench_json(&[
        "--prompt-tokens",
        "8,40",
        "--decode-tokens",
        "3",
        "--cache-type",
        "f16,q8_0",
    ]);
    assert_eq!(j["cache_types"], serde_json::json!(["f16", "q8_0"]));
    let rows = j["results"].as_array().expect("results array");
    let got: Vec<(u64, &str, u64)> = rows
        .iter()
        .map(|r| {
            (
                r["prompt_tokens"].as_u64().unwrap(),
                r["cache_type"].as_str().unwrap(),
                r["kv_bytes_per_token"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [(8, "f16", 1024), (8, "q8_0", 544), (40, "f16", 1024), (40, "q8_0", 544)]
    );
    for r in rows {
        assert!(num(r, "decode_tok_s") > 0.0, "{r}");
    }
    // The default is the f16 cache alone.
    let j = bench_json(&["--prompt-tokens", "8", "--decode-tokens", "2"]);
    assert_eq!(j["results"][0]["cache_type"], "f16");
    assert_eq!(j["results"].as_array().unwrap().len(), 1);
}

#[test]
fn text_mode_prints_a_table() {
    let model = fixture();
    let out = tinyllm(&[
        "bench",
        "-m",
        &model,
        "--prompt-tokens",
        "16",
        "--decode-tokens",
        "2",
        "--no-warmup",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    // The header, then one row per prompt length (the startup line follows the table).
    let mut lines = text.lines().skip_while(|l| !l.contains("prefill tok/s"));
    assert!(lines.next().is_some(), "no table header:\n{text}");
    let row = lines.next().unwrap_or_default();
    assert_eq!(row.split_whitespace().next(), Some("16"), "{text}");
    assert!(text.contains("startup: model fetch"), "{text}");
}

#[test]
fn bad_flags_exit_2_with_a_message() {
    let model = fixture();
    let cases: &[(&[&str], &str)] = &[
        (&["--prompt-tokens", "0"], "--prompt-tokens"),
        (&["--prompt-tokens", "16,abc"], "abc"),
        (&["--prompt-tokens", ""], "--prompt-tokens"),
        (&["--decode-tokens", "0"], "--decode-tokens"),
        (&["--repetitions", "0"], "--repetitions"),
        // 100 + 32 decoded tokens cannot fit a 64-token context.
        (&["--prompt-tokens", "100", "--ctx", "64"], "context"),
        // Longer than the model's trained context (2048).
        (&["--prompt-tokens", "4000", "--ctx", "0"], "context"),
        (&["--threads", "0"], "--threads"),
        (&["--cache-type", "q4_0"], "--cache-type"),
        // The op profile is the CPU's or Vulkan's; the start-up probes are Vulkan's.
        (&["--backend", "webgpu", "--profile"], "--profile"),
        (&["--startup"], "--startup"),
    ];
    for (extra, needle) in cases {
        let mut args = vec!["bench", "-m", &model];
        args.extend_from_slice(extra);
        let out = tinyllm(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: stderr {stderr}");
        assert!(stderr.contains(needle), "{args:?}: '{needle}' not in {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    }
}

/// `--profile` on the CPU: every pass of the measured runs counted (each prefill and each
/// decode step), the matmuls named by their weights with the rows they took, and the ops'
/// time and the serial time before them within the passes' time.
#[test]
fn cpu_profile_accounts_for_the_passes() {
    let (prompt, decode, reps) = (8u64, 4u64, 2u64);
    let j = bench_json(&[
        "--prompt-tokens",
        &prompt.to_string(),
        "--decode-tokens",
        &decode.to_string(),
        "--repetitions",
        &reps.to_string(),
        "--profile",
    ]);
    let p = &j["cpu_profile"];
    // A run: one prefill pass, then decode steps; the first token comes from the prefill.
    let passes = p["passes"].as_u64().expect("passes");
    assert!(passes >= reps * decode, "{p}");
    let sites = p["sites"].as_array().expect("sites");
    let rows = |n: u64| format!("rows {n}");
    let named = |n: u64| {
        sites.iter().any(|s| {
            let site = s["site"].as_str().unwrap_or("");
            site.starts_with("matmul ") && site.contains("Q8_0") && site.ends_with(&rows(n))
        })
    };
    assert!(named(prompt) && named(1), "prefill and decode matmuls by weight: {p}");
    let spent: f64 = sites.iter().map(|s| num(s, "op_ms") + num(s, "alone_ms")).sum();
    let pass_ms = num(p, "pass_ms");
    assert!(
        spent > 0.0 && spent <= pass_ms * (1.0 + 1e-9),
        "{spent} ms of {pass_ms}: {p}"
    );
}

/// `--bandwidth`: a measured read bandwidth, the weights a decode step reads (every matrix;
/// the embedding table only where the output head is tied to it: this fixture has its own
/// output matrix), and each decode rate as the fraction of the bound they set.
#[test]
fn bandwidth_report_is_consistent() {
    let j = bench_json(&["--prompt-tokens", "8", "--decode-tokens", "4", "--bandwidth"]);
    let read = num(&j, "read_gb_s");
    assert!(read > 0.1, "{j}");
    let inspect = tinyllm(&["inspect", &fixture(), "--json"]);
    let info: Value = serde_json::from_slice(&inspect.stdout).expect("inspect --json");
    let tensors = info["tensors"].as_array().expect("tensors");
    let tied = !tensors.iter().any(|t| t["name"] == "output.weight");
    assert!(!tied, "the fixture has an output matrix");
    let want: u64 = tensors
        .iter()
        .filter(|t| t["shape"].as_array().unwrap().len() >= 2 && t["name"] != "token_embd.weight")
        .map(|t| t["bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(j["weight_bytes_per_token"].as_u64(), Some(want));
    let bound = num(&j, "decode_bound_tok_s");
    assert!((bound - read * 1e9 / want as f64).abs() <= 1e-6 * bound, "{j}");
    let row = &j["results"][0];
    let f = num(row, "decode_bound_fraction");
    assert!(
        (f - num(row, "decode_tok_s") / bound).abs() <= 1e-9 * f.max(1.0),
        "{row}"
    );
}

/// `--startup` on Vulkan: this program started four times as a fresh process, a cold and a
/// warm start with the pipeline cache alone and with every cache. Each warm start reads the
/// cache file its cold start wrote as it ended (the cold one finds none), both make the
/// pipelines the measured run makes, and the run's own first token does not count the
/// probes' time. Timings are reported, never asserted. Skips without a Vulkan device.
#[test]
fn startup_times_cold_and_warm_starts_in_fresh_processes() {
    if !common::full_tier("vulkan_dispatch's pipeline-cache round trip and the other bench tests") {
        return;
    }
    let gpus: Value =
        serde_json::from_slice(&tinyllm(&["inspect", "--gpus", "--json"]).stdout).expect("inspect --gpus --json");
    let found = common::device_or_skip(|| match gpus["vulkan"]["devices"].as_array() {
        Some(d) if !d.is_empty() => Ok(()),
        _ => Err(format!("no Vulkan devices: {}", gpus["vulkan"]["reason"])),
    });
    if found.is_none() {
        return;
    }
    let j = bench_json(&[
        "--backend",
        "vulkan",
        "--prompt-tokens",
        "8",
        "--decode-tokens",
        "2",
        "--no-warmup",
        "--startup",
    ]);
    let pairs = j["vulkan_cold_and_warm_starts"].as_array().expect("the starts");
    let caches: Vec<&str> = pairs.iter().map(|p| p["caches"].as_str().unwrap()).collect();
    assert_eq!(caches, ["pipeline_cache", "all"]);
    let made = j["vulkan_pipelines"]["count"].as_u64().expect("pipelines counted");
    assert!(made > 0, "{j}");
    let mut probes_s = 0.0;
    for p in pairs {
        let (cold, warm) = (&p["cold"], &p["warm"]);
        assert_eq!(cold["pipeline_cache_bytes_read"].as_u64(), Some(0), "{p}");
        assert!(
            warm["pipeline_cache_bytes_read"].as_u64() > Some(0),
            "the warm start read what the cold one wrote: {p}"
        );
        for s in [cold, warm] {
            assert_eq!(
                s["pipelines"].as_u64(),
                Some(made),
                "the probes make what the run makes: {p}"
            );
            let (first, load) = (num(s, "first_token_s"), num(s, "load_s"));
            assert!(0.0 < load && load < first, "{s}");
            assert!(0.0 < num(s, "pipelines_s") && num(s, "pipelines_s") < first, "{s}");
            probes_s += first;
        }
        let speedup = num(cold, "first_token_s") / num(warm, "first_token_s");
        assert!((num(p, "first_token_speedup") - speedup).abs() <= 1e-9 * speedup, "{p}");
    }
    // The run's own first token is timed from its start without the four probes before it.
    assert!(num(&j["startup"], "first_token_s") < probes_s, "{j}");
}
