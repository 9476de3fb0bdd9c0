//! Text <-> token ids for GGUF models, matching llama.cpp token for token.
//!
//! Two model families: SentencePiece-style (`tokenizer.ggml.model = "llama"`, see [`spm`]) and byte-level
//! BPE (`"gpt2"`, see [`bpe`] and [`pretok`]). Both share the vocabulary, the special-token rules and the
//! decoder here. [`StreamDecoder`] turns ids into text incrementally without ever splitting a UTF-8
//! character.

mod bpe;
mod pretok;
mod spm;
mod unicode;
mod unicode_tables;

use crate::gguf::{GgufError, GgufFile, Value};
use rustc_hash::FxHashMap;

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("tokenizer: {0}")]
    Other(String),
    /// The GGUF error already names the key; it is shown inline rather than as a `source`,
    /// so error chains do not print it twice.
    #[error("tokenizer: {error}")]
    Gguf { key: &'static str, error: GgufError },
    #[error("tokenizer: unsupported tokenizer.ggml.model '{0}' (supported: llama, gpt2)")]
    UnknownModel(String),
    #[error("tokenizer: unknown pre-tokenizer (tokenizer.ggml.pre) '{0}'")]
    UnknownPreTokenizer(String),
    #[error("tokenizer: {key} has {got} entries, but the vocabulary has {expected} tokens")]
    LengthMismatch {
        key: &'static str,
        got: usize,
        expected: usize,
    },
    #[error("tokenizer: {key}[{index}] = {value} is not a valid token type (0..=6)")]
    BadTokenType {
        key: &'static str,
        index: usize,
        value: i64,
    },
    #[error("tokenizer: byte token {id} ({text:?}) is not of the form <0xXX>")]
    BadByteToken { id: u32, text: String },
    #[error("tokenizer: {key}[{index}] = {entry:?}: {why}")]
    BadMerge {
        key: &'static str,
        index: usize,
        entry: String,
        why: String,
    },
    #[error("tokenizer: {key} = {id} is out of range for a vocabulary of {vocab_size} tokens")]
    SpecialOutOfRange {
        key: &'static str,
        id: u64,
        vocab_size: usize,
    },
    #[error("tokenizer: pre-tokenizer regex {pattern:?} failed to compile: {message}")]
    Regex { pattern: String, message: String },
    #[error("tokenizer: special-token matcher: {0}")]
    Matcher(String),
    #[error("token id {id} is out of range (vocabulary size {vocab_size})")]
    IdOutOfRange { id: u32, vocab_size: usize },
}

// Token attributes, as llama.cpp's `llama_token_attr` bits.
const ATTR_UNKNOWN: u16 = 1 << 0;
const ATTR_UNUSED: u16 = 1 << 1;
const ATTR_NORMAL: u16 = 1 << 2;
const ATTR_CONTROL: u16 = 1 << 3;
const ATTR_USER_DEFINED: u16 = 1 << 4;
const ATTR_BYTE: u16 = 1 << 5;

/// Token texts, scores and attributes, with the reverse lookup.
struct Vocab {
    texts: Vec<String>,
    scores: Vec<f32>,
    attrs: Vec<u16>,
    ids: FxHashMap<String, u32>,
    /// `<0xXX>` token for each byte (SentencePiece byte fallback).
    byte_tokens: [Option<u32>; 256],
    unk: Option<u32>,
}

impl Vocab {
    fn id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }
    fn score(&self, id: u32) -> f32 {
        self.scores.get(id as usize).copied().unwrap_or(0.0)
    }
    fn attr(&self, id: u32) -> u16 {
        self.attrs.get(id as usize).copied().unwrap_or(0)
    }
    /// llama.cpp's `byte_to_token` for SentencePiece: `<0xXX>`, else the byte itself, else `<unk>`.
    fn byte_token(&self, b: u8) -> Option<u32> {
        self.byte_tokens[b as usize]
            .or_else(|| std::str::from_utf8(&[b]).ok().and_then(|s| self.id(s)))
            .or(self.unk)
    }
}

enum Kind {
    Spm {
        add_space_prefix: bool,
    },
    Bpe {
        merges: Box<bpe::Merges>,
        pre: pretok::PreConfig,
    },
}

