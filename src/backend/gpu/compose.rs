//! How the WGSL kernel variants are composed from `shaders/`: a template's `//INCLUDE` lines
//! take the byte helpers, the activation loader and the `load_chunk` decoder of one block
//! format, and a few constants are specialized. The build script (`build.rs`) runs this at
//! build time and writes every variant to `OUT_DIR/wgsl/NAME.wgsl`; the library embeds those
//! files (`kernels.rs`), so the variant list and the composition live in this one file.
//!
//! Plain Rust with no crate imports: `build.rs` includes it with `#[path]`. Which formats
//! have decoders comes from the caller (`quant::support`, which the build script includes too).

/// A block format with a WGSL decoder.
#[derive(Debug, Clone, Copy)]
pub struct Quant {
    /// Its lowercase GGUF name (`shaders/quant/NAME.wgsl`).
    pub name: &'static str,
    /// It has a decoder of its own for texture-held weights (`shaders/quant/tex/`; the others
    /// use their generic decoder over the texture byte helpers).
    pub texture_decoder: bool,
    /// Its weights are never held in textures (the codebook formats, whose buffers begin with
    /// their grid table): no texture variants.
    pub buffers_only: bool,
}

/// Activation rows per invocation of the texture matmul variants.
pub const TEX_TILES: [u8; 4] = [1, 2, 4, 8];

/// Activation load widths of the workgroup matmul variants (f32 or vec4).
pub const X_WIDTHS: [u8; 2] = [1, 4];

/// Sizes of the cooperative matrices of the `matmul_coop` variants (T x T x T; Vulkan only):
/// 16 where GPUs have tensor cores or WMMA, 8 where Mesa lavapipe emulates them.
pub const COOP_SIZES: [u8; 2] = [8, 16];

