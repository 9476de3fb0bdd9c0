//! The 2- and 3-bit K-quants (Q2_K, Q3_K), the experts' formats of the low-bit "dynamic"
//! quantizations of MoE checkpoints, and the ternary formats (TQ1_0, TQ2_0), in the file layout
//! against Q8_K activations.
//!
//! A weight super-block is unpacked once per row (its 256 small unsigned codes as eight vectors
//! of 32 bytes, value `32g + l` in byte `l` of vector `g`; what each value takes off its code:
//! Q3_K's 4 where its high bit is clear, the ternary formats' 1; the sixteen sub-block scales
//! as i16 pairs, 1 for the ternary formats) and then meets each activation row: per 32 values
//! one `maddubs` for the codes (and one for the offsets), one `madd` with the two sub-blocks'
//! scales, summed in i32 lanes, so the super-block's `Σ sc·Σ q·q8` is exact. Q2_K's minimum
//! comes from the activations' 16-value sums in one `madd`. Then `(d_w·d_a)·isum` (and
//! `-(dmin_w·d_a)·msum`) in f32, in the oracle's order ([`crate::quant::vec_dot`]), so results
//! are the oracle's to the bit.

use std::arch::x86_64::*;

use super::lanes::load_f16;
use super::superblocks::{act_group, act_scale, hsum_epi32, run, SuperBlocks, ACT_BSUMS};
use crate::backend::cpu::tile::{Activations, TileOut};
use crate::quant::ternary::{tq1_trits, BlockTq1_0};
use crate::quant::GgmlType;

const Q2_K: u8 = 0;
const Q3_K: u8 = 1;
const TQ1_0: u8 = 2;
const TQ2_0: u8 = 3;

const fn block_bytes(kind: u8) -> usize {
    match kind {
        Q2_K => 84,
        Q3_K => 110,
        TQ1_0 => 54,
        _ => 66,
    }
}

/// A weight super-block, unpacked.
struct Unpacked {
    /// The 2-bit fields, value `32g + l` in byte `l` of `q[g]`.
    q: [__m256i; 8],
    /// What each value takes off its code: Q3_K 4 where its high bit is clear, else 0; the
    /// ternary formats 1; Q2_K nothing (unused).
    minus: [__m256i; 8],
    /// Sub-block scales as i16: lanes 0..8 the scale of sub-block `2g`, lanes 8..16 of `2g + 1`.
    scales: [__m256i; 8],
    /// Q2_K: the sixteen sub-block minimums as i16.
    mins: __m256i,
    d: f32,
    dmin: f32,
}

/// The kernels of format `K`.
struct LowK<const K: u8>;

impl<const K: u8> SuperBlocks for LowK<K> {
    const BYTES: usize = block_bytes(K);
    type Unpacked = Unpacked;

    #[inline(always)]
    unsafe fn unpack(p: *const u8) -> Unpacked {
        let three = _mm256_set1_epi8(3);
        let one = _mm256_set1_epi8(1);
        if K == TQ1_0 || K == TQ2_0 {
            let mut q = [_mm256_setzero_si256(); 8];
            if K == TQ1_0 {
                // The oracle's decoding (quant::ternary), once per super-block and row.
                let block = bytemuck::pod_read_unaligned::<BlockTq1_0>(std::slice::from_raw_parts(p, 54));
                let t = tq1_trits(&block).map(|t| t as u8);
                for (g, v) in q.iter_mut().enumerate() {
                    *v = _mm256_loadu_si256(t.as_ptr().add(32 * g) as *const __m256i);
                }
            } else {
                for n in 0..2 {
                    let v = _mm256_loadu_si256(p.add(32 * n) as *const __m256i);
                    for j in 0..4 {
                        q[4 * n + j] = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * j as i32)), three);
                    }
                }
            }
            return Unpacked {
                q,
                minus: [one; 8],
                scales: [_mm256_set1_epi16(1); 8],
                mins: _mm256_setzero_si256(),
                d: load_f16(p.add(block_bytes(K) - 2)),
                dmin: 0.0,
            };
        }
        let qs = p.add(if K == Q2_K { 16 } else { 32 });
        let mut q = [_mm256_setzero_si256(); 8];
        for n in 0..2 {
            let v = _mm256_loadu_si256(qs.add(32 * n) as *const __m256i);
            for j in 0..4 {
                // Shifting 16-bit lanes moves each byte's bits 2j..2j+2 to its bottom: both bytes'.
                q[4 * n + j] = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * j as i32)), three);
            }
        }
        let mut sc = [0i16; 16];
        let mut minus = [_mm256_setzero_si256(); 8];
        let (d, dmin, mins);
        if K == Q2_K {
            let mut m = [0i16; 16];
            for (j, (s, m)) in sc.iter_mut().zip(&mut m).enumerate() {
                let b = *p.add(j);
                (*s, *m) = (i16::from(b & 0xf), i16::from(b >> 4));
            }
            mins = _mm256_loadu_si256(m.as_ptr() as *const __m256i);
            (d, dmin) = (load_f16(p.add(80)), load_f16(p.add(82)));
        } else {
            let s = std::slice::from_raw_parts(p.add(96), 12);
            for (j, v) in sc.iter_mut().enumerate() {
                let low = (s[j % 8] >> (4 * (j / 8))) & 0xf;
                let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
                *v = i16::from(low | (high << 4)) - 32;
            }
            let h = _mm256_loadu_si256(p as *const __m256i);
            for (g, m) in minus.iter_mut().enumerate() {
                let bit = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(g as i32)), one);
                *m = _mm256_slli_epi16(_mm256_xor_si256(bit, one), 2);
            }
            mins = _mm256_setzero_si256();
            (d, dmin) = (load_f16(p.add(108)), 0.0);
        }
        let scales =
            std::array::from_fn(|g| _mm256_set_m128i(_mm_set1_epi16(sc[2 * g + 1]), _mm_set1_epi16(sc[2 * g])));
        Unpacked {
            q,
            minus,
            scales,
            mins,
            d,
            dmin,
        }
    }

    #[inline(always)]
    unsafe fn meet(x: &Unpacked, y: *const u8, s: &mut f32) {
        let mut acc = _mm256_setzero_si256();
        for g in 0..8 {
            let q8 = act_group(y, g);
            let mut p = _mm256_maddubs_epi16(x.q[g], q8);
            if K != Q2_K {
                p = _mm256_sub_epi16(p, _mm256_maddubs_epi16(x.minus[g], q8));
            }
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, x.scales[g]));
        }
        let yd = act_scale(y);
        if K == TQ1_0 || K == TQ2_0 {
            *s += hsum_epi32(acc) as f32 * (x.d * yd);
            return;
        }
        *s += x.d * yd * hsum_epi32(acc) as f32;
        if K == Q2_K {
            let bsums = _mm256_loadu_si256(y.add(ACT_BSUMS) as *const __m256i);
            *s -= x.dmin * yd * hsum_epi32(_mm256_madd_epi16(bsums, x.mins)) as f32;
        }
    }
}

/// See [`super::tile`]; lengths were checked there.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn tile(ty: GgmlType, k: usize, weights: &[u8], act: &Activations, out: &mut TileOut<'_>) -> bool {
    match ty {
        GgmlType::Q2_K => run::<LowK<Q2_K>>(k, weights, act, out),
        GgmlType::Q3_K => run::<LowK<Q3_K>>(k, weights, act, out),
        GgmlType::TQ1_0 => run::<LowK<TQ1_0>>(k, weights, act, out),
        GgmlType::TQ2_0 => run::<LowK<TQ2_0>>(k, weights, act, out),
        _ => return false,
    }
    true
}
