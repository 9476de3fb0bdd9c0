//! The fuzz targets' bodies, one function per untrusted-input surface. Shared by the libFuzzer
//! binaries (`fuzz/fuzz_targets/<name>.rs`, nightly, `scripts/fuzz.sh`) and the corpus replay
//! test (`tests/fuzz_corpus.rs`, stable), which runs every seed of `fuzz/corpus/<name>/` and
//! every crash input of `fuzz/regressions/<name>/` through the same function.
//!
//! Each function takes arbitrary bytes and must return: a malformed input is an error value,
//! never a panic, a hang or an allocation sized by an untrusted number. Where the engine
//! promises more than "no panic" (a stream parser that agrees with the file parser, a router
//! whose answer does not depend on how the text was chunked, a stream decoder that agrees with
//! the whole decoder) the function asserts it, so a broken promise is a crash too.
//!
//! Fixed inputs (tokenizers, templates) come from files already in the repository, embedded
//! with `include_bytes!`/`include_str!` (paths relative to this file, so both crates find
//! them) and built once.

#![allow(dead_code)]

use std::sync::{Arc, OnceLock};

use serde_json::{json, Map, Value as Json};
use tinyllm::chat::router::{OutputRouter, Routed, RouterConfig, ToolFormat};
use tinyllm::chat::tools::{forced_call_opening, ToolChoice};
use tinyllm::chat::{ChatTemplate, Family, RenderRequest};
use tinyllm::gguf::stream::GgufStream;
use tinyllm::gguf::{GgufError, GgufFile, TensorView, Value};
use tinyllm::grammar::{tool_call_grammar, AnswerFormat, Constraint, Grammars, LazyCalls, Watch};
use tinyllm::openai::request::{ApplyTemplateRequest, DetokenizeRequest, TokenizeRequest};
use tinyllm::openai::{parse_body, GenRequest};
use tinyllm::tokenizer::Tokenizer;

/// The random-weight fixture whose vocabulary (byte-level BPE, 384 tokens, `qwen2`
/// pre-tokenizer, ChatML specials) and chat template the tokenizer, grammar and template
/// targets use.
const BPE_FIXTURE: &[u8] = include_bytes!("../tests/golden/fixtures/qwen2.Q4_K_M.gguf");

/// Chat templates of real models (llama.cpp's copies) rendered with hostile messages.
const GOLDEN_TEMPLATES: [&str; 6] = [
    include_str!("../tests/golden/templates/openai-gpt-oss-120b.jinja"),
    include_str!("../tests/golden/templates/deepseek-ai-DeepSeek-V3.1.jinja"),
    include_str!("../tests/golden/templates/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"),
    include_str!("../tests/golden/templates/GLM-4.6.jinja"),
    include_str!("../tests/golden/templates/Qwen3-Coder.jinja"),
    include_str!("../tests/golden/templates/Qwen3.5-4B.jinja"),
];

const FORMATS: [ToolFormat; 8] = [
    ToolFormat::Hermes,
    ToolFormat::Llama3Json,
    ToolFormat::Mistral,
    ToolFormat::Harmony,
    ToolFormat::DeepSeekV3,
    ToolFormat::DeepSeekV31,
    ToolFormat::Glm45,
    ToolFormat::Qwen3Coder,
];

/// Tool declarations for the targets whose input is only text.
fn fixed_tools() -> Vec<Json> {
    vec![
        json!({"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"]}}}),
        json!({"type": "function", "function": {"name": "search", "parameters": {
            "type": "object", "properties": {"query": {"type": "string"}, "n": {"type": ["integer", "null"]}}}}}),
    ]
}

// ---------------------------------------------------------------------------------------------
// Fixed inputs, built once.

