//! The op bodies both GPU backends share: check the arguments, plan the dispatch, record it with
//! the buffers bound where the kernel reads them. A device layer supplies only [`Record`]
//! (recording a [`Dispatch`] with its buffers); a buffer travels as `(buffer, values it holds)`.
//! Ops whose recording differs by device (matmuls over textures or integer dot products,
//! attention's scratch, copies, readbacks) stay in the backends.

use super::plan;
use super::{Dispatch, Kernel};
use crate::backend::recurrent;
use crate::backend::{checks, moe, rotation, BackendError, Conv, DeltaNet, Form, KvType, Rope, Route, SeqRows};

/// What the shared op bodies need from a device layer.
pub trait Record {
    /// A device buffer, bound as storage.
    type Buf;

    /// Record `d` with `binds` (binding index, buffer) besides its parameters and own data.
    fn record(&self, op: &'static str, d: &Dispatch, binds: &[(u32, &Self::Buf)]) -> Result<(), BackendError>;

    /// Bound where a kernel's optional input is absent (rope without factors, no bias).
    fn dummy(&self) -> &Self::Buf;
}

/// A buffer and the number of values it holds.
pub type Arg<'a, B> = (&'a B, usize);

/// `x[i] = f(x[i], y[i])` for the first `len` values (add, swiglu, geglu, sigmoid_mul); `y`
/// is named `name` in errors.
pub fn binary<G: Record>(
    g: &G,
    op: &'static str,
    kernel: Kernel,
    x: Arg<'_, G::Buf>,
    (name, y): (&'static str, Arg<'_, G::Buf>),
    len: usize,
) -> Result<(), BackendError> {
    checks::elementwise(op, x.1, Some((name, y.1)), len)?;
    if let Some(d) = plan::elementwise(op, kernel, len, 1, 0.0)? {
        g.record(op, &d, &[(1, x.0), (2, y.0)])?;
    }
    Ok(())
}

/// `x[i] *= s` for the first `len` values.
pub fn scale<G: Record>(g: &G, x: Arg<'_, G::Buf>, len: usize, s: f32) -> Result<(), BackendError> {
    checks::elementwise("scale", x.1, None, len)?;
    if let Some(d) = plan::elementwise("scale", Kernel::Scale, len, 1, s)? {
        g.record("scale", &d, &[(1, x.0)])?;
    }
    Ok(())
}

/// [`crate::backend::Backend::hadamard`]: one workgroup per group (hadamard.wgsl).
pub fn hadamard<G: Record>(g: &G, x: Arg<'_, G::Buf>, groups: usize, n: usize) -> Result<(), BackendError> {
    rotation::check(x.1, groups, n)?;
    if let Some(d) = plan::hadamard(groups, n)? {
        g.record("hadamard", &d, &[(1, x.0)])?;
    }
    Ok(())
}

/// `x[r] += bias` for `rows` rows of the bias's `bias.1` values.
pub fn add_bias<G: Record>(g: &G, x: Arg<'_, G::Buf>, bias: Arg<'_, G::Buf>, rows: usize) -> Result<(), BackendError> {
    let len = rows * bias.1;
    checks::elementwise("add_bias", x.1, None, len)?;
    if let Some(d) = plan::elementwise("add_bias", Kernel::AddBias, len, bias.1, 0.0)? {
        g.record("add_bias", &d, &[(1, x.0), (2, bias.0)])?;
    }
    Ok(())
}

/// RMS norm of `groups` groups of `w.1` values times `w`, into `out`.
pub fn rmsnorm<G: Record>(
    g: &G,
    x: Arg<'_, G::Buf>,
    w: Arg<'_, G::Buf>,
    groups: usize,
    eps: f32,
    out: Arg<'_, G::Buf>,
) -> Result<(), BackendError> {
    checks::norm(Some(x.1), out.1, groups, w.1)?;
    if let Some(d) = plan::norm(Kernel::RmsNorm, w.1, groups, eps)? {
        g.record("rmsnorm", &d, &[(1, x.0), (2, w.0), (3, out.0)])?;
    }
    Ok(())
}

