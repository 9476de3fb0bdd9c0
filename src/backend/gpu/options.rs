//! The options of a GPU backend, one set for both device layers: which device, and the kernel
//! paths a user or a test can pin. Each option says where it applies; a device layer ignores
//! the ones it has nothing for (WebGPU has no integer dot products or cooperative matrices,
//! Vulkan no shader-f16 request of its own).

use crate::backend::gpu::strategy::MatmulVariant;

/// Options of a GPU backend (`WebGpuBackend::with_options`, `VulkanBackend::open`).
#[derive(Debug, Clone, Default)]
pub struct GpuOptions {
    /// Which device to open: an index into `list_adapters` (WebGPU) or `list_devices`
    /// (Vulkan); default the preferred one.
    pub device: Option<usize>,
    /// Split weights into parts of at most this many bytes even when the device allows larger
    /// bindings (tests use it to exercise split tensors on small ones).
    pub max_binding: Option<u64>,
    /// Matmul variant; default: [`MatmulVariant::Texture`] on CPU devices, else
    /// [`MatmulVariant::Workgroup`].
    pub matmul: Option<MatmulVariant>,
    /// Keep the matmuls from using subgroup operations even where the device has them (tests
    /// run both kernels): [`MatmulVariant::Texture`] shares activation loads through them,
    /// [`MatmulVariant::Workgroup`] reduces its sums with them.
    pub no_subgroups: bool,
    /// Multiply in f16 in [`MatmulVariant::Workgroup`]'s matmuls (rows of a multiple of 4
    /// values) where the device has f16 (dot_x4_f16.wgsl: products that could overflow are
    /// made in f32); default: on where the device has it. Other variants multiply in f32.
    pub f16_matmul: Option<bool>,
    /// Split attention across the KV length in chunks of this many positions whenever a query
    /// sees more; default: chunks of [`crate::backend::gpu::sizes::KV_CHUNK`] for decode on GPUs, no split on CPU
    /// devices (their few threads are kept busy by the heads alone).
    pub kv_chunk: Option<usize>,
    /// Round a matmul's activations first as the CPU backend and llama.cpp do for the weight
    /// format (Q8_0/Q8_K blocks, f16: quantize_act.wgsl), so the backends multiply the same
    /// values. Default: on. Off, the matmuls multiply f32 activations (one dispatch fewer per
    /// matmul), and the quantized mixture-of-experts and qwen35 fixtures land up to 0.11 from
    /// llama.cpp's answers where the rounded path stays within the golden README's dense rule.
    pub round_activations: Option<bool>,
    /// WebGPU: ask for a device without shader-f16 even where the adapter offers it; every
    /// kernel then runs in f32, as on adapters without the feature (Firefox, Chrome through
    /// ANGLE on Linux, some NVIDIA setups). Tests and the browser package's `webgpu: {f16:
    /// false}`.
    pub no_f16: bool,
    /// Vulkan: multiply Q8_0 weights held in buffers with packed integer dot products
    /// (matmul_dot.wgsl, llama.cpp's integer arithmetic). Default: where the device
    /// accelerates them; `Some(true)` also where it only emulates them (tests), `Some(false)`
    /// never. Needs [`GpuOptions::round_activations`] (the activations become Q8_0 blocks).
    pub integer_dot: Option<bool>,
    /// Vulkan: multiply more than [`crate::backend::gpu::sizes::MATMUL_ROWS`] activation rows by weights held in
    /// buffers (of any format but F32) with cooperative matrices (matmul_coop.wgsl,
    /// VK_KHR_cooperative_matrix). Default: where the device offers a shape the kernels use
    /// and matmuls take [`MatmulVariant::Workgroup`] (GPUs); `Some(true)` wherever the device
    /// has them (lavapipe emulates them, slowly), `Some(false)` never.
    pub cooperative_matrix: Option<bool>,
    /// Vulkan: upload and read back through staging buffers even where the host sees device
    /// memory.
    pub force_staging: bool,
    /// Vulkan: where the pipeline cache lives (default `vulkan::cache::default_dir`);
    /// `Some(None)` keeps it in memory only.
    pub pipeline_dir: Option<Option<std::path::PathBuf>>,
}
