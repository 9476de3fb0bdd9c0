// The 32 values of a Q5_0 block into `wv`: x = d * (q - 16), the low four bits of value j the
// nibbles of qs as Q4_0 (j < 16 low, j + 16 high nibble of byte j), the fifth bit of value i
// bit i of qh. Both the buffer and the texture decoders use it.
fn q5_0_values(d: f32, qh: u32, qs: vec4<u32>) {
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
