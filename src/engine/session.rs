//! One conversation's state on a model: the tokens evaluated so far and their KV cache.
//!
//! Prompts run as chunked prefill (batched matmuls over up to `n_batch` tokens at a time);
//! decoding is the same path with one token. Logits are computed only for the rows a caller
//! asks for, because the output projection is the largest matmul of small models.

use std::sync::Arc;

use super::{EngineError, KvCache};
use crate::backend::Backend;
use crate::model::{HeadOutput, Model, Scratch, SeqChunk};
use crate::sample::{Candidates, Plan};

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
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            n_ctx: 4096,
            n_batch: 512,
            n_logit_rows: 32,
        }
    }
}

/// Evaluation state of one token sequence.
pub struct Session<B: Backend> {
    model: Arc<Model<B>>,
    kv: KvCache<B>,
    scratch: Scratch<B>,
    tokens: Vec<u32>,
    n_batch: usize,
}

impl<B: Backend> Session<B> {
    /// A session with its KV cache and scratch allocated up front.
    pub fn new(model: Arc<Model<B>>, config: SessionConfig) -> Result<Self, EngineError> {
        let max = model.config().context_length;
        let n_ctx = if config.n_ctx == 0 { max } else { config.n_ctx.min(max) };
        let n_batch = config.n_batch.clamp(1, n_ctx.max(1));
        let kv = KvCache::new(model.backend(), model.config(), n_ctx)?;
        let scratch = Scratch::new(&model, n_batch, config.n_logit_rows)?;
        Ok(Session {
            model,
            kv,
            scratch,
            tokens: Vec::new(),
            n_batch,
        })
    }

    pub fn model(&self) -> &Arc<Model<B>> {
        &self.model
    }

    /// Context size in tokens.
    pub fn n_ctx(&self) -> usize {
        self.kv.n_ctx()
    }

    /// Tokens evaluated so far (their K/V are cached).
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Position of the next token.
    pub fn pos(&self) -> usize {
        self.tokens.len()
    }

    /// Forget everything.
    pub fn reset(&mut self) {
        self.tokens.clear();
    }

    /// Drop cached tokens after the first `n`.
    pub fn truncate(&mut self, n: usize) {
        self.tokens.truncate(n);
    }

    /// Length of the common prefix of the cached tokens and `tokens`.
    pub fn common_prefix(&self, tokens: &[u32]) -> usize {
        self.tokens.iter().zip(tokens).take_while(|(a, b)| a == b).count()
    }

    /// Prepare to evaluate `prompt` from scratch while reusing the cached prefix it shares:
    /// truncates the cache to that prefix, keeping at least one token of `prompt` to compute
    /// (so there are logits to return). Returns how many tokens of `prompt` are already done;
    /// evaluate `prompt[n..]` next.
    pub fn reuse_prefix(&mut self, prompt: &[u32]) -> usize {
        let n = self.common_prefix(prompt).min(prompt.len().saturating_sub(1));
        self.truncate(n);
        n
    }

    /// [`Session::reuse_prefix`] then evaluate the rest of `prompt`; logits of its last token.
    pub fn prefill(&mut self, prompt: &[u32]) -> Result<Vec<f32>, EngineError> {
        let done = self.reuse_prefix(prompt);
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

    /// Check that `tokens` can be appended and `n_last` of their logits returned.
    fn check(&self, tokens: &[u32], n_last: usize) -> Result<(), EngineError> {
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
        let n_vocab = self.model.config().n_vocab;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(EngineError::TokenOutOfRange { token: bad, n_vocab });
        }
        Ok(())
    }

    /// Append `tokens` and return the logits of the last `n_last` of them
    /// (`n_last * n_vocab`, row-major). On error the session keeps the tokens before the call.
    pub fn forward_tail(&mut self, tokens: &[u32], n_last: usize) -> Result<Vec<f32>, EngineError> {
        let mut logits = Vec::with_capacity(n_last * self.model.config().n_vocab);
        self.forward_into(tokens, n_last, HeadOutput::Logits(&mut logits))?;
        Ok(logits)
    }

    /// Append `tokens` and return the argmax of the last one's logits, computed on the backend
    /// (greedy decoding without penalties: a GPU backend reads back one id, not the logits).
    /// The same id as [`crate::sample::argmax`] of [`Session::forward`]'s logits.
    pub fn forward_argmax(&mut self, tokens: &[u32]) -> Result<u32, EngineError> {
        let mut ids = Vec::with_capacity(1);
        self.forward_into(tokens, 1, HeadOutput::Argmax(&mut ids))?;
        Ok(ids[0])
    }

