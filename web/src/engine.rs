//! A loaded model as JavaScript drives it: OpenAI-shaped chat and text completions (streamed
//! through a callback, chunk by chunk, or whole), the low-level twin of `tinyllm-native run
//! --json`, and tokenizing. Everything runs through the library's generation pipeline; this
//! file only moves JSON across the boundary.
//!
//! One session is kept between requests, so a conversation's next turn reuses the cached
//! prefix as the server's slots do. Requests run one at a time (the package's worker queues
//! them). Between tokens the engine hands the event loop a turn, so a stop posted to the
//! worker lands even while the CPU backend computes without awaiting anything.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::AtomicBool;

use js_sys::{Function, Promise};
use serde_json::{json, Value};
use tinyllm::backend::{AnyBackend, Backend};
use tinyllm::engine::report::run_json;
use tinyllm::engine::{
    embed_async, generate_pausing, EmbedLimits, Engine, Flow, Pooling, Prompt, Request, Session, Settings, Step,
};
use tinyllm::openai::embeddings::{embeddings_json, EmbeddingLimits, EmbeddingsRequest};
use tinyllm::openai::{parse_value, Answer, ChatChunks, Chunks, CompletionChunks, GenRequest, Meta};
use tinyllm::sample::SamplerConfig;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::{future_to_promise, JsFuture};

use crate::error::WebError;

struct Inner {
    engine: Engine<AnyBackend>,
    session: Session<AnyBackend>,
    name: String,
    /// Requests answered so far (response ids).
    served: u64,
}

/// Where the engine is: idle with its model, answering a request (which holds the model
/// meanwhile), or unloaded.
enum State {
    Ready(Box<Inner>),
    Busy,
    Unloaded,
}

/// A loaded model. See the module docs.
#[wasm_bindgen]
pub struct WebEngine {
    state: Rc<RefCell<State>>,
}

/// The model, taken for one request and put back when it ends (also when it fails).
struct Lease {
    state: Rc<RefCell<State>>,
    inner: Option<Box<Inner>>,
}

impl Lease {
    fn take(state: &Rc<RefCell<State>>) -> Result<Lease, JsValue> {
        let mut s = state.borrow_mut();
        match std::mem::replace(&mut *s, State::Busy) {
            State::Ready(inner) => Ok(Lease {
                state: Rc::clone(state),
                inner: Some(inner),
            }),
            other => {
                let e = if matches!(other, State::Busy) {
                    busy()
                } else {
                    unloaded()
                };
                *s = other;
                Err(e)
            }
        }
    }
}

impl std::ops::Deref for Lease {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        self.inner.as_deref().expect("a lease holds its model until dropped")
    }
}

impl std::ops::DerefMut for Lease {
    fn deref_mut(&mut self) -> &mut Inner {
        self.inner
            .as_deref_mut()
            .expect("a lease holds its model until dropped")
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take() {
            *self.state.borrow_mut() = State::Ready(inner);
        }
    }
}

#[wasm_bindgen(inline_js = "
export function yield_now() {
  // A macrotask turn without setTimeout's clamping: messages queued for the worker
  // (a stop) are handled before the promise resolves.
  return new Promise((resolve) => {
    const c = new MessageChannel();
    c.port1.onmessage = () => { c.port1.close(); resolve(); };
    c.port2.postMessage(null);
  });
}
")]
extern "C" {
    fn yield_now() -> Promise;
}

async fn pause() {
    let _ = JsFuture::from(yield_now()).await;
}

/// Which OpenAI endpoint a request is for.
#[derive(Clone, Copy)]
enum Endpoint {
    Chat,
    Completion,
}

impl WebEngine {
    pub fn new(
        engine: Engine<AnyBackend>,
        context_size: usize,
        name: String,
    ) -> Result<Self, tinyllm::engine::EngineError> {
        let session = engine.session(context_size)?;
        Ok(WebEngine {
            state: Rc::new(RefCell::new(State::Ready(Box::new(Inner {
                engine,
                session,
                name,
                served: 0,
            })))),
        })
    }

    /// Run `f` on the engine, or the error of one that was unloaded or is busy.
    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> Result<R, WebError>) -> Result<R, JsValue> {
        let mut lease = Lease::take(&self.state)?;
        Ok(f(&mut lease)?)
    }
}