/// A tokenizer loaded from a GGUF file's `tokenizer.ggml.*` keys.
pub struct Tokenizer {
    vocab: Vocab,
    kind: Kind,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    eog: Vec<u32>,
    /// Control, user-defined and unknown tokens, longest first: the order llama.cpp matches them in.
    specials: Vec<u32>,
    /// Finds which specials occur in a text at all, so the exact (slow) partition only sees those.
    special_finder: Option<aho_corasick::AhoCorasick>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos", &self.bos)
            .finish()
    }
}

fn gguf_err(key: &'static str) -> impl Fn(GgufError) -> TokenizerError {
    move |error| TokenizerError::Gguf { key, error }
}

/// Reads a numeric array (scores may be f32 or i32 in llama.cpp's loader).
fn numeric_array<T>(
    file: &GgufFile,
    key: &'static str,
    get: fn(&GgufFile, &str) -> Result<T, GgufError>,
) -> Result<Option<T>, TokenizerError> {
    if file.get(key).is_none() {
        return Ok(None);
    }
    get(file, key).map(Some).map_err(gguf_err(key))
}

const EOT_NAMES: [&str; 11] = [
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const FIM_NAMES: [&str; 30] = [
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
    "<|fim_pad|>",
    "<fim-pad>",
    "<fim_pad>",
    "<PAD>",
    "[PAD]",
    "<|file_sep|>",
];
const FIM_EOG_NAMES: [&str; 11] = [
    "<|fim_pad|>",
    "<fim-pad>",
    "<fim_pad>",
    "<PAD>",
    "[PAD]",
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
    "<|file_sep|>",
];
const EOG_NAMES: [&str; 22] = [
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

impl Tokenizer {
    /// Loads the vocabulary, merges and special-token settings, validating every index in the
    /// file: the vocabulary ([`read_vocab`]), the family's defaults and its kind (SentencePiece or
    /// BPE with its merges and pre-tokenizer), the special ids the file sets
    /// ([`SpecialIds::read`]), and the end-of-generation rules ([`end_of_generation`]).
    pub fn from_gguf(file: &GgufFile) -> Result<Self, TokenizerError> {
        const K_MODEL: &str = "tokenizer.ggml.model";
        const K_PRE: &str = "tokenizer.ggml.pre";
        const K_MERGES: &str = "tokenizer.ggml.merges";

        let model = file.get_str(K_MODEL).map_err(gguf_err(K_MODEL))?.to_string();
        let pre = match file.get(K_PRE) {
            Some(_) => Some(file.get_str(K_PRE).map_err(gguf_err(K_PRE))?.to_string()),
            None => None,
        };
        let mut vocab = read_vocab(file)?;

        // Defaults per family, then the file's keys, as llama.cpp's loader orders them.
        let (kind_name, bos, eos, unk) = match model.as_str() {
            "llama" => ("spm", Some(1u32), Some(2u32), Some(0u32)),
            "gpt2" => ("bpe", Some(11), Some(11), None),
            other => return Err(TokenizerError::UnknownModel(other.to_string())),
        };
        let add_bos;
        let kind = if kind_name == "spm" {
            add_bos = true;
            let add_space_prefix = file
                .opt("tokenizer.ggml.add_space_prefix", GgufFile::get_bool)
                .map_err(gguf_err("tokenizer.ggml.add_space_prefix"))?
                .unwrap_or(true);
            Kind::Spm { add_space_prefix }
        } else {
            let pre_cfg = pretok::config_for(pre.as_deref())?;
            add_bos = pre_cfg.add_bos;
            let merges = file.get_str_array(K_MERGES).map_err(gguf_err(K_MERGES))?;
            Kind::Bpe {
                merges: Box::new(bpe::Merges::new(&vocab, &merges)?),
                pre: pre_cfg,
            }
        };
        let defaults = SpecialIds {
            bos,
            eos,
            eot: None,
            eom: None,
            unk,
            add_bos,
            add_eos: false,
        };
        let mut ids = SpecialIds::read(file, defaults, vocab.texts.len())?;
        vocab.unk = ids.unk;
        let eog = end_of_generation(&mut vocab, &mut ids);
        let (specials, special_finder) = special_matcher(&vocab)?;
        Ok(Self {
            vocab,
            kind,
            bos: ids.bos,
            eos: ids.eos,
            add_bos: ids.add_bos,
            add_eos: ids.add_eos,
            eog,
            specials,
            special_finder,
        })
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab.texts.len()
    }
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.vocab.texts.get(id as usize).map(String::as_str)
    }
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.id(text)
    }
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }
    /// End of generation: EOS, EOT/EOM and the turn-ending tokens llama.cpp recognises by name.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }
    /// The end-of-generation tokens, ascending.
    pub fn eog_tokens(&self) -> &[u32] {
        &self.eog
    }
    /// Whether `encode(.., add_special = true, ..)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos && self.bos.is_some()
    }
    /// Whether the token is a control token (rendered as text by [`Tokenizer::decode`]).
    pub fn is_control(&self, id: u32) -> bool {
        self.vocab.attr(id) & ATTR_CONTROL != 0
    }

    /// Text to ids. `add_special` adds BOS/EOS where the model asks for them; `parse_special` lets
    /// control tokens written in the text (`<|im_start|>`) become those tokens.
    /// Tokenize a rendered chat prompt: special tokens parsed, BOS added when the model wants
    /// one, but never twice (templates that write `bos_token` themselves already have it).
    pub fn encode_chat(&self, rendered: &str) -> Vec<u32> {
        let mut ids = self.encode(rendered, true, true);
        if let Some(bos) = self.bos() {
            if ids.len() >= 2 && ids[0] == bos && ids[1] == bos {
                ids.remove(0);
            }
        }
        ids
    }

    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        let fragments = self.partition(text, parse_special);
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        match &self.kind {
            Kind::Spm { add_space_prefix } => {
                let mut prev_special = true;
                let mut buf = String::new();
                for frag in fragments {
                    match frag {
                        Fragment::Text(s) => {
                            buf.clear();
                            if *add_space_prefix && prev_special {
                                buf.push('\u{2581}');
                            }
                            for ch in s.chars() {
                                buf.push(if ch == ' ' { '\u{2581}' } else { ch });
                            }
                            spm::tokenize(&self.vocab, &buf, &mut out);
                            prev_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
            }
            Kind::Bpe { merges, pre } => {
                let mut encoded = String::new();
                for frag in fragments {
                    match frag {
                        Fragment::Text(s) => {
                            for range in pretok::split(&pre.stages, s) {
                                let word = &s[range];
                                if pre.ignore_merges {
                                    encoded.clear();
                                    let table = unicode::byte_to_char_table();
                                    encoded.extend(word.bytes().map(|b| table[b as usize]));
                                    if let Some(id) = self.vocab.id(&encoded) {
                                        out.push(id);
                                        continue;
                                    }
                                }
                                merges.tokenize_word(word.as_bytes(), &mut out);
                            }
                        }
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        out
    }

    /// Splits out special tokens like llama.cpp's `tokenizer_st_partition`: each special token, longest
    /// first, claims its left-to-right occurrences in whatever text is still unclaimed.
    fn partition<'t>(&self, text: &'t str, parse_special: bool) -> Vec<Fragment<'t>> {
        let mut frags = Vec::new();
        if text.is_empty() {
            return frags;
        }
        frags.push(Fragment::Text(text));
        let Some(finder) = &self.special_finder else {
            return frags;
        };
        // Which specials occur at all; overlapping search so none hides behind another.
        let mut present = vec![false; self.specials.len()];
        let mut any = false;
        for m in finder.find_overlapping_iter(text) {
            present[m.pattern().as_usize()] = true;
            any = true;
        }
        if !any {
            return frags;
        }
        for (idx, &id) in self.specials.iter().enumerate() {
            if !present[idx] {
                continue;
            }
            if !parse_special && self.vocab.attr(id) & (ATTR_CONTROL | ATTR_UNKNOWN) != 0 {
                continue;
            }
            let needle = self.vocab.texts[id as usize].as_str();
            let mut next = Vec::with_capacity(frags.len() + 2);
            for frag in frags {
                let Fragment::Text(s) = frag else {
                    next.push(frag);
                    continue;
                };
                let mut rest = s;
                while let Some(pos) = rest.find(needle) {
                    if pos > 0 {
                        next.push(Fragment::Text(&rest[..pos]));
                    }
                    next.push(Fragment::Token(id));
                    rest = &rest[pos + needle.len()..];
                }
                if !rest.is_empty() {
                    next.push(Fragment::Text(rest));
                }
            }
            frags = next;
        }
        frags
    }

    /// The raw bytes one token stands for; control tokens give their text, unused tokens nothing.
    pub fn token_to_piece(&self, id: u32) -> Result<Vec<u8>, TokenizerError> {
        let text = self.vocab.texts.get(id as usize).ok_or(TokenizerError::IdOutOfRange {
            id,
            vocab_size: self.vocab_size(),
        })?;
        let attr = self.vocab.attr(id);
        if attr & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED) != 0 {
            return Ok(text.as_bytes().to_vec());
        }
        if attr & ATTR_NORMAL != 0 {
            return Ok(match self.kind {
                Kind::Spm { .. } => text.replace('\u{2581}', " ").into_bytes(),
                Kind::Bpe { .. } => decode_byte_chars(text),
            });
        }
        if attr & ATTR_BYTE != 0 {
            return Ok(parse_byte_token(text).map(|b| vec![b]).unwrap_or_default());
        }
        Ok(Vec::new())
    }

    /// Ids to text, like llama-server's `/detokenize`: control tokens are rendered as their text and
    /// bytes that do not form valid UTF-8 become U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            bytes.extend(self.token_to_piece(id)?);
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// An incremental decoder over this tokenizer.
    pub fn stream_decoder(&self) -> StreamDecoder<'_> {
        StreamDecoder {
            tok: self,
            pending: Vec::new(),
        }
    }
}

/// gpt-oss (harmony) ends a message with `<|end|>` and the answer with `<|return|>` or
/// `<|call|>`: `<|end|>` separates the analysis message from the final one, so it must not end
/// generation. llama.cpp (llama-vocab.cpp) recognises the vocabulary by its EOG tokens: when
/// `<|return|>`, `<|call|>` and `<|end|>` are all EOG (or `<|calls|>`/`<|call|>`, `<|flush|>`
/// and `<|end|>`), `<|end|>` leaves the EOG set and becomes a user-defined token.
fn harmony_end_is_not_eog(vocab: &mut Vocab, eog: &mut Vec<u32>) {
    let text = |id: u32| vocab.texts.get(id as usize).map(String::as_str);
    let has = |names: &[&str]| eog.iter().any(|&id| text(id).is_some_and(|t| names.contains(&t)));
    let end = eog.iter().copied().find(|&id| text(id) == Some("<|end|>"));
    let call = has(&["<|call|>", "<|calls|>"]);
    let Some(end) = end else { return };
    if call && (has(&["<|return|>"]) || has(&["<|flush|>"])) {
        eog.retain(|&id| id != end);
        vocab.attrs[end as usize] = ATTR_USER_DEFINED;
    }
}

enum Fragment<'t> {
    Text(&'t str),
    Token(u32),
}

fn value_as_u64(v: &Value) -> Option<u64> {
    v.as_integer().and_then(|i| u64::try_from(i).ok())
}

/// `<0xXX>` -> the byte.
fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// GPT-2 byte characters back to bytes; a character outside the alphabet is kept visible the way
/// llama.cpp's `llama_decode_text` does (`[UNK_BYTE_0x..<token text>]`).
fn decode_byte_chars(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for ch in text.chars() {
        match unicode::char_to_byte(ch) {
            Some(b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut buf = [0u8; 4];
                for b in ch.encode_utf8(&mut buf).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text.as_bytes());
                out.push(b']');
            }
        }
    }
    out
}

