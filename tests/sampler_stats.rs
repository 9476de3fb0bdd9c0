//! Statistical and exact checks of the sampler chain against llama.cpp's definitions.
//! Every random input uses a fixed seed, so the results are deterministic.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tinyllm::sample::{apply_penalties, argmax, log_softmax_top_k, Sampler, SamplerConfig, SamplerError};

/// Only the named stages on: temperature `t`, everything else off.
fn plain(t: f32) -> SamplerConfig {
    SamplerConfig {
        temperature: t,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        ..SamplerConfig::default()
    }
}

fn random_logits(rng: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-scale..scale)).collect()
}

/// softmax(logits / t) in f64, written independently of the library.
fn softmax(logits: &[f32], t: f64) -> Vec<f64> {
    let max = logits
        .iter()
        .map(|&l| f64::from(l) / t)
        .fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = logits.iter().map(|&l| (f64::from(l) / t - max).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|x| x / s).collect()
}

/// Upper 0.001 critical values of the chi-square distribution (standard tables), by degrees
/// of freedom.
fn chi2_critical_p001(df: usize) -> f64 {
    match df {
        1 => 10.828,
        2 => 13.816,
        3 => 16.266,
        4 => 18.467,
        5 => 20.515,
        6 => 22.458,
        7 => 24.322,
        _ => panic!("no table entry for df={df}"),
    }
}

fn chi2(counts: &[u64], probs: &[f64], draws: u64) -> f64 {
    counts
        .iter()
        .zip(probs)
        .map(|(&o, &p)| {
            let e = p * draws as f64;
            (o as f64 - e).powi(2) / e
        })
        .sum()
}

fn histogram(sampler: &mut Sampler, logits: &[f32], draws: u64) -> Vec<u64> {
    let mut counts = vec![0u64; logits.len()];
    for _ in 0..draws {
        counts[sampler.sample(logits, &[]) as usize] += 1;
    }
    counts
}

#[test]
fn frequencies_match_softmax_with_temperature() {
    let logits = [0.0f32, 1.0, 2.0, -1.0, 0.5, 1.5];
    let t = 0.7;
    let mut s = Sampler::new(SamplerConfig { seed: 7, ..plain(t) }).unwrap();
    let draws = 20_000;
    let counts = histogram(&mut s, &logits, draws);
    let expected = softmax(&logits, f64::from(t));
    let stat = chi2(&counts, &expected, draws);
    let crit = chi2_critical_p001(logits.len() - 1);
    assert!(
        stat < crit,
        "chi2 {stat:.2} >= {crit} (counts {counts:?}, expected {expected:?})"
    );
    // The same counts against the untempered softmax must be rejected: the test has power.
    let wrong = softmax(&logits, 1.0);
    assert!(chi2(&counts, &wrong, draws) > crit, "temperature had no visible effect");
}

#[test]
fn frequencies_after_top_k_are_renormalized() {
    let logits = [0.3f32, 1.2, -0.4, 0.9, 0.0, 1.0];
    let mut s = Sampler::new(SamplerConfig {
        top_k: 3,
        seed: 11,
        ..plain(1.0)
    })
    .unwrap();
    let draws = 20_000;
    let counts = histogram(&mut s, &logits, draws);
    // Top 3 are ids 1, 5, 3; the rest must never appear.
    for id in [0, 2, 4] {
        assert_eq!(counts[id], 0, "id {id} is outside the top 3");
    }
    let kept = [logits[1], logits[5], logits[3]];
    let stat = chi2(&[counts[1], counts[5], counts[3]], &softmax(&kept, 1.0), draws);
    assert!(stat < chi2_critical_p001(2), "chi2 {stat:.2}");
}

#[test]
fn top_k_never_leaves_the_top_k() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let logits = random_logits(&mut rng, 5000, 2.0);
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    let top: std::collections::HashSet<u32> = order[..8].iter().map(|&i| i as u32).collect();
    let mut s = Sampler::new(SamplerConfig {
        top_k: 8,
        seed: 3,
        ..plain(5.0)
    })
    .unwrap();
    let mut seen = std::collections::HashSet::new();
    for _ in 0..5000 {
        let id = s.sample(&logits, &[]);
        assert!(top.contains(&id), "{id} is not in the top 8");
        seen.insert(id);
    }
    assert_eq!(seen.len(), 8, "a high temperature should reach all 8 survivors");
}

