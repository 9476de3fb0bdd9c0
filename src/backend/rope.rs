//! Rotary position embedding: the parameters of the backends' `rope` op and the angle math they
//! share with ggml (`ggml_rope_cache_init`, `rope_yarn`), so every backend starts from the
//! same f32 values.
//!
//! Scaling: none; linear (positions divided by a factor); llama3 (per-frequency divisors, the
//! model's `rope_freqs.weight`, passed to the op as `factors`); YaRN (interpolation ramped
//! between two correction dimensions, with a magnitude factor on cos and sin).

/// How rope pairs up dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeKind {
    /// Adjacent pairs `(x[2i], x[2i+1])` (ggml mode 0, llama).
    Norm,
    /// Halves `(x[i], x[i + n_rot/2])` (ggml NEOX mode, qwen/gemma).
    Neox,
}

/// How positions are stretched beyond the trained context.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    None,
    /// Every angle divided by `factor`.
    Linear {
        factor: f32,
    },
    /// Per-frequency divisors from the model's `rope_freqs.weight` (the op's `factors`).
    Llama3,
    Yarn(Yarn),
}

/// YaRN's parameters, as llama.cpp derives them from the GGUF (`rope.scaling.*`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Yarn {
    /// Context extension factor (`rope.scaling.factor`): angles are interpolated by `1/factor`.
    pub factor: f32,
    /// The context the model was trained with before extension.
    pub n_ctx_orig: usize,
    /// Weight of extrapolation in the ramp (1 for YaRN, 0 turns it into linear scaling).
    pub ext_factor: f32,
    /// Magnitude scale of cos and sin (`mscale`), before YaRN's own correction.
    pub attn_factor: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
}

/// Rotary position embedding parameters of one layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rope {
    pub kind: RopeKind,
    /// Rotated dimensions per head (the first `n_rot` of the head).
    pub n_rot: usize,
    pub base: f32,
    pub scaling: RopeScaling,
}

/// The per-pair angle recipe of a [`Rope`], precomputed once per call (ggml's `theta_scale`,
/// `freq_scale`, `corr_dims`, `ext_factor` and `mscale`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeAngles {
    /// `theta_i = pos · theta_scale^i` (by repeated multiplication).
    pub theta_scale: f32,
    pub freq_scale: f32,
    /// YaRN's ramp between these pair indices (`[low, high]`), weighted by `ext_factor`; none
    /// when `ext_factor` is 0.
    pub corr_dims: [f32; 2],
    pub ext_factor: f32,
    /// Multiplies cos and sin (1 without YaRN, where it is skipped).
    pub mscale: f32,
}

impl Rope {
    /// Plain rope (no scaling).
    pub fn new(kind: RopeKind, n_rot: usize, base: f32) -> Self {
        Rope {
            kind,
            n_rot,
            base,
            scaling: RopeScaling::None,
        }
    }

    /// The angle recipe, computed as ggml computes it.
    pub fn angles(&self) -> RopeAngles {
        let theta_scale = self.base.powf(-2.0 / self.n_rot as f32);
        match self.scaling {
            RopeScaling::None | RopeScaling::Llama3 => RopeAngles {
                theta_scale,
                freq_scale: 1.0,
                corr_dims: [0.0, 0.0],
                ext_factor: 0.0,
                mscale: 1.0,
            },
            RopeScaling::Linear { factor } => RopeAngles {
                theta_scale,
                freq_scale: 1.0 / factor,
                corr_dims: [0.0, 0.0],
                ext_factor: 0.0,
                mscale: 1.0,
            },
            RopeScaling::Yarn(y) => {
                let freq_scale = 1.0 / y.factor;
                let corr_dim = |beta: f32| {
                    self.n_rot as f32 * (y.n_ctx_orig as f32 / (beta * 2.0 * std::f32::consts::PI)).ln()
                        / (2.0 * self.base.ln())
                };
                let start = corr_dim(y.beta_fast).floor();
                let end = corr_dim(y.beta_slow).ceil();
                let mut mscale = y.attn_factor;
                if y.ext_factor != 0.0 {
                    mscale *= 1.0 + 0.1 * (1.0 / freq_scale).ln();
                }
                RopeAngles {
                    theta_scale,
                    freq_scale,
                    corr_dims: [start.max(0.0), end.min(self.n_rot as f32 - 1.0)],
                    ext_factor: y.ext_factor,
                    mscale,
                }
            }
        }
    }

