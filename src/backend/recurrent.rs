//! Parameters of the recurrent-layer ops of gated-delta-net layers (qwen3.5, qwen3-next), with
//! the checks and scalar rules every backend follows.
//!
//! A linear-attention layer runs as four ops, split where llama.cpp splits its graph
//! (`src/models/qwen35.cpp`, `delta-net-base.cpp`):
//! - [`crate::backend::interface::Backend::ssm_conv`]: a depthwise causal conv1d over the sequence (ggml's
//!   `ssm_conv`), carrying the last `kernel - 1` inputs of each channel in a conv state, then
//!   SiLU (a separate `ggml_silu` in llama.cpp, fused here);
//! - [`crate::backend::interface::Backend::delta_gates`]: the per-head log-decay `A · softplus(a + dt_bias)` and
//!   `β = sigmoid(b)` (the graph's `gate` and `beta`);
//! - [`crate::backend::interface::Backend::delta_net`]: q and k L2-normed, q scaled by `1/sqrt(d_k)`, key heads
//!   shared by value heads, then the gated delta rule ([`delta_token`]) over the sequence,
//!   token by token or in chunks ([`Form`]), with a state per value head;
//! - [`crate::backend::interface::Backend::rmsnorm_gated`]: RMS norm of each output head times its weight times
//!   `SiLU(z)`.
//!
//! States are ordinary f32 buffers the caller owns, laid out as llama.cpp lays out its
//! recurrent cache, so a state is a plain copy to checkpoint or restore.

use super::attn::MAX_HEAD_DIM;
use super::error::{need, shape};
use crate::backend::error::BackendError;

/// The longest chunk of the chunked form: its scratch is `chunk²` values per task.
pub const MAX_CHUNK: usize = 256;

/// The widest conv kernel (qwen3.5 uses 4): the conv state holds `kernel - 1` values per
/// channel.
pub const MAX_CONV_KERNEL: usize = 64;

/// `rows` consecutive rows of a sequence starting at row `row0` of the batch's buffers (a batch
/// of several sequences runs one call per sequence, each with its own state).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqRows {
    pub row0: usize,
    pub rows: usize,
}

impl SeqRows {
    /// Values up to the end of these rows, `width` per row.
    fn end(&self, op: &'static str, width: usize) -> Result<usize, BackendError> {
        self.row0
            .checked_add(self.rows)
            .and_then(|r| r.checked_mul(width))
            .ok_or_else(|| shape(op, format!("rows {}..+{} of {width} values", self.row0, self.rows)))
    }
}

/// A depthwise causal conv1d over `channels` channels with kernels of `kernel` taps.
///
/// Buffers: input and output `[rows][channels]`; weight `[channels][kernel]` (GGUF
/// `ssm_conv1d.weight`, shape `[kernel, channels]`), tap 0 meeting the oldest input; state
/// `[channels][kernel - 1]`, oldest first (llama.cpp's conv state layout).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv {
    pub channels: usize,
    pub kernel: usize,
    /// Apply SiLU to the output (qwen3.5 always does; llama.cpp as a separate op).
    pub silu: bool,
}

impl Conv {
    /// Values of the conv state: `channels * (kernel - 1)`.
    pub fn state_len(&self) -> usize {
        self.channels * self.kernel.saturating_sub(1)
    }

    /// Check a call's buffers (their lengths) for the rows `seq`.
    pub fn check(&self, seq: SeqRows, x: usize, w: usize, state: usize, out: usize) -> Result<(), BackendError> {
        let op = "ssm_conv";
        if self.kernel == 0 || self.kernel > MAX_CONV_KERNEL || self.channels == 0 {
            return Err(shape(
                op,
                format!(
                    "{} channels of {}-tap kernels (1..={MAX_CONV_KERNEL} taps)",
                    self.channels, self.kernel
                ),
            ));
        }
        let wn = self
            .channels
            .checked_mul(self.kernel)
            .ok_or_else(|| shape(op, format!("{} channels of {} taps", self.channels, self.kernel)))?;
        if w != wn {
            return Err(shape(
                op,
                format!(
                    "weight of {w} values for {} channels of {} taps",
                    self.channels, self.kernel
                ),
            ));
        }
        let end = seq.end(op, self.channels)?;
        need(op, "input", x, end)?;
        need(op, "output", out, end)?;
        need(op, "state", state, self.state_len())
    }
}

