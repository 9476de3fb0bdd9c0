//! Batches (prefill) in 512-bit register tiles of sixteen weight rows, for the lane-per-row
//! kernels on 256-value super-blocks against Q8_K activations (`dot_ktile`'s buffered tiles,
//! `superblocks`' unpacked ones) on CPUs with AVX-512 VNNI ([`super::lanes::Isa::Avx512`]).
//!
//! Those kernels unpack a tile of eight weight rows once per batch into vectors holding four
//! values of every row (a row per 32-bit lane), then meet each with a broadcast of four
//! activation bytes in `vpdpbusd`. Here two such tiles are put side by side, a row per lane of
//! a 512-bit vector: one `vpdpbusd` does the work of two, and on cores with two 512-bit units
//! (Intel's server cores) the batch's integer work takes about half the instructions and time.
//!
//! The integer sums are those of the 256-bit kernels, exact; the f32 steps per super-block are
//! theirs too (`acc = fma(isum, d_w·d_a, acc)`, then for formats with minimums
//! `acc = fnmadd(msum, dmin_w·d_a, acc)`), so a lane gives the 256-bit kernel's bits.

use std::arch::x86_64::*;

use super::lanes::LANE_ROWS;
use crate::backend::cpu::tile::{Activations, TileOut};

/// Weight rows per tile: two of the 256-bit kernels' tiles.
pub(super) const WIDE_ROWS: usize = 2 * LANE_ROWS;

/// A Q8_K activation block: f32 scale, 256 values at 4, 16 i16 sums of 16 values at
/// [`ACT_BSUMS`].
const ACT_BLOCK: usize = 292;
const ACT_BSUMS: usize = 260;

/// One super-block of sixteen weight rows, unpacked. Each entry is a 512-bit vector stored as
/// its two 256-bit halves: the half-tiles' vectors as the 256-bit unpackers make them, rows
/// `0..8` then `8..16`.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct WideBlock {
    /// Value group `g` (values `4g..4g + 4`) as unsigned bytes.
    pub u: [[__m256i; 2]; 64],
    /// Sub-block `s`'s scale as i32 (its values are groups `SPAN·s..SPAN·(s + 1)`).
    pub sc: [[__m256i; 2]; 16],
    /// The i16 pairs that meet the activations' 16-value sums `2j`, `2j + 1`: `psum` is
    /// `Σ pair·bsum`.
    pub pair: [[__m256i; 2]; 8],
    /// `d_w` (times the format's constant factor).
    pub d: [__m256; 2],
    /// `dmin_w`, for the formats with minimums.
    pub dmin: [__m256; 2],
}

impl WideBlock {
    /// All zeros: what the rows past the weights' end hold.
    pub const ZERO: WideBlock = {
        // SAFETY: all-zero bits are valid for integer and float vectors.
        unsafe { std::mem::zeroed() }
    };
}

#[inline(always)]
unsafe fn load_i(v: &[__m256i; 2]) -> __m512i {
    _mm512_load_si512(v.as_ptr() as *const _)
}

#[inline(always)]
unsafe fn load_f(v: &[__m256; 2]) -> __m512 {
    _mm512_load_ps(v.as_ptr() as *const f32)
}

/// Outputs `(w0..w0 + nr) × (a0..a0 + CC)` of `out` from the unpacked super-blocks `blocks`:
/// lane `i` is weight row `w0 + i`. Per sub-block of `SPAN` value groups the `vpdpbusd` sums
/// meet its scale in `mullo`; then per super-block `psum = Σ pair·bsum`, and either
/// `isum -= psum << SHIFT` (the offset the unsigned values carry) or, with `MINS`, `psum` is the
/// minimums' sum and is subtracted scaled by `dmin`.
///
/// Inlined into a function with AVX-512 F, BW, VNNI and VL.
#[inline(always)]
pub(super) unsafe fn dot<const SPAN: usize, const SHIFT: u32, const MINS: bool, const CC: usize>(
    blocks: &[WideBlock],
    act: &Activations,
    w0: usize,
    nr: usize,
    a0: usize,
    out: &mut TileOut<'_>,
) {
    let a = act.bytes.as_ptr().add(a0 * act.row_bytes);
    let mut acc = [_mm512_setzero_ps(); CC];
    for (b, x) in blocks.iter().enumerate() {
        // Activation row c of this super-block.
        let y = |c: usize| a.add(c * act.row_bytes + b * ACT_BLOCK);
        let mut isum = [_mm512_setzero_si512(); CC];
        for s in 0..64 / SPAN {
            let mut s32 = [_mm512_setzero_si512(); CC];
            for m in 0..SPAN {
                let g = SPAN * s + m;
                let u = load_i(&x.u[g]);
                for c in 0..CC {
                    let q = _mm512_set1_epi32(std::ptr::read_unaligned(y(c).add(4 + 4 * g) as *const i32));
                    s32[c] = _mm512_dpbusd_epi32(s32[c], u, q);
                }
            }
            let sc = load_i(&x.sc[s]);
            for c in 0..CC {
                isum[c] = _mm512_add_epi32(isum[c], _mm512_mullo_epi32(s32[c], sc));
            }
        }
        let d = load_f(&x.d);
        for c in 0..CC {
            let mut psum = _mm512_setzero_si512();
            for j in 0..8 {
                let pair = _mm512_set1_epi32(std::ptr::read_unaligned(y(c).add(ACT_BSUMS + 4 * j) as *const i32));
                psum = _mm512_add_epi32(psum, _mm512_madd_epi16(load_i(&x.pair[j]), pair));
            }
            let dy = _mm512_set1_ps(std::ptr::read_unaligned(y(c) as *const f32));
            if !MINS {
                isum[c] = _mm512_sub_epi32(isum[c], _mm512_slli_epi32::<SHIFT>(psum));
            }
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[c]), _mm512_mul_ps(d, dy), acc[c]);
            if MINS {
                let dmin = load_f(&x.dmin);
                acc[c] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(psum), _mm512_mul_ps(dmin, dy), acc[c]);
            }
        }
    }
    for c in 0..CC {
        let dst = out.run_mut(a0 + c, w0, nr);
        if nr == WIDE_ROWS {
            _mm512_storeu_ps(dst.as_mut_ptr(), acc[c]);
        } else {
            let mut lanes = [0f32; WIDE_ROWS];
            _mm512_storeu_ps(lanes.as_mut_ptr(), acc[c]);
            dst.copy_from_slice(&lanes[..nr]);
        }
    }
}
