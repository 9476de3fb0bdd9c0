//! The CPU backend: weights read in place from the GGUF mapping (or interleaved into 8-row
//! tiles at load for the SIMD kernels), activations in `Vec<f32>`, the KV cache in f16 (as
//! llama.cpp stores it) or in Q8_0 blocks (`--cache-type q8_0`), work split across output rows on a persistent [`pool::Pool`]. Matmuls
//! use the tile kernels of [`kernels::Kernels`]: the SIMD sets in `simd/` where the CPU has
//! them (AVX2, VNNI), else the portable set, with the scalar oracle beside them for the tests.
//! Attention runs every sequence of a batch in one dispatch (`attention.rs`; over a Q8_0 cache
//! `attention_q8.rs`, which reads the blocks directly).

mod attention;
mod attention_q8;
mod experts;
pub mod interleave;
pub mod kernels;
mod ops;
pub mod pool;
pub mod profile;
mod recurrent;
#[cfg(target_arch = "x86_64")]
mod simd;
#[cfg_attr(not(all(target_arch = "wasm32", target_feature = "atomics")), allow(dead_code))]
mod team;
pub mod tile;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
pub mod wasm;

use std::sync::Arc;

use half::f16;

use super::checks::{self, shape, weight_matrix};
use super::readback::MaybeSend;
use super::rotation;
use crate::backend::attn::SeqAttn;
use crate::backend::error::BackendError;
use crate::backend::interface::Backend;
use crate::backend::kv::KvType;
use crate::backend::moe::{MatId, Route, Strided};
use crate::backend::readback::Readback;
use crate::backend::recurrent::{Conv, DeltaNet, Form, SeqRows};
use crate::backend::rope::Rope;
use crate::gguf::{GgufFile, TensorInfo, TensorView};
use crate::quant::legacy::{quantize_q8_0_blocks, BlockQ8_0, QK};
use crate::quant::{self, GgmlType};
use crate::sample::Candidates;
use kernels::Kernels;
use pool::Pool;
use tile::{Layout, TileOut};

/// Output rows per matmul task (rows of `W`): whole interleaved tiles.
const MATMUL_TILE: usize = 2 * interleave::TILE_ROWS;
/// Values per task of element-wise ops.
const ELEMENTWISE_CHUNK: usize = 1 << 14;
/// The fewest values of a gated activation per task: in the threaded wasm build a few
/// microseconds of work against about one of the team's hand-off; natively (a rayon hand-off
/// per op, several microseconds, and the AVX2 gate at under a nanosecond per value) a decode
/// step's gate stays one task, as before.
#[cfg(target_arch = "wasm32")]
const GATE_MIN_CHUNK: usize = 1 << 10;
#[cfg(not(target_arch = "wasm32"))]
const GATE_MIN_CHUNK: usize = ELEMENTWISE_CHUNK;

/// Values per task of a norm over groups of `g`: whole groups, about [`ELEMENTWISE_CHUNK`] of
/// them, so that a decode batch's few rows are normed in place rather than dispatched (waking
/// the pool cost more than the work).
fn norm_task_values(g: usize) -> usize {
    let g = g.max(1);
    g * (ELEMENTWISE_CHUNK / g).max(1)
}

/// A matmul output `[rows][n]` that the tasks of one matmul write at once, each only the
/// columns of its own weight rows.
struct Columns {
    ptr: *mut f32,
    rows: usize,
    n: usize,
}

// SAFETY: `Columns` is only written through the tiles of `tile`, whose callers take disjoint
// columns.
unsafe impl Sync for Columns {}
unsafe impl Send for Columns {}

impl Columns {
    /// `out` must hold exactly `rows * n` values; it stays borrowed (through the pointer) for as
    /// long as the caller keeps `Columns`, which is within the borrow of `out`.
    fn new(out: &mut [f32], rows: usize, n: usize) -> Self {
        debug_assert_eq!(out.len(), rows * n);
        Columns {
            ptr: out.as_mut_ptr(),
            rows,
            n,
        }
    }

    /// Columns `w0..w0 + nw` of every row, for a kernel to write in place.
    ///
    /// # Safety
    /// `w0 + nw <= n`, and no other thread touches those columns while the tile lives.
    unsafe fn tile(&self, w0: usize, nw: usize) -> TileOut<'_> {
        TileOut::columns(self.ptr, self.rows, self.n, w0, nw)
    }
}

