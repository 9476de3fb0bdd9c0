//! One op-level suite for every backend: each op of the `Backend` trait runs on the CPU backend
//! and on the WebGPU backend over odd shapes, and is compared by normalized mean squared error
//! with an independent scalar reference (matmul and embedding: rows dequantized by
//! `tinyllm::quant`, the block-struct oracle, then f64 dot products) or with the CPU backend's
//! scalar ops (the rest). Weights are random but valid GGUF blocks of every format the WebGPU
//! kernels decode, written into an in-memory GGUF file.
//!
//! The WebGPU half needs an adapter (Mesa lavapipe in CI). Without one the tests print why and
//! pass, unless `TINYLLM_REQUIRE_GPU=1`, where they fail.

mod common;
#[path = "common/rounding.rs"]
mod rounding;

use std::sync::Arc;

use common::rng::Rng;

use half::f16;
use tinyllm::backend::cpu::CpuBackend;
use tinyllm::backend::vulkan::{VulkanBackend, VulkanOptions};
use tinyllm::backend::webgpu::{kernels, MatmulVariant, WebGpuBackend, WebGpuOptions};
use tinyllm::backend::{AttnParams, Backend, KvType, Rope, RopeKind, RopeScaling, SeqAttn, Yarn};
use tinyllm::gguf::GgufFile;
use tinyllm::quant::GgmlType;

/// The f32 path's bound (the acceptance criterion).
const NMSE_F32: f64 = 1e-6;
/// Bound for the f16-product matmul variant (11-bit operands).
const NMSE_F16: f64 = 1e-5;

/// The WebGPU backend, or `None` (with the reason printed) when there is no adapter and
/// `TINYLLM_REQUIRE_GPU` is not `1`.
fn gpu_with(opts: WebGpuOptions) -> Option<WebGpuBackend> {
    common::device_or_skip(|| WebGpuBackend::with_options(opts))
}

fn gpu() -> Option<WebGpuBackend> {
    gpu_with(WebGpuOptions::default())
}

fn nmse(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let err: f64 = got.iter().zip(want).map(|(&a, &b)| (f64::from(a) - b).powi(2)).sum();
    let norm: f64 = want.iter().map(|b| b * b).sum();
    err / norm.max(f64::MIN_POSITIVE)
}

/// [`nmse`] of the values that are numbers, NaN unless both sides are NaN at the same places
/// (routing a row of NaN scores gives NaN weights on every backend).
fn nmse_with_nan(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    if got.iter().zip(want).any(|(a, b)| a.is_nan() != b.is_nan()) {
        return f64::NAN;
    }
    let (g, w): (Vec<f32>, Vec<f64>) = got
        .iter()
        .zip(want)
        .filter(|(a, _)| !a.is_nan())
        .map(|(&a, &b)| (a, f64::from(b)))
        .unzip();
    nmse(&g, &w)
}

fn widen(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

/// Byte offsets, within one block, of the f16 scales of `ty` (set to sane values so random
/// blocks decode to finite numbers).
fn scale_fields(ty: GgmlType) -> &'static [usize] {
    use GgmlType::*;
    match ty {
        Q4_0 | Q5_0 | Q8_0 | IQ4_NL | IQ4_XS | Q1_0 | IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ1_S => &[0],
        Q4_1 | Q5_1 | Q4_K | Q5_K => &[0, 2],
        Q6_K => &[208],
        Q2_K => &[80, 82],
        Q3_K => &[108],
        TQ1_0 => &[52],
        TQ2_0 => &[64],
        _ => &[],
    }
}

/// `n_out` random rows of `n_in` values of type `ty` as raw GGUF bytes.
fn random_matrix(rng: &mut Rng, ty: GgmlType, n_in: usize, n_out: usize) -> Vec<u8> {
    let n = n_in * n_out;
    match ty {
        GgmlType::F32 => rng.vec(n, 1.0).iter().flat_map(|v| v.to_le_bytes()).collect(),
        GgmlType::F16 => rng
            .vec(n, 1.0)
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect(),
        GgmlType::BF16 => rng
            .vec(n, 1.0)
            .iter()
            .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
            .collect(),
        _ => {
            let (bs, bb) = (ty.block_size(), ty.block_bytes());
            let mut bytes: Vec<u8> = (0..n / bs * bb).map(|_| rng.next() as u8).collect();
            for block in bytes.chunks_exact_mut(bb) {
                for &o in scale_fields(ty) {
                    let d = f16::from_f32(0.002 + 0.02 * rng.f().abs());
                    block[o..o + 2].copy_from_slice(&d.to_le_bytes());
                }
                if ty == GgmlType::IQ1_M {
                    // The scale is an f16 spread over the top nibbles of four u16 at 48..56.
                    let d = f16::from_f32(0.002 + 0.02 * rng.f().abs()).to_bits();
                    for k in 0..4 {
                        let nibble = ((d >> (4 * k)) & 0xf) as u8;
                        block[49 + 2 * k] = (block[49 + 2 * k] & 0x0f) | (nibble << 4);
                    }
                }
                if ty == GgmlType::MXFP4 {
                    // An E8M0 exponent byte: scales 2^-9 .. 2^-2 (and a subnormal one now and
                    // then: e 0 or 1).
                    block[0] = if rng.next().is_multiple_of(16) {
                        (rng.next() % 2) as u8
                    } else {
                        119 + (rng.next() % 8) as u8
                    };
                }
            }
            bytes
        }
    }
}

/// An in-memory GGUF file holding `tensors` (name, GGUF shape, type, bytes).
fn gguf(tensors: &[(String, Vec<u64>, GgmlType, Vec<u8>)]) -> Arc<GgufFile> {
    let mut w = common::GgufWriter::new();
    let mut data = Vec::new();
    for (name, shape, ty, bytes) in tensors {
        let off = data.len() as u64;
        w.tensor_at(name, shape, *ty as u32, bytes.len() as u64, off);
        data.extend_from_slice(bytes);
        data.resize(data.len().div_ceil(32) * 32, 0);
    }
    Arc::new(GgufFile::from_bytes(w.finish_with(&data)).expect("test gguf"))
}

/// The oracle: rows of tensor `name` dequantized by `tinyllm::quant`.
/// `x` (`rows` × `k`) times the dequantized weight `wd` (`n_out` × `k`, type `ty`),
/// `[rows][n_out]`, in f64 products and sums, after rounding `x` as both backends (and ggml)
/// round activations for `ty` (`rounding::rounded_activations`).
fn reference_matmul(ty: GgmlType, wd: &[f32], x: &[f32], rows: usize, n_out: usize, k: usize) -> Vec<f64> {
    let x = &rounding::rounded_activations(ty, x);
    (0..rows)
        .flat_map(|r| {
            (0..n_out).map(move |o| {
                (0..k)
                    .map(|i| f64::from(wd[o * k + i]) * f64::from(x[r * k + i]))
                    .sum::<f64>()
            })
        })
        .collect()
}

fn dequantized(file: &GgufFile, name: &str) -> Vec<f32> {
    file.tensor(name).expect("tensor").to_f32().expect("dequantize")
}

fn upload<B: Backend>(be: &B, v: &[f32]) -> B::Buffer {
    let mut b = be.alloc(v.len()).expect("alloc");
    be.write(&mut b, v).expect("write");
    b
}

fn download<B: Backend>(be: &B, b: &B::Buffer, n: usize) -> Vec<f32> {
    be.read(b, n).expect("read").wait().expect("readback")
}

fn try_matmul<B: Backend>(
    be: &B,
    file: &Arc<GgufFile>,
    name: &str,
    x: &[f32],
    rows: usize,
    n_out: usize,
) -> Result<Vec<f32>, tinyllm::backend::BackendError> {
    let w = be.load_weight(file, name)?;
    let xb = upload(be, x);
    let mut out = be.alloc(rows * n_out + 3)?;
    be.matmul(&w, &xb, rows, &mut out)?;
    Ok(download(be, &out, rows * n_out))
}

fn run_matmul<B: Backend>(be: &B, file: &Arc<GgufFile>, name: &str, x: &[f32], rows: usize, n_out: usize) -> Vec<f32> {
    try_matmul(be, file, name, x, rows, n_out).expect("matmul")
}

fn run_embed<B: Backend>(be: &B, file: &Arc<GgufFile>, name: &str, tokens: &[u32], width: usize) -> Vec<f32> {
    let w = be.load_weight(file, name).expect("load weight");
    let mut out = be.alloc(tokens.len() * width).expect("alloc");
    be.embed(&w, tokens, 0.75, &mut out).expect("embed");
    download(be, &out, tokens.len() * width)
}

/// Row length for `ty`: a few blocks, or an odd length for the float formats.
fn odd_width(ty: GgmlType) -> usize {
    match ty.block_size() {
        // Not a multiple of 4: the scalar-load matmul variants and the texture fallback.
        1 => 99,
        bs => bs * if bs == 256 { 3 } else { 7 },
    }
}

/// A file with one random `[n_out][odd_width]` matrix of every WGSL-supported format, each
/// named by its format.
fn every_format(rng: &mut Rng, n_out: usize) -> Arc<GgufFile> {
    let tensors: Vec<_> = kernels::quant_types()
        .into_iter()
        .map(|ty| {
            let k = odd_width(ty);
            (
                ty.name().to_string(),
                vec![k as u64, n_out as u64],
                ty,
                random_matrix(rng, ty, k, n_out),
            )
        })
        .collect();
    gguf(&tensors)
}

