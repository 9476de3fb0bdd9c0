//! Device memory for the Vulkan backend: buffers sub-allocated from a few large allocations.
//!
//! Drivers allow only a few thousand `vkAllocateMemory` calls and each is slow, while a model
//! has hundreds of tensors and a pass dozens of scratch buffers, so buffers take ranges of
//! large blocks (first fit, freed ranges merged with their neighbours). A request larger than
//! a block gets a block of its own (a tensor bigger than one storage binding is split into
//! parts by the shared GPU layer before it gets here).
//!
//! Two locations: [`Location::Device`] (device-local memory: the weights, activations, the KV
//! cache) and [`Location::Host`] (host-visible and coherent: uniform and staging buffers).
//! Host-visible blocks stay mapped, so writing one is a copy. Where device-local memory is
//! host-visible too (integrated GPUs, lavapipe, resizable BAR) a device buffer is written
//! directly; elsewhere [`Buffer::mapped`] is `None` and data goes through a staging buffer
//! (`dispatch.rs`). [`Memory::force_staging`] takes the staging path everywhere, so tests
//! exercise it on lavapipe.

use std::sync::{Arc, Mutex};

use ash::vk;

use super::device::Device;
use crate::backend::sync::lock;
use crate::backend::vulkan::error::VulkanError;

/// The default block size: large enough that a small model's weights take a few blocks.
pub const BLOCK_BYTES: u64 = 64 << 20;

/// Where a buffer lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    /// Device-local memory.
    Device,
    /// Host-visible, coherent memory, mapped for the buffer's life.
    Host,
}

/// A buffer bound to a range of a block. Freed by [`Memory::free`] (or with the [`Memory`]).
#[derive(Debug)]
pub struct Buffer {
    pub raw: vk::Buffer,
    /// Bytes the caller asked for.
    pub size: u64,
    block: usize,
    offset: u64,
    /// Bytes of the block the buffer holds (its size rounded up to the alignment).
    span: u64,
    mapped: Option<*mut u8>,
}

// SAFETY: the mapped pointer is into a persistently mapped, host-coherent block that lives as
// long as the `Memory` the buffer came from; writes to it go through `&mut`/`&` of the
// buffer's own range only.
unsafe impl Send for Buffer {}
unsafe impl Sync for Buffer {}

impl Buffer {
    /// The buffer's bytes in host memory, where its memory is host-visible (and staging is not
    /// forced).
    pub fn mapped(&self) -> Option<*mut u8> {
        self.mapped
    }

    /// Copy `data` into the buffer at byte `offset`. `false` (nothing written) when the buffer
    /// is not host-visible; an error when the range does not fit.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<bool, VulkanError> {
        self.check_range("write", offset, data.len() as u64)?;
        let Some(p) = self.mapped else { return Ok(false) };
        // SAFETY: `p` points to `size` mapped bytes (checked range); the caller keeps the GPU
        // from using this range meanwhile (writes happen between passes).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p.add(offset as usize), data.len()) };
        Ok(true)
    }

    /// Copy `out.len()` bytes from byte `offset` of a host-visible buffer into `out`.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<bool, VulkanError> {
        self.check_range("read", offset, out.len() as u64)?;
        let Some(p) = self.mapped else { return Ok(false) };
        // SAFETY: as in `write`; the GPU's writes were made visible by the fence wait that
        // ended the pass.
        unsafe { std::ptr::copy_nonoverlapping(p.add(offset as usize), out.as_mut_ptr(), out.len()) };
        Ok(true)
    }

    fn check_range(&self, what: &str, offset: u64, len: u64) -> Result<(), VulkanError> {
        if offset.checked_add(len).is_none_or(|end| end > self.size) {
            return Err(VulkanError::Unsupported {
                kernel: "buffer".into(),
                problem: format!("{what} of {len} bytes at {offset} overruns a buffer of {}", self.size),
            });
        }
        Ok(())
    }
}

/// A 2-D image of `Rgba32Uint` texels (texture-held weights), read by kernels with
/// `textureLoad`: a range of a block, like a [`Buffer`], with its view.
#[derive(Debug)]
pub struct Image {
    pub raw: vk::Image,
    pub view: vk::ImageView,
    pub width: u32,
    pub height: u32,
    block: usize,
    offset: u64,
    span: u64,
}

