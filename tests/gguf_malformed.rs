//! Malformed GGUF input: every corruption must be an error that names the field at fault,
//! never a panic and never an allocation sized by the corrupt number.

mod common;

use common::{models_dir, GgufWriter};
use tinyllm::gguf::{GgufError, GgufFile};

fn parse(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
    GgufFile::from_bytes(bytes)
}

fn err(bytes: Vec<u8>) -> String {
    match parse(bytes) {
        Ok(f) => panic!("expected an error, parsed {f:?}"),
        Err(e) => e.to_string(),
    }
}

/// A small valid file: two metadata keys and two F32 tensors.
fn valid() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.kv_str("general.architecture", "llama");
    w.kv_u32("llama.block_count", 2);
    w.tensor("a", &[8, 2], 0, 64);
    w.tensor("b", &[4], 0, 16);
    w
}

#[test]
fn valid_file_parses_and_views_tensors() {
    let f = parse(valid().finish()).unwrap();
    assert_eq!(f.architecture().unwrap(), "llama");
    assert_eq!(f.get_u32("llama.block_count").unwrap(), 2);
    let a = f.tensor("a").unwrap();
    assert_eq!(a.info.shape, vec![8, 2]);
    assert_eq!(a.data.len(), 64);
    assert_eq!(f.tensor("b").unwrap().to_f32().unwrap(), vec![1.0, 1.0, 1.0, 1.0]);
}

#[test]
fn bad_magic_and_versions() {
    let mut b = valid().finish();
    b[0..4].copy_from_slice(b"GGML");
    assert!(err(b).contains("magic"));
    for (v, want) in [(1u32, "version 1"), (4, "version 4"), (0x0300_0000, "big-endian")] {
        let mut b = valid().finish();
        b[4..8].copy_from_slice(&v.to_le_bytes());
        let e = err(b);
        assert!(e.contains(want), "{e}");
    }
}

