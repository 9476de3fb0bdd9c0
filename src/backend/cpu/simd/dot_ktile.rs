//! Q4_K and Q6_K (the K-quant weights of the common Q4_K_M files), Q5_K (Q4_K with a fifth bit
//! per value, of the Q5_K_M files and the attention of MoE quantizations), Q2_K, Q3_K (the experts of
//! the 2- and 3-bit "dynamic" MoE quantizations), TQ2_0 (ternary, Q2_K's bit layout with one
//! scale per super-block) and IQ4_XS (nibbles indexing ggml's non-linear levels, a signed 6-bit
//! scale per 32 values) against Q8_K activations, on weights interleaved at load
//! ([`super::super::interleave`]: eight rows per tile).
//!
//! As in `dot_legacy`: one load and a mask or shift give four consecutive values of all eight
//! rows, a row per 32-bit lane; a broadcast of the activation's four bytes meets them in
//! `maddubs`, and the i16 sums of a sub-block meet the eight rows' sub-block scales (unpacked
//! once per tile block, eight rows per vector op) in `madd`. So each lane ends a super-block
//! with its row's exact integer sums, with no sum across lanes: ggml's `Σ sc·Σq·q8` (less
//! `32·Σ sc·bsum` for Q6_K, whose values are `q - 32`, `4·Σ sc·bsum` for Q3_K, whose values
//! are its 3-bit codes less 4, and `Σ bsum` for TQ2_0, whose are its codes less 1) and for Q4_K, Q5_K and Q2_K `Σ m·bsum` for the minimums. From there the f32 arithmetic is ggml's `vec_dot_q*_K_q8_K`:
//! `acc = fma(isum, d_w·d_a, acc)`, then for Q4_K, Q5_K and Q2_K `acc = fnmadd(msum, dmin_w·d_a, acc)`.
//!
//! With VNNI ([`super::lanes::Isa`]), `vpdpbusd` sums a sub-block's products per row straight into i32
//! lanes, which then meet the sub-block scales (as i32) in `mullo`: the same integer sums. Q6_K
//! does so only on buffered tiles (batches): unpacking its 16-value sub-blocks one value group at
//! a time for few rows measured slower than the AVX2 products (`cargo bench --bench kernels`, 4
//! rows 20 against 31-33 GB/s; buffered, 512 rows 570-583 against 493-527 GOP/s).
//!
//! IQ4_XS's levels are signed bytes up to 127 in magnitude. Without VNNI they meet the
//! activations under the sign trick (`maddubs` of the magnitudes with the activations under
//! the levels' signs), each value group's i16 pairs meeting its scale at once. With VNNI they
//! go in as level + 128, unsigned, and `isum` loses `128·Σ sc·bsum` (the scales paired with
//! the activations' 32-value sums): the same exact `Σ sc·Σ level·q8` as ggml's
//! `vec_dot_iq4_xs_q8_K`, and the f32 step `acc = fma(isum, d_w·d_a, acc)`.
//!
//! Few activation rows (decode) unpack each tile block in registers and meet it with every row;
//! from [`unpack_min_rows`] rows on, each tile is unpacked once into a buffer first. Both give
//! the same bits.

use std::arch::x86_64::*;

use super::super::interleave::{q6k_quads, TILE_ROWS as R};
use super::dot_legacy::{prefetch_pays, KVALUES_IQ4NL, PREFETCH_AHEAD};
use super::lanes::{dpbusd, i16_pairs, store_lanes, AVX2, AVX512};
use super::wide::{self, WideBlock, WIDE_ROWS};
use crate::backend::cpu::tile::{Activations, TileOut};
use crate::quant::GgmlType;

const Q4_K: u8 = 0;
const Q6_K: u8 = 1;
const Q2_K: u8 = 2;
const Q3_K: u8 = 3;
const TQ2_0: u8 = 4;
const Q5_K: u8 = 5;
const IQ4_XS: u8 = 6;

use super::q8::{Q8K_BLOCK as ACT_BLOCK, Q8K_BSUMS as ACT_BSUMS, Q8K_VALUES as ACT_VALUES};

/// Whether kernels of `kind` for ISA `v` use `vpdpbusd`, on a buffered tile if `buf` (see
/// the module doc).
const fn vnni(kind: u8, v: u8, buf: bool) -> bool {
    v != AVX2 && (kind != Q6_K || buf)
}

const fn block_bytes(kind: u8) -> usize {
    match kind {
        Q4_K => 144,
        Q5_K => 176,
        Q6_K => 210,
        Q3_K => 110,
        TQ2_0 => 66,
        IQ4_XS => 136,
        _ => 84,
    }
}

// Offsets of the fields in a tile block (their order in `interleave`). Q4_K: `d` (8 f16),
// `dmin` (8 f16), the 12 bytes of packed 6-bit scales and minimums (3 groups), `qs` (32 groups).
const Q4K_DMIN: usize = 2 * R;
const Q4K_SCALES: usize = 4 * R;
const Q4K_QS: usize = 16 * R;
// Q5_K: Q4_K's `d`, `dmin` and scales at the same offsets, then `qh` (8 groups), `qs` (32 groups).
const Q5K_QH: usize = 16 * R;
const Q5K_QS: usize = 48 * R;
// Q6_K: `d`, the 16 signed scales (4 groups), then `ql` (32 groups) and `qh` (16 groups) as
// [`q6k_quads`] places them.
const Q6K_SCALES: usize = 2 * R;
// Q2_K: `d`, `dmin`, the 16 scale bytes (minimum in the high nibble; 4 groups), `qs` (16 groups).
const Q2K_DMIN: usize = 2 * R;
const Q2K_SCALES: usize = 4 * R;
const Q2K_QS: usize = 20 * R;
// Q3_K: `d`, the 12 bytes of packed 6-bit scales (3 groups), `hmask` (8 groups), `qs` (16 groups).
const Q3K_SCALES: usize = 2 * R;
const Q3K_HMASK: usize = 14 * R;
const Q3K_QS: usize = 46 * R;
// TQ2_0: `d`, `qs` (16 groups, Q2_K's bit layout).
const TQ2_QS: usize = 2 * R;
// IQ4_XS: `d`, `scales_h` (8 u16), `scales_l` (1 group), `qs` (32 groups).
const IQ4_SCALES_H: usize = 2 * R;
const IQ4_SCALES_L: usize = 4 * R;
const IQ4_QS: usize = 8 * R;

