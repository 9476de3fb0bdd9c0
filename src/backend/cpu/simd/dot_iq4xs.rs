//! IQ4_XS in the file layout against Q8_K activations, through the super-block driver
//! (`superblocks`), so that a prefill's rows take its tiled VNNI kernels: each weight tile is
//! unpacked once for all activation rows, where the register tiles it had before unpacked
//! each super-block again for every activation row. AMD EPYC (Zen 4), 2 threads, a
//! qwen3moe-2l in IQ4_XS: prefill pp512 377 → 1286 tok/s, decode 164 → 199 (medians).
//!
//! Per 32 values: their nibbles index ggml's non-linear levels (`kvalues_iq4nl`, signed bytes)
//! through one `pshufb`, and `maddubs` of the levels' magnitudes with the activations under the
//! levels' signs, then `madd` with the group's scale `ls - 32`, sum `Σ ls·level·q8` exactly in
//! i32 lanes over the super-block; the driver takes it from there with `d_w`.

use std::arch::x86_64::*;

use super::dot_legacy::{nibbles, KVALUES_IQ4NL};
use super::superblocks::{run, RowsFn, SuperBlocks};
use crate::quant::iquant::{iq4xs_scale, BlockIq4Xs};
use crate::quant::GgmlType;

/// Bytes of an IQ4_XS block: `d`, `scales_h`, `scales_l[4]`, `qs[128]`.
const BLOCK: usize = 136;

/// The super-block's scale `d` and its eight group scales `ls - 32` (decoded once).
struct Head {
    d: f32,
    ls: [i16; 8],
}

/// One group of 32: its levels as signed bytes and its scale.
#[derive(Clone, Copy)]
struct Group {
    levels: __m256i,
    scale: i16,
}

/// The kernels of IQ4_XS.
struct Iq4Xs;

impl SuperBlocks for Iq4Xs {
    const BYTES: usize = BLOCK;
    // One scale per group of 32.
    const SCALE_SPAN: usize = 32;
    type Head = Head;
    type Group = Group;

    #[inline(always)]
    unsafe fn head(p: *const u8) -> Head {
        // The oracle's decoding of the scales (quant::iquant), once per super-block and row.
        let block = bytemuck::pod_read_unaligned::<BlockIq4Xs>(std::slice::from_raw_parts(p, BLOCK));
        let mut ls = [0i16; 8];
        for (g, l) in ls.iter_mut().enumerate() {
            *l = iq4xs_scale(&block, g) as i16 - 32;
        }
        Head {
            d: block.d.to_f32(),
            ls,
        }
    }

    #[inline(always)]
    fn scale(head: &Head) -> f32 {
        head.d
    }

    #[inline(always)]
    unsafe fn group(p: *const u8, head: &Head, g: usize) -> Group {
        let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i));
        Group {
            levels: _mm256_shuffle_epi8(table, nibbles(p.add(8 + 16 * g))),
            scale: head.ls[g],
        }
    }

    #[inline(always)]
    unsafe fn values(x: &Group) -> (__m256i, [i32; 2]) {
        (x.levels, [i32::from(x.scale); 2])
    }

    #[inline(always)]
    unsafe fn meet(x: &Group, q8: __m256i) -> __m256i {
        // |level| ≤ 127, so a pair of products fits an i16 lane.
        let products = _mm256_maddubs_epi16(_mm256_sign_epi8(x.levels, x.levels), _mm256_sign_epi8(q8, x.levels));
        _mm256_madd_epi16(products, _mm256_set1_epi16(x.scale))
    }
}

/// The kernel of `ty`, if it is IQ4_XS.
pub(super) fn kernel(ty: GgmlType) -> Option<RowsFn> {
    (ty == GgmlType::IQ4_XS).then_some(run::<Iq4Xs> as RowsFn)
}
