//! SentencePiece-style tokenization (`tokenizer.ggml.model = "llama"`): start from single characters and
//! repeatedly merge the adjacent pair whose concatenation is the highest-scoring vocabulary entry.
//!
//! Same order as llama.cpp's `llm_tokenizer_spm_session` (highest score first, leftmost on ties);
//! characters that never form a token fall back to `<0xXX>` byte tokens.

use super::Vocab;
use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// A live or merged-away span of the text; merged symbols have `len == 0`.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// Max-heap order: higher score first, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .partial_cmp(&other.score)
            .unwrap_or(Ordering::Equal)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// Appends the tokens of `text` (spaces already escaped to U+2581) to `out`.
pub(super) fn tokenize(vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
    let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
    for (start, ch) in text.char_indices() {
        let idx = symbols.len();
        symbols.push(Symbol {
            start,
            len: ch.len_utf8(),
            prev: idx.checked_sub(1),
            next: Some(idx + 1),
        });
    }
    let Some(last) = symbols.last_mut() else { return };
    last.next = None;

    let mut queue = BinaryHeap::new();
    let try_add = |symbols: &[Symbol], queue: &mut BinaryHeap<Bigram>, left: Option<usize>, right: Option<usize>| {
        let (Some(l), Some(r)) = (left, right) else { return };
        let (ls, rs) = (symbols[l], symbols[r]);
        let piece = &text[ls.start..rs.start + rs.len];
        if let Some(id) = vocab.id(piece) {
            queue.push(Bigram {
                score: vocab.score(id),
                left: l,
                right: r,
                size: piece.len(),
            });
        }
    };
    for i in 1..symbols.len() {
        try_add(&symbols, &mut queue, Some(i - 1), Some(i));
    }
    while let Some(b) = queue.pop() {
        let (l, r) = (symbols[b.left], symbols[b.right]);
        // Stale entry: one side was merged away or grew since this pair was queued.
        if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
            continue;
        }
        symbols[b.left].len += r.len;
        symbols[b.right].len = 0;
        symbols[b.left].next = r.next;
        if let Some(n) = r.next {
            symbols[n].prev = Some(b.left);
        }
        try_add(&symbols, &mut queue, l.prev, Some(b.left));
        try_add(&symbols, &mut queue, Some(b.left), r.next);
    }

    let mut cur = Some(0);
    while let Some(i) = cur {
        let s = symbols[i];
        let piece = &text[s.start..s.start + s.len];
        match vocab.id(piece) {
            Some(id) => out.push(id),
            None => out.extend(piece.bytes().filter_map(|b| vocab.byte_token(b))),
        }
        cur = s.next;
    }
}
