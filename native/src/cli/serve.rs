//! `serve`: the OpenAI-compatible HTTP server (see `crate::server`).

use super::load::{load_opened, open, ModelArgs, Opened};
use super::InputError;
use crate::server;
use tinyllm::backend::Backend;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0 = any free port; the address is printed).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Sequences generated at the same time, each with its own KV cache of --ctx tokens.
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
    /// Requests that may wait for a slot; beyond that the server answers 503.
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
    /// Model name reported by the API (default: the model's file name).
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
    let model_name = a.alias.clone().unwrap_or_else(|| {
        let p = std::path::Path::new(&a.model.model);
        match (p.extension(), p.file_stem()) {
            (Some(ext), Some(stem)) if ext == "gguf" => stem.to_string_lossy().into_owned(),
            _ => a.model.model.clone(),
        }
    });
    let cache_type = a.model.cache_type()?;
    if !(a.drain_timeout.is_finite() && a.drain_timeout >= 0.0) {
        return Err(InputError(format!("--drain-timeout {}: give seconds, 0 or more", a.drain_timeout)).into());
    }
    let drain_timeout = std::time::Duration::from_secs_f64(a.drain_timeout);
    // Resolve (fetching on first use) and read the header now: a wrong model is an error
    // before anything listens.
    let opened = open(&a.model)?;
    // The model runs on the engine thread; HTTP needs little.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        // Listen before the weights are placed: the probes answer meanwhile (server::lifecycle).
        let listener = server::bind(&a.host, a.port).await?;
        let life = server::lifecycle::Lifecycle::new();
        let mut serving = tokio::spawn(server::serve(listener, life.clone(), drain_timeout));
        // Loading blocks for seconds: a thread of its own, so a drain need not wait for it.
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            let _ = tx.send(load_and_warm(a, opened, model_name, cache_type));
        });
        tokio::select! {
            served = &mut serving => return served?,
            loaded = rx => {
                let (app, state) = loaded.map_err(|_| anyhow::anyhow!("the loading thread stopped"))??;
                life.set_ready(app, state);
                eprintln!("ready: model loaded and warm");
            }
        }
        serving.await?
    })
}

/// Place the weights, run one short forward pass (page faults, thread start-up: the first
/// request should not pay them), and start the engine.
fn load_and_warm(
    a: Args,
    opened: Opened,
    model_name: String,
    cache_type: tinyllm::backend::KvType,
) -> anyhow::Result<(axum::Router, server::Shared)> {
    // A test hook: readiness is tested against a load that takes this long.
    std::thread::sleep(server::test_delay("TINYLLM_TEST_LOAD_DELAY_MS"));
    let loaded = load_opened(&a.model, opened)?;
    let backend = loaded.engine.model.backend();
    eprintln!(
        "model {model_name}: backend {} ({}), {} threads, {cache_type} KV cache",
        backend.name(),
        backend.detail(),
        loaded.threads
    );
    let engine = &loaded.engine;
    let ids = engine.tokenizer.encode("Hello", true, false);
    if !ids.is_empty() {
        let mut session = engine.session(ids.len() + 2)?;
        let next = session.forward_argmax(&ids)?;
        session.forward_argmax(&[next])?;
    }
    server::app(
        loaded.engine,
        server::Options {
            model_name,
            n_ctx: a.model.ctx,
            parallel: a.parallel,
            queue: a.queue,
            prefill_chunk: a.prefill_chunk,
            checkpoints: a.checkpoints,
            cache_type,
            api_key: a.api_key,
            cors_origins: a.cors_origin,
            max_body_bytes: a.max_body_bytes,
            pooling: a.pooling,
            responses_store: a.responses_store,
            responses_store_bytes: a.responses_store_bytes,
        },
    )
}

fn parse_pooling(s: &str) -> Result<tinyllm::engine::Pooling, String> {
    tinyllm::engine::Pooling::parse(s).map_err(|e| e.to_string())
}
