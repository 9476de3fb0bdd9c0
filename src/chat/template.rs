//! Rendering a model's Jinja chat template the way Hugging Face's Python `jinja2` does.
//!
//! Templates come from untrusted GGUF files, so every render runs under three limits: a budget
//! of instructions and of the data the template makes (minijinja fuel), a recursion limit, and
//! caps on `range` and on the output size. Each produces a [`TemplateError`] naming the limit.

use super::fallback::Family;
use super::{json, TemplateError};
use crate::gguf::GgufFile;
use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Rest, Serde};
use minijinja::{Environment, Error, ErrorKind, State, Value};
use std::io;

/// Template variables the renderer sets from the request and the model; `chat_template_kwargs`
/// may not override them.
pub const RESERVED_VARIABLES: [&str; 5] = ["messages", "tools", "add_generation_prompt", "bos_token", "eos_token"];

/// Fuel per render (minijinja's budget: one unit per instruction and about one per 64 bytes of
/// data the template makes, so it bounds time and memory alike, near 128 MB): a 2000-message
/// conversation through the Qwen template fits (tested), while a runaway loop or a string
/// doubled in a loop stops within a fraction of a second.
pub const FUEL: u64 = 2_000_000;
/// Recursion limit (minijinja counts a few units per macro call, one per loop or `if`).
pub const RECURSION_LIMIT: usize = 200;
/// Largest rendered prompt, in bytes (far beyond any context window).
pub const MAX_OUTPUT_BYTES: usize = 16 << 20;
/// Largest `range(...)`, in items.
pub const MAX_RANGE_ITEMS: usize = 100_000;

/// Name under which the template is stored in its environment; no extension, so no
/// auto-escaping.
const NAME: &str = "chat_template";

/// Inputs of one render.
#[derive(Debug, Clone, Copy)]
pub struct RenderRequest<'a> {
    /// OpenAI-style messages (`role`, `content` as a string or a list of parts, `tool_calls`...).
    pub messages: &'a [serde_json::Value],
    /// OpenAI-style tool declarations.
    pub tools: Option<&'a [serde_json::Value]>,
    /// Append the header of the assistant's turn.
    pub add_generation_prompt: bool,
    /// Extra template variables, e.g. `enable_thinking`.
    pub kwargs: &'a serde_json::Map<String, serde_json::Value>,
}

/// A compiled chat template plus the special-token texts it may reference.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
    fallback: bool,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_bytes", &self.source.len())
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("fallback", &self.fallback)
            .finish()
    }
}

impl ChatTemplate {
    /// The GGUF's `tokenizer.chat_template`, or the built-in template of its family when it has
    /// none. `bos_token`/`eos_token` are the texts of the vocabulary entries named by
    /// `tokenizer.ggml.bos_token_id`/`eos_token_id` (empty when absent).
    pub fn from_gguf(file: &GgufFile) -> Result<Self, TemplateError> {
        let tokens = file
            .get("tokenizer.ggml.tokens")
            .map(|_| file.get_array("tokenizer.ggml.tokens"))
            .transpose()?;
        let token_text = |key: &str| -> Result<String, TemplateError> {
            let Some(id) = file.opt(key, GgufFile::get_u32)? else {
                return Ok(String::new());
            };
            let text = tokens.and_then(|t| t.items.get(id as usize)).and_then(|v| v.as_str());
            Ok(text.unwrap_or_default().to_string())
        };
        let bos = token_text("tokenizer.ggml.bos_token_id")?;
        let eos = token_text("tokenizer.ggml.eos_token_id")?;
        match optional_str(file, "tokenizer.chat_template")? {
            Some(src) if !src.trim().is_empty() => Self::from_source(src, &bos, &eos),
            _ => {
                let arch = optional_str(file, "general.architecture")?.unwrap_or_default();
                let has_token = |t: &str| tokens.is_some_and(|a| a.items.iter().any(|v| v.as_str() == Some(t)));
                Ok(Self::fallback(Family::detect(arch, has_token), &bos, &eos))
            }
        }
    }

