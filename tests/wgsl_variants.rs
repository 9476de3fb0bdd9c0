//! Every WGSL kernel variant generated at build time (`build.rs` writes each kernel template
//! with each block decoder and specialization to `OUT_DIR/wgsl/`) parses and validates with
//! naga, the shader compiler inside wgpu, so a broken variant fails here on any machine, with
//! or without an adapter; and the generated set is exactly the kernels the backend builds.

use tinyllm::backend::webgpu::kernels::{self, Kernel};

#[test]
fn every_kernel_variant_parses_and_validates() {
    let variants = kernels::all_variants();
    assert!(variants.len() > 3 * kernels::quant_types().len());
    let mut names: Vec<String> = variants.iter().map(|k| k.variant()).collect();
    names.sort();
    names.dedup();
    let generated: Vec<String> = kernels::VARIANTS.iter().map(|(n, _)| n.to_string()).collect();
    assert_eq!(names, generated, "the generated files and the backend's kernels differ");
    let mut failures = Vec::new();
    for k in &variants {
        let src = k.source().unwrap_or_else(|| panic!("{}: no source", k.label()));
        assert!(
            !src.contains("//INCLUDE"),
            "{}: an include was left unresolved",
            k.label()
        );
        let module = match naga::front::wgsl::parse_str(src) {
            Ok(m) => m,
            Err(e) => {
                failures.push(format!("{}: {}", k.label(), e.emit_to_string(src)));
                continue;
            }
        };
        let mut v = naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(), // unpack2x16float / pack2x16float (f16 storage, f32 arithmetic), which wgpu grants.
            // Subgroup operations: the `_subgroup` matmul variants, built where the device has them.
            // f16 arithmetic: the `_f16` matmul variants, built where the device has shader-f16.
            naga::valid::Capabilities::SHADER_FLOAT16_IN_FLOAT32
                | naga::valid::Capabilities::SUBGROUP
                | naga::valid::Capabilities::SHADER_FLOAT16
                // Cooperative matrices: the `matmul_coop` variants (Vulkan only).
                | naga::valid::Capabilities::COOPERATIVE_MATRIX,
        );
        v.subgroup_stages(naga::valid::ShaderStages::COMPUTE)
            .subgroup_operations(naga::valid::SubgroupOperationSet::all());
        if let Err(e) = v.validate(&module) {
            failures.push(format!("{}: {}", k.label(), e.emit_to_string(src)));
            continue;
        }
        assert!(
            module.entry_points.iter().any(|ep| ep.name == k.entry()),
            "{}: entry point '{}' missing",
            k.label(),
            k.entry()
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    println!("[wgsl] {} variants parse and validate", variants.len());
}

/// Every weight format without a WGSL decoder (in `quant::support`'s table) has no matmul
/// source, so a model in it fails to load on the GPU with an error rather than running wrong.
#[test]
fn unsupported_formats_have_no_variant() {
    use tinyllm::quant::{has_vec_dot, GgmlType};
    let without: Vec<GgmlType> = GgmlType::ALL
        .iter()
        .copied()
        .filter(|&t| has_vec_dot(t) && !kernels::supports(t))
        .collect();
    assert!(without.contains(&GgmlType::NVFP4), "{without:?}");
    for ty in without {
        let k = Kernel::Matmul {
            ty,
            width: 4,
            subgroup: false,
            f16: false,
        };
        assert!(k.source().is_none(), "{ty}");
    }
}

/// The sizes delta_net.wgsl and its dispatch plan share (columns per workgroup, the longest
/// state column) are the same numbers on both sides.
#[test]
fn delta_net_sizes_agree_with_the_plan() {
    use tinyllm::backend::gpu::{DELTA_COLUMNS, DELTA_MAX_DK};
    let src = Kernel::DeltaNet.source().expect("delta_net source");
    for line in [
        format!("const WG: u32 = {DELTA_COLUMNS}u;"),
        format!("@workgroup_size({DELTA_COLUMNS})"),
        format!("const MAX_DK: u32 = {DELTA_MAX_DK}u;"),
    ] {
        assert!(src.contains(&line), "delta_net.wgsl lacks `{line}`");
    }
}
