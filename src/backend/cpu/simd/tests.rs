//! AVX2 kernels against the scalar oracles of `crate::quant` on random data: quantizers byte
//! for byte, dot products within the f32 reordering bound, tiles bit-identical to single pairs,
//! and the VNNI variants (where this CPU has them) bit-identical to plain AVX2.

use half::{bf16, f16};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::super::interleave;
use super::super::kernels::{simd_types, Kernels};
use super::lanes::Isa;
use crate::backend::cpu::tile::{Activations, Layout, TileOut};
use crate::quant::{self, GgmlType};

/// The AVX2 kernels without VNNI.
fn avx2() -> Kernels {
    assert!(super::available(), "these tests need a CPU with AVX2, FMA and F16C");
    Kernels::simd(Isa::Avx2).unwrap()
}

/// The AVX2 kernels, then each VNNI variant this CPU has.
fn simd_sets() -> Vec<Kernels> {
    let mut sets = vec![avx2()];
    sets.extend(Isa::vnni().into_iter().map(|isa| Kernels::simd(isa).unwrap()));
    sets
}

/// Activations with a magnitude that changes every 32 values, some exact zeros, and a block
/// whose values sit on rounding ties.
fn activations(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    let mut x = Vec::with_capacity(n);
    let mut scale = 1.0f32;
    for i in 0..n {
        if i % 32 == 0 {
            scale = 10f32.powf(rng.random_range(-3.0..1.5));
        }
        let v = match rng.random_range(0..20) {
            0 => 0.0,
            1 => scale * 4.0,
            _ => rng.random_range(-1.0f32..1.0) * scale,
        };
        x.push(v);
    }
    if n >= 64 {
        // amax 127 gives Q8_0 the scale 1: halves are exact ties (away from zero); a first
        // element of -127 gives Q8_K the scale 1 too (ties to even).
        for (j, v) in x[32..64].iter_mut().enumerate() {
            *v = j as f32 - 15.5;
        }
        x[32] = 127.0;
        x[0] = -127.0;
        for (j, v) in x[1..32].iter_mut().enumerate() {
            *v = (j as f32 - 15.0) * 2.5;
        }
    }
    x
}

/// A scale that ggml's quantizers could have written: positive or negative, 1e-4..0.1.
fn scale(rng: &mut ChaCha8Rng, positive: bool) -> [u8; 2] {
    let v = 10f32.powf(rng.random_range(-4.0..-1.0));
    let v = if positive || rng.random_bool(0.5) { v } else { -v };
    f16::from_f32(v).to_le_bytes()
}

/// `rows` random weight rows of `k` values of `ty` with sane f16 scales.
fn weights(rng: &mut ChaCha8Rng, ty: GgmlType, k: usize, rows: usize) -> Vec<u8> {
    let n = k * rows;
    match ty {
        GgmlType::F32 => {
            return (0..n)
                .flat_map(|_| rng.random_range(-1.0f32..1.0).to_le_bytes())
                .collect();
        }
        GgmlType::F16 => {
            return (0..n)
                .flat_map(|_| f16::from_f32(rng.random_range(-1.0..1.0)).to_le_bytes())
                .collect();
        }
        GgmlType::BF16 => {
            return (0..n)
                .flat_map(|_| bf16::from_f32(rng.random_range(-1.0..1.0)).to_le_bytes())
                .collect();
        }
        _ => {}
    }
    let bb = ty.block_bytes();
    let mut w: Vec<u8> = (0..n / ty.block_size() * bb).map(|_| rng.random()).collect();
    for b in w.chunks_exact_mut(bb) {
        let (d_at, min_at) = match ty {
            GgmlType::Q6_K => (208, None),
            GgmlType::Q3_K => (108, None),
            GgmlType::TQ1_0 => (52, None),
            GgmlType::TQ2_0 => (64, None),
            GgmlType::Q2_K => (80, Some(82)),
            GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => (0, Some(2)),
            _ => (0, None),
        };
        if ty == GgmlType::MXFP4 {
            // An E8M0 exponent: scales 2^-10 .. 2^-1, now and then a subnormal one (e 0, 1).
            b[0] = if rng.random_range(0..16) == 0 {
                rng.random_range(0..2)
            } else {
                rng.random_range(118..128)
            };
            continue;
        }
        if ty == GgmlType::IQ1_M {
            // The f16 scale is spread over the top nibbles of the four scale words (bytes 48..56).
            let d = u16::from_le_bytes(scale(rng, false));
            for k in 0..4 {
                b[49 + 2 * k] = (b[49 + 2 * k] & 0x0f) | ((((d >> (4 * k)) & 0xf) as u8) << 4);
            }
            continue;
        }
        let k_quant = matches!(ty, GgmlType::Q2_K | GgmlType::Q4_K | GgmlType::Q5_K);
        b[d_at..d_at + 2].copy_from_slice(&scale(rng, k_quant));
        if let Some(m) = min_at {
            b[m..m + 2].copy_from_slice(&scale(rng, k_quant));
        }
    }
    w
}

