// Q8_0 (34 bytes): d: f16, qs: [i8; 32]; x = d * q. One block per chunk.
fn load_chunk(rb: u32, c: u32, n_in: u32) {
    let o = rb + c * 34u;
    let d = f16at(o);
    for (var m = 0u; m < 8u; m++) {
        let w = w32(o + 2u + 4u * m);
        for (var b = 0u; b < 4u; b++) {
            wv[4u * m + b] = d * sbyte(w, b);
        }
    }
}
