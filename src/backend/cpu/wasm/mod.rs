//! WebAssembly SIMD kernels of the browser's CPU path, on weights interleaved at load as the
//! native AVX2 kernels take them ([`super::interleave`]: eight rows per tile, four consecutive
//! values of a row per 32-bit lane). A 128-bit vector holds four of those lanes, so a tile is two
//! halves of four rows, each finished on its own; the activation's four bytes, broadcast, meet
//! all four rows at once and each lane ends a block with its row's exact integer sum. No sum
//! across lanes, and the per-row scales arrive four at a time (f16 converted in vectors, not one
//! software conversion per block as the row kernels of the first browser build did).
//!
//! Two dot-product instruction sets, one kernel source ([`Dot`]):
//! * [`Simd128`]: every browser with WebAssembly SIMD. No byte dot product exists there: bytes
//!   widen to i16 and `i32x4.dot_i16x8_s` sums pairs; the pairs of a block are folded into
//!   lanes once per block.
//! * [`Relaxed`] (builds with `+relaxed-simd`; Chrome 114+, Firefox 145+ behind no flag, not
//!   Safari): `i32x4.relaxed_dot_i8x16_i7x16_add_s`, one instruction per 16 products (`vpdpbusd`
//!   or `pmaddubsw` + `pmaddwd` on x86, `sdot` on ARM). Its second operand must be 0..=127 for a
//!   defined result, which the unsigned 4-, 5- and 6-bit codes are (their offsets, -8, -16,
//!   -32, are taken off afterwards with the activations' block sums, as ggml's x86 kernels do).
//!   Signed weights (Q8_0, IQ4_NL) take the sign trick: `|w|` meets `a·sign(w)`, exact for
//!   every weight but -128, which ggml's quantizers never write (on x86 even that is exact;
//!   an ARM browser would read such a byte as -128·(-a)).
//!
//! The arithmetic is ggml's, as in the oracle [`crate::quant::vec_dot`]: exact integer sums per
//! block (K-quants: per sub-block, times its scale), then per block `acc += (d_w·d_a)·sum` in
//! f32 in the oracle's order, so results equal the oracle's to the last bit in most rows and
//! within its rounding in all. `web/tests/kernels.rs` checks both sets against it in
//! WebAssembly on every matrix of the golden fixtures.
//!
//! Files: `activation.rs` (the SwiGLU gate), `legacy.rs` (the 32-value formats against Q8_0),
//! `kquant.rs` (the 256-value K-quants and IQ4_XS against Q8_K), `unpacked.rs` (the IQ1-IQ3
//! codebook formats, TQ1_0 and Q1_0 as file rows), `float.rs` (F32, F16, BF16 rows against f32).

use core::arch::wasm32::*;

use super::interleave::TILE_ROWS;
use crate::backend::cpu::tile::{Activations, TileOut};
use crate::quant::{GgmlType, QuantError};
#[cfg(target_feature = "relaxed-simd")]
pub use lanes::Relaxed;
use lanes::{f16x4, HALF};
pub use lanes::{Dot, Simd128};

/// Whether these kernels cover weights of `ty` (from [`crate::quant::support`]'s `wasm_simd`).
pub fn supports(ty: GgmlType) -> bool {
    crate::quant::support_of(ty).is_some_and(|s| s.wasm_simd)
}

/// Whether these kernels read weights of `ty` interleaved: every covered block format (the
/// float formats are read as file rows).
pub fn interleaves(ty: GgmlType) -> bool {
    supports(ty) && !float::covers(ty) && !unpacked::covers(ty)
}

/// Whether these kernels take quantized activation blocks for weights of `ty` ([`prepare`]):
/// every covered block format (the float formats take f32 values).
pub fn quantizes(ty: GgmlType) -> bool {
    supports(ty) && !float::covers(ty)
}

/// Activations for these kernels: the oracle's blocks (Q8_0 or Q8_K, byte for byte), and for
/// Q8_0 each block's scale as f32 (`scales`) and the sum of its 32 values (`offsets`), which
/// the offset and minimum terms take. Q8_0 blocks are made here in vectors ([`q8_0_block`]),
/// Q8_K ones by the oracle's quantizer.
pub fn prepare(ty: GgmlType, x: &[f32], k: usize) -> Result<Activations, QuantError> {
    if ty.vec_dot_type() != GgmlType::Q8_0 {
        return super::tile::prepare_blocks(ty, x, k);
    }
    if !k.is_multiple_of(32) {
        return Err(QuantError::PartialBlock {
            ty: GgmlType::Q8_0,
            elements: k,
            block_size: 32,
        });
    }
    let rows = x.len().checked_div(k).unwrap_or(0);
    let blocks = rows * k / 32;
    let mut a = Activations::empty(rows, k);
    a.row_bytes = k / 32 * legacy::ACT_BLOCK;
    a.bytes = vec![0; blocks * legacy::ACT_BLOCK];
    a.scales = vec![0.0; blocks];
    a.offsets = vec![0; blocks];
    for (b, x) in x[..rows * k].chunks_exact(32).enumerate() {
        let (d, sum) = q8_0_block(x, &mut a.bytes[b * legacy::ACT_BLOCK..(b + 1) * legacy::ACT_BLOCK]);
        a.scales[b] = d;
        a.offsets[b] = sum;
    }
    Ok(a)
}

