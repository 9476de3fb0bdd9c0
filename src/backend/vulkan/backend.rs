//! The Vulkan backend: [`Backend`] over the device layers beside it. The op plans, argument
//! checks and kernels are the shared GPU layer's (the WebGPU backend runs the same ones), so
//! this file only places data and records dispatches: one command buffer per pass, submitted
//! when a result must come back (one submission and one small readback per decoded token).
//!
//! Weights stay in their GGUF block format in storage buffers, split by rows into parts that
//! fit the device's largest storage binding. Matmuls use the workgroup kernels on GPUs
//! (subgroup reductions and f16 products where the device was opened with them) and the
//! one-row-per-invocation kernels on CPU devices (lavapipe), as on WebGPU; the texture layout
//! WebGPU uses on CPU adapters is not taken here (see the module docs of `super`). A matmul's
//! activations are rounded as the CPU backend rounds them for the weight format first
//! (quantize_act), so the backends multiply the same values.

use std::sync::{Arc, Mutex, MutexGuard};

use ash::vk;

use super::buffers::{Owned, OwnedImage, Store, VulkanBuffer, VulkanKv, VulkanWeight};
use super::cache::{self, PipelineCache};
use super::device::{Device, DeviceType};
use super::dispatch::{Bind, KernelTime, PassStats, Pipelines, Recorder};
use super::memory::{Buffer, Location, Memory};
use super::VulkanError;
use crate::backend::checks::{self, shape, weight_matrix};
use crate::backend::gpu::ops;
use crate::backend::gpu::plan::{self, AttnPlan, MatShape, PartRows};
use crate::backend::gpu::{
    kernels, texlayout, Dispatch, Kernel, MatmulVariant, Strategy, KV_CHUNK, MATMUL_ROWS, TEX_ROW_BYTES, X_WINDOW_BYTES,
};
use crate::backend::readback::MaybeSend;
use crate::backend::recurrent::MAX_CONV_KERNEL;
use crate::backend::{
    Backend, BackendError, Conv, DeltaNet, Form, KvType, MatId, Readback, Rope, Route, SeqAttn, SeqRows, Strided,
};
use crate::gguf::{GgufFile, TensorView};
use crate::quant::GgmlType;
use crate::sample::Candidates;

/// Every buffer is bound as storage and is a copy source and destination.
const USAGE: vk::BufferUsageFlags = vk::BufferUsageFlags::from_raw(
    vk::BufferUsageFlags::STORAGE_BUFFER.as_raw()
        | vk::BufferUsageFlags::TRANSFER_SRC.as_raw()
        | vk::BufferUsageFlags::TRANSFER_DST.as_raw(),
);

/// Options of [`VulkanBackend::open`].
#[derive(Debug, Clone, Default)]
pub struct VulkanOptions {
    /// Which device of [`super::list_devices`] to open (default: [`super::pick`]'s choice).
    pub device: Option<usize>,
    /// Split weights into buffers of at most this many bytes (tests exercise split tensors).
    pub max_binding: Option<u64>,
    /// Matmul variant; default: [`MatmulVariant::Texture`] on CPU devices (lavapipe: weights
    /// in images, activations in a uniform window, as on WebGPU), else
    /// [`MatmulVariant::Workgroup`].
    pub matmul: Option<MatmulVariant>,
    /// Keep the matmuls from reducing with subgroup operations even where the device has them.
    pub no_subgroups: bool,
    /// Multiply in f16 in the workgroup matmuls where the device was opened with f16; default on.
    pub f16_matmul: Option<bool>,
    /// Split attention across the KV length in chunks of this many positions (default: chunks of
    /// [`KV_CHUNK`] for decode on GPUs, no split on CPU devices).
    pub kv_chunk: Option<usize>,
    /// Round a matmul's activations as the CPU does first (default on; see the WebGPU option).
    pub round_activations: Option<bool>,
    /// Multiply Q8_0 weights held in buffers with packed integer dot products (matmul_dot.wgsl,
    /// llama.cpp's integer arithmetic). Default: where the device accelerates them
    /// ([`super::Specializations::integer_dot_product`]); `Some(true)` also where it only
    /// emulates them (tests), `Some(false)` never.
    pub integer_dot: Option<bool>,
    /// Multiply more than [`MATMUL_ROWS`] activation rows by weights held in buffers (of any
    /// format but F32) with cooperative matrices (matmul_coop.wgsl, VK_KHR_cooperative_matrix). Default: where the
    /// device offers a shape the kernels use ([`super::Specializations::cooperative_matrix`])
    /// and its weights are in buffers (GPUs); `Some(false)` never.
    pub cooperative_matrix: Option<bool>,
    /// Upload and read back through staging buffers even where the host sees device memory.
    pub force_staging: bool,
    /// Where the pipeline cache lives (default [`cache::default_dir`]); `Some(None)` keeps it
    /// in memory only.
    pub pipeline_dir: Option<Option<std::path::PathBuf>>,
}

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
/// at its first cache ([`kernels::kv_kernels`]), routers' kernels with stacked experts, and kernels of
/// one family alone (gated delta-net's, gpt-oss's activation) at first use.
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

/// The Vulkan backend. Clones share the device, pipelines and the pass being recorded.
#[derive(Clone)]
pub struct VulkanBackend {
    inner: Arc<Inner>,
}

