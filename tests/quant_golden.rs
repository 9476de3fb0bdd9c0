//! Dequantization of every golden type, bit for bit against gguf-py's `dequantize()` (which
//! agrees bit for bit with ggml's `to_float`, see tests/golden/README). One test per type, so a
//! failure names its type.

use std::path::PathBuf;

use serde_json::Value;
use tinyllm::quant::{dequantize, GgmlType};

fn quants_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/quants")
}

fn read(name: &str) -> Vec<u8> {
    let path = quants_dir().join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

fn index() -> Value {
    serde_json::from_slice(&read("index.json")).expect("index.json is valid JSON")
}

/// The index entry for `name`.
fn entry(name: &str) -> Value {
    let index = index();
    let types = index["types"].as_array().expect("index.json has a types array");
    types
        .iter()
        .find(|t| t["type"] == name)
        .unwrap_or_else(|| panic!("{name} is not in index.json"))
        .clone()
}

fn check_type(name: &str) {
    let entry = entry(name);
    let ty = GgmlType::from_name(name).unwrap_or_else(|| panic!("unknown type name {name}"));
    let id = entry["ggml_type_id"].as_u64().expect("ggml_type_id");
    assert_eq!(ty as u64, id, "{name}: type id");
    assert_eq!(
        entry["block_size"].as_u64(),
        Some(ty.block_size() as u64),
        "{name}: block size"
    );
    assert_eq!(
        entry["bytes_per_block"].as_u64(),
        Some(ty.block_bytes() as u64),
        "{name}: block bytes"
    );

    let shape: Vec<usize> = entry["shape"]
        .as_array()
        .expect("shape")
        .iter()
        .map(|v| v.as_u64().expect("dim") as usize)
        .collect();
    let elements: usize = shape.iter().product();
    let bin = read(entry["bin"].as_str().expect("bin"));
    assert_eq!(
        bin.len() as u64,
        entry["bin_bytes"].as_u64().expect("bin_bytes"),
        "{name}: .bin size"
    );
    let want: Vec<f32> = read(entry["f32"].as_str().expect("f32"))
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(want.len(), elements, "{name}: .f32 size");

    let mut got = vec![0f32; elements];
    dequantize(ty, &bin, &mut got).unwrap_or_else(|e| panic!("{name}: dequantize failed: {e}"));
    let mismatches: Vec<usize> = (0..elements)
        .filter(|&i| got[i].to_bits() != want[i].to_bits())
        .collect();
    if let Some(&first) = mismatches.first() {
        panic!(
            "{name}: {} of {elements} values differ; first at index {first} (row {}, column {}): got {:e} \
             ({:#010x}), want {:e} ({:#010x})",
            mismatches.len(),
            first / shape[1],
            first % shape[1],
            got[first],
            got[first].to_bits(),
            want[first],
            want[first].to_bits()
        );
    }
}

macro_rules! golden_types {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            #[allow(non_snake_case)]
            fn $name() {
                check_type(stringify!($name));
            }
        )*

        /// Every type in index.json has a test above, so none is skipped silently.
        #[test]
        fn index_lists_exactly_the_tested_types() {
            let tested = [$(stringify!($name)),*];
            let index = index();
            let listed: Vec<&str> = index["types"]
                .as_array()
                .expect("types array")
                .iter()
                .map(|t| t["type"].as_str().expect("type name"))
                .collect();
            let mut a = tested.to_vec();
            let mut b = listed.clone();
            a.sort_unstable();
            b.sort_unstable();
            assert_eq!(a, b, "golden types and tested types differ");
        }
    };
}

golden_types!(
    F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S,
    IQ1_S, IQ1_M, IQ4_NL, IQ4_XS, TQ1_0, TQ2_0, MXFP4, NVFP4, Q1_0,
);
