//! The WebGPU backend: the device layer that runs the shared GPU layer's kernels
//! ([`super::gpu`]) through wgpu (Vulkan, Metal, DX12 natively, Mesa lavapipe in CI; the
//! browser's WebGPU on wasm32). What is here is device plumbing: opening a device, placing
//! weights, compiling pipelines, binding buffers to a [`Dispatch`] and recording it, and
//! reading results back.
//!
//! Weights stay in their GGUF block format in storage buffers, decoded inside the kernels;
//! tensors larger than the device's largest storage binding are split by rows into several
//! buffers (one dispatch each). On CPU adapters (Mesa lavapipe) matrices live in textures
//! instead and matmuls read their activations from a uniform buffer
//! ([`MatmulVariant::Texture`]): lavapipe runs each invocation as a SIMD lane and loads a
//! storage buffer one lane at a time, about 7.5 ns per 32-bit word and invocation on the CI
//! machine against about 1 ns per word for a texel fetch and 0.6 ns for a uniform load, which
//! made matmuls cost about 20 ns per multiply-add there.
//!
//! Activations and the KV cache are f32 buffers in device memory; the cache holds values
//! rounded to f16 and attention rounds q and the probabilities to f16, as the CPU backend (and
//! ggml) do, and a matmul's activations are first rounded the way the CPU rounds them for the
//! weight format (Q8_0 or Q8_K blocks, f16: [`plan::quantize_act`]; an option, on by default),
//! so the two backends multiply the same values and differ only in how f32 sums are ordered
//! (the CPU-adapter variants sum with Kahan compensation, nearly exact, as ggml's integer block
//! sums are). A q8_0 cache holds ggml's blocks
//! (int8 values, then the f16 scales: [`plan::kv_words`]), quantized on the device and read
//! directly by attention, with the CPU backend's arithmetic.
//!
//! Ops are recorded into one pending command encoder ([`recorder`]) and submitted when data
//! must come back ([`Backend::read`], [`Backend::argmax`], [`Backend::top_k`]) or
//! [`WebGpuBackend::flush`] is called: one submission and one readback per forward pass. A
//! readback is a [`Readback`] future ([`mapped`]): native callers wait on it, the browser
//! awaits it. Pipelines are compiled once per kernel variant and bind groups once per set of
//! bindings (`recorder`), then reused.

mod buffers;
mod context;
mod mapped;
mod placing;
mod recorder;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use buffers::Store;
pub use buffers::{WebGpuBuffer, WebGpuKv, WebGpuWeight};
#[cfg(not(target_arch = "wasm32"))]
pub use context::list_adapters;
use context::Context;
pub use context::{AdapterReport, WebGpuError};
use mapped::{MappedRead, StagingPool};
pub use placing::WeightWriter;
pub use recorder::Counters;
use recorder::{Bind, Recorder};
/// The wgpu this backend is built on (front ends that reach the device use the same one).
pub use wgpu;

use super::checks::{self, shape, weight_matrix};
use super::gpu::ops;
use super::gpu::plan::{self, AttnPlan, MatShape};
pub use super::gpu::{kernels, MatmulVariant, KV_CHUNK};
use super::gpu::{texlayout, Dispatch, Kernel, Strategy, TEX_ROW_BYTES, X_WINDOW_BYTES};
use super::readback::MaybeSend;
use super::recurrent::MAX_CONV_KERNEL;
use super::{
    Backend, BackendError, Conv, DeltaNet, Form, KvType, MatId, Readback, Rope, Route, SeqAttn, SeqRows, Strided,
};
use crate::gguf::{GgufFile, TensorInfo, TensorView};
use crate::quant::GgmlType;
use crate::sample::Candidates;

/// Options of [`WebGpuBackend::with_options`].
#[derive(Debug, Clone, Copy, Default)]
pub struct WebGpuOptions {
    /// Which adapter of [`list_adapters`] to open (default: the first, the preferred one).
    pub adapter: Option<usize>,
    /// Split weights into buffers of at most this many bytes even when the device allows larger
    /// bindings (tests use it to exercise split tensors on small ones).
    pub max_binding: Option<u64>,
    /// Matmul variant; default: [`MatmulVariant::Texture`] on CPU adapters, else
    /// [`MatmulVariant::Workgroup`].
    pub matmul: Option<MatmulVariant>,
    /// Keep the matmuls from using subgroup operations even where the device has them (tests
    /// run both kernels): [`MatmulVariant::Texture`] shares activation loads through them,
    /// [`MatmulVariant::Workgroup`] reduces its sums with them.
    pub no_subgroups: bool,
    /// Multiply in f16 in [`MatmulVariant::Workgroup`]'s matmuls (rows of a multiple of 4
    /// values) where the device has shader-f16 (dot_x4_f16.wgsl: products that could overflow
    /// are made in f32); default: on where the device has it. Other variants multiply in f32.
    pub f16_matmul: Option<bool>,
    /// Split attention across the KV length in chunks of this many positions whenever a query
    /// sees more; default: chunks of [`KV_CHUNK`] for decode on GPUs, no split on CPU
    /// adapters (their few threads are kept busy by the heads alone).
    pub kv_chunk: Option<usize>,
    /// Round a matmul's activations first as the CPU backend and llama.cpp do for the weight
    /// format (Q8_0/Q8_K blocks, f16: quantize_act.wgsl), so both backends multiply the same
    /// values. Default: on. Off, the matmuls multiply f32 activations (one dispatch fewer per
    /// matmul), and the quantized mixture-of-experts and qwen35 fixtures land up to 0.11 from
    /// llama.cpp's answers where the rounded path stays within the golden README's dense rule.
    pub round_activations: Option<bool>,
    /// Ask for a device without shader-f16 even where the adapter offers it: every kernel
    /// then runs in f32, as on adapters without the feature (Firefox, Chrome through ANGLE on
    /// Linux, some NVIDIA setups). Tests and the browser package's `webgpu: {f16: false}`.
    pub no_f16: bool,
}

