//! What a model will take in memory, from its GGUF header alone: the browser package sizes a
//! model before downloading its tensors (`TinyLLM.estimate`) and refuses a load that cannot fit
//! the tab or the device (`INSUFFICIENT_MEMORY`) instead of dying mid-download.
//!
//! The parts: the weights as stored (every backend keeps the file's bytes per weight: the CPU's
//! interleaved tiles are a permutation, GPU buffers hold the blocks as they are), the KV cache
//! in f16 for the context asked for (MLA's latent cache; qwen35's attention layers and its
//! recurrent state), the activations of a prefill micro-batch, and the tokenizer's tables.
//! A streamed load also holds its largest tensor whole while placing it.

use super::error::ModelError;
use super::hparams::Keys;
use crate::gguf::GgufFile;

/// Tokens per prefill forward pass the engines size their activations for (the engine's
/// micro-batch).
pub const PREFILL_ROWS: u64 = 512;

/// A model's memory, by part, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryNeed {
    /// Every tensor as stored.
    pub weights: u64,
    /// The largest tensor (a streamed load holds it whole while placing it).
    pub largest_tensor: u64,
    /// The KV cache in f16 for [`MemoryNeed::n_ctx`] positions.
    pub kv: u64,
    /// The largest single buffer of that cache (one layer's K or V): a GPU must hold it in one
    /// buffer.
    pub kv_buffer: u64,
    /// Recurrent state (qwen35's convolution and delta-rule states, f32), whatever the context.
    pub recurrent: u64,
    /// Positions the cache is sized for (the context asked for, at most the trained one).
    pub n_ctx: usize,
    /// Activations of one prefill micro-batch ([`PREFILL_ROWS`] tokens) and the logits.
    pub working: u64,
    /// The tokenizer's vocabulary and merges as the engine holds them.
    pub tokenizer: u64,
    /// The header's metadata as parsed (the model keeps it: a vocabulary's arrays are the bulk).
    pub metadata: u64,
    /// Entries of the vocabulary.
    pub n_vocab: u64,
}

/// [`MemoryNeed`] of `file` (metadata and tensor table; no tensor data needed) with a context
/// of `n_ctx` positions (0: the trained context).
pub fn estimate(file: &GgufFile, n_ctx: usize) -> Result<MemoryNeed, ModelError> {
    let arch = file.architecture()?.to_string();
    let k = Keys { file, arch: &arch };
    let weights: u64 = file.tensors().iter().map(|t| t.bytes).sum();
    let largest_tensor = file.tensors().iter().map(|t| t.bytes).max().unwrap_or(0);
    let n_layer = k.count("block_count")? as u64;
    let trained = k.opt_count("context_length")?.unwrap_or(4096);
    let n_ctx = if n_ctx == 0 { trained } else { n_ctx.min(trained) };
    let n_embd = k.count("embedding_length")? as u64;
    let n_head = k.count("attention.head_count")? as u64;
    // A per-layer head count (an array) is sized by its largest entry.
    let n_head_kv = match file.opt(&k.key("attention.head_count_kv"), GgufFile::get_u32) {
        Ok(v) => v.map_or(n_head, u64::from),
        Err(_) => file
            .get_i64_array(&k.key("attention.head_count_kv"))
            .ok()
            .and_then(|a| a.into_iter().max())
            .map_or(n_head, |v| v.max(0) as u64),
    };
    let head = n_embd / n_head;
    let key_len = k.opt_count("attention.key_length")?.map_or(head, |v| v as u64);
    let value_len = k.opt_count("attention.value_length")?.map_or(head, |v| v as u64);
    // Values per token per attention layer, the layers that have a cache, and the recurrent
    // state (bytes, fixed).
    let widest = n_head_kv * key_len.max(value_len);
    let (per_layer, cached_layers, recurrent, widest) = if let Some(kv_lora) = k.opt_count("attention.kv_lora_rank")? {
        let rope = k.count("rope.dimension_count")? as u64;
        (kv_lora as u64 + rope, n_layer, 0, kv_lora as u64 + rope)
    } else if let Some(d_inner) = k.opt_count("ssm.inner_size")? {
        let every = k.opt_count("full_attention_interval")?.unwrap_or(4) as u64;
        let attention = n_layer / every;
        let (conv, d_k) = (k.count("ssm.conv_kernel")? as u64, k.count("ssm.state_size")? as u64);
        let (k_heads, v_heads) = (
            k.count("ssm.group_count")? as u64,
            k.count("ssm.time_step_rank")? as u64,
        );
        let d_inner = d_inner as u64;
        // Per recurrent layer, f32: the convolution's last `conv - 1` inputs of q, k and v,
        // and each value head's `d_k x d_v` delta-rule state.
        let conv_state = (conv - 1) * (d_inner + 2 * k_heads * d_k);
        let delta_state = v_heads * d_k * (d_inner / v_heads.max(1));
        let state = 4 * (n_layer - attention) * (conv_state + delta_state);
        (n_head_kv * (key_len + value_len), attention, state, widest)
    } else {
        (n_head_kv * (key_len + value_len), n_layer, 0, widest)
    };
    let kv = 2 * n_ctx as u64 * per_layer * cached_layers;
    let n_ff = k
        .opt_count("feed_forward_length")
        .ok()
        .flatten()
        .map_or(4 * n_embd, |v| v as u64);
    let n_ff = k.opt_count("expert_feed_forward_length")?.map_or(n_ff, |e| {
        let used = k.opt_count("expert_used_count").ok().flatten().unwrap_or(1) as u64;
        n_ff.max(e as u64 * used)
    });
    let vocab = file.get_str_array("tokenizer.ggml.tokens").unwrap_or_default();
    let n_vocab = vocab.len() as u64;
    let rows = PREFILL_ROWS.min(n_ctx as u64);
    // f32 activations of a micro-batch: the residual stream and its normed copy, q, k, v and
    // the attention output, the gate and up projections; the scores of one head at a time;
    // the last row's logits.
    let q_width = n_head * key_len;
    let working = 4 * rows * (3 * n_embd + 2 * q_width + 2 * n_head_kv * key_len + 2 * n_ff)
        + 4 * rows * n_ctx as u64
        + 4 * n_vocab;
    let tokenizer = tokenizer_bytes(
        &vocab,
        // Counted, not read: the merges' texts do not size the table.
        file.get_array("tokenizer.ggml.merges")
            .ok()
            .filter(|a| a.elem == crate::gguf::ValueType::String)
            .map_or(0, |a| a.items.len()),
    );
    Ok(MemoryNeed {
        weights,
        largest_tensor,
        kv,
        kv_buffer: 2 * n_ctx as u64 * widest,
        recurrent,
        n_ctx,
        working,
        tokenizer,
        metadata: metadata_bytes(file),
        n_vocab,
    })
}

