//! The 2- and 3-bit grid formats (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) in the file layout
//! against Q8_K activations.
//!
//! Per 32 values: the grid entries their indices name are gathered into 32 unsigned magnitude
//! bytes, the four sign bytes (7-bit fields expanded by ggml's `ksigns` rule, or stored whole)
//! become ±1 bytes through a table of eight per byte, which `sign` applies to the activations,
//! and `maddubs`, then `madd` with the odd scales `2s + 1` of the two halves, sum
//! `Σ ls·grid·±q8` exactly in i32 lanes over the super-block; the driver (`superblocks`) takes
//! it from there, folding the format's constant into `d_w`.
//!
//! With AVX-512 ([`Pairs`]) a super-block is unpacked 64 values at a time: the grid entries of
//! a pair of groups in one gather (or loads and inserts, as [`Lookup`] picks per CPU), or with
//! VBMI all at once through byte permutes: IQ3_XXS's and IQ3_S's 64 of the grid's byte planes
//! ([`permuted_entries`]), the IQ2 grids' 32 (64 for two super-blocks of one row) of the byte
//! planes of their entries' 2-bit level codes, spread to values by two more permutes and a
//! multishift ([`entry_codes`], [`spread_codes`]); the sign fields of all groups at once, their
//! `ksigns` parity bit from a `pshufb` of the field's folded nibble instead of a table, as a
//! mask per pair; the scales of all sixteen quarters at once, spread to each pair's lanes by
//! one permute. Against the one-group-at-a-time kernels on the Intel Xeon this made the one-row
//! product 1.3-2x faster (IQ2_XS 2.0-2.6 against 3.0-3.2 GB/s on one thread); on the AMD EPYC
//! (Zen 4) the IQ2 codes made it another 1.3-1.45x faster than the loads and inserts (IQ2_XS
//! 4.0 → 5.3 GB/s on one thread).

use std::arch::x86_64::*;

use super::lanes::load_f16;
use super::superblocks::{
    half_scales, ksign_bytes, lanes64, odd_halves, run_pairs, sign_masks, PairBlock, Pairs, RowsFn, SuperBlocks,
};
use crate::quant::{GgmlType, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};

const IQ2_XXS: u8 = 0;
const IQ3_XXS: u8 = 1;
const IQ2_XS: u8 = 2;
const IQ2_S: u8 = 3;
const IQ3_S: u8 = 4;

const fn block_bytes(kind: u8) -> usize {
    match kind {
        IQ2_XXS => 66,
        IQ3_XXS => 98,
        IQ2_XS => 74,
        IQ2_S => 82,
        _ => 110,
    }
}

/// The factor a row's sum ends scaled by (the grids' fixed-point scale).
const fn factor(kind: u8) -> f32 {
    match kind {
        IQ3_XXS => 0.25,
        IQ3_S => 1.0,
        _ => 0.125,
    }
}

/// Eight sign bits (bit `j`: value `j` is negative) as eight bytes, -1 (0xff) or 1.
const fn sign_bytes(bits: u8) -> u64 {
    let mut v = 0u64;
    let mut j = 0;
    while j < 8 {
        let b: u64 = if (bits >> j) & 1 == 1 { 0xff } else { 1 };
        v |= b << (8 * j);
        j += 1;
    }
    v
}

/// [`sign_bytes`] of every byte: the stored sign bytes of IQ2_S and IQ3_S.
static SIGNS: [u64; 256] = {
    let mut t = [0u64; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = sign_bytes(i as u8);
        i += 1;
    }
    t
};

/// [`sign_bytes`] of each 7-bit sign field expanded by ggml's `ksigns` rule (the eighth bit
/// makes the count of negatives even; `quant::KSIGNS_IQ2XS`, which a test checks).
static KSIGNS: [u64; 128] = {
    let mut t = [0u64; 128];
    let mut i = 0;
    while i < 128 {
        t[i] = sign_bytes(i as u8 | (((i as u32).count_ones() as u8 & 1) << 7));
        i += 1;
    }
    t
};

/// One group of 32, unpacked: its magnitudes, ±1 signs and the odd scales of its halves
/// (i16 lanes 0..8 the first's, 8..16 the second's).
#[derive(Clone, Copy)]
struct Group {
    mags: __m256i,
    signs: __m256i,
    scales: __m256i,
}

/// The four 7-bit sign fields of `aux` (bits `7l..7l + 7`) as ±1 bytes.
#[inline(always)]
unsafe fn ksigns(aux: u32) -> __m256i {
    lanes64(std::array::from_fn(|l| KSIGNS[((aux >> (7 * l)) & 127) as usize]))
}

/// The four stored sign bytes at `p` as ±1 bytes.
#[inline(always)]
unsafe fn stored_signs(p: *const u8) -> __m256i {
    lanes64(std::array::from_fn(|l| SIGNS[usize::from(*p.add(l))]))
}

/// `table[idx[l]]` for the four i32 lanes of `idx` (each below the table's length).
#[inline(always)]
unsafe fn gather64(table: &[u64], idx: __m128i) -> __m256i {
    _mm256_i32gather_epi64::<8>(table.as_ptr() as *const i64, idx)
}