/// The part of each weight that does not depend on its quant (`m`, `-dmin·m`), for the
/// formats whose dot products add it separately scaled; zeros otherwise.
fn min_part(ty: GgmlType, w: &[u8], k: usize) -> Vec<f32> {
    let quants = match ty {
        GgmlType::Q4_1 => 4..20,
        GgmlType::Q5_1 => 4..24,
        GgmlType::Q4_K => 16..144,
        GgmlType::Q5_K => 16..176,
        GgmlType::Q2_K => 16..80,
        _ => return vec![0.0; w.len() / ty.block_bytes() * ty.block_size()],
    };
    let mut z = w.to_vec();
    for b in z.chunks_exact_mut(ty.block_bytes()) {
        b[quants.clone()].fill(0);
    }
    let mut out = vec![0f32; z.len() / ty.block_bytes() * ty.block_size()];
    quant::dequantize(ty, &z, &mut out).unwrap();
    assert_eq!(out.len() % k, 0);
    out
}

/// `w` (file rows) times `x` through kernel set `k`, on the layout the backend would give it.
fn run(k: Kernels, ty: GgmlType, kk: usize, w: &[u8], x: &[f32]) -> Vec<f32> {
    let act: Activations = (k.prepare)(ty, x, kk).unwrap();
    let nw = w.len() / (kk / ty.block_size() * ty.block_bytes());
    let mut out = vec![f32::NAN; nw * act.rows()];
    if (k.interleaves)(ty) {
        let tiles = interleave::interleave(ty, kk, w).unwrap();
        (k.tile)(
            ty,
            Layout::Interleaved,
            kk,
            &tiles,
            &act,
            &mut TileOut::new(&mut out, act.rows()),
        );
    } else {
        (k.tile)(ty, Layout::Rows, kk, w, &act, &mut TileOut::new(&mut out, act.rows()));
    }
    out
}

