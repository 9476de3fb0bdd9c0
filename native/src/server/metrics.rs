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
    /// Tokens held in the slots' KV caches (kept for prefix reuse after a request ends).
    pub kv_tokens: AtomicU64,
    /// From a request taking a slot to its first token (queue wait excluded).
    pub time_to_first_token: Histogram,
}

/// Upper bounds (seconds) of the time-to-first-token histogram's buckets.
const TTFT_BUCKETS: [f64; 10] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// A Prometheus histogram of seconds: cumulative counts per bucket, the sum and the count.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; TTFT_BUCKETS.len()],
    sum_us: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, seconds: f64) {
        for (b, &le) in self.buckets.iter().zip(&TTFT_BUCKETS) {
            if seconds <= le {
                b.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.sum_us
            .fetch_add((seconds.max(0.0) * 1e6) as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// The series of one model (`label`: `model="name"`).
    fn render(&self, out: &mut String, name: &str, label: &str) {
        for (b, le) in self.buckets.iter().zip(TTFT_BUCKETS) {
            let _ = writeln!(out, "{name}_bucket{{{label},le=\"{le}\"}} {}", get(b));
        }
        let count = get(&self.count);
        let _ = writeln!(out, "{name}_bucket{{{label},le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum{{{label}}} {}", get(&self.sum_us) as f64 / 1e6);
        let _ = writeln!(out, "{name}_count{{{label}}} {count}");
    }
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

    /// One model's rows: name, type, help, value. `queued`, the slot count and each slot's
    /// context come from its scheduler (zeros while it is not loaded).
    fn rows(&self, m: &Series) -> Vec<(&'static str, &'static str, &'static str, f64)> {
        let (queued, slots, n_ctx) = (m.queued, m.slots, m.n_ctx);
        let computed = get(&self.prompt_tokens).saturating_sub(get(&self.cached_tokens));
        let kv = get(&self.kv_tokens);
        vec![
            (
                "tinyllm_model_loaded",
                "gauge",
                "Whether the model is loaded (1) or not (0)",
                f64::from(u8::from(m.loaded)),
            ),
            (
                "tinyllm_model_loads_total",
                "counter",
                "Times the model was loaded (first use, or again after an unload)",
                m.loads as f64,
            ),
            (
                "tinyllm_model_load_seconds_total",
                "counter",
                "Time spent loading the model (weights and warm-up)",
                m.load_seconds,
            ),
            (
                "tinyllm_model_unloads_total",
                "counter",
                "Times the model was unloaded to make room (--max-loaded, --memory-budget)",
                m.unloads as f64,
            ),
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
            (
                "tinyllm_slots_total",
                "gauge",
                "Slots (parallel sequences)",
                slots as f64,
            ),
            (
                "tinyllm_kv_cache_tokens",
                "gauge",
                "Tokens held in the slots' KV caches",
                kv as f64,
            ),
            (
                "tinyllm_kv_cache_usage_ratio",
                "gauge",
                "KV cache tokens held over the slots' capacity",
                kv as f64 / (slots * n_ctx).max(1) as f64,
            ),
        ]
    }
}

/// What `/metrics` shows of one model besides its counters. The registry's state, copied out
/// by the handler: this module stays below the registry, which counts into it.
pub struct Series<'a> {
    pub name: &'a str,
    pub metrics: &'a Metrics,
    pub loaded: bool,
    pub queued: usize,
    pub slots: usize,
    pub n_ctx: usize,
    pub loads: u64,
    pub load_seconds: f64,
    pub unloads: u64,
}

/// The exposition text: every metric once, a series per model labelled `model="name"`.
pub fn render(models: &[Series]) -> String {
    let labels: Vec<String> = models
        .iter()
        .map(|m| format!("model=\"{}\"", m.name.replace('\\', "\\\\").replace('"', "\\\"")))
        .collect();
    let rows: Vec<_> = models.iter().map(|m| m.metrics.rows(m)).collect();
    let mut out = String::new();
    for (r, &(name, kind, help, _)) in rows.first().map(Vec::as_slice).unwrap_or_default().iter().enumerate() {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (label, series) in labels.iter().zip(&rows) {
            let _ = writeln!(out, "{name}{{{label}}} {}", series[r].3);
        }
    }
    let name = "tinyllm_time_to_first_token_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} From a request taking a slot to its first token (queue wait excluded: see tinyllm_requests_queued)\n# TYPE {name} histogram"
    );
    for (m, label) in models.iter().zip(&labels) {
        m.metrics.time_to_first_token.render(&mut out, name, label);
    }
    out
}
