//! [`AnyBackend`]: every backend of this build behind one type, so the front ends (CLI, server,
//! browser) run one non-generic engine whichever device the user picks.
//!
//! Every op forwards to the backend that made its buffers; buffers of another backend are an
//! error (they cannot meet: one model, one backend). The forwarding is generated per method by
//! [`forward!`], and the [`Backend`] trait has no default methods, so an op this impl leaves
//! out does not compile (the bug this design removes: a default `attention_seqs` that the
//! CLI's dispatch never forwarded, so the server never reached the CPU's batched attention).
//! `tests/backend_dispatch.rs` also checks, from the sources, that every trait method is here.

use std::sync::Arc;

use super::cpu::{CpuBackend, CpuBuffer, CpuKv, CpuWeight};
use super::readback::MaybeSend;
#[cfg(tinyllm_webgpu)]
use super::webgpu::{WebGpuBackend, WebGpuBuffer, WebGpuKv, WebGpuWeight};
use crate::backend::attn::SeqAttn;
use crate::backend::error::BackendError;
use crate::backend::interface::Backend;
use crate::backend::kv::KvType;
use crate::backend::moe::{MatId, Route, Strided};
use crate::backend::readback::Readback;
use crate::backend::recurrent::{Conv, DeltaNet, Form, SeqRows};
use crate::backend::rope::Rope;
#[cfg(not(target_arch = "wasm32"))]
use crate::backend::vulkan::layer::{VulkanBackend, VulkanBuffer, VulkanKv, VulkanWeight};
use crate::gguf::{GgufFile, TensorView};
use crate::sample::Candidates;

/// Where a model runs (`--backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Cpu,
    WebGpu,
    /// Vulkan through ash (native builds).
    Vulkan,
}

impl BackendKind {
    /// Every kind, with the name a user types.
    pub const ALL: [(BackendKind, &'static str); 3] = [
        (BackendKind::Cpu, "cpu"),
        (BackendKind::WebGpu, "webgpu"),
        (BackendKind::Vulkan, "vulkan"),
    ];

    /// The name a user types.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Cpu => "cpu",
            BackendKind::WebGpu => "webgpu",
            BackendKind::Vulkan => "vulkan",
        }
    }
}

/// One backend of this build (one per process, so the variants' sizes do not matter).
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum AnyBackend {
    Cpu(CpuBackend),
    #[cfg(tinyllm_webgpu)]
    WebGpu(WebGpuBackend),
    #[cfg(not(target_arch = "wasm32"))]
    Vulkan(VulkanBackend),
}

pub enum AnyBuffer {
    Cpu(CpuBuffer),
    #[cfg(tinyllm_webgpu)]
    WebGpu(WebGpuBuffer),
    #[cfg(not(target_arch = "wasm32"))]
    Vulkan(VulkanBuffer),
}

pub enum AnyKv {
    Cpu(CpuKv),
    #[cfg(tinyllm_webgpu)]
    WebGpu(WebGpuKv),
    #[cfg(not(target_arch = "wasm32"))]
    Vulkan(VulkanKv),
}

pub enum AnyWeight {
    Cpu(CpuWeight),
    #[cfg(tinyllm_webgpu)]
    WebGpu(WebGpuWeight),
    #[cfg(not(target_arch = "wasm32"))]
    Vulkan(VulkanWeight),
}

