//! The sequence state of hybrid models (qwen3.5): a positional KV cache for the full-attention
//! layers and a recurrent state (conv window and delta-rule matrix) for each linear-attention
//! layer, with checkpoints of the recurrent part.
//!
//! A recurrent state folds every token in, so going back to a shorter prefix needs a copy of
//! the state saved at that position. Copies are taken at the end of every multi-token chunk
//! (prefill chunks, so the end of each prompt too), at most [`HybridState::set_checkpoint_limit`]
//! of them per sequence (the oldest go first); position 0 (zeros) is always there for free.
//!
//! The state has no handle on the backend ([`SequenceMemory`] is called by the engine outside
//! a pass), so saving and restoring are queued and done by [`HybridState::sync`] at the start of
//! the family's next pass, before anything touches the live state. A queued save of the live
//! state is already a checkpoint: nothing can change the live state before the save runs.

use std::any::Any;

use super::error::ModelError;
use super::state::{resume_point, KvCache, SequenceMemory};
use crate::backend::{Backend, BackendError};

/// Checkpoints a sequence keeps unless told otherwise (llama.cpp's `--ctx-checkpoints`
/// default is 8 too).
pub const DEFAULT_CHECKPOINTS: usize = 8;

/// The recurrent state of one linear-attention layer.
pub struct LayerState<B: Backend> {
    /// `[channels][kernel - 1]`: the last inputs of the conv.
    pub conv: B::Buffer,
    /// `[n_v_heads][d_v][d_k]`: the delta rule's matrix.
    pub ssm: B::Buffer,
}

/// Sizes of a layer's recurrent state, in f32 values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecurrentSizes {
    pub conv: usize,
    pub ssm: usize,
    /// Linear-attention layers.
    pub layers: usize,
}

impl RecurrentSizes {
    /// Bytes of one copy of every layer's state.
    pub fn bytes(&self) -> usize {
        (self.conv + self.ssm) * self.layers * std::mem::size_of::<f32>()
    }
}

/// Work queued for the next pass.
enum Pending {
    /// Copy the live state into a checkpoint of this position.
    Save(usize),
    /// Copy the checkpoint of this position into the live state.
    Restore(usize),
    /// Zero the live state (position 0).
    Zero,
}

struct Checkpoint<B: Backend> {
    pos: usize,
    layers: Vec<LayerState<B>>,
}

/// See the module docs.
pub struct HybridState<B: Backend> {
    kv: KvCache<B>,
    /// The recurrent layers' state after `pos` tokens (once `pending` has run).
    live: Vec<LayerState<B>>,
    sizes: RecurrentSizes,
    /// Saved copies, positions ascending (without position 0).
    saved: Vec<Checkpoint<B>>,
    /// Copies dropped by the limit, kept for reuse so saving does not allocate every time.
    spare: Vec<Vec<LayerState<B>>>,
    pending: Vec<Pending>,
    /// Tokens evaluated as of the last [`SequenceMemory::advanced`].
    pos: usize,
    /// A pass began changing the live state and has not finished: it holds no position.
    dirty: bool,
    limit: usize,
}

impl<B: Backend> HybridState<B> {
    /// A state of `kv` for the attention layers and zeroed recurrent layers of `sizes`.
    pub fn new(be: &B, kv: KvCache<B>, sizes: RecurrentSizes) -> Result<Self, ModelError> {
        Ok(HybridState {
            kv,
            live: alloc_layers(be, sizes)?,
            sizes,
            saved: Vec::new(),
            spare: Vec::new(),
            pending: Vec::new(),
            pos: 0,
            dirty: false,
            limit: DEFAULT_CHECKPOINTS,
        })
    }

    /// The KV cache of the attention layers.
    pub fn kv_mut(&mut self) -> &mut KvCache<B> {
        &mut self.kv
    }

    /// Run the queued saves and restores, then mark the live state as being changed by a
    /// pass (until [`SequenceMemory::advanced`]). The family calls this before its layers.
    pub fn sync(&mut self, be: &B) -> Result<(), ModelError> {
        for p in std::mem::take(&mut self.pending) {
            match p {
                Pending::Save(pos) => self.save(be, pos)?,
                Pending::Restore(pos) => {
                    let cp = self
                        .saved
                        .iter()
                        .find(|c| c.pos == pos)
                        .ok_or_else(|| ModelError::BadRewind {
                            to: pos,
                            held: self.pos,
                            why: "its checkpoint was dropped".into(),
                        })?;
                    copy_layers(be, &cp.layers, &mut self.live, self.sizes)?;
                }
                Pending::Zero => {
                    for l in &mut self.live {
                        be.write(&mut l.conv, &vec![0.0; self.sizes.conv])?;
                        be.write(&mut l.ssm, &vec![0.0; self.sizes.ssm])?;
                    }
                }
            }
        }
        self.dirty = true;
        Ok(())
    }

    /// The live state of linear-attention layer `i` (in layer order among them).
    pub fn layer_mut(&mut self, i: usize) -> Result<&mut LayerState<B>, ModelError> {
        self.live.get_mut(i).ok_or(ModelError::ForeignState)
    }

