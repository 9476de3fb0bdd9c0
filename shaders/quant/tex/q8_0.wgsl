// Q8_0 in two planes (texlayout.rs): the 32 quants of block c are texels 2c, 2c + 1 of the row;
// the f16 scales follow, 8 per texel. x = d * q, as quant/q8_0.wgsl.
fn load_chunk(rb: u32, c: u32, n_in: u32) {
    let t = rb >> 4u;
    let ds = texel(t + 2u * (n_in / 32u) + (c >> 3u));
    let dd = unpack2x16float(comp(ds, (c >> 1u) & 3u));
    let d = select(dd.x, dd.y, (c & 1u) == 1u);
    let q0 = texel(t + 2u * c);
    let q1 = texel(t + 2u * c + 1u);
    for (var m = 0u; m < 4u; m++) {
        for (var b = 0u; b < 4u; b++) {
            wv[4u * m + b] = d * sbyte(q0[m], b);
            wv[4u * m + b + 16u] = d * sbyte(q1[m], b);
        }
    }
}
