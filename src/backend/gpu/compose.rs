//! How the WGSL kernel variants are composed from `shaders/`: a template's `//INCLUDE` lines
//! take the byte helpers, the activation loader and the `load_chunk` decoder of one block
//! format, and a few constants are specialized. The build script (`build.rs`) runs this at
//! build time and writes every variant to `OUT_DIR/wgsl/NAME.wgsl`; the library embeds those
//! files (`kernels.rs`), so the variant list and the composition live in this one file.
//!
//! Plain Rust with no crate imports: `build.rs` includes it with `#[path]`. Which formats
//! have decoders comes from the caller (`quant::support`, which the build script includes too).

/// A block format with a WGSL decoder: its lowercase GGUF name, and whether it has a decoder
/// of its own for texture-held weights (`shaders/quant/tex/`; the others use their generic
/// decoder over the texture byte helpers).
pub type Quant = (&'static str, bool);

/// Activation rows per invocation of the texture matmul variants.
pub const TEX_TILES: [u8; 4] = [1, 2, 4, 8];

/// Activation load widths of the workgroup matmul variants (f32 or vec4).
pub const X_WIDTHS: [u8; 2] = [1, 4];

/// Sizes of the cooperative matrices of the `matmul_coop` variants (T x T x T; Vulkan only):
/// 16 where GPUs have tensor cores or WMMA, 8 where Mesa lavapipe emulates them.
pub const COOP_SIZES: [u8; 2] = [8, 16];

/// Kernels without a weight format, by name (their template is `shaders/NAME.wgsl`, except
/// the elementwise ops, the in-place and gated rmsnorms and the expert ops (moe.wgsl), which
/// share one, and the attention variants: attention.wgsl over an f16 or (`_q8_0`) a q8_0 cache,
/// the wide ones with registers for the widest heads).
pub const PLAIN: [&str; 28] = [
    "add",
    "add_bias",
    "scale",
    "swiglu",
    "geglu",
    "sigmoid_mul",
    "rmsnorm",
    "rmsnorm_inplace",
    "hadamard",
    "rope",
    "kv_store",
    "kv_store_q8_0",
    "attention",
    "attention_wide",
    "attention_q8_0",
    "attention_wide_q8_0",
    "argmax",
    "select",
    "route",
    "moe_combine",
    "swiglu_oai",
    "ssm_conv",
    "delta_gates",
    "delta_net",
    "rmsnorm_gated",
    "quantize_act",
    "quantize_q8_packed",
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
    for &(q, tex) in quants {
        for kind in ["matmul_rows", "matmul_id", "embed", "embed_tex"] {
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
        for tile in TEX_TILES {
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
    for kind in PLAIN {
        out.push((kind.to_string(), compose(read, kind, "", 0, false, false)));
    }
    out
}

/// The source of one variant (`tex`: the format has a texture decoder of its own).
fn compose(read: &dyn Fn(&str) -> String, kind: &str, quant: &str, tile: u8, subgroup: bool, tex: bool) -> String {
    let f16 = kind == "matmul_f16";
    let kind = if f16 { "matmul" } else { kind };
    let template = match kind {
        "add" | "add_bias" | "scale" | "swiglu" | "geglu" | "sigmoid_mul" => "elementwise.wgsl".to_string(),
        "rmsnorm_inplace" | "rmsnorm_gated" => "rmsnorm.wgsl".to_string(),
        "moe_combine" | "swiglu_oai" => "moe.wgsl".to_string(),
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
            _ => String::new(),
        };
        src = src.replace("//INCLUDE QUANT", &format!("{shared}\n{decoder}"));
    }
    src
}
