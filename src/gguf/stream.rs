//! Reading a GGUF file while it arrives (the browser's `fetch`): the header is parsed as soon
//! as enough bytes are in, then each tensor's bytes are handed to the caller the moment they
//! are complete, so the caller can place them on a device and let them go. The whole file is
//! never held, so wasm32's 4 GiB memory does not bound the model size.
//!
//! A split set streams part after part. The caller announces each part's length before its
//! bytes ([`GgufStream::begin`]: HTTP `Content-Length`, a `Blob`'s size): counts in the header
//! are checked against it, as they are against a whole file's size.

use super::parse::{self, Header, ParseError};
use super::{GgufError, GgufFile, Source, TensorInfo, TensorView};

/// Tries to parse the header again only once the bytes at hand have grown by this factor (or
/// reach what the last try needed), so a header of many megabytes (a 262k-token vocabulary)
/// is parsed a few times, not once per network chunk.
const RETRY_GROWTH: usize = 2;

/// The part being read.
struct Current {
    /// The part's announced length.
    size: u64,
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

/// A GGUF file (or split set) read from a stream of chunks: [`Self::begin`] each part with its
/// length, feed its bytes with [`Self::push`]; [`Self::finish`] then gives the file's metadata
/// and tensor table (no tensor data).
pub struct GgufStream {
    /// How many files the model has (1, or the size of a split set).
    parts: usize,
    /// The part being read, once begun.
    current: Option<Current>,
    /// The headers and lengths of the parts already read.
    done: Vec<(Header, u64)>,
}

impl GgufStream {
    /// A stream of a model in `parts` files (1, or a split set read in order).
    pub fn new(parts: usize) -> Result<Self, GgufError> {
        if parts == 0 {
            return Err(GgufError::Stream("no files to read".into()));
        }
        Ok(GgufStream {
            parts,
            current: None,
            done: Vec::new(),
        })
    }

    /// Start the next part, of `size` bytes.
    pub fn begin(&mut self, size: u64) -> Result<(), GgufError> {
        if let Some(c) = &self.current {
            return Err(GgufError::Stream(format!(
                "file {} ended after {} of its {} bytes",
                self.done.len() + 1,
                c.pos,
                c.size
            )));
        }
        if self.done.len() == self.parts {
            return Err(GgufError::Stream(format!("a file after the last of {}", self.parts)));
        }
        self.current = Some(Current::new(size));
        if size == 0 {
            // Parsing empty bytes gives the error an empty file deserves.
            let mut none = |_: TensorView<'_>| Ok::<(), GgufError>(());
            self.take(&[], &mut none)?;
        }
        Ok(())
    }

    /// Bytes received of all parts so far.
    pub fn received(&self) -> u64 {
        self.done.iter().map(|(_, n)| n).sum::<u64>() + self.current.as_ref().map_or(0, |c| c.pos)
    }

    /// The metadata of the first part, once its header has been read: enough to check the
    /// architecture before the tensors arrive.
    pub fn metadata(&self) -> Option<&[(String, super::Value)]> {
        match (self.done.first(), &self.current) {
            (Some((h, _)), _) => Some(&h.metadata),
            (None, Some(Current { header: Some(p), .. })) => Some(&p.header.metadata),
            _ => None,
        }
    }

