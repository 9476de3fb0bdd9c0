//! A replica's life behind a load balancer: loading, ready, draining.
//!
//! The server listens before the model is loaded, so an orchestrator can tell a replica that
//! is starting (alive, not ready) from one that is gone. `GET /health` is liveness (200 from
//! the moment it listens, with the phase in the body); `GET /ready` is readiness (200 only once
//! the model is loaded and warm and the server is not draining, 503 otherwise), the probe a
//! Kubernetes `readinessProbe` or an nginx health check polls.
//!
//! On SIGTERM or SIGINT the server drains: readiness turns 503 at once, so the balancer stops
//! sending; new generation requests that still arrive get 503 with `Retry-After` (a client or
//! proxy retries them on another replica); running streams finish. When no request is running
//! or waiting, or after `--drain-timeout`, the server stops and the process exits 0.

use axum::extract::Request;
use axum::http::Method;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde_json::json;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tower::ServiceExt;

use super::errors::ApiError;
use super::paths::{CHAT_PATHS, COMPLETION_PATHS, EMBEDDING_PATHS, MESSAGES_PATHS, RESPONSES_PATHS};
use super::state::Shared;

/// The header a proxy hashes on for session affinity (docs/deploy.md).
pub const SESSION_HEADER: &str = "x-session-id";

const LOADING: u8 = 0;
const READY: u8 = 1;
const DRAINING: u8 = 2;

/// The phase and, once loaded, the application.
pub struct Lifecycle {
    phase: AtomicU8,
    app: OnceLock<(Router, Shared)>,
}

impl Lifecycle {
    pub fn new() -> Arc<Self> {
        Arc::new(Lifecycle {
            phase: AtomicU8::new(LOADING),
            app: OnceLock::new(),
        })
    }

    fn phase_name(&self) -> &'static str {
        match self.phase.load(Ordering::SeqCst) {
            LOADING => "loading",
            READY => "ok",
            _ => "draining",
        }
    }

    /// The model is loaded and warm: serve `app` (unless a drain began meanwhile).
    pub fn set_ready(&self, app: Router, state: Shared) {
        let _ = self.app.set((app, state));
        let _ = self
            .phase
            .compare_exchange(LOADING, READY, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// Stop taking new generation requests.
    pub fn drain(&self) {
        self.phase.store(DRAINING, Ordering::SeqCst);
    }

    /// Requests running, waiting for a slot or for their model: those holding (or waiting
    /// for) a lease on a model.
    fn in_flight(&self) -> usize {
        self.app.get().map_or(0, |(_, st)| st.models.in_use())
    }

    /// Wait until nothing runs or waits, or `timeout` has passed; whether it emptied.
    pub async fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.in_flight() == 0 {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The outer router: the probes, then the application once it is there.
    pub fn router(self: &Arc<Self>) -> Router {
        let (h, r, f) = (Arc::clone(self), Arc::clone(self), Arc::clone(self));
        Router::new()
            .route(
                "/health",
                get(move || async move { axum::Json(json!({"status": h.phase_name()})) }),
            )
            .route("/ready", get(move || async move { r.readiness() }))
            .fallback(move |req: Request| async move { f.forward(req).await })
    }

    fn readiness(&self) -> Response {
        let body = axum::Json(json!({"status": self.phase_name()}));
        if self.phase.load(Ordering::SeqCst) == READY {
            body.into_response()
        } else {
            (axum::http::StatusCode::SERVICE_UNAVAILABLE, body).into_response()
        }
    }

    async fn forward(&self, req: Request) -> Response {
        let Some((app, _)) = self.app.get() else {
            return ApiError::unavailable("the model is still loading: retry shortly", "loading").into_response();
        };
        if self.phase.load(Ordering::SeqCst) == DRAINING && is_generation(&req) {
            return ApiError::unavailable(
                "the server is shutting down and takes no new requests: retry on another replica",
                "draining",
            )
            .into_response();
        }
        // The session key a proxy hashes on goes back with the answer, so a client that did
        // not set it sees what it was routed by.
        let session = req.headers().get(SESSION_HEADER).cloned();
        let mut response = match app.clone().oneshot(req).await {
            Ok(r) => r,
            Err(never) => match never {},
        };
        if let Some(key) = session {
            response.headers_mut().insert(SESSION_HEADER, key);
        }
        response
    }
}

/// A request that would start an answer.
fn is_generation(req: &Request) -> bool {
    let path = req.uri().path();
    req.method() == Method::POST
        && [
            CHAT_PATHS,
            COMPLETION_PATHS,
            EMBEDDING_PATHS,
            MESSAGES_PATHS,
            RESPONSES_PATHS,
        ]
        .iter()
        .any(|paths| paths.contains(&path))
}

/// SIGTERM or SIGINT (Ctrl-C).
pub async fn termination() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
