//! The formats a KV cache can hold ([`KvType`], `--cache-type`), chosen per sequence state
//! when it is made ([`crate::backend::interface::Backend::alloc_kv`]).
//!
//! - `f16`, the default: each value rounded to f16, as llama.cpp's default cache.
//! - `q8_0`: ggml's Q8_0 blocks (32 values, one f16 scale `d = max|x| / 127`, 32 int8
//!   `q = round(x / d)`), quantized with the rule llama.cpp's CPU backend stores its `-ctk q8_0
//!   -ctv q8_0` cache with ([`crate::quant::legacy::quantize_q8_0_blocks`]), after the heads
//!   are rotated as llama.cpp rotates them ([`super::rotation`]); 34 bytes per 32
//!   values, 47% less than f16. Attention reads the blocks directly: q·k as ggml's Q8_0 dot
//!   product (q quantized to Q8_0 too, integer sums per block) and the value rows dequantized
//!   block by block inside the weighted sum, as llama.cpp's flash-attention path does for a
//!   quantized cache. A row must be whole blocks: every K and V head a multiple of 32 values.

use std::fmt;
use std::str::FromStr;

/// The element format of a KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KvType {
    /// Values rounded to f16 (2 bytes each).
    #[default]
    F16,
    /// Q8_0 blocks of 32 values (34 bytes per block).
    Q8_0,
}

impl KvType {
    /// Every type, with the name a user types.
    pub const ALL: [(KvType, &'static str); 2] = [(KvType::F16, "f16"), (KvType::Q8_0, "q8_0")];

    /// The name a user types (`f16`, `q8_0`).
    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
        }
    }

    /// Values per block: a row's width must be a multiple of it, and so must every head's.
    pub fn block_values(self) -> usize {
        match self {
            KvType::F16 => 1,
            KvType::Q8_0 => crate::quant::legacy::QK,
        }
    }

    /// Bytes of one block.
    pub fn block_bytes(self) -> usize {
        match self {
            KvType::F16 => 2,
            KvType::Q8_0 => std::mem::size_of::<crate::quant::legacy::BlockQ8_0>(),
        }
    }

    /// Bytes the format takes for `values` values (a whole number of blocks). This is what the
    /// CPU backend allocates; a GPU backend may pad (WebGPU holds an f16 cache as f32).
    pub fn bytes(self, values: usize) -> usize {
        values.div_ceil(self.block_values()) * self.block_bytes()
    }

    /// Why heads of `head_dim` values cannot live in this format (`None`: they can).
    pub fn head_problem(self, what: &str, head_dim: usize) -> Option<String> {
        let b = self.block_values();
        (!head_dim.is_multiple_of(b)).then(|| {
            format!(
                "{what} heads of {head_dim} values are not whole {} blocks of {b}",
                self.name()
            )
        })
    }
}

impl fmt::Display for KvType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A cache type name that is none of [`KvType::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown KV cache type '{0}' (expected one of: f16, q8_0)")]
pub struct UnknownKvType(pub String);

impl FromStr for KvType {
    type Err = UnknownKvType;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        KvType::ALL
            .iter()
            .find(|(_, n)| n.eq_ignore_ascii_case(s.trim()))
            .map(|&(t, _)| t)
            .ok_or_else(|| UnknownKvType(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_sizes_follow_the_blocks() {
        for (t, n) in KvType::ALL {
            assert_eq!(n.parse::<KvType>(), Ok(t));
            assert_eq!(t.to_string(), n);
        }
        assert_eq!("Q8_0".parse::<KvType>(), Ok(KvType::Q8_0));
        let err = "q4_0".parse::<KvType>().unwrap_err().to_string();
        assert!(err.contains("q4_0") && err.contains("f16, q8_0"), "{err}");
        assert_eq!(KvType::F16.bytes(128), 256);
        assert_eq!(KvType::Q8_0.bytes(128), 136);
        assert_eq!(KvType::Q8_0.head_problem("k", 64), None);
        assert!(KvType::Q8_0.head_problem("k", 80).unwrap().contains("80"));
        assert_eq!(KvType::F16.head_problem("k", 80), None);
    }
}
