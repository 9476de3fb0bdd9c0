//! Activation quantization to Q8_0 and Q8_K with AVX2, byte for byte as the scalar quantizers
//! (`quant::legacy::quantize_q8_0`, `quant::kquant::quantize_q8_k`), which the tests check.
//!
//! For Q8_0 it also records, per block, the scale as f32 and what the weight format needs of the
//! block's sum `Σq`: `offset · Σq` for the offset formats (Q4_0: -8, Q5_0: -16) and `d · Σq`
//! (as the scalar oracle computes it) for those with a minimum (Q4_1, Q5_1), so the kernels do
//! not re-derive it per weight row.

use std::arch::x86_64::*;
use std::mem::size_of;

use half::f16;

use crate::backend::cpu::tile::Activations;
use crate::quant::kquant::{BlockQ8K, QK_K};
use crate::quant::legacy::{BlockQ8_0, QK};
use crate::quant::{GgmlType, QuantError};

/// Bytes of a prepared Q8_K activation block ([`BlockQ8K`]), as the kernels read it through raw
/// pointers: the f32 scale at 0, the 256 values at [`Q8K_VALUES`], 16 i16 sums of 16 values
/// each at [`Q8K_BSUMS`].
pub(super) const Q8K_BLOCK: usize = size_of::<BlockQ8K>();
pub(super) const Q8K_VALUES: usize = std::mem::offset_of!(BlockQ8K, qs);
pub(super) const Q8K_BSUMS: usize = std::mem::offset_of!(BlockQ8K, bsums);
/// Bytes of a prepared Q8_0 activation block ([`BlockQ8_0`]): the f16 scale, then 32 values.
pub(super) const Q8_0_BLOCK: usize = size_of::<BlockQ8_0>();

/// Convert `x` (rows of `k` values) for weights of type `ty` (one of [`super::supports`]).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
pub unsafe fn prepare(ty: GgmlType, x: &[f32], k: usize) -> Result<Activations, QuantError> {
    let act = ty.vec_dot_type();
    let rows = x.len().checked_div(k).unwrap_or(0);
    let x = &x[..rows * k];
    if !k.is_multiple_of(act.block_size()) {
        return Err(QuantError::PartialBlock {
            ty: act,
            elements: k,
            block_size: act.block_size(),
        });
    }
    let mut a = Activations::empty(rows, k);
    match act {
        GgmlType::Q8_0 => {
            let nb = x.len() / QK;
            a.bytes.reserve(nb * size_of::<BlockQ8_0>());
            a.scales.reserve(nb);
            let mut sums = Vec::with_capacity(nb);
            quantize_q8_0(x, &mut a.bytes, &mut a.scales, &mut sums);
            match ty {
                GgmlType::Q4_0 => a.offsets = sums.iter().map(|&s| -8 * s).collect(),
                GgmlType::Q5_0 => a.offsets = sums.iter().map(|&s| -16 * s).collect(),
                // For the VNNI kernels, which take signed weights as `w + 128`.
                GgmlType::Q8_0 | GgmlType::IQ4_NL | GgmlType::MXFP4 => {
                    a.offsets = sums.iter().map(|&s| -128 * s).collect()
                }
                GgmlType::Q4_1 | GgmlType::Q5_1 => {
                    a.dsums = sums.iter().zip(&a.scales).map(|(&s, &d)| d * s as f32).collect()
                }
                _ => {}
            }
            a.row_bytes = k / QK * size_of::<BlockQ8_0>();
        }
        GgmlType::Q8_K => {
            a.bytes.reserve(x.len() / QK_K * size_of::<BlockQ8K>());
            quantize_q8_k(x, &mut a.bytes);
            a.row_bytes = k / QK_K * size_of::<BlockQ8K>();
        }
        _ => {
            a.values = match ty {
                GgmlType::F16 => x.iter().map(|&v| f16::from_f32(v).to_f32()).collect(),
                GgmlType::BF16 => x.iter().map(|&v| half::bf16::from_f32(v).to_f32()).collect(),
                _ => x.to_vec(),
            };
        }
    }
    Ok(a)
}

/// Largest lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hmax_ps(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_movehdup_ps(m));
    _mm_cvtss_f32(m)
}

/// Four vectors of eight i32 (each within i8 range) as 32 bytes in element order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack_i8(q: [__m256i; 4]) -> __m256i {
    // packs work within 128-bit lanes; the permute puts the 4-byte groups back in order.
    let lo = _mm256_packs_epi32(q[0], q[1]);
    let hi = _mm256_packs_epi32(q[2], q[3]);
    let b = _mm256_packs_epi16(lo, hi);
    _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// Append `src` (whole blocks of 32) as Q8_0 blocks (`d = amax / 127`,
