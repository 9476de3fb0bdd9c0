//! Matmul kernel throughput per weight type: matvec (decode, one activation row) as GB/s of
//! weights streamed with one thread and with every core (from cache, and from memory as a
//! decode step reads them), the same with four and with eight
//! activation rows (the batched decode of four or eight streams), and matmul (prefill, 512
//! activation rows, and the 32 rows an expert sees in a MoE prefill) as GOP/s, for the best
//! SIMD kernels this CPU has (`TINYLLM_CPU_KERNELS=avx2`, `avxvnni`, `avx512vnni` or `avx512`
//! picks a set) and the portable ones.
//!
//! `cargo bench -p tinyllm --bench kernels [-- TYPE...]`; prints one table.

mod common;

use std::time::Duration;

use common::{time, Rng};

use half::f16;
use tinyllm::backend::cpu::interleave::{self, TILE_ROWS};
use tinyllm::backend::cpu::kernels::{simd_types, Kernels, Layout, TileOut};
use tinyllm::quant::GgmlType;

/// Each timing runs at least this long, best of three.
const AT_LEAST: Duration = Duration::from_millis(200);

/// Values per row and rows of the matvec matrix.
const K: usize = 4096;
const N: usize = 4096;
/// Weight rows and activation rows of the matmul.
const MM_N: usize = 1024;
const MM_ROWS: usize = 512;
/// The from-memory matvec cycles through copies of its matrix totalling at least this many
/// bytes, several times a server CPU's last-level cache, so each product streams its weights
/// from DRAM as a decode step does (the other matvec columns reread one matrix that fits such a
/// cache).
const FROM_MEMORY_BYTES: usize = 256 << 20;
/// Activation rows of the expert-shaped matmul: what one of 128 experts sees, top-8, of a
/// 512-token prefill.
const EXPERT_ROWS: usize = 32;

/// Random weights of `ty` with sane f16 scales (small and positive, as quantizers write).
fn weights(rng: &mut Rng, ty: GgmlType, k: usize, n: usize) -> Vec<u8> {
    let bytes = (k * n / ty.block_size()) * ty.block_bytes();
    let mut w: Vec<u8> = (0..bytes).map(|_| rng.next() as u8).collect();
    match ty {
        GgmlType::F32 => {
            for c in w.chunks_exact_mut(4) {
                c.copy_from_slice(&rng.f().to_le_bytes());
            }
        }
        GgmlType::F16 | GgmlType::BF16 => {
            for c in w.chunks_exact_mut(2) {
                c.copy_from_slice(&f16::from_f32(rng.f()).to_le_bytes());
            }
        }
        _ => {
            let scale_at: &[usize] = match ty {
                GgmlType::Q6_K => &[208],
                GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
                _ => &[0],
            };
            for b in w.chunks_exact_mut(ty.block_bytes()) {
                for &at in scale_at {
                    b[at..at + 2].copy_from_slice(&f16::from_f32(0.01 + 0.01 * rng.f()).to_le_bytes());
                }
            }
        }
    }
    w
}

/// `w` in the layout the backend would give kernel set `kern`, and that layout.
fn placed(kern: Kernels, ty: GgmlType, k: usize, w: &[u8]) -> (Vec<u8>, Layout) {
    match (kern.interleaves)(ty)
        .then(|| interleave::interleave(ty, k, w))
        .flatten()
    {
        Some(tiles) => (tiles, Layout::Interleaved),
        None => (w.to_vec(), Layout::Rows),
    }
}

/// `x` (rows of `k`) times every one of the `n` rows of `w` (placed by [`placed`]), the weight
/// rows split into `threads` contiguous parts of whole tiles as the backend splits them;
/// activations converted once.
#[allow(clippy::too_many_arguments)]
fn matmul(
    kern: Kernels,
    ty: GgmlType,
    k: usize,
    n: usize,
    w: &(Vec<u8>, Layout),
    x: &[f32],
    out: &mut [f32],
    threads: usize,
) {
    let act = (kern.prepare)(ty, x, k).expect("whole blocks");
    let rows = act.rows();
    let per = n.div_ceil(threads).next_multiple_of(TILE_ROWS);
    let (w, layout) = (&w.0, w.1);
    std::thread::scope(|s| {
        for (i, o) in out.chunks_mut(per * rows).enumerate() {
            let nw = o.len() / rows;
            let bytes = match layout {
                Layout::Rows => {
                    let rb = k / ty.block_size() * ty.block_bytes();
                    &w[i * per * rb..(i * per + nw) * rb]
                }
                Layout::Interleaved => &w[interleave::span(ty, k, i * per, nw)],
            };
            let act = &act;
            s.spawn(move || (kern.tile)(ty, layout, k, bytes, act, &mut TileOut::new(o, rows)));
        }
    });
}

