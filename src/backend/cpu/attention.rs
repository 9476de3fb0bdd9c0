//! Softmax attention over the F16 KV cache, one task per (block of query rows, KV head, heads).
//!
//! Mirrors ggml's non-flash path: q is rounded to f16 for the q·k products (K is f16), the
//! softmax runs in f32 (our own vectorizable `exp`, as ggml has its own) with an f64 sum, and
//! the probabilities are rounded to f16 before they weight the f16 V rows. A probability that
//! rounds to zero in f16 contributes nothing and its V row is skipped. K and V heads may differ
//! in width; soft-capping (`cap · tanh(q·k / cap)`) and attention sinks (a per-head logit in
//! every softmax's denominator) follow ggml's `soft_max_ext`.
//!
//! Why tasks are blocks: every K/V row a task can see is widened to f32 once and then reused
//! by all the query heads sharing its KV head (4 for Gemma 3, 7 for Qwen 2.5) and by a block
//! of query rows, instead of being converted again for every (row, head). The q·k products of
//! one row's heads against one K row run together (independent accumulators), which the
//! compiler vectorizes; the AVX2 build of the same code is chosen at run time. Each output
//! value goes through exactly the operations of `attend_head` (the one-head twin the tests
//! compare against) in the same order, so results are bit for bit those of the per-head
//! algorithm whatever the blocking or thread count.

// Accumulator tiles are `[[f32; LANES]; N]` arrays indexed in nested loops the compiler unrolls.
#![allow(clippy::needless_range_loop)]

use std::cell::RefCell;

use half::f16;
// The portable widening's conversion (the SIMD128 build has its own) and the tests'.
#[cfg(any(test, not(all(target_arch = "wasm32", target_feature = "simd128"))))]
use half::slice::HalfFloatSliceExt;

use crate::backend::attn::AttnParams;

/// The per-head sink logits of a call (`[n_head]`), if any.
pub type Sinks<'a> = Option<&'a [f32]>;

/// Independent accumulators of one q·k product: enough for one AVX or two SSE registers.
const LANES: usize = 8;

/// Most query rows per task: enough to amortize widening the visible K/V rows, few enough
/// to leave tasks for every thread.
const MAX_BLOCK_ROWS: usize = 32;

/// Query heads whose q·k products run together against one K row.
pub(super) const HEAD_TILE: usize = 4;

thread_local! {
    /// A task's widened K/V rows, rounded queries and scores, kept per worker thread so that
    /// each call does not map and fault in fresh pages (it grows to the longest context seen).
    static TASK_SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// The calling thread's task-ordered output (see [`Plan`]), kept for the same reason.
    static OUT_SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Run `f` on this thread's kept output scratch of `len` values (contents unspecified).
pub fn with_out_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    OUT_SCRATCH.with_borrow_mut(|s| {
        if s.len() < len {
            s.resize(len, 0.0);
        }
        f(&mut s[..len])
    })
}

/// Run `f` on this thread's kept task scratch of `len` values (contents unspecified).
pub(super) fn with_task_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    TASK_SCRATCH.with_borrow_mut(|s| {
        if s.len() < len {
            s.resize(len, 0.0);
        }
        f(&mut s[..len])
    })
}

/// How one attention call is split into tasks. Task `t` writes a chunk of [`Plan::chunk`]
/// values of a scratch buffer: `[rows][heads][head_dim]` of its [`Block`], then unused values.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Query rows per block (the last block may have fewer).
    rows_per_block: usize,
    n_blocks: usize,
    /// Query heads per task (the last task of a KV head may have fewer).
    heads_per_task: usize,
    /// Tasks per KV head and row block.
    n_sub: usize,
    /// Query heads per KV head.
    group: usize,
    n_head_kv: usize,
    /// Width of an output head.
    head_dim_v: usize,
}

/// The query rows and heads of one task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// First query row (0-based within the batch) and row count.
    pub row0: usize,
    pub rows: usize,
    /// The KV head, and the first query head (absolute) and count, all within that KV head.
    pub kvh: usize,
    pub head0: usize,
    pub heads: usize,
}

impl Plan {
    /// A split of `p` for `threads` workers. `p.n_head` must be a nonzero multiple of
    /// `p.n_head_kv` (the caller checks).
    pub fn new(p: &AttnParams, threads: usize) -> Plan {
        let threads = threads.max(1);
        let n_kv = p.n_head_kv.max(1);
        let group = (p.n_head / n_kv).max(1);
        // Aim for a few tasks per thread (causal blocks differ in cost; work stealing evens it).
        let blocks_wanted = (4 * threads).div_ceil(n_kv);
        let rows_per_block = p.rows.div_ceil(blocks_wanted).clamp(1, MAX_BLOCK_ROWS);
        let n_blocks = p.rows.div_ceil(rows_per_block);
        // Few rows (decode) and few KV heads: split the heads of a KV head over the threads.
        let base = n_blocks * n_kv;
        let split = if base > 0 && base < threads {
            threads.div_ceil(base).min(group)
        } else {
            1
        };
        let heads_per_task = group.div_ceil(split);
        Plan {
            rows_per_block,
            n_blocks,
            heads_per_task,
            n_sub: group.div_ceil(heads_per_task),
            group,
            n_head_kv: n_kv,
            head_dim_v: p.head_dim_v,
        }
    }

    /// Number of tasks.
    pub fn tasks(&self) -> usize {
        self.n_blocks * self.n_head_kv * self.n_sub
    }

    /// Scratch values per task.
    pub fn chunk(&self) -> usize {
        self.rows_per_block * self.heads_per_task * self.head_dim_v
    }

    /// The rows and heads of task `t` (`t < tasks()`), for a batch of `rows` query rows.
    pub fn block(&self, t: usize, rows: usize) -> Block {
        let per_block = self.n_head_kv * self.n_sub;
        let (b, rem) = (t / per_block, t % per_block);
        let (kvh, s) = (rem / self.n_sub, rem % self.n_sub);
        let row0 = b * self.rows_per_block;
        let first = s * self.heads_per_task;
        Block {
            row0,
            rows: self.rows_per_block.min(rows - row0),
            kvh,
            head0: kvh * self.group + first,
            heads: self.heads_per_task.min(self.group - first),
        }
    }

    /// Output values per row block: `out`'s rows of one block (`[rows_per_block][n_head][head_dim_v]`).
    pub fn block_values(&self) -> usize {
        self.rows_per_block * self.q_width()
    }

    /// Copy the task chunks of `scratch` (task `t`'s at `t * stride`, `stride >= chunk()`) to
    /// `out` (`[rows][n_head][head_dim_v]`).
    pub fn scatter(&self, scratch: &[f32], stride: usize, rows: usize, out: &mut [f32]) {
        for (b, o) in out[..rows * self.q_width()].chunks_mut(self.block_values()).enumerate() {
            self.scatter_block(scratch, stride, rows, b, o);
        }
    }

    /// [`Plan::scatter`] of row block `b` alone: `out` is that block's rows of the whole output
    /// (`[rows in block b][n_head][head_dim_v]`), so blocks can be copied in parallel.
    pub fn scatter_block(&self, scratch: &[f32], stride: usize, rows: usize, b: usize, out: &mut [f32]) {
        let (hd, q_dim) = (self.head_dim_v, self.q_width());
        let per_block = self.n_head_kv * self.n_sub;
        for t in b * per_block..(b + 1) * per_block {
            let chunk = &scratch[t * stride..t * stride + self.chunk()];
            let blk = self.block(t, rows);
            let width = blk.heads * hd;
            for r in 0..blk.rows {
                let dst = r * q_dim + blk.head0 * hd;
                out[dst..dst + width].copy_from_slice(&chunk[r * width..(r + 1) * width]);
            }
        }
    }

    /// Values of one output row: every query head's.
    fn q_width(&self) -> usize {
        self.n_head_kv * self.group * self.head_dim_v
    }
}

/// First key visible from position `pos`: key `j` is masked when `pos - j >= window`.
pub(super) fn first_visible(pos: usize, window: Option<usize>) -> usize {
    window.map_or(0, |w| (pos + 1).saturating_sub(w))
}

