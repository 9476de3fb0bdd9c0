//! Models: hyper-parameters ([`Config`]), weights placed on a backend ([`Weights`]) and one
//! forward graph per architecture family, written once against [`Backend`].
//!
//! Families: [`llama`] (llama, mistral, qwen2, qwen3) and [`gemma3`]. Both share the blocks in
//! this file (attention with KV cache, gated FFN, output head).
//!
//! A pass may hold several sequences ([`Model::forward_batch`], continuous batching): their rows
//! are stacked for the weight matmuls, and each sequence's rows are gathered for rope, the KV
//! store and attention over its own cache, then scattered back ([`Backend::paste_rows`]). Those
//! are plain copies and every other op works row by row, so a sequence gets the same logits
//! alone or batched (`tests/batch_forward.rs`).

mod config;
pub mod gemma3;
pub mod llama;

use std::sync::Arc;

pub use config::{Arch, Config, Rope, RopeKind, TensorSpec};

use crate::backend::{AttnParams, Backend, BackendError, SeqAttn};
use crate::engine::KvCache;
use crate::gguf::{GgufError, GgufFile};
use crate::sample::Candidates;

/// Errors from reading a model's configuration or running its graph.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("unsupported architecture '{arch}' (supported: {supported})")]
    UnsupportedArch { arch: String, supported: String },
    #[error("metadata key '{key}': {problem}")]
    BadParam { key: String, problem: String },
    #[error("missing tensor '{name}'")]
    MissingTensor { name: String },
    #[error("tensor '{name}' has shape {actual}, expected {expected}")]
    TensorShape {
        name: String,
        expected: String,
        actual: String,
    },
    #[error("chunk of {rows} rows exceeds the scratch capacity of {capacity}")]
    ChunkTooLarge { rows: usize, capacity: usize },
    #[error("batch sequence {seq}: {problem}")]
    BadBatch { seq: usize, problem: String },
}

/// Where the output head's rows go.
pub enum HeadOutput<'a> {
    /// Appended as logits, `n_vocab` per row (read back from the backend).
    Logits(&'a mut Vec<f32>),
    /// Only each row's argmax id is appended: greedy decoding on a GPU backend reads back one
    /// id per row instead of a vocabulary of logits.
    Argmax(&'a mut Vec<u32>),
    /// Only each row's sampler candidates ([`Backend::top_k`]): a sampled decode step on a GPU
    /// backend reads back a few hundred bytes instead of the logits.
    TopK {
        k: usize,
        gather: &'a [u32],
        out: &'a mut Vec<Candidates>,
    },
}

impl HeadOutput<'_> {
    /// The same destination for a shorter borrow (one chunk of a longer evaluation).
    pub fn reborrow(&mut self) -> HeadOutput<'_> {
        match self {
            HeadOutput::Logits(l) => HeadOutput::Logits(l),
            HeadOutput::Argmax(ids) => HeadOutput::Argmax(ids),
            HeadOutput::TopK { k, gather, out } => HeadOutput::TopK { k: *k, gather, out },
        }
    }
}

