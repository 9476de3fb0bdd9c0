//! What `tool_choice` asks of an answer, and how an answer is made to begin with a call.
//!
//! `none` renders no tools and parses no calls; `auto` leaves the choice to the model.
//! Without grammar-constrained decoding (llama-server forces `required` with a grammar),
//! `required` and a named function are enforced by answer prefilling: the prompt ends with the
//! opening of a call in the model's tool format (for a named function, up to its arguments),
//! so the model continues inside a call; the router is fed that opening as if generated. For
//! `required` the opening ends at the name, and generation masks the next tokens to those of a
//! declared tool name. The arguments are not constrained: a continuation that does not parse
//! as a call comes back as content (never dropped).

use serde_json::Value;

use super::router::ToolFormat;

/// What `tool_choice` asks of the answer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ToolChoice {
    /// The model decides (tools rendered, calls parsed).
    #[default]
    Auto,
    /// No tools: they are not rendered and calls are not parsed.
    None,
    /// The answer must be a call to one of the tools.
    Required,
    /// The answer must be a call to this tool.
    Named(String),
}

/// The start of a call that `required` (any tool) or a named tool makes the answer begin with,
/// in the model's tool format; `None` when the model may answer freely.
pub fn forced_call_opening(format: ToolFormat, choice: &ToolChoice) -> Option<String> {
    let name = match choice {
        ToolChoice::Auto | ToolChoice::None => return None,
        ToolChoice::Required => None,
        // A JSON string, so any name is quoted correctly.
        ToolChoice::Named(n) => Some(Value::String(n.clone()).to_string()),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::router::{OutputRouter, Routed, RouterConfig};

    #[test]
    fn forced_openings_per_format() {
        assert_eq!(forced_call_opening(ToolFormat::Hermes, &ToolChoice::Auto), None);
        assert_eq!(forced_call_opening(ToolFormat::Hermes, &ToolChoice::None), None);
        assert_eq!(
            forced_call_opening(ToolFormat::Hermes, &ToolChoice::Named("a\"b".into())).unwrap(),
            "<tool_call>\n{\"name\": \"a\\\"b\", \"arguments\": "
        );
        // Each opening, completed by a call's remainder, is a call the router parses.
        for format in [ToolFormat::Hermes, ToolFormat::Llama3Json, ToolFormat::Mistral] {
            for (choice, rest) in [
                (ToolChoice::Required, "f\", \"arguments\": {\"x\": 1}}"),
                (ToolChoice::Named("f".into()), "{\"x\": 1}}"),
            ] {
                let open = forced_call_opening(format, &choice).unwrap();
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
                assert_eq!(calls.len(), 1, "{format:?} {choice:?}: {out:?}");
                let Routed::ToolCall(c) = calls[0] else { unreachable!() };
                assert_eq!(c.name, "f");
            }
        }
    }
}
