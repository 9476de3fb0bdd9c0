//! llama.cpp's generation goldens (`tests/golden/generate`, `tests/golden/fixtures`) and the
//! teacher-forced evaluation every backend's golden test runs against them.

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;
use tinyllm::backend::{Backend, KvType};
use tinyllm::engine::{Session, SessionConfig};
use tinyllm::gguf::GgufFile;
use tinyllm::model::Model;

/// Fixtures: argmax must agree where the golden top-1 leads top-2 by more than this (DESIGN).
pub const CLEAR_GAP: f64 = 0.05;
/// Real models: the golden README's tolerance on the top-1 probability, and the gap under
/// which a golden step is a near-tie.
pub const REAL_TOL: f64 = 0.1;
/// Real models: our top-1 |Δp| (median and p90) may exceed llama.cpp's own spread (its
/// flash-attention run against its goldens) by this factor (docs/design.md, Testing strategy).
pub const SPREAD_FACTOR: f64 = 1.25;
/// Real models: our greedy-run misses may exceed llama.cpp's own by this many.
pub const EXTRA_MISSES: usize = 2;

/// One golden prompt with llama.cpp's greedy continuation.
#[derive(Clone)]
pub struct Case {
    pub name: String,
    pub prompt: Vec<u32>,
    pub tokens: Vec<u32>,
    /// Per step: `(id, prob)` x 10, descending.
    pub top: Vec<Vec<(u32, f64)>>,
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// The cases of one golden `.jsonl` file.
pub fn load_cases(path: &Path) -> Vec<Case> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("golden json");
            let top = v["top"]
                .as_array()
                .expect("top")
                .iter()
                .map(|step| {
                    step.as_array()
                        .expect("step")
                        .iter()
                        .map(|p| (p[0].as_u64().expect("id") as u32, p[1].as_f64().expect("prob")))
                        .collect()
                })
                .collect();
            Case {
                name: v["name"].as_str().unwrap_or("?").to_string(),
                prompt: ids(&v["prompt_ids"]),
                tokens: ids(&v["tokens"]),
                top,
            }
        })
        .collect()
}

/// Load the GGUF at `path` onto `backend`; panics naming the file.
pub fn load_on<B: Backend>(backend: B, path: &Path) -> Arc<Model<B>> {
    let file = GgufFile::open(path).unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
    Arc::new(Model::load(backend, Arc::new(file)).unwrap_or_else(|e| panic!("cannot load {}: {e}", path.display())))
}

pub fn session<B: Backend>(model: &Arc<Model<B>>, n_ctx: usize) -> Session<B> {
    session_with(model, n_ctx, KvType::F16)
}

/// [`session`] with a KV cache in format `cache_type`.
pub fn session_with<B: Backend>(model: &Arc<Model<B>>, n_ctx: usize, cache_type: KvType) -> Session<B> {
    Session::new(
        Arc::clone(model),
        SessionConfig {
            n_ctx,
            cache_type,
            ..SessionConfig::default()
        },
    )
    .expect("session")
}

/// Softmax over the full vocabulary, in f64.
pub fn softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let exps: Vec<f64> = logits.iter().map(|&l| (l as f64 - max).exp()).collect();
    let sum: f64 = exps.iter().sum();
    exps.into_iter().map(|e| e / sum).collect()
}

/// First index of the largest value.
pub fn argmax(xs: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in xs.iter().enumerate() {
        if x > xs[best] {
            best = i;
        }
    }
    best as u32
}

/// Teacher-forced logits of every golden step: one prefill of prompt + tokens[..n-1].
pub fn teacher_forced<B: Backend>(sess: &mut Session<B>, case: &Case) -> Vec<Vec<f32>> {
    let n = case.tokens.len();
    let mut input = case.prompt.clone();
    input.extend_from_slice(&case.tokens[..n - 1]);
    sess.reset();
    let flat = sess.forward_tail(&input, n).expect("forward");
    let vocab = flat.len() / n;
    flat.chunks_exact(vocab).map(<[f32]>::to_vec).collect()
}

