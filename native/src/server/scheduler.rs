//! The engine task: one OS thread owns the model and every slot's session (the model is
//! CPU-bound, so it must not run on the async workers). Handlers talk to it only through
//! messages: a bounded queue of [`Job`]s in, a channel of [`Event`]s per job out.
//!
//! Each of the `--parallel` slots keeps its own [`Session`], so prefix reuse works per slot: a
//! new job goes to the free slot sharing the longest prefix with its prompt (else the least
//! recently used one).
//!
//! Continuous batching: every engine step is ONE forward pass ([`forward_batch`]) holding the
//! next token of every decoding slot plus up to `--prefill-chunk` prompt tokens of slots still
//! prefilling (oldest first). The weight matmuls thus see all active sequences at once, and a
//! long new prompt is evaluated in chunks between decode steps instead of stalling the running
//! streams until it is done.

use super::errors::ApiError;
use super::metrics::Metrics;
use super::stop::StopMatcher;
use crate::cli::engine::AnyBackend;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tinyllm::engine::{forward_batch, forward_batch_candidates, BatchItem, Session, SessionConfig};
use tinyllm::model::{Model, Scratch};
use tinyllm::sample::{log_softmax_top_k, Candidates, Plan, Sampler, SamplerConfig};
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
    /// When not empty, the answer must begin with one of these token sequences: the next
    /// tokens are masked to those that keep it on one of them (`tool_choice: "required"`
    /// picking among the declared tool names).
    pub must_start: Vec<Vec<u32>>,
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
        model: Arc<Model<AnyBackend>>,
        tokenizer: Arc<Tokenizer>,
        slots: usize,
        n_ctx: usize,
        queue: usize,
        prefill_chunk: usize,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Scheduler> {
        let mut sessions = Vec::with_capacity(slots);
        for _ in 0..slots {
            // Every pass goes through the shared batch scratch below, so the session's own
            // scratch only needs one row.
            sessions.push(Session::new(
                model.clone(),
                SessionConfig {
                    n_ctx,
                    n_batch: 1,
                    n_logit_rows: 1,
                },
            )?);
        }
        let prefill_chunk = prefill_chunk.max(1);
        // One pass holds a decode row per slot plus one prefill chunk.
        let scratch = Scratch::new(&model, slots + prefill_chunk, slots)?;
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
                scratch,
                prefill_chunk,
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
    session: Session<AnyBackend>,
    active: Option<Active<'t>>,
    /// Engine clock at the last assignment (least recently used wins ties; oldest job
    /// prefills first).
    last_used: u64,
}

/// A job running in a slot.
struct Active<'t> {
    job: Job,
    sampler: Sampler,
    phase: Phase,
    decoder: StreamDecoder<'t>,
    stop: StopMatcher,
    usage: Usage,
    started: Instant,
}

enum Phase {
    /// Prompt tokens from `session.pos()` on are still to be evaluated.
    Prefill,
    /// Generating; `next` is what the last pass gave for the next token.
    Decode { next: Head, decode_start: Instant },
}

/// A pass's output for one slot: the next token's logits, or only its sampler candidates
/// (when no slot of the pass needs logits: no logprobs, no forced start). A GPU then reads back
/// a few hundred bytes per slot; the CPU skips copying a vocabulary of logits per slot.
enum Head {
    Logits(Vec<f32>),
    /// The candidates for the pass's plan (the union of its slots' plans).
    Candidates(Candidates, Arc<Plan>),
}

/// What a slot puts into the next pass.
struct Feed {
    slot: usize,
    tokens: Vec<u32>,
    /// Whether this pass ends the prompt (then the slot needs the last token's logits).
    last: bool,
}

