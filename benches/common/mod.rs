//! What the benchmarks share: the tests' random numbers, and a timer.

// Each bench compiles this module on its own and uses a part of it.
#![allow(dead_code)]

use std::time::{Duration, Instant};

/// The tests' xorshift64* (`tests/common/rng.rs`): enough randomness for benchmark data, no
/// dependency, one generator for both.
#[path = "../../tests/common/rng.rs"]
mod rng;
pub use rng::Rng;

/// Seconds per call of `f`, best of three runs of at least `at_least` each.
pub fn time(at_least: Duration, mut f: impl FnMut()) -> f64 {
    f();
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let (start, mut calls) = (Instant::now(), 0u32);
        while start.elapsed() < at_least || calls == 0 {
            f();
            calls += 1;
        }
        best = best.min(start.elapsed().as_secs_f64() / f64::from(calls));
    }
    best
}
