//! The "i-quants" (IQ1_S .. IQ4_XS): codebook formats whose 4 or 8 values at a time are an index
//! into a fixed grid (tables in `iquant_grids.rs`) plus sign bits, or (IQ4) a non-linear 4-bit level.
//!
//! Dequantization repeats ggml's f32 arithmetic step by step (`dequantize_row_iq*` in
//! ggml-quants.c) so results are bit for bit those of llama.cpp and gguf-py. The dot products
//! follow ggml's generic CPU reference (`ggml_vec_dot_iq*_q8_K_generic`): exact integer sums per
//! sub-block, then one f32 scale per sub-block or block, accumulated in the same order.
//!
//! Multi-byte fields are read as ggml does on little-endian hosts (every target we build for).
//! This file also holds the small block-walking helpers that `fp4.rs` and `ternary.rs` share.

use std::mem::size_of;

use bytemuck::{Pod, Zeroable};
use half::f16;

use super::iquant_grids::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KMASK_IQ2XS, KSIGNS_IQ2XS, KVALUES_IQ4NL,
};
use super::kquant::BlockQ8K;
use super::legacy::BlockQ8_0;
use super::{cast_blocks, GgmlType, QuantError};

/// Elements per super-block of the 256-element formats (`QK_K`).
const QK_K: usize = 256;

/// The IQ1_S / IQ1_M grid offset (`IQ1S_DELTA`, `IQ1M_DELTA` in ggml): grid values are shifted by
/// plus or minus this before scaling.
const IQ1_DELTA: f32 = 0.125;

/// Walk `bytes` block by block, copying each block out so that any alignment works (the dot
/// products cannot report a misaligned slice; the caller has already checked the lengths).
pub(super) fn blocks_unaligned<T: Pod>(bytes: &[u8]) -> impl Iterator<Item = T> + '_ {
    bytes
        .chunks_exact(size_of::<T>())
        .map(bytemuck::pod_read_unaligned::<T>)
}

/// Decode whole blocks of `B` (each `n` elements) from `src` into `dst` with `decode`.
pub(super) fn dequantize_blocks<B: Pod>(
    ty: GgmlType,
    src: &[u8],
    dst: &mut [f32],
    n: usize,
    decode: impl Fn(&B, &mut [f32]),
) -> Result<(), QuantError> {
    let blocks = cast_blocks::<B>(ty, src)?;
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(n)) {
        decode(b, y);
    }
    Ok(())
}

/// `-1.0` when bit `j` of `signs` is set, else `1.0` (ggml's `signs & kmask_iq2xs[j] ? -1.f : 1.f`).
#[inline]
fn sign_f(signs: u8, j: usize) -> f32 {
    if signs & KMASK_IQ2XS[j] != 0 {
        -1.0
    } else {
        1.0
    }
}

/// Integer counterpart of [`sign_f`].
#[inline]
fn sign_i(signs: u8, j: usize) -> i32 {
    if signs & KMASK_IQ2XS[j] != 0 {
        -1
    } else {
        1
    }
}

/// Signed integer dot of 8 unsigned grid magnitudes with 8 activations.
#[inline]
fn grid_dot8(grid: [u8; 8], signs: u8, q8: &[i8]) -> i32 {
    (0..8)
        .map(|j| i32::from(grid[j]) * i32::from(q8[j]) * sign_i(signs, j))
        .sum()
}

/// Signed integer dot of two 4-value grid entries (elements 0..4 and 4..8) with 8 activations.
#[inline]
fn grid_dot4x2(g1: [u8; 4], g2: [u8; 4], signs: u8, q8: &[i8]) -> i32 {
    (0..4)
        .map(|j| {
            i32::from(g1[j]) * i32::from(q8[j]) * sign_i(signs, j)
                + i32::from(g2[j]) * i32::from(q8[j + 4]) * sign_i(signs, j + 4)
        })
        .sum()
}

// ---------------------------------------------------------------------------------------------
// Block layouts
// ---------------------------------------------------------------------------------------------

/// IQ2_XXS, 256 elements in 66 bytes (2.06 bpw).
/// `d: f16` super-block scale; `qs: [u16; 32]`, 8 groups of 32 elements, 4 `u16` each, read as
/// two `u32`: the first holds four 8-bit indices into `IQ2XXS_GRID` (8 magnitudes each), the
/// second four 7-bit sign fields (bits 0..28, expanded by `KSIGNS_IQ2XS`) and a 4-bit scale `s`
/// (bits 28..32). Value = `d * (0.5 + s) * 0.25 * grid * sign`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockIq2Xxs {
    pub d: f16,
    pub qs: [u16; QK_K / 8],
}
const _: () = assert!(size_of::<BlockIq2Xxs>() == 66);

/// IQ2_XS, 256 elements in 74 bytes (2.31 bpw).
/// `d: f16`; `qs: [u16; 32]`, one per 8 elements: bits 0..9 index `IQ2XS_GRID`, bits 9..16 are a
/// 7-bit sign field; `scales: [u8; 8]`, one byte per 32 elements, low nibble for the first 16,
/// high nibble for the second 16. Value = `d * (0.5 + s) * 0.25 * grid * sign`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockIq2Xs {
    pub d: f16,
    pub qs: [u16; QK_K / 8],
    pub scales: [u8; QK_K / 32],
}
const _: () = assert!(size_of::<BlockIq2Xs>() == 74);

/// IQ2_S, 256 elements in 82 bytes (2.56 bpw).
/// `d: f16`; `qs: [u8; 64]`: bytes 0..32 are the low 8 bits of the `IQ2S_GRID` index of each
/// group of 8, bytes 32..64 are 8 explicit sign bits per group; `qh: [u8; 8]`, 2 high index bits
/// per group (4 groups per byte); `scales: [u8; 8]` as in IQ2_XS.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockIq2S {
    pub d: f16,
    pub qs: [u8; QK_K / 4],
    pub qh: [u8; QK_K / 32],
    pub scales: [u8; QK_K / 32],
}
const _: () = assert!(size_of::<BlockIq2S>() == 82);