/// Turns a stream of ids into text, holding back bytes until they complete a UTF-8 character.
pub struct StreamDecoder<'a> {
    tok: &'a Tokenizer,
    pending: Vec<u8>,
}

impl<'a> StreamDecoder<'a> {
    pub fn new(tok: &'a Tokenizer) -> Self {
        Self {
            tok,
            pending: Vec::new(),
        }
    }

    /// Adds one token; returns the text that is now complete (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String, TokenizerError> {
        let piece = self.tok.token_to_piece(id)?;
        self.pending.extend_from_slice(&piece);
        let mut text = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    text.push_str(s);
                    self.pending.clear();
                    return Ok(text);
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // Safe: the prefix was just validated.
                    text.push_str(std::str::from_utf8(&self.pending[..valid]).unwrap_or_default());
                    match e.error_len() {
                        // Invalid bytes can never complete: emit U+FFFD like the lossy decoder.
                        Some(bad) => {
                            text.push('\u{FFFD}');
                            self.pending.drain(..valid + bad);
                        }
                        // An incomplete character at the end: keep it for the next token.
                        None => {
                            self.pending.drain(..valid);
                            return Ok(text);
                        }
                    }
                }
            }
        }
    }

    /// Flushes what is left, replacing an incomplete character with U+FFFD.
    pub fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }
}

