// Causal (optionally windowed) softmax attention with grouped KV heads, for the rows
// `q_row0..q_row0 + rows` of a batch (one sequence's rows; positions pos0..). The cache format
// comes from the included `kv_*.wgsl` (its bindings KC and VC, how a query is loaded, q·k,
// the rounding of a probability and the weighted add of a V row), which mirrors the CPU
// path's arithmetic for that format: f16 (q and the normalized probabilities rounded to f16;
// the cache already holds f16 values) or q8_0 (blocks read directly). The softmax statistics
// are f32. K and V heads may differ in width (hd_k, hd_v,
// at most MAX_HD, a constant of the variant); `softcap` (0: off) caps q·k at cap·tanh(q·k/cap)
// before the scale; with `has_sinks`, the head's sink logit joins each softmax's max and sum.
// V heads sit `v_head` values apart and positions `v_pos` apart in VC: their own cache
// (`n_head_kv * hd_v`, `hd_v`), or the first hd_v values of the K heads when VC is the K cache
// (MLA's latent: `n_head_kv * hd_k`, `hd_k`).
//
// `main`: one workgroup per (query row, head); the WG invocations split the KV length. Pass 1
// finds each invocation's running max and rescaled sum, combined across the workgroup; pass 2
// weights V.
//
// Split across workgroups too (decode on GPUs, where a few heads would leave most of the
// device idle): the KV range is cut into `n_split` chunks of `chunk` positions and each
// (row, head, chunk) gets a workgroup. `stats` writes each chunk's max and rescaled sum to S;
// `weigh` combines them into the row's max and sum (so each probability is normalized and
// rounded exactly as in `main`) and writes the chunk's weighted V sum to S at `acc_off`;
// `merge` adds the chunks' sums. S: [rows * n_head * n_split] pairs (max, sum), then
// [rows * n_head * n_split][hd_v] partial outputs.

struct Params {
    rows: u32,
    pos0: u32,
    n_head: u32,
    n_head_kv: u32,
    hd_k: u32,
    hd_v: u32,
    window: u32,
    grid_x: u32,
    n_split: u32,
    scale: f32,
    chunk: u32,
    acc_off: u32,
    q_row0: u32,
    softcap: f32,
    has_sinks: u32,
    v_pos: u32,
    v_head: u32,
    // Block formats: the first word of each cache's scales (see the kv_*.wgsl include).
    k_scales: u32,
    v_scales: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> Q: array<f32>;
@group(0) @binding(4) var<storage, read_write> O: array<f32>;
@group(0) @binding(5) var<storage, read_write> S: array<f32>;
@group(0) @binding(6) var<storage, read> SINKS: array<f32>;

const WG: u32 = 32u;
const MAX_HD: u32 = 256u;
const NEG_BIG: f32 = -3.0e38;

// The head of the query being attended (for its sink).
var<private> cur_head: u32;
var<private> acc: array<f32, MAX_HD>;
var<workgroup> red: array<f32, 32>;
var<workgroup> tile: array<f32, 1024>; // [WG][32]
var<workgroup> summed: array<f32, MAX_HD>;

fn f16r(x: f32) -> f32 {
    return unpack2x16float(pack2x16float(vec2<f32>(x, 0.0))).x;
}

//INCLUDE KV

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
    var s = dot_k(j * P.n_head_kv * P.hd_k + kbase);
    if (P.softcap != 0.0) {
        s = tanh(s * (1.0 / P.softcap)) * P.softcap;
    }
    return s * P.scale;
}

/// Where query `idx` (row-major over the call's rows, heads) reads: its K and V head offsets,
/// its position and the first position its window sees.
struct Head {
    kbase: u32,
    vbase: u32,
    pos: u32,
    first: u32,
}

fn head(idx: u32) -> Head {
    let r = idx / P.n_head;
    let h = idx % P.n_head;
    cur_head = h;
    let kvh = h / (P.n_head / P.n_head_kv);
    let pos = P.pos0 + r;
    var first = 0u;
    if (P.window != 0u && pos + 1u > P.window) {
        first = pos + 1u - P.window;
    }
    load_q((P.q_row0 * P.n_head + idx) * P.hd_k);
    for (var d = 0u; d < P.hd_v; d++) {
        acc[d] = 0.0;
    }
    return Head(kvh * P.hd_k, kvh * P.v_head, pos, first);
}

/// The softmax max of the current head: `m`, or the head's sink logit when larger.
fn with_sink_max(m: f32) -> f32 {
    if (P.has_sinks != 0u) {
        return max(m, SINKS[cur_head]);
    }
    return m;
}

/// The softmax sum `l` (relative to max `m`) plus the head's sink term.
fn with_sink_sum(l: f32, m: f32) -> f32 {
    if (P.has_sinks != 0u) {
        return l + exp(SINKS[cur_head] - m);
    }
    return l;
}

