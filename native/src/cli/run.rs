//! `run`: generate from one prompt and stream the text (or print one JSON object).

use super::io::text_or_stdin;
use super::load::{load, ModelArgs, SamplerArgs};
use super::tokenize::parse_ids;
use crate::error::InputError;
use serde_json::json;
use std::io::Write;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use tinyllm::engine::report::{finish_name, run_json, shown};
use tinyllm::engine::{generate, Flow, Prompt, Settings, Step};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    sampler: SamplerArgs,
    /// The prompt: sent as a user message through the chat template unless --raw; `-` reads
    /// standard input.
    prompt: Option<String>,
    /// Feed the prompt text as is (BOS added if the model wants one), without the chat template.
    #[arg(long)]
    raw: bool,
    /// Feed these comma-separated token ids as is.
    #[arg(long, conflicts_with_all = ["prompt", "raw"])]
    prompt_ids: Option<String>,
    /// Most tokens to generate.
    #[arg(
        short = 'n',
        long = "n-predict",
        default_value_t = 256,
        allow_negative_numbers = true
    )]
    n_predict: i64,
    /// Report the K most likely alternatives of each generated token (with --json).
    #[arg(long, default_value_t = 0)]
    top_logprobs: usize,
    /// Print one JSON object (tokens, text, top_logprobs, timings) instead of streaming text.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if a.n_predict < 1 {
        return Err(InputError(format!("-n must be at least 1, got {}", a.n_predict)).into());
    }
    let sampler = a.sampler.config()?;
    a.model.cache_type()?;
    let loaded = load(&a.model)?;
    let engine = &loaded.engine;
    let prompt = match &a.prompt_ids {
        Some(ids) => Prompt::Ids(parse_ids(ids)?),
        None => {
            let text = text_or_stdin(a.prompt.clone())?;
            if a.raw {
                Prompt::Text {
                    text,
                    add_special: true,
                    parse_special: true,
                }
            } else {
                Prompt::user(&text)
            }
        }
    };
    let prepared = engine.prepare(&prompt).map_err(|e| match e {
        tinyllm::engine::EngineError::TokenOutOfRange { .. } => InputError(format!("--prompt-ids: {e}")).into(),
        e => anyhow::Error::from(e),
    })?;
    let mut session = a.model.session(engine)?;
    if prepared.prompt.len() >= session.n_ctx() {
        return Err(InputError(format!(
            "the prompt has {} tokens but the context holds {} with room for at least one generated token \
             (raise --ctx, up to the model's {})",
            prepared.prompt.len(),
            session.n_ctx(),
            engine.model.info().context_length
        ))
        .into());
    }
    let settings = Settings {
        sampler,
        max_tokens: Some(a.n_predict as usize),
        logprobs: (a.top_logprobs > 0).then_some(a.top_logprobs),
        ..Settings::default()
    };
    let mut gen = engine.generation(prepared, settings)?;

    // Ctrl-C stops generation between tokens; what was generated so far is still printed.
    let cancel = Arc::new(AtomicBool::new(false));
    let flag = cancel.clone();
    let _ = ctrlc::set_handler(move || flag.store(true, std::sync::atomic::Ordering::Relaxed));

    let mut stdout = std::io::stdout().lock();
    let mut write_err = None;
    let mut steps: Vec<Step> = Vec::new();
    let finish = generate(&mut session, &mut gen, &cancel, |step| {
        if !a.json {
            let text = shown(&step.outputs);
            if let Err(e) = stdout.write_all(text.as_bytes()).and_then(|_| stdout.flush()) {
                write_err = Some(e);
                return Flow::Stop;
            }
        }
        steps.push(step.clone());
        Flow::Continue
    })?;
    if let Some(e) = write_err {
        return Err(e.into());
    }
    let t = gen.usage();
    let (tps, dps) = (t.prefill_tok_s(), t.decode_tok_s());
    if a.json {
        let extra = json!({
            "threads": loaded.threads,
            "backend": tinyllm::backend::Backend::name(engine.model.backend()),
        });
        let j = run_json(&steps, finish, &t, extra);
        writeln!(stdout, "{j}")?;
    } else {
        writeln!(stdout)?;
        eprintln!(
            "[{} prompt tokens at {tps:.1} tok/s, {} generated at {dps:.1} tok/s, {} threads, stop: {}]",
            t.prompt_tokens,
            t.completion_tokens,
            loaded.threads,
            finish_name(finish)
        );
    }
    Ok(())
}
