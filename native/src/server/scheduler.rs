//! The engine task: one OS thread owns the model and every slot's session (the model is
//! CPU-bound, so it must not run on the async workers). Handlers talk to it only through
//! messages: a bounded queue of [`Job`]s in, a channel of [`Event`]s per job out.
//!
//! Each of the `--parallel` slots keeps its own [`Session`], so prefix reuse works per slot: a
//! new job goes to the free slot whose state can reuse the longest prefix of its prompt (else
//! the least recently used one).
//!
//! Continuous batching: every engine step is ONE forward pass ([`forward_batch`]) holding the
//! next token of every decoding slot plus up to `--prefill-chunk` prompt tokens of slots still
//! prefilling (oldest first). The weight matmuls thus see all active sequences at once, and a
//! long new prompt is evaluated in chunks between decode steps instead of stalling the running
//! streams until it is done. What happens to each sequence's result (sampling, stop strings,
//! detokenizing, routing, usage) is the library's [`Generation`], as for the CLI.

use super::errors::ApiError;
use super::metrics::Metrics;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tinyllm::backend::{AnyBackend, KvType};
use tinyllm::engine::{
    embed, forward_batch, head_of, BatchItem, EmbedLimits, Embedding, Engine, Finish, Generation, Head, Pooling,
    Prepared, Session, SessionConfig, Settings, Step, Usage, Want,
};
use tokio::sync::{mpsc, oneshot};

/// One generation request, ready for the engine (prompt prepared and checked).
pub struct Job {
    pub id: u64,
    /// For the log line: `chat` or `completion`.
    pub kind: &'static str,
    pub prepared: Prepared,
    pub settings: Settings,
    /// Set when the client goes away; checked before every step.
    pub cancel: Arc<AtomicBool>,
    pub events: mpsc::UnboundedSender<Event>,
}

/// An embeddings request, ready for the engine (inputs tokenized and checked). It needs no slot:
/// the engine runs it whole between two passes of the running streams.
pub struct EmbedJob {
    pub id: u64,
    pub inputs: Vec<Vec<u32>>,
    pub pooling: Pooling,
    /// Set when the client goes away; checked before the job starts.
    pub cancel: Arc<AtomicBool>,
    pub reply: oneshot::Sender<Result<Vec<Embedding>, String>>,
}

/// Most tokens per pass of an embeddings job: a prompt-sized batch, as llama.cpp's `-ub`.
const EMBED_BATCH: usize = 512;

/// What the engine reports for a job.
#[derive(Debug, Clone)]
pub enum Event {
    /// One generated token and what it decided of the answer.
    Step(Step),
    Done {
        finish: Finish,
        usage: Usage,
    },
    Failed(String),
}

/// The handlers' side of the engine.
pub struct Scheduler {
    tx: mpsc::Sender<Job>,
    embed_tx: mpsc::Sender<EmbedJob>,
    queue: usize,
    slots: usize,
    /// The engine thread ([`Scheduler::stop`] joins it).
    thread: Option<std::thread::JoinHandle<()>>,
}

/// How the scheduler sizes its slots and queue.
#[derive(Debug, Clone, Copy)]
pub struct SlotConfig {
    /// Sequences generated at the same time.
    pub slots: usize,
    /// Context per slot, in tokens.
    pub n_ctx: usize,
    /// Jobs that may wait for a slot.
    pub queue: usize,
    /// Most prompt tokens per engine pass.
    pub prefill_chunk: usize,
    /// Recurrent-state checkpoints per slot (hybrid models).
    pub checkpoints: usize,
    /// Each slot's KV cache format.
    pub cache_type: KvType,
}

