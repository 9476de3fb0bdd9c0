//! What every handler can reach: the models, the keys and limits, the Responses store.

use super::registry::Registry;
use super::store::ResponseStore;
use std::sync::Arc;

/// What every handler can reach.
pub struct AppState {
    /// The models, loaded on first use ([`registry`]).
    pub models: Registry,
    pub api_key: Option<String>,
    pub max_body_bytes: usize,
    /// Finished Responses API answers, for `previous_response_id`.
    pub responses: ResponseStore,
    /// Request ids, unique over the models (response ids are made from them).
    pub(super) next_id: std::sync::atomic::AtomicU64,
}

impl AppState {
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }
}

pub type Shared = Arc<AppState>;
