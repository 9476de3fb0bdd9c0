//! The qwen3.5 hybrid's sequence state on the CPU, with the golden fixture's weights: its
//! recurrent layers give the same logits whatever the prefill chunking (so the chunked delta
//! rule equals the token-by-token one inside the model), a request sharing a prefix resumes
//! from the latest checkpoint at or before it and gets a cold run's logits, and the
//! checkpoints a sequence keeps are bounded. Resuming is also checked on WebGPU (device copies).

mod common;

use std::sync::Arc;

use common::generation::{load_cases, load_on, softmax};
use tinyllm::backend::cpu::CpuBackend;
use tinyllm::backend::webgpu::WebGpuBackend;
use tinyllm::backend::Backend;
use tinyllm::engine::{Session, SessionConfig};
use tinyllm::model::Model;

fn model(quant: &str) -> Arc<Model<CpuBackend>> {
    let path = common::golden(&format!("fixtures/qwen35.{quant}.gguf"));
    load_on(CpuBackend::new(1).expect("cpu backend"), &path)
}

/// A session of 512 positions that prefills `n_batch` tokens per pass.
fn session<B: Backend>(m: &Arc<Model<B>>, n_batch: usize) -> Session<B> {
    let config = SessionConfig {
        n_ctx: 512,
        n_batch,
        ..SessionConfig::default()
    };
    Session::new(Arc::clone(m), config).expect("session")
}

/// The fixture's longest prompt (150 tokens).
fn long_prompt() -> Vec<u32> {
    let cases = load_cases(&common::golden("fixtures/qwen35.F16.golden.jsonl"));
    let case = cases.iter().max_by_key(|c| c.prompt.len()).unwrap();
    assert!(case.prompt.len() >= 150, "{}", case.prompt.len());
    case.prompt.clone()
}

/// Largest difference of the probabilities of rows of `n_vocab` logits.
fn max_prob_diff(a: &[f32], b: &[f32], n_vocab: usize) -> f64 {
    assert_eq!(a.len(), b.len());
    a.chunks(n_vocab)
        .zip(b.chunks(n_vocab))
        .flat_map(|(x, y)| {
            let (px, py) = (softmax(x), softmax(y));
            px.into_iter().zip(py).map(|(p, q)| (p - q).abs()).collect::<Vec<_>>()
        })
        .fold(0.0, f64::max)
}

/// The delta rule's two forms add in different orders, so they agree to f32 rounding (the op
/// tests measure 1e-6 relative); activations are rounded to f16 before the F16 weights'
/// matmuls, where such a difference can flip a rounding. Probabilities then move by far less
/// than the fixture tolerance (5e-3); the dense families give bit-identical logits here.
#[test]
fn prefill_chunking_does_not_change_the_distributions() {
    let m = model("F16");
    let prompt = long_prompt();
    let run = |n_batch: usize| session(&m, n_batch).forward_all(&prompt).unwrap();
    // One chunk of 150 takes the chunked delta rule; chunks of 1 and 7 the recurrent one;
    // chunks of 64 both.
    let whole = run(512);
    let n_vocab = m.info().n_vocab;
    for n_batch in [1, 7, 64] {
        let d = max_prob_diff(&whole, &run(n_batch), n_vocab);
        assert!(d <= 1e-3, "chunks of {n_batch}: probabilities differ by {d}");
    }
    // The same form and the same chunks give the same bits.
    assert_eq!(run(1), run(7));
}

/// Evaluate `prompt` in a session the way a server slot does: reuse what the state can, then
/// compute the rest; returns how many tokens were reused and the last token's logits.
fn continue_with<B: Backend>(s: &mut Session<B>, prompt: &[u32]) -> (usize, Vec<f32>) {
    let reused = s.reuse_prefix(prompt).unwrap();
    (reused, s.forward(&prompt[reused..]).unwrap())
}

/// The last logits of `prompt` run cold in two calls split at `at`.
fn cold_in_two<B: Backend>(m: &Arc<Model<B>>, prompt: &[u32], at: usize) -> Vec<f32> {
    let mut s = session(m, 64);
    s.forward(&prompt[..at]).unwrap();
    s.forward(&prompt[at..]).unwrap()
}

