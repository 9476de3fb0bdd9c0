//! The 256-value formats (Q4_K, Q5_K, Q6_K, IQ4_XS) against Q8_K activations.
//!
//! Per super-block pair, all integer: each 32 values go through `maddubs`, then `madd` with the
//! sub-block scale (two scales per 32 for Q6_K's 16-value sub-blocks) into eight i32 lanes. The
//! minimum of Q4_K/Q5_K and Q6_K's offset of -32 come from the activations' 16-value sums
//! (`bsums`) in one `madd`. The super-block total is converted once and scaled by `d_w · d_a`
//! (and `dmin_w · d_a` for the minimum), as ggml's `vec_dot_q*_K_q8_K`.

use std::arch::x86_64::*;

use super::super::kernels::{Activations, TileOut};
use super::dot_legacy::{nibbles, KVALUES_IQ4NL};
use super::{for_tiles, hsum_ps, load_f16, store_lanes, transpose_sum, LANE_ROWS};
use crate::quant::GgmlType;

const Q4_K: u8 = 0;
const Q5_K: u8 = 1;
const Q6_K: u8 = 2;
const IQ4_XS: u8 = 3;

/// Bytes of one Q8_K block: f32 scale, 256 values, 16 i16 sums.
const ACT_BLOCK: usize = 292;
const R: usize = 4;
const C: usize = 3;

const fn block_bytes(kind: u8) -> usize {
    match kind {
        Q4_K => 144,
        Q5_K => 176,
        Q6_K => 210,
        _ => 136,
    }
}

/// `shuffle_epi8` masks putting byte `s` of a 16-byte table into every i16 lane, zero-extended
/// (`[s, 0x80]` repeated; 0x80 selects zero).
const fn zext_masks() -> [[i8; 32]; 16] {
    let mut m = [[0i8; 32]; 16];
    let mut s = 0;
    while s < 16 {
        let mut i = 0;
        while i < 16 {
            m[s][2 * i] = s as i8;
            m[s][2 * i + 1] = -128;
            i += 1;
        }
        s += 1;
    }
    m
}
static ZEXT: [[i8; 32]; 16] = zext_masks();

/// Masks putting byte `2t` of a 16-byte table into the high byte of i16 lanes 0..8 and byte
/// `2t + 1` into lanes 8..16 (low bytes zero): an arithmetic shift by 8 then sign-extends them.
const fn pair_masks() -> [[i8; 32]; 8] {
    let mut m = [[0i8; 32]; 8];
    let mut t = 0;
    while t < 8 {
        let mut i = 0;
        while i < 16 {
            m[t][2 * i] = -128;
            m[t][2 * i + 1] = (2 * t + i / 8) as i8;
            i += 1;
        }
        t += 1;
    }
    m
}
static PAIRS: [[i8; 32]; 8] = pair_masks();

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mask(m: &[i8; 32]) -> __m256i {
    _mm256_loadu_si256(m.as_ptr() as *const __m256i)
}