/// One sequence's part of a [`Model::forward_batch`] pass.
pub struct SeqChunk<'a, B: Backend> {
    /// The sequence's cache; positions `pos0..pos0 + tokens.len()` are written.
    pub kv: &'a mut KvCache<B>,
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`.
    pub pos0: usize,
    /// Logits are returned for rows `logits_from..tokens.len()` of this chunk.
    pub logits_from: usize,
}

/// The per-sequence buffers [`Model::attend_segment`] works on (each starting at row 0).
struct SegBufs<'a, B: Backend> {
    /// [rows, q_dim], roped in place.
    q: &'a mut B::Buffer,
    /// [rows, kv_dim], roped in place.
    k: &'a mut B::Buffer,
    /// [rows, kv_dim]
    v: &'a mut B::Buffer,
    /// Attention output [rows, q_dim].
    att: &'a mut B::Buffer,
}

/// Weights of one transformer block.
pub struct LayerWeights<B: Backend> {
    pub attn_norm: B::Weight,
    pub wq: B::Weight,
    pub wk: B::Weight,
    pub wv: B::Weight,
    pub wo: B::Weight,
    /// q/k/v biases (qwen2).
    pub bq: Option<B::Weight>,
    pub bk: Option<B::Weight>,
    pub bv: Option<B::Weight>,
    /// Per-head q/k RMS norms (qwen3, gemma3).
    pub q_norm: Option<B::Weight>,
    pub k_norm: Option<B::Weight>,
    /// Norms after attention and FFN (gemma3).
    pub post_attn_norm: Option<B::Weight>,
    pub post_ffn_norm: Option<B::Weight>,
    pub ffn_norm: B::Weight,
    pub ffn_gate: B::Weight,
    pub ffn_up: B::Weight,
    pub ffn_down: B::Weight,
}

/// All weights of a model.
pub struct Weights<B: Backend> {
    pub token_embd: B::Weight,
    pub output_norm: B::Weight,
    /// `None` when the output is tied to `token_embd`.
    pub output: Option<B::Weight>,
    pub rope_freqs: Option<B::Weight>,
    pub layers: Vec<LayerWeights<B>>,
}

/// A loaded model: configuration, weights on a backend, and the file they come from.
pub struct Model<B: Backend> {
    backend: B,
    config: Config,
    weights: Weights<B>,
    file: Arc<GgufFile>,
}

impl<B: Backend> std::fmt::Debug for Model<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("backend", &self.backend.name())
            .field("config", &self.config)
            .finish()
    }
}

impl<B: Backend> Model<B> {
    /// Read the configuration of `file` and place its weights on `backend`.
    pub fn load(backend: B, file: Arc<GgufFile>) -> Result<Self, ModelError> {
        let config = Config::from_gguf(&file)?;
        let w = |name: &str| backend.load_weight(&file, name);
        let opt = |name: String, present: bool| present.then(|| w(&name)).transpose();
        let mut layers = Vec::with_capacity(config.n_layer);
        let gemma = config.arch == Arch::Gemma3;
        for il in 0..config.n_layer {
            let n = |s: &str| format!("blk.{il}.{s}");
            layers.push(LayerWeights {
                attn_norm: w(&n("attn_norm.weight"))?,
                wq: w(&n("attn_q.weight"))?,
                wk: w(&n("attn_k.weight"))?,
                wv: w(&n("attn_v.weight"))?,
                wo: w(&n("attn_output.weight"))?,
                bq: opt(n("attn_q.bias"), config.qkv_bias)?,
                bk: opt(n("attn_k.bias"), config.qkv_bias)?,
                bv: opt(n("attn_v.bias"), config.qkv_bias)?,
                q_norm: opt(n("attn_q_norm.weight"), config.qk_norm)?,
                k_norm: opt(n("attn_k_norm.weight"), config.qk_norm)?,
                post_attn_norm: opt(n("post_attention_norm.weight"), gemma)?,
                post_ffn_norm: opt(n("post_ffw_norm.weight"), gemma)?,
                ffn_norm: w(&n("ffn_norm.weight"))?,
                ffn_gate: w(&n("ffn_gate.weight"))?,
                ffn_up: w(&n("ffn_up.weight"))?,
                ffn_down: w(&n("ffn_down.weight"))?,
            });
        }
        let weights = Weights {
            token_embd: w("token_embd.weight")?,
            output_norm: w("output_norm.weight")?,
            output: opt("output.weight".into(), !config.tied_output)?,
            rope_freqs: opt("rope_freqs.weight".into(), config.rope_freq_factors)?,
            layers,
        };
        Ok(Model {
            backend,
            config,
            weights,
            file,
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    pub fn weights(&self) -> &Weights<B> {
        &self.weights
    }

    /// The GGUF file the weights come from (metadata, tokenizer).
    pub fn file(&self) -> &Arc<GgufFile> {
        &self.file
    }

    /// Run `tokens` at positions `pos0..` through the model, storing their K/V in `kv`, and
    /// append the logits of rows `logits_from..tokens.len()` to `out` (row-major, `n_vocab`
    /// per row), or only their argmax ids. `tokens.len()` must not exceed the scratch capacity.
    pub fn forward_chunk(
        &self,
        kv: &mut KvCache<B>,
        s: &mut Scratch<B>,
        tokens: &[u32],
        pos0: usize,
        logits_from: usize,
        out: HeadOutput<'_>,
    ) -> Result<(), ModelError> {
        let mut seq = [SeqChunk {
            kv,
            tokens,
            pos0,
            logits_from,
        }];
        self.forward_batch_to(s, &mut seq, out)
    }

    /// Run several sequences through the model in one pass: their rows are stacked, so every
    /// weight matmul sees all of them at once (weights are streamed once per pass, not once
    /// per sequence), while rope, the KV store and attention run per sequence on its own cache
    /// and positions. Appends the logits each chunk asks for, in sequence order. The total
    /// number of tokens must not exceed the scratch capacity.
    pub fn forward_batch(
        &self,
        s: &mut Scratch<B>,
        seqs: &mut [SeqChunk<'_, B>],
        logits: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        self.forward_batch_to(s, seqs, HeadOutput::Logits(logits))
    }

    /// [`Model::forward_batch`] with the output head's result going to `out`.
    pub fn forward_batch_to(
        &self,
        s: &mut Scratch<B>,
        seqs: &mut [SeqChunk<'_, B>],
        out: HeadOutput<'_>,
    ) -> Result<(), ModelError> {
        self.backend.run_pass(|| self.run_batch(s, seqs, out))
    }

    /// The body of [`Model::forward_batch_to`], inside [`Backend::run_pass`].
    fn run_batch(
        &self,
        s: &mut Scratch<B>,
        seqs: &mut [SeqChunk<'_, B>],
        mut out: HeadOutput<'_>,
    ) -> Result<(), ModelError> {
        let rows: usize = seqs.iter().map(|q| q.tokens.len()).sum();
        if rows > s.rows {
            return Err(ModelError::ChunkTooLarge { rows, capacity: s.rows });
        }
        for (i, q) in seqs.iter().enumerate() {
            let bad = |problem: String| Err(ModelError::BadBatch { seq: i, problem });
            if q.tokens.is_empty() {
                return bad("no tokens".into());
            }
            if q.logits_from > q.tokens.len() {
                return bad(format!("logits from row {} of {}", q.logits_from, q.tokens.len()));
            }
            if q.pos0 + q.tokens.len() > q.kv.n_ctx() {
                return bad(format!(
                    "positions {}..{} exceed the cache of {}",
                    q.pos0,
                    q.pos0 + q.tokens.len(),
                    q.kv.n_ctx()
                ));
            }
        }
        // [rows] token ids, sequence after sequence.
        let tokens: Vec<u32> = seqs.iter().flat_map(|q| q.tokens.iter().copied()).collect();
        match self.config.arch {
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 => llama::forward(self, seqs, s, &tokens)?,
            Arch::Gemma3 => gemma3::forward(self, seqs, s, &tokens)?,
        }
        let mut wanted = Vec::new();
        let mut off = 0;
        for q in seqs.iter() {
            wanted.extend(off + q.logits_from..off + q.tokens.len());
            off += q.tokens.len();
        }
        self.output_head(s, &wanted, &mut out)
    }

    /// Final norm and output projection for rows `wanted` of `s.x` (ascending), in slices of
    /// the logits scratch.
    fn output_head(&self, s: &mut Scratch<B>, wanted: &[usize], out: &mut HeadOutput<'_>) -> Result<(), ModelError> {
        let (be, c, w) = (&self.backend, &self.config, &self.weights);
        let out_w = w.output.as_ref().unwrap_or(&w.token_embd);
        for part in wanted.chunks(s.logit_rows) {
            let n = part.len();
            if part[n - 1] - part[0] + 1 == n {
                be.copy_rows(&s.x, part[0], n, c.n_embd, &mut s.sel)?;
            } else {
                for (j, &r) in part.iter().enumerate() {
                    be.copy_rows(&s.x, r, 1, c.n_embd, &mut s.row)?;
                    be.paste_rows(&s.row, 1, c.n_embd, &mut s.sel, j)?;
                }
            }
            be.rmsnorm_inplace(&mut s.sel, &w.output_norm, n, c.rms_eps)?;
            be.matmul(out_w, &s.sel, n, &mut s.logits)?;
            match out {
                HeadOutput::Logits(logits) => {
                    let start = logits.len();
                    logits.resize(start + n * c.n_vocab, 0.0);
                    be.read(&s.logits, &mut logits[start..])?;
                }
                HeadOutput::Argmax(ids) => ids.extend(be.argmax(&s.logits, n, c.n_vocab)?),
                HeadOutput::TopK { k, gather, out } => out.extend(be.top_k(&s.logits, n, c.n_vocab, *k, gather)?),
            }
        }
        Ok(())
    }

    /// Attention sub-block of layer `il` over all sequences of the batch: reads the normed
    /// input `s.xn`, writes the projected attention output back to `s.xn` (`rows x n_embd`).
    fn attention_block(
        &self,
        seqs: &mut [SeqChunk<'_, B>],
        s: &mut Scratch<B>,
        il: usize,
        rows: usize,
    ) -> Result<(), ModelError> {
        let (be, c) = (&self.backend, &self.config);
        let l = &self.weights.layers[il];
        // q: [rows, n_head * head_dim]; k, v: [rows, n_head_kv * head_dim]
        be.matmul(&l.wq, &s.xn, rows, &mut s.q)?;
        be.matmul(&l.wk, &s.xn, rows, &mut s.k)?;
        be.matmul(&l.wv, &s.xn, rows, &mut s.v)?;
        if let (Some(bq), Some(bk), Some(bv)) = (&l.bq, &l.bk, &l.bv) {
            be.add_bias(&mut s.q, bq, rows)?;
            be.add_bias(&mut s.k, bk, rows)?;
            be.add_bias(&mut s.v, bv, rows)?;
        }
        if let (Some(qn), Some(kn)) = (&l.q_norm, &l.k_norm) {
            be.rmsnorm_inplace(&mut s.q, qn, rows * c.n_head, c.rms_eps)?;
            be.rmsnorm_inplace(&mut s.k, kn, rows * c.n_head_kv, c.rms_eps)?;
        }
        if let [one] = seqs {
            // One sequence: its rows are the whole buffers, no gather/scatter.
            let bufs = SegBufs {
                q: &mut s.q,
                k: &mut s.k,
                v: &mut s.v,
                att: &mut s.att,
            };
            self.attend_segment(one, bufs, il)?;
        } else {
            // Each sequence's rows are roped and stored in its own cache (through the segment
            // buffers, with its own positions), the roped q put back in place; then one call
            // attends every sequence's rows.
            let mut params = Vec::with_capacity(seqs.len());
            let mut row0 = 0;
            for seq in seqs.iter_mut() {
                let n = seq.tokens.len();
                be.copy_rows(&s.q, row0, n, c.q_dim(), &mut s.seg_q)?;
                be.copy_rows(&s.k, row0, n, c.kv_dim(), &mut s.seg_k)?;
                be.copy_rows(&s.v, row0, n, c.kv_dim(), &mut s.seg_v)?;
                params.push((
                    row0,
                    self.prepare_segment(seq, &mut s.seg_q, &mut s.seg_k, &s.seg_v, il)?,
                ));
                be.paste_rows(&s.seg_q, n, c.q_dim(), &mut s.q, row0)?;
                row0 += n;
            }
            let items: Vec<SeqAttn<'_, B::Kv>> = seqs
                .iter()
                .zip(params)
                .map(|(seq, (row0, p))| {
                    let (k_cache, v_cache) = seq.kv.layer(il);
                    SeqAttn {
                        row0,
                        p,
                        k_cache,
                        v_cache,
                    }
                })
                .collect();
            be.attention_seqs(&s.q, &items, &mut s.att, &mut s.seg_q, &mut s.seg_att)?;
        }
        be.matmul(&l.wo, &s.att, rows, &mut s.xn)?;
        Ok(())
    }

    /// Rope, KV store and attention of one sequence's rows (held at the start of `b`).
    fn attend_segment(&self, seq: &mut SeqChunk<'_, B>, b: SegBufs<'_, B>, il: usize) -> Result<(), ModelError> {
        let p = self.prepare_segment(seq, b.q, b.k, b.v, il)?;
        let (kc, vc) = seq.kv.layer(il);
        self.backend.attention(b.q, kc, vc, &p, b.att)?;
        Ok(())
    }

    /// Rope `q` and `k` (one sequence's rows, at the start of the buffers) at the sequence's
    /// positions, scale `q`, store `k` and `v` in the sequence's cache; the parameters of its
    /// attention.
    fn prepare_segment(
        &self,
        seq: &mut SeqChunk<'_, B>,
        q: &mut B::Buffer,
        k: &mut B::Buffer,
        v: &B::Buffer,
        il: usize,
    ) -> Result<AttnParams, ModelError> {
        let (be, c) = (&self.backend, &self.config);
        let (rows, pos0) = (seq.tokens.len(), seq.pos0);
        let rope = c.rope_for(il);
        let factors = self.weights.rope_freqs.as_ref();
        be.rope(q, rows, c.n_head, c.head_dim, pos0, rope, factors)?;
        be.rope(k, rows, c.n_head_kv, c.head_dim, pos0, rope, factors)?;
        if let Some(qs) = c.q_scale {
            be.scale(q, rows * c.q_dim(), qs)?;
        }
        let (kc, vc) = seq.kv.layer_mut(il);
        be.kv_store(kc, vc, k, v, rows, c.kv_dim(), pos0)?;
        Ok(AttnParams {
            rows,
            pos0,
            n_head: c.n_head,
            n_head_kv: c.n_head_kv,
            head_dim: c.head_dim,
            scale: c.kq_scale,
            window: c.window_for(il),
        })
    }

    /// Gated FFN of layer `il`: reads `s.xn`, writes `s.xn`. `gelu` picks GEGLU over SwiGLU.
    fn ffn_block(&self, s: &mut Scratch<B>, il: usize, rows: usize, gelu: bool) -> Result<(), ModelError> {
        let (be, c) = (&self.backend, &self.config);
        let l = &self.weights.layers[il];
        // gate, up: [rows, n_ff]
        be.matmul(&l.ffn_gate, &s.xn, rows, &mut s.gate)?;
        be.matmul(&l.ffn_up, &s.xn, rows, &mut s.up)?;
        if gelu {
            be.geglu(&mut s.gate, &s.up, rows * c.n_ff)?;
        } else {
            be.swiglu(&mut s.gate, &s.up, rows * c.n_ff)?;
        }
        be.matmul(&l.ffn_down, &s.gate, rows, &mut s.xn)?;
        Ok(())
    }
}

/// Activation scratch of a forward pass, sized for chunks of up to `rows` tokens.
pub struct Scratch<B: Backend> {
    rows: usize,
    logit_rows: usize,
    /// Residual stream [rows, n_embd].
    x: B::Buffer,
    /// Normed input / block output [rows, n_embd].
    xn: B::Buffer,
    /// [rows, q_dim]
    q: B::Buffer,
    /// [rows, kv_dim]
    k: B::Buffer,
    v: B::Buffer,
    /// Attention output before the projection [rows, q_dim].
    att: B::Buffer,
    /// [rows, n_ff]
    gate: B::Buffer,
    up: B::Buffer,
    /// One sequence's rows of q/k/v/att, gathered from the batch ([rows, q_dim] or
    /// [rows, kv_dim]); only used when a pass holds several sequences.
    seg_q: B::Buffer,
    seg_k: B::Buffer,
    seg_v: B::Buffer,
    seg_att: B::Buffer,
    /// One row gathered for the output head [1, n_embd].
    row: B::Buffer,
    /// Rows selected for the output head [logit_rows, n_embd].
    sel: B::Buffer,
    /// [logit_rows, n_vocab]
    logits: B::Buffer,
}

impl<B: Backend> Scratch<B> {
    /// Scratch for passes of up to `rows` tokens in all; logits are computed `logit_rows` at a
    /// time.
    pub fn new(model: &Model<B>, rows: usize, logit_rows: usize) -> Result<Self, ModelError> {
        let (be, c) = (&model.backend, &model.config);
        let rows = rows.max(1);
        let logit_rows = logit_rows.max(1);
        let a = |n: usize| be.alloc(n);
        Ok(Scratch {
            rows,
            logit_rows,
            x: a(rows * c.n_embd)?,
            xn: a(rows * c.n_embd)?,
            q: a(rows * c.q_dim())?,
            k: a(rows * c.kv_dim())?,
            v: a(rows * c.kv_dim())?,
            att: a(rows * c.q_dim())?,
            gate: a(rows * c.n_ff)?,
            up: a(rows * c.n_ff)?,
            seg_q: a(rows * c.q_dim())?,
            seg_k: a(rows * c.kv_dim())?,
            seg_v: a(rows * c.kv_dim())?,
            seg_att: a(rows * c.q_dim())?,
            row: a(c.n_embd)?,
            sel: a(logit_rows * c.n_embd)?,
            logits: a(logit_rows * c.n_vocab)?,
        })
    }

    /// The largest chunk this scratch holds.
    pub fn rows(&self) -> usize {
        self.rows
    }
}
