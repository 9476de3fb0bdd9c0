//! [`WebGpu`], the WebGPU device layer (see the module docs of [`super`]), and the WebGPU
//! backend's names for the shared GPU backend's types over it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use super::context::{AdapterReport, Context, WebGpuError};
use super::mapped::{MappedRead, StagingPool};
use super::recorder::{self, Counters, Recorder, WgpuBuf, WgpuImage};
use crate::backend::checks::shape;
use crate::backend::error::BackendError;
use crate::backend::gpu::backend::GpuBackend;
use crate::backend::gpu::buffers::{GpuBuffer, GpuKv, GpuWeight};
use crate::backend::gpu::device::{Bind, Caps, Device};
use crate::backend::gpu::dispatch::Dispatch;
use crate::backend::gpu::kernels::{self, Kernel};
use crate::backend::gpu::options::GpuOptions;
use crate::backend::gpu::sizes::{TEX_ROW_BYTES, X_WINDOW_BYTES};
use crate::backend::readback::Readback;
use crate::backend::sync::lock;

/// The WebGPU backend: the shared GPU backend over wgpu.
pub type WebGpuBackend = GpuBackend<WebGpu>;
/// An activation buffer of the WebGPU backend.
pub type WebGpuBuffer = GpuBuffer<WebGpu>;
/// A KV cache of the WebGPU backend.
pub type WebGpuKv = GpuKv<WebGpu>;
/// A weight of the WebGPU backend.
pub type WebGpuWeight = GpuWeight<WebGpu>;
/// Options of [`WebGpuBackend::with_options`]: the GPU options (`device` picks an adapter of
/// [`super::context::list_adapters`]).
pub type WebGpuOptions = GpuOptions;
/// A matrix weight being placed a piece of rows at a time (the browser's streamed load).
pub type WeightWriter = crate::backend::gpu::placing::WeightWriter<WebGpu>;

struct Pipe {
    pipeline: wgpu::ComputePipeline,
    layout: wgpu::BindGroupLayout,
}

/// The WebGPU device layer: an open device, its compiled pipelines and the pending encoder.
pub struct WebGpu {
    ctx: Context,
    pipes: Mutex<HashMap<Kernel, Arc<Pipe>>>,
    rec: Arc<Mutex<Recorder>>,
    dummy: WgpuBuf,
    window: WgpuBuf,
    /// Mappable staging buffers for readbacks.
    staging: StagingPool,
}

impl std::fmt::Debug for WebGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebGpu")
            .field("adapter", &self.ctx.adapter.name)
            .finish()
    }
}

fn device(op: &'static str, problem: String) -> BackendError {
    BackendError::Device { op, problem }
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

    /// Open a device with `opts`: awaitable, for the browser's event loop. The kernels that
    /// read no weights are compiled now; weight kernels when a weight of the type loads.
    pub async fn open(opts: WebGpuOptions) -> Result<Self, WebGpuError> {
        let ctx = Context::open(opts.device, opts.no_f16).await?;
        let rec = Arc::new(Mutex::new(Recorder::new(&ctx.device, &ctx.limits)));
        let dummy = new_buffer(&ctx.device, &rec, "dummy", 16, wgpu::BufferUsages::STORAGE);
        let window_usage = wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST;
        let window = new_buffer(
            &ctx.device,
            &rec,
            "activation window",
            X_WINDOW_BYTES as u64,
            window_usage,
        );
        let dev = WebGpu {
            ctx,
            pipes: Mutex::default(),
            rec,
            dummy,
            window,
            staging: StagingPool::default(),
        };
        for k in kernels::all_variants() {
            if !k.reads_weights() {
                dev.pipe(k)?;
            }
        }
        Ok(GpuBackend::over(dev, &opts))
    }

    /// The adapter in use.
    pub fn adapter(&self) -> &AdapterReport {
        &self.layer().ctx.adapter
    }

    /// The device (for error scopes and its uncaptured-error handler: the browser reports an
    /// out-of-memory upload there, not as a return value).
    pub fn device(&self) -> &wgpu::Device {
        &self.layer().ctx.device
    }

    /// Submissions, readbacks, dispatches and bind groups created so far.
    pub fn counters(&self) -> Counters {
        self.layer().recorder().counters
    }

    /// Bind groups kept for reuse (those of dropped buffers leave with them).
    pub fn cached_bind_groups(&self) -> usize {
        self.layer().recorder().cached_bind_groups()
    }

    /// Submit the recorded work without waiting for it.
    pub fn flush(&self) {
        self.layer().flush();
    }
}

