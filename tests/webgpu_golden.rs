//! The WebGPU backend end to end against llama.cpp's reference outputs, by the rules of
//! `tests/model_golden.rs` (fixtures: the golden README's tolerances; real models: within
//! llama.cpp's own spread), and against the CPU backend: free-running greedy tokens equal to
//! the CPU backend's up to the first golden near-tie (or parting only at a near-tie of one of
//! the two backends).
//!
//! Every fixture is held to the golden README's rule, the routed (MoE) and recurrent ones
//! included: the GPU rounds a matmul's activations as llama.cpp does (Q8_0/Q8_K blocks, f16;
//! quantize_act.wgsl). Before it did, the GPU multiplied f32 activations, and the quantized
//! MoE and qwen35 fixtures landed up to 0.11 and 0.053 from llama.cpp's answers (router
//! near-ties and the recurrent layer amplify the difference); now they land where the CPU
//! backend does. Needs an adapter (Mesa lavapipe in CI): without one the tests
//! are skipped (`common::device_or_skip`), unless `TINYLLM_REQUIRE_GPU=1`. Run with
//! `cargo test --release --test webgpu_golden`; the real-model tests take minutes on lavapipe
//! (about 400 and 500 CPU seconds).

mod common;

use tinyllm::backend::cpu::CpuBackend;
use tinyllm::backend::webgpu::{WebGpuBackend, WebGpuOptions};
use tinyllm::backend::{Backend, KvType};
use tinyllm::engine::Session;

use common::generation::{
    argmax, fixture_clear_gap, fixture_tolerance, greedy_miss, load_cases, load_on as load, session, session_with,
    softmax, teacher_forced, with_cache, Case, Spread, REAL_TOL,
};

fn gpu() -> Option<WebGpuBackend> {
    common::device_or_skip(WebGpuBackend::new)
}

/// Deviations of one golden file.
#[derive(Default)]
struct Stats {
    steps: usize,
    max_top10: f64,
    max_top1: f64,
    top1: Vec<f64>,
    argmax_checked: usize,
    /// Steps beyond `tol` (checked on the top-10 or top-1 entries).
    beyond: Vec<(f64, String)>,
    argmax_failures: Vec<String>,
}

fn compare(case: &Case, logits: &[Vec<f32>], tol: f64, top1_only: bool, clear_gap: f64, st: &mut Stats) {
    for (i, (l, top)) in logits.iter().zip(&case.top).enumerate() {
        let p = softmax(l);
        st.steps += 1;
        for (rank, &(id, pg)) in top.iter().enumerate() {
            let d = (p[id as usize] - pg).abs();
            st.max_top10 = st.max_top10.max(d);
            if rank == 0 {
                st.max_top1 = st.max_top1.max(d);
                st.top1.push(d);
            }
            if d > tol && (rank == 0 || !top1_only) {
                st.beyond.push((
                    d,
                    format!("{} step {i} id {id}: {:.4} vs {pg:.4}", case.name, p[id as usize]),
                ));
            }
        }
        let gap = top[0].1 - top.get(1).map_or(0.0, |t| t.1);
        if gap > clear_gap {
            st.argmax_checked += 1;
            if argmax(l) != top[0].0 {
                st.argmax_failures.push(format!(
                    "{} step {i}: argmax {} vs {} (gap {gap:.3})",
                    case.name,
                    argmax(l),
                    top[0].0
                ));
            }
        }
    }
}

fn median(v: &[f64]) -> f64 {
    let mut d = v.to_vec();
    d.sort_by(f64::total_cmp);
    d.get(d.len() / 2).copied().unwrap_or(0.0)
}

fn check_fixtures(arch: &str, quants: &[&str]) {
    let Some(g) = gpu() else { return };
    check_fixtures_on(g, arch, quants);
}

fn check_fixtures_on(g: WebGpuBackend, arch: &str, quants: &[&str]) {
    check_fixtures_with(g, arch, quants, KvType::F16);
}

