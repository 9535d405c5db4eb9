//! `hanzod demo`: the main job end to end on one machine (paper §3, §6, §10).
//!
//! One command starts the orchestrator (in this process, on the embedded defaults) and N
//! `hanzod node` processes on loopback, submits a training job for the built-in
//! `wine-mlp` on Wine Quality (red), and follows it to Published: each epoch the nodes
//! fetch the global checkpoint, train with burn on their deterministic batch streams,
//! upload signed deltas; the orchestrator validates, spot-checks, merges, publishes the
//! checkpoint, pays the epoch's rewards and slashes failed spot-checks on the embedded
//! ledger. Faults are injected on request: `--kill K` SIGKILLs K node processes when an
//! epoch starts; `--byzantine B` makes B nodes poison their deltas (sign-flipped and
//! scaled) or lie about their loss.
//!
//! With `--testbed <topology.toml>` (root) the same run happens on a WAN test bed
//! ([`crate::testbed`]): the orchestrator listens on `10.77.0.1` inside the bed's
//! orchestrator namespace, node `k` runs inside its own namespace on `10.77.0.(k+2)` and
//! declares its region of the topology, so every byte between them crosses the shaped
//! links; the summary adds the orchestrator's ingress on the wire. `--kill-at reduce`
//! kills in the middle of the kill epoch's all-reduce round instead of at its start.
//!
//! The run is reproducible: the node keys, the orchestrator key (hence the spot-check
//! secrets) and the training seed all derive from `--seed`.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use hanzod_actors::actor::Notice;
use hanzod_actors::job::{Aggregation, JobPhase, JobSpec, LoraSpec, TrainMode, TrainingSpec};
use hanzod_actors::types::{GymWei, JobId, NodeId};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::io::AsyncBufReadExt;
use tokio::sync::mpsc;

use hanzod_daemon::config::Config;
use hanzod_daemon::serve::Daemon;
use hanzod_node::attack::Attack as NodeAttack;
use hanzod_node::trainer::{Behaviour, RingFault};
use hanzod_pipeline::sink::EpochReport;
use hanzod_protocol::identity::Identity;

use crate::testbed::{Endpoint, Testbed, Topology};

/// The `hanzod demo` flags. Every one may also come from a scenario file (`--scenario`,
/// TOML with the same names in snake_case); a flag given on the command line wins.
#[derive(Debug, Clone, Default, clap::Args, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DemoArgs {
    /// Node processes to start (1..=64) [default: 8; qwen3-tiny 4; with --testbed, the
    /// topology's nodes].
    #[arg(long)]
    pub nodes: Option<usize>,
    /// Epochs to train (1..=1000) [default: 5; qwen3-tiny 8].
    #[arg(long)]
    pub epochs: Option<u32>,
    /// Honest node processes to SIGKILL when epoch --kill-epoch starts [default: 0].
    #[arg(long)]
    pub kill: Option<usize>,
    /// The epoch at whose start --kill nodes die [default: 1, or 0 for a 1-epoch run].
    #[arg(long)]
    pub kill_epoch: Option<u32>,
    /// When in --kill-epoch the nodes die: `start` (when the epoch starts) or, with
    /// `--aggregation ring`, `reduce` (mid-round: when the victim reports that it started
    /// the epoch's all-reduce round) [default: start].
    #[arg(long)]
    pub kill_at: Option<KillAt>,
    /// Byzantine nodes [default: 0].
    #[arg(long)]
    pub byzantine: Option<usize>,
    /// What Byzantine nodes do: `poison` (upload −10 × the honest delta), `lie-loss` (claim
    /// half the measured loss) or `mixed` (alternate); with `--aggregation ring` also
    /// `tamper-allreduce` (corrupt the all-reduce), `substitute` (reduce and sketch another
    /// update than the committed one) or `free-ride` (commit the last global update as its
    /// own delta); the attack suite: `sign-flip`, `scale` (10 × δ), `noise`, `alie`, `ipm`,
    /// `copy-peer`, `copy-last`, `lazy`, `stale`, `identical` (alie, ipm, copy-peer and
    /// identical collude: the Byzantine nodes share their honest deltas through
    /// `<out>/collude`) [default: mixed].
    #[arg(long)]
    pub attack: Option<Attack>,
    /// The model: `wine-mlp` (an MLP on the Wine Quality table, seconds) or `qwen3-tiny`
    /// (a 1 M-parameter Qwen3 language model on Jane Austen's novels, minutes)
    /// [default: wine-mlp].
    #[arg(long)]
    pub model: Option<String>,
    /// With `--model qwen3-tiny`: train a LoRA adapter (rank 16, `lora_alpha` 32, on all
    /// seven linear modules of every layer: q/k/v/o and gate/up/down projections) instead of
    /// every parameter; each epoch's merged update `ΔW = (alpha/r)·B·A` goes into the
    /// published full checkpoint.
    #[arg(long)]
    pub lora: bool,
    /// Start epoch 0 from a published checkpoint instead of the model's seeded
    /// initialisation: a checkpoint folder (a repo with `model.safetensors`, e.g. one under
    /// an earlier run's `models/`), or the CID of its `model.safetensors` in the --out
    /// folder's object store (an earlier run's `ipfs/`, read before this run replaces it).
    /// Pretrain, then fine-tune: `hanzod demo --model qwen3-tiny`, then `hanzod demo --model
    /// qwen3-tiny --lora --base <the CID it printed>`.
    #[arg(long, value_name = "CID|FOLDER")]
    pub base: Option<String>,
    /// Local steps per node per epoch [default: 20; qwen3-tiny 40].
    #[arg(long)]
    pub local_steps: Option<u32>,
    /// Samples (sequences of 64 tokens, for qwen3-tiny) per local step [default: 32;
    /// qwen3-tiny 8].
    #[arg(long)]
    pub batch_size: Option<u32>,
    /// The nodes' learning rate (SGD's, AdamW's for qwen3-tiny) [default: 0.05; qwen3-tiny
    /// 0.005].
    #[arg(long, allow_negative_numbers = true)]
    pub local_lr: Option<f64>,
    /// Fraction of deltas spot-checked (the daemon's default is 0.1; the demo checks more so
    /// a short run catches a liar) [default: 0.5].
    #[arg(long, allow_negative_numbers = true)]
    pub spot_check_rate: Option<f64>,
    /// Seed of the keys, the spot-check secrets and the training [default: 1].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Where keys, node logs, the object store and the published model folders go
    /// [default: hanzod-demo].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Give up after this many seconds [default: 600].
    #[arg(long)]
    pub timeout_s: Option<u64>,
    /// Run on a real EVM chain: start anvil (`cd contracts && npm ci` installs it), deploy
    /// GYMToken and MiningPool, stake the orchestrator's account and each node's operator,
    /// bind the node keys, and pay rewards, slash and record publications on it.
    #[arg(long)]
    pub anvil: bool,
    /// With --anvil: take the chain's JSON-RPC endpoint down when this epoch starts
    /// (writes fail and are retried; nothing is paid twice).
    #[arg(long)]
    pub chain_outage_epoch: Option<u32>,
    /// With --chain-outage-epoch: how long the endpoint stays down, s [default: 5].
    #[arg(long)]
    pub chain_outage_s: Option<u64>,
    /// How each epoch's deltas are combined: `star` (every node uploads its delta to the
    /// orchestrator) or `ring` (nodes commit, send sketches and all-reduce the weighted sum
    /// among themselves over the ring; only spot-checked deltas and the result reach the
    /// orchestrator) [default: star].
    #[arg(long, value_parser = ["star", "ring"])]
    pub aggregation: Option<String>,
    /// Run on a WAN test bed of this topology (TOML, see `config/testbed.demo.toml`; needs
    /// root): the orchestrator listens inside the bed's orchestrator namespace and each
    /// node runs inside its own namespace, declaring its region of the topology, so every
    /// byte between them crosses the shaped links. --nodes must equal the topology's nodes.
    #[arg(long, value_name = "TOPOLOGY.toml")]
    pub testbed: Option<PathBuf>,
    /// A TOML scenario file with any of the flags above.
    #[arg(long)]
    #[serde(skip)]
    pub scenario: Option<PathBuf>,
}

/// What Byzantine nodes do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Attack {
    /// Upload −10 × the honest delta.
    Poison,
    /// Claim half the measured loss.
    LieLoss,
    /// Alternate poison and lie-loss.
    Mixed,
    /// Ring aggregation: add 1.0 to every value of its contribution to the all-reduce while
    /// committing to and sketching its honest delta (the result check must catch it).
    TamperAllreduce,
    /// Ring aggregation: skip training and commit the previous epoch's global update as its
    /// own delta (the sketch scoring must give it no weight).
    FreeRide,
    /// Ring aggregation: commit to the honest delta but reduce and sketch it plus 0.001
    /// (the check passes; the post-reduce audit or a spot-check must catch it).
    Substitute,
    /// Upload −1 × the honest delta (`hanzod node --byzantine sign-flip`).
    SignFlip,
    /// Upload 10 × the honest delta (`scale:10`, a boosted update).
    Scale,
    /// Upload Gaussian noise of the honest delta's L2 norm instead of it (`noise:1`).
    Noise,
    /// "A little is enough" (Baruch et al., NeurIPS 2019): every Byzantine node uploads the
    /// coordinate-wise mean + z_max × std of the Byzantine nodes' honest deltas (`alie`;
    /// they collude through a folder under --out).
    Alie,
    /// Inner-product manipulation (Xie, Koyejo, Gupta, UAI 2019): every Byzantine node
    /// uploads −0.5 × the mean of the Byzantine nodes' honest deltas (`ipm:0.5`; they
    /// collude).
    Ipm,
    /// Upload another Byzantine node's honest delta as its own (`copy-peer`; they
    /// collude).
    CopyPeer,
    /// Skip training and upload the previous epoch's merged update as its own (`copy-last`;
    /// zeros in epoch 0).
    CopyLast,
    /// Upload a zero delta (`lazy`).
    Lazy,
    /// Train from the checkpoint one epoch older than the assigned one (`stale:1`).
    Stale,
    /// Every Byzantine node uploads the mean of the Byzantine nodes' honest deltas: the same
    /// bytes (`identical`; they collude).
    Identical,
}

impl Attack {
    /// The node agent's attack this one runs (`None`: `poison`, `lie-loss`, `mixed` and the
    /// ring faults, which the agent has its own values for).
    pub fn suite(self) -> Option<NodeAttack> {
        Some(match self {
            Attack::Poison
            | Attack::LieLoss
            | Attack::Mixed
            | Attack::TamperAllreduce
            | Attack::FreeRide
            | Attack::Substitute => return None,
            Attack::SignFlip => NodeAttack::SignFlip,
            Attack::Scale => NodeAttack::Scale { k: 10.0 },
            Attack::Noise => NodeAttack::Noise { sigma: 1.0 },
            Attack::Alie => NodeAttack::Alie { z: None },
            Attack::Ipm => NodeAttack::Ipm { eps: 0.5 },
            Attack::CopyPeer => NodeAttack::CopyPeer {
                rescale: 1.0,
                noise: 0.0,
            },
            Attack::CopyLast => NodeAttack::CopyLastMerged {
                rescale: 1.0,
                noise: 0.0,
            },
            Attack::Lazy => NodeAttack::Lazy { scale: 0.0 },
            Attack::Stale => NodeAttack::Stale { epochs: 1 },
            Attack::Identical => NodeAttack::Identical,
        })
    }
}

/// The subfolder of `--out` where colluding Byzantine nodes share their deltas
/// (`hanzod node --collude`); emptied at the start of each run.
pub const COLLUDE_DIR: &str = "collude";

/// When in the kill epoch the killed nodes die ([`DemoArgs::kill_at`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum KillAt {
    /// When the epoch starts (before the nodes train).
    #[default]
    Start,
    /// Ring aggregation: mid-round, when the victim reports that it started the epoch's
    /// all-reduce round (its `round_started` event); when the epoch ends without one, at
    /// the start of the next epoch.
    Reduce,
}