impl Scheduler {
    /// Allocate the slots' sessions (so a context too big for memory fails at startup) and
    /// start the engine thread.
    pub fn start(engine: Engine<AnyBackend>, c: SlotConfig, metrics: Arc<Metrics>) -> anyhow::Result<Scheduler> {
        let SlotConfig {
            slots,
            n_ctx,
            queue,
            prefill_chunk,
            checkpoints,
            cache_type,
        } = c;
        let mut sessions = Vec::with_capacity(slots);
        for _ in 0..slots {
            // Every pass goes through the shared batch scratch below, so the session's own
            // scratch only needs one row.
            let mut session = Session::new(
                engine.model.clone(),
                SessionConfig {
                    n_ctx,
                    n_batch: 1,
                    n_logit_rows: 1,
                    cache_type,
                },
            )?;
            session.set_checkpoint_limit(checkpoints);
            sessions.push(session);
        }
        let prefill_chunk = prefill_chunk.max(1);
        // One pass holds a decode row per slot plus one prefill chunk.
        let scratch = engine.model.scratch(slots + prefill_chunk, slots)?;
        let (tx, rx) = mpsc::channel(queue.max(1));
        let (embed_tx, embed_rx) = mpsc::channel(queue.max(1));
        let thread = std::thread::Builder::new().name("engine".into()).spawn(move || {
            let mut run = Loop {
                engine: &engine,
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
                // A test hook: the drain tests signal the server while streams certainly still
                // run (the fixture decodes thousands of tokens a second, faster than a test
                // thread on a busy machine reacts).
                step_delay: super::test_hooks::test_delay("TINYLLM_TEST_STEP_DELAY_MS"),
            };
            run.run(rx, embed_rx);
        })?;
        Ok(Scheduler {
            tx,
            embed_tx,
            queue: queue.max(1),
            slots,
            thread: Some(thread),
        })
    }

