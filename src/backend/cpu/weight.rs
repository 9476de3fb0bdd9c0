//! A weight as the CPU backend holds it: 1-D tensors decoded to f32, matrices read in place
//! from the file mapping, copied, or interleaved into the SIMD kernels' tiles, with the
//! accessors the ops read rows through.

use std::sync::{Arc, OnceLock};

use super::arena::{Arena, ArenaBytes};
use super::interleave;
use super::pool::Pool;
use super::tile::Layout;
use crate::backend::checks::{self, shape, weight_matrix};
use crate::backend::error::BackendError;
use crate::gguf::{GgufFile, TensorInfo, TensorView};
use crate::quant::{self, GgmlType};

/// A weight on the CPU.
#[derive(Debug)]
pub struct CpuWeight {
    pub(super) name: String,
    pub(super) ty: GgmlType,
    /// Values per row (GGUF `shape[0]`).
    pub(super) n_in: usize,
    /// Rows (product of the other dimensions).
    pub(super) n_out: usize,
    /// Matrices stacked along the third and later dimensions (experts), `n_out / mats` rows
    /// each.
    pub(super) mats: usize,
    pub(super) data: WeightData,
    /// `[n_out][n_in]` every value as f32, decoded by the first [`CpuWeight::values`] call (only
    /// small matrices ask: a conv kernel, once per layer per token).
    decoded: OnceLock<Vec<f32>>,
}

#[derive(Debug)]
pub(super) enum WeightData {
    /// 2-D tensors stay in the file mapping; rows are read in place.
    Mapped { file: Arc<GgufFile>, info: TensorInfo },
    /// 2-D tensors placed from bytes the caller did not keep (a streamed file): a copy.
    Owned(Vec<u8>),
    /// 2-D tensors of the types the kernels interleave, copied into that layout at load
    /// (`[ceil(n_out / 8)]` tiles of [`interleave::tile_bytes`]), on huge pages where the
    /// system gives them ([`Arena`]).
    Interleaved(ArenaBytes),
    /// 1-D tensors (norms, biases, rope factors) are small: decoded to f32 once.
    Dense(Vec<f32>),
}

impl CpuWeight {
    pub(super) fn bytes(&self) -> &[u8] {
        match &self.data {
            WeightData::Mapped { file, info } => file.view(info).data,
            WeightData::Owned(v) => v,
            WeightData::Interleaved(v) => v,
            WeightData::Dense(_) => &[],
        }
    }

    pub(super) fn layout(&self) -> Layout {
        match self.data {
            WeightData::Interleaved(_) => Layout::Interleaved,
            _ => Layout::Rows,
        }
    }

    /// The bytes holding rows `r0..r0 + n` (`r0` a multiple of the tile for interleaved
    /// weights), in [`Self::layout`].
    pub(super) fn rows(&self, r0: usize, n: usize) -> &[u8] {
        let range = match self.layout() {
            Layout::Rows => r0 * self.row_bytes()..(r0 + n) * self.row_bytes(),
            Layout::Interleaved => interleave::span(self.ty, self.n_in, r0, n),
        };
        &self.bytes()[range]
    }

    pub(super) fn dense(&self, op: &'static str) -> Result<&[f32], BackendError> {
        match &self.data {
            WeightData::Dense(v) => Ok(v),
            _ => Err(shape(op, format!("'{}' is a matrix, expected a vector", self.name))),
        }
    }

    pub(super) fn row_bytes(&self) -> usize {
        self.n_in / self.ty.block_size() * self.ty.block_bytes()
    }

    /// Rows per stacked matrix.
    pub(super) fn mat_rows(&self) -> usize {
        self.n_out / self.mats
    }

