//! GGUF model files: metadata and zero-copy tensor views.
//!
//! A model is one GGUF file or a split set (`name-00001-of-00003.gguf`, ...). The bytes come
//! from a read-only memory map on native targets or from owned buffers (wasm, tests); tensor
//! views borrow from them without copying. Metadata comes from the first file of a split set;
//! the tensor tables of all parts are merged.

mod parse;
pub mod stream;
mod value;

pub use value::{Array, Value, ValueType};

use crate::quant::GgmlType;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Errors from reading a GGUF file; each names the field or tensor at fault.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("not a GGUF file: magic is {found:?}, expected \"GGUF\"")]
    BadMagic { found: [u8; 4] },
    #[error("unsupported GGUF version {0} (supported: 2, 3)")]
    UnsupportedVersion(u32),
    #[error("big-endian GGUF files are not supported")]
    BigEndian,
    #[error("file truncated reading {field}: need {need} bytes at offset {offset}, file has {file_len}")]
    Truncated {
        field: String,
        offset: u64,
        need: u64,
        file_len: u64,
    },
    #[error("{field} = {count} is impossible: only {remaining} bytes are left in the file")]
    CountTooLarge { field: String, count: u64, remaining: u64 },
    #[error("{field}: string length {len} exceeds the limit for names ({remaining} bytes left in the file)")]
    StringTooLong { field: String, len: u64, remaining: u64 },
    #[error("{field}: string is not valid UTF-8")]
    InvalidUtf8 { field: String },
    #[error("{field}: bool byte is {byte}, expected 0 or 1")]
    InvalidBool { field: String, byte: u8 },
    #[error("{field}: unknown metadata value type {type_id}")]
    UnknownValueType { field: String, type_id: u32 },
    #[error("{field}: arrays nested deeper than {max}")]
    ArrayTooDeep { field: String, max: usize },
    #[error("duplicate metadata key '{0}'")]
    DuplicateKey(String),
    #[error("general.alignment = {0} is not a power of two u32")]
    BadAlignment(String),
    #[error("tensor '{tensor}': unknown ggml type id {type_id}")]
    UnknownTensorType { tensor: String, type_id: u32 },
    #[error("tensor '{tensor}': {problem}")]
    BadTensor { tensor: String, problem: String },
    #[error("tensor '{tensor}': offset {offset} is not a multiple of the alignment {alignment}")]
    MisalignedTensor {
        tensor: String,
        offset: u64,
        alignment: u64,
    },
    #[error("tensor '{tensor}': data at offset {offset} + {bytes} bytes lies past the end of the data section ({data_len} bytes)")]
    TensorOutOfBounds {
        tensor: String,
        offset: u64,
        bytes: u64,
        data_len: u64,
    },
    #[error("duplicate tensor '{0}'")]
    DuplicateTensor(String),
    #[error("split GGUF: {0}")]
    Split(String),
    #[error("missing metadata key '{0}'")]
    MissingKey(String),
    #[error("metadata key '{key}' is {found}, expected {expected}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: String,
    },
    #[error("metadata key '{key}': {problem}")]
    BadValue { key: String, problem: String },
    #[error("no tensor named '{0}'")]
    MissingTensor(String),
    /// The file was streamed: its tensors' bytes went to the backend as they arrived
    /// ([`stream::GgufStream`]) and are not kept.
    #[error("tensor '{0}': the file was streamed and its tensor data is not held in memory")]
    NotResident(String),
    #[error("streamed file: {0}")]
    Stream(String),
}

/// The bytes of one GGUF file.
enum Source {
    #[cfg(not(target_arch = "wasm32"))]
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
    /// A file that was streamed ([`stream::GgufStream`]): only its header is kept, and its
    /// length.
    Streamed(u64),
}

impl Source {
    /// The file's bytes; empty for a streamed file, whose tensor views are refused.
    fn bytes(&self) -> &[u8] {
        match self {
            #[cfg(not(target_arch = "wasm32"))]
            Source::Mapped(m) => m,
            Source::Owned(v) => v,
            Source::Streamed(_) => &[],
        }
    }

    fn len(&self) -> u64 {
        match self {
            Source::Streamed(len) => *len,
            s => s.bytes().len() as u64,
        }
    }
}

struct Part {
    source: Source,
    data_offset: u64,
}

/// One tensor's entry in the merged tensor table.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    pub ty: GgmlType,
    /// ggml order: `shape[0]` is the contiguous row length, `shape[1]` the row count, ...
    pub shape: Vec<u64>,
    /// Offset within its part's data section.
    pub offset: u64,
    pub bytes: u64,
    /// Which file of a split set holds the data (0 for a single file).
    pub part: usize,
}