#[test]
fn zero_temperature_is_argmax_with_lowest_id_on_ties() {
    let mut s = Sampler::new(SamplerConfig::greedy()).unwrap();
    assert_eq!(s.sample(&[1.0, 3.0, 3.0, 2.0], &[]), 1);
    assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
    let mut s0 = Sampler::new(plain(0.0)).unwrap();
    assert_eq!(s0.sample(&[5.0, 5.0], &[]), 0);

    // Near-zero temperature on distinct logits behaves like argmax too.
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let mut cold = Sampler::new(SamplerConfig { seed: 5, ..plain(1e-4) }).unwrap();
    for _ in 0..200 {
        let logits = random_logits(&mut rng, 1000, 10.0);
        let best = logits.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0 as u32;
        assert_eq!(s.sample(&logits, &[]), best);
        assert_eq!(argmax(&logits), best);
        // Greedy sampling skips the candidate chain; `distribution` still runs it.
        let mut odd = logits.clone();
        odd[rng.random_range(0..1000)] = f32::NAN;
        odd[rng.random_range(0..1000)] = f32::NEG_INFINITY;
        let (a, b) = (rng.random_range(0..1000), rng.random_range(0..1000));
        odd[a] = 20.0;
        odd[b] = 20.0;
        assert_eq!(s.sample(&odd, &[]), s.distribution(&odd, &[])[0].0);
        assert_eq!(s.sample(&odd, &[]), a.min(b) as u32);
        // At T = 1e-4 a runner-up 0.01 behind has probability below e^-100.
        let runner_up = logits
            .iter()
            .enumerate()
            .filter(|&(i, _)| i as u32 != best)
            .map(|(_, &l)| l)
            .fold(f32::MIN, f32::max);
        if logits[best as usize] - runner_up > 0.01 {
            assert_eq!(cold.sample(&logits, &[]), best);
        }
    }
}

/// The smallest most-likely prefix whose probability reaches `p`, by a full sort.
fn nucleus(logits: &[f32], p: f64) -> Vec<u32> {
    let probs = softmax(logits, 1.0);
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
    let mut cum = 0.0;
    let mut kept = Vec::new();
    for i in order {
        kept.push(i as u32);
        cum += probs[i];
        if cum >= p {
            break;
        }
    }
    kept
}

#[test]
fn top_p_keeps_the_smallest_prefix_reaching_p() {
    // Probabilities 0.4, 0.3, 0.2, 0.1.
    let logits: Vec<f32> = [0.4f32, 0.3, 0.2, 0.1].iter().map(|p| p.ln()).collect();
    for (p, expect) in [
        (0.35, vec![0]),
        (0.65, vec![0, 1]),
        (0.75, vec![0, 1, 2]),
        (0.95, vec![0, 1, 2, 3]),
    ] {
        let mut s = Sampler::new(SamplerConfig { top_p: p, ..plain(1.0) }).unwrap();
        let ids: Vec<u32> = s.distribution(&logits, &[]).iter().map(|x| x.0).collect();
        assert_eq!(ids, expect, "top_p {p}");
    }

    // A vocabulary-sized case exercises the partial selection (nucleus far above 256 tokens).
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let logits = random_logits(&mut rng, 20_000, 3.0);
    for p in [0.5f32, 0.9] {
        let mut s = Sampler::new(SamplerConfig {
            top_p: p,
            seed: 9,
            ..plain(1.0)
        })
        .unwrap();
        let dist = s.distribution(&logits, &[]);
        let got: Vec<u32> = dist.iter().map(|x| x.0).collect();
        let want = nucleus(&logits, f64::from(p));
        assert!(
            want.len() > 1000,
            "nucleus of {} tokens is too small to test selection",
            want.len()
        );
        assert_eq!(got, want, "top_p {p}");
        // Renormalized probabilities: p_i / kept mass.
        let probs = softmax(&logits, 1.0);
        let mass: f64 = want.iter().map(|&i| probs[i as usize]).sum();
        for &(id, q) in dist.iter().take(20) {
            assert!((f64::from(q) - probs[id as usize] / mass).abs() < 1e-6);
        }
        let allowed: std::collections::HashSet<u32> = want.into_iter().collect();
        for _ in 0..300 {
            assert!(allowed.contains(&s.sample(&logits, &[])));
        }
    }
}

#[test]
fn min_p_drops_tokens_below_the_fraction_of_the_best() {
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let logits = random_logits(&mut rng, 3000, 4.0);
    let probs = softmax(&logits, 1.0);
    let pmax = probs.iter().cloned().fold(0.0, f64::max);
    for min_p in [0.05f32, 0.3] {
        let mut s = Sampler::new(SamplerConfig {
            min_p,
            seed: 2,
            ..plain(1.0)
        })
        .unwrap();
        let mut got: Vec<u32> = s.distribution(&logits, &[]).iter().map(|x| x.0).collect();
        got.sort_unstable();
        let want: Vec<u32> = (0..logits.len() as u32)
            .filter(|&i| probs[i as usize] >= f64::from(min_p) * pmax)
            .collect();
        assert!(want.len() > 1 && want.len() < logits.len());
        assert_eq!(got, want, "min_p {min_p}");
    }
}

