//! The Vulkan device layer: the shared GPU backend ([`GpuBackend`]) over the ash layers beside
//! it. It places data and records dispatches: one command buffer per pass, submitted when a
//! result must come back (one submission and one small readback per decoded token). Which
//! kernel each op takes is the shared layer's choice, from the [`Caps`] reported here
//! (subgroups, f16, integer dot products, cooperative matrices, a CPU device).

use std::sync::{Arc, Mutex};

use ash::vk;

use super::buffers::{Owned, OwnedImage};
use super::cache::{self, PipelineCache};
use super::device::{Device, DeviceType};
use super::dispatch::{self, KernelTime, PassStats, Pipelines, Recorder};
use super::memory::{Location, Memory};
use crate::backend::error::BackendError;
use crate::backend::gpu;
use crate::backend::gpu::backend::GpuBackend;
use crate::backend::gpu::buffers::{GpuBuffer, GpuKv, GpuWeight};
use crate::backend::gpu::device::{Bind, Caps};
use crate::backend::gpu::dispatch::Dispatch;
use crate::backend::gpu::kernels::Kernel;
use crate::backend::gpu::options::GpuOptions;
use crate::backend::gpu::sizes::{TEX_ROW_BYTES, X_WINDOW_BYTES};
use crate::backend::readback::Readback;
use crate::backend::sync::lock;
use crate::backend::vulkan::error::VulkanError;

/// The Vulkan backend: the shared GPU backend over ash.
pub type VulkanBackend = GpuBackend<Vulkan>;
/// An activation buffer of the Vulkan backend.
pub type VulkanBuffer = GpuBuffer<Vulkan>;
/// A KV cache of the Vulkan backend.
pub type VulkanKv = GpuKv<Vulkan>;
/// A weight of the Vulkan backend.
pub type VulkanWeight = GpuWeight<Vulkan>;
/// Options of [`VulkanBackend::open`]: the GPU options (`device` picks one of
/// [`super::list_devices`], default [`crate::backend::vulkan::device::pick`]'s choice).
pub type VulkanOptions = GpuOptions;

/// Every buffer is bound as storage and is a copy source and destination.
const USAGE: vk::BufferUsageFlags = vk::BufferUsageFlags::from_raw(
    vk::BufferUsageFlags::STORAGE_BUFFER.as_raw()
        | vk::BufferUsageFlags::TRANSFER_SRC.as_raw()
        | vk::BufferUsageFlags::TRANSFER_DST.as_raw(),
);

/// How the backend started: what [`VulkanBackend::open`] spent its time on.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Startup {
    /// Seconds to open the instance and device.
    pub device_s: f64,
    /// Seconds to make the pipelines of [`KERNELS_AT_OPEN`] (in parallel, through the cache).
    pub pipelines_s: f64,
    /// Pipelines made at open.
    pub pipelines: usize,
    /// Bytes of pipeline cache read from disk (0: a cold start).
    pub cache_bytes: usize,
}

impl Startup {
    /// Seconds in all.
    pub fn total_s(&self) -> f64 {
        self.device_s + self.pipelines_s
    }
}

/// The pipelines made, in parallel, when the backend opens: what a pass of every model
/// family runs. The rest wait for what they serve, so a start makes only the pipelines its
/// model needs (a pipeline costs a driver milliseconds to seconds to make): the weight
/// formats' kernels as weights are placed, a KV cache format's store and attention kernels
/// at its first cache ([`gpu::kernels::kv_kernels`]), routers' kernels with stacked experts,
/// and kernels of one family alone (gated delta-net's, gpt-oss's activation) at first use.
const KERNELS_AT_OPEN: [Kernel; 10] = [
    Kernel::Add,
    Kernel::AddBias,
    Kernel::Scale,
    Kernel::Swiglu,
    Kernel::Geglu,
    Kernel::RmsNorm,
    Kernel::RmsNormInplace,
    Kernel::Rope,
    Kernel::Argmax,
    Kernel::Select,
];

/// The Vulkan device layer: the device, its memory, pipelines and the pass being recorded.
/// Locks are taken in the order recorder, pipelines.
pub struct Vulkan {
    device: Arc<Device>,
    memory: Arc<Memory>,
    rec: Mutex<Recorder>,
    pipes: Mutex<Pipelines>,
    startup: Startup,
    dummy: Owned,
    /// The uniform window matmul_tex reads an activation tile from, `[X_WINDOW_BYTES / 4]`.
    window: Owned,
}

impl Drop for Vulkan {
    fn drop(&mut self) {
        // Keep what the driver compiled for the next start; a cache that cannot be written
        // costs only that start's time.
        if let Some(c) = lock(&self.pipes).cache() {
            let _ = c.save();
        }
    }
}

