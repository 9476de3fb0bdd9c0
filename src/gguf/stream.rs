//! Reading a GGUF file while it arrives (the browser's `fetch`): the header is parsed as soon
//! as enough bytes are in, then each tensor's bytes are handed to the caller the moment they
//! are complete, so the caller can place them on a device and let them go. The whole file is
//! never held, so wasm32's 4 GiB memory does not bound the model size.
//!
//! A split set streams part after part. The caller must know each part's length up front
//! (HTTP `Content-Length`, a `Blob`'s size): counts in the header are checked against it, as
//! they are against a whole file's size.

use super::parse::{self, Header, ParseError};
use super::{GgufError, GgufFile, Source, TensorInfo, TensorView};

/// Tries to parse the header again only once the bytes at hand have grown by this factor (or
/// reach what the last try needed), so a header of many megabytes (a 262k-token vocabulary)
/// is parsed a few times, not once per network chunk.
const RETRY_GROWTH: usize = 2;

/// The part being read.
struct Current {
    /// Bytes of this part received so far.
    pos: u64,
    /// Bytes received before the header could be parsed.
    head: Vec<u8>,
    /// The length `head` must reach before the next parse attempt.
    next_try: usize,
    /// Once parsed: the header, its tensors by data offset, and how far through them we are.
    header: Option<Parsed>,
}

struct Parsed {
    header: Header,
    /// This part's tensors (as the file model names them), ordered by offset.
    tensors: Vec<TensorInfo>,
    next: usize,
    /// The bytes of `tensors[next]` received so far, when they span several chunks.
    pending: Vec<u8>,
}

/// A GGUF file (or split set) read from a stream of chunks. Feed it with [`Self::push`];
/// [`Self::finish`] then gives the file's metadata and tensor table (no tensor data).
pub struct GgufStream {
    /// The byte length of each part.
    sizes: Vec<u64>,
    /// The index of the part being read.
    part: usize,
    current: Current,
    /// The headers of the parts already read.
    done: Vec<Header>,
}

impl GgufStream {
    /// A stream of a file, or a split set of files in order, of these byte lengths.
    pub fn new(sizes: Vec<u64>) -> Result<Self, GgufError> {
        if sizes.is_empty() {
            return Err(GgufError::Stream("no files to read".into()));
        }
        Ok(GgufStream {
            sizes,
            part: 0,
            current: Current::new(),
            done: Vec::new(),
        })
    }

    /// Total bytes of all parts.
    pub fn total_bytes(&self) -> u64 {
        self.sizes.iter().sum()
    }

    /// The metadata of the first part, once its header has been read: enough to check the
    /// architecture before the tensors arrive.
    pub fn metadata(&self) -> Option<&[(String, super::Value)]> {
        match (self.done.first(), &self.current.header) {
            (Some(h), _) => Some(&h.metadata),
            (None, Some(p)) => Some(&p.header.metadata),
            (None, None) => None,
        }
    }

