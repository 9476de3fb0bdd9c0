//! Forward pass against llama.cpp's reference outputs (`tests/golden/README.llama-cpp.md`).
//!
//! Teacher forcing: prompt + golden tokens run as one chunked prefill that returns the logits
//! of every golden step; at each step the top-10 probabilities must match llama.cpp's within
//! the README tolerance, and our argmax must equal theirs wherever their top-1/top-2 gap is
//! clear. Free-running greedy (fixtures and real models): our tokens must match theirs up to
//! the first near-tie. Real models are found in `$TINYLLM_MODELS` (default `~/.cache/tinyllm/models`);
//! run these with `cargo test --release --test model_golden`.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::generation::{
    argmax, fixture_clear_gap, fixture_golden, fixture_tolerance, greedy_miss, load_cases, load_on, quantile, session,
    session_with, softmax, teacher_forced, Case, Spread, LOWBIT_MOE_QUANTS, LOWBIT_QUANTS,
};
use tinyllm::backend::cpu::CpuBackend;
use tinyllm::backend::KvType;
use tinyllm::engine::{EngineError, Session, SessionConfig};
use tinyllm::gguf::GgufFile;
use tinyllm::model::Model;

fn load_model(path: &Path, threads: usize) -> Arc<Model<CpuBackend>> {
    load_on(CpuBackend::new(threads).expect("cpu backend"), path)
}

/// Deviation statistics of one golden file.
#[derive(Default)]
struct Stats {
    steps: usize,
    /// Max |Δp| over all top-10 entries.
    max_top10: f64,
    /// Max |Δp| of the golden top-1 entry.
    max_top1: f64,
    worst_at: String,
    /// |Δp| of the golden top-1 entry at every step.
    top1_devs: Vec<f64>,
    argmax_checked: usize,
    failures: Vec<String>,
}

/// How a fixture's distributions are judged.
struct Rule {
    tol: f64,
    clear_gap: f64,
}

/// Compare one case's teacher-forced distributions.
fn compare(case: &Case, logits: &[Vec<f32>], rule: &Rule, st: &mut Stats) {
    for (i, (l, top)) in logits.iter().zip(&case.top).enumerate() {
        let p = softmax(l);
        st.steps += 1;
        for (rank, &(id, pg)) in top.iter().enumerate() {
            let d = (p[id as usize] - pg).abs();
            if d > st.max_top10 {
                st.max_top10 = d;
                st.worst_at = format!(
                    "{} step {i} rank {rank} (id {id}: ours {:.5}, golden {pg:.5})",
                    case.name, p[id as usize]
                );
            }
            if rank == 0 {
                st.max_top1 = st.max_top1.max(d);
                st.top1_devs.push(d);
            }
            if d > rule.tol {
                st.failures.push(format!(
                    "{} step {i}: id {id} prob {:.5} vs golden {pg:.5} (|d| {d:.4} > {})",
                    case.name, p[id as usize], rule.tol
                ));
            }
        }
        let gap = top[0].1 - top.get(1).map_or(0.0, |t| t.1);
        if gap > rule.clear_gap {
            st.argmax_checked += 1;
            let ours = argmax(l);
            if ours != top[0].0 {
                st.failures.push(format!(
                    "{} step {i}: argmax {ours} vs golden {} (gap {gap:.3})",
                    case.name, top[0].0
                ));
            }
        }
    }
}

fn report(file: &str, st: &Stats) {
    println!(
        "[golden] {file}: {} steps, max|dp| top10 {:.2e}, top1 {:.2e} (median {:.1e}, p90 {:.1e}), argmax checked {} ({}), worst at {}",
        st.steps,
        st.max_top10,
        st.max_top1,
        quantile(&st.top1_devs, 0.5),
        quantile(&st.top1_devs, 0.9),
        st.argmax_checked,
        if st.failures.is_empty() {
            "ok".to_string()
        } else {
            format!("{} FAILURES", st.failures.len())
        },
        st.worst_at
    );
}