fn main() {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let only: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let best = Kernels::detect();
    let fast = Kernels::portable();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let x1: Vec<f32> = (0..K).map(|_| rng.f()).collect();
    let x4: Vec<f32> = (0..4 * K).map(|_| rng.f()).collect();
    let x8: Vec<f32> = (0..8 * K).map(|_| rng.f()).collect();
    let xm: Vec<f32> = (0..K * MM_ROWS).map(|_| rng.f()).collect();
    println!(
        "kernels: {} ({threads} threads); matvec {N}x{K}, matmul {MM_N}x{K} x {MM_ROWS} rows",
        best.variant
    );
    println!(
        "{:<8} {:>9} {:>12} {:>12} {:>14} {:>14} {:>14} {:>12} {:>14} {:>14} {:>14}",
        "type",
        "MiB",
        "GB/s 1T",
        format!("GB/s {threads}T"),
        format!("DRAM GB/s {threads}T"),
        format!("4 rows GB/s {threads}T"),
        format!("8 rows GB/s {threads}T"),
        "portable GB/s 1T",
        format!("GOP/s {threads}T"),
        format!("{EXPERT_ROWS} rows GOP/s"),
        "portable GOP/s"
    );
    for ty in simd_types() {
        if !only.is_empty() && !only.iter().any(|o| o.eq_ignore_ascii_case(ty.name())) {
            continue;
        }
        let w = weights(&mut rng, ty, K, N);
        let gb = w.len() as f64 / 1e9;
        let (wb, wf) = (placed(best, ty, K, &w), placed(fast, ty, K, &w));
        let mut out = vec![0f32; N];
        let mv1 = gb / time(AT_LEAST, || matmul(best, ty, K, N, &wb, &x1, &mut out, 1));
        let mvn = gb / time(AT_LEAST, || matmul(best, ty, K, N, &wb, &x1, &mut out, threads));
        let copies: Vec<_> = (0..FROM_MEMORY_BYTES.div_ceil(w.len())).map(|_| wb.clone()).collect();
        let mut next = 0;
        let mvm = gb
            / time(AT_LEAST, || {
                next = (next + 1) % copies.len();
                matmul(best, ty, K, N, &copies[next], &x1, &mut out, threads)
            });
        drop(copies);
        let mut out4 = vec![0f32; 4 * N];
        let mv4 = gb / time(AT_LEAST, || matmul(best, ty, K, N, &wb, &x4, &mut out4, threads));
        let mut out8 = vec![0f32; 8 * N];
        let mv8 = gb / time(AT_LEAST, || matmul(best, ty, K, N, &wb, &x8, &mut out8, threads));
        let mvf = gb / time(AT_LEAST, || matmul(fast, ty, K, N, &wf, &x1, &mut out, 1));
        let wm = &w[..w.len() / N * MM_N];
        let (wb, wf) = (placed(best, ty, K, wm), placed(fast, ty, K, wm));
        let mut out = vec![0f32; MM_N * MM_ROWS];
        let ops = 2.0 * (MM_N * K * MM_ROWS) as f64 / 1e9;
        let mm = ops / time(AT_LEAST, || matmul(best, ty, K, MM_N, &wb, &xm, &mut out, threads));
        let xe = &xm[..K * EXPERT_ROWS];
        let eops = ops * EXPERT_ROWS as f64 / MM_ROWS as f64;
        let mme = eops
            / time(AT_LEAST, || {
                matmul(best, ty, K, MM_N, &wb, xe, &mut out[..MM_N * EXPERT_ROWS], threads)
            });
        let mmf = ops / time(AT_LEAST, || matmul(fast, ty, K, MM_N, &wf, &xm, &mut out, threads));
        println!(
            "{:<8} {:>9.1} {:>12.2} {:>12.2} {:>14.2} {:>14.2} {:>14.2} {:>12.2} {:>14.1} {:>14.1} {:>14.1}",
            ty.name(),
            w.len() as f64 / (1 << 20) as f64,
            mv1,
            mvn,
            mvm,
            mv4,
            mv8,
            mvf,
            mm,
            mme,
            mmf
        );
    }
}
