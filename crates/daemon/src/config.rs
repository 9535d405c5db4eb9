//! Configuration: `config/default.toml` (embedded), overridden by a TOML file, overridden
//! by the environment. One serde tree; unknown keys are errors.
//!
//! Environment variables (the names of the paper's compose file, §9.1):
//!
//! | variable | key |
//! |---|---|
//! | `HANZO_RPC` | `chain.rpc_url` |
//! | `HANZO_CHAIN_ID` | `chain.chain_id` |
//! | `HANZO_GYM_TOKEN` | `chain.gym_token` |
//! | `HANZO_MINING_POOL` | `chain.mining_pool` |
//! | `IPFS_URL` | `publish.ipfs_url` |
//! | `VALKEY_URL` | `state.valkey_url` |
//! | `HF_TOKEN` | `publish.hf_token` |
//! | `HF_ENDPOINT` | `publish.hf_endpoint` |
//! | `ORCHESTRATOR_KEY` | `orchestrator.key` |
//! | `HANZO_LOG` | `log.filter` |
//! | `HANZO_LOG_FORMAT` | `log.format` |
//! | `HANZOD_ADMIN_TOKEN` | `server.admin_token` |
//! | `HANZOD_REPLICA_ID` | `state.replica_id` |
//! | `HANZOD_ADVERTISE` | `state.advertise` |
//!
//! Any other variable starting with `HANZO_` is an error (a typo must not be ignored).

use std::path::{Path, PathBuf};

use hanzod_actors::config::CoreConfig;
use serde::{Deserialize, Serialize};

/// The embedded defaults.
pub const DEFAULT_TOML: &str = include_str!("../../../config/default.toml");

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The daemon's data directory (a path relative to the working directory, or absolute):
    /// where the embedded object store keeps published checkpoints (`<data_dir>/ipfs`,
    /// unless `publish.object_dir` says otherwise) and the embedded model registry writes
    /// its repo folders (`<data_dir>/models`, unless `publish.registry_dir` does). Empty:
    /// neither is written (checkpoints in memory, no folders), unless those keys are set.
    /// See [`Config::object_dir`], [`Config::registry_dir`], [`Config::storage_line`].
    pub data_dir: String,
    /// The actor core.
    pub core: CoreConfig,
    /// The gRPC server and the metrics exporter.
    pub server: ServerConfig,
    /// Admission of nodes and link probes.
    pub nodes: NodesConfig,
    /// The chain.
    pub chain: ChainConfig,
    /// The state store.
    pub state: StateConfig,
    /// Checkpoint publication.
    pub publish: PublishConfig,
    /// Delta uploads and the blob store that keeps them.
    pub deltas: DeltasConfig,
    /// The validator and the merge (DESIGN §6).
    pub validation: ValidationSection,
    /// The orchestrator's own identity.
    pub orchestrator: OrchestratorConfig,
    /// Logging.
    pub log: LogConfig,
}

/// The daemon's listeners and transport limits (DESIGN §10).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// gRPC listen address, e.g. `0.0.0.0:9550`.
    pub grpc_addr: String,
    /// Prometheus listen address, e.g. `0.0.0.0:9551`; empty disables the exporter.
    pub metrics_addr: String,
    /// Largest gRPC message accepted or sent, bytes.
    pub max_message_bytes: usize,
    /// Most concurrent HTTP/2 streams per connection.
    pub max_concurrent_streams: u32,
    /// HTTP/2 PING interval, ms.
    pub keepalive_interval_ms: u64,
    /// A peer that does not answer a PING within this many ms is dropped.
    pub keepalive_timeout_ms: u64,
    /// Messages buffered per node session before the node counts as not reading.
    pub session_queue: usize,
    /// A session stream must send its first message within this many ms.
    pub first_message_timeout_ms: u64,
    /// On SIGTERM/SIGINT, wait at most this many ms for calls in flight.
    pub shutdown_grace_ms: u64,
    /// When not empty, JobService and AdminService calls need
    /// `authorization: Bearer <admin_token>`.
    pub admin_token: String,
    /// TLS; plaintext when `cert` is empty.
    pub tls: TlsConfig,
    /// Abuse limits.
    pub limits: LimitsConfig,
}

/// TLS 1.3 material, PEM files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// Certificate chain; empty serves plaintext.
    pub cert: String,
    /// Private key.
    pub key: String,
    /// When not empty, clients must present a certificate signed by this CA (mutual TLS).
    pub client_ca: String,
}

