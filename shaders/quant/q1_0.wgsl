// Q1_0 (18 bytes per 128 values): d: f16, qs: [u8; 16]; bit j % 8 of qs[j / 8] set: x = d,
// clear: x = -d. Chunk c is values 32 (c % 4).. of block c / 4, whose bits are one u32.
fn load_chunk(rb: u32, c: u32, n_in: u32) {
    let o = rb + (c / 4u) * 18u;
    let d = f16at(o);
    let bits = w32(o + 2u + 4u * (c % 4u));
    for (var j = 0u; j < 32u; j++) {
        wv[j] = select(-d, d, ((bits >> j) & 1u) == 1u);
    }
}
