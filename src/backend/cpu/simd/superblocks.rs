//! The driver of the kernels that read 256-value weight super-blocks in the file layout against
//! Q8_K activations (`dot_ternary`, `dot_iquant`, `dot_iq1`), written once. A format says how
//! to unpack a group of 32 values ([`SuperBlocks::group`]) and how such a group meets 32
//! activation bytes ([`SuperBlocks::meet`]: exact integer products in i32 lanes); the driver
//! sums each super-block's groups per output into its exact integer sum `isum`, then
//! `acc = fma(isum, (d_w·FACTOR)·d_a, acc)` in f32 (ggml's step; the oracle's f32 order only
//! within the reordering bound). Every path below does exactly that per output, so a value does
//! not depend on the tile or path it was computed in.
//!
//! * Up to four activation rows (decode, and the batched decode of a few streams) meet each
//!   group as it is unpacked, in registers.
//! * More rows (prefill) with VNNI ([`super::lanes::Isa`]): eight weight rows at a time are
//!   unpacked into the lane-per-row layout of the interleaved kernels (a row per 32-bit lane,
//!   four values each, as signed values plus 128 in unsigned bytes), with each row's sub-block
//!   scales (of 16 values, or of 32 where a format's groups have one) as i32 lanes, once per
//!   weight tile; then `vpdpbusd` meets them with a broadcast of four activation bytes, a
//!   sub-block's sums meet its scales in `mullo`, and the 128 comes off through the
//!   activations' 16-value sums. Integer work per value is then that of the interleaved
//!   formats, and the unpacking is shared by every activation row. On
//!   [`super::lanes::Isa::Avx512`], sixteen rows at a time in 512-bit vectors ([`super::wide`]),
//!   the other way round: the values stay signed and meet the activations plus 128 (unsigned,
//!   made once per batch), and the 128 comes off as one correction per weight row and
//!   super-block ([`super::wide::corrections`]), as llama.cpp's act-bias does. The formats
//!   with [`Pairs`] unpack a row's whole super-block at once in 512-bit vectors and transpose
//!   sixteen rows together ([`ByPairs`]); the others go a 32-value group of eight rows at a
//!   time through the 256-bit unpacker ([`ByGroups`]).
//! * More rows without VNNI: a super-block's eight groups are unpacked once into a buffer and
//!   every row meets them.
//! * On [`super::lanes::Isa::Avx512`], formats with [`Pairs`] (the grids: magnitudes, signs
//!   and scales) meet up to four rows 64 values at a time in 512-bit vectors, their signs a
//!   mask that negates the activations (`vpsubb` under the mask), unpacked a super-block at a
//!   time; the tiles take five rows and more.

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

use super::lanes::{dpbusd, i16_pairs, store_lanes, Isa, AVX512_VNNI, AVX_VNNI, LANE_ROWS};
use super::wide::{self, WideBlock, WIDE_ROWS};
use crate::backend::cpu::tile::{Activations, TileOut};

use super::q8::{Q8K_BLOCK as ACT_BLOCK, Q8K_BSUMS as ACT_BSUMS, Q8K_VALUES as ACT_VALUES};

/// Activation rows from which VNNI CPUs unpack weight tiles (see the module doc). Measured with
/// `cargo bench --bench kernels`.
const TILED_MIN_ROWS: usize = 8;

/// A format's steps. Their bodies are `#[inline(always)]` with no target features of their
/// own: they inline into the driver, which has AVX2's, and so do the intrinsics they call.
pub(super) trait SuperBlocks {
    /// Bytes of one weight super-block.
    const BYTES: usize;
    /// What `d_w` is multiplied by (the grids' fixed-point scale; a power of two, so exact).
    const FACTOR: f32 = 1.0;
    /// Values per scale: 32 where both halves of every group share their scale (see
    /// [`SuperBlocks::values`]), so that the tiled kernels apply it once per group; else 16.
    const SCALE_SPAN: usize = 16;
    /// What every group of a super-block shares, decoded once (its scale `d`, and what the
    /// groups read: TQ1_0's trits).
    type Head;
    /// One group of 32 values, unpacked: the operands of [`SuperBlocks::meet`].
    type Group: Copy;
    /// The head of the super-block at `p`.
    unsafe fn head(p: *const u8) -> Self::Head;
    /// The super-block's scale `d_w`.
    fn scale(head: &Self::Head) -> f32;
    /// Group `g` (values `32g..32g + 32`) of the super-block at `p`.
    unsafe fn group(p: *const u8, head: &Self::Head, g: usize) -> Self::Group;
    /// The group's exact products with the 32 activation bytes `q8`, as i32 lanes.
    unsafe fn meet(x: &Self::Group, q8: __m256i) -> __m256i;
    /// The group's values as signed bytes, and the scales of its two halves of 16: `meet`'s
    /// lanes sum to `Σ scale·Σ value·q8` over the halves.
    unsafe fn values(x: &Self::Group) -> (__m256i, [i32; 2]);
}

