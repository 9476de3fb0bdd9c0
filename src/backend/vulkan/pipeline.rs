//! A compute pipeline for one entry point of one kernel variant: its shader module, one
//! descriptor set layout per WGSL `@group` (bindings as the WGSL declares them, see
//! [`super::spirv`]), the pipeline layout and the pipeline, destroyed on drop. A pipeline may
//! require a subgroup size (VK_EXT_subgroup_size_control); the size must be one the device
//! offers for compute and fit the entry point's workgroup, else creation is a typed error.

use std::ffi::CString;
use std::sync::Arc;

use ash::vk;

use super::device::Device;
use super::spirv::{BindingKind, EntryPoint, SpirvKernel};
use crate::backend::vulkan::error::VulkanError;

/// A compute pipeline on a [`Device`], which it borrows.
pub struct ComputePipeline {
    device: Arc<Device>,
    module: vk::ShaderModule,
    set_layouts: Vec<vk::DescriptorSetLayout>,
    layout: vk::PipelineLayout,
    pipeline: vk::Pipeline,
    entry: EntryPoint,
    required_subgroup_size: Option<u32>,
}

impl ComputePipeline {
    /// Build `entry` of `kernel`, requiring `required_subgroup_size` if given (else the device
    /// picks its default).
    pub fn new(
        device: &Arc<Device>,
        kernel: &SpirvKernel,
        entry: &str,
        required_subgroup_size: Option<u32>,
    ) -> Result<Self, VulkanError> {
        Self::with_cache(device, kernel, entry, required_subgroup_size, vk::PipelineCache::null())
    }

    /// [`ComputePipeline::new`] through a pipeline cache (`cache`, or null for none).
    pub fn with_cache(
        device: &Arc<Device>,
        kernel: &SpirvKernel,
        entry: &str,
        required_subgroup_size: Option<u32>,
        cache: vk::PipelineCache,
    ) -> Result<Self, VulkanError> {
        let unsupported = |problem: String| VulkanError::Unsupported {
            kernel: kernel.name.to_string(),
            problem,
        };
        let ep = *kernel
            .entry(entry)
            .ok_or_else(|| unsupported(format!("no entry point '{entry}'")))?;
        check_features(device, kernel).map_err(unsupported)?;
        if let Some(size) = required_subgroup_size {
            check_subgroup_size(device, &ep, size).map_err(unsupported)?;
        }
        let words = kernel
            .words()
            .ok_or_else(|| unsupported("the embedded module is not SPIR-V".into()))?;
        let raw = device.raw();
        // Filled in step by step: on an early return, Drop destroys what exists (destroying
        // a null handle is a no-op in Vulkan).
        let mut p = ComputePipeline {
            device: Arc::clone(device),
            module: vk::ShaderModule::null(),
            set_layouts: Vec::new(),
            layout: vk::PipelineLayout::null(),
            pipeline: vk::Pipeline::null(),
            entry: ep,
            required_subgroup_size,
        };
        // SAFETY: `words` is a whole SPIR-V module (magic checked) that naga validated at
        // build time; the create info lives across the call; `raw` is a live device.
        p.module = unsafe { raw.create_shader_module(&vk::ShaderModuleCreateInfo::default().code(&words), None) }
            .map_err(|e| VulkanError::failed("vkCreateShaderModule", e))?;
        let groups = ep.bindings.iter().map(|b| b.group + 1).max().unwrap_or(0);
        for group in 0..groups {
            let bindings: Vec<vk::DescriptorSetLayoutBinding> = ep
                .bindings
                .iter()
                .filter(|b| b.group == group)
                .map(|b| {
                    vk::DescriptorSetLayoutBinding::default()
                        .binding(b.binding)
                        .descriptor_type(descriptor_type(b.kind))
                        .descriptor_count(1)
                        .stage_flags(vk::ShaderStageFlags::COMPUTE)
                })
                .collect();
            let info = vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings);
            // SAFETY: `bindings` (unique binding numbers: they come from one WGSL group) and
            // `info` live across the call; `raw` is a live device.
            let layout = unsafe { raw.create_descriptor_set_layout(&info, None) }
                .map_err(|e| VulkanError::failed("vkCreateDescriptorSetLayout", e))?;
            p.set_layouts.push(layout);
        }
        let info = vk::PipelineLayoutCreateInfo::default().set_layouts(&p.set_layouts);
        // SAFETY: the set layouts were created above on this device; `info` lives across the call.
        p.layout = unsafe { raw.create_pipeline_layout(&info, None) }
            .map_err(|e| VulkanError::failed("vkCreatePipelineLayout", e))?;
        let name = CString::new(ep.name).map_err(|_| unsupported(format!("entry point '{}' has a NUL", ep.name)))?;
        let mut required = vk::PipelineShaderStageRequiredSubgroupSizeCreateInfo::default()
            .required_subgroup_size(required_subgroup_size.unwrap_or(0));
        // Cooperative matrices are multiplied by whole subgroups: ask for them where the device
        // lets a pipeline (the workgroup of 64 is a multiple of every size it runs).
        let flags = if kernel.uses_cooperative_matrix() && device.enabled().compute_full_subgroups {
            vk::PipelineShaderStageCreateFlags::REQUIRE_FULL_SUBGROUPS
        } else {
            vk::PipelineShaderStageCreateFlags::empty()
        };
        let mut stage = vk::PipelineShaderStageCreateInfo::default()
            .flags(flags)
            .stage(vk::ShaderStageFlags::COMPUTE)
            .module(p.module)
            .name(&name);
        if required_subgroup_size.is_some() {
            stage = stage.push_next(&mut required);
        }
        let info = vk::ComputePipelineCreateInfo::default().stage(stage).layout(p.layout);
        // SAFETY: module, layout and entry name are live and belong to this device; the
        // required-size struct is chained only after `check_subgroup_size` found the size
        // valid and the device was opened with subgroup size control; everything the create
        // info points to lives across the call.
        let pipelines = unsafe { raw.create_compute_pipelines(cache, &[info], None) }
            .map_err(|(_, e)| VulkanError::failed("vkCreateComputePipelines", e))?;
        p.pipeline = pipelines.first().copied().unwrap_or_default();
        Ok(p)
    }

    pub fn raw(&self) -> vk::Pipeline {
        self.pipeline
    }

    pub fn layout(&self) -> vk::PipelineLayout {
        self.layout
    }

    /// One layout per `@group`, in group order.
    pub fn set_layouts(&self) -> &[vk::DescriptorSetLayout] {
        &self.set_layouts
    }

    pub fn entry(&self) -> EntryPoint {
        self.entry
    }

    pub fn required_subgroup_size(&self) -> Option<u32> {
        self.required_subgroup_size
    }
}

