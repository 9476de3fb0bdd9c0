//! Reading a GGUF file while it arrives (the browser's `fetch`): the header is parsed as soon
//! as enough bytes are in, then each tensor's bytes are handed to the caller the moment they
//! are complete, so the caller can place them on a device and let them go. The whole file is
//! never held, so wasm32's 4 GiB memory does not bound the model size.
//!
//! A split set streams part after part. The caller announces each part's length before its
//! bytes ([`GgufStream::begin`]: HTTP `Content-Length`, a `Blob`'s size): counts in the header
//! are checked against it, as they are against a whole file's size.
//!
//! A reader that can place a tensor bit by bit (the WebGPU backend writes rows into buffers it
//! made at the tensor's start) takes large tensors in pieces of whole rows instead
//! ([`Arrivals::pieces`]): then the stream holds at most one piece and a row, not the tensor.

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
    /// The bytes of `tensors[next]` received so far, when they span several chunks (in pieces:
    /// those not handed out yet, less than a piece and a row).
    pending: Vec<u8>,
    /// How `tensors[next]` is handed out, once its first bytes are in.
    mode: Option<Mode>,
}

/// How the tensor being received is handed out.
#[derive(Clone, Copy)]
enum Mode {
    Whole,
    /// In pieces of `rows` whole rows of `row_bytes`; `row0` rows handed out so far.
    Pieces {
        row_bytes: usize,
        rows: usize,
        row0: usize,
    },
}