/// Whether `r` is a region label a node accepts (`hanzod node --region`).
fn valid_region(r: &str) -> bool {
    (1..=64).contains(&r.len())
        && r.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// The `qwen3-tiny` recipe the demo and `hanzod bench byzantine` train with, where a
/// flag does not say otherwise: 40 local steps of batch 8 at a local learning rate of
/// 5e-3 on sequences of 64 tokens, judged on a validation shard of 2,048 tokens (a few
/// seconds per node and epoch on a CPU core; the loss falls from ln 2048 ≈ 7.6 nats/token).
pub const LM_RECIPE: LmRecipe = LmRecipe {
    local_steps: 40,
    batch_size: 8,
    local_lr: 5e-3,
    seq_len: 64,
    validation_tokens: 2048,
};

/// A language model's demo recipe ([`LM_RECIPE`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LmRecipe {
    /// Local steps per epoch.
    pub local_steps: u32,
    /// Sequences per local step.
    pub batch_size: u32,
    /// The nodes' learning rate.
    pub local_lr: f64,
    /// Tokens per sequence.
    pub seq_len: u32,
    /// Tokens in the validation shard.
    pub validation_tokens: u64,
}

/// A resolved demo run.
#[derive(Debug, Clone, Serialize)]
pub struct DemoPlan {
    /// Node processes.
    pub nodes: usize,
    /// Epochs.
    pub epochs: u32,
    /// Nodes killed.
    pub kill: usize,
    /// The epoch in which they die.
    pub kill_epoch: u32,
    /// When in that epoch.
    pub kill_at: KillAt,
    /// Byzantine nodes.
    pub byzantine: usize,
    /// Their attack.
    pub attack: Attack,
    /// The model (`wine-mlp` or `qwen3-tiny`).
    pub model: String,
    /// Train a LoRA adapter (`--lora`, qwen3-tiny only).
    pub lora: bool,
    /// How the epochs' deltas are combined (`--aggregation`).
    pub aggregation: Aggregation,
    /// The checkpoint epoch 0 starts from (`--base`), read when the plan was made.
    pub base: Option<DemoBase>,
    /// Local steps per epoch.
    pub local_steps: u32,
    /// Batch size.
    pub batch_size: u32,
    /// Local learning rate.
    pub local_lr: f64,
    /// Spot-check rate.
    pub spot_check_rate: f64,
    /// Seed.
    pub seed: u64,
    /// Output folder.
    pub out: PathBuf,
    /// Timeout, s.
    pub timeout_s: u64,
    /// The `hanzod` executable the nodes run (not serialised).
    #[serde(skip)]
    pub exe: PathBuf,
    /// Draw the live progress view (on a terminal) rather than log lines.
    #[serde(skip)]
    pub progress: bool,
    /// Start anvil and run on it (`--anvil`).
    pub anvil: bool,
    /// Take the chain endpoint down at the start of this epoch for this many seconds.
    pub chain_outage: Option<(u32, u64)>,
    /// Run on this chain (contracts deployed, accounts staked and bound by the caller, as
    /// [`stake_accounts`] does) instead of the embedded ledger or a fresh anvil (not
    /// serialised; for embedders and tests).
    #[serde(skip)]
    pub chain: Option<DemoChain>,
    /// Run on a WAN test bed of this topology ([`DemoArgs::testbed`]; node `k` of the run
    /// is node `k` of the topology).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub testbed: Option<Topology>,
}

/// A checkpoint a demo starts from ([`DemoArgs::base`]): its weights, read when the plan
/// is made (before the run replaces the --out folder's object store), and their CID.
#[derive(Clone, Serialize)]
pub struct DemoBase {
    /// The CID of `model.safetensors` ([`hanzod_protocol::cid::cid_of`]).
    pub cid: String,
    /// The bytes of `model.safetensors` (not serialised).
    #[serde(skip)]
    pub weights: bytes::Bytes,
}

impl std::fmt::Debug for DemoBase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DemoBase")
            .field("cid", &self.cid)
            .field("bytes", &self.weights.len())
            .finish()
    }
}

/// Largest `--base` weights file read, bytes (a qwen3-tiny checkpoint is about 4 MB).
const MAX_BASE_BYTES: u64 = 1 << 30;

impl DemoBase {
    /// Reads `reference`: a folder holding `model.safetensors`, else a CID in the object
    /// store `<out>/ipfs` (checked against the CID as it is read).
    ///
    /// Errors: [`DemoError::Usage`] naming `--base` when it is neither, or cannot be read.
    pub fn read(reference: &str, out: &Path) -> Result<DemoBase, DemoError> {
        let shown: String = reference.chars().take(100).collect();
        let usage = |e: &dyn std::fmt::Display| DemoError::Usage(format!("--base {shown}: {e}"));
        let file = Path::new(reference).join(hanzod_store::registry::WEIGHTS_FILE);
        if file.is_file() {
            let len = std::fs::metadata(&file).map_err(|e| usage(&e))?.len();
            if len > MAX_BASE_BYTES {
                return Err(usage(&format!(
                    "{} is {len} bytes, more than the {MAX_BASE_BYTES} read",
                    file.display()
                )));
            }
            let weights = bytes::Bytes::from(std::fs::read(&file).map_err(|e| usage(&e))?);
            let cid = hanzod_protocol::cid::cid_of(&weights).to_string();
            return Ok(DemoBase { cid, weights });
        }
        let cid = hanzod_store::objects::parse_cid(reference).map_err(|_| {
            usage(&format!(
                "neither a checkpoint folder (with {}) nor a CID",
                hanzod_store::registry::WEIGHTS_FILE
            ))
        })?;
        let store = hanzod_store::FsObjectStore::open_existing(out.join("ipfs"))
            .map_err(|e| usage(&format!("{e}: a CID is read from the --out folder's ipfs/")))?;
        let weights = store
            .read_blocking(&cid.to_string())
            .map_err(|e| usage(&e))?;
        if weights.len() as u64 > MAX_BASE_BYTES {
            return Err(usage(&format!(
                "{} bytes, more than the {MAX_BASE_BYTES} read",
                weights.len()
            )));
        }
        // Named as the daemon names what it stores (a CIDv0 `Qm…` given here reads the same
        // bytes, stored under their CIDv1).
        let weights = bytes::Bytes::copy_from_slice(&weights);
        Ok(DemoBase {
            cid: hanzod_protocol::cid::cid_of(&weights).to_string(),
            weights,
        })
    }
}

/// A chain a demo runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DemoChain {
    /// Its JSON-RPC endpoint.
    pub url: String,
    /// The adapter options (contracts, chain id, first block).
    pub options: hanzod_adapters::chain::EvmOptions,
}

/// What a demo on a chain saw there.
#[derive(Debug, Clone, Serialize)]
pub struct ChainSummary {
    /// The JSON-RPC endpoint the orchestrator used.
    pub rpc: String,
    /// The `GYMToken` contract.
    pub gym_token: String,
    /// The `MiningPool` contract.
    pub mining_pool: String,
    /// The orchestrator's account.
    pub orchestrator_account: String,
    /// Requests the endpoint refused while it was down (`--chain-outage-epoch`).
    pub refused_during_outage: u64,
    /// Reward batches on chain for the job.
    pub reward_batches: usize,
    /// Publication records on chain for the job.
    pub publications: usize,
}

/// Why the demo could not run (distinct from a run whose job failed: see
/// [`DemoSummary::phase`]).
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// The flags or the scenario file are unusable.
    #[error("{0}")]
    Usage(String),
    /// Setting up failed (output folder, daemon, node processes).
    #[error("{0}")]
    Setup(String),
    /// The WAN test bed could not be brought up ([`DemoArgs::testbed`]);
    /// [`TestbedError::is_unsupported`](crate::testbed::TestbedError::is_unsupported) tells
    /// a machine that cannot host one (not root, no `ip`, namespaces refused).
    #[error("bringing the test bed up: {0}")]
    Testbed(crate::testbed::TestbedError),
}

impl DemoArgs {
    /// The plan: flags over the scenario file over the defaults, validated.
    ///
    /// Errors: [`DemoError::Usage`] naming the flag at fault.
    pub fn plan(&self, exe: PathBuf) -> Result<DemoPlan, DemoError> {
        let file = match &self.scenario {
            None => DemoArgs::default(),
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| DemoError::Usage(format!("scenario {}: {e}", path.display())))?;
                toml::from_str::<DemoArgs>(&text)
                    .map_err(|e| DemoError::Usage(format!("scenario {}: {e}", path.display())))?
            }
        };
        let model = self
            .model
            .clone()
            .or(file.model)
            .unwrap_or_else(|| hanzod_train::MODEL_NAME.to_string());
        // qwen3-tiny's defaults were tuned on this repository's 2-core machine so the run
        // visibly learns in about two minutes (README, "Language models"): AdamW restarts
        // every epoch, so fewer, longer epochs learn more per second than many short ones.
        let lm = model == hanzod_train::lm::QWEN3_TINY;
        let out = self
            .out
            .clone()
            .or(file.out)
            .unwrap_or_else(|| PathBuf::from("hanzod-demo"));
        let base = self
            .base
            .clone()
            .or(file.base)
            .map(|b| DemoBase::read(&b, &out))
            .transpose()?;
        let epochs = self
            .epochs
            .or(file.epochs)
            .unwrap_or(if lm { 8 } else { 5 });
        let testbed = match self.testbed.clone().or(file.testbed) {
            None => None,
            Some(path) => {
                let usage = |e: &dyn std::fmt::Display| {
                    DemoError::Usage(format!("--testbed {}: {e}", path.display()))
                };
                let text = std::fs::read_to_string(&path).map_err(|e| usage(&e))?;
                Some(Topology::from_toml_str(&text).map_err(|e| usage(&e))?)
            }
        };
        let plan = DemoPlan {
            nodes: self
                .nodes
                .or(file.nodes)
                .or(testbed.as_ref().map(Topology::node_count))
                .unwrap_or(if lm { 4 } else { 8 }),
            epochs,
            kill: self.kill.or(file.kill).unwrap_or(0),
            kill_epoch: self
                .kill_epoch
                .or(file.kill_epoch)
                .unwrap_or(if epochs > 1 { 1 } else { 0 }),
            kill_at: self.kill_at.or(file.kill_at).unwrap_or_default(),
            byzantine: self.byzantine.or(file.byzantine).unwrap_or(0),
            attack: self.attack.or(file.attack).unwrap_or(Attack::Mixed),
            model: model.clone(),
            lora: self.lora || file.lora,
            aggregation: match self.aggregation.clone().or(file.aggregation).as_deref() {
                None | Some("star") => Aggregation::Star,
                Some("ring") => Aggregation::Ring,
                Some(other) => {
                    return Err(DemoError::Usage(format!(
                        "--aggregation must be star or ring, got {other:?}"
                    )))
                }
            },
            base,
            local_steps: self.local_steps.or(file.local_steps).unwrap_or(if lm {
                LM_RECIPE.local_steps
            } else {
                20
            }),
            batch_size: self.batch_size.or(file.batch_size).unwrap_or(if lm {
                LM_RECIPE.batch_size
            } else {
                32
            }),
            local_lr: self.local_lr.or(file.local_lr).unwrap_or(if lm {
                LM_RECIPE.local_lr
            } else {
                0.05
            }),
            spot_check_rate: self.spot_check_rate.or(file.spot_check_rate).unwrap_or(0.5),
            seed: self.seed.or(file.seed).unwrap_or(1),
            out,
            timeout_s: self.timeout_s.or(file.timeout_s).unwrap_or(600),
            exe,
            progress: true,
            anvil: self.anvil || file.anvil,
            chain_outage: self
                .chain_outage_epoch
                .or(file.chain_outage_epoch)
                .map(|e| (e, self.chain_outage_s.or(file.chain_outage_s).unwrap_or(5))),
            chain: None,
            testbed,
        };
        plan.validate()?;
        Ok(plan)
    }
}