    /// Positions with a saved or queued copy, 0 first.
    pub fn checkpoints(&self) -> Vec<usize> {
        let mut c: Vec<usize> = std::iter::once(0).chain(self.saved.iter().map(|c| c.pos)).collect();
        for p in &self.pending {
            if let Pending::Save(pos) = *p {
                c.push(pos);
            }
        }
        c.sort_unstable();
        c.dedup();
        c
    }

    /// Bytes held by saved copies (and spares kept for reuse).
    pub fn checkpoint_bytes(&self) -> usize {
        (self.saved.len() + self.spare.len()) * self.sizes.bytes()
    }

    /// Drop the oldest saved copies beyond `n`, keeping their buffers as spares.
    fn keep_newest(&mut self, n: usize) {
        let excess = self.saved.len().saturating_sub(n);
        self.spare.extend(self.saved.drain(..excess).map(|c| c.layers));
    }

    fn save(&mut self, be: &B, pos: usize) -> Result<(), ModelError> {
        if self.limit == 0 {
            return Ok(());
        }
        self.saved.retain(|c| c.pos < pos);
        self.keep_newest(self.limit - 1);
        let mut layers = match self.spare.pop() {
            Some(l) => l,
            None => alloc_layers(be, self.sizes)?,
        };
        copy_layers(be, &self.live, &mut layers, self.sizes)?;
        self.saved.push(Checkpoint { pos, layers });
        Ok(())
    }
}

fn alloc_layers<B: Backend>(be: &B, s: RecurrentSizes) -> Result<Vec<LayerState<B>>, BackendError> {
    (0..s.layers)
        .map(|_| {
            Ok(LayerState {
                conv: be.alloc(s.conv)?,
                ssm: be.alloc(s.ssm)?,
            })
        })
        .collect()
}

fn copy_layers<B: Backend>(
    be: &B,
    from: &[LayerState<B>],
    to: &mut [LayerState<B>],
    s: RecurrentSizes,
) -> Result<(), BackendError> {
    for (f, t) in from.iter().zip(to) {
        be.copy_rows(&f.conv, 0, 1, s.conv, &mut t.conv)?;
        be.copy_rows(&f.ssm, 0, 1, s.ssm, &mut t.ssm)?;
    }
    Ok(())
}

impl<B: Backend> SequenceMemory<B> for HybridState<B> {
    fn n_ctx(&self) -> usize {
        self.kv.n_ctx()
    }

    fn resume_point(&self, held: usize, shared: usize) -> usize {
        if self.dirty {
            // The live state is half-changed: only saved copies count.
            let saved: Vec<usize> = std::iter::once(0).chain(self.saved.iter().map(|c| c.pos)).collect();
            return resume_point(&saved, shared.min(held));
        }
        if shared >= held {
            // The live state itself: it holds exactly `held` tokens.
            return held;
        }
        resume_point(&self.checkpoints(), shared)
    }

    fn rewind(&mut self, held: usize, n: usize) -> Result<(), ModelError> {
        if n == held && !self.dirty {
            return Ok(());
        }
        if n > held {
            return Err(ModelError::BadRewind {
                to: n,
                held,
                why: "past the evaluated tokens".into(),
            });
        }
        if n == 0 {
            self.pending.clear();
            self.saved.clear();
            self.pending.push(Pending::Zero);
        } else if let Some(i) = self.saved.iter().position(|c| c.pos == n) {
            // Saves queued for later positions are dropped with the copies past `n`.
            self.pending.retain(|p| !matches!(p, Pending::Save(pos) if *pos > n));
            self.saved.truncate(i + 1);
            self.pending.push(Pending::Restore(n));
        } else if !self.dirty
            && self
                .pending
                .iter()
                .any(|p| matches!(p, Pending::Save(pos) if *pos == n))
        {
            // The live state is still at `n` (its save is queued): nothing to do.
            return Ok(());
        } else {
            return Err(ModelError::BadRewind {
                to: n,
                held,
                why: format!(
                    "a recurrent state resumes only at a checkpoint ({:?})",
                    self.checkpoints()
                ),
            });
        }
        self.dirty = false;
        self.pos = n;
        Ok(())
    }

    /// A multi-token chunk (a prefill chunk, the end of a prompt) leaves a checkpoint.
    fn advanced(&mut self, len: usize) {
        let grew = len.saturating_sub(self.pos);
        self.pos = len;
        self.dirty = false;
        if grew > 1 && self.limit > 0 {
            self.pending.push(Pending::Save(len));
        }
    }

    fn set_checkpoint_limit(&mut self, n: usize) {
        self.limit = n;
        self.keep_newest(n);
        self.spare.clear();
    }

    fn checkpoint_stats(&self) -> (usize, usize) {
        (self.saved.len(), self.checkpoint_bytes())
    }

    fn kv(&self) -> Option<&KvCache<B>> {
        Some(&self.kv)
    }

    fn kv_mut(&mut self) -> Option<&mut KvCache<B>> {
        Some(&mut self.kv)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}
