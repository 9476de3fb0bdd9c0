// Q2_K (84 bytes): scales: [u8; 16] (per 16 values: low nibble sc, high nibble m), qs: [u8; 64],
// d: f16, dmin: f16. Chunk c is values 32g.. of super-block c / 8 (g = c % 8), bits 2(g % 4)..
// of qs[32(g / 4) + l]; x = (d * sc) * q - dmin * m, as ggml's dequantize_row_q2_K.
fn load_chunk(rb: u32, c: u32, n_in: u32) {
    let o = rb + (c / 8u) * 84u;
    let g = c % 8u;
    let d = f16at(o + 80u);
    let dmin = f16at(o + 82u);
    let qs = o + 16u + 32u * (g / 4u);
    let sh = 2u * (g % 4u);
    for (var h = 0u; h < 2u; h++) {
        let s = b8(o + 2u * g + h);
        let dl = d * f32(s & 0xfu);
        let ml = dmin * f32(s >> 4u);
        for (var k = 0u; k < 4u; k++) {
            let w = w32(qs + 16u * h + 4u * k) >> sh;
            for (var b = 0u; b < 4u; b++) {
                wv[16u * h + 4u * k + b] = dl * f32((w >> (8u * b)) & 3u) - ml;
            }
        }
    }
}
