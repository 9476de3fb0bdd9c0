// TQ1_0 (54 bytes): qs: [u8; 48] (5 base-3 digits per byte), qh: [u8; 4] (4 digits each), d: f16.
// Digit n of a byte is ((byte * 3^n) mod 256 * 3) >> 8. Block values: 32n + m from byte m < 32,
// 160 + 16n + m from byte 32 + m, 240 + 4n + j from qh[j]. Chunk c is values 32g.. of block
// c / 8 (g = c % 8); x = (t - 1) * d, as ggml's.
fn tq1_trit(byte: u32, n: u32) -> f32 {
    let pow3 = array<u32, 5>(1u, 3u, 9u, 27u, 81u);
    return f32(i32((((byte * pow3[n]) & 0xffu) * 3u) >> 8u) - 1);
}

fn load_chunk(rb: u32, c: u32, n_in: u32) {
    let o = rb + (c / 8u) * 54u;
    let g = c % 8u;
    let d = f16at(o + 52u);
    if g < 5u {
        for (var m = 0u; m < 32u; m++) {
            wv[m] = tq1_trit(b8(o + m), g) * d;
        }
        return;
    }
    // Values 160.. : two digits of bytes 32..48 per chunk, the last chunk's second half from qh.
    for (var h = 0u; h < 2u; h++) {
        let n = 2u * (g - 5u) + h;
        for (var m = 0u; m < 16u; m++) {
            if n < 5u {
                wv[16u * h + m] = tq1_trit(b8(o + 32u + m), n) * d;
            } else {
                wv[16u * h + m] = tq1_trit(b8(o + 48u + m % 4u), m / 4u) * d;
            }
        }
    }
}