/// Compare the AVX2 tile with the oracle for `nw` weight rows × `rows` activation rows.
fn check(rng: &mut ChaCha8Rng, ty: GgmlType, k: usize, nw: usize, rows: usize) {
    let fast = avx2();
    // One spare leading byte: weight rows read from a file need not be aligned.
    let mut buf = vec![0u8];
    buf.extend(weights(rng, ty, k, nw));
    let w = &buf[1..];
    let x = activations(rng, k * rows);
    let got = run(fast, ty, k, w, &x);
    let want = run(Kernels::oracle(), ty, k, w, &x);
    // The VNNI variants: the same exact integer sums, so the same bits.
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for vnni in &simd_sets()[1..] {
        assert_eq!(
            bits(&run(*vnni, ty, k, w, &x)),
            bits(&got),
            "{ty} k={k} {nw}x{rows}: {} differs from avx2",
            vnni.variant
        );
    }

    // Error bound of reordered f32 sums: (sequential adds) · eps · Σ|terms|.
    let mut wf = vec![0f32; k * nw];
    // The scalar decoder wants aligned blocks; a fresh allocation is.
    let aligned = w.to_vec();
    quant::dequantize(ty, &aligned, &mut wf).unwrap();
    let mins = min_part(ty, w, k);
    let adds = if ty.vec_dot_type() == GgmlType::F32 {
        k / 8
    } else {
        k / ty.block_size()
    } + 8;
    let act_ty = ty.vec_dot_type();
    let mut xq = vec![0f32; k * rows];
    if act_ty == GgmlType::F32 {
        xq.copy_from_slice(&run_values(ty, &x));
    } else {
        let mut bytes = Vec::new();
        quant::quantize_activations(ty, &x, &mut bytes).unwrap();
        quant::dequantize(act_ty, &bytes, &mut xq).unwrap();
    }
    for i in 0..nw {
        for r in 0..rows {
            let (wr, mr, xr) = (
                &wf[i * k..(i + 1) * k],
                &mins[i * k..(i + 1) * k],
                &xq[r * k..(r + 1) * k],
            );
            let mag: f64 = (0..k)
                .map(|j| (f64::from(wr[j]).abs() + 2.0 * f64::from(mr[j]).abs()) * f64::from(xr[j]).abs())
                .sum();
            let tol = 2.0 * adds as f64 * f64::from(f32::EPSILON) * mag + 1e-30;
            let (g, o) = (got[r * nw + i], want[r * nw + i]);
            assert!(
                (f64::from(g) - f64::from(o)).abs() <= tol,
                "{ty} k={k} {nw}x{rows} at ({i},{r}): avx2 {g} oracle {o} (tolerance {tol:e}, magnitude {mag:e})"
            );
        }
    }

    // Every output must be the same whatever tile it was computed in (and, for the interleaved
    // formats, whether the batch was large enough to unpack the tiles first or not): all of them
    // on small shapes, corners and the middle on large ones.
    let all = nw * rows <= 64;
    let (pick_w, pick_r): (Vec<usize>, Vec<usize>) = if all {
        ((0..nw).collect(), (0..rows).collect())
    } else {
        (vec![0, nw / 2, nw - 1], vec![0, rows / 2, rows - 1])
    };
    for &i in &pick_w {
        let rb = k / ty.block_size() * ty.block_bytes();
        for &r in &pick_r {
            let one = run(fast, ty, k, &w[i * rb..(i + 1) * rb], &x[r * k..(r + 1) * k]);
            assert_eq!(
                one[0].to_bits(),
                got[r * nw + i].to_bits(),
                "{ty} k={k} {nw}x{rows}: output ({i},{r}) depends on the tiling"
            );
        }
    }
}

/// Float activations as the oracle rounds them.
fn run_values(ty: GgmlType, x: &[f32]) -> Vec<f32> {
    match ty {
        GgmlType::F16 => x.iter().map(|&v| f16::from_f32(v).to_f32()).collect(),
        GgmlType::BF16 => x.iter().map(|&v| bf16::from_f32(v).to_f32()).collect(),
        _ => x.to_vec(),
    }
}

#[test]
fn quantizers_match_the_scalar_ones_byte_for_byte() {
    avx2();
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    for n in [256, 512, 4096, 16384] {
        let mut x = activations(&mut rng, n);
        // An all-zero block and a negative maximum that appears twice.
        if n > 512 {
            x[256..288].fill(0.0);
            x[300] = -50.0;
            x[301] = 50.0;
            x[512..768].fill(0.0);
        }
        let mut want = Vec::new();
        quant::quantize_activations(GgmlType::Q4_0, &x, &mut want).unwrap();
        let (mut got, mut scales, mut sums) = (Vec::new(), Vec::new(), Vec::new());
        // SAFETY: `avx2()` checked the CPU.
        unsafe { super::q8::quantize_q8_0(&x, &mut got, &mut scales, &mut sums) };
        assert_eq!(got, want, "Q8_0, {n} values");
        for (i, b) in want.chunks_exact(34).enumerate() {
            assert_eq!(scales[i], f16::from_le_bytes([b[0], b[1]]).to_f32());
            assert_eq!(sums[i], b[2..].iter().map(|&q| i32::from(q as i8)).sum::<i32>());
        }

        let mut want = Vec::new();
        quant::quantize_activations(GgmlType::Q4_K, &x, &mut want).unwrap();
        let mut got = Vec::new();
        // SAFETY: as above.
        unsafe { super::q8::quantize_q8_k(&x, &mut got) };
        assert_eq!(got, want, "Q8_K, {n} values");
    }
}

