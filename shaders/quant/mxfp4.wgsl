// MXFP4 (17 bytes): e: u8 (E8M0 exponent), qs: [u8; 16]: the low nibble of byte j is element
// j, the high nibble element j + 16, each an E2M1 code into ggml's doubled table; the scale
// is halved to match, 2^(e - 128) (subnormal below e = 2), as src/quant/fp4.rs.
const KVALUES_FP4 = array<f32, 16>(0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0,
    0.0, -1.0, -2.0, -3.0, -4.0, -6.0, -8.0, -12.0);
fn load_chunk(rb: u32, c: u32, n_in: u32) {
    let o = rb + c * 17u;
    let e = b8(o);
    var bits = (e - 1u) << 23u;
    if (e < 2u) {
        bits = 0x00200000u << e;
    }
    let d = bitcast<f32>(bits);
    for (var j = 0u; j < 16u; j++) {
        let q = b8(o + 1u + j);
        wv[j] = KVALUES_FP4[q & 0xfu] * d;
        wv[j + 16u] = KVALUES_FP4[q >> 4u] * d;
    }
}
