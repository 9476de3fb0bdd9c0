//! The layering the engine's design rests on, checked from the sources:
//!
//! - the upper floors of the library import each other one way only (`backend` <- `model` <-
//!   `engine` <- `openai`): every `crate::...` path in a module's files is an edge, and the
//!   edges between these modules must form no cycle and follow that order;
//! - the server of `tinyllm-native` does not import its CLI (they share the library instead);
//! - the shared GPU layer (`backend/gpu/`) imports neither device layer (`webgpu/`, `vulkan/`);
//! - inside `model/`, `engine/`, `backend/` and the native crate, no files import each other in
//!   a circle: every `use` and inline path (`crate::`, `super::` chains, `self::`, a child
//!   module's name, nested `{...}` groups) is an edge from its file to the file of the module
//!   it names. The strongly connected components of those edges must be single files (so a
//!   `mod.rs` that re-exports its children must not be imported by them: children import
//!   from the file that defines a name).
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

/// A source file's module path (`src/backend/cpu/kernels.rs` -> `backend::cpu::kernels`,
/// `mod.rs` and `lib.rs`/`main.rs` name their folder's module), relative to `root`.
fn module_of(root: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(root).unwrap();
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if !matches!(stem, "mod" | "lib" | "main") {
        parts.push(stem.to_string());
    }
    parts
}

/// The paths a piece of code names: each `use` tree expanded (nested groups included) and each
/// inline `crate::`/`super::`/`self::` path, as segment lists (a `use` path that starts with
/// another name is kept as it is: it may name a child module).
fn paths_in(code: &str) -> Vec<Vec<String>> {
    fn ident(s: &str) -> usize {
        s.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(s.len())
    }
    /// Expand a use tree at `s` (after `prefix`), pushing full paths; returns bytes consumed.
    fn tree(s: &str, prefix: &[String], out: &mut Vec<Vec<String>>) -> usize {
        let mut at = 0;
        let mut path = prefix.to_vec();
        loop {
            let rest = &s[at..];
            let trimmed = rest.trim_start();
            at += rest.len() - trimmed.len();
            if let Some(inner) = trimmed.strip_prefix('{') {
                at += 1;
                let mut used = 0;
                loop {
                    used += tree(&inner[used..], &path, out);
                    let r = &inner[used..];
                    let t = r.trim_start();
                    used += r.len() - t.len();
                    if t.starts_with(',') {
                        used += 1;
                        continue;
                    }
                    if t.starts_with('}') {
                        used += 1;
                    }
                    break;
                }
                at += used;
                return at;
            }
            let n = ident(trimmed);
            if n == 0 {
                // `*` or the end of the tree.
                if trimmed.starts_with('*') {
                    at += 1;
                }
                out.push(path);
                return at;
            }
            path.push(trimmed[..n].to_string());
            at += n;
            if s[at..].starts_with("::") {
                at += 2;
                continue;
            }
            // ` as X`, `,`, `}` or `;` end this path.
            out.push(path);
            let r = &s[at..];
            if let Some(r2) = r.trim_start().strip_prefix("as ") {
                at += r.len() - r.trim_start().len() + 3;
                at += r2.len() - r2.trim_start().len();
                at += ident(r2.trim_start());
            }
            return at;
        }
    }
    let mut found: Vec<(usize, Vec<String>)> = Vec::new();
    // Every `use` item, wherever it stands (a block's first statement included).
    let mut i = 0;
    while let Some(j) = code[i..].find("use ") {
        let at = i + j;
        i = at + 4;
        let before = code[..at].trim_end_matches(' ').chars().last();
        let starts_item = match before {
            None => true,
            Some(c) => {
                matches!(c, '\n' | ';' | '{' | '}' | ')' | ']')
                    || code[..at].ends_with("pub ")
                    || code[..at].ends_with("pub(crate) ")
                    || code[..at].ends_with("pub(super) ")
            }
        };
        if !starts_item
            || code[..at]
                .chars()
                .last()
                .is_some_and(|c| c.is_alphanumeric() || c == '_')
        {
            continue;
        }
        let end = code[at..].find(';').map_or(code.len(), |e| at + e);
        let mut paths = Vec::new();
        tree(&code[at + 4..end], &[], &mut paths);
        found.extend(paths.into_iter().map(|p| (at, p)));
    }
    // Inline paths anywhere (a `use` line's are found again: harmless): every `a::b` that
    // starts a path; `resolve` keeps those that name this crate's modules (`crate::`,
    // `super::`, `self::`, or a child module such as `llama::LlamaArch` in a macro).
    {
        let start = "::";
        let mut i = 0;
        while let Some(j) = code[i..].find(start) {
            let sep = i + j;
            // Back to the start of the first segment.
            let at = code[..sep]
                .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
                .map_or(0, |k| k + 1);
            let before = code[..at].chars().last();
            if at == sep || before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                i = sep + start.len();
                continue;
            }
            let mut path = Vec::new();
            let mut k = at;
            loop {
                let n = ident(&code[k..]);
                if n == 0 {
                    break;
                }
                path.push(code[k..k + n].to_string());
                k += n;
                if code[k..].starts_with("::") {
                    k += 2;
                } else {
                    break;
                }
            }
            // `crate::a::{...}` is a use group, expanded by the use-tree walk above.
            if path.len() > 1 && !code[k..].starts_with('{') {
                found.push((at, path));
            }
            i = k.max(sep + start.len());
        }
    }
    // Inside an inline module (`mod tests { use super::*; }`, `mod avx2 { ... }`), its own
    // `super`s stay within the file: drop them (one left over means the file's own module).
    let inline = inline_modules(code);
    found
        .into_iter()
        .map(|(at, mut path)| {
            let depth = inline.iter().filter(|(a, b)| *a <= at && at < *b).count();
            let supers = path.iter().take_while(|s| *s == "super").count();
            let drop = depth.min(supers);
            if drop > 0 {
                path.drain(..drop);
                if supers == drop {
                    path.insert(0, "self".into());
                }
            }
            path
        })
        .collect()
}

