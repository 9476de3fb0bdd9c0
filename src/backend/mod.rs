//! The compute backend interface the model graphs are written against.
//!
//! A backend owns device memory (activation buffers, KV storage, placed weights) and runs fused
//! ops on it. Ops take buffers and return nothing but errors, so a GPU backend can record them
//! into one command buffer per forward pass; only [`Backend::read`], [`Backend::argmax`] and
//! [`Backend::top_k`] bring data back to the host and may wait for pending work. Shapes are passed explicitly;
//! buffers may be larger than an op needs (scratch sized for the biggest chunk).
//!
//! Implementations: [`cpu`] (scalar kernels, a persistent thread pool).

pub mod cpu;
#[cfg(not(target_arch = "wasm32"))]
#[path = "wgpu/mod.rs"]
pub mod webgpu;

use std::sync::Arc;

use crate::gguf::{GgufError, GgufFile, TensorView};
use crate::model::Rope;
use crate::quant::{GgmlType, QuantError};
use crate::sample::Candidates;

/// Errors from placing weights or running ops.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Quant(#[from] QuantError),
    #[error("tensor '{tensor}' has type {ty}, which the {backend} backend cannot multiply")]
    UnsupportedType {
        tensor: String,
        ty: GgmlType,
        backend: &'static str,
    },
    #[error("tensor '{tensor}': {problem}")]
    BadTensor { tensor: String, problem: String },
    #[error("{op}: {problem}")]
    Shape { op: &'static str, problem: String },
    #[error("token id {token} is outside the embedding table ({n_vocab} rows)")]
    TokenOutOfRange { token: u32, n_vocab: usize },
    #[error("cannot start the thread pool: {0}")]
    ThreadPool(String),
    /// The device failed (a GPU backend: a shader that does not build, a lost device, a
    /// mapping that fails), as opposed to arguments that do not fit ([`Self::Shape`]).
    #[error("{op}: the device failed: {problem}")]
    Device { op: &'static str, problem: String },
}

/// Attention of `rows` consecutive query positions starting at `pos0` over the KV cache
/// positions `0..pos0 + rows`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnParams {
    pub rows: usize,
    pub pos0: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Multiplies q·k before the softmax.
    pub scale: f32,
    /// Sliding window: key `j` is masked for query `i` when `i - j >= window`.
    pub window: Option<usize>,
}

/// One sequence of a multi-sequence attention call ([`Backend::attention_seqs`]): its query and
/// output rows are `row0..row0 + p.rows` of the batch, its keys and values its own caches.
#[derive(Debug)]
pub struct SeqAttn<'a, K> {
    pub row0: usize,
    pub p: AttnParams,
    pub k_cache: &'a K,
    pub v_cache: &'a K,
}

impl AttnParams {
    /// Error unless the head layout is whole (query heads in groups per KV head, non-empty
    /// heads) and the buffers hold what the call reads and writes: `q` and `out` `rows` rows of
    /// `n_head * head_dim`, each cache `pos0 + rows` rows of `n_head_kv * head_dim`.
    pub(crate) fn check(&self, q: usize, out: usize, k_cache: usize, v_cache: usize) -> Result<(), BackendError> {
        if self.n_head_kv == 0 || !self.n_head.is_multiple_of(self.n_head_kv) || self.head_dim == 0 {
            return Err(shape(
                "attention",
                format!("{} heads over {} kv heads", self.n_head, self.n_head_kv),
            ));
        }
        let q_dim = self.n_head * self.head_dim;
        let kv_rows = (self.pos0 + self.rows) * self.n_head_kv * self.head_dim;
        need("attention", "q", q, self.rows * q_dim)?;
        need("attention", "output", out, self.rows * q_dim)?;
        need("attention", "k cache", k_cache, kv_rows)?;
        need("attention", "v cache", v_cache, kv_rows)
    }
}

/// A [`BackendError::Shape`] of `op`.
fn shape(op: &'static str, problem: String) -> BackendError {
    BackendError::Shape { op, problem }
}

/// Error unless a buffer (`what` of `op`) holds at least `need` values.
fn need(op: &'static str, what: &str, have: usize, need: usize) -> Result<(), BackendError> {
    if have < need {
        return Err(shape(op, format!("{what} holds {have} values, needs {need}")));
    }
    Ok(())
}

/// A compute device. See the module docs for the execution model.
pub trait Backend: Send + Sync {
    /// An f32 activation buffer.
    type Buffer: Send;
    /// Storage for one layer's K (or V) cache: `n_ctx` rows of `n_head_kv * head_dim`.
    type Kv: Send;
    /// A weight tensor placed on the device.
    type Weight: Send + Sync;

