//! Streamed GGUF reading (`gguf::stream`), the browser's way in: every tensor arrives once,
//! byte-exact and in file order, whatever the chunking; split sets stream part after part; a
//! model placed from the stream computes the same logits as one loaded from the file; bad
//! streams are errors that say what is wrong.

mod common;

use std::sync::Arc;

use tinyllm::backend::cpu::CpuBackend;
use tinyllm::backend::{AnyBackend, Backend, BackendKind};
use tinyllm::gguf::stream::{Arrivals, GgufStream};
use tinyllm::gguf::{GgufError, GgufFile, TensorInfo, TensorView, Value};
use tinyllm::model::{Model, Placed, Placement};

const FIXTURES: [&str; 4] = [
    "fixtures/llama.Q4_K_M.gguf",
    "fixtures/qwen2.Q8_0.gguf",
    "fixtures/qwen3.F16.gguf",
    "fixtures/gemma3.Q4_K_M.gguf",
];

/// Tensor names with their bytes.
type Tensors = Vec<(String, Vec<u8>)>;

/// Stream `parts` (one file or a split set) in chunks of `chunk` bytes; the tensors in
/// arrival order with their bytes, and the file.
fn stream(parts: &[Vec<u8>], chunk: usize) -> Result<(Tensors, GgufFile), GgufError> {
    let mut s = GgufStream::new(parts.len())?;
    let mut got = Vec::new();
    for part in parts {
        s.begin(part.len() as u64)?;
        for c in part.chunks(chunk.max(1)) {
            s.push::<GgufError>(c, &mut |t| {
                got.push((t.info.name.clone(), t.data.to_vec()));
                Ok(())
            })?;
        }
    }
    Ok((got, s.finish()?))
}

/// The tensors of a resident file, in data order, with their bytes.
fn in_file_order(file: &GgufFile) -> Tensors {
    let mut t: Vec<_> = file.tensors().iter().collect();
    t.sort_by_key(|t| (t.part, t.offset));
    t.into_iter()
        .map(|t| (t.name.clone(), file.view(t).data.to_vec()))
        .collect()
}

fn same_table(a: &GgufFile, b: &GgufFile) {
    assert_eq!(a.metadata().len(), b.metadata().len());
    for ((ka, va), (kb, vb)) in a.metadata().iter().zip(b.metadata()) {
        assert_eq!(ka, kb);
        assert_eq!(va, vb, "metadata {ka}");
    }
    assert_eq!(a.tensors().len(), b.tensors().len());
    for (x, y) in a.tensors().iter().zip(b.tensors()) {
        assert_eq!(
            (&x.name, x.ty, &x.shape, x.offset, x.bytes, x.part),
            (&y.name, y.ty, &y.shape, y.offset, y.bytes, y.part)
        );
    }
}

/// A reader that asks for pieces of `piece` bytes for the tensors of more than `over` bytes and
/// reassembles them, checking each piece: whole rows, at most `piece` bytes (or one row), the
/// rows in order with no gap.
struct Reassemble {
    piece: usize,
    over: u64,
    got: Tensors,
    /// The tensor in pieces: its name, its bytes so far, its next row.
    open: Option<(String, Vec<u8>, usize)>,
    pieces: usize,
}

