//! OpenCode (the `opencode-ai` npm package, pinned in `tests/opencode/package.json`) as a client
//! of `tinyllm-native serve` on the real Qwen2.5-Coder 0.5B: `tests/opencode/run_scenario.py`
//! runs `opencode run --format json` in a throwaway project whose only provider is the server
//! (`@ai-sdk/openai-compatible`), once asking it to read a file (the Read tool must run and
//! return the file's content) and once to run a shell command (the run must complete cleanly;
//! the model does not reliably reach the bash tool, see the test). Whether the file's marker reached the
//! final answer is printed, not asserted: the 0.5B model often fumbles it.
//! OpenCode sends a ~7,200-token prompt (system prompt and ten tool schemas), so each scenario
//! takes minutes on a CPU: full tier only. Needs `npm ci` in `tests/opencode/`
//! (scripts/setup-test-deps.sh), python3 and the model; without one of them the test is
//! recorded as skipped (never as passed). No network: see run_scenario.py.

#[path = "../../tests/common/mod.rs"]
mod common;
mod serve_support;

use serde_json::Value;
use serve_support::Server;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const MODEL: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
/// run_scenario.py's own limit for one `opencode run`; the test waits a minute longer.
const SCENARIO_LIMIT: Duration = Duration::from_secs(900);

fn run_scenario(server: &Server, scenario: &str, work: &Path) -> Value {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/opencode");
    let mut cmd = Command::new("python3");
    cmd.arg(dir.join("run_scenario.py"))
        .args(["--base-url", &format!("http://{}/v1", server.addr)])
        .args(["--scenario", scenario])
        .arg("--work-dir")
        .arg(work)
        .args(["--timeout", &SCENARIO_LIMIT.as_secs().to_string()]);
    let common::Finished { status, stdout, stderr } =
        common::run_with_limit(cmd, SCENARIO_LIMIT + Duration::from_secs(60));
    let report = format!(
        "--- stdout\n{stdout}--- stderr\n{stderr}--- server log\n{}",
        server.log()
    );
    match status {
        None => panic!("run_scenario.py {scenario} ran past its limit\n{report}"),
        Some(st) => assert!(st.success(), "run_scenario.py {scenario} failed ({st})\n{report}"),
    }
    let v: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("bad report ({e})\n{report}"));
    eprintln!(
        "opencode {scenario}: tools {} (executed: {}), marker in the final answer: {}, {} s\nfinal answer: {:?}",
        v["tool_names"], v["tool_called"], v["marker_in_answer"], v["seconds"], v["final_text"]
    );
    v
}

/// Full tier only: minutes of a 7,200-token prompt on the CPU. The fast tier covers the same
/// server paths with the Python client's tool-call and streaming tests (server.rs).
#[test]
fn opencode_read_tool_returns_the_file_and_a_shell_prompt_completes_cleanly() {
    if !common::full_tier("the server's tool-call tests through the OpenAI client (server.rs)") {
        return;
    }
    let model = common::models_dir().join(MODEL);
    if !model.is_file() {
        common::skip(&format_args!(
            "{} is missing (scripts/fetch-models.sh)",
            model.display()
        ));
        return;
    }
    let opencode = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/opencode/node_modules/.bin/opencode");
    if !opencode.exists() {
        common::skip(&format_args!(
            "{} is missing: run scripts/setup-test-deps.sh (npm ci in tests/opencode)",
            opencode.display()
        ));
        return;
    }
    if Command::new("python3").arg("--version").output().is_err() {
        common::skip(&"python3 is missing (scripts/setup-test-deps.sh)");
        return;
    }
    // OpenCode's prompt alone is ~7,200 tokens: the default 4,096-token context is too small.
    let server = Server::start(&model, &["--threads", "2", "--parallel", "1", "--ctx", "32768"]);
    let work = tempfile::tempdir().unwrap();

    // The Read tool must have run and returned the file: its output holds the marker written
    // into the file (a call with a wrong path returns an error and does not count).
    let read = run_scenario(&server, "read", work.path());
    assert_eq!(read["timed_out"], false, "{read:#}");
    assert_eq!(
        read["tool_returned_file"],
        true,
        "OpenCode's Read tool did not return the file's content:\n{read:#}\n{}",
        server.log()
    );

    // The shell scenario: before calls were held to declared names, the 0.5B model answered it
    // with a tool it made up (`{"name": "cat", ...}`) or a bash call whose arguments were not
    // JSON in every run measured (0 of 10); with the lazy grammar bash ran in 2 of 3 (the third
    // read the file with `read` instead). Not reliable enough to assert, so what is asserted is
    // what the name says, what the server owes OpenCode: the run completes, no timeout, no
    // provider error. Whether bash ran is printed.
    let shell = run_scenario(&server, "shell", work.path());
    assert_eq!(shell["timed_out"], false, "{shell:#}");
    assert_eq!(shell["exit_code"], 0, "{shell:#}\n{}", server.log());
    assert_eq!(shell["errors"].as_array().map(Vec::len), Some(0), "{shell:#}");
}