    /// Run `f`, one forward pass, in the backend's execution context. The CPU backend runs it
    /// on a worker of its pool, so each op of the pass forks from inside the pool (the caller
    /// takes part in the work) instead of waking the pool from outside for every op.
    fn run_pass<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        f()
    }

    /// Short name for messages (`cpu`).
    fn name(&self) -> &'static str;

    /// Place tensor `name` of `file` on the device (zero-copy where the device can read the
    /// mapping). Errors when the tensor is missing or of a type the backend cannot use.
    fn load_weight(&self, file: &Arc<GgufFile>, name: &str) -> Result<Self::Weight, BackendError>;

    /// A zeroed buffer of `len` f32 values.
    fn alloc(&self, len: usize) -> Result<Self::Buffer, BackendError>;

    /// Zeroed KV storage of `len` elements.
    fn alloc_kv(&self, len: usize) -> Result<Self::Kv, BackendError>;

    /// Copy `src` into the start of `dst`.
    fn write(&self, dst: &mut Self::Buffer, src: &[f32]) -> Result<(), BackendError>;

    /// Copy the start of `src` into `dst`, after all recorded work has finished.
    fn read(&self, src: &Self::Buffer, dst: &mut [f32]) -> Result<(), BackendError>;

    /// `out[r] = table[tokens[r]] * scale` (rows dequantized from the table's format).
    fn embed(
        &self,
        table: &Self::Weight,
        tokens: &[u32],
        scale: f32,
        out: &mut Self::Buffer,
    ) -> Result<(), BackendError>;

    /// `out[r] = W x[r]` for `rows` rows, `W` of shape `[n_out, n_in]` (GGUF `[n_in, n_out]`).
    /// Activations are converted once per call to the weight's dot-product format.
    fn matmul(
        &self,
        w: &Self::Weight,
        x: &Self::Buffer,
        rows: usize,
        out: &mut Self::Buffer,
    ) -> Result<(), BackendError>;

    /// `x[r] += bias` for `rows` rows of the bias's length.
    fn add_bias(&self, x: &mut Self::Buffer, bias: &Self::Weight, rows: usize) -> Result<(), BackendError>;

    /// `x[i] += y[i]` for the first `len` values.
    fn add(&self, x: &mut Self::Buffer, y: &Self::Buffer, len: usize) -> Result<(), BackendError>;

    /// `x[i] *= s` for the first `len` values.
    fn scale(&self, x: &mut Self::Buffer, len: usize, s: f32) -> Result<(), BackendError>;

    /// RMS norm of `groups` consecutive groups of `w.len()` values, times `w`, into `out`.
    fn rmsnorm(
        &self,
        x: &Self::Buffer,
        w: &Self::Weight,
        groups: usize,
        eps: f32,
        out: &mut Self::Buffer,
    ) -> Result<(), BackendError>;

    /// [`Backend::rmsnorm`] in place (per-head q/k norms, post-norms).
    fn rmsnorm_inplace(
        &self,
        x: &mut Self::Buffer,
        w: &Self::Weight,
        groups: usize,
        eps: f32,
    ) -> Result<(), BackendError>;

    /// Rotate `rows` rows of `n_head` heads of `head_dim` in place; row `r` is at position
    /// `pos0 + r`. `factors` divides each frequency (llama3 `rope_freqs.weight`).
    #[allow(clippy::too_many_arguments)]
    fn rope(
        &self,
        x: &mut Self::Buffer,
        rows: usize,
        n_head: usize,
        head_dim: usize,
        pos0: usize,
        rope: &Rope,
        factors: Option<&Self::Weight>,
    ) -> Result<(), BackendError>;

    /// Store `rows` rows of k and v (each `kv_dim` wide) at cache positions `pos0..`.
    #[allow(clippy::too_many_arguments)]
    fn kv_store(
        &self,
        k_cache: &mut Self::Kv,
        v_cache: &mut Self::Kv,
        k: &Self::Buffer,
        v: &Self::Buffer,
        rows: usize,
        kv_dim: usize,
        pos0: usize,
    ) -> Result<(), BackendError>;

    /// Causal (optionally windowed) softmax attention with grouped KV heads; `out` gets
    /// `rows` rows of `n_head * head_dim`.
    fn attention(
        &self,
        q: &Self::Buffer,
        k_cache: &Self::Kv,
        v_cache: &Self::Kv,
        p: &AttnParams,
        out: &mut Self::Buffer,
    ) -> Result<(), BackendError>;

    /// [`Backend::attention`] for several sequences of one batch: each gets rows
    /// `row0..row0 + p.rows` of `q` and `out`. `seg_q` and `seg_att` (each at least the longest
    /// sequence's rows of `n_head * head_dim`) are scratch.
    ///
    /// The default runs the sequences one after another through the scratch; the CPU backend
    /// overrides it with one parallel dispatch for all of them (a decode batch has one row per
    /// sequence, too few tasks to be worth a dispatch each).
    fn attention_seqs(
        &self,
        q: &Self::Buffer,
        seqs: &[SeqAttn<'_, Self::Kv>],
        out: &mut Self::Buffer,
        seg_q: &mut Self::Buffer,
        seg_att: &mut Self::Buffer,
    ) -> Result<(), BackendError> {
        for s in seqs {
            let q_dim = s.p.n_head * s.p.head_dim;
            self.copy_rows(q, s.row0, s.p.rows, q_dim, seg_q)?;
            self.attention(seg_q, s.k_cache, s.v_cache, &s.p, seg_att)?;
            self.paste_rows(seg_att, s.p.rows, q_dim, out, s.row0)?;
        }
        Ok(())
    }

    /// `gate[i] = silu(gate[i]) * up[i]` for the first `len` values.
    fn swiglu(&self, gate: &mut Self::Buffer, up: &Self::Buffer, len: usize) -> Result<(), BackendError>;

    /// `gate[i] = gelu_tanh(gate[i]) * up[i]` for the first `len` values.
    fn geglu(&self, gate: &mut Self::Buffer, up: &Self::Buffer, len: usize) -> Result<(), BackendError>;

    /// Copy rows `row0..row0 + rows` of width `width` from `src` to the start of `dst`.
    fn copy_rows(
        &self,
        src: &Self::Buffer,
        row0: usize,
        rows: usize,
        width: usize,
        dst: &mut Self::Buffer,
    ) -> Result<(), BackendError>;

    /// Copy the first `rows` rows of width `width` of `src` into `dst` at rows `row0..row0 + rows`
    /// (the inverse of [`Backend::copy_rows`]; multi-sequence batches scatter per-sequence results
    /// back with it).
    ///
    /// The default goes through the host ([`Backend::read`] then [`Backend::write`]), so every
    /// backend has it; backends override it with a device copy.
    fn paste_rows(
        &self,
        src: &Self::Buffer,
        rows: usize,
        width: usize,
        dst: &mut Self::Buffer,
        row0: usize,
    ) -> Result<(), BackendError> {
        let mut host = vec![0f32; (row0 + rows) * width];
        self.read(dst, &mut host)?;
        self.read(src, &mut host[row0 * width..])?;
        self.write(dst, &host)
    }

    /// Index of the largest value in each of `rows` rows of `width` (first on ties); waits for
    /// pending work.
    fn argmax(&self, x: &Self::Buffer, rows: usize, width: usize) -> Result<Vec<u32>, BackendError>;

    /// A sampler's [`Candidates`] of each of `rows` rows of `width` logits: the `k` largest and
    /// the values at `gather`; waits for pending work. This default reads the rows back and
    /// selects on the host ([`crate::sample::candidates`]); a GPU backend selects on the device
    /// and reads back only the candidates.
    fn top_k(
        &self,
        x: &Self::Buffer,
        rows: usize,
        width: usize,
        k: usize,
        gather: &[u32],
    ) -> Result<Vec<Candidates>, BackendError> {
        check_top_k(rows, width, k)?;
        let mut host = vec![0.0; rows * width];
        self.read(x, &mut host)?;
        Ok(host
            .chunks_exact(width)
            .map(|row| crate::sample::candidates(row, k, gather))
            .collect())
    }
}

