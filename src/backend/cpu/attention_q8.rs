//! Softmax attention over a Q8_0 KV cache (`--cache-type q8_0`), the tasks of `attention.rs`'s
//! [`Plan`](super::attention::Plan), reading the cache's blocks directly.
//!
//! Mirrors llama.cpp's flash-attention path for a quantized cache (the only path it has for a
//! quantized V; the heads arrive rotated as llama.cpp rotates them, `backend::rotation`, by
//! the model's attention block): each query head is quantized to Q8_0 with the rule the cache
//! is stored with,
//! q·k is ggml's Q8_0 dot product (an exact integer sum per block, times both scales), and the
//! probabilities, kept in f32, weight each V block on the fly (each int8 value times `p · d`, the
//! block's scale folded into the probability). The softmax
//! is `attention.rs`'s (f32 scores, f64 sums, sinks and soft-capping alike).
//!
//! Two builds of one algorithm: the portable one below, which is also the scalar reference,
//! and explicit AVX2 intrinsics (`maddubs` on the int8 blocks, int8 -> f32 widening for V),
//! chosen at run time. The portable code sums in exactly the lanes and order of the AVX2 code
//! (per block, eight lanes of four products each; per key, the lanes added pairwise as the
//! horizontal sum does) and neither fuses a multiply-add, so both give the same bits (tested).
//!
//! A task works on one row at a time: its query heads' q·k against every visible key (the
//! K blocks loaded once for up to [`TILE`] heads), then their weighted V sums (each V block
//! widened once for up to [`TILE`] heads, [`KEY_CHUNK`] keys at a time so that the blocks and
//! their weights stay in L1 across the head's output groups).

// Accumulator tiles are `[[f32; LANES]; N]` arrays indexed in nested loops the compiler unrolls.
#![allow(clippy::needless_range_loop)]

use std::cell::RefCell;

use super::attention::{first_visible, softmax_heads, with_task_scratch, Block, Sinks};
use crate::backend::attn::AttnParams;
use crate::quant::legacy::{quantize_q8_0_blocks, BlockQ8_0, QK};

/// Lanes of a partial sum: one AVX2 register of f32.
const LANES: usize = 8;

/// Most query heads whose q·k run together against one K row, and whose weighted sums run
/// together over the V blocks (each block loaded and widened once for all of them).
const TILE: usize = 8;

thread_local! {
    /// A task's query heads quantized to Q8_0, kept per worker thread.
    static Q_BLOCKS: RefCell<Vec<BlockQ8_0>> = const { RefCell::new(Vec::new()) };
}

/// Attention for the rows and heads of `b`, as `attention::attend_block` for an f16 cache:
/// `q` holds all `p.rows` query rows (`[rows][n_head][head_dim_k]`), the caches Q8_0 blocks of
/// rows of `n_head_kv` heads (heads of whole blocks: the caller checks) for positions up to
/// `p.pos0 + p.rows`; writes `out[..b.rows * b.heads * head_dim_v]` as
/// `[row][head][head_dim_v]`.
#[allow(clippy::too_many_arguments)]
pub fn attend_block(
    q: &[f32],
    k_cache: &[BlockQ8_0],
    v_cache: &[BlockQ8_0],
    p: &AttnParams,
    sinks: Sinks<'_>,
    b: &Block,
    out: &mut [f32],
) {
    if b.rows == 0 || b.heads == 0 || p.head_dim_k == 0 || p.head_dim_v == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("f16c") {
        // SAFETY: the features `attend_block_avx2` enables were just detected.
        unsafe { attend_block_avx2(q, k_cache, v_cache, p, sinks, b, out) };
        return;
    }
    attend_block_generic::<false>(q, k_cache, v_cache, p, sinks, b, out);
}

