//! `run`: generate from one prompt and stream the text (or print one JSON object).

use super::load::{load, ModelArgs, SamplerArgs};
use super::tokenize::parse_ids;
use super::{text_or_stdin, InputError};
use serde_json::json;
use std::io::Write;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use tinyllm::chat::router::Routed;
use tinyllm::engine::{generate, Finish, Flow, Prompt, Settings, Step};

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
    let mut session = engine.session(a.model.ctx)?;
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
        let tokens: Vec<u32> = steps.iter().filter_map(|s| s.token).collect();
        let top: Vec<Vec<(u32, f32)>> = steps
            .iter()
            .filter_map(|s| s.logprob.as_ref())
            .map(|lp| lp.top.iter().map(|(id, _, l)| (*id, *l)).collect())
            .collect();
        let text: String = steps.iter().map(|s| shown(&s.outputs)).collect();
        let j = json!({
            "tokens": tokens,
            "text": text,
            "top_logprobs": top,
            "stop": stop_name(finish),
            "timings": {
                "prompt_tokens": t.prompt_tokens,
                "generated_tokens": t.completion_tokens,
                "prefill_s": t.prefill_s,
                "decode_s": t.decode_s,
                "prefill_tok_s": tps,
                "decode_tok_s": dps,
                "threads": loaded.threads,
                "backend": tinyllm::backend::Backend::name(engine.model.backend()),
            }
        });
        writeln!(stdout, "{j}")?;
    } else {
        writeln!(stdout)?;
        eprintln!(
            "[{} prompt tokens at {tps:.1} tok/s, {} generated at {dps:.1} tok/s, {} threads, stop: {}]",
            t.prompt_tokens,
            t.completion_tokens,
            loaded.threads,
            stop_name(finish)
        );
    }
    Ok(())
}

/// The text of routed outputs as a terminal shows it: content and reasoning as they come,
/// a tool call as one line of JSON.
pub fn shown(outputs: &[Routed]) -> String {
    let mut s = String::new();
    for r in outputs {
        match r {
            Routed::Content(t) | Routed::Reasoning(t) => s.push_str(t),
            Routed::ToolCall(c) => {
                s.push_str(&json!({"tool_call": {"name": c.name, "arguments": c.arguments}}).to_string());
                s.push('\n');
            }
        }
    }
    s
}

/// The stop reason as printed (`eos` is llama.cpp's name for end of generation).
pub fn stop_name(f: Finish) -> &'static str {
    match f {
        Finish::EndOfGeneration => "eos",
        Finish::StopString => "stop",
        Finish::Length => "length",
        Finish::ContextFull => "context",
        Finish::Cancelled => "cancelled",
    }
}