/// What a weight super-block contributes before meeting any activation row.
#[derive(Clone, Copy)]
struct Header {
    d: f32,
    dmin: f32,
    /// Q4_K/Q5_K: bytes 0..8 scales, 8..16 mins; Q6_K: the 16 signed scales; in both lanes.
    scales: __m256i,
    /// Q4_K/Q5_K: the mins as i16, each twice (one per 16-value `bsums` entry); Q6_K: the 16
    /// scales as i16.
    per16: __m256i,
    /// IQ4_XS: the eight 6-bit scales minus 32.
    ls: [i16; 8],
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn header<const K: u8>(p: *const u8) -> Header {
    let zero = _mm256_setzero_si256();
    match K {
        Q4_K | Q5_K => {
            // Eight 6-bit scales and mins (see `quant::kquant::scale_min_k4`): the first four of
            // each are the low 6 bits of bytes 0..4 / 4..8; the last four take 4 bits from bytes
            // 8..12 and their top 2 bits from the spare top bits of bytes 0..8.
            let u0 = std::ptr::read_unaligned(p.add(4) as *const u32);
            let u1 = std::ptr::read_unaligned(p.add(8) as *const u32);
            let u2 = std::ptr::read_unaligned(p.add(12) as *const u32);
            let sc_lo = u0 & 0x3f3f_3f3f;
            let m_lo = u1 & 0x3f3f_3f3f;
            let sc_hi = (u2 & 0x0f0f_0f0f) | (((u0 >> 6) & 0x0303_0303) << 4);
            let m_hi = ((u2 >> 4) & 0x0f0f_0f0f) | (((u1 >> 6) & 0x0303_0303) << 4);
            let v = _mm_setr_epi32(sc_lo as i32, sc_hi as i32, m_lo as i32, m_hi as i32);
            let mins = _mm_srli_si128(v, 8);
            Header {
                d: load_f16(p),
                dmin: load_f16(p.add(2)),
                scales: _mm256_broadcastsi128_si256(v),
                per16: _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mins, mins)),
                ls: [0; 8],
            }
        }
        Q6_K => {
            let sc = _mm_loadu_si128(p.add(192) as *const __m128i);
            Header {
                d: load_f16(p.add(208)),
                dmin: 0.0,
                scales: _mm256_broadcastsi128_si256(sc),
                per16: _mm256_cvtepi8_epi16(sc),
                ls: [0; 8],
            }
        }
        _ => {
            let sh = u32::from(std::ptr::read_unaligned(p.add(2) as *const u16));
            let mut ls = [0i16; 8];
            for (ib, l) in ls.iter_mut().enumerate() {
                let lo = u32::from(*p.add(4 + ib / 2) >> (4 * (ib % 2))) & 0xf;
                let hi = (sh >> (2 * ib)) & 3;
                *l = (lo | (hi << 4)) as i16 - 32;
            }
            Header {
                d: load_f16(p),
                dmin: 0.0,
                scales: zero,
                per16: zero,
                ls,
            }
        }
    }
}

/// The weighted integer sums of one weight super-block with the super-blocks of `CC`
/// activation rows (`q8[c]`: the values, then the 16 sums): `(Σ sc·Σq·q8, Σ m·bsum)` in i32
/// lanes per row. The weights are unpacked once for all rows; each row's sum goes through the
/// same operations whatever `CC`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn body<const K: u8, const CC: usize>(
    p: *const u8,
    h: &Header,
    q8: [*const u8; CC],
) -> ([__m256i; CC], [__m256i; CC]) {
    // Closures would not inherit the target features; a macro keeps the loads inline.
    macro_rules! ld {
        ($c:expr, $o:expr) => {
            _mm256_loadu_si256(q8[$c].add($o) as *const __m256i)
        };
    }
    let low4 = _mm256_set1_epi8(0x0F);
    let mut isum = [_mm256_setzero_si256(); CC];
    let mut msum = [_mm256_setzero_si256(); CC];
    match K {
        Q4_K | Q5_K => {
            let qs = p.add(if K == Q4_K { 16 } else { 48 });
            let mut qh = _mm256_loadu_si256(p.add(16) as *const __m256i);
            for j in 0..4 {
                let q = _mm256_loadu_si256(qs.add(32 * j) as *const __m256i);
                let mut lo = _mm256_and_si256(q, low4);
                let mut hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
                if K == Q5_K {
                    // Bit 2j of qh[l] is the fifth bit of value 64j + l, bit 2j + 1 of 64j + 32 + l.
                    let one = _mm256_set1_epi8(1);
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(qh, one), 4));
                    hi = _mm256_or_si256(
                        hi,
                        _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_add_epi8(one, one)), 3),
                    );
                    qh = _mm256_srli_epi16(qh, 2);
                }
                let s0 = _mm256_shuffle_epi8(h.scales, mask(&ZEXT[2 * j]));
                let s1 = _mm256_shuffle_epi8(h.scales, mask(&ZEXT[2 * j + 1]));
                for c in 0..CC {
                    let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, ld!(c, 64 * j)), s0);
                    let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, ld!(c, 64 * j + 32)), s1);
                    isum[c] = _mm256_add_epi32(isum[c], _mm256_add_epi32(p0, p1));
                }
            }
            for c in 0..CC {
                msum[c] = _mm256_madd_epi16(h.per16, ld!(c, 256));
            }
        }
        Q6_K => {
            // Values are q - 32: Σ sc·Σ(q-32)·q8 = Σ sc·Σq·q8 - 32·Σ sc·bsum.
            for c in 0..CC {
                isum[c] = _mm256_sub_epi32(isum[c], _mm256_slli_epi32(_mm256_madd_epi16(h.per16, ld!(c, 256)), 5));
            }
            for n in 0..2 {
                for (g, &qg) in q6k_half(p, n).iter().enumerate() {
                    let t = 4 * n + g;
                    let sc = _mm256_srai_epi16(_mm256_shuffle_epi8(h.scales, mask(&PAIRS[t])), 8);
                    for c in 0..CC {
                        let prod = _mm256_maddubs_epi16(qg, ld!(c, 32 * t));
                        isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(prod, sc));
                    }
                }
            }
        }
        _ => {
            let lut = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i));
            for ib in 0..8 {
                let w = _mm256_shuffle_epi8(lut, nibbles(p.add(8 + 16 * ib)));
                let wabs = _mm256_sign_epi8(w, w);
                let ls = _mm256_set1_epi16(h.ls[ib]);
                for c in 0..CC {
                    let prod = _mm256_maddubs_epi16(wabs, _mm256_sign_epi8(ld!(c, 32 * ib), w));
                    isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(prod, ls));
                }
            }
        }
    }
    (isum, msum)
}

