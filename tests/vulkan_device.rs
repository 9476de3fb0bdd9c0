//! The Vulkan device layer on a real driver (Mesa lavapipe in CI): devices are enumerated and
//! described as the driver reports them, a device opens with its compute queue, and the
//! build-time SPIR-V of the kernels is accepted by the driver as compute pipelines. Without a
//! Vulkan loader or device these tests skip (tests/common's `device_or_skip`; with
//! `TINYLLM_REQUIRE_GPU=1` they fail instead). The SPIR-V itself is checked on any machine:
//! every variant has a module that naga reads back and validates.

mod common;

use tinyllm::backend::gpu::kernels;
use tinyllm::backend::vulkan::spirv::{self, BindingKind};
use tinyllm::backend::vulkan::{self, ComputePipeline, Device, DeviceInfo, DeviceType, Use, VulkanError};

/// The devices, or `None` (skip) where there are none.
fn devices_or_skip() -> Option<Vec<DeviceInfo>> {
    common::device_or_skip(|| match vulkan::list_devices() {
        Ok(d) if d.is_empty() => Err("no Vulkan devices".to_string()),
        Ok(d) => Ok(d),
        Err(e) => Err(e.to_string()),
    })
}

fn device_or_skip() -> Option<std::sync::Arc<Device>> {
    common::device_or_skip(|| Device::open(None)).map(std::sync::Arc::new)
}

/// `OpSDot` (SPV_KHR_integer_dot_product, core in SPIR-V 1.6).
const OP_SDOT: u32 = 4450;

/// `OpCooperativeMatrixMulAddKHR` (SPV_KHR_cooperative_matrix).
const OP_COOP_MUL_ADD: u32 = 4459;

/// Whether the module's instruction stream (after the 5-word header) has opcode `op`.
fn has_op(words: &[u32], op: u32) -> bool {
    let mut i = 5;
    while i < words.len() {
        if words[i] & 0xffff == op {
            return true;
        }
        i += (words[i] >> 16).max(1) as usize;
    }
    false
}

#[test]
fn every_variant_has_spirv_that_naga_reads_back() {
    let names: Vec<&str> = kernels::VARIANTS.iter().map(|(n, _)| *n).collect();
    let spirv_names: Vec<&str> = spirv::SPIRV.iter().map(|k| k.name).collect();
    assert_eq!(names, spirv_names, "every WGSL variant has SPIR-V, in the same order");
    let mut failures = Vec::new();
    for k in spirv::SPIRV {
        let words = k.words().unwrap_or_else(|| panic!("{}: not SPIR-V", k.name));
        assert_eq!(words.len() * 4, k.spirv.len());
        if k.uses_integer_dot() {
            // naga's SPIR-V reader has no DotProduct capability: check the instruction is
            // there (the point of the variant), with the extension it needs before SPIR-V 1.6.
            assert!(has_op(&words, OP_SDOT), "{}: no OpSDot", k.name);
            assert!(
                k.spirv.windows(27).any(|w| w == b"SPV_KHR_integer_dot_product"),
                "{}: the extension is not declared",
                k.name
            );
            continue;
        }
        if k.uses_cooperative_matrix() {
            // Nor has it cooperative matrices: check the multiply-add is there, with the
            // extensions it is declared with.
            assert!(
                has_op(&words, OP_COOP_MUL_ADD),
                "{}: no OpCooperativeMatrixMulAddKHR",
                k.name
            );
            for ext in ["SPV_KHR_cooperative_matrix", "SPV_KHR_vulkan_memory_model"] {
                assert!(
                    k.spirv.windows(ext.len()).any(|w| w == ext.as_bytes()),
                    "{}: {ext} is not declared",
                    k.name
                );
            }
            continue;
        }
        let opts = naga::front::spv::Options::default();
        let module = match naga::front::spv::parse_u8_slice(k.spirv, &opts) {
            Ok(m) => m,
            Err(e) => {
                failures.push(format!("{}: {e}", k.name));
                continue;
            }
        };
        // Entry points and bindings as the table says.
        let mut entries: Vec<&str> = module.entry_points.iter().map(|e| e.name.as_str()).collect();
        let mut want: Vec<&str> = k.entries.iter().map(|e| e.name).collect();
        entries.sort();
        want.sort();
        assert_eq!(entries, want, "{}", k.name);
        for ep in &module.entry_points {
            let listed = k.entry(&ep.name).unwrap();
            assert_eq!(listed.workgroup_size, ep.workgroup_size, "{} {}", k.name, ep.name);
        }
        let mut bindings: Vec<(u32, u32)> = module
            .global_variables
            .iter()
            .filter_map(|(_, v)| v.binding.as_ref().map(|b| (b.group, b.binding)))
            .collect();
        bindings.sort();
        let listed: Vec<(u32, u32)> = k.bindings.iter().map(|b| (b.group, b.binding)).collect();
        assert_eq!(bindings, listed, "{}", k.name);
    }
    assert!(failures.is_empty(), "naga cannot read back:\n{}", failures.join("\n"));
    // Texture-held weights bind a sampled image; the matmuls read storage and write storage.
    let tex = spirv::kernel("matmul_tex4_q4_k").unwrap();
    assert!(tex.bindings.iter().any(|b| b.kind == BindingKind::SampledImage));
    let mm = spirv::kernel("matmul_x4_q8_0").unwrap();
    assert!(mm.bindings.iter().any(|b| b.kind == BindingKind::StorageRead));
    assert!(mm.bindings.iter().any(|b| b.kind == BindingKind::Storage));
    println!(
        "[spirv] {} variants, {} bytes",
        spirv::SPIRV.len(),
        spirv::SPIRV.iter().map(|k| k.spirv.len()).sum::<usize>()
    );
}

