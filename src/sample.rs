//! Choosing the next token from logits: llama.cpp's default sampler chain.
//!
//! The chain is penalties -> top-k -> top-p -> min-p -> temperature -> weighted draw, the same
//! order and definitions as llama.cpp's `common_sampler`, so settings mean what users of
//! llama.cpp expect. Temperature 0 is greedy (argmax, ties to the lowest id). Draws come from a
//! seeded ChaCha RNG, so a seed reproduces a run exactly.
//!
//! Cost per token, for a vocabulary of n (150k-262k) and a penalty window of w:
//! building the candidate list, min-p and the draw are O(n); penalties O(n + w log w); top-k
//! O(n) by `select_nth_unstable_by`; top-p O(n) by a quickselect on probability mass (no
//! sort at all). Only [`Sampler::distribution`], a diagnostic, sorts its survivors.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use std::cmp::Ordering;

/// A sampler setting outside its valid range.
#[derive(Debug, thiserror::Error)]
pub enum SamplerError {
    #[error("sampler: {field} = {value} is invalid: expected {expected}")]
    Invalid {
        field: &'static str,
        value: String,
        expected: &'static str,
    },
}

/// Sampler settings. [`Default`] gives llama.cpp's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerConfig {
    /// Divides the logits; 0 means greedy.
    pub temperature: f32,
    /// Keep the k most likely tokens; 0 = off.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches p; 1 = off.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; 0 = off.
    pub min_p: f32,
    /// Repetition penalty on tokens seen in the last `repeat_last_n`; 1 = off.
    pub repeat_penalty: f32,
    /// How many recent tokens the penalties look at; 0 = penalties off.
    pub repeat_last_n: usize,
    /// Subtracted once from the logit of every token seen in the window.
    pub presence_penalty: f32,
    /// Subtracted from a token's logit per occurrence in the window.
    pub frequency_penalty: f32,
    /// RNG seed; the same seed gives the same draws.
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        Self {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            // llama.cpp's LLAMA_DEFAULT_SEED value; here it is a fixed seed, not "random".
            seed: 0xFFFF_FFFF,
        }
    }
}

impl SamplerConfig {
    /// Greedy decoding: always the most likely token.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: 1,
            top_p: 1.0,
            min_p: 0.0,
            ..Self::default()
        }
    }

    /// Rejects settings that have no meaning (negative or NaN temperature, top-p outside
    /// (0, 1], ...), naming the field and its value.
    pub fn validate(&self) -> Result<(), SamplerError> {
        fn check(field: &'static str, v: f32, ok: bool, expected: &'static str) -> Result<(), SamplerError> {
            if v.is_finite() && ok {
                Ok(())
            } else {
                Err(SamplerError::Invalid {
                    field,
                    value: v.to_string(),
                    expected,
                })
            }
        }
        check(
            "temperature",
            self.temperature,
            self.temperature >= 0.0,
            "a finite number >= 0",
        )?;
        check(
            "top_p",
            self.top_p,
            self.top_p > 0.0 && self.top_p <= 1.0,
            "a number in (0, 1]",
        )?;
        check(
            "min_p",
            self.min_p,
            (0.0..=1.0).contains(&self.min_p),
            "a number in [0, 1]",
        )?;
        check(
            "repeat_penalty",
            self.repeat_penalty,
            self.repeat_penalty > 0.0,
            "a finite number > 0",
        )?;
        check("presence_penalty", self.presence_penalty, true, "a finite number")?;
        check("frequency_penalty", self.frequency_penalty, true, "a finite number")?;
        Ok(())
    }

    /// Greedy with no penalties: the choice is the argmax of the raw logits, which a backend
    /// can compute without handing the logits back.
    pub fn is_plain_greedy(&self) -> bool {
        self.temperature <= 0.0 && !self.penalties_enabled()
    }

    fn penalties_enabled(&self) -> bool {
        self.repeat_last_n > 0
            && (self.repeat_penalty != 1.0 || self.presence_penalty != 0.0 || self.frequency_penalty != 0.0)
    }
}

/// What a backend hands back for a row of logits when the sampler does not need all of it
/// ([`Sampler::plan`]): `Backend::top_k` computes it on the device.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Candidates {
    /// The `k` largest sanitized logits (NaN as -inf, +inf as the largest finite value; ties
    /// to the lower id) as (id, logit), in id order.
    pub top: Vec<(u32, f32)>,
    /// The logits, as they are, at the plan's gather ids (-inf past the row).
    pub gathered: Vec<f32>,
}

/// The candidates one draw needs: the `k` largest logits and the logits at `gather` (the
/// penalized tokens).
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub k: usize,
    pub gather: Vec<u32>,
}

