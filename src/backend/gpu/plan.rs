//! Per op, the dispatches a GPU backend records: kernel variant, parameter block (laid out as
//! the kernel's `Params` struct), grid, and the data of its own storage binding. Shapes are
//! checked by [`crate::backend::checks`] before these run; what is checked here is what only a
//! GPU needs (32-bit indices, grid and binding limits). Binding numbers in the docs are the
//! kernels'.

use crate::backend::attn::AttnParams;
use crate::backend::checks::shape;
use crate::backend::error::BackendError;
use crate::backend::gpu::dispatch::{grid, u, words, Dispatch};
use crate::backend::gpu::kernels::{AttnPass, Kernel};
use crate::backend::gpu::sizes::{DELTA_COLUMNS, DELTA_MAX_DK, SPLIT_MAX_ROWS, X_WINDOW_BYTES};
use crate::backend::gpu::sizes::{MATMUL_ROWS, MAX_GRID, NARROW_HEAD_DIM};
use crate::backend::gpu::strategy::MatmulVariant;
use crate::backend::gpu::strategy::Strategy;
use crate::backend::kv::KvType;
use crate::backend::moe::{Gating, MatId, Route};
use crate::backend::recurrent::{Conv, DeltaNet, KeyHeads, SeqRows};
use crate::backend::rope::{Rope, RopeKind};
use crate::quant::GgmlType;
use crate::sample::Candidates;

fn dispatch(kernel: Kernel, params: Vec<u8>, groups: (u32, u32, u32)) -> Dispatch {
    Dispatch {
        kernel,
        params,
        extra: None,
        groups,
    }
}

/// An element-wise kernel over `len` values (`width`: the bias length of add_bias, `s`: the
/// factor of scale). Binds x at 1, the second operand at 2. `None` when there is nothing to do.
pub fn elementwise(
    op: &'static str,
    kernel: Kernel,
    len: usize,
    width: usize,
    s: f32,
) -> Result<Option<Dispatch>, BackendError> {
    if len == 0 {
        return Ok(None);
    }
    let (gx, gy) = grid(len.div_ceil(256));
    let params = words(&[u(op, len)?, u(op, width)?, s.to_bits(), gx]);
    Ok(Some(dispatch(kernel, params, (gx, gy, 1))))
}

/// How the CPU backend rounds activations before a matmul over weights of type `ty` (its
/// `vec_dot_type`): quantize_act.wgsl's mode and the values per block, `None` for f32 weights.
/// The GPU matmuls then multiply the same values the CPU's (and llama.cpp's) do.
pub fn act_rounding(ty: GgmlType) -> Option<(u32, usize)> {
    match (ty, ty.vec_dot_type()) {
        (_, GgmlType::Q8_0) => Some((0, 32)),
        (_, GgmlType::Q8_K) => Some((1, 256)),
        (GgmlType::F16, _) => Some((2, 1)),
        (GgmlType::BF16, _) => Some((3, 1)),
        _ => None,
    }
}

/// Round `len` activations for a matmul over weights of type `ty` ([`act_rounding`]). Binds
/// the activations at 1, the rounded copy at 2. `None` when `ty` takes them as they are or
/// there are none; an error when `len` is not whole blocks.
pub fn quantize_act(ty: GgmlType, len: usize) -> Result<Option<Dispatch>, BackendError> {
    let Some((mode, block)) = act_rounding(ty) else {
        return Ok(None);
    };
    if len == 0 {
        return Ok(None);
    }
    if !len.is_multiple_of(block) {
        return Err(shape(
            "matmul",
            format!(
                "{len} activations are not whole blocks of {block} ({} weights)",
                ty.name()
            ),
        ));
    }
    let (gx, gy) = grid((len / block).div_ceil(64));
    let params = words(&[u("quantize_act", len)?, u("quantize_act", block)?, mode, gx]);
    Ok(Some(dispatch(Kernel::QuantizeAct, params, (gx, gy, 1))))
}

/// Words of the packed Q8_0 activations of `len` values (quantize_q8_packed.wgsl): 9 per
/// block of 32.
pub fn packed_q8_words(len: usize) -> usize {
    len / 32 * 9
}

