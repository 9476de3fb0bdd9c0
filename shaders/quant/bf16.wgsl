// BF16 rows: the upper half of an f32. Chunk `c` is elements 32c.. (the row may end inside it).
fn load_chunk(rb: u32, c: u32, n_in: u32) {
    let lim = min(32u, n_in - c * 32u);
    for (var i = 0u; i < 32u; i++) {
        wv[i] = select(0.0, bitcast<f32>(b16(rb + (c * 32u + i) * 2u) << 16u), i < lim);
    }
}