/// [`rmsnorm`] in place.
pub fn rmsnorm_inplace<G: Record>(
    g: &G,
    x: Arg<'_, G::Buf>,
    w: Arg<'_, G::Buf>,
    groups: usize,
    eps: f32,
) -> Result<(), BackendError> {
    checks::norm(None, x.1, groups, w.1)?;
    if let Some(d) = plan::norm(Kernel::RmsNormInplace, w.1, groups, eps)? {
        g.record("rmsnorm", &d, &[(2, w.0), (4, x.0)])?;
    }
    Ok(())
}

/// In place, `x = rmsnorm(x) · w · silu(z)` for `groups` groups of `w.1` values.
pub fn rmsnorm_gated<G: Record>(
    g: &G,
    x: Arg<'_, G::Buf>,
    z: Arg<'_, G::Buf>,
    w: Arg<'_, G::Buf>,
    groups: usize,
    eps: f32,
) -> Result<(), BackendError> {
    recurrent::check_gated_norm(groups, w.1, x.1, z.1)?;
    if let Some(d) = plan::norm(Kernel::RmsNormGated, w.1, groups, eps)? {
        g.record("rmsnorm_gated", &d, &[(1, z.0), (2, w.0), (4, x.0)])?;
    }
    Ok(())
}

/// Rope of `positions.len()` rows of `n_head` heads of `head_dim` in place.
pub fn rope<G: Record>(
    g: &G,
    x: Arg<'_, G::Buf>,
    (n_head, head_dim): (usize, usize),
    positions: &[u32],
    rope: &Rope,
    factors: Option<Arg<'_, G::Buf>>,
) -> Result<(), BackendError> {
    checks::rope(x.1, n_head, head_dim, positions, rope, factors.map(|f| f.1))?;
    if let Some(d) = plan::rope(n_head, head_dim, positions, rope, factors.is_some())? {
        let f = factors.map_or(g.dummy(), |f| f.0);
        g.record("rope", &d, &[(1, x.0), (2, f)])?;
    }
    Ok(())
}

/// A KV cache as the kernels see it: its words, the values it holds, its format and its
/// first scale word ([`plan::kv_words`]).
pub struct KvArg<'a, B> {
    pub buf: &'a B,
    pub len: usize,
    pub ty: KvType,
    pub scales: usize,
}

/// Store rows `row0..` of `src` (`width` each) in `cache` at `positions`.
pub fn kv_store<G: Record>(
    g: &G,
    cache: KvArg<'_, G::Buf>,
    src: Arg<'_, G::Buf>,
    row0: usize,
    width: usize,
    positions: &[u32],
) -> Result<(), BackendError> {
    checks::kv_store((cache.len, cache.ty), src.1, row0, width, positions)?;
    if let Some(d) = plan::kv_store(row0, width, positions, cache.ty, cache.scales)? {
        g.record("kv_store", &d, &[(1, src.0), (3, cache.buf)])?;
    }
    Ok(())
}

/// gpt-oss's clamped SwiGLU on the first `len` values, in `gate`.
pub fn swiglu_oai<G: Record>(
    g: &G,
    gate: Arg<'_, G::Buf>,
    up: Arg<'_, G::Buf>,
    len: usize,
    alpha: f32,
    limit: f32,
) -> Result<(), BackendError> {
    checks::elementwise("swiglu_oai", gate.1, Some(("up", up.1)), len)?;
    if let Some(d) = plan::moe_elementwise("swiglu_oai", Kernel::SwigluOai, len, 1, 0, alpha, limit)? {
        g.record("swiglu_oai", &d, &[(1, gate.0), (2, up.0)])?;
    }
    Ok(())
}

