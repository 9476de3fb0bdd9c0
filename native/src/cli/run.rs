//! `run`: generate from one prompt and stream the text (or print one JSON object).

use super::engine::{load, ModelArgs, SamplerArgs};
use super::tokenize::parse_ids;
use super::{text_or_stdin, InputError};
use serde_json::json;
use std::io::Write;
use std::sync::atomic::AtomicBool;
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
    let sampler_cfg = a.sampler.config()?;
    let loaded = load(&a.model)?;
    let prompt: Vec<u32> = match &a.prompt_ids {
        Some(ids) => {
            let ids = parse_ids(ids)?;
            let n_vocab = loaded.model.config().n_vocab;
            if let Some(bad) = ids.iter().find(|&&id| id as usize >= n_vocab) {
                return Err(InputError(format!(
                    "--prompt-ids: token id {bad} is outside the vocabulary ({n_vocab} tokens)"
                ))
                .into());
            }
            ids
        }
        None => {
            let text = text_or_stdin(a.prompt.clone())?;
            if a.raw {
                loaded.tokenizer.encode(&text, true, true)
            } else {
                let messages = [json!({"role": "user", "content": text})];
                let rendered = loaded.template.render(&RenderRequest {
                    messages: &messages,
                    tools: None,
                    add_generation_prompt: true,
                    kwargs: &serde_json::Map::new(),
                })?;
                loaded.encode_chat(&rendered)
            }
        }
    };
    if prompt.is_empty() {
        return Err(InputError("the prompt is empty".into()).into());
    }
    let mut session = loaded.session(a.model.ctx)?;
    if prompt.len() > session.n_ctx() {
        return Err(InputError(format!(
            "the prompt has {} tokens but the context holds {} (raise --ctx, up to the model's {})",
            prompt.len(),
            session.n_ctx(),
            loaded.model.config().context_length
        ))
        .into());
    }

    // Ctrl-C stops generation between tokens; what was generated so far is still printed.
    let cancel = Arc::new(AtomicBool::new(false));
    let flag = cancel.clone();
    let _ = ctrlc::set_handler(move || flag.store(true, std::sync::atomic::Ordering::Relaxed));

    let mut sampler = Sampler::new(sampler_cfg)?;
    let params = GenerateParams {
        max_tokens: a.n_predict as usize,
        top_logprobs: a.top_logprobs,
    };
    let mut decoder = loaded.tokenizer.stream_decoder();
    let mut stdout = std::io::stdout().lock();
    let mut write_err = None;
    let tok = &loaded.tokenizer;
    let out = generate(
        &mut session,
        &mut sampler,
        &prompt,
        &params,
        |t| tok.is_eog(t),
        &cancel,
        |ev| {
            if a.json || tok.is_eog(ev.token) {
                return Flow::Continue;
            }
            let piece = decoder.push(ev.token).unwrap_or_default();
            match stdout.write_all(piece.as_bytes()).and_then(|_| stdout.flush()) {
                Ok(()) => Flow::Continue,
                Err(e) => {
                    write_err = Some(e);
                    Flow::Stop
                }
            }
        },
    )?;
    if let Some(e) = write_err {
        return Err(e.into());
    }
    let t = out.timings;
    if a.json {
        let text_ids: Vec<u32> = out.tokens.iter().copied().filter(|&id| !tok.is_eog(id)).collect();
        let top: Vec<Vec<(u32, f32)>> = out.top_logprobs.clone();
        let j = json!({
            "tokens": out.tokens,
            "text": tok.decode(&text_ids)?,
            "top_logprobs": top,
            "stop": stop_name(out.stop),
            "timings": {
                "prompt_tokens": t.prompt_tokens,
                "generated_tokens": t.generated_tokens,
                "prefill_s": t.prefill_s,
                "decode_s": t.decode_s,
                "prefill_tok_s": t.prefill_tok_s(),
                "decode_tok_s": t.decode_tok_s(),
                "threads": loaded.threads,
                "backend": tinyllm::backend::Backend::name(loaded.model.backend()),
            }
        });
        writeln!(stdout, "{j}")?;
    } else {
        stdout.write_all(decoder.finish().as_bytes())?;
        writeln!(stdout)?;
        eprintln!(
            "[{} prompt tokens at {:.1} tok/s, {} generated at {:.1} tok/s, {} threads, stop: {}]",
            t.prompt_tokens,
            t.prefill_tok_s(),
            t.generated_tokens,
            t.decode_tok_s(),
            loaded.threads,
            stop_name(out.stop)
        );
    }
    Ok(())
}

/// The stop reason as printed (`eog` is llama.cpp's "eos").
pub fn stop_name(s: StopReason) -> &'static str {
    match s {
        StopReason::EndOfGeneration => "eos",
        StopReason::Length => "length",
        StopReason::ContextFull => "context",
        StopReason::Cancelled => "cancelled",
    }
}