impl Drop for ComputePipeline {
    fn drop(&mut self) {
        let raw = self.device.raw();
        // SAFETY: every handle was created on this device (or is null, which Vulkan ignores),
        // and nothing records with the pipeline any more: it is borrowed for recording and
        // this is its end.
        unsafe {
            raw.destroy_pipeline(self.pipeline, None);
            raw.destroy_pipeline_layout(self.layout, None);
            for &l in &self.set_layouts {
                raw.destroy_descriptor_set_layout(l, None);
            }
            raw.destroy_shader_module(self.module, None);
        }
    }
}

fn descriptor_type(kind: BindingKind) -> vk::DescriptorType {
    match kind {
        BindingKind::StorageRead | BindingKind::Storage => vk::DescriptorType::STORAGE_BUFFER,
        BindingKind::Uniform => vk::DescriptorType::UNIFORM_BUFFER,
        BindingKind::SampledImage => vk::DescriptorType::SAMPLED_IMAGE,
        BindingKind::StorageImage => vk::DescriptorType::STORAGE_IMAGE,
        BindingKind::Sampler => vk::DescriptorType::SAMPLER,
    }
}

/// The device features the variant's SPIR-V declares, enabled on `device`.
fn check_features(device: &Device, kernel: &SpirvKernel) -> Result<(), String> {
    let s = device.specializations();
    if kernel.uses_subgroups() && !s.subgroup_operations.is_used() {
        return Err(format!(
            "needs subgroup operations in compute ({})",
            s.subgroup_operations
        ));
    }
    if kernel.uses_cooperative_matrix() && !device.enabled().cooperative_matrix {
        return Err(format!("needs cooperative matrices ({})", s.cooperative_matrix));
    }
    if kernel.uses_integer_dot() && !device.enabled().integer_dot_product {
        return Err(format!("needs packed integer dot products ({})", s.integer_dot_product));
    }
    if kernel.uses_f16() && !device.enabled().float16 {
        return Err(format!(
            "needs f16 arithmetic and 16-bit storage ({})",
            s.shader_float16
        ));
    }
    Ok(())
}

/// Whether `entry` may require subgroups of `size` on `device`.
fn check_subgroup_size(device: &Device, entry: &EntryPoint, size: u32) -> Result<(), String> {
    let g = &device.info().subgroups;
    if !device.enabled().subgroup_size_control || !g.required_size_in_compute {
        return Err(format!(
            "cannot require subgroup size {size}: the device was opened without subgroup size control for compute"
        ));
    }
    if !size.is_power_of_two() || size < g.min_size || size > g.max_size {
        return Err(format!(
            "cannot require subgroup size {size}: the device offers {}..{}",
            g.min_size, g.max_size
        ));
    }
    let invocations = entry.workgroup_size.iter().map(|&n| u64::from(n)).product::<u64>();
    let most = u64::from(size) * u64::from(g.max_compute_workgroup_subgroups);
    if invocations > most {
        return Err(format!(
            "cannot require subgroup size {size}: a workgroup of {invocations} invocations is more than {} subgroups",
            g.max_compute_workgroup_subgroups
        ));
    }
    Ok(())
}
