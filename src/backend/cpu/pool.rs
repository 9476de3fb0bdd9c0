//! The CPU backend's persistent worker pool.
//!
//! Ops split their output into disjoint chunks and run one task per chunk. Every output value
//! is computed by exactly one task with the same arithmetic whatever the chunking, so results
//! never depend on the thread count. On native targets the workers are a dedicated rayon pool
//! (started once, reused by every op; rayon gives us work stealing and panic propagation
//! without hand-written unsafe scoping). On wasm, where threads need extra setup, tasks run
//! in order on the calling thread.

use super::super::readback::MaybeSend;
use super::super::BackendError;

/// A fixed set of worker threads.
pub struct Pool {
    #[cfg(not(target_arch = "wasm32"))]
    pool: rayon::ThreadPool,
    threads: usize,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("threads", &self.threads).finish()
    }
}

impl Pool {
    /// A pool of `threads` workers (0: one per available core).
    pub fn new(threads: usize) -> Result<Self, BackendError> {
        #[cfg(not(target_arch = "wasm32"))]
        {
            let threads = if threads == 0 {
                std::thread::available_parallelism().map_or(1, |n| n.get())
            } else {
                threads
            };
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(|i| format!("tinyllm-cpu-{i}"))
                .build()
                .map_err(|e| BackendError::ThreadPool(e.to_string()))?;
            Ok(Pool { pool, threads })
        }
        #[cfg(target_arch = "wasm32")]
        {
            let _ = threads;
            Ok(Pool { threads: 1 })
        }
    }

    /// Run `f` on a worker of the pool (on wasm: on the caller): the ops `f` runs then fork
    /// from inside the pool, which costs far less than entering it from outside per op.
    pub fn run<R: MaybeSend>(&self, f: impl FnOnce() -> R + MaybeSend) -> R {
        #[cfg(not(target_arch = "wasm32"))]
        {
            self.pool.install(f)
        }
        #[cfg(target_arch = "wasm32")]
        f()
    }

    /// Number of workers.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Run `f(i)` for each `i` in `0..n`, in parallel.
    pub fn for_each_index(&self, n: usize, f: impl Fn(usize) + Sync + Send) {
        #[cfg(not(target_arch = "wasm32"))]
        {
            use rayon::prelude::*;
            if n <= 1 || self.threads == 1 {
                (0..n).for_each(f);
            } else {
                self.pool.install(|| (0..n).into_par_iter().for_each(f));
            }
        }
        #[cfg(target_arch = "wasm32")]
        (0..n).for_each(f);
    }

    /// Run `f(index, chunk)` for each consecutive `chunk`-sized piece of `out` (the last may
    /// be shorter), in parallel.
    pub fn for_chunks<T: Send>(&self, out: &mut [T], chunk: usize, f: impl Fn(usize, &mut [T]) + Sync + Send) {
        let chunk = chunk.max(1);
        #[cfg(not(target_arch = "wasm32"))]
        {
            use rayon::prelude::*;
            if out.len() <= chunk || self.threads == 1 {
                out.chunks_mut(chunk).enumerate().for_each(|(i, c)| f(i, c));
            } else {
                self.pool
                    .install(|| out.par_chunks_mut(chunk).enumerate().for_each(|(i, c)| f(i, c)));
            }
        }
        #[cfg(target_arch = "wasm32")]
        out.chunks_mut(chunk).enumerate().for_each(|(i, c)| f(i, c));
    }
}
