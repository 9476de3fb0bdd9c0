//! One answer being generated, as a state machine every front end drives: after each forward
//! pass it takes the output head's result for the sequence ([`Head`]) and samples the next
//! token (masked to a forced start where one is asked for), then turns it into text (a
//! UTF-8-safe streaming decoder), holds back what may be a stop string, routes the text into
//! content, reasoning and tool calls, and counts usage and time.
//!
//! The forward passes are not its business: a single-sequence loop ([`super::drive`]) and the
//! server's batched scheduler both feed it, so the CLI, the server and the browser produce
//! the same answers from the same code. [`Generation::want`] says what the next pass must hand
//! back (the logits, or on a GPU only an argmax or the sampler's candidates).

use std::sync::Arc;

use web_time::Instant;

use super::error::EngineError;
use super::request::Prepared;
use super::settings::Settings;
use super::stop::StopMatcher;
use crate::chat::router::{OutputRouter, Routed};
use crate::grammar::{Constraint, LazyCalls, Watch};
use crate::model::HeadWant;
use crate::sample::{log_softmax_top_k, Candidates, Plan, Sampler};
use crate::tokenizer::{StreamDecoder, Tokenizer};

/// Why an answer ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// The model produced an end-of-generation token (counted, not shown).
    EndOfGeneration,
    /// A stop string matched (not shown, nor anything after it).
    StopString,
    /// The token budget (`max_tokens`) is spent.
    Length,
    /// The context is full.
    ContextFull,
    /// The caller stopped it.
    Cancelled,
}

impl Finish {
    /// OpenAI's `finish_reason` (`tool_calls` when the answer made calls and stopped).
    pub fn openai(self, tool_calls: bool) -> &'static str {
        match self {
            Finish::Length | Finish::ContextFull => "length",
            _ if tool_calls => "tool_calls",
            _ => "stop",
        }
    }
}

/// Counts and wall-clock times of one answer.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Prompt tokens whose state was reused instead of recomputed.
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    /// From the start to the first token's logits.
    pub prefill_s: f64,
    /// From the first token's logits to the last token's, i.e. `completion_tokens - 1` steps.
    pub decode_s: f64,
}

impl Usage {
    /// Prompt tokens actually computed per second.
    pub fn prefill_tok_s(&self) -> f64 {
        rate(self.prompt_tokens.saturating_sub(self.cached_tokens), self.prefill_s)
    }

    /// Decode steps per second (the first token comes from the prefill).
    pub fn decode_tok_s(&self) -> f64 {
        rate(self.completion_tokens.saturating_sub(1), self.decode_s)
    }
}

fn rate(n: usize, s: f64) -> f64 {
    if s > 0.0 {
        n as f64 / s
    } else {
        0.0
    }
}

/// A token's log-probability under the model (before any sampling setting) and the most
/// likely alternatives, best first.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    /// The token's bytes (may be part of a character).
    pub piece: Vec<u8>,
    pub logprob: f32,
    /// `(id, piece, logprob)`.
    pub top: Vec<(u32, Vec<u8>, f32)>,
}

/// What one sampled token gave.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// The token (`None` on the closing step of an answer the caller stopped).
    pub token: Option<u32>,
    pub logprob: Option<TokenLogprob>,
    /// The answer's text that is now decided, routed (empty while text is held back: part
    /// of a character, a possible stop string or tool-call marker).
    pub outputs: Vec<Routed>,
    /// Set on the answer's last step.
    pub finish: Option<Finish>,
    /// The stop string that ended the answer (on its last step, when one did).
    pub stop: Option<String>,
}

/// What the next pass's output head must hand back for this answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Want {
    /// The logits (logprobs, a forced start, or a sampler that needs the whole row).
    Logits,
    /// Only the argmax (plain greedy); the plan is the greedy one, for batching it with others.
    Argmax(Plan),
    /// Only the candidates for the plan.
    TopK(Plan),
}

