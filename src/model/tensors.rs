//! Placing a family's weights: each tensor's shape is checked against what the graph reads
//! before it goes to the backend, so a file with the right names but wrong sizes is an error
//! naming the tensor, not a wrong answer.

use std::sync::Arc;

use super::ModelError;
use crate::backend::Backend;
use crate::gguf::GgufFile;

/// Loads tensors of one file onto one backend.
pub struct Loader<'a, B: Backend> {
    pub be: &'a B,
    pub file: &'a Arc<GgufFile>,
}

impl<B: Backend> Loader<'_, B> {
    /// Whether the file has tensor `name`.
    pub fn has(&self, name: &str) -> bool {
        self.file.tensor_info(name).is_some()
    }

    /// Tensor `name`, which must have `shape` (ggml order: the row length first).
    pub fn req(&self, name: &str, shape: &[usize]) -> Result<B::Weight, ModelError> {
        let info = self
            .file
            .tensor_info(name)
            .ok_or_else(|| ModelError::MissingTensor { name: name.to_string() })?;
        let want: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
        if info.shape != want {
            return Err(ModelError::TensorShape {
                name: name.to_string(),
                expected: format!("{want:?}"),
                actual: format!("{:?}", info.shape),
            });
        }
        Ok(self.be.load_weight(self.file, name)?)
    }

    /// Tensor `name` when `present` (the family decides from its hyper-parameters).
    pub fn opt(&self, name: &str, shape: &[usize], present: bool) -> Result<Option<B::Weight>, ModelError> {
        present.then(|| self.req(name, shape)).transpose()
    }

    /// The name of tensor `name` of layer `il`.
    pub fn blk(il: usize, name: &str) -> String {
        format!("blk.{il}.{name}")
    }
}
