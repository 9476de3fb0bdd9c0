//! The GPU backend, written once over a device layer (WebGPU through wgpu, Vulkan through
//! ash): everything about running a kernel that does not touch a device.
//!
//! - [`backend`]: [`GpuBackend`], the [`crate::backend::interface::Backend`] of every GPU, over a [`Device`]
//!   ([`device`]: what a device layer provides, and its [`Caps`]), with its buffers and
//!   weights ([`buffers`]), the weight writer ([`placing`], with the codebook formats' grid
//!   tables from [`grids`]) and the options ([`options`]);
//! - [`compose`] and [`kernels`]: the WGSL kernel variants, composed from `shaders/` at build
//!   time, and the [`Kernel`] naming one of them;
//! - [`Strategy`]: which variant an op uses on a device (matmul layout, subgroups, f16
//!   products, split attention), decided once from the device's features;
//! - [`plan`]: per op, the [`Dispatch`] (kernel, parameter block, grid) for given shapes, with
//!   the GPU-specific checks (32-bit indices, grid limits) on top of the shared
//!   [`super::checks`];
//! - [`texlayout`]: how texture-held weights lay out their blocks.
//!
//! A device layer binds its buffers to a dispatch's bindings (numbered as in the kernel's
//! WGSL) and records it. Adding a GPU backend means one device layer and one `AnyBackend`
//! variant; adding an op, the trait, `any`, `cpu`, [`GpuBackend`], a shader and (for a kernel
//! without a weight format or parameters) one row of [`compose::KERNELS`], from which the
//! build script emits the [`Kernel`] enum, the kernels' names and entry points.

pub mod backend;
pub mod buffers;
pub mod compose;
pub mod device;
pub mod dispatch;
pub mod grids;
pub mod kernels;
pub mod options;
pub mod placing;
pub mod plan;
pub mod sizes;
pub mod strategy;
pub mod texlayout;

pub use backend::{GpuBackend, Paths};
pub use buffers::{GpuBuffer, GpuKv, GpuWeight};
pub use device::{Bind, Caps, Device};
pub use dispatch::{grid, u, words, Dispatch};
pub use kernels::{AttnPass, Kernel};
pub use options::GpuOptions;
pub use placing::WeightWriter;
pub use sizes::{
    DELTA_COLUMNS, DELTA_MAX_DK, KV_CHUNK, MATMUL_ROWS, MAX_GRID, NARROW_HEAD_DIM, SPLIT_MAX_ROWS, TEX_ROW_BYTES,
    X_WINDOW_BYTES,
};
pub use strategy::{rows_per_part, MatmulVariant, Strategy};