/// [`Candidates`] of one row, on the host (what the CPU backend returns, and the reference the
/// device kernel is tested against). One pass keeps the `k` best seen so far in a heap whose
/// root is the worst of them: ids come in increasing order, so a later value displaces the
/// root only when strictly greater (ties go to the lower id), which for small `k` is rare and
/// leaves the pass at one comparison per value.
pub fn candidates(row: &[f32], k: usize, gather: &[u32]) -> Candidates {
    use std::collections::BinaryHeap;
    let k = k.min(row.len());
    // Min-heap on (key, Reverse(id)): the root is the lowest-ranked kept candidate.
    let mut heap: BinaryHeap<std::cmp::Reverse<(u32, std::cmp::Reverse<u32>)>> = BinaryHeap::with_capacity(k + 1);
    // Once the heap is full, a chunk whose largest key does not beat the root holds no
    // candidate (the root only rises): most of a row is skipped by that branch-free maximum.
    const CHUNK: usize = 64;
    for (c, chunk) in row.chunks(CHUNK).enumerate() {
        if k == 0 {
            break;
        }
        if let Some(root) = heap.peek().filter(|_| heap.len() == k) {
            let max = chunk.iter().map(|&l| order_key(sanitize(l))).max().unwrap_or(0);
            if max <= root.0 .0 {
                continue;
            }
        }
        for (j, &l) in chunk.iter().enumerate() {
            let (key, i) = (order_key(sanitize(l)), c * CHUNK + j);
            if heap.len() < k {
                heap.push(std::cmp::Reverse((key, std::cmp::Reverse(i as u32))));
            } else if heap.peek().is_some_and(|r| key > r.0 .0) {
                heap.pop();
                heap.push(std::cmp::Reverse((key, std::cmp::Reverse(i as u32))));
            }
        }
    }
    let mut top: Vec<(u32, f32)> = heap
        .into_iter()
        .map(|std::cmp::Reverse((_, std::cmp::Reverse(id)))| (id, sanitize(row[id as usize])))
        .collect();
    top.sort_unstable_by_key(|t| t.0);
    Candidates {
        top,
        gathered: gather
            .iter()
            .map(|&id| row.get(id as usize).copied().unwrap_or(f32::NEG_INFINITY))
            .collect(),
    }
}

/// An unsigned key ordering f32 values as `total_cmp` does.
fn order_key(v: f32) -> u32 {
    let b = v.to_bits();
    if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// One candidate token.
#[derive(Debug, Clone, Copy)]
struct Cand {
    id: u32,
    logit: f32,
}

/// Most likely first; equal logits in id order, so every choice is deterministic.
fn by_logit_desc(a: &Cand, b: &Cand) -> Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

/// A row of logits as candidates, in id order, sanitized.
fn sanitized(logits: &[f32]) -> impl Iterator<Item = Cand> + '_ {
    logits.iter().enumerate().map(|(i, &l)| Cand {
        id: i as u32,
        logit: sanitize(l),
    })
}

/// NaN can never win; +inf becomes the largest finite value so softmax stays finite.
fn sanitize(logit: f32) -> f32 {
    if logit.is_nan() {
        f32::NEG_INFINITY
    } else {
        logit.min(f32::MAX)
    }
}

/// The sampler: settings, RNG and a reused candidate buffer.
#[derive(Debug, Clone)]
pub struct Sampler {
    cfg: SamplerConfig,
    rng: ChaCha20Rng,
    cand: Vec<Cand>,
}

impl Sampler {
    /// A sampler for valid settings.
    pub fn new(cfg: SamplerConfig) -> Result<Self, SamplerError> {
        cfg.validate()?;
        let rng = ChaCha20Rng::seed_from_u64(cfg.seed);
        Ok(Self {
            cfg,
            rng,
            cand: Vec::new(),
        })
    }

    /// The settings.
    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Restarts the RNG from the seed, so the next draws repeat the first ones.
    pub fn reset(&mut self) {
        self.rng = ChaCha20Rng::seed_from_u64(self.cfg.seed);
    }

