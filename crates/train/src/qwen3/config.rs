//! A Qwen3 model's architecture, read from and written to a Hugging Face `config.json`
//! (`model_type: "qwen3"`, transformers' `Qwen3Config`).

use serde::Deserialize;
use serde_json::{json, Value};

use hanzod_protocol::model::ModelSpec;

/// Largest `vocab_size` accepted (Qwen3's own is 151,936).
pub const MAX_VOCAB: usize = 1 << 18;
/// Largest `hidden_size` accepted (Qwen3-235B's is 4,096; 32B's is 5,120).
pub const MAX_HIDDEN: usize = 16_384;
/// Largest `intermediate_size` accepted.
pub const MAX_INTERMEDIATE: usize = 65_536;
/// Most decoder layers accepted.
pub const MAX_LAYERS: usize = 256;
/// Most attention heads accepted.
pub const MAX_HEADS: usize = 256;
/// Largest `head_dim` accepted.
pub const MAX_HEAD_DIM: usize = 512;
/// Largest `max_position_embeddings` accepted.
pub const MAX_POSITIONS: usize = 1 << 20;

/// Why a `config.json` is not a Qwen3 model hanzod can run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// Not JSON, or a field of the wrong type (serde's message).
    #[error("config.json: {0}")]
    Json(String),
    /// `model_type` is not `"qwen3"`.
    #[error("config.json: model_type {0:?} is not qwen3")]
    ModelType(String),
    /// A field hanzod's Qwen3 needs is absent.
    #[error("config.json: {0} is missing")]
    Missing(&'static str),
    /// A size outside `1..=max` (or an odd `head_dim`: rotary embeddings rotate pairs).
    #[error("config.json: {field} = {value} is out of range (1 to {max}{extra})")]
    OutOfRange {
        /// The field.
        field: &'static str,
        /// Its value.
        value: usize,
        /// The largest value accepted.
        max: usize,
        /// A further condition, e.g. ", even".
        extra: &'static str,
    },
    /// `num_attention_heads` is not a multiple of `num_key_value_heads`.
    #[error(
        "config.json: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
    )]
    HeadsNotGrouped {
        /// `num_attention_heads`.
        heads: usize,
        /// `num_key_value_heads`.
        kv_heads: usize,
    },
    /// A float field that is not finite and positive (`rms_norm_eps`, `rope_theta`,
    /// `initializer_range`).
    #[error("config.json: {field} = {value} is not a finite positive number")]
    NotPositive {
        /// The field.
        field: &'static str,
        /// Its value.
        value: f64,
    },
    /// A feature of the architecture hanzod's Qwen3 does not implement (attention biases, a
    /// sliding window, rope scaling, another activation).
    #[error("config.json: {0} is not supported")]
    Unsupported(String),
}

/// The architecture of a Qwen3 causal LM: the fields of transformers' `Qwen3Config` that
/// shape the computation (`modeling_qwen3.py`). Built by [`Qwen3Config::from_json`], which
/// checks every bound above, so a value of this type is always runnable.
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen3Config {
    /// Tokens in the vocabulary (rows of `model.embed_tokens.weight`).
    pub vocab_size: usize,
    /// Width of the residual stream `H`.
    pub hidden_size: usize,
    /// Width of the SwiGLU MLP's hidden layer.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention: each serves
    /// `num_attention_heads / num_key_value_heads` query heads).
    pub num_key_value_heads: usize,
    /// Width of one head (even).
    pub head_dim: usize,
    /// The ε of every RMSNorm.
    pub rms_norm_eps: f64,
    /// The base θ of the rotary embeddings.
    pub rope_theta: f64,
    /// Longest sequence the model is configured for, in tokens.
    pub max_position_embeddings: usize,
    /// `lm_head` shares `model.embed_tokens.weight` (no `lm_head.weight` tensor).
    pub tie_word_embeddings: bool,
    /// Standard deviation of the initial weights of linear and embedding layers.
    pub initializer_range: f64,
    /// The beginning-of-sequence token id, if the tokenizer has one.
    pub bos_token_id: Option<u32>,
    /// The end-of-sequence token id, if the tokenizer has one.
    pub eos_token_id: Option<u32>,
}

