//! The one dispatch over the backends (`tinyllm::backend::AnyBackend`) forwards every
//! `Backend` method: checked from the sources, so a method added to the trait and left out of
//! the dispatch fails here even if a default body let it compile (the trait is meant to have
//! none, which is checked too). Then the dispatch is run: it reaches the CPU backend's batched
//! attention, the op the old CLI-side dispatch never forwarded.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use tinyllm::backend::{AnyBackend, Backend, BackendKind};

fn source(rel: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
}

/// The block of `text` that starts at the line beginning with `head` (to its matching brace).
fn block<'a>(text: &'a str, head: &str) -> &'a str {
    let start = text.find(head).unwrap_or_else(|| panic!("no `{head}`"));
    let mut depth = 0;
    for (i, c) in text[start..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return &text[start..start + i + 1];
                }
            }
            _ => {}
        }
    }
    panic!("unbalanced `{head}`")
}

/// Names of the `fn`s declared at the top level of a trait or impl block, with whether each
/// has a body (`{` before `;`).
fn fns(block: &str) -> Vec<(String, bool)> {
    let body = &block[block.find('{').expect("a block") + 1..];
    let mut out = Vec::new();
    let mut depth = 0;
    let mut rest = body;
    while !rest.is_empty() {
        let c = rest.chars().next().expect("not empty");
        if c == '{' {
            depth += 1;
        } else if c == '}' {
            depth -= 1;
        } else if depth == 0 && rest.starts_with("fn ") {
            let name: String = rest[3..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            let semi = rest.find(';').unwrap_or(usize::MAX);
            let brace = rest.find('{').unwrap_or(usize::MAX);
            out.push((name, brace < semi));
        }
        rest = &rest[c.len_utf8()..];
    }
    out
}

#[test]
fn every_backend_method_is_forwarded() {
    let trait_fns = fns(block(&source("src/backend/interface.rs"), "pub trait Backend"));
    let with_body: Vec<&String> = trait_fns.iter().filter(|(_, b)| *b).map(|(n, _)| n).collect();
    assert!(
        with_body.is_empty(),
        "Backend methods with a default body (every backend must implement them): {with_body:?}"
    );
    let declared: BTreeSet<String> = trait_fns.into_iter().map(|(n, _)| n).collect();
    let forwarded: BTreeSet<String> = fns(block(&source("src/backend/any.rs"), "impl Backend for AnyBackend"))
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    println!("[dispatch] {} methods: {declared:?}", declared.len());
    assert!(declared.len() >= 20, "the trait parse found only {declared:?}");
    let missing: Vec<_> = declared.difference(&forwarded).collect();
    assert!(missing.is_empty(), "AnyBackend does not forward {missing:?}");
}

/// The scanner finds bodies and declarations as they are written.
#[test]
fn the_scanner_tells_declarations_from_bodies() {
    let t = "pub trait T {\n    fn a(&self) -> u32;\n    fn b<R>(&self, f: impl FnOnce() -> R) -> R {\n        f()\n    }\n}";
    assert_eq!(
        fns(block(t, "pub trait T")),
        vec![("a".to_string(), false), ("b".to_string(), true)]
    );
}

/// Through the dispatch, a batch of two sequences gets the logits each gets alone (the CPU's
/// one-dispatch attention of several sequences, reached through `AnyBackend`).
#[test]
fn dispatch_runs_batches() {
    use tinyllm::engine::{forward_batch, BatchItem, Session, SessionConfig};
    use tinyllm::model::{HeadResult, HeadWant, Model};
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/fixtures/qwen2.Q8_0.gguf");
    let file = Arc::new(tinyllm::gguf::GgufFile::open(&path).unwrap());
    let be = AnyBackend::open(BackendKind::Cpu, 2).unwrap();
    assert_eq!(be.name(), "cpu");
    let model = Arc::new(Model::load(be, file).unwrap());
    let cfg = SessionConfig {
        n_ctx: 64,
        ..SessionConfig::default()
    };
    let (a_in, b_in) = ([5u32, 9, 13, 2, 7], [11u32, 3, 3]);
    let alone: Vec<Vec<f32>> = [&a_in[..], &b_in[..]]
        .iter()
        .map(|t| Session::new(model.clone(), cfg).unwrap().forward(t).unwrap())
        .collect();
    let mut a = Session::new(model.clone(), cfg).unwrap();
    let mut b = Session::new(model.clone(), cfg).unwrap();
    let mut scratch = model.scratch(8, 2).unwrap();
    let out = forward_batch(
        &mut scratch,
        &mut [
            BatchItem {
                session: &mut a,
                tokens: &a_in,
                n_last: 1,
            },
            BatchItem {
                session: &mut b,
                tokens: &b_in,
                n_last: 1,
            },
        ],
        HeadWant::Logits,
    )
    .unwrap()
    .wait()
    .unwrap();
    for (got, want) in out.iter().zip(&alone) {
        let HeadResult::Logits(got) = got else { panic!("logits") };
        let d = got.iter().zip(want).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        assert!(d < 1e-4, "batched through the dispatch differs from alone by {d}");
    }
}
