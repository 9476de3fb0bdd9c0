//! Server-sent events as an explicit state machine: `Start` (opening chunk) -> `Body` (one or
//! more chunks per engine event) -> `Done` (finish chunk, optional usage chunk, then
//! `data: [DONE]`) -> `End`. The endpoint-specific chunk shapes come from the library's
//! [`Chunks`] (OpenAI's shapes); this is only their transport. The stream owns the job's
//! [`CancelGuard`]: when the client disconnects, the server drops the stream and the engine
//! stops the job at its next step.

use super::registry::Lease;
use super::scheduler::{CancelGuard, Event};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use std::collections::VecDeque;
use std::convert::Infallible;
use tinyllm::openai::Chunks;
use tokio::sync::mpsc;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Start,
    Body,
    Done,
    End,
}

struct Machine<C: Chunks + Send + 'static> {
    phase: Phase,
    events: mpsc::UnboundedReceiver<Event>,
    chunks: C,
    include_usage: bool,
    /// Events to send: the event's name (named streams) and its data.
    ready: VecDeque<(Option<String>, String)>,
    guard: CancelGuard,
    /// Keeps the model loaded until the stream ends.
    _model: Lease,
}

impl<C: Chunks + Send + 'static> Machine<C> {
    /// An error mid-stream in the stream's own shape (`type: error` in a named stream).
    fn error_body(&self, err: &super::errors::ApiError) -> Value {
        if self.chunks.named_events() {
            err.anthropic_body()
        } else {
            err.body()
        }
    }

    fn queue(&mut self, values: Vec<Value>) {
        let named = self.chunks.named_events();
        self.ready.extend(values.iter().map(|v| {
            let name = v["type"].as_str().filter(|_| named).map(String::from);
            (name, v.to_string())
        }));
    }

    async fn next(&mut self) -> Option<SseEvent> {
        loop {
            if let Some((name, data)) = self.ready.pop_front() {
                let event = SseEvent::default().data(data);
                return Some(match name {
                    Some(name) => event.event(name),
                    None => event,
                });
            }
            match self.phase {
                Phase::Start => {
                    let v = self.chunks.opening();
                    self.queue(v);
                    self.phase = Phase::Body;
                }
                Phase::Body => match self.events.recv().await {
                    Some(Event::Step(step)) => {
                        let v = self.chunks.step(&step);
                        self.queue(v);
                    }
                    Some(Event::Done { finish, usage }) => {
                        self.guard.disarm();
                        let v = self.chunks.finish(finish, &usage);
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
                        let body = self.error_body(&err);
                        self.queue(vec![body]);
                        self.phase = Phase::Done;
                    }
                    None => {
                        let err = super::errors::ApiError::internal("the engine dropped the request");
                        let body = self.error_body(&err);
                        self.queue(vec![body]);
                        self.phase = Phase::Done;
                    }
                },
                Phase::Done => {
                    self.phase = Phase::End;
                    if !self.chunks.named_events() {
                        return Some(SseEvent::default().data("[DONE]"));
                    }
                }
                Phase::End => return None,
            }
        }
    }
}

/// The SSE response for a running job.
pub fn stream<C: Chunks + Send + 'static>(
    events: mpsc::UnboundedReceiver<Event>,
    chunks: C,
    include_usage: bool,
    guard: CancelGuard,
    model: Lease,
) -> Response {
    let machine = Machine {
        phase: Phase::Start,
        events,
        chunks,
        include_usage,
        ready: VecDeque::new(),
        guard,
        _model: model,
    };
    let s = futures_util::stream::unfold(machine, |mut m| async move {
        let ev = m.next().await?;
        Some((Ok::<_, Infallible>(ev), m))
    });
    Sse::new(s).keep_alive(KeepAlive::default()).into_response()
}
