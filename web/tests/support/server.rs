//! A static HTTP server for the browser tests: the built package at `/pkg/`, the test pages at
//! `/`, model files at `/models/`. It logs every request (method, path, range, status) so a
//! test can count what the browser fetched, sends cross-origin isolation headers when asked
//! (the threaded wasm build needs them), and cuts the first download of chosen files halfway
//! (the package must resume with a Range request). A second server without CORS headers
//! stands in for another origin.

#![allow(dead_code)]

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::Router;
use futures_util::StreamExt;
use tower_http::services::ServeDir;

/// One request the server answered.
#[derive(Debug, Clone)]
pub struct Hit {
    pub method: String,
    pub path: String,
    pub range: Option<String>,
    pub status: u16,
}

#[derive(Clone, Default)]
pub struct Options {
    /// Send `Cross-Origin-Opener-Policy` / `-Embedder-Policy` (and CORP on every response).
    pub isolate: bool,
    /// Paths (under `/models/`) whose first GET is cut after half of the file.
    pub flaky: HashSet<String>,
    /// More folders to serve: (path prefix such as `/wllama`, folder).
    pub mounts: Vec<(String, PathBuf)>,
}

#[derive(Clone)]
struct Shared {
    log: Arc<Mutex<Vec<Hit>>>,
    options: Options,
    cut: Arc<Mutex<HashSet<String>>>,
}

pub struct TestServer {
    pub url: String,
    log: Arc<Mutex<Vec<Hit>>>,
    _rt: tokio::runtime::Runtime,
}

impl TestServer {
    /// Serve `pkg` at `/pkg/`, `pages` at `/` and `models` at `/models/`.
    pub fn start(pkg: PathBuf, pages: PathBuf, models: PathBuf, options: Options) -> TestServer {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        let log = Arc::new(Mutex::new(Vec::new()));
        let shared = Shared {
            log: Arc::clone(&log),
            options,
            cut: Arc::new(Mutex::new(HashSet::new())),
        };
        let mut app = Router::new()
            .nest_service("/pkg", ServeDir::new(pkg))
            .nest_service("/models", ServeDir::new(models));
        for (at, dir) in &shared.options.mounts {
            app = app.nest_service(at, ServeDir::new(dir));
        }
        let app = app
            .fallback_service(ServeDir::new(pages))
            .layer(middleware::from_fn_with_state(shared, around));
        let listener = rt
            .block_on(tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))))
            .expect("bind");
        let addr = listener.local_addr().expect("address");
        rt.spawn(async move { axum::serve(listener, app).await });
        TestServer {
            url: format!("http://{addr}"),
            log,
            _rt: rt,
        }
    }

    /// Every request so far.
    pub fn hits(&self) -> Vec<Hit> {
        self.log.lock().unwrap().clone()
    }

    /// The requests for `path`.
    pub fn hits_of(&self, path: &str) -> Vec<Hit> {
        self.hits().into_iter().filter(|h| h.path == path).collect()
    }
}

/// Log the request, add the isolation headers, cut a flaky file's first download.
async fn around(State(s): State<Shared>, req: Request, next: Next) -> Response {
    let method = req.method().to_string();
    let path = req.uri().path().to_string();
    let range = req
        .headers()
        .get("range")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let mut res = next.run(req).await;
    s.log.lock().unwrap().push(Hit {
        method: method.clone(),
        path: path.clone(),
        range: range.clone(),
        status: res.status().as_u16(),
    });
    let h = res.headers_mut();
    // Test pages and packages change between builds: never from the browser's HTTP cache
    // (Cache Storage, which the package uses on purpose, is separate).
    h.insert("cache-control", HeaderValue::from_static("no-store"));
    if s.options.isolate {
        h.insert("cross-origin-opener-policy", HeaderValue::from_static("same-origin"));
        h.insert("cross-origin-embedder-policy", HeaderValue::from_static("require-corp"));
        h.insert("cross-origin-resource-policy", HeaderValue::from_static("same-origin"));
    }
    let first_cut = method == "GET"
        && range.is_none()
        && res.status() == StatusCode::OK
        && s.options.flaky.contains(&path)
        && s.cut.lock().unwrap().insert(path.clone());
    if first_cut {
        // The first half goes out in small pieces, then a pause so hyper flushes them, then the
        // cut. Cutting before the browser has the headers would let Chromium retry the whole
        // request by itself (it does so on a reused connection that fails before any answer),
        // and the package's Range resume would never run.
        let (parts, body) = res.into_parts();
        let bytes = match axum::body::to_bytes(body, usize::MAX).await {
            Ok(b) => b,
            Err(e) => panic!("reading {path} for the cut: {e}"),
        };
        let half = bytes.len() / 2;
        let pieces: Vec<Result<axum::body::Bytes, std::io::Error>> = (0..half)
            .step_by(16 << 10)
            .map(|at| Ok(bytes.slice(at..(at + (16 << 10)).min(half))))
            .collect();
        let cut = futures_util::stream::once(async {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            Err(std::io::Error::other("connection cut by the test server"))
        });
        let stream = futures_util::stream::iter(pieces).chain(cut);
        res = Response::from_parts(parts, Body::from_stream(stream));
    }
    res
}
