//! The CPU's recurrent-layer ops of gated-delta-net layers ([`crate::backend::recurrent`]):
//! the causal conv with its state, the gates, the delta rule in its recurrent and chunked
//! forms, and the gated RMS norm.
//!
//! Plain loops, correctness first: the work is split across the pool by value head (delta
//! rule) or by rows (conv, norm), each task running the scalar rule of the shared module, so the
//! CPU is the reference a GPU backend is compared with.

use super::{norm_task_values, ops, CpuBackend, CpuBuffer, CpuWeight};
use crate::backend::error::BackendError;
use crate::backend::recurrent::{
    self, check_gated_norm, conv_value, delta_token, dot, gates, l2_normalize, Conv, DeltaNet, Form, SeqRows,
};

/// Output rows per task of the conv.
const CONV_ROWS: usize = 16;

/// Where one value head finds its inputs among a call's rows.
struct HeadInputs<'a> {
    /// `[rows][q | k]`: every key head's q (normed, scaled) and k (normed).
    qk: &'a [f32],
    /// The call's rows of `qkv` (`[rows][qkv_dim]`), for v.
    qkv: &'a [f32],
    /// `[rows][n_v_heads]` log-decays and betas.
    gate: &'a [f32],
    beta: &'a [f32],
    p: DeltaNet,
    /// This value head and the key head it reads.
    h: usize,
    kh: usize,
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

impl CpuBackend {
    pub(super) fn conv(
        &self,
        x: &CpuBuffer,
        w: &CpuWeight,
        p: &Conv,
        seq: SeqRows,
        state: &mut CpuBuffer,
        out: &mut CpuBuffer,
    ) -> Result<(), BackendError> {
        let wv = w.values()?;
        p.check(seq, x.0.len(), wv.len(), state.0.len(), out.0.len())?;
        let (ch, kk, rows) = (p.channels, p.kernel, seq.rows);
        let hist = kk - 1;
        let span = seq.row0 * ch..(seq.row0 + rows) * ch;
        // x: [rows][ch] this sequence's inputs; st: [ch][hist] the inputs before them.
        let (x, st, wv, silu) = (&x.0[span.clone()], &state.0[..ch * hist], &*wv, p.silu);
        // Input `u` of channel `c` in the sequence "state, then x".
        let input = |u: usize, c: usize| {
            if u < hist {
                st[c * hist + u]
            } else {
                x[(u - hist) * ch + c]
            }
        };
        self.pool.for_chunks(&mut out.0[span], CONV_ROWS * ch, |i, o| {
            for (r, orow) in o.chunks_exact_mut(ch).enumerate() {
                // Output row t's taps are inputs t..t + kernel of "state, then x".
                let t = i * CONV_ROWS + r;
                for (c, ov) in orow.iter_mut().enumerate() {
                    *ov = conv_value((t..t + kk).map(|u| input(u, c)), &wv[c * kk..(c + 1) * kk], silu);
                }
            }
        });
        // The new state: the last `hist` inputs of "state, then x".
        let new: Vec<f32> = (0..ch)
            .flat_map(|c| (rows..rows + hist).map(move |u| (u, c)))
            .map(|(u, c)| input(u, c))
            .collect();
        state.0[..ch * hist].copy_from_slice(&new);
        Ok(())
    }

