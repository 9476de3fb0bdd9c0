//! The 2- and 3-bit grid formats (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) in the file layout
//! against Q8_K activations.
//!
//! Per 32 values: the grid entries their indices name are gathered into 32 unsigned magnitude
//! bytes, the four sign bytes (7-bit fields expanded through ggml's `ksigns` table, or stored
//! whole) become ±1 bytes that `sign` applies to the activations, and `maddubs`, then `madd`
//! with the odd scales `2s + 1` of the two halves, sum `Σ ls·grid·±q8` exactly in i32 lanes over
//! the super-block. Then `(d_w·d_a)·bsum` accumulates in f32 and the row ends scaled by the
//! format's constant, in the oracle's order ([`crate::quant::vec_dot`]): its bits.

use std::arch::x86_64::*;

use super::lanes::{bit_bytes, load_f16};
use super::superblocks::{act_group, act_scale, hsum_epi32, odd_halves, run, SuperBlocks};
use crate::backend::cpu::tile::{Activations, TileOut};
use crate::quant::{GgmlType, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS};

const IQ2_XXS: u8 = 0;
const IQ3_XXS: u8 = 1;
const IQ2_XS: u8 = 2;
const IQ2_S: u8 = 3;
const IQ3_S: u8 = 4;

const fn block_bytes(kind: u8) -> usize {
    match kind {
        IQ2_XXS => 66,
        IQ3_XXS => 98,
        IQ2_XS => 74,
        IQ2_S => 82,
        _ => 110,
    }
}

/// The factor a row's sum ends scaled by (the grids' fixed-point scale).
const fn factor(kind: u8) -> f32 {
    match kind {
        IQ3_XXS => 0.25,
        IQ3_S => 1.0,
        _ => 0.125,
    }
}

/// A weight super-block, unpacked: per group of 32 its magnitudes, ±1 signs and the odd
/// scales of its halves (i16 lanes 0..8 the first's, 8..16 the second's).
struct Unpacked {
    mags: [__m256i; 8],
    signs: [__m256i; 8],
    scales: [__m256i; 8],
    d: f32,
}

/// Four 7-bit sign fields (bits `7l..7l + 7` of `aux`) expanded by ggml's `ksigns` table.
fn ksigns(aux: u32) -> [u8; 4] {
    std::array::from_fn(|l| KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize])
}

/// Four sign bytes (bit `j` of byte `l`: value `8l + j` is negative) as 32 bytes of ±1.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn signs(bytes: [u8; 4]) -> __m256i {
    // 0xff (-1) where the bit is set, else 1.
    _mm256_or_si256(bit_bytes(u32::from_le_bytes(bytes)), _mm256_set1_epi8(1))
}

/// The kernels of format `K`.
struct Grid<const K: u8>;

impl<const K: u8> SuperBlocks for Grid<K> {
    const BYTES: usize = block_bytes(K);
    const FACTOR: f32 = factor(K);
    type Unpacked = Unpacked;

    #[inline(always)]
    unsafe fn unpack(p: *const u8) -> Unpacked {
        let word = |o: usize| std::ptr::read_unaligned(p.add(o) as *const u32);
        let byte = |o: usize| u32::from(*p.add(o));
        let grid8 = |g: [u64; 4]| _mm256_setr_epi64x(g[0] as i64, g[1] as i64, g[2] as i64, g[3] as i64);
        let grid4 = |g: [u32; 8]| _mm256_loadu_si256(g.as_ptr() as *const __m256i);
        let mut x = Unpacked {
            mags: [_mm256_setzero_si256(); 8],
            signs: [_mm256_setzero_si256(); 8],
            scales: [_mm256_setzero_si256(); 8],
            d: load_f16(p),
        };
        for ib in 0..8 {
            let (mags, sign_bytes, scales) = match K {
                IQ2_XXS => {
                    let (idx, aux) = (word(2 + 8 * ib).to_le_bytes(), word(6 + 8 * ib));
                    let mags = grid8(idx.map(|i| IQ2XXS_GRID[usize::from(i)]));
                    (mags, ksigns(aux), odd_halves(aux >> 28, aux >> 28))
                }
                IQ3_XXS => {
                    let aux = word(66 + 4 * ib);
                    let mags = grid4(std::array::from_fn(|i| IQ3XXS_GRID[byte(2 + 8 * ib + i) as usize]));
                    (mags, ksigns(aux), odd_halves(aux >> 28, aux >> 28))
                }
                IQ2_XS => {
                    let q: [u32; 4] =
                        std::array::from_fn(|l| byte(2 + 8 * ib + 2 * l) | (byte(3 + 8 * ib + 2 * l) << 8));
                    let mags = grid8(q.map(|q| IQ2XS_GRID[(q & 511) as usize]));
                    let signs = q.map(|q| KSIGNS_IQ2XS[(q >> 9) as usize]);
                    let sc = byte(66 + ib);
                    (mags, signs, odd_halves(sc & 0xf, sc >> 4))
                }
                IQ2_S => {
                    let qh = byte(66 + ib);
                    let idx: [u64; 4] = std::array::from_fn(|l| {
                        let i = byte(2 + 4 * ib + l) | ((qh << (8 - 2 * l)) & 0x300);
                        IQ2S_GRID[i as usize]
                    });
                    let signs = std::array::from_fn(|l| *p.add(34 + 4 * ib + l));
                    let sc = byte(74 + ib);
                    (grid8(idx), signs, odd_halves(sc & 0xf, sc >> 4))
                }
                _ => {
                    let qh = byte(66 + ib);
                    let mags = grid4(std::array::from_fn(|i| {
                        let (l, second) = (i / 2, i % 2);
                        let hi = (qh << (8 - 2 * l as u32 - second as u32)) & 256;
                        IQ3S_GRID[(byte(2 + 8 * ib + i) | hi) as usize]
                    }));
                    let signs = std::array::from_fn(|l| *p.add(74 + 4 * ib + l));
                    let s = (byte(106 + ib / 2) >> (4 * (ib % 2))) & 0xf;
                    (mags, signs, odd_halves(s, s))
                }
            };
            x.mags[ib] = mags;
            x.signs[ib] = signs(sign_bytes);
            x.scales[ib] = scales;
        }
        x
    }

    #[inline(always)]
    unsafe fn meet(x: &Unpacked, y: *const u8, s: &mut f32) {
        let mut acc = _mm256_setzero_si256();
        for ib in 0..8 {
            let signed = _mm256_sign_epi8(act_group(y, ib), x.signs[ib]);
            let p = _mm256_maddubs_epi16(x.mags[ib], signed);
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, x.scales[ib]));
        }
        *s += x.d * act_scale(y) * hsum_epi32(acc) as f32;
    }
}

/// See [`super::tile`]; lengths were checked there.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn tile(ty: GgmlType, k: usize, weights: &[u8], act: &Activations, out: &mut TileOut<'_>) -> bool {
    match ty {
        GgmlType::IQ2_XXS => run::<Grid<IQ2_XXS>>(k, weights, act, out),
        GgmlType::IQ3_XXS => run::<Grid<IQ3_XXS>>(k, weights, act, out),
        GgmlType::IQ2_XS => run::<Grid<IQ2_XS>>(k, weights, act, out),
        GgmlType::IQ2_S => run::<Grid<IQ2_S>>(k, weights, act, out),
        GgmlType::IQ3_S => run::<Grid<IQ3_S>>(k, weights, act, out),
        _ => return false,
    }
    true
}