/// IQ3_XXS, 256 elements in 98 bytes (3.06 bpw).
/// `d: f16`; `qs: [u8; 96]`: bytes 0..64 are `IQ3XXS_GRID` indices (4 magnitudes each, two per
/// group of 8), bytes 64..96 are 8 `u32`, one per 32 elements, with four 7-bit sign fields
/// (bits 0..28) and a 4-bit scale `s` (bits 28..32). Value = `d * (0.5 + s) * 0.5 * grid * sign`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockIq3Xxs {
    pub d: f16,
    pub qs: [u8; 3 * QK_K / 8],
}
const _: () = assert!(size_of::<BlockIq3Xxs>() == 98);

/// IQ3_S, 256 elements in 110 bytes (3.44 bpw).
/// `d: f16`; `qs: [u8; 64]` low 8 bits of the `IQ3S_GRID` indices (4 magnitudes each);
/// `qh: [u8; 8]` the 9th index bit, one byte per 32 elements; `signs: [u8; 32]` 8 explicit sign
/// bits per group of 8; `scales: [u8; 4]`, a nibble `s` per 32 elements.
/// Value = `d * (1 + 2 s) * grid * sign`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockIq3S {
    pub d: f16,
    pub qs: [u8; QK_K / 4],
    pub qh: [u8; QK_K / 32],
    pub signs: [u8; QK_K / 8],
    pub scales: [u8; QK_K / 64],
}
const _: () = assert!(size_of::<BlockIq3S>() == 110);

/// IQ1_S, 256 elements in 50 bytes (1.56 bpw).
/// `d: f16`; `qs: [u8; 32]` low 8 bits of the `IQ1S_GRID` index of each group of 8;
/// `qh: [u16; 8]`, one per 32 elements: bits `3l..3l+3` are the high index bits of group `l`,
/// bits 12..15 a 3-bit scale `s`, bit 15 the sign of the delta.
/// Value = `d * (2 s + 1) * (grid ± 0.125)`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockIq1S {
    pub d: f16,
    pub qs: [u8; QK_K / 8],
    pub qh: [u16; QK_K / 32],
}
const _: () = assert!(size_of::<BlockIq1S>() == 50);

/// IQ1_M, 256 elements in 56 bytes (1.75 bpw); no separate scale field.
/// `qs: [u8; 32]` low 8 bits of the `IQ1S_GRID` indices; `qh: [u8; 16]`, one nibble per group
/// of 8: 3 high index bits and (bit 3) the sign of the delta; `scales: [u8; 8]` read as four
/// `u16`: 3-bit scales for each group of 16 in bits 0..12, and the f16 super-block scale spread
/// over the top nibbles (bits 12..16) of the four words.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockIq1M {
    pub qs: [u8; QK_K / 8],
    pub qh: [u8; QK_K / 16],
    pub scales: [u8; QK_K / 32],
}
const _: () = assert!(size_of::<BlockIq1M>() == 56);

/// IQ4_NL, 32 elements in 18 bytes (4.5 bpw).
/// `d: f16`; `qs: [u8; 16]`: the low nibble of byte `j` is element `j`, the high nibble element
/// `j + 16`, each an index into `KVALUES_IQ4NL`. Value = `d * kvalue`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockIq4Nl {
    pub d: f16,
    pub qs: [u8; 16],
}
const _: () = assert!(size_of::<BlockIq4Nl>() == 18);

/// IQ4_XS, 256 elements in 136 bytes (4.25 bpw).
/// `d: f16`; 6-bit scale `ls` per 32 elements: low 4 bits in `scales_l` (nibble `ib % 2` of byte
/// `ib / 2`), high 2 bits in `scales_h` (bits `2 ib..2 ib + 2`); `qs: [u8; 128]`, 16 bytes per
/// 32 elements packed as in IQ4_NL. Value = `d * (ls - 32) * kvalue`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct BlockIq4Xs {
    pub d: f16,
    pub scales_h: u16,
    pub scales_l: [u8; QK_K / 64],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(size_of::<BlockIq4Xs>() == 136);

// ---------------------------------------------------------------------------------------------
// Per-block field decoding shared by dequantize and vec_dot
// ---------------------------------------------------------------------------------------------

/// IQ2_XXS group of 32 `ib`: (`aux0`, `aux1`): grid index bytes and signs+scale word.
#[inline]
fn iq2xxs_aux(b: &BlockIq2Xxs, ib: usize) -> (u32, u32) {
    let q = &b.qs[4 * ib..4 * ib + 4];
    (
        u32::from(q[0]) | (u32::from(q[1]) << 16),
        u32::from(q[2]) | (u32::from(q[3]) << 16),
    )
}

/// IQ2_XXS: grid magnitudes and sign byte of group of 8 `l` within a group of 32.
#[inline]
fn iq2xxs_group(aux0: u32, aux1: u32, l: usize) -> ([u8; 8], u8) {
    let idx = aux0.to_le_bytes()[l];
    let grid = IQ2XXS_GRID[usize::from(idx)].to_le_bytes();
    (grid, KSIGNS_IQ2XS[((aux1 >> (7 * l)) & 127) as usize])
}

/// IQ2_XS: grid magnitudes and sign byte of the group of 8 coded by `q`.
#[inline]
fn iq2xs_group(q: u16) -> ([u8; 8], u8) {
    (
        IQ2XS_GRID[usize::from(q & 511)].to_le_bytes(),
        KSIGNS_IQ2XS[usize::from(q >> 9)],
    )
}

