// Q4_1 (20 bytes): d: f16, m: f16, qs: [u8; 16] (nibbles as Q4_0); x = d * q + m.
fn load_chunk(rb: u32, c: u32, n_in: u32) {
    let o = rb + c * 20u;
    let d = f16at(o);
    let m = f16at(o + 2u);
    for (var j = 0u; j < 16u; j++) {
        let q = b8(o + 4u + j);
        wv[j] = d * f32(q & 0xfu) + m;
        wv[j + 16u] = d * f32(q >> 4u) + m;
    }
}
