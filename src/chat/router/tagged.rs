//! The router for families that think inside `<think>...</think>` and open each call with a
//! marker: Hermes, GLM and Qwen3-Coder (`<tool_call>...</tool_call>`), Llama 3 (bare JSON or
//! `<|python_tag|>`), Mistral (`[TOOL_CALLS]`), DeepSeek (`<｜tool▁calls▁begin｜>`, a section
//! of `<｜tool▁call▁begin｜>...<｜tool▁call▁end｜>` calls).

use super::parse::{self, parse_call, parse_calls};
use super::{emit, find_first, held_tail, Routed, RouterConfig, ToolFormat};

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";
const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
pub(super) const MISTRAL_OPEN: &str = "[TOOL_CALLS]";
pub(super) const PYTHON_TAG: &str = "<|python_tag|>";
const DS_CALLS_BEGIN: &str = super::DEEPSEEK_CALLS_BEGIN;
/// What opens a DeepSeek call section: the real marker, and the misspellings R1 distills write
/// that llama.cpp's DeepSeek R1 parser accepted too.
const DS_OPENERS: [&str; 5] = [
    DS_CALLS_BEGIN,
    "<｜tool_calls_begin｜>",
    "<｜tool calls begin｜>",
    "<｜tool\\_calls\\_begin｜>",
    "<｜tool▁calls｜>",
];
const DS_CALLS_END: &str = "<｜tool▁calls▁end｜>";
const DS_CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const DS_CALL_END: &str = "<｜tool▁call▁end｜>";
/// A Markdown code fence.
const FENCE: &str = "```";

/// The insides of an answer that is fenced blocks only (info string empty or `json`), one
/// after another: a model making parallel calls may fence each.
fn fenced_bodies(text: &str) -> Option<Vec<&str>> {
    let mut bodies = Vec::new();
    let mut t = text.trim();
    while !t.is_empty() {
        let (info, rest) = t.strip_prefix(FENCE)?.split_once('\n')?;
        if !matches!(info.trim().to_ascii_lowercase().as_str(), "" | "json") {
            return None;
        }
        // A fence closes at a line's start: JSON strings hold no raw newline, so no fence
        // inside an argument ends the block early; the last may close at its line's end.
        let (body, after) = match rest.find("\n```") {
            Some(i) => (&rest[..i + 1], &rest[i + 1 + FENCE.len()..]),
            None => (rest.trim_end().strip_suffix(FENCE)?, ""),
        };
        bodies.push(body);
        t = after.trim_start();
    }
    (!bodies.is_empty()).then_some(bodies)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Nothing visible yet: leading whitespace is held while we learn what the answer is.
    Start,
    Content,
    Think,
    /// Inside `<tool_call>` (Hermes, GLM, Qwen3-Coder), collecting up to `</tool_call>`.
    TaggedCall,
    /// After `[TOOL_CALLS]`: the rest of the answer is the call list.
    MistralCalls,
    /// Tools are declared and the answer starts with `{` or `[`: it may be one bare JSON call
    /// (or a list of them), which only the end of the answer can tell.
    BareJson,
    /// Tools are declared and the answer starts with a code fence: it may be one fenced JSON
    /// call (```` ```json\n{"name": ...}\n``` ````), which small models write instead of
    /// their format's markers. Held until the answer ends, or until the fence's first line
    /// shows it is not JSON.
    FencedJson,
    /// Inside DeepSeek's `<｜tool▁calls▁begin｜>`: calls until `<｜tool▁calls▁end｜>`.
    DeepSeekCalls,
}

#[derive(Debug, Clone)]
pub(super) struct TaggedRouter {
    cfg: RouterConfig,
    mode: Mode,
    /// Text received but not routed yet.
    buf: String,
    /// In `Start`: drop the held whitespace instead of emitting it (after `</think>` or a call).
    drop_leading_ws: bool,
    /// The marker that opened the current call mode, given back with the text if it fails
    /// (in `DeepSeekCalls`: until the first call of the section is decided).
    opened: &'static str,
    /// `<function=NAME>` of each declared tool, when a call may open without `<tool_call>`
    /// ([`RouterConfig::bare_function_calls`]).
    bare_openers: Vec<String>,
}

impl TaggedRouter {
    pub(super) fn new(cfg: RouterConfig) -> Self {
        let mode = if cfg.in_think { Mode::Think } else { Mode::Start };
        let bare_openers = if cfg.bare_function_calls && cfg.format == ToolFormat::Qwen3Coder {
            cfg.tools.iter().map(|t| format!("<function={t}>")).collect()
        } else {
            Vec::new()
        };
        TaggedRouter {
            cfg,
            mode,
            buf: String::new(),
            drop_leading_ws: false,
            opened: "",
            bare_openers,
        }
    }

    fn tools_on(&self) -> bool {
        !self.cfg.tools.is_empty()
    }

