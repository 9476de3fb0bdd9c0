//! Two `tinyllm-native serve` replicas behind nginx (Debian's package), on loopback: the
//! deployment `docs/deploy.md` describes, tested with real parts. nginx hashes on the
//! `X-Session-Id` header, so a conversation's turns reach the replica that holds its prefix,
//! and passes a request on to the other replica when one answers 503 or refuses the
//! connection (`proxy_next_upstream ... http_503 non_idempotent`). The official `openai`
//! client (`replicas/client.py`, no client retries) drives it; one replica is sent SIGTERM
//! while four streams run. Needs nginx and python3 with `openai`
//! (scripts/setup-test-deps.sh): the test fails, rather than skips, without them.

#[path = "../../tests/common/mod.rs"]
mod common;
mod serve_support;

use common::golden;
use serde_json::Value;
use serve_support::{Server, FIXTURE};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// nginx in front of `upstreams`, listening on `port`, everything under `dir`.
fn nginx_conf(dir: &Path, port: u16, upstreams: &[&str]) -> String {
    let d = dir.display();
    let servers: String = upstreams
        .iter()
        .map(|u| format!("    server {u} max_fails=1 fail_timeout=30s;\n"))
        .collect();
    format!(
        "worker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log;\ndaemon off;\n\
         events {{ worker_connections 256; }}\n\
         http {{\n  access_log {d}/access.log;\n\
           client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
           fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
           upstream tinyllm {{\n    hash $http_x_session_id consistent;\n{servers}    keepalive 8;\n  }}\n\
           server {{\n    listen 127.0.0.1:{port};\n    location / {{\n\
               proxy_pass http://tinyllm;\n      proxy_http_version 1.1;\n\
               proxy_set_header Connection \"\";\n      proxy_buffering off;\n\
               proxy_read_timeout 600s;\n\
               proxy_next_upstream error timeout http_503 non_idempotent;\n\
               proxy_next_upstream_tries 2;\n    }}\n  }}\n}}\n"
    )
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn two_replicas_behind_nginx_keep_sessions_and_drain_without_losing_requests() {
    let nginx = ["/usr/sbin/nginx", "/usr/bin/nginx"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("nginx is missing: run scripts/setup-test-deps.sh (apt-get install nginx-light)");
    let args = ["--threads", "1", "--parallel", "2", "--drain-timeout", "60"];
    // Slowed passes: the drain's streams are certainly running when the signal lands.
    let mut replicas = [
        Server::start_with_env(&golden(FIXTURE), &args, &Server::SLOW_STEPS),
        Server::start_with_env(&golden(FIXTURE), &args, &Server::SLOW_STEPS),
    ];
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let conf = dir.path().join("nginx.conf");
    std::fs::write(
        &conf,
        nginx_conf(dir.path(), port, &[&replicas[0].addr, &replicas[1].addr]),
    )
    .unwrap();
    let mut proxy = Command::new(nginx)
        .arg("-c")
        .arg(&conf)
        .arg("-p")
        .arg(dir.path())
        .arg("-e")
        .arg(dir.path().join("error.log"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start nginx");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(st)) = proxy.try_wait() {
            let log = std::fs::read_to_string(dir.path().join("error.log")).unwrap_or_default();
            panic!("nginx exited ({st}):\n{log}");
        }
        assert!(Instant::now() < deadline, "nginx did not listen on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/replicas/client.py");
    let mut cmd = Command::new("python3");
    cmd.arg(script)
        .args(["--proxy", &format!("http://127.0.0.1:{port}/v1")]);
    for r in &replicas {
        cmd.args(["--replica", &format!("{},{}", r.url(), r.pid())]);
    }
    let common::Finished { status, stdout, stderr } = common::run_with_limit(cmd, Duration::from_secs(600));
    // SIGTERM: nginx's master stops its workers too (SIGKILL would orphan them).
    let _ = Command::new("kill").args(["-TERM", &proxy.id().to_string()]).status();
    let _ = proxy.wait();
    let logs = || {
        format!(
            "--- stderr\n{stderr}--- replica 0\n{}--- replica 1\n{}--- nginx\n{}",
            replicas[0].log(),
            replicas[1].log(),
            std::fs::read_to_string(dir.path().join("error.log")).unwrap_or_default()
        )
    };
    assert!(status.is_some_and(|s| s.success()), "client.py failed\n{}", logs());
    let report: Value =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("bad report ({e}): {stdout}\n{}", logs()));

    // Session affinity: both turns of a conversation on one replica, the second reusing the
    // first's prefix; and the conversations spread over both replicas.
    let turns = report["second_turns"].as_array().unwrap();
    let mut used = [0; 2];
    let mut cached = Vec::new();
    for t in turns {
        let r = &t["replicas"];
        assert_eq!(r[0], r[1], "a conversation moved between replicas: {t}");
        used[r[0].as_u64().unwrap() as usize] += 1;
        let c = t["cached_tokens"][1].as_u64().unwrap();
        assert!(c > 0, "second turn without cached tokens: {t}");
        cached.push(c);
    }
    assert!(
        used[0] > 0 && used[1] > 0,
        "all conversations hashed to one replica: {used:?}"
    );

    // Drain: the streams all finished; every late request completed.
    let drain = &report["drain"];
    let victim = drain["victim"].as_u64().unwrap() as usize;
    let busy = drain["busy_at_sigterm"][victim].as_f64().unwrap();
    assert!(busy >= 1.0, "the streams had ended before the signal: {drain}");
    let streams = drain["streams"].as_array().unwrap();
    for s in streams {
        assert!(
            s["error"].is_null() && !s["finish_reason"].is_null(),
            "a stream did not finish: {s}\n{}",
            logs()
        );
    }
    let late = drain["late"].as_array().unwrap();
    let completed = late.iter().filter(|l| l["ok"] == true).count();
    assert_eq!(completed, late.len(), "late requests lost: {late:?}\n{}", logs());
    let all_logs = logs();
    let st = replicas[victim]
        .wait_exit(Duration::from_secs(60))
        .expect("the drained replica did not exit");
    assert!(st.success(), "the drained replica exited with {st}\n{all_logs}");
    let drained_log = replicas[victim].wait_log("drained: exiting");
    assert!(drained_log.contains("draining:"), "{drained_log}");
    eprintln!(
        "nginx: {} conversations (replicas {used:?}), second-turn cached tokens {cached:?}; \
         drain: SIGTERM to replica {victim} with requests in flight {}, {} streams finished ({:?} chunks), \
         {completed}/{} requests sent during/after the drain completed, replica exited 0",
        turns.len(),
        drain["busy_at_sigterm"],
        streams.len(),
        streams
            .iter()
            .map(|s| s["chunks"].as_u64().unwrap_or(0))
            .collect::<Vec<_>>(),
        late.len(),
    );
}
