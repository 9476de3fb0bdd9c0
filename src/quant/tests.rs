//! Tests of the scalar oracle shared by every format: the dot product against quantized
//! activations, the activation quantizers against ggml, and length/alignment handling.
//!
//! Generic over every type whose `vec_dot` exists, so a format added later is covered as soon as
//! it stops answering `Unsupported`. Weights are the golden llama.cpp blocks (tests/golden) and
//! random blocks; activations are the golden source rows and random rows.
//!
//! Tolerances (all relative to `S = Σ|w_i|·|x_i|`, so cancellation in the result cannot make
//! them meaningless):
//! - `vec_dot(w, a)` against the f64 dot of the *dequantized* operands: both compute the same
//!   real number, `vec_dot` with a few f32 roundings per block (f32 scales, the block product,
//!   the running sum), so `|err| <= 1e-4·S`. Any indexing or scaling bug moves whole sub-blocks
//!   and is orders of magnitude larger.
//! - `vec_dot(w, quantize(x))` against the f64 dot with the *unquantized* `x`: each activation
//!   moves by at most `c·amax` of its block (Q8_0: half a step `amax/254` plus the f16 rounding
//!   of `d`, at most `127·d·2^-11`, so `c = 1/254 + 1/2048`; Q8_K: `d` stays f32, so
//!   `c = 1/254·(1 + 1e-6)`; F32: `c = 0`), giving `|err| <= Σ|w_i|·c·amax_i + 1e-4·S`.

use std::path::PathBuf;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::kquant::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, QK_K};
use super::legacy::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1};
use super::*;

const ROW: usize = 512;

fn golden_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden/quants")
        .join(name)
}

/// The 4 golden source rows (normal, weight-like, outliers, heavy tails with zeros).
fn source_rows() -> Vec<Vec<f32>> {
    let path = golden_path("source.f32");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let all: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(all.len(), 4 * ROW, "source.f32 is 4 x 512");
    all.chunks(ROW).map(<[f32]>::to_vec).collect()
}

/// llama.cpp's blocks of the source rows for `ty`, when the golden set has that type.
fn golden_bin(ty: GgmlType) -> Option<Vec<u8>> {
    std::fs::read(golden_path(&format!("{}.bin", ty.name()))).ok()
}

/// Types with a scalar dot product and a dequantizer (probed with one zero block, so a family
/// that is still a stub is skipped until it answers).
fn dot_types() -> Vec<GgmlType> {
    GgmlType::ALL
        .iter()
        .copied()
        .filter(|&t| {
            let block = vec![0u8; t.block_bytes()];
            let mut out = vec![0f32; t.block_size()];
            vec_dot(t, 0, &[], &[]).is_ok() && dequantize(t, &block, &mut out).is_ok()
        })
        .collect()
}

fn deq(ty: GgmlType, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    dequantize(ty, bytes, &mut out).unwrap_or_else(|e| panic!("{ty}: {e}"));
    out
}

fn quantize(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    quantize_activations(ty, x, &mut out).unwrap_or_else(|e| panic!("{ty}: {e}"));
    out
}

/// Random activations: smooth values with noise and a few outliers, at a random scale.
fn random_row(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    let scale = 10f32.powf(rng.random_range(-3.0..2.0));
    let offset: f32 = rng.random_range(0.0..100.0);
    (0..n)
        .map(|i| {
            let outlier = if rng.random_range(0..64) == 0 { 8.0 } else { 1.0 };
            scale * outlier * (0.1 + 2.0 * (i as f32 + offset).cos() + rng.random_range(-1.0..1.0))
        })
        .collect()
}

/// Random blocks of `ty`: random bytes, each block redrawn until it decodes to finite values
/// of sane magnitude (random f16/f32 scale bits can be NaN, infinite or huge).
fn random_blocks(rng: &mut ChaCha8Rng, ty: GgmlType, nblocks: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(nblocks * ty.block_bytes());
    let mut block = vec![0u8; ty.block_bytes()];
    let mut values = vec![0f32; ty.block_size()];
    for _ in 0..nblocks {
        let ok = (0..10_000).any(|_| {
            rng.fill(&mut block[..]);
            dequantize(ty, &block, &mut values).is_ok() && values.iter().all(|v| v.is_finite() && v.abs() < 1e15)
        });
        assert!(ok, "{ty}: no sane random block in 10000 draws");
        out.extend_from_slice(&block);
    }
    out
}

