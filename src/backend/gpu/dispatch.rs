//! [`Dispatch`]: one kernel launch as the plans make it and the device layers record it, and
//! the helpers that build its parameter block and grid.

use super::kernels::Kernel;
use super::sizes::MAX_GRID;
use crate::backend::checks::shape;
use crate::backend::error::BackendError;

/// One kernel launch: which kernel, its parameter block (binding 0), data of its own for one
/// storage binding (token ids, positions, gather ids: `(binding, bytes)`), and its grid.
#[derive(Debug, Clone, PartialEq)]
pub struct Dispatch {
    pub kernel: Kernel,
    pub params: Vec<u8>,
    pub extra: Option<(u32, Vec<u8>)>,
    pub groups: (u32, u32, u32),
}

/// A value that must fit the kernels' u32 indices.
pub fn u(op: &'static str, v: usize) -> Result<u32, BackendError> {
    u32::try_from(v).map_err(|_| shape(op, format!("{v} exceeds the 32-bit index range")))
}

/// Parameter block from 32-bit words.
pub fn words(w: &[u32]) -> Vec<u8> {
    bytemuck::cast_slice(w).to_vec()
}

/// A 2-D grid of `n` workgroups: `(x, y)` with `x * y >= n`, `x` passed to the kernel.
pub fn grid(n: usize) -> (u32, u32) {
    let n = n.max(1);
    let x = n.min(MAX_GRID as usize);
    (x as u32, n.div_ceil(x) as u32)
}
