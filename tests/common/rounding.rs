//! How both backends (and ggml) round a matmul's activations, by the library's scalar rules:
//! the oracle of the GPU rounding tests. Not in `common/mod.rs`: the browser tests include that
//! and have no `half`.

/// `x` as a matmul over `ty` weights sees it, by the library's scalar rules: quantized to
/// `ty.vec_dot_type()` (Q8_0, Q8_K) and decoded, or rounded to f16/bf16 for half weights.
pub fn rounded_activations(ty: tinyllm::quant::GgmlType, x: &[f32]) -> Vec<f32> {
    use tinyllm::quant::GgmlType;
    match (ty, ty.vec_dot_type()) {
        (GgmlType::F16, _) => x.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect(),
        (GgmlType::BF16, _) => x.iter().map(|&v| half::bf16::from_f32(v).to_f32()).collect(),
        (_, GgmlType::F32) => x.to_vec(),
        (_, act) => {
            let mut blocks = Vec::new();
            tinyllm::quant::quantize_activations(ty, x, &mut blocks).expect("whole blocks");
            let mut out = vec![0.0; x.len()];
            tinyllm::quant::dequantize(act, &blocks, &mut out).expect("decode");
            out
        }
    }
}
