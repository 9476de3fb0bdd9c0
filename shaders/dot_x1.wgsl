// One decoded chunk (`wv`, its first `lim` values) times activations X[xb..], scalar loads.
fn chunk_dot(xb: u32, lim: u32) -> f32 {
    var s = 0.0;
    for (var i = 0u; i < 32u; i++) {
        s += select(0.0, wv[i] * X[xb + i], i < lim);
    }
    return s;
}