impl DemoPlan {
    fn validate(&self) -> Result<(), DemoError> {
        let bad = |m: String| Err(DemoError::Usage(m));
        if !(1..=64).contains(&self.nodes) {
            return bad(format!("--nodes must be within 1..=64, got {}", self.nodes));
        }
        if !(1..=1000).contains(&self.epochs) {
            return bad(format!(
                "--epochs must be within 1..=1000, got {}",
                self.epochs
            ));
        }
        if self.kill + self.byzantine >= self.nodes {
            return bad(format!(
                "--kill {} + --byzantine {} must leave at least one honest node alive of --nodes {}",
                self.kill, self.byzantine, self.nodes
            ));
        }
        if matches!(
            self.attack,
            Attack::TamperAllreduce | Attack::FreeRide | Attack::Substitute
        ) && self.byzantine > 0
            && self.aggregation != Aggregation::Ring
        {
            return bad(
                "--attack tamper-allreduce, substitute and free-ride need --aggregation ring"
                    .into(),
            );
        }
        if self.lora && self.aggregation == Aggregation::Ring {
            return bad(
                "--aggregation ring needs full-parameter training (not --lora): adapters merge as B·A products, not as sums".into(),
            );
        }
        if self.kill > 0 && self.kill_epoch >= self.epochs {
            return bad(format!(
                "--kill-epoch {} must be below --epochs {}",
                self.kill_epoch, self.epochs
            ));
        }
        if self.kill_at == KillAt::Reduce && self.aggregation != Aggregation::Ring {
            return bad("--kill-at reduce needs --aggregation ring (a star has no round)".into());
        }
        if let Some(t) = &self.testbed {
            t.validate()
                .map_err(|e| DemoError::Usage(format!("--testbed: {e}")))?;
            if t.node_count() != self.nodes {
                return bad(format!(
                    "--testbed has {} nodes but --nodes is {}: give --nodes {}",
                    t.node_count(),
                    self.nodes,
                    t.node_count()
                ));
            }
            if let Some(r) = t.regions.iter().find(|r| !valid_region(&r.name)) {
                return bad(format!(
                    "--testbed region {:?}: a node's region must be 1..=64 characters of [a-z0-9-]",
                    r.name
                ));
            }
        }
        if !(0.0..=1.0).contains(&self.spot_check_rate) {
            return bad(format!(
                "--spot-check-rate must be within [0, 1], got {}",
                self.spot_check_rate
            ));
        }
        if !(self.local_lr.is_finite() && self.local_lr > 0.0) {
            return bad(format!(
                "--local-lr must be a positive number, got {}",
                self.local_lr
            ));
        }
        if self.timeout_s == 0 {
            return bad("--timeout-s must be at least 1".into());
        }
        if let Some((epoch, secs)) = self.chain_outage {
            if !self.anvil && self.chain.is_none() {
                return bad(
                    "--chain-outage-epoch needs --anvil (the embedded ledger cannot go down)"
                        .into(),
                );
            }
            if epoch >= self.epochs {
                return bad(format!(
                    "--chain-outage-epoch {epoch} must be below --epochs {}",
                    self.epochs
                ));
            }
            if secs == 0 {
                return bad("--chain-outage-s must be at least 1".into());
            }
        }
        if ![hanzod_train::MODEL_NAME, hanzod_train::lm::QWEN3_TINY].contains(&self.model.as_str())
        {
            return bad(format!(
                "--model must be {} or {}, got {:?}",
                hanzod_train::MODEL_NAME,
                hanzod_train::lm::QWEN3_TINY,
                self.model
            ));
        }
        if self.lora && self.model != hanzod_train::lm::QWEN3_TINY {
            return bad(format!(
                "--lora needs --model {}",
                hanzod_train::lm::QWEN3_TINY
            ));
        }
        let trainer = hanzod_train::trainer_of(&self.training(), JobId(1))
            .map_err(|e| DemoError::Usage(format!("training recipe: {e}")))?;
        if let Some(base) = &self.base {
            hanzod_train::Weights::from_safetensors(&base.weights, trainer.layout()).map_err(
                |e| {
                    DemoError::Usage(format!(
                        "--base {}: not a {} checkpoint: {e}",
                        base.cid, self.model
                    ))
                },
            )?;
        }
        Ok(())
    }

    /// The job's training recipe: the plan's model, steps, batch, learning rate and seed;
    /// for `qwen3-tiny`, the sequences and validation shard of [`LM_RECIPE`], and
    /// with `--lora` the adapter of [`DemoArgs::lora`] (the rest of
    /// [`TrainingSpec::default`]).
    pub fn training(&self) -> TrainingSpec {
        let lm = self.model == hanzod_train::lm::QWEN3_TINY;
        let d = TrainingSpec::default();
        let (mode, lora) = if self.lora {
            (
                TrainMode::Lora,
                LoraSpec {
                    rank: 16,
                    alpha: 32.0,
                    target_modules: hanzod_protocol::model::LINEAR_MODULES
                        .map(String::from)
                        .to_vec(),
                    dropout: 0.0,
                },
            )
        } else {
            (d.mode, d.lora.clone())
        };
        TrainingSpec {
            mode,
            lora,
            model: self.model.clone(),
            dataset: if lm {
                hanzod_train::text::AUSTEN.into()
            } else {
                d.dataset.clone()
            },
            local_steps: self.local_steps,
            batch_size: self.batch_size,
            local_lr: self.local_lr,
            seed: self.seed,
            seq_len: if lm { LM_RECIPE.seq_len } else { d.seq_len },
            validation_tokens: if lm {
                LM_RECIPE.validation_tokens
            } else {
                d.validation_tokens
            },
            base: self.base.as_ref().map(|b| b.cid.clone()),
            aggregation: self.aggregation,
            ..d
        }
    }

    /// The ring faults of the nodes (index → fault): the Byzantine nodes' under
    /// `--attack tamper-allreduce` or `free-ride`, honest otherwise; the same nodes
    /// [`DemoPlan::roles`] makes Byzantine.
    pub fn ring_faults(&self) -> Vec<RingFault> {
        let mut order: Vec<usize> = (0..self.nodes).collect();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(self.seed);
        order.shuffle(&mut rng);
        let fault = match self.attack {
            Attack::TamperAllreduce => RingFault::TamperAllreduce { perturbation: 1.0 },
            Attack::FreeRide => RingFault::FreeRide,
            Attack::Substitute => RingFault::Substitute {
                perturbation: 0.001,
            },
            _ => RingFault::Honest,
        };
        let mut faults = vec![RingFault::Honest; self.nodes];
        for &i in order.iter().take(self.byzantine) {
            faults[i] = fault;
        }
        faults
    }

    /// The node roles: index → behaviour, and the indices killed, drawn from the seed. The
    /// attack suite's values are [`Behaviour::Attack`] ([`Attack::suite`]).
    pub fn roles(&self) -> (Vec<Behaviour>, Vec<usize>) {
        let mut order: Vec<usize> = (0..self.nodes).collect();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(self.seed);
        order.shuffle(&mut rng);
        let mut behaviours = vec![Behaviour::Honest; self.nodes];
        for (k, &i) in order.iter().take(self.byzantine).enumerate() {
            let poison = match self.attack {
                Attack::Poison => true,
                Attack::LieLoss => false,
                Attack::Mixed => k % 2 == 0,
                // A ring fault ([`DemoPlan::ring_faults`]) trains honestly.
                Attack::TamperAllreduce | Attack::FreeRide | Attack::Substitute => continue,
                suite => {
                    if let Some(attack) = suite.suite() {
                        behaviours[i] = Behaviour::Attack { attack };
                    }
                    continue;
                }
            };
            behaviours[i] = if poison {
                Behaviour::Poison { scale: 10.0 }
            } else {
                Behaviour::LieLoss { factor: 0.5 }
            };
        }
        let mut killed: Vec<usize> = order
            .iter()
            .skip(self.byzantine)
            .take(self.kill)
            .copied()
            .collect();
        killed.sort_unstable();
        (behaviours, killed)
    }
}

/// One epoch in the summary.
#[derive(Debug, Clone, Serialize)]
pub struct EpochLine {
    /// The epoch.
    pub epoch: u32,
    /// Validation loss of its base checkpoint.
    pub loss_before: f64,
    /// Validation loss of the checkpoint it published.
    pub loss_after: f64,
    /// Deltas accepted.
    pub accepted: usize,
    /// Deltas rejected.
    pub rejected: usize,
    /// Accepted deltas that were suspect (no weight under the weighted mean).
    pub suspect: usize,
    /// Spot-checks run, and how many failed.
    pub spot_checks: usize,
    /// Failed spot-checks.
    pub spot_check_failures: usize,
    /// The aggregator (`weighted-mean`, `median`, or `kept`).
    pub aggregator: String,
    /// The checkpoint's CID.
    pub checkpoint: String,
    /// Where the Hugging Face repo folder of the checkpoint is.
    pub published: Option<String>,
    /// Wall time from the epoch's start to its checkpoint, ms.
    pub ms: u64,
    /// On a test bed: the bytes the orchestrator's interface received from the epoch's
    /// start to the next one's (or to Published), on the wire (frames: every upload,
    /// sketch, heartbeat and request, with their TCP/IP headers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orchestrator_rx_bytes: Option<u64>,
}

/// One node in the summary.
#[derive(Debug, Clone, Serialize)]
pub struct NodeLine {
    /// Index (0-based) in the run.
    pub index: usize,
    /// Node id (hex).
    pub node: String,
    /// Its behaviour.
    pub behaviour: Behaviour,
    /// Its ring fault (ring aggregation only).
    pub ring_fault: RingFault,
    /// Killed during the run.
    pub killed: bool,
    /// Deltas accepted by validation.
    pub accepted: usize,
    /// Deltas rejected by validation.
    pub rejected: usize,
    /// Deltas accepted but suspect (no weight in the merge, no reward).
    pub suspect: usize,
    /// Spot-checks passed.
    pub spot_checks_passed: usize,
    /// Spot-checks failed.
    pub spot_checks_failed: usize,
    /// Rewards received, GYM wei (decimal string).
    pub rewards_wei: String,
    /// Stake slashed, GYM wei (decimal string).
    pub slashed_wei: String,
    /// Stake at the end, GYM wei (decimal string).
    pub stake_wei: String,
}

/// The outcome of a demo run.
#[derive(Debug, Clone, Serialize)]
pub struct DemoSummary {
    /// The plan that ran.
    pub plan: DemoPlan,
    /// The job id.
    pub job: u64,
    /// The job's final phase name (`Published` on success).
    pub phase: String,
    /// Why it failed, when it did.
    pub failure: Option<String>,
    /// Wall time from submission to the end, ms.
    pub wall_ms: u64,
    /// Validation loss of the initial weights.
    pub initial_loss: Option<f64>,
    /// Per epoch.
    pub epochs: Vec<EpochLine>,
    /// Per node.
    pub nodes: Vec<NodeLine>,
    /// Ring versions recorded (formation is 1).
    pub ring_version: u64,
    /// Ms from each kill to the ring without the killed nodes.
    pub ring_repair_ms: Vec<u64>,
    /// On a test bed: the bytes the orchestrator's interface received from the job's
    /// submission to Published, on the wire (the per-epoch figures,
    /// [`EpochLine::orchestrator_rx_bytes`], split it at the epoch notices, which can
    /// lag epochs of a few ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orchestrator_rx_bytes: Option<u64>,
    /// Mean validation time per delta over the run, ms (aggregation time / deltas).
    pub aggregation_ms_per_delta: Option<f64>,
    /// Where the run's files are.
    pub out: PathBuf,
    /// The orchestrator's public key (hex): the signer of the publication records.
    pub orchestrator: String,
    /// The chain, when the demo ran on one (`--anvil`).
    pub chain: Option<ChainSummary>,
    /// A language model's greedy continuation of [`SAMPLE_PROMPT`] by the first and the
    /// last published checkpoint: `(epoch, continuation)`.
    #[serde(default)]
    pub samples: Vec<(u32, String)>,
}

/// The prompt a language-model demo continues with its first and last checkpoint.
pub const SAMPLE_PROMPT: &str = "It is a truth universally acknowledged, that";

/// Tokens of each demo continuation.
const SAMPLE_TOKENS: usize = 24;