impl AnyBackend {
    /// Open a backend of `kind` (`threads`: the CPU backend's workers, 0 for one per core);
    /// native callers block until the device is there.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open(kind: BackendKind, threads: usize) -> Result<Self, BackendError> {
        pollster::block_on(Self::open_async(kind, threads))
    }

    /// [`AnyBackend::open`], awaitable (the browser opens its GPU asynchronously).
    pub async fn open_async(kind: BackendKind, threads: usize) -> Result<Self, BackendError> {
        Self::open_async_with(kind, threads, true).await
    }

    /// [`AnyBackend::open_async`]; a WebGPU device without shader-f16 unless `gpu_f16` (f32
    /// kernels, as on adapters without the feature).
    pub async fn open_async_with(kind: BackendKind, threads: usize, gpu_f16: bool) -> Result<Self, BackendError> {
        #[cfg(tinyllm_webgpu)]
        let gpu = crate::backend::webgpu::WebGpuOptions {
            no_f16: !gpu_f16,
            ..Default::default()
        };
        #[cfg(not(tinyllm_webgpu))]
        let _ = gpu_f16;
        Ok(match kind {
            BackendKind::Cpu => AnyBackend::Cpu(CpuBackend::new(threads)?),
            #[cfg(tinyllm_webgpu)]
            BackendKind::WebGpu => {
                AnyBackend::WebGpu(WebGpuBackend::open(gpu).await.map_err(|e| BackendError::Unavailable {
                    backend: "webgpu",
                    reason: e.to_string(),
                })?)
            }
            #[cfg(not(target_arch = "wasm32"))]
            BackendKind::Vulkan => AnyBackend::Vulkan(VulkanBackend::new()?),
            #[cfg(target_arch = "wasm32")]
            BackendKind::Vulkan => {
                return Err(BackendError::Unavailable {
                    backend: "vulkan",
                    reason: "Vulkan is for native builds; in the browser use webgpu".into(),
                })
            }
            #[cfg(not(tinyllm_webgpu))]
            BackendKind::WebGpu => {
                return Err(BackendError::Unavailable {
                    backend: "webgpu",
                    reason: "this build has no WebGPU backend (the threaded wasm build is for the CPU)".into(),
                })
            }
        })
    }

    /// What runs the kernels: the CPU kernel set or the adapter's name.
    pub fn detail(&self) -> String {
        match self {
            AnyBackend::Cpu(b) => b.kernel_variant().to_string(),
            #[cfg(tinyllm_webgpu)]
            AnyBackend::WebGpu(b) => b.adapter().name.clone(),
            #[cfg(not(target_arch = "wasm32"))]
            AnyBackend::Vulkan(b) => b.device().info().name.clone(),
        }
    }

    /// Whether a GPU backend's device has f16 arithmetic in its shaders (false on the CPU).
    pub fn gpu_f16(&self) -> bool {
        match self {
            AnyBackend::Cpu(_) => false,
            #[cfg(tinyllm_webgpu)]
            AnyBackend::WebGpu(b) => b.device().features().contains(wgpu::Features::SHADER_F16),
            #[cfg(not(target_arch = "wasm32"))]
            AnyBackend::Vulkan(b) => b.device().enabled().float16,
        }
    }

    /// The Vulkan backend, if that is what runs (its profile and startup timings).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn vulkan(&self) -> Option<&VulkanBackend> {
        match self {
            AnyBackend::Vulkan(b) => Some(b),
            _ => None,
        }
    }

    /// Submissions, readbacks, dispatches and bind groups so far (the GPU backends).
    #[cfg(tinyllm_webgpu)]
    pub fn counters(&self) -> Option<super::webgpu::Counters> {
        match self {
            AnyBackend::Cpu(_) => None,
            AnyBackend::WebGpu(b) => Some(b.counters()),
            #[cfg(not(target_arch = "wasm32"))]
            AnyBackend::Vulkan(b) => {
                // Descriptor sets come from a pool reset every pass: nothing is created to
                // keep, so no bind groups count.
                let s = b.stats();
                Some(super::webgpu::Counters {
                    submissions: s.submissions,
                    readbacks: s.readbacks,
                    dispatches: s.dispatches,
                    bind_groups: 0,
                })
            }
        }
    }
}

fn mismatch(op: &'static str) -> BackendError {
    BackendError::Shape {
        op,
        problem: "buffers of another backend".into(),
    }
}

/// The backend of one argument's variant, or the mismatch error.
macro_rules! unwrap_arg {
    ($op:literal, $v:ident, $arg:ident: opt $ty:ident) => {
        let $arg = match $arg {
            None => None,
            Some($ty::$v(a)) => Some(a),
            #[allow(unreachable_patterns)]
            Some(_) => return Err(mismatch($op)),
        };
    };
    ($op:literal, $v:ident, $arg:ident: seqs) => {
        let mut unwrapped = Vec::with_capacity($arg.len());
        for s in $arg {
            #[allow(irrefutable_let_patterns)]
            let (AnyKv::$v(k_cache), AnyKv::$v(v_cache)) = (s.k_cache, s.v_cache) else {
                return Err(mismatch($op));
            };
            unwrapped.push(SeqAttn {
                row0: s.row0,
                p: s.p,
                k_cache,
                v_cache,
            });
        }
        let $arg = unwrapped.as_slice();
    };
    ($op:literal, $v:ident, $arg:ident: $ty:ident) => {
        #[allow(irrefutable_let_patterns)]
        let $ty::$v($arg) = $arg
        else {
            return Err(mismatch($op));
        };
    };
}

