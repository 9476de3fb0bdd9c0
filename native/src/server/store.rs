//! The Responses API's store: finished responses kept in memory for `previous_response_id`,
//! `GET` and `DELETE /v1/responses/{id}`, bounded by a count and by bytes (the JSON of each
//! response and its conversation), the oldest dropped first. A dropped id is an error that
//! names it, never a silently shorter conversation.

use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use tinyllm::openai::responses::Conversation;

/// One stored response.
#[derive(Debug, Clone)]
pub struct Stored {
    pub response: Value,
    /// The conversation up to and including this response's answer, as chat messages.
    pub conversation: Conversation,
    bytes: usize,
}

#[derive(Debug, Default)]
struct Inner {
    map: HashMap<String, Stored>,
    /// Ids, oldest first.
    order: VecDeque<String>,
    bytes: usize,
}

/// See the module doc.
#[derive(Debug)]
pub struct ResponseStore {
    inner: Mutex<Inner>,
    max_count: usize,
    max_bytes: usize,
}

impl ResponseStore {
    pub fn new(max_count: usize, max_bytes: usize) -> Self {
        ResponseStore {
            inner: Mutex::new(Inner::default()),
            max_count,
            max_bytes,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keep `response` (its `id`) with its conversation; the oldest go while over a limit. One
    /// larger than the byte limit alone is not kept.
    pub fn put(&self, response: &Value, conversation: &Conversation) {
        let Some(id) = response["id"].as_str() else { return };
        let bytes = response.to_string().len() + conversation.iter().map(|m| m.to_string().len()).sum::<usize>();
        if self.max_count == 0 || bytes > self.max_bytes {
            return;
        }
        let mut s = self.lock();
        if let Some(old) = s.map.remove(id) {
            s.bytes -= old.bytes;
            s.order.retain(|i| i != id);
        }
        while s.map.len() >= self.max_count || s.bytes + bytes > self.max_bytes {
            let Some(oldest) = s.order.pop_front() else { break };
            if let Some(old) = s.map.remove(&oldest) {
                s.bytes -= old.bytes;
            }
        }
        s.bytes += bytes;
        s.order.push_back(id.to_string());
        s.map.insert(
            id.to_string(),
            Stored {
                response: response.clone(),
                conversation: conversation.clone(),
                bytes,
            },
        );
    }

    pub fn get(&self, id: &str) -> Option<Stored> {
        self.lock().map.get(id).cloned()
    }

    /// Forget `id`; whether it was there.
    pub fn delete(&self, id: &str) -> bool {
        let mut s = self.lock();
        match s.map.remove(id) {
            Some(old) => {
                s.bytes -= old.bytes;
                s.order.retain(|i| i != id);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bounded_by_count_and_bytes_oldest_first() {
        let store = ResponseStore::new(2, 10_000);
        for i in 0..3 {
            store.put(
                &json!({"id": format!("resp_{i}")}),
                &vec![json!({"role": "user", "content": "x"})],
            );
        }
        assert!(store.get("resp_0").is_none(), "the oldest goes past the count");
        assert!(store.get("resp_1").is_some() && store.get("resp_2").is_some());
        assert!(store.delete("resp_1") && !store.delete("resp_1"));
        let small = ResponseStore::new(100, 200);
        let big = "y".repeat(120);
        small.put(&json!({"id": "a"}), &vec![json!({"content": big})]);
        small.put(&json!({"id": "b"}), &vec![json!({"content": big})]);
        assert!(small.get("a").is_none() && small.get("b").is_some(), "bytes bound");
        small.put(&json!({"id": "c"}), &vec![json!({"content": "z".repeat(500)})]);
        assert!(
            small.get("c").is_none() && small.get("b").is_some(),
            "too large alone: not kept"
        );
    }
}
