//! 4-bit float formats with shared power-of-two-ish scales: MXFP4 (OCP microscaling, E2M1
//! values with one E8M0 scale per 32) and NVFP4 (E2M1 values with one UE4M3 scale per 16).
//!
//! Both use ggml's doubled E2M1 table (`KVALUES_FP4`, integers -12..12) and halve the scale to
//! compensate, exactly as ggml does, so dequantization is bit for bit ggml's and the dot product
//! can sum integers. Activations are Q8_0 blocks; an NVFP4 block (64 elements) meets two of them.

use std::mem::size_of;

use bytemuck::{Pod, Zeroable};

use super::iquant::{blocks_unaligned, dequantize_blocks};
use super::iquant_grids::KVALUES_FP4;
use super::legacy::BlockQ8_0;
use super::{GgmlType, QuantError};

/// MXFP4, 32 elements in 17 bytes (4.25 bpw).
/// `e: u8` E8M0 shared exponent (scale `2^(e - 127)`); `qs: [u8; 16]`: the low nibble of byte `j`
/// is element `j`, the high nibble element `j + 16`, each an E2M1 code.
/// Value = `2^(e - 128) * KVALUES_FP4[code]`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockMxfp4 {
    pub e: u8,
    pub qs: [u8; 16],
}
const _: () = assert!(size_of::<BlockMxfp4>() == 17);

/// NVFP4, 64 elements in 36 bytes (4.5 bpw).
/// `d: [u8; 4]` UE4M3 scales, one per 16 elements; `qs: [u8; 32]`, 8 bytes per 16 elements: the
/// low nibble of byte `j` of a sub-block is its element `j`, the high nibble element `j + 8`,
/// each an E2M1 code. Value = `ue4m3(d) / 2 * KVALUES_FP4[code]`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockNvfp4 {
    pub d: [u8; 4],
    pub qs: [u8; 32],
}
const _: () = assert!(size_of::<BlockNvfp4>() == 36);

/// `2^(k)` for an exponent in the normal f32 range, built from its bits (exact, like `ldexpf`).
#[inline]
fn pow2(k: i32) -> f32 {
    debug_assert!((-126..=127).contains(&k));
    f32::from_bits(((k + 127) as u32) << 23)
}

/// Half an E8M0 scale, `2^(e - 128)` (ggml `GGML_E8M0_TO_FP32_HALF`), subnormal for `e < 2`.
#[inline]
fn e8m0_half(e: u8) -> f32 {
    if e < 2 {
        f32::from_bits(0x0020_0000 << e)
    } else {
        f32::from_bits(u32::from(e - 1) << 23)
    }
}

/// Half a UE4M3 scale (ggml `ggml_ue4m3_to_fp32`): 4 exponent bits (bias 7), 3 mantissa bits;
/// bit 7 is ignored, `0x00` and `0x7f` decode to zero.
#[inline]
fn ue4m3_half(x: u8) -> f32 {
    if x == 0 || x == 0x7f {
        return 0.0;
    }
    let exp = i32::from((x >> 3) & 0xf);
    let man = f32::from(x & 7);
    let raw = if exp == 0 {
        man * pow2(-9)
    } else {
        (1.0 + man / 8.0) * pow2(exp - 7)
    };
    raw * 0.5
}

#[inline]
fn kv(code: u8) -> i32 {
    i32::from(KVALUES_FP4[usize::from(code & 0xf)])
}

fn dequant_mxfp4(b: &BlockMxfp4, y: &mut [f32]) {
    let d = e8m0_half(b.e);
    for (j, &q) in b.qs.iter().enumerate() {
        y[j] = kv(q) as f32 * d;
        y[j + 16] = kv(q >> 4) as f32 * d;
    }
}

fn dequant_nvfp4(b: &BlockNvfp4, y: &mut [f32]) {
    for (s, y) in y.chunks_exact_mut(16).enumerate() {
        let d = ue4m3_half(b.d[s]);
        for (j, &q) in b.qs[8 * s..8 * s + 8].iter().enumerate() {
            y[j] = kv(q) as f32 * d;
            y[j + 8] = kv(q >> 4) as f32 * d;
        }
    }
}

/// Decode whole MXFP4 / NVFP4 blocks (lengths already checked by `quant::dequantize`).
pub(crate) fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    match ty {
        GgmlType::MXFP4 => dequantize_blocks(ty, src, dst, 32, dequant_mxfp4),
        GgmlType::NVFP4 => dequantize_blocks(ty, src, dst, 64, dequant_nvfp4),
        _ => Err(QuantError::Unsupported { ty, op: "dequantize" }),
    }
}

