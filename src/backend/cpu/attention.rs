//! Softmax attention over the F16 KV cache, one task per (query row, head).
//!
//! Mirrors ggml's non-flash path: q is rounded to f16 for the q·k products (K is f16), the
//! softmax runs in f32 with an f64 sum, and the probabilities are rounded to f16 before they
//! weight the f16 V rows. Each K/V row is widened to f32 in one slice conversion (F16C when the
//! CPU has it) and the products use independent lanes, so the compiler vectorizes them; a
//! probability that rounds to zero in f16 contributes nothing and its V row is skipped.

use half::f16;
use half::slice::HalfFloatSliceExt;

use super::super::AttnParams;

/// Independent accumulators of [`dot`]: enough for two AVX or four SSE registers.
const LANES: usize = 8;

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
    // [q16 | one K or V row widened to f32], each head_dim.
    let mut buf = vec![0f32; 2 * hd];
    let (q16, row) = buf.split_at_mut(hd);
    for (d, &v) in q16.iter_mut().zip(q) {
        *d = f16::from_f32(v).to_f32();
    }
    scores.clear();
    let mut max = f32::NEG_INFINITY;
    for j in first..=pos {
        let base = j * kv_dim + kvh * hd;
        k_cache[base..base + hd].convert_to_f32_slice(row);
        let s = dot(q16, row) * p.scale;
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
        if pj == 0.0 {
            continue;
        }
        let base = (first + idx) * kv_dim + kvh * hd;
        v_cache[base..base + hd].convert_to_f32_slice(row);
        for (o, &v) in out.iter_mut().zip(row.iter()) {
            *o += pj * v;
        }
    }
}

/// `a · b` in [`LANES`] independent partial sums (vectorizable without reassociation).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..LANES {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The straightforward reference: every product in f64, no skipping.
    fn reference(q: &[f32], k: &[f16], v: &[f16], kv_dim: usize, kvh: usize, pos: usize, p: &AttnParams) -> Vec<f32> {
        let hd = p.head_dim;
        let first = p.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        let q16: Vec<f64> = q.iter().map(|&x| f64::from(f16::from_f32(x).to_f32())).collect();
        let s: Vec<f64> = (first..=pos)
            .map(|j| {
                let kr = &k[j * kv_dim + kvh * hd..][..hd];
                q16.iter().zip(kr).map(|(a, b)| a * f64::from(b.to_f32())).sum::<f64>() * f64::from(p.scale)
            })
            .collect();
        let max = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
        let sum: f64 = e.iter().sum();
        let mut out = vec![0f64; hd];
        for (idx, w) in e.iter().enumerate() {
            let vr = &v[(first + idx) * kv_dim + kvh * hd..][..hd];
            for (o, b) in out.iter_mut().zip(vr) {
                *o += w / sum * f64::from(b.to_f32());
            }
        }
        out.into_iter().map(|x| x as f32).collect()
    }

    #[test]
    fn matches_f64_reference_with_window_and_gqa() {
        let (hd, n_kv_head, n_pos) = (20, 2, 37); // head size not a multiple of LANES
        let kv_dim = hd * n_kv_head;
        let val = |i: usize, off: f32| 0.1 + 2.0 * ((i as f32) * 0.37 + off).cos();
        let k: Vec<f16> = (0..n_pos * kv_dim).map(|i| f16::from_f32(val(i, 1.0))).collect();
        let v: Vec<f16> = (0..n_pos * kv_dim).map(|i| f16::from_f32(val(i, 2.0))).collect();
        let q: Vec<f32> = (0..hd).map(|i| val(i, 3.0)).collect();
        for window in [None, Some(5)] {
            for (kvh, pos) in [(0, 0), (1, 17), (0, n_pos - 1)] {
                let p = AttnParams {
                    rows: 1,
                    pos0: pos,
                    n_head: 4,
                    n_head_kv: n_kv_head,
                    head_dim: hd,
                    scale: 0.3,
                    window,
                };
                let mut out = vec![0f32; hd];
                attend_head(&q, &k, &v, kv_dim, kvh, pos, &p, &mut Vec::new(), &mut out);
                let want = reference(&q, &k, &v, kv_dim, kvh, pos, &p);
                for (a, b) in out.iter().zip(&want) {
                    // Probabilities are rounded to f16 (relative 2^-11) before weighting V.
                    assert!(
                        (a - b).abs() <= 2e-3 * (1.0 + b.abs()),
                        "{a} vs {b} (window {window:?}, pos {pos})"
                    );
                }
            }
        }
    }
}