/// Outputs `(w0..w0+RR) × (a0..a0+CC)` of `out`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kernel<const K: u8, const RR: usize, const CC: usize>(
    nb: usize,
    weights: &[u8],
    act: &Activations,
    w0: usize,
    a0: usize,
    out: &mut TileOut<'_>,
) {
    let wb = block_bytes(K);
    let rb = nb * wb;
    let w = weights.as_ptr().add(w0 * rb);
    let a = act.bytes.as_ptr().add(a0 * act.row_bytes);
    let mut acc = [[_mm256_setzero_ps(); CC]; RR];
    for b in 0..nb {
        for r in 0..RR {
            let p = w.add(r * rb + b * wb);
            // As in `dot_legacy`: fetch the same super-block of the next tile of rows.
            let ahead = w.wrapping_add((RR + r) * rb + b * wb);
            for line in (0..wb).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line) as *const i8);
            }
            let h = header::<K>(p);
            for c in 0..CC {
                let y = a.add(c * act.row_bytes + b * ACT_BLOCK);
                let dy = std::ptr::read_unaligned(y as *const f32);
                let ([isum], [msum]) = body::<K, 1>(p, &h, [y.add(4)]);
                let mut v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(h.d * dy), acc[r][c]);
                if matches!(K, Q4_K | Q5_K) {
                    v = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_set1_ps(h.dmin * dy), v);
                }
                acc[r][c] = v;
            }
        }
    }
    for r in 0..RR {
        for c in 0..CC {
            out.set(a0 + c, w0 + r, hsum_ps(acc[r][c]));
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run<const K: u8>(k: usize, weights: &[u8], act: &Activations, out: &mut TileOut<'_>) {
    let nb = k / 256;
    let nw = weights.len() / (nb * block_bytes(K));
    if matches!(K, Q4_K | Q6_K) {
        return run_lanes::<K>(nb, nw, weights, act, out);
    }
    for_tiles::<R, C>(nw, act.rows, |w0, a0, r, c| match (r, c) {
        (R, C) => kernel::<K, R, C>(nb, weights, act, w0, a0, out),
        (R, _) => kernel::<K, R, 1>(nb, weights, act, w0, a0, out),
        (_, C) => kernel::<K, 1, C>(nb, weights, act, w0, a0, out),
        _ => kernel::<K, 1, 1>(nb, weights, act, w0, a0, out),
    });
}

// Q4_K and Q6_K, the k-quants of the common Q4_K_M mixes, have lane-per-row kernels like the
// 32-value formats (see `dot_legacy`): eight weight rows per tile, one i32/f32 lane each. Per
// output and super-block the arithmetic is fixed whatever the path: the exact integer sums
// `Σ sc·Σq·q8` (less `32·Σ sc·bsum` for Q6_K) and, for Q4_K, `Σ m·bsum`, converted once, then
// `acc = fma(isum, d_w·d_a, acc)` and `acc = fnmadd(msum, dmin_w·d_a, acc)`.

/// A tile of eight weight rows unpacked and interleaved, per super-block `b`:
/// * `u[(64b + g) * 8 + i]`: values `4g..4g + 4` of row `i`, unsigned (Q6_K without its -32);
/// * `sc[(S·b + j) * 8 + i]`: the scale of sub-block `j` of row `i` as two equal i16 (`S` = 8
///   sub-blocks of 32 for Q4_K, 16 of 16 for Q6_K), the `madd` operand of the values' sums;
/// * `pair[(P·b + j) * 8 + i]`: Q4_K: mins `2j`, `2j + 1` as i16 (`P` = 4); Q6_K: scales `2j`,
///   `2j + 1` (`P` = 8), to meet pairs of activation sums in one `madd`;
/// * `d`, `dmin` per `8b + i`.
///
/// Rows past the end of the tile are zero.
struct Packed {
    u: Vec<u32>,
    sc: Vec<u32>,
    pair: Vec<u32>,
    d: Vec<f32>,
    dmin: Vec<f32>,
}

/// Sub-blocks with their own scale, and scale or min pairs, per super-block.
const fn sub_blocks(kind: u8) -> usize {
    if kind == Q6_K {
        16
    } else {
        8
    }
}

const fn pairs(kind: u8) -> usize {
    sub_blocks(kind) / 2
}

/// Two i16 in one u32, `lo` first.
fn i16_pair(lo: i16, hi: i16) -> u32 {
    u32::from(lo as u16) | (u32::from(hi as u16) << 16)
}

impl Packed {
    /// For the direct path, which reads the file layout in place: nothing to build per call.
    const EMPTY: Packed = Packed {
        u: Vec::new(),
        sc: Vec::new(),
        pair: Vec::new(),
        d: Vec::new(),
        dmin: Vec::new(),
    };

    fn new(nb: usize, kind: u8) -> Self {
        const L: usize = LANE_ROWS;
        Packed {
            u: vec![0; nb * 64 * L],
            sc: vec![0; nb * sub_blocks(kind) * L],
            pair: vec![0; nb * pairs(kind) * L],
            d: vec![0.0; nb * L],
            dmin: vec![0.0; nb * L],
        }
    }
}

/// The 256 values of a super-block as unsigned bytes in order (Q6_K: `q`, not `q - 32`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn values<const K: u8>(p: *const u8, out: &mut [u8; 256]) {
    let low4 = _mm256_set1_epi8(0x0F);
    let o = out.as_mut_ptr() as *mut __m256i;
    if K == Q4_K {
        for j in 0..4 {
            let q = _mm256_loadu_si256(p.add(16 + 32 * j) as *const __m256i);
            _mm256_storeu_si256(o.add(2 * j), _mm256_and_si256(q, low4));
            _mm256_storeu_si256(o.add(2 * j + 1), _mm256_and_si256(_mm256_srli_epi16(q, 4), low4));
        }
    } else {
        for n in 0..2 {
            for (g, v) in q6k_half(p, n).into_iter().enumerate() {
                _mm256_storeu_si256(o.add(4 * n + g), v);
            }
        }
    }
}

/// Values `128n..128n + 128` of a Q6_K super-block at `p`, unsigned (`q`, not `q - 32`), as
/// four vectors of 32 in order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k_half(p: *const u8, n: usize) -> [__m256i; 4] {
    let low4 = _mm256_set1_epi8(0x0F);
    let three = _mm256_set1_epi8(3);
    let ql0 = _mm256_loadu_si256(p.add(64 * n) as *const __m256i);
    let ql1 = _mm256_loadu_si256(p.add(64 * n + 32) as *const __m256i);
    let qh = _mm256_loadu_si256(p.add(128 + 32 * n) as *const __m256i);
    // Bits 2g..2g+2 of qh are the top bits of group g (shifted into place as 4..6).
    let h0 = _mm256_slli_epi16(_mm256_and_si256(qh, three), 4);
    let h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), three), 4);
    let h2 = _mm256_and_si256(qh, _mm256_slli_epi16(three, 4));
    let h3 = _mm256_and_si256(_mm256_srli_epi16(qh, 2), _mm256_slli_epi16(three, 4));
    [
        _mm256_or_si256(_mm256_and_si256(ql0, low4), h0),
        _mm256_or_si256(_mm256_and_si256(ql1, low4), h1),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4), h2),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4), h3),
    ]
}

