//! The 32-value formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4) against Q8_0 activations, on
//! weights in the interleaved layout of [`crate::backend::cpu::interleave`] (eight rows per
//! tile, made at load).
//!
//! Per tile block and group `g` of four values, one load and a mask or shift give values
//! `4g..4g + 4` of all eight rows in one vector, a row per 32-bit lane. A broadcast of the
//! activation's four bytes meets it in `maddubs` (unsigned × signed pairs summed to i16) and
//! `madd` (to i32), so after the eight groups each lane holds its row's exact integer block
//! sum: no sum across lanes. It is converted once and scaled by `d_w · d_a` (eight scales in
//! one conversion) into an 8-lane f32 accumulator, a lane per output.
//!
//! MXFP4 is IQ4_NL with ggml's doubled E2M1 table and a power-of-two scale from its E8M0
//! byte (eight rows' bytes widened and shifted into f32 exponents at once).
//!
//! Signed weights (Q8_0, IQ4_NL, MXFP4) use the sign trick `|w| · (a · sign w)`. Unsigned weights
//! (the 4/5-bit formats) go in as they are: Q4_0/Q5_0 add the activation block's precomputed
//! `offset · Σq_a` (-8 or -16 times the sum) to the integer lanes, which makes the sum exactly
//! the oracle's; the `_1` formats add `m · (d_a · Σq_a)` in f32 as the oracle does.
//!
//! With VNNI ([`super::lanes::Isa`]) one `vpdpbusd` per group and activation row replaces `maddubs`,
//! the i16 sums and `madd`, and signed weights go in as `w + 128` (their sign bit flipped, once
//! per group for all rows) with `-128 · Σq_a` added like Q4_0's offset. The integer sums are the
//! same, so are the bits.
//!
//! Few activation rows (decode) unpack each tile block in registers and meet it with every row.
//! Larger batches unpack each tile once into [`Unpacked`] and read the groups from there; both
//! give the same bits.

use std::arch::x86_64::*;

use super::super::interleave::TILE_ROWS as R;
use super::lanes::{dpbusd, store_lanes, AVX2};
use super::wide::{self, WideBlock32, WIDE_ROWS};
use crate::backend::cpu::tile::{Activations, TileOut};
use crate::quant::GgmlType;

const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q5_0: u8 = 2;
const Q5_1: u8 = 3;
const Q8_0: u8 = 4;
const IQ4_NL: u8 = 5;
const MXFP4: u8 = 6;

use super::q8::Q8_0_BLOCK as ACT_BLOCK;

use crate::quant::KVALUES_FP4;
/// ggml's non-linear 4-bit levels of IQ4_NL/IQ4_XS (`kvalues_iq4nl`), the quant module's table.
pub(super) use crate::quant::KVALUES_IQ4NL;

const fn block_bytes(kind: u8) -> usize {
    match kind {
        Q4_0 | IQ4_NL => 18,
        MXFP4 => 17,
        Q4_1 => 20,
        Q5_0 => 22,
        Q5_1 => 24,
        _ => 34,
    }
}

const fn signed(kind: u8) -> bool {
    matches!(kind, Q8_0 | IQ4_NL | MXFP4)
}

const fn has_offset(kind: u8) -> bool {
    matches!(kind, Q4_0 | Q5_0)
}

const fn has_min(kind: u8) -> bool {
    matches!(kind, Q4_1 | Q5_1)
}

const fn five_bit(kind: u8) -> bool {
    matches!(kind, Q5_0 | Q5_1)
}

/// Offsets in a tile block (see the layout in `interleave`): `m`, `qh`, `qs` (after the eight
/// rows' scales: f16, or MXFP4's exponent bytes).
const fn off_m(kind: u8) -> usize {
    if kind == MXFP4 {
        R
    } else {
        2 * R
    }
}
const fn off_qh(kind: u8) -> usize {
    off_m(kind) + if has_min(kind) { 2 * R } else { 0 }
}
const fn off_qs(kind: u8) -> usize {
    off_qh(kind) + if five_bit(kind) { 4 * R } else { 0 }
}

