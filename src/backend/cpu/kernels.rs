//! Matmul row kernels of the CPU backend, chosen once per backend.
//!
//! A matmul converts its activations once per batch the way ggml does before its dot products
//! (quantized to Q8_0/Q8_K for quantized weights, rounded to F16/BF16 for half-precision
//! weights), then each task takes one weight row at a time and meets it with every activation
//! row of the batch. [`Kernels`] holds the functions for both steps:
//!
//! * `fast` (default): the quantized activations are expanded back to the exact f32 values
//!   they represent, each weight row is decoded to f32 once and reused across the batch, and
//!   the products are summed in f32. This is ggml's arithmetic up to f32 summation order, and
//!   decoding once per row instead of once per (row, activation) makes prefill fast.
//! * `oracle`: the scalar integer dot products of [`crate::quant::vec_dot`], per pair. Tests
//!   compare `fast` against it.
//!
//! SIMD variants (AVX2, chosen at run time) slot in beside these in [`Kernels::detect`].

use half::{bf16, f16};

use crate::quant::{self, GgmlType, QuantError};

/// Activations of a batch, converted for one weight type.
pub struct Activations {
    /// Values after the conversion, `k` per row (empty for the oracle).
    values: Vec<f32>,
    k: usize,
    /// Quantized blocks, `row_bytes` per row (oracle only).
    bytes: Vec<u8>,
    row_bytes: usize,
}

impl Activations {
    fn row(&self, r: usize) -> &[f32] {
        self.values.get(r * self.k..(r + 1) * self.k).unwrap_or(&[])
    }
}

/// Convert `rows` rows of `k` values for weights of type `ty`.
pub type PrepareFn = fn(ty: GgmlType, x: &[f32], k: usize) -> Result<Activations, QuantError>;

/// One weight row (raw bytes of `k` values of `ty`) times every activation row: `out[r]` for
/// row `r`. `scratch` holds at least `k` values.
pub type RowFn = fn(ty: GgmlType, k: usize, w: &[u8], act: &Activations, scratch: &mut [f32], out: &mut [f32]);

/// The kernel set of a backend.
#[derive(Debug, Clone, Copy)]
pub struct Kernels {
    pub prepare: PrepareFn,
    pub row: RowFn,
    /// Name of the variant (`fast`, `oracle`).
    pub variant: &'static str,
}

impl Kernels {
    /// The best kernels this CPU supports.
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            return Kernels {
                prepare: prepare_values,
                row: row_fast_avx2,
                variant: "fast-avx2",
            };
        }
        Kernels {
            prepare: prepare_values,
            row: row_fast,
            variant: "fast",
        }
    }

    /// The reference kernels built on [`crate::quant::vec_dot`].
    pub fn oracle() -> Self {
        Kernels {
            prepare: prepare_blocks,
            row: row_oracle,
            variant: "oracle",
        }
    }
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
    Ok(Activations {
        values,
        k,
        bytes: Vec::new(),
        row_bytes: 0,
    })
}

fn prepare_blocks(ty: GgmlType, x: &[f32], k: usize) -> Result<Activations, QuantError> {
    let act = ty.vec_dot_type();
    if act == GgmlType::F32 {
        // Float weights: the dot product takes the (rounded) values as little-endian f32.
        let rounded = prepare_values(ty, x, k)?;
        let bytes: Vec<u8> = rounded.values.iter().flat_map(|v| v.to_le_bytes()).collect();
        return Ok(Activations {
            values: Vec::new(),
            k,
            bytes,
            row_bytes: k * 4,
        });
    }
    let row_bytes = k / act.block_size() * act.block_bytes();
    let mut bytes = Vec::with_capacity(row_bytes * (x.len() / k.max(1)));
    for row in x.chunks_exact(k) {
        quant::quantize_activations(ty, row, &mut bytes)?;
    }
    Ok(Activations {
        values: Vec::new(),
        k,
        bytes,
        row_bytes,
    })
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

fn row_oracle(ty: GgmlType, k: usize, w: &[u8], act: &Activations, _scratch: &mut [f32], out: &mut [f32]) {
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