/// The CPU backend.
#[derive(Debug)]
pub struct CpuBackend {
    pool: Pool,
    kernels: Kernels,
}

impl CpuBackend {
    /// A backend with `threads` workers (0: one per core).
    pub fn new(threads: usize) -> Result<Self, BackendError> {
        Self::with_kernels(threads, Kernels::detect())
    }

    /// A backend with an explicit kernel set (tests compare [`Kernels::oracle`] with the
    /// default).
    pub fn with_kernels(threads: usize, kernels: Kernels) -> Result<Self, BackendError> {
        Ok(CpuBackend {
            pool: Pool::new(threads)?,
            kernels,
        })
    }

    /// Number of worker threads.
    pub fn threads(&self) -> usize {
        self.pool.threads()
    }

    /// Name of the kernel variant in use.
    pub fn kernel_variant(&self) -> &'static str {
        self.kernels.variant
    }
}

impl CpuBackend {
    /// Attention for the rows of every sequence of `seqs` (`q`: the batch's
    /// `[rows][n_head * head_dim_k]`, `out`: `[rows][n_head * head_dim_v]`) in one dispatch:
    /// the tasks of each sequence's [`attention::Plan`] (query row blocks × KV heads × head
    /// groups) go into a scratch of equal slots (the largest task's size), then are scattered
    /// into place per sequence.
    fn attend(
        &self,
        q: &[f32],
        seqs: &[SeqAttn<'_, CpuKv>],
        sinks: attention::Sinks<'_>,
        out: &mut [f32],
    ) -> Result<(), BackendError> {
        checks::attention(q.len(), out.len(), seqs, CpuKv::shape, sinks.map(<[f32]>::len))?;
        let mut plans = Vec::with_capacity(seqs.len());
        let (mut tasks, mut slot) = (0, 0);
        for s in seqs {
            let plan = attention::Plan::new(&s.p, self.pool.threads());
            plans.push((tasks, plan));
            tasks += plan.tasks();
            slot = slot.max(plan.chunk());
        }
        if tasks == 0 || slot == 0 {
            return Ok(());
        }
        // The rows of sequence `s` in `q` (`[rows][q_dim]`) and `out` (`[rows][out_dim]`).
        let q_span = |s: &SeqAttn<'_, CpuKv>| s.row0 * s.p.q_dim()..(s.row0 + s.p.rows) * s.p.q_dim();
        let out_span = |s: &SeqAttn<'_, CpuKv>| s.row0 * s.p.out_dim()..(s.row0 + s.p.rows) * s.p.out_dim();
        // The sequence owning task `t` of the dispatch: the last whose first task is `<= t`.
        let owner = |t: usize| plans.partition_point(|(first, _)| *first <= t) - 1;
        attention::with_out_scratch(tasks * slot, |scratch| {
            self.pool.for_chunks(scratch, slot, |t, o| {
                let i = owner(t);
                let ((first, plan), s) = (&plans[i], &seqs[i]);
                let b = plan.block(t - first, s.p.rows);
                let (q, o) = (&q[q_span(s)], &mut o[..plan.chunk()]);
                match (&s.k_cache.0, &s.v_cache.0) {
                    (KvData::F16(k), KvData::F16(v)) => attention::attend_block(q, k, v, &s.p, sinks, &b, o),
                    (KvData::Q8_0(k), KvData::Q8_0(v)) => attention_q8::attend_block(q, k, v, &s.p, sinks, &b, o),
                    // `checks::attention` refused caches of two formats.
                    _ => {}
                }
            });
            for ((first, plan), s) in plans.iter().zip(seqs) {
                plan.scatter(&scratch[first * slot..], slot, s.p.rows, &mut out[out_span(s)]);
            }
        });
        Ok(())
    }

    /// A weight from a tensor's bytes: 1-D decoded to f32, 2-D interleaved where the kernels
    /// want it (`release` lets go of the source's pages as they are copied), otherwise kept as
    /// `rows` makes them (in the file mapping, or a copy).
    fn weight(
        &self,
        view: TensorView<'_>,
        release: impl Fn(std::ops::Range<usize>) + Sync,
        rows: impl FnOnce() -> WeightData,
    ) -> Result<CpuWeight, BackendError> {
        let info = view.info;
        let (n_in, n_out) = weight_matrix(&info.name, info, view.data.len(), quant::has_vec_dot, "cpu")?;
        // A stack of matrices (experts) is interleaved only where each matrix is whole tiles,
        // so a matmul can start at any matrix.
        let mats = checks::stacked_matrices(info);
        let whole_tiles = (n_out / mats).is_multiple_of(interleave::TILE_ROWS);
        let vector = checks::is_vector(info);
        let interleaved = (!vector && (mats == 1 || whole_tiles) && (self.kernels.interleaves)(info.ty))
            .then(|| self.interleave(info, n_in, view.data, &release))
            .flatten();
        let data = if vector {
            WeightData::Dense(view.to_f32()?)
        } else if let Some(tiles) = interleaved {
            WeightData::Interleaved(tiles)
        } else {
            rows()
        };
        Ok(CpuWeight {
            name: info.name.clone(),
            ty: info.ty,
            n_in,
            n_out,
            mats,
            data,
        })
    }

    /// The interleaved copy of a tensor's `rows` (`k` values each), made in parallel. Each
    /// part's source pages are released once copied, so the tensor is never resident twice.
    fn interleave(
        &self,
        info: &TensorInfo,
        k: usize,
        rows: &[u8],
        release: &(impl Fn(std::ops::Range<usize>) + Sync),
    ) -> Option<Vec<u8>> {
        /// Tiles per task.
        const TILES: usize = 64;
        let n = interleave::row_count(info.ty, k, rows)?;
        let mut tiles = vec![0u8; interleave::len(info.ty, k, n)];
        prefer_huge_pages(&mut tiles);
        let tb = interleave::tile_bytes(info.ty, k);
        let rb = rows.len() / n.max(1);
        self.pool.for_chunks(&mut tiles, TILES * tb, |c, dst| {
            interleave::interleave_tiles(info.ty, k, rows, c * TILES, dst);
            let r0 = c * TILES * interleave::TILE_ROWS;
            let r1 = (r0 + dst.len() / tb * interleave::TILE_ROWS).min(n);
            release(r0 * rb..r1 * rb);
        });
        // Once more as a whole: a part's page faults may have mapped a few pages of a
        // neighbouring part that was already released.
        release(0..rows.len());
        Some(tiles)
    }
}

/// Ask for transparent huge pages under `buf` before it is first written: a fresh large
/// allocation is untouched zero pages, and 2 MiB pages make filling it at load cheaper (far
/// fewer faults) and streaming it per token too (fewer TLB misses). Only a hint.
fn prefer_huge_pages(buf: &mut [u8]) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = (buf.as_mut_ptr() as usize).next_multiple_of(HUGE);
        let end = (buf.as_mut_ptr() as usize + buf.len()) / HUGE * HUGE;
        if end > start {
            // SAFETY: the range lies inside `buf`, which we own; MADV_HUGEPAGE changes how
            // pages are backed, never their contents.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = buf;
}

/// An f32 activation buffer.
#[derive(Debug, Clone)]
pub struct CpuBuffer(Vec<f32>);

impl CpuBuffer {
    /// The values (for tests and host-side consumers).
    pub fn as_slice(&self) -> &[f32] {
        &self.0
    }
}

/// One layer's K or V cache.
#[derive(Debug, Clone)]
pub struct CpuKv(KvData);

#[derive(Debug, Clone)]
enum KvData {
    /// Values rounded to f16.
    F16(Vec<f16>),
    /// Q8_0 blocks, rows of whole blocks.
    Q8_0(Vec<BlockQ8_0>),
}

impl CpuKv {
    /// Its length in values and its format.
    fn shape(&self) -> (usize, KvType) {
        match &self.0 {
            KvData::F16(v) => (v.len(), KvType::F16),
            KvData::Q8_0(b) => (b.len() * QK, KvType::Q8_0),
        }
    }
}

/// A weight on the CPU.
#[derive(Debug)]
pub struct CpuWeight {
    name: String,
    ty: GgmlType,
    /// Values per row (GGUF `shape[0]`).
    n_in: usize,
    /// Rows (product of the other dimensions).
    n_out: usize,
    /// Matrices stacked along the third and later dimensions (experts), `n_out / mats` rows
    /// each.
    mats: usize,
    data: WeightData,
}

#[derive(Debug)]
enum WeightData {
    /// 2-D tensors stay in the file mapping; rows are read in place.
    Mapped { file: Arc<GgufFile>, info: TensorInfo },
    /// 2-D tensors placed from bytes the caller did not keep (a streamed file): a copy.
    Owned(Vec<u8>),
    /// 2-D tensors of the types the kernels interleave, copied into that layout at load
    /// (`[ceil(n_out / 8)]` tiles of [`interleave::tile_bytes`]).
    Interleaved(Vec<u8>),
    /// 1-D tensors (norms, biases, rope factors) are small: decoded to f32 once.
    Dense(Vec<f32>),
}

impl CpuWeight {
    fn bytes(&self) -> &[u8] {
        match &self.data {
            WeightData::Mapped { file, info } => file.view(info).data,
            WeightData::Owned(v) | WeightData::Interleaved(v) => v,
            WeightData::Dense(_) => &[],
        }
    }

