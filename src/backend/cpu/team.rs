//! A team of threads that stays awake for a whole forward pass and takes each op's tasks from
//! one shared word, as llama.cpp's threads meet at a barrier per op.
//!
//! Why: rayon's workers sleep between ops (in the browser Web Workers on `Atomics.wait`,
//! natively on a futex), and waking one per op costs more than a decode step's small matmuls
//! take: tens of microseconds in the browser, and natively about 7% of a decode profile in the
//! kernel's scheduler. So [`super::pool::Pool::run`] puts its other workers on [`Team::serve`]
//! for the length of a pass: they spin on the claim word, and an op ([`Team::dispatch`])
//! publishes its tasks with one store, runs them alongside, and waits for the last. The split
//! is dynamic (each thread claims the next task index), so results do not depend on which
//! thread ran what, and a pass still completes if no helper ever joins. A helper idle for
//! [`IDLE_SPIN`] (natively) naps between looks, so that a long serial stretch of a pass, or
//! more threads than cores, does not keep a core spinning.
//!
//! A task that panics is counted done; its op's dispatcher waits for the rest, then resumes the
//! panic (the tasks' job lives on its stack, so it may not unwind while any task runs).
//!
//! The claim word packs the op's epoch, its task count and the next task index, so a helper
//! that saw an older op can never claim a task of a newer one (its compare-exchange fails), and
//! a claimed task's job cannot change under it: the next op is published only once every
//! claimed task has finished.

use std::any::Any;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::backend::sync::lock;

/// Bits of the claim word for the next index and the task count.
const INDEX_BITS: u32 = 20;
/// The most tasks one op can have (larger ops run in several dispatches).
pub const MAX_TASKS: usize = (1 << INDEX_BITS) - 1;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;

/// An op's work: `f(i)` for each task index.
struct Job<'a> {
    f: &'a (dyn Fn(usize) + Sync),
}

/// See the module doc.
pub struct Team {
    /// `epoch << 40 | tasks << 20 | next`.
    claim: AtomicU64,
    /// Tasks of the current op finished.
    done: AtomicUsize,
    /// The current op's job (on its dispatcher's stack while any of its tasks runs).
    job: AtomicPtr<Job<'static>>,
    /// Helpers return from [`Team::serve`].
    quit: AtomicBool,
    /// Helpers are serving: [`Team::dispatch`] may hand them tasks.
    open: AtomicBool,
    /// An op is being dispatched (a second dispatcher runs its tasks alone).
    busy: AtomicBool,
    /// Threads of the team, the dispatcher included (sets the claims' grain).
    threads: AtomicUsize,
    /// The first panic of a task of the current op, resumed by its dispatcher.
    panicked: Mutex<Option<Box<dyn Any + Send>>>,
}

/// Guided claims: each takes `left / (threads · CLAIM_SHARE)` of the tasks still unclaimed (at
/// least one), so a decode step's many small tasks (a microsecond or two of weights each) do
/// not each pay a contended compare-exchange, while the claims shrink as the op runs out and
/// its threads finish within about one task of each other. With fixed claims of an eighth of
/// the op, the 262k-row output matmul of a decode step left one of two threads idle for half a
/// claim on average: it scaled 1.74x where the other matmuls scaled 1.9x.
const CLAIM_SHARE: usize = 2;

