//! The C allocator's settings for an inference process.
//!
//! A prefill allocates and frees tens of megabytes of short-lived buffers per batch: a MoE
//! layer's per-expert activation copies alone are about 20 MB at 512 tokens. glibc's malloc
//! hands such blocks back to the kernel when they are freed (those above its mmap threshold,
//! and whatever the top of its heap has free beyond its trim threshold), and the next batch
//! faults every page back in, zeroed. Measured on a 512-token prefill of the synthetic
//! qwen3moe IQ3 mix: about 18,000 page faults per batch with the defaults, about 100 with
//! the settings below, and the kernel's fault and page-clearing work (a few percent of the
//! prefill) gone. What the process keeps is what it used at its peak anyway.

/// Keep freed memory in the process for reuse: allocations below 32 MiB (glibc's largest mmap
/// threshold on 64-bit) come from the heap, and the heap is not trimmed until 256 MiB of its
/// top is free. Setting either turns off glibc's own adjustment of both, so both are set.
/// Call before other threads start.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn keep_freed_memory() {
    // SAFETY: `mallopt` only sets the allocator's parameters, from the main thread before any
    // other thread exists. It returns 0 for a value it refuses and then keeps its default,
    // which is safe, so the result is not checked.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
}

/// Other C libraries keep their defaults.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn keep_freed_memory() {}