/// Forward `$call` to the backend whose variant every listed argument has; `wrap` puts a
/// returned device object into the matching variant.
macro_rules! forward {
    ($op:literal, $self:expr, [$($arg:ident: $($kind:ident)+),*], |$be:ident| $call:expr) => {
        match $self {
            AnyBackend::Cpu($be) => {
                $(unwrap_arg!($op, Cpu, $arg: $($kind)+);)*
                $call
            }
            #[cfg(tinyllm_webgpu)]
            AnyBackend::WebGpu($be) => {
                $(unwrap_arg!($op, WebGpu, $arg: $($kind)+);)*
                $call
            }
            #[cfg(not(target_arch = "wasm32"))]
            AnyBackend::Vulkan($be) => {
                $(unwrap_arg!($op, Vulkan, $arg: $($kind)+);)*
                $call
            }
        }
    };
    ($op:literal, $self:expr, wrap $ty:ident, |$be:ident| $call:expr) => {
        match $self {
            AnyBackend::Cpu($be) => Ok($ty::Cpu($call?)),
            #[cfg(tinyllm_webgpu)]
            AnyBackend::WebGpu($be) => Ok($ty::WebGpu($call?)),
            #[cfg(not(target_arch = "wasm32"))]
            AnyBackend::Vulkan($be) => Ok($ty::Vulkan($call?)),
        }
    };
}

impl Backend for AnyBackend {
    type Buffer = AnyBuffer;
    type Kv = AnyKv;
    type Weight = AnyWeight;

    fn run_pass<R: MaybeSend>(&self, f: impl FnOnce() -> R + MaybeSend) -> R {
        match self {
            AnyBackend::Cpu(b) => b.run_pass(f),
            #[cfg(tinyllm_webgpu)]
            AnyBackend::WebGpu(b) => b.run_pass(f),
            #[cfg(not(target_arch = "wasm32"))]
            AnyBackend::Vulkan(b) => b.run_pass(f),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            AnyBackend::Cpu(b) => b.name(),
            #[cfg(tinyllm_webgpu)]
            AnyBackend::WebGpu(b) => b.name(),
            #[cfg(not(target_arch = "wasm32"))]
            AnyBackend::Vulkan(b) => b.name(),
        }
    }

    fn load_weight(&self, file: &Arc<GgufFile>, name: &str) -> Result<AnyWeight, BackendError> {
        forward!("load_weight", self, wrap AnyWeight, |b| b.load_weight(file, name))
    }

    fn place_weight(&self, tensor: TensorView<'_>) -> Result<AnyWeight, BackendError> {
        forward!("place_weight", self, wrap AnyWeight, |b| b.place_weight(tensor))
    }

    fn alloc(&self, len: usize) -> Result<AnyBuffer, BackendError> {
        forward!("alloc", self, wrap AnyBuffer, |b| b.alloc(len))
    }

    fn alloc_kv(&self, len: usize, ty: KvType) -> Result<AnyKv, BackendError> {
        forward!("alloc_kv", self, wrap AnyKv, |b| b.alloc_kv(len, ty))
    }

    fn write(&self, dst: &mut AnyBuffer, src: &[f32]) -> Result<(), BackendError> {
        forward!("write", self, [dst: AnyBuffer], |b| b.write(dst, src))
    }

    fn read(&self, src: &AnyBuffer, len: usize) -> Result<Readback<Vec<f32>>, BackendError> {
        forward!("read", self, [src: AnyBuffer], |b| b.read(src, len))
    }

    fn embed(&self, table: &AnyWeight, tokens: &[u32], scale: f32, out: &mut AnyBuffer) -> Result<(), BackendError> {
        forward!("embed", self, [table: AnyWeight, out: AnyBuffer], |b| b.embed(table, tokens, scale, out))
    }

    fn matmul(&self, w: &AnyWeight, x: &AnyBuffer, rows: usize, out: &mut AnyBuffer) -> Result<(), BackendError> {
        forward!("matmul", self, [w: AnyWeight, x: AnyBuffer, out: AnyBuffer], |b| b.matmul(w, x, rows, out))
    }

    fn add_bias(&self, x: &mut AnyBuffer, bias: &AnyWeight, rows: usize) -> Result<(), BackendError> {
        forward!("add_bias", self, [x: AnyBuffer, bias: AnyWeight], |b| b.add_bias(x, bias, rows))
    }

    fn add(&self, x: &mut AnyBuffer, y: &AnyBuffer, len: usize) -> Result<(), BackendError> {
        forward!("add", self, [x: AnyBuffer, y: AnyBuffer], |b| b.add(x, y, len))
    }

