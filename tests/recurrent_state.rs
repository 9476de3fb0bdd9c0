//! The contract of a recurrent sequence state (gated delta nets fold every token into a state
//! that cannot be truncated), proved with a test double before any recurrent model exists: a
//! session whose cached tokens share a prefix with a new prompt resumes from the latest
//! checkpoint at or before that prefix, and never from the shared length itself.
//!
//! The double's state is the list of tokens folded into it, so resuming anywhere else than a
//! checkpoint shows as a wrong list; its logits depend on that state, so the engine's answers
//! would show it too.

mod common;

use std::any::Any;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use tinyllm::backend::cpu::CpuBackend;
use tinyllm::backend::{Backend, KvType};
use tinyllm::engine::{generate, Flow, Generation, Prepared, Session, SessionConfig, Settings};
use tinyllm::gguf::GgufFile;
use tinyllm::model::blocks::FamilyScratch;
use tinyllm::model::hparams::Common;
use tinyllm::model::state::resume_point;
use tinyllm::model::{
    Batch, Family, KvCache, Model, ModelError, ModelInfo, OutputHead, Scratch, ScratchDims, SeqState, SequenceMemory,
};

const VOCAB: usize = 16;
const EMBD: usize = 4;
/// The double checkpoints every this many tokens.
const EVERY: usize = 4;

/// A recurrent state: what it has folded in, and checkpoints of that at multiples of [`EVERY`].
struct Folded {
    n_ctx: usize,
    folded: Vec<u32>,
    /// `(position, state)`, ascending; position 0 always.
    checkpoints: Vec<(usize, Vec<u32>)>,
}

impl Folded {
    fn positions(&self) -> Vec<usize> {
        self.checkpoints.iter().map(|c| c.0).collect()
    }

    fn restore(&mut self, pos: usize) -> Result<(), ModelError> {
        let i = self
            .checkpoints
            .iter()
            .position(|c| c.0 == pos)
            .ok_or_else(|| ModelError::BadRewind {
                to: pos,
                held: self.folded.len(),
                why: "no checkpoint there".into(),
            })?;
        self.folded = self.checkpoints[i].1.clone();
        self.checkpoints.truncate(i + 1);
        Ok(())
    }
}

impl SequenceMemory<CpuBackend> for Folded {
    fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    fn resume_point(&self, _held: usize, shared: usize) -> usize {
        resume_point(&self.positions(), shared)
    }

    fn rewind(&mut self, held: usize, n: usize) -> Result<(), ModelError> {
        if n == held {
            return Ok(());
        }
        if n > held || !self.positions().contains(&n) {
            return Err(ModelError::BadRewind {
                to: n,
                held,
                why: format!(
                    "a recurrent state resumes only at a checkpoint ({:?})",
                    self.positions()
                ),
            });
        }
        self.restore(n)
    }

