// One decoded chunk (`wv`, its first `lim` values) times activations X[xb..], vec4 loads, the
// products and each dot of four in f16 (the shader-f16 variant), the sums in f32. A vec4 whose
// products could leave f16's range (|w|max * |x|max of 16000 or more, so a dot of four stays
// below 65504) is multiplied in f32 instead: never an overflow, whatever the activations.
fn chunk_dot(xb: u32, lim: u32) -> f32 {
    var s = 0.0;
    let x0 = xb / 4u;
    for (var i = 0u; i < 8u; i++) {
        let w = vec4<f32>(wv[4u * i], wv[4u * i + 1u], wv[4u * i + 2u], wv[4u * i + 3u]);
        let x = X[x0 + i];
        let aw = abs(w);
        let ax = abs(x);
        let bound = max(max(aw.x, aw.y), max(aw.z, aw.w)) * max(max(ax.x, ax.y), max(ax.z, ax.w));
        var d: f32;
        if (bound < 16000.0) {
            d = f32(dot(vec4<f16>(w), vec4<f16>(x)));
        } else {
            d = dot(w, x);
        }
        s += select(0.0, d, 4u * i < lim);
    }
    return s;
}
