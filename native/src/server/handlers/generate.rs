//! `POST /v1/chat/completions` (messages through the chat template; the answer split into
//! content, reasoning_content and tool_calls, `tool_choice` forcing: see `tinyllm::chat::tools`)
//! and `POST /v1/completions` (a raw prompt, text or token ids, continued as is), streamed or
//! whole. What an answer is comes from the library (`tinyllm::engine`, `tinyllm::openai`); this
//! file only picks the endpoint's shapes.

use super::{launch, lease, meta, read_body, respond};
use crate::server::errors::ApiError;
use crate::server::state::Shared;
use axum::extract::{Request, State};
use axum::response::Response;
use serde_json::Value;
use tinyllm::openai::{parse_body, ChatChunks, CompletionChunks, GenRequest};

/// The two generating endpoints.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Chat,
    Completion,
}

pub async fn chat(st: State<Shared>, req: Request) -> Result<Response, ApiError> {
    run(st, req, Endpoint::Chat).await
}

pub async fn completions(st: State<Shared>, req: Request) -> Result<Response, ApiError> {
    run(st, req, Endpoint::Completion).await
}

async fn run(State(st): State<Shared>, req: Request, ep: Endpoint) -> Result<Response, ApiError> {
    let body = read_body(&st, req).await?;
    let (req, raw): (GenRequest, Value) = parse_body(&body)?;
    let (gen, kind, prefix, prompt_param) = match ep {
        Endpoint::Chat => (req.chat(&raw)?, "chat", "chatcmpl", "messages"),
        Endpoint::Completion => (req.completion()?, "completion", "cmpl", "prompt"),
    };
    let logprobs_on = gen.settings.logprobs.is_some();
    let model = lease(&st, &raw).await?;
    let job = launch(&st, model, kind, gen, prompt_param)?;
    let m = meta(&job, prefix);
    let stream = req
        .stream
        .then(|| req.stream_options.as_ref().is_some_and(|o| o.include_usage));
    match ep {
        Endpoint::Chat => {
            let chunks = ChatChunks::new(m.clone(), logprobs_on);
            respond(job, stream, chunks, |a, f, u| a.chat_completion(&m, f, u, logprobs_on)).await
        }
        Endpoint::Completion => {
            let chunks = CompletionChunks::new(m.clone(), logprobs_on);
            respond(job, stream, chunks, |a, f, u| a.text_completion(&m, f, u, logprobs_on)).await
        }
    }
}
