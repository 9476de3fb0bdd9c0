//! The 2- and 3-bit grid formats (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) in the file layout
//! against Q8_K activations.
//!
//! Per 32 values: the grid entries their indices name are gathered into 32 unsigned magnitude
//! bytes, the four sign bytes (7-bit fields expanded by ggml's `ksigns` rule, or stored whole)
//! become ±1 bytes through a table of eight per byte, which `sign` applies to the activations,
//! and `maddubs`, then `madd` with the odd scales `2s + 1` of the two halves, sum
//! `Σ ls·grid·±q8` exactly in i32 lanes over the super-block; the driver (`superblocks`) takes
//! it from there, folding the format's constant into `d_w`.

use std::arch::x86_64::*;

use super::lanes::load_f16;
use super::superblocks::{half_scales, lanes64, odd_halves, run, RowsFn, SuperBlocks};
use crate::quant::{GgmlType, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};

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

/// Eight sign bits (bit `j`: value `j` is negative) as eight bytes, -1 (0xff) or 1.
const fn sign_bytes(bits: u8) -> u64 {
    let mut v = 0u64;
    let mut j = 0;
    while j < 8 {
        let b: u64 = if (bits >> j) & 1 == 1 { 0xff } else { 1 };
        v |= b << (8 * j);
        j += 1;
    }
    v
}

/// [`sign_bytes`] of every byte: the stored sign bytes of IQ2_S and IQ3_S.
static SIGNS: [u64; 256] = {
    let mut t = [0u64; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = sign_bytes(i as u8);
        i += 1;
    }
    t
};

/// [`sign_bytes`] of each 7-bit sign field expanded by ggml's `ksigns` rule (the eighth bit
/// makes the count of negatives even; `quant::KSIGNS_IQ2XS`, which a test checks).
static KSIGNS: [u64; 128] = {
    let mut t = [0u64; 128];
    let mut i = 0;
    while i < 128 {
        t[i] = sign_bytes(i as u8 | (((i as u32).count_ones() as u8 & 1) << 7));
        i += 1;
    }
    t
};

/// One group of 32, unpacked: its magnitudes, ±1 signs and the odd scales of its halves
/// (i16 lanes 0..8 the first's, 8..16 the second's).
#[derive(Clone, Copy)]
struct Group {
    mags: __m256i,
    signs: __m256i,
    scales: __m256i,
}

/// The four 7-bit sign fields of `aux` (bits `7l..7l + 7`) as ±1 bytes.
#[inline(always)]
unsafe fn ksigns(aux: u32) -> __m256i {
    lanes64(std::array::from_fn(|l| KSIGNS[((aux >> (7 * l)) & 127) as usize]))
}

/// The four stored sign bytes at `p` as ±1 bytes.
#[inline(always)]
unsafe fn stored_signs(p: *const u8) -> __m256i {
    lanes64(std::array::from_fn(|l| SIGNS[usize::from(*p.add(l))]))
}

/// The kernels of format `K`.
struct Grid<const K: u8>;

impl<const K: u8> SuperBlocks for Grid<K> {
    const BYTES: usize = block_bytes(K);
    const FACTOR: f32 = factor(K);
    type Head = f32;
    type Group = Group;

    #[inline(always)]
    unsafe fn head(p: *const u8) -> f32 {
        load_f16(p)
    }

    #[inline(always)]
    fn scale(d: &f32) -> f32 {
        *d
    }

    #[inline(always)]
    unsafe fn group(p: *const u8, _: &f32, g: usize) -> Group {
        let word = |o: usize| std::ptr::read_unaligned(p.add(o) as *const u32);
        let wide = |o: usize| std::ptr::read_unaligned(p.add(o) as *const u64);
        let byte = |o: usize| u32::from(*p.add(o));
        match K {
            IQ2_XXS => {
                let (idx, aux) = (word(2 + 8 * g), word(6 + 8 * g));
                Group {
                    mags: lanes64(std::array::from_fn(|l| IQ2XXS_GRID[((idx >> (8 * l)) & 255) as usize])),
                    signs: ksigns(aux),
                    scales: _mm256_set1_epi16((2 * (aux >> 28) + 1) as i16),
                }
            }
            IQ3_XXS => {
                let (idx, aux) = (wide(2 + 8 * g), word(66 + 4 * g));
                let m: [u32; 8] = std::array::from_fn(|i| IQ3XXS_GRID[((idx >> (8 * i)) & 255) as usize]);
                Group {
                    mags: _mm256_loadu_si256(m.as_ptr() as *const __m256i),
                    signs: ksigns(aux),
                    scales: _mm256_set1_epi16((2 * (aux >> 28) + 1) as i16),
                }
            }
            IQ2_XS => {
                let q = wide(2 + 8 * g);
                let half = |l: usize| ((q >> (16 * l)) & 0xffff) as usize;
                let sc = byte(66 + g);
                Group {
                    mags: lanes64(std::array::from_fn(|l| IQ2XS_GRID[half(l) & 511])),
                    signs: lanes64(std::array::from_fn(|l| KSIGNS[half(l) >> 9])),
                    scales: odd_halves(sc & 0xf, sc >> 4),
                }
            }
            IQ2_S => {
                let (idx, qh) = (word(2 + 4 * g), byte(66 + g));
                let sc = byte(74 + g);
                Group {
                    mags: lanes64(std::array::from_fn(|l| {
                        IQ2S_GRID[(((idx >> (8 * l)) & 255) | ((qh << (8 - 2 * l)) & 0x300)) as usize]
                    })),
                    signs: stored_signs(p.add(34 + 4 * g)),
                    scales: odd_halves(sc & 0xf, sc >> 4),
                }
            }
            _ => {
                let (idx, qh) = (wide(2 + 8 * g), byte(66 + g) as u64);
                let m: [u32; 8] =
                    std::array::from_fn(|i| IQ3S_GRID[(((idx >> (8 * i)) & 255) | (((qh >> i) & 1) << 8)) as usize]);
                let s = (byte(106 + g / 2) >> (4 * (g % 2))) & 0xf;
                Group {
                    mags: _mm256_loadu_si256(m.as_ptr() as *const __m256i),
                    signs: stored_signs(p.add(74 + 4 * g)),
                    scales: _mm256_set1_epi16((2 * s + 1) as i16),
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn meet(x: &Group, q8: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(x.mags, _mm256_sign_epi8(q8, x.signs)), x.scales)
    }

    #[inline(always)]
    unsafe fn values(x: &Group) -> (__m256i, [i32; 2]) {
        (_mm256_sign_epi8(x.mags, x.signs), half_scales(x.scales))
    }
}

/// The kernel of `ty`, if it is one of this file's formats.
pub(super) fn kernel(ty: GgmlType) -> Option<RowsFn> {
    Some(match ty {
        GgmlType::IQ2_XXS => run::<Grid<IQ2_XXS>>,
        GgmlType::IQ3_XXS => run::<Grid<IQ3_XXS>>,
        GgmlType::IQ2_XS => run::<Grid<IQ2_XS>>,
        GgmlType::IQ2_S => run::<Grid<IQ2_S>>,
        GgmlType::IQ3_S => run::<Grid<IQ3_S>>,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn sign_tables_follow_ggml_s_ksigns() {
        for (i, &k) in crate::quant::KSIGNS_IQ2XS.iter().enumerate() {
            assert_eq!(super::KSIGNS[i], super::SIGNS[usize::from(k)], "field {i}");
        }
        assert_eq!(super::SIGNS[0b1000_0001], 0xff01_0101_0101_01ff);
    }
}
