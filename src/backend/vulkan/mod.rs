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
//! - [`buffers`] and [`backend`]: [`VulkanBackend`], the [`super::Backend`] over these layers
//!   (the shared GPU layer's plans recorded pass by pass; weights in storage buffers, or in
//!   images read with `textureLoad` on CPU devices, as WebGPU does on CPU adapters).
//!
//! Specializations with their fallbacks: subgroup operations (else workgroup-memory
//! reductions), a required subgroup size (else the device's default), f16 products (else f32),
//! packed integer dot products for Q8_0 matrices (`OpSDot` from WGSL's `dot4I8Packed`,
//! matmul_dot.wgsl; else the float kernels), cooperative matrices for prefill matmuls
//! (`VK_KHR_cooperative_matrix` at 16x16x16 or 8x8x8 f16 with f32 sums, matmul_coop.wgsl, WGSL's
//! `coop_mat` through naga, so no hand-written SPIR-V; else the workgroup kernels).
//!
//! The Vulkan loader is opened at run time, so a machine without it gets
//! [`VulkanError::NoLoader`] (and [`super::BackendError::Unavailable`]), never a link error.

pub mod backend;
pub mod buffers;
pub mod cache;
pub mod device;
pub mod dispatch;
pub mod memory;
pub mod pipeline;
pub mod spirv;

pub use ash;
pub use backend::{Startup, VulkanBackend, VulkanOptions};
pub use buffers::{VulkanBuffer, VulkanKv, VulkanWeight};
pub use device::{
    pick, preferred_subgroup_size, Device, DeviceInfo, DeviceType, Instance, Specializations, SubgroupChoice, Use,
};
pub use pipeline::ComputePipeline;
pub use spirv::SpirvKernel;

use ash::vk;

use super::BackendError;

/// Why Vulkan cannot be used, or what failed.
#[derive(Debug, thiserror::Error)]
pub enum VulkanError {
    /// No Vulkan loader on this machine.
    #[error(
        "cannot load the Vulkan loader: {0} (on Debian or Ubuntu: apt-get install libvulkan1 mesa-vulkan-drivers)"
    )]
    NoLoader(String),
    /// A loader without any driver (or one too old to use).
    #[error("{0}")]
    NoDriver(String),
    /// Devices exist, but not the one asked for or not one the backend can run on.
    #[error("{0}")]
    NoDevice(String),
    /// A Vulkan call failed.
    #[error("{call} failed: {result}")]
    Failed { call: &'static str, result: vk::Result },
    /// A kernel that needs what the device (or the way it was opened) lacks, or asked for a
    /// pipeline it cannot have.
    #[error("{kernel}: {problem}")]
    Unsupported { kernel: String, problem: String },
}

impl VulkanError {
    pub(crate) fn failed(call: &'static str, result: vk::Result) -> Self {
        Self::Failed { call, result }
    }

    /// Vulkan is absent here (no loader, no driver, no devices): an answer, not a failure.
    pub fn is_absent(&self) -> bool {
        matches!(self, Self::NoLoader(_) | Self::NoDriver(_))
    }
}

impl From<VulkanError> for BackendError {
    fn from(e: VulkanError) -> Self {
        match e {
            VulkanError::NoLoader(_) | VulkanError::NoDriver(_) | VulkanError::NoDevice(_) => {
                BackendError::Unavailable {
                    backend: "vulkan",
                    reason: e.to_string(),
                }
            }
            VulkanError::Failed { call, result } => BackendError::Device {
                op: call,
                problem: result.to_string(),
            },
            VulkanError::Unsupported { .. } => BackendError::Device {
                op: "pipeline",
                problem: e.to_string(),
            },
        }
    }
}

/// Every Vulkan device on this machine, described; `Ok(vec![])` where Vulkan is present but
/// has no devices, and an [`VulkanError::is_absent`] error where there is no loader or driver.
pub fn list_devices() -> Result<Vec<DeviceInfo>, VulkanError> {
    Instance::new()?.devices()
}

/// Open the Vulkan device at `index`, or the preferred one ([`pick`]), as a backend error.
pub fn open(index: Option<usize>) -> Result<Device, BackendError> {
    Ok(Device::open(index)?)
}