    /// Picks the next token. `history` holds the tokens so far (prompt and generated) for
    /// the penalties. Never panics, whatever the logits hold: NaN is treated as -inf, and all
    /// -inf/NaN logits give id 0.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        if self.greedy() && !self.cfg.penalties_enabled() {
            // The same pick as below without building a candidate per vocabulary entry (a
            // batched server step samples every stream on one thread).
            return greedy_pick(logits);
        }
        self.prepare(logits, history);
        if self.cand.is_empty() {
            return argmax(logits);
        }
        if self.greedy() {
            return self.cand.iter().copied().min_by(by_logit_desc).map_or(0, |c| c.id);
        }
        self.draw()
    }

    /// What to ask a backend for instead of a whole row of logits (see [`Candidates`]), or
    /// `None` when the draw needs the row (sampling with top-k off). Greedy picks need the top
    /// one (and the penalized tokens).
    pub fn plan(&self, history: &[u32]) -> Option<Plan> {
        let k = if self.greedy() { 1 } else { self.cfg.top_k };
        if k == 0 {
            return None;
        }
        let mut gather = Vec::new();
        if self.cfg.penalties_enabled() {
            for_each_penalized(&self.cfg, history, |id, _| gather.push(id));
        }
        Some(Plan {
            k: k.saturating_add(gather.len()),
            gather,
        })
    }

    /// [`Sampler::plan`] for the draw after `next` is appended to `history`: the penalty
    /// window as it will be then (a forward pass is planned before it runs).
    pub fn plan_after(&self, history: &[u32], next: &[u32]) -> Option<Plan> {
        let window = self.cfg.repeat_last_n;
        let mut h = history[history.len().saturating_sub(window)..].to_vec();
        h.extend_from_slice(next);
        self.plan(&h)
    }

    /// The token [`Sampler::sample`] would pick from the whole row, from `c`, the row's
    /// candidates for `plan` (made by [`Sampler::plan`] with the same `history`; candidates
    /// for a larger k or more gather ids do as well: they hold the same survivors). The top-k
    /// survivors are the same set: a token that is not penalized and makes the top k after
    /// the penalties is among the top k of the unpenalized ones, so among the `k + m` largest
    /// raw logits; the penalized ones come gathered. Then the same chain and draw follow.
    pub fn sample_candidates(&mut self, c: &Candidates, plan: &Plan, history: &[u32]) -> u32 {
        self.cand.clear();
        self.cand.extend(c.top.iter().map(|&(id, logit)| Cand {
            id,
            logit: sanitize(logit),
        }));
        self.cand.sort_unstable_by_key(|c| c.id);
        let top = self.cand.len();
        // Add the gathered ids the top does not hold (once each: a repeated id has one logit).
        for (&id, &logit) in plan.gather.iter().zip(&c.gathered) {
            if self.cand[..top].binary_search_by_key(&id, |c| c.id).is_err() {
                self.cand.push(Cand {
                    id,
                    logit: sanitize(logit),
                });
            }
        }
        self.cand.sort_unstable_by_key(|c| c.id);
        self.cand.dedup_by_key(|c| c.id);
        if self.cfg.penalties_enabled() {
            let cfg = &self.cfg;
            let cand = &mut self.cand;
            for_each_penalized(cfg, history, |id, count| {
                if let Ok(i) = cand.binary_search_by_key(&id, |c| c.id) {
                    cand[i].logit = penalize(cfg, cand[i].logit, count);
                }
            });
        }
        self.cand.retain(|c| c.logit > f32::NEG_INFINITY);
        if self.cand.is_empty() {
            // Every logit is -inf or NaN: `sample` returns the row's argmax, the first id.
            return c.top.iter().map(|t| t.0).min().unwrap_or(0);
        }
        if self.greedy() {
            return self.cand.iter().copied().min_by(by_logit_desc).map_or(0, |c| c.id);
        }
        self.draw()
    }

    /// Truncate the prepared candidates and draw one, weighted by probability, walking them in
    /// id order (any order would do; a fixed one makes the same draw from the same set,
    /// however it was gathered).
    fn draw(&mut self) -> u32 {
        self.truncate();
        self.cand.sort_unstable_by_key(|c| c.id);
        let (max, inv_t) = self.scaled_max();
        let total: f64 = self.cand.iter().map(|c| weight(c.logit, max, inv_t)).sum();
        let mut target = self.rng.random::<f64>() * total;
        for c in &self.cand {
            target -= weight(c.logit, max, inv_t);
            if target < 0.0 {
                return c.id;
            }
        }
        // Rounding left a sliver of mass past the last candidate.
        self.cand.last().map_or(0, |c| c.id)
    }

    /// The distribution `sample` draws from: surviving tokens with their probabilities after
    /// the whole chain, most likely first (greedy gives one token with probability 1).
    pub fn distribution(&mut self, logits: &[f32], history: &[u32]) -> Vec<(u32, f32)> {
        self.prepare(logits, history);
        if self.cand.is_empty() {
            return vec![(argmax(logits), 1.0)];
        }
        if self.greedy() {
            let best = self.cand.iter().copied().min_by(by_logit_desc).map_or(0, |c| c.id);
            return vec![(best, 1.0)];
        }
        self.truncate();
        self.cand.sort_unstable_by(by_logit_desc);
        let (max, inv_t) = self.scaled_max();
        let total: f64 = self.cand.iter().map(|c| weight(c.logit, max, inv_t)).sum();
        self.cand
            .iter()
            .map(|c| (c.id, (weight(c.logit, max, inv_t) / total) as f32))
            .collect()
    }

    fn greedy(&self) -> bool {
        self.cfg.temperature <= 0.0
    }

    /// Candidates in id order with penalties applied; tokens that can never be drawn
    /// (-inf, NaN) are dropped.
    fn prepare(&mut self, logits: &[f32], history: &[u32]) {
        self.cand.clear();
        self.cand.extend(sanitized(logits));
        if self.cfg.penalties_enabled() {
            // Still in id order: index == id.
            for_each_penalized(&self.cfg, history, |id, count| {
                if let Some(c) = self.cand.get_mut(id as usize) {
                    c.logit = penalize(&self.cfg, c.logit, count);
                }
            });
        }
        self.cand.retain(|c| c.logit > f32::NEG_INFINITY);
    }

    /// top-k, then top-p, then min-p, on the raw (penalized) logits as llama.cpp does. The
    /// top-k survivors are put in id order first, so the sums below add in an order that does
    /// not depend on how the candidates were gathered.
    fn truncate(&mut self) {
        let k = self.cfg.top_k;
        if k > 0 && k < self.cand.len() {
            self.cand.select_nth_unstable_by(k - 1, by_logit_desc);
            self.cand.truncate(k);
        }
        self.cand.sort_unstable_by_key(|c| c.id);
        if self.cfg.top_p < 1.0 && self.cand.len() > 1 {
            self.top_p();
        }
        if self.cfg.min_p > 0.0 && self.cand.len() > 1 {
            let max = self.cand.iter().map(|c| c.logit).fold(f32::NEG_INFINITY, f32::max);
            let threshold = max + self.cfg.min_p.ln();
            self.cand.retain(|c| c.logit >= threshold);
        }
    }

    /// Keeps the smallest most-likely prefix whose probability (renormalized over the current
    /// candidates) reaches `top_p`, without sorting: a quickselect on probability mass. Each
    /// step splits the undecided range at its middle with `select_nth_unstable_by`; if the
    /// upper half (plus everything already kept) reaches p, the cut lies inside it, otherwise
    /// the upper half is kept and the search continues below. Halving ranges give O(n) in all.
    fn top_p(&mut self) {
        let max = self.cand.iter().map(|c| c.logit).fold(f32::NEG_INFINITY, f32::max);
        let total: f64 = self.cand.iter().map(|c| weight(c.logit, max, 1.0)).sum();
        let target = f64::from(self.cfg.top_p) * total;
        // cand[..lo] are kept with mass `acc`; the cut lies in cand[lo..hi].
        let (mut lo, mut hi, mut acc) = (0, self.cand.len(), 0.0);
        while hi - lo > 1 {
            let mid = (hi - lo) / 2;
            let range = &mut self.cand[lo..hi];
            range.select_nth_unstable_by(mid, by_logit_desc);
            let upper: f64 = range[..mid].iter().map(|c| weight(c.logit, max, 1.0)).sum();
            if acc + upper >= target {
                hi = lo + mid;
            } else {
                acc += upper;
                lo += mid;
            }
        }
        // cand[lo] is the token whose mass crosses p (or the last one, if rounding never did).
        self.cand.truncate(lo + 1);
    }

    /// The largest candidate logit and 1/temperature.
    fn scaled_max(&self) -> (f32, f64) {
        let max = self.cand.iter().map(|c| c.logit).fold(f32::NEG_INFINITY, f32::max);
        (max, 1.0 / f64::from(self.cfg.temperature))
    }
}

