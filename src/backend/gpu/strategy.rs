//! Which kernel variants a device runs ([`Strategy`], [`MatmulVariant`]) and how weights split
//! into parts that fit a binding ([`rows_per_part`]).

use super::kernels::Kernel;
use super::sizes::X_WINDOW_BYTES;
use crate::backend::error::BackendError;
use crate::quant::GgmlType;

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
                    // The codebook formats multiply in f32 even where f16 products are on: with f16 products
                    // the llama IQ3_XXS fixture's probabilities moved 6.5e-2 from llama.cpp's on lavapipe,
                    // beyond the 5e-2 rule; in f32 every IQ fixture is within it.
                    f16: width == 4 && self.f16_matmul && !super::kernels::codebook(ty),
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
