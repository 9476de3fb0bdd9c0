//! Tensor element formats of GGUF files (ggml types).
//!
//! Every format is defined once here: its type id, block size and block byte size, a
//! `#[repr(C)]` block struct (in the family file) with a compile-time size assert, a scalar
//! dequantizer and a scalar dot product against the matching activation quantization
//! (Q8_0 or Q8_K). These scalar functions are the oracle every fast kernel (AVX2, WGSL) is
//! tested against, so they favour clarity over speed.
//!
//! Family files: `float.rs` (F32, F16, BF16), `legacy.rs` (Q4_0..Q8_1), `kquant.rs`
//! (Q2_K..Q8_K), `iquant.rs` + `iquant_grids.rs` (IQ*), `fp4.rs` (MXFP4, NVFP4),
//! `ternary.rs` (TQ1_0, TQ2_0), `sign.rs` (Q1_0).

pub mod float;
pub mod fp4;
pub mod iquant;
mod iquant_grids;
#[cfg(all(test, target_arch = "x86_64"))]
pub(crate) use iquant_grids::KSIGNS_IQ2XS;
/// The grids of the IQ1-IQ3 formats, for the AVX2 kernels' gathers (and ggml's sign table, which
/// their own tables are checked against) and the GPU decoders' tables (`backend::gpu::grids`).
pub(crate) use iquant_grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};
/// ggml's non-linear 4-bit levels of IQ4_NL/IQ4_XS and its doubled E2M1 levels of MXFP4, for
/// the SIMD kernels' lookups too.
#[cfg(any(target_arch = "x86_64", all(target_arch = "wasm32", target_feature = "simd128")))]
pub(crate) use iquant_grids::{KVALUES_FP4, KVALUES_IQ4NL};
pub mod kquant;
pub mod legacy;
pub mod sign;
pub mod support;
pub mod ternary;

use std::fmt;

/// Errors from decoding or multiplying quantized data.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QuantError {
    #[error("unknown ggml tensor type id {0}")]
    UnknownTypeId(u32),
    #[error("{ty} has no scalar {op} implementation")]
    Unsupported { ty: GgmlType, op: &'static str },
    #[error("{ty}: {elements} elements is not a multiple of the block size {block_size}")]
    PartialBlock {
        ty: GgmlType,
        elements: usize,
        block_size: usize,
    },
    #[error("{ty}: expected {expected} bytes for {elements} elements, got {got}")]
    ByteLength {
        ty: GgmlType,
        elements: usize,
        expected: usize,
        got: usize,
    },
    #[error("{ty}: data is not aligned to {align} bytes")]
    Misaligned { ty: GgmlType, align: usize },
}

macro_rules! ggml_types {
    ($( $name:ident = $id:literal, $label:literal, $block:literal, $bytes:literal; )*) => {
        /// A ggml tensor element type, numbered as in GGUF files.
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum GgmlType { $( $name = $id, )* }

        impl GgmlType {
            /// Every type this crate knows, in id order.
            pub const ALL: &'static [GgmlType] = &[ $( GgmlType::$name, )* ];

            /// The type for a GGUF type id, or an error naming the id.
            pub fn from_id(id: u32) -> Result<Self, QuantError> {
                match id {
                    $( $id => Ok(GgmlType::$name), )*
                    other => Err(QuantError::UnknownTypeId(other)),
                }
            }

            /// The name llama.cpp uses (`Q4_K`, `IQ2_XXS`, ...).
            pub fn name(self) -> &'static str {
                match self { $( GgmlType::$name => $label, )* }
            }

            /// Elements per block.
            pub fn block_size(self) -> usize {
                match self { $( GgmlType::$name => $block, )* }
            }

            /// Bytes per block.
            pub fn block_bytes(self) -> usize {
                match self { $( GgmlType::$name => $bytes, )* }
            }
        }
    };
}

