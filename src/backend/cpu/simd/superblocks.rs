//! The driver of the kernels that read 256-value weight super-blocks in the file layout against
//! Q8_K activations (`dot_ternary`, `dot_iquant`, `dot_iq1`), written once: each weight
//! super-block is unpacked once ([`SuperBlocks::unpack`]) and met by every activation row
//! ([`SuperBlocks::meet`]), each output with its own f32 sum, so a value does not depend on the
//! tile it was computed in.

use std::arch::x86_64::*;

use crate::backend::cpu::tile::{Activations, TileOut};

/// Bytes of one Q8_K block: f32 scale at 0, 256 values at 4, 16 i16 sums at 260.
const ACT_BLOCK: usize = 292;

/// A format's two steps. Their bodies are `#[inline(always)]` with no target features of their
/// own: they inline into [`run`], which has AVX2's, and so do the intrinsics they call.
pub(super) trait SuperBlocks {
    /// Bytes of one weight super-block.
    const BYTES: usize;
    /// What a row's sum is multiplied by at the end (the grids' fixed-point scale).
    const FACTOR: f32 = 1.0;
    type Unpacked;
    /// The super-block at `p`, unpacked.
    unsafe fn unpack(p: *const u8) -> Self::Unpacked;
    /// Add the dot product of `x` with the Q8_K block at `y` to `sum`, as the oracle does.
    unsafe fn meet(x: &Self::Unpacked, y: *const u8, sum: &mut f32);
}

/// The i32 sum of the eight lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum_epi32(v: __m256i) -> i32 {
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

/// The f32 scale of the Q8_K block at `y`.
#[inline(always)]
pub(super) unsafe fn act_scale(y: *const u8) -> f32 {
    std::ptr::read_unaligned(y as *const f32)
}

/// The 32 activation bytes of group `g` (values `32g..32g + 32`) of the Q8_K block at `y`.
#[inline(always)]
pub(super) unsafe fn act_group(y: *const u8, g: usize) -> __m256i {
    _mm256_loadu_si256(y.add(4 + 32 * g) as *const __m256i)
}

/// All outputs of `out`: its weight rows (`k` values each, file layout) times the prepared
/// Q8_K activation rows. The caller checked the lengths. Each weight super-block is unpacked
/// once and met by every activation row (a prefill batch's rows share the unpacking), each
/// output summing over the super-blocks in order whatever the batch.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn run<F: SuperBlocks>(k: usize, weights: &[u8], act: &Activations, out: &mut TileOut<'_>) {
    let nb = k / 256;
    // sum: [rows] the current weight row's outputs.
    let mut sum = vec![0f32; act.rows];
    for w in 0..out.nw() {
        sum.fill(0.0);
        let row = weights.as_ptr().add(w * nb * F::BYTES);
        for b in 0..nb {
            let x = F::unpack(row.add(b * F::BYTES));
            for (r, s) in sum.iter_mut().enumerate() {
                F::meet(&x, act.bytes.as_ptr().add((r * nb + b) * ACT_BLOCK), s);
            }
        }
        for (r, &s) in sum.iter().enumerate() {
            out.set(r, w, F::FACTOR * s);
        }
    }
}
