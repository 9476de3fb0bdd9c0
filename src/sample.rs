//! STUB: sampler (being written).

#[derive(Debug, thiserror::Error)]
pub enum SamplerError {
    #[error("sampler: {0}")]
    Other(String),
}
