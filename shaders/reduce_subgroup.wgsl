// Sums each row's partial `acc` over the workgroup into red[r * WG]: `subgroupAdd` within each
// subgroup, whose first lane takes a slot (any subgroup size and layout) for its sums, then one
// lane per row adds the slots.
var<private> sg_lane: u32;
var<workgroup> n_slots: atomic<u32>;

fn reduce_acc(li: u32, acc: array<f32, 8>) {
    if (li == 0u) {
        atomicStore(&n_slots, 0u);
    }
    workgroupBarrier();
    var sums: array<f32, 8>;
    for (var r = 0u; r < R; r++) {
        sums[r] = subgroupAdd(acc[r]);
    }
    if (sg_lane == 0u) {
        let slot = atomicAdd(&n_slots, 1u);
        for (var r = 0u; r < R; r++) {
            red[r * WG + slot] = sums[r];
        }
    }
    workgroupBarrier();
    let n = atomicLoad(&n_slots);
    if (li < R) {
        var t = 0.0;
        for (var j = 0u; j < n; j++) {
            t += red[li * WG + j];
        }
        red[li * WG] = t;
    }
    workgroupBarrier();
}
