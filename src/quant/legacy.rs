//! The original ggml block formats: 32 values per block, one f16 scale (and for the `_1`
//! variants one f16 minimum), 4, 5 or 8 bits per value. Q8_0 doubles as the activation format
//! the 32-element formats multiply against, so its quantizer reproduces ggml's
//! `quantize_row_q8_0_ref` byte for byte.
//!
//! Each block type decodes to 32 small integers `q` plus `d` (and `m`); then
//! `x = q * d (+ m)` in f32, the exact arithmetic of ggml's `dequantize_row_*` and gguf-py.
//! Blocks are little-endian, as in GGUF files.

use std::mem::size_of;

use bytemuck::{Pod, Zeroable};
use half::f16;

use super::{GgmlType, QuantError};

/// Values per block for every legacy format.
pub const QK: usize = 32;

/// Q4_0: `x = d * (q - 8)`, q in 0..16.
///
/// Layout (18 bytes): `d: f16`, `qs: [u8; 16]` where byte `j` holds value `j` in its low
/// nibble and value `j + 16` in its high nibble.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4_0 {
    pub d: f16,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ4_0>() == 18);

/// Q4_1: `x = d * q + m`, q in 0..16.
///
/// Layout (20 bytes): `d: f16`, `m: f16`, `qs: [u8; 16]` (nibbles as in [`BlockQ4_0`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4_1 {
    pub d: f16,
    pub m: f16,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ4_1>() == 20);

/// Q5_0: `x = d * (q - 16)`, q in 0..32.
///
/// Layout (22 bytes): `d: f16`, `qh: [u8; 4]` (a little-endian u32 whose bit `i` is the fifth
/// bit of value `i`), `qs: [u8; 16]` (low four bits, nibbles as in [`BlockQ4_0`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5_0 {
    pub d: f16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ5_0>() == 22);

/// Q5_1: `x = d * q + m`, q in 0..32.
///
/// Layout (24 bytes): `d: f16`, `m: f16`, `qh: [u8; 4]`, `qs: [u8; 16]` (bits as in
/// [`BlockQ5_0`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5_1 {
    pub d: f16,
    pub m: f16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ5_1>() == 24);

/// Q8_0: `x = d * q`, q in -127..=127 (weights and the activations of 32-element formats).
///
/// Layout (34 bytes): `d: f16`, `qs: [i8; 32]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; QK],
}
const _: () = assert!(size_of::<BlockQ8_0>() == 34);

/// Q8_1: `x = d * q`; `s = d * sum(q)` is a precomputed term for ggml's Q4_1/Q5_1 dot
/// products. Only decoded here (our `_1` dot products take Q8_0 activations).
///
/// Layout (36 bytes): `d: f16`, `s: f16`, `qs: [i8; 32]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8_1 {
    pub d: f16,
    pub s: f16,
    pub qs: [i8; QK],
}
const _: () = assert!(size_of::<BlockQ8_1>() == 36);

/// What the generic decode and dot-product loops need from a block.
trait Legacy: Pod {
    const TYPE: GgmlType;
    /// The scale `d`.
    fn d(&self) -> f32;
    /// The added minimum `m`, for the formats that have one. Kept apart rather than 0.0, because
    /// `-0.0 + 0.0` would flip the sign bit of an exact zero.
    fn m(&self) -> Option<f32> {
        None
    }
    /// The 32 integer values, already offset (Q4_0: -8..8, Q5_0: -16..16).
    fn quants(&self) -> [i32; QK];
}

macro_rules! link_type {
    ($($block:ident => $ty:ident),* $(,)?) => {$(
        impl $block {
            /// The ggml type stored in blocks of this layout.
            pub const TYPE: GgmlType = GgmlType::$ty;
        }
    )*};
}
link_type!(BlockQ4_0 => Q4_0, BlockQ4_1 => Q4_1, BlockQ5_0 => Q5_0, BlockQ5_1 => Q5_1, BlockQ8_0 => Q8_0,
    BlockQ8_1 => Q8_1);

/// 4-bit values: byte `j` holds value `j` (low nibble) and `j + 16` (high nibble).
fn nibbles(qs: &[u8; QK / 2]) -> [i32; QK] {
    let mut q = [0i32; QK];
    for (j, &b) in qs.iter().enumerate() {
        q[j] = i32::from(b & 0x0F);
        q[j + QK / 2] = i32::from(b >> 4);
    }
    q
}

