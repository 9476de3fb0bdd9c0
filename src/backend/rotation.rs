//! The Walsh-Hadamard rotation of heads that go into a quantized KV cache
//! ([`Backend::hadamard`](crate::backend::interface::Backend::hadamard)), and the rule of which heads rotate.
//!
//! Why: a Q8_0 block's one scale is set by its largest value, so a head with an outlier
//! loses the precision of all its other values. llama.cpp rotates, before a quantized cache,
//! K and Q by one orthonormal Hadamard matrix (q·k is unchanged, the outliers spread over the
//! block) and V by another, rotating the attention output back (the matrix is its own
//! inverse); `LLAMA_ATTN_ROT_DISABLE` turns it off there. Measured on the qwen3 F16 fixture
//! with a q8_0 cache, our attention without the rotation reproduces llama.cpp's run with it
//! disabled within 5e-4, and both stand 1e-2 from its default run. So the q8_0 cache rotates
//! as llama.cpp's does, and its goldens are llama.cpp's default q8_0 runs.
//!
//! The rule (`llama-kv-cache.cpp`, `llama-graph.cpp`): heads of a quantized cache whose width
//! is a multiple of 64 rotate; K and Q in groups of the largest power of two from 64 up that
//! divides the head width, V in groups of 64. MLA's latent cache (V read from K) does not
//! rotate. The matrix is Sylvester's, `H[i][j] = (-1)^popcount(i & j) / sqrt(n)`, applied
//! here as the fast transform: `log2(n)` butterfly stages, then the scale.

use crate::backend::error::BackendError;
use crate::backend::kv::KvType;

/// The largest group a backend rotates (the widest head the attention kernels take, 576,
/// rotates in groups of 64; 512 is the widest power of two below it).
pub const MAX_GROUP: usize = 512;

/// How the heads of one attention layer rotate before a cache: the group sizes of K (and Q)
/// and of V (and the output), `None` where they do not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KvRotation {
    pub k: Option<usize>,
    pub v: Option<usize>,
}

impl KvRotation {
    /// llama.cpp's rule for a cache of format `kv` holding heads of `head_dim_k` (K) and
    /// `head_dim_v` (V) values; `v_in_k`: V is read from the K cache (MLA), which never rotates.
    pub fn for_cache(kv: KvType, head_dim_k: usize, head_dim_v: usize, v_in_k: bool) -> Self {
        if kv == KvType::F16 || v_in_k {
            return Self::default();
        }
        let k = head_dim_k.is_multiple_of(64).then(|| {
            let mut n = 64;
            while head_dim_k.is_multiple_of(2 * n) && 2 * n <= MAX_GROUP {
                n *= 2;
            }
            n
        });
        let v = head_dim_v.is_multiple_of(64).then_some(64);
        Self { k, v }
    }
}

/// The argument check every backend runs: `groups` groups of `n` values, `n` a power of two
/// from 2 to [`MAX_GROUP`], within a buffer of `len` values.
pub fn check(len: usize, groups: usize, n: usize) -> Result<(), BackendError> {
    if !n.is_power_of_two() || !(2..=MAX_GROUP).contains(&n) {
        return Err(BackendError::Shape {
            op: "hadamard",
            problem: format!("groups of {n} values (a power of two from 2 to {MAX_GROUP} rotates)"),
        });
    }
    let need = groups.checked_mul(n).ok_or_else(|| BackendError::Shape {
        op: "hadamard",
        problem: format!("{groups} groups of {n} values overflow"),
    })?;
    super::checks::need("hadamard", "x", len, need)
}

/// The scale of the orthonormal matrix of order `n`, `1 / sqrt(n)` in f32 (the GPU kernels
/// take it from here, so every backend multiplies by the same number).
pub fn scale(n: usize) -> f32 {
    1.0 / (n as f32).sqrt()
}

/// Rotates `x` (a whole number of groups of `n` values) in place: per group, the butterflies
/// `(a, b) -> (a + b, a - b)` for spans 1, 2, .. n/2, then times [`scale`]. The WGSL kernel
/// runs the same butterflies in the same order, so both give the same bits.
pub fn hadamard_groups(x: &mut [f32], n: usize) {
    let s = scale(n);
    for g in x.chunks_exact_mut(n) {
        let mut h = 1;
        while h < n {
            for i in (0..n).step_by(2 * h) {
                for j in i..i + h {
                    let (a, b) = (g[j], g[j + h]);
                    g[j] = a + b;
                    g[j + h] = a - b;
                }
            }
            h *= 2;
        }
        g.iter_mut().for_each(|v| *v *= s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sylvester's matrix entry by entry, in f64.
    fn by_matrix(x: &[f64]) -> Vec<f64> {
        let n = x.len();
        (0..n)
            .map(|i| {
                let s: f64 = (0..n)
                    .map(|j| if (i & j).count_ones() % 2 == 0 { x[j] } else { -x[j] })
                    .sum();
                s / (n as f64).sqrt()
            })
            .collect()
    }

    #[test]
    fn the_fast_transform_is_sylvesters_matrix_and_its_own_inverse() {
        let mut seed = 7u64;
        for n in [2, 4, 64, 128, 256, 512] {
            let x: Vec<f32> = (0..3 * n)
                .map(|_| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0
                })
                .collect();
            let mut y = x.clone();
            hadamard_groups(&mut y, n);
            for (g, (xs, ys)) in x.chunks(n).zip(y.chunks(n)).enumerate() {
                let want = by_matrix(&xs.iter().map(|&v| f64::from(v)).collect::<Vec<_>>());
                for (i, (&got, want)) in ys.iter().zip(want).enumerate() {
                    assert!(
                        (f64::from(got) - want).abs() < 1e-5,
                        "n {n} group {g} [{i}]: {got} vs {want}"
                    );
                }
            }
            hadamard_groups(&mut y, n);
            for (a, b) in x.iter().zip(&y) {
                assert!((a - b).abs() < 1e-5, "n {n}: H(H x) = {b}, x = {a}");
            }
        }
    }

    #[test]
    fn llama_cpp_rule() {
        let r = |kv, k, v, mla| KvRotation::for_cache(kv, k, v, mla);
        assert_eq!(r(KvType::F16, 128, 128, false), KvRotation::default());
        assert_eq!(
            r(KvType::Q8_0, 128, 128, false),
            KvRotation {
                k: Some(128),
                v: Some(64)
            }
        );
        assert_eq!(
            r(KvType::Q8_0, 64, 64, false),
            KvRotation {
                k: Some(64),
                v: Some(64)
            }
        );
        assert_eq!(
            r(KvType::Q8_0, 256, 256, false),
            KvRotation {
                k: Some(256),
                v: Some(64)
            }
        );
        assert_eq!(
            r(KvType::Q8_0, 192, 128, false),
            KvRotation {
                k: Some(64),
                v: Some(64)
            }
        );
        assert_eq!(r(KvType::Q8_0, 96, 32, false), KvRotation { k: None, v: None });
        assert_eq!(r(KvType::Q8_0, 576, 512, true), KvRotation::default());
        assert!(check(128, 2, 64).is_ok());
        assert!(check(127, 2, 64).unwrap_err().to_string().contains("127"));
        assert!(check(1 << 20, 1, 96).unwrap_err().to_string().contains("96"));
        assert!(check(1 << 20, 1, 1024).is_err());
        assert!(check(1 << 20, usize::MAX, 64).is_err());
    }
}
