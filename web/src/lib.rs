//! tinyllm in the browser: the wasm-bindgen layer under the `tinyllm` npm package (`web/js/`)
//! and its chat page. [`ModelLoader`] places a model's weights while its file streams in;
//! [`WebEngine`] answers OpenAI-shaped requests through the library's generation pipeline.
//! The package runs all of it in a Web Worker; JSON crosses the boundary as strings, errors
//! as `Error`s with a `code` ([`error`]).

pub mod engine;
pub mod error;
pub mod load;
pub mod memory;

pub use engine::WebEngine;
pub use load::ModelLoader;
/// `initThreadPool(n)` in JS: starts the CPU workers of the threaded build.
#[cfg(feature = "threads")]
pub use wasm_bindgen_rayon::init_thread_pool;

use wasm_bindgen::prelude::*;

#[wasm_bindgen(start)]
fn start() {
    console_error_panic_hook::set_once();
}

/// The `general.architecture` names this build runs.
#[wasm_bindgen(js_name = supportedArchitectures)]
pub fn supported_architectures() -> Vec<String> {
    tinyllm::model::SUPPORTED.iter().map(|s| s.to_string()).collect()
}

/// Parse a GGUF file held in memory and describe it as a JSON string
/// (`{"architecture", "tensor_count", "version"}`).
#[wasm_bindgen(js_name = inspectGguf)]
pub fn inspect_gguf(bytes: Vec<u8>) -> Result<String, JsError> {
    let file = tinyllm::gguf::GgufFile::from_bytes(bytes).map_err(|e| JsError::new(&e.to_string()))?;
    let arch = file.architecture().unwrap_or("unknown").to_string();
    Ok(serde_json::json!({
        "architecture": arch,
        "tensor_count": file.tensors().len(),
        "version": file.version,
    })
    .to_string())
}

/// Bytes of this module's linear memory. Wasm memory only grows, so this is also its peak.
#[wasm_bindgen(js_name = wasmMemoryBytes)]
pub fn wasm_memory_bytes() -> f64 {
    #[cfg(target_arch = "wasm32")]
    let pages = core::arch::wasm32::memory_size(0);
    #[cfg(not(target_arch = "wasm32"))]
    let pages = 0;
    (pages * 65536) as f64
}