impl Arrivals for Reassemble {
    type Error = GgufError;
    fn whole(&mut self, t: TensorView<'_>) -> Result<(), GgufError> {
        assert!(self.open.is_none(), "{} whole while another is in pieces", t.info.name);
        self.got.push((t.info.name.clone(), t.data.to_vec()));
        Ok(())
    }
    fn pieces(&mut self, info: &TensorInfo) -> Result<Option<usize>, GgufError> {
        Ok((info.bytes > self.over).then_some(self.piece))
    }
    fn piece(&mut self, info: &TensorInfo, row0: usize, data: &[u8]) -> Result<(), GgufError> {
        let row = info.shape[0] as usize / info.ty.block_size() * info.ty.block_bytes();
        assert!(
            data.len().is_multiple_of(row) && !data.is_empty(),
            "{}: {} bytes",
            info.name,
            data.len()
        );
        assert!(
            data.len() <= self.piece.max(row),
            "{}: a piece of {} bytes",
            info.name,
            data.len()
        );
        let (name, bytes, next) = self.open.get_or_insert_with(|| (info.name.clone(), Vec::new(), 0));
        assert_eq!(name, &info.name);
        assert_eq!(row0, *next, "{}: rows in order", info.name);
        bytes.extend_from_slice(data);
        *next += data.len() / row;
        self.pieces += 1;
        if bytes.len() as u64 == info.bytes {
            let (name, bytes, _) = self.open.take().unwrap();
            self.got.push((name, bytes));
        }
        Ok(())
    }
}

/// A reader taking large tensors in pieces gets them whole-row piece by piece, in order, and
/// they reassemble to the file's bytes, whatever the chunking and the piece size (a piece
/// smaller than a row gives one row at a time).
#[test]
fn large_tensors_arrive_in_pieces_of_whole_rows() {
    for rel in FIXTURES {
        let bytes = std::fs::read(common::golden(rel)).unwrap();
        let file = GgufFile::from_bytes(bytes.clone()).unwrap();
        let want = in_file_order(&file);
        for (chunk, piece) in [
            (1, 4096),
            (777, 1000),
            (4096, 10_000),
            (65536, 5000),
            (4096, 100),
            (bytes.len(), 4096),
        ] {
            let mut r = Reassemble {
                piece,
                over: 8192,
                got: Vec::new(),
                open: None,
                pieces: 0,
            };
            let mut s = GgufStream::new(1).unwrap();
            s.begin(bytes.len() as u64).unwrap();
            for c in bytes.chunks(chunk) {
                s.push_to(c, &mut r).unwrap();
            }
            same_table(&s.finish().unwrap(), &file);
            assert!(r.open.is_none(), "{rel}: a tensor left open");
            assert_eq!(r.got.len(), want.len(), "{rel} chunk {chunk} piece {piece}");
            for ((gn, gb), (wn, wb)) in r.got.iter().zip(&want) {
                assert_eq!(gn, wn, "{rel}: order");
                assert!(gb == wb, "{rel} chunk {chunk} piece {piece}: bytes of {gn}");
            }
            // Only a chunk holding a whole tensor hands it over whole.
            if chunk < 8192 {
                assert!(r.pieces > want.len(), "{rel} chunk {chunk}: {} pieces", r.pieces);
            }
        }
    }
}

#[test]
fn every_tensor_arrives_once_in_file_order_whatever_the_chunking() {
    for rel in FIXTURES {
        let bytes = std::fs::read(common::golden(rel)).unwrap();
        let file = GgufFile::from_bytes(bytes.clone()).unwrap();
        let want = in_file_order(&file);
        for chunk in [1, 7, 4096, 65536, bytes.len()] {
            let (got, streamed) = stream(std::slice::from_ref(&bytes), chunk).unwrap();
            assert_eq!(got.len(), want.len(), "{rel} in chunks of {chunk}");
            for ((gn, gb), (wn, wb)) in got.iter().zip(&want) {
                assert_eq!(gn, wn, "{rel} in chunks of {chunk}: order");
                assert!(gb == wb, "{rel} in chunks of {chunk}: bytes of {gn}");
            }
            same_table(&streamed, &file);
            assert!(!streamed.is_resident());
            assert_eq!(streamed.file_bytes(), bytes.len() as u64);
            let e = streamed.tensor(&want[0].0).unwrap_err();
            assert!(matches!(e, GgufError::NotResident(_)), "{e}");
        }
    }
}

