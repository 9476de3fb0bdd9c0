//! The CPU kernels of the wasm build against the scalar `vec_dot` oracle, in WebAssembly
//! itself: every matrix of the golden fixtures, one row and a batch, and llama.cpp's blocks of
//! every covered format as tiles of several shapes, with the kernels the browser runs (SIMD128
//! where the build has it, relaxed SIMD where it has that) and the portable set. Native builds
//! compile this file to nothing. `scripts/test.sh` runs the SIMD128 build in Node and the
//! relaxed one in headless Chromium (Node 20's relaxed SIMD, behind a flag, computes the byte
//! dot product wrongly):
//!
//! CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=wasm-bindgen-test-runner \
//!   CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS="-C target-feature=+simd128,+relaxed-simd" \
//!   WASM_BINDGEN_USE_BROWSER=1 CHROMEDRIVER=/usr/bin/chromedriver \
//!   WASM_BINDGEN_TEST_WEBDRIVER_JSON=web/tests/webdriver.json \
//!   cargo test -p tinyllm-web --target wasm32-unknown-unknown --test kernels

#![cfg(target_arch = "wasm32")]

use std::sync::Arc;

use tinyllm::backend::cpu::interleave;
use tinyllm::backend::cpu::kernels::{Kernels, Layout, TileOut};
use tinyllm::backend::cpu::CpuBackend;
use tinyllm::backend::Backend;
use tinyllm::gguf::GgufFile;
use tinyllm::quant::GgmlType;
use wasm_bindgen_test::wasm_bindgen_test;

/// The fixtures, embedded (the test runs where there is no file system).
const FIXTURES: [(&str, &[u8]); 17] = [
    (
        "llama.F16",
        include_bytes!("../../tests/golden/fixtures/llama.F16.gguf"),
    ),
    (
        "deepseek2.Q4_K_M",
        include_bytes!("../../tests/golden/fixtures/deepseek2.Q4_K_M.gguf"),
    ),
    (
        "llama.Q8_0",
        include_bytes!("../../tests/golden/fixtures/llama.Q8_0.gguf"),
    ),
    (
        "llama.Q5_0",
        include_bytes!("../../tests/golden/fixtures/llama.Q5_0.gguf"),
    ),
    (
        "llama.Q4_0",
        include_bytes!("../../tests/golden/fixtures/llama.Q4_0.gguf"),
    ),
    (
        "llama.Q4_K_M",
        include_bytes!("../../tests/golden/fixtures/llama.Q4_K_M.gguf"),
    ),
    (
        "llama.Q6_K",
        include_bytes!("../../tests/golden/fixtures/llama.Q6_K.gguf"),
    ),
    (
        "llama.IQ4_XS",
        include_bytes!("../../tests/golden/fixtures/llama.IQ4_XS.gguf"),
    ),
    (
        "llama.Q2_K",
        include_bytes!("../../tests/golden/fixtures/llama.Q2_K.gguf"),
    ),
    (
        "llama.Q3_K_M",
        include_bytes!("../../tests/golden/fixtures/llama.Q3_K_M.gguf"),
    ),
    (
        "gemma3.Q4_K_M",
        include_bytes!("../../tests/golden/fixtures/gemma3.Q4_K_M.gguf"),
    ),
    (
        "llama.IQ2_XS",
        include_bytes!("../../tests/golden/fixtures/llama.IQ2_XS.gguf"),
    ),
    (
        "llama.IQ3_XXS",
        include_bytes!("../../tests/golden/fixtures/llama.IQ3_XXS.gguf"),
    ),
    (
        "llama.IQ1_M",
        include_bytes!("../../tests/golden/fixtures/llama.IQ1_M.gguf"),
    ),
    (
        "llama.Q1_0",
        include_bytes!("../../tests/golden/fixtures/llama.Q1_0.gguf"),
    ),
    (
        "llama.IQ1_S",
        include_bytes!("../../tests/golden/fixtures/llama.IQ1_S.gguf"),
    ),
    (
        "llama.TQ1_0",
        include_bytes!("../../tests/golden/fixtures/llama.TQ1_0.gguf"),
    ),
];

