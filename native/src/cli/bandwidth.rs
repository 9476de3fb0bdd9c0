//! The physical bound of decoding: how fast this machine reads memory, and how many bytes a
//! decoded token reads. Decode of a small model streams every weight matrix once per token, so
//! `read bandwidth / bytes per token` is the most tokens per second any engine can decode here;
//! `bench --bandwidth` reports a measured rate as a fraction of it, which (unlike a ratio to
//! another engine) says how much is left.

use tinyllm::gguf::GgufFile;

/// Bytes of the buffer read: well beyond any last-level cache (this reading matters on
/// machines with hundreds of MiB of L3).
const BUFFER_BYTES: usize = 2 << 30;
/// Passes over the buffer; the best one counts (other load only ever slows a pass down, and on
/// a shared virtual machine passes differ by a fifth).
const PASSES: usize = 8;

/// The machine's read bandwidth in bytes per second with `threads` threads, each summing its
/// own part of a buffer of [`BUFFER_BYTES`] with the widest loads the CPU has (a bound must not
/// be lower than what a kernel can reach: on a Xeon with AVX-512, 16-byte loads read about a
/// fifth slower than 64-byte ones). The sum is printed nowhere but keeps the reads.
pub fn read_bandwidth(threads: usize) -> anyhow::Result<f64> {
    let words = BUFFER_BYTES / 8;
    let mut buf: Vec<u64> = Vec::new();
    buf.try_reserve_exact(words)
        .map_err(|_| anyhow::anyhow!("cannot allocate {} MiB to measure bandwidth", BUFFER_BYTES >> 20))?;
    // Written so every page is backed (a fresh allocation reads the shared zero page).
    buf.extend((0..words as u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)));
    let threads = threads.max(1);
    let part = words.div_ceil(threads);
    let sum = wide_sum();
    let mut best = 0f64;
    let mut keep = 0u64;
    for _ in 0..PASSES {
        let t = std::time::Instant::now();
        let sums: Vec<u64> = std::thread::scope(|s| {
            let handles: Vec<_> = buf.chunks(part).map(|c| s.spawn(move || sum(c))).collect();
            handles.into_iter().map(|h| h.join().unwrap_or(0)).collect()
        });
        let dt = t.elapsed().as_secs_f64();
        keep = keep.wrapping_add(sums.iter().fold(0, |a, &x| a.wrapping_add(x)));
        best = best.max(BUFFER_BYTES as f64 / dt);
    }
    std::hint::black_box(keep);
    Ok(best)
}

/// The wrapping sum of a slice of words, with the widest loads this CPU runs.
pub fn wide_sum() -> fn(&[u64]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            return wide::sum_avx512;
        }
        if std::is_x86_feature_detected!("avx2") {
            return wide::sum_avx2;
        }
    }
    portable_sum
}

/// The slow twin of [`wide_sum`]'s kernels.
pub fn portable_sum(words: &[u64]) -> u64 {
    words.iter().fold(0u64, |a, &x| a.wrapping_add(x))
}

#[cfg(target_arch = "x86_64")]
mod wide {
    use std::arch::x86_64::*;

    /// Four independent 64-byte accumulators, so loads never wait on an add.
    pub fn sum_avx512(words: &[u64]) -> u64 {
        if !std::is_x86_feature_detected!("avx512f") {
            return super::portable_sum(words);
        }
        // SAFETY: the CPU reports AVX-512F.
        unsafe { sum_avx512_inner(words) }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn sum_avx512_inner(words: &[u64]) -> u64 {
        let blocks = words.chunks_exact(32);
        let tail = super::portable_sum(blocks.remainder());
        let mut acc = [_mm512_setzero_si512(); 4];
        for b in blocks {
            for (j, a) in acc.iter_mut().enumerate() {
                // SAFETY: `b` holds 32 words, so each of the four 8-word loads is in bounds.
                let v = unsafe { _mm512_loadu_si512(b.as_ptr().add(8 * j).cast()) };
                *a = _mm512_add_epi64(*a, v);
            }
        }
        let all = _mm512_add_epi64(_mm512_add_epi64(acc[0], acc[1]), _mm512_add_epi64(acc[2], acc[3]));
        (_mm512_reduce_add_epi64(all) as u64).wrapping_add(tail)
    }

    /// Four independent 32-byte accumulators.
    pub fn sum_avx2(words: &[u64]) -> u64 {
        if !std::is_x86_feature_detected!("avx2") {
            return super::portable_sum(words);
        }
        // SAFETY: the CPU reports AVX2.
        unsafe { sum_avx2_inner(words) }
    }

    #[target_feature(enable = "avx2")]
    unsafe fn sum_avx2_inner(words: &[u64]) -> u64 {
        let blocks = words.chunks_exact(16);
        let tail = super::portable_sum(blocks.remainder());
        let mut acc = [_mm256_setzero_si256(); 4];
        for b in blocks {
            for (j, a) in acc.iter_mut().enumerate() {
                // SAFETY: `b` holds 16 words, so each of the four 4-word loads is in bounds.
                let v = unsafe { _mm256_loadu_si256(b.as_ptr().add(4 * j).cast()) };
                *a = _mm256_add_epi64(*a, v);
            }
        }
        let all = _mm256_add_epi64(_mm256_add_epi64(acc[0], acc[1]), _mm256_add_epi64(acc[2], acc[3]));
        let mut lanes = [0u64; 4];
        // SAFETY: `lanes` is 32 bytes.
        unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), all) };
        lanes.iter().fold(tail, |s, &x| s.wrapping_add(x))
    }
}

/// Bytes of weights one decode step reads: every matrix once (the embedding table only when
/// the output head is tied to it: a lookup reads one row), norms and biases aside; of a stack
/// of routed experts (`*_exps`), only the `expert_used_count` of `expert_count` a token chooses.
pub fn weight_bytes_per_token(file: &GgufFile) -> u64 {
    let tied = file.tensor_info("output.weight").is_none();
    let key = |k: &str| {
        let arch = file.architecture().unwrap_or_default();
        file.opt(&format!("{arch}.{k}"), GgufFile::get_u32).ok().flatten()
    };
    let (used, experts) = (key("expert_used_count"), key("expert_count"));
    file.tensors()
        .iter()
        .filter(|t| t.shape.len() >= 2 && (tied || t.name != "token_embd.weight"))
        .map(|t| {
            let n: u64 = t.shape.iter().product();
            let bytes = n / t.ty.block_size() as u64 * t.ty.block_bytes() as u64;
            match (used, experts) {
                (Some(u), Some(e)) if t.name.contains("_exps.") && e > 0 => bytes * u64::from(u) / u64::from(e),
                _ => bytes,
            }
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wide sums equal the portable one on lengths around their block sizes.
    #[test]
    fn wide_sums_match_the_portable_sum() {
        let words: Vec<u64> = (0..1000u64)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (i << 61))
            .collect();
        for n in [0, 1, 15, 16, 17, 31, 32, 33, 100, 1000] {
            let w = &words[..n];
            assert_eq!(wide_sum()(w), portable_sum(w), "{n} words");
            #[cfg(target_arch = "x86_64")]
            {
                assert_eq!(wide::sum_avx2(w), portable_sum(w), "avx2, {n} words");
                assert_eq!(wide::sum_avx512(w), portable_sum(w), "avx512, {n} words");
            }
        }
    }
}
