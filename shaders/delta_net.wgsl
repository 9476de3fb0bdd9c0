// The gated delta rule of gated-delta-net layers (`Backend::delta_net`, the scalar rule
// `backend::recurrent::delta_token`), token by token for either form (the chunked form only
// regroups the same sums; the two agree to f32 rounding).
//
// Per token, with `S` a value head's `d_k × d_v` state, q and k of its key head L2-normed
// (`x / sqrt(Σx² + eps)`) and q scaled by `1/sqrt(d_k)`:
//     S = exp(g) S;  d = β (v − Sᵀk);  S += k ⊗ d;  o = Sᵀq
// Column `j` of `S` (row `j` of the state buffer) meets only `v_j`, `d_j` and `o_j`, so each
// invocation owns one column, kept in a private array across the call's tokens, and does its
// own `k·S_j` and `q·S_j`: no reduction between invocations. A workgroup holds up to WG
// columns of one value head (a head of more columns takes several workgroups) and shares the
// token's q and k through workgroup memory; each invocation sums their squares itself, in
// order, as the CPU does.

struct Params {
    n_k_heads: u32,
    n_v_heads: u32,
    d_k: u32,
    d_v: u32,
    // The call's rows: `rows` rows of the batch from `row0`.
    row0: u32,
    rows: u32,
    // Values per qkv row: 2 * n_k_heads * d_k + n_v_heads * d_v.
    qkv_dim: u32,
    // Key head of value head h: h / (n_v_heads / n_k_heads) when 1 (grouped), else
    // h % n_k_heads (tiled).
    grouped: u32,
    // 1: L2-norm q and k with `eps`; 0: take them as given.
    l2: u32,
    eps: f32,
    q_scale: f32,
    // Workgroups per value head: ceil(d_v / WG).
    blocks: u32,
    grid_x: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
// QKV: [batch rows][q | k | v], q and k of n_k_heads * d_k values each, v of n_v_heads * d_v.
@group(0) @binding(1) var<storage, read> QKV: array<f32>;
// GATE (log-decays) and BETA (after the sigmoid): [batch rows][n_v_heads].
@group(0) @binding(2) var<storage, read> GATE: array<f32>;
@group(0) @binding(3) var<storage, read> BETA: array<f32>;
// S: [n_v_heads][d_v][d_k]; row j of a head is column j of its S.
@group(0) @binding(4) var<storage, read_write> S: array<f32>;
// O: [batch rows][n_v_heads][d_v] (the call's rows only are written).
@group(0) @binding(5) var<storage, read_write> O: array<f32>;

// Invocations (state columns) per workgroup (gpu::DELTA_COLUMNS).
const WG: u32 = 64u;
// Widest key heads: the length of a column (gpu::DELTA_MAX_DK).
const MAX_DK: u32 = 128u;

// The current token's q and k of the key head, as read (the norms are applied on use).
var<workgroup> q_raw: array<f32, MAX_DK>;
var<workgroup> k_raw: array<f32, MAX_DK>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let wg = wid.x + wid.y * P.grid_x;
    if (wg >= P.n_v_heads * P.blocks) {
        return;
    }
    let h = wg / P.blocks;
    let j = (wg % P.blocks) * WG + li;
    // Invocations past the head's columns still take part in the barriers.
    let owns_column = j < P.d_v;
    var kh = h % P.n_k_heads;
    if (P.grouped != 0u) {
        kh = h / (P.n_v_heads / P.n_k_heads);
    }
    let dk = P.d_k;
    let kw = P.n_k_heads * dk;
    // s: column j of the head's S.
    var s: array<f32, MAX_DK>;
    let sb = (h * P.d_v + j) * dk;
    if (owns_column) {
        for (var i = 0u; i < dk; i++) {
            s[i] = S[sb + i];
        }
    }
    for (var t = 0u; t < P.rows; t++) {
        let row = P.row0 + t;
        let base = row * P.qkv_dim;
        for (var i = li; i < dk; i += WG) {
            q_raw[i] = QKV[base + kh * dk + i];
            k_raw[i] = QKV[base + kw + kh * dk + i];
        }
        workgroupBarrier();
        // The norms' factors, as `recurrent::l2_normalize` forms them.
        var rq = P.q_scale;
        var rk = 1.0;
        if (P.l2 != 0u) {
            var sq = 0.0;
            var sk = 0.0;
            for (var i = 0u; i < dk; i++) {
                sq += q_raw[i] * q_raw[i];
                sk += k_raw[i] * k_raw[i];
            }
            rq = P.q_scale / sqrt(sq + P.eps);
            rk = 1.0 / sqrt(sk + P.eps);
        }
        if (owns_column) {
            let gi = row * P.n_v_heads + h;
            let decay = exp(GATE[gi]);
            var ks = 0.0;
            for (var i = 0u; i < dk; i++) {
                s[i] = s[i] * decay;
                ks += s[i] * (k_raw[i] * rk);
            }
            let d = (QKV[base + 2u * kw + h * P.d_v + j] - ks) * BETA[gi];
            var o = 0.0;
            for (var i = 0u; i < dk; i++) {
                s[i] += (k_raw[i] * rk) * d;
                o += s[i] * (q_raw[i] * rq);
            }
            O[(row * P.n_v_heads + h) * P.d_v + j] = o;
        }
        // The next token overwrites q_raw and k_raw.
        workgroupBarrier();
    }
    if (owns_column) {
        for (var i = 0u; i < dk; i++) {
            S[sb + i] = s[i];
        }
    }
}
