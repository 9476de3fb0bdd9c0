//! `tinyllm-native serve`: an OpenAI-compatible HTTP server.
//!
//! Axum handles HTTP on a small tokio runtime; the model runs on one engine thread
//! ([`scheduler`]: slots and batching) that the handlers reach only through channels. What an
//! answer is (template, sampling, routing, usage) and the OpenAI shapes are the library's
//! (`tinyllm::engine`, `tinyllm::openai`); this module keeps HTTP: [`errors`] (error objects
//! with their status), [`sse`] (the streaming transport), [`handlers`] (one file per endpoint
//! group), [`page`] (the chat page at `/`), [`metrics`].

mod errors;
mod handlers;
pub mod lifecycle;
mod metrics;
mod origins;
mod page;
mod paths;
pub mod registry;
mod scheduler;
mod sse;
mod state;
mod store;
mod test_hooks;

pub use paths::{CHAT_PATHS, COMPLETION_PATHS, EMBEDDING_PATHS, MESSAGES_PATHS, RESPONSES_PATHS};
pub use state::{AppState, Shared};
pub use test_hooks::test_delay;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use errors::ApiError;
pub use metrics::Metrics;
use scheduler::{Scheduler, SlotConfig};
use std::future::IntoFuture;
use std::sync::Arc;
use tinyllm::backend::{AnyBackend, KvType};
use tinyllm::engine::{Engine, Pooling};

/// Server settings from the command line (a model's own are the loader's: see
/// [`ModelOptions`]).
pub struct Options {
    pub api_key: Option<String>,
    /// Browser origins allowed besides the server's own and localhost ones (`*`: any).
    pub cors_origins: Vec<String>,
    pub max_body_bytes: usize,
    /// Most responses the Responses API keeps for `previous_response_id`, and their bytes.
    pub responses_store: usize,
    pub responses_store_bytes: usize,
}

/// How each model is served once loaded.
#[derive(Debug, Clone, Copy)]
pub struct ModelOptions {
    /// Context per slot asked for (0: the model's trained context).
    pub n_ctx: usize,
    pub parallel: usize,
    pub queue: usize,
    /// Most prompt tokens evaluated per engine pass (alongside the running streams' tokens).
    pub prefill_chunk: usize,
    /// Recurrent-state checkpoints per slot (hybrid models).
    pub checkpoints: usize,
    /// Each slot's KV cache format (`--cache-type`).
    pub cache_type: KvType,
    /// How `/v1/embeddings` pools (`--pooling`; `None`: the model's own).
    pub pooling: Option<Pooling>,
}

/// Start the engine thread of a loaded model (`metrics`: the model's, kept across reloads).
pub fn serve_model(
    engine: Engine<AnyBackend>,
    name: String,
    o: ModelOptions,
    metrics: Arc<Metrics>,
) -> anyhow::Result<registry::Served> {
    let n_vocab = engine.model.info().n_vocab;
    let n_ctx = engine.n_ctx(o.n_ctx);
    eprintln!(
        "model {name}: {} slots of {n_ctx} tokens, queue of {}",
        o.parallel, o.queue
    );
    let slots = SlotConfig {
        slots: o.parallel,
        n_ctx,
        queue: o.queue,
        prefill_chunk: o.prefill_chunk,
        checkpoints: o.checkpoints,
        cache_type: o.cache_type,
    };
    let pooling = o.pooling.unwrap_or(engine.pooling);
    let scheduler = Scheduler::start(engine.clone(), slots, metrics.clone())?;
    Ok(registry::Served {
        scheduler,
        engine,
        name,
        n_ctx,
        n_vocab,
        pooling,
        metrics,
    })
}

/// Build the application (routes, auth, CORS) over `models`, with its state.
pub fn app(models: registry::Registry, opts: Options) -> anyhow::Result<(Router, Shared)> {
    let state = Arc::new(AppState {
        models,
        api_key: opts.api_key.filter(|k| !k.is_empty()),
        max_body_bytes: opts.max_body_bytes,
        responses: store::ResponseStore::new(opts.responses_store, opts.responses_store_bytes),
        next_id: std::sync::atomic::AtomicU64::new(1),
    });
    let router = routes(state.clone(), Arc::new(origins::Origins::parse(&opts.cors_origins)?));
    Ok((router, state))
}

