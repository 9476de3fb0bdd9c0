//! `serve`: the OpenAI-compatible HTTP server (see `crate::server`), over one model or several
//! (`-m A -m B`, `--models-dir`: see `crate::server::registry`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::load::{load_opened, open, ModelArgs, Opened};
use crate::error::InputError;
use crate::server;
use crate::server::registry::{Limits, Registry, Spec};
use tinyllm::backend::Backend;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Serve every GGUF file in this folder too, each under its file name without `.gguf` (a
    /// split set under its first part's).
    #[arg(long)]
    models_dir: Option<PathBuf>,
    /// Most models loaded at once: a request for another one unloads the least recently used
    /// idle one first (a model answering a request is never unloaded).
    #[arg(long, default_value_t = 4)]
    max_loaded: usize,
    /// Most memory the loaded models may need together (weights, every slot's KV cache,
    /// activations), e.g. 12GB or 8GiB; unloads as --max-loaded does. Default: no budget.
    #[arg(long, value_parser = parse_bytes)]
    memory_budget: Option<u64>,
    /// Seconds a request for a model that is not loaded waits for room (the loaded ones all
    /// in use) before a 503.
    #[arg(long, default_value_t = 120.0)]
    load_wait: f64,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0 = any free port; the address is printed).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Sequences generated at the same time per model, each with its own KV cache of --ctx
    /// tokens.
    #[arg(long, default_value_t = 4)]
    parallel: usize,
    /// Most prompt tokens evaluated per engine pass: a new prompt is prefilled in chunks of this
    /// size between the decode steps of the running streams (smaller: smoother streams, slower
    /// prefill).
    #[arg(long, default_value_t = 64)]
    prefill_chunk: usize,
    /// Recurrent-state checkpoints each slot keeps for prefix reuse on hybrid models (qwen3.5):
    /// a copy of the state at the end of prompt chunks, so a request sharing a prefix resumes
    /// from the latest one at or before it. Each costs the recurrent layers' state (see
    /// /metrics); 0 turns prefix reuse off for these models.
    #[arg(long, default_value_t = tinyllm::model::hybrid::DEFAULT_CHECKPOINTS)]
    checkpoints: usize,
    /// Requests per model that may wait for a slot; beyond that the server answers 503.
    #[arg(long, default_value_t = 32)]
    queue: usize,
    /// Require `Authorization: Bearer KEY` on the API routes.
    #[arg(long, env = "TINYLLM_API_KEY")]
    api_key: Option<String>,
    /// A web origin (http(s)://host[:port]) whose pages may use the API, besides the server's
    /// own and localhost ones (repeatable; '*' allows every site)
    #[arg(long = "cors-origin")]
    cors_origin: Vec<String>,
    /// Largest request body in bytes.
    #[arg(long, default_value_t = 8 << 20)]
    max_body_bytes: usize,
    /// How /v1/embeddings pools a text's token vectors into one: mean, cls or last (default:
    /// the model's `pooling_type`, else last, the token that has seen the whole text).
    #[arg(long, value_parser = parse_pooling)]
    pooling: Option<tinyllm::engine::Pooling>,
    /// Finished Responses API answers kept for `previous_response_id` and GET/DELETE
    /// /v1/responses/{id} (the oldest dropped first; 0 keeps none).
    #[arg(long, default_value_t = 256)]
    responses_store: usize,
    /// Most bytes (their JSON) the kept responses and conversations may take.
    #[arg(long, default_value_t = 64 << 20)]
    responses_store_bytes: usize,
    /// Model name reported by the API (default: the model's file name); one model only (name
    /// several with -m NAME=MODEL).
    #[arg(long)]
    alias: Option<String>,
    /// On SIGTERM/SIGINT: seconds to let running requests finish (new ones get 503) before
    /// the process exits 0.
    #[arg(long, default_value_t = 30.0)]
    drain_timeout: f64,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if a.parallel == 0 {
        return Err(InputError("--parallel must be at least 1".into()).into());
    }
    if a.max_loaded == 0 {
        return Err(InputError("--max-loaded must be at least 1".into()).into());
    }
    for (flag, v) in [("--drain-timeout", a.drain_timeout), ("--load-wait", a.load_wait)] {
        if !(v.is_finite() && (0.0..=1e9).contains(&v)) {
            return Err(InputError(format!("{flag} {v}: give seconds, 0 or more")).into());
        }
    }
    let cache_type = a.model.cache_type()?;
    let drain_timeout = std::time::Duration::from_secs_f64(a.drain_timeout);
    // Resolve (fetching on first use) and read every header now: a wrong model is an error
    // before anything listens. The first model's stays open for its load.
    let (specs, first) = specs(&a)?;
    let model_opts = server::ModelOptions {
        n_ctx: a.model.ctx,
        parallel: a.parallel,
        queue: a.queue,
        prefill_chunk: a.prefill_chunk,
        checkpoints: a.checkpoints,
        cache_type,
        pooling: a.pooling,
    };
    let loader = loader(a.model.clone(), model_opts, first);
    let limits = Limits {
        max_loaded: a.max_loaded,
        budget: a.memory_budget,
        wait: std::time::Duration::from_secs_f64(a.load_wait),
    };
    let (app, state) = server::app(
        Registry::new(specs, limits, loader),
        server::Options {
            api_key: a.api_key,
            cors_origins: a.cors_origin,
            max_body_bytes: a.max_body_bytes,
            responses_store: a.responses_store,
            responses_store_bytes: a.responses_store_bytes,
        },
    )?;
    // The models run on their engine threads; HTTP needs little.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        // Listen before the weights are placed: the probes answer meanwhile (server::lifecycle).
        let listener = server::bind(&a.host, a.port).await?;
        let life = server::lifecycle::Lifecycle::new();
        let mut serving = tokio::spawn(server::serve(listener, life.clone(), drain_timeout));
        // Ready once the first model (the one a request without `model` gets) is loaded and
        // warm; the others load on first use.
        tokio::select! {
            served = &mut serving => return served?,
            loaded = state.models.load_first() => {
                loaded?;
                life.set_ready(app, state);
                eprintln!("ready: model loaded and warm");
            }
        }
        serving.await?
    })
}

