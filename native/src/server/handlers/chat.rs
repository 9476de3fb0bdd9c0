//! `POST /v1/chat/completions`: messages through the chat template, the answer through the
//! output router (content / reasoning_content / tool_calls), streamed or whole.
//!
//! `tool_choice`: `none` renders no tools and parses no calls; `auto` leaves the choice to the
//! model. Without grammar-constrained decoding (llama-server forces `required` with a grammar),
//! `required` and a named function are enforced by answer prefilling: the prompt ends with the
//! opening of a call in the model's tool format (for a named function, up to its arguments),
//! so the model continues inside a call; the router is fed that opening as if generated. For
//! `required` the opening ends at the name, and the engine masks the next tokens to those of a
//! declared tool name (a trie over their tokenizations). The arguments are not constrained: a
//! continuation that does not parse as a call comes back as content (never dropped).
//! `parallel_tool_calls: false` keeps only the first call.

use super::{collect, finish_reason, launch, read_body};
use crate::server::errors::ApiError;
use crate::server::scheduler::{Finish, TokenLogprob, Usage};
use crate::server::sse::{self, usage_json, Chunks};
use crate::server::types::{parse_body, template_messages, unix_now, GenRequest, ToolMode};
use crate::server::{AppState, Shared};
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tinyllm::chat::router::{OutputRouter, Routed, RouterConfig, ToolFormat};
use tinyllm::chat::RenderRequest;

pub async fn handle(State(st): State<Shared>, req: Request) -> Result<Response, ApiError> {
    let body = read_body(&st, req).await?;
    let (req, raw): (GenRequest, Value) = parse_body(&body)?;
    req.reject_unsupported()?;
    let Some(messages) = &req.messages else {
        return Err(ApiError::bad_param("messages", "missing field `messages`"));
    };
    if messages.is_empty() {
        return Err(ApiError::bad_param("messages", "messages must not be empty"));
    }
    let tool_names = req.tool_names()?;
    let (mut rendered, mut prompt) = render(&st, &req, &raw, !tool_names.is_empty())?;
    let mode = req.tool_mode()?;
    let forced = forced_call_opening(st.tool_format, &mode);
    // `required`: the opening stops right before the name, which must be a declared one.
    let must_start = if mode == ToolMode::Required {
        tool_names
            .iter()
            .map(|n| st.tokenizer.encode(n, false, false))
            .filter(|t| !t.is_empty())
            .collect()
    } else {
        Vec::new()
    };
    if let Some(open) = &forced {
        if rendered.trim_end().ends_with("<think>") {
            // A call is wanted now: close the thinking block the template opened.
            rendered.push_str("\n\n</think>\n\n");
        }
        rendered.push_str(open);
        prompt = st.encode_chat(&rendered);
    }
    let mut router = OutputRouter::new(RouterConfig {
        format: st.tool_format,
        tools: tool_names,
        in_think: rendered.trim_end().ends_with("<think>"),
    });
    // The forced opening is part of the answer as far as the router is concerned; it only
    // switches the router into call mode (nothing is routed yet).
    let opened = forced.as_deref().map(|o| router.push(o)).unwrap_or_default();
    let parallel = req.parallel_tool_calls();
    let job = launch(&st, "chat", &req, prompt, "messages", must_start)?;
    let meta = Meta {
        id: format!("chatcmpl-{}", job.id),
        created: unix_now(),
        model: st.model_name.clone(),
    };
    let logprobs_on = req.logprobs()?.is_some();
    if req.stream {
        let include_usage = req.stream_options.as_ref().is_some_and(|o| o.include_usage);
        let mut chunks = ChatChunks {
            meta,
            router,
            logprobs_on,
            pending_logprobs: Vec::new(),
            tool_calls: 0,
            parallel,
            held: Vec::new(),
        };
        chunks.held = chunks.routed(opened);
        return Ok(sse::stream(job.events, chunks, include_usage, job.guard));
    }
    let out = collect(job).await?;
    let mut routed = opened;
    routed.extend(router.push(&out.text));
    routed.extend(router.finish());
    let routed = limit_calls(routed, parallel, &mut 0);
    let mut content = String::new();
    let mut reasoning = String::new();
    let mut calls = Vec::new();
    for r in routed {
        match r {
            Routed::Content(s) => content.push_str(&s),
            Routed::Reasoning(s) => reasoning.push_str(&s),
            Routed::ToolCall(c) => calls.push(tool_call_json(&meta.id, calls.len(), &c.name, &c.arguments)),
        }
    }
    let mut message = json!({
        "role": "assistant",
        "content": if content.is_empty() && !calls.is_empty() { Value::Null } else { Value::String(content) },
    });
    if !reasoning.is_empty() {
        message["reasoning_content"] = Value::String(reasoning);
    }
    let has_calls = !calls.is_empty();
    if has_calls {
        message["tool_calls"] = Value::Array(calls);
    }
    let logprobs = if logprobs_on {
        json!({"content": out.logprobs.iter().map(logprob_json).collect::<Vec<_>>()})
    } else {
        Value::Null
    };
    Ok(axum::Json(json!({
        "id": meta.id,
        "object": "chat.completion",
        "created": meta.created,
        "model": meta.model,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": finish_reason(out.finish, has_calls),
        }],
        "usage": usage_json(&out.usage),
        "timings": sse::timings_json(&out.usage),
    }))
    .into_response())
}