/// `table[idx[l]]` for the eight i32 lanes of `idx` (each below the table's length).
#[inline(always)]
unsafe fn gather32(table: &[u32], idx: __m256i) -> __m256i {
    _mm256_i32gather_epi32::<4>(table.as_ptr() as *const i32, idx)
}

/// The four bytes at `p` as i32 lanes.
#[inline(always)]
unsafe fn bytes4(p: *const u8) -> __m128i {
    _mm_cvtepu8_epi32(_mm_cvtsi32_si128(std::ptr::read_unaligned(p as *const i32)))
}

/// The eight bytes at `p` as i32 lanes.
#[inline(always)]
unsafe fn bytes8(p: *const u8) -> __m256i {
    _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i))
}

/// [`ksigns`] through one gather.
#[inline(always)]
unsafe fn ksigns_gathered(aux: u32) -> __m256i {
    let fields = _mm_srlv_epi32(_mm_set1_epi32(aux as i32), _mm_setr_epi32(0, 7, 14, 21));
    gather64(&KSIGNS, _mm_and_si128(fields, _mm_set1_epi32(127)))
}

/// [`Lookup::Inserts`], [`Lookup::Gathers`] and [`Lookup::Permutes`] as [`Grid`]'s parameter.
const INSERTS: u8 = 0;
const GATHERS: u8 = 1;
const PERMUTES: u8 = 2;

/// The kernels of format `K`, looking its table entries up as `L` says ([`Lookup`]): the same
/// values whichever way, so the same bits.
struct Grid<const K: u8, const L: u8>;

impl<const K: u8, const L: u8> Grid<K, L> {
    /// [`SuperBlocks::group`] with the gathers.
    #[inline(always)]
    unsafe fn gathered(p: *const u8, g: usize) -> Group {
        let word = |o: usize| std::ptr::read_unaligned(p.add(o) as *const u32);
        let byte = |o: usize| i32::from(*p.add(o));
        match K {
            IQ2_XXS => {
                let aux = word(6 + 8 * g);
                Group {
                    mags: gather64(&IQ2XXS_GRID, bytes4(p.add(2 + 8 * g))),
                    signs: ksigns_gathered(aux),
                    scales: _mm256_set1_epi16((2 * (aux >> 28) + 1) as i16),
                }
            }
            IQ3_XXS => {
                let aux = word(66 + 4 * g);
                Group {
                    mags: gather32(&IQ3XXS_GRID, bytes8(p.add(2 + 8 * g))),
                    signs: ksigns_gathered(aux),
                    scales: _mm256_set1_epi16((2 * (aux >> 28) + 1) as i16),
                }
            }
            IQ2_XS => {
                let halves = _mm_cvtepu16_epi32(_mm_loadl_epi64(p.add(2 + 8 * g) as *const __m128i));
                let sc = byte(66 + g) as u32;
                Group {
                    mags: gather64(&IQ2XS_GRID, _mm_and_si128(halves, _mm_set1_epi32(511))),
                    signs: gather64(&KSIGNS, _mm_srli_epi32::<9>(halves)),
                    scales: odd_halves(sc & 0xf, sc >> 4),
                }
            }
            IQ2_S => {
                // Index l: byte l, and bits 2l, 2l + 1 of `qh` as its bits 8 and 9.
                let qh = _mm_sllv_epi32(_mm_set1_epi32(byte(66 + g)), _mm_setr_epi32(8, 6, 4, 2));
                let idx = _mm_or_si128(bytes4(p.add(2 + 4 * g)), _mm_and_si128(qh, _mm_set1_epi32(0x300)));
                let sc = byte(74 + g) as u32;
                Group {
                    mags: gather64(&IQ2S_GRID, idx),
                    signs: gather64(&SIGNS, bytes4(p.add(34 + 4 * g))),
                    scales: odd_halves(sc & 0xf, sc >> 4),
                }
            }
            _ => {
                // Index i: byte i, and bit i of `qh` as its bit 8.
                let qh = _mm256_sllv_epi32(
                    _mm256_set1_epi32(byte(66 + g)),
                    _mm256_setr_epi32(8, 7, 6, 5, 4, 3, 2, 1),
                );
                let idx = _mm256_or_si256(bytes8(p.add(2 + 8 * g)), _mm256_and_si256(qh, _mm256_set1_epi32(0x100)));
                let s = (byte(106 + g / 2) as u32 >> (4 * (g % 2))) & 0xf;
                Group {
                    mags: gather32(&IQ3S_GRID, idx),
                    signs: gather64(&SIGNS, bytes4(p.add(74 + 4 * g))),
                    scales: _mm256_set1_epi16((2 * s + 1) as i16),
                }
            }
        }
    }
}

impl<const K: u8, const L: u8> SuperBlocks for Grid<K, L> {
    const BYTES: usize = block_bytes(K);
    const FACTOR: f32 = factor(K);
    // IQ2_XXS, IQ3_XXS and IQ3_S have one scale per group of 32.
    const SCALE_SPAN: usize = if matches!(K, IQ2_XXS | IQ3_XXS | IQ3_S) { 32 } else { 16 };
    type Head = f32;
    type Group = Group;

    #[inline(always)]
    unsafe fn head(p: *const u8) -> f32 {
        load_f16(p)
    }

    #[inline(always)]
    fn scale(d: &f32) -> f32 {
        *d
    }

