//! The GPU layer shared by the GPU backends (WebGPU through wgpu, Vulkan through ash):
//! everything about running a kernel that does not touch a device.
//!
//! - [`ops`]: the op bodies both backends share (check, plan, record through [`ops::Record`]);
//! - [`compose`] and [`kernels`]: the WGSL kernel variants, composed from `shaders/` at build
//!   time, and the [`Kernel`] naming one of them;
//! - [`Strategy`]: which variant an op uses on a device (matmul layout, subgroups, f16
//!   products, split attention), decided once from the device's features;
//! - [`plan`]: per op, the [`Dispatch`] (kernel, parameter block, grid) for given shapes, with
//!   the GPU-specific checks (32-bit indices, grid limits) on top of the shared
//!   [`super::checks`];
//! - [`texlayout`]: how texture-held weights lay out their blocks.
//!
//! A device layer binds its buffers to a dispatch's bindings (numbered as in the kernel's
//! WGSL) and records it.

pub mod compose;
pub mod kernels;
pub mod ops;
pub mod plan;
pub mod texlayout;

pub use kernels::{AttnPass, Kernel};

use super::checks::shape;
use super::BackendError;
use crate::quant::GgmlType;

/// Workgroups per grid dimension (WebGPU's guaranteed minimum of the limit).
pub const MAX_GRID: u32 = 65535;
/// Activation rows per matmul workgroup (`R` in matmul.wgsl).
pub const MATMUL_ROWS: usize = 8;
/// Largest head size of the narrow attention variant (the wide one takes
/// [`super::MAX_HEAD_DIM`]).
pub const NARROW_HEAD_DIM: usize = 256;
/// Bytes per texture row of texture-held weights (4096 Rgba32Uint texels; bytes_tex.wgsl).
pub const TEX_ROW_BYTES: u64 = 4096 * 16;
/// KV positions per workgroup of split attention on GPUs (see [`Strategy::kv_chunk`]).
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

/// One kernel launch: which kernel, its parameter block (binding 0), data of its own for one
/// storage binding (token ids, positions, gather ids: `(binding, bytes)`), and its grid.
#[derive(Debug, Clone, PartialEq)]
pub struct Dispatch {
    pub kernel: Kernel,
    pub params: Vec<u8>,
    pub extra: Option<(u32, Vec<u8>)>,
    pub groups: (u32, u32, u32),
}

/// How a matmul spreads over invocations (all compute the same sums in f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatmulVariant {
    /// A workgroup per weight row, chunks reduced in workgroup memory (GPUs).
    Workgroup,
    /// An invocation per weight row, no workgroup memory or barriers.
    Rows,
    /// [`MatmulVariant::Rows`] with the weights in textures and the activations in a uniform
    /// buffer: CPU adapters (Mesa lavapipe), which load storage buffers one SIMD lane at a time
    /// but fetch texels and uniforms with vector code (see matmul_tex.wgsl). Matrices whose rows
    /// do not fit its layout (a row length not a multiple of 4 or above 16384) use `Rows`.
    Texture,
}

/// Which kernel variants a device runs, decided once from its features and the options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Strategy {
    pub matmul: MatmulVariant,
    /// Whether matmul_tex.wgsl shares activation loads through subgroups (of 8 to 64 lanes).
    pub tex_subgroups: bool,
    /// Whether matmul.wgsl reduces its sums with subgroup operations (any subgroup size).
    pub reduce_subgroups: bool,
    /// Whether matmul.wgsl multiplies in f16 (devices with shader-f16).
    pub f16_matmul: bool,
    /// Split attention's chunk size (`None`: never split).
    pub kv_chunk: Option<usize>,
    /// Split for any number of query rows (the chunk was asked for), not only decode.
    pub split_any_rows: bool,
    /// The device's largest storage binding, in bytes.
    pub max_storage: u64,
}

impl Strategy {
    /// The storage-buffer matmul kernel for rows of `n_in` values of type `ty`.
    pub fn matmul_kernel(&self, ty: GgmlType, n_in: usize) -> Kernel {
        match self.matmul {
            MatmulVariant::Workgroup => {
                let width = if n_in.is_multiple_of(4) { 4 } else { 1 };
                Kernel::Matmul {
                    ty,
                    width,
                    subgroup: self.reduce_subgroups,
                    f16: width == 4 && self.f16_matmul,
                }
            }
            MatmulVariant::Rows | MatmulVariant::Texture => Kernel::MatmulRows(ty),
        }
    }

    /// Whether a matrix of rows of `n_in` values goes into textures (matmul_tex.wgsl needs
    /// whole vec4s per row and at least one row in the uniform window).
    pub fn textured(&self, n_in: usize) -> bool {
        self.matmul == MatmulVariant::Texture && n_in.is_multiple_of(4) && n_in * 4 <= X_WINDOW_BYTES
    }

    /// The texture matmul kernel for a tile of `rows` activation rows (the variant with the
    /// fewest row slots that holds them: 1, 2, 4 or 8).
    pub fn matmul_tex_kernel(&self, ty: GgmlType, rows: usize) -> Kernel {
        Kernel::MatmulTex {
            ty,
            rows: rows.next_power_of_two() as u8,
            subgroup: self.tex_subgroups,
        }
    }
}

/// A value that must fit the kernels' u32 indices.
pub fn u(op: &'static str, v: usize) -> Result<u32, BackendError> {
    u32::try_from(v).map_err(|_| shape(op, format!("{v} exceeds the 32-bit index range")))
}

/// Parameter block from 32-bit words.
pub fn words(w: &[u32]) -> Vec<u8> {
    bytemuck::cast_slice(w).to_vec()
}

/// A 2-D grid of `n` workgroups: `(x, y)` with `x * y >= n`, `x` passed to the kernel.
pub fn grid(n: usize) -> (u32, u32) {
    let n = n.max(1);
    let x = n.min(MAX_GRID as usize);
    (x as u32, n.div_ceil(x) as u32)
}

/// Rows per part of weight `name` (`n_out` rows of `row_bytes`): at most `max_binding` bytes
/// of rows, and in texture parts (`texture`: the texture's bytes and the row stride there) at
/// most what one texture holds. An error when not even one row fits a binding.
pub fn rows_per_part(
    name: &str,
    row_bytes: usize,
    n_out: usize,
    max_binding: u64,
    texture: Option<(u64, usize)>,
) -> Result<usize, BackendError> {
    let mut rows = (max_binding as usize / row_bytes).min(n_out);
    if let Some((bytes, stride)) = texture {
        rows = rows.min(bytes as usize / stride);
    }
    if rows == 0 {
        return Err(BackendError::BadTensor {
            tensor: name.to_string(),
            problem: format!(
                "one row ({row_bytes} bytes) exceeds the device's largest weight binding ({max_binding} bytes)"
            ),
        });
    }
    Ok(rows)
}
