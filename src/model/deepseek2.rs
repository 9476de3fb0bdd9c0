//! The deepseek2 family (DeepSeek V2/V3, and glm4moe-style MLA models): latent attention
//! ([`super::mla`]), leading dense FFN blocks, then routed experts with a shared expert
//! ([`super::moe`]):
//!
//! ```text
//! x = embd[tokens]
//! per layer:  x += mla(n),                                n = rmsnorm(x)
//!             x += ffn(n)         (il < leading_dense)    n = rmsnorm(x)
//!             x += moe(n) + shared_ffn(n)   (otherwise)
//! ```
//! Routing: softmax or sigmoid scores (`expert_gating_func`), `exp_probs_b` biasing only the
//! choice, optional normalization and `expert_weights_scale`. Rope rotates adjacent pairs.

use super::blocks::{self, Batch, Embeddings, FamilyScratch, FfnWeights, Gate, OutputHead, Scratch, ScratchDims};
use super::error::ModelError;
use super::family::{Architecture, Family, ModelInfo};
use super::hparams::{self, bad, Common, Keys};
use super::mla::{self, MlaDims, MlaLayer, MlaScratch, MlaWeights};
use super::moe::{self, ExpertGlu, MoeDims, MoeFfn, MoeScratch, MoeTensors, MoeWeights};
use super::state::{check_cache_heads, KvCache, SeqState};
use super::tensors::Loader;
use crate::backend::{Backend, Gating, KvType, Rope, RopeKind, RopeScaling};
use crate::gguf::GgufFile;

/// The deepseek2 family's hyper-parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Hparams {
    pub common: Common,
    pub mla: MlaDims,
    /// Width of the leading dense blocks' FFN.
    pub n_ff: usize,
    pub n_dense_lead: usize,
    pub moe: MoeFfn,
    pub rope: Rope,
    pub kq_scale: f32,
}

impl Hparams {
    pub fn read(file: &GgufFile, arch: &str) -> Result<Self, ModelError> {
        let k = Keys { file, arch };
        let common = Common::read(&k)?;
        let mla = MlaDims::read(&k)?;
        let dims = MoeDims::read(&k, "expert_feed_forward_length")?;
        let n_shared = k.opt_u32("expert_shared_count")?.unwrap_or(0) as usize;
        let gating = match k.opt_u32("expert_gating_func")? {
            None | Some(0) => Gating::Softmax,
            Some(code) => Gating::from_gguf(code).ok_or_else(|| {
                bad(
                    k.key("expert_gating_func"),
                    format!("{code} (supported: 1 softmax, 2 sigmoid)"),
                )
            })?,
        };
        let rope = hparams::rope(&k, RopeKind::Norm, mla.rope, "rope.freq_base")?;
        // llama.cpp folds YaRN's magnitude into the q·k scale (its mscale, squared) over the
        // unabsorbed head width.
        let mscale = match rope.scaling {
            RopeScaling::Yarn(y) if y.factor > 1.0 => {
                let log_mul = k.opt_f32("rope.scaling.yarn_log_multiplier")?.unwrap_or(0.0) / 0.1;
                let org = y.attn_factor * (1.0 + 0.1 * y.factor.ln());
                org * (1.0 + 0.1 * log_mul * y.factor.ln())
            }
            _ => 1.0,
        };
        let kq_scale = mscale * mscale / ((mla.nope + mla.rope) as f32).sqrt();
        let n_layer = common.n_layer;
        let n_dense_lead = k.opt_u32("leading_dense_block_count")?.unwrap_or(0) as usize;
        if n_dense_lead > n_layer {
            return Err(bad(
                k.key("leading_dense_block_count"),
                format!("{n_dense_lead} of {n_layer} layers"),
            ));
        }
        let n_ff = if n_dense_lead > 0 {
            k.count("feed_forward_length")?
        } else {
            0
        };
        let scale = k.opt_f32("expert_weights_scale")?.unwrap_or(0.0);
        Ok(Hparams {
            moe: MoeFfn {
                dims,
                n_embd: common.n_embd,
                gating,
                norm: k.opt_bool("expert_weights_norm")?.unwrap_or(false),
                scale,
                glu: ExpertGlu::Silu,
                shared_ff: (n_shared > 0).then_some(n_shared * dims.n_ff_exp),
            },
            common,
            mla,
            n_ff,
            n_dense_lead,
            rope,
            kq_scale,
        })
    }
}

enum Ffn<B: Backend> {
    Dense(FfnWeights<B>),
    Moe(MoeWeights<B>),
}

struct Layer<B: Backend> {
    attn_norm: B::Weight,
    attn: MlaWeights<B>,
    ffn_norm: B::Weight,
    ffn: Ffn<B>,
}