    #[inline(always)]
    unsafe fn group(p: *const u8, _: &f32, g: usize) -> Group {
        if L == GATHERS {
            return Self::gathered(p, g);
        }
        let word = |o: usize| std::ptr::read_unaligned(p.add(o) as *const u32);
        let wide = |o: usize| std::ptr::read_unaligned(p.add(o) as *const u64);
        let byte = |o: usize| u32::from(*p.add(o));
        match K {
            IQ2_XXS => {
                let (idx, aux) = (word(2 + 8 * g), word(6 + 8 * g));
                Group {
                    mags: lanes64(std::array::from_fn(|l| IQ2XXS_GRID[((idx >> (8 * l)) & 255) as usize])),
                    signs: ksigns(aux),
                    scales: _mm256_set1_epi16((2 * (aux >> 28) + 1) as i16),
                }
            }
            IQ3_XXS => {
                let (idx, aux) = (wide(2 + 8 * g), word(66 + 4 * g));
                let m: [u32; 8] = std::array::from_fn(|i| IQ3XXS_GRID[((idx >> (8 * i)) & 255) as usize]);
                Group {
                    mags: _mm256_loadu_si256(m.as_ptr() as *const __m256i),
                    signs: ksigns(aux),
                    scales: _mm256_set1_epi16((2 * (aux >> 28) + 1) as i16),
                }
            }
            IQ2_XS => {
                let q = wide(2 + 8 * g);
                let half = |l: usize| ((q >> (16 * l)) & 0xffff) as usize;
                let sc = byte(66 + g);
                Group {
                    mags: lanes64(std::array::from_fn(|l| IQ2XS_GRID[half(l) & 511])),
                    signs: lanes64(std::array::from_fn(|l| KSIGNS[half(l) >> 9])),
                    scales: odd_halves(sc & 0xf, sc >> 4),
                }
            }
            IQ2_S => {
                let (idx, qh) = (word(2 + 4 * g), byte(66 + g));
                let sc = byte(74 + g);
                Group {
                    mags: lanes64(std::array::from_fn(|l| {
                        IQ2S_GRID[(((idx >> (8 * l)) & 255) | ((qh << (8 - 2 * l)) & 0x300)) as usize]
                    })),
                    signs: stored_signs(p.add(34 + 4 * g)),
                    scales: odd_halves(sc & 0xf, sc >> 4),
                }
            }
            _ => {
                let (idx, qh) = (wide(2 + 8 * g), byte(66 + g) as u64);
                let m: [u32; 8] =
                    std::array::from_fn(|i| IQ3S_GRID[(((idx >> (8 * i)) & 255) | (((qh >> i) & 1) << 8)) as usize]);
                let s = (byte(106 + g / 2) >> (4 * (g % 2))) & 0xf;
                Group {
                    mags: _mm256_loadu_si256(m.as_ptr() as *const __m256i),
                    signs: stored_signs(p.add(74 + 4 * g)),
                    scales: _mm256_set1_epi16((2 * s + 1) as i16),
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn meet(x: &Group, q8: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(x.mags, _mm256_sign_epi8(q8, x.signs)), x.scales)
    }

    #[inline(always)]
    unsafe fn values(x: &Group) -> (__m256i, [i32; 2]) {
        (_mm256_sign_epi8(x.mags, x.signs), half_scales(x.scales))
    }
}

/// Eight table entries of eight values, `table[idx[l]]` for the i32 lanes of `idx`.
#[inline(always)]
unsafe fn entries64<const L: u8>(table: &[u64], idx: __m256i) -> __m512i {
    if L == GATHERS {
        _mm512_i32gather_epi64::<8>(idx, table.as_ptr() as *const i64)
    } else {
        let mut i = [0u32; 8];
        _mm256_storeu_si256(i.as_mut_ptr() as *mut __m256i, idx);
        let e: [u64; 8] = std::array::from_fn(|l| table[i[l] as usize]);
        _mm512_loadu_si512(e.as_ptr() as *const __m512i)
    }
}

/// Sixteen table entries of four values, `table[idx[l]]` for the i32 lanes of `idx`.
#[inline(always)]
unsafe fn entries32<const L: u8>(table: &[u32], idx: __m512i) -> __m512i {
    if L == GATHERS {
        _mm512_i32gather_epi32::<4>(idx, table.as_ptr() as *const i32)
    } else {
        let mut i = [0u32; 16];
        _mm512_storeu_si512(i.as_mut_ptr() as *mut __m512i, idx);
        let e: [u32; 16] = std::array::from_fn(|l| table[i[l] as usize]);
        _mm512_loadu_si512(e.as_ptr() as *const __m512i)
    }
}

/// The 16 bytes `q` (each below 16, in the order of the super-block's 16-value quarters) as
/// [`PairBlock::odd`].
#[inline(always)]
unsafe fn odd_quarters(q: __m128i) -> __m512i {
    let s = _mm256_cvtepu8_epi16(q);
    _mm512_castsi256_si512(_mm256_or_si256(_mm256_slli_epi16::<1>(s), _mm256_set1_epi16(1)))
}

/// The low eight bytes of `b` as sixteen nibbles, the low one of each byte first.
#[inline(always)]
unsafe fn nibbles(b: __m128i) -> __m128i {
    let m = _mm_set1_epi8(15);
    _mm_unpacklo_epi8(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16::<4>(b), m))
}

/// The signs and odd scales of the XXS formats' eight group words `aux` (four 7-bit sign
/// fields, then a 4-bit scale of the group's 32 values): the 32 sign bytes (four per group)
/// and the scales as [`odd_quarters`] makes them.
#[inline(always)]
unsafe fn group_words(aux: __m256i) -> (__m256i, __m512i) {
    let aux = _mm512_castsi256_si512(aux);
    let signs = _mm256_set_m128i(word_signs(aux, 4), word_signs(aux, 0));
    // Group g's scale in i32 lane g, then in both its i16 lanes 2g, 2g + 1.
    let s = _mm512_srli_epi32::<28>(aux);
    let s = _mm512_or_si512(s, _mm512_slli_epi32::<16>(s));
    let odd = _mm512_or_si512(_mm512_slli_epi16::<1>(s), _mm512_set1_epi16(1));
    (signs, odd)
}

/// The 16 sign bytes of words `first..first + 4` of `aux` (see [`group_words`]).
#[inline(always)]
unsafe fn word_signs(aux: __m512i, first: i32) -> __m128i {
    // Lanes 4l..4l + 4: word first + l, shifted to its four fields.
    let lanes = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    let words = _mm512_permutexvar_epi32(_mm512_add_epi32(_mm512_set1_epi32(first), lanes), aux);
    let shifts = _mm512_set4_epi32(21, 14, 7, 0);
    let fields = _mm512_and_si512(_mm512_srlv_epi32(words, shifts), _mm512_set1_epi32(127));
    _mm512_cvtepi32_epi8(ksign_bytes(fields))
}

/// IQ3_S's stored sign bytes and its scales as [`odd_quarters`] makes them, of the super-block
/// at `p`.
#[inline(always)]
unsafe fn iq3s_signs_scales(p: *const u8) -> (__m256i, __m512i) {
    let signs = _mm256_loadu_si256(p.add(74) as *const __m256i);
    // One scale per group: each nibble for both of its quarters.
    let s = nibbles(_mm_cvtsi32_si128(std::ptr::read_unaligned(p.add(106) as *const i32)));
    (signs, odd_quarters(_mm_unpacklo_epi8(s, s)))
}

/// A table of `N` entries of `P` bytes as `P` byte planes, on a 64-byte boundary: plane `b`'s
/// byte `e` is byte `b` of entry `e`, so that `vpermi2b` looks up 64 entries' byte `b` at once
/// from 128 of them.
#[repr(C, align(64))]
struct Planes<const N: usize, const P: usize>([[u8; N]; P]);

/// A grid of four-byte entries as its byte planes.
const fn planes<const N: usize>(grid: &[u32; N]) -> Planes<N, 4> {
    let mut p = [[0u8; N]; 4];
    let mut e = 0;
    while e < N {
        let mut b = 0;
        while b < 4 {
            p[b][e] = (grid[e] >> (8 * b)) as u8;
            b += 1;
        }
        e += 1;
    }
    Planes(p)
}

static IQ3XXS_PLANES: Planes<256, 4> = planes(&IQ3XXS_GRID);
static IQ3S_PLANES: Planes<512, 4> = planes(&IQ3S_GRID);

/// Where [`permuted_entries`] puts the super-block's 64 indices before its lookups: position
/// `16l + 4j + t` takes index `16j + 4l + t`, so that the byte and word unpacks after them,
/// which work within 128-bit lanes, leave entry `n`'s four bytes at values `4n..4n + 4`.
const ENTRY_ORDER: [u8; 64] = {
    let mut o = [0u8; 64];
    let mut pos = 0;
    while pos < 64 {
        o[pos] = (16 * ((pos / 4) % 4) + 4 * (pos / 16) + pos % 4) as u8;
        pos += 1;
    }
    o
};

/// The 256 magnitudes of a super-block of 64 four-byte grid entries, pair `j` (values
/// `64j..64j + 64`) in vector `j`, looked up in `planes` by the 64 index bytes `idx` (with bit
/// `n` of `high` as index `n`'s bit 8 where the grid has 512 entries) through AVX-512 VBMI's
/// byte permutes: per plane two `vpermi2b` (four for 512 entries) and blends on the high bits,
/// against 64 loads and inserts (or four gathers), which on AMD's Zen 4 cost about three cycles
/// per entry. Needs `avx512vbmi` in the caller's target features.
#[inline(always)]
unsafe fn permuted_entries<const N: usize>(planes: &Planes<N, 4>, idx: __m512i, high: u64) -> [__m512i; 4] {
    let order = _mm512_loadu_si512(ENTRY_ORDER.as_ptr() as *const __m512i);
    let idx = _mm512_permutexvar_epi8(order, idx);
    let bit7 = _mm512_movepi8_mask(idx);
    let bit8 = _mm512_movepi8_mask(_mm512_permutexvar_epi8(order, _mm512_movm_epi8(high)));
    let mut b = [_mm512_setzero_si512(); 4];
    for (plane, b) in planes.0.iter().zip(&mut b) {
        let t = plane.as_ptr();
        let low = _mm512_mask_blend_epi8(bit7, look128(t, idx), look128(t.add(128), idx));
        *b = if N == 512 {
            let up = _mm512_mask_blend_epi8(bit7, look128(t.add(256), idx), look128(t.add(384), idx));
            _mm512_mask_blend_epi8(bit8, low, up)
        } else {
            low
        };
    }
    // Within each 128-bit lane: byte pairs of planes 0 and 1, and of 2 and 3, then those pairs'
    // pairs, an entry's four bytes in order.
    let (p01_lo, p01_hi) = (_mm512_unpacklo_epi8(b[0], b[1]), _mm512_unpackhi_epi8(b[0], b[1]));
    let (p23_lo, p23_hi) = (_mm512_unpacklo_epi8(b[2], b[3]), _mm512_unpackhi_epi8(b[2], b[3]));
    [
        _mm512_unpacklo_epi16(p01_lo, p23_lo),
        _mm512_unpackhi_epi16(p01_lo, p23_lo),
        _mm512_unpacklo_epi16(p01_hi, p23_hi),
        _mm512_unpackhi_epi16(p01_hi, p23_hi),
    ]
}

/// The formats whose entries [`entry_codes`] looks up (on [`Lookup::Permutes`]).
const IQ2_CODED: [u8; 3] = [IQ2_XXS, IQ2_XS, IQ2_S];

/// The three magnitudes of the IQ2 grids' values, by their 2-bit level code.
const IQ2_LEVELS: [u8; 3] = [0x08, 0x19, 0x2b];

/// A grid of eight-value entries whose values are [`IQ2_LEVELS`] as the two byte planes of a
/// 16-bit code per entry, value `i`'s level in bits `2i, 2i + 1` ([`entry_codes`] looks them up).
const fn code_planes<const N: usize>(grid: &[u64; N]) -> Planes<N, 2> {
    let mut p = [[0u8; N]; 2];
    let mut e = 0;
    while e < N {
        let mut code = 0u16;
        let mut i = 0;
        while i < 8 {
            let v = (grid[e] >> (8 * i)) as u8;
            let mut level = 0;
            while level < IQ2_LEVELS.len() && IQ2_LEVELS[level] != v {
                level += 1;
            }
            assert!(level < IQ2_LEVELS.len(), "an IQ2 grid value outside its three levels");
            code |= (level as u16) << (2 * i);
            i += 1;
        }
        p[0][e] = code as u8;
        p[1][e] = (code >> 8) as u8;
        e += 1;
    }
    Planes(p)
}

static IQ2XXS_CODES: Planes<256, 2> = code_planes(&IQ2XXS_GRID);
static IQ2XS_CODES: Planes<512, 2> = code_planes(&IQ2XS_GRID);
static IQ2S_CODES: Planes<1024, 2> = code_planes(&IQ2S_GRID);

/// Byte `x`: the magnitude of level `x & 3` (`vpermb` reads six bits of its index; level 3 does
/// not occur).
static LEVEL_BYTES: Planes<64, 1> = {
    let mut t = [0u8; 64];
    let mut x = 0;
    while x < 64 {
        t[x] = IQ2_LEVELS[if x & 3 == 3 { 2 } else { x & 3 }];
        x += 1;
    }
    Planes([t])
};

/// The codes ([`code_planes`]) of up to 64 entries of a grid of 256, 512 or 1024, low and high
/// byte: byte `n` of each for the index whose bits 0..8 are byte `n` of `low` and whose bits 8
/// and 9 are bit `n` of `high[0]` and `high[1]`. Through AVX-512 VBMI's byte permutes: per plane
/// and 256 entries two `vpermi2b` and a blend on the index's bit 7, then blends on its bits 8
/// and 9, for all 64 entries at once; against a load and an insert per entry. Needs
/// `avx512vbmi` in the caller's target features.
#[inline(always)]
unsafe fn entry_codes<const N: usize>(planes: &Planes<N, 2>, low: __m512i, high: [u64; 2]) -> [__m512i; 2] {
    let bit7 = _mm512_movepi8_mask(low);
    let mut code = [_mm512_setzero_si512(); 2];
    for (plane, c) in planes.0.iter().zip(&mut code) {
        let t = plane.as_ptr();
        *c = match N {
            256 => look256(t, low, bit7),
            512 => _mm512_mask_blend_epi8(high[0], look256(t, low, bit7), look256(t.add(256), low, bit7)),
            _ => _mm512_mask_blend_epi8(
                high[1],
                _mm512_mask_blend_epi8(high[0], look256(t, low, bit7), look256(t.add(256), low, bit7)),
                _mm512_mask_blend_epi8(high[0], look256(t.add(512), low, bit7), look256(t.add(768), low, bit7)),
            ),
        };
    }
    code
}

/// Bytes `t[i]` for the 64 bytes `i` of `idx` (`bit7`: their top bits).
#[inline(always)]
unsafe fn look256(t: *const u8, idx: __m512i, bit7: __mmask64) -> __m512i {
    _mm512_mask_blend_epi8(bit7, look128(t, idx), look128(t.add(128), idx))
}

/// The 64 magnitudes of entries `first..first + 8` (`first` below 57) of [`entry_codes`]'
/// `code`: a `vpermi2b` puts each entry's code in a 64-bit lane, `vpmultishiftqb` moves value
/// `i`'s level to byte `i`, and `vpermb` maps levels to magnitudes. Needs `avx512vbmi`.
#[inline(always)]
unsafe fn spread_codes(code: &[__m512i; 2], first: i64) -> __m512i {
    // Bytes 8l and 8l + 1: entry first + l's code bytes (from the low plane, then the high).
    let e = |l: i64| (first + l) | (64 + first + l) << 8;
    let lanes = _mm512_set_epi64(e(7), e(6), e(5), e(4), e(3), e(2), e(1), e(0));
    let codes = _mm512_permutex2var_epi8(code[0], lanes, code[1]);
    // Byte i of each 64-bit lane: the lane's bits 2i..2i + 8, value i's level in its low bits.
    let shifts = _mm512_set1_epi64(0x0e0c_0a08_0604_0200);
    let levels = _mm512_load_si512(LEVEL_BYTES.0[0].as_ptr() as *const __m512i);
    _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(shifts, codes), levels)
}

/// An IQ2 super-block's 32 entry indices, entry `n` of the super-block's order at byte or bit
/// `n`: their bits 0..8 as bytes, and their bits 8 and 9 as masks (zero where the grid is
/// smaller).
struct Iq2Indices {
    low: __m256i,
    high: [u32; 2],
}

/// The indices of the IQ2 super-block (`K`: IQ2_XXS, IQ2_XS or IQ2_S) at `p`. Needs `bmi2` in the
/// caller's target features for IQ2_S.
#[inline(always)]
unsafe fn iq2_indices<const K: u8>(p: *const u8) -> Iq2Indices {
    match K {
        IQ2_XXS => {
            // Group g: four index bytes at 2 + 8g, then its sign and scale word.
            let q = _mm512_loadu_si512(p.add(2) as *const __m512i);
            let even_lanes = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 14, 12, 10, 8, 6, 4, 2, 0);
            Iq2Indices {
                low: _mm512_castsi512_si256(_mm512_permutexvar_epi32(even_lanes, q)),
                high: [0; 2],
            }
        }
        IQ2_XS => {
            // 32 u16: a 9-bit index and a 7-bit sign field each.
            let q = _mm512_loadu_si512(p.add(2) as *const __m512i);
            Iq2Indices {
                low: _mm512_cvtepi16_epi8(q),
                high: [_mm512_test_epi16_mask(q, _mm512_set1_epi16(256)), 0],
            }
        }
        _ => {
            // Index 4g + l: byte 4g + l at 2, and bits 2l, 2l + 1 of group g's `qh` byte.
            let qh = std::ptr::read_unaligned(p.add(66) as *const u64);
            Iq2Indices {
                low: _mm256_loadu_si256(p.add(2) as *const __m256i),
                high: [
                    _pext_u64(qh, 0x5555_5555_5555_5555) as u32,
                    _pext_u64(qh, 0xaaaa_aaaa_aaaa_aaaa) as u32,
                ],
            }
        }
    }
}