/// The x86 SIMD kernels' bound on deepseek2's Q8_0 fixture, above the Q8_0 rule (3e-2) that
/// the portable kernels, WebGPU and Vulkan meet there. Measured (#32): one step of all, short_20
/// step 3, is 0.055 from the golden; at it the MoE layer routes the last token to experts
/// [3, 6] with a score gap of 1.3e-3 to the next, where the portable kernels route [2, 3] (gap
/// 3.7e-3) and land 4e-3 from the golden. Every earlier row routes the same in both kernel sets,
/// with score gaps differing by up to 1e-2 between them (1.4e-3 on the F16 fixture too): the
/// two correct summation orders, amplified by a random-weight model, flip a close route. Still
/// tight enough to catch an MLA or routing error of 0.1, which the old 0.15 let pass.
const DEEPSEEK2_Q8_0_SIMD_TOL: f64 = 6e-2;

/// [`fixture_tolerance`] for the CPU kernels this run uses ([`DEEPSEEK2_Q8_0_SIMD_TOL`]).
fn cpu_tolerance(arch: &str, quant: &str) -> f64 {
    let tol = fixture_tolerance(arch, quant);
    let simd = tinyllm::backend::cpu::kernels::Kernels::detect().variant != "portable";
    if simd && (arch, quant) == ("deepseek2", "Q8_0") {
        tol.max(DEEPSEEK2_Q8_0_SIMD_TOL)
    } else {
        tol
    }
}

/// Teacher forcing for every quant of one fixture architecture.
fn check_fixture_arch(arch: &str, quants: &[&str]) {
    check_fixture_arch_with(arch, quants, KvType::F16);
}

/// [`check_fixture_arch`] with a KV cache of format `cache`, against llama.cpp's goldens for
/// that format ([`fixture_golden`]: its f16-cache goldens, or its run with the same cache
/// written by `scripts/kv-cache-goldens.py`), by [`fixture_tolerance`].
fn check_fixture_arch_with(arch: &str, quants: &[&str], cache: KvType) {
    let mut failed = Vec::new();
    for q in quants {
        let file = format!("{arch}.{q}");
        let dir = common::golden("fixtures");
        let model = load_model(&dir.join(format!("{file}.gguf")), 0);
        let mut sess = session_with(&model, 512, cache);
        let rule = Rule {
            tol: cpu_tolerance(arch, q),
            clear_gap: fixture_clear_gap(arch, q),
        };
        let mut st = Stats::default();
        for case in load_cases(&dir.join(fixture_golden(&file, cache))) {
            // Free-running greedy: the same tokens up to the first near-tie.
            st.failures.extend(greedy_miss(&mut sess, &case, rule.tol));
            let logits = teacher_forced(&mut sess, &case);
            compare(&case, &logits, &rule, &mut st);
        }
        let name = if cache == KvType::F16 {
            file.clone()
        } else {
            format!("{file} {cache} cache vs llama.cpp's {cache} cache")
        };
        report(&name, &st);
        failed.extend(st.failures.iter().map(|f| format!("{name}: {f}")));
    }
    assert!(failed.is_empty(), "{} mismatches:\n{}", failed.len(), failed.join("\n"));
}

#[test]
fn llama_fixtures_match_llama_cpp() {
    check_fixture_arch("llama", &["F16", "Q8_0", "Q4_K_M", "Q4_0", "Q5_0", "Q6_K", "IQ4_XS"]);
}

/// The 1- to 3-bit formats real MoE checkpoints ship in, on the dense family and on qwen3moe,
/// quantized by llama.cpp from the F16 fixtures with an importance matrix
/// (`scripts/lowbit-goldens.py`), each within llama.cpp's own measured spread on that file
/// ([`common::generation::lowbit_spread`]). qwen3moe has no Q1_0, TQ1_0 or TQ2_0 file: its
/// experts are 32 values wide, and llama-quantize has no fallback for those formats' blocks.
#[test]
fn lowbit_fixtures_match_llama_cpp() {
    check_fixture_arch("llama", &LOWBIT_QUANTS);
    check_fixture_arch("qwen3moe", &LOWBIT_QUANTS[..LOWBIT_MOE_QUANTS]);
}

#[test]
fn qwen2_fixtures_match_llama_cpp() {
    check_fixture_arch("qwen2", &["F16", "Q8_0", "Q4_K_M"]);
}

#[test]
fn qwen3_fixtures_match_llama_cpp() {
    check_fixture_arch("qwen3", &["F16", "Q8_0", "Q4_K_M"]);
}