/// The byte ranges of the inline module bodies (`mod name { ... }`) in `code`.
fn inline_modules(code: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(j) = code[i..].find("mod ") {
        let at = i + j;
        i = at + 4;
        if code[..at]
            .chars()
            .last()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
        {
            continue;
        }
        let rest = code[at + 4..].trim_start();
        let name = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        if name == 0 || !rest[name..].trim_start().starts_with('{') {
            continue;
        }
        let open = at
            + 4
            + (code[at + 4..].len() - rest.len())
            + name
            + (rest[name..].len() - rest[name..].trim_start().len());
        let mut depth = 0;
        for (k, c) in code[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        out.push((open, open + k));
                        break;
                    }
                }
                _ => {}
            }
        }
    }
    out
}

/// The module a path names, resolved from module `from` against `known`: the longest known module prefix, `None` outside this crate.
fn resolve(path: &[String], from: &[String], known: &BTreeSet<Vec<String>>) -> Option<Vec<String>> {
    let mut base: Vec<String>;
    let mut rest = path;
    match path.first().map(String::as_str) {
        Some("crate") => {
            base = Vec::new();
            rest = &path[1..];
        }
        Some("self") => {
            base = from.to_vec();
            rest = &path[1..];
        }
        Some("super") => {
            base = from.to_vec();
            // `super` of `a::b` is `a`, whether its file is `a/b.rs` or `a/b/mod.rs`.
            while rest.first().map(String::as_str) == Some("super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        Some(first) => {
            // A child module of `from` named directly (`use scheduler::Job;` in `server/mod.rs`).
            let mut child = from.to_vec();
            child.push(first.to_string());
            if !known.contains(&child) {
                return None;
            }
            base = from.to_vec();
        }
        None => return None,
    }
    let mut best = known.contains(&base).then(|| base.clone());
    for seg in rest {
        base.push(seg.clone());
        if known.contains(&base) {
            best = Some(base.clone());
        } else {
            break;
        }
    }
    best
}

/// The file-level import graph of the crate rooted at `root` (`src/`): module -> modules.
fn file_graph(root: &Path) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let files = rust_files(root);
    let known: BTreeSet<Vec<String>> = files.iter().map(|f| module_of(root, f)).collect();
    let mut graph = BTreeMap::new();
    for f in &files {
        let from = module_of(root, f);
        let edges: BTreeSet<Vec<String>> = paths_in(&code(f))
            .iter()
            .filter_map(|p| resolve(p, &from, &known))
            .filter(|to| *to != from)
            .collect();
        graph.insert(from, edges);
    }
    graph
}

