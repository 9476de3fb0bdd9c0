//! Several models behind one server: the request's `model` picks one, and models load on first
//! use and are unloaded, least recently used first, to stay under `--max-loaded` and
//! `--memory-budget`.
//!
//! A handler holds a [`Lease`] on its model for as long as its answer runs (a stream until its
//! last event): a model with a lease out is never unloaded, and a load that needs the room waits
//! for one to end (at most [`Limits::wait`]). Each loaded model is a [`Served`]: its engine, its
//! own `--parallel` slots on its own engine thread, and its metrics (kept across reloads, so the
//! counters of `/metrics` never go back).
//!
//! Routing: with one model, every request goes to it whatever its `model` says (clients such
//! as agents send their own model names, as they do to llama-server); with several, an unknown
//! name is a 404 `model_not_found` listing the known ones, and a request without `model` goes
//! to the first.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tinyllm::backend::AnyBackend;
use tinyllm::engine::{Engine, Pooling};
use tokio::sync::Notify;

use super::errors::ApiError;
use super::metrics::Metrics;
use super::scheduler::Scheduler;

/// A loaded model.
pub struct Served {
    pub scheduler: Scheduler,
    /// The model with its tokenizer and template (the scheduler runs a clone of it).
    pub engine: Engine<AnyBackend>,
    pub name: String,
    /// Context per slot, in tokens.
    pub n_ctx: usize,
    pub n_vocab: usize,
    /// How `/v1/embeddings` pools.
    pub pooling: Pooling,
    pub metrics: Arc<Metrics>,
}

/// A model the server can serve: its name in the API and what its loader needs.
pub struct Spec {
    pub name: String,
    /// The GGUF file (resolved at startup: a wrong name fails before anything listens).
    pub path: std::path::PathBuf,
    /// Bytes it takes loaded: weights, every slot's KV cache and state, activations,
    /// tokenizer (`tinyllm::model::memory`).
    pub need: u64,
}

/// Places a model: weights, warm-up, engine thread. Runs on a blocking thread.
pub type Loader = dyn Fn(&Spec, Arc<Metrics>) -> anyhow::Result<Served> + Send + Sync;

/// What may stay loaded at once.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most models loaded at once (at least 1).
    pub max_loaded: usize,
    /// Most bytes the loaded models may need together (`None`: no budget).
    pub budget: Option<u64>,
    /// How long a load waits for a model in use to be done before answering 503.
    pub wait: Duration,
}

struct Entry {
    spec: Spec,
    metrics: Arc<Metrics>,
    /// The model while loaded.
    served: Mutex<Option<Arc<Served>>>,
    /// Held while the model loads, so concurrent first requests share one load.
    loading: tokio::sync::Mutex<()>,
    /// Leases out, and requests waiting for one.
    in_use: AtomicUsize,
    /// The registry's clock at the last lease (least recently used goes first).
    last_used: AtomicU64,
    loads: AtomicU64,
    load_us: AtomicU64,
    unloads: AtomicU64,
}

/// The models and what is loaded.
pub struct Registry {
    entries: Vec<Arc<Entry>>,
    limits: Limits,
    /// Which entries hold (or are taking) room, in the order of the books: a load reserves
    /// its room here before it starts.
    room: Mutex<Vec<usize>>,
    /// Signalled whenever a lease ends or a load gives its room back.
    freed: Arc<Notify>,
    clock: AtomicU64,
    loader: Arc<Loader>,
}

/// Counts one request as using its model, from before its model is looked up until the guard
/// drops: a model whose count is not zero is never unloaded.
struct InUse {
    entry: Arc<Entry>,
    freed: Arc<Notify>,
}

impl InUse {
    fn new(entry: &Arc<Entry>, freed: &Arc<Notify>) -> Self {
        entry.in_use.fetch_add(1, Ordering::SeqCst);
        InUse {
            entry: entry.clone(),
            freed: freed.clone(),
        }
    }
}

impl Drop for InUse {
    fn drop(&mut self) {
        self.entry.in_use.fetch_sub(1, Ordering::SeqCst);
        self.freed.notify_waiters();
    }
}

/// A handler's hold on a loaded model (see the module docs). Dereferences to the model.
pub struct Lease {
    // Declared first, so dropped first: once `in_use` says 0, no lease holds the model.
    served: Arc<Served>,
    in_use: InUse,
}

impl std::ops::Deref for Lease {
    type Target = Served;
    fn deref(&self) -> &Served {
        &self.served
    }
}

