//! The formats these kernels read as file rows, each block unpacked once per weight row into
//! signed bytes: the codebook formats (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) and
//! TQ1_0 against Q8_K activations, Q1_0 against Q8_0 ones. Their grid lookups, base-3 digits and
//! sign bits gain nothing from interleaving.
//!
//! A 256-value super-block becomes its 256 signed values, 16 to a vector (grid entries gathered
//! as 64-bit lanes with the sign bits turned into byte masks and applied; TQ1_0's digits read
//! by multiplying each byte by a power of 3), with the odd integer scale of each 16 (1 for
//! TQ1_0); it then meets every activation row of the batch: exact integer sums `Σ ls·Σ w·q8` in
//! i32 lanes, and per block `sumf += (d_w·d_a)·Σ` in f32, the oracle's order
//! ([`crate::quant::vec_dot`]; the 2- and 3-bit formats end scaled by their grids' fixed-point
//! factor). IQ1_S and IQ1_M shift each group of 8 grid values by ±1/8: they unpack as
//! `8·grid ± 1` and their sum ends divided by 8, exactly the oracle's `sumi + 0.125·sumi1`.
//! Relaxed SIMD's byte dot product takes the values plus 64 (unsigned, as it wants them) and
//! `64·Σ ls·bsum` comes off. A Q1_0 block is 128 values of ±1: per Q8_0 block `d_a·Σ ±q8`
//! summed in f32, times `d_w`, as the oracle.
//!
//! Block layouts as in [`crate::quant::iquant`], [`crate::quant::ternary`] and
//! [`crate::quant::sign`] (ggml's `block_iq*`, `block_tq1_0`, `block_q1_0`).

use core::arch::wasm32::*;

use super::lanes::Dot;
use crate::backend::cpu::tile::{Activations, TileOut};
use crate::quant::{GgmlType, IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};

/// A Q8_K activation block: f32 scale, 256 values at [`ACT_VALUES`], then 16 i16 sums.
const ACT_BLOCK: usize = 292;
const ACT_VALUES: usize = 4;
const ACT_BSUMS: usize = 260;
/// A Q8_0 activation block: f16 scale, 32 values.
const Q8_0_BLOCK: usize = super::legacy::ACT_BLOCK;

/// Whether these kernels read weights of `ty`.
pub(super) fn covers(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ1_S | IQ1_M | TQ1_0 | Q1_0
    )
}

/// A super-block unpacked: `[256]` signed values in 16 vectors (IQ1: eight times the grid
/// value plus the delta's sign, so `Σ w·q8` is eight times the oracle's `sumi + sumi1 / 8`),
/// the same plus [`BIAS`] (for byte dot products, which take unsigned weights) and the odd
/// scale of each 16.
struct Unpacked {
    values: [v128; 16],
    biased: [v128; 16],
    scales: [i32; 16],
    /// The block's scale `d_w`.
    d: f32,
}

/// What [`Unpacked::biased`] adds: every value is within ±62 (IQ3_XXS's largest grid value), so
/// the biased ones are within 0..=127; `BIAS·Σ ls·bsum` comes off the sums.
const BIAS: i8 = 64;