    /// Append `tokens` and return the sampler candidates of the last one's logits for `plan`
    /// ([`crate::sample::Sampler::plan`]), computed on the backend: a GPU backend reads back
    /// the candidates, not the logits.
    pub fn forward_candidates(&mut self, tokens: &[u32], plan: &Plan) -> Result<Candidates, EngineError> {
        let mut out = Vec::with_capacity(1);
        self.forward_into(
            tokens,
            1,
            HeadOutput::TopK {
                k: plan.k,
                gather: &plan.gather,
                out: &mut out,
            },
        )?;
        Ok(out.pop().unwrap_or_default())
    }

    /// Append `tokens`, sending the output head's result for the last `n_last` to `out`.
    fn forward_into(&mut self, tokens: &[u32], n_last: usize, mut out: HeadOutput<'_>) -> Result<(), EngineError> {
        self.check(tokens, n_last)?;
        let first_logit = tokens.len() - n_last;
        let start = self.tokens.len();
        for (ci, chunk) in tokens.chunks(self.n_batch).enumerate() {
            let off = ci * self.n_batch;
            let from = first_logit.saturating_sub(off).min(chunk.len());
            let pos0 = start + off;
            let r = self
                .model
                .forward_chunk(&mut self.kv, &mut self.scratch, chunk, pos0, from, out.reborrow());
            if let Err(e) = r {
                self.tokens.truncate(start);
                return Err(e.into());
            }
            self.tokens.extend_from_slice(chunk);
        }
        Ok(())
    }
}

/// One session's share of a [`forward_batch`] pass.
pub struct BatchItem<'a, B: Backend> {
    pub session: &'a mut Session<B>,
    /// Tokens to append: a decode step's one token or a prefill chunk.
    pub tokens: &'a [u32],
    /// How many of the last tokens' logits to return (0 for a prefill chunk that does not
    /// end its prompt).
    pub n_last: usize,
}

/// Append each item's tokens to its session in one forward pass over all of them, and return
/// each item's logits (`n_last * n_vocab`, row-major, in item order). The sessions must run
/// the same model and hold `scratch`'s capacity of tokens in all ([`Scratch::new`] sizes it);
/// the results equal running each item alone with [`Session::forward_tail`]. On error no
/// session changes.
pub fn forward_batch<B: Backend>(
    scratch: &mut Scratch<B>,
    items: &mut [BatchItem<'_, B>],
) -> Result<Vec<Vec<f32>>, EngineError> {
    let Some(first) = items.first() else {
        return Ok(Vec::new());
    };
    let n_vocab = first.session.model.config().n_vocab;
    let mut logits = Vec::new();
    batch_pass(scratch, items, HeadOutput::Logits(&mut logits))?;
    let mut out = Vec::with_capacity(items.len());
    let mut at = 0;
    for it in items.iter() {
        out.push(logits[at..at + it.n_last * n_vocab].to_vec());
        at += it.n_last * n_vocab;
    }
    Ok(out)
}

/// [`forward_batch`] handing back each item's sampler candidates (its `n_last` rows') instead
/// of logits: the `k` largest and the values at `gather`, for the largest plan of the batch
/// ([`crate::sample::Sampler::sample_candidates`] draws from a wider plan what it would from
/// its own).
pub fn forward_batch_candidates<B: Backend>(
    scratch: &mut Scratch<B>,
    items: &mut [BatchItem<'_, B>],
    plan: &Plan,
) -> Result<Vec<Vec<Candidates>>, EngineError> {
    let mut all = Vec::new();
    batch_pass(
        scratch,
        items,
        HeadOutput::TopK {
            k: plan.k,
            gather: &plan.gather,
            out: &mut all,
        },
    )?;
    let mut rows = all.into_iter();
    Ok(items.iter().map(|it| rows.by_ref().take(it.n_last).collect()).collect())
}

/// One pass over all items, results to `out`; then each session holds its tokens.
fn batch_pass<B: Backend>(
    scratch: &mut Scratch<B>,
    items: &mut [BatchItem<'_, B>],
    out: HeadOutput<'_>,
) -> Result<(), EngineError> {
    let Some(first) = items.first() else {
        return Ok(());
    };
    let model = Arc::clone(&first.session.model);
    for it in items.iter() {
        if !Arc::ptr_eq(&model, &it.session.model) {
            return Err(EngineError::MixedModels);
        }
        it.session.check(it.tokens, it.n_last)?;
    }
    {
        let mut seqs: Vec<SeqChunk<'_, B>> = items
            .iter_mut()
            .map(|it| SeqChunk {
                pos0: it.session.tokens.len(),
                logits_from: it.tokens.len() - it.n_last,
                kv: &mut it.session.kv,
                tokens: it.tokens,
            })
            .collect();
        model.forward_batch_to(scratch, &mut seqs, out)?;
    }
    for it in items.iter_mut() {
        it.session.tokens.extend_from_slice(it.tokens);
    }
    Ok(())
}
