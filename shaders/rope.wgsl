// Rotary position embedding in place, one invocation per (row, head, rotated pair); row `r` is
// at position POS[r]. The angle follows ggml exactly (theta = pos * theta_scale^i by repeated
// f32 multiplication, divided by the frequency factor, times freq_scale, YaRN's ramp between
// extrapolation and interpolation where ext_factor is not 0); it is reduced modulo 2 pi in two
// steps before cos/sin, whose accuracy the shading language only promises near zero.

struct Params {
    rows: u32,
    n_head: u32,
    head_dim: u32,
    n_rot: u32,
    neox: u32,
    has_factors: u32,
    grid_x: u32,
    theta_scale: f32,
    freq_scale: f32,
    ext_factor: f32,
    mscale: f32,
    corr_low: f32,
    corr_high: f32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> X: array<f32>;
@group(0) @binding(2) var<storage, read> F: array<f32>;
@group(0) @binding(3) var<storage, read> POS: array<u32>;

// 2 pi = C1 + C2 + C3, C1 with few significant bits so k * C1 is exact.
const TWO_PI_C1: f32 = 6.28125;
const TWO_PI_C2: f32 = 0.0019353071;
const TWO_PI_C3: f32 = 1.7958953e-11;

// cos and sin of `t`, reduced modulo 2 pi first.
fn cos_sin(t: f32) -> vec2<f32> {
    let k = round(t / 6.2831855);
    let a = ((t - k * TWO_PI_C1) - k * TWO_PI_C2) - k * TWO_PI_C3;
    return vec2<f32>(cos(a), sin(a));
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let idx = gid.x + gid.y * P.grid_x * 64u;
    let half_rot = P.n_rot / 2u;
    let per_row = P.n_head * half_rot;
    if (idx >= P.rows * per_row) {
        return;
    }
    let r = idx / per_row;
    let h = (idx % per_row) / half_rot;
    let i = idx % half_rot;
    var theta = f32(POS[r]);
    for (var k = 0u; k < i; k++) {
        theta *= P.theta_scale;
    }
    var ff = 1.0;
    if (P.has_factors != 0u) {
        ff = F[i];
    }
    let extrap = theta / ff;
    var cs: vec2<f32>;
    if (P.ext_factor == 0.0) {
        cs = cos_sin(P.freq_scale * extrap);
    } else {
        // YaRN (ggml's rope_yarn): ramp 1 below corr_low, 0 above corr_high.
        let interp = P.freq_scale * extrap;
        let y = (f32(i) - P.corr_low) / max(0.001, P.corr_high - P.corr_low);
        let mix = (1.0 - clamp(y, 0.0, 1.0)) * P.ext_factor;
        cs = cos_sin(interp * (1.0 - mix) + extrap * mix) * P.mscale;
    }
    let c = cs.x;
    let s = cs.y;
    let base = (r * P.n_head + h) * P.head_dim;
    var i0 = base + 2u * i;
    var i1 = i0 + 1u;
    if (P.neox != 0u) {
        i0 = base + i;
        i1 = base + i + half_rot;
    }
    let x0 = X[i0];
    let x1 = X[i1];
    X[i0] = x0 * c - x1 * s;
    X[i1] = x0 * s + x1 * c;
}