/// The special ids and BOS/EOS flags: a family's defaults, then the file's keys.
struct SpecialIds {
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    eom: Option<u32>,
    unk: Option<u32>,
    add_bos: bool,
    add_eos: bool,
}

impl SpecialIds {
    /// `defaults` (those past the vocabulary's `n_vocab` tokens dropped), overridden by the
    /// file's keys; an id the file sets past the vocabulary is an error.
    fn read(file: &GgufFile, defaults: SpecialIds, n_vocab: usize) -> Result<Self, TokenizerError> {
        let in_range = |id: Option<u32>| id.filter(|&i| (i as usize) < n_vocab);
        let mut s = SpecialIds {
            bos: in_range(defaults.bos),
            eos: in_range(defaults.eos),
            unk: in_range(defaults.unk),
            ..defaults
        };
        for (key, slot) in [
            ("tokenizer.ggml.bos_token_id", &mut s.bos),
            ("tokenizer.ggml.eos_token_id", &mut s.eos),
            ("tokenizer.ggml.eot_token_id", &mut s.eot),
            ("tokenizer.ggml.eom_token_id", &mut s.eom),
            ("tokenizer.ggml.unknown_token_id", &mut s.unk),
        ] {
            if let Some(v) = file.get(key) {
                let id = value_as_u64(v)
                    .ok_or_else(|| TokenizerError::Other(format!("{key} is not an unsigned integer")))?;
                if id >= n_vocab as u64 {
                    return Err(TokenizerError::SpecialOutOfRange {
                        key,
                        id,
                        vocab_size: n_vocab,
                    });
                }
                *slot = Some(id as u32);
            }
        }
        for (key, slot) in [
            ("tokenizer.ggml.add_bos_token", &mut s.add_bos),
            ("tokenizer.ggml.add_eos_token", &mut s.add_eos),
        ] {
            if let Some(v) = file
                .opt(key, GgufFile::get_bool)
                .map_err(|error| TokenizerError::Gguf { key, error })?
            {
                *slot = v;
            }
        }
        Ok(s)
    }
}