/// One Q8_0 activation block of the 32 values `x` into `out` (34 bytes), as the oracle's
/// run-time quantizer makes it (`quant::legacy::quantize_q8_0`: `amax` ignoring NaNs, `d =
/// amax / 127` as f16, `q = round_ties_even(x · 127 / amax)` saturated to i8, NaN to 0), in
/// vectors; returns `d` as f32 and the sum of the 32 `q`.
fn q8_0_block(x: &[f32], out: &mut [u8]) -> (f32, i32) {
    // SAFETY: `x` holds 32 f32 (eight vectors) and `out` 34 bytes (the callers' chunks).
    unsafe {
        let p = x.as_ptr() as *const v128;
        let v: [v128; 8] = core::array::from_fn(|i| v128_load(p.add(i)));
        // `pmax(a, b)` is `a < b ? b : a`: a NaN in `b` is passed over, as `f32::max` does.
        let mut m = f32x4_abs(v[0]);
        for &vi in &v[1..] {
            m = f32x4_pmax(m, f32x4_abs(vi));
        }
        let amax = [
            f32x4_extract_lane::<0>(m),
            f32x4_extract_lane::<1>(m),
            f32x4_extract_lane::<2>(m),
            f32x4_extract_lane::<3>(m),
        ]
        .into_iter()
        .fold(0f32, f32::max);
        let id = f32x4_splat(if amax != 0.0 { 127.0 / amax } else { 0.0 });
        let q: [v128; 8] = core::array::from_fn(|i| i32x4_trunc_sat_f32x4(f32x4_nearest(f32x4_mul(v[i], id))));
        let lo = i8x16_narrow_i16x8(i16x8_narrow_i32x4(q[0], q[1]), i16x8_narrow_i32x4(q[2], q[3]));
        let hi = i8x16_narrow_i16x8(i16x8_narrow_i32x4(q[4], q[5]), i16x8_narrow_i32x4(q[6], q[7]));
        let d = half::f16::from_f32(amax / 127.0);
        out[..2].copy_from_slice(&d.to_le_bytes());
        v128_store(out.as_mut_ptr().add(2) as *mut v128, lo);
        v128_store(out.as_mut_ptr().add(18) as *mut v128, hi);
        let pairs = i16x8_add(i16x8_extadd_pairwise_i8x16(lo), i16x8_extadd_pairwise_i8x16(hi));
        let quads = i32x4_extadd_pairwise_i16x8(pairs);
        let sum = i32x4_extract_lane::<0>(quads)
            + i32x4_extract_lane::<1>(quads)
            + i32x4_extract_lane::<2>(quads)
            + i32x4_extract_lane::<3>(quads);
        (d.to_f32(), sum)
    }
}

/// The [`Family`] of a kernel module's `half::<D, K, C>` for kind `K`.
macro_rules! family {
    ($half:ident, $d:ty, $k:expr) => {
        Family {
            eight: $half::<$d, { $k }, 8>,
            four: $half::<$d, { $k }, 4>,
            two: $half::<$d, { $k }, 2>,
            one: $half::<$d, { $k }, 1>,
        }
    };
}

// After `family!`, which they use (macros are seen in textual order).
pub mod activation;
mod float;
mod kquant;
mod lanes;
mod legacy;
mod unpacked;

/// `out` from weights `w` (`out.nw()` rows of `k` values of `ty`: interleaved tiles where
/// [`interleaves`] says so, file rows for the float formats and those of `unpacked.rs`) and `act` (from
/// [`prepare`]);
/// false (nothing written) where `ty` is not covered or the lengths do not fit.
pub fn tile<D: Dot>(ty: GgmlType, k: usize, w: &[u8], act: &Activations, out: &mut TileOut<'_>) -> bool {
    if float::covers(ty) {
        return float::tile(ty, k, w, act, out);
    }
    if unpacked::covers(ty) {
        return unpacked::tile::<D>(ty, k, w, act, out);
    }
    let Some(family) = legacy::family::<D>(ty).or_else(|| kquant::family::<D>(ty)) else {
        return false;
    };
    let bs = ty.block_size();
    let nb = k / bs;
    let act_block = ty.vec_dot_type().block_bytes();
    let tb = TILE_ROWS * nb * ty.block_bytes();
    let (rows, nw) = (out.rows(), out.nw());
    let q8_0 = ty.vec_dot_type() == GgmlType::Q8_0;
    let fits = k > 0
        && k.is_multiple_of(bs)
        && w.len() >= nw.div_ceil(TILE_ROWS) * tb
        && act.rows == rows
        && act.row_bytes == nb * act_block
        && act.bytes.len() >= rows * act.row_bytes
        && (!q8_0 || (act.scales.len() >= rows * nb && act.offsets.len() >= rows * nb));
    if !fits {
        return false;
    }
    for t in 0..nw.div_ceil(TILE_ROWS) {
        let tile = w[t * tb..].as_ptr();
        for h in 0..2 {
            let r0 = t * TILE_ROWS + h * HALF;
            if r0 >= nw {
                break;
            }
            let live = (nw - r0).min(HALF);
            let mut a0 = 0;
            // SAFETY (of the kernel calls): the tile holds `nb` whole tile blocks (checked
            // above), and rows `a0..a0 + C` of `act` have `nb` blocks each and their scales.
            while a0 < rows {
                match rows - a0 {
                    n if n >= 8 => {
                        let r = unsafe { (family.eight)(nb, tile, h, act, a0) };
                        store(out, a0, r0, live, &r);
                        a0 += 8;
                    }
                    n if n >= 4 => {
                        let r = unsafe { (family.four)(nb, tile, h, act, a0) };
                        store(out, a0, r0, live, &r);
                        a0 += 4;
                    }
                    n if n >= 2 => {
                        let r = unsafe { (family.two)(nb, tile, h, act, a0) };
                        store(out, a0, r0, live, &r);
                        a0 += 2;
                    }
                    _ => {
                        let r = unsafe { (family.one)(nb, tile, h, act, a0) };
                        store(out, a0, r0, live, &r);
                        a0 += 1;
                    }
                }
            }
        }
    }
    true
}

