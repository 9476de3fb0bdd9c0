//! Reading hyper-parameters from GGUF metadata, shared by the families: the `{arch}.*` keys
//! every transformer has (sizes, heads, norms, rope and its scaling), each validated with an
//! error naming the key. A family composes these with its own keys.

use super::error::ModelError;
use crate::backend::{Rope, RopeKind, RopeScaling, Yarn};
use crate::gguf::{GgufError, GgufFile, Value};

/// The metadata of one model under its architecture's key prefix.
pub struct Keys<'a> {
    pub file: &'a GgufFile,
    /// `general.architecture` as found (e.g. `mistral`).
    pub arch: &'a str,
}

/// A [`ModelError::BadParam`].
pub fn bad(key: String, problem: impl Into<String>) -> ModelError {
    ModelError::BadParam {
        key,
        problem: problem.into(),
    }
}

impl Keys<'_> {
    /// The full key of `k`.
    pub fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    /// A required nonzero count.
    pub fn count(&self, k: &str) -> Result<usize, ModelError> {
        let name = self.key(k);
        let v = self.file.get_u32(&name)? as usize;
        if v == 0 {
            return Err(bad(name, "must be nonzero"));
        }
        Ok(v)
    }

    /// An optional count, nonzero when present.
    pub fn opt_count(&self, k: &str) -> Result<Option<usize>, ModelError> {
        match self.file.opt(&self.key(k), GgufFile::get_u32)? {
            Some(0) => Err(bad(self.key(k), "must be nonzero")),
            v => Ok(v.map(|v| v as usize)),
        }
    }

    pub fn opt_u32(&self, k: &str) -> Result<Option<u32>, ModelError> {
        Ok(self.file.opt(&self.key(k), GgufFile::get_u32)?)
    }

    pub fn opt_f32(&self, k: &str) -> Result<Option<f32>, ModelError> {
        Ok(self.file.opt(&self.key(k), GgufFile::get_f32)?)
    }

    /// An optional positive finite number, `default` when absent.
    pub fn positive(&self, k: &str, default: f32) -> Result<f32, ModelError> {
        let v = self.opt_f32(k)?.unwrap_or(default);
        if !(v > 0.0 && v.is_finite()) {
            return Err(bad(self.key(k), format!("{v} is not a positive number")));
        }
        Ok(v)
    }

    pub fn opt_bool(&self, k: &str) -> Result<Option<bool>, ModelError> {
        Ok(self.file.opt(&self.key(k), GgufFile::get_bool)?)
    }

    /// An optional string.
    pub fn opt_str(&self, k: &str) -> Result<Option<&str>, ModelError> {
        let key = self.key(k);
        match self.file.get(&key) {
            None => Ok(None),
            Some(_) => Ok(Some(self.file.get_str(&key)?)),
        }
    }
}

/// Sizes every transformer family has.
#[derive(Debug, Clone, PartialEq)]
pub struct Common {
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_vocab: usize,
    pub context_length: usize,
    pub rms_eps: f32,
}

impl Common {
    pub fn read(k: &Keys<'_>) -> Result<Self, ModelError> {
        let n_embd = k.count("embedding_length")?;
        let n_layer = k.count("block_count")?;
        let context_length = k.count("context_length")?;
        let rms_eps = k.positive("attention.layer_norm_rms_epsilon", 1e-5)?;
        let embd = k
            .file
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
        if let Some(v) = k.opt_u32("vocab_size")? {
            if v as usize != n_vocab {
                return Err(bad(
                    k.key("vocab_size"),
                    format!("{v} differs from token_embd rows {n_vocab}"),
                ));
            }
        }
        Ok(Common {
            n_embd,
            n_layer,
            n_vocab,
            context_length,
            rms_eps,
        })
    }
}

/// The attention heads of a layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Heads {
    pub n_head: usize,
    pub n_head_kv: usize,
    /// Width of a q and k head (`attention.key_length`, default `n_embd / n_head`).
    pub head_dim_k: usize,
    /// Width of a v head (`attention.value_length`, default the k width).
    pub head_dim_v: usize,
}

impl Heads {
    pub fn read(k: &Keys<'_>, n_embd: usize) -> Result<Self, ModelError> {
        let n_head = k.count("attention.head_count")?;
        let n_head_kv = k.opt_count("attention.head_count_kv")?.unwrap_or(n_head);
        if !n_head.is_multiple_of(n_head_kv) {
            return Err(bad(
                k.key("attention.head_count_kv"),
                format!("{n_head_kv} does not divide the head count {n_head}"),
            ));
        }
        let head_dim_k = match k.opt_count("attention.key_length")? {
            Some(v) => v,
            None if !n_embd.is_multiple_of(n_head) => {
                return Err(bad(
                    k.key("attention.head_count"),
                    format!("{n_head} does not divide embedding_length {n_embd}"),
                ))
            }
            None => n_embd / n_head,
        };
        let head_dim_v = k.opt_count("attention.value_length")?.unwrap_or(head_dim_k);
        for (key, hd) in [
            ("attention.key_length", head_dim_k),
            ("attention.value_length", head_dim_v),
        ] {
            if hd > crate::backend::MAX_HEAD_DIM {
                return Err(bad(
                    k.key(key),
                    format!("head size {hd} exceeds {}", crate::backend::MAX_HEAD_DIM),
                ));
            }
        }
        Ok(Heads {
            n_head,
            n_head_kv,
            head_dim_k,
            head_dim_v,
        })
    }