    /// Take the next bytes of the current part. `on_tensor` gets every tensor whose bytes are
    /// now complete, in file order; its error stops the stream.
    pub fn push<E: From<GgufError>>(
        &mut self,
        chunk: &[u8],
        on_tensor: &mut dyn FnMut(TensorView<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        let Some(c) = &self.current else {
            return Err(GgufError::Stream("bytes before a file was begun".into()).into());
        };
        if chunk.len() as u64 > c.size - c.pos {
            return Err(GgufError::Stream(format!(
                "file {} has more bytes than the {} announced",
                self.done.len() + 1,
                c.size
            ))
            .into());
        }
        self.take(chunk, on_tensor)
    }

    /// The file's metadata and tensor table, once every byte of every part has arrived.
    pub fn finish(self) -> Result<GgufFile, GgufError> {
        if let Some(c) = &self.current {
            return Err(GgufError::Stream(format!(
                "file {} of {} ended after {} of its {} bytes",
                self.done.len() + 1,
                self.parts,
                c.pos,
                c.size
            )));
        }
        if self.done.len() < self.parts {
            return Err(GgufError::Stream(format!(
                "{} of {} files arrived",
                self.done.len(),
                self.parts
            )));
        }
        let parts = self
            .done
            .into_iter()
            .map(|(h, len)| (h, Source::Streamed(len)))
            .collect();
        GgufFile::assemble(parts)
    }

    /// Bytes `mine` of the current part (which they do not overrun).
    fn take<E: From<GgufError>>(
        &mut self,
        mine: &[u8],
        on_tensor: &mut dyn FnMut(TensorView<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        let part = self.done.len();
        let Some(c) = self.current.as_mut() else {
            return Ok(());
        };
        let start = c.pos;
        c.pos += mine.len() as u64;
        if c.header.is_some() {
            feed(c, start, mine, on_tensor)?;
        } else {
            c.head.extend_from_slice(mine);
            if c.head.len() >= c.next_try || c.pos == c.size {
                match parse::parse_prefix(&c.head, c.size) {
                    Ok(header) => {
                        let head = std::mem::take(&mut c.head);
                        c.header = Some(parsed(header, part)?);
                        // What arrived with the header may already hold tensor data.
                        feed(c, 0, &head, on_tensor)?;
                    }
                    Err(ParseError::Incomplete { need }) => {
                        c.next_try = (need as usize).max(c.head.len() * RETRY_GROWTH);
                    }
                    Err(ParseError::Gguf(e)) => return Err(e.into()),
                }
            }
        }
        if c.pos == c.size {
            self.end_part()?;
        }
        Ok(())
    }

    /// The current part is complete: keep its header.
    fn end_part(&mut self) -> Result<(), GgufError> {
        let Some(c) = self.current.take() else {
            return Ok(());
        };
        let parsed = c
            .header
            .ok_or_else(|| GgufError::Stream("a file ended inside its header".into()))?;
        if let Some(t) = parsed.tensors.get(parsed.next) {
            // Unreachable for a header that parsed (tensor bounds are checked against the
            // size), kept as an error rather than an assumption.
            return Err(GgufError::Stream(format!("tensor '{}' did not arrive", t.name)));
        }
        self.done.push((parsed.header, c.size));
        Ok(())
    }
}

/// A parsed header of part `part`, its tensors ordered by offset (which must not overlap).
fn parsed(header: Header, part: usize) -> Result<Parsed, GgufError> {
    let mut tensors: Vec<TensorInfo> = header
        .tensors
        .iter()
        .map(|t| TensorInfo {
            name: t.name.clone(),
            ty: t.ty,
            shape: t.shape.clone(),
            offset: t.offset,
            bytes: t.bytes,
            part,
        })
        .collect();
    tensors.sort_by_key(|t| t.offset);
    if let Some(w) = tensors.windows(2).find(|w| w[0].offset + w[0].bytes > w[1].offset) {
        return Err(GgufError::BadTensor {
            tensor: w[1].name.clone(),
            problem: format!("its data overlaps tensor '{}'", w[0].name),
        });
    }
    Ok(Parsed {
        header,
        tensors,
        next: 0,
        pending: Vec::new(),
    })
}

impl Current {
    fn new(size: u64) -> Self {
        Current {
            size,
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
                // Bounded by the announced file size, which the header was checked against;
                // that size comes from the sender (HTTP `Content-Length`), so a length no
                // memory can hold is an error, not an abort.
                let fits = usize::try_from(t.bytes).is_ok_and(|n| p.pending.try_reserve_exact(n).is_ok());
                if !fits {
                    return Err(GgufError::Stream(format!(
                        "tensor '{}' needs {} bytes, which cannot be allocated",
                        t.name, t.bytes
                    ))
                    .into());
                }
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