/// Free-running greedy decoding of `case.tokens.len()` tokens after the prompt; returns the
/// first step where our token differs from llama.cpp's although its top-1/top-2 gap there was
/// at least `gap` (`None`: every token agrees up to the first near-tie).
pub fn greedy_miss<B: Backend>(sess: &mut Session<B>, case: &Case, gap: f64) -> Option<String> {
    sess.reset();
    let mut logits = sess.forward(&case.prompt).expect("prefill");
    for (i, (&want, top)) in case.tokens.iter().zip(&case.top).enumerate() {
        let golden_gap = top[0].1 - top.get(1).map_or(0.0, |t| t.1);
        if golden_gap < gap {
            return None;
        }
        let ours = argmax(&logits);
        if ours != want {
            return Some(format!(
                "{} step {i}: greedy {ours} vs golden {want} (gap {golden_gap:.3})",
                case.name
            ));
        }
        logits = sess.forward(&[ours]).expect("decode");
    }
    None
}

/// The golden README's |Δp| tolerance for a fixture quantization.
pub fn fixture_tolerance(arch: &str, quant: &str) -> f64 {
    if let Some(spread) = lowbit_spread(arch, quant) {
        return spread.max(5e-2);
    }
    match (arch, quant) {
        (_, "F16") => 5e-3,
        // Q8_0 by the README's Q8_0 rule on every architecture, deepseek2 too: llama.cpp's own
        // spread on that file is about 2.3e-2 (#32; 0.15 let an MLA or routing error pass).
        (_, "Q8_0") => 3e-2,
        // llama.cpp's own spread on the 4- to 6-bit deepseek2 fixture reaches 0.15 (golden
        // README, Tolerances; see [`fixture_clear_gap`] for why).
        ("deepseek2", _) => 0.15,
        _ => 5e-2,
    }
}

/// The 1- to 3-bit fixture types (`scripts/lowbit-goldens.py`: quantized by llama.cpp with an
/// importance matrix of the F16 fixture). The qwen3moe fixture has the first
/// [`LOWBIT_MOE_QUANTS`]: its 32-wide experts are no whole blocks of Q1_0 or the TQ types, for
/// which llama-quantize has no fallback.
pub const LOWBIT_QUANTS: [&str; 9] = [
    "Q2_K", "Q3_K_M", "IQ2_XS", "IQ3_XXS", "IQ1_M", "IQ1_S", "Q1_0", "TQ1_0", "TQ2_0",
];

/// How many of [`LOWBIT_QUANTS`] the qwen3moe fixture has.
pub const LOWBIT_MOE_QUANTS: usize = 6;

/// llama.cpp's own spread on a 1- to 3-bit fixture (its flash-attention run against its
/// goldens, max |dp| over the top-10 entries, recorded as `spread_fa` in `manifest.json` by
/// `scripts/lowbit-goldens.py`); `None` for the other fixtures. At 1 to 3 bits a random-weight
/// model's distributions move far more between llama.cpp's two attention paths than the 4- to
/// 6-bit rule allows, so such a file is held to that measured spread (at least the rule's 5e-2).
pub fn lowbit_spread(arch: &str, quant: &str) -> Option<f64> {
    if !LOWBIT_QUANTS.contains(&quant) {
        return None;
    }
    let path = crate::common::golden("fixtures").join("manifest.json");
    let manifest: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("manifest.json")).expect("json");
    let file = format!("{arch}.{quant}.gguf");
    let entry = manifest["files"]
        .as_array()
        .expect("files")
        .iter()
        .find(|f| f["file"] == file.as_str())
        .unwrap_or_else(|| panic!("{file} is not in manifest.json: run scripts/lowbit-goldens.py"));
    Some(entry["spread_fa"].as_f64().expect("spread_fa"))
}

/// Every fixture architecture (`tests/golden/fixtures`).
pub const FIXTURE_ARCHS: [&str; 9] = [
    "llama",
    "qwen2",
    "qwen3",
    "gemma3",
    "qwen3moe",
    "olmoe",
    "deepseek2",
    "gpt-oss",
    "qwen35",
];

