// Append `n` values of K and V at element `start` of the caches. The caches hold f32 rounded to
// f16, the values llama.cpp's F16 cache holds.

struct Params {
    n: u32,
    start: u32,
    grid_x: u32,
    pad: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> K: array<f32>;
@group(0) @binding(2) var<storage, read> V: array<f32>;
@group(0) @binding(3) var<storage, read_write> KC: array<f32>;
@group(0) @binding(4) var<storage, read_write> VC: array<f32>;

fn f16r(x: f32) -> f32 {
    return unpack2x16float(pack2x16float(vec2<f32>(x, 0.0))).x;
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * P.grid_x * 256u;
    if (i < P.n) {
        KC[P.start + i] = f16r(K[i]);
        VC[P.start + i] = f16r(V[i]);
    }
}