/// A GGUF file of metadata only (no tensors), as a tokenizer or template needs it.
fn metadata_gguf(metadata: &[(String, Value)]) -> Vec<u8> {
    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }
    fn value(out: &mut Vec<u8>, v: &Value) {
        match v {
            Value::U8(x) => out.push(*x),
            Value::I8(x) => out.extend(x.to_le_bytes()),
            Value::U16(x) => out.extend(x.to_le_bytes()),
            Value::I16(x) => out.extend(x.to_le_bytes()),
            Value::U32(x) => out.extend(x.to_le_bytes()),
            Value::I32(x) => out.extend(x.to_le_bytes()),
            Value::F32(x) => out.extend(x.to_le_bytes()),
            Value::Bool(x) => out.push(u8::from(*x)),
            Value::String(s) => string(out, s),
            Value::Array(a) => {
                out.extend((a.elem as u32).to_le_bytes());
                out.extend((a.items.len() as u64).to_le_bytes());
                for item in &a.items {
                    value(out, item);
                }
            }
            Value::U64(x) => out.extend(x.to_le_bytes()),
            Value::I64(x) => out.extend(x.to_le_bytes()),
            Value::F64(x) => out.extend(x.to_le_bytes()),
        }
    }
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend(0u64.to_le_bytes());
    out.extend((metadata.len() as u64).to_le_bytes());
    for (key, v) in metadata {
        string(&mut out, key);
        out.extend((v.value_type() as u32).to_le_bytes());
        value(&mut out, v);
    }
    out
}

fn str_array(items: &[&str]) -> Value {
    Value::Array(tinyllm::gguf::Array {
        elem: tinyllm::gguf::ValueType::String,
        items: items.iter().map(|s| Value::String(s.to_string())).collect(),
    })
}

fn array_of(elem: tinyllm::gguf::ValueType, items: Vec<Value>) -> Value {
    Value::Array(tinyllm::gguf::Array { elem, items })
}

/// The fixture's metadata (tokenizer keys, chat template).
fn bpe_metadata() -> &'static [(String, Value)] {
    static META: OnceLock<Vec<(String, Value)>> = OnceLock::new();
    META.get_or_init(|| {
        let file = GgufFile::from_bytes(BPE_FIXTURE.to_vec()).expect("the qwen2 fixture parses");
        file.metadata().to_vec()
    })
}

/// A SentencePiece vocabulary: `<unk>`, `<s>`, `</s>`, the 256 byte tokens, pieces scored by
/// rank, and control, user-defined and unused tokens.
fn spm_metadata(add_space_prefix: bool) -> Vec<(String, Value)> {
    use tinyllm::gguf::ValueType as T;
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types: Vec<i32> = vec![2, 3, 3];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    let mut pieces: Vec<String> = vec!["\u{2581}".into()];
    pieces.extend((b'!'..=b'~').map(|c| (c as char).to_string()));
    // Pieces, `_` standing for U+2581 (SentencePiece's space).
    let words = "_t he _a _the in er an _s on re _w at en ou _o it is ing _i _c _of _and _to ll _he _hel hello \
                 _hello lo wor world _world __ ____ é ü 日 本 日本 語 _日本語 🙂 ß Ω 12 123 _1";
    pieces.extend(words.split_whitespace().map(|w| w.replace('_', "\u{2581}")));
    pieces.extend(["\n".to_string(), "\t".to_string()]);
    let n_pieces = pieces.len();
    tokens.extend(pieces);
    types.extend(std::iter::repeat_n(1, n_pieces));
    for (t, ty) in [
        ("<start_of_turn>", 3),
        ("<end_of_turn>", 3),
        ("<mask>", 4),
        ("<unused0>", 5),
        ("<eot>", 3),
    ] {
        tokens.push(t.into());
        types.push(ty);
    }
    let scores: Vec<Value> = (0..tokens.len()).map(|i| Value::F32(-(i as f32))).collect();
    let token_refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
    vec![
        ("general.architecture".into(), Value::String("gemma3".into())),
        ("tokenizer.ggml.model".into(), Value::String("llama".into())),
        ("tokenizer.ggml.tokens".into(), str_array(&token_refs)),
        ("tokenizer.ggml.scores".into(), array_of(T::F32, scores)),
        (
            "tokenizer.ggml.token_type".into(),
            array_of(T::I32, types.into_iter().map(Value::I32).collect()),
        ),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(1)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(2)),
        ("tokenizer.ggml.unknown_token_id".into(), Value::U32(0)),
        ("tokenizer.ggml.add_space_prefix".into(), Value::Bool(add_space_prefix)),
    ]
}

/// Every pre-tokenizer family `tokenizer.ggml.pre` selects (`None`: the key absent).
const BPE_PRES: [Option<&str>; 11] = [
    Some("qwen2"),
    None,
    Some("llama3"),
    Some("dbrx"),
    Some("deepseek-llm"),
    Some("deepseek-coder"),
    Some("deepseek-v3"),
    Some("tekken"),
    Some("starcoder"),
    Some("falcon"),
    Some("chatglm-bpe"),
];

