//! OpenAI's Responses API (`POST /v1/responses`) over the chat path: a request's `input`
//! (a string, or items: messages, `function_call`, `function_call_output`, `reasoning`),
//! `instructions`, flat function `tools`, `tool_choice`, `text.format` and `reasoning` are
//! translated into the chat request the engine runs; the answer becomes a `response` object
//! (output items `reasoning`, `message`, `function_call`) or the Responses event stream.
//!
//! A stored response keeps its conversation as chat messages ([`Conversation`]), so a request
//! naming it in `previous_response_id` continues it; the store itself is the server's.

use serde_json::{json, Map, Value};

use super::request::text_of_parts;
use super::response::{Answer, Chunks};
use super::OpenAiError;
use crate::chat::router::{Routed, ToolCall};
use crate::engine::{Finish, Step, Usage};

fn bad(param: &str, message: impl Into<String>) -> OpenAiError {
    OpenAiError::bad_param(param, message)
}

/// A conversation as chat messages (without the system prompt: `instructions` do not carry
/// over to a continuation).
pub type Conversation = Vec<Value>;

/// The text of a message item's `content`: a string or `input_text` / `output_text` parts.
fn content_text(v: &Value, param: &str) -> Result<String, OpenAiError> {
    text_of_parts(v, param, &["input_text", "output_text", "text"], "")
}

/// `input` items as chat messages, appended to `out`.
fn translate_input(input: &Value, out: &mut Conversation) -> Result<(), OpenAiError> {
    let items = match input {
        Value::String(s) => {
            out.push(json!({"role": "user", "content": s}));
            return Ok(());
        }
        Value::Array(items) => items,
        _ => return Err(bad("input", "input must be a string or a list of items")),
    };
    // Reasoning waits for the assistant turn it belongs to.
    let mut reasoning = String::new();
    for (i, item) in items.iter().enumerate() {
        let param = format!("input[{i}]");
        let kind = item["type"].as_str().unwrap_or("message");
        match kind {
            "message" => {
                let role = item["role"].as_str().ok_or_else(|| bad(&format!("{param}.role"), "a message needs a role"))?;
                let role = match role {
                    "developer" | "system" => "system",
                    "user" | "assistant" => role,
                    other => {
                        return Err(bad(
                            &format!("{param}.role"),
                            format!("role must be user, assistant, system or developer, got {other:?}"),
                        ))
                    }
                };
                let text = content_text(&item["content"], &format!("{param}.content"))?;
                let mut msg = json!({"role": role, "content": text});
                if role == "assistant" && !reasoning.is_empty() {
                    msg["reasoning_content"] = Value::String(std::mem::take(&mut reasoning));
                }
                out.push(msg);
            }
            "function_call" => {
                let field = |k: &str| {
                    item[k]
                        .as_str()
                        .ok_or_else(|| bad(&format!("{param}.{k}"), format!("a function_call needs `{k}`")))
                };
                let call = json!({"id": field("call_id")?, "type": "function",
                    "function": {"name": field("name")?, "arguments": field("arguments")?}});
                // Calls of one turn join the assistant message before them.
                match out.last_mut() {
                    Some(m) if m["role"] == "assistant" => {
                        if !m["tool_calls"].is_array() {
                            m["tool_calls"] = json!([]);
                        }
                        if let Some(calls) = m["tool_calls"].as_array_mut() {
                            calls.push(call);
                        }
                    }
                    _ => {
                        let mut msg = json!({"role": "assistant", "content": "", "tool_calls": [call]});
                        if !reasoning.is_empty() {
                            msg["reasoning_content"] = Value::String(std::mem::take(&mut reasoning));
                        }
                        out.push(msg);
                    }
                }
            }
            "function_call_output" => {
                let id = item["call_id"]
                    .as_str()
                    .ok_or_else(|| bad(&format!("{param}.call_id"), "a function_call_output needs `call_id`"))?;
                let output = match &item["output"] {
                    Value::String(s) => s.clone(),
                    Value::Null => return Err(bad(&format!("{param}.output"), "a function_call_output needs `output`")),
                    other => content_text(other, &format!("{param}.output"))?,
                };
                out.push(json!({"role": "tool", "tool_call_id": id, "content": output}));
            }
            "reasoning" => {
                for part in item["content"].as_array().into_iter().flatten().chain(item["summary"].as_array().into_iter().flatten()) {
                    if let Some(t) = part["text"].as_str() {
                        reasoning.push_str(t);
                        break;
                    }
                }
            }
            other => {
                return Err(bad(
                    &format!("{param}.type"),
                    format!("input items of type {other:?} are not supported (message, function_call, function_call_output, reasoning)"),
                ))
            }
        }
    }
    Ok(())
}

