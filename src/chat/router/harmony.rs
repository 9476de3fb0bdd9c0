//! The router for gpt-oss's harmony format. The prompt ends with `<|start|>assistant`; the
//! answer is a sequence of messages, each a header and a body:
//!
//! ```text
//! <|channel|>analysis<|message|>REASONING<|end|>
//! <|start|>assistant<|channel|>final<|message|>CONTENT<|return|>
//! <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{ARGS}<|call|>
//! ```
//!
//! `analysis` is reasoning, `final` content, a message with a `to=functions.NAME` recipient a
//! call (the recipient may also stand before `<|channel|>`, as in ` to=functions.NAME
//! <|channel|>commentary json<|message|>`), and `commentary` without a recipient a preamble
//! shown as content. These are llama.cpp's rules (`common/parsers/gpt-oss.cpp`). `<|return|>`
//! and `<|call|>` end generation and never reach the router; the end of the answer closes the
//! last message. A recipient other than `functions.*`, a call with tools off, or a body that is
//! not a JSON object is given back as content with its markup (llama.cpp drops unsolicited
//! recipients; we never drop text). Like the other marker formats, a call to an undeclared
//! `functions.NAME` is still a call.

use super::parse::named_call;
use super::{emit, find_first, held_tail, Routed, RouterConfig};

const START: &str = "<|start|>";
const CHANNEL: &str = super::HARMONY_CHANNEL;
const MESSAGE: &str = "<|message|>";
const END: &str = "<|end|>";
const CALL: &str = "<|call|>";
const RETURN: &str = "<|return|>";
const FUNCTIONS: &str = "functions.";
/// Every marker that ends a message body. `<|start|>` without `<|end|>` before it starts the
/// next message all the same.
const BODY_ENDS: [&str; 4] = [END, CALL, RETURN, START];
/// A header longer than this without `<|message|>` is not harmony: it is given back as content
/// instead of being held to the end.
const MAX_HEADER: usize = 512;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Mode {
    /// Reading a message header up to `<|message|>`.
    Header,
    /// A message body routed as it streams.
    Text { reasoning: bool },
    /// A call's arguments, held to the end of the message. `header` is given back with the
    /// body if they do not parse.
    Call { name: String, header: String },
    /// A message for a recipient we do not answer as a call: content, markup included.
    Raw { header: String },
    /// The answer is not in harmony format: all of it is content.
    Plain,
}

#[derive(Debug, Clone)]
pub(super) struct HarmonyRouter {
    tools_on: bool,
    mode: Mode,
    buf: String,
}

/// What a header says about its message.
struct Header {
    channel: String,
    recipient: Option<String>,
}

/// `[<|start|>ROLE][ to=R]<|channel|>CHANNEL[ to=R][ [<|constrain|>]TYPE]`; `None` without a
/// channel. A header may repeat `<|channel|>` (gpt-oss sometimes writes a stray
/// `<|channel|>commentary to=assistant` before the real one): the last channel counts, and the
/// recipient `assistant` is no recipient.
fn parse_header(header: &str) -> Option<Header> {
    let word = |s: &str| -> String { s.chars().take_while(|c| !c.is_whitespace() && *c != '<').collect() };
    let at = header.rfind(CHANNEL)?;
    let channel = word(&header[at + CHANNEL.len()..]);
    if channel.is_empty() {
        return None;
    }
    let recipient = header
        .match_indices("to=")
        .filter(|&(i, _)| i == 0 || header[..i].ends_with(|c: char| c.is_whitespace() || c == '>'))
        .map(|(i, m)| word(&header[i + m.len()..]))
        .filter(|r| !r.is_empty() && r != "assistant")
        .last();
    Some(Header { channel, recipient })
}

impl HarmonyRouter {
    pub(super) fn new(cfg: RouterConfig) -> Self {
        HarmonyRouter {
            tools_on: !cfg.tools.is_empty(),
            mode: Mode::Header,
            buf: String::new(),
        }
    }

