//! The ternary formats (TQ1_0, TQ2_0) in the file layout against Q8_K activations.
//!
//! A weight super-block is unpacked once per row (its 256 codes 0..3 as eight vectors of 32
//! bytes, value `32g + l` in byte `l` of vector `g`) and then meets each activation row: per 32
//! values one `maddubs` for the codes and one for the ones each value takes off its code (its
//! value is the code less 1), summed in i32 lanes, so the super-block's `Σ q·q8` is exact. Then
//! `isum·(d_w·d_a)` in f32, in the oracle's order ([`crate::quant::vec_dot`]), so results are
//! the oracle's to the bit.

use std::arch::x86_64::*;

use super::lanes::load_f16;
use super::superblocks::{act_group, act_scale, hsum_epi32, run, SuperBlocks};
use crate::backend::cpu::tile::{Activations, TileOut};
use crate::quant::ternary::{tq1_trits, BlockTq1_0};
use crate::quant::GgmlType;

const TQ1_0: u8 = 0;
const TQ2_0: u8 = 1;

const fn block_bytes(kind: u8) -> usize {
    match kind {
        TQ1_0 => 54,
        _ => 66,
    }
}

/// A weight super-block, unpacked: the codes, value `32g + l` in byte `l` of `q[g]`.
struct Unpacked {
    q: [__m256i; 8],
    d: f32,
}

/// The kernels of format `K`.
struct Ternary<const K: u8>;

impl<const K: u8> SuperBlocks for Ternary<K> {
    const BYTES: usize = block_bytes(K);
    type Unpacked = Unpacked;

    #[inline(always)]
    unsafe fn unpack(p: *const u8) -> Unpacked {
        let mut q = [_mm256_setzero_si256(); 8];
        if K == TQ1_0 {
            // The oracle's decoding (quant::ternary), once per super-block and row.
            let block = bytemuck::pod_read_unaligned::<BlockTq1_0>(std::slice::from_raw_parts(p, 54));
            let t = tq1_trits(&block).map(|t| t as u8);
            for (g, v) in q.iter_mut().enumerate() {
                *v = _mm256_loadu_si256(t.as_ptr().add(32 * g) as *const __m256i);
            }
        } else {
            let three = _mm256_set1_epi8(3);
            for n in 0..2 {
                let v = _mm256_loadu_si256(p.add(32 * n) as *const __m256i);
                for j in 0..4 {
                    // Shifting 16-bit lanes moves each byte's bits 2j..2j+2 to its bottom: both
                    // bytes'.
                    q[4 * n + j] = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * j as i32)), three);
                }
            }
        }
        Unpacked {
            q,
            d: load_f16(p.add(block_bytes(K) - 2)),
        }
    }

    #[inline(always)]
    unsafe fn meet(x: &Unpacked, y: *const u8, s: &mut f32) {
        let one = _mm256_set1_epi8(1);
        let mut acc = _mm256_setzero_si256();
        for g in 0..8 {
            let q8 = act_group(y, g);
            let p = _mm256_sub_epi16(_mm256_maddubs_epi16(x.q[g], q8), _mm256_maddubs_epi16(one, q8));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
        }
        *s += hsum_epi32(acc) as f32 * (x.d * act_scale(y));
    }
}

/// See [`super::tile`]; lengths were checked there.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn tile(ty: GgmlType, k: usize, weights: &[u8], act: &Activations, out: &mut TileOut<'_>) -> bool {
    match ty {
        GgmlType::TQ1_0 => run::<Ternary<TQ1_0>>(k, weights, act, out),
        GgmlType::TQ2_0 => run::<Ternary<TQ2_0>>(k, weights, act, out),
        _ => return false,
    }
    true
}
