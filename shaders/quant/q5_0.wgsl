// Q5_0 (22 bytes): d: f16, qh: u32 (fifth bit of value i is bit i), qs: [u8; 16] (nibbles as
// Q4_0); x = d * (q - 16).
fn load_chunk(rb: u32, c: u32, n_in: u32) {
    let o = rb + c * 22u;
    let d = f16at(o);
    let qh = w32(o + 2u);
    for (var m = 0u; m < 4u; m++) {
        let w = w32(o + 6u + 4u * m);
        for (var b = 0u; b < 4u; b++) {
            let j = 4u * m + b;
            let q = (w >> (8u * b)) & 0xffu;
            let h0 = ((qh >> j) << 4u) & 0x10u;
            let h1 = (qh >> (j + 12u)) & 0x10u;
            wv[j] = d * f32(i32((q & 0xfu) | h0) - 16);
            wv[j + 16u] = d * f32(i32((q >> 4u) | h1) - 16);
        }
    }
}
