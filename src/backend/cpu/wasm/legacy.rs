//! The 32-value formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4) against Q8_0 activations,
//! on interleaved tiles. Field offsets follow [`super::super::interleave`]'s order: each tile
//! block holds the eight rows' `d` (f16, row `i` at `2i`; MXFP4: an E8M0 exponent byte, row `i`
//! at `i`), then `m` for the `_1` formats, then
//! the fifth bits of the Q5 formats (a bit-transposed word per row: a shift by `p` brings the
//! fifth bits of values `4p..4p + 4` to bit 0 of their bytes), then `qs` in 32-byte groups
//! (group `j`: bytes `4j..4j + 4` of each row's `qs`, row `i` at `4i`).

// Register tiles are `[acc; C]` arrays indexed by activation row in loops the compiler unrolls.
#![allow(clippy::needless_range_loop)]

use core::arch::wasm32::*;

use super::lanes::{f16x4, load, splat4, Dot, Family, HALF};
use crate::backend::cpu::interleave::TILE_ROWS;
use crate::backend::cpu::tile::Activations;
use crate::quant::GgmlType;
use crate::quant::{KVALUES_FP4, KVALUES_IQ4NL};

/// Bytes of a Q8_0 activation block: f16 scale, 32 values.
pub(super) const ACT_BLOCK: usize = 34;

const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q5_0: u8 = 2;
const Q5_1: u8 = 3;
const Q8_0: u8 = 4;
const IQ4_NL: u8 = 5;
const MXFP4: u8 = 6;

/// The kernels of `ty`, where it is one of this file's formats.
pub(super) fn family<D: Dot>(ty: GgmlType) -> Option<Family> {
    Some(match ty {
        GgmlType::Q4_0 => family!(half, D, Q4_0),
        GgmlType::Q4_1 => family!(half, D, Q4_1),
        GgmlType::Q5_0 => family!(half, D, Q5_0),
        GgmlType::Q5_1 => family!(half, D, Q5_1),
        GgmlType::Q8_0 => family!(half, D, Q8_0),
        GgmlType::IQ4_NL => family!(half, D, IQ4_NL),
        GgmlType::MXFP4 => family!(half, D, MXFP4),
        _ => return None,
    })
}

/// Bytes of one row's file block.
const fn block_bytes(kind: u8) -> usize {
    match kind {
        Q4_0 | IQ4_NL => 18,
        MXFP4 => 17,
        Q4_1 => 20,
        Q5_0 => 22,
        Q5_1 => 24,
        _ => 34,
    }
}

/// Where the eight rows' `m` (the `_1` formats), fifth bits (Q5) and `qs` start in a tile block.
const fn min_at(kind: u8) -> Option<usize> {
    match kind {
        Q4_1 | Q5_1 => Some(2 * TILE_ROWS),
        _ => None,
    }
}

const fn fifth_at(kind: u8) -> usize {
    if kind == Q5_1 {
        4 * TILE_ROWS
    } else {
        2 * TILE_ROWS
    }
}

const fn qs_at(kind: u8) -> usize {
    match kind {
        MXFP4 => TILE_ROWS,
        Q4_0 | IQ4_NL | Q8_0 => 2 * TILE_ROWS,
        Q4_1 => 4 * TILE_ROWS,
        Q5_0 => 6 * TILE_ROWS,
        _ => 8 * TILE_ROWS,
    }
}

/// What the unsigned codes stand for minus the value: `Σ (q - o)·a = Σ q·a - o·Σ a`.
const fn offset(kind: u8) -> i32 {
    match kind {
        Q4_0 => 8,
        Q5_0 => 16,
        _ => 0,
    }
}

