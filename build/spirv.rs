//! The build script's SPIR-V step: every generated WGSL variant through naga (parse, validate,
//! SPIR-V out) into `OUT_DIR/spirv/NAME.spv`, and `OUT_DIR/spirv_variants.rs`, the table that
//! embeds them in the library for `src/backend/vulkan/spirv.rs`, with each module's entry
//! points (and workgroup sizes) and resource bindings.
//!
//! The SPIR-V keeps WGSL's semantics, as wgpu's Vulkan backend compiles the same sources:
//! out-of-range indices into arrays, vectors and textures are clamped (`Restrict`); buffer
//! accesses are left to the device's `robustBufferAccess` (a feature every Vulkan device has,
//! which the device layer enables); workgroup memory is zeroed by the shader itself; integer
//! division by zero is defined. Specializations that are not in the SPIR-V (the subgroup size
//! a pipeline requires) are chosen when the pipeline is created.

use std::fmt::Write as _;
use std::path::Path;

use naga::back::spv;
use naga::proc::{BoundsCheckPolicies, BoundsCheckPolicy};

/// SPIR-V 1.3: the subgroup operations' version, which every Vulkan 1.1 device takes.
const SPIRV_VERSION: (u8, u8) = (1, 3);

/// One variant's SPIR-V and what the table says about it.
struct Compiled {
    words: Vec<u32>,
    /// (entry point name, workgroup size, indices into `bindings` of those it uses)
    entries: Vec<(String, [u32; 3], Vec<usize>)>,
    /// (group, binding, kind as the table's `BindingKind` variant)
    bindings: Vec<(u32, u32, &'static str)>,
}

/// Compile every variant (on all cores: the variants are independent), write the `.spv` files
/// and the table. A variant naga rejects fails the build with its name and naga's reason.
pub fn generate(out: &Path, variants: &[(String, String)]) {
    let dir = out.join("spirv");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).max(1);
    let chunk = variants.len().div_ceil(threads).max(1);
    let results: Vec<Result<Compiled, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = variants
            .chunks(chunk)
            .map(|part| s.spawn(move || part.iter().map(|(n, src)| compile(n, src)).collect::<Vec<_>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a SPIR-V compile thread panicked"))
            .collect()
    });
    let failures: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    if !failures.is_empty() {
        let list: Vec<&str> = failures.iter().map(|s| s.as_str()).collect();
        panic!(
            "naga cannot compile these kernel variants to SPIR-V:\n{}",
            list.join("\n")
        );
    }
    let mut table = String::from(
        "/// Every generated kernel variant compiled to SPIR-V, sorted by name (`build/spirv.rs`).\n\
         pub static SPIRV: &[SpirvKernel] = &[\n",
    );
    for ((name, _), compiled) in variants.iter().zip(results) {
        let c = compiled.expect("failures were reported above");
        let bytes: Vec<u8> = c.words.iter().flat_map(|w| w.to_le_bytes()).collect();
        write_if_changed(&dir.join(format!("{name}.spv")), &bytes);
        let entries: Vec<String> = c
            .entries
            .iter()
            .map(|(n, [x, y, z], used)| {
                let used: Vec<String> = used
                    .iter()
                    .map(|i| {
                        let (g, b, k) = c.bindings[*i];
                        format!("Binding {{ group: {g}, binding: {b}, kind: BindingKind::{k} }}")
                    })
                    .collect();
                format!(
                    "EntryPoint {{ name: {n:?}, workgroup_size: [{x}, {y}, {z}], bindings: &[{}] }}",
                    used.join(", ")
                )
            })
            .collect();
        let bindings: Vec<String> = c
            .bindings
            .iter()
            .map(|(g, b, k)| format!("Binding {{ group: {g}, binding: {b}, kind: BindingKind::{k} }}"))
            .collect();
        writeln!(
            table,
            "    SpirvKernel {{ name: {name:?}, spirv: include_bytes!(concat!(env!(\"OUT_DIR\"), \"/spirv/{name}.spv\")), \
             entries: &[{}], bindings: &[{}] }},",
            entries.join(", "),
            bindings.join(", ")
        )
        .unwrap();
    }
    table.push_str("];\n");
    write_if_changed(&out.join("spirv_variants.rs"), table.as_bytes());
}

