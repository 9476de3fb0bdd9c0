//! OpenAI response shapes built from an answer's [`Step`]s: `chat.completion` and its stream
//! chunks, `text_completion` and its chunks, usage (with llama.cpp-style `timings`) and
//! logprobs. The server streams them as SSE; the browser package hands them to JS as the
//! OpenAI client's objects.

use serde_json::{json, Map, Value};

use crate::chat::router::{Routed, ToolCall};
use crate::engine::{Finish, Step, TokenLogprob, Usage};

/// OpenAI's `usage` object.
pub fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    })
}

/// llama.cpp's `timings` object.
pub fn timings_json(u: &Usage) -> Value {
    json!({
        "cache_n": u.cached_tokens,
        "prompt_n": u.prompt_tokens.saturating_sub(u.cached_tokens),
        "prompt_ms": u.prefill_s * 1e3,
        "prompt_per_second": u.prefill_tok_s(),
        "predicted_n": u.completion_tokens,
        "predicted_ms": u.decode_s * 1e3,
        "predicted_per_second": u.decode_tok_s(),
    })
}

/// The closing usage chunk of a stream (`stream_options.include_usage`).
fn usage_chunk(meta: &Meta, object: &str, usage: &Usage) -> Value {
    json!({
        "id": meta.id,
        "object": object,
        "created": meta.created,
        "model": meta.model,
        "choices": [],
        "usage": usage_json(usage),
        "timings": timings_json(usage),
    })
}

/// One token in the chat logprobs format.
pub fn logprob_json(lp: &TokenLogprob) -> Value {
    let entry = |piece: &[u8], logprob: f32| json!({"token": String::from_utf8_lossy(piece), "logprob": logprob, "bytes": piece});
    let mut v = entry(&lp.piece, lp.logprob);
    v["top_logprobs"] = Value::Array(lp.top.iter().map(|(_, p, l)| entry(p, *l)).collect());
    v
}

/// The names of a response's parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    /// `chatcmpl-N` or `cmpl-N`.
    pub id: String,
    pub created: u64,
    pub model: String,
}

fn call_id(req_id: &str, index: usize) -> String {
    let n = req_id.trim_start_matches("chatcmpl-").trim_start_matches("cmpl-");
    format!("call_{n}_{index}")
}

fn tool_call_json(req_id: &str, index: usize, call: &ToolCall) -> Value {
    json!({
        "id": call_id(req_id, index),
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    })
}

/// The chunk shapes of one endpoint, for a stream of an answer's steps.
pub trait Chunks {
    /// Chunks sent before any token (the chat role chunk).
    fn opening(&mut self) -> Vec<Value>;
    /// Chunks for one step (a step with nothing decided yet gives none).
    fn step(&mut self, step: &Step) -> Vec<Value>;
    /// The closing chunks, with the finish reason (and the usage, where the shape always
    /// carries it).
    fn finish(&mut self, finish: Finish, usage: &Usage) -> Vec<Value>;
    /// The final usage chunk (`stream_options.include_usage`).
    fn usage(&mut self, usage: &Usage) -> Value;
    /// Whether each event is named by its chunk's `type` (`event: message_start`), with no
    /// `[DONE]` at the end: Anthropic's and OpenAI Responses' streams. OpenAI's chat and
    /// completion streams send bare `data:` lines and end with `[DONE]`.
    fn named_events(&self) -> bool {
        false
    }
}

/// `chat.completion.chunk`s.
pub struct ChatChunks {
    meta: Meta,
    logprobs_on: bool,
    /// Logprobs of tokens whose text is still held back; sent with the next chunk.
    pending_logprobs: Vec<Value>,
    tool_calls: usize,
}

impl ChatChunks {
    pub fn new(meta: Meta, logprobs_on: bool) -> Self {
        ChatChunks {
            meta,
            logprobs_on,
            pending_logprobs: Vec::new(),
            tool_calls: 0,
        }
    }

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
}

impl Chunks for ChatChunks {
    fn opening(&mut self) -> Vec<Value> {
        vec![self.chunk(json!({"role": "assistant", "content": ""}), None)]
    }

