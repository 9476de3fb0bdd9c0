//! The 1-bit grid formats (IQ1_S, IQ1_M) in the file layout against Q8_K activations.
//!
//! Each value is `dl·(grid ± 1/8)` with grid entries -1, 0 or 1, so per 32 values two exact
//! integer sums meet the activations through `sign` (which multiplies by -1, 0 or 1): `Σ grid·q8`
//! and, with each group of 8's delta sign as ±1 bytes, `Σ ±q8`. `maddubs` with ones and `madd`
//! with the odd scales of the two halves fold both into i32 lanes over the super-block, and
//! `(d_w·d_a)·(sumi + sumi_delta/8)` accumulates in f32, in the oracle's order
//! ([`crate::quant::vec_dot`]): its bits.

use std::arch::x86_64::*;

use super::lanes::load_f16;
use super::superblocks::{act_group, act_scale, hsum_epi32, odd_halves, run, SuperBlocks};
use crate::backend::cpu::tile::{Activations, TileOut};
use crate::quant::{GgmlType, IQ1S_GRID};

const IQ1_S: u8 = 0;
const IQ1_M: u8 = 1;

/// The grid offset `± 1/8` (ggml's `IQ1S_DELTA`).
const DELTA: f32 = 0.125;

const fn block_bytes(kind: u8) -> usize {
    if kind == IQ1_S {
        50
    } else {
        56
    }
}

/// A weight super-block, unpacked: per group of 32 its grid values (-1, 0, 1), each group of
/// 8's delta sign as ±1 bytes, and the odd scales of its halves (i16 lanes 0..8 and 8..16).
struct Unpacked {
    grid: [__m256i; 8],
    deltas: [__m256i; 8],
    scales: [__m256i; 8],
    d: f32,
}

/// Grid entry `idx` of each group of 8 as 32 signed bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn grid(idx: [usize; 4]) -> __m256i {
    let g = idx.map(|i| IQ1S_GRID[i] as i64);
    _mm256_setr_epi64x(g[0], g[1], g[2], g[3])
}

/// Four delta signs (`true`: negative) as ±1 bytes, eight per group.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn deltas(neg: [bool; 4]) -> __m256i {
    let b = neg.map(|n| i64::from_le_bytes([if n { 0xff } else { 1 }; 8]));
    _mm256_setr_epi64x(b[0], b[1], b[2], b[3])
}

/// The kernels of format `K`.
struct Iq1<const K: u8>;

impl<const K: u8> SuperBlocks for Iq1<K> {
    const BYTES: usize = block_bytes(K);
    type Unpacked = Unpacked;

    #[inline(always)]
    unsafe fn unpack(p: *const u8) -> Unpacked {
        let byte = |o: usize| usize::from(*p.add(o));
        let mut x = Unpacked {
            grid: [_mm256_setzero_si256(); 8],
            deltas: [_mm256_setzero_si256(); 8],
            scales: [_mm256_setzero_si256(); 8],
            d: 0.0,
        };
        if K == IQ1_S {
            x.d = load_f16(p);
            for ib in 0..8 {
                let qh = byte(34 + 2 * ib) | (byte(35 + 2 * ib) << 8);
                x.grid[ib] = grid(std::array::from_fn(|l| {
                    byte(2 + 4 * ib + l) | (((qh >> (3 * l)) & 7) << 8)
                }));
                x.deltas[ib] = deltas([qh & 0x8000 != 0; 4]);
                let s = ((qh >> 12) & 7) as u32;
                x.scales[ib] = odd_halves(s, s);
            }
        } else {
            let sc: [u16; 4] = std::array::from_fn(|k| (byte(48 + 2 * k) | (byte(49 + 2 * k) << 8)) as u16);
            let bits = (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000);
            x.d = half::f16::from_bits(bits).to_f32();
            for ib in 0..8 {
                // Group l's nibble of qh: 3 high index bits, then the delta's sign.
                let nib = |l: usize| (byte(32 + 2 * ib + l / 2) >> (4 * (l % 2))) & 0xf;
                x.grid[ib] = grid(std::array::from_fn(|l| byte(4 * ib + l) | ((nib(l) & 7) << 8)));
                x.deltas[ib] = deltas(std::array::from_fn(|l| nib(l) & 8 != 0));
                let w = u32::from(sc[ib / 2] >> (6 * (ib % 2)));
                x.scales[ib] = odd_halves(w & 7, (w >> 3) & 7);
            }
        }
        x
    }

    #[inline(always)]
    unsafe fn meet(x: &Unpacked, y: *const u8, s: &mut f32) {
        let ones = _mm256_set1_epi8(1);
        let (mut acc, mut acc_delta) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        for ib in 0..8 {
            let q8 = act_group(y, ib);
            let p = _mm256_maddubs_epi16(ones, _mm256_sign_epi8(q8, x.grid[ib]));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, x.scales[ib]));
            let p = _mm256_maddubs_epi16(ones, _mm256_sign_epi8(q8, x.deltas[ib]));
            acc_delta = _mm256_add_epi32(acc_delta, _mm256_madd_epi16(p, x.scales[ib]));
        }
        *s += x.d * act_scale(y) * (hsum_epi32(acc) as f32 + DELTA * hsum_epi32(acc_delta) as f32);
    }
}

/// See [`super::tile`]; lengths were checked there.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn tile(ty: GgmlType, k: usize, weights: &[u8], act: &Activations, out: &mut TileOut<'_>) -> bool {
    match ty {
        GgmlType::IQ1_S => run::<Iq1<IQ1_S>>(k, weights, act, out),
        GgmlType::IQ1_M => run::<Iq1<IQ1_M>>(k, weights, act, out),
        _ => return false,
    }
    true
}