    /// Compiles `source`; a syntax error names its line.
    pub fn from_source(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, TemplateError> {
        let mut env = environment();
        env.add_template_owned(NAME, source.to_string())
            .map_err(convert_error)?;
        Ok(Self {
            env,
            source: source.to_string(),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            fallback: false,
        })
    }

    /// The built-in template of `family`.
    pub fn fallback(family: Family, bos_token: &str, eos_token: &str) -> Self {
        let mut env = environment();
        let source = family.source();
        // The built-in sources are constants covered by tests, so compiling them cannot fail at
        // run time; should it ever, the render reports the missing template instead of panicking.
        let _ = env.add_template(NAME, source);
        Self {
            env,
            source: source.to_string(),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            fallback: true,
        }
    }

    /// The template text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether this is a built-in template rather than the file's own.
    pub fn is_fallback(&self) -> bool {
        self.fallback
    }

    /// The BOS token text the template sees as `bos_token`.
    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    /// The EOS token text the template sees as `eos_token`.
    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    /// Renders the conversation into the prompt text. Extra variables (`kwargs`) may not name
    /// the ones the request sets ([`RESERVED_VARIABLES`]).
    pub fn render(&self, req: &RenderRequest) -> Result<String, TemplateError> {
        let mut ctx = serde_json::Map::new();
        ctx.insert("bos_token".into(), self.bos_token.clone().into());
        ctx.insert("eos_token".into(), self.eos_token.clone().into());
        for (k, v) in req.kwargs {
            // The request's own variables would silently replace these: refuse instead.
            if RESERVED_VARIABLES.contains(&k.as_str()) {
                return Err(TemplateError::ReservedKwarg { name: k.clone() });
            }
            ctx.insert(k.clone(), v.clone());
        }
        let harmony = self.source.contains("<|channel|>");
        let messages: Vec<serde_json::Value> = req
            .messages
            .iter()
            .map(normalize_message)
            .map(|m| if harmony { harmony_message(m) } else { m })
            .collect();
        ctx.insert("messages".into(), messages.into());
        ctx.insert(
            "tools".into(),
            req.tools.map_or(serde_json::Value::Null, |t| t.to_vec().into()),
        );
        ctx.insert("add_generation_prompt".into(), req.add_generation_prompt.into());

        let tmpl = self.env.get_template(NAME).map_err(convert_error)?;
        let mut out = CappedWriter {
            buf: Vec::new(),
            limit: MAX_OUTPUT_BYTES,
        };
        tmpl.render_captured_to(Value::from(Serde(&ctx)), &mut out)
            .map_err(convert_error)?;
        // Writes are capped as they happen; `{% set %}` captures bypass the writer, so check again.
        if out.buf.len() > MAX_OUTPUT_BYTES {
            return Err(TemplateError::OutputTooLarge {
                limit: MAX_OUTPUT_BYTES,
            });
        }
        String::from_utf8(out.buf).map_err(|e| TemplateError::Render {
            line: None,
            detail: e.to_string(),
        })
    }
}

/// A string key that may be absent (`GgufFile::opt` cannot return borrows).
fn optional_str<'a>(file: &'a GgufFile, key: &str) -> Result<Option<&'a str>, TemplateError> {
    Ok(file.get(key).map(|_| file.get_str(key)).transpose()?)
}

/// The environment with Hugging Face's settings and helpers.
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_syntax(
        SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()
            .expect("the default delimiters"),
    );
    env.set_fuel(Some(FUEL));
    env.set_recursion_limit(RECURSION_LIMIT);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_formatter(python_formatter);
    env.add_filter("tojson", tojson);
    env.add_test("iterable", is_iterable);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env.add_function("range", range);
    env
}

/// `is iterable` as Python answers it: `None` is not (minijinja iterates over it as over an
/// empty list). Qwen3-Coder's template asks `tools is iterable` when no tools are given.
fn is_iterable(value: &Value) -> bool {
    !value.is_none() && value.try_iter().is_ok()
}

