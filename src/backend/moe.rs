//! Parameters of the ops that mixture-of-experts and latent-attention graphs add, with the
//! checks and scalar rules every backend follows.
//!
//! A routed FFN runs as three ops: [`crate::backend::interface::Backend::route_experts`] turns each row's router
//! logits into its chosen experts (ids) and their weights; [`crate::backend::interface::Backend::matmul_id`]
//! multiplies each (row, slot) pair by its expert's matrix only (ggml's `mul_mat_id`), so a
//! pass reads the experts its rows chose and no others; [`crate::backend::interface::Backend::moe_combine`] sums
//! each row's expert outputs by their weights. MLA's per-head projections (`attn_k_b`,
//! `attn_v_b`) are the same `matmul_id` with the head as the expert.
//!
//! Expert ids travel in an ordinary f32 buffer (exact below 2^24), so a GPU backend routes on
//! the device and its matmuls read the ids there: no readback in the middle of a pass.

use super::checks::{need, shape};
use crate::backend::error::BackendError;

/// How router logits become expert scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gating {
    /// Softmax over all experts (qwen3moe, olmoe, deepseek V2).
    Softmax,
    /// Independent sigmoids (deepseek V3, glm4moe).
    Sigmoid,
    /// Choose by raw logit, then softmax over the chosen ones only (gpt-oss).
    SoftmaxWeight,
}

impl Gating {
    /// llama.cpp's `expert_gating_func` code: 1 softmax, 2 sigmoid.
    pub fn from_gguf(code: u32) -> Option<Gating> {
        match code {
            1 => Some(Gating::Softmax),
            2 => Some(Gating::Sigmoid),
            _ => None,
        }
    }
}

/// How a router chooses and weighs experts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Route {
    pub n_expert: usize,
    /// Experts used per row.
    pub k: usize,
    pub gating: Gating,
    /// Divide the chosen weights by their sum.
    pub norm: bool,
    /// Multiply the weights (after the norm) by this.
    pub scale: f32,
}

/// The smallest weight sum a norm divides by (llama.cpp's clamp: the smallest normal f16).
const MIN_WEIGHT_SUM: f32 = 6.103_515_6e-5;

impl Route {
    /// Error unless `k` experts of `n_expert` can be chosen.
    pub fn check(&self) -> Result<(), BackendError> {
        if self.k == 0 || self.k > self.n_expert {
            return Err(shape(
                "route_experts",
                format!("{} experts used of {}", self.k, self.n_expert),
            ));
        }
        if !self.scale.is_finite() {
            return Err(shape("route_experts", format!("weight scale {}", self.scale)));
        }
        Ok(())
    }

    /// Check a call's buffers: `rows` rows of `n_expert` logits, `k` ids and weights per row,
    /// and a bias (when given) of one value per expert. Also checks the route itself.
    pub fn check_call(
        &self,
        rows: usize,
        logits: usize,
        bias: Option<usize>,
        ids: usize,
        weights: usize,
    ) -> Result<(), BackendError> {
        let op = "route_experts";
        self.check()?;
        let (n, k) = (self.n_expert, self.k);
        let prod = |a: usize, b: usize| a.checked_mul(b).ok_or_else(|| shape(op, format!("{a} x {b} values")));
        need(op, "logits", logits, prod(rows, n)?)?;
        need(op, "ids", ids, prod(rows, k)?)?;
        need(op, "weights", weights, prod(rows, k)?)?;
        match bias {
            Some(b) if b != n => Err(shape(op, format!("bias of {b} values for {n} experts"))),
            _ => Ok(()),
        }
    }