/// `q = round_ties_even(x · 127 / amax)`, ggml's x86 rule; see `quant::legacy::quantize_q8_0`),
/// plus each block's scale `d` and sum `Σq`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn quantize_q8_0(src: &[f32], dst: &mut Vec<u8>, scales: &mut Vec<f32>, sums: &mut Vec<i32>) {
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    for x in src.chunks_exact(QK) {
        let p = x.as_ptr();
        let v = [
            _mm256_loadu_ps(p),
            _mm256_loadu_ps(p.add(8)),
            _mm256_loadu_ps(p.add(16)),
            _mm256_loadu_ps(p.add(24)),
        ];
        let m01 = _mm256_max_ps(_mm256_and_ps(v[0], abs_mask), _mm256_and_ps(v[1], abs_mask));
        let m23 = _mm256_max_ps(_mm256_and_ps(v[2], abs_mask), _mm256_and_ps(v[3], abs_mask));
        let amax = hmax_ps(_mm256_max_ps(m01, m23));
        let d = amax / 127.0;
        let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
        let mut q = [_mm256_setzero_si256(); 4];
        for i in 0..4 {
            let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(v[i], id));
            q[i] = _mm256_cvtps_epi32(r);
        }
        let bytes = pack_i8(q);
        let dh = f16::from_f32(d);
        dst.extend_from_slice(&dh.to_le_bytes());
        let mut qs = [0u8; QK];
        _mm256_storeu_si256(qs.as_mut_ptr() as *mut __m256i, bytes);
        dst.extend_from_slice(&qs);
        scales.push(dh.to_f32());
        let s = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), bytes), _mm256_set1_epi16(1));
        sums.push(hsum_i32(s));
    }
}

/// Sum of the 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

/// Append `src` (whole blocks of 256) as Q8_K blocks: the first value of largest magnitude
/// maps to -127, `q = round_ties_even(-127 / max · x)`, `d = 1 / iscale`, `bsums` per 16 values.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn quantize_q8_k(src: &[f32], dst: &mut Vec<u8>) {
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    for x in src.chunks_exact(QK_K) {
        let p = x.as_ptr();
        let mut m = _mm256_setzero_ps();
        for i in 0..QK_K / 8 {
            m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(p.add(8 * i)), abs_mask));
        }
        let amax = hmax_ps(m);
        let mut block = BlockQ8K {
            d: 0.0,
            qs: [0; QK_K],
            bsums: [0; QK_K / 16],
        };
        if amax != 0.0 {
            // The scalar quantizer keeps the first value whose magnitude is the maximum.
            let target = _mm256_set1_ps(amax);
            let mut max = amax;
            for i in 0..QK_K / 8 {
                let eq = _mm256_cmp_ps(
                    _mm256_and_ps(_mm256_loadu_ps(p.add(8 * i)), abs_mask),
                    target,
                    _CMP_EQ_OQ,
                );
                let bits = _mm256_movemask_ps(eq);
                if bits != 0 {
                    max = x[8 * i + bits.trailing_zeros() as usize];
                    break;
                }
            }
            let iscale = -127.0 / max;
            let is = _mm256_set1_ps(iscale);
            let cap = _mm256_set1_epi32(127);
            for g in 0..QK_K / 32 {
                let mut q = [_mm256_setzero_si256(); 4];
                for (i, q) in q.iter_mut().enumerate() {
                    let v = _mm256_mul_ps(_mm256_loadu_ps(p.add(32 * g + 8 * i)), is);
                    let r = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                    *q = _mm256_min_epi32(_mm256_cvtps_epi32(r), cap);
                }
                let bytes = pack_i8(q);
                _mm256_storeu_si256(block.qs.as_mut_ptr().add(32 * g) as *mut __m256i, bytes);
                // Sums of 4, then of 16: lanes 0..4 cover the first 16 values.
                let s = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), bytes), _mm256_set1_epi16(1));
                let mut s4 = [0i32; 8];
                _mm256_storeu_si256(s4.as_mut_ptr() as *mut __m256i, s);
                // 16 values of at most 128 in magnitude fit i16.
                block.bsums[2 * g] = (s4[0] + s4[1] + s4[2] + s4[3]) as i16;
                block.bsums[2 * g + 1] = (s4[4] + s4[5] + s4[6] + s4[7]) as i16;
            }
            block.d = 1.0 / iscale;
        }
        dst.extend_from_slice(bytemuck::bytes_of(&block));
    }
}

/// The Q8_K blocks of `act` with each value as itself plus 128 in an unsigned byte (its top bit
/// flipped), scales and sums as they are: the unsigned operand of `vpdpbusd` for the kernels
/// whose weights are the signed one. Made once per batch (see [`Activations::unsigned`]).
pub(super) fn unsigned_q8k(act: &Activations) -> &[u8] {
    act.unsigned.get_or_init(|| {
        let mut bytes = act.bytes.clone();
        for block in bytes.chunks_exact_mut(Q8K_BLOCK) {
            for v in &mut block[Q8K_VALUES..Q8K_VALUES + QK_K] {
                *v ^= 0x80;
            }
        }
        bytes
    })
}