/// [`check_fixtures_on`] with a KV cache of format `cache`, its tolerance widened by the
/// cache's share (`common::generation::with_cache`).
fn check_fixtures_with(g: WebGpuBackend, arch: &str, quants: &[&str], cache: KvType) {
    let mut failed = Vec::new();
    for q in quants {
        let file = format!("{arch}.{q}");
        let dir = common::golden("fixtures");
        let model = load(g.clone(), &dir.join(format!("{file}.gguf")));
        let mut sess = session_with(&model, 512, cache);
        let mut st = Stats::default();
        let (tol, gap) = (
            with_cache(fixture_tolerance(arch, q), cache),
            fixture_clear_gap(arch, q),
        );
        let name = if cache == KvType::F16 {
            file.clone()
        } else {
            format!("{file} {cache} cache")
        };
        for case in load_cases(&dir.join(format!("{file}.golden.jsonl"))) {
            let logits = teacher_forced(&mut sess, &case);
            compare(&case, &logits, tol, false, gap, &mut st);
            // Free-running greedy tokens equal llama.cpp's up to its first near-tie.
            st.argmax_failures.extend(greedy_miss(&mut sess, &case, gap));
        }
        println!(
            "[webgpu golden] {name}: {} steps, max|dp| top10 {:.2e}, top1 {:.2e}, argmax checked {}, {} beyond {tol:.3}, {} argmax failures",
            st.steps,
            st.max_top10,
            st.max_top1,
            st.argmax_checked,
            st.beyond.len(),
            st.argmax_failures.len()
        );
        failed.extend(st.beyond.iter().map(|(_, m)| format!("{name}: {m}")));
        failed.extend(st.argmax_failures.iter().map(|m| format!("{name}: {m}")));
    }
    assert!(failed.is_empty(), "{} mismatches:\n{}", failed.len(), failed.join("\n"));
}

#[test]
fn llama_fixtures_match_llama_cpp_on_webgpu() {
    check_fixtures("llama", &["F16", "Q8_0", "Q4_K_M", "Q4_0", "Q5_0", "Q6_K", "IQ4_XS"]);
}

#[test]
fn qwen2_fixtures_match_llama_cpp_on_webgpu() {
    check_fixtures("qwen2", &["F16", "Q8_0", "Q4_K_M"]);
}

#[test]
fn qwen3_fixtures_match_llama_cpp_on_webgpu() {
    check_fixtures("qwen3", &["F16", "Q8_0", "Q4_K_M"]);
}

#[test]
fn gemma3_fixtures_match_llama_cpp_on_webgpu() {
    check_fixtures("gemma3", &["F16", "Q8_0", "Q4_K_M"]);
}

/// `--cache-type q8_0` on WebGPU: the cache quantized by kv_store_q8_0.wgsl and read block by
/// block by attention (kv_q8_0.wgsl), within the quantized tolerance of llama.cpp's goldens.
#[test]
fn fixtures_with_q8_0_cache_match_llama_cpp_on_webgpu() {
    let Some(g) = gpu() else { return };
    for arch in ["llama", "qwen2", "qwen3", "gemma3", "deepseek2", "qwen35"] {
        check_fixtures_with(g.clone(), arch, &["F16", "Q8_0", "Q4_K_M"], KvType::Q8_0);
    }
}

#[test]
fn qwen3moe_fixtures_match_llama_cpp_on_webgpu() {
    check_fixtures("qwen3moe", &["F16", "Q8_0", "Q4_K_M"]);
}

#[test]
fn olmoe_fixtures_match_llama_cpp_on_webgpu() {
    check_fixtures("olmoe", &["F16", "Q8_0", "Q4_K_M"]);
}

#[test]
fn deepseek2_fixtures_match_llama_cpp_on_webgpu() {
    check_fixtures("deepseek2", &["F16", "Q8_0", "Q4_K_M"]);
}

