//! CPU attention over an f16 and a q8_0 KV cache (`--cache-type`) at a deep context: one
//! decode row attending `CTX` positions, and a prefill chunk of `CHUNK` rows ending there, for
//! the head layouts of qwen2.5-0.5b (14 heads over 2 KV heads of 64), gemma-3-270m (4 over 1 of
//! 256), the qwen3moe synthetic model (32 over 4 of 128) and MLA's latent head (16 over 1 of
//! 576, deepseek2's 512 + 64), one layer, with one thread and with every core.
//!
//! `cargo bench -p tinyllm --bench attention [-- HEADS]`; prints one table (milliseconds per
//! call), of the head layouts whose name (`16/1 x 576`) contains `HEADS` if given.

mod common;

use std::time::Duration;

use common::{time, Rng};

use tinyllm::backend::cpu::CpuBackend;
use tinyllm::backend::{AttnParams, Backend, KvType, SeqAttn};

/// Each timing runs at least this long, best of three.
const AT_LEAST: Duration = Duration::from_millis(300);

/// Positions the decode row sees (the last is its own).
const CTX: usize = 4096;
/// Rows of the prefill chunk, ending at position `CTX - 1`.
const CHUNK: usize = 512;

/// Milliseconds per attention call of `rows` rows ending at position `CTX - 1`, caches of
/// format `kv` filled with random rows.
fn run(be: &CpuBackend, (n_head, n_head_kv, hd): (usize, usize, usize), kv: KvType, rows: usize) -> f64 {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let width = n_head_kv * hd;
    let mut kc = be.alloc_kv(CTX * width, kv).expect("k cache");
    let mut vc = be.alloc_kv(CTX * width, kv).expect("v cache");
    let mut src = be.alloc(CTX * width).expect("rows");
    let values: Vec<f32> = (0..CTX * width).map(|_| 2.0 * rng.f()).collect();
    be.write(&mut src, &values).expect("write");
    let positions: Vec<u32> = (0..CTX as u32).collect();
    be.kv_store(&mut kc, &src, 0, width, &positions).expect("store k");
    be.kv_store(&mut vc, &src, 0, width, &positions).expect("store v");
    let mut q = be.alloc(rows * n_head * hd).expect("q");
    let qv: Vec<f32> = (0..rows * n_head * hd).map(|_| 2.0 * rng.f()).collect();
    be.write(&mut q, &qv).expect("write");
    let mut out = be.alloc(rows * n_head * hd).expect("out");
    let seq = [SeqAttn {
        row0: 0,
        p: AttnParams {
            rows,
            pos0: CTX - rows,
            n_head,
            n_head_kv,
            head_dim_k: hd,
            head_dim_v: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            window: None,
            softcap: None,
            v_in_k: false,
        },
        k_cache: &kc,
        v_cache: &vc,
    }];
    1e3 * time(AT_LEAST, || {
        be.run_pass(|| be.attention(&q, &seq, None, &mut out).expect("attention"))
    })
}

fn main() {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let only = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    println!("attention at position {CTX}: ms per call (decode: 1 row; prefill: {CHUNK} rows)");
    println!(
        "{:<14} {:>7} {:>6} {:>12} {:>12}",
        "heads", "threads", "cache", "decode ms", "prefill ms"
    );
    for (name, shape) in [
        ("14/2 x 64", (14, 2, 64)),
        ("4/1 x 256", (4, 1, 256)),
        ("32/4 x 128", (32, 4, 128)),
        ("16/1 x 576", (16, 1, 576)),
    ] {
        if only.as_ref().is_some_and(|o| !name.contains(o.as_str())) {
            continue;
        }
        for t in [1, threads] {
            let be = CpuBackend::new(t).expect("cpu backend");
            for (kv, _) in KvType::ALL {
                let (d, p) = (run(&be, shape, kv, 1), run(&be, shape, kv, CHUNK));
                println!("{name:<14} {t:>7} {:>6} {d:>12.3} {p:>12.2}", kv.name());
            }
        }
    }
}
