//! The 256-value formats (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, TQ2_0) against Q8_K
//! activations, on interleaved tiles. Field offsets follow [`super::super::interleave`]'s order:
//!
//! * Q2_K: `d`, `dmin`, the 16 scale bytes (4 groups; scale in the low nibble, minimum in the
//!   high one), `qs` (16 groups). In each half `n` of 128 values, bits `2j, 2j + 1` of `qs`
//!   byte `32n + l` are value `128n + 32j + l`.
//! * Q3_K: `d`, the 12 bytes of packed 6-bit scales (3 groups), `hmask` (8 groups), `qs` (16
//!   groups): Q2_K's low bits, with the high bit of value `128n + 32j + l` bit `4n + j` of
//!   `hmask` byte `l` (set: the value is its low bits; clear: less 4).
//! * TQ2_0: `d`, `qs` (16 groups) in Q2_K's bit layout, each value its code less 1.
//! * Q4_K: `d` (8 f16), `dmin` (8 f16), the 12 bytes of packed 6-bit scales and minimums (3
//!   groups of 4 bytes per row), `qs` (32 groups). `qs` bytes `32c..32c + 32` hold sub-block
//!   `2c` in their low nibbles and `2c + 1` in their high ones.
//! * Q5_K: Q4_K's fields with `qh` (8 groups) before `qs`: bit `j` of `qh` byte `l` is the
//!   fifth bit of value `l` of sub-block `j`.
//! * Q6_K: `d`, the 16 signed scales (4 groups), then `ql` (32 groups) and `qh` (16 groups)
//!   in the order of one pass ([`q6k_quads`] places them). In each half of 128 values, `ql`
//!   bytes `l` and `l + 32` and `qh` byte `l` give values `l`, `l + 32`, `l + 64`, `l + 96` (low
//!   nibbles, then high; two `qh` bits each).
//! * IQ4_XS: `d`, `scales_h` (8 × 16 bits), `scales_l` (1 group), `qs` (32 groups). Sub-block
//!   `ib`'s 16 `qs` bytes (groups `4ib..4ib + 4`) hold its values `0..16` in their low nibbles
//!   and `16..32` in their high ones, codes into the IQ4_NL table; its 6-bit scale is nibble
//!   `ib` of `scales_l` and bits `2ib..2ib + 2` of `scales_h` above it.
//!
//! Each sub-block's exact integer sum meets its row's scale as i32 (four rows per vector), as
//! ggml's `Σ sc·Σ q·q8`; Q6_K's `q - 32` takes `32·bsum` off each 16-value sub-block (Q3_K's
//! 3-bit codes, the value plus 4, take `4·bsum`, TQ2_0's, with no sub-block scales, `bsum`), Q2_K's, Q4_K's and Q5_K's minimums meet the
//! activations' 16-value sums in `Σ m·bsum`. IQ4_XS, like the
//! oracle, sums in f32 per sub-block: `(d_w·d_a·(ls - 32))·Σ q·a`.

// Register tiles are `[acc; C]` arrays indexed by activation row in loops the compiler unrolls.
#![allow(clippy::needless_range_loop)]

use core::arch::wasm32::*;

use super::lanes::{f16x4, load, splat4, Dot, Family, HALF};
use crate::backend::cpu::interleave::{q6k_quads, TILE_ROWS};
use crate::backend::cpu::tile::Activations;
use crate::quant::GgmlType;
use crate::quant::KVALUES_IQ4NL;

/// A Q8_K activation block: f32 scale, 256 values at [`ACT_VALUES`], 16 i16 sums at
/// [`ACT_BSUMS`].
const ACT_BLOCK: usize = 292;
const ACT_VALUES: usize = 4;
const ACT_BSUMS: usize = 260;

const Q4_K: u8 = 0;
const Q6_K: u8 = 1;
const Q5_K: u8 = 2;
const IQ4_XS: u8 = 3;
const Q2_K: u8 = 4;
const Q3_K: u8 = 5;
const TQ2_0: u8 = 6;

