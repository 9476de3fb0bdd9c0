// Q3_K (110 bytes): hmask: [u8; 32], qs: [u8; 64], scales: [u8; 12] (sixteen 6-bit scales), d: f16.
// Chunk c is values 32g.. of super-block c / 8 (g = c % 8): 2 low bits as Q2_K's, bit g of
// hmask[l] clear subtracts 4; scale s = 2g + l / 16 is nibble s / 8 of scales[s % 8] with bits
// 2(s / 4).. of scales[8 + s % 4] on top, minus 32; x = (d * (sc - 32)) * q, as ggml's.
fn load_chunk(rb: u32, c: u32, n_in: u32) {
    let o = rb + (c / 8u) * 110u;
    let g = c % 8u;
    let d = f16at(o + 108u);
    let qs = o + 32u + 32u * (g / 4u);
    let sh = 2u * (g % 4u);
    for (var h = 0u; h < 2u; h++) {
        let s = 2u * g + h;
        let low = (b8(o + 96u + s % 8u) >> (4u * (s / 8u))) & 0xfu;
        let high = (b8(o + 104u + s % 4u) >> (2u * (s / 4u))) & 3u;
        let dl = d * f32(i32(low | (high << 4u)) - 32);
        for (var k = 0u; k < 4u; k++) {
            let w = w32(qs + 16u * h + 4u * k) >> sh;
            let m = w32(o + 16u * h + 4u * k) >> g;
            for (var b = 0u; b < 4u; b++) {
                let q = i32((w >> (8u * b)) & 3u) - select(4, 0, ((m >> (8u * b)) & 1u) == 1u);
                wv[16u * h + 4u * k + b] = dl * f32(q);
            }
        }
    }
}
