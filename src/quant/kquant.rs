//! The k-quant super-block formats (Q2_K..Q6_K): 256 values per super-block, split into
//! sub-blocks of 16 or 32 values with small integer scales (and mins) under one or two f16
//! super-scales. Q8_K is the activation format they multiply against: f32 scale, 256 i8
//! values and precomputed sums of every 16 values (`bsums`), which turn the min terms of a dot
//! product into 16 multiplications.
//!
//! Every weight block decodes to 256 small integers `q` plus per-sub-block integer scales
//! `sc` (and mins `m`); then `x = (d * sc) * q - (dmin * m)` in f32, the exact arithmetic of
//! ggml's `dequantize_row_*` and gguf-py. Blocks are little-endian, as in GGUF files.

use std::mem::size_of;

use bytemuck::{Pod, Zeroable};
use half::f16;

use super::{GgmlType, QuantError};

/// Values per super-block.
pub const QK_K: usize = 256;

/// Q2_K: 16 sub-blocks of 16, `x = d * sc * q - dmin * m`, q in 0..4, sc and m 4 bits each.
///
/// Layout (84 bytes): `scales: [u8; 16]` (low nibble sc, high nibble m, one byte per
/// sub-block), `qs: [u8; 64]` (2-bit values: for value `i = 128n + 32j + l`, bits `2j..2j+2`
/// of `qs[32n + l]`), `d: f16`, `dmin: f16`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ2K {
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: f16,
    pub dmin: f16,
}
const _: () = assert!(size_of::<BlockQ2K>() == 84);

/// Q3_K: 16 sub-blocks of 16, `x = d * (sc - 32) * q`, q in -4..4, sc 6 bits.
///
/// Layout (110 bytes): `hmask: [u8; 32]` (for value `i`, bit `i / 32` of `hmask[i % 32]`; a
/// clear bit subtracts 4), `qs: [u8; 64]` (low 2 bits, packed as in [`BlockQ2K`]),
/// `scales: [u8; 12]` (sixteen 6-bit scales: low 4 bits of scale `j` are nibble `j / 8` of
/// byte `j % 8`, high 2 bits are bits `2(j / 4)..` of byte `8 + j % 4`), `d: f16`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ3K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; 12],
    pub d: f16,
}
const _: () = assert!(size_of::<BlockQ3K>() == 110);

/// Q4_K: 8 sub-blocks of 32, `x = d * sc * q - dmin * m`, q in 0..16, sc and m 6 bits.
///
/// Layout (144 bytes): `d: f16`, `dmin: f16`, `scales: [u8; 12]` (eight 6-bit scales and
/// mins, see [`scale_min_k4`]), `qs: [u8; 128]` (for value `i = 64c + 32h + l`, nibble `h` of
/// `qs[32c + l]`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; 12],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(size_of::<BlockQ4K>() == 144);

/// Q5_K: as [`BlockQ4K`] with a fifth bit, q in 0..32.
///
/// Layout (176 bytes): `d: f16`, `dmin: f16`, `scales: [u8; 12]`, `qh: [u8; 32]` (for value
/// `i`, bit `i / 32` of `qh[i % 32]`), `qs: [u8; 128]` (low 4 bits as in [`BlockQ4K`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; 12],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(size_of::<BlockQ5K>() == 176);

/// Q6_K: 16 sub-blocks of 16, `x = d * sc * (q - 32)`, q in 0..64, sc a signed byte.
///
/// Layout (210 bytes): `ql: [u8; 128]` (low 4 bits: value `i = 128n + 32g + l` is nibble
/// `g / 2` of `ql[64n + 32(g % 2) + l]`), `qh: [u8; 64]` (high 2 bits: bits `2g..2g+2` of
/// `qh[32n + l]`), `scales: [i8; 16]`, `d: f16`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: f16,
}
const _: () = assert!(size_of::<BlockQ6K>() == 210);

/// Q8_K (activations): `x = d * q`, q in -128..=127, `bsums[j]` = sum of `qs[16j..16j+16]`.
///
/// Layout (292 bytes): `d: f32`, `qs: [i8; 256]`, `bsums: [i16; 16]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}
const _: () = assert!(size_of::<BlockQ8K>() == 292);

