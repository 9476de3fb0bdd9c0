//! Splitting a model's answer, as it streams, into what an OpenAI client expects: visible
//! `content`, `reasoning_content` and `tool_calls`, in the format of the model's family.
//!
//! Text is pushed as it is decoded. A marker split across pushes (`<tool_` + `call>`) is held
//! back until it is decided, so no partial tag ever reaches the client. Anything that looks like
//! a call but does not parse is given back as content, markers included: never dropped.
//!
//! Two grammars cover the families: [`tagged`] (a `<think>` block, then content with calls
//! opened by a marker: Hermes, Llama 3, Mistral, DeepSeek V3/R1/V3.1, GLM 4.5, Qwen3-Coder) and
//! [`harmony`] (gpt-oss: every message has a header naming its channel and recipient).
//! [`parse`] turns one call's text into a [`ToolCall`] for each format.

mod harmony;
mod parse;
mod tagged;

#[cfg(test)]
mod testing;

/// How a family writes tool calls (and, for harmony, its whole answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ToolFormat {
    /// `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Qwen 2.5/3, Hermes).
    #[default]
    Hermes,
    /// A bare JSON object `{"name": ..., "parameters": {...}}`, optionally after
    /// `<|python_tag|>` (Llama 3.1+).
    Llama3Json,
    /// `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` (Mistral).
    Mistral,
    /// gpt-oss's harmony messages: `<|channel|>analysis<|message|>...<|end|>` is reasoning,
    /// `final` is content, a `commentary` message to `functions.NAME` is a call.
    Harmony,
    /// `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```
    /// <｜tool▁call▁end｜>...<｜tool▁calls▁end｜>` (DeepSeek V3, R1).
    DeepSeekV3,
    /// `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>...`
    /// (DeepSeek V3.1). The router reads both DeepSeek shapes; the two differ in the opening
    /// a forced call is given.
    DeepSeekV31,
    /// `<tool_call>NAME\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>...</tool_call>`
    /// (GLM 4.5/4.6).
    Glm45,
    /// `<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...</function>\n</tool_call>`
    /// (Qwen3-Coder, Qwen3.5).
    Qwen3Coder,
}

pub(crate) const HARMONY_CHANNEL: &str = "<|channel|>";
pub(crate) const DEEPSEEK_CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";

impl ToolFormat {
    /// The format a chat template asks for; Hermes when the template shows no other. GLM,
    /// Qwen3-Coder and Hermes all open calls with `<tool_call>`: GLM's templates are the ones
    /// that write `<arg_key>`, Qwen3-Coder's the ones that write `<function=` and `<parameter=`
    /// (llama.cpp tells them apart the same way).
    pub fn detect(template_source: &str) -> ToolFormat {
        let has = |s: &str| template_source.contains(s);
        if has(HARMONY_CHANNEL) {
            ToolFormat::Harmony
        } else if has(DEEPSEEK_CALLS_BEGIN) {
            // V3 and R1 wrap the arguments in a ```json fence; V3.1 writes them bare.
            if has("```json") {
                ToolFormat::DeepSeekV3
            } else {
                ToolFormat::DeepSeekV31
            }
        } else if has("<arg_key>") {
            ToolFormat::Glm45
        } else if has("<function=") && has("<parameter=") {
            ToolFormat::Qwen3Coder
        } else if has(tagged::MISTRAL_OPEN) {
            ToolFormat::Mistral
        } else if has(tagged::PYTHON_TAG) || has("<|start_header_id|>") {
            ToolFormat::Llama3Json
        } else {
            ToolFormat::Hermes
        }
    }

    /// Whether a model of this format and template may leave out the `<tool_call>` before a
    /// call: Qwen3-Coder's templates (no `<think>`; Qwen3.5's think and do not need this).
    pub fn may_omit_call_tag(self, template_source: &str) -> bool {
        self == ToolFormat::Qwen3Coder && !template_source.contains("<think>")
    }
}

/// What the router looks for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RouterConfig {
    pub format: ToolFormat,
    /// Names of the declared tools. Empty: tool calls are not parsed at all (no tools, or
    /// `tool_choice: "none"`).
    pub tools: Vec<String>,
    /// The rendered prompt already opened a `<think>` block, so the answer starts inside it.
    pub in_think: bool,
    /// Declared parameters whose schema allows a string, as (tool, parameter). Formats that
    /// write argument values as bare text (GLM's `<arg_value>`, Qwen3-Coder's `<parameter=>`)
    /// keep these as text and read the others as JSON where they parse, as llama.cpp does.
    pub string_params: Vec<(String, String)>,
    /// Qwen3-Coder: `<function=NAME>` of a declared tool opens a call even without the
    /// `<tool_call>` before it, which Qwen3-Coder models sometimes leave out (llama.cpp accepts
    /// it too, for the Qwen3-Coder templates only: those without `<think>`). See
    /// [`ToolFormat::may_omit_call_tag`].
    pub bare_function_calls: bool,
}

