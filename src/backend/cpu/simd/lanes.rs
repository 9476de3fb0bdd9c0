//! What the AVX2 kernel files share: the ISAs of the u8 × i8 dot products ([`Isa`]) and the
//! register helpers (lane sums, stores, tile walks), apart from the dispatcher in `mod.rs`,
//! which imports the kernel files.

// Register tiles are `[[acc; C]; R]` arrays indexed by (weight row, activation row) in nested
// loops that the compiler unrolls; iterators would hide that shape.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use crate::backend::cpu::tile::{Activations, TileOut};

/// Whether CPUID's vendor string is `name` (`b"GenuineIntel"`, `b"AuthenticAMD"`).
pub(super) fn vendor_is(name: &[u8; 12]) -> bool {
    // CPUID leaf 0: the vendor string in EBX, EDX, ECX.
    let id = __cpuid(0);
    let mut v = [0u8; 12];
    v[..4].copy_from_slice(&id.ebx.to_le_bytes());
    v[4..8].copy_from_slice(&id.edx.to_le_bytes());
    v[8..].copy_from_slice(&id.ecx.to_le_bytes());
    &v == name
}

/// Ask for the `bytes` bytes from `p` on, a prefetch per 64-byte line, with `_mm_prefetch`'s
/// `HINT` (`_MM_HINT_T0`: into L1; `_MM_HINT_T2`: into L2 only): the streams of the decode
/// kernels (weights, K/V rows, recurrent state) whose next lines the hardware's prefetchers
/// will not fetch in time. A hint: an address past the data's end is dropped, never a fault, so
/// `p` may be formed with `wrapping_add` beyond it.
#[inline(always)]
pub(crate) fn prefetch_lines<const HINT: i32>(p: *const u8, bytes: usize) {
    for line in (0..bytes).step_by(64) {
        // SAFETY: a prefetch reads nothing the program sees and never faults.
        unsafe { _mm_prefetch::<HINT>(p.wrapping_add(line) as *const i8) };
    }
}

/// Weight rows per tile of the lane-per-row kernels on interleaved weights: one lane of an
/// i32/f32 vector each.
pub(super) const LANE_ROWS: usize = crate::backend::cpu::interleave::TILE_ROWS;
/// Activation rows per register tile of the lane-per-row kernels (the widths
/// [`for_row_groups`] instantiates).
pub(super) const LANE_C: usize = 4;
const _: () = assert!(LANE_C == 4, "for_row_groups! spells out the widths 1..=4");

/// The instructions of the integer kernels' u8 × i8 dot products: AVX2's `maddubs` (to i16) and
/// `madd` (to i32), or VNNI's `vpdpbusd`, which adds the four products of each 32-bit lane
/// straight to an i32, in its AVX (VEX) or AVX-512VL (EVEX) encoding. The sums are exact either
/// way, so every ISA gives the same bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Isa {
    Avx2 = 0,
    AvxVnni = 1,
    Avx512Vnni = 2,
    /// [`Isa::Avx512Vnni`]'s dot products, and batches (prefill) in 512-bit register tiles of
    /// sixteen weight rows (`super::wide`): the same sums, so the same bits.
    Avx512 = 3,
}

impl Isa {
    /// Every ISA, at the index of its discriminant (the kernels' const parameter).
    pub const ALL: [Isa; 4] = [Isa::Avx2, Isa::AvxVnni, Isa::Avx512Vnni, Isa::Avx512];

    /// The VNNI encodings this CPU has, best first (besides [`super::available`]'s features). The
    /// AVX-512VL one comes first: with it the compiler has 32 vector registers (and may use
    /// other AVX-512 instructions) for the same 256-bit kernels, which measured 5-25% faster
    /// than the AVX one (`cargo bench --bench kernels`, 4 rows: Q5_0 41-43 against 38-40 GB/s,
    /// Q8_0 56-59 against 46-52, Q6_K 38 against 32-33).
    ///
    /// [`Isa::Avx512`] comes before both where the CPU has AVX-512 BW too.
    pub fn vnni() -> Vec<Isa> {
        let mut v = Vec::new();
        if std::is_x86_feature_detected!("avx512vnni") && std::is_x86_feature_detected!("avx512vl") {
            if std::is_x86_feature_detected!("avx512bw") {
                v.push(Isa::Avx512);
            }
            v.push(Isa::Avx512Vnni);
        }
        if std::is_x86_feature_detected!("avxvnni") {
            v.push(Isa::AvxVnni);
        }
        v
    }
}

