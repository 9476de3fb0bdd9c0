//! The CLI contract (docs/design.md): outputs of inspect/tokenize/detokenize/template on the real
//! models checked against llama.cpp's golden answers, and exit code 2 with a clear message for
//! every kind of bad input.

mod cli_support;
#[path = "../../tests/common/mod.rs"]
mod common;

use cli_support::{input_error, jsonl, ok_stdout};
use common::{golden, real_model, GgufWriter};
use serde_json::Value;

const QWEN: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
const GEMMA: &str = "gemma-3-270m-q4_k_m.gguf";

#[test]
fn inspect_real_models() {
    for (file, arch, tensors, n_layers) in [(GEMMA, "gemma3", 236, 18), (QWEN, "qwen2", 291, 24)] {
        let path = real_model(file);
        let j: Value = serde_json::from_str(&ok_stdout(&["inspect", path.to_str().unwrap(), "--json"])).unwrap();
        assert_eq!(j["architecture"], arch);
        assert_eq!(j["tensor_count"], tensors);
        assert_eq!(j["tensors"].as_array().unwrap().len(), tensors);
        assert_eq!(j["metadata"][format!("{arch}.block_count")], n_layers);
        // Q4_K_M: mostly Q4_K with Q6_K for the sensitive tensors, norms in F32.
        let mix = j["quant_mix"].as_object().unwrap();
        for ty in ["Q4_K", "Q6_K", "F32"] {
            assert!(mix.contains_key(ty), "{file}: quant mix {mix:?} lacks {ty}");
        }
        let mix_tensors: usize = mix.values().map(|v| v["tensors"].as_u64().unwrap() as usize).sum();
        assert_eq!(mix_tensors, tensors);
        let data_bytes: u64 = j["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["bytes"].as_u64().unwrap())
            .sum();
        assert!(data_bytes < j["file_bytes"].as_u64().unwrap());
        let text = ok_stdout(&["inspect", path.to_str().unwrap()]);
        assert!(text.contains(&format!("tensors        {tensors}")), "{text}");
    }
}

/// A GGUF holding llama.cpp's quantized golden blocks: `--dequant` must write gguf-py's values
/// bit for bit.
#[test]
fn inspect_dequant_matches_golden() {
    let dir = tempfile::tempdir().unwrap();
    let index: Value = serde_json::from_str(&std::fs::read_to_string(golden("quants/index.json")).unwrap()).unwrap();
    for ty in ["Q4_K", "Q8_0", "F16", "IQ4_XS"] {
        let entry = index["types"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["type"] == ty)
            .unwrap();
        let blocks = std::fs::read(golden(&format!("quants/{ty}.bin"))).unwrap();
        let mut w = GgufWriter::new();
        w.kv_str("general.architecture", "test");
        w.tensor_at(
            "t",
            &[512, 4],
            entry["ggml_type_id"].as_u64().unwrap() as u32,
            blocks.len() as u64,
            0,
        );
        let bytes = w.finish_with(&blocks);
        let gguf = dir.path().join(format!("{ty}.gguf"));
        std::fs::write(&gguf, &bytes).unwrap();
        let out = dir.path().join(format!("{ty}.f32"));
        ok_stdout(&[
            "inspect",
            gguf.to_str().unwrap(),
            "--tensor",
            "t",
            "--dequant",
            out.to_str().unwrap(),
        ]);
        let want = std::fs::read(golden(&format!("quants/{ty}.f32"))).unwrap();
        assert!(
            std::fs::read(&out).unwrap() == want,
            "{ty}: --dequant output differs from golden"
        );
    }
}

#[test]
fn tokenize_and_detokenize_match_golden() {
    for (file, golden_name) in [(QWEN, "qwen2.5-coder-0.5b"), (GEMMA, "gemma-3-270m")] {
        let path = real_model(file);
        let model = path.to_str().unwrap();
        let rows = jsonl(&format!("tokenizer/{golden_name}.tokenize.jsonl"));
        // Every 10th row through the CLI (the library test covers all of them).
        for row in rows.iter().step_by(10) {
            let text = row["text"].as_str().unwrap();
            if text.is_empty() || text.starts_with('-') {
                continue;
            }
            let mut args = vec!["tokenize", "-m", model];
            if !row["add_special"].as_bool().unwrap() {
                args.push("--no-add-special");
            }
            if !row["parse_special"].as_bool().unwrap() {
                args.push("--no-parse-special");
            }
            args.push(text);
            let ids: Value = serde_json::from_str(&ok_stdout(&args)).unwrap();
            assert_eq!(ids, row["ids"], "{golden_name}: tokenize {text:?}");
        }
        for row in jsonl(&format!("tokenizer/{golden_name}.detokenize.jsonl"))
            .iter()
            .step_by(5)
        {
            let ids: Vec<String> = row["ids"].as_array().unwrap().iter().map(|i| i.to_string()).collect();
            if ids.is_empty() {
                continue;
            }
            let out = ok_stdout(&["detokenize", "-m", model, "--json", &ids.join(",")]);
            let text: String = serde_json::from_str(&out).unwrap();
            assert_eq!(text, row["text"].as_str().unwrap(), "{golden_name}: detokenize {ids:?}");
        }
    }
}

#[test]
fn template_matches_golden() {
    let dir = tempfile::tempdir().unwrap();
    let model = real_model(QWEN);
    for case in jsonl("templates/qwen2.5-coder-0.5b.jsonl") {
        let messages = dir.path().join("messages.json");
        std::fs::write(&messages, case["messages"].to_string()).unwrap();
        let mut args = vec![
            "template",
            "-m",
            model.to_str().unwrap(),
            "--messages",
            messages.to_str().unwrap(),
            "--json",
        ];
        let tools = dir.path().join("tools.json");
        if case["tools"].is_array() {
            std::fs::write(&tools, case["tools"].to_string()).unwrap();
            args.extend(["--tools", tools.to_str().unwrap()]);
        }
        if !case["add_generation_prompt"].as_bool().unwrap() {
            args.push("--no-generation-prompt");
        }
        let text: String = serde_json::from_str(&ok_stdout(&args)).unwrap();
        assert_eq!(
            text,
            case["rendered"].as_str().unwrap(),
            "template case {}",
            case["name"]
        );
    }
}

#[test]
fn bad_input_exits_2_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let e = input_error(&["inspect", "/nonexistent/model.gguf"]);
    assert!(e.contains("/nonexistent/model.gguf"), "{e}");
    let e = input_error(&["inspect", "no-such-alias:1b"]);
    assert!(
        e.contains("no-such-alias:1b") && e.contains("qwen2.5-coder:0.5b"),
        "{e}"
    );

    let garbage = dir.path().join("garbage.gguf");
    std::fs::write(&garbage, b"this is not a gguf file at all").unwrap();
    let e = input_error(&["inspect", garbage.to_str().unwrap()]);
    assert!(e.contains("magic"), "{e}");

    let empty = dir.path().join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    let e = input_error(&["inspect", empty.to_str().unwrap()]);
    assert!(e.contains("truncated"), "{e}");

    let qwen = real_model(QWEN);
    let qwen = qwen.to_str().unwrap();
    let e = input_error(&["inspect", qwen, "--tensor", "no.such.tensor", "--dequant", "/tmp/x.f32"]);
    assert!(e.contains("no.such.tensor"), "{e}");
    let e = input_error(&["detokenize", "-m", qwen, "1,2,banana"]);
    assert!(e.contains("banana"), "{e}");
    let e = input_error(&["detokenize", "-m", qwen, "1,999999999"]);
    assert!(e.contains("999999999"), "{e}");
    let e = input_error(&["inspect", qwen, "--no-such-flag"]);
    assert!(e.contains("--no-such-flag"), "{e}");
    // Only serve runs several models.
    let e = input_error(&["run", "-m", qwen, "-m", qwen, "-n", "1", "hi"]);
    assert!(e.contains("only serve runs several models"), "{e}");

    let bad_json = dir.path().join("bad.json");
    std::fs::write(&bad_json, "[{\"role\": ").unwrap();
    let e = input_error(&["template", "-m", qwen, "--messages", bad_json.to_str().unwrap()]);
    assert!(e.contains("invalid JSON"), "{e}");
    let e = input_error(&["template", "-m", qwen, "--messages", "/nonexistent.json"]);
    assert!(e.contains("/nonexistent.json"), "{e}");
    let msgs = dir.path().join("m.json");
    std::fs::write(&msgs, r#"[{"role":"user","content":"hi"}]"#).unwrap();
    let e = input_error(&[
        "template",
        "-m",
        qwen,
        "--messages",
        msgs.to_str().unwrap(),
        "--kwargs",
        "[1]",
    ]);
    assert!(e.contains("--kwargs"), "{e}");
}

/// `inspect --gpus` lists the Vulkan devices with their driver, subgroup sizes and the
/// specializations the Vulkan backend uses, in text and JSON; lavapipe (CI) as the CPU device
/// it is. Skips where this machine has no Vulkan device.
#[test]
fn inspect_gpus_lists_vulkan_devices() {
    let j: Value = serde_json::from_str(&ok_stdout(&["inspect", "--gpus", "--json"])).unwrap();
    let vk = &j["vulkan"];
    let Some(devices) = common::device_or_skip(|| match vk["devices"].as_array() {
        Some(d) if !d.is_empty() => Ok(d.clone()),
        _ => Err(format!("no Vulkan devices: {}", vk["reason"])),
    }) else {
        return;
    };
    assert_eq!(vk["available"], true);
    assert!(j["adapters"].is_array(), "the WebGPU adapters are still listed");
    assert_eq!(devices.iter().filter(|d| d["default"] == true).count(), 1);
    for d in &devices {
        let g = &d["subgroups"];
        assert!(g["min_size"].as_u64() <= g["size"].as_u64() && g["size"].as_u64() <= g["max_size"].as_u64());
        let s = &d["specializations"];
        for key in [
            "subgroup_operations",
            "subgroup_size_control",
            "integer_dot_product",
            "cooperative_matrix",
            "shader_float16",
            "storage_16bit",
        ] {
            let state = s[key]["state"].as_str().unwrap_or_else(|| panic!("{key}: {s}"));
            assert!(["used", "not_used", "not_available"].contains(&state), "{key}: {state}");
        }
        assert!(s["subgroup_size"]["size"].as_u64().unwrap() > 0);
    }
    let text = ok_stdout(&["inspect", "--gpus"]);
    assert!(text.contains("Vulkan devices (instance API 1."), "{text}");
    assert!(text.contains("(the Vulkan backend's default)"), "{text}");
    for line in [
        "  subgroup size          ",
        "  kernels' subgroup size ",
        "    subgroup size control  ",
        "    integer dot product    ",
        "    cooperative matrix     ",
        "    shader float16         ",
        "    16-bit storage         ",
    ] {
        assert!(text.contains(line), "no '{line}' in:\n{text}");
    }
    let Some(lvp) = devices.iter().find(|d| d["driver"]["name"] == "llvmpipe") else {
        return;
    };
    assert_eq!(lvp["device_type"], "cpu");
    assert_eq!(lvp["vendor"], "Mesa (software)");
    let size = lvp["subgroups"]["size"].as_u64().unwrap();
    assert_eq!(lvp["subgroups"]["min_size"].as_u64(), Some(size));
    assert_eq!(lvp["subgroups"]["max_size"].as_u64(), Some(size));
    assert_eq!(lvp["specializations"]["subgroup_size"]["required"], false);
    assert_eq!(lvp["specializations"]["subgroup_size_control"]["state"], "not_used");
    let name = lvp["name"].as_str().unwrap();
    assert!(text.contains(&format!("] {name}")), "{text}");
    assert!(text.contains("  driver                 llvmpipe (Mesa "), "{text}");
    assert!(
        text.contains(&format!("  subgroup size          {size} (range {size}..{size})")),
        "{text}"
    );
    assert!(
        text.contains("    subgroup size control  not used (the device has one subgroup size)"),
        "{text}"
    );
}

/// With a Vulkan loader that finds no driver (or no loader at all) `inspect --gpus` says so
/// and exits 0: having no GPU is an answer, not an error.
#[test]
fn inspect_gpus_without_a_vulkan_driver_says_so_and_exits_0() {
    let run = |json: bool| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_tinyllm-native"));
        cmd.args(["inspect", "--gpus"]);
        if json {
            cmd.arg("--json");
        }
        // The loader's driver lists (old and new names), pointing at nothing.
        let out = cmd
            .env("VK_ICD_FILENAMES", "/nonexistent/icd.json")
            .env("VK_DRIVER_FILES", "/nonexistent/icd.json")
            .output()
            .expect("run tinyllm-native");
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(0), "stderr: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        String::from_utf8(out.stdout).unwrap()
    };
    let text = run(false);
    assert!(text.contains("Vulkan devices\n  none: "), "{text}");
    let j: Value = serde_json::from_str(&run(true)).unwrap();
    assert_eq!(j["vulkan"]["available"], false);
    assert_eq!(j["vulkan"]["devices"], serde_json::json!([]));
    assert!(!j["vulkan"]["reason"].as_str().unwrap().is_empty());
}
