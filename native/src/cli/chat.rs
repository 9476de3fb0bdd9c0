//! `chat`: an interactive conversation. Each turn renders the whole history through the chat
//! template; the session's prefix reuse means only the new turn is computed. Ctrl-C stops the
//! current answer, not the program.

use super::engine::{load, ModelArgs, SamplerArgs};
use super::InputError;
use serde_json::json;
use std::io::{BufRead, IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tinyllm::chat::RenderRequest;
use tinyllm::engine::{generate, Flow, GenerateParams, StopReason};
use tinyllm::sample::Sampler;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    sampler: SamplerArgs,
    /// A system message to start the conversation with.
    #[arg(long)]
    system: Option<String>,
    /// Most tokens per answer.
    #[arg(short = 'n', long = "n-predict", default_value_t = 1024)]
    n_predict: usize,
}

const HELP: &str = "Type a message and press Enter. End a line with \\ to continue on the next line, \
or wrap several lines in \"\"\". Commands: /reset (forget the conversation), /exit (or Ctrl-D). \
Ctrl-C stops the current answer.";

/// Reads user turns: line editing on a terminal, plain lines from a pipe.
enum Input {
    Editor(Box<rustyline::DefaultEditor>),
    Lines(std::io::StdinLock<'static>),
}

impl Input {
    fn new() -> Self {
        if std::io::stdin().is_terminal() {
            if let Ok(ed) = rustyline::DefaultEditor::new() {
                return Input::Editor(Box::new(ed));
            }
        }
        Input::Lines(std::io::stdin().lock())
    }

    /// One line, `None` at end of input.
    fn line(&mut self, prompt: &str) -> anyhow::Result<Option<String>> {
        match self {
            Input::Editor(ed) => loop {
                match ed.readline(prompt) {
                    Ok(l) => {
                        let _ = ed.add_history_entry(l.as_str());
                        return Ok(Some(l));
                    }
                    Err(rustyline::error::ReadlineError::Interrupted) => {
                        eprintln!("(Ctrl-C stops an answer; use /exit or Ctrl-D to quit)");
                    }
                    Err(rustyline::error::ReadlineError::Eof) => return Ok(None),
                    Err(e) => return Err(e.into()),
                }
            },
            Input::Lines(stdin) => {
                let mut l = String::new();
                if stdin.read_line(&mut l)? == 0 {
                    return Ok(None);
                }
                Ok(Some(l.trim_end_matches(['\n', '\r']).to_string()))
            }
        }
    }

    /// One user message: continuation lines ending in `\`, or a `"""` block.
    fn message(&mut self) -> anyhow::Result<Option<String>> {
        let Some(first) = self.line("> ")? else { return Ok(None) };
        if first.trim() == "\"\"\"" {
            let mut lines = Vec::new();
            while let Some(l) = self.line(". ")? {
                if l.trim() == "\"\"\"" {
                    break;
                }
                lines.push(l);
            }
            return Ok(Some(lines.join("\n")));
        }
        let mut text = first;
        while text.ends_with('\\') {
            text.pop();
            text.push('\n');
            match self.line(". ")? {
                Some(l) => text.push_str(&l),
                None => break,
            }
        }
        Ok(Some(text))
    }
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if a.n_predict == 0 {
        return Err(InputError("-n must be at least 1".into()).into());
    }
    let sampler_cfg = a.sampler.config()?;
    let loaded = load(&a.model)?;
    let mut session = loaded.session(a.model.ctx)?;
    let mut sampler = Sampler::new(sampler_cfg)?;
    let cancel = Arc::new(AtomicBool::new(false));
    let flag = cancel.clone();
    ctrlc::set_handler(move || flag.store(true, Ordering::Relaxed))?;

    let system: Vec<serde_json::Value> = a
        .system
        .iter()
        .map(|s| json!({"role": "system", "content": s}))
        .collect();
    let mut history = system.clone();
    let mut input = Input::new();
    let interactive = matches!(input, Input::Editor(_));
    if interactive {
        eprintln!("{HELP}");
    }
    let tok = &loaded.tokenizer;
    while let Some(msg) = input.message()? {
        match msg.trim() {
            "" => continue,
            "/exit" | "/quit" => break,
            "/help" => {
                eprintln!("{HELP}");
                continue;
            }
            "/reset" => {
                history = system.clone();
                session.reset();
                sampler.reset();
                eprintln!("(conversation reset)");
                continue;
            }
            _ => {}
        }
        history.push(json!({"role": "user", "content": msg}));
        let rendered = loaded.template.render(&RenderRequest {
            messages: &history,
            tools: None,
            add_generation_prompt: true,
            kwargs: &serde_json::Map::new(),
        })?;
        let prompt = loaded.encode_chat(&rendered);
        if prompt.len() >= session.n_ctx() {
            history.pop();
            eprintln!(
                "(the conversation has {} tokens and no longer fits the context of {}: /reset or raise --ctx)",
                prompt.len(),
                session.n_ctx()
            );
            continue;
        }
        cancel.store(false, Ordering::Relaxed);
        let params = GenerateParams {
            max_tokens: a.n_predict,
            top_logprobs: 0,
        };
        let mut decoder = tok.stream_decoder();
        let mut answer = String::new();
        let mut stdout = std::io::stdout().lock();
        let out = generate(
            &mut session,
            &mut sampler,
            &prompt,
            &params,
            |t| tok.is_eog(t),
            &cancel,
            |ev| {
                if !tok.is_eog(ev.token) {
                    let piece = decoder.push(ev.token).unwrap_or_default();
                    answer.push_str(&piece);
                    let _ = stdout.write_all(piece.as_bytes()).and_then(|_| stdout.flush());
                }
                Flow::Continue
            },
        )?;
        let rest = decoder.finish();
        answer.push_str(&rest);
        writeln!(stdout, "{rest}")?;
        if out.stop == StopReason::Cancelled {
            eprintln!("(stopped)");
        }
        if interactive {
            let t = out.timings;
            eprintln!(
                "[{} new prompt tokens at {:.1} tok/s, {} generated at {:.1} tok/s]",
                t.prompt_tokens - t.cached_tokens,
                t.prefill_tok_s(),
                t.generated_tokens,
                t.decode_tok_s()
            );
        }
        history.push(json!({"role": "assistant", "content": answer}));
    }
    Ok(())
}