    fn layout(&self) -> Layout {
        match self.data {
            WeightData::Interleaved(_) => Layout::Interleaved,
            _ => Layout::Rows,
        }
    }

    /// The bytes holding rows `r0..r0 + n` (`r0` a multiple of the tile for interleaved
    /// weights), in [`Self::layout`].
    fn rows(&self, r0: usize, n: usize) -> &[u8] {
        let range = match self.layout() {
            Layout::Rows => r0 * self.row_bytes()..(r0 + n) * self.row_bytes(),
            Layout::Interleaved => interleave::span(self.ty, self.n_in, r0, n),
        };
        &self.bytes()[range]
    }

    fn dense(&self, op: &'static str) -> Result<&[f32], BackendError> {
        match &self.data {
            WeightData::Dense(v) => Ok(v),
            _ => Err(shape(op, format!("'{}' is a matrix, expected a vector", self.name))),
        }
    }

    fn row_bytes(&self) -> usize {
        self.n_in / self.ty.block_size() * self.ty.block_bytes()
    }
}

impl Backend for CpuBackend {
    type Buffer = CpuBuffer;
    type Kv = CpuKv;
    type Weight = CpuWeight;

    fn run_pass<R: MaybeSend>(&self, f: impl FnOnce() -> R + MaybeSend) -> R {
        self.pool.run(f)
    }

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn load_weight(&self, file: &Arc<GgufFile>, name: &str) -> Result<CpuWeight, BackendError> {
        let view = file.tensor(name)?;
        self.weight(
            view,
            |r| file.release(view.info, r),
            || WeightData::Mapped {
                file: Arc::clone(file),
                info: view.info.clone(),
            },
        )
    }

