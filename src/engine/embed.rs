//! Embeddings: one vector per input text, pooled from the model's hidden states after its
//! output norm (llama.cpp's `t_embd`) and scaled to unit length, as llama.cpp's
//! `llama-embedding` and llama-server's `/v1/embeddings` return them.
//!
//! Why here: the server, the CLI and the browser package all answer embedding requests; the
//! pooling rules, the batching of several inputs into shared forward passes and the
//! normalization are written once.
//!
//! Inputs share passes the way the server's slots do ([`forward_batch`]): each input gets a
//! sequence state of its own length, and a pass takes the next chunk of every pending input
//! until `n_batch` rows are filled, so the weights are streamed once per pass, not once per
//! input. The output projection never runs ([`HeadWant::Hidden`]).

use std::sync::Arc;

use super::error::EngineError;
use super::session::{forward_batch, BatchItem, Session, SessionConfig};
use crate::backend::{Backend, KvType};
use crate::gguf::GgufFile;
use crate::model::{HeadResult, HeadWant, Model};

/// How the hidden states of an input's tokens become its vector (llama.cpp's
/// `llama_pooling_type`, the GGUF's `{arch}.pooling_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// Every token's vector (each normalized): not one vector per input.
    None,
    /// The mean over the input's tokens.
    Mean,
    /// The first token's.
    Cls,
    /// The last token's (decoder embedding models such as Qwen3-Embedding).
    Last,
    /// A reranker's relevance score (a classification head on top).
    Rank,
}

impl Pooling {
    pub const NAMES: &'static str = "none, mean, cls, last, rank";

    /// The GGUF's code (`LLAMA_POOLING_TYPE_*`); `None` for an unknown one.
    pub fn from_code(code: i64) -> Option<Pooling> {
        Some(match code {
            0 => Pooling::None,
            1 => Pooling::Mean,
            2 => Pooling::Cls,
            3 => Pooling::Last,
            4 => Pooling::Rank,
            _ => return None,
        })
    }

    /// By name, as `--pooling` takes it.
    pub fn parse(name: &str) -> Result<Pooling, EngineError> {
        Ok(match name {
            "none" => Pooling::None,
            "mean" => Pooling::Mean,
            "cls" => Pooling::Cls,
            "last" => Pooling::Last,
            "rank" => Pooling::Rank,
            _ => {
                return Err(EngineError::Invalid {
                    param: "pooling".into(),
                    problem: format!("unknown pooling '{name}' (expected one of {})", Self::NAMES),
                })
            }
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Pooling::None => "none",
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
            Pooling::Rank => "rank",
        }
    }

    /// The pooling a model's embeddings get unless a caller overrides it: the GGUF's
    /// `{arch}.pooling_type` where it names one vector per input, else `last`. A generative
    /// model's file declares none (llama.cpp then hands out per-token vectors, which
    /// `/v1/embeddings` refuses); the last token is the only one a causal model has let see
    /// the whole input, and what decoder embedding models are trained to pool.
    pub fn of_model(file: &GgufFile) -> Pooling {
        let declared = file
            .architecture()
            .ok()
            .and_then(|arch| file.get(&format!("{arch}.pooling_type")))
            .and_then(|v| v.as_integer())
            .and_then(|code| i64::try_from(code).ok())
            .and_then(Pooling::from_code);
        match declared {
            Some(Pooling::None) | None => Pooling::Last,
            Some(p) => p,
        }
    }
}

/// Most inputs one pass holds: each has a sequence state of its own (a KV cache of its length
/// and a one-row scratch), so many one-token inputs must not all be under way at once.
const MAX_SEQUENCES: usize = 64;

/// How [`embed`] sizes its passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmbedLimits {
    /// Most tokens per forward pass, all inputs together.
    pub n_batch: usize,
    /// Most tokens per input (the context a sequence may have).
    pub n_ctx: usize,
}

/// One input's result: its vector (`n_embd` values; `[tokens][n_embd]` for [`Pooling::None`]),
/// each vector of unit length (a zero vector stays zero).
#[derive(Debug, Clone, PartialEq)]
pub struct Embedding {
    pub vector: Vec<f32>,
    /// Tokens the input had.
    pub tokens: usize,
}

/// Hidden rows of an input still being evaluated.
struct Pending<B: Backend> {
    session: Session<B>,
    /// Tokens evaluated so far.
    done: usize,
    /// The pooled sum (mean), the chosen row (cls, last) or every row (none).
    acc: Vec<f32>,
}

/// [`embed_async`], blocking (native callers).
#[cfg(not(target_arch = "wasm32"))]
pub fn embed<B: Backend>(
    model: &Arc<Model<B>>,
    inputs: &[Vec<u32>],
    pooling: Pooling,
    limits: EmbedLimits,
) -> Result<Vec<Embedding>, EngineError> {
    pollster::block_on(embed_async(model, inputs, pooling, limits))
}

