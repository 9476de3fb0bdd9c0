//! Codepoint classes and the GPT-2 byte<->unicode mapping, as llama.cpp's `unicode.cpp` defines them.
//!
//! The pre-tokenizers need llama.cpp's exact notion of letter, number and whitespace (its own tables,
//! see `unicode_tables.rs`), not whatever Unicode version a regex crate ships, or word boundaries drift.

use super::unicode_tables::{CATEGORY_RANGES, WHITESPACE};
use std::sync::OnceLock;

pub(super) const UNDEFINED: u8 = 0x01;
pub(super) const NUMBER: u8 = 0x02;
pub(super) const LETTER: u8 = 0x04;
pub(super) const MARK: u8 = 0x10;
pub(super) const PUNCTUATION: u8 = 0x20;
pub(super) const SYMBOL: u8 = 0x40;

/// Category bits of one codepoint plus llama.cpp's whitespace flag.
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub(super) struct Flags {
    /// Category bits (see `unicode_tables.rs`); 0 only for "outside the text".
    pub cat: u8,
    pub whitespace: bool,
}

impl Flags {
    pub fn is_letter(self) -> bool {
        self.cat & LETTER != 0
    }
    pub fn is_number(self) -> bool {
        self.cat & NUMBER != 0
    }
    pub fn is_whitespace(self) -> bool {
        self.whitespace
    }
    /// llama.cpp's `as_uint() != 0`: true for every codepoint inside the text, even undefined ones.
    pub fn is_some(self) -> bool {
        self.cat != 0 || self.whitespace
    }
}

/// Flags for the Basic Multilingual Plane, built once: the splitters look up every codepoint.
fn bmp_table() -> &'static [Flags] {
    static TABLE: OnceLock<Vec<Flags>> = OnceLock::new();
    TABLE.get_or_init(|| (0..0x10000u32).map(lookup).collect())
}

fn lookup(cpt: u32) -> Flags {
    let idx = CATEGORY_RANGES.partition_point(|&(start, _)| start <= cpt);
    let cat = if idx == 0 {
        UNDEFINED
    } else {
        CATEGORY_RANGES[idx - 1].1
    };
    let cat = if cat == 0 { UNDEFINED } else { cat };
    Flags {
        cat,
        whitespace: WHITESPACE.binary_search(&cpt).is_ok(),
    }
}

pub(super) fn flags(c: char) -> Flags {
    let cpt = c as u32;
    match bmp_table().get(cpt as usize) {
        Some(f) => *f,
        None => lookup(cpt),
    }
}

/// GPT-2's printable stand-in for each byte (`bytes_to_unicode`).
pub(super) fn byte_to_char_table() -> &'static [char; 256] {
    static TABLE: OnceLock<[char; 256]> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = ['\0'; 256];
        let mut extra = 0u32;
        for (b, slot) in table.iter_mut().enumerate() {
            let printable = (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
            let cpt = if printable {
                b as u32
            } else {
                extra += 1;
                255 + extra
            };
            // All values are below 0x200, so they are valid chars.
            *slot = char::from_u32(cpt).unwrap_or('\u{FFFD}');
        }
        table
    })
}

/// Inverse of [`byte_to_char_table`]; `None` for chars that stand for no byte.
pub(super) fn char_to_byte(c: char) -> Option<u8> {
    static TABLE: OnceLock<[u16; 0x144]> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut inv = [u16::MAX; 0x144];
        for (b, c) in byte_to_char_table().iter().enumerate() {
            if let Some(slot) = inv.get_mut(*c as usize) {
                *slot = b as u16;
            }
        }
        inv
    });
    table.get(c as usize).and_then(|&b| u8::try_from(b).ok())
}
