//! Recording the shared GPU layer's dispatches ([`Dispatch`]) into one Vulkan command buffer
//! per pass, and submitting it once.
//!
//! A pass is everything between two waits for the device: a forward pass records all its
//! dispatches (and the copies of uploads and readbacks) into one command buffer, which
//! [`Recorder::submit`] submits with one fence. Each dispatch's parameter block goes into a
//! uniform ring buffer and its small per-call data (token ids, cache positions: the
//! dispatch's `extra`) into a storage ring, both host-visible and reset after every pass; its
//! descriptor set comes from a pool reset the same way. A global memory barrier follows every
//! dispatch and copy, so each sees what the previous ones wrote, as in WebGPU.
//!
//! Pipelines are made on first use per kernel variant ([`Pipelines`]), requiring the
//! device's chosen subgroup size where the kernel uses subgroup operations. With
//! [`Recorder::enable_profile`], timestamp queries around each dispatch give device time per
//! kernel ([`Recorder::profile`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use ash::vk;

use super::cache::PipelineCache;
use super::device::Device;
use super::memory::{Buffer, Image, Location, Memory};
use super::pipeline::ComputePipeline;
use super::spirv::{self, Binding, BindingKind};
use crate::backend::gpu::dispatch::Dispatch;
use crate::backend::gpu::kernels::Kernel;
use crate::backend::vulkan::error::VulkanError;

/// Bytes of the parameter ring; a pass with more dispatches than fit is split.
const UNIFORM_RING: u64 = 2 << 20;
/// Bytes of the ring for the dispatches' `extra` data.
const EXTRA_RING: u64 = 2 << 20;
/// The largest alignment Vulkan allows for uniform and storage buffer offsets: using it
/// everywhere needs no device query.
const OFFSET_ALIGN: u64 = 256;
/// Descriptor sets per pass before the pass is split.
const MAX_SETS: u32 = 8192;
/// Storage buffer descriptors per set (the kernels bind at most 6).
const STORAGE_PER_SET: u32 = 8;

