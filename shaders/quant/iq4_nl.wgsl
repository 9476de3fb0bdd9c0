// IQ4_NL (18 bytes): d: f16, qs: [u8; 16] (nibbles as Q4_0) indexing a non-linear table.
const KVALUES_IQ4NL = array<f32, 16>(-127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0,
    1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0);
fn load_chunk(rb: u32, c: u32, n_in: u32) {
    let o = rb + c * 18u;
    let d = f16at(o);
    for (var j = 0u; j < 16u; j++) {
        let q = b8(o + 2u + j);
        wv[j] = d * KVALUES_IQ4NL[q & 0xfu];
        wv[j + 16u] = d * KVALUES_IQ4NL[q >> 4u];
    }
}
