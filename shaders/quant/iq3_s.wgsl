// IQ3_S (110 bytes): d: f16, qs: [u8; 64], qh: [u8; 8], signs: [u8; 32], scales: [u8; 4].
// Chunk c is group ib = c % 8 of super-block c / 8: values 8 l .. 8 l + 8 are two 4-value grid
// entries, indices qs[8 ib + 2 l] and qs[8 ib + 2 l + 1] with a 9th bit each from qh[ib]; signs
// signs[4 ib + l]; the nibble s of scales[ib / 2] gives x = d * (1 + 2 s) * grid * sign, as
// ggml's dequantize_row_iq3_s. The buffer begins with the 2048-byte grid (4 bytes an entry).
const IQ_TABLE: u32 = 2048u;
fn load_chunk(rb: u32, c: u32, n_in: u32) {
    let o = IQ_TABLE + rb + (c / 8u) * 110u;
    let ib = c % 8u;
    let s = (b8(o + 106u + ib / 2u) >> (4u * (ib % 2u))) & 0xfu;
    let db = f16at(o) * f32(1u + 2u * s);
    let qh = b8(o + 66u + ib);
    let i03 = w32(o + 2u + 8u * ib);
    let i47 = w32(o + 6u + 8u * ib);
    let sgn = w32(o + 74u + 4u * ib);
    for (var l = 0u; l < 4u; l++) {
        let i = select(i03, i47, l >= 2u) >> (16u * (l % 2u));
        let i1 = (i & 0xffu) | ((qh << (8u - 2u * l)) & 256u);
        let i2 = ((i >> 8u) & 0xffu) | ((qh << (7u - 2u * l)) & 256u);
        let g = vec2<u32>(word(i1), word(i2));
        let signs = (sgn >> (8u * l)) & 0xffu;
        for (var j = 0u; j < 8u; j++) {
            wv[8u * l + j] = db * f32(grid8_byte(g, j)) * sign_of(signs, j);
        }
    }
}
