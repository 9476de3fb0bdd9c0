//! Qwen3.5, the hybrid of gated-delta-net layers and full attention (llama.cpp's `qwen35`):
//!
//! ```text
//! x = embd[tokens]
//! per layer:  n = rmsnorm(x)
//!             linear-attention layers (all but every `full_attention_interval`-th):
//!               qkv = conv1d+silu(Wqkv·n) (with the conv state),  z = Wgate·n
//!               g = A·softplus(Wα·n + dt_bias),  β = sigmoid(Wβ·n)
//!               o = delta_rule(l2(q), l2(k), v, g, β) (with the delta state)
//!               x += Wout · (rmsnorm(o) · w · silu(z))
//!             full-attention layers:
//!               [q | gate] per head = Wq·n,  q, k per-head RMS-normed, partial M-RoPE
//!               x += Wo · (attn(q, k, v) · sigmoid(gate))
//!             x += Wdown · (silu(Wgate·m) * Wup·m),  m = rmsnorm(x)  (post_attention_norm)
//!               qwen35moe: x += moe(m) + sigmoid(ws·m) · shared_ffn(m)   (moe.rs; softmax
//!               over the experts, the chosen k weights normalized)
//! ```
//!
//! The sequence state is a [`HybridState`]: the KV cache of the attention layers and the
//! recurrent state of the others, with checkpoints for prefix reuse.
//!
//! Positions are text positions only: M-RoPE's sections then all rotate by the token's
//! position, which is plain NEOX rope over `rope.dimension_count` dimensions, provided every
//! rotated pair falls in a text section ([`check_sections`]).

use super::blocks::{self, Batch, Embeddings, FamilyScratch, FfnWeights, Gate, OutputHead, Scratch, ScratchDims};
use super::error::ModelError;
use super::family::{Architecture, Family, ModelInfo};
use super::hparams::{self, bad, Common, Heads, Keys};
use super::hybrid::{HybridState, RecurrentSizes};
use super::moe::{self, ExpertGlu, MoeDims, MoeFfn, MoeScratch, MoeTensors, MoeWeights};
use super::state::{KvCache, SeqState};
use super::tensors::Loader;
use crate::backend::{
    AttnParams, Backend, Conv, DeltaNet, Form, Gating, KeyHeads, KvType, Rope, RopeKind, SeqRows, Strided,
};
use crate::gguf::{GgufFile, Value};

/// The gated delta net's sizes (`ssm.*` keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ssm {
    /// Conv taps (`ssm.conv_kernel`).
    pub conv_kernel: usize,
    /// Key heads (`ssm.group_count`) of `d_k` (`ssm.state_size`).
    pub n_k_heads: usize,
    pub d_k: usize,
    /// Value heads (`ssm.time_step_rank`) of `d_v` (`ssm.inner_size / n_v_heads`).
    pub n_v_heads: usize,
    pub d_v: usize,
}

impl Ssm {
    fn read(k: &Keys<'_>) -> Result<Self, ModelError> {
        let conv_kernel = k.count("ssm.conv_kernel")?;
        let d_k = k.count("ssm.state_size")?;
        let n_k_heads = k.count("ssm.group_count")?;
        let n_v_heads = k.count("ssm.time_step_rank")?;
        let d_inner = k.count("ssm.inner_size")?;
        if !d_inner.is_multiple_of(n_v_heads) {
            return Err(bad(
                k.key("ssm.inner_size"),
                format!("{d_inner} is not a multiple of the {n_v_heads} value heads (ssm.time_step_rank)"),
            ));
        }
        let s = Ssm {
            conv_kernel,
            n_k_heads,
            d_k,
            n_v_heads,
            d_v: d_inner / n_v_heads,
        };
        // The op checks head counts and widths; do it at load for an error naming the keys.
        let delta = s.delta(1e-6);
        delta
            .check(
                SeqRows { row0: 0, rows: 0 },
                Form::Recurrent,
                0,
                0,
                0,
                delta.state_len(),
                0,
            )
            .map_err(|e| bad(k.key("ssm"), e.to_string()))?;
        s.conv()
            .check(
                SeqRows { row0: 0, rows: 0 },
                0,
                s.conv_dim() * conv_kernel,
                s.conv().state_len(),
                0,
            )
            .map_err(|e| bad(k.key("ssm.conv_kernel"), e.to_string()))?;
        Ok(s)
    }