    fn scale(&self, x: &mut AnyBuffer, len: usize, s: f32) -> Result<(), BackendError> {
        forward!("scale", self, [x: AnyBuffer], |b| b.scale(x, len, s))
    }

    fn hadamard(&self, x: &mut AnyBuffer, groups: usize, n: usize) -> Result<(), BackendError> {
        forward!("hadamard", self, [x: AnyBuffer], |b| b.hadamard(x, groups, n))
    }

    fn rmsnorm(
        &self,
        x: &AnyBuffer,
        w: &AnyWeight,
        groups: usize,
        eps: f32,
        out: &mut AnyBuffer,
    ) -> Result<(), BackendError> {
        forward!("rmsnorm", self, [x: AnyBuffer, w: AnyWeight, out: AnyBuffer], |b| b.rmsnorm(x, w, groups, eps, out))
    }

    fn rmsnorm_inplace(&self, x: &mut AnyBuffer, w: &AnyWeight, groups: usize, eps: f32) -> Result<(), BackendError> {
        forward!("rmsnorm", self, [x: AnyBuffer, w: AnyWeight], |b| b.rmsnorm_inplace(x, w, groups, eps))
    }

    fn rope(
        &self,
        x: &mut AnyBuffer,
        n_head: usize,
        head_dim: usize,
        positions: &[u32],
        rope: &Rope,
        factors: Option<&AnyWeight>,
    ) -> Result<(), BackendError> {
        forward!("rope", self, [x: AnyBuffer, factors: opt AnyWeight], |b| b.rope(
            x, n_head, head_dim, positions, rope, factors
        ))
    }

    fn kv_store(
        &self,
        cache: &mut AnyKv,
        src: &AnyBuffer,
        row0: usize,
        width: usize,
        positions: &[u32],
    ) -> Result<(), BackendError> {
        forward!("kv_store", self, [cache: AnyKv, src: AnyBuffer], |b| b.kv_store(
            cache, src, row0, width, positions
        ))
    }

