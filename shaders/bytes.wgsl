// Byte access to GGUF blocks kept verbatim in `W: array<u32>` (blocks are 18, 22, 34, 144,
// 210... bytes long, so fields are not 4-byte aligned). Little-endian, as in GGUF files.
// bytes_tex.wgsl has the same helpers over a texture.

@group(0) @binding(1) var<storage, read> W: array<u32>;

// 32-bit word `i` (bytes 4 i .. 4 i + 4), as bytes_tex.wgsl names it.
fn word(i: u32) -> u32 {
    return W[i];
}
fn b8(o: u32) -> u32 {
    return (W[o >> 2u] >> ((o & 3u) * 8u)) & 0xffu;
}
fn i8at(o: u32) -> i32 {
    return (i32(b8(o)) << 24u) >> 24u;
}
fn b16(o: u32) -> u32 {
    return b8(o) | (b8(o + 1u) << 8u);
}
fn b32(o: u32) -> u32 {
    return b16(o) | (b16(o + 2u) << 16u);
}
fn f16at(o: u32) -> f32 {
    return unpack2x16float(b16(o)).x;
}
// Four bytes at any byte offset as one little-endian word (one or two loads instead of four).
fn w32(o: u32) -> u32 {
    let i = o >> 2u;
    let sh = (o & 3u) * 8u;
    return select(W[i], (W[i] >> sh) | (W[i + 1u] << ((32u - sh) & 31u)), sh != 0u);
}
// Byte `b` of word `w` as a signed value.
fn sbyte(w: u32, b: u32) -> f32 {
    return f32(bitcast<i32>(w << (24u - 8u * b)) >> 24u);
}