/// `out` from weight rows `w` (`out.nw()` file rows of `k` values of `ty`) and Q8_K activations
/// `act`; false (nothing written) where `ty` is not covered or the lengths do not fit.
pub(super) fn tile<D: Dot>(ty: GgmlType, k: usize, w: &[u8], act: &Activations, out: &mut TileOut<'_>) -> bool {
    if ty == GgmlType::Q1_0 {
        return signs::<D>(k, w, act, out);
    }
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
        GgmlType::IQ3_S | GgmlType::IQ1_S | GgmlType::IQ1_M | GgmlType::TQ1_0 => 1.0,
        _ => 0.125,
    };
    let mut u = Unpacked {
        values: [i32x4_splat(0); 16],
        biased: [i32x4_splat(0); 16],
        scales: [0; 16],
        d: 0.0,
    };
    let mut sums = vec![0f32; rows];
    for r in 0..nw {
        sums.fill(0.0);
        for b in 0..nb {
            let block = &w[(r * nb + b) * bb..(r * nb + b + 1) * bb];
            unpack(ty, block, &mut u);
            if D::BYTE_DOT {
                for (v, b) in u.values.iter().zip(&mut u.biased) {
                    *b = i8x16_add(*v, i8x16_splat(BIAS));
                }
            }
            for (a, sum) in sums.iter_mut().enumerate() {
                let ab = &act.bytes[a * act.row_bytes + b * ACT_BLOCK..][..ACT_BLOCK];
                let dy = f32::from_le_bytes([ab[0], ab[1], ab[2], ab[3]]);
                // SAFETY: `ab` holds the block's 256 values at ACT_VALUES and its 16 sums at
                // ACT_BSUMS (a slice of ACT_BLOCK).
                let isum = unsafe { meet::<D>(&u, ab.as_ptr()) };
                if iq1 {
                    // 8·sumi + sumi1 is below 2^24 (256 values of at most 9·127, scales of at
                    // most 15), so as f32 it is exact, and so is the eighth of it: the oracle's
                    // `sumi + 0.125·sumi1`, exactly.
                    *sum += u.d * dy * (isum as f32 * 0.125);
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

/// `Σ ls·Σ w·q8` over the block (`ab`: its Q8_K activation block).
///
/// # Safety
/// `ab` points at a whole Q8_K block ([`ACT_BLOCK`] readable bytes).
#[inline(always)]
unsafe fn meet<D: Dot>(u: &Unpacked, ab: *const u8) -> i32 {
    let q8 = ab.add(ACT_VALUES);
    let mut acc = i32x4_splat(0);
    if D::BYTE_DOT {
        let mut bias = 0i32;
        for g in 0..16 {
            let a = v128_load(q8.add(16 * g) as *const v128);
            let ls = u.scales[g];
            acc = i32x4_add(
                acc,
                i32x4_mul(D::u7_bytes16(i32x4_splat(0), u.biased[g], a), i32x4_splat(ls)),
            );
            let bsum = i16::from_le_bytes([*ab.add(ACT_BSUMS + 2 * g), *ab.add(ACT_BSUMS + 2 * g + 1)]);
            bias += ls * i32::from(bsum);
        }
        return lanes_sum(acc) - i32::from(BIAS) * bias;
    }
    for g in 0..16 {
        let a = v128_load(q8.add(16 * g) as *const v128);
        acc = i32x4_add(
            acc,
            i32x4_mul(D::bytes16(i32x4_splat(0), u.values[g], a), i32x4_splat(u.scales[g])),
        );
    }
    lanes_sum(acc)
}

/// The lane sums of four vectors, as the lanes of one.
#[inline(always)]
fn sums4(a: [v128; 4]) -> v128 {
    let s01 = i32x4_add(
        i32x4_shuffle::<0, 4, 2, 6>(a[0], a[1]),
        i32x4_shuffle::<1, 5, 3, 7>(a[0], a[1]),
    );
    let s23 = i32x4_add(
        i32x4_shuffle::<0, 4, 2, 6>(a[2], a[3]),
        i32x4_shuffle::<1, 5, 3, 7>(a[2], a[3]),
    );
    i32x4_add(
        i32x4_shuffle::<0, 1, 4, 5>(s01, s23),
        i32x4_shuffle::<2, 3, 6, 7>(s01, s23),
    )
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

/// IQ1's grid values (-1, 0, 1) and delta signs (±1) as `8·grid + sign` (see [`Unpacked`]).
#[inline(always)]
fn with_delta(grid: v128, sign: v128) -> v128 {
    i8x16_add(i8x16_shl(grid, 3), sign)
}

/// ggml's `ksigns_iq2xs`: 7 stored sign bits and an eighth that makes the count even.
#[inline(always)]
fn ksign(s7: u32) -> u32 {
    s7 | ((s7.count_ones() & 1) << 7)
}

/// The four groups of 8 in a group of 32.
const GROUPS: [usize; 4] = [0, 1, 2, 3];

/// The odd scale `2s + 1` of a stored `s`.
#[inline(always)]
fn odd(s: u32) -> i32 {
    2 * s as i32 + 1
}

/// Group of 32 `ib` of the 2- and 3-bit formats: its four groups of 8 (magnitudes `g`, sign
/// bytes `s`) and the odd scales of its halves.
#[inline(always)]
fn set_group(u: &mut Unpacked, ib: usize, g: [u64; 4], s: [u32; 4], ls: [i32; 2]) {
    u.values[2 * ib] = signed(g[0], g[1], s[0], s[1]);
    u.values[2 * ib + 1] = signed(g[2], g[3], s[2], s[3]);
    u.scales[2 * ib] = ls[0];
    u.scales[2 * ib + 1] = ls[1];
}

/// Two 4-value IQ3 grid entries as one group of 8 magnitudes.
#[inline(always)]
fn pair(g1: u32, g2: u32) -> u64 {
    u64::from(g1) | (u64::from(g2) << 32)
}

/// The powers of 3 that bring a TQ1_0 byte's digit `n` to the top.
const POW3: [u8; 5] = [1, 3, 9, 27, 81];

/// Digit `n` of each TQ1_0 byte less 1 (-1, 0, 1), `pow` holding `3^n` per byte: the byte times
/// `3^n` mod 256, times 3, over 256 (ggml's rule), in i16 lanes.
#[inline(always)]
fn trits(bytes: v128, pow: v128) -> v128 {
    let digit = |b: v128, p: v128| {
        let shifted = v128_and(i16x8_mul(b, p), u16x8_splat(0xff));
        u16x8_shr(i16x8_mul(shifted, u16x8_splat(3)), 8)
    };
    let lo = digit(u16x8_extend_low_u8x16(bytes), u16x8_extend_low_u8x16(pow));
    let hi = digit(u16x8_extend_high_u8x16(bytes), u16x8_extend_high_u8x16(pow));
    i8x16_sub(u8x16_narrow_i16x8(lo, hi), i8x16_splat(1))
}

/// Q1_0 weights (file rows of `k` values, 18-byte blocks of 128) against Q8_0 activations
/// (34-byte blocks, their `d` as f32 in `act.scales`); false where the lengths do not fit.
fn signs<D: Dot>(k: usize, w: &[u8], act: &Activations, out: &mut TileOut<'_>) -> bool {
    let (rows, nw) = (out.rows(), out.nw());
    let nb = k / 128;
    let fits = k > 0
        && k.is_multiple_of(128)
        && w.len() >= nw * nb * 18
        && act.rows == rows
        && act.row_bytes == nb * 4 * Q8_0_BLOCK
        && act.bytes.len() >= rows * act.row_bytes
        && act.scales.len() >= rows * nb * 4;
    if !fits {
        return false;
    }
    // SAFETY: BITS is 16 bytes.
    let bits = unsafe { v128_load(BITS.as_ptr() as *const v128) };
    let mut sums = vec![0f32; rows];
    let mut v = [i32x4_splat(0); 8];
    for r in 0..nw {
        sums.fill(0.0);
        for b in 0..nb {
            let block = &w[(r * nb + b) * 18..(r * nb + b + 1) * 18];
            let d = half::f16::from_le_bytes([block[0], block[1]]).to_f32();
            // Value j is +1 where bit j % 8 of byte j / 8 is set, else -1.
            for (i, v) in v.iter_mut().enumerate() {
                let spread = u64x2(
                    u64::from(block[2 + 2 * i]) * 0x0101_0101_0101_0101,
                    u64::from(block[3 + 2 * i]) * 0x0101_0101_0101_0101,
                );
                let neg = v128_not(i8x16_eq(v128_and(spread, bits), bits));
                *v = i8x16_sub(v128_xor(i8x16_splat(1), neg), neg);
            }
            for (a, sum) in sums.iter_mut().enumerate() {
                let blk = a * nb * 4 + b * 4;
                let ab = &act.bytes[blk * Q8_0_BLOCK..(blk + 4) * Q8_0_BLOCK];
                // SAFETY: `ab` holds four Q8_0 blocks, 32 values each from byte 2.
                let acc: [v128; 4] = core::array::from_fn(|q| unsafe {
                    let x = ab.as_ptr().add(q * Q8_0_BLOCK + 2);
                    let x0 = v128_load(x as *const v128);
                    let x1 = v128_load(x.add(16) as *const v128);
                    D::bytes16(D::bytes16(i32x4_splat(0), v[2 * q], x0), v[2 * q + 1], x1)
                });
                // The four blocks' integer sums in one vector's lanes, each times its `d_a`
                // (the oracle's products), then summed in the oracle's order.
                let p = f32x4_mul(f32x4_convert_i32x4(sums4(acc)), unsafe {
                    v128_load(act.scales[blk..blk + 4].as_ptr() as *const v128)
                });
                let sumi = f32x4_extract_lane::<0>(p)
                    + f32x4_extract_lane::<1>(p)
                    + f32x4_extract_lane::<2>(p)
                    + f32x4_extract_lane::<3>(p);
                *sum += d * sumi;
            }
        }
        for (a, &s) in sums.iter().enumerate() {
            out.set(a, r, s);
        }
    }
    true
}

/// Unpack one block of `ty` (its file bytes) into `u`.
fn unpack(ty: GgmlType, p: &[u8], u: &mut Unpacked) {
    let byte = |o: usize| u32::from(p[o]);
    let half = |o: usize| u32::from(u16::from_le_bytes([p[o], p[o + 1]]));
    let word = |o: usize| u32::from_le_bytes([p[o], p[o + 1], p[o + 2], p[o + 3]]);
    // One conversion per super-block: `half`'s, as the oracle's.
    let f16 = |bits: u32| half::f16::from_bits(bits as u16).to_f32();
    match ty {
        GgmlType::IQ2_XXS => {
            u.d = f16(half(0));
            for ib in 0..8 {
                let (idx, aux) = (word(2 + 8 * ib), word(6 + 8 * ib));
                let g = |l: usize| IQ2XXS_GRID[((idx >> (8 * l)) & 255) as usize];
                let s = |l: usize| ksign((aux >> (7 * l)) & 127);
                let ls = odd(aux >> 28);
                set_group(u, ib, GROUPS.map(g), GROUPS.map(s), [ls, ls]);
            }
        }
        GgmlType::IQ2_XS => {
            u.d = f16(half(0));
            for ib in 0..8 {
                let q = |l: usize| half(2 + 8 * ib + 2 * l);
                let g = |l: usize| IQ2XS_GRID[(q(l) & 511) as usize];
                let s = |l: usize| ksign(q(l) >> 9);
                let sc = byte(66 + ib);
                set_group(u, ib, GROUPS.map(g), GROUPS.map(s), [odd(sc & 0xf), odd(sc >> 4)]);
            }
        }
        GgmlType::IQ2_S => {
            u.d = f16(half(0));
            for ib in 0..8 {
                let qh = byte(66 + ib);
                let g = |l: usize| IQ2S_GRID[(byte(2 + 4 * ib + l) | ((qh << (8 - 2 * l)) & 0x300)) as usize];
                let s = |l: usize| byte(34 + 4 * ib + l);
                let sc = byte(74 + ib);
                set_group(u, ib, GROUPS.map(g), GROUPS.map(s), [odd(sc & 0xf), odd(sc >> 4)]);
            }
        }
        GgmlType::IQ3_XXS => {
            u.d = f16(half(0));
            for ib in 0..8 {
                let aux = word(66 + 4 * ib);
                let e = |i: usize| IQ3XXS_GRID[p[2 + 8 * ib + i] as usize];
                let g = |l: usize| pair(e(2 * l), e(2 * l + 1));
                let s = |l: usize| ksign((aux >> (7 * l)) & 127);
                let ls = odd(aux >> 28);
                set_group(u, ib, GROUPS.map(g), GROUPS.map(s), [ls, ls]);
            }
        }
        GgmlType::IQ3_S => {
            u.d = f16(half(0));
            for ib in 0..8 {
                let qh = byte(66 + ib);
                let e = |i: usize| IQ3S_GRID[(byte(2 + 8 * ib + i) | (((qh >> i) & 1) << 8)) as usize];
                let g = |l: usize| pair(e(2 * l), e(2 * l + 1));
                let s = |l: usize| byte(74 + 4 * ib + l);
                let ls = odd((byte(106 + ib / 2) >> (4 * (ib % 2))) & 0xf);
                set_group(u, ib, GROUPS.map(g), GROUPS.map(s), [ls, ls]);
            }
        }
        GgmlType::IQ1_S => {
            u.d = f16(half(0));
            for ib in 0..8 {
                let qh = half(34 + 2 * ib);
                let g = |l: usize| IQ1S_GRID[(byte(2 + 4 * ib + l) | (((qh >> (3 * l)) & 7) << 8)) as usize];
                let neg = qh & 0x8000 != 0;
                u.values[2 * ib] = with_delta(u64x2(g(0), g(1)), delta_signs(neg, neg));
                u.values[2 * ib + 1] = with_delta(u64x2(g(2), g(3)), delta_signs(neg, neg));
                let ls = odd((qh >> 12) & 7);
                u.scales[2 * ib] = ls;
                u.scales[2 * ib + 1] = ls;
            }
        }
        GgmlType::TQ1_0 => {
            // SAFETY (of the loads): the block holds 54 bytes: 48 of `qs` from 0, `qh` at 48.
            let (lo, hi, tail) = unsafe {
                (
                    v128_load(p.as_ptr() as *const v128),
                    v128_load(p.as_ptr().add(16) as *const v128),
                    v128_load(p.as_ptr().add(32) as *const v128),
                )
            };
            // Values 32n + m: digit n of byte m < 32; 160 + 16n + m: digit n of byte 32 + m;
            // 240 + 4n + j: digit n of `qh[j]` (the four bytes repeated, a power per lane).
            for (n, &pow) in POW3.iter().enumerate() {
                let pow = u8x16_splat(pow);
                u.values[2 * n] = trits(lo, pow);
                u.values[2 * n + 1] = trits(hi, pow);
                u.values[10 + n] = trits(tail, pow);
            }
            let qh = u32x4_splat(word(48));
            u.values[15] = trits(qh, u8x16(1, 1, 1, 1, 3, 3, 3, 3, 9, 9, 9, 9, 27, 27, 27, 27));
            u.scales = [1; 16];
            u.d = f16(half(52));
        }
        _ => {
            // IQ1_M: the scale words' top nibbles hold the f16 `d`.
            let sc = [0, 1, 2, 3].map(|k| half(48 + 2 * k));
            u.d = f16((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
            for ib in 0..8 {
                let nib = |l: usize| (byte(32 + 2 * ib + l / 2) >> (4 * (l % 2))) & 0xf;
                let g = |l: usize| IQ1S_GRID[(byte(4 * ib + l) | ((nib(l) & 7) << 8)) as usize];
                let neg = |l: usize| nib(l) & 8 != 0;
                u.values[2 * ib] = with_delta(u64x2(g(0), g(1)), delta_signs(neg(0), neg(1)));
                u.values[2 * ib + 1] = with_delta(u64x2(g(2), g(3)), delta_signs(neg(2), neg(3)));
                let w = sc[ib / 2] >> (6 * (ib % 2));
                u.scales[2 * ib] = odd(w & 7);
                u.scales[2 * ib + 1] = odd((w >> 3) & 7);
            }
        }
    }
}