/// Hosted tools: they run on OpenAI's side, so a local model is not offered them (Codex declares
/// `web_search` beside its own function tools).
const HOSTED_TOOLS: [&str; 8] = [
    "web_search",
    "web_search_preview",
    "file_search",
    "code_interpreter",
    "image_generation",
    "mcp",
    "computer_use_preview",
    "computer_use",
];

/// A Responses tool as chat function tools, appended to `out`: a function; a `namespace`'s
/// functions (Codex groups its sub-agent tools so); nothing for a hosted tool.
fn function_tools(t: &Value, param: &str, out: &mut Vec<Value>) -> Result<(), OpenAiError> {
    let kind = t["type"].as_str().unwrap_or("");
    match kind {
        "function" => {
            let name = t["name"]
                .as_str()
                .ok_or_else(|| bad(&format!("{param}.name"), "a function tool needs a name"))?;
            let parameters = t.get("parameters").cloned().unwrap_or(json!({"type": "object"}));
            let mut f = json!({"name": name, "parameters": parameters});
            if let Some(d) = t["description"].as_str() {
                f["description"] = json!(d);
            }
            out.push(json!({"type": "function", "function": f}));
        }
        "namespace" => {
            for (j, inner) in t["tools"].as_array().into_iter().flatten().enumerate() {
                function_tools(inner, &format!("{param}.tools[{j}]"), out)?;
            }
        }
        k if HOSTED_TOOLS.iter().any(|h| k.starts_with(h)) => {}
        other => {
            return Err(bad(
                &format!("{param}.type"),
                format!("tools of type {other:?} are not supported (function and namespace tools are; hosted tools are left out)"),
            ))
        }
    }
    Ok(())
}

/// A Responses request translated: the chat request (JSON) to run, and the conversation to
/// store with the answer (the previous one's, then this request's input, no instructions).
#[derive(Debug, Clone, PartialEq)]
pub struct Translated {
    pub chat: Value,
    pub conversation: Conversation,
}