#[test]
fn gemma3_fixtures_match_llama_cpp() {
    check_fixture_arch("gemma3", &["F16", "Q8_0", "Q4_K_M"]);
}

/// `--cache-type q8_0`: the fixtures with a Q8_0 KV cache against llama.cpp's own q8_0-cache
/// runs, by the weights' own rule ([`fixture_golden`]).
#[test]
fn llama_fixtures_with_q8_0_cache_match_llama_cpp() {
    check_fixture_arch_with("llama", &["F16", "Q8_0", "Q4_K_M"], KvType::Q8_0);
}

#[test]
fn qwen2_fixtures_with_q8_0_cache_match_llama_cpp() {
    check_fixture_arch_with("qwen2", &["F16", "Q8_0", "Q4_K_M"], KvType::Q8_0);
}

#[test]
fn qwen3_fixtures_with_q8_0_cache_match_llama_cpp() {
    check_fixture_arch_with("qwen3", &["F16", "Q8_0", "Q4_K_M"], KvType::Q8_0);
}

/// Heads of 128: K and Q rotate in groups of 128, V and the output in groups of 64.
#[test]
fn gemma3_fixtures_with_q8_0_cache_match_llama_cpp() {
    check_fixture_arch_with("gemma3", &["F16", "Q8_0", "Q4_K_M"], KvType::Q8_0);
}

/// MLA's latent cache (576-wide rows in real models, 160 here: whole blocks) in Q8_0, values
/// read from the first blocks of the keys; it does not rotate (llama.cpp's MLA path has no
/// rotation).
#[test]
fn deepseek2_fixtures_with_q8_0_cache_match_llama_cpp() {
    check_fixture_arch_with("deepseek2", &["F16", "Q8_0", "Q4_K_M"], KvType::Q8_0);
}

/// The hybrid's attention layers with a Q8_0 cache (its recurrent state stays f32).
#[test]
fn qwen35_fixtures_with_q8_0_cache_match_llama_cpp() {
    check_fixture_arch_with("qwen35", &["F16", "Q8_0", "Q4_K_M"], KvType::Q8_0);
}

#[test]
fn moe_fixtures_with_q8_0_cache_match_llama_cpp() {
    for arch in ["qwen3moe", "olmoe"] {
        check_fixture_arch_with(arch, &["F16", "Q8_0", "Q4_K_M"], KvType::Q8_0);
    }
}

/// Sinks and sliding windows over a rotated Q8_0 cache.
#[test]
fn gpt_oss_fixtures_with_q8_0_cache_match_llama_cpp() {
    check_fixture_arch_with("gpt-oss", &["F16", "Q8_0", "Q4_K_M"], KvType::Q8_0);
}

#[test]
fn qwen3moe_fixtures_match_llama_cpp() {
    check_fixture_arch("qwen3moe", &["F16", "Q8_0", "Q4_K_M"]);
}

#[test]
fn olmoe_fixtures_match_llama_cpp() {
    check_fixture_arch("olmoe", &["F16", "Q8_0", "Q4_K_M"]);
}

#[test]
fn deepseek2_fixtures_match_llama_cpp() {
    check_fixture_arch("deepseek2", &["F16", "Q8_0", "Q4_K_M"]);
}

#[test]
fn qwen35_fixtures_match_llama_cpp() {
    check_fixture_arch("qwen35", &["F16", "Q8_0", "Q4_K_M"]);
}

/// Qwen3.5 MoE: the qwen35 hybrid with routed experts and a sigmoid-gated shared expert in
/// every layer (`scripts/qwen35moe-fixture.py`).
#[test]
fn qwen35moe_fixtures_match_llama_cpp() {
    check_fixture_arch("qwen35moe", &["F16", "Q8_0", "Q4_K_M"]);
}

#[test]
fn gpt_oss_fixtures_match_llama_cpp() {
    check_fixture_arch("gpt-oss", &["F16", "Q8_0", "Q4_K_M"]);
}

/// Real model against llama.cpp's own spread (docs/design.md, Testing strategy; the rule is
/// [`Spread::judge`]): teacher forcing on every golden prompt, then free-running greedy up to
/// the first golden near-tie, reusing the prompt's cached prefix.
fn check_real_model(gguf: &str, golden_name: &str) {
    check_real_model_with(gguf, golden_name, KvType::F16);
}