    /// Width of the conv's channels: q, k and v.
    pub fn conv_dim(&self) -> usize {
        2 * self.n_k_heads * self.d_k + self.d_inner()
    }

    /// Width of the delta rule's output (and of z).
    pub fn d_inner(&self) -> usize {
        self.n_v_heads * self.d_v
    }

    fn conv(&self) -> Conv {
        Conv {
            channels: self.conv_dim(),
            kernel: self.conv_kernel,
            silu: true,
        }
    }

    fn delta(&self, eps: f32) -> DeltaNet {
        DeltaNet {
            n_k_heads: self.n_k_heads,
            n_v_heads: self.n_v_heads,
            d_k: self.d_k,
            d_v: self.d_v,
            // ggml_repeat tiles the key heads over the value heads.
            key_heads: KeyHeads::Tiled,
            l2_eps: Some(eps),
        }
    }
}

/// Qwen3.5's hyper-parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Hparams {
    pub common: Common,
    pub heads: Heads,
    pub n_ff: usize,
    pub rope: Rope,
    pub ssm: Ssm,
    /// Per layer: true for a linear-attention (recurrent) layer.
    pub recurrent: Vec<bool>,
    /// qwen35moe's routed FFN (with its gated shared expert), in every layer.
    pub moe: Option<MoeFfn>,
}

impl Hparams {
    pub fn read(file: &GgufFile, arch: &str) -> Result<Self, ModelError> {
        let k = Keys { file, arch };
        let common = Common::read(&k)?;
        let heads = Heads::read(&k, common.n_embd)?;
        if heads.head_dim_k != heads.head_dim_v {
            return Err(bad(
                k.key("attention.value_length"),
                format!("{} differs from key_length {}", heads.head_dim_v, heads.head_dim_k),
            ));
        }
        let rope = hparams::rope(&k, RopeKind::Neox, heads.head_dim_k, "rope.freq_base")?;
        check_sections(&k, rope.n_rot)?;
        let moe = if arch == "qwen35moe" {
            let dims = MoeDims::read(&k, "expert_feed_forward_length")?;
            // llama.cpp: the shared expert as wide as `feed_forward_length` unless its own key
            // says; `expert_weights_scale` is not read for this family (no scaling).
            let shared = match k.opt_count("expert_shared_feed_forward_length")? {
                Some(n) => n,
                None => k.count("feed_forward_length")?,
            };
            Some(MoeFfn {
                dims,
                n_embd: common.n_embd,
                gating: Gating::Softmax,
                norm: true,
                scale: 0.0,
                glu: ExpertGlu::Silu,
                shared_ff: Some(shared),
            })
        } else {
            None
        };
        Ok(Hparams {
            n_ff: match &moe {
                Some(m) => m.dims.n_ff_exp,
                None => k.count("feed_forward_length")?,
            },
            moe,
            ssm: Ssm::read(&k)?,
            recurrent: recurrent_layers(&k, common.n_layer)?,
            common,
            heads,
            rope,
        })
    }
}

/// Which layers are recurrent: `attention.recurrent_layers` (bools per layer), else all but
/// every `full_attention_interval`-th (default 4), as llama.cpp reads them.
fn recurrent_layers(k: &Keys<'_>, n_layer: usize) -> Result<Vec<bool>, ModelError> {
    let key = k.key("attention.recurrent_layers");
    if let Some(v) = k.file.get(&key) {
        let flags: Option<Vec<bool>> = v.as_array().and_then(|a| {
            a.items
                .iter()
                .map(|i| i.as_bool().or(i.as_integer().map(|n| n != 0)))
                .collect()
        });
        let flags = flags.ok_or_else(|| bad(key.clone(), "expected an array of bools"))?;
        if flags.len() < n_layer {
            return Err(bad(key, format!("{} entries for {n_layer} layers", flags.len())));
        }
        return Ok(flags[..n_layer].to_vec());
    }
    let every = k.opt_count("full_attention_interval")?.unwrap_or(4);
    Ok((0..n_layer).map(|il| (il + 1) % every != 0).collect())
}