/// The strongly connected components of more than one module (Tarjan's algorithm).
fn circles(graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<Vec<String>>> {
    struct T<'g> {
        g: &'g BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<&'g Vec<String>, usize>,
        low: BTreeMap<&'g Vec<String>, usize>,
        stack: Vec<&'g Vec<String>>,
        on: BTreeSet<&'g Vec<String>>,
        out: Vec<Vec<Vec<String>>>,
    }
    fn visit<'g>(t: &mut T<'g>, v: &'g Vec<String>) {
        let i = t.index.len();
        t.index.insert(v, i);
        t.low.insert(v, i);
        t.stack.push(v);
        t.on.insert(v);
        for w in t.g.get(v).into_iter().flatten() {
            let Some((w, _)) = t.g.get_key_value(w) else { continue };
            if !t.index.contains_key(w) {
                visit(t, w);
                let l = t.low[v].min(t.low[w]);
                t.low.insert(v, l);
            } else if t.on.contains(w) {
                let l = t.low[v].min(t.index[w]);
                t.low.insert(v, l);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                comp.push(w.clone());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        g: graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v) {
            visit(&mut t, v);
        }
    }
    t.out
}

fn show(m: &[String]) -> String {
    if m.is_empty() {
        "(root)".into()
    } else {
        m.join("::")
    }
}

/// The circles of `graph` among the modules under one of `areas` (module prefixes).
fn circles_in(graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>, areas: &[&[&str]]) -> Vec<String> {
    let inside = |m: &Vec<String>| {
        areas
            .iter()
            .any(|a| m.len() >= a.len() && m.iter().zip(a.iter()).all(|(x, y)| x == y))
    };
    let sub: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = graph
        .iter()
        .filter(|(m, _)| inside(m))
        .map(|(m, e)| (m.clone(), e.iter().filter(|t| inside(t)).cloned().collect()))
        .collect();
    circles(&sub)
        .iter()
        .map(|c| c.iter().map(|m| show(m)).collect::<Vec<_>>().join(" <-> "))
        .collect()
}

#[test]
fn no_file_circles_in_the_library_or_the_native_crate() {
    let mut found = circles_in(
        &file_graph(&workspace().join("src")),
        &[&["model"], &["engine"], &["backend"]],
    );
    found.extend(circles_in(&file_graph(&workspace().join("native/src")), &[&[]]));
    let lib = file_graph(&workspace().join("src"));
    for c in &found {
        println!("[circle] {c}");
        // The edges inside it, to show where to cut.
        let mods: BTreeSet<&str> = c.split(" <-> ").collect();
        for (m, edges) in &lib {
            if mods.contains(show(m).as_str()) {
                for to in edges.iter().filter(|t| mods.contains(show(t).as_str())) {
                    println!("  [edge] {} -> {}", show(m), show(to));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "files that import each other in a circle (the edges are printed above):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_gpu_layer_imports_no_device_layer() {
    let g = file_graph(&workspace().join("src"));
    let mut found = Vec::new();
    for (m, edges) in &g {
        if m.starts_with(&["backend".to_string(), "gpu".to_string()]) {
            for to in edges {
                if to.starts_with(&["backend".to_string(), "webgpu".to_string()])
                    || to.starts_with(&["backend".to_string(), "vulkan".to_string()])
                {
                    found.push(format!("{} -> {}", show(m), show(to)));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "the shared GPU layer imports a device layer: {found:?}"
    );
}

/// The file graph's scanner: nested groups, `super::` chains, child modules named directly,
/// and a planted circle found.
#[test]
fn the_file_scanner_sees_groups_super_chains_and_circles() {
    let code =
        "use crate::a::{b::{C, d::E}, f};\nuse super::super::g::H;\nuse child::X as Y;\nlet v = crate::a::b::z();";
    let known: BTreeSet<Vec<String>> = [
        vec![],
        vec!["a"],
        vec!["a", "b"],
        vec!["a", "b", "d"],
        vec!["a", "f"],
        vec!["g"],
        vec!["p", "q"],
        vec!["p", "q", "child"],
    ]
    .into_iter()
    .map(|m| m.into_iter().map(String::from).collect())
    .collect();
    let from: Vec<String> = vec!["p".into(), "q".into()];
    let got: BTreeSet<String> = paths_in(code)
        .iter()
        .filter_map(|p| resolve(p, &from, &known))
        .map(|m| show(&m))
        .collect();
    let want: BTreeSet<String> = ["a::b", "a::b::d", "a::f", "g", "p::q::child"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(got, want);
    let m = |s: &str| s.split("::").map(String::from).collect::<Vec<_>>();
    let planted: BTreeMap<_, BTreeSet<_>> = [
        (m("x::a"), [m("x::b")].into()),
        (m("x::b"), [m("x::c")].into()),
        (m("x::c"), [m("x::a")].into()),
        (m("x::d"), [m("x::a")].into()),
    ]
    .into();
    let found = circles_in(&planted, &[&["x"]]);
    assert_eq!(found, ["x::a <-> x::b <-> x::c"]);
    // Outside the areas looked at, the same circle is not reported.
    assert!(circles_in(&planted, &[&["y"]]).is_empty());
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
