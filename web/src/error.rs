//! Errors as the JavaScript side receives them: an `Error` with a machine-readable `code`
//! (and the offending request field in `param`), so the package can throw a typed
//! `TinyLLMError` and a page can tell a missing file from a full context.

use tinyllm::backend::BackendError;
use tinyllm::engine::EngineError;
use tinyllm::gguf::GgufError;
use tinyllm::model::ModelError;
use tinyllm::openai::OpenAiError;
use wasm_bindgen::JsValue;

/// One failure, with its code.
#[derive(Debug)]
pub struct WebError {
    pub code: &'static str,
    pub message: String,
    pub param: Option<String>,
}

impl WebError {
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        WebError {
            code,
            message: message.into(),
            param: None,
        }
    }

    /// A file that is not a usable GGUF model.
    pub fn gguf(e: GgufError) -> Self {
        let code = match &e {
            GgufError::BadMagic { .. } => "NOT_GGUF",
            // A file cut short shows as tensors whose data lies past its end.
            GgufError::Truncated { .. } | GgufError::Stream(_) | GgufError::TensorOutOfBounds { .. } => "TRUNCATED",
            _ => "BAD_GGUF",
        };
        WebError::new(code, e.to_string())
    }

    pub fn model(e: ModelError) -> Self {
        match e {
            ModelError::Gguf(g) => Self::gguf(g),
            ModelError::Backend(b) => Self::backend(b),
            ModelError::UnsupportedArch { .. } => WebError::new("UNSUPPORTED_ARCH", e.to_string()),
            e => WebError::new("BAD_MODEL", e.to_string()),
        }
    }

    pub fn backend(e: BackendError) -> Self {
        match e {
            BackendError::Unavailable { .. } => WebError::new("NO_WEBGPU", e.to_string()),
            BackendError::Gguf(g) => Self::gguf(g),
            BackendError::UnsupportedType { .. } | BackendError::BadTensor { .. } => {
                WebError::new("BAD_MODEL", e.to_string())
            }
            e => WebError::new("INTERNAL", e.to_string()),
        }
    }

    /// A request the API refuses (`BAD_REQUEST`, or `CONTEXT_LENGTH_EXCEEDED`).
    pub fn request(e: OpenAiError) -> Self {
        let code = match e.code {
            Some("context_length_exceeded") => "CONTEXT_LENGTH_EXCEEDED",
            _ => "BAD_REQUEST",
        };
        WebError {
            code,
            message: e.message,
            param: e.param,
        }
    }

    /// An engine error: the request's share (`prompt_param` names where the prompt came from)
    /// or the machine's.
    pub fn engine(e: EngineError, prompt_param: &str) -> Self {
        match OpenAiError::from_engine(e, prompt_param) {
            Ok(req) => Self::request(req),
            Err(EngineError::Model(m)) => Self::model(m),
            Err(EngineError::Backend(b)) => Self::backend(b),
            Err(e) => WebError::new("INTERNAL", e.to_string()),
        }
    }

    /// Any engine-library error (loading: the tokenizer, the template).
    pub fn lib(e: tinyllm::Error) -> Self {
        match e {
            tinyllm::Error::Model(m) => Self::model(m),
            tinyllm::Error::Gguf(g) => Self::gguf(g),
            e => WebError::new("BAD_MODEL", e.to_string()),
        }
    }
}

impl From<WebError> for JsValue {
    fn from(e: WebError) -> JsValue {
        let err = js_sys::Error::new(&e.message);
        let set = |k: &str, v: JsValue| {
            let _ = js_sys::Reflect::set(&err, &JsValue::from_str(k), &v);
        };
        set("code", JsValue::from_str(e.code));
        if let Some(p) = &e.param {
            set("param", JsValue::from_str(p));
        }
        err.into()
    }
}
