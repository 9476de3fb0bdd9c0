//! The CPU backend: weights read in place from the GGUF mapping (or interleaved into 8-row
//! tiles at load for the SIMD kernels), activations in `Vec<f32>`, the KV cache in f16 (as
//! llama.cpp stores it) or in Q8_0 blocks (`--cache-type q8_0`), work split across output rows on a persistent [`pool::Pool`]. Matmuls
//! use the tile kernels of [`kernels::Kernels`]: the SIMD sets in `simd/` where the CPU has
//! them (AVX2, VNNI), else the portable set, with the scalar oracle beside them for the tests.
//! Attention runs every sequence of a batch in one dispatch (`attention.rs`; over a Q8_0 cache
//! `attention_q8.rs`, which reads the blocks directly).

mod arena;
mod attention;
mod attention_q8;
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
mod weight;

use std::sync::Arc;

use half::f16;
use half::slice::HalfFloatSliceExt;

use super::checks::{self, shape};
use super::readback::MaybeSend;
use super::rotation;
use crate::backend::attn::SeqAttn;
use crate::backend::error::BackendError;
use crate::backend::interface::Backend;
use crate::backend::kv::KvType;
use crate::backend::moe::{self, expert_id, MatId, Route, Strided};
use crate::backend::readback::Readback;
use crate::backend::recurrent::{self as rule, check_gated_norm, Conv, DeltaNet, Form, SeqRows};
use crate::backend::rope::Rope;
use crate::gguf::{GgufFile, TensorView};
use crate::quant;
use crate::quant::legacy::{quantize_q8_0_blocks, BlockQ8_0, QK};
use crate::sample::Candidates;
use kernels::Kernels;
use pool::Pool;
use tile::{Layout, TileOut};
pub use weight::CpuWeight;
use weight::WeightData;

/// Output rows per task of the conv.
const CONV_ROWS: usize = 16;
/// Channels per task of a one-row conv (a multiple of every SIMD width, so SiLU takes the same
/// lanes in its vector and tail parts as over the whole row).
const CONV_CHANNELS: usize = 1024;
/// Output rows per matmul task (rows of `W`): whole interleaved tiles.
const MATMUL_TILE: usize = 2 * interleave::TILE_ROWS;
/// `matmul_id` gathers each expert's activation rows in parallel from this many (token, expert)
/// pairs on; fewer (a decode step's) are copied on the calling thread.
const PARALLEL_GATHER_PAIRS: usize = 64;
/// Rows per worker from which a batch's activations are prepared in parallel
/// ([`CpuBackend::prepare_rows`]): below it the split costs more than it saves.
const PREPARE_SPLIT_ROWS: usize = 8;
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

/// Values per task of an op over rows (or groups) of `g`: whole rows, about
/// [`ELEMENTWISE_CHUNK`] values, so that a decode batch's few rows are normed, stored or copied
/// in place rather than dispatched (waking the pool cost more than the work).
fn row_task_values(g: usize) -> usize {
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

    /// Columns `w0..w0 + nw` of rows `at`, activation row `a` into row `at[a]`.
    ///
    /// # Safety
    /// As [`Columns::tile`], and each of `at` is below `rows`.
    unsafe fn scattered<'a>(&'a self, at: &'a [usize], w0: usize, nw: usize) -> TileOut<'a> {
        debug_assert!(at.iter().all(|&r| r < self.rows));
        TileOut::scattered(self.ptr, at, self.n, w0, nw)
    }
}

/// The CPU backend.
#[derive(Debug)]
pub struct CpuBackend {
    pool: Pool,
    kernels: Kernels,
    /// Where the interleaved weights' bytes come from.
    arena: arena::Arena,
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
            arena: arena::Arena::default(),
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

/// The ids of `n` pairs from an ids buffer, each checked against `n_mat`.
fn read_ids(ids: &[f32], n: usize, n_mat: usize) -> Result<Vec<usize>, BackendError> {
    ids[..n].iter().map(|&v| expert_id(v, n_mat)).collect()
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
        CpuWeight::new(
            &self.pool,
            &self.arena,
            self.kernels.interleaves,
            view,
            |r| file.release(view.info, r),
            || WeightData::Mapped {
                file: Arc::clone(file),
                info: view.info.clone(),
            },
        )
    }