/// Prints `None`, `True` and `False` as Python does; everything else as minijinja does.
fn python_formatter(out: &mut minijinja::Output, state: &mut State, value: &Value) -> Result<(), Error> {
    let text = if value.is_none() {
        "None"
    } else if value.kind() == minijinja::value::ValueKind::Bool {
        if value.is_true() {
            "True"
        } else {
            "False"
        }
    } else {
        return minijinja::escape_formatter(out, state, value);
    };
    out.write_str(text).map_err(Error::from)
}

/// `tojson` as Hugging Face defines it: `json.dumps(value, ensure_ascii=False, indent=indent)`.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    // transformers' signature: tojson(x, ensure_ascii=False, indent=None, separators=None,
    // sort_keys=False); `separators` is not supported and fails as an unknown argument.
    let indent: Option<Value> = kwargs.get("indent")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match (v.as_i64(), v.as_str()) {
            (Some(n), _) => Some(" ".repeat(n.clamp(0, 64) as usize)),
            (None, Some(s)) => Some(s.to_string()),
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be an integer or a string",
                ))
            }
        },
    };
    let serialization = |e: serde_json::Error| Error::new(ErrorKind::BadSerialization, format!("tojson: {e}"));
    let mut text = if sort_keys == Some(true) {
        let v = serde_json::to_value(&value).map_err(serialization)?;
        json::dumps(&sorted_keys(v), indent.as_deref())
    } else {
        json::dumps(&value, indent.as_deref())
    }
    .map_err(serialization)?;
    if ensure_ascii == Some(true) {
        text = ascii_escaped(&text);
    }
    Ok(Value::from_safe_string(text))
}

/// Objects with their keys in sorted order, all the way down (`sort_keys=True`).
fn sorted_keys(v: serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Object(map) => {
            let mut items: Vec<(String, serde_json::Value)> = map.into_iter().collect();
            items.sort_by(|a, b| a.0.cmp(&b.0));
            serde_json::Value::Object(items.into_iter().map(|(k, v)| (k, sorted_keys(v))).collect())
        }
        serde_json::Value::Array(a) => serde_json::Value::Array(a.into_iter().map(sorted_keys).collect()),
        other => other,
    }
}

/// Python's `ensure_ascii=True`: every non-ASCII character as `\uXXXX` (UTF-16 units). In
/// JSON text they can only stand inside strings, so escaping the whole text is exact.
fn ascii_escaped(text: &str) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                let _ = write!(out, "\\u{u:04x}");
            }
        }
    }
    out
}

/// Marks an error raised by the template itself, so the message can be reported as is.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Raised(String);

/// Marks a `range` over the item cap.
#[derive(Debug, thiserror::Error)]
#[error("range of {len} items exceeds the limit of {limit}")]
struct RangeLimit {
    len: u128,
    limit: usize,
}

fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg.clone()).with_source(Raised(msg)))
}

/// `strftime_now(fmt)`: the local time formatted with a strftime pattern (bad patterns are an
/// error, not a panic).
fn strftime_now(fmt: String) -> Result<Value, Error> {
    use std::fmt::Write;
    let items = chrono::format::StrftimeItems::new(&fmt)
        .parse()
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("strftime_now({fmt:?}): {e}")))?;
    let mut text = String::new();
    write!(text, "{}", chrono::Local::now().format_with_items(items.iter())).map_err(|_| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now({fmt:?}): cannot format"),
        )
    })?;
    Ok(Value::from(text))
}

/// Python's `range(stop)`, `range(start, stop[, step])`, refusing more than
/// [`MAX_RANGE_ITEMS`] items before anything is allocated.
fn range(args: Rest<i64>) -> Result<Value, Error> {
    let (start, stop, step) = match args.as_slice() {
        [stop] => (0, *stop, 1),
        [start, stop] => (*start, *stop, 1),
        [start, stop, step] => (*start, *stop, *step),
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "range expects 1 to 3 integer arguments",
            ))
        }
    };
    if step == 0 {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "range() arg 3 must not be zero",
        ));
    }
    let (start, stop, step) = (i128::from(start), i128::from(stop), i128::from(step));
    let span = if step > 0 { stop - start } else { start - stop };
    let len = if span <= 0 {
        0
    } else {
        ((span - 1) / step.abs() + 1) as u128
    };
    if len > MAX_RANGE_ITEMS as u128 {
        let limit = RangeLimit {
            len,
            limit: MAX_RANGE_ITEMS,
        };
        return Err(Error::new(ErrorKind::InvalidOperation, limit.to_string()).with_source(limit));
    }
    // `len` is at most MAX_RANGE_ITEMS, so every item fits an i64 and the cast is exact.
    let items: Vec<i64> = (0..len as i128).map(|i| (start + i * step) as i64).collect();
    Ok(Value::from(items))
}

