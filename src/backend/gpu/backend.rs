//! [`GpuBackend`]: the [`Backend`] of every GPU, written once over a device layer
//! ([`Device`]: wgpu or Vulkan). The ops' plans, argument checks and kernels are this layer's;
//! a device layer only allocates, records and reads back.
//!
//! Every kernel path is chosen here, once, from the device's [`Caps`] and the
//! [`GpuOptions`] ([`GpuBackend::new`]), and per matmul from the weight's placement:
//! - weights in textures ([`MatmulVariant::Texture`], CPU devices): matmul_tex, the
//!   activation rows passing through a uniform window in tiles;
//! - Q8_0 weights in buffers on a device with integer dot products: matmul_dot over packed
//!   Q8_0 activations;
//! - more than [`MATMUL_ROWS`] rows over buffer-held weights on a device with cooperative
//!   matrices: matmul_coop;
//! - else the workgroup or per-row kernels of the [`Strategy`].
//!
//! A matmul's activations are first rounded as the CPU backend rounds them for the weight
//! format (quantize_act), so the backends multiply the same values. Work is recorded into one
//! pass per forward pass and submitted when a result must come back.

use std::sync::{Arc, Mutex};

use super::buffers::{GpuBuffer, GpuKv, GpuWeight, Store};
use super::device::{Bind, Caps, Device};
use super::kernels;
use super::options::GpuOptions;
use super::placing::WeightWriter;
use super::plan::{self, AttnPlan, MatShape};
use crate::backend::attn::SeqAttn;
use crate::backend::checks::{self, shape, weight_matrix};
use crate::backend::error::BackendError;
use crate::backend::gpu::dispatch::Dispatch;
use crate::backend::gpu::kernels::Kernel;
use crate::backend::gpu::sizes::{KV_CHUNK, MATMUL_ROWS, X_WINDOW_BYTES};
use crate::backend::gpu::strategy::{MatmulVariant, Strategy};
use crate::backend::interface::Backend;
use crate::backend::kv::KvType;
use crate::backend::moe::{MatId, Route, Strided};
use crate::backend::readback::MaybeSend;
use crate::backend::readback::Readback;
use crate::backend::recurrent::{self, MAX_CONV_KERNEL};
use crate::backend::recurrent::{Conv, DeltaNet, Form, SeqRows};
use crate::backend::rope::Rope;
use crate::backend::sync::lock;
use crate::gguf::{GgufFile, TensorInfo, TensorView};
use crate::quant::GgmlType;
use crate::sample::Candidates;

/// The GPU backend over device layer `D`. Clones share the device, its pipelines and the pass
/// being recorded (several models on one device).
pub struct GpuBackend<D: Device> {
    inner: Arc<Shared<D>>,
}

impl<D: Device> Clone for GpuBackend<D> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

/// The kernel paths this device takes, chosen once ([`GpuBackend::new`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Paths {
    /// Which kernel variants run.
    pub strategy: Strategy,
    /// Whether matmuls round their activations as the CPU does first.
    pub round_activations: bool,
    /// Whether Q8_0 matrices in buffers multiply with packed integer dot products.
    pub integer_dot: bool,
    /// The cooperative matrices' size for batches of rows over buffer-held weights, if used.
    pub cooperative_matrix: Option<u8>,
    /// Largest weight part in bytes.
    pub max_binding: u64,
}

impl Paths {
    /// The paths for a device with `caps`, as `opts` pin them.
    pub fn choose(caps: &Caps, opts: &GpuOptions) -> Self {
        let matmul = opts.matmul.unwrap_or(if caps.cpu {
            MatmulVariant::Texture
        } else {
            MatmulVariant::Workgroup
        });
        let subgroups = caps.subgroups.filter(|_| !opts.no_subgroups);
        let strategy = Strategy {
            matmul,
            // matmul_tex.wgsl shares loads across subgroups of 8 to 64 lanes.
            tex_subgroups: subgroups.is_some_and(|(min, max)| min >= 8 && max <= 64),
            reduce_subgroups: subgroups.is_some(),
            f16_matmul: opts.f16_matmul.unwrap_or(true) && caps.f16,
            kv_chunk: opts.kv_chunk.or((!caps.cpu).then_some(KV_CHUNK)),
            split_any_rows: opts.kv_chunk.is_some(),
            max_storage: caps.max_storage,
        };
        let round_activations = opts.round_activations.unwrap_or(true);
        let cooperative_matrix = match opts.cooperative_matrix {
            Some(false) => None,
            Some(true) => caps.cooperative_matrix,
            None => caps.cooperative_matrix.filter(|_| matmul == MatmulVariant::Workgroup),
        };
        Self {
            strategy,
            round_activations,
            // The integer path quantizes activations to Q8_0 blocks: the rounding, always.
            integer_dot: opts.integer_dot != Some(false) && caps.integer_dot && round_activations,
            cooperative_matrix,
            max_binding: opts
                .max_binding
                .map_or(caps.max_binding, |m| m.min(caps.max_binding))
                .max(4),
        }
    }
}

