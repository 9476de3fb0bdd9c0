//! Anthropic's Messages API shapes, for the server's `POST /v1/messages` and
//! `/v1/messages/count_tokens`: a request is translated into the OpenAI chat request the engine
//! already runs ([`request`]), so templates, tool-call forcing, the lazy grammar and the lenient
//! call parsing are the chat path's; the answer's steps are shaped into a `message` or
//! Anthropic's event stream ([`response`]). Transport (HTTP, SSE framing) stays with the server.

pub mod request;
pub mod response;

pub use request::{to_chat_request, Purpose};
pub use response::{message_json, stop_reason, MessageChunks, MessageMeta};
