//! The GGUF header parser: magic, version, metadata and tensor table of one file.
//!
//! Everything read from the file is untrusted. Every count is checked against the bytes that
//! are left before anything is allocated for it, every offset against the file size, and every
//! error names the field it came from.

use super::value::{Array, Value, ValueType};
use super::GgufError;
use crate::quant::GgmlType;

pub(crate) const MAGIC: &[u8; 4] = b"GGUF";
pub(crate) const DEFAULT_ALIGNMENT: u64 = 32;
pub(crate) const MAX_DIMS: usize = 4;
/// Nested arrays deeper than this are rejected instead of recursing without bound.
const MAX_ARRAY_DEPTH: usize = 8;
/// GGUF strings (keys, tensor names) longer than this are rejected as corrupt; llama.cpp's
/// own limit for tensor names is 64 bytes, keys are short, values (templates, merges) are not
/// bounded by this.
const MAX_NAME_LEN: u64 = 1 << 16;

/// One parsed tensor-table entry, before it is placed on a byte source.
#[derive(Debug, Clone)]
pub(crate) struct RawTensor {
    pub name: String,
    pub ty: GgmlType,
    /// ggml order: `shape[0]` is the contiguous (row) dimension.
    pub shape: Vec<u64>,
    /// Relative to the start of the data section.
    pub offset: u64,
    pub bytes: u64,
}

/// The parsed header of one GGUF file.
#[derive(Debug)]
pub(crate) struct Header {
    pub version: u32,
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<RawTensor>,
    pub alignment: u64,
    /// Absolute offset of the tensor data section.
    pub data_offset: u64,
}

/// Why a header could not be parsed from the bytes at hand.
#[derive(Debug)]
pub(crate) enum ParseError {
    /// The file is malformed.
    Gguf(GgufError),
    /// The bytes at hand end before the header does: parsing needs the first `need` bytes of
    /// the file (only for a prefix of a longer file, see [`parse_prefix`]).
    Incomplete { need: u64 },
}

impl From<GgufError> for ParseError {
    fn from(e: GgufError) -> Self {
        ParseError::Gguf(e)
    }
}

/// Reads the header from `buf`, the first bytes of a file of `file_len` bytes.
struct Reader<'a> {
    buf: &'a [u8],
    file_len: u64,
    pos: usize,
}

impl<'a> Reader<'a> {
    /// Bytes left in the file (not only in `buf`): counts are checked against these.
    fn remaining(&self) -> u64 {
        self.file_len - self.pos as u64
    }

    /// Room to reserve for `count` items of at least `min_each` bytes: no more than the bytes
    /// at hand can hold.
    fn capacity(&self, count: u64, min_each: u64) -> usize {
        let at_hand = (self.buf.len() - self.pos) as u64;
        count.min(at_hand / min_each.max(1)) as usize
    }