/// Locks are taken in the order scratch slot, recorder, pipelines.
struct Inner {
    device: Arc<Device>,
    memory: Arc<Memory>,
    rec: Mutex<Recorder>,
    pipes: Mutex<Pipelines>,
    strategy: Strategy,
    round_activations: bool,
    /// Q8_0 matrices in buffers multiply with integer dot products ([`VulkanOptions::integer_dot`]).
    integer_dot: bool,
    /// The size of the cooperative matrices that multiply batches of activation rows by
    /// buffer-held weights ([`VulkanOptions::cooperative_matrix`]), if they do.
    coop: Option<u8>,
    /// Largest weight part in bytes.
    max_binding: u64,
    startup: Startup,
    /// Bound where a kernel's optional input is absent (rope without factors, no sinks).
    dummy: Owned,
    /// The uniform window matmul_tex reads an activation tile from, `[X_WINDOW_BYTES / 4]`.
    x_window: Owned,
    /// The device's largest image height (texture rows per weight part).
    max_image_rows: u64,
    /// A matmul's activations rounded for its weight format, `[rows, n_in]`, reused by every
    /// matmul; held while a matmul records.
    activations: Mutex<Option<Owned>>,
    /// Argmax ids `[rows]` and top-k candidates `[rows, per_row]`, reused.
    results: Mutex<(Option<Owned>, Option<Owned>)>,
    /// Split attention's partial results, grown on demand.
    partials: Mutex<Option<Owned>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Keep what the driver compiled for the next start; a cache that cannot be written
        // costs only that start's time.
        if let Some(c) = lock(&self.pipes).cache() {
            let _ = c.save();
        }
    }
}