/// Locks are taken in the order scratch slot, then the device layer's own.
struct Shared<D: Device> {
    dev: D,
    paths: Paths,
    /// Texture rows per image (texture parts hold at most this many).
    max_image_rows: u64,
    /// A matmul's activations rounded for its weight format (or packed for integer dot
    /// products), `[rows, n_in]`, reused by every matmul; held while a matmul records.
    activations: Mutex<Option<D::Buf>>,
    /// Argmax ids `[rows]`, reused.
    argmax: Mutex<Option<D::Buf>>,
    /// Top-k candidates `[rows, per_row]`, reused.
    select: Mutex<Option<D::Buf>>,
    /// Split attention's partial results, grown on demand.
    partials: Mutex<Option<D::Buf>>,
}

impl<D: Device> std::fmt::Debug for GpuBackend<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuBackend")
            .field("device", &self.inner.dev)
            .field("paths", &self.inner.paths)
            .finish()
    }
}

impl<D: Device> GpuBackend<D> {
    /// The backend over `dev`, its kernel paths chosen from the device's caps and `opts`.
    pub fn over(dev: D, opts: &GpuOptions) -> Self {
        let caps = dev.caps();
        Self {
            inner: Arc::new(Shared {
                paths: Paths::choose(&caps, opts),
                max_image_rows: caps.max_image_rows,
                dev,
                activations: Mutex::default(),
                argmax: Mutex::default(),
                select: Mutex::default(),
                partials: Mutex::default(),
            }),
        }
    }

    /// The device layer.
    pub fn layer(&self) -> &D {
        &self.inner.dev
    }

    /// The kernel paths in use.
    pub fn paths(&self) -> Paths {
        self.inner.paths
    }

    /// The cooperative matrices' size for weights of type `ty`, if batches of rows over them
    /// take that path: not F32 ones (routers, whose experts can lie within 2e-4 of each other,
    /// and other matrices a model keeps in f32 keep f32 arithmetic; no kernel is built for them).
    fn coop_size(&self, ty: GgmlType) -> Option<u8> {
        self.inner.paths.cooperative_matrix.filter(|_| ty != GgmlType::F32)
    }

    /// Record `d` with storage buffers `binds` (an array: a dispatch allocates nothing here).
    fn record<const N: usize>(
        &self,
        op: &'static str,
        d: &Dispatch,
        binds: [(u32, &D::Buf); N],
    ) -> Result<(), BackendError> {
        self.layer().record(op, d, &binds.map(|(i, b)| (i, Bind::Buffer(b))))
    }