/// What a stream's reader does with the tensors as they arrive, in file order.
pub trait Arrivals {
    type Error: From<GgufError>;
    /// A tensor whose bytes are all here.
    fn whole(&mut self, tensor: TensorView<'_>) -> Result<(), Self::Error>;
    /// Whether `info`, whose bytes span chunks, should rather arrive in pieces, and of how many
    /// bytes at most (rounded down to whole rows, at least one row). `None`: whole.
    fn pieces(&mut self, _info: &TensorInfo) -> Result<Option<usize>, Self::Error> {
        Ok(None)
    }
    /// Rows `row0..` of a tensor taken in pieces (`data`: whole rows in the file layout); the
    /// piece that reaches the tensor's end is its last.
    fn piece(&mut self, _info: &TensorInfo, _row0: usize, _data: &[u8]) -> Result<(), Self::Error> {
        Ok(())
    }
}

/// [`Arrivals`] of a closure that takes every tensor whole.
struct Whole<'f, E>(&'f mut dyn FnMut(TensorView<'_>) -> Result<(), E>);

impl<E: From<GgufError>> Arrivals for Whole<'_, E> {
    type Error = E;
    fn whole(&mut self, tensor: TensorView<'_>) -> Result<(), E> {
        (self.0)(tensor)
    }
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
            self.take(&[], &mut Whole(&mut none))?;
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

    /// Lends the first part's header, once read, to `f` as a [`GgufFile`] of that part alone
    /// (metadata and tensor table, no data): to size the model before its tensors arrive
    /// without parsing or copying the header a second time.
    pub fn with_first_header<R>(&mut self, f: impl FnOnce(&GgufFile) -> R) -> Option<R> {
        let (header, size) = match (self.done.first_mut(), self.current.as_mut()) {
            (Some((h, n)), _) => (h, *n),
            (
                None,
                Some(Current {
                    header: Some(p), size, ..
                }),
            ) => (&mut p.header, *size),
            _ => return None,
        };
        Some(GgufFile::lend_header(header, size, f))
    }

    /// Take the next bytes of the current part. `on_tensor` gets every tensor whose bytes are
    /// now complete, in file order; its error stops the stream.
    pub fn push<E: From<GgufError>>(
        &mut self,
        chunk: &[u8],
        on_tensor: &mut dyn FnMut(TensorView<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        self.push_to(chunk, &mut Whole(on_tensor))
    }

    /// [`Self::push`] to a reader that may take large tensors in pieces.
    pub fn push_to<A: Arrivals + ?Sized>(&mut self, chunk: &[u8], to: &mut A) -> Result<(), A::Error> {
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
        self.take(chunk, to)
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
    fn take<A: Arrivals + ?Sized>(&mut self, mine: &[u8], to: &mut A) -> Result<(), A::Error> {
        let part = self.done.len();
        let Some(c) = self.current.as_mut() else {
            return Ok(());
        };
        let start = c.pos;
        c.pos += mine.len() as u64;
        if c.header.is_some() {
            feed(c, start, mine, to)?;
        } else {
            c.head.extend_from_slice(mine);
            if c.head.len() >= c.next_try || c.pos == c.size {
                match parse::parse_prefix(&c.head, c.size) {
                    Ok(header) => {
                        let head = std::mem::take(&mut c.head);
                        c.header = Some(parsed(header, part)?);
                        // What arrived with the header may already hold tensor data.
                        feed(c, 0, &head, to)?;
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
    let mut tensors: Vec<TensorInfo> = header.tensors.iter().map(|t| TensorInfo::of(t, part)).collect();
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
        mode: None,
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
/// was parsed: hand out every tensor (or piece) they complete.
fn feed<A: Arrivals + ?Sized>(c: &mut Current, start: u64, bytes: &[u8], to: &mut A) -> Result<(), A::Error> {
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
        let mode = match p.mode {
            Some(m) => m,
            None if t_end <= end => Mode::Whole,
            None => pieces_of(t, to.pieces(t)?),
        };
        p.mode = Some(mode);
        match mode {
            Mode::Whole if t_start >= start && t_end <= end && p.pending.is_empty() => {
                to.whole(TensorView {
                    info: t,
                    data: &bytes[lo..hi],
                })?;
            }
            Mode::Whole => {
                if p.pending.is_empty() {
                    reserve(&mut p.pending, t, t.bytes)?;
                }
                p.pending.extend_from_slice(&bytes[lo..hi]);
                if (p.pending.len() as u64) < t.bytes {
                    break;
                }
                let data = std::mem::take(&mut p.pending);
                to.whole(TensorView { info: t, data: &data })?;
            }
            Mode::Pieces { row_bytes, rows, row0 } => {
                let piece = rows * row_bytes;
                if p.pending.capacity() == 0 {
                    reserve(&mut p.pending, t, (piece + row_bytes) as u64)?;
                }
                let mut row0 = row0;
                let mut rest = &bytes[lo..hi];
                // Whole pieces straight from the chunk where nothing is pending, else through
                // `pending`, a piece at a time.
                while !rest.is_empty() {
                    if p.pending.is_empty() && rest.len() >= piece {
                        to.piece(t, row0, &rest[..piece])?;
                        row0 += rows;
                        rest = &rest[piece..];
                        continue;
                    }
                    let take = (piece - p.pending.len()).min(rest.len());
                    p.pending.extend_from_slice(&rest[..take]);
                    rest = &rest[take..];
                    if p.pending.len() == piece {
                        to.piece(t, row0, &p.pending)?;
                        row0 += rows;
                        p.pending.clear();
                    }
                }
                if t_end > end {
                    p.mode = Some(Mode::Pieces { row_bytes, rows, row0 });
                    break;
                }
                // The tensor's last rows (its bytes are whole rows: checked by `pieces_of`).
                if !p.pending.is_empty() {
                    to.piece(t, row0, &p.pending)?;
                }
                p.pending = Vec::new();
            }
        }
        p.mode = None;
        p.next += 1;
    }
    Ok(())
}

/// The mode of tensor `t` for a reader that asked for pieces of at most `piece` bytes: whole
/// rows of `t` (at least one), or the whole tensor where its bytes are not whole rows.
fn pieces_of(t: &TensorInfo, piece: Option<usize>) -> Mode {
    let Some(piece) = piece else {
        return Mode::Whole;
    };
    let ty = t.ty;
    let row_bytes = t
        .shape
        .first()
        .map_or(0, |&n| n as usize / ty.block_size() * ty.block_bytes());
    if row_bytes == 0 || !t.bytes.is_multiple_of(row_bytes as u64) {
        return Mode::Whole;
    }
    Mode::Pieces {
        row_bytes,
        rows: (piece / row_bytes).max(1),
        row0: 0,
    }
}

/// Room for `n` more bytes of tensor `t` in `buf`. Bounded by the announced file size, which
/// the header was checked against; that size comes from the sender (HTTP `Content-Length`), so
/// a length no memory can hold is an error, not an abort.
fn reserve(buf: &mut Vec<u8>, t: &TensorInfo, n: u64) -> Result<(), GgufError> {
    let fits = usize::try_from(n).is_ok_and(|n| buf.try_reserve_exact(n).is_ok());
    if fits {
        Ok(())
    } else {
        Err(GgufError::Stream(format!(
            "tensor '{}' needs {} bytes, which cannot be allocated",
            t.name, n
        )))
    }
}
