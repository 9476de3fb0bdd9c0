//! OpenAI error objects: every failure the server reports, whatever its cause, reaches the
//! client as `{"error": {"message", "type", "param", "code"}}` with a matching HTTP status.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error answered to the client.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `authentication_error`, `server_error`...
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds for a `Retry-After` header (overload).
    pub retry_after: Option<u32>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// 400: something in the request is wrong.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 about one field.
    pub fn bad_param(param: &str, message: impl Into<String>) -> Self {
        ApiError {
            param: Some(param.to_string()),
            ..Self::bad_request(message)
        }
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "invalid or missing API key: send `Authorization: Bearer <key>`",
        )
        .with_code("invalid_api_key")
    }

    /// 403: a web page from an origin the server does not allow.
    pub fn forbidden_origin(origin: &str) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "permission_error",
            format!(
                "requests from the web origin {origin:?} are not allowed: start the server with \
                 --cors-origin {origin} (or --cors-origin '*') to allow it"
            ),
        )
        .with_code("origin_not_allowed")
    }

    pub fn not_found(path: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found_error", format!("no route for {path}")).with_code("not_found")
    }

    /// 404 for a thing the request names (a stored response, a model).
    pub fn not_found_message(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", message)
    }

    /// 404 for a `model` the server does not serve, naming the ones it does (as OpenAI's
    /// `model_not_found`).
    pub fn model_not_found(name: &str, known: &[&str]) -> Self {
        ApiError {
            param: Some("model".into()),
            ..Self::not_found_message(format!(
                "the model '{name}' does not exist on this server; it serves: {}",
                known.join(", ")
            ))
            .with_code("model_not_found")
        }
    }

    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "method not allowed on this route",
        )
    }

    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("request body exceeds the limit of {limit} bytes"),
        )
        .with_code("request_too_large")
    }

    /// 503: every slot is busy and the queue is full.
    pub fn overloaded(queue: usize) -> Self {
        ApiError {
            retry_after: Some(1),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                format!("the server is busy: all slots are in use and {queue} requests are already waiting"),
            )
            .with_code("overloaded")
        }
    }

    /// 503 while the model loads or the server drains: try again (elsewhere) in a second.
    pub fn unavailable(message: impl Into<String>, code: &'static str) -> Self {
        ApiError {
            retry_after: Some(1),
            ..Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message).with_code(code)
        }
    }

    /// 500: our fault, not the client's.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl ApiError {
    /// The body in Anthropic's error shape: `{"type": "error", "error": {"type", "message"}}`,
    /// the type named by the status as Anthropic names it.
    pub fn anthropic_body(&self) -> serde_json::Value {
        let kind = match self.status.as_u16() {
            400 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 => "overloaded_error",
            _ => "api_error",
        };
        let message = match &self.param {
            Some(p) if !self.message.contains(p.as_str()) => format!("{p}: {}", self.message),
            _ => self.message.clone(),
        };
        json!({"type": "error", "error": {"type": kind, "message": message}})
    }

    /// This error answered in Anthropic's shape (same status and headers).
    pub fn into_anthropic(self) -> Response {
        let mut r = self.clone().into_response();
        *r.body_mut() = axum::body::Body::from(self.anthropic_body().to_string());
        r
    }
}

/// A request the OpenAI layer refuses: 400 with its parameter and code.
impl From<tinyllm::openai::OpenAiError> for ApiError {
    fn from(e: tinyllm::openai::OpenAiError) -> Self {
        ApiError {
            param: e.param,
            code: e.code,
            ..ApiError::bad_request(e.message)
        }
    }
}

impl ApiError {
    /// An engine error: the request's fault (400, `prompt_param` naming where the prompt came
    /// from) or the server's (500).
    pub fn engine(e: tinyllm::engine::EngineError, prompt_param: &str) -> Self {
        match tinyllm::openai::OpenAiError::from_engine(e, prompt_param) {
            Ok(bad) => bad.into(),
            Err(e) => ApiError::internal(e.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        resp
    }
}
