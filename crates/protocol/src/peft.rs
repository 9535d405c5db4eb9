//! PEFT's `adapter_config.json` for LoRA adapters (Hugging Face PEFT's `LoraConfig`, as
//! `save_pretrained` writes it): [`AdapterConfig::from_json`] reads one into the LoRA
//! configuration hanzod checks and trains (rank, alpha, target modules, dropout), refusing
//! every setting that changes the adapter's tensors or its math; [`adapter_config_json`]
//! writes one that PEFT loads (`LoraConfig.from_pretrained`, `PeftModel.from_pretrained`).
//!
//! hanzod's LoRA is plain LoRA (E. Hu et al., ICLR 2022) on whole modules:
//! `ΔW = (lora_alpha / r) · B · A` on each linear layer named by `target_modules`. So
//! `peft_type` must be `"LORA"`, `bias` `"none"`, `target_modules` a list (PEFT also takes
//! a regular expression string, which is refused: the module list must be explicit), and
//! `use_dora`, `use_rslora` (scale `alpha / √r`), `fan_in_fan_out`, `lora_bias`, per-module
//! ranks or alphas (`rank_pattern`, `alpha_pattern`), layer selections
//! (`layers_to_transform`, `layer_replication`), excluded modules, `modules_to_save`,
//! `target_parameters` and `trainable_token_indices` must be absent or off. Fields that
//! only describe initialisation or the base model (`init_lora_weights`, `loftq_config`,
//! `task_type`, `revision`, `peft_version`, …) are accepted and ignored, as are fields
//! newer PEFT versions add.
//!
//! Input is bounded: [`MAX_ADAPTER_CONFIG_BYTES`] of text, [`MAX_LORA_TARGETS`] target
//! modules of at most [`MAX_TARGET_BYTES`] bytes each; strings quoted in errors are cut to
//! [`QUOTE_CHARS`] characters.

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use crate::convert::MAX_LORA_TARGETS;

/// Largest `adapter_config.json` read, bytes (PEFT writes about 1.1 KiB).
pub const MAX_ADAPTER_CONFIG_BYTES: u64 = 64 * 1024;

/// Longest target module name accepted, bytes (as a job spec's LoRA targets).
pub const MAX_TARGET_BYTES: usize = 64;

/// Characters of an untrusted string quoted in an error, at most.
pub const QUOTE_CHARS: usize = 80;

/// The LoRA configuration of a PEFT adapter, as hanzod uses it.
#[derive(Debug, Clone, PartialEq)]
pub struct AdapterConfig {
    /// The rank `r`, ≥ 1.
    pub rank: u32,
    /// `lora_alpha`, finite and > 0: the update is scaled by `alpha / rank`.
    pub alpha: f64,
    /// PEFT `target_modules`: module names (`q_proj`) or full module paths, 1 to
    /// [`MAX_LORA_TARGETS`] of them, sorted, without duplicates.
    pub target_modules: Vec<String>,
    /// `lora_dropout`, in `[0, 1)` (hanzod trains with 0; other values are read so that
    /// adapters trained elsewhere can be inspected).
    pub dropout: f64,
    /// `base_model_name_or_path`: the model the adapter was trained on, when recorded.
    pub base_model_name_or_path: Option<String>,
}

