//! Browser bindings for tinyllm. For now this exposes GGUF inspection to JavaScript. The engine
//! it will wrap already builds for wasm32 with the WebGPU backend on the browser's WebGPU:
//! `tinyllm::backend::AnyBackend::open_async`, `tinyllm::engine::Engine` and
//! `tinyllm::engine::generate_async` (every readback awaited on the event loop), and
//! `tinyllm::openai` for OpenAI-shaped requests and chunks; the npm package and the chat page
//! are the next step.

use wasm_bindgen::prelude::*;

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
