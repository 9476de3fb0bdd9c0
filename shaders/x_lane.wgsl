// Activation loads of matmul_tex.wgsl, one uniform load per invocation and vec4.
fn x_own(xb: u32, lane: u32) -> vec4<f32> {
    return vec4<f32>(0.0);
}
// X vec4 `xb + i` (i < 8).
fn x_get(xb: u32, i: u32, own: vec4<f32>) -> vec4<f32> {
    return X[min(xb + i, 4095u)];
}
