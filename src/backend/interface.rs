//! The [`Backend`] trait: the ops the model graphs are written against (see the module docs of
//! [`crate::backend`] for the execution model). This file names no implementation.

use std::sync::Arc;

use super::attn::SeqAttn;
use super::error::BackendError;
use super::kv::KvType;
use super::moe::{MatId, Route, Strided};
use super::readback::{MaybeSend, Readback};
use super::recurrent::{Conv, DeltaNet, Form, SeqRows};
use super::rope::Rope;
use crate::gguf::{GgufFile, TensorView};
use crate::sample::Candidates;

/// A compute device. See the module docs for the execution model.
pub trait Backend: Send + Sync + 'static {
    /// An f32 activation buffer.
    type Buffer: Send + 'static;
    /// Storage for one layer's K (or V) cache: `n_ctx` rows of `n_head_kv` heads, in the
    /// [`KvType`] it was allocated with.
    type Kv: Send;
    /// A weight tensor placed on the device.
    type Weight: Send + Sync;

    /// Run `f`, one forward pass, in the backend's execution context. The CPU backend runs it
    /// on a worker of its pool, so each op of the pass forks from inside the pool (the caller
    /// takes part in the work) instead of waking the pool from outside for every op; other
    /// backends just call it.
    fn run_pass<R: MaybeSend>(&self, f: impl FnOnce() -> R + MaybeSend) -> R;

    /// Short name for messages (`cpu`).
    fn name(&self) -> &'static str;

    /// Place tensor `name` of `file` on the device (zero-copy where the device can read the
    /// mapping). Errors when the tensor is missing or of a type the backend cannot use.
    fn load_weight(&self, file: &Arc<GgufFile>, name: &str) -> Result<Self::Weight, BackendError>;

    /// Place a tensor whose bytes the caller holds only for this call (a file streamed in
    /// tensor by tensor, [`crate::gguf::stream`]): the backend keeps its own copy, so the file
    /// need never be held whole.
    fn place_weight(&self, tensor: TensorView<'_>) -> Result<Self::Weight, BackendError>;

    /// A zeroed buffer of `len` f32 values.
    fn alloc(&self, len: usize) -> Result<Self::Buffer, BackendError>;

    /// Zeroed KV storage of `len` elements in format `ty` (for a block format, `len` and every
    /// row stored in it are whole blocks).
    fn alloc_kv(&self, len: usize, ty: KvType) -> Result<Self::Kv, BackendError>;

    /// Copy `src` into the start of `dst`.
    fn write(&self, dst: &mut Self::Buffer, src: &[f32]) -> Result<(), BackendError>;

    /// The first `len` values of `src`, after all recorded work has finished.
    fn read(&self, src: &Self::Buffer, len: usize) -> Result<Readback<Vec<f32>>, BackendError>;

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

    /// Rotates `groups` consecutive groups of `n` values (a power of two up to
    /// [`rotation::MAX_GROUP`]) in place by the orthonormal Walsh-Hadamard matrix of order `n`
    /// ([`rotation::hadamard_groups`] is the reference): heads on their way into a quantized
    /// KV cache, and attention outputs back ([`rotation::KvRotation`]).
    fn hadamard(&self, x: &mut Self::Buffer, groups: usize, n: usize) -> Result<(), BackendError>;

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

    /// Rotate `positions.len()` rows of `n_head` heads of `head_dim` in place, row `r` at
    /// position `positions[r]` (a batch of sequences is roped at once, each row at its own
    /// position). `factors` are the per-frequency divisors of llama3 scaling (exactly when
    /// [`Rope::wants_factors`]).
    fn rope(
        &self,
        x: &mut Self::Buffer,
        n_head: usize,
        head_dim: usize,
        positions: &[u32],
        rope: &Rope,
        factors: Option<&Self::Weight>,
    ) -> Result<(), BackendError>;

    /// Store rows `row0..row0 + positions.len()` of `src` (each `width` values) in `cache` at
    /// rows `positions` (rounded or quantized to the cache's format).
    fn kv_store(
        &self,
        cache: &mut Self::Kv,
        src: &Self::Buffer,
        row0: usize,
        width: usize,
        positions: &[u32],
    ) -> Result<(), BackendError>;

    /// Causal (optionally windowed and soft-capped) softmax attention with grouped KV heads,
    /// for every sequence of a batch in one call: sequence `s` reads its query rows
    /// `s.row0..s.row0 + s.p.rows` of `q` (`n_head * head_dim_k` each), its own caches, and
    /// writes the same rows of `out` (`n_head * head_dim_v` each). `sinks` (one logit per query
    /// head) join every softmax's denominator without weighting a value. A sequence's K and V
    /// caches share one [`KvType`]; a q8_0 cache is read block by block ([`kv`]).
    fn attention(
        &self,
        q: &Self::Buffer,
        seqs: &[SeqAttn<'_, Self::Kv>],
        sinks: Option<&Self::Weight>,
        out: &mut Self::Buffer,
    ) -> Result<(), BackendError>;

    /// `gate[i] = silu(gate[i]) * up[i]` for the first `len` values.
    fn swiglu(&self, gate: &mut Self::Buffer, up: &Self::Buffer, len: usize) -> Result<(), BackendError>;

    /// `gate[i] = gelu_tanh(gate[i]) * up[i]` for the first `len` values.
    fn geglu(&self, gate: &mut Self::Buffer, up: &Self::Buffer, len: usize) -> Result<(), BackendError>;

    /// `x[i] *= sigmoid(gate[i])` for the first `len` values (qwen3.5's gated attention output).
    fn sigmoid_mul(&self, x: &mut Self::Buffer, gate: &Self::Buffer, len: usize) -> Result<(), BackendError>;

    /// gpt-oss's clamped SwiGLU ([`moe::swiglu_oai`]) on the first `len` values, in `gate`.
    fn swiglu_oai(
        &self,
        gate: &mut Self::Buffer,
        up: &Self::Buffer,
        len: usize,
        alpha: f32,
        limit: f32,
    ) -> Result<(), BackendError>;

    /// Route `rows` rows of router `logits` (`route.n_expert` each; `bias`: a selection-only
    /// bias per expert) by [`Route::row`]'s rule: `ids` and `weights` get `route.k` values per
    /// row (ids as whole f32 numbers).
    fn route_experts(
        &self,
        logits: &Self::Buffer,
        rows: usize,
        route: &Route,
        bias: Option<&Self::Weight>,
        ids: &mut Self::Buffer,
        weights: &mut Self::Buffer,
    ) -> Result<(), BackendError>;

    /// The routed matmul ([`MatId`], ggml's `mul_mat_id`): `w` stacks `n_mat` matrices
    /// `[n_out, n_in]` (a 3-D GGUF tensor `[n_in, n_out, n_mat]`); pair `p` gets
    /// `out[p] = W[ids[p]] x[input_of(p)] (+ bias[ids[p]])`, `bias` a `[n_out, n_mat]` tensor.
    /// Only the matrices some pair chose are read, each once per call for all its pairs.
    fn matmul_id(
        &self,
        w: &Self::Weight,
        bias: Option<&Self::Weight>,
        x: &Self::Buffer,
        ids: &Self::Buffer,
        m: MatId,
        out: &mut Self::Buffer,
    ) -> Result<(), BackendError>;

    /// `out[r] = sum_j weights[r * slots + j] * experts[r * slots + j]` for `rows` rows of
    /// `width`: a routed FFN's weighted sum of its experts' outputs.
    fn moe_combine(
        &self,
        experts: &Self::Buffer,
        weights: &Self::Buffer,
        rows: usize,
        slots: usize,
        width: usize,
        out: &mut Self::Buffer,
    ) -> Result<(), BackendError>;

    /// Causal depthwise conv1d ([`Conv`]) of the rows `seq` of `x` into the same rows of `out`:
    /// output row `t`, channel `c` is `Σ_j w[c][j] · input[t + j]` over the channel's inputs
    /// "state, then x", then SiLU when `p.silu`. `state` (`[channels][kernel - 1]`) then holds
    /// the sequence's last `kernel - 1` inputs, so the next call continues it.
    fn ssm_conv(
        &self,
        x: &Self::Buffer,
        w: &Self::Weight,
        p: &Conv,
        seq: SeqRows,
        state: &mut Self::Buffer,
        out: &mut Self::Buffer,
    ) -> Result<(), BackendError>;

    /// The gates of a gated delta net for `rows` rows of one value per head (the weights'
    /// length): `alpha` becomes the log-decay `a · softplus(alpha + dt_bias)`, `beta` becomes
    /// `sigmoid(beta)` ([`recurrent::gates`]).
    fn delta_gates(
        &self,
        alpha: &mut Self::Buffer,
        beta: &mut Self::Buffer,
        rows: usize,
        dt_bias: &Self::Weight,
        a: &Self::Weight,
    ) -> Result<(), BackendError>;

    /// The [`Form`] in which this backend's [`Backend::delta_net`] walks `rows` tokens of one
    /// sequence fastest. Both forms give the same outputs to f32 rounding, so this is a speed
    /// choice the backend makes: the GPUs take chunks ([`recurrent::chunks_from`]), the CPU
    /// goes token by token.
    fn delta_form(&self, rows: usize) -> Form;

    /// The gated delta rule ([`DeltaNet`]) over the rows `seq`: q and k of `qkv` L2-normed, q
    /// scaled, each value head reading its key head, then [`recurrent::delta_token`] for each
    /// token from `state` on, in `form` (both forms agree to f32 rounding). `out` gets each
    /// token's output; `state` ends as the state after the last row.
    #[allow(clippy::too_many_arguments)]
    fn delta_net(
        &self,
        p: &DeltaNet,
        form: Form,
        seq: SeqRows,
        qkv: &Self::Buffer,
        gate: &Self::Buffer,
        beta: &Self::Buffer,
        state: &mut Self::Buffer,
        out: &mut Self::Buffer,
    ) -> Result<(), BackendError>;

    /// In place, for `groups` groups of `w.len()` values: `x = rmsnorm(x) · w · silu(z)` (the
    /// gated norm on a delta net's output heads, `z` the gate projection).
    fn rmsnorm_gated(
        &self,
        x: &mut Self::Buffer,
        z: &Self::Buffer,
        w: &Self::Weight,
        groups: usize,
        eps: f32,
    ) -> Result<(), BackendError>;

    /// Copy runs of values between strided places ([`Strided`]).
    fn copy_strided(&self, src: &Self::Buffer, dst: &mut Self::Buffer, c: &Strided) -> Result<(), BackendError>;

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
    /// (the inverse of [`Backend::copy_rows`]).
    fn paste_rows(
        &self,
        src: &Self::Buffer,
        rows: usize,
        width: usize,
        dst: &mut Self::Buffer,
        row0: usize,
    ) -> Result<(), BackendError>;

    /// Index of the largest value in each of `rows` rows of `width` (the rule of
    /// [`crate::sample::argmax`]: first on ties, NaN never wins, 0 for a row of NaN), after
    /// pending work.
    fn argmax(&self, x: &Self::Buffer, rows: usize, width: usize) -> Result<Readback<Vec<u32>>, BackendError>;

    /// A sampler's [`Candidates`] of each of `rows` rows of `width` logits: the `k` largest and
    /// the values at `gather` ([`crate::sample::candidates`]'s rule), after pending work. A GPU
    /// backend selects on the device and reads back only the candidates.
    fn top_k(
        &self,
        x: &Self::Buffer,
        rows: usize,
        width: usize,
        k: usize,
        gather: &[u32],
    ) -> Result<Readback<Vec<Candidates>>, BackendError>;
}
