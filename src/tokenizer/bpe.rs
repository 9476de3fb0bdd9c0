//! Byte-level BPE (`tokenizer.ggml.model = "gpt2"`): each pre-tokenized word is spelled in GPT-2's
//! byte-to-unicode alphabet, then adjacent pairs are merged by rank (lowest first, leftmost on ties),
//! exactly the order of llama.cpp's `llm_tokenizer_bpe_session`.
//!
//! Merges are kept as token-id pairs, so the merge loop does no string work at all.

use super::{TokenizerError, Vocab};
use rustc_hash::FxHashMap;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// A queued merge: (rank, left index, right index, left id, right id); the heap pops the lowest rank,
/// then the leftmost pair.
type Candidate = (u32, usize, usize, u32, u32);

pub(super) struct Merges {
    /// (left id, right id) -> (rank, merged id).
    ranks: FxHashMap<(u32, u32), (u32, u32)>,
    /// Token id of each byte's GPT-2 character, if the vocabulary has it.
    byte_ids: [Option<u32>; 256],
}

impl Merges {
    /// Parses `tokenizer.ggml.merges` ("left right" per entry, rank = position).
    pub(super) fn new(vocab: &Vocab, merges: &[&str]) -> Result<Self, TokenizerError> {
        const KEY: &str = "tokenizer.ggml.merges";
        let mut ranks = FxHashMap::default();
        ranks.reserve(merges.len());
        for (rank, entry) in merges.iter().enumerate() {
            let bad = |why: &str| TokenizerError::BadMerge {
                key: KEY,
                index: rank,
                entry: entry.to_string(),
                why: why.to_string(),
            };
            // The split point is the first space after the first byte, like llama.cpp's `find(' ', 1)`.
            let pos = entry
                .bytes()
                .skip(1)
                .position(|b| b == b' ')
                .map(|p| p + 1)
                .ok_or_else(|| bad("no space separator"))?;
            let (left, right) = (&entry[..pos], &entry[pos + 1..]);
            let l = vocab.id(left).ok_or_else(|| bad("left part is not a token"))?;
            let r = vocab.id(right).ok_or_else(|| bad("right part is not a token"))?;
            let merged = vocab
                .id(&format!("{left}{right}"))
                .ok_or_else(|| bad("merged text is not a token"))?;
            let rank = u32::try_from(rank).map_err(|_| bad("too many merges"))?;
            // A repeated pair keeps its first (best) rank, as llama.cpp's map emplace does.
            ranks.entry((l, r)).or_insert((rank, merged));
        }
        let table = super::unicode::byte_to_char_table();
        let mut byte_ids = [None; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            let mut buf = [0u8; 4];
            *slot = vocab.id(table[b].encode_utf8(&mut buf));
        }
        Ok(Self { ranks, byte_ids })
    }

    /// Appends the tokens of one word (raw UTF-8 bytes) to `out`.
    pub(super) fn tokenize_word(&self, word: &[u8], out: &mut Vec<u32>) {
        // (id, next, prev, alive); ids of missing byte characters are None and never merge.
        let mut ids: Vec<Option<u32>> = word.iter().map(|&b| self.byte_ids[b as usize]).collect();
        let n = ids.len();
        if n == 0 {
            return;
        }
        let mut next: Vec<usize> = (1..=n).collect(); // n means "none"
        let mut prev: Vec<usize> = (0..n).map(|i| i.wrapping_sub(1)).collect(); // usize::MAX means "none"
        let mut heap: BinaryHeap<Reverse<Candidate>> = BinaryHeap::new();
        let rank_of = |a: Option<u32>, b: Option<u32>| match (a, b) {
            (Some(a), Some(b)) => self.ranks.get(&(a, b)).map(|&(rank, _)| (a, b, rank)),
            _ => None,
        };
        for i in 1..n {
            if let Some((a, b, rank)) = rank_of(ids[i - 1], ids[i]) {
                heap.push(Reverse((rank, i - 1, i, a, b)));
            }
        }
        while let Some(Reverse((_, l, r, a, b))) = heap.pop() {
            // Stale unless the pair is still adjacent and unchanged.
            if next[l] != r || ids[l] != Some(a) || ids[r] != Some(b) {
                continue;
            }
            let Some(&(_, merged)) = self.ranks.get(&(a, b)) else {
                continue;
            };
            ids[l] = Some(merged);
            ids[r] = None;
            next[l] = next[r];
            next[r] = usize::MAX;
            if next[l] < n {
                prev[next[l]] = l;
            }
            if prev[l] != usize::MAX {
                if let Some((x, y, rank)) = rank_of(ids[prev[l]], ids[l]) {
                    heap.push(Reverse((rank, prev[l], l, x, y)));
                }
            }
            if next[l] < n {
                if let Some((x, y, rank)) = rank_of(ids[l], ids[next[l]]) {
                    heap.push(Reverse((rank, l, next[l], x, y)));
                }
            }
        }
        let mut i = 0;
        while i < n {
            // A byte whose character is not in the vocabulary is dropped, as llama.cpp does.
            if let Some(id) = ids[i] {
                out.push(id);
            }
            i = next[i];
        }
    }
}