thread_local! {
    /// This thread is running a task: an op inside a task runs its tasks in place.
    static IN_TASK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn unpack(c: u64) -> (u64, usize, usize) {
    (
        c >> (2 * INDEX_BITS),
        ((c >> INDEX_BITS) & INDEX_MASK) as usize,
        (c & INDEX_MASK) as usize,
    )
}

impl Default for Team {
    fn default() -> Self {
        Team {
            claim: AtomicU64::new(0),
            done: AtomicUsize::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            quit: AtomicBool::new(true),
            open: AtomicBool::new(false),
            busy: AtomicBool::new(false),
            threads: AtomicUsize::new(1),
            panicked: Mutex::new(None),
        }
    }
}

impl Team {
    /// Let helpers serve (before they are started): `threads` in all, the dispatcher's
    /// included.
    pub fn open(&self, threads: usize) {
        self.threads.store(threads.max(1), Ordering::Release);
        self.quit.store(false, Ordering::Release);
        self.open.store(true, Ordering::Release);
    }

    /// Send the helpers home: [`Team::serve`] returns.
    pub fn close(&self) {
        self.open.store(false, Ordering::Release);
        self.quit.store(true, Ordering::Release);
    }

    /// Whether helpers are serving.
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// A helper's loop: take tasks of each op as it is published, until [`Team::close`].
    pub fn serve(&self) {
        let mut idle = Idle::default();
        while !self.quit.load(Ordering::Acquire) {
            if self.work() {
                idle = Idle::default();
            } else {
                idle.wait();
            }
        }
    }

    /// Claim and run tasks of the current op until none is left; whether any was run.
    fn work(&self) -> bool {
        let mut ran = false;
        let mut c = self.claim.load(Ordering::Acquire);
        loop {
            let (_, tasks, next) = unpack(c);
            if next >= tasks {
                return ran;
            }
            let grain = (tasks - next)
                .div_ceil(self.threads.load(Ordering::Relaxed) * CLAIM_SHARE)
                .max(1);
            let end = (next + grain).min(tasks);
            match self
                .claim
                .compare_exchange_weak(c, c + (end - next) as u64, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    // SAFETY: the claim succeeded in the op's epoch, so its job was published
                    // before, and the next op is published only after these tasks are counted
                    // done: the job lives until then.
                    let job = unsafe { &*self.job.load(Ordering::Acquire) };
                    IN_TASK.with(|t| t.set(true));
                    let ran_all = panic::catch_unwind(AssertUnwindSafe(|| (next..end).for_each(job.f)));
                    IN_TASK.with(|t| t.set(false));
                    if let Err(payload) = ran_all {
                        lock(&self.panicked).get_or_insert(payload);
                    }
                    self.done.fetch_add(end - next, Ordering::Release);
                    ran = true;
                    c = self.claim.load(Ordering::Acquire);
                }
                Err(now) => c = now,
            }
        }
    }

    /// Run `f(i)` for every `i` in `0..n`, on this thread and the serving helpers; returns
    /// once all have run. Inside a task, or while another op is dispatched, or when no helper
    /// serves, the tasks run here in order.
    pub fn dispatch(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        let nested = IN_TASK.with(|t| t.get());
        if n <= 1 || nested || !self.is_open() || self.busy.swap(true, Ordering::Acquire) {
            (0..n).for_each(f);
            return;
        }
        let mut start = 0;
        while start < n {
            let count = (n - start).min(MAX_TASKS);
            let g = move |i: usize| f(start + i);
            let job = Job { f: &g };
            // SAFETY (of the lifetime): the pointer is read only by tasks of this op, which
            // all finish before this function returns (the wait below).
            let ptr = &job as *const Job<'_> as *mut Job<'static>;
            self.job.store(ptr, Ordering::Release);
            self.done.store(0, Ordering::Release);
            let (epoch, _, _) = unpack(self.claim.load(Ordering::Acquire));
            // The epoch wraps after 2^24 ops; a helper would have to stall that long between
            // reading the word and claiming from it to confuse two ops.
            let epoch = (epoch + 1) & ((1 << (64 - 2 * INDEX_BITS)) - 1);
            let word = (epoch << (2 * INDEX_BITS)) | ((count as u64) << INDEX_BITS);
            self.claim.store(word, Ordering::Release);
            self.work();
            // A helper still running a claimed task may have lost its core (more threads than
            // cores): past a short spin, give this one up between looks.
            let mut idle = Idle::default();
            while self.done.load(Ordering::Acquire) < count {
                idle.wait_yielding();
            }
            start += count;
            if let Some(payload) = lock(&self.panicked).take() {
                self.busy.store(false, Ordering::Release);
                panic::resume_unwind(payload);
            }
        }
        self.busy.store(false, Ordering::Release);
    }
}

/// How long a helper spins without work before it naps between looks at the claim word:
/// longer than the serial stretches between a pass's ops (microseconds), short against a
/// scheduler's time slice.
#[cfg(not(target_arch = "wasm32"))]
const IDLE_SPIN: std::time::Duration = std::time::Duration::from_micros(200);

/// The nap of a helper idle for longer than [`IDLE_SPIN`]: an op published meanwhile starts on
/// its dispatcher alone, for at most this long.
#[cfg(not(target_arch = "wasm32"))]
const IDLE_NAP: std::time::Duration = std::time::Duration::from_micros(50);

