//! Constrained decoding: an answer held to a JSON schema, to JSON, to a Lark grammar, or to a
//! call of the declared tools, by masking each step's logits to the tokens the grammar allows.
//!
//! The grammar engine is llguidance (what llama.cpp and vLLM use): an Earley parser over
//! lexemes whose token masks come from a walk of the vocabulary's byte trie, incremental per
//! token, with its own caches; on the qwen2.5 vocabulary (151k tokens) a JSON-schema mask takes
//! well under a millisecond. Every grammar is stated as Lark text (llguidance's dialect, with
//! `%json {schema}` for JSON schemas), so one [`Grammars::compile`] serves `response_format`,
//! the `grammar` field and forced tool calls, in the server, the CLI and the browser alike.
//!
//! Vocabulary: normal and user-defined tokens are their bytes (Qwen's `</tool_call>` is one
//! token a grammar's `"</tool_call>"` matches); control tokens are their text behind a 0xFF
//! byte, llguidance's convention, so text never matches them and a grammar names them as
//! `<|name|>` or `<[id]>`. The end-of-generation tokens end a grammar: they are allowed once
//! it accepts, and are all that is allowed once it can take nothing else.

mod lazy;
mod tools;

pub use lazy::{LazyCalls, Watch};
pub use tools::{json_arguments, tool_call_grammar};

use std::sync::{Arc, OnceLock};

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;

use crate::tokenizer::Tokenizer;

/// A grammar that cannot be used, or a constrained answer that cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum GrammarError {
    /// The request's schema or grammar does not compile.
    #[error("{param}: {problem}")]
    Invalid { param: &'static str, problem: String },
    /// The vocabulary could not be made into the grammar engine's trie.
    #[error("the model's vocabulary cannot drive constrained decoding: {0}")]
    Vocabulary(String),
    /// The grammar engine failed mid-answer (a token outside the mask, an internal limit).
    #[error("constrained decoding failed after {tokens} tokens: {problem}")]
    Matcher { tokens: usize, problem: String },
}

/// What the answer must be: OpenAI's `response_format`, or a grammar.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum AnswerFormat {
    /// Free text.
    #[default]
    Free,
    /// Any JSON object (`{"type": "json_object"}`).
    JsonObject,
    /// JSON valid under `schema` (`{"type": "json_schema", "json_schema": {"schema"}}`).
    /// `strict: false` lets unsupported schema keywords pass unenforced instead of failing.
    JsonSchema { schema: Value, strict: bool },
    /// A Lark grammar in llguidance's dialect (the `grammar` request field).
    Lark(String),
}

impl AnswerFormat {
    /// The request field that asked for it, for errors.
    pub fn param(&self) -> &'static str {
        match self {
            AnswerFormat::Lark(_) => "grammar",
            _ => "response_format",
        }
    }

    /// The grammar as Lark text; `None` for free text.
    pub fn lark(&self) -> Option<String> {
        match self {
            AnswerFormat::Free => None,
            AnswerFormat::JsonObject => Some(json_rule("start", &serde_json::json!({"type": "object"}))),
            AnswerFormat::JsonSchema { schema, strict } => {
                let mut schema = schema.clone();
                if let (false, Some(obj)) = (*strict, schema.as_object_mut()) {
                    // llguidance's own switch: unknown keywords are ignored rather than refused.
                    let opts = obj.entry("x-guidance").or_insert_with(|| serde_json::json!({}));
                    if let Some(o) = opts.as_object_mut() {
                        o.entry("lenient").or_insert(Value::Bool(true));
                    }
                }
                Some(json_rule("start", &schema))
            }
            AnswerFormat::Lark(g) => Some(g.clone()),
        }
    }
}

/// A Lark rule `name: %json {schema}`, its JSON laid out as Python's `json.dumps` writes it
/// (`", "` and `": "`, no other whitespace) unless the schema's own `x-guidance` says
/// otherwise. Free whitespace lets a small model pad an answer with newlines and indentation
/// until its budget runs out; one layout also makes answers alike from run to run.
pub(crate) fn json_rule(name: &str, schema: &Value) -> String {
    let mut schema = schema.clone();
    if let Some(obj) = schema.as_object_mut() {
        let opts = obj.entry("x-guidance").or_insert_with(|| serde_json::json!({}));
        if let Some(o) = opts.as_object_mut() {
            for (k, v) in [
                ("whitespace_flexible", Value::Bool(false)),
                ("item_separator", Value::from(", ")),
                ("key_separator", Value::from(": ")),
            ] {
                o.entry(k).or_insert(v);
            }
        }
    }
    format!("{name}: %json {schema}\n")
}

/// The tokenizer as llguidance sees it: the byte trie of the vocabulary, and text to tokens
/// for the tokens it forces.
struct VocabEnv {
    trie: TokTrie,
    tok: Arc<Tokenizer>,
}

impl TokenizerEnv for VocabEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.tok.encode(&String::from_utf8_lossy(s), false, false)
    }

    /// Not canonical as far as the grammar goes: where the grammar forces text, llguidance
    /// would otherwise allow only this tokenizer's spelling of it (byte-level pieces for
    /// Qwen's `</tool_call>`, which the model writes as one user-defined token). Masks from
    /// the trie let every spelling of the forced text through and the model pick its own.
    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

/// The grammar compiler of one model's vocabulary; the vocabulary's trie is built on first
/// use (tens of milliseconds) and shared by every constrained answer after it.
pub struct Grammars {
    tok: Arc<Tokenizer>,
    factory: OnceLock<Result<Arc<ParserFactory>, String>>,
}