/// The vocabulary of `file`: token texts (an empty one named `[EMPTY_i]`), scores, attributes
/// from the token types, the text-to-id table and the byte tokens.
fn read_vocab(file: &GgufFile) -> Result<Vocab, TokenizerError> {
    const K_TOKENS: &str = "tokenizer.ggml.tokens";
    const K_SCORES: &str = "tokenizer.ggml.scores";
    const K_TYPES: &str = "tokenizer.ggml.token_type";

    let texts_raw = file.get_str_array(K_TOKENS).map_err(gguf_err(K_TOKENS))?;
    let n = texts_raw.len();
    if u32::try_from(n).is_err() {
        return Err(TokenizerError::Other(format!(
            "{K_TOKENS} has {n} entries, more than a u32 id can name"
        )));
    }

    // Any numeric element type: llama.cpp accepts f32 and i32 scores.
    let scores = match numeric_array(file, K_SCORES, GgufFile::get_f32_array)? {
        Some(s) if s.len() < n => {
            return Err(TokenizerError::LengthMismatch {
                key: K_SCORES,
                got: s.len(),
                expected: n,
            })
        }
        Some(mut s) => {
            s.truncate(n);
            s
        }
        None => vec![0.0; n],
    };
    let types = numeric_array(file, K_TYPES, GgufFile::get_i64_array)?;
    if let Some(t) = &types {
        if t.len() < n {
            return Err(TokenizerError::LengthMismatch {
                key: K_TYPES,
                got: t.len(),
                expected: n,
            });
        }
    }

    let mut texts = Vec::with_capacity(n);
    let mut attrs = Vec::with_capacity(n);
    let mut ids = FxHashMap::default();
    ids.reserve(n);
    for (i, raw) in texts_raw.iter().enumerate() {
        let text = if raw.is_empty() {
            format!("[EMPTY_{i}]")
        } else {
            raw.to_string()
        };
        let attr = match types.as_ref().map(|t| t[i]) {
            None | Some(1) => ATTR_NORMAL,
            Some(0) => 0,
            Some(2) => ATTR_UNKNOWN,
            Some(3) => ATTR_CONTROL,
            Some(4) => ATTR_USER_DEFINED,
            Some(5) => ATTR_UNUSED,
            Some(6) => ATTR_BYTE,
            Some(value) => {
                return Err(TokenizerError::BadTokenType {
                    key: K_TYPES,
                    index: i,
                    value,
                })
            }
        };
        ids.insert(text.clone(), i as u32);
        texts.push(text);
        attrs.push(attr);
    }

    let mut byte_tokens = [None; 256];
    for (id, (text, &attr)) in texts.iter().zip(&attrs).enumerate() {
        if attr & ATTR_BYTE != 0 {
            let b = parse_byte_token(text).ok_or_else(|| TokenizerError::BadByteToken {
                id: id as u32,
                text: text.clone(),
            })?;
            byte_tokens[b as usize].get_or_insert(id as u32);
        }
    }

    Ok(Vocab {
        texts,
        scores,
        attrs,
        ids,
        byte_tokens,
        unk: None,
    })
}

