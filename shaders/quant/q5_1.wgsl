// Q5_1 (24 bytes): d: f16, m: f16, qh: u32, qs: [u8; 16] (as Q5_0); x = d * q + m.
fn load_chunk(rb: u32, c: u32, n_in: u32) {
    let o = rb + c * 24u;
    let d = f16at(o);
    let m = f16at(o + 2u);
    let qh = b32(o + 4u);
    for (var j = 0u; j < 16u; j++) {
        let q = b8(o + 8u + j);
        let h0 = ((qh >> j) << 4u) & 0x10u;
        let h1 = (qh >> (j + 12u)) & 0x10u;
        wv[j] = d * f32((q & 0xfu) | h0) + m;
        wv[j + 16u] = d * f32((q >> 4u) | h1) + m;
    }
}
