//! Writing GGUF files from parsed ones, for tests: the same model with one metadata value
//! changed, or cut into a split set as llama.cpp's `gguf-split` does (the first part holds
//! the metadata, every part says which it is, tensors are spread in file order).

#![allow(dead_code)]

use tinyllm::gguf::{GgufFile, Value};

fn string(s: &str) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend(s.as_bytes());
    v
}

/// A value's bytes as GGUF stores them (without its type tag).
pub fn encode_value(v: &Value) -> Vec<u8> {
    match v {
        Value::U8(x) => vec![*x],
        Value::I8(x) => vec![*x as u8],
        Value::U16(x) => x.to_le_bytes().to_vec(),
        Value::I16(x) => x.to_le_bytes().to_vec(),
        Value::U32(x) => x.to_le_bytes().to_vec(),
        Value::I32(x) => x.to_le_bytes().to_vec(),
        Value::F32(x) => x.to_le_bytes().to_vec(),
        Value::Bool(x) => vec![*x as u8],
        Value::String(s) => string(s),
        Value::U64(x) => x.to_le_bytes().to_vec(),
        Value::I64(x) => x.to_le_bytes().to_vec(),
        Value::F64(x) => x.to_le_bytes().to_vec(),
        Value::Array(a) => {
            let mut b = (a.elem as u32).to_le_bytes().to_vec();
            b.extend((a.items.len() as u64).to_le_bytes());
            for item in &a.items {
                b.extend(encode_value(item));
            }
            b
        }
    }
}

fn type_id(v: &Value) -> u32 {
    v.value_type() as u32
}

/// One GGUF file: `metadata`, then the tensors (name, ggml type id, shape, bytes) laid out in
/// order at `alignment`.
pub fn write(metadata: &[(String, Value)], tensors: &[(String, u32, Vec<u64>, Vec<u8>)], alignment: u64) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend((tensors.len() as u64).to_le_bytes());
    b.extend((metadata.len() as u64).to_le_bytes());
    for (k, v) in metadata {
        b.extend(string(k));
        b.extend(type_id(v).to_le_bytes());
        b.extend(encode_value(v));
    }
    let mut offset = 0u64;
    let mut offsets = Vec::new();
    for (name, ty, shape, data) in tensors {
        b.extend(string(name));
        b.extend((shape.len() as u32).to_le_bytes());
        for d in shape {
            b.extend(d.to_le_bytes());
        }
        b.extend(ty.to_le_bytes());
        b.extend(offset.to_le_bytes());
        offsets.push(offset);
        offset = (offset + data.len() as u64).div_ceil(alignment) * alignment;
    }
    let pad = |b: &mut Vec<u8>| {
        while !(b.len() as u64).is_multiple_of(alignment) {
            b.push(0);
        }
    };
    pad(&mut b);
    let data0 = b.len() as u64;
    for ((_, _, _, data), off) in tensors.iter().zip(offsets) {
        b.resize((data0 + off) as usize, 0);
        b.extend(data);
    }
    b
}

/// The tensors of `file` as [`write`] takes them.
fn tensors_of(file: &GgufFile) -> Vec<(String, u32, Vec<u64>, Vec<u8>)> {
    file.tensors()
        .iter()
        .map(|t| (t.name.clone(), t.ty as u32, t.shape.clone(), file.view(t).data.to_vec()))
        .collect()
}

/// `file` written again with metadata `key` set to `value` (added when missing).
pub fn with_metadata(file: &GgufFile, key: &str, value: Value) -> Vec<u8> {
    let mut meta: Vec<(String, Value)> = file.metadata().to_vec();
    match meta.iter_mut().find(|(k, _)| k == key) {
        Some((_, v)) => *v = value,
        None => meta.push((key.to_string(), value)),
    }
    write(&meta, &tensors_of(file), file.alignment)
}

/// `file` cut into a split set of `n` parts (`n` at most its tensor count), as llama.cpp's
/// `gguf-split` writes them: `split.no` (u16), `split.count` (u16) and
/// `split.tensors.count` (i32) in every part, the model's metadata in the first.
pub fn split(file: &GgufFile, n: usize) -> Vec<Vec<u8>> {
    let tensors = tensors_of(file);
    let per = tensors.len().div_ceil(n);
    tensors
        .chunks(per)
        .enumerate()
        .map(|(i, part)| {
            let mut meta = vec![
                ("split.no".to_string(), Value::U16(i as u16)),
                ("split.count".to_string(), Value::U16(n as u16)),
                ("split.tensors.count".to_string(), Value::I32(tensors.len() as i32)),
            ];
            if i == 0 {
                meta.extend(file.metadata().iter().cloned());
            }
            write(&meta, part, file.alignment)
        })
        .collect()
}

/// The user message that makes [`thinking_fixture`]'s template open a `<think>` block.
pub const THINK_TRIGGER: &str = "Think first.";

/// The qwen2 golden fixture with its chat template changed so that a conversation whose last
/// message is [`THINK_TRIGGER`] ends its prompt inside `<think>`: the random-weight model's
/// answer is then reasoning, which the chat page's tests need and no fixture produces by itself.
pub fn thinking_fixture() -> Vec<u8> {
    let file = GgufFile::open(super::golden("fixtures/qwen2.Q8_0.gguf")).expect("qwen2 fixture");
    let template = file
        .metadata()
        .iter()
        .find(|(k, _)| k == "tokenizer.chat_template")
        .and_then(|(_, v)| match v {
            Value::String(s) => Some(s.clone()),
            _ => None,
        })
        .expect("the qwen2 fixture has a chat template");
    let trigger = format!(
        "{{%- if add_generation_prompt and messages[-1].content == '{THINK_TRIGGER}' %}}<think>\n{{%- endif %}}"
    );
    with_metadata(&file, "tokenizer.chat_template", Value::String(template + &trigger))
}
