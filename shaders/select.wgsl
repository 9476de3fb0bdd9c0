// The k largest values of each row (ties to the lower index) and the values at listed indices,
// one workgroup per row: what a sampler needs from a vocabulary of logits, so only a few
// hundred bytes per token leave the device (src/sample.rs draws among them exactly as it would
// from the whole row).
//
// Values are compared by a key that orders f32 bits as `total_cmp` does, after the sampler's
// sanitizing (NaN is -inf, +inf is the largest finite value). A radix select over the key's
// four bytes (a 256-bin histogram per byte, of the values that match the bytes fixed so far)
// finds T, the k-th largest key, and how many values equal to T belong to the k; then each
// invocation takes a contiguous slice of the row and writes its values above T and the first
// values equal to T at places from prefix sums over the slices, in index order.
//
// OUT per row, `2 * k + n_gather` words: k indices, their k values (sanitized f32 bits), then
// the values (as they are) at the indices in G, the same list for every row; an index past the
// row gives -inf.

struct Params {
    rows: u32,
    width: u32,
    k: u32,
    grid_x: u32,
    n_gather: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read> G: array<u32>;
@group(0) @binding(3) var<storage, read_write> OUT: array<u32>;

const WG: u32 = 256u;
const NEG_INF: u32 = 0xff800000u;

var<workgroup> hist: array<atomic<u32>, 256>;
var<workgroup> counts: array<u32, 512>; // [WG] values above T, then [WG] equal to T
var<workgroup> state: vec3<u32>; // prefix of T, bytes fixed (mask), values equal to T to take

// The sanitized value's bits.
fn clean(b: u32) -> u32 {
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        return NEG_INF; // NaN
    }
    if (b == 0x7f800000u) {
        return 0x7f7fffffu; // +inf: f32::MAX
    }
    return b;
}

// Bits ordered as unsigned integers the way the values order under total_cmp.
fn key(b: u32) -> u32 {
    if ((b & 0x80000000u) != 0u) {
        return ~b;
    }
    return b | 0x80000000u;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let row = wid.x + wid.y * P.grid_x;
    if (row >= P.rows) {
        return;
    }
    let w = P.width;
    let base = row * w;
    let k = min(P.k, w);
    let out = row * (2u * P.k + P.n_gather);
    if (li == 0u) {
        state = vec3<u32>(0u, 0u, k);
    }
    workgroupBarrier();
    for (var shift = 24; shift >= 0; shift -= 8) {
        atomicStore(&hist[li], 0u);
        workgroupBarrier();
        let st = workgroupUniformLoad(&state);
        for (var i = li; i < w; i += WG) {
            let kk = key(clean(bitcast<u32>(X[base + i])));
            if ((kk & st.y) == st.x) {
                atomicAdd(&hist[(kk >> u32(shift)) & 0xffu], 1u);
            }
        }
        workgroupBarrier();
        if (li == 0u) {
            // The bin holding the remaining k-th largest, counting down from the top.
            var left = st.z;
            var bin = 255u;
            loop {
                let c = atomicLoad(&hist[bin]);
                if (c >= left || bin == 0u) {
                    break;
                }
                left -= c;
                bin -= 1u;
            }
            state = vec3<u32>(st.x | (bin << u32(shift)), st.y | (0xffu << u32(shift)), left);
        }
        workgroupBarrier();
    }
    let st = workgroupUniformLoad(&state);
    let t = st.x;
    // This invocation's slice, in index order.
    let per = (w + WG - 1u) / WG;
    let lo = min(li * per, w);
    let hi = min(lo + per, w);
    var above = 0u;
    var equal = 0u;
    for (var i = lo; i < hi; i++) {
        let kk = key(clean(bitcast<u32>(X[base + i])));
        above += select(0u, 1u, kk > t);
        equal += select(0u, 1u, kk == t);
    }
    counts[li] = above;
    counts[WG + li] = equal;
    workgroupBarrier();
    if (li == 0u) {
        // Exclusive prefix sums over the slices.
        var sa = 0u;
        var se = 0u;
        for (var j = 0u; j < WG; j++) {
            let a = counts[j];
            let e = counts[WG + j];
            counts[j] = sa;
            counts[WG + j] = se;
            sa += a;
            se += e;
        }
    }
    workgroupBarrier();
    let take = st.z; // values equal to T among the k
    var a = counts[li];
    var e = counts[WG + li];
    for (var i = lo; i < hi; i++) {
        let b = clean(bitcast<u32>(X[base + i]));
        let kk = key(b);
        // Its place among the taken values: those before it above T, and those before it
        // equal to T up to the number taken.
        var slot = k;
        if (kk > t) {
            slot = a + min(e, take);
            a += 1u;
        } else if (kk == t) {
            if (e < take) {
                slot = a + e;
            }
            e += 1u;
        }
        if (slot < k) {
            OUT[out + slot] = i;
            OUT[out + P.k + slot] = b;
        }
    }
    // Unused places (a row shorter than k): index `width`, value -inf.
    for (var s = k + li; s < P.k; s += WG) {
        OUT[out + s] = w;
        OUT[out + P.k + s] = NEG_INF;
    }
    for (var j = li; j < P.n_gather; j += WG) {
        let id = G[j];
        var v = NEG_INF;
        if (id < w) {
            v = bitcast<u32>(X[base + id]);
        }
        OUT[out + 2u * P.k + j] = v;
    }
}