/// The scratch values [`attend_block`] uses for `heads` heads over `n` visible keys: the
/// widened K and V rows, the rounded queries, the scores and the normalizers.
fn scratch_len(p: &AttnParams, heads: usize, n: usize) -> usize {
    n * (p.head_dim_k + p.head_dim_v) + heads * (2 * p.head_dim_k + n + 1)
}

/// Attention for the rows and heads of `b`: `q` holds all `p.rows` query rows
/// (`[rows][n_head][head_dim_k]`), the caches rows of `n_head_kv` heads for positions up to
/// `p.pos0 + p.rows`; writes `out[..b.rows * b.heads * head_dim_v]` as `[row][head][head_dim_v]`.
#[allow(clippy::too_many_arguments)]
pub fn attend_block(
    q: &[f32],
    k_cache: &[f16],
    v_cache: &[f16],
    p: &AttnParams,
    sinks: Sinks<'_>,
    b: &Block,
    out: &mut [f32],
) {
    if b.rows == 0 || b.heads == 0 || p.head_dim_k == 0 || p.head_dim_v == 0 {
        return;
    }
    let n = p.pos0 + b.row0 + b.rows - first_visible(p.pos0 + b.row0, p.window);
    with_task_scratch(scratch_len(p, b.heads, n), |scratch| {
        #[cfg(target_arch = "x86_64")]
        if avx2_build() {
            // SAFETY: the features `attend_block_avx2` enables were just detected.
            unsafe { attend_block_avx2(q, k_cache, v_cache, p, sinks, b, scratch, out) };
            return;
        }
        attend_block_generic::<false>(q, k_cache, v_cache, p, sinks, b, scratch, out);
    });
}

/// Whether this CPU runs [`attend_block_avx2`].
#[cfg(target_arch = "x86_64")]
fn avx2_build() -> bool {
    std::is_x86_feature_detected!("avx2")
        && std::is_x86_feature_detected!("f16c")
        && std::is_x86_feature_detected!("fma")
}

/// [`attend_block_generic`] compiled for AVX2. The compiler fuses nothing (Rust does not
/// contract `a * b + c`); the two kernels that use FMA on purpose ([`score_tile_avx2`],
/// [`weigh_heads_avx2`]) multiply an f16 value by an f16 value, a product that f32 holds
/// exactly (11 + 11 significant bits), so the fused sum is the separately rounded one: the
/// bits of the generic build.
///
/// # Safety
/// The CPU must support AVX2, F16C and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn attend_block_avx2(
    q: &[f32],
    k_cache: &[f16],
    v_cache: &[f16],
    p: &AttnParams,
    sinks: Sinks<'_>,
    b: &Block,
    scratch: &mut [f32],
    out: &mut [f32],
) {
    attend_block_generic::<true>(q, k_cache, v_cache, p, sinks, b, scratch, out);
}

/// `dst` (`[rows][width]`, `rows = dst.len() / width`) = rows of `src` widened to f32 (exact
/// either way), row `j` starting at `src[first + j * stride]`: with `AVX2`, eight at a time with
/// the conversion instruction, which `half`'s slice conversion reaches only through a run-time
/// check per call. One call per task covers all its rows: a call per K and V row (of 64-128
/// values) cost as much again as the conversion in decode profiles.
#[inline(always)]
fn widen_rows<const AVX2: bool>(src: &[f16], first: usize, stride: usize, width: usize, dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        // SAFETY: `AVX2` is set only by `attend_block_avx2`, which enables AVX2, F16C and FMA.
        unsafe { widen_rows_f16c(src, first, stride, width, dst) };
        return;
    }
    for (j, d) in dst.chunks_exact_mut(width).enumerate() {
        let row = &src[first + j * stride..first + j * stride + width];
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        super::wasm::widen_f16(row, d);
        #[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
        row.convert_to_f32_slice(d);
    }
}

/// Rows ahead that [`widen_rows_f16c`] prefetches. OLMoE-like synthetic model, 2 threads, AMD
/// EPYC (Zen 4), decode after 512 tokens: 307 -> 335 tok/s (median of eight alternations, 6 of
/// 8 faster); 4 and 8 rows measured alike, 16 less.
#[cfg(target_arch = "x86_64")]
const WIDEN_AHEAD: usize = 6;

#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn widen_rows_f16c(src: &[f16], first: usize, stride: usize, width: usize, dst: &mut [f32]) {
    use std::arch::x86_64::*;
    let full = width / 8 * 8;
    for (j, d) in dst.chunks_exact_mut(width).enumerate() {
        let row = &src[first + j * stride..first + j * stride + width];
        // Row `j + WIDEN_AHEAD` on its way: rows lie a context position apart (4 KiB for
        // OLMoE's 16 heads of 128), each on another small page, where the hardware's stream
        // prefetchers stop. (A prefetch past the cache's end is a hint that never faults.)
        super::simd::prefetch_lines::<_MM_HINT_T0>(
            row.as_ptr().wrapping_add(WIDEN_AHEAD * stride) as *const u8,
            2 * width,
        );
        let (sp, dp) = (row.as_ptr() as *const __m128i, d.as_mut_ptr());
        for i in (0..full).step_by(8) {
            _mm256_storeu_ps(dp.add(i), _mm256_cvtph_ps(_mm_loadu_si128(sp.add(i / 8))));
        }
        for (d, s) in d[full..].iter_mut().zip(&row[full..]) {
            *d = s.to_f32();
        }
    }
}

/// See [`attend_block`]; the portable build, and the body of the AVX2 one. `scratch` holds
/// [`scratch_len`] values.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend_block_generic<const AVX2: bool>(
    q: &[f32],
    k_cache: &[f16],
    v_cache: &[f16],
    p: &AttnParams,
    sinks: Sinks<'_>,
    b: &Block,
    scratch: &mut [f32],
    out: &mut [f32],
) {
    let (hdk, hdv) = (p.head_dim_k, p.head_dim_v);
    let k_dim = p.n_head_kv * hdk;
    let (v_row, v_head) = p.v_layout();
    // Keys lo..=hi are visible from some row of the block.
    let lo = first_visible(p.pos0 + b.row0, p.window);
    let hi = p.pos0 + b.row0 + b.rows - 1;
    let n = hi + 1 - lo;
    // kf: [n][hdk], vf: [n][hdv] widened K/V rows lo..=hi of head kvh; q16: [heads][hdk];
    // scores: [heads][n] (a row's visible keys); inv: [heads] softmax normalizers; the q16
    // region holds a second [heads][hdk] for the pairs of heads of `score_pairs_avx512`.
    let (kf, rest) = scratch.split_at_mut(n * hdk);
    let (vf, rest) = rest.split_at_mut(n * hdv);
    let (q16, rest) = rest.split_at_mut(2 * b.heads * hdk);
    let (scores, inv) = rest.split_at_mut(b.heads * n);
    widen_rows::<AVX2>(k_cache, lo * k_dim + b.kvh * hdk, k_dim, hdk, kf);
    widen_rows::<AVX2>(v_cache, lo * v_row + b.kvh * v_head, v_row, hdv, vf);
    let sinks = sinks.map(|s| &s[b.head0..b.head0 + b.heads]);
    block_rows::<AVX2>(q, p, sinks, b, lo, kf, vf, q16, scores, inv, out);
}

