//! Element-wise and per-row CPU ops, written on plain slices, mirroring ggml's CPU arithmetic
//! where it affects results (f64 sum of squares in RMS norm, the iterative rope angle, GELU
//! through an f16 table).

use half::f16;

use crate::model::{Rope, RopeKind};

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

/// Cos/sin pairs for one position: entry `i` belongs to frequency `i` (dims `2i, 2i+1`).
/// The angle is advanced by repeated multiplication, as ggml does, so rounding matches.
pub fn rope_table(pos: usize, head_dim: usize, rope: &Rope, factors: Option<&[f32]>, table: &mut Vec<(f32, f32)>) {
    table.clear();
    let theta_scale = rope.base.powf(-2.0 / rope.n_rot as f32);
    let mut theta = pos as f32;
    for i in 0..head_dim / 2 {
        let ff = factors.and_then(|f| f.get(i)).copied().unwrap_or(1.0);
        let t = rope.freq_scale * (theta / ff);
        table.push((t.cos(), t.sin()));
        theta *= theta_scale;
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

    /// The table gives exactly what evaluating the formula at the rounded input gives, on
    /// both sides of the [-10, 10] cut and on rounding edges of f16.
    #[test]
    fn gelu_table_matches_direct_evaluation() {
        let mut x = -12.0f32;
        while x < 12.0 {
            for v in [x, x + 1e-4, -x * 0.37, f32::from_bits(x.to_bits() + 1)] {
                let want = if v <= -10.0 {
                    0.0
                } else if v >= 10.0 {
                    v
                } else {
                    f16::from_bits(gelu_f16(f16::from_f32(v))).to_f32()
                };
                assert_eq!(gelu(v).to_bits(), want.to_bits(), "gelu({v})");
            }
            x += 0.013;
        }
        // Values of known sign and size: gelu(0) = 0, gelu(x) ≈ x for large x, ≈ 0 for very negative.
        assert_eq!(gelu(0.0), 0.0);
        assert!((gelu(5.0) - 5.0).abs() < 1e-2);
        assert!(gelu(-5.0).abs() < 1e-3);
        assert!((gelu(1.0) - 0.8412).abs() < 2e-3);
    }
}
