//! The settings of one answer besides its prompt, shared by the request that carries them and
//! the generation that follows them.

use crate::sample::SamplerConfig;

/// The settings of one answer besides its prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub sampler: SamplerConfig,
    /// Most tokens to generate (`None`: until the context is full).
    pub max_tokens: Option<usize>,
    /// Alternatives to report per token (`None`: no logprobs; `Some(0)`: the token's alone).
    pub logprobs: Option<usize>,
    pub stop: Vec<String>,
    /// `false` keeps only the first tool call of the answer.
    pub parallel_tool_calls: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            sampler: SamplerConfig::default(),
            max_tokens: None,
            logprobs: None,
            stop: Vec::new(),
            parallel_tool_calls: true,
        }
    }
}
