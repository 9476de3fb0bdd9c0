//! The routed-experts FFN block, written once for every mixture-of-experts family:
//!
//! ```text
//! logits = Wr·n (+ br)                          router, [rows, n_expert]
//! ids, w = route(logits)                        k experts per row and their weights
//! h[r,j] = act(Wg[ids]·n (+bg), Wu[ids]·n (+bu))   only the chosen experts' rows are read
//! y[r]   = sum_j w[r,j] · (Wd[ids]·h[r,j] (+bd))
//! y     += shared expert FFN(n)                 deepseek2
//! y     += sigmoid(ws·n) · shared expert FFN(n)  qwen35moe (ws: `[n_embd]`, one logit a row)
//! ```
//! The gated shared expert is a routed FFN of one expert with sigmoid gating: its weight per
//! row comes from `route_experts` and meets the expert's output in `moe_combine`, as ggml's
//! `ffn_shexp * sigmoid(gate)`.
//! Expert tensors are the GGUF's 3-D stacks, placed once and read in place.

use super::blocks::{self, FfnWeights, Gate, Scratch};
use super::error::ModelError;
use super::hparams::{bad, Keys};
use super::tensors::Loader;
use crate::backend::{Backend, BackendError, Gating, MatId, Route};

/// The widths of a routed FFN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeDims {
    pub n_expert: usize,
    /// Experts used per token.
    pub k: usize,
    /// Hidden width of one expert.
    pub n_ff_exp: usize,
}

impl MoeDims {
    /// `expert_count`, `expert_used_count` and the expert width (`ff_key`) of a model.
    pub fn read(k: &Keys<'_>, ff_key: &str) -> Result<Self, ModelError> {
        let n_expert = k.count("expert_count")?;
        let used = k.count("expert_used_count")?;
        if used > n_expert {
            return Err(bad(
                k.key("expert_used_count"),
                format!("{used} experts used of {n_expert}"),
            ));
        }
        Ok(MoeDims {
            n_expert,
            k: used,
            n_ff_exp: k.count(ff_key)?,
        })
    }
}

/// Scratch of a routed FFN for passes of up to `rows` tokens.
pub struct MoeScratch<B: Backend> {
    /// Router logits [rows, n_expert].
    logits: B::Buffer,
    /// Chosen expert ids [rows, k] (whole f32 numbers).
    ids: B::Buffer,
    /// Their weights [rows, k].
    weights: B::Buffer,
    /// [rows * k, n_ff_exp]
    gate: B::Buffer,
    up: B::Buffer,
    /// Expert outputs [rows * k, n_embd].
    down: B::Buffer,
    /// The weighted sum [rows, n_embd].
    sum: B::Buffer,
    /// A gated shared expert's gate logits, its one id and its weights [rows] each, and its
    /// gated output [rows, n_embd].
    shared_gate: Option<[B::Buffer; 4]>,
}

impl<B: Backend> MoeScratch<B> {
    /// Scratch for `rows` rows; `gated_shared`: the shared expert is gated (qwen35moe).
    pub fn new(be: &B, d: MoeDims, n_embd: usize, rows: usize, gated_shared: bool) -> Result<Self, BackendError> {
        let pairs = rows * d.k;
        Ok(MoeScratch {
            logits: be.alloc(rows * d.n_expert)?,
            ids: be.alloc(pairs)?,
            weights: be.alloc(pairs)?,
            gate: be.alloc(pairs * d.n_ff_exp)?,
            up: be.alloc(pairs * d.n_ff_exp)?,
            down: be.alloc(pairs * n_embd)?,
            sum: be.alloc(rows * n_embd)?,
            shared_gate: if gated_shared {
                Some([
                    be.alloc(rows)?,
                    be.alloc(rows)?,
                    be.alloc(rows)?,
                    be.alloc(rows * n_embd)?,
                ])
            } else {
                None
            },
        })
    }
}

