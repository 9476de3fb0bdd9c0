//! The gated-delta-net ops on the CPU (`tinyllm::backend::recurrent`) against f64 loops written
//! here from the formulas: the conv with its state, the gates, the gated norm, and the delta
//! rule in both forms. The acceptance item of the hybrid models: chunked prefill equals
//! token-by-token decode to f32 rounding, for chunk sizes 1, 7 and 64 and a prompt longer than
//! a chunk; states carried across calls continue a sequence exactly as one call would.
//!
//! Then the WebGPU kernels (shaders/ssm_conv.wgsl, delta_gates.wgsl, delta_net.wgsl and
//! rmsnorm.wgsl's gated norm) against the CPU backend, the reference, to f32 rounding: one
//! sequence at a nonzero row of a batch, prefilled, then decoded a row per call from the state
//! left on the device. They need an adapter (Mesa lavapipe in CI) and are skipped without one
//! unless `TINYLLM_REQUIRE_GPU=1`.
//!
//! (`tests/recurrent_state.rs` is about the engine's checkpoint contract, not these ops.)

mod common;

use std::sync::Arc;

use common::rng::Rng;

use tinyllm::backend::cpu::CpuBackend;
use tinyllm::backend::webgpu::WebGpuBackend;
use tinyllm::backend::{Backend, BackendError, Conv, DeltaNet, Form, KeyHeads, SeqRows};
use tinyllm::gguf::GgufFile;
use tinyllm::quant::GgmlType;

/// An in-memory GGUF file of f32 tensors (name, GGUF shape, values).
fn gguf(tensors: &[(&str, Vec<u64>, &[f32])]) -> Arc<GgufFile> {
    let mut w = common::GgufWriter::new();
    let mut data = Vec::new();
    for (name, shape, values) in tensors {
        let off = data.len() as u64;
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        w.tensor_at(name, shape, GgmlType::F32 as u32, bytes.len() as u64, off);
        data.extend_from_slice(&bytes);
        data.resize(data.len().div_ceil(32) * 32, 0);
    }
    Arc::new(GgufFile::from_bytes(w.finish_with(&data)).expect("test gguf"))
}

fn cpu() -> CpuBackend {
    CpuBackend::new(2).expect("cpu backend")
}

fn upload<B: Backend>(be: &B, v: &[f32]) -> B::Buffer {
    let mut b = be.alloc(v.len()).unwrap();
    be.write(&mut b, v).unwrap();
    b
}

fn download<B: Backend>(be: &B, b: &B::Buffer, n: usize) -> Vec<f32> {
    be.read(b, n).unwrap().wait().unwrap()
}

/// Largest absolute difference, and that over the largest reference magnitude.
fn err(got: &[f32], want: &[f64]) -> (f64, f64) {
    assert_eq!(got.len(), want.len());
    let abs = got
        .iter()
        .zip(want)
        .map(|(&g, &w)| (f64::from(g) - w).abs())
        .fold(0.0, f64::max);
    let scale = want.iter().fold(0.0f64, |m, w| m.max(w.abs())).max(1e-30);
    (abs, abs / scale)
}

/// An error pair for the log: absolute, relative.
fn show((abs, rel): (f64, f64)) -> String {
    format!("{abs:.1e} abs / {rel:.1e} rel")
}