/// A super-block unpacked for the 512-bit kernels ([`Pairs`]) as four pairs of groups, 64
/// values each: magnitudes as unsigned bytes, their signs as masks, and the odd scales.
#[derive(Clone, Copy)]
pub(super) struct PairBlock {
    /// Pair `j`'s value `v` (value `64j + v`)'s magnitude in byte `v` of `mags[j]`.
    pub mags: [__m512i; 4],
    /// Bit `v` of `signs[j]` set where value `64j + v` is negative.
    pub signs: [__mmask64; 4],
    /// The odd scale `2s + 1` of values `16q..16q + 16` in i16 lane `q` (`q` < 16).
    pub odd: __m512i,
}

/// The formats whose values are magnitudes, signs and scales ([`PairBlock`]): one row meets
/// them 64 at a time in 512-bit vectors on [`Isa::Avx512`] ([`run_pairs`]).
pub(super) trait Pairs: SuperBlocks {
    /// Whether [`Pairs::pairs`] uses AVX-512 VBMI (byte permutes): the 512-bit kernels then run
    /// in functions that enable it ([`avx512_twins`]).
    const VBMI: bool = false;
    /// The super-block at `p`. A whole super-block at a time, so that a format can unpack its
    /// signs and scales for all pairs in a few wide steps.
    unsafe fn pairs(p: *const u8, head: &Self::Head) -> PairBlock;
    /// The super-blocks at `p[0]` and `p[1]`, as [`Pairs::pairs`] makes each: a format may
    /// share work between them (the one-row kernel takes two at a time).
    #[inline(always)]
    unsafe fn pairs2(p: [*const u8; 2], head: [&Self::Head; 2]) -> [PairBlock; 2] {
        [Self::pairs(p[0], head[0]), Self::pairs(p[1], head[1])]
    }
}

/// `Σ scale·magnitude·±q8` of pair `j`'s values against the 64 activation bytes `q8`, as i32
/// lanes (`scales` from [`pair_scales`]): [`SuperBlocks::meet`]'s products of the two groups,
/// summed the same exact way.
#[inline(always)]
unsafe fn meet_pair(x: &PairBlock, j: usize, scales: __m512i, q8: __m512i) -> __m512i {
    let signed = _mm512_mask_sub_epi8(q8, x.signs[j], _mm512_setzero_si512(), q8);
    _mm512_madd_epi16(_mm512_maddubs_epi16(x.mags[j], signed), scales)
}

/// Pair `j`'s scales for [`meet_pair`] from [`PairBlock::odd`]: the scale of its values
/// `16h..16h + 16` in i16 lanes `8h..8h + 8`, the lanes `maddubs` sums those values into.
#[inline(always)]
unsafe fn pair_scales(odd: __m512i, j: usize) -> __m512i {
    // i16 lane 8h + i takes quarter 4j + h.
    let quarter = _mm512_set_epi64(
        0x0003_0003_0003_0003,
        0x0003_0003_0003_0003,
        0x0002_0002_0002_0002,
        0x0002_0002_0002_0002,
        0x0001_0001_0001_0001,
        0x0001_0001_0001_0001,
        0,
        0,
    );
    _mm512_permutexvar_epi16(_mm512_add_epi16(quarter, _mm512_set1_epi16(4 * j as i16)), odd)
}

/// The 7-bit sign fields in the low bytes of `fields`' i16 or i32 lanes (their other bytes
/// zero), each made a sign byte by ggml's `ksigns` rule: the eighth bit makes the count of
/// negatives even. The parity of a field `p` is that of the nibble `(p ^ p >> 4) & 15`,
/// looked up by `pshufb`.
#[inline(always)]
pub(super) unsafe fn ksign_bytes(fields: __m512i) -> __m512i {
    // Bit 7 where the nibble's parity is odd (a zero byte has parity 0).
    let parity = _mm512_set4_epi32(0x0080_8000, 0x8000_0080u32 as i32, 0x8000_0080u32 as i32, 0x0080_8000);
    let nibble = _mm512_xor_si512(fields, _mm512_srli_epi16::<4>(fields));
    _mm512_or_si512(fields, _mm512_shuffle_epi8(parity, nibble))
}

/// The four masks of the 32 bytes of `b` (bytes `8j..8j + 8` pair `j`'s, see [`PairBlock::signs`]).
#[inline(always)]
pub(super) unsafe fn sign_masks(b: __m256i) -> [__mmask64; 4] {
    let mut m = [0u64; 4];
    _mm256_storeu_si256(m.as_mut_ptr() as *mut __m256i, b);
    // A loop, not `map`: a closure would not inline the intrinsic.
    let mut k = [0; 4];
    for (k, &m) in k.iter_mut().zip(&m) {
        *k = _cvtu64_mask64(m);
    }
    k
}

