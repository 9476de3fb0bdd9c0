// Byte i (0..11) of the 12 scale bytes of a Q4_K/Q5_K block, given as three words.
fn kscale_byte(sc: vec3<u32>, i: u32) -> u32 {
    let w = select(select(sc.x, sc.y, i >= 4u), sc.z, i >= 8u);
    return (w >> ((i & 3u) * 8u)) & 0xffu;
}
// The 6-bit scale and min of sub-block `j` of a Q4_K/Q5_K block with scale bytes `sc` (ggml's
// get_scale_min_k4). Both the buffer and the texture decoders use it.
fn scale_min_k4(j: u32, sc: vec3<u32>) -> vec2<u32> {
    if (j < 4u) {
        return vec2<u32>(kscale_byte(sc, j) & 63u, kscale_byte(sc, j + 4u) & 63u);
    }
    let s = (kscale_byte(sc, j + 4u) & 0xfu) | ((kscale_byte(sc, j - 4u) >> 6u) << 4u);
    let m = (kscale_byte(sc, j + 4u) >> 4u) | ((kscale_byte(sc, j) >> 6u) << 4u);
    return vec2<u32>(s, m);
}