impl std::fmt::Debug for Vulkan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vulkan")
            .field("device", &self.device.info().name)
            .finish()
    }
}

fn failed(op: &'static str) -> impl Fn(VulkanError) -> BackendError {
    move |e| BackendError::Device {
        op,
        problem: e.to_string(),
    }
}

impl VulkanBackend {
    /// Open the preferred device with default options.
    pub fn new() -> Result<Self, BackendError> {
        Self::open(VulkanOptions::default())
    }

    /// Open a device with `opts`, making the pipelines of [`KERNELS_AT_OPEN`] in parallel
    /// through the pipeline cache on disk (weight kernels are made when a weight of their type
    /// loads).
    pub fn open(opts: VulkanOptions) -> Result<Self, BackendError> {
        let t0 = std::time::Instant::now();
        let device = Arc::new(Device::open_with(opts.device, opts.integer_dot == Some(true))?);
        let device_s = t0.elapsed().as_secs_f64();
        let memory = Arc::new(Memory::new(&device).force_staging(opts.force_staging));
        let dir = opts.pipeline_dir.clone().unwrap_or_else(cache::default_dir);
        let cache = PipelineCache::open(&device, dir.as_deref())?;
        let cache_bytes = cache.loaded();
        let mut pipes = Pipelines::with_cache(&device, Some(cache));
        let t1 = std::time::Instant::now();
        pipes.prepare(&KERNELS_AT_OPEN)?;
        let startup = Startup {
            device_s,
            pipelines_s: t1.elapsed().as_secs_f64(),
            pipelines: pipes.len(),
            cache_bytes,
        };
        let rec = Recorder::new(&memory)?;
        let dummy = Owned::new(memory.alloc(16, USAGE, Location::Device)?, &memory);
        let window_usage = vk::BufferUsageFlags::UNIFORM_BUFFER | vk::BufferUsageFlags::TRANSFER_DST;
        let window = Owned::new(
            memory.alloc(X_WINDOW_BYTES as u64, window_usage, Location::Device)?,
            &memory,
        );
        let layer = Vulkan {
            device,
            memory,
            rec: Mutex::new(rec),
            pipes: Mutex::new(pipes),
            startup,
            dummy,
            window,
        };
        Ok(GpuBackend::over(layer, &opts))
    }

    /// The device in use.
    pub fn device(&self) -> &Device {
        &self.layer().device
    }

    /// What opening the backend took.
    pub fn startup(&self) -> Startup {
        self.layer().startup
    }

    /// Submissions, dispatches, readbacks and staged bytes so far.
    pub fn stats(&self) -> PassStats {
        lock(&self.layer().rec).stats()
    }

    /// Time every dispatch from now on (timestamp queries); see [`VulkanBackend::profile`].
    pub fn enable_profile(&self) -> Result<(), BackendError> {
        lock(&self.layer().rec).enable_profile().map_err(failed("profile"))
    }

    /// Device time per kernel since [`VulkanBackend::enable_profile`], most first.
    pub fn profile(&self) -> Vec<KernelTime> {
        lock(&self.layer().rec).profile()
    }

    /// Pipelines made so far.
    pub fn pipelines(&self) -> usize {
        lock(&self.layer().pipes).len()
    }

    /// Seconds spent making pipelines so far: at open, for each weight format as weights are
    /// placed, and at first use (what the pipeline cache on disk saves a warm start).
    pub fn pipeline_seconds(&self) -> f64 {
        lock(&self.layer().pipes).making_seconds()
    }

    /// Submit the recorded work and wait for it.
    pub fn flush(&self) -> Result<(), BackendError> {
        lock(&self.layer().rec).submit().map_err(failed("submit"))
    }
}

impl Vulkan {
    /// A device buffer of `bytes` (rounded up to whole words, at least 16), not cleared.
    fn buffer(&self, op: &'static str, bytes: u64) -> Result<Owned, BackendError> {
        let size = bytes.max(16).div_ceil(4) * 4;
        let buf = self.memory.alloc(size, USAGE, Location::Device).map_err(failed(op))?;
        Ok(Owned::new(buf, &self.memory))
    }
}

impl gpu::Device for Vulkan {
    type Buf = Owned;
    type Image = OwnedImage;

    const NAME: &'static str = "vulkan";

    fn caps(&self) -> Caps {
        let info = self.device.info();
        let spec = self.device.specializations();
        let enabled = self.device.enabled();
        let g = &info.subgroups;
        let max_storage = u64::from(info.limits.max_storage_buffer_range);
        Caps {
            cpu: info.device_type == DeviceType::Cpu,
            subgroups: spec.subgroup_operations.is_used().then_some((g.min_size, g.max_size)),
            f16: enabled.float16,
            integer_dot: enabled.integer_dot_product,
            cooperative_matrix: spec
                .cooperative_matrix_size
                .filter(|_| enabled.cooperative_matrix)
                .and_then(|t| u8::try_from(t).ok()),
            max_storage,
            max_binding: max_storage,
            max_image_rows: u64::from(info.limits.max_image_dimension_2d),
        }
    }