/// The end-of-generation tokens, as llama.cpp's loader finds them: the tokens it recognises
/// by name become control tokens (EOT and EOM where the file names none, the FIM tokens, the
/// end-of-generation names), besides EOS, EOT and EOM themselves; control tokens named
/// "unused" are unused, and harmony's channel tokens are user-defined.
fn end_of_generation(vocab: &mut Vocab, ids: &mut SpecialIds) -> Vec<u32> {
    // Tokens that llama.cpp recognises by name become control tokens and end-of-generation markers.
    let mut eog = Vec::new();
    fn mark_control(vocab: &mut Vocab, name: &str) -> Option<u32> {
        let id = vocab.id(name)?;
        vocab.attrs[id as usize] |= ATTR_CONTROL;
        Some(id)
    }
    if ids.eot.is_none() {
        ids.eot = EOT_NAMES.iter().find_map(|n| vocab.id(n));
    }
    if let Some(id) = ids.eot {
        vocab.attrs[id as usize] |= ATTR_CONTROL;
    }
    if ids.eom.is_none() {
        ids.eom = vocab.id("<|eom_id|>");
    }
    if let Some(id) = ids.eom {
        vocab.attrs[id as usize] |= ATTR_CONTROL;
    }
    for name in FIM_NAMES {
        mark_control(vocab, name);
    }
    for name in FIM_EOG_NAMES {
        if let Some(id) = vocab.id(name) {
            eog.push(id);
        }
    }
    for name in EOG_NAMES {
        if let Some(id) = mark_control(vocab, name) {
            eog.push(id);
        }
    }
    for (id, text) in vocab.texts.iter().enumerate() {
        if vocab.attrs[id] & ATTR_CONTROL != 0 && text.contains("unused") {
            vocab.attrs[id] |= ATTR_UNUSED;
        }
    }
    for name in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
        if let Some(id) = vocab.id(name) {
            vocab.attrs[id as usize] = ATTR_USER_DEFINED;
        }
    }
    eog.extend([ids.eos, ids.eot, ids.eom].into_iter().flatten());
    eog.sort_unstable();
    eog.dedup();
    harmony_end_is_not_eog(vocab, &mut eog);
    eog
}

