//! Generates the WGSL kernel variants into `OUT_DIR/wgsl/` (one file per template × block
//! format × specialization, composed by `src/backend/gpu/compose.rs`) and
//! `OUT_DIR/wgsl_variants.rs`, the table that embeds them in the library. For native targets
//! it also compiles each variant to SPIR-V with naga (`OUT_DIR/spirv/NAME.spv`) for the Vulkan
//! backend, with `OUT_DIR/spirv_variants.rs`, the table that embeds those with each module's
//! entry points and resource bindings (read from naga's module, so the Vulkan device layer
//! builds its descriptor set layouts without parsing WGSL at run time).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

#[path = "src/backend/gpu/compose.rs"]
#[allow(dead_code)]
mod compose;
#[path = "build/spirv.rs"]
mod spirv;
#[path = "src/quant/support.rs"]
#[allow(dead_code)]
mod support;

fn main() {
    // The WebGPU backend is built everywhere but in wasm's threaded build (shared memory,
    // `+atomics`): there the browser's WebGPU handles cannot cross threads, and that build
    // exists for the CPU path alone.
    println!("cargo::rustc-check-cfg=cfg(tinyllm_webgpu)");
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let features = std::env::var("CARGO_CFG_TARGET_FEATURE").unwrap_or_default();
    if !(arch == "wasm32" && features.split(',').any(|f| f == "atomics")) {
        println!("cargo:rustc-cfg=tinyllm_webgpu");
    }
    let root = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let shaders = root.join("shaders");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let dir = out.join("wgsl");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    println!("cargo:rerun-if-changed=shaders");
    println!("cargo:rerun-if-changed=src/backend/gpu/compose.rs");
    println!("cargo:rerun-if-changed=src/quant/support.rs");
    println!("cargo:rerun-if-changed=build/spirv.rs");
    let read = |rel: &str| -> String {
        let path = shaders.join(rel);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
    };
    let mut table = String::from("/// Every generated kernel variant: (name, WGSL source), sorted by name.\n");
    table.push_str("pub static VARIANTS: &[(&str, &str)] = &[\n");
    let quants: Vec<compose::Quant> = support::SUPPORT
        .iter()
        .filter(|s| s.wgsl)
        .map(|s| (s.name, s.wgsl_texture))
        .collect();
    let mut variants = compose::variants(&read, &quants);
    if arch == "wasm32" {
        // Cooperative matrices are the Vulkan backend's alone (browsers' WebGPU has none).
        variants.retain(|(name, _)| !name.starts_with("matmul_coop"));
    }
    variants.sort();
    for (name, src) in &variants {
        let file = dir.join(format!("{name}.wgsl"));
        write_if_changed(&file, src);
        writeln!(
            table,
            "    ({name:?}, include_str!(concat!(env!(\"OUT_DIR\"), \"/wgsl/{name}.wgsl\"))),"
        )
        .unwrap();
    }
    table.push_str("];\n");
    write_if_changed(&out.join("wgsl_variants.rs"), &table);
    // The Vulkan backend (ash) exists on native targets only.
    if arch != "wasm32" {
        spirv::generate(&out, &variants);
    }
}

/// Write only when the content differs, so unchanged variants keep their timestamps.
fn write_if_changed(path: &Path, content: &str) {
    if std::fs::read_to_string(path).ok().as_deref() != Some(content) {
        std::fs::write(path, content).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    }
}