/// Group `g` of the tile block at `p`: lane `i` holds values `4g..4g + 4` of row `i`, as the
/// unsigned `maddubs` operand (the magnitudes for signed formats) and, for signed formats, the
/// signed values.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group<const K: u8>(p: *const u8, g: usize) -> (__m256i, __m256i) {
    let low = _mm256_set1_epi8(0x0F);
    let qs = p.add(off_qs(K));
    if K == Q8_0 {
        let s = _mm256_loadu_si256(qs.add(32 * g) as *const __m256i);
        return (_mm256_sign_epi8(s, s), s);
    }
    let v = _mm256_loadu_si256(qs.add(32 * (g % 4)) as *const __m256i);
    let nib = if g < 4 {
        _mm256_and_si256(v, low)
    } else {
        _mm256_and_si256(_mm256_srli_epi16::<4>(v), low)
    };
    if K == IQ4_NL || K == MXFP4 {
        let table = if K == MXFP4 {
            KVALUES_FP4.as_ptr()
        } else {
            KVALUES_IQ4NL.as_ptr()
        };
        let lut = _mm256_broadcastsi128_si256(_mm_loadu_si128(table as *const __m128i));
        let s = _mm256_shuffle_epi8(lut, nib);
        return (_mm256_sign_epi8(s, s), s);
    }
    if five_bit(K) {
        // Bit `g` of each `qh` byte holds the fifth bits of this group: shift it to bit 4
        // (16-bit shifts by at most 4 keep every byte's bit 4 from its own byte).
        let h = _mm256_loadu_si256(p.add(off_qh(K)) as *const __m256i);
        let at4 = match g {
            0 => _mm256_slli_epi16::<4>(h),
            1 => _mm256_slli_epi16::<3>(h),
            2 => _mm256_slli_epi16::<2>(h),
            3 => _mm256_slli_epi16::<1>(h),
            4 => h,
            5 => _mm256_srli_epi16::<1>(h),
            6 => _mm256_srli_epi16::<2>(h),
            _ => _mm256_srli_epi16::<3>(h),
        };
        let hb = _mm256_and_si256(at4, _mm256_set1_epi8(0x10));
        return (_mm256_or_si256(nib, hb), _mm256_setzero_si256());
    }
    (nib, _mm256_setzero_si256())
}

/// The eight rows' f16 values at `p` as f32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn halves(p: *const u8) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
}

/// The eight rows' MXFP4 scales at `p` (E8M0 bytes) as f32 lanes: half the scale, `2^(e -
/// 128)`, as `quant::fp4` (exponent bits `e - 1`; subnormal `0x0020_0000 << e` below `e = 2`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn e8m0_halves(p: *const u8) -> __m256 {
    let e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i));
    let normal = _mm256_slli_epi32::<23>(_mm256_sub_epi32(e, _mm256_set1_epi32(1)));
    let sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
    let is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    _mm256_castsi256_ps(_mm256_blendv_epi8(normal, sub, is_sub))
}

/// The eight rows' block scales at the start of the tile block `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scales<const K: u8>(p: *const u8) -> __m256 {
    if K == MXFP4 {
        e8m0_halves(p)
    } else {
        halves(p)
    }
}

/// One tile unpacked for batches: for block `b` and group `g`, `u[8b + g]` is [`group`]'s
/// unsigned operand and `s[8b + g]` its signed values (signed formats only); `d[b]`, `m[b]` the
/// scales and minimums as f32.
struct Unpacked {
    u: Vec<__m256i>,
    s: Vec<__m256i>,
    d: Vec<__m256>,
    m: Vec<__m256>,
}

impl Unpacked {
    /// For the decode path, which reads the tile in place: nothing to build per call.
    const EMPTY: Unpacked = Unpacked {
        u: Vec::new(),
        s: Vec::new(),
        d: Vec::new(),
        m: Vec::new(),
    };

    fn new(nb: usize, kind: u8) -> Self {
        // SAFETY: all-zero bytes are valid vectors.
        let zi = unsafe { _mm256_setzero_si256() };
        let zf = unsafe { _mm256_setzero_ps() };
        Unpacked {
            u: vec![zi; nb * 8],
            s: vec![zi; if signed(kind) { nb * 8 } else { 0 }],
            d: vec![zf; nb],
            m: vec![zf; if has_min(kind) { nb } else { 0 }],
        }
    }
}