/// `sum + isum·((d_w·FACTOR)·d_a)`, as the vector paths compute each lane.
#[inline(always)]
fn step<F: SuperBlocks>(sum: f32, isum: i32, d: f32, yd: f32) -> f32 {
    (isum as f32).mul_add((d * F::FACTOR) * yd, sum)
}

/// The i32 sum of the eight lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

/// Odd scales `2s + 1` of a group of 32's two halves as i16 lanes (0..8 the first's).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn odd_halves(s1: u32, s2: u32) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16((2 * s2 + 1) as i16), _mm_set1_epi16((2 * s1 + 1) as i16))
}

/// The two halves' scales of [`odd_halves`]' vector (i16 lanes 0 and 8).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn half_scales(v: __m256i) -> [i32; 2] {
    [_mm256_extract_epi16::<0>(v), _mm256_extract_epi16::<8>(v)]
}

/// Four 8-byte lanes from a table's entries.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn lanes64(v: [u64; 4]) -> __m256i {
    _mm256_setr_epi64x(v[0] as i64, v[1] as i64, v[2] as i64, v[3] as i64)
}

/// The f32 scale of the Q8_K block at `y`.
#[inline(always)]
unsafe fn act_scale(y: *const u8) -> f32 {
    std::ptr::read_unaligned(y as *const f32)
}

/// The 32 activation bytes of group `g` (values `32g..32g + 32`) of the Q8_K block at `y`.
#[inline(always)]
unsafe fn act_group(y: *const u8, g: usize) -> __m256i {
    _mm256_loadu_si256(y.add(ACT_VALUES + 32 * g) as *const __m256i)
}

/// A format's [`run`]: `(k, weights, act, out, isa)`.
pub(super) type RowsFn = unsafe fn(usize, &[u8], &Activations, &mut TileOut<'_>, Isa);

/// All outputs of `out`: its weight rows (`k` values each, file layout) times the prepared
/// Q8_K activation rows. The caller checked the lengths.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn run<F: SuperBlocks>(k: usize, weights: &[u8], act: &Activations, out: &mut TileOut<'_>, isa: Isa) {
    if act.rows <= super::lanes::LANE_C {
        for_row_groups!(act.rows, |a0, CC| fused::<F, CC>(k, weights, act, a0, out));
    } else if act.rows < TILED_MIN_ROWS || isa == Isa::Avx2 {
        buffered::<F>(k, weights, act, out);
    } else if isa == Isa::AvxVnni {
        tiled_avxvnni::<F>(k, weights, act, out);
    } else if isa == Isa::Avx512 {
        tiled_wide::<F, ByGroups<F>>(k, weights, act, out);
    } else {
        tiled_avx512vnni::<F>(k, weights, act, out);
    }
}

/// [`run`] for [`Pairs`] formats. On [`Isa::Avx512`], up to four rows meet each pair of
/// groups in 512-bit vectors ([`fused_wide`]), and from five rows on the 512-bit tiles take
/// over (an expert of a prefill can see any number of rows), so that no 256-bit path is left
/// there: a tile unpacks sixteen weight rows once for all activation rows, where the fused
/// kernel would unpack each twice. (Against the 256-bit buffered path at five to seven rows it
/// measured the same on a whole IQ3 prefill.) The same exact sums either way.
///
/// # Safety
/// As [`run`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn run_pairs<F: Pairs>(k: usize, weights: &[u8], act: &Activations, out: &mut TileOut<'_>, isa: Isa) {
    if isa != Isa::Avx512 {
        run::<F>(k, weights, act, out, isa);
    } else if act.rows <= super::lanes::LANE_C {
        for_row_groups!(act.rows, |a0, CC| if F::VBMI {
            fused_wide_vbmi::<F, CC>(k, weights, act, a0, out)
        } else {
            fused_wide::<F, CC>(k, weights, act, a0, out)
        });
    } else if F::VBMI {
        tiled_wide_vbmi::<F, ByPairs<F>>(k, weights, act, out);
    } else {
        tiled_wide::<F, ByPairs<F>>(k, weights, act, out);
    }
}