/// The `config.json` fields read; the rest is ignored.
#[derive(Deserialize)]
struct Raw {
    model_type: Option<String>,
    vocab_size: Option<usize>,
    hidden_size: Option<usize>,
    intermediate_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_parameters: Option<Value>,
    rope_scaling: Option<Value>,
    max_position_embeddings: Option<usize>,
    tie_word_embeddings: Option<bool>,
    initializer_range: Option<f64>,
    hidden_act: Option<String>,
    attention_bias: Option<bool>,
    use_sliding_window: Option<bool>,
    layer_types: Option<Vec<String>>,
    bos_token_id: Option<Value>,
    eos_token_id: Option<Value>,
}

/// A token id field: a number, or the first of a list (transformers allows both for
/// `eos_token_id`); `None` for null or absent.
fn token_id(v: Option<&Value>) -> Option<u32> {
    match v? {
        Value::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
        Value::Array(a) => token_id(a.first()),
        _ => None,
    }
}

/// `Some(rope_type)` of a rope dictionary other than the default (unscaled) one.
fn rope_kind(v: &Value) -> Option<String> {
    let t = v
        .get("rope_type")
        .or_else(|| v.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    (t != "default").then(|| t.to_string())
}

impl Qwen3Config {
    /// Parses a Hugging Face `config.json` of `model_type: "qwen3"`.
    ///
    /// Defaults, as transformers' `Qwen3Config`: `head_dim = hidden_size /
    /// num_attention_heads`, `num_key_value_heads = num_attention_heads`,
    /// `rms_norm_eps = 1e-6`, `tie_word_embeddings = false`, `initializer_range = 0.02`,
    /// `max_position_embeddings = 32768`. The rotary base is `rope_theta` (transformers 4)
    /// or `rope_parameters.rope_theta` (transformers 5), default 10,000.
    ///
    /// Errors: [`ConfigError`] — not JSON, not qwen3, a size missing or out of its bound
    /// (the `MAX_*` constants; `head_dim` even), heads not grouped, a non-positive float, or
    /// an unsupported feature (`attention_bias`, `use_sliding_window`, a rope type other
    /// than `default`, `hidden_act` other than `silu`).
    pub fn from_json(text: &str) -> Result<Qwen3Config, ConfigError> {
        let raw: Raw = serde_json::from_str(text).map_err(|e| ConfigError::Json(e.to_string()))?;
        match raw.model_type.as_deref() {
            Some("qwen3") => {}
            Some(other) => return Err(ConfigError::ModelType(other.to_string())),
            None => return Err(ConfigError::Missing("model_type")),
        }
        if let Some(act) = raw.hidden_act.as_deref().filter(|a| *a != "silu") {
            return Err(ConfigError::Unsupported(format!("hidden_act {act:?}")));
        }
        if raw.attention_bias == Some(true) {
            return Err(ConfigError::Unsupported("attention_bias: true".into()));
        }
        if raw.use_sliding_window == Some(true) {
            return Err(ConfigError::Unsupported("use_sliding_window: true".into()));
        }
        if let Some(t) = raw
            .layer_types
            .iter()
            .flatten()
            .find(|t| *t != "full_attention")
        {
            return Err(ConfigError::Unsupported(format!("layer type {t:?}")));
        }
        for v in [&raw.rope_scaling, &raw.rope_parameters]
            .into_iter()
            .flatten()
        {
            if let Some(kind) = v.as_object().and_then(|_| rope_kind(v)) {
                return Err(ConfigError::Unsupported(format!("rope_type {kind:?}")));
            }
        }
        let size = |v: Option<usize>, field: &'static str, max: usize| match v {
            None => Err(ConfigError::Missing(field)),
            Some(v) if v == 0 || v > max => Err(ConfigError::OutOfRange {
                field,
                value: v,
                max,
                extra: "",
            }),
            Some(v) => Ok(v),
        };
        let hidden = size(raw.hidden_size, "hidden_size", MAX_HIDDEN)?;
        let heads = size(raw.num_attention_heads, "num_attention_heads", MAX_HEADS)?;
        let kv_heads = size(
            raw.num_key_value_heads.or(Some(heads)),
            "num_key_value_heads",
            MAX_HEADS,
        )?;
        if !heads.is_multiple_of(kv_heads) {
            return Err(ConfigError::HeadsNotGrouped { heads, kv_heads });
        }
        let head_dim = size(
            raw.head_dim.or(Some(hidden / heads)),
            "head_dim",
            MAX_HEAD_DIM,
        )?;
        if !head_dim.is_multiple_of(2) {
            return Err(ConfigError::OutOfRange {
                field: "head_dim",
                value: head_dim,
                max: MAX_HEAD_DIM,
                extra: ", even",
            });
        }
        let positive = |v: f64, field: &'static str| {
            if v.is_finite() && v > 0.0 {
                Ok(v)
            } else {
                Err(ConfigError::NotPositive { field, value: v })
            }
        };
        let theta = raw
            .rope_theta
            .or_else(|| {
                raw.rope_parameters
                    .as_ref()
                    .and_then(|p| p.get("rope_theta"))
                    .and_then(Value::as_f64)
            })
            .unwrap_or(10_000.0);
        Ok(Qwen3Config {
            vocab_size: size(raw.vocab_size, "vocab_size", MAX_VOCAB)?,
            hidden_size: hidden,
            intermediate_size: size(raw.intermediate_size, "intermediate_size", MAX_INTERMEDIATE)?,
            num_hidden_layers: size(raw.num_hidden_layers, "num_hidden_layers", MAX_LAYERS)?,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            head_dim,
            rms_norm_eps: positive(raw.rms_norm_eps.unwrap_or(1e-6), "rms_norm_eps")?,
            rope_theta: positive(theta, "rope_theta")?,
            max_position_embeddings: size(
                raw.max_position_embeddings.or(Some(32_768)),
                "max_position_embeddings",
                MAX_POSITIONS,
            )?,
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            initializer_range: positive(
                raw.initializer_range.unwrap_or(0.02),
                "initializer_range",
            )?,
            bos_token_id: token_id(raw.bos_token_id.as_ref()),
            eos_token_id: token_id(raw.eos_token_id.as_ref()),
        })
    }

    /// The `config.json` that transformers loads as this model (`Qwen3ForCausalLM`,
    /// float32): the fields above, plus the ones transformers expects of a qwen3 config,
    /// with the rotary base written both as `rope_theta` (transformers 4) and
    /// `rope_parameters` (transformers 5). Pretty-printed, keys sorted (deterministic bytes).
    pub fn to_json(&self) -> String {
        let v = json!({
            "architectures": ["Qwen3ForCausalLM"],
            "attention_bias": false,
            "attention_dropout": 0.0,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "hidden_size": self.hidden_size,
            "initializer_range": self.initializer_range,
            "intermediate_size": self.intermediate_size,
            "max_position_embeddings": self.max_position_embeddings,
            "max_window_layers": self.num_hidden_layers,
            "model_type": "qwen3",
            "num_attention_heads": self.num_attention_heads,
            "num_hidden_layers": self.num_hidden_layers,
            "num_key_value_heads": self.num_key_value_heads,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": {"rope_theta": self.rope_theta, "rope_type": "default"},
            "rope_theta": self.rope_theta,
            "sliding_window": null,
            "tie_word_embeddings": self.tie_word_embeddings,
            "torch_dtype": "float32",
            "use_cache": true,
            "use_sliding_window": false,
            "vocab_size": self.vocab_size,
        });
        let mut s = serde_json::to_string_pretty(&v).expect("a JSON value serialises");
        s.push('\n');
        s
    }

    /// The parameters, with Hugging Face names and `[out, in]` shapes
    /// ([`ModelSpec::from_hf_config`] of [`Qwen3Config::to_json`]).
    pub fn spec(&self) -> ModelSpec {
        ModelSpec::from_hf_config(&self.to_json()).expect("a checked qwen3 config has a spec")
    }

    /// Query heads per key/value head.
    pub fn group(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Value {
        json!({
            "model_type": "qwen3", "vocab_size": 512, "hidden_size": 64,
            "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6,
            "rope_theta": 1e6, "max_position_embeddings": 128, "tie_word_embeddings": true
        })
    }

    fn with(
        f: impl FnOnce(&mut serde_json::Map<String, Value>),
    ) -> Result<Qwen3Config, ConfigError> {
        let mut v = base();
        f(v.as_object_mut().unwrap());
        Qwen3Config::from_json(&v.to_string())
    }

    #[test]
    fn round_trips_through_its_json() {
        let c = with(|_| {}).unwrap();
        assert_eq!(c.head_dim, 16);
        assert_eq!(c.rope_theta, 1e6);
        assert_eq!(c.group(), 2);
        assert_eq!(Qwen3Config::from_json(&c.to_json()).unwrap(), c);
        let spec = c.spec();
        assert_eq!(spec.params["model.layers.1.self_attn.q_norm.weight"], [16]);
        assert_eq!(
            spec.params["model.layers.0.self_attn.k_proj.weight"],
            [32, 64]
        );
        assert!(!spec.params.contains_key("lm_head.weight"));
    }

    #[test]
    fn reads_transformers_5_rope_parameters_and_defaults() {
        let c = with(|m| {
            m.remove("rope_theta");
            m.remove("head_dim");
            m.remove("num_key_value_heads");
            m.insert(
                "rope_parameters".into(),
                json!({"rope_type": "default", "rope_theta": 5e5}),
            );
            m.insert("eos_token_id".into(), json!([7, 8]));
        })
        .unwrap();
        assert_eq!(
            (c.rope_theta, c.head_dim, c.num_key_value_heads),
            (5e5, 16, 4)
        );
        assert_eq!(c.eos_token_id, Some(7));
    }

    #[test]
    fn refuses_what_it_cannot_run() {
        let e = |f: fn(&mut serde_json::Map<String, Value>)| with(f).unwrap_err();
        assert_eq!(
            e(|m| {
                m.insert("model_type".into(), json!("llama"));
            }),
            ConfigError::ModelType("llama".into())
        );
        assert_eq!(
            e(|m| {
                m.remove("vocab_size");
            }),
            ConfigError::Missing("vocab_size")
        );
        assert!(matches!(
            e(|m| {
                m.insert("vocab_size".into(), json!(1usize << 30));
            }),
            ConfigError::OutOfRange {
                field: "vocab_size",
                ..
            }
        ));
        assert!(matches!(
            e(|m| {
                m.insert("head_dim".into(), json!(15));
            }),
            ConfigError::OutOfRange {
                field: "head_dim",
                ..
            }
        ));
        assert_eq!(
            e(|m| {
                m.insert("num_key_value_heads".into(), json!(3));
            }),
            ConfigError::HeadsNotGrouped {
                heads: 4,
                kv_heads: 3
            }
        );
        assert!(matches!(
            e(|m| {
                m.insert("rms_norm_eps".into(), json!(-1.0));
            }),
            ConfigError::NotPositive { .. }
        ));
        for (k, v) in [
            ("attention_bias", json!(true)),
            ("use_sliding_window", json!(true)),
            ("hidden_act", json!("gelu")),
            (
                "layer_types",
                json!(["full_attention", "sliding_attention"]),
            ),
            ("rope_scaling", json!({"rope_type": "yarn", "factor": 4.0})),
        ] {
            let r = with(|m| {
                m.insert(k.into(), v);
            });
            assert!(matches!(r, Err(ConfigError::Unsupported(_))), "{k}: {r:?}");
        }
        assert!(matches!(
            Qwen3Config::from_json("{"),
            Err(ConfigError::Json(_))
        ));
    }
}
