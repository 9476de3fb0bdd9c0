//! Q1_0 rows (one sign bit per weight, one f16 scale per 128) against Q8_0 activations, in
//! the file layout.
//!
//! Per 32 weights, all integer: the 32 sign bits become a byte mask (`0xff` where the weight is
//! `-d`), the activation bytes are negated under it (`(q ^ m) - m`), and `maddubs`/`madd` with
//! ones sum them into eight i32 lanes: `Σ ±q_a` exactly. Each sum is scaled by its activation
//! block's `d_a` into an f32 block sum, whose four sub-sums are scaled by the weight's `d_w`, as
//! ggml's `ggml_vec_dot_q1_0_q8_0`. Every output has its own accumulator, so its value does not
//! depend on the tile it was computed in.

use std::arch::x86_64::*;

use super::lanes::{bit_bytes, for_tiles, hsum_ps, load_f16};
use crate::backend::cpu::tile::{Activations, TileOut};
use crate::quant::legacy::QK;
use crate::quant::sign::QK1_0;

/// Bytes of a Q1_0 block.
const BLOCK: usize = 18;
use super::q8::Q8_0_BLOCK as ACT_BLOCK;
/// Q8_0 blocks per Q1_0 block.
const SUBS: usize = QK1_0 / QK;
const R: usize = 4;
const C: usize = 2;

/// The 32 sign bits at `p` as 32 bytes, `0xff` where the bit is clear (the weight is `-d`) and
/// 0 where it is set.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn negate_mask(p: *const u8) -> __m256i {
    let set = bit_bytes(std::ptr::read_unaligned(p as *const u32));
    _mm256_cmpeq_epi8(set, _mm256_setzero_si256())
}

/// Outputs `(w0..w0 + RR) × (a0..a0 + CC)`: `RR` weight rows of `nb` blocks at `w` against
/// `CC` activation rows.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kernel<const RR: usize, const CC: usize>(
    nb: usize,
    w: &[u8],
    act: &Activations,
    w0: usize,
    a0: usize,
    out: &mut TileOut<'_>,
) {
    let (ones8, ones16) = (_mm256_set1_epi8(1), _mm256_set1_epi16(1));
    let row_bytes = nb * BLOCK;
    let mut acc = [[_mm256_setzero_ps(); CC]; RR];
    for b in 0..nb {
        // The activation blocks of this weight block, per activation row.
        let mut qy = [[_mm256_setzero_si256(); SUBS]; CC];
        let mut dy = [[_mm256_setzero_ps(); SUBS]; CC];
        for c in 0..CC {
            let blk0 = (a0 + c) * nb * SUBS + b * SUBS;
            for s in 0..SUBS {
                let p = act.bytes.as_ptr().add((blk0 + s) * ACT_BLOCK);
                qy[c][s] = _mm256_loadu_si256(p.add(2) as *const __m256i);
                dy[c][s] = _mm256_set1_ps(act.scales[blk0 + s]);
            }
        }
        for r in 0..RR {
            let p = w.as_ptr().add((w0 + r) * row_bytes + b * BLOCK);
            let dw = _mm256_set1_ps(load_f16(p));
            let mut block = [_mm256_setzero_ps(); CC];
            for s in 0..SUBS {
                let m = negate_mask(p.add(2 + 4 * s));
                for c in 0..CC {
                    let signed = _mm256_sub_epi8(_mm256_xor_si256(qy[c][s], m), m);
                    let sum = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, signed), ones16);
                    block[c] = _mm256_add_ps(block[c], _mm256_mul_ps(dy[c][s], _mm256_cvtepi32_ps(sum)));
                }
            }
            for c in 0..CC {
                acc[r][c] = _mm256_add_ps(acc[r][c], _mm256_mul_ps(dw, block[c]));
            }
        }
    }
    for r in 0..RR {
        for c in 0..CC {
            out.set(a0 + c, w0 + r, hsum_ps(acc[r][c]));
        }
    }
}

/// All outputs of `out`: its weight rows (`k` values each, file layout) times the prepared
/// Q8_0 activation rows (their `scales` filled). The caller checked the lengths.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn tile(k: usize, weights: &[u8], act: &Activations, out: &mut TileOut<'_>) {
    let nb = k / QK1_0;
    for_tiles::<R, C>(out.nw(), act.rows, |w0, a0, r, c| match (r, c) {
        (R, C) => kernel::<R, C>(nb, weights, act, w0, a0, out),
        (R, _) => kernel::<R, 1>(nb, weights, act, w0, a0, out),
        (_, C) => kernel::<1, C>(nb, weights, act, w0, a0, out),
        _ => kernel::<1, 1>(nb, weights, act, w0, a0, out),
    });
}
