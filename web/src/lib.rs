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

/// The CPU backend's op profile recorded so far (JSON, see `tinyllm::backend::cpu::profile`),
/// then recording turned on (cleared) or off: where a pass's time goes, and what only one
/// thread does.
#[wasm_bindgen(js_name = cpuProfile)]
pub fn cpu_profile(enable: bool) -> String {
    let report = tinyllm::backend::cpu::profile::report().to_string();
    tinyllm::backend::cpu::profile::enable(enable);
    report
}

/// The cost of handing an op's tasks to the CPU workers, in microseconds per op (JSON:
/// `{"threads", "ops", "serial_us", "rayon_us", "team_us"}`): `ops` ops of `4 · threads` empty
/// tasks each in one pass, each op after `serial` steps of work on the calling thread alone (as
/// a decode step's norms and quantizations come between its matmuls), handed over by rayon
/// (which lets idle workers sleep and wakes them, as every op was before the team) and by the
/// team of `tinyllm::backend::cpu::team`. The serial work's own time is taken off. Threaded
/// build only; the browser bench calls it from a worker.
#[cfg(feature = "threads")]
#[wasm_bindgen(js_name = measureDispatch)]
pub fn measure_dispatch(ops: u32, serial: u32) -> Result<String, JsValue> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let pool = tinyllm::backend::cpu::pool::Pool::new(0).map_err(error::WebError::backend)?;
    let threads = pool.threads();
    let now = js_sys::Date::now;
    let sink = AtomicUsize::new(0);
    let work = || {
        let mut x = sink.load(Ordering::Relaxed) as u64 | 1;
        for _ in 0..serial {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407));
        }
        sink.fetch_add(x as usize & 1, Ordering::Relaxed);
    };
    let op = || {
        work();
        pool.for_each_index(4 * threads, |i| {
            sink.fetch_add(i, Ordering::Relaxed);
        })
    };
    let t = now();
    (0..ops).for_each(|_| work());
    let alone = now() - t;
    let t = now();
    pool.run_without_team(|| (0..ops).for_each(|_| op()));
    let rayon = now() - t;
    let t = now();
    pool.run(|| (0..ops).for_each(|_| op()));
    let team = now() - t;
    let us = |ms: f64| 1000.0 * ms / f64::from(ops.max(1));
    Ok(
        serde_json::json!({"threads": threads, "ops": ops, "serial_us": us(alone),
        "rayon_us": us(rayon - alone), "team_us": us(team - alone)})
        .to_string(),
    )
}
