//! Model descriptions for the delta format check (DESIGN §6): the names and
//! shapes of every parameter of a model, and of the PEFT LoRA adapter tensors its LoRA
//! configuration implies.
//!
//! [`ModelSpec::from_hf_config`] reads a Hugging Face `config.json` of the Llama / Qwen
//! family (`model_type` `llama`, `mistral`, `qwen2`, `qwen3`) and lists the parameters in
//! the Hugging Face naming (`model.embed_tokens.weight`, `model.layers.{i}.self_attn.q_proj.weight`,
//! …). Shapes are `[out, in]` for linear layers, as PyTorch stores them.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;

use ed25519_dalek::VerifyingKey;

use crate::hzdl::{elements, DeltaDtype, DeltaError, DeltaKind, DeltaView, Statement, HEADER_LEN};

/// Why a model description could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The `config.json` text is not valid JSON or lacks a required field.
    #[error("config.json: {0}")]
    Json(#[from] serde_json::Error),
    /// A `model_type` this module does not describe.
    #[error(
        "config.json: model_type {model_type:?} is not supported (llama, mistral, qwen2, qwen3)"
    )]
    UnsupportedModelType {
        /// The `model_type`.
        model_type: String,
    },
    /// A size that is 0.
    #[error("config.json: {field} is 0")]
    Zero {
        /// The field.
        field: &'static str,
    },
    /// More attention heads than a multiple of the key/value heads.
    #[error(
        "config.json: num_attention_heads {heads} is not a multiple of num_key_value_heads \
         {kv_heads}"
    )]
    HeadsNotGrouped {
        /// `num_attention_heads`.
        heads: usize,
        /// `num_key_value_heads`.
        kv_heads: usize,
    },
    /// No `head_dim`, and the hidden size does not divide into the heads.
    #[error(
        "config.json: hidden_size {hidden} is not a multiple of num_attention_heads {heads} \
         and head_dim is absent"
    )]
    NoHeadDim {
        /// `hidden_size`.
        hidden: usize,
        /// `num_attention_heads`.
        heads: usize,
    },
    /// `num_attention_heads × head_dim` does not fit a `usize`.
    #[error("config.json: num_attention_heads × head_dim overflows")]
    HeadsOverflow,
    /// A LoRA rank of 0.
    #[error("LoRA rank must be at least 1")]
    ZeroRank,
    /// A LoRA target module that names no linear layer of the model.
    #[error("LoRA target module {module:?} matches no linear layer of the model")]
    NoLoraTarget {
        /// The module.
        module: String,
    },
}

/// Every linear layer of a Llama / Qwen decoder block, as PEFT `target_modules` names
/// (PEFT's `all-linear` for these models): attention's four projections, then the MLP's
/// three.
pub const LINEAR_MODULES: [&str; 7] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

/// The LoRA configuration a [`ModelSpec`] of kind LoRA was derived from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraConfig {
    /// The adapter rank `r`.
    pub rank: usize,
    /// The PEFT `target_modules` (module names such as `q_proj`, or full module paths).
    pub target_modules: Vec<String>,
}

/// Every tensor a delta for one model may (and, DESIGN §6, must) contain: name → shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSpec {
    /// A human-readable model name (for messages).
    pub name: String,
    /// Tensor name → shape (row-major, element counts).
    pub params: BTreeMap<String, Vec<usize>>,
    /// `Some` when this spec lists the LoRA adapter tensors (deltas of kind
    /// [`DeltaKind::Lora`]), `None` for full-parameter deltas.
    pub lora: Option<LoraConfig>,
}

/// The fields of a Hugging Face `config.json` this module reads.
#[derive(Debug, Clone, Deserialize)]
struct HfConfig {
    model_type: String,
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    #[serde(default)]
    num_key_value_heads: Option<usize>,
    #[serde(default)]
    head_dim: Option<usize>,
    intermediate_size: usize,
    vocab_size: usize,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default)]
    attention_bias: Option<bool>,
    #[serde(default)]
    mlp_bias: bool,
}

