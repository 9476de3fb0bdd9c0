//! The single-sequence driver of a [`Generation`]: prefill with prefix reuse, then one pass per
//! token, until the answer ends, the caller stops it, or `cancel` is set. The CLI and the
//! browser run answers through it; the server runs many at once through its own batched
//! scheduler, over the same [`Generation`].
//!
//! Written once as a future (the browser awaits each readback on its event loop); native
//! callers block on it with [`generate`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::error::EngineError;
use super::generation::{Finish, Generation, Head, Step, Want};
use super::session::Session;
use crate::backend::Backend;
use crate::model::HeadResult;

/// The caller's answer after each step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Stop,
}

/// Error unless `prompt` tokens leave room in a context of `n_ctx` for one generated token.
pub fn check_fits(prompt: usize, n_ctx: usize) -> Result<(), EngineError> {
    if prompt >= n_ctx {
        return Err(EngineError::PromptTooLong { tokens: prompt, n_ctx });
    }
    Ok(())
}

/// The head result of one row as what [`Generation::step`] takes, for a pass that asked for
/// `want`.
pub fn head_of(result: HeadResult, want: &Want) -> Result<Head, EngineError> {
    Ok(match (result, want) {
        (HeadResult::Logits(l), _) => Head::Logits(l),
        (HeadResult::Ids(ids), _) => Head::Argmax(*ids.first().ok_or(EngineError::WrongResult)?),
        (HeadResult::Candidates(mut c), Want::TopK(plan) | Want::Argmax(plan)) => {
            Head::Candidates(c.pop().ok_or(EngineError::WrongResult)?, Arc::new(plan.clone()))
        }
        (HeadResult::Candidates(_), Want::Logits) | (HeadResult::Hidden(_), _) => return Err(EngineError::WrongResult),
    })
}

/// Generate the answer of `gen` on `session`, reusing the session's cached prefix of its
/// prompt; `on_step` sees every step (the last one has `finish` set). `cancel` is checked
/// before every pass.
pub async fn generate_async<B: Backend>(
    session: &mut Session<B>,
    gen: &mut Generation<'_>,
    cancel: &AtomicBool,
    on_step: impl FnMut(&Step) -> Flow,
) -> Result<Finish, EngineError> {
    generate_pausing(session, gen, cancel, on_step, || std::future::ready(())).await
}

/// [`generate_async`], awaiting `pause()` after every step: the browser hands its event loop
/// a turn there, so a stop request posted to the worker is seen between tokens even when
/// the backend computes without awaiting anything (the CPU).
pub async fn generate_pausing<B: Backend, P: std::future::Future<Output = ()>>(
    session: &mut Session<B>,
    gen: &mut Generation<'_>,
    cancel: &AtomicBool,
    mut on_step: impl FnMut(&Step) -> Flow,
    mut pause: impl FnMut() -> P,
) -> Result<Finish, EngineError> {
    check_fits(gen.prompt().len(), session.n_ctx())?;
    let cached = session.reuse_prefix(gen.prompt())?;
    gen.set_cached(cached);
    let mut next = gen.prompt()[cached..].to_vec();
    loop {
        if cancel.load(Ordering::Relaxed) {
            on_step(&gen.cancel_step());
            return Ok(Finish::Cancelled);
        }
        let want = gen.want(session.tokens(), &next);
        let result = session.eval(&next, 1, want.head())?.await?;
        let step = gen.step(head_of(result, &want)?, session.tokens(), session.n_ctx())?;
        let flow = on_step(&step);
        if let Some(f) = step.finish {
            return Ok(f);
        }
        if flow == Flow::Stop {
            on_step(&gen.cancel_step());
            return Ok(Finish::Cancelled);
        }
        next = step.token.into_iter().collect();
        pause().await;
    }
}

/// [`generate_async`], blocking (native callers).
#[cfg(not(target_arch = "wasm32"))]
pub fn generate<B: Backend>(
    session: &mut Session<B>,
    gen: &mut Generation<'_>,
    cancel: &AtomicBool,
    on_step: impl FnMut(&Step) -> Flow,
) -> Result<Finish, EngineError> {
    pollster::block_on(generate_async(session, gen, cancel, on_step))
}