/// One variant of the backend's `Kernel` enum, declared once: the build script emits the enum,
/// the plain kernels' modules, entry points and list from this table (`OUT_DIR/kernel_table.rs`,
/// included by `kernels.rs`) and composes each plain kernel's module from its template. Adding
/// a plain kernel is one row here (and its shader and op); the others are named by
/// `Kernel::variant` in `kernels.rs`.
pub struct KernelDecl {
    /// The variant's doc comment.
    pub doc: &'static str,
    /// The variant as Rust writes it: its name, with its fields where it has any.
    pub variant: &'static str,
    /// A plain kernel (no weight format, no parameters): its generated module, its template in
    /// `shaders/`, and its entry point there.
    pub plain: Option<(&'static str, &'static str, &'static str)>,
}

/// A plain kernel's row.
const fn plain(
    doc: &'static str,
    variant: &'static str,
    module: &'static str,
    template: &'static str,
    entry: &'static str,
) -> KernelDecl {
    KernelDecl {
        doc,
        variant,
        plain: Some((module, template, entry)),
    }
}

/// Another kernel's row.
const fn other(doc: &'static str, variant: &'static str) -> KernelDecl {
    KernelDecl {
        doc,
        variant,
        plain: None,
    }
}

/// The backend's kernels (one compute pipeline per kernel, entry point and quant type).
pub const KERNELS: &[KernelDecl] = &[
    other(
        "Quantized matmul/matvec over raw GGUF blocks, a workgroup per weight row (GPUs).",
        "Matmul {
        ty: GgmlType,
        /// Activation values per load: 1, or 4 for rows of a multiple of 4 values.
        width: u8,
        /// Sums reduced with subgroup operations (else in workgroup memory).
        subgroup: bool,
        /// Products in f16 (width 4 only; devices with shader-f16).
        f16: bool,
    }",
    ),
    other(
        "The same with one invocation per weight row and no workgroup memory.",
        "MatmulRows(GgmlType)",
    ),
    other(
        "The routed matmul over a stack of matrices, one invocation per (pair, weight row).",
        "MatmulId(GgmlType)",
    ),
    other(
        "One invocation per weight row, weights in a texture and activations in a uniform buffer (CPU adapters).",
        "MatmulTex {
        ty: GgmlType,
        /// Activation rows each decoded chunk meets: 1, 2, 4 or 8.
        rows: u8,
        /// The subgroup shares the activation loads (x_subgroup.wgsl).
        subgroup: bool,
    }",
    ),
    other("Embedding row lookup from raw GGUF blocks.", "Embed(GgmlType)"),
    other("The same from weights kept in a texture.", "EmbedTex(GgmlType)"),
    plain("`x += y`.", "Add", "add", "elementwise.wgsl", "add"),
    plain("`x += bias`, row by row.", "AddBias", "add_bias", "elementwise.wgsl", "add_bias"),
    plain("`x *= s`.", "Scale", "scale", "elementwise.wgsl", "scale"),
    plain("`gate = silu(gate) · up`.", "Swiglu", "swiglu", "elementwise.wgsl", "swiglu"),
    plain("`gate = gelu(gate) · up`.", "Geglu", "geglu", "elementwise.wgsl", "geglu"),
    plain("`x · sigmoid(gate)`.", "SigmoidMul", "sigmoid_mul", "elementwise.wgsl", "sigmoid_mul"),
    plain("RMS norm times a weight, into another buffer.", "RmsNorm", "rmsnorm", "rmsnorm.wgsl", "main"),
    plain("RMS norm times a weight, in place.", "RmsNormInplace", "rmsnorm_inplace", "rmsnorm.wgsl", "inplace"),
    plain("Walsh-Hadamard rotation of groups in place.", "Hadamard", "hadamard", "hadamard.wgsl", "main"),
    plain("Rotary position embedding in place.", "Rope", "rope", "rope.wgsl", "main"),
    other("Rows into a KV cache of the format.", "KvStore(KvType)"),
    other(
        "A pass of attention, for heads of up to 256 values or (`.1`) up to `attn::MAX_HEAD_DIM` (registers sized for the widest heads slow down the common ones), over a KV cache of the format `.2`.",
        "Attention(AttnPass, bool, KvType)",
    ),
    plain("Each row's largest value's index.", "Argmax", "argmax", "argmax.wgsl", "main"),
    plain("A sampler's candidates: top k and gathered values.", "Select", "select", "select.wgsl", "main"),
    plain("A mixture-of-experts router: ids and weights of each row's chosen experts.", "Route", "route", "route.wgsl", "main"),
    plain("The weighted sum of each row's expert outputs.", "MoeCombine", "moe_combine", "moe.wgsl", "combine"),
    plain("gpt-oss's clamped SwiGLU.", "SwigluOai", "swiglu_oai", "moe.wgsl", "swiglu_oai"),
    plain("The causal conv1d of gated-delta-net layers, with its state.", "SsmConv", "ssm_conv", "ssm_conv.wgsl", "main"),
    plain("A gated delta net's log-decays and betas.", "DeltaGates", "delta_gates", "delta_gates.wgsl", "main"),
    plain("The gated delta rule, token by token.", "DeltaNet", "delta_net", "delta_net.wgsl", "main"),
    plain("RMS norm in place times SiLU of a gate.", "RmsNormGated", "rmsnorm_gated", "rmsnorm.wgsl", "gated"),
    plain(
        "Activations rounded as the CPU hands them to a matmul over a weight format (quantize_act.wgsl; `plan::act_rounding`).",
        "QuantizeAct",
        "quantize_act",
        "quantize_act.wgsl",
        "main",
    ),
    plain(
        "Activations quantized to packed Q8_0 blocks for [`Kernel::MatmulDot`].",
        "QuantizeQ8Packed",
        "quantize_q8_packed",
        "quantize_q8_packed.wgsl",
        "main",
    ),
    other(
        "Matmul with integer dot products over int8 blocks (matmul_dot.wgsl; Q8_0 weights only, a workgroup per weight row): the Vulkan backend's path where the device has VK_KHR_shader_integer_dot_product.",
        "MatmulDot(GgmlType)",
    ),
    other(
        "Matmul with cooperative matrices of `size` x `size` f16 values summed in f32 (matmul_coop.wgsl; a workgroup per 32 activation rows by 64 weight rows): the Vulkan backend's prefill path where the device has VK_KHR_cooperative_matrix. Not for F32 weights (routers and other small matrices a model keeps in f32 for their precision: they stay in f32 arithmetic, as on the CPU). Not built for the browser.",
        "MatmulCoop { ty: GgmlType, size: u8 }",
    ),
];

