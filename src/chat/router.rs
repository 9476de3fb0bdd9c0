//! Splitting a model's answer, as it streams, into what an OpenAI client expects: visible
//! `content`, `reasoning_content` (inside `<think>...</think>`) and `tool_calls` in the format
//! of the model's family.
//!
//! Text is pushed as it is decoded. A marker split across pushes (`<tool_` + `call>`) is held
//! back until it is decided, so no partial tag ever reaches the client. Anything that looks like
//! a call but does not parse is given back as content, markers included: never dropped.

use serde_json::Value;

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";
const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
const MISTRAL_OPEN: &str = "[TOOL_CALLS]";
const PYTHON_TAG: &str = "<|python_tag|>";

/// How a family writes tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Qwen 2.5/3, Hermes).
    Hermes,
    /// A bare JSON object `{"name": ..., "parameters": {...}}`, optionally after
    /// `<|python_tag|>` (Llama 3.1+).
    Llama3Json,
    /// `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` (Mistral).
    Mistral,
}

impl ToolFormat {
    /// The format a chat template asks for; Hermes when the template shows no other.
    pub fn detect(template_source: &str) -> ToolFormat {
        if template_source.contains(MISTRAL_OPEN) {
            ToolFormat::Mistral
        } else if template_source.contains(PYTHON_TAG) || template_source.contains("<|start_header_id|>") {
            ToolFormat::Llama3Json
        } else {
            ToolFormat::Hermes
        }
    }
}

/// What the router looks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouterConfig {
    pub format: ToolFormat,
    /// Names of the declared tools. Empty: tool calls are not parsed at all (no tools, or
    /// `tool_choice: "none"`).
    pub tools: Vec<String>,
    /// The rendered prompt already opened a `<think>` block, so the answer starts inside it.
    pub in_think: bool,
}

/// One parsed tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments object as JSON text (the OpenAI wire format).
    pub arguments: String,
}

/// A routed piece of the answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Routed {
    Content(String),
    Reasoning(String),
    ToolCall(ToolCall),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Nothing visible yet: leading whitespace is held while we learn what the answer is.
    Start,
    Content,
    Think,
    /// Inside `<tool_call>`, collecting up to `</tool_call>`.
    HermesCall,
    /// After `[TOOL_CALLS]`: the rest of the answer is the call list.
    MistralCalls,
    /// Tools are declared and the answer starts with `{` or `[`: it may be one bare JSON call
    /// (or a list of them), which only the end of the answer can tell.
    BareJson,
}

/// The streaming router. Feed it with [`OutputRouter::push`], then call
/// [`OutputRouter::finish`] once at the end.
#[derive(Debug, Clone)]
pub struct OutputRouter {
    cfg: RouterConfig,
    mode: Mode,
    /// Text received but not routed yet.
    buf: String,
    /// In `Start`: drop the held whitespace instead of emitting it (after `</think>` or a call).
    drop_leading_ws: bool,
    /// The marker that opened the current call mode, given back with the text if it fails.
    opened: &'static str,
}