async fn matmul(be: &CpuBackend, file: &Arc<GgufFile>, name: &str, x: &[f32], rows: usize, n: usize) -> Vec<f32> {
    let w = be.load_weight(file, name).unwrap();
    let mut xb = be.alloc(x.len()).unwrap();
    be.write(&mut xb, x).unwrap();
    let mut out = be.alloc(rows * n).unwrap();
    be.matmul(&w, &xb, rows, &mut out).unwrap();
    be.read(&out, rows * n).unwrap().await.unwrap()
}

/// The kernel sets of this build: portable, SIMD128 where built with it, relaxed SIMD where
/// built with that (the build's default last).
fn kernel_sets() -> Vec<Kernels> {
    #[allow(unused_mut)]
    let mut sets = vec![Kernels::portable()];
    #[cfg(target_feature = "simd128")]
    sets.push(Kernels::simd128());
    #[cfg(target_feature = "relaxed-simd")]
    sets.push(Kernels::relaxed());
    sets
}

/// llama.cpp's quantized blocks of every format the wasm kernels cover (`tests/golden/quants`:
/// 2048 values of `source.f32` each; F32 is `source.f32` itself).
const BLOBS: [(GgmlType, &[u8]); 26] = [
    (GgmlType::F32, include_bytes!("../../tests/golden/quants/source.f32")),
    (GgmlType::F16, include_bytes!("../../tests/golden/quants/F16.bin")),
    (GgmlType::BF16, include_bytes!("../../tests/golden/quants/BF16.bin")),
    (GgmlType::Q5_K, include_bytes!("../../tests/golden/quants/Q5_K.bin")),
    (GgmlType::IQ4_XS, include_bytes!("../../tests/golden/quants/IQ4_XS.bin")),
    (GgmlType::MXFP4, include_bytes!("../../tests/golden/quants/MXFP4.bin")),
    (GgmlType::Q4_0, include_bytes!("../../tests/golden/quants/Q4_0.bin")),
    (GgmlType::Q4_1, include_bytes!("../../tests/golden/quants/Q4_1.bin")),
    (GgmlType::Q5_0, include_bytes!("../../tests/golden/quants/Q5_0.bin")),
    (GgmlType::Q5_1, include_bytes!("../../tests/golden/quants/Q5_1.bin")),
    (GgmlType::Q8_0, include_bytes!("../../tests/golden/quants/Q8_0.bin")),
    (GgmlType::IQ4_NL, include_bytes!("../../tests/golden/quants/IQ4_NL.bin")),
    (GgmlType::Q4_K, include_bytes!("../../tests/golden/quants/Q4_K.bin")),
    (GgmlType::Q6_K, include_bytes!("../../tests/golden/quants/Q6_K.bin")),
    (GgmlType::Q2_K, include_bytes!("../../tests/golden/quants/Q2_K.bin")),
    (GgmlType::Q3_K, include_bytes!("../../tests/golden/quants/Q3_K.bin")),
    (GgmlType::TQ2_0, include_bytes!("../../tests/golden/quants/TQ2_0.bin")),
    (
        GgmlType::IQ2_XXS,
        include_bytes!("../../tests/golden/quants/IQ2_XXS.bin"),
    ),
    (GgmlType::IQ2_XS, include_bytes!("../../tests/golden/quants/IQ2_XS.bin")),
    (GgmlType::IQ2_S, include_bytes!("../../tests/golden/quants/IQ2_S.bin")),
    (
        GgmlType::IQ3_XXS,
        include_bytes!("../../tests/golden/quants/IQ3_XXS.bin"),
    ),
    (GgmlType::IQ3_S, include_bytes!("../../tests/golden/quants/IQ3_S.bin")),
    (GgmlType::IQ1_S, include_bytes!("../../tests/golden/quants/IQ1_S.bin")),
    (GgmlType::IQ1_M, include_bytes!("../../tests/golden/quants/IQ1_M.bin")),
    (GgmlType::TQ1_0, include_bytes!("../../tests/golden/quants/TQ1_0.bin")),
    (GgmlType::Q1_0, include_bytes!("../../tests/golden/quants/Q1_0.bin")),
];

