//! gpt-oss: attention with q/k/v/output biases and per-head sinks, sliding-window and global
//! layers alternating, YaRN rope; a routed FFN whose router chooses by raw logit and weighs by
//! a softmax over the chosen experts, experts with biases and the clamped SwiGLU:
//!
//! ```text
//! x = embd[tokens]
//! per layer:  x += Wo · attn_sinks(rope(Wq·n + bq), rope(Wk·n + bk), Wv·n + bv) + bo,  n = rmsnorm(x)
//!             x += moe_oai(n),                                                          n = rmsnorm(x)
//! ```
//! Even layers slide (window `attention.sliding_window`), odd ones attend to everything.

use super::blocks::{
    self, AttnLayer, AttnTensors, AttnWeights, Batch, Embeddings, FamilyScratch, OutputHead, Scratch, ScratchDims,
};
use super::error::ModelError;
use super::family::{Architecture, Family, ModelInfo};
use super::hparams::{self, Common, Heads, Keys};
use super::moe::{self, ExpertGlu, MoeDims, MoeFfn, MoeScratch, MoeTensors, MoeWeights};
use super::state::SeqState;
use super::tensors::Loader;
use crate::backend::{Backend, Gating, KvType, Rope, RopeKind};
use crate::gguf::GgufFile;

/// The clamped SwiGLU's constants (llama.cpp's `swiglu_oai`).
const OAI_ALPHA: f32 = 1.702;
const OAI_LIMIT: f32 = 7.0;

/// gpt-oss's hyper-parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Hparams {
    pub common: Common,
    pub heads: Heads,
    pub rope: Rope,
    /// Rope of sliding-window layers (`rope.freq_base_swa`, default the global base).
    pub rope_swa: Rope,
    pub sliding_window: Option<usize>,
    /// Per layer: true for sliding-window layers.
    pub swa_layers: Vec<bool>,
    pub moe: MoeFfn,
}

impl Hparams {
    pub fn read(file: &GgufFile, arch: &str) -> Result<Self, ModelError> {
        let k = Keys { file, arch };
        let common = Common::read(&k)?;
        let heads = Heads::read(&k, common.n_embd)?;
        let rope = hparams::rope(&k, RopeKind::Neox, heads.head_dim_k, "rope.freq_base")?;
        let rope_swa = Rope {
            base: k.positive("rope.freq_base_swa", rope.base)?,
            ..rope
        };
        let (sliding_window, swa_layers) = match k.opt_u32("attention.sliding_window")? {
            // llama.cpp's default for gpt-oss: every other layer is global.
            Some(w) if w > 0 => (
                Some(w as usize),
                hparams::swa_pattern(&k, "attention.sliding_window_pattern", common.n_layer, 2)?,
            ),
            _ => (None, vec![false; common.n_layer]),
        };
        Ok(Hparams {
            moe: MoeFfn {
                dims: MoeDims::read(&k, "expert_feed_forward_length")?,
                n_embd: common.n_embd,
                gating: Gating::SoftmaxWeight,
                norm: false,
                scale: k.opt_f32("expert_weights_scale")?.unwrap_or(0.0),
                glu: ExpertGlu::Oai {
                    alpha: OAI_ALPHA,
                    limit: OAI_LIMIT,
                },
                shared_ff: None,
            },
            common,
            heads,
            rope,
            rope_swa,
            sliding_window,
            swa_layers,
        })
    }
}

struct Layer<B: Backend> {
    attn_norm: B::Weight,
    attn: AttnWeights<B>,
    /// `attn_output.bias` `[n_embd]`.
    wo_b: B::Weight,
    /// The FFN's pre-norm (`post_attention_norm`).
    ffn_norm: B::Weight,
    ffn: MoeWeights<B>,
}

/// A gpt-oss model's weights on a backend.
pub struct GptOss<B: Backend> {
    info: ModelInfo,
    hp: Hparams,
    embd: Embeddings<B>,
    layers: Vec<Layer<B>>,
}

