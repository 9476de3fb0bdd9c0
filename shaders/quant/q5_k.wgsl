// Q5_K (176 bytes): d, dmin: f16, scales: [u8; 12], qh: [u8; 32], qs: [u8; 128]. Chunk =
// sub-block j: low bits as Q4_K, fifth bit = bit j of qh[l]; x = (d * sc) * q - dmin * m.
fn load_chunk(rb: u32, c: u32, n_in: u32) {
    let o = rb + (c / 8u) * 176u;
    let j = c % 8u;
    let sm = scale_min_k4(j, vec3<u32>(w32(o + 4u), w32(o + 8u), w32(o + 12u)));
    let d = f16at(o) * f32(sm.x);
    let m = f16at(o + 2u) * f32(sm.y);
    let qs = o + 48u + 32u * (j / 2u);
    let sh = (j % 2u) * 4u;
    for (var k = 0u; k < 8u; k++) {
        let w = w32(qs + 4u * k) >> sh;
        let h = w32(o + 16u + 4u * k) >> j;
        for (var b = 0u; b < 4u; b++) {
            let q = ((w >> (8u * b)) & 0xfu) | (((h >> (8u * b)) & 1u) << 4u);
            wv[4u * k + b] = d * f32(q) - m;
        }
    }
}