    /// The call-opening markers of the format; none when tools are off.
    fn call_markers(&self) -> &'static [&'static str] {
        if !self.tools_on() {
            return &[];
        }
        match self.cfg.format {
            ToolFormat::Hermes | ToolFormat::Glm45 | ToolFormat::Qwen3Coder => &[HERMES_OPEN],
            ToolFormat::Mistral => &[MISTRAL_OPEN],
            ToolFormat::Llama3Json => &[PYTHON_TAG],
            ToolFormat::DeepSeekV3 | ToolFormat::DeepSeekV31 => &DS_OPENERS,
            // Routed by `harmony`; never here.
            ToolFormat::Harmony => &[],
        }
    }

    /// What ends a `<think>` block. Qwen3.5 may open a call without closing its thinking
    /// first; llama.cpp's Qwen3-Coder parser ends the reasoning at `<tool_call>` too, and so
    /// does this one when tools are declared.
    fn think_ends(&self) -> &'static [&'static str] {
        if self.tools_on() && self.cfg.format == ToolFormat::Qwen3Coder {
            &[THINK_CLOSE, HERMES_OPEN]
        } else {
            &[THINK_CLOSE]
        }
    }

    /// One `<tool_call>` body in the format's shape.
    fn parse_tagged(&self, body: &str) -> Option<super::ToolCall> {
        match self.cfg.format {
            ToolFormat::Glm45 => parse::glm_call(body, &self.cfg.string_params),
            ToolFormat::Qwen3Coder => parse::qwen_xml_call(body, &self.cfg.string_params),
            _ => parse_call(body, None),
        }
    }

    /// Route newly decoded text; returns what can be decided now.
    pub(super) fn push(&mut self, text: &str) -> Vec<Routed> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        while self.step(&mut out) {}
        out
    }

    /// One transition; `true` when another may follow on the same buffer.
    fn step(&mut self, out: &mut Vec<Routed>) -> bool {
        match self.mode {
            Mode::Start => self.step_start(),
            Mode::Think => {
                let ends = self.think_ends();
                if let Some((i, marker)) = find_first(&self.buf, ends) {
                    emit(out, Routed::Reasoning(self.buf[..i].to_string()));
                    self.buf.drain(..i + marker.len());
                    if marker == THINK_CLOSE {
                        self.mode = Mode::Start;
                        self.drop_leading_ws = true;
                    } else {
                        self.open(marker);
                    }
                    true
                } else {
                    let keep = held_tail(&self.buf, ends);
                    emit(out, Routed::Reasoning(self.buf[..keep].to_string()));
                    self.buf.drain(..keep);
                    false
                }
            }
            Mode::Content => {
                let markers = self.call_markers();
                if markers.is_empty() {
                    emit(out, Routed::Content(std::mem::take(&mut self.buf)));
                    return false;
                }
                let bare = self.bare_openers.iter().filter_map(|m| self.buf.find(m.as_str())).min();
                let tagged = find_first(&self.buf, markers);
                if let Some(i) = bare.filter(|&b| tagged.is_none_or(|(t, _)| b < t)) {
                    // `<function=NAME>` without `<tool_call>`: the call's text starts here.
                    emit(out, Routed::Content(self.buf[..i].to_string()));
                    self.buf.drain(..i);
                    self.open_bare();
                    true
                } else if let Some((i, marker)) = tagged {
                    emit(out, Routed::Content(self.buf[..i].to_string()));
                    self.buf.drain(..i + marker.len());
                    self.open(marker);
                    true
                } else {
                    let mut all: Vec<&str> = markers.to_vec();
                    all.extend(self.bare_openers.iter().map(String::as_str));
                    let keep = held_tail(&self.buf, &all);
                    emit(out, Routed::Content(self.buf[..keep].to_string()));
                    self.buf.drain(..keep);
                    false
                }
            }
            Mode::TaggedCall => {
                let Some(i) = self.buf.find(HERMES_CLOSE) else {
                    return false;
                };
                let body = self.buf[..i].to_string();
                self.buf.drain(..i + HERMES_CLOSE.len());
                match self.parse_tagged(&body) {
                    Some(call) => {
                        out.push(Routed::ToolCall(call));
                        self.mode = Mode::Start;
                        self.drop_leading_ws = true;
                    }
                    None => {
                        emit(out, Routed::Content(format!("{}{body}{HERMES_CLOSE}", self.opened)));
                        self.mode = Mode::Content;
                    }
                }
                true
            }
            Mode::DeepSeekCalls => self.step_deepseek(out),
            Mode::FencedJson => self.step_fenced(),
            Mode::MistralCalls | Mode::BareJson => false,
        }
    }

    /// Inside a DeepSeek call section: each `<｜tool▁call▁begin｜>...<｜tool▁call▁end｜>` is
    /// decided as soon as it closes; whitespace between calls is the template's layout.
    fn step_deepseek(&mut self, out: &mut Vec<Routed>) -> bool {
        let t = self.buf.trim_start();
        let ws = self.buf.len() - t.len();
        if t.is_empty() {
            return false;
        }
        if t.starts_with(DS_CALLS_END) {
            if !self.opened.is_empty() {
                // An empty section: nothing was a call, so all of it is content.
                emit(
                    out,
                    Routed::Content(format!("{}{}", self.opened, &self.buf[..ws + DS_CALLS_END.len()])),
                );
                self.opened = "";
                self.buf.drain(..ws + DS_CALLS_END.len());
                self.mode = Mode::Content;
                return true;
            }
            self.buf.drain(..ws + DS_CALLS_END.len());
            self.mode = Mode::Start;
            self.drop_leading_ws = true;
            return true;
        }
        if let Some(body) = t.strip_prefix(DS_CALL_BEGIN) {
            let Some(j) = body.find(DS_CALL_END) else {
                return false;
            };
            let body = body[..j].to_string();
            self.buf.drain(..ws + DS_CALL_BEGIN.len() + j + DS_CALL_END.len());
            match parse::deepseek_call(&body) {
                Some(call) => out.push(Routed::ToolCall(call)),
                None => emit(
                    out,
                    Routed::Content(format!("{}{DS_CALL_BEGIN}{body}{DS_CALL_END}", self.opened)),
                ),
            }
            self.opened = "";
            return true;
        }
        if [DS_CALLS_END, DS_CALL_BEGIN].iter().any(|m| m.starts_with(t)) {
            return false;
        }
        // Anything else ends the section: it is content, with the opener when nothing before
        // it in the section was decided. Content mode reads the rest, which may open a call.
        emit(out, Routed::Content(self.opened.to_string()));
        self.opened = "";
        self.mode = Mode::Content;
        true
    }

    /// Inside a fence that opened the answer: once its first line and the first character
    /// after it are known, a fence that cannot hold a JSON call is content from then on.
    fn step_fenced(&mut self) -> bool {
        let t = self.buf.trim_start();
        let Some((info, body)) = t[FENCE.len()..].split_once('\n') else {
            return false;
        };
        let info_ok = matches!(info.trim().to_ascii_lowercase().as_str(), "" | "json");
        let first = body.trim_start().chars().next();
        if info_ok && first.is_none() {
            return false;
        }
        if info_ok && matches!(first, Some('{' | '[')) {
            // Still possibly a call: only the end can tell.
            return false;
        }
        // Not a call: content from here on, read by content mode (a call may still follow).
        self.mode = Mode::Content;
        true
    }

    /// Enter a call opened by `<function=NAME>` alone, which stays in the buffer as the start of
    /// the call's text (a Qwen3-Coder call whose `<tool_call>` the model left out); it still
    /// ends at `</tool_call>`, as llama.cpp requires.
    fn open_bare(&mut self) {
        self.opened = "";
        self.mode = Mode::TaggedCall;
    }

    /// Enter the call mode a marker opens.
    fn open(&mut self, marker: &'static str) {
        self.opened = marker;
        self.mode = match marker {
            HERMES_OPEN => Mode::TaggedCall,
            MISTRAL_OPEN => Mode::MistralCalls,
            m if DS_OPENERS.contains(&m) => Mode::DeepSeekCalls,
            _ => Mode::BareJson,
        };
    }

    fn step_start(&mut self) -> bool {
        let trimmed = self.buf.trim_start();
        if trimmed.is_empty() {
            return false;
        }
        let ws = self.buf.len() - trimmed.len();
        let mut markers = vec![THINK_OPEN];
        markers.extend(self.call_markers());
        if self.tools_on() {
            markers.push(FENCE);
        }
        markers.extend(self.bare_openers.iter().map(String::as_str));
        // A marker still being written: wait for the rest.
        if markers
            .iter()
            .any(|m| m.len() > trimmed.len() && m.starts_with(trimmed))
        {
            return false;
        }
        if trimmed.starts_with(THINK_OPEN) {
            self.buf.drain(..ws + THINK_OPEN.len());
            self.mode = Mode::Think;
            return true;
        }
        if self.bare_openers.iter().any(|m| trimmed.starts_with(m.as_str())) {
            self.buf.drain(..ws);
            self.open_bare();
            return true;
        }
        if let Some(&m) = self.call_markers().iter().find(|m| trimmed.starts_with(**m)) {
            self.buf.drain(..ws + m.len());
            self.open(m);
            return true;
        }
        if self.tools_on() && (trimmed.starts_with('{') || trimmed.starts_with('[')) {
            self.opened = "";
            self.mode = Mode::BareJson;
            return false;
        }
        if self.tools_on() && trimmed.starts_with(FENCE) {
            self.opened = "";
            self.mode = Mode::FencedJson;
            return true;
        }
        if self.drop_leading_ws {
            self.buf.drain(..ws);
        }
        self.drop_leading_ws = false;
        self.mode = Mode::Content;
        true
    }

    /// The end of the answer: route everything still held.
    pub(super) fn finish(&mut self) -> Vec<Routed> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.buf);
        match self.mode {
            Mode::Start => {
                if !self.drop_leading_ws {
                    emit(&mut out, Routed::Content(rest));
                }
            }
            Mode::Content => emit(&mut out, Routed::Content(rest)),
            Mode::Think => emit(&mut out, Routed::Reasoning(rest)),
            // The model stopped before `</tool_call>`: still a call when the body parses.
            Mode::TaggedCall => match self.parse_tagged(&rest) {
                Some(call) => out.push(Routed::ToolCall(call)),
                None => emit(&mut out, Routed::Content(format!("{}{rest}", self.opened))),
            },
            Mode::MistralCalls => match parse_calls(&rest, None) {
                Some(calls) => out.extend(calls.into_iter().map(Routed::ToolCall)),
                None => emit(&mut out, Routed::Content(format!("{}{rest}", self.opened))),
            },
            Mode::FencedJson => {
                let declared = Some(self.cfg.tools.as_slice());
                let calls = fenced_bodies(&rest).and_then(|bodies| {
                    bodies
                        .into_iter()
                        .map(|b| parse_calls(b, declared))
                        .collect::<Option<Vec<_>>>()
                });
                match calls {
                    Some(calls) => out.extend(calls.into_iter().flatten().map(Routed::ToolCall)),
                    None => emit(&mut out, Routed::Content(rest)),
                }
            }
            // Bare JSON, or what followed Llama 3's `<|python_tag|>` (then in `opened`).
            // A closing fence the model never opened (Qwen2.5 0.5B ends bare calls with
            // "\n```" now and then) does not make a call text.
            Mode::BareJson => match parse_calls(strip_stray_fence(&rest), Some(self.cfg.tools.as_slice())) {
                Some(calls) => out.extend(calls.into_iter().map(Routed::ToolCall)),
                None => emit(&mut out, Routed::Content(format!("{}{rest}", self.opened))),
            },
            // The model stopped inside a call section: an unclosed last call still counts
            // when it parses (the end of generation closes it).
            Mode::DeepSeekCalls => {
                let t = rest.trim_start();
                let call = t.strip_prefix(DS_CALL_BEGIN).and_then(parse::deepseek_call);
                match call {
                    Some(call) => out.push(Routed::ToolCall(call)),
                    None if t.is_empty() && self.opened.is_empty() => {}
                    None => emit(&mut out, Routed::Content(format!("{}{rest}", self.opened))),
                }
            }
        }
        self.mode = Mode::Start;
        self.drop_leading_ws = false;
        self.opened = "";
        out
    }
}