impl WebGpu {
    fn recorder(&self) -> MutexGuard<'_, Recorder> {
        lock(&self.rec)
    }

    fn flush(&self) {
        self.recorder().submit(&self.ctx.queue);
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

    fn buffer(&self, label: &str, bytes: u64, usage: wgpu::BufferUsages) -> WgpuBuf {
        new_buffer(&self.ctx.device, &self.rec, label, bytes, usage)
    }
}

/// A buffer of `bytes` (rounded up to whole words, at least 16) whose cached bind groups leave
/// `rec`'s cache with it.
fn new_buffer(
    device: &wgpu::Device,
    rec: &Arc<Mutex<Recorder>>,
    label: &str,
    bytes: u64,
    usage: wgpu::BufferUsages,
) -> WgpuBuf {
    WgpuBuf {
        buf: device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: bytes.max(16).div_ceil(4) * 4,
            usage,
            mapped_at_creation: false,
        }),
        cache: Arc::downgrade(rec),
    }
}

impl Device for WebGpu {
    type Buf = WgpuBuf;
    type Image = WgpuImage;

    const NAME: &'static str = "webgpu";

    fn caps(&self) -> Caps {
        let features = self.ctx.device.features();
        let limits = &self.ctx.limits;
        let max_storage = limits.max_storage_buffer_binding_size;
        Caps {
            cpu: self.ctx.adapter.device_type == "Cpu",
            subgroups: features
                .contains(wgpu::Features::SUBGROUP)
                .then_some(self.ctx.subgroup_sizes),
            f16: features.contains(wgpu::Features::SHADER_F16),
            integer_dot: false,
            cooperative_matrix: None,
            max_storage,
            max_binding: max_storage.min(limits.max_buffer_size),
            max_image_rows: u64::from(limits.max_texture_dimension_2d),
        }
    }

    fn alloc(&self, op: &'static str, bytes: u64) -> Result<WgpuBuf, BackendError> {
        // wgpu zeroes new buffers.
        let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
        Ok(self.buffer(op, bytes, usage))
    }

