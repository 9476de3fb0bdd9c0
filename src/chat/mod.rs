//! Chat formatting: turning OpenAI-style messages into the prompt text a model was trained on.
//!
//! [`ChatTemplate`] renders the Jinja template stored in the GGUF (`tokenizer.chat_template`)
//! with minijinja configured like Hugging Face's Python `jinja2`, or a built-in template for
//! the model's [`Family`] when the file has none.

mod fallback;
mod json;
pub mod router;
mod template;
pub mod tools;

pub use fallback::Family;
pub use template::{
    ChatTemplate, RenderRequest, FUEL, MAX_OUTPUT_BYTES, MAX_RANGE_ITEMS, RECURSION_LIMIT, RESERVED_VARIABLES,
};

/// Errors from compiling or rendering a chat template; limits say which one was hit.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("chat template syntax error at line {line}: {detail}")]
    Syntax { line: usize, detail: String },
    #[error("chat template error{}: {detail}", line.map(|l| format!(" at line {l}")).unwrap_or_default())]
    Render { line: Option<usize>, detail: String },
    #[error("chat template raised an exception: {0}")]
    Raised(String),
    #[error("chat template ran out of fuel: more than {fuel} units of instructions and data (limit against endless loops and runaway strings)")]
    OutOfFuel { fuel: u64 },
    #[error("chat template exceeded the recursion limit of {limit}")]
    RecursionLimit { limit: usize },
    #[error("chat template output exceeds the limit of {limit} bytes")]
    OutputTooLarge { limit: usize },
    #[error("chat template range() of {len} items exceeds the limit of {limit} items")]
    RangeTooLarge { len: u128, limit: usize },
    #[error("chat_template_kwargs.{name} is not allowed: the request itself sets it")]
    ReservedKwarg { name: String },
    #[error(transparent)]
    Gguf(#[from] crate::gguf::GgufError),
}
