//! [`Engine`]: a model with its tokenizer and chat template, the unit every front end loads,
//! and the first stage of the generation pipeline: a [`Prompt`] made into a [`Prepared`]
//! request (template, forced tool call, tokens, routing).

use std::sync::Arc;

use super::embed::Pooling;
#[cfg(not(target_arch = "wasm32"))]
use super::embed::{embed, EmbedLimits, Embedding};
use super::error::EngineError;
use super::generation::Generation;
use super::request::{tool_names, Prepared, Prompt, Request};
use super::session::{Session, SessionConfig};
use super::settings::Settings;
use crate::backend::{Backend, KvType};
use crate::chat::router::{RouterConfig, ToolFormat};
use crate::chat::tools::{forced_call_opening, ToolChoice};
use crate::chat::{ChatTemplate, RenderRequest};
use crate::gguf::GgufFile;
use crate::grammar::{json_arguments, tool_call_grammar, AnswerFormat, GrammarError, Grammars, LazyCalls};
use crate::model::{Model, Placed};
use crate::tokenizer::Tokenizer;

/// A loaded model and what turns text into its tokens and back.
pub struct Engine<B: Backend> {
    pub model: Arc<Model<B>>,
    pub tokenizer: Arc<Tokenizer>,
    pub template: Arc<ChatTemplate>,
    /// How the model writes tool calls (from its template).
    pub tool_format: ToolFormat,
    /// The grammar compiler of the tokenizer's vocabulary (built on the first constrained
    /// request).
    pub grammars: Arc<Grammars>,
    /// How embeddings are pooled unless a caller says otherwise ([`Pooling::of_model`]).
    pub pooling: Pooling,
}

impl<B: Backend> Clone for Engine<B> {
    fn clone(&self) -> Self {
        Engine {
            model: Arc::clone(&self.model),
            tokenizer: Arc::clone(&self.tokenizer),
            template: Arc::clone(&self.template),
            tool_format: self.tool_format,
            grammars: Arc::clone(&self.grammars),
            pooling: self.pooling,
        }
    }
}

impl<B: Backend> Engine<B> {
    /// Load the model of `file` onto `backend`, with its tokenizer and chat template.
    pub fn load(backend: B, file: Arc<GgufFile>) -> Result<Self, crate::Error> {
        // The model first: an unsupported architecture is the most useful thing to report.
        let model = Model::load(backend, Arc::clone(&file))?;
        Self::with_model(model, &file)
    }

    /// [`Engine::load`] for a file that was streamed: its weights are already on `backend`
    /// (`placed`), `file` holds its metadata and tensor table.
    pub fn load_placed(backend: B, file: Arc<GgufFile>, placed: Placed<B>) -> Result<Self, crate::Error> {
        let model = Model::load_placed(backend, Arc::clone(&file), placed)?;
        Self::with_model(model, &file)
    }

    fn with_model(model: Model<B>, file: &GgufFile) -> Result<Self, crate::Error> {
        let tokenizer = Arc::new(Tokenizer::from_gguf(file)?);
        let template = ChatTemplate::from_gguf(file)?;
        Ok(Engine {
            model: Arc::new(model),
            grammars: Arc::new(Grammars::new(Arc::clone(&tokenizer))),
            tokenizer,
            tool_format: ToolFormat::detect(template.source()),
            template: Arc::new(template),
            pooling: Pooling::of_model(file),
        })
    }