fn busy() -> JsValue {
    WebError::new("BUSY", "the engine is answering another request").into()
}

fn unloaded() -> JsValue {
    WebError::new("UNLOADED", "the model was unloaded").into()
}

fn parse_json(text: &str) -> Result<Value, WebError> {
    serde_json::from_str(text).map_err(|e| WebError::new("BAD_REQUEST", format!("invalid JSON: {e}")))
}

/// Call `f(arg)` in JavaScript; `true` when it returned a truthy value.
fn call(f: &Function, arg: &JsValue) -> Result<bool, JsValue> {
    Ok(f.call1(&JsValue::NULL, arg)?.is_truthy())
}

#[wasm_bindgen]
impl WebEngine {
    /// `{"architecture", "backend", "device", "context_size", "n_vocab", "n_layer", "name"}` as
    /// JSON.
    pub fn info(&self) -> Result<String, JsValue> {
        self.with(|i| {
            let info = i.engine.model.info();
            Ok(json!({
                "name": i.name,
                "architecture": info.arch,
                "backend": i.engine.model.backend().name(),
                "device": i.engine.model.backend().detail(),
                "f16": i.engine.model.backend().gpu_f16(),
                "context_size": i.session.n_ctx(),
                "n_vocab": info.n_vocab,
                "n_layer": info.n_layer,
                "n_embd": info.n_embd,
            })
            .to_string())
        })
    }

    /// The ids of `text` (`add_special`: the model's BOS where it wants one; `parse_special`:
    /// special tokens written as text are read as such).
    pub fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>, JsValue> {
        self.with(|i| Ok(i.engine.tokenizer.encode(text, add_special, parse_special)))
    }

    /// The text of `ids`.
    pub fn detokenize(&self, ids: &[u32]) -> Result<String, JsValue> {
        self.with(|i| {
            i.engine
                .tokenizer
                .decode(ids)
                .map_err(|e| WebError::new("BAD_REQUEST", e.to_string()))
        })
    }

    /// `POST /v1/chat/completions` in the browser: `request` is the body as JSON. Streamed
    /// requests call `on_chunk` with each chunk (JSON) and resolve to `null`; others resolve to
    /// the completion (JSON). `should_stop()` is asked after every token.
    pub fn chat(&self, request: String, on_chunk: Function, should_stop: Function) -> Promise {
        self.openai(Endpoint::Chat, request, on_chunk, should_stop)
    }

    /// `POST /v1/completions`, as [`Self::chat`].
    pub fn completion(&self, request: String, on_chunk: Function, should_stop: Function) -> Promise {
        self.openai(Endpoint::Completion, request, on_chunk, should_stop)
    }

    /// `POST /v1/embeddings` in the browser: `request` is the body as JSON (`input` a text,
    /// texts or token arrays; `encoding_format`; `dimensions`), plus `pooling` (`mean`, `cls`,
    /// `last`; default the model's own, else `last`). Resolves to the answer (JSON).
    pub fn embeddings(&self, request: String) -> Promise {
        let lease = Lease::take(&self.state);
        future_to_promise(async move {
            let lease = lease?;
            let raw = parse_json(&request)?;
            let pooling = match raw.get("pooling").and_then(Value::as_str) {
                Some(p) => Pooling::parse(p).map_err(|e| WebError::engine(e, "pooling"))?,
                None => lease.engine.pooling,
            };
            let (req, _): (EmbeddingsRequest, Value) = parse_value(raw).map_err(WebError::request)?;
            let info = lease.engine.model.info();
            let limits = EmbeddingLimits {
                n_vocab: info.n_vocab,
                n_embd: info.n_embd,
                n_ctx: lease.session.n_ctx(),
                pooling,
            };
            let job = req
                .prepare(&lease.engine.tokenizer, limits)
                .map_err(WebError::request)?;
            let batch = EmbedLimits {
                n_batch: 512,
                n_ctx: limits.n_ctx,
            };
            let vectors = embed_async(&lease.engine.model, &job.inputs, pooling, batch)
                .await
                .map_err(|e| WebError::engine(e, "input"))?;
            Ok(JsValue::from_str(
                &embeddings_json(&vectors, job.encoding, &lease.name).to_string(),
            ))
        })
    }