impl Want {
    /// The one head a batch of answers shares: the logits if one of them needs them, the
    /// argmax if all of them are plain greedy, else the candidates for the union of their
    /// plans (a wider plan serves every narrower one).
    pub fn union<'a>(wants: impl IntoIterator<Item = &'a Want>) -> Want {
        let (mut k, mut gather, mut all_argmax, mut any) = (0, Vec::new(), true, false);
        for w in wants {
            any = true;
            let plan = match w {
                Want::Logits => return Want::Logits,
                Want::Argmax(p) => p,
                Want::TopK(p) => {
                    all_argmax = false;
                    p
                }
            };
            k = k.max(plan.k);
            gather.extend_from_slice(&plan.gather);
        }
        gather.sort_unstable();
        gather.dedup();
        let plan = Plan { k, gather };
        match (any, all_argmax) {
            (false, _) => Want::Logits,
            (true, true) => Want::Argmax(plan),
            (true, false) => Want::TopK(plan),
        }
    }

    /// The output head's request.
    pub fn head(&self) -> HeadWant<'_> {
        match self {
            Want::Logits => HeadWant::Logits,
            Want::Argmax(_) => HeadWant::Argmax,
            Want::TopK(p) => HeadWant::TopK {
                k: p.k,
                gather: &p.gather,
            },
        }
    }
}

/// The output head's result for one answer's next token.
#[derive(Debug, Clone, PartialEq)]
pub enum Head {
    Logits(Vec<f32>),
    Argmax(u32),
    /// The candidates for a plan at least as wide as the answer's own.
    Candidates(Candidates, Arc<Plan>),
}

/// One answer in progress. See the module docs.
pub struct Generation<'t> {
    tok: &'t Tokenizer,
    sampler: Sampler,
    decoder: StreamDecoder<'t>,
    stop: StopMatcher,
    router: Option<OutputRouter>,
    /// Routed from a forced opening before any token; handed out with the first step.
    opening: Vec<Routed>,
    /// One of these token sequences must start the answer (empty: free).
    must_start: Vec<Vec<u32>>,
    /// The grammar the answer is held to.
    constraint: Option<Constraint>,
    /// Watching a free answer for the start of a tool call (then `constraint` holds the call).
    lazy_calls: Option<LazyCalls>,
    /// `constraint` holds a part of the answer (a call begun under `auto`): dropped once it
    /// accepts.
    release_constraint: bool,
    logprobs: Option<usize>,
    max_tokens: Option<usize>,
    parallel_tool_calls: bool,
    /// Tool calls handed out so far.
    calls: usize,
    prompt: Vec<u32>,
    usage: Usage,
    started: Instant,
    decode_start: Option<Instant>,
    finished: Option<Finish>,
}

impl<'t> Generation<'t> {
    /// An answer to `prepared` with `settings`; the clock starts now.
    pub fn new(tok: &'t Tokenizer, prepared: Prepared, settings: Settings) -> Result<Self, EngineError> {
        if prepared.prompt.is_empty() {
            return Err(EngineError::EmptyInput);
        }
        if settings.max_tokens == Some(0) {
            return Err(EngineError::NothingToGenerate);
        }
        let mut router = prepared.router.map(OutputRouter::new);
        let opening = match (&mut router, &prepared.opening) {
            (Some(r), Some(open)) => r.push(open),
            _ => Vec::new(),
        };
        let mut g = Generation {
            tok,
            sampler: Sampler::new(settings.sampler)?,
            decoder: StreamDecoder::new(tok),
            stop: StopMatcher::new(settings.stop),
            router,
            opening: Vec::new(),
            must_start: prepared.must_start,
            constraint: prepared.constraint,
            lazy_calls: prepared.lazy_calls,
            release_constraint: false,
            logprobs: settings.logprobs,
            max_tokens: settings.max_tokens,
            parallel_tool_calls: settings.parallel_tool_calls,
            calls: 0,
            usage: Usage {
                prompt_tokens: prepared.prompt.len(),
                ..Usage::default()
            },
            prompt: prepared.prompt,
            started: Instant::now(),
            decode_start: None,
            finished: None,
        };
        g.opening = g.limit_calls(opening);
        Ok(g)
    }

    /// The prompt's tokens.
    pub fn prompt(&self) -> &[u32] {
        &self.prompt
    }

    /// Counts and times so far.
    pub fn usage(&self) -> Usage {
        self.usage
    }

