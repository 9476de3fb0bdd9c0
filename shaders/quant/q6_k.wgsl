// Q6_K (210 bytes): ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16. Chunk j (of 8):
// half n = j / 4, quarter t = j % 4; low 4 bits are nibble t / 2 of ql[64n + 32(t % 2) + l],
// high 2 bits are bits 2t.. of qh[32n + l]; x = (d * sc) * (q - 32), sc = scales[8n + l/16 + 2t].
fn load_chunk(rb: u32, c: u32, n_in: u32) {
    let o = rb + (c / 8u) * 210u;
    let j = c % 8u;
    let n = j / 4u;
    let t = j % 4u;
    let d = f16at(o + 208u);
    let ql = o + 64u * n + 32u * (t % 2u);
    let qh = o + 128u + 32u * n;
    let sh = (t / 2u) * 4u;
    let ds0 = d * f32(i8at(o + 192u + 8u * n + 2u * t));
    let ds1 = d * f32(i8at(o + 193u + 8u * n + 2u * t));
    for (var k = 0u; k < 8u; k++) {
        let lo = w32(ql + 4u * k) >> sh;
        let hi = w32(qh + 4u * k) >> (2u * t);
        let ds = select(ds0, ds1, k >= 4u);
        for (var b = 0u; b < 4u; b++) {
            let q = ((lo >> (8u * b)) & 0xfu) | (((hi >> (8u * b)) & 3u) << 4u);
            wv[4u * k + b] = ds * f32(i32(q) - 32);
        }
    }
}