    fn place_weight(&self, tensor: TensorView<'_>) -> Result<CpuWeight, BackendError> {
        self.weight(tensor, |_| {}, || WeightData::Owned(tensor.data.to_vec()))
    }

    fn alloc(&self, len: usize) -> Result<CpuBuffer, BackendError> {
        Ok(CpuBuffer(vec![0.0; len]))
    }

    fn alloc_kv(&self, len: usize, ty: KvType) -> Result<CpuKv, BackendError> {
        checks::alloc_kv(len, ty)?;
        // Zeroed by the allocator, so pages the context never reaches cost no memory
        // (`vec![f16::ZERO; len]` would write every one).
        Ok(CpuKv(match ty {
            KvType::F16 => KvData::F16(bytemuck::zeroed_vec(len)),
            KvType::Q8_0 => KvData::Q8_0(bytemuck::zeroed_vec(len / QK)),
        }))
    }

    fn write(&self, dst: &mut CpuBuffer, src: &[f32]) -> Result<(), BackendError> {
        checks::need("write", "destination", dst.0.len(), src.len())?;
        dst.0[..src.len()].copy_from_slice(src);
        Ok(())
    }

    fn read(&self, src: &CpuBuffer, len: usize) -> Result<Readback<Vec<f32>>, BackendError> {
        checks::need("read", "source", src.0.len(), len)?;
        Ok(Readback::ready(src.0[..len].to_vec()))
    }