    fn attention(
        &self,
        q: &AnyBuffer,
        seqs: &[SeqAttn<'_, AnyKv>],
        sinks: Option<&AnyWeight>,
        out: &mut AnyBuffer,
    ) -> Result<(), BackendError> {
        forward!("attention", self, [q: AnyBuffer, seqs: seqs, sinks: opt AnyWeight, out: AnyBuffer], |b| b
            .attention(q, seqs, sinks, out))
    }

    fn swiglu(&self, gate: &mut AnyBuffer, up: &AnyBuffer, len: usize) -> Result<(), BackendError> {
        forward!("swiglu", self, [gate: AnyBuffer, up: AnyBuffer], |b| b.swiglu(gate, up, len))
    }

    fn geglu(&self, gate: &mut AnyBuffer, up: &AnyBuffer, len: usize) -> Result<(), BackendError> {
        forward!("geglu", self, [gate: AnyBuffer, up: AnyBuffer], |b| b.geglu(gate, up, len))
    }

    fn sigmoid_mul(&self, x: &mut AnyBuffer, gate: &AnyBuffer, len: usize) -> Result<(), BackendError> {
        forward!("sigmoid_mul", self, [x: AnyBuffer, gate: AnyBuffer], |b| b.sigmoid_mul(x, gate, len))
    }

    fn swiglu_oai(
        &self,
        gate: &mut AnyBuffer,
        up: &AnyBuffer,
        len: usize,
        alpha: f32,
        limit: f32,
    ) -> Result<(), BackendError> {
        forward!("swiglu_oai", self, [gate: AnyBuffer, up: AnyBuffer], |b| b.swiglu_oai(gate, up, len, alpha, limit))
    }

    fn route_experts(
        &self,
        logits: &AnyBuffer,
        rows: usize,
        route: &Route,
        bias: Option<&AnyWeight>,
        ids: &mut AnyBuffer,
        weights: &mut AnyBuffer,
    ) -> Result<(), BackendError> {
        forward!("route_experts", self, [logits: AnyBuffer, bias: opt AnyWeight, ids: AnyBuffer, weights: AnyBuffer], |b| b
            .route_experts(logits, rows, route, bias, ids, weights))
    }

    fn matmul_id(
        &self,
        w: &AnyWeight,
        bias: Option<&AnyWeight>,
        x: &AnyBuffer,
        ids: &AnyBuffer,
        m: MatId,
        out: &mut AnyBuffer,
    ) -> Result<(), BackendError> {
        forward!("matmul_id", self, [w: AnyWeight, bias: opt AnyWeight, x: AnyBuffer, ids: AnyBuffer, out: AnyBuffer], |b| b
            .matmul_id(w, bias, x, ids, m, out))
    }

    fn moe_combine(
        &self,
        experts: &AnyBuffer,
        weights: &AnyBuffer,
        rows: usize,
        slots: usize,
        width: usize,
        out: &mut AnyBuffer,
    ) -> Result<(), BackendError> {
        forward!("moe_combine", self, [experts: AnyBuffer, weights: AnyBuffer, out: AnyBuffer], |b| b
            .moe_combine(experts, weights, rows, slots, width, out))
    }

    fn ssm_conv(
        &self,
        x: &AnyBuffer,
        w: &AnyWeight,
        p: &Conv,
        seq: SeqRows,
        state: &mut AnyBuffer,
        out: &mut AnyBuffer,
    ) -> Result<(), BackendError> {
        forward!("ssm_conv", self, [x: AnyBuffer, w: AnyWeight, state: AnyBuffer, out: AnyBuffer], |b| b
            .ssm_conv(x, w, p, seq, state, out))
    }

    fn delta_gates(
        &self,
        alpha: &mut AnyBuffer,
        beta: &mut AnyBuffer,
        rows: usize,
        dt_bias: &AnyWeight,
        a: &AnyWeight,
    ) -> Result<(), BackendError> {
        forward!("delta_gates", self, [alpha: AnyBuffer, beta: AnyBuffer, dt_bias: AnyWeight, a: AnyWeight], |b| b
            .delta_gates(alpha, beta, rows, dt_bias, a))
    }

    fn delta_form(&self, rows: usize) -> Form {
        match self {
            AnyBackend::Cpu(b) => b.delta_form(rows),
            #[cfg(tinyllm_webgpu)]
            AnyBackend::WebGpu(b) => b.delta_form(rows),
            #[cfg(not(target_arch = "wasm32"))]
            AnyBackend::Vulkan(b) => b.delta_form(rows),
        }
    }

    fn delta_net(
        &self,
        p: &DeltaNet,
        form: Form,
        seq: SeqRows,
        qkv: &AnyBuffer,
        gate: &AnyBuffer,
        beta: &AnyBuffer,
        state: &mut AnyBuffer,
        out: &mut AnyBuffer,
    ) -> Result<(), BackendError> {
        forward!("delta_net", self, [qkv: AnyBuffer, gate: AnyBuffer, beta: AnyBuffer, state: AnyBuffer, out: AnyBuffer], |b| b
            .delta_net(p, form, seq, qkv, gate, beta, state, out))
    }

    fn rmsnorm_gated(
        &self,
        x: &mut AnyBuffer,
        z: &AnyBuffer,
        w: &AnyWeight,
        groups: usize,
        eps: f32,
    ) -> Result<(), BackendError> {
        forward!("rmsnorm_gated", self, [x: AnyBuffer, z: AnyBuffer, w: AnyWeight], |b| b
            .rmsnorm_gated(x, z, w, groups, eps))
    }

    fn copy_strided(&self, src: &AnyBuffer, dst: &mut AnyBuffer, c: &Strided) -> Result<(), BackendError> {
        forward!("copy_strided", self, [src: AnyBuffer, dst: AnyBuffer], |b| b.copy_strided(src, dst, c))
    }

    fn copy_rows(
        &self,
        src: &AnyBuffer,
        row0: usize,
        rows: usize,
        width: usize,
        dst: &mut AnyBuffer,
    ) -> Result<(), BackendError> {
        forward!("copy_rows", self, [src: AnyBuffer, dst: AnyBuffer], |b| b.copy_rows(src, row0, rows, width, dst))
    }

    fn paste_rows(
        &self,
        src: &AnyBuffer,
        rows: usize,
        width: usize,
        dst: &mut AnyBuffer,
        row0: usize,
    ) -> Result<(), BackendError> {
        forward!("paste_rows", self, [src: AnyBuffer, dst: AnyBuffer], |b| b.paste_rows(src, rows, width, dst, row0))
    }

    fn argmax(&self, x: &AnyBuffer, rows: usize, width: usize) -> Result<Readback<Vec<u32>>, BackendError> {
        forward!("argmax", self, [x: AnyBuffer], |b| b.argmax(x, rows, width))
    }

    fn top_k(
        &self,
        x: &AnyBuffer,
        rows: usize,
        width: usize,
        k: usize,
        gather: &[u32],
    ) -> Result<Readback<Vec<Candidates>>, BackendError> {
        forward!("top_k", self, [x: AnyBuffer], |b| b.top_k(x, rows, width, k, gather))
    }
}