/// [`check_real_model`] with a KV cache of format `cache`, against llama.cpp's run with that
/// cache ([`Spread::load_with`]).
fn check_real_model_with(gguf: &str, golden_name: &str, cache: KvType) {
    let spread = Spread::load_with(golden_name, cache);
    let model = load_model(&common::real_model(gguf), 0);
    let mut sess = session_with(&model, 1024, cache);
    let mut st = Stats::default();
    let mut ours_probs = Vec::new();
    let mut ours_tokens = Vec::new();
    let report_rule = Rule {
        tol: f64::INFINITY,
        clear_gap: f64::INFINITY,
    };
    for (c, case) in spread.golden.iter().enumerate() {
        let logits = teacher_forced(&mut sess, case);
        compare(case, &logits, &report_rule, &mut st);
        ours_probs.push(logits.iter().map(|l| softmax(l)).collect::<Vec<_>>());
        let h = spread.horizon[c];
        let mut ours = Vec::new();
        if h > 0 {
            let mut l = sess.prefill(&case.prompt).expect("prefill");
            loop {
                let t = argmax(&l);
                ours.push(t);
                if ours.len() == h {
                    break;
                }
                l = sess.forward(&[t]).expect("decode");
            }
        }
        ours_tokens.push(ours);
    }
    report(gguf, &st);
    let failures = spread.judge("cpu", |c, i, id| ours_probs[c][i][id as usize], &ours_tokens);
    assert!(failures.is_empty(), "{golden_name}:\n{}", failures.join("\n"));
    // What the rule lets through around today's run: our own deviation, each prompt moved by
    // a different multiple. A run twice as far as ours, prompt by prompt, must fail.
    let (passes, fails) = spread.reach("cpu", |c, i, id| ours_probs[c][i][id as usize], &ours_tokens);
    println!("[spread] {golden_name}: passes at {passes:.2}x today's deviation, fails from {fails:?}x");
    assert!(
        fails.is_some_and(|k| k <= 2.0),
        "{golden_name}: the spread rule lets a run {passes:.2}x as far from the goldens as today's pass"
    );
}

/// The spread rule can fail: a run exactly as far from the goldens as llama.cpp's other
/// attention path passes, one twice as far (every step, or each prompt by its own multiple of
/// up to twice) fails, as does one missing more.
#[test]
fn spread_rule_catches_a_run_twice_as_far() {
    for name in ["qwen2.5-coder-0.5b", "gemma-3-270m"] {
        let s = Spread::load(name);
        let s = &s;
        let scaled = |k: f64| {
            move |c: usize, i: usize, id: u32| {
                let g = s.golden[c].top[i][0].1;
                let fa = s.fa[c].top[i].iter().find(|t| t.0 == id).map_or(0.0, |t| t.1);
                g + k * (fa - g)
            }
        };
        let golden_tokens: Vec<Vec<u32>> = s.golden.iter().map(|g| g.tokens.clone()).collect();
        assert!(s.judge("as far", scaled(1.0), &golden_tokens).is_empty(), "{name}");
        // Each prompt moved by its own multiple (a uniform scale gives the bootstrap no
        // width): llama.cpp's own deviation passes, twice it fails.
        let (passes, fails) = s.reach(name, scaled(1.0), &golden_tokens);
        assert!(
            passes >= 1.0 && fails.is_some_and(|k| k <= 2.0),
            "{name}: passes {passes}, fails {fails:?}"
        );
        let failures = s.judge("twice as far", scaled(2.0), &golden_tokens);
        assert!(
            failures.iter().any(|f| f.contains("quantile 0.5")),
            "{name}: {failures:?}"
        );
        // Every greedy run parting at once: 12 misses beyond llama.cpp's + 2.
        let wrong: Vec<Vec<u32>> = s.golden.iter().map(|g| vec![u32::MAX; g.tokens.len()]).collect();
        let failures = s.judge("parting", scaled(1.0), &wrong);
        assert!(failures.iter().any(|f| f.contains("misses")), "{name}: {failures:?}");
    }
}

/// Both real models with a q8_0 cache, against llama.cpp's q8_0-cache runs of the goldens'
/// prompts (`scripts/kv-cache-goldens.py`), within the spread of its two f16 attention paths.
#[test]
fn real_models_with_q8_0_cache_within_llama_cpp_spread() {
    check_real_model_with(
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "qwen2.5-coder-0.5b",
        KvType::Q8_0,
    );
    check_real_model_with("gemma-3-270m-q4_k_m.gguf", "gemma-3-270m", KvType::Q8_0);
}

