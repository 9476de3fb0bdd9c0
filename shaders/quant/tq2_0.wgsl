// TQ2_0 (66 bytes): qs: [u8; 64], d: f16. Chunk c is values 32g.. of block c / 8 (g = c % 8), the
// 2-bit code at bits 2(g % 4).. of qs[32(g / 4) + l]; x = (q - 1) * d, as ggml's.
fn load_chunk(rb: u32, c: u32, n_in: u32) {
    let o = rb + (c / 8u) * 66u;
    let g = c % 8u;
    let d = f16at(o + 64u);
    let qs = o + 32u * (g / 4u);
    let sh = 2u * (g % 4u);
    for (var k = 0u; k < 8u; k++) {
        let w = w32(qs + 4u * k) >> sh;
        for (var b = 0u; b < 4u; b++) {
            wv[4u * k + b] = f32(i32((w >> (8u * b)) & 3u) - 1) * d;
        }
    }
}
