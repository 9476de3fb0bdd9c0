//! The llama family (llama, mistral, qwen2, qwen3):
//!
//! ```text
//! x = embd[tokens]
//! per layer:  x += Wo · attn(rope(norm_qk(Wq·n + bq)), rope(norm_qk(Wk·n + bk)), Wv·n + bv),  n = rmsnorm(x)
//!             x += Wdown · (silu(Wgate·n) * Wup·n),                                           n = rmsnorm(x)
//! ```
//! Biases are qwen2's, per-head q/k norms qwen3's; llama and mistral rotate adjacent pairs,
//! the qwens halves. K and V heads may differ in width.

use super::blocks::{
    self, AttnLayer, AttnTensors, AttnWeights, Batch, Embeddings, FfnWeights, Gate, OutputHead, Scratch, ScratchDims,
};
use super::hparams::{self, Common, Heads, Keys};
use super::state::SeqState;
use super::tensors::Loader;
use super::{Architecture, Family, ModelError, ModelInfo};
use crate::backend::{Backend, Rope, RopeKind};
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
    /// Per-head q/k RMS norms (qwen3).
    pub qk_norm: bool,
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
        Ok(Hparams {
            n_ff: k.count("feed_forward_length")?,
            rope: hparams::rope(&k, kind, heads.head_dim_k, "rope.freq_base")?,
            qkv_bias: arch == "qwen2",
            qk_norm: arch == "qwen3",
            common,
            heads,
        })
    }
}

struct Layer<B: Backend> {
    attn_norm: B::Weight,
    attn: AttnWeights<B>,
    ffn_norm: B::Weight,
    ffn: FfnWeights<B>,
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
            qk_norm: hp.qk_norm,
        };
        let mut layers = Vec::with_capacity(c.n_layer);
        for il in 0..c.n_layer {
            let n = |s: &str| Loader::<B>::blk(il, s);
            layers.push(Layer {
                attn_norm: t.req(&n("attn_norm.weight"), &[e])?,
                attn: AttnWeights::load(t, il, e, h, has)?,
                ffn_norm: t.req(&n("ffn_norm.weight"), &[e])?,
                ffn: FfnWeights::load(t, il, e, hp.n_ff)?,
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

    fn new_state(&self, be: &B, n_ctx: usize) -> Result<SeqState<B>, ModelError> {
        blocks::kv_state(be, &self.hp.heads, self.hp.common.n_layer, n_ctx)
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
        };
        be.embed(&self.embd.token_embd, &batch.tokens, 1.0, &mut s.x)?;
        for (il, l) in self.layers.iter().enumerate() {
            be.rmsnorm(&s.x, &l.attn_norm, rows, c.rms_eps, &mut s.xn)?;
            blocks::attention(be, batch, s, il, &attn, &l.attn, self.rope_freqs.as_ref())?;
            be.add(&mut s.x, &s.xn, len)?;
            be.rmsnorm(&s.x, &l.ffn_norm, rows, c.rms_eps, &mut s.xn)?;
            blocks::ffn(be, s, rows, hp.n_ff, &l.ffn, Gate::Silu)?;
            be.add(&mut s.x, &s.xn, len)?;
        }
        Ok(())
    }

    fn head(&self) -> OutputHead<'_, B> {
        self.embd.head(self.hp.common.rms_eps)
    }
}
