//! What one run gave, in the shape `tinyllm-native run --json` prints and the browser
//! package's `generate` resolves to: token ids, the text as shown, the top alternatives of
//! every token, the stop reason and timings. One shape, so the golden tests read both alike.

use serde_json::{json, Value};

use super::generation::{Finish, Step, Usage};
use crate::chat::router::Routed;

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

/// The stop reason as reported (`eos` is llama.cpp's name for end of generation).
pub fn finish_name(f: Finish) -> &'static str {
    match f {
        Finish::EndOfGeneration => "eos",
        Finish::StopString => "stop",
        Finish::Length => "length",
        Finish::ContextFull => "context",
        Finish::Cancelled => "cancelled",
    }
}

/// The report of a run's `steps`: `{"tokens", "text", "top_logprobs", "stop", "timings"}`,
/// `top_logprobs[step]` a list of `[id, logprob]` pairs, best first. `timings` holds the
/// usage's counts and rates plus `extra` (the front end's threads and backend).
pub fn run_json(steps: &[Step], finish: Finish, usage: &Usage, extra: Value) -> Value {
    let tokens: Vec<u32> = steps.iter().filter_map(|s| s.token).collect();
    let top: Vec<Vec<(u32, f32)>> = steps
        .iter()
        .filter_map(|s| s.logprob.as_ref())
        .map(|lp| lp.top.iter().map(|(id, _, l)| (*id, *l)).collect())
        .collect();
    let text: String = steps.iter().map(|s| shown(&s.outputs)).collect();
    let mut timings = json!({
        "prompt_tokens": usage.prompt_tokens,
        "generated_tokens": usage.completion_tokens,
        "prefill_s": usage.prefill_s,
        "decode_s": usage.decode_s,
        "prefill_tok_s": usage.prefill_tok_s(),
        "decode_tok_s": usage.decode_tok_s(),
    });
    if let (Some(t), Value::Object(extra)) = (timings.as_object_mut(), extra) {
        t.extend(extra);
    }
    json!({
        "tokens": tokens,
        "text": text,
        "top_logprobs": top,
        "stop": finish_name(finish),
        "timings": timings,
    })
}
