//! Ternary formats (BitNet b1.58 style): every weight is -1, 0 or +1 times one f16 scale per 256.
//! TQ1_0 packs 5 trits per byte in base 3 (1.69 bpw), TQ2_0 stores 2 bits per trit (2.06 bpw).
//!
//! Decoding repeats ggml's integer tricks (`dequantize_row_tq*_0` in ggml-quants.c) so it is bit
//! for bit ggml's; the dot product against Q8_K is ggml's generic one: an exact integer sum per
//! block, then one f32 scale.

use std::mem::size_of;

use bytemuck::{Pod, Zeroable};
use half::f16;

use super::iquant::{blocks_unaligned, dequantize_blocks};
use super::kquant::BlockQ8K;
use super::{GgmlType, QuantError};

/// TQ1_0, 256 elements in 54 bytes.
/// `qs: [u8; 48]` 5 trits per byte as a base-3 fixed-point fraction (`byte = ceil(t * 256 / 243)`
/// for the 5-digit number `t`): bytes 0..32 give elements 0..160 (digit `n` of byte `m` is element
/// `32 n + m`), bytes 32..48 give elements 160..240 (`160 + 16 n + m`); `qh: [u8; 4]` 4 trits
/// each, elements 240..256 (`240 + 4 n + j`); `d: f16` scale. Value = `(trit - 1) * d`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockTq1_0 {
    pub qs: [u8; 48],
    pub qh: [u8; 4],
    pub d: f16,
}
const _: () = assert!(size_of::<BlockTq1_0>() == 54);

/// TQ2_0, 256 elements in 66 bytes.
/// `qs: [u8; 64]` 2 bits per element: in each half (32 bytes, 128 elements) bits `2l..2l+2` of
/// byte `m` are element `32 l + m`; `d: f16` scale. Value = `(q - 1) * d`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockTq2_0 {
    pub qs: [u8; 64],
    pub d: f16,
}
const _: () = assert!(size_of::<BlockTq2_0>() == 66);

const POW3: [u8; 5] = [1, 3, 9, 27, 81];

/// Trit `n` (0..5, most significant first) of a TQ1_0 byte, as 0, 1 or 2: multiplying by `3^n`
/// (mod 256) shifts the fraction left by `n` digits, and `* 3 >> 8` reads the top digit.
#[inline]
fn trit(byte: u8, n: usize) -> i32 {
    let q = byte.wrapping_mul(POW3[n]);
    i32::from((u16::from(q) * 3) >> 8)
}

/// The 256 trits (0, 1, 2) of a TQ1_0 block, in element order.
pub(crate) fn tq1_trits(b: &BlockTq1_0) -> [i32; 256] {
    let mut t = [0i32; 256];
    let mut k = 0;
    for (bytes, width) in [(&b.qs[..32], 32), (&b.qs[32..], 16)] {
        for n in 0..5 {
            for &byte in bytes.iter().take(width) {
                t[k] = trit(byte, n);
                k += 1;
            }
        }
    }
    for n in 0..4 {
        for &byte in &b.qh {
            t[k] = trit(byte, n);
            k += 1;
        }
    }
    t
}

/// The 256 two-bit codes (0..4) of a TQ2_0 block, in element order.
fn tq2_codes(b: &BlockTq2_0) -> [i32; 256] {
    let mut t = [0i32; 256];
    let mut k = 0;
    for half in b.qs.chunks_exact(32) {
        for l in 0..4 {
            for &byte in half {
                t[k] = i32::from((byte >> (2 * l)) & 3);
                k += 1;
            }
        }
    }
    t
}

fn dequant_tq1_0(b: &BlockTq1_0, y: &mut [f32]) {
    let d = b.d.to_f32();
    for (y, t) in y.iter_mut().zip(tq1_trits(b)) {
        *y = (t - 1) as f32 * d;
    }
}