impl std::fmt::Debug for VulkanBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VulkanBackend")
            .field("device", &self.inner.device.info().name)
            .field("matmul", &self.inner.strategy.matmul)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one leaves nothing half-updated that matters: keep going.
    m.lock().unwrap_or_else(|e| e.into_inner())
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

    /// Open a device with `opts`, making the pipelines of [`KERNELS_AT_OPEN`] in parallel through the
    /// pipeline cache on disk (weight kernels are made when a weight of their type loads).
    pub fn open(opts: VulkanOptions) -> Result<Self, BackendError> {
        let t0 = std::time::Instant::now();
        let device = Arc::new(Device::open_with(opts.device, opts.integer_dot == Some(true))?);
        let device_s = t0.elapsed().as_secs_f64();
        let info = device.info();
        let cpu = info.device_type == DeviceType::Cpu;
        let spec = *device.specializations();
        let max_storage = u64::from(info.limits.max_storage_buffer_range);
        let max_binding = opts.max_binding.map_or(max_storage, |m| m.min(max_storage)).max(4);
        let matmul = match opts.matmul {
            Some(m) => m,
            None if cpu => MatmulVariant::Texture,
            None => MatmulVariant::Workgroup,
        };
        let g = &info.subgroups;
        let strategy = Strategy {
            matmul,
            // matmul_tex.wgsl shares loads across subgroups of 8 to 64 lanes.
            tex_subgroups: !opts.no_subgroups
                && spec.subgroup_operations.is_used()
                && g.min_size >= 8
                && g.max_size <= 64,
            reduce_subgroups: !opts.no_subgroups && spec.subgroup_operations.is_used(),
            f16_matmul: opts.f16_matmul.unwrap_or(true) && device.enabled().float16,
            kv_chunk: opts.kv_chunk.or((!cpu).then_some(KV_CHUNK)),
            split_any_rows: opts.kv_chunk.is_some(),
            max_storage,
        };
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
        let round_activations = opts.round_activations.unwrap_or(true);
        // The integer path quantizes activations to Q8_0 blocks: the rounding, always.
        let integer_dot = opts.integer_dot != Some(false) && device.enabled().integer_dot_product && round_activations;
        let coop = match opts.cooperative_matrix {
            Some(false) => None,
            // Forced: wherever the device has them (lavapipe emulates them, slowly).
            Some(true) => spec.cooperative_matrix_size,
            None => spec
                .cooperative_matrix_size
                .filter(|_| matmul == MatmulVariant::Workgroup),
        }
        .filter(|_| device.enabled().cooperative_matrix)
        .and_then(|t| u8::try_from(t).ok());
        let dummy = Owned::new(memory.alloc(16, USAGE, Location::Device)?, &memory);
        let window_usage = vk::BufferUsageFlags::UNIFORM_BUFFER | vk::BufferUsageFlags::TRANSFER_DST;
        let x_window = Owned::new(
            memory.alloc(X_WINDOW_BYTES as u64, window_usage, Location::Device)?,
            &memory,
        );
        let max_image_rows = u64::from(info.limits.max_image_dimension_2d);
        Ok(Self {
            inner: Arc::new(Inner {
                device,
                memory,
                rec: Mutex::new(rec),
                pipes: Mutex::new(pipes),
                strategy,
                round_activations,
                integer_dot,
                coop,
                max_binding,
                startup,
                dummy,
                x_window,
                max_image_rows,
                activations: Mutex::default(),
                results: Mutex::default(),
                partials: Mutex::default(),
            }),
        })
    }

    /// The device in use.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// Which kernel variants run here.
    pub fn strategy(&self) -> Strategy {
        self.inner.strategy
    }

    /// Whether Q8_0 matrices in buffers multiply with packed integer dot products.
    pub fn integer_dot(&self) -> bool {
        self.inner.integer_dot
    }

    /// The size of the cooperative matrices that multiply batches of rows, if they do.
    pub fn cooperative_matrix(&self) -> Option<u8> {
        self.inner.coop
    }

    /// The cooperative matrices' size for weights of type `ty`, if batches of rows over them
    /// take that path: not F32 ones (routers, whose experts can lie within 2e-4 of each other,
    /// and other matrices a model keeps in f32 keep f32 arithmetic; no kernel is built for them).
    fn coop_size(&self, ty: GgmlType) -> Option<u8> {
        self.inner.coop.filter(|_| ty != GgmlType::F32)
    }

    /// What opening the backend took.
    pub fn startup(&self) -> Startup {
        self.inner.startup
    }

    /// Submissions, dispatches, readbacks and staged bytes so far.
    pub fn stats(&self) -> PassStats {
        lock(&self.inner.rec).stats()
    }

    /// Time every dispatch from now on (timestamp queries); see [`VulkanBackend::profile`].
    pub fn enable_profile(&self) -> Result<(), BackendError> {
        lock(&self.inner.rec).enable_profile().map_err(failed("profile"))
    }

    /// Device time per kernel since [`VulkanBackend::enable_profile`], most first.
    pub fn profile(&self) -> Vec<KernelTime> {
        lock(&self.inner.rec).profile()
    }

    /// Pipelines made so far.
    pub fn pipelines(&self) -> usize {
        lock(&self.inner.pipes).len()
    }

    /// Seconds spent making pipelines so far: at open, for each weight format as weights are
    /// placed, and at first use (what the pipeline cache on disk saves a warm start).
    pub fn pipeline_seconds(&self) -> f64 {
        lock(&self.inner.pipes).making_seconds()
    }

    /// Write the pipeline cache to disk now (it is also written when the backend is dropped);
    /// returns the bytes written.
    pub fn save_pipeline_cache(&self) -> Result<usize, BackendError> {
        match lock(&self.inner.pipes).cache() {
            Some(c) => c.save().map_err(failed("pipeline cache")),
            None => Ok(0),
        }
    }

    /// Submit the recorded work and wait for it.
    pub fn flush(&self) -> Result<(), BackendError> {
        lock(&self.inner.rec).submit().map_err(failed("submit"))
    }

    /// Record `d` with `binds` (binding index and buffer) besides its parameters and data.
    fn record(&self, op: &'static str, d: &Dispatch, binds: &[(u32, &Buffer)]) -> Result<(), BackendError> {
        let mut rec = lock(&self.inner.rec);
        let mut pipes = lock(&self.inner.pipes);
        rec.dispatch(&mut pipes, d, binds).map_err(failed(op))
    }

    /// [`Self::record`] with image and uniform bindings.
    fn record_with(&self, op: &'static str, d: &Dispatch, binds: &[(u32, Bind<'_>)]) -> Result<(), BackendError> {
        let mut rec = lock(&self.inner.rec);
        let mut pipes = lock(&self.inner.pipes);
        rec.dispatch_with(&mut pipes, d, binds).map_err(failed(op))
    }

    /// A zeroed device buffer of `bytes` (rounded up to whole words).
    fn zeroed(&self, op: &'static str, bytes: u64) -> Result<Owned, BackendError> {
        let size = bytes.max(16).div_ceil(4) * 4;
        let buf = self
            .inner
            .memory
            .alloc(size, USAGE, Location::Device)
            .map_err(failed(op))?;
        let owned = Owned::new(buf, &self.inner.memory);
        let mut rec = lock(&self.inner.rec);
        rec.fill(owned.get(), 0, size, 0).map_err(failed(op))?;
        Ok(owned)
    }

    /// A device buffer holding `data` (padded with zeros to whole words). Data that went
    /// through staging is submitted at once, so a model's load never holds a second copy.
    fn upload(&self, op: &'static str, data: &[u8]) -> Result<Owned, BackendError> {
        let size = (data.len() as u64).max(16).div_ceil(4) * 4;
        let buf = self
            .inner
            .memory
            .alloc(size, USAGE, Location::Device)
            .map_err(failed(op))?;
        let owned = Owned::new(buf, &self.inner.memory);
        let padded: Vec<u8>;
        let bytes = if data.len() as u64 == size {
            data
        } else {
            let mut v = vec![0u8; size as usize];
            v[..data.len()].copy_from_slice(data);
            padded = v;
            &padded
        };
        let mut rec = lock(&self.inner.rec);
        let before = rec.stats().staged_bytes;
        rec.upload(owned.get(), 0, bytes).map_err(failed(op))?;
        if rec.stats().staged_bytes != before {
            rec.submit().map_err(failed(op))?;
        }
        Ok(owned)
    }

    /// An image holding `rows` rows of GGUF blocks of type `ty` laid out by texlayout.rs, in
    /// texture rows of [`TEX_ROW_BYTES`]; submitted at once (the staging copy goes with it).
    fn upload_image(&self, ty: GgmlType, n_in: usize, data: &[u8], rows: usize) -> Result<OwnedImage, BackendError> {
        let bytes = (rows * texlayout::stride(ty, n_in)) as u64;
        let height = bytes.div_ceil(TEX_ROW_BYTES).max(1);
        let padded = texlayout::lay_out(ty, n_in, data, rows, (height * TEX_ROW_BYTES) as usize);
        let width = (TEX_ROW_BYTES / 16) as u32;
        let image = self
            .inner
            .memory
            .alloc_image(width, height as u32)
            .map_err(failed("load_weight"))?;
        let owned = OwnedImage::new(image, &self.inner.memory);
        let mut rec = lock(&self.inner.rec);
        rec.upload_image(owned.get(), &padded)
            .and_then(|()| rec.submit())
            .map_err(failed("load_weight"))?;
        Ok(owned)
    }

    /// [`Backend::matmul`] over image parts (matmul_tex): the activation rows pass through the
    /// uniform window in tiles of up to 8 rows, each copied there, then met by every part.
    fn matmul_tex(&self, w: &VulkanWeight, x: &Buffer, rows: usize, out: &Buffer) -> Result<(), BackendError> {
        let m = w.matrix("matmul")?;
        let window = self.inner.x_window.get();
        for (r0, n) in plan::tex_tiles(w.n_in, rows) {
            lock(&self.inner.rec)
                .copy(x, (r0 * w.n_in * 4) as u64, window, 0, (n * w.n_in * 4) as u64)
                .map_err(failed("matmul"))?;
            for (part, store) in &w.parts {
                let Store::Image(img) = store else {
                    return Err(shape("matmul", format!("'{}' mixes buffer and image parts", w.name)));
                };
                let d = plan::matmul_tex(&self.inner.strategy, m, *part, r0, n, w.stride)?;
                let binds = [
                    (1, Bind::Image(img.get())),
                    (2, Bind::Uniform(window, X_WINDOW_BYTES as u64)),
                    (3, Bind::Buffer(out)),
                ];
                self.record_with("matmul", &d, &binds)?;
            }
        }
        Ok(())
    }

    /// [`Backend::matmul`] of Q8_0 buffer parts with integer dot products: the activations
    /// quantized to packed Q8_0 blocks (in the shared scratch buffer), then matmul_dot.
    fn matmul_dot(
        &self,
        w: &VulkanWeight,
        m: MatShape,
        x: &VulkanBuffer,
        rows: usize,
        out: &VulkanBuffer,
    ) -> Result<(), BackendError> {
        let len = rows * w.n_in;
        let q = plan::quantize_q8_packed(len)?;
        let mut slot = lock(&self.inner.activations);
        let packed = self.grown("quantize_act", &mut slot, (plan::packed_q8_words(len) * 4) as u64)?;
        self.record("quantize_act", &q, &[(1, x.buf.get()), (2, packed)])?;
        for (part, store) in &w.parts {
            let Store::Buffer(buf) = store else {
                return Err(shape("matmul", format!("'{}' mixes buffer and image parts", w.name)));
            };
            let d = plan::matmul_dot(m, *part, rows, w.row_bytes)?;
            self.record("matmul", &d, &[(1, buf.get()), (2, packed), (3, out.buf.get())])?;
        }
        Ok(())
    }

    /// `slot`'s buffer if it holds at least `bytes`, else a new one of twice that.
    fn grown<'a>(&self, op: &'static str, slot: &'a mut Option<Owned>, bytes: u64) -> Result<&'a Buffer, BackendError> {
        if slot.as_ref().is_none_or(|b| b.get().size < bytes) {
            *slot = Some(self.zeroed(op, (2 * bytes).max(64))?);
        }
        Ok(slot.as_ref().expect("just set").get())
    }

    /// Record `d` reading `x` (binding 1) into a result buffer (binding `out`) and read its
    /// first `bytes` back: the pass's one submission.
    fn run_and_read(
        &self,
        op: &'static str,
        d: &Dispatch,
        argmax: bool,
        x: &Buffer,
        out: u32,
        bytes: u64,
    ) -> Result<Vec<u8>, BackendError> {
        let mut results = lock(&self.inner.results);
        let slot = if argmax { &mut results.0 } else { &mut results.1 };
        let buf = self.grown(op, slot, bytes)?;
        self.record(op, d, &[(1, x), (out, buf)])?;
        lock(&self.inner.rec).read(buf, 0, bytes as usize).map_err(failed(op))
    }

    /// Run `f` with the activations a matmul over weights of type `ty` multiplies: the first
    /// `len` values of `x` rounded as the CPU rounds them for that format (in the shared
    /// scratch buffer, locked meanwhile), or `x` itself (f32 weights, or rounding off).
    fn with_matmul_input<R>(
        &self,
        ty: GgmlType,
        x: &VulkanBuffer,
        len: usize,
        f: impl FnOnce(&Buffer) -> Result<R, BackendError>,
    ) -> Result<R, BackendError> {
        let d = match self.inner.round_activations {
            true => plan::quantize_act(ty, len)?,
            false => None,
        };
        let Some(d) = d else { return f(x.buf.get()) };
        let mut slot = lock(&self.inner.activations);
        let buf = self.grown("quantize_act", &mut slot, (len * 4) as u64)?;
        self.record("quantize_act", &d, &[(1, x.buf.get()), (2, buf)])?;
        f(buf)
    }

    /// One sequence's attention (rows from `s.row0` of the batch).
    fn attend(
        &self,
        q: &VulkanBuffer,
        s: &SeqAttn<'_, VulkanKv>,
        sinks: Option<&Buffer>,
        out: &VulkanBuffer,
    ) -> Result<(), BackendError> {
        let (k, v) = (s.k_cache, s.v_cache);
        let scales = (k.scales, v.scales);
        let Some(p) = plan::attention(&self.inner.strategy, &s.p, s.row0, sinks.is_some(), k.ty, scales)? else {
            return Ok(());
        };
        let (kc, vc) = (k.buf.buf.get(), v.buf.buf.get());
        let (q, out) = (q.buf.get(), out.buf.get());
        let sinks = sinks.unwrap_or(self.inner.dummy.get());
        match p {
            AttnPlan::Whole(d) => self.record("attention", &d, &[(1, q), (2, kc), (3, vc), (4, out), (6, sinks)]),
            AttnPlan::Split {
                stats,
                weigh,
                merge,
                partial_floats,
            } => {
                let mut slot = lock(&self.inner.partials);
                let part = self.grown("attention", &mut slot, partial_floats as u64 * 4)?;
                self.record("attention", &stats, &[(1, q), (2, kc), (5, part)])?;
                self.record("attention", &weigh, &[(1, q), (2, kc), (3, vc), (5, part), (6, sinks)])?;
                self.record("attention", &merge, &[(4, out), (5, part)])
            }
        }
    }

    /// Make the pipelines a weight of type `ty` with rows of `n_in` values needs, now.
    fn prepare_weight_kernels(
        &self,
        ty: GgmlType,
        n_in: usize,
        stacked: bool,
        textured: bool,
    ) -> Result<(), BackendError> {
        let st = &self.inner.strategy;
        let ks = if stacked {
            vec![Kernel::MatmulId(ty)]
        } else if textured {
            let mut ks: Vec<Kernel> = kernels::TEX_TILES
                .iter()
                .map(|&r| st.matmul_tex_kernel(ty, r as usize))
                .collect();
            ks.push(Kernel::EmbedTex(ty));
            ks
        } else if self.inner.integer_dot && ty == GgmlType::Q8_0 {
            vec![Kernel::MatmulDot(ty), Kernel::Embed(ty)]
        } else {
            vec![st.matmul_kernel(ty, n_in), Kernel::Embed(ty)]
        };
        let mut ks = ks;
        if let Some(size) = self.coop_size(ty).filter(|_| !stacked && !textured) {
            ks.push(Kernel::MatmulCoop { ty, size });
        }
        // What multiplying by these weights needs besides: the activations rounded to the
        // weights' blocks (or packed for integer dot products), and a router's kernels
        // where experts are stacked.
        ks.push(Kernel::QuantizeAct);
        if ks.contains(&Kernel::MatmulDot(ty)) {
            ks.push(Kernel::QuantizeQ8Packed);
        }
        if stacked {
            ks.extend([Kernel::Route, Kernel::MoeCombine]);
        }
        lock(&self.inner.pipes).prepare(&ks).map_err(failed("load_weight"))
    }
}

