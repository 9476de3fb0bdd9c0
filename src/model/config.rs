//! Hyper-parameters of a dense transformer read from GGUF metadata, checked against the tensor
//! table before any weight is touched, so a malformed file fails with a message naming the key
//! or tensor at fault instead of a shape error deep inside a forward pass.

use crate::gguf::{GgufError, GgufFile, Value};

use super::ModelError;

/// The architectures this engine runs (`general.architecture`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Llama 1/2/3 and Mistral (same graph, rope NORM).
    Llama,
    /// Qwen2 / Qwen2.5: q/k/v biases, rope NEOX.
    Qwen2,
    /// Qwen3 dense: per-head q/k RMS norms, rope NEOX.
    Qwen3,
    /// Gemma 3: sliding-window layers, post-norms, GELU, scaled embeddings, rope NEOX.
    Gemma3,
}

impl Arch {
    /// Names accepted in `general.architecture`, for error messages.
    pub const SUPPORTED: &'static [&'static str] = &["llama", "mistral", "qwen2", "qwen3", "gemma3"];

    fn from_name(name: &str) -> Option<Self> {
        match name {
            "llama" | "mistral" => Some(Arch::Llama),
            "qwen2" => Some(Arch::Qwen2),
            "qwen3" => Some(Arch::Qwen3),
            "gemma3" => Some(Arch::Gemma3),
            _ => None,
        }
    }
}

/// How rope pairs up dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeKind {
    /// Adjacent pairs `(x[2i], x[2i+1])` (ggml mode 0, llama).
    Norm,
    /// Halves `(x[i], x[i + n_rot/2])` (ggml NEOX mode, qwen/gemma).
    Neox,
}

/// Rotary position embedding parameters of one layer.
#[derive(Debug, Clone, PartialEq)]
pub struct Rope {
    pub kind: RopeKind,
    /// Rotated dimensions per head (the first `n_rot` of `head_dim`).
    pub n_rot: usize,
    pub base: f32,
    /// Linear position scaling (`1 / rope.scaling.factor` for linear scaling, else 1).
    pub freq_scale: f32,
}

/// Validated hyper-parameters of a dense model.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub arch: Arch,
    /// The `general.architecture` string as found (e.g. `mistral` for [`Arch::Llama`]).
    pub arch_name: String,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    /// Per-head width of q and k (`attention.key_length`, default `n_embd / n_head`).
    pub head_dim: usize,
    pub n_ff: usize,
    pub n_vocab: usize,
    pub rms_eps: f32,
    /// Rope of full-attention layers.
    pub rope: Rope,
    /// Rope of sliding-window layers (differs in base for gemma3).
    pub rope_swa: Rope,
    /// Whether `rope_freqs.weight` (llama3-style per-frequency factors) is present.
    pub rope_freq_factors: bool,
    pub context_length: usize,
    /// Sliding window size: a key is masked when `q_pos - k_pos >= window` on SWA layers.
    pub sliding_window: Option<usize>,
    /// Per layer: true for sliding-window layers.
    pub swa_layers: Vec<bool>,
    /// No `output.weight`: logits use `token_embd.weight`.
    pub tied_output: bool,
    /// Scale applied to q·k (llama: `1/sqrt(head_dim)`; gemma3 pre-scales q instead, see
    /// [`Config::q_scale`]).
    pub kq_scale: f32,
    /// Scale applied to q before attention (gemma3), `None` elsewhere.
    pub q_scale: Option<f32>,
    /// Scale applied to the embeddings (gemma3: `sqrt(n_embd)`).
    pub embd_scale: Option<f32>,
    pub qkv_bias: bool,
    pub qk_norm: bool,
}

/// One tensor the graph reads, with its expected shape in ggml order.
#[derive(Debug, Clone)]
pub struct TensorSpec {
    pub name: String,
    pub shape: Vec<u64>,
}