/// The kernels of `ty`, where it is one of this file's formats.
pub(super) fn family<D: Dot>(ty: GgmlType) -> Option<Family> {
    Some(match ty {
        GgmlType::Q4_K => family!(half, D, Q4_K),
        GgmlType::Q5_K => family!(half, D, Q5_K),
        GgmlType::Q6_K => family!(half, D, Q6_K),
        GgmlType::IQ4_XS => family!(half, D, IQ4_XS),
        GgmlType::Q2_K => family!(half, D, Q2_K),
        GgmlType::Q3_K => family!(half, D, Q3_K),
        GgmlType::TQ2_0 => family!(half, D, TQ2_0),
        _ => return None,
    })
}

// Tile-block offsets. Q4_K: 1152 bytes; Q5_K: 1408 (Q4_K's fields, `qh` before `qs`); Q6_K:
// 1680; IQ4_XS: 1088.
const Q4K_BLOCK: usize = TILE_ROWS * 144;
const Q4K_DMIN: usize = 2 * TILE_ROWS;
const Q4K_SCALES: usize = 4 * TILE_ROWS;
const Q4K_QS: usize = 16 * TILE_ROWS;
const Q5K_BLOCK: usize = TILE_ROWS * 176;
const Q5K_QH: usize = 16 * TILE_ROWS;
const Q5K_QS: usize = 48 * TILE_ROWS;
const IQ4XS_BLOCK: usize = TILE_ROWS * 136;
const IQ4XS_SCALES_H: usize = 2 * TILE_ROWS;
const IQ4XS_SCALES_L: usize = 4 * TILE_ROWS;
const IQ4XS_QS: usize = 8 * TILE_ROWS;
const Q6K_BLOCK: usize = TILE_ROWS * 210;
const Q6K_SCALES: usize = 2 * TILE_ROWS;
const Q2K_BLOCK: usize = TILE_ROWS * 84;
const Q2K_DMIN: usize = 2 * TILE_ROWS;
const Q2K_SCALES: usize = 4 * TILE_ROWS;
const Q2K_QS: usize = 20 * TILE_ROWS;
const Q3K_BLOCK: usize = TILE_ROWS * 110;
const Q3K_SCALES: usize = 2 * TILE_ROWS;
const Q3K_HMASK: usize = 14 * TILE_ROWS;
const Q3K_QS: usize = 46 * TILE_ROWS;
const TQ2_BLOCK: usize = TILE_ROWS * 66;
const TQ2_QS: usize = 2 * TILE_ROWS;

/// Byte `j` of each 32-bit lane of `v`, zero-extended.
#[inline(always)]
fn byte_u(v: v128, j: usize) -> v128 {
    v128_and(u32x4_shr(v, 8 * j as u32), u32x4_splat(0xff))
}

/// Byte `j` of each 32-bit lane of `v`, sign-extended.
#[inline(always)]
fn byte_s(v: v128, j: usize) -> v128 {
    i32x4_shr(i32x4_shl(v, 24 - 8 * j as u32), 24)
}

/// Activation row `r`'s 16-value sum `j` of block `b`.
#[inline(always)]
unsafe fn bsum(row: *const u8, b: usize, j: usize) -> i32 {
    let p = row.add(b * ACT_BLOCK + ACT_BSUMS + 2 * j);
    i32::from(i16::from_le_bytes([*p, *p.add(1)]))
}