/// `text` without one closing code fence at its end.
fn strip_stray_fence(text: &str) -> &str {
    let t = text.trim_end();
    t.strip_suffix(FENCE).unwrap_or(t)
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::OutputRouter;
    use super::*;

    #[test]
    fn plain_text_is_content_unchanged() {
        let c = cfg(ToolFormat::Hermes, &[], false);
        check(
            &c,
            "Hello, wörld! <b>x</b> < tool",
            &[content("Hello, wörld! <b>x</b> < tool")],
        );
        check(&c, "  leading space kept", &[content("  leading space kept")]);
    }

    #[test]
    fn think_block_becomes_reasoning() {
        let c = cfg(ToolFormat::Hermes, &[], false);
        check(
            &c,
            "<think>\nweigh it</think>\n\nThe answer.",
            &[reasoning("\nweigh it"), content("The answer.")],
        );
    }

    #[test]
    fn think_opened_by_the_prompt() {
        let c = cfg(ToolFormat::Hermes, &[], true);
        check(
            &c,
            "step 1 < 2</think>Done",
            &[reasoning("step 1 < 2"), content("Done")],
        );
        // Unterminated: everything is reasoning.
        check(&c, "still </thin", &[reasoning("still </thin")]);
    }

    #[test]
    fn hermes_tool_call_between_content() {
        let c = cfg(ToolFormat::Hermes, &["get_weather"], false);
        check(
            &c,
            "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
            &[content("Let me check.\n"), call("get_weather", r#"{"city":"Paris"}"#)],
        );
    }

    #[test]
    fn two_hermes_calls_and_missing_close_tag() {
        let c = cfg(ToolFormat::Hermes, &["a", "b"], false);
        check(
            &c,
            "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>\n<tool_call>{\"name\":\"b\",\"arguments\":{\"x\":1}}",
            &[call("a", "{}"), call("b", r#"{"x":1}"#)],
        );
    }

    #[test]
    fn broken_call_stays_content() {
        let c = cfg(ToolFormat::Hermes, &["a"], false);
        let text = "<tool_call>{\"name\": \"a\", \"arguments\": {oops}</tool_call> after";
        check(&c, text, &[content(text)]);
        let text = "<tool_call>{\"name\": \"a\"";
        check(&c, text, &[content(text)]);
    }

    #[test]
    fn tags_without_tools_are_content() {
        let c = cfg(ToolFormat::Hermes, &[], false);
        let text = "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>";
        check(&c, text, &[content(text)]);
    }

    #[test]
    fn bare_json_naming_a_declared_tool_is_a_call() {
        let c = cfg(ToolFormat::Hermes, &["get_weather"], false);
        check(
            &c,
            "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
            &[call("get_weather", r#"{"city":"Paris"}"#)],
        );
        check(
            &c,
            "\n[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"A\"}}, {\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"B\\\"}\"}]",
            &[call("get_weather", r#"{"city":"A"}"#), call("get_weather", r#"{"city":"B"}"#)],
        );
    }

    #[test]
    fn bare_json_that_is_not_a_declared_call_stays_content() {
        let c = cfg(ToolFormat::Hermes, &["get_weather"], false);
        for text in [
            "{\"name\": \"other_tool\", \"arguments\": {}}",
            "{\"name\": \"get_weather\", \"arguments\": 5}",
            "{\"city\": \"Paris\"}",
            "{\"name\": \"get_weather\", \"arguments\": {}} and more",
            "[1, 2]",
            "{ not json",
        ] {
            check(&c, text, &[content(text)]);
        }
        // Without declared tools JSON is never a call.
        let c = cfg(ToolFormat::Hermes, &[], false);
        let text = "{\"name\": \"get_weather\", \"arguments\": {}}";
        check(&c, text, &[content(text)]);
    }

    #[test]
    fn fenced_json_naming_a_declared_tool_is_a_call() {
        for format in [ToolFormat::Hermes, ToolFormat::Qwen3Coder, ToolFormat::DeepSeekV3] {
            let c = cfg(format, &["get_weather"], false);
            check(
                &c,
                "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Tokyo\"}}\n```",
                &[call("get_weather", r#"{"city":"Tokyo"}"#)],
            );
            check(
                &c,
                "\n```\n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Tokyo\"}}\n```\n",
                &[call("get_weather", r#"{"city":"Tokyo"}"#)],
            );
        }
    }

    /// Parallel calls as small models write them: bare objects one per line, fenced blocks one
    /// after another, several objects in one fence. Each is a call; one part that is not a
    /// call keeps the whole answer content.
    #[test]
    fn parallel_bare_and_fenced_calls_are_each_a_call() {
        let c = cfg(ToolFormat::Hermes, &["read", "glob"], false);
        let a = r#"{"name": "read", "arguments": {"filePath": "a.txt"}}"#;
        let b = r#"{"name": "glob", "arguments": {"pattern": "*.rs"}}"#;
        let both = [
            call("read", r#"{"filePath":"a.txt"}"#),
            call("glob", r#"{"pattern":"*.rs"}"#),
        ];
        for text in [
            format!("{a}\n{b}"),
            format!("{a}\n\n{b}\n"),
            format!("{a}{b}"),
            format!("```json\n{a}\n```\n```json\n{b}\n```"),
            format!("```json\n{a}\n```\n\n```\n{b}\n```\n"),
            format!("```json\n{a}\n{b}\n```"),
            format!("[{a}]\n{b}"),
        ] {
            check(&c, &text, &both);
        }
        for text in [
            format!("{a}\n{{\"city\": \"Paris\"}}"),
            format!("{a}\nand then"),
            format!("```json\n{a}\n```\nDone."),
            format!("```json\n{a}\n```\n```python\nprint(1)\n```"),
        ] {
            check(&c, &text, &[content(&text)]);
        }
        // A fence inside an argument does not close the block.
        let code = r#"{"name": "read", "arguments": {"filePath": "```"}}"#;
        check(
            &c,
            &format!("```json\n{code}\n```"),
            &[call("read", r#"{"filePath":"```"}"#)],
        );
    }

    #[test]
    fn a_bare_call_with_a_stray_closing_fence_is_a_call() {
        let c = cfg(ToolFormat::Hermes, &["read"], false);
        check(
            &c,
            "{\"name\": \"read\", \"arguments\": {\"filePath\": \"a.txt\"}}\n```",
            &[call("read", r#"{"filePath":"a.txt"}"#)],
        );
        // Only a fence: other trailing text still makes it content.
        let text = "{\"name\": \"read\", \"arguments\": {}}\n```\nDone";
        check(&c, text, &[content(text)]);
    }

    #[test]
    fn json_call_names_match_a_declared_tool_up_to_case_when_only_one_does() {
        // What Qwen2.5-Coder 0.5B writes for OpenCode's `read` tool: the call keeps the
        // declared spelling.
        let c = cfg(ToolFormat::Hermes, &["read", "write"], false);
        check(
            &c,
            "{\n  \"name\": \"Read\",\n  \"arguments\": {\"filePath\": \"notes.txt\"}\n}",
            &[call("read", r#"{"filePath":"notes.txt"}"#)],
        );
        check(
            &c,
            "```json\n{\"name\": \"WRITE\", \"arguments\": {}}\n```",
            &[call("write", "{}")],
        );
        // Two tools equal up to case: an exact spelling picks one, any other picks none.
        let c = cfg(ToolFormat::Hermes, &["read", "Read"], false);
        check(&c, "{\"name\": \"Read\", \"arguments\": {}}", &[call("Read", "{}")]);
        let text = "{\"name\": \"READ\", \"arguments\": {}}";
        check(&c, text, &[content(text)]);
        // Case is all that is forgiven.
        let c = cfg(ToolFormat::Hermes, &["read"], false);
        let text = "{\"name\": \"read_file\", \"arguments\": {}}";
        check(&c, text, &[content(text)]);
    }

    #[test]
    fn fenced_json_that_is_not_a_declared_call_stays_content() {
        let c = cfg(ToolFormat::Hermes, &["get_weather"], false);
        for text in [
            "```json\n{\"name\": \"other_tool\", \"arguments\": {}}\n```",
            "```json\n{\"name\": \"get_weather\", \"arguments\": {}}\n```\nDone.",
            "```python\nprint(1)\n```",
            "```json\n[1, 2]\n```",
            "```json\n{\"name\": \"get_weather\", \"arguments\": {}}",
            "``not a fence",
        ] {
            check(&c, text, &[content(text)]);
        }
        let c = cfg(ToolFormat::Hermes, &[], false);
        let text = "```json\n{\"name\": \"get_weather\", \"arguments\": {}}\n```";
        check(&c, text, &[content(text)]);
    }

    #[test]
    fn a_fence_that_cannot_be_a_call_streams_at_once() {
        let c = cfg(ToolFormat::Hermes, &["f"], false);
        let mut r = OutputRouter::new(c);
        assert!(r.push("```py").is_empty(), "the fence's first line is not known yet");
        assert_eq!(r.push("thon\nx = 1"), [content("```python\nx = 1")]);
        assert_eq!(r.push("\n```"), [content("\n```")]);
    }

    #[test]
    fn llama3_python_tag_and_parameters() {
        let c = cfg(ToolFormat::Llama3Json, &["f"], false);
        check(
            &c,
            "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"q\": 2}}",
            &[call("f", r#"{"q":2}"#)],
        );
        check(&c, "{\"name\": \"f\", \"parameters\": {}}", &[call("f", "{}")]);
        for text in ["<|python_tag|>print(1)", "<|python_tag|>{broken"] {
            check(&c, text, &[content(text)]);
        }
    }

    #[test]
    fn mistral_call_list() {
        let c = cfg(ToolFormat::Mistral, &["f", "g"], false);
        check(
            &c,
            "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": true}}, {\"name\": \"g\", \"arguments\": {}}]",
            &[call("f", r#"{"a":true}"#), call("g", "{}")],
        );
        let text = "Sure [TOOL_CALLS] not json";
        check(&c, text, &[content(text)]);
    }

    #[test]
    fn reasoning_then_tool_call() {
        let c = cfg(ToolFormat::Hermes, &["f"], true);
        check(
            &c,
            "need f</think>\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
            &[reasoning("need f"), call("f", "{}")],
        );
    }

    const DS_V31: &str = "Need the weather.</think>Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";

    #[test]
    fn deepseek_v31_calls_after_reasoning() {
        let c = cfg(ToolFormat::DeepSeekV31, &["get_weather", "get_time"], true);
        check(
            &c,
            DS_V31,
            &[
                reasoning("Need the weather."),
                content("Let me check."),
                call("get_weather", r#"{"city":"Paris"}"#),
                call("get_time", "{}"),
            ],
        );
        // Without tools the markers are text.
        let c = cfg(ToolFormat::DeepSeekV31, &[], true);
        let (_, answer) = DS_V31.split_once("</think>").unwrap();
        check(&c, DS_V31, &[reasoning("Need the weather."), content(answer)]);
    }

    #[test]
    fn deepseek_v3_fenced_arguments() {
        let c = cfg(ToolFormat::DeepSeekV3, &["get_weather"], false);
        check(
            &c,
            "<think>\nr\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁calls▁end｜>",
            &[reasoning("\nr\n"), call("get_weather", r#"{"city":"Paris"}"#)],
        );
    }

    #[test]
    fn deepseek_broken_calls_are_given_back() {
        let c = cfg(ToolFormat::DeepSeekV31, &["f", "g"], false);
        let broken = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{oops}<｜tool▁call▁end｜>";
        check(
            &c,
            &format!("{broken}<｜tool▁call▁begin｜>g<｜tool▁sep｜>{{}}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
            &[content(broken), call("g", "{}")],
        );
        for text in [
            "<｜tool▁calls▁begin｜>nonsense",
            "<｜tool▁calls▁begin｜>",
            "<｜tool▁calls▁begin｜><｜tool▁calls▁end｜> after",
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f {}<｜tool▁call▁end｜>",
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>[1]",
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\":\n```<｜tool▁call▁end｜>",
        ] {
            check(&c, text, &[content(text)]);
        }
        // The model stopped inside the section: the unclosed call still counts.
        check(
            &c,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": 1}",
            &[call("f", r#"{"a":1}"#)],
        );
    }

    /// R1 distills misspell the section opener; llama.cpp's R1 parser took these too.
    #[test]
    fn deepseek_misspelled_section_openers() {
        let c = cfg(ToolFormat::DeepSeekV3, &["f"], false);
        for open in [
            "<｜tool_calls_begin｜>",
            "<｜tool calls begin｜>",
            "<｜tool\\_calls\\_begin｜>",
            "<｜tool▁calls｜>",
        ] {
            check(
                &c,
                &format!("ok {open}<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{{}}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
                &[content("ok "), call("f", "{}")],
            );
            let text = format!("{open} then prose");
            check(&c, &text, &[content(&text)]);
        }
    }

    const GLM_CALL: &str = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>zip</arg_key>\n<arg_value>75001</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>opts</arg_key>\n<arg_value>{\"unit\": \"c\"}</arg_value>\n</tool_call>";

    #[test]
    fn glm_calls_with_typed_values() {
        let mut c = cfg(ToolFormat::Glm45, &["get_weather"], false);
        // `zip` is declared as a string: its digits stay text; `days` is not declared, so
        // digits are a number; `city` is not JSON, so text.
        c.string_params = vec![
            ("get_weather".into(), "city".into()),
            ("get_weather".into(), "zip".into()),
        ];
        check(
            &c,
            &format!("<think>plan</think>\n{GLM_CALL}\n<tool_call>ping</tool_call>"),
            &[
                reasoning("plan"),
                call(
                    "get_weather",
                    r#"{"city":"Paris","zip":"75001","days":3,"opts":{"unit":"c"}}"#,
                ),
                call("ping", "{}"),
            ],
        );
    }

    #[test]
    fn glm_broken_calls_are_given_back() {
        let c = cfg(ToolFormat::Glm45, &["f"], false);
        for text in [
            "<tool_call>f\n<arg_key>a</arg_key>oops</tool_call>",
            "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1</tool_call>",
            // Hermes' JSON body is not GLM's.
            "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>",
            "<tool_call></tool_call>",
        ] {
            check(&c, text, &[content(text)]);
        }
        // A whole answer that is a JSON call of a declared tool is a call in every format
        // (small models write it instead of their markers); another name stays content.
        check(&c, "{\"name\": \"f\", \"arguments\": {}}", &[call("f", "{}")]);
        let text = "{\"name\": \"g\", \"arguments\": {}}";
        check(&c, text, &[content(text)]);
    }

    /// `(tool, parameter)` pairs declared as strings.
    fn strings(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(t, p)| (t.to_string(), p.to_string())).collect()
    }

    /// Written as the Qwen3-Coder template writes a call: `<parameter=P>\n` VALUE
    /// `\n</parameter>\n`, the values of `string_params` as text, the others as JSON.
    const QWEN_CALL: &str = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=zip>\n75001\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=opts>\n{\"unit\": \"c\", \"hourly\": [1, 2]}\n</parameter>\n<parameter=note>\n  indented\n\nlast line\n\n</parameter>\n</function>\n</tool_call>";
    const QWEN_ARGS: &str = r#"{"city":"Paris","zip":"75001","days":3,"opts":{"unit":"c","hourly":[1,2]},"note":"  indented\n\nlast line\n"}"#;

    fn qwen_cfg(tools: &[&str], in_think: bool) -> RouterConfig {
        let mut c = cfg(ToolFormat::Qwen3Coder, tools, in_think);
        c.string_params = strings(&[("get_weather", "city"), ("get_weather", "zip"), ("get_weather", "note")]);
        c
    }

    #[test]
    fn qwen_calls_with_typed_values() {
        let c = qwen_cfg(&["get_weather", "ping"], false);
        // `zip` is declared a string: its digits stay text; `days` and `opts` are not, so they
        // are JSON; only the newline after `>` and the one before `</parameter>` are layout.
        check(
            &c,
            &format!(
                "Let me look.\n\n{QWEN_CALL}\n{QWEN_CALL}\n<tool_call>\n<function=ping>\n</function>\n</tool_call>"
            ),
            &[
                content("Let me look.\n\n"),
                call("get_weather", QWEN_ARGS),
                call("get_weather", QWEN_ARGS),
                call("ping", "{}"),
            ],
        );
    }

    #[test]
    fn qwen_values_follow_llama_cpps_rules() {
        let c = qwen_cfg(&["get_weather"], false);
        let one = |params: &str| format!("<tool_call>\n<function=get_weather>\n{params}</function>\n</tool_call>");
        // A value that is not JSON stays text even where the schema wants a number (llama.cpp
        // would not let the grammar write it; the router keeps what the model wrote), and a
        // parameter the tool does not declare is typed like any non-string one.
        check(
            &c,
            &one("<parameter=days>\nthree\n</parameter>\n<parameter=extra>\ntrue\n</parameter>\n"),
            &[call("get_weather", r#"{"days":"three","extra":true}"#)],
        );
        // Values written without the template's newlines, and a string value holding this
        // very markup: it ends at the `</parameter>` that the next tag follows.
        check(
            &c,
            &one("<parameter=days>7</parameter><parameter=city>\na</parameter> b\n</parameter>\n"),
            &[call("get_weather", r#"{"days":7,"city":"a</parameter> b"}"#)],
        );
        // An empty string value.
        check(
            &c,
            &one("<parameter=city>\n\n</parameter>\n"),
            &[call("get_weather", r#"{"city":""}"#)],
        );
    }

    #[test]
    fn qwen_reasoning_then_call() {
        let c = qwen_cfg(&["get_weather"], true);
        check(
            &c,
            &format!("Need weather.\n</think>\n\n{QWEN_CALL}"),
            &[reasoning("Need weather.\n"), call("get_weather", QWEN_ARGS)],
        );
        // llama.cpp's Qwen3-Coder parser also ends the reasoning at `<tool_call>`.
        check(
            &c,
            &format!("Need weather.\n{QWEN_CALL}"),
            &[reasoning("Need weather.\n"), call("get_weather", QWEN_ARGS)],
        );
        // Without tools `<tool_call>` is just text of the reasoning.
        let c = cfg(ToolFormat::Qwen3Coder, &[], true);
        check(
            &c,
            &format!("Need weather.\n{QWEN_CALL}"),
            &[reasoning(&format!("Need weather.\n{QWEN_CALL}"))],
        );
    }

    #[test]
    fn qwen_broken_calls_are_given_back() {
        let c = qwen_cfg(&["get_weather"], false);
        for text in [
            // No `</function>`: the call may have been cut short.
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</tool_call>",
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</tool_call>",
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\ntrailing\n</tool_call>",
            "<tool_call>\n<function=>\n</function>\n</tool_call>",
            "<tool_call>\n<function=get_weather>\nstray\n</function>\n</tool_call>",
            // Hermes' and GLM's bodies are not this format's.
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>",
            "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>",
            "<tool_call></tool_call> after",
            // The model stopped inside the call.
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
        ] {
            check(&c, text, &[content(text)]);
        }
        // A broken call before a good one: the first is content, the second a call.
        let broken = "<tool_call>\n<function=get_weather>\n</tool_call>";
        check(
            &c,
            &format!("{broken}\n{QWEN_CALL}"),
            &[content(&format!("{broken}\n")), call("get_weather", QWEN_ARGS)],
        );
        // A whole answer that is a JSON call of a declared tool is a call here too; without
        // tools the tags are text.
        let text = "{\"name\": \"get_weather\", \"arguments\": {}}";
        check(&c, text, &[call("get_weather", "{}")]);
        check(
            &cfg(ToolFormat::Qwen3Coder, &[], false),
            QWEN_CALL,
            &[content(QWEN_CALL)],
        );
    }

    /// Qwen3-Coder sometimes leaves out `<tool_call>`; llama.cpp then takes `<function=NAME>`
    /// of a declared tool as the call's opening (never a bare `<function`, which code writes:
    /// `#include <functional>`), and still wants `</tool_call>` after it.
    #[test]
    fn qwen_coder_call_without_its_tool_call_tag() {
        let mut c = qwen_cfg(&["get_weather", "ping"], false);
        c.bare_function_calls = true;
        let bare = "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>";
        let want = call("get_weather", r#"{"city":"Paris","days":2}"#);
        check(&c, bare, std::slice::from_ref(&want));
        check(
            &c,
            &format!("#include <functional>\nSure.\n\n{bare}\n<tool_call>\n<function=ping>\n</function>\n</tool_call>"),
            &[
                content("#include <functional>\nSure.\n\n"),
                want.clone(),
                call("ping", "{}"),
            ],
        );
        // Stopped before `</tool_call>`: still a call, as with the tag.
        check(&c, &bare[..bare.len() - "\n</tool_call>".len()], &[want]);
        // Not a declared tool, or not a call: content, nothing added to it.
        for text in [
            "<function=other>\n</function>\n</tool_call>",
            "<function=get_weather>\nstray\n</function>\n</tool_call> after",
        ] {
            check(&c, text, &[content(text)]);
        }
        // Qwen3.5 (a thinking template) always writes the tag; llama.cpp does not look for this.
        let c = qwen_cfg(&["get_weather"], false);
        check(&c, bare, &[content(bare)]);
    }

    /// The router reads back what the Qwen3-Coder and Qwen3.5 templates (as llama.cpp ships
    /// them, rendered as Python's jinja2 renders them: `tests/template_golden.rs`) write for an
    /// assistant's calls.
    #[test]
    fn qwen_reads_what_its_templates_write() {
        use crate::chat::template::{ChatTemplate, RenderRequest};
        let args = serde_json::json!({"city": "Paris", "zip": "75001", "days": 3,
            "opts": {"unit": "c", "hourly": [1, 2]}, "note": "  indented\n\nlast line\n"});
        let messages = [
            serde_json::json!({"role": "user", "content": "Weather?"}),
            serde_json::json!({"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": args}},
                {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": args}}]}),
        ];
        for file in ["Qwen3-Coder.jinja", "Qwen3.5-4B.jinja"] {
            let path = format!("{}/tests/golden/templates/{file}", env!("CARGO_MANIFEST_DIR"));
            let source = std::fs::read_to_string(&path).unwrap();
            assert_eq!(ToolFormat::detect(&source), ToolFormat::Qwen3Coder, "{file}");
            assert_eq!(
                ToolFormat::Qwen3Coder.may_omit_call_tag(&source),
                file == "Qwen3-Coder.jinja",
                "{file}"
            );
            let t = ChatTemplate::from_source(&source, "", "<|im_end|>").unwrap();
            let rendered = t
                .render(&RenderRequest {
                    messages: &messages,
                    tools: None,
                    add_generation_prompt: false,
                    kwargs: &serde_json::Map::new(),
                })
                .unwrap();
            let start = rendered.find("<tool_call>").unwrap();
            let end = rendered.rfind("</tool_call>").unwrap() + "</tool_call>".len();
            let c = qwen_cfg(&["get_weather"], false);
            let want = call("get_weather", QWEN_ARGS);
            assert_eq!(route(&c, &[&rendered[start..end]]), [want.clone(), want], "{file}");
        }
    }
}