/// The modules without a weight format besides the plain kernels': the KV store over an f16
/// or (`_q8_0`) a q8_0 cache, attention.wgsl over each (the wide ones with registers for the
/// widest heads), and the integer-dot matmul's one format.
pub const OTHER_MODULES: [&str; 7] = [
    "kv_store",
    "kv_store_q8_0",
    "attention",
    "attention_wide",
    "attention_q8_0",
    "attention_wide_q8_0",
    "matmul_dot_q8_0",
];

/// The name of a variant: the file name in `OUT_DIR/wgsl/` and the pipeline label. `tile` is
/// the texture matmul's activation rows or the workgroup matmul's activation load width.
pub fn name(kind: &str, quant: &str, tile: u8, subgroup: bool) -> String {
    match kind {
        "matmul_tex" => format!("matmul_tex{tile}{}_{quant}", if subgroup { "_subgroup" } else { "" }),
        // `tile`: the activation load width.
        "matmul" => format!("matmul_x{tile}{}_{quant}", if subgroup { "_subgroup" } else { "" }),
        "matmul_f16" => format!("matmul_x{tile}_f16{}_{quant}", if subgroup { "_subgroup" } else { "" }),
        // `tile`: the cooperative matrices' size.
        "matmul_coop" => format!("matmul_coop{tile}_{quant}"),
        _ if quant.is_empty() => kind.to_string(),
        _ => format!("{kind}_{quant}"),
    }
}

/// Every variant as (name, WGSL source), for the formats `quants`; `read` returns a file of
/// `shaders/` by relative path.
pub fn variants(read: &dyn Fn(&str) -> String, quants: &[Quant]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for quant in quants {
        let (q, tex) = (quant.name, quant.texture_decoder);
        for kind in ["matmul_rows", "matmul_id", "embed", "embed_tex"] {
            if kind == "embed_tex" && quant.buffers_only {
                continue;
            }
            out.push((name(kind, q, 0, false), compose(read, kind, q, 0, false, tex)));
        }
        for subgroup in [false, true] {
            for width in X_WIDTHS {
                let src = compose(read, "matmul", q, width, subgroup, tex);
                out.push((name("matmul", q, width, subgroup), src));
            }
            // f16 products (devices with shader-f16): vec4 loads only.
            let src = compose(read, "matmul_f16", q, 4, subgroup, tex);
            out.push((name("matmul_f16", q, 4, subgroup), src));
        }
        for tile in TEX_TILES.into_iter().filter(|_| !quant.buffers_only) {
            for subgroup in [false, true] {
                let src = compose(read, "matmul_tex", q, tile, subgroup, tex);
                out.push((name("matmul_tex", q, tile, subgroup), src));
            }
        }
        // Not for f32 weights: routers and other small matrices kept in f32 for precision.
        for size in COOP_SIZES.into_iter().filter(|_| q != "f32") {
            out.push((
                name("matmul_coop", q, size, false),
                compose(read, "matmul_coop", q, size, false, tex),
            ));
        }
    }
    let plain = KERNELS.iter().filter_map(|k| k.plain.map(|(module, ..)| module));
    for kind in plain.chain(OTHER_MODULES) {
        out.push((kind.to_string(), compose(read, kind, "", 0, false, false)));
    }
    out
}