    /// The twin of `tinyllm-native run --json`: `options` is `{"promptIds": [..], "maxTokens",
    /// "temperature", "seed", "topK", "topP", "topLogprobs"}`; resolves to the same JSON as
    /// `run --json` (`{"tokens", "text", "top_logprobs", "stop", "timings"}`).
    pub fn generate(&self, options: String, should_stop: Function) -> Promise {
        let lease = Lease::take(&self.state);
        future_to_promise(async move {
            let mut lease = lease?;
            let i = &mut *lease;
            let o = parse_json(&options)?;
            let request = generate_request(&o)?;
            let prepared = i
                .engine
                .prepare(&request.prompt)
                .map_err(|e| WebError::engine(e, "promptIds"))?;
            let mut gen = i
                .engine
                .generation(prepared, request.settings)
                .map_err(|e| WebError::engine(e, "promptIds"))?;
            let mut steps: Vec<Step> = Vec::new();
            let mut js_err = None;
            let finish = generate_pausing(
                &mut i.session,
                &mut gen,
                &AtomicBool::new(false),
                |step| {
                    steps.push(step.clone());
                    match call(&should_stop, &JsValue::NULL) {
                        Ok(false) => Flow::Continue,
                        Ok(true) => Flow::Stop,
                        Err(e) => {
                            js_err = Some(e);
                            Flow::Stop
                        }
                    }
                },
                pause,
            )
            .await
            .map_err(|e| WebError::engine(e, "promptIds"))?;
            if let Some(e) = js_err {
                return Err(e);
            }
            let extra = json!({"threads": 1, "backend": i.engine.model.backend().name()});
            Ok(JsValue::from_str(
                &run_json(&steps, finish, &gen.usage(), extra).to_string(),
            ))
        })
    }

    /// Let go of the model (and its device memory); later calls fail with `UNLOADED`.
    pub fn unload(&self) -> Result<(), JsValue> {
        let lease = Lease::take(&self.state)?;
        drop(lease);
        *self.state.borrow_mut() = State::Unloaded;
        Ok(())
    }
}

/// The engine request of [`WebEngine::generate`]'s options.
fn generate_request(o: &Value) -> Result<Request, WebError> {
    let bad = |param: &str, problem: &str| WebError {
        code: "BAD_REQUEST",
        message: format!("{param}: {problem}"),
        param: Some(param.to_string()),
    };
    let ids: Vec<u32> = o
        .get("promptIds")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("promptIds", "an array of token ids is required"))?
        .iter()
        .map(|v| v.as_u64().filter(|&n| n <= u64::from(u32::MAX)).map(|n| n as u32))
        .collect::<Option<_>>()
        .ok_or_else(|| bad("promptIds", "every id must be a non-negative integer"))?;
    let num = |k: &str| o.get(k).filter(|v| !v.is_null());
    let max_tokens = match num("maxTokens") {
        None => None,
        Some(v) => Some(
            v.as_u64()
                .filter(|&n| n >= 1)
                .ok_or_else(|| bad("maxTokens", "must be a positive integer"))? as usize,
        ),
    };
    let f = |k: &str, default: f32| -> Result<f32, WebError> {
        match num(k) {
            None => Ok(default),
            Some(v) => v.as_f64().map(|x| x as f32).ok_or_else(|| bad(k, "must be a number")),
        }
    };
    let d = SamplerConfig::default();
    let sampler = SamplerConfig {
        temperature: f("temperature", d.temperature)?,
        top_p: f("topP", d.top_p)?,
        top_k: match num("topK") {
            None => d.top_k,
            Some(v) => v
                .as_u64()
                .ok_or_else(|| bad("topK", "must be a non-negative integer"))? as usize,
        },
        seed: match num("seed") {
            None => tinyllm::sample::fresh_seed(),
            Some(v) => v
                .as_u64()
                .ok_or_else(|| bad("seed", "must be a non-negative integer"))?,
        },
        ..d
    };
    sampler
        .validate()
        .map_err(|e| WebError::new("BAD_REQUEST", e.to_string()))?;
    let logprobs = match num("topLogprobs") {
        None => None,
        Some(v) => Some(
            v.as_u64()
                .filter(|&n| n <= 20)
                .ok_or_else(|| bad("topLogprobs", "must be an integer from 0 to 20"))? as usize,
        ),
    };
    Ok(Request {
        prompt: Prompt::Ids(ids),
        settings: Settings {
            sampler,
            max_tokens,
            logprobs: logprobs.filter(|&n| n > 0),
            ..Settings::default()
        },
        format: Default::default(),
    })
}