/// The rows of `b` once its visible K/V rows (from `lo`) are widened in `kf` (`[_][hdk]`) and
/// `vf` (`[_][hdv]`); `q16` (`[2][heads][hdk]`), `scores` (`[heads][n]`) and `inv` (`[heads]`)
/// are scratch. `sinks` are the block's heads' sink logits.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn block_rows<const AVX2: bool>(
    q: &[f32],
    p: &AttnParams,
    sinks: Sinks<'_>,
    b: &Block,
    lo: usize,
    kf: &[f32],
    vf: &[f32],
    q16: &mut [f32],
    scores: &mut [f32],
    inv: &mut [f32],
    out: &mut [f32],
) {
    let (hdk, hdv) = (p.head_dim_k, p.head_dim_v);
    let q_dim = p.n_head * hdk;
    let n = kf.len() / hdk;
    // q16: [heads][hdk] the rounded queries; qp: the same as pairs of heads for 512-bit
    // registers ([`pair_heads`]), where the CPU has them.
    let (q16, qp) = q16.split_at_mut(b.heads * hdk);
    let pairs = wide_scores::<AVX2>(hdk);
    // Soft-capping needs the raw q·k first; without it the scale goes into the products.
    let kq_scale = if p.softcap.is_some() { 1.0 } else { p.scale };
    for r in 0..b.rows {
        let pos = p.pos0 + b.row0 + r;
        let first = first_visible(pos, p.window);
        let m = pos + 1 - first;
        let qrow = &q[(b.row0 + r) * q_dim + b.head0 * hdk..][..b.heads * hdk];
        round_f16::<AVX2>(qrow, q16);
        if pairs {
            pair_heads(q16, hdk, qp);
        }
        // q·k for every visible key, HEAD_TILE heads at a time, the keys in chunks that stay
        // in the first-level cache while every head tile meets them (a pass over all keys per
        // head tile read MLA's 576-wide K rows from the second-level cache four times).
        let krows = &kf[(first - lo) * hdk..(pos + 1 - lo) * hdk];
        // An even count, so that the AVX2 kernel's pairs of keys stay whole.
        let keys = (KEY_CHUNK_BYTES / (4 * hdk)).max(2).next_multiple_of(2);
        for (c, kc) in krows.chunks(keys * hdk).enumerate() {
            let j0 = c * keys;
            let mut g0 = 0;
            while g0 < b.heads {
                let nt = (b.heads - g0).min(HEAD_TILE);
                let qs = &q16[g0 * hdk..(g0 + nt) * hdk];
                let sc = &mut scores[g0 * n + j0..];
                if pairs && nt >= 2 {
                    let qp = &qp[g0 * hdk..(g0 + nt) * hdk];
                    score_pairs::<AVX2>(qp, qs, nt, kc, hdk, kq_scale, sc, n);
                } else {
                    match nt {
                        4 => score_tile::<4, AVX2>(qs, kc, hdk, kq_scale, sc, n),
                        3 => score_tile::<3, AVX2>(qs, kc, hdk, kq_scale, sc, n),
                        2 => score_tile::<2, AVX2>(qs, kc, hdk, kq_scale, sc, n),
                        _ => score_tile::<1, AVX2>(qs, kc, hdk, kq_scale, sc, n),
                    }
                }
                g0 += nt;
            }
        }
        softmax_heads(p, sinks, scores, n, m, inv);
        // The probabilities (rounded to f16) weigh the V rows in key order, so each output
        // value is the same sum as key by key over all heads.
        for (g, &inv) in inv.iter().enumerate() {
            let probs = &mut scores[g * n..g * n + m];
            probs.iter_mut().for_each(|s| *s *= inv);
            round_f16_in_place::<AVX2>(probs);
        }
        let o = &mut out[r * b.heads * hdv..(r + 1) * b.heads * hdv];
        let vrows = &vf[(first - lo) * hdv..(pos + 1 - lo) * hdv];
        weigh_heads::<AVX2>(scores, n, m, vrows, hdv, o);
    }
}

/// Bytes of K rows (f32) that [`block_rows`] meets with every head before the next ones.
const KEY_CHUNK_BYTES: usize = 16 << 10;

/// Keys per block of [`weigh_heads`]: their V rows stay in the first-level cache while every
/// head meets them.
const KEY_BLOCK: usize = 8;

/// Output values of one head that [`weigh_heads`] keeps in registers across a block of keys.
const V_COLS: usize = 32;

/// `o[g] = Σ_j probs[g][j] · vrows[j]` for every head `g` of `o` (`[heads][hdv]`; `probs` is
/// head `g`'s `m` probabilities at `scores[g * n..]`), in key order from zero, skipping zero
/// probabilities. All the heads of a task share its KV head (8 for qwen3moe, 16 for MLA's one
/// latent head), so the keys go in blocks of [`KEY_BLOCK`]: the block's V rows come from the
/// cache once for all the heads, and each head's sums go through registers [`V_COLS`] at a time
/// over the whole block instead of through memory at every key. Each sum still adds its keys in
/// order. Heads of 64 values keep all their sums in registers, head by head ([`weigh_64`]);
/// widths that are no multiple of [`V_COLS`] go key by key.
/// With `AVX2` (set only in the AVX2 build), [`weigh_heads_avx2`] for widths that are a
/// multiple of [`V_COLS`].
#[inline(always)]
fn weigh_heads<const AVX2: bool>(scores: &[f32], n: usize, m: usize, vrows: &[f32], hdv: usize, o: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if AVX2 && hdv.is_multiple_of(V_COLS) {
        if avx512_build() {
            // SAFETY: AVX-512 F was just detected; the probabilities were rounded to f16 and
            // the V rows widened from f16.
            unsafe { weigh_heads_avx512(scores, n, m, vrows, hdv, o) };
            return;
        }
        // SAFETY: `AVX2` is set only by `attend_block_avx2`, which enables AVX2, F16C and FMA;
        // the probabilities were rounded to f16 and the V rows widened from f16.
        unsafe { weigh_heads_avx2(scores, n, m, vrows, hdv, o) };
        return;
    }
    if hdv == 64 {
        for (g, og) in o.chunks_exact_mut(hdv).enumerate() {
            weigh_64(&scores[g * n..g * n + m], vrows, og);
        }
        return;
    }
    o.fill(0.0);
    if !hdv.is_multiple_of(V_COLS) {
        for (j, v) in vrows.chunks_exact(hdv).take(m).enumerate() {
            for (g, og) in o.chunks_exact_mut(hdv).enumerate() {
                let pj = scores[g * n + j];
                if pj == 0.0 {
                    continue;
                }
                for (a, &v) in og.iter_mut().zip(v) {
                    *a += pj * v;
                }
            }
        }
        return;
    }
    for j0 in (0..m).step_by(KEY_BLOCK) {
        let kb = KEY_BLOCK.min(m - j0);
        let block = &vrows[j0 * hdv..(j0 + kb) * hdv];
        for (g, og) in o.chunks_exact_mut(hdv).enumerate() {
            let probs = &scores[g * n + j0..g * n + j0 + kb];
            if probs.iter().all(|&p| p == 0.0) {
                continue;
            }
            for (c0, oc) in og.chunks_exact_mut(V_COLS).enumerate() {
                let mut acc = [0f32; V_COLS];
                acc.copy_from_slice(oc);
                for (&pj, v) in probs.iter().zip(block.chunks_exact(hdv)) {
                    if pj == 0.0 {
                        continue;
                    }
                    for (a, &v) in acc.iter_mut().zip(&v[c0 * V_COLS..(c0 + 1) * V_COLS]) {
                        *a += pj * v;
                    }
                }
                oc.copy_from_slice(&acc);
            }
        }
    }
}

/// One head's V sums over a block of keys in registers of one width: the body of the x86 V
/// kernels, which [`weigh_blocks`] runs over the key blocks and heads.
#[cfg(target_arch = "x86_64")]
trait VColumns {
    /// Output values per call.
    const WIDTH: usize;
    /// `out[..WIDTH] += Σ_j probs[j] · v[j][..WIDTH]` in key order (`v`: the block's first V
    /// row, rows `hdv` apart), zero probabilities skipped, the sums in registers.
    unsafe fn cols(probs: &[f32], v: *const f32, hdv: usize, out: *mut f32);
    /// [`VColumns::cols`] for two heads at once (`probs[h]` and `out[h]`, `h` in 0..2): each
    /// V load feeds both heads' sums, and a head's zero probabilities are still skipped, so
    /// each sum is the one head's.
    unsafe fn cols2(probs: [&[f32]; 2], v: *const f32, hdv: usize, out: [*mut f32; 2]);
}

/// A register of f32 lanes, 256 or 512 bits: the x86 attention kernels are written once over
/// both widths ([`Cols`], [`ScoreRegs`]). Inlined into functions with the width's target
/// features.
#[cfg(target_arch = "x86_64")]
trait F32Reg: Copy {
    const LANES: usize;
    unsafe fn zero() -> Self;
    unsafe fn splat(x: f32) -> Self;
    unsafe fn load(p: *const f32) -> Self;
    unsafe fn store(self, p: *mut f32);
    /// `a · b + c`, fused.
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self;
}