/// IQ2_S: grid magnitudes and sign byte of group `l` (0..4) in group of 32 `ib`.
#[inline]
fn iq2s_group(b: &BlockIq2S, ib: usize, l: usize) -> ([u8; 8], u8) {
    let idx = usize::from(b.qs[4 * ib + l]) | ((usize::from(b.qh[ib]) << (8 - 2 * l)) & 0x300);
    (IQ2S_GRID[idx].to_le_bytes(), b.qs[QK_K / 8 + 4 * ib + l])
}

/// IQ3_XXS group of 32 `ib`: its signs+scale word.
#[inline]
fn iq3xxs_aux(b: &BlockIq3Xxs, ib: usize) -> u32 {
    let o = QK_K / 4 + 4 * ib;
    u32::from_le_bytes([b.qs[o], b.qs[o + 1], b.qs[o + 2], b.qs[o + 3]])
}

/// IQ3_XXS: the two 4-magnitude grid entries and sign byte of group `l` in group of 32 `ib`.
#[inline]
fn iq3xxs_group(b: &BlockIq3Xxs, aux: u32, ib: usize, l: usize) -> ([u8; 4], [u8; 4], u8) {
    let q = &b.qs[8 * ib..8 * ib + 8];
    (
        IQ3XXS_GRID[usize::from(q[2 * l])].to_le_bytes(),
        IQ3XXS_GRID[usize::from(q[2 * l + 1])].to_le_bytes(),
        KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize],
    )
}

/// IQ3_S: the two 4-magnitude grid entries and sign byte of group `l` in group of 32 `ib`.
#[inline]
fn iq3s_group(b: &BlockIq3S, ib: usize, l: usize) -> ([u8; 4], [u8; 4], u8) {
    let qh = usize::from(b.qh[ib]);
    let q = &b.qs[8 * ib..8 * ib + 8];
    let i1 = usize::from(q[2 * l]) | ((qh << (8 - 2 * l)) & 256);
    let i2 = usize::from(q[2 * l + 1]) | ((qh << (7 - 2 * l)) & 256);
    (
        IQ3S_GRID[i1].to_le_bytes(),
        IQ3S_GRID[i2].to_le_bytes(),
        b.signs[4 * ib + l],
    )
}

/// IQ3_S: the odd scale `1 + 2 s` of group of 32 `ib`.
#[inline]
fn iq3s_scale(b: &BlockIq3S, ib: usize) -> u32 {
    1 + 2 * u32::from((b.scales[ib / 2] >> (4 * (ib % 2))) & 0xf)
}

/// IQ1_S: signed grid values of group `l` in group of 32 `ib`.
#[inline]
fn iq1s_group(b: &BlockIq1S, ib: usize, l: usize) -> [i8; 8] {
    let idx = usize::from(b.qs[4 * ib + l]) | (usize::from((b.qh[ib] >> (3 * l)) & 7) << 8);
    IQ1S_GRID[idx].to_le_bytes().map(|v| v as i8)
}

/// IQ1_M: the four scale words.
#[inline]
fn iq1m_sc(b: &BlockIq1M) -> [u16; 4] {
    let s = &b.scales;
    [0, 1, 2, 3].map(|k| u16::from_le_bytes([s[2 * k], s[2 * k + 1]]))
}

/// IQ1_M: the super-block scale, assembled from the top nibbles of the scale words.
#[inline]
fn iq1m_d(sc: &[u16; 4]) -> f16 {
    f16::from_bits((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000))
}

/// IQ1_M: signed grid values and delta sign (`true` = negative) of group `l` in group of 32 `ib`.
#[inline]
fn iq1m_group(b: &BlockIq1M, ib: usize, l: usize) -> ([i8; 8], bool) {
    let qh = b.qh[2 * ib + l / 2];
    let shift = 4 * (l % 2);
    let idx = usize::from(b.qs[4 * ib + l]) | ((usize::from(qh >> shift) & 7) << 8);
    (IQ1S_GRID[idx].to_le_bytes().map(|v| v as i8), (qh >> shift) & 0x08 != 0)
}

/// IQ1_M: the odd scales `2 s + 1` of the two groups of 16 in group of 32 `ib`.
#[inline]
fn iq1m_scales(sc: &[u16; 4], ib: usize) -> (i32, i32) {
    let w = sc[ib / 2] >> (6 * (ib % 2));
    (2 * i32::from(w & 7) + 1, 2 * i32::from((w >> 3) & 7) + 1)
}

/// IQ4_XS: the 6-bit scale of group of 32 `ib`.
#[inline]
fn iq4xs_scale(b: &BlockIq4Xs, ib: usize) -> i32 {
    let lo = (b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf;
    let hi = ((b.scales_h >> (2 * ib)) & 3) as u8;
    i32::from(lo | (hi << 4))
}

#[inline]
fn kv4(q: u8) -> i32 {
    i32::from(KVALUES_IQ4NL[usize::from(q & 0xf)])
}

// ---------------------------------------------------------------------------------------------
// Dequantization (f32 operation order as in ggml's dequantize_row_*)
// ---------------------------------------------------------------------------------------------

fn dequant_iq2_xxs(b: &BlockIq2Xxs, y: &mut [f32]) {
    let d = b.d.to_f32();
    for (ib, y) in y.chunks_exact_mut(32).enumerate() {
        let (aux0, aux1) = iq2xxs_aux(b, ib);
        let db = d * (0.5 + (aux1 >> 28) as f32) * 0.25;
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let (grid, signs) = iq2xxs_group(aux0, aux1, l);
            for j in 0..8 {
                y[j] = db * f32::from(grid[j]) * sign_f(signs, j);
            }
        }
    }
}

fn dequant_iq2_xs(b: &BlockIq2Xs, y: &mut [f32]) {
    let d = b.d.to_f32();
    for (ib, y) in y.chunks_exact_mut(32).enumerate() {
        let sc = b.scales[ib];
        let db = [
            d * (0.5 + f32::from(sc & 0xf)) * 0.25,
            d * (0.5 + f32::from(sc >> 4)) * 0.25,
        ];
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let (grid, signs) = iq2xs_group(b.qs[4 * ib + l]);
            for j in 0..8 {
                y[j] = db[l / 2] * f32::from(grid[j]) * sign_f(signs, j);
            }
        }
    }
}