/// Each SIMD set's tiles on llama.cpp's blocks of each covered format, as matrices of several
/// shapes (a partial last tile and half included; the float formats as file rows), against the
/// oracle's single dot products: every output within the f32 reordering bound.
#[wasm_bindgen_test]
fn wasm_tiles_match_the_oracle_on_the_golden_blocks() {
    let covered = tinyllm::quant::supported(|s| s.wasm_simd);
    let mut blobs: Vec<GgmlType> = BLOBS.iter().map(|(t, _)| *t).collect();
    blobs.sort_by_key(|t| t.name());
    let mut want: Vec<GgmlType> = covered.clone();
    want.sort_by_key(|t| t.name());
    assert_eq!(blobs, want, "a golden blob per covered format");
    let oracle = Kernels::oracle();
    for kernels in kernel_sets().into_iter().filter(|k| k.variant != "portable") {
        for (ty, blob) in BLOBS {
            for k in [ty.block_size().max(64), 256] {
                let row_bytes = k / ty.block_size() * ty.block_bytes();
                let all = blob.len() / row_bytes;
                for n in [all, all.min(5), all.min(13)] {
                    let rows = &blob[..n * row_bytes];
                    let (tiles, layout) = if (kernels.interleaves)(ty) {
                        (interleave::interleave(ty, k, rows).unwrap(), Layout::Interleaved)
                    } else {
                        (rows.to_vec(), Layout::Rows)
                    };
                    for batch in [1usize, 2, 3, 7, 13] {
                        let x: Vec<f32> = (0..batch * k).map(|i| 0.3 + 1.7 * ((i as f32) * 0.61).sin()).collect();
                        let act = (kernels.prepare)(ty, &x, k).unwrap();
                        let mut got = vec![f32::NAN; batch * n];
                        (kernels.tile)(ty, layout, k, &tiles, &act, &mut TileOut::new(&mut got, batch));
                        let oact = (oracle.prepare)(ty, &x, k).unwrap();
                        let mut exp = vec![f32::NAN; batch * n];
                        (oracle.tile)(ty, Layout::Rows, k, rows, &oact, &mut TileOut::new(&mut exp, batch));
                        let scale = exp.iter().fold(0f32, |a, v| a.max(v.abs())).max(1e-6);
                        for (i, (a, b)) in got.iter().zip(&exp).enumerate() {
                            assert!(
                                (a - b).abs() <= 1e-5 * scale,
                                "{} {ty} k={k} n={n} batch={batch} [{i}]: {a} vs oracle {b}",
                                kernels.variant
                            );
                        }
                    }
                }
            }
        }
        web_sys_log(&format!(
            "{}: the golden blocks of {} formats equal the oracle",
            kernels.variant,
            BLOBS.len()
        ));
    }
}