macro_rules! link_type {
    ($($block:ident => $ty:ident),* $(,)?) => {$(
        impl $block {
            /// The ggml type stored in blocks of this layout.
            pub const TYPE: GgmlType = GgmlType::$ty;
        }
    )*};
}
link_type!(BlockQ2K => Q2_K, BlockQ3K => Q3_K, BlockQ4K => Q4_K, BlockQ5K => Q5_K, BlockQ6K => Q6_K,
    BlockQ8K => Q8_K);

/// Scale and min of sub-block `j` (0..8) from the 12 packed bytes of Q4_K/Q5_K: sub-blocks
/// 0..4 use the low 6 bits of bytes `j` and `j + 4`; sub-blocks 4..8 take 4 bits from byte
/// `j + 4` and their top 2 bits from the spare top bits of bytes `j - 4` and `j`.
pub fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// What the generic decode and dot-product loops need from a weight super-block.
trait KQuant: Pod {
    const TYPE: GgmlType;
    /// Values per sub-block (16 or 32); `QK_K / SUB` scales are used.
    const SUB: usize;
    /// Super-block scale and min scale (0.0 for the formats without mins).
    fn d(&self) -> (f32, f32);
    /// The 256 integer values, already offset (Q3_K: -4..4, Q6_K: -32..32).
    fn quants(&self) -> [i32; QK_K];
    /// Integer scale and min of each sub-block (Q3_K: scale already minus 32); only the first
    /// `QK_K / SUB` entries are meaningful.
    fn scales(&self) -> ([i32; 16], Option<[i32; 16]>);
}

/// 2-bit fields of Q2_K/Q3_K: value `i = 128n + 32j + l` is bits `2j..2j+2` of `qs[32n + l]`.
fn two_bits(qs: &[u8; QK_K / 4]) -> [i32; QK_K] {
    std::array::from_fn(|i| {
        let (n, j, l) = (i / 128, (i / 32) % 4, i % 32);
        i32::from((qs[32 * n + l] >> (2 * j)) & 3)
    })
}

/// 4-bit fields of Q4_K/Q5_K: value `i = 64c + 32h + l` is nibble `h` of `qs[32c + l]`.
fn four_bits(qs: &[u8; QK_K / 2]) -> [i32; QK_K] {
    std::array::from_fn(|i| {
        let (c, h, l) = (i / 64, (i / 32) % 2, i % 32);
        i32::from((qs[32 * c + l] >> (4 * h)) & 0xF)
    })
}

/// Whether value `i`'s high bit is set in a Q3_K/Q5_K high-bit plane.
fn high_bit(plane: &[u8; QK_K / 8], i: usize) -> bool {
    plane[i % 32] & (1 << (i / 32)) != 0
}

impl KQuant for BlockQ2K {
    const TYPE: GgmlType = GgmlType::Q2_K;
    const SUB: usize = 16;
    fn d(&self) -> (f32, f32) {
        (self.d.to_f32(), self.dmin.to_f32())
    }
    fn quants(&self) -> [i32; QK_K] {
        two_bits(&self.qs)
    }
    fn scales(&self) -> ([i32; 16], Option<[i32; 16]>) {
        (
            self.scales.map(|s| i32::from(s & 0xF)),
            Some(self.scales.map(|s| i32::from(s >> 4))),
        )
    }
}

impl KQuant for BlockQ3K {
    const TYPE: GgmlType = GgmlType::Q3_K;
    const SUB: usize = 16;
    fn d(&self) -> (f32, f32) {
        (self.d.to_f32(), 0.0)
    }
    fn quants(&self) -> [i32; QK_K] {
        let mut q = two_bits(&self.qs);
        for (i, v) in q.iter_mut().enumerate() {
            if !high_bit(&self.hmask, i) {
                *v -= 4;
            }
        }
        q
    }
    fn scales(&self) -> ([i32; 16], Option<[i32; 16]>) {
        let s = &self.scales;
        let sc = std::array::from_fn(|j| {
            let low = (s[j % 8] >> (4 * (j / 8))) & 0xF;
            let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
            i32::from(low | (high << 4)) - 32
        });
        (sc, None)
    }
}