/// The models to serve, named and sized, and the first one's opened file.
fn specs(a: &Args) -> anyhow::Result<(Vec<Spec>, Opened)> {
    if a.alias.is_some() && a.model.models.len() + usize::from(a.models_dir.is_some()) > 1 {
        return Err(InputError("--alias names the one model served: name several with -m NAME=MODEL".into()).into());
    }
    let mut wanted: Vec<(Option<String>, String)> = a.model.models.iter().map(|m| named(m)).collect();
    if let Some(dir) = &a.models_dir {
        wanted.extend(
            gguf_files(dir)?
                .into_iter()
                .map(|p| (None, p.to_string_lossy().into_owned())),
        );
    }
    if wanted.is_empty() {
        wanted.push((None, a.model.model().to_string()));
    }
    let mut specs: Vec<Spec> = Vec::with_capacity(wanted.len());
    let mut first = None;
    for (name, model) in wanted {
        let opened = open(&a.model.with_model(&model))?;
        let name = name.or_else(|| a.alias.clone()).unwrap_or_else(|| default_name(&model));
        if specs.iter().any(|s| s.name == name) {
            return Err(InputError(format!("two models are named '{name}': name one with -m NAME=MODEL")).into());
        }
        let need = memory_need(opened.file(), a.model.ctx, a.parallel)
            .map_err(|e| InputError(format!("{}: {e}", opened.path.display())))?;
        if let Some(budget) = a.memory_budget.filter(|&b| need > b) {
            return Err(InputError(format!(
                "model '{name}' needs about {} (weights, {} slots of --ctx {}), more than --memory-budget {}",
                bytes(need),
                a.parallel,
                a.model.ctx,
                bytes(budget)
            ))
            .into());
        }
        let path = opened.path.clone();
        if first.is_none() {
            first = Some(opened);
        }
        specs.push(Spec { name, path, need });
    }
    Ok((specs, first.expect("at least one model")))
}

/// `NAME=MODEL` names a model; a plain MODEL (a path that may hold `=`) is served under its
/// file name.
fn named(arg: &str) -> (Option<String>, String) {
    match arg.split_once('=') {
        Some((name, model)) if !Path::new(arg).exists() && !name.is_empty() && !name.contains(['/', '\\']) => {
            (Some(name.to_string()), model.to_string())
        }
        _ => (None, arg.to_string()),
    }
}