    fn place_weight(&self, tensor: TensorView<'_>) -> Result<CpuWeight, BackendError> {
        let rows = || WeightData::Owned(tensor.data.to_vec());
        CpuWeight::new(&self.pool, &self.arena, self.kernels.interleaves, tensor, |_| {}, rows)
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
        let act = self.prepare_rows(w.ty, &x.0[..rows * k], k)?;
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
        let per_task = row_task_values(g);
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
            .for_chunks(&mut x.0[..groups * g], row_task_values(g), |_, c| {
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
        let rows = positions.len();
        let src = &src.0[row0 * width..(row0 + rows) * width];
        // A prefill's positions follow each other: its rows are one span of the cache, stored
        // by rows in parallel (about [`ELEMENTWISE_CHUNK`] values per task).
        let consecutive = positions.windows(2).all(|p| p[1].checked_sub(p[0]) == Some(1));
        if let Some(&p0) = positions.first().filter(|_| consecutive) {
            let span = p0 as usize * width..(p0 as usize + rows) * width;
            let per_task = row_task_values(width);
            match &mut cache.0 {
                KvData::F16(c) => self.pool.for_chunks(&mut c[span], per_task, |t, d| {
                    d.convert_from_f32_slice(&src[t * per_task..t * per_task + d.len()]);
                }),
                KvData::Q8_0(c) => {
                    let span = span.start / QK..span.end / QK;
                    self.pool.for_chunks(&mut c[span], per_task / QK, |t, d| {
                        let at = t * per_task;
                        quantize_q8_0_blocks(&src[at..at + d.len() * QK], d);
                    })
                }
            }
            return Ok(());
        }
        for (&pos, row) in positions.iter().zip(src.chunks_exact(width)) {
            let dst = pos as usize * width;
            match &mut cache.0 {
                KvData::F16(c) => c[dst..dst + width].convert_from_f32_slice(row),
                KvData::Q8_0(c) => quantize_q8_0_blocks(row, &mut c[dst / QK..(dst + width) / QK]),
            }
        }
        Ok(())
    }

    /// Attention for the rows of every sequence of `seqs` (`q`: the batch's
    /// `[rows][n_head * head_dim_k]`, `out`: `[rows][n_head * head_dim_v]`) in one dispatch:
    /// the tasks of each sequence's [`attention::Plan`] (query row blocks × KV heads × head
    /// groups) go into a scratch of equal slots (the largest task's size), then are scattered
    /// into place per sequence.
    fn attention(
        &self,
        q: &CpuBuffer,
        seqs: &[SeqAttn<'_, CpuKv>],
        sinks: Option<&CpuWeight>,
        out: &mut CpuBuffer,
    ) -> Result<(), BackendError> {
        let sinks = sinks.map(|w| w.dense("attention")).transpose()?;
        let (q, out) = (&q.0, &mut out.0);
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
                let (scratch, rows) = (&scratch[first * slot..], s.p.rows);
                let out = &mut out[out_span(s)];
                // A prefill's output (qwen3moe, 512 tokens: 8 MB; MLA's: 17 MB) by row blocks
                // in parallel; a decode step's few values on this thread.
                if out.len() < ELEMENTWISE_CHUNK {
                    plan.scatter(scratch, slot, rows, out);
                } else {
                    self.pool.for_chunks(out, plan.block_values(), |b, o| {
                        plan.scatter_block(scratch, slot, rows, b, o)
                    });
                }
            }
        });
        Ok(())
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
            x.iter_mut().zip(g).for_each(|(x, &g)| *x *= rule::sigmoid(g));
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
        self.gated("swiglu_oai", gate, up, len, move |g: &mut [f32], u: &[f32]| {
            g.iter_mut()
                .zip(u)
                .for_each(|(g, &u)| *g = moe::swiglu_oai(*g, u, alpha, limit));
        })
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
        let bias = bias.map(CpuWeight::values).transpose()?;
        route.check_call(
            rows,
            logits.0.len(),
            bias.as_ref().map(|b| b.len()),
            ids.0.len(),
            weights.0.len(),
        )?;
        let (n, k) = (route.n_expert, route.k);
        for r in 0..rows {
            route.row(
                &logits.0[r * n..(r + 1) * n],
                bias,
                &mut ids.0[r * k..(r + 1) * k],
                &mut weights.0[r * k..(r + 1) * k],
            );
        }
        Ok(())
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
        let (k, n, n_mat) = (w.n_in, w.mat_rows(), w.mats);
        if matches!(w.data, WeightData::Dense(_)) {
            return Err(shape(
                "matmul_id",
                format!("'{}' is a vector, expected matrices", w.name),
            ));
        }
        let bias_len = bias.map(|b| b.n_in * b.n_out.max(1));
        m.check(k, n, n_mat, bias_len, x.0.len(), ids.0.len(), out.0.len())?;
        let pairs = m.pairs();
        let ids = read_ids(&ids.0, pairs, n_mat)?;
        // Pairs in expert order (stable: by pair within an expert), and each expert's run.
        let mut order: Vec<usize> = (0..pairs).collect();
        order.sort_by_key(|&p| ids[p]);
        let mut groups: Vec<(usize, usize, usize)> = Vec::new(); // (expert, first, count)
        for (i, &p) in order.iter().enumerate() {
            match groups.last_mut() {
                Some((e, _, c)) if *e == ids[p] => *c += 1,
                _ => groups.push((ids[p], i, 1)),
            }
        }
        // all: every input row prepared once (a token's row feeds all its experts); each
        // group's activations are its pairs' rows of it, in expert order, or `all` itself where
        // those are all its rows in order (each expert of a decoded token's gate and up).
        let all = self.prepare_rows(w.ty, &x.0[..m.inputs() * k], k)?;
        let inputs: Vec<usize> = order.iter().map(|&p| m.input_of(p)).collect();
        let whole = |g: usize| {
            let (_, first, count) = groups[g];
            inputs[first..first + count].iter().copied().eq(0..all.rows())
        };
        let mut acts: Vec<Option<tile::Activations>> = (0..groups.len()).map(|_| None).collect();
        let gather = |g: usize, slot: &mut [Option<tile::Activations>]| {
            let (_, first, count) = groups[g];
            if !whole(g) {
                slot[0] = Some(all.gather(&inputs[first..first + count]));
            }
        };
        // A decode step's few rows are copied here: a parallel op costs more than the copies.
        if pairs < PARALLEL_GATHER_PAIRS {
            acts.chunks_mut(1).enumerate().for_each(|(g, slot)| gather(g, slot));
        } else {
            self.pool.for_chunks(&mut acts, 1, gather);
        }
        let acts: Vec<&tile::Activations> = acts.iter().map(|a| a.as_ref().unwrap_or(&all)).collect();
        let bias = bias.map(CpuWeight::values).transpose()?;
        let tiles = n.div_ceil(MATMUL_TILE);
        let (tile_fn, ty, layout) = (self.kernels.tile, w.ty, w.layout());
        // Each group's outputs go straight to their pairs' rows of `out` ([pairs, n]): the
        // kernels write row `order[first + a]` for the group's activation row `a` (a copy from
        // an expert-ordered buffer was about 2% of a MoE prefill).
        let dst = Columns::new(&mut out.0[..pairs * n], pairs, n);
        self.pool.for_each_index(groups.len() * tiles, |t| {
            let (g, tile) = (t / tiles, t % tiles);
            let (e, first, count) = groups[g];
            let r0 = tile * MATMUL_TILE;
            let nw = MATMUL_TILE.min(n - r0);
            // SAFETY: task `t` alone handles rows `r0..r0 + nw` of expert group `g`, whose pairs
            // (rows of `out`, each in one group once) no other group has; `r0 + nw <= n`.
            let mut out_tile = unsafe { dst.scattered(&order[first..first + count], r0, nw) };
            tile_fn(ty, layout, k, w.rows(e * n + r0, nw), acts[g], &mut out_tile);
        });
        if let Some(b) = &bias {
            self.pool.for_chunks(&mut out.0[..pairs * n], n, |p, dst| {
                let e = ids[p];
                dst.iter_mut().zip(&b[e * n..(e + 1) * n]).for_each(|(d, &v)| *d += v);
            });
        }
        Ok(())
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
        moe::check_combine(rows, slots, width, experts.0.len(), weights.0.len(), out.0.len())?;
        // A prefill's rows in tasks of COMBINE_ROWS (on one thread, with the others waiting,
        // they were 1% of the samples); a decode's rows are one task, which the pool runs in
        // place.
        const COMBINE_ROWS: usize = 16;
        let (experts, weights) = (&experts.0, &weights.0);
        // Rows `COMBINE_ROWS·t..` into `chunk` ([rows, width]).
        let combine = |t: usize, chunk: &mut [f32]| {
            for (i, o) in chunk.chunks_exact_mut(width).enumerate() {
                let r = t * COMBINE_ROWS + i;
                o.fill(0.0);
                for j in 0..slots {
                    let p = r * slots + j;
                    let wgt = weights[p];
                    o.iter_mut()
                        .zip(&experts[p * width..(p + 1) * width])
                        .for_each(|(o, &e)| *o += wgt * e);
                }
            }
        };
        // An empty output (no rows, or width 0) has no chunks, so `combine` never cuts by 0.
        self.pool
            .for_chunks(&mut out.0[..rows * width], COMBINE_ROWS * width, combine);
        Ok(())
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
        let wv = w.values()?;
        p.check(seq, x.0.len(), wv.len(), state.0.len(), out.0.len())?;
        let (ch, kk, rows) = (p.channels, p.kernel, seq.rows);
        let hist = kk - 1;
        let span = seq.row0 * ch..(seq.row0 + rows) * ch;
        // x: [rows][ch] this sequence's inputs; st: [ch][hist] the inputs before them.
        let (x, st, silu) = (&x.0[span.clone()], &state.0[..ch * hist], p.silu);
        let silu_fn = self.kernels.silu;
        if rows == 1 {
            // A decode step, by blocks of channels: each channel's taps, state and weights lie
            // side by side as they are, so nothing is transposed (which, for the row-major
            // loop below, took most of a decode step's conv on the calling thread), and each
            // task moves its own channels' states on. The same sums in the same order.
            // work: each task's outputs [CONV_CHANNELS] and states [CONV_CHANNELS][hist] (empty
            // for a one-tap kernel).
            let mut states = state.0[..ch * hist].chunks_mut((CONV_CHANNELS * hist).max(1));
            let mut work: Vec<(&mut [f32], &mut [f32])> = out.0[span]
                .chunks_mut(CONV_CHANNELS)
                .map(|o| (o, states.next().unwrap_or_default()))
                .collect();
            self.pool.for_chunks(&mut work, 1, |i, w| {
                let (o, s) = &mut w[0];
                let c0 = i * CONV_CHANNELS;
                let (xs, ws) = (&x[c0..c0 + o.len()], &wv[c0 * kk..(c0 + o.len()) * kk]);
                // The 4-tap kernel of the models in the field unrolled (its taps in registers,
                // no copy for the state's shift); the sums are the general loop's.
                if kk == 4 {
                    conv_step::<3, 4>(o, s, ws, xs);
                } else {
                    for (k, ov) in o.iter_mut().enumerate() {
                        let (sc, wc) = (&mut s[k * hist..(k + 1) * hist], &ws[k * kk..(k + 1) * kk]);
                        let mut acc = 0f32;
                        for (&a, &b) in sc.iter().chain([&xs[k]]).zip(wc) {
                            acc += a * b;
                        }
                        *ov = acc;
                        // The oldest input leaves the channel's state, the new one joins its end.
                        if let Some(last) = sc.len().checked_sub(1) {
                            sc.copy_within(1.., 0);
                            sc[last] = xs[k];
                        }
                    }
                }
                if silu {
                    silu_fn(o);
                }
            });
            return Ok(());
        }
        // wt: [kernel][ch] and sx: [hist][ch], the weights and the state's inputs transposed,
        // so that each tap meets a whole input row (the loop over channels vectorizes).
        let (mut wt, mut sx) = (vec![0f32; kk * ch], vec![0f32; hist * ch]);
        for c in 0..ch {
            (0..kk).for_each(|j| wt[j * ch + c] = wv[c * kk + j]);
            (0..hist).for_each(|u| sx[u * ch + c] = st[c * hist + u]);
        }
        // Input row `u` of the sequence "state, then x".
        let input = |u: usize| {
            if u < hist {
                &sx[u * ch..(u + 1) * ch]
            } else {
                &x[(u - hist) * ch..(u - hist + 1) * ch]
            }
        };
        self.pool.for_chunks(&mut out.0[span], CONV_ROWS * ch, |i, o| {
            for (r, orow) in o.chunks_exact_mut(ch).enumerate() {
                // Output row t's taps are input rows t..t + kernel, each value summed in f32
                // from the oldest tap, as ggml's `ssm_conv` sums it.
                let t = i * CONV_ROWS + r;
                orow.fill(0.0);
                for (j, w) in wt.chunks_exact(ch).enumerate() {
                    for ((ov, &a), &b) in orow.iter_mut().zip(input(t + j)).zip(w) {
                        *ov += a * b;
                    }
                }
                if silu {
                    silu_fn(orow);
                }
            }
        });
        // The new state: the last `hist` input rows of "state, then x", as [ch][hist].
        let mut new = vec![0f32; ch * hist];
        for u in 0..hist {
            for (c, &v) in input(rows + u).iter().enumerate() {
                new[c * hist + u] = v;
            }
        }
        state.0[..ch * hist].copy_from_slice(&new);
        Ok(())
    }

