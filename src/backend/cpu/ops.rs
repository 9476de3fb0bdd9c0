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
    const GELU_COEF_A: f32 = 0.044715;
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    if x <= -10.0 {
        return 0.0;
    }
    if x >= 10.0 {
        return x;
    }
    let h = f16::from_f32(x).to_f32();
    let y = 0.5 * h * (1.0 + (SQRT_2_OVER_PI * h * (1.0 + GELU_COEF_A * h * h)).tanh());
    f16::from_f32(y).to_f32()
}
