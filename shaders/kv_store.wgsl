// Store `rows` rows of `width` values of SRC (from row `row0`) in the cache at rows POS[i]. The
// cache holds f32 rounded to f16, the values llama.cpp's F16 cache holds.

struct Params {
    rows: u32,
    width: u32,
    row0: u32,
    grid_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> SRC: array<f32>;
@group(0) @binding(2) var<storage, read> POS: array<u32>;
@group(0) @binding(3) var<storage, read_write> CACHE: array<f32>;

fn f16r(x: f32) -> f32 {
    return unpack2x16float(pack2x16float(vec2<f32>(x, 0.0))).x;
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * P.grid_x * 256u;
    if (i < P.rows * P.width) {
        let r = i / P.width;
        let c = i % P.width;
        CACHE[POS[r] * P.width + c] = f16r(SRC[(P.row0 + r) * P.width + c]);
    }
}