/// Bytes of safetensors JSON header one tensor entry can take at most, beyond its name and
/// its dimensions: `"":{"dtype":"BF16","shape":[],"data_offsets":[,]},` plus two 20-digit
/// offsets, with slack.
const ENTRY_OVERHEAD: u64 = 112;
/// Bytes per dimension in the JSON header at most: 20 digits and a comma.
const BYTES_PER_DIM: u64 = 21;

impl ModelSpec {
    /// Builds the full-parameter spec from a Hugging Face `config.json` of the Llama / Qwen
    /// family. `head_dim` defaults to `hidden_size / num_attention_heads`,
    /// `num_key_value_heads` to `num_attention_heads`; `lm_head.weight [vocab, hidden]` is
    /// listed unless `tie_word_embeddings`; Qwen3 adds `q_norm`/`k_norm` `[head_dim]` per
    /// layer; Qwen2 (and `attention_bias: true`) adds q/k/v (and for Llama o) biases.
    pub fn from_hf_config(json: &str) -> Result<ModelSpec, ModelError> {
        let c: HfConfig = serde_json::from_str(json)?;
        let (qk_norm, qkv_bias, o_bias) = match c.model_type.as_str() {
            "llama" | "mistral" => {
                let b = c.attention_bias.unwrap_or(false);
                (false, b, b)
            }
            "qwen2" => (false, c.attention_bias.unwrap_or(true), false),
            "qwen3" => {
                let b = c.attention_bias.unwrap_or(false);
                (true, b, b)
            }
            other => {
                return Err(ModelError::UnsupportedModelType {
                    model_type: other.to_string(),
                })
            }
        };
        let nonzero = |v: usize, field: &'static str| {
            if v == 0 {
                Err(ModelError::Zero { field })
            } else {
                Ok(v)
            }
        };
        let hidden = nonzero(c.hidden_size, "hidden_size")?;
        let heads = nonzero(c.num_attention_heads, "num_attention_heads")?;
        let kv_heads = nonzero(
            c.num_key_value_heads.unwrap_or(heads),
            "num_key_value_heads",
        )?;
        if heads % kv_heads != 0 {
            return Err(ModelError::HeadsNotGrouped { heads, kv_heads });
        }
        let head_dim = match c.head_dim {
            Some(d) => nonzero(d, "head_dim")?,
            None if hidden % heads == 0 => hidden / heads,
            None => return Err(ModelError::NoHeadDim { hidden, heads }),
        };
        let inter = nonzero(c.intermediate_size, "intermediate_size")?;
        let vocab = nonzero(c.vocab_size, "vocab_size")?;
        let layers = c.num_hidden_layers;
        let q_out = heads
            .checked_mul(head_dim)
            .ok_or(ModelError::HeadsOverflow)?;
        let kv_out = kv_heads * head_dim;

