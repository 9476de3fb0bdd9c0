//! What `tool_choice` asks of an answer, and how an answer is made to begin with a call.
//!
//! `none` renders no tools and parses no calls; `auto` leaves the choice to the model.
//! `required` and a named function are enforced by answer prefilling: the prompt ends with the
//! opening of a call in the model's tool format (for a named function, up to its arguments),
//! so the model continues inside a call; the router is fed that opening as if generated. What
//! follows is held by a grammar ([`crate::grammar::tool_call_grammar`]): a declared name, then
//! arguments valid under that tool's parameter schema, then the call's closing. GLM's and
//! Qwen3-Coder's XML-like arguments have no grammar yet: there `required` masks the next tokens
//! to a declared tool name and leaves the arguments free (a continuation that does not parse
//! as a call comes back as content, never dropped).

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
        ToolChoice::Named(n) => Some(n.as_str()),
    };
    // A JSON string, so any name is quoted correctly in the JSON formats.
    let quoted = name.map(|n| Value::String(n.to_string()).to_string());
    Some(match (format, name, quoted) {
        (ToolFormat::Hermes, None, _) => "<tool_call>\n{\"name\": \"".to_string(),
        (ToolFormat::Hermes, _, Some(q)) => format!("<tool_call>\n{{\"name\": {q}, \"arguments\": "),
        (ToolFormat::Llama3Json, None, _) => "{\"name\": \"".to_string(),
        (ToolFormat::Llama3Json, _, Some(q)) => format!("{{\"name\": {q}, \"parameters\": "),
        (ToolFormat::Mistral, None, _) => "[TOOL_CALLS][{\"name\": \"".to_string(),
        (ToolFormat::Mistral, _, Some(q)) => format!("[TOOL_CALLS][{{\"name\": {q}, \"arguments\": "),
        // The prompt ends with `<|start|>assistant`: the answer's first message is the call.
        (ToolFormat::Harmony, None, _) => "<|channel|>commentary to=functions.".to_string(),
        (ToolFormat::Harmony, Some(n), _) => {
            format!("<|channel|>commentary to=functions.{n} <|constrain|>json<|message|>")
        }
        (ToolFormat::DeepSeekV3, None, _) => {
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>".to_string()
        }
        (ToolFormat::DeepSeekV3, Some(n), _) => {
            format!("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>{n}\n```json\n")
        }
        (ToolFormat::DeepSeekV31, None, _) => "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>".to_string(),
        (ToolFormat::DeepSeekV31, Some(n), _) => {
            format!("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{n}<｜tool▁sep｜>")
        }
        (ToolFormat::Glm45, None, _) => "<tool_call>".to_string(),
        (ToolFormat::Glm45, Some(n), _) => format!("<tool_call>{n}\n"),
        (ToolFormat::Qwen3Coder, None, _) => "<tool_call>\n<function=".to_string(),
        (ToolFormat::Qwen3Coder, Some(n), _) => format!("<tool_call>\n<function={n}>\n"),
        // `quoted` is `Some` exactly when `name` is.
        (_, Some(_), None) => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::router::{OutputRouter, Routed, RouterConfig, ToolCall};

    #[test]
    fn forced_openings_per_format() {
        assert_eq!(forced_call_opening(ToolFormat::Hermes, &ToolChoice::Auto), None);
        assert_eq!(forced_call_opening(ToolFormat::Hermes, &ToolChoice::None), None);
        assert_eq!(
            forced_call_opening(ToolFormat::Hermes, &ToolChoice::Named("a\"b".into())).unwrap(),
            "<tool_call>\n{\"name\": \"a\\\"b\", \"arguments\": "
        );
        // Each opening, completed by a call's remainder, is a call the router parses.
        let json_rests = [
            (ToolChoice::Required, "f\", \"arguments\": {\"x\": 1}}"),
            (ToolChoice::Named("f".into()), "{\"x\": 1}}"),
        ];
        // (format, (choice, what the model writes after the opening) x 2, closing text)
        type Case<'a> = (ToolFormat, [(ToolChoice, &'a str); 2], &'a str);
        let cases: [Case; 8] = [
            (ToolFormat::Hermes, json_rests.clone(), "\n</tool_call>"),
            (ToolFormat::Llama3Json, json_rests.clone(), ""),
            (ToolFormat::Mistral, json_rests.clone(), "]"),
            (
                ToolFormat::Harmony,
                [
                    (ToolChoice::Required, "f <|constrain|>json<|message|>{\"x\": 1}"),
                    (ToolChoice::Named("f".into()), "{\"x\": 1}"),
                ],
                "",
            ),
            (
                ToolFormat::DeepSeekV3,
                [
                    (ToolChoice::Required, "f\n```json\n{\"x\": 1}\n```"),
                    (ToolChoice::Named("f".into()), "{\"x\": 1}\n```"),
                ],
                "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            ),
            (
                ToolFormat::DeepSeekV31,
                [
                    (ToolChoice::Required, "f<｜tool▁sep｜>{\"x\": 1}"),
                    (ToolChoice::Named("f".into()), "{\"x\": 1}"),
                ],
                "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            ),
            (
                ToolFormat::Glm45,
                [
                    (
                        ToolChoice::Required,
                        "f\n<arg_key>x</arg_key>\n<arg_value>1</arg_value>",
                    ),
                    (
                        ToolChoice::Named("f".into()),
                        "<arg_key>x</arg_key>\n<arg_value>1</arg_value>",
                    ),
                ],
                "\n</tool_call>",
            ),
            (
                ToolFormat::Qwen3Coder,
                [
                    (ToolChoice::Required, "f>\n<parameter=x>\n1\n</parameter>\n"),
                    (ToolChoice::Named("f".into()), "<parameter=x>\n1\n</parameter>\n"),
                ],
                "</function>\n</tool_call>",
            ),
        ];
        for (format, rests, close) in cases {
            for (choice, rest) in rests {
                let open = forced_call_opening(format, &choice).unwrap();
                let mut r = OutputRouter::new(RouterConfig {
                    format,
                    tools: vec!["f".into()],
                    ..RouterConfig::default()
                });
                let mut out = r.push(&open);
                out.extend(r.push(&format!("{rest}{close}")));
                out.extend(r.finish());
                let want = Routed::ToolCall(ToolCall {
                    name: "f".into(),
                    arguments: r#"{"x":1}"#.into(),
                });
                assert_eq!(out, [want], "{format:?} {choice:?}");
            }
        }
    }
}
