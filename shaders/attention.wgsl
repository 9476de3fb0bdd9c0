// Causal (optionally windowed) softmax attention with grouped KV heads, one workgroup per
// (query row, head); the WG invocations split the KV length. Mirrors the CPU path's roundings
// (q and the normalized probabilities to f16; the cache already holds f16 values), with the
// softmax statistics in f32: pass 1 finds each invocation's running max and rescaled sum,
// combined across the workgroup; pass 2 weights V.

struct Params {
    rows: u32,
    pos0: u32,
    n_head: u32,
    n_head_kv: u32,
    head_dim: u32,
    window: u32,
    grid_x: u32,
    pad: u32,
    scale: f32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> Q: array<f32>;
@group(0) @binding(2) var<storage, read> KC: array<f32>;
@group(0) @binding(3) var<storage, read> VC: array<f32>;
@group(0) @binding(4) var<storage, read_write> O: array<f32>;

const WG: u32 = 32u;
const MAX_HD: u32 = 256u;
const NEG_BIG: f32 = -3.0e38;

var<private> q16: array<f32, MAX_HD>;
var<private> acc: array<f32, MAX_HD>;
var<workgroup> red: array<f32, 32>;
var<workgroup> tile: array<f32, 1024>; // [WG][32]

fn f16r(x: f32) -> f32 {
    return unpack2x16float(pack2x16float(vec2<f32>(x, 0.0))).x;
}

fn reduce_max(v: f32, li: u32) -> f32 {
    red[li] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (li < s) {
            red[li] = max(red[li], red[li + s]);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn reduce_sum(v: f32, li: u32) -> f32 {
    red[li] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (li < s) {
            red[li] += red[li + s];
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn score(j: u32, kbase: u32) -> f32 {
    let hd = P.head_dim;
    let kb = j * P.n_head_kv * hd + kbase;
    var s = 0.0;
    for (var d = 0u; d < hd; d++) {
        s += q16[d] * KC[kb + d];
    }
    return s * P.scale;
}

@compute @workgroup_size(32)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let idx = wid.x + wid.y * P.grid_x;
    if (idx >= P.rows * P.n_head) {
        return;
    }
    let hd = P.head_dim;
    let r = idx / P.n_head;
    let h = idx % P.n_head;
    let kvh = h / (P.n_head / P.n_head_kv);
    let kbase = kvh * hd;
    let pos = P.pos0 + r;
    var first = 0u;
    if (P.window != 0u && pos + 1u > P.window) {
        first = pos + 1u - P.window;
    }
    for (var d = 0u; d < hd; d++) {
        q16[d] = f16r(Q[idx * hd + d]);
        acc[d] = 0.0;
    }
    // Pass 1: running max and sum of exp(s - max) per invocation.
    var m = NEG_BIG;
    var l = 0.0;
    for (var j = first + li; j <= pos; j += WG) {
        let s = score(j, kbase);
        if (s > m) {
            l = l * exp(m - s) + 1.0;
            m = s;
        } else {
            l += exp(s - m);
        }
    }
    let gm = reduce_max(m, li);
    let total = reduce_sum(l * exp(m - gm), li);
    let inv = 1.0 / total;
    // Pass 2: probabilities (rounded to f16, as the CPU does) weight the V rows.
    for (var j = first + li; j <= pos; j += WG) {
        let p = f16r(exp(score(j, kbase) - gm) * inv);
        if (p != 0.0) {
            let vb = j * P.n_head_kv * hd + kbase;
            for (var d = 0u; d < hd; d++) {
                acc[d] += p * VC[vb + d];
            }
        }
    }
    // Sum the invocations' partial outputs, 32 dimensions at a time.
    for (var c0 = 0u; c0 < hd; c0 += 32u) {
        for (var i = 0u; i < 32u; i++) {
            if (c0 + i < hd) {
                tile[li * 32u + i] = acc[c0 + i];
            }
        }
        workgroupBarrier();
        if (c0 + li < hd) {
            var s = 0.0;
            for (var t = 0u; t < WG; t++) {
                s += tile[t * 32u + li];
            }
            O[idx * hd + c0 + li] = s;
        }
        workgroupBarrier();
    }
}