/// Results of activation rows `a0..` for weight rows `r0..r0 + live`.
fn store<const C: usize>(out: &mut TileOut<'_>, a0: usize, r0: usize, live: usize, r: &[v128; C]) {
    for (c, v) in r.iter().enumerate() {
        let lanes = [
            f32x4_extract_lane::<0>(*v),
            f32x4_extract_lane::<1>(*v),
            f32x4_extract_lane::<2>(*v),
            f32x4_extract_lane::<3>(*v),
        ];
        for (i, &x) in lanes.iter().take(live).enumerate() {
            out.set(a0 + c, r0 + i, x);
        }
    }
}

/// `dst[i] = src[i]` widened to f32, four at a time (exact; `half`'s slice conversion is one
/// software conversion per value in wasm): the attention's K and V rows.
pub fn widen_f16(src: &[half::f16], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    let mut i = 0;
    while i + 4 <= n {
        // SAFETY: values `i..i + 4` of both slices exist (`i + 4 <= n`).
        unsafe {
            v128_store(
                dst.as_mut_ptr().add(i) as *mut v128,
                f16x4(src.as_ptr().add(i) as *const u8),
            )
        };
        i += 4;
    }
    for (d, s) in dst[i..n].iter_mut().zip(&src[i..n]) {
        *d = s.to_f32();
    }
}

/// Each value rounded to f16 (nearest, ties to even, as `half` and F16C do) and back, four at
/// a time: `(|x| + c) - c` with `c` 13 binades above `|x|` (at least 2^-1, the f16 subnormals'
/// fixed step) rounds to the f16 grid in the FPU's own round-to-nearest-even; 65520 and up
/// round to infinity, NaN stays NaN.
pub fn round_f16_in_place(x: &mut [f32]) {
    let mut chunks = x.chunks_exact_mut(4);
    for c in &mut chunks {
        // SAFETY: `c` holds four f32.
        unsafe {
            v128_store(
                c.as_mut_ptr() as *mut v128,
                round_f16x4(v128_load(c.as_ptr() as *const v128)),
            )
        };
    }
    for v in chunks.into_remainder() {
        *v = half::f16::from_f32(*v).to_f32();
    }
}

#[inline(always)]
fn round_f16x4(v: v128) -> v128 {
    let sign = v128_and(v, u32x4_splat(0x8000_0000));
    let ax = v128_and(v, u32x4_splat(0x7fff_ffff));
    // The binade of |x|, kept between f16's smallest normal (2^-14, below which the step is
    // fixed) and its largest finite value's (2^15, above which everything is infinite).
    let e = u32x4_min(
        u32x4_max(v128_and(ax, u32x4_splat(0x7f80_0000)), u32x4_splat(0x3880_0000)),
        u32x4_splat(0x4700_0000),
    );
    let c = i32x4_add(e, u32x4_splat(13 << 23));
    let r = f32x4_sub(f32x4_add(ax, c), c);
    let r = v128_bitselect(u32x4_splat(0x7f80_0000), r, f32x4_ge(ax, f32x4_splat(65520.0)));
    v128_bitselect(v, v128_or(r, sign), f32x4_ne(v, v))
}

/// The kernels' f16 conversion of one value (`web/tests/kernels.rs` checks it against `half`
/// for all 65536).
pub fn f16_to_f32(bits: u16) -> f32 {
    let b = [bits.to_le_bytes(), [0; 2], [0; 2], [0; 2]].concat();
    // SAFETY: `b` holds the eight bytes `f16x4` reads.
    f32x4_extract_lane::<0>(unsafe { f16x4(b.as_ptr()) })
}