/// A model's name in the API: a file's name without `.gguf` (or a split set's without its part
/// suffix), an alias as given.
fn default_name(model: &str) -> String {
    let p = Path::new(model);
    match (p.extension(), p.file_stem()) {
        (Some(ext), Some(stem)) if ext == "gguf" => {
            let stem = stem.to_string_lossy();
            split_stem(&stem).unwrap_or(&stem).to_string()
        }
        _ => model.to_string(),
    }
}

/// `name` of `name-00001-of-00003`.
fn split_stem(stem: &str) -> Option<&str> {
    let (head, count) = stem.rsplit_once("-of-")?;
    let (name, part) = head.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    (digits(part) && digits(count)).then_some(name)
}

/// The GGUF files of `--models-dir`, in name order (a split set by its first part).
fn gguf_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let read = std::fs::read_dir(dir).map_err(|e| InputError(format!("--models-dir {}: {e}", dir.display())))?;
    let mut files = Vec::new();
    for entry in read {
        let path = entry
            .map_err(|e| InputError(format!("--models-dir {}: {e}", dir.display())))?
            .path();
        let Some(stem) = path
            .extension()
            .filter(|e| *e == "gguf")
            .and(path.file_stem())
            .map(|s| s.to_string_lossy().into_owned())
        else {
            continue;
        };
        let later_part = split_stem(&stem).is_some() && !stem.contains("-00001-of-");
        if path.is_file() && !later_part {
            files.push(path);
        }
    }
    files.sort();
    if files.is_empty() {
        return Err(InputError(format!("--models-dir {}: no .gguf files in it", dir.display())).into());
    }
    Ok(files)
}

/// What a model takes loaded with `parallel` slots of `ctx` positions.
fn memory_need(file: &tinyllm::gguf::GgufFile, ctx: usize, parallel: usize) -> anyhow::Result<u64> {
    let m = tinyllm::model::memory::estimate(file, ctx)?;
    // `total` holds one sequence's cache and state; every slot has its own.
    Ok(m.total() + parallel.saturating_sub(1) as u64 * (m.kv + m.recurrent))
}

fn bytes(n: u64) -> String {
    format!("{:.2} GB", n as f64 / 1e9)
}

/// Loads a model for the registry: the first one from the file opened at startup, the others
/// (and the first again after an unload) from their paths.
fn loader(args: ModelArgs, opts: server::ModelOptions, first: Opened) -> Arc<server::registry::Loader> {
    let first = std::sync::Mutex::new(Some(first));
    Arc::new(move |spec: &Spec, metrics| {
        let args = args.with_model(&spec.path.to_string_lossy());
        let opened = match first.lock().unwrap().take().filter(|o| o.path == spec.path) {
            Some(o) => o,
            None => open(&args)?,
        };
        let engine = load_and_warm(&args, opened, &spec.name)?;
        server::serve_model(engine, spec.name.clone(), opts, metrics)
    })
}

/// Place the weights and run one short forward pass (page faults, thread start-up: the first
/// request should not pay them).
fn load_and_warm(
    args: &ModelArgs,
    opened: Opened,
    name: &str,
) -> anyhow::Result<tinyllm::engine::Engine<tinyllm::backend::AnyBackend>> {
    // A test hook: readiness and loading on first use are tested against a load that takes
    // this long.
    std::thread::sleep(server::test_delay("TINYLLM_TEST_LOAD_DELAY_MS"));
    let loaded = load_opened(args, opened)?;
    let backend = loaded.engine.model.backend();
    eprintln!(
        "model {name}: backend {} ({}), {} threads, {} KV cache",
        backend.name(),
        backend.detail(),
        loaded.threads,
        args.cache_type()?
    );
    let engine = loaded.engine;
    let ids = engine.tokenizer.encode("Hello", true, false);
    if !ids.is_empty() {
        let mut session = engine.session(ids.len() + 2)?;
        let next = session.forward_argmax(&ids)?;
        session.forward_argmax(&[next])?;
    }
    Ok(engine)
}

fn parse_pooling(s: &str) -> Result<tinyllm::engine::Pooling, String> {
    tinyllm::engine::Pooling::parse(s).map_err(|e| e.to_string())
}

fn parse_bytes(s: &str) -> Result<u64, String> {
    let b: bytesize::ByteSize = s
        .parse()
        .map_err(|e| format!("{s}: {e} (a size such as 12GB or 8GiB)"))?;
    if b.as_u64() == 0 {
        return Err("the budget must be more than 0 bytes".into());
    }
    Ok(b.as_u64())
}
