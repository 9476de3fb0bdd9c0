//! Element-wise and per-row CPU ops, written on plain slices, mirroring ggml's CPU arithmetic
//! where it affects results (f64 sum of squares in RMS norm, the iterative rope angle, GELU
//! through an f16 table).

use half::f16;

use crate::backend::rope::{Rope, RopeAngles, RopeKind};

/// `out = x / rms(x) * w` for one group (`x`, `w`, `out` of equal length).
pub fn rmsnorm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let sum: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    let mean = (sum / x.len().max(1) as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = (v * scale) * g;
    }
}

/// In-place [`rmsnorm`].
pub fn rmsnorm_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    let sum: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    let mean = (sum / x.len().max(1) as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for (v, &g) in x.iter_mut().zip(w) {
        *v = (*v * scale) * g;
    }
}

/// Cos/sin pairs of the `n_rot / 2` rotated pairs at position `pos`: entry `i` belongs to
/// frequency `i`. The angle is advanced by repeated multiplication, as ggml does, so rounding
/// matches.
pub fn rope_table(pos: u32, n_rot: usize, angles: &RopeAngles, factors: Option<&[f32]>, table: &mut Vec<(f32, f32)>) {
    table.clear();
    let mut theta = pos as f32;
    for i in 0..n_rot / 2 {
        let ff = factors.and_then(|f| f.get(i)).copied().unwrap_or(1.0);
        table.push(angles.cos_sin(theta / ff, i));
        theta *= angles.theta_scale;
    }
}

/// Rotate one head in place with a table from [`rope_table`].
pub fn rope_head(x: &mut [f32], rope: &Rope, table: &[(f32, f32)]) {
    let n_rot = rope.n_rot.min(x.len());
    match rope.kind {
        RopeKind::Norm => {
            for (i, pair) in x[..n_rot].chunks_exact_mut(2).enumerate() {
                let (c, s) = table[i];
                let (x0, x1) = (pair[0], pair[1]);
                pair[0] = x0 * c - x1 * s;
                pair[1] = x0 * s + x1 * c;
            }
        }
        RopeKind::Neox => {
            let half = n_rot / 2;
            for i in 0..half {
                let (c, s) = table[i];
                let (x0, x1) = (x[i], x[i + half]);
                x[i] = x0 * c - x1 * s;
                x[i + half] = x0 * s + x1 * c;
            }
        }
    }
}

/// `x / (1 + e^-x)`.
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// GELU (tanh approximation) the way ggml's CPU backend evaluates it: the input rounded to
/// f16, looked up in a table of f16 results; exact outside [-10, 10].
pub fn gelu(x: f32) -> f32 {
    if x <= -10.0 {
        return 0.0;
    }
    if x >= 10.0 {
        return x;
    }
    let table = GELU_TABLE.get_or_init(|| (0..=u16::MAX).map(|b| gelu_f16(f16::from_bits(b))).collect());
    f16::from_bits(table[usize::from(f16::from_f32(x).to_bits())]).to_f32()
}

/// [`gelu`]'s results for every f16 input, indexed by its bits (as ggml's `ggml_table_gelu_f16`):
/// 128 KiB, filled on first use in about a millisecond.
static GELU_TABLE: std::sync::OnceLock<Vec<u16>> = std::sync::OnceLock::new();

/// The tanh approximation of GELU at an f16 input, rounded to f16 (the table's entries, and
/// the slow twin the tests compare [`gelu`] with).
fn gelu_f16(h: f16) -> u16 {
    const GELU_COEF_A: f32 = 0.044715;
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    let h = h.to_f32();
    let y = 0.5 * h * (1.0 + (SQRT_2_OVER_PI * h * (1.0 + GELU_COEF_A * h * h)).tanh());
    f16::from_f32(y).to_bits()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GELU's tanh approximation evaluated in f64: the independent reference.
    fn gelu_f64(x: f64) -> f64 {
        let c = (2.0 / std::f64::consts::PI).sqrt();
        0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
    }

    /// Every f16 input in (-10, 10) gives the f64 formula's value to within one f16 step plus
    /// the f32 evaluation's error (ggml fills the table in f32, where `1 + tanh(z)` loses bits
    /// for very negative inputs: at most about one f32 ulp of 1, times `x / 2`); outside it, x
    /// and 0 as ggml. Between f16 inputs, the input is rounded to f16 first (what ggml's table
    /// lookup does).
    #[test]
    fn gelu_table_matches_the_f64_formula() {
        let mut checked = 0;
        for bits in 0..=u16::MAX {
            let h = f16::from_bits(bits);
            let x = h.to_f32();
            if !x.is_finite() || x.abs() >= 10.0 {
                continue;
            }
            let got = f64::from(gelu(x));
            let want = gelu_f64(f64::from(x));
            let want16 = f16::from_f64(want);
            // One f16 step at the reference value (subnormal steps near 0).
            let step = (f64::from(f16::from_bits(want16.to_bits().wrapping_add(1)).to_f32())
                - f64::from(want16.to_f32()))
            .abs()
            .max(f64::from(f16::from_bits(1).to_f32()));
            let f32_error = f64::from(x.abs()) * f64::from(f32::EPSILON);
            assert!(
                (got - want).abs() <= step + f32_error,
                "gelu({x}) = {got}, formula {want}"
            );
            checked += 1;
        }
        assert!(checked > 30_000, "{checked} inputs");
        assert_eq!(gelu(10.5), 10.5);
        assert_eq!(gelu(-10.5), 0.0);
        assert_eq!(
            gelu(f16::from_f32(1.2345).to_f32()),
            gelu(1.2345),
            "input rounded to f16 first"
        );
        // Known values of the approximation (PyTorch's `gelu(approximate="tanh")`).
        assert!((gelu(1.0) - 0.841_192).abs() < 1e-3);
        assert!((gelu(-2.0) + 0.045_402).abs() < 1e-3);
    }
}
