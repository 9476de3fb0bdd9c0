// Element-wise ops of mixture-of-experts FFNs, one invocation per output value:
// `combine` sums each row's expert outputs by the router's weights (`moe_combine`: slots in
// order from 0, as the CPU does), `swiglu_oai` is gpt-oss's clamped SwiGLU
// (`backend::moe::swiglu_oai`).

struct Params {
    // combine: rows * width outputs; swiglu_oai: values.
    len: u32,
    width: u32,
    slots: u32,
    grid_x: u32,
    alpha: f32,
    limit: f32,
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> X: array<f32>;
@group(0) @binding(2) var<storage, read> Y: array<f32>;
@group(0) @binding(3) var<storage, read> WTS: array<f32>;

fn index(gid: vec3<u32>) -> u32 {
    return gid.x + gid.y * P.grid_x * 256u;
}

// X[r, i] = sum_j WTS[r * slots + j] * Y[(r * slots + j) * width + i].
@compute @workgroup_size(256)
fn combine(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    if (i >= P.len) {
        return;
    }
    let r = i / P.width;
    let c = i % P.width;
    var acc = 0.0;
    for (var j = 0u; j < P.slots; j++) {
        let p = r * P.slots + j;
        acc += WTS[p] * Y[p * P.width + c];
    }
    X[i] = acc;
}

// X = min(g, limit) * sigmoid(alpha * min(g, limit)) * (clamp(Y, -limit, limit) + 1).
@compute @workgroup_size(256)
fn swiglu_oai(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    if (i >= P.len) {
        return;
    }
    let g = min(X[i], P.limit);
    let u = clamp(Y[i], -P.limit, P.limit);
    X[i] = g / (1.0 + exp(-P.alpha * g)) * (u + 1.0);
}
