// IQ3_XXS (98 bytes): d: f16, qs: [u8; 96] (64 grid indices, then a u32 per 32 values). Chunk c
// is group ib = c % 8 of super-block c / 8: values 8 l .. 8 l + 8 are two 4-value grid entries
// (indices qs[8 ib + 2 l], qs[8 ib + 2 l + 1]); the word at qs[64 + 4 ib] holds four 7-bit sign
// fields and (bits 28..32) a scale s; x = d * (0.5 + s) * 0.5 * grid * sign, as ggml's
// dequantize_row_iq3_xxs. The buffer begins with the 1024-byte grid (4 bytes an entry).
const IQ_TABLE: u32 = 1024u;
fn load_chunk(rb: u32, c: u32, n_in: u32) {
    let o = IQ_TABLE + rb + (c / 8u) * 98u;
    let ib = c % 8u;
    let aux = w32(o + 66u + 4u * ib);
    let db = f16at(o) * (0.5 + f32(aux >> 28u)) * 0.5;
    let i03 = w32(o + 2u + 8u * ib);
    let i47 = w32(o + 6u + 8u * ib);
    for (var l = 0u; l < 4u; l++) {
        let i = select(i03, i47, l >= 2u) >> (16u * (l % 2u));
        let g = vec2<u32>(word(i & 0xffu), word((i >> 8u) & 0xffu));
        let signs = ksign((aux >> (7u * l)) & 127u);
        for (var j = 0u; j < 8u; j++) {
            wv[8u * l + j] = db * f32(grid8_byte(g, j)) * sign_of(signs, j);
        }
    }
}
