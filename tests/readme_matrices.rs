//! The README's "What runs where" tables and its Layout section, checked against the code: the
//! architecture table against the model registry and the backends, the format table against
//! `quant/support.rs`, and the Layout against the folders that exist. A cell or a folder that
//! disagrees fails here, so the README cannot drift from what the code does.

use std::collections::BTreeSet;
use std::path::Path;

use tinyllm::backend::BackendKind;
use tinyllm::model::SUPPORTED;
use tinyllm::quant::support::SUPPORT;

fn readme() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap()
}

/// The rows of the Markdown table whose header line starts with `header`, as trimmed cells.
fn table(text: &str, header: &str) -> Vec<Vec<String>> {
    let mut lines = text.lines().skip_while(|l| !l.starts_with(header));
    let head = lines
        .next()
        .unwrap_or_else(|| panic!("no table '{header}' in the README"));
    let width = head.matches('|').count() - 1;
    lines
        .skip(1) // the |---| line
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<String> = l.trim_matches('|').split('|').map(|c| c.trim().to_string()).collect();
            assert_eq!(cells.len(), width, "row of {width} cells expected: {l}");
            cells
        })
        .collect()
}

fn yes(cell: &str, row: &str) -> bool {
    match cell {
        "yes" => true,
        "-" => false,
        other => panic!("{row}: a cell is 'yes' or '-', not '{other}'"),
    }
}

#[test]
fn the_architecture_table_is_the_registry_on_every_backend() {
    // The table's backend columns: every native backend and the wasm CPU. A new backend needs
    // a column here and in the README.
    let names: Vec<&str> = BackendKind::ALL.iter().map(|(_, n)| *n).collect();
    assert_eq!(names, ["cpu", "webgpu", "vulkan"], "a backend without a README column");
    let rows = table(&readme(), "| architecture | CPU | wasm CPU | WebGPU | Vulkan |");
    let listed: BTreeSet<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    let registry: BTreeSet<&str> = SUPPORTED.iter().copied().collect();
    assert_eq!(listed, registry, "the README's architectures against model::SUPPORTED");
    assert_eq!(listed.len(), rows.len(), "an architecture listed twice");
    // Every family's graph is written once against the Backend trait, with no per-backend
    // refusal (fixture goldens run each family on each backend), so every cell is "yes".
    for r in &rows {
        for cell in &r[1..5] {
            assert!(
                yes(cell, &r[0]),
                "{}: the code runs every architecture on every backend",
                r[0]
            );
        }
    }
}

#[test]
fn the_format_table_is_quant_support() {
    let rows = table(&readme(), "| format | CPU SIMD");
    let names: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    let want: Vec<&str> = SUPPORT.iter().map(|s| s.name).collect();
    assert_eq!(
        names, want,
        "the README's formats against quant::support::SUPPORT, in order"
    );
    for (r, s) in rows.iter().zip(SUPPORT.iter()) {
        let got = [
            yes(&r[1], s.name),
            yes(&r[2], s.name),
            yes(&r[3], s.name),
            yes(&r[4], s.name),
        ];
        assert_eq!(got, [s.cpu_simd, s.wasm_simd, s.wgsl, s.wgsl_texture], "{}", s.name);
    }
}

/// Every top-level folder and every `src/` folder is named in the README's Layout block.
#[test]
fn the_layout_names_every_folder() {
    let text = readme();
    let start = text.find("## Layout").expect("a Layout section");
    let block = &text[start..];
    let block = &block[..block[3..].find("\n## ").map_or(block.len(), |e| e + 3)];
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dirs = |dir: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(Result::ok)
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.') && n != "target" && n != "node_modules")
            .collect();
        v.sort();
        v
    };
    let mut missing = Vec::new();
    for d in dirs(root) {
        if !block.lines().any(|l| l.starts_with(&format!("{d}/"))) {
            missing.push(format!("{d}/"));
        }
    }
    for d in dirs(&root.join("src")) {
        if !block.lines().any(|l| l.trim_start().starts_with(&format!("{d}/"))) {
            missing.push(format!("src/{d}/"));
        }
    }
    assert!(
        missing.is_empty(),
        "folders the README's Layout does not name: {missing:?}"
    );
}