#[test]
fn penalties_follow_llama_cpp() {
    let cfg = SamplerConfig {
        repeat_penalty: 1.5,
        frequency_penalty: 0.25,
        presence_penalty: 0.5,
        repeat_last_n: 5,
        ..SamplerConfig::greedy()
    };
    let original = [2.0f32, -1.0, 0.0, 3.0, 1.0, 0.7];
    let mut logits = original.to_vec();
    // The window is the last 5: [1, 2, 4, 1, 1]; ids 0 and 3 fall outside it.
    let history = [0, 3, 1, 2, 4, 1, 1];
    apply_penalties(&cfg, &mut logits, &history);
    let expected = [
        original[0],                            // outside the window
        original[1] * 1.5 - (3.0 * 0.25 + 0.5), // negative: multiplied; seen 3 times
        original[2] * 1.5 - (0.25 + 0.5),       // zero counts as non-positive
        original[3],                            // outside the window
        original[4] / 1.5 - (0.25 + 0.5),       // positive: divided
        original[5],                            // never seen
    ];
    for (i, (g, e)) in logits.iter().zip(expected).enumerate() {
        assert!((g - e).abs() < 1e-6, "id {i}: {g} != {e}");
    }

    // Through the sampler: the repeated favourite loses to the runner-up.
    let logits = [1.0f32, 4.0, 3.0];
    let mut s = Sampler::new(SamplerConfig {
        repeat_penalty: 2.0,
        repeat_last_n: 8,
        ..SamplerConfig::greedy()
    })
    .unwrap();
    assert_eq!(s.sample(&logits, &[1]), 2);
    let mut off = Sampler::new(SamplerConfig {
        repeat_penalty: 2.0,
        repeat_last_n: 0,
        ..SamplerConfig::greedy()
    })
    .unwrap();
    assert_eq!(off.sample(&logits, &[1]), 1, "repeat_last_n 0 disables penalties");
}

#[test]
fn same_seed_same_draws_different_seed_different_draws() {
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let logits = random_logits(&mut rng, 1000, 1.0);
    let run = |seed: u64| {
        let mut s = Sampler::new(SamplerConfig {
            seed,
            ..SamplerConfig::default()
        })
        .unwrap();
        (0..300).map(|_| s.sample(&logits, &[])).collect::<Vec<u32>>()
    };
    assert_eq!(run(42), run(42));
    assert_ne!(run(42), run(43));

    let mut s = Sampler::new(SamplerConfig {
        seed: 42,
        ..SamplerConfig::default()
    })
    .unwrap();
    let first: Vec<u32> = (0..50).map(|_| s.sample(&logits, &[])).collect();
    s.reset();
    let again: Vec<u32> = (0..50).map(|_| s.sample(&logits, &[])).collect();
    assert_eq!(first, again, "reset restarts the RNG");
}

#[test]
fn invalid_settings_name_the_field_and_value() {
    let cases: [(SamplerConfig, &str, &str); 7] = [
        (
            SamplerConfig {
                temperature: -0.5,
                ..Default::default()
            },
            "temperature",
            "-0.5",
        ),
        (
            SamplerConfig {
                temperature: f32::NAN,
                ..Default::default()
            },
            "temperature",
            "NaN",
        ),
        (
            SamplerConfig {
                top_p: 0.0,
                ..Default::default()
            },
            "top_p",
            "0",
        ),
        (
            SamplerConfig {
                top_p: 1.5,
                ..Default::default()
            },
            "top_p",
            "1.5",
        ),
        (
            SamplerConfig {
                min_p: -0.1,
                ..Default::default()
            },
            "min_p",
            "-0.1",
        ),
        (
            SamplerConfig {
                repeat_penalty: 0.0,
                ..Default::default()
            },
            "repeat_penalty",
            "0",
        ),
        (
            SamplerConfig {
                frequency_penalty: f32::INFINITY,
                ..Default::default()
            },
            "frequency_penalty",
            "inf",
        ),
    ];
    for (cfg, field, value) in cases {
        let err = cfg.validate().unwrap_err();
        let SamplerError::Invalid { field: f, value: v, .. } = &err;
        assert_eq!((*f, v.as_str()), (field, value));
        let msg = err.to_string();
        assert!(msg.contains(field) && msg.contains(value), "{msg}");
        assert!(Sampler::new(cfg).is_err());
    }
    SamplerConfig::default().validate().unwrap();
    SamplerConfig::greedy().validate().unwrap();
}

#[test]
fn defaults_are_llama_cpp_defaults() {
    let d = SamplerConfig::default();
    assert_eq!((d.temperature, d.top_k, d.top_p, d.min_p), (0.8, 40, 0.95, 0.05));
    assert_eq!(
        (d.repeat_penalty, d.presence_penalty, d.frequency_penalty),
        (1.0, 0.0, 0.0)
    );
}

