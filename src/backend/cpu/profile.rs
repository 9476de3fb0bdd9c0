//! An opt-in wall-clock profile of the CPU backend's passes, by the call site of each parallel
//! op: how long its tasks took (the dispatcher's wait for the last one included) and how long
//! the pass thread worked alone since the op before it (activation quantization, the graph's
//! serial ops, the pool's hand-off).
//!
//! Why: a second thread's gain is bounded by the work only one thread does, and that work
//! hides between the parallel ops, which have names (their call sites) while the gaps do not.
//! Off (the default) it costs one relaxed load per op. Only the thread running a pass
//! ([`super::pool::Pool::run`]) records, and only its outermost ops (an op inside a task runs
//! inline and is part of that task's time).

use std::cell::Cell;
use std::collections::HashMap;
use std::panic::Location;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use web_time::Instant;

use crate::backend::sync::lock;

static ON: AtomicBool = AtomicBool::new(false);

/// Seconds by call site, and the passes' totals.
#[derive(Default)]
struct Book {
    sites: HashMap<String, Site>,
    passes: u64,
    pass_s: f64,
    /// Time from an op's end to the pass's end.
    tail_s: f64,
}

/// One call site's totals.
#[derive(Default, Clone, Copy)]
struct Site {
    calls: u64,
    /// Inside the op: from publishing its tasks to the last one finished.
    op_s: f64,
    /// Before the op: since the previous op of the pass ended (or the pass began).
    alone_s: f64,
}

static BOOK: Mutex<Option<Book>> = Mutex::new(None);

thread_local! {
    /// This thread runs a pass: when its previous op ended (or the pass began).
    static PASS: Cell<Option<Instant>> = const { Cell::new(None) };
    /// Ops open on this thread (an op inside a task is not recorded on its own).
    static DEPTH: Cell<usize> = const { Cell::new(0) };
}

fn book<R>(f: impl FnOnce(&mut Book) -> R) -> R {
    let mut guard = lock(&BOOK);
    f(guard.get_or_insert_with(Book::default))
}

/// Start (or stop) recording; starting clears what was recorded.
pub fn enable(on: bool) {
    if on {
        book(|b| *b = Book::default());
    }
    ON.store(on, Ordering::Relaxed);
}

/// What was recorded since [`enable`], as JSON: `{"passes", "pass_ms", "tail_ms", "sites":
/// [{"site", "calls", "op_ms", "alone_ms"}]}`, the sites by their total time, largest first.
pub fn report() -> serde_json::Value {
    book(|b| {
        let mut sites: Vec<_> = b.sites.iter().collect();
        sites.sort_by(|x, y| (y.1.op_s + y.1.alone_s).total_cmp(&(x.1.op_s + x.1.alone_s)));
        serde_json::json!({
            "passes": b.passes,
            "pass_ms": b.pass_s * 1e3,
            "tail_ms": b.tail_s * 1e3,
            "sites": sites.iter().map(|(l, s)| serde_json::json!({
                "site": l,
                "calls": s.calls,
                "op_ms": s.op_s * 1e3,
                "alone_ms": s.alone_s * 1e3,
            })).collect::<Vec<_>>(),
        })
    })
}

/// A pass on this thread, recorded while it lives (nothing when the profile is off).
pub struct Pass(Option<Instant>);

impl Pass {
    pub fn begin() -> Self {
        if !ON.load(Ordering::Relaxed) || PASS.with(Cell::get).is_some() {
            return Pass(None);
        }
        let now = Instant::now();
        PASS.with(|p| p.set(Some(now)));
        Pass(Some(now))
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        let Some(start) = self.0 else { return };
        let now = Instant::now();
        let last = PASS.with(|p| p.take()).unwrap_or(start);
        book(|b| {
            b.passes += 1;
            b.pass_s += (now - start).as_secs_f64();
            b.tail_s += (now - last).as_secs_f64();
        });
    }
}

/// One outermost op of a pass, recorded while it lives.
pub struct Op {
    site: String,
    /// This op raised the thread's depth.
    counted: bool,
    started: Option<Instant>,
}

impl Op {
    #[track_caller]
    pub fn begin() -> Self {
        let at = Location::caller();
        Op::named(|| format!("{}:{}", at.file(), at.line()))
    }

    /// An op named by `name` (called only when the profile is on) instead of its call site.
    pub fn named(name: impl FnOnce() -> String) -> Self {
        if !ON.load(Ordering::Relaxed) {
            return Op {
                site: String::new(),
                counted: false,
                started: None,
            };
        }
        let site = name();
        let depth = DEPTH.with(|d| d.replace(d.get() + 1));
        let Some(last) = PASS.with(Cell::get).filter(|_| depth == 0) else {
            return Op {
                site,
                counted: true,
                started: None,
            };
        };
        let now = Instant::now();
        book(|b| b.sites.entry(site.clone()).or_default().alone_s += (now - last).as_secs_f64());
        Op {
            site,
            counted: true,
            started: Some(now),
        }
    }
}

impl Drop for Op {
    fn drop(&mut self) {
        if !self.counted {
            return;
        }
        DEPTH.with(|d| d.set(d.get() - 1));
        let Some(started) = self.started else { return };
        let now = Instant::now();
        PASS.with(|p| p.set(Some(now)));
        book(|b| {
            let s = b.sites.entry(std::mem::take(&mut self.site)).or_default();
            s.calls += 1;
            s.op_s += (now - started).as_secs_f64();
        });
    }
}