/// Unpack the tile at `tile` (`nb` blocks) into `out`, sized here on first use. (`V`: the
/// driver's ISA parameter; unpacking does not depend on it.)
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack<const K: u8, const V: u8>(tile: *const u8, nb: usize, out: &mut Unpacked) {
    if out.u.len() != nb * 8 {
        *out = Unpacked::new(nb, K);
    }
    for b in 0..nb {
        let p = tile.add(b * R * block_bytes(K));
        for g in 0..8 {
            let (u, s) = group::<K>(p, g);
            out.u[8 * b + g] = u;
            if signed(K) {
                out.s[8 * b + g] = s;
            }
        }
        out.d[b] = scales::<K>(p);
        if has_min(K) {
            out.m[b] = halves(p.add(off_m(K)));
        }
    }
}

/// Outputs `(w0..w0 + nr) × (a0..a0 + CC)` of one tile: lane `i` of an accumulator is weight
/// row `i`. With `BUF` the groups come from `x`, the unpacked tile, otherwise they are
/// unpacked from the interleaved bytes at `tile` block by block (`x` unused). `V`: the
/// [`super::lanes::Isa`] (this body inlines into its entry point, see `isa_entries!`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn dot<const K: u8, const CC: usize, const BUF: bool, const V: u8>(
    nb: usize,
    tile: *const u8,
    x: &Unpacked,
    act: &Activations,
    w0: usize,
    nr: usize,
    a0: usize,
    out: &mut TileOut<'_>,
) {
    let ones = _mm256_set1_epi16(1);
    let a = act.bytes.as_ptr().add(a0 * act.row_bytes + 2);
    let da = act.scales.as_ptr().add(a0 * nb);
    let sa = act.dsums.as_ptr().wrapping_add(a0 * nb);
    let oa = act.offsets.as_ptr().wrapping_add(a0 * nb);
    let (xu, xs, xd, xm) = (x.u.as_ptr(), x.s.as_ptr(), x.d.as_ptr(), x.m.as_ptr());
    let mut acc = [_mm256_setzero_ps(); CC];
    let mut macc = [_mm256_setzero_ps(); CC];
    let prefetch = !BUF && prefetch_pays();
    for b in 0..nb {
        let p = tile.add(b * R * block_bytes(K));
        if prefetch {
            // The weights stream from memory once per decode step: ask for the bytes
            // `PREFETCH_AHEAD` further on now, so that enough lines are in flight (a prefetch
            // past the end of the weights is dropped, never a fault).
            super::lanes::prefetch_lines::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD), R * block_bytes(K));
        }
        // Macros rather than closures: closures would not inherit the target features.
        macro_rules! grp {
            ($g:expr) => {
                if BUF {
                    let i = 8 * b + $g;
                    (*xu.add(i), if signed(K) { *xs.add(i) } else { *xu.add(i) })
                } else {
                    group::<K>(p, $g)
                }
            };
        }
        // Values 4g..4g+4 of activation row c, in every lane.
        macro_rules! y {
            ($c:expr, $g:expr) => {
                _mm256_set1_epi32(std::ptr::read_unaligned(
                    a.add($c * act.row_bytes + b * ACT_BLOCK + 4 * $g) as *const i32,
                ))
            };
        }
        // Each group is unpacked once and meets every activation row while it is in a
        // register: the rows' partial sums stay in registers too, and the loads are only the
        // weights' and the activations' own.
        let mut isum = [_mm256_setzero_si256(); CC];
        if V != AVX2 {
            // With one or two rows, the odd groups go into a second chain of sums: one chain
            // of eight `vpdpbusd` would wait on its latency.
            let mut odd = [_mm256_setzero_si256(); CC];
            for g in 0..8 {
                let (u, s) = grp!(g);
                let u = if signed(K) {
                    _mm256_xor_si256(s, _mm256_set1_epi8(-128))
                } else {
                    u
                };
                for c in 0..CC {
                    if CC <= 2 && g % 2 == 1 {
                        odd[c] = dpbusd::<V>(odd[c], u, y!(c, g));
                    } else {
                        isum[c] = dpbusd::<V>(isum[c], u, y!(c, g));
                    }
                }
            }
            if CC <= 2 {
                for c in 0..CC {
                    isum[c] = _mm256_add_epi32(isum[c], odd[c]);
                }
            }
        } else if signed(K) {
            // |w| · |a| can reach 2 · 127 · 127 per i16 lane: widen every product pair.
            for g in 0..8 {
                let (u, s) = grp!(g);
                for c in 0..CC {
                    let prod = _mm256_maddubs_epi16(u, _mm256_sign_epi8(y!(c, g), s));
                    isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(prod, ones));
                }
            }
        } else {
            // Unsigned values below 32: four i16 pair sums stay below 4 · 2 · 31 · 128 < 2^15.
            for half in 0..2 {
                let mut h = [_mm256_setzero_si256(); CC];
                for g in [2 * half, 2 * half + 4, 2 * half + 1, 2 * half + 5] {
                    let (u, _) = grp!(g);
                    for c in 0..CC {
                        h[c] = _mm256_add_epi16(h[c], _mm256_maddubs_epi16(u, y!(c, g)));
                    }
                }
                for c in 0..CC {
                    isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(h[c], ones));
                }
            }
        }
        let d = if BUF { *xd.add(b) } else { scales::<K>(p) };
        for c in 0..CC {
            let mut isum = isum[c];
            if has_offset(K) || (signed(K) && V != AVX2) {
                isum = _mm256_add_epi32(isum, _mm256_set1_epi32(*oa.add(c * nb + b)));
            }
            let scale = _mm256_mul_ps(d, _mm256_set1_ps(*da.add(c * nb + b)));
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, acc[c]);
            if has_min(K) {
                let m = if BUF { *xm.add(b) } else { halves(p.add(off_m(K))) };
                macc[c] = _mm256_add_ps(macc[c], _mm256_mul_ps(m, _mm256_set1_ps(*sa.add(c * nb + b))));
            }
        }
    }
    for c in 0..CC {
        let v = if has_min(K) {
            _mm256_add_ps(acc[c], macc[c])
        } else {
            acc[c]
        };
        store_lanes(v, nr, w0, a0 + c, out);
    }
}