/// `1 / (1 + e^-x)`, as ggml computes it.
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `ln(1 + e^x)`, `x` itself past 20 (ggml's `op_softplus`).
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        (1.0 + x.exp()).ln()
    }
}

/// The gate rule of one (token, head): the log-decay `a · softplus(alpha + dt_bias)` (`a` is
/// the GGUF's `ssm_a`, already `-exp(A_log)`) and `β = sigmoid(beta)`.
pub fn gates(alpha: f32, beta: f32, dt_bias: f32, a: f32) -> (f32, f32) {
    (softplus(alpha + dt_bias) * a, sigmoid(beta))
}

/// Check a [`crate::backend::interface::Backend::delta_gates`] call: `rows` rows of `n_head` alphas and betas,
/// `dt_bias` and `a` of one value per head.
pub fn check_gates(
    rows: usize,
    n_head: usize,
    alpha: usize,
    beta: usize,
    dt_bias: usize,
    a: usize,
) -> Result<(), BackendError> {
    let op = "delta_gates";
    if n_head == 0 || dt_bias != n_head || a != n_head {
        return Err(shape(
            op,
            format!("dt_bias of {dt_bias} and A of {a} values for {n_head} heads"),
        ));
    }
    let n = rows
        .checked_mul(n_head)
        .ok_or_else(|| shape(op, format!("{rows} rows of {n_head} heads")))?;
    need(op, "alpha", alpha, n)?;
    need(op, "beta", beta, n)
}

/// Which key head a value head reads when there are fewer key heads than value heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyHeads {
    /// Value head `h` reads key head `h % n_k_heads`: ggml's broadcast (`ggml_repeat`), which
    /// qwen3.5 uses (its converter orders the value heads for it).
    Tiled,
    /// Value head `h` reads key head `h / (n_v_heads / n_k_heads)`: qwen3-next's
    /// repeat-interleave.
    Grouped,
}

/// How [`crate::backend::interface::Backend::delta_net`] walks the sequence. Both give the same outputs and final
/// state up to f32 rounding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// Token by token ([`delta_token`]): decode.
    Recurrent,
    /// Chunks of this many tokens, each solved at once through the unit lower-triangular system
    /// of the WY representation (llama.cpp's `build_delta_net_chunking`): prefill. The last
    /// chunk may be shorter; nothing is padded. Its point is matmul-shaped work for a GPU; the
    /// CPU runs token by token, faster there (`cargo bench --bench recurrent`).
    Chunked(usize),
}

/// Tokens per chunk of the chunked form where a backend takes it ([`chunks_from`]).
pub const PREFILL_CHUNK: usize = 16;

/// Chunks of [`PREFILL_CHUNK`] tokens for a run of at least two chunks, token by token for
/// shorter ones and decode: the choice of a backend on which the chunked form's matmul-shaped
/// work pays.
pub fn chunks_from(rows: usize) -> Form {
    if rows >= 2 * PREFILL_CHUNK {
        Form::Chunked(PREFILL_CHUNK)
    } else {
        Form::Recurrent
    }
}

/// The shape of a gated-delta-net layer's recurrent core.
///
/// Buffers of a call (rows `seq` of the batch):
/// - `qkv`: `[rows][q | k | v]`, the conv's output: q and k of `n_k_heads * d_k` values each,
///   v of `n_v_heads * d_v` (qwen3.5's conv channel order);
/// - `gate` (log-decay) and `beta` (after the sigmoid): `[rows][n_v_heads]`;
/// - `state`: `[n_v_heads][d_v][d_k]`; row `j` of a head is column `j` of its `S` (`S` is
///   `d_k × d_v`), llama.cpp's layout of the state in its recurrent cache;
/// - `out`: `[rows][n_v_heads * d_v]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeltaNet {
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    pub d_k: usize,
    pub d_v: usize,
    pub key_heads: KeyHeads,
    /// L2-norm q and k per head: `x / sqrt(Σx² + eps)` (llama.cpp's `build_gdn_l2_norm` with
    /// the model's `f_norm_rms_eps`); `None` takes them as given.
    pub l2_eps: Option<f32>,
}

impl DeltaNet {
    /// Width of a `qkv` row.
    pub fn qkv_dim(&self) -> usize {
        2 * self.n_k_heads * self.d_k + self.n_v_heads * self.d_v
    }

    /// Width of an output row.
    pub fn out_dim(&self) -> usize {
        self.n_v_heads * self.d_v
    }

    /// Values of one head's state.
    pub fn head_state(&self) -> usize {
        self.d_k * self.d_v
    }

