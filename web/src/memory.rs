//! Sizing a model in the tab before its tensors download: `TinyLLM.estimate` (from a Range
//! request's first bytes) and the loader's refusal of a model that cannot fit
//! (`INSUFFICIENT_MEMORY`, as soon as the header is in).
//!
//! What the wasm memory peaks at (it only grows, so the peak is what a tab must afford):
//! * on the CPU, the weights, the KV cache, the activations and the tokenizer once loaded; while
//!   loading, everything placed so far plus the tensor being placed twice (its streamed bytes
//!   and the weight made from them), the largest of those over the file's tensors;
//! * on WebGPU, the weights live on the GPU: while loading, the wasm memory holds what is in
//!   flight to the GPU: a matrix larger than [`crate::load::GPU_PIECE`] one piece at a time (the
//!   piece, the bytes laid out for a texture, less than a piece and a texture row, and the
//!   worker's pushed slice of the download, at most a mebibyte: three pieces), a smaller tensor
//!   whole, twice (its bytes and the copy for the GPU; a vector's f32 values instead); once
//!   loaded, the tokenizer and the vocabulary-sized buffers of each step on the host
//!   ([`HOST_VOCAB_COPIES`]), the larger of the two phases.
//!
//! Both add the module's own memory ([`BASE_BYTES`]) and the header's parsed metadata, which
//! the stream holds from the header on and the model keeps (a vocabulary's arrays are most of
//! it). The loader reads the stream's own parsed header for its check: a second parse, or a
//! copy of the header's bytes, would raise the very peak it predicts by tens of MB.

use serde_json::{json, Value};
use tinyllm::backend::checks::placeable_in_pieces;
use tinyllm::gguf::GgufFile;
use tinyllm::model::memory::{estimate, MemoryNeed};
use wasm_bindgen::prelude::*;

use crate::error::WebError;

/// The module's own wasm memory besides a model's parts (code data, stacks, allocator slack).
/// Fitted, with the parts sized as the engine holds them (`tinyllm::model::memory`): 6 MB puts
/// the CPU estimate within 1% of the real models' measured peaks (gemma3 +0.8%, qwen2.5
/// -0.6%) and the WebGPU one within 8% (gemma3 +7% alone and -1% beside other tabs' loads,
/// qwen2.5 -6%).
const BASE_BYTES: u64 = 6_000_000;

/// wasm32's address space: no linear memory grows past 4 GiB.
pub const WASM32_MAX: f64 = 4_294_967_296.0;

/// The peak of the tensors' load in a tab on the CPU: the largest, over the file's tensors in
/// order, of the bytes placed before one plus that one twice.
fn streamed_peak(file: &GgufFile) -> u64 {
    let mut tensors: Vec<_> = file.tensors().iter().map(|t| (t.part, t.offset, t.bytes)).collect();
    tensors.sort_unstable();
    let mut placed = 0u64;
    let mut peak = 0u64;
    for (_, _, bytes) in tensors {
        peak = peak.max(placed + 2 * bytes);
        placed += bytes;
    }
    peak
}

/// 32-bit values per vocabulary entry a step on WebGPU holds in wasm memory: the logits read
/// back (the mapped copy and the vector) and the sampler's candidates (an id and a value each).
const HOST_VOCAB_COPIES: u64 = 4;

/// The peak of the tensors' way to the GPU on WebGPU (see the module doc).
fn gpu_load_peak(file: &GgufFile) -> u64 {
    let piece = crate::load::GPU_PIECE as u64;
    file.tensors()
        .iter()
        .map(|t| match t.bytes {
            b if b > piece && placeable_in_pieces(t) => 3 * piece,
            b if placeable_in_pieces(t) => 2 * b,
            b => b + 4 * t.elements(),
        })
        .max()
        .unwrap_or(0)
}

/// The wasm memory a model will take at its peak on `backend` (`cpu` or `webgpu`), and on
/// WebGPU the GPU memory.
pub struct Need {
    pub parts: MemoryNeed,
    pub wasm_cpu: u64,
    pub wasm_webgpu: u64,
    pub gpu: u64,
}

impl Need {
    pub fn of(file: &GgufFile, n_ctx: usize) -> Result<Self, WebError> {
        let parts = estimate(file, n_ctx).map_err(WebError::model)?;
        let running = parts.weights + parts.kv + parts.recurrent + parts.working;
        // The metadata is held from the header on; on WebGPU the tokenizer and the step's
        // vocabulary-sized buffers come after the last piece has gone to the GPU.
        let fixed = BASE_BYTES + parts.metadata;
        let webgpu_running = parts.tokenizer + HOST_VOCAB_COPIES * 4 * parts.n_vocab;
        Ok(Need {
            parts,
            wasm_cpu: fixed + parts.tokenizer + streamed_peak(file).max(running),
            wasm_webgpu: fixed + gpu_load_peak(file).max(webgpu_running),
            gpu: running,
        })
    }

