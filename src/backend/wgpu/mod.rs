//! The WebGPU backend: WGSL kernels (`shaders/`) run through wgpu (Vulkan, Metal, DX12; Mesa
//! lavapipe in CI).
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
//! ggml) do, but matmuls multiply f32 activations (the CPU quantizes them to Q8 first), so the
//! two backends agree to within activation quantization.
//!
//! Ops are recorded into one pending command encoder ([`recorder`]) and submitted when data
//! must come back ([`Backend::read`], [`Backend::argmax`]) or [`WebGpuBackend::flush`] is
//! called: one submission and one readback per forward pass. Pipelines are compiled once per
//! kernel variant and bind groups once per set of bindings (`recorder`), then reused.

pub mod compose;
mod context;
pub mod kernels;
mod recorder;
mod texlayout;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use context::Context;
pub use context::{list_adapters, AdapterReport, WebGpuError};
use kernels::Kernel;
pub use recorder::Counters;
use recorder::{Bind, Recorder};

use super::{check_top_k, need, shape, weight_matrix, AttnParams, Backend, BackendError};
use crate::gguf::GgufFile;
use crate::model::{Rope, RopeKind};
use crate::quant::GgmlType;
use crate::sample::Candidates;

/// Workgroups per grid dimension (WebGPU's guaranteed minimum of the limit).
const MAX_GRID: u32 = 65535;
/// Activation rows per matmul workgroup (`R` in matmul.wgsl).
const MATMUL_ROWS: usize = 8;
/// Largest head size attention.wgsl holds in registers.
const MAX_HEAD_DIM: usize = 256;
/// Bytes per texture row of texture-held weights (4096 Rgba32Uint texels; bytes_tex.wgsl).
const TEX_ROW_BYTES: u64 = 4096 * 16;
/// KV positions per workgroup of split attention on GPUs (see [`WebGpuOptions::kv_chunk`]).
pub const KV_CHUNK: usize = 256;
/// Most query rows for which a GPU splits attention by default (decode, small batches).
const SPLIT_MAX_ROWS: usize = 8;
/// Bytes of the uniform window matmul_tex.wgsl reads its activation tile from.
const X_WINDOW_BYTES: usize = 65536;

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
}

/// How a matmul spreads over invocations (both compute the same sums in f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatmulVariant {
    /// A workgroup per weight row, chunks reduced in workgroup memory (GPUs).
    Workgroup,
    /// An invocation per weight row, no workgroup memory or barriers.
    Rows,
    /// [`MatmulVariant::Rows`] with the weights in textures and the activations in a uniform
    /// buffer: CPU adapters (Mesa lavapipe), which load storage buffers one SIMD lane at a time
    /// but fetch texels and uniforms with vector code (see matmul_tex.wgsl). Matrices whose rows
    /// do not fit its layout (a row length not a multiple of 4 or above 16384) use `Rows`.
    Texture,
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
    /// Largest weight part in bytes.
    max_binding: u64,
    /// Bound where a kernel's optional input is absent (rope without factors).
    dummy: wgpu::Buffer,
    matmul: MatmulVariant,
    /// The uniform window matmul_tex.wgsl reads activations from ([`X_WINDOW_BYTES`]).
    x_window: wgpu::Buffer,
    /// Whether matmul_tex.wgsl shares activation loads through subgroups (of 8 to 64 lanes).
    subgroups: bool,
    /// Whether matmul.wgsl reduces its sums with subgroup operations (any subgroup size).
    reduce_subgroups: bool,
    /// Whether matmul.wgsl multiplies in f16 ([`WebGpuOptions::f16_matmul`]).
    f16_matmul: bool,
    /// Split attention's chunk size (`None`: never split).
    kv_chunk: Option<usize>,
    /// Split for any number of query rows (the chunk was asked for), not only decode.
    split_any_rows: bool,
    /// Split attention's partial results, grown on demand; locked while one attention records
    /// its three passes.
    attn_partials: Arc<Mutex<Option<wgpu::Buffer>>>,
    /// Buffers every readback reuses; the lock is held from the recording of the result to its
    /// read, so two threads cannot interleave their uses.
    reads: Arc<Mutex<ReadBuffers>>,
}

/// The argmax result and the mappable staging buffer, grown on demand and kept: a decode step
/// then allocates nothing and binds the same buffers as the step before.
#[derive(Default)]
struct ReadBuffers {
    argmax: Option<wgpu::Buffer>,
    select: Option<wgpu::Buffer>,
    staging: Option<wgpu::Buffer>,
}

impl std::fmt::Debug for WebGpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebGpuBackend")
            .field("adapter", &self.ctx.adapter.name)
            .field("max_binding", &self.max_binding)
            .finish()
    }
}

/// An f32 activation buffer on the device.
#[derive(Debug)]
pub struct WebGpuBuffer {
    buf: wgpu::Buffer,
    /// Values it holds.
    len: usize,
    /// The recorder whose bind group cache may hold `buf`.
    cache: Weak<Mutex<Recorder>>,
}

/// The bind groups cached with a buffer hold it; its owner's drop removes them, so the device
/// memory goes with the owner (work already recorded keeps its own references).
impl Drop for WebGpuBuffer {
    fn drop(&mut self) {
        forget(&self.cache, &[&self.buf], &[]);
    }
}

fn forget(cache: &Weak<Mutex<Recorder>>, bufs: &[&wgpu::Buffer], views: &[&wgpu::TextureView]) {
    if let Some(rec) = cache.upgrade() {
        rec.lock().unwrap_or_else(|e| e.into_inner()).forget(bufs, views);
    }
}

