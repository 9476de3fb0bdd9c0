//! Batches (prefill) in 512-bit register tiles of sixteen weight rows, for the lane-per-row
//! kernels: on 256-value super-blocks against Q8_K activations (`dot_ktile`'s buffered tiles,
//! `superblocks`' unpacked ones, [`dot`]) and on the 32-value formats against Q8_0 (`dot_legacy`,
//! [`dot32`]), on CPUs with AVX-512 VNNI ([`super::lanes::Isa::Avx512`]).
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
use std::cell::Cell;

use super::lanes::LANE_ROWS;
use crate::backend::cpu::tile::{Activations, TileOut};

/// Weight rows per tile: two of the 256-bit kernels' tiles.
pub(super) const WIDE_ROWS: usize = 2 * LANE_ROWS;

use super::q8::{Q8K_BLOCK as ACT_BLOCK, Q8K_BSUMS as ACT_BSUMS, Q8K_VALUES as ACT_VALUES, Q8_0_BLOCK};

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
    /// With signed values ([`dot`]'s `SIGNED`): `128 · Σ_s scale_s · Σ_{i ∈ s} w_i`, what the
    /// 128 that each unsigned activation carries adds to the integer sum (see [`corrections`]).
    pub corr: [__m256i; 2],
}

impl WideBlock {
    /// All zeros: what the rows past the weights' end hold.
    pub const ZERO: WideBlock = {
        // SAFETY: all-zero bits are valid for integer and float vectors.
        unsafe { std::mem::zeroed() }
    };

    /// Zero half `h`: rows `8h..8h + 8`, past the weights' end.
    pub fn zero_half(&mut self, h: usize) {
        // SAFETY: all-zero bits are valid vectors.
        let (zi, zf): (__m256i, __m256) = unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        for v in self.u.iter_mut().chain(&mut self.sc).chain(&mut self.pair) {
            v[h] = zi;
        }
        self.corr[h] = zi;
        self.d[h] = zf;
        self.dmin[h] = zf;
    }
}

thread_local! {
    /// Each thread's unpacked super-blocks, kept across calls: a fresh zeroed buffer per call
    /// (one call per sixteen weight rows of an expert in a MoE prefill) was 2% of that prefill.
    static BLOCKS: Cell<Vec<WideBlock>> = const { Cell::new(Vec::new()) };
}

/// The calling thread's unpacked-block buffer, taken for one kernel call and given back when
/// dropped. Its blocks hold what the thread's last call left there: a kernel unpacks every
/// field its [`dot`] reads before reading it.
pub(super) struct Blocks {
    blocks: Vec<WideBlock>,
    nb: usize,
}

impl Blocks {
    /// `nb` blocks.
    pub fn take(nb: usize) -> Blocks {
        let mut blocks = BLOCKS.with(Cell::take);
        if blocks.len() < nb {
            blocks.resize(nb, WideBlock::ZERO);
        }
        Blocks { blocks, nb }
    }
}

impl std::ops::Deref for Blocks {
    type Target = [WideBlock];
    fn deref(&self) -> &[WideBlock] {
        &self.blocks[..self.nb]
    }
}

impl std::ops::DerefMut for Blocks {
    fn deref_mut(&mut self) -> &mut [WideBlock] {
        &mut self.blocks[..self.nb]
    }
}

impl Drop for Blocks {
    fn drop(&mut self) {
        let blocks = std::mem::take(&mut self.blocks);
        BLOCKS.with(|b| b.set(blocks));
    }
}

#[inline(always)]
unsafe fn load_i(v: &[__m256i; 2]) -> __m512i {
    _mm512_load_si512(v.as_ptr() as *const _)
}

#[inline(always)]
unsafe fn load_f(v: &[__m256; 2]) -> __m512 {
    _mm512_load_ps(v.as_ptr() as *const f32)
}