/// The golden file name of fixture `file` (`arch.QUANT`) for a KV cache of format `cache`:
/// llama.cpp's goldens (an f16 cache) or its run with that cache
/// (`scripts/kv-cache-goldens.py`, `<file>.kv_<cache>.golden.jsonl`). A run is held to the
/// weights' rule ([`fixture_tolerance`]) against it, whatever the cache: a q8_0 cache follows
/// llama.cpp's arithmetic (the heads rotated as its are, Q quantized to Q8_0 for integer q·k,
/// V dequantized block by block), so the cache's rounding is in the golden and adds nothing
/// (measured on the CPU: the F16 fixtures within 7e-4 of it). Without the rotation the same
/// runs stood up to 2.1e-2 from those goldens: past the F16 rule, caught.
pub fn fixture_golden(file: &str, cache: KvType) -> String {
    match cache {
        KvType::F16 => format!("{file}.golden.jsonl"),
        c => format!("{file}.kv_{c}.golden.jsonl"),
    }
}

/// The top-1/top-2 gap above which our argmax must equal llama.cpp's on a fixture. The
/// quantized deepseek2 fixture routes by sigmoid scores whose chosen and next experts lie
/// within 2e-4 of each other at some steps, so rounding flips of the quantized activations
/// (llama.cpp's own spread on it reaches 0.15, golden README) move the top probabilities by up
/// to 0.07 between two correct kernel sets (ours: the SIMD and the scalar-oracle kernels).
pub fn fixture_clear_gap(arch: &str, quant: &str) -> f64 {
    if let Some(spread) = lowbit_spread(arch, quant) {
        // Each of two correct runs may move a probability by the spread, so a gap is clear
        // only beyond twice it.
        return (2.0 * spread).max(CLEAR_GAP);
    }
    match (arch, quant) {
        ("deepseek2", q) if q != "F16" => 0.1,
        _ => CLEAR_GAP,
    }
}

/// The nearest-rank quantile `q` of `devs` (0 for none).
pub fn quantile(devs: &[f64], q: f64) -> f64 {
    let mut d = devs.to_vec();
    d.sort_by(f64::total_cmp);
    d.get(((d.len() as f64 - 1.0) * q) as usize).copied().unwrap_or(0.0)
}

/// A real model's goldens with llama.cpp's own spread around them: its flash-attention run
/// of the same prompts (`*.fa_auto.jsonl`), the steps whose context (prompt plus golden
/// tokens before them) both of its runs share, and each prompt's greedy horizon (up to the
/// golden's first near-tie: after it, either choice is legitimate).
pub struct Spread {
    pub golden: Vec<Case>,
    /// llama.cpp's flash-attention run of each golden case, in the goldens' order.
    pub fa: Vec<Case>,
    /// Per case, how many leading steps both llama.cpp runs share (the parting step itself
    /// still has a shared context).
    pub steps: Vec<usize>,
    /// Per case, steps before the first golden near-tie.
    pub horizon: Vec<usize>,
    /// Where `golden` is llama.cpp's run with another KV cache format ([`Spread::load_with`]):
    /// its f16-cache goldens and flash-attention run, whose distance is the spread a run is
    /// judged against.
    pub baseline: Option<Box<Spread>>,
}

impl Spread {
    /// The goldens `generate/{name}.jsonl` and their `fa_auto` twin.
    pub fn load(name: &str) -> Spread {
        let dir = super::golden("generate");
        let golden = load_cases(&dir.join(format!("{name}.jsonl")));
        let fa_all = load_cases(&dir.join(format!("{name}.fa_auto.jsonl")));
        let fa: Vec<Case> = golden
            .iter()
            .map(|g| {
                let f = fa_all
                    .iter()
                    .find(|f| f.name == g.name)
                    .expect("fa_auto case of the same name");
                Case {
                    name: f.name.clone(),
                    prompt: f.prompt.clone(),
                    tokens: f.tokens.clone(),
                    top: f.top.clone(),
                }
            })
            .collect();
        let mut steps = Vec::new();
        let mut horizon = Vec::new();
        for (g, f) in golden.iter().zip(&fa) {
            let parted = g.tokens.iter().zip(&f.tokens).position(|(a, b)| a != b);
            steps.push(parted.map_or(g.tokens.len().min(f.tokens.len()), |i| i + 1));
            horizon.push(near_tie_horizon(g));
        }
        Spread {
            golden,
            fa,
            steps,
            horizon,
            baseline: None,
        }
    }

