//! SIMD kernels of the CPU backend (x86_64 only): AVX2, and AVX-VNNI or AVX-512 VNNI dot
//! products where the CPU has them, one entry per instruction set, chosen at run time by
//! [`super::kernels::Kernels::detect`]. Which formats they cover is [`crate::quant::support`].
//!
//! The arithmetic is ggml's: activations are quantized once per batch (Q8_0 or Q8_K, byte for
//! byte as the scalar quantizers in [`crate::quant`]), each weight block meets each activation
//! block in exact integer products (`maddubs`/`madd`, or one `vpdpbusd`), and only the
//! per-block scaling is f32. So a result differs from the scalar oracle
//! [`crate::quant::vec_dot`] only in the order of the f32 additions, and the instruction sets
//! give the same bits.
//!
//! Every kernel computes a tile of `R` weight rows × `C` activation rows with one accumulator per
//! output, streaming the blocks of the `R` rows once per tile. Each output goes through the same
//! operations in the same order whatever the tile shape, so results do not depend on how the
//! work was split (thread count, tail tiles, batch size).
//!
//! The 32-value formats, Q4_K/Q5_K/Q6_K (the K-quants of the common Q4_K_M files), Q2_K, Q3_K, TQ2_0 and IQ4_XS work on weights
//! interleaved at load ([`super::interleave`]): one load and a mask give four values of eight
//! rows, a row per lane, so a block's exact integer sums for eight rows land in one vector with
//! no sum across lanes (decode), and batches unpack each tile once and reuse it for every
//! activation row. The other formats keep an 8-lane accumulator per output, summed at the end.
//!
//! Files: `q8.rs` (activation quantizers), `dot_legacy.rs` (interleaved 32-value formats
//! against Q8_0), `dot_ktile.rs` (interleaved Q2_K/Q3_K/Q4_K/Q5_K/Q6_K/TQ2_0/IQ4_XS against
//! Q8_K), `dot_ternary.rs` (TQ1_0 rows against Q8_K),
//! `dot_iquant.rs` (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S rows against Q8_K), `dot_iq1.rs`
//! (IQ1_S, IQ1_M rows against Q8_K), `dot_sign.rs` (Q1_0 rows against Q8_0), `dot_float.rs`
//! (F32/F16/BF16 rows).

// Register tiles are `[[acc; C]; R]` arrays indexed by (weight row, activation row) in nested
// loops that the compiler unrolls; iterators would hide that shape.
#![allow(clippy::needless_range_loop)]

/// Run `$call` for each group of up to [`LANE_C`] activation rows of `$rows`, with `$a0` the
/// group's first row and `$cc` its width as a constant (the register tile's shape). With
/// `wide`, groups of eight while they last (the 512-bit kernels of `wide`, whose 32 registers
/// hold eight rows' sums: `cargo bench --bench kernels`, Q4_K 512 rows, 373-416 against
/// 310 GOP/s with four).
macro_rules! for_row_groups {
    // Each group takes the widest of `$w` (widest first, ending with 1) that the rows left fill.
    (@widths [$($w:literal),+] $rows:expr, |$a0:ident, $cc:ident| $call:expr) => {{
        let rows: usize = $rows;
        let mut $a0 = 0;
        'groups: while $a0 < rows {
            $(
                if rows - $a0 >= $w {
                    {
                        const $cc: usize = $w;
                        $call
                    }
                    $a0 += $w;
                    continue 'groups;
                }
            )+
        }
    }};
    (wide $rows:expr, |$a0:ident, $cc:ident| $call:expr) => {
        for_row_groups!(@widths [8, 4, 3, 2, 1] $rows, |$a0, $cc| $call)
    };
    ($rows:expr, |$a0:ident, $cc:ident| $call:expr) => {
        for_row_groups!(@widths [4, 3, 2, 1] $rows, |$a0, $cc| $call)
    };
}

