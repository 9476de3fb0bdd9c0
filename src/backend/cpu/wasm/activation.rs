//! SiLU, alone and as the SwiGLU gate `silu(gate) · up`, four values at a time: the WebAssembly twin of
//! `simd/activation.rs`, with the same `e^-x = 2^n · e^r` (two-part `ln 2`, Taylor series to
//! degree 7). SIMD128 has no fused multiply-add; the two-part `ln 2` keeps the reduction exact
//! without one (`LN2_HI` has 16 significant bits, `n` at most 8), so only Horner's rounding
//! differs, within a few f32 ulps of [`super::super::ops::silu`].
//!
//! Why: the scalar `expf` made the gate of a qwen2.5-coder decode step (4,864 values per
//! layer) cost 50 µs, one thread alone, 2.7% of a step at two threads.

use core::arch::wasm32::*;

use super::super::ops;

/// `e^x` for `x` in [-87, 88] (callers clamp): no overflow, no subnormals.
#[inline]
fn exp(x: v128) -> v128 {
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    let n = f32x4_nearest(f32x4_mul(x, f32x4_splat(std::f32::consts::LOG2_E)));
    let r = f32x4_sub(x, f32x4_mul(n, f32x4_splat(LN2_HI)));
    let r = f32x4_sub(r, f32x4_mul(n, f32x4_splat(LN2_LO)));
    // Horner from 1/7! down to 1.
    let mut p = f32x4_splat(1.0 / 5040.0);
    for c in [1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = f32x4_add(f32x4_mul(p, r), f32x4_splat(c));
    }
    // 2^n from the exponent bits (n in [-126, 127] for the clamped range).
    let two_n = i32x4_shl(i32x4_add(i32x4_trunc_sat_f32x4(n), i32x4_splat(127)), 23);
    f32x4_mul(p, two_n)
}

/// `x / (1 + e^-x)` of four values. Beyond ±87 the clamp changes `e^-x` but not the result
/// (see the AVX2 twin); NaN passes through the clamp (pmin/pmax keep the first operand) and the
/// division.
#[inline]
fn silu4(x: v128) -> v128 {
    let (lo, hi, one) = (f32x4_splat(-87.0), f32x4_splat(87.0), f32x4_splat(1.0));
    let e = exp(f32x4_pmin(f32x4_pmax(f32x4_neg(x), lo), hi));
    f32x4_div(x, f32x4_add(one, e))
}

/// `gate[i] = silu(gate[i]) · up[i]` over the shorter of the two.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    let n = gate.len().min(up.len());
    let (g4, u4) = (gate[..n].chunks_exact_mut(4), up[..n].chunks_exact(4));
    let tail = n - n % 4;
    for (g, u) in g4.zip(u4) {
        // SAFETY: `g` and `u` are four f32 each; unaligned loads and stores are allowed.
        unsafe {
            let x = v128_load(g.as_ptr().cast());
            let u = v128_load(u.as_ptr().cast());
            v128_store(g.as_mut_ptr().cast(), f32x4_mul(silu4(x), u));
        }
    }
    for (g, &u) in gate[tail..n].iter_mut().zip(&up[tail..n]) {
        *g = ops::silu(*g) * u;
    }
}

/// `x[i] = silu(x[i])` in place.
pub fn silu(x: &mut [f32]) {
    let mut chunks = x.chunks_exact_mut(4);
    for c in &mut chunks {
        // SAFETY: `c` is four f32; unaligned loads and stores are allowed.
        unsafe { v128_store(c.as_mut_ptr().cast(), silu4(v128_load(c.as_ptr().cast()))) };
    }
    chunks.into_remainder().iter_mut().for_each(|v| *v = ops::silu(*v));
}
