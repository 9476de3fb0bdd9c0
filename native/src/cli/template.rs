//! `template`: render the model's chat template (or its built-in fallback) for messages.

use super::io::{open_model, print_text, read_json_file};
use crate::error::InputError;
use std::path::PathBuf;
use tinyllm::chat::{ChatTemplate, RenderRequest};

#[derive(clap::Args)]
pub struct Args {
    /// Model path or alias.
    #[arg(short, long, default_value = "qwen2.5-coder:0.5b")]
    model: String,
    /// JSON file with an OpenAI-style `messages` array (or an object with a `messages` key).
    #[arg(long)]
    messages: PathBuf,
    /// JSON file with an OpenAI-style `tools` array.
    #[arg(long)]
    tools: Option<PathBuf>,
    /// Do not append the assistant turn opener.
    #[arg(long)]
    no_generation_prompt: bool,
    /// Extra template variables as a JSON object, e.g. '{"enable_thinking": false}'.
    #[arg(long)]
    kwargs: Option<String>,
    /// Print the text as one JSON string (byte-exact).
    #[arg(long)]
    json: bool,
}

fn array_field(v: serde_json::Value, key: &str, what: &str) -> Result<Vec<serde_json::Value>, InputError> {
    match v {
        serde_json::Value::Array(a) => Ok(a),
        serde_json::Value::Object(mut o) => match o.remove(key) {
            Some(serde_json::Value::Array(a)) => Ok(a),
            _ => Err(InputError(format!(
                "{what}: expected an array or an object with a '{key}' array"
            ))),
        },
        _ => Err(InputError(format!(
            "{what}: expected an array or an object with a '{key}' array"
        ))),
    }
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let messages = array_field(read_json_file(&a.messages, "messages")?, "messages", "messages file")?;
    let tools = match &a.tools {
        Some(p) => Some(array_field(read_json_file(p, "tools")?, "tools", "tools file")?),
        None => None,
    };
    let kwargs = match &a.kwargs {
        None => serde_json::Map::new(),
        Some(s) => match serde_json::from_str(s) {
            Ok(serde_json::Value::Object(m)) => m,
            _ => return Err(InputError(format!("--kwargs must be a JSON object, got: {s}")).into()),
        },
    };
    let file = open_model(&a.model)?;
    let template = ChatTemplate::from_gguf(&file)?;
    let text = template.render(&RenderRequest {
        messages: &messages,
        tools: tools.as_deref(),
        add_generation_prompt: !a.no_generation_prompt,
        kwargs: &kwargs,
    })?;
    print_text(&text, a.json)
}
