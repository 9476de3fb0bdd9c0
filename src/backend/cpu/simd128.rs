//! WebAssembly SIMD128 dot products of quantized weight rows with quantized activation rows:
//! the kernels of the browser's CPU path (wasm has no run-time feature detection: a build
//! with `+simd128` uses them, one without does not compile this module).
//!
//! They cover the formats the real models spend their bytes on (Q8_0 embeddings and heads,
//! Q5_0/Q4_0 matrices, Q4_K and Q6_K), against the activation formats ggml pairs them with
//! (Q8_0, Q8_K). The arithmetic is ggml's: integer products summed per block (or per scaled
//! sub-block), one float multiply per block. Every function here has its slow twin in
//! [`crate::quant::vec_dot`]; `web/tests/kernels.rs` compares them on the golden fixtures'
//! matrices in Node.
//!
//! Widening i8 to i16 and `i32x4.dot_i16x8_s` (pmaddwd) does the multiply-adds; 128-bit
//! vectors hold 16 values, so a 32-value block is two loads per operand.

use core::arch::wasm32::*;

use half::f16;

use crate::quant::GgmlType;

/// Bytes of a Q8_0 block (f16 scale + 32 i8) and of a Q8_K block (f32 scale, 256 i8, 16 i16
/// sums).
const Q8_0_BYTES: usize = 34;
const Q8_K_BYTES: usize = 292;

/// Whether [`dot`] covers weights of type `ty`.
pub fn supports(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q8_0 | GgmlType::Q5_0 | GgmlType::Q4_0 | GgmlType::Q4_K | GgmlType::Q6_K
    )
}

/// The dot product of weight row `w` (`k` values of `ty`, whole blocks) and activation row `a`
/// (the same `k` values in `ty.vec_dot_type()` blocks); `None` for a type [`supports`] refuses
/// or rows of the wrong length.
pub fn dot(ty: GgmlType, k: usize, w: &[u8], a: &[u8]) -> Option<f32> {
    let nb = k / ty.block_size();
    if !k.is_multiple_of(ty.block_size()) || w.len() != nb * ty.block_bytes() {
        return None;
    }
    let act_bytes = match ty.vec_dot_type() {
        GgmlType::Q8_0 => Q8_0_BYTES,
        GgmlType::Q8_K => Q8_K_BYTES,
        _ => return None,
    };
    if a.len() != nb * act_bytes {
        return None;
    }
    // SAFETY: the lengths were checked above: each kernel reads exactly `nb` whole blocks of
    // `w` and of `a`.
    unsafe {
        Some(match ty {
            GgmlType::Q8_0 => dot_q8_0(nb, w.as_ptr(), a.as_ptr()),
            GgmlType::Q5_0 => dot_q5_0(nb, w.as_ptr(), a.as_ptr()),
            GgmlType::Q4_0 => dot_q4_0(nb, w.as_ptr(), a.as_ptr()),
            GgmlType::Q4_K => dot_q4_k(nb, w.as_ptr(), a.as_ptr()),
            GgmlType::Q6_K => dot_q6_k(nb, w.as_ptr(), a.as_ptr()),
            _ => return None,
        })
    }
}

#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    f16::from_le_bytes([*p, *p.add(1)]).to_f32()
}

#[inline(always)]
unsafe fn f32_at(p: *const u8) -> f32 {
    f32::from_le_bytes([*p, *p.add(1), *p.add(2), *p.add(3)])
}

/// Σ w·a over 16 signed bytes each, as four i32 partial sums.
#[inline(always)]
fn dot16(w: v128, a: v128) -> v128 {
    let lo = i32x4_dot_i16x8(i16x8_extend_low_i8x16(w), i16x8_extend_low_i8x16(a));
    let hi = i32x4_dot_i16x8(i16x8_extend_high_i8x16(w), i16x8_extend_high_i8x16(a));
    i32x4_add(lo, hi)
}

/// Σ w·a over 32 signed bytes given as two vectors each.
#[inline(always)]
fn dot32(w0: v128, w1: v128, a: *const u8) -> v128 {
    // SAFETY (of the loads): callers pass `a` with 32 readable bytes.
    let (a0, a1) = unsafe { (v128_load(a as *const v128), v128_load(a.add(16) as *const v128)) };
    i32x4_add(dot16(w0, a0), dot16(w1, a1))
}

/// The sum of the four lanes of a float vector.
#[inline(always)]
fn hsum_f32(v: v128) -> f32 {
    f32x4_extract_lane::<0>(v) + f32x4_extract_lane::<1>(v) + f32x4_extract_lane::<2>(v) + f32x4_extract_lane::<3>(v)
}

