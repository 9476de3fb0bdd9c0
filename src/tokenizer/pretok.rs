//! Pre-tokenizers for byte-level BPE: split text into words before merging, per `tokenizer.ggml.pre`.
//!
//! The common patterns (gpt2, llama3, qwen2) are hand-written scanners with the same rules as
//! llama.cpp's `unicode_regex_split_custom_*`: that is both exact and fast. Other patterns run through
//! `fancy-regex` (they need lookahead) on text "collapsed" the way llama.cpp does it: every non-ASCII
//! codepoint becomes one stand-in character for its category, so `\p{L}` means llama.cpp's letters.

use super::unicode::{flags, Flags, LETTER, MARK, NUMBER, PUNCTUATION, SYMBOL};
use super::TokenizerError;

/// One splitting stage; stages run in order, each splitting the words of the previous one.
#[derive(Debug)]
pub(super) enum Stage {
    Gpt2,
    Llama3,
    Qwen2,
    Regex(RegexStage),
}

#[derive(Debug)]
pub(super) struct RegexStage {
    regex: fancy_regex::Regex,
    /// Whether the pattern uses `\p{..}` and so runs on category-collapsed text.
    collapsed: bool,
}

const GPT2: &str = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
const STARCODER: [&str; 2] = ["\\p{N}", GPT2];
const FALCON: [&str; 3] = ["[\\p{P}\\$\\+<=>\\^~\\|`]+", GPT2, "[0-9][0-9][0-9]"];
// Six letters of the second pattern are escapes: U+1F7D, U+1FBE, U+1FD3, U+1FDB, U+2126 and
// U+212A have canonical singleton decompositions, so a Unicode-normalizing (NFC) editor or copy
// turns them into U+03CE, U+03B9, U+0390, U+038A, U+03A9 and `K`, and the class's ranges then
// run backwards (the regex does not compile). The tokenizer fuzz target loads every pre-tokenizer.
const DEEPSEEK_LLM: [&str; 6] = [
    "[\r\n]",
    "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\u{1F7D}ᾀ-ᾴᾶ-ᾼ\u{1FBE}ῂ-ῄῆ-ῌῐ-\u{1FD3}ῖ-\u{1FDB}ῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\u{2126}ℨ\u{212A}-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
    "\\s?[!-/:-~！-／：-～‘-‟　-。]+",
    "\\s+$",
    "[一-龥ࠀ-一가-퟿]+",
    "\\p{N}+",
];
const DEEPSEEK_CODER: [&str; 5] = ["[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[一-龥ࠀ-一가-퟿]+", "\\p{N}"];
const DEEPSEEK_V3: [&str; 3] = [
    "\\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
];
const TEKKEN: &str = "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const CHATGLM4: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/// How llama.cpp treats one `tokenizer.ggml.pre` value.
#[derive(Debug)]
pub(super) struct PreConfig {
    pub stages: Vec<Stage>,
    /// Look up a whole word in the vocabulary before merging (llama3, tekken).
    pub ignore_merges: bool,
    /// The pre-type forces BOS on unless the file says otherwise.
    pub add_bos: bool,
}

/// The pre-tokenizer for `pre` (absent means llama.cpp's "default", the gpt2 pattern).
pub(super) fn config_for(pre: Option<&str>) -> Result<PreConfig, TokenizerError> {
    let regexes = |pats: &[&str]| -> Result<Vec<Stage>, TokenizerError> {
        pats.iter().map(|p| RegexStage::new(p).map(Stage::Regex)).collect()
    };
    let plain = |stages| PreConfig {
        stages,
        ignore_merges: false,
        add_bos: false,
    };
    let pre_name = pre.unwrap_or("default");
    Ok(match pre_name {
        "default" | "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de"
        | "a.x-4.0" | "mellum" | "modern-bert" | "mpt" | "olmo" | "jais" | "trillion" | "granite-docling"
        | "exaone4" | "jina-v1-en" | "jina-v2-code" | "roberta-bpe" => plain(vec![Stage::Gpt2]),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2"
        | "jina-v5-nano" => PreConfig {
            stages: vec![Stage::Llama3],
            ignore_merges: true,
            add_bos: true,
        },
        "dbrx" | "smaug-bpe" => plain(vec![Stage::Llama3]),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "stablelm2" | "megrez" | "hunyuan" | "solar-open" => {
            plain(vec![Stage::Qwen2])
        }
        "deepseek-llm" => plain(regexes(&DEEPSEEK_LLM)?),
        "deepseek-coder" => plain(regexes(&DEEPSEEK_CODER)?),
        "deepseek-v3" | "hunyuan-dense" | "joyai-llm" | "hy_v4" => plain(regexes(&DEEPSEEK_V3)?),
        "tekken" => PreConfig {
            stages: regexes(&[TEKKEN])?,
            ignore_merges: true,
            add_bos: true,
        },
        "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
            plain(regexes(&STARCODER)?)
        }
        "falcon" => plain(regexes(&FALCON)?),
        "chatglm-bpe" => plain(regexes(&[CHATGLM4])?),
        other => return Err(TokenizerError::UnknownPreTokenizer(other.to_string())),
    })
}

