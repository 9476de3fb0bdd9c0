//! The engine task: one OS thread owns the model and every slot's session (the model is
//! CPU-bound, so it must not run on the async workers). Handlers talk to it only through
//! messages: a bounded queue of [`Job`]s in, a channel of [`Event`]s per job out.
//!
//! Each of the `--parallel` slots keeps its own [`Session`], so prefix reuse works per slot: a
//! new job goes to the free slot sharing the longest prefix with its prompt (else the least
//! recently used one). Active slots advance round-robin, one token each per cycle, so streams
//! progress together. Each step is still one single-sequence forward pass; batching the active
//! sequences into one pass is a later engine change.

use super::errors::ApiError;
use super::metrics::Metrics;
use super::stop::StopMatcher;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tinyllm::backend::cpu::CpuBackend;
use tinyllm::engine::{Session, SessionConfig};
use tinyllm::model::Model;
use tinyllm::sample::{log_softmax_top_k, Sampler, SamplerConfig};
use tinyllm::tokenizer::{StreamDecoder, Tokenizer};
use tokio::sync::mpsc;

/// One generation request, ready for the engine (prompt tokenized and checked).
pub struct Job {
    pub id: u64,
    /// For the log line: `chat` or `completion`.
    pub kind: &'static str,
    pub prompt: Vec<u32>,
    pub sampler: SamplerConfig,
    pub max_tokens: usize,
    /// Alternatives per token; `None` when logprobs are off.
    pub logprobs: Option<usize>,
    pub stop: Vec<String>,
    /// Set when the client goes away; checked before every step.
    pub cancel: Arc<AtomicBool>,
    pub events: mpsc::UnboundedSender<Event>,
}

/// Log-probability of one generated token and its best alternatives.
#[derive(Debug, Clone)]
pub struct TokenLogprob {
    pub piece: Vec<u8>,
    pub logprob: f32,
    pub top: Vec<(Vec<u8>, f32)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// End-of-generation token or a stop string.
    Stop,
    /// `max_tokens` or the end of the context.
    Length,
    /// The client went away.
    Cancelled,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    pub prefill_s: f64,
    pub decode_s: f64,
}

impl Usage {
    pub fn prefill_tok_s(&self) -> f64 {
        rate((self.prompt_tokens - self.cached_tokens) as f64, self.prefill_s)
    }
    pub fn decode_tok_s(&self) -> f64 {
        rate(self.completion_tokens.saturating_sub(1) as f64, self.decode_s)
    }
}

fn rate(n: f64, s: f64) -> f64 {
    if s > 0.0 {
        n / s
    } else {
        0.0
    }
}

/// What the engine reports for a job.
#[derive(Debug, Clone)]
pub enum Event {
    /// One generated token: the text it completes (possibly empty: held back for a stop string
    /// or an incomplete UTF-8 character) and its logprobs when asked for.
    Token {
        text: String,
        logprob: Option<TokenLogprob>,
    },
    Done {
        finish: Finish,
        usage: Usage,
    },
    Failed(String),
}

/// The handlers' side of the engine.
pub struct Scheduler {
    tx: mpsc::Sender<Job>,
    queue: usize,
    slots: usize,
    next_id: AtomicU64,
}

impl Scheduler {
    /// Allocate the slots' sessions (so a context too big for memory fails at startup) and
    /// start the engine thread.
    pub fn start(
        model: Arc<Model<CpuBackend>>,
        tokenizer: Arc<Tokenizer>,
        slots: usize,
        n_ctx: usize,
        queue: usize,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Scheduler> {
        let mut sessions = Vec::with_capacity(slots);
        for _ in 0..slots {
            sessions.push(Session::new(
                model.clone(),
                SessionConfig {
                    n_ctx,
                    ..SessionConfig::default()
                },
            )?);
        }
        let (tx, rx) = mpsc::channel(queue.max(1));
        std::thread::Builder::new().name("engine".into()).spawn(move || {
            let mut engine = Engine {
                tok: &tokenizer,
                slots: sessions
                    .into_iter()
                    .map(|session| Slot {
                        session,
                        active: None,
                        last_used: 0,
                    })
                    .collect(),
                metrics,
                clock: 0,
            };
            engine.run(rx);
        })?;
        Ok(Scheduler {
            tx,
            queue: queue.max(1),
            slots,
            next_id: AtomicU64::new(1),
        })
    }

    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Queue a job; a full queue is a 503 the client may retry.
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        self.tx.try_send(job).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => ApiError::overloaded(self.queue),
            mpsc::error::TrySendError::Closed(_) => ApiError::internal("the engine has stopped"),
        })
    }

    /// Jobs waiting for a slot.
    pub fn queued(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }

    pub fn slots(&self) -> usize {
        self.slots
    }
}