#[cfg(target_arch = "x86_64")]
impl F32Reg for std::arch::x86_64::__m256 {
    const LANES: usize = 8;
    #[inline(always)]
    unsafe fn zero() -> Self {
        std::arch::x86_64::_mm256_setzero_ps()
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        std::arch::x86_64::_mm256_set1_ps(x)
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        std::arch::x86_64::_mm256_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        std::arch::x86_64::_mm256_storeu_ps(p, self)
    }
    #[inline(always)]
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
        std::arch::x86_64::_mm256_fmadd_ps(a, b, c)
    }
}

#[cfg(target_arch = "x86_64")]
impl F32Reg for std::arch::x86_64::__m512 {
    const LANES: usize = 16;
    #[inline(always)]
    unsafe fn zero() -> Self {
        std::arch::x86_64::_mm512_setzero_ps()
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        std::arch::x86_64::_mm512_set1_ps(x)
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        std::arch::x86_64::_mm512_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        std::arch::x86_64::_mm512_storeu_ps(p, self)
    }
    #[inline(always)]
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
        std::arch::x86_64::_mm512_fmadd_ps(a, b, c)
    }
}

/// `REGS` registers of `V`: `V::LANES · REGS` values.
#[cfg(target_arch = "x86_64")]
struct Cols<V, const REGS: usize>(std::marker::PhantomData<V>);

#[cfg(target_arch = "x86_64")]
impl<V: F32Reg, const REGS: usize> VColumns for Cols<V, REGS> {
    const WIDTH: usize = V::LANES * REGS;
    // Inlined into [`weigh_heads_avx2`] or [`weigh_heads_avx512`], whose target features its
    // intrinsics take.
    #[inline(always)]
    unsafe fn cols(probs: &[f32], v: *const f32, hdv: usize, out: *mut f32) {
        let mut acc = Self::load(out);
        for (j, &pj) in probs.iter().enumerate() {
            if pj != 0.0 {
                Self::add_key(&mut acc, pj, v.add(j * hdv));
            }
        }
        Self::store(&acc, out);
    }

    #[inline(always)]
    unsafe fn cols2(probs: [&[f32]; 2], v: *const f32, hdv: usize, out: [*mut f32; 2]) {
        let (mut a, mut b) = (Self::load(out[0]), Self::load(out[1]));
        for (j, (&pa, &pb)) in probs[0].iter().zip(probs[1]).enumerate() {
            let vj = v.add(j * hdv);
            match (pa != 0.0, pb != 0.0) {
                (true, true) => {
                    let (sa, sb) = (V::splat(pa), V::splat(pb));
                    for i in 0..REGS {
                        let x = V::load(vj.add(V::LANES * i));
                        a[i] = V::fma(sa, x, a[i]);
                        b[i] = V::fma(sb, x, b[i]);
                    }
                }
                (true, false) => Self::add_key(&mut a, pa, vj),
                (false, true) => Self::add_key(&mut b, pb, vj),
                (false, false) => {}
            }
        }
        Self::store(&a, out[0]);
        Self::store(&b, out[1]);
    }
}

#[cfg(target_arch = "x86_64")]
impl<V: F32Reg, const REGS: usize> Cols<V, REGS> {
    /// The `REGS` registers of sums at `out`.
    #[inline(always)]
    unsafe fn load(out: *const f32) -> [V; REGS] {
        std::array::from_fn(|i| V::load(out.add(V::LANES * i)))
    }

    /// The sums `acc` back to `out`.
    #[inline(always)]
    unsafe fn store(acc: &[V; REGS], out: *mut f32) {
        for (i, a) in acc.iter().enumerate() {
            a.store(out.add(V::LANES * i));
        }
    }

    /// `acc += p · v` for the `REGS` lane groups of the V row at `v`.
    #[inline(always)]
    unsafe fn add_key(acc: &mut [V; REGS], p: f32, v: *const f32) {
        let pv = V::splat(p);
        for (i, a) in acc.iter_mut().enumerate() {
            *a = V::fma(pv, V::load(v.add(V::LANES * i)), *a);
        }
    }
}

/// The x86 V kernels' loops: [`weigh_heads`]' sums, `C::WIDTH` output values of a head at a
/// time (`hdv` a multiple of it) across a block of [`KEY_BLOCK`] keys, or across all keys
/// where the head is 64 values. Each output value adds its keys in the same order whatever the
/// width, so every width gives the same bits.
///
/// # Safety
/// Inlined into a function with the target features `C`'s intrinsics need.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn weigh_blocks<C: VColumns, P: VColumns>(
    scores: &[f32],
    n: usize,
    m: usize,
    vrows: &[f32],
    hdv: usize,
    o: &mut [f32],
) {
    // One head of 64 keeps its sums in registers over every key.
    let block = if hdv == 64 { m.max(1) } else { KEY_BLOCK };
    o.fill(0.0);
    let heads = o.len() / hdv;
    let out = o.as_mut_ptr();
    for j0 in (0..m).step_by(block) {
        let kb = block.min(m - j0);
        let v = vrows.as_ptr().add(j0 * hdv);
        let probs = |g: usize| &scores[g * n + j0..g * n + j0 + kb];
        // Whether head `g` has a nonzero probability in the block (past the last head: no).
        let live = |g: usize| g < heads && probs(g).iter().any(|&p| p != 0.0);
        // Heads in pairs (an odd last one alone); a pair with one head's block all zero goes
        // as that one head. Each head's block is scanned once.
        let (mut g, mut here) = (0, live(0));
        while g < heads {
            let next = live(g + 1);
            if here && next {
                for c0 in (0..hdv).step_by(P::WIDTH) {
                    let og = [out.add(g * hdv + c0), out.add((g + 1) * hdv + c0)];
                    P::cols2([probs(g), probs(g + 1)], v.add(c0), hdv, og);
                }
                g += 2;
                here = live(g);
                continue;
            }
            if here {
                for c0 in (0..hdv).step_by(C::WIDTH) {
                    C::cols(probs(g), v.add(c0), hdv, out.add(g * hdv + c0));
                }
            }
            g += 1;
            here = next;
        }
    }
}

/// [`weigh_heads`] in AVX2 registers for `hdv` a multiple of [`V_COLS`]: the same sums in
/// the same key order, the products through FMA (a probability rounded to f16 times an f16 V
/// value is exact in f32, so the fused sum is the separately rounded one). Each head's sums
/// stay in eight registers (64 values; four where the width is an odd multiple of 32) across a
/// block of [`KEY_BLOCK`] keys, or across all keys where that is the whole head, so that
/// eight FMAs are in flight.
///
/// # Safety
/// The CPU must support AVX2 and FMA; the values of `scores` and `vrows` must be f16 values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn weigh_heads_avx2(scores: &[f32], n: usize, m: usize, vrows: &[f32], hdv: usize, o: &mut [f32]) {
    use std::arch::x86_64::__m256;
    if hdv.is_multiple_of(64) {
        weigh_blocks::<Cols<__m256, 8>, Cols<__m256, 4>>(scores, n, m, vrows, hdv, o);
    } else {
        weigh_blocks::<Cols<__m256, 4>, Cols<__m256, 4>>(scores, n, m, vrows, hdv, o);
    }
}

/// Whether this CPU runs [`weigh_heads_avx512`].
#[cfg(target_arch = "x86_64")]
fn avx512_build() -> bool {
    std::is_x86_feature_detected!("avx512f")
}

/// [`weigh_heads_avx2`] in 512-bit registers: each output value is the same sum in the same
/// key order (the key blocks are the same; only how many columns go at once changes), so the
/// bits are the same, in half the instructions. A head's sums over 128 values stay in eight
/// registers (64 in four, where the width is no multiple of 128; 32 in two).
///
/// # Safety
/// The CPU must support AVX-512 F; the values of `scores` and `vrows` must be f16 values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn weigh_heads_avx512(scores: &[f32], n: usize, m: usize, vrows: &[f32], hdv: usize, o: &mut [f32]) {
    use std::arch::x86_64::__m512;
    if hdv.is_multiple_of(128) {
        weigh_blocks::<Cols<__m512, 8>, Cols<__m512, 8>>(scores, n, m, vrows, hdv, o);
    } else if hdv.is_multiple_of(64) {
        weigh_blocks::<Cols<__m512, 4>, Cols<__m512, 4>>(scores, n, m, vrows, hdv, o);
    } else {
        weigh_blocks::<Cols<__m512, 2>, Cols<__m512, 2>>(scores, n, m, vrows, hdv, o);
    }
}

