//! Placing a matrix weight on the device a piece of rows at a time: its part buffers (or
//! images) are made when the tensor begins, and each piece of rows is written where it
//! belongs. The browser's streamed load ([`crate::gguf::stream::Arrivals::pieces`]) hands a
//! large tensor over this way, so the wasm memory holds one piece, not the tensor (gemma's
//! 178 MB embedding was held twice: its streamed bytes and the mapped copy for the GPU).
//! [`crate::backend::interface::Backend::place_weight`] writes all the rows at once through the same
//! [`WeightWriter`].
//!
//! Buffer writes must start and end on 4-byte boundaries, and image writes on texture rows
//! ([`TEX_ROW_BYTES`]): the writer keeps the few bytes past the last boundary until the next
//! piece (or the part's end, where it pads them with zeros).

use super::buffers::{GpuWeight, Store};
use super::device::Device;
use super::texlayout;
use crate::backend::error::BackendError;
use crate::backend::gpu::sizes::TEX_ROW_BYTES;

/// Buffer writes' alignment (WebGPU's `COPY_BUFFER_ALIGNMENT`).
const ALIGN: usize = 4;

/// A matrix weight being written. See the module doc.
pub struct WeightWriter<D: Device> {
    weight: GpuWeight<D>,
    textured: bool,
    /// Bytes before the rows in each buffer part: the format's grid table
    /// ([`super::grids::leading_table`], written when the part was made).
    base: usize,
    /// Rows written so far (in order: a piece starts where the last one ended).
    next_row: usize,
    /// Bytes of the current part not yet written (fewer than [`ALIGN`] for a buffer, than a
    /// texture row for an image: laid out there) and where in the part they start.
    tail: Vec<u8>,
    tail_at: usize,
}

impl<D: Device> WeightWriter<D> {
    /// A writer for `weight`, whose parts are made (images where `textured`; buffers whose rows
    /// start at byte `base`).
    pub(super) fn new(weight: GpuWeight<D>, textured: bool, base: usize) -> Self {
        Self {
            weight,
            textured,
            base,
            next_row: 0,
            tail: Vec::new(),
            tail_at: 0,
        }
    }

    /// Rows `row0..` of the matrix (`data`: whole rows in the file layout), right after the
    /// rows written so far.
    /// `dev` is the device layer of the backend that made the writer
    /// ([`super::backend::GpuBackend::layer`]).
    pub fn rows(&mut self, dev: &D, row0: usize, data: &[u8]) -> Result<(), BackendError> {
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
                .position(|(rows, _)| rows.row0 + rows.rows > self.next_row)
            else {
                break;
            };
            let part = self.weight.parts[p].0;
            let local = self.next_row - part.row0;
            let n = (data.len() / rb).min(part.rows - local);
            let ends_part = local + n == part.rows;
            let (now, rest) = data.split_at(n * rb);
            if self.textured {
                self.image_rows(dev, p, local, n, now, ends_part)?;
            } else {
                self.buffer_rows(dev, p, self.base + local * rb, now, ends_part)?;
            }
            self.next_row += n;
            data = rest;
            if ends_part {
                dev.part_written()?;
            }
        }
        Ok(())
    }

    /// `bytes` at byte `at` of buffer part `p`, the 4-byte-aligned prefix now (with the tail
    /// before it), the rest kept; padded and written where the part ends.
    fn buffer_rows(&mut self, dev: &D, p: usize, at: usize, bytes: &[u8], ends_part: bool) -> Result<(), BackendError> {
        let Store::Buffer(buf) = &self.weight.parts[p].1 else {
            return Ok(());
        };
        let mut bytes = bytes;
        let mut at = at;
        if !self.tail.is_empty() {
            let fill = (ALIGN - self.tail.len()).min(bytes.len());
            self.tail.extend_from_slice(&bytes[..fill]);
            bytes = &bytes[fill..];
            at += fill;
            if self.tail.len() == ALIGN {
                dev.write_weight(buf, self.tail_at as u64, &self.tail)?;
                self.tail.clear();
            }
        }
        if self.tail.is_empty() {
            let whole = bytes.len() / ALIGN * ALIGN;
            if whole > 0 {
                dev.write_weight(buf, at as u64, &bytes[..whole])?;
            }
            self.tail.extend_from_slice(&bytes[whole..]);
            self.tail_at = at + whole;
        }
        if ends_part && !self.tail.is_empty() {
            self.tail.resize(ALIGN, 0);
            dev.write_weight(buf, self.tail_at as u64, &self.tail)?;
            self.tail.clear();
        }
        if ends_part {
            self.tail_at = 0;
        }
        Ok(())
    }

    /// Rows `local..local + n` of image part `p` (`bytes` in the file layout), laid out and
    /// written in whole texture rows; the laid-out bytes past the last whole texture row kept
    /// (padded and written where the part ends).
    fn image_rows(
        &mut self,
        dev: &D,
        p: usize,
        local: usize,
        n: usize,
        bytes: &[u8],
        ends_part: bool,
    ) -> Result<(), BackendError> {
        let w = &self.weight;
        let Store::Image(image) = &w.parts[p].1 else {
            return Ok(());
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
            return Ok(());
        }
        dev.write_image(image, (self.tail_at / row) as u64, &self.tail[..whole * row])?;
        self.tail.drain(..whole * row);
        self.tail_at += whole * row;
        if ends_part {
            self.tail = Vec::new();
            self.tail_at = 0;
        }
        Ok(())
    }

    /// Whether every row was written.
    pub fn is_complete(&self) -> bool {
        self.next_row == self.weight.n_out
    }

    /// The weight, once every row was written.
    pub fn finish(self) -> Result<GpuWeight<D>, BackendError> {
        if self.next_row != self.weight.n_out {
            return Err(BackendError::BadTensor {
                tensor: self.weight.name.clone(),
                problem: format!("only {} of its {} rows arrived", self.next_row, self.weight.n_out),
            });
        }
        Ok(self.weight)
    }
}
