//! STUB: to be written (see quant/mod.rs for the contract).

use super::{GgmlType, QuantError};

pub(crate) fn dequantize(ty: GgmlType, _src: &[u8], _dst: &mut [f32]) -> Result<(), QuantError> {
    Err(QuantError::Unsupported { ty, op: "dequantize" })
}

pub(crate) fn vec_dot(_ty: GgmlType, _w: &[u8], _act: &[u8]) -> f32 {
    f32::NAN
}

pub(crate) fn quantize_q8_0(_src: &[f32], _dst: &mut Vec<u8>) {}