/// The source of one variant (`tex`: the format has a texture decoder of its own).
fn compose(read: &dyn Fn(&str) -> String, kind: &str, quant: &str, tile: u8, subgroup: bool, tex: bool) -> String {
    let f16 = kind == "matmul_f16";
    let kind = if f16 { "matmul" } else { kind };
    let declared = KERNELS
        .iter()
        .find_map(|k| k.plain.filter(|(module, ..)| *module == kind).map(|(_, t, _)| t));
    let template = match kind {
        _ if declared.is_some() => declared.unwrap_or_default().to_string(),
        "attention_wide" | "attention_q8_0" | "attention_wide_q8_0" => "attention.wgsl".to_string(),
        "embed_tex" => "embed.wgsl".to_string(),
        "matmul_dot_q8_0" => "matmul_dot.wgsl".to_string(),
        k => format!("{k}.wgsl"),
    };
    let textured = matches!(kind, "matmul_tex" | "embed_tex");
    // The embedding template reads its weights with whichever helpers match their storage.
    let bytes = read(if textured { "bytes_tex.wgsl" } else { "bytes.wgsl" });
    let mut src = read(&template)
        .replace("//INCLUDE bytes.wgsl", &bytes)
        .replace("//INCLUDE bytes_tex.wgsl", &read("bytes_tex.wgsl"))
        .replace("//INCLUDE matmul_io.wgsl", &read("matmul_io.wgsl"))
        .replace("//INCLUDE matmul_params.wgsl", &read("matmul_params.wgsl"));
    if kind == "matmul" {
        let dot = if f16 {
            "dot_x4_f16.wgsl".to_string()
        } else {
            format!("dot_x{tile}.wgsl")
        };
        src = src.replace("//INCLUDE DOT", &read(&dot));
        if f16 {
            src = format!("enable f16;\n{src}");
        }
        if tile == 4 {
            src = src.replace(
                "var<storage, read> X: array<f32>;",
                "var<storage, read> X: array<vec4<f32>>;",
            );
        }
        src = if subgroup {
            src.replace("//INCLUDE REDUCE", &read("reduce_subgroup.wgsl"))
                .replace(
                    "@builtin(local_invocation_index) li: u32) {",
                    "@builtin(local_invocation_index) li: u32, @builtin(subgroup_invocation_id) sl: u32) {",
                )
                .replace("//SUBGROUP SETUP", "sg_lane = sl;")
        } else {
            src.replace("//INCLUDE REDUCE", &read("reduce_workgroup.wgsl"))
        };
    }
    if kind == "matmul_dot_q8_0" {
        src = src.replace("//INCLUDE REDUCE", &read("reduce_workgroup.wgsl"));
    }
    if kind == "matmul_coop" {
        let t = format!("coop_mat{tile}x{tile}<");
        src = src
            .replace("const T: u32 = 16u;", &format!("const T: u32 = {tile}u;"))
            .replace("coop_mat16x16<", &t);
    }
    if kind.starts_with("attention") {
        // The cache format's reads.
        let kv = if kind.ends_with("_q8_0") {
            "kv_q8_0.wgsl"
        } else {
            "kv_f16.wgsl"
        };
        src = src.replace("//INCLUDE KV", &read(kv));
    }
    if kind.starts_with("attention_wide") {
        // Heads up to MLA's 576 values (backend::MAX_HEAD_DIM).
        src = src.replace("const MAX_HD: u32 = 256u;", "const MAX_HD: u32 = 576u;");
    }
    if kind == "matmul_tex" {
        src = src.replace("const R: u32 = 8u;", &format!("const R: u32 = {tile}u;"));
        src = if subgroup {
            src.replace("//INCLUDE X", &read("x_subgroup.wgsl")).replace(
                "@builtin(local_invocation_index) lane",
                "@builtin(subgroup_invocation_id) lane",
            )
        } else {
            src.replace("//INCLUDE X", &read("x_lane.wgsl"))
        };
    }
    if !quant.is_empty() {
        let decoder = if textured && tex {
            read(&format!("quant/tex/{quant}.wgsl"))
        } else {
            read(&format!("quant/{quant}.wgsl"))
        };
        // Layout pieces the buffer and texture decoders of a format share.
        let shared = match quant {
            "q4_k" | "q5_k" => read("quant/kscale.wgsl"),
            "q5_0" => read("quant/q5_0_values.wgsl"),
            "iq2_xxs" | "iq2_xs" | "iq2_s" | "iq3_xxs" | "iq3_s" | "iq1_s" | "iq1_m" => read("quant/iq_grid.wgsl"),
            _ => String::new(),
        };
        src = src.replace("//INCLUDE QUANT", &format!("{shared}\n{decoder}"));
    }
    src
}
