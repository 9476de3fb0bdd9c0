//! OpenAI request shapes (serde) and the checks that turn them into an engine [`Request`].
//!
//! Bodies are parsed in two steps: JSON syntax first ("invalid JSON"), then the typed shape
//! through `serde_path_to_error`, so a wrongly typed field is reported by its path
//! (`messages[1].content`), not by a byte offset.

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::OpenAiError as ApiError;
use crate::chat::tools::ToolChoice as ToolMode;
use crate::engine::{Prompt, Request, Settings};
use crate::grammar::AnswerFormat;
use crate::sample::{SamplerConfig, SamplerError};

/// Parse a request body: syntax, then the typed shape (errors name the field).
pub fn parse_body<T: DeserializeOwned>(body: &[u8]) -> Result<(T, Value), ApiError> {
    parse_value(parse_json(body)?)
}

/// The body as JSON, untyped (the endpoints that translate a request before parsing it).
pub fn parse_json(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
}

/// [`parse_body`] of a value already parsed (the browser's request objects).
pub fn parse_value<T: DeserializeOwned>(value: Value) -> Result<(T, Value), ApiError> {
    if !value.is_object() {
        return Err(ApiError::bad_request("the request body must be a JSON object"));
    }
    let typed = serde_path_to_error::deserialize(&value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." {
            // A missing field: serde's message names it.
            ApiError::bad_request(inner.to_string())
        } else {
            ApiError::bad_param(&path, format!("{path}: {inner}"))
        }
    })?;
    Ok((typed, value))
}

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged, expecting = "a string or a list of strings")]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

/// Message `content`: a string or a list of parts.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged, expecting = "a string, a list of content parts, or null")]
pub enum Content {
    // Typed to check the request; the template reads the raw JSON.
    #[allow(dead_code)]
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

/// Typed to check the request (fields by name in errors); the template reads the raw JSON.
#[allow(dead_code)]
#[derive(Debug, Clone, Deserialize)]
pub struct Message {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    #[serde(default)]
    pub tool_calls: Option<Vec<Value>>,
    #[serde(default)]
    pub tool_call_id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub reasoning_content: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct FunctionDef {
    pub name: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Tool {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionDef,
}

/// `tool_choice`: `"auto" | "none" | "required"` or `{"type": "function", "function": {"name"}}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(
    untagged,
    expecting = "\"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}"
)]
pub enum ToolChoice {
    Mode(String),
    Named { function: FunctionDef },
}

#[derive(Debug, Clone, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// Chat's `logprobs: bool` and the legacy completions' `logprobs: <count>`.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(untagged, expecting = "a boolean (chat) or a count (completions)")]
pub enum Logprobs {
    On(bool),
    Count(u32),
}

/// The prompt of `/v1/completions`: text, one text in a list, or token ids.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged, expecting = "a string, a list with one string, or a list of token ids")]
pub enum PromptField {
    Text(String),
    Ids(Vec<u32>),
    Texts(Vec<String>),
}

/// The fields of `/v1/chat/completions` and `/v1/completions` (one shape: most are shared).
#[derive(Debug, Clone, Deserialize)]
pub struct GenRequest {
    /// Accepted and ignored: the server runs one model.
    #[allow(dead_code)]
    pub model: Option<String>,
    pub messages: Option<Vec<Message>>,
    pub prompt: Option<PromptField>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub max_tokens: Option<u32>,
    pub max_completion_tokens: Option<u32>,
    pub n_predict: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub logprobs: Option<Logprobs>,
    pub top_logprobs: Option<u32>,
    pub tools: Option<Vec<Tool>>,
    pub tool_choice: Option<ToolChoice>,
    /// See [`GenRequest::parallel_tool_calls`].
    pub parallel_tool_calls: Option<bool>,
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// OpenAI's reasoning effort; see [`template_kwargs`].
    pub reasoning_effort: Option<String>,
    pub n: Option<u32>,
    /// `{"type": "text" | "json_object" | "json_schema", "json_schema": {...}}`.
    pub response_format: Option<Value>,
    /// A Lark grammar (llguidance's dialect) the answer must follow.
    pub grammar: Option<String>,
    pub echo: Option<bool>,
}

/// Most stop strings per request (OpenAI allows 4).
pub const MAX_STOP: usize = 16;
/// Most alternatives per token (OpenAI allows 20).
pub const MAX_TOP_LOGPROBS: u32 = 20;

impl GenRequest {
    /// Refuse what we do not implement, by name, instead of silently ignoring it.
    pub fn reject_unsupported(&self) -> Result<(), ApiError> {
        if self.n.is_some_and(|n| n != 1) {
            return Err(ApiError::bad_param(
                "n",
                "n other than 1 is not supported: send one request per choice",
            ));
        }
        if self.echo == Some(true) {
            return Err(ApiError::bad_param("echo", "echo is not supported"));
        }
        Ok(())
    }