/// Translate `body`; `previous` is the stored conversation `previous_response_id` names.
pub fn to_chat_request(body: &Value, previous: Option<&Conversation>) -> Result<Translated, OpenAiError> {
    let obj = body
        .as_object()
        .ok_or_else(|| OpenAiError::bad_request("the request body must be a JSON object"))?;
    let mut conversation: Conversation = previous.cloned().unwrap_or_default();
    let input = obj.get("input").ok_or_else(|| bad("input", "input is required"))?;
    translate_input(input, &mut conversation)?;
    if conversation.is_empty() {
        return Err(bad("input", "input must hold at least one item"));
    }
    let mut messages = Vec::new();
    if let Some(instr) = obj.get("instructions").filter(|v| !v.is_null()) {
        let text = instr
            .as_str()
            .ok_or_else(|| bad("instructions", "instructions must be a string"))?;
        messages.push(json!({"role": "system", "content": text}));
    }
    messages.extend(conversation.iter().cloned());
    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(messages));
    if let Some(n) = obj.get("max_output_tokens").filter(|v| !v.is_null()) {
        let n = n
            .as_u64()
            .filter(|&n| n >= 1)
            .ok_or_else(|| bad("max_output_tokens", "max_output_tokens must be a positive integer"))?;
        chat.insert("max_tokens".into(), json!(n));
    }
    for key in ["temperature", "top_p", "stream", "parallel_tool_calls"] {
        if let Some(v) = obj.get(key).filter(|v| !v.is_null()) {
            chat.insert(key.into(), v.clone());
        }
    }
    if let Some(tools) = obj.get("tools").filter(|v| !v.is_null()) {
        let tools = tools.as_array().ok_or_else(|| bad("tools", "tools must be a list"))?;
        let mut out = Vec::new();
        for (i, t) in tools.iter().enumerate() {
            function_tools(t, &format!("tools[{i}]"), &mut out)?;
        }
        chat.insert("tools".into(), Value::Array(out));
    }
    if let Some(choice) = obj.get("tool_choice").filter(|v| !v.is_null()) {
        let c = match choice {
            Value::String(_) => choice.clone(),
            Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
                let name = o
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad("tool_choice.name", "tool_choice of type function needs a name"))?;
                json!({"type": "function", "function": {"name": name}})
            }
            _ => {
                return Err(bad(
                    "tool_choice",
                    "tool_choice must be auto, none, required or {\"type\": \"function\", \"name\"}",
                ))
            }
        };
        chat.insert("tool_choice".into(), c);
    }
    if let Some(format) = obj.get("text").and_then(|t| t.get("format")).filter(|v| !v.is_null()) {
        let rf = match format["type"].as_str() {
            Some("text") => None,
            Some("json_object") => Some(json!({"type": "json_object"})),
            Some("json_schema") => {
                let mut js = json!({"name": format["name"].as_str().unwrap_or("answer"), "schema": format["schema"]});
                if let Some(strict) = format.get("strict").filter(|v| !v.is_null()) {
                    js["strict"] = strict.clone();
                }
                Some(json!({"type": "json_schema", "json_schema": js}))
            }
            other => {
                return Err(bad(
                    "text.format.type",
                    format!("text.format.type must be text, json_object or json_schema, got {other:?}"),
                ))
            }
        };
        if let Some(rf) = rf {
            chat.insert("response_format".into(), rf);
        }
    }
    if let Some(effort) = obj
        .get("reasoning")
        .and_then(|r| r.get("effort"))
        .and_then(Value::as_str)
    {
        chat.insert("reasoning_effort".into(), json!(effort));
    }
    Ok(Translated {
        chat: Value::Object(chat),
        conversation,
    })
}

/// The names and settings a response object repeats.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponseMeta {
    /// `resp_N`.
    pub id: String,
    pub created_at: u64,
    pub model: String,
    /// The request's settings echoed in the object (`instructions`, `tools`, ...).
    pub echo: Map<String, Value>,
}

impl ResponseMeta {
    /// `id`, the clock and the request's echoed settings.
    pub fn new(id: String, model: String, body: &Value) -> Self {
        let mut echo = Map::new();
        for key in [
            "instructions",
            "max_output_tokens",
            "previous_response_id",
            "temperature",
            "top_p",
            "tool_choice",
            "tools",
            "text",
            "reasoning",
            "metadata",
            "parallel_tool_calls",
        ] {
            echo.insert(key.into(), body.get(key).cloned().unwrap_or(Value::Null));
        }
        ResponseMeta {
            id,
            created_at: super::unix_now(),
            model,
            echo,
        }
    }

    fn item_id(&self, prefix: &str, n: usize) -> String {
        format!("{prefix}_{}_{n}", self.id.trim_start_matches("resp_"))
    }

    /// The response object with `output`, `status` and usage.
    fn object(&self, status: &str, output: Vec<Value>, finish: Option<Finish>, usage: Option<&Usage>) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": self.model,
            "output": output,
            "error": null,
            "incomplete_details": match finish {
                Some(Finish::Length | Finish::ContextFull) => json!({"reason": "max_output_tokens"}),
                _ => Value::Null,
            },
            "usage": usage.map(usage_json),
        });
        if let Some(o) = v.as_object_mut() {
            for (k, val) in &self.echo {
                o.insert(k.clone(), val.clone());
            }
            if o.get("tool_choice").is_some_and(Value::is_null) {
                o.insert("tool_choice".into(), json!("auto"));
            }
            if o.get("tools").is_some_and(Value::is_null) {
                o.insert("tools".into(), json!([]));
            }
            if o.get("parallel_tool_calls").is_some_and(Value::is_null) {
                o.insert("parallel_tool_calls".into(), json!(true));
            }
        }
        v
    }
}

fn usage_json(u: &Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.prompt_tokens + u.completion_tokens,
    })
}

