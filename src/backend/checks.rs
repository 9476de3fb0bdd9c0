//! The argument checks every backend runs before an op, written once: a backend calls these
//! with its buffers' lengths, so the CPU and GPU backends reject the same calls with the same
//! messages (and the shared op suite can test them once for all).

use super::attn::SeqAttn;
use super::rope::Rope;
use crate::backend::error::BackendError;
pub use crate::backend::error::{need, shape};
use crate::backend::kv::KvType;
use crate::gguf::TensorInfo;
use crate::quant::GgmlType;

/// `rows * width` without overflow.
fn product(op: &'static str, rows: usize, width: usize) -> Result<usize, BackendError> {
    rows.checked_mul(width)
        .ok_or_else(|| shape(op, format!("{rows} rows of {width} values")))
}

/// Arguments of `top_k` that no backend can honour.
pub fn top_k(rows: usize, width: usize, k: usize, x: usize) -> Result<(), BackendError> {
    if width == 0 || k == 0 {
        return Err(shape("top_k", format!("k = {k} of rows of {width} values")));
    }
    need("top_k", "input", x, product("top_k", rows, width)?)
}

/// `argmax` of `rows` rows of `width` from a buffer of `x` values.
pub fn argmax(rows: usize, width: usize, x: usize) -> Result<(), BackendError> {
    if width == 0 {
        return Err(shape("argmax", "zero-width rows".into()));
    }
    need("argmax", "input", x, product("argmax", rows, width)?)
}

/// `matmul` of `rows` activation rows of `n_in` into rows of `n_out`.
pub fn matmul(x: usize, out: usize, rows: usize, n_in: usize, n_out: usize) -> Result<(), BackendError> {
    need("matmul", "input", x, product("matmul", rows, n_in)?)?;
    need("matmul", "output", out, product("matmul", rows, n_out)?)
}

/// `embed` of `tokens` from a table of `n_vocab` rows of `width` into `out` values.
pub fn embed(out: usize, tokens: &[u32], width: usize, n_vocab: usize) -> Result<(), BackendError> {
    need("embed", "output", out, product("embed", tokens.len(), width)?)?;
    match tokens.iter().find(|&&t| t as usize >= n_vocab) {
        Some(&token) => Err(BackendError::TokenOutOfRange { token, n_vocab }),
        None => Ok(()),
    }
}

/// A norm of `groups` groups of `g` values (input `x` when not in place).
pub fn norm(x: Option<usize>, out: usize, groups: usize, g: usize) -> Result<(), BackendError> {
    let n = product("rmsnorm", groups, g)?;
    if let Some(x) = x {
        need("rmsnorm", "input", x, n)?;
    }
    need("rmsnorm", "output", out, n)
}

/// An element-wise op of `op` over `len` values of `x` (and of a second operand `y`).
pub fn elementwise(op: &'static str, x: usize, y: Option<(&str, usize)>, len: usize) -> Result<(), BackendError> {
    need(op, "x", x, len)?;
    if let Some((what, y)) = y {
        need(op, what, y, len)?;
    }
    Ok(())
}

/// `rope` of `positions.len()` rows of `n_head` heads of `head_dim` in a buffer of `x` values,
/// with `factors` (their count) where the rope's scaling wants them.
pub fn rope(
    x: usize,
    n_head: usize,
    head_dim: usize,
    positions: &[u32],
    rope: &Rope,
    factors: Option<usize>,
) -> Result<(), BackendError> {
    need(
        "rope",
        "input",
        x,
        product("rope", positions.len(), product("rope", n_head, head_dim)?)?,
    )?;
    if rope.n_rot > head_dim || !rope.n_rot.is_multiple_of(2) {
        return Err(shape(
            "rope",
            format!("n_rot {} does not fit head size {head_dim}", rope.n_rot),
        ));
    }
    match (rope.wants_factors(), factors) {
        (true, Some(n)) => need("rope", "frequency factors", n, rope.n_rot / 2),
        (false, None) => Ok(()),
        (true, None) => Err(shape("rope", "llama3 scaling without frequency factors".into())),
        (false, Some(_)) => Err(shape("rope", "frequency factors without llama3 scaling".into())),
    }
}

/// `kv_store` of `positions.len()` rows of `width` from row `row0` of `src` into the cache
/// rows `positions`.
pub fn kv_store(
    (cache, ty): (usize, KvType),
    src: usize,
    row0: usize,
    width: usize,
    positions: &[u32],
) -> Result<(), BackendError> {
    if !width.is_multiple_of(ty.block_values()) {
        return Err(shape(
            "kv_store",
            format!(
                "rows of {width} values are not whole {ty} blocks of {}",
                ty.block_values()
            ),
        ));
    }
    let rows = positions.len();
    need(
        "kv_store",
        "source",
        src,
        product("kv_store", row0.saturating_add(rows), width)?,
    )?;
    if let Some(&last) = positions.iter().max() {
        need(
            "kv_store",
            "cache",
            cache,
            product("kv_store", last as usize + 1, width)?,
        )?;
    }
    Ok(())
}

