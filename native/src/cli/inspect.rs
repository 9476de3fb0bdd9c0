//! `inspect`: what is in a GGUF file (architecture, hyper-parameters, quant mix, tensors),
//! and `--tensor NAME --dequant OUT.f32` to dump one tensor as little-endian f32; `--gpus`
//! lists the GPUs instead ([`super::gpus`]: WebGPU adapters and Vulkan devices).

use super::io::open_model;
use crate::error::InputError;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use tinyllm::gguf::{GgufFile, TensorInfo};

#[derive(clap::Args)]
pub struct Args {
    /// Model path or alias.
    #[arg(required_unless_present = "gpus")]
    model: Option<String>,
    /// List the GPUs instead of inspecting a model: the WebGPU adapters (features, limits) and
    /// the Vulkan devices (driver, subgroup sizes, which specializations the Vulkan backend
    /// uses). No Vulkan loader, driver or device is reported as such and exits 0; a Vulkan
    /// call that fails exits 1.
    #[arg(long, conflicts_with_all = ["tensor", "dequant"])]
    gpus: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Show (or with --dequant, dump) this tensor.
    #[arg(long)]
    tensor: Option<String>,
    /// Write the tensor named by --tensor as little-endian f32, in GGUF element order.
    #[arg(long, requires = "tensor")]
    dequant: Option<PathBuf>,
}

/// Per-architecture hyper-parameter keys worth showing, without the `ARCH.` prefix.
const HPARAM_KEYS: &[&str] = &[
    "context_length",
    "embedding_length",
    "block_count",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "attention.sliding_window",
    "attention.layer_norm_rms_epsilon",
    "rope.freq_base",
    "rope.dimension_count",
    "expert_count",
    "expert_used_count",
];

struct Summary {
    architecture: String,
    parameters: u64,
    /// type name -> (tensor count, bytes)
    quant_mix: BTreeMap<String, (usize, u64)>,
    hparams: Vec<(String, String, serde_json::Value)>,
    vocab_size: Option<usize>,
}

fn summarize(file: &GgufFile) -> Summary {
    let architecture = file.architecture().unwrap_or("unknown").to_string();
    let mut quant_mix: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    for t in file.tensors() {
        let e = quant_mix.entry(t.ty.name().to_string()).or_default();
        e.0 += 1;
        e.1 += t.bytes;
    }
    let hparams = HPARAM_KEYS
        .iter()
        .filter_map(|k| {
            let key = format!("{architecture}.{k}");
            file.get(&key).map(|v| (k.to_string(), v.to_string(), v.to_json()))
        })
        .collect();
    Summary {
        parameters: file.tensors().iter().map(TensorInfo::elements).sum(),
        vocab_size: file.get_array("tokenizer.ggml.tokens").ok().map(|a| a.items.len()),
        architecture,
        quant_mix,
        hparams,
    }
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if a.gpus {
        return super::gpus::print(a.json);
    }
    let Some(model) = &a.model else {
        return Err(InputError("a model path or alias is required".into()).into());
    };
    let file = open_model(model)?;
    if let Some(name) = &a.tensor {
        let view = file.tensor(name).map_err(|e| InputError(e.to_string()))?;
        if let Some(out) = &a.dequant {
            return dump_f32(&file, view.info, out);
        }
        let t = view.info;
        if a.json {
            println!("{}", tensor_json(t));
        } else {
            println!(
                "{}  {}  shape {:?}  offset {}  {} bytes",
                t.name, t.ty, t.shape, t.offset, t.bytes
            );
        }
        return Ok(());
    }
    let s = summarize(&file);
    if a.json {
        print_json(&file, &s)
    } else {
        print_text(&file, &s)
    }
}

fn tensor_json(t: &TensorInfo) -> serde_json::Value {
    serde_json::json!({"name": t.name, "type": t.ty.name(), "shape": t.shape, "offset": t.offset, "bytes": t.bytes})
}