    /// How it ended, once it has.
    pub fn finished(&self) -> Option<Finish> {
        self.finished
    }

    /// `cached` prompt tokens were reused from the sequence's state.
    pub fn set_cached(&mut self, cached: usize) {
        self.usage.cached_tokens = cached;
    }

    /// What the output head must hand back after `next` is evaluated behind `history`.
    pub fn want(&self, history: &[u32], next: &[u32]) -> Want {
        if self.logprobs.is_some() || !self.must_start.is_empty() || self.constraint.is_some() {
            return Want::Logits;
        }
        match self.sampler.plan_after(history, next) {
            None => Want::Logits,
            Some(plan) if self.sampler.config().is_plain_greedy() => Want::Argmax(plan),
            Some(plan) => Want::TopK(plan),
        }
    }

    /// Take the head's result for the next token: sample it and say what it gave. `history`
    /// is the sequence's evaluated tokens (the prompt and the answer so far); `n_ctx` its
    /// context. The step's `finish` is set when the answer ends with it: the token is then not
    /// to be evaluated.
    pub fn step(&mut self, head: Head, history: &[u32], n_ctx: usize) -> Result<Step, EngineError> {
        if self.finished.is_some() {
            return Err(EngineError::Finished);
        }
        let now = Instant::now();
        if self.decode_start.is_none() {
            self.usage.prefill_s = now.duration_since(self.started).as_secs_f64();
            self.decode_start = Some(now);
        }
        let (token, logprob) = match head {
            Head::Argmax(t) => (t, None),
            Head::Candidates(c, plan) => (self.sampler.sample_candidates(&c, &plan, history), None),
            Head::Logits(logits) => {
                let token = self.sample_logits(&logits, history)?;
                let lp = self.logprobs.map(|k| self.logprob(&logits, token, k));
                (token, lp)
            }
        };
        self.usage.completion_tokens += 1;
        let mut outputs = std::mem::take(&mut self.opening);
        if self.tok.is_eog(token) {
            outputs.extend(self.flush(Finish::EndOfGeneration));
            return Ok(self.end(token, logprob, outputs, Finish::EndOfGeneration));
        }
        let piece = self.decoder.push(token).unwrap_or_default();
        self.watch_for_call(&piece);
        let (mut text, matched) = self.stop.push(&piece);
        let budget = self.max_tokens.is_some_and(|m| self.usage.completion_tokens >= m);
        // Prompt and answer together fill the context (the token just sampled would take its
        // last place).
        let full = history.len() + 1 >= n_ctx;
        if (budget || full) && !matched {
            // Nothing follows: held text (part of a character, a partial stop string) is output.
            let (more, hit) = self.stop.push(&self.decoder.finish());
            text.push_str(&more);
            if !hit {
                text.push_str(&self.stop.finish());
            }
        }
        outputs.extend(self.route(&text));
        let finish = if matched {
            Some(Finish::StopString)
        } else if budget {
            Some(Finish::Length)
        } else if full {
            Some(Finish::ContextFull)
        } else {
            None
        };
        match finish {
            Some(f) => {
                outputs.extend(self.route_finish());
                Ok(self.end(token, logprob, outputs, f))
            }
            None => Ok(Step {
                token: Some(token),
                logprob,
                outputs,
                finish: None,
                stop: None,
            }),
        }
    }

    /// End the answer early (the caller stopped it): the closing step, with what was held
    /// back.
    pub fn cancel_step(&mut self) -> Step {
        let mut outputs = std::mem::take(&mut self.opening);
        if self.finished.is_none() {
            outputs.extend(self.flush(Finish::Cancelled));
            self.close(Finish::Cancelled);
        }
        Step {
            token: None,
            logprob: None,
            outputs,
            finish: Some(Finish::Cancelled),
            stop: None,
        }
    }

    /// The last step: usage closed, the answer finished.
    fn end(&mut self, token: u32, logprob: Option<TokenLogprob>, outputs: Vec<Routed>, finish: Finish) -> Step {
        self.close(finish);
        Step {
            token: Some(token),
            logprob,
            outputs,
            finish: Some(finish),
            stop: self
                .stop
                .matched()
                .filter(|_| finish == Finish::StopString)
                .map(String::from),
        }
    }