    fn alloc(&self, op: &'static str, bytes: u64) -> Result<Owned, BackendError> {
        let owned = self.buffer(op, bytes)?;
        let size = owned.get().size;
        lock(&self.rec).fill(owned.get(), 0, size, 0).map_err(failed(op))?;
        Ok(owned)
    }

    /// Data that went through staging is submitted at once, so a model's load never holds a
    /// second copy.
    fn upload(&self, op: &'static str, data: &[u8]) -> Result<Owned, BackendError> {
        let owned = self.buffer(op, data.len() as u64)?;
        let size = owned.get().size as usize;
        // Copied only where the words need padding.
        let bytes: std::borrow::Cow<'_, [u8]> = if data.len() == size {
            data.into()
        } else {
            let mut padded = data.to_vec();
            padded.resize(size, 0);
            padded.into()
        };
        let mut rec = lock(&self.rec);
        let before = rec.stats().staged_bytes;
        rec.upload(owned.get(), 0, &bytes).map_err(failed(op))?;
        if rec.stats().staged_bytes != before {
            rec.submit().map_err(failed(op))?;
        }
        Ok(owned)
    }

    fn size(buf: &Owned) -> u64 {
        buf.get().size
    }

    fn weight_buffer(&self, _name: &str, bytes: u64) -> Result<Owned, BackendError> {
        self.buffer("load_weight", bytes)
    }

    fn write_weight(&self, buf: &Owned, offset: u64, data: &[u8]) -> Result<(), BackendError> {
        lock(&self.rec)
            .upload(buf.get(), offset, data)
            .map_err(failed("load_weight"))
    }

    fn weight_image(&self, _name: &str, rows: u64) -> Result<OwnedImage, BackendError> {
        let width = (TEX_ROW_BYTES / 16) as u32;
        let image = self
            .memory
            .alloc_image(width, rows as u32)
            .map_err(failed("load_weight"))?;
        Ok(OwnedImage::new(image, &self.memory))
    }

    fn write_image(&self, image: &OwnedImage, row0: u64, data: &[u8]) -> Result<(), BackendError> {
        lock(&self.rec)
            .upload_image(image.get(), row0 as u32, data)
            .map_err(failed("load_weight"))
    }

    fn part_written(&self) -> Result<(), BackendError> {
        // Submits only where staging copies were recorded (direct writes record nothing).
        lock(&self.rec).submit().map_err(failed("load_weight"))
    }

    fn prepare(&self, op: &'static str, kernels: &[Kernel]) -> Result<(), BackendError> {
        lock(&self.pipes).prepare(kernels).map_err(failed(op))
    }

    fn record(&self, op: &'static str, d: &Dispatch, binds: &[(u32, Bind<'_, Self>)]) -> Result<(), BackendError> {
        let binds: Vec<(u32, dispatch::Bind<'_>)> = binds
            .iter()
            .map(|&(i, b)| {
                let b = match b {
                    Bind::Buffer(b) => dispatch::Bind::Buffer(b.get()),
                    Bind::Uniform(b, size) => dispatch::Bind::Uniform(b.get(), size),
                    Bind::Image(i) => dispatch::Bind::Image(i.get()),
                };
                (i, b)
            })
            .collect();
        let mut rec = lock(&self.rec);
        let mut pipes = lock(&self.pipes);
        rec.dispatch_with(&mut pipes, d, &binds).map_err(failed(op))
    }

    fn copy(&self, op: &'static str, src: (&Owned, u64), dst: (&Owned, u64), bytes: u64) -> Result<(), BackendError> {
        lock(&self.rec)
            .copy(src.0.get(), src.1, dst.0.get(), dst.1, bytes)
            .map_err(failed(op))
    }

    /// Recorded in the pass (staged where work is pending), so earlier work sees the old
    /// contents and later work the new.
    fn write(&self, dst: &Owned, data: &[u8]) -> Result<(), BackendError> {
        lock(&self.rec).upload(dst.get(), 0, data).map_err(failed("write"))
    }

    fn read(&self, op: &'static str, src: &Owned, bytes: u64) -> Result<Readback<Vec<u8>>, BackendError> {
        let data = lock(&self.rec).read(src.get(), 0, bytes as usize).map_err(failed(op))?;
        Ok(Readback::ready(data))
    }

    fn dummy(&self) -> &Owned {
        &self.dummy
    }

    fn window(&self) -> &Owned {
        &self.window
    }
}
