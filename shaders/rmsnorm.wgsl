// RMS norm of `groups` groups of `g` values times the weight N: one workgroup per group, the
// sum of squares reduced in workgroup memory (f32; the CPU sums in f64). Entry points: `main`
// (X into Y), `inplace` (Z in place) and `gated` (Z in place, then times SiLU of the gate X:
// the gated norm on a delta net's output heads, `Backend::rmsnorm_gated`).

struct Params {
    g: u32,
    groups: u32,
    eps: f32,
    grid_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
// X, Y, Z: [groups][g]; N: [g]. `gated` reads its gate z from X.
@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read> N: array<f32>;
@group(0) @binding(3) var<storage, read_write> Y: array<f32>;
@group(0) @binding(4) var<storage, read_write> Z: array<f32>;

const WG: u32 = 64u;
var<workgroup> red: array<f32, 64>;

fn reduce_sum(v: f32, li: u32) -> f32 {
    red[li] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (li < s) {
            red[li] += red[li + s];
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let grp = wid.x + wid.y * P.grid_x;
    if (grp >= P.groups) {
        return;
    }
    let base = grp * P.g;
    var s = 0.0;
    for (var i = li; i < P.g; i += WG) {
        s += X[base + i] * X[base + i];
    }
    let sum = reduce_sum(s, li);
    let scale = 1.0 / sqrt(sum / f32(P.g) + P.eps);
    for (var i = li; i < P.g; i += WG) {
        Y[base + i] = (X[base + i] * scale) * N[i];
    }
}

@compute @workgroup_size(64)
fn inplace(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let grp = wid.x + wid.y * P.grid_x;
    if (grp >= P.groups) {
        return;
    }
    let base = grp * P.g;
    var s = 0.0;
    for (var i = li; i < P.g; i += WG) {
        s += Z[base + i] * Z[base + i];
    }
    let sum = reduce_sum(s, li);
    let scale = 1.0 / sqrt(sum / f32(P.g) + P.eps);
    for (var i = li; i < P.g; i += WG) {
        Z[base + i] = (Z[base + i] * scale) * N[i];
    }
}

@compute @workgroup_size(64)
fn gated(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let grp = wid.x + wid.y * P.grid_x;
    if (grp >= P.groups) {
        return;
    }
    let base = grp * P.g;
    var s = 0.0;
    for (var i = li; i < P.g; i += WG) {
        s += Z[base + i] * Z[base + i];
    }
    let sum = reduce_sum(s, li);
    let scale = 1.0 / sqrt(sum / f32(P.g) + P.eps);
    for (var i = li; i < P.g; i += WG) {
        let z = X[base + i];
        Z[base + i] = (Z[base + i] * scale) * N[i] * (z / (1.0 + exp(-z)));
    }
}