/// [`attend_block_generic`] with the AVX2 kernels.
///
/// # Safety
/// The CPU must support AVX2 and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn attend_block_avx2(
    q: &[f32],
    k_cache: &[BlockQ8_0],
    v_cache: &[BlockQ8_0],
    p: &AttnParams,
    sinks: Sinks<'_>,
    b: &Block,
    out: &mut [f32],
) {
    attend_block_generic::<true>(q, k_cache, v_cache, p, sinks, b, out);
}

/// `$f::<nt, $simd>($args)` for a tile of `nt` (1..=[`TILE`]) heads.
macro_rules! tiles {
    ($nt:expr, $f:ident, $simd:ident, ($($a:expr),*)) => {
        match $nt {
            8 => $f::<8, $simd>($($a),*),
            7 => $f::<7, $simd>($($a),*),
            6 => $f::<6, $simd>($($a),*),
            5 => $f::<5, $simd>($($a),*),
            4 => $f::<4, $simd>($($a),*),
            3 => $f::<3, $simd>($($a),*),
            2 => $f::<2, $simd>($($a),*),
            _ => $f::<1, $simd>($($a),*),
        }
    };
}

/// See [`attend_block`]; `SIMD` picks the AVX2 kernels (only `attend_block_avx2` sets it).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend_block_generic<const SIMD: bool>(
    q: &[f32],
    k_cache: &[BlockQ8_0],
    v_cache: &[BlockQ8_0],
    p: &AttnParams,
    sinks: Sinks<'_>,
    b: &Block,
    out: &mut [f32],
) {
    let (hdk, hdv) = (p.head_dim_k, p.head_dim_v);
    let (nbk, nbv) = (hdk / QK, hdv / QK);
    let q_dim = p.n_head * hdk;
    // K: blocks from one position to the next, and the block of this task's KV head.
    let k_layout = (p.n_head_kv * nbk, b.kvh * nbk);
    let (v_row, v_head) = p.v_layout();
    let v_layout = (v_row / QK, b.kvh * v_head / QK);
    // Keys lo..=hi are visible from some row of the block.
    let lo = first_visible(p.pos0 + b.row0, p.window);
    let n = p.pos0 + b.row0 + b.rows - lo;
    // Soft-capping needs the raw q·k first; without it the scale goes into the products.
    let kq_scale = if p.softcap.is_some() { 1.0 } else { p.scale };
    let sinks = sinks.map(|s| &s[b.head0..b.head0 + b.heads]);
    Q_BLOCKS.with_borrow_mut(|qb| {
        if qb.len() < b.heads * nbk {
            qb.resize(
                b.heads * nbk,
                BlockQ8_0 {
                    d: half::f16::ZERO,
                    qs: [0; QK],
                },
            );
        }
        let qb = &mut qb[..b.heads * nbk];
        // scores: [heads][n] (a row's visible keys); inv: [heads] softmax normalizers.
        with_task_scratch(b.heads * (n + 1), |scratch| {
            let (scores, inv) = scratch.split_at_mut(b.heads * n);
            for r in 0..b.rows {
                let pos = p.pos0 + b.row0 + r;
                let first = first_visible(pos, p.window);
                let keys = (first, pos + 1 - first);
                let qrow = &q[(b.row0 + r) * q_dim + b.head0 * hdk..][..b.heads * hdk];
                quantize_q8_0_blocks(qrow, qb);
                let mut g0 = 0;
                while g0 < b.heads {
                    let nt = (b.heads - g0).min(TILE);
                    let (qs, s) = (&qb[g0 * nbk..(g0 + nt) * nbk], &mut scores[g0 * n..]);
                    tiles!(nt, score_tile, SIMD, (qs, k_cache, k_layout, keys, nbk, kq_scale, s, n));
                    g0 += nt;
                }
                softmax_heads(p, sinks, scores, n, keys.1, inv);
                for (g, &inv) in inv.iter().enumerate() {
                    scores[g * n..g * n + keys.1].iter_mut().for_each(|s| *s *= inv);
                }
                let o = &mut out[r * b.heads * hdv..(r + 1) * b.heads * hdv];
                let mut g0 = 0;
                while g0 < b.heads {
                    let nt = (b.heads - g0).min(TILE);
                    let (probs, og) = (&scores[g0 * n..], &mut o[g0 * hdv..(g0 + nt) * hdv]);
                    tiles!(nt, weigh_tile, SIMD, (probs, n, v_cache, v_layout, keys, nbv, og));
                    g0 += nt;
                }
            }
        });
    });
}

