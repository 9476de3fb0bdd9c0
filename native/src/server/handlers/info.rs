//! `GET /v1/models`, `GET /metrics` (a series per model) (`/health` and `/ready` are the lifecycle's).

use crate::server::metrics::{render, Series};
use crate::server::state::Shared;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use serde_json::json;
use tinyllm::openai::unix_now;

/// Every model the server serves, loaded or not (`meta.loaded`; the rest of `meta` once loaded).
pub async fn models(State(st): State<Shared>) -> impl IntoResponse {
    let data: Vec<_> = st
        .models
        .statuses()
        .into_iter()
        .map(|m| {
            let meta = match &m.served {
                Some(s) => json!({"loaded": true, "n_ctx": s.n_ctx, "n_vocab": s.n_vocab, "slots": s.scheduler.slots(),
                    "memory_bytes": m.need}),
                None => json!({"loaded": false, "memory_bytes": m.need}),
            };
            json!({"id": m.name, "object": "model", "created": unix_now(), "owned_by": "tinyllm", "meta": meta})
        })
        .collect();
    axum::Json(json!({"object": "list", "data": data}))
}

pub async fn metrics(State(st): State<Shared>) -> impl IntoResponse {
    let statuses = st.models.statuses();
    let series: Vec<Series> = statuses
        .iter()
        .map(|m| Series {
            name: m.name,
            metrics: m.metrics,
            loaded: m.served.is_some(),
            queued: m.served.as_ref().map_or(0, |s| s.scheduler.queued()),
            slots: m.served.as_ref().map_or(0, |s| s.scheduler.slots()),
            n_ctx: m.served.as_ref().map_or(0, |s| s.n_ctx),
            loads: m.loads,
            load_seconds: m.load_seconds,
            unloads: m.unloads,
        })
        .collect();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], render(&series))
}
