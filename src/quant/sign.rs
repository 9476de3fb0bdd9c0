//! Q1_0 (GGML type 41): one sign bit per weight and one f16 scale per 128 weights (1.125 bits
//! per weight). Every value of a block is `+d` or `-d`: llama.cpp's quantizer keeps the sign of
//! each weight and sets `d` to the block's mean absolute value.
//!
//! Decoding is ggml's `dequantize_row_q1_0`; the dot product against Q8_0 activations (four
//! Q8_0 blocks per Q1_0 block) is ggml's generic `ggml_vec_dot_q1_0_q8_0`: an exact integer sum
//! per Q8_0 block, scaled by its `d` into an f32 block sum, which is then scaled by the weight's
//! `d`.

use std::mem::size_of;

use bytemuck::{Pod, Zeroable};
use half::f16;

use super::iquant::{blocks_unaligned, dequantize_blocks};
use super::legacy::{BlockQ8_0, QK};
use super::{GgmlType, QuantError};

/// Values per Q1_0 block.
pub const QK1_0: usize = 128;

/// Q1_0, 128 values in 18 bytes: `d: f16`, `qs: [u8; 16]` where bit `j % 8` of byte `j / 8` is
/// set when value `j` is `+d` and clear when it is `-d`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ1_0 {
    pub d: f16,
    pub qs: [u8; QK1_0 / 8],
}
const _: () = assert!(size_of::<BlockQ1_0>() == 18);

/// The sign of value `j` of a block: +1 or -1.
#[inline]
fn sign(qs: &[u8; QK1_0 / 8], j: usize) -> i32 {
    if (qs[j / 8] >> (j % 8)) & 1 == 1 {
        1
    } else {
        -1
    }
}

fn dequant_q1_0(b: &BlockQ1_0, y: &mut [f32]) {
    let d = b.d.to_f32();
    for (j, v) in y.iter_mut().enumerate() {
        *v = if sign(&b.qs, j) > 0 { d } else { -d };
    }
}

/// Decode `src` into `dst`; lengths were checked by [`super::dequantize`].
pub(crate) fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    match ty {
        GgmlType::Q1_0 => dequantize_blocks(ty, src, dst, QK1_0, dequant_q1_0),
        _ => Err(QuantError::Unsupported { ty, op: "dequantize" }),
    }
}

/// As ggml's `ggml_vec_dot_q1_0_q8_0_generic`: per Q8_0 block `d_a · Σ ±q_a` (an exact integer
/// sum), the four summed in f32, times `d_w`, accumulated in f32.
fn dot_q1_0(w: &[u8], act: &[u8]) -> f32 {
    let acts: Vec<BlockQ8_0> = blocks_unaligned::<BlockQ8_0>(act).collect();
    let mut sumf = 0f32;
    for (x, ys) in blocks_unaligned::<BlockQ1_0>(w).zip(acts.chunks_exact(QK1_0 / QK)) {
        let mut sumi = 0f32;
        for (k, y) in ys.iter().enumerate() {
            let s: i32 = (0..QK).map(|j| sign(&x.qs, k * QK + j) * i32::from(y.qs[j])).sum();
            sumi += y.d.to_f32() * s as f32;
        }
        sumf += x.d.to_f32() * sumi;
    }
    sumf
}

/// Dot product of a weight row with Q8_0 activations (lengths checked by [`super::vec_dot`]).
pub(crate) fn vec_dot(ty: GgmlType, w: &[u8], act: &[u8]) -> f32 {
    match ty {
        GgmlType::Q1_0 => dot_q1_0(w, act),
        // Not reachable through `quant::vec_dot`, which only routes Q1_0 here.
        _ => f32::NAN,
    }
}

#[cfg(test)]
mod tests {
    use super::super::iquant::test_util::{assert_golden_bit_exact, check_vec_dot, random_f16_scale};
    use super::*;

    #[test]
    fn block_size_matches_the_type_table() {
        assert_eq!(GgmlType::Q1_0.block_bytes(), size_of::<BlockQ1_0>());
        assert_eq!(GgmlType::Q1_0.block_size(), QK1_0);
    }

    /// Bit `j % 8` of byte `j / 8`, least significant first, as ggml packs it.
    #[test]
    fn bits_are_read_least_significant_first() {
        let mut b = BlockQ1_0 {
            d: f16::from_f32(0.5),
            qs: [0; 16],
        };
        b.qs[0] = 0b0000_0101;
        b.qs[15] = 0b1000_0000;
        let mut y = [0f32; QK1_0];
        dequant_q1_0(&b, &mut y);
        let plus: Vec<usize> = (0..QK1_0).filter(|&j| y[j] > 0.0).collect();
        assert_eq!(plus, [0, 2, 127]);
        assert!(y.iter().all(|v| v.abs() == 0.5));
    }

    #[test]
    fn dequantize_matches_ggml_bit_for_bit() {
        assert_golden_bit_exact(GgmlType::Q1_0);
    }

    #[test]
    fn vec_dot_matches_f64_dot_of_dequantized_operands() {
        check_vec_dot(GgmlType::Q1_0, |blk, rng| {
            blk[..2].copy_from_slice(&random_f16_scale(rng))
        });
    }
}