#[test]
fn qwen35_fixtures_match_llama_cpp_on_webgpu() {
    check_fixtures("qwen35", &["F16", "Q8_0", "Q4_K_M"]);
}

#[test]
fn gpt_oss_fixtures_match_llama_cpp_on_webgpu() {
    check_fixtures("gpt-oss", &["F16", "Q8_0", "Q4_K_M"]);
}

/// The GPU matmul path (a workgroup per row: vec4 loads, subgroup reduction) with f16
/// products, which lavapipe offers, meets the same rules on the fixtures; and f16 products
/// are really in use: the logits differ from the same path's in f32.
#[test]
fn fixtures_match_llama_cpp_with_f16_workgroup_matmuls() {
    use tinyllm::backend::webgpu::MatmulVariant;
    let open = |f16| {
        WebGpuBackend::with_options(WebGpuOptions {
            matmul: Some(MatmulVariant::Workgroup),
            f16_matmul: Some(f16),
            ..Default::default()
        })
    };
    let Some(g) = common::device_or_skip(|| match open(true) {
        Ok(g) if g.f16_matmul() => Ok(g),
        Ok(g) => Err(format!("adapter '{}' has no shader-f16", g.adapter().name)),
        Err(e) => Err(e.to_string()),
    }) else {
        return;
    };
    let f32_path = open(false).expect("the adapter opened once");
    assert!(!f32_path.f16_matmul());
    let dir = common::golden("fixtures");
    let case = &load_cases(&dir.join("qwen2.Q8_0.golden.jsonl"))[0];
    let with = teacher_forced(&mut session(&load(g.clone(), &dir.join("qwen2.Q8_0.gguf")), 512), case);
    let without = teacher_forced(&mut session(&load(f32_path, &dir.join("qwen2.Q8_0.gguf")), 512), case);
    assert_ne!(
        with, without,
        "f16 products leave the logits of the f32 path: not in use"
    );
    for arch in ["llama", "qwen2", "gemma3"] {
        check_fixtures_on(g.clone(), arch, &["Q8_0", "Q4_K_M"]);
    }
}

/// Greedy tokens of `model` for `case`'s prompt, `n` of them, each with the margin of its
/// pick (top-1 minus top-2 probability).
fn greedy<B: Backend>(sess: &mut Session<B>, case: &Case, n: usize) -> Vec<(u32, f64)> {
    let mut out = Vec::new();
    if n == 0 {
        return out;
    }
    let mut l = sess.prefill(&case.prompt).expect("prefill");
    loop {
        let t = argmax(&l);
        let mut p = softmax(&l);
        let p1 = p[t as usize];
        p[t as usize] = f64::NEG_INFINITY;
        let p2 = p.iter().copied().fold(0.0, f64::max);
        out.push((t, p1 - p2));
        if out.len() == n {
            return out;
        }
        l = sess.forward(&[t]).expect("decode");
    }
}

/// Where two greedy runs first part, if they part at a step where neither backend saw a
/// near-tie (margin below `tie`): a real disagreement, not arithmetic noise deciding a tie.
fn real_divergence(a: &[(u32, f64)], b: &[(u32, f64)], tie: f64) -> Option<usize> {
    let d = a.iter().zip(b).position(|(x, y)| x.0 != y.0)?;
    (a[d].1 >= tie && b[d].1 >= tie).then_some(d)
}

