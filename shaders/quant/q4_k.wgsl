// Q4_K (144 bytes): d, dmin: f16, scales: [u8; 12], qs: [u8; 128]. Chunk = sub-block j of 32:
// nibble j % 2 of qs[32 (j / 2) + l]; x = (d * sc) * q - dmin * m.
fn load_chunk(rb: u32, c: u32, n_in: u32) {
    let o = rb + (c / 8u) * 144u;
    let j = c % 8u;
    let sm = scale_min_k4(j, vec3<u32>(w32(o + 4u), w32(o + 8u), w32(o + 12u)));
    let d = f16at(o) * f32(sm.x);
    let m = f16at(o + 2u) * f32(sm.y);
    let qs = o + 16u + 32u * (j / 2u);
    let sh = (j % 2u) * 4u;
    for (var k = 0u; k < 8u; k++) {
        let w = w32(qs + 4u * k) >> sh;
        for (var b = 0u; b < 4u; b++) {
            wv[4u * k + b] = d * f32((w >> (8u * b)) & 0xfu) - m;
        }
    }
}