    /// Stop strings (empty ones dropped).
    pub fn stop_strings(&self) -> Result<Vec<String>, ApiError> {
        let list = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        if list.len() > MAX_STOP {
            return Err(ApiError::bad_param(
                "stop",
                format!("at most {MAX_STOP} stop strings are supported"),
            ));
        }
        Ok(list.into_iter().filter(|s| !s.is_empty()).collect())
    }

    /// Requested generation budget, if any (`max_completion_tokens`, `max_tokens`, llama.cpp's
    /// `n_predict`; -1 there means "no limit").
    pub fn max_tokens(&self) -> Result<Option<usize>, ApiError> {
        let (name, v) = match (self.max_completion_tokens, self.max_tokens, self.n_predict) {
            (Some(v), _, _) => ("max_completion_tokens", i64::from(v)),
            (None, Some(v), _) => ("max_tokens", i64::from(v)),
            (None, None, Some(v)) if v < 0 => return Ok(None),
            (None, None, Some(v)) => ("n_predict", v),
            (None, None, None) => return Ok(None),
        };
        if v < 1 {
            return Err(ApiError::bad_param(name, format!("{name} must be at least 1")));
        }
        Ok(Some(usize::try_from(v).unwrap_or(usize::MAX)))
    }

    /// Alternatives per token; `None` when logprobs are off. Chat: `logprobs: true` plus
    /// `top_logprobs`; completions: `logprobs: <count>`.
    pub fn logprobs(&self) -> Result<Option<usize>, ApiError> {
        let k = match (self.logprobs, self.top_logprobs) {
            (None | Some(Logprobs::On(false)), Some(_)) => {
                return Err(ApiError::bad_param("top_logprobs", "top_logprobs needs logprobs: true"))
            }
            (None | Some(Logprobs::On(false)), None) => return Ok(None),
            (Some(Logprobs::On(true)), k) => k.unwrap_or(0),
            (Some(Logprobs::Count(k)), _) => k,
        };
        if k > MAX_TOP_LOGPROBS {
            return Err(ApiError::bad_param(
                "top_logprobs",
                format!("top_logprobs must be at most {MAX_TOP_LOGPROBS}"),
            ));
        }
        Ok(Some(k as usize))
    }