impl MemoryNeed {
    /// Everything the model holds once loaded and running.
    pub fn total(&self) -> u64 {
        self.weights + self.kv + self.recurrent + self.working + self.tokenizer + self.metadata
    }
}

/// A heap allocation of `len` bytes with the allocator's bookkeeping: a word of header, the
/// size rounded up to 8 (dlmalloc on wasm32, glibc's malloc natively: both 8- or 16-byte
/// granules with a size word).
fn heap(len: u64) -> u64 {
    if len == 0 {
        0
    } else {
        (len + 8).div_ceil(8) * 8
    }
}

/// A hashbrown table of `n` entries of `entry` bytes: its buckets (a power of two at least
/// 8/7 of the entries) and a control byte each.
fn table(n: u64, entry: u64) -> u64 {
    if n == 0 {
        return 0;
    }
    let buckets = if n < 8 {
        8
    } else {
        (n * 8).div_ceil(7).next_power_of_two()
    };
    heap(buckets * (entry + 1))
}

/// The tokenizer as `crate::tokenizer` holds it: each token's text (and a copy as the key of
/// the text-to-id table), its score and attributes; each merge as an id pair in a table.
fn tokenizer_bytes(vocab: &[&str], n_merges: usize) -> u64 {
    let n = vocab.len() as u64;
    let strings: u64 = vocab.iter().map(|t| heap(t.len() as u64)).sum();
    let texts = heap(n * std::mem::size_of::<String>() as u64) + strings;
    let ids = table(n, std::mem::size_of::<(String, u32)>() as u64) + strings;
    // (left id, right id) -> (rank, merged id).
    let merges = table(n_merges as u64, 16);
    texts + ids + heap(4 * n) + heap(2 * n) + merges
}

/// The parsed metadata as `crate::gguf` holds it: each entry's key and value, an array as a
/// vector of values (a string's text on the heap).
fn metadata_bytes(file: &GgufFile) -> u64 {
    use crate::gguf::Value;
    fn value(v: &Value) -> u64 {
        match v {
            Value::String(s) => heap(s.len() as u64),
            Value::Array(a) => {
                heap(a.items.len() as u64 * std::mem::size_of::<Value>() as u64)
                    + a.items.iter().map(value).sum::<u64>()
            }
            _ => 0,
        }
    }
    let entries = file.metadata();
    heap(entries.len() as u64 * std::mem::size_of::<(String, Value)>() as u64)
        + entries
            .iter()
            .map(|(k, v)| heap(k.len() as u64) + value(v))
            .sum::<u64>()
}