/// The greedy continuations of [`SAMPLE_PROMPT`] by the first and the last published
/// checkpoint of a language-model run (empty for the MLP, or when a folder cannot be read).
fn samples(plan: &DemoPlan, job: JobId, epochs: &[EpochLine]) -> Vec<(u32, String)> {
    let Ok(hanzod_train::Trainer::Lm(task)) = hanzod_train::trainer_of(&plan.training(), job)
    else {
        return Vec::new();
    };
    let tokenizer = task.data().tokenizer();
    let prompt = tokenizer.encode(SAMPLE_PROMPT);
    let mut picks: Vec<&EpochLine> = epochs.iter().take(1).collect();
    picks.extend(epochs.iter().skip(1).last());
    picks
        .into_iter()
        .filter_map(|e| {
            let dir = PathBuf::from(e.published.as_ref()?);
            let bytes = std::fs::read(dir.join("model.safetensors")).ok()?;
            let w = hanzod_train::Weights::from_safetensors(&bytes, task.layout()).ok()?;
            let greedy = hanzod_train::qwen3::Sampling {
                temperature: 0.0,
                seed: 0,
            };
            let new = task
                .model()
                .generate(&w, &prompt, SAMPLE_TOKENS, greedy, Some(tokenizer.eos_id()))
                .ok()?;
            Some((e.epoch, tokenizer.decode(&new)))
        })
        .collect()
}

impl DemoSummary {
    /// True when the job reached Published.
    pub fn succeeded(&self) -> bool {
        self.phase == "Published"
    }

    /// Whether the job's training improved the model, stopped improving, got worse or never
    /// trained ([`hanzod_actors::job::progress`] over the epoch lines; an epoch whose
    /// aggregator is `kept` kept its base).
    pub fn progress(&self) -> hanzod_actors::job::Progress {
        use hanzod_actors::job::{EpochOutcome, EpochSummary};
        let summaries = self
            .epochs
            .iter()
            .map(|e| {
                let outcome = match e.aggregator.as_str() {
                    "kept" => EpochOutcome::Kept {
                        reason: "kept".into(),
                    },
                    a => EpochOutcome::Advanced {
                        aggregator: a.to_string(),
                    },
                };
                let summary = EpochSummary {
                    outcome,
                    loss_before: e.loss_before,
                    loss_after: e.loss_after,
                    ..EpochSummary::default()
                };
                (e.epoch, summary)
            })
            .collect();
        hanzod_actors::job::progress(&summaries)
    }
}

/// A node process and what the demo knows about it.
struct NodeProc {
    id: NodeId,
    behaviour: Behaviour,
    ring_fault: RingFault,
    child: Option<tokio::process::Child>,
    /// The node's stdin: while the demo holds it the node runs (`--parent-stdin`), so a
    /// demo that dies, however it dies, takes its nodes with it.
    _lifeline: Option<tokio::process::ChildStdin>,
    killed: bool,
    status: String,
}

/// The file that marks a folder as the demo's own (`--out`).
pub const MARKER: &str = ".hanzod-demo";

/// Makes `out` the demo's folder: creates it with the [`MARKER`], or accepts it when the
/// marker is there (then the previous run's `ipfs/`, `models/` and `collude/` are removed:
/// the same seed republishes the same checkpoints, another would conflict; the colluders'
/// deltas of another run's job of the same id must not be read).
///
/// The folder is locked (an exclusive lock on `<out>/.hanzod-demo.lock`) for as long as
/// the returned [`OutLock`] lives: hold it for the whole run, so a second demo into the same
/// folder is refused rather than sharing its keys and overwriting its results.
///
/// Errors: [`DemoError::Usage`] when `out` is a file, a non-empty folder without the
/// marker (the demo never deletes what it did not make), or a folder another demo holds;
/// [`DemoError::Setup`] on I/O.
pub fn prepare_out(out: &Path) -> Result<OutLock, DemoError> {
    let setup = |p: &Path, e: std::io::Error| DemoError::Setup(format!("{}: {e}", p.display()));
    let marker = out.join(MARKER);
    if out.exists() && !out.is_dir() {
        return Err(DemoError::Usage(format!(
            "--out {} is not a folder",
            out.display()
        )));
    }
    let foreign = std::fs::read_dir(out)
        .map(|mut d| d.any(|e| e.is_ok_and(|e| e.file_name() != LOCK)))
        .unwrap_or(false)
        && !marker.exists();
    if foreign {
        return Err(DemoError::Usage(format!(
            "--out {} is not empty and was not made by hanzod demo; name a new folder",
            out.display()
        )));
    }
    std::fs::create_dir_all(out).map_err(|e| setup(out, e))?;
    let lock_path = out.join(LOCK);
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| setup(&lock_path, e))?;
    match lock.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            return Err(DemoError::Usage(format!(
                "another hanzod demo is running in {}; wait for it or name another --out",
                out.display()
            )))
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(setup(&lock_path, e)),
    }
    std::fs::write(
        &marker,
        "made by hanzod demo; each run replaces ipfs/, models/ and collude/ here\n",
    )
    .map_err(|e| setup(&marker, e))?;
    for sub in ["ipfs", "models", COLLUDE_DIR] {
        let dir = out.join(sub);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|e| setup(&dir, e))?;
        }
    }
    Ok(OutLock(lock))
}

/// The file whose lock marks a demo folder in use ([`prepare_out`]).
pub const LOCK: &str = ".hanzod-demo.lock";