/// Error unless every rotated pair of interleaved M-RoPE (`rope.dimension_sections`) turns by
/// a text position. Text tokens carry the position in the time, height and width sections and
/// 0 in the fourth, so a pair in the fourth section would not turn at all, which the rope op
/// here does not do (no known text model has one).
fn check_sections(k: &Keys<'_>, n_rot: usize) -> Result<(), ModelError> {
    let key = k.key("rope.dimension_sections");
    let Some(v) = k.file.get(&key) else {
        return Ok(());
    };
    let items: Option<Vec<i128>> = v
        .as_array()
        .and_then(|a| a.items.iter().map(Value::as_integer).collect());
    let s = match items.as_deref() {
        Some(s) if s.len() >= 3 && s.iter().all(|&x| (0..=1 << 16).contains(&x)) => s,
        _ => return Err(bad(key, "expected an array of up to four small counts")),
    };
    let total: i128 = s.iter().sum();
    if total == 0 {
        return Err(bad(key, "the sections are all empty"));
    }
    let third = |i: usize| s.get(i).copied().unwrap_or(0);
    for pair in 0..n_rot / 2 {
        let sector = (pair as i128) % total;
        let text = match sector % 3 {
            0 => sector < 3 * third(0),
            1 => sector < 3 * third(1),
            _ => sector < 3 * third(2),
        };
        if !text {
            return Err(bad(
                key,
                format!("rotated pair {pair} falls outside the time/height/width sections {s:?}"),
            ));
        }
    }
    Ok(())
}

/// A linear-attention layer's weights.
struct LinearAttn<B: Backend> {
    /// `[conv_dim, n_embd]`
    qkv: B::Weight,
    /// `[d_inner, n_embd]`: z.
    gate: B::Weight,
    /// `[conv_dim][kernel]`
    conv: B::Weight,
    /// `[n_v_heads]` each.
    dt_bias: B::Weight,
    a: B::Weight,
    /// `[n_v_heads, n_embd]` each.
    beta: B::Weight,
    alpha: B::Weight,
    /// `[d_v]`
    norm: B::Weight,
    /// `[n_embd, d_inner]`
    out: B::Weight,
}

/// A full-attention layer's weights.
struct GatedAttn<B: Backend> {
    /// `[n_head * 2 * head_dim, n_embd]`: each head's q then its output gate.
    wq: B::Weight,
    wk: B::Weight,
    wv: B::Weight,
    wo: B::Weight,
    /// `[head_dim]` each.
    q_norm: B::Weight,
    k_norm: B::Weight,
}

enum Mixer<B: Backend> {
    Linear(LinearAttn<B>),
    Attn(GatedAttn<B>),
}

enum Ffn<B: Backend> {
    Dense(FfnWeights<B>),
    Moe(MoeFfn, MoeWeights<B>),
}

struct Layer<B: Backend> {
    attn_norm: B::Weight,
    mixer: Mixer<B>,
    post_norm: B::Weight,
    ffn: Ffn<B>,
}

/// A Qwen3.5 model's weights on a backend.
pub struct Qwen35<B: Backend> {
    info: ModelInfo,
    hp: Hparams,
    embd: Embeddings<B>,
    layers: Vec<Layer<B>>,
}

/// The widths of the hybrid layers' scratch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HybridDims {
    /// q and gate of every head: `2 * n_head * head_dim`.
    pub q_full: usize,
    pub q_dim: usize,
    pub conv_dim: usize,
    pub d_inner: usize,
    pub n_v_heads: usize,
}

/// Scratch of the hybrid layers, for passes of up to `rows` tokens.
pub struct HybridScratch<B: Backend> {
    /// `[rows, q_full]`
    q_full: B::Buffer,
    /// `[rows, q_dim]`: the attention output gate.
    q_gate: B::Buffer,
    /// `[rows, conv_dim]`: the conv's input and output.
    mixed: B::Buffer,
    conv_out: B::Buffer,
    /// `[rows, d_inner]`: z and the delta rule's output.
    z: B::Buffer,
    delta_out: B::Buffer,
    /// `[rows, n_v_heads]`: gates (log-decay) and β.
    alpha: B::Buffer,
    beta: B::Buffer,
}