/// Unpack rows `0..nr` of `w` (rows of `nb` super-blocks) into `p`; rows `nr..8` stay zero
/// (`p` is fresh or was filled from a tile at least as tall, as tiles only shrink at the end).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn repack<const K: u8>(w: &[u8], nr: usize, nb: usize, p: &mut Packed) {
    const L: usize = LANE_ROWS;
    let wb = block_bytes(K);
    let rb = nb * wb;
    let mut v = [0u8; 256];
    for i in 0..L {
        for b in 0..nb {
            if i >= nr {
                for g in 0..64 {
                    p.u[(64 * b + g) * L + i] = 0;
                }
                for j in 0..sub_blocks(K) {
                    p.sc[(sub_blocks(K) * b + j) * L + i] = 0;
                }
                for j in 0..pairs(K) {
                    p.pair[(pairs(K) * b + j) * L + i] = 0;
                }
                p.d[L * b + i] = 0.0;
                p.dmin[L * b + i] = 0.0;
                continue;
            }
            let q = w.as_ptr().add(i * rb + b * wb);
            values::<K>(q, &mut v);
            for g in 0..64 {
                p.u[(64 * b + g) * L + i] = u32::from_le_bytes([v[4 * g], v[4 * g + 1], v[4 * g + 2], v[4 * g + 3]]);
            }
            let h = header::<K>(q);
            let mut t = [0u8; 32];
            _mm256_storeu_si256(t.as_mut_ptr() as *mut __m256i, h.scales);
            if K == Q4_K {
                // Bytes 0..8: scales, 8..16: mins (6-bit, unsigned).
                for j in 0..8 {
                    let sc = i16::from(t[j]);
                    p.sc[(8 * b + j) * L + i] = i16_pair(sc, sc);
                }
                for j in 0..4 {
                    p.pair[(4 * b + j) * L + i] = i16_pair(i16::from(t[8 + 2 * j]), i16::from(t[9 + 2 * j]));
                }
                p.dmin[L * b + i] = h.dmin;
            } else {
                // The 16 signed scales.
                for j in 0..16 {
                    let sc = i16::from(t[j] as i8);
                    p.sc[(16 * b + j) * L + i] = i16_pair(sc, sc);
                }
                for j in 0..8 {
                    p.pair[(8 * b + j) * L + i] = i16_pair(i16::from(t[2 * j] as i8), i16::from(t[2 * j + 1] as i8));
                }
            }
            p.d[L * b + i] = h.d;
        }
    }
}

