//! Matmul kernels of the CPU backend, chosen once per backend.
//!
//! A matmul converts its activations once per batch the way ggml does before its dot products
//! (quantized to Q8_0/Q8_K for quantized weights, rounded to F16/BF16 for half-precision
//! weights), then each task takes a tile of consecutive weight rows and meets it with every
//! activation row of the batch. [`Kernels`] holds the functions for both steps:
//!
//! * `avx2` (default where the CPU has AVX2, FMA and F16C): integer dot products of the
//!   quantized blocks in registers, register-blocked over several weight and activation rows
//!   (see [`super::simd`]); `avxvnni` and `avx512vnni` are the same kernels with VNNI dot
//!   products, and `avx512` takes batches sixteen weight rows at a time in 512-bit vectors.
//!   All give the same bits. Types they do not cover fall back to `portable`.
//! * `simd128` and `relaxed` (wasm32 builds with `+simd128`, and `+relaxed-simd` for the
//!   second; the browser package): the same integer dot products on interleaved tiles in
//!   128-bit vectors ([`super::wasm`]), SIMD128's widening products or relaxed SIMD's byte dot
//!   product; types they do not cover fall back to `portable`.
//! * `portable` (default elsewhere): the quantized activations are expanded back to the exact
//!   f32 values they represent, each weight row is decoded to f32 once and reused across the
//!   batch, and the products are summed in f32.
//! * `oracle`: the scalar integer dot products of [`crate::quant::vec_dot`], per pair. Tests
//!   compare the others against it.

use super::tile::{prepare_blocks, prepare_values};
pub use super::tile::{Activations, Layout, PrepareFn, TileFn, TileOut};
use crate::quant::{self, GgmlType};

/// Weight types the AVX2 integer/F16C kernels cover (others use the portable path), from
/// [`quant::support`]; the kernel tests and `cargo bench --bench kernels` iterate over them.
pub fn simd_types() -> Vec<GgmlType> {
    quant::supported(|s| s.cpu_simd)
}

/// The kernel set of a backend.
#[derive(Debug, Clone, Copy)]
pub struct Kernels {
    pub prepare: PrepareFn,
    pub tile: TileFn,
    /// Whether weights of a type are best interleaved at load ([`Layout::Interleaved`]).
    pub interleaves: fn(GgmlType) -> bool,
    /// `gate[i] = silu(gate[i]) · up[i]` (the SwiGLU gate).
    pub swiglu: fn(gate: &mut [f32], up: &[f32]),
    /// `x[i] = silu(x[i])` (the recurrent layers' conv output and gated norm).
    pub silu: fn(x: &mut [f32]),
    /// Name of the variant (`avx2`, `avxvnni`, `avx512vnni`, `avx512`, `relaxed`, `simd128`, `portable`,
    /// `oracle`).
    pub variant: &'static str,
}

impl Kernels {
    /// The best kernels this CPU supports. The environment variable `TINYLLM_CPU_KERNELS`
    /// (`portable`, `oracle`, `avx2` for the AVX2 set without VNNI, `avxvnni`, `avx512vnni`,
    /// `avx512`) overrides the choice, for comparisons and bisecting; a set this CPU lacks gives
    /// the best it has.
    pub fn detect() -> Self {
        let choice = std::env::var("TINYLLM_CPU_KERNELS");
        match choice.as_deref() {
            // `fast` was this set's name before it was called what it is.
            Ok("portable" | "fast") => return Self::portable(),
            Ok("oracle") => return Self::oracle(),
            _ => {}
        }
        #[cfg(target_arch = "x86_64")]
        {
            use super::simd::Isa;
            let best = Isa::vnni().first().copied().unwrap_or(Isa::Avx2);
            let isa = match choice.as_deref() {
                Ok("avx2") => Isa::Avx2,
                Ok("avxvnni") => Isa::AvxVnni,
                Ok("avx512vnni") => Isa::Avx512Vnni,
                Ok("avx512") => Isa::Avx512,
                _ => best,
            };
            if let Some(k) = Self::simd(isa).or_else(|| Self::simd(best)) {
                return k;
            }
        }
        #[cfg(all(target_arch = "wasm32", target_feature = "relaxed-simd"))]
        if choice.as_deref() != Ok("simd128") {
            return Self::relaxed();
        }
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        return Self::simd128();
        #[allow(unreachable_code)]
        Self::portable()
    }

