//! Multi-head latent attention (deepseek2, glm4moe), in the absorbed form: keys and values
//! live in one compressed latent per token, so the cache holds `kv_lora_rank + rope` values
//! per token and layer instead of full K and V heads.
//!
//! ```text
//! q      = Wq_b · rmsnorm(Wq_a · n)   (or Wq · n)         [rows, n_head, nope + rope]
//! c, kpe = Wkv_a · n                                       [rows, kv_lora], [rows, rope]
//! Q_h    = [ Wk_b_h · q_nope_h ; rope(q_pe_h) ]            [rows, n_head, kv_lora + rope]
//! K      = [ rmsnorm(c) ; rope(kpe) ]   (one KV head, cached; V is its first kv_lora values)
//! o_h    = Wv_b_h · attn(Q_h, K, V)                        [rows, n_head, v_head]
//! out    = Wo · o
//! ```
//! The per-head products `Wk_b_h`, `Wv_b_h` are the expert-grouped matmul with the head as
//! the expert (`attn_k_b` and `attn_v_b` are stacked per head in the GGUF).

use super::blocks::{self, Batch, Scratch};
use super::error::ModelError;
use super::hparams::{bad, Keys};
use super::tensors::Loader;
use crate::backend::{AttnParams, Backend, BackendError, MatId, Rope, Strided};

/// The widths of latent attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlaDims {
    pub n_head: usize,
    /// Rank of q's low-rank pair (`None`: q is one full projection).
    pub q_lora: Option<usize>,
    pub kv_lora: usize,
    /// Per head: the part of q/k without rope, and the roped part.
    pub nope: usize,
    pub rope: usize,
    /// Width of a value head after `Wv_b`.
    pub v_head: usize,
}

impl MlaDims {
    /// From `attention.{q,kv}_lora_rank`, `attention.{key,value}_length_mla` and
    /// `rope.dimension_count`; `attention.key_length`/`value_length`, when present, must be the
    /// absorbed widths.
    pub fn read(k: &Keys<'_>) -> Result<Self, ModelError> {
        let n_head = k.count("attention.head_count")?;
        let kv_lora = k.count("attention.kv_lora_rank")?;
        let q_lora = match k.opt_u32("attention.q_lora_rank")? {
            None | Some(0) => None,
            Some(r) => Some(r as usize),
        };
        let key_mla = k.count("attention.key_length_mla").map_err(|_| {
            bad(
                k.key("attention.key_length_mla"),
                "missing: only the split attn_k_b/attn_v_b layout (n_head_kv = 1) is supported",
            )
        })?;
        let v_head = k.count("attention.value_length_mla")?;
        let rope = k.count("rope.dimension_count")?;
        if rope >= key_mla || !rope.is_multiple_of(2) {
            return Err(bad(
                k.key("rope.dimension_count"),
                format!("{rope} must be even and below the head size {key_mla}"),
            ));
        }
        if let Some(kv) = k.opt_count("attention.head_count_kv")? {
            if kv != 1 {
                return Err(bad(
                    k.key("attention.head_count_kv"),
                    format!("{kv}: latent attention has one KV head"),
                ));
            }
        }
        let d = MlaDims {
            n_head,
            q_lora,
            kv_lora,
            nope: key_mla - rope,
            rope,
            v_head,
        };
        for (key, want) in [
            ("attention.key_length", d.k_width()),
            ("attention.value_length", kv_lora),
        ] {
            if let Some(v) = k.opt_count(key)? {
                if v != want {
                    return Err(bad(k.key(key), format!("{v}, expected {want} for latent attention")));
                }
            }
        }
        if d.k_width() > crate::backend::MAX_HEAD_DIM {
            return Err(bad(
                k.key("attention.kv_lora_rank"),
                format!(
                    "latent heads of {} exceed {}",
                    d.k_width(),
                    crate::backend::MAX_HEAD_DIM
                ),
            ));
        }
        Ok(d)
    }

    /// A cached key (and query head): latent plus rope part.
    pub fn k_width(&self) -> usize {
        self.kv_lora + self.rope
    }

    /// Width of q before absorption, per row.
    fn q_raw(&self) -> usize {
        self.n_head * (self.nope + self.rope)
    }
}

