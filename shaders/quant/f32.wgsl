// F32 rows: chunk `c` is elements 32c.. of the row (the row may end inside the chunk).
fn load_chunk(rb: u32, c: u32, n_in: u32) {
    let lim = min(32u, n_in - c * 32u);
    for (var i = 0u; i < 32u; i++) {
        wv[i] = select(0.0, bitcast<f32>(b32(rb + (c * 32u + i) * 4u)), i < lim);
    }
}
