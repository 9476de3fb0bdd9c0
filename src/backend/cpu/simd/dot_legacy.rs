//! The 32-value formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL) against Q8_0 activations.
//!
//! Per block pair: 32 weight bytes meet 32 activation bytes in `maddubs` (unsigned × signed
//! pairs summed to i16) and `madd` (to eight i32), converted once and scaled by `d_w · d_a`
//! into an 8-lane f32 accumulator. Signed weights (Q8_0, IQ4_NL) use the sign trick
//! `|w| · (a · sign w)`. Unsigned weights (the 4/5-bit formats) go in as they are: Q4_0/Q5_0
//! add the activation block's precomputed `offset · Σq_a` (-8 or -16 times the sum) to the
//! integer lanes, which makes the sum exactly the oracle's; the `_1` formats add
//! `m · (d_a · Σq_a)` in f32 as the oracle does.
//!
//! A block's integer sum for eight weight rows lands in one vector, a lane per row, so its
//! conversion and scaling (`d_w · d_a` as eight lanes) happen once per eight outputs: [`direct`]
//! sums each row's lanes across (decode), [`gemm`] works from a repacked tile (batches).

use std::arch::x86_64::*;

use super::super::kernels::Activations;
use super::{load_f16, store_lanes, transpose_sum, LANE_ROWS as R};
use crate::quant::GgmlType;

const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q5_0: u8 = 2;
const Q5_1: u8 = 3;
const Q8_0: u8 = 4;
const IQ4_NL: u8 = 5;

/// Bytes of one activation block (Q8_0: f16 scale + 32 values).
const ACT_BLOCK: usize = 34;

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

/// A tile of [`R`] weight rows unpacked and interleaved for the batched path: for block `b` and
/// group `g` of four values, `u[(8b + g) * R + i]` holds values `4g..4g + 4` of row `i` as four
/// bytes (the `maddubs` operand of [`unpack`]), `s` likewise the signed values (signed formats
/// only), and `d[R * b + i]`, `m[R * b + i]` the scale and minimum. Rows past the end of the
/// tile are zero.
struct Packed {
    u: Vec<u32>,
    s: Vec<u32>,
    d: Vec<f32>,
    m: Vec<f32>,
}

impl Packed {
    fn new(nb: usize, kind: u8) -> Self {
        Packed {
            u: vec![0; nb * 8 * R],
            s: vec![0; if signed(kind) { nb * 8 * R } else { 0 }],
            d: vec![0.0; nb * R],
            m: vec![0.0; nb * R],
        }
    }
}

/// Unpack rows `0..nr` of `w` (rows of `nb` blocks) into `p`, zeroing rows `nr..R`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn repack<const K: u8>(w: &[u8], nr: usize, nb: usize, p: &mut Packed) {
    let wb = block_bytes(K);
    let rb = nb * wb;
    let mut lanes = [0u32; 8];
    for i in 0..R {
        for b in 0..nb {
            let x = if i < nr {
                unpack::<K>(w.as_ptr().add(i * rb + b * wb))
            } else {
                let z = _mm256_setzero_si256();
                Unpacked {
                    u: z,
                    s: z,
                    d: 0.0,
                    m: 0.0,
                }
            };
            _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, x.u);
            for g in 0..8 {
                p.u[(8 * b + g) * R + i] = lanes[g];
            }
            if signed(K) {
                _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, x.s);
                for g in 0..8 {
                    p.s[(8 * b + g) * R + i] = lanes[g];
                }
            }
            p.d[R * b + i] = x.d;
            p.m[R * b + i] = x.m;
        }
    }
}

