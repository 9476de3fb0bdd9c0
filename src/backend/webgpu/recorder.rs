//! Recording ops into one command encoder until data must come back.
//!
//! Every op becomes one compute dispatch (or a buffer copy) in the pending encoder; its small
//! parameter block (and the token ids of an embedding lookup) is appended to a host-side arena
//! that is uploaded once, right before the encoder is submitted. So a forward pass costs one
//! `queue.submit` and one readback, at the `read`/`argmax` that ends it.
//!
//! Bind groups are made once and reused: a forward pass records the same dispatches, over the
//! same buffers and with its parameters at the same arena offsets, every time it runs, so a
//! bind group is keyed by its layout and resources (handles, which keep their ids from being
//! reused while the key lives) and after the first token no step creates one. The device
//! layer's buffers and images ([`WgpuBuf`], [`WgpuImage`]) drop their cached bind groups with
//! them (a bind group holds its resources; without this the device memory would stay until
//! the cache starts over).

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::{Mutex, Weak};

use crate::backend::gpu;
use crate::backend::sync::lock;

/// A device layer whose buffers and images are wgpu's.
pub trait WgpuLayer: gpu::Device<Buf = WgpuBuf, Image = WgpuImage> {}
impl<D: gpu::Device<Buf = WgpuBuf, Image = WgpuImage>> WgpuLayer for D {}

/// Bytes of parameter arena per submission; a pass that needs more is split into submissions.
pub const ARENA_BYTES: u64 = 1 << 20;

/// One binding of a dispatch: what the shared layer binds, or the op's own slice of the arena.
/// (Generic over the device layer, which is the one whose buffers are [`WgpuBuf`]s, so this
/// file need not name it.)
pub enum Bind<'a, D: WgpuLayer> {
    Device(gpu::Bind<'a, D>),
    /// Offset into the arena returned by [`Recorder::push`].
    Arena {
        offset: u64,
        size: u64,
    },
}

/// Submission and readback counters (to show one of each per decoded token), and the bind
/// groups created (none per token once a pass has run).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub submissions: u64,
    pub readbacks: u64,
    pub dispatches: u64,
    pub bind_groups: u64,
}

/// Most bind groups kept; past it the cache starts over. A pass records a few hundred; groups
/// whose buffers are dropped leave with them (`forget`), so this only bounds passes of many
/// shapes (arena offsets differ between them).
const MAX_BIND_GROUPS: usize = 8192;

/// What a bind group binds at one index (owned handles: a key keeps its resources' ids).
#[derive(PartialEq, Eq, Hash)]
enum Resource {
    Buffer(wgpu::Buffer),
    Head(wgpu::Buffer, u64),
    Texture(wgpu::TextureView),
    Arena { offset: u64, size: u64 },
}

#[derive(PartialEq, Eq, Hash)]
struct BindKey {
    layout: wgpu::BindGroupLayout,
    entries: Vec<(u32, Resource)>,
}

/// The pending encoder and its parameter arena.
pub struct Recorder {
    encoder: Option<wgpu::CommandEncoder>,
    /// Parameters of the recorded ops, uploaded to `arena` at submission.
    staged: Vec<u8>,
    arena: wgpu::Buffer,
    align: u64,
    bind_groups: HashMap<BindKey, wgpu::BindGroup>,
    pub counters: Counters,
}

impl Recorder {
    pub fn new(device: &wgpu::Device, limits: &wgpu::Limits) -> Self {
        let arena = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("params arena"),
            size: ARENA_BYTES,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let align = u64::from(
            limits
                .min_uniform_buffer_offset_alignment
                .max(limits.min_storage_buffer_offset_alignment),
        );
        Recorder {
            encoder: None,
            staged: Vec::new(),
            arena,
            align: align.max(16),
            bind_groups: HashMap::new(),
            counters: Counters::default(),
        }
    }

    /// Whether `bytes` more fit into the arena of the pending submission.
    pub fn fits(&self, bytes: usize) -> bool {
        let start = (self.staged.len() as u64).div_ceil(self.align) * self.align;
        start + (bytes as u64).max(16) <= ARENA_BYTES
    }

    /// Append `data` to the arena (padded to 16 bytes); returns its offset.
    pub fn push(&mut self, data: &[u8]) -> u64 {
        let start = (self.staged.len() as u64).div_ceil(self.align) * self.align;
        self.staged.resize(start as usize, 0);
        self.staged.extend_from_slice(data);
        let padded = (self.staged.len()).div_ceil(16) * 16;
        self.staged.resize(padded.max(start as usize + 16), 0);
        start
    }