fn status_of(finish: Finish) -> &'static str {
    match finish {
        Finish::Length | Finish::ContextFull => "incomplete",
        _ => "completed",
    }
}

fn reasoning_item(id: String, text: &str) -> Value {
    json!({"type": "reasoning", "id": id, "summary": [], "content": [{"type": "reasoning_text", "text": text}], "status": "completed"})
}

fn message_item(id: String, text: &str, status: &str) -> Value {
    json!({"type": "message", "id": id, "status": status, "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}]})
}

fn call_item(meta: &ResponseMeta, n: usize, call: &ToolCall, arguments: &str, status: &str) -> Value {
    json!({"type": "function_call", "id": meta.item_id("fc", n), "call_id": meta.item_id("call", n),
        "name": call.name, "arguments": arguments, "status": status})
}

/// The whole `response` object of an answer, and the answer as chat messages (to store).
pub fn response_json(answer: &Answer, meta: &ResponseMeta, finish: Finish, usage: &Usage) -> (Value, Conversation) {
    let mut output = Vec::new();
    if !answer.reasoning.is_empty() {
        output.push(reasoning_item(meta.item_id("rs", 0), &answer.reasoning));
    }
    if !answer.content.is_empty() || answer.calls.is_empty() {
        output.push(message_item(meta.item_id("msg", 0), &answer.content, "completed"));
    }
    for (i, c) in answer.calls.iter().enumerate() {
        output.push(call_item(meta, i, c, &c.arguments, "completed"));
    }
    let mut msg = json!({"role": "assistant", "content": answer.content});
    if !answer.reasoning.is_empty() {
        msg["reasoning_content"] = json!(answer.reasoning);
    }
    if !answer.calls.is_empty() {
        let calls: Vec<Value> = answer
            .calls
            .iter()
            .enumerate()
            .map(|(i, c)| json!({"id": meta.item_id("call", i), "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
            .collect();
        msg["tool_calls"] = Value::Array(calls);
    }
    (
        meta.object(status_of(finish), output, Some(finish), Some(usage)),
        vec![msg],
    )
}

/// The output item being streamed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Reasoning,
    Message,
}

/// What a stream does with its finished response and conversation (the server stores them).
pub type OnDone = Box<dyn FnOnce(&Value, &Conversation) + Send>;

/// The Responses event stream. Its last event (`response.completed`) holds the whole object,
/// which also goes to the [`OnDone`] hook.
pub struct ResponseChunks {
    meta: ResponseMeta,
    seq: u64,
    /// Output items so far (finished ones whole).
    output: Vec<Value>,
    open: Option<Open>,
    /// Text of the open item.
    text: String,
    answer: Answer,
    on_done: Option<OnDone>,
}

impl ResponseChunks {
    pub fn new(meta: ResponseMeta, on_done: Option<OnDone>) -> Self {
        ResponseChunks {
            meta,
            seq: 0,
            output: Vec::new(),
            open: None,
            text: String::new(),
            answer: Answer::default(),
            on_done,
        }
    }

    fn event(&mut self, kind: &str, mut body: Value) -> Value {
        body["type"] = json!(kind);
        body["sequence_number"] = json!(self.seq);
        self.seq += 1;
        body
    }

    fn close(&mut self, out: &mut Vec<Value>) {
        let Some(open) = self.open.take() else { return };
        let index = self.output.len();
        let text = std::mem::take(&mut self.text);
        let item = match open {
            Open::Reasoning => {
                let id = self.meta.item_id("rs", index);
                let e = self.event(
                    "response.reasoning_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}),
                );
                out.push(e);
                reasoning_item(id, &text)
            }
            Open::Message => {
                let id = self.meta.item_id("msg", index);
                let part = json!({"type": "output_text", "text": text, "annotations": []});
                let e = self.event(
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}),
                );
                out.push(e);
                let e = self.event(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
                );
                out.push(e);
                message_item(id, &text, "completed")
            }
        };
        let e = self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
        out.push(e);
        self.output.push(item);
    }

    /// Text for an item of `kind`, opening it (and closing another) when needed. The open item
    /// is not in `output` yet, so its index is `output.len()`.
    fn push_text(&mut self, kind: Open, s: &str, out: &mut Vec<Value>) {
        if self.open != Some(kind) {
            self.close(out);
            let index = self.output.len();
            match kind {
                Open::Reasoning => {
                    let item = json!({"type": "reasoning", "id": self.meta.item_id("rs", index), "summary": [], "content": [], "status": "in_progress"});
                    let e = self.event(
                        "response.output_item.added",
                        json!({"output_index": index, "item": item}),
                    );
                    out.push(e);
                }
                Open::Message => {
                    let id = self.meta.item_id("msg", index);
                    let item = json!({"type": "message", "id": id, "status": "in_progress", "role": "assistant", "content": []});
                    let e = self.event(
                        "response.output_item.added",
                        json!({"output_index": index, "item": item}),
                    );
                    out.push(e);
                    let part = json!({"type": "output_text", "text": "", "annotations": []});
                    let e = self.event(
                        "response.content_part.added",
                        json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
                    );
                    out.push(e);
                }
            }
            self.open = Some(kind);
        }
        let index = self.output.len();
        self.text.push_str(s);
        let e = match kind {
            Open::Reasoning => {
                let id = self.meta.item_id("rs", index);
                self.event(
                    "response.reasoning_text.delta",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "delta": s}),
                )
            }
            Open::Message => {
                let id = self.meta.item_id("msg", index);
                self.event(
                    "response.output_text.delta",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "delta": s, "logprobs": []}),
                )
            }
        };
        out.push(e);
    }
}