/// Largest magnitude in the activation block of element `i`.
fn block_amax(x: &[f32], block: usize, i: usize) -> f64 {
    let start = i / block * block;
    x[start..start + block]
        .iter()
        .fold(0f64, |a, v| a.max(f64::from(v.abs())))
}

/// Bound on `|x_i - dequantized activation_i|` per unit of block amax (see module docs).
fn activation_step(act: GgmlType) -> f64 {
    match act {
        GgmlType::Q8_0 => 1.0 / 254.0 + 1.0 / 2048.0,
        GgmlType::Q8_K => 1.0 / 254.0 * (1.0 + 1e-6),
        _ => 0.0,
    }
}

/// Check (a) for one weight row `w` (n values) and activations `x`; `what` names the case.
fn check_dot(ty: GgmlType, w: &[u8], x: &[f32], what: &str) {
    let n = x.len();
    let act_ty = ty.vec_dot_type();
    let act = quantize(ty, x);
    let got = f64::from(vec_dot(ty, n, w, &act).unwrap_or_else(|e| panic!("{ty}: {e}")));
    let wv = deq(ty, w, n);
    let av = deq(act_ty, &act, n);

    let scale: f64 = wv
        .iter()
        .zip(x)
        .map(|(&w, &x)| f64::from(w).abs() * f64::from(x).abs())
        .sum::<f64>()
        + wv.iter()
            .zip(&av)
            .map(|(&w, &a)| f64::from(w).abs() * f64::from(a).abs())
            .sum::<f64>();
    let rounding = 1e-4 * scale + 1e-30;

    let exact_q: f64 = wv.iter().zip(&av).map(|(&w, &a)| f64::from(w) * f64::from(a)).sum();
    assert!(
        (got - exact_q).abs() <= rounding,
        "{ty} {what}: vec_dot {got} vs f64 dot of dequantized operands {exact_q} (tolerance {rounding:e})"
    );

    let exact: f64 = wv.iter().zip(x).map(|(&w, &x)| f64::from(w) * f64::from(x)).sum();
    let bs = act_ty.block_size();
    let quant_err: f64 = (0..n)
        .map(|i| f64::from(wv[i]).abs() * activation_step(act_ty) * block_amax(x, bs, i))
        .sum();
    let tol = quant_err + rounding;
    assert!(
        (got - exact).abs() <= tol,
        "{ty} {what}: vec_dot {got} vs f64 dot with unquantized activations {exact} (tolerance {tol:e})"
    );
}

#[test]
fn vec_dot_matches_f64_dot_on_golden_weights_and_source_rows() {
    let rows = source_rows();
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let mut checked = Vec::new();
    for ty in dot_types() {
        let Some(bin) = golden_bin(ty) else { continue };
        let row_bytes = ty.bytes_for(ROW as u64).expect("512 is whole blocks") as usize;
        for (r, w) in bin.chunks_exact(row_bytes).enumerate() {
            for (s, x) in rows.iter().enumerate() {
                check_dot(ty, w, x, &format!("golden weight row {r} x source row {s}"));
            }
            check_dot(
                ty,
                w,
                &random_row(&mut rng, ROW),
                &format!("golden weight row {r} x random row"),
            );
        }
        checked.push(ty);
    }
    // The golden set covers all of these; a missing one means the dispatch lost it.
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q8_0,
        GgmlType::Q2_K,
        GgmlType::Q6_K,
        GgmlType::F16,
        GgmlType::BF16,
    ] {
        assert!(checked.contains(&ty), "{ty} was not checked");
    }
}

#[test]
fn vec_dot_matches_f64_dot_on_random_blocks() {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    for ty in dot_types() {
        // One block at a time, so each block's own magnitude sets its tolerance.
        let unit = ty.block_size().max(ty.vec_dot_type().block_size());
        let blocks_per_row = unit / ty.block_size();
        for trial in 0..64 {
            let w = random_blocks(&mut rng, ty, blocks_per_row);
            check_dot(ty, &w, &random_row(&mut rng, unit), &format!("random block {trial}"));
        }
    }
}

#[test]
fn vec_dot_handles_one_block_and_many_blocks() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for ty in dot_types() {
        let unit = ty.block_size().max(ty.vec_dot_type().block_size());
        for units in [1, 2, 64] {
            let n = unit * units;
            let w = random_blocks(&mut rng, ty, n / ty.block_size());
            check_dot(ty, &w, &random_row(&mut rng, n), &format!("{n} values"));
        }
    }
}

