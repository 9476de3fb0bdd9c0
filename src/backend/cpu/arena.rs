//! The bytes of the interleaved weights, placed so that a decode step streams them from 2 MiB
//! pages. A transparent huge page needs an aligned 2 MiB range inside one mapping: a model's
//! matrices of 1-5 MiB (most of qwen35-24l's 200), each its own allocation, mostly had none,
//! and a decode step, which reads every one of them once, then walked the page tables every
//! 4 KiB. On the AMD EPYC (Zen 4) 51 of qwen35-24l's 359 MiB were on huge pages, and with all of
//! them there its decode was 9% faster. So the backend carves its interleaved weights one
//! after another out of large chunks, aligned and advised for huge pages ([`Arena`]); a chunk
//! is unmapped once the last weight in it is dropped. Elsewhere (not Linux, or a map that
//! failed) each weight gets a zeroed vector of its own, as before.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, PoisonError};

/// Bytes of a shared chunk.
const CHUNK: usize = 64 << 20;
/// The largest weight that shares a chunk; bigger ones get a mapping of their own (whose
/// aligned start puts all of it on huge pages), so a chunk's unused tail stays below this.
const SHARED_MAX: usize = 8 << 20;
/// Where each weight starts in a chunk: a cache line.
const ALIGN: usize = 64;

/// Hands out [`ArenaBytes`], filling one chunk at a time.
#[derive(Default)]
pub(super) struct Arena {
    /// The chunk being filled, and how many of its bytes are handed out.
    open: Mutex<Option<(Arc<Map>, usize)>>,
}

impl fmt::Debug for Arena {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Arena")
    }
}

impl Arena {
    /// `len` zeroed bytes, on huge pages where the system gives them.
    pub(super) fn zeroed(&self, len: usize) -> ArenaBytes {
        let heap = || ArenaBytes(Inner::Heap(vec![0; len]));
        if len == 0 {
            return heap();
        }
        if len > SHARED_MAX {
            return Map::new(len).map_or_else(heap, |map| {
                ArenaBytes(Inner::Mapped {
                    map: Arc::new(map),
                    start: 0,
                    len,
                })
            });
        }
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let fits = |(map, used): &(Arc<Map>, usize)| used.next_multiple_of(ALIGN) + len <= map.len;
        if !open.as_ref().is_some_and(fits) {
            *open = Map::new(CHUNK).map(|map| (Arc::new(map), 0));
        }
        let Some((map, used)) = open.as_mut() else {
            return heap();
        };
        let start = used.next_multiple_of(ALIGN);
        *used = start + len;
        ArenaBytes(Inner::Mapped {
            map: Arc::clone(map),
            start,
            len,
        })
    }
}

/// Bytes from an [`Arena`]: a range of a chunk that no other `ArenaBytes` shares, or a vector.
pub(super) struct ArenaBytes(Inner);

enum Inner {
    Heap(Vec<u8>),
    /// Bytes `start..start + len` of `map`.
    Mapped {
        map: Arc<Map>,
        start: usize,
        len: usize,
    },
}

impl Deref for ArenaBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.0 {
            Inner::Heap(v) => v,
            // SAFETY: the range lies inside the mapping (`Arena::zeroed` checked it), which
            // lives as long as `map`; no other `ArenaBytes` hands out this range.
            Inner::Mapped { map, start, len } => unsafe { std::slice::from_raw_parts(map.ptr.add(*start), *len) },
        }
    }
}

impl DerefMut for ArenaBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.0 {
            Inner::Heap(v) => v,
            // SAFETY: as in `deref`; the range is this value's alone, borrowed mutably here.
            Inner::Mapped { map, start, len } => unsafe { std::slice::from_raw_parts_mut(map.ptr.add(*start), *len) },
        }
    }
}

impl fmt::Debug for ArenaBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let place = if matches!(self.0, Inner::Heap(_)) {
            "heap"
        } else {
            "chunk"
        };
        write!(f, "ArenaBytes({} bytes, {place})", self.len())
    }
}

/// A private anonymous mapping of `len` bytes (a multiple of 2 MiB) at a 2 MiB boundary,
/// advised for huge pages; unmapped on drop.
struct Map {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; the `ArenaBytes` that share it
// hand out disjoint ranges.
unsafe impl Send for Map {}
unsafe impl Sync for Map {}

/// A transparent huge page.
#[cfg(target_os = "linux")]
const HUGE: usize = 2 << 20;

impl Map {
    /// A mapping of at least `len` bytes, or `None` where there is none to be had.
    #[cfg(target_os = "linux")]
    fn new(len: usize) -> Option<Map> {
        let len = len.checked_next_multiple_of(HUGE)?;
        let total = len.checked_add(HUGE)?;
        // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return None;
        }
        let head = (base as usize).next_multiple_of(HUGE) - base as usize;
        let ptr = (base as usize + head) as *mut u8;
        // SAFETY: the slack before and after the aligned range lies inside the mapping just
        // made and is not used; MADV_HUGEPAGE changes how pages are backed, never their
        // contents (a hint: without it the pages are small).
        unsafe {
            if head > 0 {
                libc::munmap(base, head);
            }
            if total - head > len {
                libc::munmap(ptr.add(len) as *mut libc::c_void, total - head - len);
            }
            libc::madvise(ptr as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        }
        Some(Map { ptr, len })
    }

    #[cfg(not(target_os = "linux"))]
    fn new(_len: usize) -> Option<Map> {
        None
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        // SAFETY: `ptr..ptr + len` is the mapping `Map::new` made, no longer referred to.
        unsafe {
            libc::munmap(self.ptr as *mut libc::c_void, self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Weights carved from one chunk keep their own bytes, start on cache lines, come back
    /// zeroed, and a chunk outlives the arena while a weight in it lives.
    #[test]
    fn carved_weights_are_disjoint_zeroed_and_outlive_the_arena() {
        let arena = Arena::default();
        let mut parts: Vec<ArenaBytes> = [1000, 3, SHARED_MAX, 70_000, SHARED_MAX + 1, 0]
            .iter()
            .map(|&n| arena.zeroed(n))
            .collect();
        for (i, p) in parts.iter_mut().enumerate() {
            assert!(p.iter().all(|&b| b == 0), "part {i} not zeroed");
            if cfg!(target_os = "linux") && !p.is_empty() {
                assert!(format!("{p:?}").contains("chunk"), "part {i} not in a chunk");
                assert_eq!(p.as_ptr() as usize % ALIGN, 0, "part {i} off a cache line");
            }
            p.fill(i as u8 + 1);
        }
        drop(arena);
        for (i, p) in parts.iter().enumerate() {
            assert!(p.iter().all(|&b| b == i as u8 + 1), "part {i} overwritten");
        }
        assert_eq!(
            parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
            [1000, 3, SHARED_MAX, 70_000, SHARED_MAX + 1, 0]
        );
    }
}