#[test]
fn qwen25_coder_within_llama_cpp_spread() {
    check_real_model("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "qwen2.5-coder-0.5b");
}

/// Gemma-3-270m is where the rule matters: it amplifies rounding-level differences about
/// tenfold per layer (compared tensor by tensor with llama.cpp: 1e-7 after the first matmuls,
/// 1e-3 by layer 1, 1e-2 by layer 3), through the f16 KV cache, f16 probabilities, the f16
/// GELU table and the Q8 activations, and llama.cpp moves as much by itself:
/// `scripts/llama-spread.py` reproduces these goldens with llama.cpp, then decodes the prompt
/// in one piece instead of the golden server's two: top-1 |dp| up to 0.31 from its own
/// goldens, the argmax flipped at a 0.236 gap.
#[test]
fn gemma3_270m_within_llama_cpp_spread() {
    check_real_model("gemma-3-270m-q4_k_m.gguf", "gemma-3-270m");
}

/// Results must not depend on the thread count or on how the prompt is chunked, with either
/// KV cache.
#[test]
fn logits_do_not_depend_on_threads_or_chunking() {
    let path = common::golden("fixtures/gemma3.Q4_K_M.gguf");
    let case = &load_cases(&common::golden("fixtures/gemma3.Q4_K_M.golden.jsonl"))[1];
    let one = load_model(&path, 1);
    let three = load_model(&path, 3);
    for (cache_type, _) in KvType::ALL {
        let run = |m: &Arc<Model<CpuBackend>>, n_batch: usize| {
            let mut s = Session::new(
                Arc::clone(m),
                SessionConfig {
                    n_ctx: 512,
                    n_batch,
                    n_logit_rows: 5,
                    cache_type,
                },
            )
            .unwrap();
            s.forward_all(&case.prompt).unwrap()
        };
        let reference = run(&one, 512);
        assert_eq!(reference.len(), case.prompt.len() * one.info().n_vocab);
        assert!(reference == run(&three, 512), "{cache_type}: 3 threads differ from 1");
        assert!(
            reference == run(&three, 7),
            "{cache_type}: chunks of 7 differ from one chunk"
        );
    }
}

/// Prefix reuse computes only the new part and gives the same logits as a fresh run.
#[test]
fn prefix_reuse_matches_fresh_evaluation() {
    let model = load_model(&common::golden("fixtures/qwen3.Q8_0.gguf"), 0);
    let case = &load_cases(&common::golden("fixtures/qwen3.Q8_0.golden.jsonl"))[1];
    let mut fresh = session(&model, 512);
    let expected = fresh.forward(&case.prompt).unwrap();

    let mut s = session(&model, 512);
    s.forward(&case.prompt[..100]).unwrap();
    s.forward(&[7, 8, 9]).unwrap(); // diverging tail to be dropped
    assert_eq!(s.common_prefix(&case.prompt), 100);
    assert_eq!(s.reuse_prefix(&case.prompt).unwrap(), 100);
    assert_eq!(s.pos(), 100);
    assert_eq!(s.forward(&case.prompt[100..]).unwrap(), expected);

    // A prompt equal to the cache recomputes only its last token.
    assert_eq!(s.reuse_prefix(&case.prompt).unwrap(), case.prompt.len() - 1);
    assert_eq!(s.prefill(&case.prompt).unwrap(), expected);
    s.reset();
    assert_eq!(s.pos(), 0);
}

#[test]
fn context_overflow_and_bad_tokens_are_errors() {
    let model = load_model(&common::golden("fixtures/llama.Q8_0.gguf"), 1);
    let mut s = session(&model, 16);
    assert_eq!(s.n_ctx(), 16);
    let err = s.forward(&[1; 17]).unwrap_err();
    assert!(
        matches!(err, EngineError::ContextOverflow { needed: 17, n_ctx: 16 }),
        "{err}"
    );
    assert!(
        err.to_string().contains("17") && err.to_string().contains("16"),
        "{err}"
    );
    s.forward(&[1; 10]).unwrap();
    assert!(matches!(
        s.forward(&[1; 7]).unwrap_err(),
        EngineError::ContextOverflow { needed: 17, n_ctx: 16 }
    ));
    assert_eq!(s.pos(), 10, "a failed call keeps the cached tokens");
    let err = s.forward(&[384]).unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::TokenOutOfRange {
                token: 384,
                n_vocab: 384
            }
        ),
        "{err}"
    );
    assert!(matches!(s.forward(&[]).unwrap_err(), EngineError::EmptyInput));
    // The context is capped by the model's trained length.
    let big = Session::new(
        Arc::clone(&model),
        SessionConfig {
            n_ctx: 1 << 20,
            ..SessionConfig::default()
        },
    )
    .unwrap();
    assert_eq!(big.n_ctx(), model.info().context_length);
}