    /// [`Spread::load`] for a run with a KV cache of format `cache`: an f16 cache is judged as
    /// there; another against llama.cpp's run with that cache
    /// (`generate/{name}.kv_<cache>.jsonl`, every step of it, greedy up to its first near-tie),
    /// within the spread of llama.cpp's two f16 attention paths.
    pub fn load_with(name: &str, cache: KvType) -> Spread {
        let base = Spread::load(name);
        if cache == KvType::F16 {
            return base;
        }
        let golden = load_cases(&super::golden("generate").join(format!("{name}.kv_{cache}.jsonl")));
        assert!(
            golden.iter().map(|g| &g.name).eq(base.golden.iter().map(|g| &g.name)),
            "{name}: the {cache}-cache goldens hold other prompts than the f16 ones"
        );
        Spread {
            steps: golden.iter().map(|g| g.tokens.len()).collect(),
            horizon: golden.iter().map(near_tie_horizon).collect(),
            fa: base.fa.clone(),
            golden,
            baseline: Some(Box::new(base)),
        }
    }

    /// One run's distance from the goldens over the shared steps: per case, the golden top-1
    /// entry's |Δp| at each shared step; and its misses (a greedy run parting from the goldens
    /// before the horizon counts one per prompt; a shared step beyond `REAL_TOL` counts one).
    /// `probs(case, step, id)` is the run's probability of `id`; `tokens` its greedy tokens per
    /// case.
    fn distance(&self, probs: impl Fn(usize, usize, u32) -> f64, tokens: &[Vec<u32>]) -> (Vec<Vec<f64>>, Vec<String>) {
        let (mut top1, mut misses) = (Vec::new(), Vec::new());
        for (c, g) in self.golden.iter().enumerate() {
            let mut devs = Vec::new();
            for i in 0..self.steps[c] {
                let (id, p) = g.top[i][0];
                let dev = (probs(c, i, id) - p).abs();
                devs.push(dev);
                if dev > REAL_TOL {
                    misses.push(format!("{} step {i}: top-1 |dp| {dev:.3}", g.name));
                }
            }
            top1.push(devs);
            let h = self.horizon[c];
            if tokens[c].get(..h) != g.tokens.get(..h) {
                misses.push(format!(
                    "{}: greedy tokens part before the first near-tie (step {h})",
                    g.name
                ));
            }
        }
        (top1, misses)
    }

    /// docs/design.md's rule for real models: the run's top-1 |Δp| median and p90 within
    /// `SPREAD_FACTOR` of llama.cpp's flash-attention run's, over the steps both of its runs
    /// share; its misses at most llama.cpp's own plus `EXTRA_MISSES`. Prints both runs'
    /// figures; returns what breaks the rule.
    ///
    /// The quantile ratio is judged as a statistic of 12 prompts, not as an exact number:
    /// resampling the prompts (a bootstrap) shows how far it moves with the prompt set alone
    /// (qwen2.5-coder's median ratio on this set: 1.32 as measured, 0.94 to 1.75 over 90% of
    /// resamples; docs/design.md's own figure on a disjoint set was 0.63). So the rule fails when
    /// the run is worse than `SPREAD_FACTOR` with 95% confidence: when even the 5th percentile
    /// of the resampled ratios exceeds it. A run systematically half again as far from the
    /// goldens as llama.cpp fails; the point ratios are printed beside the bound.
    pub fn judge(&self, label: &str, probs: impl Fn(usize, usize, u32) -> f64, tokens: &[Vec<u32>]) -> Vec<String> {
        let (ours, our_misses) = self.distance(probs, tokens);
        let base = self.baseline.as_deref().unwrap_or(self);
        let fa_tokens: Vec<Vec<u32>> = base.fa.iter().map(|f| f.tokens.clone()).collect();
        let (theirs, their_misses) = base.distance(
            |c, i, id| base.fa[c].top[i].iter().find(|t| t.0 == id).map_or(0.0, |t| t.1),
            &fa_tokens,
        );
        let mut failures = Vec::new();
        for q in [0.5, 0.9] {
            let flat = |v: &[Vec<f64>]| v.concat();
            let (a, b) = (quantile(&flat(&ours), q), quantile(&flat(&theirs), q));
            let low = bootstrap_low(&ours, &theirs, q);
            println!(
                "[spread] {label}: top-1 |dp| quantile {q} over {} shared steps: ours {a:.2e}, llama.cpp fa on/off {b:.2e} \
                 (ratio {:.2}, 95% lower bound {low:.2}, limit {SPREAD_FACTOR})",
                flat(&ours).len(),
                a / b
            );
            if low > SPREAD_FACTOR {
                failures.push(format!(
                    "{label}: quantile {q} of top-1 |dp| is {a:.3e}, {:.2}x llama.cpp's own {b:.3e}, and at least \
                     {low:.2}x with 95% confidence (limit {SPREAD_FACTOR}x)",
                    a / b
                ));
            }
        }
        println!(
            "[spread] {label}: misses ours {}, llama.cpp's own {}",
            our_misses.len(),
            their_misses.len()
        );
        for m in &our_misses {
            println!("[spread]   ours: {m}");
        }
        for m in &their_misses {
            println!("[spread]   llama.cpp: {m}");
        }
        if our_misses.len() > their_misses.len() + EXTRA_MISSES {
            failures.push(format!(
                "{label}: {} misses, more than llama.cpp's own {} + {EXTRA_MISSES}",
                our_misses.len(),
                their_misses.len()
            ));
        }
        failures
    }
}

