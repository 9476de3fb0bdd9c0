//! The interleaved weight layout of the 32-value formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
//! IQ4_NL), made once at load for the AVX2 kernels.
//!
//! In the file, each row's blocks follow each other, and a kernel that takes eight rows at a
//! time (one per vector lane) must unpack each row's nibbles and fifth bits on its own and then
//! sum across lanes. Decode spends most of its time there. Here the eight rows of a tile share
//! each block: with a single load and a mask or shift, four consecutive values of all eight rows
//! land in one vector, a row per 32-bit lane, which is the operand of the integer dot product
//! as it is. The bytes per weight do not change (the layout is a permutation), so neither does
//! the memory the model takes or the bandwidth decode needs.
//!
//! Layout: rows in tiles of [`TILE_ROWS`] (the last tile padded with zero blocks), a tile's
//! blocks in order, and each tile block (`TILE_ROWS` × the file's block bytes) as:
//!
//! * `d`: the 8 rows' f16 scales (16 bytes), then for Q4_1/Q5_1 `m`: their f16 minimums;
//! * for Q5_0/Q5_1 `qh`: 8 × 4 bytes, row `i` at `4i`; bit `p` of its byte `t` is the fifth
//!   bit of value `4p + t` (so a shift by `p` brings the bits of values `4p..4p + 4` to one
//!   place in their bytes);
//! * `qs`: 32 bytes per group of four file bytes (4 groups for the 4-bit formats, 8 for Q8_0);
//!   group `j` holds row `i`'s file bytes `4j..4j + 4` at `32j + 4i`. For the 4-bit formats
//!   their low nibbles are values `4j..4j + 4` and their high nibbles values `16 + 4j..`; for
//!   Q8_0 they are values `4j..4j + 4`.
//!
//! [`rows`] undoes it: the embedding lookup reads its rows through it, and tests check the
//! kernels on the interleaved layout against the oracle on the file layout.

use std::ops::Range;

use crate::quant::GgmlType;

/// Rows per tile.
pub const TILE_ROWS: usize = 8;

/// Where a block's fields are in the file and in a tile block.
struct Fields {
    /// Bytes of one file block.
    block: usize,
    /// Offset of `m` in the file block, if the format has one.
    min: Option<usize>,
    /// Offset of `qh` in the file block, if the format has one.
    high: Option<usize>,
    /// Offset of `qs` in the file block.
    quants: usize,
    /// Groups of four `qs` bytes.
    groups: usize,
}

fn fields(ty: GgmlType) -> Option<Fields> {
    let (min, high, quants) = match ty {
        GgmlType::Q4_0 | GgmlType::IQ4_NL | GgmlType::Q8_0 => (None, None, 2),
        GgmlType::Q4_1 => (Some(2), None, 4),
        GgmlType::Q5_0 => (None, Some(2), 6),
        GgmlType::Q5_1 => (Some(2), Some(4), 8),
        _ => return None,
    };
    let block = ty.block_bytes();
    Some(Fields {
        block,
        min,
        high,
        quants,
        groups: (block - quants) / 4,
    })
}

/// Whether `ty` has an interleaved layout.
pub fn supports(ty: GgmlType) -> bool {
    fields(ty).is_some()
}

/// Offsets of `m`, `qh` and `qs` in a tile block of a format with these fields.
fn tile_offsets(f: &Fields) -> (usize, usize, usize) {
    let m = 2 * TILE_ROWS;
    let qh = m + if f.min.is_some() { 2 * TILE_ROWS } else { 0 };
    let qs = qh + if f.high.is_some() { 4 * TILE_ROWS } else { 0 };
    (m, qh, qs)
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
    let f = fields(ty)?;
    let rb = k / ty.block_size() * f.block;
    (k > 0 && k.is_multiple_of(ty.block_size()) && rows.len().is_multiple_of(rb)).then(|| rows.len() / rb)
}