#[test]
fn all_zero_activations_give_zero() {
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    for ty in dot_types() {
        let n = QK_K;
        let w = random_blocks(&mut rng, ty, n / ty.block_size());
        let act = quantize(ty, &vec![0.0; n]);
        assert_eq!(vec_dot(ty, n, &w, &act), Ok(0.0), "{ty}");
    }
}

#[test]
fn q8_0_quantization_is_byte_identical_to_ggml() {
    let path = golden_path("Q8_0.bin");
    let want = std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let source: Vec<f32> = source_rows().concat();
    let mut got = Vec::new();
    legacy::quantize_q8_0_ref(&source, &mut got);
    assert_eq!(got.len(), want.len());
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        panic!(
            "Q8_0 byte {i} (block {}) differs: got {:#04x}, want {:#04x}",
            i / 34,
            got[i],
            want[i]
        );
    }
    // The public entry point for a 32-element weight type produces the same bytes.
    assert_eq!(quantize(GgmlType::Q4_0, &source), want);
}

#[test]
fn q8_0_reference_rounds_ties_away_from_zero_and_runtime_to_even() {
    // amax 127 gives d = 1 exactly, so x / d is x and the rounding rule is visible: the gguf
    // reference uses roundf, ggml's x86 activation quantizer (our runtime rule) rounds to even.
    let mut x = [0f32; 32];
    x[..6].copy_from_slice(&[127.0, 2.5, -2.5, 0.5, -0.5, 1.49]);
    let mut bytes = Vec::new();
    legacy::quantize_q8_0_ref(&x, &mut bytes);
    let block: BlockQ8_0 = bytemuck::pod_read_unaligned(&bytes);
    assert_eq!(block.d.to_f32(), 1.0);
    assert_eq!(block.qs[..6], [127, 3, -3, 1, -1, 1]);
    let block: BlockQ8_0 = bytemuck::pod_read_unaligned(&quantize(GgmlType::Q8_0, &x));
    assert_eq!(block.d.to_f32(), 1.0);
    assert_eq!(block.qs[..6], [127, 2, -2, 0, 0, 1]);
}

#[test]
fn q8_k_rounds_ties_to_even_and_maps_the_largest_value_to_minus_127() {
    // The value of largest magnitude is -127, so iscale = -127 / max = 1 and the products are
    // exactly x: ggml's nearest_int rounds 2.5 to 2 and 0.5 to 0 (ties to even).
    let mut x = [0f32; QK_K];
    x[..7].copy_from_slice(&[-127.0, 2.5, 3.5, 0.5, -0.5, -1.5, 127.0]);
    x[16] = 5.0;
    let bytes = quantize(GgmlType::Q4_K, &x);
    let block: BlockQ8K = bytemuck::pod_read_unaligned(&bytes);
    assert_eq!(block.d, 1.0);
    assert_eq!(block.qs[..7], [-127, 2, 4, 0, 0, -2, 127]);
    assert_eq!(block.bsums[0], -127 + 2 + 4 - 2 + 127);
    assert_eq!(block.bsums[1], 5);

    // A positive maximum gives a negative scale: x = max maps to -127.
    let bytes = quantize(GgmlType::Q4_K, &[1.0; QK_K]);
    let block: BlockQ8K = bytemuck::pod_read_unaligned(&bytes);
    assert_eq!((block.d, block.qs[0], block.bsums[3]), (-1.0 / 127.0, -127, -127 * 16));

    // An all-zero block is all zeros.
    let bytes = quantize(GgmlType::Q4_K, &[0.0; QK_K]);
    assert!(bytes.iter().all(|&b| b == 0));
}