// SAFETY: plain handles; the memory is the `Memory`'s.
unsafe impl Send for Image {}
unsafe impl Sync for Image {}

/// What waits in [`Memory::retire`].
#[derive(Debug)]
enum Retired {
    Buffer(Buffer),
    Image(Image),
}

/// The texel format of [`Image`]s: four 32-bit words, as WebGPU's `Rgba32Uint`.
pub const IMAGE_FORMAT: vk::Format = vk::Format::R32G32B32A32_UINT;

/// One `vkAllocateMemory` and the ranges of it that are free.
struct Block {
    memory: vk::DeviceMemory,
    type_index: u32,
    location: Location,
    /// Holds optimally tiled images (kept apart from buffers, so no range needs padding to
    /// `bufferImageGranularity`).
    images: bool,
    size: u64,
    /// (offset, bytes), sorted by offset, neighbours merged.
    free: Vec<(u64, u64)>,
    mapped: Option<*mut u8>,
}

impl Block {
    /// First fit: the lowest offset aligned to `align` where `span` bytes are free.
    fn take(&mut self, span: u64, align: u64) -> Option<u64> {
        let (i, start) = self.free.iter().enumerate().find_map(|(i, &(off, len))| {
            let start = off.div_ceil(align) * align;
            (start + span <= off + len).then_some((i, start))
        })?;
        let (off, len) = self.free.remove(i);
        if start + span < off + len {
            self.free.insert(i, (start + span, off + len - start - span));
        }
        if start > off {
            self.free.insert(i, (off, start - off));
        }
        Some(start)
    }

    fn give_back(&mut self, offset: u64, span: u64) {
        let i = self.free.partition_point(|&(o, _)| o < offset);
        self.free.insert(i, (offset, span));
        // Merge with the next, then the previous range.
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
        }
    }

    fn is_empty(&self) -> bool {
        self.free.len() == 1 && self.free[0] == (0, self.size)
    }
}

/// Blocks of device memory on one device, and the buffers in them.
pub struct Memory {
    device: Arc<Device>,
    types: vk::PhysicalDeviceMemoryProperties,
    block_bytes: u64,
    force_staging: bool,
    blocks: Mutex<Vec<Option<Block>>>,
    /// Buffers and images dropped while recorded work may still use them
    /// ([`Memory::retire`]), freed after the next pass has been waited for
    /// ([`Memory::free_retired`]).
    retired: Mutex<Vec<Retired>>,
}

// SAFETY: blocks (and their mapped pointers) are only touched under the mutex.
unsafe impl Send for Memory {}
unsafe impl Sync for Memory {}

impl std::fmt::Debug for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Memory").field("stats", &self.stats()).finish()
    }
}

/// Memory statistics, for tests and `bench`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryStats {
    /// Live `vkAllocateMemory` blocks.
    pub blocks: usize,
    /// Bytes allocated from the driver.
    pub allocated: u64,
    /// Bytes of them held by buffers.
    pub used: u64,
}

impl Memory {
    pub fn new(device: &Arc<Device>) -> Self {
        Self::with_block_bytes(device, BLOCK_BYTES)
    }

    /// Blocks of `block_bytes` (tests use small ones).
    pub fn with_block_bytes(device: &Arc<Device>, block_bytes: u64) -> Self {
        // SAFETY: the physical device belongs to the device's live instance.
        let types = unsafe {
            device
                .instance()
                .raw()
                .get_physical_device_memory_properties(device.physical())
        };
        Self {
            device: Arc::clone(device),
            types,
            block_bytes: block_bytes.max(1 << 16),
            force_staging: false,
            blocks: Mutex::new(Vec::new()),
            retired: Mutex::new(Vec::new()),
        }
    }

    /// Treat device memory as not host-visible even where it is: uploads and readbacks go
    /// through staging buffers, as on a discrete GPU.
    pub fn force_staging(mut self, on: bool) -> Self {
        self.force_staging = on;
        self
    }

    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// A buffer of `size` bytes (at least 4) usable as `usage`, in `location`.
    pub fn alloc(&self, size: u64, usage: vk::BufferUsageFlags, location: Location) -> Result<Buffer, VulkanError> {
        let raw_dev = self.device.raw();
        let size = size.max(4);
        let info = vk::BufferCreateInfo::default()
            .size(size)
            .usage(usage)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        // SAFETY: `info` lives across the call; the device is live.
        let raw =
            unsafe { raw_dev.create_buffer(&info, None) }.map_err(|e| VulkanError::failed("vkCreateBuffer", e))?;
        match self.place(raw, size, location) {
            Ok(b) => Ok(b),
            Err(e) => {
                // SAFETY: the buffer was created above and is bound to nothing in use.
                unsafe { raw_dev.destroy_buffer(raw, None) };
                Err(e)
            }
        }
    }

