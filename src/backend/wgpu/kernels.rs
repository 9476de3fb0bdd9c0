//! WGSL sources of every kernel, composed from `shaders/`: a kernel template includes the byte
//! helpers and, for the kernels that read weights, the `load_chunk` decoder of one GGUF block
//! format. One template therefore yields one variant per quant type; [`all_variants`] lists
//! them for the naga validation test.

use crate::quant::GgmlType;

/// The kernels of the backend (one compute pipeline per kernel, entry point and quant type).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// Quantized matmul/matvec over raw GGUF blocks, a workgroup per weight row (GPUs).
    Matmul(GgmlType),
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
    Argmax,
}

const BYTES: &str = include_str!("../../../shaders/bytes.wgsl");
const BYTES_TEX: &str = include_str!("../../../shaders/bytes_tex.wgsl");
const X_LANE: &str = include_str!("../../../shaders/x_lane.wgsl");
const X_SUBGROUP: &str = include_str!("../../../shaders/x_subgroup.wgsl");
/// Activation rows per invocation of the [`Kernel::MatmulTex`] variants.
pub const TEX_TILES: [u8; 4] = [1, 2, 4, 8];
/// Parameters and bindings of both matmul variants.
const MATMUL_IO: &str = include_str!("../../../shaders/matmul_io.wgsl");
const KSCALE: &str = include_str!("../../../shaders/quant/kscale.wgsl");

/// Block formats the WGSL decoders read, with their `load_chunk` source.
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

/// The `load_chunk` decoder of `ty`, or `None` when the backend cannot read the format.
pub fn quant_source(ty: GgmlType) -> Option<String> {
    use GgmlType::*;
    let body = match ty {
        F32 => include_str!("../../../shaders/quant/f32.wgsl"),
        F16 => include_str!("../../../shaders/quant/f16.wgsl"),
        BF16 => include_str!("../../../shaders/quant/bf16.wgsl"),
        Q4_0 => include_str!("../../../shaders/quant/q4_0.wgsl"),
        Q4_1 => include_str!("../../../shaders/quant/q4_1.wgsl"),
        Q5_0 => include_str!("../../../shaders/quant/q5_0.wgsl"),
        Q5_1 => include_str!("../../../shaders/quant/q5_1.wgsl"),
        Q8_0 => include_str!("../../../shaders/quant/q8_0.wgsl"),
        Q4_K => {
            return Some(format!(
                "{KSCALE}\n{}",
                include_str!("../../../shaders/quant/q4_k.wgsl")
            ));
        }
        Q5_K => {
            return Some(format!(
                "{KSCALE}\n{}",
                include_str!("../../../shaders/quant/q5_k.wgsl")
            ));
        }
        Q6_K => include_str!("../../../shaders/quant/q6_k.wgsl"),
        IQ4_NL => include_str!("../../../shaders/quant/iq4_nl.wgsl"),
        IQ4_XS => include_str!("../../../shaders/quant/iq4_xs.wgsl"),
        _ => return None,
    };
    Some(body.to_string())
}