impl Chunks for ResponseChunks {
    fn opening(&mut self) -> Vec<Value> {
        let obj = self.meta.object("in_progress", Vec::new(), None, None);
        let created = self.event("response.created", json!({"response": obj.clone()}));
        let progress = self.event("response.in_progress", json!({"response": obj}));
        vec![created, progress]
    }

    fn step(&mut self, step: &Step) -> Vec<Value> {
        self.answer.push(step);
        let mut out = Vec::new();
        for r in &step.outputs {
            match r {
                Routed::Content(s) if !s.is_empty() => self.push_text(Open::Message, s, &mut out),
                Routed::Reasoning(s) if !s.is_empty() => self.push_text(Open::Reasoning, s, &mut out),
                Routed::Content(_) | Routed::Reasoning(_) => {}
                Routed::ToolCall(c) => {
                    self.close(&mut out);
                    let index = self.output.len();
                    let n = self.output.iter().filter(|i| i["type"] == "function_call").count();
                    let added = call_item(&self.meta, n, c, "", "in_progress");
                    let id = added["id"].clone();
                    let e = self.event(
                        "response.output_item.added",
                        json!({"output_index": index, "item": added}),
                    );
                    out.push(e);
                    let e = self.event(
                        "response.function_call_arguments.delta",
                        json!({"item_id": id, "output_index": index, "delta": c.arguments}),
                    );
                    out.push(e);
                    let e = self.event(
                        "response.function_call_arguments.done",
                        json!({"item_id": id, "output_index": index, "arguments": c.arguments}),
                    );
                    out.push(e);
                    let item = call_item(&self.meta, n, c, &c.arguments, "completed");
                    let e = self.event(
                        "response.output_item.done",
                        json!({"output_index": index, "item": item}),
                    );
                    out.push(e);
                    self.output.push(item);
                }
            }
        }
        out
    }

    fn finish(&mut self, finish: Finish, usage: &Usage) -> Vec<Value> {
        let mut out = Vec::new();
        if self.open.is_none() && self.output.is_empty() {
            self.push_text(Open::Message, "", &mut out);
        }
        self.close(&mut out);
        let (_, conversation) = response_json(&self.answer, &self.meta, finish, usage);
        let obj = self
            .meta
            .object(status_of(finish), self.output.clone(), Some(finish), Some(usage));
        let kind = if status_of(finish) == "completed" {
            "response.completed"
        } else {
            "response.incomplete"
        };
        let e = self.event(kind, json!({"response": obj.clone()}));
        out.push(e);
        if let Some(f) = self.on_done.take() {
            f(&obj, &conversation);
        }
        out
    }

    fn usage(&mut self, _usage: &Usage) -> Value {
        Value::Null
    }

    fn named_events(&self) -> bool {
        true
    }
}