fn dequant_iq2_s(b: &BlockIq2S, y: &mut [f32]) {
    let d = b.d.to_f32();
    for (ib, y) in y.chunks_exact_mut(32).enumerate() {
        let sc = b.scales[ib];
        let db = [
            d * (0.5 + f32::from(sc & 0xf)) * 0.25,
            d * (0.5 + f32::from(sc >> 4)) * 0.25,
        ];
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let (grid, signs) = iq2s_group(b, ib, l);
            for j in 0..8 {
                y[j] = db[l / 2] * f32::from(grid[j]) * sign_f(signs, j);
            }
        }
    }
}

fn dequant_iq3_xxs(b: &BlockIq3Xxs, y: &mut [f32]) {
    let d = b.d.to_f32();
    for (ib, y) in y.chunks_exact_mut(32).enumerate() {
        let aux = iq3xxs_aux(b, ib);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let (g1, g2, signs) = iq3xxs_group(b, aux, ib, l);
            for j in 0..4 {
                y[j] = db * f32::from(g1[j]) * sign_f(signs, j);
                y[j + 4] = db * f32::from(g2[j]) * sign_f(signs, j + 4);
            }
        }
    }
}

fn dequant_iq3_s(b: &BlockIq3S, y: &mut [f32]) {
    let d = b.d.to_f32();
    for (ib, y) in y.chunks_exact_mut(32).enumerate() {
        let db = d * iq3s_scale(b, ib) as f32;
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let (g1, g2, signs) = iq3s_group(b, ib, l);
            for j in 0..4 {
                y[j] = db * f32::from(g1[j]) * sign_f(signs, j);
                y[j + 4] = db * f32::from(g2[j]) * sign_f(signs, j + 4);
            }
        }
    }
}

fn dequant_iq1_s(b: &BlockIq1S, y: &mut [f32]) {
    let d = b.d.to_f32();
    for (ib, y) in y.chunks_exact_mut(32).enumerate() {
        let qh = b.qh[ib];
        let dl = d * (2 * ((qh >> 12) & 7) + 1) as f32;
        let delta = if qh & 0x8000 != 0 { -IQ1_DELTA } else { IQ1_DELTA };
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let grid = iq1s_group(b, ib, l);
            for j in 0..8 {
                y[j] = dl * (f32::from(grid[j]) + delta);
            }
        }
    }
}

fn dequant_iq1_m(b: &BlockIq1M, y: &mut [f32]) {
    let sc = iq1m_sc(b);
    let d = iq1m_d(&sc).to_f32();
    for (ib, y) in y.chunks_exact_mut(32).enumerate() {
        let (ls1, ls2) = iq1m_scales(&sc, ib);
        let dl = [d * ls1 as f32, d * ls2 as f32];
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let (grid, neg) = iq1m_group(b, ib, l);
            let delta = if neg { -IQ1_DELTA } else { IQ1_DELTA };
            for j in 0..8 {
                y[j] = dl[l / 2] * (f32::from(grid[j]) + delta);
            }
        }
    }
}

fn dequant_iq4_nl(b: &BlockIq4Nl, y: &mut [f32]) {
    let d = b.d.to_f32();
    for (j, &q) in b.qs.iter().enumerate() {
        y[j] = d * kv4(q) as f32;
        y[j + 16] = d * kv4(q >> 4) as f32;
    }
}

fn dequant_iq4_xs(b: &BlockIq4Xs, y: &mut [f32]) {
    let d = b.d.to_f32();
    for (ib, y) in y.chunks_exact_mut(32).enumerate() {
        let dl = d * (iq4xs_scale(b, ib) - 32) as f32;
        for (j, &q) in b.qs[16 * ib..16 * ib + 16].iter().enumerate() {
            y[j] = dl * kv4(q) as f32;
            y[j + 16] = dl * kv4(q >> 4) as f32;
        }
    }
}

/// Decode whole blocks of an IQ type (lengths already checked by `quant::dequantize`).
pub(crate) fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    use GgmlType::*;
    match ty {
        IQ2_XXS => dequantize_blocks(ty, src, dst, QK_K, dequant_iq2_xxs),
        IQ2_XS => dequantize_blocks(ty, src, dst, QK_K, dequant_iq2_xs),
        IQ2_S => dequantize_blocks(ty, src, dst, QK_K, dequant_iq2_s),
        IQ3_XXS => dequantize_blocks(ty, src, dst, QK_K, dequant_iq3_xxs),
        IQ3_S => dequantize_blocks(ty, src, dst, QK_K, dequant_iq3_s),
        IQ1_S => dequantize_blocks(ty, src, dst, QK_K, dequant_iq1_s),
        IQ1_M => dequantize_blocks(ty, src, dst, QK_K, dequant_iq1_m),
        IQ4_NL => dequantize_blocks(ty, src, dst, 32, dequant_iq4_nl),
        IQ4_XS => dequantize_blocks(ty, src, dst, QK_K, dequant_iq4_xs),
        _ => Err(QuantError::Unsupported { ty, op: "dequantize" }),
    }
}

// ---------------------------------------------------------------------------------------------
// Dot products (as ggml_vec_dot_*_generic)
// ---------------------------------------------------------------------------------------------

/// Run `step(sumf, weight_block, activation_block)` over the paired blocks of a row.
fn fold_blocks<W: Pod, A: Pod>(w: &[u8], act: &[u8], mut step: impl FnMut(&mut f32, &W, &A)) -> f32 {
    let mut sumf = 0.0f32;
    for (wb, ab) in blocks_unaligned::<W>(w).zip(blocks_unaligned::<A>(act)) {
        step(&mut sumf, &wb, &ab);
    }
    sumf
}

