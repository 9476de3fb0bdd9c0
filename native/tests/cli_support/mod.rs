//! Running the `tinyllm-native` binary from the CLI tests: capture its output, demand success
//! or an input error (exit 2, no panic), and read golden JSONL files.
#![allow(dead_code)]

use serde_json::Value;
use std::process::{Command, Output};

pub fn tinyllm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tinyllm-native"))
        .args(args)
        .output()
        .expect("run tinyllm-native")
}

/// Stdout of a command that must succeed.
pub fn ok_stdout(args: &[&str]) -> String {
    let out = tinyllm(args);
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 stdout")
}

/// Runs a command that must fail with exit code 2 and returns its error message.
pub fn input_error(args: &[&str]) -> String {
    let out = tinyllm(args);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{args:?}: expected exit 2, stderr: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    stderr
}

/// One JSON value per line of a golden file (`tests/golden/REL`).
pub fn jsonl(rel: &str) -> Vec<Value> {
    std::fs::read_to_string(crate::common::golden(rel))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}
