//! The 2- and 3-bit grid formats (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) in the file layout
//! against Q8_K activations.
//!
//! Per 32 values: the grid entries their indices name are gathered into 32 unsigned magnitude
//! bytes, the four sign bytes (7-bit fields expanded by ggml's `ksigns` rule, or stored whole)
//! become ±1 bytes through a table of eight per byte, which `sign` applies to the activations,
//! and `maddubs`, then `madd` with the odd scales `2s + 1` of the two halves, sum
//! `Σ ls·grid·±q8` exactly in i32 lanes over the super-block; the driver (`superblocks`) takes
//! it from there, folding the format's constant into `d_w`.

use std::arch::x86_64::*;

use super::lanes::load_f16;
use super::superblocks::{half_scales, lanes64, odd_halves, run, RowsFn, SuperBlocks};
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

/// The kernels of format `K`. With `GATHER`, the table entries a group names come through the
/// AVX2 gathers instead of one load and one insert each (a lane shuffle, all on one port on
/// Intel cores): the same values, so the same bits (see [`gathers_pay`]).
struct Grid<const K: u8, const GATHER: bool>;

impl<const K: u8, const GATHER: bool> Grid<K, GATHER> {
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

impl<const K: u8, const GATHER: bool> SuperBlocks for Grid<K, GATHER> {
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
        if GATHER {
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

/// The kernel of `ty`, if it is one of this file's formats: with `gather`, the build whose
/// table lookups are AVX2 gathers.
pub(super) fn kernel(ty: GgmlType, gather: bool) -> Option<RowsFn> {
    fn of<const G: bool>(ty: GgmlType) -> Option<RowsFn> {
        Some(match ty {
            GgmlType::IQ2_XXS => run::<Grid<IQ2_XXS, G>>,
            GgmlType::IQ3_XXS => run::<Grid<IQ3_XXS, G>>,
            GgmlType::IQ2_XS => run::<Grid<IQ2_XS, G>>,
            GgmlType::IQ2_S => run::<Grid<IQ2_S, G>>,
            GgmlType::IQ3_S => run::<Grid<IQ3_S, G>>,
            _ => return None,
        })
    }
    if gather {
        of::<true>(ty)
    } else {
        of::<false>(ty)
    }
}

/// Whether this CPU's gathers beat a load and an insert per entry, so that the grid formats
/// use [`Grid`]'s gathers. `TINYLLM_CPU_GATHER=1` or `0` decides by hand.
///
/// The rule is what was measured and what is known: on the Intel Xeon (AVX-512, gathers not
/// slowed by the microcode fix for Gather Data Sampling) the gathers made IQ3_XXS's one-row
/// product 18% faster on one thread and 38% on two, best of five alternating runs
/// (`cargo bench --bench kernels -- IQ3_XXS`). The inserts all go through one shuffle port
/// there, the gathers' loads do not. llama.cpp's IQ3_S kernel notes the opposite on a Ryzen
/// 7950X (AMD), and Intel's GDS microcode (Skylake to Ice Lake and Tiger Lake) makes gathers
/// several times slower; neither was measured here, so both keep the inserts.
pub fn gathers_pay() -> bool {
    static PAY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PAY.get_or_init(|| match std::env::var("TINYLLM_CPU_GATHER").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => {
            // CPUID leaf 0: the vendor string.
            let id = std::arch::x86_64::__cpuid(0);
            let intel = (id.ebx, id.edx, id.ecx) == (0x756e_6547, 0x4965_6e69, 0x6c65_746e);
            let gds = std::fs::read_to_string("/sys/devices/system/cpu/vulnerabilities/gather_data_sampling")
                .is_ok_and(|s| s.starts_with("Mitigation"));
            intel && std::is_x86_feature_detected!("avx512f") && !gds
        }
    })
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
