//! What the subcommands share at the command line's edge: opening a model named there, text
//! from an argument or standard input, JSON files, and byte-exact text output.

use std::io::Read;

use crate::error::InputError;

/// Open a model given as a path or alias (fetching a missing alias into the cache); a bad
/// path or file is an input error.
pub fn open_model(model: &str) -> anyhow::Result<tinyllm::gguf::GgufFile> {
    let path = crate::models::ensure_model(model)?;
    Ok(tinyllm::gguf::GgufFile::open(&path).map_err(|e| InputError(format!("{}: {e}", path.display())))?)
}

/// The text argument, or standard input when it is `-` or absent.
pub fn text_or_stdin(text: Option<String>) -> anyhow::Result<String> {
    match text {
        Some(t) if t != "-" => Ok(t),
        _ => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .map_err(|e| InputError(format!("reading standard input: {e}")))?;
            Ok(s)
        }
    }
}

/// Read and parse a JSON file named on the command line.
pub fn read_json_file(path: &std::path::Path, what: &str) -> anyhow::Result<serde_json::Value> {
    let text = std::fs::read_to_string(path).map_err(|e| InputError(format!("{what} file {}: {e}", path.display())))?;
    serde_json::from_str(&text)
        .map_err(|e| InputError(format!("{what} file {}: invalid JSON: {e}", path.display())).into())
}

/// Print text as is (no newline added) or, with `json`, as one JSON string: byte-exact either way.
pub fn print_text(text: &str, json: bool) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{}", serde_json::to_string(text)?)?;
    } else {
        out.write_all(text.as_bytes())?;
    }
    Ok(())
}