/// The `load_chunk` decoder of `ty` for weights held in a texture: a decoder of the layout in
/// `texlayout.rs` that fetches whole texels where there is one, else the generic decoder over the
/// byte helpers of bytes_tex.wgsl.
pub fn tex_quant_source(ty: GgmlType) -> Option<String> {
    use GgmlType::*;
    let body = match ty {
        Q8_0 => include_str!("../../../shaders/quant/tex/q8_0.wgsl"),
        Q5_0 => include_str!("../../../shaders/quant/tex/q5_0.wgsl"),
        Q4_K => include_str!("../../../shaders/quant/tex/q4_k.wgsl"),
        Q6_K => include_str!("../../../shaders/quant/tex/q6_k.wgsl"),
        _ => return quant_source(ty),
    };
    Some(body.to_string())
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
            _ => "main",
        }
    }

    /// The complete WGSL module of the kernel (`None` for an unsupported quant type).
    pub fn source(self) -> Option<String> {
        let (template, quant) = match self {
            Kernel::Matmul(t) => (include_str!("../../../shaders/matmul.wgsl"), Some(t)),
            Kernel::MatmulRows(t) => (include_str!("../../../shaders/matmul_rows.wgsl"), Some(t)),
            Kernel::MatmulTex(t, ..) => (include_str!("../../../shaders/matmul_tex.wgsl"), Some(t)),
            Kernel::Embed(t) | Kernel::EmbedTex(t) => (include_str!("../../../shaders/embed.wgsl"), Some(t)),
            Kernel::Add | Kernel::AddBias | Kernel::Scale | Kernel::Swiglu | Kernel::Geglu => {
                (include_str!("../../../shaders/elementwise.wgsl"), None)
            }
            Kernel::RmsNorm | Kernel::RmsNormInplace => (include_str!("../../../shaders/rmsnorm.wgsl"), None),
            Kernel::Rope => (include_str!("../../../shaders/rope.wgsl"), None),
            Kernel::KvStore => (include_str!("../../../shaders/kv_store.wgsl"), None),
            Kernel::Attention => (include_str!("../../../shaders/attention.wgsl"), None),
            Kernel::Argmax => (include_str!("../../../shaders/argmax.wgsl"), None),
        };
        let textured = matches!(self, Kernel::MatmulTex(..) | Kernel::EmbedTex(_));
        // The embedding template reads its weights with whichever helpers match their storage.
        let mut src = template
            .replace("//INCLUDE bytes.wgsl", if textured { BYTES_TEX } else { BYTES })
            .replace("//INCLUDE bytes_tex.wgsl", BYTES_TEX)
            .replace("//INCLUDE matmul_io.wgsl", MATMUL_IO);
        if let Kernel::MatmulTex(_, r, shared) = self {
            if !TEX_TILES.contains(&r) {
                return None;
            }
            src = src.replace("const R: u32 = 8u;", &format!("const R: u32 = {r}u;"));
            src = if shared {
                src.replace("//INCLUDE X", X_SUBGROUP).replace(
                    "@builtin(local_invocation_index) lane",
                    "@builtin(subgroup_invocation_id) lane",
                )
            } else {
                src.replace("//INCLUDE X", X_LANE)
            };
        }

        if let Some(t) = quant {
            let decoder = if textured {
                tex_quant_source(t)?
            } else {
                quant_source(t)?
            };
            src = src.replace("//INCLUDE QUANT", &decoder);
        }
        Some(src)
    }

    /// A name for labels and messages.
    pub fn label(self) -> String {
        match self {
            Kernel::Matmul(t) => format!("matmul_{}", t.name().to_lowercase()),
            Kernel::MatmulRows(t) => format!("matmul_rows_{}", t.name().to_lowercase()),
            Kernel::MatmulTex(t, r, shared) => format!(
                "matmul_tex{r}{}_{}",
                if shared { "_subgroup" } else { "" },
                t.name().to_lowercase()
            ),
            Kernel::Embed(t) => format!("embed_{}", t.name().to_lowercase()),
            Kernel::EmbedTex(t) => format!("embed_tex_{}", t.name().to_lowercase()),
            k => k.entry().to_string(),
        }
    }
}

/// Every kernel variant the backend can build.
pub fn all_variants() -> Vec<Kernel> {
    let mut v: Vec<Kernel> = QUANT_TYPES
        .iter()
        .flat_map(|&t| {
            [
                Kernel::Matmul(t),
                Kernel::MatmulRows(t),
                Kernel::Embed(t),
                Kernel::EmbedTex(t),
            ]
            .into_iter()
            .chain(
                TEX_TILES
                    .iter()
                    .flat_map(move |&r| [false, true].map(|s| Kernel::MatmulTex(t, r, s))),
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
        Kernel::Argmax,
    ]);
    v
}