impl<B: Backend> HybridScratch<B> {
    pub fn new(be: &B, d: HybridDims, rows: usize) -> Result<Self, ModelError> {
        let a = |w: usize| -> Result<B::Buffer, ModelError> {
            let len = rows.checked_mul(w).ok_or(ModelError::ChunkTooLarge {
                rows,
                capacity: usize::MAX / w.max(1),
            })?;
            Ok(be.alloc(len)?)
        };
        Ok(HybridScratch {
            q_full: a(d.q_full)?,
            q_gate: a(d.q_dim)?,
            mixed: a(d.conv_dim)?,
            conv_out: a(d.conv_dim)?,
            z: a(d.d_inner)?,
            delta_out: a(d.d_inner)?,
            alpha: a(d.n_v_heads)?,
            beta: a(d.n_v_heads)?,
        })
    }
}

/// The registry's entry for the family.
pub struct Qwen35Arch;

impl Architecture for Qwen35Arch {
    fn load<B: Backend>(t: &Loader<'_, B>, arch: &str) -> Result<Box<dyn Family<B>>, ModelError> {
        let hp = Hparams::read(t.file, arch)?;
        let (c, h, ssm) = (&hp.common, &hp.heads, hp.ssm);
        let e = c.n_embd;
        let mut layers = Vec::with_capacity(c.n_layer);
        for il in 0..c.n_layer {
            let n = |s: &str| Loader::<B>::blk(il, s);
            let mixer = if hp.recurrent[il] {
                Mixer::Linear(LinearAttn {
                    qkv: t.req(&n("attn_qkv.weight"), &[e, ssm.conv_dim()])?,
                    gate: t.req(&n("attn_gate.weight"), &[e, ssm.d_inner()])?,
                    conv: t.req(&n("ssm_conv1d.weight"), &[ssm.conv_kernel, ssm.conv_dim()])?,
                    dt_bias: t.req(&n("ssm_dt.bias"), &[ssm.n_v_heads])?,
                    a: t.req(&n("ssm_a"), &[ssm.n_v_heads])?,
                    beta: t.req(&n("ssm_beta.weight"), &[e, ssm.n_v_heads])?,
                    alpha: t.req(&n("ssm_alpha.weight"), &[e, ssm.n_v_heads])?,
                    norm: t.req(&n("ssm_norm.weight"), &[ssm.d_v])?,
                    out: t.req(&n("ssm_out.weight"), &[ssm.d_inner(), e])?,
                })
            } else {
                Mixer::Attn(GatedAttn {
                    wq: t.req(&n("attn_q.weight"), &[e, 2 * h.q_dim()])?,
                    wk: t.req(&n("attn_k.weight"), &[e, h.k_dim()])?,
                    wv: t.req(&n("attn_v.weight"), &[e, h.v_dim()])?,
                    wo: t.req(&n("attn_output.weight"), &[h.out_dim(), e])?,
                    q_norm: t.req(&n("attn_q_norm.weight"), &[h.head_dim_k])?,
                    k_norm: t.req(&n("attn_k_norm.weight"), &[h.head_dim_k])?,
                })
            };
            layers.push(Layer {
                attn_norm: t.req(&n("attn_norm.weight"), &[e])?,
                mixer,
                post_norm: t.req(&n("post_attention_norm.weight"), &[e])?,
                ffn: match &hp.moe {
                    Some(m) => Ffn::Moe(
                        *m,
                        MoeWeights::load(
                            t,
                            il,
                            e,
                            m.dims,
                            MoeTensors {
                                shared_ff: m.shared_ff,
                                shared_gate: true,
                                ..MoeTensors::default()
                            },
                        )?,
                    ),
                    None => Ffn::Dense(FfnWeights::load(t, il, e, hp.n_ff)?),
                },
            });
        }
        Ok(Box::new(Qwen35 {
            info: ModelInfo::new(arch, "qwen35", c),
            embd: Embeddings::load(t, c)?,
            layers,
            hp,
        }))
    }
}

