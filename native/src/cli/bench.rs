//! `bench`: prefill and decode speed of one model, measured the way llama-bench does (a
//! synthetic prompt of exactly N tokens, then greedy single-token steps), so the numbers can
//! be set side by side with llama.cpp's `pp`/`tg` results. Decode after an N-token prompt is
//! decode at context position N (`--prompt-tokens 4096`: at a 4k context). With several
//! `--cache-type`s (`f16,q8_0`) each prompt length is measured once per KV cache format, the
//! rows side by side, each with the cache's bytes per token.
//!
//! The reference benchmark's other measures: `--decode-position N` times decode at depth N
//! without timing the prefill that gets there (llama-bench's `-d`), `--chunk-size` sets the
//! prefill's micro-batch (llama-bench's `-ub`), `--json-schema` times decode held to a JSON
//! schema against the same decode free, and the JSON carries the startup timings (model
//! fetch, load, warmup, first token since the process started).

use super::load::{BackendArg, Loaded, ModelArgs};
use crate::error::InputError;
use serde_json::json;
use std::io::Write;
use std::time::Instant;
use tinyllm::backend::vulkan::dispatch::KernelTime;
use tinyllm::backend::vulkan::Startup;
use tinyllm::backend::{AnyBackend, Backend, KvType};
use tinyllm::engine::{Session, SessionConfig};
use tinyllm::grammar::AnswerFormat;
use tinyllm::model::KvCache;
use tinyllm::sample::{Sampler, SamplerConfig};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Comma-separated prompt lengths to measure, in tokens.
    #[arg(long, default_value = "128,512,2048")]
    prompt_tokens: String,
    /// Greedy tokens to decode after each prompt (per-token latency is measured on these).
    #[arg(long, default_value_t = 32, allow_negative_numbers = true)]
    decode_tokens: i64,
    /// Runs per prompt length; the reported rates are the medians over runs.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    repetitions: i64,
    /// Skip the untimed warmup run (page faults on the mapping, thread start-up).
    #[arg(long)]
    no_warmup: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Also measure this machine's read bandwidth (with the same threads) and report decode as a
    /// fraction of the bound it sets: every weight matrix is read once per decoded token.
    #[arg(long)]
    bandwidth: bool,
    /// Time every kernel on the device (Vulkan timestamp queries), or on the CPU backend every
    /// parallel op by its call site (the wall time of its tasks, and the time the pass's own
    /// thread worked alone before it), over the measured runs, and print where decode and
    /// prefill spend their time. (A prompt of one token leaves decode nearly alone.)
    #[arg(long)]
    profile: bool,
    /// Measure the Vulkan backend's start to the first token, cold (empty caches) and warm (the
    /// caches the cold start wrote): this program run as a fresh process on the same model, in
    /// temporary cache directories, with the pipeline cache alone (the drivers' own shader
    /// caches off) and with every cache.
    #[arg(long)]
    startup: bool,
    /// Decode at this context depth: prefill this many tokens untimed, then time
    /// `--decode-tokens` steps (instead of the `--prompt-tokens` runs).
    #[arg(long)]
    decode_position: Option<usize>,
    /// Most tokens per prefill forward pass (the micro-batch).
    #[arg(long, default_value_t = 512)]
    chunk_size: usize,
    /// Also time greedy decode held to this JSON schema (a file) against the same decode
    /// free, both through the generation pipeline (sampler on the whole logits row), after
    /// the first prompt length.
    #[arg(long)]
    json_schema: Option<std::path::PathBuf>,
}

/// Most tokens one prefill pass may take (`--chunk-size`): its scratch buffers grow with it.
const MAX_CHUNK: usize = 8192;

/// Seconds spent getting to the first token.
#[derive(Debug, Clone, Copy, Default)]
struct StartupTimes {
    /// Finding the model (fetching an alias on first use) and reading its header.
    fetch_s: f64,
    /// The backend opened and the weights placed.
    load_s: f64,
    warmup_s: f64,
    /// From the process's start to the first token's logits (the warmup's when there is one).
    first_token_s: f64,
}

/// Greedy decode free and held to a JSON schema (`--json-schema`).
#[derive(Debug, Clone, Copy)]
struct Constrained {
    free_tok_s: f64,
    json_tok_s: f64,
    /// Decode steps timed in each run.
    free_steps: usize,
    json_steps: usize,
    /// Computing and applying the mask, per constrained step.
    mask_ms: f64,
}

/// The decode bound of this machine and model (`--bandwidth`).
#[derive(Debug, Clone, Copy)]
struct Bound {
    read_bytes_s: f64,
    weight_bytes: u64,
}

impl Bound {
    /// Tokens per second if every token only had to read its weights at full bandwidth.
    fn tok_s(&self) -> f64 {
        self.read_bytes_s / self.weight_bytes.max(1) as f64
    }
}