impl TensorInfo {
    /// The entry of a parsed header's tensor, held in part `part`.
    pub(crate) fn of(t: &parse::RawTensor, part: usize) -> Self {
        TensorInfo {
            name: t.name.clone(),
            ty: t.ty,
            shape: t.shape.clone(),
            offset: t.offset,
            bytes: t.bytes,
            part,
        }
    }

    pub fn elements(&self) -> u64 {
        self.shape.iter().product()
    }
}

/// A borrowed view of one tensor's raw (quantized) bytes.
#[derive(Debug, Clone, Copy)]
pub struct TensorView<'a> {
    pub info: &'a TensorInfo,
    pub data: &'a [u8],
}

impl TensorView<'_> {
    /// Dequantize the whole tensor to f32, in GGUF element order.
    pub fn to_f32(&self) -> Result<Vec<f32>, crate::quant::QuantError> {
        let mut out = vec![0f32; self.info.elements() as usize];
        crate::quant::dequantize(self.info.ty, self.data, &mut out)?;
        Ok(out)
    }
}

/// A GGUF model: metadata plus the tensor table of one file or a whole split set.
pub struct GgufFile {
    pub version: u32,
    pub alignment: u64,
    metadata: Vec<(String, Value)>,
    index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    parts: Vec<Part>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("parts", &self.parts.len())
            .finish()
    }
}

