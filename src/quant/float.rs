//! Unquantized element types: F32, F16, BF16 (weights and norms) and F64, I8..I64 (rare
//! metadata-like tensors, decoded to f32 for completeness).
//!
//! These types have no blocks: one element is one little-endian scalar, read with
//! `from_le_bytes` so no alignment is required. Their dot product takes raw f32 activations
//! (`GgmlType::vec_dot_type() == F32`) and accumulates in f64, like ggml's `ggml_vec_dot_f32`.

use half::{bf16, f16};

use super::{GgmlType, QuantError};

/// Decode `src` into `dst`; lengths were checked by [`super::dequantize`].
pub(crate) fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    use GgmlType::*;
    match ty {
        F32 => decode::<4>(src, dst, f32::from_le_bytes),
        F16 => decode::<2>(src, dst, |b| f16::from_le_bytes(b).to_f32()),
        BF16 => decode::<2>(src, dst, |b| bf16::from_le_bytes(b).to_f32()),
        F64 => decode::<8>(src, dst, |b| f64::from_le_bytes(b) as f32),
        I8 => decode::<1>(src, dst, |b| f32::from(i8::from_le_bytes(b))),
        I16 => decode::<2>(src, dst, |b| f32::from(i16::from_le_bytes(b))),
        I32 => decode::<4>(src, dst, |b| i32::from_le_bytes(b) as f32),
        I64 => decode::<8>(src, dst, |b| i64::from_le_bytes(b) as f32),
        _ => return Err(QuantError::Unsupported { ty, op: "dequantize" }),
    }
    Ok(())
}

/// Apply `f` to each `N`-byte element of `src`, writing one f32 per element.
fn decode<const N: usize>(src: &[u8], dst: &mut [f32], f: impl Fn([u8; N]) -> f32) {
    for (out, chunk) in dst.iter_mut().zip(src.chunks_exact(N)) {
        // chunks_exact(N) yields exactly N bytes, so the conversion cannot fail.
        let mut bytes = [0u8; N];
        bytes.copy_from_slice(chunk);
        *out = f(bytes);
    }
}

/// Dot product of a float weight row with raw little-endian f32 activations, summed in f64.
/// Returns NaN for a type this family has no dot product for (the caller never passes one).
pub(crate) fn vec_dot(ty: GgmlType, w: &[u8], act: &[u8]) -> f32 {
    let mut weights = vec![0f32; act.len() / 4];
    if dequantize(ty, w, &mut weights).is_err() {
        return f32::NAN;
    }
    let x = act
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    weights
        .iter()
        .zip(x)
        .map(|(&w, x)| f64::from(w) * f64::from(x))
        .sum::<f64>() as f32
}

/// Activations for float weights are the f32 values themselves, little-endian.
pub(crate) fn quantize_f32(src: &[f32], dst: &mut Vec<u8>) {
    dst.reserve(src.len() * 4);
    for v in src {
        dst.extend_from_slice(&v.to_le_bytes());
    }
}
