//! Placing a matrix weight on the device a piece of rows at a time: its part buffers (or
//! textures) are made when the tensor begins, and each piece of rows is written where it
//! belongs. The browser's streamed load ([`crate::gguf::stream::Arrivals::pieces`]) hands a
//! large tensor over this way, so the wasm memory holds one piece, not the tensor (gemma's
//! 178 MB embedding was held twice: its streamed bytes and the mapped copy for the GPU).
//! [`Backend::place_weight`] writes all the rows at once through the same [`WeightWriter`].
//!
//! Buffer writes must start and end on 4-byte boundaries, and texture writes on texture rows
//! ([`TEX_ROW_BYTES`]): the writer keeps the few bytes past the last boundary until the next
//! piece (or the part's end, where it pads them with zeros, as the buffers and textures are).

use super::buffers::{Part, Store, WebGpuWeight};
use super::{texlayout, WebGpuBackend, TEX_ROW_BYTES};
use crate::backend::gpu::plan::PartRows;
use crate::backend::gpu::{rows_per_part, Kernel};
use crate::backend::BackendError;
use crate::gguf::TensorInfo;

/// Buffer writes' alignment (WebGPU's `COPY_BUFFER_ALIGNMENT`).
const ALIGN: usize = 4;

/// A matrix weight being written. See the module doc.
pub struct WeightWriter {
    weight: WebGpuWeight,
    textured: bool,
    /// Rows written so far (in order: a piece starts where the last one ended).
    next_row: usize,
    /// Bytes of the current part not yet written (fewer than [`ALIGN`] for a buffer, than a
    /// texture row for a texture: laid out there) and where in the part they start.
    tail: Vec<u8>,
    tail_at: usize,
}

impl WebGpuBackend {
    /// A writer for matrix `info` (`n_in` values per row, `n_out` rows; checked by the
    /// caller), its parts made and its kernels compiled; `short_rows` as
    /// [`WebGpuWeight::short_rows`].
    pub(super) fn weight_writer_for(
        &self,
        info: &TensorInfo,
        n_in: usize,
        n_out: usize,
        short_rows: Option<wgpu::Buffer>,
    ) -> Result<WeightWriter, BackendError> {
        let name = info.name.as_str();
        let ty = info.ty;
        let row_bytes = n_in / ty.block_size() * ty.block_bytes();
        let mut w = self.skeleton(info, n_in, n_out);
        w.short_rows = short_rows;
        // Stacks (experts, MLA's per-head matrices) are read by matmul_id.wgsl, from buffers.
        let textured = w.mats == 1 && self.strategy.textured(n_in);
        // Parts hold at most `max_binding` bytes of blocks (the option splits texture parts as it
        // splits buffers); a texture part also at most as many rows as the device's textures.
        let tex_bytes = TEX_ROW_BYTES * u64::from(self.ctx.limits.max_texture_dimension_2d);
        let texture = textured.then_some((tex_bytes, w.stride));
        let rows_per_part = rows_per_part(name, row_bytes, n_out, self.max_binding, texture)?;
        if textured {
            self.pipe_op("load_weight", self.strategy.matmul_tex_kernel(ty, 1))?;
            self.pipe_op("load_weight", Kernel::EmbedTex(ty))?;
        } else if w.mats > 1 {
            self.pipe_op("load_weight", Kernel::MatmulId(ty))?;
        } else {
            self.pipe_op("load_weight", self.strategy.matmul_kernel(ty, n_in))?;
            self.pipe_op("load_weight", Kernel::Embed(ty))?;
        }
        let mut row0 = 0;
        while row0 < n_out {
            let rows = rows_per_part.min(n_out - row0);
            let store = if textured {
                self.weight_texture(name, (rows * w.stride) as u64)
            } else {
                Store::Buffer(self.ctx.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(name),
                    size: ((rows * row_bytes) as u64).max(16).div_ceil(4) * 4,
                    usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                }))
            };
            w.parts.push(Part {
                rows: PartRows { row0, rows },
                store,
            });
            row0 += rows;
        }
        Ok(WeightWriter {
            weight: w,
            textured,
            next_row: 0,
            tail: Vec::new(),
            tail_at: 0,
        })
    }

    /// A texture of `bytes` bytes of texture rows (padded to a whole row).
    fn weight_texture(&self, label: &str, bytes: u64) -> Store {
        let height = bytes.div_ceil(TEX_ROW_BYTES).max(1);
        let tex = self.ctx.device.create_texture(&wgpu::TextureDescriptor {
            label: Some(label),
            size: wgpu::Extent3d {
                width: (TEX_ROW_BYTES / 16) as u32,
                height: height as u32,
                depth_or_array_layers: 1,
            },
            mip_level_count: 1,
            sample_count: 1,
            dimension: wgpu::TextureDimension::D2,
            format: wgpu::TextureFormat::Rgba32Uint,
            usage: wgpu::TextureUsages::TEXTURE_BINDING | wgpu::TextureUsages::COPY_DST,
            view_formats: &[],
        });
        let view = tex.create_view(&wgpu::TextureViewDescriptor::default());
        Store::Texture(tex, view)
    }
}

