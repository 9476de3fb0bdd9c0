//! `tokenize` and `detokenize`: the model's tokenizer on the command line.

use super::io::{open_model, print_text, text_or_stdin};
use crate::error::InputError;
use tinyllm::tokenizer::Tokenizer;

#[derive(clap::Args)]
pub struct TokenizeArgs {
    /// Model path or alias.
    #[arg(short, long, default_value = "qwen2.5-coder:0.5b")]
    model: String,
    /// Do not add BOS/EOS even when the model asks for them.
    #[arg(long)]
    no_add_special: bool,
    /// Treat special-token text such as `<|im_start|>` as plain text.
    #[arg(long)]
    no_parse_special: bool,
    /// The text; `-` or nothing reads standard input.
    text: Option<String>,
}

#[derive(clap::Args)]
pub struct DetokenizeArgs {
    /// Model path or alias.
    #[arg(short, long, default_value = "qwen2.5-coder:0.5b")]
    model: String,
    /// Print the text as one JSON string (byte-exact).
    #[arg(long)]
    json: bool,
    /// Comma-separated token ids, e.g. `9707,1879`.
    ids: String,
}

pub fn run_tokenize(a: TokenizeArgs) -> anyhow::Result<()> {
    let file = open_model(&a.model)?;
    let tok = Tokenizer::from_gguf(&file)?;
    let text = text_or_stdin(a.text)?;
    let ids = tok.encode(&text, !a.no_add_special, !a.no_parse_special);
    println!("{}", serde_json::to_string(&ids)?);
    Ok(())
}

/// Parse `1,2, 3` into ids, naming the first bad item.
pub fn parse_ids(s: &str) -> Result<Vec<u32>, InputError> {
    let s = s.trim();
    if s.is_empty() {
        return Ok(Vec::new());
    }
    s.split(',')
        .map(|item| {
            let item = item.trim();
            item.parse::<u32>().map_err(|_| {
                InputError(format!(
                    "'{item}' is not a token id (expected comma-separated non-negative integers)"
                ))
            })
        })
        .collect()
}

pub fn run_detokenize(a: DetokenizeArgs) -> anyhow::Result<()> {
    let file = open_model(&a.model)?;
    let tok = Tokenizer::from_gguf(&file)?;
    let ids = parse_ids(&a.ids)?;
    let text = tok.decode(&ids)?;
    print_text(&text, a.json)
}