#[test]
fn devices_are_described_as_the_driver_reports_them() {
    let Some(devices) = devices_or_skip() else { return };
    for d in &devices {
        println!("[vulkan] {} ({}, {:?})", d.name, d.device_type, d.driver);
        assert!(!d.name.is_empty());
        let g = &d.subgroups;
        assert!(g.min_size <= g.size && g.size <= g.max_size, "{}: {g:?}", d.name);
        let s = d.specializations();
        assert!(s.subgroup_size.size >= g.min_size && s.subgroup_size.size <= g.max_size);
        assert!(d.limits.max_workgroup_invocations >= 128, "{}", d.name);
    }
    assert!(vulkan::pick(&devices, None).is_ok());
    // lavapipe (CI): a CPU device from Mesa, driver llvmpipe, one subgroup size that is the
    // SIMD width its name reports ("llvmpipe (LLVM 15.0.6, 256 bits)": 8 lanes of 32 bits).
    let Some(lvp) = devices
        .iter()
        .find(|d| d.driver.as_ref().is_some_and(|dr| dr.name == "llvmpipe"))
    else {
        println!("[vulkan] no lavapipe device here");
        return;
    };
    assert_eq!(lvp.device_type, DeviceType::Cpu);
    assert_eq!(lvp.vendor_id, vulkan::device::VENDOR_MESA);
    assert_eq!(lvp.vendor, "Mesa (software)");
    assert!(
        lvp.driver.as_ref().unwrap().info.starts_with("Mesa "),
        "{:?}",
        lvp.driver
    );
    assert!(lvp.api_version.at_least(1, 1));
    assert!(lvp.compute_queue_family.is_some());
    let bits: u32 = lvp
        .name
        .split(", ")
        .nth(1)
        .and_then(|s| s.strip_suffix(" bits)"))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no SIMD width in '{}'", lvp.name));
    let g = &lvp.subgroups;
    assert_eq!((g.size, g.min_size, g.max_size), (bits / 32, bits / 32, bits / 32));
    // One size: nothing to require, so the kernels run at the default.
    let s = lvp.specializations();
    assert_eq!(
        s.subgroup_size,
        vulkan::SubgroupChoice {
            size: bits / 32,
            required: false
        }
    );
    assert_eq!(s.subgroup_operations, Use::Used);
    // Mesa 22 has no cooperative matrices; newer lavapipes emulate 8x8x8 ones.
    if lvp.cooperative_matrix.supported {
        assert_eq!(lvp.cooperative_matrix.kernel_size(), Some(8));
    } else {
        assert_eq!(s.cooperative_matrix, Use::NotAvailable);
    }
}