// [`Isa`] as the const parameter of the kernel bodies.
pub(super) const AVX2: u8 = Isa::Avx2 as u8;
pub(super) const AVX_VNNI: u8 = Isa::AvxVnni as u8;
pub(super) const AVX512_VNNI: u8 = Isa::Avx512Vnni as u8;
pub(super) const AVX512: u8 = Isa::Avx512 as u8;

/// `acc` plus, per 32-bit lane, the four products of `u`'s unsigned bytes with `s`'s signed
/// bytes (`vpdpbusd`). Only for `V` = [`AVX_VNNI`], [`AVX512_VNNI`] or [`AVX512`], inlined into a
/// function with that ISA's target features.
#[inline(always)]
pub(super) unsafe fn dpbusd<const V: u8>(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    if V == AVX_VNNI {
        _mm256_dpbusd_avx_epi32(acc, u, s)
    } else {
        _mm256_dpbusd_epi32(acc, u, s)
    }
}

/// A kernel module's entry point for one weight type and ISA: `(nb, nw, weights, act, out)`,
/// `nw` interleaved weight rows of `nb` blocks.
pub(super) type RunFn = unsafe fn(usize, usize, &[u8], &Activations, &mut TileOut<'_>);

/// The i16 pairs `(lo, hi)` per 32-bit lane, from the i32 lanes of `lo` and `hi` (each within
/// i16): `hi`'s low half is blended over the top half of `lo`'s lane, so a negative `lo`'s sign
/// bits do not spill into it, as an or would.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn i16_pairs(lo: __m256i, hi: __m256i) -> __m256i {
    _mm256_blend_epi16::<0b1010_1010>(lo, _mm256_slli_epi32::<16>(hi))
}

/// Sum of the 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// An f16 stored little-endian at `p` (unaligned), as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn load_f16(p: *const u8) -> f32 {
    let h = std::ptr::read_unaligned(p as *const u16);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(h))))
}

/// The 32 bits of `bits` as 32 bytes: byte `j` is 0xff where bit `j` is set, else 0 (byte `i`
/// of `bits` spread over bytes `8i..8i + 8`, each keeping its own bit).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn bit_bytes(bits: u32) -> __m256i {
    let spread = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
    );
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let mine = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(bits as i32), spread), bit);
    _mm256_cmpeq_epi8(mine, bit)
}

/// Write lanes `0..nr` of `v` to outputs `(a, w0 + i)`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn store_lanes(v: __m256, nr: usize, w0: usize, a: usize, out: &mut TileOut<'_>) {
    let dst = out.run_mut(a, w0, nr);
    if nr == LANE_ROWS {
        _mm256_storeu_ps(dst.as_mut_ptr(), v);
    } else {
        let mut lanes = [0f32; LANE_ROWS];
        _mm256_storeu_ps(lanes.as_mut_ptr(), v);
        dst.copy_from_slice(&lanes[..nr]);
    }
}

/// Walk a `nw` × `rows` output in tiles: `R`×`C` where both fit, then narrower ones at the
/// edges. `kernel(w0, a0, r, c)` fills outputs `(w0..w0+r) × (a0..a0+c)`, with `r` in {R, 1} and
/// `c` in {C, 1}.
#[inline(always)]
pub(super) fn for_tiles<const R: usize, const C: usize>(
    nw: usize,
    rows: usize,
    mut kernel: impl FnMut(usize, usize, usize, usize),
) {
    let mut w0 = 0;
    while w0 < nw {
        let r = if nw - w0 >= R { R } else { 1 };
        let mut a0 = 0;
        while a0 < rows {
            let c = if rows - a0 >= C { C } else { 1 };
            kernel(w0, a0, r, c);
            a0 += c;
        }
        w0 += r;
    }
}