#[test]
fn q8_k_round_trip_error_is_half_a_step() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let mut rows = source_rows();
    rows.extend((0..8).map(|_| random_row(&mut rng, 4 * QK_K)));
    for (r, x) in rows.iter().enumerate() {
        let bytes = quantize(GgmlType::Q6_K, x);
        let back = deq(GgmlType::Q8_K, &bytes, x.len());
        for i in 0..x.len() {
            let bound = block_amax(x, QK_K, i) * activation_step(GgmlType::Q8_K);
            let err = (f64::from(x[i]) - f64::from(back[i])).abs();
            assert!(
                err <= bound,
                "row {r} value {i}: {} -> {}, error {err:e} > {bound:e}",
                x[i],
                back[i]
            );
        }
        for (b, block) in bytes.chunks_exact(size_of::<BlockQ8K>()).enumerate() {
            let block: BlockQ8K = bytemuck::pod_read_unaligned(block);
            for (j, q) in block.qs.chunks_exact(16).enumerate() {
                let sum: i32 = q.iter().map(|&v| i32::from(v)).sum();
                assert_eq!(i32::from(block.bsums[j]), sum, "row {r} block {b} bsum {j}");
            }
        }
    }
}

#[test]
fn q8_0_round_trip_error_is_within_the_documented_step() {
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let mut rows = source_rows();
    rows.extend((0..8).map(|_| random_row(&mut rng, 512)));
    for (r, x) in rows.iter().enumerate() {
        let back = deq(GgmlType::Q8_0, &quantize(GgmlType::Q8_0, x), x.len());
        for i in 0..x.len() {
            let bound = block_amax(x, 32, i) * activation_step(GgmlType::Q8_0);
            let err = (f64::from(x[i]) - f64::from(back[i])).abs();
            assert!(
                err <= bound,
                "row {r} value {i}: {} -> {}, error {err:e} > {bound:e}",
                x[i],
                back[i]
            );
        }
    }
}

#[test]
fn float_activations_are_the_values_themselves() {
    let x = [1.5f32, -0.0, f32::MAX, 1e-40];
    let bytes = quantize(GgmlType::F16, &x);
    let back = deq(GgmlType::F32, &bytes, x.len());
    assert_eq!(
        back.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        x.map(f32::to_bits)
    );
}

#[test]
fn wide_integer_and_f64_tensors_decode_to_f32() {
    let cases: [(GgmlType, Vec<u8>, Vec<f32>); 5] = [
        (GgmlType::I8, vec![0xFF, 0x7F], vec![-1.0, 127.0]),
        (
            GgmlType::I16,
            [-300i16, 2].iter().flat_map(|v| v.to_le_bytes()).collect(),
            vec![-300.0, 2.0],
        ),
        (
            GgmlType::I32,
            [-70000i32, 5].iter().flat_map(|v| v.to_le_bytes()).collect(),
            vec![-70000.0, 5.0],
        ),
        (
            GgmlType::I64,
            [-3i64, 1 << 40].iter().flat_map(|v| v.to_le_bytes()).collect(),
            vec![-3.0, 1099511627776.0],
        ),
        (
            GgmlType::F64,
            [0.25f64, -1e10].iter().flat_map(|v| v.to_le_bytes()).collect(),
            vec![0.25, -1e10],
        ),
    ];
    for (ty, bytes, want) in cases {
        assert_eq!(deq(ty, &bytes, want.len()), want, "{ty}");
    }
}

#[test]
fn block_structs_match_the_type_table() {
    let sizes = [
        (BlockQ4_0::TYPE, size_of::<BlockQ4_0>()),
        (BlockQ4_1::TYPE, size_of::<BlockQ4_1>()),
        (BlockQ5_0::TYPE, size_of::<BlockQ5_0>()),
        (BlockQ5_1::TYPE, size_of::<BlockQ5_1>()),
        (BlockQ8_0::TYPE, size_of::<BlockQ8_0>()),
        (BlockQ8_1::TYPE, size_of::<BlockQ8_1>()),
        (BlockQ2K::TYPE, size_of::<BlockQ2K>()),
        (BlockQ3K::TYPE, size_of::<BlockQ3K>()),
        (BlockQ4K::TYPE, size_of::<BlockQ4K>()),
        (BlockQ5K::TYPE, size_of::<BlockQ5K>()),
        (BlockQ6K::TYPE, size_of::<BlockQ6K>()),
        (BlockQ8K::TYPE, size_of::<BlockQ8K>()),
    ];
    for (ty, size) in sizes {
        assert_eq!(size, ty.block_bytes(), "{ty}");
    }
}