/// The entry codes of IQ2 indices (one super-block's, or two's one after the other) in `K`'s
/// grid.
#[inline(always)]
unsafe fn iq2_codes<const K: u8>(low: __m512i, high: [u64; 2]) -> [__m512i; 2] {
    match K {
        IQ2_XXS => entry_codes(&IQ2XXS_CODES, low, high),
        IQ2_XS => entry_codes(&IQ2XS_CODES, low, high),
        _ => entry_codes(&IQ2S_CODES, low, high),
    }
}

/// The sign bytes and [`odd_quarters`] scales of the IQ2 super-block (`K`) at `p`.
#[inline(always)]
unsafe fn iq2_signs_scales<const K: u8>(p: *const u8) -> (__m256i, __m512i) {
    match K {
        IQ2_XXS => {
            let q = _mm512_loadu_si512(p.add(2) as *const __m512i);
            let odd_lanes = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 15, 13, 11, 9, 7, 5, 3, 1);
            group_words(_mm512_castsi512_si256(_mm512_permutexvar_epi32(odd_lanes, q)))
        }
        IQ2_XS => {
            let q = _mm512_loadu_si512(p.add(2) as *const __m512i);
            let signs = _mm512_cvtepi16_epi8(ksign_bytes(_mm512_srli_epi16::<9>(q)));
            (
                signs,
                odd_quarters(nibbles(_mm_loadl_epi64(p.add(66) as *const __m128i))),
            )
        }
        _ => (
            _mm256_loadu_si256(p.add(34) as *const __m256i),
            odd_quarters(nibbles(_mm_loadl_epi64(p.add(74) as *const __m128i))),
        ),
    }
}

