//! llama-server's utility endpoints: `POST /tokenize`, `POST /detokenize`,
//! `POST /apply-template`, each on the model the body's `model` names (else the first).

use super::read_body;
use crate::server::errors::ApiError;
use crate::server::state::Shared;
use axum::extract::{Request, State};
use axum::Json;
use serde_json::{json, Value};
use tinyllm::chat::RenderRequest;
use tinyllm::openai::parse_body;
use tinyllm::openai::request::{
    template_kwargs, template_messages, ApplyTemplateRequest, DetokenizeRequest, TokenizeRequest,
};

pub async fn tokenize(State(st): State<Shared>, req: Request) -> Result<Json<Value>, ApiError> {
    let body = read_body(&st, req).await?;
    let (req, raw): (TokenizeRequest, Value) = parse_body(&body)?;
    let model = super::lease(&st, &raw).await?;
    let ids = model
        .engine
        .tokenizer
        .encode(&req.content, req.add_special, req.parse_special);
    if !req.with_pieces {
        return Ok(Json(json!({"tokens": ids})));
    }
    let tokens: Vec<Value> = ids
        .iter()
        .map(|&id| {
            let bytes = model.engine.tokenizer.token_to_piece(id).unwrap_or_default();
            // A piece that is not valid UTF-8 on its own is given as its bytes.
            let piece = match String::from_utf8(bytes) {
                Ok(s) => json!(s),
                Err(e) => json!(e.into_bytes()),
            };
            json!({"id": id, "piece": piece})
        })
        .collect();
    Ok(Json(json!({"tokens": tokens})))
}

pub async fn detokenize(State(st): State<Shared>, req: Request) -> Result<Json<Value>, ApiError> {
    let body = read_body(&st, req).await?;
    let (req, raw): (DetokenizeRequest, Value) = parse_body(&body)?;
    let model = super::lease(&st, &raw).await?;
    if let Some(bad) = req.tokens.iter().find(|&&id| id as usize >= model.n_vocab) {
        return Err(ApiError::bad_param(
            "tokens",
            format!("token id {bad} is outside the vocabulary ({} tokens)", model.n_vocab),
        ));
    }
    let text = model
        .engine
        .tokenizer
        .decode(&req.tokens)
        .map_err(|e| ApiError::bad_param("tokens", e.to_string()))?;
    Ok(Json(json!({"content": text})))
}

pub async fn apply_template(State(st): State<Shared>, req: Request) -> Result<Json<Value>, ApiError> {
    let body = read_body(&st, req).await?;
    let (req, raw): (ApplyTemplateRequest, Value) = parse_body(&body)?;
    let raw_messages = raw
        .get("messages")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let messages = template_messages(&req.messages, &raw_messages)?;
    let kwargs = template_kwargs(&req.chat_template_kwargs, req.reasoning_effort.as_deref());
    let tools = raw.get("tools").and_then(Value::as_array);
    let model = super::lease(&st, &raw).await?;
    let prompt = model
        .engine
        .template
        .render(&RenderRequest {
            messages: &messages,
            tools: tools.map(Vec::as_slice),
            add_generation_prompt: req.add_generation_prompt.unwrap_or(true),
            kwargs: &kwargs,
        })
        .map_err(|e| ApiError::bad_param("messages", format!("cannot apply the chat template: {e}")))?;
    Ok(Json(json!({"prompt": prompt})))
}
