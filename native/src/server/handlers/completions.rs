//! `POST /v1/completions`: a raw prompt (text or token ids) continued as is, no template.

use super::{collect, finish_reason, launch, read_body};
use crate::server::errors::ApiError;
use crate::server::scheduler::{Finish, TokenLogprob, Usage};
use crate::server::sse::{self, usage_json, Chunks};
use crate::server::types::{parse_body, unix_now, GenRequest, Prompt};
use crate::server::Shared;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

pub async fn handle(State(st): State<Shared>, req: Request) -> Result<Response, ApiError> {
    let body = read_body(&st, req).await?;
    let (req, _raw): (GenRequest, Value) = parse_body(&body)?;
    req.reject_unsupported()?;
    let prompt = match &req.prompt {
        None => return Err(ApiError::bad_param("prompt", "missing field `prompt`")),
        Some(Prompt::Text(t)) => st.tokenizer.encode(t, true, true),
        Some(Prompt::Texts(v)) if v.len() == 1 => st.tokenizer.encode(&v[0], true, true),
        Some(Prompt::Texts(_)) => {
            return Err(ApiError::bad_param(
                "prompt",
                "only one prompt per request is supported",
            ))
        }
        Some(Prompt::Ids(ids)) => {
            if let Some(bad) = ids.iter().find(|&&id| id as usize >= st.n_vocab) {
                return Err(ApiError::bad_param(
                    "prompt",
                    format!("token id {bad} is outside the vocabulary ({} tokens)", st.n_vocab),
                ));
            }
            ids.clone()
        }
    };
    let logprobs_on = req.logprobs()?.is_some();
    let job = launch(&st, "completion", &req, prompt, "prompt", Vec::new())?;
    let mut chunks = CompletionChunks {
        id: format!("cmpl-{}", job.id),
        created: unix_now(),
        model: st.model_name.clone(),
        logprobs_on,
        offset: 0,
    };
    if req.stream {
        let include_usage = req.stream_options.as_ref().is_some_and(|o| o.include_usage);
        return Ok(sse::stream(job.events, chunks, include_usage, job.guard));
    }
    let out = collect(job).await?;
    let logprobs = if logprobs_on {
        chunks.logprobs(&out.logprobs)
    } else {
        Value::Null
    };
    Ok(axum::Json(json!({
        "id": chunks.id,
        "object": "text_completion",
        "created": chunks.created,
        "model": chunks.model,
        "choices": [{
            "index": 0,
            "text": out.text,
            "logprobs": logprobs,
            "finish_reason": finish_reason(out.finish, false),
        }],
        "usage": usage_json(&out.usage),
        "timings": sse::timings_json(&out.usage),
    }))
    .into_response())
}

struct CompletionChunks {
    id: String,
    created: u64,
    model: String,
    logprobs_on: bool,
    /// Characters of text sent so far (for `text_offset`).
    offset: usize,
}

impl CompletionChunks {
    /// The legacy completions logprobs object.
    fn logprobs(&mut self, lps: &[TokenLogprob]) -> Value {
        let mut tokens = Vec::new();
        let mut token_logprobs = Vec::new();
        let mut top = Vec::new();
        let mut offsets = Vec::new();
        for lp in lps {
            let piece = String::from_utf8_lossy(&lp.piece).into_owned();
            offsets.push(self.offset);
            self.offset += piece.chars().count();
            tokens.push(piece);
            token_logprobs.push(lp.logprob);
            let alts: Map<String, Value> = lp
                .top
                .iter()
                .map(|(p, l)| (String::from_utf8_lossy(p).into_owned(), json!(l)))
                .collect();
            top.push(Value::Object(alts));
        }
        json!({"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets})
    }

    fn chunk(&self, text: &str, logprobs: Value, finish: Option<&str>) -> Value {
        json!({
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}],
        })
    }
}

impl Chunks for CompletionChunks {
    fn opening(&mut self) -> Vec<Value> {
        Vec::new()
    }

    fn token(&mut self, text: &str, logprob: Option<TokenLogprob>) -> Vec<Value> {
        let lp = match (&logprob, self.logprobs_on) {
            (Some(lp), true) => self.logprobs(std::slice::from_ref(lp)),
            _ => Value::Null,
        };
        if text.is_empty() && lp.is_null() {
            return Vec::new();
        }
        vec![self.chunk(text, lp, None)]
    }

    fn finish(&mut self, finish: Finish) -> Vec<Value> {
        vec![self.chunk("", Value::Null, Some(finish_reason(finish, false)))]
    }

    fn usage(&mut self, usage: &Usage) -> Value {
        json!({
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": usage_json(usage),
            "timings": sse::timings_json(usage),
        })
    }
}
