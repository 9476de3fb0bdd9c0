//! The GPU backends' golden checks, shared by `webgpu_golden.rs` and `vulkan_golden.rs`: the
//! rules of `tests/model_golden.rs` (fixtures: the golden README's tolerances; real models:
//! within llama.cpp's own spread) and agreement of greedy tokens with the CPU backend.

use tinyllm::backend::cpu::CpuBackend;
use tinyllm::backend::vulkan::VulkanBackend;
use tinyllm::backend::{Backend, KvType};
use tinyllm::engine::Session;

use super::generation::{
    argmax, fixture_clear_gap, fixture_golden, fixture_tolerance, greedy_miss, load_cases, load_on as load, session,
    session_with, softmax, teacher_forced, Case, Spread, REAL_TOL,
};

/// Deviations of one golden file.
#[derive(Default)]
pub struct Stats {
    pub steps: usize,
    pub max_top10: f64,
    pub max_top1: f64,
    pub top1: Vec<f64>,
    pub argmax_checked: usize,
    /// Steps beyond `tol` (checked on the top-10 or top-1 entries).
    pub beyond: Vec<(f64, String)>,
    pub argmax_failures: Vec<String>,
}

pub fn compare(case: &Case, logits: &[Vec<f32>], tol: f64, top1_only: bool, clear_gap: f64, st: &mut Stats) {
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

pub fn median(v: &[f64]) -> f64 {
    let mut d = v.to_vec();
    d.sort_by(f64::total_cmp);
    d.get(d.len() / 2).copied().unwrap_or(0.0)
}

/// The GPU backends' bound on olmoe's Q4_K_M fixture over a q8_0 cache, above the weights'
/// 5e-2 that the CPU meets there (3.8e-3 with its SIMD kernels, 1.1e-2 portable). Measured
/// (#32): one step of all, long_150 step 7, is 6.25e-2 from llama.cpp's q8_0-cache golden, and
/// there llama.cpp itself jumps by 7.35e-2 between its f16 and q8_0 caches (its top two swap:
/// 0.241/0.186 against 0.168/0.237) while its neighbouring steps move by under 7e-3: in a
/// one-layer top-2-of-8 MoE, a route flipped by the cache's rounding. The GPU's matmuls (the
/// CPU's Q8_K activations, summed in another order) land on the f16 side of that flip (0.230). So llama.cpp's own spread on that file, 7.5e-2, and the argmax checked only above
/// a 0.1 gap there, as on the quantized deepseek2 fixtures.
const OLMOE_Q4_K_M_Q8_0_GPU: (f64, f64) = (7.5e-2, 0.1);

/// (|Δp| tolerance, clear argmax gap) of fixture `arch.q` with a cache of format `cache` on a
/// GPU backend: the CPU's rule, except [`OLMOE_Q4_K_M_Q8_0_GPU`].
fn gpu_rule(arch: &str, q: &str, cache: KvType) -> (f64, f64) {
    let rule = (fixture_tolerance(arch, q), fixture_clear_gap(arch, q));
    if (arch, q, cache) == ("olmoe", "Q4_K_M", KvType::Q8_0) {
        (rule.0.max(OLMOE_Q4_K_M_Q8_0_GPU.0), rule.1.max(OLMOE_Q4_K_M_Q8_0_GPU.1))
    } else {
        rule
    }
}

/// Every golden file of `arch` in `quants` on backend `g` (named `label` in messages) with a KV
/// cache of format `cache`: teacher-forced top-10 probabilities within the fixture's tolerance
/// of llama.cpp's goldens for that cache format (`common::generation::fixture_tolerance`, the
/// CPU's rule) and free-running greedy tokens equal to llama.cpp's up to its first near-tie.
pub fn check_fixtures_with<B: Backend + Clone>(label: &str, g: B, arch: &str, quants: &[&str], cache: KvType) {
    let mut failed = Vec::new();
    for q in quants {
        let file = format!("{arch}.{q}");
        let dir = super::golden("fixtures");
        let model = load(g.clone(), &dir.join(format!("{file}.gguf")));
        let mut sess = session_with(&model, 512, cache);
        let mut st = Stats::default();
        let (tol, gap) = gpu_rule(arch, q, cache);
        let name = if cache == KvType::F16 {
            file.clone()
        } else {
            format!("{file} {cache} cache")
        };
        for case in load_cases(&dir.join(fixture_golden(&file, cache))) {
            let logits = teacher_forced(&mut sess, &case);
            compare(&case, &logits, tol, false, gap, &mut st);
            // Free-running greedy tokens equal llama.cpp's up to its first near-tie.
            st.argmax_failures.extend(greedy_miss(&mut sess, &case, gap));
        }
        println!(
            "[{label} golden] {name}: {} steps, max|dp| top10 {:.2e}, top1 {:.2e}, argmax checked {}, {} beyond {tol:.3}, {} argmax failures",
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

/// Greedy tokens of `model` for `case`'s prompt, `n` of them, each with the margin of its
/// pick (top-1 minus top-2 probability).
pub fn greedy<B: Backend>(sess: &mut Session<B>, case: &Case, n: usize) -> Vec<(u32, f64)> {
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
pub fn real_divergence(a: &[(u32, f64)], b: &[(u32, f64)], tie: f64) -> Option<usize> {
    let d = a.iter().zip(b).position(|(x, y)| x.0 != y.0)?;
    (a[d].1 >= tie && b[d].1 >= tie).then_some(d)
}

/// A real model on backend `g` (named `label`) held to the CPU backend's rule (docs/design.md: within llama.cpp's own
/// spread, [`Spread::judge`]) over teacher forcing on every golden prompt and greedy runs up to
/// the first golden near-tie; and its greedy tokens equal to the CPU backend's, or parting only
/// where one of the two backends itself sees a near-tie (its top-2 within the golden
/// tolerance: the CPU's activation quantization may decide such a tie either way).
pub fn check_real<B: Backend>(label: &str, g: B, gguf: &str, golden_name: &str) {
    let path = super::real_model(gguf);
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
                "{} step {d}: {label} {:?} vs cpu {:?}",
                case.name,
                ids(&ours),
                ids(&theirs)
            ));
        } else {
            notes.push(format!(
                "{}: {label} {:?} vs cpu {:?} (parted at a near-tie of a backend)",
                case.name,
                ids(&ours),
                ids(&theirs)
            ));
        }
        tokens.push(ids(&ours));
    }
    println!(
        "[{label} golden] {gguf}: {} steps, top1 |dp| max {:.3} median {:.1e}, greedy equal to cpu on {greedy_same}/{} prompts",
        st.steps,
        st.max_top1,
        median(&st.top1),
        spread.golden.len()
    );
    for n in &notes {
        println!("[{label} golden]   greedy differs: {n}");
    }
    let mut failures = spread.judge(label, |c, i, id| probs[c][i][id as usize], &tokens);
    failures.extend(
        greedy_wrong
            .into_iter()
            .map(|w| format!("greedy parts from the cpu's: {w}")),
    );
    assert!(failures.is_empty(), "{golden_name}:\n{}", failures.join("\n"));
}

/// Dispatches of the kernels whose label starts with `prefix` in `vk`'s timestamp profile
/// (since `enable_profile`): which path a matmul took.
pub fn vulkan_calls(vk: &VulkanBackend, prefix: &str) -> u64 {
    vk.profile()
        .iter()
        .filter(|k| k.label.starts_with(prefix))
        .map(|k| k.calls)
        .sum()
}
