// Y[r, out_off + o] = sum_k W[o, k] * X[r, k] for weight rows o < n_out and activation rows r,
// with W kept as raw GGUF blocks (the quant snippet's `load_chunk` decodes 32 values at a time
// into `wv`). One workgroup per (weight row, tile of R activation rows): each invocation takes
// every WG-th chunk of the row, so one decoded chunk meets R activation rows (matvec is the
// R = 1 case of the same kernel). Arithmetic in f32, over activations rounded first as
// llama.cpp rounds them (quantize_act.wgsl; the backend's default) or f32 ones.
//
// Variants (src/backend/gpu/compose.rs): activations read as f32 or vec4 (`chunk_dot`, from
// dot_x1.wgsl or dot_x4.wgsl), and the workgroup's sums reduced in workgroup memory or with
// subgroup operations (`reduce_acc`, from reduce_workgroup.wgsl or reduce_subgroup.wgsl).

//INCLUDE matmul_io.wgsl

const WG: u32 = 32u;
const R: u32 = 8u;

var<private> wv: array<f32, 32>;
var<workgroup> red: array<f32, 256>; // [R][WG]

//INCLUDE bytes.wgsl
//INCLUDE QUANT
//INCLUDE DOT
//INCLUDE REDUCE

@compute @workgroup_size(32)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    //SUBGROUP SETUP
    let o = wid.x + wid.y * P.grid_x;
    let r0 = wid.z * R;
    if (o >= P.n_out) {
        return;
    }
    let nr = min(R, P.rows - r0);
    var acc: array<f32, 8>;
    for (var c = li; c < P.n_chunks; c += WG) {
        load_chunk(o * P.row_bytes, c, P.n_in);
        let k0 = c * 32u;
        let lim = min(32u, P.n_in - k0);
        // Constant trip counts only: the loops unroll and `wv`, `acc` stay in registers
        // (indexing them with a run-time value sends them to memory on CPU drivers).
        for (var r = 0u; r < R; r++) {
            if (r < nr) {
                acc[r] += chunk_dot((r0 + r) * P.n_in + k0, lim);
            }
        }
    }
    reduce_acc(li, acc);
    if (li < nr) {
        Y[(r0 + li) * P.out_stride + P.out_off + o] = red[li * WG];
    }
}
