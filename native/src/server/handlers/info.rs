//! `GET /v1/models`, `GET /metrics` (`/health` and `/ready` are the lifecycle's).

use crate::server::Shared;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use serde_json::json;
use tinyllm::openai::unix_now;

pub async fn models(State(st): State<Shared>) -> impl IntoResponse {
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": st.model_name,
            "object": "model",
            "created": unix_now(),
            "owned_by": "tinyllm",
            "meta": {"n_ctx": st.n_ctx, "n_vocab": st.n_vocab, "slots": st.scheduler.slots()},
        }],
    }))
}

pub async fn metrics(State(st): State<Shared>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        st.metrics.render(st.scheduler.queued(), st.scheduler.slots(), st.n_ctx),
    )
}
