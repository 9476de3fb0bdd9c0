//! The interleaved weight layout of the formats the SIMD kernels take eight rows at a time (the
//! 32-value Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4 and the 256-value Q2_K, Q3_K, Q4_K,
//! Q5_K, Q6_K, IQ4_XS, TQ2_0), made once at load. Each kernel set says which of them it reads
//! interleaved (the AVX2 and the wasm sets read every one of them so).
//!
//! In the file, each row's blocks follow each other, and a kernel that takes eight rows at a
//! time (one per vector lane) must unpack each row's nibbles and scales on its own and then sum
//! across lanes. Decode spends most of its time there. Here the eight rows of a tile share each
//! block: with a single load and a mask or shift, four consecutive values of all eight rows land
//! in one vector, a row per 32-bit lane, which is the operand of the integer dot product as it
//! is; the per-row scales come the same way, eight rows per load. The bytes per weight do not
//! change (the layout is a permutation), so neither does the memory the model takes or the
//! bandwidth decode needs.
//!
//! Layout: rows in tiles of [`TILE_ROWS`] (the last tile padded with zero blocks), a tile's
//! blocks in order, and each tile block (`TILE_ROWS` × the file's block bytes) holds the fields
//! of the eight rows' blocks one field after the other (in the order of [`fields`]), each as:
//!
//! * f16 scalars (`d`, the minimum `m` or `dmin`; IQ4_XS's 16-bit `scales_h`): row `i`'s at
//!   `2i`; MXFP4's E8M0 exponent byte: row `i`'s at `i`;
//! * byte arrays (`qs`; Q4_K's and Q5_K's packed scales; Q5_K's `qh`; Q6_K's `ql`, `qh` and
//!   scales; Q2_K's scales; Q3_K's `hmask` and scales; TQ2_0's `qs`; IQ4_XS's `scales_l`): in groups of four
//!   file bytes, group `j` of row `i` at `32j + 4i`. So group `j` of Q4_0's `qs` holds values
//!   `4j..4j + 4` (low nibbles) and `16 + 4j..` (high nibbles) of all eight rows;
//!   Q6_K's `ql` and `qh` are fields of two groups each, in the order a kernel reads them
//!   ([`q6k_quads`]): with `ql` and then `qh` whole, one pass over a tile block read it in three
//!   interleaved streams, which the hardware prefetcher of an AMD EPYC (Zen 4) did not follow,
//!   and its one-row product from memory ran at less than half of Q4_K's bytes per second;
//! * Q5_0/Q5_1's `qh`: 8 × 4 bytes, row `i` at `4i`; bit `p` of its byte `t` is the fifth bit
//!   of value `4p + t` (so a shift by `p` brings the bits of values `4p..4p + 4` to one place in
//!   their bytes).
//!
//! [`rows`] undoes it: the embedding lookup reads its rows through it, and tests check the
//! kernels on the interleaved layout against the oracle on the file layout.

use std::ops::Range;

use crate::quant::GgmlType;

/// Rows per tile.
pub const TILE_ROWS: usize = 8;

/// How a tile block holds one field of the eight rows' blocks.
#[derive(Clone, Copy)]
enum Place {
    /// Units of this many bytes: unit `j` of row `i` at `TILE_ROWS · unit · j + unit · i`.
    Units(usize),
    /// The four `qh` bytes of Q5_0/Q5_1, bit-transposed (see the module doc).
    FifthBits,
}

/// One field of a file block: its offset, its length and how a tile block holds it.
#[derive(Clone, Copy)]
struct Field {
    at: usize,
    len: usize,
    place: Place,
}

const fn f16_at(at: usize) -> Field {
    Field {
        at,
        len: 2,
        place: Place::Units(2),
    }
}

const fn byte_at(at: usize) -> Field {
    Field {
        at,
        len: 1,
        place: Place::Units(1),
    }
}

const fn bytes_at(at: usize, len: usize) -> Field {
    Field {
        at,
        len,
        place: Place::Units(4),
    }
}

const fn fifth_bits_at(at: usize) -> Field {
    Field {
        at,
        len: 4,
        place: Place::FifthBits,
    }
}

