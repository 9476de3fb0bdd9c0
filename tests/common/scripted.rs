//! "Scripted" models: tiny llama-architecture GGUFs whose greedy answer is a chosen text, so
//! the server's tool-call and reasoning formats (gpt-oss harmony, DeepSeek, Qwen3-Coder's XML
//! calls) can be tested end to end although no random-weight fixture ever writes them.
//!
//! The construction: one layer whose attention and FFN weights are all zero, so the residual
//! stream that reaches the output head is the current token's embedding. Embeddings are
//! one-hot (`n_embd` >= vocabulary), so after the final RMS norm the hidden state is
//! `sqrt(n_embd) * e_i`, and the output row of token `j` holds 1 at `i` exactly when `j` is the
//! scripted successor of `i`: greedy decoding walks the chain. Every other token leads to EOS
//! with half that logit, so an unscripted prompt ends at once.
//!
//! A chain starts at the last token of the rendered prompt (a byte such as the `t` of
//! gpt-oss's `<|start|>assistant`, or a special token such as DeepSeek's `</think>`) and its
//! last piece is an end-of-generation special. Because a successor depends on the token id
//! alone, every piece needs its own id: a special's text is its real (canonical) token the
//! first time it is written and a plain token with the same text after that; plain tokens
//! carry any text in GPT-2 byte characters, so they decode to exactly that text. Plain pieces
//! come before the specials in the vocabulary, so a text lookup (last one wins, as in
//! llama.cpp) finds the special, and prompts tokenize into bytes and specials only (the
//! vocabulary has no merges).

#![allow(dead_code)]

use std::collections::HashMap;
use tinyllm::gguf::{Array, Value, ValueType};

/// llama.cpp token types.
pub const CONTROL: i32 = 3;
pub const USER_DEFINED: i32 = 4;

/// What a scripted model is made of.
pub struct Script<'a> {
    /// The chat template carried in the file (the server detects the format from it).
    pub template: &'a str,
    /// Special tokens (text, llama.cpp token type).
    pub specials: &'a [(&'a str, i32)],
    pub bos: &'a str,
    pub eos: &'a str,
    /// (text of the prompt's last token, pieces the model writes after it). The last piece must
    /// be an end-of-generation special.
    pub chains: &'a [(&'a str, &'a [&'a str])],
}

/// GPT-2's byte-to-character table (`bytes_to_unicode`).
fn byte_chars() -> Vec<char> {
    let mut printable: Vec<u32> = (0x21..=0x7e).chain(0xa1..=0xac).chain(0xae..=0xff).collect();
    let mut chars: Vec<u32> = printable.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            printable.push(b);
            chars.push(256 + n);
            n += 1;
        }
    }
    let mut table = vec!['\0'; 256];
    for (b, c) in printable.iter().zip(chars) {
        table[*b as usize] = char::from_u32(c).expect("valid char");
    }
    table
}