    /// `slot`'s buffer if it holds at least `bytes`, else a new one of twice that.
    fn grown<'a>(
        &self,
        op: &'static str,
        slot: &'a mut Option<D::Buf>,
        bytes: u64,
    ) -> Result<&'a D::Buf, BackendError> {
        if slot.as_ref().is_none_or(|b| D::size(b) < bytes) {
            // The old buffer goes first: a device may keep it until recorded work is done.
            *slot = None;
            *slot = Some(self.layer().alloc(op, (2 * bytes).max(64))?);
        }
        Ok(slot.as_ref().expect("just set"))
    }

    /// Record `d` reading `x` (binding 1) into the result buffer kept in `slot` (binding
    /// `out`) and read its first `bytes` back: the pass's one submission.
    fn run_and_read(
        &self,
        op: &'static str,
        d: &Dispatch,
        slot: &Mutex<Option<D::Buf>>,
        (x, out): (&D::Buf, u32),
        bytes: u64,
    ) -> Result<Readback<Vec<u8>>, BackendError> {
        let mut slot = lock(slot);
        let buf = self.grown(op, &mut slot, bytes)?;
        self.record(op, d, [(1, x), (out, buf)])?;
        self.layer().read(op, buf, bytes)
    }

    /// Run `f` with the activations a matmul over weights of type `ty` multiplies: the first
    /// `len` values of `x` rounded as the CPU rounds them for that format (in the shared
    /// scratch buffer, locked meanwhile), or `x` itself (f32 weights, or rounding off).
    fn with_matmul_input<R>(
        &self,
        ty: GgmlType,
        x: &GpuBuffer<D>,
        len: usize,
        f: impl FnOnce(&D::Buf) -> Result<R, BackendError>,
    ) -> Result<R, BackendError> {
        let d = match self.inner.paths.round_activations {
            true => plan::quantize_act(ty, len)?,
            false => None,
        };
        let Some(d) = d else { return f(&x.buf) };
        let mut slot = lock(&self.inner.activations);
        let buf = self.grown("quantize_act", &mut slot, (len * 4) as u64)?;
        self.record("quantize_act", &d, [(1, &x.buf), (2, buf)])?;
        f(buf)
    }

    /// [`Backend::matmul`] over image parts (matmul_tex): the activation rows pass through the
    /// uniform window in tiles of up to 8 rows (fewer when rows are long), each copied there,
    /// then met by every part. Shapes are checked by the caller.
    fn matmul_tex(
        &self,
        w: &GpuWeight<D>,
        m: MatShape,
        x: &D::Buf,
        rows: usize,
        out: &D::Buf,
    ) -> Result<(), BackendError> {
        let window = self.layer().window();
        for (r0, n) in plan::tex_tiles(w.n_in, rows) {
            let bytes = (n * w.n_in * 4) as u64;
            self.layer()
                .copy("matmul", (x, (r0 * w.n_in * 4) as u64), (window, 0), bytes)?;
            for (part, store) in &w.parts {
                let Store::Image(img) = store else {
                    return Err(shape("matmul", format!("'{}' mixes buffer and image parts", w.name)));
                };
                let d = plan::matmul_tex(&self.inner.paths.strategy, m, *part, r0, n, w.stride)?;
                let binds = [
                    (1, Bind::Image(img)),
                    (2, Bind::Uniform(window, X_WINDOW_BYTES as u64)),
                    (3, Bind::Buffer(out)),
                ];
                self.layer().record("matmul", &d, &binds)?;
            }
        }
        Ok(())
    }

    /// [`Backend::matmul`] of Q8_0 buffer parts with integer dot products: the activations
    /// quantized to packed Q8_0 blocks (in the shared scratch buffer), then matmul_dot.
    fn matmul_dot(
        &self,
        w: &GpuWeight<D>,
        m: MatShape,
        x: &GpuBuffer<D>,
        rows: usize,
        out: &GpuBuffer<D>,
    ) -> Result<(), BackendError> {
        let len = rows * w.n_in;
        let q = plan::quantize_q8_packed(len)?;
        let mut slot = lock(&self.inner.activations);
        let packed = self.grown("quantize_act", &mut slot, (plan::packed_q8_words(len) * 4) as u64)?;
        self.record("quantize_act", &q, [(1, &x.buf), (2, packed)])?;
        for (part, store) in &w.parts {
            let d = plan::matmul_dot(m, *part, rows, w.row_bytes)?;
            self.record(
                "matmul",
                &d,
                [(1, w.buffer("matmul", store)?), (2, packed), (3, &out.buf)],
            )?;
        }
        Ok(())
    }

    /// One sequence's attention (rows from `s.row0` of the batch).
    fn attend(
        &self,
        q: &D::Buf,
        s: &SeqAttn<'_, GpuKv<D>>,
        sinks: Option<&D::Buf>,
        out: &D::Buf,
    ) -> Result<(), BackendError> {
        let (k, v) = (s.k_cache, s.v_cache);
        let scales = (k.scales, v.scales);
        let strategy = &self.inner.paths.strategy;
        let Some(p) = plan::attention(strategy, &s.p, s.row0, sinks.is_some(), k.ty, scales)? else {
            return Ok(());
        };
        let (kc, vc) = (&k.buf.buf, &v.buf.buf);
        let sinks = sinks.unwrap_or(self.layer().dummy());
        match p {
            AttnPlan::Whole(d) => self.record("attention", &d, [(1, q), (2, kc), (3, vc), (4, out), (6, sinks)]),
            AttnPlan::Split {
                stats,
                weigh,
                merge,
                partial_floats,
            } => {
                let mut slot = lock(&self.inner.partials);
                let part = self.grown("attention", &mut slot, partial_floats as u64 * 4)?;
                self.record("attention", &stats, [(1, q), (2, kc), (5, part)])?;
                self.record("attention", &weigh, [(1, q), (2, kc), (3, vc), (5, part), (6, sinks)])?;
                self.record("attention", &merge, [(4, out), (5, part)])
            }
        }
    }

    /// The pipelines a weight of type `ty` with rows of `n_in` values needs.
    fn weight_kernels(&self, ty: GgmlType, n_in: usize, stacked: bool, textured: bool) -> Vec<Kernel> {
        let st = &self.inner.paths.strategy;
        let mut ks = if stacked {
            vec![Kernel::MatmulId(ty)]
        } else if textured {
            let mut ks: Vec<Kernel> = kernels::TEX_TILES
                .iter()
                .map(|&r| st.matmul_tex_kernel(ty, r as usize))
                .collect();
            ks.push(Kernel::EmbedTex(ty));
            ks
        } else if self.inner.paths.integer_dot && ty == GgmlType::Q8_0 {
            vec![Kernel::MatmulDot(ty), Kernel::Embed(ty)]
        } else {
            vec![st.matmul_kernel(ty, n_in), Kernel::Embed(ty)]
        };
        if let Some(size) = self.coop_size(ty).filter(|_| !stacked && !textured) {
            ks.push(Kernel::MatmulCoop { ty, size });
        }
        // What multiplying by these weights needs besides: the activations rounded to the
        // weights' blocks (or packed for integer dot products), and a router's kernels where
        // experts are stacked.
        ks.push(Kernel::QuantizeAct);
        if ks.contains(&Kernel::MatmulDot(ty)) {
            ks.push(Kernel::QuantizeQ8Packed);
        }
        if stacked {
            ks.extend([Kernel::Route, Kernel::MoeCombine]);
        }
        ks
    }

    /// A weight of `info` (`n_in` values per row, `n_out` rows) with nothing placed yet.
    fn skeleton(info: &TensorInfo, n_in: usize, n_out: usize) -> GpuWeight<D> {
        let ty = info.ty;
        GpuWeight {
            name: info.name.clone(),
            ty,
            n_in,
            n_out,
            mats: checks::stacked_matrices(info),
            row_bytes: n_in / ty.block_size() * ty.block_bytes(),
            stride: super::texlayout::stride(ty, n_in),
            parts: Vec::new(),
            dense: None,
            short_rows: None,
        }
    }

    /// A writer that places matrix `info` a piece of rows at a time as they arrive
    /// ([`WeightWriter`]), or `None` for a tensor that must be placed whole
    /// ([`Backend::place_weight`]: vectors and conv kernels, which are converted to f32).
    pub fn weight_writer(&self, info: &TensorInfo) -> Result<Option<WeightWriter<D>>, BackendError> {
        let name = info.name.as_str();
        let bytes = usize::try_from(info.bytes).map_err(|_| BackendError::BadTensor {
            tensor: name.to_string(),
            problem: format!("{} bytes do not fit this machine's memory", info.bytes),
        })?;
        let (n_in, n_out) = weight_matrix(name, info, bytes, kernels::supports, D::NAME)?;
        if !checks::placeable_in_pieces(info) {
            return Ok(None);
        }
        self.weight_writer_for(Self::skeleton(info, n_in, n_out)).map(Some)
    }

    /// A writer for matrix `w` (a skeleton, its shape checked), its parts made and its
    /// kernels prepared.
    fn weight_writer_for(&self, mut w: GpuWeight<D>) -> Result<WeightWriter<D>, BackendError> {
        let (ty, n_in, n_out) = (w.ty, w.n_in, w.n_out);
        // The codebook formats' buffers begin with their grid table (grids.rs).
        let table = super::grids::leading_table(ty);
        // Stacks (experts, MLA's per-head matrices) are read by matmul_id, from buffers, and so
        // are the formats with a table.
        let textured = w.mats == 1 && kernels::in_textures(ty) && self.inner.paths.strategy.textured(n_in);
        // Parts hold at most `max_binding` bytes of blocks (the option splits image parts as
        // it splits buffers); an image part also at most as many rows as the device's images.
        let image = textured.then_some((
            crate::backend::gpu::sizes::TEX_ROW_BYTES * self.inner.max_image_rows,
            w.stride,
        ));
        let rows_per_part = crate::backend::gpu::strategy::rows_per_part(
            &w.name,
            w.row_bytes,
            n_out,
            self.inner.paths.max_binding.saturating_sub(table.len() as u64),
            image,
        )?;
        self.layer()
            .prepare("load_weight", &self.weight_kernels(ty, n_in, w.mats > 1, textured))?;
        let mut row0 = 0;
        while row0 < n_out {
            let rows = rows_per_part.min(n_out - row0);
            let store = if textured {
                let bytes = (rows * w.stride) as u64;
                Store::Image(self.layer().weight_image(
                    &w.name,
                    bytes.div_ceil(crate::backend::gpu::sizes::TEX_ROW_BYTES).max(1),
                )?)
            } else {
                let buf = self
                    .layer()
                    .weight_buffer(&w.name, (table.len() + rows * w.row_bytes) as u64)?;
                if !table.is_empty() {
                    self.layer().write_weight(&buf, 0, table)?;
                }
                Store::Buffer(buf)
            };
            w.parts.push((plan::PartRows { row0, rows }, store));
            row0 += rows;
        }
        Ok(WeightWriter::new(w, textured, table.len()))
    }
}