/// The sum of the four lanes of an integer vector.
#[inline(always)]
fn hsum_i32(v: v128) -> i32 {
    i32x4_extract_lane::<0>(v)
        .wrapping_add(i32x4_extract_lane::<1>(v))
        .wrapping_add(i32x4_extract_lane::<2>(v))
        .wrapping_add(i32x4_extract_lane::<3>(v))
}

/// `acc + sumi · scale` in four float lanes (one block's integer sums times its scale).
#[inline(always)]
fn fma_block(acc: v128, sumi: v128, scale: f32) -> v128 {
    f32x4_add(acc, f32x4_mul(f32x4_convert_i32x4(sumi), f32x4_splat(scale)))
}

/// Q8_0 × Q8_0: blocks of `d: f16, qs: [i8; 32]`.
unsafe fn dot_q8_0(nb: usize, w: *const u8, a: *const u8) -> f32 {
    let mut acc = f32x4_splat(0.0);
    for i in 0..nb {
        let (wb, ab) = (w.add(i * Q8_0_BYTES), a.add(i * Q8_0_BYTES));
        let w0 = v128_load(wb.add(2) as *const v128);
        let w1 = v128_load(wb.add(18) as *const v128);
        acc = fma_block(acc, dot32(w0, w1, ab.add(2)), f16_at(wb) * f16_at(ab));
    }
    hsum_f32(acc)
}

/// The 32 bytes `0x10` where bit `i` of `qh` is set (value `i` of a Q5_0 block has a fifth
/// bit), as two vectors for values 0..16 and 16..32.
#[inline(always)]
fn q5_high_bits(qh: u32) -> (v128, v128) {
    let v = u32x4_splat(qh);
    let bits = u8x16(1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128);
    let spread = |b0: u8, b1: u8| {
        let bytes = u8x16_swizzle(v, u8x16(b0, b0, b0, b0, b0, b0, b0, b0, b1, b1, b1, b1, b1, b1, b1, b1));
        v128_and(u8x16_ne(v128_and(bytes, bits), u8x16_splat(0)), u8x16_splat(0x10))
    };
    (spread(0, 1), spread(2, 3))
}

/// Q5_0 × Q8_0: blocks of `d: f16, qh: [u8; 4], qs: [u8; 16]`, value `j` the low nibble of
/// `qs[j]` (`j < 16`) or the high nibble of `qs[j - 16]`, with bit `j` of `qh` above, minus 16.
unsafe fn dot_q5_0(nb: usize, w: *const u8, a: *const u8) -> f32 {
    const BYTES: usize = 22;
    let mut acc = f32x4_splat(0.0);
    let low = u8x16_splat(0x0F);
    let sixteen = i8x16_splat(16);
    for i in 0..nb {
        let (wb, ab) = (w.add(i * BYTES), a.add(i * Q8_0_BYTES));
        let qh = u32::from_le_bytes([*wb.add(2), *wb.add(3), *wb.add(4), *wb.add(5)]);
        let (h0, h1) = q5_high_bits(qh);
        let qs = v128_load(wb.add(6) as *const v128);
        let w0 = i8x16_sub(v128_or(v128_and(qs, low), h0), sixteen);
        let w1 = i8x16_sub(v128_or(u8x16_shr(qs, 4), h1), sixteen);
        acc = fma_block(acc, dot32(w0, w1, ab.add(2)), f16_at(wb) * f16_at(ab));
    }
    hsum_f32(acc)
}

/// Q4_0 × Q8_0: blocks of `d: f16, qs: [u8; 16]`, values the low then the high nibbles, minus 8.
unsafe fn dot_q4_0(nb: usize, w: *const u8, a: *const u8) -> f32 {
    const BYTES: usize = 18;
    let mut acc = f32x4_splat(0.0);
    let low = u8x16_splat(0x0F);
    let eight = i8x16_splat(8);
    for i in 0..nb {
        let (wb, ab) = (w.add(i * BYTES), a.add(i * Q8_0_BYTES));
        let qs = v128_load(wb.add(2) as *const v128);
        let w0 = i8x16_sub(v128_and(qs, low), eight);
        let w1 = i8x16_sub(u8x16_shr(qs, 4), eight);
        acc = fma_block(acc, dot32(w0, w1, ab.add(2)), f16_at(wb) * f16_at(ab));
    }
    hsum_f32(acc)
}

/// The 6-bit scale and min of sub-block `j` of a Q4_K block's packed `scales` (ggml's
/// `get_scale_min_k4`).
#[inline(always)]
fn scale_min_k4(j: usize, s: &[u8; 12]) -> (i32, i32) {
    if j < 4 {
        (i32::from(s[j] & 63), i32::from(s[j + 4] & 63))
    } else {
        (
            i32::from((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4)),
            i32::from((s[j + 4] >> 4) | ((s[j] >> 6) << 4)),
        )
    }
}

