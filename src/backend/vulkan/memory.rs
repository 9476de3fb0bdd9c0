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
use super::VulkanError;

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

/// One `vkAllocateMemory` and the ranges of it that are free.
struct Block {
    memory: vk::DeviceMemory,
    type_index: u32,
    location: Location,
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
    /// Buffers dropped while recorded work may still use them ([`Memory::retire`]), freed
    /// after the next pass has been waited for ([`Memory::free_retired`]).
    retired: Mutex<Vec<Buffer>>,
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
        let type_index = self.memory_type(req.memory_type_bits, location)?;
        let align = req.alignment.max(1);
        let mut blocks = self.blocks.lock().unwrap_or_else(|e| e.into_inner());
        let found = blocks.iter_mut().enumerate().find_map(|(i, b)| {
            let b = b
                .as_mut()
                .filter(|b| b.location == location && b.type_index == type_index)?;
            b.take(req.size, align).map(|off| (i, off))
        });
        let (index, offset) = match found {
            Some(f) => f,
            None => {
                let mut block = self.new_block(req.size.max(self.block_bytes), type_index, location)?;
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
        // SAFETY: the range [offset, offset + req.size) of the block's memory was free and
        // meets the buffer's alignment and memory type; the buffer is bound once.
        if let Err(e) = unsafe { dev.bind_buffer_memory(raw, block.memory, offset) } {
            if let Some(b) = blocks[index].as_mut() {
                b.give_back(offset, req.size);
            }
            return Err(VulkanError::failed("vkBindBufferMemory", e));
        }
        let mapped = match (location, self.force_staging) {
            (Location::Device, true) => None,
            // SAFETY: the block is mapped whole; the offset lies inside it.
            _ => block.mapped.map(|p| unsafe { p.add(offset as usize) }),
        };
        Ok(Buffer {
            raw,
            size,
            block: index,
            offset,
            span: req.size,
            mapped,
        })
    }

    fn new_block(&self, size: u64, type_index: u32, location: Location) -> Result<Block, VulkanError> {
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
        let dev = self.device.raw();
        // SAFETY: the buffer belongs to this memory; the caller guarantees the GPU no longer
        // uses it (passes are waited for before they end).
        unsafe { dev.destroy_buffer(buffer.raw, None) };
        let mut blocks = self.blocks.lock().unwrap_or_else(|e| e.into_inner());
        let emptied = match blocks.get_mut(buffer.block).and_then(Option::as_mut) {
            Some(b) => {
                b.give_back(buffer.offset, buffer.span);
                b.is_empty()
            }
            None => false,
        };
        if emptied {
            if let Some(b) = blocks[buffer.block].take() {
                // SAFETY: no buffer is bound to the block any more; unmapped by freeing.
                unsafe { dev.free_memory(b.memory, None) };
            }
        }
    }

    /// Free `buffer` once the work recorded so far has finished: a buffer dropped in the middle
    /// of a pass may be named by a recorded command, which must not meet a destroyed buffer
    /// (nor its range handed to another one). [`Memory::free_retired`] frees it.
    pub fn retire(&self, buffer: Buffer) {
        self.retired.lock().unwrap_or_else(|e| e.into_inner()).push(buffer);
    }

    /// Free the [`Memory::retire`]d buffers; called when every submitted pass has finished.
    pub fn free_retired(&self) {
        let retired = std::mem::take(&mut *self.retired.lock().unwrap_or_else(|e| e.into_inner()));
        for b in retired {
            self.free(b);
        }
    }

    pub fn stats(&self) -> MemoryStats {
        let blocks = self.blocks.lock().unwrap_or_else(|e| e.into_inner());
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
        for b in self.retired.get_mut().unwrap_or_else(|e| e.into_inner()).drain(..) {
            // SAFETY: waited for idle below before the memory goes; the buffer is unused.
            unsafe {
                let _ = dev.device_wait_idle();
                dev.destroy_buffer(b.raw, None);
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