impl<D: Device> GpuBackend<D> {
    /// `x[i] = f(x[i], y[i])` for the first `len` values (add, swiglu, geglu, sigmoid_mul);
    /// `y` is named `name` in errors.
    fn binary(
        &self,
        (op, kernel): (&'static str, Kernel),
        x: &GpuBuffer<D>,
        (name, y): (&'static str, &GpuBuffer<D>),
        len: usize,
    ) -> Result<(), BackendError> {
        checks::elementwise(op, x.len, Some((name, y.len)), len)?;
        if let Some(d) = plan::elementwise(op, kernel, len, 1, 0.0)? {
            self.record(op, &d, [(1, &x.buf), (2, &y.buf)])?;
        }
        Ok(())
    }
}

impl<D: Device> Backend for GpuBackend<D> {
    type Buffer = GpuBuffer<D>;
    type Kv = GpuKv<D>;
    type Weight = GpuWeight<D>;

    fn run_pass<R: MaybeSend>(&self, f: impl FnOnce() -> R + MaybeSend) -> R {
        f()
    }

    fn name(&self) -> &'static str {
        D::NAME
    }

    fn load_weight(&self, file: &Arc<GgufFile>, name: &str) -> Result<GpuWeight<D>, BackendError> {
        self.place_weight(file.tensor(name)?)
    }

    fn place_weight(&self, view: TensorView<'_>) -> Result<GpuWeight<D>, BackendError> {
        let info = view.info;
        let name = info.name.as_str();
        let (n_in, n_out) = weight_matrix(name, info, view.data.len(), kernels::supports, D::NAME)?;
        let mut w = Self::skeleton(info, n_in, n_out);
        if checks::is_vector(info) {
            let v = view.to_f32()?;
            w.dense = Some(self.layer().upload("load_weight", bytemuck::cast_slice(&v))?);
            return Ok(w);
        }
        // A conv kernel (`[kernel, channels]`) is read as plain values by ssm_conv.wgsl. Rows
        // that short belong to no real matmul weight, so the f32 copy costs little; it is kept
        // beside the matrix, which still multiplies.
        let short_bytes = (n_in * n_out) as u64 * 4;
        if n_in <= MAX_CONV_KERNEL && short_bytes <= self.inner.paths.max_binding {
            let v = view.to_f32()?;
            w.short_rows = Some(self.layer().upload("load_weight", bytemuck::cast_slice(&v))?);
        }
        let mut writer = self.weight_writer_for(w)?;
        writer.rows(self.layer(), 0, view.data)?;
        writer.finish()
    }

    fn alloc(&self, len: usize) -> Result<GpuBuffer<D>, BackendError> {
        let bytes = len as u64 * 4;
        let max = self.inner.paths.strategy.max_storage;
        if bytes > max {
            return Err(shape(
                "alloc",
                format!("{len} values exceed the device's largest storage binding ({max} bytes)"),
            ));
        }
        Ok(GpuBuffer {
            buf: self.layer().alloc("alloc", bytes)?,
            len,
        })
    }

    fn alloc_kv(&self, len: usize, ty: KvType) -> Result<GpuKv<D>, BackendError> {
        checks::alloc_kv(len, ty)?;
        // The first cache of this format: its store and attention pipelines, made together.
        self.layer().prepare("alloc_kv", &kernels::kv_kernels(ty))?;
        let (words, scales) = plan::kv_words(len, ty);
        Ok(GpuKv {
            buf: self.alloc(words)?,
            len,
            ty,
            scales,
        })
    }

    fn write(&self, dst: &mut GpuBuffer<D>, src: &[f32]) -> Result<(), BackendError> {
        checks::need("write", "destination", dst.len, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        self.layer().write(&dst.buf, bytemuck::cast_slice(src))
    }

    fn read(&self, src: &GpuBuffer<D>, len: usize) -> Result<Readback<Vec<f32>>, BackendError> {
        checks::need("read", "source", src.len, len)?;
        if len == 0 {
            return Ok(Readback::ready(Vec::new()));
        }
        Ok(self
            .layer()
            .read("read", &src.buf, len as u64 * 4)?
            .map(|bytes| bytemuck::pod_collect_to_vec(&bytes)))
    }

    fn embed(
        &self,
        table: &GpuWeight<D>,
        tokens: &[u32],
        scale: f32,
        out: &mut GpuBuffer<D>,
    ) -> Result<(), BackendError> {
        table.matrix("embed")?;
        checks::embed(out.len, tokens, table.n_in, table.n_out)?;
        if tokens.is_empty() {
            return Ok(());
        }
        for (rows, store) in &table.parts {
            let (kernel, row_bytes, weights) = match store {
                Store::Buffer(b) => (Kernel::Embed(table.ty), table.row_bytes, Bind::Buffer(b)),
                Store::Image(i) => (Kernel::EmbedTex(table.ty), table.stride, Bind::Image(i)),
            };
            let d = plan::embed(kernel, table.n_in, row_bytes, tokens, *rows, scale)?;
            self.layer()
                .record("embed", &d, &[(1, weights), (3, Bind::Buffer(&out.buf))])?;
        }
        Ok(())
    }

    fn matmul(
        &self,
        w: &GpuWeight<D>,
        x: &GpuBuffer<D>,
        rows: usize,
        out: &mut GpuBuffer<D>,
    ) -> Result<(), BackendError> {
        let m = w.matrix("matmul")?;
        checks::matmul(x.len, out.len, rows, w.n_in, w.n_out)?;
        if rows == 0 {
            return Ok(());
        }
        let in_buffers = w.in_buffers();
        let coop = self.coop_size(w.ty).filter(|_| in_buffers && rows > MATMUL_ROWS);
        if coop.is_none() && self.inner.paths.integer_dot && w.ty == GgmlType::Q8_0 && in_buffers {
            return self.matmul_dot(w, m, x, rows, out);
        }
        self.with_matmul_input(w.ty, x, rows * w.n_in, |x| {
            if !in_buffers {
                return self.matmul_tex(w, m, x, rows, &out.buf);
            }
            for (part, store) in &w.parts {
                let d = match coop {
                    Some(size) => plan::matmul_coop(m, *part, rows, w.row_bytes, size)?,
                    None => plan::matmul(&self.inner.paths.strategy, m, *part, rows, w.row_bytes)?,
                };
                self.record("matmul", &d, [(1, w.buffer("matmul", store)?), (2, x), (3, &out.buf)])?;
            }
            Ok(())
        })
    }

    fn add_bias(&self, x: &mut Self::Buffer, bias: &Self::Weight, rows: usize) -> Result<(), BackendError> {
        let (b, n) = (bias.dense("add_bias")?, bias.n_in);
        let len = rows * n;
        checks::elementwise("add_bias", x.len, None, len)?;
        if let Some(d) = plan::elementwise("add_bias", Kernel::AddBias, len, n, 0.0)? {
            self.record("add_bias", &d, [(1, &x.buf), (2, b)])?;
        }
        Ok(())
    }

    fn add(&self, x: &mut Self::Buffer, y: &Self::Buffer, len: usize) -> Result<(), BackendError> {
        self.binary(("add", Kernel::Add), x, ("y", y), len)
    }

    fn scale(&self, x: &mut Self::Buffer, len: usize, s: f32) -> Result<(), BackendError> {
        checks::elementwise("scale", x.len, None, len)?;
        if let Some(d) = plan::elementwise("scale", Kernel::Scale, len, 1, s)? {
            self.record("scale", &d, [(1, &x.buf)])?;
        }
        Ok(())
    }

    fn hadamard(&self, x: &mut Self::Buffer, groups: usize, n: usize) -> Result<(), BackendError> {
        crate::backend::rotation::check(x.len, groups, n)?;
        if let Some(d) = plan::hadamard(groups, n)? {
            self.record("hadamard", &d, [(1, &x.buf)])?;
        }
        Ok(())
    }

    fn rmsnorm(
        &self,
        x: &Self::Buffer,
        w: &Self::Weight,
        groups: usize,
        eps: f32,
        out: &mut Self::Buffer,
    ) -> Result<(), BackendError> {
        let wb = w.dense("rmsnorm")?;
        checks::norm(Some(x.len), out.len, groups, w.n_in)?;
        if let Some(d) = plan::norm(Kernel::RmsNorm, w.n_in, groups, eps)? {
            self.record("rmsnorm", &d, [(1, &x.buf), (2, wb), (3, &out.buf)])?;
        }
        Ok(())
    }

    fn rmsnorm_inplace(
        &self,
        x: &mut Self::Buffer,
        w: &Self::Weight,
        groups: usize,
        eps: f32,
    ) -> Result<(), BackendError> {
        let wb = w.dense("rmsnorm")?;
        checks::norm(None, x.len, groups, w.n_in)?;
        if let Some(d) = plan::norm(Kernel::RmsNormInplace, w.n_in, groups, eps)? {
            self.record("rmsnorm", &d, [(2, wb), (4, &x.buf)])?;
        }
        Ok(())
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
        let f = factors.map(|w| w.dense("rope")).transpose()?;
        checks::rope(x.len, n_head, head_dim, positions, rope, factors.map(|w| w.n_in))?;
        if let Some(d) = plan::rope(n_head, head_dim, positions, rope, f.is_some())? {
            self.record("rope", &d, [(1, &x.buf), (2, f.unwrap_or(self.layer().dummy()))])?;
        }
        Ok(())
    }

    fn kv_store(
        &self,
        cache: &mut Self::Kv,
        src: &Self::Buffer,
        row0: usize,
        width: usize,
        positions: &[u32],
    ) -> Result<(), BackendError> {
        checks::kv_store((cache.len, cache.ty), src.len, row0, width, positions)?;
        if let Some(d) = plan::kv_store(row0, width, positions, cache.ty, cache.scales)? {
            self.record("kv_store", &d, [(1, &src.buf), (3, &cache.buf.buf)])?;
        }
        Ok(())
    }

    fn attention(
        &self,
        q: &GpuBuffer<D>,
        seqs: &[SeqAttn<'_, GpuKv<D>>],
        sinks: Option<&GpuWeight<D>>,
        out: &mut GpuBuffer<D>,
    ) -> Result<(), BackendError> {
        let sinks_buf = sinks.map(|w| w.dense("attention")).transpose()?;
        checks::attention(
            q.len,
            out.len,
            seqs,
            |c: &GpuKv<D>| (c.len, c.ty),
            sinks.map(|w| w.n_in),
        )?;
        for s in seqs {
            self.attend(&q.buf, s, sinks_buf, &out.buf)?;
        }
        Ok(())
    }

    fn swiglu(&self, gate: &mut Self::Buffer, up: &Self::Buffer, len: usize) -> Result<(), BackendError> {
        self.binary(("swiglu", Kernel::Swiglu), gate, ("up", up), len)
    }

    fn geglu(&self, gate: &mut Self::Buffer, up: &Self::Buffer, len: usize) -> Result<(), BackendError> {
        self.binary(("geglu", Kernel::Geglu), gate, ("up", up), len)
    }

    fn sigmoid_mul(&self, x: &mut Self::Buffer, gate: &Self::Buffer, len: usize) -> Result<(), BackendError> {
        self.binary(("sigmoid_mul", Kernel::SigmoidMul), x, ("gate", gate), len)
    }

    fn swiglu_oai(
        &self,
        gate: &mut Self::Buffer,
        up: &Self::Buffer,
        len: usize,
        alpha: f32,
        limit: f32,
    ) -> Result<(), BackendError> {
        checks::elementwise("swiglu_oai", gate.len, Some(("up", up.len)), len)?;
        if let Some(d) = plan::moe_elementwise("swiglu_oai", Kernel::SwigluOai, len, 1, 0, alpha, limit)? {
            self.record("swiglu_oai", &d, [(1, &gate.buf), (2, &up.buf)])?;
        }
        Ok(())
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
        let b = bias.map(|w| w.dense("route_experts")).transpose()?;
        let bias_len = bias.map(|w| w.n_in * w.n_out);
        route.check_call(rows, logits.len, bias_len, ids.len, weights.len)?;
        if let Some(d) = plan::route(rows, route, b.is_some())? {
            let b = b.unwrap_or(self.layer().dummy());
            let binds = [(1, &logits.buf), (2, b), (3, &ids.buf), (4, &weights.buf)];
            self.record("route_experts", &d, binds)?;
        }
        Ok(())
    }

    fn matmul_id(
        &self,
        w: &GpuWeight<D>,
        bias: Option<&GpuWeight<D>>,
        x: &GpuBuffer<D>,
        ids: &GpuBuffer<D>,
        m: MatId,
        out: &mut GpuBuffer<D>,
    ) -> Result<(), BackendError> {
        let shape_all = w.matrix("matmul_id")?;
        let b = bias.map(|w| w.dense("matmul_id")).transpose()?;
        let n_mat = w.mats;
        let mat = MatShape {
            n_out: shape_all.n_out / n_mat,
            ..shape_all
        };
        let bias_len = bias.map(|b| b.n_in * b.n_out);
        m.check(mat.n_in, mat.n_out, n_mat, bias_len, x.len, ids.len, out.len)?;
        self.with_matmul_input(w.ty, x, m.inputs() * mat.n_in, |x| {
            for (part, store) in &w.parts {
                let buf = w.buffer("matmul_id", store)?;
                if let Some(d) = plan::matmul_id(mat, n_mat, *part, w.row_bytes, m, b.is_some())? {
                    let bias = b.unwrap_or(self.layer().dummy());
                    let binds = [(1, buf), (2, x), (3, &out.buf), (4, &ids.buf), (5, bias)];
                    self.record("matmul_id", &d, binds)?;
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
        crate::backend::moe::check_combine(rows, slots, width, experts.len, weights.len, out.len)?;
        let len = rows * width;
        if let Some(d) = plan::moe_elementwise("moe_combine", Kernel::MoeCombine, len, width, slots, 0.0, 0.0)? {
            self.record("moe_combine", &d, [(1, &out.buf), (2, &experts.buf), (3, &weights.buf)])?;
        }
        Ok(())
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
        let (wb, w_len) = w.values("ssm_conv")?;
        p.check(seq, x.len, w_len, state.len, out.len)?;
        if let Some(d) = plan::ssm_conv(p, seq)? {
            self.record("ssm_conv", &d, [(1, &x.buf), (2, wb), (3, &state.buf), (4, &out.buf)])?;
        }
        Ok(())
    }

    fn delta_gates(
        &self,
        alpha: &mut Self::Buffer,
        beta: &mut Self::Buffer,
        rows: usize,
        dt_bias: &Self::Weight,
        a: &Self::Weight,
    ) -> Result<(), BackendError> {
        let (dt, n_head) = dt_bias.values("delta_gates")?;
        let (av, a_len) = a.values("delta_gates")?;
        recurrent::check_gates(rows, n_head, alpha.len, beta.len, n_head, a_len)?;
        if let Some(d) = plan::delta_gates(rows, n_head)? {
            self.record("delta_gates", &d, [(1, &alpha.buf), (2, &beta.buf), (3, dt), (4, av)])?;
        }
        Ok(())
    }

    /// Token by token in either form (delta_net.wgsl): the forms agree to f32 rounding, and
    /// one token's work is already spread over every state column.
    fn delta_form(&self, rows: usize) -> Form {
        recurrent::chunks_from(rows)
    }

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
        p.check(seq, form, qkv.len, gate.len, beta.len, state.len, out.len)?;
        if let Some(d) = plan::delta_net(p, seq)? {
            let binds = [
                (1, &qkv.buf),
                (2, &gate.buf),
                (3, &beta.buf),
                (4, &state.buf),
                (5, &out.buf),
            ];
            self.record("delta_net", &d, binds)?;
        }
        Ok(())
    }

    fn rmsnorm_gated(
        &self,
        x: &mut Self::Buffer,
        z: &Self::Buffer,
        w: &Self::Weight,
        groups: usize,
        eps: f32,
    ) -> Result<(), BackendError> {
        let wb = w.dense("rmsnorm_gated")?;
        recurrent::check_gated_norm(groups, w.n_in, x.len, z.len)?;
        if let Some(d) = plan::norm(Kernel::RmsNormGated, w.n_in, groups, eps)? {
            self.record("rmsnorm_gated", &d, [(1, &z.buf), (2, wb), (4, &x.buf)])?;
        }
        Ok(())
    }

    fn copy_strided(&self, src: &GpuBuffer<D>, dst: &mut GpuBuffer<D>, c: &Strided) -> Result<(), BackendError> {
        c.check(src.len, dst.len)?;
        if c.width == 0 {
            return Ok(());
        }
        for i in 0..c.count {
            let (s, d) = (c.src_off + i * c.src_stride, c.dst_off + i * c.dst_stride);
            let at = |v: usize| (v * 4) as u64;
            self.layer()
                .copy("copy_strided", (&src.buf, at(s)), (&dst.buf, at(d)), at(c.width))?;
        }
        Ok(())
    }

    fn copy_rows(
        &self,
        src: &GpuBuffer<D>,
        row0: usize,
        rows: usize,
        width: usize,
        dst: &mut GpuBuffer<D>,
    ) -> Result<(), BackendError> {
        checks::rows("copy_rows", src.len, dst.len, row0, rows, width)?;
        if rows * width == 0 {
            return Ok(());
        }
        let (off, len) = ((row0 * width * 4) as u64, (rows * width * 4) as u64);
        self.layer().copy("copy_rows", (&src.buf, off), (&dst.buf, 0), len)
    }

    fn paste_rows(
        &self,
        src: &GpuBuffer<D>,
        rows: usize,
        width: usize,
        dst: &mut GpuBuffer<D>,
        row0: usize,
    ) -> Result<(), BackendError> {
        checks::rows("paste_rows", src.len, dst.len, row0, rows, width)?;
        if rows * width == 0 {
            return Ok(());
        }
        let (off, len) = ((row0 * width * 4) as u64, (rows * width * 4) as u64);
        self.layer().copy("paste_rows", (&src.buf, 0), (&dst.buf, off), len)
    }

    fn argmax(&self, x: &GpuBuffer<D>, rows: usize, width: usize) -> Result<Readback<Vec<u32>>, BackendError> {
        checks::argmax(rows, width, x.len)?;
        if rows == 0 {
            return Ok(Readback::ready(Vec::new()));
        }
        let d = plan::argmax(rows, width)?;
        let data = self.run_and_read("argmax", &d, &self.inner.argmax, (&x.buf, 2), rows as u64 * 4)?;
        Ok(data.map(|bytes| bytemuck::pod_collect_to_vec(&bytes)))
    }

    fn top_k(
        &self,
        x: &GpuBuffer<D>,
        rows: usize,
        width: usize,
        k: usize,
        gather: &[u32],
    ) -> Result<Readback<Vec<Candidates>>, BackendError> {
        checks::top_k(rows, width, k, x.len)?;
        if rows == 0 {
            return Ok(Readback::ready(Vec::new()));
        }
        let t = plan::top_k(&self.inner.paths.strategy, rows, width, k, gather)?;
        let bytes = (rows * t.per_row) as u64 * 4;
        let data = self.run_and_read("top_k", &t.dispatch, &self.inner.select, (&x.buf, 3), bytes)?;
        let (k, per_row) = (t.k, t.per_row);
        Ok(data.map(move |data| plan::candidates(&bytemuck::pod_collect_to_vec::<u8, u32>(&data), k, per_row)))
    }
}
