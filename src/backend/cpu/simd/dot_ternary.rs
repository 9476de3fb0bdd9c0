//! The base-3 ternary format (TQ1_0) in the file layout against Q8_K activations (TQ2_0, with
//! Q2_K's bit layout, is interleaved: `dot_ktile`).
//!
//! Per 32 values, their codes 0..3 (value `32g + l` in byte `l`) meet the activations in one
//! `maddubs`, less one `maddubs` for the one each value takes off its code (its value is the
//! code less 1), summed in i32 lanes, so the super-block's `Σ q·q8` is exact; the driver
//! (`superblocks`) takes it from there.

use std::arch::x86_64::*;

use super::lanes::load_f16;
use super::superblocks::{run, RowsFn, SuperBlocks};
use crate::quant::ternary::{tq1_trits, BlockTq1_0};
use crate::quant::GgmlType;

/// Bytes of a TQ1_0 block.
const BLOCK: usize = 54;

/// The super-block's scale and its codes (decoded once for its eight groups).
struct Head {
    d: f32,
    trits: [u8; 256],
}

/// The kernels of TQ1_0.
struct Tq1;

impl SuperBlocks for Tq1 {
    const BYTES: usize = BLOCK;
    // Every scale is 1.
    const SCALE_SPAN: usize = 32;
    type Head = Head;
    /// The group's codes.
    type Group = __m256i;

    #[inline(always)]
    unsafe fn head(p: *const u8) -> Head {
        // The oracle's decoding (quant::ternary), once per super-block and row.
        let block = bytemuck::pod_read_unaligned::<BlockTq1_0>(std::slice::from_raw_parts(p, BLOCK));
        Head {
            d: load_f16(p.add(BLOCK - 2)),
            trits: tq1_trits(&block).map(|t| t as u8),
        }
    }

    #[inline(always)]
    fn scale(head: &Head) -> f32 {
        head.d
    }

    #[inline(always)]
    unsafe fn group(_: *const u8, head: &Head, g: usize) -> __m256i {
        _mm256_loadu_si256(head.trits.as_ptr().add(32 * g) as *const __m256i)
    }

    #[inline(always)]
    unsafe fn values(q: &__m256i) -> (__m256i, [i32; 2]) {
        (_mm256_sub_epi8(*q, _mm256_set1_epi8(1)), [1, 1])
    }

    #[inline(always)]
    unsafe fn meet(q: &__m256i, q8: __m256i) -> __m256i {
        let p = _mm256_sub_epi16(
            _mm256_maddubs_epi16(*q, q8),
            _mm256_maddubs_epi16(_mm256_set1_epi8(1), q8),
        );
        _mm256_madd_epi16(p, _mm256_set1_epi16(1))
    }
}

/// The kernel of `ty`, if it is TQ1_0.
pub(super) fn kernel(ty: GgmlType) -> Option<RowsFn> {
    (ty == GgmlType::TQ1_0).then_some(run::<Tq1> as RowsFn)
}
