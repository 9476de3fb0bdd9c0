//! Models: one module per architecture family, each owning its hyper-parameters (read from the
//! GGUF), its tensor table, its weights on a backend and its graph, built from the shared
//! [`blocks`]; and the per-sequence [`state`] the family keeps between passes.
//!
//! Families: [`llama`] (llama, mistral, qwen2, qwen3, and the mixtures qwen3moe and olmoe),
//! [`gemma3`], [`deepseek2`] (latent attention, [`mla`], with routed and shared experts) and
//! [`gpt_oss`], and the gated-delta-net hybrid [`qwen35`] (its state: [`hybrid`]); routed
//! experts are one block, [`moe`]. The registry of
//! supported architectures is the one list at the end of this file: adding an architecture
//! means adding its module and one registry entry.
//!
//! A pass may hold several sequences ([`Model::forward`], continuous batching): see
//! [`blocks`] for how their rows share the pass.

pub mod blocks;
pub mod deepseek2;
mod error;
mod family;
pub mod gemma3;
pub mod gpt_oss;
pub mod hparams;
pub mod hybrid;
pub mod llama;
pub mod memory;
pub mod mla;
pub mod moe;
pub mod qwen35;
pub mod state;
pub mod tensors;

use std::sync::Arc;

pub use blocks::{Batch, HeadResult, HeadWant, OutputHead, Scratch, ScratchDims, SeqChunk};
pub use error::ModelError;
pub use family::{Architecture, Family, ModelInfo};
pub use state::{KvCache, SeqState, SequenceMemory};
pub use tensors::{Loader, Placed, Placement};

use crate::backend::{Backend, KvType, Readback};
use crate::gguf::GgufFile;

/// A loaded model: a family's graph and weights on a backend.
pub struct Model<B: Backend> {
    backend: B,
    family: Box<dyn Family<B>>,
}

impl<B: Backend> std::fmt::Debug for Model<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("backend", &self.backend.name())
            .field("info", self.info())
            .finish()
    }
}

impl<B: Backend> Model<B> {
    /// Read the architecture of `file` and load it through the registry onto `backend`.
    pub fn load(backend: B, file: Arc<GgufFile>) -> Result<Self, ModelError> {
        Self::load_from(backend, &file, None)
    }

    /// [`Model::load`] for a file that was streamed: its weights were placed on `backend`
    /// while it arrived (`placed`), and `file` holds its metadata and tensor table only.
    pub fn load_placed(backend: B, file: Arc<GgufFile>, placed: Placed<B>) -> Result<Self, ModelError> {
        Self::load_from(backend, &file, Some(&placed))
    }

    fn load_from(backend: B, file: &Arc<GgufFile>, placed: Option<&Placed<B>>) -> Result<Self, ModelError> {
        let arch = file.architecture()?.to_string();
        let t = Loader {
            be: &backend,
            file,
            placed,
        };
        let family = load_family(&t, &arch)?;
        Ok(Model { backend, family })
    }

    /// A model from a family built by hand (tests, test doubles).
    pub fn from_family(backend: B, family: Box<dyn Family<B>>) -> Self {
        Model { backend, family }
    }

    pub fn info(&self) -> &ModelInfo {
        self.family.info()
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// A fresh state for a sequence of up to `n_ctx` positions, its KV cache in format `cache`.
    pub fn new_state(&self, n_ctx: usize, cache: KvType) -> Result<SeqState<B>, ModelError> {
        self.family.new_state(&self.backend, n_ctx, cache)
    }

    /// Scratch for passes of up to `rows` tokens in all, the output head running `logit_rows`
    /// rows at a time.
    pub fn scratch(&self, rows: usize, logit_rows: usize) -> Result<Scratch<B>, ModelError> {
        let family = |rows| self.family.family_scratch(&self.backend, rows);
        Scratch::new(&self.backend, self.family.scratch_dims(), family, rows, logit_rows)
    }

    /// Run several sequences through the model in one pass: their rows are stacked, so every
    /// weight matmul sees all of them at once (weights are streamed once per pass, not once
    /// per sequence), while each sequence's rows attend over its own state. The output head
    /// runs for the rows each chunk asks for (in sequence order) and hands back `want` of
    /// them. The total number of tokens must not exceed the scratch's capacity.
    pub fn forward(
        &self,
        s: &mut Scratch<B>,
        seqs: &mut [SeqChunk<'_, B>],
        want: HeadWant<'_>,
    ) -> Result<Readback<HeadResult>, ModelError> {
        let rows: usize = seqs.iter().map(|q| q.tokens.len()).sum();
        if rows > s.rows {
            return Err(ModelError::ChunkTooLarge { rows, capacity: s.rows });
        }
        for (i, q) in seqs.iter().enumerate() {
            let bad = |problem: String| Err(ModelError::BadBatch { seq: i, problem });
            if q.tokens.is_empty() {
                return bad("no tokens".into());
            }
            if q.logits_from > q.tokens.len() {
                return bad(format!("logits from row {} of {}", q.logits_from, q.tokens.len()));
            }
            let end = q.pos0 + q.tokens.len();
            if end > q.state.n_ctx() || end > u32::MAX as usize {
                return bad(format!(
                    "positions {}..{end} exceed the context of {}",
                    q.pos0,
                    q.state.n_ctx()
                ));
            }
        }
        self.backend.run_pass(|| {
            let mut batch = Batch::new(seqs);
            self.family.layers(&self.backend, &mut batch, s)?;
            let wanted = batch.head_rows();
            blocks::output_head(
                &self.backend,
                s,
                &self.family.head(),
                self.family.scratch_dims(),
                &wanted,
                want,
            )
        })
    }
}

/// The registry: every supported architecture, as `family => [GGUF architecture names]`.
macro_rules! registry {
    ($($family:ty => [$($name:literal),+ $(,)?]),+ $(,)?) => {
        /// The `general.architecture` names this build runs.
        pub const SUPPORTED: &[&str] = &[$($($name),+),+];

        /// The family of architecture `arch`, loaded from `file` onto `be`.
        fn load_family<B: Backend>(t: &Loader<'_, B>, arch: &str) -> Result<Box<dyn Family<B>>, ModelError> {
            match arch {
                $($($name)|+ => <$family>::load(t, arch),)+
                _ => Err(ModelError::UnsupportedArch {
                    arch: arch.to_string(),
                    supported: SUPPORTED.join(", "),
                }),
            }
        }
    };
}

registry! {
    llama::LlamaArch => ["llama", "mistral", "qwen2", "qwen3", "qwen3moe", "olmoe"],
    gemma3::Gemma3Arch => ["gemma3"],
    deepseek2::Deepseek2Arch => ["deepseek2"],
    gpt_oss::GptOssArch => ["gpt-oss"],
    qwen35::Qwen35Arch => ["qwen35", "qwen35moe"],
}
