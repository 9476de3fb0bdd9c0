//! F32, F16 and BF16 weight rows (the file layout: float weights are not interleaved) against
//! f32 activations, already rounded to the weight's precision as ggml converts them
//! ([`super::super::kernels`]' `prepare_values`). Four weights at a time are widened to f32 in
//! vectors (F16 through [`super::f16x4`], exact; BF16 by a 16-bit shift), where the portable
//! path decodes each row with one software conversion per value first; each weight vector meets
//! up to four activation rows.

// Register tiles are `[acc; C]` arrays indexed by activation row in loops the compiler unrolls.
#![allow(clippy::needless_range_loop)]

use core::arch::wasm32::*;

use super::lanes::{f16x4, load};
use crate::backend::cpu::tile::{Activations, TileOut};
use crate::quant::GgmlType;

const F32: u8 = 0;
const F16: u8 = 1;
const BF16: u8 = 2;

/// Whether this file covers `ty`.
pub(super) fn covers(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

/// `out` from the `out.nw()` file-layout rows of `w` (`k` values of `ty` each) and `act`'s f32
/// values; false (nothing written) where `ty` is not a float type or the lengths do not fit.
pub(super) fn tile(ty: GgmlType, k: usize, w: &[u8], act: &Activations, out: &mut TileOut<'_>) -> bool {
    let (rows, nw) = (out.rows(), out.nw());
    let eb = ty.block_bytes();
    if !covers(ty) || k == 0 || w.len() < nw * k * eb || act.rows != rows || act.values.len() < rows * k {
        return false;
    }
    for r in 0..nw {
        let wr = &w[r * k * eb..(r + 1) * k * eb];
        let mut a0 = 0;
        while a0 < rows {
            // SAFETY (of the calls): `wr` holds `k` values of `ty`, and rows `a0..a0 + C` of
            // `act.values` exist (checked above).
            match rows - a0 {
                n if n >= 4 => {
                    let r4 = unsafe { dispatch::<4>(ty, k, wr, act, a0) };
                    r4.iter().enumerate().for_each(|(c, &v)| out.set(a0 + c, r, v));
                    a0 += 4;
                }
                n if n >= 2 => {
                    let r2 = unsafe { dispatch::<2>(ty, k, wr, act, a0) };
                    r2.iter().enumerate().for_each(|(c, &v)| out.set(a0 + c, r, v));
                    a0 += 2;
                }
                _ => {
                    out.set(a0, r, unsafe { dispatch::<1>(ty, k, wr, act, a0) }[0]);
                    a0 += 1;
                }
            }
        }
    }
    true
}

/// [`row`] for `ty`'s kind.
///
/// # Safety
/// As [`row`].
unsafe fn dispatch<const C: usize>(ty: GgmlType, k: usize, w: &[u8], act: &Activations, a0: usize) -> [f32; C] {
    match ty {
        GgmlType::F32 => row::<F32, C>(k, w, act, a0),
        GgmlType::F16 => row::<F16, C>(k, w, act, a0),
        _ => row::<BF16, C>(k, w, act, a0),
    }
}

/// Four weights at `p` as f32.
#[inline(always)]
unsafe fn widen<const K: u8>(p: *const u8) -> v128 {
    match K {
        F32 => load(p),
        F16 => f16x4(p),
        _ => u32x4_shl(u32x4_extend_low_u16x8(v128_load64_zero(p as *const u64)), 16),
    }
}

/// One weight at `p` as f32 (the tail past the last multiple of four).
#[inline(always)]
unsafe fn one<const K: u8>(p: *const u8) -> f32 {
    match K {
        F32 => f32::from_le_bytes(*(p as *const [u8; 4])),
        F16 => half::f16::from_le_bytes(*(p as *const [u8; 2])).to_f32(),
        _ => half::bf16::from_le_bytes(*(p as *const [u8; 2])).to_f32(),
    }
}

/// The dot products of one weight row `w` with activation rows `a0..a0 + C`.
///
/// # Safety
/// `w` holds `k` values of kind `K`; `act.values` holds rows `a0..a0 + C` of `k` values.
#[inline(always)]
unsafe fn row<const K: u8, const C: usize>(k: usize, w: &[u8], act: &Activations, a0: usize) -> [f32; C] {
    let eb = if K == F32 { 4 } else { 2 };
    let x: [*const f32; C] = core::array::from_fn(|c| act.values.as_ptr().add((a0 + c) * k));
    let mut acc = [f32x4_splat(0.0); C];
    let mut i = 0;
    while i + 4 <= k {
        let wv = widen::<K>(w.as_ptr().add(i * eb));
        for c in 0..C {
            acc[c] = f32x4_add(acc[c], f32x4_mul(wv, v128_load(x[c].add(i) as *const v128)));
        }
        i += 4;
    }
    core::array::from_fn(|c| {
        let v = acc[c];
        let mut s = (f32x4_extract_lane::<0>(v) + f32x4_extract_lane::<1>(v))
            + (f32x4_extract_lane::<2>(v) + f32x4_extract_lane::<3>(v));
        for j in i..k {
            s += one::<K>(w.as_ptr().add(j * eb)) * *x[c].add(j);
        }
        s
    })
}
