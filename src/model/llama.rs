//! The llama family (llama, mistral, qwen2, qwen3):
//!
//! ```text
//! x = embd[tokens]
//! per layer:  x += Wo · attn(rope(norm_qk(Wq·n + bq)), rope(norm_qk(Wk·n + bk)), Wv·n + bv),  n = rmsnorm(x)
//!             x += Wdown · (silu(Wgate·n) * Wup·n),                                           n = rmsnorm(x)
//! ```
//! Biases are qwen2's, per-head q/k norms qwen3's; llama and mistral rotate adjacent pairs,
//! the qwens halves. K and V heads may differ in width.
//!
//! The mixtures of experts built the same way run here too, their FFN routed
//! ([`super::moe`]): qwen3moe (per-head q/k norms, normalized top-k softmax weights) and olmoe
//! (q/k norms over the whole projection, unnormalized weights).

use super::blocks::{
    self, AttnLayer, AttnTensors, AttnWeights, Batch, Embeddings, FamilyScratch, FfnWeights, Gate, OutputHead, Scratch,
    ScratchDims,
};
use super::error::ModelError;
use super::family::{Architecture, Family, ModelInfo};
use super::hparams::{self, Common, Heads, Keys};
use super::moe::{self, ExpertGlu, MoeDims, MoeFfn, MoeScratch, MoeTensors, MoeWeights};
use super::state::SeqState;
use super::tensors::Loader;
use crate::backend::{Backend, Gating, KvType, Rope, RopeKind};
use crate::gguf::GgufFile;

/// The llama family's hyper-parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Hparams {
    pub common: Common,
    pub heads: Heads,
    pub n_ff: usize,
    pub rope: Rope,
    /// q/k/v biases (qwen2).
    pub qkv_bias: bool,
    /// q/k RMS norms: per head (qwen3, qwen3moe) or over the whole projection (olmoe).
    pub qk_norm: Option<QkNorm>,
    /// Routed experts in place of the dense FFN (qwen3moe, olmoe).
    pub moe: Option<MoeFfn>,
}

/// Where q/k RMS norms apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkNorm {
    PerHead,
    Whole,
}

impl Hparams {
    pub fn read(file: &GgufFile, arch: &str) -> Result<Self, ModelError> {
        let k = Keys { file, arch };
        let common = Common::read(&k)?;
        let heads = Heads::read(&k, common.n_embd)?;
        let kind = if matches!(arch, "llama" | "mistral") {
            RopeKind::Norm
        } else {
            RopeKind::Neox
        };
        let moe = match arch {
            // llama.cpp: qwen3moe normalizes the chosen weights, olmoe does not.
            "qwen3moe" | "olmoe" => {
                let ff_key = if arch == "olmoe" {
                    "feed_forward_length"
                } else {
                    "expert_feed_forward_length"
                };
                Some(MoeFfn {
                    dims: MoeDims::read(&k, ff_key)?,
                    n_embd: common.n_embd,
                    gating: Gating::Softmax,
                    norm: arch == "qwen3moe",
                    scale: k.opt_f32("expert_weights_scale")?.unwrap_or(0.0),
                    glu: ExpertGlu::Silu,
                    shared_ff: None,
                })
            }
            _ => None,
        };
        Ok(Hparams {
            n_ff: match &moe {
                Some(m) => m.dims.n_ff_exp,
                None => k.count("feed_forward_length")?,
            },
            rope: hparams::rope(&k, kind, heads.head_dim_k, "rope.freq_base")?,
            qkv_bias: arch == "qwen2",
            qk_norm: match arch {
                "qwen3" | "qwen3moe" => Some(QkNorm::PerHead),
                "olmoe" => Some(QkNorm::Whole),
                _ => None,
            },
            moe,
            common,
            heads,
        })
    }
}

enum Ffn<B: Backend> {
    Dense(FfnWeights<B>),
    Moe(MoeWeights<B>),
}

struct Layer<B: Backend> {
    attn_norm: B::Weight,
    attn: AttnWeights<B>,
    ffn_norm: B::Weight,
    ffn: Ffn<B>,
}

/// A llama-family model's weights on a backend.
pub struct Llama<B: Backend> {
    info: ModelInfo,
    hp: Hparams,
    embd: Embeddings<B>,
    rope_freqs: Option<B::Weight>,
    layers: Vec<Layer<B>>,
}

