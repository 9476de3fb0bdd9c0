//! Same bits across refactors: digests of what the engine computes, recorded once and compared
//! on every run, so a change that means to move code without changing numbers proves it.
//!
//! Recorded in `tests/golden/same_bits.json`, for every fixture family (dense, MoE, MLA,
//! gpt-oss, the qwen35 hybrid) and both real models:
//! - the CPU backend's logits (SHA-256 of the f32 bits), teacher-forced over llama.cpp's golden
//!   cases (one chunked prefill returning every step's logits), for the detected SIMD kernels
//!   and the portable set, with an f16 KV cache and with a q8_0 one;
//! - the same models through batched passes: several sequences at once, staggered, some
//!   prefilling in chunks while others decode, as the server runs them;
//! - the WebGPU and Vulkan backends' greedy tokens (argmax on the device; lavapipe in CI), as
//!   token lists, with an f16 KV cache and (fixtures) a q8_0 one.
//!
//! A change that is meant to change numbers re-records the file with
//! `TINYLLM_RECORD_SAME_BITS=1 cargo test --release --test same_bits` and says why in its
//! commit. Keys are compared one by one, so a failure names what moved.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tinyllm::backend::cpu::kernels::Kernels;
use tinyllm::backend::cpu::CpuBackend;
use tinyllm::backend::vulkan::{VulkanBackend, VulkanOptions};
use tinyllm::backend::webgpu::WebGpuBackend;
use tinyllm::backend::{Backend, KvType};
use tinyllm::engine::{forward_batch, BatchItem, Session, SessionConfig};
use tinyllm::model::{HeadResult, HeadWant, Model};

use common::generation::{load_cases, load_on, teacher_forced, Case};

/// Real-model golden cases digested (teacher-forced and batched); the fixtures use all.
const REAL_CASES: usize = 3;
/// Decode steps per sequence of the batched scenario.
const BATCH_DECODE: usize = 4;
/// Prompt tokens per prefill chunk of the batched scenario (odd, so chunks end mid-prompt).
const BATCH_CHUNK: usize = 7;
/// Greedy tokens generated on WebGPU per real model.
const REAL_GREEDY: usize = 6;

fn record_path() -> PathBuf {
    common::golden("same_bits.json")
}

/// The models: every fixture, then the two real ones, as (name, path, golden cases).
fn models() -> Vec<(String, PathBuf, Vec<Case>)> {
    let dir = common::golden("fixtures");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("fixtures dir")
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.strip_suffix(".gguf").map(str::to_string)
        })
        .collect();
    names.sort();
    let mut out: Vec<(String, PathBuf, Vec<Case>)> = names
        .into_iter()
        .map(|n| {
            let cases = load_cases(&dir.join(format!("{n}.golden.jsonl")));
            (n.clone(), dir.join(format!("{n}.gguf")), cases)
        })
        .collect();
    for (gguf, golden) in [
        ("gemma-3-270m-q4_k_m.gguf", "gemma-3-270m"),
        ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "qwen2.5-coder-0.5b"),
    ] {
        let mut cases = load_cases(&common::golden(&format!("generate/{golden}.jsonl")));
        cases.truncate(REAL_CASES);
        out.push((golden.to_string(), common::real_model(gguf), cases));
    }
    out
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

fn add_f32(h: &mut Sha256, xs: &[f32]) {
    for x in xs {
        h.update(x.to_bits().to_le_bytes());
    }
}

/// Digest of every teacher-forced step's logits of `cases`, with a KV cache of format `cache`;
/// `None` where the model refuses that cache (a q8_0 cache needs head sizes in whole blocks):
/// a refusal that appears later shows as a recorded entry no longer computed.
fn teacher_forced_digest<B: Backend>(model: &Arc<Model<B>>, cases: &[Case], cache: KvType) -> Option<String> {
    let mut sess = try_session(model, 1024, cache)?;
    let mut h = Sha256::new();
    for case in cases {
        for step in teacher_forced(&mut sess, case) {
            add_f32(&mut h, &step);
        }
    }
    Some(hex(&h.finalize()))
}

fn session<B: Backend>(model: &Arc<Model<B>>, n_ctx: usize) -> Session<B> {
    session_with(model, n_ctx, KvType::F16)
}