struct Engine<'t> {
    tok: &'t Tokenizer,
    slots: Vec<Slot<'t>>,
    metrics: Arc<Metrics>,
    clock: u64,
    /// Activations of one batched pass: `slots + prefill_chunk` rows.
    scratch: Scratch<AnyBackend>,
    /// Most prompt tokens evaluated per pass.
    prefill_chunk: usize,
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
            self.step();
        }
    }

    /// Put a job in the best free slot; its prompt is evaluated by the following passes.
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
        let cached = slot.session.reuse_prefix(&job.prompt);
        let usage = Usage {
            prompt_tokens: job.prompt.len(),
            cached_tokens: cached,
            ..Usage::default()
        };
        Metrics::add(&self.metrics.slots_busy, 1);
        slot.active = Some(Active {
            stop: StopMatcher::new(job.stop.clone()),
            job,
            sampler,
            phase: Phase::Prefill,
            decoder: StreamDecoder::new(self.tok),
            usage,
            started: Instant::now(),
        });
    }

    /// One engine step: sample a token for every decoding slot, then run one forward pass over
    /// those tokens and the next prompt chunk(s).
    fn step(&mut self) {
        let tok = self.tok;
        let mut feeds = Vec::new();
        for i in 0..self.slots.len() {
            let slot = &mut self.slots[i];
            let Some(a) = slot.active.as_mut() else { continue };
            let outcome = match &a.phase {
                Phase::Decode { .. } => sample(a, &slot.session, tok),
                Phase::Prefill if a.job.cancel.load(Ordering::Relaxed) => Err(Finish::Cancelled),
                Phase::Prefill => continue,
            };
            match outcome {
                Ok(token) => feeds.push(Feed {
                    slot: i,
                    tokens: vec![token],
                    last: true,
                }),
                Err(finish) => self.finish(i, finish),
            }
        }
        // Prompt chunks, oldest job first, within the per-pass budget.
        let mut prefilling: Vec<usize> = (0..self.slots.len())
            .filter(|&i| {
                matches!(
                    self.slots[i].active,
                    Some(Active {
                        phase: Phase::Prefill,
                        ..
                    })
                )
            })
            .collect();
        prefilling.sort_by_key(|&i| self.slots[i].last_used);
        let mut budget = self.prefill_chunk;
        for i in prefilling {
            if budget == 0 {
                break;
            }
            let slot = &self.slots[i];
            let Some(a) = &slot.active else { continue };
            let rest = &a.job.prompt[slot.session.pos()..];
            let n = rest.len().min(budget);
            budget -= n;
            feeds.push(Feed {
                slot: i,
                tokens: rest[..n].to_vec(),
                last: n == rest.len(),
            });
        }
        if feeds.is_empty() {
            return;
        }
        let plan = self.pass_plan(&feeds).map(Arc::new);
        Metrics::add(&self.metrics.passes, 1);
        if plan.is_some() {
            Metrics::add(&self.metrics.candidate_passes, 1);
        }
        Metrics::add(&self.metrics.pass_sequences, feeds.len() as u64);
        Metrics::max(&self.metrics.pass_sequences_max, feeds.len() as u64);
        let result = {
            let mut sessions: Vec<Option<&mut Session<AnyBackend>>> =
                self.slots.iter_mut().map(|s| Some(&mut s.session)).collect();
            let mut items: Vec<BatchItem<'_, AnyBackend>> = feeds
                .iter()
                .filter_map(|f| {
                    Some(BatchItem {
                        session: sessions[f.slot].take()?,
                        tokens: &f.tokens,
                        n_last: usize::from(f.last),
                    })
                })
                .collect();
            match &plan {
                Some(plan) => forward_batch_candidates(&mut self.scratch, &mut items, plan).map(|c| {
                    c.into_iter()
                        .map(|mut rows| rows.pop().map(|c| Head::Candidates(c, Arc::clone(plan))))
                        .collect::<Vec<_>>()
                }),
                None => forward_batch(&mut self.scratch, &mut items)
                    .map(|l| l.into_iter().map(|l| Some(Head::Logits(l))).collect()),
            }
        };
        let heads = match result {
            Ok(h) => h,
            Err(e) => {
                for f in &feeds {
                    self.fail(f.slot, &e.to_string());
                }
                return;
            }
        };
        for (f, head) in feeds.iter().zip(heads) {
            let Some(next) = head else { continue };
            let Some(a) = self.slots[f.slot].active.as_mut() else {
                continue;
            };
            if !f.last {
                continue;
            }
            match &mut a.phase {
                Phase::Decode { next: n, .. } => *n = next,
                Phase::Prefill => {
                    a.usage.prefill_s = a.started.elapsed().as_secs_f64();
                    a.phase = Phase::Decode {
                        next,
                        decode_start: Instant::now(),
                    };
                }
            }
        }
    }

    /// The candidates plan of a pass: the union of its sampling slots' plans (largest k, all
    /// gather ids), or `None` when one of them needs the logits (logprobs, a forced start, or
    /// sampling with top-k off).
    fn pass_plan(&self, feeds: &[Feed]) -> Option<Plan> {
        let mut k = 0;
        let mut gather = Vec::new();
        for f in feeds.iter().filter(|f| f.last) {
            let slot = &self.slots[f.slot];
            let a = slot.active.as_ref()?;
            if a.job.logprobs.is_some() || !a.job.must_start.is_empty() {
                return None;
            }
            let p = a.sampler.plan_after(slot.session.tokens(), &f.tokens)?;
            k = k.max(p.k);
            gather.extend(p.gather);
        }
        gather.sort_unstable();
        gather.dedup();
        (k > 0).then_some(Plan { k, gather })
    }

    /// End slot `i`'s job with an error; its cache is dropped (it may hold a partial pass).
    fn fail(&mut self, i: usize, msg: &str) {
        let slot = &mut self.slots[i];
        let Some(a) = slot.active.take() else { return };
        slot.session.reset();
        let _ = a.job.events.send(Event::Failed(msg.to_string()));
        eprintln!("req {} {}: failed: {msg}", a.job.id, a.job.kind);
        Metrics::sub(&self.metrics.slots_busy, 1);
    }

    /// End slot `i`'s job: count it, log it, tell the client, and free the slot.
    fn finish(&mut self, i: usize, finish: Finish) {
        let Some(mut a) = self.slots[i].active.take() else {
            return;
        };
        if let Phase::Decode { decode_start, .. } = a.phase {
            a.usage.decode_s = decode_start.elapsed().as_secs_f64();
        }
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
    session: &Session<AnyBackend>,
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

/// Sample the next token of a decoding job and report it: the token to evaluate next, or why
/// the job ends.
fn sample(a: &mut Active, session: &Session<AnyBackend>, tok: &Tokenizer) -> Result<u32, Finish> {
    if a.job.cancel.load(Ordering::Relaxed) {
        return Err(Finish::Cancelled);
    }
    let Phase::Decode { next, .. } = &a.phase else {
        return Err(Finish::Cancelled);
    };
    let logits = match next {
        Head::Logits(l) => l,
        Head::Candidates(c, plan) => {
            // Candidates only come when nothing below needs the logits.
            let token = a.sampler.sample_candidates(c, plan, session.tokens());
            return emit(a, session, tok, token, None);
        }
    };
    let token = if a.job.must_start.is_empty() {
        a.sampler.sample(logits, session.tokens())
    } else {
        let k = a.usage.completion_tokens;
        let mut masked = vec![f32::NEG_INFINITY; logits.len()];
        for seq in &a.job.must_start {
            if let Some(&t) = seq.get(k).filter(|&&t| (t as usize) < logits.len()) {
                masked[t as usize] = logits[t as usize];
            }
        }
        let token = a.sampler.sample(&masked, session.tokens());
        // Keep the sequences still followed; once one is complete the answer is free.
        let done = a.job.must_start.iter().any(|q| q.len() == k + 1 && q[k] == token);
        a.job.must_start.retain(|q| q.len() > k + 1 && q[k] == token);
        if done {
            a.job.must_start.clear();
        }
        token
    };
    let logprob = a.job.logprobs.map(|k| token_logprob(logits, token, k, tok));
    emit(a, session, tok, token, logprob)
}

/// Report `token`, sampled for a decoding job: the token to evaluate next, or why the job ends.
fn emit(
    a: &mut Active,
    session: &Session<AnyBackend>,
    tok: &Tokenizer,
    token: u32,
    logprob: Option<TokenLogprob>,
) -> Result<u32, Finish> {
    a.usage.completion_tokens += 1;
    if tok.is_eog(token) {
        let mut text = a.stop.push(&a.decoder.finish()).0;
        text.push_str(&a.stop.finish());
        if !text.is_empty() {
            let _ = a.job.events.send(Event::Token { text, logprob: None });
        }
        return Err(Finish::Stop);
    }
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
        return Err(Finish::Cancelled);
    }
    if matched {
        return Err(Finish::Stop);
    }
    if out_of_budget {
        return Err(Finish::Length);
    }
    Ok(token)
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
