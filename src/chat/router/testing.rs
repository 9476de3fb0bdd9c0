//! Test helpers shared by the router's formats: route a text whole, split in two at every
//! character boundary and character by character, and compare with the expected pieces.

use super::{OutputRouter, Routed, RouterConfig, ToolCall, ToolFormat};

pub fn cfg(format: ToolFormat, tools: &[&str], in_think: bool) -> RouterConfig {
    RouterConfig {
        format,
        tools: tools.iter().map(|s| s.to_string()).collect(),
        in_think,
        string_params: Vec::new(),
        bare_function_calls: false,
    }
}

/// Adjacent pieces of the same kind joined, so results compare independently of chunking.
pub fn merged(events: Vec<Routed>) -> Vec<Routed> {
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

pub fn route(cfg: &RouterConfig, pieces: &[&str]) -> Vec<Routed> {
    let mut r = OutputRouter::new(cfg.clone());
    let mut out = Vec::new();
    for p in pieces {
        out.extend(r.push(p));
    }
    out.extend(r.finish());
    merged(out)
}

/// Routes `text` in one piece, split into two at every boundary a decoder can produce (every
/// character boundary: the stream decoder only hands out whole UTF-8 characters, so inside the
/// fullwidth DeepSeek markers every character is one), and character by character; all must
/// agree with `want`.
pub fn check(cfg: &RouterConfig, text: &str, want: &[Routed]) {
    assert_eq!(route(cfg, &[text]), want, "whole: {text:?}");
    for i in (1..text.len()).filter(|&i| text.is_char_boundary(i)) {
        assert_eq!(route(cfg, &[&text[..i], &text[i..]]), want, "split at {i}: {text:?}");
    }
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
    assert_eq!(route(cfg, &pieces), want, "char by char: {text:?}");
}

pub fn content(s: &str) -> Routed {
    Routed::Content(s.into())
}
pub fn reasoning(s: &str) -> Routed {
    Routed::Reasoning(s.into())
}
pub fn call(name: &str, args: &str) -> Routed {
    Routed::ToolCall(ToolCall {
        name: name.into(),
        arguments: args.into(),
    })
}
