// Activation loads of matmul_tex.wgsl shared through the subgroup (at least 8 lanes): lane l
// loads vec4 `xb + l % 8` of the chunk and the others read it with a shuffle, so a chunk costs
// one uniform load per invocation instead of eight (a uniform load is a loop of scalar loads
// on lavapipe, a shuffle a register move).
fn x_own(xb: u32, lane: u32) -> vec4<f32> {
    return X[min(xb + (lane & 7u), 4095u)];
}
// X vec4 `xb + i` (i < 8): every lane of the subgroup must be here (uniform control flow).
fn x_get(xb: u32, i: u32, own: vec4<f32>) -> vec4<f32> {
    return subgroupShuffle(own, i);
}