    fn delta_gates(
        &self,
        alpha: &mut CpuBuffer,
        beta: &mut CpuBuffer,
        rows: usize,
        dt_bias: &CpuWeight,
        a: &CpuWeight,
    ) -> Result<(), BackendError> {
        let (dt, av) = (dt_bias.values()?, a.values()?);
        let n = dt.len();
        rule::check_gates(rows, n, alpha.0.len(), beta.0.len(), n, av.len())?;
        let alpha = alpha.0[..rows * n].chunks_exact_mut(n);
        for (ar, br) in alpha.zip(beta.0[..rows * n].chunks_exact_mut(n)) {
            for (h, (al, be)) in ar.iter_mut().zip(br.iter_mut()).enumerate() {
                (*al, *be) = rule::gates(*al, *be, dt[h], av[h]);
            }
        }
        Ok(())
    }

    /// Token by token: with each row of a head's state kept in registers through a token
    /// (`recurrent::simd`), it is faster here than the chunked form's loops (`cargo bench
    /// --bench recurrent`), and prefill gives decode's bits.
    fn delta_form(&self, _rows: usize) -> Form {
        Form::Recurrent
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
        p.check(
            seq,
            form,
            qkv.0.len(),
            gate.0.len(),
            beta.0.len(),
            state.0.len(),
            out.0.len(),
        )?;
        let (rows, row0) = (seq.rows, seq.row0);
        if rows == 0 {
            return Ok(());
        }
        let (hk, hv, dk, dv, qkv_dim) = (p.n_k_heads, p.n_v_heads, p.d_k, p.d_v, p.qkv_dim());
        let kw = hk * dk;
        // src: [rows][qkv_dim] this sequence's rows.
        let src = &qkv.0[row0 * qkv_dim..(row0 + rows) * qkv_dim];
        // qk: [rows][2][hk][dk] q and k of each key head, normed once (several value heads may
        // read one key head), q scaled.
        let mut qk = vec![0f32; rows * 2 * kw];
        let scale = p.q_scale();
        self.pool.for_chunks(&mut qk, 2 * kw, |t, dst| {
            dst.copy_from_slice(&src[t * qkv_dim..t * qkv_dim + 2 * kw]);
            for (i, head) in dst.chunks_exact_mut(dk).enumerate() {
                let s = if i < hk { scale } else { 1.0 };
                match p.l2_eps {
                    Some(eps) => rule::l2_normalize(head, eps, s),
                    None => head.iter_mut().for_each(|v| *v *= s),
                }
            }
        });
        let (gate, beta) = (
            &gate.0[row0 * hv..(row0 + rows) * hv],
            &beta.0[row0 * hv..(row0 + rows) * hv],
        );
        // heads: [hv][rows][dv] each head's outputs, scattered into `out` afterwards.
        let mut heads = vec![0f32; hv * rows * dv];
        let mut work: Vec<(&mut [f32], &mut [f32])> = state.0[..p.state_len()]
            .chunks_exact_mut(dk * dv)
            .zip(heads.chunks_exact_mut(rows * dv))
            .collect();
        let qk = &qk;
        self.pool.for_chunks(&mut work, 1, |h, w| {
            let (s, o) = &mut w[0];
            let inp = recurrent::HeadInputs {
                qk,
                qkv: src,
                gate,
                beta,
                p: *p,
                h,
                kh: p.key_head(h),
            };
            recurrent::run_head(&inp, form, rows, s, o);
        });
        let out = &mut out.0[row0 * hv * dv..(row0 + rows) * hv * dv];
        for (h, head) in heads.chunks_exact(rows * dv).enumerate() {
            for (t, ot) in head.chunks_exact(dv).enumerate() {
                out[(t * hv + h) * dv..][..dv].copy_from_slice(ot);
            }
        }
        Ok(())
    }