/// Entry points of a kernel module's `$run::<K, V>` (`#[inline(always)]`, with no target
/// features of its own) compiled for each [`Isa`]: the body inlines into a function with that
/// ISA's target features, so the intrinsics it calls inline there too. `$entry::<K>(isa)` picks
/// one. (A macro because a function's target features cannot depend on a const parameter.)
macro_rules! isa_entries {
    ($run:ident, $entry:ident) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn run_avx2<const K: u8>(nb: usize, nw: usize, w: &[u8], act: &Activations, out: &mut TileOut<'_>) {
            $run::<K, { $crate::backend::cpu::simd::lanes::AVX2 }>(nb, nw, w, act, out)
        }

        #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
        unsafe fn run_avxvnni<const K: u8>(nb: usize, nw: usize, w: &[u8], act: &Activations, out: &mut TileOut<'_>) {
            $run::<K, { $crate::backend::cpu::simd::lanes::AVX_VNNI }>(nb, nw, w, act, out)
        }

        #[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
        unsafe fn run_avx512vnni<const K: u8>(
            nb: usize,
            nw: usize,
            w: &[u8],
            act: &Activations,
            out: &mut TileOut<'_>,
        ) {
            $run::<K, { $crate::backend::cpu::simd::lanes::AVX512_VNNI }>(nb, nw, w, act, out)
        }

        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni,avx512vl")]
        unsafe fn run_avx512<const K: u8>(nb: usize, nw: usize, w: &[u8], act: &Activations, out: &mut TileOut<'_>) {
            $run::<K, { $crate::backend::cpu::simd::lanes::AVX512 }>(nb, nw, w, act, out)
        }

        fn $entry<const K: u8>(
            isa: $crate::backend::cpu::simd::lanes::Isa,
        ) -> $crate::backend::cpu::simd::lanes::RunFn {
            match isa {
                $crate::backend::cpu::simd::lanes::Isa::Avx2 => run_avx2::<K>,
                $crate::backend::cpu::simd::lanes::Isa::AvxVnni => run_avxvnni::<K>,
                $crate::backend::cpu::simd::lanes::Isa::Avx512Vnni => run_avx512vnni::<K>,
                $crate::backend::cpu::simd::lanes::Isa::Avx512 => run_avx512::<K>,
            }
        }
    };
}

/// The driver of a kernel module on interleaved tiles (`dot_legacy`, `dot_ktile`), written once:
/// `run::<K, V>` walks the tiles of `nw` weight rows of `nb` blocks and meets each with every
/// activation row, up to four at a time, through the module's `dot::<K, CC, BUF, V>`; batches of
/// at least `unpack_min_rows(K)` rows unpack each tile into the module's `Unpacked` first
/// (`unpack::<K, V>`, which sizes it). Then [`isa_entries!`] makes its entry points. It uses
/// those names, `R` and `block_bytes` of the module it expands in.
///
/// On [`Isa::Avx512`], batches of at least `wide_min_rows(K)` rows go to the module's
/// `wide_tiles::<K>` instead, which takes them sixteen weight rows at a time (`wide`).
macro_rules! interleaved_driver {
    () => {
        /// See `interleaved_driver!`.
        #[inline(always)]
        unsafe fn run<const K: u8, const V: u8>(
            nb: usize,
            nw: usize,
            weights: &[u8],
            act: &Activations,
            out: &mut TileOut<'_>,
        ) {
            let tb = nb * R * block_bytes(K);
            let buffered = act.rows >= unpack_min_rows(K);
            if V == $crate::backend::cpu::simd::lanes::AVX512 && act.rows >= wide_min_rows(K) {
                return wide_tiles::<K>(nb, nw, weights, act, out);
            }
            let mut x = Unpacked::EMPTY;
            let mut w0 = 0;
            while w0 < nw {
                let nr = (nw - w0).min(R);
                let tile = weights.as_ptr().add(w0 / R * tb);
                if buffered {
                    unpack::<K, V>(tile, nb, &mut x);
                    for_row_groups!(act.rows, |a0, CC| dot::<K, CC, true, V>(
                        nb, tile, &x, act, w0, nr, a0, out
                    ));
                } else {
                    for_row_groups!(act.rows, |a0, CC| dot::<K, CC, false, V>(
                        nb, tile, &x, act, w0, nr, a0, out
                    ));
                }
                w0 += nr;
            }
        }

        isa_entries!(run, entry);
    };
}

pub(super) mod activation;
mod dot_float;
mod dot_iq1;
mod dot_iquant;
mod dot_ktile;
mod dot_legacy;
mod dot_sign;
mod dot_ternary;
mod lanes;
pub(super) mod q8;
mod superblocks;
#[cfg(test)]
mod tests;
mod wide;

use crate::backend::cpu::tile::{Activations, Layout, TileOut};
use crate::quant::GgmlType;
pub(super) use lanes::prefetch_lines;
pub use lanes::Isa;

