//! The fixed sizes the WGSL kernels are written for (workgroup shapes, windows, limits), in
//! one place for the plans and the device layers.

/// Workgroups per grid dimension (WebGPU's guaranteed minimum of the limit).
pub const MAX_GRID: u32 = 65535;
/// Activation rows per matmul workgroup (`R` in matmul.wgsl).
pub const MATMUL_ROWS: usize = 8;
/// Largest head size of the narrow attention variant (the wide one takes
/// [`crate::backend::attn::MAX_HEAD_DIM`]).
pub const NARROW_HEAD_DIM: usize = 256;
/// Bytes per texture row of texture-held weights (4096 Rgba32Uint texels; bytes_tex.wgsl).
pub const TEX_ROW_BYTES: u64 = 4096 * 16;
/// KV positions per workgroup of split attention on GPUs (see [`super::strategy::Strategy::kv_chunk`]).
pub const KV_CHUNK: usize = 256;
/// Most query rows for which a GPU splits attention by default (decode, small batches).
pub const SPLIT_MAX_ROWS: usize = 8;
/// Bytes of the uniform window matmul_tex.wgsl reads its activation tile from.
pub const X_WINDOW_BYTES: usize = 65536;
/// Widest key heads of delta_net.wgsl (`MAX_DK`): each invocation keeps one column of a
/// head's state, `d_k` values, in a private array of this length.
pub const DELTA_MAX_DK: usize = 128;
/// State columns per workgroup of delta_net.wgsl (`WG`, its workgroup size).
pub const DELTA_COLUMNS: usize = 64;
