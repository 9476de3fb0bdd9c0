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
    match form {
        Form::Recurrent => recurrent_head(inp, rows, s, o),
        Form::Chunked(c) => chunked_head(inp, rows, c, s, o),
    }
}

/// The recurrent form on one head: [`delta_token`] for each of `rows` tokens. `s`: the head's
/// state `[d_v][d_k]`; `o`: `[rows][d_v]`.
fn recurrent_head(inp: &HeadInputs<'_>, rows: usize, s: &mut [f32], o: &mut [f32]) {
    let dv = inp.p.d_v;
    let mut delta = vec![0f32; dv];
    for (t, ot) in o.chunks_exact_mut(dv).take(rows).enumerate() {
        delta_token(s, inp.q(t), inp.k(t), inp.v(t), inp.g(t), inp.b(t), &mut delta, ot);
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
