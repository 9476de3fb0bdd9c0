//! A `tinyllm-native serve` child process for the browser and load tests, and just enough
//! HTTP/1.1 over `TcpStream` to talk to it: the tests see every byte a client would.
#![allow(dead_code)]

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The tiny golden fixture model (fast enough for many requests).
pub const FIXTURE: &str = "fixtures/qwen2.Q8_0.gguf";

/// A running server on an ephemeral loopback port; killed on drop. Its stderr (the request
/// log) is collected for failure messages.
pub struct Server {
    child: Child,
    pub addr: String,
    log: Arc<Mutex<String>>,
}

impl Server {
    /// Start the server and wait until it is ready (model loaded and warm).
    pub fn start(model: &Path, extra: &[&str]) -> Server {
        Self::start_with_env(model, extra, &[])
    }

    /// [`Server::start`] with `env` set.
    pub fn start_with_env(model: &Path, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let mut server = Self::spawn(model, extra, env);
        server.wait_ready();
        server
    }

    /// The environment that slows every engine pass by 5 ms (a test hook of the server), so
    /// a stream of a few hundred tokens is certainly still running when a test signals.
    pub const SLOW_STEPS: [(&'static str, &'static str); 1] = [("TINYLLM_TEST_STEP_DELAY_MS", "5")];

    /// Start the server with `env` set; return once it listens (it may still be loading).
    pub fn spawn(model: &Path, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tinyllm-native"))
            .args(["serve", "-m"])
            .arg(model)
            .args(["--host", "127.0.0.1", "--port", "0"])
            .args(extra)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start tinyllm-native serve");
        let log = Arc::new(Mutex::new(String::new()));
        let stderr = child.stderr.take().expect("piped stderr");
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut l = sink.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut line = String::new();
        let _ = stdout.read_line(&mut line);
        let Some(addr) = line.trim().split("listening on http://").nth(1) else {
            let _ = child.kill();
            let _ = child.wait();
            std::thread::sleep(Duration::from_millis(200));
            panic!("server did not start: {line:?}\n{}", log.lock().unwrap());
        };
        Server {
            addr: addr.to_string(),
            child,
            log,
        }
    }

    /// Send SIGTERM (a drain).
    pub fn terminate(&self) {
        let st = Command::new("kill").args(["-TERM", &self.pid().to_string()]).status();
        assert!(st.is_ok_and(|s| s.success()), "kill -TERM failed");
    }

    /// The exit status once the process ends, or `None` after `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The server listens before its model is loaded: wait for `GET /ready` to answer 200.
    pub fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                std::thread::sleep(Duration::from_millis(200));
                panic!("server exited ({st}) before it was ready\n{}", self.log());
            }
            if self.request("GET", "/ready", &[], b"").status == 200 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "server not ready after 300 s\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// The server's stderr once it holds `needle` (a reader thread collects it, so a line
    /// written before a response may arrive after it); the log so far after 10 s without.
    pub fn wait_log(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let log = self.log();
            if log.contains(needle) || Instant::now() > deadline {
                return log;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Resident memory of the server process, from `/proc/PID/status` (`VmRSS`, in kB).
    pub fn rss_kb(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).expect("read /proc/PID/status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no VmRSS in /proc/{}/status:\n{status}", self.pid()))
    }

    /// Open a connection and send one request with `Connection: close` and these headers;
    /// the caller reads the answer (see [`read_head`], [`read_chunk`]).
    pub fn send(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> BufReader<TcpStream> {
        let mut s = TcpStream::connect(&self.addr).expect("connect to the server");
        s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n",
            self.addr,
            body.len()
        );
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(body).unwrap();
        BufReader::new(s)
    }

    /// One request; the whole answer (a chunked body is de-chunked).
    pub fn request(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Response {
        let mut conn = self.send(method, path, headers, body);
        let (status, head) = read_head(&mut conn);
        let mut body = Vec::new();
        if head.contains("transfer-encoding: chunked") {
            while let Some(c) = read_chunk(&mut conn) {
                body.extend(c);
            }
        } else {
            conn.read_to_end(&mut body).unwrap();
        }
        Response { status, head, body }
    }

    /// POST a JSON body.
    pub fn post(&self, path: &str, body: &Value) -> Response {
        self.request(
            "POST",
            path,
            &[("Content-Type", "application/json")],
            body.to_string().as_bytes(),
        )
    }

    /// POST and expect 200 with a JSON body.
    pub fn ok(&self, path: &str, body: &Value) -> Value {
        let r = self.post(path, body);
        assert_eq!(r.status, 200, "{path} {body}: {}", r.text());
        r.json()
    }

    /// A streaming POST: the `data:` payloads in order, read until `[DONE]`.
    pub fn stream(&self, path: &str, body: &Value) -> Vec<String> {
        let mut sse = self.open_stream(path, body);
        let mut out = Vec::new();
        while let Some(d) = sse.next_data() {
            let done = d == "[DONE]";
            out.push(d);
            if done {
                break;
            }
        }
        out
    }

    /// Start a streaming POST and check it answers 200 with an event stream.
    pub fn open_stream(&self, path: &str, body: &Value) -> Sse {
        let mut conn = self.send(
            "POST",
            path,
            &[("Content-Type", "application/json")],
            body.to_string().as_bytes(),
        );
        let (status, head) = read_head(&mut conn);
        assert_eq!(status, 200, "{head}");
        assert!(head.contains("content-type: text/event-stream"), "{head}");
        Sse {
            conn,
            buf: String::new(),
        }
    }

    /// A value from `/metrics` (Prometheus text), summed over its series (one per model).
    pub fn metric(&self, name: &str) -> f64 {
        self.metrics(&[name])[0]
    }

    /// Several values from one read of `/metrics` (consistent with each other), each summed
    /// over its series.
    pub fn metrics(&self, names: &[&str]) -> Vec<f64> {
        let text = self.request("GET", "/metrics", &[], b"").text();
        names
            .iter()
            .map(|name| {
                let values: Vec<f64> = series(&text, name, None).collect();
                assert!(!values.is_empty(), "no {name} in /metrics:\n{text}");
                values.iter().sum()
            })
            .collect()
    }

    /// A value from `/metrics` for one model (its series labelled `model="..."`).
    pub fn model_metric(&self, name: &str, model: &str) -> f64 {
        let text = self.request("GET", "/metrics", &[], b"").text();
        let value = series(&text, name, Some(model)).next();
        value.unwrap_or_else(|| panic!("no {name} of model {model} in /metrics:\n{text}"))
    }
}