/// The IQ2 super-block (`K`) at `p`, whose entries' codes are entries `first..first + 32` of
/// `code` ([`iq2_codes`]).
#[inline(always)]
unsafe fn iq2_block<const K: u8>(p: *const u8, code: &[__m512i; 2], first: i64) -> PairBlock {
    let mut mags = [_mm512_setzero_si512(); 4];
    for (j, m) in mags.iter_mut().enumerate() {
        *m = spread_codes(code, first + 8 * j as i64);
    }
    let (signs, odd) = iq2_signs_scales::<K>(p);
    PairBlock {
        mags,
        signs: sign_masks(signs),
        odd,
    }
}

/// Bytes `t[i & 127]` for the 64 bytes `i` of `idx`.
#[inline(always)]
unsafe fn look128(t: *const u8, idx: __m512i) -> __m512i {
    let lo = _mm512_loadu_si512(t as *const __m512i);
    let hi = _mm512_loadu_si512(t.add(64) as *const __m512i);
    _mm512_permutex2var_epi8(lo, idx, hi)
}

/// The sixteen bytes at `p` as i32 lanes.
#[inline(always)]
unsafe fn bytes16(p: *const u8) -> __m512i {
    _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i))
}

impl<const K: u8, const L: u8> Pairs for Grid<K, L> {
    // IQ3's four-byte entries come from byte permutes of the table's planes, the IQ2 grids'
    // eight-value entries from permutes of their codes' planes.
    const VBMI: bool = L == PERMUTES;