/// The detected kernels (AVX2/VNNI where the CPU has them) and the portable set (what every
/// other target, wasm32 included, runs) agree with the scalar `vec_dot` oracle on every matrix
/// of the fixtures (all quant types present there), for a batch and for a single row.
#[test]
fn cpu_kernels_match_vec_dot_oracle() {
    use tinyllm::backend::cpu::kernels::Kernels;
    use tinyllm::backend::Backend;
    let oracle = CpuBackend::with_kernels(2, Kernels::oracle()).unwrap();
    let sets = [Kernels::detect(), Kernels::portable()];
    for kernels in sets {
        let be = CpuBackend::with_kernels(2, kernels).unwrap();
        let mut checked = 0;
        for name in [
            "llama.F16",
            "llama.Q8_0",
            "llama.Q4_K_M",
            "llama.Q4_0",
            "llama.Q5_0",
            "llama.Q6_K",
            "llama.IQ4_XS",
            "deepseek2.Q8_0",
            "deepseek2.Q4_K_M",
            "gpt-oss.Q4_K_M",
        ] {
            let file = Arc::new(GgufFile::open(common::golden(&format!("fixtures/{name}.gguf"))).unwrap());
            // Stacked expert and per-head matrices too, as one tall matrix (biases of any rank
            // are held as values, not matrices).
            for info in file
                .tensors()
                .iter()
                .filter(|t| t.shape.len() >= 2 && !t.name.ends_with(".bias"))
            {
                let k = info.shape[0] as usize;
                let n = info.shape[1..].iter().product::<u64>() as usize;
                for rows in [1usize, 3, 4, 9, 23] {
                    let x: Vec<f32> = (0..rows * k).map(|i| 0.1 + 2.0 * ((i as f32) * 0.37).cos()).collect();
                    let mut results = Vec::new();
                    for be in [&be, &oracle] {
                        let w = be.load_weight(&file, &info.name).unwrap();
                        let mut xb = be.alloc(rows * k).unwrap();
                        be.write(&mut xb, &x).unwrap();
                        let mut out = be.alloc(rows * n).unwrap();
                        be.matmul(&w, &xb, rows, &mut out).unwrap();
                        results.push(be.read(&out, rows * n).unwrap().wait().unwrap());
                    }
                    let scale = results[1].iter().fold(0f32, |a, v| a.max(v.abs())).max(1e-6);
                    for (i, (a, b)) in results[0].iter().zip(&results[1]).enumerate() {
                        assert!(
                            (a - b).abs() <= 1e-5 * scale,
                            "{} kernels, {name} {} ({}) rows {rows} [{i}]: {a} vs oracle {b}",
                            kernels.variant,
                            info.name,
                            info.ty
                        );
                    }
                    checked += 1;
                }
            }
        }
        println!(
            "[golden] {} kernels: {checked} matrices equal the oracle",
            kernels.variant
        );
        assert!(checked > 50, "{}: only {checked} matrices", kernels.variant);
    }
}

/// A tiny llama-shaped GGUF (F32 tensors) with one tensor's shape and the architecture
/// overridable, for the configuration checks.
fn tiny_gguf(arch: &str, n_head_kv: u32, k_rows: u64) -> GgufFile {
    GgufFile::from_bytes(tiny_writer(arch, n_head_kv, k_rows).finish()).expect("valid gguf")
}

