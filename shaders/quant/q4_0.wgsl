// Q4_0 (18 bytes): d: f16, qs: [u8; 16]; value j is the low nibble of qs[j], j + 16 the high
// nibble; x = d * (q - 8).
fn load_chunk(rb: u32, c: u32, n_in: u32) {
    let o = rb + c * 18u;
    let d = f16at(o);
    for (var m = 0u; m < 4u; m++) {
        let w = w32(o + 2u + 4u * m);
        for (var b = 0u; b < 4u; b++) {
            let q = (w >> (8u * b)) & 0xffu;
            wv[4u * m + b] = d * f32(i32(q & 0xfu) - 8);
            wv[4u * m + b + 16u] = d * f32(i32(q >> 4u) - 8);
        }
    }
}