/// The fields of a block of `ty`, in their order in a tile block (which the kernels' offsets
/// follow), or `None` when `ty` has no interleaved layout. Together they cover the file block.
fn fields(ty: GgmlType) -> Option<&'static [Field]> {
    const Q4_0: &[Field] = &[f16_at(0), bytes_at(2, 16)];
    const Q8_0: &[Field] = &[f16_at(0), bytes_at(2, 32)];
    const MXFP4: &[Field] = &[byte_at(0), bytes_at(1, 16)];
    const Q4_1: &[Field] = &[f16_at(0), f16_at(2), bytes_at(4, 16)];
    const Q5_0: &[Field] = &[f16_at(0), fifth_bits_at(2), bytes_at(6, 16)];
    const Q5_1: &[Field] = &[f16_at(0), f16_at(2), fifth_bits_at(4), bytes_at(8, 16)];
    // File blocks: Q4_K `d, dmin, scales[12], qs[128]`; Q5_K `d, dmin, scales[12], qh[32],
    // qs[128]`; Q6_K `ql[128], qh[64], scales[16], d`; IQ4_XS `d, scales_h, scales_l[4],
    // qs[128]`.
    const Q4_K: &[Field] = &[f16_at(0), f16_at(2), bytes_at(4, 12), bytes_at(16, 128)];
    const Q5_K: &[Field] = &[
        f16_at(0),
        f16_at(2),
        bytes_at(4, 12),
        bytes_at(16, 32),
        bytes_at(48, 128),
    ];
    const Q6_K: &[Field] = &Q6K_FIELDS;
    const IQ4_XS: &[Field] = &[f16_at(0), f16_at(2), bytes_at(4, 4), bytes_at(8, 128)];
    // Q2_K: `scales[16], qs[64], d, dmin`; Q3_K: `hmask[32], qs[64], scales[12], d`.
    const Q2_K: &[Field] = &[f16_at(80), f16_at(82), bytes_at(0, 16), bytes_at(16, 64)];
    const Q3_K: &[Field] = &[f16_at(108), bytes_at(96, 12), bytes_at(0, 32), bytes_at(32, 64)];
    // TQ2_0: `qs[64], d`.
    const TQ2_0: &[Field] = &[f16_at(64), bytes_at(0, 64)];
    Some(match ty {
        GgmlType::Q4_0 | GgmlType::IQ4_NL => Q4_0,
        GgmlType::Q8_0 => Q8_0,
        GgmlType::MXFP4 => MXFP4,
        GgmlType::Q4_1 => Q4_1,
        GgmlType::Q5_0 => Q5_0,
        GgmlType::Q5_1 => Q5_1,
        GgmlType::Q2_K => Q2_K,
        GgmlType::Q3_K => Q3_K,
        GgmlType::TQ2_0 => TQ2_0,
        GgmlType::Q4_K => Q4_K,
        GgmlType::Q5_K => Q5_K,
        GgmlType::Q6_K => Q6_K,
        GgmlType::IQ4_XS => IQ4_XS,
        _ => return None,
    })
}

/// Q6_K's fields: `d`, the scales, then `ql` and `qh` in the order one pass over a super-block
/// reads them (see [`q6k_quads`]).
const Q6K_FIELDS: [Field; 26] = {
    let mut f = [f16_at(208); 26];
    f[1] = bytes_at(192, 16);
    let mut c = 0;
    while c < 8 {
        // Chunk c = 4n + m: `ql` groups 16n + 2m, +1 (the low nibbles of values 128n + 8m..
        // and of 128n + 64 + 8m..), 16n + 8 + 2m, +1 (their high nibbles), `qh` groups
        // 8n + 2m, +1: two of the file's four-byte groups each.
        let (n, m) = (c / 4, c % 4);
        f[2 + 3 * c] = bytes_at(64 * n + 8 * m, 8);
        f[3 + 3 * c] = bytes_at(64 * n + 32 + 8 * m, 8);
        f[4 + 3 * c] = bytes_at(128 + 32 * n + 8 * m, 8);
        c += 1;
    }
    f
};

/// Offsets in a Q6_K tile block of its `ql` and `qh` groups for value group `32n + 8q + l`
/// (`n` < 2, `q` < 4, `l` < 8; values `128n + 32q + 4l..` of the eight rows): the low (`q` < 2)
/// or high nibbles of the `ql` group, with bits `2q, 2q + 1` of the `qh` group's bytes on top.
/// The two 32-byte groups of each of a chunk's three fields (`ql` for `q` even, for `q` odd,
/// `qh`) lie side by side, so a kernel that takes positions `l`, `l + 1` together reads the tile
/// block from start to end.
pub const fn q6k_quads(n: usize, l: usize, q: usize) -> (usize, usize) {
    let chunk = 18 * TILE_ROWS + 6 * 32 * (4 * n + l / 2);
    let ql = chunk + 32 * (2 * (q % 2) + l % 2);
    let qh = chunk + 32 * (4 + l % 2);
    (ql, qh)
}

