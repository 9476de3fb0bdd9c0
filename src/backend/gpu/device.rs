//! What a device layer gives the shared GPU backend ([`crate::backend::gpu::backend::GpuBackend`]): memory (storage
//! buffers, images for texture-held weights), recording a [`Dispatch`] with its bindings or a
//! copy, reading back, making pipelines ahead of use, and a description of what the device can
//! do ([`Caps`]). wgpu ([`crate::backend::webgpu`]) and ash ([`crate::backend::vulkan`])
//! implement it; nothing here chooses a kernel (the shared layer does, from [`Caps`]).
//!
//! Work is recorded in order and runs in that order: a copy or a dispatch sees everything
//! recorded before it. Results come back only through [`Device::read`].

use crate::backend::error::BackendError;
use crate::backend::gpu::dispatch::Dispatch;
use crate::backend::gpu::kernels::Kernel;
use crate::backend::readback::Readback;

/// What a device offers the kernel choices ([`crate::backend::gpu::backend::GpuBackend::new`] makes them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// A CPU device (Mesa lavapipe, SwiftShader): weights go into textures and attention is
    /// not split by default, as their few threads are kept busy by the heads alone.
    pub cpu: bool,
    /// Subgroup operations, with the smallest and largest subgroup size.
    pub subgroups: Option<(u32, u32)>,
    /// f16 arithmetic in shaders.
    pub f16: bool,
    /// Packed integer dot products (Vulkan's `VK_KHR_shader_integer_dot_product`).
    pub integer_dot: bool,
    /// The cooperative-matrix size the kernels use (16 or 8), where the device has one.
    pub cooperative_matrix: Option<u8>,
    /// Largest storage binding, in bytes.
    pub max_storage: u64,
    /// Largest buffer a weight part may take, in bytes (the storage binding, or less).
    pub max_binding: u64,
    /// Texture rows (of [`crate::backend::gpu::sizes::TEX_ROW_BYTES`]) one image holds.
    pub max_image_rows: u64,
}

/// What a dispatch binds at one of its bindings besides its parameters and own data.
pub enum Bind<'a, D: Device> {
    /// A whole buffer, as storage.
    Buffer(&'a D::Buf),
    /// The first `.1` bytes of a buffer, as a uniform block (matmul_tex's activation window).
    Uniform(&'a D::Buf, u64),
    /// An image read with `textureLoad` (texture-held weights).
    Image(&'a D::Image),
}

impl<D: Device> Clone for Bind<'_, D> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<D: Device> Copy for Bind<'_, D> {}

/// A device layer. See the module docs.
pub trait Device: Sized + Send + Sync + std::fmt::Debug + 'static {
    /// A device buffer, released (after the work recorded so far) when dropped.
    type Buf: Send + Sync;
    /// An image of 16-byte texels holding texture rows of weight blocks, released on drop.
    type Image: Send + Sync;

    /// The backend's name (`--backend`, errors).
    const NAME: &'static str;

    /// What the device can do.
    fn caps(&self) -> Caps;

    /// A zeroed storage buffer of `bytes` (rounded up to whole words, at least 16).
    fn alloc(&self, op: &'static str, bytes: u64) -> Result<Self::Buf, BackendError>;

    /// A storage buffer holding `data`, padded with zeros to whole words.
    fn upload(&self, op: &'static str, data: &[u8]) -> Result<Self::Buf, BackendError>;

    /// Bytes in `buf`.
    fn size(buf: &Self::Buf) -> u64;

    /// The buffer of a weight part of `bytes` bytes (rounded up to whole words, at least 16),
    /// filled by [`Device::write_weight`] before any work reads it.
    fn weight_buffer(&self, name: &str, bytes: u64) -> Result<Self::Buf, BackendError>;

    /// Put `data` at byte `offset` of a weight part's buffer (both multiples of 4).
    fn write_weight(&self, buf: &Self::Buf, offset: u64, data: &[u8]) -> Result<(), BackendError>;

    /// The image of a weight part of `rows` texture rows.
    fn weight_image(&self, name: &str, rows: u64) -> Result<Self::Image, BackendError>;

    /// Put whole texture rows `data` into `image` from texture row `row0`; a part's rows are
    /// written in order from row 0.
    fn write_image(&self, image: &Self::Image, row0: u64, data: &[u8]) -> Result<(), BackendError>;

    /// A weight part is complete: let go of what its writes hold (staging memory), so a
    /// model's load never holds a second copy of it.
    fn part_written(&self) -> Result<(), BackendError>;

    /// Make the pipelines of `kernels` now (in parallel where the device layer can).
    fn prepare(&self, op: &'static str, kernels: &[Kernel]) -> Result<(), BackendError>;

    /// Record `d` with `binds` (binding number and what is bound) besides its parameter block
    /// (binding 0) and its own data.
    fn record(&self, op: &'static str, d: &Dispatch, binds: &[(u32, Bind<'_, Self>)]) -> Result<(), BackendError>;

    /// Record a copy of `bytes` bytes (a multiple of 4) from `src` (buffer, byte offset) to
    /// `dst` (buffer, byte offset).
    fn copy(
        &self,
        op: &'static str,
        src: (&Self::Buf, u64),
        dst: (&Self::Buf, u64),
        bytes: u64,
    ) -> Result<(), BackendError>;

    /// Put `data` at the start of `dst`: work recorded before sees the old contents, work
    /// recorded after the new.
    fn write(&self, dst: &Self::Buf, data: &[u8]) -> Result<(), BackendError>;

    /// The first `bytes` of `src` once the work recorded so far is done (submits it).
    fn read(&self, op: &'static str, src: &Self::Buf, bytes: u64) -> Result<Readback<Vec<u8>>, BackendError>;

    /// Bound where a kernel's optional input is absent (rope without factors, no sinks).
    fn dummy(&self) -> &Self::Buf;

    /// The uniform buffer matmul_tex reads an activation tile from, `[X_WINDOW_BYTES / 4]`.
    fn window(&self) -> &Self::Buf;
}