struct Pipe {
    pipeline: wgpu::ComputePipeline,
    layout: wgpu::BindGroupLayout,
}

/// The WebGPU backend. See the module docs. Clones share the device, the compiled pipelines and
/// the pending encoder (several models on one device).
#[derive(Clone)]
pub struct WebGpuBackend {
    ctx: Context,
    pipes: Arc<Mutex<HashMap<Kernel, Arc<Pipe>>>>,
    rec: Arc<Mutex<Recorder>>,
    /// Which kernel variants run here.
    strategy: Strategy,
    /// [`WebGpuOptions::round_activations`].
    round_activations: bool,
    /// Largest weight part in bytes.
    max_binding: u64,
    /// Bound where a kernel's optional input is absent (rope without factors, no sinks).
    dummy: wgpu::Buffer,
    /// The uniform window matmul_tex.wgsl reads activations from ([`X_WINDOW_BYTES`]).
    x_window: wgpu::Buffer,
    /// Split attention's partial results, grown on demand; locked while one attention records
    /// its three passes.
    attn_partials: Arc<Mutex<Option<wgpu::Buffer>>>,
    /// Result buffers of argmax and top-k, kept and reused; the lock is held from the recording
    /// of a result to the recording of its copy into staging, so two threads cannot interleave
    /// their uses.
    results: Arc<Mutex<ResultBuffers>>,
    /// Mappable staging buffers for readbacks.
    staging: StagingPool,
}

/// The argmax and top-k results and the rounded matmul activations, grown on demand and kept:
/// a decode step then allocates nothing and binds the same buffers as the step before.
#[derive(Default)]
struct ResultBuffers {
    argmax: Option<wgpu::Buffer>,
    select: Option<wgpu::Buffer>,
    /// A matmul's activations rounded as the CPU rounds them ([`plan::quantize_act`]), `[rows,
    /// n_in]`; reused by every matmul (dispatches run in order).
    activations: Option<wgpu::Buffer>,
}

impl std::fmt::Debug for WebGpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebGpuBackend")
            .field("adapter", &self.ctx.adapter.name)
            .field("max_binding", &self.max_binding)
            .finish()
    }
}

