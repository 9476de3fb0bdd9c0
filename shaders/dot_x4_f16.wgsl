// One decoded chunk (`wv`, its first `lim` values) times activations X[xb..], vec4 loads, the
// products and each dot of four in f16 (the shader-f16 variant), the sums in f32. Activations
// are rounded to f16 on the way, so values beyond f16's range (65504) overflow: opt-in.
fn chunk_dot(xb: u32, lim: u32) -> f32 {
    var s = 0.0;
    let x0 = xb / 4u;
    for (var i = 0u; i < 8u; i++) {
        let w = vec4<f16>(vec4<f32>(wv[4u * i], wv[4u * i + 1u], wv[4u * i + 2u], wv[4u * i + 3u]));
        s += select(0.0, f32(dot(w, vec4<f16>(X[x0 + i]))), 4u * i < lim);
    }
    return s;
}