/// Running max and sum of exp(s - max) of this invocation over positions lo + li, lo + li +
/// WG, ... below hi.
fn running(lo: u32, hi: u32, kbase: u32, li: u32) -> vec2<f32> {
    var m = NEG_BIG;
    var l = 0.0;
    for (var j = lo + li; j < hi; j += WG) {
        let s = score(j, kbase);
        if (s > m) {
            l = l * exp(m - s) + 1.0;
            m = s;
        } else {
            l += exp(s - m);
        }
    }
    return vec2<f32>(m, l);
}

/// Adds prob(exp(s - gm) * inv) * V over this invocation's positions to `acc`.
fn weigh_v(lo: u32, hi: u32, hq: Head, gm: f32, inv: f32, li: u32) {
    for (var j = lo + li; j < hi; j += WG) {
        let p = prob(exp(score(j, hq.kbase) - gm) * inv);
        if (p != 0.0) {
            add_v(j * P.v_pos + hq.vbase, p);
        }
    }
}

/// Sums the invocations' `acc` into `summed`, 32 dimensions at a time: invocation li writes
/// dimensions li, li + 32, ... (and may read those back without a barrier).
fn reduce_acc(li: u32) {
    let hd = P.hd_v;
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
            summed[c0 + li] = s;
        }
        workgroupBarrier();
    }
}

@compute @workgroup_size(32)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let idx = wid.x + wid.y * P.grid_x;
    if (idx >= P.rows * P.n_head) {
        return;
    }
    let hq = head(idx);
    let ml = running(hq.first, hq.pos + 1u, hq.kbase, li);
    let gm = with_sink_max(reduce_max(ml.x, li));
    let total = with_sink_sum(reduce_sum(ml.y * exp(ml.x - gm), li), gm);
    // Probabilities (rounded as the CPU does for the format) weight the V rows.
    weigh_v(hq.first, hq.pos + 1u, hq, gm, 1.0 / total, li);
    reduce_acc(li);
    let ob = (P.q_row0 * P.n_head + idx) * P.hd_v;
    for (var d = li; d < P.hd_v; d += WG) {
        O[ob + d] = summed[d];
    }
}

/// The positions of chunk `c` that query `hq` sees: [x, y).
fn chunk_range(hq: Head, c: u32) -> vec2<u32> {
    let lo = max(hq.first, c * P.chunk);
    let hi = max(lo, min(hq.pos + 1u, (c + 1u) * P.chunk));
    return vec2<u32>(lo, hi);
}

@compute @workgroup_size(32)
fn stats(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let g = wid.x + wid.y * P.grid_x;
    if (g >= P.rows * P.n_head * P.n_split) {
        return;
    }
    let hq = head(g / P.n_split);
    let range = chunk_range(hq, g % P.n_split);
    let ml = running(range.x, range.y, hq.kbase, li);
    let gm = reduce_max(ml.x, li);
    let total = reduce_sum(ml.y * exp(ml.x - gm), li);
    if (li == 0u) {
        S[2u * g] = gm;
        S[2u * g + 1u] = total;
    }
}

@compute @workgroup_size(32)
fn weigh(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let g = wid.x + wid.y * P.grid_x;
    if (g >= P.rows * P.n_head * P.n_split) {
        return;
    }
    let idx = g / P.n_split;
    let hq = head(idx);
    // The row's max and sum from its chunks' (empty chunks have sum 0).
    var gm = NEG_BIG;
    for (var c = 0u; c < P.n_split; c++) {
        gm = max(gm, S[2u * (idx * P.n_split + c)]);
    }
    gm = with_sink_max(gm);
    var total = 0.0;
    for (var c = 0u; c < P.n_split; c++) {
        let l = S[2u * (idx * P.n_split + c) + 1u];
        if (l > 0.0) {
            total += l * exp(S[2u * (idx * P.n_split + c)] - gm);
        }
    }
    total = with_sink_sum(total, gm);
    let range = chunk_range(hq, g % P.n_split);
    weigh_v(range.x, range.y, hq, gm, 1.0 / total, li);
    reduce_acc(li);
    for (var d = li; d < P.hd_v; d += WG) {
        S[P.acc_off + g * P.hd_v + d] = summed[d];
    }
}

@compute @workgroup_size(32)
fn merge(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let idx = wid.x + wid.y * P.grid_x;
    if (idx >= P.rows * P.n_head) {
        return;
    }
    let hd = P.hd_v;
    let ob = (P.q_row0 * P.n_head + idx) * hd;
    for (var d = li; d < hd; d += WG) {
        var s = 0.0;
        for (var c = 0u; c < P.n_split; c++) {
            s += S[P.acc_off + (idx * P.n_split + c) * hd + d];
        }
        O[ob + d] = s;
    }
}