/// Per-node limits of the node service.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Session messages per node per second, sustained.
    pub messages_per_s: u32,
    /// Session messages per node in a burst.
    pub burst: u32,
    /// Refused messages before a session is closed `RESOURCE_EXHAUSTED`.
    pub max_violations: u32,
    /// Registrations per node key per minute (charged once the signature verifies).
    pub registrations_per_min: u32,
    /// Challenge calls per client IP address per minute (and burst): bounds what one host
    /// can make the daemon hold, whatever keys it invents.
    pub challenges_per_ip_per_min: u32,
    /// Register calls per client IP address (IPv6: per /64) per minute (and burst), charged
    /// before its `NodeInfo` is decoded or its signature verified: bounds the Ed25519
    /// verifications one host can cost, whatever keys it invents.
    pub registrations_per_ip_per_min: u32,
    /// Registration nonces outstanding at once.
    pub max_pending_challenges: usize,
    /// A nonce expires after this many ms.
    pub challenge_ttl_ms: u64,
}

/// Node admission and probing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodesConfig {
    /// Ed25519 keys (64 hex digits each) trusted to sign GPU attestations; empty is
    /// development mode: attestations are not checked (logged loudly at start).
    pub attesters: Vec<String>,
    /// Bytes each link probe transfers.
    pub probe_bytes: u64,
    /// A probe result is accepted for this many ms after the request.
    pub probe_ttl_ms: u64,
}

/// Chain settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChainConfig {
    /// EVM chain id (36900 for the Hanzo chain).
    pub chain_id: u64,
    /// EVM JSON-RPC endpoint (`HANZO_RPC`); empty uses the embedded in-process ledger.
    pub rpc_url: String,
    /// With the embedded ledger: the stake every node's operator holds, in whole GYM.
    pub dev_stake_gym: u64,
    /// The reward pool of one epoch, whole GYM: split among the epoch's accepted deltas in
    /// proportion to their composite scores (paper §8, `MiningPool.distributeEpochRewards`).
    pub epoch_reward_gym: u64,
    /// Percent of a node's stake slashed for a failed spot-check (1..=100; paper §8).
    pub slash_pct: u8,
    /// How long a slashed node stays penalised (no new admissions), ms. The embedded
    /// ledger's; on a real chain the window is `GYMToken.penaltyWindow`.
    pub penalty_window_ms: u64,
    /// With `rpc_url`: the `GYMToken` contract address (`0x` and 40 hex digits).
    pub gym_token: String,
    /// With `rpc_url`: the `MiningPool` contract address.
    pub mining_pool: String,
    /// With `rpc_url`: the block the contracts were deployed in; reward and slash history
    /// is read from the logs from there on.
    pub from_block: u64,
    /// With `rpc_url`: the bound of one JSON-RPC call, ms.
    pub call_timeout_ms: u64,
    /// With `rpc_url`: how long a transaction's receipt is awaited, ms.
    pub tx_timeout_ms: u64,
}

impl ChainConfig {
    /// The EVM adapter's options for this configuration (`rpc_url` set).
    ///
    /// Errors: `gym_token` or `mining_pool` is not an address.
    pub fn evm_options(&self) -> Result<hanzod_adapters::chain::EvmOptions, String> {
        let address = |key: &str, var: &str, v: &str| {
            if v.is_empty() {
                return Err(format!(
                    "chain.rpc_url (HANZO_RPC) is set, so chain.{key} ({var}) must name the \
                     contract (0x and 40 hex digits); `hanzod chain deploy` prints it"
                ));
            }
            v.parse::<alloy::primitives::Address>().map_err(|e| {
                format!("chain.{key} ({var}) {v:?} is not a contract address (0x and 40 hex digits): {e}")
            })
        };
        Ok(hanzod_adapters::chain::EvmOptions {
            chain_id: self.chain_id,
            token: address("gym_token", "HANZO_GYM_TOKEN", &self.gym_token)?,
            pool: address("mining_pool", "HANZO_MINING_POOL", &self.mining_pool)?,
            from_block: self.from_block,
            call_timeout: std::time::Duration::from_millis(self.call_timeout_ms),
            tx_timeout: std::time::Duration::from_millis(self.tx_timeout_ms),
            ..hanzod_adapters::chain::EvmOptions::default()
        })
    }
}

pub use hanzod_adapters::valkey::StateConfig;

/// Publication settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublishConfig {
    /// Kubo RPC URL (`IPFS_URL`), e.g. `http://ipfs:5001`; empty uses the embedded store.
    pub ipfs_url: String,
    /// Hugging Face Hub token (`HF_TOKEN`); a secret, never printed. When set, checkpoints
    /// are pushed to the Hub at `hf_endpoint` (and `registry_dir` is not used).
    pub hf_token: String,
    /// The Hub's base URL (`HF_ENDPOINT`), `http(s)://host[:port]`.
    pub hf_endpoint: String,
    /// The embedded object store's directory (one file per IPFS block, named by its CID);
    /// empty: `<data_dir>/ipfs`, or, with `data_dir` empty too, checkpoints stay in memory
    /// for the life of the process.
    pub object_dir: String,
    /// Where the embedded model registry writes Hugging Face repo folders
    /// (`<dir>/<org>/<model>-job-<job>-epoch-<e>/`); empty: `<data_dir>/models`, or, with
    /// `data_dir` empty too, no folders are written.
    pub registry_dir: String,
    /// The organisation of published repos (`{org}/{model}-job-{job}-epoch-{epoch}`):
    /// `[A-Za-z0-9._-]`, at most 96 characters.
    pub org: String,
}

