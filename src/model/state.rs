//! What a model keeps for one sequence between passes, behind one opaque type the engine holds
//! ([`SeqState`]). Three kinds fit it:
//!
//! - positional KV ([`KvCache`], today's families): row `p` of each layer's cache holds
//!   position `p`, so any prefix of the evaluated tokens can be kept: truncating only moves the
//!   length, and later writes overwrite the stale rows;
//! - latent KV (MLA): the same positional rule over compressed rows;
//! - recurrent state (gated delta nets: a conv window and a delta-rule matrix per layer), which
//!   folds every token in and cannot be truncated. It can only go back to a checkpoint saved
//!   at a chosen position ([`super::hybrid::HybridState`], [`resume_point`]).
//!
//! Whether and how much of a cached prefix can be reused is therefore the state's decision:
//! the session and the server's slot choice ask [`SeqState::resume_point`], then
//! [`SeqState::rewind`] to it, and evaluate the rest.

use std::any::Any;

use super::error::ModelError;
use crate::backend::{Backend, KvType};

/// The state of one kind of model, as its family implements it.
pub trait SequenceMemory<B: Backend>: Send + 'static {
    /// Positions it holds at most.
    fn n_ctx(&self) -> usize;

    /// With `held` tokens evaluated, of which the first `shared` are wanted again, the longest
    /// prefix (at most `shared`) the state can go back to and continue from.
    fn resume_point(&self, held: usize, shared: usize) -> usize;

    /// Go back to the first `n` tokens; `n` must be a [`SequenceMemory::resume_point`].
    fn rewind(&mut self, held: usize, n: usize) -> Result<(), ModelError>;

    /// The tokens up to `len` are now evaluated (a recurrent state may save a checkpoint).
    fn advanced(&mut self, len: usize);

    /// Keep at most `n` saved checkpoints (a recurrent state; others keep none).
    fn set_checkpoint_limit(&mut self, _n: usize) {}

    /// Saved checkpoints and the bytes they hold.
    fn checkpoint_stats(&self) -> (usize, usize) {
        (0, 0)
    }

    /// The positional KV cache of the state's attention layers, if it keeps one.
    fn kv(&self) -> Option<&KvCache<B>> {
        None
    }

    /// [`SequenceMemory::kv`], writable.
    fn kv_mut(&mut self) -> Option<&mut KvCache<B>> {
        None
    }

    /// For the family's graph, which knows its concrete type.
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// One sequence's state: opaque to the engine, made by [`super::Model::new_state`].
pub struct SeqState<B: Backend> {
    inner: Box<dyn SequenceMemory<B>>,
}

impl<B: Backend> std::fmt::Debug for SeqState<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeqState").field("n_ctx", &self.n_ctx()).finish()
    }
}

impl<B: Backend> SeqState<B> {
    pub fn new(inner: impl SequenceMemory<B>) -> Self {
        SeqState { inner: Box::new(inner) }
    }

    pub fn n_ctx(&self) -> usize {
        self.inner.n_ctx()
    }

    /// See [`SequenceMemory::resume_point`].
    pub fn resume_point(&self, held: usize, shared: usize) -> usize {
        self.inner.resume_point(held, shared.min(held)).min(shared)
    }

    /// See [`SequenceMemory::rewind`].
    pub fn rewind(&mut self, held: usize, n: usize) -> Result<(), ModelError> {
        self.inner.rewind(held, n)
    }

    /// See [`SequenceMemory::advanced`].
    pub fn advanced(&mut self, len: usize) {
        self.inner.advanced(len)
    }

    /// See [`SequenceMemory::set_checkpoint_limit`].
    pub fn set_checkpoint_limit(&mut self, n: usize) {
        self.inner.set_checkpoint_limit(n)
    }

    /// See [`SequenceMemory::checkpoint_stats`].
    pub fn checkpoint_stats(&self) -> (usize, usize) {
        self.inner.checkpoint_stats()
    }

    /// The positional KV cache of its attention layers (`None` for a state without one).
    pub fn kv(&self) -> Option<&KvCache<B>> {
        self.inner.kv()
    }

    /// [`SeqState::kv`], writable.
    pub fn kv_mut(&mut self) -> Option<&mut KvCache<B>> {
        self.inner.kv_mut()
    }

    /// The family's concrete state (`None` for a state of another kind).
    pub fn get<T: 'static>(&self) -> Option<&T> {
        self.inner.as_any().downcast_ref()
    }

    /// The family's concrete state, writable.
    pub fn get_mut<T: 'static>(&mut self) -> Option<&mut T> {
        self.inner.as_any_mut().downcast_mut()
    }
}

/// K and V storage for every layer: row `p` holds position `p`.
pub struct KvCache<B: Backend> {
    k: Vec<B::Kv>,
    v: Vec<B::Kv>,
    n_ctx: usize,
    /// Values stored per position, all layers' K and V together.
    per_token: usize,
    ty: KvType,
}

