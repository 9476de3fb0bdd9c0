// Walsh-Hadamard rotation in place (`Backend::hadamard`): `groups` groups of `n` values (a power
// of two up to 512), one workgroup per group. The group is loaded into workgroup memory, the
// butterflies `(a, b) -> (a + b, a - b)` run for spans 1, 2, .. n/2 (a barrier between
// stages), and the result times `s` (1 / sqrt(n), from the host) is written back: the CPU's
// `rotation::hadamard_groups`, the same operations in the same order, so the same bits.

struct Params {
    n: u32,
    groups: u32,
    s: f32,
    grid_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
// X: [groups][n], rotated in place.
@group(0) @binding(1) var<storage, read_write> X: array<f32>;

const WG: u32 = 64u;
var<workgroup> v: array<f32, 512>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    // Every invocation of a workgroup agrees on `grp`, so the early return and the barriers
    // below stay in uniform control flow.
    let grp = wid.x + wid.y * P.grid_x;
    if (grp >= P.groups) {
        return;
    }
    let base = grp * P.n;
    for (var i = li; i < P.n; i += WG) {
        v[i] = X[base + i];
    }
    for (var h = 1u; h < P.n; h <<= 1u) {
        workgroupBarrier();
        // Pair p: the p-th of the n/2 butterflies of this stage.
        for (var p = li; p < P.n / 2u; p += WG) {
            let j = (p / h) * 2u * h + p % h;
            let a = v[j];
            let b = v[j + h];
            v[j] = a + b;
            v[j + h] = a - b;
        }
    }
    workgroupBarrier();
    for (var i = li; i < P.n; i += WG) {
        X[base + i] = v[i] * P.s;
    }
}
