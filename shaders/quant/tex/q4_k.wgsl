// Q4_K from its GGUF blocks (144 bytes = 9 texels, so every superblock starts a texel): texel 0
// holds d, dmin and the 12 scale bytes, texels 1..9 the quants. Chunk j (of 8) as
// quant/q4_k.wgsl: nibble j % 2 of qs[32 (j / 2) + l]; x = (d * sc) * q - dmin * m.
fn load_chunk(rb: u32, c: u32, n_in: u32) {
    let base = (rb >> 4u) + 9u * (c / 8u);
    let j = c % 8u;
    let hdr = texel(base);
    let sm = scale_min_k4(j, hdr.yzw);
    let dm = unpack2x16float(hdr.x);
    let d = dm.x * f32(sm.x);
    let m = dm.y * f32(sm.y);
    let q0 = texel(base + 1u + 2u * (j / 2u));
    let q1 = texel(base + 2u + 2u * (j / 2u));
    let sh = (j % 2u) * 4u;
    for (var k = 0u; k < 4u; k++) {
        let wa = q0[k] >> sh;
        let wb = q1[k] >> sh;
        for (var b = 0u; b < 4u; b++) {
            wv[4u * k + b] = d * f32((wa >> (8u * b)) & 0xfu) - m;
            wv[4u * k + b + 16u] = d * f32((wb >> (8u * b)) & 0xfu) - m;
        }
    }
}