/// Message normalization done by llama.cpp before rendering: tool-call `arguments` given as
/// JSON strings become objects, and content given as a list of parts becomes the text parts
/// joined by newlines.
fn normalize_message(msg: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value as J;
    let mut msg = msg.clone();
    let Some(obj) = msg.as_object_mut() else { return msg };
    if let Some(J::Array(parts)) = obj.get("content") {
        let texts: Vec<&str> = parts
            .iter()
            .filter(|p| p.get("type").and_then(J::as_str) == Some("text"))
            .filter_map(|p| p.get("text").and_then(J::as_str))
            .collect();
        let joined = texts.join("\n");
        obj.insert("content".into(), joined.into());
    }
    if let Some(J::Array(calls)) = obj.get_mut("tool_calls") {
        for call in calls {
            let args = match call.get_mut("function") {
                Some(f) => f.get_mut("arguments"),
                None => call.get_mut("arguments"),
            };
            if let Some(args) = args {
                if let Some(parsed) = args.as_str().and_then(|s| serde_json::from_str::<J>(s).ok()) {
                    *args = parsed;
                }
            }
        }
    }
    msg
}

/// gpt-oss's template reads an assistant's reasoning from `thinking`; clients send it back as
/// `reasoning_content`. llama.cpp (`common/parsers/gpt-oss.cpp`) copies it over and, for a
/// message with tool calls, drops `content` (the template refuses both at once); so do we.
fn harmony_message(mut msg: serde_json::Value) -> serde_json::Value {
    let Some(obj) = msg.as_object_mut() else { return msg };
    let Some(reasoning) = obj.get("reasoning_content").filter(|r| r.is_string()).cloned() else {
        return msg;
    };
    obj.insert("thinking".into(), reasoning);
    let has_calls = obj
        .get("tool_calls")
        .and_then(|c| c.as_array())
        .is_some_and(|c| !c.is_empty());
    if has_calls {
        obj.remove("content");
    }
    msg
}

/// Collects the output and fails the render once it passes `limit` bytes.
struct CappedWriter {
    buf: Vec<u8>,
    limit: usize,
}

impl io::Write for CappedWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.len() + data.len() > self.limit {
            return Err(io::Error::other("chat template output limit reached"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Maps a minijinja error to the limit or message it stands for.
fn convert_error(err: Error) -> TemplateError {
    let mut source = std::error::Error::source(&err);
    while let Some(e) = source {
        if let Some(Raised(msg)) = e.downcast_ref::<Raised>() {
            return TemplateError::Raised(msg.clone());
        }
        if let Some(r) = e.downcast_ref::<RangeLimit>() {
            return TemplateError::RangeTooLarge {
                len: r.len,
                limit: r.limit,
            };
        }
        source = e.source();
    }
    let detail = match err.detail() {
        Some(d) => format!("{}: {d}", err.kind()),
        None => err.kind().to_string(),
    };
    match err.kind() {
        ErrorKind::OutOfFuel => TemplateError::OutOfFuel { fuel: FUEL },
        ErrorKind::WriteFailure => TemplateError::OutputTooLarge {
            limit: MAX_OUTPUT_BYTES,
        },
        ErrorKind::SyntaxError => TemplateError::Syntax {
            line: err.line().unwrap_or(0),
            detail,
        },
        _ if detail.contains("recursion limit") => TemplateError::RecursionLimit { limit: RECURSION_LIMIT },
        _ => TemplateError::Render {
            line: err.line(),
            detail,
        },
    }
}
