//! The codebook formats (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) against Q8_K
//! activations, on file rows (their grid lookups gain nothing from interleaving).
//!
//! Each super-block of a weight row is unpacked once into its 256 signed values, 16 to a vector
//! (grid entries gathered as 64-bit lanes, the sign bits turned into byte masks and applied),
//! with the odd integer scale of each 16; it then meets every activation row of the batch:
//! exact integer sums `Σ ls·Σ w·q8` in i32 lanes, and per block `sumf += (d_w·d_a)·Σ` in f32,
//! the oracle's order ([`crate::quant::vec_dot`]; the 2- and 3-bit formats end scaled by their
//! grids' fixed-point factor). IQ1_S and IQ1_M add `0.125·Σ ls·Σ ±q8` for the delta each group
//! of 8 shifts its grid values by, unpacked as a second vector of ±1.
//!
//! Block layouts as in [`crate::quant::iquant`] (and ggml's `block_iq*`).

use core::arch::wasm32::*;

use super::lanes::Dot;
use crate::backend::cpu::tile::{Activations, TileOut};
use crate::quant::{GgmlType, IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};

/// A Q8_K activation block: f32 scale, 256 values at [`ACT_VALUES`], then 16 i16 sums.
const ACT_BLOCK: usize = 292;
const ACT_VALUES: usize = 4;

/// Whether these kernels read weights of `ty`.
pub(super) fn covers(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ1_S | IQ1_M)
}

/// A super-block unpacked: `[256]` signed values in 16 vectors, the odd scale of each 16, and
/// for the IQ1 formats each value's delta sign (±1).
struct Unpacked {
    values: [v128; 16],
    scales: [i32; 16],
    deltas: [v128; 16],
    /// The block's scale `d_w`.
    d: f32,
}

/// `out` from weight rows `w` (`out.nw()` file rows of `k` values of `ty`) and Q8_K activations
/// `act`; false (nothing written) where `ty` is not covered or the lengths do not fit.
pub(super) fn tile<D: Dot>(ty: GgmlType, k: usize, w: &[u8], act: &Activations, out: &mut TileOut<'_>) -> bool {
    let (rows, nw) = (out.rows(), out.nw());
    let bb = ty.block_bytes();
    let nb = k / 256;
    let fits = covers(ty)
        && k > 0
        && k.is_multiple_of(256)
        && w.len() >= nw * nb * bb
        && act.rows == rows
        && act.row_bytes == nb * ACT_BLOCK
        && act.bytes.len() >= rows * act.row_bytes;
    if !fits {
        return false;
    }
    let iq1 = matches!(ty, GgmlType::IQ1_S | GgmlType::IQ1_M);
    let factor = match ty {
        GgmlType::IQ3_XXS => 0.25,
        GgmlType::IQ3_S | GgmlType::IQ1_S | GgmlType::IQ1_M => 1.0,
        _ => 0.125,
    };
    let mut u = Unpacked {
        values: [i32x4_splat(0); 16],
        scales: [0; 16],
        deltas: [i32x4_splat(0); 16],
        d: 0.0,
    };
    let mut sums = vec![0f32; rows];
    for r in 0..nw {
        sums.fill(0.0);
        for b in 0..nb {
            let block = &w[(r * nb + b) * bb..(r * nb + b + 1) * bb];
            unpack(ty, block, &mut u);
            for (a, sum) in sums.iter_mut().enumerate() {
                let ab = &act.bytes[a * act.row_bytes + b * ACT_BLOCK..][..ACT_BLOCK];
                let dy = f32::from_le_bytes([ab[0], ab[1], ab[2], ab[3]]);
                // SAFETY: `ab` holds the block's 256 values at ACT_VALUES (a slice of ACT_BLOCK).
                let (isum, dsum) = unsafe { meet::<D>(&u, ab.as_ptr().add(ACT_VALUES), iq1) };
                if iq1 {
                    *sum += u.d * dy * (isum as f32 + 0.125 * dsum as f32);
                } else {
                    *sum += u.d * dy * isum as f32;
                }
            }
        }
        for (a, &s) in sums.iter().enumerate() {
            out.set(a, r, factor * s);
        }
    }
    true
}