fn dot_iq2_xxs(w: &[u8], act: &[u8]) -> f32 {
    let sumf = fold_blocks(w, act, |sumf, x: &BlockIq2Xxs, y: &BlockQ8K| {
        let d = x.d.to_f32() * y.d;
        let mut bsum = 0i32;
        for (ib, q8) in y.qs.chunks_exact(32).enumerate() {
            let (aux0, aux1) = iq2xxs_aux(x, ib);
            let ls = 2 * (aux1 >> 28) as i32 + 1;
            let sumi: i32 = (0..4)
                .map(|l| {
                    let (grid, signs) = iq2xxs_group(aux0, aux1, l);
                    grid_dot8(grid, signs, &q8[8 * l..])
                })
                .sum();
            bsum += sumi * ls;
        }
        *sumf += d * bsum as f32;
    });
    0.125 * sumf
}

fn dot_iq2_xs(w: &[u8], act: &[u8]) -> f32 {
    let sumf = fold_blocks(w, act, |sumf, x: &BlockIq2Xs, y: &BlockQ8K| {
        let d = x.d.to_f32() * y.d;
        let mut bsum = 0i32;
        for (ib, q8) in y.qs.chunks_exact(32).enumerate() {
            let ls = [
                2 * i32::from(x.scales[ib] & 0xf) + 1,
                2 * i32::from(x.scales[ib] >> 4) + 1,
            ];
            for (half, ls) in ls.into_iter().enumerate() {
                let sumi: i32 = (2 * half..2 * half + 2)
                    .map(|l| {
                        let (grid, signs) = iq2xs_group(x.qs[4 * ib + l]);
                        grid_dot8(grid, signs, &q8[8 * l..])
                    })
                    .sum();
                bsum += sumi * ls;
            }
        }
        *sumf += d * bsum as f32;
    });
    0.125 * sumf
}

fn dot_iq2_s(w: &[u8], act: &[u8]) -> f32 {
    let sumf = fold_blocks(w, act, |sumf, x: &BlockIq2S, y: &BlockQ8K| {
        let d = x.d.to_f32() * y.d;
        let mut bsum = 0i32;
        for (ib, q8) in y.qs.chunks_exact(32).enumerate() {
            let ls1 = 1 + 2 * i32::from(x.scales[ib] & 0xf);
            let ls2 = 1 + 2 * i32::from(x.scales[ib] >> 4);
            let group = |l: usize| {
                let (grid, signs) = iq2s_group(x, ib, l);
                grid_dot8(grid, signs, &q8[8 * l..])
            };
            let sumi1 = group(0) + group(1);
            let sumi2 = group(2) + group(3);
            bsum += ls1 * sumi1 + ls2 * sumi2;
        }
        *sumf += d * bsum as f32;
    });
    0.125 * sumf
}

fn dot_iq3_xxs(w: &[u8], act: &[u8]) -> f32 {
    let sumf = fold_blocks(w, act, |sumf, x: &BlockIq3Xxs, y: &BlockQ8K| {
        let d = x.d.to_f32() * y.d;
        let mut bsum = 0i32;
        for (ib, q8) in y.qs.chunks_exact(32).enumerate() {
            let aux = iq3xxs_aux(x, ib);
            let ls = 2 * (aux >> 28) as i32 + 1;
            let sumi: i32 = (0..4)
                .map(|l| {
                    let (g1, g2, signs) = iq3xxs_group(x, aux, ib, l);
                    grid_dot4x2(g1, g2, signs, &q8[8 * l..])
                })
                .sum();
            bsum += sumi * ls;
        }
        *sumf += d * bsum as f32;
    });
    0.25 * sumf
}

fn dot_iq3_s(w: &[u8], act: &[u8]) -> f32 {
    fold_blocks(w, act, |sumf, x: &BlockIq3S, y: &BlockQ8K| {
        let d = x.d.to_f32() * y.d;
        let mut bsum = 0i32;
        for (ib, q8) in y.qs.chunks_exact(32).enumerate() {
            let sumi: i32 = (0..4)
                .map(|l| {
                    let (g1, g2, signs) = iq3s_group(x, ib, l);
                    grid_dot4x2(g1, g2, signs, &q8[8 * l..])
                })
                .sum();
            bsum += sumi * iq3s_scale(x, ib) as i32;
        }
        *sumf += d * bsum as f32;
    })
}

fn dot_iq1_s(w: &[u8], act: &[u8]) -> f32 {
    fold_blocks(w, act, |sumf, x: &BlockIq1S, y: &BlockQ8K| {
        let (mut sumi, mut sumi1) = (0i32, 0i32);
        for (ib, q8) in y.qs.chunks_exact(32).enumerate() {
            let qh = x.qh[ib];
            let ls = 2 * i32::from((qh >> 12) & 7) + 1;
            let delta = if qh & 0x8000 != 0 { -1 } else { 1 };
            let lsum: i32 = (0..4)
                .map(|l| {
                    let grid = iq1s_group(x, ib, l);
                    (0..8)
                        .map(|j| i32::from(q8[8 * l + j]) * i32::from(grid[j]))
                        .sum::<i32>()
                })
                .sum();
            sumi += ls * lsum;
            sumi1 += ls * delta * (i32::from(y.bsums[2 * ib]) + i32::from(y.bsums[2 * ib + 1]));
        }
        *sumf += x.d.to_f32() * y.d * (sumi as f32 + IQ1_DELTA * sumi1 as f32);
    })
}