#[test]
fn nan_and_infinite_logits_do_not_panic() {
    for cfg in [SamplerConfig::default(), SamplerConfig::greedy(), plain(1.0)] {
        let mut s = Sampler::new(cfg).unwrap();
        for _ in 0..50 {
            assert_eq!(s.sample(&[f32::NAN, 1.0, f32::NAN], &[]), 1);
            assert_eq!(s.sample(&[f32::NEG_INFINITY, f32::INFINITY, 0.0], &[1]), 1);
        }
        assert_eq!(s.sample(&[f32::NAN, f32::NAN], &[]), 0);
        assert_eq!(s.sample(&[f32::NEG_INFINITY; 3], &[]), 0);
        assert_eq!(s.sample(&[], &[]), 0);
    }
    assert_eq!(argmax(&[f32::NAN, -1.0, f32::NAN]), 1);
}

#[test]
fn top_logprobs_are_the_full_log_softmax() {
    let logits = [1.0f32, 3.0, 3.0, -2.0, 0.5];
    let top = log_softmax_top_k(&logits, 3);
    let probs = softmax(&logits, 1.0);
    let ids: Vec<u32> = top.iter().map(|x| x.0).collect();
    assert_eq!(ids, vec![1, 2, 0], "most likely first, ties in id order");
    for (id, lp) in top {
        assert!((f64::from(lp) - probs[id as usize].ln()).abs() < 1e-6);
    }
    assert_eq!(log_softmax_top_k(&logits, 10).len(), 5);
    assert!(log_softmax_top_k(&[], 3).is_empty());
}

/// Drawing from a backend's candidates (the top k + m and the penalized tokens' logits, as
/// `Sampler::plan` asks) gives exactly the token drawn from the whole row, draw after draw,
/// with penalties, ties, NaN and infinities in the row.
#[test]
fn drawing_from_candidates_equals_drawing_from_the_row() {
    use tinyllm::sample::candidates;
    let mut rng = ChaCha8Rng::seed_from_u64(41);
    let configs = [
        SamplerConfig::default(),
        SamplerConfig {
            top_k: 5,
            top_p: 0.8,
            min_p: 0.0,
            temperature: 1.3,
            ..SamplerConfig::default()
        },
        SamplerConfig {
            top_k: 50,
            top_p: 1.0,
            min_p: 0.1,
            repeat_penalty: 1.3,
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            repeat_last_n: 16,
            ..SamplerConfig::default()
        },
        SamplerConfig {
            top_k: 3,
            temperature: 2.0,
            repeat_penalty: 0.7,
            repeat_last_n: 64,
            ..SamplerConfig::default()
        },
        SamplerConfig {
            repeat_penalty: 1.5,
            frequency_penalty: 0.5,
            repeat_last_n: 8,
            ..SamplerConfig::greedy()
        },
    ];
    let mut draws = 0;
    for (ci, cfg) in configs.iter().enumerate() {
        let mut whole = Sampler::new(cfg.clone()).unwrap();
        let mut sparse = Sampler::new(cfg.clone()).unwrap();
        let mut history: Vec<u32> = (0..40).map(|_| rng.random_range(0..600)).collect();
        let mut picks = std::collections::HashSet::new();
        for step in 0..300 {
            // Coarse values make ties; a few specials.
            let mut row: Vec<f32> = (0..500).map(|_| (rng.random_range(-40..40) as f32) / 8.0).collect();
            row[step % 500] = f32::NAN;
            row[(step * 7) % 500] = f32::NEG_INFINITY;
            if step % 50 == 0 {
                row[3] = f32::INFINITY;
            }
            let a = whole.sample(&row, &history);
            let plan = sparse.plan(&history).expect("top-k sampling has a plan");
            let c = candidates(&row, plan.k, &plan.gather);
            let b = sparse.sample_candidates(&c, &plan, &history);
            assert_eq!(a, b, "config {ci} step {step}");
            // More candidates than asked for (a batch asks for its rows' largest plan).
            let wider: Vec<u32> = plan.gather.iter().copied().chain([1, 2, 3]).collect();
            let c = candidates(&row, plan.k + 7, &wider);
            let wide_plan = tinyllm::sample::Plan {
                k: plan.k + 7,
                gather: wider,
            };
            let mut again = sparse.clone();
            let mut reference = whole.clone();
            assert_eq!(
                reference.sample(&row, &history),
                again.sample_candidates(&c, &wide_plan, &history),
                "config {ci} step {step}, wider candidates"
            );
            picks.insert(a);
            history.push(a);
            draws += 1;
        }
        assert!(picks.len() > 2, "config {ci}: the draws never varied");
    }
    println!("[sampler] {draws} draws from candidates equal to draws from the row");
}