    /// The WebAssembly SIMD128 kernels ([`super::wasm::Simd128`]).
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    pub fn simd128() -> Self {
        Kernels {
            prepare: prepare_wasm,
            tile: tile_wasm::<super::wasm::Simd128>,
            interleaves: super::wasm::interleaves,
            swiglu: super::wasm::activation::swiglu,
            silu: super::wasm::activation::silu,
            variant: "simd128",
        }
    }

    /// The WebAssembly relaxed-SIMD kernels ([`super::wasm::Relaxed`]).
    #[cfg(all(target_arch = "wasm32", target_feature = "relaxed-simd"))]
    pub fn relaxed() -> Self {
        Kernels {
            tile: tile_wasm::<super::wasm::Relaxed>,
            variant: "relaxed",
            ..Self::simd128()
        }
    }

    /// The AVX2 kernels with `isa`'s dot products, where the CPU has both.
    #[cfg(target_arch = "x86_64")]
    pub fn simd(isa: super::simd::Isa) -> Option<Self> {
        use super::simd::Isa;
        if !super::simd::available() || (isa != Isa::Avx2 && !Isa::vnni().contains(&isa)) {
            return None;
        }
        let (tile, variant): (TileFn, _) = match isa {
            Isa::Avx2 => (tile_avx2::<{ Isa::Avx2 as u8 }>, "avx2"),
            Isa::AvxVnni => (tile_avx2::<{ Isa::AvxVnni as u8 }>, "avxvnni"),
            Isa::Avx512Vnni => (tile_avx2::<{ Isa::Avx512Vnni as u8 }>, "avx512vnni"),
            Isa::Avx512 => (tile_avx2::<{ Isa::Avx512 as u8 }>, "avx512"),
        };
        Some(Kernels {
            prepare: prepare_avx2,
            tile,
            interleaves: super::simd::interleaves,
            swiglu: swiglu_avx2,
            silu: silu_avx2,
            variant,
        })
    }

    /// Decode each weight row to f32, f32 dot products (the portable default).
    pub fn portable() -> Self {
        Kernels {
            prepare: prepare_values,
            tile: tile_portable,
            interleaves: |_| false,
            swiglu: swiglu_scalar,
            silu: silu_scalar,
            variant: "portable",
        }
    }

    /// The reference kernels built on [`crate::quant::vec_dot`].
    pub fn oracle() -> Self {
        Kernels {
            prepare: prepare_blocks,
            tile: tile_oracle,
            interleaves: |_| false,
            swiglu: swiglu_scalar,
            silu: silu_scalar,
            variant: "oracle",
        }
    }
}

/// AVX2 activations: quantized blocks for the types [`super::simd`] covers, f32 values for the
/// rest (which fall back to the decoded-row path).
#[cfg(target_arch = "x86_64")]
fn prepare_avx2(ty: GgmlType, x: &[f32], k: usize) -> Result<Activations, quant::QuantError> {
    if !super::simd::supports(ty) {
        return prepare_values(ty, x, k);
    }
    // SAFETY: `Kernels::simd` picks this function only after `simd::available()`.
    unsafe { super::simd::q8::prepare(ty, x, k) }
}

/// Activations of the wasm kernels: quantized blocks (with f32 scales and block sums) for the
/// block formats they cover, f32 values for the float formats and the rest.
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
fn prepare_wasm(ty: GgmlType, x: &[f32], k: usize) -> Result<Activations, quant::QuantError> {
    if super::wasm::quantizes(ty) {
        super::wasm::prepare(ty, x, k)
    } else {
        prepare_values(ty, x, k)
    }
}

#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
fn tile_wasm<D: super::wasm::Dot>(
    ty: GgmlType,
    layout: Layout,
    k: usize,
    w: &[u8],
    act: &Activations,
    out: &mut TileOut<'_>,
) {
    if super::wasm::supports(ty) {
        // The backend interleaves every type the kernels read so at load; file rows of such a
        // type (never given) would be interleaved here.
        let interleaves = super::wasm::interleaves(ty);
        let tiles = match layout {
            Layout::Interleaved if interleaves => std::borrow::Cow::Borrowed(w),
            Layout::Interleaved => return out.fill(f32::NAN),
            Layout::Rows if !interleaves => std::borrow::Cow::Borrowed(w),
            Layout::Rows => match super::interleave::interleave(ty, k, w) {
                Some(t) => std::borrow::Cow::Owned(t),
                None => return out.fill(f32::NAN),
            },
        };
        if !super::wasm::tile::<D>(ty, k, &tiles, act, out) {
            out.fill(f32::NAN);
        }
        return;
    }
    tile_portable(ty, layout, k, w, act, out);
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

/// The scalar SiLU ([`super::ops::silu`]), the slow twin of the AVX2 one.
pub fn silu_scalar(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = super::ops::silu(*v));
}

