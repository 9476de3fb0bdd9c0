//! The chat page at `/` in a real browser: headless Chromium, driven by playwright-core from
//! `tests/browser/chat_page.mjs`, against `tinyllm-native serve` on the golden qwen2 fixture
//! (with tests/common's thinking template). The script sends messages through the page,
//! compares the streamed answers with the API's, stops one, folds reasoning and checks its
//! screenshots (kept in `$CARGO_TARGET_TMPDIR/chat-page/`). web/tests/browser.rs runs the same
//! script on the npm package's build of the page.
//! Needs `/usr/bin/chromium` and `npm ci` in `tests/browser/` (`.ci/run` installs both); the
//! test fails, rather than skips, without them.

#[path = "../../tests/common/mod.rs"]
mod common;
mod serve_support;

use serve_support::Server;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const TIME_LIMIT: Duration = Duration::from_secs(240);

fn chromium() -> PathBuf {
    std::env::var_os("CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"))
}

#[test]
fn chat_page_streams_the_same_answer_as_the_api() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser");
    assert!(
        chromium().is_file(),
        "{} is missing: `apt-get install chromium` (or set CHROMIUM), as .ci/run does",
        chromium().display()
    );
    assert!(
        dir.join("node_modules/playwright-core").is_dir(),
        "playwright-core is missing: run `npm ci` in {}, as .ci/run does",
        dir.display()
    );

    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("thinking.gguf");
    std::fs::write(&model, common::gguf_write::thinking_fixture()).unwrap();
    let s = Server::start(&model, &["--parallel", "2", "--threads", "2"]);
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("chat-page");
    std::fs::create_dir_all(&shots).unwrap();
    let mut cmd = Command::new("node");
    cmd.arg(dir.join("chat_page.mjs"))
        .arg(s.url())
        .arg(shots.join("serve"))
        .env("CHROMIUM", chromium());
    let common::Finished {
        status,
        stdout: out,
        stderr: err,
    } = common::run_with_limit(cmd, TIME_LIMIT);
    let report = format!("--- stdout\n{out}--- stderr\n{err}--- server log\n{}", s.log());
    match status {
        None => panic!("chat_page.mjs ran past {TIME_LIMIT:?}\n{report}"),
        Some(st) => assert!(st.success(), "chat_page.mjs failed ({st})\n{report}"),
    }
    assert!(out.contains("chat page: ok") && out.contains("over http"), "{report}");
    eprintln!("{out}");
}
