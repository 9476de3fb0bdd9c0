//! Loading a model while its file arrives: the JavaScript side fetches (or reads a `File`) and
//! pushes chunks; each tensor goes to the backend the moment its bytes are complete
//! (`tinyllm::gguf::stream`), so the whole file never sits in wasm memory. On WebGPU a large
//! matrix goes to the GPU in pieces of at most [`GPU_PIECE`] bytes as they arrive (its buffers
//! made when it begins), so the wasm memory holds one piece, not the tensor. On WebGPU the
//! uploads run inside an out-of-memory error scope: the browser reports a failed allocation
//! there, not as a return value, and [`ModelLoader::finish`] turns it into `GPU_OUT_OF_MEMORY`.

use std::sync::Arc;

use js_sys::Promise;
use tinyllm::backend::{AnyBackend, BackendKind};
use tinyllm::engine::Engine;
use tinyllm::gguf::stream::GgufStream;
use tinyllm::gguf::Value;
use tinyllm::model::Placement;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;

use crate::engine::WebEngine;
use crate::error::WebError;

#[cfg(not(target_feature = "atomics"))]
type GpuScope = tinyllm::backend::webgpu::wgpu::ErrorScopeGuard;

/// The largest piece of a matrix held in wasm memory on its way to the GPU (whole rows; a row
/// larger than this is one piece). Small beside the module and the tokenizer (about 45 MB
/// together for the real models), so the allocator's slack around it is too; a 2 GB model's
/// load makes about two thousand writes.
pub const GPU_PIECE: usize = 1 << 20;

/// A model being loaded. See the module docs.
#[wasm_bindgen]
pub struct ModelLoader {
    stream: Option<GgufStream>,
    backend: Option<AnyBackend>,
    placement: Placement,
    /// Whether the architecture and the memory were checked (once the first header is in).
    arch_checked: bool,
    /// What the memory check holds the model to: the context asked for, the wasm memory's
    /// ceiling and the device's memory (0: unknown). `None`: no check.
    limits: Option<(usize, f64, f64)>,
    #[cfg(not(target_feature = "atomics"))]
    oom: Option<GpuScope>,
}

fn kind(name: &str) -> Result<BackendKind, WebError> {
    BackendKind::ALL
        .iter()
        .find(|(_, n)| *n == name)
        .map(|(k, _)| *k)
        .ok_or_else(|| WebError::new("BAD_REQUEST", format!("unknown backend '{name}' (webgpu or cpu)")))
}

#[wasm_bindgen]
impl ModelLoader {
    /// A loader onto `backend` (`webgpu` or `cpu`, `threads` CPU workers) for a model in
    /// `parts` files (a split set streams part after part); a WebGPU device without
    /// shader-f16 unless `gpu_f16`.
    pub async fn create(backend: String, parts: u32, threads: u32, gpu_f16: bool) -> Result<ModelLoader, JsValue> {
        let kind = kind(&backend)?;
        let be = AnyBackend::open_async_with(kind, threads.max(1) as usize, gpu_f16)
            .await
            .map_err(WebError::backend)?;
        #[cfg(not(target_feature = "atomics"))]
        let oom = match &be {
            AnyBackend::WebGpu(g) => Some(
                g.device()
                    .push_error_scope(tinyllm::backend::webgpu::wgpu::ErrorFilter::OutOfMemory),
            ),
            _ => None,
        };
        Ok(ModelLoader {
            stream: Some(GgufStream::new(parts as usize).map_err(WebError::gguf)?),
            backend: Some(be),
            placement: Placement::new(GPU_PIECE),
            arch_checked: false,
            limits: None,
            #[cfg(not(target_feature = "atomics"))]
            oom,
        })
    }

    /// Refuse the model with `INSUFFICIENT_MEMORY` as soon as its header is in when it needs
    /// more than the tab has ([`crate::memory`]): `context` positions (0: the trained
    /// context), `wasm_bytes` the wasm memory's ceiling (wasm32: 4 GiB), `device_bytes` the
    /// device's memory where the browser says it (`navigator.deviceMemory`), else 0.
    #[wasm_bindgen(js_name = setLimits)]
    pub fn set_limits(&mut self, context: u32, wasm_bytes: f64, device_bytes: f64) {
        self.limits = Some((context as usize, wasm_bytes, device_bytes.max(0.0)));
    }

    /// The backend in use (`webgpu` or `cpu`).
    #[wasm_bindgen(getter)]
    pub fn backend(&self) -> String {
        self.backend
            .as_ref()
            .map(|b| tinyllm::backend::Backend::name(b).to_string())
            .unwrap_or_default()
    }