/// A `shuffle_epi8` mask filling every 32-bit lane from its own four bytes: the lane's byte
/// `k` becomes its byte `pick[k]`, or zero where `pick[k]` is negative.
const fn lane_mask(pick: [i8; 4]) -> [i8; 32] {
    let mut m = [0i8; 32];
    let mut i = 0;
    while i < 32 {
        let p = pick[i % 4];
        // `shuffle_epi8` indexes within each 128-bit half: the lane's first byte is 4·(i/4 % 4).
        m[i] = if p < 0 { -128 } else { (i / 4 % 4 * 4) as i8 + p };
        i += 1;
    }
    m
}

/// Byte `t` of each lane as two zero-extended i16.
static ZEXT_DUP: [[i8; 32]; 4] = [
    lane_mask([0, -1, 0, -1]),
    lane_mask([1, -1, 1, -1]),
    lane_mask([2, -1, 2, -1]),
    lane_mask([3, -1, 3, -1]),
];
/// Bytes `2h`, `2h + 1` of each lane as zero-extended i16.
static ZEXT_PAIR: [[i8; 32]; 2] = [lane_mask([0, -1, 1, -1]), lane_mask([2, -1, 3, -1])];
/// Byte `t` of each lane in the high byte of both i16 (an arithmetic shift by 8 then
/// sign-extends it).
static HIGH_DUP: [[i8; 32]; 4] = [
    lane_mask([-1, 0, -1, 0]),
    lane_mask([-1, 1, -1, 1]),
    lane_mask([-1, 2, -1, 2]),
    lane_mask([-1, 3, -1, 3]),
];
/// Bytes `2h`, `2h + 1` of each lane in the high bytes of the two i16.
static HIGH_PAIR: [[i8; 32]; 2] = [lane_mask([-1, 0, -1, 1]), lane_mask([-1, 2, -1, 3])];
/// Byte `t` of each lane in its top byte (an arithmetic shift by 24 then sign-extends it).
static HIGH_32: [[i8; 32]; 4] = [
    lane_mask([-1, -1, -1, 0]),
    lane_mask([-1, -1, -1, 1]),
    lane_mask([-1, -1, -1, 2]),
    lane_mask([-1, -1, -1, 3]),
];
/// Byte `t` of each lane zero-extended to i32.
static ZEXT_32: [[i8; 32]; 4] = [
    lane_mask([0, -1, -1, -1]),
    lane_mask([1, -1, -1, -1]),
    lane_mask([2, -1, -1, -1]),
    lane_mask([3, -1, -1, -1]),
];
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn shuffle(v: __m256i, m: &[i8; 32]) -> __m256i {
    _mm256_shuffle_epi8(v, _mm256_loadu_si256(m.as_ptr() as *const __m256i))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

/// A tile block's per-row factors, lane `i` for row `i`.
#[derive(Clone, Copy)]
struct Scales {
    /// The scale of sub-block `j` as two equal i16, the `madd` operand of its values' i16 sums,
    /// or with VNNI as an i32, the `mullo` operand of their i32 sums (Q4_K, Q5_K and IQ4_XS: 8
    /// sub-blocks of 32 values; Q6_K, Q2_K and Q3_K: 16 of 16).
    sc: [__m256i; 16],
    /// Q4_K: minimums `2j`, `2j + 1` as i16 (4 pairs; IQ4_XS: scales), to meet the activations'
    /// sums over sub-blocks `2j`, `2j + 1`; Q6_K: scales `2j`, `2j + 1`, Q2_K: minimums `2j`, `2j + 1` (8
    /// pairs; Q3_K: scales), to meet pairs of the 16-value `bsums`. One `madd` each.
    pair: [__m256i; 8],
    d: __m256,
    dmin: __m256,
}

/// The factors of the tile block at `p`, for the dot products of ISA `V` on a buffered tile if
/// `BUF`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scales<const K: u8, const V: u8, const BUF: bool>(p: *const u8) -> Scales {
    let zero = _mm256_setzero_si256();
    let mut s = Scales {
        sc: [zero; 16],
        pair: [zero; 8],
        d: _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
        dmin: _mm256_setzero_ps(),
    };
    if K == Q4_K || K == Q5_K {
        // Eight rows at once of `quant::kquant::scale_min_k4`: the first four scales and
        // minimums are the low 6 bits of bytes 0..4 / 4..8; the last four take 4 bits from
        // bytes 8..12 and their top 2 bits from the spare top bits of bytes 0..8.
        let (u0, u1, u2) = (
            load(p.add(Q4K_SCALES)),
            load(p.add(Q4K_SCALES + 32)),
            load(p.add(Q4K_SCALES + 64)),
        );
        let six = _mm256_set1_epi32(0x3f3f_3f3f);
        let four = _mm256_set1_epi32(0x0f0f_0f0f);
        let two = _mm256_set1_epi32(0x0303_0303);
        // (A macro: closures would not inherit the target features.)
        macro_rules! top {
            ($u:expr) => {
                _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srli_epi32::<6>($u), two))
            };
        }
        let sc = [
            _mm256_and_si256(u0, six),
            _mm256_or_si256(_mm256_and_si256(u2, four), top!(u0)),
        ];
        let mins = [
            _mm256_and_si256(u1, six),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32::<4>(u2), four), top!(u1)),
        ];
        for j in 0..8 {
            s.sc[j] = shuffle(
                sc[j / 4],
                if vnni(K, V, BUF) {
                    &ZEXT_32[j % 4]
                } else {
                    &ZEXT_DUP[j % 4]
                },
            );
        }
        for j in 0..4 {
            s.pair[j] = shuffle(mins[j / 2], &ZEXT_PAIR[j % 2]);
        }
        s.dmin = _mm256_cvtph_ps(_mm_loadu_si128(p.add(Q4K_DMIN) as *const __m128i));
    } else if K == Q2_K {
        // Sub-block t's byte is byte t % 4 of group t / 4: its scale the low nibble, its
        // minimum the high one.
        let g = [
            load(p.add(Q2K_SCALES)),
            load(p.add(Q2K_SCALES + 32)),
            load(p.add(Q2K_SCALES + 64)),
            load(p.add(Q2K_SCALES + 96)),
        ];
        let low = _mm256_set1_epi16(0x0f);
        for t in 0..16 {
            let m = if vnni(K, V, BUF) {
                &ZEXT_32[t % 4]
            } else {
                &ZEXT_DUP[t % 4]
            };
            s.sc[t] = _mm256_and_si256(shuffle(g[t / 4], m), low);
        }
        for j in 0..8 {
            s.pair[j] = _mm256_srli_epi16::<4>(shuffle(g[j / 2], &ZEXT_PAIR[j % 2]));
        }
        s.dmin = _mm256_cvtph_ps(_mm_loadu_si128(p.add(Q2K_DMIN) as *const __m128i));
    } else if K == TQ2_0 {
        // One scale, `d`: every sub-block's is 1.
        let one = if vnni(K, V, BUF) {
            _mm256_set1_epi32(1)
        } else {
            _mm256_set1_epi16(1)
        };
        s.sc = [one; 16];
        s.pair = [_mm256_set1_epi16(1); 8];
    } else if K == IQ4_XS {
        // Eight rows at once of `quant::iquant::iq4xs_scale`: group g's scale is bits 4g..4g + 4
        // of `scales_l` (a row's four bytes, one per lane) with bits 2g, 2g + 1 of `scales_h`
        // on top, less 32.
        let low = load(p.add(IQ4_SCALES_L));
        let high = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.add(IQ4_SCALES_H) as *const __m128i));
        let mut sc = [zero; 8];
        for (g, sc) in sc.iter_mut().enumerate() {
            let l = _mm256_and_si256(
                _mm256_srlv_epi32(low, _mm256_set1_epi32(4 * g as i32)),
                _mm256_set1_epi32(15),
            );
            let h = _mm256_and_si256(
                _mm256_srlv_epi32(high, _mm256_set1_epi32(2 * g as i32)),
                _mm256_set1_epi32(3),
            );
            *sc = _mm256_sub_epi32(_mm256_or_si256(l, _mm256_slli_epi32::<4>(h)), _mm256_set1_epi32(32));
        }
        // As i16: the scale in both halves of a lane (`madd`'s operand), and the pairs of
        // scales that meet pairs of the activations' 32-value sums (the 128 the unsigned
        // values carry, see `dot`).
        for g in 0..8 {
            s.sc[g] = if vnni(K, V, BUF) {
                sc[g]
            } else {
                i16_pairs(sc[g], sc[g])
            };
        }
        for j in 0..4 {
            s.pair[j] = i16_pairs(sc[2 * j], sc[2 * j + 1]);
        }
    } else if K == Q3_K {
        // Eight rows at once of the 6-bit scales: sub-block t's low 4 bits are the low (t < 8)
        // or high nibble of byte t % 8 (groups 0, 1), its top 2 bits bits 2(t / 4).. of byte
        // 8 + t % 4 (group 2); then less 32. So scale group G (sub-blocks 4G..4G + 4, a byte
        // each) is nibbles of group G % 2 with bits of group 2 on top.
        let (u0, u1, u2) = (
            load(p.add(Q3K_SCALES)),
            load(p.add(Q3K_SCALES + 32)),
            load(p.add(Q3K_SCALES + 64)),
        );
        let four = _mm256_set1_epi8(0x0f);
        let two = _mm256_set1_epi8(3);
        let nibbles = [
            _mm256_and_si256(u0, four),
            _mm256_and_si256(u1, four),
            _mm256_and_si256(_mm256_srli_epi16::<4>(u0), four),
            _mm256_and_si256(_mm256_srli_epi16::<4>(u1), four),
        ];
        let top = [
            u2,
            _mm256_srli_epi16::<2>(u2),
            _mm256_srli_epi16::<4>(u2),
            _mm256_srli_epi16::<6>(u2),
        ];
        let mut full = [_mm256_setzero_si256(); 4];
        for g in 0..4 {
            full[g] = _mm256_or_si256(nibbles[g], _mm256_slli_epi16::<4>(_mm256_and_si256(top[g], two)));
        }
        for t in 0..16 {
            s.sc[t] = if vnni(K, V, BUF) {
                _mm256_sub_epi32(shuffle(full[t / 4], &ZEXT_32[t % 4]), _mm256_set1_epi32(32))
            } else {
                _mm256_sub_epi16(shuffle(full[t / 4], &ZEXT_DUP[t % 4]), _mm256_set1_epi16(32))
            };
        }
        for j in 0..8 {
            s.pair[j] = _mm256_sub_epi16(shuffle(full[j / 2], &ZEXT_PAIR[j % 2]), _mm256_set1_epi16(32));
        }
    } else {
        let g = [
            load(p.add(Q6K_SCALES)),
            load(p.add(Q6K_SCALES + 32)),
            load(p.add(Q6K_SCALES + 64)),
            load(p.add(Q6K_SCALES + 96)),
        ];
        for t in 0..16 {
            s.sc[t] = if vnni(K, V, BUF) {
                _mm256_srai_epi32::<24>(shuffle(g[t / 4], &HIGH_32[t % 4]))
            } else {
                _mm256_srai_epi16::<8>(shuffle(g[t / 4], &HIGH_DUP[t % 4]))
            };
        }
        for j in 0..8 {
            s.pair[j] = _mm256_srai_epi16::<8>(shuffle(g[j / 2], &HIGH_PAIR[j % 2]));
        }
    }
    s
}