/// The start of a call that `required` (any tool) or a named tool makes the answer begin with,
/// in the model's tool format; `None` when the model may answer freely.
fn forced_call_opening(format: ToolFormat, mode: &ToolMode) -> Option<String> {
    let name = match mode {
        ToolMode::Auto | ToolMode::None => return None,
        ToolMode::Required => None,
        // A JSON string, so any name is quoted correctly.
        ToolMode::Named(n) => Some(Value::String(n.clone()).to_string()),
    };
    Some(match (format, name) {
        (ToolFormat::Hermes, None) => "<tool_call>\n{\"name\": \"".to_string(),
        (ToolFormat::Hermes, Some(n)) => format!("<tool_call>\n{{\"name\": {n}, \"arguments\": "),
        (ToolFormat::Llama3Json, None) => "{\"name\": \"".to_string(),
        (ToolFormat::Llama3Json, Some(n)) => format!("{{\"name\": {n}, \"parameters\": "),
        (ToolFormat::Mistral, None) => "[TOOL_CALLS][{\"name\": \"".to_string(),
        (ToolFormat::Mistral, Some(n)) => format!("[TOOL_CALLS][{{\"name\": {n}, \"arguments\": "),
    })
}

/// `parallel_tool_calls: false`: drop the calls after the first (`seen` counts the calls
/// already kept, across pushes of a stream).
fn limit_calls(routed: Vec<Routed>, parallel: bool, seen: &mut usize) -> Vec<Routed> {
    routed
        .into_iter()
        .filter(|r| {
            if !matches!(r, Routed::ToolCall(_)) {
                return true;
            }
            *seen += 1;
            parallel || *seen == 1
        })
        .collect()
}

/// Render the messages (and tools, unless `tool_choice` is none) and tokenize the prompt.
pub fn render(st: &AppState, req: &GenRequest, raw: &Value, with_tools: bool) -> Result<(String, Vec<u32>), ApiError> {
    let raw_messages = raw
        .get("messages")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let messages = template_messages(req.messages.as_deref().unwrap_or_default(), &raw_messages)?;
    let tools = raw.get("tools").and_then(Value::as_array).filter(|_| with_tools);
    let kwargs = req.chat_template_kwargs.clone().unwrap_or_default();
    let rendered = st
        .template
        .render(&RenderRequest {
            messages: &messages,
            tools: tools.map(Vec::as_slice),
            add_generation_prompt: true,
            kwargs: &kwargs,
        })
        .map_err(|e| ApiError::bad_param("messages", format!("cannot apply the chat template: {e}")))?;
    let prompt = st.encode_chat(&rendered);
    Ok((rendered, prompt))
}

struct Meta {
    id: String,
    created: u64,
    model: String,
}

fn tool_call_json(req_id: &str, index: usize, name: &str, arguments: &str) -> Value {
    json!({
        "id": call_id(req_id, index),
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    })
}

fn call_id(req_id: &str, index: usize) -> String {
    format!("call_{}_{index}", req_id.trim_start_matches("chatcmpl-"))
}

/// One token in OpenAI's chat logprobs format.
pub fn logprob_json(lp: &TokenLogprob) -> Value {
    let entry = |piece: &[u8], logprob: f32| json!({"token": String::from_utf8_lossy(piece), "logprob": logprob, "bytes": piece});
    let mut v = entry(&lp.piece, lp.logprob);
    v["top_logprobs"] = Value::Array(lp.top.iter().map(|(p, l)| entry(p, *l)).collect());
    v
}

/// Chat chunk shapes for the SSE state machine.
struct ChatChunks {
    meta: Meta,
    router: OutputRouter,
    logprobs_on: bool,
    /// Logprobs of tokens whose text is still held back; sent with the next chunk.
    pending_logprobs: Vec<Value>,
    tool_calls: usize,
    /// `parallel_tool_calls`: when false, calls after the first are dropped.
    parallel: bool,
    /// Chunks routed before the first token (from a forced call opening); sent after the
    /// opening chunk.
    held: Vec<Value>,
}

impl ChatChunks {
    fn chunk(&mut self, delta: Value, finish: Option<&str>) -> Value {
        let logprobs = if self.logprobs_on && (!self.pending_logprobs.is_empty() || finish.is_some()) {
            json!({"content": std::mem::take(&mut self.pending_logprobs)})
        } else {
            Value::Null
        };
        json!({
            "id": self.meta.id,
            "object": "chat.completion.chunk",
            "created": self.meta.created,
            "model": self.meta.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
        })
    }