    pub fn encoder(&mut self, device: &wgpu::Device) -> &mut wgpu::CommandEncoder {
        self.encoder
            .get_or_insert_with(|| device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None }))
    }

    /// Record one dispatch of `pipeline` with `binds` as bindings `(index, what)` of group 0.
    pub fn dispatch<D: WgpuLayer>(
        &mut self,
        device: &wgpu::Device,
        pipeline: &wgpu::ComputePipeline,
        layout: &wgpu::BindGroupLayout,
        binds: &[(u32, Bind<'_, D>)],
        groups: (u32, u32, u32),
    ) {
        let bind_group = self.bind_group(device, layout, binds);
        let enc = self
            .encoder
            .get_or_insert_with(|| device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None }));
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: None,
            timestamp_writes: None,
        });
        pass.set_pipeline(pipeline);
        pass.set_bind_group(0, &bind_group, &[]);
        pass.dispatch_workgroups(groups.0, groups.1, groups.2);
        self.counters.dispatches += 1;
    }

    /// Bind groups in the cache.
    pub fn cached_bind_groups(&self) -> usize {
        self.bind_groups.len()
    }

    /// Drop the cached bind groups that bind any of `bufs` or `views` (their owner is going).
    pub fn forget(&mut self, bufs: &[&wgpu::Buffer], views: &[&wgpu::TextureView]) {
        self.bind_groups.retain(|key, _| {
            !key.entries.iter().any(|(_, r)| match r {
                Resource::Buffer(b) | Resource::Head(b, _) => bufs.contains(&b),
                Resource::Texture(v) => views.contains(&v),
                Resource::Arena { .. } => false,
            })
        });
    }

    /// The bind group of `binds` for `layout`, made on first use.
    fn bind_group<D: WgpuLayer>(
        &mut self,
        device: &wgpu::Device,
        layout: &wgpu::BindGroupLayout,
        binds: &[(u32, Bind<'_, D>)],
    ) -> wgpu::BindGroup {
        let arena_size = |size: u64| size.max(16).div_ceil(16) * 16;
        let key = BindKey {
            layout: layout.clone(),
            entries: binds
                .iter()
                .map(|(i, b)| {
                    let r = match b {
                        Bind::Device(gpu::Bind::Buffer(b)) => Resource::Buffer(b.buf.clone()),
                        Bind::Device(gpu::Bind::Uniform(b, size)) => Resource::Head(b.buf.clone(), *size),
                        Bind::Device(gpu::Bind::Image(i)) => Resource::Texture(i.view.clone()),
                        Bind::Arena { offset, size } => Resource::Arena {
                            offset: *offset,
                            size: arena_size(*size),
                        },
                    };
                    (*i, r)
                })
                .collect(),
        };
        if let Some(g) = self.bind_groups.get(&key) {
            return g.clone();
        }
        let entries: Vec<wgpu::BindGroupEntry<'_>> = key
            .entries
            .iter()
            .map(|(binding, r)| wgpu::BindGroupEntry {
                binding: *binding,
                resource: match r {
                    Resource::Buffer(buf) => buf.as_entire_binding(),
                    Resource::Head(buf, size) => wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: buf,
                        offset: 0,
                        size: NonZeroU64::new(*size),
                    }),
                    Resource::Texture(view) => wgpu::BindingResource::TextureView(view),
                    Resource::Arena { offset, size } => wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: &self.arena,
                        offset: *offset,
                        size: NonZeroU64::new(*size),
                    }),
                },
            })
            .collect();
        let g = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout,
            entries: &entries,
        });
        self.counters.bind_groups += 1;
        if self.bind_groups.len() >= MAX_BIND_GROUPS {
            self.bind_groups.clear();
        }
        self.bind_groups.insert(key, g.clone());
        g
    }

    /// Upload the arena and submit the pending encoder (if any work is pending).
    pub fn submit(&mut self, queue: &wgpu::Queue) {
        let Some(enc) = self.encoder.take() else {
            return;
        };
        if !self.staged.is_empty() {
            queue.write_buffer(&self.arena, 0, &self.staged);
            self.staged.clear();
        }
        queue.submit([enc.finish()]);
        self.counters.submissions += 1;
    }
}

/// A storage or uniform buffer.
#[derive(Debug)]
pub struct WgpuBuf {
    pub(super) buf: wgpu::Buffer,
    /// The recorder whose bind group cache may hold `buf`.
    pub(super) cache: Weak<Mutex<Recorder>>,
}

/// The bind groups cached with a buffer hold it; its drop removes them, so the device memory
/// goes with the owner (work already recorded keeps its own references).
impl Drop for WgpuBuf {
    fn drop(&mut self) {
        forget(&self.cache, &[&self.buf], &[]);
    }
}

/// A texture holding texture rows of weight blocks, and the view kernels bind.
#[derive(Debug)]
pub struct WgpuImage {
    /// Kept alive with its view.
    #[allow(dead_code)]
    pub(super) tex: wgpu::Texture,
    pub(super) view: wgpu::TextureView,
    pub(super) cache: Weak<Mutex<Recorder>>,
}

/// See `Drop for WgpuBuf`.
impl Drop for WgpuImage {
    fn drop(&mut self) {
        forget(&self.cache, &[], &[&self.view]);
    }
}

/// Drop the bind groups of `cache` that bind any of `bufs` or `views`.
fn forget(cache: &Weak<Mutex<Recorder>>, bufs: &[&wgpu::Buffer], views: &[&wgpu::TextureView]) {
    if let Some(rec) = cache.upgrade() {
        lock(&rec).forget(bufs, views);
    }
}