/// The eight 6-bit scales and mins of Q4_K/Q5_K, padded to the common 16-entry shape.
fn k4_scales(packed: &[u8; 12]) -> ([i32; 16], Option<[i32; 16]>) {
    let mut sc = [0; 16];
    let mut m = [0; 16];
    for j in 0..8 {
        let (s, mn) = scale_min_k4(j, packed);
        sc[j] = i32::from(s);
        m[j] = i32::from(mn);
    }
    (sc, Some(m))
}

impl KQuant for BlockQ4K {
    const TYPE: GgmlType = GgmlType::Q4_K;
    const SUB: usize = 32;
    fn d(&self) -> (f32, f32) {
        (self.d.to_f32(), self.dmin.to_f32())
    }
    fn quants(&self) -> [i32; QK_K] {
        four_bits(&self.qs)
    }
    fn scales(&self) -> ([i32; 16], Option<[i32; 16]>) {
        k4_scales(&self.scales)
    }
}

impl KQuant for BlockQ5K {
    const TYPE: GgmlType = GgmlType::Q5_K;
    const SUB: usize = 32;
    fn d(&self) -> (f32, f32) {
        (self.d.to_f32(), self.dmin.to_f32())
    }
    fn quants(&self) -> [i32; QK_K] {
        let mut q = four_bits(&self.qs);
        for (i, v) in q.iter_mut().enumerate() {
            if high_bit(&self.qh, i) {
                *v += 16;
            }
        }
        q
    }
    fn scales(&self) -> ([i32; 16], Option<[i32; 16]>) {
        k4_scales(&self.scales)
    }
}

impl KQuant for BlockQ6K {
    const TYPE: GgmlType = GgmlType::Q6_K;
    const SUB: usize = 16;
    fn d(&self) -> (f32, f32) {
        (self.d.to_f32(), 0.0)
    }
    fn quants(&self) -> [i32; QK_K] {
        std::array::from_fn(|i| {
            let (n, g, l) = (i / 128, (i / 32) % 4, i % 32);
            let low = (self.ql[64 * n + 32 * (g % 2) + l] >> (4 * (g / 2))) & 0xF;
            let high = (self.qh[32 * n + l] >> (2 * g)) & 3;
            i32::from(low | (high << 4)) - 32
        })
    }
    fn scales(&self) -> ([i32; 16], Option<[i32; 16]>) {
        (self.scales.map(i32::from), None)
    }
}

/// Decode `src` into `dst`; lengths were checked by [`super::dequantize`].
pub(crate) fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    use GgmlType::*;
    match ty {
        Q2_K => decode::<BlockQ2K>(src, dst),
        Q3_K => decode::<BlockQ3K>(src, dst),
        Q4_K => decode::<BlockQ4K>(src, dst),
        Q5_K => decode::<BlockQ5K>(src, dst),
        Q6_K => decode::<BlockQ6K>(src, dst),
        Q8_K => {
            let blocks = super::cast_blocks::<BlockQ8K>(ty, src)?;
            for (block, out) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
                for (y, &q) in out.iter_mut().zip(&block.qs) {
                    *y = block.d * f32::from(q);
                }
            }
            Ok(())
        }
        _ => Err(QuantError::Unsupported { ty, op: "dequantize" }),
    }
}

fn decode<B: KQuant>(src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    let blocks = super::cast_blocks::<B>(B::TYPE, src)?;
    for (block, out) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let (d, dmin) = block.d();
        let (sc, m) = block.scales();
        let q = block.quants();
        for (sub, (out, q)) in out.chunks_exact_mut(B::SUB).zip(q.chunks_exact(B::SUB)).enumerate() {
            // ggml rounds the sub-block scale `d * sc` (and `dmin * m`) to f32 first.
            let dl = d * sc[sub] as f32;
            match m {
                Some(m) => {
                    let ml = dmin * m[sub] as f32;
                    out.iter_mut().zip(q).for_each(|(y, &q)| *y = dl * q as f32 - ml);
                }
                None => out.iter_mut().zip(q).for_each(|(y, &q)| *y = dl * q as f32),
            }
        }
    }
    Ok(())
}