    fn step(&mut self, step: &Step) -> Vec<Value> {
        if let Some(lp) = &step.logprob {
            self.pending_logprobs.push(logprob_json(lp));
        }
        let mut out = Vec::new();
        for r in &step.outputs {
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

    fn finish(&mut self, finish: Finish, _usage: &Usage) -> Vec<Value> {
        let reason = finish.openai(self.tool_calls > 0);
        vec![self.chunk(json!({}), Some(reason))]
    }

    fn usage(&mut self, usage: &Usage) -> Value {
        usage_chunk(&self.meta, "chat.completion.chunk", usage)
    }
}

/// A whole answer's steps, gathered for a non-streamed response.
#[derive(Debug, Default)]
pub struct Answer {
    pub content: String,
    pub reasoning: String,
    pub calls: Vec<ToolCall>,
    pub logprobs: Vec<TokenLogprob>,
    /// The stop string that ended the answer, if one did.
    pub stop: Option<String>,
}

impl Answer {
    pub fn push(&mut self, step: &Step) {
        self.logprobs.extend(step.logprob.clone());
        if step.stop.is_some() {
            self.stop.clone_from(&step.stop);
        }
        for r in &step.outputs {
            match r {
                Routed::Content(s) => self.content.push_str(s),
                Routed::Reasoning(s) => self.reasoning.push_str(s),
                Routed::ToolCall(c) => self.calls.push(c.clone()),
            }
        }
    }

    /// The `chat.completion` object.
    pub fn chat_completion(&self, meta: &Meta, finish: Finish, usage: &Usage, logprobs_on: bool) -> Value {
        let calls: Vec<Value> = self
            .calls
            .iter()
            .enumerate()
            .map(|(i, c)| tool_call_json(&meta.id, i, c))
            .collect();
        let has_calls = !calls.is_empty();
        let mut message = json!({
            "role": "assistant",
            "content": if self.content.is_empty() && has_calls { Value::Null } else { Value::String(self.content.clone()) },
        });
        if !self.reasoning.is_empty() {
            message["reasoning_content"] = Value::String(self.reasoning.clone());
        }
        if has_calls {
            message["tool_calls"] = Value::Array(calls);
        }
        let logprobs = if logprobs_on {
            json!({"content": self.logprobs.iter().map(logprob_json).collect::<Vec<_>>()})
        } else {
            Value::Null
        };
        json!({
            "id": meta.id,
            "object": "chat.completion",
            "created": meta.created,
            "model": meta.model,
            "choices": [{
                "index": 0,
                "message": message,
                "logprobs": logprobs,
                "finish_reason": finish.openai(has_calls),
            }],
            "usage": usage_json(usage),
            "timings": timings_json(usage),
        })
    }

    /// The `text_completion` object (the text is all content: completions do not route).
    pub fn text_completion(&self, meta: &Meta, finish: Finish, usage: &Usage, logprobs_on: bool) -> Value {
        let logprobs = if logprobs_on {
            CompletionLogprobs::default().json(&self.logprobs)
        } else {
            Value::Null
        };
        json!({
            "id": meta.id,
            "object": "text_completion",
            "created": meta.created,
            "model": meta.model,
            "choices": [{
                "index": 0,
                "text": self.content,
                "logprobs": logprobs,
                "finish_reason": finish.openai(false),
            }],
            "usage": usage_json(usage),
            "timings": timings_json(usage),
        })
    }
}

/// The legacy completions logprobs object, keeping the text offset across a stream.
#[derive(Debug, Default)]
struct CompletionLogprobs {
    /// Characters of text covered so far (for `text_offset`).
    offset: usize,
}

impl CompletionLogprobs {
    fn json(&mut self, lps: &[TokenLogprob]) -> Value {
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
                .map(|(_, p, l)| (String::from_utf8_lossy(p).into_owned(), json!(l)))
                .collect();
            top.push(Value::Object(alts));
        }
        json!({"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets})
    }
}

/// `text_completion` stream chunks.
pub struct CompletionChunks {
    meta: Meta,
    logprobs_on: bool,
    logprobs: CompletionLogprobs,
}

impl CompletionChunks {
    pub fn new(meta: Meta, logprobs_on: bool) -> Self {
        CompletionChunks {
            meta,
            logprobs_on,
            logprobs: CompletionLogprobs::default(),
        }
    }

    fn chunk(&self, text: &str, logprobs: Value, finish: Option<&str>) -> Value {
        json!({
            "id": self.meta.id,
            "object": "text_completion",
            "created": self.meta.created,
            "model": self.meta.model,
            "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}],
        })
    }
}

impl Chunks for CompletionChunks {
    fn opening(&mut self) -> Vec<Value> {
        Vec::new()
    }

    fn step(&mut self, step: &Step) -> Vec<Value> {
        let text: String = step
            .outputs
            .iter()
            .filter_map(|r| match r {
                Routed::Content(s) => Some(s.as_str()),
                _ => None,
            })
            .collect();
        let lp = match (&step.logprob, self.logprobs_on) {
            (Some(lp), true) => self.logprobs.json(std::slice::from_ref(lp)),
            _ => Value::Null,
        };
        if text.is_empty() && lp.is_null() {
            return Vec::new();
        }
        vec![self.chunk(&text, lp, None)]
    }

    fn finish(&mut self, finish: Finish, _usage: &Usage) -> Vec<Value> {
        vec![self.chunk("", Value::Null, Some(finish.openai(false)))]
    }

    fn usage(&mut self, usage: &Usage) -> Value {
        usage_chunk(&self.meta, "text_completion", usage)
    }
}