/// `$plain` and `$vbmi`, the entry points of the `#[inline(always)]` `$body` on
/// [`Isa::Avx512`] without and with VBMI (a function's target features cannot depend on its
/// type parameters, so twins). The VBMI twin (with BMI2, which every VBMI CPU has) is for the
/// formats whose [`Pairs::VBMI`] says so, only called where the CPU has both
/// ([`super::dot_iquant::kernel`] checks).
macro_rules! avx512_twins {
    ($plain:ident, $vbmi:ident = $body:ident [$($gen:tt)*] [$($par:tt)*] ($($arg:ident: $ty:ty),*)) => {
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni,avx512vl")]
        unsafe fn $plain<$($gen)*>($($arg: $ty),*) {
            $body::<$($par)*>($($arg),*)
        }

        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni,avx512vl,avx512vbmi,bmi2")]
        unsafe fn $vbmi<$($gen)*>($($arg: $ty),*) {
            $body::<$($par)*>($($arg),*)
        }
    };
}

avx512_twins!(fused_wide, fused_wide_vbmi = fused_wide_body [F: Pairs, const CC: usize] [F, CC]
    (k: usize, weights: &[u8], act: &Activations, a0: usize, out: &mut TileOut<'_>));

/// [`fused`] 64 values at a time in 512-bit vectors.
#[inline(always)]
unsafe fn fused_wide_body<F: Pairs, const CC: usize>(
    k: usize,
    weights: &[u8],
    act: &Activations,
    a0: usize,
    out: &mut TileOut<'_>,
) {
    let nb = k / 256;
    for w in 0..out.nw() {
        let row = weights.as_ptr().add(w * nb * F::BYTES);
        let mut sum = [0f32; CC];
        // Activation row `a0 + c`'s block `b`.
        let y = |c: usize, b: usize| act.bytes.as_ptr().add(((a0 + c) * nb + b) * ACT_BLOCK);
        let mut b = 0;
        if CC == 1 {
            // One row takes two super-blocks at a time, so that their unpacking (independent
            // chains of lookups) overlaps: 3-8% faster on the AMD EPYC (Zen 4). The sums meet
            // `sum` in the same order.
            while b + 2 <= nb {
                let p = [row.add(b * F::BYTES), row.add((b + 1) * F::BYTES)];
                let head = [F::head(p[0]), F::head(p[1])];
                let x = F::pairs2(p, [&head[0], &head[1]]);
                let acc = [pair_sums::<1>(&x[0], [y(0, b)]), pair_sums::<1>(&x[1], [y(0, b + 1)])];
                for i in 0..2 {
                    let isum = _mm512_reduce_add_epi32(acc[i][0]);
                    sum[0] = step::<F>(sum[0], isum, F::scale(&head[i]), act_scale(y(0, b + i)));
                }
                b += 2;
            }
        }
        for b in b..nb {
            let p = row.add(b * F::BYTES);
            let ys: [*const u8; CC] = std::array::from_fn(|c| y(c, b));
            let head = F::head(p);
            let acc = pair_sums::<CC>(&F::pairs(p, &head), ys);
            for c in 0..CC {
                let isum = _mm512_reduce_add_epi32(acc[c]);
                sum[c] = step::<F>(sum[c], isum, F::scale(&head), act_scale(ys[c]));
            }
        }
        for c in 0..CC {
            out.set(a0 + c, w, sum[c]);
        }
    }
}

/// The integer sums, in i32 lanes, of the unpacked super-block `x` with the Q8_K blocks `y` of
/// `CC` activation rows.
#[inline(always)]
unsafe fn pair_sums<const CC: usize>(x: &PairBlock, y: [*const u8; CC]) -> [__m512i; CC] {
    let mut acc = [_mm512_setzero_si512(); CC];
    for j in 0..4 {
        let scales = pair_scales(x.odd, j);
        for c in 0..CC {
            let q8 = _mm512_loadu_si512(y[c].add(ACT_VALUES + 64 * j) as *const __m512i);
            acc[c] = _mm512_add_epi32(acc[c], meet_pair(x, j, scales, q8));
        }
    }
    acc
}

/// Outputs `(a0..a0 + CC) × all` of `out`: each group meets the `CC` rows as it is unpacked.
#[inline(always)]
unsafe fn fused<F: SuperBlocks, const CC: usize>(
    k: usize,
    weights: &[u8],
    act: &Activations,
    a0: usize,
    out: &mut TileOut<'_>,
) {
    let nb = k / 256;
    for w in 0..out.nw() {
        let row = weights.as_ptr().add(w * nb * F::BYTES);
        let mut sum = [0f32; CC];
        for b in 0..nb {
            let p = row.add(b * F::BYTES);
            let mut y = [std::ptr::null::<u8>(); CC];
            for (c, y) in y.iter_mut().enumerate() {
                *y = act.bytes.as_ptr().add(((a0 + c) * nb + b) * ACT_BLOCK);
            }
            let head = F::head(p);
            let mut acc = [_mm256_setzero_si256(); CC];
            for g in 0..8 {
                let x = F::group(p, &head, g);
                for c in 0..CC {
                    acc[c] = _mm256_add_epi32(acc[c], F::meet(&x, act_group(y[c], g)));
                }
            }
            for c in 0..CC {
                sum[c] = step::<F>(sum[c], hsum_epi32(acc[c]), F::scale(&head), act_scale(y[c]));
            }
        }
        for c in 0..CC {
            out.set(a0 + c, w, sum[c]);
        }
    }
}

/// Every output of `out`: each super-block's groups are unpacked once and met by every row.
#[inline(always)]
unsafe fn buffered<F: SuperBlocks>(k: usize, weights: &[u8], act: &Activations, out: &mut TileOut<'_>) {
    let nb = k / 256;
    // sum: [rows] the current weight row's outputs.
    let mut sum = vec![0f32; act.rows];
    let mut groups = [MaybeUninit::<F::Group>::uninit(); 8];
    for w in 0..out.nw() {
        sum.fill(0.0);
        let row = weights.as_ptr().add(w * nb * F::BYTES);
        for b in 0..nb {
            let p = row.add(b * F::BYTES);
            let head = F::head(p);
            for (g, x) in groups.iter_mut().enumerate() {
                x.write(F::group(p, &head, g));
            }
            for (r, s) in sum.iter_mut().enumerate() {
                let y = act.bytes.as_ptr().add((r * nb + b) * ACT_BLOCK);
                let mut acc = _mm256_setzero_si256();
                for (g, x) in groups.iter().enumerate() {
                    acc = _mm256_add_epi32(acc, F::meet(x.assume_init_ref(), act_group(y, g)));
                }
                *s = step::<F>(*s, hsum_epi32(acc), F::scale(&head), act_scale(y));
            }
        }
        for (r, &s) in sum.iter().enumerate() {
            out.set(r, w, s);
        }
    }
}

/// The eight 32-bit lanes of each of `rows` transposed: lane `j` of output `i` is lane `i` of
/// `rows[j]`.
#[inline(always)]
unsafe fn transpose8(rows: [__m256i; 8]) -> [__m256i; 8] {
    let t: [__m256i; 8] = [
        _mm256_unpacklo_epi32(rows[0], rows[1]),
        _mm256_unpackhi_epi32(rows[0], rows[1]),
        _mm256_unpacklo_epi32(rows[2], rows[3]),
        _mm256_unpackhi_epi32(rows[2], rows[3]),
        _mm256_unpacklo_epi32(rows[4], rows[5]),
        _mm256_unpackhi_epi32(rows[4], rows[5]),
        _mm256_unpacklo_epi32(rows[6], rows[7]),
        _mm256_unpackhi_epi32(rows[6], rows[7]),
    ];
    let q: [__m256i; 8] = [
        _mm256_unpacklo_epi64(t[0], t[2]),
        _mm256_unpackhi_epi64(t[0], t[2]),
        _mm256_unpacklo_epi64(t[1], t[3]),
        _mm256_unpackhi_epi64(t[1], t[3]),
        _mm256_unpacklo_epi64(t[4], t[6]),
        _mm256_unpackhi_epi64(t[4], t[6]),
        _mm256_unpacklo_epi64(t[5], t[7]),
        _mm256_unpackhi_epi64(t[5], t[7]),
    ];
    [
        _mm256_permute2x128_si256::<0x20>(q[0], q[4]),
        _mm256_permute2x128_si256::<0x20>(q[1], q[5]),
        _mm256_permute2x128_si256::<0x20>(q[2], q[6]),
        _mm256_permute2x128_si256::<0x20>(q[3], q[7]),
        _mm256_permute2x128_si256::<0x31>(q[0], q[4]),
        _mm256_permute2x128_si256::<0x31>(q[1], q[5]),
        _mm256_permute2x128_si256::<0x31>(q[2], q[6]),
        _mm256_permute2x128_si256::<0x31>(q[3], q[7]),
    ]
}

/// Super-block `b` of weight rows `w0..w0 + nr` (`nr` at most eight, `nb` super-blocks per
/// row, file layout at `weights`) into half `h` of `x` (its rows `8h..8h + 8`, see
/// [`WideBlock`]): lane `i` of each vector is row `w0 + i`, and the lanes of rows past `nr` are
/// zero. Value group `g` (values `4g..4g + 4`) as signed values plus 128, unsigned; sub-block
/// `t`'s scale (values `SPAN·t..SPAN·(t + 1)`, `SPAN` the format's
/// [`SuperBlocks::SCALE_SPAN`]) as i32; scales `2j`, `2j + 1` of 16 values as an i16 pair, to
/// meet a pair of the 16-value `bsums`; `d_w·FACTOR`. With `SIGNED` the values stay signed (for
/// [`wide::dot`]'s unsigned activations) and the pairs are not made.
#[inline(always)]
unsafe fn unpack_tile<F: SuperBlocks, const SIGNED: bool>(
    weights: *const u8,
    nb: usize,
    w0: usize,
    nr: usize,
    b: usize,
    x: &mut WideBlock,
    h: usize,
) {
    let bias = _mm256_set1_epi8(-128);
    // sc: [16-value sub-block][row] the scales.
    let mut sc = [[0i32; LANE_ROWS]; 16];
    let mut d = [0f32; LANE_ROWS];
    // vals: [group][row] a row's group of 32 values.
    let mut vals = [[_mm256_setzero_si256(); LANE_ROWS]; 8];
    for i in 0..nr {
        let p = weights.add(((w0 + i) * nb + b) * F::BYTES);
        let head = F::head(p);
        d[i] = F::scale(&head) * F::FACTOR;
        for g in 0..8 {
            let (values, halves) = F::values(&F::group(p, &head, g));
            // Signed to unsigned plus 128: flip the top bit.
            vals[g][i] = if SIGNED { values } else { _mm256_xor_si256(values, bias) };
            sc[2 * g][i] = halves[0];
            sc[2 * g + 1][i] = halves[1];
        }
    }
    for (g, rows) in vals.into_iter().enumerate() {
        // Lane m of row i holds its values 32g + 4m..: group 8g + m takes lane m of each row.
        for (m, col) in transpose8(rows).into_iter().enumerate() {
            x.u[8 * g + m][h] = col;
        }
    }
    // A loop, not `map`: a closure does not take the caller's target features, and its
    // intrinsic would be a call.
    let mut scv = [_mm256_setzero_si256(); 16];
    for (v, s) in scv.iter_mut().zip(&sc) {
        *v = _mm256_loadu_si256(s.as_ptr() as *const __m256i);
    }
    let sc = scv;
    for t in 0..256 / F::SCALE_SPAN {
        x.sc[t][h] = sc[t * F::SCALE_SPAN / 16];
    }
    if !SIGNED {
        for j in 0..8 {
            // i16 pairs (scale 2j, scale 2j + 1) per lane: both fit i16.
            x.pair[j][h] = i16_pairs(sc[2 * j], sc[2 * j + 1]);
        }
    }
    x.d[h] = _mm256_loadu_ps(d.as_ptr());
}

/// Weight rows `w0..w0 + nr` (at most eight per half) into the first `halves` halves of
/// `blocks`, one per super-block: rows `w0 + 8h..` into half `h`, rows past the end as zeros;
/// signed with `SIGNED` (see [`unpack_tile`]).
#[inline(always)]
unsafe fn unpack_rows<F: SuperBlocks, const SIGNED: bool>(
    weights: *const u8,
    w0: usize,
    nr: usize,
    halves: usize,
    blocks: &mut [WideBlock],
) {
    let nb = blocks.len();
    for (b, x) in blocks.iter_mut().enumerate() {
        for h in 0..halves {
            let hr = nr.saturating_sub(h * LANE_ROWS).min(LANE_ROWS);
            unpack_tile::<F, SIGNED>(weights, nb, w0 + h * LANE_ROWS, hr, b, x, h);
        }
    }
}

/// The sixteen 32-bit lanes of each of `rows` transposed: lane `j` of output `i` is lane `i` of
/// `rows[j]`.
#[inline(always)]
unsafe fn transpose16(r: &[__m512i; 16]) -> [__m512i; 16] {
    // Within each 128-bit lane: pairs of rows, then quads; then the lanes move across.
    let mut t = [_mm512_setzero_si512(); 16];
    for k in 0..8 {
        t[2 * k] = _mm512_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
    }
    // q[4k + c]: 128-bit lane l holds rows 4k..4k + 4 at column 4l + c.
    let mut q = [_mm512_setzero_si512(); 16];
    for k in 0..4 {
        q[4 * k] = _mm512_unpacklo_epi64(t[4 * k], t[4 * k + 2]);
        q[4 * k + 1] = _mm512_unpackhi_epi64(t[4 * k], t[4 * k + 2]);
        q[4 * k + 2] = _mm512_unpacklo_epi64(t[4 * k + 1], t[4 * k + 3]);
        q[4 * k + 3] = _mm512_unpackhi_epi64(t[4 * k + 1], t[4 * k + 3]);
    }
    let mut out = [_mm512_setzero_si512(); 16];
    for c in 0..4 {
        // Lanes 0, 1 (lo) or 2, 3 (hi) of rows 0..8, and of rows 8..16.
        let a_lo = _mm512_shuffle_i32x4::<0b01_00_01_00>(q[c], q[4 + c]);
        let a_hi = _mm512_shuffle_i32x4::<0b11_10_11_10>(q[c], q[4 + c]);
        let b_lo = _mm512_shuffle_i32x4::<0b01_00_01_00>(q[8 + c], q[12 + c]);
        let b_hi = _mm512_shuffle_i32x4::<0b11_10_11_10>(q[8 + c], q[12 + c]);
        out[c] = _mm512_shuffle_i32x4::<0b10_00_10_00>(a_lo, b_lo);
        out[4 + c] = _mm512_shuffle_i32x4::<0b11_01_11_01>(a_lo, b_lo);
        out[8 + c] = _mm512_shuffle_i32x4::<0b10_00_10_00>(a_hi, b_hi);
        out[12 + c] = _mm512_shuffle_i32x4::<0b11_01_11_01>(a_hi, b_hi);
    }
    out
}

/// How [`tiled_wide`] unpacks sixteen weight rows into its blocks, signed ([`wide::dot`]'s
/// `SIGNED`), before [`wide::corrections`].
trait WideUnpack {
    /// Weight rows `w0..w0 + nr` (at most sixteen) into `blocks`, one per super-block, rows
    /// past the end as zeros.
    unsafe fn unpack(weights: *const u8, w0: usize, nr: usize, blocks: &mut [WideBlock]);
}

/// A group of 32 values of eight rows at a time, through the 256-bit unpacker
/// ([`unpack_rows`]).
struct ByGroups<F>(std::marker::PhantomData<F>);

impl<F: SuperBlocks> WideUnpack for ByGroups<F> {
    #[inline(always)]
    unsafe fn unpack(weights: *const u8, w0: usize, nr: usize, blocks: &mut [WideBlock]) {
        unpack_rows::<F, true>(weights, w0, nr, 2, blocks)
    }
}

/// A whole super-block of a row at a time in 512-bit vectors ([`Pairs::pairs`], as
/// [`fused_wide`] reads it), then sixteen rows transposed together ([`transpose16`]): the
/// same values and scales as [`ByGroups`], where a 32-value group per row took a 256-bit
/// gather, a sign step and an eighth of an 8x8 transpose (a tile of eight activation rows,
/// mostly unpacking, measured 23-36% faster).
struct ByPairs<F>(std::marker::PhantomData<F>);

impl<F: Pairs> WideUnpack for ByPairs<F> {
    #[inline(always)]
    unsafe fn unpack(weights: *const u8, w0: usize, nr: usize, blocks: &mut [WideBlock]) {
        let nb = blocks.len();
        let zero = _mm512_setzero_si512();
        // vals[j][i]: row i's values 64j..64j + 64 as signed bytes; scales[i]: its 16-value
        // quarters' scales as i32; rows from nr on stay zero.
        let mut vals = [[zero; WIDE_ROWS]; 4];
        let mut scales = [zero; WIDE_ROWS];
        let mut d = [0f32; WIDE_ROWS];
        for (b, x) in blocks.iter_mut().enumerate() {
            for i in 0..nr {
                let p = weights.add(((w0 + i) * nb + b) * F::BYTES);
                let head = F::head(p);
                d[i] = F::scale(&head) * F::FACTOR;
                let pb = F::pairs(p, &head);
                for j in 0..4 {
                    vals[j][i] = _mm512_mask_sub_epi8(pb.mags[j], pb.signs[j], zero, pb.mags[j]);
                }
                scales[i] = _mm512_cvtepi16_epi32(_mm512_castsi512_si256(pb.odd));
            }
            for (j, rows) in vals.iter().enumerate() {
                // Lane m of row i holds its values 64j + 4m..: group 16j + m takes lane m of each.
                for (m, col) in transpose16(rows).into_iter().enumerate() {
                    _mm512_store_si512(x.u[16 * j + m].as_mut_ptr() as *mut _, col);
                }
            }
            let sc = transpose16(&scales);
            for t in 0..256 / F::SCALE_SPAN {
                _mm512_store_si512(x.sc[t].as_mut_ptr() as *mut _, sc[t * F::SCALE_SPAN / 16]);
            }
            _mm512_store_ps(x.d.as_mut_ptr() as *mut f32, _mm512_loadu_ps(d.as_ptr()));
        }
    }
}

/// Outputs `(w0..w0 + nr) × (a0..a0 + CC)` from the unpacked tile `blocks` (one per
/// super-block), whose sub-blocks are `SPAN` value groups of four.
#[inline(always)]
unsafe fn tile_dot<const CC: usize, const V: u8, const SPAN: usize>(
    blocks: &[WideBlock],
    act: &Activations,
    w0: usize,
    nr: usize,
    a0: usize,
    out: &mut TileOut<'_>,
) {
    let a = act.bytes.as_ptr().add(a0 * act.row_bytes);
    let mut acc = [_mm256_setzero_ps(); CC];
    for (b, x) in blocks.iter().enumerate() {
        let mut isum = [_mm256_setzero_si256(); CC];
        for t in 0..64 / SPAN {
            let mut s32 = [_mm256_setzero_si256(); CC];
            for m in 0..SPAN {
                let g = SPAN * t + m;
                for c in 0..CC {
                    let y = a.add(c * act.row_bytes + b * ACT_BLOCK + ACT_VALUES + 4 * g);
                    let y = _mm256_set1_epi32(std::ptr::read_unaligned(y as *const i32));
                    s32[c] = dpbusd::<V>(s32[c], x.u[g][0], y);
                }
            }
            for c in 0..CC {
                isum[c] = _mm256_add_epi32(isum[c], _mm256_mullo_epi32(s32[c], x.sc[t][0]));
            }
        }
        for c in 0..CC {
            let y = a.add(c * act.row_bytes + b * ACT_BLOCK);
            let mut psum = _mm256_setzero_si256();
            for j in 0..8 {
                let pair = _mm256_set1_epi32(std::ptr::read_unaligned(y.add(ACT_BSUMS + 4 * j) as *const i32));
                psum = _mm256_add_epi32(psum, _mm256_madd_epi16(x.pair[j][0], pair));
            }
            // The 128 each unsigned value carries.
            isum[c] = _mm256_sub_epi32(isum[c], _mm256_slli_epi32::<7>(psum));
            let dy = _mm256_set1_ps(act_scale(y));
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[c]), _mm256_mul_ps(x.d[0], dy), acc[c]);
        }
    }
    for c in 0..CC {
        store_lanes(acc[c], nr, w0, a0 + c, out);
    }
}