/// Delta uploads (`NodeService.UploadDelta`, DESIGN §6) and the content-addressed blob
/// store their bytes are kept in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeltasConfig {
    /// Directory of the blob store (`<dir>/<2 hex>/<62 hex>`, fsync'd); empty keeps blobs
    /// in memory for the life of the process.
    pub store_dir: String,
    /// Uploads received at once, over all nodes (each node has at most one in flight);
    /// more are refused `RESOURCE_EXHAUSTED`. Memory held by uploads is bounded by this
    /// times twice the largest delta of the jobs' models.
    pub max_concurrent_uploads: usize,
    /// An upload whose next chunk does not arrive within this many ms ends
    /// `DEADLINE_EXCEEDED`.
    pub upload_idle_ms: u64,
    /// The slowest upload rate accepted, bytes/s (> 0): an upload must deliver its data
    /// within `upload_idle_ms + total_bytes / min_upload_bytes_per_s` of its header being
    /// accepted, or it ends `DEADLINE_EXCEEDED` (a node trickling one byte per idle period
    /// cannot hold an upload slot for long).
    pub min_upload_bytes_per_s: u64,
    /// The data chunk size nodes are asked to use, bytes (announced in
    /// `RegisterResponse.delta_chunk_bytes`; any size up to `server.max_message_bytes` is
    /// accepted).
    pub chunk_bytes: usize,
}

/// The validator pool and the merge (DESIGN §6, paper §5–§6).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ValidationSection {
    /// Fraction of deltas spot-checked, in `[0, 1]` (DESIGN §6: 0.1).
    pub spot_check_rate: f64,
    /// Relative tolerance of the claimed-loss comparison, `[0, 1]` (paper §5.2: 0.05).
    pub loss_rel_tol: f64,
    /// Whether a spot-check also re-runs the node's local steps (deterministic recipes).
    pub replay: bool,
    /// Relative L2 distance allowed between a delta and its re-run (plus the dtype's
    /// rounding), `[0, 1]`.
    pub replay_rel_tol: f64,
    /// Fraction of suspect deltas above which the robust aggregator replaces the weighted
    /// mean, `[0, 1]` (paper §6: 0.30): in star mode in an epoch whose deltas have no
    /// agreement with each other (fewer than 3; otherwise the agreement-weighted mean goes
    /// first and the robust aggregator is its fallback,
    /// `hanzod_pipeline::epoch::StarPolicy`), in ring mode the fraction of members the
    /// sketch scoring excluded.
    pub suspect_threshold: f64,
    /// The robust aggregator (DESIGN §6, "Merge"): `{ kind = "median" }` (the default, the
    /// paper's), `trimmed_mean` (`trim`), `krum` / `multi_krum` (`byzantine_fraction`,
    /// `select`) or `centered_clipping` (`iterations`, `tau`); checked at load.
    #[serde(default)]
    pub robust_aggregator: hanzod_pipeline::merge::RobustAggregator,
    /// Validator workers; 0 = one per CPU.
    pub workers: usize,
    /// Keep every delta blob; `false` removes an epoch's deltas once the next epoch is
    /// published (slashing evidence is always kept).
    pub retain_deltas: bool,
    /// The most floating-point operations validating one epoch of a job may cost, FLOPs
    /// (> 0; `inf` admits everything). SubmitJob estimates a job's cost with
    /// [`hanzod_pipeline::budget`]: `2·P·V·(N + 1) + ⌈rate·N⌉·6·P·R` for `P` parameters,
    /// `V` validation tokens (samples for the MLP), `N = max_nodes` deltas and `R` tokens
    /// (samples) of one node's local run, and refuses a job above this
    /// `RESOURCE_EXHAUSTED`.
    ///
    /// The default, 1e14, is about 17 minutes of validation per epoch at 1e11 FLOP/s, the
    /// order of magnitude a CPU daemon sustains. It admits, with the default
    /// `spot_check_rate` of 0.1:
    /// - qwen3-tiny (1.05 M parameters) as in `config/job.lm.example.toml` (V 2048, N 8,
    ///   8 steps × 8 × 65 tokens): 2·1.05e6·2048·9 + 1·6·1.05e6·4160 = 6.5e10;
    /// - qwen3-tiny with the recipe defaults (V 4096, 20 steps × 32 × 129 tokens) on 64
    ///   nodes: 5.6e11 + 7·5.2e11 = 4.2e12;
    /// - the `wine-mlp` of `config/job.example.toml` (1,473 parameters, 320 validation
    ///   samples, N 16, 10,000 steps × 1,024 samples): 1.6e7 + 2·9.0e10 = 1.8e11;
    ///
    /// and refuses Qwen3-0.6B (596 M parameters, tied embeddings) with 4096 validation
    /// tokens on 64 nodes: 2·5.96e8·4096·65 = 3.2e14 for the scoring alone, before any
    /// spot-check replay. A daemon validating on accelerators raises it.
    pub validation_budget_flops: f64,
    /// Where validation (scoring, spot-check replay, merge checks) runs: `cpu`, `cuda`,
    /// `cuda:N` or `wgpu` ([`hanzod_train::backend::Backend`]); a GPU needs a build with
    /// the `cuda` or `wgpu` feature, which [`Config::check`] checks.
    #[serde(default = "default_device")]
    pub device: String,
}