/// How far ahead of the tile block being read the decode path prefetches, in bytes: 15 to 23
/// tile blocks. Measured on the engine's batched decode (qwen2.5-coder, 2 threads): one sequence
/// +10–17% tok/s over none, four +0–10%; 1024, 2048 and 4096 were within noise of each other.
/// On an AVX-512 EPYC with faster memory, one sequence: 2048 about 10% slower than 4096; 8192
/// 10% faster in one window and 1–2% slower in others, so 4096 stays. The K-quant tiles of
/// `dot_ktile` prefetch as far.
pub(super) const PREFETCH_AHEAD: usize = 4096;

/// Whether the decode paths here and in `dot_ktile` prefetch ([`PREFETCH_AHEAD`]) on this CPU:
/// on all but AMD's. `TINYLLM_CPU_PREFETCH=1` or `0` decides by hand.
///
/// On an AMD EPYC (Zen 4, 2 threads) the K-quant tiles decoded faster without it, eight
/// alternating runs each (`bench`, 64 tokens after 128, tok/s median and best): qwen3moe-2l
/// Q4_K_M 289 → 326 and 338 → 352 (7 of 8 pairs faster), deepseek2-2l 254 → 275 and 271 → 291
/// (5 of 6), qwen35-24l even (49 → 51, 3 of 6); and the legacy tiles too: gpt-oss-2l's MXFP4
/// experts 160 → 165 and 175 → 190 (4 of 6), qwen2.5-coder-0.5b 64 → 67 and 70 → 71 (3 of 6).
/// Its own prefetchers keep up with these streams, and the prefetches take load slots. Into L2
/// instead of L1 (`_MM_HINT_T1`/`_MM_HINT_T2`, which the delta rule's state gains from: see
/// `recurrent.rs`) is still slower than none there: qwen3moe-2l Q4_K_M, five alternations,
/// median tok/s, none 484, T0 372, T1 431, T2 417. The Intel measurements above are with it.
pub(super) fn prefetch_pays() -> bool {
    static PAYS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PAYS.get_or_init(|| match std::env::var("TINYLLM_CPU_PREFETCH").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => !super::lanes::vendor_is(b"AuthenticAMD"),
    })
}