/// An expert's activation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ExpertGlu {
    /// `silu(gate) * up`.
    Silu,
    /// gpt-oss's clamped SwiGLU.
    Oai { alpha: f32, limit: f32 },
}

/// One layer's routed-FFN tensors.
pub struct MoeWeights<B: Backend> {
    /// Router `[n_embd, n_expert]`.
    pub gate_inp: B::Weight,
    /// Router bias `[n_expert]` (gpt-oss).
    pub gate_inp_b: Option<B::Weight>,
    /// Selection-only bias `[n_expert]` (deepseek V3 `exp_probs_b`).
    pub probs_b: Option<B::Weight>,
    /// `[n_embd, n_ff_exp, n_expert]`
    pub gate: B::Weight,
    pub up: B::Weight,
    /// `[n_ff_exp, n_embd, n_expert]`
    pub down: B::Weight,
    /// Per-expert biases of gate, up (`[n_ff_exp, n_expert]`) and down (`[n_embd, n_expert]`).
    pub biases: Option<[B::Weight; 3]>,
    /// Shared expert (always on).
    pub shared: Option<FfnWeights<B>>,
    /// The shared expert's gate `[n_embd]` (a one-row matrix: one logit per row; qwen35moe).
    pub shared_gate: Option<B::Weight>,
}

/// Which optional routed-FFN tensors a family's layers have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MoeTensors {
    /// `ffn_gate_inp.bias` and `ffn_{gate,up,down}_exps.bias` (gpt-oss).
    pub biases: bool,
    /// `exp_probs_b.bias`, loaded when present.
    pub probs_b: bool,
    /// Shared expert of this width (`ffn_{gate,up,down}_shexp`).
    pub shared_ff: Option<usize>,
    /// The shared expert's sigmoid gate (`ffn_gate_inp_shexp`).
    pub shared_gate: bool,
}

impl<B: Backend> MoeWeights<B> {
    /// Layer `il`'s routed-FFN tensors, shapes checked.
    pub fn load(t: &Loader<'_, B>, il: usize, e: usize, d: MoeDims, has: MoeTensors) -> Result<Self, ModelError> {
        let n = |s: &str| Loader::<B>::blk(il, s);
        let (ne, ff) = (d.n_expert, d.n_ff_exp);
        let biases = if has.biases {
            Some([
                t.req(&n("ffn_gate_exps.bias"), &[ff, ne])?,
                t.req(&n("ffn_up_exps.bias"), &[ff, ne])?,
                t.req(&n("ffn_down_exps.bias"), &[e, ne])?,
            ])
        } else {
            None
        };
        let shared = match has.shared_ff {
            Some(sff) => Some(FfnWeights {
                gate: t.req(&n("ffn_gate_shexp.weight"), &[e, sff])?,
                up: t.req(&n("ffn_up_shexp.weight"), &[e, sff])?,
                down: t.req(&n("ffn_down_shexp.weight"), &[sff, e])?,
            }),
            None => None,
        };
        Ok(MoeWeights {
            gate_inp: t.req(&n("ffn_gate_inp.weight"), &[e, ne])?,
            gate_inp_b: t.opt(&n("ffn_gate_inp.bias"), &[ne], has.biases)?,
            probs_b: t.opt(
                &n("exp_probs_b.bias"),
                &[ne],
                has.probs_b && t.has(&n("exp_probs_b.bias")),
            )?,
            gate: t.req(&n("ffn_gate_exps.weight"), &[e, ff, ne])?,
            up: t.req(&n("ffn_up_exps.weight"), &[e, ff, ne])?,
            down: t.req(&n("ffn_down_exps.weight"), &[ff, e, ne])?,
            biases,
            shared,
            shared_gate: t.opt(&n("ffn_gate_inp_shexp.weight"), &[e], has.shared_gate)?,
        })
    }
}