/// Splits `text` into words (byte ranges) by running every stage in turn.
pub(super) fn split(stages: &[Stage], text: &str) -> Vec<std::ops::Range<usize>> {
    let chars: Vec<char> = text.chars().collect();
    let mut byte_offs = Vec::with_capacity(chars.len() + 1);
    let mut off = 0;
    for c in &chars {
        byte_offs.push(off);
        off += c.len_utf8();
    }
    byte_offs.push(off);
    let flag_vec: Vec<Flags> = chars.iter().map(|&c| flags(c)).collect();

    // Word lengths in codepoints, as llama.cpp keeps them.
    let mut lens = vec![chars.len()];
    for stage in stages {
        let mut next = Vec::with_capacity(lens.len() * 2);
        let mut start = 0;
        for &len in &lens {
            let (c, f) = (&chars[start..start + len], &flag_vec[start..start + len]);
            match stage {
                Stage::Gpt2 => split_gpt2(c, f, &mut next),
                Stage::Llama3 => split_llama3(c, f, false, &mut next),
                Stage::Qwen2 => split_llama3(c, f, true, &mut next),
                Stage::Regex(r) => r.split(c, f, &mut next),
            }
            start += len;
        }
        lens = next;
    }
    let mut out = Vec::with_capacity(lens.len());
    let mut start = 0;
    for len in lens {
        out.push(byte_offs[start]..byte_offs[start + len]);
        start += len;
    }
    out
}

/// Collects word lengths while a scanner walks a piece, skipping empty words.
struct Words<'a> {
    out: &'a mut Vec<usize>,
    prev_end: usize,
}

impl Words<'_> {
    fn add(&mut self, end: usize) -> usize {
        let len = end - self.prev_end;
        if len > 0 {
            self.out.push(len);
        }
        self.prev_end = end;
        len
    }
}

fn contraction_len(c: &[char], pos: usize, case_insensitive: bool) -> usize {
    if c[pos] != '\'' || pos + 1 >= c.len() {
        return 0;
    }
    let low = |ch: char| if case_insensitive { ch.to_ascii_lowercase() } else { ch };
    let next = low(c[pos + 1]);
    if matches!(next, 's' | 't' | 'm' | 'd') {
        return 2;
    }
    if pos + 2 < c.len() {
        let nn = low(c[pos + 2]);
        if matches!((next, nn), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
            return 3;
        }
    }
    0
}