/// As ggml `ggml_vec_dot_mxfp4_q8_0_generic`.
fn dot_mxfp4(w: &[u8], act: &[u8]) -> f32 {
    let mut sumf = 0.0f32;
    for (x, y) in blocks_unaligned::<BlockMxfp4>(w).zip(blocks_unaligned::<BlockQ8_0>(act)) {
        let d = y.d.to_f32() * e8m0_half(x.e);
        let (mut sumi1, mut sumi2) = (0i32, 0i32);
        for (j, &q) in x.qs.iter().enumerate() {
            sumi1 += i32::from(y.qs[j]) * kv(q);
            sumi2 += i32::from(y.qs[j + 16]) * kv(q >> 4);
        }
        sumf += d * (sumi1 + sumi2) as f32;
    }
    sumf
}

/// As ggml `ggml_vec_dot_nvfp4_q8_0_generic`: sub-blocks 0, 1 meet the first Q8_0 block, 2, 3
/// the second.
fn dot_nvfp4(w: &[u8], act: &[u8]) -> f32 {
    let pair = 2 * size_of::<BlockQ8_0>();
    let mut sumf = 0.0f32;
    for (x, ys) in blocks_unaligned::<BlockNvfp4>(w).zip(act.chunks_exact(pair)) {
        let (y0, y1) = ys.split_at(size_of::<BlockQ8_0>());
        let ys: [BlockQ8_0; 2] = [bytemuck::pod_read_unaligned(y0), bytemuck::pod_read_unaligned(y1)];
        for s in 0..4 {
            let d = ue4m3_half(x.d[s]);
            let y = &ys[s / 2];
            let off = (s % 2) * 16;
            let dy = y.d.to_f32();
            let (mut lo, mut hi) = (0i32, 0i32);
            for (j, &q) in x.qs[8 * s..8 * s + 8].iter().enumerate() {
                lo += i32::from(y.qs[off + j]) * kv(q);
                hi += i32::from(y.qs[off + j + 8]) * kv(q >> 4);
            }
            sumf += dy * d * (lo + hi) as f32;
        }
    }
    sumf
}

/// Dot product of an MXFP4 / NVFP4 weight row with a Q8_0 activation row; lengths already
/// checked by `quant::vec_dot`.
pub(crate) fn vec_dot(ty: GgmlType, w: &[u8], act: &[u8]) -> f32 {
    match ty {
        GgmlType::MXFP4 => dot_mxfp4(w, act),
        GgmlType::NVFP4 => dot_nvfp4(w, act),
        // Not reachable through `quant::vec_dot`, which only routes FP4 types here.
        _ => f32::NAN,
    }
}

#[cfg(test)]
mod tests {
    use super::super::iquant::test_util::{assert_golden_bit_exact, check_vec_dot};
    use super::*;
    use rand::Rng;

    #[test]
    fn block_sizes_match_the_type_table() {
        assert_eq!(GgmlType::MXFP4.block_bytes(), size_of::<BlockMxfp4>());
        assert_eq!(GgmlType::NVFP4.block_bytes(), size_of::<BlockNvfp4>());
    }

    #[test]
    fn scale_decoding_follows_the_ocp_and_nvidia_definitions() {
        // E8M0: 2^(e-127); halved here.
        assert_eq!(e8m0_half(127), 0.5);
        assert_eq!(e8m0_half(130), 4.0);
        assert_eq!(e8m0_half(1), 2f64.powi(-127) as f32);
        assert_eq!(e8m0_half(0), 2f64.powi(-128) as f32);
        // UE4M3: 0x38 = exponent 7, mantissa 0 = 1.0; 0x7e = 448 (largest finite E4M3); halved.
        assert_eq!(ue4m3_half(0x38), 0.5);
        assert_eq!(ue4m3_half(0x7e), 224.0);
        assert_eq!(ue4m3_half(0x01), 2f32.powi(-9) * 0.5);
        assert_eq!(ue4m3_half(0x3d), 1.625 * 0.5);
        // E2M1 doubled: 0.5 -> 1, 6.0 -> 12, sign bit 8.
        assert_eq!(kv(0x1), 1);
        assert_eq!(kv(0x7), 12);
        assert_eq!(kv(0xf), -12);
    }

    #[test]
    fn dequantize_matches_ggml_bit_for_bit() {
        assert_golden_bit_exact(GgmlType::MXFP4);
        assert_golden_bit_exact(GgmlType::NVFP4);
    }

    #[test]
    fn vec_dot_matches_f64_dot_of_dequantized_operands() {
        check_vec_dot(GgmlType::MXFP4, |blk, rng| blk[0] = rng.random_range(118..136));
        // Any UE4M3 byte decodes to a finite normal scale, so random scales are fine as they are.
        check_vec_dot(GgmlType::NVFP4, |_, _| {});
    }
}
