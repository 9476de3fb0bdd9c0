//! `POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`: OpenAI's Responses API. The
//! request is translated onto the chat path (`tinyllm::openai::responses`), so it runs as a
//! chat completion would; a finished response is stored (unless `store: false`) for
//! `previous_response_id` and the two id routes.

use super::{launch, lease, read_body, respond};
use crate::server::errors::ApiError;
use crate::server::state::Shared;
use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use tinyllm::openai::responses::{response_json, to_chat_request, ResponseChunks, ResponseMeta};
use tinyllm::openai::GenRequest;
use tinyllm::openai::{parse_json, parse_value};

fn not_found(id: &str, param: Option<&str>, code: &'static str, what: &str) -> ApiError {
    let mut e = ApiError::not_found_message(format!(
        "{what} with id '{id}' not found: it was never stored, was deleted, or was dropped from the store \
         (--responses-store limits it)"
    ))
    .with_code(code);
    e.param = param.map(String::from);
    e
}

pub async fn create(State(st): State<Shared>, req: Request) -> Result<Response, ApiError> {
    let body = read_body(&st, req).await?;
    let raw = parse_json(&body)?;
    let previous = match raw.get("previous_response_id").filter(|v| !v.is_null()) {
        None => None,
        Some(id) => {
            let id = id
                .as_str()
                .ok_or_else(|| ApiError::bad_param("previous_response_id", "previous_response_id must be a string"))?;
            let stored = st.responses.get(id).ok_or_else(|| {
                not_found(
                    id,
                    Some("previous_response_id"),
                    "previous_response_not_found",
                    "Previous response",
                )
            })?;
            Some(stored.conversation)
        }
    };
    let translated = to_chat_request(&raw, previous.as_ref())?;
    let (req, chat_raw): (GenRequest, Value) = parse_value(translated.chat)?;
    let gen = req.chat(&chat_raw)?;
    let model = lease(&st, &raw).await?;
    let job = launch(&st, model, "responses", gen, "input")?;
    let meta = ResponseMeta::new(format!("resp_{}", job.id), job.model.name.clone(), &raw);
    let store = raw.get("store").and_then(Value::as_bool) != Some(false);
    let conversation = translated.conversation;
    let on_done = store.then(|| {
        let (st, conversation) = (st.clone(), conversation.clone());
        Box::new(move |response: &Value, answer: &Vec<Value>| keep(&st, conversation, response, answer))
            as tinyllm::openai::responses::OnDone
    });
    let stream = req.stream.then_some(false);
    let chunks = ResponseChunks::new(meta.clone(), on_done);
    let st2 = st.clone();
    respond(job, stream, chunks, move |a, f, u| {
        let (response, answer) = response_json(a, &meta, f, u);
        if store {
            keep(&st2, conversation, &response, &answer);
        }
        response
    })
    .await
}

/// Store `response` with its whole conversation: the request's, then the answer's messages.
fn keep(st: &Shared, mut conversation: Vec<Value>, response: &Value, answer: &[Value]) {
    conversation.extend(answer.iter().cloned());
    st.responses.put(response, &conversation);
}

pub async fn get(State(st): State<Shared>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    st.responses
        .get(&id)
        .map(|s| Json(s.response))
        .ok_or_else(|| not_found(&id, None, "response_not_found", "Response"))
}

pub async fn delete(State(st): State<Shared>, Path(id): Path<String>) -> Result<Response, ApiError> {
    if !st.responses.delete(&id) {
        return Err(not_found(&id, None, "response_not_found", "Response"));
    }
    Ok((
        StatusCode::OK,
        Json(json!({"id": id, "object": "response", "deleted": true})),
    )
        .into_response())
}