/// One prompt length's measurements with one KV cache format.
#[derive(Debug, Clone, PartialEq)]
struct BenchResult {
    prompt_tokens: usize,
    cache_type: KvType,
    /// The KV cache's bytes per token over all layers (`None`: the model keeps no positional
    /// cache).
    kv_bytes_per_token: Option<usize>,
    /// Prefill plus picking the first token, seconds (median over runs).
    ttft_s: f64,
    prefill_tok_s: f64,
    decode_tok_s: f64,
    /// Per-token decode latency percentiles over every step of every run, milliseconds.
    decode_p50_ms: f64,
    decode_p95_ms: f64,
    /// Device work per decoded token (backends that count it).
    per_token: Option<PerToken>,
}

/// Device submissions, buffer readbacks and bind groups created per decode step.
#[derive(Debug, Clone, Copy, PartialEq)]
struct PerToken {
    submissions: f64,
    readbacks: f64,
    bind_groups: f64,
}

/// Times of one run: prefill, TTFT, and each decode step.
struct RunTimes {
    prefill_s: f64,
    ttft_s: f64,
    steps_s: Vec<f64>,
    /// Device work per decode step (backends that count it).
    per_token: Option<PerToken>,
}

/// `bench`: the options checked ([`Plan`]), the model loaded, the runs measured
/// ([`measure_all`]), and the report printed as a table or JSON ([`Report`]).
pub fn run(a: Args) -> anyhow::Result<()> {
    let plan = Plan::new(&a)?;
    let mut times = StartupTimes::default();
    let t = Instant::now();
    let opened = super::load::open(&a.model)?;
    times.fetch_s = t.elapsed().as_secs_f64();
    // Before this process places its own copy of the weights (the probes' run alone).
    let t = Instant::now();
    let startup = if a.startup {
        let longest = plan.prompts.iter().copied().max().unwrap_or(PROBE_PROMPT);
        Some(cold_and_warm_startup(&a, &opened.path, longest)?)
    } else {
        None
    };
    // The first token is timed from the process's start, the probes' time not counted.
    let probes_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let loaded = super::load::load_opened(&a.model, opened)?;
    times.load_s = t.elapsed().as_secs_f64();
    let (results, constrained) = measure_all(&a, &plan, &loaded, &mut times, probes_s)?;
    let bound = if a.bandwidth {
        eprintln!("[bench] read bandwidth with {} threads", loaded.threads);
        Some(Bound {
            read_bytes_s: super::bandwidth::read_bandwidth(loaded.threads)?,
            weight_bytes: super::bandwidth::weight_bytes_per_token(&super::io::open_model(a.model.model())?),
        })
    } else {
        None
    };
    let backend = loaded.engine.model.backend();
    let vk = backend.vulkan();
    let report = Report {
        a: &a,
        plan: &plan,
        threads: loaded.threads,
        backend: backend.name(),
        kernels: backend.detail(),
        results,
        times,
        constrained,
        bound,
        opened: vk.map(|v| v.startup()),
        pipelines: vk.map(|v| (v.pipelines(), v.pipeline_seconds())),
        startup,
        profile: vk.filter(|_| a.profile).map(|v| v.profile()).unwrap_or_default(),
        cpu_profile: plan.cpu_profile.then(tinyllm::backend::cpu::profile::report),
    };
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(out, "{}", report.json())?;
    } else {
        report.print(&mut out)?;
    }
    Ok(())
}

/// The options of a run, checked before anything loads.
struct Plan {
    /// Decode at a context depth (`--decode-position`) instead of after each prompt.
    deep: bool,
    /// Prompt lengths (the depth alone when `deep`).
    prompts: Vec<usize>,
    /// The answer format of `--json-schema`.
    schema: Option<AnswerFormat>,
    decode: usize,
    reps: usize,
    cache_types: Vec<KvType>,
    /// Record the CPU backend's op profile over the measured runs (`--profile` on the CPU).
    cpu_profile: bool,
}

impl Plan {
    fn new(a: &Args) -> anyhow::Result<Self> {
        let prompts = match a.decode_position {
            Some(0) => return Err(InputError("--decode-position must be at least 1".into()).into()),
            Some(n) => vec![n],
            None => parse_lengths(&a.prompt_tokens)?,
        };
        if !(1..=MAX_CHUNK).contains(&a.chunk_size) {
            return Err(InputError(format!(
                "--chunk-size must be from 1 to {MAX_CHUNK}, got {}",
                a.chunk_size
            ))
            .into());
        }
        let schema = match &a.json_schema {
            None => None,
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| InputError(format!("--json-schema {}: {e}", path.display())))?;
                let schema: serde_json::Value = serde_json::from_str(&text)
                    .map_err(|e| InputError(format!("--json-schema {}: not JSON: {e}", path.display())))?;
                Some(AnswerFormat::JsonSchema { schema, strict: true })
            }
        };
        let decode = positive(a.decode_tokens, "--decode-tokens")?;
        let reps = positive(a.repetitions, "--repetitions")?;
        let is_vulkan = a.model.backend == BackendArg::Vulkan;
        let cpu_profile = a.profile && a.model.backend == BackendArg::Cpu;
        if a.profile && !is_vulkan && !cpu_profile {
            return Err(InputError("--profile needs --backend vulkan or cpu".into()).into());
        }
        if a.startup && !is_vulkan {
            return Err(InputError("--startup needs --backend vulkan (pipeline caches are its own)".into()).into());
        }
        Ok(Plan {
            deep: a.decode_position.is_some(),
            prompts,
            schema,
            decode,
            reps,
            cache_types: a.model.cache_types(),
            cpu_profile,
        })
    }

    /// The longest prompt measured.
    fn longest(&self) -> usize {
        self.prompts.iter().copied().max().unwrap_or(0)
    }
}

