//! Matmul kernels of the CPU backend, chosen once per backend.
//!
//! A matmul converts its activations once per batch the way ggml does before its dot products
//! (quantized to Q8_0/Q8_K for quantized weights, rounded to F16/BF16 for half-precision
//! weights), then each task takes a tile of consecutive weight rows and meets it with every
//! activation row of the batch. [`Kernels`] holds the functions for both steps:
//!
//! * `avx2` (default where the CPU has AVX2, FMA and F16C): integer dot products of the
//!   quantized blocks in registers, register-blocked over several weight and activation rows
//!   (see [`super::simd`]). Types it does not cover fall back to `fast`.
//! * `fast` (default elsewhere): the quantized activations are expanded back to the exact f32
//!   values they represent, each weight row is decoded to f32 once and reused across the
//!   batch, and the products are summed in f32.
//! * `oracle`: the scalar integer dot products of [`crate::quant::vec_dot`], per pair. Tests
//!   compare the others against it.

use half::{bf16, f16};

use crate::quant::{self, GgmlType, QuantError};

/// Weight types the AVX2 integer/F16C kernels cover (others use the portable path); the kernel
/// tests and `cargo bench --bench kernels` iterate over this list.
pub const AVX2_TYPES: &[GgmlType] = &[
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::IQ4_NL,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_XS,
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
];
/// Activations of a batch, converted for one weight type. Which fields are filled depends on
/// the kernel set that prepared them.
pub struct Activations {
    /// Number of rows.
    pub(super) rows: usize,
    /// Values per row.
    pub(super) k: usize,
    /// Values after the conversion, `k` per row (`fast`, and float weights under `avx2`).
    pub(super) values: Vec<f32>,
    /// Quantized blocks, `row_bytes` per row (`oracle`, and quantized weights under `avx2`).
    pub(super) bytes: Vec<u8>,
    pub(super) row_bytes: usize,
    /// Q8_0 under `avx2`: each block's scale `d` as f32; for Q4_1/Q5_1 weights `d · Σq` over
    /// its 32 values, for Q4_0/Q5_0 weights the offset (-8, -16) times `Σq`. (Only the AVX2
    /// kernels read these, so other targets never do.)
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(super) scales: Vec<f32>,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(super) dsums: Vec<f32>,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(super) offsets: Vec<i32>,
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
        }
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    fn row(&self, r: usize) -> &[f32] {
        self.values.get(r * self.k..(r + 1) * self.k).unwrap_or(&[])
    }
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
/// whole tiles holding them) times every activation row: `out[a * nw + w]` for weight row `w`
/// of the `nw = out.len() / rows` rows and activation row `a`
/// (activation-row-major, the layout of the matmul's result, so a caller that hands out
/// tiles of weight rows copies whole runs of a row back). A row
/// that cannot be computed (never the case for weights validated at load) reads NaN.
pub type TileFn = fn(ty: GgmlType, layout: Layout, k: usize, w: &[u8], act: &Activations, out: &mut [f32]);

/// The kernel set of a backend.
#[derive(Debug, Clone, Copy)]
pub struct Kernels {
    pub prepare: PrepareFn,
    pub tile: TileFn,
    /// Whether weights of a type are best interleaved at load ([`Layout::Interleaved`]).
    pub interleaves: fn(GgmlType) -> bool,
    /// `gate[i] = silu(gate[i]) · up[i]` (the SwiGLU gate).
    pub swiglu: fn(gate: &mut [f32], up: &[f32]),
    /// Name of the variant (`avx2`, `fast`, `oracle`).
    pub variant: &'static str,
}

impl Kernels {
    /// The best kernels this CPU supports. The environment variable `TINYLLM_CPU_KERNELS`
    /// (`fast`, `oracle`) overrides the choice, for comparisons and bisecting.
    pub fn detect() -> Self {
        match std::env::var("TINYLLM_CPU_KERNELS").as_deref() {
            Ok("fast") => return Self::fast(),
            Ok("oracle") => return Self::oracle(),
            _ => {}
        }
        #[cfg(target_arch = "x86_64")]
        if super::simd::available() {
            return Kernels {
                prepare: prepare_avx2,
                tile: tile_avx2,
                interleaves: super::interleave::supports,
                swiglu: swiglu_avx2,
                variant: "avx2",
            };
        }
        Self::fast()
    }

    /// Decode each weight row to f32, f32 dot products (the portable default).
    pub fn fast() -> Self {
        Kernels {
            prepare: prepare_values,
            tile: tile_fast,
            interleaves: |_| false,
            swiglu: swiglu_scalar,
            variant: "fast",
        }
    }

    /// The reference kernels built on [`crate::quant::vec_dot`].
    pub fn oracle() -> Self {
        Kernels {
            prepare: prepare_blocks,
            tile: tile_oracle,
            interleaves: |_| false,
            swiglu: swiglu_scalar,
            variant: "oracle",
        }
    }
}

/// AVX2 activations: quantized blocks for the types [`super::simd`] covers, f32 values for the
/// rest (which fall back to the decoded-row path).
#[cfg(target_arch = "x86_64")]
fn prepare_avx2(ty: GgmlType, x: &[f32], k: usize) -> Result<Activations, QuantError> {
    if !super::simd::supports(ty) {
        return prepare_values(ty, x, k);
    }
    // SAFETY: `Kernels::detect` picks this function only after `simd::available()`.
    unsafe { super::simd::q8::prepare(ty, x, k) }
}

/// The scalar SwiGLU gate ([`super::ops::silu`]), the slow twin of the AVX2 one.
pub fn swiglu_scalar(gate: &mut [f32], up: &[f32]) {
    gate.iter_mut()
        .zip(up)
        .for_each(|(g, &u)| *g = super::ops::silu(*g) * u);
}

