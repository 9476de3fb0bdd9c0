//! What the GPU backend keeps on a device: activation buffers, KV caches and weights, over the
//! device layer's buffers and images (which release themselves when dropped).

use super::device::Device;
use super::plan::{MatShape, PartRows};
use crate::backend::checks::shape;
use crate::backend::error::BackendError;
use crate::backend::kv::KvType;
use crate::backend::recurrent::MAX_CONV_KERNEL;
use crate::quant::GgmlType;

/// An f32 activation buffer, `[len]`.
pub struct GpuBuffer<D: Device> {
    pub(super) buf: D::Buf,
    /// Values it holds.
    pub(super) len: usize,
}

impl<D: Device> std::fmt::Debug for GpuBuffer<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuBuffer").field("len", &self.len).finish()
    }
}

/// One layer's K or V cache: f32 values rounded to f16, or q8_0 blocks
/// ([`super::plan::kv_words`]).
pub struct GpuKv<D: Device> {
    pub(super) buf: GpuBuffer<D>,
    /// Values it holds.
    pub(super) len: usize,
    pub(super) ty: KvType,
    /// A block format's first scale word.
    pub(super) scales: usize,
}

impl<D: Device> std::fmt::Debug for GpuKv<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuKv")
            .field("len", &self.len)
            .field("ty", &self.ty)
            .finish()
    }
}

/// Where a weight part's bytes live.
pub enum Store<D: Device> {
    /// Rows of `row_bytes` bytes back to back, `[rows][row_bytes]`, after the format's grid
    /// table where it has one (`[table][rows][row_bytes]`: grids.rs).
    Buffer(D::Buf),
    /// Rows of `stride` bytes laid out by texlayout.rs in texture rows of
    /// [`crate::backend::gpu::sizes::TEX_ROW_BYTES`] (bytes_tex.wgsl): CPU devices.
    Image(D::Image),
}

/// A weight on the device.
pub struct GpuWeight<D: Device> {
    pub(super) name: String,
    pub(super) ty: GgmlType,
    /// Values per row (GGUF `shape[0]`).
    pub(super) n_in: usize,
    /// Rows (product of the other dimensions).
    pub(super) n_out: usize,
    /// Matrices stacked in the rows (a 3-D expert tensor's third dimension; else 1).
    pub(super) mats: usize,
    pub(super) row_bytes: usize,
    /// Bytes from one row to the next in an image part (a multiple of 16; texlayout.rs).
    pub(super) stride: usize,
    /// Matrices: raw GGUF blocks split by rows into parts that fit one binding (or image).
    pub(super) parts: Vec<(PartRows, Store<D>)>,
    /// Vectors (norms, biases, rope factors, sinks): f32 values, `[n_in * n_out]`.
    pub(super) dense: Option<D::Buf>,
    /// Matrices of short rows (conv kernels, `[kernel, channels]`): their f32 values too,
    /// `[n_out][n_in]`, which ssm_conv reads (see [`GpuWeight::values`]).
    pub(super) short_rows: Option<D::Buf>,
}

impl<D: Device> std::fmt::Debug for GpuWeight<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuWeight")
            .field("name", &self.name)
            .field("ty", &self.ty)
            .field("n_in", &self.n_in)
            .field("n_out", &self.n_out)
            .field("parts", &self.parts.len())
            .finish()
    }
}

impl<D: Device> GpuWeight<D> {
    /// The values of a vector weight.
    pub(super) fn dense(&self, op: &'static str) -> Result<&D::Buf, BackendError> {
        self.dense
            .as_ref()
            .ok_or_else(|| shape(op, format!("'{}' is a matrix, expected a vector", self.name)))
    }

    /// The f32 values of a vector, or of a matrix of short rows (a conv kernel), and how many
    /// there are: what the ops that read a weight as plain values take (as the CPU backend's
    /// `CpuWeight::values`).
    pub(super) fn values(&self, op: &'static str) -> Result<(&D::Buf, usize), BackendError> {
        let n = self.n_in * self.n_out;
        match (&self.dense, &self.short_rows) {
            (Some(b), _) | (None, Some(b)) => Ok((b, n)),
            (None, None) => Err(shape(
                op,
                format!(
                    "'{}' is a matrix of rows of {} values, read as values only with rows of at most {MAX_CONV_KERNEL} (conv kernels)",
                    self.name, self.n_in,
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

    /// The buffer of part `store`, or an error naming `op` where the matrix is in images.
    pub(super) fn buffer<'a>(&self, op: &'static str, store: &'a Store<D>) -> Result<&'a D::Buf, BackendError> {
        match store {
            Store::Buffer(b) => Ok(b),
            Store::Image(_) => Err(shape(
                op,
                format!(
                    "'{}' has a part held in an image, which this op does not read",
                    self.name
                ),
            )),
        }
    }

    /// Whether the matrix is held in buffers (not images).
    pub(super) fn in_buffers(&self) -> bool {
        matches!(self.parts.first(), Some((_, Store::Buffer(_))))
    }

    /// How many buffers hold the matrix (more than one when it exceeds a binding).
    pub fn parts(&self) -> usize {
        self.parts.len()
    }
}
