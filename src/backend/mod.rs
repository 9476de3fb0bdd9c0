//! The compute backend interface the model graphs are written against.
//!
//! A backend owns device memory (activation buffers, KV storage, placed weights) and runs fused
//! ops on it. Ops take buffers and return nothing but errors, so a GPU backend can record them
//! into one command buffer per forward pass; only [`Backend::read`], [`Backend::argmax`] and
//! [`Backend::top_k`] bring data back to the host, as a [`Readback`] (a future: the browser's
//! event loop must not block on the device; native callers wait on it). Shapes are passed
//! explicitly; buffers may be larger than an op needs (scratch sized for the biggest chunk).
//!
//! The trait has no default methods, so a backend (and the dispatch over them, [`any`]) must
//! implement every op: nothing falls back silently to a slower generic path.
//!
//! Op parameters live here with the ops: [`rope`] (rope kinds and scalings), [`attn`]
//! (attention of a batch of sequences), [`kv`] (the KV cache formats), [`moe`] (routed
//! experts), [`recurrent`] (the gated-delta-net layers' conv, gates, delta rule and gated
//! norm), and [`checks`] (the argument checks every backend runs). Implementations: [`cpu`]
//! (SIMD kernels chosen at run time beside scalar ones, a persistent thread pool) and
//! [`webgpu`] (WGSL kernels through wgpu); natively, `vulkan` (the same kernels as SPIR-V
//! through ash).

pub mod any;
pub mod attn;
pub mod checks;
pub mod cpu;
pub mod error;
pub mod gpu;
pub mod interface;
pub mod kv;
pub mod moe;
pub mod readback;
pub mod recurrent;
pub mod rope;
pub mod rotation;
pub mod sync;
#[cfg(not(target_arch = "wasm32"))]
pub mod vulkan;
#[cfg(tinyllm_webgpu)]
pub mod webgpu;

pub use any::{AnyBackend, AnyWeight, BackendKind};
pub use attn::{AttnParams, SeqAttn, MAX_HEAD_DIM};
pub use error::BackendError;
pub use interface::Backend;
pub use kv::KvType;
pub use moe::{Gating, MatId, Route, Strided};
pub use readback::{MaybeSend, Readback};
pub use recurrent::{Conv, DeltaNet, Form, KeyHeads, SeqRows};
pub use rope::{Rope, RopeKind, RopeScaling, Yarn};