        let mut p = BTreeMap::new();
        p.insert("model.embed_tokens.weight".to_string(), vec![vocab, hidden]);
        for i in 0..layers {
            let l = format!("model.layers.{i}");
            let a = format!("{l}.self_attn");
            p.insert(format!("{a}.q_proj.weight"), vec![q_out, hidden]);
            p.insert(format!("{a}.k_proj.weight"), vec![kv_out, hidden]);
            p.insert(format!("{a}.v_proj.weight"), vec![kv_out, hidden]);
            p.insert(format!("{a}.o_proj.weight"), vec![hidden, q_out]);
            if qkv_bias {
                p.insert(format!("{a}.q_proj.bias"), vec![q_out]);
                p.insert(format!("{a}.k_proj.bias"), vec![kv_out]);
                p.insert(format!("{a}.v_proj.bias"), vec![kv_out]);
            }
            if o_bias {
                p.insert(format!("{a}.o_proj.bias"), vec![hidden]);
            }
            if qk_norm {
                p.insert(format!("{a}.q_norm.weight"), vec![head_dim]);
                p.insert(format!("{a}.k_norm.weight"), vec![head_dim]);
            }
            let m = format!("{l}.mlp");
            p.insert(format!("{m}.gate_proj.weight"), vec![inter, hidden]);
            p.insert(format!("{m}.up_proj.weight"), vec![inter, hidden]);
            p.insert(format!("{m}.down_proj.weight"), vec![hidden, inter]);
            if c.mlp_bias {
                p.insert(format!("{m}.gate_proj.bias"), vec![inter]);
                p.insert(format!("{m}.up_proj.bias"), vec![inter]);
                p.insert(format!("{m}.down_proj.bias"), vec![hidden]);
            }
            p.insert(format!("{l}.input_layernorm.weight"), vec![hidden]);
            p.insert(format!("{l}.post_attention_layernorm.weight"), vec![hidden]);
        }
        p.insert("model.norm.weight".to_string(), vec![hidden]);
        if !c.tie_word_embeddings {
            p.insert("lm_head.weight".to_string(), vec![vocab, hidden]);
        }
        Ok(ModelSpec {
            name: c.model_type,
            params: p,
            lora: None,
        })
    }

    /// The delta kind this spec describes: LoRA when built by [`ModelSpec::lora_spec`].
    pub fn kind(&self) -> DeltaKind {
        if self.lora.is_some() {
            DeltaKind::Lora
        } else {
            DeltaKind::Full
        }
    }

    /// Total number of scalar parameters (elements), saturating at `u64::MAX`.
    pub fn param_count(&self) -> u64 {
        self.params
            .values()
            .map(|s| elements(s))
            .fold(0u64, u64::saturating_add)
    }

    /// Bytes of tensor data in a delta of this model stored as `dtype` (saturating).
    pub fn data_bytes(&self, dtype: DeltaDtype) -> u64 {
        self.param_count().saturating_mul(dtype.size() as u64)
    }

    /// An upper bound, in bytes, on the safetensors JSON header (including its 8-byte length
    /// prefix and the padding to 8 bytes) of a delta listing every tensor of this spec.
    pub fn safetensors_header_bound(&self) -> u64 {
        let entries = self
            .params
            .iter()
            .map(|(n, s)| {
                // Names are escaped by JSON at most 6× (`\u00XX`); ours are ASCII.
                (n.len() as u64)
                    .saturating_mul(6)
                    .saturating_add(ENTRY_OVERHEAD)
                    .saturating_add(BYTES_PER_DIM.saturating_mul(s.len() as u64))
            })
            .fold(0u64, u64::saturating_add);
        // Length prefix, braces, padding to 8, and a small `__metadata__` allowance.
        entries.saturating_add(8 + 2 + 7 + 256)
    }

    /// The largest well-formed delta of this model stored as `dtype`, in bytes: the 24-byte
    /// header, the safetensors header bound and the data bytes (DESIGN §6: "sizes are
    /// bounded before anything is allocated"). Uploads larger than this are refused unread.
    pub fn max_delta_bytes(&self, dtype: DeltaDtype) -> u64 {
        (HEADER_LEN as u64)
            .saturating_add(self.safetensors_header_bound())
            .saturating_add(self.data_bytes(dtype))
    }

    /// The PEFT LoRA adapter spec for `rank` and `target_modules` (DESIGN §6): for each
    /// linear layer (a 2-D `….weight` other than the token embedding) whose module path
    /// equals a target or ends with `.{target}`, `base_model.model.{module}.lora_A.weight
    /// [r, in]` and `base_model.model.{module}.lora_B.weight [out, r]`. Each target must
    /// match at least one layer.
    pub fn lora_spec(&self, rank: usize, target_modules: &[&str]) -> Result<ModelSpec, ModelError> {
        if rank == 0 {
            return Err(ModelError::ZeroRank);
        }
        let mut p = BTreeMap::new();
        let mut matched = BTreeSet::new();
        for (name, shape) in &self.params {
            let Some(module) = name.strip_suffix(".weight") else {
                continue;
            };
            if shape.len() != 2 || module.ends_with("embed_tokens") {
                continue;
            }
            let hit = target_modules
                .iter()
                .filter(|t| module == **t || module.ends_with(&format!(".{t}")))
                .collect::<Vec<_>>();
            if hit.is_empty() {
                continue;
            }
            matched.extend(hit.into_iter().copied());
            let (out, inp) = (shape[0], shape[1]);
            p.insert(
                format!("base_model.model.{module}.lora_A.weight"),
                vec![rank, inp],
            );
            p.insert(
                format!("base_model.model.{module}.lora_B.weight"),
                vec![out, rank],
            );
        }
        if let Some(t) = target_modules.iter().find(|t| !matched.contains(**t)) {
            return Err(ModelError::NoLoraTarget {
                module: (*t).to_string(),
            });
        }
        Ok(ModelSpec {
            name: format!("{} LoRA r={rank}", self.name),
            params: p,
            lora: Some(LoraConfig {
                rank,
                target_modules: target_modules.iter().map(|t| t.to_string()).collect(),
            }),
        })
    }
}