/// KV storage of `len` values in format `ty`: whole blocks.
pub fn alloc_kv(len: usize, ty: KvType) -> Result<(), BackendError> {
    if !len.is_multiple_of(ty.block_values()) {
        return Err(shape(
            "alloc_kv",
            format!("{len} values are not whole {ty} blocks of {}", ty.block_values()),
        ));
    }
    Ok(())
}

/// `copy_rows` (rows `row0..` of `src` to the start of `dst`) or `paste_rows` (the start of
/// `src` to rows `row0..` of `dst`).
pub fn rows(
    op: &'static str,
    src: usize,
    dst: usize,
    row0: usize,
    rows: usize,
    width: usize,
) -> Result<(), BackendError> {
    let at = product(op, row0.saturating_add(rows), width)?;
    let n = product(op, rows, width)?;
    let (src_need, dst_need) = if op == "copy_rows" { (at, n) } else { (n, at) };
    need(op, "source", src, src_need)?;
    need(op, "destination", dst, dst_need)
}

/// Whether a tensor is held as f32 values rather than matrices: vectors (norms, rope factors,
/// sinks) and biases of any rank (a 2-D `[n_out, n_expert]` expert bias is added per expert,
/// never multiplied), so backends decode them once at load.
pub fn is_vector(info: &TensorInfo) -> bool {
    (info.shape.len() <= 1 && !is_one_row_matrix(&info.name)) || info.name.ends_with(".bias")
}

/// The 1-D tensors that are multiplied, not added: qwen3.5-MoE's shared-expert gate
/// (`ffn_gate_inp_shexp`, `[n_embd]`: one logit per token), a matrix of one row.
fn is_one_row_matrix(name: &str) -> bool {
    name.ends_with(".ffn_gate_inp_shexp.weight")
}

/// Whether a GPU backend can place a tensor a piece of rows at a time: matrices, but not
/// vectors or conv kernels (rows of at most [`super::recurrent::MAX_CONV_KERNEL`] values),
/// which it converts to f32 whole.
pub fn placeable_in_pieces(info: &TensorInfo) -> bool {
    !is_vector(info)
        && info
            .shape
            .first()
            .is_some_and(|&n| n > super::recurrent::MAX_CONV_KERNEL as u64)
}

/// How many matrices a tensor stacks: the product of its dimensions past the second (a 3-D
/// expert tensor `[n_in, n_out, n_expert]` holds `n_expert`).
pub fn stacked_matrices(info: &TensorInfo) -> usize {
    info.shape.iter().skip(2).product::<u64>().max(1) as usize
}

/// A weight tensor seen as a matrix for a backend's `load_weight`: `(n_in, n_out)`, `n_out`
/// rows of `n_in` values (the first GGUF dimension is the row). Rows must be whole blocks of
/// the tensor's type. For a matrix (2 or more dimensions) `supported` says whether the backend
/// multiplies its type, and the data (`data_len` bytes) must hold exactly the rows.
pub fn weight_matrix(
    name: &str,
    info: &TensorInfo,
    data_len: usize,
    supported: impl Fn(GgmlType) -> bool,
    backend: &'static str,
) -> Result<(usize, usize), BackendError> {
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
    if info.shape.len() > 1 || is_one_row_matrix(&info.name) {
        if !supported(ty) {
            return Err(BackendError::UnsupportedType {
                tensor: name.to_string(),
                ty,
                backend,
            });
        }
        ty.check_len(data_len, n_in * n_out)?;
    }
    Ok((n_in, n_out))
}

/// Check one attention call: every sequence's parameters and caches (their lengths in values
/// and formats given by `cache`: K and V of one format, heads of whole blocks of it), its rows
/// inside `q` and `out`, and `sinks` (when given) one value per head.
pub fn attention<K>(
    q: usize,
    out: usize,
    seqs: &[SeqAttn<'_, K>],
    cache: impl Fn(&K) -> (usize, KvType),
    sinks: Option<usize>,
) -> Result<(), BackendError> {
    for s in seqs {
        let ((k_len, k_ty), (v_len, v_ty)) = (cache(s.k_cache), cache(s.v_cache));
        s.p.check(k_len, v_len)?;
        if k_ty != v_ty {
            return Err(shape("attention", format!("a {k_ty} K cache with a {v_ty} V cache")));
        }
        for (what, hd) in [("k", s.p.head_dim_k), ("v", s.p.head_dim_v)] {
            if let Some(problem) = k_ty.head_problem(what, hd) {
                return Err(shape("attention", problem));
            }
        }
        need("attention", "q", q, (s.row0 + s.p.rows) * s.p.q_dim())?;
        need("attention", "output", out, (s.row0 + s.p.rows) * s.p.out_dim())?;
        if let Some(n) = sinks {
            need("attention", "sinks", n, s.p.n_head)?;
        }
    }
    Ok(())
}