/// `Σ ls·Σ w·q8` over the block, and for IQ1 (`deltas`) `Σ ls·Σ ±q8`.
///
/// # Safety
/// `q8` points at 256 readable bytes.
#[inline(always)]
unsafe fn meet<D: Dot>(u: &Unpacked, q8: *const u8, deltas: bool) -> (i32, i32) {
    let (mut acc, mut dacc) = (i32x4_splat(0), i32x4_splat(0));
    for g in 0..16 {
        let a = v128_load(q8.add(16 * g) as *const v128);
        let ls = i32x4_splat(u.scales[g]);
        acc = i32x4_add(acc, i32x4_mul(D::bytes16(i32x4_splat(0), u.values[g], a), ls));
        if deltas {
            dacc = i32x4_add(dacc, i32x4_mul(D::bytes16(i32x4_splat(0), u.deltas[g], a), ls));
        }
    }
    (lanes_sum(acc), lanes_sum(dacc))
}

fn lanes_sum(v: v128) -> i32 {
    i32x4_extract_lane::<0>(v) + i32x4_extract_lane::<1>(v) + i32x4_extract_lane::<2>(v) + i32x4_extract_lane::<3>(v)
}

/// Bit `j % 8` of each byte `j`: the mask that picks a value's sign bit out of its group's byte.
const BITS: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];

/// Two groups of 8 magnitudes (`g0`, `g1`: a byte each) with their sign bytes (bit `j` set:
/// value `j` negative) as 16 signed bytes.
#[inline(always)]
fn signed(g0: u64, g1: u64, s0: u32, s1: u32) -> v128 {
    let mags = u64x2(g0, g1);
    let spread = u64x2(
        u64::from(s0) * 0x0101_0101_0101_0101,
        u64::from(s1) * 0x0101_0101_0101_0101,
    );
    // SAFETY: BITS is 16 bytes.
    let bits = unsafe { v128_load(BITS.as_ptr() as *const v128) };
    let neg = i8x16_eq(v128_and(spread, bits), bits);
    i8x16_sub(v128_xor(mags, neg), neg)
}

/// Two groups of 8 ones, negative where `n0`, `n1`: IQ1's delta signs.
#[inline(always)]
fn delta_signs(n0: bool, n1: bool) -> v128 {
    let one = 0x0101_0101_0101_0101u64;
    u64x2(if n0 { !0 } else { one }, if n1 { !0 } else { one })
}

/// ggml's `ksigns_iq2xs`: 7 stored sign bits and an eighth that makes the count even.
#[inline(always)]
fn ksign(s7: u32) -> u32 {
    s7 | ((s7.count_ones() & 1) << 7)
}

/// Two 4-value IQ3 grid entries as one group of 8 magnitudes.
#[inline(always)]
fn pair(g1: u32, g2: u32) -> u64 {
    u64::from(g1) | (u64::from(g2) << 32)
}