    pub(super) fn push(&mut self, text: &str) -> Vec<Routed> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        while self.step(&mut out) {}
        out
    }

    fn step(&mut self, out: &mut Vec<Routed>) -> bool {
        match self.mode.clone() {
            Mode::Plain => {
                emit(out, Routed::Content(std::mem::take(&mut self.buf)));
                false
            }
            Mode::Header => self.step_header(out),
            Mode::Text { reasoning } => {
                let wrap = |s: &str| {
                    if reasoning {
                        Routed::Reasoning(s.to_string())
                    } else {
                        Routed::Content(s.to_string())
                    }
                };
                match find_first(&self.buf, &BODY_ENDS) {
                    Some((i, m)) => {
                        emit(out, wrap(&self.buf[..i]));
                        self.buf.drain(..i + if m == START { 0 } else { m.len() });
                        self.mode = Mode::Header;
                        true
                    }
                    None => {
                        let keep = held_tail(&self.buf, &BODY_ENDS);
                        emit(out, wrap(&self.buf[..keep]));
                        self.buf.drain(..keep);
                        false
                    }
                }
            }
            Mode::Call { .. } | Mode::Raw { .. } => {
                let Some((i, m)) = find_first(&self.buf, &BODY_ENDS) else {
                    return false;
                };
                let body = self.buf[..i].to_string();
                let end = if m == START { "" } else { m };
                self.buf.drain(..i + end.len());
                self.close_held(out, &body, end);
                self.mode = Mode::Header;
                true
            }
        }
    }

    /// A held message (a call or a raw one) ends with `end`: a call when it parses, else all
    /// of it back as content.
    fn close_held(&mut self, out: &mut Vec<Routed>, body: &str, end: &str) {
        let (header, call) = match &self.mode {
            Mode::Call { name, header } => (header.as_str(), named_call(name, body)),
            Mode::Raw { header } => (header.as_str(), None),
            _ => return,
        };
        match call {
            Some(call) => out.push(Routed::ToolCall(call)),
            None => emit(out, Routed::Content(format!("{header}{MESSAGE}{body}{end}"))),
        }
    }

    fn step_header(&mut self, out: &mut Vec<Routed>) -> bool {
        let t = self.buf.trim_start();
        if t.is_empty() {
            return false;
        }
        // Harmony headers open with `<|start|>`, `<|channel|>` or a ` to=` recipient; decided
        // before looking for `<|message|>`, so the answer does not depend on how it was cut.
        let opens = [START, CHANNEL, "to="];
        if !opens.iter().any(|o| t.starts_with(o) || o.starts_with(t)) {
            self.mode = Mode::Plain;
            return true;
        }
        // A `<|message|>` ending past MAX_HEADER is too late, found now or streamed in later:
        // the same text gives the same answer however it was cut.
        let found = self.buf.find(MESSAGE).filter(|&i| i + MESSAGE.len() <= MAX_HEADER);
        let Some(i) = found else {
            if self.buf.len() > MAX_HEADER {
                self.mode = Mode::Plain;
                return true;
            }
            return false;
        };
        let header = self.buf[..i].to_string();
        self.buf.drain(..i + MESSAGE.len());
        self.mode = match parse_header(&header) {
            None => {
                emit(out, Routed::Content(format!("{header}{MESSAGE}")));
                Mode::Text { reasoning: false }
            }
            Some(h) => match h.recipient {
                Some(r) if self.tools_on && r.starts_with(FUNCTIONS) => Mode::Call {
                    name: r[FUNCTIONS.len()..].to_string(),
                    header,
                },
                Some(_) => Mode::Raw { header },
                None => Mode::Text {
                    reasoning: h.channel == "analysis",
                },
            },
        };
        true
    }

    pub(super) fn finish(&mut self) -> Vec<Routed> {
        let mut out = Vec::new();
        while self.step(&mut out) {}
        let rest = std::mem::take(&mut self.buf);
        match self.mode.clone() {
            // A header that never reached `<|message|>`.
            Mode::Header | Mode::Plain => emit(&mut out, Routed::Content(rest)),
            Mode::Text { reasoning: true } => emit(&mut out, Routed::Reasoning(rest)),
            Mode::Text { reasoning: false } => emit(&mut out, Routed::Content(rest)),
            Mode::Call { .. } | Mode::Raw { .. } => self.close_held(&mut out, &rest, ""),
        }
        self.mode = Mode::Header;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::ToolFormat;

    fn harmony(tools: &[&str]) -> super::RouterConfig {
        cfg(ToolFormat::Harmony, tools, false)
    }

    #[test]
    fn analysis_then_final() {
        check(
            &harmony(&[]),
            "<|channel|>analysis<|message|>User says hi. Reply.<|end|><|start|>assistant<|channel|>final<|message|>Hello! 👋 How can I help?",
            &[reasoning("User says hi. Reply."), content("Hello! 👋 How can I help?")],
        );
        // The same answer closed by `<|return|>` (when it is not taken as end of generation).
        check(
            &harmony(&["f"]),
            "<|channel|>analysis<|message|>a<b<|end|><|start|>assistant<|channel|>final<|message|>x <| y<|return|>",
            &[reasoning("a<b"), content("x <| y")],
        );
    }

    #[test]
    fn call_with_the_recipient_in_the_channel_header() {
        check(
            &harmony(&["get_weather"]),
            "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>",
            &[reasoning("Need weather."), call("get_weather", r#"{"city":"Paris"}"#)],
        );
    }

    #[test]
    fn call_with_the_recipient_before_the_channel() {
        // The first message right after the prompt's `<|start|>assistant`, and a second call
        // in the role header; an undeclared `functions.` name is a call, as in the other
        // marker formats.
        check(
            &harmony(&["a"]),
            " to=functions.a<|channel|>commentary json<|message|>{}<|call|><|start|>assistant to=functions.b<|channel|>commentary<|message|>{\"x\": [1, 2]}",
            &[call("a", "{}"), call("b", r#"{"x":[1,2]}"#)],
        );
    }

    #[test]
    fn commentary_without_recipient_is_a_preamble() {
        check(
            &harmony(&["f"]),
            "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>commentary to=functions.f<|message|>{}",
            &[content("Checking."), call("f", "{}")],
        );
    }

    #[test]
    fn stray_commentary_before_analysis() {
        check(
            &harmony(&[]),
            "<|channel|>commentary to=assistant<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>final<|message|>ok",
            &[reasoning("think"), content("ok")],
        );
    }

    #[test]
    fn broken_calls_are_given_back() {
        let c = harmony(&["f"]);
        for text in [
            "<|channel|>commentary to=functions.f<|message|>{oops}<|call|>",
            "<|channel|>commentary to=functions.f<|message|>[1]",
            // A built-in tool's recipient is not a function call.
            "<|channel|>commentary to=browser.search<|message|>{\"q\": 1}<|call|>",
        ] {
            check(&c, text, &[content(text)]);
        }
        // Without tools a recipient is just text.
        let text = "<|channel|>commentary to=functions.f<|message|>{}<|call|>";
        check(&harmony(&[]), text, &[content(text)]);
        // Analysis before a broken call stays reasoning.
        check(
            &c,
            "<|channel|>analysis<|message|>r<|end|><|start|>assistant<|channel|>commentary to=functions.f<|message|>nope",
            &[
                reasoning("r"),
                content("<|start|>assistant<|channel|>commentary to=functions.f<|message|>nope"),
            ],
        );
    }

    #[test]
    fn text_that_is_not_harmony_is_content() {
        for text in [
            "Hello there",
            "  to be or not",
            "<|channel|",
            "<|channel|>final",
            "Sure!<|channel|>final<|message|>x",
        ] {
            check(&harmony(&["f"]), text, &[content(text)]);
        }
        // A header without a channel: its markup is content, like the text after it.
        let text = "<|start|>assistant<|message|>hi";
        check(&harmony(&[]), text, &[content(text)]);
    }

    #[test]
    fn unterminated_analysis_is_reasoning() {
        check(
            &harmony(&[]),
            "<|channel|>analysis<|message|>still thinking <|en",
            &[reasoning("still thinking <|en")],
        );
    }
}