/// Q4_K value groups `16j + r` and `16j + 8 + r` (values `4g..4g + 4` of the super-block, for
/// `j` < 4, `r` < 8) of all eight rows of the tile block at `p`, a row per lane: each 32 bytes
/// of `qs` hold 64 values, the low nibbles the first 32, the high nibbles the next.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4k_groups(p: *const u8, j: usize, r: usize) -> [__m256i; 2] {
    nibble_halves(load(p.add(Q4K_QS + 32 * (8 * j + r))))
}

/// The low and the high nibbles of the bytes of `v` (a `qs` group of Q4_K or Q5_K).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibble_halves(v: __m256i) -> [__m256i; 2] {
    let low = _mm256_set1_epi8(0x0F);
    [
        _mm256_and_si256(v, low),
        _mm256_and_si256(_mm256_srli_epi16::<4>(v), low),
    ]
}

/// Q5_K value groups `16j + r` and `16j + 8 + r` as [`q4k_groups`] (`qs` further on), each
/// value's fifth bit on top: bit `2j` of `qh` byte `l` is value `64j + l`'s, bit `2j + 1`
/// value `64j + 32 + l`'s, and `qh` group `r` holds bytes `4r..4r + 4` of every row.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5k_groups(p: *const u8, j: usize, r: usize) -> [__m256i; 2] {
    let one = _mm256_set1_epi8(1);
    let [lo, hi] = nibble_halves(load(p.add(Q5K_QS + 32 * (8 * j + r))));
    // Shifts within 16-bit lanes, but each byte keeps only its own bit 0, then moves it to bit 4.
    let qh = _mm256_srl_epi16(load(p.add(Q5K_QH + 32 * r)), _mm_cvtsi32_si128(2 * j as i32));
    let fifth_lo = _mm256_slli_epi16::<4>(_mm256_and_si256(qh, one));
    let fifth_hi = _mm256_slli_epi16::<3>(_mm256_and_si256(qh, _mm256_add_epi8(one, one)));
    [_mm256_or_si256(lo, fifth_lo), _mm256_or_si256(hi, fifth_hi)]
}

