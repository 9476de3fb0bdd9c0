//! JSON text exactly as Python's `json.dumps(..., ensure_ascii=False)` writes it.
//!
//! Chat templates written for Hugging Face call `tojson` on tool schemas and tool-call arguments;
//! the model was trained on Python's spelling (`", "` and `": "` separators, raw UTF-8, floats
//! like `1e-07`), so matching it byte for byte keeps prompts identical to the reference.

use serde::Serialize;
use serde_json::ser::{Formatter, PrettyFormatter};
use std::io;

/// `json.dumps(value, ensure_ascii=False)`, or with `indent` when given (a string of spaces
/// or Python's `indent=<str>`).
pub fn dumps<T: Serialize + ?Sized>(value: &T, indent: Option<&str>) -> Result<String, serde_json::Error> {
    let mut out = Vec::new();
    match indent {
        None => value.serialize(&mut serde_json::Serializer::with_formatter(&mut out, PyCompact))?,
        Some(ind) => {
            let fmt = PyPretty(PrettyFormatter::with_indent(ind.as_bytes()));
            value.serialize(&mut serde_json::Serializer::with_formatter(&mut out, fmt))?
        }
    }
    // serde_json writes only UTF-8 (strings come from `&str`, the rest is ASCII).
    String::from_utf8(out).map_err(|e| serde::ser::Error::custom(e.to_string()))
}

/// Python's float `repr`: shortest round-trip digits, scientific notation when the decimal
/// exponent is below -4 or at least 16, exponent with a sign and at least two digits.
fn py_float(value: f64) -> String {
    if value.is_nan() {
        return "NaN".into();
    }
    if value.is_infinite() {
        return if value > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    // `{:e}` gives the shortest round-trip digits, e.g. "-1.5e-7" or "1e16".
    let sci = format!("{value:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = mantissa.strip_prefix('-').map_or(("", mantissa), |m| ("-", m));
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        if point <= 0 {
            format!("{sign}0.{}{digits}", "0".repeat((-point) as usize))
        } else if point as usize >= digits.len() {
            format!("{sign}{digits}{}.0", "0".repeat(point as usize - digits.len()))
        } else {
            let (int, frac) = digits.split_at(point as usize);
            format!("{sign}{int}.{frac}")
        }
    } else {
        let exp_sign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{mantissa}e{exp_sign}{:02}", exp.abs())
    }
}

/// Compact output with Python's default separators `", "` and `": "`.
struct PyCompact;

impl Formatter for PyCompact {
    fn begin_array_value<W: ?Sized + io::Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + io::Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(b": ")
    }

    fn write_f64<W: ?Sized + io::Write>(&mut self, w: &mut W, value: f64) -> io::Result<()> {
        w.write_all(py_float(value).as_bytes())
    }

    fn write_f32<W: ?Sized + io::Write>(&mut self, w: &mut W, value: f32) -> io::Result<()> {
        w.write_all(py_float(value.into()).as_bytes())
    }
}

/// Indented output: serde_json's pretty layout already matches Python's (`,` + newline,
/// `": "`, empty containers as `[]`/`{}`); only floats differ.
struct PyPretty<'a>(PrettyFormatter<'a>);

impl Formatter for PyPretty<'_> {
    fn begin_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.begin_array(w)
    }
    fn end_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_array(w)
    }
    fn begin_array_value<W: ?Sized + io::Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        self.0.begin_array_value(w, first)
    }
    fn end_array_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_array_value(w)
    }
    fn begin_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.begin_object(w)
    }
    fn end_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_object(w)
    }
    fn begin_object_key<W: ?Sized + io::Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        self.0.begin_object_key(w, first)
    }
    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.begin_object_value(w)
    }
    fn end_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_object_value(w)
    }
    fn write_f64<W: ?Sized + io::Write>(&mut self, w: &mut W, value: f64) -> io::Result<()> {
        w.write_all(py_float(value).as_bytes())
    }
    fn write_f32<W: ?Sized + io::Write>(&mut self, w: &mut W, value: f32) -> io::Result<()> {
        w.write_all(py_float(value.into()).as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn separators_and_unicode_match_python() {
        // Expected strings are what CPython 3 prints for json.dumps(v, ensure_ascii=False).
        let v = json!({"b": [1, 2, {"x": null}], "a": "héllo \"q\" \n 日本", "t": true});
        assert_eq!(
            dumps(&v, None).unwrap(),
            r#"{"b": [1, 2, {"x": null}], "a": "héllo \"q\" \n 日本", "t": true}"#
        );
        assert_eq!(
            dumps(&json!({"a": [], "b": {}}), Some("  ")).unwrap(),
            "{\n  \"a\": [],\n  \"b\": {}\n}"
        );
        assert_eq!(
            dumps(&json!([1, [2]]), Some("  ")).unwrap(),
            "[\n  1,\n  [\n    2\n  ]\n]"
        );
        assert_eq!(dumps(&json!("\u{1}\u{7f}"), None).unwrap(), "\"\\u0001\u{7f}\"");
    }

    #[test]
    fn floats_match_python_repr() {
        for (f, py) in [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (-2.25, "-2.25"),
            (1e16, "1e+16"),
            (1.5e-7, "1.5e-07"),
            (0.0001, "0.0001"),
            (123456789012345.6, "123456789012345.6"),
            (1e22, "1e+22"),
            (0.1, "0.1"),
            (100.0, "100.0"),
        ] {
            assert_eq!(py_float(f), py, "{f}");
        }
    }
}