    /// Whether the op needs the model's per-frequency factors.
    pub fn wants_factors(&self) -> bool {
        self.scaling == RopeScaling::Llama3
    }
}

impl RopeAngles {
    /// Cos and sin of pair `i` for an unscaled angle `theta_extrap` (`pos · theta_scale^i`
    /// divided by the pair's frequency factor): ggml's `rope_yarn`.
    pub fn cos_sin(&self, theta_extrap: f32, i: usize) -> (f32, f32) {
        let theta_interp = self.freq_scale * theta_extrap;
        if self.ext_factor == 0.0 {
            return (theta_interp.cos(), theta_interp.sin());
        }
        let ramp_mix = ramp(self.corr_dims, i) * self.ext_factor;
        let theta = theta_interp * (1.0 - ramp_mix) + theta_extrap * ramp_mix;
        (theta.cos() * self.mscale, theta.sin() * self.mscale)
    }
}

/// YaRN's ramp at pair `i` (`i0 / 2` in ggml): 1 below `low`, 0 above `high`.
fn ramp(corr_dims: [f32; 2], i: usize) -> f32 {
    let [low, high] = corr_dims;
    let y = (i as f32 - low) / (high - low).max(0.001);
    1.0 - y.clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yarn(factor: f32) -> Rope {
        Rope {
            kind: RopeKind::Neox,
            n_rot: 64,
            base: 150000.0,
            scaling: RopeScaling::Yarn(Yarn {
                factor,
                n_ctx_orig: 4096,
                ext_factor: 1.0,
                attn_factor: 1.0,
                beta_fast: 32.0,
                beta_slow: 1.0,
            }),
        }
    }

    /// The correction dimensions and magnitude against values worked out by hand from
    /// `n_rot · ln(n_ctx_orig / (beta · 2π)) / (2 ln base)`.
    #[test]
    fn yarn_recipe_matches_the_formula() {
        let a = yarn(32.0).angles();
        let dim = |beta: f64| 64.0 * (4096.0 / (beta * 2.0 * std::f64::consts::PI)).ln() / (2.0 * 150000f64.ln());
        assert_eq!(a.corr_dims[0], dim(32.0).floor() as f32);
        assert_eq!(a.corr_dims[1], dim(1.0).ceil() as f32);
        assert!((a.mscale - (1.0 + 0.1 * 32f32.ln())).abs() < 1e-6);
        assert_eq!(a.freq_scale, 1.0 / 32.0);
        // Low pairs (fast rotations) extrapolate, high ones interpolate.
        let (c0, _) = a.cos_sin(3.0, 0);
        assert!((c0 - 3f32.cos() * a.mscale).abs() < 1e-6);
        let (c31, _) = a.cos_sin(3.0, 31);
        assert!((c31 - (3.0f32 / 32.0).cos() * a.mscale).abs() < 1e-6);
    }

    #[test]
    fn unscaled_and_linear_recipes_are_plain_angles() {
        let r = Rope::new(RopeKind::Norm, 8, 10000.0);
        assert_eq!(r.angles().cos_sin(2.0, 1), (2f32.cos(), 2f32.sin()));
        let lin = Rope {
            scaling: RopeScaling::Linear { factor: 4.0 },
            ..r
        };
        assert_eq!(lin.angles().cos_sin(2.0, 1), (0.5f32.cos(), 0.5f32.sin()));
        assert!(!lin.wants_factors());
    }
}