impl GgufFile {
    /// Open and memory-map a GGUF file. A file named `*-00001-of-0000N.gguf` opens the whole
    /// split set from the same directory.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref();
        let paths = match split_paths(path) {
            Some(paths) => paths,
            None => vec![path.to_path_buf()],
        };
        let sources = paths.iter().map(|p| map_file(p)).collect::<Result<Vec<_>, _>>()?;
        Self::from_sources(sources)
    }

    /// Parse a GGUF file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, GgufError> {
        Self::from_sources(vec![Source::Owned(bytes)])
    }

    /// Parse a split set held in memory, parts in order.
    pub fn from_parts(parts: Vec<Vec<u8>>) -> Result<Self, GgufError> {
        Self::from_sources(parts.into_iter().map(Source::Owned).collect())
    }

    fn from_sources(sources: Vec<Source>) -> Result<Self, GgufError> {
        let parts = sources
            .into_iter()
            .map(|source| Ok((parse::parse_header(source.bytes())?, source)))
            .collect::<Result<Vec<_>, GgufError>>()?;
        Self::assemble(parts)
    }

    /// The metadata and tensor table of a one-file model from the file's first bytes
    /// (`file_size`: the whole file's length), without its tensor data (views are empty):
    /// enough to size a model before downloading it. `Ok(Err(need))` when `prefix` ends before
    /// the header does: the header needs the first `need` bytes.
    pub fn from_header_prefix(prefix: &[u8], file_size: u64) -> Result<Result<Self, u64>, GgufError> {
        match parse::parse_prefix(prefix, file_size) {
            Ok(header) => Ok(Ok(Self::assemble(vec![(header, Source::Streamed(file_size))])?)),
            Err(parse::ParseError::Incomplete { need }) => Ok(Err(need)),
            Err(parse::ParseError::Gguf(e)) => Err(e),
        }
    }

    /// Lends the parsed header of one streamed part (`size`: its length) to `f` as a file of
    /// that part alone (no tensor data): its metadata is moved in and back rather than copied,
    /// for a large vocabulary's metadata is megabytes and the browser's memory peak counts it.
    fn lend_header<R>(header: &mut parse::Header, size: u64, f: impl FnOnce(&GgufFile) -> R) -> R {
        let tensors: Vec<TensorInfo> = header.tensors.iter().map(|t| TensorInfo::of(t, 0)).collect();
        let index = tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        let file = GgufFile {
            version: header.version,
            alignment: header.alignment,
            metadata: std::mem::take(&mut header.metadata),
            index,
            tensors,
            parts: vec![Part {
                source: Source::Streamed(size),
                data_offset: header.data_offset,
            }],
        };
        let out = f(&file);
        header.metadata = file.metadata;
        out
    }

    /// One model from the parsed headers of its parts (in order) and their bytes: the tensor
    /// tables merged, the split-set metadata checked.
    fn assemble(headers: Vec<(parse::Header, Source)>) -> Result<Self, GgufError> {
        let mut parts = Vec::with_capacity(headers.len());
        let mut metadata = Vec::new();
        let mut tensors = Vec::new();
        let mut index = HashMap::new();
        let (mut version, mut alignment) = (0, 0);
        let n_parts = headers.len();
        for (part_no, (header, source)) in headers.into_iter().enumerate() {
            if n_parts > 1 {
                check_split_part(&header.metadata, part_no, n_parts)?;
            }
            if part_no == 0 {
                version = header.version;
                alignment = header.alignment;
                metadata = header.metadata;
            }
            for t in header.tensors {
                if index.insert(t.name.clone(), tensors.len()).is_some() {
                    return Err(GgufError::DuplicateTensor(t.name));
                }
                tensors.push(TensorInfo {
                    name: t.name,
                    ty: t.ty,
                    shape: t.shape,
                    offset: t.offset,
                    bytes: t.bytes,
                    part: part_no,
                });
            }
            parts.push(Part {
                source,
                data_offset: header.data_offset,
            });
        }
        if n_parts == 1 {
            if let Some(count) = find(&metadata, "split.count").and_then(Value::as_integer) {
                if count > 1 {
                    return Err(GgufError::Split(format!(
                        "this file is part of a {count}-file split set; open the first part (*-00001-of-{count:05}.gguf)"
                    )));
                }
            }
        }
        if let Some(v) = find(&metadata, "split.tensors.count") {
            if v.as_integer() != Some(tensors.len() as i128) {
                return Err(GgufError::Split(format!(
                    "split.tensors.count is {v} but the parts hold {} tensors",
                    tensors.len()
                )));
            }
        }
        Ok(GgufFile {
            version,
            alignment,
            metadata,
            index,
            tensors,
            parts,
        })
    }

    /// Whether tensor data can be viewed (false for a streamed file).
    pub fn is_resident(&self) -> bool {
        !self.parts.iter().any(|p| matches!(p.source, Source::Streamed(_)))
    }

    /// All metadata entries in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// The tensor table in file order (parts concatenated).
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// Where part `part`'s tensor data section starts (its header size, padded); 0 for a part
    /// that does not exist.
    pub fn data_offset(&self, part: usize) -> u64 {
        self.parts.get(part).map_or(0, |p| p.data_offset)
    }

    /// Number of files (1, or the size of a split set).
    pub fn part_count(&self) -> usize {
        self.parts.len()
    }

    /// Total bytes of all parts.
    pub fn file_bytes(&self) -> u64 {
        self.parts.iter().map(|p| p.source.len()).sum()
    }

    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    /// A zero-copy view of a tensor's bytes.
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>, GgufError> {
        let info = self
            .tensor_info(name)
            .ok_or_else(|| GgufError::MissingTensor(name.to_string()))?;
        if matches!(self.parts[info.part].source, Source::Streamed(_)) {
            return Err(GgufError::NotResident(name.to_string()));
        }
        Ok(self.view(info))
    }

    /// The view for an entry of [`Self::tensors`] of a resident file (bounds were checked at
    /// parse time). A streamed file holds no tensor bytes: its views are empty, which is why
    /// [`Self::tensor`], the checked way in, refuses them.
    pub fn view<'a>(&'a self, info: &'a TensorInfo) -> TensorView<'a> {
        if matches!(self.parts[info.part].source, Source::Streamed(_)) {
            return TensorView { info, data: &[] };
        }
        let part = &self.parts[info.part];
        let start = (part.data_offset + info.offset) as usize;
        TensorView {
            info,
            data: &part.source.bytes()[start..start + info.bytes as usize],
        }
    }

    /// Let the OS drop the pages of `bytes` of a tensor's data from this process's memory: for
    /// a caller that copied them (they are read from the file again if anything touches them
    /// later). Does nothing for files read into memory or a range past the tensor.
    pub fn release(&self, info: &TensorInfo, bytes: std::ops::Range<usize>) {
        let part = &self.parts[info.part];
        if bytes.start > bytes.end || bytes.end > info.bytes as usize {
            return;
        }
        #[cfg(unix)]
        if let Source::Mapped(map) = &part.source {
            let start = (part.data_offset + info.offset) as usize + bytes.start;
            // SAFETY: the mapping is a read-only map of a file: after MADV_DONTNEED the pages
            // read back the same bytes from the file, so no reference sees a change. The range
            // was bounds-checked at parse time. A failure only means the memory stays resident.
            let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, bytes.len()) };
        }
        #[cfg(not(unix))]
        let _ = (part, bytes);
    }

    /// The raw value of a key.
    pub fn get(&self, key: &str) -> Option<&Value> {
        find(&self.metadata, key)
    }

    fn require(&self, key: &str) -> Result<&Value, GgufError> {
        self.get(key).ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Result<&str, GgufError> {
        self.get_str("general.architecture")
    }

    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| wrong_type(key, "a string", v))
    }

    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        let v = self.require(key)?;
        v.as_bool().ok_or_else(|| wrong_type(key, "a bool", v))
    }

    /// Any integer type whose value fits a u32.
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        let v = self.require(key)?;
        let i = v.as_integer().ok_or_else(|| wrong_type(key, "an integer", v))?;
        u32::try_from(i).map_err(|_| GgufError::BadValue {
            key: key.to_string(),
            problem: format!("{i} does not fit a u32"),
        })
    }

    /// F32, F64 or an integer, as f32.
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        let v = self.require(key)?;
        v.as_f64()
            .map(|f| f as f32)
            .ok_or_else(|| wrong_type(key, "a number", v))
    }

    pub fn get_array(&self, key: &str) -> Result<&Array, GgufError> {
        let v = self.require(key)?;
        v.as_array().ok_or_else(|| wrong_type(key, "an array", v))
    }

    /// An array of strings, borrowed.
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        let a = self.get_array(key)?;
        a.items
            .iter()
            .map(|v| v.as_str())
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                wrong_type(
                    key,
                    "an array of string",
                    &Value::Array(Array {
                        elem: a.elem,
                        items: vec![],
                    }),
                )
            })
    }

    /// An array of numbers (any numeric element type), as f32.
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>, GgufError> {
        let a = self.get_array(key)?;
        a.items
            .iter()
            .map(|v| v.as_f64().map(|f| f as f32))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                wrong_type(
                    key,
                    "an array of numbers",
                    &Value::Array(Array {
                        elem: a.elem,
                        items: vec![],
                    }),
                )
            })
    }

    /// An array of integers, as i64 (values outside i64 are an error naming the key).
    pub fn get_i64_array(&self, key: &str) -> Result<Vec<i64>, GgufError> {
        let a = self.get_array(key)?;
        a.items
            .iter()
            .map(|v| v.as_integer().and_then(|i| i64::try_from(i).ok()))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                wrong_type(
                    key,
                    "an array of integers",
                    &Value::Array(Array {
                        elem: a.elem,
                        items: vec![],
                    }),
                )
            })
    }

    /// `Ok(None)` when the key is absent, an error when present with the wrong type.
    pub fn opt<T>(&self, key: &str, get: impl Fn(&Self, &str) -> Result<T, GgufError>) -> Result<Option<T>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(_) => get(self, key).map(Some),
        }
    }
}

