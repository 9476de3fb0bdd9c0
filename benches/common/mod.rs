//! What the benchmarks share: random data without a dependency, and a timer.

// Each bench compiles this module on its own and uses a part of it.
#![allow(dead_code)]

use std::time::{Duration, Instant};

/// xorshift64*: enough randomness for benchmark data, no dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }

    /// `n` values uniform in [-scale, scale).
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| scale * self.unit()).collect()
    }
}

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