#[cfg(target_arch = "x86_64")]
fn swiglu_avx2(gate: &mut [f32], up: &[f32]) {
    // SAFETY: as in `prepare_avx2`.
    unsafe { super::simd::activation::swiglu(gate, up) }
}

#[cfg(target_arch = "x86_64")]
fn tile_avx2(ty: GgmlType, layout: Layout, k: usize, w: &[u8], act: &Activations, out: &mut [f32]) {
    // SAFETY: as in `prepare_avx2`.
    if super::simd::supports(ty) {
        if !unsafe { super::simd::tile(ty, layout, k, w, act, out) } {
            out.fill(f32::NAN);
        }
        return;
    }
    let w = file_rows(ty, layout, k, w, act, out);
    let mut scratch = vec![0f32; k];
    for_rows(k, &w, act, out, |wr, o| row_fast_avx2(ty, k, wr, act, &mut scratch, o));
}

/// The weight rows of a tile in the file layout (copied out of interleaved tiles: the portable
/// kernels never get those from the backend, which interleaves only for kernel sets that ask).
fn file_rows<'a>(
    ty: GgmlType,
    layout: Layout,
    k: usize,
    w: &'a [u8],
    act: &Activations,
    out: &[f32],
) -> std::borrow::Cow<'a, [u8]> {
    match layout {
        Layout::Rows => std::borrow::Cow::Borrowed(w),
        Layout::Interleaved => std::borrow::Cow::Owned(super::interleave::rows(ty, k, w, out.len() / act.rows.max(1))),
    }
}

/// Run `row(weight_row, outputs)` for each whole weight row of `w`, `outputs` holding one value
/// per activation row, scattered into `out` afterwards.
fn for_rows(k: usize, w: &[u8], act: &Activations, out: &mut [f32], mut row: impl FnMut(&[u8], &mut [f32])) {
    let rows = act.rows.max(1);
    let n = out.len() / rows;
    let rb = w.len().checked_div(n).unwrap_or(0);
    if rb == 0 || k == 0 {
        out.fill(f32::NAN);
        return;
    }
    let mut col = vec![0f32; rows];
    for (i, wr) in w.chunks_exact(rb).enumerate() {
        row(wr, &mut col);
        for (a, &v) in col.iter().enumerate() {
            out[a * n + i] = v;
        }
    }
}

fn tile_fast(ty: GgmlType, layout: Layout, k: usize, w: &[u8], act: &Activations, out: &mut [f32]) {
    let w = file_rows(ty, layout, k, w, act, out);
    let mut scratch = vec![0f32; k];
    for_rows(k, &w, act, out, |wr, o| row_fast(ty, k, wr, act, &mut scratch, o));
}

fn tile_oracle(ty: GgmlType, layout: Layout, k: usize, w: &[u8], act: &Activations, out: &mut [f32]) {
    let w = file_rows(ty, layout, k, w, act, out);
    for_rows(k, &w, act, out, |wr, o| row_oracle(ty, k, wr, act, o));
}

fn prepare_values(ty: GgmlType, x: &[f32], k: usize) -> Result<Activations, QuantError> {
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

fn prepare_blocks(ty: GgmlType, x: &[f32], k: usize) -> Result<Activations, QuantError> {
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

/// Decode the weight row once, then f32 dot products. A decode error cannot happen (lengths
/// were validated when the weight was placed); it would show as NaN, not a panic.
fn row_fast(ty: GgmlType, k: usize, w: &[u8], act: &Activations, scratch: &mut [f32], out: &mut [f32]) {
    row_fast_body(ty, k, w, act, scratch, out);
}

/// [`row_fast`] compiled for AVX2: the same code, so the same results, in wider vectors.
#[cfg(target_arch = "x86_64")]
fn row_fast_avx2(ty: GgmlType, k: usize, w: &[u8], act: &Activations, scratch: &mut [f32], out: &mut [f32]) {
    #[target_feature(enable = "avx2,fma")]
    unsafe fn inner(ty: GgmlType, k: usize, w: &[u8], act: &Activations, scratch: &mut [f32], out: &mut [f32]) {
        row_fast_body(ty, k, w, act, scratch, out);
    }
    // SAFETY: `Kernels::detect` picks this function only after checking AVX2 and FMA.
    unsafe { inner(ty, k, w, act, scratch, out) }
}

#[inline(always)]
fn row_fast_body(ty: GgmlType, k: usize, w: &[u8], act: &Activations, scratch: &mut [f32], out: &mut [f32]) {
    let wf = &mut scratch[..k];
    if quant::dequantize(ty, w, wf).is_err() {
        out.fill(f32::NAN);
        return;
    }
    for (r, y) in out.iter_mut().enumerate() {
        *y = dot_f32(wf, act.row(r));
    }
}

fn row_oracle(ty: GgmlType, k: usize, w: &[u8], act: &Activations, out: &mut [f32]) {
    for (r, y) in out.iter_mut().enumerate() {
        let a = act.bytes.get(r * act.row_bytes..(r + 1) * act.row_bytes).unwrap_or(&[]);
        *y = quant::vec_dot(ty, k, w, a).unwrap_or(f32::NAN);
    }
}

/// f32 dot product with independent partial sums, so the compiler can keep several vector
/// accumulators in flight.
#[inline(always)]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    const LANES: usize = 32;
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; LANES];
    let ca = a.chunks_exact(LANES);
    let cb = b.chunks_exact(LANES);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..LANES {
            acc[i] += x[i] * y[i];
        }
    }
    let mut tail = 0f32;
    for (x, y) in ra.iter().zip(rb) {
        tail += x * y;
    }
    acc.iter().sum::<f32>() + tail
}