/// Q6_K value group `32n + 8q + l` (`n` < 2, `q` < 4, `l` < 8) of all eight rows of the tile
/// block at `p`, unsigned (`q`, before its -32): value `128n + 32q + i` is the low (q < 2) or
/// high nibble of `ql` byte `64n + 32(q % 2) + i` with bits `2q, 2q + 1` of `qh` byte `32n + i`
/// on top.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k_group(p: *const u8, n: usize, l: usize, q: usize) -> __m256i {
    let low = _mm256_set1_epi8(0x0F);
    let (ql, qh) = q6k_quads(n, l, q);
    let ql = load(p.add(ql));
    let qh = load(p.add(qh));
    let nib = if q < 2 {
        _mm256_and_si256(ql, low)
    } else {
        _mm256_and_si256(_mm256_srli_epi16::<4>(ql), low)
    };
    // The two bits to bits 4..6 (16-bit shifts by at most 4 keep each byte's bits 4..6 from
    // its own byte).
    let at4 = match q {
        0 => _mm256_slli_epi16::<4>(qh),
        1 => _mm256_slli_epi16::<2>(qh),
        2 => qh,
        _ => _mm256_srli_epi16::<2>(qh),
    };
    _mm256_or_si256(nib, _mm256_and_si256(at4, _mm256_set1_epi8(0x30)))
}

/// [`q6k_group`] for `q` = 0..4 at once: the four share their `ql` and `qh` loads.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k_groups(p: *const u8, n: usize, l: usize) -> [__m256i; 4] {
    [
        q6k_group(p, n, l, 0),
        q6k_group(p, n, l, 1),
        q6k_group(p, n, l, 2),
        q6k_group(p, n, l, 3),
    ]
}

/// Q2_K value groups `32n + 8j + m` for `j` = 0..4 (values `128n + 32j + 4m..` of the
/// super-block, `n` < 2, `m` < 8) of all eight rows of the tile block at `p`: group `8n + m`
/// of `qs` holds them in its bits `2j, 2j + 1`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q2k_groups(p: *const u8, n: usize, m: usize) -> [__m256i; 4] {
    two_bit_groups(p.add(Q2K_QS), n, m)
}

/// The groups of [`q2k_groups`] from `qs` at `qs` (Q2_K's and TQ2_0's bit layout).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn two_bit_groups(qs: *const u8, n: usize, m: usize) -> [__m256i; 4] {
    let three = _mm256_set1_epi8(3);
    let v = load(qs.add(32 * (8 * n + m)));
    [
        _mm256_and_si256(v, three),
        _mm256_and_si256(_mm256_srli_epi16::<2>(v), three),
        _mm256_and_si256(_mm256_srli_epi16::<4>(v), three),
        _mm256_and_si256(_mm256_srli_epi16::<6>(v), three),
    ]
}