#[test]
fn a_shared_prefix_resumes_from_the_latest_checkpoint_with_a_cold_runs_logits() {
    resumes_from_checkpoints(&model("Q8_0"));
}

/// The same on WebGPU, where checkpoints are device copies.
#[test]
fn checkpoints_resume_on_webgpu() {
    let Some(g) = common::device_or_skip(WebGpuBackend::new) else {
        return;
    };
    resumes_from_checkpoints(&load_on(g, &common::golden("fixtures/qwen35.Q8_0.gguf")));
}

fn resumes_from_checkpoints<B: Backend>(m: &Arc<Model<B>>) {
    let m = Arc::clone(m);
    let prompt = long_prompt();
    let mut s = session(&m, 64);
    // Prefill in chunks of 64: checkpoints at 64, 128 and 150 (the prompt's end).
    let logits = s.forward(&prompt).unwrap();
    // Five decoded tokens fold into the state without checkpoints.
    let mut next = common::generation::argmax(&logits);
    let mut turn: Vec<u32> = prompt.clone();
    for _ in 0..5 {
        turn.push(next);
        next = common::generation::argmax(&s.forward(&[next]).unwrap());
    }
    assert_eq!(s.pos(), 155);

    // A prompt that extends everything evaluated continues from the live state.
    let mut extended = turn.clone();
    extended.push(9);
    assert_eq!(s.reusable_prefix(&extended), 155);

    // A second turn whose history differs from the evaluated tokens after 153 (a template
    // re-renders the answer's end): the state resumes at 150, its latest checkpoint, because
    // the state after 155 tokens cannot be cut back.
    let mut second = turn[..153].to_vec();
    second.extend([11, 12, 13, 14, 15, 16, 17, 18]);
    assert_eq!(s.reusable_prefix(&second), 150);
    let (reused, warm) = continue_with(&mut s, &second);
    assert_eq!(reused, 150);
    // A cold run of the same chunks: the restored state is the state it had at 150, so the
    // logits are the same bits.
    assert_eq!(warm, cold_in_two(&m, &second, 150));

    // A prompt that leaves the history at 140 resumes at the checkpoint before it (128).
    let mut third = prompt[..140].to_vec();
    third.extend([21, 22, 23]);
    let (reused, warm) = continue_with(&mut s, &third);
    assert_eq!(reused, 128);
    assert_eq!(warm, cold_in_two(&m, &third, 128));

    // Going back before every checkpoint starts over.
    let fourth: Vec<u32> = prompt[..40].to_vec();
    let (reused, warm) = continue_with(&mut s, &fourth);
    assert_eq!(reused, 0);
    assert_eq!(warm, session(&m, 64).forward(&fourth).unwrap());
}

#[test]
fn checkpoints_are_bounded_and_counted() {
    let m = model("Q4_K_M");
    let prompt = long_prompt();
    let mut s = session(&m, 16);
    s.set_checkpoint_limit(2);
    s.forward(&prompt).unwrap();
    // Ten chunks of up to 16 tokens; every one queued a checkpoint, two are kept (the copy at
    // the prompt's end is queued until the next pass).
    let (held, bytes) = s.checkpoint_stats();
    assert_eq!(held, 2);
    // qwen35 fixture: one recurrent layer, conv state 512 x 3, delta state 4 heads x 64 x 64.
    assert_eq!(bytes, 2 * (512 * 3 + 4 * 64 * 64) * 4);
    // The oldest are gone: a prefix of 40 tokens finds none at or before it.
    assert_eq!(s.reusable_prefix(&prompt[..41]), 0);
    assert_eq!(s.reusable_prefix(&prompt[..145]), 144);
    assert_eq!(s.reusable_prefix(&prompt), 144);
    let mut longer = prompt.clone();
    longer.push(1);
    assert_eq!(s.reusable_prefix(&longer), 150);

    // No checkpoints at all: only a start from scratch, or the live state itself.
    let mut none = session(&m, 16);
    none.set_checkpoint_limit(0);
    none.forward(&prompt).unwrap();
    assert_eq!(none.checkpoint_stats(), (0, 0));
    assert_eq!(none.reusable_prefix(&prompt[..145]), 0);
    assert_eq!(none.reusable_prefix(&longer), 150);
}