/// Every output of `out`, eight weight rows at a time unpacked once into the lane-per-row
/// layout (see the module doc).
#[inline(always)]
unsafe fn tiled<F: SuperBlocks, const V: u8>(k: usize, weights: &[u8], act: &Activations, out: &mut TileOut<'_>) {
    let nb = k / 256;
    // blocks: [nb] the current weight tile's super-blocks, in their first halves.
    let mut blocks = wide::Blocks::take(nb);
    let nw = out.nw();
    let mut w0 = 0;
    while w0 < nw {
        let nr = (nw - w0).min(LANE_ROWS);
        unpack_rows::<F, false>(weights.as_ptr(), w0, nr, 1, &mut blocks);
        for_row_groups!(act.rows, |a0, CC| if F::SCALE_SPAN == 32 {
            tile_dot::<CC, V, 8>(&blocks, act, w0, nr, a0, out)
        } else {
            tile_dot::<CC, V, 4>(&blocks, act, w0, nr, a0, out)
        });
        w0 += nr;
    }
}

avx512_twins!(tiled_wide, tiled_wide_vbmi = tiled_wide_body [F: SuperBlocks, U: WideUnpack] [F, U]
    (k: usize, weights: &[u8], act: &Activations, out: &mut TileOut<'_>));

/// [`tiled`] on [`Isa::Avx512`]: sixteen weight rows at a time, two tiles side by side in
/// 512-bit vectors ([`super::wide`]).
#[inline(always)]
unsafe fn tiled_wide_body<F: SuperBlocks, U: WideUnpack>(
    k: usize,
    weights: &[u8],
    act: &Activations,
    out: &mut TileOut<'_>,
) {
    let nb = k / 256;
    // blocks: [nb] the sixteen rows' super-blocks.
    let mut blocks = wide::Blocks::take(nb);
    let nw = out.nw();
    let mut w0 = 0;
    while w0 < nw {
        let nr = (nw - w0).min(WIDE_ROWS);
        U::unpack(weights.as_ptr(), w0, nr, &mut blocks);
        if F::SCALE_SPAN == 32 {
            wide::corrections::<8>(&mut blocks);
        } else {
            wide::corrections::<4>(&mut blocks);
        }
        for_row_groups!(wide act.rows, |a0, CC| if F::SCALE_SPAN == 32 {
            wide::dot::<8, 7, false, true, CC>(&blocks, act, w0, nr, a0, out)
        } else {
            wide::dot::<4, 7, false, true, CC>(&blocks, act, w0, nr, a0, out)
        });
        w0 += nr;
    }
}

#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn tiled_avxvnni<F: SuperBlocks>(k: usize, weights: &[u8], act: &Activations, out: &mut TileOut<'_>) {
    tiled::<F, AVX_VNNI>(k, weights, act, out)
}

#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
unsafe fn tiled_avx512vnni<F: SuperBlocks>(k: usize, weights: &[u8], act: &Activations, out: &mut TileOut<'_>) {
    tiled::<F, AVX512_VNNI>(k, weights, act, out)
}