/// The batched path: outputs `(w0..w0+nr) × (a0..a0+CC)` from a repacked tile. Each group of
/// four activation bytes is broadcast and meets four values of all eight rows in one `maddubs`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gemm<const K: u8, const CC: usize>(
    nb: usize,
    p: &Packed,
    act: &Activations,
    w0: usize,
    nr: usize,
    a0: usize,
    out: &mut TileOut<'_>,
) {
    const L: usize = LANE_ROWS;
    let a = act.bytes.as_ptr().add(a0 * act.row_bytes);
    let mut acc = [_mm256_setzero_ps(); CC];
    for b in 0..nb {
        let mut isum = [_mm256_setzero_si256(); CC];
        // Activation row c of this super-block: f32 scale, 256 values, 16 i16 sums.
        macro_rules! blk {
            ($c:expr) => {
                a.add($c * act.row_bytes + b * ACT_BLOCK)
            };
        }
        // Values 4g..4g+4 of activation row c in every lane (a macro: closures would not
        // inherit the target features).
        macro_rules! y {
            ($c:expr, $g:expr) => {
                _mm256_set1_epi32(std::ptr::read_unaligned(blk!($c).add(4 + 4 * $g) as *const i32))
            };
        }
        macro_rules! u {
            ($g:expr) => {
                _mm256_loadu_si256(p.u.as_ptr().add((64 * b + $g) * L) as *const __m256i)
            };
        }
        if K == Q4_K {
            // Values below 16: eight i16 pair sums stay below 8 · 2 · 15 · 128 < 2^15.
            for j in 0..8 {
                let mut h = [_mm256_setzero_si256(); CC];
                for g in 8 * j..8 * j + 8 {
                    let u = u!(g);
                    for c in 0..CC {
                        h[c] = _mm256_add_epi16(h[c], _mm256_maddubs_epi16(u, y!(c, g)));
                    }
                }
                let sc = _mm256_loadu_si256(p.sc.as_ptr().add((8 * b + j) * L) as *const __m256i);
                for c in 0..CC {
                    isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(h[c], sc));
                }
            }
        } else {
            // Values below 64: two i16 pair sums stay below 2 · 2 · 63 · 127 < 2^15.
            for t in 0..16 {
                let sc = _mm256_loadu_si256(p.sc.as_ptr().add((16 * b + t) * L) as *const __m256i);
                for half in 0..2 {
                    let g = 4 * t + 2 * half;
                    let (u0, u1) = (u!(g), u!(g + 1));
                    for c in 0..CC {
                        let h = _mm256_add_epi16(
                            _mm256_maddubs_epi16(u0, y!(c, g)),
                            _mm256_maddubs_epi16(u1, y!(c, g + 1)),
                        );
                        isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(h, sc));
                    }
                }
            }
        }
        let d = _mm256_loadu_ps(p.d.as_ptr().add(L * b));
        let dmin = _mm256_loadu_ps(p.dmin.as_ptr().add(L * b));
        for c in 0..CC {
            let y = blk!(c);
            let dy = _mm256_set1_ps(std::ptr::read_unaligned(y as *const f32));
            let bsums = y.add(260) as *const i16;
            let mut psum = _mm256_setzero_si256();
            for j in 0..pairs(K) {
                let pair = if K == Q4_K {
                    // Sums over the 32 values of sub-blocks 2j and 2j + 1.
                    let s = |t: usize| {
                        std::ptr::read_unaligned(bsums.add(2 * t)) + std::ptr::read_unaligned(bsums.add(2 * t + 1))
                    };
                    i16_pair(s(2 * j), s(2 * j + 1))
                } else {
                    std::ptr::read_unaligned(bsums.add(2 * j) as *const u32)
                };
                psum = _mm256_add_epi32(
                    psum,
                    _mm256_madd_epi16(
                        _mm256_loadu_si256(p.pair.as_ptr().add((pairs(K) * b + j) * L) as *const __m256i),
                        _mm256_set1_epi32(pair as i32),
                    ),
                );
            }
            if K == Q6_K {
                isum[c] = _mm256_sub_epi32(isum[c], _mm256_slli_epi32(psum, 5));
            }
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[c]), _mm256_mul_ps(d, dy), acc[c]);
            if K == Q4_K {
                acc[c] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(psum), _mm256_mul_ps(dmin, dy), acc[c]);
            }
        }
    }
    for c in 0..CC {
        store_lanes(acc[c], nr, w0, a0 + c, out);
    }
}

