//! One conversation's state on a model: the tokens evaluated so far and the model's state for
//! them ([`SeqState`], opaque here).
//!
//! Prompts run as chunked prefill (batched matmuls over up to `n_batch` tokens at a time);
//! decoding is the same path with one token. The output head runs only for the rows a caller
//! asks for, because it is the largest matmul of small models. Results come back as a
//! [`Readback`]: native callers use the blocking methods (`forward`, ...), the browser awaits
//! [`Session::eval`]'s result.

use std::sync::Arc;

use super::error::EngineError;
use crate::backend::{Backend, KvType, Readback};
use crate::model::{HeadResult, HeadWant, Model, Scratch, SeqChunk, SeqState};

/// Session sizing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionConfig {
    /// Context size in tokens; 0 or more than the model's trained context means the model's.
    pub n_ctx: usize,
    /// Most tokens per forward chunk (llama.cpp's micro-batch, `-ub`).
    pub n_batch: usize,
    /// Most rows whose logits are computed at once (bounds the logits scratch to
    /// `n_logit_rows * n_vocab`).
    pub n_logit_rows: usize,
    /// The KV cache's format (`--cache-type`; f16 by default).
    pub cache_type: KvType,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            n_ctx: 4096,
            n_batch: 512,
            n_logit_rows: 32,
            cache_type: KvType::F16,
        }
    }
}

/// Evaluation state of one token sequence.
pub struct Session<B: Backend> {
    model: Arc<Model<B>>,
    state: SeqState<B>,
    scratch: Scratch<B>,
    tokens: Vec<u32>,
    n_batch: usize,
}

impl<B: Backend> Session<B> {
    /// A session with its state and scratch allocated up front.
    pub fn new(model: Arc<Model<B>>, config: SessionConfig) -> Result<Self, EngineError> {
        let max = model.info().context_length;
        let n_ctx = if config.n_ctx == 0 { max } else { config.n_ctx.min(max) };
        let n_batch = config.n_batch.clamp(1, n_ctx.max(1));
        let state = model.new_state(n_ctx, config.cache_type)?;
        let scratch = model.scratch(n_batch, config.n_logit_rows)?;
        Ok(Session {
            model,
            state,
            scratch,
            tokens: Vec::new(),
            n_batch,
        })
    }

    pub fn model(&self) -> &Arc<Model<B>> {
        &self.model
    }

    /// The model's state for this sequence (tests look inside their own kinds).
    pub fn state(&self) -> &SeqState<B> {
        &self.state
    }

    /// Context size in tokens.
    pub fn n_ctx(&self) -> usize {
        self.state.n_ctx()
    }

    /// Tokens evaluated so far.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Position of the next token.
    pub fn pos(&self) -> usize {
        self.tokens.len()
    }

    /// Keep at most `n` recurrent-state checkpoints for prefix reuse (hybrid models; a KV
    /// cache needs none).
    pub fn set_checkpoint_limit(&mut self, n: usize) {
        self.state.set_checkpoint_limit(n);
    }

    /// Recurrent-state checkpoints held, and their bytes.
    pub fn checkpoint_stats(&self) -> (usize, usize) {
        self.state.checkpoint_stats()
    }

    /// Forget everything.
    pub fn reset(&mut self) {
        // Every state can go back to nothing.
        let _ = self.state.rewind(self.tokens.len(), 0);
        self.tokens.clear();
    }

    /// Length of the common prefix of the evaluated tokens and `tokens`.
    pub fn common_prefix(&self, tokens: &[u32]) -> usize {
        self.tokens.iter().zip(tokens).take_while(|(a, b)| a == b).count()
    }

    /// How many tokens of `prompt` the state can keep: of the shared prefix (leaving at least
    /// one token of `prompt` to compute, so there are logits to return), as far as the state
    /// can go back to (all of it for a KV cache; the latest checkpoint at or before it for a
    /// recurrent state).
    pub fn reusable_prefix(&self, prompt: &[u32]) -> usize {
        let shared = self.common_prefix(prompt).min(prompt.len().saturating_sub(1));
        self.state.resume_point(self.tokens.len(), shared)
    }

    /// Prepare to evaluate `prompt` from scratch while reusing the cached prefix it shares
    /// ([`Session::reusable_prefix`]). Returns how many tokens of `prompt` are already done;
    /// evaluate `prompt[n..]` next.
    pub fn reuse_prefix(&mut self, prompt: &[u32]) -> Result<usize, EngineError> {
        let n = self.reusable_prefix(prompt);
        self.state.rewind(self.tokens.len(), n)?;
        self.tokens.truncate(n);
        Ok(n)
    }

    /// Go back to the first `n` tokens after a failed pass, or to none when the state cannot.
    fn rollback(&mut self, n: usize) {
        if self.state.rewind(self.tokens.len(), n).is_ok() {
            self.tokens.truncate(n);
        } else {
            self.reset();
        }
    }

