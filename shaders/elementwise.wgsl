// Element-wise ops on the first `len` values of X (one invocation each): add, scale, bias,
// SwiGLU, GEGLU and the sigmoid gate. GELU mirrors ggml's CPU path (input and result rounded to f16) so the two
// backends agree to f32 rounding.

struct Params {
    len: u32,
    width: u32,
    s: f32,
    grid_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> X: array<f32>;
@group(0) @binding(2) var<storage, read> Y: array<f32>;

fn index(gid: vec3<u32>) -> u32 {
    return gid.x + gid.y * P.grid_x * 256u;
}

fn f16r(x: f32) -> f32 {
    return unpack2x16float(pack2x16float(vec2<f32>(x, 0.0))).x;
}

@compute @workgroup_size(256)
fn add(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    if (i < P.len) {
        X[i] = X[i] + Y[i];
    }
}

@compute @workgroup_size(256)
fn add_bias(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    if (i < P.len) {
        X[i] = X[i] + Y[i % P.width];
    }
}

@compute @workgroup_size(256)
fn scale(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    if (i < P.len) {
        X[i] = X[i] * P.s;
    }
}

@compute @workgroup_size(256)
fn swiglu(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    if (i < P.len) {
        let g = X[i];
        X[i] = g / (1.0 + exp(-g)) * Y[i];
    }
}

fn gelu(x: f32) -> f32 {
    if (x <= -10.0) {
        return 0.0;
    }
    if (x >= 10.0) {
        return x;
    }
    let h = f16r(x);
    // tanh saturates long before |a| = 15; clamping keeps exp-based tanh finite.
    let a = clamp(0.7978846 * h * (1.0 + 0.044715 * h * h), -15.0, 15.0);
    return f16r(0.5 * h * (1.0 + tanh(a)));
}

@compute @workgroup_size(256)
fn geglu(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    if (i < P.len) {
        X[i] = gelu(X[i]) * Y[i];
    }
}

@compute @workgroup_size(256)
fn sigmoid_mul(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = index(gid);
    if (i < P.len) {
        X[i] = X[i] / (1.0 + exp(-Y[i]));
    }
}