/// [`tiny_gguf`]'s writer, for adding keys.
fn tiny_writer(arch: &str, n_head_kv: u32, k_rows: u64) -> common::GgufWriter {
    let mut w = common::GgufWriter::new();
    w.kv_str("general.architecture", arch);
    for (k, v) in [
        ("context_length", 64),
        ("embedding_length", 32),
        ("block_count", 1),
        ("feed_forward_length", 64),
        ("attention.head_count", 4),
        ("attention.head_count_kv", n_head_kv),
    ] {
        w.kv_u32(&format!("{arch}.{k}"), v);
    }
    let (e, kv) = (32u64, 32 / 4 * u64::from(n_head_kv.max(1)));
    for (name, shape) in [
        ("token_embd.weight", vec![e, 16]),
        ("output_norm.weight", vec![e]),
        ("blk.0.attn_norm.weight", vec![e]),
        ("blk.0.attn_q.weight", vec![e, e]),
        ("blk.0.attn_k.weight", vec![e, k_rows]),
        ("blk.0.attn_v.weight", vec![e, kv]),
        ("blk.0.attn_output.weight", vec![e, e]),
        ("blk.0.ffn_norm.weight", vec![e]),
        ("blk.0.ffn_gate.weight", vec![e, 64]),
        ("blk.0.ffn_up.weight", vec![e, 64]),
        ("blk.0.ffn_down.weight", vec![64, e]),
    ] {
        let bytes = shape.iter().product::<u64>() * 4;
        w.tensor(name, &shape, 0, bytes);
    }
    w
}

