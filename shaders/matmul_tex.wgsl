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
// nothing), as subgroup operations need. Arithmetic in f32, each row's products summed in
// order with Kahan compensation, as matmul_rows.wgsl (its storage-buffer twin) sums them, so the
// two give the same bits (tests/backend_ops.rs). Why compensated: with the activations rounded
// as ggml rounds them (quantize_act.wgsl), ggml sums each block's integer products exactly, and
// a plain f32 sum in one order or another moved single steps of the chaotic models past their
// bounds (one of 32 deepseek2 Q4_K_M steps to 0.153 in one order, one more gemma-3-270m miss in
// another); the compensated sum, nearly exact, kept both where the CPU backend lands. It costs
// about half of lavapipe's prefill speed (qwen2.5-coder, 64-token prompt: 3.6 against 7.1 tok/s
// with f32 activations and plain sums; decode unchanged within noise).

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
    // Kahan compensation of each row's sum.
    var comp: array<f32, R>;
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
                for (var i = 0u; i < 8u; i++) {
                    let w = vec4<f32>(wv[4u * i], wv[4u * i + 1u], wv[4u * i + 2u], wv[4u * i + 3u]);
                    let p = select(vec4<f32>(0.0), w * x_get(xb, i, own), vec4<bool>(4u * i < lim));
                    for (var k = 0u; k < 4u; k++) {
                        let y = p[k] - comp[r];
                        let t = acc[r] + y;
                        comp[r] = (t - acc[r]) - y;
                        acc[r] = t;
                    }
                }
            }
        }
    }
    for (var r = 0u; r < R; r++) {
        if (r < P.rows && id < P.n_out) {
            Y[(P.row0 + r) * P.out_stride + P.out_off + o] = acc[r];
        }
    }
}
