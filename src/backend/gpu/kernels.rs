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

include!(concat!(env!("OUT_DIR"), "/kernel_table.rs"));
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

/// The codebook formats (IQ1-IQ3): their buffers begin with their grid table (`grids.rs`).
pub fn codebook(ty: GgmlType) -> bool {
    crate::quant::support_of(ty).is_some_and(|s| s.wgsl_grid)
}

/// Whether weights of type `ty` may be held in textures: not the codebook formats.
pub fn in_textures(ty: GgmlType) -> bool {
    supports(ty) && !codebook(ty)
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
            Kernel::Attention(AttnPass::Stats, ..) => "stats",
            Kernel::Attention(AttnPass::Weigh, ..) => "weigh",
            Kernel::Attention(AttnPass::Merge, ..) => "merge",
            k => k.plain().map_or("main", |(_, entry)| entry),
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
            Kernel::MatmulDot(t) => compose::name("matmul_dot", &q(t), 0, false),
            Kernel::MatmulCoop { ty, size } => compose::name("matmul_coop", &q(ty), size, false),
            // The plain kernels: their declared module (`compose::KERNELS`). A kernel with
            // parameters that is not named above has none, and so no source.
            k => k.plain().map_or_else(String::new, |(module, _)| module.into()),
        }
    }
}

/// Every kernel variant the backend can build.
pub fn all_variants() -> Vec<Kernel> {
    let mut v: Vec<Kernel> =
        quant_types()
            .into_iter()
            .flat_map(|t| {
                // The codebook formats are never held in textures: no texture variants.
                let textures = if in_textures(t) { &TEX_TILES[..] } else { &[] };
                [Kernel::MatmulRows(t), Kernel::MatmulId(t), Kernel::Embed(t)]
                    .into_iter()
                    .chain(in_textures(t).then_some(Kernel::EmbedTex(t)))
                    .chain(textures.iter().flat_map(move |&rows| {
                        [false, true].map(|subgroup| Kernel::MatmulTex { ty: t, rows, subgroup })
                    }))
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
    v.extend(PLAIN_KERNELS);
    v.push(Kernel::MatmulDot(GgmlType::Q8_0));
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
