//! Q5_K, a 256-value format that stays in the file layout (Q4_K and Q6_K are interleaved at
//! load, see `dot_ktile`; IQ4_XS goes through the super-block driver, see `dot_iq4xs`), against
//! Q8_K activations.
//!
//! Per super-block pair, all integer: each 32 values go through `maddubs`, then `madd` with the
//! sub-block scale into eight i32 lanes. The minimum comes from the activations' 16-value sums
//! (`bsums`) in one `madd`. The super-block total is converted once and scaled by
//! `d_w · d_a` (and `dmin_w · d_a` for the minimum), as ggml's `vec_dot_q*_K_q8_K`.

use std::arch::x86_64::*;

use super::lanes::{for_tiles, hsum_ps, load_f16};
use crate::backend::cpu::tile::{Activations, TileOut};
use crate::quant::GgmlType;

use super::q8::Q8K_BLOCK as ACT_BLOCK;
const R: usize = 4;
const C: usize = 3;

/// Bytes of a Q5_K block.
const BLOCK: usize = 176;

/// `shuffle_epi8` masks putting byte `s` of a 16-byte table into every i16 lane, zero-extended
/// (`[s, 0x80]` repeated; 0x80 selects zero).
const fn zext_masks() -> [[i8; 32]; 16] {
    let mut m = [[0i8; 32]; 16];
    let mut s = 0;
    while s < 16 {
        let mut i = 0;
        while i < 16 {
            m[s][2 * i] = s as i8;
            m[s][2 * i + 1] = -128;
            i += 1;
        }
        s += 1;
    }
    m
}
static ZEXT: [[i8; 32]; 16] = zext_masks();

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mask(m: &[i8; 32]) -> __m256i {
    _mm256_loadu_si256(m.as_ptr() as *const __m256i)
}

/// What a weight super-block contributes before meeting any activation row.
#[derive(Clone, Copy)]
struct Header {
    d: f32,
    dmin: f32,
    /// Bytes 0..8 scales, 8..16 mins, in both lanes.
    scales: __m256i,
    /// The mins as i16, each twice (one per 16-value `bsums` entry).
    per16: __m256i,
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn header(p: *const u8) -> Header {
    // Eight 6-bit scales and mins (see `quant::kquant::scale_min_k4`): the first four of each
    // are the low 6 bits of bytes 0..4 / 4..8; the last four take 4 bits from bytes 8..12 and
    // their top 2 bits from the spare top bits of bytes 0..8.
    let u0 = std::ptr::read_unaligned(p.add(4) as *const u32);
    let u1 = std::ptr::read_unaligned(p.add(8) as *const u32);
    let u2 = std::ptr::read_unaligned(p.add(12) as *const u32);
    let sc_lo = u0 & 0x3f3f_3f3f;
    let m_lo = u1 & 0x3f3f_3f3f;
    let sc_hi = (u2 & 0x0f0f_0f0f) | (((u0 >> 6) & 0x0303_0303) << 4);
    let m_hi = ((u2 >> 4) & 0x0f0f_0f0f) | (((u1 >> 6) & 0x0303_0303) << 4);
    let v = _mm_setr_epi32(sc_lo as i32, sc_hi as i32, m_lo as i32, m_hi as i32);
    let mins = _mm_srli_si128(v, 8);
    Header {
        d: load_f16(p),
        dmin: load_f16(p.add(2)),
        scales: _mm256_broadcastsi128_si256(v),
        per16: _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mins, mins)),
    }
}

