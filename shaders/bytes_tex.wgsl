// The helpers of bytes.wgsl over weights kept in a texture instead of a storage buffer: the
// layout of the CPU-adapter kernels (matmul_tex.wgsl). `W` is an Rgba32Uint texture holding the
// part's bytes in order, 16 per texel, 4096 texels per texture row; byte `o` is byte `o % 16` of
// texel `o / 16`. Mesa lavapipe fetches texels with vectorized code, while it loads storage
// buffers one SIMD lane at a time (about 7x the time per 32-bit word, measured on llvmpipe).

@group(0) @binding(1) var W: texture_2d<u32>;

const TEX_W_SHIFT: u32 = 12u;
const TEX_W_MASK: u32 = 4095u;

// Texel `t` of the weights (bytes 16 t .. 16 t + 16).
fn texel(t: u32) -> vec4<u32> {
    return textureLoad(W, vec2<u32>(t & TEX_W_MASK, t >> TEX_W_SHIFT), 0);
}
// Component `k` (0..3) of `v`, without indexing a vector by a run-time value.
fn comp(v: vec4<u32>, k: u32) -> u32 {
    return select(select(v.x, v.y, k == 1u), select(v.z, v.w, k == 3u), k >= 2u);
}
// 32-bit word `i` (bytes 4 i .. 4 i + 4).
fn word(i: u32) -> u32 {
    return comp(texel(i >> 2u), i & 3u);
}
fn b8(o: u32) -> u32 {
    return (word(o >> 2u) >> ((o & 3u) * 8u)) & 0xffu;
}
fn i8at(o: u32) -> i32 {
    return (i32(b8(o)) << 24u) >> 24u;
}
// Every 16-bit field of every block format sits at an even offset (block sizes are even and
// rows start on 16-byte boundaries here), so one word holds it.
fn b16(o: u32) -> u32 {
    return (word(o >> 2u) >> ((o & 2u) * 8u)) & 0xffffu;
}
fn f16at(o: u32) -> f32 {
    return unpack2x16float(b16(o)).x;
}
// Four bytes at any byte offset as one little-endian word.
fn w32(o: u32) -> u32 {
    let i = o >> 2u;
    let sh = (o & 3u) * 8u;
    let lo = word(i);
    return select(lo, (lo >> sh) | (word(i + 1u) << ((32u - sh) & 31u)), sh != 0u);
}
fn b32(o: u32) -> u32 {
    return w32(o);
}
// Byte `b` of word `w` as a signed value.
fn sbyte(w: u32, b: u32) -> f32 {
    return f32(bitcast<i32>(w << (24u - 8u * b)) >> 24u);
}
