//! `POST /v1/messages` and `POST /v1/messages/count_tokens`: Anthropic's Messages API. The
//! request is translated onto the chat path (`tinyllm::anthropic::request`), so it runs exactly
//! as a chat completion would; only the shapes differ, and errors come in Anthropic's shape.

use super::{launch, read_body, respond};
use crate::server::errors::ApiError;
use crate::server::registry::Lease;
use crate::server::state::Shared;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use tinyllm::anthropic::{message_json, to_chat_request, MessageChunks, MessageMeta, Purpose};
use tinyllm::openai::{parse_json, parse_value, GenRequest};

pub async fn messages(st: State<Shared>, req: Request) -> Response {
    run(st, req).await.unwrap_or_else(ApiError::into_anthropic)
}

pub async fn count_tokens(st: State<Shared>, req: Request) -> Response {
    count(st, req).await.unwrap_or_else(ApiError::into_anthropic)
}

/// The body as JSON, translated into the chat request and parsed as the chat path parses it,
/// with the model it names.
async fn chat_request(st: &Shared, req: Request, purpose: Purpose) -> Result<(GenRequest, Value, Lease), ApiError> {
    let body = read_body(st, req).await?;
    let raw = parse_json(&body)?;
    let chat = to_chat_request(&raw, purpose)?;
    let (req, chat_raw) = parse_value(chat)?;
    Ok((req, chat_raw, super::lease(st, &raw).await?))
}

async fn run(State(st): State<Shared>, req: Request) -> Result<Response, ApiError> {
    let (req, raw, model) = chat_request(&st, req, Purpose::Generate).await?;
    let gen = req.chat(&raw)?;
    let job = launch(&st, model, "messages", gen, "messages")?;
    let meta = MessageMeta {
        id: format!("msg_{}", job.id),
        model: job.model.name.clone(),
        input_tokens: job.prompt_tokens,
    };
    let stream = req.stream.then_some(false);
    let chunks = MessageChunks::new(meta.clone());
    respond(job, stream, chunks, |a, f, u| message_json(a, &meta, f, u)).await
}

async fn count(State(st): State<Shared>, req: Request) -> Result<Response, ApiError> {
    let (req, raw, model) = chat_request(&st, req, Purpose::CountTokens).await?;
    let gen = req.chat(&raw)?;
    let prepared = model
        .engine
        .prepare_request(&gen)
        .map_err(|e| ApiError::engine(e, "messages"))?;
    Ok(Json(json!({"input_tokens": prepared.prompt.len()})).into_response())
}
