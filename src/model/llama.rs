//! The llama-family graph (llama, mistral, qwen2, qwen3):
//!
//! ```text
//! x = embd[tokens]
//! per layer:  x += Wo · attn(rope(norm_qk(Wq·n + bq)), rope(norm_qk(Wk·n + bk)), Wv·n + bv),  n = rmsnorm(x)
//!             x += Wdown · (silu(Wgate·n) * Wup·n),                                           n = rmsnorm(x)
//! ```
//! Biases are qwen2's, per-head q/k norms qwen3's; the rest is shared.

use super::{Model, ModelError, Scratch, SeqChunk};
use crate::backend::Backend;

/// Run the layers for the stacked `tokens` of `seqs` (each at its own positions, over its own
/// cache); leaves the residual stream in `s.x`.
pub(super) fn forward<B: Backend>(
    m: &Model<B>,
    seqs: &mut [SeqChunk<'_, B>],
    s: &mut Scratch<B>,
    tokens: &[u32],
) -> Result<(), ModelError> {
    let (be, c, w) = (m.backend(), m.config(), m.weights());
    let rows = tokens.len();
    let len = rows * c.n_embd;
    be.embed(&w.token_embd, tokens, 1.0, &mut s.x)?;
    for (il, l) in w.layers.iter().enumerate() {
        be.rmsnorm(&s.x, &l.attn_norm, rows, c.rms_eps, &mut s.xn)?;
        m.attention_block(seqs, s, il, rows)?;
        be.add(&mut s.x, &s.xn, len)?;
        be.rmsnorm(&s.x, &l.ffn_norm, rows, c.rms_eps, &mut s.xn)?;
        m.ffn_block(s, il, rows, false)?;
        be.add(&mut s.x, &s.xn, len)?;
    }
    Ok(())
}