fn dot_iq1_m(w: &[u8], act: &[u8]) -> f32 {
    fold_blocks(w, act, |sumf, x: &BlockIq1M, y: &BlockQ8K| {
        let sc = iq1m_sc(x);
        let (mut sumi1, mut sumi2) = (0i32, 0i32);
        for (ib, q8) in y.qs.chunks_exact(32).enumerate() {
            let (mut sum1, mut sum2) = ([0i32; 2], [0i32; 2]);
            for l in 0..4 {
                let (grid, neg) = iq1m_group(x, ib, l);
                let q = &q8[8 * l..8 * l + 8];
                let lsum1: i32 = (0..8).map(|j| i32::from(q[j]) * i32::from(grid[j])).sum();
                let lsum2: i32 = q.iter().map(|&v| i32::from(v)).sum();
                sum1[l / 2] += lsum1;
                sum2[l / 2] += if neg { -lsum2 } else { lsum2 };
            }
            let (ls1, ls2) = iq1m_scales(&sc, ib);
            sumi1 += sum1[0] * ls1 + sum1[1] * ls2;
            sumi2 += sum2[0] * ls1 + sum2[1] * ls2;
        }
        *sumf += iq1m_d(&sc).to_f32() * y.d * (sumi1 as f32 + IQ1_DELTA * sumi2 as f32);
    })
}

fn dot_iq4_nl(w: &[u8], act: &[u8]) -> f32 {
    fold_blocks(w, act, |sumf, x: &BlockIq4Nl, y: &BlockQ8_0| {
        let d = y.d.to_f32() * x.d.to_f32();
        let (mut sumi1, mut sumi2) = (0i32, 0i32);
        for (j, &q) in x.qs.iter().enumerate() {
            sumi1 += i32::from(y.qs[j]) * kv4(q);
            sumi2 += i32::from(y.qs[j + 16]) * kv4(q >> 4);
        }
        *sumf += d * (sumi1 + sumi2) as f32;
    })
}

fn dot_iq4_xs(w: &[u8], act: &[u8]) -> f32 {
    fold_blocks(w, act, |sumf, x: &BlockIq4Xs, y: &BlockQ8K| {
        let d4d8 = x.d.to_f32() * y.d;
        for (ib, q8) in y.qs.chunks_exact(32).enumerate() {
            let dl = d4d8 * (iq4xs_scale(x, ib) - 32) as f32;
            let (mut sumi1, mut sumi2) = (0i32, 0i32);
            for (j, &q) in x.qs[16 * ib..16 * ib + 16].iter().enumerate() {
                sumi1 += i32::from(q8[j]) * kv4(q);
                sumi2 += i32::from(q8[j + 16]) * kv4(q >> 4);
            }
            *sumf += dl * (sumi1 + sumi2) as f32;
        }
    })
}

/// Dot product of an IQ weight row with its activation row (Q8_0 for IQ4_NL, Q8_K otherwise);
/// lengths already checked by `quant::vec_dot`.
pub(crate) fn vec_dot(ty: GgmlType, w: &[u8], act: &[u8]) -> f32 {
    use GgmlType::*;
    match ty {
        IQ2_XXS => dot_iq2_xxs(w, act),
        IQ2_XS => dot_iq2_xs(w, act),
        IQ2_S => dot_iq2_s(w, act),
        IQ3_XXS => dot_iq3_xxs(w, act),
        IQ3_S => dot_iq3_s(w, act),
        IQ1_S => dot_iq1_s(w, act),
        IQ1_M => dot_iq1_m(w, act),
        IQ4_NL => dot_iq4_nl(w, act),
        IQ4_XS => dot_iq4_xs(w, act),
        // Not reachable through `quant::vec_dot`, which only routes IQ types here.
        _ => f32::NAN,
    }
}

/// Test helpers shared by the IQ, FP4 and ternary tests: golden data, reference activation
/// quantizers and the f64 dot-product check.
#[cfg(test)]
pub(super) mod test_util {
    use half::f16;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use crate::quant::{dequantize, vec_dot, GgmlType};

    /// `tests/golden/quants/<TYPE>.bin` and the matching `.f32` (ggml's dequantization).
    pub(crate) fn golden(ty: GgmlType) -> (Vec<u8>, Vec<f32>) {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/quants");
        let read = |ext: &str| {
            let path = format!("{dir}/{}.{ext}", ty.name());
            std::fs::read(&path).unwrap_or_else(|e| panic!("golden file {path} unreadable: {e}"))
        };
        let bin = read("bin");
        let f32s = read("f32")
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        (bin, f32s)
    }