/// The registry's entry for the family.
pub struct LlamaArch;

impl Architecture for LlamaArch {
    fn load<B: Backend>(t: &Loader<'_, B>, arch: &str) -> Result<Box<dyn Family<B>>, ModelError> {
        let hp = Hparams::read(t.file, arch)?;
        let (c, h) = (&hp.common, &hp.heads);
        let e = c.n_embd;
        let has = AttnTensors {
            bias: hp.qkv_bias,
            qk_norm: hp.qk_norm == Some(QkNorm::PerHead),
            qk_norm_whole: hp.qk_norm == Some(QkNorm::Whole),
        };
        let mut layers = Vec::with_capacity(c.n_layer);
        for il in 0..c.n_layer {
            let n = |s: &str| Loader::<B>::blk(il, s);
            layers.push(Layer {
                attn_norm: t.req(&n("attn_norm.weight"), &[e])?,
                attn: AttnWeights::load(t, il, e, h, has)?,
                ffn_norm: t.req(&n("ffn_norm.weight"), &[e])?,
                ffn: match &hp.moe {
                    Some(m) => Ffn::Moe(MoeWeights::load(t, il, e, m.dims, MoeTensors::default())?),
                    None => Ffn::Dense(FfnWeights::load(t, il, e, hp.n_ff)?),
                },
            });
        }
        let model = Llama {
            info: ModelInfo::new(arch, "llama", c),
            embd: Embeddings::load(t, c)?,
            rope_freqs: t.opt("rope_freqs.weight", &[hp.rope.n_rot / 2], hp.rope.wants_factors())?,
            layers,
            hp,
        };
        Ok(Box::new(model))
    }
}

impl<B: Backend> Family<B> for Llama<B> {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn scratch_dims(&self) -> ScratchDims {
        ScratchDims::new(&self.hp.common, &self.hp.heads, self.hp.n_ff)
    }

    fn family_scratch(&self, be: &B, rows: usize) -> Result<FamilyScratch, ModelError> {
        let mut s = FamilyScratch::default();
        if let Some(m) = &self.hp.moe {
            s = s.with(MoeScratch::new(be, m.dims, self.hp.common.n_embd, rows, false)?);
        }
        Ok(s)
    }

    fn new_state(&self, be: &B, n_ctx: usize, cache: KvType) -> Result<SeqState<B>, ModelError> {
        blocks::kv_state(be, &self.hp.heads, self.hp.common.n_layer, n_ctx, cache)
    }

    fn layers(&self, be: &B, batch: &mut Batch<'_, '_, B>, s: &mut Scratch<B>) -> Result<(), ModelError> {
        let (c, hp) = (&self.hp.common, &self.hp);
        let rows = batch.rows();
        let len = rows * c.n_embd;
        let attn = AttnLayer {
            heads: hp.heads,
            rope: &hp.rope,
            window: None,
            kq_scale: 1.0 / (hp.heads.head_dim_k as f32).sqrt(),
            q_scale: None,
            softcap: None,
            eps: c.rms_eps,
            qk_norm_whole: hp.qk_norm == Some(QkNorm::Whole),
        };
        be.embed(&self.embd.token_embd, &batch.tokens, 1.0, &mut s.x)?;
        for (il, l) in self.layers.iter().enumerate() {
            be.rmsnorm(&s.x, &l.attn_norm, rows, c.rms_eps, &mut s.xn)?;
            blocks::attention(be, batch, s, il, &attn, &l.attn, self.rope_freqs.as_ref())?;
            be.add(&mut s.x, &s.xn, len)?;
            be.rmsnorm(&s.x, &l.ffn_norm, rows, c.rms_eps, &mut s.xn)?;
            match (&l.ffn, &hp.moe) {
                (Ffn::Moe(w), Some(m)) => moe::moe_ffn(be, s, rows, m, w)?,
                (Ffn::Dense(w), _) => blocks::ffn(be, s, rows, hp.n_ff, w, Gate::Silu)?,
                (Ffn::Moe(_), None) => {
                    return Err(ModelError::BadParam {
                        key: "expert_count".into(),
                        problem: "expert weights without expert hyper-parameters".into(),
                    })
                }
            }
            be.add(&mut s.x, &s.xn, len)?;
        }
        Ok(())
    }

    fn head(&self) -> OutputHead<'_, B> {
        self.embd.head(self.hp.common.rms_eps)
    }
}