    /// Width of the concatenated q heads.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim_k
    }

    /// Width of the concatenated k heads.
    pub fn k_dim(&self) -> usize {
        self.n_head_kv * self.head_dim_k
    }

    /// Width of the concatenated v heads.
    pub fn v_dim(&self) -> usize {
        self.n_head_kv * self.head_dim_v
    }

    /// Width of the attention output (before the output projection).
    pub fn out_dim(&self) -> usize {
        self.n_head * self.head_dim_v
    }
}

/// The rope of a model: its kind, rotated dimensions (`rope.dimension_count`, default the head
/// size), base `base_key` (default 10000) and scaling (`rope.scaling.*`; llama3 when the file
/// has `rope_freqs.weight`).
pub fn rope(k: &Keys<'_>, kind: RopeKind, head_dim: usize, base_key: &str) -> Result<Rope, ModelError> {
    let n_rot = k.opt_u32("rope.dimension_count")?.map_or(head_dim, |v| v as usize);
    if n_rot == 0 || n_rot > head_dim || !n_rot.is_multiple_of(2) {
        return Err(bad(
            k.key("rope.dimension_count"),
            format!("{n_rot} must be even, nonzero and at most the head size {head_dim}"),
        ));
    }
    Ok(Rope {
        kind,
        n_rot,
        base: k.positive(base_key, 10000.0)?,
        scaling: rope_scaling(k)?,
    })
}

/// `rope.scaling.type` and its parameters, as llama.cpp reads them: no type means linear (by a
/// factor that defaults to 1, i.e. none); `none` ignores any factor; YaRN takes its original
/// context (default the trained one), attention factor and betas, with llama.cpp's magnitude
/// correction from `rope.scaling.yarn_log_multiplier`.
fn rope_scaling(k: &Keys<'_>) -> Result<RopeScaling, ModelError> {
    if k.file.tensor_info("rope_freqs.weight").is_some() {
        return Ok(RopeScaling::Llama3);
    }
    let factor_key = k.key("rope.scaling.factor");
    let factor = match k.opt_f32("rope.scaling.factor")? {
        None | Some(0.0) => None,
        Some(f) if f > 0.0 && f.is_finite() => Some(f),
        Some(f) => return Err(bad(factor_key, format!("{f} is not a positive number"))),
    };
    let ty = k.opt_str("rope.scaling.type")?;
    match ty {
        Some("none") => Ok(RopeScaling::None),
        None | Some("linear") => Ok(match factor {
            Some(f) if f != 1.0 => RopeScaling::Linear { factor: f },
            _ => RopeScaling::None,
        }),
        Some("yarn") => {
            let factor = factor.unwrap_or(1.0);
            let n_ctx_orig = match k.opt_count("rope.scaling.original_context_length")? {
                Some(n) => n,
                None => k.count("context_length")?,
            };
            let ext_factor = match k.opt_f32("rope.scaling.yarn_ext_factor")? {
                Some(e) if e >= 0.0 => e,
                _ => 1.0,
            };
            let mut attn_factor = k.opt_f32("rope.scaling.yarn_attn_factor")?.unwrap_or(1.0);
            if ext_factor != 0.0 {
                // llama.cpp's magnitude for YaRN, with its own factor cancelled (rope applies
                // `1 + 0.1 ln(factor)` again).
                let mscale = |m: f32| {
                    if factor <= 1.0 {
                        1.0
                    } else {
                        0.1 * m * factor.ln() + 1.0
                    }
                };
                attn_factor = match k.opt_f32("rope.scaling.yarn_log_multiplier")? {
                    Some(log_mul) if log_mul != 0.0 => {
                        let m = if k.arch == "deepseek2" && log_mul != 1.0 {
                            log_mul
                        } else {
                            1.0
                        };
                        mscale(m) / mscale(log_mul)
                    }
                    _ => mscale(1.0),
                };
                attn_factor *= 1.0 / (1.0 + 0.1 * factor.ln());
            }
            attn_factor *= k.opt_f32("rope.scaling.attn_factor")?.unwrap_or(1.0);
            Ok(RopeScaling::Yarn(Yarn {
                factor,
                n_ctx_orig,
                ext_factor,
                attn_factor,
                beta_fast: k.opt_f32("rope.scaling.yarn_beta_fast")?.unwrap_or(32.0),
                beta_slow: k.opt_f32("rope.scaling.yarn_beta_slow")?.unwrap_or(1.0),
            }))
        }
        Some(other) => Err(bad(
            k.key("rope.scaling.type"),
            format!("rope scaling '{other}' is not supported (supported: none, linear, yarn)"),
        )),
    }
}

/// Which layers use a sliding window: a bool array per layer, or a period `n` where every
/// `n`-th layer is global (`default_period` when the key is absent; 0: every layer slides).
pub fn swa_pattern(k: &Keys<'_>, key: &str, n_layer: usize, default_period: usize) -> Result<Vec<bool>, ModelError> {
    let key = k.key(key);
    let period = match k.file.get(&key) {
        None => default_period,
        Some(Value::Array(arr)) => {
            let flags: Option<Vec<bool>> = arr.items.iter().map(Value::as_bool).collect();
            let flags = flags.ok_or_else(|| bad(key.clone(), "expected an array of bools"))?;
            if flags.len() != n_layer {
                return Err(bad(key, format!("{} entries for {n_layer} layers", flags.len())));
            }
            return Ok(flags);
        }
        Some(v) => {
            let n = v.as_integer().ok_or_else(|| {
                ModelError::Gguf(GgufError::WrongType {
                    key: key.clone(),
                    expected: "an integer or an array of bools",
                    found: v.type_description(),
                })
            })?;
            usize::try_from(n).map_err(|_| bad(key.clone(), format!("{n} is not a layer period")))?
        }
    };
    // Period 0 means every layer slides; otherwise the last layer of each period is global.
    Ok((0..n_layer).map(|il| period == 0 || il % period < period - 1).collect())
}