    // The IQ2 grids' two super-blocks look their 64 entries' codes up in one set of permutes.
    #[inline(always)]
    unsafe fn pairs2(p: [*const u8; 2], head: [&f32; 2]) -> [PairBlock; 2] {
        if !(Self::VBMI && IQ2_CODED.contains(&K)) {
            return [Self::pairs(p[0], head[0]), Self::pairs(p[1], head[1])];
        }
        let (a, b) = (iq2_indices::<K>(p[0]), iq2_indices::<K>(p[1]));
        let low = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a.low), b.low);
        let high = [0, 1].map(|h| u64::from(a.high[h]) | u64::from(b.high[h]) << 32);
        let code = iq2_codes::<K>(low, high);
        [iq2_block::<K>(p[0], &code, 0), iq2_block::<K>(p[1], &code, 32)]
    }

    // Loops, not closures: a closure does not take its function's target features, so the
    // intrinsics it calls would not inline.
    #[inline(always)]
    unsafe fn pairs(p: *const u8, _: &f32) -> PairBlock {
        if Self::VBMI && IQ2_CODED.contains(&K) {
            let i = iq2_indices::<K>(p);
            let code = iq2_codes::<K>(_mm512_castsi256_si512(i.low), i.high.map(u64::from));
            return iq2_block::<K>(p, &code, 0);
        }
        let half = |o: usize| std::ptr::read_unaligned(p.add(o) as *const u16) as i32;
        let mut mags = [_mm512_setzero_si512(); 4];
        let (signs, odd) = match K {
            IQ2_XXS => {
                let words = iq2_indices::<K>(p).low;
                let idx = [
                    _mm512_cvtepu8_epi32(_mm256_castsi256_si128(words)),
                    _mm512_cvtepu8_epi32(_mm256_extracti128_si256::<1>(words)),
                ];
                for j in 0..4 {
                    let i = if j % 2 == 0 {
                        _mm512_castsi512_si256(idx[j / 2])
                    } else {
                        _mm512_extracti64x4_epi64::<1>(idx[j / 2])
                    };
                    mags[j] = entries64::<L>(&IQ2XXS_GRID, i);
                }
                iq2_signs_scales::<K>(p)
            }
            IQ3_XXS => {
                if Self::VBMI {
                    mags = permuted_entries(&IQ3XXS_PLANES, _mm512_loadu_si512(p.add(2) as *const __m512i), 0);
                } else {
                    for (j, m) in mags.iter_mut().enumerate() {
                        *m = entries32::<L>(&IQ3XXS_GRID, bytes16(p.add(2 + 16 * j)));
                    }
                }
                group_words(_mm256_loadu_si256(p.add(66) as *const __m256i))
            }
            IQ2_XS => {
                // 32 u16: a 9-bit index and a 7-bit sign field each.
                for (j, m) in mags.iter_mut().enumerate() {
                    let q = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.add(2 + 16 * j) as *const __m128i));
                    *m = entries64::<L>(&IQ2XS_GRID, _mm256_and_si256(q, _mm256_set1_epi32(511)));
                }
                iq2_signs_scales::<K>(p)
            }
            IQ2_S => {
                for (j, m) in mags.iter_mut().enumerate() {
                    // Index l: byte l, and bits 2l, 2l + 1 of the two groups' `qh` bytes as
                    // its bits 8 and 9.
                    let qh = _mm256_srlv_epi32(
                        _mm256_set1_epi32(half(66 + 2 * j)),
                        _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14),
                    );
                    let high = _mm256_slli_epi32::<8>(_mm256_and_si256(qh, _mm256_set1_epi32(3)));
                    let low = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(2 + 8 * j) as *const __m128i));
                    *m = entries64::<L>(&IQ2S_GRID, _mm256_or_si256(low, high));
                }
                iq2_signs_scales::<K>(p)
            }
            _ if Self::VBMI => {
                // Index n: byte n of `qs`, and bit n of the eight `qh` bytes as its bit 8.
                let high = std::ptr::read_unaligned(p.add(66) as *const u64);
                mags = permuted_entries(&IQ3S_PLANES, _mm512_loadu_si512(p.add(2) as *const __m512i), high);
                iq3s_signs_scales(p)
            }
            _ => {
                for (j, m) in mags.iter_mut().enumerate() {
                    // Index i: byte i, and bit i of the two groups' `qh` bytes as its bit 8.
                    let qh = _mm512_srlv_epi32(
                        _mm512_set1_epi32(half(66 + 2 * j)),
                        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                    );
                    let high = _mm512_slli_epi32::<8>(_mm512_and_si512(qh, _mm512_set1_epi32(1)));
                    *m = entries32::<L>(&IQ3S_GRID, _mm512_or_si512(bytes16(p.add(2 + 16 * j)), high));
                }
                iq3s_signs_scales(p)
            }
        };
        PairBlock {
            mags,
            signs: sign_masks(signs),
            odd,
        }
    }
}