/// One head of 64 values: `o = Σ_j probs[j] · vrows[j]` (`vrows`: `[probs.len()][64]`), in key
/// order from zero, skipping zero probabilities, the sums in eight registers.
#[inline(always)]
fn weigh_64(probs: &[f32], vrows: &[f32], o: &mut [f32]) {
    let mut acc = [0f32; 64];
    for (&pj, v) in probs.iter().zip(vrows.chunks_exact(64)) {
        if pj == 0.0 {
            continue;
        }
        for (a, &v) in acc.iter_mut().zip(v) {
            *a += pj * v;
        }
    }
    o.copy_from_slice(&acc);
}

/// The softmax numerators of each head's first `m` scores in place (`scores`: `[heads][n]`,
/// capped and scaled first when `p.softcap`), with the head's sink logit in the max and the
/// sum, and `inv[g]`, one over head `g`'s sum.
#[inline(always)]
pub(super) fn softmax_heads(p: &AttnParams, sinks: Sinks<'_>, scores: &mut [f32], n: usize, m: usize, inv: &mut [f32]) {
    for (g, inv) in inv.iter_mut().enumerate() {
        let s = &mut scores[g * n..g * n + m];
        if let Some(cap) = p.softcap {
            s.iter_mut().for_each(|x| *x = soft_cap(*x, cap) * p.scale);
        }
        let sink = sinks.map(|k| k[g]);
        let max = s.iter().fold(sink.unwrap_or(f32::NEG_INFINITY), |a, &x| a.max(x));
        let sum = exp_shifted(s, max) + sink.map_or(0.0, |k| f64::from(exp(k - max)));
        *inv = (1.0 / sum) as f32;
    }
}

/// ggml's logit soft-capping of a raw q·k: scaled by `1/cap`, tanh, scaled by `cap`.
#[inline(always)]
fn soft_cap(x: f32, cap: f32) -> f32 {
    (x * (1.0 / cap)).tanh() * cap
}

/// The softmax numerators in place, `s[j] = e^(s[j] - max)` by [`exp`], and their sum in f64:
/// four running sums over `j mod 4`, added pairwise at the end. Both loops are element-wise
/// with no call inside, so the AVX2 build vectorizes them (the per-score `expf` call it
/// replaces, with the sum spilled around each call, was a third of decode attention), and both
/// builds add in the same order.
#[inline(always)]
fn exp_shifted(s: &mut [f32], max: f32) -> f64 {
    s.iter_mut().for_each(|x| *x = exp(*x - max));
    let mut acc = [0f64; 4];
    let chunks = s.chunks_exact(4);
    let tail = chunks.remainder();
    for c in chunks {
        for i in 0..4 {
            acc[i] += f64::from(c[i]);
        }
    }
    for (a, &x) in acc.iter_mut().zip(tail) {
        *a += f64::from(x);
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3])
}

/// `e^x` in plain f32 arithmetic (no fused multiply-add, no library call), so that the portable
/// and the AVX2 builds give the same bits and a loop of it vectorizes. Cody and Waite's
/// reduction `x = n·ln 2 + r`, `|r| ≤ ln 2 / 2`, with `n` rounded by adding 1.5·2^23 and a
/// two-part `ln 2` whose high part has 9 significant bits (so `n·C1` is exact), and Cephes' `expf`
/// polynomial for `e^r`; `2^n` is applied in two halves so that every `n` from -150 to 128
/// scales without overflowing an exponent field. Within 1 ulp of `e^x` (tests); below -104 it
/// is 0, above 89 infinity, NaN stays NaN.
#[inline(always)]
fn exp(x: f32) -> f32 {
    const ROUND: f32 = 12_582_912.0;
    // 355/512 exactly.
    const C1: f32 = 0.693_359_4;
    const C2: f32 = -2.121_944_4e-4;
    // `clamp` keeps a NaN (where `max`/`min` would turn it into a bound).
    let xc = x.clamp(-104.0, 89.0);
    let t = xc * std::f32::consts::LOG2_E + ROUND;
    let n = t - ROUND;
    let r = (xc - n * C1) - n * C2;
    let r2 = r * r;
    let p = ((((1.987_569_2e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r + 1.666_666_5e-1)
        * r
        + 0.5;
    let p = p * r2 + r + 1.0;
    // `n` as an integer: the low bits of `t` (its unit in the last place is 1).
    let ni = (t.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let (n1, n2) = (ni >> 1, ni - (ni >> 1));
    let pow2 = |e: i32| f32::from_bits((e.wrapping_add(127) << 23) as u32);
    p * pow2(n1) * pow2(n2)
}

/// `dst[i] = src[i]` rounded to f16 (nearest, ties to even) and back.
#[inline(always)]
fn round_f16<const AVX2: bool>(src: &[f32], dst: &mut [f32]) {
    dst.copy_from_slice(src);
    round_f16_in_place::<AVX2>(dst);
}

/// Each value rounded to f16 (nearest, ties to even) and back; with `AVX2` eight at a time.
#[inline(always)]
fn round_f16_in_place<const AVX2: bool>(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        // SAFETY: `AVX2` is set only by `attend_block_avx2`, which enables AVX2, F16C and FMA.
        unsafe { round_f16_f16c(x) };
        return;
    }
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    return super::wasm::round_f16_in_place(x);
    #[allow(unreachable_code)]
    x.iter_mut().for_each(|v| *v = f16::from_f32(*v).to_f32());
}

#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn round_f16_f16c(x: &mut [f32]) {
    use std::arch::x86_64::*;
    let mut chunks = x.chunks_exact_mut(8);
    for c in &mut chunks {
        let v = _mm256_loadu_ps(c.as_ptr());
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
        _mm256_storeu_ps(c.as_mut_ptr(), _mm256_cvtph_ps(h));
    }
    for v in chunks.into_remainder() {
        *v = f16::from_f32(*v).to_f32();
    }
}

/// `scores[g * stride + j] = (qs[g] · krows[j]) * scale` for the `N` query heads in `qs`
/// (`[N][hd]`) and every K row in `krows` (`[_][hd]`), each product summed as the per-head `dot` of the tests does.
/// With `AVX2` (set only in the AVX2 build), [`score_tile_avx2`]: the same sums in registers.
#[inline(always)]
fn score_tile<const N: usize, const AVX2: bool>(
    qs: &[f32],
    krows: &[f32],
    hd: usize,
    scale: f32,
    scores: &mut [f32],
    stride: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        // SAFETY: `AVX2` is set only by `attend_block_avx2`, which enables AVX2, F16C and FMA.
        unsafe { score_tile_avx2::<N>(qs, krows, hd, scale, scores, stride) };
        return;
    }
    let full = hd / LANES * LANES;
    for (j, k) in krows.chunks_exact(hd).enumerate() {
        let mut acc = [[0f32; LANES]; N];
        for c in (0..full).step_by(LANES) {
            let kc = &k[c..c + LANES];
            for g in 0..N {
                let qc = &qs[g * hd + c..g * hd + c + LANES];
                for i in 0..LANES {
                    acc[g][i] += qc[i] * kc[i];
                }
            }
        }
        for g in 0..N {
            scores[g * stride + j] = score(&acc[g], &qs[g * hd..(g + 1) * hd], k, full, scale);
        }
    }
}

/// One score of [`score_tile`] from its lanes' sums over the first `full` values of `q` and `k`:
/// the lanes in order, then the tail's products, times `scale` (the per-head `dot` of the tests).
#[inline(always)]
fn score(lanes: &[f32; LANES], q: &[f32], k: &[f32], full: usize, scale: f32) -> f32 {
    let tail: f32 = q[full..].iter().zip(&k[full..]).map(|(x, y)| x * y).sum();
    (lanes.iter().sum::<f32>() + tail) * scale
}

/// [`score_tile`] in AVX2 registers: lane `i` of head `g`'s accumulator is the scalar code's
/// `acc[g][i]`, its lanes then summed in order from -0.0 as `Iterator::sum` does, then the
/// tail: the same bits. The products go through FMA: q is rounded to f16 and K is f16, so each
/// product is exact in f32 and the fused sum is the scalar code's rounded sum. Two K rows at a
/// time, so each load of a query vector serves both. (The compiler's own vectorization of the
/// scalar loop shuffled lanes between registers: two fifths of deepseek2's prefill attention.)
///
/// # Safety
/// The CPU must support AVX2 and FMA; the values of `qs` and `krows` must be f16 values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn score_tile_avx2<const N: usize>(
    qs: &[f32],
    krows: &[f32],
    hd: usize,
    scale: f32,
    scores: &mut [f32],
    stride: usize,
) {
    let rows = krows.len() / hd;
    let mut j = 0;
    while j + 2 <= rows {
        score_rows::<Avx2Regs, N, 2>(qs, qs, krows, hd, j, scale, scores, stride);
        j += 2;
    }
    if j < rows {
        score_rows::<Avx2Regs, N, 1>(qs, qs, krows, hd, j, scale, scores, stride);
    }
}