fn widen(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// The f64 conv: `x` `[rows][ch]`, `w` `[ch][k]`, `state` `[ch][k - 1]`; the outputs (after
/// SiLU) and the new state.
fn conv_ref(x: &[f32], w: &[f32], state: &[f32], ch: usize, k: usize) -> (Vec<f64>, Vec<f64>) {
    let rows = x.len() / ch;
    let hist = k - 1;
    let input = |u: usize, c: usize| -> f64 {
        if u < hist {
            f64::from(state[c * hist + u])
        } else {
            f64::from(x[(u - hist) * ch + c])
        }
    };
    let mut out = vec![0f64; rows * ch];
    for t in 0..rows {
        for c in 0..ch {
            let sum: f64 = (0..k).map(|j| f64::from(w[c * k + j]) * input(t + j, c)).sum();
            out[t * ch + c] = silu(sum);
        }
    }
    let new = (0..ch)
        .flat_map(|c| (rows..rows + hist).map(move |u| (u, c)))
        .map(|(u, c)| input(u, c))
        .collect();
    (out, new)
}

/// Random inputs of one delta-net call: `qkv` rows as a conv leaves them, log-decays from
/// realistic gate parameters (`A = -exp(A_log)`, `a + dt_bias` around 0), betas in (0, 1).
struct DeltaCase {
    p: DeltaNet,
    rows: usize,
    qkv: Vec<f32>,
    gate: Vec<f32>,
    beta: Vec<f32>,
    state: Vec<f32>,
}

impl DeltaCase {
    fn new(rng: &mut Rng, p: DeltaNet, rows: usize) -> Self {
        let hv = p.n_v_heads;
        let a_log = rng.vec(hv, 1.0);
        let dt_bias = rng.vec(hv, 1.0);
        let mut gate = vec![0f32; rows * hv];
        let mut beta = vec![0f32; rows * hv];
        for t in 0..rows {
            for h in 0..hv {
                let x = f64::from(rng.f() * 3.0 + dt_bias[h]);
                let softplus = (1.0 + x.exp()).ln();
                gate[t * hv + h] = (-f64::from(a_log[h]).exp() * softplus) as f32;
                beta[t * hv + h] = (1.0 / (1.0 + (-f64::from(rng.f() * 4.0)).exp())) as f32;
            }
        }
        DeltaCase {
            p,
            rows,
            qkv: rng.vec(rows * p.qkv_dim(), 2.0),
            gate,
            beta,
            state: rng.vec(p.state_len(), 0.5),
        }
    }

    /// The rows `t0..t0 + n` as a case of their own starting from `state`.
    fn part(&self, t0: usize, n: usize, state: Vec<f32>) -> DeltaCase {
        let (w, hv) = (self.p.qkv_dim(), self.p.n_v_heads);
        DeltaCase {
            p: self.p,
            rows: n,
            qkv: self.qkv[t0 * w..(t0 + n) * w].to_vec(),
            gate: self.gate[t0 * hv..(t0 + n) * hv].to_vec(),
            beta: self.beta[t0 * hv..(t0 + n) * hv].to_vec(),
            state,
        }
    }

    /// Run the op in `form`: the outputs and the final state.
    fn run<B: Backend>(&self, be: &B, form: Form) -> (Vec<f32>, Vec<f32>) {
        let p = &self.p;
        let (qkv, gate, beta) = (upload(be, &self.qkv), upload(be, &self.gate), upload(be, &self.beta));
        let mut state = upload(be, &self.state);
        let mut out = be.alloc(self.rows * p.out_dim()).unwrap();
        let seq = SeqRows {
            row0: 0,
            rows: self.rows,
        };
        be.delta_net(p, form, seq, &qkv, &gate, &beta, &mut state, &mut out)
            .unwrap();
        (
            download(be, &out, self.rows * p.out_dim()),
            download(be, &state, p.state_len()),
        )
    }

    /// The f64 loop from the formulas: per token, q and k L2-normed, q scaled by `1/sqrt(d_k)`;
    /// per value head `h` (key head by `p.key_heads`), with `S` of `d_k × d_v`:
    /// `S = exp(g) S; d = β (v − Sᵀk); S += k dᵀ; o = Sᵀq`. The state's layout is the op's:
    /// `state[h][j][i] = S[i][j]`.
    fn reference(&self) -> (Vec<f64>, Vec<f64>) {
        let p = &self.p;
        let (hk, hv, dk, dv, w) = (p.n_k_heads, p.n_v_heads, p.d_k, p.d_v, p.qkv_dim());
        let mut s = widen(&self.state);
        let mut out = vec![0f64; self.rows * hv * dv];
        let norm = |x: &[f32], scale: f64| -> Vec<f64> {
            let sum: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
            let eps = f64::from(p.l2_eps.unwrap_or(0.0));
            let n = if p.l2_eps.is_some() { (sum + eps).sqrt() } else { 1.0 };
            x.iter().map(|&v| f64::from(v) / n * scale).collect()
        };
        for t in 0..self.rows {
            let row = &self.qkv[t * w..(t + 1) * w];
            for h in 0..hv {
                let kh = match p.key_heads {
                    KeyHeads::Tiled => h % hk,
                    KeyHeads::Grouped => h / (hv / hk),
                };
                let q = norm(&row[kh * dk..(kh + 1) * dk], 1.0 / (dk as f64).sqrt());
                let k = norm(&row[hk * dk + kh * dk..hk * dk + (kh + 1) * dk], 1.0);
                let v = &row[2 * hk * dk + h * dv..2 * hk * dk + (h + 1) * dv];
                let g = f64::from(self.gate[t * hv + h]).exp();
                let b = f64::from(self.beta[t * hv + h]);
                let sh = &mut s[h * dk * dv..(h + 1) * dk * dv];
                let at = |i: usize, j: usize| j * dk + i;
                sh.iter_mut().for_each(|x| *x *= g);
                for j in 0..dv {
                    let stk: f64 = (0..dk).map(|i| sh[at(i, j)] * k[i]).sum();
                    let d = b * (f64::from(v[j]) - stk);
                    for i in 0..dk {
                        sh[at(i, j)] += k[i] * d;
                    }
                }
                for j in 0..dv {
                    out[(t * hv + h) * dv + j] = (0..dk).map(|i| sh[at(i, j)] * q[i]).sum();
                }
            }
        }
        (out, s)
    }
}

fn net(n_k_heads: usize, n_v_heads: usize, d: usize, key_heads: KeyHeads) -> DeltaNet {
    DeltaNet {
        n_k_heads,
        n_v_heads,
        d_k: d,
        d_v: d,
        key_heads,
        l2_eps: Some(1e-6),
    }
}

/// The acceptance item: for chunk sizes 1, 7 and 64 on a prompt of 150 tokens (two whole
/// chunks of 64 and a partial one), chunked prefill equals the recurrent form and both equal
/// the f64 loop, outputs and final state; with value heads sharing key heads both ways.
#[test]
fn chunked_prefill_equals_token_by_token_decode() {
    let be = cpu();
    let mut rng = Rng(0x5eed_0001);
    for (key_heads, hk, hv, d) in [
        (KeyHeads::Tiled, 2, 4, 32),
        (KeyHeads::Grouped, 2, 6, 16),
        (KeyHeads::Tiled, 1, 1, 128),
    ] {
        let p = net(hk, hv, d, key_heads);
        let case = DeltaCase::new(&mut rng, p, 150);
        let (want_o, want_s) = case.reference();
        let (rec_o, rec_s) = case.run(&be, Form::Recurrent);
        let (eo, es) = (err(&rec_o, &want_o), err(&rec_s, &want_s));
        eprintln!(
            "{key_heads:?} {hk}/{hv} heads of {d}: recurrent vs f64: out {}, state {}",
            show(eo),
            show(es)
        );
        assert!(eo.1 < 1e-5 && es.1 < 1e-5, "recurrent vs f64: out {eo:?}, state {es:?}");
        for c in [1, 7, 64] {
            let (ch_o, ch_s) = case.run(&be, Form::Chunked(c));
            let (eo, es) = (err(&ch_o, &want_o), err(&ch_s, &want_s));
            let (ro, rs) = (err(&ch_o, &widen(&rec_o)), err(&ch_s, &widen(&rec_s)));
            eprintln!(
                "  chunk {c:>2}: vs f64: out {}, state {}; vs recurrent: out {}, state {}",
                show(eo),
                show(es),
                show(ro),
                show(rs)
            );
            assert!(eo.1 < 1e-5 && es.1 < 1e-5, "chunk {c} vs f64: out {eo:?}, state {es:?}");
            assert!(
                ro.1 < 1e-5 && rs.1 < 1e-5,
                "chunk {c} vs recurrent: out {ro:?}, state {rs:?}"
            );
        }
    }
}

/// A prompt prefilled in two calls (the state carried between them, the second call's rows at
/// an offset of the batch's buffers) equals one call; decode after a chunked prefill continues
/// it as the recurrent form would.
#[test]
fn state_carries_across_calls() {
    let be = cpu();
    let mut rng = Rng(0x5eed_0002);
    let p = net(2, 4, 16, KeyHeads::Tiled);
    let case = DeltaCase::new(&mut rng, p, 150);
    let (one_o, one_s) = case.run(&be, Form::Chunked(64));
    // The first `split` rows, then the rest read at row0 = split of the full buffers. Split
    // at a chunk boundary, the chunks and so the roundings are the same: equal bits. Split
    // inside a chunk, they differ by f32 rounding.
    for split in [128, 100] {
        let (first_o, first_s) = case.part(0, split, case.state.clone()).run(&be, Form::Chunked(64));
        let (qkv, gate, beta) = (upload(&be, &case.qkv), upload(&be, &case.gate), upload(&be, &case.beta));
        let mut state = upload(&be, &first_s);
        let mut out = be.alloc(150 * p.out_dim()).unwrap();
        let seq = SeqRows {
            row0: split,
            rows: 150 - split,
        };
        be.delta_net(&p, Form::Chunked(64), seq, &qkv, &gate, &beta, &mut state, &mut out)
            .unwrap();
        let mut two_o = first_o;
        two_o.extend_from_slice(&out.as_slice()[split * p.out_dim()..150 * p.out_dim()]);
        let two_s = download(&be, &state, p.state_len());
        let (eo, es) = (err(&two_o, &widen(&one_o)), err(&two_s, &widen(&one_s)));
        eprintln!(
            "two calls (split at {split}) vs one: out {}, state {}",
            show(eo),
            show(es)
        );
        if split % 64 == 0 {
            assert!(two_o == one_o && two_s == one_s, "out {eo:?}, state {es:?}");
        }
        assert!(eo.1 < 1e-5 && es.1 < 1e-5, "out {eo:?}, state {es:?}");
    }
    // Chunked prefill of 149 tokens, then one decoded token, against all 150 token by token.
    let (rec_o, rec_s) = case.run(&be, Form::Recurrent);
    let (_, pre_s) = case.part(0, 149, case.state.clone()).run(&be, Form::Chunked(64));
    let (dec_o, dec_s) = case.part(149, 1, pre_s).run(&be, Form::Recurrent);
    let (eo, es) = (
        err(&dec_o, &widen(&rec_o[149 * p.out_dim()..])),
        err(&dec_s, &widen(&rec_s)),
    );
    eprintln!("prefill + decode vs recurrent: out {}, state {}", show(eo), show(es));
    assert!(eo.1 < 1e-5 && es.1 < 1e-5, "out {eo:?}, state {es:?}");
}

/// Without the L2 norm (`l2_eps: None`) the op takes q and k as given, q still scaled.
#[test]
fn unnormed_q_and_k_are_taken_as_given() {
    let be = cpu();
    let mut rng = Rng(0x5eed_0003);
    let p = DeltaNet {
        l2_eps: None,
        ..net(1, 2, 8, KeyHeads::Tiled)
    };
    let mut case = DeltaCase::new(&mut rng, p, 20);
    // Small keys keep the unnormed rule stable (|β k·k| < 2).
    case.qkv.iter_mut().for_each(|v| *v *= 0.15);
    let (want_o, want_s) = case.reference();
    for form in [Form::Recurrent, Form::Chunked(7)] {
        let (o, s) = case.run(&be, form);
        let (eo, es) = (err(&o, &want_o), err(&s, &want_s));
        assert!(eo.1 < 1e-5 && es.1 < 1e-5, "{form:?}: out {eo:?}, state {es:?}");
    }
}

/// The conv equals the f64 loop, and a sequence convolved in pieces (one row at a time, pieces
/// shorter than the kernel, a piece at an offset of the batch) equals one call; with few
/// channels, with more than one task of a one-row step takes, with the 4-tap kernel (which a
/// one-row step runs unrolled) and others, and with a one-tap kernel (no state).
#[test]
fn conv_matches_f64_and_carries_its_state() {
    conv_case(40, 4, 0x5eed_0004);
    conv_case(1100, 4, 0x5eed_0005);
    conv_case(40, 1, 0x5eed_0006);
    conv_case(40, 3, 0x5eed_0007);
}

fn conv_case(ch: usize, k: usize, seed: u64) {
    let be = cpu();
    let mut rng = Rng(seed);
    let rows = 37;
    let w = rng.vec(ch * k, 1.0);
    let file = gguf(&[("blk.0.ssm_conv1d.weight", vec![k as u64, ch as u64], &w)]);
    let wt = be.load_weight(&file, "blk.0.ssm_conv1d.weight").unwrap();
    let p = Conv {
        channels: ch,
        kernel: k,
        silu: true,
    };
    let x = rng.vec(rows * ch, 2.0);
    let state0 = rng.vec(ch * (k - 1), 2.0);
    let (want, want_state) = conv_ref(&x, &w, &state0, ch, k);
    let xb = upload(&be, &x);
    let run = |pieces: &[usize]| -> (Vec<f32>, Vec<f32>) {
        let mut state = upload(&be, &state0);
        let mut out = be.alloc(rows * ch).unwrap();
        let mut row0 = 0;
        for &n in pieces {
            be.ssm_conv(&xb, &wt, &p, SeqRows { row0, rows: n }, &mut state, &mut out)
                .unwrap();
            row0 += n;
        }
        assert_eq!(row0, rows);
        (download(&be, &out, rows * ch), download(&be, &state, ch * (k - 1)))
    };
    let (one, one_state) = run(&[rows]);
    let (eo, es) = (err(&one, &want), err(&one_state, &want_state));
    eprintln!("conv vs f64: out {}, state {}", show(eo), show(es));
    assert!(eo.1 < 1e-6 && es.0 == 0.0, "out {eo:?}, state {es:?}");
    for pieces in [vec![1; rows], vec![2, 1, 0, 30, 4], vec![36, 1]] {
        let (o, s) = run(&pieces);
        assert_eq!(o, one, "{pieces:?}");
        assert_eq!(s, one_state, "{pieces:?}");
    }
    // Without SiLU: the plain convolution.
    let mut state = upload(&be, &state0);
    let mut out = be.alloc(rows * ch).unwrap();
    let plain = Conv { silu: false, ..p };
    be.ssm_conv(&xb, &wt, &plain, SeqRows { row0: 0, rows }, &mut state, &mut out)
        .unwrap();
    // SiLU of the plain outputs is the reference (which applies SiLU).
    let got: Vec<f32> = download(&be, &out, rows * ch)
        .iter()
        .map(|&v| silu(f64::from(v)) as f32)
        .collect();
    assert!(err(&got, &want).1 < 1e-6);
}

/// `delta_gates` and `rmsnorm_gated` against their f64 formulas.
#[test]
fn gates_and_gated_norm_match_f64() {
    let be = cpu();
    let mut rng = Rng(0x5eed_0005);
    let (rows, hv, dv) = (5, 6, 16);
    let (dt, a, nw) = (rng.vec(hv, 1.0), rng.vec(hv, 2.0), rng.vec(dv, 1.5));
    let file = gguf(&[
        ("blk.0.ssm_dt.bias", vec![hv as u64], &dt),
        ("blk.0.ssm_a", vec![hv as u64], &a),
        ("blk.0.ssm_norm.weight", vec![dv as u64], &nw),
    ]);
    let dtw = be.load_weight(&file, "blk.0.ssm_dt.bias").unwrap();
    let aw = be.load_weight(&file, "blk.0.ssm_a").unwrap();
    let normw = be.load_weight(&file, "blk.0.ssm_norm.weight").unwrap();
    let alpha = rng.vec(rows * hv, 30.0);
    let beta = rng.vec(rows * hv, 5.0);
    let (mut ab, mut bb) = (upload(&be, &alpha), upload(&be, &beta));
    be.delta_gates(&mut ab, &mut bb, rows, &dtw, &aw).unwrap();
    let mut want_g = vec![0f64; rows * hv];
    let mut want_b = vec![0f64; rows * hv];
    for i in 0..rows * hv {
        let x = f64::from(alpha[i]) + f64::from(dt[i % hv]);
        let sp = if x > 20.0 { x } else { x.exp().ln_1p() };
        want_g[i] = f64::from(a[i % hv]) * sp;
        want_b[i] = 1.0 / (1.0 + (-f64::from(beta[i])).exp());
    }
    assert!(err(&download(&be, &ab, rows * hv), &want_g).1 < 1e-6);
    assert!(err(&download(&be, &bb, rows * hv), &want_b).1 < 1e-6);

    let groups = rows * hv;
    let (x, z) = (rng.vec(groups * dv, 3.0), rng.vec(groups * dv, 4.0));
    let (mut xb, zb) = (upload(&be, &x), upload(&be, &z));
    let eps = 1e-6f32;
    be.rmsnorm_gated(&mut xb, &zb, &normw, groups, eps).unwrap();
    let mut want = vec![0f64; groups * dv];
    for g in 0..groups {
        let xs = &x[g * dv..(g + 1) * dv];
        let ms: f64 = xs.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / dv as f64;
        let r = 1.0 / (ms + f64::from(eps)).sqrt();
        for i in 0..dv {
            want[g * dv + i] = f64::from(xs[i]) * r * f64::from(nw[i]) * silu(f64::from(z[g * dv + i]));
        }
    }
    assert!(err(&download(&be, &xb, groups * dv), &want).1 < 1e-6);
}

/// Calls that do not fit are errors naming the problem, never panics: on the CPU, and on
/// WebGPU where there is an adapter.
#[test]
fn bad_shapes_are_errors() {
    bad_calls(&cpu());
    if let Some(g) = gpu() {
        bad_calls(&g);
    }
}

fn bad_calls<B: Backend>(be: &B) {
    let mut rng = Rng(0x5eed_0006);
    let p = net(2, 4, 8, KeyHeads::Tiled);
    let case = DeltaCase::new(&mut rng, p, 3);
    let (qkv, gate, beta) = (upload(be, &case.qkv), upload(be, &case.gate), upload(be, &case.beta));
    let mut state = upload(be, &case.state);
    let mut out = be.alloc(3 * p.out_dim()).unwrap();
    let seq = SeqRows { row0: 0, rows: 3 };
    let mut call = |p: &DeltaNet, form: Form, seq: SeqRows| -> Result<(), BackendError> {
        be.delta_net(p, form, seq, &qkv, &gate, &beta, &mut state, &mut out)
    };
    let message = |r: Result<(), BackendError>| r.unwrap_err().to_string();
    assert!(call(&p, Form::Chunked(2), seq).is_ok());
    assert!(message(call(&p, Form::Chunked(0), seq)).contains("chunks of 0"));
    assert!(message(call(&p, Form::Chunked(100_000), seq)).contains("chunks of 100000"));
    assert!(message(call(&p, Form::Recurrent, SeqRows { row0: 1, rows: 3 })).contains("qkv"));
    assert!(message(call(
        &p,
        Form::Recurrent,
        SeqRows {
            row0: usize::MAX,
            rows: 3
        }
    ))
    .contains("rows"));
    let odd = DeltaNet { n_v_heads: 3, ..p };
    assert!(message(call(&odd, Form::Recurrent, seq)).contains("3 value heads over 2 key heads"));
    let wide = DeltaNet { d_k: 1 << 40, ..p };
    assert!(message(call(&wide, Form::Recurrent, seq)).contains("k heads"));
    let huge = DeltaNet {
        n_k_heads: usize::MAX / 2,
        n_v_heads: usize::MAX / 2,
        ..p
    };
    assert!(call(&huge, Form::Recurrent, seq).is_err());
    let more_heads = DeltaNet { n_v_heads: 8, ..p };
    assert!(message(call(&more_heads, Form::Recurrent, seq)).contains("holds"));

    // The conv: a weight that is not `channels × kernel`, a short state, a kernel of 0.
    let w = rng.vec(12, 1.0);
    let file = gguf(&[
        ("conv", vec![4, 3], &w),
        ("v3", vec![3], &w[..3]),
        ("v2", vec![2], &w[..2]),
    ]);
    let wt = be.load_weight(&file, "conv").unwrap();
    let (x, mut o) = (be.alloc(6).unwrap(), be.alloc(6).unwrap());
    let conv = |channels, kernel| Conv {
        channels,
        kernel,
        silu: true,
    };
    let two = SeqRows { row0: 0, rows: 2 };
    assert!(be
        .ssm_conv(&x, &wt, &conv(3, 4), two, &mut be.alloc(9).unwrap(), &mut o)
        .is_ok());
    let e = be
        .ssm_conv(&x, &wt, &conv(3, 4), two, &mut be.alloc(8).unwrap(), &mut o)
        .unwrap_err();
    assert!(e.to_string().contains("state holds 8 values, needs 9"), "{e}");
    let e = be
        .ssm_conv(&x, &wt, &conv(5, 3), two, &mut be.alloc(9).unwrap(), &mut o)
        .unwrap_err();
    assert!(e.to_string().contains("weight of 12 values"), "{e}");
    assert!(be
        .ssm_conv(&x, &wt, &conv(3, 0), two, &mut be.alloc(9).unwrap(), &mut o)
        .is_err());

    // Gates with weights of another head count; a gated norm past its buffers.
    let (v3, v2) = (
        be.load_weight(&file, "v3").unwrap(),
        be.load_weight(&file, "v2").unwrap(),
    );
    let (mut a, mut b) = (be.alloc(6).unwrap(), be.alloc(6).unwrap());
    assert!(be.delta_gates(&mut a, &mut b, 2, &v3, &v3).is_ok());
    assert!(be.delta_gates(&mut a, &mut b, 2, &v3, &v2).is_err());
    assert!(be.delta_gates(&mut a, &mut b, 3, &v3, &v3).is_err());
    assert!(be.rmsnorm_gated(&mut a, &b, &v3, 2, 1e-6).is_ok());
    assert!(be.rmsnorm_gated(&mut a, &b, &v3, 3, 1e-6).is_err());
    assert!(be.rmsnorm_gated(&mut a, &b, &wt, 1, 1e-6).is_err());
}

// The WebGPU kernels against the CPU backend, the reference (skipped without an adapter:
// `common::device_or_skip`).

/// The WebGPU backend, or `None` when it cannot start (the test is then skipped).
fn gpu() -> Option<WebGpuBackend> {
    common::device_or_skip(WebGpuBackend::new)
}

/// WebGPU against the CPU: f32 rounding apart (relative to the largest value).
const GPU_TOL: f64 = 1e-5;

/// What one sequence of a batch leaves behind ([`delta_sequence`]).
struct SeqResult {
    /// The whole output buffer (the sequence's rows written, the others as they were).
    out: Vec<f32>,
    /// The state after the prefill call, and after the last decode call.
    prefilled: Vec<f32>,
    last: Vec<f32>,
}

/// The rows `row0..` of `case` as one sequence of a batch on `be`: `prefill` rows in one call
/// (in `form`), then each further row in a call of its own (decode, recurrent form), the state
/// carried on the device between calls. The rows before `row0` belong to another sequence.
fn delta_sequence<B: Backend>(be: &B, case: &DeltaCase, row0: usize, prefill: usize, form: Form) -> SeqResult {
    let p = &case.p;
    let (qkv, gate, beta) = (upload(be, &case.qkv), upload(be, &case.gate), upload(be, &case.beta));
    let mut state = upload(be, &case.state);
    // Values no call should touch, in the rows outside the sequence.
    let mut out = upload(be, &vec![7.0; case.rows * p.out_dim()]);
    let mut call = |seq: SeqRows, form: Form, state: &mut B::Buffer| {
        be.delta_net(p, form, seq, &qkv, &gate, &beta, state, &mut out).unwrap();
    };
    call(SeqRows { row0, rows: prefill }, form, &mut state);
    let prefilled = download(be, &state, p.state_len());
    for t in row0 + prefill..case.rows {
        call(SeqRows { row0: t, rows: 1 }, Form::Recurrent, &mut state);
    }
    SeqResult {
        out: download(be, &out, case.rows * p.out_dim()),
        prefilled,
        last: download(be, &state, p.state_len()),
    }
}

/// The delta rule on WebGPU equals the CPU's: key heads of 64 and 128 values (and unequal k
/// and v heads, a head of more columns than a workgroup holds), tiled and grouped key heads,
/// q and k normed or not; one sequence at a nonzero row of the batch, prefilled in one call
/// in either form, then decoded a row per call from the state the prefill left. Outputs and
/// both states are compared; the GPU's distance from the f64 loop is shown.
#[test]
fn webgpu_delta_net_matches_cpu() {
    let Some(g) = gpu() else { return };
    let be = cpu();
    let mut rng = Rng(0x5eed_0007);
    let unequal = DeltaNet {
        d_k: 32,
        d_v: 96,
        ..net(1, 3, 0, KeyHeads::Grouped)
    };
    let unnormed = DeltaNet {
        l2_eps: None,
        ..net(1, 2, 64, KeyHeads::Tiled)
    };
    let nets = [
        net(2, 4, 64, KeyHeads::Tiled),
        net(2, 6, 64, KeyHeads::Grouped),
        net(1, 2, 128, KeyHeads::Tiled),
        net(2, 4, 128, KeyHeads::Grouped),
        unequal,
        unnormed,
    ];
    let (row0, prefill, decode) = (3, 40, 6);
    let mut failures = Vec::new();
    for p in nets {
        let mut case = DeltaCase::new(&mut rng, p, row0 + prefill + decode);
        if p.l2_eps.is_none() {
            // Small keys keep the unnormed rule stable (|β k·k| < 2).
            case.qkv.iter_mut().for_each(|v| *v *= 0.15);
        }
        let (want_o, _) = case.part(row0, prefill + decode, case.state.clone()).reference();
        for form in [Form::Recurrent, Form::Chunked(16)] {
            let want = delta_sequence(&be, &case, row0, prefill, form);
            let got = delta_sequence(&g, &case, row0, prefill, form);
            let (seq_out, want_out) = (&got.out[row0 * p.out_dim()..], &want.out[row0 * p.out_dim()..]);
            let e = [
                ("out", err(seq_out, &widen(want_out))),
                ("prefill state", err(&got.prefilled, &widen(&want.prefilled))),
                ("final state", err(&got.last, &widen(&want.last))),
            ];
            let f64_err = err(seq_out, &want_o);
            let name = format!(
                "{:?} {}/{} heads of {}/{}{} {form:?}",
                p.key_heads,
                p.n_k_heads,
                p.n_v_heads,
                p.d_k,
                p.d_v,
                if p.l2_eps.is_none() { " unnormed" } else { "" }
            );
            let shown: Vec<String> = e.iter().map(|(what, x)| format!("{what} {}", show(*x))).collect();
            eprintln!(
                "[gpu] delta_net {name}: vs cpu {}; out vs f64 {}",
                shown.join(", "),
                show(f64_err)
            );
            for (what, (abs, rel)) in e {
                if rel.is_nan() || rel > GPU_TOL {
                    failures.push(format!("{name} {what}: {abs:.1e} abs / {rel:.1e} rel"));
                }
            }
            // The rows of the other sequence stay untouched.
            if got.out[..row0 * p.out_dim()].iter().any(|&v| v != 7.0) {
                failures.push(format!("{name}: wrote outside the sequence's rows"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The conv of one sequence at row `row0` of a batch of `x` (`[rows][channels]`) on `be`, in
/// calls of `pieces` rows each, the state carried on the device: the whole output buffer and
/// the final state.
fn conv_sequence<B: Backend>(
    be: &B,
    file: &Arc<GgufFile>,
    p: &Conv,
    x: &[f32],
    state0: &[f32],
    row0: usize,
    pieces: &[usize],
) -> (Vec<f32>, Vec<f32>) {
    let w = be.load_weight(file, "blk.0.ssm_conv1d.weight").unwrap();
    let (xb, mut state) = (upload(be, x), upload(be, state0));
    let mut out = upload(be, &vec![7.0; x.len()]);
    let mut at = row0;
    for &rows in pieces {
        be.ssm_conv(&xb, &w, p, SeqRows { row0: at, rows }, &mut state, &mut out)
            .unwrap();
        at += rows;
    }
    (download(be, &out, x.len()), download(be, &state, p.state_len()))
}

/// The conv on WebGPU equals the CPU's, outputs and state: channels across several
/// workgroups, kernels of 1 (no state), 4 and 7 taps, with and without SiLU; a sequence at a
/// nonzero row of the batch, prefilled, then pieces shorter than the state, then decoded a
/// row per call.
#[test]
fn webgpu_conv_matches_cpu() {
    let Some(g) = gpu() else { return };
    let be = cpu();
    let mut rng = Rng(0x5eed_0008);
    let (row0, pieces) = (5, [20usize, 2, 1, 1, 1]);
    let rows = row0 + pieces.iter().sum::<usize>();
    for (ch, k, silu) in [(40, 4, true), (300, 4, false), (70, 1, true), (33, 7, true)] {
        let p = Conv {
            channels: ch,
            kernel: k,
            silu,
        };
        let w = rng.vec(ch * k, 1.0);
        let file = gguf(&[("blk.0.ssm_conv1d.weight", vec![k as u64, ch as u64], &w)]);
        let x = rng.vec(rows * ch, 2.0);
        let state0 = rng.vec(p.state_len(), 2.0);
        let (want_o, want_s) = conv_sequence(&be, &file, &p, &x, &state0, row0, &pieces);
        let (got_o, got_s) = conv_sequence(&g, &file, &p, &x, &state0, row0, &pieces);
        let seq = row0 * ch..;
        let (eo, es) = (
            err(&got_o[seq.clone()], &widen(&want_o[seq])),
            err(&got_s, &widen(&want_s)),
        );
        eprintln!(
            "[gpu] ssm_conv {ch} channels of {k} taps, silu {silu}: vs cpu out {}, state {}",
            show(eo),
            show(es)
        );
        assert!(eo.1 < GPU_TOL, "{ch}x{k} out: {eo:?}");
        // The state is the inputs moved, not computed.
        assert_eq!(got_s, want_s, "{ch}x{k} state");
        assert!(
            got_o[..row0 * ch].iter().all(|&v| v == 7.0),
            "{ch}x{k}: wrote other rows"
        );
    }
}

/// The gates of `alpha` and `beta` (`rows` rows of the weights' head count) and the gated norm
/// of `x` by `z` (groups of each norm weight's width) on `be`: every result, named.
fn gate_ops<B: Backend>(
    be: &B,
    file: &Arc<GgufFile>,
    norms: &[&str],
    rows: usize,
    [alpha, beta, x, z]: [&[f32]; 4],
) -> Vec<(String, Vec<f32>)> {
    let weight = |name: &str| be.load_weight(file, name).unwrap();
    let (dt, a) = (weight("blk.0.ssm_dt.bias"), weight("blk.0.ssm_a"));
    let (mut ab, mut bb) = (upload(be, alpha), upload(be, beta));
    be.delta_gates(&mut ab, &mut bb, rows, &dt, &a).unwrap();
    let mut res = vec![
        ("gate".to_string(), download(be, &ab, alpha.len())),
        ("beta".to_string(), download(be, &bb, beta.len())),
    ];
    let zb = upload(be, z);
    for &name in norms {
        let w = weight(name);
        let width = file.tensor(name).unwrap().info.shape[0] as usize;
        let groups = x.len() / width;
        let mut xb = upload(be, x);
        be.rmsnorm_gated(&mut xb, &zb, &w, groups, 1e-6).unwrap();
        res.push((format!("rmsnorm_gated {groups}x{width}"), download(be, &xb, x.len())));
    }
    res
}

/// The gates and the gated norm on WebGPU equal the CPU's: pre-activations past softplus's
/// cut at 20 and far below 0; norm groups of 16, 64 and 128 values.
#[test]
fn webgpu_gates_and_gated_norm_match_cpu() {
    let Some(g) = gpu() else { return };
    let be = cpu();
    let mut rng = Rng(0x5eed_0009);
    let (rows, hv) = (7, 6);
    let (dt, a) = (rng.vec(hv, 1.0), rng.vec(hv, 2.0));
    let widths = [16usize, 64, 128];
    let norm_w: Vec<Vec<f32>> = widths.iter().map(|&d| rng.vec(d, 1.5)).collect();
    let names: Vec<String> = widths.iter().map(|d| format!("blk.0.ssm_norm{d}.weight")).collect();
    let mut tensors: Vec<(&str, Vec<u64>, &[f32])> = vec![
        ("blk.0.ssm_dt.bias", vec![hv as u64], &dt),
        ("blk.0.ssm_a", vec![hv as u64], &a),
    ];
    for (name, w) in names.iter().zip(&norm_w) {
        tensors.push((name, vec![w.len() as u64], w));
    }
    let file = gguf(&tensors);
    let alpha = rng.vec(rows * hv, 30.0);
    let beta = rng.vec(rows * hv, 8.0);
    // 128 * 12 values: whole groups of every width.
    let (x, z) = (rng.vec(128 * 12, 3.0), rng.vec(128 * 12, 4.0));
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let inputs = [&alpha[..], &beta[..], &x[..], &z[..]];
    let want = gate_ops(&be, &file, &names, rows, inputs);
    let got = gate_ops(&g, &file, &names, rows, inputs);
    for ((name, a), (_, b)) in got.iter().zip(&want) {
        let e = err(a, &widen(b));
        eprintln!("[gpu] {name}: vs cpu {}", show(e));
        assert!(e.1 < GPU_TOL, "{name}: {e:?}");
    }
}

/// WebGPU's own limit: key heads wider than its kernel's state column are an error naming it
/// (the CPU takes them).
#[test]
fn webgpu_delta_net_says_when_heads_are_too_wide() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(0x5eed_000a);
    let p = DeltaNet {
        d_v: 16,
        ..net(1, 1, 256, KeyHeads::Tiled)
    };
    let case = DeltaCase::new(&mut rng, p, 2);
    let (qkv, gate, beta) = (upload(&g, &case.qkv), upload(&g, &case.gate), upload(&g, &case.beta));
    let (mut state, mut out) = (upload(&g, &case.state), g.alloc(2 * p.out_dim()).unwrap());
    let seq = SeqRows { row0: 0, rows: 2 };
    let e = g
        .delta_net(&p, Form::Recurrent, seq, &qkv, &gate, &beta, &mut state, &mut out)
        .unwrap_err();
    assert!(e.to_string().contains("k heads of 256 values exceed"), "{e}");
    assert!(case.run(&cpu(), Form::Recurrent).0.iter().all(|v| v.is_finite()));
}