/// Scratch of latent attention for passes of up to `rows` tokens.
pub struct MlaScratch<B: Backend> {
    /// [rows, q_lora]
    q_a: B::Buffer,
    /// [rows, n_head, nope + rope]
    q_raw: B::Buffer,
    /// [rows * n_head, nope]
    q_nope: B::Buffer,
    /// [rows * n_head, rope]
    q_pe: B::Buffer,
    /// [rows * n_head, kv_lora]
    q_abs: B::Buffer,
    /// [rows, kv_lora + rope]
    kv_raw: B::Buffer,
    /// [rows, kv_lora]
    kv_c: B::Buffer,
    /// [rows, rope]
    k_pe: B::Buffer,
    /// [rows * n_head, v_head]
    v_out: B::Buffer,
    /// [rows * n_head]: each pair's head, the "expert" of the per-head matmuls.
    head_ids: B::Buffer,
}

impl<B: Backend> MlaScratch<B> {
    pub fn new(be: &B, d: MlaDims, rows: usize) -> Result<Self, BackendError> {
        let hr = rows * d.n_head;
        Ok(MlaScratch {
            q_a: be.alloc(rows * d.q_lora.unwrap_or(0))?,
            q_raw: be.alloc(rows * d.q_raw())?,
            q_nope: be.alloc(hr * d.nope)?,
            q_pe: be.alloc(hr * d.rope)?,
            q_abs: be.alloc(hr * d.kv_lora)?,
            kv_raw: be.alloc(rows * d.k_width())?,
            kv_c: be.alloc(rows * d.kv_lora)?,
            k_pe: be.alloc(rows * d.rope)?,
            v_out: be.alloc(hr * d.v_head)?,
            head_ids: be.alloc(hr)?,
        })
    }
}

/// q's projection: one matrix, or the low-rank pair with its norm.
pub enum QProj<B: Backend> {
    Full(B::Weight),
    LowRank {
        a: B::Weight,
        norm: B::Weight,
        b: B::Weight,
    },
}

/// One layer's latent-attention tensors.
pub struct MlaWeights<B: Backend> {
    pub q: QProj<B>,
    /// `[n_embd, kv_lora + rope]`
    pub kv_a: B::Weight,
    pub kv_a_norm: B::Weight,
    /// `[nope, kv_lora, n_head]`
    pub k_b: B::Weight,
    /// `[kv_lora, v_head, n_head]`
    pub v_b: B::Weight,
    /// `[n_head * v_head, n_embd]`
    pub wo: B::Weight,
}

impl<B: Backend> MlaWeights<B> {
    pub fn load(t: &Loader<'_, B>, il: usize, e: usize, d: &MlaDims) -> Result<Self, ModelError> {
        let n = |s: &str| Loader::<B>::blk(il, s);
        let q = match d.q_lora {
            Some(r) => QProj::LowRank {
                a: t.req(&n("attn_q_a.weight"), &[e, r])?,
                norm: t.req(&n("attn_q_a_norm.weight"), &[r])?,
                b: t.req(&n("attn_q_b.weight"), &[r, d.q_raw()])?,
            },
            None => QProj::Full(t.req(&n("attn_q.weight"), &[e, d.q_raw()])?),
        };
        if !t.has(&n("attn_k_b.weight")) && t.has(&n("attn_kv_b.weight")) {
            return Err(ModelError::MissingTensor {
                name: format!(
                    "{} (this file has the legacy attn_kv_b layout; convert it again with a current llama.cpp)",
                    n("attn_k_b.weight")
                ),
            });
        }
        Ok(MlaWeights {
            q,
            kv_a: t.req(&n("attn_kv_a_mqa.weight"), &[e, d.k_width()])?,
            kv_a_norm: t.req(&n("attn_kv_a_norm.weight"), &[d.kv_lora])?,
            k_b: t.req(&n("attn_k_b.weight"), &[d.nope, d.kv_lora, d.n_head])?,
            v_b: t.req(&n("attn_v_b.weight"), &[d.kv_lora, d.v_head, d.n_head])?,
            wo: t.req(&n("attn_output.weight"), &[d.n_head * d.v_head, e])?,
        })
    }
}

/// The attention parameters of a latent-attention layer.
pub struct MlaLayer<'a> {
    pub dims: MlaDims,
    pub rope: &'a Rope,
    /// Multiplies q·k (YaRN's magnitude folded in).
    pub kq_scale: f32,
    pub eps: f32,
}

/// Write each pair's head id into the scratch (once per pass: every layer uses the same).
pub fn prepare_pass<B: Backend>(be: &B, s: &mut Scratch<B>, rows: usize, n_head: usize) -> Result<(), ModelError> {
    let ms = s.family.get_mut::<MlaScratch<B>>().ok_or_else(no_room)?;
    let ids: Vec<f32> = (0..rows * n_head).map(|p| (p % n_head) as f32).collect();
    be.write(&mut ms.head_ids, &ids)?;
    Ok(())
}