/// A demo folder held for one run: its lock is released when this is dropped.
#[derive(Debug)]
pub struct OutLock(#[allow(dead_code)] std::fs::File);

/// The deterministic identity of node `i` of a run with `seed`.
pub fn node_identity(seed: u64, i: usize) -> Identity {
    let mut h = Sha256::new();
    h.update(hanzod_actors::domain::DEMO_NODE);
    h.update(seed.to_le_bytes());
    h.update((i as u64).to_le_bytes());
    Identity::from_seed(h.finalize().into())
}

/// The demo orchestrator's secret key for `seed` (64 hex digits): derived from the seed, so
/// runs of one seed sign with one key.
pub fn orchestrator_key(seed: u64) -> String {
    let mut h = Sha256::new();
    h.update(hanzod_actors::domain::DEMO_ORCHESTRATOR);
    h.update(seed.to_le_bytes());
    hex::encode(h.finalize())
}

/// The stake each demo node's operator holds on a demo chain: 20,000 GYM (twice the
/// minimum, so a slashed operator stays eligible to be slashed again).
pub const DEMO_NODE_STAKE: GymWei = GymWei::gym(20_000);

/// Stakes a demo's accounts on `deployment`: the orchestrator's (50,000 GYM, the minimum
/// to lead) and, for each node of `plan`, an operator account holding
/// [`DEMO_NODE_STAKE`] with the node key bound to it.
///
/// Errors: a transaction failing.
pub async fn stake_accounts(
    plan: &DemoPlan,
    deployment: &crate::anvil::Deployment,
) -> Result<(), crate::anvil::AnvilError> {
    let orchestrator = Identity::from_hex(&orchestrator_key(plan.seed), "the demo key")
        .map_err(|e| crate::anvil::AnvilError::Key(std::sync::Arc::new(e)))?;
    deployment
        .fund_and_stake(
            &hanzod_adapters::chain::account::signer(&orchestrator),
            hanzod_adapters::chain::ORCHESTRATOR_MIN_STAKE,
        )
        .await?;
    for i in 0..plan.nodes {
        deployment
            .stake_and_bind(&node_identity(plan.seed, i).node_id(), DEMO_NODE_STAKE)
            .await?;
    }
    Ok(())
}

/// What the chain holds for the demo's job, once every epoch is settled there (waited for
/// up to 60 s: a settlement cut short by an outage is retried by the daemon); `refused`:
/// the requests the endpoint refused while it was down.
async fn chain_summary(
    cfg: &Config,
    d: &Daemon,
    summary: &DemoSummary,
    refused: u64,
) -> ChainSummary {
    let ledger = d.ledger();
    let job = JobId(summary.job);
    let want_paid: Vec<u32> = summary
        .epochs
        .iter()
        .filter(|e| e.aggregator != "kept")
        .map(|e| e.epoch)
        .collect();
    let want_records = summary.epochs.len();
    let until = Instant::now() + Duration::from_secs(60);
    let (mut batches, mut records) = (0, 0);
    loop {
        if let (Ok(b), Ok(p)) = (ledger.reward_batches().await, ledger.publications().await) {
            batches = b.iter().filter(|r| r.job == job).count();
            records = p.iter().filter(|r| r.record.job == job).count();
            let paid = want_paid
                .iter()
                .all(|e| b.iter().any(|r| r.job == job && r.epoch == *e));
            if paid && records >= want_records {
                break;
            }
        }
        if Instant::now() >= until {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let orchestrator = Identity::from_hex(&cfg.orchestrator.key, "the demo key")
        .map(|i| hanzod_adapters::chain::account::address(&i).to_string())
        .unwrap_or_default();
    ChainSummary {
        rpc: cfg.redacted().chain.rpc_url,
        gym_token: cfg.chain.gym_token.clone(),
        mining_pool: cfg.chain.mining_pool.clone(),
        orchestrator_account: orchestrator,
        refused_during_outage: refused,
        reward_batches: batches,
        publications: records,
    }
}

/// The daemon configuration of a demo: the embedded defaults, on loopback, with timings
/// short enough for a demo (heartbeat 1 s, failure after 3 s, assignments resent every
/// 2 s, probes of 256 KiB).
pub fn demo_config(plan: &DemoPlan) -> Result<Config, DemoError> {
    let mut cfg = Config::load(None, |_| None).map_err(|e| DemoError::Setup(e.to_string()))?;
    cfg.server.grpc_addr = "127.0.0.1:0".into();
    cfg.server.metrics_addr = String::new();
    cfg.core.heartbeat.interval_ms = 1000;
    cfg.core.heartbeat.timeout_ms = 3000;
    cfg.core.ring.resync_ms = 2000;
    cfg.core.scheduler.tick_ms = 100;
    cfg.core.probe.peers_per_node = 2;
    cfg.nodes.probe_bytes = 256 << 10;
    // One fetch and one upload per node can be in flight at once.
    cfg.deltas.max_concurrent_uploads = 2 * plan.nodes.max(1);
    cfg.validation.spot_check_rate = plan.spot_check_rate;
    cfg.orchestrator.key = orchestrator_key(plan.seed);
    // The demo's log is its own and each run replaces its folders, so its job is job 1
    // (the printed verify command names `wine-mlp-job-1-epoch-…`).
    cfg.core.first_job_id = 1;
    let out = plan.out.display().to_string();
    cfg.data_dir = out.clone();
    cfg.publish.object_dir = format!("{out}/ipfs");
    cfg.publish.registry_dir = format!("{out}/models");
    cfg.check().map_err(DemoError::Setup)?;
    Ok(cfg)
}

/// The file in `--out` holding the ledger's signed publication records (a JSON array of
/// [`hanzod_protocol::record::SignedPublication`]).
pub const PUBLICATIONS_FILE: &str = "publications.json";

/// Writes every publication record `ledger` holds to `path` as a JSON array.
async fn export_publications(
    ledger: &dyn hanzod_actors::ports::Ledger,
    path: &Path,
) -> Result<(), DemoError> {
    let setup =
        |e: &dyn std::fmt::Display| DemoError::Setup(format!("writing {}: {e}", path.display()));
    let records = ledger.publications().await.map_err(|e| setup(&e))?;
    let json = serde_json::to_vec_pretty(&records).map_err(|e| setup(&e))?;
    std::fs::write(path, json).map_err(|e| setup(&e))
}

/// An event a node process printed (one JSON object per line, `hanzod node --json`).
struct NodeEvent {
    index: usize,
    event: serde_json::Value,
}

/// Runs the demo (module docs) and returns its summary; the job's outcome is in
/// [`DemoSummary::phase`].
///
/// Errors: [`DemoError`] when the run could not be set up.
pub async fn run(plan: DemoPlan) -> Result<DemoSummary, DemoError> {
    let lock = prepare_out(&plan.out)?;
    run_in(plan, lock).await
}

/// [`run`] in a folder [`prepare_out`] already prepared and locked (held until the run
/// ends).
///
/// Errors: [`DemoError`] when the run could not be set up.
pub async fn run_in(plan: DemoPlan, _lock: OutLock) -> Result<DemoSummary, DemoError> {
    let setup = |what: &str, e: &dyn std::fmt::Display| DemoError::Setup(format!("{what}: {e}"));
    let keys = plan.out.join("keys");
    let logs = plan.out.join("logs");
    for dir in [&keys, &logs] {
        std::fs::create_dir_all(dir).map_err(|e| setup(&dir.display().to_string(), &e))?;
    }
    let mut cfg = demo_config(&plan)?;
    // The base checkpoint goes into the (fresh) object store, where the daemon and the
    // nodes fetch it by its CID.
    if let Some(base) = &plan.base {
        use hanzod_store::ObjectStore;
        let store = hanzod_store::FsObjectStore::open(&cfg.publish.object_dir)
            .await
            .map_err(|e| setup("opening the object store", &e))?;
        let cid = store
            .put(base.weights.clone())
            .await
            .map_err(|e| setup("storing the base checkpoint", &e))?;
        if cid != base.cid {
            return Err(DemoError::Setup(format!(
                "the base checkpoint stored as {cid}, not {}",
                base.cid
            )));
        }
    }
    // The chain: the caller's, or a fresh anvil with everything staked and bound (kept
    // alive until the demo ends), or none (the embedded ledger).
    let mut _anvil = None;
    let mut chain = plan.chain.clone();
    if plan.anvil && chain.is_none() {
        {
            use crate::anvil::{AnvilNode, DeployOptions, Deployment};
            let node = AnvilNode::start()
                .await
                .map_err(|e| setup("starting anvil", &e))?;
            let deployment = Deployment::deploy(&node.url(), &DeployOptions::default())
                .await
                .map_err(|e| setup("deploying the contracts", &e))?;
            stake_accounts(&plan, &deployment)
                .await
                .map_err(|e| setup("staking the demo accounts", &e))?;
            chain = Some(DemoChain {
                url: node.url(),
                options: deployment.options(),
            });
            _anvil = Some(node);
        }
    }
    let proxy = match (&chain, plan.chain_outage) {
        (Some(c), Some(_)) => Some(std::sync::Arc::new(
            crate::anvil::RpcProxy::start(&c.url)
                .await
                .map_err(|e| setup("starting the RPC endpoint", &e))?,
        )),
        _ => None,
    };
    if let Some(c) = &chain {
        let url = proxy.as_ref().map_or_else(|| c.url.clone(), |p| p.url());
        cfg.chain.rpc_url = url;
        cfg.chain.chain_id = c.options.chain_id;
        cfg.chain.gym_token = c.options.token.to_string();
        cfg.chain.mining_pool = c.options.pool.to_string();
        cfg.chain.from_block = c.options.from_block;
        // Fail fast while the endpoint is down: the writes are retried.
        cfg.chain.call_timeout_ms = 2_000;
        cfg.chain.tx_timeout_ms = 10_000;
        cfg.check().map_err(DemoError::Setup)?;
    }
    // The WAN test bed: up for the whole run (dropping it, also on an early return,
    // removes it and kills whatever runs inside), and the orchestrator listening in it.
    let bed = match &plan.testbed {
        None => None,
        Some(t) => {
            let t = t.clone();
            let bed = tokio::task::spawn_blocking(move || Testbed::up(&t))
                .await
                .map_err(|e| setup("bringing the test bed up", &e))?
                .map_err(DemoError::Testbed)?;
            Some(bed)
        }
    };
    let (daemon, endpoint) = match &bed {
        None => {
            let d = Daemon::start(&cfg)
                .await
                .map_err(|e| setup("starting the orchestrator", &e))?;
            let endpoint = format!("http://{}", d.grpc_addr);
            (d, endpoint)
        }
        Some(bed) => start_in_bed(&cfg, bed).await?,
    };
    let outage = proxy.clone().zip(plan.chain_outage);
    let mut result = drive(
        &plan,
        &daemon,
        &endpoint,
        bed.as_ref(),
        &keys,
        &logs,
        outage,
    )
    .await;
    if let (Ok(summary), Some(_)) = (&mut result, &chain) {
        let refused = proxy.as_ref().map_or(0, |p| p.refused());
        summary.chain = Some(chain_summary(&cfg, &daemon, summary, refused).await);
        // Settled now: what the chain holds for each node.
        let ids: Vec<NodeId> = (0..plan.nodes)
            .map(|i| node_identity(plan.seed, i).node_id())
            .collect();
        let index_of: HashMap<NodeId, usize> =
            ids.iter().enumerate().map(|(i, n)| (*n, i)).collect();
        ledger_columns(&mut summary.nodes, &ids, &*daemon.ledger(), &index_of).await;
    }
    // The embedded ledger lives in the daemon: its publication records are written out so
    // that `hanzod verify <folder> --records <out>/publications.json` can check the
    // published models after the demo.
    let exported = export_publications(&*daemon.ledger(), &plan.out.join(PUBLICATIONS_FILE)).await;
    daemon.stop().await;
    drop(bed);
    exported?;
    result
}

/// Starts the orchestrator serving gRPC on the test bed's orchestrator address (a
/// listener opened inside its namespace; the daemon's own outgoing connections, to a
/// chain say, stay in this process's namespace). Returns it and the endpoint the nodes
/// dial.
async fn start_in_bed(cfg: &Config, bed: &Testbed) -> Result<(Daemon, String), DemoError> {
    let listen = |e: &dyn std::fmt::Display| {
        DemoError::Setup(format!(
            "listening in the test bed's orchestrator namespace: {e}"
        ))
    };
    let netns = bed.netns(Endpoint::Orchestrator).to_string();
    let ip = bed.addr(Endpoint::Orchestrator);
    let listener = tokio::task::spawn_blocking(move || {
        crate::testbed::in_namespace(&netns, || std::net::TcpListener::bind((ip, 0)))
    })
    .await
    .map_err(|e| listen(&e))?
    .map_err(|e| listen(&e))?
    .map_err(|e| listen(&e))?;
    listener.set_nonblocking(true).map_err(|e| listen(&e))?;
    let addr = listener.local_addr().map_err(|e| listen(&e))?;
    let listener = tokio::net::TcpListener::from_std(listener).map_err(|e| listen(&e))?;
    // As the daemon's own TCP listener does: small messages must not wait for Nagle.
    let incoming = futures_util::StreamExt::map(
        tokio_stream::wrappers::TcpListenerStream::new(listener),
        |r| {
            r.map(|s| {
                let _ = s.set_nodelay(true);
                Box::new(s) as Box<dyn hanzod_protocol::client::Io>
            })
        },
    );
    let daemon = Daemon::start_with_incoming(
        cfg,
        incoming,
        std::sync::Arc::new(hanzod_actors::ports::SystemClock),
    )
    .await
    .map_err(|e| setup("starting the orchestrator".into(), &e))?;
    Ok((daemon, format!("http://{addr}")))
}

/// The endpoint to take down and when: (the proxy in front of the chain, (epoch, s)).
type Outage = Option<(std::sync::Arc<crate::anvil::RpcProxy>, (u32, u64))>;

/// A setup failure: what was being done, and why it failed.
fn setup(what: String, e: &dyn std::fmt::Display) -> DemoError {
    DemoError::Setup(format!("{what}: {e}"))
}

/// The regions the demo's nodes declare, in turn.
const REGIONS: [&str; 3] = ["eu-west", "us-east", "ap-south"];

/// Starts one `hanzod node` process per behaviour, each with its key in `keys` and its log
/// and events in `logs`; their JSON events arrive on `tx`.
fn spawn_nodes(
    plan: &DemoPlan,
    endpoint: &str,
    bed: Option<&Testbed>,
    keys: &Path,
    logs: &Path,
    behaviours: &[Behaviour],
    tx: &mpsc::Sender<NodeEvent>,
) -> Result<Vec<NodeProc>, DemoError> {
    let faults = plan.ring_faults();
    let bed_regions = plan
        .testbed
        .as_ref()
        .map(Topology::node_regions)
        .unwrap_or_default();
    // The colluders' side channel: emptied, so that no delta of an earlier run (whose job
    // had the same id) is read as a colluder's.
    let collude = plan.out.join(COLLUDE_DIR);
    let colluders = behaviours
        .iter()
        .filter(|b| matches!(b, Behaviour::Attack { attack } if attack.colludes()))
        .count();
    if collude.exists() {
        std::fs::remove_dir_all(&collude).map_err(|e| setup(collude.display().to_string(), &e))?;
    }
    let mut nodes: Vec<NodeProc> = Vec::new();
    for (i, behaviour) in behaviours.iter().enumerate() {
        let identity = node_identity(plan.seed, i);
        let key = keys.join(format!("node-{i}.key"));
        identity
            .save(&key, true)
            .map_err(|e| setup(key.display().to_string(), &e))?;
        let log = std::fs::File::create(logs.join(format!("node-{i}.log")))
            .map_err(|e| setup(format!("node {i} log"), &e))?;
        // On a test bed the node runs inside its namespace (`ip netns exec` execs it:
        // the child is the node process itself), listens on its address there and
        // declares its region and uplink of the topology.
        let (mut cmd, listen, region, mbps) = match (bed, &plan.testbed) {
            (Some(bed), Some(t)) => (
                bed.command_at(Endpoint::Node(i), &plan.exe, std::iter::empty::<&str>()),
                format!("{}:0", bed.addr(Endpoint::Node(i))),
                bed_regions[i].clone(),
                t.uplink(i).to_string(),
            ),
            _ => (
                tokio::process::Command::new(&plan.exe),
                "127.0.0.1:0".to_string(),
                REGIONS[i % REGIONS.len()].to_string(),
                "1000".to_string(),
            ),
        };
        cmd.arg("node")
            .arg("--key")
            .arg(&key)
            .args(["--listen", &listen, "--json"])
            .args(["--region", &region])
            .args(["--up-mbps", &mbps, "--down-mbps", &mbps])
            // What the demo job asks of each node (min_vram_bytes, 8 GiB).
            .args(["--vram-gib", "8"])
            .args(["--endpoint", endpoint])
            .args(["--backoff-min-ms", "100", "--backoff-max-ms", "2000"])
            .arg("--byzantine")
            .arg(behaviour_flag(behaviour, faults[i]));
        if matches!(behaviour, Behaviour::Attack { attack } if attack.colludes()) {
            cmd.arg("--collude")
                .arg(&collude)
                .args(["--colluders", &colluders.to_string()]);
        }
        cmd.arg("--parent-stdin")
            .env_remove("HANZOD_ENDPOINT")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .kill_on_drop(true);
        let mut child = cmd
            .spawn()
            .map_err(|e| setup(format!("starting node {i} ({})", plan.exe.display()), &e))?;
        if let Some(out) = child.stdout.take() {
            let tx = tx.clone();
            // The node's events are also kept, one JSON object per line.
            let mut events_file =
                std::fs::File::create(logs.join(format!("node-{i}.events.jsonl")))
                    .map_err(|e| setup(format!("node {i} events"), &e))?;
            tokio::spawn(async move {
                use std::io::Write;
                let mut lines = tokio::io::BufReader::new(out).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let _ = writeln!(events_file, "{line}");
                    if let Ok(event) = serde_json::from_str(&line) {
                        if tx.send(NodeEvent { index: i, event }).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
        let lifeline = child.stdin.take();
        nodes.push(NodeProc {
            id: identity.node_id(),
            behaviour: *behaviour,
            ring_fault: faults[i],
            _lifeline: lifeline,
            child: Some(child),
            killed: false,
            status: "starting".into(),
        });
    }
    Ok(nodes)
}

/// Waits until every node registered; a node that exits or stops first, the `deadline`
/// or an interruption end the run.
async fn await_registered(
    plan: &DemoPlan,
    logs: &Path,
    nodes: &mut [NodeProc],
    events: &mut mpsc::Receiver<NodeEvent>,
    interrupted: &mut std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
    deadline: tokio::time::Instant,
) -> Result<(), DemoError> {
    let mut registered = 0usize;
    let mut poll = tokio::time::interval(Duration::from_millis(250));
    while registered < plan.nodes {
        tokio::select! {
            _ = interrupted.as_mut() => {
                return Err(DemoError::Setup("interrupted while the nodes were starting".into()));
            }
            _ = poll.tick() => {
                for (i, n) in nodes.iter_mut().enumerate() {
                    if let Some(Ok(Some(status))) = n.child.as_mut().map(|c| c.try_wait()) {
                        return Err(DemoError::Setup(format!(
                            "node {i} exited ({status}) before registering; see {}",
                            logs.join(format!("node-{i}.log")).display()
                        )));
                    }
                }
            }
            e = events.recv() => {
                let Some(e) = e else { break };
                if e.event["event"] == "registered" {
                    registered += 1;
                    nodes[e.index].status = "registered".into();
                }
                if e.event["event"] == "stopped" {
                    return Err(DemoError::Setup(format!("node {} stopped: {}", e.index, e.event["reason"])));
                }
            }
            _ = tokio::time::sleep_until(deadline) => {
                return Err(DemoError::Setup(format!(
                    "only {registered} of {} nodes registered within {} s (see {})",
                    plan.nodes, plan.timeout_s, logs.display()
                )));
            }
        }
    }
    Ok(())
}

/// The demo's job: the plan's built-in model and recipe, on every node, surviving the nodes
/// the plan kills and the Byzantine ones (a node slashed leaves the ring at the next epoch
/// boundary, DESIGN §3 "Standing", and the demo has no standbys).
fn demo_spec(plan: &DemoPlan) -> JobSpec {
    let training = plan.training();
    JobSpec {
        name: format!("demo: {} on {}", training.model, training.dataset),
        epochs: plan.epochs,
        min_nodes: plan.nodes.saturating_sub(plan.kill + plan.byzantine).max(1) as u32,
        max_nodes: plan.nodes as u32,
        min_vram_bytes: 8 << 30,
        pending_deadline_ms: 60_000,
        epoch_deadline_ms: 60_000,
        utility: 1.0,
        submitter_stake: GymWei::gym(100_000),
        training,
    }
}

/// A running demo job, as its notices and node events arrive.
struct Run<'a> {
    plan: &'a DemoPlan,
    d: &'a Daemon,
    /// The test bed the run is on, if any.
    bed: Option<&'a Testbed>,
    view: &'a View,
    job: JobId,
    nodes: Vec<NodeProc>,
    index_of: HashMap<NodeId, usize>,
    to_kill: Vec<usize>,
    outage: Outage,
    epochs: EpochLog,
    killed_at: Option<Instant>,
    ring_repair_ms: Vec<u64>,
    ring_version: u64,
    node_failures: BTreeMap<usize, String>,
}

/// How the job ended: its phase's name and, when it failed, why.
type Ending = (String, Option<String>);

impl Run<'_> {
    /// Follows the job until it ends, the `deadline` passes or the run is interrupted.
    async fn follow(
        &mut self,
        notices: &mut tokio::sync::broadcast::Receiver<Notice>,
        events: &mut mpsc::Receiver<NodeEvent>,
        interrupted: &mut std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
        deadline: tokio::time::Instant,
    ) -> Ending {
        loop {
            tokio::select! {
                _ = interrupted.as_mut() => {
                    return ("Failed".to_string(), Some("interrupted".to_string()));
                }
                n = notices.recv() => {
                    let n = match n {
                        Ok(n) => n,
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                            // Notices were dropped: the job may have ended meanwhile.
                            match self.d.core.job(self.job).await.map(|v| v.phase) {
                                Ok(JobPhase::Published { .. }) => return self.published().await,
                                Ok(JobPhase::Failed { reason, .. }) => {
                                    return ("Failed".to_string(), Some(reason.to_string()))
                                }
                                _ => continue,
                            }
                        }
                        Err(_) => {
                            return ("Failed".to_string(), Some("the orchestrator stopped".to_string()))
                        }
                    };
                    if let Some(end) = self.on_notice(n).await {
                        return end;
                    }
                }
                e = events.recv() => {
                    if let Some(e) = e {
                        self.on_node_event(e);
                    }
                }
                _ = tokio::time::sleep_until(deadline) => {
                    return (
                        "Failed".to_string(),
                        Some(format!("timed out after {} s", self.plan.timeout_s)),
                    );
                }
            }
        }
    }

    /// The last epoch's report, then `Published`.
    async fn published(&mut self) -> Ending {
        let last = self.plan.epochs - 1;
        if let Some(rx) = orchestrator_rx_bytes(self.bed).await {
            self.epochs.rx_bytes.insert(self.plan.epochs, rx);
        }
        self.epochs
            .finish(
                self.d,
                self.job,
                last,
                self.view,
                &mut self.nodes,
                &self.index_of,
            )
            .await;
        ("Published".to_string(), None)
    }

    /// What a notice of the orchestrator changes; `Some` when the job ended.
    async fn on_notice(&mut self, n: Notice) -> Option<Ending> {
        match n {
            Notice::JobPhase { job, phase } if job == self.job => {
                let now = Instant::now();
                match &phase {
                    // A ring change mid-epoch re-announces the phase: not a new epoch.
                    JobPhase::Running { epoch, .. } if !self.epochs.started.contains_key(epoch) => {
                        self.on_epoch_start(*epoch, now).await;
                    }
                    JobPhase::Aggregating { .. } => self.epochs.aggregating_since = Some(now),
                    JobPhase::Published { .. } => return Some(self.published().await),
                    JobPhase::Failed { reason, .. } => {
                        return Some(("Failed".to_string(), Some(reason.to_string())));
                    }
                    _ => {}
                }
                self.view.nodes(&self.nodes);
            }
            Notice::RingChanged { ring, removed, .. } if ring.job == self.job => {
                self.ring_version = ring.version;
                if !removed.is_empty() {
                    let all_killed = removed
                        .iter()
                        .all(|r| self.index_of.get(r).is_some_and(|&i| self.nodes[i].killed));
                    if let (Some(t), true) = (self.killed_at, all_killed) {
                        self.ring_repair_ms.push(t.elapsed().as_millis() as u64);
                    }
                    let names: Vec<String> = removed
                        .iter()
                        .map(|r| {
                            self.index_of
                                .get(r)
                                .map_or(r.to_string(), |i| format!("node {i}"))
                        })
                        .collect();
                    self.view.log(&format!(
                        "ring v{}: {} members, removed {}",
                        ring.version,
                        ring.members.len(),
                        names.join(", ")
                    ));
                }
            }
            Notice::NodeFailed { node, kind, .. } => {
                if let Some(&i) = self.index_of.get(&node) {
                    self.nodes[i].status = format!("failed ({kind:?})");
                    self.view.nodes(&self.nodes);
                }
            }
            _ => {}
        }
        None
    }

    /// Epoch `epoch` started: the previous one's report, and the faults the plan injects
    /// at this epoch (the chain's endpoint down, nodes killed).
    async fn on_epoch_start(&mut self, epoch: u32, now: Instant) {
        self.epochs.started.insert(epoch, now);
        if let Some(rx) = orchestrator_rx_bytes(self.bed).await {
            self.epochs.rx_bytes.insert(epoch, rx);
        }
        if epoch > 0 {
            self.epochs
                .finish(
                    self.d,
                    self.job,
                    epoch - 1,
                    self.view,
                    &mut self.nodes,
                    &self.index_of,
                )
                .await;
        }
        self.view.epoch(epoch, self.plan.epochs);
        if let Some((proxy, (at, secs))) = &self.outage {
            if *at == epoch {
                use crate::anvil::ProxyMode;
                proxy.set_mode(ProxyMode::Down);
                self.view.log(&format!(
                    "epoch {epoch}: the chain's RPC endpoint is down for {secs} s"
                ));
                let (proxy, secs) = (proxy.clone(), *secs);
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_secs(secs)).await;
                    proxy.set_mode(ProxyMode::Forward);
                });
            }
        }
        // Mid-round kills that found no round in their epoch happen now.
        let due = match self.plan.kill_at {
            KillAt::Start => epoch == self.plan.kill_epoch,
            KillAt::Reduce => epoch > self.plan.kill_epoch,
        };
        if due {
            self.kill(epoch, "at the start of", now);
        }
    }

    /// SIGKILLs the plan's victims (once per run) in `epoch`, `when` saying when.
    fn kill(&mut self, epoch: u32, when: &str, now: Instant) {
        if self.plan.kill == 0 || self.killed_at.is_some() {
            return;
        }
        for &i in &self.to_kill {
            if let Some(c) = self.nodes[i].child.as_mut() {
                let _ = c.start_kill();
            }
            self.nodes[i].killed = true;
            self.nodes[i].status = format!("killed (SIGKILL) {when} epoch {epoch}");
        }
        self.killed_at = Some(now);
        self.view.log(&format!(
            "epoch {epoch}: killed node(s) {:?} {when} the epoch",
            self.to_kill
        ));
    }

    /// What a node process reported (a failed epoch, its status).
    fn on_node_event(&mut self, e: NodeEvent) {
        // `--kill-at reduce`: a victim started the kill epoch's all-reduce round.
        if self.plan.kill_at == KillAt::Reduce
            && e.event["event"] == "round_started"
            && e.event["epoch"] == self.plan.kill_epoch
            && self.to_kill.contains(&e.index)
        {
            let version = e.event["ring_version"].as_u64().unwrap_or(0);
            self.kill(
                self.plan.kill_epoch,
                &format!("mid-round (its all-reduce round on ring v{version} had started) in"),
                Instant::now(),
            );
        }
        if e.event["event"] == "epoch_failed" && !self.nodes[e.index].killed {
            let why = format!(
                "node {}: epoch {} failed: {}",
                e.index,
                e.event["epoch"],
                e.event["reason"].as_str().unwrap_or("?")
            );
            if self.view.bars.is_none() {
                self.view.log(&why);
            }
            self.node_failures.insert(e.index, why);
        }
        if let Some(status) = node_status(&e.event) {
            if !self.nodes[e.index].killed {
                self.nodes[e.index].status = status;
                self.view.nodes(&self.nodes);
            }
        }
    }
}

async fn drive(
    plan: &DemoPlan,
    d: &Daemon,
    endpoint: &str,
    bed: Option<&Testbed>,
    keys: &Path,
    logs: &Path,
    outage: Outage,
) -> Result<DemoSummary, DemoError> {
    let view = View::new(plan);
    let (behaviours, to_kill) = plan.roles();
    let (tx, mut events) = mpsc::channel::<NodeEvent>(1024);
    let mut nodes = spawn_nodes(plan, endpoint, bed, keys, logs, &behaviours, &tx)?;
    let index_of: HashMap<NodeId, usize> =
        nodes.iter().enumerate().map(|(i, n)| (n.id, i)).collect();
    let mut notices = d.core.subscribe();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(plan.timeout_s);
    view.log(&format!(
        "orchestrator on {}{}; {} nodes starting (logs and node events in {})",
        endpoint.trim_start_matches("http://"),
        bed.map_or(String::new(), |b| format!(
            " in test bed {} ({} regions)",
            b.plan().prefix,
            plan.testbed.as_ref().map_or(0, |t| t.regions.len())
        )),
        plan.nodes,
        logs.display()
    ));
    // SIGINT/SIGTERM end the run with its summary (and the nodes with it).
    let interrupted = hanzod_daemon::serve::termination();
    tokio::pin!(interrupted);
    await_registered(
        plan,
        logs,
        &mut nodes,
        &mut events,
        &mut interrupted,
        deadline,
    )
    .await?;
    view.nodes(&nodes);

    let spec = demo_spec(plan);
    let rx_submitted = orchestrator_rx_bytes(bed).await;
    let started = Instant::now();
    let job = d
        .core
        .submit_job(spec.clone())
        .await
        .map_err(|e| setup("submitting the job".into(), &e))?;
    let initial_loss = initial_loss(plan, &spec.training, job);
    view.log(&format!(
        "job {} submitted: {} epochs × {} local steps × batch {}; initial validation loss {}",
        job.0,
        plan.epochs,
        plan.local_steps,
        plan.batch_size,
        initial_loss.map_or("?".into(), |l| format!("{l:.4}"))
    ));
    let mut run = Run {
        plan,
        d,
        bed,
        view: &view,
        job,
        nodes,
        index_of,
        to_kill,
        outage,
        epochs: EpochLog::default(),
        killed_at: None,
        ring_repair_ms: Vec::new(),
        ring_version: 0,
        node_failures: BTreeMap::new(),
    };
    let (phase, failure) = run
        .follow(&mut notices, &mut events, &mut interrupted, deadline)
        .await;
    // A failed job says what its nodes reported (a recipe they could not train, …).
    let failure = match failure {
        Some(f) if !run.node_failures.is_empty() => Some(format!(
            "{f}; nodes reported: {}",
            run.node_failures
                .values()
                .cloned()
                .collect::<Vec<_>>()
                .join("; ")
        )),
        other => other,
    };
    // The epoch reports of the last epoch are fetched above; stop the node processes.
    for n in run.nodes.iter_mut() {
        if let Some(mut c) = n.child.take() {
            let _ = c.start_kill();
            let _ = c.wait().await;
        }
    }
    view.finish();
    let lines = node_lines(&run.nodes, &run.epochs, &*d.ledger(), &run.index_of).await;
    let (agg_ms, agg_deltas) = run.epochs.aggregation;
    let epochs = epoch_lines(&run.epochs);
    let samples = {
        let (plan, epochs) = (plan.clone(), epochs.clone());
        tokio::task::spawn_blocking(move || samples(&plan, job, &epochs))
            .await
            .unwrap_or_default()
    };
    Ok(DemoSummary {
        plan: plan.clone(),
        job: job.0,
        phase,
        failure,
        wall_ms: started.elapsed().as_millis() as u64,
        initial_loss,
        epochs,
        nodes: lines,
        ring_version: run.ring_version,
        ring_repair_ms: run.ring_repair_ms,
        orchestrator_rx_bytes: rx_submitted
            .zip(run.epochs.rx_bytes.get(&plan.epochs))
            .map(|(start, end)| end.saturating_sub(start)),
        aggregation_ms_per_delta: (agg_deltas > 0).then(|| agg_ms as f64 / agg_deltas as f64),
        out: plan.out.clone(),
        orchestrator: Identity::from_hex(&orchestrator_key(plan.seed), "the demo key")
            .map(|k| hex::encode(k.node_id().0))
            .unwrap_or_default(),
        chain: None,
        samples,
    })
}

/// Each node's line of the summary: its deltas by verdict, its spot-checks, and what the
/// ledger holds for it (rewards, stake, slashes).
async fn node_lines(
    nodes: &[NodeProc],
    epochs: &EpochLog,
    ledger: &dyn hanzod_actors::ports::Ledger,
    index_of: &HashMap<NodeId, usize>,
) -> Vec<NodeLine> {
    let mut lines = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        let hex_id = hex::encode(n.id.0);
        let mut line = NodeLine {
            index: i,
            node: hex_id.clone(),
            behaviour: n.behaviour,
            ring_fault: n.ring_fault,
            killed: n.killed,
            accepted: 0,
            rejected: 0,
            suspect: 0,
            spot_checks_passed: 0,
            spot_checks_failed: 0,
            rewards_wei: "0".into(),
            slashed_wei: "0".into(),
            stake_wei: "0".into(),
        };
        for r in epochs.reports.values() {
            for dl in r.deltas.iter().filter(|dl| dl.node == hex_id) {
                if dl.rejected.is_some() {
                    line.rejected += 1;
                } else {
                    line.accepted += 1;
                    line.suspect += usize::from(dl.suspect);
                }
                match &dl.spot_check {
                    Some(c) if c.passed => line.spot_checks_passed += 1,
                    Some(_) => line.spot_checks_failed += 1,
                    None => {}
                }
            }
        }
        lines.push(line);
    }
    let ids: Vec<NodeId> = nodes.iter().map(|n| n.id).collect();
    ledger_columns(&mut lines, &ids, ledger, index_of).await;
    lines
}

