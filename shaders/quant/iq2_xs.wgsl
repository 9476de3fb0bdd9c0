// IQ2_XS (74 bytes): d: f16, qs: [u16; 32], scales: [u8; 8]. Chunk c is group ib = c % 8 of
// super-block c / 8: qs[4 ib + l] holds a 9-bit grid index and a 7-bit sign field per 8 values;
// scales[ib] a nibble s per 16 values; x = d * (0.5 + s) * 0.25 * grid * sign, as ggml's
// dequantize_row_iq2_xs. The buffer begins with the 4096-byte grid.
const IQ_TABLE: u32 = 4096u;
fn load_chunk(rb: u32, c: u32, n_in: u32) {
    let o = IQ_TABLE + rb + (c / 8u) * 74u;
    let ib = c % 8u;
    let db = nibble_scales(f16at(o), b8(o + 66u + ib));
    let q01 = w32(o + 2u + 8u * ib);
    let q23 = w32(o + 6u + 8u * ib);
    for (var l = 0u; l < 4u; l++) {
        let q = (select(q01, q23, l >= 2u) >> (16u * (l % 2u))) & 0xffffu;
        let g = grid8(q & 511u);
        let signs = ksign(q >> 9u);
        for (var j = 0u; j < 8u; j++) {
            wv[8u * l + j] = select(db.x, db.y, l >= 2u) * f32(grid8_byte(g, j)) * sign_of(signs, j);
        }
    }
}