    /// Row `r` of a matrix or vector decoded to f32 (`out`: `n_in` values).
    fn decode_row(&self, r: usize, out: &mut [f32]) -> Result<(), BackendError> {
        match &self.data {
            WeightData::Dense(v) => out.copy_from_slice(&v[r * self.n_in..(r + 1) * self.n_in]),
            WeightData::Interleaved(_) => {
                let mut row = Vec::new();
                interleave::row(self.ty, self.n_in, self.bytes(), r, &mut row);
                quant::dequantize(self.ty, &row, out)?;
            }
            _ => quant::dequantize(self.ty, self.rows(r, 1), out)?,
        }
        Ok(())
    }

    /// All the weight's values as f32: borrowed for vectors and biases (decoded at load), and
    /// for small matrices (a conv kernel) decoded by the first call and kept.
    pub(super) fn values(&self) -> Result<&[f32], BackendError> {
        if let WeightData::Dense(v) = &self.data {
            return Ok(v);
        }
        if let Some(v) = self.decoded.get() {
            return Ok(v);
        }
        let mut out = vec![0f32; self.n_in * self.n_out.max(1)];
        for (r, row) in out.chunks_exact_mut(self.n_in).enumerate() {
            self.decode_row(r, row)?;
        }
        Ok(self.decoded.get_or_init(|| out))
    }

    /// A weight from a tensor's bytes: 1-D decoded to f32, 2-D interleaved where the kernels
    /// want it (`release` lets go of the source's pages as they are copied), otherwise kept as
    /// `rows` makes them (in the file mapping, or a copy).
    pub(super) fn new(
        pool: &Pool,
        arena: &Arena,
        interleaves: fn(GgmlType) -> bool,
        view: TensorView<'_>,
        release: impl Fn(std::ops::Range<usize>) + Sync,
        rows: impl FnOnce() -> WeightData,
    ) -> Result<Self, BackendError> {
        let info = view.info;
        let (n_in, n_out) = weight_matrix(&info.name, info, view.data.len(), quant::has_vec_dot, "cpu")?;
        // A stack of matrices (experts) is interleaved only where each matrix is whole tiles,
        // so a matmul can start at any matrix.
        let mats = checks::stacked_matrices(info);
        let whole_tiles = (n_out / mats).is_multiple_of(interleave::TILE_ROWS);
        let vector = checks::is_vector(info);
        let interleaved = (!vector && (mats == 1 || whole_tiles) && interleaves(info.ty))
            .then(|| interleaved(pool, arena, info, n_in, view.data, &release))
            .flatten();
        let data = if vector {
            WeightData::Dense(view.to_f32()?)
        } else if let Some(tiles) = interleaved {
            WeightData::Interleaved(tiles)
        } else {
            rows()
        };
        Ok(Self {
            name: info.name.clone(),
            ty: info.ty,
            n_in,
            n_out,
            mats,
            data,
            decoded: OnceLock::new(),
        })
    }
}

/// The interleaved copy of a tensor's `rows` (`k` values each), made in parallel. Each
/// part's source pages are released once copied, so the tensor is never resident twice.
fn interleaved(
    pool: &Pool,
    arena: &Arena,
    info: &TensorInfo,
    k: usize,
    rows: &[u8],
    release: &(impl Fn(std::ops::Range<usize>) + Sync),
) -> Option<ArenaBytes> {
    /// Tiles per task.
    const TILES: usize = 64;
    let n = interleave::row_count(info.ty, k, rows)?;
    let mut tiles = arena.zeroed(interleave::len(info.ty, k, n));
    let tb = interleave::tile_bytes(info.ty, k);
    let rb = rows.len() / n.max(1);
    pool.for_chunks(&mut tiles, TILES * tb, |c, dst| {
        interleave::interleave_tiles(info.ty, k, rows, c * TILES, dst);
        let r0 = c * TILES * interleave::TILE_ROWS;
        let r1 = (r0 + dst.len() / tb * interleave::TILE_ROWS).min(n);
        release(r0 * rb..r1 * rb);
    });
    // Once more as a whole: a part's page faults may have mapped a few pages of a
    // neighbouring part that was already released.
    release(0..rows.len());
    Some(tiles)
}
