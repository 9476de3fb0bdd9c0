// A mixture-of-experts router: each row's `n_expert` logits become its `k` chosen experts
// (ids as whole f32 numbers) and their weights, by the scalar rule of `Route::row`
// (src/backend/moe.rs): scores by softmax, sigmoid or the raw logit (gating 0, 1, 2), chosen
// in descending order of score + bias (the bias only chooses; deepseek V3's `exp_probs_b`),
// ties to the lower id and NaN after every number; then softmax over the chosen (gating 2),
// the norm (sum clamped below at 6.1035e-5) and the scale. One invocation per row: a row is a
// few hundred values at most, and routing on the device keeps the ids there for matmul_id.

struct Params {
    rows: u32,
    n_expert: u32,
    k: u32,
    gating: u32,
    norm: u32,
    has_bias: u32,
    scale: f32,
    grid_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> L: array<f32>;
@group(0) @binding(2) var<storage, read> BIAS: array<f32>;
@group(0) @binding(3) var<storage, read_write> IDS: array<f32>;
@group(0) @binding(4) var<storage, read_write> WTS: array<f32>;

const MIN_WEIGHT_SUM: f32 = 6.1035156e-5;

// By the bits: compilers may fold `x != x` away.
fn is_nan(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}

// Whether expert a (score sa) is chosen before expert b (score sb).
fn before(sa: f32, a: u32, sb: f32, b: u32) -> bool {
    let na = is_nan(sa);
    let nb = is_nan(sb);
    if (na != nb) {
        return nb;
    }
    if (na || sa == sb) {
        return a < b;
    }
    return sa > sb;
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.x + gid.y * P.grid_x * 64u;
    if (r >= P.rows) {
        return;
    }
    let lb = r * P.n_expert;
    let ob = r * P.k;
    // Softmax statistics (gating 0), summed in id order as the scalar rule does.
    var mx = -3.0e38;
    var sum = 0.0;
    if (P.gating == 0u) {
        for (var e = 0u; e < P.n_expert; e++) {
            mx = max(mx, L[lb + e]);
        }
        for (var e = 0u; e < P.n_expert; e++) {
            sum += exp(L[lb + e] - mx);
        }
    }
    var prev = 0u;
    var prev_s = 0.0;
    for (var j = 0u; j < P.k; j++) {
        var best = P.n_expert;
        var best_s = 0.0;
        for (var e = 0u; e < P.n_expert; e++) {
            var s = score(L[lb + e], mx, sum);
            if (P.has_bias != 0u) {
                s += BIAS[e];
            }
            // The j-th choice is the first expert after the (j-1)-th in the choice order.
            if (j > 0u && !before(prev_s, prev, s, e)) {
                continue;
            }
            if (best == P.n_expert || before(s, e, best_s, best)) {
                best = e;
                best_s = s;
            }
        }
        prev = best;
        prev_s = best_s;
        IDS[ob + j] = f32(best);
        WTS[ob + j] = score(L[lb + best], mx, sum);
    }
    if (P.gating == 2u) {
        var m = -3.0e38;
        for (var j = 0u; j < P.k; j++) {
            m = max(m, WTS[ob + j]);
        }
        var s = 0.0;
        for (var j = 0u; j < P.k; j++) {
            let v = exp(WTS[ob + j] - m);
            WTS[ob + j] = v;
            s += v;
        }
        for (var j = 0u; j < P.k; j++) {
            WTS[ob + j] = WTS[ob + j] / s;
        }
    }
    if (P.norm != 0u) {
        var s = 0.0;
        for (var j = 0u; j < P.k; j++) {
            s += WTS[ob + j];
        }
        s = max(s, MIN_WEIGHT_SUM);
        for (var j = 0u; j < P.k; j++) {
            WTS[ob + j] = WTS[ob + j] / s;
        }
    }
    if (P.scale != 0.0 && P.scale != 1.0) {
        for (var j = 0u; j < P.k; j++) {
            WTS[ob + j] = WTS[ob + j] * P.scale;
        }
    }
}

// An expert's score from its logit `l` (softmax: with the row's max and sum).
fn score(l: f32, mx: f32, sum: f32) -> f32 {
    switch P.gating {
        case 0u: {
            return exp(l - mx) / sum;
        }
        case 1u: {
            return 1.0 / (1.0 + exp(-l));
        }
        default: {
            return l;
        }
    }
}
