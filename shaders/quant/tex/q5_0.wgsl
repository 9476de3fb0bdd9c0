// Q5_0 in two planes (texlayout.rs): the 16 quant bytes of block c are texel c of the row; then
// 8 bytes per block (d: f16, 2 bytes of padding, qh: u32), two blocks per texel. Values as
// quant/q5_0.wgsl (q5_0_values.wgsl).
fn load_chunk(rb: u32, c: u32, n_in: u32) {
    let t = rb >> 4u;
    let aux = texel(t + n_in / 32u + (c >> 1u));
    let odd = (c & 1u) == 1u;
    let d = unpack2x16float(select(aux.x, aux.z, odd)).x;
    q5_0_values(d, select(aux.y, aux.w, odd), texel(t + c));
}