    fn rmsnorm_gated(
        &self,
        x: &mut CpuBuffer,
        z: &CpuBuffer,
        w: &CpuWeight,
        groups: usize,
        eps: f32,
    ) -> Result<(), BackendError> {
        let wv = w.dense("rmsnorm_gated")?;
        let g = wv.len();
        check_gated_norm(groups, g, x.0.len(), z.0.len())?;
        let z = &z.0[..groups * g];
        let per_task = row_task_values(g);
        self.pool.for_chunks(&mut x.0[..groups * g], per_task, |i, xs| {
            let zs = &z[i * per_task..i * per_task + xs.len()];
            // gate: [g] silu(z) of one group.
            let mut gate = vec![0f32; g];
            for (xg, zg) in xs.chunks_exact_mut(g).zip(zs.chunks_exact(g)) {
                ops::rmsnorm_inplace(xg, wv, eps);
                gate.copy_from_slice(zg);
                (self.kernels.silu)(&mut gate);
                xg.iter_mut().zip(&gate).for_each(|(v, &s)| *v *= s);
            }
        });
        Ok(())
    }

    /// Runs of about [`ELEMENTWISE_CHUNK`] values per task: a prefill's latent-attention copies
    /// (deepseek2, 512 tokens: 17-19 MB each) on one thread were most of the work done alone
    /// between its ops. Runs that overlap in `dst` go in order on this thread (the last wins).
    fn copy_strided(&self, src: &CpuBuffer, dst: &mut CpuBuffer, c: &Strided) -> Result<(), BackendError> {
        c.check(src.0.len(), dst.0.len())?;
        let (w, ds) = (c.width, c.dst_stride);
        let per_task = row_task_values(w) / w.max(1);
        if w == 0 || ds < w || c.count <= per_task {
            for i in 0..c.count {
                let (s, d) = (c.src_off + i * c.src_stride, c.dst_off + i * c.dst_stride);
                dst.0[d..d + w].copy_from_slice(&src.0[s..s + w]);
            }
            return Ok(());
        }
        // region: the runs' span of `dst`, `per_task` strides per task (the last run ends
        // at its width, so the last stride of the region may be short).
        let region = &mut dst.0[c.dst_off..c.dst_off + (c.count - 1) * ds + w];
        let src = &src.0;
        self.pool.for_chunks(region, per_task * ds, |t, d| {
            for (j, run) in d.chunks_mut(ds).enumerate() {
                let s = c.src_off + (t * per_task + j) * c.src_stride;
                run[..w].copy_from_slice(&src[s..s + w]);
            }
        });
        Ok(())
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
        self.copy_parts(&src.0[row0 * width..(row0 + rows) * width], &mut dst.0[..rows * width]);
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
        self.copy_parts(&src.0[..rows * width], &mut dst.0[row0 * width..(row0 + rows) * width]);
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
    /// `dst = src` (equal lengths) by parts of [`ELEMENTWISE_CHUNK`] values in parallel: a
    /// recurrent checkpoint is a copy of 1 MB per layer (qwen35); a copy of one part stays on
    /// this thread.
    fn copy_parts(&self, src: &[f32], dst: &mut [f32]) {
        self.pool.for_chunks(dst, ELEMENTWISE_CHUNK, |t, d| {
            let at = t * ELEMENTWISE_CHUNK;
            d.copy_from_slice(&src[at..at + d.len()]);
        });
    }

    /// `kernels.prepare` of the rows of `x` (`k` values each): a batch of at least
    /// [`PREPARE_SPLIT_ROWS`] rows per worker in one piece per worker, prepared in parallel and
    /// joined ([`tile::Activations::concat`]), the same activations as one call without one
    /// thread converting the whole batch while the others wait.
    fn prepare_rows(&self, ty: quant::GgmlType, x: &[f32], k: usize) -> Result<tile::Activations, BackendError> {
        let rows = x.len().checked_div(k).unwrap_or(0);
        let threads = self.pool.threads();
        if threads < 2 || rows < threads * PREPARE_SPLIT_ROWS {
            return Ok((self.kernels.prepare)(ty, x, k)?);
        }
        let per = rows.div_ceil(threads);
        // parts: [pieces] each piece's activations, filled by its task.
        let mut parts: Vec<Option<Result<tile::Activations, quant::QuantError>>> =
            (0..rows.div_ceil(per)).map(|_| None).collect();
        let prepare = self.kernels.prepare;
        self.pool.for_chunks(&mut parts, 1, |i, slot| {
            let (r0, r1) = (i * per, ((i + 1) * per).min(rows));
            slot[0] = Some(prepare(ty, &x[r0 * k..r1 * k], k));
        });
        let parts = parts.into_iter().flatten().collect::<Result<Vec<_>, _>>()?;
        Ok(tile::Activations::concat(parts))
    }

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

/// One decode step of a `K`-tap conv (`H` = `K` - 1 inputs of history) on a block of channels:
/// `o` [ch] the outputs, `s` [ch][H] their states (oldest input first), `w` [ch][K] their taps,
/// `x` [ch] the new inputs. Each output is `((0 + s0·w0) + s1·w1 + ...) + x·w_H`, in that order,
/// and the state moves on by one input.
#[inline]
fn conv_step<const H: usize, const K: usize>(o: &mut [f32], s: &mut [f32], w: &[f32], x: &[f32]) {
    debug_assert_eq!(H + 1, K);
    for (((ov, sc), wc), &xv) in o.iter_mut().zip(s.chunks_exact_mut(H)).zip(w.chunks_exact(K)).zip(x) {
        let sc: &mut [f32; H] = sc.try_into().expect("H values per state");
        let wc: &[f32; K] = wc.try_into().expect("K taps per channel");
        let mut acc = 0f32;
        for t in 0..H {
            acc += sc[t] * wc[t];
        }
        *ov = acc + xv * wc[H];
        for t in 1..H {
            sc[t - 1] = sc[t];
        }
        sc[H - 1] = xv;
    }
}

#[cfg(test)]
mod tests {
    use super::{argmax_row, CpuBackend, KvData, ELEMENTWISE_CHUNK};
    use crate::backend::interface::Backend;
    use crate::backend::kv::KvType;
    use crate::backend::moe::Strided;
    use crate::sample::argmax;

    /// Values that differ at every index (and round differently to f16 and Q8_0).
    fn ramp(len: usize) -> Vec<f32> {
        (0..len).map(|i| ((i * 7919) % 1013) as f32 * 0.37 - 150.0).collect()
    }

    #[test]
    fn parallel_copies_match_the_serial_runs() {
        let be = CpuBackend::new(2).unwrap();
        let src = ramp(200_000);
        // Many runs (several tasks), a short last stride, and overlapping runs (serial, the last
        // wins).
        for (count, width, src_stride, dst_stride) in [(5000, 13, 29, 17), (3000, 40, 40, 40), (9000, 9, 11, 5)] {
            let c = Strided {
                count,
                width,
                src_off: 3,
                src_stride,
                dst_off: 2,
                dst_stride,
            };
            assert!(count * width > ELEMENTWISE_CHUNK);
            let len = 2 + (count - 1) * dst_stride + width + 4;
            let mut want = vec![0.5f32; len];
            for i in 0..count {
                let (s, d) = (3 + i * src_stride, 2 + i * dst_stride);
                want[d..d + width].copy_from_slice(&src[s..s + width]);
            }
            let mut dst = be.alloc(len).unwrap();
            be.write(&mut dst, &vec![0.5; len]).unwrap();
            be.copy_strided(&super::CpuBuffer(src.clone()), &mut dst, &c).unwrap();
            assert_eq!(
                dst.as_slice(),
                &want[..],
                "{count} runs of {width}, strides {src_stride}/{dst_stride}"
            );
        }
        // copy_rows by parts: three rows of 50,000 values from row 1, into a longer buffer.
        let mut dst = be.alloc(160_000).unwrap();
        be.copy_rows(&super::CpuBuffer(src.clone()), 1, 3, 50_000, &mut dst)
            .unwrap();
        assert_eq!(&dst.as_slice()[..150_000], &src[50_000..200_000]);
        assert!(dst.as_slice()[150_000..].iter().all(|&v| v == 0.0));
    }

    #[test]
    fn a_prefills_kv_store_matches_storing_its_rows_one_by_one() {
        let be = CpuBackend::new(2).unwrap();
        let (width, rows, row0, pos0) = (96, 700, 5, 31);
        let src = super::CpuBuffer(ramp((row0 + rows) * width));
        let positions: Vec<u32> = (pos0..pos0 + rows as u32).collect();
        for ty in [KvType::F16, KvType::Q8_0] {
            let len = (pos0 as usize + rows + 3) * width;
            let (mut all, mut one) = (be.alloc_kv(len, ty).unwrap(), be.alloc_kv(len, ty).unwrap());
            be.kv_store(&mut all, &src, row0, width, &positions).unwrap();
            for (i, p) in positions.iter().enumerate() {
                be.kv_store(&mut one, &src, row0 + i, width, std::slice::from_ref(p))
                    .unwrap();
            }
            let bytes = |kv: &super::CpuKv| match &kv.0 {
                KvData::F16(v) => bytemuck::cast_slice::<_, u8>(v).to_vec(),
                KvData::Q8_0(b) => bytemuck::cast_slice::<_, u8>(b).to_vec(),
            };
            assert_eq!(bytes(&all), bytes(&one), "{ty}");
            // And the F16 rows are each value rounded on its own.
            if let KvData::F16(v) = &all.0 {
                let want: Vec<half::f16> = src.as_slice()[row0 * width..]
                    .iter()
                    .map(|&x| half::f16::from_f32(x))
                    .collect();
                assert_eq!(&v[pos0 as usize * width..(pos0 as usize + rows) * width], &want[..]);
            }
        }
    }

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