fn f16_bytes(values: &[f32]) -> Vec<u8> {
    values
        .iter()
        .flat_map(|&v| {
            // Only 0, 0.5 and 1 are written.
            let bits: u16 = if v == 0.0 {
                0
            } else if v == 0.5 {
                0x3800
            } else if v == 1.0 {
                0x3c00
            } else {
                panic!("f16_bytes: unsupported value {v}")
            };
            bits.to_le_bytes()
        })
        .collect()
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn strings(items: Vec<String>) -> Value {
    Value::Array(Array {
        elem: ValueType::String,
        items: items.into_iter().map(Value::String).collect(),
    })
}

/// The GGUF file of `script`.
pub fn scripted_model(script: &Script) -> Vec<u8> {
    let table = byte_chars();
    let encode = |text: &str| -> String { text.bytes().map(|b| table[b as usize]).collect() };

    // Vocabulary: 256 byte tokens (id = byte value), plain pieces, then the specials.
    let mut texts: Vec<String> = (0..=255u8).map(|b| table[b as usize].to_string()).collect();
    let mut types: Vec<i32> = vec![1; 256];
    let special_type: HashMap<&str, i32> = script.specials.iter().copied().collect();
    let starts: Vec<&str> = script.chains.iter().map(|c| c.0).collect();

    // Which pieces are canonical specials and which need a plain token.
    let mut used_special: Vec<&str> = Vec::new();
    let mut plain_ids: HashMap<String, u32> = HashMap::new();
    enum Piece<'p> {
        Special(&'p str),
        Plain(u32),
    }
    let mut chains: Vec<(&str, Vec<Piece>)> = Vec::new();
    for (start, pieces) in script.chains {
        let mut out = Vec::new();
        for (k, piece) in pieces.iter().enumerate() {
            let last = k + 1 == pieces.len();
            let canonical =
                special_type.contains_key(piece) && !starts.contains(piece) && !used_special.contains(piece);
            if last {
                assert!(
                    special_type.contains_key(piece),
                    "chain must end at a special: {piece:?}"
                );
                out.push(Piece::Special(piece));
            } else if canonical {
                used_special.push(piece);
                out.push(Piece::Special(piece));
            } else {
                let text = encode(piece);
                assert!(
                    !plain_ids.contains_key(&text) && !texts.contains(&text),
                    "plain piece {piece:?} is written twice: merge it with a neighbour"
                );
                plain_ids.insert(text.clone(), texts.len() as u32);
                out.push(Piece::Plain(texts.len() as u32));
                texts.push(text);
                types.push(1);
            }
        }
        chains.push((start, out));
    }
    let first_special = texts.len() as u32;
    for (text, ty) in script.specials {
        texts.push(text.to_string());
        types.push(*ty);
    }
    let special_id = |text: &str| -> u32 {
        let i = script
            .specials
            .iter()
            .position(|s| s.0 == text)
            .unwrap_or_else(|| panic!("{text:?} is not a special token"));
        first_special + i as u32
    };
    let token_of = |text: &str| -> u32 {
        if special_type.contains_key(text) {
            special_id(text)
        } else {
            let b = text.as_bytes();
            assert_eq!(b.len(), 1, "a chain starts at a special or a single byte: {text:?}");
            b[0] as u32
        }
    };

    let n_vocab = texts.len();
    let n_embd = n_vocab.div_ceil(64) * 64;
    let (n_head, n_ff) = (4usize, 64usize);
    let eos = special_id(script.eos);

    // Successors: output row `succ` has 1 at column `i`.
    let mut succ: Vec<Option<u32>> = vec![None; n_vocab];
    for (start, pieces) in &chains {
        let mut prev = token_of(start);
        for p in pieces {
            let id = match p {
                Piece::Special(t) => special_id(t),
                Piece::Plain(id) => *id,
            };
            assert!(succ[prev as usize].is_none(), "token {prev} already has a successor");
            succ[prev as usize] = Some(id);
            prev = id;
        }
    }
    let mut output = vec![0f32; n_vocab * n_embd];
    for (i, s) in succ.iter().enumerate() {
        output[eos as usize * n_embd + i] = 0.5;
        if let Some(j) = s {
            output[*j as usize * n_embd + i] = 1.0;
        }
    }
    let mut embd = vec![0f32; n_vocab * n_embd];
    for i in 0..n_vocab {
        embd[i * n_embd + i] = 1.0;
    }

    let e = n_embd as u64;
    let zeros = |n: usize| f16_bytes(&vec![0.0; n]);
    let ones = |n: usize| f32_bytes(&vec![1.0; n]);
    // ggml shapes: [columns (input width), rows].
    let tensors: Vec<(String, u32, Vec<u64>, Vec<u8>)> = vec![
        ("token_embd.weight".into(), 1, vec![e, n_vocab as u64], f16_bytes(&embd)),
        ("output_norm.weight".into(), 0, vec![e], ones(n_embd)),
        ("output.weight".into(), 1, vec![e, n_vocab as u64], f16_bytes(&output)),
        ("blk.0.attn_norm.weight".into(), 0, vec![e], ones(n_embd)),
        ("blk.0.attn_q.weight".into(), 1, vec![e, e], zeros(n_embd * n_embd)),
        ("blk.0.attn_k.weight".into(), 1, vec![e, e], zeros(n_embd * n_embd)),
        ("blk.0.attn_v.weight".into(), 1, vec![e, e], zeros(n_embd * n_embd)),
        ("blk.0.attn_output.weight".into(), 1, vec![e, e], zeros(n_embd * n_embd)),
        ("blk.0.ffn_norm.weight".into(), 0, vec![e], ones(n_embd)),
        (
            "blk.0.ffn_gate.weight".into(),
            1,
            vec![e, n_ff as u64],
            zeros(n_embd * n_ff),
        ),
        (
            "blk.0.ffn_up.weight".into(),
            1,
            vec![e, n_ff as u64],
            zeros(n_embd * n_ff),
        ),
        (
            "blk.0.ffn_down.weight".into(),
            1,
            vec![n_ff as u64, e],
            zeros(n_embd * n_ff),
        ),
    ];
    let s = |v: &str| Value::String(v.to_string());
    let metadata: Vec<(String, Value)> = vec![
        ("general.architecture".into(), s("llama")),
        ("general.name".into(), s("scripted")),
        ("llama.context_length".into(), Value::U32(4096)),
        ("llama.embedding_length".into(), Value::U32(n_embd as u32)),
        ("llama.block_count".into(), Value::U32(1)),
        ("llama.feed_forward_length".into(), Value::U32(n_ff as u32)),
        ("llama.attention.head_count".into(), Value::U32(n_head as u32)),
        ("llama.attention.head_count_kv".into(), Value::U32(n_head as u32)),
        ("llama.attention.layer_norm_rms_epsilon".into(), Value::F32(1e-6)),
        ("llama.rope.freq_base".into(), Value::F32(10000.0)),
        (
            "llama.rope.dimension_count".into(),
            Value::U32((n_embd / n_head) as u32),
        ),
        ("llama.vocab_size".into(), Value::U32(n_vocab as u32)),
        ("tokenizer.ggml.model".into(), s("gpt2")),
        ("tokenizer.ggml.pre".into(), s("qwen2")),
        ("tokenizer.ggml.tokens".into(), strings(texts)),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(Array {
                elem: ValueType::I32,
                items: types.into_iter().map(Value::I32).collect(),
            }),
        ),
        ("tokenizer.ggml.merges".into(), strings(Vec::new())),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(special_id(script.bos))),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(eos)),
        ("tokenizer.ggml.add_bos_token".into(), Value::Bool(false)),
        ("tokenizer.chat_template".into(), s(script.template)),
    ];
    super::gguf_write::write(&metadata, &tensors, 32)
}