/// A deepseek2-family model's weights on a backend.
pub struct Deepseek2<B: Backend> {
    info: ModelInfo,
    hp: Hparams,
    embd: Embeddings<B>,
    layers: Vec<Layer<B>>,
}

/// The registry's entry for the family.
pub struct Deepseek2Arch;

impl Architecture for Deepseek2Arch {
    fn load<B: Backend>(t: &Loader<'_, B>, arch: &str) -> Result<Box<dyn Family<B>>, ModelError> {
        let hp = Hparams::read(t.file, arch)?;
        let e = hp.common.n_embd;
        let has = MoeTensors {
            biases: false,
            probs_b: true,
            shared_ff: hp.moe.shared_ff,
            shared_gate: false,
        };
        let mut layers = Vec::with_capacity(hp.common.n_layer);
        for il in 0..hp.common.n_layer {
            let n = |s: &str| Loader::<B>::blk(il, s);
            let ffn = if il < hp.n_dense_lead {
                Ffn::Dense(FfnWeights::load(t, il, e, hp.n_ff)?)
            } else {
                Ffn::Moe(MoeWeights::load(t, il, e, hp.moe.dims, has)?)
            };
            layers.push(Layer {
                attn_norm: t.req(&n("attn_norm.weight"), &[e])?,
                attn: MlaWeights::load(t, il, e, &hp.mla)?,
                ffn_norm: t.req(&n("ffn_norm.weight"), &[e])?,
                ffn,
            });
        }
        Ok(Box::new(Deepseek2 {
            info: ModelInfo::new(arch, "deepseek2", &hp.common),
            embd: Embeddings::load(t, &hp.common)?,
            layers,
            hp,
        }))
    }
}

impl<B: Backend> Family<B> for Deepseek2<B> {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn scratch_dims(&self) -> ScratchDims {
        let (c, d) = (&self.hp.common, &self.hp.mla);
        ScratchDims {
            n_embd: c.n_embd,
            q_dim: d.n_head * d.k_width(),
            k_dim: d.k_width(),
            // V is read from the K cache; nothing is projected into `s.v`.
            v_dim: 1,
            att_dim: d.n_head * d.kv_lora,
            n_ff: self.hp.n_ff.max(self.hp.moe.shared_ff.unwrap_or(0)).max(1),
            n_vocab: c.n_vocab,
        }
    }

    fn family_scratch(&self, be: &B, rows: usize) -> Result<FamilyScratch, ModelError> {
        let moe = MoeScratch::new(be, self.hp.moe.dims, self.hp.common.n_embd, rows, false)?;
        let mla = MlaScratch::new(be, self.hp.mla, rows)?;
        Ok(FamilyScratch::default().with(moe).with(mla))
    }

    fn new_state(&self, be: &B, n_ctx: usize, cache: KvType) -> Result<SeqState<B>, ModelError> {
        // One latent row per token and layer: keys and values both read from it (a value head
        // is its first kv_lora values).
        check_cache_heads(cache, self.hp.mla.k_width(), self.hp.mla.kv_lora)?;
        let widths = vec![(self.hp.mla.k_width(), 0); self.hp.common.n_layer];
        Ok(SeqState::new(KvCache::new(be, &widths, n_ctx, cache)?))
    }

    fn layers(&self, be: &B, batch: &mut Batch<'_, '_, B>, s: &mut Scratch<B>) -> Result<(), ModelError> {
        let (c, hp) = (&self.hp.common, &self.hp);
        let rows = batch.rows();
        let len = rows * c.n_embd;
        let attn = MlaLayer {
            dims: hp.mla,
            rope: &hp.rope,
            kq_scale: hp.kq_scale,
            eps: c.rms_eps,
        };
        be.embed(&self.embd.token_embd, &batch.tokens, 1.0, &mut s.x)?;
        mla::prepare_pass(be, s, rows, hp.mla.n_head)?;
        for (il, l) in self.layers.iter().enumerate() {
            be.rmsnorm(&s.x, &l.attn_norm, rows, c.rms_eps, &mut s.xn)?;
            mla::attention(be, batch, s, il, &attn, &l.attn)?;
            be.add(&mut s.x, &s.xn, len)?;
            be.rmsnorm(&s.x, &l.ffn_norm, rows, c.rms_eps, &mut s.xn)?;
            match &l.ffn {
                Ffn::Dense(f) => blocks::ffn(be, s, rows, hp.n_ff, f, Gate::Silu)?,
                Ffn::Moe(m) => moe::moe_ffn(be, s, rows, &hp.moe, m)?,
            }
            be.add(&mut s.x, &s.xn, len)?;
        }
        Ok(())
    }

    fn head(&self) -> OutputHead<'_, B> {
        self.embd.head(self.hp.common.rms_eps)
    }
}
