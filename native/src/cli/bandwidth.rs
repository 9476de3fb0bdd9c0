//! The physical bound of decoding: how fast this machine reads memory, and how many bytes a
//! decoded token reads. Decode of a small model streams every weight matrix once per token, so
//! `read bandwidth / bytes per token` is the most tokens per second any engine can decode here;
//! `bench --bandwidth` reports a measured rate as a fraction of it, which (unlike a ratio to
//! another engine) says how much is left.

use tinyllm::gguf::GgufFile;

/// Bytes of the buffer read: well beyond any last-level cache (this reading matters on
/// machines with hundreds of MiB of L3).
const BUFFER_BYTES: usize = 2 << 30;
/// Passes over the buffer; the best one counts (other load only ever slows a pass down).
const PASSES: usize = 4;

/// The machine's read bandwidth in bytes per second with `threads` threads, each summing its
/// own part of a buffer of [`BUFFER_BYTES`] (the sum is printed nowhere but keeps the reads).
pub fn read_bandwidth(threads: usize) -> anyhow::Result<f64> {
    let words = BUFFER_BYTES / 8;
    let mut buf: Vec<u64> = Vec::new();
    buf.try_reserve_exact(words)
        .map_err(|_| anyhow::anyhow!("cannot allocate {} MiB to measure bandwidth", BUFFER_BYTES >> 20))?;
    // Written so every page is backed (a fresh allocation reads the shared zero page).
    buf.extend((0..words as u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)));
    let threads = threads.max(1);
    let part = words.div_ceil(threads);
    let mut best = 0f64;
    let mut keep = 0u64;
    for _ in 0..PASSES {
        let t = std::time::Instant::now();
        let sums: Vec<u64> = std::thread::scope(|s| {
            let handles: Vec<_> = buf
                .chunks(part)
                .map(|c| s.spawn(move || c.iter().fold(0u64, |a, &x| a.wrapping_add(x))))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or(0)).collect()
        });
        let dt = t.elapsed().as_secs_f64();
        keep = keep.wrapping_add(sums.iter().fold(0, |a, &x| a.wrapping_add(x)));
        best = best.max(BUFFER_BYTES as f64 / dt);
    }
    std::hint::black_box(keep);
    Ok(best)
}

/// Bytes of weights one decode step reads: every matrix once (the embedding table only when
/// the output head is tied to it: a lookup reads one row), norms and biases aside.
pub fn weight_bytes_per_token(file: &GgufFile) -> u64 {
    let tied = file.tensor_info("output.weight").is_none();
    file.tensors()
        .iter()
        .filter(|t| t.shape.len() >= 2 && (tied || t.name != "token_embd.weight"))
        .map(|t| {
            let n: u64 = t.shape.iter().product();
            n / t.ty.block_size() as u64 * t.ty.block_bytes() as u64
        })
        .sum()
}