/// The registers of a q·k kernel ([`score_rows`]): each holds one lane group of `HEADS` query
/// heads side by side, and meets a K lane group in each of its `HEADS` parts.
#[cfg(target_arch = "x86_64")]
trait ScoreRegs {
    type V: F32Reg;
    const HEADS: usize;
    /// The K lane group at `k`, in every part.
    unsafe fn k(k: *const f32) -> Self::V;
    /// Lane group `c / LANES` of register row `u` of the queries `q` (`[units][hd]` of `HEADS`
    /// heads' lane groups side by side).
    unsafe fn q(q: *const f32, u: usize, hd: usize, c: usize) -> Self::V;
}

/// One head per 256-bit register ([`score_tile_avx2`]).
#[cfg(target_arch = "x86_64")]
struct Avx2Regs;

#[cfg(target_arch = "x86_64")]
impl ScoreRegs for Avx2Regs {
    type V = std::arch::x86_64::__m256;
    const HEADS: usize = 1;
    #[inline(always)]
    unsafe fn k(k: *const f32) -> Self::V {
        Self::V::load(k)
    }
    #[inline(always)]
    unsafe fn q(q: *const f32, u: usize, hd: usize, c: usize) -> Self::V {
        Self::V::load(q.add(u * hd + c))
    }
}

/// A pair of heads per 512-bit register ([`score_pairs_avx512`]), the K lane group broadcast
/// to both halves.
#[cfg(target_arch = "x86_64")]
struct PairRegs;

#[cfg(target_arch = "x86_64")]
impl ScoreRegs for PairRegs {
    type V = std::arch::x86_64::__m512;
    const HEADS: usize = 2;
    #[inline(always)]
    unsafe fn k(k: *const f32) -> Self::V {
        use std::arch::x86_64::*;
        _mm512_broadcast_f32x8(_mm256_loadu_ps(k))
    }
    #[inline(always)]
    unsafe fn q(q: *const f32, u: usize, hd: usize, c: usize) -> Self::V {
        Self::V::load(q.add(u * 2 * hd + 2 * c))
    }
}

/// The dot products of the `U * S::HEADS` heads of `qv` (register rows in `S`'s layout; `qs`:
/// the same heads as `[heads][hd]`, for the tails) with K rows `j..j + R`, into `scores`: each
/// head's lanes summed as [`score`] does. Inlined into a function with `S`'s target features.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn score_rows<S: ScoreRegs, const U: usize, const R: usize>(
    qv: &[f32],
    qs: &[f32],
    krows: &[f32],
    hd: usize,
    j: usize,
    scale: f32,
    scores: &mut [f32],
    stride: usize,
) {
    let full = hd / LANES * LANES;
    let mut acc = [[S::V::zero(); U]; R];
    let (q, k) = (qv.as_ptr(), krows.as_ptr().add(j * hd));
    for c in (0..full).step_by(LANES) {
        let mut kc = [S::V::zero(); R];
        for (r, kc) in kc.iter_mut().enumerate() {
            *kc = S::k(k.add(r * hd + c));
        }
        for u in 0..U {
            let qc = S::q(q, u, hd, c);
            for r in 0..R {
                acc[r][u] = S::V::fma(qc, kc[r], acc[r][u]);
            }
        }
    }
    for r in 0..R {
        let kr = &krows[(j + r) * hd..(j + r + 1) * hd];
        for u in 0..U {
            let mut lanes = [0f32; 2 * LANES];
            acc[r][u].store(lanes.as_mut_ptr());
            for h in 0..S::HEADS {
                let g = u * S::HEADS + h;
                let part: &[f32; LANES] = lanes[h * LANES..(h + 1) * LANES].try_into().expect("a lane group");
                scores[g * stride + j + r] = score(part, &qs[g * hd..(g + 1) * hd], kr, full, scale);
            }
        }
    }
}

/// Whether [`block_rows`] scores pairs of heads in 512-bit registers ([`score_pairs`]): in the
/// AVX2 build on a CPU with AVX-512 F and DQ, for heads of whole lane groups.
#[inline(always)]
fn wide_scores<const AVX2: bool>(hd: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    return AVX2 && hd.is_multiple_of(LANES) && avx512_build() && std::is_x86_feature_detected!("avx512dq");
    #[allow(unreachable_code)]
    {
        let _ = hd;
        false
    }
}

/// `qp` (`[heads / 2][hd / LANES][2][LANES]`) from `q16` (`[heads][hd]`): the heads in pairs,
/// a lane group of each side by side, as [`score_pairs_avx512`] loads them (an odd last head
/// is left out). `hd` is a multiple of [`LANES`].
fn pair_heads(q16: &[f32], hd: usize, qp: &mut [f32]) {
    for (pair, dst) in q16.chunks_exact(2 * hd).zip(qp.chunks_exact_mut(2 * hd)) {
        let (a, b) = pair.split_at(hd);
        for ((d, a), b) in dst
            .chunks_exact_mut(2 * LANES)
            .zip(a.chunks_exact(LANES))
            .zip(b.chunks_exact(LANES))
        {
            d[..LANES].copy_from_slice(a);
            d[LANES..].copy_from_slice(b);
        }
    }
}

/// [`score_tile`] for a tile of `nt` (2 to [`HEAD_TILE`]) heads with [`score_pairs_avx512`],
/// the heads paired in `qp` ([`pair_heads`]); an odd last head goes alone through
/// [`score_tile`] from `qs`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn score_pairs<const AVX2: bool>(
    qp: &[f32],
    qs: &[f32],
    nt: usize,
    krows: &[f32],
    hd: usize,
    scale: f32,
    scores: &mut [f32],
    stride: usize,
) {
    #[cfg(target_arch = "x86_64")]
    {
        let even = nt / 2 * 2;
        // SAFETY: `wide_scores` (the caller's condition) detected AVX-512 F and DQ; the queries are
        // rounded to f16 and the K rows are f16 values.
        unsafe {
            if even == 4 {
                score_pairs_avx512::<2>(qp, qs, krows, hd, scale, scores, stride);
            } else {
                score_pairs_avx512::<1>(qp, qs, krows, hd, scale, scores, stride);
            }
        }
        if even < nt {
            let last = &qs[even * hd..(even + 1) * hd];
            score_tile::<1, AVX2>(last, krows, hd, scale, &mut scores[even * stride..], stride);
        }
    }
    // Elsewhere (never chosen there: `wide_scores` is false) head by head, the same sums.
    #[cfg(not(target_arch = "x86_64"))]
    let _ = qp;
    #[cfg(not(target_arch = "x86_64"))]
    for g in 0..nt {
        score_tile::<1, AVX2>(
            &qs[g * hd..(g + 1) * hd],
            krows,
            hd,
            scale,
            &mut scores[g * stride..],
            stride,
        );
    }
}