    fn take(&mut self, n: u64, field: &dyn Fn() -> String) -> Result<&'a [u8], ParseError> {
        if n > self.remaining() {
            return Err(ParseError::Gguf(GgufError::Truncated {
                field: field(),
                offset: self.pos as u64,
                need: n,
                file_len: self.file_len,
            }));
        }
        let end = self.pos as u64 + n;
        if end > self.buf.len() as u64 {
            return Err(ParseError::Incomplete { need: end });
        }
        let s = &self.buf[self.pos..end as usize];
        self.pos = end as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, field: &dyn Fn() -> String) -> Result<[u8; N], ParseError> {
        let s = self.take(N as u64, field)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, field: &dyn Fn() -> String) -> Result<u32, ParseError> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    fn u64(&mut self, field: &dyn Fn() -> String) -> Result<u64, ParseError> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }

    /// A count that must leave room for `count * min_each` more bytes.
    fn count(&mut self, min_each: u64, field: &dyn Fn() -> String) -> Result<u64, ParseError> {
        let count = self.u64(field)?;
        let need = count.checked_mul(min_each);
        if need.is_none_or(|need| need > self.remaining()) {
            return Err(ParseError::Gguf(GgufError::CountTooLarge {
                field: field(),
                count,
                remaining: self.remaining(),
            }));
        }
        Ok(count)
    }

    fn string(&mut self, max_len: u64, field: &dyn Fn() -> String) -> Result<String, ParseError> {
        let len = self.u64(field)?;
        if len > max_len {
            return Err(ParseError::Gguf(GgufError::StringTooLong {
                field: field(),
                len,
                remaining: self.remaining(),
            }));
        }
        let bytes = self.take(len, field)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| ParseError::Gguf(GgufError::InvalidUtf8 { field: field() }))
    }

    fn value(&mut self, ty: ValueType, depth: usize, field: &dyn Fn() -> String) -> Result<Value, ParseError> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>(field)?[0]),
            ValueType::I8 => Value::I8(self.array::<1>(field)?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(field)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(field)?)),
            ValueType::U32 => Value::U32(self.u32(field)?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(field)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(field)?)),
            ValueType::U64 => Value::U64(self.u64(field)?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(field)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(field)?)),
            ValueType::Bool => match self.array::<1>(field)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => {
                    return Err(ParseError::Gguf(GgufError::InvalidBool {
                        field: field(),
                        byte: b,
                    }))
                }
            },
            ValueType::String => Value::String(self.string(u64::MAX, field)?),
            ValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(ParseError::Gguf(GgufError::ArrayTooDeep {
                        field: field(),
                        max: MAX_ARRAY_DEPTH,
                    }));
                }
                let type_id = self.u32(field)?;
                let elem = ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
                    field: field(),
                    type_id,
                })?;
                let count = self.count(elem.min_encoded_len(), field)?;
                // The count is now bounded by the bytes left, and the allocation by the bytes
                // at hand (a file still arriving may claim a size it never sends).
                let mut items = Vec::with_capacity(self.capacity(count, elem.min_encoded_len()));
                for i in 0..count {
                    let item_field = || format!("{}[{i}]", field());
                    items.push(self.value(elem, depth + 1, &item_field)?);
                }
                Value::Array(Array { elem, items })
            }
        })
    }
}

/// Parse the header of one GGUF file held in `buf` (the whole file).
pub(crate) fn parse_header(buf: &[u8]) -> Result<Header, GgufError> {
    parse_prefix(buf, buf.len() as u64).map_err(|e| match e {
        ParseError::Gguf(e) => e,
        // `buf` is the whole file, so a read past it is a truncation, reported as such.
        ParseError::Incomplete { need } => GgufError::Truncated {
            field: "header".into(),
            offset: 0,
            need,
            file_len: buf.len() as u64,
        },
    })
}