/// The ledger's columns of the node lines (`lines[i]` is node `ids[i]`): rewards, stake and
/// slashes as the ledger holds them now. Read again once the chain's settlements are in
/// (`chain_summary`): a settlement an outage cut short lands after the job ends.
async fn ledger_columns(
    lines: &mut [NodeLine],
    ids: &[NodeId],
    ledger: &dyn hanzod_actors::ports::Ledger,
    index_of: &HashMap<NodeId, usize>,
) {
    for (line, id) in lines.iter_mut().zip(ids) {
        line.rewards_wei = ledger
            .balance_of(id)
            .await
            .map_or("0".into(), |w| w.0.to_string());
        line.stake_wei = ledger
            .stake_of(id)
            .await
            .map_or("0".into(), |w| w.0.to_string());
        line.slashed_wei = "0".into();
    }
    if let Ok(slashes) = ledger.slashes().await {
        for s in slashes.iter().filter(|s| !s.duplicate) {
            if let Some(line) = index_of.get(&s.node).and_then(|&i| lines.get_mut(i)) {
                let before: u128 = line.slashed_wei.parse().unwrap_or(0);
                line.slashed_wei = (before + s.slashed.0).to_string();
            }
        }
    }
}

/// Each epoch's line of the summary, from its report.
fn epoch_lines(epochs: &EpochLog) -> Vec<EpochLine> {
    epochs
        .reports
        .values()
        .map(|r| EpochLine {
            epoch: r.epoch,
            loss_before: r.loss_before,
            loss_after: r.loss_after,
            accepted: r.deltas.iter().filter(|x| x.rejected.is_none()).count(),
            rejected: r.deltas.iter().filter(|x| x.rejected.is_some()).count(),
            suspect: r
                .deltas
                .iter()
                .filter(|x| x.rejected.is_none() && x.suspect)
                .count(),
            spot_checks: r.deltas.iter().filter(|x| x.spot_check.is_some()).count(),
            spot_check_failures: r
                .deltas
                .iter()
                .filter(|x| x.spot_check.as_ref().is_some_and(|c| !c.passed))
                .count(),
            aggregator: r.aggregator.as_deref().unwrap_or("kept").to_string(),
            checkpoint: r.checkpoint.clone(),
            published: r.location.clone(),
            ms: epochs.ms.get(&r.epoch).copied().unwrap_or(0),
            orchestrator_rx_bytes: epochs
                .rx_bytes
                .get(&(r.epoch + 1))
                .zip(epochs.rx_bytes.get(&r.epoch))
                .map(|(end, start)| end.saturating_sub(*start)),
        })
        .collect()
}