/// The sum of eight lanes in the order of AVX2's horizontal sum (halves, then pairs).
#[inline(always)]
fn hsum(a: &[f32; LANES]) -> f32 {
    let s = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    (s[0] + s[2]) + (s[1] + s[3])
}

/// `scores[g * stride + i] = (qs[g] · K[first + i]) * scale` for the `N` query heads of `qs`
/// (`[N][nb]` blocks) and the `m` keys from `first` (`keys`), K row `j` being the `nb` blocks
/// of `k_cache` from `j * layout.0 + layout.1`. Per block, lane `l` sums the exact integer
/// products of values `4l..4l + 4` and adds them, times `d_k · d_q`, to its partial sum.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn score_tile<const N: usize, const SIMD: bool>(
    qs: &[BlockQ8_0],
    k_cache: &[BlockQ8_0],
    layout: (usize, usize),
    (first, m): (usize, usize),
    nb: usize,
    scale: f32,
    scores: &mut [f32],
    stride: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if SIMD {
        // SAFETY: `SIMD` is set only by `attend_block_avx2`, which enables AVX2 and F16C.
        unsafe { score_tile_avx2::<N>(qs, k_cache, layout, (first, m), nb, scale, scores, stride) };
        return;
    }
    for i in 0..m {
        let krow = &k_cache[(first + i) * layout.0 + layout.1..][..nb];
        let mut acc = [[0f32; LANES]; N];
        for (bi, kb) in krow.iter().enumerate() {
            let dk = kb.d.to_f32();
            for g in 0..N {
                let qb = &qs[g * nb + bi];
                let d = dk * qb.d.to_f32();
                for l in 0..LANES {
                    let s: i32 = (4 * l..4 * l + 4)
                        .map(|e| i32::from(kb.qs[e]) * i32::from(qb.qs[e]))
                        .sum();
                    acc[g][l] += d * s as f32;
                }
            }
        }
        for g in 0..N {
            scores[g * stride + i] = hsum(&acc[g]) * scale;
        }
    }
}

/// Keys per pass of [`weigh_tile`]: their V blocks and weights stay in L1 while each group of
/// eight output values of every head of the tile goes over them.
const KEY_CHUNK: usize = 64;

/// `w[i * N + g] = probs[g * stride + i0 + i] · d` of V block `bi` of key `first + i0 + i`, for
/// the `w.len() / N` keys of a chunk: the weight of the block's integer values.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn chunk_weights<const N: usize>(
    probs: &[f32],
    stride: usize,
    v_cache: &[BlockQ8_0],
    layout: (usize, usize),
    key0: usize,
    i0: usize,
    bi: usize,
    w: &mut [f32],
    widen: impl Fn(half::f16) -> f32,
) {
    for (i, wi) in w.chunks_exact_mut(N).enumerate() {
        let d = widen(v_cache[(key0 + i0 + i) * layout.0 + layout.1 + bi].d);
        for g in 0..N {
            wi[g] = probs[g * stride + i0 + i] * d;
        }
    }
}