/// A real model on WebGPU held to the CPU backend's rule (DESIGN.md: within llama.cpp's own
/// spread, [`Spread::judge`]) over teacher forcing on every golden prompt and greedy runs up to
/// the first golden near-tie; and its greedy tokens equal to the CPU backend's, or parting only
/// where one of the two backends itself sees a near-tie (its top-2 within the golden
/// tolerance: the CPU's activation quantization may decide such a tie either way).
fn check_real(gguf: &str, golden_name: &str) {
    let Some(g) = gpu() else { return };
    let path = common::real_model(gguf);
    let model = load(g, &path);
    let cpu = load(CpuBackend::new(0).expect("cpu"), &path);
    let spread = Spread::load(golden_name);
    let mut sess = session(&model, 1024);
    let mut cpu_sess = session(&cpu, 1024);
    let mut st = Stats::default();
    let mut probs = Vec::new();
    let mut tokens = Vec::new();
    let mut greedy_same = 0;
    let mut greedy_wrong = Vec::new();
    let mut notes = Vec::new();
    for (c, case) in spread.golden.iter().enumerate() {
        let logits = teacher_forced(&mut sess, case);
        compare(case, &logits, f64::INFINITY, true, f64::INFINITY, &mut st);
        probs.push(logits.iter().map(|l| softmax(l)).collect::<Vec<_>>());
        let horizon = spread.horizon[c];
        let ours = greedy(&mut sess, case, horizon);
        let theirs = greedy(&mut cpu_sess, case, horizon);
        let ids = |v: &[(u32, f64)]| v.iter().map(|t| t.0).collect::<Vec<_>>();
        if ids(&ours) == ids(&theirs) {
            greedy_same += 1;
        } else if let Some(d) = real_divergence(&ours, &theirs, REAL_TOL) {
            greedy_wrong.push(format!(
                "{} step {d}: webgpu {:?} vs cpu {:?}",
                case.name,
                ids(&ours),
                ids(&theirs)
            ));
        } else {
            notes.push(format!(
                "{}: webgpu {:?} vs cpu {:?} (parted at a near-tie of a backend)",
                case.name,
                ids(&ours),
                ids(&theirs)
            ));
        }
        tokens.push(ids(&ours));
    }
    println!(
        "[webgpu golden] {gguf}: {} steps, top1 |dp| max {:.3} median {:.1e}, greedy equal to cpu on {greedy_same}/{} prompts",
        st.steps,
        st.max_top1,
        median(&st.top1),
        spread.golden.len()
    );
    for n in &notes {
        println!("[webgpu golden]   greedy differs: {n}");
    }
    let mut failures = spread.judge("webgpu", |c, i, id| probs[c][i][id as usize], &tokens);
    failures.extend(
        greedy_wrong
            .into_iter()
            .map(|w| format!("greedy parts from the cpu's: {w}")),
    );
    assert!(failures.is_empty(), "{golden_name}:\n{}", failures.join("\n"));
}

