//! The GPU kernels and their WGSL, generated at build time from `shaders/` (`build.rs`,
//! composed by [`compose`]): a kernel template includes the byte helpers and, for the kernels
//! that read weights, the `load_chunk` decoder of one GGUF block format. One template therefore
//! yields one variant per quant type; [`all_variants`] lists them for the naga validation test
//! and for compiling the fixed kernels at startup.

use super::compose;
use crate::backend::kv::KvType;
use crate::quant::GgmlType;

/// The passes of attention.wgsl: whole rows in one workgroup each (`Main`), or split across
/// the KV length (`Stats`, `Weigh`, `Merge`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttnPass {
    Main,
    Stats,
    Weigh,
    Merge,
}

/// The kernels of the backend (one compute pipeline per kernel, entry point and quant type).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// Quantized matmul/matvec over raw GGUF blocks, a workgroup per weight row (GPUs).
    Matmul {
        ty: GgmlType,
        /// Activation values per load: 1, or 4 for rows of a multiple of 4 values.
        width: u8,
        /// Sums reduced with subgroup operations (else in workgroup memory).
        subgroup: bool,
        /// Products in f16 (width 4 only; devices with shader-f16).
        f16: bool,
    },
    /// The same with one invocation per weight row and no workgroup memory.
    MatmulRows(GgmlType),
    /// The routed matmul over a stack of matrices, one invocation per (pair, weight row).
    MatmulId(GgmlType),
    /// One invocation per weight row, weights in a texture and activations in a uniform buffer
    /// (CPU adapters).
    MatmulTex {
        ty: GgmlType,
        /// Activation rows each decoded chunk meets: 1, 2, 4 or 8.
        rows: u8,
        /// The subgroup shares the activation loads (x_subgroup.wgsl).
        subgroup: bool,
    },
    /// Embedding row lookup from raw GGUF blocks.
    Embed(GgmlType),
    /// The same from weights kept in a texture.
    EmbedTex(GgmlType),
    Add,
    AddBias,
    Scale,
    Swiglu,
    Geglu,
    /// `x · sigmoid(gate)`.
    SigmoidMul,
    RmsNorm,
    RmsNormInplace,
    /// Walsh-Hadamard rotation of groups in place (hadamard.wgsl).
    Hadamard,
    Rope,
    /// Rows into a KV cache of the format.
    KvStore(KvType),
    /// A pass of attention, for heads of up to 256 values or (`.1`) up to
    /// [`crate::backend::attn::MAX_HEAD_DIM`] (registers sized for the widest heads slow down the
    /// common ones), over a KV cache of the format `.2`.
    Attention(AttnPass, bool, KvType),
    Argmax,
    /// A sampler's candidates: top k and gathered values (select.wgsl).
    Select,
    /// A mixture-of-experts router: ids and weights of each row's chosen experts.
    Route,
    /// The weighted sum of each row's expert outputs.
    MoeCombine,
    /// gpt-oss's clamped SwiGLU.
    SwigluOai,
    /// The causal conv1d of gated-delta-net layers, with its state (ssm_conv.wgsl).
    SsmConv,
    /// A gated delta net's log-decays and betas (delta_gates.wgsl).
    DeltaGates,
    /// The gated delta rule, token by token (delta_net.wgsl).
    DeltaNet,
    /// RMS norm in place times SiLU of a gate (rmsnorm.wgsl's `gated`).
    RmsNormGated,
    /// Activations rounded as the CPU hands them to a matmul over a weight format
    /// (quantize_act.wgsl; [`super::plan::act_rounding`]).
    QuantizeAct,
    /// Activations quantized to packed Q8_0 blocks for [`Kernel::MatmulDot`]
    /// (quantize_q8_packed.wgsl).
    QuantizeQ8Packed,
    /// Matmul with integer dot products over int8 blocks (matmul_dot.wgsl; Q8_0 weights only,
    /// a workgroup per weight row): the Vulkan backend's path where the device has
    /// VK_KHR_shader_integer_dot_product.
    MatmulDot(GgmlType),
    /// Matmul with cooperative matrices of `size` x `size` f16 values summed in f32
    /// (matmul_coop.wgsl; a workgroup per 32 activation rows by 64 weight rows): the Vulkan
    /// backend's prefill path where the device has VK_KHR_cooperative_matrix. Not for F32
    /// weights (routers and other small matrices a model keeps in f32 for their precision:
    /// they stay in f32 arithmetic, as on the CPU). Not built for the browser.
    MatmulCoop {
        ty: GgmlType,
        size: u8,
    },
}

