//! What a family is to the model: its traits ([`Family`], placed on a backend; [`Architecture`],
//! how the registry loads it) and what it tells the engine ([`ModelInfo`]).

use super::blocks::{Batch, FamilyScratch, OutputHead, Scratch, ScratchDims};
use super::error::ModelError;
use super::hparams;
use super::state::SeqState;
use super::tensors::Loader;
use crate::backend::{Backend, KvType};

/// What the engine and front ends need to know about a loaded model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelInfo {
    /// `general.architecture` as found (e.g. `mistral`).
    pub arch: String,
    /// The family module that runs it.
    pub family: &'static str,
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    /// The context the model was trained with.
    pub context_length: usize,
}

impl ModelInfo {
    pub fn new(arch: &str, family: &'static str, c: &hparams::Common) -> Self {
        ModelInfo {
            arch: arch.to_string(),
            family,
            n_vocab: c.n_vocab,
            n_embd: c.n_embd,
            n_layer: c.n_layer,
            context_length: c.context_length,
        }
    }
}

/// One architecture family with its weights placed on a backend.
pub trait Family<B: Backend>: Send + Sync {
    fn info(&self) -> &ModelInfo;

    /// The widths of its activations.
    fn scratch_dims(&self) -> ScratchDims;

    /// Its own scratch for passes of up to `rows` tokens (routed experts', latent
    /// attention's, the hybrid layers'), beside the shared buffers of [`Scratch`]; empty for a
    /// plain transformer.
    fn family_scratch(&self, be: &B, rows: usize) -> Result<FamilyScratch, ModelError>;

    /// A fresh state for a sequence of up to `n_ctx` positions, its KV cache (if any) in format
    /// `cache` (an error, [`ModelError::CacheType`], where the model's heads cannot have it).
    fn new_state(&self, be: &B, n_ctx: usize, cache: KvType) -> Result<SeqState<B>, ModelError>;

    /// The layers of one pass: from the batch's tokens to the residual stream in `s.x`
    /// (`[rows, n_embd]`), each sequence's state updated.
    fn layers(&self, be: &B, batch: &mut Batch<'_, '_, B>, s: &mut Scratch<B>) -> Result<(), ModelError>;

    /// The output head's weights.
    fn head(&self) -> OutputHead<'_, B>;
}

/// How the registry loads a family.
pub trait Architecture {
    /// Read the hyper-parameters of `t.file` (architecture `arch`, one of the family's registry
    /// names) and place its weights through `t`.
    fn load<B: Backend>(t: &Loader<'_, B>, arch: &str) -> Result<Box<dyn Family<B>>, ModelError>;
}
