//! OpenAI's embeddings shape (`POST /v1/embeddings`), for the server and the browser package:
//! the request's inputs checked and tokenized, the answer's list of vectors (floats, or base64
//! of little-endian f32 as the official clients ask by default) and usage.

use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};

use super::OpenAiError;
use crate::engine::{Embedding, Pooling};
use crate::tokenizer::Tokenizer;

/// Most inputs one request may hold (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;

/// Body of `POST /v1/embeddings`.
#[derive(Debug, Deserialize)]
pub struct EmbeddingsRequest {
    pub input: Input,
    #[serde(default)]
    pub model: Option<String>,
    /// `float` (the default) or `base64`.
    #[serde(default)]
    pub encoding_format: Option<String>,
    #[serde(default)]
    pub dimensions: Option<u64>,
    #[serde(default)]
    pub user: Option<String>,
}

/// `input`: a text, texts, a token array or token arrays.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Input {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

/// How the vectors are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Float,
    Base64,
}

/// A checked request: each input's tokens, and how to answer.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbeddingsJob {
    pub inputs: Vec<Vec<u32>>,
    pub encoding: Encoding,
}

/// What the model and server allow.
#[derive(Debug, Clone, Copy)]
pub struct EmbeddingLimits {
    pub n_vocab: usize,
    pub n_embd: usize,
    /// Most tokens per input.
    pub n_ctx: usize,
    pub pooling: Pooling,
}

impl EmbeddingsRequest {
    /// Check the request against `limits` and tokenize its texts (with the model's special
    /// tokens, as llama.cpp does).
    pub fn prepare(&self, tokenizer: &Tokenizer, limits: EmbeddingLimits) -> Result<EmbeddingsJob, OpenAiError> {
        if matches!(limits.pooling, Pooling::None | Pooling::Rank) {
            return Err(OpenAiError::bad_request(format!(
                "this server pools embeddings by '{}', which gives no single vector per input; start it with \
                 --pooling mean, cls or last",
                limits.pooling.name()
            )));
        }
        let encoding = match self.encoding_format.as_deref() {
            None | Some("float") => Encoding::Float,
            Some("base64") => Encoding::Base64,
            Some(other) => {
                return Err(OpenAiError::bad_param(
                    "encoding_format",
                    format!("unknown encoding_format '{other}' (expected float or base64)"),
                ))
            }
        };
        if let Some(d) = self.dimensions.filter(|&d| d != limits.n_embd as u64) {
            return Err(OpenAiError::bad_param(
                "dimensions",
                format!(
                    "this model returns {}-dimensional vectors and was not trained to shorten them; \
                     {d} dimensions cannot be given",
                    limits.n_embd
                ),
            ));
        }
        let inputs: Vec<Vec<u32>> = match &self.input {
            Input::Text(t) => vec![text_tokens(tokenizer, t, 0)?],
            Input::Texts(ts) => ts
                .iter()
                .enumerate()
                .map(|(i, t)| text_tokens(tokenizer, t, i))
                .collect::<Result<_, _>>()?,
            Input::Tokens(ids) => vec![ids.clone()],
            Input::TokenLists(lists) => lists.clone(),
        };
        if inputs.is_empty() {
            return Err(OpenAiError::bad_param(
                "input",
                "input must hold at least one text or token array",
            ));
        }
        if inputs.len() > MAX_INPUTS {
            return Err(OpenAiError::bad_param(
                "input",
                format!(
                    "{} inputs, more than the {MAX_INPUTS} one request may hold",
                    inputs.len()
                ),
            ));
        }
        for (i, ids) in inputs.iter().enumerate() {
            if ids.is_empty() {
                return Err(OpenAiError::bad_param(
                    &format!("input[{i}]"),
                    "an input must not be empty",
                ));
            }
            if let Some(bad) = ids.iter().find(|&&id| id as usize >= limits.n_vocab) {
                return Err(OpenAiError::bad_param(
                    &format!("input[{i}]"),
                    format!("token id {bad} is outside the vocabulary ({} tokens)", limits.n_vocab),
                ));
            }
            if ids.len() > limits.n_ctx {
                return Err(OpenAiError::bad_param(
                    &format!("input[{i}]"),
                    format!(
                        "input {i} has {} tokens, more than the {} an input may have",
                        ids.len(),
                        limits.n_ctx
                    ),
                )
                .with_code("context_length_exceeded"));
            }
        }
        Ok(EmbeddingsJob { inputs, encoding })
    }
}

fn text_tokens(tokenizer: &Tokenizer, text: &str, i: usize) -> Result<Vec<u32>, OpenAiError> {
    if text.is_empty() {
        return Err(OpenAiError::bad_param(
            &format!("input[{i}]"),
            "an input must not be empty",
        ));
    }
    Ok(tokenizer.encode(text, true, true))
}

/// The answer: `{"object": "list", "data": [{"object": "embedding", "index", "embedding"}],
/// "model", "usage": {"prompt_tokens", "total_tokens"}}`.
pub fn embeddings_json(embeddings: &[Embedding], encoding: Encoding, model: &str) -> Value {
    let tokens: usize = embeddings.iter().map(|e| e.tokens).sum();
    let data: Vec<Value> = embeddings
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let vector = match encoding {
                Encoding::Float => json!(e.vector),
                Encoding::Base64 => {
                    let bytes: Vec<u8> = e.vector.iter().flat_map(|v| v.to_le_bytes()).collect();
                    json!(base64::engine::general_purpose::STANDARD.encode(bytes))
                }
            };
            json!({"object": "embedding", "index": i, "embedding": vector})
        })
        .collect();
    json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })
}