impl RouterConfig {
    /// The declared parameters of `tools` (OpenAI declarations) whose schema allows a string:
    /// `type` absent, `"string"`, or a list holding `"string"`.
    pub fn string_params_of(tools: &[serde_json::Value]) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for t in tools {
            let Some(name) = t.pointer("/function/name").and_then(|n| n.as_str()) else {
                continue;
            };
            let Some(props) = t.pointer("/function/parameters/properties").and_then(|p| p.as_object()) else {
                continue;
            };
            for (param, schema) in props {
                let may_be_string = match schema.get("type") {
                    None => true,
                    Some(serde_json::Value::String(s)) => s == "string",
                    Some(serde_json::Value::Array(a)) => a.iter().any(|v| v == "string"),
                    Some(_) => false,
                };
                if may_be_string {
                    out.push((name.to_string(), param.clone()));
                }
            }
        }
        out
    }
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

/// The streaming router. Feed it with [`OutputRouter::push`], then call
/// [`OutputRouter::finish`] once at the end.
#[derive(Debug, Clone)]
pub struct OutputRouter {
    inner: Inner,
}

#[derive(Debug, Clone)]
enum Inner {
    Tagged(tagged::TaggedRouter),
    Harmony(harmony::HarmonyRouter),
}

impl OutputRouter {
    pub fn new(cfg: RouterConfig) -> Self {
        let inner = match cfg.format {
            ToolFormat::Harmony => Inner::Harmony(harmony::HarmonyRouter::new(cfg)),
            _ => Inner::Tagged(tagged::TaggedRouter::new(cfg)),
        };
        OutputRouter { inner }
    }

    /// Route newly decoded text; returns what can be decided now.
    pub fn push(&mut self, text: &str) -> Vec<Routed> {
        match &mut self.inner {
            Inner::Tagged(r) => r.push(text),
            Inner::Harmony(r) => r.push(text),
        }
    }

    /// The end of the answer: route everything still held.
    pub fn finish(&mut self) -> Vec<Routed> {
        match &mut self.inner {
            Inner::Tagged(r) => r.finish(),
            Inner::Harmony(r) => r.finish(),
        }
    }
}

/// Adds `r` to `out` unless it is empty text.
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

/// The first of `markers` in `buf`: (position, marker).
fn find_first<'m>(buf: &str, markers: &[&'m str]) -> Option<(usize, &'m str)> {
    markers
        .iter()
        .filter_map(|m| buf.find(m).map(|i| (i, *m)))
        .min_by_key(|&(i, m)| (i, std::cmp::Reverse(m.len())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_tail_finds_partial_markers() {
        assert_eq!(held_tail("abc<tool", &["<tool_call>"]), 3);
        assert_eq!(held_tail("abc", &["<tool_call>"]), 3);
        assert_eq!(held_tail("abc<", &["<tool_call>"]), 3);
        assert_eq!(held_tail("<tool_call", &["<tool_call>"]), 0);
        assert_eq!(held_tail("é<", &["<x"]), "é".len());
        // A fullwidth marker cut inside its first character is still held whole.
        assert_eq!(held_tail("ab<｜tool", &[DEEPSEEK_CALLS_BEGIN]), 2);
    }

    /// The templates llama.cpp ships for each family (copied to `tests/golden/templates`).
    #[test]
    fn detects_formats_from_templates() {
        assert_eq!(ToolFormat::detect("{{ '<tool_call>' }}"), ToolFormat::Hermes);
        assert_eq!(ToolFormat::detect("[TOOL_CALLS] {{ x }}"), ToolFormat::Mistral);
        assert_eq!(ToolFormat::detect("<|start_header_id|>"), ToolFormat::Llama3Json);
        let golden = |f: &str| {
            let path = format!("{}/tests/golden/templates/{f}", env!("CARGO_MANIFEST_DIR"));
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
        };
        assert_eq!(
            ToolFormat::detect(&golden("openai-gpt-oss-120b.jinja")),
            ToolFormat::Harmony
        );
        assert_eq!(
            ToolFormat::detect(&golden("deepseek-ai-DeepSeek-V3.1.jinja")),
            ToolFormat::DeepSeekV31
        );
        assert_eq!(
            ToolFormat::detect(&golden("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja")),
            ToolFormat::DeepSeekV3
        );
        // GLM opens calls with `<tool_call>` like Hermes.
        let glm = golden("GLM-4.6.jinja");
        assert!(glm.contains("<tool_call>"));
        assert_eq!(ToolFormat::detect(&glm), ToolFormat::Glm45);
        // So do Qwen3-Coder's and Qwen3.5's, which write `<function=` and `<parameter=`.
        for f in ["Qwen3-Coder.jinja", "Qwen3.5-4B.jinja"] {
            let qwen = golden(f);
            assert!(qwen.contains("<tool_call>"), "{f}");
            assert_eq!(ToolFormat::detect(&qwen), ToolFormat::Qwen3Coder, "{f}");
        }
    }

    #[test]
    fn string_params_follow_the_schema_types() {
        let tools = serde_json::json!([{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {
                "s": {"type": "string"}, "n": {"type": "integer"}, "o": {"type": "object"},
                "either": {"type": ["string", "null"]}, "any": {}, "list": {"type": ["array", "null"]}}}}}]);
        let mut got = RouterConfig::string_params_of(tools.as_array().unwrap());
        got.sort();
        let want: Vec<(String, String)> = ["any", "either", "s"]
            .iter()
            .map(|p| ("f".to_string(), p.to_string()))
            .collect();
        assert_eq!(got, want);
    }
}
