//! Endpoint handlers, one file per group, plus what they share: reading a bounded body and
//! turning a validated request into an engine job.

pub mod chat;
pub mod completions;
pub mod info;
pub mod tokens;

use super::errors::ApiError;
use super::metrics::Metrics;
use super::scheduler::{CancelGuard, Event, Finish, Job, TokenLogprob, Usage};
use super::types::GenRequest;
use super::AppState;
use axum::extract::Request;
use axum::http::header;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
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

/// A job handed to the engine: its events and the guard that cancels it when dropped.
pub struct Launched {
    pub id: u64,
    pub events: mpsc::UnboundedReceiver<Event>,
    pub guard: CancelGuard,
}

/// Validate the generation settings of `req`, check that `prompt` fits, and queue the job.
pub fn launch(
    st: &AppState,
    kind: &'static str,
    req: &GenRequest,
    prompt: Vec<u32>,
    prompt_param: &str,
    must_start: Vec<Vec<u32>>,
) -> Result<Launched, ApiError> {
    let sampler = req.sampler()?;
    let logprobs = req.logprobs()?;
    let stop = req.stop_strings()?;
    let requested = req.max_tokens()?;
    if prompt.is_empty() {
        return Err(ApiError::bad_param(prompt_param, "the prompt is empty"));
    }
    if prompt.len() >= st.n_ctx {
        return Err(ApiError::bad_param(
            prompt_param,
            format!(
                "the prompt has {} tokens, but the context holds {} (with room for at least one generated token)",
                prompt.len(),
                st.n_ctx
            ),
        )
        .with_code("context_length_exceeded"));
    }
    // Past the context end generation stops with finish_reason "length".
    let room = st.n_ctx - prompt.len();
    let max_tokens = requested.unwrap_or(room).min(room);
    let (tx, rx) = mpsc::unbounded_channel();
    let cancel = Arc::new(AtomicBool::new(false));
    let id = st.scheduler.next_id();
    let job = Job {
        id,
        kind,
        prompt,
        sampler,
        max_tokens,
        logprobs,
        stop,
        must_start,
        cancel: cancel.clone(),
        events: tx,
    };
    if let Err(e) = st.scheduler.submit(job) {
        Metrics::add(&st.metrics.requests_rejected, 1);
        return Err(e);
    }
    Ok(Launched {
        id,
        events: rx,
        guard: CancelGuard::new(cancel),
    })
}

/// Everything a job produced, for non-streaming answers.
pub struct Collected {
    pub text: String,
    pub logprobs: Vec<TokenLogprob>,
    pub finish: Finish,
    pub usage: Usage,
}

/// Wait for the whole job. If the client goes away meanwhile, this future is dropped and the
/// guard cancels the job.
pub async fn collect(mut job: Launched) -> Result<Collected, ApiError> {
    let mut text = String::new();
    let mut logprobs = Vec::new();
    while let Some(ev) = job.events.recv().await {
        match ev {
            Event::Token { text: t, logprob } => {
                text.push_str(&t);
                logprobs.extend(logprob);
            }
            Event::Done { finish, usage } => {
                job.guard.disarm();
                return Ok(Collected {
                    text,
                    logprobs,
                    finish,
                    usage,
                });
            }
            Event::Failed(msg) => {
                job.guard.disarm();
                return Err(ApiError::internal(format!("generation failed: {msg}")));
            }
        }
    }
    Err(ApiError::internal("the engine dropped the request"))
}

/// OpenAI's finish reason.
pub fn finish_reason(finish: Finish, tool_calls: bool) -> &'static str {
    match finish {
        Finish::Length => "length",
        Finish::Stop | Finish::Cancelled if tool_calls => "tool_calls",
        Finish::Stop | Finish::Cancelled => "stop",
    }
}
