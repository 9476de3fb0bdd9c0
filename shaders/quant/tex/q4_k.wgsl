// Q4_K from its GGUF blocks (144 bytes = 9 texels, so every superblock starts a texel): texel 0
// holds d, dmin and the 12 scale bytes, texels 1..9 the quants. Chunk j (of 8) as
// quant/q4_k.wgsl: nibble j % 2 of qs[32 (j / 2) + l]; x = (d * sc) * q - dmin * m.
fn load_chunk(rb: u32, c: u32, n_in: u32) {
    let base = (rb >> 4u) + 9u * (c / 8u);
    let j = c % 8u;
    let hdr = texel(base);
    let sm = scale_min_k4_tex(j, hdr);
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
// Scale byte i (0..11) of a K-quant header texel (bytes 4..16).
fn kscale_byte(hdr: vec4<u32>, i: u32) -> u32 {
    let w = select(select(hdr.y, hdr.z, i >= 4u), hdr.w, i >= 8u);
    return (w >> ((i & 3u) * 8u)) & 0xffu;
}
// ggml's get_scale_min_k4 over the header texel (quant/kscale.wgsl reads the same bytes).
fn scale_min_k4_tex(j: u32, hdr: vec4<u32>) -> vec2<u32> {
    if (j < 4u) {
        return vec2<u32>(kscale_byte(hdr, j) & 63u, kscale_byte(hdr, j + 4u) & 63u);
    }
    let sc = (kscale_byte(hdr, j + 4u) & 0xfu) | ((kscale_byte(hdr, j - 4u) >> 6u) << 4u);
    let m = (kscale_byte(hdr, j + 4u) >> 4u) | ((kscale_byte(hdr, j) >> 6u) << 4u);
    return vec2<u32>(sc, m);
}