/// `len` activations (whole blocks of 32) quantized to packed Q8_0 blocks for
/// [`matmul_dot`]. Binds the activations at 1, the [`packed_q8_words`] output at 2.
pub fn quantize_q8_packed(len: usize) -> Result<Dispatch, BackendError> {
    if !len.is_multiple_of(32) {
        return Err(shape("matmul", format!("{len} activations are not whole blocks of 32")));
    }
    let (gx, gy) = grid((len / 32).div_ceil(64));
    let params = words(&[u("quantize_act", len)?, 32, 0, gx]);
    Ok(dispatch(Kernel::QuantizeQ8Packed, params, (gx, gy, 1)))
}

/// The integer-dot matmul (matmul_dot.wgsl) of `rows` packed activation rows with one part of
/// a Q8_0 matrix, a workgroup per weight row as [`matmul`]'s workgroup variant. Binds the
/// weights at 1, the packed activations at 2, the output at 3.
pub fn matmul_dot(m: MatShape, part: PartRows, rows: usize, row_bytes: usize) -> Result<Dispatch, BackendError> {
    if m.ty != GgmlType::Q8_0 {
        return Err(shape(
            "matmul",
            format!("integer dot products take Q8_0 weights, not {}", m.ty),
        ));
    }
    let tiles = rows.div_ceil(MATMUL_ROWS);
    if tiles > MAX_GRID as usize {
        return Err(shape("matmul", format!("{rows} rows exceed one dispatch")));
    }
    let (gx, gy) = grid(part.rows);
    let params = matmul_params(m, part, rows, row_bytes, gx, 0)?;
    Ok(dispatch(Kernel::MatmulDot(m.ty), params, (gx, gy, tiles as u32)))
}

/// Activation rows and weight rows of a [`Kernel::MatmulCoop`] workgroup's tile.
pub const COOP_TILE: (usize, usize) = (32, 64);

/// The cooperative-matrix matmul (matmul_coop.wgsl, matrices of `size`) of `rows` activation
/// rows with one buffer part of a matrix: a workgroup per tile of [`COOP_TILE`]. Binds the
/// weights at 1, the activations at 2, the output at 3.
pub fn matmul_coop(
    m: MatShape,
    part: PartRows,
    rows: usize,
    row_bytes: usize,
    size: u8,
) -> Result<Dispatch, BackendError> {
    let tiles = rows.div_ceil(COOP_TILE.0);
    if tiles > MAX_GRID as usize {
        return Err(shape("matmul", format!("{rows} rows exceed one dispatch")));
    }
    let (gx, gy) = grid(part.rows.div_ceil(COOP_TILE.1));
    let params = matmul_params(m, part, rows, row_bytes, gx, 0)?;
    Ok(dispatch(
        Kernel::MatmulCoop { ty: m.ty, size },
        params,
        (gx, gy, tiles as u32),
    ))
}

/// RMS norm of `groups` groups of `g`. Binds x at 1, the weight at 2, the output at 3 (in
/// place: at 4).
pub fn norm(kernel: Kernel, g: usize, groups: usize, eps: f32) -> Result<Option<Dispatch>, BackendError> {
    if groups == 0 {
        return Ok(None);
    }
    let (gx, gy) = grid(groups);
    let params = words(&[u("rmsnorm", g)?, u("rmsnorm", groups)?, eps.to_bits(), gx]);
    Ok(Some(dispatch(kernel, params, (gx, gy, 1))))
}

/// The Walsh-Hadamard rotation of `groups` groups of `n` values: a workgroup per group, the
/// scale from [`crate::backend::rotation::scale`].
pub fn hadamard(groups: usize, n: usize) -> Result<Option<Dispatch>, BackendError> {
    if groups == 0 {
        return Ok(None);
    }
    let (gx, gy) = grid(groups);
    let s = crate::backend::rotation::scale(n);
    let params = words(&[u("hadamard", n)?, u("hadamard", groups)?, s.to_bits(), gx]);
    Ok(Some(dispatch(Kernel::Hadamard, params, (gx, gy, 1))))
}

/// The rows of a weight held by one buffer or texture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartRows {
    pub row0: usize,
    pub rows: usize,
}