#[test]
fn the_real_models_stream_whole() {
    for name in common::REAL_MODELS {
        let file = GgufFile::open(common::real_model(name)).unwrap();
        let bytes = std::fs::read(common::real_model(name)).unwrap();
        let want = in_file_order(&file);
        // Network-sized chunks that do not line up with anything.
        let (got, streamed) = stream(std::slice::from_ref(&bytes), 65_537).unwrap();
        assert_eq!(got.len(), want.len(), "{name}");
        assert!(got.iter().zip(&want).all(|(g, w)| g == w), "{name}: tensor bytes");
        same_table(&streamed, &file);
    }
}

#[test]
fn split_sets_stream_part_after_part() {
    let bytes = std::fs::read(common::golden(FIXTURES[0])).unwrap();
    let file = GgufFile::from_bytes(bytes).unwrap();
    let parts = common::gguf_write::split(&file, 3);
    assert_eq!(parts.len(), 3);
    let whole = GgufFile::from_parts(parts.clone()).unwrap();
    let want = in_file_order(&whole);
    for chunk in [1000, 4096, parts.iter().map(Vec::len).max().unwrap()] {
        let (got, streamed) = stream(&parts, chunk).unwrap();
        assert!(got == want, "split set in chunks of {chunk}");
        same_table(&streamed, &whole);
        assert_eq!(streamed.part_count(), 3);
    }
    // The parts in the wrong order are refused as a split set would be from files.
    let swapped = vec![parts[1].clone(), parts[0].clone(), parts[2].clone()];
    let e = stream(&swapped, 4096).unwrap_err().to_string();
    assert!(e.contains("split"), "{e}");
}

/// Logits of a few teacher-forced tokens, as bits.
fn logits_bits<B: Backend>(model: Model<B>) -> Vec<u32> {
    let model = Arc::new(model);
    let mut s = tinyllm::engine::Session::new(model, Default::default()).unwrap();
    let logits = s.prefill(&[1, 15, 27, 300, 42, 7]).unwrap();
    logits.iter().map(|v| v.to_bits()).collect()
}

fn placed_model<B: Backend>(be: B, bytes: &[u8], chunk: usize) -> Model<B> {
    let mut s = GgufStream::new(1).unwrap();
    s.begin(bytes.len() as u64).unwrap();
    let placed = Placed::default();
    for c in bytes.chunks(chunk) {
        s.push::<GgufError>(c, &mut |t| {
            placed.place(&be, t);
            Ok(())
        })
        .unwrap();
    }
    let file = Arc::new(s.finish().unwrap());
    assert_eq!(placed.len(), file.tensors().len());
    Model::load_placed(be, file, placed).unwrap()
}

#[test]
fn a_model_placed_from_the_stream_computes_the_same_logits() {
    for rel in FIXTURES {
        let bytes = std::fs::read(common::golden(rel)).unwrap();
        let file = Arc::new(GgufFile::from_bytes(bytes.clone()).unwrap());
        let loaded = logits_bits(Model::load(CpuBackend::new(2).unwrap(), file).unwrap());
        let streamed = logits_bits(placed_model(CpuBackend::new(2).unwrap(), &bytes, 10_000));
        assert!(
            loaded == streamed,
            "{rel}: CPU logits differ between loaded and streamed"
        );
    }
}

#[test]
fn a_model_placed_from_the_stream_on_webgpu_computes_the_same_logits() {
    let open = || tinyllm::backend::AnyBackend::open(BackendKind::WebGpu, 1);
    if common::device_or_skip(open).is_none() {
        return;
    }
    let rel = FIXTURES[0];
    let bytes = std::fs::read(common::golden(rel)).unwrap();
    let file = Arc::new(GgufFile::from_bytes(bytes.clone()).unwrap());
    let loaded = logits_bits(Model::load(open().unwrap(), file).unwrap());
    let streamed = logits_bits(placed_model(open().unwrap(), &bytes, 10_000));
    assert!(
        loaded == streamed,
        "{rel}: WebGPU logits differ between loaded and streamed"
    );
}