    /// Find memory for `raw` (`size` bytes asked for) and bind it.
    fn place(&self, raw: vk::Buffer, size: u64, location: Location) -> Result<Buffer, VulkanError> {
        let dev = self.device.raw();
        // SAFETY: `raw` is a live buffer of this device.
        let req = unsafe { dev.get_buffer_memory_requirements(raw) };
        let (block, offset, memory, mapped) = self.reserve(req, location, false)?;
        // SAFETY: the range [offset, offset + req.size) of the block's memory was free and
        // meets the buffer's alignment and memory type; the buffer is bound once.
        if let Err(e) = unsafe { dev.bind_buffer_memory(raw, memory, offset) } {
            self.release(block, offset, req.size);
            return Err(VulkanError::failed("vkBindBufferMemory", e));
        }
        let mapped = match (location, self.force_staging) {
            (Location::Device, true) => None,
            _ => mapped,
        };
        Ok(Buffer {
            raw,
            size,
            block,
            offset,
            span: req.size,
            mapped,
        })
    }

    /// A device-local image of `width` x `height` [`IMAGE_FORMAT`] texels, optimally tiled,
    /// for sampling and as a copy destination, with its view; its contents are undefined until
    /// written (`Recorder::upload_image`).
    pub fn alloc_image(&self, width: u32, height: u32) -> Result<Image, VulkanError> {
        let dev = self.device.raw();
        let info = vk::ImageCreateInfo::default()
            .image_type(vk::ImageType::TYPE_2D)
            .format(IMAGE_FORMAT)
            .extent(vk::Extent3D {
                width,
                height,
                depth: 1,
            })
            .mip_levels(1)
            .array_layers(1)
            .samples(vk::SampleCountFlags::TYPE_1)
            .tiling(vk::ImageTiling::OPTIMAL)
            .usage(vk::ImageUsageFlags::SAMPLED | vk::ImageUsageFlags::TRANSFER_DST)
            .sharing_mode(vk::SharingMode::EXCLUSIVE)
            .initial_layout(vk::ImageLayout::UNDEFINED);
        // SAFETY: `info` lives across the call; the device is live.
        let raw = unsafe { dev.create_image(&info, None) }.map_err(|e| VulkanError::failed("vkCreateImage", e))?;
        // SAFETY: `raw` is a live image of this device.
        let req = unsafe { dev.get_image_memory_requirements(raw) };
        let placed = self
            .reserve(req, Location::Device, true)
            .and_then(|(block, offset, memory, _)| {
                // SAFETY: a free range of an image block, of the image's alignment and type.
                match unsafe { dev.bind_image_memory(raw, memory, offset) } {
                    Ok(()) => Ok((block, offset)),
                    Err(e) => {
                        self.release(block, offset, req.size);
                        Err(VulkanError::failed("vkBindImageMemory", e))
                    }
                }
            });
        let (block, offset) = match placed {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: the image was created above and is used by nothing.
                unsafe { dev.destroy_image(raw, None) };
                return Err(e);
            }
        };
        let view_info = vk::ImageViewCreateInfo::default()
            .image(raw)
            .view_type(vk::ImageViewType::TYPE_2D)
            .format(IMAGE_FORMAT)
            .subresource_range(
                vk::ImageSubresourceRange::default()
                    .aspect_mask(vk::ImageAspectFlags::COLOR)
                    .level_count(1)
                    .layer_count(1),
            );
        let image = Image {
            raw,
            view: vk::ImageView::null(),
            width,
            height,
            block,
            offset,
            span: req.size,
        };
        // SAFETY: the image is live and bound; `view_info` lives across the call.
        match unsafe { dev.create_image_view(&view_info, None) } {
            Ok(view) => Ok(Image { view, ..image }),
            Err(e) => {
                self.free_image(image);
                Err(VulkanError::failed("vkCreateImageView", e))
            }
        }
    }

    /// Destroy `image` (and its view) and give its range back.
    pub fn free_image(&self, image: Image) {
        let dev = self.device.raw();
        // SAFETY: the image belongs to this memory and the GPU no longer uses it (as `free`).
        unsafe {
            dev.destroy_image_view(image.view, None);
            dev.destroy_image(image.raw, None);
        }
        self.release(image.block, image.offset, image.span);
    }

    /// A free range for `req` in a block of the memory type for `location` (a new block if
    /// none has room): (block index, offset, the block's memory, the range's mapping).
    fn reserve(
        &self,
        req: vk::MemoryRequirements,
        location: Location,
        images: bool,
    ) -> Result<(usize, u64, vk::DeviceMemory, Option<*mut u8>), VulkanError> {
        let type_index = self.memory_type(req.memory_type_bits, location)?;
        let align = req.alignment.max(1);
        let mut blocks = lock(&self.blocks);
        let found = blocks.iter_mut().enumerate().find_map(|(i, b)| {
            let b = b
                .as_mut()
                .filter(|b| b.location == location && b.type_index == type_index && b.images == images)?;
            b.take(req.size, align).map(|off| (i, off))
        });
        let (index, offset) = match found {
            Some(f) => f,
            None => {
                let mut block = self.new_block(req.size.max(self.block_bytes), type_index, location, images)?;
                let off = block.take(req.size, align).unwrap_or(0);
                let slot = blocks.iter().position(Option::is_none).unwrap_or(blocks.len());
                if slot == blocks.len() {
                    blocks.push(None);
                }
                blocks[slot] = Some(block);
                (slot, off)
            }
        };
        let block = blocks[index].as_ref().expect("the block just used");
        // SAFETY: the block is mapped whole; the offset lies inside it.
        let mapped = block.mapped.map(|p| unsafe { p.add(offset as usize) });
        Ok((index, offset, block.memory, mapped))
    }

    /// Give a range back (an emptied block goes back to the driver).
    fn release(&self, block: usize, offset: u64, span: u64) {
        let mut blocks = lock(&self.blocks);
        let emptied = match blocks.get_mut(block).and_then(Option::as_mut) {
            Some(b) => {
                b.give_back(offset, span);
                b.is_empty()
            }
            None => false,
        };
        if emptied {
            if let Some(b) = blocks[block].take() {
                // SAFETY: nothing is bound to the block any more; unmapped by freeing.
                unsafe { self.device.raw().free_memory(b.memory, None) };
            }
        }
    }

    fn new_block(&self, size: u64, type_index: u32, location: Location, images: bool) -> Result<Block, VulkanError> {
        let dev = self.device.raw();
        let info = vk::MemoryAllocateInfo::default()
            .allocation_size(size)
            .memory_type_index(type_index);
        // SAFETY: `info` lives across the call; the type index is one of this device's.
        let memory =
            unsafe { dev.allocate_memory(&info, None) }.map_err(|e| VulkanError::failed("vkAllocateMemory", e))?;
        let flags = self.types.memory_types[type_index as usize].property_flags;
        let mapped = if flags.contains(vk::MemoryPropertyFlags::HOST_VISIBLE) {
            // SAFETY: the memory is host-visible, just allocated and not mapped yet.
            match unsafe { dev.map_memory(memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty()) } {
                Ok(p) => Some(p.cast::<u8>()),
                Err(e) => {
                    // SAFETY: nothing is bound to it.
                    unsafe { dev.free_memory(memory, None) };
                    return Err(VulkanError::failed("vkMapMemory", e));
                }
            }
        } else {
            None
        };
        Ok(Block {
            memory,
            type_index,
            location,
            images,
            size,
            free: vec![(0, size)],
            mapped,
        })
    }

    /// The memory type for `location` among `allowed` (a requirements bitmask): device-local
    /// for [`Location::Device`], host-visible too where such a type sits on the largest
    /// device-local heap (integrated GPUs, resizable BAR, lavapipe; not the 256 MiB BAR window
    /// of a discrete GPU without it, which weights would overflow), else any; host-visible and
    /// coherent for [`Location::Host`].
    fn memory_type(&self, allowed: u32, location: Location) -> Result<u32, VulkanError> {
        use vk::MemoryPropertyFlags as F;
        let count = self.types.memory_type_count as usize;
        let heap_of = |i: usize| self.types.memory_heaps[self.types.memory_types[i].heap_index as usize].size;
        let find = |want: F| {
            (0..count).find(|&i| allowed & (1 << i) != 0 && self.types.memory_types[i].property_flags.contains(want))
        };
        let largest_local = (0..count)
            .filter(|&i| self.types.memory_types[i].property_flags.contains(F::DEVICE_LOCAL))
            .map(heap_of)
            .max()
            .unwrap_or(0);
        let choice = match location {
            Location::Device => find(F::DEVICE_LOCAL | F::HOST_VISIBLE | F::HOST_COHERENT)
                .filter(|&i| heap_of(i) >= largest_local)
                .or_else(|| find(F::DEVICE_LOCAL))
                .or_else(|| find(F::empty())),
            Location::Host => find(F::HOST_VISIBLE | F::HOST_COHERENT),
        };
        choice.map(|i| i as u32).ok_or_else(|| VulkanError::Unsupported {
            kernel: "memory".into(),
            problem: format!("no {location:?} memory type fits a buffer (allowed types {allowed:#x})"),
        })
    }

    /// Destroy `buffer` and give its range back (an emptied block goes back to the driver).
    pub fn free(&self, buffer: Buffer) {
        // SAFETY: the buffer belongs to this memory; the caller guarantees the GPU no longer
        // uses it (passes are waited for before they end).
        unsafe { self.device.raw().destroy_buffer(buffer.raw, None) };
        self.release(buffer.block, buffer.offset, buffer.span);
    }

    /// Free `buffer` once the work recorded so far has finished: a buffer dropped in the middle
    /// of a pass may be named by a recorded command, which must not meet a destroyed buffer
    /// (nor its range handed to another one). [`Memory::free_retired`] frees it.
    pub fn retire(&self, buffer: Buffer) {
        lock(&self.retired).push(Retired::Buffer(buffer));
    }

    /// [`Memory::retire`] for an image.
    pub fn retire_image(&self, image: Image) {
        lock(&self.retired).push(Retired::Image(image));
    }

    /// Free the [`Memory::retire`]d buffers; called when every submitted pass has finished.
    pub fn free_retired(&self) {
        let retired = std::mem::take(&mut *lock(&self.retired));
        for r in retired {
            match r {
                Retired::Buffer(b) => self.free(b),
                Retired::Image(i) => self.free_image(i),
            }
        }
    }

    pub fn stats(&self) -> MemoryStats {
        let blocks = lock(&self.blocks);
        let mut s = MemoryStats::default();
        for b in blocks.iter().flatten() {
            s.blocks += 1;
            s.allocated += b.size;
            s.used += b.size - b.free.iter().map(|&(_, l)| l).sum::<u64>();
        }
        s
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        let dev = self.device.raw();
        // SAFETY: after waiting for idle nothing uses the retired resources.
        unsafe {
            let _ = dev.device_wait_idle();
            for r in self.retired.get_mut().unwrap_or_else(|e| e.into_inner()).drain(..) {
                match r {
                    Retired::Buffer(b) => dev.destroy_buffer(b.raw, None),
                    Retired::Image(i) => {
                        dev.destroy_image_view(i.view, None);
                        dev.destroy_image(i.raw, None);
                    }
                }
            }
        }
        let blocks = self.blocks.get_mut().unwrap_or_else(|e| e.into_inner());
        // SAFETY: buffers still bound to these blocks are the caller's leak; the device waits
        // for idle before its own drop, and no pass outlives the memory it uses.
        unsafe {
            let _ = dev.device_wait_idle();
            for b in blocks.drain(..).flatten() {
                dev.free_memory(b.memory, None);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(size: u64) -> Block {
        Block {
            memory: vk::DeviceMemory::null(),
            type_index: 0,
            location: Location::Device,
            images: false,
            size,
            free: vec![(0, size)],
            mapped: None,
        }
    }

    #[test]
    fn first_fit_aligns_and_merges_freed_ranges() {
        let mut b = block(1024);
        assert_eq!(b.take(100, 64), Some(0));
        assert_eq!(b.take(100, 64), Some(128));
        assert_eq!(b.free, vec![(100, 28), (228, 796)]);
        assert_eq!(b.take(20, 4), Some(100), "the gap before an aligned range is used");
        assert_eq!(b.take(2000, 4), None);
        b.give_back(0, 100);
        b.give_back(128, 100);
        b.give_back(100, 20);
        assert!(b.is_empty(), "{:?}", b.free);
    }
}
