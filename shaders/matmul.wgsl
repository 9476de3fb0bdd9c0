// Y[r, out_off + o] = sum_k W[o, k] * X[r, k] for weight rows o < n_out and activation rows r,
// with W kept as raw GGUF blocks (the quant snippet's `load_chunk` decodes 32 values at a time
// into `wv`). One workgroup per (weight row, tile of R activation rows): each invocation takes
// every WG-th chunk of the row, so one decoded chunk meets R activation rows (matvec is the
// R = 1 case of the same kernel). Arithmetic in f32; activations are not quantized.

//INCLUDE matmul_io.wgsl

const WG: u32 = 32u;
const R: u32 = 8u;

var<private> wv: array<f32, 32>;
var<workgroup> red: array<f32, 256>; // [R][WG]

//INCLUDE bytes.wgsl
//INCLUDE QUANT

@compute @workgroup_size(32)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
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
                let xb = (r0 + r) * P.n_in + k0;
                var s = 0.0;
                for (var i = 0u; i < 32u; i++) {
                    s += select(0.0, wv[i] * X[xb + i], i < lim);
                }
                acc[r] += s;
            }
        }
    }
    for (var r = 0u; r < R; r++) {
        red[r * WG + li] = acc[r];
    }
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (li < s) {
            for (var r = 0u; r < R; r++) {
                red[r * WG + li] += red[r * WG + li + s];
            }
        }
        workgroupBarrier();
    }
    if (li < nr) {
        Y[(r0 + li) * P.out_stride + P.out_off + o] = red[li * WG];
    }
}
