//! The Vulkan backend's device layer (ash, native targets only): the second device layer
//! under the shared GPU layer ([`super::gpu`]), beside wgpu. It exists for what WebGPU cannot
//! ask a driver for: a required subgroup size (wave64 on AMD), integer dot products,
//! cooperative matrices, f16 where wgpu's feature set does not expose it, timestamps per pass,
//! and a pipeline cache on disk. The kernels are the same WGSL the WebGPU backend runs,
//! compiled to SPIR-V by naga at build time ([`spirv`]), so the two backends cannot drift.
//!
//! Layout, one concern per file:
//! - [`device`]: the loader and instance, each physical device described as plain data
//!   ([`DeviceInfo`]), the specializations the backend would use on it
//!   ([`Specializations`], a pure function of the description), device choice ([`pick`]) and
//!   the logical device with its compute queue ([`Device`]);
//! - [`spirv`]: the embedded SPIR-V of every kernel variant, with entry points and bindings;
//! - [`pipeline`]: a compute pipeline (shader module, descriptor set layouts, pipeline layout)
//!   for one entry point of one variant, with the subgroup size it requires.
//!
//! - [`memory`]: buffers sub-allocated from a few large device allocations, device-local and
//!   host-visible, with the staging path for memory the host cannot see;
//! - [`dispatch`]: the shared GPU layer's dispatches recorded into one command buffer per
//!   pass (parameter and per-call data rings, descriptor sets, barriers, timestamp queries
//!   per kernel), pipelines made on first use or ahead of it in parallel;
//! - [`cache`]: the pipeline cache on disk, one file per device and driver.
//!
//! - [`buffers`] and [`layer`]: [`Vulkan`], the device layer under the shared GPU backend
//!   ([`VulkanBackend`] is `GpuBackend<Vulkan>`): buffers and images that retire themselves,
//!   dispatches recorded pass by pass, and the [`super::gpu::Caps`] the kernel choices come
//!   from.
//!
//! Specializations with their fallbacks: subgroup operations (else workgroup-memory
//! reductions), a required subgroup size (else the device's default), f16 products (else f32),
//! packed integer dot products for Q8_0 matrices (`OpSDot` from WGSL's `dot4I8Packed`,
//! matmul_dot.wgsl; else the float kernels), cooperative matrices for prefill matmuls
//! (`VK_KHR_cooperative_matrix` at 16x16x16 or 8x8x8 f16 with f32 sums, matmul_coop.wgsl, WGSL's
//! `coop_mat` through naga, so no hand-written SPIR-V; else the workgroup kernels).
//!
//! The Vulkan loader is opened at run time, so a machine without it gets
//! [`VulkanError::NoLoader`] (and [`crate::backend::error::BackendError::Unavailable`]), never a link error.

pub mod buffers;
pub mod cache;
pub mod device;
pub mod dispatch;
pub mod error;
pub mod layer;
pub mod memory;
pub mod pipeline;
pub mod spirv;

pub use ash;
pub use device::{
    pick, preferred_subgroup_size, Device, DeviceInfo, DeviceType, Instance, Specializations, SubgroupChoice, Use,
};
pub use error::VulkanError;
pub use layer::{Startup, Vulkan, VulkanBackend, VulkanBuffer, VulkanKv, VulkanOptions, VulkanWeight};
pub use pipeline::ComputePipeline;
pub use spirv::SpirvKernel;

use crate::backend::error::BackendError;

/// Every Vulkan device on this machine, described; `Ok(vec![])` where Vulkan is present but
/// has no devices, and an [`VulkanError::is_absent`] error where there is no loader or driver.
pub fn list_devices() -> Result<Vec<DeviceInfo>, VulkanError> {
    Instance::new()?.devices()
}

/// Open the Vulkan device at `index`, or the preferred one ([`pick`]), as a backend error.
pub fn open(index: Option<usize>) -> Result<Device, BackendError> {
    Ok(Device::open(index)?)
}