#[test]
fn q8_1_and_q8_k_decode_as_scale_times_value() {
    let b1 = BlockQ8_1 {
        d: half::f16::from_f32(0.5),
        s: half::f16::from_f32(99.0),
        qs: std::array::from_fn(|i| i as i8 - 16),
    };
    let got = deq(GgmlType::Q8_1, bytemuck::bytes_of(&b1), 32);
    assert_eq!(got, (0..32).map(|i| (i as f32 - 16.0) * 0.5).collect::<Vec<_>>());

    let bk = BlockQ8K {
        d: -0.25,
        qs: std::array::from_fn(|i| (i % 256) as u8 as i8),
        bsums: [0; 16],
    };
    let got = deq(GgmlType::Q8_K, bytemuck::bytes_of(&bk), QK_K);
    assert_eq!(
        got,
        (0..QK_K)
            .map(|i| f32::from((i as u8) as i8) * -0.25)
            .collect::<Vec<_>>()
    );
}

#[test]
fn lengths_that_are_not_whole_blocks_are_errors() {
    for &ty in GgmlType::ALL {
        let (bs, bb) = (ty.block_size(), ty.block_bytes());
        let bytes = vec![0u8; 2 * bb];
        if bs > 1 {
            let mut out = vec![0f32; 2 * bs - 1];
            assert_eq!(
                dequantize(ty, &bytes, &mut out),
                Err(QuantError::PartialBlock {
                    ty,
                    elements: 2 * bs - 1,
                    block_size: bs
                })
            );
        }
        let mut out = vec![0f32; 2 * bs];
        assert_eq!(
            dequantize(ty, &bytes[..2 * bb - 1], &mut out),
            Err(QuantError::ByteLength {
                ty,
                elements: 2 * bs,
                expected: 2 * bb,
                got: 2 * bb - 1
            })
        );
    }
    // Activations: the activation format's own block size applies.
    let mut out = Vec::new();
    assert_eq!(
        quantize_activations(GgmlType::Q4_0, &[0.0; 33], &mut out),
        Err(QuantError::PartialBlock {
            ty: GgmlType::Q8_0,
            elements: 33,
            block_size: 32
        })
    );
    assert_eq!(
        quantize_activations(GgmlType::Q4_K, &[0.0; 288], &mut out),
        Err(QuantError::PartialBlock {
            ty: GgmlType::Q8_K,
            elements: 288,
            block_size: 256
        })
    );
    assert!(out.is_empty(), "a rejected row appends nothing");

    // vec_dot checks both operands.
    let w = vec![0u8; 144];
    let act = quantize(GgmlType::Q4_K, &[1.0; QK_K]);
    assert_eq!(
        vec_dot(GgmlType::Q4_K, QK_K, &w, &act[..291]),
        Err(QuantError::ByteLength {
            ty: GgmlType::Q8_K,
            elements: QK_K,
            expected: 292,
            got: 291
        })
    );
    assert_eq!(
        vec_dot(GgmlType::Q4_K, QK_K, &w[..143], &act),
        Err(QuantError::ByteLength {
            ty: GgmlType::Q4_K,
            elements: QK_K,
            expected: 144,
            got: 143
        })
    );
    assert_eq!(
        vec_dot(GgmlType::Q8_1, 32, &[0; 36], &[0; 34]),
        Err(QuantError::Unsupported {
            ty: GgmlType::Q8_1,
            op: "vec_dot"
        })
    );
}

#[test]
fn misaligned_rows_dot_the_same_and_never_panic() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for ty in dot_types() {
        let n = QK_K;
        let w = random_blocks(&mut rng, ty, n / ty.block_size());
        let act = quantize(ty, &random_row(&mut rng, n));
        let want = vec_dot(ty, n, &w, &act).expect("aligned");
        // Copies at an odd address: an f16/f32 field can no longer be read in place.
        let mut wbuf = vec![0u8; w.len() + 1];
        wbuf[1..].copy_from_slice(&w);
        let mut abuf = vec![0u8; act.len() + 1];
        abuf[1..].copy_from_slice(&act);
        let got = vec_dot(ty, n, &wbuf[1..], &abuf[1..]).expect("misaligned");
        assert_eq!(got.to_bits(), want.to_bits(), "{ty}");
        // Dequantizing may refuse misaligned blocks, but only with an error.
        let mut out = vec![0f32; n];
        match dequantize(ty, &wbuf[1..], &mut out) {
            Ok(()) => assert_eq!(out, deq(ty, &w, n), "{ty}"),
            Err(e) => assert!(matches!(e, QuantError::Misaligned { .. }), "{ty}: {e}"),
        }
    }
}
