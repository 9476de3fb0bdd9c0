//! Softmax attention over the F16 KV cache, one task per (query row, head).
//!
//! Mirrors ggml's non-flash path: q is rounded to f16 for the q·k products (K is f16), the
//! softmax runs in f32 with an f64 sum, and the probabilities are rounded to f16 before they
//! weight the f16 V rows.

use half::f16;

use super::super::AttnParams;

/// Attention for one query head `q` (`head_dim` values) at position `pos`, reading KV head
/// `kvh` of the caches (rows of `kv_dim`), writing `out` (`head_dim`). `scores` is scratch.
#[allow(clippy::too_many_arguments)]
pub fn attend_head(
    q: &[f32],
    k_cache: &[f16],
    v_cache: &[f16],
    kv_dim: usize,
    kvh: usize,
    pos: usize,
    p: &AttnParams,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let hd = p.head_dim;
    let first = match p.window {
        // Key j is masked when pos - j >= window, so the first visible key is pos + 1 - window.
        Some(w) => (pos + 1).saturating_sub(w),
        None => 0,
    };
    let q16: Vec<f32> = q.iter().map(|&v| f16::from_f32(v).to_f32()).collect();
    scores.clear();
    let mut max = f32::NEG_INFINITY;
    for j in first..=pos {
        let base = j * kv_dim + kvh * hd;
        let k = &k_cache[base..base + hd];
        let dot: f32 = q16.iter().zip(k).map(|(&a, b)| a * b.to_f32()).sum();
        let s = dot * p.scale;
        max = max.max(s);
        scores.push(s);
    }
    let mut sum = 0f64;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += f64::from(*s);
    }
    let inv = (1.0 / sum) as f32;
    out.fill(0.0);
    for (idx, s) in scores.iter().enumerate() {
        let pj = f16::from_f32(*s * inv).to_f32();
        let base = (first + idx) * kv_dim + kvh * hd;
        for (o, v) in out.iter_mut().zip(&v_cache[base..base + hd]) {
            *o += pj * v.to_f32();
        }
    }
}