/// Q3_K value groups `32n + 8j + m` for `j` = 0..4 (`n` < 2, `m` < 8) of all eight rows of the
/// tile block at `p`, as unsigned 3-bit codes (the value plus 4): the low bits are Q2_K's
/// (bits `2j, 2j + 1` of `qs` group `8n + m`), the high bit is bit `4n + j` of `hmask` group `m`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q3k_groups(p: *const u8, n: usize, m: usize) -> [__m256i; 4] {
    let three = _mm256_set1_epi8(3);
    let four = _mm256_set1_epi8(4);
    let v = load(p.add(Q3K_QS + 32 * (8 * n + m)));
    let hm = load(p.add(Q3K_HMASK + 32 * m));
    // Bits 4n..4n + 4 of each byte to its bit 2 (16-bit shifts by at most 5 keep each byte's
    // bit 2 from its own byte).
    let at2 = if n == 0 {
        [
            _mm256_slli_epi16::<2>(hm),
            _mm256_slli_epi16::<1>(hm),
            hm,
            _mm256_srli_epi16::<1>(hm),
        ]
    } else {
        [
            _mm256_srli_epi16::<2>(hm),
            _mm256_srli_epi16::<3>(hm),
            _mm256_srli_epi16::<4>(hm),
            _mm256_srli_epi16::<5>(hm),
        ]
    };
    [
        _mm256_or_si256(_mm256_and_si256(v, three), _mm256_and_si256(at2[0], four)),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16::<2>(v), three),
            _mm256_and_si256(at2[1], four),
        ),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16::<4>(v), three),
            _mm256_and_si256(at2[2], four),
        ),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16::<6>(v), three),
            _mm256_and_si256(at2[3], four),
        ),
    ]
}

/// IQ4_XS value groups `8g + t` and `8g + 4 + t` (values `32g + 4t..` and `32g + 16 + 4t..`, for
/// `g` < 8, `t` < 4) of all eight rows of the tile block at `p`: the low and high nibbles of
/// `qs` group `4g + t` index ggml's levels (`kvalues_iq4nl`). With VNNI ([`vnni`]) as the
/// unsigned `vpdpbusd` operand, each level plus 128 (`dot` takes the 128 off through the
/// activations' sums); else signed, for `maddubs` under the sign trick.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq4xs_groups<const V: u8>(p: *const u8, g: usize, t: usize) -> [__m256i; 2] {
    let mut table = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i));
    if vnni(IQ4_XS, V, false) {
        // level + 128 in an unsigned byte: its top bit flipped.
        table = _mm256_xor_si256(table, _mm256_set1_epi8(-128));
    }
    let [lo, hi] = nibble_halves(load(p.add(IQ4_QS + 32 * (4 * g + t))));
    [_mm256_shuffle_epi8(table, lo), _mm256_shuffle_epi8(table, hi)]
}

/// The value groups of Q2_K, Q3_K or TQ2_0 (see [`q2k_groups`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn low_groups<const K: u8>(p: *const u8, n: usize, m: usize) -> [__m256i; 4] {
    match K {
        Q2_K => q2k_groups(p, n, m),
        Q3_K => q3k_groups(p, n, m),
        _ => two_bit_groups(p.add(TQ2_QS), n, m),
    }
}

/// One tile unpacked for batches: `u[64b + g]` is value group `g` of block `b` (values
/// `4g..4g + 4` of all eight rows), `scales[b]` its factors.
struct Unpacked {
    u: Vec<__m256i>,
    scales: Vec<Scales>,
}

impl Unpacked {
    /// For the decode path, which reads the tile in place: nothing to build per call.
    const EMPTY: Unpacked = Unpacked {
        u: Vec::new(),
        scales: Vec::new(),
    };
}

/// The 64 value groups of the tile block at `p`, each handed to `put(g, values)`: group `g` is
/// values `4g..4g + 4` of all eight rows (the order of [`Unpacked`]).
#[inline(always)]
unsafe fn block_groups<const K: u8, const V: u8>(p: *const u8, mut put: impl FnMut(usize, __m256i)) {
    if K == IQ4_XS {
        for g in 0..8 {
            for t in 0..4 {
                let [lo, hi] = iq4xs_groups::<V>(p, g, t);
                put(8 * g + t, lo);
                put(8 * g + 4 + t, hi);
            }
        }
    } else if K == Q4_K || K == Q5_K {
        for j in 0..4 {
            for r in 0..8 {
                let [lo, hi] = if K == Q4_K {
                    q4k_groups(p, j, r)
                } else {
                    q5k_groups(p, j, r)
                };
                put(16 * j + r, lo);
                put(16 * j + 8 + r, hi);
            }
        }
    } else if K == Q2_K || K == Q3_K || K == TQ2_0 {
        for n in 0..2 {
            for m in 0..8 {
                for (j, v) in low_groups::<K>(p, n, m).into_iter().enumerate() {
                    put(32 * n + 8 * j + m, v);
                }
            }
        }
    } else {
        for n in 0..2 {
            for l in 0..8 {
                for (k, v) in q6k_groups(p, n, l).into_iter().enumerate() {
                    put(32 * n + 8 * k + l, v);
                }
            }
        }
    }
}

/// Unpack the tile at `tile` (`nb` super-blocks) into `out`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack<const K: u8, const V: u8>(tile: *const u8, nb: usize, out: &mut Unpacked) {
    out.u.clear();
    out.scales.clear();
    for b in 0..nb {
        let p = tile.add(b * R * block_bytes(K));
        let u = out.u.len();
        out.u.resize(u + 64, _mm256_setzero_si256());
        let u = &mut out.u[u..];
        block_groups::<K, V>(p, |g, v| u[g] = v);
        out.scales.push(scales::<K, V, true>(p));
    }
}