/// The path for few activation rows (decode): weight rows `w0..w0+nr` (read from `w`) times
/// activation rows `a0..a0 + CC`, straight from the file layout with [`body`] (each weight
/// super-block unpacked once for the `CC` rows), the eight rows' sums then gathered into a lane
/// each; from there the arithmetic is [`gemm`]'s.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn direct<const K: u8, const CC: usize>(
    nb: usize,
    w: &[u8],
    nr: usize,
    act: &Activations,
    w0: usize,
    a0: usize,
    out: &mut TileOut<'_>,
) {
    const L: usize = LANE_ROWS;
    let wb = block_bytes(K);
    let rb = nb * wb;
    let wp = w.as_ptr();
    let y_row = act.bytes.as_ptr().add(a0 * act.row_bytes);
    let mut acc = [_mm256_setzero_ps(); CC];
    for b in 0..nb {
        let y: [*const u8; CC] = std::array::from_fn(|c| y_row.add(c * act.row_bytes + b * ACT_BLOCK));
        // Every entry is written below (zero past `nr`): left uninitialized here, because
        // zeroing these `2 · CC · 8` vectors per super-block compiled to a `memset` call that
        // cost a batched decode step about 1%.
        let mut isum = [[std::mem::MaybeUninit::<__m256i>::uninit(); L]; CC];
        let mut msum = [[std::mem::MaybeUninit::<__m256i>::uninit(); L]; CC];
        let mut d = [0f32; L];
        let mut dmin = [0f32; L];
        for r in 0..L {
            if r >= nr {
                for c in 0..CC {
                    isum[c][r].write(_mm256_setzero_si256());
                    msum[c][r].write(_mm256_setzero_si256());
                }
            } else {
                let q = wp.add(r * rb + b * wb);
                // Decode streams each weight once from memory: ask for the same super-block of
                // the next tile of rows, so enough lines are in flight.
                let ahead = wp.wrapping_add((L + r) * rb + b * wb);
                for line in (0..wb).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line) as *const i8);
                }
                let h = header::<K>(q);
                let (is, ms) = body::<K, CC>(q, &h, y.map(|p| p.add(4)));
                for c in 0..CC {
                    isum[c][r].write(is[c]);
                    msum[c][r].write(ms[c]);
                }
                d[r] = h.d;
                dmin[r] = h.dmin;
            }
        }
        for c in 0..CC {
            let dy = _mm256_set1_ps(std::ptr::read_unaligned(y[c] as *const f32));
            // SAFETY: every row `r < L` was written above.
            let is = transpose_sum(&isum[c].map(|v| v.assume_init()));
            acc[c] = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(is),
                _mm256_mul_ps(_mm256_loadu_ps(d.as_ptr()), dy),
                acc[c],
            );
            if K == Q4_K {
                // SAFETY: as for `isum`.
                let ms = transpose_sum(&msum[c].map(|v| v.assume_init()));
                acc[c] = _mm256_fnmadd_ps(
                    _mm256_cvtepi32_ps(ms),
                    _mm256_mul_ps(_mm256_loadu_ps(dmin.as_ptr()), dy),
                    acc[c],
                );
            }
        }
    }
    for c in 0..CC {
        store_lanes(acc[c], nr, w0, a0 + c, out);
    }
}

