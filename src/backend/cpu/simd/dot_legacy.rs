//! The 32-value formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL) against Q8_0 activations.
//!
//! Per block pair: 32 weight bytes meet 32 activation bytes in `maddubs` (unsigned × signed
//! pairs summed to i16) and `madd` (to eight i32), converted once and scaled by `d_w · d_a`
//! into an 8-lane f32 accumulator. Signed weights (Q8_0, IQ4_NL) use the sign trick
//! `|w| · (a · sign w)`. Unsigned weights (the 4/5-bit formats) go in as they are: Q4_0/Q5_0
//! add the activation block's precomputed `offset · Σq_a` (-8 or -16 times the sum) to the
//! integer lanes, which makes the sum exactly the oracle's; the `_1` formats add
//! `m · (d_a · Σq_a)` in f32 as the oracle does.

use std::arch::x86_64::*;

use super::super::kernels::Activations;
use super::{for_tiles, hsum_ps, load_f16};
use crate::quant::GgmlType;

const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q5_0: u8 = 2;
const Q5_1: u8 = 3;
const Q8_0: u8 = 4;
const IQ4_NL: u8 = 5;

/// Bytes of one activation block (Q8_0: f16 scale + 32 values).
const ACT_BLOCK: usize = 34;
/// Weight rows and activation rows per register tile.
const R: usize = 4;
const C: usize = 2;

/// ggml's non-linear 4-bit levels of IQ4_NL/IQ4_XS (`kvalues_iq4nl`).
pub(super) const KVALUES_IQ4NL: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

const fn block_bytes(kind: u8) -> usize {
    match kind {
        Q4_0 | IQ4_NL => 18,
        Q4_1 => 20,
        Q5_0 => 22,
        Q5_1 => 24,
        _ => 34,
    }
}

const fn signed(kind: u8) -> bool {
    matches!(kind, Q8_0 | IQ4_NL)
}

const fn has_offset(kind: u8) -> bool {
    matches!(kind, Q4_0 | Q5_0)
}

const fn has_min(kind: u8) -> bool {
    matches!(kind, Q4_1 | Q5_1)
}

/// One unpacked weight block.
#[derive(Clone, Copy)]
struct Unpacked {
    /// Unsigned left operand of `maddubs`: the values, or their magnitudes for signed formats.
    u: __m256i,
    /// The signed values (signed formats only).
    s: __m256i,
    d: f32,
    /// The added minimum of the `_1` formats.
    m: f32,
}

/// 16 bytes of nibbles as 32 values: low nibbles are values 0..16, high nibbles 16..32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn nibbles(p: *const u8) -> __m256i {
    let x = _mm_loadu_si128(p as *const __m128i);
    _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(x, 4), x), _mm256_set1_epi8(0x0F))
}

/// The fifth bits of Q5_0/Q5_1: 0x10 in byte `i` where bit `i` of the little-endian u32 is set.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn high_bits(p: *const u8) -> __m256i {
    let h = std::ptr::read_unaligned(p as *const u32);
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(h as i32),
        _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
        ),
    );
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack<const K: u8>(p: *const u8) -> Unpacked {
    let d = load_f16(p);
    let zero = _mm256_setzero_si256();
    match K {
        Q4_0 => Unpacked {
            u: nibbles(p.add(2)),
            s: zero,
            d,
            m: 0.0,
        },
        Q4_1 => Unpacked {
            u: nibbles(p.add(4)),
            s: zero,
            d,
            m: load_f16(p.add(2)),
        },
        Q5_0 => Unpacked {
            u: _mm256_or_si256(nibbles(p.add(6)), high_bits(p.add(2))),
            s: zero,
            d,
            m: 0.0,
        },
        Q5_1 => Unpacked {
            u: _mm256_or_si256(nibbles(p.add(8)), high_bits(p.add(4))),
            s: zero,
            d,
            m: load_f16(p.add(2)),
        },
        Q8_0 => {
            let s = _mm256_loadu_si256(p.add(2) as *const __m256i);
            Unpacked {
                u: _mm256_sign_epi8(s, s),
                s,
                d,
                m: 0.0,
            }
        }
        _ => {
            let lut = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i));
            let s = _mm256_shuffle_epi8(lut, nibbles(p.add(2)));
            Unpacked {
                u: _mm256_sign_epi8(s, s),
                s,
                d,
                m: 0.0,
            }
        }
    }
}