/// One variant: WGSL -> naga module -> validated -> SPIR-V words, with its reflection.
fn compile(name: &str, src: &str) -> Result<Compiled, String> {
    let module = naga::front::wgsl::parse_str(src).map_err(|e| format!("{name}: {}", e.emit_to_string(src)))?;
    // What the kernels may use: subgroup operations (the `_subgroup` variants), f16 (the
    // `_f16` ones) and cooperative matrices (`matmul_coop`, with f16 and subgroup ids); the
    // device layer builds a variant only where the device has them.
    let mut validator = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::SHADER_FLOAT16_IN_FLOAT32
            | naga::valid::Capabilities::SUBGROUP
            | naga::valid::Capabilities::SHADER_FLOAT16
            | naga::valid::Capabilities::COOPERATIVE_MATRIX,
    );
    validator
        .subgroup_stages(naga::valid::ShaderStages::COMPUTE)
        .subgroup_operations(naga::valid::SubgroupOperationSet::all());
    let info = validator
        .validate(&module)
        .map_err(|e| format!("{name}: {}", e.emit_to_string(src)))?;
    let options = spv::Options {
        lang_version: SPIRV_VERSION,
        // No debug names: they would about double the size, and the WGSL is at hand.
        flags: spv::WriterFlags::empty(),
        // With no binding map, each `@group(g) @binding(b)` becomes descriptor set g, binding b.
        fake_missing_bindings: true,
        bounds_check_policies: BoundsCheckPolicies {
            index: BoundsCheckPolicy::Restrict,
            buffer: BoundsCheckPolicy::Unchecked,
            image_load: BoundsCheckPolicy::Restrict,
            binding_array: BoundsCheckPolicy::Unchecked,
        },
        zero_initialize_workgroup_memory: spv::ZeroInitializeWorkgroupMemoryMode::Polyfill,
        // Compute shaders have no f16 inputs or outputs: declaring StorageInputOutput16 anyway
        // would make drivers without that feature (most) refuse the f16 kernels.
        use_storage_input_output_16: false,
        // Every loop of the kernels is bounded by its parameters; injected loop counters only
        // keep drivers from unrolling and vectorizing (as the WebGPU backend sets for wgpu).
        force_loop_bounding: false,
        ..spv::Options::default()
    };
    let words = spv::write_vec(&module, &info, &options, None).map_err(|e| format!("{name}: SPIR-V output: {e}"))?;
    let mut bindings = Vec::new();
    let mut handles = Vec::new();
    for (handle, var) in module.global_variables.iter() {
        let Some(rb) = &var.binding else { continue };
        let kind = match (var.space, &module.types[var.ty].inner) {
            (naga::AddressSpace::Storage { access }, _) if access.contains(naga::StorageAccess::STORE) => "Storage",
            (naga::AddressSpace::Storage { .. }, _) => "StorageRead",
            (naga::AddressSpace::Uniform, _) => "Uniform",
            (
                naga::AddressSpace::Handle,
                naga::TypeInner::Image {
                    class: naga::ImageClass::Storage { .. },
                    ..
                },
            ) => "StorageImage",
            (naga::AddressSpace::Handle, naga::TypeInner::Image { .. }) => "SampledImage",
            (naga::AddressSpace::Handle, naga::TypeInner::Sampler { .. }) => "Sampler",
            (space, _) => {
                return Err(format!(
                    "{name}: a binding in address space {space:?} has no descriptor kind"
                ))
            }
        };
        bindings.push((rb.group, rb.binding, kind));
        handles.push(handle);
    }
    let mut order: Vec<usize> = (0..bindings.len()).collect();
    order.sort_by_key(|&i| bindings[i]);
    let handles: Vec<_> = order.iter().map(|&i| handles[i]).collect();
    let bindings: Vec<_> = order.iter().map(|&i| bindings[i]).collect();
    // What each entry point uses: a pipeline's layout, and a dispatch's descriptors, name only
    // those (a module's other entry points may bind more).
    let entries = module
        .entry_points
        .iter()
        .enumerate()
        .filter(|(_, ep)| ep.stage == naga::ShaderStage::Compute)
        .map(|(i, ep)| {
            let fi = info.get_entry_point(i);
            let used = (0..bindings.len()).filter(|&b| !fi[handles[b]].is_empty()).collect();
            (ep.name.clone(), ep.workgroup_size, used)
        })
        .collect();
    Ok(Compiled {
        words,
        entries,
        bindings,
    })
}

/// Write only when the content differs, so unchanged variants keep their timestamps.
fn write_if_changed(path: &Path, content: &[u8]) {
    if std::fs::read(path).ok().as_deref() != Some(content) {
        std::fs::write(path, content).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    }
}