#[test]
fn dot_products_match_the_oracle_on_odd_shapes() {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    for ty in simd_types() {
        let k = match ty {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 263,
            t => 2 * t.vec_dot_type().block_size().max(t.block_size()) * 2,
        };
        // Weight rows around the 8-row interleaved tile; activation rows on both sides of the
        // unpacking thresholds (8, 16 and 32 rows), around the 4-row register tile, and an
        // expert-sized batch (70: eight 8-row register tiles, then a 4 and a 2).
        for nw in [1, 3, 5, 8, 17] {
            for rows in [1, 2, 3, 4, 7, 9, 31, 33, 70] {
                check(&mut rng, ty, k, nw, rows);
            }
        }
    }
}

#[test]
fn dot_products_match_the_oracle_on_long_rows() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for ty in simd_types() {
        check(&mut rng, ty, 16384, 5, 2);
        check(&mut rng, ty, 16384, 9, 5);
        // A batch past every format's threshold for the 512-bit tiles: the outputs must keep
        // the bits of the row alone.
        check(&mut rng, ty, 4096, 17, 33);
    }
}

#[test]
fn mismatched_lengths_give_nan_not_a_panic() {
    let fast = avx2();
    let x = vec![0.5f32; 256];
    // One output of 256-value rows: whether the AVX2 set answered NaN.
    let nan = |ty: GgmlType, layout: Layout, w: &[u8], act: &Activations| {
        let mut out = [0f32; 1];
        (fast.tile)(ty, layout, 256, w, act, &mut TileOut::new(&mut out, act.rows()));
        out[0].is_nan()
    };
    let act = (fast.prepare)(GgmlType::Q4_K, &x, 256).unwrap();
    // Half a row of weights.
    assert!(nan(GgmlType::Q4_K, Layout::Rows, &[0u8; 72], &act));
    // Activations prepared for a Q8_0 type handed to a Q8_K type.
    let act = (fast.prepare)(GgmlType::Q4_0, &x, 256).unwrap();
    assert!(nan(GgmlType::Q4_K, Layout::Rows, &[0u8; 144], &act));
    // The same on an interleaved K-quant tile; a 256-value format without an interleaved
    // layout given as interleaved; a short interleaved tile.
    assert!(nan(GgmlType::Q4_K, Layout::Interleaved, &[0u8; 144 * 8], &act));
    let act_k = (fast.prepare)(GgmlType::IQ3_XXS, &x, 256).unwrap();
    assert!(nan(GgmlType::IQ3_XXS, Layout::Interleaved, &[0u8; 98 * 8], &act_k));
    assert!(nan(GgmlType::Q4_K, Layout::Interleaved, &[0u8; 144], &act_k));
    assert!(nan(GgmlType::Q4_0, Layout::Interleaved, &[0u8; 144], &act));
    // An output of two activation rows for one.
    let mut two = [0f32; 2];
    (fast.tile)(
        GgmlType::Q4_0,
        Layout::Rows,
        256,
        &[0u8; 144],
        &act,
        &mut TileOut::new(&mut two, 2),
    );
    assert!(two.iter().all(|v| v.is_nan()));
}

#[test]
fn every_kernel_set_reads_both_layouts() {
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    for ty in [GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K] {
        let (k, nw) = (3 * ty.block_size(), 11);
        let w = weights(&mut rng, ty, k, nw);
        let tiles = interleave::interleave(ty, k, &w).unwrap();
        let x = activations(&mut rng, k * 3);
        for kern in simd_sets().into_iter().chain([Kernels::portable(), Kernels::oracle()]) {
            let act = (kern.prepare)(ty, &x, k).unwrap();
            let mut rows = vec![f32::NAN; nw * 3];
            let mut inter = vec![f32::NAN; nw * 3];
            (kern.tile)(ty, Layout::Rows, k, &w, &act, &mut TileOut::new(&mut rows, act.rows()));
            (kern.tile)(
                ty,
                Layout::Interleaved,
                k,
                &tiles,
                &act,
                &mut TileOut::new(&mut inter, act.rows()),
            );
            assert!(rows.iter().all(|v| v.is_finite()), "{} {ty}", kern.variant);
            assert_eq!(
                rows.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                inter.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{} {ty}",
                kern.variant
            );
        }
    }
}

