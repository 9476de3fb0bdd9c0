//! The CPU's gated delta rule (`delta_net`) at the width of the qwen35 synthetic model and of
//! Qwen3.5-0.8B (16 key and 16 value heads of 128): a prefill of `ROWS` tokens in the
//! token-by-token form and in chunks, and one decoded token, with one thread and with every
//! core.
//!
//! `cargo bench -p tinyllm --bench recurrent`; prints one table (milliseconds per call, one
//! layer).

mod common;

use std::time::Duration;

use common::{time, Rng};

use tinyllm::backend::cpu::CpuBackend;
use tinyllm::backend::recurrent::{DeltaNet, Form, KeyHeads, SeqRows};
use tinyllm::backend::Backend;

/// Each timing runs at least this long, best of three.
const AT_LEAST: Duration = Duration::from_millis(300);

/// Tokens of the prefill call.
const ROWS: usize = 512;

/// Milliseconds per `delta_net` call of `rows` tokens in `form`.
fn run(be: &CpuBackend, p: &DeltaNet, form: Form, rows: usize) -> f64 {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let hv = p.n_v_heads;
    let upload = |v: &[f32]| {
        let mut b = be.alloc(v.len()).expect("alloc");
        be.write(&mut b, v).expect("write");
        b
    };
    let qkv = upload(&rng.vec(rows * p.qkv_dim(), 2.0));
    // Log-decays in (-1, 0) and betas in (0, 1), as the gates give.
    let gate = upload(&(0..rows * hv).map(|_| -0.5 - 0.5 * rng.f()).collect::<Vec<_>>());
    let beta = upload(&(0..rows * hv).map(|_| 0.5 + 0.5 * rng.f()).collect::<Vec<_>>());
    let mut state = upload(&rng.vec(p.state_len(), 0.1));
    let mut out = be.alloc(rows * p.out_dim()).expect("out");
    let seq = SeqRows { row0: 0, rows };
    1e3 * time(AT_LEAST, || {
        be.delta_net(p, form, seq, &qkv, &gate, &beta, &mut state, &mut out)
            .expect("delta_net")
    })
}

fn main() {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let p = DeltaNet {
        n_k_heads: 16,
        n_v_heads: 16,
        d_k: 128,
        d_v: 128,
        key_heads: KeyHeads::Tiled,
        l2_eps: Some(1e-6),
    };
    println!("delta_net, 16 heads of 128: ms per call (prefill: {ROWS} tokens; decode: 1)");
    println!(
        "{:>7} {:>16} {:>16} {:>10}",
        "threads", "prefill by token", "prefill chunk16", "decode"
    );
    for t in [1, threads] {
        let be = CpuBackend::new(t).expect("cpu backend");
        let rec = run(&be, &p, Form::Recurrent, ROWS);
        let chunked = run(&be, &p, Form::Chunked(16), ROWS);
        let decode = run(&be, &p, Form::Recurrent, 1);
        println!("{t:>7} {rec:>16.2} {chunked:>16.2} {decode:>10.4}");
    }
}