/// `o[g] = Σ_i probs[g * stride + i] · V[first + i]` for the `N` heads of the tile (`o`:
/// `[N][nb * 32]`), V row `j` being the `nb` blocks of `v_cache` from `j * layout.0 +
/// layout.1`: each int8 value times its block's weight `p · d` ([`chunk_weights`]) added in key
/// order from zero, per group of eight values, [`KEY_CHUNK`] keys at a time.
#[inline(always)]
fn weigh_tile<const N: usize, const SIMD: bool>(
    probs: &[f32],
    stride: usize,
    v_cache: &[BlockQ8_0],
    layout: (usize, usize),
    (first, m): (usize, usize),
    nb: usize,
    o: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if SIMD {
        // SAFETY: as in `score_tile`.
        unsafe { weigh_tile_avx2::<N>(probs, stride, v_cache, layout, (first, m), nb, o) };
        return;
    }
    let hd = nb * QK;
    o[..N * hd].fill(0.0);
    let mut w = [0f32; KEY_CHUNK * TILE];
    for i0 in (0..m).step_by(KEY_CHUNK) {
        let n = (m - i0).min(KEY_CHUNK);
        for bi in 0..nb {
            let w = &mut w[..n * N];
            chunk_weights::<N>(probs, stride, v_cache, layout, first, i0, bi, w, half::f16::to_f32);
            for c in (0..QK).step_by(LANES) {
                let mut acc = [[0f32; LANES]; N];
                for g in 0..N {
                    acc[g].copy_from_slice(&o[g * hd + bi * QK + c..][..LANES]);
                }
                for (i, wi) in w.chunks_exact(N).enumerate() {
                    let qs = &v_cache[(first + i0 + i) * layout.0 + layout.1 + bi].qs[c..c + LANES];
                    for g in 0..N {
                        for l in 0..LANES {
                            acc[g][l] += f32::from(qs[l]) * wi[g];
                        }
                    }
                }
                for g in 0..N {
                    o[g * hd + bi * QK + c..][..LANES].copy_from_slice(&acc[g]);
                }
            }
        }
    }
}

/// [`hsum`] of a register: the halves added, then the pairs.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn hsum_avx2(v: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// [`score_tile`]'s portable loop in AVX2: the integer products by `maddubs` (|k| times q with
/// k's sign) and `madd`, eight lanes of four, then `acc += d · lanes` unfused.
///
/// # Safety
/// The CPU must support AVX2 and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn score_tile_avx2<const N: usize>(
    qs: &[BlockQ8_0],
    k_cache: &[BlockQ8_0],
    layout: (usize, usize),
    (first, m): (usize, usize),
    nb: usize,
    scale: f32,
    scores: &mut [f32],
    stride: usize,
) {
    use std::arch::x86_64::*;
    if m == 0 {
        return;
    }
    assert!(qs.len() >= N * nb && scores.len() >= (N - 1) * stride + m);
    assert!(k_cache.len() >= (first + m - 1) * layout.0 + layout.1 + nb);
    let ones = _mm256_set1_epi16(1);
    // The query's scales, widened once.
    let mut dq = [[0f32; N]; 32];
    let nbq = nb.min(dq.len());
    for bi in 0..nbq {
        for g in 0..N {
            dq[bi][g] = widen_f16(qs.get_unchecked(g * nb + bi).d);
        }
    }
    for i in 0..m {
        let krow = k_cache.as_ptr().add((first + i) * layout.0 + layout.1);
        let mut acc = [_mm256_setzero_ps(); N];
        for bi in 0..nb {
            let kb = &*krow.add(bi);
            let kx = _mm256_loadu_si256(kb.qs.as_ptr() as *const __m256i);
            let ax = _mm256_sign_epi8(kx, kx);
            let dk = widen_f16(kb.d);
            for g in 0..N {
                let qb = qs.get_unchecked(g * nb + bi);
                let qy = _mm256_loadu_si256(qb.qs.as_ptr() as *const __m256i);
                let sy = _mm256_sign_epi8(qy, kx);
                let lanes = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), ones));
                let dqg = if bi < nbq { dq[bi][g] } else { widen_f16(qb.d) };
                let d = _mm256_set1_ps(dk * dqg);
                acc[g] = _mm256_add_ps(acc[g], _mm256_mul_ps(d, lanes));
            }
        }
        for g in 0..N {
            *scores.get_unchecked_mut(g * stride + i) = hsum_avx2(acc[g]) * scale;
        }
    }
}