/// Embedding lookup of `tokens` from one part of a table of rows of `width` values,
/// `row_bytes` apart. Binds the weights at 1 (the token ids at 2), the output at 3.
pub fn embed(
    kernel: Kernel,
    width: usize,
    row_bytes: usize,
    tokens: &[u32],
    part: PartRows,
    scale: f32,
) -> Result<Dispatch, BackendError> {
    let e = |v: usize| u("embed", v);
    let n_chunks = width.div_ceil(32);
    let (gx, gy) = grid((tokens.len() * n_chunks).div_ceil(64));
    let params = words(&[
        e(width)?,
        e(n_chunks)?,
        e(row_bytes)?,
        e(tokens.len())?,
        e(part.row0)?,
        e(part.rows)?,
        scale.to_bits(),
        gx,
    ]);
    Ok(Dispatch {
        kernel,
        params,
        extra: Some((2, bytemuck::cast_slice(tokens).to_vec())),
        groups: (gx, gy, 1),
    })
}

/// A matrix's shape for the matmul kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatShape {
    pub ty: GgmlType,
    pub n_in: usize,
    pub n_out: usize,
}

/// The parameter block of every matmul kernel (matmul_params.wgsl) for `part`: `rows`
/// activation rows from `row0` (texture tiles; 0 otherwise), weight rows `row_bytes` apart.
fn matmul_params(
    m: MatShape,
    part: PartRows,
    rows: usize,
    row_bytes: usize,
    grid_x: u32,
    row0: usize,
) -> Result<Vec<u8>, BackendError> {
    let c = |v: usize| u("matmul", v);
    Ok(words(&[
        c(m.n_in)?,
        c(part.rows)?,
        c(rows)?,
        c(row_bytes)?,
        c(m.n_in.div_ceil(32))?,
        c(m.n_out)?,
        c(part.row0)?,
        grid_x,
        c(row0)?,
        0,
        0,
        0,
    ]))
}

/// Matmul of `rows` activation rows with one buffer part of a matrix (`row_bytes` per weight
/// row). Binds the weights at 1, the activations at 2, the output at 3.
pub fn matmul(
    st: &Strategy,
    m: MatShape,
    part: PartRows,
    rows: usize,
    row_bytes: usize,
) -> Result<Dispatch, BackendError> {
    let tiles = rows.div_ceil(MATMUL_ROWS);
    if tiles > MAX_GRID as usize {
        return Err(shape("matmul", format!("{rows} rows exceed one dispatch")));
    }
    let (gx, gy, gz) = match st.matmul {
        MatmulVariant::Workgroup => {
            let (x, y) = grid(part.rows);
            (x, y, tiles as u32)
        }
        MatmulVariant::Rows | MatmulVariant::Texture => {
            let (x, y) = grid((part.rows * tiles).div_ceil(64));
            (x, y, 1)
        }
    };
    let params = matmul_params(m, part, rows, row_bytes, gx, 0)?;
    Ok(dispatch(st.matmul_kernel(m.ty, m.n_in), params, (gx, gy, gz)))
}

/// The tiles `(row0, rows)` in which `rows` activation rows of `n_in` values pass through the
/// uniform window of the texture matmul: up to 8 rows, fewer when rows are long (at least one
/// fits: [`Strategy::textured`] admits no longer rows).
pub fn tex_tiles(n_in: usize, rows: usize) -> impl Iterator<Item = (usize, usize)> {
    let max_tile = (X_WINDOW_BYTES / (n_in.max(1) * 4)).clamp(1, MATMUL_ROWS);
    (0..rows).step_by(max_tile).map(move |r0| (r0, max_tile.min(rows - r0)))
}

/// Matmul of the activation tile `row0..row0 + rows` (already in the uniform window) with one
/// texture part (`stride` bytes per weight row). Binds the texture at 1, the window at 2, the
/// output at 3.
pub fn matmul_tex(
    st: &Strategy,
    m: MatShape,
    part: PartRows,
    row0: usize,
    rows: usize,
    stride: usize,
) -> Result<Dispatch, BackendError> {
    let (gx, gy) = grid(part.rows.div_ceil(64));
    let params = matmul_params(m, part, rows, stride, gx, row0)?;
    Ok(dispatch(st.matmul_tex_kernel(m.ty, rows), params, (gx, gy, 1)))
}