/// Each field with its offset in a tile block.
fn placed(fields: &[Field]) -> impl Iterator<Item = (Field, usize)> + '_ {
    fields.iter().scan(0, |at, &f| {
        let here = *at;
        *at += TILE_ROWS * f.len;
        Some((f, here))
    })
}

/// Where row `i`'s `field` goes: pairs of a byte range in its file block and the range of a
/// tile block (the field at `to` there) that holds the same bytes. (Empty for the fifth bits,
/// which [`fifth_bits_to_tile`] and [`fifth_bits_from_tile`] move.)
fn units(field: Field, to: usize, i: usize) -> impl Iterator<Item = (Range<usize>, Range<usize>)> {
    let unit = match field.place {
        Place::Units(unit) => unit,
        Place::FifthBits => field.len,
    };
    let n = if matches!(field.place, Place::Units(_)) {
        field.len / unit
    } else {
        0
    };
    (0..n).map(move |j| {
        let at = to + TILE_ROWS * unit * j + unit * i;
        (field.at + unit * j..field.at + unit * (j + 1), at..at + unit)
    })
}

/// Q5's `qh` word (bit `4p + t` the fifth bit of value `4p + t`) as the tile's four bytes.
fn fifth_bits_to_tile(qh: u32) -> [u8; 4] {
    std::array::from_fn(|t| (0..8).fold(0u8, |b, p| b | ((((qh >> (4 * p + t)) & 1) as u8) << p)))
}

/// The inverse of [`fifth_bits_to_tile`].
fn fifth_bits_from_tile(bytes: &[u8]) -> u32 {
    let mut qh = 0u32;
    for (t, &byte) in bytes.iter().enumerate() {
        for p in 0..8 {
            qh |= u32::from((byte >> p) & 1) << (4 * p + t);
        }
    }
    qh
}

/// Bytes of one tile: `TILE_ROWS` rows of `k` values.
pub fn tile_bytes(ty: GgmlType, k: usize) -> usize {
    TILE_ROWS * (k / ty.block_size()) * ty.block_bytes()
}

/// The bytes of the tiles holding rows `r0..r0 + n` (`r0` a multiple of [`TILE_ROWS`]).
pub fn span(ty: GgmlType, k: usize, r0: usize, n: usize) -> Range<usize> {
    let tb = tile_bytes(ty, k);
    r0 / TILE_ROWS * tb..(r0 + n).div_ceil(TILE_ROWS) * tb
}

/// Bytes of `n` interleaved rows of `k` values (whole tiles).
pub fn len(ty: GgmlType, k: usize, n: usize) -> usize {
    n.div_ceil(TILE_ROWS) * tile_bytes(ty, k)
}

/// The interleaved layout of `rows` (whole file-layout rows of `k` values of `ty`), or `None`
/// when `ty` has none or the lengths do not fit.
pub fn interleave(ty: GgmlType, k: usize, rows: &[u8]) -> Option<Vec<u8>> {
    let n = row_count(ty, k, rows)?;
    let mut out = vec![0u8; len(ty, k, n)];
    interleave_tiles(ty, k, rows, 0, &mut out);
    Some(out)
}

/// How many whole file-layout rows of `k` values of `ty` `rows` holds, when `ty` has an
/// interleaved layout and the lengths fit.
pub fn row_count(ty: GgmlType, k: usize, rows: &[u8]) -> Option<usize> {
    fields(ty)?;
    let rb = k / ty.block_size() * ty.block_bytes();
    (k > 0 && k.is_multiple_of(ty.block_size()) && rows.len().is_multiple_of(rb)).then(|| rows.len() / rb)
}