/// The values of metric `name`'s series in a Prometheus text (only model `model`'s, if given).
fn series<'t>(text: &'t str, name: &'t str, model: Option<&'t str>) -> impl Iterator<Item = f64> + 't {
    text.lines().filter_map(move |l| {
        let rest = l.strip_prefix(name)?;
        let (labels, value) = match rest.strip_prefix('{') {
            Some(r) => r.split_once("} ")?,
            None => ("", rest.strip_prefix(' ')?),
        };
        if let Some(m) = model {
            if !labels.split(',').any(|kv| kv == format!("model=\"{m}\"")) {
                return None;
            }
        }
        value.trim().parse().ok()
    })
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Response {
    pub status: u16,
    /// Status line and headers, lower-cased.
    pub head: String,
    pub body: Vec<u8>,
}

impl Response {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    /// A response header's value (name in lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    }

    /// An OpenAI error object with this status; returns `error`.
    pub fn error(&self, status: u16) -> Value {
        assert_eq!(self.status, status, "{}", self.text());
        let v = self.json();
        let e = v["error"].clone();
        for k in ["message", "type", "param", "code"] {
            assert!(e.get(k).is_some(), "error object without {k}: {v}");
        }
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()));
        e
    }

    /// The `data:` payloads of an SSE body, in order.
    pub fn sse_data(&self) -> Vec<String> {
        self.text()
            .split("\n\n")
            .filter_map(|event| {
                let data: Vec<&str> = event.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
                (!data.is_empty()).then(|| data.join("\n"))
            })
            .collect()
    }
}

/// Status line and headers (lower-cased).
pub fn read_head(conn: &mut BufReader<TcpStream>) -> (u16, String) {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if conn.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        head.push_str(&line.to_ascii_lowercase());
    }
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, head)
}

/// One chunk of a chunked body; `None` at the end.
pub fn read_chunk(conn: &mut BufReader<TcpStream>) -> Option<Vec<u8>> {
    let mut size = String::new();
    if conn.read_line(&mut size).ok()? == 0 {
        return None;
    }
    let n = usize::from_str_radix(size.trim(), 16).ok()?;
    let mut data = vec![0; n + 2];
    conn.read_exact(&mut data).ok()?;
    data.truncate(n);
    (n > 0).then_some(data)
}

/// An open event stream, read one event at a time.
pub struct Sse {
    conn: BufReader<TcpStream>,
    buf: String,
}

impl Sse {
    /// The next `data:` payload (comments and keep-alives skipped).
    pub fn next_data(&mut self) -> Option<String> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let event: String = self.buf.drain(..end + 2).collect();
                let data: Vec<&str> = event.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
                if !data.is_empty() {
                    return Some(data.join("\n"));
                }
                continue;
            }
            let chunk = read_chunk(&mut self.conn)?;
            self.buf.push_str(&String::from_utf8(chunk).unwrap());
        }
    }
}
