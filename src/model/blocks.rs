//! The blocks the family graphs are built from, written once against [`Backend`]: a pass's
//! activation scratch, attention over each sequence's own KV cache, the gated FFN, and the
//! output head.
//!
//! A pass may hold several sequences (continuous batching): their rows are stacked, so every
//! weight matmul sees all of them at once, and each row carries its own position, so rope runs
//! over the whole batch at once and each sequence's K/V rows are stored straight from the
//! batch into its cache. Attention then reads each sequence's rows of q at their offset.
//! Nothing is copied in or out per sequence, and a sequence gets the same logits alone or
//! batched (`tests/batch_forward.rs`).

use std::any::Any;

use super::error::ModelError;
use super::hparams::{Common, Heads};
use super::state::{check_cache_heads, KvCache, SeqState};
use super::tensors::Loader;
use crate::backend::rotation::KvRotation;
use crate::backend::{AttnParams, Backend, KvType, Readback, Rope, SeqAttn};
use crate::sample::Candidates;

/// One sequence's part of a pass.
pub struct SeqChunk<'a, B: Backend> {
    /// The sequence's state; positions `pos0..pos0 + tokens.len()` are written.
    pub state: &'a mut SeqState<B>,
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`.
    pub pos0: usize,
    /// The output head runs for rows `logits_from..tokens.len()` of this chunk.
    pub logits_from: usize,
}

/// A pass's sequences with what every block needs about their rows.
pub struct Batch<'a, 'b, B: Backend> {
    pub seqs: &'a mut [SeqChunk<'b, B>],
    /// `[rows]` token ids, sequence after sequence.
    pub tokens: Vec<u32>,
    /// `[rows]` the position of each row.
    pub positions: Vec<u32>,
}

impl<'a, 'b, B: Backend> Batch<'a, 'b, B> {
    /// The batch of `seqs`, whose positions must fit 32 bits (the caller checked them against
    /// the contexts).
    pub fn new(seqs: &'a mut [SeqChunk<'b, B>]) -> Self {
        let tokens = seqs.iter().flat_map(|q| q.tokens.iter().copied()).collect();
        let positions = seqs
            .iter()
            .flat_map(|q| (q.pos0..q.pos0 + q.tokens.len()).map(|p| p as u32))
            .collect();
        Batch {
            seqs,
            tokens,
            positions,
        }
    }

    /// Rows in all.
    pub fn rows(&self) -> usize {
        self.tokens.len()
    }

    /// The first row of each sequence.
    pub fn row0s(&self) -> Vec<usize> {
        self.seqs
            .iter()
            .scan(0, |r, q| {
                let r0 = *r;
                *r += q.tokens.len();
                Some(r0)
            })
            .collect()
    }

    /// The rows the output head runs for, ascending.
    pub fn head_rows(&self) -> Vec<usize> {
        self.seqs
            .iter()
            .zip(self.row0s())
            .flat_map(|(q, r0)| r0 + q.logits_from..r0 + q.tokens.len())
            .collect()
    }
}

/// The widths a family's scratch needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScratchDims {
    pub n_embd: usize,
    /// q: `n_head * head_dim_k`.
    pub q_dim: usize,
    /// k: `n_head_kv * head_dim_k`.
    pub k_dim: usize,
    /// v: `n_head_kv * head_dim_v`.
    pub v_dim: usize,
    /// Attention output: `n_head * head_dim_v`.
    pub att_dim: usize,
    pub n_ff: usize,
    pub n_vocab: usize,
}

impl ScratchDims {
    /// The widths of a transformer with `heads` and a gated FFN of `n_ff`.
    pub fn new(c: &Common, h: &Heads, n_ff: usize) -> Self {
        ScratchDims {
            n_embd: c.n_embd,
            q_dim: h.q_dim(),
            k_dim: h.k_dim(),
            v_dim: h.v_dim(),
            att_dim: h.out_dim(),
            n_ff,
            n_vocab: c.n_vocab,
        }
    }
}

/// A positional KV cache in format `ty` for `n_layer` layers of `heads`, as a sequence state.
pub fn kv_state<B: Backend>(
    be: &B,
    h: &Heads,
    n_layer: usize,
    n_ctx: usize,
    ty: KvType,
) -> Result<SeqState<B>, ModelError> {
    check_cache_heads(ty, h.head_dim_k, h.head_dim_v)?;
    let widths = vec![(h.k_dim(), h.v_dim()); n_layer];
    Ok(SeqState::new(KvCache::new(be, &widths, n_ctx, ty)?))
}

/// Activation scratch of a forward pass, sized for passes of up to `rows` tokens.
pub struct Scratch<B: Backend> {
    pub(super) rows: usize,
    pub(super) logit_rows: usize,
    /// Residual stream [rows, n_embd].
    pub x: B::Buffer,
    /// Normed input / block output [rows, n_embd].
    pub xn: B::Buffer,
    /// [rows, q_dim]
    pub q: B::Buffer,
    /// [rows, k_dim]
    pub k: B::Buffer,
    /// [rows, v_dim]
    pub v: B::Buffer,
    /// Attention output before the projection [rows, att_dim].
    pub att: B::Buffer,
    /// [rows, n_ff]
    pub gate: B::Buffer,
    pub up: B::Buffer,
    /// One row gathered for the output head [1, n_embd].
    row: B::Buffer,
    /// Rows selected for the output head [logit_rows, n_embd].
    sel: B::Buffer,
    /// [logit_rows, n_vocab]
    logits: B::Buffer,
    /// What the family keeps besides (routed experts', latent attention's, the hybrid layers'
    /// scratch): its own types, which only it reads ([`Family::family_scratch`]).
    ///
    /// [`Family::family_scratch`]: super::family::Family::family_scratch
    pub family: FamilyScratch,
}

/// The scratch a family keeps beside the shared buffers, one value per type, made by the
/// family ([`super::family::Family::family_scratch`]) and found by type where it is used:
/// so a shared block names no family, and a new family adds its scratch without editing
/// this file.
#[derive(Default)]
pub struct FamilyScratch(Vec<Box<dyn Any + Send>>);

impl FamilyScratch {
    /// This scratch with `value` too.
    pub fn with<T: Any + Send>(mut self, value: T) -> Self {
        self.0.push(Box::new(value));
        self
    }

    /// The value of type `T`, if the family made one.
    pub fn get<T: Any>(&self) -> Option<&T> {
        self.0.iter().find_map(|b| b.downcast_ref())
    }

    /// The value of type `T`, if the family made one.
    pub fn get_mut<T: Any>(&mut self) -> Option<&mut T> {
        self.0.iter_mut().find_map(|b| b.downcast_mut())
    }
}

impl<B: Backend> Scratch<B> {
    /// Scratch for passes of up to `rows` tokens in all; the output head runs `logit_rows` rows
    /// at a time.
    /// `family(rows)` makes the family's own scratch ([`FamilyScratch`]).
    pub fn new(
        be: &B,
        d: ScratchDims,
        family: impl FnOnce(usize) -> Result<FamilyScratch, ModelError>,
        rows: usize,
        logit_rows: usize,
    ) -> Result<Self, ModelError> {
        let rows = rows.max(1);
        let logit_rows = logit_rows.max(1);
        let a = |width: usize, n: usize| -> Result<B::Buffer, ModelError> {
            let len = n.checked_mul(width).ok_or(ModelError::ChunkTooLarge {
                rows: n,
                capacity: usize::MAX / width.max(1),
            })?;
            Ok(be.alloc(len)?)
        };
        Ok(Scratch {
            rows,
            logit_rows,
            x: a(d.n_embd, rows)?,
            xn: a(d.n_embd, rows)?,
            q: a(d.q_dim, rows)?,
            k: a(d.k_dim, rows)?,
            v: a(d.v_dim, rows)?,
            att: a(d.att_dim, rows)?,
            gate: a(d.n_ff, rows)?,
            up: a(d.n_ff, rows)?,
            row: a(d.n_embd, 1)?,
            sel: a(d.n_embd, logit_rows)?,
            logits: a(d.n_vocab, logit_rows)?,
            family: family(rows)?,
        })
    }

    /// The largest pass this scratch holds, in tokens.
    pub fn rows(&self) -> usize {
        self.rows
    }
}

/// The attention weights of one layer.
pub struct AttnWeights<B: Backend> {
    pub wq: B::Weight,
    pub wk: B::Weight,
    pub wv: B::Weight,
    pub wo: B::Weight,
    /// q/k/v biases (qwen2).
    pub bias: Option<[B::Weight; 3]>,
    /// Per-head q/k RMS norms (qwen3, gemma3).
    pub qk_norm: Option<[B::Weight; 2]>,
    /// Per-head sink logits.
    pub sinks: Option<B::Weight>,
}

/// Which optional attention tensors a family's layers have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AttnTensors {
    /// `attn_{q,k,v}.bias`.
    pub bias: bool,
    /// `attn_{q,k}_norm.weight`, per head.
    pub qk_norm: bool,
    /// `attn_{q,k}_norm.weight` over the whole q and k projections (olmoe).
    pub qk_norm_whole: bool,
}

impl<B: Backend> AttnWeights<B> {
    /// Layer `il`'s attention tensors, shapes checked against `h` (`e`: the embedding width).
    pub fn load(t: &Loader<'_, B>, il: usize, e: usize, h: &Heads, has: AttnTensors) -> Result<Self, ModelError> {
        let n = |s: &str| Loader::<B>::blk(il, s);
        let bias = if has.bias {
            Some([
                t.req(&n("attn_q.bias"), &[h.q_dim()])?,
                t.req(&n("attn_k.bias"), &[h.k_dim()])?,
                t.req(&n("attn_v.bias"), &[h.v_dim()])?,
            ])
        } else {
            None
        };
        let qk_norm = if has.qk_norm || has.qk_norm_whole {
            let (qw, kw) = if has.qk_norm_whole {
                (h.q_dim(), h.k_dim())
            } else {
                (h.head_dim_k, h.head_dim_k)
            };
            Some([
                t.req(&n("attn_q_norm.weight"), &[qw])?,
                t.req(&n("attn_k_norm.weight"), &[kw])?,
            ])
        } else {
            None
        };
        Ok(AttnWeights {
            wq: t.req(&n("attn_q.weight"), &[e, h.q_dim()])?,
            wk: t.req(&n("attn_k.weight"), &[e, h.k_dim()])?,
            wv: t.req(&n("attn_v.weight"), &[e, h.v_dim()])?,
            wo: t.req(&n("attn_output.weight"), &[h.out_dim(), e])?,
            bias,
            qk_norm,
            sinks: None,
        })
    }
}

/// The attention parameters of one layer.
pub struct AttnLayer<'a> {
    pub heads: super::hparams::Heads,
    pub rope: &'a Rope,
    /// Sliding window (`None`: full causal attention).
    pub window: Option<usize>,
    /// Multiplies q·k.
    pub kq_scale: f32,
    /// Multiplies q after rope (gemma3 pre-scales q instead of q·k).
    pub q_scale: Option<f32>,
    pub softcap: Option<f32>,
    pub eps: f32,
    /// q/k norms span the whole projections, not each head.
    pub qk_norm_whole: bool,
}

/// The positional KV cache of a sequence's state (every family here keeps one).
fn kv_of<B: Backend + 'static>(state: &mut SeqState<B>) -> Result<&mut KvCache<B>, ModelError> {
    state.kv_mut().ok_or(ModelError::ForeignState)
}

/// Attention sub-block of layer `il` over all sequences of the batch: reads the normed input
/// `s.xn`, writes the projected attention output back to `s.xn` (`rows x n_embd`).
/// `factors`: the rope's per-frequency divisors (llama3 scaling).
pub fn attention<B: Backend + 'static>(
    be: &B,
    batch: &mut Batch<'_, '_, B>,
    s: &mut Scratch<B>,
    il: usize,
    l: &AttnLayer<'_>,
    w: &AttnWeights<B>,
    factors: Option<&B::Weight>,
) -> Result<(), ModelError> {
    let rows = batch.rows();
    let h = l.heads;
    // q: [rows, q_dim]; k: [rows, k_dim]; v: [rows, v_dim]
    be.matmul(&w.wq, &s.xn, rows, &mut s.q)?;
    be.matmul(&w.wk, &s.xn, rows, &mut s.k)?;
    be.matmul(&w.wv, &s.xn, rows, &mut s.v)?;
    if let Some([bq, bk, bv]) = &w.bias {
        be.add_bias(&mut s.q, bq, rows)?;
        be.add_bias(&mut s.k, bk, rows)?;
        be.add_bias(&mut s.v, bv, rows)?;
    }
    if let Some([qn, kn]) = &w.qk_norm {
        // A norm's groups are its weight's length: per head, or the whole projection.
        let (gq, gk) = if l.qk_norm_whole {
            (rows, rows)
        } else {
            (rows * h.n_head, rows * h.n_head_kv)
        };
        be.rmsnorm_inplace(&mut s.q, qn, gq, l.eps)?;
        be.rmsnorm_inplace(&mut s.k, kn, gk, l.eps)?;
    }
    // Every row at its own position, the whole batch at once.
    be.rope(&mut s.q, h.n_head, h.head_dim_k, &batch.positions, l.rope, factors)?;
    be.rope(&mut s.k, h.n_head_kv, h.head_dim_k, &batch.positions, l.rope, factors)?;
    if let Some(qs) = l.q_scale {
        be.scale(&mut s.q, rows * h.q_dim(), qs)?;
    }
    let heads = AttnParams {
        rows: 0,
        pos0: 0,
        n_head: h.n_head,
        n_head_kv: h.n_head_kv,
        head_dim_k: h.head_dim_k,
        head_dim_v: h.head_dim_v,
        scale: l.kq_scale,
        window: l.window,
        softcap: l.softcap,
        v_in_k: false,
    };
    store_and_attend(
        be,
        batch,
        il,
        &heads,
        [&mut s.q, &mut s.k, &mut s.v],
        w.sinks.as_ref(),
        &mut s.att,
    )?;
    be.matmul(&w.wo, &s.att, rows, &mut s.xn)?;
    Ok(())
}

/// Store each sequence's K rows of `k` (and V rows of `v`, unless `heads.v_in_k`: then V is
/// read from the K cache) into its cache at layer `il`, straight from the batch, then attend
/// every sequence's query rows of `q` over its own cache in one call, into `out`. `heads` gives
/// the layer's head layout and scores; each sequence's rows and first position are its own.
///
/// Over a quantized cache the heads rotate first, as llama.cpp's do ([`KvRotation`]): q and k
/// by one Walsh-Hadamard matrix (q·k is unchanged), v by another and the output back by it, so
/// `q`, `k` and `v` come back rotated. Every sequence of a batch has the same cache format.
pub fn store_and_attend<B: Backend + 'static>(
    be: &B,
    batch: &mut Batch<'_, '_, B>,
    il: usize,
    heads: &AttnParams,
    [q, k, v]: [&mut B::Buffer; 3],
    sinks: Option<&B::Weight>,
    out: &mut B::Buffer,
) -> Result<(), ModelError> {
    let k_dim = heads.n_head_kv * heads.head_dim_k;
    let v_dim = heads.n_head_kv * heads.head_dim_v;
    let rows = batch.rows();
    let rot = cache_rotation(batch, heads)?;
    if let Some(n) = rot.k {
        be.hadamard(q, rows * heads.n_head * heads.head_dim_k / n, n)?;
        be.hadamard(k, rows * k_dim / n, n)?;
    }
    if let Some(n) = rot.v {
        be.hadamard(v, rows * v_dim / n, n)?;
    }
    let row0s = batch.row0s();
    for (seq, &r0) in batch.seqs.iter_mut().zip(&row0s) {
        let positions = &batch.positions[r0..r0 + seq.tokens.len()];
        let (kc, vc) = kv_of(seq.state)?.layer_mut(il);
        be.kv_store(kc, k, r0, k_dim, positions)?;
        if !heads.v_in_k {
            be.kv_store(vc, v, r0, v_dim, positions)?;
        }
    }
    let mut items = Vec::with_capacity(batch.seqs.len());
    for (seq, &row0) in batch.seqs.iter().zip(&row0s) {
        let (k_cache, v_cache) = seq.state.kv().ok_or(ModelError::ForeignState)?.layer(il);
        items.push(SeqAttn {
            row0,
            p: AttnParams {
                rows: seq.tokens.len(),
                pos0: seq.pos0,
                ..*heads
            },
            k_cache,
            v_cache: if heads.v_in_k { k_cache } else { v_cache },
        });
    }
    be.attention(q, &items, sinks, out)?;
    if let Some(n) = rot.v {
        be.hadamard(out, rows * heads.n_head * heads.head_dim_v / n, n)?;
    }
    Ok(())
}

/// The rotation of a layer's heads over the batch's caches: their one format's
/// ([`KvRotation::for_cache`]).
fn cache_rotation<B: Backend + 'static>(
    batch: &Batch<'_, '_, B>,
    heads: &AttnParams,
) -> Result<KvRotation, ModelError> {
    let mut first = None;
    for (seq, s) in batch.seqs.iter().enumerate() {
        let ty = s.state.kv().ok_or(ModelError::ForeignState)?.kv_type();
        match first {
            None => first = Some(ty),
            Some(f) if f != ty => {
                return Err(ModelError::BadBatch {
                    seq,
                    problem: format!("its KV cache is {ty}, the batch's first sequence's is {f}"),
                })
            }
            Some(_) => {}
        }
    }
    Ok(first.map_or_else(KvRotation::default, |ty| {
        KvRotation::for_cache(ty, heads.head_dim_k, heads.head_dim_v, heads.v_in_k)
    }))
}

/// The weights of a gated FFN.
pub struct FfnWeights<B: Backend> {
    pub gate: B::Weight,
    pub up: B::Weight,
    pub down: B::Weight,
}

impl<B: Backend> FfnWeights<B> {
    /// Layer `il`'s FFN tensors (`e`: the embedding width).
    pub fn load(t: &Loader<'_, B>, il: usize, e: usize, n_ff: usize) -> Result<Self, ModelError> {
        let n = |s: &str| Loader::<B>::blk(il, s);
        Ok(FfnWeights {
            gate: t.req(&n("ffn_gate.weight"), &[e, n_ff])?,
            up: t.req(&n("ffn_up.weight"), &[e, n_ff])?,
            down: t.req(&n("ffn_down.weight"), &[n_ff, e])?,
        })
    }
}

/// The gate's activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// SwiGLU: `silu(gate) * up`.
    Silu,
    /// GEGLU: `gelu_tanh(gate) * up`.
    Gelu,
}

/// Gated FFN over `rows` rows: reads `s.xn`, writes `s.xn`.
pub fn ffn<B: Backend>(
    be: &B,
    s: &mut Scratch<B>,
    rows: usize,
    n_ff: usize,
    w: &FfnWeights<B>,
    gate: Gate,
) -> Result<(), ModelError> {
    // gate, up: [rows, n_ff]
    be.matmul(&w.gate, &s.xn, rows, &mut s.gate)?;
    be.matmul(&w.up, &s.xn, rows, &mut s.up)?;
    match gate {
        Gate::Silu => be.swiglu(&mut s.gate, &s.up, rows * n_ff)?,
        Gate::Gelu => be.geglu(&mut s.gate, &s.up, rows * n_ff)?,
    }
    be.matmul(&w.down, &s.gate, rows, &mut s.xn)?;
    Ok(())
}

/// What the output head hands back for its rows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum HeadWant<'a> {
    /// The logits, `n_vocab` per row.
    Logits,
    /// Only each row's argmax id: greedy decoding on a GPU backend reads back one id per row.
    Argmax,
    /// Only each row's sampler candidates ([`Backend::top_k`]): a sampled decode step on a GPU
    /// backend reads back a few hundred bytes.
    TopK { k: usize, gather: &'a [u32] },
    /// The rows' hidden states after the output norm, `n_embd` per row, and no output
    /// projection: what embeddings are pooled from (llama.cpp's `t_embd`).
    Hidden,
}

/// The output head's result for the rows asked for, in row order.
#[derive(Debug, Clone, PartialEq)]
pub enum HeadResult {
    /// `[rows][n_vocab]`, row-major.
    Logits(Vec<f32>),
    Ids(Vec<u32>),
    Candidates(Vec<Candidates>),
    /// `[rows][n_embd]`, row-major.
    Hidden(Vec<f32>),
}

impl HeadResult {
    /// No rows of the kind `want` asks for.
    pub fn empty(want: HeadWant<'_>) -> HeadResult {
        match want {
            HeadWant::Logits => HeadResult::Logits(Vec::new()),
            HeadWant::Argmax => HeadResult::Ids(Vec::new()),
            HeadWant::TopK { .. } => HeadResult::Candidates(Vec::new()),
            HeadWant::Hidden => HeadResult::Hidden(Vec::new()),
        }
    }

    /// Split into consecutive results of `counts[i]` rows each (`n_vocab` values per row of
    /// logits, `n_embd` per hidden row).
    pub fn split(self, counts: &[usize], n_vocab: usize, n_embd: usize) -> Vec<HeadResult> {
        fn cut<T>(mut v: Vec<T>, counts: &[usize], per_row: usize, wrap: fn(Vec<T>) -> HeadResult) -> Vec<HeadResult> {
            let mut out = Vec::with_capacity(counts.len());
            for &n in counts {
                let rest = v.split_off((n * per_row).min(v.len()));
                out.push(wrap(v));
                v = rest;
            }
            out
        }
        match self {
            HeadResult::Logits(l) => cut(l, counts, n_vocab, HeadResult::Logits),
            HeadResult::Ids(ids) => cut(ids, counts, 1, HeadResult::Ids),
            HeadResult::Candidates(c) => cut(c, counts, 1, HeadResult::Candidates),
            HeadResult::Hidden(h) => cut(h, counts, n_embd, HeadResult::Hidden),
        }
    }

    /// One result from consecutive parts of the same kind (at least one).
    pub fn concat(parts: Vec<HeadResult>) -> HeadResult {
        let mut it = parts.into_iter();
        let Some(mut first) = it.next() else {
            return HeadResult::Logits(Vec::new());
        };
        for p in it {
            match (&mut first, p) {
                (HeadResult::Logits(a), HeadResult::Logits(b)) => a.extend(b),
                (HeadResult::Ids(a), HeadResult::Ids(b)) => a.extend(b),
                (HeadResult::Candidates(a), HeadResult::Candidates(b)) => a.extend(b),
                (HeadResult::Hidden(a), HeadResult::Hidden(b)) => a.extend(b),
                // The parts of one call are all of the kind it asked for.
                _ => {}
            }
        }
        first
    }
}

/// The embedding table and the output head's tensors.
pub struct Embeddings<B: Backend> {
    pub token_embd: B::Weight,
    pub output_norm: B::Weight,
    /// `None` when the output is tied to `token_embd`.
    pub output: Option<B::Weight>,
}

impl<B: Backend> Embeddings<B> {
    pub fn load(t: &Loader<'_, B>, c: &Common) -> Result<Self, ModelError> {
        let (e, v) = (c.n_embd, c.n_vocab);
        Ok(Embeddings {
            token_embd: t.req("token_embd.weight", &[e, v])?,
            output_norm: t.req("output_norm.weight", &[e])?,
            output: t.opt("output.weight", &[e, v], t.has("output.weight"))?,
        })
    }

    /// The output head, norms at `eps`.
    pub fn head(&self, eps: f32) -> OutputHead<'_, B> {
        OutputHead {
            norm: &self.output_norm,
            weight: self.output.as_ref().unwrap_or(&self.token_embd),
            eps,
        }
    }
}

/// The output head's weights.
pub struct OutputHead<'a, B: Backend> {
    pub norm: &'a B::Weight,
    /// `[n_vocab, n_embd]` (the embedding table when tied).
    pub weight: &'a B::Weight,
    pub eps: f32,
}

/// Final norm and output projection for rows `wanted` of `s.x` (ascending), `logit_rows` at
/// a time; each part's result comes back as it is read.
pub fn output_head<B: Backend>(
    be: &B,
    s: &mut Scratch<B>,
    head: &OutputHead<'_, B>,
    d: ScratchDims,
    wanted: &[usize],
    want: HeadWant<'_>,
) -> Result<Readback<HeadResult>, ModelError> {
    if wanted.is_empty() {
        return Ok(Readback::ready(HeadResult::empty(want)));
    }
    let mut parts = Vec::new();
    for part in wanted.chunks(s.logit_rows) {
        let n = part.len();
        if part[n - 1] - part[0] + 1 == n {
            be.copy_rows(&s.x, part[0], n, d.n_embd, &mut s.sel)?;
        } else {
            for (j, &r) in part.iter().enumerate() {
                be.copy_rows(&s.x, r, 1, d.n_embd, &mut s.row)?;
                be.paste_rows(&s.row, 1, d.n_embd, &mut s.sel, j)?;
            }
        }
        be.rmsnorm_inplace(&mut s.sel, head.norm, n, head.eps)?;
        if !matches!(want, HeadWant::Hidden) {
            be.matmul(head.weight, &s.sel, n, &mut s.logits)?;
        }
        parts.push(match want {
            HeadWant::Logits => be.read(&s.logits, n * d.n_vocab)?.map(HeadResult::Logits),
            HeadWant::Argmax => be.argmax(&s.logits, n, d.n_vocab)?.map(HeadResult::Ids),
            HeadWant::TopK { k, gather } => be
                .top_k(&s.logits, n, d.n_vocab, k, gather)?
                .map(HeadResult::Candidates),
            HeadWant::Hidden => be.read(&s.sel, n * d.n_embd)?.map(HeadResult::Hidden),
        });
    }
    Ok(Readback::join(parts).map(HeadResult::concat))
}