/// The tokenizers fuzzed: the fixture's BPE vocabulary under every pre-tokenizer, then
/// SentencePiece with and without the space prefix. Index 0 is the fixture as it is.
fn tokenizers() -> &'static [Arc<Tokenizer>] {
    static TOKS: OnceLock<Vec<Arc<Tokenizer>>> = OnceLock::new();
    TOKS.get_or_init(|| {
        let mut out = Vec::new();
        for pre in BPE_PRES {
            let mut meta: Vec<(String, Value)> = bpe_metadata()
                .iter()
                .filter(|(k, _)| k != "tokenizer.ggml.pre")
                .cloned()
                .collect();
            if let Some(p) = pre {
                meta.push(("tokenizer.ggml.pre".into(), Value::String(p.into())));
            }
            out.push(tokenizer_of(&meta));
        }
        for prefix in [true, false] {
            out.push(tokenizer_of(&spm_metadata(prefix)));
        }
        out
    })
}

fn tokenizer_of(meta: &[(String, Value)]) -> Arc<Tokenizer> {
    let file = GgufFile::from_bytes(metadata_gguf(meta)).expect("a fixed tokenizer GGUF parses");
    Arc::new(Tokenizer::from_gguf(&file).expect("a fixed tokenizer loads"))
}

/// Whether tokenizer `i` is byte-level BPE (text survives encode then decode unchanged).
fn is_byte_level(i: usize) -> bool {
    i < BPE_PRES.len()
}

/// Grammar compilers over the BPE fixture's vocabulary and the SentencePiece one.
fn grammars() -> &'static [Arc<Grammars>] {
    static G: OnceLock<Vec<Arc<Grammars>>> = OnceLock::new();
    G.get_or_init(|| {
        let toks = tokenizers();
        vec![
            Arc::new(Grammars::new(Arc::clone(&toks[0]))),
            Arc::new(Grammars::new(Arc::clone(&toks[BPE_PRES.len()]))),
        ]
    })
}

/// The chat templates rendered with hostile messages: real models' templates, the fixture's,
/// and the built-in fallbacks.
fn fixed_templates() -> &'static [ChatTemplate] {
    static T: OnceLock<Vec<ChatTemplate>> = OnceLock::new();
    T.get_or_init(|| {
        let mut out: Vec<ChatTemplate> = GOLDEN_TEMPLATES
            .iter()
            .map(|src| ChatTemplate::from_source(src, "<s>", "</s>").expect("a golden template compiles"))
            .collect();
        let file = GgufFile::from_bytes(metadata_gguf(bpe_metadata())).expect("the fixture metadata parses");
        out.push(ChatTemplate::from_gguf(&file).expect("the fixture's template compiles"));
        for family in [Family::Gemma, Family::ChatMl, Family::Llama3, Family::Mistral] {
            out.push(ChatTemplate::fallback(family, "<bos>", "<eos>"));
        }
        out
    })
}

// ---------------------------------------------------------------------------------------------
// Helpers.

/// Reads the input front to back; past its end every read gives zeros.
struct Bytes<'a> {
    data: &'a [u8],
}

impl<'a> Bytes<'a> {
    fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((b, rest)) => {
                self.data = rest;
                *b
            }
            None => 0,
        }
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.data)
    }
}