/// Why an `adapter_config.json` was refused. Quoted strings are cut to [`QUOTE_CHARS`]
/// characters.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AdapterConfigError {
    /// The text is longer than [`MAX_ADAPTER_CONFIG_BYTES`].
    #[error(
        "adapter_config.json is {bytes} bytes, above the {MAX_ADAPTER_CONFIG_BYTES}-byte bound"
    )]
    TooLarge {
        /// Its size, bytes.
        bytes: u64,
    },
    /// Not JSON, or a field of the wrong type (serde's message, cut).
    #[error("adapter_config.json: {0}")]
    Json(String),
    /// `peft_type` is absent or not `"LORA"`.
    #[error("peft_type is {found}, not \"LORA\": only LoRA adapters are supported")]
    NotLora {
        /// What was found (quoted), or `absent`.
        found: String,
    },
    /// `target_modules` is a string: PEFT matches it as a regular expression.
    #[error(
        "target_modules is the regular expression {pattern:?}: list the modules instead \
         (e.g. [\"q_proj\", \"v_proj\"]), hanzod does not match patterns"
    )]
    TargetPattern {
        /// The pattern (cut).
        pattern: String,
    },
    /// `target_modules` is absent, null or empty (PEFT would pick defaults by model type).
    #[error("target_modules is absent or empty: list the adapted modules")]
    NoTargets,
    /// More than [`MAX_LORA_TARGETS`] target modules.
    #[error("target_modules lists {count} modules, more than {MAX_LORA_TARGETS}")]
    TooManyTargets {
        /// How many.
        count: usize,
    },
    /// A target module name that is empty, too long or not printable.
    #[error(
        "target module {name:?} is empty, longer than {MAX_TARGET_BYTES} bytes or has \
         control characters"
    )]
    BadTarget {
        /// The name (cut).
        name: String,
    },
    /// `r` is 0 or above `u32::MAX`.
    #[error("r = {0} is not a rank from 1 to {max}", max = u32::MAX)]
    Rank(u64),
    /// `lora_alpha` is not finite and positive.
    #[error("lora_alpha = {0} is not a finite number above 0")]
    Alpha(f64),
    /// `lora_dropout` is not in `[0, 1)`.
    #[error("lora_dropout = {0} is not in [0, 1)")]
    Dropout(f64),
    /// `bias` is not `"none"` (PEFT would train biases too).
    #[error("bias is {found}, not \"none\": adapters that train biases are not supported")]
    Bias {
        /// What was found (quoted).
        found: String,
    },
    /// A setting that changes the adapter's tensors or math is on.
    #[error("{field} = {value} is not supported: hanzod's LoRA is ΔW = (lora_alpha / r) · B · A on whole modules ({why})")]
    Unsupported {
        /// The field.
        field: &'static str,
        /// Its value (JSON, cut).
        value: String,
        /// What it would change.
        why: &'static str,
    },
}

/// `s` cut to [`QUOTE_CHARS`] characters (with `…` when cut).
fn cut(s: &str) -> String {
    crate::status::quote_bounded(s, QUOTE_CHARS)
}

/// The fields read; every other field is ignored.
#[derive(Deserialize)]
struct Raw {
    #[serde(default = "default_rank")]
    r: u64,
    #[serde(default = "default_alpha")]
    lora_alpha: f64,
    #[serde(default)]
    lora_dropout: f64,
    #[serde(default)]
    target_modules: Option<Value>,
    #[serde(default)]
    bias: Option<Value>,
    #[serde(default)]
    base_model_name_or_path: Option<String>,
}

/// PEFT's default `r`.
fn default_rank() -> u64 {
    8
}

/// PEFT's default `lora_alpha`.
fn default_alpha() -> f64 {
    8.0
}

/// Settings that must be absent, `null`, `false`, `{}` or `[]`, and what they would change.
const MUST_BE_OFF: [(&str, &str); 19] = [
    ("use_dora", "DoRA adds a magnitude vector per module"),
    ("use_rslora", "rsLoRA scales by lora_alpha / √r"),
    ("fan_in_fan_out", "the base stores weights transposed"),
    ("lora_bias", "lora_B gets a bias"),
    ("rank_pattern", "some modules get another rank"),
    ("alpha_pattern", "some modules get another alpha"),
    ("layers_to_transform", "only some layers are adapted"),
    ("layer_replication", "layers are duplicated"),
    ("exclude_modules", "some matching modules are skipped"),
    ("modules_to_save", "whole modules are trained and saved"),
    ("target_parameters", "parameters, not modules, are adapted"),
    ("trainable_token_indices", "embedding rows are trained"),
    ("use_qalora", "QA-LoRA pools the input"),
    (
        "alora_invocation_tokens",
        "aLoRA adapts only after its invocation tokens",
    ),
    ("use_bdlora", "BD-LoRA shares block-diagonal factors"),
    ("arrow_config", "Arrow routes between several adapters"),
    ("monteclora_config", "MonteCLoRA samples the factors"),
    ("kasa_config", "KaSA changes the base weights"),
    ("velora_config", "VeLoRA compresses the activations"),
];