    fn upload(&self, op: &'static str, data: &[u8]) -> Result<WgpuBuf, BackendError> {
        let size = (data.len() as u64).max(16).div_ceil(4) * 4;
        let buf = self.ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(op),
            size,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: true,
        });
        buf.slice(..)
            .get_mapped_range_mut()
            .map_err(|e| device(op, e.to_string()))?
            .slice(..data.len())
            .copy_from_slice(data);
        buf.unmap();
        Ok(WgpuBuf {
            buf,
            cache: Arc::downgrade(&self.rec),
        })
    }

    fn size(buf: &WgpuBuf) -> u64 {
        buf.buf.size()
    }

    fn weight_buffer(&self, name: &str, bytes: u64) -> Result<WgpuBuf, BackendError> {
        Ok(self.buffer(name, bytes, wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST))
    }

    fn write_weight(&self, buf: &WgpuBuf, offset: u64, data: &[u8]) -> Result<(), BackendError> {
        self.ctx.queue.write_buffer(&buf.buf, offset, data);
        Ok(())
    }

    fn weight_image(&self, name: &str, rows: u64) -> Result<WgpuImage, BackendError> {
        let tex = self.ctx.device.create_texture(&wgpu::TextureDescriptor {
            label: Some(name),
            size: wgpu::Extent3d {
                width: (TEX_ROW_BYTES / 16) as u32,
                height: rows as u32,
                depth_or_array_layers: 1,
            },
            mip_level_count: 1,
            sample_count: 1,
            dimension: wgpu::TextureDimension::D2,
            format: wgpu::TextureFormat::Rgba32Uint,
            usage: wgpu::TextureUsages::TEXTURE_BINDING | wgpu::TextureUsages::COPY_DST,
            view_formats: &[],
        });
        let view = tex.create_view(&wgpu::TextureViewDescriptor::default());
        Ok(WgpuImage {
            tex,
            view,
            cache: Arc::downgrade(&self.rec),
        })
    }

    fn write_image(&self, image: &WgpuImage, row0: u64, data: &[u8]) -> Result<(), BackendError> {
        let row = TEX_ROW_BYTES as usize;
        self.ctx.queue.write_texture(
            wgpu::TexelCopyTextureInfo {
                texture: &image.tex,
                mip_level: 0,
                origin: wgpu::Origin3d {
                    x: 0,
                    y: row0 as u32,
                    z: 0,
                },
                aspect: wgpu::TextureAspect::All,
            },
            data,
            wgpu::TexelCopyBufferLayout {
                offset: 0,
                bytes_per_row: Some(row as u32),
                rows_per_image: None,
            },
            wgpu::Extent3d {
                width: (row / 16) as u32,
                height: (data.len() / row) as u32,
                depth_or_array_layers: 1,
            },
        );
        Ok(())
    }

    fn part_written(&self) -> Result<(), BackendError> {
        // Natively, queued writes hold staging memory until a submission: one per part keeps a
        // large model's load from holding all of it at once.
        self.ctx.queue.submit([]);
        Ok(())
    }

    fn prepare(&self, op: &'static str, kernels: &[Kernel]) -> Result<(), BackendError> {
        for &k in kernels {
            self.pipe(k).map_err(|e| device(op, e.to_string()))?;
        }
        Ok(())
    }

    fn record(&self, op: &'static str, d: &Dispatch, binds: &[(u32, Bind<'_, Self>)]) -> Result<(), BackendError> {
        let pipe = self.pipe(d.kernel).map_err(|e| device(op, e.to_string()))?;
        let mut rec = self.recorder();
        let extra_len = d.extra.as_ref().map_or(0, |(_, data)| data.len());
        let need = d.params.len() + extra_len + 512;
        if !rec.fits(need) {
            rec.submit(&self.ctx.queue);
        }
        if !rec.fits(need) {
            return Err(shape(op, format!("{extra_len} bytes of parameters exceed the arena")));
        }
        let arena = |offset, size: usize| recorder::Bind::Arena {
            offset,
            size: size as u64,
        };
        let mut all = vec![(0, arena(rec.push(&d.params), d.params.len()))];
        if let Some((b, data)) = &d.extra {
            all.push((*b, arena(rec.push(data), data.len())));
        }
        all.extend(binds.iter().map(|&(i, b)| (i, recorder::Bind::Device(b))));
        rec.dispatch(&self.ctx.device, &pipe.pipeline, &pipe.layout, &all, d.groups);
        Ok(())
    }

    fn copy(
        &self,
        _op: &'static str,
        src: (&WgpuBuf, u64),
        dst: (&WgpuBuf, u64),
        bytes: u64,
    ) -> Result<(), BackendError> {
        let mut rec = self.recorder();
        rec.encoder(&self.ctx.device)
            .copy_buffer_to_buffer(&src.0.buf, src.1, &dst.0.buf, dst.1, bytes);
        Ok(())
    }

    fn write(&self, dst: &WgpuBuf, data: &[u8]) -> Result<(), BackendError> {
        // Work recorded before the write must see the old contents: submit it first.
        self.flush();
        self.ctx.queue.write_buffer(&dst.buf, 0, data);
        Ok(())
    }

    /// Copy the bytes into a staging buffer after all recorded work, submit, and start
    /// mapping it: one submission, one readback.
    fn read(&self, op: &'static str, src: &WgpuBuf, bytes: u64) -> Result<Readback<Vec<u8>>, BackendError> {
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
                .copy_buffer_to_buffer(&src.buf, 0, &staging, 0, size);
            rec.submit(&self.ctx.queue);
            rec.counters.readbacks += 1;
        }
        let read = MappedRead::start(op, staging, size, bytes as usize, &self.ctx.device, &self.staging);
        Ok(Readback::pending(read))
    }

    fn dummy(&self) -> &WgpuBuf {
        &self.dummy
    }

    fn window(&self) -> &WgpuBuf {
        &self.window
    }
}
