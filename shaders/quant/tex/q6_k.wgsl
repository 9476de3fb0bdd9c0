// Q6_K in two planes (texlayout.rs): ql, qh and scales of superblock s (208 bytes) are texels
// 13 s .. 13 s + 13 of the row; the f16 d of every superblock follows, 8 per texel. Chunk j (of
// 8) as quant/q6_k.wgsl: half n = j / 4, quarter t = j % 4; x = (d * sc) * (q - 32).
fn load_chunk(rb: u32, c: u32, n_in: u32) {
    let t0 = rb >> 4u;
    let s = c / 8u;
    let j = c % 8u;
    let n = j / 4u;
    let t = j % 4u;
    let base = t0 + 13u * s;
    let ds = texel(t0 + 13u * (n_in / 256u) + (s >> 3u));
    let dd = unpack2x16float(comp(ds, (s >> 1u) & 3u));
    let d = select(dd.x, dd.y, (s & 1u) == 1u);
    // Scales 8n + 2t and 8n + 2t + 1: one 16-bit half of texel 12.
    let sb = 8u * n + 2u * t;
    let sc = comp(texel(base + 12u), sb >> 2u) >> ((sb & 2u) * 8u);
    let ds0 = d * f32((bitcast<i32>(sc << 24u)) >> 24u);
    let ds1 = d * f32((bitcast<i32>(sc << 16u)) >> 24u);
    let l0 = texel(base + 4u * n + 2u * (t % 2u));
    let l1 = texel(base + 4u * n + 2u * (t % 2u) + 1u);
    let h0 = texel(base + 8u + 2u * n);
    let h1 = texel(base + 9u + 2u * n);
    let sh = (t / 2u) * 4u;
    for (var k = 0u; k < 4u; k++) {
        let lo_a = l0[k] >> sh;
        let hi_a = h0[k] >> (2u * t);
        let lo_b = l1[k] >> sh;
        let hi_b = h1[k] >> (2u * t);
        for (var b = 0u; b < 4u; b++) {
            let qa = ((lo_a >> (8u * b)) & 0xfu) | (((hi_a >> (8u * b)) & 3u) << 4u);
            let qb = ((lo_b >> (8u * b)) & 0xfu) | (((hi_b >> (8u * b)) & 3u) << 4u);
            wv[4u * k + b] = ds0 * f32(i32(qa) - 32);
            wv[4u * k + b + 16u] = ds1 * f32(i32(qb) - 32);
        }
    }
}