/// One layer's K or V cache: f32 values rounded to f16.
#[derive(Debug)]
pub struct WebGpuKv(WebGpuBuffer);

/// One buffer or texture of a weight matrix: rows `row0..row0 + rows`, raw GGUF blocks.
#[derive(Debug)]
struct Part {
    row0: usize,
    rows: usize,
    store: Store,
}

/// Where a part's bytes live.
#[derive(Debug)]
enum Store {
    /// Rows of `row_bytes` bytes back to back.
    Buffer(wgpu::Buffer),
    /// Rows of `stride` bytes laid out by texlayout.rs, filling texture rows of
    /// [`TEX_ROW_BYTES`] in order (bytes_tex.wgsl). The texture stays alive with its view.
    Texture(#[allow(dead_code)] wgpu::Texture, wgpu::TextureView),
}

/// A weight on the device.
#[derive(Debug)]
pub struct WebGpuWeight {
    name: String,
    ty: GgmlType,
    /// Values per row (GGUF `shape[0]`).
    n_in: usize,
    /// Rows (product of the other dimensions).
    n_out: usize,
    row_bytes: usize,
    /// Bytes from one row to the next in a texture part (a multiple of 16; texlayout.rs).
    stride: usize,
    /// Matrices: raw blocks, split by rows into parts that fit one binding.
    parts: Vec<Part>,
    /// Vectors (norms, biases, rope factors): f32 values, `n_in` of them.
    dense: Option<wgpu::Buffer>,
    /// See [`WebGpuBuffer::cache`].
    cache: Weak<Mutex<Recorder>>,
}

/// See `Drop for WebGpuBuffer`.
impl Drop for WebGpuWeight {
    fn drop(&mut self) {
        let mut bufs: Vec<&wgpu::Buffer> = self.dense.iter().collect();
        let mut views = Vec::new();
        for part in &self.parts {
            match &part.store {
                Store::Buffer(b) => bufs.push(b),
                Store::Texture(_, v) => views.push(v),
            }
        }
        forget(&self.cache, &bufs, &views);
    }
}

impl WebGpuWeight {
    fn dense(&self, op: &'static str) -> Result<&wgpu::Buffer, BackendError> {
        self.dense
            .as_ref()
            .ok_or_else(|| shape(op, format!("'{}' is a matrix, expected a vector", self.name)))
    }

    /// How many buffers hold the matrix (more than one when it exceeds a binding).
    pub fn parts(&self) -> usize {
        self.parts.len()
    }
}

fn device(op: &'static str, problem: String) -> BackendError {
    BackendError::Device { op, problem }
}

/// A value that must fit the kernels' u32 indices.
fn u(op: &'static str, v: usize) -> Result<u32, BackendError> {
    u32::try_from(v).map_err(|_| shape(op, format!("{v} exceeds the 32-bit index range")))
}

/// The parameter block of every matmul kernel (matmul_params.wgsl) for `part` of `w`: `rows`
/// activation rows from `row0` (texture tiles; 0 otherwise), weight rows `row_bytes` apart.
fn matmul_params(
    w: &WebGpuWeight,
    part: &Part,
    rows: usize,
    row_bytes: usize,
    grid_x: u32,
    row0: usize,
) -> Result<Vec<u8>, BackendError> {
    let m = |v: usize| u("matmul", v);
    Ok(words(&[
        m(w.n_in)?,
        m(part.rows)?,
        m(rows)?,
        m(row_bytes)?,
        m(w.n_in.div_ceil(32))?,
        m(w.n_out)?,
        m(part.row0)?,
        grid_x,
        m(row0)?,
        0,
        0,
        0,
    ]))
}

/// Parameter block from 32-bit words.
fn words(w: &[u32]) -> Vec<u8> {
    bytemuck::cast_slice(w).to_vec()
}

/// A 2-D grid of `n` workgroups: `(x, y)` with `x * y >= n`, `x` passed to the kernel.
fn grid(n: usize) -> (u32, u32) {
    let n = n.max(1);
    let x = n.min(MAX_GRID as usize);
    (x as u32, n.div_ceil(x) as u32)
}

impl WebGpuBackend {
    /// Open the preferred adapter.
    pub fn new() -> Result<Self, WebGpuError> {
        Self::with_options(WebGpuOptions::default())
    }

    pub fn with_options(opts: WebGpuOptions) -> Result<Self, WebGpuError> {
        let ctx = Context::open(opts.adapter)?;
        let default_matmul = if ctx.adapter.device_type == "Cpu" {
            MatmulVariant::Texture
        } else {
            MatmulVariant::Workgroup
        };
        let dev_max = ctx
            .limits
            .max_storage_buffer_binding_size
            .min(ctx.limits.max_buffer_size);
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
        let subgroups = !opts.no_subgroups && ctx_subgroups && ctx.subgroup_sizes.0 >= 8 && ctx.subgroup_sizes.1 <= 64;
        let be = WebGpuBackend {
            ctx,
            pipes: Arc::new(Mutex::new(HashMap::new())),
            rec: Arc::new(Mutex::new(rec)),
            max_binding,
            dummy,
            matmul: opts.matmul.unwrap_or(default_matmul),
            x_window,
            subgroups,
            reduce_subgroups: !opts.no_subgroups && ctx_subgroups,
            f16_matmul: opts.f16_matmul.unwrap_or(true) && ctx_f16,
            reads: Arc::default(),
            kv_chunk: opts
                .kv_chunk
                .or((default_matmul != MatmulVariant::Texture).then_some(KV_CHUNK)),
            split_any_rows: opts.kv_chunk.is_some(),
            attn_partials: Arc::default(),
        };
        // Compile the fixed kernels now (weight kernels compile when a weight of the type loads).
        for k in kernels::all_variants() {
            if !matches!(
                k,
                Kernel::Matmul(..)
                    | Kernel::MatmulRows(_)
                    | Kernel::MatmulTex(..)
                    | Kernel::Embed(_)
                    | Kernel::EmbedTex(_)
            ) {
                be.pipe(k)?;
            }
        }
        Ok(be)
    }

