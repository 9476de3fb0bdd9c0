// Q5_0 (22 bytes): d: f16, qh: u32 (fifth bit of value i is bit i), qs: [u8; 16] (nibbles as
// Q4_0); x = d * (q - 16) (q5_0_values.wgsl).
fn load_chunk(rb: u32, c: u32, n_in: u32) {
    let o = rb + c * 22u;
    let qs = vec4<u32>(w32(o + 6u), w32(o + 10u), w32(o + 14u), w32(o + 18u));
    q5_0_values(f16at(o), w32(o + 2u), qs);
}
