// IQ1_S (50 bytes): d: f16, qs: [u8; 32], qh: [u16; 8]. Chunk c is group ib = c % 8 of
// super-block c / 8: group l of 8 values has grid index qs[4 ib + l] | (bits 3 l.. of qh[ib])
// << 8 (8 values of -1, 0, 1); qh[ib] bits 12..15 a scale s, bit 15 the delta's sign;
// x = d * (2 s + 1) * (grid ± 0.125), as ggml's dequantize_row_iq1_s. The buffer begins with
// the 16384-byte grid.
const IQ_TABLE: u32 = 16384u;
fn load_chunk(rb: u32, c: u32, n_in: u32) {
    let o = IQ_TABLE + rb + (c / 8u) * 50u;
    let ib = c % 8u;
    let qh = b16(o + 34u + 2u * ib);
    let dl = f16at(o) * f32(2u * ((qh >> 12u) & 7u) + 1u);
    let delta = select(0.125, -0.125, (qh & 0x8000u) != 0u);
    let idx = w32(o + 2u + 4u * ib);
    for (var l = 0u; l < 4u; l++) {
        let g = grid8(((idx >> (8u * l)) & 0xffu) | (((qh >> (3u * l)) & 7u) << 8u));
        for (var j = 0u; j < 8u; j++) {
            wv[8u * l + j] = dl * (grid8_signed(g, j) + delta);
        }
    }
}