    /// What runs the kernels: the GPU adapter's name or the CPU kernel set.
    #[wasm_bindgen(getter)]
    pub fn device(&self) -> String {
        self.backend.as_ref().map(AnyBackend::detail).unwrap_or_default()
    }

    /// Start the next file of the model, of `size` bytes.
    pub fn begin(&mut self, size: f64) -> Result<(), JsValue> {
        if !(size.is_finite() && size >= 0.0) {
            return Err(WebError::new("BAD_REQUEST", format!("file size {size} is not a byte count")).into());
        }
        let stream = self.stream.as_mut().ok_or_else(finished)?;
        stream.begin(size as u64).map_err(WebError::gguf)?;
        Ok(())
    }

    /// The next bytes of the current file.
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), JsValue> {
        let (Some(stream), Some(be)) = (self.stream.as_mut(), self.backend.as_ref()) else {
            return Err(finished());
        };
        let backend = tinyllm::backend::Backend::name(be);
        #[cfg(not(target_feature = "atomics"))]
        let gpu_max_buffer = match be {
            AnyBackend::WebGpu(g) => g.device().limits().max_buffer_size as f64,
            _ => 0.0,
        };
        #[cfg(target_feature = "atomics")]
        let gpu_max_buffer = 0.0;
        stream
            .push_to(chunk, &mut self.placement.onto(be))
            .map_err(WebError::gguf)?;
        if self.arch_checked {
            return Ok(());
        }
        let Some(meta) = stream.metadata() else {
            return Ok(());
        };
        check_arch(meta)?;
        self.arch_checked = true;
        if let Some((context, wasm_bytes, device_bytes)) = self.limits {
            // A split set's first part holds only its own tensors: the check covers one-file
            // models. The stream lends its parsed header: a second parse (or a copy of the
            // header's bytes) would raise the very peak this check predicts.
            let checked = stream.with_first_header(|file| {
                crate::memory::Need::of(file, context)?.check(backend, wasm_bytes, device_bytes, gpu_max_buffer)
            });
            checked.unwrap_or(Ok(()))?;
        }
        Ok(())
    }

    /// Bytes received so far.
    #[wasm_bindgen(getter)]
    pub fn received(&self) -> f64 {
        self.stream.as_ref().map_or(0.0, |s| s.received() as f64)
    }

    /// The loaded model (a `Promise<WebEngine>`), once every byte has arrived: `context_size`
    /// positions (0: the model's trained context), `name` as responses report it.
    pub fn finish(&mut self, context_size: u32, name: String) -> Promise {
        let stream = self.stream.take();
        let backend = self.backend.take();
        let placed = std::mem::replace(&mut self.placement, Placement::new(GPU_PIECE)).into_placed();
        #[cfg(not(target_feature = "atomics"))]
        let oom = self.oom.take();
        future_to_promise(async move {
            let (Some(stream), Some(backend)) = (stream, backend) else {
                return Err(finished());
            };
            let file = Arc::new(stream.finish().map_err(WebError::gguf)?);
            #[cfg(not(target_feature = "atomics"))]
            if let Some(scope) = oom {
                if let Some(e) = scope.pop().await {
                    return Err(WebError::new(
                        "GPU_OUT_OF_MEMORY",
                        format!("the GPU cannot hold this model's weights: {e}"),
                    )
                    .into());
                }
            }
            let engine = Engine::load_placed(backend, file, placed).map_err(WebError::lib)?;
            let web = WebEngine::new(engine, context_size as usize, name).map_err(|e| WebError::engine(e, "model"))?;
            Ok(web.into())
        })
    }
}

fn finished() -> JsValue {
    WebError::new("INTERNAL", "this loader has already finished").into()
}

/// An architecture this build does not run is refused as soon as the header says so, before
/// the weights download.
fn check_arch(meta: &[(String, Value)]) -> Result<(), WebError> {
    let arch = meta
        .iter()
        .find(|(k, _)| k == "general.architecture")
        .and_then(|(_, v)| v.as_str());
    match arch {
        Some(a) if tinyllm::model::SUPPORTED.contains(&a) => Ok(()),
        Some(a) => Err(WebError::new(
            "UNSUPPORTED_ARCH",
            format!(
                "unsupported architecture '{a}' (supported: {})",
                tinyllm::model::SUPPORTED.join(", ")
            ),
        )),
        None => Err(WebError::new("BAD_GGUF", "the file has no general.architecture")),
    }
}