fn session_with<B: Backend>(model: &Arc<Model<B>>, n_ctx: usize, cache_type: KvType) -> Session<B> {
    try_session(model, n_ctx, cache_type).expect("session")
}

fn try_session<B: Backend>(model: &Arc<Model<B>>, n_ctx: usize, cache_type: KvType) -> Option<Session<B>> {
    let config = SessionConfig {
        n_ctx,
        cache_type,
        ..SessionConfig::default()
    };
    match Session::new(Arc::clone(model), config) {
        Ok(s) => Some(s),
        Err(e) if cache_type != KvType::F16 => {
            println!("[same bits] no {cache_type:?} cache: {e}");
            None
        }
        Err(e) => panic!("session: {e}"),
    }
}

/// One sequence of the batched scenario: its prompt, then golden tokens fed one per pass.
struct Stream {
    session: usize,
    prompt: Vec<u32>,
    decode: Vec<u32>,
    /// Pass at which it joins.
    start: usize,
}

/// Digest of every logit row that batched passes return: one stream per case, the `i`-th
/// joining at pass `i`, prompts in chunks of [`BATCH_CHUNK`] (the logits of a prompt's last
/// token only), then [`BATCH_DECODE`] golden tokens one per pass, all in shared passes.
fn batched_digest<B: Backend>(model: &Arc<Model<B>>, cases: &[Case]) -> String {
    let mut streams: Vec<Stream> = cases
        .iter()
        .enumerate()
        .map(|(i, c)| Stream {
            session: i,
            prompt: c.prompt.clone(),
            decode: c.tokens.iter().take(BATCH_DECODE).copied().collect(),
            start: i,
        })
        .collect();
    let n_ctx = cases.iter().map(|c| c.prompt.len()).max().unwrap_or(0) + BATCH_DECODE + 1;
    let mut sessions: Vec<Session<B>> = streams.iter().map(|_| session(model, n_ctx)).collect();
    let mut scratch = model
        .scratch(streams.len() * BATCH_CHUNK, streams.len())
        .expect("scratch");
    let mut h = Sha256::new();
    for pass in 0.. {
        // (stream, tokens, n_last) of this pass.
        let mut feeds: Vec<(usize, Vec<u32>, usize)> = Vec::new();
        for (i, st) in streams.iter_mut().enumerate() {
            if pass < st.start {
                continue;
            }
            let done = sessions[st.session].pos();
            if done < st.prompt.len() {
                let end = (done + BATCH_CHUNK).min(st.prompt.len());
                feeds.push((i, st.prompt[done..end].to_vec(), usize::from(end == st.prompt.len())));
            } else if let Some(t) = st.decode.first().copied() {
                st.decode.remove(0);
                feeds.push((i, vec![t], 1));
            }
        }
        if feeds.is_empty() {
            break;
        }
        let mut slots: Vec<Option<&mut Session<B>>> = sessions.iter_mut().map(Some).collect();
        let mut items: Vec<BatchItem<'_, B>> = feeds
            .iter()
            .map(|(i, tokens, n_last)| BatchItem {
                session: slots[streams[*i].session].take().expect("one feed per session"),
                tokens,
                n_last: *n_last,
            })
            .collect();
        let results = forward_batch(&mut scratch, &mut items, HeadWant::Logits)
            .and_then(|r| Ok(r.wait()?))
            .expect("batched pass");
        for r in results {
            let HeadResult::Logits(logits) = r else {
                panic!("logits asked for")
            };
            add_f32(&mut h, &logits);
        }
    }
    hex(&h.finalize())
}

/// Greedy tokens through the backend's argmax, `n` of them after `prompt`.
fn greedy<B: Backend>(model: &Arc<Model<B>>, prompt: &[u32], n: usize, cache: KvType) -> Option<Vec<u32>> {
    let mut sess = try_session(model, prompt.len() + n + 1, cache)?;
    let mut out = vec![sess.forward_argmax(prompt).expect("prefill")];
    while out.len() < n {
        let last = *out.last().expect("a token");
        out.push(sess.forward_argmax(&[last]).expect("decode"));
    }
    Some(out)
}

