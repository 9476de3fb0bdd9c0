//! A readback in flight: a staging buffer being mapped for reading, as a [`Pending`] result.
//!
//! The device calls back when the mapping is done: in the browser from the event loop (the
//! future is woken), natively from `device.poll`, which [`Pending::wait`] calls blocking. The
//! staging buffer goes back to the backend's pool once read, so a decode step allocates none.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use crate::backend::error::BackendError;
use crate::backend::readback::Pending;
use crate::backend::sync::lock;

/// Where the mapping callback leaves its outcome.
#[derive(Default)]
struct Slot {
    done: Option<Result<(), String>>,
    waker: Option<Waker>,
}

/// Staging buffers kept for reuse (one is enough for the one readback per pass).
pub type StagingPool = Arc<Mutex<Option<wgpu::Buffer>>>;

/// The first `bytes` of `staging` once mapped.
pub struct MappedRead {
    op: &'static str,
    staging: Option<wgpu::Buffer>,
    size: u64,
    bytes: usize,
    slot: Arc<Mutex<Slot>>,
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    device: wgpu::Device,
    pool: StagingPool,
}

impl MappedRead {
    /// Start mapping the first `size` bytes of `staging` (the copy into it is submitted); the
    /// result is its first `bytes`.
    pub fn start(
        op: &'static str,
        staging: wgpu::Buffer,
        size: u64,
        bytes: usize,
        device: &wgpu::Device,
        pool: &StagingPool,
    ) -> Self {
        let slot = Arc::new(Mutex::new(Slot::default()));
        let done = Arc::clone(&slot);
        staging.slice(..size).map_async(wgpu::MapMode::Read, move |r| {
            let mut s = lock(&done);
            s.done = Some(r.map_err(|e| e.to_string()));
            if let Some(w) = s.waker.take() {
                w.wake();
            }
        });
        MappedRead {
            op,
            staging: Some(staging),
            size,
            bytes,
            slot,
            device: device.clone(),
            pool: Arc::clone(pool),
        }
    }

    /// The bytes, once the mapping is done; the staging buffer returns to the pool.
    fn finish(&mut self, outcome: Result<(), String>) -> Result<Vec<u8>, BackendError> {
        let op = self.op;
        let staging = self
            .staging
            .take()
            .ok_or_else(|| device(op, "the result was already taken".into()))?;
        outcome.map_err(|e| device(op, format!("mapping the result: {e}")))?;
        let data = staging
            .slice(..self.size)
            .get_mapped_range()
            .map_err(|e| device(op, format!("reading the result: {e}")))?[..self.bytes]
            .to_vec();
        staging.unmap();
        let mut kept = lock(&self.pool);
        if kept.as_ref().is_none_or(|k| k.size() < staging.size()) {
            *kept = Some(staging);
        }
        Ok(data)
    }
}

fn device(op: &'static str, problem: String) -> BackendError {
    BackendError::Device { op, problem }
}

impl Pending<Vec<u8>> for MappedRead {
    fn poll_result(&mut self, cx: &mut Context<'_>) -> Poll<Result<Vec<u8>, BackendError>> {
        #[cfg(not(target_arch = "wasm32"))]
        {
            // Natively nothing else drives the device: wait for it here.
            let _ = cx;
            Poll::Ready(self.wait())
        }
        #[cfg(target_arch = "wasm32")]
        {
            let outcome = {
                let mut s = lock(&self.slot);
                match s.done.take() {
                    Some(o) => o,
                    None => {
                        s.waker = Some(cx.waker().clone());
                        return Poll::Pending;
                    }
                }
            };
            Poll::Ready(self.finish(outcome))
        }
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn wait(&mut self) -> Result<Vec<u8>, BackendError> {
        let op = self.op;
        if lock(&self.slot).done.is_none() {
            // Returns once every submission is done and the mapping callbacks have run.
            self.device
                .poll(wgpu::PollType::Wait {
                    submission_index: None,
                    timeout: None,
                })
                .map_err(|e| device(op, format!("waiting for it: {e}")))?;
        }
        let outcome = lock(&self.slot).done.take();
        match outcome {
            Some(o) => self.finish(o),
            None => Err(device(op, "the device finished without mapping the result".into())),
        }
    }
}