/// Fill `dst`, whole tiles starting at tile `t0`, from `rows` (all the file-layout rows, as
/// accepted by [`row_count`]); rows past the end stay as they are in `dst` (zero when fresh).
/// Tiles may be filled in parallel, a part of `dst` each.
pub fn interleave_tiles(ty: GgmlType, k: usize, rows: &[u8], t0: usize, dst: &mut [u8]) {
    let (Some(f), Some(n)) = (fields(ty), row_count(ty, k, rows)) else {
        return;
    };
    let nb = k / ty.block_size();
    let rb = nb * f.block;
    let (mo, ho, qo) = tile_offsets(&f);
    for (t, tile) in dst.chunks_exact_mut(tile_bytes(ty, k)).enumerate() {
        let r0 = (t0 + t) * TILE_ROWS;
        for (b, dst) in tile.chunks_exact_mut(TILE_ROWS * f.block).enumerate() {
            for i in 0..TILE_ROWS.min(n.saturating_sub(r0)) {
                let src = &rows[(r0 + i) * rb + b * f.block..][..f.block];
                dst[2 * i..2 * i + 2].copy_from_slice(&src[..2]);
                if let Some(m) = f.min {
                    dst[mo + 2 * i..mo + 2 * i + 2].copy_from_slice(&src[m..m + 2]);
                }
                if let Some(h) = f.high {
                    let qh = u32::from_le_bytes([src[h], src[h + 1], src[h + 2], src[h + 3]]);
                    for tb in 0..4 {
                        let mut byte = 0u8;
                        for p in 0..8 {
                            byte |= (((qh >> (4 * p + tb)) & 1) as u8) << p;
                        }
                        dst[ho + 4 * i + tb] = byte;
                    }
                }
                for j in 0..f.groups {
                    let at = qo + 32 * j + 4 * i;
                    dst[at..at + 4].copy_from_slice(&src[f.quants + 4 * j..f.quants + 4 * j + 4]);
                }
            }
        }
    }
}

/// Row `r` of interleaved `data` (rows of `k` values of `ty`) in the file layout, appended to
/// `out`. Nothing is appended when `ty` has no interleaved layout or `r` is past the data.
pub fn row(ty: GgmlType, k: usize, data: &[u8], r: usize, out: &mut Vec<u8>) {
    let Some(f) = fields(ty) else { return };
    let nb = k / ty.block_size();
    let tb = tile_bytes(ty, k);
    let Some(tile) = data.get(r / TILE_ROWS * tb..(r / TILE_ROWS + 1) * tb) else {
        return;
    };
    let (mo, ho, qo) = tile_offsets(&f);
    let i = r % TILE_ROWS;
    for src in tile.chunks_exact(TILE_ROWS * f.block).take(nb) {
        let at0 = out.len();
        out.resize(at0 + f.block, 0);
        let block = &mut out[at0..];
        block[..2].copy_from_slice(&src[2 * i..2 * i + 2]);
        if let Some(m) = f.min {
            block[m..m + 2].copy_from_slice(&src[mo + 2 * i..mo + 2 * i + 2]);
        }
        if let Some(h) = f.high {
            let mut qh = 0u32;
            for tb in 0..4 {
                let byte = src[ho + 4 * i + tb];
                for p in 0..8 {
                    qh |= u32::from((byte >> p) & 1) << (4 * p + tb);
                }
            }
            block[h..h + 4].copy_from_slice(&qh.to_le_bytes());
        }
        for j in 0..f.groups {
            let at = qo + 32 * j + 4 * i;
            block[f.quants + 4 * j..f.quants + 4 * j + 4].copy_from_slice(&src[at..at + 4]);
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
        let types: Vec<GgmlType> = GgmlType::ALL.iter().copied().filter(|&t| supports(t)).collect();
        assert_eq!(types.len(), 6);
        for ty in types {
            for (k, n) in [(32, 1), (64, 7), (96, 8), (32, 9), (128, 17)] {
                let bytes = n * k / 32 * ty.block_bytes();
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
        assert!(interleave(GgmlType::Q4_K, 256, &[0; 144]).is_none());
        assert!(interleave(GgmlType::Q4_0, 32, &[0; 17]).is_none());
        assert!(interleave(GgmlType::Q4_0, 16, &[0; 18]).is_none());
        assert_eq!(span(GgmlType::Q4_0, 32, 8, 9), 144..432);
    }
}