/// The special tokens (control, user-defined, unknown), longest first, and a matcher that
/// finds them in text (`None` where there are none).
#[allow(clippy::type_complexity)]
fn special_matcher(vocab: &Vocab) -> Result<(Vec<u32>, Option<aho_corasick::AhoCorasick>), TokenizerError> {
    let mut specials: Vec<u32> = (0..vocab.texts.len() as u32)
        .filter(|&id| vocab.attr(id) & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN) != 0)
        .collect();
    specials.sort_by_key(|&id| std::cmp::Reverse(vocab.texts[id as usize].len()));
    let special_finder = if specials.is_empty() {
        None
    } else {
        let patterns = specials.iter().map(|&id| vocab.texts[id as usize].as_str());
        Some(aho_corasick::AhoCorasick::new(patterns).map_err(|e| TokenizerError::Matcher(e.to_string()))?)
    };

    Ok((specials, special_finder))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal GGUF v3 file with only metadata.
    fn gguf(kvs: &[(&str, Kv)]) -> GgufFile {
        fn s(out: &mut Vec<u8>, v: &str) {
            out.extend((v.len() as u64).to_le_bytes());
            out.extend(v.as_bytes());
        }
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend(0u64.to_le_bytes());
        out.extend((kvs.len() as u64).to_le_bytes());
        for (key, v) in kvs {
            s(&mut out, key);
            match v {
                Kv::Str(x) => {
                    out.extend(8u32.to_le_bytes());
                    s(&mut out, x);
                }
                Kv::U32(x) => {
                    out.extend(4u32.to_le_bytes());
                    out.extend(x.to_le_bytes());
                }
                Kv::Strs(xs) => {
                    out.extend(9u32.to_le_bytes());
                    out.extend(8u32.to_le_bytes());
                    out.extend((xs.len() as u64).to_le_bytes());
                    for x in xs {
                        s(&mut out, x);
                    }
                }
                Kv::I32s(xs) => {
                    out.extend(9u32.to_le_bytes());
                    out.extend(5u32.to_le_bytes());
                    out.extend((xs.len() as u64).to_le_bytes());
                    for x in xs {
                        out.extend(x.to_le_bytes());
                    }
                }
            }
        }
        GgufFile::from_bytes(out).expect("valid test GGUF")
    }

    enum Kv {
        Str(&'static str),
        U32(u32),
        Strs(Vec<&'static str>),
        I32s(Vec<i32>),
    }

    /// A byte-level BPE over "a", "b", "ab" plus the remaining byte characters.
    fn bpe_file(merges: Vec<&'static str>, types: Vec<i32>, extra: Vec<(&'static str, Kv)>) -> GgufFile {
        let mut kvs = vec![
            ("tokenizer.ggml.model", Kv::Str("gpt2")),
            ("tokenizer.ggml.pre", Kv::Str("qwen2")),
            ("tokenizer.ggml.tokens", Kv::Strs(vec!["a", "b", "ab", "Ġ", "<|end|>"])),
            ("tokenizer.ggml.token_type", Kv::I32s(types)),
            ("tokenizer.ggml.merges", Kv::Strs(merges)),
        ];
        kvs.extend(extra);
        gguf(&kvs)
    }

    #[test]
    fn tiny_bpe_merges_and_round_trips() {
        let tok = Tokenizer::from_gguf(&bpe_file(vec!["a b"], vec![1, 1, 1, 1, 3], vec![])).expect("loads");
        assert_eq!(tok.encode("ab ab", false, false), [2, 3, 2]);
        assert_eq!(tok.encode("ab<|end|>", false, true), [2, 4]);
        assert_eq!(tok.encode("ab<|end|>", false, false), [2]); // '<', '|' ... have no byte tokens: dropped
        assert_eq!(tok.decode(&[2, 3, 2, 4]).expect("in range"), "ab ab<|end|>");
        assert!(tok.is_eog(4));
    }

    /// llama.cpp's gpt-oss rule: with `<|return|>` and `<|call|>` in the vocabulary `<|end|>`
    /// separates messages instead of ending the answer (a vocabulary with `<|end|>` alone, like
    /// Phi's, keeps it as EOG: `tiny_bpe_merges_and_round_trips`). The harmony markers decode
    /// as their text, so the output router sees them.
    #[test]
    fn harmony_end_is_not_end_of_generation() {
        let tokens = vec![
            "a",
            "<|end|>",
            "<|return|>",
            "<|call|>",
            "<|start|>",
            "<|channel|>",
            "<|message|>",
        ];
        let tok = Tokenizer::from_gguf(&gguf(&[
            ("tokenizer.ggml.model", Kv::Str("gpt2")),
            ("tokenizer.ggml.pre", Kv::Str("qwen2")),
            ("tokenizer.ggml.tokens", Kv::Strs(tokens)),
            ("tokenizer.ggml.token_type", Kv::I32s(vec![1, 3, 3, 3, 3, 3, 3])),
            ("tokenizer.ggml.merges", Kv::Strs(vec![])),
        ]))
        .expect("loads");
        assert!(!tok.is_eog(1), "<|end|> must not end a harmony answer");
        assert!(tok.is_eog(2) && tok.is_eog(3));
        assert!(!tok.is_control(1));
        assert_eq!(
            tok.decode(&[5, 0, 6, 0, 1, 4]).expect("in range"),
            "<|channel|>a<|message|>a<|end|><|start|>"
        );
        assert_eq!(tok.encode("a<|end|><|start|>", false, true), [0, 1, 4]);
    }

    #[test]
    fn bad_token_type_names_key_and_index() {
        let err = Tokenizer::from_gguf(&bpe_file(vec![], vec![1, 1, 9, 1, 3], vec![])).expect_err("type 9");
        assert!(
            matches!(err, TokenizerError::BadTokenType { index: 2, value: 9, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("tokenizer.ggml.token_type"), "{err}");
        let err = Tokenizer::from_gguf(&bpe_file(vec![], vec![1, 1], vec![])).expect_err("short types");
        assert!(
            matches!(
                err,
                TokenizerError::LengthMismatch {
                    got: 2,
                    expected: 5,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn merge_naming_unknown_token_is_rejected() {
        let err = Tokenizer::from_gguf(&bpe_file(vec!["a b", "a z"], vec![1; 5], vec![])).expect_err("z unknown");
        assert!(matches!(err, TokenizerError::BadMerge { index: 1, .. }), "{err}");
        assert!(err.to_string().contains("tokenizer.ggml.merges[1]"), "{err}");
        let err = Tokenizer::from_gguf(&bpe_file(vec!["ab"], vec![1; 5], vec![])).expect_err("no separator");
        assert!(matches!(err, TokenizerError::BadMerge { index: 0, .. }), "{err}");
    }

    #[test]
    fn special_id_out_of_range_is_rejected() {
        let extra = vec![("tokenizer.ggml.eos_token_id", Kv::U32(5))];
        let err = Tokenizer::from_gguf(&bpe_file(vec![], vec![1; 5], extra)).expect_err("eos 5 of 5");
        assert!(
            matches!(
                err,
                TokenizerError::SpecialOutOfRange {
                    key: "tokenizer.ggml.eos_token_id",
                    id: 5,
                    vocab_size: 5
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn byte_token_parsing() {
        assert_eq!(parse_byte_token("<0xE2>"), Some(0xE2));
        assert_eq!(parse_byte_token("<0x0a>"), Some(0x0A));
        assert_eq!(parse_byte_token("<0xE>"), None);
        assert_eq!(parse_byte_token("0xE2"), None);
    }

    #[test]
    fn gpt2_byte_alphabet_round_trips() {
        let table = unicode::byte_to_char_table();
        for b in 0..=255u8 {
            assert_eq!(unicode::char_to_byte(table[b as usize]), Some(b));
        }
        assert_eq!(table[b' ' as usize], 'Ġ');
        assert_eq!(table[b'\n' as usize], 'Ċ');
    }
}
