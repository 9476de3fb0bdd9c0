//! STUB: tokenizers (being written).

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("tokenizer: {0}")]
    Other(String),
}