/// `x.corr` of each of `blocks`, whose values are signed and whose sub-blocks are `SPAN` value
/// groups: the integer sum [`dot`] would give against activations that are all 1, times 128.
/// Each value then meets `q + 128` (the unsigned activations, [`super::q8::unsigned_q8k`]) and
/// `isum - corr` is `Σ scale·Σ q·w` exactly: one subtraction per activation row and super-block
/// where the weights' `+ 128` took eight `madd`s of the activations' sums.
///
/// Inlined into a function with AVX-512 F, BW, VNNI and VL.
#[inline(always)]
pub(super) unsafe fn corrections<const SPAN: usize>(blocks: &mut [WideBlock]) {
    let ones = _mm512_set1_epi8(1);
    for x in blocks {
        let mut isum = _mm512_setzero_si512();
        for s in 0..64 / SPAN {
            let mut s32 = _mm512_setzero_si512();
            for m in 0..SPAN {
                s32 = _mm512_dpbusd_epi32(s32, ones, load_i(&x.u[SPAN * s + m]));
            }
            isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(s32, load_i(&x.sc[s])));
        }
        _mm512_store_si512(x.corr.as_mut_ptr() as *mut _, _mm512_slli_epi32::<7>(isum));
    }
}

/// Outputs `(w0..w0 + nr) × (a0..a0 + CC)` of `out` from the unpacked super-blocks `blocks`:
/// lane `i` is weight row `w0 + i`. Per sub-block of `SPAN` value groups the `vpdpbusd` sums
/// meet its scale in `mullo`; then per super-block either, with `SIGNED` (signed values against
/// the unsigned activations), `isum -= corr` ([`corrections`]), or `psum = Σ pair·bsum` and
/// `isum -= psum << SHIFT` (the offset the unsigned values carry), or with `MINS` `psum` is the
/// minimums' sum and is subtracted scaled by `dmin`.
///
/// Inlined into a function with AVX-512 F, BW, VNNI and VL.
#[inline(always)]
pub(super) unsafe fn dot<const SPAN: usize, const SHIFT: u32, const MINS: bool, const SIGNED: bool, const CC: usize>(
    blocks: &[WideBlock],
    act: &Activations,
    w0: usize,
    nr: usize,
    a0: usize,
    out: &mut TileOut<'_>,
) {
    let bytes = if SIGNED {
        super::q8::unsigned_q8k(act)
    } else {
        &act.bytes
    };
    let a = bytes.as_ptr().add(a0 * act.row_bytes);
    let mut acc = [_mm512_setzero_ps(); CC];
    for (b, x) in blocks.iter().enumerate() {
        // Activation row c of this super-block.
        let y = |c: usize| a.add(c * act.row_bytes + b * ACT_BLOCK);
        let mut isum = [_mm512_setzero_si512(); CC];
        for s in 0..64 / SPAN {
            // Two chains per activation row on sub-blocks of eight groups, the even and the odd
            // ones: one chain of eight `vpdpbusd`s per row (5 cycles each) left the two 512-bit
            // units waiting on the chains. Sub-blocks of four keep one chain (split, Q6_K and
            // Q2_K measured 5% slower).
            let mut s32 = [[_mm512_setzero_si512(); 2]; CC];
            for m in 0..SPAN {
                let g = SPAN * s + m;
                let h = if SPAN >= 8 { m & 1 } else { 0 };
                let u = load_i(&x.u[g]);
                for c in 0..CC {
                    let q = _mm512_set1_epi32(std::ptr::read_unaligned(y(c).add(ACT_VALUES + 4 * g) as *const i32));
                    s32[c][h] = if SIGNED {
                        _mm512_dpbusd_epi32(s32[c][h], q, u)
                    } else {
                        _mm512_dpbusd_epi32(s32[c][h], u, q)
                    };
                }
            }
            let sc = load_i(&x.sc[s]);
            for c in 0..CC {
                let s32 = if SPAN >= 8 {
                    _mm512_add_epi32(s32[c][0], s32[c][1])
                } else {
                    s32[c][0]
                };
                isum[c] = _mm512_add_epi32(isum[c], _mm512_mullo_epi32(s32, sc));
            }
        }
        let d = load_f(&x.d);
        if SIGNED {
            let corr = load_i(&x.corr);
            for c in 0..CC {
                let dy = _mm512_set1_ps(std::ptr::read_unaligned(y(c) as *const f32));
                let isum = _mm512_sub_epi32(isum[c], corr);
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(d, dy), acc[c]);
            }
            continue;
        }
        for c in 0..CC {
            let mut psum = _mm512_setzero_si512();
            for j in 0..8 {
                let pair = _mm512_set1_epi32(std::ptr::read_unaligned(y(c).add(ACT_BSUMS + 4 * j) as *const i32));
                psum = _mm512_dpwssd_epi32(psum, load_i(&x.pair[j]), pair);
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
        store16(acc[c], nr, w0, a0 + c, out);
    }
}

/// One 32-value block of sixteen weight rows of a 32-value format (`dot_legacy`), unpacked:
/// halves as in [`WideBlock`].
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct WideBlock32 {
    /// Value group `g` (values `4g..4g + 4`) as the unsigned `vpdpbusd` operand.
    pub u: [[__m256i; 2]; 8],
    /// `d_w`.
    pub d: [__m256; 2],
    /// The minimum `m_w` (Q4_1, Q5_1).
    pub m: [__m256; 2],
}

impl WideBlock32 {
    /// All zeros: what the rows past the weights' end hold.
    pub const ZERO: WideBlock32 = {
        // SAFETY: all-zero bits are valid for integer and float vectors.
        unsafe { std::mem::zeroed() }
    };

    /// Zero half `h`: rows `8h..8h + 8`, past the weights' end.
    pub fn zero_half(&mut self, h: usize) {
        // SAFETY: all-zero bits are valid vectors.
        let (zi, zf): (__m256i, __m256) = unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        for u in &mut self.u {
            u[h] = zi;
        }
        self.d[h] = zf;
        self.m[h] = zf;
    }
}

/// [`dot`] for the 32-value formats against Q8_0 activations (`dot_legacy`'s steps per block:
/// the integer sum plus, with `OFFSET`, the activation block's precomputed offset, times
/// `d_w·d_a` into `acc`; with `MIN`, `m_w·(d_a·Σq_a)` into a second sum added at the end).
#[inline(always)]
pub(super) unsafe fn dot32<const OFFSET: bool, const MIN: bool, const CC: usize>(
    blocks: &[WideBlock32],
    act: &Activations,
    w0: usize,
    nr: usize,
    a0: usize,
    out: &mut TileOut<'_>,
) {
    let nb = blocks.len();
    let a = act.bytes.as_ptr().add(a0 * act.row_bytes + 2);
    let da = act.scales.as_ptr().add(a0 * nb);
    let sa = act.dsums.as_ptr().wrapping_add(a0 * nb);
    let oa = act.offsets.as_ptr().wrapping_add(a0 * nb);
    let mut acc = [_mm512_setzero_ps(); CC];
    let mut macc = [_mm512_setzero_ps(); CC];
    for (b, x) in blocks.iter().enumerate() {
        let mut isum = [_mm512_setzero_si512(); CC];
        for g in 0..8 {
            let u = load_i(&x.u[g]);
            for c in 0..CC {
                let y = a.add(c * act.row_bytes + b * Q8_0_BLOCK + 4 * g);
                isum[c] = _mm512_dpbusd_epi32(isum[c], u, _mm512_set1_epi32(std::ptr::read_unaligned(y as *const i32)));
            }
        }
        let d = load_f(&x.d);
        for c in 0..CC {
            let mut isum = isum[c];
            if OFFSET {
                isum = _mm512_add_epi32(isum, _mm512_set1_epi32(*oa.add(c * nb + b)));
            }
            let scale = _mm512_mul_ps(d, _mm512_set1_ps(*da.add(c * nb + b)));
            acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[c]);
            if MIN {
                let m = load_f(&x.m);
                macc[c] = _mm512_add_ps(macc[c], _mm512_mul_ps(m, _mm512_set1_ps(*sa.add(c * nb + b))));
            }
        }
    }
    for c in 0..CC {
        let v = if MIN { _mm512_add_ps(acc[c], macc[c]) } else { acc[c] };
        store16(v, nr, w0, a0 + c, out);
    }
}

/// Write lanes `0..nr` of `v` to outputs `(a, w0 + i)`.
#[inline(always)]
unsafe fn store16(v: __m512, nr: usize, w0: usize, a: usize, out: &mut TileOut<'_>) {
    let dst = out.run_mut(a, w0, nr);
    if nr == WIDE_ROWS {
        _mm512_storeu_ps(dst.as_mut_ptr(), v);
    } else {
        let mut lanes = [0f32; WIDE_ROWS];
        _mm512_storeu_ps(lanes.as_mut_ptr(), v);
        dst.copy_from_slice(&lanes[..nr]);
    }
}