/// How a family routes and activates its experts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeFfn {
    pub dims: MoeDims,
    pub n_embd: usize,
    pub gating: Gating,
    pub norm: bool,
    pub scale: f32,
    pub glu: ExpertGlu,
    /// Width of the shared expert, if any.
    pub shared_ff: Option<usize>,
}

/// Routed FFN over `rows` rows: reads `s.xn`, writes `s.xn`.
pub fn moe_ffn<B: Backend>(
    be: &B,
    s: &mut Scratch<B>,
    rows: usize,
    f: &MoeFfn,
    w: &MoeWeights<B>,
) -> Result<(), ModelError> {
    let d = f.dims;
    let e = f.n_embd;
    let ms = s.family.get_mut::<MoeScratch<B>>().ok_or_else(no_room)?;
    be.matmul(&w.gate_inp, &s.xn, rows, &mut ms.logits)?;
    if let Some(b) = &w.gate_inp_b {
        be.add_bias(&mut ms.logits, b, rows)?;
    }
    let route = Route {
        n_expert: d.n_expert,
        k: d.k,
        gating: f.gating,
        norm: f.norm,
        scale: f.scale,
    };
    be.route_experts(
        &ms.logits,
        rows,
        &route,
        w.probs_b.as_ref(),
        &mut ms.ids,
        &mut ms.weights,
    )?;
    let shared_in = MatId {
        rows,
        slots: d.k,
        per_slot: false,
    };
    let [bg, bu, bd] = match &w.biases {
        Some([g, u, dn]) => [Some(g), Some(u), Some(dn)],
        None => [None, None, None],
    };
    be.matmul_id(&w.gate, bg, &s.xn, &ms.ids, shared_in, &mut ms.gate)?;
    be.matmul_id(&w.up, bu, &s.xn, &ms.ids, shared_in, &mut ms.up)?;
    let pairs_len = rows * d.k * d.n_ff_exp;
    match f.glu {
        ExpertGlu::Silu => be.swiglu(&mut ms.gate, &ms.up, pairs_len)?,
        ExpertGlu::Oai { alpha, limit } => be.swiglu_oai(&mut ms.gate, &ms.up, pairs_len, alpha, limit)?,
    }
    let per_pair = MatId {
        per_slot: true,
        ..shared_in
    };
    be.matmul_id(&w.down, bd, &ms.gate, &ms.ids, per_pair, &mut ms.down)?;
    be.moe_combine(&ms.down, &ms.weights, rows, d.k, e, &mut ms.sum)?;
    // The shared expert's gate reads the FFN's input, which the shared expert overwrites.
    if w.shared_gate.is_some() && ms.shared_gate.is_none() {
        return Err(no_room());
    }
    if let (Some(gw), Some([logit, id, weight, _])) = (&w.shared_gate, &mut ms.shared_gate) {
        be.matmul(gw, &s.xn, rows, logit)?;
        let one = Route {
            n_expert: 1,
            k: 1,
            gating: Gating::Sigmoid,
            norm: false,
            scale: 0.0,
        };
        be.route_experts(logit, rows, &one, None, id, weight)?;
    }
    match (&w.shared, f.shared_ff) {
        (Some(sh), Some(sff)) => {
            blocks::ffn(be, s, rows, sff, sh, Gate::Silu)?;
            let ms = s.family.get_mut::<MoeScratch<B>>().ok_or_else(no_room)?;
            if let (Some(_), Some([_, _, weight, gated])) = (&w.shared_gate, &mut ms.shared_gate) {
                be.moe_combine(&s.xn, weight, rows, 1, e, gated)?;
                be.copy_rows(gated, 0, rows, e, &mut s.xn)?;
            }
            be.add(&mut s.xn, &ms.sum, rows * e)?;
        }
        _ => be.copy_rows(&ms.sum, 0, rows, e, &mut s.xn)?,
    }
    Ok(())
}

fn no_room() -> ModelError {
    ModelError::BadParam {
        key: "expert_count".into(),
        problem: "the scratch has no room for experts".into(),
    }
}