impl<B: Backend> Qwen35<B> {
    fn hybrid_dims(&self) -> HybridDims {
        let (h, s) = (&self.hp.heads, &self.hp.ssm);
        HybridDims {
            q_full: 2 * h.q_dim(),
            q_dim: h.q_dim(),
            conv_dim: s.conv_dim(),
            d_inner: s.d_inner(),
            n_v_heads: s.n_v_heads,
        }
    }

    /// Full attention with the output gate over every sequence of the batch: reads `s.xn`,
    /// writes `s.xn`. `kv_il`: the layer's index in the KV cache (attention layers only).
    fn gated_attention(
        &self,
        be: &B,
        batch: &mut Batch<'_, '_, B>,
        s: &mut Scratch<B>,
        kv_il: usize,
        w: &GatedAttn<B>,
    ) -> Result<(), ModelError> {
        let (h, eps) = (&self.hp.heads, self.hp.common.rms_eps);
        let (rows, hd) = (batch.rows(), h.head_dim_k);
        let hs = s.family.get_mut::<HybridScratch<B>>().ok_or(ModelError::ForeignState)?;
        be.matmul(&w.wq, &s.xn, rows, &mut hs.q_full)?;
        // Each head's 2·hd values are its q then its gate.
        let half = |src_off| Strided {
            count: rows * h.n_head,
            width: hd,
            src_off,
            src_stride: 2 * hd,
            dst_off: 0,
            dst_stride: hd,
        };
        be.copy_strided(&hs.q_full, &mut s.q, &half(0))?;
        be.copy_strided(&hs.q_full, &mut hs.q_gate, &half(hd))?;
        be.matmul(&w.wk, &s.xn, rows, &mut s.k)?;
        be.matmul(&w.wv, &s.xn, rows, &mut s.v)?;
        be.rmsnorm_inplace(&mut s.q, &w.q_norm, rows * h.n_head, eps)?;
        be.rmsnorm_inplace(&mut s.k, &w.k_norm, rows * h.n_head_kv, eps)?;
        be.rope(&mut s.q, h.n_head, hd, &batch.positions, &self.hp.rope, None)?;
        be.rope(&mut s.k, h.n_head_kv, hd, &batch.positions, &self.hp.rope, None)?;
        let heads = AttnParams {
            rows: 0,
            pos0: 0,
            n_head: h.n_head,
            n_head_kv: h.n_head_kv,
            head_dim_k: hd,
            head_dim_v: h.head_dim_v,
            scale: 1.0 / (hd as f32).sqrt(),
            window: None,
            softcap: None,
            v_in_k: false,
        };
        blocks::store_and_attend(
            be,
            batch,
            kv_il,
            &heads,
            [&mut s.q, &mut s.k, &mut s.v],
            None,
            &mut s.att,
        )?;
        let hs = s.family.get_mut::<HybridScratch<B>>().ok_or(ModelError::ForeignState)?;
        be.sigmoid_mul(&mut s.att, &hs.q_gate, rows * h.q_dim())?;
        be.matmul(&w.wo, &s.att, rows, &mut s.xn)?;
        Ok(())
    }

    /// A gated-delta-net layer over every sequence of the batch, each from its own recurrent
    /// state (`ri`: the layer's index among the recurrent ones): reads `s.xn`, writes `s.xn`.
    fn linear_attention(
        &self,
        be: &B,
        batch: &mut Batch<'_, '_, B>,
        s: &mut Scratch<B>,
        ri: usize,
        w: &LinearAttn<B>,
    ) -> Result<(), ModelError> {
        let (ssm, eps) = (&self.hp.ssm, self.hp.common.rms_eps);
        let rows = batch.rows();
        let hs = s.family.get_mut::<HybridScratch<B>>().ok_or(ModelError::ForeignState)?;
        be.matmul(&w.qkv, &s.xn, rows, &mut hs.mixed)?;
        be.matmul(&w.gate, &s.xn, rows, &mut hs.z)?;
        be.matmul(&w.beta, &s.xn, rows, &mut hs.beta)?;
        be.matmul(&w.alpha, &s.xn, rows, &mut hs.alpha)?;
        be.delta_gates(&mut hs.alpha, &mut hs.beta, rows, &w.dt_bias, &w.a)?;
        let (conv, delta) = (ssm.conv(), ssm.delta(eps));
        let row0s = batch.row0s();
        for (seq, row0) in batch.seqs.iter_mut().zip(row0s) {
            let n = seq.tokens.len();
            let rows = SeqRows { row0, rows: n };
            let st = hybrid_of(seq.state)?.layer_mut(ri)?;
            be.ssm_conv(&hs.mixed, &w.conv, &conv, rows, &mut st.conv, &mut hs.conv_out)?;
            let form = be.delta_form(n);
            be.delta_net(
                &delta,
                form,
                rows,
                &hs.conv_out,
                &hs.alpha,
                &hs.beta,
                &mut st.ssm,
                &mut hs.delta_out,
            )?;
        }
        be.rmsnorm_gated(&mut hs.delta_out, &hs.z, &w.norm, rows * ssm.n_v_heads, eps)?;
        be.matmul(&w.out, &hs.delta_out, rows, &mut s.xn)?;
        Ok(())
    }
}