/// The batched path: outputs `(w0..w0+nr) × (a0..a0+CC)` from a repacked tile. Lane `i` of an
/// accumulator is weight row `i`: each group of four activation bytes is broadcast and meets
/// four values of all eight rows in one `maddubs`. Per output and block the arithmetic is that
/// of [`direct`]: the exact integer sum (plus the offset term), converted once, times
/// `d_w · d_a`, fused into the f32 accumulator; the `_1` formats add `m · (d_a · Σq_a)` to a
/// second one.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gemm<const K: u8, const CC: usize>(
    nb: usize,
    p: &Packed,
    act: &Activations,
    w0: usize,
    nr: usize,
    a0: usize,
    out: &mut [f32],
) {
    let ones = _mm256_set1_epi16(1);
    let a = act.bytes.as_ptr().add(a0 * act.row_bytes + 2);
    let da = act.scales.as_ptr().add(a0 * nb);
    let sa = act.dsums.as_ptr().wrapping_add(a0 * nb);
    let oa = act.offsets.as_ptr().wrapping_add(a0 * nb);
    let (pu, ps) = (p.u.as_ptr(), p.s.as_ptr());
    let mut acc = [_mm256_setzero_ps(); CC];
    let mut macc = [_mm256_setzero_ps(); CC];
    for b in 0..nb {
        let mut isum = [_mm256_setzero_si256(); CC];
        // Values 4g..4g+4 of activation row c, in every lane (a macro: closures would not
        // inherit the target features).
        macro_rules! y {
            ($c:expr, $g:expr) => {
                _mm256_set1_epi32(std::ptr::read_unaligned(
                    a.add($c * act.row_bytes + b * ACT_BLOCK + 4 * $g) as *const i32,
                ))
            };
        }
        if signed(K) {
            // |w| · |a| can reach 2 · 127 · 127 per i16 lane: widen every product pair.
            for g in 0..8 {
                let u = _mm256_loadu_si256(pu.add((8 * b + g) * R) as *const __m256i);
                let s = _mm256_loadu_si256(ps.add((8 * b + g) * R) as *const __m256i);
                for c in 0..CC {
                    let prod = _mm256_maddubs_epi16(u, _mm256_sign_epi8(y!(c, g), s));
                    isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(prod, ones));
                }
            }
        } else {
            // Unsigned values below 32: four i16 pair sums stay below 4 · 2 · 31 · 128 < 2^15.
            for half in 0..2 {
                let mut h = [_mm256_setzero_si256(); CC];
                for g in 4 * half..4 * half + 4 {
                    let u = _mm256_loadu_si256(pu.add((8 * b + g) * R) as *const __m256i);
                    for c in 0..CC {
                        h[c] = _mm256_add_epi16(h[c], _mm256_maddubs_epi16(u, y!(c, g)));
                    }
                }
                for c in 0..CC {
                    isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(h[c], ones));
                }
            }
        }
        let d = _mm256_loadu_ps(p.d.as_ptr().add(R * b));
        for c in 0..CC {
            if has_offset(K) {
                isum[c] = _mm256_add_epi32(isum[c], _mm256_set1_epi32(*oa.add(c * nb + b)));
            }
            let scale = _mm256_mul_ps(d, _mm256_set1_ps(*da.add(c * nb + b)));
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[c]), scale, acc[c]);
            if has_min(K) {
                let m = _mm256_loadu_ps(p.m.as_ptr().add(R * b));
                macc[c] = _mm256_add_ps(macc[c], _mm256_mul_ps(m, _mm256_set1_ps(*sa.add(c * nb + b))));
            }
        }
    }
    for c in 0..CC {
        let v = if has_min(K) {
            _mm256_add_ps(acc[c], macc[c])
        } else {
            acc[c]
        };
        store_lanes(v, nr, w0, a0 + c, act.rows, out);
    }
}

/// The path for few activation rows (decode): weight rows `w0..w0+nr` (`nr` ≤ [`R`], read from
/// `w`) times activation row `a`, straight from the file layout. Each row's block product is
/// computed in eight lanes as usual, then the eight rows are summed across lanes into one
/// vector with a lane per row, and from there the arithmetic is [`gemm`]'s.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn direct<const K: u8>(nb: usize, w: &[u8], nr: usize, act: &Activations, w0: usize, a: usize, out: &mut [f32]) {
    let wb = block_bytes(K);
    let rb = nb * wb;
    let wp = w.as_ptr();
    let y_row = act.bytes.as_ptr().add(a * act.row_bytes + 2);
    let da = act.scales.as_ptr().add(a * nb);
    let sa = act.dsums.as_ptr().wrapping_add(a * nb);
    let oa = act.offsets.as_ptr().wrapping_add(a * nb);
    let ones = _mm256_set1_epi16(1);
    let mut acc = _mm256_setzero_ps();
    let mut macc = _mm256_setzero_ps();
    for b in 0..nb {
        let y = _mm256_loadu_si256(y_row.add(b * ACT_BLOCK) as *const __m256i);
        let mut p = [_mm256_setzero_si256(); R];
        let mut d = [0f32; R];
        let mut m = [0f32; R];
        for r in 0..R {
            if r < nr {
                // Decode streams each weight once from memory: ask for the same block of the
                // next tile of rows, so enough lines are in flight.
                _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add((R + r) * rb + b * wb) as *const i8);
                let x = unpack::<K>(wp.add(r * rb + b * wb));
                let yy = if signed(K) { _mm256_sign_epi8(y, x.s) } else { y };
                p[r] = _mm256_madd_epi16(_mm256_maddubs_epi16(x.u, yy), ones);
                d[r] = x.d;
                m[r] = x.m;
            }
        }
        let mut isum = transpose_sum(&p);
        if has_offset(K) {
            isum = _mm256_add_epi32(isum, _mm256_set1_epi32(*oa.add(b)));
        }
        let scale = _mm256_mul_ps(_mm256_loadu_ps(d.as_ptr()), _mm256_set1_ps(*da.add(b)));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, acc);
        if has_min(K) {
            macc = _mm256_add_ps(
                macc,
                _mm256_mul_ps(_mm256_loadu_ps(m.as_ptr()), _mm256_set1_ps(*sa.add(b))),
            );
        }
    }
    let v = if has_min(K) { _mm256_add_ps(acc, macc) } else { acc };
    store_lanes(v, nr, w0, a, act.rows, out);
}

lane_driver!();

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run<const K: u8>(k: usize, weights: &[u8], act: &Activations, out: &mut [f32]) {
    let nb = k / 32;
    run_lanes::<K>(nb, weights.len() / (nb * block_bytes(K)), weights, act, out);
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