    /// Values of the whole state.
    pub fn state_len(&self) -> usize {
        self.n_v_heads * self.head_state()
    }

    /// What q is multiplied by after the norm (llama.cpp: `1/sqrt(S_k)`).
    pub fn q_scale(&self) -> f32 {
        1.0 / (self.d_k as f32).sqrt()
    }

    /// The key head value head `h` reads.
    pub fn key_head(&self, h: usize) -> usize {
        match self.key_heads {
            KeyHeads::Tiled => h % self.n_k_heads,
            KeyHeads::Grouped => h / (self.n_v_heads / self.n_k_heads),
        }
    }

    /// Error unless the heads are whole (value heads a multiple of key heads, head widths in
    /// `1..=MAX_HEAD_DIM`), the form's chunk in `1..=MAX_CHUNK`, and the buffers hold the rows
    /// `seq` and the state.
    #[allow(clippy::too_many_arguments)]
    pub fn check(
        &self,
        seq: SeqRows,
        form: Form,
        qkv: usize,
        gate: usize,
        beta: usize,
        state: usize,
        out: usize,
    ) -> Result<(), BackendError> {
        let op = "delta_net";
        if self.n_k_heads == 0 || self.n_v_heads == 0 || !self.n_v_heads.is_multiple_of(self.n_k_heads) {
            return Err(shape(
                op,
                format!("{} value heads over {} key heads", self.n_v_heads, self.n_k_heads),
            ));
        }
        for (what, d) in [("k", self.d_k), ("v", self.d_v)] {
            if d == 0 || d > MAX_HEAD_DIM {
                return Err(shape(op, format!("{what} heads of {d} values (1..={MAX_HEAD_DIM})")));
            }
        }
        if let Form::Chunked(c) = form {
            if c == 0 || c > MAX_CHUNK {
                return Err(shape(op, format!("chunks of {c} tokens (1..={MAX_CHUNK})")));
            }
        }
        if let Some(eps) = self.l2_eps {
            if !eps.is_finite() || eps < 0.0 {
                return Err(shape(op, format!("L2-norm eps {eps}")));
            }
        }
        // Head counts and widths are bounded above only by buffer sizes: products may overflow.
        let wide = |a: usize, b: usize| a.checked_mul(b).ok_or_else(|| shape(op, format!("{a} x {b} values")));
        let qkv_dim = wide(self.n_k_heads, self.d_k)?
            .checked_mul(2)
            .and_then(|q| q.checked_add(self.n_v_heads.checked_mul(self.d_v)?))
            .ok_or_else(|| shape(op, "qkv row overflows".into()))?;
        need(op, "qkv", qkv, seq.end(op, qkv_dim)?)?;
        need(op, "gate", gate, seq.end(op, self.n_v_heads)?)?;
        need(op, "beta", beta, seq.end(op, self.n_v_heads)?)?;
        need(op, "output", out, seq.end(op, wide(self.n_v_heads, self.d_v)?)?)?;
        need(op, "state", state, wide(self.n_v_heads, wide(self.d_k, self.d_v)?)?)
    }
}

/// L2-normalize `x` in place: `x / sqrt(Σx² + eps)` (llama.cpp's `rms_norm(x, eps/n) / sqrt(n)`),
/// then multiply by `scale`.
pub fn l2_normalize(x: &mut [f32], eps: f32, scale: f32) {
    let sum: f32 = x.iter().map(|v| v * v).sum();
    let s = scale / (sum + eps).sqrt();
    x.iter_mut().for_each(|v| *v *= s);
}

/// One token of the gated delta rule on one head, the scalar rule both forms reproduce
/// (ggml's `gated_delta_net` CPU op): with `S = state` (`[d_v][d_k]`, row `j` = column `j` of
/// `S`), `q` already normed and scaled, `k` normed,
/// ```text
/// S  = exp(g) · S
/// d  = β · (v − Sᵀk)
/// S += k ⊗ d
/// o  = Sᵀq
/// ```
/// `out` gets `o` (`d_v`).
///
/// Every step is per row of the state (per column `j` of `S`): `d_j` needs only row `j` after
/// its decay, and `o_j` only row `j` after its update. So the steps run row by row, two passes
/// over a row (decay with `Sᵀk`, then update with `Sᵀq`) while it is in the first-level cache,
/// instead of four passes over the whole state (64 KiB per head at `d_k = d_v = 128`, more than
/// that cache holds). Each value sees the same operations in the same order either way
/// ([`dot`]'s lanes), so the bits do not depend on it.
#[inline(always)]
pub fn delta_token(state: &mut [f32], q: &[f32], k: &[f32], v: &[f32], g: f32, beta: f32, out: &mut [f32]) {
    let d_k = k.len();
    let decay = g.exp();
    for ((row, &vj), o) in state.chunks_exact_mut(d_k).zip(v).zip(out.iter_mut()) {
        let d = (vj - scaled_dot(row, decay, k)) * beta;
        *o = updated_dot(row, k, d, q);
    }
}