impl WebEngine {
    fn openai(&self, ep: Endpoint, request: String, on_chunk: Function, should_stop: Function) -> Promise {
        let lease = Lease::take(&self.state);
        future_to_promise(async move {
            let mut lease = lease?;
            let i = &mut *lease;
            let raw = parse_json(&request)?;
            let (req, raw): (GenRequest, Value) = parse_value(raw).map_err(WebError::request)?;
            let (gen_req, prefix, prompt_param) = match ep {
                Endpoint::Chat => (req.chat(&raw), "chatcmpl", "messages"),
                Endpoint::Completion => (req.completion(), "cmpl", "prompt"),
            };
            let gen_req = gen_req.map_err(WebError::request)?;
            let logprobs_on = gen_req.settings.logprobs.is_some();
            let prepared = i
                .engine
                .prepare_request(&gen_req)
                .map_err(|e| WebError::engine(e, prompt_param))?;
            tinyllm::engine::check_fits(prepared.prompt.len(), i.session.n_ctx())
                .map_err(|e| WebError::engine(e, prompt_param))?;
            let mut gen = i
                .engine
                .generation(prepared, gen_req.settings)
                .map_err(|e| WebError::engine(e, prompt_param))?;
            i.served += 1;
            let meta = Meta {
                id: format!("{prefix}-{}", i.served),
                created: tinyllm::openai::unix_now(),
                model: i.name.clone(),
            };
            let stream = req
                .stream
                .then(|| req.stream_options.as_ref().is_some_and(|o| o.include_usage));
            let mut chunks: Box<dyn Chunks> = match ep {
                Endpoint::Chat => Box::new(ChatChunks::new(meta.clone(), logprobs_on)),
                Endpoint::Completion => Box::new(CompletionChunks::new(meta.clone(), logprobs_on)),
            };
            let mut answer = Answer::default();
            let mut js_err: Option<JsValue> = None;
            let send = |values: Vec<Value>, js_err: &mut Option<JsValue>| {
                for v in values {
                    if js_err.is_none() {
                        if let Err(e) = call(&on_chunk, &JsValue::from_str(&v.to_string())) {
                            *js_err = Some(e);
                        }
                    }
                }
            };
            if stream.is_some() {
                send(chunks.opening(), &mut js_err);
            }
            let finish = generate_pausing(
                &mut i.session,
                &mut gen,
                &AtomicBool::new(false),
                |step| {
                    if stream.is_some() {
                        let c = chunks.step(step);
                        send(c, &mut js_err);
                    } else {
                        answer.push(step);
                    }
                    match call(&should_stop, &JsValue::NULL) {
                        Ok(false) if js_err.is_none() => Flow::Continue,
                        Ok(_) => Flow::Stop,
                        Err(e) => {
                            js_err = Some(e);
                            Flow::Stop
                        }
                    }
                },
                pause,
            )
            .await
            .map_err(|e| WebError::engine(e, prompt_param))?;
            if let Some(e) = js_err {
                return Err(e);
            }
            let usage = gen.usage();
            match stream {
                Some(include_usage) => {
                    let mut closing = chunks.finish(finish, &usage);
                    if include_usage {
                        closing.push(chunks.usage(&usage));
                    }
                    send(closing, &mut js_err);
                    match js_err {
                        Some(e) => Err(e),
                        None => Ok(JsValue::NULL),
                    }
                }
                None => {
                    let whole = match ep {
                        Endpoint::Chat => answer.chat_completion(&meta, finish, &usage, logprobs_on),
                        Endpoint::Completion => answer.text_completion(&meta, finish, &usage, logprobs_on),
                    };
                    Ok(JsValue::from_str(&whole.to_string()))
                }
            }
        })
    }
}