    /// Route one row: `logits` (`n_expert`), the selection-only `bias` (deepseek V3's
    /// `exp_probs_b`), into `ids` and `weights` (`k` each). Experts are chosen by descending
    /// score, ties to the lower id; a NaN score is never chosen before a number. The scalar
    /// rule every backend reproduces.
    pub fn row(&self, logits: &[f32], bias: Option<&[f32]>, ids: &mut [f32], weights: &mut [f32]) {
        let n = self.n_expert;
        let probs: Vec<f32> = match self.gating {
            Gating::Softmax => {
                let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = logits.iter().map(|&l| (l - max).exp()).collect();
                let sum: f32 = e.iter().sum();
                e.iter().map(|&v| v / sum).collect()
            }
            Gating::Sigmoid => logits.iter().map(|&l| 1.0 / (1.0 + (-l).exp())).collect(),
            Gating::SoftmaxWeight => logits.to_vec(),
        };
        let select = |e: usize| probs[e] + bias.map_or(0.0, |b| b[e]);
        let mut order: Vec<usize> = (0..n).collect();
        // Descending by score, NaN last, ties to the lower id (a stable sort keeps id order).
        order.sort_by(|&a, &b| {
            let (sa, sb) = (select(a), select(b));
            sb.partial_cmp(&sa).unwrap_or_else(|| sa.is_nan().cmp(&sb.is_nan()))
        });
        let k = self.k;
        for (j, &e) in order[..k].iter().enumerate() {
            ids[j] = e as f32;
            weights[j] = probs[e];
        }
        let w = &mut weights[..k];
        if self.gating == Gating::SoftmaxWeight {
            let max = w.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            w.iter_mut().for_each(|v| *v = (*v - max).exp());
            let sum: f32 = w.iter().sum();
            w.iter_mut().for_each(|v| *v /= sum);
        }
        if self.norm {
            let sum = w.iter().sum::<f32>().max(MIN_WEIGHT_SUM);
            w.iter_mut().for_each(|v| *v /= sum);
        }
        if self.scale != 0.0 && self.scale != 1.0 {
            w.iter_mut().for_each(|v| *v *= self.scale);
        }
    }
}

/// The shape of a [`crate::backend::interface::Backend::matmul_id`]: `rows` tokens of `slots` (row, slot) pairs
/// each; the pair `p = r * slots + j` is multiplied by matrix `ids[p]`, its input is row `p`
/// of `x` (`per_slot`) or row `r` (one input shared by a token's slots).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatId {
    pub rows: usize,
    pub slots: usize,
    pub per_slot: bool,
}

impl MatId {
    /// (row, slot) pairs.
    pub fn pairs(&self) -> usize {
        self.rows * self.slots
    }

    /// Input rows read.
    pub fn inputs(&self) -> usize {
        if self.per_slot {
            self.pairs()
        } else {
            self.rows
        }
    }

    /// The input row of pair `p`.
    pub fn input_of(&self, p: usize) -> usize {
        if self.per_slot {
            p
        } else {
            p / self.slots.max(1)
        }
    }

    /// Check buffers of `x`, `ids` and `out` values against matrices `[n_out, n_in]` (`n_mat`
    /// of them) and a bias of `bias` values.
    #[allow(clippy::too_many_arguments)]
    pub fn check(
        &self,
        n_in: usize,
        n_out: usize,
        n_mat: usize,
        bias: Option<usize>,
        x: usize,
        ids: usize,
        out: usize,
    ) -> Result<(), BackendError> {
        let op = "matmul_id";
        let prod = |a: usize, b: usize| a.checked_mul(b).ok_or_else(|| shape(op, format!("{a} x {b} values")));
        if self.slots == 0 || n_mat == 0 {
            return Err(shape(op, format!("{} slots of {n_mat} matrices", self.slots)));
        }
        let pairs = prod(self.rows, self.slots)?;
        need(op, "input", x, prod(self.inputs(), n_in)?)?;
        need(op, "ids", ids, pairs)?;
        need(op, "output", out, prod(pairs, n_out)?)?;
        if let Some(b) = bias {
            if b != prod(n_out, n_mat)? {
                return Err(shape(
                    op,
                    format!("bias of {b} values for {n_mat} matrices of {n_out} rows"),
                ));
            }
        }
        Ok(())
    }
}

/// Check a [`crate::backend::interface::Backend::moe_combine`] call's buffers: `rows * slots` expert outputs of
/// `width` and as many weights, `rows` outputs.
pub fn check_combine(
    rows: usize,
    slots: usize,
    width: usize,
    experts: usize,
    weights: usize,
    out: usize,
) -> Result<(), BackendError> {
    let op = "moe_combine";
    let prod = |a: usize, b: usize| a.checked_mul(b).ok_or_else(|| shape(op, format!("{a} x {b} values")));
    let pairs = prod(rows, slots)?;
    need(op, "experts", experts, prod(pairs, width)?)?;
    need(op, "weights", weights, pairs)?;
    need(op, "output", out, prod(rows, width)?)
}

/// Check an id read from an ids buffer: a whole number below `n_mat`.
pub fn expert_id(v: f32, n_mat: usize) -> Result<usize, BackendError> {
    if v >= 0.0 && v.fract() == 0.0 && (v as usize) < n_mat {
        Ok(v as usize)
    } else {
        Err(shape("matmul_id", format!("id {v} is not one of {n_mat} matrices")))
    }
}