/// Every prompt length with every KV cache format (after a warmup each), and the constrained
/// decode where `--json-schema` asks for it; the first token's time goes into `times`. The
/// rows come back side by side: each prompt length's together, in the order the formats were
/// given.
fn measure_all(
    a: &Args,
    plan: &Plan,
    loaded: &Loaded,
    times: &mut StartupTimes,
    probes_s: f64,
) -> anyhow::Result<(Vec<BenchResult>, Option<Constrained>)> {
    let (decode, reps) = (plan.decode, plan.reps);
    let cfg = loaded.engine.model.info();
    let cap = if a.model.ctx == 0 {
        cfg.context_length
    } else {
        a.model.ctx.min(cfg.context_length)
    };
    // The cache only needs the longest run; a smaller one keeps memory (and RSS) honest.
    let longest = plan.longest();
    if longest + decode > cap {
        return Err(InputError(format!(
            "a prompt of {longest} tokens plus {decode} decoded tokens needs a context of {} but it holds {cap} \
             (raise --ctx, up to the model's {})",
            longest + decode,
            cfg.context_length
        ))
        .into());
    }
    let ids = prompt_ids(loaded, longest)?;
    let mut results = Vec::with_capacity(plan.prompts.len() * plan.cache_types.len());
    let mut constrained = None;
    for &cache_type in &plan.cache_types {
        let mut session = Session::new(
            loaded.engine.model.clone(),
            SessionConfig {
                n_ctx: longest + decode,
                cache_type,
                n_batch: a.chunk_size,
                ..SessionConfig::default()
            },
        )?;
        let kv_bytes = session
            .state()
            .get::<KvCache<AnyBackend>>()
            .map(KvCache::bytes_per_token);
        if !a.no_warmup {
            let n = longest.min(16);
            eprintln!("[bench] {cache_type} KV cache: warmup: {n} prompt tokens, 2 decode steps");
            let t = Instant::now();
            let run = measure(&mut session, &ids[..n], 2)?;
            if times.warmup_s == 0.0 {
                times.warmup_s = t.elapsed().as_secs_f64();
                times.first_token_s = since_start(t) - probes_s + run.ttft_s;
            }
        }
        if let Some(vk) = loaded.engine.model.backend().vulkan().filter(|_| a.profile) {
            vk.enable_profile()?;
        }
        if plan.cpu_profile {
            tinyllm::backend::cpu::profile::enable(true);
        }
        for &p in &plan.prompts {
            let mut runs = Vec::with_capacity(reps);
            for r in 0..reps {
                eprintln!(
                    "[bench] {cache_type} KV cache: prompt {p} tokens, decode {decode}: run {}/{reps}",
                    r + 1
                );
                let t = Instant::now();
                let run = measure(&mut session, &ids[..p], decode)?;
                if times.first_token_s == 0.0 {
                    times.first_token_s = since_start(t) - probes_s + run.ttft_s;
                }
                runs.push(run);
            }
            results.push(summarize(p, cache_type, kv_bytes, decode, &runs));
        }
        if let (Some(format), None) = (&plan.schema, &constrained) {
            let p = plan.prompts[0];
            eprintln!("[bench] {cache_type} KV cache: prompt {p} tokens, {decode} greedy tokens free and held to the JSON schema");
            constrained = Some(measure_constrained(
                loaded,
                &mut session,
                &ids[..p],
                decode,
                format,
                reps,
            )?);
        }
    }
    results.sort_by_key(|r| {
        let prompt = plan.prompts.iter().position(|&p| p == r.prompt_tokens);
        (prompt, plan.cache_types.iter().position(|&t| t == r.cache_type))
    });
    Ok((results, constrained))
}

/// What a run measured, printed as a table or as one JSON object.
struct Report<'a> {
    a: &'a Args,
    plan: &'a Plan,
    threads: usize,
    backend: &'static str,
    /// What runs the kernels (the CPU kernel set or the adapter).
    kernels: String,
    results: Vec<BenchResult>,
    times: StartupTimes,
    constrained: Option<Constrained>,
    bound: Option<Bound>,
    /// The Vulkan backend's own start, pipelines made and per-kernel profile.
    opened: Option<Startup>,
    pipelines: Option<(usize, f64)>,
    startup: Option<[StartPair; 2]>,
    profile: Vec<KernelTime>,
    /// The CPU backend's op profile (`tinyllm::backend::cpu::profile::report`).
    cpu_profile: Option<serde_json::Value>,
}

