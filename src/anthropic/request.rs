//! A Messages API request, translated into the OpenAI chat request the engine already takes:
//! the system prompt becomes a system message, `text` blocks content, `thinking` blocks the
//! assistant's `reasoning_content`, `tool_use` blocks its `tool_calls`, `tool_result` blocks
//! `tool` messages; tools, `tool_choice`, `stop_sequences`, sampling and `thinking` map to
//! their OpenAI twins. Everything the chat path checks (templates, tool-call forcing, lazy
//! grammar, sampler ranges) is then checked once, there.

use serde_json::{json, Map, Value};

use crate::openai::request::text_of_parts;
use crate::openai::OpenAiError;

/// What the translation needs to know about the endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// `POST /v1/messages`: `max_tokens` is required.
    Generate,
    /// `POST /v1/messages/count_tokens`: no answer, no `max_tokens`.
    CountTokens,
}

fn bad(param: &str, message: impl Into<String>) -> OpenAiError {
    OpenAiError::bad_param(param, message)
}

/// The text of a `system` field or of a `tool_result`'s `content`: a string, or text blocks
/// (joined by newlines).
fn text_of(v: &Value, param: &str) -> Result<String, OpenAiError> {
    text_of_parts(v, param, &["text"], "\n")
}

/// One Messages API message as OpenAI chat messages (a user turn holding tool results gives
/// one `tool` message per result, before its text).
fn translate_message(i: usize, m: &Value, out: &mut Vec<Value>) -> Result<(), OpenAiError> {
    let param = format!("messages[{i}]");
    let role = m["role"]
        .as_str()
        .ok_or_else(|| bad(&format!("{param}.role"), "role is required"))?;
    if role == "system" {
        // Claude Code sends system messages between the turns (reminders); the chat template
        // takes them as system messages.
        let text = text_of(&m["content"], &format!("{param}.content"))?;
        out.push(json!({"role": "system", "content": text}));
        return Ok(());
    }
    if role != "user" && role != "assistant" {
        return Err(bad(
            &format!("{param}.role"),
            format!("role must be user, assistant or system, got {role:?}"),
        ));
    }
    let blocks: Vec<Value> = match &m["content"] {
        Value::String(s) => vec![json!({"type": "text", "text": s})],
        Value::Array(b) => b.clone(),
        _ => {
            return Err(bad(
                &format!("{param}.content"),
                "content must be a string or a list of blocks",
            ))
        }
    };
    let (mut text, mut thinking, mut calls) = (String::new(), String::new(), Vec::new());
    for (j, b) in blocks.iter().enumerate() {
        let bp = format!("{param}.content[{j}]");
        match (b["type"].as_str(), role) {
            (Some("text"), _) => {
                let t = b["text"]
                    .as_str()
                    .ok_or_else(|| bad(&format!("{bp}.text"), "a text block needs `text`"))?;
                if !text.is_empty() {
                    text.push('\n');
                }
                text.push_str(t);
            }
            (Some("thinking"), "assistant") => thinking.push_str(b["thinking"].as_str().unwrap_or("")),
            // Redacted reasoning carries nothing a local model can read.
            (Some("redacted_thinking"), "assistant") => {}
            (Some("tool_use"), "assistant") => {
                let id = b["id"]
                    .as_str()
                    .ok_or_else(|| bad(&format!("{bp}.id"), "a tool_use block needs `id`"))?;
                let name = b["name"]
                    .as_str()
                    .ok_or_else(|| bad(&format!("{bp}.name"), "a tool_use block needs `name`"))?;
                let input = match &b["input"] {
                    Value::Object(o) => Value::Object(o.clone()),
                    Value::Null => json!({}),
                    _ => return Err(bad(&format!("{bp}.input"), "input must be an object")),
                };
                calls.push(
                    json!({"id": id, "type": "function", "function": {"name": name, "arguments": input.to_string()}}),
                );
            }
            (Some("tool_result"), "user") => {
                let id = b["tool_use_id"]
                    .as_str()
                    .ok_or_else(|| bad(&format!("{bp}.tool_use_id"), "a tool_result block needs `tool_use_id`"))?;
                let mut content = text_of(&b["content"], &format!("{bp}.content"))?;
                if b["is_error"].as_bool() == Some(true) {
                    content = format!("Error: {content}");
                }
                out.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            (Some(kind @ ("image" | "document" | "search_result")), _) => {
                return Err(bad(
                    &format!("{bp}.type"),
                    format!("{kind} blocks are not supported: the models tinyllm runs read text"),
                ))
            }
            (Some(kind), _) => {
                return Err(bad(
                    &format!("{bp}.type"),
                    format!("a {role} message cannot hold a {kind} block"),
                ))
            }
            (None, _) => return Err(bad(&format!("{bp}.type"), "a content block needs `type`")),
        }
    }
    match role {
        "assistant" => {
            let mut msg = json!({"role": "assistant", "content": text});
            if !thinking.is_empty() {
                msg["reasoning_content"] = Value::String(thinking);
            }
            if !calls.is_empty() {
                msg["tool_calls"] = Value::Array(calls);
            }
            out.push(msg);
        }
        // A user turn of tool results only has no text message.
        _ if text.is_empty() && blocks.iter().any(|b| b["type"] == "tool_result") => {}
        _ => out.push(json!({"role": "user", "content": text})),
    }
    Ok(())
}

/// The OpenAI chat request (JSON) of a Messages API `body`.
pub fn to_chat_request(body: &Value, purpose: Purpose) -> Result<Value, OpenAiError> {
    let obj = body
        .as_object()
        .ok_or_else(|| OpenAiError::bad_request("the body must be a JSON object"))?;
    let mut chat = Map::new();
    let mut messages = Vec::new();
    if let Some(system) = obj.get("system") {
        let text = text_of(system, "system")?;
        if !text.is_empty() {
            messages.push(json!({"role": "system", "content": text}));
        }
    }
    let given = obj.get("messages").and_then(Value::as_array).ok_or_else(|| {
        bad(
            "messages",
            "messages is required: a list of user and assistant messages",
        )
    })?;
    if given.is_empty() {
        return Err(bad("messages", "messages must hold at least one message"));
    }
    for (i, m) in given.iter().enumerate() {
        translate_message(i, m, &mut messages)?;
    }
    chat.insert("messages".into(), Value::Array(messages));
    match (obj.get("max_tokens"), purpose) {
        (Some(v), Purpose::Generate) => {
            let n = v
                .as_u64()
                .filter(|&n| n >= 1)
                .ok_or_else(|| bad("max_tokens", "max_tokens must be a positive integer"))?;
            chat.insert("max_tokens".into(), json!(n));
        }
        (None, Purpose::Generate) => return Err(bad("max_tokens", "max_tokens is required")),
        (_, Purpose::CountTokens) => {}
    }
    for key in ["temperature", "top_p", "top_k"] {
        if let Some(v) = obj.get(key).filter(|v| !v.is_null()) {
            chat.insert(key.into(), v.clone());
        }
    }
    if let Some(stops) = obj.get("stop_sequences").filter(|v| !v.is_null()) {
        if !stops.as_array().is_some_and(|a| a.iter().all(Value::is_string)) {
            return Err(bad("stop_sequences", "stop_sequences must be a list of strings"));
        }
        chat.insert("stop".into(), stops.clone());
    }
    if let Some(s) = obj.get("stream") {
        chat.insert("stream".into(), s.clone());
    }
    if let Some(tools) = obj.get("tools").filter(|v| !v.is_null()) {
        let tools = tools.as_array().ok_or_else(|| bad("tools", "tools must be a list"))?;
        let mut out = Vec::with_capacity(tools.len());
        for (i, t) in tools.iter().enumerate() {
            let name = t["name"]
                .as_str()
                .ok_or_else(|| bad(&format!("tools[{i}].name"), "a tool needs a name"))?;
            let kind = t["type"].as_str().unwrap_or("custom");
            if kind != "custom" || !t["input_schema"].is_object() {
                return Err(bad(
                    &format!("tools[{i}]"),
                    format!(
                        "tool {name:?}: only client tools with an input_schema are supported (Anthropic's server \
                         tools, type {kind:?}, run on Anthropic's side)"
                    ),
                ));
            }
            let mut f = json!({"name": name, "parameters": t["input_schema"]});
            if let Some(d) = t["description"].as_str() {
                f["description"] = json!(d);
            }
            out.push(json!({"type": "function", "function": f}));
        }
        chat.insert("tools".into(), Value::Array(out));
    }
    if let Some(choice) = obj.get("tool_choice").filter(|v| !v.is_null()) {
        let kind = choice["type"].as_str().unwrap_or("");
        let c = match kind {
            "auto" => json!("auto"),
            "any" => json!("required"),
            "none" => json!("none"),
            "tool" => {
                let name = choice["name"]
                    .as_str()
                    .ok_or_else(|| bad("tool_choice.name", "tool_choice of type tool needs the tool's name"))?;
                json!({"type": "function", "function": {"name": name}})
            }
            _ => {
                return Err(bad(
                    "tool_choice.type",
                    format!("tool_choice.type must be auto, any, tool or none, got {kind:?}"),
                ))
            }
        };
        chat.insert("tool_choice".into(), c);
        if choice["disable_parallel_tool_use"].as_bool() == Some(true) {
            chat.insert("parallel_tool_calls".into(), json!(false));
        }
    }
    if let Some(t) = obj.get("thinking").filter(|v| !v.is_null()) {
        let on = match t["type"].as_str() {
            Some("enabled") => Some(true),
            Some("disabled") => Some(false),
            // The model decides (Claude Code's default): the template's own default.
            Some("adaptive") => None,
            other => {
                return Err(bad(
                    "thinking.type",
                    format!(
                        "thinking.type must be enabled, disabled or adaptive, got {}",
                        other.map_or("nothing".to_string(), |o| format!("{o:?}"))
                    ),
                ))
            }
        };
        // Qwen3's and DeepSeek's templates read it; others ignore it.
        if let Some(on) = on {
            chat.insert("chat_template_kwargs".into(), json!({"enable_thinking": on}));
        }
    }
    Ok(Value::Object(chat))
}