/// All 12 prompts: minutes on lavapipe (on two cores about 400 CPU seconds for gemma-3-270m and
/// 500 for this model).
#[test]
fn qwen25_coder_on_webgpu_within_llama_cpp_spread() {
    check_real("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "qwen2.5-coder-0.5b");
}

#[test]
fn gemma3_270m_on_webgpu_within_llama_cpp_spread() {
    check_real("gemma-3-270m-q4_k_m.gguf", "gemma-3-270m");
}

/// A decode step is one submission and one readback (the token id) and creates no bind group
/// once a step has run: the bind groups of the pass are made once and reused. A second session
/// (fresh buffers, after the first one's were freed) gives the same tokens, and the cached
/// groups of the first session's buffers left with them.
#[test]
fn decode_steps_reuse_their_bind_groups() {
    let Some(g) = gpu() else { return };
    let model = load(g.clone(), &common::golden("fixtures").join("qwen2.Q8_0.gguf"));
    let prompt = [97u32, 11, 187, 0, 340];
    let run = |steps: usize| {
        let mut sess = session(&model, 64);
        let mut tokens = vec![sess.forward_argmax(&prompt).expect("prefill")];
        tokens.push(sess.forward_argmax(&[tokens[0]]).expect("first step"));
        let before = g.counters();
        for _ in 0..steps {
            let t = *tokens.last().unwrap();
            tokens.push(sess.forward_argmax(&[t]).expect("decode"));
        }
        let after = g.counters();
        (tokens, before, after)
    };
    let (first, before, after) = run(4);
    assert_eq!(after.submissions - before.submissions, 4);
    assert_eq!(after.readbacks - before.readbacks, 4);
    assert_eq!(after.bind_groups, before.bind_groups, "decode steps made bind groups");
    assert!(after.dispatches - before.dispatches >= 4 * 10);
    let cached = g.cached_bind_groups();
    let (second, ..) = run(4);
    assert_eq!(first, second, "a second session decodes differently");
    assert_eq!(
        g.cached_bind_groups(),
        cached,
        "a dropped session's bind groups stayed cached"
    );
}

/// Attention split across the KV length (forced on, chunks of 8 positions, for prefill and
/// decode) picks the same greedy tokens as the one-pass kernel over a 40-token run.
#[test]
fn split_attention_decodes_like_one_pass() {
    let Some(g) = gpu() else { return };
    let split = WebGpuBackend::with_options(WebGpuOptions {
        kv_chunk: Some(8),
        ..Default::default()
    })
    .expect("the adapter opened once");
    let path = common::golden("fixtures").join("gemma3.Q8_0.gguf");
    let tokens = |be: WebGpuBackend| {
        let model = load(be, &path);
        let mut sess = session(&model, 64);
        let mut t = vec![sess.forward_argmax(&[2, 17, 99, 4, 250, 31]).expect("prefill")];
        while t.len() < 40 {
            t.push(sess.forward_argmax(&[*t.last().unwrap()]).expect("decode"));
        }
        t
    };
    let (a, b) = (tokens(split), tokens(g));
    println!("[split attention] {a:?}");
    assert_eq!(a, b);
}

/// Sampling from the device's candidates (select.wgsl: a few hundred bytes read back per
/// token) draws the same tokens as sampling from the logits read back whole, with the
/// penalties on, over a 48-token run; and a decode step is still one submission and one
/// readback.
#[test]
fn sampling_from_device_candidates_equals_sampling_from_logits() {
    use tinyllm::sample::{Sampler, SamplerConfig};
    let Some(g) = gpu() else { return };
    let model = load(g.clone(), &common::golden("fixtures").join("qwen2.Q4_K_M.gguf"));
    let cfg = SamplerConfig {
        temperature: 1.5,
        top_k: 20,
        repeat_penalty: 1.2,
        presence_penalty: 0.3,
        seed: 7,
        ..SamplerConfig::default()
    };
    let prompt = [97u32, 11, 187, 0, 340];
    // From the logits.
    let mut whole = Sampler::new(cfg.clone()).unwrap();
    let mut sess = session(&model, 64);
    let mut a = vec![whole.sample(&sess.forward(&prompt).unwrap(), sess.tokens())];
    while a.len() < 48 {
        let l = sess.forward(&[*a.last().unwrap()]).unwrap();
        a.push(whole.sample(&l, sess.tokens()));
    }
    // From the candidates.
    let mut sparse = Sampler::new(cfg).unwrap();
    let mut sess = session(&model, 64);
    let mut b = Vec::new();
    let mut before = g.counters();
    for step in 0..48 {
        let tokens: Vec<u32> = if step == 0 { prompt.to_vec() } else { vec![b[step - 1]] };
        let plan = sparse
            .plan_after(sess.tokens(), &tokens)
            .expect("top-k sampling has a plan");
        let c = sess.forward_candidates(&tokens, &plan).unwrap();
        b.push(sparse.sample_candidates(&c, &plan, sess.tokens()));
        if step == 0 {
            before = g.counters();
        }
    }
    let after = g.counters();
    assert_eq!(a, b, "device candidates drew other tokens");
    assert!(
        a.iter().collect::<std::collections::HashSet<_>>().len() > 5,
        "the draws never varied"
    );
    assert_eq!(after.submissions - before.submissions, 47);
    assert_eq!(after.readbacks - before.readbacks, 47);
}