/// A small deterministic generator for chunk sizes and choices.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*; a zero state is moved off zero.
        if self.0 == 0 {
            self.0 = 0x9E37_79B9_7F4A_7C15;
        }
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Dequantize a tensor when it is small (the bytes are in the input, the element count is
/// bounded by them; the cap keeps one input fast).
fn touch_tensor(view: &TensorView<'_>) {
    assert_eq!(
        view.data.len() as u64,
        view.info.bytes,
        "tensor '{}' view length",
        view.info.name
    );
    if view.info.elements() <= 1 << 16 {
        let _ = view.to_f32();
    }
}

/// Everything a loader reads from a parsed file: metadata accessors, tensor views, the
/// tokenizer and chat template it describes.
fn use_file(file: &GgufFile) {
    for (key, v) in file.metadata() {
        let _ = (
            v.to_string(),
            v.to_json(),
            v.type_description(),
            v.as_integer(),
            v.as_f64(),
        );
        let _ = (
            file.get_u32(key),
            file.get_f32(key),
            file.get_bool(key),
            file.get_str(key),
        );
        let _ = (
            file.get_str_array(key),
            file.get_f32_array(key),
            file.get_i64_array(key),
        );
    }
    let _ = file.architecture();
    if file.is_resident() {
        for info in file.tensors() {
            let view = file.tensor(&info.name).expect("a listed tensor has a view");
            touch_tensor(&view);
        }
    }
    if let Ok(tok) = Tokenizer::from_gguf(file) {
        let ids = tok.encode("Hello world <|im_start|> 日本 \u{1F642}", true, true);
        let _ = tok.decode(&ids);
        let _ = tok.decode(&[0, 1, 2, u32::MAX]);
    }
    if let Ok(tmpl) = ChatTemplate::from_gguf(file) {
        let messages = [json!({"role": "user", "content": "hi"})];
        let _ = tmpl.render(&RenderRequest {
            messages: &messages,
            tools: None,
            add_generation_prompt: true,
            kwargs: &Map::new(),
        });
    }
}

// ---------------------------------------------------------------------------------------------
// Targets.

/// A whole GGUF file held in memory: the header parser, tensor bounds, dequantization of the
/// tensors, and the tokenizer and chat template the metadata describes.
pub fn gguf(data: &[u8]) {
    if let Ok(file) = GgufFile::from_bytes(data.to_vec()) {
        use_file(&file);
    }
}

/// A GGUF file read as it streams in: `data[0]` seeds the chunk sizes, `data[1]` picks their
/// range and whether the announced length lies (`data[2..10]` more than the bytes sent); the
/// file is `data[10..]`. The streamed result must agree with [`GgufFile::from_bytes`].
pub fn gguf_stream(data: &[u8]) {
    let mut b = Bytes { data };
    let seed = b.u8();
    let mode = b.u8();
    let extra = u64::from_le_bytes(std::array::from_fn(|_| b.u8()));
    let file = b.rest();
    // Chunk sizes from 1 byte to the whole file.
    let max_chunk = [1usize, 2, 3, 7, 16, 100, 4096, usize::MAX][usize::from(mode & 7)];
    // Half the inputs announce a length past the bytes that arrive (a lying Content-Length).
    let lie = mode & 0x08 != 0;
    let announced = if lie {
        (file.len() as u64).saturating_add(extra >> (mode >> 4))
    } else {
        file.len() as u64
    };
    let mut rng = Rng(u64::from(seed) + 1);
    let mut stream = GgufStream::new(1).expect("one part");
    let mut tensors_seen = 0usize;
    let result = (|| -> Result<GgufFile, GgufError> {
        stream.begin(announced)?;
        let mut pos = 0;
        while pos < file.len() {
            let n = (1 + rng.below(max_chunk.min(file.len()))).min(file.len() - pos);
            let mut on_tensor = |view: TensorView<'_>| -> Result<(), GgufError> {
                tensors_seen += 1;
                touch_tensor(&view);
                Ok(())
            };
            stream.push(&file[pos..pos + n], &mut on_tensor)?;
            let _ = stream.metadata();
            assert_eq!(stream.received(), (pos + n) as u64);
            pos += n;
        }
        stream.finish()
    })();
    let whole = GgufFile::from_bytes(file.to_vec());
    match (&result, &whole) {
        (Ok(streamed), Ok(whole)) => {
            assert!(
                !lie || extra == 0 || announced == file.len() as u64,
                "a lying length was accepted"
            );
            assert_eq!(tensors_seen, whole.tensors().len(), "every tensor is handed out once");
            assert_eq!(streamed.metadata().len(), whole.metadata().len());
            for ((k1, v1), (k2, v2)) in streamed.metadata().iter().zip(whole.metadata()) {
                assert_eq!(k1, k2);
                assert_eq!(v1.to_string(), v2.to_string(), "metadata '{k1}'");
            }
            assert_eq!(streamed.tensors().len(), whole.tensors().len());
            for (a, b) in streamed.tensors().iter().zip(whole.tensors()) {
                assert_eq!(
                    (&a.name, a.ty, &a.shape, a.offset, a.bytes),
                    (&b.name, b.ty, &b.shape, b.offset, b.bytes)
                );
            }
            assert_eq!(streamed.data_offset(0), whole.data_offset(0));
            assert!(!streamed.is_resident());
            use_file(streamed);
        }
        (Ok(_), Err(e)) => panic!("the stream accepted a file the file parser refuses: {e}"),
        (Err(e), Ok(_)) if !lie => {
            // The stream also refuses tensors whose data overlap; nothing else.
            assert!(
                e.to_string().contains("overlaps"),
                "the stream refused a good file: {e}"
            );
        }
        _ => {}
    }
}

