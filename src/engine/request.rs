//! A generation request as every front end states it, and what preparing it gives: the chat
//! template rendered with its tools, a forced tool call opened, the prompt tokenized, and how
//! the answer will be routed.

use serde_json::{Map, Value};

use super::settings::Settings;
use crate::chat::router::RouterConfig;
use crate::chat::tools::ToolChoice;
use crate::grammar::{AnswerFormat, Constraint, LazyCalls};

/// What the model is asked to continue.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Chat messages (OpenAI's shape, as the template takes them: text content, tool-call
    /// arguments as objects) through the model's chat template.
    Chat {
        messages: Vec<Value>,
        /// Tool definitions (`{"type": "function", "function": {"name", ...}}`).
        tools: Vec<Value>,
        tool_choice: ToolChoice,
        /// Extra template variables (`chat_template_kwargs`).
        kwargs: Map<String, Value>,
    },
    /// Text fed as is: `add_special` adds the model's BOS where it wants one, `parse_special`
    /// reads special tokens written as text.
    Text {
        text: String,
        add_special: bool,
        parse_special: bool,
    },
    /// Token ids fed as is.
    Ids(Vec<u32>),
}

impl Prompt {
    /// One user message through the chat template.
    pub fn user(text: &str) -> Prompt {
        Prompt::Chat {
            messages: vec![serde_json::json!({"role": "user", "content": text})],
            tools: Vec::new(),
            tool_choice: ToolChoice::Auto,
            kwargs: Map::new(),
        }
    }
}

/// One generation request.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub prompt: Prompt,
    pub settings: Settings,
    /// What the answer must be (JSON, a schema, a grammar); free by default.
    pub format: AnswerFormat,
}

/// A request made ready for a [`super::Generation`].
#[derive(Debug, Clone, PartialEq)]
pub struct Prepared {
    pub prompt: Vec<u32>,
    /// How the answer is routed (chat prompts); `None`: all of it is content.
    pub router: Option<RouterConfig>,
    /// Text the answer is taken to begin with (a forced tool call's opening, which ends the
    /// prompt), routed before the first token.
    pub opening: Option<String>,
    /// One of these token sequences must start the answer (`tool_choice: "required"`: the
    /// declared tool names).
    pub must_start: Vec<Vec<u32>>,
    /// The grammar the answer is held to (`response_format`, `grammar`, or a forced tool
    /// call's arguments), compiled; it replaces `must_start` where both would apply.
    pub constraint: Option<Constraint>,
    /// Under `tool_choice: "auto"`: what holds a tool call to its schema once the answer has
    /// begun one (see [`LazyCalls`]).
    pub lazy_calls: Option<LazyCalls>,
}

impl Prepared {
    /// Token ids fed as is, with nothing to route.
    pub fn ids(prompt: Vec<u32>) -> Self {
        Prepared {
            prompt,
            router: None,
            opening: None,
            must_start: Vec::new(),
            constraint: None,
            lazy_calls: None,
        }
    }
}

/// The names of the `tools` a `tool_choice` leaves (none: no tools; a named one: that one),
/// checked: each tool a function with a name, a named choice among them, `required` or a
/// named choice with at least one tool.
pub fn tool_names(tools: &[Value], choice: &ToolChoice) -> Result<Vec<String>, super::error::EngineError> {
    let invalid = |param: String, problem: String| super::error::EngineError::Invalid { param, problem };
    let mut names = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(invalid(
                format!("tools[{i}].type"),
                format!("tools[{i}].type must be \"function\""),
            ));
        }
        let name = t.pointer("/function/name").and_then(Value::as_str).ok_or_else(|| {
            invalid(
                format!("tools[{i}].function.name"),
                format!("tools[{i}] needs a function name"),
            )
        })?;
        names.push(name.to_string());
    }
    let forcing = matches!(choice, ToolChoice::Required | ToolChoice::Named(_));
    if forcing && names.is_empty() {
        return Err(invalid(
            "tool_choice".into(),
            "tool_choice \"required\" or a named function needs at least one tool in `tools`".into(),
        ));
    }
    match choice {
        ToolChoice::Auto | ToolChoice::Required => Ok(names),
        ToolChoice::None => Ok(Vec::new()),
        ToolChoice::Named(name) if names.contains(name) => Ok(vec![name.clone()]),
        ToolChoice::Named(name) => Err(invalid(
            "tool_choice".into(),
            format!("tool_choice names the function {name:?}, which is not among the declared tools"),
        )),
    }
}
