//! The kernels of the WebGPU backend and their WGSL, generated at build time from `shaders/`
//! (`build.rs`, composed by [`compose`]): a kernel template includes the byte helpers and, for
//! the kernels that read weights, the `load_chunk` decoder of one GGUF block format. One
//! template therefore yields one variant per quant type; [`all_variants`] lists them for the
//! naga validation test.

use super::compose;
use crate::quant::GgmlType;

/// The kernels of the backend (one compute pipeline per kernel, entry point and quant type).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// Quantized matmul/matvec over raw GGUF blocks, a workgroup per weight row (GPUs), loading
    /// activations `.1` values at a time (1 or 4: rows of a multiple of 4 values), the sums
    /// reduced with subgroup operations when `.2`, else in workgroup memory; products in f16
    /// when `.3` (width 4 only; devices with shader-f16).
    Matmul(GgmlType, u8, bool, bool),
    /// The same with one invocation per weight row and no workgroup memory.
    MatmulRows(GgmlType),
    /// One invocation per weight row, weights in a texture and activations in a uniform buffer
    /// (CPU adapters), meeting each decoded chunk with `.1` activation rows (1, 2, 4 or 8);
    /// with `.2`, the subgroup shares the activation loads (x_subgroup.wgsl).
    MatmulTex(GgmlType, u8, bool),
    /// Embedding row lookup from raw GGUF blocks.
    Embed(GgmlType),
    /// The same from weights kept in a texture.
    EmbedTex(GgmlType),
    Add,
    AddBias,
    Scale,
    Swiglu,
    Geglu,
    RmsNorm,
    RmsNormInplace,
    Rope,
    KvStore,
    Attention,
    /// The three passes of attention split across the KV length (attention.wgsl).
    AttentionStats,
    AttentionWeigh,
    AttentionMerge,
    Argmax,
    /// A sampler's candidates: top k and gathered values (select.wgsl).
    Select,
}

include!(concat!(env!("OUT_DIR"), "/wgsl_variants.rs"));

/// Activation rows per invocation of the [`Kernel::MatmulTex`] variants.
pub const TEX_TILES: [u8; 4] = compose::TEX_TILES;

/// Block formats the WGSL decoders read (`compose::QUANTS`, in its order).
pub const QUANT_TYPES: [GgmlType; 13] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
];

/// The generated source named `name`.
pub fn generated(name: &str) -> Option<&'static str> {
    VARIANTS
        .binary_search_by(|(n, _)| (*n).cmp(name))
        .ok()
        .map(|i| VARIANTS[i].1)
}

/// Whether weights of type `ty` can be multiplied and looked up.
pub fn supports(ty: GgmlType) -> bool {
    QUANT_TYPES.contains(&ty)
}

impl Kernel {
    /// The entry point of the kernel in its module.
    pub fn entry(self) -> &'static str {
        match self {
            Kernel::Add => "add",
            Kernel::AddBias => "add_bias",
            Kernel::Scale => "scale",
            Kernel::Swiglu => "swiglu",
            Kernel::Geglu => "geglu",
            Kernel::RmsNormInplace => "inplace",
            Kernel::AttentionStats => "stats",
            Kernel::AttentionWeigh => "weigh",
            Kernel::AttentionMerge => "merge",
            _ => "main",
        }
    }

    /// The complete WGSL module of the kernel, generated at build time (`None` for an
    /// unsupported quant type or tile).
    pub fn source(self) -> Option<&'static str> {
        generated(&self.variant())
    }

    /// A name for labels and messages.
    pub fn label(self) -> String {
        match self {
            Kernel::AttentionStats | Kernel::AttentionWeigh | Kernel::AttentionMerge => {
                format!("attention_{}", self.entry())
            }
            k => k.variant(),
        }
    }

    /// The name of its generated variant (one module may hold several kernels' entry points).
    pub fn variant(self) -> String {
        let q = |t: GgmlType| t.name().to_lowercase();
        match self {
            Kernel::Matmul(t, width, subgroup, false) => compose::name("matmul", &q(t), width, subgroup),
            Kernel::Matmul(t, width, subgroup, true) => compose::name("matmul_f16", &q(t), width, subgroup),
            Kernel::MatmulRows(t) => compose::name("matmul_rows", &q(t), 0, false),
            Kernel::MatmulTex(t, r, shared) => compose::name("matmul_tex", &q(t), r, shared),
            Kernel::Embed(t) => compose::name("embed", &q(t), 0, false),
            Kernel::EmbedTex(t) => compose::name("embed_tex", &q(t), 0, false),
            Kernel::Add => "add".into(),
            Kernel::AddBias => "add_bias".into(),
            Kernel::Scale => "scale".into(),
            Kernel::Swiglu => "swiglu".into(),
            Kernel::Geglu => "geglu".into(),
            Kernel::RmsNorm => "rmsnorm".into(),
            Kernel::RmsNormInplace => "rmsnorm_inplace".into(),
            Kernel::Rope => "rope".into(),
            Kernel::KvStore => "kv_store".into(),
            Kernel::Attention | Kernel::AttentionStats | Kernel::AttentionWeigh | Kernel::AttentionMerge => {
                "attention".into()
            }
            Kernel::Argmax => "argmax".into(),
            Kernel::Select => "select".into(),
        }
    }
}

/// Every kernel variant the backend can build.
pub fn all_variants() -> Vec<Kernel> {
    let mut v: Vec<Kernel> = QUANT_TYPES
        .iter()
        .flat_map(|&t| {
            [Kernel::MatmulRows(t), Kernel::Embed(t), Kernel::EmbedTex(t)]
                .into_iter()
                .chain(
                    TEX_TILES
                        .iter()
                        .flat_map(move |&r| [false, true].map(|s| Kernel::MatmulTex(t, r, s))),
                )
                .chain(
                    // Widths 1 and 4 in f32, width 4 in f16.
                    [(1, false), (4, false), (4, true)]
                        .into_iter()
                        .flat_map(move |(w, f16)| [false, true].map(|s| Kernel::Matmul(t, w, s, f16))),
                )
        })
        .collect();
    v.extend([
        Kernel::Add,
        Kernel::AddBias,
        Kernel::Scale,
        Kernel::Swiglu,
        Kernel::Geglu,
        Kernel::RmsNorm,
        Kernel::RmsNormInplace,
        Kernel::Rope,
        Kernel::KvStore,
        Kernel::Attention,
        Kernel::AttentionStats,
        Kernel::AttentionWeigh,
        Kernel::AttentionMerge,
        Kernel::Argmax,
        Kernel::Select,
    ]);
    v
}