impl ops::Record for VulkanBackend {
    type Buf = Buffer;

    fn record(&self, op: &'static str, d: &Dispatch, binds: &[(u32, &Buffer)]) -> Result<(), BackendError> {
        VulkanBackend::record(self, op, d, binds)
    }

    fn dummy(&self) -> &Buffer {
        self.inner.dummy.get()
    }
}

impl Backend for VulkanBackend {
    type Buffer = VulkanBuffer;
    type Kv = VulkanKv;
    type Weight = VulkanWeight;

    fn run_pass<R: MaybeSend>(&self, f: impl FnOnce() -> R + MaybeSend) -> R {
        f()
    }

    fn name(&self) -> &'static str {
        "vulkan"
    }

    fn load_weight(&self, file: &Arc<GgufFile>, name: &str) -> Result<VulkanWeight, BackendError> {
        self.place_weight(file.tensor(name)?)
    }

    fn place_weight(&self, view: TensorView<'_>) -> Result<VulkanWeight, BackendError> {
        let info = view.info;
        let name = info.name.as_str();
        let (n_in, n_out) = weight_matrix(name, view.info, view.data.len(), kernels::supports, "vulkan")?;
        let ty = info.ty;
        let row_bytes = n_in / ty.block_size() * ty.block_bytes();
        let mut w = VulkanWeight {
            name: name.to_string(),
            ty,
            n_in,
            n_out,
            mats: checks::stacked_matrices(info),
            row_bytes,
            stride: texlayout::stride(ty, n_in),
            parts: Vec::new(),
            dense: None,
            short_rows: None,
        };
        if checks::is_vector(info) {
            let v = view.to_f32()?;
            w.dense = Some(self.upload("load_weight", bytemuck::cast_slice(&v))?);
            return Ok(w);
        }
        // A conv kernel (`[kernel, channels]`) is read as plain values by ssm_conv; see the
        // WebGPU backend.
        let short_bytes = (n_in * n_out) as u64 * 4;
        if n_in <= MAX_CONV_KERNEL && short_bytes <= self.inner.max_binding {
            let v = view.to_f32()?;
            w.short_rows = Some(self.upload("load_weight", bytemuck::cast_slice(&v))?);
        }
        // Stacks (experts, MLA's per-head matrices) are read by matmul_id, from buffers.
        let textured = w.mats == 1 && self.inner.strategy.textured(n_in);
        let image = textured.then_some((TEX_ROW_BYTES * self.inner.max_image_rows, w.stride));
        let rows_per_part = crate::backend::gpu::rows_per_part(name, row_bytes, n_out, self.inner.max_binding, image)?;
        self.prepare_weight_kernels(ty, n_in, w.mats > 1, textured)?;
        let mut row0 = 0;
        while row0 < n_out {
            let rows = rows_per_part.min(n_out - row0);
            let bytes = &view.data[row0 * row_bytes..(row0 + rows) * row_bytes];
            let store = if textured {
                Store::Image(self.upload_image(ty, n_in, bytes, rows)?)
            } else {
                Store::Buffer(self.upload("load_weight", bytes)?)
            };
            w.parts.push((PartRows { row0, rows }, store));
            row0 += rows;
        }
        Ok(w)
    }

    fn alloc(&self, len: usize) -> Result<VulkanBuffer, BackendError> {
        let bytes = len as u64 * 4;
        if bytes > self.inner.strategy.max_storage {
            return Err(shape(
                "alloc",
                format!(
                    "{len} values exceed the device's largest storage binding ({} bytes)",
                    self.inner.strategy.max_storage
                ),
            ));
        }
        Ok(VulkanBuffer {
            buf: self.zeroed("alloc", bytes)?,
            len,
        })
    }

    fn alloc_kv(&self, len: usize, ty: KvType) -> Result<VulkanKv, BackendError> {
        checks::alloc_kv(len, ty)?;
        // The first cache of this format: its store and attention pipelines, made together.
        lock(&self.inner.pipes)
            .prepare(&kernels::kv_kernels(ty))
            .map_err(failed("alloc_kv"))?;
        let (words, scales) = plan::kv_words(len, ty);
        Ok(VulkanKv {
            buf: self.alloc(words)?,
            len,
            ty,
            scales,
        })
    }

    fn write(&self, dst: &mut VulkanBuffer, src: &[f32]) -> Result<(), BackendError> {
        checks::need("write", "destination", dst.len, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        // Recorded in the pass (staged where work is pending), so earlier work sees the old
        // contents and later work the new.
        lock(&self.inner.rec)
            .upload(dst.buf.get(), 0, bytemuck::cast_slice(src))
            .map_err(failed("write"))
    }

    fn read(&self, src: &VulkanBuffer, len: usize) -> Result<Readback<Vec<f32>>, BackendError> {
        checks::need("read", "source", src.len, len)?;
        if len == 0 {
            return Ok(Readback::ready(Vec::new()));
        }
        let bytes = lock(&self.inner.rec)
            .read(src.buf.get(), 0, len * 4)
            .map_err(failed("read"))?;
        Ok(Readback::ready(bytemuck::pod_collect_to_vec(&bytes)))
    }

    fn embed(
        &self,
        table: &VulkanWeight,
        tokens: &[u32],
        scale: f32,
        out: &mut VulkanBuffer,
    ) -> Result<(), BackendError> {
        table.matrix("embed")?;
        checks::embed(out.len, tokens, table.n_in, table.n_out)?;
        if tokens.is_empty() {
            return Ok(());
        }
        for (rows, store) in &table.parts {
            let (kernel, row_bytes, weights) = match store {
                Store::Buffer(b) => (Kernel::Embed(table.ty), table.row_bytes, Bind::Buffer(b.get())),
                Store::Image(i) => (Kernel::EmbedTex(table.ty), table.stride, Bind::Image(i.get())),
            };
            let d = plan::embed(kernel, table.n_in, row_bytes, tokens, *rows, scale)?;
            self.record_with("embed", &d, &[(1, weights), (3, Bind::Buffer(out.buf.get()))])?;
        }
        Ok(())
    }

    fn matmul(
        &self,
        w: &VulkanWeight,
        x: &VulkanBuffer,
        rows: usize,
        out: &mut VulkanBuffer,
    ) -> Result<(), BackendError> {
        let m = w.matrix("matmul")?;
        checks::matmul(x.len, out.len, rows, w.n_in, w.n_out)?;
        if rows == 0 {
            return Ok(());
        }
        let in_buffers = matches!(w.parts[0].1, Store::Buffer(_));
        let coop = self.coop_size(w.ty).filter(|_| in_buffers && rows > MATMUL_ROWS);
        if coop.is_none() && self.inner.integer_dot && w.ty == GgmlType::Q8_0 && in_buffers {
            return self.matmul_dot(w, m, x, rows, out);
        }
        self.with_matmul_input(w.ty, x, rows * w.n_in, |x| {
            if !in_buffers {
                return self.matmul_tex(w, x, rows, out.buf.get());
            }
            for (part, store) in &w.parts {
                let Store::Buffer(buf) = store else {
                    return Err(shape("matmul", format!("'{}' mixes buffer and image parts", w.name)));
                };
                let d = match coop {
                    Some(size) => plan::matmul_coop(m, *part, rows, w.row_bytes, size)?,
                    None => plan::matmul(&self.inner.strategy, m, *part, rows, w.row_bytes)?,
                };
                self.record("matmul", &d, &[(1, buf.get()), (2, x), (3, out.buf.get())])?;
            }
            Ok(())
        })
    }

    fn add_bias(&self, x: &mut Self::Buffer, bias: &Self::Weight, rows: usize) -> Result<(), BackendError> {
        let b = bias.dense("add_bias")?;
        ops::add_bias(self, (x.buf.get(), x.len), (b, bias.n_in), rows)
    }

    fn add(&self, x: &mut Self::Buffer, y: &Self::Buffer, len: usize) -> Result<(), BackendError> {
        ops::binary(
            self,
            "add",
            Kernel::Add,
            (x.buf.get(), x.len),
            ("y", (y.buf.get(), y.len)),
            len,
        )
    }

    fn scale(&self, x: &mut Self::Buffer, len: usize, s: f32) -> Result<(), BackendError> {
        ops::scale(self, (x.buf.get(), x.len), len, s)
    }

    fn hadamard(&self, x: &mut Self::Buffer, groups: usize, n: usize) -> Result<(), BackendError> {
        ops::hadamard(self, (x.buf.get(), x.len), groups, n)
    }

    fn rmsnorm(
        &self,
        x: &Self::Buffer,
        w: &Self::Weight,
        groups: usize,
        eps: f32,
        out: &mut Self::Buffer,
    ) -> Result<(), BackendError> {
        let n = (w.dense("rmsnorm")?, w.n_in);
        ops::rmsnorm(self, (x.buf.get(), x.len), n, groups, eps, (out.buf.get(), out.len))
    }

    fn rmsnorm_inplace(
        &self,
        x: &mut Self::Buffer,
        w: &Self::Weight,
        groups: usize,
        eps: f32,
    ) -> Result<(), BackendError> {
        let n = (w.dense("rmsnorm")?, w.n_in);
        ops::rmsnorm_inplace(self, (x.buf.get(), x.len), n, groups, eps)
    }

    fn rope(
        &self,
        x: &mut Self::Buffer,
        n_head: usize,
        head_dim: usize,
        positions: &[u32],
        rope: &Rope,
        factors: Option<&Self::Weight>,
    ) -> Result<(), BackendError> {
        let f = factors.map(|w| w.dense("rope").map(|b| (b, w.n_in))).transpose()?;
        ops::rope(self, (x.buf.get(), x.len), (n_head, head_dim), positions, rope, f)
    }

    fn kv_store(
        &self,
        cache: &mut Self::Kv,
        src: &Self::Buffer,
        row0: usize,
        width: usize,
        positions: &[u32],
    ) -> Result<(), BackendError> {
        ops::kv_store(
            self,
            ops::KvArg {
                buf: cache.buf.buf.get(),
                len: cache.len,
                ty: cache.ty,
                scales: cache.scales,
            },
            (src.buf.get(), src.len),
            row0,
            width,
            positions,
        )
    }

    fn attention(
        &self,
        q: &VulkanBuffer,
        seqs: &[SeqAttn<'_, VulkanKv>],
        sinks: Option<&VulkanWeight>,
        out: &mut VulkanBuffer,
    ) -> Result<(), BackendError> {
        let sinks_buf = sinks.map(|w| w.dense("attention")).transpose()?;
        checks::attention(
            q.len,
            out.len,
            seqs,
            |c: &VulkanKv| (c.len, c.ty),
            sinks.map(|w| w.n_in),
        )?;
        for s in seqs {
            self.attend(q, s, sinks_buf, out)?;
        }
        Ok(())
    }

    fn swiglu(&self, gate: &mut Self::Buffer, up: &Self::Buffer, len: usize) -> Result<(), BackendError> {
        ops::binary(
            self,
            "swiglu",
            Kernel::Swiglu,
            (gate.buf.get(), gate.len),
            ("up", (up.buf.get(), up.len)),
            len,
        )
    }

    fn geglu(&self, gate: &mut Self::Buffer, up: &Self::Buffer, len: usize) -> Result<(), BackendError> {
        ops::binary(
            self,
            "geglu",
            Kernel::Geglu,
            (gate.buf.get(), gate.len),
            ("up", (up.buf.get(), up.len)),
            len,
        )
    }

    fn sigmoid_mul(&self, x: &mut Self::Buffer, gate: &Self::Buffer, len: usize) -> Result<(), BackendError> {
        ops::binary(
            self,
            "sigmoid_mul",
            Kernel::SigmoidMul,
            (x.buf.get(), x.len),
            ("gate", (gate.buf.get(), gate.len)),
            len,
        )
    }

    fn swiglu_oai(
        &self,
        gate: &mut Self::Buffer,
        up: &Self::Buffer,
        len: usize,
        alpha: f32,
        limit: f32,
    ) -> Result<(), BackendError> {
        ops::swiglu_oai(
            self,
            (gate.buf.get(), gate.len),
            (up.buf.get(), up.len),
            len,
            alpha,
            limit,
        )
    }

    fn route_experts(
        &self,
        logits: &Self::Buffer,
        rows: usize,
        route: &Route,
        bias: Option<&Self::Weight>,
        ids: &mut Self::Buffer,
        weights: &mut Self::Buffer,
    ) -> Result<(), BackendError> {
        let b = bias
            .map(|w| w.dense("route_experts").map(|b| (b, w.n_in * w.n_out)))
            .transpose()?;
        ops::route_experts(
            self,
            (logits.buf.get(), logits.len),
            rows,
            route,
            b,
            (ids.buf.get(), ids.len),
            (weights.buf.get(), weights.len),
        )
    }

    fn matmul_id(
        &self,
        w: &VulkanWeight,
        bias: Option<&VulkanWeight>,
        x: &VulkanBuffer,
        ids: &VulkanBuffer,
        m: MatId,
        out: &mut VulkanBuffer,
    ) -> Result<(), BackendError> {
        let shape_all = w.matrix("matmul_id")?;
        let b = bias.map(|w| w.dense("matmul_id")).transpose()?;
        let n_mat = w.mats;
        let mat = MatShape {
            n_out: shape_all.n_out / n_mat,
            ..shape_all
        };
        m.check(
            mat.n_in,
            mat.n_out,
            n_mat,
            bias.map(|b| b.n_in * b.n_out),
            x.len,
            ids.len,
            out.len,
        )?;
        self.with_matmul_input(w.ty, x, m.inputs() * mat.n_in, |x| {
            for (part, store) in &w.parts {
                let Store::Buffer(buf) = store else {
                    return Err(shape("matmul_id", format!("'{}' is held in an image", w.name)));
                };
                if let Some(d) = plan::matmul_id(mat, n_mat, *part, w.row_bytes, m, b.is_some())? {
                    let binds = [
                        (1, buf.get()),
                        (2, x),
                        (3, out.buf.get()),
                        (4, ids.buf.get()),
                        (5, b.unwrap_or(self.inner.dummy.get())),
                    ];
                    self.record("matmul_id", &d, &binds)?;
                }
            }
            Ok(())
        })
    }

    fn moe_combine(
        &self,
        experts: &Self::Buffer,
        weights: &Self::Buffer,
        rows: usize,
        slots: usize,
        width: usize,
        out: &mut Self::Buffer,
    ) -> Result<(), BackendError> {
        ops::moe_combine(
            self,
            (experts.buf.get(), experts.len),
            (weights.buf.get(), weights.len),
            (rows, slots, width),
            (out.buf.get(), out.len),
        )
    }

    fn ssm_conv(
        &self,
        x: &Self::Buffer,
        w: &Self::Weight,
        p: &Conv,
        seq: SeqRows,
        state: &mut Self::Buffer,
        out: &mut Self::Buffer,
    ) -> Result<(), BackendError> {
        let wv = w.values("ssm_conv")?;
        ops::ssm_conv(
            self,
            (x.buf.get(), x.len),
            wv,
            p,
            seq,
            (state.buf.get(), state.len),
            (out.buf.get(), out.len),
        )
    }

    fn delta_gates(
        &self,
        alpha: &mut Self::Buffer,
        beta: &mut Self::Buffer,
        rows: usize,
        dt_bias: &Self::Weight,
        a: &Self::Weight,
    ) -> Result<(), BackendError> {
        let (dt, av) = (dt_bias.values("delta_gates")?, a.values("delta_gates")?);
        ops::delta_gates(
            self,
            (alpha.buf.get(), alpha.len),
            (beta.buf.get(), beta.len),
            rows,
            dt,
            av,
        )
    }

    /// Token by token in either form (delta_net.wgsl): the forms agree to f32 rounding, and
    /// one token's work is already spread over every state column.
    fn delta_net(
        &self,
        p: &DeltaNet,
        form: Form,
        seq: SeqRows,
        qkv: &Self::Buffer,
        gate: &Self::Buffer,
        beta: &Self::Buffer,
        state: &mut Self::Buffer,
        out: &mut Self::Buffer,
    ) -> Result<(), BackendError> {
        let bufs = (
            (qkv.buf.get(), qkv.len),
            (gate.buf.get(), gate.len),
            (beta.buf.get(), beta.len),
        );
        ops::delta_net(
            self,
            p,
            form,
            seq,
            bufs.0,
            bufs.1,
            bufs.2,
            (state.buf.get(), state.len),
            (out.buf.get(), out.len),
        )
    }

    fn rmsnorm_gated(
        &self,
        x: &mut Self::Buffer,
        z: &Self::Buffer,
        w: &Self::Weight,
        groups: usize,
        eps: f32,
    ) -> Result<(), BackendError> {
        let n = (w.dense("rmsnorm_gated")?, w.n_in);
        ops::rmsnorm_gated(self, (x.buf.get(), x.len), (z.buf.get(), z.len), n, groups, eps)
    }

    fn copy_strided(&self, src: &VulkanBuffer, dst: &mut VulkanBuffer, c: &Strided) -> Result<(), BackendError> {
        c.check(src.len, dst.len)?;
        if c.width == 0 {
            return Ok(());
        }
        let mut rec = lock(&self.inner.rec);
        for i in 0..c.count {
            let (s, d) = (c.src_off + i * c.src_stride, c.dst_off + i * c.dst_stride);
            rec.copy(
                src.buf.get(),
                (s * 4) as u64,
                dst.buf.get(),
                (d * 4) as u64,
                (c.width * 4) as u64,
            )
            .map_err(failed("copy_strided"))?;
        }
        Ok(())
    }

    fn copy_rows(
        &self,
        src: &VulkanBuffer,
        row0: usize,
        rows: usize,
        width: usize,
        dst: &mut VulkanBuffer,
    ) -> Result<(), BackendError> {
        checks::rows("copy_rows", src.len, dst.len, row0, rows, width)?;
        let (off, len) = ((row0 * width * 4) as u64, (rows * width * 4) as u64);
        lock(&self.inner.rec)
            .copy(src.buf.get(), off, dst.buf.get(), 0, len)
            .map_err(failed("copy_rows"))
    }

    fn paste_rows(
        &self,
        src: &VulkanBuffer,
        rows: usize,
        width: usize,
        dst: &mut VulkanBuffer,
        row0: usize,
    ) -> Result<(), BackendError> {
        checks::rows("paste_rows", src.len, dst.len, row0, rows, width)?;
        let (off, len) = ((row0 * width * 4) as u64, (rows * width * 4) as u64);
        lock(&self.inner.rec)
            .copy(src.buf.get(), 0, dst.buf.get(), off, len)
            .map_err(failed("paste_rows"))
    }

    fn argmax(&self, x: &VulkanBuffer, rows: usize, width: usize) -> Result<Readback<Vec<u32>>, BackendError> {
        checks::argmax(rows, width, x.len)?;
        if rows == 0 {
            return Ok(Readback::ready(Vec::new()));
        }
        let d = plan::argmax(rows, width)?;
        let bytes = self.run_and_read("argmax", &d, true, x.buf.get(), 2, rows as u64 * 4)?;
        Ok(Readback::ready(bytemuck::pod_collect_to_vec(&bytes)))
    }

    fn top_k(
        &self,
        x: &VulkanBuffer,
        rows: usize,
        width: usize,
        k: usize,
        gather: &[u32],
    ) -> Result<Readback<Vec<Candidates>>, BackendError> {
        checks::top_k(rows, width, k, x.len)?;
        if rows == 0 {
            return Ok(Readback::ready(Vec::new()));
        }
        let t = plan::top_k(&self.inner.strategy, rows, width, k, gather)?;
        let bytes = (rows * t.per_row) as u64 * 4;
        let data = self.run_and_read("top_k", &t.dispatch, false, x.buf.get(), 3, bytes)?;
        let w: Vec<u32> = bytemuck::pod_collect_to_vec(&data);
        Ok(Readback::ready(plan::candidates(&w, t.k, t.per_row)))
    }
}