/// Rope of `positions.len()` rows in place. Binds x at 1, the frequency factors at 2 (any
/// buffer without them), the positions at 3. `None` when there is nothing to do.
pub fn rope(
    n_head: usize,
    head_dim: usize,
    positions: &[u32],
    rope: &Rope,
    has_factors: bool,
) -> Result<Option<Dispatch>, BackendError> {
    let rows = positions.len();
    let n = rows * n_head * (rope.n_rot / 2);
    if n == 0 {
        return Ok(None);
    }
    let r = |v: usize| u("rope", v);
    // The same recipe as the CPU's rope_table, so both start from the same f32 values.
    let a = rope.angles();
    let (gx, gy) = grid(n.div_ceil(64));
    let params = words(&[
        r(rows)?,
        r(n_head)?,
        r(head_dim)?,
        r(rope.n_rot)?,
        u32::from(rope.kind == RopeKind::Neox),
        u32::from(has_factors),
        gx,
        a.theta_scale.to_bits(),
        a.freq_scale.to_bits(),
        a.ext_factor.to_bits(),
        a.mscale.to_bits(),
        a.corr_dims[0].to_bits(),
        a.corr_dims[1].to_bits(),
        0,
        0,
        0,
    ]);
    Ok(Some(Dispatch {
        kernel: Kernel::Rope,
        params,
        extra: Some((3, bytemuck::cast_slice(positions).to_vec())),
        groups: (gx, gy, 1),
    }))
}

/// Store rows `row0..` of a source (`width` each) at the cache rows `positions` of a cache in
/// format `kv` (a q8_0 cache's scale words from word `scales`: [`kv_words`]). Binds the source
/// at 1, the positions at 2, the cache at 3.
pub fn kv_store(
    row0: usize,
    width: usize,
    positions: &[u32],
    kv: KvType,
    scales: usize,
) -> Result<Option<Dispatch>, BackendError> {
    let n = positions.len() * width;
    if n == 0 {
        return Ok(None);
    }
    let k = |v: usize| u("kv_store", v);
    // The largest index the kernel forms, so none of them wraps.
    let last = positions.iter().max().map_or(0, |&p| p as usize + 1) * width;
    k(last.max((row0 + positions.len()) * width))?;
    let (per_group, invocations) = match kv {
        KvType::F16 => (256, n),
        // One invocation per block.
        KvType::Q8_0 => (64, n / kv.block_values()),
    };
    let (gx, gy) = grid(invocations.div_ceil(per_group));
    let mut w = vec![k(positions.len())?, k(width)?, k(row0)?, gx];
    if kv == KvType::Q8_0 {
        w.extend([k(scales)?, 0, 0, 0]);
    }
    let params = words(&w);
    Ok(Some(Dispatch {
        kernel: Kernel::KvStore(kv),
        params,
        extra: Some((2, bytemuck::cast_slice(positions).to_vec())),
        groups: (gx, gy, 1),
    }))
}

/// The 32-bit words a GPU KV cache of `len` values in format `kv` takes, and the first word of
/// its block scales. f16: one f32 per value (rounded to f16), no scales. q8_0: the int8 values,
/// four per word, then the f16 scales, two per word (kv_store_q8_0.wgsl): 34 bytes per 32
/// values, as ggml's blocks.
pub fn kv_words(len: usize, kv: KvType) -> (usize, usize) {
    match kv {
        KvType::F16 => (len, 0),
        KvType::Q8_0 => {
            let blocks = len / kv.block_values();
            (len / 4 + blocks.div_ceil(2), len / 4)
        }
    }
}

/// The dispatches of one sequence's attention: one pass, or three split across the KV length
/// with a partial-results buffer of `partial_floats` values.
#[derive(Debug, Clone, PartialEq)]
pub enum AttnPlan {
    /// Binds q at 1, the K and V caches at 2 and 3, the output at 4, the sinks at 6.
    Whole(Dispatch),
    /// `stats` binds q, K and the partials (5); `weigh` q, K, V, the partials and the sinks;
    /// `merge` the output and the partials.
    Split {
        stats: Dispatch,
        weigh: Dispatch,
        merge: Dispatch,
        partial_floats: usize,
    },
}