/// On WebGPU, matrices placed a piece of rows at a time as the stream hands them over
/// ([`Placement`]: pieces of 650 bytes, e.g. three Q6_K rows of 210, so pieces end off the
/// 4-byte and texture-row boundaries) compute the bits of the model loaded whole, for both
/// matmul variants (texture-held weights, buffers) and weights split across parts of 64 KiB.
#[test]
fn a_model_placed_in_pieces_on_webgpu_computes_the_same_logits() {
    use tinyllm::backend::webgpu::{MatmulVariant, WebGpuBackend, WebGpuOptions};
    let open = |matmul, max_binding| {
        WebGpuBackend::with_options(WebGpuOptions {
            matmul: Some(matmul),
            max_binding,
            ..Default::default()
        })
        .map(AnyBackend::WebGpu)
        .map_err(|e| tinyllm::backend::BackendError::Unavailable {
            backend: "webgpu",
            reason: e.to_string(),
        })
    };
    if common::device_or_skip(|| open(MatmulVariant::Texture, None)).is_none() {
        return;
    }
    // The IQ2_XS file's codebook matrices: buffers that begin with their grid table.
    for rel in [FIXTURES[0], FIXTURES[3], "fixtures/llama.IQ2_XS.gguf"] {
        let bytes = std::fs::read(common::golden(rel)).unwrap();
        let file = Arc::new(GgufFile::from_bytes(bytes.clone()).unwrap());
        for matmul in [MatmulVariant::Texture, MatmulVariant::Workgroup] {
            for max_binding in [None, Some(64 << 10)] {
                let loaded = logits_bits(Model::load(open(matmul, max_binding).unwrap(), file.clone()).unwrap());
                let be = open(matmul, max_binding).unwrap();
                let mut s = GgufStream::new(1).unwrap();
                s.begin(bytes.len() as u64).unwrap();
                let mut placement = Placement::new(650);
                for c in bytes.chunks(4096) {
                    s.push_to(c, &mut placement.onto(&be)).unwrap();
                }
                let file = Arc::new(s.finish().unwrap());
                let placed = placement.into_placed();
                assert_eq!(placed.len(), file.tensors().len());
                let streamed = logits_bits(Model::load_placed(be, file, placed).unwrap());
                assert!(
                    loaded == streamed,
                    "{rel} ({matmul:?}, parts of {max_binding:?}): WebGPU logits differ between loaded and placed in pieces"
                );
            }
        }
    }
}

/// A stream of one file of `size` bytes, begun.
fn begun(size: usize) -> GgufStream {
    let mut s = GgufStream::new(1).unwrap();
    s.begin(size as u64).unwrap();
    s
}