/// Fill `dst`, whole tiles starting at tile `t0`, from `rows` (all the file-layout rows, as
/// accepted by [`row_count`]); rows past the end stay as they are in `dst` (zero when fresh).
/// Tiles may be filled in parallel, a part of `dst` each.
pub fn interleave_tiles(ty: GgmlType, k: usize, rows: &[u8], t0: usize, dst: &mut [u8]) {
    let (Some(fields), Some(n)) = (fields(ty), row_count(ty, k, rows)) else {
        return;
    };
    let block = ty.block_bytes();
    let rb = k / ty.block_size() * block;
    for (t, tile) in dst.chunks_exact_mut(tile_bytes(ty, k)).enumerate() {
        let r0 = (t0 + t) * TILE_ROWS;
        for (b, dst) in tile.chunks_exact_mut(TILE_ROWS * block).enumerate() {
            for i in 0..TILE_ROWS.min(n.saturating_sub(r0)) {
                let src = &rows[(r0 + i) * rb + b * block..][..block];
                for (field, to) in placed(fields) {
                    if let Place::FifthBits = field.place {
                        let h = &src[field.at..field.at + 4];
                        let qh = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
                        dst[to + 4 * i..to + 4 * i + 4].copy_from_slice(&fifth_bits_to_tile(qh));
                    }
                    for (f, t) in units(field, to, i) {
                        dst[t].copy_from_slice(&src[f]);
                    }
                }
            }
        }
    }
}

/// Row `r` of interleaved `data` (rows of `k` values of `ty`) in the file layout, appended to
/// `out`. Nothing is appended when `ty` has no interleaved layout or `r` is past the data.
pub fn row(ty: GgmlType, k: usize, data: &[u8], r: usize, out: &mut Vec<u8>) {
    let Some(fields) = fields(ty) else { return };
    let nb = k / ty.block_size();
    let block = ty.block_bytes();
    let tb = tile_bytes(ty, k);
    let Some(tile) = data.get(r / TILE_ROWS * tb..(r / TILE_ROWS + 1) * tb) else {
        return;
    };
    let i = r % TILE_ROWS;
    for src in tile.chunks_exact(TILE_ROWS * block).take(nb) {
        let at0 = out.len();
        out.resize(at0 + block, 0);
        let block = &mut out[at0..];
        for (field, from) in placed(fields) {
            if let Place::FifthBits = field.place {
                let qh = fifth_bits_from_tile(&src[from + 4 * i..from + 4 * i + 4]);
                block[field.at..field.at + 4].copy_from_slice(&qh.to_le_bytes());
            }
            for (f, t) in units(field, from, i) {
                block[f].copy_from_slice(&src[t]);
            }
        }
    }
}

/// Rows `0..n` of interleaved `data` in the file layout.
pub fn rows(ty: GgmlType, k: usize, data: &[u8], n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * (k / ty.block_size()) * ty.block_bytes());
    for r in 0..n {
        row(ty, k, data, r, &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaving_round_trips_every_row() {
        let mut state = 0x1234_5678_9abc_def0u64;
        let types: Vec<GgmlType> = GgmlType::ALL.iter().copied().filter(|&t| fields(t).is_some()).collect();
        assert_eq!(types.len(), 14);
        for ty in types {
            // A permutation: the fields fill the block (the round trip shows they do not overlap).
            let fields = fields(ty).unwrap();
            assert_eq!(fields.iter().map(|f| f.len).sum::<usize>(), ty.block_bytes(), "{ty}");
            for (blocks, n) in [(1, 1), (2, 7), (3, 8), (1, 9), (4, 17)] {
                let k = blocks * ty.block_size();
                let bytes = n * blocks * ty.block_bytes();
                let rows_in: Vec<u8> = (0..bytes)
                    .map(|_| {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        state as u8
                    })
                    .collect();
                let packed = interleave(ty, k, &rows_in).unwrap();
                assert_eq!(packed.len(), len(ty, k, n));
                assert_eq!(rows(ty, k, &packed, n), rows_in, "{ty} k={k} n={n}");
                // The tail tile's padding rows are zero blocks.
                if n % TILE_ROWS != 0 {
                    let mut pad = Vec::new();
                    row(ty, k, &packed, n, &mut pad);
                    assert!(pad.iter().all(|&b| b == 0), "{ty} k={k} n={n}");
                }
            }
        }
    }

    #[test]
    fn other_types_and_partial_rows_are_refused() {
        assert!(interleave(GgmlType::IQ2_XS, 256, &[0; 74]).is_none());
        assert!(interleave(GgmlType::Q4_0, 32, &[0; 17]).is_none());
        assert!(interleave(GgmlType::Q4_0, 16, &[0; 18]).is_none());
        assert_eq!(span(GgmlType::Q4_0, 32, 8, 9), 144..432);
    }
}