/// Outputs `(w0..w0+RR) × (a0..a0+CC)` into `out[w * rows + a]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kernel<const K: u8, const RR: usize, const CC: usize>(
    nb: usize,
    weights: &[u8],
    act: &Activations,
    w0: usize,
    a0: usize,
    out: &mut [f32],
) {
    let wb = block_bytes(K);
    let rb = nb * wb;
    let w = weights.as_ptr().add(w0 * rb);
    let a = act.bytes.as_ptr().add(a0 * act.row_bytes);
    let da = act.scales.as_ptr().add(a0 * nb);
    // Only the vector a format reads is filled (`q8::prepare` made it for this type).
    let sa = act.dsums.as_ptr().wrapping_add(a0 * nb);
    let oa = act.offsets.as_ptr().wrapping_add(a0 * nb);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); CC]; RR];
    let mut macc = [[0f32; CC]; RR];
    for b in 0..nb {
        for r in 0..RR {
            // Decode streams each weight once from memory: ask for the same place in the next
            // tile of rows (the rows of a tile are contiguous), so enough lines are in flight.
            _mm_prefetch::<_MM_HINT_T0>(w.wrapping_add((2 * RR + r) * rb + b * wb) as *const i8);
            let x = unpack::<K>(w.add(r * rb + b * wb));
            for c in 0..CC {
                let y = _mm256_loadu_si256(a.add(c * act.row_bytes + b * ACT_BLOCK + 2) as *const __m256i);
                let dy = *da.add(c * nb + b);
                let y = if signed(K) { _mm256_sign_epi8(y, x.s) } else { y };
                let mut p = _mm256_madd_epi16(_mm256_maddubs_epi16(x.u, y), ones);
                if has_offset(K) {
                    let o = _mm_cvtsi32_si128(*oa.add(c * nb + b));
                    p = _mm256_add_epi32(p, _mm256_zextsi128_si256(o));
                }
                acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(x.d * dy), acc[r][c]);
                if has_min(K) {
                    macc[r][c] += x.m * *sa.add(c * nb + b);
                }
            }
        }
    }
    let rows = act.rows;
    for r in 0..RR {
        for c in 0..CC {
            out[(w0 + r) * rows + a0 + c] = hsum_ps(acc[r][c]) + macc[r][c];
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run<const K: u8>(k: usize, weights: &[u8], act: &Activations, out: &mut [f32]) {
    let nb = k / 32;
    let nw = weights.len() / (nb * block_bytes(K));
    for_tiles::<R, C>(nw, act.rows, |w0, a0, r, c| match (r, c) {
        (R, C) => kernel::<K, R, C>(nb, weights, act, w0, a0, out),
        (R, _) => kernel::<K, R, 1>(nb, weights, act, w0, a0, out),
        (_, C) => kernel::<K, 1, C>(nb, weights, act, w0, a0, out),
        _ => kernel::<K, 1, 1>(nb, weights, act, w0, a0, out),
    });
}

/// See [`super::tile`]; lengths were checked there.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn tile(ty: GgmlType, k: usize, weights: &[u8], act: &Activations, out: &mut [f32]) -> bool {
    match ty {
        GgmlType::Q4_0 => run::<Q4_0>(k, weights, act, out),
        GgmlType::Q4_1 => run::<Q4_1>(k, weights, act, out),
        GgmlType::Q5_0 => run::<Q5_0>(k, weights, act, out),
        GgmlType::Q5_1 => run::<Q5_1>(k, weights, act, out),
        GgmlType::Q8_0 => run::<Q8_0>(k, weights, act, out),
        GgmlType::IQ4_NL => run::<IQ4_NL>(k, weights, act, out),
        _ => return false,
    }
    true
}
