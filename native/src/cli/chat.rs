//! `chat`: an interactive conversation. Each turn renders the whole history through the chat
//! template; the session's prefix reuse means only the new turn is computed. Ctrl-C stops the
//! current answer, not the program.
//!
//! The weights load in the background while the first message is typed, so type-ahead goes to
//! the line editor as typed (a terminal left in its line mode while loading would hand the
//! editor a half-read line).

use super::load::{load_opened, open, Loaded, ModelArgs, SamplerArgs};
use crate::error::InputError;
use serde_json::json;
use std::io::{BufRead, IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tinyllm::chat::router::Routed;
use tinyllm::engine::report::shown;
use tinyllm::engine::{generate, Finish, Flow, Prompt, Settings};

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
    let sampler = a.sampler.config()?;
    a.model.cache_type()?;
    // A wrong model name or file is reported before anything is typed.
    let opened = open(&a.model)?;
    let model_args = a.model.clone();
    let loading = std::thread::Builder::new()
        .name("load".into())
        .spawn(move || load_opened(&model_args, opened))?;
    let mut loading = Some(loading);
    let mut loaded: Option<(Loaded, tinyllm::engine::Session<tinyllm::backend::AnyBackend>)> = None;

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
    let mut turn = 0u64;
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
                if let Some((_, session)) = &mut loaded {
                    session.reset();
                }
                turn = 0;
                eprintln!("(conversation reset)");
                continue;
            }
            _ => {}
        }
        if loaded.is_none() {
            if let Some(handle) = loading.take() {
                if !handle.is_finished() && interactive {
                    eprintln!("(loading the model...)");
                }
                let l = handle
                    .join()
                    .map_err(|_| anyhow::anyhow!("loading the model failed unexpectedly"))??;
                let session = a.model.session(&l.engine)?;
                loaded = Some((l, session));
            }
        }
        let Some((l, session)) = &mut loaded else { break };
        let engine = &l.engine;
        history.push(json!({"role": "user", "content": msg}));
        let prepared = engine.prepare(&Prompt::Chat {
            messages: history.clone(),
            tools: Vec::new(),
            tool_choice: Default::default(),
            kwargs: Default::default(),
        })?;
        if prepared.prompt.len() >= session.n_ctx() {
            history.pop();
            eprintln!(
                "(the conversation has {} tokens and no longer fits the context of {}: /reset or raise --ctx)",
                prepared.prompt.len(),
                session.n_ctx()
            );
            continue;
        }
        cancel.store(false, Ordering::Relaxed);
        // Each turn draws from its own stream of the seed.
        let mut turn_sampler = sampler.clone();
        turn_sampler.seed = sampler.seed.wrapping_add(turn);
        turn += 1;
        let settings = Settings {
            sampler: turn_sampler,
            max_tokens: Some(a.n_predict),
            ..Settings::default()
        };
        let mut gen = engine.generation(prepared, settings)?;
        let mut answer = String::new();
        let mut stdout = std::io::stdout().lock();
        let finish = generate(session, &mut gen, &cancel, |step| {
            for r in &step.outputs {
                if let Routed::Content(t) = r {
                    answer.push_str(t);
                }
            }
            let _ = stdout
                .write_all(shown(&step.outputs).as_bytes())
                .and_then(|_| stdout.flush());
            Flow::Continue
        })?;
        writeln!(stdout)?;
        if finish == Finish::Cancelled {
            eprintln!("(stopped)");
        }
        if interactive {
            let t = gen.usage();
            eprintln!(
                "[{} new prompt tokens at {:.1} tok/s, {} generated at {:.1} tok/s]",
                t.prompt_tokens - t.cached_tokens,
                t.prefill_tok_s(),
                t.completion_tokens,
                t.decode_tok_s()
            );
        }
        history.push(json!({"role": "assistant", "content": answer}));
    }
    // Input ended before the model was needed: still report a model that does not load.
    if let Some(handle) = loading {
        handle
            .join()
            .map_err(|_| anyhow::anyhow!("loading the model failed unexpectedly"))??;
    }
    Ok(())
}