fn default_device() -> String {
    "cpu".into()
}

impl ValidationSection {
    /// The sink's settings.
    pub fn sink_config(&self) -> hanzod_pipeline::sink::SinkConfig {
        let default = hanzod_pipeline::sink::SinkConfig::default();
        hanzod_pipeline::sink::SinkConfig {
            validation: hanzod_pipeline::validate::ValidationConfig {
                spot_check_rate: self.spot_check_rate,
                loss_rel_tol: self.loss_rel_tol,
                replay_rel_tol: self.replay_rel_tol,
                replay: self.replay,
            },
            suspect_threshold: self.suspect_threshold as f32,
            robust_aggregator: self.robust_aggregator,
            workers: if self.workers == 0 {
                default.workers
            } else {
                self.workers
            },
            retain_deltas: self.retain_deltas,
        }
    }
}

/// The orchestrator's identity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrchestratorConfig {
    /// Its Ed25519 key (`ORCHESTRATOR_KEY`): 64 hex digits, or the path of a key file;
    /// empty generates a fresh key at each start. A secret, never printed.
    pub key: String,
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

/// The semantic checks of a configuration (ranges and relations of the core's settings,
/// the log filter, [`Config::check`]), reported against `layer`: the first layer whose
/// values make them fail.
fn semantic(layer: &str, cfg: &Config) -> Result<(), ConfigError> {
    let invalid = |message: String| ConfigError::Invalid {
        layer: layer.to_string(),
        message,
    };
    cfg.core.validate().map_err(|e| invalid(e.to_string()))?;
    if let Err(e) = tracing_subscriber::EnvFilter::try_new(&cfg.log.filter) {
        return Err(invalid(format!("log.filter {:?}: {e}", cfg.log.filter)));
    }
    cfg.check().map_err(invalid)
}

fn parse(layer: &str, text: &str) -> Result<toml::Value, ConfigError> {
    toml::from_str(text).map_err(|e| ConfigError::Invalid {
        layer: layer.to_string(),
        message: e.to_string(),
    })
}

impl Config {
    /// The embedded object store's directory: `publish.object_dir`, else `<data_dir>/ipfs`,
    /// else none (checkpoints in memory). Unused when `publish.ipfs_url` is set.
    pub fn object_dir(&self) -> Option<PathBuf> {
        dir_or_data(&self.publish.object_dir, &self.data_dir, "ipfs")
    }

    /// The embedded model registry's directory: `publish.registry_dir`, else
    /// `<data_dir>/models`, else none (no folders). Unused when `publish.hf_token` is set.
    pub fn registry_dir(&self) -> Option<PathBuf> {
        dir_or_data(&self.publish.registry_dir, &self.data_dir, "models")
    }