#[test]
fn absurd_counts_are_rejected_before_allocating() {
    // tensor_count = 2^63
    let mut b = valid().finish();
    b[8..16].copy_from_slice(&(1u64 << 63).to_le_bytes());
    let e = err(b);
    assert!(e.contains("tensor_count") && e.contains("9223372036854775808"), "{e}");
    // metadata_kv_count = u64::MAX
    let mut b = valid().finish();
    b[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(err(b).contains("metadata_kv_count"));
    // a 2^40-byte key string
    let mut b = valid().finish();
    b[24..32].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let e = err(b);
    assert!(e.contains("metadata key #0") && e.contains("1099511627776"), "{e}");
    // a 2^40-byte string value
    let mut w = GgufWriter::new();
    w.kv_raw("general.name", 8, &(1u64 << 40).to_le_bytes());
    let e = err(w.finish());
    assert!(e.contains("general.name") && e.contains("1099511627776"), "{e}");
    // an array claiming 2^62 u32 elements
    let mut w = GgufWriter::new();
    let mut v = 4u32.to_le_bytes().to_vec();
    v.extend((1u64 << 62).to_le_bytes());
    w.kv_raw("tokenizer.ggml.scores", 9, &v);
    let e = err(w.finish());
    assert!(
        e.contains("tokenizer.ggml.scores") && e.contains("4611686018427387904"),
        "{e}"
    );
}

#[test]
fn unknown_types_and_bad_values() {
    let mut w = GgufWriter::new();
    w.kv_raw("x.key", 13, &[0; 8]);
    let e = err(w.finish());
    assert!(
        e.contains("x.key") && e.contains("unknown metadata value type 13"),
        "{e}"
    );

    let mut w = GgufWriter::new();
    w.kv_raw("x.flag", 7, &[2]);
    assert!(err(w.finish()).contains("x.flag"));

    let mut w = GgufWriter::new();
    let mut v = 3u64.to_le_bytes().to_vec();
    v.extend([0xff, 0xfe, 0xfd]);
    w.kv_raw("general.name", 8, &v);
    let e = err(w.finish());
    assert!(e.contains("general.name") && e.contains("UTF-8"), "{e}");

    let mut w = valid();
    w.kv_u32("llama.block_count", 3);
    assert!(err(w.finish()).contains("duplicate metadata key 'llama.block_count'"));

    for a in [0u32, 3, 48] {
        let mut w = valid();
        w.kv_u32("general.alignment", a);
        assert!(err(w.finish()).contains("general.alignment"));
    }

    // arrays nested 100 deep
    let mut v = Vec::new();
    for _ in 0..100 {
        v.extend(9u32.to_le_bytes());
        v.extend(1u64.to_le_bytes());
    }
    v.extend(4u32.to_le_bytes());
    v.extend(0u64.to_le_bytes());
    let mut w = GgufWriter::new();
    w.kv_raw("x.nested", 9, &v);
    let e = err(w.finish());
    assert!(e.contains("x.nested") && e.contains("nested deeper"), "{e}");
}

#[test]
fn bad_tensor_entries_name_the_tensor() {
    let mut w = valid();
    w.tensor("weird", &[32], 99, 64);
    let e = err(w.finish());
    assert!(e.contains("'weird'") && e.contains("unknown ggml type id 99"), "{e}");

    let mut w = valid();
    w.tensor_at("odd", &[4], 0, 16, 36);
    let e = err(w.finish());
    assert!(
        e.contains("'odd'") && e.contains("not a multiple of the alignment"),
        "{e}"
    );

    let mut w = valid();
    w.tensor_at("far", &[4], 0, 16, 1 << 40);
    let e = err(w.finish());
    assert!(e.contains("'far'") && e.contains("past the end"), "{e}");

    let mut w = valid();
    w.tensor_at("wrap", &[4], 0, 16, u64::MAX - 31);
    let e = err(w.finish());
    assert!(e.contains("'wrap'"), "{e}");

    let mut w = valid();
    w.tensor("huge", &[1 << 32, 1 << 32, 1 << 32], 0, 0);
    let e = err(w.finish());
    assert!(e.contains("'huge'") && e.contains("too many elements"), "{e}");

    let mut w = valid();
    w.tensor("fivedims", &[1, 1, 1, 1, 1], 0, 4);
    assert!(err(w.finish()).contains("'fivedims'"));

    let mut w = valid();
    w.tensor("zero", &[0, 4], 0, 0);
    assert!(err(w.finish()).contains("'zero'"));

    // Q4_0 rows must be whole 32-element blocks
    let mut w = valid();
    w.tensor("partial", &[33], 2, 0);
    let e = err(w.finish());
    assert!(e.contains("'partial'") && e.contains("block size 32"), "{e}");

    let mut w = valid();
    w.tensor("a", &[4], 0, 16);
    assert!(err(w.finish()).contains("duplicate tensor 'a'"));
}

#[test]
fn every_truncation_of_a_small_file_is_an_error() {
    let full = valid().finish();
    // The last 16 bytes are padding after tensor 'b' (64 + 16 bytes of data, padded to 96):
    // a file cut there still holds every tensor whole.
    let needed = full.len() - 16;
    assert!(parse(full[..needed].to_vec()).is_ok());
    for len in 0..needed {
        let e = err(full[..len].to_vec());
        assert!(
            e.contains("truncated") || e.contains("past the end") || e.contains("impossible"),
            "len {len}: {e}"
        );
    }
}

#[test]
fn typed_getters_name_the_key() {
    let f = parse(valid().finish()).unwrap();
    let e = f.get_u32("general.architecture").unwrap_err().to_string();
    assert!(
        e.contains("general.architecture") && e.contains("string") && e.contains("integer"),
        "{e}"
    );
    let e = f.get_str("missing.key").unwrap_err().to_string();
    assert!(e.contains("missing.key"), "{e}");
    assert_eq!(f.opt("missing.key", GgufFile::get_u32).unwrap(), None);
    assert!(f.tensor("nope").unwrap_err().to_string().contains("nope"));
}

/// The real models' headers cut at many points: each cut is an error, never a panic.
#[test]
fn truncated_real_headers() {
    use std::io::Read;
    for name in common::REAL_MODELS {
        let path = models_dir().join(name);
        let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{e} (run scripts/fetch-models.sh)"));
        let header_end = file.data_offset(0) as usize;
        let mut bytes = Vec::new();
        std::fs::File::open(&path)
            .unwrap()
            .take(header_end as u64 + 4096)
            .read_to_end(&mut bytes)
            .unwrap();
        let mut cuts: Vec<usize> = (0..300).map(|i| i * header_end / 300).collect();
        cuts.extend([
            1,
            3,
            4,
            7,
            8,
            15,
            16,
            23,
            24,
            header_end - 1,
            header_end,
            header_end + 1,
            bytes.len(),
        ]);
        for cut in cuts {
            match GgufFile::from_bytes(bytes[..cut].to_vec()) {
                Ok(_) => panic!("{name} cut at {cut} parsed"),
                Err(e) => {
                    let e = e.to_string();
                    assert!(
                        e.contains("truncated")
                            || e.contains("past the end")
                            || e.contains("impossible")
                            || e.contains("exceeds"),
                        "{name} cut at {cut}: {e}"
                    );
                }
            }
        }
    }
}