    /// The sampler settings: llama.cpp's defaults where the request says nothing.
    pub fn sampler(&self) -> Result<SamplerConfig, ApiError> {
        let d = SamplerConfig::default();
        let seed = match self.seed {
            Some(s) => s as u64,
            None => crate::sample::fresh_seed(),
        };
        let cfg = SamplerConfig {
            temperature: self.temperature.unwrap_or(d.temperature),
            top_k: self.top_k.map_or(d.top_k, |k| k as usize),
            top_p: self.top_p.unwrap_or(d.top_p),
            min_p: self.min_p.unwrap_or(d.min_p),
            repeat_penalty: self.repeat_penalty.unwrap_or(d.repeat_penalty),
            repeat_last_n: d.repeat_last_n,
            presence_penalty: self.presence_penalty.unwrap_or(d.presence_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(d.frequency_penalty),
            seed,
        };
        cfg.validate().map_err(|e| match &e {
            SamplerError::Invalid { field, .. } => ApiError::bad_param(field, e.to_string()),
        })?;
        Ok(cfg)
    }

    /// `tool_choice` checked: required and named need declared tools.
    pub fn tool_mode(&self) -> Result<ToolMode, ApiError> {
        let mode = match &self.tool_choice {
            None => ToolMode::Auto,
            Some(ToolChoice::Mode(m)) => match m.as_str() {
                "auto" => ToolMode::Auto,
                "none" => ToolMode::None,
                "required" => ToolMode::Required,
                other => {
                    return Err(ApiError::bad_param(
                        "tool_choice",
                        format!(
                            "tool_choice must be \"auto\", \"none\", \"required\" or a named function, got {other:?}"
                        ),
                    ))
                }
            },
            Some(ToolChoice::Named { function }) => ToolMode::Named(function.name.clone()),
        };
        let forcing = matches!(mode, ToolMode::Required | ToolMode::Named(_));
        if forcing && self.tools.as_ref().is_none_or(Vec::is_empty) {
            return Err(ApiError::bad_param(
                "tool_choice",
                "tool_choice \"required\" or a named function needs at least one tool in `tools`",
            ));
        }
        Ok(mode)
    }

    /// `parallel_tool_calls` (default true): false keeps only the first call of an answer.
    pub fn parallel_tool_calls(&self) -> bool {
        self.parallel_tool_calls.unwrap_or(true)
    }

    /// What the answer must be: `response_format` or `grammar` (not both).
    pub fn answer_format(&self) -> Result<AnswerFormat, ApiError> {
        let bad = |problem: String| ApiError::bad_param("response_format", problem);
        let from_rf = match &self.response_format {
            None => AnswerFormat::Free,
            Some(rf) => match rf.get("type").and_then(Value::as_str) {
                Some("text") => AnswerFormat::Free,
                Some("json_object") => match rf.get("schema") {
                    // llama-server's extension: a schema beside json_object.
                    Some(schema) => AnswerFormat::JsonSchema {
                        schema: checked_schema(schema).map_err(bad)?,
                        strict: true,
                    },
                    None => AnswerFormat::JsonObject,
                },
                Some("json_schema") => {
                    let js = rf.get("json_schema").ok_or_else(|| {
                        bad("response_format of type json_schema needs a `json_schema` object".into())
                    })?;
                    let schema = js.get("schema").ok_or_else(|| {
                        bad("response_format.json_schema needs a `schema` (a JSON schema object)".into())
                    })?;
                    let strict = match js.get("strict") {
                        None | Some(Value::Null) => true,
                        Some(Value::Bool(b)) => *b,
                        Some(other) => {
                            return Err(bad(format!(
                                "response_format.json_schema.strict must be a boolean, got {other}"
                            )))
                        }
                    };
                    AnswerFormat::JsonSchema {
                        schema: checked_schema(schema).map_err(bad)?,
                        strict,
                    }
                }
                other => {
                    return Err(bad(format!(
                        "response_format.type must be \"text\", \"json_object\" or \"json_schema\", got {}",
                        other.map_or_else(|| "nothing".to_string(), |t| format!("{t:?}"))
                    )))
                }
            },
        };
        match (&self.grammar, from_rf) {
            (None, f) => Ok(f),
            (Some(g), AnswerFormat::Free) if g.trim().is_empty() => {
                Err(ApiError::bad_param("grammar", "grammar must not be empty"))
            }
            (Some(g), AnswerFormat::Free) => Ok(AnswerFormat::Lark(g.clone())),
            (Some(_), _) => Err(ApiError::bad_param(
                "grammar",
                "send either `grammar` or a JSON `response_format`, not both",
            )),
        }
    }

    /// The generation settings (sampler, budget, logprobs, stop strings).
    pub fn settings(&self) -> Result<Settings, ApiError> {
        Ok(Settings {
            sampler: self.sampler()?,
            max_tokens: self.max_tokens()?,
            logprobs: self.logprobs()?,
            stop: self.stop_strings()?,
            parallel_tool_calls: self.parallel_tool_calls(),
        })
    }

    /// A `/v1/chat/completions` request: `raw` is the body as parsed JSON (the template reads
    /// the messages and tools as given).
    pub fn chat(&self, raw: &Value) -> Result<Request, ApiError> {
        self.reject_unsupported()?;
        let Some(messages) = &self.messages else {
            return Err(ApiError::bad_param("messages", "missing field `messages`"));
        };
        if messages.is_empty() {
            return Err(ApiError::bad_param("messages", "messages must not be empty"));
        }
        let raw_messages = raw
            .get("messages")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let tools = raw.get("tools").and_then(Value::as_array).cloned().unwrap_or_default();
        let tool_choice = self.tool_mode()?;
        Ok(Request {
            prompt: Prompt::Chat {
                messages: template_messages(messages, &raw_messages)?,
                tools,
                tool_choice,
                kwargs: template_kwargs(&self.chat_template_kwargs, self.reasoning_effort.as_deref()),
            },
            settings: self.settings()?,
            format: self.answer_format()?,
        })
    }

    /// A `/v1/completions` request: the prompt continued as is (text with the model's BOS, or
    /// token ids).
    pub fn completion(&self) -> Result<Request, ApiError> {
        self.reject_unsupported()?;
        let prompt = match &self.prompt {
            None => return Err(ApiError::bad_param("prompt", "missing field `prompt`")),
            Some(PromptField::Text(t)) => text_prompt(t.clone()),
            Some(PromptField::Texts(v)) if v.len() == 1 => text_prompt(v[0].clone()),
            Some(PromptField::Texts(_)) => {
                return Err(ApiError::bad_param(
                    "prompt",
                    "only one prompt per request is supported",
                ))
            }
            Some(PromptField::Ids(ids)) => Prompt::Ids(ids.clone()),
        };
        Ok(Request {
            prompt,
            settings: self.settings()?,
            format: self.answer_format()?,
        })
    }
}

/// A JSON schema as a request gives it: an object, or `true` (anything).
fn checked_schema(schema: &Value) -> Result<Value, String> {
    match schema {
        Value::Object(_) => Ok(schema.clone()),
        Value::Bool(true) => Ok(serde_json::json!({})),
        other => Err(format!("the JSON schema must be an object, got {other}")),
    }
}

fn text_prompt(text: String) -> Prompt {
    Prompt::Text {
        text,
        add_special: true,
        parse_special: true,
    }
}

/// The template variables of a request: `chat_template_kwargs`, with OpenAI's top-level
/// `reasoning_effort` as the `reasoning_effort` variable (gpt-oss's template reads it) or,
/// when it is `"none"`, that variable removed, as llama-server does.
pub fn template_kwargs(kwargs: &Option<Map<String, Value>>, reasoning_effort: Option<&str>) -> Map<String, Value> {
    let mut kwargs = kwargs.clone().unwrap_or_default();
    match reasoning_effort {
        Some("none") => {
            kwargs.remove("reasoning_effort");
        }
        Some(e) if !e.is_empty() => {
            kwargs.insert("reasoning_effort".into(), e.into());
        }
        _ => {}
    }
    kwargs
}

/// Messages as the template wants them: text parts joined into one string.
pub fn template_messages(messages: &[Message], raw: &[Value]) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::with_capacity(messages.len());
    for (i, (m, r)) in messages.iter().zip(raw).enumerate() {
        let mut obj = r.as_object().cloned().unwrap_or_default();
        match &m.content {
            Some(Content::Parts(parts)) => {
                let mut text = String::new();
                for (j, p) in parts.iter().enumerate() {
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(t)) => text.push_str(t),
                        ("text", None) => {
                            return Err(ApiError::bad_param(
                                &format!("messages[{i}].content[{j}].text"),
                                format!("messages[{i}].content[{j}]: a text part needs `text`"),
                            ))
                        }
                        (kind, _) => {
                            return Err(ApiError::bad_param(
                                &format!("messages[{i}].content[{j}].type"),
                                format!("messages[{i}].content[{j}]: only text parts are supported, got {kind:?}"),
                            ))
                        }
                    }
                }
                obj.insert("content".into(), Value::String(text));
            }
            Some(Content::Text(_)) => {}
            None => {
                obj.insert("content".into(), Value::Null);
            }
        }
        out.push(Value::Object(obj));
    }
    Ok(out)
}

