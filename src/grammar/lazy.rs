//! Tool calls under `tool_choice: "auto"`, held to their schemas once the model has begun one.
//!
//! `auto` leaves the model free to answer in text or to call a tool. Small models that choose
//! to call often botch the rest: Qwen2.5-Coder 0.5B, given OpenCode's ten tools, stops before
//! the call's last `}`, fills arguments its tool does not take, or names the tool by its
//! description (`"Read file notes.txt"` for `read`). So, as llama.cpp's "lazy" grammars do,
//! the answer is watched while free; once it has written the start of a call, up to the
//! name's opening quote,
//!
//! ```text
//! [```json | ``` | <tool_call>]  {  "name"  :  "
//! ```
//!
//! (at the start of the answer, whitespace allowed between the parts), the rest of the call is
//! held to a grammar: the name of a declared tool, `"arguments"` (or `"parameters"`) valid
//! under that tool's schema, the object's `}`, then the fence's closing or `</tool_call>`.
//! After that the answer is free again: a model that goes on in prose after a bare or fenced
//! object (showing a call, then answering) still gets its answer as content, as the router
//! decides for whole answers only. An answer that starts any other way (text, JSON of another
//! shape) is never constrained, so it stays what the model wrote.
//!
//! The trigger is narrower than llama.cpp's (its Hermes handler fires on any answer opening
//! with `{"`): only an object whose first key is `"name"` is taken for a call. The price, the
//! same as llama.cpp's: an answer that opens with `{"name": "` while tools are declared is a
//! call of one of them, even when the model meant other JSON.
//!
//! The trigger text is matched on the decoded answer, not on tokens: the token that writes the
//! quote may carry text past it, and that text is fed to the fresh grammar before the next
//! mask (when it is no declared name's beginning, the answer stays free).

use std::sync::Arc;

use serde_json::Value;

use super::tools::{json_string_body, literal, parameters};
use super::{Constraint, Grammars};
use crate::tokenizer::Tokenizer;

/// What opened the call, which decides how it must close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Opener {
    /// `{` at the start of the answer: the object.
    Bare,
    /// A code fence (```` ```json ```` or ```` ``` ````): the object, then the closing fence.
    Fence,
    /// Hermes' `<tool_call>`: the object, then `</tool_call>`.
    Tag,
}

/// The call openers each answer may start with, besides `{`.
const FENCES: [&str; 2] = ["```json", "```"];
const TAG_OPEN: &str = "<tool_call>";
const TAG_CLOSE: &str = "</tool_call>";

/// The declared tools, and the answer's text while it may still begin a call.
#[derive(Clone)]
pub struct LazyCalls {
    grammars: Arc<Grammars>,
    /// `(name as written inside a JSON string, parameter schema)` per declared tool.
    tools: Arc<[(String, Value)]>,
    /// Whether `<tool_call>` opens a call (the Hermes format).
    tagged: bool,
    /// The answer so far (only while it may still begin a call, so short).
    text: String,
}

/// What the answer's latest text did to a [`LazyCalls`].
pub enum Watch {
    /// It may still begin a call: keep watching.
    Pending,
    /// It cannot begin one any more: stop watching, the answer stays free.
    Free,
    /// It began a call: the rest of the call is held to this grammar, to be dropped once it
    /// accepts (the call is complete).
    Call(Box<Constraint>),
}

impl LazyCalls {
    /// Watch for calls of `tools` (OpenAI declarations, already checked to be functions with
    /// names); `tagged`: the model's own call tag is Hermes' `<tool_call>`.
    pub fn new(grammars: Arc<Grammars>, tools: &[Value], tagged: bool) -> Option<Self> {
        let tools: Vec<(String, Value)> = tools
            .iter()
            .filter_map(|t| {
                let name = t.pointer("/function/name")?.as_str()?;
                Some((json_string_body(name), parameters(t)))
            })
            .collect();
        (!tools.is_empty()).then(|| LazyCalls {
            grammars,
            tools: tools.into(),
            tagged,
            text: String::new(),
        })
    }

    /// Take the answer's next piece of text.
    pub fn push(&mut self, piece: &str) -> Watch {
        self.text.push_str(piece);
        match self.trigger() {
            Match::More => Watch::Pending,
            Match::No => Watch::Free,
            Match::Call { opener, rest } => {
                let rest = self.text[rest..].to_string();
                match self.compile(opener, &rest) {
                    Some(constraint) => Watch::Call(Box::new(constraint)),
                    // A schema llguidance cannot take, or text past the quote that already
                    // breaks the grammar: the answer stays free.
                    None => Watch::Free,
                }
            }
        }
    }

