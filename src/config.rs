//! Configuration: `config/default.toml` (embedded), overridden by a TOML file, overridden
//! by the environment. One serde tree; unknown keys are errors.
//!
//! Environment variables (the names of the paper's compose file, §9.1):
//!
//! | variable | key |
//! |---|---|
//! | `HANZO_CHAIN_ID` | `chain.chain_id` |
//! | `HANZO_LOG` | `log.filter` |
//! | `HANZO_LOG_FORMAT` | `log.format` |
//!
//! (`HANZO_RPC`, `IPFS_URL`, `VALKEY_URL`, `HF_TOKEN`, `ORCHESTRATOR_KEY` join this table
//! with the adapters that use them.)

use std::path::Path;

use hanzod_actors::config::CoreConfig;
use serde::{Deserialize, Serialize};

/// The embedded defaults.
pub const DEFAULT_TOML: &str = include_str!("../config/default.toml");

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The actor core.
    pub core: CoreConfig,
    /// The chain.
    pub chain: ChainConfig,
    /// Logging.
    pub log: LogConfig,
}

/// Chain settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChainConfig {
    /// EVM chain id (36900 for the Hanzo chain).
    pub chain_id: u64,
}

/// Log output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    /// `human` or `json`.
    pub format: LogFormat,
    /// A tracing `EnvFilter` directive, e.g. `info,hanzod_actors=debug`.
    pub filter: String,
}

/// Log format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Human,
    /// One JSON object per line.
    Json,
}

/// Why the configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A layer is not valid TOML or does not fit the schema (unknown key, wrong type).
    #[error("{layer}: {message}")]
    Invalid {
        /// Which layer: `defaults`, the file's path, or `environment`.
        layer: String,
        /// The parser's message (names the key).
        message: String,
    },
}

fn merge(base: &mut toml::Value, over: toml::Value) {
    match (base, over) {
        (toml::Value::Table(b), toml::Value::Table(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(slot) => merge(slot, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (slot, v) => *slot = v,
    }
}

fn typed(layer: &str, value: toml::Value) -> Result<Config, ConfigError> {
    value
        .try_into()
        .map_err(|e: toml::de::Error| ConfigError::Invalid {
            layer: layer.to_string(),
            message: e.to_string(),
        })
}

fn parse(layer: &str, text: &str) -> Result<toml::Value, ConfigError> {
    toml::from_str(text).map_err(|e| ConfigError::Invalid {
        layer: layer.to_string(),
        message: e.to_string(),
    })
}

impl Config {
    /// Loads defaults, then `file` (if any), then the environment given by `env`
    /// (a lookup function, so tests need not touch the process environment).
    pub fn load(
        file: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let mut value = parse("defaults", DEFAULT_TOML)?;
        if let Some(path) = file {
            let layer = path.display().to_string();
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: layer.clone(),
                source,
            })?;
            merge(&mut value, parse(&layer, &text)?);
            // Schema errors (unknown key, wrong type) are reported against the file.
            typed(&layer, value.clone())?;
        }
        let mut env_layer = toml::Table::new();
        let mut set = |section: &str, key: &str, v: toml::Value| {
            env_layer
                .entry(section.to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()))
                .as_table_mut()
                .map(|t| t.insert(key.to_string(), v));
        };
        if let Some(v) = env("HANZO_CHAIN_ID") {
            let id = v.parse::<i64>().map_err(|e| ConfigError::Invalid {
                layer: "environment".into(),
                message: format!("HANZO_CHAIN_ID={v}: {e}"),
            })?;
            set("chain", "chain_id", toml::Value::Integer(id));
        }
        if let Some(v) = env("HANZO_LOG") {
            set("log", "filter", toml::Value::String(v));
        }
        if let Some(v) = env("HANZO_LOG_FORMAT") {
            set("log", "format", toml::Value::String(v));
        }
        merge(&mut value, toml::Value::Table(env_layer));
        let cfg = typed("environment", value)?;
        cfg.core.validate().map_err(|e| ConfigError::Invalid {
            layer: "settings".into(),
            message: e.to_string(),
        })?;
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&cfg.log.filter) {
            return Err(ConfigError::Invalid {
                layer: "settings".into(),
                message: format!("log.filter {:?}: {e}", cfg.log.filter),
            });
        }
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_parse_and_match_core_defaults() {
        let c = Config::load(None, |_| None).unwrap();
        assert_eq!(c.core, CoreConfig::default());
        assert_eq!(c.chain.chain_id, 36900);
    }

    #[test]
    fn unknown_key_is_an_error_naming_it() {
        let dir = std::env::temp_dir().join(format!("hanzod-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("bad.toml");
        std::fs::write(&f, "[core.heartbeat]\ninterval_msec = 5\n").unwrap();
        let err = Config::load(Some(&f), |_| None).unwrap_err().to_string();
        assert!(
            err.contains("interval_msec") && err.contains("bad.toml"),
            "{err}"
        );
        let err = Config::load(None, |k| (k == "HANZO_LOG_FORMAT").then(|| "xml".into()));
        assert!(err.unwrap_err().to_string().starts_with("environment"));
        let err = Config::load(None, |k| (k == "HANZO_LOG").then(|| "not[valid".into()));
        assert!(err.unwrap_err().to_string().contains("log.filter"));
        std::fs::write(&f, "[core.heartbeat]\ntimeout_ms = 5000\n").unwrap();
        let err = Config::load(Some(&f), |_| None).unwrap_err().to_string();
        assert!(err.contains("heartbeat.timeout_ms"), "{err}");
    }

    #[test]
    fn file_then_environment_override() {
        let dir = std::env::temp_dir().join(format!("hanzod-cfg2-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("over.toml");
        std::fs::write(
            &f,
            "[core.heartbeat]\ntimeout_ms = 45000\n[chain]\nchain_id = 1\n",
        )
        .unwrap();
        let c = Config::load(Some(&f), |k| {
            (k == "HANZO_CHAIN_ID").then(|| "31337".into())
        })
        .unwrap();
        assert_eq!(c.core.heartbeat.timeout_ms, 45_000);
        assert_eq!(c.core.heartbeat.interval_ms, 10_000);
        assert_eq!(c.chain.chain_id, 31337);
        let bad = Config::load(None, |k| (k == "HANZO_CHAIN_ID").then(|| "x".into()));
        assert!(bad.is_err());
    }
}