    fn close(&mut self, finish: Finish) {
        self.finished = Some(finish);
        let now = Instant::now();
        match self.decode_start {
            Some(t) => self.usage.decode_s = now.duration_since(t).as_secs_f64(),
            None => self.usage.prefill_s = now.duration_since(self.started).as_secs_f64(),
        }
    }

    /// Everything held back, as the answer ends for `finish`.
    fn flush(&mut self, finish: Finish) -> Vec<Routed> {
        let mut text = self.stop.push(&self.decoder.finish()).0;
        if finish != Finish::StopString {
            text.push_str(&self.stop.finish());
        }
        let mut out = self.route(&text);
        out.extend(self.route_finish());
        out
    }

    /// `text` routed (or as content when the answer is not routed).
    fn route(&mut self, text: &str) -> Vec<Routed> {
        let routed = match &mut self.router {
            Some(r) => r.push(text),
            None if text.is_empty() => Vec::new(),
            None => vec![Routed::Content(text.to_string())],
        };
        self.limit_calls(routed)
    }

    /// What the router still holds, at the end.
    fn route_finish(&mut self) -> Vec<Routed> {
        let routed = self.router.as_mut().map(OutputRouter::finish).unwrap_or_default();
        self.limit_calls(routed)
    }

    /// `parallel_tool_calls: false`: drop the calls after the first.
    fn limit_calls(&mut self, routed: Vec<Routed>) -> Vec<Routed> {
        routed
            .into_iter()
            .filter(|r| {
                if !matches!(r, Routed::ToolCall(_)) {
                    return true;
                }
                self.calls += 1;
                self.parallel_tool_calls || self.calls == 1
            })
            .collect()
    }

    /// Under `auto`: hold a call to its schema once `piece` (the answer's latest text) has
    /// begun one.
    fn watch_for_call(&mut self, piece: &str) {
        let Some(lazy) = &mut self.lazy_calls else { return };
        match lazy.push(piece) {
            Watch::Pending => {}
            Watch::Free => self.lazy_calls = None,
            Watch::Call(constraint) => {
                self.constraint = Some(*constraint);
                self.release_constraint = true;
                self.lazy_calls = None;
            }
        }
    }

    /// Sample from the whole row, masked to the grammar or to the forced start while there is
    /// one.
    fn sample_logits(&mut self, logits: &[f32], history: &[u32]) -> Result<u32, EngineError> {
        if let Some(c) = &mut self.constraint {
            let mut masked = logits.to_vec();
            c.mask(&mut masked)?;
            let token = self.sampler.sample(&masked, history);
            c.commit(token, self.tok.is_eog(token))?;
            if self.release_constraint && c.is_accepting() {
                self.constraint = None;
                self.release_constraint = false;
            }
            return Ok(token);
        }
        if self.must_start.is_empty() {
            return Ok(self.sampler.sample(logits, history));
        }
        let k = self.usage.completion_tokens;
        let mut masked = vec![f32::NEG_INFINITY; logits.len()];
        for seq in &self.must_start {
            if let Some(&t) = seq.get(k).filter(|&&t| (t as usize) < logits.len()) {
                masked[t as usize] = logits[t as usize];
            }
        }
        let token = self.sampler.sample(&masked, history);
        // Keep the sequences still followed; once one is complete the answer is free.
        let done = self.must_start.iter().any(|q| q.len() == k + 1 && q[k] == token);
        self.must_start.retain(|q| q.len() > k + 1 && q[k] == token);
        if done {
            self.must_start.clear();
        }
        Ok(token)
    }

    /// The model's log-probability of `token` (before sampling settings) and the top `k`.
    fn logprob(&self, logits: &[f32], token: u32, k: usize) -> TokenLogprob {
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
        let piece = |id: u32| self.tok.token_to_piece(id).unwrap_or_default();
        TokenLogprob {
            id: token,
            piece: piece(token),
            logprob: (f64::from(logit) - log_z) as f32,
            top: log_softmax_top_k(logits, k)
                .into_iter()
                .map(|(id, lp)| (id, piece(id), lp))
                .collect(),
        }
    }
}
