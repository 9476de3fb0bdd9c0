//! Browser bindings for tinyllm. For now this exposes the engine's model inspection and
//! tokenizer to JavaScript; the inference `Engine`, the npm package and the chat page follow
//! once the forward graph and the WebGPU backend exist.

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