/// Text to tokens and back. `data[0]` picks the tokenizer and the special-token switches; the
/// text is the rest (invalid UTF-8 replaced), and the rest again read as 16-bit ids (some past
/// the vocabulary) for the decoders.
pub fn tokenizer(data: &[u8]) {
    let toks = tokenizers();
    let mut b = Bytes { data };
    let sel = b.u8();
    let which = usize::from(sel & 0x0F) % toks.len();
    let add_special = sel & 0x10 != 0;
    let parse_special = sel & 0x20 != 0;
    let tok = &toks[which];
    let rest = b.rest();
    let text = String::from_utf8_lossy(rest);
    let n = tok.vocab_size();

    let ids = tok.encode(&text, add_special, parse_special);
    assert!(ids.iter().all(|&id| (id as usize) < n), "an id past the vocabulary");
    let decoded = tok.decode(&ids).expect("ids from encode decode");
    if is_byte_level(which) && !add_special {
        assert_eq!(decoded, text, "byte-level BPE round trip");
    }
    let chat = tok.encode_chat(&text);
    assert!(chat.iter().all(|&id| (id as usize) < n));

    // Arbitrary ids, a few past the vocabulary.
    let ids: Vec<u32> = rest
        .chunks(2)
        .map(|c| u32::from(u16::from_le_bytes([c[0], *c.get(1).unwrap_or(&0)])) % (n as u32 + 8))
        .collect();
    let whole = tok.decode(&ids);
    let mut stream = tok.stream_decoder();
    let mut streamed = String::new();
    let mut failed = false;
    for &id in &ids {
        match stream.push(id) {
            Ok(s) => streamed.push_str(&s),
            Err(_) => {
                failed = true;
                break;
            }
        }
    }
    streamed.push_str(&stream.finish());
    match whole {
        Ok(text) => {
            assert!(!failed, "the stream decoder refused ids the decoder took");
            assert_eq!(streamed, text, "stream decoder and decoder disagree");
        }
        Err(_) => assert!(failed, "the stream decoder took ids the decoder refused"),
    }
    for &id in ids.iter().take(64) {
        let _ = (
            tok.token_to_piece(id),
            tok.token_text(id),
            tok.is_control(id),
            tok.is_eog(id),
        );
    }
}

/// Messages for [`chat_template`]: JSON (a list of messages, an object with `messages`,
/// `tools` and `chat_template_kwargs`, or any value as one user message), else text split at
/// 0x01 into turns of cycling roles.
fn messages_of(bytes: &[u8]) -> (Vec<Json>, Option<Vec<Json>>, Map<String, Json>) {
    match serde_json::from_slice::<Json>(bytes) {
        Ok(Json::Array(messages)) => (messages, None, Map::new()),
        Ok(Json::Object(obj)) if obj.contains_key("messages") => {
            let messages = match obj.get("messages") {
                Some(Json::Array(m)) => m.clone(),
                Some(other) => vec![other.clone()],
                None => Vec::new(),
            };
            let tools = obj.get("tools").and_then(Json::as_array).cloned();
            let kwargs = obj
                .get("chat_template_kwargs")
                .and_then(Json::as_object)
                .cloned()
                .unwrap_or_default();
            (messages, tools, kwargs)
        }
        Ok(other) => (vec![json!({"role": "user", "content": other})], None, Map::new()),
        Err(_) => {
            let text = String::from_utf8_lossy(bytes);
            let roles = ["system", "user", "assistant", "tool", "user", "assistant"];
            let messages = text
                .split('\u{1}')
                .enumerate()
                .map(|(i, part)| {
                    let role = roles[i % roles.len()];
                    match role {
                        "assistant" if i % 4 == 2 => json!({"role": role, "content": part,
                            "reasoning_content": part,
                            "tool_calls": [{"type": "function", "id": "c1", "function": {
                                "name": "get_weather", "arguments": part}}]}),
                        "tool" => json!({"role": role, "content": part, "tool_call_id": "c1", "name": "get_weather"}),
                        _ => json!({"role": role, "content": part}),
                    }
                })
                .collect();
            (messages, None, Map::new())
        }
    }
}

