//! What `run`, `chat`, `serve` and `bench` share: the model/backend/threads/context flags, the
//! sampler flags, and loading a model with its tokenizer and chat template.
//!
//! Every command loads through [`load`], whose model runs on [`AnyBackend`] (the CPU or the
//! WebGPU backend, picked by `--backend`).

use super::InputError;
pub use any_backend::AnyBackend;
use std::sync::Arc;
use tinyllm::backend::cpu::CpuBackend;
use tinyllm::backend::webgpu::WebGpuBackend;
use tinyllm::backend::Backend;
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
pub struct Loaded<B: Backend = AnyBackend> {
    pub model: Arc<Model<B>>,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    pub threads: usize,
}

impl<B: Backend> Loaded<B> {
    /// A fresh session with the context size from the flags.
    pub fn session(&self, n_ctx: usize) -> anyhow::Result<Session<B>> {
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

/// Resolve (fetching an alias on first use), open and load the model on the backend
/// `--backend` picks (cpu or webgpu).
pub fn load(args: &ModelArgs) -> anyhow::Result<Loaded<AnyBackend>> {
    let threads = threads(args)?;
    let backend = match args.backend {
        BackendKind::Cpu => AnyBackend::Cpu(CpuBackend::new(threads)?),
        BackendKind::Webgpu => {
            AnyBackend::WebGpu(WebGpuBackend::new().map_err(|e| InputError(format!("--backend webgpu: {e}")))?)
        }
        BackendKind::Vulkan => {
            return Err(InputError(
                "backend 'vulkan' is not available in this build yet (available: cpu, webgpu)".into(),
            )
            .into());
        }
    };
    load_on(args, backend, threads)
}

fn threads(args: &ModelArgs) -> anyhow::Result<usize> {
    Ok(match args.threads {
        Some(0) => return Err(InputError("--threads must be at least 1".into()).into()),
        Some(n) => n,
        None => num_cpus::get_physical().max(1),
    })
}

fn load_on<B: Backend>(args: &ModelArgs, backend: B, threads: usize) -> anyhow::Result<Loaded<B>> {
    let path = crate::models::ensure_model(&args.model)?;
    let file = GgufFile::open(&path).map_err(|e| InputError(format!("{}: {e}", path.display())))?;
    let file = Arc::new(file);
    // The model first: an unsupported architecture is the most useful thing to report.
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

mod any_backend {
    //! [`AnyBackend`]: the CPU or the WebGPU backend behind one type, so the commands stay
    //! non-generic. Every op forwards to the backend that made its buffers; buffers of the
    //! other backend are an error (they cannot meet: one model, one backend).

    use std::sync::Arc;
    use tinyllm::backend::cpu::{CpuBackend, CpuBuffer, CpuKv, CpuWeight};
    use tinyllm::backend::webgpu::{Counters, WebGpuBackend, WebGpuBuffer, WebGpuKv, WebGpuWeight};
    use tinyllm::backend::{AttnParams, Backend, BackendError};
    use tinyllm::gguf::GgufFile;
    use tinyllm::model::Rope;
    use tinyllm::sample::Candidates;

    /// The backend `--backend` picked (one per process, so the variants' sizes do not matter).
    #[allow(clippy::large_enum_variant)]
    pub enum AnyBackend {
        Cpu(CpuBackend),
        WebGpu(WebGpuBackend),
    }

    pub enum AnyBuffer {
        Cpu(CpuBuffer),
        WebGpu(WebGpuBuffer),
    }

    pub enum AnyKv {
        Cpu(CpuKv),
        WebGpu(WebGpuKv),
    }

    pub enum AnyWeight {
        Cpu(CpuWeight),
        WebGpu(WebGpuWeight),
    }

    impl AnyBackend {
        /// What runs the kernels: the CPU kernel variant or the adapter's name.
        pub fn detail(&self) -> String {
            match self {
                AnyBackend::Cpu(b) => b.kernel_variant().to_string(),
                AnyBackend::WebGpu(b) => b.adapter().name.clone(),
            }
        }

        /// Submissions and readbacks so far (WebGPU only).
        pub fn counters(&self) -> Option<Counters> {
            match self {
                AnyBackend::Cpu(_) => None,
                AnyBackend::WebGpu(b) => Some(b.counters()),
            }
        }
    }

    fn mismatch(op: &'static str) -> BackendError {
        BackendError::Shape {
            op,
            problem: "buffers of another backend".into(),
        }
    }

    /// Forward `$call` to the backend whose variant every argument has.
    macro_rules! forward {
        ($op:literal, $self:expr, [$($arg:ident: $ty:ident),*], |$be:ident| $call:expr) => {
            match $self {
                AnyBackend::Cpu($be) => {
                    $(let $ty::Cpu($arg) = $arg else { return Err(mismatch($op)) };)*
                    $call
                }
                AnyBackend::WebGpu($be) => {
                    $(let $ty::WebGpu($arg) = $arg else { return Err(mismatch($op)) };)*
                    $call
                }
            }
        };
    }

    impl Backend for AnyBackend {
        type Buffer = AnyBuffer;
        type Kv = AnyKv;
        type Weight = AnyWeight;

        fn run_pass<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
            match self {
                AnyBackend::Cpu(b) => b.run_pass(f),
                AnyBackend::WebGpu(b) => b.run_pass(f),
            }
        }

        fn name(&self) -> &'static str {
            match self {
                AnyBackend::Cpu(b) => b.name(),
                AnyBackend::WebGpu(b) => b.name(),
            }
        }

        fn load_weight(&self, file: &Arc<GgufFile>, name: &str) -> Result<AnyWeight, BackendError> {
            Ok(match self {
                AnyBackend::Cpu(b) => AnyWeight::Cpu(b.load_weight(file, name)?),
                AnyBackend::WebGpu(b) => AnyWeight::WebGpu(b.load_weight(file, name)?),
            })
        }

        fn alloc(&self, len: usize) -> Result<AnyBuffer, BackendError> {
            Ok(match self {
                AnyBackend::Cpu(b) => AnyBuffer::Cpu(b.alloc(len)?),
                AnyBackend::WebGpu(b) => AnyBuffer::WebGpu(b.alloc(len)?),
            })
        }

        fn alloc_kv(&self, len: usize) -> Result<AnyKv, BackendError> {
            Ok(match self {
                AnyBackend::Cpu(b) => AnyKv::Cpu(b.alloc_kv(len)?),
                AnyBackend::WebGpu(b) => AnyKv::WebGpu(b.alloc_kv(len)?),
            })
        }

        fn write(&self, dst: &mut AnyBuffer, src: &[f32]) -> Result<(), BackendError> {
            forward!("write", self, [dst: AnyBuffer], |b| b.write(dst, src))
        }

        fn read(&self, src: &AnyBuffer, dst: &mut [f32]) -> Result<(), BackendError> {
            forward!("read", self, [src: AnyBuffer], |b| b.read(src, dst))
        }

        fn embed(
            &self,
            table: &AnyWeight,
            tokens: &[u32],
            scale: f32,
            out: &mut AnyBuffer,
        ) -> Result<(), BackendError> {
            forward!("embed", self, [table: AnyWeight, out: AnyBuffer], |b| b.embed(table, tokens, scale, out))
        }

        fn matmul(&self, w: &AnyWeight, x: &AnyBuffer, rows: usize, out: &mut AnyBuffer) -> Result<(), BackendError> {
            forward!("matmul", self, [w: AnyWeight, x: AnyBuffer, out: AnyBuffer], |b| b.matmul(w, x, rows, out))
        }

        fn add_bias(&self, x: &mut AnyBuffer, bias: &AnyWeight, rows: usize) -> Result<(), BackendError> {
            forward!("add_bias", self, [x: AnyBuffer, bias: AnyWeight], |b| b.add_bias(x, bias, rows))
        }

        fn add(&self, x: &mut AnyBuffer, y: &AnyBuffer, len: usize) -> Result<(), BackendError> {
            forward!("add", self, [x: AnyBuffer, y: AnyBuffer], |b| b.add(x, y, len))
        }

        fn scale(&self, x: &mut AnyBuffer, len: usize, s: f32) -> Result<(), BackendError> {
            forward!("scale", self, [x: AnyBuffer], |b| b.scale(x, len, s))
        }

        fn rmsnorm(
            &self,
            x: &AnyBuffer,
            w: &AnyWeight,
            groups: usize,
            eps: f32,
            out: &mut AnyBuffer,
        ) -> Result<(), BackendError> {
            forward!("rmsnorm", self, [x: AnyBuffer, w: AnyWeight, out: AnyBuffer], |b| b.rmsnorm(x, w, groups, eps, out))
        }

        fn rmsnorm_inplace(
            &self,
            x: &mut AnyBuffer,
            w: &AnyWeight,
            groups: usize,
            eps: f32,
        ) -> Result<(), BackendError> {
            forward!("rmsnorm", self, [x: AnyBuffer, w: AnyWeight], |b| b.rmsnorm_inplace(x, w, groups, eps))
        }

        fn rope(
            &self,
            x: &mut AnyBuffer,
            rows: usize,
            n_head: usize,
            head_dim: usize,
            pos0: usize,
            rope: &Rope,
            factors: Option<&AnyWeight>,
        ) -> Result<(), BackendError> {
            match (self, x, factors) {
                (AnyBackend::Cpu(b), AnyBuffer::Cpu(x), None) => b.rope(x, rows, n_head, head_dim, pos0, rope, None),
                (AnyBackend::Cpu(b), AnyBuffer::Cpu(x), Some(AnyWeight::Cpu(f))) => {
                    b.rope(x, rows, n_head, head_dim, pos0, rope, Some(f))
                }
                (AnyBackend::WebGpu(b), AnyBuffer::WebGpu(x), None) => {
                    b.rope(x, rows, n_head, head_dim, pos0, rope, None)
                }
                (AnyBackend::WebGpu(b), AnyBuffer::WebGpu(x), Some(AnyWeight::WebGpu(f))) => {
                    b.rope(x, rows, n_head, head_dim, pos0, rope, Some(f))
                }
                _ => Err(mismatch("rope")),
            }
        }

        fn kv_store(
            &self,
            k_cache: &mut AnyKv,
            v_cache: &mut AnyKv,
            k: &AnyBuffer,
            v: &AnyBuffer,
            rows: usize,
            kv_dim: usize,
            pos0: usize,
        ) -> Result<(), BackendError> {
            forward!("kv_store", self, [k_cache: AnyKv, v_cache: AnyKv, k: AnyBuffer, v: AnyBuffer], |b| b
                .kv_store(k_cache, v_cache, k, v, rows, kv_dim, pos0))
        }

        fn attention(
            &self,
            q: &AnyBuffer,
            k_cache: &AnyKv,
            v_cache: &AnyKv,
            p: &AttnParams,
            out: &mut AnyBuffer,
        ) -> Result<(), BackendError> {
            forward!("attention", self, [q: AnyBuffer, k_cache: AnyKv, v_cache: AnyKv, out: AnyBuffer], |b| b
                .attention(q, k_cache, v_cache, p, out))
        }

        fn swiglu(&self, gate: &mut AnyBuffer, up: &AnyBuffer, len: usize) -> Result<(), BackendError> {
            forward!("swiglu", self, [gate: AnyBuffer, up: AnyBuffer], |b| b.swiglu(gate, up, len))
        }

        fn geglu(&self, gate: &mut AnyBuffer, up: &AnyBuffer, len: usize) -> Result<(), BackendError> {
            forward!("geglu", self, [gate: AnyBuffer, up: AnyBuffer], |b| b.geglu(gate, up, len))
        }

        fn copy_rows(
            &self,
            src: &AnyBuffer,
            row0: usize,
            rows: usize,
            width: usize,
            dst: &mut AnyBuffer,
        ) -> Result<(), BackendError> {
            forward!("copy_rows", self, [src: AnyBuffer, dst: AnyBuffer], |b| b.copy_rows(src, row0, rows, width, dst))
        }

        fn paste_rows(
            &self,
            src: &AnyBuffer,
            rows: usize,
            width: usize,
            dst: &mut AnyBuffer,
            row0: usize,
        ) -> Result<(), BackendError> {
            forward!("paste_rows", self, [src: AnyBuffer, dst: AnyBuffer], |b| b.paste_rows(src, rows, width, dst, row0))
        }

        fn argmax(&self, x: &AnyBuffer, rows: usize, width: usize) -> Result<Vec<u32>, BackendError> {
            forward!("argmax", self, [x: AnyBuffer], |b| b.argmax(x, rows, width))
        }

        fn top_k(
            &self,
            x: &AnyBuffer,
            rows: usize,
            width: usize,
            k: usize,
            gather: &[u32],
        ) -> Result<Vec<Candidates>, BackendError> {
            forward!("top_k", self, [x: AnyBuffer], |b| b.top_k(x, rows, width, k, gather))
        }
    }
}