#[cfg(target_arch = "x86_64")]
fn silu_avx2(x: &mut [f32]) {
    // SAFETY: as in `prepare_avx2`.
    unsafe { super::simd::activation::silu(x) }
}

/// The AVX2 tile with the dot products of ISA (a [`super::simd::Isa`] discriminant).
#[cfg(target_arch = "x86_64")]
fn tile_avx2<const ISA: u8>(
    ty: GgmlType,
    layout: Layout,
    k: usize,
    w: &[u8],
    act: &Activations,
    out: &mut TileOut<'_>,
) {
    let isa = super::simd::Isa::ALL[usize::from(ISA)];
    // SAFETY: as in `prepare_avx2`; `Kernels::simd` picks a VNNI ISA only where the CPU has it.
    if super::simd::supports(ty) {
        if !unsafe { super::simd::tile(ty, layout, k, w, act, out, isa) } {
            out.fill(f32::NAN);
        }
        return;
    }
    let w = file_rows(ty, layout, k, w, out);
    let mut scratch = vec![0f32; k];
    for_rows(k, &w, act, out, |wr, o| {
        row_portable_avx2(ty, k, wr, act, &mut scratch, o)
    });
}

/// The weight rows of a tile in the file layout (copied out of interleaved tiles: the portable
/// kernels never get those from the backend, which interleaves only for kernel sets that ask).
fn file_rows<'a>(ty: GgmlType, layout: Layout, k: usize, w: &'a [u8], out: &TileOut<'_>) -> std::borrow::Cow<'a, [u8]> {
    match layout {
        Layout::Rows => std::borrow::Cow::Borrowed(w),
        Layout::Interleaved => std::borrow::Cow::Owned(super::interleave::rows(ty, k, w, out.nw())),
    }
}

/// Run `row(weight_row, outputs)` for each whole weight row of `w`, `outputs` holding one value
/// per activation row, scattered into `out` afterwards.
fn for_rows(k: usize, w: &[u8], act: &Activations, out: &mut TileOut<'_>, mut row: impl FnMut(&[u8], &mut [f32])) {
    let rb = w.len().checked_div(out.nw()).unwrap_or(0);
    if rb == 0 || k == 0 || out.rows() != act.rows {
        out.fill(f32::NAN);
        return;
    }
    let mut col = vec![0f32; out.rows()];
    for (i, wr) in w.chunks_exact(rb).take(out.nw()).enumerate() {
        row(wr, &mut col);
        for (a, &v) in col.iter().enumerate() {
            out.set(a, i, v);
        }
    }
}

fn tile_portable(ty: GgmlType, layout: Layout, k: usize, w: &[u8], act: &Activations, out: &mut TileOut<'_>) {
    let w = file_rows(ty, layout, k, w, out);
    let mut scratch = vec![0f32; k];
    for_rows(k, &w, act, out, |wr, o| row_portable(ty, k, wr, act, &mut scratch, o));
}

fn tile_oracle(ty: GgmlType, layout: Layout, k: usize, w: &[u8], act: &Activations, out: &mut TileOut<'_>) {
    let w = file_rows(ty, layout, k, w, out);
    for_rows(k, &w, act, out, |wr, o| row_oracle(ty, k, wr, act, o));
}

/// Decode the weight row once, then f32 dot products. A decode error cannot happen (lengths
/// were validated when the weight was placed); it would show as NaN, not a panic.
fn row_portable(ty: GgmlType, k: usize, w: &[u8], act: &Activations, scratch: &mut [f32], out: &mut [f32]) {
    row_portable_body(ty, k, w, act, scratch, out);
}

/// [`row_portable`] compiled for AVX2: the same code, so the same results, in wider vectors.
#[cfg(target_arch = "x86_64")]
fn row_portable_avx2(ty: GgmlType, k: usize, w: &[u8], act: &Activations, scratch: &mut [f32], out: &mut [f32]) {
    #[target_feature(enable = "avx2,fma")]
    unsafe fn inner(ty: GgmlType, k: usize, w: &[u8], act: &Activations, scratch: &mut [f32], out: &mut [f32]) {
        row_portable_body(ty, k, w, act, scratch, out);
    }
    // SAFETY: `Kernels::detect` picks this function only after checking AVX2 and FMA.
    unsafe { inner(ty, k, w, act, scratch, out) }
}

#[inline(always)]
fn row_portable_body(ty: GgmlType, k: usize, w: &[u8], act: &Activations, scratch: &mut [f32], out: &mut [f32]) {
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
