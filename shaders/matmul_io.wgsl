// Parameters and bindings shared by both storage-buffer matmul variants (matmul.wgsl,
// matmul_rows.wgsl). X holds the f32 activations, Y the f32 outputs;
// the weights W (binding 1) come with the byte helpers (bytes.wgsl).

//INCLUDE matmul_params.wgsl
@group(0) @binding(2) var<storage, read> X: array<f32>;
@group(0) @binding(3) var<storage, read_write> Y: array<f32>;