/// Batches of at least this many activation rows repack each tile of weight rows first. The
/// repack costs several passes of the direct path, so it pays only on long batches (one thread,
/// L2-resident weights, cycles per 256 weights against 4-row direct groups: at 8 rows Q4_K 212
/// against 108 and Q6_K 218 against 99; about even at 24; repacked 10% ahead at 32 for Q4_K,
/// even for Q6_K; 2.3x / 1.4x ahead at 128). Below it sit decode batches and short prompts.
const REPACK_MIN_ROWS: usize = 32;

/// The lane-per-row kernels' driver: each tile of [`LANE_ROWS`] weight rows (`nb` super-blocks
/// each, `nw` rows in all) meets every activation row, through the repacked path for batches of
/// at least [`REPACK_MIN_ROWS`] rows ([`repack`] once per tile, then [`gemm`] over register tiles
/// of up to four rows) or else [`direct`] over such groups.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_lanes<const K: u8>(nb: usize, nw: usize, weights: &[u8], act: &Activations, out: &mut TileOut<'_>) {
    let rb = nb * block_bytes(K);
    let batched = act.rows >= REPACK_MIN_ROWS;
    let mut packed = if batched { Packed::new(nb, K) } else { Packed::EMPTY };
    let mut w0 = 0;
    while w0 < nw {
        let nr = (nw - w0).min(LANE_ROWS);
        // The direct path prefetches past its tile, so it sees the rest of the weights.
        let w = &weights[w0 * rb..];
        if batched {
            repack::<K>(w, nr, nb, &mut packed);
            for_row_groups!(act.rows, |a0, CC| gemm::<K, CC>(nb, &packed, act, w0, nr, a0, out));
        } else {
            for_row_groups!(act.rows, |a0, CC| direct::<K, CC>(nb, w, nr, act, w0, a0, out));
        }
        w0 += nr;
    }
}

/// See [`super::tile`]; lengths were checked there.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn tile(ty: GgmlType, k: usize, weights: &[u8], act: &Activations, out: &mut TileOut<'_>) -> bool {
    match ty {
        GgmlType::Q4_K => run::<Q4_K>(k, weights, act, out),
        GgmlType::Q5_K => run::<Q5_K>(k, weights, act, out),
        GgmlType::Q6_K => run::<Q6_K>(k, weights, act, out),
        GgmlType::IQ4_XS => run::<IQ4_XS>(k, weights, act, out),
        _ => return false,
    }
    true
}
