//! The grammar of a forced tool call (`tool_choice: "required"` or a named function): what
//! follows the call's opening, which the prompt already ends with
//! ([`crate::chat::tools::forced_call_opening`]), up to the end of the call: a declared name,
//! then arguments valid under that tool's parameter schema, then the format's closing text.
//!
//! Formats whose arguments are JSON are constrained this way; GLM's and Qwen3-Coder's
//! `<arg_key>`/`<parameter=>` arguments are not (`None`: the caller keeps its name mask).

use serde_json::Value;

use super::json_rule;
use crate::chat::router::ToolFormat;
use crate::chat::tools::ToolChoice;
use crate::tokenizer::Tokenizer;

/// The text between a call's name and its arguments, and after its arguments, per format.
fn frame(format: ToolFormat) -> Option<(&'static str, &'static str)> {
    Some(match format {
        ToolFormat::Hermes => ("\", \"arguments\": ", "}\n</tool_call>"),
        ToolFormat::Llama3Json => ("\", \"parameters\": ", "}"),
        ToolFormat::Mistral => ("\", \"arguments\": ", "}]"),
        ToolFormat::Harmony => (" <|constrain|>json<|message|>", ""),
        ToolFormat::DeepSeekV3 => ("\n```json\n", "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
        ToolFormat::DeepSeekV31 => ("<｜tool▁sep｜>", "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
        ToolFormat::Glm45 | ToolFormat::Qwen3Coder => return None,
    })
}

/// Whether `format` writes a call's arguments as JSON, so a grammar can hold them to a schema.
pub fn json_arguments(format: ToolFormat) -> bool {
    frame(format).is_some()
}

/// `text` as a Lark sequence: its control tokens (`<|message|>`) as token references, the rest
/// as JSON-escaped string literals. Empty text is `""`.
pub(super) fn literal(tok: &Tokenizer, text: &str) -> String {
    let mut parts = Vec::new();
    let mut run: Vec<u32> = Vec::new();
    let flush = |run: &mut Vec<u32>, parts: &mut Vec<String>| {
        if !run.is_empty() {
            let s = tok.decode(run).unwrap_or_default();
            parts.push(Value::String(s).to_string());
            run.clear();
        }
    };
    for id in tok.encode(text, false, true) {
        if tok.is_control(id) {
            flush(&mut run, &mut parts);
            parts.push(format!("<[{id}]>"));
        } else {
            run.push(id);
        }
    }
    flush(&mut run, &mut parts);
    if parts.is_empty() {
        "\"\"".into()
    } else {
        parts.join(" ")
    }
}

/// `text` as it is written inside a JSON string (escaped, without the quotes).
pub(super) fn json_string_body(text: &str) -> String {
    let quoted = Value::String(text.to_string()).to_string();
    quoted[1..quoted.len() - 1].to_string()
}

/// A tool's parameter schema (`{"type": "object"}` when it declares none).
pub(super) fn parameters(tool: &Value) -> Value {
    tool.pointer("/function/parameters")
        .filter(|p| p.is_object())
        .cloned()
        .unwrap_or_else(|| serde_json::json!({"type": "object"}))
}

/// The Lark grammar of what follows a forced call's opening; `None` when `choice` forces no
/// call or `format` is not constrained (see the module docs). `tools` are the request's
/// declarations (already checked: each a function with a name).
///
/// A forced answer is one call, then the end (llama-server's default too): a grammar that
/// let more calls follow had gemma-3-270m repeat calls until its budget ran out.
pub fn tool_call_grammar(tok: &Tokenizer, format: ToolFormat, choice: &ToolChoice, tools: &[Value]) -> Option<String> {
    let (mid, close) = frame(format)?;
    let name_of = |t: &Value| t.pointer("/function/name").and_then(Value::as_str).map(str::to_string);
    let mut g = String::new();
    match choice {
        ToolChoice::Auto | ToolChoice::None => return None,
        ToolChoice::Named(name) => {
            let tool = tools.iter().find(|t| name_of(t).as_deref() == Some(name))?;
            g.push_str(&format!("start: args {}\n", literal(tok, close)));
            g.push_str(&json_rule("args", &parameters(tool)));
        }
        ToolChoice::Required => {
            // `call`: the name (the opening ends right before it), its arguments, the closing.
            let mut alts = Vec::new();
            for (i, t) in tools.iter().enumerate() {
                let mut name = name_of(t)?;
                if matches!(
                    format,
                    ToolFormat::Hermes | ToolFormat::Llama3Json | ToolFormat::Mistral
                ) {
                    name = json_string_body(&name);
                }
                alts.push(format!("call_{i}"));
                g.push_str(&format!(
                    "call_{i}: {} {} args_{i} {}\n",
                    literal(tok, &name),
                    literal(tok, mid),
                    literal(tok, close)
                ));
                g.push_str(&json_rule(&format!("args_{i}"), &parameters(t)));
            }
            g.push_str(&format!("start: {}\n", alts.join(" | ")));
        }
    }
    Some(g)
}
