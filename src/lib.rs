//! tinyllm: one engine for running GGUF language models everywhere.
//!
//! Every target (the native CLI and server, the browser package) shares all of it:
//! - the lower floors: the GGUF loader ([`gguf`]), tensor formats ([`quant`]), tokenizers
//!   ([`tokenizer`]), chat-template rendering and answer routing ([`chat`]), the sampler
//!   ([`sample`]);
//! - [`backend`]: the compute interface and its implementations (CPU with run-time SIMD,
//!   WebGPU through wgpu), and [`backend::AnyBackend`], the one dispatch over them;
//! - [`model`]: one module per architecture family and the per-sequence state it keeps;
//! - [`engine`]: sessions and the generation pipeline (template to usage);
//! - [`openai`]: the OpenAI API's request and response shapes;
//! - [`anthropic`]: Anthropic's Messages API, translated onto the OpenAI chat path.
//!
//! The modules above the lower floors import each other one way only: `backend` <- `model` <-
//! `engine` <- `openai` <- `anthropic` (`tests/module_graph.rs` checks it). Builds for native targets and
//! for `wasm32-unknown-unknown` (WebGPU through the browser).

pub mod anthropic;
pub mod backend;
pub mod chat;
pub mod engine;
mod error;
pub mod gguf;
pub mod grammar;
pub mod model;
pub mod openai;
pub mod quant;
pub mod sample;
pub mod tokenizer;

pub use error::Error;