    fn routed(&mut self, routed: Vec<Routed>) -> Vec<Value> {
        let mut seen = self.tool_calls;
        let routed = limit_calls(routed, self.parallel, &mut seen);
        let mut out = Vec::new();
        for r in routed {
            match r {
                Routed::Content(s) => out.push(self.chunk(json!({"content": s}), None)),
                Routed::Reasoning(s) => out.push(self.chunk(json!({"reasoning_content": s}), None)),
                Routed::ToolCall(c) => {
                    let index = self.tool_calls;
                    self.tool_calls += 1;
                    // Name first, then the arguments, as OpenAI streams them.
                    let head = json!({"tool_calls": [{
                        "index": index,
                        "id": call_id(&self.meta.id, index),
                        "type": "function",
                        "function": {"name": c.name, "arguments": ""},
                    }]});
                    out.push(self.chunk(head, None));
                    let args = json!({"tool_calls": [{"index": index, "function": {"arguments": c.arguments}}]});
                    out.push(self.chunk(args, None));
                }
            }
        }
        out
    }
}

impl Chunks for ChatChunks {
    fn opening(&mut self) -> Vec<Value> {
        let mut out = vec![self.chunk(json!({"role": "assistant", "content": ""}), None)];
        out.append(&mut self.held);
        out
    }

    fn token(&mut self, text: &str, logprob: Option<TokenLogprob>) -> Vec<Value> {
        if let Some(lp) = logprob {
            self.pending_logprobs.push(logprob_json(&lp));
        }
        let routed = self.router.push(text);
        self.routed(routed)
    }

    fn finish(&mut self, finish: Finish) -> Vec<Value> {
        let routed = self.router.finish();
        let mut out = self.routed(routed);
        let reason = finish_reason(finish, self.tool_calls > 0);
        out.push(self.chunk(json!({}), Some(reason)));
        out
    }

    fn usage(&mut self, usage: &Usage) -> Value {
        json!({
            "id": self.meta.id,
            "object": "chat.completion.chunk",
            "created": self.meta.created,
            "model": self.meta.model,
            "choices": [],
            "usage": usage_json(usage),
            "timings": sse::timings_json(usage),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tinyllm::chat::router::ToolCall;

    fn call(name: &str) -> Routed {
        Routed::ToolCall(ToolCall {
            name: name.into(),
            arguments: "{}".into(),
        })
    }

    #[test]
    fn parallel_tool_calls_false_keeps_the_first_call() {
        let routed = || {
            vec![
                Routed::Content("a".into()),
                call("f"),
                call("g"),
                Routed::Content("b".into()),
            ]
        };
        assert_eq!(limit_calls(routed(), true, &mut 0), routed());
        let kept = limit_calls(routed(), false, &mut 0);
        assert_eq!(
            kept,
            vec![Routed::Content("a".into()), call("f"), Routed::Content("b".into())]
        );
        // Across stream pushes: a call after one already sent is dropped.
        let mut seen = 0;
        assert_eq!(limit_calls(vec![call("f")], false, &mut seen), vec![call("f")]);
        assert!(limit_calls(vec![call("g")], false, &mut seen).is_empty());
    }

    #[test]
    fn forced_openings_per_format() {
        assert_eq!(forced_call_opening(ToolFormat::Hermes, &ToolMode::Auto), None);
        assert_eq!(forced_call_opening(ToolFormat::Hermes, &ToolMode::None), None);
        assert_eq!(
            forced_call_opening(ToolFormat::Hermes, &ToolMode::Named("a\"b".into())).unwrap(),
            "<tool_call>\n{\"name\": \"a\\\"b\", \"arguments\": "
        );
        // Each opening, completed by a call's remainder, is a call the router parses.
        for format in [ToolFormat::Hermes, ToolFormat::Llama3Json, ToolFormat::Mistral] {
            for (mode, rest) in [
                (ToolMode::Required, "f\", \"arguments\": {\"x\": 1}}"),
                (ToolMode::Named("f".into()), "{\"x\": 1}}"),
            ] {
                let open = forced_call_opening(format, &mode).unwrap();
                let close = match format {
                    ToolFormat::Hermes => "\n</tool_call>",
                    ToolFormat::Mistral => "]",
                    ToolFormat::Llama3Json => "",
                };
                let mut r = OutputRouter::new(RouterConfig {
                    format,
                    tools: vec!["f".into()],
                    in_think: false,
                });
                let mut out = r.push(&open);
                out.extend(r.push(&format!("{rest}{close}")));
                out.extend(r.finish());
                let calls: Vec<&Routed> = out.iter().filter(|o| matches!(o, Routed::ToolCall(_))).collect();
                assert_eq!(calls.len(), 1, "{format:?} {mode:?}: {out:?}");
                let Routed::ToolCall(c) = calls[0] else { unreachable!() };
                assert_eq!(c.name, "f");
            }
        }
    }
}