impl Clone for Lease {
    fn clone(&self) -> Self {
        Lease {
            served: self.served.clone(),
            in_use: InUse::new(&self.in_use.entry, &self.in_use.freed),
        }
    }
}

/// Why a lease was not given: the request's fault or the room's (an API error), or the load's.
enum Refused {
    Api(ApiError),
    Load(anyhow::Error),
}

/// One model's line of `/v1/models` and `/metrics`.
pub struct Status<'a> {
    pub name: &'a str,
    pub need: u64,
    pub metrics: &'a Metrics,
    pub served: Option<Arc<Served>>,
    pub loads: u64,
    pub load_seconds: f64,
    pub unloads: u64,
}

impl Registry {
    /// The models in `specs` (the first answers requests that name none); none loaded yet.
    pub fn new(specs: Vec<Spec>, limits: Limits, loader: Arc<Loader>) -> Registry {
        Registry {
            entries: specs
                .into_iter()
                .map(|spec| {
                    Arc::new(Entry {
                        spec,
                        metrics: Arc::new(Metrics::default()),
                        served: Mutex::new(None),
                        loading: tokio::sync::Mutex::new(()),
                        in_use: AtomicUsize::new(0),
                        last_used: AtomicU64::new(0),
                        loads: AtomicU64::new(0),
                        load_us: AtomicU64::new(0),
                        unloads: AtomicU64::new(0),
                    })
                })
                .collect(),
            limits: Limits {
                max_loaded: limits.max_loaded.max(1),
                ..limits
            },
            room: Mutex::new(Vec::new()),
            freed: Arc::new(Notify::new()),
            clock: AtomicU64::new(1),
            loader,
        }
    }

    /// The model a request's `model` field names (absent or null: the first).
    fn find(&self, requested: Option<&Value>) -> Result<usize, ApiError> {
        let name = match requested {
            None | Some(Value::Null) => return Ok(0),
            Some(Value::String(s)) => s,
            Some(_) => return Err(ApiError::bad_param("model", "model must be a string")),
        };
        if self.entries.len() == 1 {
            return Ok(0);
        }
        self.entries
            .iter()
            .position(|e| e.spec.name == *name)
            .ok_or_else(|| ApiError::model_not_found(name, &self.names()))
    }

    /// The models' names, in order.
    pub fn names(&self) -> Vec<&str> {
        self.entries.iter().map(|e| e.spec.name.as_str()).collect()
    }

    /// A lease on the model `requested` names, loading it first if it is not loaded.
    pub async fn lease(&self, requested: Option<&Value>) -> Result<Lease, ApiError> {
        let index = self.find(requested)?;
        self.lease_at(index).await.map_err(|e| match e {
            Refused::Api(e) => e,
            Refused::Load(e) => {
                ApiError::internal(format!("cannot load model '{}': {e:#}", self.entries[index].spec.name))
            }
        })
    }

    /// Load the first model (the server is ready once it is): its loader's error as it is, so
    /// the command exits as for any bad model.
    pub async fn load_first(&self) -> anyhow::Result<()> {
        match self.lease_at(0).await {
            Ok(_) => Ok(()),
            Err(Refused::Load(e)) => Err(e),
            Err(Refused::Api(e)) => Err(anyhow::anyhow!("{}", e.message)),
        }
    }