fn dequant_tq2_0(b: &BlockTq2_0, y: &mut [f32]) {
    let d = b.d.to_f32();
    for (y, q) in y.iter_mut().zip(tq2_codes(b)) {
        *y = (q - 1) as f32 * d;
    }
}

/// Decode whole TQ1_0 / TQ2_0 blocks (lengths already checked by `quant::dequantize`).
pub(crate) fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    match ty {
        GgmlType::TQ1_0 => dequantize_blocks(ty, src, dst, 256, dequant_tq1_0),
        GgmlType::TQ2_0 => dequantize_blocks(ty, src, dst, 256, dequant_tq2_0),
        _ => Err(QuantError::Unsupported { ty, op: "dequantize" }),
    }
}

/// Integer dot of per-element codes (value = code - 1) with one Q8_K block's quants.
#[inline]
fn code_dot(codes: &[i32; 256], y: &BlockQ8K) -> i32 {
    codes.iter().zip(&y.qs).map(|(&c, &q)| (c - 1) * i32::from(q)).sum()
}

/// As ggml `ggml_vec_dot_tq1_0_q8_K_generic`.
fn dot_tq1_0(w: &[u8], act: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in blocks_unaligned::<BlockTq1_0>(w).zip(blocks_unaligned::<BlockQ8K>(act)) {
        let sum = code_dot(&tq1_trits(&x), &y);
        sumf += sum as f32 * (x.d.to_f32() * y.d);
    }
    sumf
}

/// As ggml `ggml_vec_dot_tq2_0_q8_K_generic`.
fn dot_tq2_0(w: &[u8], act: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in blocks_unaligned::<BlockTq2_0>(w).zip(blocks_unaligned::<BlockQ8K>(act)) {
        let sumi = code_dot(&tq2_codes(&x), &y);
        let d = y.d * x.d.to_f32();
        sumf += sumi as f32 * d;
    }
    sumf
}

/// Dot product of a TQ1_0 / TQ2_0 weight row with a Q8_K activation row; lengths already
/// checked by `quant::vec_dot`.
pub(crate) fn vec_dot(ty: GgmlType, w: &[u8], act: &[u8]) -> f32 {
    match ty {
        GgmlType::TQ1_0 => dot_tq1_0(w, act),
        GgmlType::TQ2_0 => dot_tq2_0(w, act),
        // Not reachable through `quant::vec_dot`, which only routes ternary types here.
        _ => f32::NAN,
    }
}

#[cfg(test)]
mod tests {
    use super::super::iquant::test_util::{assert_golden_bit_exact, check_vec_dot, random_f16_scale};
    use super::*;

    #[test]
    fn block_sizes_match_the_type_table() {
        assert_eq!(GgmlType::TQ1_0.block_bytes(), size_of::<BlockTq1_0>());
        assert_eq!(GgmlType::TQ2_0.block_bytes(), size_of::<BlockTq2_0>());
    }

    #[test]
    fn base3_digits_decode_most_significant_first() {
        // Pack the digits (2, 0, 1, 1, 2) as ggml's quantizer does: t = 2*81 + 0*27 + 1*9 + 1*3 + 2
        // = 176, byte = ceil(176 * 256 / 243).
        let byte = (176u32 * 256).div_ceil(243) as u8;
        let digits: Vec<i32> = (0..5).map(|n| trit(byte, n)).collect();
        assert_eq!(digits, [2, 0, 1, 1, 2]);
    }

    #[test]
    fn dequantize_matches_ggml_bit_for_bit() {
        assert_golden_bit_exact(GgmlType::TQ1_0);
        assert_golden_bit_exact(GgmlType::TQ2_0);
    }

    #[test]
    fn vec_dot_matches_f64_dot_of_dequantized_operands() {
        check_vec_dot(GgmlType::TQ1_0, |blk, rng| {
            blk[52..].copy_from_slice(&random_f16_scale(rng))
        });
        check_vec_dot(GgmlType::TQ2_0, |blk, rng| {
            blk[64..].copy_from_slice(&random_f16_scale(rng))
        });
    }
}
