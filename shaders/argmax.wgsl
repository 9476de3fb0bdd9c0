// Index of the largest value of each row (first on ties, NaN never wins), one workgroup per
// row: each invocation scans a strided slice, then (value, index) pairs are reduced.

struct Params {
    rows: u32,
    width: u32,
    grid_x: u32,
    pad: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read_write> OUT: array<u32>;

const WG: u32 = 256u;
const NONE: u32 = 0xffffffffu;
var<workgroup> rv: array<f32, 256>;
var<workgroup> ri: array<u32, 256>;

// Whether (v, i) beats (bv, bi): a larger value, or an equal one earlier; NONE loses to all.
fn better(v: f32, i: u32, bv: f32, bi: u32) -> bool {
    if (i == NONE) {
        return false;
    }
    if (bi == NONE) {
        return true;
    }
    return v > bv || (v == bv && i < bi);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let row = wid.x + wid.y * P.grid_x;
    if (row >= P.rows) {
        return;
    }
    var bv = 0.0;
    var bi = NONE;
    for (var i = li; i < P.width; i += WG) {
        let v = X[row * P.width + i];
        // NaN compares false with itself: skip it.
        if (v == v && better(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    }
    rv[li] = bv;
    ri[li] = bi;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (li < s && better(rv[li + s], ri[li + s], rv[li], ri[li])) {
            rv[li] = rv[li + s];
            ri[li] = ri[li + s];
        }
        workgroupBarrier();
    }
    if (li == 0u) {
        OUT[row] = select(ri[0], 0u, ri[0] == NONE);
    }
}