/// `row *= decay`, then `row · k` as [`dot`] sums it.
#[inline(always)]
fn scaled_dot(row: &mut [f32], decay: f32, k: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let mut rows = row.chunks_exact_mut(LANES);
    let mut ks = k.chunks_exact(LANES);
    for (cr, ck) in (&mut rows).zip(&mut ks) {
        for l in 0..LANES {
            cr[l] *= decay;
            acc[l] += cr[l] * ck[l];
        }
    }
    let lanes: f32 = acc.iter().sum();
    let rest = rows.into_remainder();
    rest.iter_mut().for_each(|s| *s *= decay);
    lanes + rest.iter().zip(ks.remainder()).map(|(s, x)| s * x).sum::<f32>()
}

/// `row += d · k`, then `row · q` as [`dot`] sums it.
#[inline(always)]
fn updated_dot(row: &mut [f32], k: &[f32], d: f32, q: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let mut rows = row.chunks_exact_mut(LANES);
    let (mut ks, mut qs) = (k.chunks_exact(LANES), q.chunks_exact(LANES));
    for ((cr, ck), cq) in (&mut rows).zip(&mut ks).zip(&mut qs) {
        for l in 0..LANES {
            cr[l] += ck[l] * d;
            acc[l] += cr[l] * cq[l];
        }
    }
    let lanes: f32 = acc.iter().sum();
    let rest = rows.into_remainder();
    rest.iter_mut().zip(ks.remainder()).for_each(|(s, &x)| *s += x * d);
    lanes + rest.iter().zip(qs.remainder()).map(|(s, y)| s * y).sum::<f32>()
}

/// Independent accumulators of [`dot`]: one AVX or two SSE registers.
const LANES: usize = 8;

/// `a · b`, in f32, summed in eight interleaved lanes (so the compiler vectorizes it: the delta
/// rule is mostly these dot products), then the lanes and the tail in order.
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; LANES];
    for (ca, cb) in a.chunks_exact(LANES).zip(b.chunks_exact(LANES)) {
        for ((s, &x), &y) in acc.iter_mut().zip(ca).zip(cb) {
            *s += x * y;
        }
    }
    let tail = n - n % LANES;
    let lanes: f32 = acc.iter().sum();
    lanes + a[tail..].iter().zip(&b[tail..]).map(|(x, y)| x * y).sum::<f32>()
}