fn device(op: &'static str, problem: String) -> BackendError {
    BackendError::Device { op, problem }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one leaves nothing half-updated that matters: keep going.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl WebGpuBackend {
    /// Open the preferred adapter (native: blocks until the device is there).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new() -> Result<Self, WebGpuError> {
        Self::with_options(WebGpuOptions::default())
    }

    /// [`WebGpuBackend::new`] with options.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn with_options(opts: WebGpuOptions) -> Result<Self, WebGpuError> {
        pollster::block_on(Self::open(opts))
    }

    /// Open a device with `opts`: awaitable, for the browser's event loop.
    pub async fn open(opts: WebGpuOptions) -> Result<Self, WebGpuError> {
        let ctx = Context::open(opts.adapter, opts.no_f16).await?;
        let cpu_adapter = ctx.adapter.device_type == "Cpu";
        let default_matmul = if cpu_adapter {
            MatmulVariant::Texture
        } else {
            MatmulVariant::Workgroup
        };
        let max_storage = ctx.limits.max_storage_buffer_binding_size;
        let dev_max = max_storage.min(ctx.limits.max_buffer_size);
        let max_binding = opts.max_binding.map_or(dev_max, |m| m.min(dev_max)).max(4);
        let rec = Recorder::new(&ctx.device, &ctx.limits);
        let dummy = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("dummy"),
            size: 16,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        let x_window = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("activation window"),
            size: X_WINDOW_BYTES as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let ctx_subgroups = ctx.device.features().contains(wgpu::Features::SUBGROUP);
        let ctx_f16 = ctx.device.features().contains(wgpu::Features::SHADER_F16);
        let strategy = Strategy {
            matmul: opts.matmul.unwrap_or(default_matmul),
            tex_subgroups: !opts.no_subgroups
                && ctx_subgroups
                && ctx.subgroup_sizes.0 >= 8
                && ctx.subgroup_sizes.1 <= 64,
            reduce_subgroups: !opts.no_subgroups && ctx_subgroups,
            f16_matmul: opts.f16_matmul.unwrap_or(true) && ctx_f16,
            kv_chunk: opts.kv_chunk.or((!cpu_adapter).then_some(KV_CHUNK)),
            split_any_rows: opts.kv_chunk.is_some(),
            max_storage,
        };
        let be = WebGpuBackend {
            ctx,
            pipes: Arc::default(),
            rec: Arc::new(Mutex::new(rec)),
            strategy,
            round_activations: opts.round_activations.unwrap_or(true),
            max_binding,
            dummy,
            x_window,
            attn_partials: Arc::default(),
            results: Arc::default(),
            staging: Arc::default(),
        };
        // Compile the fixed kernels now (weight kernels compile when a weight of the type loads).
        for k in kernels::all_variants() {
            if !k.reads_weights() {
                be.pipe(k)?;
            }
        }
        Ok(be)
    }

    /// The adapter in use.
    pub fn adapter(&self) -> &AdapterReport {
        &self.ctx.adapter
    }

    /// The device (for error scopes and its uncaptured-error handler: the browser reports an
    /// out-of-memory upload there, not as a return value).
    pub fn device(&self) -> &wgpu::Device {
        &self.ctx.device
    }

    /// Largest weight buffer in bytes (weights beyond it are split).
    pub fn max_binding(&self) -> u64 {
        self.max_binding
    }

    /// The matmul variant in use.
    pub fn matmul_variant(&self) -> MatmulVariant {
        self.strategy.matmul
    }

    /// Whether matmuls multiply in f16 (devices with shader-f16, unless turned off).
    pub fn f16_matmul(&self) -> bool {
        self.strategy.f16_matmul
    }

    /// Submissions, readbacks, dispatches and bind groups created so far.
    pub fn counters(&self) -> Counters {
        self.recorder().counters
    }

    /// Bind groups kept for reuse (those of dropped buffers leave with them).
    pub fn cached_bind_groups(&self) -> usize {
        self.recorder().cached_bind_groups()
    }

    /// Submit the recorded work without waiting for it.
    pub fn flush(&self) {
        self.recorder().submit(&self.ctx.queue);
    }

    fn recorder(&self) -> MutexGuard<'_, Recorder> {
        lock(&self.rec)
    }

    /// The compiled pipeline of `k` (compiled on first use, then cached).
    fn pipe(&self, k: Kernel) -> Result<Arc<Pipe>, WebGpuError> {
        let mut pipes = lock(&self.pipes);
        if let Some(p) = pipes.get(&k) {
            return Ok(Arc::clone(p));
        }
        let src = k.source().ok_or_else(|| WebGpuError::Shader {
            kernel: k.label(),
            reason: "no decoder for this type".into(),
        })?;
        let dev = &self.ctx.device;
        #[cfg(not(target_arch = "wasm32"))]
        let scope = dev.push_error_scope(wgpu::ErrorFilter::Validation);
        let mut checks = wgpu::ShaderRuntimeChecks::checked();
        // Every loop of the kernels is bounded by its parameters; the injected loop counters
        // only keep the driver from unrolling and vectorizing (several times slower on
        // lavapipe). Bounds and division checks stay on.
        checks.force_loop_bounding = false;
        // SAFETY: no kernel in shaders/ contains an unbounded loop (each iterates up to a
        // count from its parameter block), the one condition of disabling loop bounding.
        let module = unsafe {
            dev.create_shader_module_trusted(
                wgpu::ShaderModuleDescriptor {
                    label: Some(&k.label()),
                    source: wgpu::ShaderSource::Wgsl(src.into()),
                },
                checks,
            )
        };
        let pipeline = dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&k.label()),
            layout: None,
            module: &module,
            entry_point: Some(k.entry()),
            compilation_options: Default::default(),
            cache: None,
        });
        // Natively a kernel that does not compile is an error here; the browser reports it
        // through the device's uncaptured-error event (every variant is validated by naga in
        // the tests, `tests/wgsl_variants.rs`).
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(WebGpuError::Shader {
                kernel: k.label(),
                reason: e.to_string(),
            });
        }
        let layout = pipeline.get_bind_group_layout(0);
        let p = Arc::new(Pipe { pipeline, layout });
        pipes.insert(k, Arc::clone(&p));
        Ok(p)
    }

    fn pipe_op(&self, op: &'static str, k: Kernel) -> Result<Arc<Pipe>, BackendError> {
        self.pipe(k).map_err(|e| device(op, e.to_string()))
    }

    /// Record dispatch `d` with `binds` (index and buffer) besides its parameter block (binding
    /// 0) and its own data.
    fn record(&self, op: &'static str, d: &Dispatch, binds: &[(u32, &wgpu::Buffer)]) -> Result<(), BackendError> {
        let binds: Vec<(u32, Bind<'_>)> = binds.iter().map(|(i, b)| (*i, Bind::Buffer(b))).collect();
        self.record_with(op, d, binds)
    }

    /// [`Self::record`] with any kind of binding.
    fn record_with(&self, op: &'static str, d: &Dispatch, binds: Vec<(u32, Bind<'_>)>) -> Result<(), BackendError> {
        let pipe = self.pipe_op(op, d.kernel)?;
        let mut rec = self.recorder();
        let extra_len = d.extra.as_ref().map_or(0, |(_, data)| data.len());
        let need = d.params.len() + extra_len + 512;
        if !rec.fits(need) {
            rec.submit(&self.ctx.queue);
        }
        if !rec.fits(need) {
            return Err(shape(op, format!("{extra_len} bytes of parameters exceed the arena")));
        }
        let p_off = rec.push(&d.params);
        let mut all: Vec<(u32, Bind<'_>)> = vec![(
            0,
            Bind::Arena {
                offset: p_off,
                size: d.params.len() as u64,
            },
        )];
        if let Some((b, data)) = &d.extra {
            let off = rec.push(data);
            all.push((
                *b,
                Bind::Arena {
                    offset: off,
                    size: data.len() as u64,
                },
            ));
        }
        all.extend(binds);
        rec.dispatch(&self.ctx.device, &pipe.pipeline, &pipe.layout, &all, d.groups);
        Ok(())
    }

    /// `slot`'s buffer if it holds at least `bytes`, else a new one of twice that (the bind
    /// groups of the one it replaces leave the cache with it).
    fn grown(
        &self,
        slot: &mut Option<wgpu::Buffer>,
        label: &str,
        bytes: u64,
        usage: wgpu::BufferUsages,
    ) -> wgpu::Buffer {
        if let Some(b) = slot.as_ref().filter(|b| b.size() >= bytes) {
            return b.clone();
        }
        if let Some(old) = slot.take() {
            self.recorder().forget(&[&old], &[]);
        }
        let b = self.ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: (2 * bytes).max(64),
            usage,
            mapped_at_creation: false,
        });
        *slot = Some(b.clone());
        b
    }

    fn storage(&self, label: &str, bytes: u64) -> wgpu::Buffer {
        self.ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: bytes.max(16).div_ceil(4) * 4,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    /// A weight of `info` (`n_in` values per row, `n_out` rows) with nothing placed yet.
    fn skeleton(&self, info: &TensorInfo, n_in: usize, n_out: usize) -> WebGpuWeight {
        let ty = info.ty;
        WebGpuWeight {
            name: info.name.clone(),
            ty,
            n_in,
            n_out,
            mats: checks::stacked_matrices(info),
            row_bytes: n_in / ty.block_size() * ty.block_bytes(),
            stride: texlayout::stride(ty, n_in),
            parts: Vec::new(),
            dense: None,
            short_rows: None,
            cache: Arc::downgrade(&self.rec),
        }
    }

    /// A writer that places matrix `info` a piece of rows at a time as they arrive
    /// ([`WeightWriter`]), or `None` for a tensor that must be placed whole
    /// ([`Backend::place_weight`]: vectors and conv kernels, which are converted to f32).
    pub fn weight_writer(&self, info: &TensorInfo) -> Result<Option<WeightWriter>, BackendError> {
        let name = info.name.as_str();
        let bytes = usize::try_from(info.bytes).map_err(|_| BackendError::BadTensor {
            tensor: name.to_string(),
            problem: format!("{} bytes do not fit this machine's memory", info.bytes),
        })?;
        let (n_in, n_out) = weight_matrix(name, info, bytes, kernels::supports, "webgpu")?;
        if !checks::placeable_in_pieces(info) {
            return Ok(None);
        }
        self.weight_writer_for(info, n_in, n_out, None).map(Some)
    }

    /// A storage buffer holding `data` (padded to 4 bytes).
    fn upload(&self, label: &str, data: &[u8]) -> Result<wgpu::Buffer, BackendError> {
        let size = (data.len() as u64).max(16).div_ceil(4) * 4;
        let buf = self.ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: true,
        });
        buf.slice(..)
            .get_mapped_range_mut()
            .map_err(|e| device("upload", format!("'{label}': {e}")))?
            .slice(..data.len())
            .copy_from_slice(data);
        buf.unmap();
        Ok(buf)
    }

    /// Copy `bytes` bytes of `src` into a staging buffer after all recorded work, submit, and
    /// start mapping it: one submission, one readback. The caller holds the lock of whatever
    /// `src` is until this returns.
    fn read_back(&self, op: &'static str, src: &wgpu::Buffer, bytes: u64) -> Readback<Vec<u8>> {
        let size = bytes.max(4).div_ceil(4) * 4;
        let kept = lock(&self.staging).take().filter(|b| b.size() >= size);
        let staging = kept.unwrap_or_else(|| {
            self.ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("readback"),
                size: (2 * size).max(64),
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        });
        {
            let mut rec = self.recorder();
            rec.encoder(&self.ctx.device)
                .copy_buffer_to_buffer(src, 0, &staging, 0, size);
            rec.submit(&self.ctx.queue);
            rec.counters.readbacks += 1;
        }
        Readback::pending(MappedRead::start(
            op,
            staging,
            size,
            bytes as usize,
            &self.ctx.device,
            &self.staging,
        ))
    }

    /// Record `d` reading `x` (binding 1) into the result buffer kept in `slot` (binding `out`)
    /// and read its first `bytes` back.
    fn run_and_read(
        &self,
        op: &'static str,
        d: &Dispatch,
        slot: fn(&mut ResultBuffers) -> &mut Option<wgpu::Buffer>,
        x: &wgpu::Buffer,
        out: u32,
        bytes: u64,
    ) -> Result<Readback<Vec<u8>>, BackendError> {
        let mut results = lock(&self.results);
        let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC;
        let buf = self.grown(slot(&mut results), op, bytes, usage);
        self.record(op, d, &[(1, x), (out, &buf)])?;
        Ok(self.read_back(op, &buf, bytes))
    }

    /// The activations a matmul over weights of type `ty` multiplies: with
    /// [`WebGpuOptions::round_activations`] (the default), the first `len` values of `x`
    /// rounded as the CPU backend rounds them for that format (Q8_0/Q8_K blocks, f16), in the
    /// shared scratch buffer; else (and for f32 weights) `x` itself.
    fn matmul_input(&self, ty: GgmlType, x: &WebGpuBuffer, len: usize) -> Result<wgpu::Buffer, BackendError> {
        if !self.round_activations {
            return Ok(x.buf.clone());
        }
        let Some(d) = plan::quantize_act(ty, len)? else {
            return Ok(x.buf.clone());
        };
        let buf = {
            let mut results = lock(&self.results);
            let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC;
            self.grown(&mut results.activations, "activations", (len * 4) as u64, usage)
        };
        self.record("quantize_act", &d, &[(1, &x.buf), (2, &buf)])?;
        Ok(buf)
    }

    /// [`Backend::matmul`] over texture parts (matmul_tex.wgsl): the activation rows pass
    /// through the uniform window in tiles of up to 8 rows (fewer when rows are long); each tile
    /// is copied there, then met by every part. Shapes are checked by the caller.
    fn matmul_tex(
        &self,
        w: &WebGpuWeight,
        x: &WebGpuBuffer,
        rows: usize,
        out: &mut WebGpuBuffer,
    ) -> Result<(), BackendError> {
        let m = w.matrix("matmul")?;
        let x = self.matmul_input(w.ty, x, rows * w.n_in)?;
        for (r0, n) in plan::tex_tiles(w.n_in, rows) {
            self.recorder().encoder(&self.ctx.device).copy_buffer_to_buffer(
                &x,
                (r0 * w.n_in * 4) as u64,
                &self.x_window,
                0,
                (n * w.n_in * 4) as u64,
            );
            for part in &w.parts {
                let Store::Texture(_, view) = &part.store else {
                    return Err(shape("matmul", format!("'{}' mixes buffer and texture parts", w.name)));
                };
                let d = plan::matmul_tex(&self.strategy, m, part.rows, r0, n, w.stride)?;
                self.record_with(
                    "matmul",
                    &d,
                    vec![
                        (1, Bind::Texture(view)),
                        (2, Bind::Head(&self.x_window, X_WINDOW_BYTES as u64)),
                        (3, Bind::Buffer(&out.buf)),
                    ],
                )?;
            }
        }
        Ok(())
    }

    /// One sequence's attention (rows from `row0` of the batch).
    fn attend(
        &self,
        q: &WebGpuBuffer,
        s: &SeqAttn<'_, WebGpuKv>,
        sinks: Option<&wgpu::Buffer>,
        out: &WebGpuBuffer,
    ) -> Result<(), BackendError> {
        let (k, v) = (s.k_cache, s.v_cache);
        let scales = (k.scales, v.scales);
        let Some(p) = plan::attention(&self.strategy, &s.p, s.row0, sinks.is_some(), k.ty, scales)? else {
            return Ok(());
        };
        let (kc, vc) = (&k.buf.buf, &v.buf.buf);
        let sinks = sinks.unwrap_or(&self.dummy);
        match p {
            AttnPlan::Whole(d) => self.record(
                "attention",
                &d,
                &[(1, &q.buf), (2, kc), (3, vc), (4, &out.buf), (6, sinks)],
            ),
            AttnPlan::Split {
                stats,
                weigh,
                merge,
                partial_floats,
            } => {
                let mut slot = lock(&self.attn_partials);
                let part = self.grown(
                    &mut slot,
                    "attention partials",
                    partial_floats as u64 * 4,
                    wgpu::BufferUsages::STORAGE,
                );
                self.record("attention", &stats, &[(1, &q.buf), (2, kc), (5, &part)])?;
                self.record(
                    "attention",
                    &weigh,
                    &[(1, &q.buf), (2, kc), (3, vc), (5, &part), (6, sinks)],
                )?;
                self.record("attention", &merge, &[(4, &out.buf), (5, &part)])
            }
        }
    }
}

