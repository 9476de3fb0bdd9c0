//! The memory estimate a browser load is checked against (`tinyllm::model::memory`), from the
//! GGUF header alone, against what the engine actually allocates: the KV cache of every fixture
//! family equals the estimate to the byte, and a header prefix sizes the model as the whole
//! file does (a prefix that ends inside the header asks for more bytes).

mod common;

use std::sync::Arc;

use tinyllm::backend::cpu::CpuBackend;
use tinyllm::backend::KvType;
use tinyllm::gguf::GgufFile;
use tinyllm::model::memory::estimate;
use tinyllm::model::Model;

/// Every fixture GGUF (one per family and format).
fn fixtures() -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(common::golden("fixtures"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
        .collect();
    v.sort();
    assert!(v.len() >= 9, "fixtures missing: {v:?}");
    v
}

#[test]
fn the_kv_estimate_is_what_the_engine_allocates_for_every_family() {
    let mut families = std::collections::BTreeSet::new();
    for path in fixtures() {
        let file = Arc::new(GgufFile::open(&path).unwrap());
        let arch = file.architecture().unwrap().to_string();
        let n_ctx = 96;
        let need = estimate(&file, n_ctx).unwrap();
        let model = Model::load(CpuBackend::new(1).unwrap(), file.clone()).unwrap();
        let state = model.new_state(n_ctx, KvType::F16).unwrap();
        let kv = state.kv().map_or(0, |kv| (kv.bytes_per_token() * n_ctx) as u64);
        assert_eq!(need.n_ctx, n_ctx, "{}", path.display());
        assert_eq!(need.kv, kv, "{} ({arch}): estimated KV bytes", path.display());
        assert_eq!(
            need.recurrent > 0,
            matches!(arch.as_str(), "qwen35" | "qwen35moe"),
            "{}: recurrent state {}",
            path.display(),
            need.recurrent
        );
        let file_bytes = std::fs::metadata(&path).unwrap().len();
        assert!(
            need.weights <= file_bytes && need.weights * 10 > file_bytes * 9,
            "{}",
            path.display()
        );
        families.insert(arch);
    }
    eprintln!("families checked: {families:?}");
    assert!(families.len() >= 9, "{families:?}");
}

#[test]
fn a_header_prefix_sizes_the_model_as_the_whole_file_does() {
    for path in fixtures() {
        let bytes = std::fs::read(&path).unwrap();
        let whole = estimate(&GgufFile::open(&path).unwrap(), 0).unwrap();
        // Too short: the parser says how many bytes the header needs.
        let need = match GgufFile::from_header_prefix(&bytes[..64], bytes.len() as u64).unwrap() {
            Err(need) => need as usize,
            Ok(_) => panic!("{}: a 64-byte prefix parsed", path.display()),
        };
        assert!(need > 64 && need <= bytes.len(), "{}: {need}", path.display());
        let mut prefix = need;
        let file = loop {
            match GgufFile::from_header_prefix(&bytes[..prefix], bytes.len() as u64).unwrap() {
                Ok(f) => break f,
                Err(more) => {
                    assert!(more as usize > prefix, "{}: no progress at {prefix}", path.display());
                    prefix = (more as usize).min(bytes.len());
                }
            }
        };
        assert_eq!(estimate(&file, 0).unwrap(), whole, "{}", path.display());
        assert!(
            prefix < bytes.len() / 2,
            "{}: the header took {prefix} bytes",
            path.display()
        );
    }
}

/// Prints the header-derived parts of the real models' estimates (natively sized; the browser
/// test reports the wasm32 ones).
#[test]
#[ignore]
fn print_real_model_parts() {
    for m in ["qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "gemma-3-270m-q4_k_m.gguf"] {
        let file = GgufFile::open(common::real_model(m)).unwrap();
        eprintln!("{m}: {:?}", estimate(&file, 1024).unwrap());
    }
}