    /// Check that `tokens` can be appended and `n_last` of their results returned.
    pub(super) fn check(&self, tokens: &[u32], n_last: usize) -> Result<(), EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::EmptyInput);
        }
        if n_last > tokens.len() {
            return Err(EngineError::TooManyLogits {
                wanted: n_last,
                given: tokens.len(),
            });
        }
        let needed = self.tokens.len() + tokens.len();
        if needed > self.n_ctx() {
            return Err(EngineError::ContextOverflow {
                needed,
                n_ctx: self.n_ctx(),
            });
        }
        let n_vocab = self.model.info().n_vocab;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(EngineError::TokenOutOfRange { token: bad, n_vocab });
        }
        Ok(())
    }

    /// Append `tokens` (in chunks of `n_batch`) and have the output head's `want` of the last
    /// `n_last` come back. On an error before the result, the session keeps the tokens before
    /// the call.
    pub fn eval(
        &mut self,
        tokens: &[u32],
        n_last: usize,
        want: HeadWant<'_>,
    ) -> Result<Readback<HeadResult>, EngineError> {
        self.check(tokens, n_last)?;
        let first = tokens.len() - n_last;
        let start = self.tokens.len();
        let mut parts = Vec::new();
        for (ci, chunk) in tokens.chunks(self.n_batch).enumerate() {
            let off = ci * self.n_batch;
            let mut seq = [SeqChunk {
                state: &mut self.state,
                tokens: chunk,
                pos0: start + off,
                logits_from: first.saturating_sub(off).min(chunk.len()),
            }];
            match self.model.forward(&mut self.scratch, &mut seq, want) {
                Ok(r) => parts.push(r),
                Err(e) => {
                    self.rollback(start);
                    return Err(e.into());
                }
            }
            self.tokens.extend_from_slice(chunk);
            self.state.advanced(self.tokens.len());
        }
        Ok(Readback::join(parts).map(HeadResult::concat))
    }
}

/// The native, blocking forms of [`Session::eval`].
#[cfg(not(target_arch = "wasm32"))]
impl<B: Backend> Session<B> {
    /// [`Session::reuse_prefix`] then evaluate the rest of `prompt`; logits of its last token.
    pub fn prefill(&mut self, prompt: &[u32]) -> Result<Vec<f32>, EngineError> {
        let done = self.reuse_prefix(prompt)?;
        self.forward(&prompt[done..])
    }

    /// Append `tokens` and return the logits (`n_vocab`) of the last one.
    pub fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        self.forward_tail(tokens, 1)
    }

    /// Append `tokens` and return the logits of every one of them (`tokens.len() * n_vocab`,
    /// row-major).
    pub fn forward_all(&mut self, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        self.forward_tail(tokens, tokens.len())
    }

    /// Append `tokens` and return the logits of the last `n_last` of them
    /// (`n_last * n_vocab`, row-major).
    pub fn forward_tail(&mut self, tokens: &[u32], n_last: usize) -> Result<Vec<f32>, EngineError> {
        match self.eval(tokens, n_last, HeadWant::Logits)?.wait()? {
            HeadResult::Logits(l) => Ok(l),
            _ => Err(EngineError::WrongResult),
        }
    }

    /// Append `tokens` and return the argmax of the last one's logits, computed on the backend
    /// (greedy decoding without penalties: a GPU backend reads back one id, not the logits).
    /// The same id as [`crate::sample::argmax`] of [`Session::forward`]'s logits.
    pub fn forward_argmax(&mut self, tokens: &[u32]) -> Result<u32, EngineError> {
        match self.eval(tokens, 1, HeadWant::Argmax)?.wait()? {
            HeadResult::Ids(ids) => ids.first().copied().ok_or(EngineError::WrongResult),
            _ => Err(EngineError::WrongResult),
        }
    }

    /// Append `tokens` and return the sampler candidates of the last one's logits for `plan`
    /// ([`crate::sample::Sampler::plan`]), computed on the backend: a GPU backend reads back
    /// the candidates, not the logits.
    pub fn forward_candidates(
        &mut self,
        tokens: &[u32],
        plan: &crate::sample::Plan,
    ) -> Result<crate::sample::Candidates, EngineError> {
        let want = HeadWant::TopK {
            k: plan.k,
            gather: &plan.gather,
        };
        match self.eval(tokens, 1, want)?.wait()? {
            HeadResult::Candidates(mut c) => c.pop().ok_or(EngineError::WrongResult),
            _ => Err(EngineError::WrongResult),
        }
    }
}

/// One session's share of a [`forward_batch`] pass.
pub struct BatchItem<'a, B: Backend> {
    pub session: &'a mut Session<B>,
    /// Tokens to append: a decode step's one token or a prefill chunk.
    pub tokens: &'a [u32],
    /// How many of the last tokens' results to return (0 for a prefill chunk that does not
    /// end its prompt).
    pub n_last: usize,
}

/// Append each item's tokens to its session in one forward pass over all of them; each item's
/// `want` of its `n_last` rows comes back, in item order. The sessions must run the same model
/// and `scratch` hold all their tokens ([`Model::scratch`]); the results equal running each
/// item alone. On an error before the result no session changes.
pub fn forward_batch<B: Backend>(
    scratch: &mut Scratch<B>,
    items: &mut [BatchItem<'_, B>],
    want: HeadWant<'_>,
) -> Result<Readback<Vec<HeadResult>>, EngineError> {
    let Some(first) = items.first() else {
        return Ok(Readback::ready(Vec::new()));
    };
    let model = Arc::clone(&first.session.model);
    for it in items.iter() {
        if !Arc::ptr_eq(&model, &it.session.model) {
            return Err(EngineError::MixedModels);
        }
        it.session.check(it.tokens, it.n_last)?;
    }
    let counts: Vec<usize> = items.iter().map(|it| it.n_last).collect();
    let result = {
        let mut seqs: Vec<SeqChunk<'_, B>> = items
            .iter_mut()
            .map(|it| SeqChunk {
                pos0: it.session.tokens.len(),
                logits_from: it.tokens.len() - it.n_last,
                state: &mut it.session.state,
                tokens: it.tokens,
            })
            .collect();
        model.forward(scratch, &mut seqs, want)?
    };
    for it in items.iter_mut() {
        it.session.tokens.extend_from_slice(it.tokens);
        let len = it.session.tokens.len();
        it.session.state.advanced(len);
    }
    let (n_vocab, n_embd) = (model.info().n_vocab, model.info().n_embd);
    Ok(result.map(move |r| r.split(&counts, n_vocab, n_embd)))
}