/// The embeddings of `inputs` (token ids each, special tokens already added) under `pooling`,
/// in input order. Awaits each pass's hidden rows (the browser's WebGPU reads back
/// asynchronously).
pub async fn embed_async<B: Backend>(
    model: &Arc<Model<B>>,
    inputs: &[Vec<u32>],
    pooling: Pooling,
    limits: EmbedLimits,
) -> Result<Vec<Embedding>, EngineError> {
    if pooling == Pooling::Rank {
        return Err(EngineError::Invalid {
            param: "pooling".into(),
            problem: "rank pooling scores a query and a document with a reranker's classification \
                      head, which the families tinyllm runs do not have; use mean, cls or last"
                .into(),
        });
    }
    let n_embd = model.info().n_embd;
    let n_ctx = limits.n_ctx.min(model.info().context_length).max(1);
    for (i, input) in inputs.iter().enumerate() {
        if input.is_empty() {
            return Err(EngineError::Invalid {
                param: format!("input[{i}]"),
                problem: "an input has no tokens".into(),
            });
        }
        if input.len() > n_ctx {
            return Err(EngineError::Invalid {
                param: format!("input[{i}]"),
                problem: format!(
                    "input {i} has {} tokens, more than the {n_ctx} an input may have",
                    input.len()
                ),
            });
        }
    }
    let n_batch = limits.n_batch.max(1);
    let mut scratch = model.scratch(n_batch, n_batch.min(32))?;
    let mut pending: Vec<Option<Pending<B>>> = (0..inputs.len()).map(|_| None).collect();
    let mut out: Vec<Option<Embedding>> = vec![None; inputs.len()];
    let mut next = 0;
    while out.iter().any(Option::is_none) {
        // This pass: the next chunk of every input under way (inputs start in order, so
        // those are below `next`), then new inputs, up to n_batch rows; ascending indices.
        let mut plan: Vec<(usize, usize, usize)> = Vec::new();
        let mut rows = 0;
        for (i, p) in pending.iter().enumerate().take(next) {
            if let Some(p) = p.as_ref().filter(|_| rows < n_batch) {
                let take = (inputs[i].len() - p.done).min(n_batch - rows);
                plan.push((i, p.done, take));
                rows += take;
            }
        }
        while rows < n_batch && next < inputs.len() && plan.len() < MAX_SEQUENCES {
            let i = next;
            next += 1;
            let session = Session::new(
                Arc::clone(model),
                SessionConfig {
                    n_ctx: inputs[i].len(),
                    n_batch: 1,
                    n_logit_rows: 1,
                    cache_type: KvType::F16,
                },
            )?;
            let acc = match pooling {
                Pooling::None => Vec::with_capacity(inputs[i].len() * n_embd),
                _ => vec![0.0; n_embd],
            };
            pending[i] = Some(Pending { session, done: 0, acc });
            let take = inputs[i].len().min(n_batch - rows);
            plan.push((i, 0, take));
            rows += take;
        }
        if plan.is_empty() {
            // Cannot happen (an unfinished input always has rows left); never spin on it.
            return Err(EngineError::WrongResult);
        }
        // The rows each chunk hands back: every row for mean and none, the first chunk's rows
        // for cls (its first is the one kept), the input's last row for last.
        let want_rows = |i: usize, from: usize, take: usize| match pooling {
            Pooling::Mean | Pooling::None => take,
            Pooling::Cls if from == 0 => take,
            Pooling::Last if from + take == inputs[i].len() => 1,
            _ => 0,
        };
        let results = {
            let mut sessions: Vec<&mut Pending<B>> = Vec::with_capacity(plan.len());
            let mut rest: &mut [Option<Pending<B>>] = &mut pending;
            let mut base = 0;
            for &(i, _, _) in &plan {
                let (_, tail) = rest.split_at_mut(i - base);
                let (this, after) = tail.split_at_mut(1);
                sessions.push(this[0].as_mut().ok_or(EngineError::WrongResult)?);
                rest = after;
                base = i + 1;
            }
            let mut items: Vec<BatchItem<'_, B>> = sessions
                .into_iter()
                .zip(&plan)
                .map(|(p, &(i, from, take))| BatchItem {
                    session: &mut p.session,
                    tokens: &inputs[i][from..from + take],
                    n_last: want_rows(i, from, take),
                })
                .collect();
            forward_batch(&mut scratch, &mut items, HeadWant::Hidden)?.await?
        };
        for (&(i, from, take), result) in plan.iter().zip(results) {
            let HeadResult::Hidden(rows) = result else {
                return Err(EngineError::WrongResult);
            };
            let p = pending[i].as_mut().ok_or(EngineError::WrongResult)?;
            match pooling {
                Pooling::Mean => {
                    for row in rows.chunks_exact(n_embd) {
                        p.acc.iter_mut().zip(row).for_each(|(a, &v)| *a += v);
                    }
                }
                Pooling::None => p.acc.extend_from_slice(&rows),
                Pooling::Cls if from == 0 => p.acc.copy_from_slice(&rows[..n_embd]),
                Pooling::Last if !rows.is_empty() => p.acc.copy_from_slice(&rows[rows.len() - n_embd..]),
                _ => {}
            }
            p.done = from + take;
            if p.done == inputs[i].len() {
                let mut vector = std::mem::take(&mut p.acc);
                if pooling == Pooling::Mean {
                    let n = inputs[i].len() as f32;
                    vector.iter_mut().for_each(|v| *v /= n);
                }
                vector.chunks_exact_mut(n_embd).for_each(normalize);
                out[i] = Some(Embedding {
                    vector,
                    tokens: inputs[i].len(),
                });
                pending[i] = None;
            }
        }
    }
    Ok(out.into_iter().flatten().collect())
}

/// Scale `v` to unit Euclidean length (llama.cpp's `common_embd_normalize` with norm 2); a zero
/// vector stays zero.
pub fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt();
    let scale = if norm > 0.0 { (1.0 / norm) as f32 } else { 0.0 };
    v.iter_mut().for_each(|x| *x *= scale);
}