ggml_types! {
    F32 = 0, "F32", 1, 4;
    F16 = 1, "F16", 1, 2;
    Q4_0 = 2, "Q4_0", 32, 18;
    Q4_1 = 3, "Q4_1", 32, 20;
    Q5_0 = 6, "Q5_0", 32, 22;
    Q5_1 = 7, "Q5_1", 32, 24;
    Q8_0 = 8, "Q8_0", 32, 34;
    Q8_1 = 9, "Q8_1", 32, 36;
    Q2_K = 10, "Q2_K", 256, 84;
    Q3_K = 11, "Q3_K", 256, 110;
    Q4_K = 12, "Q4_K", 256, 144;
    Q5_K = 13, "Q5_K", 256, 176;
    Q6_K = 14, "Q6_K", 256, 210;
    Q8_K = 15, "Q8_K", 256, 292;
    IQ2_XXS = 16, "IQ2_XXS", 256, 66;
    IQ2_XS = 17, "IQ2_XS", 256, 74;
    IQ3_XXS = 18, "IQ3_XXS", 256, 98;
    IQ1_S = 19, "IQ1_S", 256, 50;
    IQ4_NL = 20, "IQ4_NL", 32, 18;
    IQ3_S = 21, "IQ3_S", 256, 110;
    IQ2_S = 22, "IQ2_S", 256, 82;
    IQ4_XS = 23, "IQ4_XS", 256, 136;
    I8 = 24, "I8", 1, 1;
    I16 = 25, "I16", 1, 2;
    I32 = 26, "I32", 1, 4;
    I64 = 27, "I64", 1, 8;
    F64 = 28, "F64", 1, 8;
    IQ1_M = 29, "IQ1_M", 256, 56;
    BF16 = 30, "BF16", 1, 2;
    TQ1_0 = 34, "TQ1_0", 256, 54;
    TQ2_0 = 35, "TQ2_0", 256, 66;
    MXFP4 = 39, "MXFP4", 32, 17;
    NVFP4 = 40, "NVFP4", 64, 36;
    Q1_0 = 41, "Q1_0", 128, 18;
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl GgmlType {
    /// Parse a llama.cpp type name (`q4_k`, `Q4_K`); case-insensitive.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// Bytes needed for `elements` values, or `None` when `elements` is not a whole number of
    /// blocks or the size overflows.
    pub fn bytes_for(self, elements: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if !elements.is_multiple_of(bs) {
            return None;
        }
        (elements / bs).checked_mul(self.block_bytes() as u64)
    }

    /// Check that `bytes` holds exactly `elements` values of this type.
    pub fn check_len(self, bytes: usize, elements: usize) -> Result<(), QuantError> {
        if !elements.is_multiple_of(self.block_size()) {
            return Err(QuantError::PartialBlock {
                ty: self,
                elements,
                block_size: self.block_size(),
            });
        }
        let expected = elements / self.block_size() * self.block_bytes();
        if bytes != expected {
            return Err(QuantError::ByteLength {
                ty: self,
                elements,
                expected,
                got: bytes,
            });
        }
        Ok(())
    }

    /// The activation format this type's scalar dot product takes as its right-hand side:
    /// Q8_0 for the 32-element formats, Q8_K for the 256-element ones, F32 for float types.
    pub fn vec_dot_type(self) -> GgmlType {
        use GgmlType::*;
        match self {
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 | IQ4_NL | MXFP4 | NVFP4 | Q1_0 => Q8_0,
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | Q8_K | IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ1_S | IQ1_M
            | IQ4_XS | TQ1_0 | TQ2_0 => Q8_K,
            _ => F32,
        }
    }
}

/// Decode `src` (whole blocks of `ty`) into `dst`; `dst.len()` gives the element count.
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    use GgmlType::*;
    ty.check_len(src.len(), dst.len())?;
    match ty {
        F32 | F16 | BF16 | F64 | I8 | I16 | I32 | I64 => float::dequantize(ty, src, dst),
        Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 => legacy::dequantize(ty, src, dst),
        Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | Q8_K => kquant::dequantize(ty, src, dst),
        IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ1_S | IQ1_M | IQ4_NL | IQ4_XS => {
            iquant::dequantize(ty, src, dst)
        }
        MXFP4 | NVFP4 => fp4::dequantize(ty, src, dst),
        TQ1_0 | TQ2_0 => ternary::dequantize(ty, src, dst),
        Q1_0 => sign::dequantize(ty, src, dst),
    }
}

/// Quantize f32 activations `src` into `ty`'s activation format (`ty.vec_dot_type()`),
/// appending whole blocks to `dst`. `src.len()` must be a multiple of that format's block.
pub fn quantize_activations(ty: GgmlType, src: &[f32], dst: &mut Vec<u8>) -> Result<(), QuantError> {
    let act = ty.vec_dot_type();
    if !src.len().is_multiple_of(act.block_size()) {
        return Err(QuantError::PartialBlock {
            ty: act,
            elements: src.len(),
            block_size: act.block_size(),
        });
    }
    match act {
        GgmlType::Q8_0 => legacy::quantize_q8_0(src, dst),
        GgmlType::Q8_K => kquant::quantize_q8_k(src, dst),
        _ => float::quantize_f32(src, dst),
    }
    Ok(())
}

