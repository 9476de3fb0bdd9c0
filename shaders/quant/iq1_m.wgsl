// IQ1_M (56 bytes): qs: [u8; 32], qh: [u8; 16], scales: [u8; 8] read as four u16 whose top
// nibbles hold the f16 super-block scale d. Chunk c is group ib = c % 8 of super-block c / 8:
// group l of 8 values has grid index qs[4 ib + l] | (3 bits of nibble l % 2 of qh[2 ib + l / 2])
// << 8, the nibble's bit 3 the delta's sign; the 3-bit scales s of its two halves are in word
// ib / 2; x = d * (2 s + 1) * (grid ± 0.125), as ggml's dequantize_row_iq1_m. The buffer
// begins with the 16384-byte grid (IQ1_S's).
const IQ_TABLE: u32 = 16384u;
fn load_chunk(rb: u32, c: u32, n_in: u32) {
    let o = IQ_TABLE + rb + (c / 8u) * 56u;
    let ib = c % 8u;
    let sc01 = w32(o + 48u);
    let sc23 = w32(o + 52u);
    let bits = ((sc01 >> 12u) & 0xfu) | ((sc01 >> 24u) & 0xf0u) | ((sc23 >> 4u) & 0xf00u) | ((sc23 >> 16u) & 0xf000u);
    let d = unpack2x16float(bits).x;
    let w = select(sc01, sc23, ib >= 4u) >> (16u * ((ib / 2u) % 2u) + 6u * (ib % 2u));
    let dl0 = d * f32(2u * (w & 7u) + 1u);
    let dl1 = d * f32(2u * ((w >> 3u) & 7u) + 1u);
    let idx = w32(o + 4u * ib);
    let qh = b16(o + 32u + 2u * ib);
    for (var l = 0u; l < 4u; l++) {
        let h = (qh >> (4u * l)) & 0xfu;
        let g = grid8(((idx >> (8u * l)) & 0xffu) | ((h & 7u) << 8u));
        let delta = select(0.125, -0.125, (h & 8u) != 0u);
        let dl = select(dl0, dl1, l >= 2u);
        for (var j = 0u; j < 8u; j++) {
            wv[8u * l + j] = dl * (grid8_signed(g, j) + delta);
        }
    }
}
