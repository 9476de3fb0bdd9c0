//! The routes that start an answer, named once for the router and the drain
//! ([`super::lifecycle`]).

/// The routes that start an answer (POST), with and without the `/v1` prefix; a drain refuses
/// new requests on these ([`lifecycle`]).
pub const CHAT_PATHS: [&str; 2] = ["/v1/chat/completions", "/chat/completions"];
pub const COMPLETION_PATHS: [&str; 2] = ["/v1/completions", "/completions"];
pub const EMBEDDING_PATHS: [&str; 2] = ["/v1/embeddings", "/embeddings"];
pub const MESSAGES_PATHS: [&str; 2] = ["/v1/messages", "/messages"];
pub const RESPONSES_PATHS: [&str; 2] = ["/v1/responses", "/responses"];