/// Arguments of [`Backend::top_k`] that no backend can honour.
pub(crate) fn check_top_k(rows: usize, width: usize, k: usize) -> Result<(), BackendError> {
    if width == 0 || k == 0 {
        return Err(shape("top_k", format!("k = {k} of rows of {width} values")));
    }
    if rows.checked_mul(width).is_none() {
        return Err(shape("top_k", format!("{rows} rows of {width} values")));
    }
    Ok(())
}

/// A weight tensor seen as a matrix for a backend's `load_weight`: `(n_in, n_out)`, `n_out`
/// rows of `n_in` values (the first GGUF dimension is the row). Rows must be whole blocks of
/// the tensor's type. For a matrix (2 or more dimensions) `supported` says whether the backend
/// multiplies its type, and the data must hold exactly the rows.
pub(crate) fn weight_matrix(
    name: &str,
    view: &TensorView<'_>,
    supported: impl Fn(GgmlType) -> bool,
    backend: &'static str,
) -> Result<(usize, usize), BackendError> {
    let info = view.info;
    let bad = |problem: String| BackendError::BadTensor {
        tensor: name.to_string(),
        problem,
    };
    let n_in = usize::try_from(*info.shape.first().unwrap_or(&1)).map_err(|_| bad("row too long".into()))?;
    let n_out = usize::try_from(info.shape.iter().skip(1).product::<u64>()).map_err(|_| bad("too many rows".into()))?;
    let ty = info.ty;
    if n_in == 0 || !n_in.is_multiple_of(ty.block_size()) {
        return Err(bad(format!("row length {n_in} is not a whole number of {ty} blocks")));
    }
    if info.shape.len() > 1 {
        if !supported(ty) {
            return Err(BackendError::UnsupportedType {
                tensor: name.to_string(),
                ty,
                backend,
            });
        }
        ty.check_len(view.data.len(), n_in * n_out)?;
    }
    Ok((n_in, n_out))
}
