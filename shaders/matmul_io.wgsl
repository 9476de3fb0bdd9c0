// Parameters and bindings shared by both matmul variants (matmul.wgsl, matmul_rows.wgsl): the
// backend fills one `Params` layout for either. X holds the f32 activations, Y the f32 outputs;
// the weights W (binding 1) come with the byte helpers (bytes.wgsl).

struct Params {
    n_in: u32,
    n_out: u32,
    rows: u32,
    row_bytes: u32,
    n_chunks: u32,
    out_stride: u32,
    out_off: u32,
    grid_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(2) var<storage, read> X: array<f32>;
@group(0) @binding(3) var<storage, read_write> Y: array<f32>;