    pub(super) fn gates(
        &self,
        alpha: &mut CpuBuffer,
        beta: &mut CpuBuffer,
        rows: usize,
        dt_bias: &CpuWeight,
        a: &CpuWeight,
    ) -> Result<(), BackendError> {
        let (dt, av) = (dt_bias.values()?, a.values()?);
        let n = dt.len();
        recurrent::check_gates(rows, n, alpha.0.len(), beta.0.len(), n, av.len())?;
        let alpha = alpha.0[..rows * n].chunks_exact_mut(n);
        for (ar, br) in alpha.zip(beta.0[..rows * n].chunks_exact_mut(n)) {
            for (h, (al, be)) in ar.iter_mut().zip(br.iter_mut()).enumerate() {
                (*al, *be) = gates(*al, *be, dt[h], av[h]);
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn delta(
        &self,
        p: &DeltaNet,
        form: Form,
        seq: SeqRows,
        qkv: &CpuBuffer,
        gate: &CpuBuffer,
        beta: &CpuBuffer,
        state: &mut CpuBuffer,
        out: &mut CpuBuffer,
    ) -> Result<(), BackendError> {
        p.check(
            seq,
            form,
            qkv.0.len(),
            gate.0.len(),
            beta.0.len(),
            state.0.len(),
            out.0.len(),
        )?;
        let (rows, row0) = (seq.rows, seq.row0);
        if rows == 0 {
            return Ok(());
        }
        let (hk, hv, dk, dv, qkv_dim) = (p.n_k_heads, p.n_v_heads, p.d_k, p.d_v, p.qkv_dim());
        let kw = hk * dk;
        // src: [rows][qkv_dim] this sequence's rows.
        let src = &qkv.0[row0 * qkv_dim..(row0 + rows) * qkv_dim];
        // qk: [rows][2][hk][dk] q and k of each key head, normed once (several value heads may
        // read one key head), q scaled.
        let mut qk = vec![0f32; rows * 2 * kw];
        let scale = p.q_scale();
        self.pool.for_chunks(&mut qk, 2 * kw, |t, dst| {
            dst.copy_from_slice(&src[t * qkv_dim..t * qkv_dim + 2 * kw]);
            for (i, head) in dst.chunks_exact_mut(dk).enumerate() {
                let s = if i < hk { scale } else { 1.0 };
                match p.l2_eps {
                    Some(eps) => l2_normalize(head, eps, s),
                    None => head.iter_mut().for_each(|v| *v *= s),
                }
            }
        });
        let (gate, beta) = (
            &gate.0[row0 * hv..(row0 + rows) * hv],
            &beta.0[row0 * hv..(row0 + rows) * hv],
        );
        // heads: [hv][rows][dv] each head's outputs, scattered into `out` afterwards.
        let mut heads = vec![0f32; hv * rows * dv];
        let mut work: Vec<(&mut [f32], &mut [f32])> = state.0[..p.state_len()]
            .chunks_exact_mut(dk * dv)
            .zip(heads.chunks_exact_mut(rows * dv))
            .collect();
        let qk = &qk;
        self.pool.for_chunks(&mut work, 1, |h, w| {
            let (s, o) = &mut w[0];
            let inp = HeadInputs {
                qk,
                qkv: src,
                gate,
                beta,
                p: *p,
                h,
                kh: p.key_head(h),
            };
            match form {
                Form::Recurrent => recurrent_head(&inp, rows, s, o),
                Form::Chunked(c) => chunked_head(&inp, rows, c, s, o),
            }
        });
        let out = &mut out.0[row0 * hv * dv..(row0 + rows) * hv * dv];
        for (h, head) in heads.chunks_exact(rows * dv).enumerate() {
            for (t, ot) in head.chunks_exact(dv).enumerate() {
                out[(t * hv + h) * dv..][..dv].copy_from_slice(ot);
            }
        }
        Ok(())
    }

    pub(super) fn gated_norm(
        &self,
        x: &mut CpuBuffer,
        z: &CpuBuffer,
        w: &CpuWeight,
        groups: usize,
        eps: f32,
    ) -> Result<(), BackendError> {
        let wv = w.dense("rmsnorm_gated")?;
        let g = wv.len();
        check_gated_norm(groups, g, x.0.len(), z.0.len())?;
        let z = &z.0[..groups * g];
        let per_task = norm_task_values(g);
        self.pool.for_chunks(&mut x.0[..groups * g], per_task, |i, xs| {
            let zs = &z[i * per_task..i * per_task + xs.len()];
            for (xg, zg) in xs.chunks_exact_mut(g).zip(zs.chunks_exact(g)) {
                ops::rmsnorm_inplace(xg, wv, eps);
                xg.iter_mut().zip(zg).for_each(|(v, &zv)| *v *= recurrent::silu(zv));
            }
        });
        Ok(())
    }
}
