//! The layering the engine's design rests on, checked from the sources:
//!
//! - the upper floors of the library import each other one way only (`backend` <- `model` <-
//!   `engine` <- `openai`): every `crate::...` path in a module's files is an edge, and the
//!   edges between these modules must form no cycle and follow that order;
//! - the server of `tinyllm-native` does not import its CLI (they share the library instead).
//!
//! The edges found are printed, so a new one shows in the test log.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layered modules, lowest first.
const LAYERS: [&str; 5] = ["backend", "model", "engine", "openai", "anthropic"];

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `dir` (or `dir.rs` itself).
fn rust_files(path: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if path.is_file() {
        out.push(path.to_path_buf());
    } else if let Ok(entries) = std::fs::read_dir(path) {
        let mut entries: Vec<PathBuf> = entries.filter_map(|e| Some(e.ok()?.path())).collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                out.extend(rust_files(&p));
            } else if p.extension().is_some_and(|e| e == "rs") {
                out.push(p);
            }
        }
    }
    out
}

/// The code of a file without its comment lines (doc links name other modules freely).
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules a piece of code names through `prefix` (`crate::`).
fn named(code: &str, prefix: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find(prefix) {
        let after = &rest[i + prefix.len()..];
        let name: String = after.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        // `crate::{a, b}` groups name several.
        if name.is_empty() && after.starts_with('{') {
            let group = &after[1..after.find('}').unwrap_or(after.len())];
            for item in group.split(',') {
                let n: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !n.is_empty() {
                    out.insert(n);
                }
            }
        } else if !name.is_empty() {
            out.insert(name);
        }
        rest = &rest[i + prefix.len()..];
    }
    out
}

/// Module -> the layered modules its files import.
fn layer_edges() -> BTreeMap<&'static str, BTreeSet<String>> {
    let src = workspace().join("src");
    LAYERS
        .iter()
        .map(|&m| {
            let mut files = rust_files(&src.join(m));
            files.extend(rust_files(&src.join(format!("{m}.rs"))));
            assert!(!files.is_empty(), "no sources for module {m}");
            let deps: BTreeSet<String> = files
                .iter()
                .flat_map(|f| named(&code(f), "crate::"))
                .filter(|d| d != m && LAYERS.contains(&d.as_str()))
                .collect();
            (m, deps)
        })
        .collect()
}

#[test]
fn upper_floors_import_each_other_one_way() {
    let edges = layer_edges();
    for (m, deps) in &edges {
        println!("[layers] {m} -> {deps:?}");
    }
    // One way only: a module may import the layers below it, never one above.
    let rank = |m: &str| LAYERS.iter().position(|l| *l == m).expect("a layer");
    let mut upward = Vec::new();
    for (m, deps) in &edges {
        for d in deps {
            if rank(d) > rank(m) {
                upward.push(format!("{m} imports {d}, a layer above it"));
            }
        }
    }
    assert!(upward.is_empty(), "{}", upward.join("\n"));
}

#[test]
fn the_server_does_not_import_the_cli() {
    let server = workspace().join("native/src/server");
    let files = rust_files(&server);
    assert!(files.len() > 3, "no server sources under {}", server.display());
    let mut found = Vec::new();
    for f in &files {
        let c = code(f);
        let crate_mods = named(&c, "crate::");
        if crate_mods.contains("cli") || c.contains("super::super::cli") || c.contains("super::cli") {
            found.push(f.display().to_string());
        }
    }
    assert!(found.is_empty(), "the server imports the CLI in: {}", found.join(", "));
}

/// The scanner itself: it must see the edges it is meant to catch.
#[test]
fn the_scanner_sees_imports() {
    let c = "use crate::engine::Session;\nuse crate::{model, backend::X};\n// crate::openai in a comment\n";
    let stripped: String = c
        .lines()
        .filter(|l| !l.starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let n = named(&stripped, "crate::");
    assert_eq!(
        n,
        ["backend", "engine", "model"].iter().map(|s| s.to_string()).collect()
    );
}