/// Matmul (every variant: workgroup with subgroup or workgroup-memory reduction, f32 or vec4
/// activation loads by row width; rows; texture) and embedding of every format the WebGPU
/// kernels decode, and the CPU backend's matmul: against the oracle, which rounds the
/// activations as ggml does for the weight format (Q8_0/Q8_K blocks, f16) and then multiplies
/// exactly, so what remains is f32 arithmetic (NMSE < 1e-6; unrounded activations would be
/// about 1e-5 off).
#[test]
fn matmul_and_embed_match_the_dequantization_oracle() {
    let Some(g) = gpu_with(WebGpuOptions {
        matmul: Some(MatmulVariant::Workgroup),
        f16_matmul: Some(false),
        ..Default::default()
    }) else {
        return;
    };
    let Some(g_rows) = gpu_with(WebGpuOptions {
        matmul: Some(MatmulVariant::Rows),
        ..Default::default()
    }) else {
        return;
    };
    let Some(g_tex) = gpu_with(WebGpuOptions {
        matmul: Some(MatmulVariant::Texture),
        ..Default::default()
    }) else {
        return;
    };
    // The workgroup kernel reducing in workgroup memory (g reduces with subgroup operations
    // where the device has them).
    let Some(g_wg_plain) = gpu_with(WebGpuOptions {
        matmul: Some(MatmulVariant::Workgroup),
        no_subgroups: true,
        f16_matmul: Some(false),
        ..Default::default()
    }) else {
        return;
    };
    // The workgroup kernel multiplying in f16 (where the device has shader-f16: the default).
    let Some(g_f16) = gpu_with(WebGpuOptions {
        matmul: Some(MatmulVariant::Workgroup),
        ..Default::default()
    }) else {
        return;
    };
    let has_f16 = g_f16.adapter().features.iter().any(|f| f == "shader_f16");
    // Activations multiplied as they are (`round_activations` off).
    let Some(g_unrounded) = gpu_with(WebGpuOptions {
        round_activations: Some(false),
        ..Default::default()
    }) else {
        return;
    };
    // The texture kernel without subgroups (the same as g_tex where the device has none).
    let Some(g_lane) = gpu_with(WebGpuOptions {
        matmul: Some(MatmulVariant::Texture),
        no_subgroups: true,
        ..Default::default()
    }) else {
        return;
    };
    let cpu = CpuBackend::new(2).expect("cpu");
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let n_out = 37;
    let file = every_format(&mut rng, n_out);
    let mut failures = Vec::new();
    for ty in kernels::quant_types() {
        let (name, k) = (ty.name(), odd_width(ty));
        let wd = dequantized(&file, name);
        for rows in [1usize, 5, 13, 35] {
            let x = rng.vec(rows * k, 1.0);
            let want = reference_matmul(ty, &wd, &x, rows, n_out, k);
            let got = run_matmul(&g, &file, name, &x, rows, n_out);
            let e_gpu = nmse(&got, &want);
            let y_rows = run_matmul(&g_rows, &file, name, &x, rows, n_out);
            let y_tex = run_matmul(&g_tex, &file, name, &x, rows, n_out);
            let y_lane = run_matmul(&g_lane, &file, name, &x, rows, n_out);
            // The texture variant sums in the rows variant's order: the same bits.
            let bits = |y: &[f32]| y.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            if bits(&y_tex) != bits(&y_rows) || bits(&y_lane) != bits(&y_rows) {
                failures.push(format!("matmul {name} rows {rows}: texture and rows variants differ"));
            }
            // Without the rounding, against the oracle over the unrounded activations.
            let e_unrounded = nmse(
                &run_matmul(&g_unrounded, &file, name, &x, rows, n_out),
                &reference_matmul(GgmlType::F32, &wd, &x, rows, n_out, k),
            );
            if e_unrounded.is_nan() || e_unrounded > NMSE_F32 {
                failures.push(format!("matmul {name} rows {rows} unrounded: NMSE {e_unrounded:.2e}"));
            }
            let (e_rows, e_tex, e_lane) = (nmse(&y_rows, &want), nmse(&y_tex, &want), nmse(&y_lane, &want));
            let e_plain = nmse(&run_matmul(&g_wg_plain, &file, name, &x, rows, n_out), &want);
            let y_f16 = run_matmul(&g_f16, &file, name, &x, rows, n_out);
            let e_f16 = nmse(&y_f16, &want);
            // f16 products round activations and weights to 11 bits: about 1e-7; and they
            // must show (rows of a multiple of 4 values take the f16 variant), except for the
            // codebook formats, which multiply in f32 there (strategy.rs): the f32 kernel's bits.
            let codebook = kernels::codebook(ty);
            if codebook {
                if bits(&y_f16) != bits(&got) {
                    failures.push(format!("matmul {name} rows {rows}: f16 products on a codebook format"));
                }
            } else if e_f16.is_nan() || e_f16 > NMSE_F16 || (has_f16 && k % 4 == 0 && e_f16 < 1e-11) {
                failures.push(format!("matmul {name} rows {rows} in f16: NMSE {e_f16:.2e}"));
            }
            // The CPU backend rounds activations by the same rule (formats it multiplies).
            let e_cpu = match try_matmul(&cpu, &file, name, &x, rows, n_out) {
                Ok(c) => {
                    let e = nmse(&c, &want);
                    if e.is_nan() || e > NMSE_F32 {
                        failures.push(format!("matmul {name} rows {rows} on the cpu: NMSE {e:.2e}"));
                    }
                    format!("{e:.1e}")
                }
                Err(e) => format!("n/a: {e}"),
            };
            println!(
                "[ops] matmul {name:>6} {n_out}x{k} rows {rows:>2}: NMSE webgpu workgroup {e_gpu:.1e} (without subgroups {e_plain:.1e}, f16 {e_f16:.1e}), rows {e_rows:.1e}, texture {e_tex:.1e} (without subgroups {e_lane:.1e}) (cpu {e_cpu})"
            );
            for e in [e_gpu, e_plain, e_rows, e_tex, e_lane] {
                if e.is_nan() || e > NMSE_F32 {
                    failures.push(format!("matmul {name} rows {rows}: NMSE {e:.2e}"));
                }
            }
        }
        let tokens = [3u32, 0, 36, 3, 17];
        let want: Vec<f64> = tokens
            .iter()
            .flat_map(|&t| {
                wd[t as usize * k..(t as usize + 1) * k]
                    .iter()
                    .map(|&v| f64::from(v * 0.75))
            })
            .collect();
        for (variant, be) in [("workgroup", &g), ("texture", &g_tex)] {
            let got = run_embed(be, &file, name, &tokens, k);
            let e = nmse(&got, &want);
            println!("[ops] embed  {name:>6} width {k}: NMSE webgpu {variant} {e:.1e}");
            if e.is_nan() || e > 1e-12 {
                failures.push(format!("embed {name} ({variant}): NMSE {e:.2e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Weights larger than one binding are split by rows; matmul and embedding cross the parts.
#[test]
fn split_weights_match_unsplit() {
    let ty = GgmlType::Q8_0;
    let (k, n_out) = (96, 29);
    let row_bytes = (k / 32 * 34) as u64;
    let Some(g) = gpu_with(WebGpuOptions {
        max_binding: Some(row_bytes * 4),
        ..Default::default()
    }) else {
        return;
    };
    let mut rng = Rng(77);
    let file = gguf(&[(
        "w".into(),
        vec![k as u64, n_out as u64],
        ty,
        random_matrix(&mut rng, ty, k, n_out),
    )]);
    let w = g.load_weight(&file, "w").expect("load");
    assert_eq!(
        w.parts(),
        n_out.div_ceil(4),
        "the weight should be split into parts of 4 rows"
    );
    let wd = dequantized(&file, "w");
    let rows = 3;
    let x = rng.vec(rows * k, 1.0);
    let want = reference_matmul(ty, &wd, &x, rows, n_out, k);
    let e = nmse(&run_matmul(&g, &file, "w", &x, rows, n_out), &want);
    println!("[ops] split matmul ({} parts): NMSE {e:.1e}", w.parts());
    assert!(e < NMSE_F32, "split matmul NMSE {e:.2e}");
    let tokens = [0u32, 28, 5, 4, 3];
    let want: Vec<f64> = tokens
        .iter()
        .flat_map(|&t| {
            wd[t as usize * k..(t as usize + 1) * k]
                .iter()
                .map(|&v| f64::from(v * 0.75))
        })
        .collect();
    let e = nmse(&run_embed(&g, &file, "w", &tokens, k), &want);
    assert!(e < 1e-12, "split embed NMSE {e:.2e}");
}

/// The texture matmul's edges: rows too long for its activation window or not a whole number of
/// vec4s go to the buffer kernel instead, and rows long enough that fewer than 8 fit the
/// window pass through it in smaller tiles. Each against the oracle.
#[test]
fn texture_matmul_edges_match_the_oracle() {
    let Some(g) = gpu_with(WebGpuOptions {
        matmul: Some(MatmulVariant::Texture),
        ..Default::default()
    }) else {
        return;
    };
    let mut rng = Rng(4242);
    let n_out = 19;
    // (type, row length, activation rows): 99 is not a multiple of 4, 16416 exceeds the 16384
    // values of the window, 3072 fits 5 rows per tile (13 rows: tiles of 5, 5 and 3).
    let cases = [
        (GgmlType::F32, 99, 3),
        (GgmlType::Q8_0, 16416, 2),
        (GgmlType::Q5_0, 3072, 13),
    ];
    let tensors: Vec<_> = cases
        .iter()
        .enumerate()
        .map(|(i, &(ty, k, _))| {
            (
                format!("w{i}"),
                vec![k as u64, n_out as u64],
                ty,
                random_matrix(&mut rng, ty, k, n_out),
            )
        })
        .collect();
    let file = gguf(&tensors);
    for (i, &(ty, k, rows)) in cases.iter().enumerate() {
        let name = format!("w{i}");
        let wd = dequantized(&file, &name);
        let x = rng.vec(rows * k, 1.0);
        let want = reference_matmul(ty, &wd, &x, rows, n_out, k);
        let e = nmse(&run_matmul(&g, &file, &name, &x, rows, n_out), &want);
        println!("[ops] texture-variant matmul {ty} {n_out}x{k} rows {rows}: NMSE {e:.1e}");
        assert!(e < NMSE_F32, "{ty} {k} wide, {rows} rows: NMSE {e:.2e}");
    }
}

/// Vectors for the element-wise ops.
fn vectors_file(rng: &mut Rng, g: usize, n_rot_half: usize) -> Arc<GgufFile> {
    let f32b = |v: Vec<f32>| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    gguf(&[
        ("norm".into(), vec![g as u64], GgmlType::F32, f32b(rng.vec(g, 1.5))),
        ("bias".into(), vec![g as u64], GgmlType::F32, f32b(rng.vec(g, 0.5))),
        (
            "factors".into(),
            vec![n_rot_half as u64],
            GgmlType::F32,
            f32b((0..n_rot_half).map(|i| 1.0 + i as f32 * 0.37).collect()),
        ),
        (
            "sinks".into(),
            vec![ATTN_HEADS as u64],
            GgmlType::F32,
            f32b(rng.vec(ATTN_HEADS, 4.0)),
        ),
    ])
}

/// The rope variants the suites run: both layouts, partial rotation, linear, llama3 (with the
/// frequency factors) and YaRN scaling.
fn ropes(hd: usize) -> Vec<Rope> {
    let yarn = Yarn {
        factor: 8.0,
        n_ctx_orig: 256,
        ext_factor: 1.0,
        attn_factor: 0.9,
        beta_fast: 32.0,
        beta_slow: 1.0,
    };
    vec![
        Rope::new(RopeKind::Norm, hd, 10000.0),
        Rope {
            scaling: RopeScaling::Linear { factor: 2.0 },
            ..Rope::new(RopeKind::Neox, hd, 10000.0)
        },
        Rope {
            scaling: RopeScaling::Llama3,
            ..Rope::new(RopeKind::Neox, 16, 500000.0)
        },
        Rope {
            scaling: RopeScaling::Yarn(yarn),
            ..Rope::new(RopeKind::Neox, hd, 150000.0)
        },
        Rope {
            scaling: RopeScaling::Yarn(yarn),
            ..Rope::new(RopeKind::Norm, 16, 10000.0)
        },
    ]
}

/// Row positions of the rope tests: large angles, and rows out of order (a batch of several
/// sequences ropes each row at its own position).
const ROPE_POSITIONS: [u32; 3] = [1000, 3, 517];

/// The element-wise and per-row ops on one backend; every result in order, with its name.
fn elementwise_suite<B: Backend>(be: &B, file: &Arc<GgufFile>, seed: u64) -> Vec<(String, Vec<f32>)> {
    let mut rng = Rng(seed);
    let (g, groups) = (97, 7);
    let n = g * groups;
    let x = rng.vec(n, 3.0);
    let y = rng.vec(n, 3.0);
    let norm = be.load_weight(file, "norm").unwrap();
    let bias = be.load_weight(file, "bias").unwrap();
    let factors = be.load_weight(file, "factors").unwrap();
    let mut res = Vec::new();
    let xb = || upload(be, &x);
    let yb = upload(be, &y);

    let mut a = xb();
    be.add(&mut a, &yb, n - 5).unwrap();
    res.push(("add".into(), download(be, &a, n)));
    let mut a = xb();
    be.scale(&mut a, n, -0.3).unwrap();
    res.push(("scale".into(), download(be, &a, n)));
    let mut a = xb();
    be.add_bias(&mut a, &bias, groups).unwrap();
    res.push(("add_bias".into(), download(be, &a, n)));
    let mut a = xb();
    be.swiglu(&mut a, &yb, n).unwrap();
    res.push(("swiglu".into(), download(be, &a, n)));
    // GELU over a wide range, including the |x| >= 10 shortcuts.
    let wide: Vec<f32> = x.iter().map(|v| v * 4.0).collect();
    let mut a = upload(be, &wide);
    be.geglu(&mut a, &yb, n).unwrap();
    res.push(("geglu".into(), download(be, &a, n)));
    let mut a = xb();
    be.sigmoid_mul(&mut a, &upload(be, &wide), n - 3).unwrap();
    res.push(("sigmoid_mul".into(), download(be, &a, n)));
    let mut o = be.alloc(n).unwrap();
    be.rmsnorm(&xb(), &norm, groups, 1e-6, &mut o).unwrap();
    res.push(("rmsnorm".into(), download(be, &o, n)));
    let mut a = xb();
    be.rmsnorm_inplace(&mut a, &norm, groups, 1e-5).unwrap();
    res.push(("rmsnorm_inplace".into(), download(be, &a, n)));
    // Walsh-Hadamard rotations of whole groups (the q8_0 cache's), values past them untouched.
    let h = rng.vec(3 * 512 + 5, 3.0);
    for hn in [2, 64, 128, 256, 512] {
        let mut a = upload(be, &h);
        be.hadamard(&mut a, 3 * 512 / hn, hn).unwrap();
        res.push((format!("hadamard_{hn}"), download(be, &a, h.len())));
    }

    // Rope: 3 rows of 5 heads of 22, each at its own position.
    let (nh, hd) = (5, 22);
    let rx = rng.vec(ROPE_POSITIONS.len() * nh * hd, 2.0);
    for rope in ropes(hd) {
        let mut a = upload(be, &rx);
        let f = rope.wants_factors().then_some(&factors);
        be.rope(&mut a, nh, hd, &ROPE_POSITIONS, &rope, f).unwrap();
        res.push((format!("rope {rope:?}"), download(be, &a, rx.len())));
    }

    // copy_rows / paste_rows / argmax (with ties: the first wins).
    let mut o = be.alloc(3 * g).unwrap();
    be.copy_rows(&xb(), 2, 3, g, &mut o).unwrap();
    res.push(("copy_rows".into(), download(be, &o, 3 * g)));
    let mut a = xb();
    be.paste_rows(&yb, 2, g, &mut a, 4).unwrap();
    res.push(("paste_rows".into(), download(be, &a, n)));
    let mut t = x.clone();
    t[5] = 100.0;
    t[50] = 100.0;
    t[g + 3] = f32::NAN;
    let am = be.argmax(&upload(be, &t), groups, g).unwrap().wait().unwrap();
    res.push(("argmax".into(), am.iter().map(|&i| i as f32).collect()));
    res.extend(expert_ops(be, file, &mut rng));
    res
}

/// The ops of routed experts besides matmul_id: gpt-oss's clamped SwiGLU, routing by every
/// gating (with the selection-only bias, ties, a row of NaN scores, norm and scale), the
/// weighted sum of expert outputs, and strided copies; results in order, ids named `... ids`.
fn expert_ops<B: Backend>(be: &B, file: &Arc<GgufFile>, rng: &mut Rng) -> Vec<(String, Vec<f32>)> {
    use tinyllm::backend::{Gating, Route, Strided};
    let mut res = Vec::new();
    // Gates and ups beyond the clamp limit on both sides.
    let n = 301;
    let (gate, up) = (rng.vec(n, 12.0), rng.vec(n, 12.0));
    let mut a = upload(be, &gate);
    be.swiglu_oai(&mut a, &upload(be, &up), n, 1.702, 7.0).unwrap();
    res.push(("swiglu_oai".into(), download(be, &a, n)));

    // 8 experts (the bias is the 8 `factors`), 5 rows: random, ties, one NaN, all NaN.
    let (ne, rows) = (8, 5);
    let mut logits = rng.vec(ne * rows, 4.0);
    logits[ne..2 * ne].copy_from_slice(&[0.5, 2.0, 2.0, -1.0, 2.0, 0.0, 0.5, 0.5]);
    logits[2 * ne + 3] = f32::NAN;
    logits[3 * ne..4 * ne].fill(f32::NAN);
    let lb = upload(be, &logits);
    let bias = be.load_weight(file, "factors").unwrap();
    let gatings = [
        (Gating::Softmax, true, 1.0, false),
        (Gating::Softmax, false, 0.0, false),
        (Gating::Sigmoid, true, 2.5, true),
        (Gating::Sigmoid, false, 1.0, false),
        (Gating::SoftmaxWeight, false, 1.0, false),
    ];
    for (gating, norm, scale, with_bias) in gatings {
        for k in [1, 3, ne] {
            let route = Route {
                n_expert: ne,
                k,
                gating,
                norm,
                scale,
            };
            let mut ids = be.alloc(rows * k).unwrap();
            let mut w = be.alloc(rows * k).unwrap();
            let b = with_bias.then_some(&bias);
            be.route_experts(&lb, rows, &route, b, &mut ids, &mut w).unwrap();
            let name = format!("route {gating:?} k {k} norm {norm} scale {scale} bias {with_bias}");
            res.push((format!("{name} ids"), download(be, &ids, rows * k)));
            res.push((format!("{name} weights"), download(be, &w, rows * k)));
        }
    }

    // 4 slots of width 37 per row.
    let (slots, width) = (4, 37);
    let experts = rng.vec(rows * slots * width, 2.0);
    let weights = rng.vec(rows * slots, 1.0);
    let mut o = be.alloc(rows * width).unwrap();
    be.moe_combine(&upload(be, &experts), &upload(be, &weights), rows, slots, width, &mut o)
        .unwrap();
    res.push(("moe_combine".into(), download(be, &o, rows * width)));

    let src = rng.vec(200, 1.0);
    let mut dst = upload(be, &vec![0.5; 150]);
    let c = Strided {
        count: 6,
        width: 7,
        src_off: 3,
        src_stride: 31,
        dst_off: 2,
        dst_stride: 20,
    };
    be.copy_strided(&upload(be, &src), &mut dst, &c).unwrap();
    res.push(("copy_strided rows".into(), download(be, &dst, 150)));
    res
}

/// Element-wise ops: WebGPU against the CPU backend's scalar ops.
#[test]
fn elementwise_ops_match_cpu() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(2).expect("cpu");
    let file = vectors_file(&mut Rng(5), 97, 8);
    let want = elementwise_suite(&cpu, &file, 11);
    let got = elementwise_suite(&g, &file, 11);
    let mut failures = Vec::new();
    for ((name, a), (_, b)) in got.iter().zip(&want) {
        let e = nmse_with_nan(a, b);
        println!("[ops] {name}: NMSE webgpu vs cpu {e:.1e}");
        // The rotations run the CPU's butterflies in its order: the same bits.
        let exact = name.starts_with("hadamard");
        let bound = if exact || name == "argmax" || name.contains("rows") || name.ends_with(" ids") {
            0.0
        } else {
            NMSE_F32
        };
        if e.is_nan() || e > bound {
            failures.push(format!("{name}: NMSE {e:.2e} > {bound:e}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Query heads of the attention suite (two KV heads).
const ATTN_HEADS: usize = 6;

/// What an attention suite run varies besides the head widths.
#[derive(Debug, Clone, Copy)]
struct AttnExtras {
    softcap: Option<f32>,
    sinks: bool,
    /// Values are the first `hdv` values of the K heads (MLA); the V caches go unused.
    v_in_k: bool,
    /// The caches' format.
    kv: KvType,
}

/// KV store and attention (GQA, prefill with a window and with an earlier prefix, decode) on
/// one backend, two sequences with caches of their own: each step stores both sequences'
/// rows from one stacked batch at their positions and attends both in one call at their row
/// offsets; the outputs in order.
fn attention_suite<B: Backend>(
    be: &B,
    file: &Arc<GgufFile>,
    seed: u64,
    (hdk, hdv): (usize, usize),
    x: AttnExtras,
) -> Vec<(String, Vec<f32>)> {
    let mut rng = Rng(seed);
    let (nh, nkv) = (ATTN_HEADS, 2);
    let n_ctx = 83;
    let (k_dim, v_dim) = (nkv * hdk, nkv * hdv);
    let sinks = x.sinks.then(|| be.load_weight(file, "sinks").unwrap());
    // Two sequences: (K cache, V cache) each.
    let mut caches: Vec<(B::Kv, B::Kv)> = (0..2)
        .map(|_| {
            (
                be.alloc_kv(n_ctx * k_dim, x.kv).unwrap(),
                be.alloc_kv(n_ctx * v_dim, x.kv).unwrap(),
            )
        })
        .collect();
    let mut res = Vec::new();
    // Per step, each sequence's (rows, pos0, window): prefills from 0, prefills after them,
    // decode steps; the second sequence at other positions.
    let steps = [
        [(41, 0, None), (9, 0, Some(4))],
        [(29, 41, Some(17)), (3, 9, None)],
        [(1, 70, None), (1, 12, Some(5))],
        [(1, 71, Some(9)), (1, 13, None)],
    ];
    for step in steps {
        let rows: usize = step.iter().map(|s| s.0).sum();
        let k = rng.vec(rows * k_dim, 2.0);
        let v = rng.vec(rows * v_dim, 2.0);
        let q = rng.vec(rows * nh * hdk, 2.0);
        let (kb, vb) = (upload(be, &k), upload(be, &v));
        let mut row0 = 0;
        let mut row0s = Vec::new();
        for (&(n, pos0, _), (kc, vc)) in step.iter().zip(caches.iter_mut()) {
            let positions: Vec<u32> = (pos0..pos0 + n).map(|p| p as u32).collect();
            be.kv_store(kc, &kb, row0, k_dim, &positions).unwrap();
            be.kv_store(vc, &vb, row0, v_dim, &positions).unwrap();
            row0s.push(row0);
            row0 += n;
        }
        let seqs: Vec<SeqAttn<'_, B::Kv>> = step
            .iter()
            .zip(&caches)
            .zip(&row0s)
            .map(|((&(n, pos0, window), (kc, vc)), &row0)| SeqAttn {
                row0,
                p: AttnParams {
                    rows: n,
                    pos0,
                    n_head: nh,
                    n_head_kv: nkv,
                    head_dim_k: hdk,
                    head_dim_v: hdv,
                    scale: 1.0 / (hdk as f32).sqrt(),
                    window,
                    softcap: x.softcap,
                    v_in_k: x.v_in_k,
                },
                k_cache: kc,
                v_cache: if x.v_in_k { kc } else { vc },
            })
            .collect();
        let mut out = be.alloc(rows * nh * hdv).unwrap();
        be.attention(&upload(be, &q), &seqs, sinks.as_ref(), &mut out).unwrap();
        res.push((
            format!("attention hd {hdk}/{hdv} {x:?} steps {step:?}"),
            download(be, &out, rows * nh * hdv),
        ));
    }
    res
}

/// Attention: WebGPU against the CPU backend (both round K, V, q and probabilities to f16),
/// in one pass and split across the KV length, for head widths up to MLA's 576, K and V heads
/// of different widths, values inside the keys (MLA's latent), soft-capping and sinks.
#[test]
fn attention_matches_cpu() {
    attention_webgpu_vs_cpu(
        KvType::F16,
        &[(20, 20), (64, 64), (256, 256), (48, 24), (576, 512)],
        (20, 20),
    );
}

/// The same over q8_0 caches (quantized by each backend's own store, read block by block),
/// for heads of whole blocks.
#[test]
fn q8_0_attention_matches_cpu() {
    attention_webgpu_vs_cpu(
        KvType::Q8_0,
        &[(32, 32), (64, 64), (256, 256), (64, 32), (576, 512)],
        (32, 32),
    );
}

/// Attention on WebGPU against the CPU backend with caches of format `kv`: heads of the
/// widths `plain`, MLA's latent (values inside the keys), soft-capping and sinks (`small`: a
/// head width to try the two together on).
fn attention_webgpu_vs_cpu(kv: KvType, plain_widths: &[(usize, usize)], small: (usize, usize)) {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(2).expect("cpu");
    let file = vectors_file(&mut Rng(5), 97, 8);
    let mut failures = Vec::new();
    // Also split across the KV length (every row, chunks of 16 and 7 positions: up to 12
    // chunks, some beyond a windowed query's reach and so empty).
    let split = |chunk| {
        gpu_with(WebGpuOptions {
            kv_chunk: Some(chunk),
            ..Default::default()
        })
    };
    let variants = [("", Some(g)), (" split 16", split(16)), (" split 7", split(7))];
    let plain = AttnExtras {
        softcap: None,
        sinks: false,
        v_in_k: false,
        kv,
    };
    let latent = AttnExtras { v_in_k: true, ..plain };
    let mut cases: Vec<_> = plain_widths.iter().map(|&hd| (hd, plain)).collect();
    cases.extend([
        ((160, 128), latent),
        ((576, 512), latent),
        (
            (64, 64),
            AttnExtras {
                softcap: Some(1.5),
                ..plain
            },
        ),
        ((64, 32), AttnExtras { sinks: true, ..plain }),
        (
            small,
            AttnExtras {
                softcap: Some(30.0),
                sinks: true,
                ..plain
            },
        ),
    ]);
    for (hd, x) in cases {
        let want = attention_suite(&cpu, &file, 3, hd, x);
        for (how, be) in &variants {
            let got = attention_suite(be.as_ref().expect("the adapter opened once"), &file, 3, hd, x);
            for ((name, a), (_, b)) in got.iter().zip(&want) {
                assert!(
                    b.iter().any(|v| *v != 0.0),
                    "{name}: an all-zero reference proves nothing"
                );
                let e = nmse(a, &widen(b));
                println!("[ops] {name}{how}: NMSE webgpu vs cpu {e:.1e}");
                if e.is_nan() || e > NMSE_F32 {
                    failures.push(format!("{name}{how}: NMSE {e:.2e}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A q8_0 cache against the f16 one, on the CPU backend and on WebGPU: the same attention
/// within the noise Q8_0 adds. Its bound: rounding to a step `d = max|x| / 127` leaves an error
/// uniform in ±d/2, so a block's values carry a relative noise power of
/// `(max|x| / rms(x))² / (12 · 127²)`, 1.5e-5 for the suite's uniform values (max/rms √3)
/// and about 5e-5 for a block of Gaussian ones (max/rms about 2.5). V's noise reaches the output
/// at that level (an average of noisy values, relative to an average of values), and the noise
/// of q and K moves each logit by about `scale · Σ q·k` noise, which reweights V by the same
/// relative amount: NMSE of a few 1e-5 in all. The bound, 2e-4, is 3 times the measured worst
/// case (6.5e-5, printed) while the f16 cache's own noise is about 1e-7, so a broken block
/// read (a wrong scale, a misplaced head: NMSE of order 1) fails it.
#[test]
fn q8_0_attention_is_f16_attention_within_quantization() {
    const NMSE_Q8_0: f64 = 2e-4;
    let cpu = CpuBackend::new(2).expect("cpu");
    let file = vectors_file(&mut Rng(5), 97, 8);
    let plain = AttnExtras {
        softcap: None,
        sinks: false,
        v_in_k: false,
        kv: KvType::F16,
    };
    let cases = [
        ((64, 64), plain),
        ((128, 128), plain),
        ((256, 256), AttnExtras { sinks: true, ..plain }),
        (
            (64, 32),
            AttnExtras {
                softcap: Some(5.0),
                ..plain
            },
        ),
        ((576, 512), AttnExtras { v_in_k: true, ..plain }),
    ];
    let gpu = gpu();
    let mut worst = 0f64;
    let mut failures = Vec::new();
    for (hd, x) in cases {
        let q8 = AttnExtras { kv: KvType::Q8_0, ..x };
        let f16 = attention_suite(&cpu, &file, 7, hd, x);
        let mut runs = vec![("cpu", attention_suite(&cpu, &file, 7, hd, q8))];
        if let Some(g) = &gpu {
            runs.push(("webgpu", attention_suite(g, &file, 7, hd, q8)));
        }
        for (be, q8_out) in &runs {
            for ((name, a), (_, b)) in q8_out.iter().zip(&f16) {
                let e = nmse(a, &widen(b));
                println!("[ops] {name} on {be}: NMSE q8_0 cache vs f16 cache {e:.1e}");
                worst = worst.max(e);
                if e.is_nan() || e > NMSE_Q8_0 || e == 0.0 {
                    failures.push(format!("{name} on {be}: NMSE {e:.2e} (bound {NMSE_Q8_0:e})"));
                }
            }
        }
    }
    println!("[ops] worst NMSE q8_0 vs f16 cache: {worst:.2e} (bound {NMSE_Q8_0:e})");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A q8_0 cache refuses what is not whole blocks, and caches of two formats, on every backend
/// (the model checks first and names `--cache-type`, so these are the backends' own guards).
#[test]
fn q8_0_cache_shapes_are_errors() {
    fn check<B: Backend>(be: &B) {
        let q8 = KvType::Q8_0;
        let Err(err) = be.alloc_kv(40, q8) else {
            panic!("40 values allocated as q8_0 blocks")
        };
        let err = err.to_string();
        assert!(err.contains("40") && err.contains("q8_0"), "{err}");
        let mut kc = be.alloc_kv(4 * 96, q8).unwrap();
        let src = be.alloc(2 * 48).unwrap();
        let err = be.kv_store(&mut kc, &src, 0, 48, &[0, 1]).unwrap_err().to_string();
        assert!(err.contains("48"), "{err}");
        // Heads of 48 in rows of 96: whole blocks per row, not per head.
        let p = AttnParams {
            rows: 1,
            pos0: 0,
            n_head: 2,
            n_head_kv: 2,
            head_dim_k: 48,
            head_dim_v: 48,
            scale: 1.0,
            window: None,
            softcap: None,
            v_in_k: false,
        };
        let vc = be.alloc_kv(4 * 96, q8).unwrap();
        let (q, mut out) = (be.alloc(96).unwrap(), be.alloc(96).unwrap());
        let seq = [SeqAttn {
            row0: 0,
            p,
            k_cache: &kc,
            v_cache: &vc,
        }];
        let err = be.attention(&q, &seq, None, &mut out).unwrap_err().to_string();
        assert!(err.contains("48") && err.contains("q8_0"), "{err}");
        // A q8_0 K cache with an f16 V cache.
        let p = AttnParams {
            n_head_kv: 1,
            head_dim_k: 64,
            head_dim_v: 64,
            ..p
        };
        let (kc, vc) = (
            be.alloc_kv(4 * 64, q8).unwrap(),
            be.alloc_kv(4 * 64, KvType::F16).unwrap(),
        );
        let (q, mut out) = (be.alloc(128).unwrap(), be.alloc(128).unwrap());
        let seq = [SeqAttn {
            row0: 0,
            p,
            k_cache: &kc,
            v_cache: &vc,
        }];
        let err = be.attention(&q, &seq, None, &mut out).unwrap_err().to_string();
        assert!(err.contains("f16") && err.contains("q8_0"), "{err}");
    }
    check(&CpuBackend::new(1).expect("cpu"));
    if let Some(g) = gpu() {
        check(&g);
    }
}

/// Rope against an independent f64 evaluation of its angles (ggml's formulas: YaRN's ramp
/// between interpolation and extrapolation and its magnitude), on the CPU backend and the
/// WebGPU backend.
#[test]
fn rope_matches_f64_reference() {
    let file = vectors_file(&mut Rng(5), 97, 8);
    let factors: Vec<f64> = (0..8).map(|i| 1.0 + f64::from(i) * 0.37).collect();
    let (nh, hd) = (3, 22);
    let x = Rng(31).vec(ROPE_POSITIONS.len() * nh * hd, 2.0);
    let cpu = CpuBackend::new(2).expect("cpu");
    let gpu = gpu();
    for rope in ropes(hd) {
        let want = reference_rope(&x, nh, hd, &rope, &factors);
        let mut got = vec![("cpu", run_rope(&cpu, &file, &x, nh, hd, &rope))];
        if let Some(g) = &gpu {
            got.push(("webgpu", run_rope(g, &file, &x, nh, hd, &rope)));
        }
        for (name, v) in got {
            let e = nmse(&v, &want);
            println!(
                "[ops] rope {name} {:?} {:?}: NMSE vs f64 {e:.1e}",
                rope.kind, rope.scaling
            );
            assert!(e < 1e-9, "rope {name} {rope:?}: NMSE {e:.2e}");
        }
    }
}

/// `rope` of `x` (`ROPE_POSITIONS.len()` rows of `nh` heads of `hd`) on one backend.
fn run_rope<B: Backend>(be: &B, file: &Arc<GgufFile>, x: &[f32], nh: usize, hd: usize, rope: &Rope) -> Vec<f32> {
    let f = be.load_weight(file, "factors").unwrap();
    let mut a = upload(be, x);
    be.rope(
        &mut a,
        nh,
        hd,
        &ROPE_POSITIONS,
        rope,
        rope.wants_factors().then_some(&f),
    )
    .unwrap();
    download(be, &a, x.len())
}

/// Rope in f64 from the formulas (pair `i` also indexes the factors): angle `pos · base^(-2i/n_rot) / factor_i`, scaled by
/// `1/linear factor`; YaRN mixes the interpolated and extrapolated angle by its ramp and
/// scales cos and sin by `attn_factor · (1 + 0.1 ln factor)`.
#[allow(clippy::needless_range_loop)]
fn reference_rope(x: &[f32], nh: usize, hd: usize, rope: &Rope, factors: &[f64]) -> Vec<f64> {
    let n_rot = rope.n_rot;
    let base = f64::from(rope.base);
    let mut out: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
    for (r, &pos) in ROPE_POSITIONS.iter().enumerate() {
        for h in 0..nh {
            let head = &mut out[(r * nh + h) * hd..(r * nh + h + 1) * hd];
            for i in 0..n_rot / 2 {
                let mut theta = f64::from(pos) * base.powf(-2.0 * i as f64 / n_rot as f64);
                if rope.wants_factors() {
                    theta /= factors[i];
                }
                let (theta, m) = match rope.scaling {
                    RopeScaling::None | RopeScaling::Llama3 => (theta, 1.0),
                    RopeScaling::Linear { factor } => (theta / f64::from(factor), 1.0),
                    RopeScaling::Yarn(y) => {
                        let f = f64::from(y.factor);
                        let corr = |beta: f64| {
                            n_rot as f64 * (y.n_ctx_orig as f64 / (beta * 2.0 * std::f64::consts::PI)).ln()
                                / (2.0 * base.ln())
                        };
                        let low = corr(f64::from(y.beta_fast)).floor().max(0.0);
                        let high = corr(f64::from(y.beta_slow)).ceil().min(n_rot as f64 - 1.0);
                        let ramp = 1.0 - ((i as f64 - low) / (high - low).max(0.001)).clamp(0.0, 1.0);
                        let mix = ramp * f64::from(y.ext_factor);
                        let t = theta / f * (1.0 - mix) + theta * mix;
                        (t, f64::from(y.attn_factor) * (1.0 + 0.1 * f.ln()))
                    }
                };
                let (c, s) = (theta.cos() * m, theta.sin() * m);
                let (i0, i1) = match rope.kind {
                    RopeKind::Norm => (2 * i, 2 * i + 1),
                    RopeKind::Neox => (i, i + n_rot / 2),
                };
                let (x0, x1) = (head[i0], head[i1]);
                head[i0] = x0 * c - x1 * s;
                head[i1] = x0 * s + x1 * c;
            }
        }
    }
    out
}

/// Bad input is an error naming the problem, never a panic or a device fault.
#[test]
fn bad_shapes_are_errors() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(9);
    let file = gguf(&[(
        "w".into(),
        vec![64, 8],
        GgmlType::Q8_0,
        random_matrix(&mut rng, GgmlType::Q8_0, 64, 8),
    )]);
    let w = g.load_weight(&file, "w").unwrap();
    let x = g.alloc(64).unwrap();
    let mut small = g.alloc(4).unwrap();
    assert!(g.matmul(&w, &x, 1, &mut small).is_err());
    assert!(g.embed(&w, &[8], 1.0, &mut g.alloc(64).unwrap()).is_err());
    assert!(g.argmax(&x, 2, 64).is_err());
    // Positions past the cache, a head wider than any kernel, frequency factors without
    // llama3 scaling: errors on both backends.
    let cpu = CpuBackend::new(1).expect("cpu");
    let mut kc_g = g.alloc_kv(4 * 8, KvType::F16).unwrap();
    let mut kc_c = cpu.alloc_kv(4 * 8, KvType::F16).unwrap();
    assert!(g.kv_store(&mut kc_g, &g.alloc(8).unwrap(), 0, 8, &[4]).is_err());
    assert!(cpu.kv_store(&mut kc_c, &cpu.alloc(8).unwrap(), 0, 8, &[4]).is_err());
    let wide = AttnParams {
        rows: 1,
        pos0: 0,
        n_head: 1,
        n_head_kv: 1,
        head_dim_k: 600,
        head_dim_v: 600,
        scale: 1.0,
        window: None,
        softcap: None,
        v_in_k: false,
    };
    let (kc, vc) = (
        cpu.alloc_kv(600, KvType::F16).unwrap(),
        cpu.alloc_kv(600, KvType::F16).unwrap(),
    );
    let seq = [SeqAttn {
        row0: 0,
        p: wide,
        k_cache: &kc,
        v_cache: &vc,
    }];
    let err = cpu
        .attention(&cpu.alloc(600).unwrap(), &seq, None, &mut cpu.alloc(600).unwrap())
        .unwrap_err();
    assert!(err.to_string().contains("600"), "{err}");
    let file = vectors_file(&mut Rng(5), 97, 8);
    let f = cpu.load_weight(&file, "factors").unwrap();
    let rope = Rope::new(RopeKind::Neox, 16, 10000.0);
    assert!(cpu
        .rope(&mut cpu.alloc(16).unwrap(), 1, 16, &[0], &rope, Some(&f))
        .is_err());
}

/// The golden quant matrices (real ggml output) decode on the GPU to the oracle's values.
#[test]
fn golden_quant_blocks_decode_like_the_block_structs() {
    let Some(g) = gpu() else { return };
    let dir = common::golden("quants");
    let mut checked = 0;
    for ty in kernels::quant_types() {
        let Ok(bytes) = std::fs::read(dir.join(format!("{}.bin", ty.name()))) else {
            continue;
        };
        let file = gguf(&[("w".into(), vec![512, 4], ty, bytes)]);
        let want = dequantized(&file, "w");
        let got = run_embed(&g, &file, "w", &[0, 1, 2, 3], 512);
        let exact: Vec<f64> = want.iter().map(|&v| f64::from(v * 0.75)).collect();
        let e = nmse(&got, &exact);
        assert!(
            e < 1e-14,
            "{ty}: GPU decode differs from the block structs (NMSE {e:.2e})"
        );
        checked += 1;
    }
    assert!(
        checked >= 10,
        "only {checked} golden quant files found in {}",
        dir.display()
    );
}

/// The device's sampler candidates (select.wgsl) are the host reference's, bit for bit: the k
/// largest with ties to the lower index, in index order, and the gathered values, over rows
/// with ties, NaN, infinities and signed zeros, k below, at and above the row width.
#[test]
fn top_k_candidates_match_the_host_selection() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(2).expect("cpu");
    let mut rng = Rng(17);
    // (index, value bits) of the top, then the gathered values' bits, per row.
    type Bits = Vec<(Vec<(u32, u32)>, Vec<u32>)>;
    let bits = |c: &[tinyllm::sample::Candidates]| -> Bits {
        c.iter()
            .map(|c| {
                (
                    c.top.iter().map(|&(i, v)| (i, v.to_bits())).collect(),
                    c.gathered.iter().map(|v| v.to_bits()).collect(),
                )
            })
            .collect()
    };
    let mut checked = 0;
    for (rows, width) in [(1, 1), (2, 7), (3, 300), (1, 5000), (2, 70001)] {
        let mut x: Vec<f32> = (0..rows * width)
            .map(|_| ((rng.vec(1, 8.0)[0] * 4.0).round()) / 4.0)
            .collect();
        for (i, v) in x.iter_mut().enumerate().take(rows * width) {
            match i % 97 {
                5 => *v = f32::NAN,
                11 => *v = f32::NEG_INFINITY,
                13 => *v = f32::INFINITY,
                17 => *v = -0.0,
                19 => *v = 0.0,
                _ => {}
            }
        }
        let buf_g = upload(&g, &x);
        let buf_c = upload(&cpu, &x);
        let gather: Vec<u32> = vec![0, (width as u32) / 2, width as u32 - 1, width as u32 + 5, 5];
        for k in [1, 3, 40, 300, 1000] {
            let want: Vec<_> = x
                .chunks_exact(width)
                .map(|r| tinyllm::sample::candidates(r, k, &gather))
                .collect();
            let got = g
                .top_k(&buf_g, rows, width, k, &gather)
                .and_then(|r| r.wait())
                .expect("webgpu top_k");
            assert_eq!(bits(&got), bits(&want), "webgpu rows {rows} width {width} k {k}");
            let got = cpu
                .top_k(&buf_c, rows, width, k, &gather)
                .and_then(|r| r.wait())
                .expect("cpu top_k");
            assert_eq!(bits(&got), bits(&want), "cpu rows {rows} width {width} k {k}");
            checked += 1;
        }
    }
    assert!(g.top_k(&upload(&g, &[1.0]), 1, 1, 0, &[]).is_err(), "k = 0 is an error");
    println!("[ops] top_k: {checked} shapes equal to the host selection");
}

/// The f16-product matmul multiplies in f32 wherever f16 could overflow: activations of 5e4
/// and weights near 1 (products past 65504) give the f32 result, finite, next to small
/// activations that still take the f16 path.
#[test]
fn f16_matmul_never_overflows() {
    let Some(g) = gpu_with(WebGpuOptions {
        matmul: Some(MatmulVariant::Workgroup),
        f16_matmul: Some(true),
        ..Default::default()
    }) else {
        return;
    };
    let mut rng = Rng(5);
    let (k, n_out) = (64, 9);
    let file = gguf(&[(
        "w".into(),
        vec![k as u64, n_out as u64],
        GgmlType::F16,
        random_matrix(&mut rng, GgmlType::F16, k, n_out),
    )]);
    let wd = dequantized(&file, "w");
    // Row 0: huge activations; row 1: ordinary ones.
    let mut x: Vec<f32> = rng.vec(k, 5.0e4);
    x.extend(rng.vec(k, 1.0));
    let want = reference_matmul(GgmlType::F16, &wd, &x, 2, n_out, k);
    let got = run_matmul(&g, &file, "w", &x, 2, n_out);
    assert!(got.iter().all(|v| v.is_finite()), "{got:?}");
    let e_big = nmse(&got[..n_out], &want[..n_out]);
    let e_small = nmse(&got[n_out..], &want[n_out..]);
    println!("[ops] f16 matmul: NMSE huge activations {e_big:.1e}, ordinary {e_small:.1e}");
    assert!(e_big < NMSE_F32, "huge activations: NMSE {e_big:.2e}");
    assert!(e_small < NMSE_F16, "ordinary activations: NMSE {e_small:.2e}");
}

/// The formats expert stacks are stored in, for the matmul_id tests (the codebook formats'
/// buffers begin with their grid table: grids.rs).
const EXPERT_TYPES: [GgmlType; 16] = [
    GgmlType::F16,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_0,
    GgmlType::Q6_K,
    GgmlType::MXFP4,
    GgmlType::Q1_0,
    GgmlType::Q2_K,
    GgmlType::TQ2_0,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
];

/// Expert ids of 5 rows x 3 slots over 6 experts: experts 2 and 5 unused; 0 and 3 shared by
/// several rows.
fn expert_ids() -> Vec<f32> {
    expert_ids_of(5)
}

/// Expert ids of `rows` rows of three slots: [`expert_ids`]'s five rows over and over.
fn expert_ids_of(rows: usize) -> Vec<f32> {
    [0, 3, 1, 3, 0, 4, 0, 1, 3, 4, 3, 0, 1, 0, 3]
        .iter()
        .cycle()
        .take(3 * rows)
        .map(|&e| e as f32)
        .collect()
}

/// A file holding `w`, a stack of `n_mat` random matrices `[n_out, k]` of type `ty`, and
/// `exps.bias`, their f32 biases `[n_out, n_mat]`.
fn expert_stack(rng: &mut Rng, ty: GgmlType, k: usize, n_out: usize, n_mat: usize) -> Arc<GgufFile> {
    gguf(&[
        (
            "w".to_string(),
            vec![k as u64, n_out as u64, n_mat as u64],
            ty,
            random_matrix(rng, ty, k, n_out * n_mat),
        ),
        (
            "exps.bias".to_string(),
            vec![n_out as u64, n_mat as u64],
            GgmlType::F32,
            random_matrix(rng, GgmlType::F32, n_out, n_mat),
        ),
    ])
}

/// The expert-grouped matmul (`matmul_id`) equals a loop of dense matmuls, one per (row, slot)
/// pair, each through the whole stacked tensor seen as one tall matrix and cut to the pair's
/// expert: on random blocks of the formats experts are stored in, with rows sharing experts,
/// experts no row chose, per-slot and shared inputs, biases, stacks of whole and partial
/// interleave tiles, and every CPU kernel set; with five rows, one (a decode step: each
/// expert's activations are the whole input) and 25 (enough pairs to gather in parallel).
#[test]
fn matmul_id_equals_a_loop_of_dense_matmuls() {
    use tinyllm::backend::cpu::kernels::Kernels;
    use tinyllm::backend::MatId;
    let mut rng = Rng(0x5eed_0e1d);
    let sets = [Kernels::detect(), Kernels::portable(), Kernels::oracle()];
    let (n_mat, slots) = (6usize, 3usize);
    let shapes = EXPERT_TYPES
        .iter()
        .flat_map(|&ty| [(ty, 24usize, 5usize), (ty, 20, 5)])
        .chain([(GgmlType::Q4_K, 24, 1), (GgmlType::Q4_K, 24, 25)]);
    for (ty, n_out, rows) in shapes {
        let ids = expert_ids_of(rows);
        {
            let k = odd_width(ty);
            let file = expert_stack(&mut rng, ty, k, n_out, n_mat);
            let bias = dequantized(&file, "exps.bias");
            for per_slot in [false, true] {
                let m = MatId { rows, slots, per_slot };
                let x = rng.vec(m.inputs() * k, 1.0);
                for kernels in sets {
                    let be = CpuBackend::with_kernels(2, kernels).unwrap();
                    let w = be.load_weight(&file, "w").unwrap();
                    let b = be.load_weight(&file, "exps.bias").unwrap();
                    let (xb, idb) = (upload(&be, &x), upload(&be, &ids));
                    let mut out = be.alloc(m.pairs() * n_out).unwrap();
                    let mut out_b = be.alloc(m.pairs() * n_out).unwrap();
                    be.matmul_id(&w, None, &xb, &idb, m, &mut out).unwrap();
                    be.matmul_id(&w, Some(&b), &xb, &idb, m, &mut out_b).unwrap();
                    let (got, got_b) = (
                        download(&be, &out, m.pairs() * n_out),
                        download(&be, &out_b, m.pairs() * n_out),
                    );
                    for p in 0..m.pairs() {
                        let r = m.input_of(p);
                        let full = run_matmul(&be, &file, "w", &x[r * k..(r + 1) * k], 1, n_out * n_mat);
                        let e = ids[p] as usize;
                        let want = &full[e * n_out..(e + 1) * n_out];
                        let what = format!("{ty} n_out {n_out} per_slot {per_slot} {} pair {p}", kernels.variant);
                        assert_eq!(&got[p * n_out..(p + 1) * n_out], want, "{what}");
                        for (o, (&g, &w)) in got_b[p * n_out..(p + 1) * n_out].iter().zip(want).enumerate() {
                            assert_eq!(g, w + bias[e * n_out + o], "{what} with bias [{o}]");
                        }
                    }
                }
            }
        }
    }
}

/// `matmul_id` on WebGPU equals a loop of the backend's own dense matmuls over the whole stack
/// seen as one tall matrix, cut to each pair's expert, and the dequantization oracle (f32 sums
/// in other orders: NMSE): rows sharing experts, experts no row chose, per-slot and shared
/// inputs, biases, the stack whole and split across bindings in the middle of experts.
#[test]
fn webgpu_matmul_id_equals_a_loop_of_dense_matmuls() {
    use tinyllm::backend::MatId;
    let Some(whole) = gpu() else { return };
    let mut rng = Rng(0x0e1d_5eed);
    let (n_mat, rows, slots) = (6usize, 5usize, 3usize);
    let ids = expert_ids();
    let mut failures = Vec::new();
    for ty in EXPERT_TYPES {
        let k = odd_width(ty);
        let row_bytes = (k / ty.block_size() * ty.block_bytes()) as u64;
        let table = tinyllm::backend::gpu::grids::leading_table(ty).len() as u64;
        let split = gpu_with(WebGpuOptions {
            max_binding: Some(table + row_bytes * 7),
            ..Default::default()
        })
        .expect("the adapter opened once");
        for n_out in [24usize, 20] {
            let file = expert_stack(&mut rng, ty, k, n_out, n_mat);
            let (wd, bias) = (dequantized(&file, "w"), dequantized(&file, "exps.bias"));
            for per_slot in [false, true] {
                let m = MatId { rows, slots, per_slot };
                let x = rng.vec(m.inputs() * k, 1.0);
                for (how, g) in [("whole", &whole), ("split", &split)] {
                    let w = g.load_weight(&file, "w").unwrap();
                    let b = g.load_weight(&file, "exps.bias").unwrap();
                    if how == "split" {
                        assert!(w.parts() > n_mat, "the stack should split inside experts");
                    }
                    let (xb, idb) = (upload(g, &x), upload(g, &ids));
                    let mut out = g.alloc(m.pairs() * n_out).unwrap();
                    g.matmul_id(&w, Some(&b), &xb, &idb, m, &mut out).unwrap();
                    let got = download(g, &out, m.pairs() * n_out);
                    let (mut loop_want, mut oracle) = (Vec::new(), Vec::new());
                    for (p, &id) in ids.iter().enumerate().take(m.pairs()) {
                        let (r, e) = (m.input_of(p), id as usize);
                        let xr = &x[r * k..(r + 1) * k];
                        let full = run_matmul(g, &file, "w", xr, 1, n_out * n_mat);
                        let exact = reference_matmul(ty, &wd, xr, 1, n_out * n_mat, k);
                        for o in 0..n_out {
                            let bo = bias[e * n_out + o];
                            loop_want.push(f64::from(full[e * n_out + o] + bo));
                            oracle.push(exact[e * n_out + o] + f64::from(bo));
                        }
                    }
                    let (e_loop, e_oracle) = (nmse(&got, &loop_want), nmse(&got, &oracle));
                    let what = format!("{ty} n_out {n_out} per_slot {per_slot} {how} ({} parts)", w.parts());
                    println!("[ops] matmul_id {what}: NMSE vs dense loop {e_loop:.1e}, vs oracle {e_oracle:.1e}");
                    if !(e_loop < NMSE_F32 && e_oracle < NMSE_F32) {
                        failures.push(format!("{what}: NMSE {e_loop:.2e} / {e_oracle:.2e}"));
                    }
                }
            }
        }
    }
    // An id naming no matrix is caught on the CPU; on the device it gives NaN, never a read
    // outside the stack.
    let file = gguf(&[(
        "w".into(),
        vec![32, 4, 2],
        GgmlType::Q8_0,
        random_matrix(&mut rng, GgmlType::Q8_0, 32, 8),
    )]);
    let w = whole.load_weight(&file, "w").unwrap();
    let m = MatId {
        rows: 1,
        slots: 2,
        per_slot: false,
    };
    let mut out = whole.alloc(8).unwrap();
    let x = upload(&whole, &rng.vec(32, 1.0));
    whole
        .matmul_id(&w, None, &x, &upload(&whole, &[1.0, 2.0]), m, &mut out)
        .unwrap();
    let got = download(&whole, &out, 8);
    assert!(
        got[..4].iter().all(|v| v.is_finite()) && got[4..].iter().all(|v| v.is_nan()),
        "{got:?}"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The Vulkan backend (ash, the same kernels as SPIR-V), or `None` (with the reason printed)
/// without a Vulkan device, unless `TINYLLM_REQUIRE_GPU=1`. The pipeline cache stays in memory.
fn vulkan_with(opts: VulkanOptions) -> Option<VulkanBackend> {
    common::device_or_skip(|| {
        VulkanBackend::open(VulkanOptions {
            pipeline_dir: Some(None),
            ..opts
        })
    })
}

/// The op suite on Vulkan, each kernel path it takes: matmul and embedding of every format
/// against the dequantization oracle in the default variant (on CPU devices texture-held
/// weights, as on WebGPU), the rows variant and the
/// workgroup variant with subgroup reductions, without them, and with f16 products where the
/// device was opened with f16; unrounded activations against the unrounded oracle; and the
/// elementwise, expert and attention suites (whole and split) against the CPU backend.
#[test]
fn vulkan_ops_match_the_oracle_and_cpu() {
    let Some(vk) = vulkan_with(VulkanOptions::default()) else {
        return;
    };
    let open = |matmul, no_subgroups, f16| {
        vulkan_with(VulkanOptions {
            matmul: Some(matmul),
            no_subgroups,
            f16_matmul: Some(f16),
            ..Default::default()
        })
        .expect("the device opened once")
    };
    let rows_be = open(MatmulVariant::Rows, false, false);
    let wg = open(MatmulVariant::Workgroup, false, false);
    let wg_plain = open(MatmulVariant::Workgroup, true, false);
    let wg_f16 = open(MatmulVariant::Workgroup, false, true);
    let unrounded = vulkan_with(VulkanOptions {
        round_activations: Some(false),
        ..Default::default()
    })
    .expect("the device opened once");
    assert!(wg.paths().strategy.reduce_subgroups || !vk.device().specializations().subgroup_operations.is_used());
    assert!(!wg_plain.paths().strategy.reduce_subgroups);
    let has_f16 = wg_f16.paths().strategy.f16_matmul;
    println!(
        "[ops] vulkan on {}: default matmul {:?}, subgroup reductions {}, f16 products {has_f16}",
        vk.device().info().name,
        vk.paths().strategy.matmul,
        wg.paths().strategy.reduce_subgroups
    );
    let mut rng = Rng(0x7a11_5eed);
    let n_out = 37;
    let file = every_format(&mut rng, n_out);
    let mut failures = Vec::new();
    for ty in kernels::quant_types() {
        let (name, k) = (ty.name(), odd_width(ty));
        let wd = dequantized(&file, name);
        for rows in [1usize, 5, 13] {
            let x = rng.vec(rows * k, 1.0);
            let want = reference_matmul(ty, &wd, &x, rows, n_out, k);
            let mut line = format!("[ops] vulkan matmul {name:>6} {n_out}x{k} rows {rows:>2}:");
            for (how, be, bound) in [
                ("default", &vk, NMSE_F32),
                ("rows", &rows_be, NMSE_F32),
                ("workgroup", &wg, NMSE_F32),
                ("workgroup without subgroups", &wg_plain, NMSE_F32),
                ("workgroup f16", &wg_f16, NMSE_F16),
            ] {
                let e = nmse(&run_matmul(be, &file, name, &x, rows, n_out), &want);
                line += &format!(" {how} {e:.1e}");
                if e.is_nan() || e > bound {
                    failures.push(format!("vulkan matmul {name} rows {rows} {how}: NMSE {e:.2e}"));
                }
                // The codebook formats multiply in f32 there (strategy.rs).
                let codebook = kernels::codebook(ty);
                if how == "workgroup f16" && has_f16 && k % 4 == 0 && e < 1e-11 && !codebook {
                    failures.push(format!("vulkan matmul {name} rows {rows}: f16 products do not show"));
                }
            }
            let e = nmse(
                &run_matmul(&unrounded, &file, name, &x, rows, n_out),
                &reference_matmul(GgmlType::F32, &wd, &x, rows, n_out, k),
            );
            line += &format!(", unrounded {e:.1e}");
            if e.is_nan() || e > NMSE_F32 {
                failures.push(format!("vulkan matmul {name} rows {rows} unrounded: NMSE {e:.2e}"));
            }
            println!("{line}");
        }
        let tokens = [3u32, 0, 36, 3, 17];
        let want: Vec<f64> = tokens
            .iter()
            .flat_map(|&t| {
                wd[t as usize * k..(t as usize + 1) * k]
                    .iter()
                    .map(|&v| f64::from(v * 0.75))
            })
            .collect();
        let e = nmse(&run_embed(&vk, &file, name, &tokens, k), &want);
        if e.is_nan() || e > 1e-12 {
            failures.push(format!("vulkan embed {name}: NMSE {e:.2e}"));
        }
    }
    let cpu = CpuBackend::new(2).expect("cpu");
    let vectors = vectors_file(&mut Rng(5), 97, 8);
    let want = elementwise_suite(&cpu, &vectors, 11);
    for ((name, a), (_, b)) in elementwise_suite(&vk, &vectors, 11).iter().zip(&want) {
        let e = nmse_with_nan(a, b);
        println!("[ops] {name}: NMSE vulkan vs cpu {e:.1e}");
        let exact = name == "argmax" || name.contains("rows") || name.ends_with(" ids") || name.starts_with("hadamard");
        let bound = if exact { 0.0 } else { NMSE_F32 };
        if e.is_nan() || e > bound {
            failures.push(format!("vulkan {name}: NMSE {e:.2e} > {bound:e}"));
        }
    }
    let split = vulkan_with(VulkanOptions {
        kv_chunk: Some(16),
        ..Default::default()
    })
    .expect("the device opened once");
    let plain = AttnExtras {
        softcap: None,
        sinks: false,
        v_in_k: false,
        kv: KvType::F16,
    };
    let cases = [
        ((64, 64), plain),
        ((576, 512), AttnExtras { v_in_k: true, ..plain }),
        (
            (64, 32),
            AttnExtras {
                sinks: true,
                softcap: Some(30.0),
                ..plain
            },
        ),
        (
            (64, 64),
            AttnExtras {
                kv: KvType::Q8_0,
                ..plain
            },
        ),
    ];
    for (hd, x) in cases {
        let want = attention_suite(&cpu, &vectors, 3, hd, x);
        for (how, be) in [("", &vk), (" split 16", &split)] {
            for ((name, a), (_, b)) in attention_suite(be, &vectors, 3, hd, x).iter().zip(&want) {
                let e = nmse(a, &widen(b));
                println!("[ops] {name}{how}: NMSE vulkan vs cpu {e:.1e}");
                if e.is_nan() || e > NMSE_F32 {
                    failures.push(format!("vulkan {name}{how}: NMSE {e:.2e}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The integer dot product path (matmul_dot.wgsl, `OpSDot`): where the device has
/// VK_KHR_shader_integer_dot_product (lavapipe emulates it: forced on here), Q8_0 matmuls run
/// through it, seen in the timestamp profile, and match the oracle, which rounds activations
/// by the same Q8_0 rule and multiplies exactly (the integer sums are exact too); where the
/// backend leaves it off (by default unless accelerated, or a device without it) the float
/// kernel runs, the clean fallback.
#[test]
fn vulkan_integer_dot_matmuls_match_the_oracle() {
    let open = |integer_dot| {
        vulkan_with(VulkanOptions {
            matmul: Some(MatmulVariant::Workgroup),
            integer_dot,
            // f32 products on the fallback (f16 ones would blur the comparison).
            f16_matmul: Some(false),
            ..Default::default()
        })
    };
    let Some(forced) = open(Some(true)) else { return };
    let default = open(None).expect("the device opened once");
    let spec = forced.device().info().specializations().integer_dot_product;
    assert_eq!(
        default.paths().integer_dot,
        spec.is_used(),
        "the default follows the device ({spec})"
    );
    let supported = forced.device().info().integer_dot.supported;
    assert_eq!(
        forced.paths().integer_dot,
        supported,
        "forced on wherever the device has the feature"
    );
    let off = open(Some(false)).expect("the device opened once");
    assert!(!off.paths().integer_dot);
    let mut rng = Rng(0xd07_d07);
    let (n_in, n_out) = (32 * 9, 45);
    let w = random_matrix(&mut rng, GgmlType::Q8_0, n_in, n_out);
    let file = gguf(&[("w".into(), vec![n_in as u64, n_out as u64], GgmlType::Q8_0, w)]);
    let wd = dequantized(&file, "w");
    for be in [&forced, &off] {
        be.enable_profile().expect("timestamps");
        for rows in [1usize, 3, 8, 11] {
            let mut x = rng.vec(rows * n_in, 2.0);
            x[..32].fill(0.0);
            let want = reference_matmul(GgmlType::Q8_0, &wd, &x, rows, n_out, n_in);
            let e = nmse(&run_matmul(be, &file, "w", &x, rows, n_out), &want);
            println!(
                "[ops] vulkan Q8_0 matmul rows {rows}, integer dot {}: NMSE {e:.1e}",
                be.paths().integer_dot
            );
            assert!(e < 1e-10, "NMSE {e:.2e}");
        }
        let dot_calls = common::gpu_golden::vulkan_calls(be, "matmul_dot");
        assert_eq!(
            dot_calls > 0,
            be.paths().integer_dot,
            "matmul_dot ran {dot_calls} times"
        );
    }
}

/// The cooperative-matrix path (matmul_coop.wgsl): where the device has VK_KHR_cooperative_matrix
/// with a shape the kernels use (Mesa lavapipe 26 emulates 8x8x8; forced on here with
/// buffer-held weights), batches of more than 8 rows of every format but F32 multiply through it,
/// seen in the timestamp profile, and match the oracle within the f16-operand bound, across
/// partial tiles of rows (32) and weight rows (64) and weights split over buffers; a single
/// row still takes the matvec kernel. Where the device lacks it, or it is turned off, the
/// float kernels run: the clean fallback. A device per format, as the golden test opens one per
/// architecture (lavapipe 26 compiles each kernel at its first dispatch: up to 83 s, Q6_K's).
#[test]
fn vulkan_cooperative_matrix_matmuls_match_the_oracle() {
    let open = |cooperative_matrix, max_binding| {
        vulkan_with(VulkanOptions {
            matmul: Some(MatmulVariant::Workgroup),
            cooperative_matrix,
            max_binding,
            ..Default::default()
        })
    };
    let Some(forced) = open(Some(true), None) else { return };
    let info = forced.device().info();
    let spec = info.specializations();
    println!(
        "[ops] vulkan cooperative matrix on {}: {} (size {:?})",
        info.name,
        spec.cooperative_matrix,
        forced.paths().cooperative_matrix
    );
    assert_eq!(
        forced.paths().cooperative_matrix.map(u32::from),
        spec.cooperative_matrix_size,
        "forced on wherever the device offers a shape the kernels use"
    );
    if common::coop_required() {
        assert!(
            forced.paths().cooperative_matrix.is_some(),
            "{}",
            spec.cooperative_matrix
        );
    }
    let default = open(None, None).expect("the device opened once");
    assert_eq!(
        default.paths().cooperative_matrix.is_some(),
        spec.cooperative_matrix.is_used(),
        "the default follows the device when weights are in buffers"
    );
    drop(default);
    let n_out = 100;
    let mut rng = Rng(0xc0_0b);
    let file = every_format(&mut rng, n_out);
    let mut failures = Vec::new();
    let mut check = |be: &VulkanBackend, ty: GgmlType, how: &str| {
        be.enable_profile().expect("timestamps");
        let (name, k) = (ty.name(), odd_width(ty));
        let wd = dequantized(&file, name);
        let mut line = format!("[ops] vulkan {how} matmul {name:>6} {n_out}x{k}:");
        for rows in [1usize, 33, 70] {
            let x = rng.vec(rows * k, 1.0);
            let want = reference_matmul(ty, &wd, &x, rows, n_out, k);
            let e = nmse(&run_matmul(be, &file, name, &x, rows, n_out), &want);
            line += &format!(" rows {rows} {e:.1e}");
            if e.is_nan() || e > NMSE_F16 {
                failures.push(format!("{how} {name} rows {rows}: NMSE {e:.2e}"));
            }
        }
        let calls = common::gpu_golden::vulkan_calls(be, "matmul_coop");
        println!("{line}; matmul_coop dispatches {calls}");
        calls
    };
    let coop = forced.paths().cooperative_matrix.is_some();
    drop(forced);
    for ty in kernels::quant_types() {
        let be = open(Some(true), None).expect("the device opened once");
        let calls = check(&be, ty, "coop");
        // F32 weights keep f32 arithmetic.
        let want = if coop && ty != GgmlType::F32 { 2 } else { 0 };
        assert_eq!(calls, want, "{ty}: matmul_coop ran {calls} times");
    }
    // Weights split over buffers of at most 40 rows: a tile of 64 weight rows spans two parts.
    for ty in [GgmlType::Q8_0, GgmlType::Q4_K] {
        let be = open(Some(true), Some(40 * ty.bytes_for(odd_width(ty) as u64).unwrap_or(0))).expect("opened once");
        let calls = check(&be, ty, "coop split");
        assert_eq!(
            calls,
            if coop { 6 } else { 0 },
            "{ty} split: matmul_coop ran {calls} times"
        );
    }
    let off = open(Some(false), None).expect("the device opened once");
    assert_eq!(off.paths().cooperative_matrix, None);
    assert_eq!(check(&off, GgmlType::Q4_K, "coop off"), 0);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