/// Rows `4h..4h + 4` of the tile at `tile` (`nb` tile blocks) against activation rows
/// `a0..a0 + C`: per row, `Σ_b (d_w·d_a)·Σ q·a` (plus `m·(d_a·Σ a)` for the `_1` formats), the
/// oracle's arithmetic in its order.
///
/// # Safety
/// `tile` holds `nb` tile blocks of `kind`; `act` has rows `a0..a0 + C` of `nb` Q8_0 blocks
/// with their `scales` and `offsets`.
#[inline(always)]
unsafe fn half<D: Dot, const K: u8, const C: usize>(
    nb: usize,
    tile: *const u8,
    h: usize,
    act: &Activations,
    a0: usize,
) -> [v128; C] {
    let bb = TILE_ROWS * block_bytes(K);
    // This half's four rows: bytes `16h..16h + 16` of every 32-byte group, `8h..` of the f16s.
    let lanes = 4 * HALF * h;
    let low = u8x16_splat(0x0f);
    let ones = u32x4_splat(0x0101_0101);
    let table = load(if K == MXFP4 {
        KVALUES_FP4.as_ptr()
    } else {
        KVALUES_IQ4NL.as_ptr()
    } as *const u8);
    let rows: [*const u8; C] = core::array::from_fn(|c| act.bytes.as_ptr().add((a0 + c) * act.row_bytes));
    let mut acc = [f32x4_splat(0.0); C];
    for b in 0..nb {
        let t = tile.add(b * bb);
        let mut isum = [D::zero(); C];
        let a = |c: usize, value: usize| D::act(splat4(rows[c].add(b * ACT_BLOCK + 2 + value)));
        if K == Q8_0 {
            for g in 0..8 {
                let w = load(t.add(qs_at(K) + 32 * g + lanes));
                for c in 0..C {
                    isum[c] = D::i8(isum[c], w, a(c, 4 * g));
                }
            }
        } else {
            let fifth = load(t.add(fifth_at(K) + lanes));
            for j in 0..4 {
                let v = load(t.add(qs_at(K) + 32 * j + lanes));
                let (mut lo, mut hi) = (v128_and(v, low), u8x16_shr(v, 4));
                if K == Q5_0 || K == Q5_1 {
                    lo = v128_or(lo, u32x4_shl(v128_and(u32x4_shr(fifth, j as u32), ones), 4));
                    hi = v128_or(hi, u32x4_shl(v128_and(u32x4_shr(fifth, 4 + j as u32), ones), 4));
                }
                for c in 0..C {
                    if K == IQ4_NL || K == MXFP4 {
                        isum[c] = D::i8(isum[c], i8x16_swizzle(table, lo), a(c, 4 * j));
                        isum[c] = D::i8(isum[c], i8x16_swizzle(table, hi), a(c, 16 + 4 * j));
                    } else {
                        isum[c] = D::u7(isum[c], lo, a(c, 4 * j));
                        isum[c] = D::u7(isum[c], hi, a(c, 16 + 4 * j));
                    }
                }
            }
        }
        let d = if K == MXFP4 {
            e8m0_half4(t.add(HALF * h))
        } else {
            f16x4(t.add(2 * HALF * h))
        };
        let m = min_at(K).map(|at| f16x4(t.add(at + 2 * HALF * h)));
        for c in 0..C {
            let i = (a0 + c) * nb + b;
            let (da, sum_a) = (*act.scales.get_unchecked(i), *act.offsets.get_unchecked(i));
            let mut s = D::sum(isum[c]);
            if offset(K) != 0 {
                s = i32x4_sub(s, i32x4_splat(offset(K) * sum_a));
            }
            acc[c] = f32x4_add(acc[c], f32x4_mul(f32x4_mul(d, f32x4_splat(da)), f32x4_convert_i32x4(s)));
            if let Some(m) = m {
                acc[c] = f32x4_add(acc[c], f32x4_mul(m, f32x4_splat(da * sum_a as f32)));
            }
        }
    }
    acc
}

/// Four E8M0 exponent bytes at `p` as `2^(e - 128)` in f32 (the oracle's halved scale, which
/// the doubled FP4 table makes whole): `(e - 1) << 23` as an f32's bits, and for `e` 0 and 1
/// the subnormals `2^-128` and `2^-127`.
#[inline(always)]
unsafe fn e8m0_half4(p: *const u8) -> v128 {
    let e = u32x4_extend_low_u16x8(u16x8_extend_low_u8x16(v128_load32_zero(p as *const u32)));
    let normal = u32x4_shl(i32x4_sub(e, u32x4_splat(1)), 23);
    let tiny = v128_bitselect(
        u32x4_splat(0x0040_0000),
        u32x4_splat(0x0020_0000),
        i32x4_eq(e, u32x4_splat(1)),
    );
    v128_bitselect(tiny, normal, u32x4_lt(e, u32x4_splat(2)))
}