#[test]
fn bad_streams_say_what_is_wrong() {
    let bytes = std::fs::read(common::golden(FIXTURES[0])).unwrap();
    // Ends early.
    let mut s = begun(bytes.len());
    s.push::<GgufError>(&bytes[..bytes.len() / 2], &mut |_| Ok(())).unwrap();
    assert_eq!(s.received(), bytes.len() as u64 / 2);
    let e = s.finish().unwrap_err().to_string();
    assert!(e.contains("ended after") && e.contains(&bytes.len().to_string()), "{e}");
    // More bytes than announced.
    let mut s = begun(bytes.len() - 10);
    let e = s.push::<GgufError>(&bytes, &mut |_| Ok(())).unwrap_err().to_string();
    assert!(e.contains("more bytes than"), "{e}");
    // Not a GGUF file: refused from its first bytes, before anything else arrives.
    let html = b"<!doctype html><html><body>404 Not Found</body></html>".repeat(100);
    let mut s = begun(html.len() * 10);
    let e = s.push::<GgufError>(&html, &mut |_| Ok(())).unwrap_err();
    assert!(matches!(e, GgufError::BadMagic { .. }), "{e}");
    // An empty file.
    let mut s = GgufStream::new(1).unwrap();
    let e = s.begin(0).unwrap_err().to_string();
    assert!(e.contains("truncated"), "{e}");
    // A file that ends inside its header: its counts cannot fit.
    let mut s = begun(100);
    let e = s
        .push::<GgufError>(&bytes[..100], &mut |_| Ok(()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("only 84 bytes are left"), "{e}");
    // A count the announced size cannot hold is refused before anything is allocated.
    let mut b = bytes.clone();
    b[8..16].copy_from_slice(&(1u64 << 60).to_le_bytes());
    let mut s = begun(b.len());
    let e = s.push::<GgufError>(&b[..64], &mut |_| Ok(())).unwrap_err().to_string();
    assert!(e.contains("tensor_count"), "{e}");
    // The caller's error stops the stream.
    let mut s = begun(bytes.len());
    let e = s
        .push::<GgufError>(&bytes, &mut |t| {
            Err(GgufError::Stream(format!("refused {}", t.info.name)))
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("refused"), "{e}");
    // Parts: none at all, bytes before a part, a part too many, a split set cut short.
    assert!(GgufStream::new(0).is_err());
    let mut s = GgufStream::new(1).unwrap();
    assert!(s.push::<GgufError>(&bytes[..10], &mut |_| Ok(())).is_err());
    let (_, _) = stream(std::slice::from_ref(&bytes), 4096).unwrap();
    let mut s = begun(bytes.len());
    s.push::<GgufError>(&bytes, &mut |_| Ok(())).unwrap();
    let e = s.begin(10).unwrap_err().to_string();
    assert!(e.contains("after the last"), "{e}");
    let mut s = GgufStream::new(2).unwrap();
    s.begin(bytes.len() as u64).unwrap();
    s.push::<GgufError>(&bytes, &mut |_| Ok(())).unwrap();
    let e = s.finish().unwrap_err().to_string();
    assert!(e.contains("1 of 2 files"), "{e}");
}

#[test]
fn the_architecture_is_known_before_the_tensors_arrive() {
    let bytes = std::fs::read(common::golden(FIXTURES[0])).unwrap();
    let file = GgufFile::from_bytes(bytes.clone()).unwrap();
    let changed = common::gguf_write::with_metadata(&file, "general.architecture", Value::String("mamba".into()));
    let mut s = begun(changed.len());
    let data_start = file.data_offset(0) as usize;
    s.push::<GgufError>(&changed[..data_start], &mut |_| Ok(())).unwrap();
    let meta = s.metadata().expect("the header is complete");
    let arch = meta
        .iter()
        .find(|(k, _)| k == "general.architecture")
        .map(|(_, v)| v.clone());
    assert_eq!(arch, Some(Value::String("mamba".into())));
}

/// The first part's header is lent as a file (the browser sizes the model from it before the
/// tensors arrive): the same metadata and tensor table as the file opened whole, nothing before
/// the header is in, and the stream ends with its metadata intact.
#[test]
fn the_first_header_is_lent_whole_and_kept() {
    let bytes = std::fs::read(common::golden(FIXTURES[1])).unwrap();
    let whole = GgufFile::from_bytes(bytes.clone()).unwrap();
    let data_start = whole.data_offset(0) as usize;
    let mut s = begun(bytes.len());
    s.push::<GgufError>(&bytes[..data_start / 2], &mut |_| Ok(())).unwrap();
    assert!(s.with_first_header(|_| ()).is_none(), "no header yet");
    s.push::<GgufError>(&bytes[data_start / 2..data_start + 1], &mut |_| Ok(()))
        .unwrap();
    let lent = s.with_first_header(|f| {
        same_table(f, &whole);
        (f.metadata().len(), f.tensors().len())
    });
    assert_eq!(lent, Some((whole.metadata().len(), whole.tensors().len())));
    s.push::<GgufError>(&bytes[data_start + 1..], &mut |_| Ok(())).unwrap();
    // Lent again once the part is done, and given back: the finished file still has it all.
    assert!(s.with_first_header(|f| same_table(f, &whole)).is_some());
    same_table(&s.finish().unwrap(), &whole);
}