/// The parameter block of attention.wgsl.
#[allow(clippy::too_many_arguments)]
fn attn_params(
    p: &AttnParams,
    row0: usize,
    sinks: bool,
    gx: u32,
    n_split: usize,
    chunk: usize,
    acc_off: usize,
    (k_scales, v_scales): (usize, usize),
) -> Result<Vec<u8>, BackendError> {
    let a = |v: usize| u("attention", v);
    let (v_pos, v_head) = p.v_layout();
    Ok(words(&[
        a(p.rows)?,
        a(p.pos0)?,
        a(p.n_head)?,
        a(p.n_head_kv)?,
        a(p.head_dim_k)?,
        a(p.head_dim_v)?,
        a(p.window.unwrap_or(0))?,
        gx,
        a(n_split)?,
        p.scale.to_bits(),
        a(chunk)?,
        a(acc_off)?,
        a(row0)?,
        p.softcap.unwrap_or(0.0).to_bits(),
        u32::from(sinks),
        a(v_pos)?,
        a(v_head)?,
        a(k_scales)?,
        a(v_scales)?,
        0,
    ]))
}

/// Attention of one sequence whose rows start at row `row0` of the batch (`p` checked by
/// [`AttnParams::check`]) over caches in format `kv`, whose scales (a block format's) start at
/// the words `scales` ([`kv_words`]).
pub fn attention(
    st: &Strategy,
    p: &AttnParams,
    row0: usize,
    sinks: bool,
    kv: KvType,
    scales: (usize, usize),
) -> Result<Option<AttnPlan>, BackendError> {
    if p.rows == 0 {
        return Ok(None);
    }
    // Indices the kernel forms: the caches' and the batch's last values.
    let positions = p.pos0 + p.rows;
    u("attention", positions * p.n_head_kv * p.head_dim_k.max(p.head_dim_v))?;
    u("attention", (row0 + p.rows) * p.n_head * p.head_dim_k.max(p.head_dim_v))?;
    let wide = p.head_dim_k.max(p.head_dim_v) > NARROW_HEAD_DIM;
    let kernel = |pass| Kernel::Attention(pass, wide, kv);
    let split = st
        .kv_chunk
        .filter(|&c| c > 0 && positions > c && (st.split_any_rows || p.rows <= SPLIT_MAX_ROWS));
    let Some(chunk) = split else {
        let (gx, gy) = grid(p.rows * p.n_head);
        let params = attn_params(p, row0, sinks, gx, 1, 0, 0, scales)?;
        return Ok(Some(AttnPlan::Whole(dispatch(
            kernel(AttnPass::Main),
            params,
            (gx, gy, 1),
        ))));
    };
    let n_split = positions.div_ceil(chunk);
    let parts = p.rows * p.n_head * n_split;
    let acc_off = 2 * parts;
    let partial_floats = acc_off + parts * p.head_dim_v;
    if partial_floats as u64 * 4 > st.max_storage {
        return Err(shape(
            "attention",
            format!("{parts} split partial results exceed the device's largest storage binding"),
        ));
    }
    let (gx, gy) = grid(parts);
    let params = attn_params(p, row0, sinks, gx, n_split, chunk, acc_off, scales)?;
    let (mx, my) = grid(p.rows * p.n_head);
    let merge_params = attn_params(p, row0, sinks, mx, n_split, chunk, acc_off, scales)?;
    Ok(Some(AttnPlan::Split {
        stats: dispatch(kernel(AttnPass::Stats), params.clone(), (gx, gy, 1)),
        weigh: dispatch(kernel(AttnPass::Weigh), params, (gx, gy, 1)),
        merge: dispatch(kernel(AttnPass::Merge), merge_params, (mx, my, 1)),
        partial_floats,
    }))
}

/// Argmax of `rows` rows of `width`. Binds the input at 1, the result (`rows` u32) at 2.
pub fn argmax(rows: usize, width: usize) -> Result<Dispatch, BackendError> {
    let (gx, gy) = grid(rows);
    let params = words(&[u("argmax", rows)?, u("argmax", width)?, gx, 0]);
    Ok(dispatch(Kernel::Argmax, params, (gx, gy, 1)))
}

/// The dispatch of [`top_k`] and the layout of its result.
pub struct TopK {
    pub dispatch: Dispatch,
    /// `k`, at most the row width.
    pub k: usize,
    /// u32 words per row of the result.
    pub per_row: usize,
}