/// Whether this CPU has what the kernels use (AVX2 integer ops, FMA, F16C conversions).
pub fn available() -> bool {
    std::is_x86_feature_detected!("avx2")
        && std::is_x86_feature_detected!("fma")
        && std::is_x86_feature_detected!("f16c")
}

/// Whether [`tile`] covers weights of type `ty`.
pub fn supports(ty: GgmlType) -> bool {
    crate::quant::support_of(ty).is_some_and(|s| s.cpu_simd)
}

/// Whether [`tile`] reads weights of type `ty` interleaved ([`super::interleave`]): the formats
/// of the tile kernels. The others (floats, the IQ1-IQ3 formats, TQ1_0, Q1_0)
/// are read as file rows.
pub fn interleaves(ty: GgmlType) -> bool {
    dot_ktile::kernel(ty, Isa::Avx2).is_some() || dot_legacy::kernel(ty, Isa::Avx2).is_some()
}

/// Output `(a, w)` of `out` = row `w` of the `out.nw()` rows of `weights` (`k` values of `ty` per
/// row, in `layout`) times row `a` of `act` (prepared by [`q8::prepare`] for `ty`). Returns
/// false, leaving `out` untouched, when `ty` is not covered or the shapes do not fit.
/// The interleaved formats ([`super::interleave`]) work on interleaved tiles; given file rows,
/// they interleave them first (the backend interleaves such weights once at load).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C ([`available`]), and `isa` ([`Isa::vnni`]).
pub unsafe fn tile(
    ty: GgmlType,
    layout: Layout,
    k: usize,
    weights: &[u8],
    act: &Activations,
    out: &mut TileOut<'_>,
    isa: Isa,
) -> bool {
    let rows = act.rows;
    if !supports(ty) || k == 0 || !k.is_multiple_of(ty.block_size()) || rows == 0 || act.k != k {
        return false;
    }
    if out.rows() != rows {
        return false;
    }
    let nw = out.nw();
    let row_bytes = k / ty.block_size() * ty.block_bytes();
    let want = match layout {
        Layout::Rows => nw * row_bytes,
        Layout::Interleaved if interleaves(ty) => super::interleave::len(ty, k, nw),
        Layout::Interleaved => return false,
    };
    if weights.len() != want {
        return false;
    }
    // The kernels read activations through raw pointers: their layout must be the one
    // `q8::prepare` makes for this weight type.
    let act_ty = ty.vec_dot_type();
    let fits = match act_ty {
        GgmlType::Q8_0 | GgmlType::Q8_K => {
            let blocks = rows * (k / act_ty.block_size());
            act.row_bytes == k / act_ty.block_size() * act_ty.block_bytes()
                && act.bytes.len() == blocks * act_ty.block_bytes()
                && (act_ty == GgmlType::Q8_K
                    || (act.scales.len() == blocks
                        && match ty {
                            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4_NL | GgmlType::MXFP4 => {
                                act.offsets.len() == blocks
                            }
                            GgmlType::Q4_1 | GgmlType::Q5_1 => act.dsums.len() == blocks,
                            _ => true,
                        }))
        }
        _ => act.values.len() == rows * k,
    };
    if !fits {
        return false;
    }
    // The row formats of the super-block driver (`superblocks`).
    if let Some(run) = dot_iquant::kernel(ty, dot_iquant::Lookup::of_this_cpu())
        .or_else(|| dot_iq1::kernel(ty))
        .or_else(|| dot_ternary::kernel(ty))
    {
        run(k, weights, act, out, isa);
        return true;
    }
    match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => dot_float::tile(ty, k, weights, act, out),
        GgmlType::Q1_0 => {
            dot_sign::tile(k, weights, act, out);
            true
        }
        _ => {
            let Some(run) = dot_ktile::kernel(ty, isa).or_else(|| dot_legacy::kernel(ty, isa)) else {
                return false;
            };
            let tiles = match layout {
                Layout::Interleaved => std::borrow::Cow::Borrowed(weights),
                Layout::Rows => match super::interleave::interleave(ty, k, weights) {
                    Some(tiles) => std::borrow::Cow::Owned(tiles),
                    None => return false,
                },
            };
            // The lengths were checked above: whole tiles holding the `nw` rows.
            run(k / ty.block_size(), nw, &tiles, act, out);
            true
        }
    }
}