impl Report<'_> {
    fn json(&self) -> serde_json::Value {
        let (deep, decode, reps) = (self.plan.deep, self.plan.decode, self.plan.reps);
        let (backend, kernels, cache_types) = (self.backend, &self.kernels, &self.plan.cache_types);
        let loaded_threads = self.threads;
        let rows: Vec<_> = self
            .results
            .iter()
            .map(|r| {
                json!({
                    "prompt_tokens": r.prompt_tokens,
                    "decode_position": self.a.decode_position,
                    "cache_type": r.cache_type.name(),
                    "kv_bytes_per_token": r.kv_bytes_per_token,
                    "decode_tokens": decode,
                    "ttft_s": (!deep).then_some(r.ttft_s),
                    "prefill_tok_s": (!deep).then_some(r.prefill_tok_s),
                    "decode_tok_s": r.decode_tok_s,
                    "decode_p50_ms": r.decode_p50_ms,
                    "decode_p95_ms": r.decode_p95_ms,
                    "submissions_per_token": r.per_token.map(|p| p.submissions),
                    "readbacks_per_token": r.per_token.map(|p| p.readbacks),
                    "bind_groups_per_token": r.per_token.map(|p| p.bind_groups),
                    "decode_bound_fraction": self.bound.map(|b| r.decode_tok_s / b.tok_s()),
                })
            })
            .collect();
        let j = json!({
            "model": self.a.model.model(),
            "threads": loaded_threads,
            "backend": backend,
            "kernels": kernels,
            "repetitions": reps,
            "cache_types": cache_types.iter().map(|t| t.name()).collect::<Vec<_>>(),
            "read_gb_s": self.bound.map(|b| b.read_bytes_s / 1e9),
            "weight_bytes_per_token": self.bound.map(|b| b.weight_bytes),
            "decode_bound_tok_s": self.bound.map(|b| b.tok_s()),
            "results": rows,
            "chunk_size": self.a.chunk_size,
            "startup": {
                "model_fetch_s": self.times.fetch_s,
                "load_s": self.times.load_s,
                "warmup_s": self.times.warmup_s,
                "first_token_s": self.times.first_token_s,
            },
            "json_schema": self.constrained.map(|c| json!({
                "schema": self.a.json_schema,
                "free_decode_tok_s": c.free_tok_s,
                "constrained_decode_tok_s": c.json_tok_s,
                "slowdown": 1.0 - c.json_tok_s / c.free_tok_s.max(1e-9),
                "free_steps": c.free_steps,
                "constrained_steps": c.json_steps,
                "mask_ms_per_token": c.mask_ms,
            })),
            "vulkan_startup": self.opened.map(startup_json),
            "vulkan_pipelines": self.pipelines.map(|(count, seconds)| json!({"count": count, "seconds": seconds})),
            "vulkan_cold_and_warm_starts": self.startup.as_ref().map(|pairs| pairs.iter().map(StartPair::json).collect::<Vec<_>>()),
            "profile": self.profile.iter().map(|k| json!({"kernel": k.label, "calls": k.calls, "ms": k.ns / 1e6})).collect::<Vec<_>>(),
            "cpu_profile": self.cpu_profile,
        });
        j
    }

    fn print(&self, out: &mut impl Write) -> std::io::Result<()> {
        let Report {
            a,
            plan,
            results,
            times,
            constrained,
            bound,
            opened,
            pipelines,
            startup,
            profile,
            cpu_profile,
            ..
        } = self;
        let (deep, decode, reps, prompts) = (plan.deep, plan.decode, plan.reps, &plan.prompts);
        let (backend, kernels) = (self.backend, &self.kernels);
        let loaded_threads = self.threads;
        writeln!(
            out,
            "model {}, {} threads, backend {backend} ({kernels}), {decode} decode tokens, {reps} run(s) each",
            a.model.model(),
            loaded_threads
        )?;
        writeln!(
            out,
            "{:>8} {:>6} {:>9} {:>10} {:>14} {:>13} {:>9} {:>9}",
            "prompt", "cache", "KV B/tok", "ttft s", "prefill tok/s", "decode tok/s", "p50 ms", "p95 ms"
        )?;
        if deep {
            writeln!(
                out,
                "decode at context position {} (the prefill there is not timed)",
                prompts[0]
            )?;
        }
        for r in results.iter() {
            let kv = r.kv_bytes_per_token.map_or("-".to_string(), |b| b.to_string());
            // At a decode position the prefill that got there is not a measurement.
            let (ttft, prefill) = if deep {
                ("-".to_string(), "-".to_string())
            } else {
                (format!("{:.3}", r.ttft_s), format!("{:.1}", r.prefill_tok_s))
            };
            writeln!(
                out,
                "{:>8} {:>6} {:>9} {:>10} {:>14} {:>13.2} {:>9.2} {:>9.2}",
                r.prompt_tokens,
                r.cache_type.name(),
                kv,
                ttft,
                prefill,
                r.decode_tok_s,
                r.decode_p50_ms,
                r.decode_p95_ms
            )?;
        }
        if let Some(b) = bound {
            writeln!(
                out,
                "read bandwidth {:.1} GB/s, {:.1} MB of weights per decoded token: at most {:.1} tok/s",
                b.read_bytes_s / 1e9,
                b.weight_bytes as f64 / 1e6,
                b.tok_s()
            )?;
            for r in results.iter() {
                writeln!(
                    out,
                    "prompt {} ({} cache): decode at {:.0}% of that bound",
                    r.prompt_tokens,
                    r.cache_type,
                    100.0 * r.decode_tok_s / b.tok_s()
                )?;
            }
        }
        writeln!(
            out,
            "startup: model fetch {:.2} s, load {:.2} s, warmup {:.2} s, first token {:.2} s after the process started",
            times.fetch_s, times.load_s, times.warmup_s, times.first_token_s
        )?;
        if let Some(c) = constrained {
            writeln!(
                out,
                "greedy decode through the sampler: free {:.2} tok/s ({} steps), held to the JSON schema {:.2} tok/s ({} steps): {:.1}% slower; the mask took {:.3} ms per token",
                c.free_tok_s,
                c.free_steps,
                c.json_tok_s,
                c.json_steps,
                100.0 * (1.0 - c.json_tok_s / c.free_tok_s.max(1e-9)),
                c.mask_ms
            )?;
        }
        if let Some(s) = opened {
            writeln!(out, "vulkan startup: {}", describe(s))?;
        }
        if let Some((count, seconds)) = pipelines {
            writeln!(
                out,
                "vulkan pipelines: {count} made in {seconds:.2} s in all (at open, as the weights were placed, at first use)"
            )?;
        }
        for p in startup.iter().flatten() {
            writeln!(
                out,
                "vulkan start with {}:\n  cold: {}\n  warm: {}\n  warm start {:.2}x faster than cold to the first token, its pipelines {:.2}x faster",
                p.caches.what(),
                describe_probe(&p.cold),
                describe_probe(&p.warm),
                p.speedup(),
                p.pipelines_speedup()
            )?;
        }
        if !profile.is_empty() {
            let total: f64 = profile.iter().map(|k| k.ns).sum();
            writeln!(
                out,
                "device time per kernel over the measured runs ({:.1} ms in all):",
                total / 1e6
            )?;
            writeln!(out, "{:>40} {:>8} {:>10} {:>6}", "kernel", "calls", "ms", "share")?;
            for k in profile.iter() {
                writeln!(
                    out,
                    "{:>40} {:>8} {:>10.2} {:>5.1}%",
                    k.label,
                    k.calls,
                    k.ns / 1e6,
                    100.0 * k.ns / total.max(1.0)
                )?;
            }
        }
        if let Some(p) = cpu_profile {
            print_cpu_profile(out, p)?;
        }
        for r in results.iter() {
            if let Some(p) = r.per_token {
                writeln!(
                    out,
                    "prompt {} ({} cache): {:.2} submissions, {:.2} readbacks and {:.2} new bind groups per decoded token",
                    r.prompt_tokens, r.cache_type, p.submissions, p.readbacks, p.bind_groups
                )?;
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy)]
struct ProbedStart {
    /// From the process's start to the first token's logits.
    first_token_s: f64,
    /// Opening the backend and placing the weights (pipelines for their formats included).
    load_s: f64,
    /// Pipelines made in all, and the seconds that took.
    pipelines: usize,
    pipelines_s: f64,
    /// Bytes of pipeline cache read at open (0: cold).
    cache_bytes: usize,
}

/// Tokens of the probe's prompt: more than the 8 rows the matvec kernels take, so prefill's
/// matmul pipelines are part of the start.
const PROBE_PROMPT: usize = 16;

/// Which caches a pair of probes of `--startup` starts without, then with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Caches {
    /// tinyllm's pipeline cache alone: the drivers' own disk caches (Mesa's, NVIDIA's) off,
    /// or a driver that keeps one would make the cold start warm and hide what it does.
    PipelineCache,
    /// Every cache: the pipeline cache and the drivers' disk caches, all in a new directory
    /// (a first start on a new machine, then a second).
    All,
}

