// Activations as the CPU backend (and ggml's x86 CPU backend) hand them to a matmul over
// weights of a given format, written back as the f32 values they stand for, so a GPU matmul
// over them computes what llama.cpp's integer dot products compute (up to f32 summation
// order). Without it the GPU multiplies the unrounded activations, and in models that amplify
// small differences (routed experts, recurrent layers) that alone moved probabilities by 0.04.
//
// Modes (P.mode), one invocation per block of P.block values:
//   0  Q8_0 (32 values; quantize_row_q8_0): d = max|x| / 127 kept as f16,
//      q = round(x · 127 / max|x|), ties to even (WGSL's round); value q · d.
//   1  Q8_K (256 values; quantize_row_q8_K): m = the value of largest magnitude (the first),
//      iscale = -127 / m, q = min(round(iscale · x), 127), d = 1 / iscale in f32; value q · d.
//   2  F16 (one value per block): x rounded to f16.
//   3  BF16: x rounded to bf16 (nearest, ties to even).
// A value rounded to zero is +0, as ggml's int8 0 times its scale is.

struct Params {
    len: u32,
    block: u32,
    mode: u32,
    grid_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;

fn to_f16(v: f32) -> f32 {
    return unpack2x16float(pack2x16float(vec2<f32>(v, 0.0))).x;
}

fn plus_zero(q: f32) -> f32 {
    return select(q, 0.0, q == 0.0);
}

fn to_bf16(v: f32) -> f32 {
    let b = bitcast<u32>(v);
    return bitcast<f32>((b + 0x7fffu + ((b >> 16u) & 1u)) & 0xffff0000u);
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * P.grid_x * 64u;
    let b0 = i * P.block;
    if (b0 >= P.len) {
        return;
    }
    if (P.mode == 2u) {
        Y[b0] = to_f16(X[b0]);
        return;
    }
    if (P.mode == 3u) {
        Y[b0] = to_bf16(X[b0]);
        return;
    }
    var amax = 0.0;
    var m = 0.0;
    for (var j = 0u; j < P.block; j++) {
        let v = X[b0 + j];
        if (abs(v) > amax) {
            amax = abs(v);
            m = v;
        }
    }
    if (amax == 0.0) {
        for (var j = 0u; j < P.block; j++) {
            Y[b0 + j] = 0.0;
        }
        return;
    }
    if (P.mode == 0u) {
        let id = 127.0 / amax;
        let d = to_f16(amax / 127.0);
        for (var j = 0u; j < P.block; j++) {
            Y[b0 + j] = plus_zero(round(X[b0 + j] * id)) * d;
        }
    } else {
        let iscale = -127.0 / m;
        let d = 1.0 / iscale;
        for (var j = 0u; j < P.block; j++) {
            Y[b0 + j] = plus_zero(min(round(iscale * X[b0 + j]), 127.0)) * d;
        }
    }
}
