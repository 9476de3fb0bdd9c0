//! The answer in the Messages API's shapes: a whole `message` (content blocks `thinking`,
//! `text`, `tool_use`; `stop_reason`, `stop_sequence`, usage) or its event stream
//! (`message_start`, `ping`, `content_block_start` / `_delta` / `_stop` with `text_delta`,
//! `thinking_delta`, `signature_delta` and `input_json_delta`, `message_delta`,
//! `message_stop`), from the same steps OpenAI's shapes are built from.

use serde_json::{json, Value};

use crate::chat::router::{Routed, ToolCall};
use crate::engine::{Finish, Step, Usage};
use crate::openai::{Answer, Chunks};

/// Anthropic's `stop_reason`.
pub fn stop_reason(finish: Finish, tool_calls: bool) -> &'static str {
    match finish {
        Finish::Length | Finish::ContextFull => "max_tokens",
        Finish::StopString => "stop_sequence",
        _ if tool_calls => "tool_use",
        _ => "end_turn",
    }
}

/// The names of one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageMeta {
    /// `msg_N`.
    pub id: String,
    pub model: String,
    /// Tokens of the rendered prompt, and how many of them came from the cache.
    pub input_tokens: usize,
}

fn tool_use_id(msg_id: &str, index: usize) -> String {
    format!("toolu_{}_{index}", msg_id.trim_start_matches("msg_"))
}

/// A call's arguments as the `input` object (they are JSON object text).
fn input_of(call: &ToolCall) -> Value {
    serde_json::from_str(&call.arguments).unwrap_or_else(|_| json!({}))
}

fn usage_json(usage: &Usage) -> Value {
    json!({
        "input_tokens": usage.prompt_tokens.saturating_sub(usage.cached_tokens),
        "cache_read_input_tokens": usage.cached_tokens,
        "cache_creation_input_tokens": 0,
        "output_tokens": usage.completion_tokens,
    })
}

/// The whole `message` object.
pub fn message_json(answer: &Answer, meta: &MessageMeta, finish: Finish, usage: &Usage) -> Value {
    let mut content = Vec::new();
    if !answer.reasoning.is_empty() {
        content.push(json!({"type": "thinking", "thinking": answer.reasoning, "signature": ""}));
    }
    if !answer.content.is_empty() || (answer.calls.is_empty() && answer.reasoning.is_empty()) {
        content.push(json!({"type": "text", "text": answer.content}));
    }
    for (i, c) in answer.calls.iter().enumerate() {
        content.push(json!({"type": "tool_use", "id": tool_use_id(&meta.id, i), "name": c.name, "input": input_of(c)}));
    }
    json!({
        "id": meta.id,
        "type": "message",
        "role": "assistant",
        "model": meta.model,
        "content": content,
        "stop_reason": stop_reason(finish, !answer.calls.is_empty()),
        "stop_sequence": answer.stop,
        "usage": usage_json(usage),
    })
}

/// The open content block of a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Text,
    Thinking,
}

/// The Messages API's stream events.
pub struct MessageChunks {
    meta: MessageMeta,
    /// The block now open and its index.
    open: Option<Block>,
    index: usize,
    tool_calls: usize,
    stop: Option<String>,
}

impl MessageChunks {
    pub fn new(meta: MessageMeta) -> Self {
        MessageChunks {
            meta,
            open: None,
            index: 0,
            tool_calls: 0,
            stop: None,
        }
    }

    /// Close the open block (a thinking block gets its, empty, signature first).
    fn close(&mut self, out: &mut Vec<Value>) {
        if let Some(block) = self.open.take() {
            if block == Block::Thinking {
                out.push(json!({"type": "content_block_delta", "index": self.index, "delta": {"type": "signature_delta", "signature": ""}}));
            }
            out.push(json!({"type": "content_block_stop", "index": self.index}));
            self.index += 1;
        }
    }

    /// Text for a block of `kind`, opening it (and closing another) when needed.
    fn text(&mut self, kind: Block, text: &str, out: &mut Vec<Value>) {
        if self.open != Some(kind) {
            self.close(out);
            let block = match kind {
                Block::Text => json!({"type": "text", "text": ""}),
                Block::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
            };
            out.push(json!({"type": "content_block_start", "index": self.index, "content_block": block}));
            self.open = Some(kind);
        }
        let delta = match kind {
            Block::Text => json!({"type": "text_delta", "text": text}),
            Block::Thinking => json!({"type": "thinking_delta", "thinking": text}),
        };
        out.push(json!({"type": "content_block_delta", "index": self.index, "delta": delta}));
    }
}

impl Chunks for MessageChunks {
    fn opening(&mut self) -> Vec<Value> {
        vec![
            json!({"type": "message_start", "message": {
                "id": self.meta.id,
                "type": "message",
                "role": "assistant",
                "model": self.meta.model,
                "content": [],
                "stop_reason": null,
                "stop_sequence": null,
                "usage": {"input_tokens": self.meta.input_tokens, "output_tokens": 0},
            }}),
            json!({"type": "ping"}),
        ]
    }

    fn step(&mut self, step: &Step) -> Vec<Value> {
        if step.stop.is_some() {
            self.stop.clone_from(&step.stop);
        }
        let mut out = Vec::new();
        for r in &step.outputs {
            match r {
                Routed::Content(s) if !s.is_empty() => self.text(Block::Text, s, &mut out),
                Routed::Reasoning(s) if !s.is_empty() => self.text(Block::Thinking, s, &mut out),
                Routed::Content(_) | Routed::Reasoning(_) => {}
                Routed::ToolCall(c) => {
                    self.close(&mut out);
                    let id = tool_use_id(&self.meta.id, self.tool_calls);
                    self.tool_calls += 1;
                    out.push(json!({"type": "content_block_start", "index": self.index,
                        "content_block": {"type": "tool_use", "id": id, "name": c.name, "input": {}}}));
                    out.push(json!({"type": "content_block_delta", "index": self.index,
                        "delta": {"type": "input_json_delta", "partial_json": c.arguments}}));
                    out.push(json!({"type": "content_block_stop", "index": self.index}));
                    self.index += 1;
                }
            }
        }
        out
    }

    fn finish(&mut self, finish: Finish, usage: &Usage) -> Vec<Value> {
        let mut out = Vec::new();
        // A message has at least one block: an empty answer is an empty text block.
        if self.open.is_none() && self.index == 0 {
            self.text(Block::Text, "", &mut out);
        }
        self.close(&mut out);
        out.push(json!({
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason(finish, self.tool_calls > 0), "stop_sequence": self.stop},
            "usage": usage_json(usage),
        }));
        out.push(json!({"type": "message_stop"}));
        out
    }

    fn usage(&mut self, _usage: &Usage) -> Value {
        // The usage travels in `message_delta`.
        Value::Null
    }

    fn named_events(&self) -> bool {
        true
    }
}