impl Caches {
    fn what(self) -> &'static str {
        match self {
            Caches::PipelineCache => "the pipeline cache alone (the drivers' shader caches off)",
            Caches::All => "every cache (the drivers' shader caches too, in a new directory)",
        }
    }
}

/// A cold and a warm start of [`Caches`], and what the warm one saved.
#[derive(Debug, Clone, Copy)]
struct StartPair {
    caches: Caches,
    cold: ProbedStart,
    warm: ProbedStart,
}

impl StartPair {
    fn speedup(&self) -> f64 {
        self.cold.first_token_s / self.warm.first_token_s.max(1e-9)
    }

    fn pipelines_speedup(&self) -> f64 {
        self.cold.pipelines_s / self.warm.pipelines_s.max(1e-9)
    }

    fn json(&self) -> serde_json::Value {
        json!({
            "caches": match self.caches { Caches::PipelineCache => "pipeline_cache", Caches::All => "all" },
            "cold": probe_json(self.cold),
            "warm": probe_json(self.warm),
            "first_token_speedup": self.speedup(),
            "pipelines_speedup": self.pipelines_speedup(),
        })
    }
}

/// `--startup`: this program started as a fresh process four times, each a short bench of
/// the same model on Vulkan to its first token: a cold and a warm start with tinyllm's
/// pipeline cache alone, then with every cache ([`Caches`]). Each pair shares a new cache
/// directory: the cold start finds it empty and writes it as it ends, the warm one reads it.
/// `longest` is the longest prompt the run measures; the probes take up to [`PROBE_PROMPT`].
fn cold_and_warm_startup(a: &Args, model: &std::path::Path, longest: usize) -> anyhow::Result<[StartPair; 2]> {
    let exe = std::env::current_exe()?;
    let mut args: Vec<std::ffi::OsString> = vec!["bench".into(), "-m".into(), model.into()];
    let prompt = longest.clamp(1, PROBE_PROMPT);
    for (flag, value) in [
        ("--backend", "vulkan".to_string()),
        ("--ctx", a.model.ctx.to_string()),
        ("--cache-type", a.model.cache_types()[0].name().to_string()),
        ("--prompt-tokens", prompt.to_string()),
        ("--decode-tokens", "1".to_string()),
    ] {
        args.extend([flag.into(), value.into()]);
    }
    if let Some(t) = a.model.threads {
        args.extend(["--threads".into(), t.to_string().into()]);
    }
    args.extend(["--no-warmup".into(), "--json".into()]);
    let probe = |caches: Caches, dir: &std::path::Path, which: &str| -> anyhow::Result<ProbedStart> {
        eprintln!("[bench] vulkan startup, {}: {which}, a fresh process", caches.what());
        let mut cmd = std::process::Command::new(&exe);
        cmd.args(&args)
            .env("TINYLLM_PIPELINES", dir.join("pipelines"))
            .stdin(std::process::Stdio::null());
        match caches {
            Caches::PipelineCache => cmd
                .env("MESA_SHADER_CACHE_DISABLE", "true")
                .env("__GL_SHADER_DISK_CACHE", "0"),
            Caches::All => cmd
                .env("MESA_SHADER_CACHE_DISABLE", "false")
                .env("MESA_SHADER_CACHE_DIR", dir.join("driver"))
                .env("__GL_SHADER_DISK_CACHE", "1")
                .env("__GL_SHADER_DISK_CACHE_PATH", dir.join("driver")),
        };
        let out = cmd.output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        // Its last lines: where it says what went wrong.
        let skip = stderr.chars().count().saturating_sub(2000);
        let tail: String = stderr.chars().skip(skip).collect();
        anyhow::ensure!(
            out.status.success(),
            "--startup: the {which} start failed ({}): {}",
            out.status,
            tail.trim()
        );
        let j: serde_json::Value = serde_json::from_slice(&out.stdout)
            .map_err(|e| anyhow::anyhow!("--startup: the {which} start printed no JSON ({e}): {}", tail.trim()))?;
        let num = |path: &[&str]| -> anyhow::Result<f64> {
            path.iter()
                .try_fold(&j, |v, k| v.get(k))
                .and_then(serde_json::Value::as_f64)
                .ok_or_else(|| anyhow::anyhow!("--startup: the {which} start's JSON lacks {}", path.join(".")))
        };
        let s = ProbedStart {
            first_token_s: num(&["startup", "first_token_s"])?,
            load_s: num(&["startup", "load_s"])?,
            pipelines: num(&["vulkan_pipelines", "count"])? as usize,
            pipelines_s: num(&["vulkan_pipelines", "seconds"])?,
            cache_bytes: num(&["vulkan_startup", "pipeline_cache_bytes_read"])? as usize,
        };
        eprintln!("[bench] vulkan startup, {which}: {}", describe_probe(&s));
        Ok(s)
    };
    let pair = |caches: Caches| -> anyhow::Result<StartPair> {
        let dir = tempfile::tempdir()?;
        let cold = probe(caches, dir.path(), "cold")?;
        let warm = probe(caches, dir.path(), "warm")?;
        Ok(StartPair { caches, cold, warm })
    };
    Ok([pair(Caches::PipelineCache)?, pair(Caches::All)?])
}

