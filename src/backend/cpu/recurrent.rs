//! The delta rule of gated-delta-net layers ([`crate::backend::recurrent`]) on one value head,
//! in its recurrent and chunked forms: the task body of the CPU's `delta_net` (the backend
//! splits the work across the pool by value head).
//!
//! Plain loops, correctness first: each task runs the scalar rule of the shared module, so the
//! CPU is the reference a GPU backend is compared with.

use crate::backend::recurrent::{delta_token, dot, DeltaNet, Form};

/// Where one value head finds its inputs among a call's rows.
pub(super) struct HeadInputs<'a> {
    /// `[rows][q | k]`: every key head's q (normed, scaled) and k (normed).
    pub(super) qk: &'a [f32],
    /// The call's rows of `qkv` (`[rows][qkv_dim]`), for v.
    pub(super) qkv: &'a [f32],
    /// `[rows][n_v_heads]` log-decays and betas.
    pub(super) gate: &'a [f32],
    pub(super) beta: &'a [f32],
    pub(super) p: DeltaNet,
    /// This value head and the key head it reads.
    pub(super) h: usize,
    pub(super) kh: usize,
}

impl HeadInputs<'_> {
    fn q(&self, t: usize) -> &[f32] {
        let kw = self.p.n_k_heads * self.p.d_k;
        &self.qk[t * 2 * kw + self.kh * self.p.d_k..][..self.p.d_k]
    }

    fn k(&self, t: usize) -> &[f32] {
        let kw = self.p.n_k_heads * self.p.d_k;
        &self.qk[t * 2 * kw + kw + self.kh * self.p.d_k..][..self.p.d_k]
    }

    fn v(&self, t: usize) -> &[f32] {
        let at = t * self.p.qkv_dim() + 2 * self.p.n_k_heads * self.p.d_k + self.h * self.p.d_v;
        &self.qkv[at..][..self.p.d_v]
    }

    fn g(&self, t: usize) -> f32 {
        self.gate[t * self.p.n_v_heads + self.h]
    }

    fn b(&self, t: usize) -> f32 {
        self.beta[t * self.p.n_v_heads + self.h]
    }
}

/// One head's `rows` tokens in `form`: `s`, the head's state `[d_v][d_k]`; `o`: `[rows][d_v]`.
pub(super) fn run_head(inp: &HeadInputs<'_>, form: Form, rows: usize, s: &mut [f32], o: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the feature `run_head_avx2` enables was just detected.
        unsafe { run_head_avx2(inp, form, rows, s, o) };
        return;
    }
    run_head_generic::<false>(inp, form, rows, s, o);
}

/// [`run_head_generic`] compiled for AVX2: the chunked form's dot products (eight interleaved
/// lanes in the scalar code) become one 256-bit operation per eight values instead of two
/// 128-bit ones, and the recurrent form takes [`simd::delta_token`]. No FMA is enabled:
/// products and sums stay separately rounded, so the bits are the generic build's.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn run_head_avx2(inp: &HeadInputs<'_>, form: Form, rows: usize, s: &mut [f32], o: &mut [f32]) {
    run_head_generic::<true>(inp, form, rows, s, o);
}

#[inline(always)]
fn run_head_generic<const AVX2: bool>(inp: &HeadInputs<'_>, form: Form, rows: usize, s: &mut [f32], o: &mut [f32]) {
    match form {
        Form::Recurrent => recurrent_head::<AVX2>(inp, rows, s, o),
        Form::Chunked(c) => chunked_head(inp, rows, c, s, o),
    }
}

/// The recurrent form on one head: [`delta_token`] for each of `rows` tokens. `s`: the head's
/// state `[d_v][d_k]`; `o`: `[rows][d_v]`.
#[inline(always)]
fn recurrent_head<const AVX2: bool>(inp: &HeadInputs<'_>, rows: usize, s: &mut [f32], o: &mut [f32]) {
    let dv = inp.p.d_v;
    for (t, ot) in o.chunks_exact_mut(dv).take(rows).enumerate() {
        let (q, k, v, g, b) = (inp.q(t), inp.k(t), inp.v(t), inp.g(t), inp.b(t));
        #[cfg(target_arch = "x86_64")]
        if AVX2 && k.len().is_multiple_of(simd::LANES) {
            // SAFETY: `AVX2` is set only by `run_head_avx2`, which enables AVX2.
            unsafe { simd::delta_token(s, q, k, v, g, b, ot) };
            continue;
        }
        delta_token(s, q, k, v, g, b, ot);
    }
}