    async fn lease_at(&self, index: usize) -> Result<Lease, Refused> {
        let entry = &self.entries[index];
        let in_use = InUse::new(entry, &self.freed);
        entry
            .last_used
            .store(self.clock.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
        if let Some(served) = self.loaded(entry) {
            return Ok(Lease { served, in_use });
        }
        let _loading = entry.loading.lock().await;
        if let Some(served) = self.loaded(entry) {
            return Ok(Lease { served, in_use });
        }
        let unloaded = self.make_room(index).await.map_err(Refused::Api)?;
        let (loader, metrics) = (self.loader.clone(), entry.metrics.clone());
        let shared = entry.clone();
        let started = Instant::now();
        // The unloaded models go first (their threads joined, memory given back), then the
        // load: both block, so neither runs on the async workers.
        let placed = tokio::task::spawn_blocking(move || {
            stop_all(unloaded);
            loader(&shared.spec, metrics)
        })
        .await;
        let served = match placed {
            Ok(Ok(served)) => Arc::new(served),
            failed => {
                self.room.lock().unwrap().retain(|&i| i != index);
                self.freed.notify_waiters();
                return Err(Refused::Load(match failed {
                    Ok(Err(e)) => e,
                    _ => anyhow::anyhow!("its loading thread stopped"),
                }));
            }
        };
        Metrics::add(&entry.loads, 1);
        Metrics::add(&entry.load_us, started.elapsed().as_micros() as u64);
        eprintln!(
            "model {}: loaded in {:.2} s",
            entry.spec.name,
            started.elapsed().as_secs_f64()
        );
        *entry.served.lock().unwrap() = Some(served.clone());
        Ok(Lease { served, in_use })
    }

    fn loaded(&self, entry: &Entry) -> Option<Arc<Served>> {
        entry.served.lock().unwrap().clone()
    }

    /// Reserve room for entry `index`, taking out the least recently used idle models that
    /// stand in the way (returned, to be dropped off the async workers). Waits while the room
    /// is held by models in use.
    async fn make_room(&self, index: usize) -> Result<Vec<Arc<Served>>, ApiError> {
        let need = self.entries[index].spec.need;
        let deadline = tokio::time::Instant::now() + self.limits.wait;
        let mut unloaded = Vec::new();
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            {
                let mut room = self.room.lock().unwrap();
                loop {
                    let used: u64 = room.iter().map(|&i| self.entries[i].spec.need).sum();
                    let fits =
                        room.len() < self.limits.max_loaded && self.limits.budget.is_none_or(|b| used + need <= b);
                    if fits {
                        room.push(index);
                        return Ok(unloaded);
                    }
                    match self.idle_victim(&room) {
                        Some((at, served)) => {
                            let victim = &self.entries[room[at]];
                            Metrics::add(&victim.unloads, 1);
                            eprintln!("model {}: unloaded (least recently used, idle)", victim.spec.name);
                            room.remove(at);
                            unloaded.push(served);
                        }
                        None => break,
                    }
                }
            }
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                // Models already taken out for this load are stopped all the same.
                if !unloaded.is_empty() {
                    tokio::task::spawn_blocking(move || stop_all(unloaded));
                }
                let room = self.room.lock().unwrap();
                let busy: Vec<&str> = room.iter().map(|&i| self.entries[i].spec.name.as_str()).collect();
                return Err(ApiError::unavailable(
                    format!(
                        "cannot load model '{}' now: the loaded models ({}) are all in use and --max-loaded {} / --memory-budget leave no room; retry shortly",
                        self.entries[index].spec.name,
                        busy.join(", "),
                        self.limits.max_loaded
                    ),
                    "models_busy",
                ));
            }
        }
    }

    /// The least recently used model in `room` that no lease holds and no load is taking,
    /// taken out of its entry: its position in `room` and the model.
    fn idle_victim(&self, room: &[usize]) -> Option<(usize, Arc<Served>)> {
        let mut order: Vec<usize> = (0..room.len()).collect();
        order.sort_by_key(|&at| self.entries[room[at]].last_used.load(Ordering::Relaxed));
        order.into_iter().find_map(|at| {
            let e = &self.entries[room[at]];
            let _not_loading = e.loading.try_lock().ok()?;
            let mut served = e.served.lock().unwrap();
            if e.in_use.load(Ordering::SeqCst) != 0 {
                return None;
            }
            served.take().map(|s| (at, s))
        })
    }

    /// Requests holding or waiting for a model, over all models.
    pub fn in_use(&self) -> usize {
        self.entries.iter().map(|e| e.in_use.load(Ordering::SeqCst)).sum()
    }

    /// Every model's state, in order.
    pub fn statuses(&self) -> Vec<Status<'_>> {
        self.entries
            .iter()
            .map(|e| Status {
                name: &e.spec.name,
                need: e.spec.need,
                metrics: &e.metrics,
                served: self.loaded(e),
                loads: e.loads.load(Ordering::Relaxed),
                load_seconds: e.load_us.load(Ordering::Relaxed) as f64 / 1e6,
                unloads: e.unloads.load(Ordering::Relaxed),
            })
            .collect()
    }
}

/// Stop the engine threads of unloaded models (joined, so their memory is given back). Blocks:
/// not for the async workers.
fn stop_all(unloaded: Vec<Arc<Served>>) {
    for served in unloaded {
        // No lease holds an unloaded model, so this is its last reference.
        if let Ok(mut served) = Arc::try_unwrap(served) {
            served.scheduler.stop();
        }
    }
}
