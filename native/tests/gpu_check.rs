//! `scripts/gpu-check.sh --dry-run` on lavapipe: the script a machine with a GPU runs, run here
//! at toy sizes with the binaries this test run built, so it is known to work (every step ok,
//! every file it writes parses with its report's shape) before a GPU is at hand.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn read_json(dir: &Path, name: &str) -> Value {
    let p = dir.join(name);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{} was not written: {e}", p.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON ({e}): {text}", p.display()))
}

#[test]
fn the_gpu_check_runs_dry_on_lavapipe() {
    if common::device_or_skip(tinyllm::backend::vulkan::VulkanBackend::new).is_none() {
        return;
    }
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_tinyllm-native"));
    // The golden suites the script runs are this run's: the same target directory, so cargo
    // finds them built.
    let target = bin
        .parent()
        .and_then(Path::parent)
        .expect("target/release/tinyllm-native");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = tempfile::tempdir().expect("temp dir");
    let run = Command::new(root.join("scripts/gpu-check.sh"))
        .arg(out.path())
        .arg("--dry-run")
        .env("TINYLLM_BIN", &bin)
        .env("CARGO_TARGET_DIR", target)
        .output()
        .expect("run scripts/gpu-check.sh");
    let log = std::fs::read_to_string(out.path().join("log.txt")).unwrap_or_default();
    assert!(
        run.status.success(),
        "gpu-check failed: {}\n--- log ---\n{log}",
        String::from_utf8_lossy(&run.stderr)
    );
    let summary = read_json(out.path(), "summary.json");
    assert_eq!(summary["dry_run"], Value::Bool(true));
    let steps = summary["steps"].as_array().expect("steps");
    let names: Vec<&str> = steps.iter().filter_map(|s| s["step"].as_str()).collect();
    for want in [
        "build",
        "models",
        "gpus",
        "goldens",
        "bench-gemma3-270m-cpu",
        "bench-gemma3-270m-webgpu",
        "bench-gemma3-270m-vulkan",
        "depth-gemma3-270m-vulkan",
        "startup-gemma3-270m",
        "profile-gemma3-270m",
    ] {
        assert!(names.contains(&want), "no step {want} in {names:?}");
    }
    for s in steps {
        assert_eq!(s["status"], "ok", "step {s} did not pass\n--- log ---\n{log}");
    }

    let gpus = read_json(out.path(), "gpus.json");
    assert!(gpus.is_object() || gpus.is_array(), "gpus.json: {gpus}");
    let goldens = read_json(out.path(), "goldens.json");
    let suites = goldens.as_array().expect("goldens.json lists the suites");
    assert_eq!(suites.len(), 2, "{goldens}");
    for s in suites {
        assert!(s["passed"].as_u64().unwrap_or(0) >= 1, "no golden ran: {s}");
        assert_eq!(s["failed"].as_u64(), Some(0), "{s}");
    }
    for backend in ["cpu", "webgpu", "vulkan"] {
        for kind in ["bench", "depth"] {
            let j = read_json(out.path(), &format!("{kind}-gemma3-270m-{backend}.json"));
            assert_eq!(j["backend"].as_str(), Some(backend), "{kind} {backend}: {j}");
            let rows = j["results"].as_array().expect("results");
            assert!(!rows.is_empty(), "{kind} {backend}: no results");
            assert!(rows[0]["decode_tok_s"].as_f64().is_some_and(|v| v > 0.0), "{j}");
        }
    }
    let startup = read_json(out.path(), "startup-gemma3-270m.json");
    let starts = startup["vulkan_cold_and_warm_starts"]
        .as_array()
        .expect("cold and warm starts");
    assert_eq!(starts.len(), 2, "{startup}");
    let profile = read_json(out.path(), "profile-gemma3-270m.json");
    let kernels = profile["profile"].as_array().expect("profile");
    assert!(
        kernels
            .iter()
            .any(|k| k["kernel"].as_str().is_some_and(|n| n.contains("matmul"))),
        "the per-kernel profile names no matmul: {profile}"
    );
}
