//! The KV cache: per layer, `n_ctx` rows of K and of V (`n_head_kv * head_dim` each) in
//! backend storage. Positions are implicit: row `p` holds position `p`, so truncating a
//! session only moves its length and later writes overwrite the stale rows.

use crate::backend::Backend;
use crate::model::{Config, ModelError};

/// K and V storage for every layer.
pub struct KvCache<B: Backend> {
    k: Vec<B::Kv>,
    v: Vec<B::Kv>,
    n_ctx: usize,
}

impl<B: Backend> KvCache<B> {
    /// Storage for `n_ctx` positions of every layer of `config`.
    pub fn new(backend: &B, config: &Config, n_ctx: usize) -> Result<Self, ModelError> {
        let len = n_ctx * config.kv_dim();
        let mut k = Vec::with_capacity(config.n_layer);
        let mut v = Vec::with_capacity(config.n_layer);
        for _ in 0..config.n_layer {
            k.push(backend.alloc_kv(len)?);
            v.push(backend.alloc_kv(len)?);
        }
        Ok(KvCache { k, v, n_ctx })
    }

    /// Positions the cache holds.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
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