/// The registry's entry for the family.
pub struct GptOssArch;

impl Architecture for GptOssArch {
    fn load<B: Backend>(t: &Loader<'_, B>, arch: &str) -> Result<Box<dyn Family<B>>, ModelError> {
        let hp = Hparams::read(t.file, arch)?;
        let (c, h) = (&hp.common, &hp.heads);
        let e = c.n_embd;
        let has = AttnTensors {
            bias: true,
            qk_norm: false,
            qk_norm_whole: false,
        };
        let experts = MoeTensors {
            biases: true,
            probs_b: false,
            shared_ff: None,
            shared_gate: false,
        };
        let mut layers = Vec::with_capacity(c.n_layer);
        for il in 0..c.n_layer {
            let n = |s: &str| Loader::<B>::blk(il, s);
            let mut attn = AttnWeights::load(t, il, e, h, has)?;
            attn.sinks = Some(t.req(&n("attn_sinks.weight"), &[h.n_head])?);
            layers.push(Layer {
                attn_norm: t.req(&n("attn_norm.weight"), &[e])?,
                attn,
                wo_b: t.req(&n("attn_output.bias"), &[e])?,
                ffn_norm: t.req(&n("post_attention_norm.weight"), &[e])?,
                ffn: MoeWeights::load(t, il, e, hp.moe.dims, experts)?,
            });
        }
        Ok(Box::new(GptOss {
            info: ModelInfo::new(arch, "gpt-oss", c),
            embd: Embeddings::load(t, c)?,
            layers,
            hp,
        }))
    }
}

impl<B: Backend> Family<B> for GptOss<B> {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn scratch_dims(&self) -> ScratchDims {
        ScratchDims::new(&self.hp.common, &self.hp.heads, self.hp.moe.dims.n_ff_exp)
    }

    fn family_scratch(&self, be: &B, rows: usize) -> Result<FamilyScratch, ModelError> {
        let moe = MoeScratch::new(be, self.hp.moe.dims, self.hp.common.n_embd, rows, false)?;
        Ok(FamilyScratch::default().with(moe))
    }

    fn new_state(&self, be: &B, n_ctx: usize, cache: KvType) -> Result<SeqState<B>, ModelError> {
        blocks::kv_state(be, &self.hp.heads, self.hp.common.n_layer, n_ctx, cache)
    }

    fn layers(&self, be: &B, batch: &mut Batch<'_, '_, B>, s: &mut Scratch<B>) -> Result<(), ModelError> {
        let (c, hp) = (&self.hp.common, &self.hp);
        let rows = batch.rows();
        let len = rows * c.n_embd;
        be.embed(&self.embd.token_embd, &batch.tokens, 1.0, &mut s.x)?;
        for (il, l) in self.layers.iter().enumerate() {
            let swa = hp.swa_layers[il];
            let attn = AttnLayer {
                heads: hp.heads,
                rope: if swa { &hp.rope_swa } else { &hp.rope },
                window: if swa { hp.sliding_window } else { None },
                kq_scale: 1.0 / (hp.heads.head_dim_k as f32).sqrt(),
                q_scale: None,
                softcap: None,
                eps: c.rms_eps,
                qk_norm_whole: false,
            };
            be.rmsnorm(&s.x, &l.attn_norm, rows, c.rms_eps, &mut s.xn)?;
            blocks::attention(be, batch, s, il, &attn, &l.attn, None)?;
            be.add_bias(&mut s.xn, &l.wo_b, rows)?;
            be.add(&mut s.x, &s.xn, len)?;
            be.rmsnorm(&s.x, &l.ffn_norm, rows, c.rms_eps, &mut s.xn)?;
            moe::moe_ffn(be, s, rows, &hp.moe, &l.ffn)?;
            be.add(&mut s.x, &s.xn, len)?;
        }
        Ok(())
    }

    fn head(&self) -> OutputHead<'_, B> {
        self.embd.head(self.hp.common.rms_eps)
    }
}