/// exp((logit - max) / temperature), in f64 so sums over 262k tokens stay exact enough.
fn weight(logit: f32, max: f32, inv_t: f64) -> f64 {
    ((f64::from(logit) - f64::from(max)) * inv_t).exp()
}

/// llama.cpp's penalty for a token seen `count` times in the window: the repeat penalty divides
/// a positive logit and multiplies a non-positive one; then
/// `count * frequency_penalty + presence_penalty` is subtracted.
fn penalize(cfg: &SamplerConfig, logit: f32, count: u32) -> f32 {
    let l = if logit <= 0.0 {
        logit * cfg.repeat_penalty
    } else {
        logit / cfg.repeat_penalty
    };
    l - (count as f32 * cfg.frequency_penalty + cfg.presence_penalty)
}

/// Calls `f(id, count)` for every distinct token in the last `repeat_last_n` of `history`.
fn for_each_penalized(cfg: &SamplerConfig, history: &[u32], mut f: impl FnMut(u32, u32)) {
    let window = &history[history.len().saturating_sub(cfg.repeat_last_n)..];
    let mut ids = window.to_vec();
    ids.sort_unstable();
    for run in ids.chunk_by(|a, b| a == b) {
        f(run[0], run.len() as u32);
    }
}

/// Applies the penalties of `cfg` to `logits` (indexed by token id) for the tokens in the
/// window of `history`, exactly as the sampler does before truncation.
pub fn apply_penalties(cfg: &SamplerConfig, logits: &mut [f32], history: &[u32]) {
    if !cfg.penalties_enabled() {
        return;
    }
    for_each_penalized(cfg, history, |id, count| {
        if let Some(l) = logits.get_mut(id as usize) {
            *l = penalize(cfg, *l, count);
        }
    });
}

