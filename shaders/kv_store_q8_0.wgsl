// Store `rows` rows of `width` values of SRC (from row `row0`) in a q8_0 cache at rows POS[i],
// quantized on the device with the CPU backend's rule (ggml's x86 `quantize_row_q8_0`, what
// llama.cpp stores its q8_0 cache with): per block of 32, d = max|x| / 127 kept as f16 and
// q = round(x · 127 / max), ties to even (WGSL's round).
//
// The cache is u32 words: the int8 value of cache element e is byte e (words 0 .. len/4,
// little-endian within a word), then the f16 scale of block g (elements 32g .. 32g + 32) is
// half g % 2 of word `scales` + g / 2. That is 34 bytes per 32 values, as ggml's blocks. One
// invocation per block; its eight value words are its own, but two blocks share a scale word,
// so the scale goes in by atomic and/or (the positions of one call are distinct).

struct Params {
    rows: u32,
    width: u32,
    row0: u32,
    grid_x: u32,
    scales: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> SRC: array<f32>;
@group(0) @binding(2) var<storage, read> POS: array<u32>;
@group(0) @binding(3) var<storage, read_write> CACHE: array<atomic<u32>>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * P.grid_x * 64u;
    let nb = P.width / 32u;
    if (i >= P.rows * nb) {
        return;
    }
    let r = i / nb;
    let src = (P.row0 + r) * P.width + 32u * (i % nb);
    var amax = 0.0;
    for (var j = 0u; j < 32u; j++) {
        amax = max(amax, abs(SRC[src + j]));
    }
    var id = 0.0;
    if (amax != 0.0) {
        id = 127.0 / amax;
    }
    // The block's first element in the cache.
    let e = POS[r] * P.width + 32u * (i % nb);
    for (var w = 0u; w < 8u; w++) {
        var word = 0u;
        for (var k = 0u; k < 4u; k++) {
            let q = i32(round(SRC[src + 4u * w + k] * id));
            word |= (u32(q) & 0xffu) << (8u * k);
        }
        atomicStore(&CACHE[e / 4u + w], word);
    }
    let g = e / 32u;
    let shift = 16u * (g & 1u);
    let half = pack2x16float(vec2<f32>(amax / 127.0, 0.0)) & 0xffffu;
    atomicAnd(&CACHE[P.scales + g / 2u], ~(0xffffu << shift));
    atomicOr(&CACHE[P.scales + g / 2u], half << shift);
}