/// `count` runs of `width` from `src_off + i*src_stride` to `dst_off + i*dst_stride`.
fn runs(count: usize, width: usize, src: (usize, usize), dst: (usize, usize)) -> Strided {
    Strided {
        count,
        width,
        src_off: src.0,
        src_stride: src.1,
        dst_off: dst.0,
        dst_stride: dst.1,
    }
}

/// Latent attention of layer `il` over every sequence of the batch: reads `s.xn`, writes the
/// projected output to `s.xn`. Uses `s.q` (`[rows, n_head, kv_lora + rope]`), `s.k`
/// (`[rows, kv_lora + rope]`) and `s.att` (`[rows, n_head, kv_lora]`).
pub fn attention<B: Backend + 'static>(
    be: &B,
    batch: &mut Batch<'_, '_, B>,
    s: &mut Scratch<B>,
    il: usize,
    l: &MlaLayer<'_>,
    w: &MlaWeights<B>,
) -> Result<(), ModelError> {
    let rows = batch.rows();
    let d = l.dims;
    let (nh, kw, hk) = (d.n_head, d.k_width(), d.nope + d.rope);
    let hr = rows * nh;
    let ms = s.family.get_mut::<MlaScratch<B>>().ok_or_else(no_room)?;
    match &w.q {
        QProj::Full(wq) => be.matmul(wq, &s.xn, rows, &mut ms.q_raw)?,
        QProj::LowRank { a, norm, b } => {
            be.matmul(a, &s.xn, rows, &mut ms.q_a)?;
            be.rmsnorm_inplace(&mut ms.q_a, norm, rows, l.eps)?;
            be.matmul(b, &ms.q_a, rows, &mut ms.q_raw)?;
        }
    }
    be.copy_strided(&ms.q_raw, &mut ms.q_nope, &runs(hr, d.nope, (0, hk), (0, d.nope)))?;
    be.copy_strided(&ms.q_raw, &mut ms.q_pe, &runs(hr, d.rope, (d.nope, hk), (0, d.rope)))?;
    be.rope(&mut ms.q_pe, nh, d.rope, &batch.positions, l.rope, None)?;
    be.matmul(&w.kv_a, &s.xn, rows, &mut ms.kv_raw)?;
    be.copy_strided(
        &ms.kv_raw,
        &mut ms.kv_c,
        &runs(rows, d.kv_lora, (0, kw), (0, d.kv_lora)),
    )?;
    be.copy_strided(
        &ms.kv_raw,
        &mut ms.k_pe,
        &runs(rows, d.rope, (d.kv_lora, kw), (0, d.rope)),
    )?;
    be.rope(&mut ms.k_pe, 1, d.rope, &batch.positions, l.rope, None)?;
    be.rmsnorm_inplace(&mut ms.kv_c, &w.kv_a_norm, rows, l.eps)?;
    // Absorb Wk_b into q, head by head: [rows * n_head, kv_lora].
    let per_head = MatId {
        rows,
        slots: nh,
        per_slot: true,
    };
    be.matmul_id(&w.k_b, None, &ms.q_nope, &ms.head_ids, per_head, &mut ms.q_abs)?;
    be.copy_strided(&ms.q_abs, &mut s.q, &runs(hr, d.kv_lora, (0, d.kv_lora), (0, kw)))?;
    be.copy_strided(&ms.q_pe, &mut s.q, &runs(hr, d.rope, (0, d.rope), (d.kv_lora, kw)))?;
    be.copy_strided(&ms.kv_c, &mut s.k, &runs(rows, d.kv_lora, (0, d.kv_lora), (0, kw)))?;
    be.copy_strided(&ms.k_pe, &mut s.k, &runs(rows, d.rope, (0, d.rope), (d.kv_lora, kw)))?;
    let heads = AttnParams {
        rows: 0,
        pos0: 0,
        n_head: nh,
        n_head_kv: 1,
        head_dim_k: kw,
        head_dim_v: d.kv_lora,
        scale: l.kq_scale,
        window: None,
        softcap: None,
        v_in_k: true,
    };
    blocks::store_and_attend(be, batch, il, &heads, [&mut s.q, &mut s.k, &mut s.v], None, &mut s.att)?;
    let ms = s.family.get_mut::<MlaScratch<B>>().ok_or_else(no_room)?;
    be.matmul_id(&w.v_b, None, &s.att, &ms.head_ids, per_head, &mut ms.v_out)?;
    be.matmul(&w.wo, &ms.v_out, rows, &mut s.xn)?;
    Ok(())
}

fn no_room() -> ModelError {
    ModelError::BadParam {
        key: "attention.kv_lora_rank".into(),
        problem: "the scratch has no room for latent attention".into(),
    }
}
