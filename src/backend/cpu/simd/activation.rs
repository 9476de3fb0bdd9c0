//! SiLU, alone and as the SwiGLU gate `silu(gate) · up`, eight values at a time.
//!
//! Decode spends about 2% of a batched step in the scalar `expf` of [`ops::silu`]: the gate
//! is `rows × n_ff` values per layer, so this cost grows with every sequence in the batch while
//! the weight-bound matmuls do not. Here `e^-x` is `2^n · e^r` with `n = round(-x · log2 e)`
//! and `|r| ≤ ln 2 / 2` (two-part `ln 2`, as Cody and Waite), `e^r` from its Taylor series to
//! degree 7 (truncation below 2e-8 relative), so the result is within a few f32 ulps of
//! [`ops::silu`], the slow twin the tests compare it with.
//!
//! [`ops::silu`]: super::super::ops::silu

use std::arch::x86_64::*;

use super::super::ops;

/// `e^x` for `x` in [-87, 88] (callers clamp): no overflow, no subnormals.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp(x: __m256) -> __m256 {
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
    // Horner from 1/7! down to 1.
    let mut p = _mm256_set1_ps(1.0 / 5040.0);
    for c in [1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    // 2^n from the exponent bits (n in [-126, 127] for the clamped range).
    let two_n = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    )));
    _mm256_mul_ps(p, two_n)
}

/// `x / (1 + e^-x)` of eight values. Beyond ±87 the clamp changes `e^-x` but not the result:
/// `x / (1 + e^-87)` is `x` in f32, and `x / (1 + e^87)` is within 1e-36 of the true value.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn silu8(x: __m256) -> __m256 {
    let (lo, hi) = (_mm256_set1_ps(-87.0), _mm256_set1_ps(87.0));
    let e = exp(_mm256_min_ps(
        _mm256_max_ps(_mm256_sub_ps(_mm256_setzero_ps(), x), lo),
        hi,
    ));
    _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e))
}

/// `gate[i] = silu(gate[i]) · up[i]` over the shorter of the two.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn swiglu(gate: &mut [f32], up: &[f32]) {
    let n = gate.len().min(up.len());
    let mut i = 0;
    while i + 8 <= n {
        let x = _mm256_loadu_ps(gate.as_ptr().add(i));
        let u = _mm256_loadu_ps(up.as_ptr().add(i));
        _mm256_storeu_ps(gate.as_mut_ptr().add(i), _mm256_mul_ps(silu8(x), u));
        i += 8;
    }
    for (g, &u) in gate[i..n].iter_mut().zip(&up[i..n]) {
        *g = ops::silu(*g) * u;
    }
}

/// `x[i] = silu(x[i])` in place.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn silu(x: &mut [f32]) {
    let mut chunks = x.chunks_exact_mut(8);
    for c in &mut chunks {
        _mm256_storeu_ps(c.as_mut_ptr(), silu8(_mm256_loadu_ps(c.as_ptr())));
    }
    chunks.into_remainder().iter_mut().for_each(|v| *v = ops::silu(*v));
}
