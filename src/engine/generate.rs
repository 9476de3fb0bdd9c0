//! The generation loop shared by every front end (CLI, server, browser): prefill with prefix
//! reuse, sample token by token, stop on end-of-generation, the token budget, the context end
//! or cancellation, and time both phases.

use std::sync::atomic::{AtomicBool, Ordering};

use web_time::Instant;

use super::{EngineError, Session};
use crate::backend::Backend;
use crate::sample::{log_softmax_top_k, Candidates, Plan, Sampler};

/// What to generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GenerateParams {
    /// Most tokens to generate (at least 1).
    pub max_tokens: usize,
    /// Alternatives to report per generated token (0 = none).
    pub top_logprobs: usize,
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The model produced an end-of-generation token (included in the output).
    EndOfGeneration,
    /// `max_tokens` were generated.
    Length,
    /// The context is full.
    ContextFull,
    /// The caller cancelled (flag set, or the token callback asked to stop).
    Cancelled,
}

/// Counts and wall-clock times of one generation.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timings {
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV was reused from the session instead of recomputed.
    pub cached_tokens: usize,
    pub prefill_s: f64,
    pub generated_tokens: usize,
    /// From the first token's logits to the last token's, i.e. `generated_tokens - 1` steps.
    pub decode_s: f64,
}

impl Timings {
    /// Prompt tokens actually computed per second.
    pub fn prefill_tok_s(&self) -> f64 {
        rate(self.prompt_tokens - self.cached_tokens, self.prefill_s)
    }

    /// Decode steps per second (the first token comes from the prefill).
    pub fn decode_tok_s(&self) -> f64 {
        rate(self.generated_tokens.saturating_sub(1), self.decode_s)
    }
}

fn rate(n: usize, s: f64) -> f64 {
    if s > 0.0 {
        n as f64 / s
    } else {
        0.0
    }
}

/// One generated token as reported to the callback.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenEvent {
    pub token: u32,
    /// `(id, logprob)` of the most likely alternatives, best first (empty unless requested).
    pub top_logprobs: Vec<(u32, f32)>,
}

/// The callback's answer after each token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Stop,
}

/// What a forward step hands to the sampling step.
enum Next {
    /// The last token's logits (`n_vocab`).
    Logits(Vec<f32>),
    /// The backend's argmax of them (plain greedy).
    Token(u32),
    /// The backend's sampler candidates of them (top-k sampling without logprobs).
    Candidates(Candidates, Plan),
}

/// The result of [`generate`].
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    pub tokens: Vec<u32>,
    pub top_logprobs: Vec<Vec<(u32, f32)>>,
    pub stop: StopReason,
    pub timings: Timings,
}

/// Generate after `prompt` (which must fit the context). Cached tokens that `prompt` extends
/// are reused. `is_eog` says which tokens end generation; `cancel` is checked between tokens.
pub fn generate<B: Backend>(
    session: &mut Session<B>,
    sampler: &mut Sampler,
    prompt: &[u32],
    params: &GenerateParams,
    is_eog: impl Fn(u32) -> bool,
    cancel: &AtomicBool,
    mut on_token: impl FnMut(&TokenEvent) -> Flow,
) -> Result<Generation, EngineError> {
    if prompt.is_empty() {
        return Err(EngineError::EmptyInput);
    }
    if params.max_tokens == 0 {
        return Err(EngineError::NothingToGenerate);
    }
    if prompt.len() > session.n_ctx() {
        return Err(EngineError::ContextOverflow {
            needed: prompt.len(),
            n_ctx: session.n_ctx(),
        });
    }
    let started = Instant::now();
    let cached = session.reuse_prefix(prompt);
    // Plain greedy without logprobs needs only the argmax, top-k sampling only the candidates
    // (the draw is the same as from the logits): let the backend compute them.
    let on_device = params.top_logprobs == 0 && sampler.config().is_plain_greedy();
    let plan = |sampler: &Sampler, session: &Session<B>, tokens: &[u32]| -> Option<Plan> {
        (params.top_logprobs == 0)
            .then(|| sampler.plan_after(session.tokens(), tokens))
            .flatten()
    };
    let step = |session: &mut Session<B>, tokens: &[u32], plan: Option<Plan>| -> Result<Next, EngineError> {
        Ok(if on_device {
            Next::Token(session.forward_argmax(tokens)?)
        } else if let Some(plan) = plan {
            Next::Candidates(session.forward_candidates(tokens, &plan)?, plan)
        } else {
            Next::Logits(session.forward(tokens)?)
        })
    };
    let first = plan(sampler, session, &prompt[cached..]);
    let mut next = step(session, &prompt[cached..], first)?;
    let mut timings = Timings {
        prompt_tokens: prompt.len(),
        cached_tokens: cached,
        ..Timings::default()
    };
    timings.prefill_s = started.elapsed().as_secs_f64();

    let decode_start = Instant::now();
    let mut out = Generation {
        tokens: Vec::new(),
        top_logprobs: Vec::new(),
        stop: StopReason::Length,
        timings,
    };
    loop {
        if cancel.load(Ordering::Relaxed) {
            out.stop = StopReason::Cancelled;
            break;
        }
        let event = match &next {
            Next::Token(token) => TokenEvent {
                token: *token,
                top_logprobs: Vec::new(),
            },
            Next::Candidates(c, plan) => TokenEvent {
                token: sampler.sample_candidates(c, plan, session.tokens()),
                top_logprobs: Vec::new(),
            },
            Next::Logits(logits) => TokenEvent {
                token: sampler.sample(logits, session.tokens()),
                top_logprobs: if params.top_logprobs > 0 {
                    log_softmax_top_k(logits, params.top_logprobs)
                } else {
                    Vec::new()
                },
            },
        };
        let token = event.token;
        out.tokens.push(token);
        let flow = on_token(&event);
        if params.top_logprobs > 0 {
            out.top_logprobs.push(event.top_logprobs);
        }
        if is_eog(token) {
            out.stop = StopReason::EndOfGeneration;
            break;
        }
        if flow == Flow::Stop {
            out.stop = StopReason::Cancelled;
            break;
        }
        if out.tokens.len() >= params.max_tokens {
            out.stop = StopReason::Length;
            break;
        }
        if session.pos() >= session.n_ctx() {
            out.stop = StopReason::ContextFull;
            break;
        }
        let p = plan(sampler, session, &[token]);
        next = step(session, &[token], p)?;
    }
    out.timings.generated_tokens = out.tokens.len();
    out.timings.decode_s = decode_start.elapsed().as_secs_f64();
    Ok(out)
}