/// `bytes` written to a file named `name` under the test target's temporary directory.
pub fn write_model(name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::write(&path, bytes).expect("write scripted model");
    path
}

fn golden_template(file: &str) -> String {
    std::fs::read_to_string(super::golden(&format!("templates/{file}"))).expect("golden template")
}

/// The harmony answer to any prompt that ends with `<|start|>assistant`: analysis, a preamble
/// in the commentary channel, then a call to `get_weather` ending at `<|call|>`.
pub const HARMONY_ANSWER: &[&str] = &[
    "<|channel|>",
    "analysis<|message|>",
    "The user wants the weather in Paris.",
    "<|end|>",
    "<|start|>",
    "assistant",
    "<|channel|>commentary",
    "<|message|>Checking the weather.",
    "<|end|><|start|>assistant",
    "<|channel|>commentary to=functions.get_weather ",
    "<|constrain|>",
    "json",
    "<|message|>{\"city\": \"Paris\"}",
    "<|call|>",
];

/// The arguments a harmony model writes when `tool_choice` names a tool: the prompt then ends
/// with the forced opening `...<|constrain|>json<|message|>`.
pub const HARMONY_FORCED: &[&str] = &["{\"city\": \"Lyon\"}", "<|call|>"];

/// A gpt-oss-templated model answering [`HARMONY_ANSWER`] and [`HARMONY_FORCED`].
pub fn harmony_model() -> Vec<u8> {
    let template = golden_template("openai-gpt-oss-120b.jinja");
    scripted_model(&Script {
        template: &template,
        specials: &[
            ("<|startoftext|>", CONTROL),
            ("<|endoftext|>", CONTROL),
            ("<|start|>", CONTROL),
            ("<|end|>", CONTROL),
            ("<|message|>", CONTROL),
            ("<|channel|>", CONTROL),
            ("<|constrain|>", CONTROL),
            ("<|return|>", CONTROL),
            ("<|call|>", CONTROL),
        ],
        bos: "<|startoftext|>",
        eos: "<|return|>",
        chains: &[("t", HARMONY_ANSWER), ("<|message|>", HARMONY_FORCED)],
    })
}

/// DeepSeek V3.1's answers: after `</think>` (thinking off) content and two calls; after
/// `<think>` (thinking on) reasoning first; after a tool's output a final answer; after a
/// forced call's opening its arguments.
pub const DEEPSEEK_CALLS: &[&str] = &[
    "Let me check.",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁call▁begin｜>",
    "get_weather<｜tool▁sep｜>",
    "{\"city\": \"Paris\"}",
    "<｜tool▁call▁end｜>",
    "<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜>",
    "<｜tool▁calls▁end｜>",
    "<｜end▁of▁sentence｜>",
];
pub const DEEPSEEK_THINKING: &[&str] = &[
    "The user wants the weather.",
    "</think>",
    "Checking.",
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    "<｜end▁of▁sentence｜>",
];
pub const DEEPSEEK_AFTER_TOOL: &[&str] = &["It is sunny, 18 °C.", "<｜end▁of▁sentence｜>"];
/// The arguments after the forced opening of a named tool (`...get_weather<｜tool▁sep｜>`).
pub const DEEPSEEK_FORCED: &[&str] = &[
    "{\"city\": \"Lyon\"}",
    "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    "<｜end▁of▁sentence｜>",
];