/// Q4_K × Q8_K: super-blocks of 256 (`d, dmin: f16, scales: [u8; 12], qs: [u8; 128]`), eight
/// sub-blocks of 32 with 6-bit scales and mins: `x = d·sc·q − dmin·m`. The min term uses the
/// activations' 16-value sums.
unsafe fn dot_q4_k(nb: usize, w: *const u8, a: *const u8) -> f32 {
    const BYTES: usize = 144;
    let low = u8x16_splat(0x0F);
    let mut sum = 0f32;
    for i in 0..nb {
        let (wb, ab) = (w.add(i * BYTES), a.add(i * Q8_K_BYTES));
        let d = f32_at(ab) * f16_at(wb);
        let dmin = f32_at(ab) * f16_at(wb.add(2));
        let mut scales = [0u8; 12];
        core::ptr::copy_nonoverlapping(wb.add(4), scales.as_mut_ptr(), 12);
        let qs = wb.add(16);
        let aq = ab.add(4);
        let bsums = ab.add(4 + 256);
        let mut sumi = i32x4_splat(0);
        let mut mins = 0i32;
        for c in 0..4 {
            // 64 values: the low nibbles of 32 bytes are sub-block 2c, the high ones 2c + 1.
            let q0 = v128_load(qs.add(32 * c) as *const v128);
            let q1 = v128_load(qs.add(32 * c + 16) as *const v128);
            let (sc0, m0) = scale_min_k4(2 * c, &scales);
            let (sc1, m1) = scale_min_k4(2 * c + 1, &scales);
            let lo = dot32(v128_and(q0, low), v128_and(q1, low), aq.add(64 * c));
            let hi = dot32(u8x16_shr(q0, 4), u8x16_shr(q1, 4), aq.add(64 * c + 32));
            sumi = i32x4_add(sumi, i32x4_mul(lo, i32x4_splat(sc0)));
            sumi = i32x4_add(sumi, i32x4_mul(hi, i32x4_splat(sc1)));
            let bs = |j: usize| i32::from(i16::from_le_bytes([*bsums.add(2 * j), *bsums.add(2 * j + 1)]));
            mins += m0 * (bs(4 * c) + bs(4 * c + 1)) + m1 * (bs(4 * c + 2) + bs(4 * c + 3));
        }
        sum += d * hsum_i32(sumi) as f32 - dmin * mins as f32;
    }
    sum
}

/// Q6_K × Q8_K: super-blocks of 256 (`ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16`),
/// sixteen sub-blocks of 16 with signed 8-bit scales, q in 0..64 minus 32 (ggml's layout: each
/// half of 128 values takes 64 bytes of `ql` and 32 of `qh`).
unsafe fn dot_q6_k(nb: usize, w: *const u8, a: *const u8) -> f32 {
    const BYTES: usize = 210;
    let low = u8x16_splat(0x0F);
    let three = u8x16_splat(3);
    let thirty_two = i8x16_splat(32);
    let mut sum = 0f32;
    for i in 0..nb {
        let (wb, ab) = (w.add(i * BYTES), a.add(i * Q8_K_BYTES));
        let d = f32_at(ab) * f16_at(wb.add(208));
        let sc = wb.add(192) as *const i8;
        let aq = ab.add(4);
        let mut sumi = i32x4_splat(0);
        for half in 0..2 {
            let ql = wb.add(64 * half);
            let qh = wb.add(128 + 32 * half);
            let y = aq.add(128 * half);
            for l in [0usize, 16] {
                let is = 8 * half + l / 16;
                let l0 = v128_load(ql.add(l) as *const v128);
                let l32 = v128_load(ql.add(l + 32) as *const v128);
                let h = v128_load(qh.add(l) as *const v128);
                let hb = |shift: u32| i8x16_shl(v128_and(u8x16_shr(h, shift), three), 4);
                let q1 = i8x16_sub(v128_or(v128_and(l0, low), hb(0)), thirty_two);
                let q2 = i8x16_sub(v128_or(v128_and(l32, low), hb(2)), thirty_two);
                let q3 = i8x16_sub(v128_or(u8x16_shr(l0, 4), hb(4)), thirty_two);
                let q4 = i8x16_sub(v128_or(u8x16_shr(l32, 4), hb(6)), thirty_two);
                let ay = |off: usize| v128_load(y.add(l + off) as *const v128);
                let s = |j: usize| i32x4_splat(i32::from(*sc.add(is + j)));
                sumi = i32x4_add(sumi, i32x4_mul(dot16(q1, ay(0)), s(0)));
                sumi = i32x4_add(sumi, i32x4_mul(dot16(q2, ay(32)), s(2)));
                sumi = i32x4_add(sumi, i32x4_mul(dot16(q3, ay(64)), s(4)));
                sumi = i32x4_add(sumi, i32x4_mul(dot16(q4, ay(96)), s(6)));
            }
        }
        sum += d * hsum_i32(sumi) as f32;
    }
    sum
}
