// IQ4_XS (136 bytes): d: f16, scales_h: u16, scales_l: [u8; 4], qs: [u8; 128]. Chunk = sub-block
// ib: 6-bit scale ls (low nibble ib % 2 of scales_l[ib / 2], high 2 bits ib of scales_h),
// x = (d * (ls - 32)) * table[q], nibbles of qs[16 ib..] as Q4_0.
const KVALUES_IQ4NL = array<f32, 16>(-127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0,
    1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0);
fn load_chunk(rb: u32, c: u32, n_in: u32) {
    let o = rb + (c / 8u) * 136u;
    let ib = c % 8u;
    let lo = (b8(o + 4u + ib / 2u) >> (4u * (ib % 2u))) & 0xfu;
    let hi = (b16(o + 2u) >> (2u * ib)) & 3u;
    let dl = f16at(o) * f32(i32(lo | (hi << 4u)) - 32);
    let qs = o + 8u + 16u * ib;
    for (var j = 0u; j < 16u; j++) {
        let q = b8(qs + j);
        wv[j] = dl * KVALUES_IQ4NL[q & 0xfu];
        wv[j + 16u] = dl * KVALUES_IQ4NL[q >> 4u];
    }
}
