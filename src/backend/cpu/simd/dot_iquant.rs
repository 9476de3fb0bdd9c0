//! The grid formats whose groups of 32 carry one packed sign-and-scale word (IQ2_XXS, IQ3_XXS),
//! in the file layout against Q8_K activations.
//!
//! Per 32 values: the grid entries their indices name are gathered into 32 unsigned magnitude
//! bytes, the four 7-bit sign fields expand (through ggml's `ksigns` table, one parity bit
//! added) into ±1 bytes that `sign` applies to the activations, and `maddubs`/`madd` sum
//! `Σ grid·±q8` exactly in i32 lanes. Each group's sum times its odd scale `2s + 1` is summed in
//! i32 over the super-block, then `(d_w·d_a)·bsum` accumulates in f32 and the row ends scaled by
//! the format's constant, in the oracle's order ([`crate::quant::vec_dot`]): its bits.

use std::arch::x86_64::*;

use super::lanes::{for_tiles, load_f16};
use crate::backend::cpu::tile::{Activations, TileOut};
use crate::quant::{GgmlType, IQ2XXS_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS};

const IQ2_XXS: u8 = 0;
const IQ3_XXS: u8 = 1;

/// Bytes of one Q8_K block: f32 scale, 256 values, 16 i16 sums.
const ACT_BLOCK: usize = 292;
/// Activation rows per tile (a weight row's unpacked super-block meets up to this many).
const C: usize = 4;

const fn block_bytes(kind: u8) -> usize {
    if kind == IQ2_XXS {
        66
    } else {
        98
    }
}

/// A weight super-block, unpacked: per group of 32 its magnitudes, ±1 signs and odd scale.
struct Unpacked {
    mags: [__m256i; 8],
    signs: [__m256i; 8],
    scales: [i32; 8],
    d: f32,
}

/// The four sign bytes of `aux` (bits 0..28: four 7-bit fields) as 32 bytes of ±1, byte `j`
/// of field `l` at `8l + j`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn signs(aux: u32) -> __m256i {
    let bytes = u32::from_le_bytes(std::array::from_fn(|l| KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize]));
    let spread = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
    );
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let mine = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(bytes as i32), spread), bit);
    // 0xff (-1) where the bit is set, else 1.
    _mm256_or_si256(_mm256_cmpeq_epi8(mine, bit), _mm256_set1_epi8(1))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack<const K: u8>(p: *const u8) -> Unpacked {
    let word = |o: usize| std::ptr::read_unaligned(p.add(o) as *const u32);
    let mut x = Unpacked {
        mags: [_mm256_setzero_si256(); 8],
        signs: [_mm256_setzero_si256(); 8],
        scales: [0; 8],
        d: load_f16(p),
    };
    for ib in 0..8 {
        let aux = if K == IQ2_XXS {
            let idx = word(2 + 8 * ib).to_le_bytes().map(usize::from);
            x.mags[ib] = _mm256_setr_epi64x(
                IQ2XXS_GRID[idx[0]] as i64,
                IQ2XXS_GRID[idx[1]] as i64,
                IQ2XXS_GRID[idx[2]] as i64,
                IQ2XXS_GRID[idx[3]] as i64,
            );
            word(2 + 8 * ib + 4)
        } else {
            let q = std::slice::from_raw_parts(p.add(2 + 8 * ib), 8);
            let g = |i: usize| IQ3XXS_GRID[usize::from(q[i])] as i32;
            x.mags[ib] = _mm256_setr_epi32(g(0), g(1), g(2), g(3), g(4), g(5), g(6), g(7));
            word(2 + 64 + 4 * ib)
        };
        x.signs[ib] = signs(aux);
        x.scales[ib] = 2 * (aux >> 28) as i32 + 1;
    }
    x
}

/// Sum of the eight i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

/// Output `(a0..a0 + CC) × w`: weight row `w` (`nb` super-blocks) against `CC` activation rows.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kernel<const K: u8, const CC: usize>(
    nb: usize,
    weights: &[u8],
    act: &Activations,
    w: usize,
    a0: usize,
    out: &mut TileOut<'_>,
) {
    let ones = _mm256_set1_epi16(1);
    let row = weights.as_ptr().add(w * nb * block_bytes(K));
    let mut sum = [0f32; CC];
    for b in 0..nb {
        let x = unpack::<K>(row.add(b * block_bytes(K)));
        for (c, s) in sum.iter_mut().enumerate() {
            let y = act.bytes.as_ptr().add(((a0 + c) * nb + b) * ACT_BLOCK);
            let mut bsum = 0i32;
            for ib in 0..8 {
                let q8 = _mm256_loadu_si256(y.add(4 + 32 * ib) as *const __m256i);
                let signed = _mm256_sign_epi8(q8, x.signs[ib]);
                let sumi = hsum_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(x.mags[ib], signed), ones));
                bsum += sumi * x.scales[ib];
            }
            let yd = std::ptr::read_unaligned(y as *const f32);
            *s += x.d * yd * bsum as f32;
        }
    }
    let factor = if K == IQ2_XXS { 0.125 } else { 0.25 };
    for (c, &s) in sum.iter().enumerate() {
        out.set(a0 + c, w, factor * s);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run<const K: u8>(k: usize, weights: &[u8], act: &Activations, out: &mut TileOut<'_>) {
    let nb = k / 256;
    for_tiles::<1, C>(out.nw(), act.rows, |w, a0, _, c| match c {
        C => kernel::<K, C>(nb, weights, act, w, a0, out),
        _ => kernel::<K, 1>(nb, weights, act, w, a0, out),
    });
}

/// See [`super::tile`]; lengths were checked there.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn tile(ty: GgmlType, k: usize, weights: &[u8], act: &Activations, out: &mut TileOut<'_>) -> bool {
    match ty {
        GgmlType::IQ2_XXS => run::<IQ2_XXS>(k, weights, act, out),
        GgmlType::IQ3_XXS => run::<IQ3_XXS>(k, weights, act, out),
        _ => return false,
    }
    true
}
