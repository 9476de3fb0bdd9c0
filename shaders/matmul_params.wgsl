// Parameters of every matmul kernel (matmul.wgsl, matmul_rows.wgsl, matmul_tex.wgsl): the
// backend fills this one layout for all of them.
struct Params {
    n_in: u32,
    n_out: u32,
    // Activation rows (matmul_tex.wgsl: in the tile, at most R).
    rows: u32,
    // Bytes from one weight row to the next (texture rows: a multiple of 16).
    row_bytes: u32,
    n_chunks: u32,
    out_stride: u32,
    out_off: u32,
    grid_x: u32,
    // First output row of the tile (matmul_tex.wgsl; 0 for the others).
    row0: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
