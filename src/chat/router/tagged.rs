//! The router for families that think inside `<think>...</think>` and open each call with a
//! marker: Hermes and GLM (`<tool_call>...</tool_call>`), Llama 3 (bare JSON or
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Nothing visible yet: leading whitespace is held while we learn what the answer is.
    Start,
    Content,
    Think,
    /// Inside `<tool_call>` (Hermes, GLM), collecting up to `</tool_call>`.
    TaggedCall,
    /// After `[TOOL_CALLS]`: the rest of the answer is the call list.
    MistralCalls,
    /// Tools are declared and the answer starts with `{` or `[`: it may be one bare JSON call
    /// (or a list of them), which only the end of the answer can tell.
    BareJson,
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
}

impl TaggedRouter {
    pub(super) fn new(cfg: RouterConfig) -> Self {
        let mode = if cfg.in_think { Mode::Think } else { Mode::Start };
        TaggedRouter {
            cfg,
            mode,
            buf: String::new(),
            drop_leading_ws: false,
            opened: "",
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
            ToolFormat::Hermes | ToolFormat::Glm45 => &[HERMES_OPEN],
            ToolFormat::Mistral => &[MISTRAL_OPEN],
            ToolFormat::Llama3Json => &[PYTHON_TAG],
            ToolFormat::DeepSeekV3 | ToolFormat::DeepSeekV31 => &DS_OPENERS,
            // Routed by `harmony`; never here.
            ToolFormat::Harmony => &[],
        }
    }

    /// One `<tool_call>` body in the format's shape.
    fn parse_tagged(&self, body: &str) -> Option<super::ToolCall> {
        match self.cfg.format {
            ToolFormat::Glm45 => parse::glm_call(body, &self.cfg.string_params),
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
                if let Some(i) = self.buf.find(THINK_CLOSE) {
                    emit(out, Routed::Reasoning(self.buf[..i].to_string()));
                    self.buf.drain(..i + THINK_CLOSE.len());
                    self.mode = Mode::Start;
                    self.drop_leading_ws = true;
                    true
                } else {
                    let keep = held_tail(&self.buf, &[THINK_CLOSE]);
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
                if let Some((i, marker)) = find_first(&self.buf, markers) {
                    emit(out, Routed::Content(self.buf[..i].to_string()));
                    self.buf.drain(..i + marker.len());
                    self.open(marker);
                    true
                } else {
                    let keep = held_tail(&self.buf, markers);
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
                        emit(out, Routed::Content(format!("{HERMES_OPEN}{body}{HERMES_CLOSE}")));
                        self.mode = Mode::Content;
                    }
                }
                true
            }
            Mode::DeepSeekCalls => self.step_deepseek(out),
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
        // it in the section was decided.
        emit(out, Routed::Content(format!("{}{}", self.opened, self.buf)));
        self.buf.clear();
        self.opened = "";
        self.mode = Mode::Content;
        false
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
        if let Some(&m) = self.call_markers().iter().find(|m| trimmed.starts_with(**m)) {
            self.buf.drain(..ws + m.len());
            self.open(m);
            return true;
        }
        let bare_json = matches!(
            self.cfg.format,
            ToolFormat::Hermes | ToolFormat::Llama3Json | ToolFormat::Mistral
        );
        if self.tools_on() && bare_json && (trimmed.starts_with('{') || trimmed.starts_with('[')) {
            self.opened = "";
            self.mode = Mode::BareJson;
            return false;
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
            // Bare JSON, or what followed Llama 3's `<|python_tag|>` (then in `opened`).
            Mode::BareJson => match parse_calls(&rest, Some(self.cfg.tools.as_slice())) {
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

#[cfg(test)]
mod tests {
    use super::super::testing::*;
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
        // GLM answers never route bare JSON as a call.
        let text = "{\"name\": \"f\", \"arguments\": {}}";
        check(&c, text, &[content(text)]);
    }
}
