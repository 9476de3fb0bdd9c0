// Y[r, out_off + o] = sum_k W[o, k] * X[r, k] with cooperative matrices (VK_KHR_cooperative_matrix:
// tensor cores, WMMA), the Vulkan backend's matmul for prefill where the device multiplies
// f16 T x T matrices into f32 ones (T = 16 on NVIDIA and AMD RDNA3, 8 on Mesa lavapipe).
// Products of f16 values summed in f32, as llama.cpp's Vulkan coopmat path does: the
// weights decoded to f16 and the activations (after the CPU's rounding for the weight format,
// quantize_act) rounded to f16, 11 significant bits each (a decoded Q8_0 weight has up to 19).
//
// f16 has 5 exponent bits: each activation row is scaled first by the power of two that brings
// its largest magnitude into [1, 2), and its sums scaled back (exactly) at the end, so rows of
// tiny values keep their precision and rows of values past 65504 do not overflow.
//
// A workgroup of 64 invocations takes a tile of M = 32 activation rows by N = 64 weight rows.
// Per chunk of 32 values along k: every invocation decodes one weight row's chunk (the quant
// snippet's `load_chunk`) into workgroup memory, the workgroup stages the activations, then
// each subgroup multiplies the T x T sub-tiles it owns (sub-tile t belongs to subgroup
// t mod num_subgroups, so any subgroup size that divides 64 works), accumulating in
// workgroup memory. Only WGSL's cooperative-matrix extension (naga's `coop_mat`) is used: no
// hand-written SPIR-V.

enable f16;
enable wgpu_cooperative_matrix;

//INCLUDE matmul_io.wgsl

// The matrices' size (the 8 x 8 variant replaces it).
const T: u32 = 16u;
const M: u32 = 32u;
const N: u32 = 64u;
// Sub-tiles of the workgroup's tile: (M / T) x (N / T).
const TILES: u32 = (M / T) * (N / T);

var<private> wv: array<f32, 32>;
// The chunk's activations, row-major [M][32] (A: M x K).
var<workgroup> xs: array<f16, 1024>;
// The chunk's weights, one decoded row each, [N][32] (B: K x N, column-major).
var<workgroup> ws: array<f16, 2048>;
// The tile's sums, column-major [N][M] (C: M x N).
var<workgroup> acc: array<f32, 2048>;
// Each row's largest magnitude, in two halves [M][2], then its scale [M].
var<workgroup> rmax: array<f32, 64>;
var<workgroup> rscale: array<f32, 32>;

//INCLUDE bytes.wgsl
//INCLUDE QUANT

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
    @builtin(subgroup_id) sid: u32,
    @builtin(num_subgroups) nsg: u32,
) {
    let o0 = (wid.x + wid.y * P.grid_x) * N;
    let r0 = wid.z * M;
    if (o0 >= P.n_out) {
        return;
    }
    let o = o0 + li;
    // Two invocations per row, each over every other value.
    let rm = li / 2u;
    var mx = 0.0;
    if (r0 + rm < P.rows) {
        for (var k = li % 2u; k < P.n_in; k += 2u) {
            mx = max(mx, abs(X[(r0 + rm) * P.n_in + k]));
        }
    }
    rmax[li] = mx;
    workgroupBarrier();
    if (li < M) {
        let m = max(rmax[2u * li], rmax[2u * li + 1u]);
        // 0 (and non-finite maxima, which the sums then show) keep the scale 1.
        rscale[li] = select(1.0, exp2(-floor(log2(m))), m > 0.0 && m < 3.0e38);
    }
    workgroupBarrier();
    for (var c = 0u; c < P.n_chunks; c++) {
        let k0 = c * 32u;
        let lim = min(32u, P.n_in - k0);
        if (o < P.n_out) {
            load_chunk(o * P.row_bytes, c, P.n_in);
        } else {
            for (var k = 0u; k < 32u; k++) {
                wv[k] = 0.0;
            }
        }
        for (var k = 0u; k < 32u; k++) {
            ws[li * 32u + k] = f16(wv[k]);
        }
        // 16 activations per invocation: rows past `rows` and values past `n_in` are zeros.
        for (var i = 0u; i < 16u; i++) {
            let e = li * 16u + i;
            let m = e / 32u;
            let k = e % 32u;
            var v = 0.0;
            if (r0 + m < P.rows && k < lim) {
                v = X[(r0 + m) * P.n_in + k0 + k];
            }
            xs[e] = f16(v * rscale[m]);
        }
        workgroupBarrier();
        for (var t = sid; t < TILES; t += nsg) {
            let mt = t / (N / T);
            let nt = t % (N / T);
            let cp = nt * T * M + mt * T;
            var sum = coopLoad<coop_mat16x16<f32, C>>(&acc[cp], M);
            for (var kk = 0u; kk < 32u; kk += T) {
                let a = coopLoadT<coop_mat16x16<f16, A>>(&xs[mt * T * 32u + kk], 32u);
                let b = coopLoad<coop_mat16x16<f16, B>>(&ws[nt * T * 32u + kk], 32u);
                sum = coopMultiplyAdd(a, b, sum);
            }
            coopStore(sum, &acc[cp], M);
        }
        workgroupBarrier();
    }
    // Out: consecutive invocations write consecutive outputs of a row.
    for (var e = li; e < M * N; e += 64u) {
        let n = e % N;
        let m = e / N;
        if (r0 + m < P.rows && o0 + n < P.n_out) {
            Y[(r0 + m) * P.out_stride + P.out_off + o0 + n] = acc[n * M + m] / rscale[m];
        }
    }
}
