//! OpenAI's API shapes, shared by every front end that speaks it (the HTTP server, the
//! browser package): requests parsed and checked into an engine [`crate::engine::Request`]
//! ([`request`]; embeddings in [`embeddings`]), answers shaped into completion objects and stream chunks ([`response`]).
//! Transport (HTTP, SSE, JS) stays with the front ends.

pub mod embeddings;
pub mod request;
pub mod response;
pub mod responses;

pub use request::{parse_body, parse_json, parse_value, unix_now, GenRequest};
pub use response::{usage_json, Answer, ChatChunks, Chunks, CompletionChunks, Meta};

use crate::engine::EngineError;

/// A request the API refuses, as OpenAI reports it: a message, the offending parameter and a
/// machine-readable code where there is one.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct OpenAiError {
    pub message: String,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl OpenAiError {
    /// Something in the request is wrong.
    pub fn bad_request(message: impl Into<String>) -> Self {
        OpenAiError {
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// One field is wrong.
    pub fn bad_param(param: &str, message: impl Into<String>) -> Self {
        OpenAiError {
            param: Some(param.to_string()),
            ..Self::bad_request(message)
        }
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// The request's share of an engine error (`prompt_param`: where the prompt came from,
    /// `messages` or `prompt`), or the error back when the machine, not the request, failed.
    pub fn from_engine(e: EngineError, prompt_param: &str) -> Result<Self, EngineError> {
        Ok(match e {
            EngineError::Invalid { param, problem } => Self::bad_param(&param, problem),
            EngineError::PromptTooLong { .. } => {
                Self::bad_param(prompt_param, e.to_string()).with_code("context_length_exceeded")
            }
            EngineError::Template(t @ crate::chat::TemplateError::ReservedKwarg { .. }) => {
                Self::bad_param("chat_template_kwargs", t.to_string())
            }
            EngineError::Template(t) => Self::bad_param(prompt_param, format!("cannot apply the chat template: {t}")),
            EngineError::EmptyInput => Self::bad_param(prompt_param, "the prompt is empty"),
            EngineError::TokenOutOfRange { .. } => Self::bad_param(prompt_param, e.to_string()),
            e if e.is_input() => Self::bad_request(e.to_string()),
            e => return Err(e),
        })
    }
}
