//! Built-in chat templates for GGUF files that carry none (e.g. gemma-3-270m).
//!
//! They reproduce llama.cpp's hard-coded formats (`llm_chat_apply_template` in
//! `src/llama-chat.cpp`), written as Jinja so they run through the same renderer, limits and
//! message normalization as templates from files. Like llama.cpp's, they do not write a BOS
//! token: the tokenizer adds it when the model asks for one (`add_special`).

/// A chat-format family with a built-in template.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// `<start_of_turn>user\n...<end_of_turn>\n`; system text is folded into the first user turn.
    Gemma,
    /// `<|im_start|>role\n...<|im_end|>\n` (Qwen, many fine-tunes).
    ChatMl,
    /// `<|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>`.
    Llama3,
    /// `[INST] ...[/INST] answer</s>` (Mistral v3 layout: system text before the user text).
    Mistral,
}

impl Family {
    /// The family's template source.
    pub fn source(self) -> &'static str {
        match self {
            Family::Gemma => GEMMA,
            Family::ChatMl => CHATML,
            Family::Llama3 => LLAMA3,
            Family::Mistral => MISTRAL,
        }
    }

    /// Guesses the family from `general.architecture` and the vocabulary's special tokens;
    /// ChatML when nothing matches, since that is what most untemplated fine-tunes use.
    pub fn detect(architecture: &str, has_token: impl Fn(&str) -> bool) -> Family {
        if architecture.starts_with("gemma") || has_token("<start_of_turn>") {
            Family::Gemma
        } else if has_token("<|im_start|>") {
            Family::ChatMl
        } else if has_token("<|start_header_id|>") {
            Family::Llama3
        } else if architecture == "mistral" || has_token("[INST]") {
            Family::Mistral
        } else {
            Family::ChatMl
        }
    }
}

// Message content is normalized to a string (or none) before rendering, hence `or ''`.

const GEMMA: &str = r#"{%- set ns = namespace(system='') -%}
{%- for message in messages -%}
{%- if message.role == 'system' -%}
{%- set ns.system = ns.system + ((message.content or '') | trim) -%}
{%- else -%}
{%- set role = 'model' if message.role == 'assistant' else message.role -%}
{{- '<start_of_turn>' + role + '\n' -}}
{%- if ns.system and role != 'model' -%}
{{- ns.system + '\n\n' -}}
{%- set ns.system = '' -%}
{%- endif -%}
{{- ((message.content or '') | trim) + '<end_of_turn>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<start_of_turn>model\n' -}}
{%- endif -%}"#;

const CHATML: &str = r#"{%- for message in messages -%}
{{- '<|im_start|>' + message.role + '\n' + (message.content or '') + '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\n' -}}
{%- endif -%}"#;

const LLAMA3: &str = r#"{%- for message in messages -%}
{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' + ((message.content or '') | trim) + '<|eot_id|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
{%- endif -%}"#;

const MISTRAL: &str = r#"{%- set ns = namespace(inside=false) -%}
{%- for message in messages -%}
{%- if not ns.inside -%}
{{- '[INST] ' -}}
{%- set ns.inside = true -%}
{%- endif -%}
{%- if message.role == 'system' -%}
{{- (message.content or '') + '\n\n' -}}
{%- elif message.role == 'user' -%}
{{- (message.content or '') + '[/INST]' -}}
{%- else -%}
{{- ' ' + ((message.content or '') | trim) + eos_token -}}
{%- set ns.inside = false -%}
{%- endif -%}
{%- endfor -%}"#;