impl Grammars {
    pub fn new(tok: Arc<Tokenizer>) -> Self {
        Grammars {
            tok,
            factory: OnceLock::new(),
        }
    }

    /// The vocabulary's tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tok
    }

    fn factory(&self) -> Result<&Arc<ParserFactory>, GrammarError> {
        self.factory
            .get_or_init(|| build_factory(&self.tok))
            .as_ref()
            .map_err(|e| GrammarError::Vocabulary(e.clone()))
    }

    /// Compile `lark` (asked for by the request field `param`) into a fresh constraint.
    pub fn compile(&self, lark: &str, param: &'static str) -> Result<Constraint, GrammarError> {
        let factory = self.factory()?;
        let parser = factory
            .create_parser(TopLevelGrammar::from_lark(lark.to_string()))
            .map_err(|e| GrammarError::Invalid {
                param,
                problem: format!("{e:#}"),
            })?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(GrammarError::Invalid { param, problem: e });
        }
        Ok(Constraint {
            source: Arc::from(lark),
            matcher,
            tokens: 0,
        })
    }
}

/// The trie of `tok`'s vocabulary, its end-of-generation tokens ending every grammar.
fn build_factory(tok: &Arc<Tokenizer>) -> Result<Arc<ParserFactory>, String> {
    let n = tok.vocab_size();
    let words: Vec<Vec<u8>> = (0..n as u32)
        .map(|id| {
            let piece = tok.token_to_piece(id).unwrap_or_default();
            if tok.is_control(id) && !piece.is_empty() {
                let mut w = Vec::with_capacity(piece.len() + 1);
                w.push(TokTrie::SPECIAL_TOKEN_MARKER);
                w.extend(piece);
                w
            } else {
                piece
            }
        })
        .collect();
    let eog = tok.eog_tokens();
    let eos = tok
        .eos()
        .or_else(|| eog.first().copied())
        .ok_or("it has no end-of-generation token")?;
    let info = TokRxInfo {
        vocab_size: n as u32,
        tok_eos: eos,
        tok_bos: tok.bos(),
        tok_pad: None,
        tok_unk: None,
        tok_end_of_turn: None,
    };
    let mut ends: Vec<TokenId> = eog.to_vec();
    if !ends.contains(&eos) {
        ends.push(eos);
    }
    let trie = TokTrie::from(&info, &words).with_eos_tokens(&ends);
    let env: llguidance::toktrie::TokEnv = Arc::new(VocabEnv {
        trie,
        tok: Arc::clone(tok),
    });
    let mut factory = ParserFactory::new_simple(&env).map_err(|e| format!("{e:#}"))?;
    // Warnings go into errors, not onto the server's stderr.
    factory.quiet();
    Ok(Arc::new(factory))
}

/// One answer's grammar state: the mask for the next token, advanced by each token taken.
pub struct Constraint {
    /// The Lark text it was compiled from (what two constraints are compared by).
    source: Arc<str>,
    matcher: Matcher,
    /// Tokens taken so far.
    tokens: usize,
}

impl Constraint {
    /// The Lark text.
    pub fn source(&self) -> &str {
        &self.source
    }

    fn failed(&self, problem: impl std::fmt::Display) -> GrammarError {
        GrammarError::Matcher {
            tokens: self.tokens,
            problem: problem.to_string(),
        }
    }

    /// Set to -inf the logits of the tokens the grammar does not allow next (`logits`: one
    /// per model vocabulary entry; entries past the tokenizer's vocabulary are never allowed).
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), GrammarError> {
        let allowed = self.matcher.compute_mask_or_eos().map_err(|e| self.failed(e))?;
        if allowed.is_zero() {
            return Err(self.failed("the grammar allows no token here"));
        }
        // Word by word: most words of a mask are all allowed (inside a string) or all
        // forbidden (between lexemes), so whole runs of 32 are skipped or filled at once.
        let n = allowed.len().min(logits.len());
        let (head, tail) = logits.split_at_mut(n);
        for (chunk, &word) in head.chunks_mut(32).zip(allowed.as_slice()) {
            match word {
                u32::MAX => {}
                0 => chunk.fill(f32::NEG_INFINITY),
                w => {
                    for (bit, l) in chunk.iter_mut().enumerate() {
                        if w >> bit & 1 == 0 {
                            *l = f32::NEG_INFINITY;
                        }
                    }
                }
            }
        }
        tail.fill(f32::NEG_INFINITY);
        Ok(())
    }

    /// Whether the text taken so far is a whole sentence of the grammar.
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }

    /// Take `token`, which the last mask allowed. An end-of-generation token ends the answer
    /// and is not fed to the grammar.
    pub fn commit(&mut self, token: u32, end_of_generation: bool) -> Result<(), GrammarError> {
        self.tokens += 1;
        if end_of_generation {
            return Ok(());
        }
        self.matcher.consume_token(token).map_err(|e| self.failed(e))
    }
}

impl Clone for Constraint {
    fn clone(&self) -> Self {
        Constraint {
            source: Arc::clone(&self.source),
            matcher: self.matcher.deep_clone(),
            tokens: self.tokens,
        }
    }
}

impl PartialEq for Constraint {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source && self.tokens == other.tokens
    }
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("source", &self.source)
            .field("tokens", &self.tokens)
            .finish()
    }
}