/// Scalar dot product of one weight row `w` (whole blocks of `ty`, `n` elements) with an
/// activation row `act` already in `ty.vec_dot_type()` format (see [`quantize_activations`]).
pub fn vec_dot(ty: GgmlType, n: usize, w: &[u8], act: &[u8]) -> Result<f32, QuantError> {
    use GgmlType::*;
    ty.check_len(w.len(), n)?;
    ty.vec_dot_type().check_len(act.len(), n)?;
    match ty {
        F32 | F16 | BF16 => Ok(float::vec_dot(ty, w, act)),
        Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 => Ok(legacy::vec_dot(ty, w, act)),
        Q2_K | Q3_K | Q4_K | Q5_K | Q6_K => Ok(kquant::vec_dot(ty, w, act)),
        IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ1_S | IQ1_M | IQ4_NL | IQ4_XS => Ok(iquant::vec_dot(ty, w, act)),
        MXFP4 | NVFP4 => Ok(fp4::vec_dot(ty, w, act)),
        TQ1_0 | TQ2_0 => Ok(ternary::vec_dot(ty, w, act)),
        Q1_0 => Ok(sign::vec_dot(ty, w, act)),
        Q8_1 | Q8_K | F64 | I8 | I16 | I32 | I64 => Err(QuantError::Unsupported { ty, op: "vec_dot" }),
    }
}

#[cfg(test)]
mod support_tests {
    use super::*;

    /// The table names formats the crate knows, once each, all with a scalar dot product.
    #[test]
    fn the_support_table_is_consistent() {
        let all = supported(|_| true);
        assert_eq!(all.len(), support::SUPPORT.len());
        let mut seen = std::collections::HashSet::new();
        for ty in all {
            assert!(seen.insert(ty), "{ty} twice");
            assert!(has_vec_dot(ty), "{ty} has no scalar reference");
        }
        for s in support::SUPPORT {
            assert!(
                !s.wgsl_texture || s.wgsl,
                "{}: a texture decoder without a WGSL one",
                s.name
            );
        }
    }
}

/// Whether [`vec_dot`] multiplies rows of `ty` (every weight format; not the activation and
/// integer types).
pub fn has_vec_dot(ty: GgmlType) -> bool {
    use GgmlType::*;
    !matches!(ty, Q8_1 | Q8_K | F64 | I8 | I16 | I32 | I64)
}

/// The row of [`support::SUPPORT`] for `ty`, if some fast kernel reads it.
pub fn support_of(ty: GgmlType) -> Option<&'static support::Support> {
    // Every matmul asks (a decode step thousands of times): looked up once per type, by id.
    static BY_ID: std::sync::LazyLock<Vec<Option<&'static support::Support>>> = std::sync::LazyLock::new(|| {
        let mut by_id = vec![None; GgmlType::ALL.iter().map(|&t| t as usize + 1).max().unwrap_or(0)];
        for &t in GgmlType::ALL {
            by_id[t as usize] = support::SUPPORT.iter().find(|s| s.name.eq_ignore_ascii_case(t.name()));
        }
        by_id
    });
    BY_ID.get(ty as usize).copied().flatten()
}

/// The formats of [`support::SUPPORT`] with `pick` set, in the table's order.
pub fn supported(pick: impl Fn(&support::Support) -> bool) -> Vec<GgmlType> {
    support::SUPPORT
        .iter()
        .filter(|s| pick(s))
        .map(|s| GgmlType::from_name(s.name).expect("the support table names known types"))
        .collect()
}

/// View `bytes` as a slice of block structs; errors (never panics) when misaligned.
pub(crate) fn cast_blocks<T: bytemuck::Pod>(ty: GgmlType, bytes: &[u8]) -> Result<&[T], QuantError> {
    if bytes.is_empty() {
        // An empty slice may carry a dangling, unaligned pointer; it holds no blocks either way.
        return Ok(&[]);
    }
    bytemuck::try_cast_slice(bytes).map_err(|_| QuantError::Misaligned {
        ty,
        align: std::mem::align_of::<T>(),
    })
}

#[cfg(test)]
#[path = "tests.rs"]
mod oracle_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_sizes_are_consistent() {
        for &t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t as u32), Ok(t));
            assert_eq!(GgmlType::from_name(&t.name().to_lowercase()), Some(t));
            assert!(t.block_bytes() > 0 && t.block_size() > 0);
        }
        assert_eq!(GgmlType::from_id(4), Err(QuantError::UnknownTypeId(4)));
        assert_eq!(GgmlType::from_id(1000), Err(QuantError::UnknownTypeId(1000)));
    }

    #[test]
    fn length_checks_name_the_problem() {
        let e = GgmlType::Q4_K.check_len(144, 100).unwrap_err();
        assert!(e.to_string().contains("not a multiple"), "{e}");
        let e = GgmlType::Q4_K.check_len(143, 256).unwrap_err();
        assert!(e.to_string().contains("expected 144 bytes"), "{e}");
    }
}