fn hybrid_of<B: Backend>(state: &mut SeqState<B>) -> Result<&mut HybridState<B>, ModelError> {
    state.get_mut::<HybridState<B>>().ok_or(ModelError::ForeignState)
}

impl<B: Backend> Family<B> for Qwen35<B> {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn scratch_dims(&self) -> ScratchDims {
        // The shared expert runs through the dense FFN's scratch.
        let shared = self.hp.moe.and_then(|m| m.shared_ff).unwrap_or(0);
        ScratchDims::new(&self.hp.common, &self.hp.heads, self.hp.n_ff.max(shared))
    }

    fn family_scratch(&self, be: &B, rows: usize) -> Result<FamilyScratch, ModelError> {
        let s = FamilyScratch::default().with(HybridScratch::new(be, self.hybrid_dims(), rows)?);
        Ok(match &self.hp.moe {
            Some(m) => s.with(MoeScratch::new(be, m.dims, self.hp.common.n_embd, rows, true)?),
            None => s,
        })
    }

    fn new_state(&self, be: &B, n_ctx: usize, cache: KvType) -> Result<SeqState<B>, ModelError> {
        let (h, ssm) = (&self.hp.heads, &self.hp.ssm);
        let n_attn = self.hp.recurrent.iter().filter(|&&r| !r).count();
        let kv = KvCache::new(be, &vec![(h.k_dim(), h.v_dim()); n_attn], n_ctx, cache)?;
        let sizes = RecurrentSizes {
            conv: ssm.conv().state_len(),
            ssm: ssm.delta(0.0).state_len(),
            layers: self.hp.recurrent.len() - n_attn,
        };
        Ok(SeqState::new(HybridState::new(be, kv, sizes)?))
    }

    fn layers(&self, be: &B, batch: &mut Batch<'_, '_, B>, s: &mut Scratch<B>) -> Result<(), ModelError> {
        let c = &self.hp.common;
        let rows = batch.rows();
        let len = rows * c.n_embd;
        for seq in batch.seqs.iter_mut() {
            hybrid_of(seq.state)?.sync(be)?;
        }
        be.embed(&self.embd.token_embd, &batch.tokens, 1.0, &mut s.x)?;
        let (mut ri, mut ai) = (0, 0);
        for l in &self.layers {
            be.rmsnorm(&s.x, &l.attn_norm, rows, c.rms_eps, &mut s.xn)?;
            match &l.mixer {
                Mixer::Linear(w) => {
                    self.linear_attention(be, batch, s, ri, w)?;
                    ri += 1;
                }
                Mixer::Attn(w) => {
                    self.gated_attention(be, batch, s, ai, w)?;
                    ai += 1;
                }
            }
            be.add(&mut s.x, &s.xn, len)?;
            be.rmsnorm(&s.x, &l.post_norm, rows, c.rms_eps, &mut s.xn)?;
            match &l.ffn {
                Ffn::Moe(f, w) => moe::moe_ffn(be, s, rows, f, w)?,
                Ffn::Dense(w) => blocks::ffn(be, s, rows, self.hp.n_ff, w, Gate::Silu)?,
            }
            be.add(&mut s.x, &s.xn, len)?;
        }
        Ok(())
    }

    fn head(&self) -> OutputHead<'_, B> {
        self.embd.head(self.hp.common.rms_eps)
    }
}
