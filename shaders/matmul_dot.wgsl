// Y[r, out_off + o] = sum_k W[o, k] * X[r, k] for Q8_0 weights with integer dot products, as
// llama.cpp's vec_dot_q8_0_q8_0 computes it: each 32-value block's int8 products summed
// exactly (dot4I8Packed: one SDot instruction where the device has
// VK_KHR_shader_integer_dot_product), then scaled once by the two blocks' f16 scales.
// The activations come quantized to Q8_0 by quantize_q8_packed.wgsl: per block 8 words of
// packed int8 values and the scale's f32 bits (9 words), blocks of a row back to back.
// One workgroup per (weight row, tile of R activation rows), as matmul.wgsl.

//INCLUDE matmul_params.wgsl
@group(0) @binding(2) var<storage, read> X: array<u32>;
@group(0) @binding(3) var<storage, read_write> Y: array<f32>;

const WG: u32 = 32u;
const R: u32 = 8u;

var<workgroup> red: array<f32, 256>; // [R][WG]

//INCLUDE bytes.wgsl
//INCLUDE REDUCE

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
        // A Q8_0 block: the f16 scale, then 32 int8 values (34 bytes: not word-aligned).
        let wb = o * P.row_bytes + c * 34u;
        let dw = f16at(wb);
        var wq: array<u32, 8>;
        for (var j = 0u; j < 8u; j++) {
            wq[j] = w32(wb + 2u + 4u * j);
        }
        for (var r = 0u; r < R; r++) {
            if (r < nr) {
                let xb = ((r0 + r) * P.n_chunks + c) * 9u;
                var s = 0i;
                for (var j = 0u; j < 8u; j++) {
                    s += dot4I8Packed(wq[j], X[xb + j]);
                }
                acc[r] += f32(s) * (dw * bitcast<f32>(X[xb + 8u]));
            }
        }
    }
    reduce_acc(li, acc);
    if (li < nr) {
        Y[(r0 + li) * P.out_stride + P.out_off + o] = red[li * WG];
    }
}