    /// Where published checkpoints and model folders go, in one line for the operator
    /// (`hanzod serve` logs it at start), e.g. `checkpoints: /srv/hanzod-data/ipfs, model
    /// folders: /srv/hanzod-data/models`. Relative directories are shown under `cwd` (the
    /// working directory) when it is given.
    pub fn storage_line(&self, cwd: Option<&Path>) -> String {
        let shown = |d: PathBuf| match cwd {
            Some(cwd) if d.is_relative() => cwd.join(d).display().to_string(),
            _ => d.display().to_string(),
        };
        let checkpoints = if !self.publish.ipfs_url.is_empty() {
            format!(
                "checkpoints: the IPFS node at {}",
                self.redacted().publish.ipfs_url
            )
        } else {
            match self.object_dir() {
                Some(d) => format!("checkpoints: {}", shown(d)),
                None => "checkpoints: in memory only (gone when the daemon stops)".to_string(),
            }
        };
        let models = if !self.publish.hf_token.is_empty() {
            format!(
                "model repos: the Hugging Face Hub at {}/{}",
                self.publish.hf_endpoint.trim_end_matches('/'),
                self.publish.org
            )
        } else {
            match self.registry_dir() {
                Some(d) => format!("model folders: {}", shown(d)),
                None => "model folders: none".to_string(),
            }
        };
        let mut line = format!("{checkpoints}, {models}");
        if self.object_dir().is_none()
            && self.registry_dir().is_none()
            && self.publish.ipfs_url.is_empty()
            && self.publish.hf_token.is_empty()
        {
            line.push_str(
                " (memory-only: set data_dir, or drop --memory-only, to keep the trained models)",
            );
        }
        line
    }

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
            // Schema errors (unknown key, wrong type) are reported against the file, and so
            // are values the semantic checks refuse once the file is layered on.
            semantic(&layer, &typed(&layer, value.clone())?)?;
        }
        let mut env_layer = toml::Table::new();
        let mut set = |section: &str, key: &str, v: toml::Value| {
            env_layer
                .entry(section.to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()))
                .as_table_mut()
                .map(|t| t.insert(key.to_string(), v));
        };
        for (var, section, key) in [
            ("HANZO_RPC", "chain", "rpc_url"),
            ("HANZO_GYM_TOKEN", "chain", "gym_token"),
            ("HANZO_MINING_POOL", "chain", "mining_pool"),
            ("IPFS_URL", "publish", "ipfs_url"),
            ("VALKEY_URL", "state", "valkey_url"),
            ("HF_TOKEN", "publish", "hf_token"),
            ("HF_ENDPOINT", "publish", "hf_endpoint"),
            ("ORCHESTRATOR_KEY", "orchestrator", "key"),
            ("HANZOD_ADMIN_TOKEN", "server", "admin_token"),
            ("HANZOD_REPLICA_ID", "state", "replica_id"),
            ("HANZOD_ADVERTISE", "state", "advertise"),
        ] {
            if let Some(v) = env(var) {
                set(section, key, toml::Value::String(v));
            }
        }
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
        // A value that passed with the file but not with the environment came from there.
        semantic("environment", &cfg)?;
        Ok(cfg)
    }

    /// Refuses environment variables that look like ours but are not: any `HANZO_*` name
    /// other than those in the module table.
    pub fn check_env_names<'a>(
        names: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), ConfigError> {
        for name in names {
            if name.starts_with("HANZO_") && !KNOWN_HANZO_VARS.contains(&name) {
                return Err(ConfigError::Invalid {
                    layer: "environment".into(),
                    message: format!(
                        "unknown variable {name} (known: {})",
                        KNOWN_HANZO_VARS.join(", ")
                    ),
                });
            }
        }
        Ok(())
    }

    /// Checks the values (every load does): ranges, addresses, TLS material pairs,
    /// attester keys. Errors name the key at fault.
    pub fn check(&self) -> Result<(), String> {
        let s = &self.server;
        s.grpc_addr
            .parse::<std::net::SocketAddr>()
            .map_err(|e| format!("server.grpc_addr {:?}: {e}", s.grpc_addr))?;
        if !s.metrics_addr.is_empty() {
            s.metrics_addr
                .parse::<std::net::SocketAddr>()
                .map_err(|e| format!("server.metrics_addr {:?}: {e}", s.metrics_addr))?;
        }
        for (key, v) in [
            ("server.max_message_bytes", s.max_message_bytes as u64),
            (
                "server.max_concurrent_streams",
                s.max_concurrent_streams as u64,
            ),
            ("server.keepalive_interval_ms", s.keepalive_interval_ms),
            ("server.keepalive_timeout_ms", s.keepalive_timeout_ms),
            ("server.session_queue", s.session_queue as u64),
            (
                "server.first_message_timeout_ms",
                s.first_message_timeout_ms,
            ),
            (
                "server.limits.messages_per_s",
                s.limits.messages_per_s as u64,
            ),
            ("server.limits.burst", s.limits.burst as u64),
            (
                "server.limits.registrations_per_min",
                s.limits.registrations_per_min as u64,
            ),
            (
                "server.limits.registrations_per_ip_per_min",
                s.limits.registrations_per_ip_per_min as u64,
            ),
            (
                "server.limits.max_pending_challenges",
                s.limits.max_pending_challenges as u64,
            ),
            ("server.limits.challenge_ttl_ms", s.limits.challenge_ttl_ms),
            ("nodes.probe_ttl_ms", self.nodes.probe_ttl_ms),
            (
                "deltas.max_concurrent_uploads",
                self.deltas.max_concurrent_uploads as u64,
            ),
            ("deltas.upload_idle_ms", self.deltas.upload_idle_ms),
            (
                "deltas.min_upload_bytes_per_s",
                self.deltas.min_upload_bytes_per_s,
            ),
            ("deltas.chunk_bytes", self.deltas.chunk_bytes as u64),
            ("chain.penalty_window_ms", self.chain.penalty_window_ms),
            ("chain.call_timeout_ms", self.chain.call_timeout_ms),
            ("chain.tx_timeout_ms", self.chain.tx_timeout_ms),
            ("state.pool_size", self.state.pool_size as u64),
            ("state.connect_timeout_ms", self.state.connect_timeout_ms),
            ("state.command_timeout_ms", self.state.command_timeout_ms),
            ("state.lease_ttl_ms", self.state.lease_ttl_ms),
            ("state.campaign_ms", self.state.campaign_ms),
        ] {
            if v == 0 {
                return Err(format!("{key} must be greater than 0"));
            }
        }
        for (key, url) in [
            ("publish.ipfs_url (IPFS_URL)", &self.publish.ipfs_url),
            (
                "publish.hf_endpoint (HF_ENDPOINT)",
                &self.publish.hf_endpoint,
            ),
        ] {
            if !url.is_empty() && !url.starts_with("http://") && !url.starts_with("https://") {
                // Only the scheme is named: the URL may carry credentials.
                let scheme = url.split_once("://").map_or("none", |(s, _)| s);
                return Err(format!(
                    "{key} is not an http:// or https:// URL (scheme: {scheme})"
                ));
            }
        }
        hanzod_store::registry::validate_repo(&format!("{}/model-epoch-0", self.publish.org))
            .map_err(|e| format!("publish.org {:?}: {e}", self.publish.org))?;
        let st = &self.state;
        if st.namespace.is_empty()
            || st.namespace.len() > 64
            || !st
                .namespace
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        {
            return Err(format!(
                "state.namespace {:?}: 1 to 64 characters of [A-Za-z0-9._-]",
                st.namespace
            ));
        }
        if st.campaign_ms.saturating_mul(2) > st.lease_ttl_ms {
            return Err(format!(
                "state.campaign_ms ({}) must be at most half of state.lease_ttl_ms ({}): a \
                 leader must get at least two renewals in before its lease expires",
                st.campaign_ms, st.lease_ttl_ms
            ));
        }
        if !self.chain.rpc_url.is_empty() {
            let url = &self.chain.rpc_url;
            if !url.starts_with("http://") && !url.starts_with("https://") {
                let scheme = url.split_once("://").map_or("none", |(s, _)| s);
                return Err(format!(
                    "chain.rpc_url (HANZO_RPC) is not an http:// or https:// URL (scheme: {scheme})"
                ));
            }
            self.chain.evm_options()?;
        }
        if !(1..=100).contains(&self.chain.slash_pct) {
            return Err(format!(
                "chain.slash_pct must be within 1..=100, got {}",
                self.chain.slash_pct
            ));
        }
        // A data chunk travels in a DeltaChunk message: tag and length take at most 16 bytes.
        if self.deltas.chunk_bytes.saturating_add(CHUNK_FRAMING) > s.max_message_bytes {
            return Err(format!(
                "deltas.chunk_bytes ({}) must be at most server.max_message_bytes - {CHUNK_FRAMING} ({})",
                self.deltas.chunk_bytes,
                s.max_message_bytes.saturating_sub(CHUNK_FRAMING)
            ));
        }
        let v = &self.validation;
        for (key, value) in [
            ("validation.spot_check_rate", v.spot_check_rate),
            ("validation.loss_rel_tol", v.loss_rel_tol),
            ("validation.replay_rel_tol", v.replay_rel_tol),
            ("validation.suspect_threshold", v.suspect_threshold),
        ] {
            if !(0.0..=1.0).contains(&value) {
                return Err(format!("{key} must be within [0, 1], got {value}"));
            }
        }
        v.robust_aggregator
            .check()
            .map_err(|e| format!("validation.robust_aggregator: {e}"))?;
        if v.validation_budget_flops.is_nan() || v.validation_budget_flops <= 0.0 {
            return Err(format!(
                "validation.validation_budget_flops must be above 0 (inf: no limit), got {}",
                v.validation_budget_flops
            ));
        }
        v.device
            .parse::<hanzod_train::backend::Backend>()
            .and_then(hanzod_train::backend::Backend::check_built)
            .map_err(|e| format!("validation.device: {e}"))?;
        if s.tls.cert.is_empty() != s.tls.key.is_empty() {
            return Err("server.tls.cert and server.tls.key go together".into());
        }
        if !s.tls.client_ca.is_empty() && s.tls.cert.is_empty() {
            return Err("server.tls.client_ca needs server.tls.cert and key".into());
        }
        for (i, k) in self.nodes.attesters.iter().enumerate() {
            let mut b = [0u8; 32];
            if hex::decode_to_slice(k, &mut b).is_err()
                || ed25519_dalek::VerifyingKey::from_bytes(&b).is_err()
            {
                return Err(format!(
                    "nodes.attesters[{i}] is not an Ed25519 public key (64 hex digits)"
                ));
            }
        }
        Ok(())
    }

    /// The configuration with secrets (`publish.hf_token`, `orchestrator.key`,
    /// `server.admin_token`, credentials inside URLs such as `redis://user:pw@host`, and the
    /// path of `chain.rpc_url`, where providers put API keys) replaced by `"<redacted>"`, for
    /// printing.
    pub fn redacted(&self) -> Config {
        let mut c = self.clone();
        for url in [
            &mut c.chain.rpc_url,
            &mut c.state.valkey_url,
            &mut c.publish.ipfs_url,
        ] {
            if let Some((scheme, rest)) = url.split_once("://") {
                let authority_end = rest.find('/').unwrap_or(rest.len());
                if let Some(at) = rest[..authority_end].rfind('@') {
                    *url = format!("{scheme}://<redacted>@{}", &rest[at + 1..]);
                }
            }
        }
        // JSON-RPC providers put their API key in the path (`/v3/<key>`): keep the host.
        if let Some((scheme, rest)) = c.chain.rpc_url.split_once("://") {
            if let Some(slash) = rest.find('/').filter(|&i| i + 1 < rest.len()) {
                c.chain.rpc_url = format!("{scheme}://{}/<redacted>", &rest[..slash]);
            }
        }
        for s in [
            &mut c.publish.hf_token,
            &mut c.orchestrator.key,
            &mut c.server.admin_token,
        ] {
            if !s.is_empty() {
                *s = "<redacted>".into();
            }
        }
        c
    }
}

