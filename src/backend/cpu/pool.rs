//! The CPU backend's persistent worker pool.
//!
//! Ops split their output into disjoint chunks and run one task per chunk. Every output value
//! is computed by exactly one task with the same arithmetic whatever the chunking, so results
//! never depend on the thread count. The workers are rayon's (work stealing and panic
//! propagation without hand-written unsafe scoping): natively a dedicated pool started once;
//! in wasm's threaded build (shared memory, `+atomics`) the global pool whose Web Workers the
//! page started (`initThreadPool`, wasm-bindgen-rayon); in the single-threaded wasm build tasks
//! run in order on the calling thread.
//!
//! A pass ([`Pool::run`]) keeps the other workers awake on a [`super::team::Team`] and every
//! op of the pass hands its tasks over through it: waking a sleeping worker per op cost more
//! than a decode step's small ops take (a Web Worker in the browser; natively a rayon wake-up,
//! whose futex and scheduler calls were about 7% of a decode profile, and whose latency left
//! the second core idle at the start of every op).

use super::super::readback::MaybeSend;
use crate::backend::error::BackendError;

/// Whether this build runs tasks on rayon workers.
#[cfg(any(not(target_arch = "wasm32"), target_feature = "atomics"))]
macro_rules! threaded {
    ($($t:tt)*) => { $($t)* };
}
#[cfg(all(target_arch = "wasm32", not(target_feature = "atomics")))]
macro_rules! threaded {
    ($($t:tt)*) => {};
}

/// A fixed set of worker threads.
pub struct Pool {
    /// The dedicated pool (native); `None`: rayon's global pool (wasm's threaded build).
    #[cfg(any(not(target_arch = "wasm32"), target_feature = "atomics"))]
    pool: Option<rayon::ThreadPool>,
    /// The workers of a pass.
    #[cfg(any(not(target_arch = "wasm32"), target_feature = "atomics"))]
    team: super::team::Team,
    threads: usize,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("threads", &self.threads).finish()
    }
}

impl Pool {
    /// A pool of `threads` workers (0: one per available core). In wasm's threaded build the
    /// workers are the page's: `threads` is ignored.
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
            Ok(Pool {
                pool: Some(pool),
                team: super::team::Team::default(),
                threads,
            })
        }
        #[cfg(all(target_arch = "wasm32", target_feature = "atomics"))]
        {
            let _ = threads;
            Ok(Pool {
                pool: None,
                team: super::team::Team::default(),
                threads: rayon::current_num_threads(),
            })
        }
        #[cfg(all(target_arch = "wasm32", not(target_feature = "atomics")))]
        {
            let _ = threads;
            Ok(Pool { threads: 1 })
        }
    }

    /// Run `f` on a worker of the pool (single-threaded wasm: on the caller): the ops `f` runs
    /// then fork from inside the pool, which costs far less than entering it from outside per
    /// op.
    pub fn run<R: MaybeSend>(&self, f: impl FnOnce() -> R + MaybeSend) -> R {
        // Begun inside, on the thread that runs the pass.
        let f = move || {
            let _pass = super::profile::Pass::begin();
            f()
        };
        threaded! {
            // A pass already holding the team (another caller's, on this pool) runs its ops
            // through rayon.
            let teamed = self.threads > 1 && !self.team.is_open();
            return match &self.pool {
                Some(p) if teamed => p.install(|| self.with_team(f)),
                Some(p) => p.install(f),
                None if teamed => self.with_team(f),
                None if self.threads > 1 => rayon::scope(|_| f()),
                None => f(),
            };
        }
        #[allow(unreachable_code)]
        f()
    }

    /// `f` on this thread, the pool's other workers serving the team until it returns.
    #[cfg(any(not(target_arch = "wasm32"), target_feature = "atomics"))]
    fn with_team<R: MaybeSend>(&self, f: impl FnOnce() -> R + MaybeSend) -> R {
        rayon::scope(|s| {
            /// Closes the team however the pass ends, so the helpers return.
            struct Close<'a>(&'a super::team::Team);
            impl Drop for Close<'_> {
                fn drop(&mut self) {
                    self.0.close();
                }
            }
            self.team.open(self.threads);
            let _close = Close(&self.team);
            for _ in 1..self.threads {
                s.spawn(|_| self.team.serve());
            }
            f()
        })
    }

    /// [`Pool::run`] with every op handed to rayon's workers as before the team: the baseline
    /// of the browser bench's hand-off measurement.
    pub fn run_without_team<R: MaybeSend>(&self, f: impl FnOnce() -> R + MaybeSend) -> R {
        let f = move || {
            let _pass = super::profile::Pass::begin();
            f()
        };
        threaded! {
            if self.threads > 1 {
                return match &self.pool {
                    Some(p) => p.install(f),
                    None => rayon::scope(|_| f()),
                };
            }
        }
        #[allow(unreachable_code)]
        f()
    }

    /// Number of workers.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Run `f(i)` for each `i` in `0..n`, in parallel.
    #[track_caller]
    pub fn for_each_index(&self, n: usize, f: impl Fn(usize) + Sync + Send) {
        let _op = super::profile::Op::begin();
        #[cfg(any(not(target_arch = "wasm32"), target_feature = "atomics"))]
        if self.team.is_open() {
            return self.team.dispatch(n, &f);
        }
        threaded! {
            use rayon::prelude::*;
            if n > 1 && self.threads > 1 {
                match &self.pool {
                    Some(p) => p.install(|| (0..n).into_par_iter().for_each(f)),
                    None => (0..n).into_par_iter().for_each(f),
                }
                return;
            }
        }
        (0..n).for_each(f);
    }

    /// Run `f(index, chunk)` for each consecutive `chunk`-sized piece of `out` (the last may
    /// be shorter), in parallel.
    #[track_caller]
    pub fn for_chunks<T: Send>(&self, out: &mut [T], chunk: usize, f: impl Fn(usize, &mut [T]) + Sync + Send) {
        let _op = super::profile::Op::begin();
        let chunk = chunk.max(1);
        #[cfg(any(not(target_arch = "wasm32"), target_feature = "atomics"))]
        if self.team.is_open() {
            /// The output's start, shared by the tasks (each takes its own chunk).
            struct Base<T>(*mut T);
            // SAFETY: the tasks write disjoint chunks, as `par_chunks_mut` would hand out.
            unsafe impl<T: Send> Sync for Base<T> {}
            let (len, base) = (out.len(), Base(out.as_mut_ptr()));
            let base = &base;
            return self.team.dispatch(len.div_ceil(chunk), &|i| {
                let start = i * chunk;
                // SAFETY: chunk `i` is `start..min(start + chunk, len)` of `out`, disjoint from
                // every other task's, and `out` is borrowed mutably until dispatch returns.
                let c = unsafe { std::slice::from_raw_parts_mut(base.0.add(start), chunk.min(len - start)) };
                f(i, c)
            });
        }
        threaded! {
            use rayon::prelude::*;
            if out.len() > chunk && self.threads > 1 {
                let mut run = || out.par_chunks_mut(chunk).enumerate().for_each(|(i, c)| f(i, c));
                match &self.pool {
                    Some(p) => p.install(run),
                    None => run(),
                }
                return;
            }
        }
        out.chunks_mut(chunk).enumerate().for_each(|(i, c)| f(i, c));
    }
}