impl OutputRouter {
    pub fn new(cfg: RouterConfig) -> Self {
        let mode = if cfg.in_think { Mode::Think } else { Mode::Start };
        OutputRouter {
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

    /// The call-opening marker of the format, when tools are on.
    fn call_marker(&self) -> Option<&'static str> {
        match (self.tools_on(), self.cfg.format) {
            (false, _) => None,
            (true, ToolFormat::Hermes) => Some(HERMES_OPEN),
            (true, ToolFormat::Mistral) => Some(MISTRAL_OPEN),
            (true, ToolFormat::Llama3Json) => Some(PYTHON_TAG),
        }
    }

    /// Route newly decoded text; returns what can be decided now.
    pub fn push(&mut self, text: &str) -> Vec<Routed> {
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
                let Some(marker) = self.call_marker() else {
                    emit(out, Routed::Content(std::mem::take(&mut self.buf)));
                    return false;
                };
                if let Some(i) = self.buf.find(marker) {
                    emit(out, Routed::Content(self.buf[..i].to_string()));
                    self.buf.drain(..i + marker.len());
                    self.open(marker);
                    true
                } else {
                    let keep = held_tail(&self.buf, &[marker]);
                    emit(out, Routed::Content(self.buf[..keep].to_string()));
                    self.buf.drain(..keep);
                    false
                }
            }
            Mode::HermesCall => {
                let Some(i) = self.buf.find(HERMES_CLOSE) else {
                    return false;
                };
                let body = self.buf[..i].to_string();
                self.buf.drain(..i + HERMES_CLOSE.len());
                match parse_call(&body, None) {
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
            Mode::MistralCalls | Mode::BareJson => false,
        }
    }

    /// Enter the call mode a marker opens.
    fn open(&mut self, marker: &'static str) {
        self.opened = marker;
        self.mode = match marker {
            HERMES_OPEN => Mode::HermesCall,
            MISTRAL_OPEN => Mode::MistralCalls,
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
        markers.extend(self.call_marker());
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
        if let Some(m) = self.call_marker().filter(|m| trimmed.starts_with(m)) {
            self.buf.drain(..ws + m.len());
            self.open(m);
            return true;
        }
        if self.tools_on() && (trimmed.starts_with('{') || trimmed.starts_with('[')) {
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
    pub fn finish(&mut self) -> Vec<Routed> {
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
            Mode::HermesCall => match parse_call(&rest, None) {
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
        }
        self.mode = Mode::Start;
        self.drop_leading_ws = false;
        self.opened = "";
        out
    }
}

fn emit(out: &mut Vec<Routed>, r: Routed) {
    match &r {
        Routed::Content(s) | Routed::Reasoning(s) if s.is_empty() => {}
        _ => out.push(r),
    }
}

/// Where the part of `buf` that may be the start of one of `markers` begins (`buf.len()` when
/// no tail can be): everything before it is safe to route.
pub fn held_tail(buf: &str, markers: &[&str]) -> usize {
    let longest = markers.iter().map(|m| m.len()).max().unwrap_or(0);
    let from = buf.len().saturating_sub(longest.saturating_sub(1));
    (from..buf.len())
        .filter(|&i| buf.is_char_boundary(i))
        .find(|&i| markers.iter().any(|m| m.starts_with(&buf[i..])))
        .unwrap_or(buf.len())
}

/// One call object: `{"name": string, "arguments"|"parameters": object}` (arguments given as a
/// JSON string holding an object are accepted too). With `declared`, the name must be one of
/// them.
fn call_from_value(v: &Value, declared: Option<&[String]>) -> Option<ToolCall> {
    let obj = v.as_object()?;
    let name = obj.get("name")?.as_str()?;
    if declared.is_some_and(|d| !d.iter().any(|t| t == name)) {
        return None;
    }
    let args = obj.get("arguments").or_else(|| obj.get("parameters"))?;
    let args = match args {
        Value::Object(_) => args.clone(),
        Value::String(s) => serde_json::from_str::<Value>(s).ok().filter(Value::is_object)?,
        _ => return None,
    };
    Some(ToolCall {
        name: name.to_string(),
        arguments: serde_json::to_string(&args).ok()?,
    })
}

fn parse_call(text: &str, declared: Option<&[String]>) -> Option<ToolCall> {
    let v: Value = serde_json::from_str(text.trim()).ok()?;
    call_from_value(&v, declared)
}

/// One call object or a non-empty list of them; `None` unless every element is a call.
fn parse_calls(text: &str, declared: Option<&[String]>) -> Option<Vec<ToolCall>> {
    let v: Value = serde_json::from_str(text.trim()).ok()?;
    match &v {
        Value::Array(items) if !items.is_empty() => items.iter().map(|i| call_from_value(i, declared)).collect(),
        Value::Object(_) => call_from_value(&v, declared).map(|c| vec![c]),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(format: ToolFormat, tools: &[&str], in_think: bool) -> RouterConfig {
        RouterConfig {
            format,
            tools: tools.iter().map(|s| s.to_string()).collect(),
            in_think,
        }
    }

    /// Adjacent pieces of the same kind joined, so results compare independently of chunking.
    fn merged(events: Vec<Routed>) -> Vec<Routed> {
        let mut out: Vec<Routed> = Vec::new();
        for e in events {
            match (out.last_mut(), e) {
                (Some(Routed::Content(a)), Routed::Content(b)) => a.push_str(&b),
                (Some(Routed::Reasoning(a)), Routed::Reasoning(b)) => a.push_str(&b),
                (_, e) => out.push(e),
            }
        }
        out
    }

    fn route(cfg: &RouterConfig, pieces: &[&str]) -> Vec<Routed> {
        let mut r = OutputRouter::new(cfg.clone());
        let mut out = Vec::new();
        for p in pieces {
            out.extend(r.push(p));
        }
        out.extend(r.finish());
        merged(out)
    }

    /// Routes `text` in one piece, split at every char boundary into two, and char by char;
    /// all must agree with `want`.
    fn check(cfg: &RouterConfig, text: &str, want: &[Routed]) {
        assert_eq!(route(cfg, &[text]), want, "whole: {text:?}");
        for i in (1..text.len()).filter(|&i| text.is_char_boundary(i)) {
            assert_eq!(route(cfg, &[&text[..i], &text[i..]]), want, "split at {i}: {text:?}");
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(route(cfg, &pieces), want, "char by char: {text:?}");
    }

    fn content(s: &str) -> Routed {
        Routed::Content(s.into())
    }
    fn reasoning(s: &str) -> Routed {
        Routed::Reasoning(s.into())
    }
    fn call(name: &str, args: &str) -> Routed {
        Routed::ToolCall(ToolCall {
            name: name.into(),
            arguments: args.into(),
        })
    }

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

    #[test]
    fn held_tail_finds_partial_markers() {
        assert_eq!(held_tail("abc<tool", &[HERMES_OPEN]), 3);
        assert_eq!(held_tail("abc", &[HERMES_OPEN]), 3);
        assert_eq!(held_tail("abc<", &[HERMES_OPEN]), 3);
        assert_eq!(held_tail("<tool_call", &[HERMES_OPEN]), 0);
        assert_eq!(held_tail("é<", &["<x"]), "é".len());
    }

    #[test]
    fn detects_formats_from_templates() {
        assert_eq!(ToolFormat::detect("{{ '<tool_call>' }}"), ToolFormat::Hermes);
        assert_eq!(ToolFormat::detect("[TOOL_CALLS] {{ x }}"), ToolFormat::Mistral);
        assert_eq!(ToolFormat::detect("<|start_header_id|>"), ToolFormat::Llama3Json);
    }
}