    /// The adapter in use.
    pub fn adapter(&self) -> &AdapterReport {
        &self.ctx.adapter
    }

    /// Largest weight buffer in bytes (weights beyond it are split).
    pub fn max_binding(&self) -> u64 {
        self.max_binding
    }

    /// The matmul variant in use.
    pub fn matmul_variant(&self) -> MatmulVariant {
        self.matmul
    }

    /// The storage-buffer matmul kernel for rows of `n_in` values of type `ty`.
    fn matmul_kernel(&self, ty: GgmlType, n_in: usize) -> Kernel {
        match self.matmul {
            MatmulVariant::Workgroup => {
                let width = if n_in.is_multiple_of(4) { 4 } else { 1 };
                Kernel::Matmul(ty, width, self.reduce_subgroups, width == 4 && self.f16_matmul)
            }
            MatmulVariant::Rows | MatmulVariant::Texture => Kernel::MatmulRows(ty),
        }
    }

    /// Whether a matrix of rows of `n_in` values goes into textures (matmul_tex.wgsl needs
    /// whole vec4s per row and at least one row in the uniform window).
    fn textured(&self, n_in: usize) -> bool {
        self.matmul == MatmulVariant::Texture && n_in.is_multiple_of(4) && n_in * 4 <= X_WINDOW_BYTES
    }

    /// A texture holding `rows` rows of GGUF blocks of type `ty` from `data`, laid out by
    /// texlayout.rs.
    fn upload_texture(
        &self,
        label: &str,
        ty: GgmlType,
        n_in: usize,
        data: &[u8],
        rows: usize,
    ) -> (wgpu::Texture, wgpu::TextureView) {
        let bytes = (rows * texlayout::stride(ty, n_in)) as u64;
        let height = bytes.div_ceil(TEX_ROW_BYTES).max(1);
        let padded = texlayout::lay_out(ty, n_in, data, rows, (height * TEX_ROW_BYTES) as usize);
        let size = wgpu::Extent3d {
            width: (TEX_ROW_BYTES / 16) as u32,
            height: height as u32,
            depth_or_array_layers: 1,
        };
        let tex = self.ctx.device.create_texture(&wgpu::TextureDescriptor {
            label: Some(label),
            size,
            mip_level_count: 1,
            sample_count: 1,
            dimension: wgpu::TextureDimension::D2,
            format: wgpu::TextureFormat::Rgba32Uint,
            usage: wgpu::TextureUsages::TEXTURE_BINDING | wgpu::TextureUsages::COPY_DST,
            view_formats: &[],
        });
        self.ctx.queue.write_texture(
            wgpu::TexelCopyTextureInfo {
                texture: &tex,
                mip_level: 0,
                origin: wgpu::Origin3d::ZERO,
                aspect: wgpu::TextureAspect::All,
            },
            &padded,
            wgpu::TexelCopyBufferLayout {
                offset: 0,
                bytes_per_row: Some(TEX_ROW_BYTES as u32),
                rows_per_image: None,
            },
            size,
        );
        let view = tex.create_view(&wgpu::TextureViewDescriptor::default());
        (tex, view)
    }

    /// Submissions, readbacks, dispatches and bind groups created so far.
    pub fn counters(&self) -> Counters {
        self.lock().counters
    }