/// What the demo records per epoch while the job runs.
#[derive(Default)]
struct EpochLog {
    /// When each epoch started.
    started: BTreeMap<u32, Instant>,
    /// Each epoch's wall time, start to checkpoint, ms.
    ms: BTreeMap<u32, u64>,
    /// When the epoch in flight entered Aggregating.
    aggregating_since: Option<Instant>,
    /// Total ms spent aggregating, and the deltas aggregated in that time.
    aggregation: (u64, usize),
    /// The epochs' reports.
    reports: BTreeMap<u32, EpochReport>,
    /// On a test bed: the orchestrator interface's received bytes when each epoch started
    /// (and, under the epoch count, when the job was published).
    rx_bytes: BTreeMap<u32, u64>,
}

/// The bytes the test bed's orchestrator interface has received so far (`None` off a bed,
/// or when they cannot be read).
async fn orchestrator_rx_bytes(bed: Option<&Testbed>) -> Option<u64> {
    let bed = bed?;
    let dev = &bed.plan().endpoint(Endpoint::Orchestrator)?.dev;
    // `ip netns exec` mounts the namespace's own /sys.
    let out = bed
        .command_at(
            Endpoint::Orchestrator,
            "cat",
            [format!("/sys/class/net/{dev}/statistics/rx_bytes")],
        )
        .output()
        .await
        .ok()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

impl EpochLog {
    /// Records the end of `epoch`: its wall time, its aggregation time, its report, and
    /// the nodes' scores.
    async fn finish(
        &mut self,
        d: &Daemon,
        job: JobId,
        epoch: u32,
        view: &View,
        nodes: &mut [NodeProc],
        index_of: &HashMap<NodeId, usize>,
    ) {
        if let Some(t) = self.started.get(&epoch) {
            self.ms
                .entry(epoch)
                .or_insert(t.elapsed().as_millis() as u64);
        }
        let aggregated_ms = self
            .aggregating_since
            .take()
            .map(|since| since.elapsed().as_millis() as u64);
        if let std::collections::btree_map::Entry::Vacant(slot) = self.reports.entry(epoch) {
            if let Some(r) = finished_report(d, job, epoch, view, nodes, index_of).await {
                slot.insert(r);
            }
        }
        if let Some(ms) = aggregated_ms {
            let deltas = self.reports.get(&epoch).map_or(0, |r| r.deltas.len());
            self.aggregation = (self.aggregation.0 + ms, self.aggregation.1 + deltas);
        }
    }
}

/// Fetches `epoch`'s report, shows each node's outcome, and logs the epoch.
async fn finished_report(
    d: &Daemon,
    job: JobId,
    epoch: u32,
    view: &View,
    nodes: &mut [NodeProc],
    index_of: &HashMap<NodeId, usize>,
) -> Option<EpochReport> {
    let r = d.sink().report(job, epoch).await?;
    for dl in &r.deltas {
        let Some(&i) = dl.node.parse().ok().and_then(|n: NodeId| index_of.get(&n)) else {
            continue;
        };
        if nodes[i].killed {
            continue;
        }
        let reward = r
            .rewards
            .iter()
            .find(|x| x.node == dl.node)
            .and_then(|x| x.amount_wei.parse::<u128>().ok())
            .unwrap_or(0);
        nodes[i].status = match (&dl.rejected, &dl.spot_check) {
            (Some(why), Some(c)) if !c.passed => {
                format!("epoch {epoch}: REJECTED, spot-check failed ({why:?}) → slashed")
            }
            (Some(why), _) => format!("epoch {epoch}: rejected ({why:?})"),
            (None, _) => format!(
                "epoch {epoch}: accepted, score {:.3}{}, +{} GYM",
                dl.score.map_or(0.0, |s| s.composite),
                if dl.suspect { " (suspect)" } else { "" },
                gym(reward)
            ),
        };
    }
    view.log(&format!(
        "epoch {epoch} published {}: validation loss {:.4} → {:.4}, {} deltas ({} rejected), {}",
        r.checkpoint,
        r.loss_before,
        r.loss_after,
        r.deltas.len(),
        r.deltas.iter().filter(|x| x.rejected.is_some()).count(),
        r.summary().outcome_line()
    ));
    Some(r)
}

/// The validation loss epoch 0 starts from: the base checkpoint's, else the seeded
/// initialisation's.
fn initial_loss(plan: &DemoPlan, training: &TrainingSpec, job: JobId) -> Option<f64> {
    let trainer = hanzod_train::trainer_of(training, job).ok()?;
    let start = match &plan.base {
        Some(base) => {
            hanzod_train::Weights::from_safetensors(&base.weights, trainer.layout()).ok()?
        }
        None => trainer.init(),
    };
    trainer.validation_loss(&start).ok()
}

fn behaviour_flag(b: &Behaviour, fault: RingFault) -> String {
    match fault {
        RingFault::TamperAllreduce { perturbation } => {
            return format!("tamper-allreduce:{perturbation}")
        }
        RingFault::FreeRide => return "free-ride".into(),
        RingFault::Substitute { perturbation } => return format!("substitute:{perturbation}"),
        RingFault::Honest => {}
    }
    match b {
        Behaviour::Honest => "honest".into(),
        Behaviour::Poison { scale } => format!("poison:{scale}"),
        Behaviour::LieLoss { factor } => format!("lie-loss:{factor}"),
        Behaviour::Attack { attack } => attack.to_string(),
    }
}

/// A short name of an attack of the suite, for the live view and the summary table (at
/// most 9 characters).
fn attack_label(a: &NodeAttack) -> &'static str {
    match a {
        NodeAttack::SignFlip => "sign-flip",
        NodeAttack::Scale { .. } => "scale",
        NodeAttack::Noise { .. } => "noise",
        NodeAttack::Alie { .. } => "alie",
        NodeAttack::Ipm { .. } => "ipm",
        NodeAttack::CopyPeer { .. } => "copy-peer",
        NodeAttack::CopyLastMerged { .. } => "copy-last",
        NodeAttack::Lazy { .. } => "lazy",
        NodeAttack::Stale { .. } => "stale",
        NodeAttack::LieLoss { .. } => "liar",
        NodeAttack::Identical => "identical",
    }
}

fn node_status(e: &serde_json::Value) -> Option<String> {
    let epoch = &e["epoch"];
    Some(match e["event"].as_str()? {
        "registered" => "registered".into(),
        "ring_applied" => format!("in ring v{}", e["version"]),
        "epoch_assigned" => format!("epoch {epoch}: training"),
        "delta_uploaded" => format!(
            "epoch {epoch}: delta uploaded, claimed loss {:.4} (trained in {} ms)",
            e["claimed_loss"].as_f64().unwrap_or(f64::NAN),
            e["train_ms"]
        ),
        "epoch_failed" => format!("epoch {epoch}: failed: {}", e["reason"]),
        "disconnected" => format!("disconnected: {}", e["reason"]),
        "stopped" => format!("stopped: {}", e["reason"]),
        _ => return None,
    })
}

