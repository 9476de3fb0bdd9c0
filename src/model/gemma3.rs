//! The Gemma 3 family:
//!
//! ```text
//! x = embd[tokens] * sqrt(n_embd)
//! per layer:  x += post_attn_norm(Wo · attn(...)),   q/k per-head RMS-normed, q pre-scaled,
//!                                                     sliding window on SWA layers (own rope base)
//!             x += post_ffn_norm(Wdown · (gelu_tanh(Wgate·n) * Wup·n))
//! ```

use super::blocks::{
    self, AttnLayer, AttnTensors, AttnWeights, Batch, Embeddings, FamilyScratch, FfnWeights, Gate, OutputHead, Scratch,
    ScratchDims,
};
use super::error::ModelError;
use super::family::{Architecture, Family, ModelInfo};
use super::hparams::{self, Common, Heads, Keys};
use super::state::SeqState;
use super::tensors::Loader;
use crate::backend::{Backend, KvType, Rope, RopeKind};
use crate::gguf::GgufFile;

/// Gemma 3's hyper-parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Hparams {
    pub common: Common,
    pub heads: Heads,
    pub n_ff: usize,
    /// Rope of full-attention layers.
    pub rope: Rope,
    /// Rope of sliding-window layers (its own base, default 10000 as in llama.cpp).
    pub rope_swa: Rope,
    /// Sliding window size: a key is masked when `q_pos - k_pos >= window` on SWA layers.
    pub sliding_window: Option<usize>,
    /// Per layer: true for sliding-window layers.
    pub swa_layers: Vec<bool>,
}

impl Hparams {
    pub fn read(file: &GgufFile, arch: &str) -> Result<Self, ModelError> {
        let k = Keys { file, arch };
        let common = Common::read(&k)?;
        let heads = Heads::read(&k, common.n_embd)?;
        let rope = hparams::rope(&k, RopeKind::Neox, heads.head_dim_k, "rope.freq_base")?;
        let rope_swa = hparams::rope(&k, RopeKind::Neox, heads.head_dim_k, "rope.freq_base_swa")?;
        let (sliding_window, swa_layers) = match k.opt_u32("attention.sliding_window")? {
            // llama.cpp's default for gemma3: every 6th layer is global.
            Some(w) if w > 0 => (
                Some(w as usize),
                hparams::swa_pattern(&k, "attention.sliding_window_pattern", common.n_layer, 6)?,
            ),
            _ => (None, vec![false; common.n_layer]),
        };
        Ok(Hparams {
            n_ff: k.count("feed_forward_length")?,
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
    post_attn_norm: B::Weight,
    ffn_norm: B::Weight,
    ffn: FfnWeights<B>,
    post_ffn_norm: B::Weight,
}

/// A Gemma 3 model's weights on a backend.
pub struct Gemma3<B: Backend> {
    info: ModelInfo,
    hp: Hparams,
    embd: Embeddings<B>,
    layers: Vec<Layer<B>>,
}

/// The registry's entry for the family.
pub struct Gemma3Arch;

impl Architecture for Gemma3Arch {
    fn load<B: Backend>(t: &Loader<'_, B>, arch: &str) -> Result<Box<dyn Family<B>>, ModelError> {
        let hp = Hparams::read(t.file, arch)?;
        let (c, h) = (&hp.common, &hp.heads);
        let e = c.n_embd;
        let has = AttnTensors {
            bias: false,
            qk_norm: true,
            qk_norm_whole: false,
        };
        let mut layers = Vec::with_capacity(c.n_layer);
        for il in 0..c.n_layer {
            let n = |s: &str| Loader::<B>::blk(il, s);
            layers.push(Layer {
                attn_norm: t.req(&n("attn_norm.weight"), &[e])?,
                attn: AttnWeights::load(t, il, e, h, has)?,
                post_attn_norm: t.req(&n("post_attention_norm.weight"), &[e])?,
                ffn_norm: t.req(&n("ffn_norm.weight"), &[e])?,
                ffn: FfnWeights::load(t, il, e, hp.n_ff)?,
                post_ffn_norm: t.req(&n("post_ffw_norm.weight"), &[e])?,
            });
        }
        if hp.rope.wants_factors() {
            return Err(ModelError::BadParam {
                key: "rope_freqs.weight".into(),
                problem: "gemma3 has no per-frequency rope factors".into(),
            });
        }
        let model = Gemma3 {
            info: ModelInfo::new(arch, "gemma3", c),
            embd: Embeddings::load(t, c)?,
            layers,
            hp,
        };
        Ok(Box::new(model))
    }
}

impl<B: Backend> Family<B> for Gemma3<B> {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn scratch_dims(&self) -> ScratchDims {
        ScratchDims::new(&self.hp.common, &self.hp.heads, self.hp.n_ff)
    }

    fn family_scratch(&self, _be: &B, _rows: usize) -> Result<FamilyScratch, ModelError> {
        Ok(FamilyScratch::default())
    }

    fn new_state(&self, be: &B, n_ctx: usize, cache: KvType) -> Result<SeqState<B>, ModelError> {
        blocks::kv_state(be, &self.hp.heads, self.hp.common.n_layer, n_ctx, cache)
    }

    fn layers(&self, be: &B, batch: &mut Batch<'_, '_, B>, s: &mut Scratch<B>) -> Result<(), ModelError> {
        let (c, hp) = (&self.hp.common, &self.hp);
        let rows = batch.rows();
        let len = rows * c.n_embd;
        be.embed(&self.embd.token_embd, &batch.tokens, (c.n_embd as f32).sqrt(), &mut s.x)?;
        for (il, l) in self.layers.iter().enumerate() {
            let swa = hp.swa_layers[il];
            let attn = AttnLayer {
                heads: hp.heads,
                rope: if swa { &hp.rope_swa } else { &hp.rope },
                window: if swa { hp.sliding_window } else { None },
                // Gemma pre-scales q instead of q·k.
                kq_scale: 1.0,
                q_scale: Some(1.0 / (hp.heads.head_dim_k as f32).sqrt()),
                softcap: None,
                eps: c.rms_eps,
                qk_norm_whole: false,
            };
            be.rmsnorm(&s.x, &l.attn_norm, rows, c.rms_eps, &mut s.xn)?;
            blocks::attention(be, batch, s, il, &attn, &l.attn, None)?;
            be.rmsnorm_inplace(&mut s.xn, &l.post_attn_norm, rows, c.rms_eps)?;
            be.add(&mut s.x, &s.xn, len)?;
            be.rmsnorm(&s.x, &l.ffn_norm, rows, c.rms_eps, &mut s.xn)?;
            blocks::ffn(be, s, rows, hp.n_ff, &l.ffn, Gate::Gelu)?;
            be.rmsnorm_inplace(&mut s.xn, &l.post_ffn_norm, rows, c.rms_eps)?;
            be.add(&mut s.x, &s.xn, len)?;
        }
        Ok(())
    }

    fn head(&self) -> OutputHead<'_, B> {
        self.embd.head(self.hp.common.rms_eps)
    }
}
