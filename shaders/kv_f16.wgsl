// attention.wgsl over an f16 cache: f32 values rounded to f16. The query is rounded to f16 and
// so is each normalized probability, as the CPU backend and ggml's non-flash path do.

@group(0) @binding(2) var<storage, read> KC: array<f32>;
@group(0) @binding(3) var<storage, read> VC: array<f32>;

var<private> q16: array<f32, MAX_HD>;

/// Load the query head at `qb` of Q.
fn load_q(qb: u32) {
    for (var d = 0u; d < P.hd_k; d++) {
        q16[d] = f16r(Q[qb + d]);
    }
}

/// q·k of the K head at `kb` (raw: before soft-capping and the scale).
fn dot_k(kb: u32) -> f32 {
    var s = 0.0;
    for (var d = 0u; d < P.hd_k; d++) {
        s += q16[d] * KC[kb + d];
    }
    return s;
}

/// A normalized probability as it weights V.
fn prob(p: f32) -> f32 {
    return f16r(p);
}

/// acc += p * the V head at `vb`.
fn add_v(vb: u32, p: f32) {
    for (var d = 0u; d < P.hd_v; d++) {
        acc[d] += p * VC[vb + d];
    }
}