/// A DeepSeek-V3.1-templated model answering [`DEEPSEEK_CALLS`], [`DEEPSEEK_THINKING`],
/// [`DEEPSEEK_AFTER_TOOL`] and [`DEEPSEEK_FORCED`].
pub fn deepseek_model() -> Vec<u8> {
    let template = golden_template("deepseek-ai-DeepSeek-V3.1.jinja");
    scripted_model(&Script {
        template: &template,
        specials: &[
            ("<｜begin▁of▁sentence｜>", CONTROL),
            ("<｜end▁of▁sentence｜>", CONTROL),
            ("<｜User｜>", USER_DEFINED),
            ("<｜Assistant｜>", USER_DEFINED),
            ("<think>", USER_DEFINED),
            ("</think>", USER_DEFINED),
            ("<｜tool▁calls▁begin｜>", USER_DEFINED),
            ("<｜tool▁calls▁end｜>", USER_DEFINED),
            ("<｜tool▁call▁begin｜>", USER_DEFINED),
            ("<｜tool▁call▁end｜>", USER_DEFINED),
            ("<｜tool▁sep｜>", USER_DEFINED),
            ("<｜tool▁output▁begin｜>", USER_DEFINED),
            ("<｜tool▁output▁end｜>", USER_DEFINED),
        ],
        bos: "<｜begin▁of▁sentence｜>",
        eos: "<｜end▁of▁sentence｜>",
        chains: &[
            ("</think>", DEEPSEEK_CALLS),
            ("<think>", DEEPSEEK_THINKING),
            ("<｜tool▁output▁end｜>", DEEPSEEK_AFTER_TOOL),
            ("<｜tool▁sep｜>", DEEPSEEK_FORCED),
        ],
    })
}

/// Qwen3-Coder's answer to any prompt (its template's prompts all end with
/// `<|im_start|>assistant\n`): content, then two calls in its XML format, one with parameters
/// of three schema types (see `qwen_tools` in `native/tests/server.rs`). Markers are split
/// across tokens (`\n</param` + `eter>`) as a real tokenizer may split them.
pub const QWEN_CODER_CALLS: &[&str] = &[
    "Let me check.\n\n",
    "<tool_call>",
    "\n<function=get_weather>\n<parameter=city>\nParis",
    "\n</param",
    "eter>\n<parameter=zip>\n75001\n</parameter>\n<parameter=days>\n3\n</parameter>\n",
    "<parameter=options>\n{\"unit\": \"celsius\", \"hourly\": true}\n</parameter>\n</function>\n",
    "</tool_call>",
    "\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>",
    "<|im_end|>",
];
/// The arguments after the forced opening of a named tool
/// (`<tool_call>\n<function=get_weather>\n`).
pub const QWEN_CODER_FORCED: &[&str] = &[
    "<parameter=city>\nLyon\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n",
    "</tool_call>",
    "<|im_end|>",
];
/// A call that never closes its `<function=...>`: it must come back as content.
pub const QWEN_CODER_MALFORMED: &[&str] = &[
    "<tool_call>",
    "\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n",
    "</tool_call>",
    "<|im_end|>",
];
/// A call whose `<tool_call>` the model left out (Qwen3-Coder models do; llama.cpp takes
/// `<function=NAME>` of a declared tool as its opening).
pub const QWEN_CODER_UNTAGGED: &[&str] = &[
    "Sure.\n",
    "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n",
    "</tool_call>",
    "<|im_end|>",
];
/// Qwen3.5's answer after its prompt's `<think>\n`: reasoning, content and one call.
pub const QWEN35_THINKING: &[&str] = &[
    "The user wants the weather.\n",
    "</think>",
    "\n\nChecking.\n\n",
    "<tool_call>",
    "\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n1\n</parameter>\n</function>\n",
    "</tool_call>",
    "<|im_end|>",
];

/// A model with a Qwen chat template from `tests/golden/templates` answering `answer`.
fn qwen_model(template_file: &str, answer: &[&str]) -> Vec<u8> {
    let template = golden_template(template_file);
    scripted_model(&Script {
        template: &template,
        specials: &[
            ("<|endoftext|>", CONTROL),
            ("<|im_start|>", CONTROL),
            ("<|im_end|>", CONTROL),
            ("<tool_call>", USER_DEFINED),
            ("</tool_call>", USER_DEFINED),
            ("<think>", USER_DEFINED),
            ("</think>", USER_DEFINED),
        ],
        bos: "<|endoftext|>",
        eos: "<|im_end|>",
        chains: &[("\n", answer)],
    })
}

/// A Qwen3-Coder-templated model answering `answer` (one of the `QWEN_CODER_*` scripts: all
/// its prompts end alike, so each script needs its own model).
pub fn qwen_coder_model(answer: &[&str]) -> Vec<u8> {
    qwen_model("Qwen3-Coder.jinja", answer)
}

/// A Qwen3.5-templated model answering [`QWEN35_THINKING`].
pub fn qwen35_model() -> Vec<u8> {
    qwen_model("Qwen3.5-4B.jinja", QWEN35_THINKING)
}