/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`
fn split_gpt2(c: &[char], f: &[Flags], out: &mut Vec<usize>) {
    let n = c.len();
    let fl = |p: usize| f.get(p).copied().unwrap_or_default();
    let mut w = Words { out, prev_end: 0 };
    let mut pos = 0;
    while pos < n {
        let cpt = c[pos];
        let k = contraction_len(c, pos, false);
        if k > 0 {
            pos += w.add(pos + k);
            continue;
        }
        let mut f2 = if cpt == ' ' { fl(pos + 1) } else { fl(pos) };
        let class = |x: Flags| {
            if x.is_letter() {
                1
            } else if x.is_number() {
                2
            } else if !x.is_whitespace() && x.is_some() {
                3
            } else {
                0
            }
        };
        let cls = class(f2);
        if cls != 0 {
            pos += usize::from(cpt == ' ');
            while class(f2) == cls {
                pos += 1;
                f2 = fl(pos);
            }
            w.add(pos);
            continue;
        }
        let mut nws = 0;
        while fl(pos + nws).is_whitespace() {
            nws += 1;
        }
        if nws > 1 && pos + nws < n {
            pos += nws - 1;
            w.add(pos);
            continue;
        }
        if nws > 0 {
            pos += nws;
            w.add(pos);
            continue;
        }
        pos += 1;
        w.add(pos);
    }
}

/// llama3: `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`;
/// qwen2 is the same with `\p{N}` (single digits) instead of `\p{N}{1,3}`.
fn split_llama3(c: &[char], f: &[Flags], single_digits: bool, out: &mut Vec<usize>) {
    let n = c.len();
    let fl = |p: usize| f.get(p).copied().unwrap_or_default();
    let is_crlf = |p: usize| matches!(c.get(p), Some('\r' | '\n'));
    let mut w = Words { out, prev_end: 0 };
    let mut pos = 0;
    while pos < n {
        let cpt = c[pos];
        let flags = fl(pos);
        let k = contraction_len(c, pos, true);
        if k > 0 {
            pos += w.add(pos + k);
            continue;
        }
        // [^\r\n\p{L}\p{N}]?\p{L}+
        if !(cpt == '\r' || cpt == '\n' || flags.is_number()) && (flags.is_letter() || fl(pos + 1).is_letter()) {
            pos += 1;
            while fl(pos).is_letter() {
                pos += 1;
            }
            w.add(pos);
            continue;
        }
        // \p{N}{1,3} or \p{N}
        if flags.is_number() {
            if single_digits {
                pos += 1;
                w.add(pos);
            } else {
                let mut ini = pos;
                while fl(pos).is_number() {
                    pos += 1;
                    if pos - ini >= 3 {
                        w.add(pos);
                        ini = pos;
                    }
                }
                w.add(pos);
            }
            continue;
        }
        // <space>?[^\s\p{L}\p{N}]+[\r\n]*
        let other = |x: Flags| !(x.is_whitespace() || x.is_letter() || x.is_number()) && x.is_some();
        let f2 = if cpt == ' ' { fl(pos + 1) } else { flags };
        if other(f2) && flags.is_some() {
            pos += usize::from(cpt == ' ');
            while other(fl(pos)) {
                pos += 1;
            }
            while is_crlf(pos) {
                pos += 1;
            }
            w.add(pos);
            continue;
        }
        let mut nws = 0;
        let mut last_crlf_end = 0;
        while fl(pos + nws).is_whitespace() {
            if is_crlf(pos + nws) {
                last_crlf_end = pos + nws + 1;
            }
            nws += 1;
        }
        // \s*[\r\n]+
        if last_crlf_end > 0 {
            pos = last_crlf_end;
            w.add(pos);
            continue;
        }
        // \s+(?!\S)
        if nws > 1 && pos + nws < n {
            pos += nws - 1;
            w.add(pos);
            continue;
        }
        // \s+
        if nws > 0 {
            pos += nws;
            w.add(pos);
            continue;
        }
        pos += 1;
        w.add(pos);
    }
}

// Stand-ins for non-ASCII codepoints in collapsed text (llama.cpp uses the bytes 0xD0..0xD5).
const C_OTHER: char = '\u{D0}';
const C_NUMBER: char = '\u{D1}';
const C_LETTER: char = '\u{D2}';
const C_PUNCT: char = '\u{D3}';
const C_MARK: char = '\u{D4}';
const C_SYMBOL: char = '\u{D5}';

impl RegexStage {
    fn new(pattern: &str) -> Result<Self, TokenizerError> {
        let collapsed = pattern.contains("\\p{");
        let source = if collapsed {
            collapse_pattern(pattern)
        } else {
            pattern.to_string()
        };
        let regex = fancy_regex::Regex::new(&source).map_err(|e| TokenizerError::Regex {
            pattern: pattern.to_string(),
            message: e.to_string(),
        })?;
        Ok(Self { regex, collapsed })
    }

    /// Matches and the gaps between them all become words, as in llama.cpp's `unicode_regex_split_stl`.
    fn split(&self, c: &[char], f: &[Flags], out: &mut Vec<usize>) {
        let mut s = String::with_capacity(c.len());
        let mut char_at = Vec::with_capacity(c.len() + 1);
        for (&ch, &fl) in c.iter().zip(f) {
            char_at.push(s.len());
            s.push(self.stand_in(ch, fl));
        }
        let total = s.len();
        char_at.push(total);
        let to_cpt = |byte: usize| char_at.partition_point(|&b| b < byte);
        let mut prev = 0;
        let mut at = 0;
        // A backtracking error (pathological input) ends matching; the rest stays one word.
        while at <= total {
            let Ok(Some(m)) = self.regex.find_from_pos(&s, at) else {
                break;
            };
            let (ms, me) = (to_cpt(m.start()), to_cpt(m.end()));
            if ms > prev {
                out.push(ms - prev);
            }
            if me > ms {
                out.push(me - ms);
            }
            prev = me;
            // An empty match must not stall the scan.
            at = if m.end() > m.start() {
                m.end()
            } else {
                m.end() + s[m.end()..].chars().next().map_or(1, char::len_utf8)
            };
        }
        if c.len() > prev {
            out.push(c.len() - prev);
        }
    }

    fn stand_in(&self, ch: char, fl: Flags) -> char {
        if ch.is_ascii() {
            return ch;
        }
        if fl.is_whitespace() {
            return '\u{0B}';
        }
        if !self.collapsed {
            return ch;
        }
        match fl.cat {
            NUMBER => C_NUMBER,
            LETTER => C_LETTER,
            PUNCTUATION => C_PUNCT,
            MARK => C_MARK,
            SYMBOL => C_SYMBOL,
            _ => C_OTHER,
        }
    }
}

/// Rewrites `\p{X}` into a class over the stand-in plus the ASCII members, as llama.cpp does.
fn collapse_pattern(pattern: &str) -> String {
    let class_for = |name: &str| -> Option<String> {
        Some(match name {
            "N" => format!("{C_NUMBER}0-9"),
            "L" | "Lu" | "Ll" | "Lt" | "Lm" | "Lo" => format!("{C_LETTER}A-Za-z"),
            "P" => format!("{C_PUNCT}!-#%-*,-/:-;?-@\\[-\\]_\\{{\\}}"),
            "M" => format!("{C_MARK}"),
            "S" => format!("{C_SYMBOL}\\$\\+<->\\^`\\|~"),
            _ => return None,
        })
    };
    let b = pattern.as_bytes();
    let mut out = String::with_capacity(pattern.len() * 2);
    let mut inside = false;
    let mut i = 0;
    while i < pattern.len() {
        let escaped = i > 0 && b[i - 1] == b'\\';
        if b[i] == b'[' && !escaped {
            inside = true;
        } else if b[i] == b']' && inside && !escaped {
            inside = false;
        } else if pattern[i..].starts_with("\\p{") {
            if let Some(close) = pattern[i..].find('}') {
                if let Some(class) = class_for(&pattern[i + 3..i + close]) {
                    if inside {
                        out.push_str(&class);
                    } else {
                        out.push('[');
                        out.push_str(&class);
                        out.push(']');
                    }
                    i += close + 1;
                    continue;
                }
            }
        }
        // Patterns are ASCII when they use \p (llama.cpp requires it), so byte steps are char steps;
        // copy whole chars anyway to stay correct for any input.
        let ch_len = pattern[i..].chars().next().map_or(1, char::len_utf8);
        out.push_str(&pattern[i..i + ch_len]);
        i += ch_len;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(stages: &[Stage], text: &str) -> Vec<String> {
        split(stages, text).into_iter().map(|r| text[r].to_string()).collect()
    }

    #[test]
    fn qwen2_splits_like_its_regex() {
        let w = words(&[Stage::Qwen2], "Hello world's  123\n\n  x");
        // `\s+(?!\S)` leaves the last space to join the following letter.
        assert_eq!(w, ["Hello", " world", "'s", " ", " ", "1", "2", "3", "\n\n", " ", " x"]);
    }

    #[test]
    fn regex_stage_agrees_with_scanner_on_llama3_pattern() {
        let pattern = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
        let regex = [Stage::Regex(RegexStage::new(pattern).unwrap())];
        for text in [
            "Hello   world!!\n\n 12345 ünïcödé 日本語 'LL x",
            "  a\t\tb\r\n\r\n  \u{3000}c",
            "😀😀 ok?",
        ] {
            assert_eq!(words(&regex, text), words(&[Stage::Llama3], text), "{text:?}");
        }
    }
}
