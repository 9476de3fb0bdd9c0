//! [`VulkanError`]: why Vulkan cannot be used, or what failed, and how it becomes a
//! [`BackendError`].

use ash::vk;

use crate::backend::error::BackendError;

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