    fn advanced(&mut self, len: usize) {
        assert_eq!(len, self.folded.len(), "the engine's count and the state's agree");
        if len.is_multiple_of(EVERY) && self.checkpoints.last().is_none_or(|c| c.0 < len) {
            self.checkpoints.push((len, self.folded.clone()));
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// The double's family: folds each sequence's tokens into its state; each row's output is the
/// token's embedding scaled by a digest of the state so far.
struct Echo {
    info: ModelInfo,
    embd: <CpuBackend as Backend>::Weight,
    norm: <CpuBackend as Backend>::Weight,
}

fn digest(tokens: &[u32]) -> f32 {
    let h = tokens
        .iter()
        .fold(7u64, |h, &t| h.wrapping_mul(31).wrapping_add(u64::from(t)));
    1.0 + (h % 97) as f32 / 97.0
}

impl Family<CpuBackend> for Echo {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn scratch_dims(&self) -> ScratchDims {
        ScratchDims {
            n_embd: EMBD,
            q_dim: EMBD,
            k_dim: EMBD,
            v_dim: EMBD,
            att_dim: EMBD,
            n_ff: EMBD,
            n_vocab: VOCAB,
        }
    }

    fn family_scratch(&self, _be: &CpuBackend, _rows: usize) -> Result<FamilyScratch, ModelError> {
        Ok(FamilyScratch::default())
    }

    fn new_state(&self, _be: &CpuBackend, n_ctx: usize, _cache: KvType) -> Result<SeqState<CpuBackend>, ModelError> {
        Ok(SeqState::new(Folded {
            n_ctx,
            folded: Vec::new(),
            checkpoints: vec![(0, Vec::new())],
        }))
    }

    fn layers(
        &self,
        be: &CpuBackend,
        batch: &mut Batch<'_, '_, CpuBackend>,
        s: &mut Scratch<CpuBackend>,
    ) -> Result<(), ModelError> {
        let mut rows = Vec::new();
        for seq in batch.seqs.iter_mut() {
            let st = seq.state.get_mut::<Folded>().ok_or(ModelError::ForeignState)?;
            assert_eq!(st.folded.len(), seq.pos0, "a pass continues where the state stands");
            for &t in seq.tokens {
                st.folded.push(t);
                let scale = digest(&st.folded);
                let e: Vec<f32> = (0..EMBD)
                    .map(|d| scale * (1.0 + (t as usize * EMBD + d) as f32 * 0.1))
                    .collect();
                rows.extend(e);
            }
        }
        be.write(&mut s.x, &rows)?;
        Ok(())
    }

    fn head(&self) -> OutputHead<'_, CpuBackend> {
        OutputHead {
            norm: &self.norm,
            weight: &self.embd,
            eps: 1e-5,
        }
    }
}

fn echo_model() -> Arc<Model<CpuBackend>> {
    let mut w = common::GgufWriter::new();
    w.kv_str("general.architecture", "echo");
    let mut data: Vec<u8> = Vec::new();
    let embd: Vec<f32> = (0..VOCAB * EMBD).map(|i| ((i * 7) % 11) as f32 * 0.1 - 0.5).collect();
    w.tensor_at(
        "token_embd.weight",
        &[EMBD as u64, VOCAB as u64],
        0,
        (VOCAB * EMBD * 4) as u64,
        0,
    );
    data.extend(embd.iter().flat_map(|v| v.to_le_bytes()));
    let off = data.len() as u64;
    w.tensor_at("output_norm.weight", &[EMBD as u64], 0, (EMBD * 4) as u64, off);
    data.extend([1f32; EMBD].iter().flat_map(|v| v.to_le_bytes()));
    let file = Arc::new(GgufFile::from_bytes(w.finish_with(&data)).unwrap());
    let be = CpuBackend::new(1).unwrap();
    let family = Echo {
        info: ModelInfo::new(
            "echo",
            "echo",
            &Common {
                n_embd: EMBD,
                n_layer: 1,
                n_vocab: VOCAB,
                context_length: 64,
                rms_eps: 1e-5,
            },
        ),
        embd: be.load_weight(&file, "token_embd.weight").unwrap(),
        norm: be.load_weight(&file, "output_norm.weight").unwrap(),
    };
    Arc::new(Model::from_family(be, Box::new(family)))
}

fn session(model: &Arc<Model<CpuBackend>>) -> Session<CpuBackend> {
    Session::new(
        model.clone(),
        SessionConfig {
            n_ctx: 64,
            n_batch: 3,
            n_logit_rows: 4,
            ..SessionConfig::default()
        },
    )
    .unwrap()
}

fn folded(s: &Session<CpuBackend>) -> Vec<u32> {
    s.state().get::<Folded>().expect("the double's state").folded.clone()
}

#[test]
fn a_shared_prefix_resumes_from_the_latest_checkpoint_before_it() {
    let model = echo_model();
    let mut s = session(&model);
    // 10 prompt tokens in chunks of 3, then 3 decode steps: checkpoints at 4, 8 and 12 only
    // where a pass ends on them (4 is inside a chunk: 3, 6, 9, 10, 11, 12, 13).
    let first: Vec<u32> = (0..10).map(|i| (i * 3 % VOCAB) as u32).collect();
    s.prefill(&first).unwrap();
    for t in [1, 2, 3] {
        s.forward(&[t]).unwrap();
    }
    let held = s.tokens().to_vec();
    assert_eq!(held.len(), 13);
    assert_eq!(folded(&s), held);
    let checkpoints = s.state().get::<Folded>().unwrap().positions();
    assert_eq!(
        checkpoints,
        vec![0, 12],
        "only passes ending on a multiple of {EVERY} checkpoint"
    );

    // A prompt sharing 12 tokens: the latest checkpoint at or before 12 is 12 itself.
    let mut second = held[..12].to_vec();
    second.extend([9, 9, 9]);
    assert_eq!(s.reusable_prefix(&second), 12);
    // One sharing 11: the state after 11 is gone (folded further); it resumes from 0, the
    // latest checkpoint at or before 11, not from 11.
    let mut third = held[..11].to_vec();
    third.extend([5, 5]);
    assert_eq!(s.common_prefix(&third), 11);
    assert_eq!(s.reusable_prefix(&third), 0);
    let reference = session(&model).prefill(&third).unwrap();
    assert_eq!(s.prefill(&third).unwrap(), reference, "the logits of a fresh run");
    assert_eq!(folded(&s), third, "the state holds exactly the new prompt");
}

#[test]
fn rewinding_between_checkpoints_is_refused() {
    let model = echo_model();
    let mut st = model.new_state(64, KvType::F16).unwrap();
    let mut s = session(&model);
    s.prefill(&[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
    // The session's own state: checkpoint at 6? Passes end at 3, 6, 8: only 8 is a multiple.
    assert_eq!(s.state().get::<Folded>().unwrap().positions(), vec![0, 8]);
    // A fresh state: rewinding to 0 is fine, to 5 of 8 is not.
    assert!(st.rewind(0, 0).is_ok());
    let f = st.get_mut::<Folded>().unwrap();
    f.folded = vec![1, 2, 3, 4, 5, 6, 7, 8];
    f.checkpoints.push((4, vec![1, 2, 3, 4]));
    let err = st.rewind(8, 5).unwrap_err();
    assert!(err.to_string().contains("checkpoint"), "{err}");
    st.rewind(8, 4).unwrap();
    assert_eq!(st.get::<Folded>().unwrap().folded, vec![1, 2, 3, 4]);
    // A positional KV cache resumes anywhere: the contrast.
    let kv_model = Arc::new(
        Model::load(
            CpuBackend::new(1).unwrap(),
            Arc::new(GgufFile::open(common::golden("fixtures/llama.Q8_0.gguf")).unwrap()),
        )
        .unwrap(),
    );
    let mut kv = Session::new(kv_model, SessionConfig::default()).unwrap();
    kv.prefill(&[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
    assert_eq!(kv.reusable_prefix(&[1, 2, 3, 4, 5, 9, 9]), 5);
    assert!(kv.state().get::<KvCache<CpuBackend>>().is_some());
}

/// The generation pipeline reports what the state reused: a second turn sharing a prefix
/// counts the checkpoint's tokens as cached, not the shared length.
#[test]
fn generation_counts_the_checkpoint_as_cached() {
    let model = echo_model();
    let tokenizer_file = GgufFile::open(common::golden("fixtures/llama.Q8_0.gguf")).unwrap();
    let tokenizer = tinyllm::tokenizer::Tokenizer::from_gguf(&tokenizer_file).unwrap();
    // Chunks of 4: a 10-token prompt checkpoints at 4 and 8.
    let mut s = Session::new(
        model.clone(),
        SessionConfig {
            n_ctx: 64,
            n_batch: 4,
            n_logit_rows: 4,
            ..SessionConfig::default()
        },
    )
    .unwrap();
    let cancel = AtomicBool::new(false);
    let run = |s: &mut Session<CpuBackend>, prompt: Vec<u32>| {
        let settings = Settings {
            sampler: tinyllm::sample::SamplerConfig::greedy(),
            max_tokens: Some(2),
            ..Settings::default()
        };
        let mut gen = Generation::new(&tokenizer, Prepared::ids(prompt), settings).unwrap();
        generate(s, &mut gen, &cancel, |_| Flow::Continue).unwrap();
        gen.usage()
    };
    let first: Vec<u32> = (1..=10).collect();
    assert_eq!(run(&mut s, first.clone()).cached_tokens, 0);
    let cps = s.state().get::<Folded>().unwrap().positions();
    assert!(cps.starts_with(&[0, 4, 8]), "{cps:?}");
    // The second turn repeats the whole first prompt: 10 shared tokens, resumed from 8.
    let mut second = first.clone();
    second.extend([3, 4]);
    assert_eq!(s.common_prefix(&second), 10);
    assert_eq!(run(&mut s, second.clone()).cached_tokens, 8);
    assert_eq!(
        folded(&s)[..second.len()],
        second[..],
        "the state folded the new prompt once"
    );
}