/// The DESIGN §6 format check of a parsed delta against the job's model: the header kind
/// is the spec's ([`DeltaKind::Lora`] for a spec from [`ModelSpec::lora_spec`]), every
/// tensor name belongs to the spec, every shape matches, every spec tensor is present
/// (full deltas cover every parameter, LoRA deltas exactly the adapter tensors), and no
/// value is NaN or Inf. (Dtype against header and offsets are checked by
/// [`DeltaView::parse`].) [`check_layout`] then [`DeltaView::check_finite`]; an intake
/// that also hashes the payload does both in one pass with [`intake`].
pub fn check_against(view: &DeltaView<'_>, spec: &ModelSpec) -> Result<(), DeltaError> {
    check_layout(view, spec)?;
    view.check_finite()
}

/// [`check_against`] without reading a value: kind, names, shapes, nothing missing.
pub fn check_layout(view: &DeltaView<'_>, spec: &ModelSpec) -> Result<(), DeltaError> {
    if view.header.kind != spec.kind() {
        return Err(DeltaError::KindMismatch {
            expected: spec.kind(),
            found: view.header.kind,
        });
    }
    for t in &view.tensors {
        let Some(expected) = spec.params.get(&t.name) else {
            return Err(DeltaError::UnknownTensor {
                tensor: t.name.clone(),
            });
        };
        if *expected != t.shape {
            return Err(DeltaError::WrongShape {
                tensor: t.name.clone(),
                expected: expected.clone(),
                found: t.shape.clone(),
            });
        }
    }
    if view.tensors.len() != spec.params.len() {
        if let Some(name) = spec.params.keys().find(|n| view.tensor(n).is_none()) {
            return Err(DeltaError::MissingTensor {
                tensor: name.clone(),
            });
        }
    }
    Ok(())
}

/// What the one-pass intake of a delta established (see [`intake`]).
#[derive(Debug, Clone)]
pub struct Intake<'a> {
    /// The parsed delta, format-checked against the model.
    pub view: DeltaView<'a>,
    /// SHA-256 of the whole payload ([`payload_hash`](crate::hzdl::payload_hash)).
    pub hash: [u8; 32],
}

impl Intake<'_> {
    /// [`verify_statement`](crate::hzdl::verify_statement) over this delta's hash.
    pub fn verify_statement(
        &self,
        key: &VerifyingKey,
        expected: &Statement,
        signature: &[u8],
    ) -> Result<(), DeltaError> {
        crate::hzdl::verify_statement(key, expected, &self.hash, signature)
    }

    /// [`verify_claimed_statement`](crate::hzdl::verify_claimed_statement) over this delta's hash.
    pub fn verify_claimed_statement(
        &self,
        key: &VerifyingKey,
        expected: &Statement,
        claimed: &Statement,
        signature: &[u8],
    ) -> Result<(), DeltaError> {
        crate::hzdl::verify_claimed_statement(key, expected, claimed, &self.hash, signature)
    }
}