/// 5-bit values: nibbles plus bit `i` of the little-endian `qh` as bit 4 of value `i`.
fn five_bits(qh: &[u8; 4], qs: &[u8; QK / 2]) -> [i32; QK] {
    let high = u32::from_le_bytes(*qh);
    let mut q = nibbles(qs);
    for (i, v) in q.iter_mut().enumerate() {
        *v |= (((high >> i) & 1) << 4) as i32;
    }
    q
}

impl Legacy for BlockQ4_0 {
    const TYPE: GgmlType = GgmlType::Q4_0;
    fn d(&self) -> f32 {
        self.d.to_f32()
    }
    fn quants(&self) -> [i32; QK] {
        nibbles(&self.qs).map(|q| q - 8)
    }
}

impl Legacy for BlockQ4_1 {
    const TYPE: GgmlType = GgmlType::Q4_1;
    fn d(&self) -> f32 {
        self.d.to_f32()
    }
    fn m(&self) -> Option<f32> {
        Some(self.m.to_f32())
    }
    fn quants(&self) -> [i32; QK] {
        nibbles(&self.qs)
    }
}

impl Legacy for BlockQ5_0 {
    const TYPE: GgmlType = GgmlType::Q5_0;
    fn d(&self) -> f32 {
        self.d.to_f32()
    }
    fn quants(&self) -> [i32; QK] {
        five_bits(&self.qh, &self.qs).map(|q| q - 16)
    }
}

impl Legacy for BlockQ5_1 {
    const TYPE: GgmlType = GgmlType::Q5_1;
    fn d(&self) -> f32 {
        self.d.to_f32()
    }
    fn m(&self) -> Option<f32> {
        Some(self.m.to_f32())
    }
    fn quants(&self) -> [i32; QK] {
        five_bits(&self.qh, &self.qs)
    }
}

impl Legacy for BlockQ8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;
    fn d(&self) -> f32 {
        self.d.to_f32()
    }
    fn quants(&self) -> [i32; QK] {
        self.qs.map(i32::from)
    }
}

impl Legacy for BlockQ8_1 {
    const TYPE: GgmlType = GgmlType::Q8_1;
    fn d(&self) -> f32 {
        self.d.to_f32()
    }
    fn quants(&self) -> [i32; QK] {
        self.qs.map(i32::from)
    }
}

/// Decode `src` into `dst`; lengths were checked by [`super::dequantize`].
pub(crate) fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    use GgmlType::*;
    match ty {
        Q4_0 => decode::<BlockQ4_0>(src, dst),
        Q4_1 => decode::<BlockQ4_1>(src, dst),
        Q5_0 => decode::<BlockQ5_0>(src, dst),
        Q5_1 => decode::<BlockQ5_1>(src, dst),
        Q8_0 => decode::<BlockQ8_0>(src, dst),
        Q8_1 => decode::<BlockQ8_1>(src, dst),
        _ => Err(QuantError::Unsupported { ty, op: "dequantize" }),
    }
}

fn decode<B: Legacy>(src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    let blocks = super::cast_blocks::<B>(B::TYPE, src)?;
    for (block, out) in blocks.iter().zip(dst.chunks_exact_mut(QK)) {
        let d = block.d();
        let q = block.quants();
        match block.m() {
            Some(m) => out.iter_mut().zip(q).for_each(|(y, q)| *y = q as f32 * d + m),
            None => out.iter_mut().zip(q).for_each(|(y, q)| *y = q as f32 * d),
        }
    }
    Ok(())
}

/// Dot product of a weight row with Q8_0 activations (lengths checked by [`super::vec_dot`]).
/// Returns NaN for a type this family has no dot product for (the caller never passes one).
pub(crate) fn vec_dot(ty: GgmlType, w: &[u8], act: &[u8]) -> f32 {
    use GgmlType::*;
    match ty {
        Q4_0 => dot::<BlockQ4_0>(w, act),
        Q4_1 => dot::<BlockQ4_1>(w, act),
        Q5_0 => dot::<BlockQ5_0>(w, act),
        Q5_1 => dot::<BlockQ5_1>(w, act),
        Q8_0 => dot::<BlockQ8_0>(w, act),
        _ => f32::NAN,
    }
}

