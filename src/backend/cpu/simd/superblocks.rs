//! The driver of the kernels that read 256-value weight super-blocks in the file layout against
//! Q8_K activations (`dot_ternary`, `dot_iquant`, `dot_iq1`), written once. A format says how
//! to unpack a group of 32 values ([`SuperBlocks::group`]) and how such a group meets 32
//! activation bytes ([`SuperBlocks::meet`]: exact integer products in i32 lanes); the driver
//! sums each super-block's groups per output, then takes the oracle's f32 steps
//! ([`SuperBlocks::finish`]), so every output has its own sum in the oracle's order and does
//! not depend on the tile it was computed in.
//!
//! Up to four activation rows (decode, and the batched decode of a few streams) meet each group
//! as it is unpacked, in registers. More rows (prefill) unpack a super-block's eight groups
//! once into a buffer and meet every row with them.

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

use crate::backend::cpu::tile::{Activations, TileOut};

/// Bytes of one Q8_K block: f32 scale at 0, 256 values at 4, 16 i16 sums at 260.
const ACT_BLOCK: usize = 292;

/// A format's steps. Their bodies are `#[inline(always)]` with no target features of their
/// own: they inline into the driver, which has AVX2's, and so do the intrinsics they call.
pub(super) trait SuperBlocks {
    /// Bytes of one weight super-block.
    const BYTES: usize;
    /// What a row's sum is multiplied by at the end (the grids' fixed-point scale).
    const FACTOR: f32 = 1.0;
    /// What every group of a super-block shares, decoded once (its scale `d`, and what the
    /// groups read: TQ1_0's trits).
    type Head;
    /// One group of 32 values, unpacked: the operands of [`SuperBlocks::meet`].
    type Group: Copy;
    /// The head of the super-block at `p`.
    unsafe fn head(p: *const u8) -> Self::Head;
    /// The super-block's scale `d_w`.
    fn scale(head: &Self::Head) -> f32;
    /// Group `g` (values `32g..32g + 32`) of the super-block at `p`.
    unsafe fn group(p: *const u8, head: &Self::Head, g: usize) -> Self::Group;
    /// The group's exact products with the 32 activation bytes `q8`, as i32 lanes.
    unsafe fn meet(x: &Self::Group, q8: __m256i) -> __m256i;
    /// The super-block's term of a row's sum from its integer sum, in the oracle's f32 steps.
    #[inline(always)]
    fn finish(d: f32, yd: f32, isum: i32) -> f32 {
        d * yd * isum as f32
    }
}

/// The i32 sum of the eight lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

/// Odd scales `2s + 1` of a group of 32's two halves as i16 lanes (0..8 the first's).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn odd_halves(s1: u32, s2: u32) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16((2 * s2 + 1) as i16), _mm_set1_epi16((2 * s1 + 1) as i16))
}

/// Four 8-byte lanes from a table's entries.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn lanes64(v: [u64; 4]) -> __m256i {
    _mm256_setr_epi64x(v[0] as i64, v[1] as i64, v[2] as i64, v[3] as i64)
}

/// The f32 scale of the Q8_K block at `y`.
#[inline(always)]
unsafe fn act_scale(y: *const u8) -> f32 {
    std::ptr::read_unaligned(y as *const f32)
}

/// The 32 activation bytes of group `g` (values `32g..32g + 32`) of the Q8_K block at `y`.
#[inline(always)]
unsafe fn act_group(y: *const u8, g: usize) -> __m256i {
    _mm256_loadu_si256(y.add(4 + 32 * g) as *const __m256i)
}

/// All outputs of `out`: its weight rows (`k` values each, file layout) times the prepared
/// Q8_K activation rows. The caller checked the lengths.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn run<F: SuperBlocks>(k: usize, weights: &[u8], act: &Activations, out: &mut TileOut<'_>) {
    if act.rows <= super::lanes::LANE_C {
        for_row_groups!(act.rows, |a0, CC| fused::<F, CC>(k, weights, act, a0, out));
    } else {
        buffered::<F>(k, weights, act, out);
    }
}

/// Outputs `(a0..a0 + CC) × all` of `out`: each group meets the `CC` rows as it is unpacked.
#[inline(always)]
unsafe fn fused<F: SuperBlocks, const CC: usize>(
    k: usize,
    weights: &[u8],
    act: &Activations,
    a0: usize,
    out: &mut TileOut<'_>,
) {
    let nb = k / 256;
    for w in 0..out.nw() {
        let row = weights.as_ptr().add(w * nb * F::BYTES);
        let mut sum = [0f32; CC];
        for b in 0..nb {
            let p = row.add(b * F::BYTES);
            let mut y = [std::ptr::null::<u8>(); CC];
            for (c, y) in y.iter_mut().enumerate() {
                *y = act.bytes.as_ptr().add(((a0 + c) * nb + b) * ACT_BLOCK);
            }
            let head = F::head(p);
            let mut acc = [_mm256_setzero_si256(); CC];
            for g in 0..8 {
                let x = F::group(p, &head, g);
                for c in 0..CC {
                    acc[c] = _mm256_add_epi32(acc[c], F::meet(&x, act_group(y[c], g)));
                }
            }
            for c in 0..CC {
                sum[c] += F::finish(F::scale(&head), act_scale(y[c]), hsum_epi32(acc[c]));
            }
        }
        for c in 0..CC {
            out.set(a0 + c, w, F::FACTOR * sum[c]);
        }
    }
}

/// Every output of `out`: each super-block's groups are unpacked once and met by every row.
#[inline(always)]
unsafe fn buffered<F: SuperBlocks>(k: usize, weights: &[u8], act: &Activations, out: &mut TileOut<'_>) {
    let nb = k / 256;
    // sum: [rows] the current weight row's outputs.
    let mut sum = vec![0f32; act.rows];
    let mut groups = [MaybeUninit::<F::Group>::uninit(); 8];
    for w in 0..out.nw() {
        sum.fill(0.0);
        let row = weights.as_ptr().add(w * nb * F::BYTES);
        for b in 0..nb {
            let p = row.add(b * F::BYTES);
            let head = F::head(p);
            for (g, x) in groups.iter_mut().enumerate() {
                x.write(F::group(p, &head, g));
            }
            for (r, s) in sum.iter_mut().enumerate() {
                let y = act.bytes.as_ptr().add((r * nb + b) * ACT_BLOCK);
                let mut acc = _mm256_setzero_si256();
                for (g, x) in groups.iter().enumerate() {
                    acc = _mm256_add_epi32(acc, F::meet(x.assume_init_ref(), act_group(y, g)));
                }
                *s += F::finish(F::scale(&head), act_scale(y), hsum_epi32(acc));
            }
        }
        for (r, &s) in sum.iter().enumerate() {
            out.set(r, w, F::FACTOR * s);
        }
    }
}
