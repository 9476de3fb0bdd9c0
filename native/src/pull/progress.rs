//! Download progress on stderr: an `indicatif` bar on a terminal, and otherwise (logs, CI, tests)
//! a plain line now and then, so redirected output stays readable.

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

pub enum Progress {
    Bar(ProgressBar),
    Lines {
        label: String,
        total: Option<u64>,
        done: u64,
        last: Instant,
        last_done: u64,
    },
}

/// How often the plain mode reports.
const LINE_EVERY: Duration = Duration::from_secs(5);

impl Progress {
    /// Start reporting a transfer of `total` bytes (when known), `done` of them already there.
    pub fn new(label: &str, total: Option<u64>, done: u64) -> Self {
        if std::io::stderr().is_terminal() {
            let bar = match total {
                Some(t) => ProgressBar::new(t),
                None => ProgressBar::new_spinner(),
            };
            let template = if total.is_some() {
                "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}"
            } else {
                "{msg} {spinner} {bytes} {bytes_per_sec}"
            };
            if let Ok(style) = ProgressStyle::with_template(template) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_message(label.to_string());
            bar.set_position(done);
            Progress::Bar(bar)
        } else {
            Progress::Lines {
                label: label.to_string(),
                total,
                done,
                last: Instant::now(),
                last_done: done,
            }
        }
    }

    pub fn inc(&mut self, n: u64) {
        match self {
            Progress::Bar(bar) => bar.inc(n),
            Progress::Lines {
                label,
                total,
                done,
                last,
                last_done,
            } => {
                *done += n;
                if last.elapsed() >= LINE_EVERY {
                    let rate = (*done - *last_done) as f64 / last.elapsed().as_secs_f64() / 1e6;
                    match total {
                        Some(t) if *t > 0 => eprintln!(
                            "{label}: {:.1}/{:.1} MB ({:.0}%), {rate:.1} MB/s",
                            *done as f64 / 1e6,
                            *t as f64 / 1e6,
                            *done as f64 * 100.0 / *t as f64
                        ),
                        _ => eprintln!("{label}: {:.1} MB, {rate:.1} MB/s", *done as f64 / 1e6),
                    }
                    *last = Instant::now();
                    *last_done = *done;
                }
            }
        }
    }

    pub fn finish(self) {
        if let Progress::Bar(bar) = self {
            bar.finish_and_clear();
        }
    }
}