/// Rows `4h..4h + 4` of the tile at `tile` (`nb` tile blocks) against activation rows
/// `a0..a0 + C`: per super-block `(d_w·d_a)·Σ sc·Σ q·a`, less `(dmin_w·d_a)·Σ m·bsum` for Q2_K,
/// Q4_K and Q5_K (IQ4_XS: per sub-block, see the module doc), the oracle's arithmetic in its order.
///
/// # Safety
/// `tile` holds `nb` tile blocks of `kind`; `act` has rows `a0..a0 + C` of `nb` Q8_K blocks.
#[inline(always)]
unsafe fn half<D: Dot, const K: u8, const C: usize>(
    nb: usize,
    tile: *const u8,
    h: usize,
    act: &Activations,
    a0: usize,
) -> [v128; C] {
    let lanes = 4 * HALF * h;
    let low = u8x16_splat(0x0f);
    let rows: [*const u8; C] = core::array::from_fn(|c| act.bytes.as_ptr().add((a0 + c) * act.row_bytes));
    let mut acc = [f32x4_splat(0.0); C];
    for b in 0..nb {
        let a = |c: usize, value: usize| D::act(splat4(rows[c].add(b * ACT_BLOCK + ACT_VALUES + value)));
        let da = |c: usize| f32::from_le_bytes(*(rows[c].add(b * ACT_BLOCK) as *const [u8; 4]));
        if K == Q4_K || K == Q5_K {
            let (block, qs) = if K == Q4_K {
                (Q4K_BLOCK, Q4K_QS)
            } else {
                (Q5K_BLOCK, Q5K_QS)
            };
            let t = tile.add(b * block);
            let (u0, u1, u2) = (
                load(t.add(Q4K_SCALES + lanes)),
                load(t.add(Q4K_SCALES + 32 + lanes)),
                load(t.add(Q4K_SCALES + 64 + lanes)),
            );
            // `quant::kquant::scale_min_k4` for four rows at once: scales and minimums 0..4 are
            // the low 6 bits of bytes 0..4 / 4..8; 4..8 take 4 bits from bytes 8..12 and their
            // top 2 bits from the spare top bits of bytes 0..8.
            let six = u32x4_splat(0x3f3f_3f3f);
            let four = u32x4_splat(0x0f0f_0f0f);
            let top = |u: v128| u32x4_shl(v128_and(u32x4_shr(u, 6), u32x4_splat(0x0303_0303)), 4);
            let sc = [v128_and(u0, six), v128_or(v128_and(u2, four), top(u0))];
            let mins = [v128_and(u1, six), v128_or(v128_and(u32x4_shr(u2, 4), four), top(u1))];
            let mut isum = [i32x4_splat(0); C];
            for j in 0..8 {
                let (ch, nibble) = (j / 2, j % 2);
                let mut sub = [D::zero(); C];
                for g in 0..8 {
                    let v = load(t.add(qs + 32 * (8 * ch + g) + lanes));
                    let mut q = if nibble == 0 { v128_and(v, low) } else { u8x16_shr(v, 4) };
                    if K == Q5_K {
                        let qh = load(t.add(Q5K_QH + 32 * g + lanes));
                        q = v128_or(q, i8x16_shl(v128_and(u8x16_shr(qh, j as u32), u8x16_splat(1)), 4));
                    }
                    for c in 0..C {
                        sub[c] = D::u7(sub[c], q, a(c, 32 * j + 4 * g));
                    }
                }
                let s = byte_u(sc[j / 4], j % 4);
                for c in 0..C {
                    isum[c] = i32x4_add(isum[c], i32x4_mul(D::sum(sub[c]), s));
                }
            }
            let d = f16x4(t.add(2 * HALF * h));
            let dmin = f16x4(t.add(Q4K_DMIN + 2 * HALF * h));
            for c in 0..C {
                let mut msum = i32x4_splat(0);
                for j in 0..8 {
                    let pair = bsum(rows[c], b, 2 * j) + bsum(rows[c], b, 2 * j + 1);
                    msum = i32x4_add(msum, i32x4_mul(byte_u(mins[j / 4], j % 4), i32x4_splat(pair)));
                }
                let da = f32x4_splat(da(c));
                acc[c] = f32x4_add(acc[c], f32x4_mul(f32x4_mul(d, da), f32x4_convert_i32x4(isum[c])));
                acc[c] = f32x4_sub(acc[c], f32x4_mul(f32x4_mul(dmin, da), f32x4_convert_i32x4(msum)));
            }
        } else if K == IQ4_XS {
            let t = tile.add(b * IQ4XS_BLOCK);
            let table = load(KVALUES_IQ4NL.as_ptr() as *const u8);
            let scales_h = u32x4_extend_low_u16x8(v128_load64_zero(t.add(IQ4XS_SCALES_H + 2 * HALF * h) as *const u64));
            let scales_l = load(t.add(IQ4XS_SCALES_L + lanes));
            let d = f16x4(t.add(2 * HALF * h));
            let dd: [v128; C] = core::array::from_fn(|c| f32x4_mul(d, f32x4_splat(da(c))));
            for ib in 0..8 {
                let mut sub = [D::zero(); C];
                for g in 0..4 {
                    let v = load(t.add(IQ4XS_QS + 32 * (4 * ib + g) + lanes));
                    let (lo, hi) = (
                        i8x16_swizzle(table, v128_and(v, low)),
                        i8x16_swizzle(table, u8x16_shr(v, 4)),
                    );
                    for c in 0..C {
                        sub[c] = D::i8(sub[c], lo, a(c, 32 * ib + 4 * g));
                        sub[c] = D::i8(sub[c], hi, a(c, 32 * ib + 16 + 4 * g));
                    }
                }
                let ls = v128_or(
                    v128_and(u32x4_shr(scales_l, 4 * ib as u32), u32x4_splat(0xf)),
                    u32x4_shl(v128_and(u32x4_shr(scales_h, 2 * ib as u32), u32x4_splat(3)), 4),
                );
                let ls = f32x4_convert_i32x4(i32x4_sub(ls, i32x4_splat(32)));
                for c in 0..C {
                    let dl = f32x4_mul(dd[c], ls);
                    acc[c] = f32x4_add(acc[c], f32x4_mul(dl, f32x4_convert_i32x4(D::sum(sub[c]))));
                }
            }
        } else if K == Q2_K || K == Q3_K || K == TQ2_0 {
            let (block, qs) = match K {
                Q2_K => (Q2K_BLOCK, Q2K_QS),
                Q3_K => (Q3K_BLOCK, Q3K_QS),
                _ => (TQ2_BLOCK, TQ2_QS),
            };
            let t = tile.add(b * block);
            let three = u8x16_splat(3);
            let mut isum = [i32x4_splat(0); C];
            let mut msum = [i32x4_splat(0); C];
            for s in 0..16 {
                // Sub-block `s` of 16 values: half `n` of 128, shift `2j`, `qs` groups
                // `8n + 4hh..8n + 4hh + 4` (values `128n + 32j + 4m..`, `m` = 4hh..4hh + 4).
                let (n, j, hh) = (s / 8, s % 8 / 2, s % 2);
                let mut sub = [D::zero(); C];
                for m in 4 * hh..4 * hh + 4 {
                    let v = load(t.add(qs + 32 * (8 * n + m) + lanes));
                    let mut q = v128_and(u8x16_shr(v, 2 * j as u32), three);
                    if K == Q3_K {
                        let hm = load(t.add(Q3K_HMASK + 32 * m + lanes));
                        let bit = v128_and(u8x16_shr(hm, (4 * n + j) as u32), u8x16_splat(1));
                        q = v128_or(q, i8x16_shl(bit, 2));
                    }
                    for c in 0..C {
                        sub[c] = D::u7(sub[c], q, a(c, 128 * n + 32 * j + 4 * m));
                    }
                }
                if K == Q2_K {
                    let byte = byte_u(load(t.add(Q2K_SCALES + 32 * (s / 4) + lanes)), s % 4);
                    let (sc, min) = (v128_and(byte, u32x4_splat(0xf)), u32x4_shr(byte, 4));
                    for c in 0..C {
                        isum[c] = i32x4_add(isum[c], i32x4_mul(D::sum(sub[c]), sc));
                        msum[c] = i32x4_add(msum[c], i32x4_mul(min, i32x4_splat(bsum(rows[c], b, s))));
                    }
                } else if K == TQ2_0 {
                    for c in 0..C {
                        let centred = i32x4_sub(D::sum(sub[c]), i32x4_splat(bsum(rows[c], b, s)));
                        isum[c] = i32x4_add(isum[c], centred);
                    }
                } else {
                    // The 6-bit scale: 4 bits from the low (s < 8) or high nibble of byte
                    // s % 8, 2 from byte 8 + s % 4 (bits 2(s / 4)..), less 32.
                    let g = s / 4;
                    let low = byte_u(load(t.add(Q3K_SCALES + 32 * (g % 2) + lanes)), s % 4);
                    let low = v128_and(u32x4_shr(low, 4 * (g / 2) as u32), u32x4_splat(0xf));
                    let high = byte_u(load(t.add(Q3K_SCALES + 64 + lanes)), s % 4);
                    let high = v128_and(u32x4_shr(high, 2 * g as u32), u32x4_splat(3));
                    let sc = i32x4_sub(v128_or(low, u32x4_shl(high, 4)), i32x4_splat(32));
                    for c in 0..C {
                        let centred = i32x4_sub(D::sum(sub[c]), i32x4_splat(4 * bsum(rows[c], b, s)));
                        isum[c] = i32x4_add(isum[c], i32x4_mul(centred, sc));
                    }
                }
            }
            let d = f16x4(t.add(2 * HALF * h));
            for c in 0..C {
                let da = f32x4_splat(da(c));
                acc[c] = f32x4_add(acc[c], f32x4_mul(f32x4_mul(d, da), f32x4_convert_i32x4(isum[c])));
                if K == Q2_K {
                    let dmin = f16x4(t.add(Q2K_DMIN + 2 * HALF * h));
                    acc[c] = f32x4_sub(acc[c], f32x4_mul(f32x4_mul(dmin, da), f32x4_convert_i32x4(msum[c])));
                }
            }
        } else {
            let t = tile.add(b * Q6K_BLOCK);
            let three = u8x16_splat(3);
            let mut isum = [i32x4_splat(0); C];
            for s in 0..16 {
                // Sub-block `s` of 16 values: half `h2` of 128, quarter `qq` (which nibble of
                // which `ql` byte, which `qh` bits), groups `4gg..4gg + 4`.
                let (h2, qq, gg) = (s / 8, s % 8 / 2, s % 2);
                let mut sub = [D::zero(); C];
                for g in 4 * gg..4 * gg + 4 {
                    let (ql, qh) = q6k_quads(h2, g, qq);
                    let l = load(t.add(ql + lanes));
                    let hb = load(t.add(qh + lanes));
                    let lo = if qq < 2 { v128_and(l, low) } else { u8x16_shr(l, 4) };
                    let hi = i8x16_shl(v128_and(u8x16_shr(hb, 2 * qq as u32), three), 4);
                    let q = v128_or(lo, hi);
                    for c in 0..C {
                        sub[c] = D::u7(sub[c], q, a(c, 128 * h2 + 32 * qq + 4 * g));
                    }
                }
                let scale = byte_s(load(t.add(Q6K_SCALES + 32 * (s / 4) + lanes)), s % 4);
                for c in 0..C {
                    let centred = i32x4_sub(D::sum(sub[c]), i32x4_splat(32 * bsum(rows[c], b, s)));
                    isum[c] = i32x4_add(isum[c], i32x4_mul(centred, scale));
                }
            }
            let d = f16x4(t.add(2 * HALF * h));
            for c in 0..C {
                acc[c] = f32x4_add(
                    acc[c],
                    f32x4_mul(f32x4_mul(d, f32x4_splat(da(c))), f32x4_convert_i32x4(isum[c])),
                );
            }
        }
    }
    acc
}