/// Whether `v` is `null`, `false`, `{}` or `[]` (a setting left off).
fn is_off(v: &Value) -> bool {
    match v {
        Value::Null | Value::Bool(false) => true,
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

impl AdapterConfig {
    /// Reads an `adapter_config.json` text ([module docs](self)). Absent `r`,
    /// `lora_alpha` and `lora_dropout` take PEFT's defaults (8, 8, 0); `target_modules`
    /// is sorted and deduplicated.
    ///
    /// Errors: [`AdapterConfigError`], one variant per refused setting; the size bound is
    /// checked before parsing.
    pub fn from_json(text: &str) -> Result<AdapterConfig, AdapterConfigError> {
        if text.len() as u64 > MAX_ADAPTER_CONFIG_BYTES {
            return Err(AdapterConfigError::TooLarge {
                bytes: text.len() as u64,
            });
        }
        let json: serde_json::Map<String, Value> = serde_json::from_str(text)
            .map_err(|e| AdapterConfigError::Json(cut(&e.to_string())))?;
        match json.get("peft_type") {
            Some(Value::String(s)) if s == "LORA" => {}
            Some(other) => {
                return Err(AdapterConfigError::NotLora {
                    found: cut(&other.to_string()),
                })
            }
            None => {
                return Err(AdapterConfigError::NotLora {
                    found: "absent".into(),
                })
            }
        }
        for (field, why) in MUST_BE_OFF {
            if let Some(v) = json.get(field).filter(|v| !is_off(v)) {
                return Err(AdapterConfigError::Unsupported {
                    field,
                    value: cut(&v.to_string()),
                    why,
                });
            }
        }
        // `init_lora_weights` other than true/false (PiSSA, OLoRA, CorDA, LoftQ, …)
        // rewrites the base weights when the adapter is created.
        if let Some(v) = json
            .get("init_lora_weights")
            .filter(|v| !matches!(v, Value::Bool(_) | Value::Null))
        {
            return Err(AdapterConfigError::Unsupported {
                field: "init_lora_weights",
                value: cut(&v.to_string()),
                why: "that initialisation changes the base weights",
            });
        }
        let raw: Raw = serde_json::from_value(Value::Object(json))
            .map_err(|e| AdapterConfigError::Json(cut(&e.to_string())))?;
        match &raw.bias {
            None => {}
            Some(Value::String(s)) if s == "none" => {}
            Some(other) => {
                return Err(AdapterConfigError::Bias {
                    found: cut(&other.to_string()),
                })
            }
        }
        let rank = u32::try_from(raw.r)
            .ok()
            .filter(|&r| r >= 1)
            .ok_or(AdapterConfigError::Rank(raw.r))?;
        if !(raw.lora_alpha.is_finite() && raw.lora_alpha > 0.0) {
            return Err(AdapterConfigError::Alpha(raw.lora_alpha));
        }
        if !(0.0..1.0).contains(&raw.lora_dropout) {
            return Err(AdapterConfigError::Dropout(raw.lora_dropout));
        }
        let target_modules = targets(raw.target_modules)?;
        Ok(AdapterConfig {
            rank,
            alpha: raw.lora_alpha,
            target_modules,
            dropout: raw.lora_dropout,
            base_model_name_or_path: raw.base_model_name_or_path,
        })
    }

    /// The job spec's LoRA adapter of this configuration (`mode = "lora"`).
    pub fn lora_spec(&self) -> hanzod_actors::job::LoraSpec {
        hanzod_actors::job::LoraSpec {
            rank: self.rank,
            alpha: self.alpha,
            target_modules: self.target_modules.clone(),
            dropout: self.dropout,
        }
    }

    /// This configuration as PEFT's `adapter_config.json` ([`adapter_config_json`]), which
    /// always writes `lora_dropout` 0 (hanzod trains without dropout): a configuration with
    /// another dropout reads back with 0.
    pub fn to_json(&self) -> String {
        adapter_config_json(
            self.rank,
            self.alpha,
            &self.target_modules,
            self.base_model_name_or_path.as_deref(),
        )
    }
}

/// `target_modules`: a list of bounded names, sorted and deduplicated.
fn targets(v: Option<Value>) -> Result<Vec<String>, AdapterConfigError> {
    let list = match v {
        None | Some(Value::Null) => return Err(AdapterConfigError::NoTargets),
        Some(Value::String(pattern)) => {
            return Err(AdapterConfigError::TargetPattern {
                pattern: cut(&pattern),
            })
        }
        Some(Value::Array(a)) => a,
        Some(other) => {
            return Err(AdapterConfigError::Json(cut(&format!(
                "target_modules is {other}, not a list of module names"
            ))))
        }
    };
    if list.len() > MAX_LORA_TARGETS {
        return Err(AdapterConfigError::TooManyTargets { count: list.len() });
    }
    let mut names = Vec::with_capacity(list.len());
    for item in list {
        let Value::String(name) = item else {
            return Err(AdapterConfigError::BadTarget {
                name: cut(&item.to_string()),
            });
        };
        if name.is_empty() || name.len() > MAX_TARGET_BYTES || name.chars().any(char::is_control) {
            return Err(AdapterConfigError::BadTarget { name: cut(&name) });
        }
        names.push(name);
    }
    names.sort();
    names.dedup();
    if names.is_empty() {
        return Err(AdapterConfigError::NoTargets);
    }
    Ok(names)
}

/// What [`adapter_config_json`] writes, in PEFT's field names (serde keeps this order;
/// PEFT's own files are sorted by name, which is the order below).
#[derive(Serialize)]
struct Written<'a> {
    base_model_name_or_path: Option<&'a str>,
    bias: &'static str,
    fan_in_fan_out: bool,
    inference_mode: bool,
    init_lora_weights: bool,
    lora_alpha: f64,
    lora_dropout: f64,
    modules_to_save: Option<()>,
    peft_type: &'static str,
    r: u32,
    revision: Option<()>,
    target_modules: Vec<&'a str>,
    task_type: &'static str,
    use_dora: bool,
    use_rslora: bool,
}

/// A PEFT `adapter_config.json` (pretty-printed, keys sorted as PEFT writes them) for a
/// LoRA adapter of rank `rank` and `lora_alpha = alpha` on `target_modules` (written
/// sorted and deduplicated) of `base_model_name_or_path` (`null` when `None`):
/// `peft_type` `LORA`, `task_type` `CAUSAL_LM`, `lora_dropout` 0.0, `bias` `none`,
/// `fan_in_fan_out`, `use_rslora` and `use_dora` false, `inference_mode` and
/// `init_lora_weights` true, `modules_to_save` and `revision` null. PEFT's
/// `LoraConfig.from_pretrained` and `PeftModel.from_pretrained` load it, and
/// [`AdapterConfig::from_json`] reads it back unchanged.
///
/// The arguments are not checked (the caller's spec was); a non-finite `alpha` is written
/// as `null`, which [`AdapterConfig::from_json`] refuses.
pub fn adapter_config_json<S: AsRef<str>>(
    rank: u32,
    alpha: f64,
    target_modules: &[S],
    base_model_name_or_path: Option<&str>,
) -> String {
    let mut targets: Vec<&str> = target_modules.iter().map(AsRef::as_ref).collect();
    targets.sort_unstable();
    targets.dedup();
    let w = Written {
        base_model_name_or_path,
        bias: "none",
        fan_in_fan_out: false,
        inference_mode: true,
        init_lora_weights: true,
        lora_alpha: alpha,
        lora_dropout: 0.0,
        modules_to_save: None,
        peft_type: "LORA",
        r: rank,
        revision: None,
        target_modules: targets,
        task_type: "CAUSAL_LM",
        use_dora: false,
        use_rslora: false,
    };
    let mut text = serde_json::to_string_pretty(&w).expect("plain values serialize");
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// PEFT 0.21.2's `LoraConfig(r=8, lora_alpha=16, target_modules=[…], lora_dropout=0.0,
    /// task_type="CAUSAL_LM").save_pretrained(dir)`, verbatim.
    const PEFT_WRITTEN: &str = r#"{
  "alora_invocation_tokens": null,
  "alpha_pattern": {},
  "arrow_config": null,
  "auto_mapping": null,
  "base_model_name_or_path": "hanzo-gym/qwen3-tiny",
  "bias": "none",
  "corda_config": null,
  "ensure_weight_tying": false,
  "eva_config": null,
  "exclude_modules": null,
  "fan_in_fan_out": false,
  "inference_mode": false,
  "init_lora_weights": true,
  "kasa_config": null,
  "layer_replication": null,
  "layers_pattern": null,
  "layers_to_transform": null,
  "loftq_config": {},
  "lora_alpha": 16,
  "lora_bias": false,
  "lora_dropout": 0.0,
  "lora_ga_config": null,
  "megatron_config": null,
  "megatron_core": "megatron.core",
  "modules_to_save": null,
  "monteclora_config": null,
  "peft_type": "LORA",
  "peft_version": "0.21.2",
  "qalora_group_size": 16,
  "r": 8,
  "rank_pattern": {},
  "revision": null,
  "target_modules": [
    "q_proj",
    "v_proj",
    "o_proj",
    "k_proj"
  ],
  "target_parameters": null,
  "task_type": "CAUSAL_LM",
  "trainable_token_indices": null,
  "use_bdlora": null,
  "use_dora": false,
  "use_qalora": false,
  "use_rslora": false,
  "velora_config": null
}"#;

    fn with(field: &str, value: &str) -> String {
        let mut v: serde_json::Map<String, Value> = serde_json::from_str(PEFT_WRITTEN).unwrap();
        v.insert(field.into(), serde_json::from_str(value).unwrap());
        Value::Object(v).to_string()
    }

    fn without(field: &str) -> String {
        let mut v: serde_json::Map<String, Value> = serde_json::from_str(PEFT_WRITTEN).unwrap();
        v.remove(field);
        Value::Object(v).to_string()
    }

    #[test]
    fn reads_what_peft_writes() {
        let c = AdapterConfig::from_json(PEFT_WRITTEN).unwrap();
        assert_eq!(
            c,
            AdapterConfig {
                rank: 8,
                alpha: 16.0,
                target_modules: ["k_proj", "o_proj", "q_proj", "v_proj"]
                    .map(String::from)
                    .to_vec(),
                dropout: 0.0,
                base_model_name_or_path: Some("hanzo-gym/qwen3-tiny".into()),
            }
        );
        let spec = c.lora_spec();
        assert_eq!((spec.rank, spec.alpha, spec.dropout), (8, 16.0, 0.0));
        assert_eq!(spec.target_modules, c.target_modules);
    }

    /// The fixture PEFT wrote for the LoRA parity test (crates/train/tests/fixtures).
    #[test]
    fn reads_the_lora_parity_fixture() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../train/tests/fixtures/qwen3/lora/adapter_config.json"
        );
        let Ok(text) = std::fs::read_to_string(path) else {
            panic!("{path} is missing");
        };
        let c = AdapterConfig::from_json(&text).unwrap();
        assert_eq!((c.rank, c.alpha, c.dropout), (4, 8.0, 0.0));
        assert_eq!(c.target_modules, ["down_proj", "q_proj", "v_proj"]);
        assert_eq!(c.base_model_name_or_path, None);
    }

    #[test]
    fn absent_fields_take_peft_defaults() {
        let c = AdapterConfig::from_json(r#"{"peft_type":"LORA","target_modules":["q_proj"]}"#)
            .unwrap();
        assert_eq!((c.rank, c.alpha, c.dropout), (8, 8.0, 0.0));
        assert_eq!(c.base_model_name_or_path, None);
    }

    #[test]
    fn every_refusal_is_its_own_error() {
        use AdapterConfigError as E;
        let err = |t: &str| AdapterConfig::from_json(t).unwrap_err();
        assert!(
            matches!(err(&with("peft_type", "\"IA3\"")), E::NotLora { found } if found == "\"IA3\"")
        );
        assert!(matches!(err(&without("peft_type")), E::NotLora { found } if found == "absent"));
        assert!(matches!(
            err(&with("target_modules", r#"".*(q|v)_proj""#)),
            E::TargetPattern { pattern } if pattern == ".*(q|v)_proj"
        ));
        assert_eq!(err(&with("target_modules", "null")), E::NoTargets);
        assert_eq!(err(&with("target_modules", "[]")), E::NoTargets);
        assert_eq!(err(&without("target_modules")), E::NoTargets);
        assert!(matches!(err(&with("target_modules", "3")), E::Json(_)));
        assert!(matches!(
            err(&with("target_modules", "[3]")),
            E::BadTarget { .. }
        ));
        assert!(matches!(
            err(&with("target_modules", r#"[""]"#)),
            E::BadTarget { .. }
        ));
        let long = format!("[\"{}\"]", "x".repeat(65));
        assert!(
            matches!(err(&with("target_modules", &long)), E::BadTarget { name } if name.chars().count() == QUOTE_CHARS.min(65) )
        );
        let many = format!(
            "[{}]",
            (0..17)
                .map(|i| format!("\"m{i}\""))
                .collect::<Vec<_>>()
                .join(",")
        );
        assert_eq!(
            err(&with("target_modules", &many)),
            E::TooManyTargets { count: 17 }
        );
        assert!(matches!(err(&with("bias", "\"all\"")), E::Bias { found } if found == "\"all\""));
        assert!(matches!(
            err(&with("bias", "\"lora_only\"")),
            E::Bias { .. }
        ));
        assert_eq!(err(&with("r", "0")), E::Rank(0));
        assert_eq!(err(&with("r", "4294967296")), E::Rank(1 << 32));
        assert!(matches!(err(&with("r", "-1")), E::Json(_)));
        assert!(matches!(err(&with("r", "2.5")), E::Json(_)));
        assert_eq!(err(&with("lora_alpha", "0")), E::Alpha(0.0));
        assert_eq!(err(&with("lora_alpha", "-16")), E::Alpha(-16.0));
        assert_eq!(err(&with("lora_dropout", "1.0")), E::Dropout(1.0));
        assert_eq!(err(&with("lora_dropout", "-0.1")), E::Dropout(-0.1));
        for (field, on) in [
            ("use_dora", "true"),
            ("use_rslora", "true"),
            ("fan_in_fan_out", "true"),
            ("lora_bias", "true"),
            ("rank_pattern", r#"{"q_proj": 4}"#),
            ("alpha_pattern", r#"{"q_proj": 4}"#),
            ("layers_to_transform", "[0, 1]"),
            ("modules_to_save", r#"["lm_head"]"#),
            ("exclude_modules", r#"["k_proj"]"#),
            ("target_parameters", r#"["experts.gate_up_proj"]"#),
        ] {
            match err(&with(field, on)) {
                E::Unsupported { field: f, .. } => assert_eq!(f, field),
                other => panic!("{field}: {other:?}"),
            }
        }
        // Off in any of PEFT's spellings is fine.
        for (field, off) in [
            ("use_dora", "null"),
            ("modules_to_save", "[]"),
            ("rank_pattern", "{}"),
        ] {
            AdapterConfig::from_json(&with(field, off)).unwrap();
        }
        AdapterConfig::from_json(&without("use_dora")).unwrap();
        assert!(matches!(err("{"), E::Json(_)));
        assert!(matches!(err("[1]"), E::Json(_)));
    }

    #[test]
    fn input_is_bounded_and_quotes_are_cut() {
        let big = format!(
            "{{\"peft_type\":\"LORA\",\"pad\":\"{}\"}}",
            "x".repeat(MAX_ADAPTER_CONFIG_BYTES as usize)
        );
        assert_eq!(
            AdapterConfig::from_json(&big).unwrap_err(),
            AdapterConfigError::TooLarge {
                bytes: big.len() as u64
            }
        );
        let e =
            AdapterConfig::from_json(&with("peft_type", &format!("\"{}\"", "y".repeat(10_000))))
                .unwrap_err();
        assert!(e.to_string().len() < 400, "{e}");
        let e = AdapterConfig::from_json(&with("r", &format!("\"{}\"", "z".repeat(10_000))))
            .unwrap_err();
        assert!(matches!(e, AdapterConfigError::Json(_)));
        assert!(e.to_string().len() < 400, "{e}");
    }

    #[test]
    fn writes_what_the_brief_lists() {
        let text = adapter_config_json(
            16,
            32.0,
            &["v_proj", "q_proj", "q_proj"],
            Some("hanzo-gym/qwen3-tiny-job-1-epoch-2"),
        );
        let v: Value = serde_json::from_str(&text).unwrap();
        let want = serde_json::json!({
            "base_model_name_or_path": "hanzo-gym/qwen3-tiny-job-1-epoch-2",
            "bias": "none",
            "fan_in_fan_out": false,
            "inference_mode": true,
            "init_lora_weights": true,
            "lora_alpha": 32.0,
            "lora_dropout": 0.0,
            "modules_to_save": null,
            "peft_type": "LORA",
            "r": 16,
            "revision": null,
            "target_modules": ["q_proj", "v_proj"],
            "task_type": "CAUSAL_LM",
            "use_dora": false,
            "use_rslora": false,
        });
        assert_eq!(v, want);
        // Keys in PEFT's (sorted) order.
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
        let none = adapter_config_json::<String>(1, 1.0, &[], None);
        assert!(none.contains("\"base_model_name_or_path\": null"), "{none}");
    }

    fn arb_config() -> impl Strategy<Value = AdapterConfig> {
        (
            1u32..=u32::MAX,
            prop_oneof![(1u32..1024).prop_map(f64::from), 1e-6f64..1e6],
            proptest::collection::btree_set(
                "[a-z_]{1,12}(\\.[a-z0-9_]{1,12}){0,3}",
                1..=MAX_LORA_TARGETS,
            ),
            proptest::option::of("[A-Za-z0-9_./-]{1,60}"),
        )
            .prop_map(|(rank, alpha, targets, base)| AdapterConfig {
                rank,
                alpha,
                target_modules: targets.into_iter().collect(),
                dropout: 0.0,
                base_model_name_or_path: base,
            })
    }

    proptest! {
        /// parse(write(x)) == x for every configuration the writer can express.
        #[test]
        fn write_then_parse_round_trips(c in arb_config()) {
            let text = c.to_json();
            prop_assert_eq!(AdapterConfig::from_json(&text).unwrap(), c);
        }

        /// Whatever the bytes, the parser returns (never panics), and any error is short.
        #[test]
        fn arbitrary_text_never_panics(text in ".{0,200}") {
            if let Err(e) = AdapterConfig::from_json(&text) {
                prop_assert!(e.to_string().len() < 600);
            }
        }
    }
}