/// Bytes of protobuf framing around a data chunk in a `DeltaChunk` message, at most.
const CHUNK_FRAMING: usize = 16;

/// `dir` when set, else `<data_dir>/<sub>` when `data_dir` is set, else none.
fn dir_or_data(dir: &str, data_dir: &str, sub: &str) -> Option<PathBuf> {
    if !dir.is_empty() {
        Some(PathBuf::from(dir))
    } else if !data_dir.is_empty() {
        Some(Path::new(data_dir).join(sub))
    } else {
        None
    }
}

/// The `HANZO_*` variables we read.
pub const KNOWN_HANZO_VARS: &[&str] = &[
    "HANZO_RPC",
    "HANZO_CHAIN_ID",
    "HANZO_GYM_TOKEN",
    "HANZO_MINING_POOL",
    "HANZO_LOG",
    "HANZO_LOG_FORMAT",
];

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: a value the semantic checks refuse was reported against "settings"; the
    /// error now names the layer that brought it (the file, or the environment).
    #[test]
    fn a_refused_value_names_the_layer_it_came_from() {
        let dir = std::env::temp_dir().join(format!("hanzod-layer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("bad.toml");
        std::fs::write(&file, "[state]\ncampaign_ms = 4000\nlease_ttl_ms = 5000\n").unwrap();
        let err = Config::load(Some(&file), |_| None).unwrap_err().to_string();
        assert!(err.starts_with(&file.display().to_string()), "{err}");
        assert!(err.contains("state.campaign_ms"), "{err}");

        let env = |k: &str| (k == "IPFS_URL").then(|| "ftp://ipfs:5001".to_string());
        let err = Config::load(None, env).unwrap_err().to_string();
        assert!(err.starts_with("environment: "), "{err}");
        assert!(err.contains("IPFS_URL"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn defaults_parse_and_match_core_defaults() {
        let c = Config::load(None, |_| None).unwrap();
        assert_eq!(c.core, CoreConfig::default());
        assert_eq!(c.chain.chain_id, 36900);
        assert_eq!(c.server.grpc_addr, "0.0.0.0:9550");
        assert!(c.nodes.attesters.is_empty());
        assert_eq!(c.deltas.store_dir, "");
        assert_eq!(c.deltas.max_concurrent_uploads, 4);
        assert_eq!(c.deltas.upload_idle_ms, 30_000);
        assert_eq!(c.deltas.min_upload_bytes_per_s, 1 << 20);
        assert_eq!(c.deltas.chunk_bytes, 1 << 20);
        assert_eq!(c.validation.validation_budget_flops, 1e14);
    }

    #[test]
    fn compose_environment_names_map_to_keys_and_secrets_are_redacted() {
        let env = |k: &str| {
            Some(match k {
                "HANZO_RPC" => "http://127.0.0.1:8545".to_string(),
                "HANZO_GYM_TOKEN" => "0x5FbDB2315678afecb367f032d93F642f64180aa3".into(),
                "HANZO_MINING_POOL" => "0xe7f1725E7734CE288F8367e1Bb143E90bb3F0512".into(),
                "IPFS_URL" => "http://ipfs:5001".into(),
                "VALKEY_URL" => "redis://kv:6379".into(),
                "HF_TOKEN" => "hf_secret".into(),
                "ORCHESTRATOR_KEY" => "11".repeat(32),
                "HANZOD_ADMIN_TOKEN" => "tok".into(),
                _ => return None,
            })
        };
        let c = Config::load(None, env).unwrap();
        assert_eq!(c.chain.rpc_url, "http://127.0.0.1:8545");
        assert_eq!(
            c.chain.evm_options().map(|o| (o.token, o.pool)),
            Ok((
                "0x5FbDB2315678afecb367f032d93F642f64180aa3"
                    .parse()
                    .unwrap(),
                "0xe7f1725E7734CE288F8367e1Bb143E90bb3F0512"
                    .parse()
                    .unwrap()
            ))
        );
        // An endpoint without its contracts is refused, naming the key.
        let err = Config::load(None, |k| {
            (k == "HANZO_RPC").then(|| "http://127.0.0.1:8545".to_string())
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("chain.gym_token"), "{err}");
        assert_eq!(c.publish.ipfs_url, "http://ipfs:5001");
        assert_eq!(c.state.valkey_url, "redis://kv:6379");
        assert_eq!(c.publish.hf_token, "hf_secret");
        assert_eq!(c.server.admin_token, "tok");
        let c2 = Config::load(None, |k| {
            (k == "VALKEY_URL").then(|| "redis://user:pw@kv:6379/0".to_string())
        })
        .unwrap();
        assert_eq!(
            c2.redacted().state.valkey_url,
            "redis://<redacted>@kv:6379/0"
        );
        let printed = toml::to_string(&c.redacted()).unwrap();
        assert!(!printed.contains("hf_secret") && !printed.contains(&"11".repeat(32)));
        assert!(!printed.contains("\"tok\""));
        assert!(Config::check_env_names(["HANZO_RPC", "PATH"]).is_ok());
        let err = Config::check_env_names(["HANZO_CHAINID"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("HANZO_CHAINID"), "{err}");
    }

    #[test]
    fn server_settings_are_checked() {
        let dir = std::env::temp_dir().join(format!("hanzod-cfg3-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("s.toml");
        for (text, key) in [
            ("[server]\ngrpc_addr = \"nowhere\"\n", "server.grpc_addr"),
            ("[server.limits]\nburst = 0\n", "server.limits.burst"),
            ("[server.tls]\ncert = \"c.pem\"\n", "server.tls.cert"),
            ("[nodes]\nattesters = [\"xyz\"]\n", "nodes.attesters[0]"),
            (
                "[deltas]\nmax_concurrent_uploads = 0\n",
                "deltas.max_concurrent_uploads",
            ),
            ("[deltas]\nupload_idle_ms = 0\n", "deltas.upload_idle_ms"),
            (
                "[deltas]\nmin_upload_bytes_per_s = 0\n",
                "deltas.min_upload_bytes_per_s",
            ),
            ("[deltas]\nchunk_bytes = 4194304\n", "deltas.chunk_bytes"),
            ("[deltas]\nstore = \"/tmp\"\n", "store"),
            (
                "[validation]\nspot_check_rate = 1.5\n",
                "validation.spot_check_rate",
            ),
            (
                "[validation]\nvalidation_budget_flops = 0.0\n",
                "validation.validation_budget_flops",
            ),
            (
                "[validation]\nvalidation_budget_flops = nan\n",
                "validation.validation_budget_flops",
            ),
            (
                "[validation]\nsuspect_threshold = -0.1\n",
                "validation.suspect_threshold",
            ),
            (
                "[validation]\nrobust_aggregator = { kind = \"krum\", byzantine_fraction = 1.5 }\n",
                "validation.robust_aggregator",
            ),
            (
                "[validation]\nrobust_aggregator = { kind = \"bulyan\" }\n",
                "bulyan",
            ),
            ("[validation]\nreplay = 1\n", "replay"),
            ("[validation]\ndevice = \"tpu\"\n", "validation.device"),
            ("[chain]\nslash_pct = 0\n", "chain.slash_pct"),
            ("[publish]\norg = \"a/b\"\n", "publish.org"),
            ("[chain]\nslash_pct = 101\n", "chain.slash_pct"),
            (
                "[chain]\npenalty_window_ms = 0\n",
                "chain.penalty_window_ms",
            ),
        ] {
            std::fs::write(&f, text).unwrap();
            let err = Config::load(Some(&f), |_| None).unwrap_err().to_string();
            assert!(err.contains(key), "{text}: {err}");
        }
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