/// The id of the largest logit, the lowest id among equals; NaN never wins; 0 for an empty
/// or all-NaN slice.
/// What greedy sampling picks without penalties: the largest sanitized logit, the lowest id
/// among equals; [`argmax`] when every logit is -inf or NaN.
fn greedy_pick(logits: &[f32]) -> u32 {
    let mut best: Option<(usize, f32)> = None;
    for (i, &l) in logits.iter().enumerate() {
        let v = sanitize(l);
        if v > f32::NEG_INFINITY && best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    best.map_or_else(|| argmax(logits), |(i, _)| i as u32)
}

/// A seed that differs between calls (for requests that give none): the clock's nanoseconds,
/// and natively the process id.
pub fn fresh_seed() -> u64 {
    let t = web_time::SystemTime::now()
        .duration_since(web_time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64;
    #[cfg(not(target_arch = "wasm32"))]
    let t = t ^ u64::from(std::process::id());
    t
}

/// The greedy choice every backend's argmax follows: the first index of the largest value,
/// NaN never winning, 0 for a row of NaN.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best: Option<(usize, f32)> = None;
    for (i, &l) in logits.iter().enumerate() {
        if !l.is_nan() && best.is_none_or(|(_, b)| l > b) {
            best = Some((i, l));
        }
    }
    best.map_or(0, |(i, _)| i as u32)
}

/// The `k` most likely tokens with their log-probabilities under the softmax of the full
/// `logits` (no temperature or truncation), most likely first, ties in id order. O(n + k log k).
pub fn log_softmax_top_k(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut cand: Vec<Cand> = sanitized(logits).collect();
    let max = cand.iter().map(|c| c.logit).fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return Vec::new();
    }
    let sum: f64 = cand.iter().map(|c| weight(c.logit, max, 1.0)).sum();
    let log_z = f64::from(max) + sum.ln();
    let k = k.min(cand.len());
    if k == 0 {
        return Vec::new();
    }
    if k < cand.len() {
        cand.select_nth_unstable_by(k - 1, by_logit_desc);
        cand.truncate(k);
    }
    cand.sort_unstable_by(by_logit_desc);
    cand.iter()
        .map(|c| (c.id, (f64::from(c.logit) - log_z) as f32))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    /// The one-pass heap selection against a full sort by the sampler's own order.
    #[test]
    fn candidates_are_the_k_best_by_the_sampler_order() {
        let mut rng = ChaCha20Rng::seed_from_u64(3);
        for n in [1usize, 2, 9, 100, 3000] {
            let row: Vec<f32> = (0..n)
                .map(|i| match i % 23 {
                    3 => f32::NAN,
                    4 => f32::INFINITY,
                    5 => f32::NEG_INFINITY,
                    6 => -0.0,
                    7 => 0.0,
                    _ => (rng.random_range(-20..20) as f32) / 4.0,
                })
                .collect();
            for k in [0, 1, 2, 5, 64, 5000] {
                let mut all: Vec<Cand> = sanitized(&row).collect();
                all.sort_by(by_logit_desc);
                all.truncate(k);
                all.sort_by_key(|c| c.id);
                let want: Vec<(u32, u32)> = all.iter().map(|c| (c.id, c.logit.to_bits())).collect();
                let got = candidates(&row, k, &[0, n as u32]);
                let got_bits: Vec<(u32, u32)> = got.top.iter().map(|&(i, v)| (i, v.to_bits())).collect();
                assert_eq!(got_bits, want, "n {n} k {k}");
                assert_eq!(got.gathered[0].to_bits(), row[0].to_bits());
                assert_eq!(got.gathered[1], f32::NEG_INFINITY);
            }
        }
    }
}