/// `h` as f32 by the F16C instruction (exact, as `f16::to_f32`, which would check the CPU at
/// every call).
///
/// # Safety
/// The CPU must support F16C.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn widen_f16(h: half::f16) -> f32 {
    use std::arch::x86_64::*;
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(h.to_bits()))))
}

/// [`weigh_tile`]'s portable loop in AVX2: eight int8 values widened to f32, then
/// `acc += x · w` unfused per head.
///
/// # Safety
/// The CPU must support AVX2 and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn weigh_tile_avx2<const N: usize>(
    probs: &[f32],
    stride: usize,
    v_cache: &[BlockQ8_0],
    layout: (usize, usize),
    (first, m): (usize, usize),
    nb: usize,
    o: &mut [f32],
) {
    use std::arch::x86_64::*;
    let hd = nb * QK;
    o[..N * hd].fill(0.0);
    if m == 0 {
        return;
    }
    assert!((N - 1) * stride + m <= probs.len());
    assert!(v_cache.len() >= (first + m - 1) * layout.0 + layout.1 + nb);
    let mut w = [0f32; KEY_CHUNK * TILE];
    for i0 in (0..m).step_by(KEY_CHUNK) {
        let n = (m - i0).min(KEY_CHUNK);
        let rows = v_cache.as_ptr().add((first + i0) * layout.0 + layout.1);
        for bi in 0..nb {
            let w = &mut w[..n * N];
            chunk_weights::<N>(probs, stride, v_cache, layout, first, i0, bi, w, |h| widen_f16(h));
            for c in (0..QK).step_by(LANES) {
                let out = o.as_mut_ptr().add(bi * QK + c);
                let mut acc = [_mm256_setzero_ps(); N];
                for g in 0..N {
                    acc[g] = _mm256_loadu_ps(out.add(g * hd));
                }
                for i in 0..n {
                    let vb = &*rows.add(i * layout.0 + bi);
                    let q8 = _mm_loadl_epi64(vb.qs.as_ptr().add(c) as *const __m128i);
                    let x = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8));
                    let wi = w.as_ptr().add(i * N);
                    for g in 0..N {
                        acc[g] = _mm256_add_ps(acc[g], _mm256_mul_ps(x, _mm256_broadcast_ss(&*wi.add(g))));
                    }
                }
                for g in 0..N {
                    _mm256_storeu_ps(out.add(g * hd), acc[g]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::attention::tests::{blocked, params, reference};
    use super::*;
    use half::f16;

    /// A small deterministic generator (xorshift) of values in `[-1, 1)`.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> f32 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        }

        fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
            (0..n).map(|_| scale * self.next()).collect()
        }
    }

    fn quantized(x: &[f32]) -> Vec<BlockQ8_0> {
        let mut b = vec![
            BlockQ8_0 {
                d: f16::ZERO,
                qs: [0; QK]
            };
            x.len() / QK
        ];
        quantize_q8_0_blocks(x, &mut b);
        b
    }

    /// The f64 attention of the dequantized cache with q quantized as the kernel quantizes it:
    /// what the kernel computes, less its f32 rounding.
    fn reference_all(q: &[f32], k: &[BlockQ8_0], v: &[BlockQ8_0], p: &AttnParams, sinks: Sinks<'_>) -> Vec<f64> {
        let deq = |b: &[BlockQ8_0]| -> Vec<f64> {
            b.iter()
                .flat_map(|b| b.qs.map(|x| f64::from(x) * f64::from(b.d.to_f32())))
                .collect()
        };
        let (kf, vf) = (deq(k), deq(v));
        let mut out = Vec::new();
        for r in 0..p.rows {
            for h in 0..p.n_head {
                let qh = deq(&quantized(&q[(r * p.n_head + h) * p.head_dim_k..][..p.head_dim_k]));
                let sink = sinks.map(|s| f64::from(s[h]));
                out.extend(reference(
                    &qh,
                    &kf,
                    &vf,
                    h / (p.n_head / p.n_head_kv),
                    p.pos0 + r,
                    p,
                    sink,
                ));
            }
        }
        out
    }

    /// Shapes of the models (head widths 64, 128, 256, MLA's 576/512 latent with V inside K),
    /// grouped heads from 1 to 16 per KV head (tiles of every size), windows, soft-capping and
    /// sinks, prefill blocks and decode.
    fn cases() -> Vec<(AttnParams, bool)> {
        let mut v = Vec::new();
        for (hd, nh, nkv, v_in_k) in [
            ((64, 64), 14, 2, false),
            ((128, 128), 8, 1, false),
            ((256, 256), 4, 1, false),
            ((64, 32), 6, 3, false),
            ((160, 128), 16, 1, true),
            ((576, 512), 5, 1, true),
        ] {
            for (rows, pos0) in [(37, 0), (1, 50), (9, 30)] {
                for (window, softcap, sinks) in [(None, None, false), (Some(11), Some(20.0), true)] {
                    let p = AttnParams {
                        window,
                        softcap,
                        v_in_k,
                        scale: 1.0 / (hd.0 as f32).sqrt(),
                        ..params(rows, pos0, nh, nkv, hd)
                    };
                    v.push((p, sinks));
                }
            }
        }
        v
    }

    fn inputs(rng: &mut Rng, p: &AttnParams) -> (Vec<f32>, Vec<BlockQ8_0>, Vec<BlockQ8_0>, Vec<f32>) {
        let n_pos = p.pos0 + p.rows;
        let k = quantized(&rng.vec(n_pos * p.n_head_kv * p.head_dim_k, 2.0));
        let v = quantized(&rng.vec(n_pos * p.n_head_kv * p.head_dim_v, 2.0));
        let q = rng.vec(p.rows * p.q_dim(), 2.0);
        let sinks = rng.vec(p.n_head, 1.0);
        (q, k, v, sinks)
    }

    /// The portable build against the f64 evaluation of the same quantized inputs: the only
    /// difference is f32 rounding (scores summed in lanes, probabilities in f32).
    #[test]
    fn portable_build_matches_f64_reference() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for (p, with_sinks) in cases() {
            let (q, k, v, sinks) = inputs(&mut rng, &p);
            let sinks = with_sinks.then_some(sinks.as_slice());
            let (k, v) = (&k, if p.v_in_k { &k } else { &v });
            let got = blocked(&p, 2, |b, o| attend_block_generic::<false>(&q, k, v, &p, sinks, b, o));
            let want = reference_all(&q, k, v, &p, sinks);
            let err: f64 = got.iter().zip(&want).map(|(a, b)| (f64::from(*a) - b).powi(2)).sum();
            let norm: f64 = want.iter().map(|b| b * b).sum();
            assert!(err / norm < 1e-11, "NMSE {:e} for {p:?}", err / norm);
        }
    }

    /// The AVX2 build and the portable one give the same bits, for any split into tasks.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_build_equals_portable_build_bit_for_bit() {
        if !(std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("f16c")) {
            return;
        }
        let mut rng = Rng(42);
        for (p, with_sinks) in cases() {
            let (q, k, v, sinks) = inputs(&mut rng, &p);
            let sinks = with_sinks.then_some(sinks.as_slice());
            let (k, v) = (&k, if p.v_in_k { &k } else { &v });
            let want = blocked(&p, 1, |b, o| attend_block_generic::<false>(&q, k, v, &p, sinks, b, o));
            for threads in [1, 2, 5] {
                // SAFETY: the features were detected above.
                let got = blocked(&p, threads, |b, o| unsafe {
                    attend_block_avx2(&q, k, v, &p, sinks, b, o)
                });
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "value {i}: {a} vs {b} ({p:?}, {threads} threads)"
                    );
                }
            }
        }
    }
}
