//! Placing a family's weights: each tensor's shape is checked against what the graph reads
//! before it goes to the backend, so a file with the right names but wrong sizes is an error
//! naming the tensor, not a wrong answer.
//!
//! Weights come from the file as the family asks for them, or, for a file that was streamed
//! (the browser), from [`Placed`]: every tensor was placed on the backend the moment its bytes
//! arrived, in file order, and the family takes them by name.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::error::ModelError;
use crate::backend::{AnyBackend, Backend, BackendError};
use crate::gguf::stream::Arrivals;
use crate::gguf::{GgufError, GgufFile, TensorView};

/// Weights placed on a backend while their file streamed in, by tensor name. A tensor the
/// backend could not place keeps its error, reported only if the model asks for it.
pub struct Placed<B: Backend> {
    weights: Mutex<HashMap<String, Result<B::Weight, BackendError>>>,
}

impl<B: Backend> Default for Placed<B> {
    fn default() -> Self {
        Placed {
            weights: Mutex::new(HashMap::new()),
        }
    }
}

impl<B: Backend> Placed<B> {
    /// Place `tensor` on `be` and keep it (or the error) under its name.
    pub fn place(&self, be: &B, tensor: TensorView<'_>) {
        let weight = be.place_weight(tensor);
        self.keep(tensor.info.name.clone(), weight);
    }

    /// Keep a weight placed another way (or the error placing it) under `name`.
    pub fn keep(&self, name: String, weight: Result<B::Weight, BackendError>) {
        self.lock().insert(name, weight);
    }

    /// How many tensors were placed or failed.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn take(&self, name: &str) -> Result<B::Weight, ModelError> {
        match self.lock().remove(name) {
            Some(w) => Ok(w?),
            None => Err(ModelError::NotPlaced { name: name.to_string() }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Result<B::Weight, BackendError>>> {
        // A panic while holding the map cannot leave it half-changed (one insert or remove).
        crate::backend::sync::lock(&self.weights)
    }
}

/// The weights of a file streamed onto an [`AnyBackend`] ([`crate::gguf::stream`]): whole
/// tensors go to [`Placed`]; on WebGPU a matrix larger than `piece` bytes arrives in pieces of
/// whole rows that go straight to its GPU buffers (a
/// [`crate::backend::webgpu::WeightWriter`]), so the stream holds one piece, not the tensor.
pub struct Placement {
    placed: Placed<AnyBackend>,
    #[cfg_attr(not(tinyllm_webgpu), allow(dead_code))]
    piece: usize,
    /// The matrix being written piece by piece.
    #[cfg(tinyllm_webgpu)]
    writer: Option<crate::backend::webgpu::WeightWriter>,
}

impl Placement {
    /// Large matrices in pieces of at most `piece` bytes (on WebGPU).
    pub fn new(piece: usize) -> Self {
        Placement {
            placed: Placed::default(),
            piece,
            #[cfg(tinyllm_webgpu)]
            writer: None,
        }
    }

    /// The stream's reader placing onto `be`.
    pub fn onto<'a>(&'a mut self, be: &'a AnyBackend) -> impl Arrivals<Error = GgufError> + 'a {
        Onto { be, to: self }
    }

    /// The weights placed (a matrix cut short by the stream's end is not among them).
    pub fn into_placed(self) -> Placed<AnyBackend> {
        self.placed
    }
}

/// [`Placement::onto`]'s reader.
struct Onto<'a> {
    be: &'a AnyBackend,
    to: &'a mut Placement,
}

impl Arrivals for Onto<'_> {
    type Error = GgufError;

    fn whole(&mut self, tensor: TensorView<'_>) -> Result<(), GgufError> {
        self.to.placed.place(self.be, tensor);
        Ok(())
    }

    #[cfg(tinyllm_webgpu)]
    fn pieces(&mut self, info: &crate::gguf::TensorInfo) -> Result<Option<usize>, GgufError> {
        let AnyBackend::WebGpu(g) = self.be else {
            return Ok(None);
        };
        if info.bytes <= self.to.piece as u64 {
            return Ok(None);
        }
        match g.weight_writer(info) {
            Ok(Some(w)) => self.to.writer = Some(w),
            Ok(None) => return Ok(None),
            // Its pieces are dropped; the model reports the error if it asks for the tensor.
            Err(e) => self.to.placed.keep(info.name.clone(), Err(e)),
        }
        Ok(Some(self.to.piece))
    }

    #[cfg(tinyllm_webgpu)]
    fn piece(&mut self, info: &crate::gguf::TensorInfo, row0: usize, data: &[u8]) -> Result<(), GgufError> {
        let (AnyBackend::WebGpu(g), Some(mut w)) = (self.be, self.to.writer.take()) else {
            return Ok(());
        };
        match w.rows(g.layer(), row0, data) {
            Err(e) => self.to.placed.keep(info.name.clone(), Err(e)),
            Ok(()) if w.is_complete() => {
                let weight = w.finish().map(crate::backend::AnyWeight::WebGpu);
                self.to.placed.keep(info.name.clone(), weight);
            }
            Ok(()) => self.to.writer = Some(w),
        }
        Ok(())
    }
}

/// Loads tensors of one file onto one backend.
pub struct Loader<'a, B: Backend> {
    pub be: &'a B,
    pub file: &'a Arc<GgufFile>,
    /// The weights of a streamed file, already on the backend.
    pub placed: Option<&'a Placed<B>>,
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
        match self.placed {
            Some(placed) => placed.take(name),
            None => Ok(self.be.load_weight(self.file, name)?),
        }
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
