//! F32, F16 and BF16 weight rows against f32 activations (already rounded to the weight's
//! precision, as ggml converts them): 8 weights at a time widened to f32 (F16C for F16, a
//! 16-bit shift for BF16) and fused multiply-added into one 8-lane accumulator per output.

use std::arch::x86_64::*;

use super::lanes::{for_tiles, hsum_ps};
use crate::backend::cpu::tile::{Activations, TileOut};
use crate::quant::GgmlType;

const F32: u8 = 0;
const F16: u8 = 1;
const BF16: u8 = 2;

const R: usize = 4;
const C: usize = 2;

const fn elem_bytes(kind: u8) -> usize {
    if kind == F32 {
        4
    } else {
        2
    }
}

/// Eight weights from `p` as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load8<const K: u8>(p: *const u8) -> __m256 {
    match K {
        F32 => _mm256_loadu_ps(p as *const f32),
        F16 => _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
        _ => _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i)),
            16,
        )),
    }
}

/// One weight as f32 (the tail past the last multiple of 8).
#[inline]
fn load1<const K: u8>(w: &[u8], i: usize) -> f32 {
    let e = elem_bytes(K);
    let b = &w[i * e..(i + 1) * e];
    match K {
        F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        F16 => half::f16::from_le_bytes([b[0], b[1]]).to_f32(),
        _ => half::bf16::from_le_bytes([b[0], b[1]]).to_f32(),
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kernel<const K: u8, const RR: usize, const CC: usize>(
    k: usize,
    weights: &[u8],
    act: &Activations,
    w0: usize,
    a0: usize,
    out: &mut TileOut<'_>,
) {
    let rb = k * elem_bytes(K);
    let w = weights.as_ptr().add(w0 * rb);
    let a = act.values.as_ptr().add(a0 * k);
    let k8 = k / 8 * 8;
    let mut acc = [[_mm256_setzero_ps(); CC]; RR];
    for i in (0..k8).step_by(8) {
        for r in 0..RR {
            let x = load8::<K>(w.add(r * rb + i * elem_bytes(K)));
            for c in 0..CC {
                acc[r][c] = _mm256_fmadd_ps(x, _mm256_loadu_ps(a.add(c * k + i)), acc[r][c]);
            }
        }
    }
    for r in 0..RR {
        let row = &weights[(w0 + r) * rb..(w0 + r + 1) * rb];
        for c in 0..CC {
            let y = &act.values[(a0 + c) * k..(a0 + c + 1) * k];
            let tail: f32 = (k8..k).map(|i| load1::<K>(row, i) * y[i]).sum();
            out.set(a0 + c, w0 + r, hsum_ps(acc[r][c]) + tail);
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run<const K: u8>(k: usize, weights: &[u8], act: &Activations, out: &mut TileOut<'_>) {
    let nw = weights.len() / (k * elem_bytes(K));
    for_tiles::<R, C>(nw, act.rows, |w0, a0, r, c| match (r, c) {
        (R, C) => kernel::<K, R, C>(k, weights, act, w0, a0, out),
        (R, _) => kernel::<K, R, 1>(k, weights, act, w0, a0, out),
        (_, C) => kernel::<K, 1, C>(k, weights, act, w0, a0, out),
        _ => kernel::<K, 1, 1>(k, weights, act, w0, a0, out),
    });
}

/// See [`super::tile`]; lengths were checked there.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn tile(ty: GgmlType, k: usize, weights: &[u8], act: &Activations, out: &mut TileOut<'_>) -> bool {
    match ty {
        GgmlType::F32 => run::<F32>(k, weights, act, out),
        GgmlType::F16 => run::<F16>(k, weights, act, out),
        GgmlType::BF16 => run::<BF16>(k, weights, act, out),
        _ => return false,
    }
    true
}
