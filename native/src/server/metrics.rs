//! Counters for `GET /metrics` (Prometheus text format), updated by the engine thread and the
//! handlers with relaxed atomics: they are statistics, not synchronization.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct Metrics {
    pub requests: AtomicU64,
    pub requests_cancelled: AtomicU64,
    pub requests_rejected: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub cached_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    pub prefill_us: AtomicU64,
    pub decode_steps: AtomicU64,
    pub decode_us: AtomicU64,
    pub slots_busy: AtomicU64,
    /// Forward passes of the engine, and the sequences they held in all (continuous batching:
    /// one pass advances every active sequence).
    pub passes: AtomicU64,
    pub pass_sequences: AtomicU64,
    /// Most sequences one pass has held.
    pub pass_sequences_max: AtomicU64,
    /// Passes that handed back sampler candidates instead of logits.
    pub candidate_passes: AtomicU64,
    /// Recurrent-state checkpoints held by all slots (hybrid models), and their bytes.
    pub checkpoints: AtomicU64,
    pub checkpoint_bytes: AtomicU64,
}

fn get(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

fn rate(n: u64, us: u64) -> f64 {
    if us == 0 {
        0.0
    } else {
        n as f64 * 1e6 / us as f64
    }
}

impl Metrics {
    pub fn add(a: &AtomicU64, n: u64) {
        a.fetch_add(n, Ordering::Relaxed);
    }

    pub fn sub(a: &AtomicU64, n: u64) {
        a.fetch_sub(n, Ordering::Relaxed);
    }

    pub fn max(a: &AtomicU64, n: u64) {
        a.fetch_max(n, Ordering::Relaxed);
    }

    /// The exposition text; `queued` and the slot count come from the scheduler.
    pub fn render(&self, queued: usize, slots: usize) -> String {
        let computed = get(&self.prompt_tokens).saturating_sub(get(&self.cached_tokens));
        let rows: [(&str, &str, &str, f64); 18] = [
            (
                "tinyllm_requests_total",
                "counter",
                "Generation requests finished",
                get(&self.requests) as f64,
            ),
            (
                "tinyllm_requests_cancelled_total",
                "counter",
                "Requests stopped because the client went away",
                get(&self.requests_cancelled) as f64,
            ),
            (
                "tinyllm_requests_rejected_total",
                "counter",
                "Requests refused because the queue was full",
                get(&self.requests_rejected) as f64,
            ),
            (
                "tinyllm_prompt_tokens_total",
                "counter",
                "Prompt tokens received",
                get(&self.prompt_tokens) as f64,
            ),
            (
                "tinyllm_prompt_tokens_cached_total",
                "counter",
                "Prompt tokens reused from a slot's KV cache",
                get(&self.cached_tokens) as f64,
            ),
            (
                "tinyllm_tokens_generated_total",
                "counter",
                "Tokens generated",
                get(&self.generated_tokens) as f64,
            ),
            (
                "tinyllm_prefill_seconds_total",
                "counter",
                "Time spent in prompt processing",
                get(&self.prefill_us) as f64 / 1e6,
            ),
            (
                "tinyllm_decode_seconds_total",
                "counter",
                "Time spent in decode steps",
                get(&self.decode_us) as f64 / 1e6,
            ),
            (
                "tinyllm_prompt_tokens_per_second",
                "gauge",
                "Average prefill throughput",
                rate(computed, get(&self.prefill_us)),
            ),
            (
                "tinyllm_predicted_tokens_per_second",
                "gauge",
                "Average decode throughput per stream",
                rate(get(&self.decode_steps), get(&self.decode_us)),
            ),
            (
                "tinyllm_requests_queued",
                "gauge",
                "Requests waiting for a slot",
                queued as f64,
            ),
            (
                "tinyllm_slots_busy",
                "gauge",
                "Slots generating now",
                get(&self.slots_busy) as f64,
            ),
            (
                "tinyllm_passes_total",
                "counter",
                "Forward passes (each advances every active sequence)",
                get(&self.passes) as f64,
            ),
            (
                "tinyllm_pass_sequences_total",
                "counter",
                "Sequences advanced, summed over passes",
                get(&self.pass_sequences) as f64,
            ),
            (
                "tinyllm_pass_sequences_max",
                "gauge",
                "Most sequences one forward pass has held",
                get(&self.pass_sequences_max) as f64,
            ),
            (
                "tinyllm_candidate_passes_total",
                "counter",
                "Forward passes that read back sampler candidates (top k) instead of logits",
                get(&self.candidate_passes) as f64,
            ),
            (
                "tinyllm_checkpoints",
                "gauge",
                "Recurrent-state checkpoints held for prefix reuse, all slots (hybrid models)",
                get(&self.checkpoints) as f64,
            ),
            (
                "tinyllm_checkpoint_bytes",
                "gauge",
                "Memory held by recurrent-state checkpoints, all slots",
                get(&self.checkpoint_bytes) as f64,
            ),
        ];
        let mut out = String::new();
        for (name, kind, help, v) in rows {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
        }
        let _ = writeln!(out, "# HELP tinyllm_slots_total Slots (parallel sequences)\n# TYPE tinyllm_slots_total gauge\ntinyllm_slots_total {slots}");
        out
    }
}
