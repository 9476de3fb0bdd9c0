//! Server-sent events as an explicit state machine: `Start` (opening chunk) -> `Body` (one or
//! more chunks per engine event) -> `Done` (finish chunk, optional usage chunk, then
//! `data: [DONE]`) -> `End`. The endpoint-specific chunk shapes come from a [`Chunks`]
//! implementation. The stream owns the job's [`CancelGuard`]: when the client disconnects,
//! the server drops the stream and the engine stops the job at its next step.

use super::scheduler::{CancelGuard, Event, Finish, TokenLogprob, Usage};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::convert::Infallible;
use tokio::sync::mpsc;

/// The chunk shapes of one endpoint.
pub trait Chunks: Send + 'static {
    /// Chunks sent before any token (the chat role chunk).
    fn opening(&mut self) -> Vec<Value>;
    /// Chunks for one generated token.
    fn token(&mut self, text: &str, logprob: Option<TokenLogprob>) -> Vec<Value>;
    /// Chunks at the end: what was held back, then the finish reason.
    fn finish(&mut self, finish: Finish) -> Vec<Value>;
    /// The final usage chunk (`stream_options.include_usage`).
    fn usage(&mut self, usage: &Usage) -> Value;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Start,
    Body,
    Done,
    End,
}

struct Machine<C: Chunks> {
    phase: Phase,
    events: mpsc::UnboundedReceiver<Event>,
    chunks: C,
    include_usage: bool,
    ready: VecDeque<String>,
    guard: CancelGuard,
}

impl<C: Chunks> Machine<C> {
    fn queue(&mut self, values: Vec<Value>) {
        self.ready.extend(values.iter().map(Value::to_string));
    }

    async fn next(&mut self) -> Option<SseEvent> {
        loop {
            if let Some(data) = self.ready.pop_front() {
                return Some(SseEvent::default().data(data));
            }
            match self.phase {
                Phase::Start => {
                    let v = self.chunks.opening();
                    self.queue(v);
                    self.phase = Phase::Body;
                }
                Phase::Body => match self.events.recv().await {
                    Some(Event::Token { text, logprob }) => {
                        let v = self.chunks.token(&text, logprob);
                        self.queue(v);
                    }
                    Some(Event::Done { finish, usage }) => {
                        self.guard.disarm();
                        let v = self.chunks.finish(finish);
                        self.queue(v);
                        if self.include_usage {
                            let u = self.chunks.usage(&usage);
                            self.queue(vec![u]);
                        }
                        self.phase = Phase::Done;
                    }
                    Some(Event::Failed(msg)) => {
                        self.guard.disarm();
                        let err = super::errors::ApiError::internal(format!("generation failed: {msg}"));
                        self.queue(vec![err.body()]);
                        self.phase = Phase::Done;
                    }
                    None => {
                        let err = super::errors::ApiError::internal("the engine dropped the request");
                        self.queue(vec![err.body()]);
                        self.phase = Phase::Done;
                    }
                },
                Phase::Done => {
                    self.phase = Phase::End;
                    return Some(SseEvent::default().data("[DONE]"));
                }
                Phase::End => return None,
            }
        }
    }
}

/// The SSE response for a running job.
pub fn stream<C: Chunks>(
    events: mpsc::UnboundedReceiver<Event>,
    chunks: C,
    include_usage: bool,
    guard: CancelGuard,
) -> Response {
    let machine = Machine {
        phase: Phase::Start,
        events,
        chunks,
        include_usage,
        ready: VecDeque::new(),
        guard,
    };
    let s = futures_util::stream::unfold(machine, |mut m| async move {
        let ev = m.next().await?;
        Some((Ok::<_, Infallible>(ev), m))
    });
    Sse::new(s).keep_alive(KeepAlive::default()).into_response()
}

/// OpenAI's `usage` object, with llama.cpp-style `timings` next to it.
pub fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    })
}

pub fn timings_json(u: &Usage) -> Value {
    json!({
        "cache_n": u.cached_tokens,
        "prompt_n": u.prompt_tokens - u.cached_tokens,
        "prompt_ms": u.prefill_s * 1e3,
        "prompt_per_second": u.prefill_tok_s(),
        "predicted_n": u.completion_tokens,
        "predicted_ms": u.decode_s * 1e3,
        "predicted_per_second": u.decode_tok_s(),
    })
}