fn probe_json(s: ProbedStart) -> serde_json::Value {
    json!({
        "first_token_s": s.first_token_s,
        "load_s": s.load_s,
        "pipelines": s.pipelines,
        "pipelines_s": s.pipelines_s,
        "pipeline_cache_bytes_read": s.cache_bytes,
    })
}

fn describe_probe(s: &ProbedStart) -> String {
    format!(
        "first token {:.2} s after the process started (load {:.2} s; {} pipelines made in {:.2} s; pipeline cache {})",
        s.first_token_s,
        s.load_s,
        s.pipelines,
        s.pipelines_s,
        cache_state(s.cache_bytes)
    )
}

/// A cache of its 32-byte header alone holds no pipeline (lavapipe writes no more).
fn cache_state(bytes: usize) -> String {
    if bytes <= 32 {
        "cold".to_string()
    } else {
        format!("warm, {bytes} bytes read")
    }
}

fn startup_json(s: Startup) -> serde_json::Value {
    json!({
        "device_s": s.device_s,
        "pipelines_s": s.pipelines_s,
        "pipelines": s.pipelines,
        "pipeline_cache_bytes_read": s.cache_bytes,
        "total_s": s.total_s(),
    })
}

fn describe(s: &Startup) -> String {
    format!(
        "{:.2} s (device {:.2} s, {} pipelines {:.2} s, pipeline cache {})",
        s.total_s(),
        s.device_s,
        s.pipelines,
        s.pipelines_s,
        cache_state(s.cache_bytes)
    )
}