/// A sampler's candidates of `rows` rows of `width`: per row `k` ids, their `k` values, then
/// the values at `gather` (`per_row` u32 words). Binds the input at 1 (the gather ids at 2),
/// the result at 3.
pub fn top_k(st: &Strategy, rows: usize, width: usize, k: usize, gather: &[u32]) -> Result<TopK, BackendError> {
    let k = k.min(width);
    let per_row = 2 * k + gather.len();
    rows.checked_mul(per_row)
        .filter(|&n| n as u64 * 4 <= st.max_storage)
        .ok_or_else(|| shape("top_k", format!("{rows} rows of {per_row} candidates exceed a binding")))?;
    let t = |v: usize| u("top_k", v);
    let (gx, gy) = grid(rows);
    let params = words(&[t(rows)?, t(width)?, t(k)?, gx, t(gather.len())?, 0, 0, 0]);
    // The gather ids go in a binding of their own (at least one word: a binding is never empty).
    let ids: Vec<u32> = if gather.is_empty() { vec![0] } else { gather.to_vec() };
    Ok(TopK {
        dispatch: Dispatch {
            kernel: Kernel::Select,
            params,
            extra: Some((2, bytemuck::cast_slice(&ids).to_vec())),
            groups: (gx, gy, 1),
        },
        k,
        per_row,
    })
}

/// The candidates of select.wgsl's result words, `per_row` per row: `k` ids, their `k` values
/// (f32 bits), then the gathered values.
pub fn candidates(words: &[u32], k: usize, per_row: usize) -> Vec<Candidates> {
    words
        .chunks_exact(per_row)
        .map(|r| Candidates {
            top: r[..k]
                .iter()
                .zip(&r[k..2 * k])
                .map(|(&i, &v)| (i, f32::from_bits(v)))
                .collect(),
            gathered: r[2 * k..].iter().map(|&v| f32::from_bits(v)).collect(),
        })
        .collect()
}

/// Route `rows` rows of router logits (`route` checked by the caller). Binds the logits at 1,
/// the bias at 2 (any buffer without one), the ids at 3 and the weights at 4.
pub fn route(rows: usize, route: &Route, has_bias: bool) -> Result<Option<Dispatch>, BackendError> {
    if rows == 0 {
        return Ok(None);
    }
    let r = |v: usize| u("route_experts", v);
    r(rows * route.n_expert)?;
    let gating = match route.gating {
        Gating::Softmax => 0,
        Gating::Sigmoid => 1,
        Gating::SoftmaxWeight => 2,
    };
    let (gx, gy) = grid(rows.div_ceil(64));
    let params = words(&[
        r(rows)?,
        r(route.n_expert)?,
        r(route.k)?,
        gating,
        u32::from(route.norm),
        u32::from(has_bias),
        route.scale.to_bits(),
        gx,
    ]);
    Ok(Some(dispatch(Kernel::Route, params, (gx, gy, 1))))
}

/// The routed matmul ([`MatId`], checked by the caller) with one part of a stack of `n_mat`
/// matrices of `m.n_out` rows each (`part` in rows of the whole stack). Binds the weights at 1,
/// the inputs at 2, the outputs at 3, the ids at 4 and the bias at 5 (any buffer without one).
pub fn matmul_id(
    m: MatShape,
    n_mat: usize,
    part: PartRows,
    row_bytes: usize,
    id: MatId,
    has_bias: bool,
) -> Result<Option<Dispatch>, BackendError> {
    let pairs = id.pairs();
    if pairs == 0 {
        return Ok(None);
    }
    let c = |v: usize| u("matmul_id", v);
    c(pairs * m.n_out)?;
    c(m.n_out * n_mat)?;
    c(id.inputs() * m.n_in)?;
    let (gx, gy) = grid((pairs * m.n_out).div_ceil(64));
    let params = words(&[
        c(m.n_in)?,
        c(m.n_out)?,
        c(n_mat)?,
        c(row_bytes)?,
        c(m.n_in.div_ceil(32))?,
        c(pairs)?,
        c(id.slots)?,
        u32::from(id.per_slot),
        c(part.row0)?,
        c(part.rows)?,
        u32::from(has_bias),
        gx,
    ]);
    Ok(Some(dispatch(Kernel::MatmulId(m.ty), params, (gx, gy, 1))))
}

