//! The CPU kernels of the wasm build against the scalar `vec_dot` oracle, in WebAssembly
//! itself (Node through `wasm-bindgen-test-runner`; `scripts/test.sh` runs it): every matrix
//! of the golden fixtures, one row and a batch, with the kernels the browser runs (SIMD128
//! where the build has it) and the portable set. Native builds compile this file to nothing.
//!
//! CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=wasm-bindgen-test-runner \
//!   CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS="-C target-feature=+simd128" \
//!   cargo test -p tinyllm-web --target wasm32-unknown-unknown --test kernels

#![cfg(target_arch = "wasm32")]

use std::sync::Arc;

use tinyllm::backend::cpu::kernels::Kernels;
use tinyllm::backend::cpu::CpuBackend;
use tinyllm::backend::Backend;
use tinyllm::gguf::GgufFile;
use wasm_bindgen_test::wasm_bindgen_test;

/// The fixtures, embedded (the test runs where there is no file system).
const FIXTURES: [(&str, &[u8]); 7] = [
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
        "gemma3.Q4_K_M",
        include_bytes!("../../tests/golden/fixtures/gemma3.Q4_K_M.gguf"),
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

#[wasm_bindgen_test]
async fn wasm_kernels_match_the_vec_dot_oracle() {
    let oracle = CpuBackend::with_kernels(1, Kernels::oracle()).unwrap();
    let mut sets = vec![Kernels::portable()];
    #[cfg(target_feature = "simd128")]
    sets.push(Kernels::simd128());
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
                for rows in [1usize, 3] {
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
    for ty in ["Q8_0", "Q5_0", "Q4_0", "Q4_K", "Q6_K"] {
        assert!(types.contains(ty), "no {ty} matrix among the fixtures: {types:?}");
    }
}

fn web_sys_log(s: &str) {
    wasm_bindgen_test::console_log!("{s}");
}