/// Batches of at least this many activation rows unpack each tile into [`Unpacked`] first;
/// smaller ones unpack it block by block for every group of up to four rows. Where that pays
/// depends on what unpacking saves (one thread, L2-resident 896-wide weights, cycles per
/// activation row against the 4-row direct groups): the 4/5-bit formats' masks and fifth-bit
/// merges gain from 8 rows on (Q5_0 8.9 against 11); IQ4_NL's table lookup only from about 32
/// (equal at 16 and 32, 15% faster at 128); Q8_0, whose unpacking is one `abs`, never (the
/// buffered loads cost more: direct is 7–30% faster from 8 to 512 rows).
const fn unpack_min_rows(kind: u8) -> usize {
    match kind {
        Q8_0 => usize::MAX,
        IQ4_NL | MXFP4 => 32,
        _ => 8,
    }
}

/// Batches of at least this many rows on [`super::lanes::Isa::Avx512`] go to [`wide_tiles`].
/// Unpacking there is per sixteen rows, and saves its cost on every activation row.
const fn wide_min_rows(_kind: u8) -> usize {
    8
}

/// Batches on [`super::lanes::Isa::Avx512`]: two tiles side by side in 512-bit vectors
/// ([`super::wide`]), each group unpacked once as the VNNI path's operand.
#[inline(always)]
unsafe fn wide_tiles<const K: u8>(nb: usize, nw: usize, weights: &[u8], act: &Activations, out: &mut TileOut<'_>) {
    let tb = nb * R * block_bytes(K);
    // blocks: [nb] the sixteen rows' blocks.
    let mut blocks = vec![WideBlock32::ZERO; nb];
    let mut w0 = 0;
    while w0 < nw {
        let nr = (nw - w0).min(WIDE_ROWS);
        for (b, x) in blocks.iter_mut().enumerate() {
            for h in 0..2 {
                if h * R >= nr {
                    x.zero_half(h);
                    continue;
                }
                let p = weights.as_ptr().add((w0 / R + h) * tb + b * R * block_bytes(K));
                for g in 0..8 {
                    let (u, s) = group::<K>(p, g);
                    // Signed values go in as `w + 128`, as in `dot`'s VNNI path.
                    x.u[g][h] = if signed(K) {
                        _mm256_xor_si256(s, _mm256_set1_epi8(-128))
                    } else {
                        u
                    };
                }
                x.d[h] = scales::<K>(p);
                if has_min(K) {
                    x.m[h] = halves(p.add(off_m(K)));
                }
            }
        }
        for_row_groups!(wide act.rows, |a0, CC| if has_min(K) {
            wide::dot32::<false, true, CC>(&blocks, act, w0, nr, a0, out)
        } else {
            // The 4/5-bit formats' offset, or the signed ones' -128·Σq_a.
            wide::dot32::<true, false, CC>(&blocks, act, w0, nr, a0, out)
        });
        w0 += nr;
    }
}

interleaved_driver!();

/// The entry point for weights of `ty` with the dot products of `isa`, if this module covers
/// `ty` (see [`super::tile`], which checked the lengths).
pub(super) fn kernel(ty: GgmlType, isa: super::lanes::Isa) -> Option<super::lanes::RunFn> {
    Some(match ty {
        GgmlType::Q4_0 => entry::<Q4_0>(isa),
        GgmlType::Q4_1 => entry::<Q4_1>(isa),
        GgmlType::Q5_0 => entry::<Q5_0>(isa),
        GgmlType::Q5_1 => entry::<Q5_1>(isa),
        GgmlType::Q8_0 => entry::<Q8_0>(isa),
        GgmlType::IQ4_NL => entry::<IQ4_NL>(isa),
        GgmlType::MXFP4 => entry::<MXFP4>(isa),
        _ => return None,
    })
}