/// Everything this build computes, by key.
fn compute() -> BTreeMap<String, Value> {
    let mut got = BTreeMap::new();
    let models = models();
    for (set, kernels) in [("simd", Kernels::detect()), ("portable", Kernels::portable())] {
        if set == "simd" && kernels.variant == "portable" {
            // No SIMD set on this CPU: the portable entries cover it.
            continue;
        }
        for (name, path, cases) in &models {
            let model = load_on(CpuBackend::with_kernels(2, kernels).expect("cpu backend"), path);
            let is_real = !path.starts_with(common::golden("fixtures"));
            if set == "portable" && is_real {
                // The portable set is slow on real models; the fixtures cover its code.
                continue;
            }
            for (cache, suffix) in [(KvType::F16, ""), (KvType::Q8_0, "_kv_q8_0")] {
                if let Some(d) = teacher_forced_digest(&model, cases, cache) {
                    got.insert(format!("cpu/{set}/{name}/teacher_forced{suffix}"), json!(d));
                }
            }
            got.insert(
                format!("cpu/{set}/{name}/batched"),
                json!(batched_digest(&model, cases)),
            );
        }
    }
    if let Some(gpu) = common::device_or_skip(WebGpuBackend::new) {
        gpu_greedy(&mut got, "webgpu", gpu, &models);
    }
    if let Some(vk) = common::device_or_skip(|| VulkanBackend::open(VulkanOptions::default())) {
        gpu_greedy(&mut got, "vulkan", vk, &models);
    }
    got
}

/// Whether the GPU backends have a decoder for every matrix of the model at `path` (the IQ
/// fixtures have none yet; loading them is refused with an error naming the type).
fn gpu_reads(path: &std::path::Path) -> bool {
    let file = tinyllm::gguf::GgufFile::open(path).expect("fixture");
    file.tensors()
        .iter()
        .all(|t| t.shape.len() < 2 || tinyllm::backend::webgpu::kernels::supports(t.ty))
}

/// A GPU backend's greedy tokens on every model it reads ([`gpu_reads`], argmax on the
/// device): every golden case of a fixture with an f16 and a q8_0 cache, the first case of a
/// real model for [`REAL_GREEDY`] tokens with an f16 cache.
fn gpu_greedy<B: Backend + Clone>(
    got: &mut BTreeMap<String, Value>,
    key: &str,
    gpu: B,
    models: &[(String, PathBuf, Vec<Case>)],
) {
    for (name, path, cases) in models.iter().filter(|(_, path, _)| gpu_reads(path)) {
        let model = load_on(gpu.clone(), path);
        let is_real = !path.starts_with(common::golden("fixtures"));
        for case in cases.iter().take(if is_real { 1 } else { cases.len() }) {
            let n = if is_real { REAL_GREEDY } else { case.tokens.len() };
            let caches: &[(KvType, &str)] = if is_real {
                &[(KvType::F16, "greedy")]
            } else {
                &[(KvType::F16, "greedy"), (KvType::Q8_0, "greedy_kv_q8_0")]
            };
            for &(cache, what) in caches {
                if let Some(tokens) = greedy(&model, &case.prompt, n, cache) {
                    got.insert(format!("{key}/{name}/{what}/{}", case.name), json!(tokens));
                }
            }
        }
    }
}

#[test]
fn outputs_have_the_recorded_bits() {
    let got = compute();
    let path = record_path();
    if std::env::var("TINYLLM_RECORD_SAME_BITS").as_deref() == Ok("1") {
        let text = serde_json::to_string_pretty(&got).expect("json") + "\n";
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        eprintln!("recorded {} entries in {}", got.len(), path.display());
        return;
    }
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let want: BTreeMap<String, Value> = serde_json::from_str(&text).expect("same_bits.json");
    let mut moved = Vec::new();
    for (key, value) in &got {
        match want.get(key) {
            Some(w) if w == value => {}
            Some(w) => moved.push(format!("{key}: recorded {w}, now {value}")),
            None => moved.push(format!("{key}: not recorded")),
        }
    }
    // Every recorded entry is computed again (a GPU backend's only where it has a device).
    let ran = |backend: &str| got.keys().any(|k| k.split('/').next() == Some(backend));
    for key in want.keys() {
        let backend = key.split('/').next().unwrap_or_default();
        if !got.contains_key(key) && ran(backend) {
            moved.push(format!("{key}: recorded but no longer computed"));
        }
    }
    println!("[same bits] {} entries compared, {} differ", got.len(), moved.len());
    assert!(moved.is_empty(), "outputs moved:\n{}", moved.join("\n"));
}