impl Config {
    /// Read and validate the hyper-parameters of `file`.
    pub fn from_gguf(file: &GgufFile) -> Result<Config, ModelError> {
        let arch_name = file.architecture()?.to_string();
        let arch = Arch::from_name(&arch_name).ok_or_else(|| ModelError::UnsupportedArch {
            arch: arch_name.clone(),
            supported: Arch::SUPPORTED.join(", "),
        })?;
        let a = arch_name.as_str();
        let key = |k: &str| format!("{a}.{k}");
        let req = |k: &str| -> Result<usize, ModelError> {
            let name = key(k);
            let v = file.get_u32(&name)? as usize;
            if v == 0 {
                return Err(ModelError::BadParam {
                    key: name,
                    problem: "must be nonzero".into(),
                });
            }
            Ok(v)
        };
        let opt_u32 = |k: &str| file.opt(&key(k), GgufFile::get_u32);
        let opt_f32 = |k: &str| file.opt(&key(k), GgufFile::get_f32);

        let n_embd = req("embedding_length")?;
        let n_layer = req("block_count")?;
        let n_head = req("attention.head_count")?;
        let n_head_kv = match opt_u32("attention.head_count_kv")? {
            Some(0) => return Err(bad(key("attention.head_count_kv"), "must be nonzero")),
            Some(v) => v as usize,
            None => n_head,
        };
        if n_head % n_head_kv != 0 {
            return Err(bad(
                key("attention.head_count_kv"),
                format!("{n_head_kv} does not divide the head count {n_head}"),
            ));
        }
        let head_dim = match opt_u32("attention.key_length")? {
            Some(0) => return Err(bad(key("attention.key_length"), "must be nonzero")),
            Some(v) => v as usize,
            None => {
                if n_embd % n_head != 0 {
                    return Err(bad(
                        key("attention.head_count"),
                        format!("{n_head} does not divide embedding_length {n_embd}"),
                    ));
                }
                n_embd / n_head
            }
        };
        if let Some(v) = opt_u32("attention.value_length")? {
            if v as usize != head_dim {
                return Err(bad(
                    key("attention.value_length"),
                    format!("{v} differs from key_length {head_dim}; only equal lengths are supported"),
                ));
            }
        }
        let n_ff = req("feed_forward_length")?;
        let context_length = req("context_length")?;
        let rms_eps = opt_f32("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-5);
        if !(rms_eps > 0.0 && rms_eps.is_finite()) {
            return Err(bad(
                key("attention.layer_norm_rms_epsilon"),
                format!("{rms_eps} is not a positive number"),
            ));
        }

        let embd = file
            .tensor_info("token_embd.weight")
            .ok_or_else(|| ModelError::MissingTensor {
                name: "token_embd.weight".into(),
            })?;
        let n_vocab = match embd.shape.as_slice() {
            [_, v] if *v > 0 => *v as usize,
            other => {
                return Err(ModelError::TensorShape {
                    name: "token_embd.weight".into(),
                    expected: format!("[{n_embd}, n_vocab]"),
                    actual: format!("{other:?}"),
                })
            }
        };
        if let Some(v) = opt_u32("vocab_size")? {
            if v as usize != n_vocab {
                return Err(bad(
                    key("vocab_size"),
                    format!("{v} differs from token_embd rows {n_vocab}"),
                ));
            }
        }

        let kind = match arch {
            Arch::Llama => RopeKind::Norm,
            Arch::Qwen2 | Arch::Qwen3 | Arch::Gemma3 => RopeKind::Neox,
        };
        let n_rot = opt_u32("rope.dimension_count")?.map_or(head_dim, |v| v as usize);
        if n_rot == 0 || n_rot > head_dim || n_rot % 2 != 0 {
            return Err(bad(
                key("rope.dimension_count"),
                format!("{n_rot} must be even, nonzero and at most the head size {head_dim}"),
            ));
        }
        let base = opt_f32("rope.freq_base")?.unwrap_or(10000.0);
        let freq_scale = rope_freq_scale(file, a)?;
        let rope = Rope {
            kind,
            n_rot,
            base,
            freq_scale,
        };
        // llama.cpp's default SWA rope base is 10000 when the file does not say otherwise.
        let base_swa = opt_f32("rope.freq_base_swa")?.unwrap_or(10000.0);
        for (name, b) in [(key("rope.freq_base"), base), (key("rope.freq_base_swa"), base_swa)] {
            if !(b > 0.0 && b.is_finite()) {
                return Err(bad(name, format!("{b} is not a positive number")));
            }
        }
        let rope_swa = Rope {
            base: base_swa,
            ..rope.clone()
        };

        let (sliding_window, swa_layers) = match arch {
            Arch::Gemma3 => match opt_u32("attention.sliding_window")? {
                Some(w) if w > 0 => (
                    Some(w as usize),
                    swa_pattern(file, &key("attention.sliding_window_pattern"), n_layer)?,
                ),
                _ => (None, vec![false; n_layer]),
            },
            _ => (None, vec![false; n_layer]),
        };

        let tied_output = file.tensor_info("output.weight").is_none();
        let (kq_scale, q_scale, embd_scale) = match arch {
            Arch::Gemma3 => (1.0, Some(1.0 / (head_dim as f32).sqrt()), Some((n_embd as f32).sqrt())),
            _ => (1.0 / (head_dim as f32).sqrt(), None, None),
        };
        let config = Config {
            arch,
            arch_name: arch_name.clone(),
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim,
            n_ff,
            n_vocab,
            rms_eps,
            rope,
            rope_swa,
            rope_freq_factors: file.tensor_info("rope_freqs.weight").is_some(),
            context_length,
            sliding_window,
            swa_layers,
            tied_output,
            kq_scale,
            q_scale,
            embd_scale,
            qkv_bias: matches!(arch, Arch::Qwen2),
            qk_norm: matches!(arch, Arch::Qwen3 | Arch::Gemma3),
        };
        config.check_tensors(file)?;
        Ok(config)
    }

    /// Width of the concatenated q heads.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Width of the concatenated k (or v) heads.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// The rope of layer `il`.
    pub fn rope_for(&self, il: usize) -> &Rope {
        if self.swa_layers.get(il).copied().unwrap_or(false) {
            &self.rope_swa
        } else {
            &self.rope
        }
    }

    /// The attention window of layer `il` (`None`: full causal attention).
    pub fn window_for(&self, il: usize) -> Option<usize> {
        if self.swa_layers.get(il).copied().unwrap_or(false) {
            self.sliding_window
        } else {
            None
        }
    }

    /// Every tensor the graph reads, with its expected shape.
    pub fn tensor_specs(&self) -> Vec<TensorSpec> {
        let (e, q, kv, ff, v) = (
            self.n_embd as u64,
            self.q_dim() as u64,
            self.kv_dim() as u64,
            self.n_ff as u64,
            self.n_vocab as u64,
        );
        let hd = self.head_dim as u64;
        let mut specs = vec![spec("token_embd.weight", &[e, v]), spec("output_norm.weight", &[e])];
        if !self.tied_output {
            specs.push(spec("output.weight", &[e, v]));
        }
        if self.rope_freq_factors {
            specs.push(spec("rope_freqs.weight", &[self.rope.n_rot as u64 / 2]));
        }
        for il in 0..self.n_layer {
            let b = |n: &str| format!("blk.{il}.{n}");
            specs.extend([
                spec(&b("attn_norm.weight"), &[e]),
                spec(&b("attn_q.weight"), &[e, q]),
                spec(&b("attn_k.weight"), &[e, kv]),
                spec(&b("attn_v.weight"), &[e, kv]),
                spec(&b("attn_output.weight"), &[q, e]),
                spec(&b("ffn_norm.weight"), &[e]),
                spec(&b("ffn_gate.weight"), &[e, ff]),
                spec(&b("ffn_up.weight"), &[e, ff]),
                spec(&b("ffn_down.weight"), &[ff, e]),
            ]);
            if self.qkv_bias {
                specs.extend([
                    spec(&b("attn_q.bias"), &[q]),
                    spec(&b("attn_k.bias"), &[kv]),
                    spec(&b("attn_v.bias"), &[kv]),
                ]);
            }
            if self.qk_norm {
                specs.extend([
                    spec(&b("attn_q_norm.weight"), &[hd]),
                    spec(&b("attn_k_norm.weight"), &[hd]),
                ]);
            }
            if self.arch == Arch::Gemma3 {
                specs.extend([
                    spec(&b("post_attention_norm.weight"), &[e]),
                    spec(&b("post_ffw_norm.weight"), &[e]),
                ]);
            }
        }
        specs
    }

    /// Check that every tensor in [`Config::tensor_specs`] exists with the expected shape.
    fn check_tensors(&self, file: &GgufFile) -> Result<(), ModelError> {
        for s in self.tensor_specs() {
            let info = file
                .tensor_info(&s.name)
                .ok_or_else(|| ModelError::MissingTensor { name: s.name.clone() })?;
            if info.shape != s.shape {
                return Err(ModelError::TensorShape {
                    name: s.name,
                    expected: format!("{:?}", s.shape),
                    actual: format!("{:?}", info.shape),
                });
            }
        }
        Ok(())
    }
}

fn spec(name: &str, shape: &[u64]) -> TensorSpec {
    TensorSpec {
        name: name.to_string(),
        shape: shape.to_vec(),
    }
}

fn bad(key: String, problem: impl Into<String>) -> ModelError {
    ModelError::BadParam {
        key,
        problem: problem.into(),
    }
}

/// `rope.scaling.type`: none or linear are supported; llama3-style scaling comes as the
/// `rope_freqs.weight` tensor instead and needs no key.
fn rope_freq_scale(file: &GgufFile, a: &str) -> Result<f32, ModelError> {
    let ty_key = format!("{a}.rope.scaling.type");
    let factor_key = format!("{a}.rope.scaling.factor");
    let factor = file.opt(&factor_key, GgufFile::get_f32)?;
    let ty = match file.get(&ty_key) {
        None => None,
        Some(_) => Some(file.get_str(&ty_key)?),
    };
    match ty {
        None | Some("none") => Ok(1.0),
        Some("linear") => match factor {
            Some(f) if f > 0.0 && f.is_finite() => Ok(1.0 / f),
            Some(f) => Err(bad(factor_key, format!("{f} is not a positive number"))),
            None => Ok(1.0),
        },
        Some(other) => Err(bad(
            ty_key,
            format!("rope scaling '{other}' is not supported (supported: none, linear)"),
        )),
    }
}

/// Which layers use the sliding window: a bool array per layer, or a period `n` where every
/// `n`-th layer is global (llama.cpp's default for gemma3 is 6).
fn swa_pattern(file: &GgufFile, key: &str, n_layer: usize) -> Result<Vec<bool>, ModelError> {
    let period = match file.get(key) {
        None => 6,
        Some(Value::Array(arr)) => {
            let flags: Option<Vec<bool>> = arr.items.iter().map(Value::as_bool).collect();
            let flags = flags.ok_or_else(|| bad(key.to_string(), "expected an array of bools"))?;
            if flags.len() != n_layer {
                return Err(bad(
                    key.to_string(),
                    format!("{} entries for {n_layer} layers", flags.len()),
                ));
            }
            return Ok(flags);
        }
        Some(v) => {
            let n = v.as_integer().ok_or_else(|| {
                ModelError::Gguf(GgufError::WrongType {
                    key: key.to_string(),
                    expected: "an integer or an array of bools",
                    found: v.type_description(),
                })
            })?;
            usize::try_from(n).map_err(|_| bad(key.to_string(), format!("{n} is not a layer period")))?
        }
    };
    // Period 0 means every layer slides; otherwise the last layer of each period is global.
    Ok((0..n_layer).map(|il| period == 0 || il % period < period - 1).collect())
}