fn find<'a>(metadata: &'a [(String, Value)], key: &str) -> Option<&'a Value> {
    metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

fn wrong_type(key: &str, expected: &'static str, found: &Value) -> GgufError {
    GgufError::WrongType {
        key: key.to_string(),
        expected,
        found: found.type_description(),
    }
}

#[cfg(not(target_arch = "wasm32"))]
fn map_file(path: &Path) -> Result<Source, GgufError> {
    let io = |source| GgufError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(io(std::io::Error::other("not a regular file")));
    }
    if meta.len() == 0 {
        // Mapping an empty file fails on some platforms; an empty buffer gives the same error
        // as any other truncated file.
        return Ok(Source::Owned(Vec::new()));
    }
    // SAFETY: the map is read-only; the file is not expected to change while a model is loaded
    // (the same assumption every mmap-based loader makes).
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
    Ok(Source::Mapped(map))
}

/// For `dir/name-00001-of-00003.gguf`, the paths of all three parts; `None` for other names.
pub fn split_paths(path: &Path) -> Option<Vec<PathBuf>> {
    let file = path.file_name()?.to_str()?;
    let stem = file.strip_suffix(".gguf")?;
    let (rest, total) = stem.rsplit_once("-of-")?;
    let (prefix, no) = rest.rsplit_once('-')?;
    if no.len() != 5 || total.len() != 5 {
        return None;
    }
    let no: u32 = no.parse().ok()?;
    let total: u32 = total.parse().ok()?;
    if no != 1 || total == 0 {
        return None;
    }
    let dir = path.parent().unwrap_or(Path::new(""));
    Some(
        (1..=total)
            .map(|i| dir.join(format!("{prefix}-{i:05}-of-{total:05}.gguf")))
            .collect(),
    )
}

/// Each part of a split set must say which part it is and how many there are.
fn check_split_part(metadata: &[(String, Value)], part_no: usize, n_parts: usize) -> Result<(), GgufError> {
    let int = |key: &str| find(metadata, key).and_then(Value::as_integer);
    match (int("split.no"), int("split.count")) {
        (Some(no), Some(count)) if no == part_no as i128 && count == n_parts as i128 => Ok(()),
        (no, count) => Err(GgufError::Split(format!(
            "part {} of {n_parts}: split.no = {no:?}, split.count = {count:?}",
            part_no + 1
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_names() {
        let p = split_paths(Path::new("/m/qwen-00001-of-00003.gguf")).unwrap();
        assert_eq!(p.len(), 3);
        assert_eq!(p[2], Path::new("/m/qwen-00003-of-00003.gguf"));
        assert!(split_paths(Path::new("/m/qwen-00002-of-00003.gguf")).is_none());
        assert!(split_paths(Path::new("/m/qwen.gguf")).is_none());
    }
}