/// [`score_tile_avx2`] for `P` pairs of heads (`qp`, [`pair_heads`]' layout) in 512-bit
/// registers: one register holds a lane group of both heads of a pair, against the same lane
/// group of a K row in both halves, so each half's lanes are the AVX2 kernel's accumulator of
/// its head, summed the same way: the same bits, in half the multiply-adds. Four K rows at a
/// time, so each query load serves four.
///
/// `qs` holds the same heads as `[heads][hd]` ([`score_rows`] reads it for the tails, which
/// are empty here).
///
/// # Safety
/// The CPU must support AVX-512 F and DQ; the values of `qp` and `krows` must be f16 values
/// and `hd` a multiple of [`LANES`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
unsafe fn score_pairs_avx512<const P: usize>(
    qp: &[f32],
    qs: &[f32],
    krows: &[f32],
    hd: usize,
    scale: f32,
    scores: &mut [f32],
    stride: usize,
) {
    let rows = krows.len() / hd;
    let mut j = 0;
    while j + 4 <= rows {
        score_rows::<PairRegs, P, 4>(qp, qs, krows, hd, j, scale, scores, stride);
        j += 4;
    }
    while j < rows {
        score_rows::<PairRegs, P, 1>(qp, qs, krows, hd, j, scale, scores, stride);
        j += 1;
    }
}

/// Attention for one query head `q` (`head_dim_k` values) at position `pos`, reading KV head
/// `kvh` of the caches, with the head's sink logit if any, writing `out` (`head_dim_v`): the
/// per-head algorithm `attend_block` must reproduce bit for bit. `scores` is scratch.
#[cfg(test)]
#[allow(clippy::too_many_arguments)]
pub fn attend_head(
    q: &[f32],
    k_cache: &[f16],
    v_cache: &[f16],
    kvh: usize,
    pos: usize,
    p: &AttnParams,
    sink: Option<f32>,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let (hdk, hdv) = (p.head_dim_k, p.head_dim_v);
    let k_dim = p.n_head_kv * hdk;
    let (v_row, v_head) = p.v_layout();
    let first = first_visible(pos, p.window);
    let q16: Vec<f32> = q.iter().map(|&v| f16::from_f32(v).to_f32()).collect();
    let mut krow = vec![0f32; hdk];
    let mut vrow = vec![0f32; hdv];
    scores.clear();
    let mut max = sink.unwrap_or(f32::NEG_INFINITY);
    for j in first..=pos {
        let base = j * k_dim + kvh * hdk;
        k_cache[base..base + hdk].convert_to_f32_slice(&mut krow);
        let s = match p.softcap {
            Some(cap) => soft_cap(dot(&q16, &krow), cap) * p.scale,
            None => dot(&q16, &krow) * p.scale,
        };
        max = max.max(s);
        scores.push(s);
    }
    let sum = exp_shifted(scores, max) + sink.map_or(0.0, |k| f64::from(exp(k - max)));
    let inv = (1.0 / sum) as f32;
    out.fill(0.0);
    for (idx, s) in scores.iter().enumerate() {
        let pj = f16::from_f32(*s * inv).to_f32();
        if pj == 0.0 {
            continue;
        }
        let base = (first + idx) * v_row + kvh * v_head;
        v_cache[base..base + hdv].convert_to_f32_slice(&mut vrow);
        for (o, &v) in out.iter_mut().zip(vrow.iter()) {
            *o += pj * v;
        }
    }
}

