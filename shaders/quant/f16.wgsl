// F16 rows: chunk `c` is elements 32c.. of the row (the row may end inside the chunk).
fn load_chunk(rb: u32, c: u32, n_in: u32) {
    let lim = min(32u, n_in - c * 32u);
    let o = rb + c * 64u;
    if (lim == 32u) {
        for (var m = 0u; m < 16u; m++) {
            let v = unpack2x16float(w32(o + 4u * m));
            wv[2u * m] = v.x;
            wv[2u * m + 1u] = v.y;
        }
        return;
    }
    for (var i = 0u; i < 32u; i++) {
        wv[i] = select(0.0, f16at(o + i * 2u), i < lim);
    }
}
