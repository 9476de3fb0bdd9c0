//! What `run`, `chat` (and later `serve`, `bench`) share: the model/backend/threads/context
//! flags, the sampler flags, and loading a model with its tokenizer and chat template.

use super::InputError;
use std::sync::Arc;
use tinyllm::backend::cpu::CpuBackend;
use tinyllm::chat::ChatTemplate;
use tinyllm::engine::{Session, SessionConfig};
use tinyllm::gguf::GgufFile;
use tinyllm::model::Model;
use tinyllm::sample::SamplerConfig;
use tinyllm::tokenizer::Tokenizer;

/// Where the model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    Cpu,
    Webgpu,
    Vulkan,
}

#[derive(clap::Args, Debug)]
pub struct ModelArgs {
    /// Model path or alias (fetched into the cache on first use).
    #[arg(short, long, default_value = "qwen2.5-coder:0.5b")]
    pub model: String,
    /// Compute backend.
    #[arg(long, value_enum, default_value_t = BackendKind::Cpu)]
    pub backend: BackendKind,
    /// Worker threads (default: the physical cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Context size in tokens (capped by the model's trained context; 0 = the model's).
    #[arg(long, default_value_t = 4096)]
    pub ctx: usize,
}

#[derive(clap::Args, Debug)]
pub struct SamplerArgs {
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.8, allow_negative_numbers = true)]
    pub temperature: f32,
    /// Keep the K most likely tokens (0 = off).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches P (1 = off).
    #[arg(long, default_value_t = 0.95, allow_negative_numbers = true)]
    pub top_p: f32,
    /// Drop tokens less likely than P times the most likely one (0 = off).
    #[arg(long, default_value_t = 0.05, allow_negative_numbers = true)]
    pub min_p: f32,
    /// Penalize repeated tokens (1 = off).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub repeat_penalty: f32,
    /// How many recent tokens the repeat penalty looks at.
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Subtract this from the logit of every token already present (0 = off).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub presence_penalty: f32,
    /// Subtract this times the count of each token already present (0 = off).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub frequency_penalty: f32,
    /// Random seed (default: a new one each run).
    #[arg(long)]
    pub seed: Option<u64>,
}

impl SamplerArgs {
    /// The validated sampler configuration; errors name the flag.
    pub fn config(&self) -> Result<SamplerConfig, InputError> {
        let seed = self.seed.unwrap_or_else(|| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            t.as_nanos() as u64 ^ u64::from(std::process::id())
        });
        let cfg = SamplerConfig {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed,
        };
        cfg.validate().map_err(|e| InputError(format!("sampler flags: {e}")))?;
        Ok(cfg)
    }
}

/// A loaded model with everything needed to talk to it.
pub struct Loaded {
    pub model: Arc<Model<CpuBackend>>,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    pub threads: usize,
}

impl Loaded {
    /// A fresh session with the context size from the flags.
    pub fn session(&self, n_ctx: usize) -> anyhow::Result<Session<CpuBackend>> {
        Ok(Session::new(
            self.model.clone(),
            SessionConfig {
                n_ctx,
                ..SessionConfig::default()
            },
        )?)
    }

    /// Tokenize a rendered chat prompt ([`Tokenizer::encode_chat`]).
    pub fn encode_chat(&self, rendered: &str) -> Vec<u32> {
        self.tokenizer.encode_chat(rendered)
    }
}

/// Resolve (fetching an alias on first use), open and load the model.
pub fn load(args: &ModelArgs) -> anyhow::Result<Loaded> {
    if args.backend != BackendKind::Cpu {
        return Err(InputError(format!(
            "backend '{}' is not available in this build yet (available: cpu)",
            format!("{:?}", args.backend).to_lowercase()
        ))
        .into());
    }
    let threads = match args.threads {
        Some(0) => return Err(InputError("--threads must be at least 1".into()).into()),
        Some(n) => n,
        None => num_cpus::get_physical().max(1),
    };
    let path = crate::models::ensure_model(&args.model)?;
    let file = GgufFile::open(&path).map_err(|e| InputError(format!("{}: {e}", path.display())))?;
    let file = Arc::new(file);
    // The model first: an unsupported architecture is the most useful thing to report.
    let backend = CpuBackend::new(threads)?;
    let model = Model::load(backend, file.clone()).map_err(|e| InputError(format!("{}: {e}", path.display())))?;
    let tokenizer = Tokenizer::from_gguf(&file)?;
    let template = ChatTemplate::from_gguf(&file)?;
    Ok(Loaded {
        model: Arc::new(model),
        tokenizer,
        template,
        threads,
    })
}