    /// The wasm memory on `backend`.
    pub fn wasm(&self, backend: &str) -> u64 {
        if backend == "webgpu" {
            self.wasm_webgpu
        } else {
            self.wasm_cpu
        }
    }

    pub fn to_json(&self) -> Value {
        let p = &self.parts;
        json!({
            "n_ctx": p.n_ctx,
            "weights": p.weights,
            "kv": p.kv,
            "kv_buffer": p.kv_buffer,
            "recurrent": p.recurrent,
            "working": p.working,
            "tokenizer": p.tokenizer,
            "metadata": p.metadata,
            "largest_tensor": p.largest_tensor,
            "cpu": { "wasm_bytes": self.wasm_cpu },
            "webgpu": { "wasm_bytes": self.wasm_webgpu, "gpu_bytes": self.gpu },
        })
    }

    /// An `INSUFFICIENT_MEMORY` error when the model cannot fit on `backend`: `wasm_limit` what
    /// the linear memory can grow to, `device_bytes` the device's memory where the browser says
    /// it (else 0), `gpu_max_buffer` the GPU's largest buffer (0 off WebGPU).
    pub fn check(
        &self,
        backend: &str,
        wasm_limit: f64,
        device_bytes: f64,
        gpu_max_buffer: f64,
    ) -> Result<(), WebError> {
        let mb = |b: f64| format!("{:.0} MB", b / 1e6);
        if gpu_max_buffer > 0.0 && self.parts.kv_buffer as f64 > gpu_max_buffer {
            return Err(WebError::new(
                "INSUFFICIENT_MEMORY",
                format!(
                    "one layer of this model's KV cache needs {} for {} positions, more than the {} the GPU allows in one buffer (maxBufferSize); a smaller contextSize may fit",
                    mb(self.parts.kv_buffer as f64),
                    self.parts.n_ctx,
                    mb(gpu_max_buffer)
                ),
            ));
        }
        let wasm = self.wasm(backend) as f64;
        if wasm > wasm_limit {
            return Err(WebError::new(
                "INSUFFICIENT_MEMORY",
                format!(
                    "this model needs about {} of wasm memory on {backend} (weights {}, KV cache {} for {} positions, working set {}), more than the {} a tab's wasm32 memory can hold{}",
                    mb(wasm),
                    mb(self.parts.weights as f64),
                    mb(self.parts.kv as f64),
                    self.parts.n_ctx,
                    mb(self.parts.working as f64),
                    mb(wasm_limit),
                    if backend == "cpu" { "; a smaller contextSize or WebGPU may fit" } else { "; a smaller contextSize may fit" }
                ),
            ));
        }
        let total = wasm + if backend == "webgpu" { self.gpu as f64 } else { 0.0 };
        if device_bytes > 0.0 && total > device_bytes {
            return Err(WebError::new(
                "INSUFFICIENT_MEMORY",
                format!(
                    "this model needs about {} on {backend} (KV cache {} for {} positions), more than this device's {} (navigator.deviceMemory)",
                    mb(total),
                    mb(self.parts.kv as f64),
                    self.parts.n_ctx,
                    mb(device_bytes)
                ),
            ));
        }
        Ok(())
    }
}

/// The memory a model will need, from the first bytes of its file (`file_size`: the whole
/// file's length; `context`: positions, 0 for the trained context), as JSON: the parts and
/// the wasm (and GPU) bytes per backend; or `{"need_bytes": n}` when the header runs past
/// `prefix` (fetch the first `n` bytes and ask again).
#[wasm_bindgen(js_name = estimateMemory)]
pub fn estimate_memory(prefix: &[u8], file_size: f64, context: u32) -> Result<String, JsValue> {
    if !(file_size.is_finite() && file_size >= prefix.len() as f64) {
        return Err(WebError::new("BAD_REQUEST", format!("file size {file_size} is not the file's length")).into());
    }
    let file = match GgufFile::from_header_prefix(prefix, file_size as u64).map_err(WebError::gguf)? {
        Ok(f) => f,
        Err(need) => return Ok(json!({ "need_bytes": need }).to_string()),
    };
    Ok(Need::of(&file, context as usize)?.to_json().to_string())
}