/// Sets the cancel flag when dropped while armed: a dropped SSE stream or response future
/// (the client went away) stops its job.
pub struct CancelGuard {
    flag: Arc<AtomicBool>,
    armed: bool,
}

impl CancelGuard {
    pub fn new(flag: Arc<AtomicBool>) -> Self {
        CancelGuard { flag, armed: true }
    }

    /// The job is over: nothing to cancel.
    pub fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if self.armed {
            self.flag.store(true, Ordering::Relaxed);
        }
    }
}

struct Slot<'t> {
    session: Session<CpuBackend>,
    active: Option<Active<'t>>,
    /// Engine clock at the last assignment (least recently used wins ties).
    last_used: u64,
}

/// A job running in a slot.
struct Active<'t> {
    job: Job,
    sampler: Sampler,
    /// Logits for the next token.
    logits: Vec<f32>,
    decoder: StreamDecoder<'t>,
    stop: StopMatcher,
    usage: Usage,
    started: Instant,
    decode_start: Instant,
}

struct Engine<'t> {
    tok: &'t Tokenizer,
    slots: Vec<Slot<'t>>,
    metrics: Arc<Metrics>,
    clock: u64,
}

impl<'t> Engine<'t> {
    fn run(&mut self, mut rx: mpsc::Receiver<Job>) {
        loop {
            // Fill free slots: block for work only when nothing is running.
            while self.slots.iter().any(|s| s.active.is_none()) {
                let busy = self.slots.iter().any(|s| s.active.is_some());
                let job = if busy {
                    match rx.try_recv() {
                        Ok(job) => job,
                        Err(_) => break,
                    }
                } else {
                    match rx.blocking_recv() {
                        Some(job) => job,
                        None => return,
                    }
                };
                self.admit(job);
            }
            for i in 0..self.slots.len() {
                self.step_slot(i);
            }
        }
    }

    /// Put a job in the best free slot and run its prompt.
    fn admit(&mut self, job: Job) {
        if job.cancel.load(Ordering::Relaxed) {
            eprintln!(
                "req {} {}: interrupted while queued (client disconnected)",
                job.id, job.kind
            );
            Metrics::add(&self.metrics.requests_cancelled, 1);
            return;
        }
        let Some(i) = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.active.is_none())
            .max_by_key(|(_, s)| slot_preference(&s.session, &job.prompt, s.last_used))
            .map(|(i, _)| i)
        else {
            return;
        };
        self.clock += 1;
        let slot = &mut self.slots[i];
        slot.last_used = self.clock;
        let sampler = match Sampler::new(job.sampler.clone()) {
            Ok(s) => s,
            Err(e) => {
                let _ = job.events.send(Event::Failed(e.to_string()));
                return;
            }
        };
        let started = Instant::now();
        let cached = slot.session.reuse_prefix(&job.prompt);
        let logits = match slot.session.forward(&job.prompt[cached..]) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("req {} {}: prompt failed: {e}", job.id, job.kind);
                slot.session.reset();
                let _ = job.events.send(Event::Failed(e.to_string()));
                return;
            }
        };
        let usage = Usage {
            prompt_tokens: job.prompt.len(),
            cached_tokens: cached,
            prefill_s: started.elapsed().as_secs_f64(),
            ..Usage::default()
        };
        Metrics::add(&self.metrics.slots_busy, 1);
        slot.active = Some(Active {
            stop: StopMatcher::new(job.stop.clone()),
            job,
            sampler,
            logits,
            decoder: StreamDecoder::new(self.tok),
            usage,
            started,
            decode_start: Instant::now(),
        });
    }

    /// One token for slot `i` if it is active; frees the slot when its job ends.
    fn step_slot(&mut self, i: usize) {
        let tok = self.tok;
        let slot = &mut self.slots[i];
        let Some(a) = slot.active.as_mut() else { return };
        let outcome = step(a, &mut slot.session, tok);
        let finish = match outcome {
            Ok(None) => return,
            Ok(Some(f)) => f,
            Err(e) => {
                let _ = a.job.events.send(Event::Failed(e.clone()));
                eprintln!("req {} {}: failed: {e}", a.job.id, a.job.kind);
                Metrics::sub(&self.metrics.slots_busy, 1);
                slot.active = None;
                return;
            }
        };
        let Some(mut a) = slot.active.take() else { return };
        a.usage.decode_s = a.decode_start.elapsed().as_secs_f64();
        let u = a.usage;
        let m = &self.metrics;
        Metrics::sub(&m.slots_busy, 1);
        Metrics::add(&m.requests, 1);
        Metrics::add(&m.prompt_tokens, u.prompt_tokens as u64);
        Metrics::add(&m.cached_tokens, u.cached_tokens as u64);
        Metrics::add(&m.generated_tokens, u.completion_tokens as u64);
        Metrics::add(&m.prefill_us, (u.prefill_s * 1e6) as u64);
        Metrics::add(&m.decode_steps, u.completion_tokens.saturating_sub(1) as u64);
        Metrics::add(&m.decode_us, (u.decode_s * 1e6) as u64);
        let how = match finish {
            Finish::Stop => "stop",
            Finish::Length => "length",
            Finish::Cancelled => {
                Metrics::add(&m.requests_cancelled, 1);
                "interrupted (client disconnected)"
            }
        };
        eprintln!(
            "req {} {} slot {i}: prompt {} tok (cached {}), prefill {:.1} tok/s, {} tok out, decode {:.1} tok/s, \
             total {:.2} s, {how}",
            a.job.id,
            a.job.kind,
            u.prompt_tokens,
            u.cached_tokens,
            u.prefill_tok_s(),
            u.completion_tokens,
            u.decode_tok_s(),
            a.started.elapsed().as_secs_f64(),
        );
        let _ = a.job.events.send(Event::Done { finish, usage: u });
    }
}