/// A matmul's tasks write their columns of the shared result in place: tiles of 16 columns (as
/// the backend hands out, and a ragged last one) give the bits of the whole-matrix tile, and
/// nothing outside their columns is touched (the rows here have two spare columns past the
/// last tile's, which must keep their sentinel). Every kernel set and both families of
/// interleaved formats (32-value, K-quant).
#[test]
fn column_tiles_write_only_their_columns() {
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    for (ty, k) in [
        (GgmlType::Q5_0, 64),
        (GgmlType::Q8_0, 64),
        (GgmlType::Q4_K, 256),
        (GgmlType::Q6_K, 512),
    ] {
        let (n, rows, stride) = (27, 3, 29);
        let w = weights(&mut rng, ty, k, n);
        let x = activations(&mut rng, k * rows);
        for kern in simd_sets().into_iter().chain([Kernels::portable(), Kernels::oracle()]) {
            let act = (kern.prepare)(ty, &x, k).unwrap();
            let interleaved = (kern.interleaves)(ty);
            let placed = if interleaved {
                interleave::interleave(ty, k, &w).unwrap()
            } else {
                w.clone()
            };
            let layout = if interleaved { Layout::Interleaved } else { Layout::Rows };
            let mut whole = vec![f32::NAN; n * rows];
            (kern.tile)(ty, layout, k, &placed, &act, &mut TileOut::new(&mut whole, rows));
            assert!(whole.iter().all(|v| v.is_finite()), "{} {ty}", kern.variant);
            let mut shared = vec![-7.0f32; stride * rows];
            let row_bytes = k / ty.block_size() * ty.block_bytes();
            for w0 in (0..n).step_by(16) {
                let nw = 16.min(n - w0);
                let bytes = if interleaved {
                    &placed[interleave::span(ty, k, w0, nw)]
                } else {
                    &placed[w0 * row_bytes..(w0 + nw) * row_bytes]
                };
                // SAFETY: `w0 + nw <= stride`, `shared` holds `rows * stride` values, and one
                // tile at a time is alive.
                let mut tile = unsafe { TileOut::columns(shared.as_mut_ptr(), rows, stride, w0, nw) };
                (kern.tile)(ty, layout, k, bytes, &act, &mut tile);
            }
            for a in 0..rows {
                let got = &shared[a * stride..(a + 1) * stride];
                let want = &whole[a * n..(a + 1) * n];
                assert_eq!(
                    got[..n].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "{} {ty} row {a}",
                    kern.variant
                );
                assert_eq!(
                    got[n..],
                    [-7.0, -7.0],
                    "{} {ty} row {a}: written past its columns",
                    kern.variant
                );
            }
        }
    }
}

/// The AVX2 SwiGLU gate and SiLU against the scalar ones (libm's `expf`): within 4 ulps wherever the
/// result is a normal number, over magnitudes from 1e-6 to 100, both signs, lengths that leave
/// a scalar tail, and NaN passed through.
#[test]
fn swiglu_matches_the_scalar_gate() {
    let kern = avx2();
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for len in [1usize, 7, 8, 9, 64, 1000, 4099] {
        let gate: Vec<f32> = (0..len)
            .map(|_| {
                let mag = 10f32.powf(rng.random_range(-6.0..2.0));
                if rng.random_bool(0.5) {
                    mag
                } else {
                    -mag
                }
            })
            .collect();
        let up: Vec<f32> = (0..len).map(|_| rng.random_range(-3.0..3.0)).collect();
        let (mut fast, mut slow) = (gate.clone(), gate.clone());
        (kern.swiglu)(&mut fast, &up);
        super::super::kernels::swiglu_scalar(&mut slow, &up);
        // SiLU alone, the same values through the AVX2 kernel and the scalar twin.
        let (mut fast_silu, mut slow_silu) = (gate.clone(), gate.clone());
        (kern.silu)(&mut fast_silu);
        super::super::kernels::silu_scalar(&mut slow_silu);
        for i in 0..len {
            for (what, f, s) in [("swiglu", fast[i], slow[i]), ("silu", fast_silu[i], slow_silu[i])] {
                let tol = if s.abs() < f32::MIN_POSITIVE * 1e4 {
                    1e-30
                } else {
                    4.0 * f32::EPSILON * s.abs()
                };
                assert!((f - s).abs() <= tol, "{what}({}) · {}: {f} vs {s}", gate[i], up[i]);
            }
        }
    }
    let mut g = vec![f32::NAN; 9];
    (kern.swiglu)(&mut g, &[1.0; 9]);
    assert!(g.iter().all(|v| v.is_nan()), "NaN must stay NaN: {g:?}");
    let mut g = vec![f32::NAN; 9];
    (kern.silu)(&mut g);
    assert!(g.iter().all(|v| v.is_nan()), "NaN must stay NaN in silu: {g:?}");
}

