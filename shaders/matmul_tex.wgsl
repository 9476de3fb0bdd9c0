// Y[row0 + r, out_off + o] = sum_k W[o, k] * X[r, k] for the weight rows o < n_out of one part
// and the activation rows r < rows of one tile: the kernel for CPU adapters (Mesa lavapipe).
// There every invocation is a SIMD lane and a storage-buffer load runs lane by lane, so the
// operands come through the two kinds of memory it reads with vector code: the weights from a
// texture (bytes_tex.wgsl; the quant snippet's `load_chunk` decodes 32 values into `wv`), the
// activation tile from a uniform buffer (the backend copies up to 64 KiB of rows there before
// each dispatch), shared across the subgroup where the device has subgroups (x_subgroup.wgsl,
// else x_lane.wgsl). One invocation per weight row; it decodes each chunk once and meets it
// with R activation rows (R is set per variant: 1, 2, 4 or 8). No workgroup memory, no
// barriers, and every invocation runs to the end (surplus ones redo the last row and store
// nothing), as subgroup operations need. Arithmetic in f32, as matmul_rows.wgsl (its
// storage-buffer twin).

//INCLUDE matmul_params.wgsl
// rows x n_in activations, row-major (n_in is a multiple of 4).
@group(0) @binding(2) var<uniform> X: array<vec4<f32>, 4096>;
@group(0) @binding(3) var<storage, read_write> Y: array<f32>;

const R: u32 = 8u;

var<private> wv: array<f32, 32>;

//INCLUDE bytes_tex.wgsl
//INCLUDE QUANT
//INCLUDE X

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let id = gid.x + gid.y * P.grid_x * 64u;
    let o = min(id, P.n_out - 1u);
    let n4 = P.n_in / 4u;
    var acc: array<f32, R>;
    for (var c = 0u; c < P.n_chunks; c++) {
        load_chunk(o * P.row_bytes, c, P.n_in);
        // Values past the row end (F32/F16 rows that end inside a chunk) are masked out.
        let lim = min(32u, P.n_in - c * 32u);
        // Constant trip counts and indices only: the loops unroll and `wv`, `acc` stay in
        // registers.
        for (var r = 0u; r < R; r++) {
            if (r < P.rows) {
                let xb = r * n4 + c * 8u;
                let own = x_own(xb, lane);
                var s = vec4<f32>(0.0);
                for (var i = 0u; i < 8u; i++) {
                    let w = vec4<f32>(wv[4u * i], wv[4u * i + 1u], wv[4u * i + 2u], wv[4u * i + 3u]);
                    s += select(vec4<f32>(0.0), w * x_get(xb, i, own), vec4<bool>(4u * i < lim));
                }
                acc[r] += (s.x + s.y) + (s.z + s.w);
            }
        }
    }
    for (var r = 0u; r < R; r++) {
        if (r < P.rows && id < P.n_out) {
            Y[(P.row0 + r) * P.out_stride + P.out_off + o] = acc[r];
        }
    }
}
