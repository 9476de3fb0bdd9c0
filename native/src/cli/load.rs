//! What `run`, `chat`, `serve` and `bench` share: the model/backend/threads/context/KV cache
//! flags, the sampler flags, and loading a model with its tokenizer and chat template into the library's
//! [`Engine`] on the library's [`AnyBackend`] (the backend `--backend` picks).

use crate::error::InputError;
use std::sync::Arc;
use tinyllm::backend::{AnyBackend, BackendKind, KvType};
use tinyllm::engine::{Engine, Session};
use tinyllm::gguf::GgufFile;
use tinyllm::sample::SamplerConfig;

/// `--backend`: where the model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendArg {
    Cpu,
    Webgpu,
    /// Vulkan through ash: the GPU path with subgroup-size control and a pipeline cache.
    Vulkan,
}

/// `--cache-type`: the KV cache's format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CacheTypeArg {
    F16,
    #[value(name = "q8_0")]
    Q8_0,
}

impl CacheTypeArg {
    pub fn kv_type(self) -> KvType {
        match self {
            CacheTypeArg::F16 => KvType::F16,
            CacheTypeArg::Q8_0 => KvType::Q8_0,
        }
    }
}

impl BackendArg {
    fn kind(self) -> BackendKind {
        match self {
            BackendArg::Cpu => BackendKind::Cpu,
            BackendArg::Webgpu => BackendKind::WebGpu,
            BackendArg::Vulkan => BackendKind::Vulkan,
        }
    }
}

/// The model a command runs when `-m` is not given.
pub const DEFAULT_MODEL: &str = "qwen2.5-coder:0.5b";

#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// Model path or alias (fetched into the cache on first use) [default: qwen2.5-coder:0.5b].
    /// `serve` takes several (-m A -m B, each NAME=MODEL to choose the name it is served under).
    #[arg(short = 'm', long = "model", value_name = "MODEL")]
    pub models: Vec<String>,
    /// Compute backend.
    #[arg(long, value_enum, default_value_t = BackendArg::Cpu)]
    pub backend: BackendArg,
    /// Worker threads (default: the physical cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Context size in tokens (capped by the model's trained context; 0 = the model's).
    #[arg(long, default_value_t = 4096)]
    pub ctx: usize,
    /// KV cache format: f16, or q8_0 (ggml's Q8_0 blocks, 47% smaller; heads must be multiples
    /// of 32 values). `bench` takes a comma-separated list and measures each side by side.
    #[arg(long, value_enum, value_delimiter = ',', num_args = 1, default_value = "f16")]
    pub cache_type: Vec<CacheTypeArg>,
}

impl ModelArgs {
    /// The one model of a command that runs one (all but `serve`).
    pub fn model(&self) -> &str {
        self.models.first().map_or(DEFAULT_MODEL, String::as_str)
    }

    /// These flags with `model` as the one model.
    pub fn with_model(&self, model: &str) -> ModelArgs {
        ModelArgs {
            models: vec![model.to_string()],
            ..self.clone()
        }
    }

    /// The one `--cache-type` of a command that runs one cache (all but `bench`).
    pub fn cache_type(&self) -> Result<KvType, InputError> {
        match self.cache_type.as_slice() {
            [one] => Ok(one.kv_type()),
            _ => Err(InputError("--cache-type takes one type here (f16 or q8_0)".into())),
        }
    }

    /// Every `--cache-type` given, in order, without repeats.
    pub fn cache_types(&self) -> Vec<KvType> {
        let mut v: Vec<KvType> = Vec::new();
        for t in &self.cache_type {
            if !v.contains(&t.kv_type()) {
                v.push(t.kv_type());
            }
        }
        v
    }

    /// A session of `--ctx` positions with the KV cache of `--cache-type`.
    pub fn session(&self, engine: &Engine<AnyBackend>) -> anyhow::Result<Session<AnyBackend>> {
        Ok(engine.session_with(self.ctx, self.cache_type()?)?)
    }
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
        let seed = self.seed.unwrap_or_else(tinyllm::sample::fresh_seed);
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

/// A loaded model and the threads its backend runs.
pub struct Loaded {
    pub engine: Engine<AnyBackend>,
    pub threads: usize,
}

/// Resolve (fetching an alias on first use), open and load the model on the backend
/// `--backend` picks.
pub fn load(args: &ModelArgs) -> anyhow::Result<Loaded> {
    let opened = open(args)?;
    load_opened(args, opened)
}

/// A model file found and its header read (fast: the weights are only mapped).
pub struct Opened {
    pub path: std::path::PathBuf,
    file: Arc<GgufFile>,
}

impl Opened {
    /// The file's header (metadata and tensor table).
    pub fn file(&self) -> &GgufFile {
        &self.file
    }
}

/// The first part of [`load`]: resolve the model (fetching an alias on first use) and read
/// its header, so a wrong name or file is reported at once.
pub fn open(args: &ModelArgs) -> anyhow::Result<Opened> {
    threads(args)?;
    if args.models.len() > 1 {
        return Err(InputError(format!(
            "-m was given {} times: only serve runs several models",
            args.models.len()
        ))
        .into());
    }
    let path = crate::models::ensure_model(args.model())?;
    let file = GgufFile::open(&path).map_err(|e| InputError(format!("{}: {e}", path.display())))?;
    Ok(Opened {
        path,
        file: Arc::new(file),
    })
}

/// The rest of [`load`]: open the backend and place the weights (the slow part).
pub fn load_opened(args: &ModelArgs, opened: Opened) -> anyhow::Result<Loaded> {
    let threads = threads(args)?;
    let backend = AnyBackend::open(args.backend.kind(), threads)
        .map_err(|e| InputError(format!("--backend {}: {e}", args.backend.kind().name())))?;
    let path = opened.path.display();
    let engine = Engine::load(backend, opened.file).map_err(|e| InputError(format!("{path}: {e}")))?;
    // A cache type the model's heads cannot have is the user's flag to change: say so now,
    // naming it, rather than at the first session.
    for ty in args.cache_types() {
        engine
            .model
            .new_state(1, ty)
            .map_err(|e| InputError(format!("--cache-type {ty}: {e}")))?;
    }
    Ok(Loaded { engine, threads })
}

fn threads(args: &ModelArgs) -> anyhow::Result<usize> {
    Ok(match args.threads {
        Some(0) => return Err(InputError("--threads must be at least 1".into()).into()),
        Some(n) => n,
        None => num_cpus::get_physical().max(1),
    })
}
