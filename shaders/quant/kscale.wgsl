// The 6-bit scale and min of sub-block `j` of a Q4_K/Q5_K block whose 12 scale bytes start
// at `s` (ggml's get_scale_min_k4).
fn scale_min_k4(j: u32, s: u32) -> vec2<u32> {
    if (j < 4u) {
        return vec2<u32>(b8(s + j) & 63u, b8(s + j + 4u) & 63u);
    }
    let sc = (b8(s + j + 4u) & 0xfu) | ((b8(s + j - 4u) >> 6u) << 4u);
    let m = (b8(s + j + 4u) >> 4u) | ((b8(s + j) >> 6u) << 4u);
    return vec2<u32>(sc, m);
}