fn print_json(file: &GgufFile, s: &Summary) -> anyhow::Result<()> {
    let metadata: serde_json::Map<String, serde_json::Value> =
        file.metadata().iter().map(|(k, v)| (k.clone(), v.to_json())).collect();
    let quant_mix: serde_json::Map<String, serde_json::Value> = s
        .quant_mix
        .iter()
        .map(|(k, (n, b))| (k.clone(), serde_json::json!({"tensors": n, "bytes": b})))
        .collect();
    let hparams: serde_json::Map<String, serde_json::Value> =
        s.hparams.iter().map(|(k, _, v)| (k.clone(), v.clone())).collect();
    let out = serde_json::json!({
        "architecture": s.architecture,
        "version": file.version,
        "file_bytes": file.file_bytes(),
        "parts": file.part_count(),
        "tensor_count": file.tensors().len(),
        "parameters": s.parameters,
        "vocab_size": s.vocab_size,
        "hparams": hparams,
        "quant_mix": quant_mix,
        "metadata": metadata,
        "tensors": file.tensors().iter().map(tensor_json).collect::<Vec<_>>(),
    });
    let mut stdout = std::io::stdout().lock();
    serde_json::to_writer(&mut stdout, &out)?;
    writeln!(stdout)?;
    Ok(())
}

fn print_text(file: &GgufFile, s: &Summary) -> anyhow::Result<()> {
    let mut o = std::io::stdout().lock();
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    writeln!(o, "architecture   {}", s.architecture)?;
    if let Ok(name) = file.get_str("general.name") {
        writeln!(o, "name           {name}")?;
    }
    writeln!(
        o,
        "gguf version   {} ({} file{})",
        file.version,
        file.part_count(),
        if file.part_count() == 1 { "" } else { "s" }
    )?;
    writeln!(o, "file size      {:.1} MiB", mib(file.file_bytes()))?;
    writeln!(o, "parameters     {:.1} M", s.parameters as f64 / 1e6)?;
    writeln!(o, "tensors        {}", file.tensors().len())?;
    if let Some(v) = s.vocab_size {
        writeln!(o, "vocab size     {v}")?;
    }
    for (k, v, _) in &s.hparams {
        writeln!(o, "{k:<36} {v}")?;
    }
    writeln!(o, "quant mix")?;
    for (ty, (n, b)) in &s.quant_mix {
        writeln!(o, "  {ty:<8} {n:>5} tensors  {:>9.1} MiB", mib(*b))?;
    }
    writeln!(o, "metadata ({} keys)", file.metadata().len())?;
    for (k, v) in file.metadata() {
        let mut text = v.to_string();
        if text.len() > 120 {
            let cut = (0..=117).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
            text = format!("{}... ({} bytes)", &text[..cut], text.len());
        }
        writeln!(o, "  {k} = {}", text.replace('\n', "\\n"))?;
    }
    Ok(())
}

/// Write a tensor as f32 one row at a time, so a large embedding never sits in memory whole.
fn dump_f32(file: &GgufFile, t: &TensorInfo, out: &std::path::Path) -> anyhow::Result<()> {
    let view = file.view(t);
    let row_len = t.shape[0] as usize;
    let row_bytes = t.ty.bytes_for(t.shape[0]).unwrap_or(0) as usize;
    let f = std::fs::File::create(out).map_err(|e| InputError(format!("cannot create {}: {e}", out.display())))?;
    let mut w = std::io::BufWriter::new(f);
    let mut row = vec![0f32; row_len];
    for chunk in view.data.chunks_exact(row_bytes.max(1)) {
        tinyllm::quant::dequantize(t.ty, chunk, &mut row)?;
        for v in &row {
            w.write_all(&v.to_le_bytes())?;
        }
    }
    w.flush()?;
    eprintln!(
        "wrote {} values of {} ({}) to {}",
        t.elements(),
        t.name,
        t.ty,
        out.display()
    );
    Ok(())
}