    fn embed(&self, table: &CpuWeight, tokens: &[u32], scale: f32, out: &mut CpuBuffer) -> Result<(), BackendError> {
        let width = table.n_in;
        if matches!(table.data, WeightData::Dense(_)) {
            return Err(shape(
                "embed",
                format!("'{}' is a vector, expected a matrix", table.name),
            ));
        }
        checks::embed(out.0.len(), tokens, width, table.n_out)?;
        let mut block_row = Vec::new();
        for (&t, row) in tokens.iter().zip(out.0.chunks_exact_mut(width)) {
            let t_us = t as usize;
            let bytes = match table.layout() {
                Layout::Rows => table.rows(t_us, 1),
                Layout::Interleaved => {
                    block_row.clear();
                    interleave::row(table.ty, width, table.bytes(), t_us, &mut block_row);
                    &block_row
                }
            };
            quant::dequantize(table.ty, bytes, row)?;
            if scale != 1.0 {
                row.iter_mut().for_each(|v| *v *= scale);
            }
        }
        Ok(())
    }

    fn matmul(&self, w: &CpuWeight, x: &CpuBuffer, rows: usize, out: &mut CpuBuffer) -> Result<(), BackendError> {
        let (k, n) = (w.n_in, w.n_out);
        if matches!(w.data, WeightData::Dense(_)) {
            return Err(shape("matmul", format!("'{}' is a vector, expected a matrix", w.name)));
        }
        checks::matmul(x.0.len(), out.0.len(), rows, k, n)?;
        // Profiled by weight (its layer number left out), the activations' quantization
        // included.
        let _op = profile::Op::named(|| {
            let role = w.name.trim_start_matches("blk.");
            let role = role
                .trim_start_matches(|c: char| c.is_ascii_digit())
                .trim_start_matches('.');
            format!("matmul {role} {:?} {n}x{k} rows {rows}", w.ty)
        });
        let act = (self.kernels.prepare)(w.ty, &x.0[..rows * k], k)?;
        let tile_fn = self.kernels.tile;
        let (ty, layout) = (w.ty, w.layout());
        // Each task takes MATMUL_TILE weight rows, meets them with every activation row and
        // writes its columns of `out` in place.
        let cols = Columns::new(&mut out.0[..rows * n], rows, n);
        self.pool.for_each_index(n.div_ceil(MATMUL_TILE), |t| {
            let r0 = t * MATMUL_TILE;
            let nw = MATMUL_TILE.min(n - r0);
            // SAFETY: task `t` alone handles weight rows `r0..r0 + nw`, so it alone touches
            // those columns of `out`, and `r0 + nw <= n`.
            let mut tile = unsafe { cols.tile(r0, nw) };
            tile_fn(ty, layout, k, w.rows(r0, nw), &act, &mut tile);
        });
        Ok(())
    }

    fn add_bias(&self, x: &mut CpuBuffer, bias: &CpuWeight, rows: usize) -> Result<(), BackendError> {
        let b = bias.dense("add_bias")?;
        checks::elementwise("add_bias", x.0.len(), None, rows * b.len())?;
        for row in x.0[..rows * b.len()].chunks_exact_mut(b.len()) {
            row.iter_mut().zip(b).for_each(|(v, &c)| *v += c);
        }
        Ok(())
    }

    fn add(&self, x: &mut CpuBuffer, y: &CpuBuffer, len: usize) -> Result<(), BackendError> {
        checks::elementwise("add", x.0.len(), Some(("y", y.0.len())), len)?;
        let y = &y.0[..len];
        self.pool.for_chunks(&mut x.0[..len], ELEMENTWISE_CHUNK, |i, c| {
            let o = i * ELEMENTWISE_CHUNK;
            let n = c.len();
            c.iter_mut().zip(&y[o..o + n]).for_each(|(a, &b)| *a += b);
        });
        Ok(())
    }

    fn scale(&self, x: &mut CpuBuffer, len: usize, s: f32) -> Result<(), BackendError> {
        checks::elementwise("scale", x.0.len(), None, len)?;
        x.0[..len].iter_mut().for_each(|v| *v *= s);
        Ok(())
    }