/// Error unless heads of `hd_k` (K) and `hd_v` (V) values fit a cache of format `ty` (a block
/// format needs heads of whole blocks). No fallback to another format: a user who asked for
/// q8_0 learns that this model cannot have it.
pub fn check_cache_heads(ty: KvType, hd_k: usize, hd_v: usize) -> Result<(), ModelError> {
    for (what, hd) in [("K", hd_k), ("V", hd_v)] {
        if let Some(problem) = ty.head_problem(what, hd) {
            return Err(ModelError::CacheType { ty, problem });
        }
    }
    Ok(())
}

impl<B: Backend> KvCache<B> {
    /// Storage in format `ty` for `n_ctx` positions of layers whose K and V rows have the
    /// widths `widths` (`(k, v)` per layer; rows of whole blocks of `ty`).
    pub fn new(backend: &B, widths: &[(usize, usize)], n_ctx: usize, ty: KvType) -> Result<Self, ModelError> {
        if let Some(&(kw, vw)) = widths
            .iter()
            .find(|(kw, vw)| !kw.is_multiple_of(ty.block_values()) || !vw.is_multiple_of(ty.block_values()))
        {
            return Err(ModelError::CacheType {
                ty,
                problem: format!(
                    "K and V rows of {kw} and {vw} values are not whole {ty} blocks of {}",
                    ty.block_values()
                ),
            });
        }
        let mut k = Vec::with_capacity(widths.len());
        let mut v = Vec::with_capacity(widths.len());
        for &(kw, vw) in widths {
            let len = |w: usize| {
                n_ctx.checked_mul(w).ok_or_else(|| ModelError::BadParam {
                    key: "context".into(),
                    problem: format!("{n_ctx} positions of {w} values overflow"),
                })
            };
            k.push(backend.alloc_kv(len(kw)?, ty)?);
            v.push(backend.alloc_kv(len(vw)?, ty)?);
        }
        let per_token = widths.iter().map(|&(kw, vw)| kw + vw).sum();
        Ok(KvCache {
            k,
            v,
            n_ctx,
            per_token,
            ty,
        })
    }

    /// Values the cache stores per token, over all layers: MLA's latent cache holds
    /// `kv_lora_rank + rope` per layer, a plain one `k_dim + v_dim`.
    pub fn values_per_token(&self) -> usize {
        self.per_token
    }

    /// Its format.
    pub fn kv_type(&self) -> KvType {
        self.ty
    }

    /// Bytes per token in its format ([`KvType::bytes`]: 2 per value for f16, 34 per 32 for
    /// q8_0), over all layers.
    pub fn bytes_per_token(&self) -> usize {
        self.ty.bytes(self.per_token)
    }

    /// K and V of layer `il`.
    pub fn layer(&self, il: usize) -> (&B::Kv, &B::Kv) {
        (&self.k[il], &self.v[il])
    }

    /// K and V of layer `il`, writable.
    pub fn layer_mut(&mut self, il: usize) -> (&mut B::Kv, &mut B::Kv) {
        (&mut self.k[il], &mut self.v[il])
    }
}

impl<B: Backend + 'static> SequenceMemory<B> for KvCache<B> {
    fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Any prefix: its rows are all there.
    fn resume_point(&self, _held: usize, shared: usize) -> usize {
        shared
    }

    fn rewind(&mut self, held: usize, n: usize) -> Result<(), ModelError> {
        if n > held {
            return Err(ModelError::BadRewind {
                to: n,
                held,
                why: "past the evaluated tokens".into(),
            });
        }
        Ok(())
    }

    fn advanced(&mut self, _len: usize) {}

    fn kv(&self) -> Option<&KvCache<B>> {
        Some(self)
    }

    fn kv_mut(&mut self) -> Option<&mut KvCache<B>> {
        Some(self)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// Where a recurrent state resumes for a prompt sharing `shared` tokens with what it holds:
/// the latest checkpoint at or before `shared`, never `shared` itself unless a checkpoint is
/// there (the state after `shared` tokens was folded further and is gone).
pub fn resume_point(checkpoints: &[usize], shared: usize) -> usize {
    checkpoints.iter().copied().filter(|&c| c <= shared).max().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resume_point_is_the_latest_checkpoint_at_or_before_the_shared_prefix() {
        let c = [0, 64, 128, 130];
        assert_eq!(resume_point(&c, 0), 0);
        assert_eq!(resume_point(&c, 63), 0);
        assert_eq!(resume_point(&c, 64), 64);
        assert_eq!(resume_point(&c, 129), 128);
        assert_eq!(resume_point(&c, 500), 130);
        assert_eq!(resume_point(&[], 10), 0);
    }
}