/// `a · b` in [`LANES`] independent partial sums (vectorizable without reassociation).
#[cfg(test)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..LANES {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    fn val(i: usize, off: f32) -> f32 {
        0.1 + 2.0 * ((i as f32) * 0.37 + off).cos()
    }

    /// Caches of `n_pos` positions and `rows` query rows for `p`, from the test vectors.
    fn inputs(p: &AttnParams) -> (Vec<f32>, Vec<f16>, Vec<f16>) {
        let n_pos = p.pos0 + p.rows;
        let k = (0..n_pos * p.n_head_kv * p.head_dim_k)
            .map(|i| f16::from_f32(val(i, 1.0)))
            .collect();
        let v = (0..n_pos * p.n_head_kv * p.head_dim_v)
            .map(|i| f16::from_f32(val(i, 2.0)))
            .collect();
        let q = (0..p.rows * p.q_dim()).map(|i| val(i, 3.0)).collect();
        (q, k, v)
    }

    pub(crate) fn params(rows: usize, pos0: usize, n_head: usize, n_head_kv: usize, hd: (usize, usize)) -> AttnParams {
        AttnParams {
            rows,
            pos0,
            n_head,
            n_head_kv,
            head_dim_k: hd.0,
            head_dim_v: hd.1,
            scale: 0.3,
            window: None,
            softcap: None,
            v_in_k: false,
        }
    }

    /// The straightforward reference for one query head `q` (rounded as the kernel rounds
    /// it) at position `pos` over caches decoded to f64 (`k`: `[pos][n_head_kv][head_dim_k]`,
    /// `v` in [`AttnParams::v_layout`]): every product in f64, no skipping, no rounding of the
    /// probabilities. The Q8_0 cache's tests share it.
    pub(crate) fn reference(
        q: &[f64],
        k: &[f64],
        v: &[f64],
        kvh: usize,
        pos: usize,
        p: &AttnParams,
        sink: Option<f64>,
    ) -> Vec<f64> {
        let (hdk, hdv) = (p.head_dim_k, p.head_dim_v);
        let (v_row, v_head) = p.v_layout();
        let first = first_visible(pos, p.window);
        let s: Vec<f64> = (first..=pos)
            .map(|j| {
                let kr = &k[j * p.n_head_kv * hdk + kvh * hdk..][..hdk];
                let d: f64 = q.iter().zip(kr).map(|(a, b)| a * b).sum();
                let d = p.softcap.map_or(d, |c| f64::from(c) * (d / f64::from(c)).tanh());
                d * f64::from(p.scale)
            })
            .collect();
        let max = s.iter().copied().chain(sink).fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
        let sum: f64 = e.iter().sum::<f64>() + sink.map_or(0.0, |k| (k - max).exp());
        let mut out = vec![0f64; hdv];
        for (idx, w) in e.iter().enumerate() {
            let vr = &v[(first + idx) * v_row + kvh * v_head..][..hdv];
            out.iter_mut().zip(vr).for_each(|(o, x)| *o += w / sum * x);
        }
        out
    }

    /// `exp` against f64's over its whole range (every 1/1024 from -110 to 95, plus random
    /// points): within 1 ulp where the result is a normal f32 (0.97 at worst when written),
    /// within one smallest subnormal below that, 0 under -104 and infinity over 89 (as f64's
    /// rounded to f32), NaN for NaN, exactly 1 at 0.
    #[test]
    fn exp_is_within_one_ulp() {
        let mut xs: Vec<f32> = (-110 * 1024..=95 * 1024).map(|i| i as f32 / 1024.0).collect();
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..200_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            xs.push(-105.0 + 195.0 * (state >> 40) as f32 / (1u64 << 24) as f32);
        }
        let mut worst = 0f64;
        for &x in &xs {
            let got = exp(x);
            let want = f64::from(x).exp();
            let want32 = want as f32;
            if x < -104.0 {
                assert_eq!(got, 0.0, "exp({x})");
            } else if x > 89.0 || want32.is_infinite() {
                assert!(
                    got.is_infinite() || (f64::from(got) - want).abs() <= 2.0 * want * f64::from(f32::EPSILON),
                    "exp({x}) = {got}, want {want}"
                );
            } else if want32.is_normal() {
                let ulps = (f64::from(got) - want).abs() / ulp(want32);
                worst = worst.max(ulps);
                assert!(ulps <= 1.0, "exp({x}) = {got}, want {want}: {ulps} ulp");
            } else {
                assert!(
                    (f64::from(got) - want).abs() <= 2f64.powi(-149),
                    "exp({x}) = {got:e}, want {want:e}"
                );
            }
        }
        assert!(worst > 0.0);
        assert!(exp(f32::NAN).is_nan());
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
    }

    /// The spacing of f32 values at `v` (a normal number), in f64.
    fn ulp(v: f32) -> f64 {
        let e = ((v.to_bits() >> 23) & 0xff) as i32;
        2f64.powi(e - 127 - 23)
    }

    /// The per-head algorithm against the f64 reference, with windows, grouped heads, K and V
    /// heads of different widths (MLA's 576/512 among them), soft-capping and sinks.
    #[test]
    fn matches_f64_reference_with_window_gqa_caps_and_sinks() {
        // Head sizes not a multiple of LANES, and the widest.
        for hd in [(20, 20), (24, 12), (576, 512)] {
            let n_pos = 37;
            for (window, softcap, sink) in [
                (None, None, None),
                (Some(5), None, None),
                (None, Some(1.5), None),
                (Some(9), None, Some(0.7)),
                (None, Some(20.0), Some(3.0)),
            ] {
                for (kvh, pos) in [(0, 0), (1, 17), (0, n_pos - 1)] {
                    let p = AttnParams {
                        window,
                        softcap,
                        ..params(1, pos, 4, 2, hd)
                    };
                    let (_, k, v) = inputs(&AttnParams {
                        rows: n_pos,
                        pos0: 0,
                        ..p
                    });
                    let q: Vec<f32> = (0..hd.0).map(|i| val(i, 3.0)).collect();
                    let mut out = vec![0f32; hd.1];
                    attend_head(&q, &k, &v, kvh, pos, &p, sink, &mut Vec::new(), &mut out);
                    let wide = |x: &[f16]| x.iter().map(|x| f64::from(x.to_f32())).collect::<Vec<_>>();
                    let q16: Vec<f16> = q.iter().map(|&x| f16::from_f32(x)).collect();
                    let want = reference(&wide(&q16), &wide(&k), &wide(&v), kvh, pos, &p, sink.map(f64::from));
                    for (&a, &b) in out.iter().zip(&want) {
                        let (a, b) = (f64::from(a), b);
                        // Probabilities are rounded to f16 (relative 2^-11) before weighting V.
                        assert!(
                            (a - b).abs() <= 2e-3 * (1.0 + b.abs()),
                            "{a} vs {b} (hd {hd:?}, window {window:?}, cap {softcap:?}, sink {sink:?}, pos {pos})"
                        );
                    }
                }
            }
        }
    }

    /// All rows and heads of `p` through [`Plan`], each task's block through `run` (a build of
    /// an `attend_block`), in order (as the pool runs them, minus the threads), scattered into
    /// place by row blocks. The Q8_0 cache's tests share it.
    pub(crate) fn blocked(p: &AttnParams, threads: usize, run: impl Fn(&Block, &mut [f32])) -> Vec<f32> {
        let plan = Plan::new(p, threads);
        let mut scratch = vec![0f32; plan.tasks() * plan.chunk()];
        for (t, c) in scratch.chunks_mut(plan.chunk()).enumerate() {
            run(&plan.block(t, p.rows), c);
        }
        let mut out = vec![f32::NAN; p.rows * p.out_dim()];
        // Block by block, last first: the row blocks are independent (the pool copies a
        // prefill's in parallel).
        for (b, o) in out.chunks_mut(plan.block_values()).enumerate().rev() {
            plan.scatter_block(&scratch, plan.chunk(), p.rows, b, o);
        }
        out
    }

    #[test]
    fn blocked_path_equals_per_head_algorithm_bit_for_bit() {
        let cases = [
            ((64, 64), 2, 7),
            ((256, 256), 1, 4),
            ((64, 64), 3, 1),
            ((20, 20), 2, 4),
            ((256, 256), 2, 7),
            ((576, 512), 1, 4),
            ((48, 24), 2, 2),
        ];
        for (hd, n_head_kv, ratio) in cases {
            let n_head = n_head_kv * ratio;
            for (rows, pos0) in [(37, 0), (1, 0), (1, 40), (19, 13), (70, 5)] {
                // A large scale makes some probabilities round to zero in f16 (skipped V rows).
                for (window, scale, softcap, with_sinks) in [
                    (None, 0.125, None, false),
                    (Some(7), 0.3, None, false),
                    (Some(100), 2.0, None, false),
                    (None, 0.3, Some(2.5), true),
                    (Some(9), 1.0, None, true),
                ] {
                    let p = AttnParams {
                        scale,
                        window,
                        softcap,
                        ..params(rows, pos0, n_head, n_head_kv, hd)
                    };
                    let (q, k, v) = inputs(&p);
                    let sinks: Vec<f32> = (0..n_head).map(|h| val(h, 4.0)).collect();
                    let sinks = with_sinks.then_some(sinks.as_slice());
                    let mut want = vec![0f32; rows * p.out_dim()];
                    for (i, o) in want.chunks_mut(hd.1).enumerate() {
                        let (r, h) = (i / n_head, i % n_head);
                        let qh = &q[i * hd.0..(i + 1) * hd.0];
                        let sink = sinks.map(|s| s[h]);
                        attend_head(qh, &k, &v, h / ratio, pos0 + r, &p, sink, &mut Vec::new(), o);
                    }
                    for threads in [1, 2, 3, 16] {
                        let got = blocked(&p, threads, |b, o| attend_block(&q, &k, &v, &p, sinks, b, o));
                        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                            assert_eq!(
                                a.to_bits(),
                                b.to_bits(),
                                "value {i}: {a} vs {b} (hd {hd:?}, kv heads {n_head_kv}, ratio {ratio}, \
                                 rows {rows}, pos0 {pos0}, window {window:?}, cap {softcap:?}, threads {threads})"
                            );
                        }
                    }
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    /// The V kernels against the portable sums, bit for bit: every column step of the 512-bit
    /// kernel (128, 64 over all keys, 32), the AVX2 one's two, and MLA's 512-wide heads, with
    /// zero probabilities (skipped keys) and a partly zero key block.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn v_kernels_give_the_portable_bits() {
        let (heads, n, m) = (3, 37, 29);
        let round = |x: f32| f16::from_f32(x).to_f32();
        let scores: Vec<f32> = (0..heads * n)
            .map(|i| {
                if i % 7 == 3 || (8..16).contains(&(i % n)) {
                    0.0
                } else {
                    round(val(i, 5.0).abs() / 4.0)
                }
            })
            .collect();
        for hdv in [32, 64, 96, 128, 160, 192, 512] {
            let vrows: Vec<f32> = (0..m * hdv).map(|i| round(val(i, 2.0))).collect();
            let mut want = vec![f32::NAN; heads * hdv];
            weigh_heads::<false>(&scores, n, m, &vrows, hdv, &mut want);
            let bits = |o: &[f32]| o.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            if avx2_build() {
                let mut got = vec![f32::NAN; heads * hdv];
                // SAFETY: the features were just detected; the values are f16 values.
                unsafe { weigh_heads_avx2(&scores, n, m, &vrows, hdv, &mut got) };
                assert_eq!(bits(&got), bits(&want), "avx2, {hdv} values");
            }
            if avx512_build() {
                let mut got = vec![f32::NAN; heads * hdv];
                // SAFETY: as above.
                unsafe { weigh_heads_avx512(&scores, n, m, &vrows, hdv, &mut got) };
                assert_eq!(bits(&got), bits(&want), "avx512, {hdv} values");
            }
        }
    }

    #[test]
    fn portable_build_equals_avx2_build() {
        if !super::avx2_build() {
            return;
        }
        // Widths that are no multiple of 32, then the AVX2 build's V kernels: 64 values in
        // registers over all keys, and an odd multiple of 32 in blocks of keys.
        let cases = [
            ((68, 68), None, false),
            ((72, 40), Some(3.0), true),
            ((64, 64), None, false),
            ((96, 160), Some(3.0), true),
        ];
        for (hd, softcap, with_sinks) in cases {
            let p = AttnParams {
                window: Some(12),
                scale: 0.4,
                softcap,
                v_in_k: false,
                ..params(21, 9, 7, 1, hd)
            };
            let (q, k, v) = inputs(&p);
            let sinks: Vec<f32> = (0..p.n_head).map(|h| val(h, 4.0)).collect();
            let sinks = with_sinks.then_some(sinks.as_slice());
            let b = Block {
                row0: 3,
                rows: 11,
                kvh: 0,
                head0: 2,
                heads: 5,
            };
            let mut fast = vec![0f32; b.rows * b.heads * p.head_dim_v];
            let mut slow = fast.clone();
            let n = p.pos0 + b.row0 + b.rows - first_visible(p.pos0 + b.row0, p.window);
            let mut scratch = vec![0f32; scratch_len(&p, b.heads, n)];
            // SAFETY: the features were just detected.
            unsafe { attend_block_avx2(&q, &k, &v, &p, sinks, &b, &mut scratch, &mut fast) };
            attend_block_generic::<false>(&q, &k, &v, &p, sinks, &b, &mut scratch, &mut slow);
            assert!(fast.iter().zip(&slow).all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }
}