/// Outputs `(w0..w0 + nr) × (a0..a0 + CC)` of one tile: lane `i` of an accumulator is weight
/// row `i`. With `BUF` the values and factors come from `x`, the unpacked tile, otherwise they
/// are unpacked from the interleaved bytes at `tile` block by block (`x` unused). `V`: the
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
    let a = act.bytes.as_ptr().add(a0 * act.row_bytes);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); CC];
    let prefetch = !BUF && prefetch_pays();
    for b in 0..nb {
        let p = tile.add(b * R * block_bytes(K));
        if prefetch {
            // As in `dot_legacy`: the weights stream from memory once per decode step.
            super::lanes::prefetch_lines::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD), R * block_bytes(K));
        }
        let own;
        let s = if BUF {
            &x.scales[b]
        } else {
            own = scales::<K, V, BUF>(p);
            &own
        };
        // Activation row c of this super-block.
        macro_rules! blk {
            ($c:expr) => {
                a.add($c * act.row_bytes + b * ACT_BLOCK)
            };
        }
        // Values 4g..4g+4 of activation row c, in every lane (macros rather than closures:
        // closures would not inherit the target features).
        macro_rules! y {
            ($c:expr, $g:expr) => {
                _mm256_set1_epi32(std::ptr::read_unaligned(
                    blk!($c).add(ACT_VALUES + 4 * $g) as *const i32
                ))
            };
        }
        // Value group g from the buffer.
        macro_rules! buf {
            ($g:expr) => {
                *x.u.as_ptr().add(64 * b + $g)
            };
        }
        let mut isum = [_mm256_setzero_si256(); CC];
        if K == IQ4_XS {
            // Sub-block g (one scale) is value groups 8g..8g + 8: qs groups 4g + t, t < 4, hold
            // groups 8g + t (low nibbles) and 8g + 4 + t (high), which go in two chains.
            for g in 0..8 {
                let mut hs = [_mm256_setzero_si256(); CC];
                let mut odd = [_mm256_setzero_si256(); CC];
                for t in 0..4 {
                    let (g0, g1) = (8 * g + t, 8 * g + 4 + t);
                    let [lo, hi] = if BUF {
                        [buf!(g0), buf!(g1)]
                    } else {
                        iq4xs_groups::<V>(p, g, t)
                    };
                    for c in 0..CC {
                        if vnni(K, V, BUF) {
                            hs[c] = dpbusd::<V>(hs[c], lo, y!(c, g0));
                            odd[c] = dpbusd::<V>(odd[c], hi, y!(c, g1));
                        } else {
                            // |level| <= 127 and |q8| <= 127: a pair's sum fits an i16, two
                            // pairs' may not, so each group meets the scale on its own.
                            for (u, gi) in [(lo, g0), (hi, g1)] {
                                let prod = _mm256_maddubs_epi16(_mm256_sign_epi8(u, u), _mm256_sign_epi8(y!(c, gi), u));
                                isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(prod, s.sc[g]));
                            }
                        }
                    }
                }
                if vnni(K, V, BUF) {
                    for c in 0..CC {
                        let s32 = _mm256_add_epi32(hs[c], odd[c]);
                        isum[c] = _mm256_add_epi32(isum[c], _mm256_mullo_epi32(s32, s.sc[g]));
                    }
                }
            }
        } else if K == Q4_K || K == Q5_K {
            // Values below 16: eight i16 pair sums stay below 8 · 2 · 15 · 128 < 2^15; Q5_K's
            // below 32, so without VNNI its first four meet the scale on their own (4 · 2 · 31 ·
            // 128 < 2^15). Sub-block 2j + h is value groups 16j + 8h + r, r < 8.
            for j in 0..4 {
                for h in 0..2 {
                    let mut hs = [_mm256_setzero_si256(); CC];
                    // VNNI with one or two rows: odd groups in a second chain (see `dot_legacy`).
                    let mut odd = [_mm256_setzero_si256(); CC];
                    for r in 0..8 {
                        let g = 16 * j + 8 * h + r;
                        let u = if BUF {
                            buf!(g)
                        } else if K == Q4_K {
                            q4k_groups(p, j, r)[h]
                        } else {
                            q5k_groups(p, j, r)[h]
                        };
                        for c in 0..CC {
                            if !vnni(K, V, BUF) {
                                hs[c] = _mm256_add_epi16(hs[c], _mm256_maddubs_epi16(u, y!(c, g)));
                            } else if CC <= 2 && r % 2 == 1 {
                                odd[c] = dpbusd::<V>(odd[c], u, y!(c, g));
                            } else {
                                hs[c] = dpbusd::<V>(hs[c], u, y!(c, g));
                            }
                        }
                        if K == Q5_K && !vnni(K, V, BUF) && r == 3 {
                            for c in 0..CC {
                                isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(hs[c], s.sc[2 * j + h]));
                                hs[c] = _mm256_setzero_si256();
                            }
                        }
                    }
                    if vnni(K, V, BUF) && CC <= 2 {
                        for c in 0..CC {
                            hs[c] = _mm256_add_epi32(hs[c], odd[c]);
                        }
                    }
                    for c in 0..CC {
                        let sc = s.sc[2 * j + h];
                        let prod = if vnni(K, V, BUF) {
                            _mm256_mullo_epi32(hs[c], sc)
                        } else {
                            _mm256_madd_epi16(hs[c], sc)
                        };
                        isum[c] = _mm256_add_epi32(isum[c], prod);
                    }
                }
            }
        } else if K == Q2_K || K == Q3_K || K == TQ2_0 {
            // Values below 8: four i16 pair sums stay below 4 · 2 · 7 · 128 < 2^15. Sub-block
            // t = 8n + 2j + h is value groups 32n + 8j + m, m = 4h..4h + 4, which the four
            // `qs` groups 8n + m hold in their bits 2j, 2j + 1.
            for n in 0..2 {
                for h in 0..2 {
                    let mut q = [[_mm256_setzero_si256(); 4]; 4];
                    if !BUF {
                        for i in 0..4 {
                            q[i] = low_groups::<K>(p, n, 4 * h + i);
                        }
                    }
                    for j in 0..4 {
                        let mut hs = [_mm256_setzero_si256(); CC];
                        // VNNI with one or two rows: odd groups in a second chain.
                        let mut odd = [_mm256_setzero_si256(); CC];
                        for i in 0..4 {
                            let g = 32 * n + 8 * j + 4 * h + i;
                            let u = if BUF { buf!(g) } else { q[i][j] };
                            for c in 0..CC {
                                if !vnni(K, V, BUF) {
                                    hs[c] = _mm256_add_epi16(hs[c], _mm256_maddubs_epi16(u, y!(c, g)));
                                } else if CC <= 2 && i % 2 == 1 {
                                    odd[c] = dpbusd::<V>(odd[c], u, y!(c, g));
                                } else {
                                    hs[c] = dpbusd::<V>(hs[c], u, y!(c, g));
                                }
                            }
                        }
                        for c in 0..CC {
                            let sc = s.sc[8 * n + 2 * j + h];
                            let prod = if vnni(K, V, BUF) {
                                if CC <= 2 {
                                    hs[c] = _mm256_add_epi32(hs[c], odd[c]);
                                }
                                _mm256_mullo_epi32(hs[c], sc)
                            } else {
                                _mm256_madd_epi16(hs[c], sc)
                            };
                            isum[c] = _mm256_add_epi32(isum[c], prod);
                        }
                    }
                }
            }
        } else if vnni(K, V, BUF) {
            // Sub-block t = 8n + 2q + h: positions l = 4h..4h + 4 of quarter q, value groups
            // 32n + 8q + l, one at a time (as many mask and shift ops per group as four at a
            // time, only more loads). With one or two rows, odd positions in a second chain.
            for n in 0..2 {
                for q in 0..4 {
                    for h in 0..2 {
                        let mut s32 = [_mm256_setzero_si256(); CC];
                        let mut odd = [_mm256_setzero_si256(); CC];
                        for l in 4 * h..4 * h + 4 {
                            let g = 32 * n + 8 * q + l;
                            let u = if BUF { buf!(g) } else { q6k_group(p, n, l, q) };
                            for c in 0..CC {
                                if CC <= 2 && l % 2 == 1 {
                                    odd[c] = dpbusd::<V>(odd[c], u, y!(c, g));
                                } else {
                                    s32[c] = dpbusd::<V>(s32[c], u, y!(c, g));
                                }
                            }
                        }
                        for c in 0..CC {
                            if CC <= 2 {
                                s32[c] = _mm256_add_epi32(s32[c], odd[c]);
                            }
                            let prod = _mm256_mullo_epi32(s32[c], s.sc[8 * n + 2 * q + h]);
                            isum[c] = _mm256_add_epi32(isum[c], prod);
                        }
                    }
                }
            }
        } else {
            // Values below 64: two i16 pair sums stay below 2 · 2 · 63 · 128 < 2^15. Value groups
            // g, g + 1 (positions l, l + 1 of quarter q) share sub-block g / 4.
            for n in 0..2 {
                for l in (0..8).step_by(2) {
                    let (u0, u1) = if BUF {
                        let g = |q: usize| 32 * n + 8 * q + l;
                        (
                            [buf!(g(0)), buf!(g(1)), buf!(g(2)), buf!(g(3))],
                            [buf!(g(0) + 1), buf!(g(1) + 1), buf!(g(2) + 1), buf!(g(3) + 1)],
                        )
                    } else {
                        (q6k_groups(p, n, l), q6k_groups(p, n, l + 1))
                    };
                    for q in 0..4 {
                        let g = 32 * n + 8 * q + l;
                        for c in 0..CC {
                            let h = _mm256_add_epi16(
                                _mm256_maddubs_epi16(u0[q], y!(c, g)),
                                _mm256_maddubs_epi16(u1[q], y!(c, g + 1)),
                            );
                            let prod = _mm256_madd_epi16(h, s.sc[g / 4]);
                            isum[c] = _mm256_add_epi32(isum[c], prod);
                        }
                    }
                }
            }
        }
        for c in 0..CC {
            let y = blk!(c);
            let dy = _mm256_set1_ps(std::ptr::read_unaligned(y as *const f32));
            let bsums = y.add(ACT_BSUMS);
            let mut psum = _mm256_setzero_si256();
            if K == Q4_K || K == Q5_K || (K == IQ4_XS && vnni(K, V, BUF)) {
                // The sums over each 32 values (|sum| <= 32 · 128 fits an i16), as i16 pairs
                // per 32-bit lane: (0, 1), (2, 3) in lanes 0, 1 and (4, 5), (6, 7) in lanes 4, 5.
                let s32 = _mm256_madd_epi16(load(bsums), ones);
                let s16 = _mm256_packs_epi32(s32, s32);
                for (j, lane) in [0, 1, 4, 5].into_iter().enumerate() {
                    let pair = _mm256_permutevar8x32_epi32(s16, _mm256_set1_epi32(lane));
                    psum = _mm256_add_epi32(psum, _mm256_madd_epi16(s.pair[j], pair));
                }
                if K == IQ4_XS {
                    // The levels met the activations as level + 128.
                    isum[c] = _mm256_sub_epi32(isum[c], _mm256_slli_epi32::<7>(psum));
                }
            } else if K != IQ4_XS {
                for j in 0..8 {
                    let pair = _mm256_set1_epi32(std::ptr::read_unaligned(bsums.add(4 * j) as *const i32));
                    psum = _mm256_add_epi32(psum, _mm256_madd_epi16(s.pair[j], pair));
                }
                if K == Q6_K {
                    isum[c] = _mm256_sub_epi32(isum[c], _mm256_slli_epi32::<5>(psum));
                } else if K == Q3_K {
                    isum[c] = _mm256_sub_epi32(isum[c], _mm256_slli_epi32::<2>(psum));
                } else if K == TQ2_0 {
                    isum[c] = _mm256_sub_epi32(isum[c], psum);
                }
            }
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[c]), _mm256_mul_ps(s.d, dy), acc[c]);
            if K == Q4_K || K == Q5_K || K == Q2_K {
                acc[c] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(psum), _mm256_mul_ps(s.dmin, dy), acc[c]);
            }
        }
    }
    for c in 0..CC {
        store_lanes(acc[c], nr, w0, a0 + c, out);
    }
}