impl WeightWriter {
    /// Rows `row0..` of the matrix (`data`: whole rows in the file layout), right after the
    /// rows written so far.
    pub fn rows(&mut self, be: &WebGpuBackend, row0: usize, data: &[u8]) -> Result<(), BackendError> {
        let w = &self.weight;
        let rb = w.row_bytes;
        if row0 != self.next_row || !data.len().is_multiple_of(rb) || row0 + data.len() / rb > w.n_out {
            return Err(BackendError::BadTensor {
                tensor: w.name.clone(),
                problem: format!(
                    "{} bytes for rows from {row0}, after {} of its {} rows of {rb} bytes",
                    data.len(),
                    self.next_row,
                    w.n_out
                ),
            });
        }
        let mut data = data;
        while !data.is_empty() {
            let Some(p) = self
                .weight
                .parts
                .iter()
                .position(|p| p.rows.row0 + p.rows.rows > self.next_row)
            else {
                break;
            };
            let part = &self.weight.parts[p].rows;
            let local = self.next_row - part.row0;
            let n = (data.len() / rb).min(part.rows - local);
            let ends_part = local + n == part.rows;
            let (now, rest) = data.split_at(n * rb);
            if self.textured {
                self.texture_rows(be, p, local, n, now, ends_part);
            } else {
                self.buffer_rows(be, p, local * rb, now, ends_part);
            }
            self.next_row += n;
            data = rest;
            if ends_part {
                // Natively, queued writes hold staging memory until a submission: one per part
                // keeps a large model's load from holding all of it at once.
                be.ctx.queue.submit([]);
            }
        }
        Ok(())
    }

    /// `bytes` at byte `at` of buffer part `p`, the 4-byte-aligned prefix now (with the tail
    /// before it), the rest kept; padded and written where the part ends.
    fn buffer_rows(&mut self, be: &WebGpuBackend, p: usize, at: usize, bytes: &[u8], ends_part: bool) {
        let Store::Buffer(buf) = &self.weight.parts[p].store else {
            return;
        };
        let queue = &be.ctx.queue;
        let mut bytes = bytes;
        let mut at = at;
        if !self.tail.is_empty() {
            let fill = (ALIGN - self.tail.len()).min(bytes.len());
            self.tail.extend_from_slice(&bytes[..fill]);
            bytes = &bytes[fill..];
            at += fill;
            if self.tail.len() == ALIGN {
                queue.write_buffer(buf, self.tail_at as u64, &self.tail);
                self.tail.clear();
            }
        }
        if self.tail.is_empty() {
            let whole = bytes.len() / ALIGN * ALIGN;
            if whole > 0 {
                queue.write_buffer(buf, at as u64, &bytes[..whole]);
            }
            self.tail.extend_from_slice(&bytes[whole..]);
            self.tail_at = at + whole;
        }
        if ends_part && !self.tail.is_empty() {
            self.tail.resize(ALIGN, 0);
            queue.write_buffer(buf, self.tail_at as u64, &self.tail);
            self.tail.clear();
        }
        if ends_part {
            self.tail_at = 0;
        }
    }

    /// Rows `local..local + n` of texture part `p` (`bytes` in the file layout), laid out and
    /// written in whole texture rows; the laid-out bytes past the last whole texture row kept
    /// (padded and written where the part ends).
    fn texture_rows(&mut self, be: &WebGpuBackend, p: usize, local: usize, n: usize, bytes: &[u8], ends_part: bool) {
        let w = &self.weight;
        let Store::Texture(tex, _) = &w.parts[p].store else {
            return;
        };
        if self.tail.is_empty() {
            self.tail_at = local * w.stride;
        }
        let at = self.tail.len();
        // Exactly what is needed (no doubling): the wasm memory holds this beside the piece.
        self.tail.reserve_exact(n * w.stride);
        self.tail.resize(at + n * w.stride, 0);
        texlayout::lay_out_into(w.ty, w.n_in, bytes, n, &mut self.tail[at..]);
        let row = TEX_ROW_BYTES as usize;
        if ends_part {
            self.tail.resize(self.tail.len().div_ceil(row) * row, 0);
        }
        let whole = self.tail.len() / row;
        if whole == 0 {
            return;
        }
        be.ctx.queue.write_texture(
            wgpu::TexelCopyTextureInfo {
                texture: tex,
                mip_level: 0,
                origin: wgpu::Origin3d {
                    x: 0,
                    y: (self.tail_at / row) as u32,
                    z: 0,
                },
                aspect: wgpu::TextureAspect::All,
            },
            &self.tail[..whole * row],
            wgpu::TexelCopyBufferLayout {
                offset: 0,
                bytes_per_row: Some(row as u32),
                rows_per_image: None,
            },
            wgpu::Extent3d {
                width: (row / 16) as u32,
                height: whole as u32,
                depth_or_array_layers: 1,
            },
        );
        self.tail.drain(..whole * row);
        self.tail_at += whole * row;
        if ends_part {
            self.tail = Vec::new();
            self.tail_at = 0;
        }
    }

    /// Whether every row was written.
    pub fn is_complete(&self) -> bool {
        self.next_row == self.weight.n_out
    }

    /// The weight, once every row was written.
    pub fn finish(self) -> Result<WebGpuWeight, BackendError> {
        if self.next_row != self.weight.n_out {
            return Err(BackendError::BadTensor {
                tensor: self.weight.name.clone(),
                problem: format!("only {} of its {} rows arrived", self.next_row, self.weight.n_out),
            });
        }
        Ok(self.weight)
    }
}