/// Each SIMD set's Q8_0 activation blocks (quantized in vectors) are the oracle's byte for
/// byte: random rows of several magnitudes, and blocks of ties (`x · 127 / amax` exactly half
/// way, which go to even), zeros, NaNs, infinities, subnormals and values near f16's range.
#[wasm_bindgen_test]
fn wasm_q8_0_activations_are_the_oracles_byte_for_byte() {
    let oracle = Kernels::oracle();
    let mut x: Vec<f32> = (0..64 * 32)
        .map(|i| {
            let t = (i as f32 * 0.7311).sin() * 1000.0f32.powf(((i / 32) % 7) as f32 / 3.0 - 1.0);
            if i % 97 == 0 {
                0.0
            } else {
                t
            }
        })
        .collect();
    let special: [[f32; 4]; 6] = [
        [127.0, 2.5, -3.5, 0.5],
        [127.0, -0.5, 1.5, -126.5],
        [f32::NAN, 1.0, -2.0, 3.0],
        [f32::INFINITY, 1.0, 0.0, -1.0],
        [1e-40, -3e-41, 0.0, 7e-45],
        [65504.0 * 127.0, -1e38, 3e38, 1.0],
    ];
    for s in special {
        x.extend((0..32).map(|i| s[i % 4] * if i < 4 { 1.0 } else { 0.25 * (i % 5) as f32 }));
    }
    x.extend([0.0f32; 32]);
    let k = 64;
    for kernels in kernel_sets().into_iter().filter(|k| k.variant != "portable") {
        for ty in [
            GgmlType::Q8_0,
            GgmlType::Q5_0,
            GgmlType::Q4_1,
            GgmlType::IQ4_NL,
            GgmlType::MXFP4,
        ] {
            let got = (kernels.prepare)(ty, &x, k).unwrap();
            let want = (oracle.prepare)(ty, &x, k).unwrap();
            assert_eq!(got.rows(), want.rows());
            assert!(!want.blocks().is_empty());
            for (b, (g, w)) in got.blocks().chunks(34).zip(want.blocks().chunks(34)).enumerate() {
                assert_eq!(
                    g,
                    w,
                    "{} {ty}: block {b} of {:?}",
                    kernels.variant,
                    &x[32 * b..32 * b + 32]
                );
            }
        }
    }
}

/// The kernels' f16 conversion (vectors, no F16C in wasm) equals `half`'s for every value.
#[cfg(target_feature = "simd128")]
#[wasm_bindgen_test]
fn f16_conversion_is_exact_for_every_value() {
    for bits in 0..=u16::MAX {
        let want = half::f16::from_bits(bits).to_f32();
        let got = tinyllm::backend::cpu::wasm::f16_to_f32(bits);
        assert!(
            got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
            "{bits:#06x}: {got} vs {want}"
        );
    }
}

/// The attention's vector f16 rounding (no F16C in wasm) equals `half`'s round trip: every
/// 251st f32 bit pattern (17 million values, every binade and sign) and the edges (f16's
/// subnormal ties, its largest finite value and the overflow tie, zeros, infinities, NaN).
#[cfg(target_feature = "simd128")]
#[wasm_bindgen_test]
fn f16_rounding_and_widening_match_half() {
    use tinyllm::backend::cpu::wasm::{round_f16_in_place, widen_f16};
    let edges = [
        0.0f32,
        -0.0,
        5.960_464_5e-8,
        2.980_232_2e-8,
        2.980_233e-8,
        8.940_697e-8,
        6.103_515_6e-5,
        65504.0,
        65519.99,
        65520.0,
        -65520.0,
        1e9,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MIN_POSITIVE,
        1.0,
        -1.000_488_3,
    ];
    let mut x: Vec<f32> = (0..u32::MAX / 251)
        .map(|i| f32::from_bits(i * 251))
        .chain(edges)
        .collect();
    let want: Vec<f32> = x.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect();
    round_f16_in_place(&mut x);
    for (i, (g, w)) in x.iter().zip(&want).enumerate() {
        assert!(
            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
            "[{i}]: {g:e} vs half {w:e}"
        );
    }
    let h: Vec<half::f16> = (0..=u16::MAX).map(half::f16::from_bits).collect();
    let mut wide = vec![0f32; h.len()];
    widen_f16(&h, &mut wide);
    for (a, b) in h.iter().zip(&wide) {
        assert!(
            a.to_f32().to_bits() == b.to_bits() || b.is_nan(),
            "{:#06x}",
            a.to_bits()
        );
    }
}