    fn hadamard(&self, x: &mut CpuBuffer, groups: usize, n: usize) -> Result<(), BackendError> {
        rotation::check(x.0.len(), groups, n)?;
        rotation::hadamard_groups(&mut x.0[..groups * n], n);
        Ok(())
    }

    fn rmsnorm(
        &self,
        x: &CpuBuffer,
        w: &CpuWeight,
        groups: usize,
        eps: f32,
        out: &mut CpuBuffer,
    ) -> Result<(), BackendError> {
        let wv = w.dense("rmsnorm")?;
        let g = wv.len();
        checks::norm(Some(x.0.len()), out.0.len(), groups, g)?;
        let x = &x.0[..groups * g];
        let per_task = norm_task_values(g);
        self.pool.for_chunks(&mut out.0[..groups * g], per_task, |i, o| {
            let x = &x[i * per_task..i * per_task + o.len()];
            for (x, o) in x.chunks_exact(g).zip(o.chunks_exact_mut(g)) {
                ops::rmsnorm(x, wv, eps, o);
            }
        });
        Ok(())
    }

    fn rmsnorm_inplace(&self, x: &mut CpuBuffer, w: &CpuWeight, groups: usize, eps: f32) -> Result<(), BackendError> {
        let wv = w.dense("rmsnorm")?;
        let g = wv.len();
        checks::norm(None, x.0.len(), groups, g)?;
        self.pool
            .for_chunks(&mut x.0[..groups * g], norm_task_values(g), |_, c| {
                c.chunks_exact_mut(g).for_each(|c| ops::rmsnorm_inplace(c, wv, eps));
            });
        Ok(())
    }

    fn rope(
        &self,
        x: &mut CpuBuffer,
        n_head: usize,
        head_dim: usize,
        positions: &[u32],
        rope: &Rope,
        factors: Option<&CpuWeight>,
    ) -> Result<(), BackendError> {
        let factors = factors.map(|f| f.dense("rope")).transpose()?;
        checks::rope(x.0.len(), n_head, head_dim, positions, rope, factors.map(<[f32]>::len))?;
        let width = n_head * head_dim;
        let angles = rope.angles();
        self.pool
            .for_chunks(&mut x.0[..positions.len() * width], width, |r, row| {
                let mut table = Vec::with_capacity(rope.n_rot / 2);
                ops::rope_table(positions[r], rope.n_rot, &angles, factors, &mut table);
                for head in row.chunks_exact_mut(head_dim) {
                    ops::rope_head(head, rope, &table);
                }
            });
        Ok(())
    }

    fn kv_store(
        &self,
        cache: &mut CpuKv,
        src: &CpuBuffer,
        row0: usize,
        width: usize,
        positions: &[u32],
    ) -> Result<(), BackendError> {
        checks::kv_store(cache.shape(), src.0.len(), row0, width, positions)?;
        for (i, &pos) in positions.iter().enumerate() {
            let (dst, from) = (pos as usize * width, (row0 + i) * width);
            let row = &src.0[from..from + width];
            match &mut cache.0 {
                KvData::F16(c) => c[dst..dst + width]
                    .iter_mut()
                    .zip(row)
                    .for_each(|(d, &s)| *d = f16::from_f32(s)),
                KvData::Q8_0(c) => quantize_q8_0_blocks(row, &mut c[dst / QK..(dst + width) / QK]),
            }
        }
        Ok(())
    }