    /// Bind groups kept for reuse (those of dropped buffers leave with them).
    pub fn cached_bind_groups(&self) -> usize {
        self.lock().cached_bind_groups()
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
            self.lock().forget(&[&old], &[]);
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

    /// Run kernel `k` reading the rows of `x` (binding 1) into a result buffer kept in `slot`
    /// (binding `out`) and read its first `bytes` back: one submission, one readback. The
    /// read buffers stay locked from recording to reading.
    #[allow(clippy::too_many_arguments)]
    fn run_and_read(
        &self,
        op: &'static str,
        k: Kernel,
        slot: fn(&mut ReadBuffers) -> &mut Option<wgpu::Buffer>,
        params: &[u8],
        extra: Option<(u32, &[u8])>,
        x: &wgpu::Buffer,
        out: u32,
        bytes: u64,
        groups: (u32, u32, u32),
    ) -> Result<Vec<u8>, BackendError> {
        let mut reads = self.reads.lock().unwrap_or_else(|e| e.into_inner());
        let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC;
        let buf = self.grown(slot(&mut reads), op, bytes, usage);
        self.run(op, k, params, extra, &[(1, x), (out, &buf)], groups)?;
        self.read_back_with(&mut reads, op, &buf, bytes)
    }

    /// The parameter block of attention.wgsl.
    fn attn_params(
        &self,
        p: &AttnParams,
        gx: u32,
        n_split: usize,
        chunk: usize,
        acc_off: usize,
    ) -> Result<Vec<u8>, BackendError> {
        let a = |v: usize| u("attention", v);
        Ok(words(&[
            a(p.rows)?,
            a(p.pos0)?,
            a(p.n_head)?,
            a(p.n_head_kv)?,
            a(p.head_dim)?,
            a(p.window.unwrap_or(0))?,
            gx,
            a(n_split)?,
            p.scale.to_bits(),
            a(chunk)?,
            a(acc_off)?,
            0,
        ]))
    }

    /// Submit the recorded work without waiting for it.
    pub fn flush(&self) {
        self.lock().submit(&self.ctx.queue);
    }

    fn lock(&self) -> MutexGuard<'_, Recorder> {
        // A panic while recording leaves nothing half-updated that matters: keep going.
        self.rec.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The compiled pipeline of `k` (compiled on first use, then cached).
    fn pipe(&self, k: Kernel) -> Result<Arc<Pipe>, WebGpuError> {
        let mut pipes = self.pipes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = pipes.get(&k) {
            return Ok(Arc::clone(p));
        }
        let src = k.source().ok_or_else(|| WebGpuError::Shader {
            kernel: k.label(),
            reason: "no decoder for this type".into(),
        })?;
        let dev = &self.ctx.device;
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

    /// Record one dispatch: `params` go to binding 0 (uniform), `extra` (if any) to binding
    /// `extra.0` as a storage slice of the arena.
    fn run(
        &self,
        op: &'static str,
        k: Kernel,
        params: &[u8],
        extra: Option<(u32, &[u8])>,
        binds: &[(u32, &wgpu::Buffer)],
        groups: (u32, u32, u32),
    ) -> Result<(), BackendError> {
        let binds: Vec<(u32, Bind<'_>)> = binds.iter().map(|(i, b)| (*i, Bind::Buffer(b))).collect();
        self.run_with(op, k, params, extra, binds, groups)
    }

    /// [`Self::run`] with any kind of binding.
    fn run_with(
        &self,
        op: &'static str,
        k: Kernel,
        params: &[u8],
        extra: Option<(u32, &[u8])>,
        binds: Vec<(u32, Bind<'_>)>,
        groups: (u32, u32, u32),
    ) -> Result<(), BackendError> {
        let pipe = self.pipe_op(op, k)?;
        let mut rec = self.lock();
        let extra_len = extra.map_or(0, |(_, d)| d.len());
        if !rec.fits(params.len() + extra_len + 512) {
            rec.submit(&self.ctx.queue);
        }
        if !rec.fits(params.len() + extra_len + 512) {
            return Err(shape(op, format!("{extra_len} bytes of parameters exceed the arena")));
        }
        let p_off = rec.push(params);
        let mut all: Vec<(u32, Bind<'_>)> = vec![(
            0,
            Bind::Arena {
                offset: p_off,
                size: params.len() as u64,
            },
        )];
        if let Some((b, data)) = extra {
            let off = rec.push(data);
            all.push((
                b,
                Bind::Arena {
                    offset: off,
                    size: data.len() as u64,
                },
            ));
        }
        all.extend(binds);
        rec.dispatch(&self.ctx.device, &pipe.pipeline, &pipe.layout, &all, groups);
        Ok(())
    }

    fn storage(&self, label: &str, bytes: u64) -> wgpu::Buffer {
        self.ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: bytes.max(16).div_ceil(4) * 4,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
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

    /// Copy `bytes` bytes of `src` back to the host after all recorded work (one submission,
    /// one readback).
    fn read_back(&self, op: &'static str, src: &wgpu::Buffer, bytes: u64) -> Result<Vec<u8>, BackendError> {
        let mut reads = self.reads.lock().unwrap_or_else(|e| e.into_inner());
        self.read_back_with(&mut reads, op, src, bytes)
    }

    /// [`Self::read_back`] with the read buffers already locked.
    fn read_back_with(
        &self,
        reads: &mut ReadBuffers,
        op: &'static str,
        src: &wgpu::Buffer,
        bytes: u64,
    ) -> Result<Vec<u8>, BackendError> {
        let size = bytes.max(4).div_ceil(4) * 4;
        let staging = self.grown(
            &mut reads.staging,
            "readback",
            size,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        );
        {
            let mut rec = self.lock();
            rec.encoder(&self.ctx.device)
                .copy_buffer_to_buffer(src, 0, &staging, 0, size);
            rec.submit(&self.ctx.queue);
            rec.counters.readbacks += 1;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        staging.slice(..size).map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.ctx
            .device
            .poll(wgpu::PollType::Wait {
                submission_index: None,
                timeout: None,
            })
            .map_err(|e| device(op, format!("waiting for it: {e}")))?;
        match rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(device(op, format!("mapping the result: {e}"))),
            Err(_) => return Err(device(op, "it dropped the readback".into())),
        }
        let data = staging
            .slice(..size)
            .get_mapped_range()
            .map_err(|e| device(op, format!("reading the result: {e}")))?[..bytes as usize]
            .to_vec();
        staging.unmap();
        Ok(data)
    }

    #[allow(clippy::too_many_arguments)]
    fn elementwise(
        &self,
        op: &'static str,
        k: Kernel,
        x: &mut WebGpuBuffer,
        y: Option<&wgpu::Buffer>,
        len: usize,
        width: usize,
        s: f32,
    ) -> Result<(), BackendError> {
        need(op, "x", x.len, len)?;
        if len == 0 {
            return Ok(());
        }
        let (gx, gy) = grid(len.div_ceil(256));
        let params = words(&[u(op, len)?, u(op, width)?, s.to_bits(), gx]);
        let mut binds = vec![(1, &x.buf)];
        if let Some(y) = y {
            binds.push((2, y));
        }
        self.run(op, k, &params, None, &binds, (gx, gy, 1))
    }

    fn norm(
        &self,
        k: Kernel,
        x: Option<&WebGpuBuffer>,
        w: &WebGpuWeight,
        groups: usize,
        eps: f32,
        out: &mut WebGpuBuffer,
    ) -> Result<(), BackendError> {
        let n = w.dense("rmsnorm")?;
        let g = w.n_in;
        need("rmsnorm", "output", out.len, groups * g)?;
        if let Some(x) = x {
            need("rmsnorm", "input", x.len, groups * g)?;
        }
        if groups == 0 {
            return Ok(());
        }
        let (gx, gy) = grid(groups);
        let params = words(&[u("rmsnorm", g)?, u("rmsnorm", groups)?, eps.to_bits(), gx]);
        let binds: Vec<(u32, &wgpu::Buffer)> = match x {
            Some(x) => vec![(1, &x.buf), (2, n), (3, &out.buf)],
            None => vec![(2, n), (4, &out.buf)],
        };
        self.run("rmsnorm", k, &params, None, &binds, (gx, gy, 1))
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
        let k = w.n_in;
        // At least one row fits: `textured` admits no longer rows.
        let max_tile = (X_WINDOW_BYTES / (k * 4)).clamp(1, MATMUL_ROWS);
        let mut r0 = 0;
        while r0 < rows {
            let n = max_tile.min(rows - r0);
            // The variant with the fewest row slots that holds the tile (1, 2, 4 or 8).
            let slots = n.next_power_of_two() as u8;
            self.lock().encoder(&self.ctx.device).copy_buffer_to_buffer(
                &x.buf,
                (r0 * k * 4) as u64,
                &self.x_window,
                0,
                (n * k * 4) as u64,
            );
            for part in &w.parts {
                let Store::Texture(_, view) = &part.store else {
                    return Err(shape("matmul", format!("'{}' mixes buffer and texture parts", w.name)));
                };
                let (gx, gy) = grid(part.rows.div_ceil(64));
                let params = matmul_params(w, part, n, w.stride, gx, r0)?;
                self.run_with(
                    "matmul",
                    Kernel::MatmulTex(w.ty, slots, self.subgroups),
                    &params,
                    None,
                    vec![
                        (1, Bind::Texture(view)),
                        (2, Bind::Head(&self.x_window, X_WINDOW_BYTES as u64)),
                        (3, Bind::Buffer(&out.buf)),
                    ],
                    (gx, gy, 1),
                )?;
            }
            r0 += n;
        }
        Ok(())
    }

    fn gated(
        &self,
        op: &'static str,
        k: Kernel,
        gate: &mut WebGpuBuffer,
        up: &WebGpuBuffer,
        len: usize,
    ) -> Result<(), BackendError> {
        need(op, "up", up.len, len)?;
        self.elementwise(op, k, gate, Some(&up.buf), len, 1, 0.0)
    }
}

impl Backend for WebGpuBackend {
    type Buffer = WebGpuBuffer;
    type Kv = WebGpuKv;
    type Weight = WebGpuWeight;

    fn name(&self) -> &'static str {
        "webgpu"
    }

    fn load_weight(&self, file: &Arc<GgufFile>, name: &str) -> Result<WebGpuWeight, BackendError> {
        let view = file.tensor(name)?;
        let info = view.info;
        let (n_in, n_out) = weight_matrix(name, &view, kernels::supports, "webgpu")?;
        let ty = info.ty;
        let bad = |problem: String| BackendError::BadTensor {
            tensor: name.to_string(),
            problem,
        };
        let row_bytes = n_in / ty.block_size() * ty.block_bytes();
        let mut w = WebGpuWeight {
            name: name.to_string(),
            ty,
            n_in,
            n_out,
            row_bytes,
            stride: texlayout::stride(ty, n_in),
            parts: Vec::new(),
            dense: None,
            cache: Arc::downgrade(&self.rec),
        };
        if info.shape.len() <= 1 {
            let v = view.to_f32()?;
            w.dense = Some(self.upload(name, bytemuck::cast_slice(&v))?);
            return Ok(w);
        }
        let textured = self.textured(n_in);
        // Parts hold at most `max_binding` bytes of blocks (the option splits texture parts as it
        // splits buffers); a texture part also at most as many rows as the device's textures.
        let mut rows_per_part = (self.max_binding as usize / row_bytes).min(n_out);
        if textured {
            let tex_bytes = TEX_ROW_BYTES * u64::from(self.ctx.limits.max_texture_dimension_2d);
            rows_per_part = rows_per_part.min(tex_bytes as usize / w.stride);
        }
        if rows_per_part == 0 {
            return Err(bad(format!(
                "one row ({row_bytes} bytes) exceeds the device's largest weight binding ({} bytes)",
                self.max_binding
            )));
        }
        if textured {
            self.pipe_op("load_weight", Kernel::MatmulTex(ty, 1, self.subgroups))?;
            self.pipe_op("load_weight", Kernel::EmbedTex(ty))?;
        } else {
            self.pipe_op("load_weight", self.matmul_kernel(ty, n_in))?;
            self.pipe_op("load_weight", Kernel::Embed(ty))?;
        }
        let mut row0 = 0;
        while row0 < n_out {
            let rows = rows_per_part.min(n_out - row0);
            let bytes = &view.data[row0 * row_bytes..(row0 + rows) * row_bytes];
            let store = if textured {
                let (tex, view) = self.upload_texture(name, ty, n_in, bytes, rows);
                Store::Texture(tex, view)
            } else {
                Store::Buffer(self.upload(name, bytes)?)
            };
            w.parts.push(Part { row0, rows, store });
            row0 += rows;
        }
        Ok(w)
    }

    fn alloc(&self, len: usize) -> Result<WebGpuBuffer, BackendError> {
        let bytes = len as u64 * 4;
        if bytes > self.ctx.limits.max_storage_buffer_binding_size {
            return Err(shape(
                "alloc",
                format!(
                    "{len} values exceed the device's largest storage binding ({} bytes)",
                    self.ctx.limits.max_storage_buffer_binding_size
                ),
            ));
        }
        Ok(WebGpuBuffer {
            buf: self.storage("activations", bytes),
            len,
            cache: Arc::downgrade(&self.rec),
        })
    }

    fn alloc_kv(&self, len: usize) -> Result<WebGpuKv, BackendError> {
        Ok(WebGpuKv(self.alloc(len)?))
    }

    fn write(&self, dst: &mut WebGpuBuffer, src: &[f32]) -> Result<(), BackendError> {
        need("write", "destination", dst.len, src.len())?;
        // Work recorded before the write must see the old contents: submit it first.
        self.flush();
        if !src.is_empty() {
            self.ctx.queue.write_buffer(&dst.buf, 0, bytemuck::cast_slice(src));
        }
        Ok(())
    }

    fn read(&self, src: &WebGpuBuffer, dst: &mut [f32]) -> Result<(), BackendError> {
        need("read", "source", src.len, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        let data = self.read_back("read", &src.buf, dst.len() as u64 * 4)?;
        dst.copy_from_slice(bytemuck::cast_slice(&data));
        Ok(())
    }

    fn embed(
        &self,
        table: &WebGpuWeight,
        tokens: &[u32],
        scale: f32,
        out: &mut WebGpuBuffer,
    ) -> Result<(), BackendError> {
        let width = table.n_in;
        need("embed", "output", out.len, tokens.len() * width)?;
        if table.parts.is_empty() {
            return Err(shape(
                "embed",
                format!("'{}' is a vector, expected a matrix", table.name),
            ));
        }
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= table.n_out) {
            return Err(BackendError::TokenOutOfRange {
                token: t,
                n_vocab: table.n_out,
            });
        }
        if tokens.is_empty() {
            return Ok(());
        }
        let n_chunks = width.div_ceil(32);
        let (gx, gy) = grid((tokens.len() * n_chunks).div_ceil(64));
        for part in &table.parts {
            let (kernel, row_bytes, weights) = match &part.store {
                Store::Buffer(b) => (Kernel::Embed(table.ty), table.row_bytes, Bind::Buffer(b)),
                Store::Texture(_, v) => (Kernel::EmbedTex(table.ty), table.stride, Bind::Texture(v)),
            };
            let params = words(&[
                u("embed", width)?,
                u("embed", n_chunks)?,
                u("embed", row_bytes)?,
                u("embed", tokens.len())?,
                u("embed", part.row0)?,
                u("embed", part.rows)?,
                scale.to_bits(),
                gx,
            ]);
            self.run_with(
                "embed",
                kernel,
                &params,
                Some((2, bytemuck::cast_slice(tokens))),
                vec![(1, weights), (3, Bind::Buffer(&out.buf))],
                (gx, gy, 1),
            )?;
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
        let (k, n) = (w.n_in, w.n_out);
        need("matmul", "input", x.len, rows * k)?;
        need("matmul", "output", out.len, rows * n)?;
        if w.parts.is_empty() {
            return Err(shape("matmul", format!("'{}' is a vector, expected a matrix", w.name)));
        }
        if rows == 0 {
            return Ok(());
        }
        if matches!(w.parts[0].store, Store::Texture(..)) {
            return self.matmul_tex(w, x, rows, out);
        }
        let tiles = rows.div_ceil(MATMUL_ROWS);
        if tiles > MAX_GRID as usize {
            return Err(shape("matmul", format!("{rows} rows exceed one dispatch")));
        }
        for part in &w.parts {
            let (gx, gy, gz) = match self.matmul {
                MatmulVariant::Workgroup => {
                    let (x, y) = grid(part.rows);
                    (x, y, tiles as u32)
                }
                MatmulVariant::Rows | MatmulVariant::Texture => {
                    let (x, y) = grid((part.rows * tiles).div_ceil(64));
                    (x, y, 1)
                }
            };
            let Store::Buffer(buf) = &part.store else {
                return Err(shape("matmul", format!("'{}' mixes buffer and texture parts", w.name)));
            };
            let params = matmul_params(w, part, rows, w.row_bytes, gx, 0)?;
            self.run(
                "matmul",
                self.matmul_kernel(w.ty, w.n_in),
                &params,
                None,
                &[(1, buf), (2, &x.buf), (3, &out.buf)],
                (gx, gy, gz),
            )?;
        }
        Ok(())
    }

    fn add_bias(&self, x: &mut WebGpuBuffer, bias: &WebGpuWeight, rows: usize) -> Result<(), BackendError> {
        let b = bias.dense("add_bias")?;
        let width = bias.n_in;
        self.elementwise("add_bias", Kernel::AddBias, x, Some(b), rows * width, width, 0.0)
    }

    fn add(&self, x: &mut WebGpuBuffer, y: &WebGpuBuffer, len: usize) -> Result<(), BackendError> {
        need("add", "y", y.len, len)?;
        self.elementwise("add", Kernel::Add, x, Some(&y.buf), len, 1, 0.0)
    }

    fn scale(&self, x: &mut WebGpuBuffer, len: usize, s: f32) -> Result<(), BackendError> {
        self.elementwise("scale", Kernel::Scale, x, None, len, 1, s)
    }

    fn rmsnorm(
        &self,
        x: &WebGpuBuffer,
        w: &WebGpuWeight,
        groups: usize,
        eps: f32,
        out: &mut WebGpuBuffer,
    ) -> Result<(), BackendError> {
        self.norm(Kernel::RmsNorm, Some(x), w, groups, eps, out)
    }

    fn rmsnorm_inplace(
        &self,
        x: &mut WebGpuBuffer,
        w: &WebGpuWeight,
        groups: usize,
        eps: f32,
    ) -> Result<(), BackendError> {
        self.norm(Kernel::RmsNormInplace, None, w, groups, eps, x)
    }

    fn rope(
        &self,
        x: &mut WebGpuBuffer,
        rows: usize,
        n_head: usize,
        head_dim: usize,
        pos0: usize,
        rope: &Rope,
        factors: Option<&WebGpuWeight>,
    ) -> Result<(), BackendError> {
        need("rope", "input", x.len, rows * n_head * head_dim)?;
        if rope.n_rot > head_dim || !rope.n_rot.is_multiple_of(2) {
            return Err(shape(
                "rope",
                format!("n_rot {} does not fit head size {head_dim}", rope.n_rot),
            ));
        }
        let f = match factors {
            Some(w) => {
                if w.n_in < rope.n_rot / 2 {
                    return Err(shape(
                        "rope",
                        format!("{} frequency factors for {} pairs", w.n_in, rope.n_rot / 2),
                    ));
                }
                w.dense("rope")?
            }
            None => &self.dummy,
        };
        let n = rows * n_head * (rope.n_rot / 2);
        if n == 0 {
            return Ok(());
        }
        // The same expression as the CPU's rope_table, so both start from the same f32.
        let theta_scale = rope.base.powf(-2.0 / rope.n_rot as f32);
        let (gx, gy) = grid(n.div_ceil(64));
        let params = words(&[
            u("rope", rows)?,
            u("rope", n_head)?,
            u("rope", head_dim)?,
            u("rope", pos0)?,
            u("rope", rope.n_rot)?,
            u32::from(rope.kind == RopeKind::Neox),
            u32::from(factors.is_some()),
            gx,
            theta_scale.to_bits(),
            rope.freq_scale.to_bits(),
            0,
            0,
        ]);
        self.run("rope", Kernel::Rope, &params, None, &[(1, &x.buf), (2, f)], (gx, gy, 1))
    }

    fn kv_store(
        &self,
        k_cache: &mut WebGpuKv,
        v_cache: &mut WebGpuKv,
        k: &WebGpuBuffer,
        v: &WebGpuBuffer,
        rows: usize,
        kv_dim: usize,
        pos0: usize,
    ) -> Result<(), BackendError> {
        let n = rows * kv_dim;
        need("kv_store", "k", k.len, n)?;
        need("kv_store", "v", v.len, n)?;
        let start = pos0 * kv_dim;
        need("kv_store", "k cache", k_cache.0.len, start + n)?;
        need("kv_store", "v cache", v_cache.0.len, start + n)?;
        if n == 0 {
            return Ok(());
        }
        let (gx, gy) = grid(n.div_ceil(256));
        let params = words(&[u("kv_store", n)?, u("kv_store", start)?, gx, 0]);
        self.run(
            "kv_store",
            Kernel::KvStore,
            &params,
            None,
            &[(1, &k.buf), (2, &v.buf), (3, &k_cache.0.buf), (4, &v_cache.0.buf)],
            (gx, gy, 1),
        )
    }

    fn attention(
        &self,
        q: &WebGpuBuffer,
        k_cache: &WebGpuKv,
        v_cache: &WebGpuKv,
        p: &AttnParams,
        out: &mut WebGpuBuffer,
    ) -> Result<(), BackendError> {
        p.check(q.len, out.len, k_cache.0.len, v_cache.0.len)?;
        let hd = p.head_dim;
        if hd > MAX_HEAD_DIM {
            return Err(shape(
                "attention",
                format!("head size {hd} exceeds the kernel's {MAX_HEAD_DIM}"),
            ));
        }
        if p.rows == 0 {
            return Ok(());
        }
        let last = p.pos0 + p.rows; // positions the last query sees
        let split = self
            .kv_chunk
            .filter(|&c| c > 0 && last > c && (self.split_any_rows || p.rows <= SPLIT_MAX_ROWS));
        let Some(chunk) = split else {
            let (gx, gy) = grid(p.rows * p.n_head);
            let params = self.attn_params(p, gx, 1, 0, 0)?;
            return self.run(
                "attention",
                Kernel::Attention,
                &params,
                None,
                &[(1, &q.buf), (2, &k_cache.0.buf), (3, &v_cache.0.buf), (4, &out.buf)],
                (gx, gy, 1),
            );
        };
        let n_split = last.div_ceil(chunk);
        let parts = p.rows * p.n_head * n_split;
        let acc_off = 2 * parts;
        let floats = acc_off + parts * hd;
        if floats as u64 * 4 > self.ctx.limits.max_storage_buffer_binding_size {
            return Err(shape(
                "attention",
                format!("{parts} split partial results exceed the device's largest storage binding"),
            ));
        }
        let mut slot = self.attn_partials.lock().unwrap_or_else(|e| e.into_inner());
        let s = self.grown(
            &mut slot,
            "attention partials",
            floats as u64 * 4,
            wgpu::BufferUsages::STORAGE,
        );
        let (gx, gy) = grid(parts);
        let params = self.attn_params(p, gx, n_split, chunk, acc_off)?;
        let kv = [(1, &q.buf), (2, &k_cache.0.buf), (5, &s)];
        self.run("attention", Kernel::AttentionStats, &params, None, &kv, (gx, gy, 1))?;
        let kv = [(1, &q.buf), (2, &k_cache.0.buf), (3, &v_cache.0.buf), (5, &s)];
        self.run("attention", Kernel::AttentionWeigh, &params, None, &kv, (gx, gy, 1))?;
        let (mx, my) = grid(p.rows * p.n_head);
        let params = self.attn_params(p, mx, n_split, chunk, acc_off)?;
        self.run(
            "attention",
            Kernel::AttentionMerge,
            &params,
            None,
            &[(4, &out.buf), (5, &s)],
            (mx, my, 1),
        )
    }

    fn swiglu(&self, gate: &mut WebGpuBuffer, up: &WebGpuBuffer, len: usize) -> Result<(), BackendError> {
        self.gated("swiglu", Kernel::Swiglu, gate, up, len)
    }

    fn geglu(&self, gate: &mut WebGpuBuffer, up: &WebGpuBuffer, len: usize) -> Result<(), BackendError> {
        self.gated("geglu", Kernel::Geglu, gate, up, len)
    }

    fn copy_rows(
        &self,
        src: &WebGpuBuffer,
        row0: usize,
        rows: usize,
        width: usize,
        dst: &mut WebGpuBuffer,
    ) -> Result<(), BackendError> {
        need("copy_rows", "source", src.len, (row0 + rows) * width)?;
        need("copy_rows", "destination", dst.len, rows * width)?;
        if rows * width == 0 {
            return Ok(());
        }
        let mut rec = self.lock();
        rec.encoder(&self.ctx.device).copy_buffer_to_buffer(
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
        need("paste_rows", "source", src.len, rows * width)?;
        need("paste_rows", "destination", dst.len, (row0 + rows) * width)?;
        if rows * width == 0 {
            return Ok(());
        }
        let mut rec = self.lock();
        rec.encoder(&self.ctx.device).copy_buffer_to_buffer(
            &src.buf,
            0,
            &dst.buf,
            (row0 * width * 4) as u64,
            (rows * width * 4) as u64,
        );
        Ok(())
    }

    fn argmax(&self, x: &WebGpuBuffer, rows: usize, width: usize) -> Result<Vec<u32>, BackendError> {
        need("argmax", "input", x.len, rows * width)?;
        if width == 0 {
            return Err(shape("argmax", "zero-width rows".into()));
        }
        if rows == 0 {
            return Ok(Vec::new());
        }
        let (gx, gy) = grid(rows);
        let params = words(&[u("argmax", rows)?, u("argmax", width)?, gx, 0]);
        let data = self.run_and_read(
            "argmax",
            Kernel::Argmax,
            |r| &mut r.argmax,
            &params,
            None,
            &x.buf,
            2,
            rows as u64 * 4,
            (gx, gy, 1),
        )?;
        Ok(bytemuck::cast_slice(&data).to_vec())
    }

    fn top_k(
        &self,
        x: &WebGpuBuffer,
        rows: usize,
        width: usize,
        k: usize,
        gather: &[u32],
    ) -> Result<Vec<Candidates>, BackendError> {
        check_top_k(rows, width, k)?;
        need("top_k", "input", x.len, rows * width)?;
        if rows == 0 {
            return Ok(Vec::new());
        }
        let k = k.min(width);
        let per_row = 2 * k + gather.len();
        let words_out = rows
            .checked_mul(per_row)
            .filter(|&n| n as u64 * 4 <= self.ctx.limits.max_storage_buffer_binding_size)
            .ok_or_else(|| shape("top_k", format!("{rows} rows of {per_row} candidates exceed a binding")))?;
        let (gx, gy) = grid(rows);
        let params = words(&[
            u("top_k", rows)?,
            u("top_k", width)?,
            u("top_k", k)?,
            gx,
            u("top_k", gather.len())?,
            0,
            0,
            0,
        ]);
        // The gather ids go in the arena (at least one word: a binding is never empty).
        let ids: Vec<u32> = if gather.is_empty() { vec![0] } else { gather.to_vec() };
        let data = self.run_and_read(
            "top_k",
            Kernel::Select,
            |r| &mut r.select,
            &params,
            Some((2, bytemuck::cast_slice(&ids))),
            &x.buf,
            3,
            words_out as u64 * 4,
            (gx, gy, 1),
        )?;
        let w: &[u32] = bytemuck::cast_slice(&data);
        Ok(w.chunks_exact(per_row)
            .map(|r| Candidates {
                top: r[..k]
                    .iter()
                    .zip(&r[k..2 * k])
                    .map(|(&i, &v)| (i, f32::from_bits(v)))
                    .collect(),
                gathered: r[2 * k..].iter().map(|&v| f32::from_bits(v)).collect(),
            })
            .collect())
    }
}