/// Whole GYM with 3 decimals, from wei.
pub fn gym(wei: u128) -> String {
    let whole = wei / GymWei::PER_GYM;
    let milli = (wei % GymWei::PER_GYM) / (GymWei::PER_GYM / 1000);
    format!("{whole}.{milli:03}")
}

/// The live view: an epoch bar and a line per node on a terminal, log lines otherwise.
struct View {
    bars: Option<(
        indicatif::MultiProgress,
        indicatif::ProgressBar,
        Vec<indicatif::ProgressBar>,
    )>,
    labels: Vec<String>,
}

impl View {
    fn new(plan: &DemoPlan) -> View {
        let (behaviours, _) = plan.roles();
        let faults = plan.ring_faults();
        let labels: Vec<String> = behaviours
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let id = node_identity(plan.seed, i).node_id().to_string();
                let role = match (b, faults[i]) {
                    (_, RingFault::TamperAllreduce { .. }) => "TAMPER".to_string(),
                    (_, RingFault::FreeRide) => "FREERIDE".into(),
                    (_, RingFault::Substitute { .. }) => "SUBSTITUTE".into(),
                    (b, RingFault::Honest) => match b {
                        Behaviour::Honest => "honest".into(),
                        Behaviour::Poison { .. } => "POISON".into(),
                        Behaviour::LieLoss { .. } => "LIAR".into(),
                        Behaviour::Attack { attack } => attack_label(attack).to_uppercase(),
                    },
                };
                format!("node {i:>2} {} {role:<6}", &id[..8.min(id.len())])
            })
            .collect();
        use std::io::IsTerminal;
        let bars = (plan.progress && std::io::stderr().is_terminal()).then(|| {
            let multi = indicatif::MultiProgress::new();
            let style = indicatif::ProgressStyle::with_template(
                "epochs {bar:30.cyan/blue} {pos}/{len} {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
            let epochs = multi.add(indicatif::ProgressBar::new(u64::from(plan.epochs)));
            epochs.set_style(style);
            let lines = labels
                .iter()
                .map(|_| {
                    let b = multi.add(indicatif::ProgressBar::new_spinner());
                    b.set_style(
                        indicatif::ProgressStyle::with_template("  {msg}")
                            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
                    );
                    b
                })
                .collect();
            (multi, epochs, lines)
        });
        View { bars, labels }
    }

    fn log(&self, line: &str) {
        match &self.bars {
            Some((multi, ..)) => {
                let _ = multi.println(line);
            }
            None => eprintln!("{line}"),
        }
    }

    fn epoch(&self, epoch: u32, of: u32) {
        match &self.bars {
            Some((_, bar, _)) => {
                bar.set_position(u64::from(epoch));
                bar.set_message(format!("training epoch {epoch}"));
            }
            None => eprintln!("epoch {epoch} started ({epoch}/{of} published)"),
        }
    }

    fn nodes(&self, nodes: &[NodeProc]) {
        if let Some((_, _, lines)) = &self.bars {
            for ((bar, label), n) in lines.iter().zip(&self.labels).zip(nodes) {
                bar.set_message(format!("{label} {}", n.status));
            }
        }
    }

    fn finish(&self) {
        if let Some((multi, bar, lines)) = &self.bars {
            bar.finish();
            for l in lines {
                l.finish();
            }
            let _ = multi.clear();
        }
    }
}

/// The summary as text: the epoch table, the node table, the fault-recovery figures and
/// where the published files are.
pub fn render(s: &DemoSummary) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "job {}: {} in {:.1} s{}",
        s.job,
        s.phase,
        s.wall_ms as f64 / 1000.0,
        s.failure
            .as_ref()
            .map_or(String::new(), |f| format!(" ({f})"))
    );
    if let Some(l) = s.initial_loss {
        let _ = writeln!(o, "initial validation loss {l:.4}");
    }
    let _ = writeln!(
        o,
        "\n{:>5}  {:>9}  {:>9}  {:>8}  {:>7}  {:>8}  {:>11}  {:<13}  {:>7}  checkpoint",
        "epoch",
        "loss in",
        "loss out",
        "accepted",
        "suspect",
        "rejected",
        "spot-checks",
        "merge",
        "ms"
    );
    for e in &s.epochs {
        let _ = writeln!(
            o,
            "{:>5}  {:>9.4}  {:>9.4}  {:>8}  {:>7}  {:>8}  {:>11}  {:<13}  {:>7}  {}",
            e.epoch,
            e.loss_before,
            e.loss_after,
            e.accepted,
            e.suspect,
            e.rejected,
            format!("{} ({} ✗)", e.spot_checks, e.spot_check_failures),
            e.aggregator,
            e.ms,
            e.checkpoint
        );
    }
    let _ = writeln!(o, "{}", s.progress());
    let _ = writeln!(
        o,
        "\n{:>4}  {:<16}  {:<9}  {:>8}  {:>7}  {:>8}  {:>11}  {:>12}  {:>12}  {:>12}",
        "node",
        "id",
        "role",
        "accepted",
        "suspect",
        "rejected",
        "spot ✓/✗",
        "rewards GYM",
        "slashed GYM",
        "stake GYM"
    );
    for n in &s.nodes {
        let role = match (n.ring_fault, n.behaviour) {
            (RingFault::TamperAllreduce { .. }, _) => "tamper",
            (RingFault::FreeRide, _) => "freeride",
            (RingFault::Substitute { .. }, _) => "substitute",
            (_, b) => match b {
                Behaviour::Honest if n.killed => "killed",
                Behaviour::Honest => "honest",
                Behaviour::Poison { .. } => "poison",
                Behaviour::LieLoss { .. } => "liar",
                Behaviour::Attack { attack } => attack_label(&attack),
            },
        };
        let wei = |v: &str| gym(v.parse().unwrap_or(0));
        let _ = writeln!(
            o,
            "{:>4}  {:<16}  {:<9}  {:>8}  {:>7}  {:>8}  {:>11}  {:>12}  {:>12}  {:>12}",
            n.index,
            &n.node[..16],
            role,
            n.accepted,
            n.suspect,
            n.rejected,
            format!("{}/{}", n.spot_checks_passed, n.spot_checks_failed),
            wei(&n.rewards_wei),
            wei(&n.slashed_wei),
            wei(&n.stake_wei)
        );
    }
    if !s.ring_repair_ms.is_empty() {
        let _ = writeln!(
            o,
            "\nring repaired in {} after the kill (ring version {})",
            hanzod_protocol::human::durations(&s.ring_repair_ms),
            s.ring_version
        );
    }
    if s.epochs.iter().any(|e| e.orchestrator_rx_bytes.is_some()) {
        let per: Vec<String> = s
            .epochs
            .iter()
            .map(|e| {
                e.orchestrator_rx_bytes
                    .map_or("?".into(), |b| format!("{:.1} kB", b as f64 / 1e3))
            })
            .collect();
        let _ = writeln!(
            o,
            "orchestrator ingress (test bed, on the wire): {} per epoch{}",
            per.join(", "),
            s.orchestrator_rx_bytes.map_or(String::new(), |b| format!(
                ", {:.1} kB from submission to Published",
                b as f64 / 1e3
            ))
        );
    }
    if let Some(ms) = s.aggregation_ms_per_delta {
        let _ = writeln!(o, "aggregation (validation + merge) {ms:.1} ms per delta");
    }
    for (epoch, text) in &s.samples {
        let _ = writeln!(
            o,
            "epoch {epoch} checkpoint, greedy: {SAMPLE_PROMPT}{}",
            text.replace('\n', " ⏎ ")
        );
    }
    if let Some(c) = &s.chain {
        let _ = writeln!(
            o,
            "\non chain at {} (GYMToken {}, MiningPool {}, orchestrator account {}): {} \
             reward batches, {} publication records; rewards, stakes and slashes above are read \
             from the chain",
            c.rpc,
            c.gym_token,
            c.mining_pool,
            c.orchestrator_account,
            c.reward_batches,
            c.publications
        );
        if c.refused_during_outage > 0 {
            let _ = writeln!(
                o,
                "the RPC endpoint refused {} requests while it was down; the writes were retried",
                c.refused_during_outage
            );
        }
    }
    if let Some(last) = s.epochs.last().and_then(|e| e.published.as_ref()) {
        let _ = writeln!(o, "\nlast checkpoint published to {last}");
        if let Some(e) = s.epochs.last() {
            let _ = writeln!(o, "its weights' CID: {}", e.checkpoint);
            if s.plan.model == hanzod_train::lm::QWEN3_TINY {
                let _ = writeln!(
                    o,
                    "fine-tune it: {} demo --model {} --lora --base {}{}",
                    shell_word(&s.plan.exe.display().to_string()),
                    hanzod_train::lm::QWEN3_TINY,
                    e.checkpoint,
                    if s.out == std::path::Path::new("hanzod-demo") {
                        String::new()
                    } else {
                        format!(" --out {}", shell_word(&s.out.display().to_string()))
                    }
                );
            }
        }
        // The binary by its path: the command runs as printed, with or without `hanzod` on
        // the PATH (a demo started with `cargo run` has none).
        let _ = writeln!(
            o,
            "verify it: {} verify {} --records {} --orchestrator {}",
            shell_word(&s.plan.exe.display().to_string()),
            shell_word(last),
            shell_word(&s.out.join(PUBLICATIONS_FILE).display().to_string()),
            s.orchestrator
        );
    }
    let _ = writeln!(
        o,
        "files: {} (keys/, logs/, ipfs/ object store blocks by CID, models/ Hugging Face repo folders)",
        s.out.display()
    );
    o
}

/// `word` as one shell word: as it is when it holds only characters no shell treats
/// specially, else in single quotes (each `'` written as `'\''`).
fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-+=:,@%".contains(&b));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn epoch(epoch: u32, loss_before: f64, loss_after: f64, aggregator: &str) -> EpochLine {
        EpochLine {
            epoch,
            loss_before,
            loss_after,
            accepted: 4,
            rejected: 0,
            suspect: 0,
            spot_checks: 2,
            spot_check_failures: 0,
            aggregator: aggregator.into(),
            checkpoint: format!("bafkrei{epoch}"),
            published: None,
            ms: 1000,
            orchestrator_rx_bytes: None,
        }
    }

    fn summary(epochs: Vec<EpochLine>) -> DemoSummary {
        DemoSummary {
            plan: DemoArgs::default()
                .plan(PathBuf::from("hanzod"))
                .expect("the default plan"),
            job: 1,
            phase: "Published".into(),
            failure: None,
            wall_ms: 10_000,
            initial_loss: epochs.first().map(|e| e.loss_before),
            epochs,
            nodes: Vec::new(),
            ring_version: 1,
            ring_repair_ms: Vec::new(),
            orchestrator_rx_bytes: None,
            aggregation_ms_per_delta: None,
            out: PathBuf::from("hanzod-demo"),
            orchestrator: String::new(),
            chain: None,
            samples: Vec::new(),
        }
    }

    #[test]
    fn the_summary_says_whether_training_improved_stalled_or_never_trained() {
        let stalled = summary(vec![
            epoch(0, 2.042, 1.2, "weighted-mean"),
            epoch(1, 1.2, 0.601, "weighted-mean"),
            epoch(2, 0.601, 0.601, "kept"),
            epoch(3, 0.601, 0.611, "coordinate-median"),
        ]);
        let line = "trained: loss 2.042 → best 0.601 at epoch 1, no improvement since \
                    (last 0.611 at epoch 3, +1.7 % above the best)";
        assert_eq!(stalled.progress().to_string(), line);
        let text = render(&stalled);
        let after_table = text
            .lines()
            .skip_while(|l| !l.trim_start().starts_with("3 "))
            .nth(1);
        assert_eq!(after_table, Some(line), "{text}");
        let kept = summary(vec![
            epoch(0, 2.042, 2.042, "kept"),
            epoch(1, 2.042, 2.042, "kept"),
        ]);
        assert!(render(&kept).contains("\nnot trained: all 2 epochs kept their base checkpoint\n"));
    }
}