/// How the grid formats' kernels look their table entries up. Each gives the same values, so
/// the same bits; which is fastest depends on the CPU ([`Lookup::of_this_cpu`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// One load and one insert per entry.
    Inserts,
    /// AVX2 and AVX-512 gathers.
    Gathers,
    /// On the 512-bit path, the grid entries through AVX-512 VBMI's byte permutes: IQ3_XXS's
    /// and IQ3_S's of the tables' byte planes ([`permuted_entries`]), the IQ2 grids' of their
    /// entries' 2-bit level codes ([`entry_codes`]); the other paths insert.
    Permutes,
}

impl Lookup {
    /// The lookups of this CPU. `TINYLLM_CPU_LOOKUP=inserts`, `gathers` or `permutes` decides
    /// by hand (`permutes` falls back to inserts without VBMI).
    ///
    /// The rule is what was measured and what is known:
    /// - On the Intel Xeon (Emerald Rapids, gathers not slowed by the microcode fix for Gather
    ///   Data Sampling) the gathers made IQ3_XXS's one-row product 18% faster on one thread and
    ///   38% on two, best of five alternating runs (`cargo bench --bench kernels -- IQ3_XXS`).
    ///   The inserts all go through one shuffle port there, the gathers' loads do not; the
    ///   permutes go through that port too, and were not measured there.
    /// - On an AMD EPYC (Zen 4) both the inserts and the gathers cost about three cycles per
    ///   entry (IQ3_XXS's one-row product about 2 GB/s on one thread either way, against 22 for
    ///   Q4_K), and the permutes, about 25 vector operations per 64 entries, are several times
    ///   faster (see docs/benchmarks.md).
    /// - Intel's GDS microcode (Skylake to Ice Lake and Tiger Lake) makes gathers several times
    ///   slower; those CPUs take the permutes where they have VBMI (Ice Lake, Tiger Lake), else
    ///   the inserts. Not measured here.
    pub fn of_this_cpu() -> Lookup {
        static OF: std::sync::OnceLock<Lookup> = std::sync::OnceLock::new();
        *OF.get_or_init(|| match std::env::var("TINYLLM_CPU_LOOKUP").as_deref() {
            Ok("inserts") => Lookup::Inserts,
            Ok("gathers") => Lookup::Gathers,
            Ok("permutes") => Lookup::Permutes,
            _ => {
                let intel = super::lanes::vendor_is(b"GenuineIntel");
                let gds = std::fs::read_to_string("/sys/devices/system/cpu/vulnerabilities/gather_data_sampling")
                    .is_ok_and(|s| s.starts_with("Mitigation"));
                if intel && std::is_x86_feature_detected!("avx512f") && !gds {
                    Lookup::Gathers
                } else if std::is_x86_feature_detected!("avx512vbmi") {
                    Lookup::Permutes
                } else {
                    Lookup::Inserts
                }
            }
        })
    }
}