/// [`delta_token`] in AVX2 registers, for key heads whose width is a multiple of eight.
#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    /// Lanes of a register: [`crate::backend::recurrent::dot`]'s interleaved lanes.
    pub(super) const LANES: usize = 8;

    /// Rows of the state run together: each row's sums are a chain of dependent additions, so
    /// one row alone waits on the adder's latency.
    const ROWS: usize = 4;

    /// Row blocks ahead that [`delta_token`] prefetches, into L2 (`_MM_HINT_T2`). A head's
    /// state streams from memory once per token (64 KiB for Qwen3.5's heads of 128 by 128,
    /// from the last-level cache or memory: the weights' stream evicts it between tokens), over
    /// small pages, at each of which the hardware's stream prefetchers stop. qwen35-24l decode,
    /// AMD EPYC (Zen 4), 2 threads: the delta-rule op's time 202 -> 158 ms over 99 steps with
    /// prefetches into L1 (`_MM_HINT_T0`, medians of four alternations, 4 of 4; 8 blocks ahead
    /// measured in between). Into L2, the op's time over 130 steps, medians of six alternations:
    /// 198 ms (L1, 2 ahead), 128 (`_MM_HINT_T1`, 2 ahead), 127 (T1, 3), 126 (T2, 3) and 120 (T2,
    /// 2): an L1 prefetch holds one of the core's few L1 miss buffers until its line arrives,
    /// so fewer lines are in flight. (The weight kernels' streams measured the other way: see
    /// `dot_legacy::prefetch_pays`.)
    const BLOCKS_AHEAD: usize = 2;

    /// [`crate::backend::recurrent::delta_token`] with each row's two passes in registers,
    /// [`ROWS`] rows at a time: the same operations on the same lanes (no FMA), and the lanes
    /// summed in order, so the same bits. `k.len()` must be a multiple of [`LANES`].
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn delta_token(
        state: &mut [f32],
        q: &[f32],
        k: &[f32],
        v: &[f32],
        g: f32,
        beta: f32,
        out: &mut [f32],
    ) {
        let d_k = k.len();
        debug_assert!(d_k.is_multiple_of(LANES) && q.len() == d_k);
        let decay = _mm256_set1_ps(g.exp());
        let mut rows = state.chunks_exact_mut(ROWS * d_k);
        let (mut vs, mut outs) = (v.chunks_exact(ROWS), out.chunks_exact_mut(ROWS));
        let span = ROWS * d_k * std::mem::size_of::<f32>();
        for ((block, vb), ob) in (&mut rows).zip(&mut vs).zip(&mut outs) {
            // The block [`BLOCKS_AHEAD`] on its way into L2 (a hint: past the state's end it
            // never faults).
            crate::backend::cpu::simd::prefetch_lines::<_MM_HINT_T2>(
                (block.as_ptr() as *const u8).wrapping_add(BLOCKS_AHEAD * span),
                span,
            );
            rows_of::<ROWS>(block, q, k, vb, decay, beta, ob);
        }
        let rest = rows.into_remainder();
        for ((row, vj), o) in rest
            .chunks_exact_mut(d_k)
            .zip(vs.remainder().chunks(1))
            .zip(outs.into_remainder().chunks_mut(1))
        {
            rows_of::<1>(row, q, k, vj, decay, beta, o);
        }
    }

    /// The rule on the `N` rows of `block` (`[N][d_k]`), with their values `v` and outputs
    /// `out` (`N` each).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn rows_of<const N: usize>(
        block: &mut [f32],
        q: &[f32],
        k: &[f32],
        v: &[f32],
        decay: __m256,
        beta: f32,
        out: &mut [f32],
    ) {
        let d_k = k.len();
        let p = block.as_mut_ptr();
        let mut acc = [_mm256_setzero_ps(); N];
        for i in (0..d_k).step_by(LANES) {
            // SAFETY: `i + LANES <= d_k`, the length of `k`, `q` and each of the block's rows.
            let ki = _mm256_loadu_ps(k.as_ptr().add(i));
            for (r, a) in acc.iter_mut().enumerate() {
                let x = _mm256_mul_ps(_mm256_loadu_ps(p.add(r * d_k + i)), decay);
                _mm256_storeu_ps(p.add(r * d_k + i), x);
                *a = _mm256_add_ps(*a, _mm256_mul_ps(x, ki));
            }
        }
        let mut d = [_mm256_setzero_ps(); N];
        for r in 0..N {
            d[r] = _mm256_set1_ps((v[r] - lane_sum(acc[r])) * beta);
        }
        let mut acc = [_mm256_setzero_ps(); N];
        for i in (0..d_k).step_by(LANES) {
            let (ki, qi) = (_mm256_loadu_ps(k.as_ptr().add(i)), _mm256_loadu_ps(q.as_ptr().add(i)));
            for (r, a) in acc.iter_mut().enumerate() {
                let x = _mm256_add_ps(_mm256_loadu_ps(p.add(r * d_k + i)), _mm256_mul_ps(ki, d[r]));
                _mm256_storeu_ps(p.add(r * d_k + i), x);
                *a = _mm256_add_ps(*a, _mm256_mul_ps(x, qi));
            }
        }
        for r in 0..N {
            out[r] = lane_sum(acc[r]);
        }
    }

    /// The lanes added in order from -0.0, as `Iterator::sum` adds the scalar lanes.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn lane_sum(acc: __m256) -> f32 {
        let mut lanes = [0f32; LANES];
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
        lanes.iter().sum()
    }
}