    /// The golden source values (`source.f32`, 4 rows of 512).
    pub(crate) fn golden_source() -> Vec<f32> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/quants/source.f32");
        let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("golden file {path} unreadable: {e}"));
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }

    /// Dequantize `bin` and require every value to equal ggml's bit for bit.
    pub(crate) fn assert_golden_bit_exact(ty: GgmlType) {
        let (bin, want) = golden(ty);
        assert!(!want.is_empty(), "{ty}: empty golden data");
        let mut got = vec![f32::NAN; want.len()];
        dequantize(ty, &bin, &mut got).unwrap_or_else(|e| panic!("{ty}: {e}"));
        let mismatches: Vec<usize> = (0..want.len())
            .filter(|&i| got[i].to_bits() != want[i].to_bits())
            .collect();
        if let Some(&i) = mismatches.first() {
            panic!(
                "{ty}: {} of {} values differ from ggml; first at {i}: got {} want {}",
                mismatches.len(),
                want.len(),
                got[i],
                want[i]
            );
        }
    }

    /// Q8_0 as ggml's `quantize_row_q8_0_ref`; returns the bytes and the values they stand for.
    pub(crate) fn quantize_q8_0(x: &[f32]) -> (Vec<u8>, Vec<f64>) {
        let (mut bytes, mut vals) = (Vec::new(), Vec::new());
        for blk in x.chunks_exact(32) {
            let amax = blk.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            let dh = f16::from_f32(d);
            bytes.extend_from_slice(&dh.to_le_bytes());
            for &v in blk {
                let q = (v * id).round() as i8;
                bytes.push(q as u8);
                vals.push(f64::from(dh.to_f32()) * f64::from(q));
            }
        }
        (bytes, vals)
    }

    /// Q8_K as ggml's `quantize_row_q8_K_ref`; returns the bytes and the values they stand for.
    pub(crate) fn quantize_q8_k(x: &[f32]) -> (Vec<u8>, Vec<f64>) {
        let (mut bytes, mut vals) = (Vec::new(), Vec::new());
        for blk in x.chunks_exact(256) {
            let (mut amax, mut max) = (0.0f32, 0.0f32);
            for &v in blk {
                if v.abs() > amax {
                    amax = v.abs();
                    max = v;
                }
            }
            let (d, qs): (f32, Vec<i8>) = if amax == 0.0 {
                (0.0, vec![0; 256])
            } else {
                let iscale = -127.0 / max;
                (
                    1.0 / iscale,
                    blk.iter()
                        .map(|&v| ((iscale * v).round_ties_even() as i32).min(127) as i8)
                        .collect(),
                )
            };
            bytes.extend_from_slice(&d.to_le_bytes());
            bytes.extend(qs.iter().map(|&q| q as u8));
            for g in qs.chunks_exact(16) {
                let s: i16 = g.iter().map(|&q| i16::from(q)).sum();
                bytes.extend_from_slice(&s.to_le_bytes());
            }
            vals.extend(qs.iter().map(|&q| f64::from(d) * f64::from(q)));
        }
        (bytes, vals)
    }

    /// Activations for `ty`'s dot product: the bytes and the values they stand for.
    pub(crate) fn quantize_act(ty: GgmlType, x: &[f32]) -> (Vec<u8>, Vec<f64>) {
        match ty.vec_dot_type() {
            GgmlType::Q8_0 => quantize_q8_0(x),
            GgmlType::Q8_K => quantize_q8_k(x),
            other => panic!("{ty}: unexpected activation type {other}"),
        }
    }

    /// Smooth test activations (candle-style) mixed with seeded noise.
    pub(crate) fn test_activations(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..n)
            .map(|i| 0.1 + 2.0 * (i as f32 + seed as f32).cos() + rng.random_range(-1.0f32..1.0))
            .collect()
    }

    /// Random bytes for `nblocks` blocks of `ty`, with `fix` applied to each block to put its
    /// scale fields in a sane range.
    pub(crate) fn random_blocks(
        ty: GgmlType,
        nblocks: usize,
        seed: u64,
        fix: impl Fn(&mut [u8], &mut ChaCha8Rng),
    ) -> Vec<u8> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut bytes = vec![0u8; nblocks * ty.block_bytes()];
        for blk in bytes.chunks_exact_mut(ty.block_bytes()) {
            rng.fill(blk);
            fix(blk, &mut rng);
        }
        bytes
    }

    /// A random f16 scale in [0.005, 0.05), as little-endian bytes.
    pub(crate) fn random_f16_scale(rng: &mut ChaCha8Rng) -> [u8; 2] {
        f16::from_f32(rng.random_range(0.005f32..0.05)).to_le_bytes()
    }

    /// Require `vec_dot(ty, w, act)` to equal the f64 dot product of the dequantized operands.
    ///
    /// Bound: ggml's dot sums exact integers per sub-block and then does a few f32 products and
    /// one f32 addition per sub-block (at most n/16 of them), while the dequantized weights carry
    /// at most ~3 f32 roundings each. So the error is at most (n/16 + 8) * eps_f32 * sum|w_i a_i|;
    /// we allow that bound.
    pub(crate) fn assert_dot_matches(ty: GgmlType, w: &[u8], act: &[u8], act_vals: &[f64], what: &str) {
        let n = act_vals.len();
        let mut wf = vec![0f32; n];
        dequantize(ty, w, &mut wf).unwrap_or_else(|e| panic!("{ty}: {e}"));
        let reference: f64 = wf.iter().zip(act_vals).map(|(&a, &b)| f64::from(a) * b).sum();
        let scale: f64 = wf.iter().zip(act_vals).map(|(&a, &b)| (f64::from(a) * b).abs()).sum();
        assert!(
            scale > 0.0,
            "{ty} {what}: operands are all zero, the test would prove nothing"
        );
        let got = vec_dot(ty, n, w, act).unwrap_or_else(|e| panic!("{ty}: {e}"));
        let bound = (n as f64 / 16.0 + 8.0) * f64::from(f32::EPSILON) * scale;
        let err = (f64::from(got) - reference).abs();
        assert!(
            err <= bound,
            "{ty} {what}: vec_dot {got} vs f64 {reference}: error {err:e} > bound {bound:e} (sum|w*a| = {scale:e})"
        );
    }

    /// Dot checks for one weight type: golden weight rows against quantized golden source rows
    /// and against seeded random activations, and random weight blocks against random
    /// activations.
    pub(crate) fn check_vec_dot(ty: GgmlType, fix: impl Fn(&mut [u8], &mut ChaCha8Rng)) {
        let (bin, deq) = golden(ty);
        let rows = 4;
        let n = deq.len() / rows;
        let row_bytes = bin.len() / rows;
        let src = golden_source();
        for r in 0..rows {
            let w = &bin[r * row_bytes..(r + 1) * row_bytes];
            for (k, x) in [src[((r + 1) % rows) * n..][..n].to_vec(), test_activations(n, r as u64)]
                .iter()
                .enumerate()
            {
                let (act, vals) = quantize_act(ty, x);
                assert_dot_matches(ty, w, &act, &vals, &format!("golden row {r}, activations {k}"));
            }
        }
        let n = 1024;
        let nb = n / ty.block_size();
        for seed in 0..8 {
            let w = random_blocks(ty, nb, 1000 + seed, &fix);
            let (act, vals) = quantize_act(ty, &test_activations(n, 77 + seed));
            assert_dot_matches(ty, &w, &act, &vals, &format!("random blocks seed {seed}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_util::{assert_golden_bit_exact, check_vec_dot, random_f16_scale};
    use super::*;
    use crate::quant::dequantize as dequantize_any;

    const TYPES: [GgmlType; 9] = [
        GgmlType::IQ2_XXS,
        GgmlType::IQ2_XS,
        GgmlType::IQ2_S,
        GgmlType::IQ3_XXS,
        GgmlType::IQ3_S,
        GgmlType::IQ1_S,
        GgmlType::IQ1_M,
        GgmlType::IQ4_NL,
        GgmlType::IQ4_XS,
    ];

    #[test]
    fn block_sizes_match_the_type_table() {
        let sizes = [
            size_of::<BlockIq2Xxs>(),
            size_of::<BlockIq2Xs>(),
            size_of::<BlockIq2S>(),
            size_of::<BlockIq3Xxs>(),
            size_of::<BlockIq3S>(),
            size_of::<BlockIq1S>(),
            size_of::<BlockIq1M>(),
            size_of::<BlockIq4Nl>(),
            size_of::<BlockIq4Xs>(),
        ];
        for (ty, size) in TYPES.iter().zip(sizes) {
            assert_eq!(ty.block_bytes(), size, "{ty}");
        }
    }

    #[test]
    fn sign_tables_have_even_parity() {
        // ggml stores 7 sign bits and derives the 8th so that the count of minus signs is even.
        for (i, &s) in KSIGNS_IQ2XS.iter().enumerate() {
            assert_eq!(usize::from(s & 127), i);
            assert_eq!(s.count_ones() % 2, 0, "entry {i}");
        }
        for (j, &m) in KMASK_IQ2XS.iter().enumerate() {
            assert_eq!(m, 1 << j);
        }
    }

    #[test]
    fn grids_hold_only_their_levels() {
        let all_in = |bytes: &[u8], levels: &[u8]| bytes.iter().all(|b| levels.contains(b));
        assert!(IQ2XXS_GRID.iter().all(|g| all_in(&g.to_le_bytes(), &[8, 25, 43])));
        assert!(IQ2XS_GRID.iter().all(|g| all_in(&g.to_le_bytes(), &[8, 25, 43])));
        assert!(IQ2S_GRID.iter().all(|g| all_in(&g.to_le_bytes(), &[8, 25, 43])));
        assert!(IQ3XXS_GRID
            .iter()
            .all(|g| all_in(&g.to_le_bytes(), &[4, 12, 20, 28, 36, 44, 52, 62])));
        assert!(IQ3S_GRID
            .iter()
            .all(|g| all_in(&g.to_le_bytes(), &[1, 3, 5, 7, 9, 11, 13, 15])));
        assert!(IQ1S_GRID.iter().all(|g| all_in(&g.to_le_bytes(), &[0xff, 0, 1])));
        // Every grid lists distinct points.
        let distinct = |v: &[u64]| {
            let mut s = v.to_vec();
            s.sort_unstable();
            s.dedup();
            s.len() == v.len()
        };
        assert!(distinct(&IQ2XXS_GRID) && distinct(&IQ2XS_GRID) && distinct(&IQ2S_GRID) && distinct(&IQ1S_GRID));
    }

    #[test]
    fn dequantize_matches_ggml_bit_for_bit() {
        for ty in TYPES {
            assert_golden_bit_exact(ty);
        }
    }

    #[test]
    fn dequantize_rejects_misaligned_input() {
        // Start from u16-aligned storage so that skipping one byte is sure to misalign it.
        let words = [0u16; 34];
        let bytes: &[u8] = bytemuck::cast_slice(&words);
        let mut out = vec![0f32; 256];
        let err = dequantize_any(GgmlType::IQ2_XXS, &bytes[1..67], &mut out).unwrap_err();
        assert!(matches!(err, QuantError::Misaligned { .. }), "{err}");
    }

    #[test]
    fn vec_dot_matches_f64_dot_of_dequantized_operands() {
        for ty in TYPES {
            check_vec_dot(ty, |blk, rng| {
                if ty == GgmlType::IQ1_M {
                    // The f16 scale lives in the top nibbles of the four scale words (bytes 48..56).
                    let d = u16::from_le_bytes(random_f16_scale(rng));
                    for k in 0..4 {
                        let b = &mut blk[48 + 2 * k + 1];
                        *b = (*b & 0x0f) | ((((d >> (4 * k)) & 0xf) as u8) << 4);
                    }
                } else {
                    blk[..2].copy_from_slice(&random_f16_scale(rng));
                }
            });
        }
    }

    #[test]
    fn activation_quantizers_agree_with_the_test_reference() {
        // The dot-product tests quantize activations with test_util's transcription of ggml's
        // reference quantizers; the engine's own quantizer must produce the same bytes.
        let x = test_util::test_activations(1024, 5);
        for ty in [GgmlType::IQ4_NL, GgmlType::IQ2_XXS] {
            let mut engine = Vec::new();
            crate::quant::quantize_activations(ty, &x, &mut engine).unwrap();
            assert!(
                engine == test_util::quantize_act(ty, &x).0,
                "{ty}: activation bytes differ"
            );
        }
    }

    #[test]
    fn vec_dot_accepts_misaligned_rows() {
        let ty = GgmlType::IQ4_XS;
        let (bin, _) = test_util::golden(ty);
        let row = &bin[..2 * ty.block_bytes()];
        let (act, _) = test_util::quantize_act(ty, &test_util::test_activations(512, 3));
        let mut shifted = vec![0u8; row.len() + 1];
        shifted[1..].copy_from_slice(row);
        let a = crate::quant::vec_dot(ty, 512, row, &act).unwrap();
        let b = crate::quant::vec_dot(ty, 512, &shifted[1..], &act).unwrap();
        assert_eq!(a.to_bits(), b.to_bits());
    }
}