/// What a dispatch binds at a storage, uniform or image binding besides its parameters and data.
#[derive(Debug, Clone, Copy)]
pub enum Bind<'a> {
    /// A whole buffer, as storage.
    Buffer(&'a Buffer),
    /// The first `.1` bytes of a buffer, as a uniform block (matmul_tex's activation window).
    Uniform(&'a Buffer, u64),
    /// An image read with `textureLoad` (texture-held weights).
    Image(&'a Image),
}

/// Timestamp pairs per pass when profiling; dispatches beyond them go unmeasured.
const MAX_TIMED: u32 = 4096;

/// One kernel's share of the profiled passes ([`Recorder::profile`]).
#[derive(Debug, Clone, PartialEq)]
pub struct KernelTime {
    /// The kernel's label ([`Kernel::label`]).
    pub label: String,
    pub calls: u64,
    /// Device time between the timestamps around its dispatches, summed.
    pub ns: f64,
}

/// Timestamp queries around every dispatch, and what they added up to.
struct Profiler {
    pool: vk::QueryPool,
    /// Labels of this pass's timed dispatches, in order.
    pending: Vec<String>,
    period_ns: f64,
    /// Bits of a timestamp that count (the rest wrap).
    mask: u64,
    totals: HashMap<String, (u64, f64)>,
}

/// What passes cost, for tests and `bench`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PassStats {
    /// `vkQueueSubmit` calls.
    pub submissions: u64,
    pub dispatches: u64,
    /// Reads of results back to the host ([`Recorder::read`]).
    pub readbacks: u64,
    /// Bytes that went through staging buffers (uploads and readbacks of memory the host
    /// cannot see).
    pub staged_bytes: u64,
}

/// The compute pipelines of one device, made on first use or ahead of it ([`Pipelines::prepare`]),
/// through a pipeline cache where one is given.
pub struct Pipelines {
    device: Arc<Device>,
    cache: Option<PipelineCache>,
    /// Each kernel's pipeline and the bindings its entry point uses (what a dispatch binds).
    made: HashMap<Kernel, (ComputePipeline, &'static [Binding])>,
    /// Wall-clock seconds spent making pipelines so far (what a pipeline cache saves).
    making_s: f64,
}

impl Pipelines {
    pub fn new(device: &Arc<Device>) -> Self {
        Self::with_cache(device, None)
    }

    /// Pipelines made through `cache` ([`PipelineCache`]: the driver's compiled code, kept on
    /// disk between runs).
    pub fn with_cache(device: &Arc<Device>, cache: Option<PipelineCache>) -> Self {
        Self {
            device: Arc::clone(device),
            cache,
            made: HashMap::new(),
            making_s: 0.0,
        }
    }

    pub fn cache(&self) -> Option<&PipelineCache> {
        self.cache.as_ref()
    }

    /// Make the pipeline of `kernel` (the device's subgroup size where it uses subgroups).
    fn make(
        device: &Arc<Device>,
        cache: vk::PipelineCache,
        kernel: Kernel,
    ) -> Result<(ComputePipeline, &'static [Binding]), VulkanError> {
        let variant = kernel.variant();
        let spv = spirv::kernel(&variant).ok_or_else(|| VulkanError::Unsupported {
            kernel: variant.clone(),
            problem: "no SPIR-V was built for this variant".into(),
        })?;
        let choice = device.specializations().subgroup_size;
        let size = (choice.required && spv.uses_subgroups()).then_some(choice.size);
        let pipeline = ComputePipeline::with_cache(device, spv, kernel.entry(), size, cache)?;
        let bindings = pipeline.entry().bindings;
        Ok((pipeline, bindings))
    }

    fn raw_cache(&self) -> vk::PipelineCache {
        self.cache
            .as_ref()
            .map_or(vk::PipelineCache::null(), PipelineCache::raw)
    }

    /// The pipeline of `kernel`.
    pub fn get(&mut self, kernel: Kernel) -> Result<&ComputePipeline, VulkanError> {
        Ok(&self.made(kernel)?.0)
    }

    /// The pipeline of `kernel` with its entry point's bindings, made if it is not yet.
    fn made(&mut self, kernel: Kernel) -> Result<&(ComputePipeline, &'static [Binding]), VulkanError> {
        if !self.made.contains_key(&kernel) {
            let t = Instant::now();
            let p = Self::make(&self.device, self.raw_cache(), kernel);
            self.making_s += t.elapsed().as_secs_f64();
            self.made.insert(kernel, p?);
        }
        Ok(&self.made[&kernel])
    }

    /// Make the pipelines of `kernels` now, on all cores (drivers compile pipelines of one
    /// cache concurrently), so the first pass does not wait for them. The first error is
    /// returned after every thread has finished.
    pub fn prepare(&mut self, kernels: &[Kernel]) -> Result<(), VulkanError> {
        let todo: Vec<Kernel> = kernels.iter().copied().filter(|k| !self.made.contains_key(k)).collect();
        if todo.is_empty() {
            return Ok(());
        }
        let t = Instant::now();
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).max(1);
        let chunk = todo.len().div_ceil(threads).max(1);
        let (device, cache) = (&self.device, self.raw_cache());
        type Made = Result<(ComputePipeline, &'static [Binding]), VulkanError>;
        let results: Vec<(Kernel, Made)> = std::thread::scope(|s| {
            let handles: Vec<_> = todo
                .chunks(chunk)
                .map(|part| {
                    s.spawn(move || {
                        part.iter()
                            .map(|&k| (k, Self::make(device, cache, k)))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles.into_iter().flat_map(|h| h.join().unwrap_or_default()).collect()
        });
        self.making_s += t.elapsed().as_secs_f64();
        let mut first_error = None;
        for (k, r) in results {
            match r {
                Ok(p) => {
                    self.made.insert(k, p);
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    pub fn len(&self) -> usize {
        self.made.len()
    }

    /// Wall-clock seconds spent making the pipelines so far, ahead of use or at first use.
    pub fn making_seconds(&self) -> f64 {
        self.making_s
    }

    pub fn is_empty(&self) -> bool {
        self.made.is_empty()
    }
}

/// One command buffer being recorded, its rings and descriptor pool.
pub struct Recorder {
    memory: Arc<Memory>,
    pool: vk::CommandPool,
    cmd: vk::CommandBuffer,
    fence: vk::Fence,
    descriptors: vk::DescriptorPool,
    uniforms: Option<Buffer>,
    extras: Option<Buffer>,
    uniform_used: u64,
    extra_used: u64,
    sets_used: u32,
    recording: bool,
    /// Staging buffers of this pass's uploads, freed after the submission.
    staging: Vec<Buffer>,
    stats: PassStats,
    profiler: Option<Profiler>,
}

impl Recorder {
    pub fn new(memory: &Arc<Memory>) -> Result<Self, VulkanError> {
        let device = Arc::clone(memory.device());
        let raw = device.raw();
        let mut r = Self {
            memory: Arc::clone(memory),
            pool: vk::CommandPool::null(),
            cmd: vk::CommandBuffer::null(),
            fence: vk::Fence::null(),
            descriptors: vk::DescriptorPool::null(),
            uniforms: None,
            extras: None,
            uniform_used: 0,
            extra_used: 0,
            sets_used: 0,
            recording: false,
            staging: Vec::new(),
            stats: PassStats::default(),
            profiler: None,
        };
        let info = vk::CommandPoolCreateInfo::default()
            .queue_family_index(device.queue_family())
            .flags(vk::CommandPoolCreateFlags::TRANSIENT);
        // SAFETY (this block): create infos live across their calls; the device is live; on
        // an early return Drop destroys what was made (null handles are no-ops).
        unsafe {
            r.pool = raw
                .create_command_pool(&info, None)
                .map_err(|e| VulkanError::failed("vkCreateCommandPool", e))?;
            let alloc = vk::CommandBufferAllocateInfo::default()
                .command_pool(r.pool)
                .level(vk::CommandBufferLevel::PRIMARY)
                .command_buffer_count(1);
            r.cmd = raw
                .allocate_command_buffers(&alloc)
                .map_err(|e| VulkanError::failed("vkAllocateCommandBuffers", e))?[0];
            r.fence = raw
                .create_fence(&vk::FenceCreateInfo::default(), None)
                .map_err(|e| VulkanError::failed("vkCreateFence", e))?;
            let sizes = [
                vk::DescriptorPoolSize::default()
                    .ty(vk::DescriptorType::UNIFORM_BUFFER)
                    .descriptor_count(2 * MAX_SETS),
                vk::DescriptorPoolSize::default()
                    .ty(vk::DescriptorType::SAMPLED_IMAGE)
                    .descriptor_count(MAX_SETS),
                vk::DescriptorPoolSize::default()
                    .ty(vk::DescriptorType::STORAGE_BUFFER)
                    .descriptor_count(MAX_SETS * STORAGE_PER_SET),
            ];
            let info = vk::DescriptorPoolCreateInfo::default()
                .max_sets(MAX_SETS)
                .pool_sizes(&sizes);
            r.descriptors = raw
                .create_descriptor_pool(&info, None)
                .map_err(|e| VulkanError::failed("vkCreateDescriptorPool", e))?;
        }
        r.uniforms = Some(memory.alloc(UNIFORM_RING, vk::BufferUsageFlags::UNIFORM_BUFFER, Location::Host)?);
        r.extras = Some(memory.alloc(EXTRA_RING, vk::BufferUsageFlags::STORAGE_BUFFER, Location::Host)?);
        Ok(r)
    }

    pub fn stats(&self) -> PassStats {
        self.stats
    }

    /// Time every dispatch from now on with timestamp queries (`bench --profile`); an error
    /// where the compute queue has no timestamps.
    pub fn enable_profile(&mut self) -> Result<(), VulkanError> {
        if self.profiler.is_some() {
            return Ok(());
        }
        let device = Arc::clone(self.memory.device());
        let info = device.info();
        if info.timestamp_valid_bits == 0 {
            return Err(VulkanError::Unsupported {
                kernel: "profile".into(),
                problem: format!("{}'s compute queue has no timestamps", info.name),
            });
        }
        // Finish what was recorded untimed, so the pool is reset at the next pass's start.
        self.submit()?;
        let create = vk::QueryPoolCreateInfo::default()
            .query_type(vk::QueryType::TIMESTAMP)
            .query_count(2 * MAX_TIMED);
        // SAFETY: `create` lives across the call; the device is live.
        let pool = unsafe { self.memory.device().raw().create_query_pool(&create, None) }
            .map_err(|e| VulkanError::failed("vkCreateQueryPool", e))?;
        let bits = info.timestamp_valid_bits.min(64);
        self.profiler = Some(Profiler {
            pool,
            pending: Vec::new(),
            period_ns: f64::from(info.limits.timestamp_period_ns),
            mask: if bits == 64 { u64::MAX } else { (1u64 << bits) - 1 },
            totals: HashMap::new(),
        });
        Ok(())
    }

    /// Device time per kernel over the profiled passes, most first.
    pub fn profile(&self) -> Vec<KernelTime> {
        let mut v: Vec<KernelTime> = self
            .profiler
            .iter()
            .flat_map(|p| p.totals.iter())
            .map(|(label, &(calls, ns))| KernelTime {
                label: label.clone(),
                calls,
                ns,
            })
            .collect();
        v.sort_by(|a, b| b.ns.total_cmp(&a.ns).then_with(|| a.label.cmp(&b.label)));
        v
    }

    /// Write timestamp `query` of the profiler's pool, if profiling.
    fn timestamp(&self, query: u32, stage: vk::PipelineStageFlags) {
        if let Some(p) = &self.profiler {
            // SAFETY: recording; the query index is below the pool's count (checked by callers)
            // and was reset at this pass's start.
            unsafe {
                self.memory
                    .device()
                    .raw()
                    .cmd_write_timestamp(self.cmd, stage, p.pool, query)
            };
        }
    }

    /// Read this pass's timestamps (after its fence) into the totals.
    fn collect_profile(&mut self) -> Result<(), VulkanError> {
        let raw = self.memory.device().raw();
        let Some(p) = self.profiler.as_mut() else { return Ok(()) };
        if p.pending.is_empty() {
            return Ok(());
        }
        let mut stamps = vec![0u64; 2 * p.pending.len()];
        // SAFETY: every query read was written in the pass just waited for.
        unsafe {
            raw.get_query_pool_results(
                p.pool,
                0,
                &mut stamps,
                vk::QueryResultFlags::TYPE_64 | vk::QueryResultFlags::WAIT,
            )
        }
        .map_err(|e| VulkanError::failed("vkGetQueryPoolResults", e))?;
        for (label, pair) in p.pending.drain(..).zip(stamps.chunks_exact(2)) {
            let ticks = pair[1].wrapping_sub(pair[0]) & p.mask;
            let e = p.totals.entry(label).or_insert((0, 0.0));
            e.0 += 1;
            e.1 += ticks as f64 * p.period_ns;
        }
        Ok(())
    }

    fn begin(&mut self) -> Result<(), VulkanError> {
        if !self.recording {
            let info = vk::CommandBufferBeginInfo::default().flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT);
            // SAFETY: the command buffer is not recording and not in use (the last submission
            // was waited for and its pool reset).
            unsafe { self.memory.device().raw().begin_command_buffer(self.cmd, &info) }
                .map_err(|e| VulkanError::failed("vkBeginCommandBuffer", e))?;
            self.recording = true;
            if let Some(p) = &self.profiler {
                // SAFETY: recording, outside any render pass; the pool has this many queries.
                unsafe {
                    self.memory
                        .device()
                        .raw()
                        .cmd_reset_query_pool(self.cmd, p.pool, 0, 2 * MAX_TIMED)
                };
            }
        }
        Ok(())
    }

    /// Everything before waits for everything written before it (dispatches and copies), and
    /// the host sees it after the pass.
    fn barrier(&self) {
        let access = vk::AccessFlags::SHADER_READ
            | vk::AccessFlags::SHADER_WRITE
            | vk::AccessFlags::TRANSFER_READ
            | vk::AccessFlags::TRANSFER_WRITE
            | vk::AccessFlags::HOST_READ;
        let b = vk::MemoryBarrier::default()
            .src_access_mask(access)
            .dst_access_mask(access);
        let stages = vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::TRANSFER;
        // SAFETY: the command buffer is recording (callers begin first).
        unsafe {
            self.memory.device().raw().cmd_pipeline_barrier(
                self.cmd,
                stages,
                stages | vk::PipelineStageFlags::HOST,
                vk::DependencyFlags::empty(),
                &[b],
                &[],
                &[],
            )
        };
    }

    /// Record `d` with `binds` (binding number, buffer) for its storage bindings; the
    /// parameter block (binding 0) and the `extra` data are bound here. Every binding the
    /// kernel's entry point uses must be given.
    pub fn dispatch(
        &mut self,
        pipelines: &mut Pipelines,
        d: &Dispatch,
        binds: &[(u32, &Buffer)],
    ) -> Result<(), VulkanError> {
        let binds: Vec<(u32, Bind<'_>)> = binds.iter().map(|&(n, b)| (n, Bind::Buffer(b))).collect();
        self.dispatch_with(pipelines, d, &binds)
    }

    /// [`Recorder::dispatch`] with uniform and image bindings too.
    pub fn dispatch_with(
        &mut self,
        pipelines: &mut Pipelines,
        d: &Dispatch,
        binds: &[(u32, Bind<'_>)],
    ) -> Result<(), VulkanError> {
        let params_span = (d.params.len() as u64).max(16).div_ceil(16) * 16;
        let extra_span = d.extra.as_ref().map_or(0, |(_, e)| (e.len() as u64).max(4));
        if extra_span > EXTRA_RING {
            return Err(VulkanError::Unsupported {
                kernel: d.kernel.variant(),
                problem: format!("{extra_span} bytes of per-call data exceed the {EXTRA_RING}-byte ring"),
            });
        }
        if self.uniform_used + params_span > UNIFORM_RING
            || self.extra_used + extra_span > EXTRA_RING
            || self.sets_used >= MAX_SETS
        {
            // The rings or the pool are full: finish this part of the pass first.
            self.submit()?;
        }
        self.begin()?;
        let (pipeline, bindings) = pipelines.made(d.kernel)?;
        let (uniforms, extras) = (
            self.uniforms.as_ref().expect("ring"),
            self.extras.as_ref().expect("ring"),
        );
        let u_off = self.uniform_used;
        uniforms.write(u_off, &d.params)?;
        self.uniform_used += params_span.div_ceil(OFFSET_ALIGN) * OFFSET_ALIGN;
        let e_off = self.extra_used;
        if let Some((_, data)) = &d.extra {
            extras.write(e_off, data)?;
            self.extra_used += extra_span.div_ceil(OFFSET_ALIGN) * OFFSET_ALIGN;
        }
        let raw = self.memory.device().raw();
        let alloc = vk::DescriptorSetAllocateInfo::default()
            .descriptor_pool(self.descriptors)
            .set_layouts(pipeline.set_layouts());
        // SAFETY: the pool and layouts are live; the pool has room (counted above).
        let sets = unsafe { raw.allocate_descriptor_sets(&alloc) }
            .map_err(|e| VulkanError::failed("vkAllocateDescriptorSets", e))?;
        self.sets_used += sets.len() as u32;
        let unbound = |n: u32| VulkanError::Unsupported {
            kernel: d.kernel.variant(),
            problem: format!("binding {n} is not bound"),
        };
        let given = |n: u32| binds.iter().find(|(at, _)| *at == n).map(|(_, b)| *b);
        let mut buffer_infos: Vec<(u32, u32, vk::DescriptorType, [vk::DescriptorBufferInfo; 1])> = Vec::new();
        let mut image_infos: Vec<(u32, u32, [vk::DescriptorImageInfo; 1])> = Vec::new();
        for b in bindings.iter() {
            let whole = |buf: &Buffer| {
                vk::DescriptorBufferInfo::default()
                    .buffer(buf.raw)
                    .range(vk::WHOLE_SIZE)
            };
            let (ty, info) = match (b.kind, b.binding) {
                (BindingKind::Uniform, 0) => (
                    vk::DescriptorType::UNIFORM_BUFFER,
                    vk::DescriptorBufferInfo::default()
                        .buffer(uniforms.raw)
                        .offset(u_off)
                        .range(params_span),
                ),
                (BindingKind::Uniform, n) => match given(n) {
                    Some(Bind::Uniform(buf, len)) => (
                        vk::DescriptorType::UNIFORM_BUFFER,
                        vk::DescriptorBufferInfo::default().buffer(buf.raw).range(len),
                    ),
                    _ => return Err(unbound(n)),
                },
                (BindingKind::SampledImage, n) => match given(n) {
                    Some(Bind::Image(img)) => {
                        let info = vk::DescriptorImageInfo::default()
                            .image_view(img.view)
                            .image_layout(vk::ImageLayout::SHADER_READ_ONLY_OPTIMAL);
                        image_infos.push((b.group, n, [info]));
                        continue;
                    }
                    _ => return Err(unbound(n)),
                },
                (BindingKind::Storage | BindingKind::StorageRead, n) => {
                    let info = match (&d.extra, given(n)) {
                        (Some((at, _)), _) if *at == n => vk::DescriptorBufferInfo::default()
                            .buffer(extras.raw)
                            .offset(e_off)
                            .range(extra_span),
                        (_, Some(Bind::Buffer(buf))) => whole(buf),
                        _ => return Err(unbound(n)),
                    };
                    (vk::DescriptorType::STORAGE_BUFFER, info)
                }
                (kind, n) => {
                    return Err(VulkanError::Unsupported {
                        kernel: d.kernel.variant(),
                        problem: format!("binding {n} is a {kind:?}, which this device layer does not bind"),
                    })
                }
            };
            buffer_infos.push((b.group, b.binding, ty, [info]));
        }
        let mut writes: Vec<vk::WriteDescriptorSet> = buffer_infos
            .iter()
            .map(|(group, binding, ty, bi)| {
                vk::WriteDescriptorSet::default()
                    .dst_set(sets[*group as usize])
                    .dst_binding(*binding)
                    .descriptor_type(*ty)
                    .buffer_info(bi)
            })
            .collect();
        writes.extend(image_infos.iter().map(|(group, binding, ii)| {
            vk::WriteDescriptorSet::default()
                .dst_set(sets[*group as usize])
                .dst_binding(*binding)
                .descriptor_type(vk::DescriptorType::SAMPLED_IMAGE)
                .image_info(ii)
        }));
        let (gx, gy, gz) = d.groups;
        let timed = self
            .profiler
            .as_ref()
            .map(|p| p.pending.len() as u32)
            .filter(|&n| n < MAX_TIMED);
        if let Some(n) = timed {
            self.timestamp(2 * n, vk::PipelineStageFlags::TOP_OF_PIPE);
        }
        // SAFETY: the writes point at live buffers and sets; the command buffer is recording;
        // the pipeline's layout matches the sets it was allocated with.
        unsafe {
            raw.update_descriptor_sets(&writes, &[]);
            raw.cmd_bind_pipeline(self.cmd, vk::PipelineBindPoint::COMPUTE, pipeline.raw());
            raw.cmd_bind_descriptor_sets(
                self.cmd,
                vk::PipelineBindPoint::COMPUTE,
                pipeline.layout(),
                0,
                &sets,
                &[],
            );
            raw.cmd_dispatch(self.cmd, gx, gy, gz);
        }
        self.barrier();
        if let Some(n) = timed {
            self.timestamp(2 * n + 1, vk::PipelineStageFlags::BOTTOM_OF_PIPE);
            if let Some(p) = self.profiler.as_mut() {
                p.pending.push(d.kernel.label());
            }
        }
        self.stats.dispatches += 1;
        Ok(())
    }

    /// Record a copy of `len` bytes from `src` at `src_off` to `dst` at `dst_off`.
    pub fn copy(
        &mut self,
        src: &Buffer,
        src_off: u64,
        dst: &Buffer,
        dst_off: u64,
        len: u64,
    ) -> Result<(), VulkanError> {
        if len == 0 {
            return Ok(());
        }
        self.begin()?;
        let region = vk::BufferCopy::default()
            .src_offset(src_off)
            .dst_offset(dst_off)
            .size(len);
        // SAFETY: recording; both buffers are live and were created with transfer usage by
        // the callers that copy them.
        unsafe {
            self.memory
                .device()
                .raw()
                .cmd_copy_buffer(self.cmd, src.raw, dst.raw, &[region])
        };
        self.barrier();
        Ok(())
    }

    /// Record filling `len` bytes of `dst` from byte `offset` (both multiples of 4) with the
    /// 32-bit `word`.
    pub fn fill(&mut self, dst: &Buffer, offset: u64, len: u64, word: u32) -> Result<(), VulkanError> {
        if len == 0 {
            return Ok(());
        }
        self.begin()?;
        // SAFETY: recording; the buffer is live with transfer-destination usage (callers'
        // allocations), and offset and length are multiples of 4 within it.
        unsafe {
            self.memory
                .device()
                .raw()
                .cmd_fill_buffer(self.cmd, dst.raw, offset, len, word)
        };
        self.barrier();
        Ok(())
    }

    /// Put `data` into `dst` at byte `offset`: directly where the host sees its memory and
    /// nothing is recorded yet, else through a staging buffer copied in this pass (so work
    /// recorded before the upload still sees the old contents).
    pub fn upload(&mut self, dst: &Buffer, offset: u64, data: &[u8]) -> Result<(), VulkanError> {
        if dst.mapped().is_some() && !self.recording {
            dst.write(offset, data)?;
            return Ok(());
        }
        let staging = self
            .memory
            .alloc(data.len() as u64, vk::BufferUsageFlags::TRANSFER_SRC, Location::Host)?;
        staging.write(0, data)?;
        self.copy(&staging, 0, dst, offset, data.len() as u64)?;
        self.stats.staged_bytes += data.len() as u64;
        self.staging.push(staging);
        Ok(())
    }

    /// Put `data` (whole image rows of `width` texels of 16 bytes) into `image` from row
    /// `row0` through a staging buffer, and leave it ready for kernels to read. An image's rows
    /// are written in order from row 0: the first write finds it undefined, later ones keep
    /// what the earlier wrote.
    pub fn upload_image(&mut self, image: &Image, row0: u32, data: &[u8]) -> Result<(), VulkanError> {
        let row_bytes = u64::from(image.width) * 16;
        let rows = data.len() as u64 / row_bytes;
        if data.len() as u64 != rows * row_bytes || u64::from(row0) + rows > u64::from(image.height) {
            return Err(VulkanError::Unsupported {
                kernel: "image".into(),
                problem: format!(
                    "{} bytes from row {row0} for an image of {} rows of {row_bytes} bytes",
                    data.len(),
                    image.height
                ),
            });
        }
        let want = data.len() as u64;
        let staging = self
            .memory
            .alloc(want, vk::BufferUsageFlags::TRANSFER_SRC, Location::Host)?;
        staging.write(0, data)?;
        self.begin()?;
        let range = vk::ImageSubresourceRange::default()
            .aspect_mask(vk::ImageAspectFlags::COLOR)
            .level_count(1)
            .layer_count(1);
        let (before, before_access) = match row0 {
            0 => (vk::ImageLayout::UNDEFINED, vk::AccessFlags::empty()),
            _ => (vk::ImageLayout::SHADER_READ_ONLY_OPTIMAL, vk::AccessFlags::SHADER_READ),
        };
        let to_copy = vk::ImageMemoryBarrier::default()
            .src_access_mask(before_access)
            .dst_access_mask(vk::AccessFlags::TRANSFER_WRITE)
            .old_layout(before)
            .new_layout(vk::ImageLayout::TRANSFER_DST_OPTIMAL)
            .src_queue_family_index(vk::QUEUE_FAMILY_IGNORED)
            .dst_queue_family_index(vk::QUEUE_FAMILY_IGNORED)
            .image(image.raw)
            .subresource_range(range);
        let to_read = to_copy
            .src_access_mask(vk::AccessFlags::TRANSFER_WRITE)
            .dst_access_mask(vk::AccessFlags::SHADER_READ)
            .old_layout(vk::ImageLayout::TRANSFER_DST_OPTIMAL)
            .new_layout(vk::ImageLayout::SHADER_READ_ONLY_OPTIMAL);
        let region = vk::BufferImageCopy::default()
            .image_subresource(
                vk::ImageSubresourceLayers::default()
                    .aspect_mask(vk::ImageAspectFlags::COLOR)
                    .layer_count(1),
            )
            .image_offset(vk::Offset3D {
                x: 0,
                y: row0 as i32,
                z: 0,
            })
            .image_extent(vk::Extent3D {
                width: image.width,
                height: rows as u32,
                depth: 1,
            });
        let raw = self.memory.device().raw();
        // SAFETY: recording; the image and staging buffer are live; the image's whole
        // subresource moves to TRANSFER_DST and back to SHADER_READ_ONLY around the copy.
        unsafe {
            raw.cmd_pipeline_barrier(
                self.cmd,
                vk::PipelineStageFlags::TOP_OF_PIPE | vk::PipelineStageFlags::COMPUTE_SHADER,
                vk::PipelineStageFlags::TRANSFER,
                vk::DependencyFlags::empty(),
                &[],
                &[],
                &[to_copy],
            );
            raw.cmd_copy_buffer_to_image(
                self.cmd,
                staging.raw,
                image.raw,
                vk::ImageLayout::TRANSFER_DST_OPTIMAL,
                &[region],
            );
            raw.cmd_pipeline_barrier(
                self.cmd,
                vk::PipelineStageFlags::TRANSFER,
                vk::PipelineStageFlags::COMPUTE_SHADER,
                vk::DependencyFlags::empty(),
                &[],
                &[],
                &[to_read],
            );
        }
        self.stats.staged_bytes += want;
        self.staging.push(staging);
        Ok(())
    }

    /// Submit what was recorded and wait for it (ends the pass).
    pub fn submit(&mut self) -> Result<(), VulkanError> {
        if !self.recording {
            // Nothing recorded names a retired buffer.
            self.memory.free_retired();
            return Ok(());
        }
        let device = self.memory.device();
        let raw = device.raw();
        let cmds = [self.cmd];
        let submit = vk::SubmitInfo::default().command_buffers(&cmds);
        // SAFETY: the command buffer was recording and is ended here; one submitter uses the
        // queue (the recorder is `&mut`); the fence is unsignaled (reset after every wait).
        unsafe {
            raw.end_command_buffer(self.cmd)
                .map_err(|e| VulkanError::failed("vkEndCommandBuffer", e))?;
            self.recording = false;
            raw.queue_submit(device.queue(), &[submit], self.fence)
                .map_err(|e| VulkanError::failed("vkQueueSubmit", e))?;
            self.stats.submissions += 1;
            raw.wait_for_fences(&[self.fence], true, u64::MAX)
                .map_err(|e| VulkanError::failed("vkWaitForFences", e))?;
            raw.reset_fences(&[self.fence])
                .map_err(|e| VulkanError::failed("vkResetFences", e))?;
            raw.reset_command_pool(self.pool, vk::CommandPoolResetFlags::empty())
                .map_err(|e| VulkanError::failed("vkResetCommandPool", e))?;
            raw.reset_descriptor_pool(self.descriptors, vk::DescriptorPoolResetFlags::empty())
                .map_err(|e| VulkanError::failed("vkResetDescriptorPool", e))?;
        }
        self.collect_profile()?;
        self.uniform_used = 0;
        self.extra_used = 0;
        self.sets_used = 0;
        for s in self.staging.drain(..) {
            self.memory.free(s);
        }
        // Everything submitted has finished: buffers dropped meanwhile can go.
        self.memory.free_retired();
        Ok(())
    }

    /// End the pass and read `len` bytes of `src` from byte `offset` (through a staging
    /// buffer where the host cannot see `src`: one more copy in the same submission).
    pub fn read(&mut self, src: &Buffer, offset: u64, len: usize) -> Result<Vec<u8>, VulkanError> {
        let mut out = vec![0u8; len];
        self.stats.readbacks += 1;
        if src.mapped().is_some() {
            self.submit()?;
            src.read(offset, &mut out)?;
            return Ok(out);
        }
        let staging = self
            .memory
            .alloc(len as u64, vk::BufferUsageFlags::TRANSFER_DST, Location::Host)?;
        let result = self
            .copy(src, offset, &staging, 0, len as u64)
            .and_then(|()| self.submit())
            .and_then(|()| staging.read(0, &mut out));
        self.stats.staged_bytes += len as u64;
        self.memory.free(staging);
        result.map(|_| out)
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        let raw = self.memory.device().raw();
        // SAFETY: waiting for idle first means nothing recorded here still runs; the handles
        // were made on this device (null ones are no-ops).
        unsafe {
            let _ = raw.device_wait_idle();
            raw.destroy_descriptor_pool(self.descriptors, None);
            if let Some(p) = &self.profiler {
                raw.destroy_query_pool(p.pool, None);
            }
            raw.destroy_fence(self.fence, None);
            raw.destroy_command_pool(self.pool, None);
        }
        for b in self
            .staging
            .drain(..)
            .chain(self.uniforms.take())
            .chain(self.extras.take())
        {
            self.memory.free(b);
        }
    }
}