/// The row formats (IQ1-IQ3, TQ1_0) take three paths by batch size (groups met as unpacked, a
/// buffered super-block, and with VNNI tiles unpacked eight rows at a time), and so do the
/// interleaved K-quant tiles (in registers, buffered, 512-bit wide), here IQ4_XS's, whose
/// signed levels meet the activations as level + 128 with VNNI and signed without: every output
/// of a batch must have the bits it has alone, on every kernel set.
#[test]
fn row_formats_give_every_path_the_same_bits() {
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    use GgmlType::*;
    for ty in [IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, TQ1_0, IQ4_XS] {
        let (k, nw) = (512, 11);
        let w = weights(&mut rng, ty, k, nw);
        let x = activations(&mut rng, k * 70);
        for kern in simd_sets() {
            let alone: Vec<Vec<f32>> = (0..70).map(|r| run(kern, ty, k, &w, &x[r * k..(r + 1) * k])).collect();
            // 70: an expert-sized batch, eight 8-row register tiles then a 4 and a 2.
            for rows in [2, 4, 6, 8, 12, 70] {
                let got = run(kern, ty, k, &w, &x[..rows * k]);
                for r in 0..rows {
                    for i in 0..nw {
                        assert_eq!(
                            got[r * nw + i].to_bits(),
                            alone[r][i].to_bits(),
                            "{ty} {}: output ({i},{r}) of {rows} rows",
                            kern.variant
                        );
                    }
                }
            }
        }
    }
}

/// The grid formats' gathers and (where this CPU has AVX-512 VBMI) byte-permute builds
/// (`dot_iquant::Lookup`) give the bits of the build that loads and inserts each table entry, on
/// every ISA this CPU has, at one, three and nine rows (the one-row, fused and, with VNNI, tiled
/// paths).
#[test]
fn gathered_and_permuted_grid_entries_give_the_inserted_entries_bits() {
    use super::dot_iquant::Lookup;
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    let fast = avx2();
    let mut isas = vec![Isa::Avx2];
    isas.extend(Isa::vnni());
    use GgmlType::*;
    for ty in [IQ2_XXS, IQ3_XXS, IQ2_XS, IQ2_S, IQ3_S] {
        // Three super-blocks: the one-row kernel's pair of them, then one alone.
        let (k, nw) = (768, 5);
        let w = weights(&mut rng, ty, k, nw);
        for rows in [1, 3, 9] {
            let act = (fast.prepare)(ty, &activations(&mut rng, rows * k), k).unwrap();
            for &isa in &isas {
                let lookups = [Lookup::Inserts, Lookup::Gathers, Lookup::Permutes];
                let mut outs = [(); 3].map(|_| vec![f32::NAN; rows * nw]);
                for (&lookup, o) in lookups.iter().zip(&mut outs) {
                    // Permutes without VBMI are the inserts (`kernel` falls back).
                    let run = super::dot_iquant::kernel(ty, lookup).expect("a grid format");
                    // SAFETY: `avx2()` checked AVX2, FMA and F16C, `Isa::vnni` the VNNI ISAs;
                    // the weights are `nw` whole rows of `k`.
                    unsafe { run(k, &w, &act, &mut TileOut::new(o, rows), isa) };
                }
                for (lookup, other) in lookups[1..].iter().zip(&outs[1..]) {
                    for (i, (a, b)) in outs[0].iter().zip(other).enumerate() {
                        assert_eq!(
                            a.to_bits(),
                            b.to_bits(),
                            "{ty} {isa:?} {lookup:?}: output {i} of {rows} rows"
                        );
                    }
                }
                assert!(
                    outs[0].iter().all(|v| v.is_finite()),
                    "{ty} {isa:?}: an output was not written"
                );
                assert!(outs[0].iter().any(|&v| v != 0.0), "{ty} {isa:?}: no output");
            }
        }
    }
}
