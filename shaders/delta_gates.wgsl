// The gates of a gated delta net (`Backend::delta_gates`, the scalar rule
// `backend::recurrent::gates`), one invocation per (row, head): alpha becomes the log-decay
// `a · softplus(alpha + dt_bias)` (softplus is `x` itself past 20, as ggml's), beta becomes
// `sigmoid(beta)`.

struct Params {
    // rows * n_head values.
    len: u32,
    n_head: u32,
    grid_x: u32,
    pad0: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
// ALPHA, BETA: [rows][n_head], rewritten in place.
@group(0) @binding(1) var<storage, read_write> ALPHA: array<f32>;
@group(0) @binding(2) var<storage, read_write> BETA: array<f32>;
// DT_BIAS, A: [n_head] (the GGUF's `ssm_dt.bias` and `ssm_a`, already `-exp(A_log)`).
@group(0) @binding(3) var<storage, read> DT_BIAS: array<f32>;
@group(0) @binding(4) var<storage, read> A: array<f32>;

fn softplus(x: f32) -> f32 {
    if (x > 20.0) {
        return x;
    }
    return log(1.0 + exp(x));
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * P.grid_x * 256u;
    if (i >= P.len) {
        return;
    }
    let h = i % P.n_head;
    ALPHA[i] = softplus(ALPHA[i] + DT_BIAS[h]) * A[h];
    BETA[i] = 1.0 / (1.0 + exp(-BETA[i]));
}
