//! One tool call's text to a [`ToolCall`], per format. Every parser returns `None` for text
//! that is not exactly a call, so the router can give it back as content.

use serde_json::Value;

use super::ToolCall;

/// One call object: `{"name": string, "arguments"|"parameters": object}` (arguments given as a
/// JSON string holding an object are accepted too). With `declared`, the name must be one of
/// them ([`declared_name`]).
fn call_from_value(v: &Value, declared: Option<&[String]>) -> Option<ToolCall> {
    let obj = v.as_object()?;
    let name = obj.get("name")?.as_str()?;
    let name = match declared {
        Some(d) => declared_name(name, d)?,
        None => name,
    };
    let args = obj.get("arguments").or_else(|| obj.get("parameters"))?;
    Some(ToolCall {
        name: name.to_string(),
        arguments: arguments_text(args)?,
    })
}

/// The declared tool a JSON answer names: the one spelled exactly so, else the only one equal
/// to it up to ASCII case. Small models capitalise tool names in their JSON answers (Qwen2.5
/// 0.5B writes `"Read"` for OpenCode's `read` in a quarter of its untagged calls); a name that
/// matches two tools up to case, or none, names no declared tool.
fn declared_name<'d>(name: &str, declared: &'d [String]) -> Option<&'d str> {
    if let Some(exact) = declared.iter().find(|t| *t == name) {
        return Some(exact);
    }
    let mut folded = declared.iter().filter(|t| t.eq_ignore_ascii_case(name));
    match (folded.next(), folded.next()) {
        (Some(only), None) => Some(only),
        _ => None,
    }
}

/// An arguments object (or a JSON string holding one) as compact JSON text.
fn arguments_text(args: &Value) -> Option<String> {
    let args = match args {
        Value::Object(_) => args.clone(),
        Value::String(s) => serde_json::from_str::<Value>(s).ok().filter(Value::is_object)?,
        _ => return None,
    };
    serde_json::to_string(&args).ok()
}

/// A call object in JSON text (Hermes' `<tool_call>` body).
pub(super) fn parse_call(text: &str, declared: Option<&[String]>) -> Option<ToolCall> {
    let v: Value = serde_json::from_str(text.trim()).ok()?;
    call_from_value(&v, declared)
}

/// Call objects or non-empty lists of them, one after another (parallel calls: models write
/// one object per line as often as a list); `None` unless every element is a call and nothing
/// else is there.
pub(super) fn parse_calls(text: &str, declared: Option<&[String]>) -> Option<Vec<ToolCall>> {
    let mut calls = Vec::new();
    for v in serde_json::Deserializer::from_str(text.trim()).into_iter::<Value>() {
        let v = v.ok()?;
        match &v {
            Value::Array(items) if !items.is_empty() => {
                for item in items {
                    calls.push(call_from_value(item, declared)?);
                }
            }
            Value::Object(_) => calls.push(call_from_value(&v, declared)?),
            _ => return None,
        }
    }
    (!calls.is_empty()).then_some(calls)
}

/// A tool name as the tagged formats write it: one line, no markup.
fn valid_name(name: &str) -> bool {
    !name.is_empty() && !name.contains(['\n', '<', '>', '{', '}', '`'])
}

/// A named call with arguments in JSON text.
pub(super) fn named_call(name: &str, args: &str) -> Option<ToolCall> {
    let name = name.trim();
    if !valid_name(name) {
        return None;
    }
    let args: Value = serde_json::from_str(args.trim()).ok()?;
    Some(ToolCall {
        name: name.to_string(),
        arguments: arguments_text(&args)?,
    })
}

const DS_SEP: &str = "<｜tool▁sep｜>";

/// The text between DeepSeek's `<｜tool▁call▁begin｜>` and `<｜tool▁call▁end｜>`:
/// `function<｜tool▁sep｜>NAME\n```json\n{...}\n```` (V3, R1) or `NAME<｜tool▁sep｜>{...}`
/// (V3.1). The V3 shape is recognised by its fence, so a V3.1 tool named `function` still
/// parses.
pub(super) fn deepseek_call(body: &str) -> Option<ToolCall> {
    let (head, rest) = body.split_once(DS_SEP)?;
    if head.trim() == "function" {
        if let Some((name, fenced)) = rest.split_once('\n') {
            let inner = fenced
                .trim()
                .strip_prefix("```json")
                .and_then(|s| s.strip_suffix("```"));
            if let Some(inner) = inner {
                return named_call(name, inner);
            }
        }
    }
    named_call(head, rest)
}