/// A chat template rendered under the engine's limits (fuel, recursion, range and output
/// caps). `data[0]`: bit 0 adds the generation prompt, bit 1 declares tools, bits 2..6 pick
/// the template: 0 is the template in the input (up to the first NUL byte), others a real
/// model's template or a built-in one. The messages follow the NUL ([`messages_of`]).
pub fn chat_template(data: &[u8]) {
    let mut b = Bytes { data };
    let flags = b.u8();
    let rest = b.rest();
    let (tpl, msgs) = match rest.iter().position(|&c| c == 0) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let own;
    let fixed = fixed_templates();
    let pick = usize::from(flags >> 2) % (fixed.len() + 1);
    let template = if pick == 0 {
        match ChatTemplate::from_source(&String::from_utf8_lossy(tpl), "<s>", "</s>") {
            Ok(t) => {
                own = t;
                &own
            }
            Err(_) => return,
        }
    } else {
        &fixed[pick - 1]
    };
    let (messages, tools, kwargs) = messages_of(msgs);
    let tools = tools.or_else(|| (flags & 2 != 0).then(fixed_tools));
    let out = template.render(&RenderRequest {
        messages: &messages,
        tools: tools.as_deref(),
        add_generation_prompt: flags & 1 != 0,
        kwargs: &kwargs,
    });
    if let Ok(text) = out {
        assert!(text.len() <= tinyllm::chat::MAX_OUTPUT_BYTES);
    }
}