/// The kernels of moe.wgsl over `len` outputs: the weighted sum of `slots` expert outputs of
/// `width` per row (`combine`: binds the output at 1, the expert outputs at 2, the weights at
/// 3), or gpt-oss's SwiGLU (binds the gate at 1, up at 2).
pub fn moe_elementwise(
    op: &'static str,
    kernel: Kernel,
    len: usize,
    width: usize,
    slots: usize,
    alpha: f32,
    limit: f32,
) -> Result<Option<Dispatch>, BackendError> {
    if len == 0 {
        return Ok(None);
    }
    let (gx, gy) = grid(len.div_ceil(256));
    let params = words(&[
        u(op, len)?,
        u(op, width)?,
        u(op, slots)?,
        gx,
        alpha.to_bits(),
        limit.to_bits(),
        0,
        0,
    ]);
    Ok(Some(dispatch(kernel, params, (gx, gy, 1))))
}

/// The conv ([`Conv`], checked by the caller) of the rows `seq`, one invocation per channel.
/// Binds the inputs at 1, the weight's values at 2, the state at 3, the outputs at 4. `None`
/// when there are no rows (the state then stays as it is).
pub fn ssm_conv(p: &Conv, seq: SeqRows) -> Result<Option<Dispatch>, BackendError> {
    if seq.rows == 0 {
        return Ok(None);
    }
    let c = |v: usize| u("ssm_conv", v);
    // The largest indices the kernel forms: past the call's rows and the weight.
    c((seq.row0 + seq.rows) * p.channels)?;
    c(p.channels * p.kernel)?;
    let (gx, gy) = grid(p.channels.div_ceil(64));
    let params = words(&[
        c(p.channels)?,
        c(p.kernel)?,
        c(seq.row0)?,
        c(seq.rows)?,
        u32::from(p.silu),
        gx,
        0,
        0,
    ]);
    Ok(Some(dispatch(Kernel::SsmConv, params, (gx, gy, 1))))
}

/// The gates of `rows` rows of `n_head` heads (checked by the caller). Binds alpha at 1, beta
/// at 2, dt_bias at 3 and A at 4. `None` when there is nothing to do.
pub fn delta_gates(rows: usize, n_head: usize) -> Result<Option<Dispatch>, BackendError> {
    let len = rows * n_head;
    if len == 0 {
        return Ok(None);
    }
    let g = |v: usize| u("delta_gates", v);
    let (gx, gy) = grid(len.div_ceil(256));
    let params = words(&[g(len)?, g(n_head)?, gx, 0]);
    Ok(Some(dispatch(Kernel::DeltaGates, params, (gx, gy, 1))))
}

/// The delta rule ([`DeltaNet`], checked by the caller) over the rows `seq`, token by token
/// whatever the form: a workgroup per [`DELTA_COLUMNS`] state columns of a value head, key
/// heads of at most [`DELTA_MAX_DK`] values. Binds qkv at 1, the gates at 2, the betas at 3,
/// the state at 4, the outputs at 5. `None` when there are no rows.
pub fn delta_net(p: &DeltaNet, seq: SeqRows) -> Result<Option<Dispatch>, BackendError> {
    let op = "delta_net";
    if p.d_k > DELTA_MAX_DK {
        return Err(shape(
            op,
            format!(
                "k heads of {} values exceed the GPU kernel's {DELTA_MAX_DK} (one state column per invocation)",
                p.d_k
            ),
        ));
    }
    if seq.rows == 0 {
        return Ok(None);
    }
    let d = |v: usize| u(op, v);
    // The largest indices the kernel forms.
    let end = seq.row0 + seq.rows;
    d(end * p.qkv_dim())?;
    d(end * p.out_dim())?;
    d(p.state_len())?;
    let blocks = p.d_v.div_ceil(DELTA_COLUMNS);
    let (gx, gy) = grid(p.n_v_heads * blocks);
    let params = words(&[
        d(p.n_k_heads)?,
        d(p.n_v_heads)?,
        d(p.d_k)?,
        d(p.d_v)?,
        d(seq.row0)?,
        d(seq.rows)?,
        d(p.qkv_dim())?,
        u32::from(p.key_heads == KeyHeads::Grouped),
        u32::from(p.l2_eps.is_some()),
        p.l2_eps.unwrap_or(0.0).to_bits(),
        p.q_scale().to_bits(),
        d(blocks)?,
        gx,
        0,
        0,
        0,
    ]);
    Ok(Some(dispatch(Kernel::DeltaNet, params, (gx, gy, 1))))
}