/// Batches of at least this many activation rows unpack each tile into [`Unpacked`] first;
/// smaller ones unpack it block by block for every group of up to four rows. Measured with
/// `cargo bench --bench kernels` (4096², 2 threads, GB/s of weights, direct against buffered):
/// Q4_K, whose unpacking is a mask or a shift, 16.5 / 13.2 at 8 rows, 8.5 / 8.5 at 16, 4.2 / 4.8
/// at 32; Q6_K, which merges two bit fields per value, 17.0 / 17.7 at 8 rows and 4.7 / 6.3 at 32.
/// Q5_K merges two fields too.
const fn unpack_min_rows(kind: u8) -> usize {
    if kind == Q6_K || kind == Q5_K {
        8
    } else {
        16
    }
}

/// Batches on [`super::lanes::Isa::Avx512`]: two tiles side by side in 512-bit vectors
/// ([`super::wide`]), each unpacked as for the 256-bit kernels.
#[inline(always)]
unsafe fn wide_tiles<const K: u8>(nb: usize, nw: usize, weights: &[u8], act: &Activations, out: &mut TileOut<'_>) {
    let tb = nb * R * block_bytes(K);
    // blocks: [nb] the sixteen rows' super-blocks.
    let mut blocks = wide::Blocks::take(nb);
    let mut w0 = 0;
    while w0 < nw {
        let nr = (nw - w0).min(WIDE_ROWS);
        for h in 0..2 {
            let tile = weights.as_ptr().add((w0 / R + h) * tb);
            for (b, x) in blocks.iter_mut().enumerate() {
                if h * R >= nr {
                    x.zero_half(h);
                    continue;
                }
                let p = tile.add(b * R * block_bytes(K));
                block_groups::<K, AVX512>(p, |g, v| x.u[g][h] = v);
                widen::<K>(&scales::<K, AVX512, true>(p), h, x);
            }
        }
        for_row_groups!(wide act.rows, |a0, CC| match K {
            Q4_K | Q5_K => wide::dot::<8, 0, true, false, CC>(&blocks, act, w0, nr, a0, out),
            // The levels as level + 128 (see `dot`).
            IQ4_XS => wide::dot::<8, 7, false, false, CC>(&blocks, act, w0, nr, a0, out),
            Q2_K => wide::dot::<4, 0, true, false, CC>(&blocks, act, w0, nr, a0, out),
            Q6_K => wide::dot::<4, 5, false, false, CC>(&blocks, act, w0, nr, a0, out),
            Q3_K => wide::dot::<4, 2, false, false, CC>(&blocks, act, w0, nr, a0, out),
            // TQ2_0: one scale per super-block, sub-block scales of 1.
            _ => wide::dot::<64, 0, false, false, CC>(&blocks, act, w0, nr, a0, out),
        });
        w0 += nr;
    }
}

