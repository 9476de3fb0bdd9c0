// The causal depthwise conv1d of gated-delta-net layers (`Backend::ssm_conv`, the scalar rule
// `backend::recurrent::conv_value`): one invocation per channel walks the call's rows in
// order, so the channel's conv state is read at the start and replaced by its last
// `kernel - 1` inputs at the end by the one invocation that owns it. A channel's inputs are
// "state, then x": input `u` is the state's value `u` while `u < kernel - 1`, else row
// `u - (kernel - 1)` of the call. Taps are summed in f32 from the oldest, as ggml does.

struct Params {
    channels: u32,
    kernel: u32,
    // The call's rows: `rows` rows of the batch from `row0`.
    row0: u32,
    rows: u32,
    // 1: SiLU of each output.
    silu: u32,
    grid_x: u32,
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
// X: [batch rows][channels] the inputs.
@group(0) @binding(1) var<storage, read> X: array<f32>;
// W: [channels][kernel] the kernels, tap 0 meeting the oldest input.
@group(0) @binding(2) var<storage, read> W: array<f32>;
// S: [channels][kernel - 1] the conv state, oldest first.
@group(0) @binding(3) var<storage, read_write> S: array<f32>;
// O: [batch rows][channels] the outputs (the call's rows only are written).
@group(0) @binding(4) var<storage, read_write> O: array<f32>;

// Input `u` of channel `c` (`hist` = kernel - 1).
fn input(u: u32, c: u32, hist: u32) -> f32 {
    if (u < hist) {
        return S[c * hist + u];
    }
    return X[(P.row0 + u - hist) * P.channels + c];
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x + gid.y * P.grid_x * 64u;
    if (c >= P.channels) {
        return;
    }
    let hist = P.kernel - 1u;
    let wb = c * P.kernel;
    for (var t = 0u; t < P.rows; t++) {
        var sum = 0.0;
        for (var j = 0u; j < P.kernel; j++) {
            sum += input(t + j, c, hist) * W[wb + j];
        }
        if (P.silu != 0u) {
            sum = sum / (1.0 + exp(-sum));
        }
        O[(P.row0 + t) * P.channels + c] = sum;
    }
    // The new state: inputs rows .. rows + hist. Slot `u` reads input `rows + u`, which is
    // either a row of x or the old state's slot `rows + u > u`, not yet overwritten.
    for (var u = 0u; u < hist; u++) {
        S[c * hist + u] = input(P.rows + u, c, hist);
    }
}
