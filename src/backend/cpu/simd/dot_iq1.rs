//! The 1-bit grid formats (IQ1_S, IQ1_M) in the file layout against Q8_K activations.
//!
//! Each value is `dl·(grid ± 1/8)` with grid entries -1, 0 or 1, so per 32 values two exact
//! integer sums meet the activations through `sign` (which multiplies by -1, 0 or 1): `Σ grid·q8`
//! and, with each group of 8's delta sign as ±1 bytes, `Σ ±q8`. `maddubs` with ones, the first
//! times 8, and `madd` with the odd scales of the two halves fold both into i32 lanes over the
//! super-block as `8·sumi + sumi_delta` (as values: `8·grid ± 1`, for the tiled prefill); the
//! driver (`superblocks`) scales it by `d_w/8`, the oracle's `d_w·(sumi + sumi_delta/8)`.

use std::arch::x86_64::*;

use super::lanes::load_f16;
use super::superblocks::{half_scales, lanes64, odd_halves, run, RowsFn, SuperBlocks};
use crate::quant::{GgmlType, IQ1S_GRID};

const IQ1_S: u8 = 0;
const IQ1_M: u8 = 1;

/// The grid offset `± 1/8` (ggml's `IQ1S_DELTA`).
const DELTA: f32 = 0.125;

/// Eight bytes of +1, and of -1.
const PLUS: u64 = 0x0101_0101_0101_0101;
const MINUS: u64 = u64::MAX;

const fn block_bytes(kind: u8) -> usize {
    if kind == IQ1_S {
        50
    } else {
        56
    }
}

/// One group of 32, unpacked: its grid values (-1, 0, 1), each group of 8's delta sign as ±1
/// bytes, and the odd scales of its halves (i16 lanes 0..8 and 8..16).
#[derive(Clone, Copy)]
struct Group {
    grid: __m256i,
    deltas: __m256i,
    scales: __m256i,
}

/// The super-block's scale, and IQ1_M's four scale words (which also hold its scale's bits).
struct Head {
    d: f32,
    sc: [u16; 4],
}

/// The kernels of format `K`.
struct Iq1<const K: u8>;

impl<const K: u8> SuperBlocks for Iq1<K> {
    const BYTES: usize = block_bytes(K);
    /// The sums are `8·sumi + sumi_delta`.
    const FACTOR: f32 = DELTA;
    type Head = Head;
    type Group = Group;

    #[inline(always)]
    unsafe fn head(p: *const u8) -> Head {
        if K == IQ1_S {
            return Head {
                d: load_f16(p),
                sc: [0; 4],
            };
        }
        let sc: [u16; 4] = std::array::from_fn(|k| std::ptr::read_unaligned(p.add(48 + 2 * k) as *const u16));
        let bits = (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000);
        Head {
            d: half::f16::from_bits(bits).to_f32(),
            sc,
        }
    }

    #[inline(always)]
    fn scale(head: &Head) -> f32 {
        head.d
    }

    #[inline(always)]
    unsafe fn group(p: *const u8, head: &Head, g: usize) -> Group {
        let byte = |o: usize| usize::from(*p.add(o));
        if K == IQ1_S {
            let qh = usize::from(std::ptr::read_unaligned(p.add(34 + 2 * g) as *const u16));
            let s = ((qh >> 12) & 7) as i16;
            Group {
                grid: lanes64(std::array::from_fn(|l| {
                    IQ1S_GRID[byte(2 + 4 * g + l) | (((qh >> (3 * l)) & 7) << 8)]
                })),
                deltas: _mm256_set1_epi64x((if qh & 0x8000 != 0 { MINUS } else { PLUS }) as i64),
                scales: _mm256_set1_epi16(2 * s + 1),
            }
        } else {
            // Group l's nibble of qh: 3 high index bits, then the delta's sign.
            let qh = u32::from(std::ptr::read_unaligned(p.add(32 + 2 * g) as *const u16));
            let nib = |l: usize| ((qh >> (4 * l)) & 0xf) as usize;
            let w = u32::from(head.sc[g / 2] >> (6 * (g % 2)));
            Group {
                grid: lanes64(std::array::from_fn(|l| {
                    IQ1S_GRID[byte(4 * g + l) | ((nib(l) & 7) << 8)]
                })),
                deltas: lanes64(std::array::from_fn(|l| if nib(l) & 8 != 0 { MINUS } else { PLUS })),
                scales: odd_halves(w & 7, (w >> 3) & 7),
            }
        }
    }

    #[inline(always)]
    unsafe fn meet(x: &Group, q8: __m256i) -> __m256i {
        let ones = _mm256_set1_epi8(1);
        // |8·Σ grid·q8| over a pair stays below 8 · 2 · 128, plus the delta's 2 · 128: i16.
        let grid = _mm256_slli_epi16::<3>(_mm256_maddubs_epi16(ones, _mm256_sign_epi8(q8, x.grid)));
        let delta = _mm256_maddubs_epi16(ones, _mm256_sign_epi8(q8, x.deltas));
        _mm256_madd_epi16(_mm256_add_epi16(grid, delta), x.scales)
    }

    #[inline(always)]
    unsafe fn values(x: &Group) -> (__m256i, [i32; 2]) {
        let eight = _mm256_sign_epi8(_mm256_set1_epi8(8), x.grid);
        (_mm256_add_epi8(eight, x.deltas), half_scales(x.scales))
    }
}

/// The kernel of `ty`, if it is one of this file's formats.
pub(super) fn kernel(ty: GgmlType) -> Option<RowsFn> {
    Some(match ty {
        GgmlType::IQ1_S => run::<Iq1<IQ1_S>>,
        GgmlType::IQ1_M => run::<Iq1<IQ1_M>>,
        _ => return None,
    })
}
