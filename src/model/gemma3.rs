//! The Gemma 3 graph:
//!
//! ```text
//! x = embd[tokens] * sqrt(n_embd)
//! per layer:  x += post_attn_norm(Wo · attn(...)),   q/k per-head RMS-normed, q pre-scaled,
//!                                                     sliding window on SWA layers (own rope base)
//!             x += post_ffn_norm(Wdown · (gelu_tanh(Wgate·n) * Wup·n))
//! ```

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
    be.embed(&w.token_embd, tokens, c.embd_scale.unwrap_or(1.0), &mut s.x)?;
    for (il, l) in w.layers.iter().enumerate() {
        be.rmsnorm(&s.x, &l.attn_norm, rows, c.rms_eps, &mut s.xn)?;
        m.attention_block(seqs, s, il, rows)?;
        if let Some(pn) = &l.post_attn_norm {
            be.rmsnorm_inplace(&mut s.xn, pn, rows, c.rms_eps)?;
        }
        be.add(&mut s.x, &s.xn, len)?;
        be.rmsnorm(&s.x, &l.ffn_norm, rows, c.rms_eps, &mut s.xn)?;
        m.ffn_block(s, il, rows, true)?;
        if let Some(pn) = &l.post_ffn_norm {
            be.rmsnorm_inplace(&mut s.xn, pn, rows, c.rms_eps)?;
        }
        be.add(&mut s.x, &s.xn, len)?;
    }
    Ok(())
}
