// One decoded chunk (`wv`, its first `lim` values) times activations X[xb..], vec4 loads and
// dot products (X is array<vec4<f32>> in this variant; rows of a multiple of 4 values, so `xb`
// and `lim` are multiples of 4).
fn chunk_dot(xb: u32, lim: u32) -> f32 {
    var s = 0.0;
    let x0 = xb / 4u;
    for (var i = 0u; i < 8u; i++) {
        let w = vec4<f32>(wv[4u * i], wv[4u * i + 1u], wv[4u * i + 2u], wv[4u * i + 3u]);
        s += select(0.0, dot(w, X[x0 + i]), 4u * i < lim);
    }
    return s;
}
