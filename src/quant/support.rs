//! Which kernels read each block format beyond the scalar reference, in one table: the CPU's
//! SIMD kernels, the WGSL decoders of the GPU backends, and the GPU's texture-layout decoders.
//! Every list of "types this path covers" is derived from it.
//!
//! Plain data with no imports: the build script includes this file too (it composes one
//! WGSL variant per format with a decoder).

/// The fast kernels of one block format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Support {
    /// The GGUF type name, lower case (`q4_k`): `shaders/quant/NAME.wgsl` is its decoder.
    pub name: &'static str,
    /// The CPU's AVX2/VNNI integer (or F16C) kernels multiply it; other formats take the
    /// portable path.
    pub cpu_simd: bool,
    /// The browser CPU's WebAssembly kernels (SIMD128 and relaxed SIMD, on interleaved tiles)
    /// multiply it; other formats take the portable path there.
    pub wasm_simd: bool,
    /// A WGSL decoder: the GPU backends multiply and embed it.
    pub wgsl: bool,
    /// A decoder of its own for texture-held weights (`shaders/quant/tex/NAME.wgsl`); other
    /// WGSL formats read textures through their generic decoder.
    pub wgsl_texture: bool,
    /// The codebook formats (IQ1 to IQ3): their WGSL decoder reads the format's grid table from
    /// the start of each weight buffer, the rows following it (`backend/gpu/grids.rs`), so
    /// their weights are never held in textures.
    pub wgsl_grid: bool,
}

const fn s(name: &'static str, cpu_simd: bool, wasm_simd: bool, wgsl: bool, wgsl_texture: bool) -> Support {
    Support {
        name,
        cpu_simd,
        wasm_simd,
        wgsl,
        wgsl_texture,
        wgsl_grid: false,
    }
}

/// A codebook format's row: a WGSL decoder over a grid table in its buffers, no texture one.
const fn grid(name: &'static str, cpu_simd: bool, wasm_simd: bool) -> Support {
    Support {
        name,
        cpu_simd,
        wasm_simd,
        wgsl: true,
        wgsl_texture: false,
        wgsl_grid: true,
    }
}

/// Every format some fast kernel reads (columns: CPU SIMD, wasm SIMD, WGSL, WGSL texture; the
/// codebook formats' rows by [`grid`]).
pub const SUPPORT: [Support; 26] = [
    s("f32", true, true, true, false),
    s("f16", true, true, true, false),
    s("bf16", true, true, true, false),
    s("q4_0", true, true, true, false),
    s("q4_1", true, true, true, false),
    s("q5_0", true, true, true, true),
    s("q5_1", true, true, true, false),
    s("q8_0", true, true, true, true),
    s("q4_k", true, true, true, true),
    s("q5_k", true, true, true, false),
    s("q6_k", true, true, true, true),
    s("iq4_nl", true, true, true, false),
    s("iq4_xs", true, true, true, false),
    s("mxfp4", true, true, true, false),
    s("q1_0", true, true, true, false),
    s("q2_k", true, true, true, false),
    s("q3_k", true, true, true, false),
    grid("iq2_xxs", true, true),
    grid("iq2_xs", true, true),
    grid("iq2_s", true, true),
    grid("iq3_xxs", true, true),
    grid("iq3_s", true, true),
    grid("iq1_s", true, true),
    grid("iq1_m", true, true),
    s("tq1_0", true, true, true, false),
    s("tq2_0", true, true, true, false),
];