    /// Queue a job; a full queue is a 503 the client may retry.
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        self.tx.try_send(job).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => ApiError::overloaded(self.queue),
            mpsc::error::TrySendError::Closed(_) => ApiError::internal("the engine has stopped"),
        })
    }

    /// Queue an embeddings job; a full queue is a 503 the client may retry.
    pub fn submit_embed(&self, job: EmbedJob) -> Result<(), ApiError> {
        self.embed_tx.try_send(job).map_err(|e| match e {
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

impl Scheduler {
    /// Close the queues (the engine thread ends once its running jobs are done) and wait for
    /// the thread, so an unloaded model's memory is given back before another takes its room.
    /// Blocks: not for the async workers.
    pub fn stop(&mut self) {
        let (closed, _) = mpsc::channel(1);
        drop(std::mem::replace(&mut self.tx, closed));
        let (closed, _) = mpsc::channel(1);
        drop(std::mem::replace(&mut self.embed_tx, closed));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
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
    id: u64,
    kind: &'static str,
    events: mpsc::UnboundedSender<Event>,
    cancel: Arc<AtomicBool>,
    gen: Generation<'t>,
    /// The output head's result for the next token, once the prompt is evaluated.
    next: Option<Head>,
    started: Instant,
}

/// What a slot puts into the next pass.
struct Feed {
    slot: usize,
    tokens: Vec<u32>,
    /// Whether the pass ends with this slot's next token to sample (a decode step, or the
    /// prompt's last chunk).
    last: bool,
}

struct Loop<'t> {
    engine: &'t Engine<AnyBackend>,
    slots: Vec<Slot<'t>>,
    metrics: Arc<Metrics>,
    clock: u64,
    /// Activations of one batched pass: `slots + prefill_chunk` rows.
    scratch: tinyllm::model::Scratch<AnyBackend>,
    /// Most prompt tokens evaluated per pass.
    prefill_chunk: usize,
    /// A pause after every pass; zero unless a test asks for it.
    step_delay: Duration,
}

impl<'t> Loop<'t> {
    fn run(&mut self, mut rx: mpsc::Receiver<Job>, mut embed_rx: mpsc::Receiver<EmbedJob>) {
        // Waiting for either kind of work when idle.
        let Ok(idle) = tokio::runtime::Builder::new_current_thread().build() else {
            eprintln!("engine: cannot start its wait loop");
            return;
        };
        enum Work {
            Generate(Box<Job>),
            Embed(EmbedJob),
        }
        loop {
            // Embeddings need no slot: each runs whole before the next pass.
            while let Ok(job) = embed_rx.try_recv() {
                self.embed(job);
            }
            // Fill free slots: block for work only when nothing is running.
            while self.slots.iter().any(|s| s.active.is_none()) {
                let busy = self.slots.iter().any(|s| s.active.is_some());
                let work = if busy {
                    match rx.try_recv() {
                        Ok(job) => Work::Generate(Box::new(job)),
                        Err(_) => break,
                    }
                } else {
                    let next = idle.block_on(async {
                        tokio::select! {
                            job = rx.recv() => job.map(|j| Work::Generate(Box::new(j))),
                            job = embed_rx.recv() => job.map(Work::Embed),
                        }
                    });
                    match next {
                        Some(work) => work,
                        None => return,
                    }
                };
                match work {
                    Work::Generate(job) => self.admit(*job),
                    Work::Embed(job) => self.embed(job),
                }
            }
            if self.slots.iter().all(|s| s.active.is_none()) {
                continue;
            }
            self.step();
            if !self.step_delay.is_zero() {
                std::thread::sleep(self.step_delay);
            }
        }
    }

    /// Run an embeddings job whole (its own sequence states and scratch) and send the vectors.
    fn embed(&mut self, job: EmbedJob) {
        if job.cancel.load(Ordering::Relaxed) {
            eprintln!(
                "req {} embeddings: interrupted while queued (client disconnected)",
                job.id
            );
            Metrics::add(&self.metrics.requests_cancelled, 1);
            return;
        }
        let started = Instant::now();
        let n_ctx = self.slots.first().map_or(0, |s| s.session.n_ctx());
        let limits = EmbedLimits {
            n_batch: EMBED_BATCH,
            n_ctx,
        };
        let result = embed(&self.engine.model, &job.inputs, job.pooling, limits).map_err(|e| e.to_string());
        let tokens: usize = job.inputs.iter().map(Vec::len).sum();
        eprintln!(
            "req {} embeddings: {} inputs, {tokens} tokens, {:.0} ms",
            job.id,
            job.inputs.len(),
            started.elapsed().as_secs_f64() * 1e3
        );
        let _ = job.reply.send(result);
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
            .max_by_key(|(_, s)| slot_preference(&s.session, &job.prepared.prompt, s.last_used))
            .map(|(i, _)| i)
        else {
            return;
        };
        self.clock += 1;
        let slot = &mut self.slots[i];
        slot.last_used = self.clock;
        let started = Instant::now();
        let cached = slot.session.reuse_prefix(&job.prepared.prompt);
        let gen = cached
            .and_then(|cached| {
                let mut gen = self.engine.generation(job.prepared, job.settings)?;
                gen.set_cached(cached);
                Ok(gen)
            })
            .map_err(|e| e.to_string());
        let gen = match gen {
            Ok(g) => g,
            Err(e) => {
                let _ = job.events.send(Event::Failed(e));
                return;
            }
        };
        Metrics::add(&self.metrics.slots_busy, 1);
        slot.active = Some(Active {
            id: job.id,
            kind: job.kind,
            events: job.events,
            cancel: job.cancel,
            gen,
            next: None,
            started,
        });
    }

    /// One engine step: sample a token for every decoding slot, then run one forward pass over
    /// those tokens and the next prompt chunk(s).
    fn step(&mut self) {
        let mut feeds = Vec::new();
        for i in 0..self.slots.len() {
            let slot = &mut self.slots[i];
            let Some(a) = slot.active.as_mut() else { continue };
            if a.cancel.load(Ordering::Relaxed) {
                self.finish(i, Finish::Cancelled);
                continue;
            }
            let Some(head) = a.next.take() else { continue };
            let outcome = a.gen.step(head, slot.session.tokens(), slot.session.n_ctx());
            let step = match outcome {
                Ok(step) => step,
                Err(e) => {
                    self.fail(i, &e.to_string());
                    continue;
                }
            };
            let (token, finish) = (step.token, step.finish);
            if a.events.send(Event::Step(step)).is_err() {
                self.finish(i, Finish::Cancelled);
                continue;
            }
            match (finish, token) {
                (Some(f), _) => self.finish(i, f),
                (None, Some(t)) => feeds.push(Feed {
                    slot: i,
                    tokens: vec![t],
                    last: true,
                }),
                (None, None) => self.fail(i, "a step without a token"),
            }
        }
        // Prompt chunks, oldest job first, within the per-pass budget.
        let mut prefilling: Vec<usize> = (0..self.slots.len())
            .filter(|&i| {
                let s = &self.slots[i];
                s.active
                    .as_ref()
                    .is_some_and(|a| a.next.is_none() && s.session.pos() < a.gen.prompt().len())
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
            let rest = &a.gen.prompt()[slot.session.pos()..];
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
        // One head for the pass: the logits if a slot needs them, else the union of the
        // slots' candidate plans (or the argmax when all are plain greedy).
        let wants: Vec<Want> = feeds
            .iter()
            .filter(|f| f.last)
            .filter_map(|f| {
                let s = &self.slots[f.slot];
                Some(s.active.as_ref()?.gen.want(s.session.tokens(), &f.tokens))
            })
            .collect();
        let want = Want::union(&wants);
        let m = &self.metrics;
        Metrics::add(&m.passes, 1);
        if want != Want::Logits {
            Metrics::add(&m.candidate_passes, 1);
        }
        Metrics::add(&m.pass_sequences, feeds.len() as u64);
        Metrics::max(&m.pass_sequences_max, feeds.len() as u64);
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
            forward_batch(&mut self.scratch, &mut items, want.head()).and_then(|r| Ok(r.wait()?))
        };
        let (held, bytes) = self.slots.iter().fold((0, 0), |(n, b), s| {
            let (sn, sb) = s.session.checkpoint_stats();
            (n + sn, b + sb)
        });
        m.checkpoints.store(held as u64, Ordering::Relaxed);
        m.checkpoint_bytes.store(bytes as u64, Ordering::Relaxed);
        let kv: usize = self.slots.iter().map(|s| s.session.pos()).sum();
        m.kv_tokens.store(kv as u64, Ordering::Relaxed);
        let results = match result {
            Ok(r) => r,
            Err(e) => {
                for f in &feeds {
                    self.fail(f.slot, &e.to_string());
                }
                return;
            }
        };
        for (f, result) in feeds.iter().zip(results) {
            if !f.last {
                continue;
            }
            match head_of(result, &want) {
                Ok(head) => {
                    if let Some(a) = self.slots[f.slot].active.as_mut() {
                        a.next = Some(head);
                    }
                }
                Err(e) => self.fail(f.slot, &e.to_string()),
            }
        }
    }

    /// End slot `i`'s job with an error; its cache is dropped (it may hold a partial pass).
    fn fail(&mut self, i: usize, msg: &str) {
        let slot = &mut self.slots[i];
        let Some(a) = slot.active.take() else { return };
        slot.session.reset();
        let _ = a.events.send(Event::Failed(msg.to_string()));
        eprintln!("req {} {}: failed: {msg}", a.id, a.kind);
        Metrics::sub(&self.metrics.slots_busy, 1);
    }

    /// End slot `i`'s job: count it, log it, tell the client, and free the slot.
    fn finish(&mut self, i: usize, finish: Finish) {
        let Some(mut a) = self.slots[i].active.take() else {
            return;
        };
        if finish == Finish::Cancelled {
            a.gen.cancel_step();
        }
        let u = a.gen.usage();
        let m = &self.metrics;
        Metrics::sub(&m.slots_busy, 1);
        Metrics::add(&m.requests, 1);
        Metrics::add(&m.prompt_tokens, u.prompt_tokens as u64);
        Metrics::add(&m.cached_tokens, u.cached_tokens as u64);
        Metrics::add(&m.generated_tokens, u.completion_tokens as u64);
        Metrics::add(&m.prefill_us, (u.prefill_s * 1e6) as u64);
        Metrics::add(&m.decode_steps, u.completion_tokens.saturating_sub(1) as u64);
        Metrics::add(&m.decode_us, (u.decode_s * 1e6) as u64);
        if u.completion_tokens > 0 {
            m.time_to_first_token.observe(u.prefill_s);
        }
        let how = match finish {
            Finish::EndOfGeneration | Finish::StopString => "stop",
            Finish::Length | Finish::ContextFull => "length",
            Finish::Cancelled => {
                Metrics::add(&m.requests_cancelled, 1);
                "interrupted (client disconnected)"
            }
        };
        eprintln!(
            "req {} {} slot {i}: prompt {} tok (cached {}), prefill {:.1} tok/s, {} tok out, decode {:.1} tok/s, \
             total {:.2} s, {how}",
            a.id,
            a.kind,
            u.prompt_tokens,
            u.cached_tokens,
            u.prefill_tok_s(),
            u.completion_tokens,
            u.decode_tok_s(),
            a.started.elapsed().as_secs_f64(),
        );
        let _ = a.events.send(Event::Done { finish, usage: u });
    }
}

/// How much a free slot suits a prompt (higher is better). A slot whose state the prompt
/// continues (at least 3/4 of it reusable: the next turn of its conversation) wins by reusable
/// length; otherwise an empty slot, so a new conversation does not evict one that may come
/// back; otherwise the longest reusable prefix, then the least recently used.
fn slot_preference(
    session: &Session<AnyBackend>,
    prompt: &[u32],
    last_used: u64,
) -> (bool, usize, bool, usize, std::cmp::Reverse<u64>) {
    let cached = session.tokens().len();
    let reusable = session.reusable_prefix(prompt);
    let continues = cached > 0 && reusable * 4 >= cached * 3;
    (
        continues,
        if continues { reusable } else { 0 },
        cached == 0,
        reusable,
        std::cmp::Reverse(last_used),
    )
}