/// An OpenAI request body (`/v1/chat/completions`, `/v1/completions`, `/tokenize`,
/// `/detokenize`, `/apply-template`): parsed, checked, turned into an engine request, its
/// answer format into Lark, its messages rendered through the ChatML template.
pub fn openai_request(data: &[u8]) {
    let _ = parse_body::<TokenizeRequest>(data);
    let _ = parse_body::<DetokenizeRequest>(data);
    let _ = parse_body::<ApplyTemplateRequest>(data);
    let Ok((req, raw)) = parse_body::<GenRequest>(data) else {
        return;
    };
    let _ = (req.max_tokens(), req.logprobs(), req.stop_strings(), req.sampler());
    let _ = (req.settings(), req.reject_unsupported(), req.parallel_tool_calls());
    if let Ok(format) = req.answer_format() {
        let _ = (format.lark(), format.param());
    }
    let mode = req.tool_mode();
    if let Ok(mode) = &mode {
        for f in FORMATS {
            let _ = forced_call_opening(f, mode);
        }
    }
    let _ = req.completion();
    if let Ok(chat) = req.chat(&raw) {
        if let tinyllm::engine::Prompt::Chat {
            messages,
            tools,
            kwargs,
            ..
        } = &chat.prompt
        {
            let _ = RouterConfig::string_params_of(tools);
            let chatml = &fixed_templates()[GOLDEN_TEMPLATES.len() + 2];
            let _ = chatml.render(&RenderRequest {
                messages,
                tools: Some(tools),
                add_generation_prompt: true,
                kwargs,
            });
        }
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

/// The streaming answer router: `data[0]` picks the tool format (bits 0..3), tools on (bit 3),
/// an answer that starts inside `<think>` (bit 4), Qwen3-Coder's bare `<function=` calls
/// (bit 5); the answer is the rest, its chunks separated by 0xFF bytes (never part of UTF-8).
/// Whole, in those chunks, and character by character, the routed answer must be the same.
pub fn output_router(data: &[u8]) {
    let mut b = Bytes { data };
    let flags = b.u8();
    let tools_on = flags & 0x08 != 0;
    let cfg = RouterConfig {
        format: FORMATS[usize::from(flags & 7)],
        tools: if tools_on {
            vec!["get_weather".into(), "search".into()]
        } else {
            Vec::new()
        },
        in_think: flags & 0x10 != 0,
        string_params: vec![("get_weather".into(), "city".into()), ("search".into(), "query".into())],
        bare_function_calls: flags & 0x20 != 0,
    };
    let chunks: Vec<String> = b
        .rest()
        .split(|&c| c == 0xFF)
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect();
    let text: String = chunks.concat();
    let pieces: Vec<&str> = chunks.iter().map(String::as_str).collect();
    let whole = route(&cfg, &[&text]);
    assert_eq!(route(&cfg, &pieces), whole, "chunked {pieces:?}");
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let by_char: Vec<&str> = chars.iter().map(String::as_str).collect();
    assert_eq!(route(&cfg, &by_char), whole, "char by char {text:?}");
}

/// Drives a compiled grammar a few tokens: the mask, then an allowed token picked by `rng`.
fn walk(constraint: &mut Constraint, vocab: usize, eog: &[u32], rng: &mut Rng) {
    let mut logits = vec![0f32; vocab + 3];
    for _ in 0..24 {
        logits.fill(0.0);
        if constraint.mask(&mut logits).is_err() {
            return;
        }
        assert!(logits[vocab..].iter().all(|l| *l == f32::NEG_INFINITY));
        let allowed: Vec<u32> = (0..vocab as u32).filter(|&i| logits[i as usize] == 0.0).collect();
        if allowed.is_empty() {
            return;
        }
        let token = allowed[rng.below(allowed.len())];
        let end = eog.contains(&token);
        if constraint.commit(token, end).is_err() || end {
            return;
        }
        let _ = constraint.is_accepting();
    }
}

/// Grammar compilation and matching (llguidance). `data[0]`: bits 0..2 the source, bit 2 the
/// vocabulary, bits 3..6 the tool format, bit 6 `strict`, bit 7 which forced choice; `data[1]`
/// seeds the token walk. Sources: 0 the rest as a Lark grammar, 1 the rest as a JSON schema
/// (`response_format`), 2 the rest as tool declarations for a forced call's grammar, 3 tool
/// declarations (up to a NUL byte) and then an answer for the lazy call watcher.
pub fn grammar(data: &[u8]) {
    let mut b = Bytes { data };
    let flags = b.u8();
    let mut rng = Rng(u64::from(b.u16()) + 1);
    let rest = b.rest();
    let g = &grammars()[usize::from(flags >> 2 & 1)];
    let tok = g.tokenizer();
    let (vocab, eog) = (tok.vocab_size(), tok.eog_tokens().to_vec());
    let format = FORMATS[usize::from(flags >> 3 & 7)];
    let tools_of = |bytes: &[u8]| -> Vec<Json> {
        match serde_json::from_slice::<Json>(bytes) {
            Ok(Json::Array(tools)) => tools,
            Ok(schema @ Json::Object(_)) => vec![json!({"type": "function",
                "function": {"name": "f", "parameters": schema}})],
            _ => fixed_tools(),
        }
    };
    let lark = match flags & 3 {
        0 => Some(String::from_utf8_lossy(rest).into_owned()),
        1 => {
            let Ok(schema) = serde_json::from_slice::<Json>(rest) else {
                return;
            };
            AnswerFormat::JsonSchema {
                schema,
                strict: flags & 0x40 != 0,
            }
            .lark()
        }
        2 => {
            let tools = tools_of(rest);
            let choice = if flags & 0x80 != 0 {
                let name = tools
                    .first()
                    .and_then(|t| t.pointer("/function/name"))
                    .and_then(Json::as_str)
                    .unwrap_or("f");
                ToolChoice::Named(name.to_string())
            } else {
                ToolChoice::Required
            };
            tool_call_grammar(tok, format, &choice, &tools)
        }
        _ => {
            let (decl, answer) = match rest.iter().position(|&c| c == 0) {
                Some(i) => (&rest[..i], &rest[i + 1..]),
                None => (&[][..], rest),
            };
            let Some(mut lazy) = LazyCalls::new(Arc::clone(g), &tools_of(decl), flags & 0x80 != 0) else {
                return;
            };
            for piece in String::from_utf8_lossy(answer).split_inclusive(['"', ' ', '\n']) {
                match lazy.push(piece) {
                    Watch::Pending => {}
                    Watch::Free => return,
                    Watch::Call(mut c) => {
                        walk(&mut c, vocab, &eog, &mut rng);
                        return;
                    }
                }
            }
            return;
        }
    };
    let Some(lark) = lark else { return };
    if let Ok(mut c) = g.compile(&lark, "grammar") {
        let mut copy = c.clone();
        walk(&mut c, vocab, &eog, &mut rng);
        walk(&mut copy, vocab, &eog, &mut rng);
    }
}