/// How much a free slot suits a prompt (higher is better). A slot whose cache the prompt
/// continues (at least 3/4 of it shared: the next turn of its conversation) wins by shared
/// length; otherwise an empty slot, so a new conversation does not evict one that may come
/// back; otherwise the longest shared prefix, then the least recently used.
fn slot_preference(
    session: &Session<CpuBackend>,
    prompt: &[u32],
    last_used: u64,
) -> (bool, usize, bool, usize, std::cmp::Reverse<u64>) {
    let cached = session.tokens().len();
    let lcp = session.common_prefix(prompt);
    let continues = cached > 0 && lcp * 4 >= cached * 3;
    (
        continues,
        if continues { lcp } else { 0 },
        cached == 0,
        lcp,
        std::cmp::Reverse(last_used),
    )
}

/// Sample one token for an active job, report it, and evaluate it unless the job ends.
fn step(a: &mut Active, session: &mut Session<CpuBackend>, tok: &Tokenizer) -> Result<Option<Finish>, String> {
    if a.job.cancel.load(Ordering::Relaxed) {
        return Ok(Some(Finish::Cancelled));
    }
    let token = a.sampler.sample(&a.logits, session.tokens());
    a.usage.completion_tokens += 1;
    if tok.is_eog(token) {
        let mut text = a.stop.push(&a.decoder.finish()).0;
        text.push_str(&a.stop.finish());
        if !text.is_empty() {
            let _ = a.job.events.send(Event::Token { text, logprob: None });
        }
        return Ok(Some(Finish::Stop));
    }
    let logprob = a.job.logprobs.map(|k| token_logprob(&a.logits, token, k, tok));
    let piece = a.decoder.push(token).unwrap_or_default();
    let (mut text, matched) = a.stop.push(&piece);
    let out_of_budget = a.usage.completion_tokens >= a.job.max_tokens || session.pos() >= session.n_ctx();
    if out_of_budget && !matched {
        // Nothing follows: held text (partial character, partial stop string) is output.
        let (more, hit) = a.stop.push(&a.decoder.finish());
        text.push_str(&more);
        if !hit {
            text.push_str(&a.stop.finish());
        }
    }
    if a.job.events.send(Event::Token { text, logprob }).is_err() {
        return Ok(Some(Finish::Cancelled));
    }
    if matched {
        return Ok(Some(Finish::Stop));
    }
    if out_of_budget {
        return Ok(Some(Finish::Length));
    }
    a.logits = session.forward(&[token]).map_err(|e| e.to_string())?;
    Ok(None)
}

/// The model's log-probability of `token` (before sampling settings) and the top `k`.
fn token_logprob(logits: &[f32], token: u32, k: usize, tok: &Tokenizer) -> TokenLogprob {
    let max = logits
        .iter()
        .copied()
        .filter(|l| !l.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits
        .iter()
        .filter(|l| !l.is_nan())
        .map(|&l| f64::from(l - max).exp())
        .sum();
    let log_z = f64::from(max) + sum.ln();
    let logit = logits.get(token as usize).copied().unwrap_or(f32::NEG_INFINITY);
    let piece = |id: u32| tok.token_to_piece(id).unwrap_or_default();
    TokenLogprob {
        piece: piece(token),
        logprob: (f64::from(logit) - log_z) as f32,
        top: log_softmax_top_k(logits, k)
            .into_iter()
            .map(|(id, lp)| (piece(id), lp))
            .collect(),
    }
}
