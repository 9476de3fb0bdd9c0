// Activations quantized to Q8_0 blocks for the integer-dot matmul (matmul_dot.wgsl): per
// block of 32 values, 8 words of packed int8 values (value j in byte j % 4 of word j / 4) and
// the f32 bits of the f16-rounded scale, by quantize_act.wgsl's Q8_0 rule (d = max|x| / 127
// kept as f16, q = round(x · 127 / max|x|), ties to even), so the values are the ones that
// rule hands the float kernels. One invocation per block; `len` is a multiple of 32.

struct Params {
    len: u32,
    block: u32,
    mode: u32,
    grid_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<u32>;

fn to_f16(v: f32) -> f32 {
    return unpack2x16float(pack2x16float(vec2<f32>(v, 0.0))).x;
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let b = gid.x + gid.y * P.grid_x * 64u;
    let b0 = b * 32u;
    if (b0 >= P.len) {
        return;
    }
    var amax = 0.0;
    for (var j = 0u; j < 32u; j++) {
        amax = max(amax, abs(X[b0 + j]));
    }
    let id = select(127.0 / amax, 0.0, amax == 0.0);
    let d = select(to_f16(amax / 127.0), 0.0, amax == 0.0);
    for (var w = 0u; w < 8u; w++) {
        var word = 0u;
        for (var k = 0u; k < 4u; k++) {
            let q = i32(round(X[b0 + 4u * w + k] * id));
            word |= (bitcast<u32>(q) & 0xffu) << (8u * k);
        }
        Y[b * 9u + w] = word;
    }
    Y[b * 9u + 8u] = bitcast<u32>(d);
}