    fn attention(
        &self,
        q: &CpuBuffer,
        seqs: &[SeqAttn<'_, CpuKv>],
        sinks: Option<&CpuWeight>,
        out: &mut CpuBuffer,
    ) -> Result<(), BackendError> {
        let sinks = sinks.map(|w| w.dense("attention")).transpose()?;
        self.attend(&q.0, seqs, sinks, &mut out.0)
    }

    fn swiglu(&self, gate: &mut CpuBuffer, up: &CpuBuffer, len: usize) -> Result<(), BackendError> {
        self.gated("swiglu", gate, up, len, self.kernels.swiglu)
    }

    fn geglu(&self, gate: &mut CpuBuffer, up: &CpuBuffer, len: usize) -> Result<(), BackendError> {
        self.gated("geglu", gate, up, len, |g: &mut [f32], u: &[f32]| {
            g.iter_mut().zip(u).for_each(|(g, &u)| *g = ops::gelu(*g) * u);
        })
    }

    fn sigmoid_mul(&self, x: &mut CpuBuffer, gate: &CpuBuffer, len: usize) -> Result<(), BackendError> {
        self.gated("sigmoid_mul", x, gate, len, |x: &mut [f32], g: &[f32]| {
            x.iter_mut()
                .zip(g)
                .for_each(|(x, &g)| *x *= crate::backend::recurrent::sigmoid(g));
        })
    }

    fn swiglu_oai(
        &self,
        gate: &mut CpuBuffer,
        up: &CpuBuffer,
        len: usize,
        alpha: f32,
        limit: f32,
    ) -> Result<(), BackendError> {
        self.oai_glu(gate, up, len, alpha, limit)
    }

    fn route_experts(
        &self,
        logits: &CpuBuffer,
        rows: usize,
        route: &Route,
        bias: Option<&CpuWeight>,
        ids: &mut CpuBuffer,
        weights: &mut CpuBuffer,
    ) -> Result<(), BackendError> {
        self.route(logits, rows, route, bias, ids, weights)
    }

    fn matmul_id(
        &self,
        w: &CpuWeight,
        bias: Option<&CpuWeight>,
        x: &CpuBuffer,
        ids: &CpuBuffer,
        m: MatId,
        out: &mut CpuBuffer,
    ) -> Result<(), BackendError> {
        self.grouped_matmul(w, bias, x, ids, m, out)
    }

    fn moe_combine(
        &self,
        experts: &CpuBuffer,
        weights: &CpuBuffer,
        rows: usize,
        slots: usize,
        width: usize,
        out: &mut CpuBuffer,
    ) -> Result<(), BackendError> {
        self.combine(experts, weights, rows, slots, width, out)
    }

    fn ssm_conv(
        &self,
        x: &CpuBuffer,
        w: &CpuWeight,
        p: &Conv,
        seq: SeqRows,
        state: &mut CpuBuffer,
        out: &mut CpuBuffer,
    ) -> Result<(), BackendError> {
        self.conv(x, w, p, seq, state, out)
    }

    fn delta_gates(
        &self,
        alpha: &mut CpuBuffer,
        beta: &mut CpuBuffer,
        rows: usize,
        dt_bias: &CpuWeight,
        a: &CpuWeight,
    ) -> Result<(), BackendError> {
        self.gates(alpha, beta, rows, dt_bias, a)
    }

    fn delta_net(
        &self,
        p: &DeltaNet,
        form: Form,
        seq: SeqRows,
        qkv: &CpuBuffer,
        gate: &CpuBuffer,
        beta: &CpuBuffer,
        state: &mut CpuBuffer,
        out: &mut CpuBuffer,
    ) -> Result<(), BackendError> {
        self.delta(p, form, seq, qkv, gate, beta, state, out)
    }

    fn rmsnorm_gated(
        &self,
        x: &mut CpuBuffer,
        z: &CpuBuffer,
        w: &CpuWeight,
        groups: usize,
        eps: f32,
    ) -> Result<(), BackendError> {
        self.gated_norm(x, z, w, groups, eps)
    }

    fn copy_strided(&self, src: &CpuBuffer, dst: &mut CpuBuffer, c: &Strided) -> Result<(), BackendError> {
        self.strided(src, dst, c)
    }

    fn copy_rows(
        &self,
        src: &CpuBuffer,
        row0: usize,
        rows: usize,
        width: usize,
        dst: &mut CpuBuffer,
    ) -> Result<(), BackendError> {
        checks::rows("copy_rows", src.0.len(), dst.0.len(), row0, rows, width)?;
        dst.0[..rows * width].copy_from_slice(&src.0[row0 * width..(row0 + rows) * width]);
        Ok(())
    }

    fn paste_rows(
        &self,
        src: &CpuBuffer,
        rows: usize,
        width: usize,
        dst: &mut CpuBuffer,
        row0: usize,
    ) -> Result<(), BackendError> {
        checks::rows("paste_rows", src.0.len(), dst.0.len(), row0, rows, width)?;
        dst.0[row0 * width..(row0 + rows) * width].copy_from_slice(&src.0[..rows * width]);
        Ok(())
    }

    fn argmax(&self, x: &CpuBuffer, rows: usize, width: usize) -> Result<Readback<Vec<u32>>, BackendError> {
        checks::argmax(rows, width, x.0.len())?;
        Ok(Readback::ready(
            x.0[..rows * width].chunks_exact(width).map(argmax_row).collect(),
        ))
    }

    fn top_k(
        &self,
        x: &CpuBuffer,
        rows: usize,
        width: usize,
        k: usize,
        gather: &[u32],
    ) -> Result<Readback<Vec<Candidates>>, BackendError> {
        checks::top_k(rows, width, k, x.0.len())?;
        // The rows are host memory already: select in place, no copy, a row per task (a
        // batched decode step has a row per sequence, each a scan of the whole vocabulary).
        let mut out = vec![Candidates::default(); rows];
        let x = &x.0[..rows * width];
        self.pool.for_chunks(&mut out, 1, |r, slot| {
            slot[0] = crate::sample::candidates(&x[r * width..(r + 1) * width], k, gather);
        });
        Ok(Readback::ready(out))
    }
}

impl CpuBackend {
    /// A gated activation over `len` values: `apply(gate_chunk, up_chunk)` on matching pieces.
    fn gated(
        &self,
        op: &'static str,
        gate: &mut CpuBuffer,
        up: &CpuBuffer,
        len: usize,
        apply: impl Fn(&mut [f32], &[f32]) + Sync + Send,
    ) -> Result<(), BackendError> {
        checks::elementwise(op, gate.0.len(), Some(("up", up.0.len())), len)?;
        let up = &up.0[..len];
        // An activation costs nanoseconds per value (an exp, a table lookup), so even a decode
        // step's gate of a few thousand values is worth a share per thread.
        let chunk = len
            .div_ceil(self.pool.threads())
            .clamp(GATE_MIN_CHUNK, ELEMENTWISE_CHUNK);
        self.pool.for_chunks(&mut gate.0[..len], chunk, |i, c| {
            let o = i * chunk;
            apply(c, &up[o..o + c.len()]);
        });
        Ok(())
    }
}

/// Index of the first maximum, NaN never winning, 0 for a row of NaN: the rule of
/// [`crate::sample::argmax`] (its slow twin in the tests), vectorized.
pub fn argmax_row(row: &[f32]) -> u32 {
    // Two passes the compiler vectorizes (a vocabulary-sized row per decoded token): the
    // largest non-NaN value in independent lanes (max is exact, so their order does not
    // matter), then the first index holding it (-0.0 and 0.0 compare equal, as in the
    // sequential rule where the first zero of either sign stays).
    const LANES: usize = 16;
    let mut m = [f32::NEG_INFINITY; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (mi, &v) in m.iter_mut().zip(c) {
            *mi = if v > *mi { v } else { *mi };
        }
    }
    let max = m
        .iter()
        .chain(tail)
        .fold(f32::NEG_INFINITY, |a, &v| if v > a { v } else { a });
    // Only NaN (or an empty row): 0, as the sequential rule.
    row.iter().position(|&v| v == max).unwrap_or(0) as u32
}

#[cfg(test)]
mod tests {
    use super::argmax_row;
    use crate::sample::argmax;

    #[test]
    fn argmax_matches_the_samplers_rule() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let specials = [f32::NAN, f32::NEG_INFINITY, f32::INFINITY, 0.0, -0.0, 1.0];
        for len in [1, 2, 15, 16, 17, 33, 1000] {
            for _ in 0..50 {
                let row: Vec<f32> = (0..len)
                    .map(|_| match next() % 8 {
                        0 => specials[(next() % 6) as usize],
                        // Few distinct values, so ties are common.
                        _ => (next() % 5) as f32 - 2.0,
                    })
                    .collect();
                assert_eq!(argmax_row(&row), argmax(&row), "{row:?}");
            }
        }
        for (row, want) in [
            (vec![f32::NAN; 20], 0),
            (vec![f32::NEG_INFINITY; 3], 0),
            (vec![-0.0, 0.0], 0),
            (vec![f32::NAN, -5.0], 1),
            (vec![1.0, f32::NAN, 3.0, 3.0], 2),
        ] {
            assert_eq!(argmax_row(&row), want, "{row:?}");
            assert_eq!(argmax(&row), want, "{row:?}");
        }
    }
}