    /// Take the next bytes of the file (of the current part; a chunk may run into the next
    /// part). `on_tensor` gets every tensor whose bytes are now complete, in file order; its
    /// error stops the stream.
    pub fn push<E: From<GgufError>>(
        &mut self,
        mut chunk: &[u8],
        on_tensor: &mut dyn FnMut(TensorView<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        while !chunk.is_empty() {
            let Some(&size) = self.sizes.get(self.part) else {
                return Err(GgufError::Stream(format!(
                    "{} more bytes after the end of the last file ({} bytes in all)",
                    chunk.len(),
                    self.total_bytes()
                ))
                .into());
            };
            let room = (size - self.current.pos) as usize;
            let (mine, rest) = chunk.split_at(room.min(chunk.len()));
            self.take(mine, size, on_tensor)?;
            chunk = rest;
            if self.current.pos == size {
                self.end_part()?;
            }
        }
        Ok(())
    }

    /// The file's metadata and tensor table, once every byte has arrived.
    pub fn finish(self) -> Result<GgufFile, GgufError> {
        if self.part < self.sizes.len() {
            return Err(GgufError::Stream(format!(
                "file {} of {} ended after {} of its {} bytes",
                self.part + 1,
                self.sizes.len(),
                self.current.pos,
                self.sizes[self.part]
            )));
        }
        let parts = self
            .done
            .into_iter()
            .zip(&self.sizes)
            .map(|(h, &len)| (h, Source::Streamed(len)))
            .collect();
        GgufFile::assemble(parts)
    }

    /// Bytes `mine` of the current part of `size` bytes.
    fn take<E: From<GgufError>>(
        &mut self,
        mine: &[u8],
        size: u64,
        on_tensor: &mut dyn FnMut(TensorView<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        let c = &mut self.current;
        let start = c.pos;
        c.pos += mine.len() as u64;
        if c.header.is_some() {
            return feed(c, start, mine, on_tensor);
        }
        c.head.extend_from_slice(mine);
        if c.head.len() < c.next_try && c.pos < size {
            return Ok(());
        }
        match parse::parse_prefix(&c.head, size) {
            Ok(header) => {
                let head = std::mem::take(&mut c.head);
                let mut tensors: Vec<TensorInfo> = header
                    .tensors
                    .iter()
                    .map(|t| TensorInfo {
                        name: t.name.clone(),
                        ty: t.ty,
                        shape: t.shape.clone(),
                        offset: t.offset,
                        bytes: t.bytes,
                        part: self.part,
                    })
                    .collect();
                tensors.sort_by_key(|t| t.offset);
                if let Some(w) = tensors.windows(2).find(|w| w[0].offset + w[0].bytes > w[1].offset) {
                    return Err(GgufError::BadTensor {
                        tensor: w[1].name.clone(),
                        problem: format!("its data overlaps tensor '{}'", w[0].name),
                    }
                    .into());
                }
                c.header = Some(Parsed {
                    header,
                    tensors,
                    next: 0,
                    pending: Vec::new(),
                });
                // What arrived with the header may already hold tensor data.
                feed(c, 0, &head, on_tensor)
            }
            Err(ParseError::Incomplete { need }) => {
                c.next_try = (need as usize).max(c.head.len() * RETRY_GROWTH);
                Ok(())
            }
            Err(ParseError::Gguf(e)) => Err(e.into()),
        }
    }

    /// The current part is complete: keep its header, start the next.
    fn end_part(&mut self) -> Result<(), GgufError> {
        let c = std::mem::replace(&mut self.current, Current::new());
        let parsed = c
            .header
            .ok_or_else(|| GgufError::Stream("a file ended inside its header".into()))?;
        if let Some(t) = parsed.tensors.get(parsed.next) {
            // Unreachable for a header that parsed (tensor bounds are checked against the
            // size), kept as an error rather than an assumption.
            return Err(GgufError::Stream(format!("tensor '{}' did not arrive", t.name)));
        }
        self.done.push(parsed.header);
        self.part += 1;
        Ok(())
    }
}

impl Current {
    fn new() -> Self {
        Current {
            pos: 0,
            head: Vec::new(),
            next_try: 0,
            header: None,
        }
    }
}

/// Bytes `bytes` of the current part, starting at offset `start` of the part, after its header
/// was parsed: hand out every tensor they complete.
fn feed<E: From<GgufError>>(
    c: &mut Current,
    start: u64,
    bytes: &[u8],
    on_tensor: &mut dyn FnMut(TensorView<'_>) -> Result<(), E>,
) -> Result<(), E> {
    let Some(p) = c.header.as_mut() else {
        return Ok(());
    };
    let end = start + bytes.len() as u64;
    while let Some(t) = p.tensors.get(p.next) {
        let t_start = p.header.data_offset + t.offset;
        let t_end = t_start + t.bytes;
        if t_start >= end {
            break;
        }
        // The part of this tensor that lies in `bytes` (it may have begun in an earlier chunk).
        let lo = (t_start.max(start) - start) as usize;
        let hi = (t_end.min(end) - start) as usize;
        let complete_here = t_start >= start && t_end <= end && p.pending.is_empty();
        if complete_here {
            on_tensor(TensorView {
                info: t,
                data: &bytes[lo..hi],
            })?;
        } else {
            if p.pending.is_empty() {
                // Bounded by the file size, which the header was checked against.
                p.pending.reserve_exact(t.bytes as usize);
            }
            p.pending.extend_from_slice(&bytes[lo..hi]);
            if (p.pending.len() as u64) < t.bytes {
                break;
            }
            let data = std::mem::take(&mut p.pending);
            on_tensor(TensorView { info: t, data: &data })?;
        }
        p.next += 1;
    }
    Ok(())
}