/// `count` runs of `width` values copied from `src[src_off + i * src_stride..]` to
/// `dst[dst_off + i * dst_stride..]`: splitting and joining the parts of heads (MLA's rope and
/// latent parts) without a per-head loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Strided {
    pub count: usize,
    pub width: usize,
    pub src_off: usize,
    pub src_stride: usize,
    pub dst_off: usize,
    pub dst_stride: usize,
}

impl Strided {
    /// Check buffers of `src` and `dst` values.
    pub fn check(&self, src: usize, dst: usize) -> Result<(), BackendError> {
        let op = "copy_strided";
        let end = |off: usize, stride: usize| -> Result<usize, BackendError> {
            if self.count == 0 {
                return Ok(0);
            }
            (self.count - 1)
                .checked_mul(stride)
                .and_then(|v| v.checked_add(off))
                .and_then(|v| v.checked_add(self.width))
                .ok_or_else(|| shape(op, format!("{} runs of stride {stride}", self.count)))
        };
        need(op, "source", src, end(self.src_off, self.src_stride)?)?;
        need(op, "destination", dst, end(self.dst_off, self.dst_stride)?)
    }
}

/// gpt-oss's clamped SwiGLU on one value pair: `min(g, limit) · σ(alpha · min(g, limit)) ·
/// (clamp(u, -limit, limit) + 1)`.
pub fn swiglu_oai(g: f32, u: f32, alpha: f32, limit: f32) -> f32 {
    let g = g.min(limit);
    let u = u.clamp(-limit, limit);
    g / (1.0 + (-alpha * g).exp()) * (u + 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(gating: Gating, norm: bool, scale: f32) -> Route {
        Route {
            n_expert: 4,
            k: 2,
            gating,
            norm,
            scale,
        }
    }

    #[test]
    fn ties_go_to_the_lower_id_and_nan_is_last() {
        let (mut ids, mut w) = ([0f32; 2], [0f32; 2]);
        route(Gating::SoftmaxWeight, false, 0.0).row(&[1.0, 3.0, 3.0, f32::NAN], None, &mut ids, &mut w);
        assert_eq!(ids, [1.0, 2.0]);
        assert!((w[0] - 0.5).abs() < 1e-6 && (w[1] - 0.5).abs() < 1e-6);
        route(Gating::Sigmoid, false, 0.0).row(&[f32::NAN, 0.0, 0.0, 0.0], None, &mut ids, &mut w);
        assert_eq!(ids, [1.0, 2.0]);
    }

    #[test]
    fn bias_chooses_but_does_not_weigh() {
        let (mut ids, mut w) = ([0f32; 2], [0f32; 2]);
        let logits = [2.0, 1.0, 0.0, -1.0];
        route(Gating::Sigmoid, true, 2.5).row(&logits, Some(&[0.0, 0.0, 5.0, 5.0]), &mut ids, &mut w);
        assert_eq!(ids, [2.0, 3.0]);
        let s = |l: f32| 1.0 / (1.0 + (-l).exp());
        let sum = s(0.0) + s(-1.0);
        assert!((w[0] - 2.5 * s(0.0) / sum).abs() < 1e-6);
        assert!((w[1] - 2.5 * s(-1.0) / sum).abs() < 1e-6);
    }

    #[test]
    fn softmax_weights_are_the_full_softmax_unless_normed() {
        let (mut ids, mut w) = ([0f32; 2], [0f32; 2]);
        let logits = [0.5f32, 1.5, -0.5, 1.0];
        route(Gating::Softmax, false, 0.0).row(&logits, None, &mut ids, &mut w);
        let z: f32 = logits.iter().map(|l| l.exp()).sum();
        assert_eq!(ids, [1.0, 3.0]);
        assert!((w[0] - 1.5f32.exp() / z).abs() < 1e-6);
        route(Gating::Softmax, true, 0.0).row(&logits, None, &mut ids, &mut w);
        assert!((w[0] + w[1] - 1.0).abs() < 1e-6);
    }

    #[test]
    fn swiglu_oai_clamps() {
        assert_eq!(swiglu_oai(0.0, 3.0, 1.702, 7.0), 0.0);
        let big = swiglu_oai(100.0, 100.0, 1.702, 7.0);
        assert!((big - 7.0 / (1.0 + (-1.702f32 * 7.0).exp()) * 8.0).abs() < 1e-5);
        assert!((swiglu_oai(1.0, -100.0, 1.702, 7.0) - (1.0 / (1.0 + (-1.702f32).exp())) * -6.0).abs() < 1e-6);
    }
}