/// The text of a content field as the newer APIs write it: a string, or a list of typed parts
/// whose `type` is one of `kinds`, each with `text`, joined by `sep`; null is empty. Anything
/// else (an image, a part without text) is an error naming the part: the models tinyllm runs
/// read text.
pub fn text_of_parts(v: &Value, param: &str, kinds: &[&str], sep: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        Value::Array(parts) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, p) in parts.iter().enumerate() {
                let kind = p["type"].as_str().unwrap_or("no type");
                if !kinds.contains(&kind) {
                    return Err(ApiError::bad_param(
                        &format!("{param}[{j}].type"),
                        format!(
                            "{kind} parts are not supported here (expected {}): the models tinyllm runs read text",
                            kinds.join(" or ")
                        ),
                    ));
                }
                let text = p["text"].as_str().ok_or_else(|| {
                    ApiError::bad_param(&format!("{param}[{j}].text"), format!("a {kind} part needs `text`"))
                })?;
                texts.push(text);
            }
            Ok(texts.join(sep))
        }
        _ => Err(ApiError::bad_param(param, "expected a string or a list of text parts")),
    }
}

/// Body of `POST /tokenize`.
#[derive(Debug, Deserialize)]
pub struct TokenizeRequest {
    pub content: String,
    #[serde(default)]
    pub add_special: bool,
    #[serde(default = "yes")]
    pub parse_special: bool,
    #[serde(default)]
    pub with_pieces: bool,
}

fn yes() -> bool {
    true
}

/// Body of `POST /detokenize`.
#[derive(Debug, Deserialize)]
pub struct DetokenizeRequest {
    pub tokens: Vec<u32>,
}

/// Body of `POST /apply-template`.
#[derive(Debug, Deserialize)]
pub struct ApplyTemplateRequest {
    pub messages: Vec<Message>,
    /// Typed to check the request; the template reads the raw JSON.
    #[allow(dead_code)]
    pub tools: Option<Vec<Tool>>,
    pub chat_template_kwargs: Option<Map<String, Value>>,
    pub reasoning_effort: Option<String>,
    pub add_generation_prompt: Option<bool>,
}

/// Seconds since the Unix epoch (OpenAI's `created`).
pub fn unix_now() -> u64 {
    web_time::SystemTime::now()
        .duration_since(web_time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}