#[wasm_bindgen_test]
async fn wasm_kernels_match_the_vec_dot_oracle() {
    let oracle = CpuBackend::with_kernels(1, Kernels::oracle()).unwrap();
    let sets = kernel_sets();
    assert_eq!(
        Kernels::detect().variant,
        sets.last().unwrap().variant,
        "the build's default kernels are the ones tested last"
    );
    let mut types = std::collections::BTreeSet::new();
    for kernels in sets {
        let be = CpuBackend::with_kernels(1, kernels).unwrap();
        let mut checked = 0;
        for (name, bytes) in FIXTURES {
            let file = Arc::new(GgufFile::from_bytes(bytes.to_vec()).unwrap());
            for info in file.tensors().iter().filter(|t| t.shape.len() == 2) {
                let (k, n) = (info.shape[0] as usize, info.shape[1] as usize);
                types.insert(info.ty.to_string());
                for rows in [1usize, 3, 11] {
                    let x: Vec<f32> = (0..rows * k).map(|i| 0.1 + 2.0 * ((i as f32) * 0.37).cos()).collect();
                    let got = matmul(&be, &file, &info.name, &x, rows, n).await;
                    let want = matmul(&oracle, &file, &info.name, &x, rows, n).await;
                    let scale = want.iter().fold(0f32, |a, v| a.max(v.abs())).max(1e-6);
                    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            (a - b).abs() <= 1e-5 * scale,
                            "{} kernels, {name} {} ({}) rows {rows} [{i}]: {a} vs oracle {b}",
                            kernels.variant,
                            info.name,
                            info.ty
                        );
                    }
                    checked += 1;
                }
            }
        }
        web_sys_log(&format!(
            "{} kernels: {checked} matrices equal the oracle",
            kernels.variant
        ));
        assert!(checked > 50, "{}: only {checked} matrices", kernels.variant);
    }
    for ty in [
        "Q8_0", "Q5_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "F16", "IQ2_XS", "IQ3_XXS", "IQ1_M",
    ] {
        assert!(types.contains(ty), "no {ty} matrix among the fixtures: {types:?}");
    }
}

/// Each set's SwiGLU gate and SiLU against the scalar ones (`swiglu_scalar`, `silu_scalar`, the
/// native AVX2 kernels' twins too): within 4 f32 ulps where the result is a normal number, over magnitudes from 1e-6 to
/// 100, both signs, lengths that leave a scalar tail, and NaN passed through.
#[wasm_bindgen_test]
fn wasm_swiglu_matches_the_scalar_gate() {
    for kernels in kernel_sets() {
        for len in [1usize, 3, 4, 5, 64, 1000, 4099] {
            // Deterministic spread: exponents from -6 to 2, alternating signs.
            let gate: Vec<f32> = (0..len)
                .map(|i| {
                    let mag = 10f32.powf(-6.0 + 8.0 * ((i as f32 * 0.618_034).fract()));
                    if i % 2 == 0 {
                        mag
                    } else {
                        -mag
                    }
                })
                .collect();
            let up: Vec<f32> = (0..len).map(|i| 3.0 * ((i as f32) * 0.77).sin()).collect();
            let (mut fast, mut slow) = (gate.clone(), gate.clone());
            (kernels.swiglu)(&mut fast, &up);
            tinyllm::backend::cpu::kernels::swiglu_scalar(&mut slow, &up);
            // SiLU alone, the same values through the set's kernel and the scalar twin.
            let (mut fast_silu, mut slow_silu) = (gate.clone(), gate.clone());
            (kernels.silu)(&mut fast_silu);
            tinyllm::backend::cpu::kernels::silu_scalar(&mut slow_silu);
            for i in 0..len {
                for (what, f, s) in [("swiglu", fast[i], slow[i]), ("silu", fast_silu[i], slow_silu[i])] {
                    let tol = if s.abs() < f32::MIN_POSITIVE * 1e4 {
                        1e-30
                    } else {
                        4.0 * f32::EPSILON * s.abs()
                    };
                    assert!(
                        (f - s).abs() <= tol,
                        "{}: {what}({}) · {}: {f} vs {s}",
                        kernels.variant,
                        gate[i],
                        up[i]
                    );
                }
            }
        }
        let mut g = vec![f32::NAN; 9];
        (kernels.swiglu)(&mut g, &[1.0; 9]);
        assert!(
            g.iter().all(|v| v.is_nan()),
            "{}: NaN must stay NaN: {g:?}",
            kernels.variant
        );
        let mut g = vec![f32::NAN; 9];
        (kernels.silu)(&mut g);
        assert!(
            g.iter().all(|v| v.is_nan()),
            "{}: NaN must stay NaN in silu: {g:?}",
            kernels.variant
        );
    }
}

