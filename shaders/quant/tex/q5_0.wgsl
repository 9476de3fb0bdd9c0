// Q5_0 in two planes (texlayout.rs): the 16 quant bytes of block c are texel c of the row; then
// 8 bytes per block (d: f16, 2 bytes of padding, qh: u32), two blocks per texel. Values as
// quant/q5_0.wgsl: x = d * (q - 16), fifth bit of value i is bit i of qh.
fn load_chunk(rb: u32, c: u32, n_in: u32) {
    let t = rb >> 4u;
    let aux = texel(t + n_in / 32u + (c >> 1u));
    let odd = (c & 1u) == 1u;
    let d = unpack2x16float(select(aux.x, aux.z, odd)).x;
    let qh = select(aux.y, aux.w, odd);
    let qs = texel(t + c);
    for (var m = 0u; m < 4u; m++) {
        let w = qs[m];
        for (var b = 0u; b < 4u; b++) {
            let j = 4u * m + b;
            let q = (w >> (8u * b)) & 0xffu;
            let h0 = ((qh >> j) << 4u) & 0x10u;
            let h1 = (qh >> (j + 12u)) & 0x10u;
            wv[j] = d * f32(i32((q & 0xfu) | h0) - 16);
            wv[j + 16u] = d * f32(i32((q >> 4u) | h1) - 16);
        }
    }
}