/// Steps of golden `g` before its first near-tie (top-2 within [`REAL_TOL`]).
fn near_tie_horizon(g: &Case) -> usize {
    g.top
        .iter()
        .position(|t| t[0].1 - t[1].1 < REAL_TOL)
        .unwrap_or(g.tokens.len())
}

/// Per prompt `c`, a weight in [0.5, 1.5) with mean near 1 (golden-ratio steps, no RNG): the
/// rule's self-tests move each prompt by a different amount, so the bootstrap over prompts has
/// a real width (a uniform scale leaves every resample's ratio equal).
pub fn prompt_weight(c: usize) -> f64 {
    0.5 + (c as f64 * 0.618_033_988_75).fract()
}

impl Spread {
    /// The rule's reach for a run `probs` with `tokens`: that run moved away from the goldens,
    /// prompt `c` by `k * prompt_weight(c)` times its own deviation, for k from 1 in steps of
    /// 0.25 up to 6. Returns (the largest k that passes below the first failure, the first k
    /// that fails; `None` if none up to 6). Judged on the |Δp| quantiles only: the greedy
    /// tokens stay the run's own, so the misses are those of the run itself.
    pub fn reach(
        &self,
        label: &str,
        probs: impl Fn(usize, usize, u32) -> f64,
        tokens: &[Vec<u32>],
    ) -> (f64, Option<f64>) {
        let mut passed = 0.0;
        for step in 0..=20 {
            let k = 1.0 + 0.25 * step as f64;
            let moved = |c: usize, i: usize, id: u32| {
                let g = self.golden[c].top[i][0].1;
                g + k * prompt_weight(c) * (probs(c, i, id) - g)
            };
            let failures = self.judge(&format!("{label} x{k:.2} per prompt"), moved, tokens);
            if failures.iter().any(|f| f.contains("quantile")) {
                println!("[spread] {label}: the rule passes up to {passed:.2}x per prompt, fails from {k:.2}x");
                return (passed, Some(k));
            }
            passed = k;
        }
        println!("[spread] {label}: the rule passes every multiple up to {passed:.2}x");
        (passed, None)
    }
}

/// Resamples of the prompts in [`bootstrap_low`].
const RESAMPLES: usize = 2000;

/// The 5th percentile, over resamples of the prompts (with replacement, a fixed seed), of the
/// ratio of quantile `q` of `ours` to that of `theirs` (per prompt, their steps' |Δp|).
fn bootstrap_low(ours: &[Vec<f64>], theirs: &[Vec<f64>], q: f64) -> f64 {
    let n = ours.len();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut ratios: Vec<f64> = (0..RESAMPLES)
        .map(|_| {
            let pick: Vec<usize> = (0..n).map(|_| (next() % n as u64) as usize).collect();
            let a: Vec<f64> = pick.iter().flat_map(|&c| ours[c].iter().copied()).collect();
            let b: Vec<f64> = pick.iter().flat_map(|&c| theirs[c].iter().copied()).collect();
            quantile(&a, q) / quantile(&b, q).max(f64::MIN_POSITIVE)
        })
        .collect();
    ratios.sort_by(f64::total_cmp);
    ratios[RESAMPLES / 20]
}