/// The text between GLM's `<tool_call>` and `</tool_call>`:
/// `NAME\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>...`. The template writes string
/// values as they are and others as JSON, so a value is read as llama.cpp reads it: the text
/// itself where the declared schema allows a string (`string_params`), otherwise JSON when it
/// parses as JSON and the text when it does not.
pub(super) fn glm_call(body: &str, string_params: &[(String, String)]) -> Option<ToolCall> {
    const KEY: &str = "<arg_key>";
    const KEY_END: &str = "</arg_key>";
    const VALUE: &str = "<arg_value>";
    const VALUE_END: &str = "</arg_value>";
    let (name, mut rest) = match body.find(KEY) {
        Some(i) => (&body[..i], &body[i..]),
        None => (body, ""),
    };
    let name = name.trim();
    if !valid_name(name) {
        return None;
    }
    let mut args = serde_json::Map::new();
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        let (key, after) = rest.strip_prefix(KEY)?.split_once(KEY_END)?;
        let (value, after) = after.trim_start().strip_prefix(VALUE)?.split_once(VALUE_END)?;
        rest = after;
        args.insert(key.to_string(), typed_value(name, key, value, string_params));
    }
    Some(ToolCall {
        name: name.to_string(),
        arguments: serde_json::to_string(&Value::Object(args)).ok()?,
    })
}

/// A value written as bare text, typed as llama.cpp types it: the text itself where the
/// declared schema allows a string (`string_params`), otherwise JSON when it parses as JSON
/// and the text when it does not (a parameter the tool does not declare included).
fn typed_value(tool: &str, key: &str, text: &str, string_params: &[(String, String)]) -> Value {
    let is_string = string_params.iter().any(|(t, p)| t == tool && p == key);
    let json = if is_string {
        None
    } else {
        serde_json::from_str::<Value>(text.trim()).ok()
    };
    json.unwrap_or_else(|| Value::String(text.to_string()))
}

const QWEN_FUNCTION: &str = "<function=";
const QWEN_FUNCTION_END: &str = "</function>";
const QWEN_PARAM: &str = "<parameter=";
const QWEN_PARAM_END: &str = "</parameter>";

/// The text between Qwen3-Coder's `<tool_call>` and `</tool_call>`:
/// `\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...</function>\n`.
///
/// The template writes each value between a newline after `<parameter=P>` and one before
/// `</parameter>`; those two are layout and go (llama.cpp's parser reads a string value as
/// exactly the text between `>\n` and `\n</parameter>`), everything else in a string value
/// is kept: code keeps its indentation and trailing blank lines. Values are typed as in
/// [`typed_value`]. A parameter the tool does not declare is kept, typed as JSON where it
/// parses (llama.cpp's grammar never lets a model write one; its earlier unconstrained XML
/// parser kept them the same way). `</function>` is required: without it the call may have
/// been cut short.
pub(super) fn qwen_xml_call(body: &str, string_params: &[(String, String)]) -> Option<ToolCall> {
    let (name, mut rest) = body.trim_start().strip_prefix(QWEN_FUNCTION)?.split_once('>')?;
    let name = name.trim();
    if !valid_name(name) {
        return None;
    }
    let mut args = serde_json::Map::new();
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix(QWEN_FUNCTION_END) {
            if !after.trim().is_empty() {
                return None;
            }
            break;
        }
        let (key, after) = rest.strip_prefix(QWEN_PARAM)?.split_once('>')?;
        let key = key.trim();
        if !valid_name(key) {
            return None;
        }
        let (value, after) = qwen_value(after)?;
        rest = after;
        args.insert(key.to_string(), typed_value(name, key, value, string_params));
    }
    Some(ToolCall {
        name: name.to_string(),
        arguments: serde_json::to_string(&Value::Object(args)).ok()?,
    })
}

/// Splits a parameter's value from what follows its `</parameter>`. A value may itself
/// contain `</parameter>` (code that writes this very format): the value ends at the first
/// one followed by the next parameter or by `</function>`.
fn qwen_value(text: &str) -> Option<(&str, &str)> {
    let end = text.match_indices(QWEN_PARAM_END).map(|(i, _)| i).find(|&i| {
        let next = text[i + QWEN_PARAM_END.len()..].trim_start();
        next.starts_with(QWEN_PARAM) || next.starts_with(QWEN_FUNCTION_END)
    })?;
    let value = &text[..end];
    let value = value.strip_prefix('\n').unwrap_or(value);
    let value = value.strip_suffix('\n').unwrap_or(value);
    Some((value, &text[end + QWEN_PARAM_END.len()..]))
}
