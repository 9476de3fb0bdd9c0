// Y[r, out_off + o] = sum_k W[o, k] * X[r, k], one invocation per (weight row o, tile of R
// activation rows): the invocation decodes its whole row chunk by chunk (`load_chunk` of the
// quant snippet) and meets each chunk with its R activation rows. No workgroup memory and no
// barriers: the variant for CPU adapters (lavapipe), where a workgroup costs far more than an
// invocation; matmul.wgsl is the workgroup-reduction variant for GPUs. Arithmetic in f32,
// each row's products summed in order with Kahan compensation, as matmul_tex.wgsl (its texture
// twin) sums them: the two give the same bits.

//INCLUDE matmul_io.wgsl

const R: u32 = 8u;

var<private> wv: array<f32, 32>;

//INCLUDE bytes.wgsl
//INCLUDE QUANT

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let idx = gid.x + gid.y * P.grid_x * 64u;
    let o = idx % P.n_out;
    let r0 = (idx / P.n_out) * R;
    if (r0 >= P.rows) {
        return;
    }
    let nr = min(R, P.rows - r0);
    var acc: array<f32, 8>;
    // Kahan compensation of each row's sum (see matmul_tex.wgsl for why).
    var comp: array<f32, 8>;
    for (var c = 0u; c < P.n_chunks; c++) {
        load_chunk(o * P.row_bytes, c, P.n_in);
        let k0 = c * 32u;
        let lim = min(32u, P.n_in - k0);
        // Constant trip counts only: the loops unroll and `wv`, `acc` stay in registers
        // (indexing them with a run-time value sends them to memory on CPU drivers).
        for (var r = 0u; r < R; r++) {
            if (r < nr) {
                let xb = (r0 + r) * P.n_in + k0;
                for (var i = 0u; i < 32u; i++) {
                    let y = select(0.0, wv[i] * X[xb + i], i < lim) - comp[r];
                    let t = acc[r] + y;
                    comp[r] = (t - acc[r]) - y;
                    acc[r] = t;
                }
            }
        }
    }
    for (var r = 0u; r < R; r++) {
        if (r < nr) {
            Y[(r0 + r) * P.out_stride + P.out_off + o] = acc[r];
        }
    }
}