/// A wait on the claim or done word: spinning, then natively, once it has lasted
/// [`IDLE_SPIN`], napping ([`Idle::wait`], a helper) or yielding the core ([`Idle::wait_yielding`],
/// a dispatcher). In the browser both only spin (a Web Worker's pass is short and its own).
#[derive(Default)]
struct Idle {
    spins: u32,
    #[cfg(not(target_arch = "wasm32"))]
    since: Option<std::time::Instant>,
}

impl Idle {
    /// Spins between reads of the clock.
    #[cfg(not(target_arch = "wasm32"))]
    const CLOCK_EVERY: u32 = 256;

    /// Whether the wait has lasted [`IDLE_SPIN`] (checked every [`Idle::CLOCK_EVERY`] spins).
    fn long(&mut self) -> bool {
        std::hint::spin_loop();
        self.spins = self.spins.wrapping_add(1);
        #[cfg(not(target_arch = "wasm32"))]
        if self.spins.is_multiple_of(Self::CLOCK_EVERY) {
            let since = *self.since.get_or_insert_with(std::time::Instant::now);
            return since.elapsed() > IDLE_SPIN;
        }
        false
    }

    fn wait(&mut self) {
        #[cfg(not(target_arch = "wasm32"))]
        if self.long() {
            std::thread::sleep(IDLE_NAP);
        }
        #[cfg(target_arch = "wasm32")]
        self.long();
    }

    fn wait_yielding(&mut self) {
        if self.long() {
            std::thread::yield_now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    /// Many ops of varied sizes on a team of four: every task runs exactly once per op, and an
    /// op's writes are all visible when dispatch returns.
    #[test]
    fn every_task_runs_once_per_op() {
        let team = Team::default();
        team.open(4);
        let counts: Vec<AtomicU32> = (0..3000).map(|_| AtomicU32::new(0)).collect();
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| team.serve());
            }
            for op in 0..2000usize {
                let n = (op * 7919) % 3000;
                team.dispatch(n, &|i| {
                    counts[i].fetch_add(1, Ordering::Relaxed);
                });
                for (i, c) in counts.iter().enumerate() {
                    let want = u32::from(i < n);
                    assert_eq!(c.swap(0, Ordering::Relaxed), want, "op {op} task {i} of {n}");
                }
            }
            team.close();
        });
    }

    /// A task that panics (on whichever thread claimed it: the first, a middle and the last
    /// task) makes its op's dispatch panic once every other claimed task has finished (no
    /// hang, no job read after its op), and the team serves the next op.
    #[test]
    fn a_panicking_task_panics_its_dispatch() {
        let team = Team::default();
        team.open(3);
        let ran = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| team.serve());
            }
            for bad in [0, 57, 299] {
                ran.store(0, Ordering::Relaxed);
                let got = panic::catch_unwind(AssertUnwindSafe(|| {
                    team.dispatch(300, &|i| {
                        assert_ne!(i, bad, "task {i} fails");
                        ran.fetch_add(1, Ordering::Relaxed);
                    })
                }));
                let msg = got.expect_err("the dispatch panics");
                let msg = msg.downcast_ref::<String>().expect("a formatted message");
                assert!(msg.contains(&format!("task {bad} fails")), "{msg}");
                // Claims of several tasks stop at the panic: at most the rest of its claim
                // is skipped.
                assert!(ran.load(Ordering::Relaxed) < 300);
                let sum = AtomicUsize::new(0);
                team.dispatch(100, &|i| {
                    sum.fetch_add(i, Ordering::Relaxed);
                });
                assert_eq!(sum.load(Ordering::Relaxed), 4950);
            }
            team.close();
        });
    }

    /// Without helpers (closed, or none joined) and nested inside a task, tasks still all run.
    #[test]
    fn runs_alone_and_nested() {
        let team = Team::default();
        let sum = AtomicUsize::new(0);
        team.dispatch(100, &|i| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 4950);
        team.open(2);
        sum.store(0, Ordering::Relaxed);
        team.dispatch(10, &|_| {
            team.dispatch(10, &|j| {
                sum.fetch_add(j, Ordering::Relaxed);
            })
        });
        assert_eq!(sum.load(Ordering::Relaxed), 450);
        team.close();
    }
}
