//! The Vulkan device layer's buffers and images ([`crate::backend::gpu::device::Device::Buf`]
//! and `Image`): each an owned range of [`Memory`] that is retired (freed once recorded work is
//! done) when dropped.

use std::sync::Arc;

use super::memory::{Buffer, Image, Memory};

/// What [`Memory`] hands out and takes back ([`Memory::retire`], [`Memory::retire_image`]).
pub trait Retire: std::fmt::Debug {
    fn retire(self, memory: &Memory);
}

impl Retire for Buffer {
    fn retire(self, memory: &Memory) {
        memory.retire(self);
    }
}

impl Retire for Image {
    fn retire(self, memory: &Memory) {
        memory.retire_image(self);
    }
}

/// A buffer (or image) of [`Memory`] that goes back to it on drop, after the work recorded so
/// far (a recorded command may still name it).
#[derive(Debug)]
pub struct Owned<T: Retire = Buffer> {
    item: Option<T>,
    memory: Arc<Memory>,
}

/// An [`Image`] of [`Memory`] that goes back to it on drop.
pub type OwnedImage = Owned<Image>;

impl<T: Retire> Owned<T> {
    pub(super) fn new(item: T, memory: &Arc<Memory>) -> Self {
        Self {
            item: Some(item),
            memory: Arc::clone(memory),
        }
    }

    pub(super) fn get(&self) -> &T {
        self.item.as_ref().expect("held until dropped")
    }
}

impl<T: Retire> Drop for Owned<T> {
    fn drop(&mut self) {
        if let Some(item) = self.item.take() {
            item.retire(&self.memory);
        }
    }
}
