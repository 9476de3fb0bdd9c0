//! The WebGPU device layer: the shared GPU backend ([`crate::backend::gpu::GpuBackend`]) runs its kernels through
//! wgpu here (Vulkan, Metal, DX12 natively, Mesa lavapipe in CI; the browser's WebGPU on
//! wasm32). What is here is device plumbing: opening a device, making pipelines, binding
//! buffers to a [`crate::backend::gpu::Dispatch`] and recording it, and reading results back.
//!
//! On CPU adapters (Mesa lavapipe) matrices live in textures and matmuls read their
//! activations from a uniform buffer ([`MatmulVariant::Texture`], chosen by the shared layer
//! from [`crate::backend::gpu::Caps::cpu`]): lavapipe runs each invocation as a SIMD lane and loads a storage buffer
//! one lane at a time, about 7.5 ns per 32-bit word and invocation on the CI machine against
//! about 1 ns per word for a texel fetch and 0.6 ns for a uniform load, which made matmuls cost
//! about 20 ns per multiply-add there.
//!
//! Ops are recorded into one pending command encoder ([`recorder`]) and submitted when data
//! must come back ([`crate::backend::gpu::Device::read`]) or [`WebGpuBackend::flush`] is called: one submission and
//! one readback per forward pass. A readback is a [`crate::backend::Readback`] future ([`mapped`]): native
//! callers wait on it, the browser awaits it. Pipelines are compiled once per kernel variant
//! and bind groups once per set of bindings (`recorder`), then reused.

mod context;
mod layer;
mod mapped;
mod recorder;

#[cfg(not(target_arch = "wasm32"))]
pub use context::list_adapters;
pub use context::{AdapterReport, WebGpuError};
pub use layer::{WebGpu, WebGpuBackend, WebGpuBuffer, WebGpuKv, WebGpuOptions, WebGpuWeight, WeightWriter};
pub use recorder::Counters;
pub use recorder::{WgpuBuf, WgpuImage};
/// The wgpu this backend is built on (front ends that reach the device use the same one).
pub use wgpu;

pub use crate::backend::gpu::kernels;
pub use crate::backend::gpu::sizes::KV_CHUNK;
pub use crate::backend::gpu::strategy::MatmulVariant;
