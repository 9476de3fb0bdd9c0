//! `run` and `chat` end to end on the tiny golden fixtures (fast) and the real models:
//! greedy output against llama.cpp's tokens, and exit code 2 with a clear message for bad input.

mod cli_support;
#[path = "../../tests/common/mod.rs"]
mod common;

use cli_support::{input_error, jsonl, ok_stdout};
use common::{golden, real_model, GgufWriter};
use serde_json::Value;
use std::io::Write;
use std::process::{Command, Stdio};

fn ids_arg(ids: &Value) -> String {
    ids.as_array()
        .unwrap()
        .iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// How many leading tokens must match: up to the first step where llama.cpp's own top-1 and
/// top-2 are closer than `tol` (a near-tie that rounding may legitimately flip).
fn comparable_prefix(row: &Value, tol: f64) -> usize {
    let top = row["top"].as_array().unwrap();
    top.iter()
        .position(|step| {
            let p = |i: usize| step[i][1].as_f64().unwrap();
            p(0) - p(1) < tol
        })
        .unwrap_or(top.len())
}

/// Free-running greedy `run --prompt-ids ... --json` against llama.cpp's tokens. Returns how
/// many prompts match up to the first near-tie (the golden README's rule), how many match in
/// full, and the number of prompts.
fn check_greedy(model: &str, rows: &[Value], tol: f64, extra: &[&str]) -> (usize, usize, usize) {
    let (mut matched, mut full) = (0, 0);
    for row in rows {
        let want: Vec<u64> = row["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        let n = want.len().to_string();
        let prompt = ids_arg(&row["prompt_ids"]);
        let mut args = vec![
            "run",
            "-m",
            model,
            "--prompt-ids",
            &prompt,
            "-n",
            &n,
            "--temperature",
            "0",
            "--json",
        ];
        args.extend_from_slice(extra);
        let out = ok_stdout(&args);
        let j: Value = serde_json::from_str(&out).unwrap();
        let got: Vec<u64> = j["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        let k = comparable_prefix(row, tol).min(want.len());
        if got.len() >= k && got[..k] == want[..k] {
            matched += 1;
        } else {
            eprintln!("{model} {}: want {:?} got {:?} (compare {k})", row["name"], want, got);
        }
        if got == want {
            full += 1;
        }
        assert!(j["timings"]["decode_tok_s"].as_f64().unwrap() >= 0.0);
    }
    (matched, full, rows.len())
}

#[test]
fn greedy_run_matches_llama_cpp_on_fixtures() {
    for file in ["llama.F16", "llama.Q8_0", "qwen2.Q8_0", "qwen3.Q4_K_M", "gemma3.F16"] {
        let model = golden(&format!("fixtures/{file}.gguf"));
        let rows = jsonl(&format!("fixtures/{file}.golden.jsonl"));
        let (ok, _, total) = check_greedy(model.to_str().unwrap(), &rows, 0.01, &[]);
        assert_eq!(
            ok, total,
            "{file}: {ok}/{total} prompts reproduce llama.cpp's greedy tokens"
        );
    }
}

/// `--cache-type q8_0` reaches the engine: greedy tokens of llama.cpp's f16-cache goldens up to
/// the first step nearer than the quantized tolerance (5.5e-2, Q8_0 weights with a q8_0 cache:
/// `kv_tolerance` in tests/common/generation.rs).
#[test]
fn greedy_run_with_q8_0_cache_matches_llama_cpp_on_fixtures() {
    for file in ["llama.F16", "qwen3.F16", "gemma3.Q8_0"] {
        let model = golden(&format!("fixtures/{file}.gguf"));
        let rows = jsonl(&format!("fixtures/{file}.golden.jsonl"));
        let (ok, _, total) = check_greedy(model.to_str().unwrap(), &rows, 0.055, &["--cache-type", "q8_0"]);
        assert_eq!(
            ok, total,
            "{file}: {ok}/{total} prompts reproduce llama.cpp's greedy tokens"
        );
    }
}

#[test]
fn run_json_reports_logprobs_and_timings() {
    let model = golden("fixtures/llama.F16.gguf");
    let row = &jsonl("fixtures/llama.F16.golden.jsonl")[0];
    let prompt = ids_arg(&row["prompt_ids"]);
    let out = ok_stdout(&[
        "run",
        "-m",
        model.to_str().unwrap(),
        "--prompt-ids",
        &prompt,
        "-n",
        "4",
        "--temperature",
        "0",
        "--top-logprobs",
        "5",
        "--json",
        "--threads",
        "1",
    ]);
    let j: Value = serde_json::from_str(&out).unwrap();
    let top = j["top_logprobs"].as_array().unwrap();
    assert_eq!(top.len(), 4);
    for (step, alts) in top.iter().enumerate() {
        let alts = alts.as_array().unwrap();
        assert_eq!(alts.len(), 5);
        // Our probabilities against llama.cpp's for the same ids (F16 tolerance 5e-3).
        for (i, alt) in alts.iter().enumerate() {
            let (id, lp) = (alt[0].as_u64().unwrap(), alt[1].as_f64().unwrap());
            let golden = &row["top"][step][i];
            assert_eq!(id, golden[0].as_u64().unwrap(), "step {step} rank {i}");
            assert!(
                (lp.exp() - golden[1].as_f64().unwrap()).abs() < 5e-3,
                "step {step} rank {i}"
            );
        }
    }
    assert_eq!(
        j["timings"]["prompt_tokens"],
        row["prompt_ids"].as_array().unwrap().len()
    );
    assert_eq!(j["timings"]["threads"], 1);
}

#[test]
fn greedy_is_identical_for_one_and_two_threads() {
    let model = golden("fixtures/qwen2.Q4_K_M.gguf");
    let row = &jsonl("fixtures/qwen2.Q4_K_M.golden.jsonl")[1];
    let prompt = ids_arg(&row["prompt_ids"]);
    let run = |threads: &str| {
        let out = ok_stdout(&[
            "run",
            "-m",
            model.to_str().unwrap(),
            "--prompt-ids",
            &prompt,
            "-n",
            "16",
            "--temperature",
            "0",
            "--json",
            "--top-logprobs",
            "3",
            "--threads",
            threads,
        ]);
        let j: Value = serde_json::from_str(&out).unwrap();
        (j["tokens"].clone(), j["top_logprobs"].clone())
    };
    assert_eq!(run("1"), run("2"));
}

#[test]
fn seeded_sampling_is_reproducible() {
    let model = golden("fixtures/llama.Q8_0.gguf");
    let m = model.to_str().unwrap();
    let args = |seed: &'static str| {
        [
            "run",
            "-m",
            m,
            "--raw",
            "the cat",
            "-n",
            "12",
            "--temperature",
            "1.0",
            "--seed",
            seed,
            "--json",
        ]
    };
    let a = ok_stdout(&args("7"));
    let b = ok_stdout(&args("7"));
    let tokens = |s: &str| serde_json::from_str::<Value>(s).unwrap()["tokens"].clone();
    assert_eq!(tokens(&a), tokens(&b));
    let others: Vec<Value> = ["8", "9", "10"].iter().map(|s| tokens(&ok_stdout(&args(s)))).collect();
    assert!(
        others.iter().any(|t| *t != tokens(&a)),
        "different seeds never changed the sample"
    );
}

#[test]
fn chat_reset_repeats_the_first_answer() {
    let model = golden("fixtures/qwen3.F16.gguf");
    let mut child = Command::new(env!("CARGO_BIN_EXE_tinyllm-native"))
        .args(["chat", "-m", model.to_str().unwrap(), "--temperature", "0", "-n", "8"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"the cat sat\nand then\n/reset\nthe cat sat\n/exit\nnever read\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let answers: Vec<&str> = stdout.lines().collect();
    assert_eq!(answers.len(), 3, "{stdout:?}");
    assert_eq!(
        answers[0], answers[2],
        "after /reset the same message gets the same greedy answer"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("reset"));
}

/// Regression (issue #16, "chat's type-ahead"): a line typed into the terminal while `chat`
/// still starts reached the line editor as its first character only (rustyline 17 waited on
/// the terminal while the rest sat in its own buffer). Here a terminal (a pty, driven by
/// Python's `pty`) gets the whole line at once, before the editor is up: the editor must show
/// the whole line and the model must answer it.
#[test]
fn chat_type_ahead_reaches_the_editor_whole() {
    let model = golden("fixtures/qwen3.F16.gguf");
    let script = r#"
import os, pty, select, sys, time
pid, fd = pty.fork()
if pid == 0:
    # The terminal the editor talks to, whatever the caller's: under TERM=dumb (CI shells)
    # rustyline reads a line without echoing it.
    os.environ["TERM"] = "xterm-256color"
    os.execv(sys.argv[1], [sys.argv[1], "chat", "-m", sys.argv[2], "--temperature", "0", "-n", "4"])
os.write(fd, b"the cat sat on the mat\r")
out, deadline = b"", time.time() + 60
while time.time() < deadline and b"generated" not in out:
    r, _, _ = select.select([fd], [], [], 0.5)
    if r:
        try:
            out += os.read(fd, 4096)
        except OSError:
            break
os.write(fd, b"/exit\r")
time.sleep(0.5)
sys.stdout.write(out.decode(errors="replace"))
"#;
    let out = Command::new("python3")
        .args([
            "-c",
            script,
            env!("CARGO_BIN_EXE_tinyllm-native"),
            model.to_str().unwrap(),
        ])
        .output()
        .expect("python3 runs");
    // The editor's output without its terminal escape sequences (`ESC [ ... final byte`) and
    // carriage returns (it redraws the line from its start).
    let raw = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut screen = String::new();
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.next() == Some('[') {
                for f in chars.by_ref() {
                    if ('@'..='~').contains(&f) {
                        break;
                    }
                }
            }
        } else if c != '\r' {
            screen.push(c);
        }
    }
    assert!(
        screen.contains("> the cat sat on the mat"),
        "the editor did not get the whole line:\n{screen}"
    );
    assert!(screen.contains("generated"), "no answer to the typed line:\n{screen}");
}

#[test]
fn bad_run_input_exits_2() {
    let model = golden("fixtures/llama.F16.gguf");
    let m = model.to_str().unwrap();
    let e = input_error(&["run", "-m", m, "--prompt-ids", "1,2,384"]);
    assert!(e.contains("384") && e.contains("vocabulary"), "{e}");
    let e = input_error(&["run", "-m", m, "--prompt-ids", "1,x"]);
    assert!(e.contains("'x'"), "{e}");
    let e = input_error(&["run", "-m", m, "--raw", "hi", "-n", "0"]);
    assert!(e.contains("-n"), "{e}");
    let e = input_error(&["run", "-m", m, "--raw", "hi", "-n", "-3"]);
    assert!(e.contains("-n"), "{e}");
    let e = input_error(&["run", "-m", m, "--raw", "hi", "--temperature", "-1"]);
    assert!(e.contains("temperature"), "{e}");
    let e = input_error(&["run", "-m", m, "--raw", "hi", "--top-p", "1.5"]);
    assert!(e.contains("top_p") || e.contains("top-p"), "{e}");
    let long = "word ".repeat(200);
    let e = input_error(&["run", "-m", m, "--raw", &long, "--ctx", "64"]);
    assert!(e.contains("context"), "{e}");
    let e = input_error(&["run", "-m", m, "--raw", "hi", "--threads", "0"]);
    assert!(e.contains("--threads"), "{e}");
    let e = input_error(&["run", "-m", m, "--raw", "hi", "--backend", "cuda"]);
    assert!(e.contains("cuda") && e.contains("cpu") && e.contains("vulkan"), "{e}");
    let e = input_error(&["run", "-m", m, "--raw", "hi", "--cache-type", "q4_0"]);
    assert!(
        e.contains("--cache-type") && e.contains("q4_0") && e.contains("f16") && e.contains("q8_0"),
        "{e}"
    );
    let e = input_error(&["run", "-m", m, "--raw", "hi", "--cache-type", "f16,q8_0"]);
    assert!(e.contains("--cache-type"), "{e}");
    let e = input_error(&["run", "-m", "/nonexistent/x.gguf", "hi"]);
    assert!(e.contains("/nonexistent/x.gguf"), "{e}");

    // A well-formed file of an architecture we do not run.
    let dir = tempfile::tempdir().unwrap();
    let mut w = GgufWriter::new();
    w.kv_str("general.architecture", "mamba");
    w.tensor("token_embd.weight", &[4, 4], 0, 64);
    let path = dir.path().join("mamba.gguf");
    std::fs::write(&path, w.finish()).unwrap();
    let e = input_error(&["run", "-m", path.to_str().unwrap(), "--prompt-ids", "1"]);
    assert!(
        e.contains("mamba") && e.contains("llama") && e.contains("gemma3"),
        "{e}"
    );
}

#[test]
fn greedy_run_matches_llama_cpp_on_real_models() {
    for (file, golden_name) in [
        ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "qwen2.5-coder-0.5b"),
        ("gemma-3-270m-q4_k_m.gguf", "gemma-3-270m"),
    ] {
        let path = real_model(file);
        let rows = jsonl(&format!("generate/{golden_name}.jsonl"));
        // 0.1 is the golden README's tolerance for the real Q4_K_M models: llama.cpp's own
        // flash-attention on/off runs disagree by up to 0.16 and flip greedy tokens at gaps
        // below it (gemma `code_py_200` even at a gap of 0.14).
        let (ok, full, total) = check_greedy(path.to_str().unwrap(), &rows, 0.1, &[]);
        eprintln!("{golden_name}: {ok}/{total} prompts reproduce llama.cpp's greedy tokens up to the first near-tie, {full}/{total} in full");
        assert!(
            ok + 1 >= total,
            "{golden_name}: only {ok}/{total} prompts reproduce llama.cpp's greedy tokens"
        );
    }
}
