//! Command-line parsing and dispatch: one module per subcommand.

mod bandwidth;
mod bench;
mod chat;
mod gpus;
mod inspect;
mod io;
pub(crate) mod load;
mod pull;
mod run;
mod serve;
mod template;
mod tokenize;

use clap::{Parser, Subcommand};

use crate::error::InputError;

#[derive(Parser)]
#[command(
    name = "tinyllm-native",
    version,
    about = "Run GGUF language models: chat, generate, serve an OpenAI-compatible API, benchmark; inspect models, tokenize, render templates"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Describe a model: architecture, hyper-parameters, tensors, quant mix.
    Inspect(inspect::Args),
    /// Print the token ids of a text as a JSON array.
    Tokenize(tokenize::TokenizeArgs),
    /// Turn comma-separated token ids back into text.
    Detokenize(tokenize::DetokenizeArgs),
    /// Render the model's chat template for a list of messages.
    Template(template::Args),
    /// Generate text from one prompt.
    Run(run::Args),
    /// Talk with a model interactively.
    Chat(chat::Args),
    /// Serve an OpenAI-compatible HTTP API (and a chat page at /).
    Serve(serve::Args),
    /// Measure prefill and decode speed (llama-bench style).
    Bench(bench::Args),
    /// Download a model (alias or URL) into the model cache, resuming and verifying it.
    Pull(pull::Args),
}

pub fn run() -> anyhow::Result<()> {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e)
            if matches!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
            ) =>
        {
            print!("{e}");
            return Ok(());
        }
        Err(e) => return Err(InputError(e.to_string().trim_end().to_string()).into()),
    };
    match cli.command {
        Command::Inspect(a) => inspect::run(a),
        Command::Tokenize(a) => tokenize::run_tokenize(a),
        Command::Detokenize(a) => tokenize::run_detokenize(a),
        Command::Template(a) => template::run(a),
        Command::Pull(a) => pull::run(a),
        Command::Run(a) => run::run(a),
        Command::Chat(a) => chat::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Serve(a) => serve::run(a),
    }
}

/// 2 for usage and input errors (ours or the engine's), 1 for anything else.
pub fn exit_code(err: &anyhow::Error) -> u8 {
    let input = err.chain().any(|e| {
        e.is::<InputError>()
            || e.is::<tinyllm::Error>()
            || e.is::<tinyllm::gguf::GgufError>()
            || e.is::<tinyllm::tokenizer::TokenizerError>()
            || e.is::<tinyllm::chat::TemplateError>()
            || e.is::<tinyllm::quant::QuantError>()
            || e.is::<serde_json::Error>()
            || e.is::<tinyllm::sample::SamplerError>()
            || e.downcast_ref::<tinyllm::engine::EngineError>()
                .is_some_and(tinyllm::engine::EngineError::is_input)
    });
    if input {
        2
    } else {
        1
    }
}