include!(concat!(env!("OUT_DIR"), "/wgsl_variants.rs"));

/// Activation rows per invocation of the [`Kernel::MatmulTex`] variants.
pub const TEX_TILES: [u8; 4] = compose::TEX_TILES;

/// Sizes of the cooperative matrices of the [`Kernel::MatmulCoop`] variants.
pub const COOP_SIZES: [u8; 2] = compose::COOP_SIZES;

/// Block formats the WGSL decoders read ([`crate::quant::support`]).
pub fn quant_types() -> Vec<GgmlType> {
    crate::quant::supported(|s| s.wgsl)
}

/// The generated source named `name`.
pub fn generated(name: &str) -> Option<&'static str> {
    VARIANTS
        .binary_search_by(|(n, _)| (*n).cmp(name))
        .ok()
        .map(|i| VARIANTS[i].1)
}

/// Whether weights of type `ty` can be multiplied and looked up.
pub fn supports(ty: GgmlType) -> bool {
    crate::quant::support::SUPPORT
        .iter()
        .any(|s| s.wgsl && s.name.eq_ignore_ascii_case(ty.name()))
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
            Kernel::SigmoidMul => "sigmoid_mul",
            Kernel::RmsNormInplace => "inplace",
            Kernel::MoeCombine => "combine",
            Kernel::SwigluOai => "swiglu_oai",
            Kernel::RmsNormGated => "gated",
            Kernel::Attention(AttnPass::Stats, ..) => "stats",
            Kernel::Attention(AttnPass::Weigh, ..) => "weigh",
            Kernel::Attention(AttnPass::Merge, ..) => "merge",
            _ => "main",
        }
    }

    /// Whether the kernel reads a weight matrix in its format (a variant per format): made
    /// when a weight of that format loads, not at startup.
    pub fn reads_weights(self) -> bool {
        matches!(
            self,
            Kernel::Matmul { .. }
                | Kernel::MatmulRows(_)
                | Kernel::MatmulTex { .. }
                | Kernel::MatmulId(_)
                | Kernel::MatmulDot(_)
                | Kernel::MatmulCoop { .. }
                | Kernel::Embed(_)
                | Kernel::EmbedTex(_)
        )
    }

    /// The complete WGSL module of the kernel, generated at build time (`None` for an
    /// unsupported quant type or tile).
    pub fn source(self) -> Option<&'static str> {
        generated(&self.variant())
    }

    /// A name for labels and messages.
    pub fn label(self) -> String {
        match self {
            Kernel::Attention(pass, ..) if pass != AttnPass::Main => format!("{}_{}", self.variant(), self.entry()),
            k => k.variant(),
        }
    }

    /// The name of its generated variant (one module may hold several kernels' entry points).
    pub fn variant(self) -> String {
        let q = |t: GgmlType| t.name().to_lowercase();
        match self {
            Kernel::Matmul {
                ty,
                width,
                subgroup,
                f16,
            } => compose::name(if f16 { "matmul_f16" } else { "matmul" }, &q(ty), width, subgroup),
            Kernel::MatmulRows(t) => compose::name("matmul_rows", &q(t), 0, false),
            Kernel::MatmulId(t) => compose::name("matmul_id", &q(t), 0, false),
            Kernel::MatmulTex { ty, rows, subgroup } => compose::name("matmul_tex", &q(ty), rows, subgroup),
            Kernel::Embed(t) => compose::name("embed", &q(t), 0, false),
            Kernel::EmbedTex(t) => compose::name("embed_tex", &q(t), 0, false),
            Kernel::Add => "add".into(),
            Kernel::AddBias => "add_bias".into(),
            Kernel::Scale => "scale".into(),
            Kernel::Swiglu => "swiglu".into(),
            Kernel::Geglu => "geglu".into(),
            Kernel::SigmoidMul => "sigmoid_mul".into(),
            Kernel::RmsNorm => "rmsnorm".into(),
            Kernel::RmsNormInplace => "rmsnorm_inplace".into(),
            Kernel::Hadamard => "hadamard".into(),
            Kernel::Rope => "rope".into(),
            Kernel::KvStore(KvType::F16) => "kv_store".into(),
            Kernel::KvStore(KvType::Q8_0) => "kv_store_q8_0".into(),
            Kernel::Attention(_, wide, kv) => format!(
                "attention{}{}",
                if wide { "_wide" } else { "" },
                match kv {
                    KvType::F16 => "",
                    KvType::Q8_0 => "_q8_0",
                }
            ),
            Kernel::Argmax => "argmax".into(),
            Kernel::Select => "select".into(),
            Kernel::Route => "route".into(),
            Kernel::MoeCombine => "moe_combine".into(),
            Kernel::SwigluOai => "swiglu_oai".into(),
            Kernel::SsmConv => "ssm_conv".into(),
            Kernel::DeltaGates => "delta_gates".into(),
            Kernel::DeltaNet => "delta_net".into(),
            Kernel::RmsNormGated => "rmsnorm_gated".into(),
            Kernel::QuantizeAct => "quantize_act".into(),
            Kernel::QuantizeQ8Packed => "quantize_q8_packed".into(),
            Kernel::MatmulDot(t) => compose::name("matmul_dot", &q(t), 0, false),
            Kernel::MatmulCoop { ty, size } => compose::name("matmul_coop", &q(ty), size, false),
        }
    }
}

