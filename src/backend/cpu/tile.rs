//! The types a CPU matmul kernel works on, apart from the dispatcher that picks the kernels
//! ([`super::kernels`]): the prepared activations of a batch ([`Activations`]), how weight
//! bytes are laid out ([`Layout`]), where a tile's results go ([`TileOut`]), and the plain
//! activation conversions the kernel sets share.

use std::sync::OnceLock;

use half::{bf16, f16};

use crate::quant::{self, GgmlType, QuantError};

/// Activations of a batch, converted for one weight type. Which fields are filled depends on
/// the kernel set that prepared them.
pub struct Activations {
    /// Number of rows.
    pub(super) rows: usize,
    /// Values per row.
    pub(super) k: usize,
    /// Values after the conversion, `k` per row (`portable`, and float weights under `avx2` and
    /// the wasm sets).
    pub(super) values: Vec<f32>,
    /// Quantized blocks, `row_bytes` per row (`oracle`, and quantized weights under `avx2`).
    pub(super) bytes: Vec<u8>,
    pub(super) row_bytes: usize,
    /// Q8_0 under `avx2`: each block's scale `d` as f32; for Q4_1/Q5_1 weights `d · Σq` over
    /// its 32 values, for Q4_0/Q5_0 weights the offset (-8, -16) times `Σq`, for Q8_0/IQ4_NL
    /// weights -128 times `Σq` (the VNNI kernels take their weights as `w + 128`). The wasm
    /// kernels read `scales` (each Q8_0 block's `d` as f32) and `offsets` (its `Σq`); other
    /// targets read none of the three.
    #[cfg_attr(
        not(any(target_arch = "x86_64", all(target_arch = "wasm32", target_feature = "simd128"))),
        allow(dead_code)
    )]
    pub(super) scales: Vec<f32>,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(super) dsums: Vec<f32>,
    #[cfg_attr(
        not(any(target_arch = "x86_64", all(target_arch = "wasm32", target_feature = "simd128"))),
        allow(dead_code)
    )]
    pub(super) offsets: Vec<i32>,
    /// `bytes` with each quantized value as itself plus 128 in an unsigned byte (scales and sums
    /// as they are), made on first use by the kernels that take the activations as the unsigned
    /// operand of `vpdpbusd` and shared by every task of a matmul: Q8_K under the 512-bit tiles
    /// of `simd::superblocks`.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(super) unsigned: OnceLock<Vec<u8>>,
}

impl Activations {
    /// No data yet: `rows` rows of `k` values.
    pub(super) fn empty(rows: usize, k: usize) -> Self {
        Activations {
            rows,
            k,
            values: Vec::new(),
            bytes: Vec::new(),
            row_bytes: 0,
            scales: Vec::new(),
            dsums: Vec::new(),
            offsets: Vec::new(),
            unsigned: OnceLock::new(),
        }
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The quantized blocks, row after row (empty where the kernels take f32 values): tests
    /// compare each kernel set's with the oracle's.
    pub fn blocks(&self) -> &[u8] {
        &self.bytes
    }

    /// Row `r` of the converted values (empty where the kernels took blocks).
    pub(super) fn row(&self, r: usize) -> &[f32] {
        self.values.get(r * self.k..(r + 1) * self.k).unwrap_or(&[])
    }

    /// The activations of rows `rows` of these (indices below [`Activations::rows`]), in that
    /// order. Every conversion is row by row (blocks never cross a row) and each field holds
    /// the same number of values per row, one row after the other, so this is what preparing
    /// those rows of the input would give, without converting a row that several outputs read
    /// again for each.
    pub(super) fn gather(&self, rows: &[usize]) -> Activations {
        Activations {
            rows: rows.len(),
            k: self.k,
            values: gather_rows(&self.values, self.rows, rows),
            bytes: gather_rows(&self.bytes, self.rows, rows),
            row_bytes: self.row_bytes,
            scales: gather_rows(&self.scales, self.rows, rows),
            dsums: gather_rows(&self.dsums, self.rows, rows),
            offsets: gather_rows(&self.offsets, self.rows, rows),
            unsigned: OnceLock::new(),
        }
    }

    /// `parts` one after the other, as one preparation of their rows together would give
    /// (see [`Activations::gather`]). The parts must come from one weight type and `k`.
    pub(super) fn concat(parts: Vec<Activations>) -> Activations {
        let mut parts = parts.into_iter();
        let Some(mut all) = parts.next() else {
            return Activations::empty(0, 0);
        };
        all.unsigned = OnceLock::new();
        for p in parts {
            debug_assert!(p.k == all.k && p.row_bytes == all.row_bytes);
            all.rows += p.rows;
            all.values.extend_from_slice(&p.values);
            all.bytes.extend_from_slice(&p.bytes);
            all.scales.extend_from_slice(&p.scales);
            all.dsums.extend_from_slice(&p.dsums);
            all.offsets.extend_from_slice(&p.offsets);
        }
        all
    }
}

/// Rows `rows` of `v`, a field of `n` equal rows one after the other (empty stays empty).
fn gather_rows<T: Copy>(v: &[T], n: usize, rows: &[usize]) -> Vec<T> {
    if v.is_empty() || n == 0 {
        return Vec::new();
    }
    debug_assert!(v.len().is_multiple_of(n));
    let per = v.len() / n;
    let mut out = Vec::with_capacity(per * rows.len());
    for &r in rows {
        out.extend_from_slice(&v[r * per..(r + 1) * per]);
    }
    out
}

/// How a weight's bytes are arranged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// As in the file: whole rows one after the other.
    Rows,
    /// Tiles of eight rows sharing each block ([`super::interleave`]), made at load for the
    /// kernel sets whose `interleaves` says so.
    Interleaved,
}