    /// The embeddings of `texts` (tokenized with the model's special tokens, as llama.cpp's
    /// `llama-embedding` does), pooled by `pooling` (`None`: [`Engine::pooling`]).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn embed_texts(
        &self,
        texts: &[&str],
        pooling: Option<Pooling>,
        limits: EmbedLimits,
    ) -> Result<Vec<Embedding>, EngineError> {
        let inputs: Vec<Vec<u32>> = texts.iter().map(|t| self.tokenizer.encode(t, true, true)).collect();
        embed(&self.model, &inputs, pooling.unwrap_or(self.pooling), limits)
    }

    /// A fresh session of `n_ctx` positions (0: the model's trained context) with an f16 KV
    /// cache.
    pub fn session(&self, n_ctx: usize) -> Result<Session<B>, EngineError> {
        self.session_with(n_ctx, KvType::F16)
    }

    /// [`Engine::session`] with a KV cache in format `cache_type`.
    pub fn session_with(&self, n_ctx: usize, cache_type: KvType) -> Result<Session<B>, EngineError> {
        Session::new(
            Arc::clone(&self.model),
            SessionConfig {
                n_ctx,
                cache_type,
                ..SessionConfig::default()
            },
        )
    }

    /// The context a session of `n_ctx` positions gets (capped by the trained context).
    pub fn n_ctx(&self, n_ctx: usize) -> usize {
        let trained = self.model.info().context_length;
        if n_ctx == 0 {
            trained
        } else {
            n_ctx.min(trained)
        }
    }

    /// Render, tokenize and route `prompt`, its answer free.
    pub fn prepare(&self, prompt: &Prompt) -> Result<Prepared, EngineError> {
        self.prepare_as(prompt, &AnswerFormat::Free)
    }

    /// Render, tokenize and route `req`'s prompt, and compile the grammar its answer is held
    /// to (its `format`, or a forced tool call's).
    pub fn prepare_request(&self, req: &Request) -> Result<Prepared, EngineError> {
        self.prepare_as(&req.prompt, &req.format)
    }

    fn prepare_as(&self, prompt: &Prompt, format: &AnswerFormat) -> Result<Prepared, EngineError> {
        let prepared = match prompt {
            Prompt::Ids(ids) => {
                let n_vocab = self.model.info().n_vocab;
                if let Some(&token) = ids.iter().find(|&&t| t as usize >= n_vocab) {
                    return Err(EngineError::TokenOutOfRange { token, n_vocab });
                }
                Prepared::ids(ids.clone())
            }
            Prompt::Text {
                text,
                add_special,
                parse_special,
            } => Prepared::ids(self.tokenizer.encode(text, *add_special, *parse_special)),
            Prompt::Chat {
                messages,
                tools,
                tool_choice,
                kwargs,
            } => self.prepare_chat(messages, tools, tool_choice, kwargs, format)?,
        };
        let mut prepared = prepared;
        if prepared.prompt.is_empty() {
            return Err(EngineError::EmptyInput);
        }
        if let Some(lark) = format.lark() {
            prepared.constraint = Some(self.compile(&lark, format.param())?);
        }
        Ok(prepared)
    }

    /// `lark` compiled; a grammar that does not compile is the request's error, named by
    /// `param`.
    fn compile(&self, lark: &str, param: &'static str) -> Result<crate::grammar::Constraint, EngineError> {
        self.grammars.compile(lark, param).map_err(|e| match e {
            GrammarError::Invalid { param, problem } => EngineError::Invalid {
                param: param.into(),
                problem: format!("{param}: {problem}"),
            },
            other => EngineError::Grammar(other),
        })
    }

    fn prepare_chat(
        &self,
        messages: &[serde_json::Value],
        tools: &[serde_json::Value],
        choice: &ToolChoice,
        kwargs: &serde_json::Map<String, serde_json::Value>,
        format: &AnswerFormat,
    ) -> Result<Prepared, EngineError> {
        if messages.is_empty() {
            return Err(EngineError::Invalid {
                param: "messages".into(),
                problem: "messages must not be empty".into(),
            });
        }
        let names = tool_names(tools, choice)?;
        let forcing = matches!(choice, ToolChoice::Required | ToolChoice::Named(_));
        if forcing && *format != AnswerFormat::Free {
            return Err(EngineError::Invalid {
                param: format.param().into(),
                problem: format!(
                    "{} and a forced tool_choice both constrain the answer: send one of them",
                    format.param()
                ),
            });
        }
        let mut rendered = self.template.render(&RenderRequest {
            messages,
            tools: (!names.is_empty()).then_some(tools),
            add_generation_prompt: true,
            kwargs,
        })?;
        let opening = forced_call_opening(self.tool_format, choice);
        // The rest of a forced call: a declared name, arguments valid under its schema.
        let tool_grammar = tool_call_grammar(&self.tokenizer, self.tool_format, choice, tools);
        let constraint = match &tool_grammar {
            Some(g) => Some(self.compile(g, "tool_choice")?),
            None => None,
        };
        // `required` without a grammar for the format: the opening stops right before the
        // name, which must be a declared one.
        let must_start = if *choice == ToolChoice::Required && constraint.is_none() {
            names
                .iter()
                .map(|n| self.tokenizer.encode(n, false, false))
                .filter(|t| !t.is_empty())
                .collect()
        } else {
            Vec::new()
        };
        // `auto` with tools and no other constraint: a call, once begun, is held to its schema
        // (formats whose arguments are JSON; GLM's and Qwen3-Coder's are not).
        let lazy_calls = (*choice == ToolChoice::Auto
            && *format == AnswerFormat::Free
            && !names.is_empty()
            && json_arguments(self.tool_format))
        .then(|| {
            LazyCalls::new(
                Arc::clone(&self.grammars),
                tools,
                self.tool_format == ToolFormat::Hermes,
            )
        })
        .flatten();
        if (opening.is_some() || *format != AnswerFormat::Free) && rendered.trim_end().ends_with("<think>") {
            // A call or a formatted answer is wanted now: close the thinking block the
            // template opened (the grammar holds the answer, not the reasoning).
            rendered.push_str("\n\n</think>\n\n");
        }
        if let Some(open) = &opening {
            rendered.push_str(open);
        }
        Ok(Prepared {
            prompt: self.tokenizer.encode_chat(&rendered),
            router: Some(RouterConfig {
                format: self.tool_format,
                in_think: rendered.trim_end().ends_with("<think>"),
                string_params: RouterConfig::string_params_of(tools),
                bare_function_calls: self.tool_format.may_omit_call_tag(self.template.source()),
                tools: names,
            }),
            opening,
            must_start,
            constraint,
            lazy_calls,
        })
    }

    /// An answer to `prepared`, its clock started.
    pub fn generation(&self, prepared: Prepared, settings: Settings) -> Result<Generation<'_>, EngineError> {
        Generation::new(&self.tokenizer, prepared, settings)
    }
}
