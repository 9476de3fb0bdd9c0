// The routed matmul (ggml's mul_mat_id, `Backend::matmul_id`): pair p of `pairs` (row, slot)
// pairs gets Y[p, o] = sum_k W[e][o, k] * X[x_row, k] (+ B[e, o]) with e = IDS[p], for every
// row o < n_out of expert e's matrix. W stacks n_mat matrices of n_out rows (a 3-D GGUF
// tensor, raw blocks); this dispatch holds its global rows part_row0.. part_row0 + part_rows
// and writes only the outputs whose rows it holds (a stack split across bindings takes one
// dispatch per part). The input row is p (`per_slot`) or p / slots (a token's slots share
// it). One invocation per (pair, weight row), as matmul_rows.wgsl: only chosen experts are
// read. An id that names no matrix gives NaN outputs, never a read outside the stack.

struct Params {
    n_in: u32,
    n_out: u32,
    n_mat: u32,
    row_bytes: u32,
    n_chunks: u32,
    pairs: u32,
    slots: u32,
    per_slot: u32,
    part_row0: u32,
    part_rows: u32,
    has_bias: u32,
    grid_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(2) var<storage, read> X: array<f32>;
@group(0) @binding(3) var<storage, read_write> Y: array<f32>;
@group(0) @binding(4) var<storage, read> IDS: array<f32>;
@group(0) @binding(5) var<storage, read> B: array<f32>;

var<private> wv: array<f32, 32>;

//INCLUDE bytes.wgsl
//INCLUDE QUANT

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let idx = gid.x + gid.y * P.grid_x * 64u;
    let o = idx % P.n_out;
    let p = idx / P.n_out;
    if (p >= P.pairs) {
        return;
    }
    let id = IDS[p];
    if (!(id >= 0.0 && id < f32(P.n_mat) && fract(id) == 0.0)) {
        Y[p * P.n_out + o] = bitcast<f32>(0x7fc00000u);
        return;
    }
    let e = u32(id);
    let g = e * P.n_out + o;
    if (g < P.part_row0 || g >= P.part_row0 + P.part_rows) {
        return;
    }
    var xr = p;
    if (P.per_slot == 0u) {
        xr = p / P.slots;
    }
    let xb = xr * P.n_in;
    var acc = 0.0;
    for (var c = 0u; c < P.n_chunks; c++) {
        load_chunk((g - P.part_row0) * P.row_bytes, c, P.n_in);
        let k0 = c * 32u;
        let lim = min(32u, P.n_in - k0);
        var s = 0.0;
        for (var i = 0u; i < 32u; i++) {
            s += select(0.0, wv[i] * X[xb + k0 + i], i < lim);
        }
        acc += s;
    }
    if (P.has_bias != 0u) {
        acc += B[g];
    }
    Y[p * P.n_out + o] = acc;
}