fn web_sys_log(s: &str) {
    wasm_bindgen_test::console_log!("{s}");
}

/// Not a test: the time of one prefill-sized matmul's parts (activation quantization, the tile
/// kernel) in this build, for profiling (`--ignored`).
#[wasm_bindgen_test]
#[ignore]
fn time_prefill_matmul_parts() {
    let now = || js_sys::Date::now();
    for ty in [GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K] {
        let kernels = kernel_sets().pop().unwrap();
        let (k, n, rows) = (1024usize, 1024usize, 128usize);
        let row_bytes = k / ty.block_size() * ty.block_bytes();
        let w: Vec<u8> = (0..n * row_bytes).map(|i| (i * 7 % 251) as u8 & 0x3f).collect();
        let tiles = interleave::interleave(ty, k, &w).unwrap();
        let x: Vec<f32> = (0..rows * k).map(|i| ((i as f32) * 0.37).cos()).collect();
        let t0 = now();
        let mut act = None;
        for _ in 0..20 {
            act = Some((kernels.prepare)(ty, &x, k).unwrap());
        }
        let t1 = now();
        let act = act.unwrap();
        let mut out = vec![0f32; rows * n];
        for _ in 0..5 {
            (kernels.tile)(
                ty,
                Layout::Interleaved,
                k,
                &tiles,
                &act,
                &mut TileOut::new(&mut out, rows),
            );
        }
        let t2 = now();
        let prep = (t1 - t0) / 20.0;
        let tile = (t2 - t1) / 5.0;
        web_sys_log(&format!(
            "{} {ty}: prepare {rows}x{k} {prep:.2} ms ({:.1} ns/value); tile {n}x{k}x{rows} {tile:.1} ms ({:.1} GMAC/s)",
            kernels.variant,
            prep * 1e6 / (rows * k) as f64,
            (n * k * rows) as f64 / tile / 1e6
        ));
    }
}

/// Not a test: the matmul of the formats read as unpacked file rows (`unpacked.rs`) against the portable path in this
/// build, one activation row (decode) and a batch of 16, for the speed-up (`--ignored`).
#[wasm_bindgen_test]
#[ignore]
fn time_codebook_matmuls() {
    use GgmlType::*;
    let now = || js_sys::Date::now();
    let (k, n) = (2048usize, 512usize);
    for ty in [IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, TQ1_0, Q1_0] {
        let row_bytes = k / ty.block_size() * ty.block_bytes();
        // Any bytes are blocks of these formats; the lookups cost the same.
        let w: Vec<u8> = (0..n * row_bytes)
            .map(|i| (i.wrapping_mul(2654435761) >> 7) as u8)
            .collect();
        let mut line = format!("{ty}:");
        for rows in [1usize, 16] {
            let x: Vec<f32> = (0..rows * k).map(|i| ((i as f32) * 0.37).cos()).collect();
            let mut ms = Vec::new();
            for kernels in [Kernels::portable(), kernel_sets().pop().unwrap()] {
                let act = (kernels.prepare)(ty, &x, k).unwrap();
                let mut out = vec![0f32; rows * n];
                let reps = if rows == 1 { 400 } else { 40 };
                let t0 = now();
                for _ in 0..reps {
                    (kernels.tile)(ty, Layout::Rows, k, &w, &act, &mut TileOut::new(&mut out, rows));
                }
                ms.push((now() - t0) / reps as f64);
            }
            line += &format!(
                " rows {rows}: portable {:.2} ms, {} {:.2} ms ({:.1}x, {:.2} GB/s of weights)",
                ms[0],
                kernel_sets().pop().unwrap().variant,
                ms[1],
                ms[0] / ms[1],
                (n * row_bytes) as f64 / ms[1] / 1e6
            );
        }
        web_sys_log(&line);
    }
}