    /// Where the answer stands against the call openings.
    fn trigger(&self) -> Match {
        let mut c = Cursor::new(&self.text);
        c.skip_ws();
        let opener = if c.at_end() {
            return Match::More;
        } else if c.rest().starts_with('{') {
            Opener::Bare
        } else if let Some(m) = c.literal_of(&FENCES) {
            match m {
                Err(()) => return Match::More,
                Ok(_) => Opener::Fence,
            }
        } else if self.tagged {
            match c.literal_of(&[TAG_OPEN]) {
                Some(Err(())) => return Match::More,
                Some(Ok(_)) => Opener::Tag,
                None => return Match::No,
            }
        } else {
            return Match::No;
        };
        for part in ["{", "\"name\"", ":", "\""] {
            c.skip_ws();
            match c.literal_of(&[part]) {
                Some(Ok(_)) => {}
                Some(Err(())) => return Match::More,
                None if c.at_end() => return Match::More,
                None => return Match::No,
            }
        }
        Match::Call {
            opener,
            rest: self.text.len() - c.rest().len(),
        }
    }

    /// The grammar of what follows the name's opening quote, advanced over `rest` (text the
    /// model already wrote past it): a declared tool's name, then its arguments. Anything may
    /// follow the call's closing (`TAIL`): the grammar accepts there and is dropped, and the
    /// token that closes the call may carry the text after it (Qwen writes `}}\n` as one
    /// token; without the tail the mask would push the model off its own spelling, and it then
    /// ended answers it meant to go on with).
    fn compile(&self, opener: Opener, rest: &str) -> Option<Constraint> {
        let tok: &Tokenizer = self.grammars.tokenizer();
        let close = match opener {
            Opener::Bare => String::new(),
            Opener::Fence => " ws \"```\"".into(),
            Opener::Tag => format!(" ws {}", literal(tok, TAG_CLOSE)),
        };
        let mut lark = format!(
            "start: call{close} TAIL?\n\
             KEY: /\"(arguments|parameters)\"/\n\
             TAIL: /(?s:.+)/\n\
             ws: WS?\n\
             WS: /[ \\t\\r\\n]+/\n"
        );
        let mut alts = Vec::new();
        for (i, (name, schema)) in self.tools.iter().enumerate() {
            // The name as written in the JSON string, and its closing quote.
            let quoted = Value::String(format!("{name}\"")).to_string();
            lark.push_str(&format!(
                "call_{i}: {quoted} ws \",\" ws KEY ws \":\" ws args_{i} ws \"}}\"\n\
                 args_{i}: %json {schema}\n"
            ));
            alts.push(format!("call_{i}"));
        }
        lark.push_str(&format!("call: {}\n", alts.join(" | ")));
        let mut constraint = self.grammars.compile(&lark, "tools").ok()?;
        for t in tok.encode(rest, false, false) {
            constraint.commit(t, false).ok()?;
        }
        Some(constraint)
    }
}

impl PartialEq for LazyCalls {
    fn eq(&self, other: &Self) -> bool {
        self.tools == other.tools && self.tagged == other.tagged && self.text == other.text
    }
}

impl std::fmt::Debug for LazyCalls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.tools.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("LazyCalls")
            .field("tools", &names)
            .field("tagged", &self.tagged)
            .field("text", &self.text)
            .finish()
    }
}

/// The answer against the openings: needs more text, cannot match, or began a call whose
/// name's opening quote ends at byte `rest`.
enum Match {
    More,
    No,
    Call { opener: Opener, rest: usize },
}

/// A position in the answer's text.
struct Cursor<'a> {
    text: &'a str,
}

impl<'a> Cursor<'a> {
    fn new(text: &'a str) -> Self {
        Cursor { text }
    }

    fn rest(&self) -> &'a str {
        self.text
    }

    fn at_end(&self) -> bool {
        self.text.is_empty()
    }

    fn skip_ws(&mut self) {
        self.text = self.text.trim_start_matches([' ', '\t', '\r', '\n']);
    }

    /// The first of `options` the text starts with (consumed: `Ok(index)`), or `Err` when the
    /// text is a proper prefix of one (more may complete it), or `None`.
    fn literal_of(&mut self, options: &[&str]) -> Option<Result<usize, ()>> {
        // A longer option the text may still become comes first (```` ``` ```` vs ```` ```json ````).
        if options
            .iter()
            .any(|o| o.len() > self.text.len() && o.starts_with(self.text))
        {
            return Some(Err(()));
        }
        let i = options.iter().position(|o| self.text.starts_with(o))?;
        self.text = &self.text[options[i].len()..];
        Some(Ok(i))
    }
}