/// Whether the driver test builds `name`: every kernel without a weight format, every
/// variant of one format (each template and specialization), and for every other format its
/// decoders from buffers and from textures. All 274 variants would take lavapipe about 30 s of
/// LLVM on the CI machine.
fn sampled(name: &str) -> bool {
    let formats: Vec<String> = kernels::quant_types().iter().map(|t| t.name().to_lowercase()).collect();
    match formats.iter().find(|f| name.ends_with(&format!("_{f}"))) {
        None => true,
        Some(f) => f == "q4_k" || name == format!("matmul_x4_{f}") || name == format!("matmul_tex4_{f}"),
    }
}

/// The pipelines the backend builds (each kernel's entry point in its variant's module), for
/// the sampled variants the device can run: the driver accepts naga's SPIR-V (lavapipe
/// compiles each with LLVM here).
#[test]
fn the_driver_builds_the_kernel_pipelines() {
    let Some(dev) = device_or_skip() else { return };
    let s = *dev.specializations();
    let mut built = 0;
    let mut skipped = Vec::new();
    let start = std::time::Instant::now();
    for kernel in kernels::all_variants() {
        let name = kernel.variant();
        if !sampled(&name) {
            continue;
        }
        let k = spirv::kernel(&name).unwrap_or_else(|| panic!("{name}: no SPIR-V"));
        if (k.uses_subgroups() && !s.subgroup_operations.is_used())
            || (k.uses_f16() && !dev.enabled().float16)
            || (k.uses_cooperative_matrix() && !dev.enabled().cooperative_matrix)
        {
            skipped.push(name);
            continue;
        }
        let required = (s.subgroup_size.required && k.uses_subgroups()).then_some(s.subgroup_size.size);
        let p = ComputePipeline::new(&dev, k, kernel.entry(), required)
            .unwrap_or_else(|err| panic!("{}: {err}", kernel.label()));
        assert_eq!(
            p.set_layouts().len(),
            1 + k.bindings.iter().map(|b| b.group).max().unwrap() as usize
        );
        built += 1;
    }
    println!(
        "[vulkan] {}: {built} pipelines in {:.1} s; skipped (the device lacks what they need): {skipped:?}",
        dev.info().name,
        start.elapsed().as_secs_f64()
    );
    assert!(built > 50, "{built}");
}

#[test]
fn a_device_opens_and_pipelines_may_require_a_subgroup_size() {
    let Some(dev) = device_or_skip() else { return };
    let info = dev.info();
    assert_eq!(dev.queue_family(), info.compute_queue_family.unwrap());
    let mm = spirv::kernel("matmul_x4_subgroup_q8_0").unwrap();
    let ep = mm.entry("main").unwrap();
    let g = &info.subgroups;
    if dev.enabled().subgroup_size_control && dev.specializations().subgroup_operations.is_used() {
        // lavapipe has subgroup size control with one size: requiring it is allowed.
        let invocations: u32 = ep.workgroup_size.iter().product();
        let size = (g.min_size..=g.max_size)
            .filter(|n| n.is_power_of_two() && invocations <= n * g.max_compute_workgroup_subgroups)
            .max()
            .expect("a size that fits the workgroup");
        let p = ComputePipeline::new(&dev, mm, "main", Some(size)).unwrap();
        assert_eq!(p.required_subgroup_size(), Some(size));
    }
    // Sizes the device does not offer, and entry points the module lacks: typed errors.
    for bad in [3, g.max_size * 2] {
        let err = ComputePipeline::new(&dev, mm, "main", Some(bad))
            .err()
            .expect("an error");
        assert!(matches!(err, VulkanError::Unsupported { .. }), "{err}");
    }
    let add = spirv::kernel("add").unwrap();
    let err = ComputePipeline::new(&dev, add, "no_such_entry", None)
        .err()
        .expect("an error");
    assert!(err.to_string().contains("no entry point 'no_such_entry'"), "{err}");
    // Out-of-range device indices are errors that say how many there are.
    let err = Device::open(Some(999)).err().expect("no device 999");
    assert!(err.to_string().contains("no Vulkan device 999"), "{err}");
    let backend_err: tinyllm::backend::BackendError = err.into();
    assert!(matches!(
        backend_err,
        tinyllm::backend::BackendError::Unavailable { backend: "vulkan", .. }
    ));
}