/// Dot product of a weight row with Q8_K activations (lengths checked by [`super::vec_dot`]).
/// Returns NaN for a type this family has no dot product for (the caller never passes one).
pub(crate) fn vec_dot(ty: GgmlType, w: &[u8], act: &[u8]) -> f32 {
    use GgmlType::*;
    match ty {
        Q2_K => dot::<BlockQ2K>(w, act),
        Q3_K => dot::<BlockQ3K>(w, act),
        Q4_K => dot::<BlockQ4K>(w, act),
        Q5_K => dot::<BlockQ5K>(w, act),
        Q6_K => dot::<BlockQ6K>(w, act),
        _ => f32::NAN,
    }
}

/// Per super-block, as ggml's `vec_dot_q*_K_q8_K`: the exact integer sum
/// `Σ_sub sc·Σ q·q8`, the min term `Σ_j bsums[j]·m` from the activations' 16-value sums, then
/// `d_w·d_a·isum − dmin_w·d_a·msum` in f32.
fn dot<B: KQuant>(w: &[u8], act: &[u8]) -> f32 {
    // Blocks are read unaligned: this function has no error path, and slices taken from a
    // file or a byte buffer need not be aligned for Q8_K's f32.
    let weights = w.chunks_exact(size_of::<B>()).map(bytemuck::pod_read_unaligned::<B>);
    let acts = act
        .chunks_exact(size_of::<BlockQ8K>())
        .map(bytemuck::pod_read_unaligned::<BlockQ8K>);
    let mut sum = 0f32;
    for (x, y) in weights.zip(acts) {
        let (d, dmin) = x.d();
        let (sc, m) = x.scales();
        let q = x.quants();
        let isum: i32 = q
            .chunks_exact(B::SUB)
            .zip(y.qs.chunks_exact(B::SUB))
            .zip(sc)
            .map(|((q, q8), sc)| sc * q.iter().zip(q8).map(|(&a, &b)| a * i32::from(b)).sum::<i32>())
            .sum();
        sum += d * y.d * isum as f32;
        if let Some(m) = m {
            // bsums cover 16 values; a 32-value sub-block spans two of them.
            let msum: i32 = y
                .bsums
                .iter()
                .enumerate()
                .map(|(j, &b)| i32::from(b) * m[j * 16 / B::SUB])
                .sum();
            sum -= dmin * y.d * msum as f32;
        }
    }
    sum
}

/// Append `src` (whole blocks of 256) as Q8_K blocks, byte-identical to ggml's
/// `quantize_row_q8_K_ref`: the value of largest magnitude `max` (the first one on ties) maps to
/// -127, `q = nearest_int(-127 / max · x)` with ties to even, `d = 1 / iscale` (so `d` has the
/// opposite sign of `max`), and `bsums` holds the sums of each 16 values. An all-zero block is
/// all zeros (ggml leaves its `bsums` unwritten).
pub(crate) fn quantize_q8_k(src: &[f32], dst: &mut Vec<u8>) {
    dst.reserve(src.len() / QK_K * size_of::<BlockQ8K>());
    for x in src.chunks_exact(QK_K) {
        let mut block = BlockQ8K::zeroed();
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax != 0.0 {
            let iscale = -127.0 / max;
            for (q, &v) in block.qs.iter_mut().zip(x) {
                // ggml's nearest_int rounds ties to even; `as` saturates, so nothing can wrap.
                *q = ((iscale * v).round_ties_even() as i32).min(127) as i8;
            }
            for (sum, q) in block.bsums.iter_mut().zip(block.qs.chunks_exact(16)) {
                // 16 values of at most 128 in magnitude fit i16.
                *sum = q.iter().map(|&v| i16::from(v)).sum();
            }
            block.d = 1.0 / iscale;
        }
        dst.extend_from_slice(bytemuck::bytes_of(&block));
    }
}
