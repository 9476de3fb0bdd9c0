// The codebook formats' grid table (src/quant/iquant_grids.rs, little-endian) sits at the start
// of each weight buffer, before the rows (src/backend/gpu/grids.rs): a WGSL constant array
// indexed at run time is copied into each invocation's private memory, and a binding of its own
// would change every matmul's layout. A decoder adds its table's size to the row offset.

// Entry `i` of a table of 8-byte entries (IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S/IQ1_M): bytes 0..4 and
// 4..8, one value per byte.
fn grid8(i: u32) -> vec2<u32> {
    return vec2<u32>(word(2u * i), word(2u * i + 1u));
}
// Byte `j` (0..8) of an 8-byte entry.
fn grid8_byte(g: vec2<u32>, j: u32) -> u32 {
    return (select(g.x, g.y, j >= 4u) >> (8u * (j % 4u))) & 0xffu;
}
// The same byte as a signed value (IQ1's -1, 0, 1).
fn grid8_signed(g: vec2<u32>, j: u32) -> f32 {
    return sbyte(select(g.x, g.y, j >= 4u), j % 4u);
}
// 7 stored sign bits -> 8 (the 8th makes the count even): ggml's ksigns_iq2xs.
fn ksign(s7: u32) -> u32 {
    return s7 | ((countOneBits(s7) & 1u) << 7u);
}
// -1 where bit `j` of `signs` is set, else 1.
fn sign_of(signs: u32, j: u32) -> f32 {
    return select(1.0, -1.0, ((signs >> j) & 1u) == 1u);
}
// The scales of the two halves of a group of 32 whose byte `sc` holds a nibble s each (IQ2_XS,
// IQ2_S): d * (0.5 + s) * 0.25, as ggml's dequantize_row_iq2_xs.
fn nibble_scales(d: f32, sc: u32) -> vec2<f32> {
    return vec2<f32>(d * (0.5 + f32(sc & 0xfu)) * 0.25, d * (0.5 + f32(sc >> 4u)) * 0.25);
}