/// The factors of half `h` (rows `8h..8h + 8`) of `x` from those of a tile block, `s`. The
/// sub-blocks and pairs are those [`wide_tiles`] names: Q4_K's (and Q5_K's) eight sub-blocks of 32, its
/// minimums paired with themselves to meet the 16-value sums (the 256-bit kernel pairs them
/// with 32-value sums: the same integer); TQ2_0's one sub-block.
#[inline(always)]
unsafe fn widen<const K: u8>(s: &Scales, h: usize, x: &mut WideBlock) {
    for (sc, &v) in x.sc.iter_mut().zip(&s.sc) {
        sc[h] = v;
    }
    if K == Q4_K || K == Q5_K || K == IQ4_XS {
        for j in 0..4 {
            // (m_2j, m_2j+1) as i16 to (m_2j, m_2j) and (m_2j+1, m_2j+1) (IQ4_XS: scales).
            let p = s.pair[j];
            let hi = _mm256_srli_epi32::<16>(p);
            x.pair[2 * j][h] = i16_pairs(p, p);
            x.pair[2 * j + 1][h] = i16_pairs(hi, hi);
        }
    } else {
        for (pair, &v) in x.pair.iter_mut().zip(&s.pair) {
            pair[h] = v;
        }
    }
    x.d[h] = s.d;
    x.dmin[h] = s.dmin;
}

/// Batches from which [`wide_tiles`] takes over on [`super::lanes::Isa::Avx512`]: those that
/// unpack their tiles anyway.
const fn wide_min_rows(kind: u8) -> usize {
    unpack_min_rows(kind)
}

interleaved_driver!();

/// The entry point for weights of `ty` with the dot products of `isa`, if this module covers
/// `ty` (see [`super::tile`], which checked the lengths).
pub(super) fn kernel(ty: GgmlType, isa: super::lanes::Isa) -> Option<super::lanes::RunFn> {
    Some(match ty {
        GgmlType::Q4_K => entry::<Q4_K>(isa),
        GgmlType::Q5_K => entry::<Q5_K>(isa),
        GgmlType::Q6_K => entry::<Q6_K>(isa),
        GgmlType::Q2_K => entry::<Q2_K>(isa),
        GgmlType::Q3_K => entry::<Q3_K>(isa),
        GgmlType::TQ2_0 => entry::<TQ2_0>(isa),
        GgmlType::IQ4_XS => entry::<IQ4_XS>(isa),
        _ => return None,
    })
}