/// The kernel of `ty`, if it is one of this file's formats, with table lookups as `lookup` says
/// ([`Lookup::Permutes`] only where this CPU has AVX-512 VBMI, else [`Lookup::Inserts`]).
pub(super) fn kernel(ty: GgmlType, lookup: Lookup) -> Option<RowsFn> {
    fn of<const L: u8>(ty: GgmlType) -> Option<RowsFn> {
        Some(match ty {
            GgmlType::IQ2_XXS => run_pairs::<Grid<IQ2_XXS, L>>,
            GgmlType::IQ3_XXS => run_pairs::<Grid<IQ3_XXS, L>>,
            GgmlType::IQ2_XS => run_pairs::<Grid<IQ2_XS, L>>,
            GgmlType::IQ2_S => run_pairs::<Grid<IQ2_S, L>>,
            GgmlType::IQ3_S => run_pairs::<Grid<IQ3_S, L>>,
            _ => return None,
        })
    }
    match lookup {
        Lookup::Gathers => of::<GATHERS>(ty),
        // The permuting kernels' 512-bit paths run with `avx512vbmi` and `bmi2` enabled.
        Lookup::Permutes if std::is_x86_feature_detected!("avx512vbmi") && std::is_x86_feature_detected!("bmi2") => {
            of::<PERMUTES>(ty)
        }
        _ => of::<INSERTS>(ty),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sign_tables_follow_ggml_s_ksigns() {
        for (i, &k) in crate::quant::KSIGNS_IQ2XS.iter().enumerate() {
            assert_eq!(super::KSIGNS[i], super::SIGNS[usize::from(k)], "field {i}");
        }
        assert_eq!(super::SIGNS[0b1000_0001], 0xff01_0101_0101_01ff);
    }
}