/// Unpack one block of `ty` (its file bytes) into `u`.
fn unpack(ty: GgmlType, p: &[u8], u: &mut Unpacked) {
    let byte = |o: usize| u32::from(p[o]);
    let half = |o: usize| u32::from(u16::from_le_bytes([p[o], p[o + 1]]));
    let word = |o: usize| u32::from_le_bytes([p[o], p[o + 1], p[o + 2], p[o + 3]]);
    let f16 = |bits: u32| super::f16_to_f32(bits as u16);
    match ty {
        GgmlType::IQ2_XXS => {
            u.d = f16(half(0));
            for ib in 0..8 {
                let (idx, aux) = (word(2 + 8 * ib), word(6 + 8 * ib));
                let g = |l: usize| IQ2XXS_GRID[((idx >> (8 * l)) & 255) as usize];
                let s = |l: usize| ksign((aux >> (7 * l)) & 127);
                u.values[2 * ib] = signed(g(0), g(1), s(0), s(1));
                u.values[2 * ib + 1] = signed(g(2), g(3), s(2), s(3));
                let ls = 2 * (aux >> 28) as i32 + 1;
                u.scales[2 * ib] = ls;
                u.scales[2 * ib + 1] = ls;
            }
        }
        GgmlType::IQ2_XS => {
            u.d = f16(half(0));
            for ib in 0..8 {
                let q = |l: usize| half(2 + 8 * ib + 2 * l);
                let g = |l: usize| IQ2XS_GRID[(q(l) & 511) as usize];
                let s = |l: usize| ksign(q(l) >> 9);
                u.values[2 * ib] = signed(g(0), g(1), s(0), s(1));
                u.values[2 * ib + 1] = signed(g(2), g(3), s(2), s(3));
                let sc = byte(66 + ib);
                u.scales[2 * ib] = 2 * (sc & 0xf) as i32 + 1;
                u.scales[2 * ib + 1] = 2 * (sc >> 4) as i32 + 1;
            }
        }
        GgmlType::IQ2_S => {
            u.d = f16(half(0));
            for ib in 0..8 {
                let qh = byte(66 + ib);
                let g = |l: usize| IQ2S_GRID[(byte(2 + 4 * ib + l) | ((qh << (8 - 2 * l)) & 0x300)) as usize];
                let s = |l: usize| byte(34 + 4 * ib + l);
                u.values[2 * ib] = signed(g(0), g(1), s(0), s(1));
                u.values[2 * ib + 1] = signed(g(2), g(3), s(2), s(3));
                let sc = byte(74 + ib);
                u.scales[2 * ib] = 2 * (sc & 0xf) as i32 + 1;
                u.scales[2 * ib + 1] = 2 * (sc >> 4) as i32 + 1;
            }
        }
        GgmlType::IQ3_XXS => {
            u.d = f16(half(0));
            for ib in 0..8 {
                let aux = word(66 + 4 * ib);
                let e = |i: usize| IQ3XXS_GRID[p[2 + 8 * ib + i] as usize];
                let g = |l: usize| pair(e(2 * l), e(2 * l + 1));
                let s = |l: usize| ksign((aux >> (7 * l)) & 127);
                u.values[2 * ib] = signed(g(0), g(1), s(0), s(1));
                u.values[2 * ib + 1] = signed(g(2), g(3), s(2), s(3));
                let ls = 2 * (aux >> 28) as i32 + 1;
                u.scales[2 * ib] = ls;
                u.scales[2 * ib + 1] = ls;
            }
        }
        GgmlType::IQ3_S => {
            u.d = f16(half(0));
            for ib in 0..8 {
                let qh = byte(66 + ib);
                let e = |i: usize| IQ3S_GRID[(byte(2 + 8 * ib + i) | (((qh >> i) & 1) << 8)) as usize];
                let g = |l: usize| pair(e(2 * l), e(2 * l + 1));
                let s = |l: usize| byte(74 + 4 * ib + l);
                u.values[2 * ib] = signed(g(0), g(1), s(0), s(1));
                u.values[2 * ib + 1] = signed(g(2), g(3), s(2), s(3));
                let ls = 2 * ((byte(106 + ib / 2) >> (4 * (ib % 2))) & 0xf) as i32 + 1;
                u.scales[2 * ib] = ls;
                u.scales[2 * ib + 1] = ls;
            }
        }
        GgmlType::IQ1_S => {
            u.d = f16(half(0));
            for ib in 0..8 {
                let qh = half(34 + 2 * ib);
                let g = |l: usize| IQ1S_GRID[(byte(2 + 4 * ib + l) | (((qh >> (3 * l)) & 7) << 8)) as usize];
                u.values[2 * ib] = u64x2(g(0), g(1));
                u.values[2 * ib + 1] = u64x2(g(2), g(3));
                let neg = qh & 0x8000 != 0;
                u.deltas[2 * ib] = delta_signs(neg, neg);
                u.deltas[2 * ib + 1] = delta_signs(neg, neg);
                let ls = 2 * ((qh >> 12) & 7) as i32 + 1;
                u.scales[2 * ib] = ls;
                u.scales[2 * ib + 1] = ls;
            }
        }
        _ => {
            // IQ1_M: the scale words' top nibbles hold the f16 `d`.
            let sc = [0, 1, 2, 3].map(|k| half(48 + 2 * k));
            u.d = f16((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
            for ib in 0..8 {
                let nib = |l: usize| (byte(32 + 2 * ib + l / 2) >> (4 * (l % 2))) & 0xf;
                let g = |l: usize| IQ1S_GRID[(byte(4 * ib + l) | ((nib(l) & 7) << 8)) as usize];
                let neg = |l: usize| nib(l) & 8 != 0;
                u.values[2 * ib] = u64x2(g(0), g(1));
                u.values[2 * ib + 1] = u64x2(g(2), g(3));
                u.deltas[2 * ib] = delta_signs(neg(0), neg(1));
                u.deltas[2 * ib + 1] = delta_signs(neg(2), neg(3));
                let w = sc[ib / 2] >> (6 * (ib % 2));
                u.scales[2 * ib] = 2 * (w & 7) as i32 + 1;
                u.scales[2 * ib + 1] = 2 * ((w >> 3) & 7) as i32 + 1;
            }
        }
    }
}