fn routes(state: Shared, origins: Arc<origins::Origins>) -> Router {
    use handlers::{embeddings, generate, info, messages, responses, tokens};
    Router::new()
        .route("/", get(page::index))
        .route("/chat.js", get(page::asset))
        .route("/chat.css", get(page::asset))
        .route("/vendor/{file}", get(page::asset))
        .route("/metrics", get(info::metrics))
        .route("/v1/models", get(info::models))
        .route("/models", get(info::models))
        .route(CHAT_PATHS[0], post(generate::chat))
        .route(CHAT_PATHS[1], post(generate::chat))
        .route(COMPLETION_PATHS[0], post(generate::completions))
        .route(COMPLETION_PATHS[1], post(generate::completions))
        .route(RESPONSES_PATHS[0], post(responses::create))
        .route(RESPONSES_PATHS[1], post(responses::create))
        .route("/v1/responses/{id}", get(responses::get).delete(responses::delete))
        .route("/responses/{id}", get(responses::get).delete(responses::delete))
        .route(MESSAGES_PATHS[0], post(messages::messages))
        .route(MESSAGES_PATHS[1], post(messages::messages))
        .route("/v1/messages/count_tokens", post(messages::count_tokens))
        .route("/messages/count_tokens", post(messages::count_tokens))
        .route(EMBEDDING_PATHS[0], post(embeddings::embeddings))
        .route(EMBEDDING_PATHS[1], post(embeddings::embeddings))
        .route("/tokenize", post(tokens::tokenize))
        .route("/detokenize", post(tokens::detokenize))
        .route("/apply-template", post(tokens::apply_template))
        .fallback(not_found)
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .layer(middleware::from_fn_with_state(Arc::clone(&origins), origins::guard))
        .layer(origins.cors_layer())
        .with_state(state)
}

async fn not_found(req: Request) -> ApiError {
    ApiError::not_found(req.uri().path())
}

/// `--api-key`: every route but the page and `/health` needs `Authorization: Bearer <key>`
/// (or `x-api-key: <key>`, as Anthropic's clients send it). Anthropic's routes answer a refusal
/// in Anthropic's error shape.
async fn auth(State(st): State<Shared>, req: Request, next: Next) -> Response {
    if let Some(key) = &st.api_key {
        // The page and its files load without the key; the page then asks for it.
        let path = req.uri().path();
        let open = matches!(path, "/" | "/health" | "/chat.js" | "/chat.css") || path.starts_with("/vendor/");
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .or_else(|| req.headers().get("x-api-key").and_then(|v| v.to_str().ok()))
            .map(str::trim);
        if !open && given != Some(key.as_str()) {
            let e = ApiError::unauthorized();
            return if MESSAGES_PATHS.contains(&path) || path.ends_with("/count_tokens") {
                e.into_anthropic()
            } else {
                e.into_response()
            };
        }
    }
    next.run(req).await
}

/// Bind and print the address (tests start us on port 0 and read it). The model may still be
/// loading: see [`lifecycle`].
pub async fn bind(host: &str, port: u16) -> anyhow::Result<tokio::net::TcpListener> {
    let listener = tokio::net::TcpListener::bind((host, port))
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {host}:{port}: {e}"))?;
    let addr = listener.local_addr()?;
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(out, "tinyllm-native serve: listening on http://{addr}")?;
    out.flush()?;
    Ok(listener)
}

/// Serve until SIGTERM or SIGINT, then drain: new generation requests get 503, running ones
/// finish, for at most `drain_timeout`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    life: Arc<lifecycle::Lifecycle>,
    drain_timeout: std::time::Duration,
) -> anyhow::Result<()> {
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let drainer = Arc::clone(&life);
    let deadline = tokio::spawn(async move {
        lifecycle::termination().await;
        let started = std::time::Instant::now();
        drainer.drain();
        eprintln!("draining: no new requests, waiting up to {drain_timeout:?} for running ones");
        let idle = drainer.wait_idle(drain_timeout).await;
        let _ = stop_tx.send(());
        if !idle {
            eprintln!("drain timeout: stopping with requests still running");
        }
        // Responses still being written get what is left of the timeout (at least a moment).
        drain_timeout
            .saturating_sub(started.elapsed())
            .max(std::time::Duration::from_millis(500))
    });
    let app = life.router();
    let server = axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let _ = stop_rx.await;
        })
        .into_future();
    tokio::pin!(server);
    // The server ends only by the drain's stop (or an error): it may close before the drain
    // task hands back what is left of the timeout, when no connection remains open.
    tokio::select! {
        r = &mut server => r?,
        grace = deadline => match tokio::time::timeout(grace?, &mut server).await {
            Ok(r) => r?,
            Err(_) => eprintln!("drain timeout: closing the connections still open"),
        },
    }
    eprintln!("drained: exiting");
    Ok(())
}
