// IQ2_XXS (66 bytes): d: f16, qs: [u16; 32]. Chunk c is group ib = c % 8 of super-block c / 8,
// two words at qs[4 ib]: aux0 holds four 8-bit indices into the grid (8 magnitudes each),
// aux1 four 7-bit sign fields and (bits 28..32) a scale s; x = d * (0.5 + s) * 0.25 * grid *
// sign, as ggml's dequantize_row_iq2_xxs. The buffer begins with the 2048-byte grid.
const IQ_TABLE: u32 = 2048u;
fn load_chunk(rb: u32, c: u32, n_in: u32) {
    let o = IQ_TABLE + rb + (c / 8u) * 66u;
    let ib = c % 8u;
    let aux0 = w32(o + 2u + 8u * ib);
    let aux1 = w32(o + 6u + 8u * ib);
    let db = f16at(o) * (0.5 + f32(aux1 >> 28u)) * 0.25;
    for (var l = 0u; l < 4u; l++) {
        let g = grid8((aux0 >> (8u * l)) & 0xffu);
        let signs = ksign((aux1 >> (7u * l)) & 127u);
        for (var j = 0u; j < 8u; j++) {
            wv[8u * l + j] = db * f32(grid8_byte(g, j)) * sign_of(signs, j);
        }
    }
}
