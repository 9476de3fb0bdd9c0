// Y[t, :] = W[T[t] - row0, :] * scale for the tokens whose row lies in this part of the table
// (tables larger than one storage binding are split into parts by rows; one dispatch each).
// One invocation per (token, chunk of 32 values).

struct Params {
    n_in: u32,
    n_chunks: u32,
    row_bytes: u32,
    n_tok: u32,
    row0: u32,
    part_rows: u32,
    scale: f32,
    grid_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(2) var<storage, read> T: array<u32>;
@group(0) @binding(3) var<storage, read_write> Y: array<f32>;

var<private> wv: array<f32, 32>;

//INCLUDE bytes.wgsl
//INCLUDE QUANT

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let idx = gid.x + gid.y * P.grid_x * 64u;
    let t = idx / P.n_chunks;
    let c = idx % P.n_chunks;
    if (t >= P.n_tok) {
        return;
    }
    let tok = T[t];
    if (tok < P.row0 || tok >= P.row0 + P.part_rows) {
        return;
    }
    load_chunk((tok - P.row0) * P.row_bytes, c, P.n_in);
    let lim = min(32u, P.n_in - c * 32u);
    for (var i = 0u; i < lim; i++) {
        Y[t * P.n_in + c * 32u + i] = wv[i] * P.scale;
    }
}
