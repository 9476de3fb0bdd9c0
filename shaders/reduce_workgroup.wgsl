// Sums each row's partial `acc` over the workgroup into red[r * WG]: a tree in workgroup
// memory.
fn reduce_acc(li: u32, acc: array<f32, 8>) {
    for (var r = 0u; r < R; r++) {
        red[r * WG + li] = acc[r];
    }
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (li < s) {
            for (var r = 0u; r < R; r++) {
                red[r * WG + li] += red[r * WG + li + s];
            }
        }
        workgroupBarrier();
    }
}