/// Every kernel variant the backend can build.
pub fn all_variants() -> Vec<Kernel> {
    let mut v: Vec<Kernel> = quant_types()
        .into_iter()
        .flat_map(|t| {
            [
                Kernel::MatmulRows(t),
                Kernel::MatmulId(t),
                Kernel::Embed(t),
                Kernel::EmbedTex(t),
            ]
            .into_iter()
            .chain(
                TEX_TILES
                    .iter()
                    .flat_map(move |&rows| [false, true].map(|subgroup| Kernel::MatmulTex { ty: t, rows, subgroup })),
            )
            .chain(
                // Widths 1 and 4 in f32, width 4 in f16.
                [(1, false), (4, false), (4, true)]
                    .into_iter()
                    .flat_map(move |(width, f16)| {
                        [false, true].map(|subgroup| Kernel::Matmul {
                            ty: t,
                            width,
                            subgroup,
                            f16,
                        })
                    }),
            )
        })
        .collect();
    v.extend([
        Kernel::Add,
        Kernel::AddBias,
        Kernel::Scale,
        Kernel::Swiglu,
        Kernel::Geglu,
        Kernel::SigmoidMul,
        Kernel::RmsNorm,
        Kernel::RmsNormInplace,
        Kernel::Hadamard,
        Kernel::Rope,
        Kernel::Argmax,
        Kernel::Select,
        Kernel::Route,
        Kernel::MoeCombine,
        Kernel::SwigluOai,
        Kernel::SsmConv,
        Kernel::DeltaGates,
        Kernel::DeltaNet,
        Kernel::RmsNormGated,
        Kernel::QuantizeAct,
        Kernel::QuantizeQ8Packed,
        Kernel::MatmulDot(GgmlType::Q8_0),
    ]);
    #[cfg(not(target_arch = "wasm32"))]
    v.extend(
        quant_types()
            .into_iter()
            .filter(|&ty| ty != GgmlType::F32)
            .flat_map(|ty| COOP_SIZES.map(|size| Kernel::MatmulCoop { ty, size })),
    );
    for (kv, _) in KvType::ALL {
        v.extend(kv_kernels(kv));
    }
    v
}

/// The kernels that store into and attend over a KV cache of format `ty`: its store, and
/// every attention pass, narrow and wide.
pub fn kv_kernels(ty: KvType) -> Vec<Kernel> {
    let passes = [AttnPass::Main, AttnPass::Stats, AttnPass::Weigh, AttnPass::Merge];
    let attention = [false, true]
        .into_iter()
        .flat_map(|wide| passes.map(|pass| Kernel::Attention(pass, wide, ty)));
    std::iter::once(Kernel::KvStore(ty)).chain(attention).collect()
}
