//! What the WebGPU backend keeps on the device: activation buffers, KV caches and weights,
//! each releasing its cached bind groups when dropped.

use std::sync::{Mutex, Weak};

use super::recorder::Recorder;
use crate::backend::checks::shape;
use crate::backend::gpu::plan::{MatShape, PartRows};
use crate::backend::{BackendError, KvType};
use crate::quant::GgmlType;

/// An f32 activation buffer on the device.
#[derive(Debug)]
pub struct WebGpuBuffer {
    pub(super) buf: wgpu::Buffer,
    /// Values it holds.
    pub(super) len: usize,
    /// The recorder whose bind group cache may hold `buf`.
    pub(super) cache: Weak<Mutex<Recorder>>,
}

/// The bind groups cached with a buffer hold it; its owner's drop removes them, so the device
/// memory goes with the owner (work already recorded keeps its own references).
impl Drop for WebGpuBuffer {
    fn drop(&mut self) {
        forget(&self.cache, &[&self.buf], &[]);
    }
}

/// Drop the bind groups of `cache` that bind any of `bufs` or `views`.
pub(super) fn forget(cache: &Weak<Mutex<Recorder>>, bufs: &[&wgpu::Buffer], views: &[&wgpu::TextureView]) {
    if let Some(rec) = cache.upgrade() {
        rec.lock().unwrap_or_else(|e| e.into_inner()).forget(bufs, views);
    }
}

/// One layer's K or V cache: f32 values rounded to f16, or q8_0 blocks
/// ([`crate::backend::gpu::plan::kv_words`]).
#[derive(Debug)]
pub struct WebGpuKv {
    pub(super) buf: WebGpuBuffer,
    /// Values it holds.
    pub(super) len: usize,
    pub(super) ty: KvType,
    /// A block format's first scale word.
    pub(super) scales: usize,
}

/// One buffer or texture of a weight matrix: rows `row0..row0 + rows`, raw GGUF blocks.
#[derive(Debug)]
pub(super) struct Part {
    pub rows: PartRows,
    pub store: Store,
}

/// Where a part's bytes live.
#[derive(Debug)]
pub(super) enum Store {
    /// Rows of `row_bytes` bytes back to back.
    Buffer(wgpu::Buffer),
    /// Rows of `stride` bytes laid out by texlayout.rs, filling texture rows of
    /// [`crate::backend::gpu::TEX_ROW_BYTES`] in order (bytes_tex.wgsl). The texture stays
    /// alive with its view.
    Texture(#[allow(dead_code)] wgpu::Texture, wgpu::TextureView),
}

/// A weight on the device.
#[derive(Debug)]
pub struct WebGpuWeight {
    pub(super) name: String,
    pub(super) ty: GgmlType,
    /// Values per row (GGUF `shape[0]`).
    pub(super) n_in: usize,
    /// Rows (product of the other dimensions).
    pub(super) n_out: usize,
    /// Matrices stacked in the rows (a 3-D expert tensor's third dimension; else 1).
    pub(super) mats: usize,
    pub(super) row_bytes: usize,
    /// Bytes from one row to the next in a texture part (a multiple of 16; texlayout.rs).
    pub(super) stride: usize,
    /// Matrices: raw blocks, split by rows into parts that fit one binding.
    pub(super) parts: Vec<Part>,
    /// Vectors (norms, biases, rope factors, sinks): f32 values, `n_in * n_out` of them.
    pub(super) dense: Option<wgpu::Buffer>,
    /// Matrices of short rows (conv kernels, `[kernel, channels]`): their f32 values too,
    /// `[n_out][n_in]`, which ssm_conv.wgsl reads (see [`WebGpuWeight::values`]).
    pub(super) short_rows: Option<wgpu::Buffer>,
    /// See [`WebGpuBuffer::cache`].
    pub(super) cache: Weak<Mutex<Recorder>>,
}

/// See `Drop for WebGpuBuffer`.
impl Drop for WebGpuWeight {
    fn drop(&mut self) {
        let mut bufs: Vec<&wgpu::Buffer> = self.dense.iter().chain(&self.short_rows).collect();
        let mut views = Vec::new();
        for part in &self.parts {
            match &part.store {
                Store::Buffer(b) => bufs.push(b),
                Store::Texture(_, v) => views.push(v),
            }
        }
        forget(&self.cache, &bufs, &views);
    }
}

impl WebGpuWeight {
    /// The values of a vector weight.
    pub(super) fn dense(&self, op: &'static str) -> Result<&wgpu::Buffer, BackendError> {
        self.dense
            .as_ref()
            .ok_or_else(|| shape(op, format!("'{}' is a matrix, expected a vector", self.name)))
    }

    /// The f32 values of a vector, or of a matrix of short rows (a conv kernel), and how many
    /// there are: what the ops that read a weight as plain values take (as the CPU backend's
    /// `CpuWeight::values`).
    pub(super) fn values(&self, op: &'static str) -> Result<(&wgpu::Buffer, usize), BackendError> {
        let n = self.n_in * self.n_out;
        match (&self.dense, &self.short_rows) {
            (Some(b), _) | (None, Some(b)) => Ok((b, n)),
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
