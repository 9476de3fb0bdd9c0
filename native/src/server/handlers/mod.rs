//! Endpoint handlers, one file per group, plus what they share: reading a bounded body,
//! turning a validated request into an engine job, and answering it whole or streamed.

pub mod embeddings;
pub mod generate;
pub mod info;
pub mod messages;
pub mod responses;
pub mod tokens;

use super::errors::ApiError;
use super::metrics::Metrics;
use super::registry::Lease;
use super::scheduler::{CancelGuard, Event, Job};
use super::sse;
use super::state::AppState;
use axum::extract::Request;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use tinyllm::engine::{check_fits, Finish, Request as GenRequest, Usage};
use tinyllm::openai::{Answer, Chunks, Meta};
use tokio::sync::mpsc;

/// The body, at most `--max-body-bytes` (413 beyond).
pub async fn read_body(st: &AppState, req: Request) -> Result<axum::body::Bytes, ApiError> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > st.max_body_bytes as u64) {
        return Err(ApiError::too_large(st.max_body_bytes));
    }
    // Errors here are the limit (a chunked body) or a connection already gone.
    axum::body::to_bytes(req.into_body(), st.max_body_bytes)
        .await
        .map_err(|_| ApiError::too_large(st.max_body_bytes))
}

/// A job handed to the engine: its events, the guard that cancels it when dropped, and the
/// lease that keeps its model loaded until the answer is over.
pub struct Launched {
    pub id: u64,
    /// Tokens of the rendered prompt.
    pub prompt_tokens: usize,
    pub events: mpsc::UnboundedReceiver<Event>,
    pub guard: CancelGuard,
    pub model: Lease,
}

/// The model a request body's `model` field names (see [`super::registry`]).
pub async fn lease(st: &AppState, raw: &serde_json::Value) -> Result<Lease, ApiError> {
    st.models.lease(raw.get("model")).await
}

/// Prepare `req` (template, tools, tokens) for `model`, check that its prompt fits a slot, and
/// queue it. `prompt_param` names the prompt's field in errors.
pub fn launch(
    st: &AppState,
    model: Lease,
    kind: &'static str,
    req: GenRequest,
    prompt_param: &str,
) -> Result<Launched, ApiError> {
    let prepared = model
        .engine
        .prepare_request(&req)
        .map_err(|e| ApiError::engine(e, prompt_param))?;
    check_fits(prepared.prompt.len(), model.n_ctx).map_err(|e| ApiError::engine(e, prompt_param))?;
    let (tx, rx) = mpsc::unbounded_channel();
    let cancel = Arc::new(AtomicBool::new(false));
    let id = st.next_id();
    let prompt_tokens = prepared.prompt.len();
    let job = Job {
        id,
        kind,
        prepared,
        settings: req.settings,
        cancel: cancel.clone(),
        events: tx,
    };
    if let Err(e) = model.scheduler.submit(job) {
        Metrics::add(&model.metrics.requests_rejected, 1);
        return Err(e);
    }
    Ok(Launched {
        id,
        prompt_tokens,
        events: rx,
        guard: CancelGuard::new(cancel),
        model,
    })
}

/// Wait for the whole job. If the client goes away meanwhile, this future is dropped and the
/// guard cancels the job.
pub async fn collect(mut job: Launched) -> Result<(Answer, Finish, Usage), ApiError> {
    let mut answer = Answer::default();
    while let Some(ev) = job.events.recv().await {
        match ev {
            Event::Step(step) => answer.push(&step),
            Event::Done { finish, usage } => {
                job.guard.disarm();
                return Ok((answer, finish, usage));
            }
            Event::Failed(msg) => {
                job.guard.disarm();
                return Err(ApiError::internal(format!("generation failed: {msg}")));
            }
        }
    }
    Err(ApiError::internal("the engine dropped the request"))
}

/// Answer a launched job: streamed as `chunks` (server-sent events, with a usage chunk when
/// asked), or whole through `whole` once it is done.
pub async fn respond<C: Chunks + Send + 'static>(
    job: Launched,
    stream: Option<bool>,
    chunks: C,
    whole: impl FnOnce(&Answer, Finish, &Usage) -> serde_json::Value,
) -> Result<Response, ApiError> {
    if let Some(include_usage) = stream {
        return Ok(sse::stream(job.events, chunks, include_usage, job.guard, job.model));
    }
    let (answer, finish, usage) = collect(job).await?;
    Ok(axum::Json(whole(&answer, finish, &usage)).into_response())
}

/// The response names of `job` (`prefix` is `chatcmpl` or `cmpl`).
pub fn meta(job: &Launched, prefix: &str) -> Meta {
    Meta {
        id: format!("{prefix}-{}", job.id),
        created: tinyllm::openai::unix_now(),
        model: job.model.name.clone(),
    }
}