/// Per block: exact integer sum `Σ q_w·q_a`, then one f32 scale, as ggml's `vec_dot_*_q8_0`.
/// The `_1` formats add `m · d_a · Σ q_a` (ggml reads that sum from Q8_1's `s`; Q8_0 has no such
/// field, so it is summed here, which is exact where ggml's f16 `s` is rounded).
fn dot<B: Legacy>(w: &[u8], act: &[u8]) -> f32 {
    // Blocks are read unaligned: this function has no error path, and slices taken from a
    // file or a byte buffer need not be aligned for f16.
    let weights = w.chunks_exact(size_of::<B>()).map(bytemuck::pod_read_unaligned::<B>);
    let acts = act
        .chunks_exact(size_of::<BlockQ8_0>())
        .map(bytemuck::pod_read_unaligned::<BlockQ8_0>);
    let mut sum = 0f32;
    for (x, y) in weights.zip(acts) {
        let sumi: i32 = x.quants().iter().zip(y.qs).map(|(&a, b)| a * i32::from(b)).sum();
        let dy = y.d.to_f32();
        sum += (x.d() * dy) * sumi as f32;
        if let Some(m) = x.m() {
            let sum_y: i32 = y.qs.iter().map(|&b| i32::from(b)).sum();
            sum += m * (dy * sum_y as f32);
        }
    }
    sum
}

/// Append `src` (whole blocks of 32) as Q8_0 blocks, byte-identical to ggml's
/// `quantize_row_q8_0_ref`: `d = amax / 127`, `q = roundf(x / d)` (ties away from zero), `d`
/// stored as f16 rounded to nearest-even. This is the rule of gguf files and of `Q8_0.bin`
/// (only the golden test needs it: the engine never writes Q8_0 files).
#[cfg(test)]
pub(crate) fn quantize_q8_0_ref(src: &[f32], dst: &mut Vec<u8>) {
    let id = |amax: f32| {
        let d = amax / 127.0;
        if d != 0.0 {
            1.0 / d
        } else {
            0.0
        }
    };
    quantize_q8_0_with(src, dst, id, f32::round);
}

/// Append `src` as Q8_0 blocks the way ggml's x86 CPU backend quantizes activations at run
/// time (`quantize_row_q8_0`, AVX/AVX2): `q = round_ties_even(x · (127 / amax))`. The
/// multiplier differs from the reference's `1 / d` in the last bit for some `amax`, and ties go
/// to even, so this, not the reference, is what llama.cpp's matmuls see.
pub(crate) fn quantize_q8_0(src: &[f32], dst: &mut Vec<u8>) {
    let id = |amax: f32| if amax != 0.0 { 127.0 / amax } else { 0.0 };
    quantize_q8_0_with(src, dst, id, f32::round_ties_even);
}

/// [`quantize_q8_0`] into blocks in place: `src` holds `dst.len()` whole blocks of 32 values
/// (the rule llama.cpp's KV cache is stored with on x86, so the q8_0 KV cache uses it).
pub fn quantize_q8_0_blocks(src: &[f32], dst: &mut [BlockQ8_0]) {
    for (x, block) in src.chunks_exact(QK).zip(dst) {
        *block = q8_0_block(
            x,
            |amax| if amax != 0.0 { 127.0 / amax } else { 0.0 },
            f32::round_ties_even,
        );
    }
}

/// Q8_0 blocks with `d = amax / 127` (stored as f16), `q = round(x · id(amax))`.
fn quantize_q8_0_with(src: &[f32], dst: &mut Vec<u8>, id: impl Fn(f32) -> f32, round: fn(f32) -> f32) {
    dst.reserve(src.len() / QK * size_of::<BlockQ8_0>());
    for x in src.chunks_exact(QK) {
        dst.extend_from_slice(bytemuck::bytes_of(&q8_0_block(x, &id, round)));
    }
}

/// One block of 32 values `x`: `d = amax / 127` (stored as f16), `q = round(x · id(amax))`.
fn q8_0_block(x: &[f32], id: impl Fn(f32) -> f32, round: fn(f32) -> f32) -> BlockQ8_0 {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let id = id(amax);
    let mut block = BlockQ8_0 {
        d: f16::from_f32(amax / 127.0),
        qs: [0; QK],
    };
    for (q, &v) in block.qs.iter_mut().zip(x) {
        // |v * id| <= 127 up to rounding; `as` saturates, so nothing can wrap.
        *q = round(v * id) as i8;
    }
    block
}