/// Seconds from the process's start to `t`.
fn since_start(t: Instant) -> f64 {
    crate::clock::PROCESS_START
        .get()
        .map_or(0.0, |s| t.saturating_duration_since(*s).as_secs_f64())
}

/// Greedy decode of `decode` tokens after `prompt`, the sampler taking the whole logits row,
/// free and held to `format`, `reps` times each: the two loops differ only in the mask and its update, so
/// the difference is what the constraint costs per token (on a GPU both read back the row).
/// As in [`measure`], an end-of-generation token does not stop the run; where the grammar
/// ends, a fresh constraint starts (its compile time is not counted).
fn measure_constrained(
    loaded: &Loaded,
    session: &mut Session<AnyBackend>,
    prompt: &[u32],
    decode: usize,
    format: &AnswerFormat,
    reps: usize,
) -> anyhow::Result<Constrained> {
    let engine = &loaded.engine;
    let compile = |lark: &str| {
        engine
            .grammars
            .compile(lark, format.param())
            .map_err(|e| InputError(format!("--json-schema: {e}")))
    };
    let mut run = |lark: Option<&str>| -> anyhow::Result<(f64, usize, f64)> {
        let mut constraint = lark.map(compile).transpose()?;
        let mut sampler = Sampler::new(SamplerConfig::greedy())?;
        session.reset();
        let mut history = prompt.to_vec();
        let mut logits = session.forward(prompt)?;
        let (mut spent, mut masking) = (0.0, 0.0);
        for _ in 0..decode {
            let t = Instant::now();
            if let Some(c) = &mut constraint {
                c.mask(&mut logits)?;
                masking += t.elapsed().as_secs_f64();
            }
            let token = sampler.sample(&logits, &history);
            let eog = engine.tokenizer.is_eog(token);
            if let Some(c) = &mut constraint {
                c.commit(token, eog)?;
            }
            logits = session.forward(&[token])?;
            spent += t.elapsed().as_secs_f64();
            history.push(token);
            if let (true, Some(lark)) = (eog, lark) {
                constraint = Some(compile(lark)?);
            }
        }
        Ok((rate(decode, spent), decode, masking))
    };
    let lark = format.lark().unwrap_or_default();
    // Interleaved, the order swapped every repetition, medians of each: a machine that
    // speeds up or slows down over the runs favours neither.
    let (mut free, mut held, mut masking) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..reps {
        for constrained in [r % 2 == 1, r % 2 == 0] {
            if constrained {
                let (tok_s, _, m) = run(Some(&lark))?;
                held.push(tok_s);
                masking.push(m * 1e3 / decode as f64);
            } else {
                free.push(run(None)?.0);
            }
        }
    }
    Ok(Constrained {
        free_tok_s: median(free),
        json_tok_s: median(held),
        free_steps: decode,
        json_steps: decode,
        mask_ms: median(masking),
    })
}

/// Prefill `prompt` from an empty session, pick the first token, then `decode` greedy steps.
/// End-of-generation tokens do not stop the run: the point is a fixed amount of work.
fn measure(session: &mut Session<AnyBackend>, prompt: &[u32], decode: usize) -> anyhow::Result<RunTimes> {
    session.reset();
    let t0 = Instant::now();
    // Greedy on the backend: a GPU reads back one id per step, not the logits.
    let mut token = session.forward_argmax(prompt)?;
    let prefill_s = t0.elapsed().as_secs_f64();
    let ttft_s = prefill_s;
    let mut steps_s = Vec::with_capacity(decode);
    let before = session.model().backend().counters();
    for _ in 0..decode {
        let t = Instant::now();
        token = session.forward_argmax(&[token])?;
        steps_s.push(t.elapsed().as_secs_f64());
    }
    let after = session.model().backend().counters();
    let per_token = before.zip(after).filter(|_| decode > 0).map(|(b, a)| {
        let n = decode as f64;
        PerToken {
            submissions: (a.submissions - b.submissions) as f64 / n,
            readbacks: (a.readbacks - b.readbacks) as f64 / n,
            bind_groups: (a.bind_groups - b.bind_groups) as f64 / n,
        }
    });
    Ok(RunTimes {
        prefill_s,
        ttft_s,
        steps_s,
        per_token,
    })
}