/// The weighted integer sums of one weight super-block with the super-blocks of `CC`
/// activation rows (`q8[c]`: the values, then the 16 sums): `(Σ sc·Σq·q8, Σ m·bsum)` in i32
/// lanes per row. The weights are unpacked once for all rows; each row's sum goes through the
/// same operations whatever `CC`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn body<const CC: usize>(p: *const u8, h: &Header, q8: [*const u8; CC]) -> ([__m256i; CC], [__m256i; CC]) {
    // Closures would not inherit the target features; a macro keeps the loads inline.
    macro_rules! ld {
        ($c:expr, $o:expr) => {
            _mm256_loadu_si256(q8[$c].add($o) as *const __m256i)
        };
    }
    let low4 = _mm256_set1_epi8(0x0F);
    let mut isum = [_mm256_setzero_si256(); CC];
    let mut msum = [_mm256_setzero_si256(); CC];
    let qs = p.add(48);
    let mut qh = _mm256_loadu_si256(p.add(16) as *const __m256i);
    for j in 0..4 {
        let q = _mm256_loadu_si256(qs.add(32 * j) as *const __m256i);
        // Bit 2j of qh[l] is the fifth bit of value 64j + l, bit 2j + 1 of 64j + 32 + l.
        let one = _mm256_set1_epi8(1);
        let lo = _mm256_or_si256(
            _mm256_and_si256(q, low4),
            _mm256_slli_epi16(_mm256_and_si256(qh, one), 4),
        );
        let hi = _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16(q, 4), low4),
            _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_add_epi8(one, one)), 3),
        );
        qh = _mm256_srli_epi16(qh, 2);
        let s0 = _mm256_shuffle_epi8(h.scales, mask(&ZEXT[2 * j]));
        let s1 = _mm256_shuffle_epi8(h.scales, mask(&ZEXT[2 * j + 1]));
        for c in 0..CC {
            let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, ld!(c, 64 * j)), s0);
            let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, ld!(c, 64 * j + 32)), s1);
            isum[c] = _mm256_add_epi32(isum[c], _mm256_add_epi32(p0, p1));
        }
    }
    for c in 0..CC {
        msum[c] = _mm256_madd_epi16(h.per16, ld!(c, 256));
    }
    (isum, msum)
}

/// Outputs `(w0..w0+RR) × (a0..a0+CC)` of `out`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kernel<const RR: usize, const CC: usize>(
    nb: usize,
    weights: &[u8],
    act: &Activations,
    w0: usize,
    a0: usize,
    out: &mut TileOut<'_>,
) {
    let wb = BLOCK;
    let rb = nb * wb;
    let w = weights.as_ptr().add(w0 * rb);
    let a = act.bytes.as_ptr().add(a0 * act.row_bytes);
    let mut acc = [[_mm256_setzero_ps(); CC]; RR];
    for b in 0..nb {
        for r in 0..RR {
            let p = w.add(r * rb + b * wb);
            // As in `dot_legacy`: fetch the same super-block of the next tile of rows. Unlike
            // the interleaved tiles' (`dot_legacy::prefetch_pays`), this one pays on the AMD EPYC
            // (Zen 4) too, where a tile reads four file rows as four streams: without it, a
            // qwen35-24l in Q5_K_M decoded 52.6 → 34.1 tok/s and a qwen3moe-2l in IQ4_XS (then
            // read here) 191 → 100 (medians of five alternations, 2 threads).
            super::lanes::prefetch_lines::<_MM_HINT_T0>(w.wrapping_add((RR + r) * rb + b * wb), wb);
            let h = header(p);
            for c in 0..CC {
                let y = a.add(c * act.row_bytes + b * ACT_BLOCK);
                let dy = std::ptr::read_unaligned(y as *const f32);
                let ([isum], [msum]) = body::<1>(p, &h, [y.add(4)]);
                let v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(h.d * dy), acc[r][c]);
                acc[r][c] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_set1_ps(h.dmin * dy), v);
            }
        }
    }
    for r in 0..RR {
        for c in 0..CC {
            out.set(a0 + c, w0 + r, hsum_ps(acc[r][c]));
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run(k: usize, weights: &[u8], act: &Activations, out: &mut TileOut<'_>) {
    let nb = k / 256;
    let nw = weights.len() / (nb * BLOCK);
    for_tiles::<R, C>(nw, act.rows, |w0, a0, r, c| match (r, c) {
        (R, C) => kernel::<R, C>(nb, weights, act, w0, a0, out),
        (R, _) => kernel::<R, 1>(nb, weights, act, w0, a0, out),
        (_, C) => kernel::<1, C>(nb, weights, act, w0, a0, out),
        _ => kernel::<1, 1>(nb, weights, act, w0, a0, out),
    });
}

/// See [`super::tile`]; lengths were checked there.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn tile(ty: GgmlType, k: usize, weights: &[u8], act: &Activations, out: &mut TileOut<'_>) -> bool {
    if ty != GgmlType::Q5_K {
        return false;
    }
    run(k, weights, act, out);
    true
}