impl ops::Record for WebGpuBackend {
    type Buf = wgpu::Buffer;

    fn record(&self, op: &'static str, d: &Dispatch, binds: &[(u32, &wgpu::Buffer)]) -> Result<(), BackendError> {
        WebGpuBackend::record(self, op, d, binds)
    }

    fn dummy(&self) -> &wgpu::Buffer {
        &self.dummy
    }
}

impl Backend for WebGpuBackend {
    type Buffer = WebGpuBuffer;
    type Kv = WebGpuKv;
    type Weight = WebGpuWeight;

    fn run_pass<R: MaybeSend>(&self, f: impl FnOnce() -> R + MaybeSend) -> R {
        f()
    }

    fn name(&self) -> &'static str {
        "webgpu"
    }

    fn load_weight(&self, file: &Arc<GgufFile>, name: &str) -> Result<WebGpuWeight, BackendError> {
        self.place_weight(file.tensor(name)?)
    }

    fn place_weight(&self, view: TensorView<'_>) -> Result<WebGpuWeight, BackendError> {
        let info = view.info;
        let name = info.name.as_str();
        let (n_in, n_out) = weight_matrix(name, info, view.data.len(), kernels::supports, "webgpu")?;
        if checks::is_vector(info) {
            let v = view.to_f32()?;
            let mut w = self.skeleton(info, n_in, n_out);
            w.dense = Some(self.upload(name, bytemuck::cast_slice(&v))?);
            return Ok(w);
        }
        // A conv kernel (`[kernel, channels]`) is read as plain values by ssm_conv.wgsl. Rows
        // that short belong to no real matmul weight, so the f32 copy costs little; it is
        // kept beside the matrix, which still multiplies.
        let short_bytes = (n_in * n_out) as u64 * 4;
        let short_rows = if n_in <= MAX_CONV_KERNEL && short_bytes <= self.max_binding {
            let v = view.to_f32()?;
            Some(self.upload(name, bytemuck::cast_slice(&v))?)
        } else {
            None
        };
        let mut writer = self.weight_writer_for(info, n_in, n_out, short_rows)?;
        writer.rows(self, 0, view.data)?;
        writer.finish()
    }

    fn alloc(&self, len: usize) -> Result<WebGpuBuffer, BackendError> {
        let bytes = len as u64 * 4;
        if bytes > self.strategy.max_storage {
            return Err(shape(
                "alloc",
                format!(
                    "{len} values exceed the device's largest storage binding ({} bytes)",
                    self.strategy.max_storage
                ),
            ));
        }
        Ok(WebGpuBuffer {
            buf: self.storage("activations", bytes),
            len,
            cache: Arc::downgrade(&self.rec),
        })
    }

    fn alloc_kv(&self, len: usize, ty: KvType) -> Result<WebGpuKv, BackendError> {
        checks::alloc_kv(len, ty)?;
        let (words, scales) = plan::kv_words(len, ty);
        Ok(WebGpuKv {
            buf: self.alloc(words)?,
            len,
            ty,
            scales,
        })
    }

    fn write(&self, dst: &mut WebGpuBuffer, src: &[f32]) -> Result<(), BackendError> {
        checks::need("write", "destination", dst.len, src.len())?;
        // Work recorded before the write must see the old contents: submit it first.
        self.flush();
        if !src.is_empty() {
            self.ctx.queue.write_buffer(&dst.buf, 0, bytemuck::cast_slice(src));
        }
        Ok(())
    }

    fn read(&self, src: &WebGpuBuffer, len: usize) -> Result<Readback<Vec<f32>>, BackendError> {
        checks::need("read", "source", src.len, len)?;
        if len == 0 {
            return Ok(Readback::ready(Vec::new()));
        }
        Ok(self
            .read_back("read", &src.buf, len as u64 * 4)
            .map(|bytes| bytemuck::cast_slice(&bytes).to_vec()))
    }

    fn embed(
        &self,
        table: &WebGpuWeight,
        tokens: &[u32],
        scale: f32,
        out: &mut WebGpuBuffer,
    ) -> Result<(), BackendError> {
        table.matrix("embed")?;
        checks::embed(out.len, tokens, table.n_in, table.n_out)?;
        if tokens.is_empty() {
            return Ok(());
        }
        for part in &table.parts {
            let (kernel, row_bytes, weights) = match &part.store {
                Store::Buffer(b) => (Kernel::Embed(table.ty), table.row_bytes, Bind::Buffer(b)),
                Store::Texture(_, v) => (Kernel::EmbedTex(table.ty), table.stride, Bind::Texture(v)),
            };
            let d = plan::embed(kernel, table.n_in, row_bytes, tokens, part.rows, scale)?;
            self.record_with("embed", &d, vec![(1, weights), (3, Bind::Buffer(&out.buf))])?;
        }
        Ok(())
    }

    fn matmul(
        &self,
        w: &WebGpuWeight,
        x: &WebGpuBuffer,
        rows: usize,
        out: &mut WebGpuBuffer,
    ) -> Result<(), BackendError> {
        let m = w.matrix("matmul")?;
        checks::matmul(x.len, out.len, rows, w.n_in, w.n_out)?;
        if rows == 0 {
            return Ok(());
        }
        if matches!(w.parts[0].store, Store::Texture(..)) {
            return self.matmul_tex(w, x, rows, out);
        }
        let x = self.matmul_input(w.ty, x, rows * w.n_in)?;
        for part in &w.parts {
            let Store::Buffer(buf) = &part.store else {
                return Err(shape("matmul", format!("'{}' mixes buffer and texture parts", w.name)));
            };
            let d = plan::matmul(&self.strategy, m, part.rows, rows, w.row_bytes)?;
            self.record("matmul", &d, &[(1, buf), (2, &x), (3, &out.buf)])?;
        }
        Ok(())
    }

    fn add_bias(&self, x: &mut Self::Buffer, bias: &Self::Weight, rows: usize) -> Result<(), BackendError> {
        let b = bias.dense("add_bias")?;
        ops::add_bias(self, (&x.buf, x.len), (b, bias.n_in), rows)
    }

    fn add(&self, x: &mut Self::Buffer, y: &Self::Buffer, len: usize) -> Result<(), BackendError> {
        ops::binary(self, "add", Kernel::Add, (&x.buf, x.len), ("y", (&y.buf, y.len)), len)
    }

    fn scale(&self, x: &mut Self::Buffer, len: usize, s: f32) -> Result<(), BackendError> {
        ops::scale(self, (&x.buf, x.len), len, s)
    }

    fn hadamard(&self, x: &mut Self::Buffer, groups: usize, n: usize) -> Result<(), BackendError> {
        ops::hadamard(self, (&x.buf, x.len), groups, n)
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
        ops::rmsnorm(self, (&x.buf, x.len), n, groups, eps, (&out.buf, out.len))
    }

    fn rmsnorm_inplace(
        &self,
        x: &mut Self::Buffer,
        w: &Self::Weight,
        groups: usize,
        eps: f32,
    ) -> Result<(), BackendError> {
        let n = (w.dense("rmsnorm")?, w.n_in);
        ops::rmsnorm_inplace(self, (&x.buf, x.len), n, groups, eps)
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
        ops::rope(self, (&x.buf, x.len), (n_head, head_dim), positions, rope, f)
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
                buf: &cache.buf.buf,
                len: cache.len,
                ty: cache.ty,
                scales: cache.scales,
            },
            (&src.buf, src.len),
            row0,
            width,
            positions,
        )
    }

    fn attention(
        &self,
        q: &WebGpuBuffer,
        seqs: &[SeqAttn<'_, WebGpuKv>],
        sinks: Option<&WebGpuWeight>,
        out: &mut WebGpuBuffer,
    ) -> Result<(), BackendError> {
        let sinks_buf = sinks.map(|w| w.dense("attention")).transpose()?;
        checks::attention(
            q.len,
            out.len,
            seqs,
            |c: &WebGpuKv| (c.len, c.ty),
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
            (&gate.buf, gate.len),
            ("up", (&up.buf, up.len)),
            len,
        )
    }

    fn geglu(&self, gate: &mut Self::Buffer, up: &Self::Buffer, len: usize) -> Result<(), BackendError> {
        ops::binary(
            self,
            "geglu",
            Kernel::Geglu,
            (&gate.buf, gate.len),
            ("up", (&up.buf, up.len)),
            len,
        )
    }

    fn sigmoid_mul(&self, x: &mut Self::Buffer, gate: &Self::Buffer, len: usize) -> Result<(), BackendError> {
        ops::binary(
            self,
            "sigmoid_mul",
            Kernel::SigmoidMul,
            (&x.buf, x.len),
            ("gate", (&gate.buf, gate.len)),
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
        ops::swiglu_oai(self, (&gate.buf, gate.len), (&up.buf, up.len), len, alpha, limit)
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
            (&logits.buf, logits.len),
            rows,
            route,
            b,
            (&ids.buf, ids.len),
            (&weights.buf, weights.len),
        )
    }

    fn matmul_id(
        &self,
        w: &WebGpuWeight,
        bias: Option<&WebGpuWeight>,
        x: &WebGpuBuffer,
        ids: &WebGpuBuffer,
        m: MatId,
        out: &mut WebGpuBuffer,
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
        let x = self.matmul_input(w.ty, x, m.inputs() * mat.n_in)?;
        for part in &w.parts {
            let Store::Buffer(buf) = &part.store else {
                return Err(shape("matmul_id", format!("'{}' is held in a texture", w.name)));
            };
            if let Some(d) = plan::matmul_id(mat, n_mat, part.rows, w.row_bytes, m, b.is_some())? {
                let binds = [
                    (1, buf),
                    (2, &x),
                    (3, &out.buf),
                    (4, &ids.buf),
                    (5, b.unwrap_or(&self.dummy)),
                ];
                self.record("matmul_id", &d, &binds)?;
            }
        }
        Ok(())
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
            (&experts.buf, experts.len),
            (&weights.buf, weights.len),
            (rows, slots, width),
            (&out.buf, out.len),
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
            (&x.buf, x.len),
            wv,
            p,
            seq,
            (&state.buf, state.len),
            (&out.buf, out.len),
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
        ops::delta_gates(self, (&alpha.buf, alpha.len), (&beta.buf, beta.len), rows, dt, av)
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
        let bufs = ((&qkv.buf, qkv.len), (&gate.buf, gate.len), (&beta.buf, beta.len));
        ops::delta_net(
            self,
            p,
            form,
            seq,
            bufs.0,
            bufs.1,
            bufs.2,
            (&state.buf, state.len),
            (&out.buf, out.len),
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
        ops::rmsnorm_gated(self, (&x.buf, x.len), (&z.buf, z.len), n, groups, eps)
    }

    fn copy_strided(&self, src: &WebGpuBuffer, dst: &mut WebGpuBuffer, c: &Strided) -> Result<(), BackendError> {
        c.check(src.len, dst.len)?;
        if c.width == 0 {
            return Ok(());
        }
        let mut rec = self.recorder();
        let enc = rec.encoder(&self.ctx.device);
        for i in 0..c.count {
            let (s, d) = (c.src_off + i * c.src_stride, c.dst_off + i * c.dst_stride);
            enc.copy_buffer_to_buffer(&src.buf, (s * 4) as u64, &dst.buf, (d * 4) as u64, (c.width * 4) as u64);
        }
        Ok(())
    }

    fn copy_rows(
        &self,
        src: &WebGpuBuffer,
        row0: usize,
        rows: usize,
        width: usize,
        dst: &mut WebGpuBuffer,
    ) -> Result<(), BackendError> {
        checks::rows("copy_rows", src.len, dst.len, row0, rows, width)?;
        if rows * width == 0 {
            return Ok(());
        }
        self.recorder().encoder(&self.ctx.device).copy_buffer_to_buffer(
            &src.buf,
            (row0 * width * 4) as u64,
            &dst.buf,
            0,
            (rows * width * 4) as u64,
        );
        Ok(())
    }

    fn paste_rows(
        &self,
        src: &WebGpuBuffer,
        rows: usize,
        width: usize,
        dst: &mut WebGpuBuffer,
        row0: usize,
    ) -> Result<(), BackendError> {
        checks::rows("paste_rows", src.len, dst.len, row0, rows, width)?;
        if rows * width == 0 {
            return Ok(());
        }
        self.recorder().encoder(&self.ctx.device).copy_buffer_to_buffer(
            &src.buf,
            0,
            &dst.buf,
            (row0 * width * 4) as u64,
            (rows * width * 4) as u64,
        );
        Ok(())
    }

    fn argmax(&self, x: &WebGpuBuffer, rows: usize, width: usize) -> Result<Readback<Vec<u32>>, BackendError> {
        checks::argmax(rows, width, x.len)?;
        if rows == 0 {
            return Ok(Readback::ready(Vec::new()));
        }
        let d = plan::argmax(rows, width)?;
        let data = self.run_and_read("argmax", &d, |r| &mut r.argmax, &x.buf, 2, rows as u64 * 4)?;
        Ok(data.map(|bytes| bytemuck::cast_slice(&bytes).to_vec()))
    }

    fn top_k(
        &self,
        x: &WebGpuBuffer,
        rows: usize,
        width: usize,
        k: usize,
        gather: &[u32],
    ) -> Result<Readback<Vec<Candidates>>, BackendError> {
        checks::top_k(rows, width, k, x.len)?;
        if rows == 0 {
            return Ok(Readback::ready(Vec::new()));
        }
        let t = plan::top_k(&self.strategy, rows, width, k, gather)?;
        let bytes = (rows * t.per_row) as u64 * 4;
        let data = self.run_and_read("top_k", &t.dispatch, |r| &mut r.select, &x.buf, 3, bytes)?;
        let (k, per_row) = (t.k, t.per_row);
        Ok(data.map(move |data| plan::candidates(bytemuck::cast_slice(&data), k, per_row)))
    }
}