#[test]
fn hyper_parameters_are_read_and_validated() {
    use tinyllm::model::llama::Hparams;
    use tinyllm::model::ModelError;
    let h = Hparams::read(&tiny_gguf("llama", 2, 16), "llama").unwrap();
    assert_eq!(
        (
            h.common.n_embd,
            h.heads.n_head,
            h.heads.n_head_kv,
            h.heads.head_dim_k,
            h.common.n_vocab
        ),
        (32, 4, 2, 8, 16)
    );
    assert_eq!(h.heads.head_dim_v, 8);
    assert_eq!(h.rope.kind, tinyllm::backend::RopeKind::Norm);
    // The same weights run as a tiny model (tied output: no output.weight).
    let load = |f: GgufFile| Model::load(CpuBackend::new(1).unwrap(), Arc::new(f));
    let model = Arc::new(load(tiny_gguf("llama", 2, 16)).unwrap());
    assert_eq!(model.info().family, "llama");
    let logits = session(&model, 8).forward(&[1, 2, 3]).unwrap();
    assert_eq!(logits.len(), 16);
    assert!(logits.iter().all(|v| v.is_finite()));

    let err = load(tiny_gguf("mamba", 2, 16)).unwrap_err();
    assert!(matches!(err, ModelError::UnsupportedArch { .. }), "{err}");
    assert!(
        err.to_string().contains("mamba") && err.to_string().contains("qwen3"),
        "{err}"
    );

    let err = load(tiny_gguf("llama", 2, 24)).unwrap_err();
    assert!(matches!(err, ModelError::TensorShape { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("blk.0.attn_k.weight") && msg.contains("[32, 16]") && msg.contains("[32, 24]"),
        "{msg}"
    );

    let err = load(tiny_gguf("qwen2", 3, 24)).unwrap_err();
    assert!(
        err.to_string().contains("head_count_kv") && err.to_string().contains("does not divide"),
        "{err}"
    );

    // YaRN scaling is read (it used to be refused), an unknown scaling names its key.
    let mut w = tiny_writer("llama", 2, 16);
    w.kv_str("llama.rope.scaling.type", "yarn");
    w.kv_f32("llama.rope.scaling.factor", 4.0);
    w.kv_u32("llama.rope.scaling.original_context_length", 16);
    let h = Hparams::read(&GgufFile::from_bytes(w.finish()).unwrap(), "llama").unwrap();
    let tinyllm::backend::RopeScaling::Yarn(y) = h.rope.scaling else {
        panic!("{:?}", h.rope.scaling)
    };
    assert_eq!((y.factor, y.n_ctx_orig, y.ext_factor), (4.0, 16, 1.0));
    // llama.cpp's magnitude: 1 + 0.1 ln(4), cancelled by rope's own factor, so 1.
    assert!((y.attn_factor - 1.0).abs() < 1e-6, "{y:?}");
    let mut w = tiny_writer("llama", 2, 16);
    w.kv_str("llama.rope.scaling.type", "longrope");
    let err = Hparams::read(&GgufFile::from_bytes(w.finish()).unwrap(), "llama").unwrap_err();
    assert!(
        err.to_string().contains("rope.scaling.type") && err.to_string().contains("longrope"),
        "{err}"
    );

    // A q8_0 cache needs heads of whole blocks of 32 (these have 8 values): a clear error
    // naming the cache type, no fallback.
    let err = model.new_state(8, KvType::Q8_0).unwrap_err();
    assert!(matches!(err, ModelError::CacheType { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("q8_0") && msg.contains("heads of 8 values"), "{msg}");
    assert!(model.new_state(8, KvType::F16).is_ok());

    // V heads wider or narrower than K heads are a model llama can run.
    let mut w = tiny_writer("llama", 2, 16);
    w.kv_u32("llama.attention.value_length", 4);
    let h = Hparams::read(&GgufFile::from_bytes(w.finish()).unwrap(), "llama").unwrap();
    assert_eq!((h.heads.head_dim_k, h.heads.head_dim_v), (8, 4));
}

/// Greedy decoding through the backend's argmax picks the token the sampler's argmax picks
/// from the logits, step by step over a fixture's golden continuation.
#[test]
fn backend_argmax_equals_argmax_of_logits() {
    for arch in ["llama", "gemma3"] {
        let path = common::golden(&format!("fixtures/{arch}.Q4_K_M.gguf"));
        let model = load_model(&path, 2);
        let (mut a, mut b) = (session(&model, 512), session(&model, 512));
        for case in load_cases(&common::golden(&format!("fixtures/{arch}.Q4_K_M.golden.jsonl"))) {
            a.reset();
            b.reset();
            let mut input = case.prompt.clone();
            for &next in &case.tokens {
                let id = a.forward_argmax(&input).expect("forward_argmax");
                let want = tinyllm::sample::argmax(&b.forward(&input).expect("forward"));
                assert_eq!(id, want, "{arch} {} at position {}", case.name, a.pos());
                input = vec![next];
            }
        }
    }
}

/// The free-running check can fail: a golden run whose first clear token is changed is a miss.
#[test]
fn greedy_check_catches_a_wrong_token() {
    let dir = common::golden("fixtures");
    let model = load_model(&dir.join("qwen3moe.Q8_0.gguf"), 1);
    let mut sess = session(&model, 512);
    let mut cases = load_cases(&dir.join("qwen3moe.Q8_0.golden.jsonl"));
    let case = cases
        .iter_mut()
        .find(|c| c.top[0][0].1 - c.top[0][1].1 > 0.05)
        .expect("a case with a clear first step");
    assert_eq!(greedy_miss(&mut sess, case, 0.03), None);
    case.tokens[0] = case.top[0][1].0;
    assert!(greedy_miss(&mut sess, case, 0.03).is_some());
}

/// MLA's cache holds one latent row per token and layer, `kv_lora_rank + rope` values (the
/// deepseek2 fixture: 128 + 32), not full K and V heads.
#[test]
fn mla_cache_holds_the_latent_only() {
    use tinyllm::model::KvCache;
    let model = load_model(&common::golden("fixtures/deepseek2.Q8_0.gguf"), 1);
    let state = model.new_state(64, tinyllm::backend::KvType::F16).unwrap();
    let kv = state.get::<KvCache<CpuBackend>>().expect("a positional cache");
    let per_layer = 128 + 32;
    assert_eq!(kv.values_per_token(), 2 * per_layer);
    assert_eq!(kv.bytes_per_token(), 2 * 2 * per_layer);
    // The same latent in Q8_0 blocks: 34 bytes per 32 values.
    let q8 = model.new_state(64, KvType::Q8_0).unwrap();
    let q8 = q8.get::<KvCache<CpuBackend>>().expect("a positional cache");
    assert_eq!(
        (q8.kv_type(), q8.bytes_per_token()),
        (KvType::Q8_0, 2 * per_layer / 32 * 34)
    );
    println!(
        "[mla] deepseek2 fixture: {} f16 values = {} bytes per token (full K+V heads would be {})",
        kv.values_per_token(),
        2 * kv.values_per_token(),
        2 * 2 * 4 * (96 + 64)
    );
}