/// The intake of an uploaded delta in one pass over its bytes: [`DeltaView::parse`](crate::hzdl::DeltaView::parse), the
/// names, shapes and kind against `spec` ([`check_layout`]), then the payload hash and the
/// finite check together, block by block ([`DeltaView::hash_and_check_finite`](crate::hzdl::DeltaView::hash_and_check_finite)). Accepts
/// and refuses exactly what [`DeltaView::parse`](crate::hzdl::DeltaView::parse) then [`check_against`] do, with the same
/// errors, and the hash is [`payload_hash`](crate::hzdl::payload_hash)`(bytes)`. Verify the signed statement with
/// [`Intake::verify_statement`].
///
/// A delta refused before its values are read is not hashed; when the hash is needed
/// either way (a caller that reports a hash mismatch or a bad signature before a format
/// error), use [`intake_hashed`].
///
pub fn intake<'a>(bytes: &'a [u8], spec: &ModelSpec) -> Result<Intake<'a>, DeltaError> {
    let view = DeltaView::parse(bytes)?;
    check_layout(&view, spec)?;
    let (hash, finite) = view.hash_and_check_finite(bytes);
    finite?;
    Ok(Intake { view, hash })
}

/// [`intake`], but the hash of `bytes` comes back whatever the verdict: `(hash, the parsed
/// and checked view or the error)`. Still one pass over the bytes for a well-formed delta;
/// a delta refused before its values are read (header, safetensors metadata, names,
/// shapes, kind) is hashed on its own.
pub fn intake_hashed<'a>(
    bytes: &'a [u8],
    spec: &ModelSpec,
) -> ([u8; 32], Result<DeltaView<'a>, DeltaError>) {
    let view = match DeltaView::parse(bytes).and_then(|v| check_layout(&v, spec).map(|()| v)) {
        Ok(v) => v,
        Err(e) => return (crate::hzdl::payload_hash(bytes), Err(e)),
    };
    let (hash, finite) = view.hash_and_check_finite(bytes);
    (hash, finite.map(|()| view))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The published Qwen/Qwen3-0.6B `config.json` (values as released on the Hub).
    pub(crate) const QWEN3_0_6B: &str = include_str!("../../../tests/data/qwen3-0.6b/config.json");

    fn shape<'a>(s: &'a ModelSpec, n: &str) -> &'a [usize] {
        s.params.get(n).unwrap_or_else(|| panic!("missing {n}"))
    }

    #[test]
    fn qwen3_0_6b_shapes_and_count() {
        let s = ModelSpec::from_hf_config(QWEN3_0_6B).unwrap();
        let a = "model.layers.0.self_attn";
        assert_eq!(shape(&s, &format!("{a}.q_proj.weight")), [2048, 1024]);
        assert_eq!(shape(&s, &format!("{a}.k_proj.weight")), [1024, 1024]);
        assert_eq!(shape(&s, &format!("{a}.v_proj.weight")), [1024, 1024]);
        assert_eq!(shape(&s, &format!("{a}.o_proj.weight")), [1024, 2048]);
        assert_eq!(shape(&s, &format!("{a}.q_norm.weight")), [128]);
        assert_eq!(shape(&s, &format!("{a}.k_norm.weight")), [128]);
        let m = "model.layers.27.mlp";
        assert_eq!(shape(&s, &format!("{m}.gate_proj.weight")), [3072, 1024]);
        assert_eq!(shape(&s, &format!("{m}.up_proj.weight")), [3072, 1024]);
        assert_eq!(shape(&s, &format!("{m}.down_proj.weight")), [1024, 3072]);
        assert_eq!(shape(&s, "model.embed_tokens.weight"), [151936, 1024]);
        assert_eq!(shape(&s, "model.norm.weight"), [1024]);
        assert!(!s.params.contains_key("lm_head.weight"), "tied");
        assert!(!s.params.contains_key("model.layers.28.mlp.up_proj.weight"));
        assert!(!s.params.keys().any(|k| k.ends_with(".bias")));

        // Independent formula.
        let (h, l, nh, nkv, hd, i, v) = (1024u64, 28u64, 16u64, 8u64, 128u64, 3072u64, 151936u64);
        let attn = h * nh * hd + 2 * h * nkv * hd + nh * hd * h;
        let mlp = 3 * h * i;
        let norms = 2 * h + 2 * hd;
        let total = v * h + l * (attn + mlp + norms) + h;
        assert_eq!(s.param_count(), total);
        // ≈ 0.6 B as published (596 M with the tied embedding counted once).
        assert!((590_000_000..600_000_000).contains(&total), "{total}");
        assert_eq!(s.params.len(), 1 + 28 * 11 + 1);
        assert_eq!(s.data_bytes(DeltaDtype::Bf16), 2 * total);
        assert!(s.max_delta_bytes(DeltaDtype::Bf16) > 24 + 2 * total);
        assert!(s.max_delta_bytes(DeltaDtype::Bf16) < 24 + 2 * total + 1_000_000);
    }

    #[test]
    fn untied_llama_has_lm_head_and_no_qk_norm() {
        let j = r#"{"model_type":"llama","hidden_size":64,"num_hidden_layers":2,
            "num_attention_heads":4,"num_key_value_heads":2,"intermediate_size":128,
            "vocab_size":100,"tie_word_embeddings":false}"#;
        let s = ModelSpec::from_hf_config(j).unwrap();
        assert_eq!(shape(&s, "lm_head.weight"), [100, 64]);
        assert_eq!(
            shape(&s, "model.layers.1.self_attn.k_proj.weight"),
            [32, 64]
        );
        assert!(!s.params.keys().any(|k| k.contains("q_norm")));
        assert_eq!(s.params.len(), 1 + 2 * 9 + 1 + 1);
    }

    #[test]
    fn bad_configs() {
        assert!(matches!(
            ModelSpec::from_hf_config(&QWEN3_0_6B.replace("\"qwen3\"", "\"gpt2\"")),
            Err(ModelError::UnsupportedModelType { .. })
        ));
        assert!(matches!(
            ModelSpec::from_hf_config(&QWEN3_0_6B.replace("\"hidden_size\": 1024", "\"x\": 1")),
            Err(ModelError::Json(_))
        ));
        assert!(matches!(
            ModelSpec::from_hf_config(
                &QWEN3_0_6B.replace("\"num_key_value_heads\": 8", "\"num_key_value_heads\": 3")
            ),
            Err(ModelError::HeadsNotGrouped {
                heads: 16,
                kv_heads: 3
            })
        ));
    }

    #[test]
    fn qwen3_lora_spec() {
        let s = ModelSpec::from_hf_config(QWEN3_0_6B).unwrap();
        let l = s.lora_spec(16, &["q_proj", "v_proj", "down_proj"]).unwrap();
        assert_eq!(l.kind(), DeltaKind::Lora);
        assert_eq!(l.params.len(), 28 * 3 * 2);
        let p = "base_model.model.model.layers.3";
        assert_eq!(
            shape(&l, &format!("{p}.self_attn.q_proj.lora_A.weight")),
            [16, 1024]
        );
        assert_eq!(
            shape(&l, &format!("{p}.self_attn.q_proj.lora_B.weight")),
            [2048, 16]
        );
        assert_eq!(
            shape(&l, &format!("{p}.self_attn.v_proj.lora_B.weight")),
            [1024, 16]
        );
        assert_eq!(
            shape(&l, &format!("{p}.mlp.down_proj.lora_A.weight")),
            [16, 3072]
        );
        assert_eq!(
            shape(&l, &format!("{p}.mlp.down_proj.lora_B.weight")),
            [1024, 16]
        );
        assert!(matches!(
            s.lora_spec(0, &["q_proj"]),
            Err(ModelError::ZeroRank)
        ));
        assert!(matches!(
            s.lora_spec(8, &["qproj"]),
            Err(ModelError::NoLoraTarget { module }) if module == "qproj"
        ));
        assert!(matches!(
            s.lora_spec(8, &["embed_tokens"]),
            Err(ModelError::NoLoraTarget { module }) if module == "embed_tokens"
        ));
    }
}