/// The chunked form on one head, chunks of `c` tokens. Within a chunk starting from state
/// `S0`, with `G_i` the cumulative log-decay up to token `i` of the chunk:
/// ```text
/// L_ij   = β_i (k_i·k_j) e^(G_i − G_j)                    j < i  (strictly lower)
/// (I + L) U = R,  R_i = β_i (v_i − e^(G_i) S0ᵀk_i)          U: the chunk's corrected values
/// o_i    = e^(G_i) S0ᵀq_i + Σ_{j≤i} (q_i·k_j) e^(G_i − G_j) U_j
/// S      = e^(G_last) S0 + Σ_j e^(G_last − G_j) k_j ⊗ U_j
/// ```
/// `U = (I + L)⁻¹ R` is llama.cpp's `(I + L)⁻¹ (vβ − (kβ ⊙ e^G) S0)` (its `v_new`, through
/// `ggml_solve_tri` and the WY form `T vβ − T (kβ ⊙ e^G) S0`), solved here by forward
/// substitution.
#[inline(always)]
fn chunked_head(inp: &HeadInputs<'_>, rows: usize, c: usize, s: &mut [f32], o: &mut [f32]) {
    let (dk, dv) = (inp.p.d_k, inp.p.d_v);
    // gcum: [c] cumulative log-decays; l: [c][c] the strictly lower L; u: [c][dv] the values U.
    let mut gcum = vec![0f32; c];
    let mut l = vec![0f32; c * c];
    let mut u = vec![0f32; c * dv];
    for t0 in (0..rows).step_by(c) {
        let n = c.min(rows - t0);
        let mut acc = 0f32;
        for (i, gc) in gcum[..n].iter_mut().enumerate() {
            acc += inp.g(t0 + i);
            *gc = acc;
        }
        for i in 0..n {
            let (ki, bi) = (inp.k(t0 + i), inp.b(t0 + i));
            for j in 0..i {
                l[i * c + j] = bi * dot(ki, inp.k(t0 + j)) * (gcum[i] - gcum[j]).exp();
            }
        }
        for i in 0..n {
            let (ki, vi, bi, ei) = (inp.k(t0 + i), inp.v(t0 + i), inp.b(t0 + i), gcum[i].exp());
            let (done, rest) = u.split_at_mut(i * dv);
            let ui = &mut rest[..dv];
            for ((r, srow), &vj) in ui.iter_mut().zip(s.chunks_exact(dk)).zip(vi) {
                *r = bi * (vj - ei * dot(srow, ki));
            }
            for (j, uj) in done.chunks_exact(dv).enumerate() {
                let lij = l[i * c + j];
                ui.iter_mut().zip(uj).for_each(|(r, &x)| *r -= lij * x);
            }
        }
        for i in 0..n {
            let (qi, ei) = (inp.q(t0 + i), gcum[i].exp());
            let oi = &mut o[(t0 + i) * dv..][..dv];
            for (ov, srow) in oi.iter_mut().zip(s.chunks_exact(dk)) {
                *ov = ei * dot(srow, qi);
            }
            for (j, uj) in u.chunks_exact(dv).take(i + 1).enumerate() {
                let a = dot(qi, inp.k(t0 + j)) * (gcum[i] - gcum[j]).exp();
                oi.iter_mut().zip(uj).for_each(|(ov, &x)| *ov += a * x);
            }
        }
        let glast = gcum[n - 1];
        let decay = glast.exp();
        s.iter_mut().for_each(|v| *v *= decay);
        for (j, uj) in u.chunks_exact(dv).take(n).enumerate() {
            let (kj, w) = (inp.k(t0 + j), (glast - gcum[j]).exp());
            for (srow, &x) in s.chunks_exact_mut(dk).zip(uj) {
                let a = w * x;
                srow.iter_mut().zip(kj).for_each(|(sv, &kv)| *sv += a * kv);
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use crate::backend::recurrent::delta_token;

    #[test]
    fn avx2_token_gives_the_scalar_bits() {
        if !std::is_x86_feature_detected!("avx2") {
            return;
        }
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut f = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        };
        // Value widths with and without a remainder past the blocks of rows.
        for (dk, dv) in [(128, 128), (16, 6), (8, 3), (24, 1)] {
            let mut a: Vec<f32> = (0..dk * dv).map(|_| f()).collect();
            let mut b = a.clone();
            for _ in 0..5 {
                let q: Vec<f32> = (0..dk).map(|_| f()).collect();
                let k: Vec<f32> = (0..dk).map(|_| f()).collect();
                let v: Vec<f32> = (0..dv).map(|_| f()).collect();
                let (g, beta) = (-0.5 + 0.4 * f(), 0.5 + 0.4 * f());
                let (mut oa, mut ob) = (vec![0f32; dv], vec![0f32; dv]);
                // SAFETY: AVX2 was detected above.
                unsafe { super::simd::delta_token(&mut a, &q, &k, &v, g, beta, &mut oa) };
                delta_token(&mut b, &q, &k, &v, g, beta, &mut ob);
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&oa), bits(&ob), "outputs, {dk} x {dv}");
                assert_eq!(bits(&a), bits(&b), "state, {dk} x {dv}");
            }
        }
    }
}