/// Check a [`crate::backend::interface::Backend::rmsnorm_gated`] call: `groups` groups of the weight's width in
/// `x` and `z`.
pub fn check_gated_norm(groups: usize, width: usize, x: usize, z: usize) -> Result<(), BackendError> {
    let op = "rmsnorm_gated";
    if width == 0 {
        return Err(shape(op, "a weight of no values".into()));
    }
    let n = groups
        .checked_mul(width)
        .ok_or_else(|| shape(op, format!("{groups} groups of {width} values")))?;
    need(op, "x", x, n)?;
    need(op, "z", z, n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(key_heads: KeyHeads) -> DeltaNet {
        DeltaNet {
            n_k_heads: 2,
            n_v_heads: 6,
            d_k: 4,
            d_v: 3,
            key_heads,
            l2_eps: Some(1e-6),
        }
    }

    #[test]
    fn key_heads_tile_or_group() {
        let tiled: Vec<usize> = (0..6).map(|h| net(KeyHeads::Tiled).key_head(h)).collect();
        let grouped: Vec<usize> = (0..6).map(|h| net(KeyHeads::Grouped).key_head(h)).collect();
        assert_eq!(tiled, [0, 1, 0, 1, 0, 1]);
        assert_eq!(grouped, [0, 0, 0, 1, 1, 1]);
    }

    #[test]
    fn one_token_from_a_zero_state_is_beta_v_times_qk() {
        // S = 0: d = β v, S = k ⊗ d, o = (q·k) β v.
        let (q, k, v) = ([0.5f32, 0.5], [0.6f32, 0.8], [1.0f32, -2.0, 3.0]);
        let mut state = [0f32; 6];
        let mut out = [0f32; 3];
        delta_token(&mut state, &q, &k, &v, -0.3, 0.5, &mut out);
        let qk = 0.5 * 0.6 + 0.5 * 0.8;
        for j in 0..3 {
            assert!((out[j] - qk * 0.5 * v[j]).abs() < 1e-6);
        }
    }

    /// The rule as four passes over the whole state, step by step as written in
    /// [`delta_token`]'s doc.
    fn four_passes(state: &mut [f32], q: &[f32], k: &[f32], v: &[f32], g: f32, beta: f32, out: &mut [f32]) {
        let decay = g.exp();
        state.iter_mut().for_each(|s| *s *= decay);
        let delta: Vec<f32> = state
            .chunks_exact(k.len())
            .zip(v)
            .map(|(row, &vj)| (vj - dot(row, k)) * beta)
            .collect();
        for (row, &d) in state.chunks_exact_mut(k.len()).zip(&delta) {
            row.iter_mut().zip(k).for_each(|(s, &ki)| *s += ki * d);
        }
        for (row, o) in state.chunks_exact(k.len()).zip(out.iter_mut()) {
            *o = dot(row, q);
        }
    }

    #[test]
    fn row_by_row_token_gives_the_four_passes_bits() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut f = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        };
        // Widths with and without a tail past the eight lanes.
        for (dk, dv) in [(128, 128), (13, 5), (8, 3), (3, 4)] {
            let mut a: Vec<f32> = (0..dk * dv).map(|_| f()).collect();
            let mut b = a.clone();
            for _ in 0..4 {
                let (q, k, v): (Vec<f32>, Vec<f32>, Vec<f32>) = (
                    (0..dk).map(|_| f()).collect(),
                    (0..dk).map(|_| f()).collect(),
                    (0..dv).map(|_| f()).collect(),
                );
                let (g, beta) = (-0.5 + 0.4 * f(), 0.5 + 0.4 * f());
                let (mut oa, mut ob) = (vec![0f32; dv], vec![0f32; dv]);
                delta_token(&mut a, &q, &k, &v, g, beta, &mut oa);
                four_passes(&mut b, &q, &k, &v, g, beta, &mut ob);
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&oa), bits(&ob), "outputs, {dk} x {dv}");
                assert_eq!(bits(&a), bits(&b), "state, {dk} x {dv}");
            }
        }
    }

    #[test]
    fn gates_follow_ggml() {
        let (g, b) = gates(0.5, 0.0, 0.25, -2.0);
        assert!((g - -2.0 * (1.0 + 0.75f32.exp()).ln()).abs() < 1e-6);
        assert_eq!(b, 0.5);
        assert_eq!(softplus(30.0), 30.0);
    }

    #[test]
    fn checks_name_the_problem() {
        let seq = SeqRows { row0: 0, rows: 2 };
        let p = net(KeyHeads::Tiled);
        let (qkv, out, st) = (2 * p.qkv_dim(), 2 * p.out_dim(), p.state_len());
        assert!(p.check(seq, Form::Recurrent, qkv, 12, 12, st, out).is_ok());
        let e = p.check(seq, Form::Chunked(0), qkv, 12, 12, st, out).unwrap_err();
        assert!(e.to_string().contains("chunks of 0"), "{e}");
        let e = p.check(seq, Form::Recurrent, qkv - 1, 12, 12, st, out).unwrap_err();
        assert!(e.to_string().contains("qkv"), "{e}");
        let bad = DeltaNet { n_v_heads: 5, ..p };
        assert!(bad.check(seq, Form::Recurrent, qkv, 12, 12, st, out).is_err());
        let huge = SeqRows {
            row0: usize::MAX,
            rows: 2,
        };
        assert!(p.check(huge, Form::Recurrent, qkv, 12, 12, st, out).is_err());
        let conv = Conv {
            channels: 3,
            kernel: 4,
            silu: true,
        };
        assert!(conv.check(seq, 6, 12, 9, 6).is_ok());
        assert!(conv.check(seq, 6, 12, 8, 6).is_err());
        assert!(conv.check(seq, 6, 11, 9, 6).is_err());
        assert!(check_gates(2, 3, 6, 6, 3, 3).is_ok());
        assert!(check_gates(2, 3, 6, 6, 2, 3).is_err());
    }
}