/// Convert `rows` rows of `k` values for weights of type `ty`.
pub type PrepareFn = fn(ty: GgmlType, x: &[f32], k: usize) -> Result<Activations, QuantError>;

/// Consecutive weight rows (raw bytes of `k`-value rows of `ty` in `layout`: whole rows, or the
/// whole tiles holding them) times every activation row: output `(a, w)` of `out` for weight row
/// `w` of the `out.nw()` rows and activation row `a` of `out.rows()` (which must be
/// `act.rows()`). A row that cannot be computed (never the case for weights validated at load)
/// reads NaN.
pub type TileFn = fn(ty: GgmlType, layout: Layout, k: usize, w: &[u8], act: &Activations, out: &mut TileOut<'_>);

/// Where a tile's results go: `rows` activation rows × `nw` weight rows, output `(a, w)` at
/// `a * stride + w`. Either a whole `[rows][nw]` slice ([`TileOut::new`]), or the columns of one
/// task's weight rows in a matmul's `[rows][n]` result that the tasks of the matmul fill at
/// once ([`TileOut::columns`]): every kernel writes its results straight into place, so the
/// tasks of a batched matmul copy nothing afterwards (the copy was 2% of a 4-row decode step).
pub struct TileOut<'a> {
    ptr: *mut f32,
    rows: usize,
    nw: usize,
    stride: usize,
    /// Where activation row `a`'s outputs go: row `at[a]` of the result, or row `a` when empty
    /// ([`TileOut::scattered`]).
    at: &'a [usize],
    _out: std::marker::PhantomData<&'a mut [f32]>,
}

impl<'a> TileOut<'a> {
    /// All of `out` as `[rows][out.len() / rows]` (values past the last whole row are never
    /// written; no rows: nothing is).
    pub fn new(out: &'a mut [f32], rows: usize) -> Self {
        let nw = out.len().checked_div(rows).unwrap_or(0);
        TileOut {
            ptr: out.as_mut_ptr(),
            rows: if nw == 0 { 0 } else { rows },
            nw,
            stride: nw,
            at: &[],
            _out: std::marker::PhantomData,
        }
    }

    /// Columns `w0..w0 + nw` of the `rows` runs of `stride` values at `ptr`.
    ///
    /// # Safety
    /// `w0 + nw <= stride`; `ptr` is valid for writes of `rows * stride` values for `'a`; and
    /// while the result lives nothing else reads or writes those columns.
    pub unsafe fn columns(ptr: *mut f32, rows: usize, stride: usize, w0: usize, nw: usize) -> Self {
        TileOut {
            ptr: ptr.add(w0),
            rows,
            nw,
            stride,
            at: &[],
            _out: std::marker::PhantomData,
        }
    }