fn summarize(
    prompt_tokens: usize,
    cache_type: KvType,
    kv_bytes_per_token: Option<usize>,
    decode: usize,
    runs: &[RunTimes],
) -> BenchResult {
    // Medians of times, turned into rates afterwards: the same rank of each, so a run's
    // prefill (which its TTFT includes) can never come out longer than the reported TTFT.
    let ttft: Vec<f64> = runs.iter().map(|r| r.ttft_s).collect();
    let prefill: Vec<f64> = runs.iter().map(|r| r.prefill_s).collect();
    let dec: Vec<f64> = runs.iter().map(|r| r.steps_s.iter().sum()).collect();
    let mut steps: Vec<f64> = runs.iter().flat_map(|r| r.steps_s.iter().map(|s| s * 1e3)).collect();
    steps.sort_by(f64::total_cmp);
    BenchResult {
        prompt_tokens,
        cache_type,
        kv_bytes_per_token,
        ttft_s: median(ttft),
        prefill_tok_s: rate(prompt_tokens, median(prefill)),
        decode_tok_s: rate(decode, median(dec)),
        decode_p50_ms: percentile(&steps, 50.0),
        decode_p95_ms: percentile(&steps, 95.0),
        per_token: runs.last().and_then(|r| r.per_token),
    }
}

fn rate(n: usize, s: f64) -> f64 {
    if s > 0.0 {
        n as f64 / s
    } else {
        0.0
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    percentile(&v, 50.0)
}

/// Nearest-rank percentile of sorted values (0 for none).
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// `n` deterministic prompt ids: BOS first when the model adds one, then a fixed
/// pseudo-random walk over the vocabulary that skips control and end-of-generation tokens
/// (they can change the model's behaviour, not its cost, but keep the prompt ordinary text).
fn prompt_ids(loaded: &Loaded, n: usize) -> anyhow::Result<Vec<u32>> {
    let tok = &loaded.engine.tokenizer;
    let n_vocab = loaded.engine.model.info().n_vocab.min(tok.vocab_size());
    let usable = |id: u32| !tok.is_control(id) && !tok.is_eog(id);
    let mut ids = Vec::with_capacity(n);
    if let Some(bos) = tok.bos().filter(|_| tok.add_bos()) {
        ids.push(bos);
    }
    // A 64-bit LCG (Knuth's MMIX constants): reproducible across runs and machines.
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut tries = 0usize;
    while ids.len() < n {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let id = ((state >> 33) % n_vocab.max(1) as u64) as u32;
        if usable(id) {
            ids.push(id);
        }
        tries += 1;
        if tries > 100 * n.max(1) {
            return Err(
                InputError("the vocabulary has almost no ordinary tokens to build a prompt from".into()).into(),
            );
        }
    }
    ids.truncate(n);
    Ok(ids)
}

/// Parse `128,512,2048`: positive, comma-separated.
fn parse_lengths(s: &str) -> Result<Vec<usize>, InputError> {
    let bad = |item: &str| {
        InputError(format!(
            "--prompt-tokens: '{item}' is not a positive token count (expected e.g. 128,512,2048)"
        ))
    };
    let v = s
        .split(',')
        .map(|item| {
            let item = item.trim();
            match item.parse::<usize>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(bad(item)),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(v)
}

fn positive(n: i64, flag: &str) -> Result<usize, InputError> {
    usize::try_from(n)
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| InputError(format!("{flag} must be at least 1, got {n}")))
}

/// The CPU backend's op profile as a table: per call site, its calls, the wall time of its
/// tasks and the time the pass thread worked alone before it, largest first.
fn print_cpu_profile(out: &mut impl Write, p: &serde_json::Value) -> std::io::Result<()> {
    let ms = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or(0.0);
    let pass = ms(p, "pass_ms");
    writeln!(
        out,
        "CPU wall time per op over the measured runs ({} passes, {pass:.1} ms; {:.1} ms after the last op):",
        p["passes"],
        ms(p, "tail_ms")
    )?;
    writeln!(
        out,
        "{:>60} {:>8} {:>10} {:>10} {:>6}",
        "op", "calls", "op ms", "alone ms", "share"
    )?;
    for site in p["sites"].as_array().into_iter().flatten() {
        let (op, alone) = (ms(site, "op_ms"), ms(site, "alone_ms"));
        let name = site["site"].as_str().unwrap_or("?");
        // Long names keep their tail (a call site's file and line), cut at a character.
        let skip = name.chars().count().saturating_sub(60);
        let name: String = name.chars().skip(skip).collect();
        writeln!(
            out,
            "{:>60} {:>8} {:>10.2} {:>10.2} {:>5.1}%",
            name,
            site["calls"],
            op,
            alone,
            100.0 * (op + alone) / pass.max(1e-9)
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_parse_and_reject() {
        assert_eq!(parse_lengths("128, 512,2048").unwrap(), vec![128, 512, 2048]);
        for bad in ["", "0", "12,,3", "-5", "1.5", "abc"] {
            assert!(parse_lengths(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 10.0);
        assert_eq!(percentile(&v, 95.0), 19.0);
        assert_eq!(percentile(&[3.0], 95.0), 3.0);
        assert_eq!(median(vec![5.0, 1.0, 3.0]), 3.0);
    }
}