/// Parse the header of a GGUF file of `file_len` bytes from `buf`, its first bytes (a file
/// that is still arriving). Counts and tensor bounds are checked against `file_len`;
/// [`ParseError::Incomplete`] says how many bytes the header needs when `buf` ends first.
pub(crate) fn parse_prefix(buf: &[u8], file_len: u64) -> Result<Header, ParseError> {
    let file_len = file_len.max(buf.len() as u64);
    let mut r = Reader { buf, file_len, pos: 0 };
    let magic: [u8; 4] = r.array(&|| "magic".into())?;
    if &magic != MAGIC {
        return Err(ParseError::Gguf(GgufError::BadMagic { found: magic }));
    }
    let version = r.u32(&|| "version".into())?;
    match version {
        2 | 3 => {}
        v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => return Err(ParseError::Gguf(GgufError::BigEndian)),
        v => return Err(ParseError::Gguf(GgufError::UnsupportedVersion(v))),
    }
    // Smallest tensor-table entry: name length (8) + n_dims (4) + one dim (8) + type (4) + offset (8).
    let n_tensors = r.count(32, &|| "tensor_count".into())?;
    // Smallest metadata entry: key length (8) + value type (4) + a one-byte value.
    let n_kv = r.count(13, &|| "metadata_kv_count".into())?;

    let mut metadata: Vec<(String, Value)> = Vec::with_capacity(r.capacity(n_kv, 13));
    for i in 0..n_kv {
        let key = r.string(MAX_NAME_LEN, &|| format!("metadata key #{i}"))?;
        let field = || format!("metadata value '{key}'");
        let type_id = r.u32(&field)?;
        let ty = ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
            field: field(),
            type_id,
        })?;
        let value = r.value(ty, 0, &field)?;
        if metadata.iter().any(|(k, _)| *k == key) {
            return Err(ParseError::Gguf(GgufError::DuplicateKey(key)));
        }
        metadata.push((key, value));
    }

    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, Value::U32(a))) if *a != 0 && a.is_power_of_two() => u64::from(*a),
        Some((_, v)) => return Err(ParseError::Gguf(GgufError::BadAlignment(v.to_string()))),
    };

    let mut tensors: Vec<RawTensor> = Vec::with_capacity(r.capacity(n_tensors, 32));
    for i in 0..n_tensors {
        let name = r.string(MAX_NAME_LEN, &|| format!("tensor #{i} name"))?;
        let field = |what: &str| format!("tensor '{name}' {what}");
        let n_dims = r.u32(&|| field("n_dims"))?;
        if n_dims == 0 || n_dims as usize > MAX_DIMS {
            return Err(ParseError::Gguf(GgufError::BadTensor {
                tensor: name,
                problem: format!("n_dims {n_dims} is not in 1..={MAX_DIMS}"),
            }));
        }
        let mut shape = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            shape.push(r.u64(&|| field(&format!("dimension {d}")))?);
        }
        let type_id = r.u32(&|| field("type"))?;
        let ty = GgmlType::from_id(type_id).map_err(|_| GgufError::UnknownTensorType {
            tensor: name.clone(),
            type_id,
        })?;
        let offset = r.u64(&|| field("offset"))?;
        let bytes = tensor_bytes(&name, ty, &shape)?;
        if offset % alignment != 0 {
            return Err(ParseError::Gguf(GgufError::MisalignedTensor {
                tensor: name,
                offset,
                alignment,
            }));
        }
        if tensors.iter().any(|t| t.name == name) {
            return Err(ParseError::Gguf(GgufError::DuplicateTensor(name)));
        }
        tensors.push(RawTensor {
            name,
            ty,
            shape,
            offset,
            bytes,
        });
    }

    let data_offset = (r.pos as u64).div_ceil(alignment) * alignment;
    let data_len = file_len.saturating_sub(data_offset);
    for t in &tensors {
        if t.offset.checked_add(t.bytes).is_none_or(|end| end > data_len) {
            return Err(ParseError::Gguf(GgufError::TensorOutOfBounds {
                tensor: t.name.clone(),
                offset: t.offset,
                bytes: t.bytes,
                data_len,
            }));
        }
    }
    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}

/// Byte size of a tensor, checking the element count and row length against its type.
fn tensor_bytes(name: &str, ty: GgmlType, shape: &[u64]) -> Result<u64, GgufError> {
    let bad = |problem: String| GgufError::BadTensor {
        tensor: name.to_string(),
        problem,
    };
    let mut elements: u64 = 1;
    for &d in shape {
        if d == 0 || d > i64::MAX as u64 {
            return Err(bad(format!("dimension {d} in shape {shape:?} is out of range")));
        }
        elements = elements
            .checked_mul(d)
            .filter(|&n| n <= i64::MAX as u64)
            .ok_or_else(|| bad(format!("shape {shape:?} has too many elements")))?;
    }
    if !shape[0].is_multiple_of(ty.block_size() as u64) {
        return Err(bad(format!(
            "row length {} is not a multiple of the {} block size {}",
            shape[0],
            ty,
            ty.block_size()
        )));
    }
    ty.bytes_for(elements)
        .ok_or_else(|| bad(format!("shape {shape:?} overflows the byte size")))
}