/// Route `rows` rows of router logits into expert ids and weights.
pub fn route_experts<G: Record>(
    g: &G,
    logits: Arg<'_, G::Buf>,
    rows: usize,
    route: &Route,
    bias: Option<Arg<'_, G::Buf>>,
    ids: Arg<'_, G::Buf>,
    weights: Arg<'_, G::Buf>,
) -> Result<(), BackendError> {
    route.check_call(rows, logits.1, bias.map(|b| b.1), ids.1, weights.1)?;
    if let Some(d) = plan::route(rows, route, bias.is_some())? {
        let b = bias.map_or(g.dummy(), |b| b.0);
        g.record(
            "route_experts",
            &d,
            &[(1, logits.0), (2, b), (3, ids.0), (4, weights.0)],
        )?;
    }
    Ok(())
}

/// The weighted sum of each row's `slots` expert outputs of `width` values.
pub fn moe_combine<G: Record>(
    g: &G,
    experts: Arg<'_, G::Buf>,
    weights: Arg<'_, G::Buf>,
    (rows, slots, width): (usize, usize, usize),
    out: Arg<'_, G::Buf>,
) -> Result<(), BackendError> {
    moe::check_combine(rows, slots, width, experts.1, weights.1, out.1)?;
    let len = rows * width;
    if let Some(d) = plan::moe_elementwise("moe_combine", Kernel::MoeCombine, len, width, slots, 0.0, 0.0)? {
        g.record("moe_combine", &d, &[(1, out.0), (2, experts.0), (3, weights.0)])?;
    }
    Ok(())
}

/// The causal conv1d of `seq`'s rows, `w` the kernel's f32 values.
pub fn ssm_conv<G: Record>(
    g: &G,
    x: Arg<'_, G::Buf>,
    w: Arg<'_, G::Buf>,
    p: &Conv,
    seq: SeqRows,
    state: Arg<'_, G::Buf>,
    out: Arg<'_, G::Buf>,
) -> Result<(), BackendError> {
    p.check(seq, x.1, w.1, state.1, out.1)?;
    if let Some(d) = plan::ssm_conv(p, seq)? {
        g.record("ssm_conv", &d, &[(1, x.0), (2, w.0), (3, state.0), (4, out.0)])?;
    }
    Ok(())
}

/// A gated delta net's gates for `rows` rows, one value per head (`dt_bias.1` heads).
pub fn delta_gates<G: Record>(
    g: &G,
    alpha: Arg<'_, G::Buf>,
    beta: Arg<'_, G::Buf>,
    rows: usize,
    dt_bias: Arg<'_, G::Buf>,
    a: Arg<'_, G::Buf>,
) -> Result<(), BackendError> {
    let n_head = dt_bias.1;
    recurrent::check_gates(rows, n_head, alpha.1, beta.1, n_head, a.1)?;
    if let Some(d) = plan::delta_gates(rows, n_head)? {
        g.record(
            "delta_gates",
            &d,
            &[(1, alpha.0), (2, beta.0), (3, dt_bias.0), (4, a.0)],
        )?;
    }
    Ok(())
}

/// The gated delta rule over `seq`'s rows, token by token in either form.
#[allow(clippy::too_many_arguments)]
pub fn delta_net<G: Record>(
    g: &G,
    p: &DeltaNet,
    form: Form,
    seq: SeqRows,
    qkv: Arg<'_, G::Buf>,
    gate: Arg<'_, G::Buf>,
    beta: Arg<'_, G::Buf>,
    state: Arg<'_, G::Buf>,
    out: Arg<'_, G::Buf>,
) -> Result<(), BackendError> {
    p.check(seq, form, qkv.1, gate.1, beta.1, state.1, out.1)?;
    if let Some(d) = plan::delta_net(p, seq)? {
        let binds = [(1, qkv.0), (2, gate.0), (3, beta.0), (4, state.0), (5, out.0)];
        g.record("delta_net", &d, &binds)?;
    }
    Ok(())
}
