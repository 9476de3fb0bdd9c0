//! [`lock`]: a mutex's guard, carrying on after a panic elsewhere poisoned it. Every lock the
//! backends take guards state that a panic cannot leave half-updated in a way that matters
//! (caches, scratch slots, recorders, pools of freed memory), so poisoning is not an error.

use std::sync::{Mutex, MutexGuard};

/// The guard of `m`, poisoned or not.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
