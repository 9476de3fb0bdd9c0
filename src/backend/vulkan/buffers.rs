//! What the Vulkan backend keeps on the device: activation buffers, KV caches and weights, each
//! an owned range of [`Memory`] that is retired (freed once recorded work is done) when
//! dropped.

use std::sync::Arc;

use super::memory::{Buffer, Image, Memory};
use crate::backend::checks::shape;
use crate::backend::gpu::plan::{MatShape, PartRows};
use crate::backend::{BackendError, KvType};
use crate::quant::GgmlType;

/// A buffer of [`Memory`] that goes back to it on drop, after the work recorded so far
/// ([`Memory::retire`]: a recorded command may still name it).
#[derive(Debug)]
pub struct Owned {
    buf: Option<Buffer>,
    memory: Arc<Memory>,
}

impl Owned {
    pub(super) fn new(buf: Buffer, memory: &Arc<Memory>) -> Self {
        Self {
            buf: Some(buf),
            memory: Arc::clone(memory),
        }
    }

    pub(super) fn get(&self) -> &Buffer {
        self.buf.as_ref().expect("a buffer until dropped")
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            self.memory.retire(b);
        }
    }
}

/// An [`Image`] of [`Memory`] that goes back to it on drop, as [`Owned`].
#[derive(Debug)]
pub struct OwnedImage {
    image: Option<Image>,
    memory: Arc<Memory>,
}

impl OwnedImage {
    pub(super) fn new(image: Image, memory: &Arc<Memory>) -> Self {
        Self {
            image: Some(image),
            memory: Arc::clone(memory),
        }
    }

    pub(super) fn get(&self) -> &Image {
        self.image.as_ref().expect("an image until dropped")
    }
}

impl Drop for OwnedImage {
    fn drop(&mut self) {
        if let Some(i) = self.image.take() {
            self.memory.retire_image(i);
        }
    }
}

/// Where a weight part's bytes live.
#[derive(Debug)]
pub enum Store {
    /// Rows of `row_bytes` bytes back to back, `[rows][row_bytes]`.
    Buffer(Owned),
    /// Rows of `stride` bytes laid out by texlayout.rs in texture rows of
    /// [`crate::backend::gpu::TEX_ROW_BYTES`] (bytes_tex.wgsl): CPU devices.
    Image(OwnedImage),
}

/// An f32 activation buffer, `[len]`.
#[derive(Debug)]
pub struct VulkanBuffer {
    pub(super) buf: Owned,
    /// Values it holds.
    pub(super) len: usize,
}

/// One layer's K or V cache: f32 values rounded to f16, or q8_0 blocks
/// ([`crate::backend::gpu::plan::kv_words`]), as on WebGPU.
#[derive(Debug)]
pub struct VulkanKv {
    pub(super) buf: VulkanBuffer,
    /// Values it holds.
    pub(super) len: usize,
    pub(super) ty: KvType,
    /// A block format's first scale word.
    pub(super) scales: usize,
}

/// A weight on the device.
#[derive(Debug)]
pub struct VulkanWeight {
    pub(super) name: String,
    pub(super) ty: GgmlType,
    /// Values per row (GGUF `shape[0]`).
    pub(super) n_in: usize,
    /// Rows (product of the other dimensions).
    pub(super) n_out: usize,
    /// Matrices stacked in the rows (a 3-D expert tensor's third dimension; else 1).
    pub(super) mats: usize,
    pub(super) row_bytes: usize,
    /// Bytes from one row to the next in an image part (texlayout.rs).
    pub(super) stride: usize,
    /// Matrices: raw GGUF blocks split by rows into parts that fit one binding (or image).
    pub(super) parts: Vec<(PartRows, Store)>,
    /// Vectors (norms, biases, rope factors, sinks): f32 values, `[n_in * n_out]`.
    pub(super) dense: Option<Owned>,
    /// Matrices of short rows (conv kernels, `[kernel, channels]`): their f32 values too,
    /// `[n_out][n_in]`, which ssm_conv reads.
    pub(super) short_rows: Option<Owned>,
}

impl VulkanWeight {
    /// The values of a vector weight.
    pub(super) fn dense(&self, op: &'static str) -> Result<&Buffer, BackendError> {
        self.dense
            .as_ref()
            .map(Owned::get)
            .ok_or_else(|| shape(op, format!("'{}' is a matrix, expected a vector", self.name)))
    }

    /// The f32 values of a vector, or of a matrix of short rows (a conv kernel), and how many.
    pub(super) fn values(&self, op: &'static str) -> Result<(&Buffer, usize), BackendError> {
        let n = self.n_in * self.n_out;
        match (&self.dense, &self.short_rows) {
            (Some(b), _) | (None, Some(b)) => Ok((b.get(), n)),
            (None, None) => Err(shape(
                op,
                format!(
                    "'{}' is a matrix of rows of {} values, read as values only with rows of at most {} (conv kernels)",
                    self.name,
                    self.n_in,
                    crate::backend::recurrent::MAX_CONV_KERNEL
                ),
            )),
        }
    }

    /// An error unless this is a matrix.
    pub(super) fn matrix(&self, op: &'static str) -> Result<MatShape, BackendError> {
        if self.parts.is_empty() {
            return Err(shape(op, format!("'{}' is a vector, expected a matrix", self.name)));
        }
        Ok(MatShape {
            ty: self.ty,
            n_in: self.n_in,
            n_out: self.n_out,
        })
    }

    /// How many buffers hold the matrix (more than one when it exceeds a binding).
    pub fn parts(&self) -> usize {
        self.parts.len()
    }
}
