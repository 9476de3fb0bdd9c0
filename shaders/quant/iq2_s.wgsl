// IQ2_S (82 bytes): d: f16, qs: [u8; 64] (32 low index bytes, then 32 sign bytes), qh: [u8; 8],
// scales: [u8; 8]. Chunk c is group ib = c % 8 of super-block c / 8: group l of 8 values has
// grid index qs[4 ib + l] | (2 bits of qh[ib]) << 8 and signs qs[32 + 4 ib + l]; scales[ib] a
// nibble s per 16 values; x = d * (0.5 + s) * 0.25 * grid * sign, as ggml's
// dequantize_row_iq2_s. The buffer begins with the 8192-byte grid.
const IQ_TABLE: u32 = 8192u;
fn load_chunk(rb: u32, c: u32, n_in: u32) {
    let o = IQ_TABLE + rb + (c / 8u) * 82u;
    let ib = c % 8u;
    let db = nibble_scales(f16at(o), b8(o + 74u + ib));
    let idx = w32(o + 2u + 4u * ib);
    let sgn = w32(o + 34u + 4u * ib);
    let qh = b8(o + 66u + ib);
    for (var l = 0u; l < 4u; l++) {
        let g = grid8(((idx >> (8u * l)) & 0xffu) | ((qh << (8u - 2u * l)) & 0x300u));
        let signs = (sgn >> (8u * l)) & 0xffu;
        for (var j = 0u; j < 8u; j++) {
            wv[8u * l + j] = select(db.x, db.y, l >= 2u) * f32(grid8_byte(g, j)) * sign_of(signs, j);
        }
    }
}