    /// [`TileOut::columns`] with activation row `a`'s outputs in row `at[a]` of the runs at
    /// `ptr`: an expert's rows of a MoE matmul written straight to their tokens' places.
    ///
    /// # Safety
    /// `w0 + nw <= stride`; `ptr` is valid for writes of the runs of `stride` values that `at`
    /// names (none twice) for `'a`; and while the result lives nothing else reads or writes
    /// those columns of those runs.
    pub unsafe fn scattered(ptr: *mut f32, at: &'a [usize], stride: usize, w0: usize, nw: usize) -> Self {
        TileOut {
            ptr: ptr.add(w0),
            rows: at.len(),
            nw,
            stride,
            at,
            _out: std::marker::PhantomData,
        }
    }

    /// The result row that activation row `a` (below `rows`) writes.
    #[inline]
    fn row(&self, a: usize) -> usize {
        if self.at.is_empty() {
            a
        } else {
            self.at[a]
        }
    }

    /// Activation rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Weight rows.
    pub fn nw(&self) -> usize {
        self.nw
    }

    /// Set output `(a, w)`.
    ///
    /// # Panics
    /// If `a >= rows()` or `w >= nw()` (a kernel bug: the kernels write only inside the tile).
    #[inline]
    pub fn set(&mut self, a: usize, w: usize, v: f32) {
        assert!(
            a < self.rows && w < self.nw,
            "tile output ({a}, {w}) outside {}x{}",
            self.rows,
            self.nw
        );
        // SAFETY: inside the tile, which the constructors made writable and ours alone.
        unsafe { self.ptr.add(self.row(a) * self.stride + w).write(v) }
    }

    /// Outputs `(a, w0..w0 + n)`, to write at once.
    ///
    /// # Panics
    /// If `a >= rows()` or `w0 + n > nw()` (a kernel bug, as in [`TileOut::set`]).
    #[inline]
    pub fn run_mut(&mut self, a: usize, w0: usize, n: usize) -> &mut [f32] {
        assert!(
            a < self.rows && w0.checked_add(n).is_some_and(|e| e <= self.nw),
            "tile outputs ({a}, {w0}..+{n}) outside {}x{}",
            self.rows,
            self.nw
        );
        // SAFETY: inside the tile, which the constructors made writable and ours alone; the
        // borrow of `self` keeps any other write out while the slice lives.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(self.row(a) * self.stride + w0), n) }
    }

    /// Set every output to `v`.
    pub fn fill(&mut self, v: f32) {
        for a in 0..self.rows {
            for w in 0..self.nw {
                self.set(a, w, v);
            }
        }
    }
}

pub(super) fn prepare_values(ty: GgmlType, x: &[f32], k: usize) -> Result<Activations, QuantError> {
    let values = match ty {
        GgmlType::F32 => x.to_vec(),
        GgmlType::F16 => x.iter().map(|&v| f16::from_f32(v).to_f32()).collect(),
        GgmlType::BF16 => x.iter().map(|&v| bf16::from_f32(v).to_f32()).collect(),
        _ => {
            let act = ty.vec_dot_type();
            let mut values = vec![0f32; x.len()];
            let mut bytes = Vec::new();
            for (row, out) in x.chunks_exact(k).zip(values.chunks_exact_mut(k)) {
                bytes.clear();
                quant::quantize_activations(ty, row, &mut bytes)?;
                quant::dequantize(act, &bytes, out)?;
            }
            values
        }
    };
    let mut a = Activations::empty(x.len().checked_div(k).unwrap_or(0), k);
    a.values = values;
    Ok(a)
}

/// Activations as quantized blocks of the weight type's dot-product type (or little-endian
/// f32 for float weights): what the oracle and the wasm kernels read.
pub(super) fn prepare_blocks(ty: GgmlType, x: &[f32], k: usize) -> Result<Activations, QuantError> {
    let act = ty.vec_dot_type();
    if act == GgmlType::F32 {
        // Float weights: the dot product takes the (rounded) values as little-endian f32.
        let rounded = prepare_values(ty, x, k)?;
        let mut a = Activations::empty(rounded.rows, k);
        a.bytes = rounded.values.iter().flat_map(|v| v.to_le_bytes()).collect();
        a.row_bytes = k * 4;
        return Ok(a);
    }
    let row_bytes = k / act.block_size() * act.block_bytes();
    let mut bytes = Vec::with_capacity(row_bytes * (x.len() / k.max(1)));
    for row in x.chunks_exact(k) {
        quant::quantize_activations(ty, row, &mut bytes)?;
    }
    let mut a = Activations::empty(x.len().checked_div(k).unwrap_or(0), k);
    a.bytes = bytes;
    a.row_bytes = row_bytes;
    Ok(a)
}
