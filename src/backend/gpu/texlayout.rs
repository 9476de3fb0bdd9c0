//! How texture-held weights lay out their blocks (the CPU-adapter kernels, matmul_tex.wgsl).
//!
//! Texels are 16 bytes and a texel fetch is the unit of cost there, so the formats whose blocks
//! are not a multiple of 16 bytes (Q8_0 is 34, Q5_0 22, Q6_K 210) are split into two planes per
//! row: the quants of every block back to back (whole texels per block), then the small fields
//! (scales, high bits). The decoders in `shaders/quant/tex/` read that layout with a few
//! aligned texel fetches per chunk; every other format keeps its GGUF bytes, read through the
//! generic byte helpers. Only bytes move: the values decode exactly as from the GGUF blocks.

use crate::quant::GgmlType;

/// One run of bytes of a block: `len` bytes from offset `src` of the GGUF block go to offset
/// `dst` of the block's slot in plane `plane` (0: quants, 1: small fields).
#[derive(Debug, Clone, Copy)]
struct Segment {
    plane: usize,
    src: usize,
    len: usize,
    dst: usize,
}

const fn seg(plane: usize, src: usize, len: usize, dst: usize) -> Segment {
    Segment { plane, src, len, dst }
}

/// A two-plane layout: the slot size of a block in each plane and where its bytes go.
#[derive(Debug)]
struct Planes {
    slot: [usize; 2],
    segments: &'static [Segment],
}

const Q8_0_SEGMENTS: [Segment; 2] = [seg(0, 2, 32, 0), seg(1, 0, 2, 0)];
const Q5_0_SEGMENTS: [Segment; 3] = [seg(0, 6, 16, 0), seg(1, 0, 2, 0), seg(1, 2, 4, 4)];
const Q6_K_SEGMENTS: [Segment; 2] = [seg(0, 0, 208, 0), seg(1, 208, 2, 0)];

/// The two-plane layout of `ty`, or `None` when its blocks stay as they are.
fn planes(ty: GgmlType) -> Option<Planes> {
    use GgmlType::*;
    Some(match ty {
        // d: f16, qs: [i8; 32] -> qs (2 texels) | d.
        Q8_0 => Planes {
            slot: [32, 2],
            segments: &Q8_0_SEGMENTS,
        },
        // d: f16, qh: u32, qs: [u8; 16] -> qs (1 texel) | d, 2 bytes of padding, qh.
        Q5_0 => Planes {
            slot: [16, 8],
            segments: &Q5_0_SEGMENTS,
        },
        // ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16 -> the first 208 bytes
        // (13 texels) | d.
        Q6_K => Planes {
            slot: [208, 2],
            segments: &Q6_K_SEGMENTS,
        },
        _ => return None,
    })
}

/// Bytes from one row to the next in a texture: a multiple of 16 (every row starts a texel).
pub fn stride(ty: GgmlType, n_in: usize) -> usize {
    let blocks = n_in / ty.block_size();
    match planes(ty) {
        Some(p) => p.slot.iter().map(|s| (blocks * s).div_ceil(16) * 16).sum(),
        None => (blocks * ty.block_bytes()).div_ceil(16) * 16,
    }
}

/// `rows` rows of GGUF blocks (`row_bytes` each) laid out for a texture, `stride(ty, n_in)`
/// bytes per row; the tail up to `total` bytes is zero.
pub fn lay_out(ty: GgmlType, n_in: usize, data: &[u8], rows: usize, total: usize) -> Vec<u8> {
    let mut out = vec![0u8; total.max(rows * stride(ty, n_in))];
    lay_out_into(ty, n_in, data, rows, &mut out);
    out
}

/// [`lay_out`] into `out` (zeroed, at least `rows · stride(ty, n_in)` bytes): the streamed
/// placing lays a piece out straight into the bytes it carries to the texture.
pub fn lay_out_into(ty: GgmlType, n_in: usize, data: &[u8], rows: usize, out: &mut [u8]) {
    let bb = ty.block_bytes();
    let blocks = n_in / ty.block_size();
    let row_bytes = blocks * bb;
    let stride = stride(ty, n_in);
    for (r, row) in data.chunks_exact(row_bytes).take(rows).enumerate() {
        let Some(dst) = out.get_mut(r * stride..(r + 1) * stride) else {
            return;
        };
        match planes(ty) {
            None => dst[..row_bytes].copy_from_slice(row),
            Some(p) => {
                let base = [0, (blocks * p.slot[0]).div_ceil(16) * 16];
                for (b, block) in row.chunks_exact(bb).enumerate() {
                    for s in p.segments {
                        let at = base[s.plane] + b * p.slot[s.plane] + s.dst;
                        dst[at..at + s.len].copy_from_slice(&block[s.src..s.src + s.len]);
                    }
                }
            }
        }
    }
}
