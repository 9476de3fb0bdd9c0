//! Parameters of the backends' attention op and the checks every backend runs on them.
//!
//! One call attends the rows of every sequence of a batch: each sequence's query rows sit at
//! its own offset of the batch's q and output buffers and read its own K/V caches, so a batch
//! is attended in place (no gathering of a sequence's rows into scratch and back).

use super::error::{need, shape};
use crate::backend::error::BackendError;

/// Largest K or V head width every backend attends (MLA's absorbed heads: 512 + 64).
pub const MAX_HEAD_DIM: usize = 576;

/// Attention of `rows` consecutive query positions starting at `pos0` over the KV cache
/// positions `0..pos0 + rows`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnParams {
    pub rows: usize,
    pub pos0: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    /// Width of a q and k head.
    pub head_dim_k: usize,
    /// Width of a v head and of an output head.
    pub head_dim_v: usize,
    /// Multiplies q·k before the softmax.
    pub scale: f32,
    /// Sliding window: key `j` is masked for query `i` when `i - j >= window`.
    pub window: Option<usize>,
    /// Logit soft-capping: q·k becomes `cap · tanh(q·k / cap)` before `scale`.
    pub softcap: Option<f32>,
    /// V has no cache of its own: a value head is the first `head_dim_v` values of its K head
    /// (MLA's latent, so the cache holds `kv_lora_rank + rope` values per token for both). The
    /// call's `v_cache` is then the K cache.
    pub v_in_k: bool,
}

/// One sequence of a [`crate::backend::interface::Backend::attention`] call: its query and output rows are
/// `row0..row0 + p.rows` of the batch, its keys and values its own caches.
#[derive(Debug)]
pub struct SeqAttn<'a, K> {
    pub row0: usize,
    pub p: AttnParams,
    pub k_cache: &'a K,
    pub v_cache: &'a K,
}

impl AttnParams {
    /// Width of a row of q.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim_k
    }

    /// Width of a row of the output.
    pub fn out_dim(&self) -> usize {
        self.n_head * self.head_dim_v
    }

    /// Where value heads sit in the V source: (values from one position to the next, from one
    /// KV head to the next).
    pub fn v_layout(&self) -> (usize, usize) {
        if self.v_in_k {
            (self.n_head_kv * self.head_dim_k, self.head_dim_k)
        } else {
            (self.n_head_kv * self.head_dim_v, self.head_dim_v)
        }
    }

    /// Error unless the head layout is whole (query heads in groups per KV head, non-empty
    /// heads of at most [`MAX_HEAD_DIM`]) and the caches hold `pos0 + rows` rows of
    /// `n_head_kv` heads.
    pub fn check(&self, k_cache: usize, v_cache: usize) -> Result<(), BackendError> {
        if self.n_head_kv == 0 || !self.n_head.is_multiple_of(self.n_head_kv) {
            return Err(shape(
                "attention",
                format!("{} heads over {} kv heads", self.n_head, self.n_head_kv),
            ));
        }
        for (what, hd) in [("k", self.head_dim_k), ("v", self.head_dim_v)] {
            if hd == 0 || hd > MAX_HEAD_DIM {
                return Err(shape(
                    "attention",
                    format!("{what} head size {hd} is outside 1..={MAX_HEAD_DIM}"),
                ));
            }
        }
        if let Some(cap) = self.softcap {
            if !(cap > 0.0 && cap.is_finite()) {
                return Err(shape("attention", format!("soft-cap {cap} is not a positive number")));
            }
        }
        if self.v_in_k && self.head_dim_v > self.head_dim_k {
            return Err(shape(
                "attention",
                format!("v heads of {} inside k heads of {}", self.head_dim_v, self.head_dim_k),
            ));
        }
        let positions = self.pos0 + self.rows;
        need(
            "attention",
            "k cache",
            k_cache,
            positions * self.n_head_kv * self.head_dim_k,
        )?;
        need("attention", "v cache", v_cache, positions * self.v_layout().0)
    }
}
