//! The job state machine: paper §3.1 ("Job Lifecycle") with the per-epoch loop of DESIGN §5.
//!
//! ```text
//! Pending ──NodesReady──▶ Provisioning ──ModelDistributed──▶ Running(0)
//! Running(e) ──EpochComplete(e)──▶ Aggregating(e)
//! Aggregating(e) ──CheckpointPublished(e)──▶ Running(e+1)        (e + 1 < epochs)
//! Aggregating(e) ──CheckpointPublished(e)──▶ Published            (e + 1 = epochs)
//! any non-terminal ──Fail / Cancel──▶ Failed                    (always with a reason)
//! Provisioning / Running / Aggregating ──RingChanged(v)──▶ same phase, ring version v
//! ```
//!
//! The paper's listing goes Running → Aggregating → Published once; its evaluation publishes
//! one checkpoint per epoch, so we loop (DESIGN §12). The machine is pure: no clock reads,
//! time is always an argument, and a job is a fold over its accepted events ([`Job::replay`]),
//! which is what lets a standby rebuild it from the event log (DESIGN §9).
//!
//! Deadlines: [`Job::apply`] never looks at deadlines; it accepts or refuses an event by phase
//! alone, so replaying the log always gives the same job. [`Job::tick`] is how a deadline
//! becomes an event: the actor calls it with the current time and, when it returns an event,
//! applies it and appends it to the log like any other.

mod summary;

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::types::{GymWei, JobId, NodeId, Timestamp};

pub use summary::{best_loss_before, progress, EpochOutcome, EpochSummary, Progress};

/// What a submitter asks for (paper §3, "Job Scheduler"). Unknown fields are refused when it
/// is deserialised; call [`JobSpec::validate`] before accepting it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// Human-readable name; must not be empty or only whitespace.
    pub name: String,
    /// Number of training epochs, ≥ 1; one checkpoint is published per epoch (DESIGN §5).
    pub epochs: u32,
    /// Fewest nodes the job can train with, ≥ 1 (paper §3.1 `Pending { min_nodes }`).
    pub min_nodes: u32,
    /// Most nodes the job will use, ≥ `min_nodes`.
    pub max_nodes: u32,
    /// Minimum GPU memory per node, in bytes (paper §3.3, eligibility rule 2).
    pub min_vram_bytes: u64,
    /// How long the job may wait in Pending for nodes, in ms (> 0); then it fails with
    /// [`FailReason::DeadlinePassed`] (paper §3.1 `Pending { deadline }`).
    pub pending_deadline_ms: u64,
    /// How long one epoch may take, in ms (> 0). Enforced by the job's actor, which knows when
    /// an epoch started; this machine only carries the value.
    pub epoch_deadline_ms: u64,
    /// Expected utility `u_j` (paper §3.2): dimensionless, finite, > 0.
    pub utility: f64,
    /// Submitter's stake `s_j` in GYM wei (paper §3.2), as read from the chain.
    pub submitter_stake: GymWei,
    /// What the nodes train and how (model, dataset, local steps, learning rates, seed);
    /// defaults to the built-in Wine Quality MLP.
    #[serde(default)]
    pub training: TrainingSpec,
}

/// A job's training recipe (DESIGN §6): everything a node needs to train its share of an
/// epoch and a validator needs to replay it. The core only carries it; the deltas pipeline
/// resolves `model` and `dataset`.
///
/// The first seven fields serve every model; the rest are for language models
/// (`qwen3-tiny`, `qwen3`) and keep their defaults for the `wine-mlp`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainingSpec {
    /// The model: a built-in name (`wine-mlp`, `qwen3-tiny`), or `qwen3` with its
    /// `architecture`; its tensors bound and check every delta.
    pub model: String,
    /// The dataset: a built-in name (`wine-quality-red`, `austen`).
    pub dataset: String,
    /// Local steps per node per epoch, ≥ 1.
    pub local_steps: u32,
    /// Samples (sequences, for a language model) per local step, ≥ 1.
    pub batch_size: u32,
    /// The nodes' local learning rate (finite, > 0): SGD's for the MLP, AdamW's for a
    /// language model.
    pub local_lr: f64,
    /// The outer learning rate applied to the merged delta (finite, > 0; 1.0 = plain
    /// averaging).
    pub outer_lr: f64,
    /// Seed of the initial weights and of every node's batch stream (training is
    /// deterministic for a given seed, so spot-checks can re-run it).
    pub seed: u64,
    /// Language models: tokens each training sequence predicts (windows of `seq_len + 1`
    /// tokens), ≥ 2.
    pub seq_len: u32,
    /// Language models: tokens of the held-out validation shard every delta is scored on
    /// (nats/token before and after), ≥ `seq_len`; the daemon refuses a job whose
    /// validation would exceed its budget (`validation.validation_budget_flops`).
    pub validation_tokens: u64,
    /// Language models: the local AdamW's hyper-parameters (its learning rate is
    /// `local_lr`).
    pub adamw: AdamWSpec,
    /// Language models: train every parameter or a LoRA adapter.
    pub mode: TrainMode,
    /// Language models, `mode = "lora"`: the adapter.
    pub lora: LoraSpec,
    /// `model = "qwen3"`: the architecture, a Hugging Face `config.json` text (the CLI reads
    /// a path or an inline `[training.architecture]` table into it).
    pub architecture: Option<String>,
    /// Start epoch 0 from a checkpoint instead of the seed's initial weights: the CID of
    /// its `model.safetensors` bytes as Kubo's `ipfs add --cid-version=1` computes it (what
    /// every published checkpoint is named by: `job status`, the publication records, the
    /// model card), held in the orchestrator's object store. SubmitJob fetches it, checks
    /// the bytes against the CID and that they load as this model's weights; nodes and the
    /// validator fetch it like any epoch's base. Any job's published checkpoint of the same
    /// model qualifies.
    pub base: Option<String>,
    /// Element type of the uploaded deltas: `"f32"` or `"bf16"`.
    pub delta_dtype: String,
    /// How the epoch's deltas are combined (DESIGN §6.4): every node uploads to the
    /// orchestrator ([`Aggregation::Star`]) or the ring all-reduces them
    /// ([`Aggregation::Ring`]). Absent in logs written before it existed: star.
    pub aggregation: Aggregation,
}

/// How an epoch's deltas are combined (DESIGN §6.4).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Aggregation {
    /// Every node uploads its delta; the orchestrator validates and merges them all.
    #[default]
    Star,
    /// Nodes commit, send sketches, and all-reduce the weighted sum over the ring among
    /// themselves ([`crate::aggregation`]); only the spot-checked deltas and the result
    /// reach the orchestrator.
    Ring,
}

impl Aggregation {
    /// `"star"` or `"ring"`, as on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Aggregation::Star => "star",
            Aggregation::Ring => "ring",
        }
    }
}

impl Default for TrainingSpec {
    fn default() -> Self {
        TrainingSpec {
            model: "wine-mlp".into(),
            dataset: "wine-quality-red".into(),
            local_steps: 20,
            batch_size: 32,
            local_lr: 0.05,
            outer_lr: 1.0,
            seed: 0,
            seq_len: 128,
            validation_tokens: 4096,
            adamw: AdamWSpec::default(),
            mode: TrainMode::Full,
            lora: LoraSpec::default(),
            architecture: None,
            base: None,
            delta_dtype: "f32".into(),
            aggregation: Aggregation::Star,
        }
    }
}

/// What a language-model job trains.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TrainMode {
    /// Every parameter; deltas carry the full model with Hugging Face names.
    #[default]
    Full,
    /// A LoRA adapter on the base's linear layers (E. Hu et al., "LoRA", ICLR 2022);
    /// deltas carry PEFT-named `lora_A`/`lora_B` factors.
    Lora,
}

impl TrainMode {
    /// `"full"` or `"lora"`, as the job spec spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            TrainMode::Full => "full",
            TrainMode::Lora => "lora",
        }
    }
}

/// The local AdamW's hyper-parameters (I. Loshchilov, F. Hutter, "Decoupled Weight Decay
/// Regularization", ICLR 2019; PyTorch's `AdamW` form). Defaults: PyTorch's.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdamWSpec {
    /// β₁, in `[0, 1)` (0.9).
    pub beta1: f64,
    /// β₂, in `[0, 1)` (0.999).
    pub beta2: f64,
    /// ε, > 0 (1e-8).
    pub eps: f64,
    /// Decoupled weight decay λ, ≥ 0 (0.01).
    pub weight_decay: f64,
}

impl Default for AdamWSpec {
    fn default() -> Self {
        AdamWSpec {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

/// A LoRA adapter (PEFT's `LoraConfig`): `ΔW = (alpha / rank) · B · A` on each target.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoraSpec {
    /// The rank `r`, ≥ 1 (16).
    pub rank: u32,
    /// `lora_alpha`, finite and > 0 (32).
    pub alpha: f64,
    /// The adapted modules, PEFT `target_modules` names (`q_proj`, `k_proj`, `v_proj`,
    /// `o_proj`).
    pub target_modules: Vec<String>,
    /// `lora_dropout`: must be 0 (training is deterministic so spot-checks can replay it).
    pub dropout: f64,
}

impl Default for LoraSpec {
    fn default() -> Self {
        LoraSpec {
            rank: 16,
            alpha: 32.0,
            target_modules: ["q_proj", "k_proj", "v_proj", "o_proj"]
                .map(String::from)
                .to_vec(),
            dropout: 0.0,
        }
    }
}

/// One epoch's work for a ring member ([`crate::ports::NodeCommand::EpochStart`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EpochAssignment {
    /// The job.
    pub job: JobId,
    /// The epoch to train, 0-based.
    pub epoch: u32,
    /// The global step the node's local run starts at: `epoch × local_steps` (DESIGN §6;
    /// the upload must state it).
    pub step: u64,
    /// The checkpoint to start from ([`Job::base_of`]): the reference published for
    /// epoch − 1; in epoch 0 the job's `training.base`, or `None` (the recipe's initial
    /// weights, derived from `training.seed`). A reference is the CID of a checkpoint's
    /// `model.safetensors` bytes (Kubo's `ipfs add --cid-version=1`).
    pub base: Option<String>,
    /// The recipe (model, dataset, local steps, batch size, learning rates, seed).
    pub training: TrainingSpec,
    /// When the epoch's deadline passes (ms since the Unix epoch); a delta arriving later
    /// is refused.
    pub deadline: Timestamp,
    /// Ring aggregation ([`Aggregation::Ring`]): SHA-256 of the epoch's scoring seed and of
    /// its check seed (DESIGN §6.4), revealed later in the epoch; `None` in star
    /// aggregation.
    #[serde(default)]
    pub seed_commitments: Option<SeedCommitments>,
}

/// SHA-256 of a ring epoch's scoring seed and of its check seed, in that order (DESIGN §4b).
pub type SeedCommitments = ([u8; 32], [u8; 32]);

/// Why a [`JobSpec`] was refused: one variant per bad field.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum JobSpecError {
    /// `name` is empty or only whitespace.
    #[error("job name must not be empty")]
    EmptyName,
    /// `epochs` is 0.
    #[error("epochs must be at least 1")]
    ZeroEpochs,
    /// `min_nodes` is 0.
    #[error("min_nodes must be at least 1")]
    ZeroMinNodes,
    /// `max_nodes` < `min_nodes`.
    #[error("max_nodes ({max}) must be at least min_nodes ({min})")]
    MaxBelowMin {
        /// The spec's `min_nodes`.
        min: u32,
        /// The spec's `max_nodes`.
        max: u32,
    },
    /// `pending_deadline_ms` is 0: the job would fail the moment it is submitted.
    #[error("pending_deadline_ms must be greater than 0")]
    ZeroPendingDeadline,
    /// `epoch_deadline_ms` is 0: no epoch could ever complete in time.
    #[error("epoch_deadline_ms must be greater than 0")]
    ZeroEpochDeadline,
    /// `utility` is NaN or infinite.
    #[error("utility must be finite, got {0}")]
    NonFiniteUtility(f64),
    /// `utility` is ≤ 0.
    #[error("utility must be greater than 0, got {0}")]
    NonPositiveUtility(f64),
    /// `training.model` or `training.dataset` is blank.
    #[error("training.{0} must not be empty")]
    EmptyTrainingName(&'static str),
    /// `training.local_steps` or `training.batch_size` is 0.
    #[error("training.{0} must be at least 1")]
    ZeroTrainingCount(&'static str),
    /// A learning rate is NaN, infinite or ≤ 0.
    #[error("training.{field} must be finite and greater than 0, got {value}")]
    BadLearningRate {
        /// `local_lr` or `outer_lr`.
        field: &'static str,
        /// The value given.
        value: f64,
    },
    /// `training.aggregation = "ring"` with `training.mode = "lora"`: adapters merge as
    /// products `B·A` module by module, not as a sum of the factors a ring would reduce.
    #[error("training.aggregation \"ring\" needs training.mode \"full\": LoRA adapters merge as B·A products, not as sums")]
    RingNeedsFullMode,
}

impl JobSpec {
    /// Checks every field's bounds (see the field docs); returns the first violation in field
    /// order.
    pub fn validate(&self) -> Result<(), JobSpecError> {
        if self.name.trim().is_empty() {
            return Err(JobSpecError::EmptyName);
        }
        if self.epochs == 0 {
            return Err(JobSpecError::ZeroEpochs);
        }
        if self.min_nodes == 0 {
            return Err(JobSpecError::ZeroMinNodes);
        }
        if self.max_nodes < self.min_nodes {
            return Err(JobSpecError::MaxBelowMin {
                min: self.min_nodes,
                max: self.max_nodes,
            });
        }
        if self.pending_deadline_ms == 0 {
            return Err(JobSpecError::ZeroPendingDeadline);
        }
        if self.epoch_deadline_ms == 0 {
            return Err(JobSpecError::ZeroEpochDeadline);
        }
        if !self.utility.is_finite() {
            return Err(JobSpecError::NonFiniteUtility(self.utility));
        }
        if self.utility <= 0.0 {
            return Err(JobSpecError::NonPositiveUtility(self.utility));
        }
        let t = &self.training;
        for (field, value) in [("model", &t.model), ("dataset", &t.dataset)] {
            if value.trim().is_empty() {
                return Err(JobSpecError::EmptyTrainingName(field));
            }
        }
        for (field, value) in [("local_steps", t.local_steps), ("batch_size", t.batch_size)] {
            if value == 0 {
                return Err(JobSpecError::ZeroTrainingCount(field));
            }
        }
        for (field, value) in [("local_lr", t.local_lr), ("outer_lr", t.outer_lr)] {
            if !(value.is_finite() && value > 0.0) {
                return Err(JobSpecError::BadLearningRate { field, value });
            }
        }
        if t.aggregation == Aggregation::Ring && t.mode == TrainMode::Lora {
            return Err(JobSpecError::RingNeedsFullMode);
        }
        Ok(())
    }
}

/// Why a job failed (DESIGN §5: Failed always carries a reason).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailReason {
    /// The job was still Pending at its deadline (`submitted_at + pending_deadline_ms`), or an
    /// epoch reached `epoch_deadline_ms` without a single accepted delta (an epoch with some
    /// deltas completes with those at its deadline).
    DeadlinePassed,
    /// Fewer live nodes than the job needs.
    TooFewNodes {
        /// Nodes still alive in the job's ring.
        alive: u32,
        /// The spec's `min_nodes`.
        min: u32,
    },
    /// The job was still Pending at its deadline, and this is why no placement was made:
    /// what the registered nodes lacked when the deadline passed.
    NotPlaced(NodeShortage),
    /// A checkpoint could not be published (object store, model registry or chain).
    PublicationFailed(String),
    /// The submitter or an operator cancelled the job.
    Cancelled,
    /// Anything else, described in words.
    Other(String),
}

impl fmt::Display for FailReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FailReason::DeadlinePassed => f.write_str("deadline passed"),
            FailReason::TooFewNodes { alive, min } => {
                write!(f, "too few nodes: {alive} alive, {min} needed")
            }
            FailReason::NotPlaced(s) => write!(f, "deadline passed while pending: {s}"),
            FailReason::PublicationFailed(why) => write!(f, "publication failed: {why}"),
            FailReason::Cancelled => f.write_str("cancelled"),
            FailReason::Other(why) => f.write_str(why),
        }
    }
}

impl FailReason {
    /// `DeadlinePassed` of a pending job made precise with what the nodes lacked
    /// ([`FailReason::NotPlaced`]); any other reason, or no `shortage`, is kept as it is.
    pub fn explained(self, shortage: Option<NodeShortage>) -> FailReason {
        match (self, shortage) {
            (FailReason::DeadlinePassed, Some(s)) => FailReason::NotPlaced(s),
            (reason, _) => reason,
        }
    }
}

/// Why a pending job could not be placed (paper §3.3): the nodes registered when its
/// deadline passed, how many were alive and eligible for it, and what the others lacked.
/// Made by `crate::sched::shortage`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeShortage {
    /// Nodes the job needs at least (its `min_nodes`, at least 1).
    pub needed: u32,
    /// Its VRAM minimum, bytes.
    pub min_vram_bytes: u64,
    /// Nodes registered with the orchestrator.
    pub registered: u32,
    /// Of those, alive.
    pub alive: u32,
    /// Of those, eligible for this job and free (paper §3.3 and not working for another job).
    pub eligible: u32,
    /// What the alive, ineligible nodes lacked: (reason, how many), most common first.
    /// Reasons: `assigned to another job`, `slashing penalty`, `stake below the minimum`,
    /// `VRAM below the job's minimum`, `uptime below the minimum`.
    pub lacking: Vec<(String, u32)>,
}

impl fmt::Display for NodeShortage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let gib = self.min_vram_bytes as f64 / f64::from(1u32 << 30);
        write!(f, "needs {} node", self.needed)?;
        if self.needed != 1 {
            f.write_str("s")?;
        }
        if self.min_vram_bytes > 0 {
            write!(f, " with at least {gib:.1} GiB of VRAM")?;
        }
        write!(
            f,
            "; {} registered, {} alive, {} eligible and free",
            self.registered, self.alive, self.eligible
        )?;
        if self.eligible >= self.needed {
            f.write_str(" (enough: the placement waited on other jobs' priority or reservation)")?;
        }
        if !self.lacking.is_empty() {
            let parts: Vec<String> = self
                .lacking
                .iter()
                .map(|(why, n)| format!("{n}: {why}"))
                .collect();
            write!(f, " ({})", parts.join(", "))?;
        }
        Ok(())
    }
}

/// Where a job is in its lifecycle (paper §3.1, looped per DESIGN §5).
///
/// Epochs are numbered from 0. Ring versions are those of DESIGN §4 (strictly increasing per
/// job). Heavy data (the ring's members, deltas) lives with the actors, not here.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobPhase {
    /// Submitted, waiting for enough eligible nodes.
    Pending {
        /// When the job was submitted.
        submitted_at: Timestamp,
        /// `submitted_at + pending_deadline_ms`: Pending at or after this fails the job.
        deadline: Timestamp,
    },
    /// Ring built, model being distributed to its members.
    Provisioning {
        /// Version of the job's current ring.
        ring_version: u64,
    },
    /// Training epoch `epoch` in progress.
    Running {
        /// Current epoch, 0-based.
        epoch: u32,
        /// Version of the job's current ring.
        ring_version: u64,
    },
    /// Epoch `epoch`'s deltas being validated, merged and published.
    Aggregating {
        /// Epoch being aggregated, 0-based.
        epoch: u32,
        /// Version of the job's current ring.
        ring_version: u64,
    },
    /// Terminal: every epoch's checkpoint was published.
    Published {
        /// Number of epochs trained (the spec's `epochs`).
        epochs: u32,
        /// The last checkpoint's identifier (its CID).
        checkpoint: String,
    },
    /// Terminal: the job failed.
    Failed {
        /// Why.
        reason: FailReason,
        /// [`JobPhase::name`] of the phase it failed in.
        phase: String,
        /// When the failure was applied.
        at: Timestamp,
    },
}

impl JobPhase {
    /// The phase's name: `Pending`, `Provisioning`, `Running`, `Aggregating`, `Published` or
    /// `Failed`.
    pub fn name(&self) -> &'static str {
        match self {
            JobPhase::Pending { .. } => "Pending",
            JobPhase::Provisioning { .. } => "Provisioning",
            JobPhase::Running { .. } => "Running",
            JobPhase::Aggregating { .. } => "Aggregating",
            JobPhase::Published { .. } => "Published",
            JobPhase::Failed { .. } => "Failed",
        }
    }

    /// True for `Published` and `Failed`: no event is accepted any more.
    pub fn is_terminal(&self) -> bool {
        matches!(self, JobPhase::Published { .. } | JobPhase::Failed { .. })
    }

    /// The current ring version, in the phases that have a ring.
    pub fn ring_version(&self) -> Option<u64> {
        match self {
            JobPhase::Provisioning { ring_version }
            | JobPhase::Running { ring_version, .. }
            | JobPhase::Aggregating { ring_version, .. } => Some(*ring_version),
            _ => None,
        }
    }
}

/// Something that happened to a job; exactly what the event log records (DESIGN §9).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum JobEvent {
    /// Enough nodes were placed and ring `ring_version` built: Pending → Provisioning.
    NodesReady {
        /// Version of the first ring.
        ring_version: u64,
    },
    /// Every ring member has the model: Provisioning → Running(0).
    ModelDistributed,
    /// The ring was reconfigured (DESIGN §4, paper §4.3); the version must strictly increase.
    /// Accepted in Provisioning, Running and Aggregating; the phase is otherwise unchanged.
    RingChanged {
        /// The new ring's version.
        ring_version: u64,
    },
    /// Training of `epoch` finished: Running(epoch) → Aggregating(epoch).
    EpochComplete {
        /// Must equal the running epoch.
        epoch: u32,
    },
    /// Epoch `epoch`'s checkpoint was published: Aggregating(epoch) → Running(epoch + 1), or
    /// → Published after the last epoch (DESIGN §5).
    CheckpointPublished {
        /// Must equal the aggregating epoch.
        epoch: u32,
        /// The checkpoint's identifier (its CID, DESIGN §7).
        checkpoint: String,
        /// What the epoch's aggregation did, when the sink reported it (absent in logs
        /// written before it existed).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        summary: Option<Box<EpochSummary>>,
    },
    /// Any non-terminal phase → Failed with this reason.
    Fail {
        /// Why.
        reason: FailReason,
    },
    /// Any non-terminal phase → Failed with [`FailReason::Cancelled`].
    Cancel,
}

impl JobEvent {
    /// The event's name, e.g. `NodesReady`, for errors and logs.
    pub fn name(&self) -> &'static str {
        match self {
            JobEvent::NodesReady { .. } => "NodesReady",
            JobEvent::ModelDistributed => "ModelDistributed",
            JobEvent::RingChanged { .. } => "RingChanged",
            JobEvent::EpochComplete { .. } => "EpochComplete",
            JobEvent::CheckpointPublished { .. } => "CheckpointPublished",
            JobEvent::Fail { .. } => "Fail",
            JobEvent::Cancel => "Cancel",
        }
    }
}

/// Why [`Job::apply`] refused an event. The job is unchanged whenever one is returned.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum JobError {
    /// The event has no meaning in the current phase.
    #[error("invalid transition: {event} in phase {from}")]
    InvalidTransition {
        /// Name of the current phase.
        from: &'static str,
        /// Name of the refused event.
        event: &'static str,
    },
    /// `EpochComplete` or `CheckpointPublished` named another epoch than the current one.
    #[error("wrong epoch: expected {expected}, got {got}")]
    WrongEpoch {
        /// The current epoch.
        expected: u32,
        /// The epoch the event named.
        got: u32,
    },
    /// `RingChanged` did not strictly increase the ring version.
    #[error("stale ring version: current {current}, got {got}")]
    StaleRingVersion {
        /// The current ring version.
        current: u64,
        /// The version the event carried.
        got: u64,
    },
    /// The job is Published or Failed and accepts nothing.
    #[error("job is terminal ({phase})")]
    Terminal {
        /// Name of the terminal phase.
        phase: &'static str,
    },
}

/// A training job: its spec, its phase and the checkpoints published so far.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// The job's id.
    pub id: JobId,
    /// What was submitted.
    pub spec: JobSpec,
    /// Where it is in its lifecycle.
    pub phase: JobPhase,
    /// One checkpoint identifier (CID) per published epoch, in epoch order.
    pub checkpoints: Vec<String>,
    /// What each published epoch's aggregation did, by epoch (only the epochs whose sink
    /// reported one: a job resumed from the chain has none for the epochs before).
    #[serde(default)]
    pub summaries: BTreeMap<u32, EpochSummary>,
}

impl Job {
    /// A new job in `Pending`, with `deadline = submitted_at + spec.pending_deadline_ms`
    /// (saturating). Does not validate `spec`: call [`JobSpec::validate`] first.
    pub fn new(id: JobId, spec: JobSpec, submitted_at: Timestamp) -> Job {
        let deadline = submitted_at.plus_ms(spec.pending_deadline_ms);
        Job {
            id,
            spec,
            phase: JobPhase::Pending {
                submitted_at,
                deadline,
            },
            checkpoints: Vec::new(),
            summaries: BTreeMap::new(),
        }
    }

    /// A job resumed after `checkpoints` (one CID per published epoch, in order) were
    /// published: `Pending` as [`Job::new`], training from epoch `checkpoints.len()` once
    /// its model is distributed; `Published` (with the last checkpoint) when every epoch
    /// is.
    pub fn resume(
        id: JobId,
        spec: JobSpec,
        submitted_at: Timestamp,
        checkpoints: Vec<String>,
    ) -> Job {
        let mut job = Job::new(id, spec, submitted_at);
        if checkpoints.len() >= job.spec.epochs as usize {
            if let Some(last) = checkpoints.last() {
                job.phase = JobPhase::Published {
                    epochs: job.spec.epochs,
                    checkpoint: last.clone(),
                };
            }
        }
        job.checkpoints = checkpoints;
        job
    }

    /// Applies one event at time `now` (used only to stamp `Failed { at }`). On error the job
    /// is left exactly as it was. See the module docs for the transition table.
    pub fn apply(&mut self, event: &JobEvent, now: Timestamp) -> Result<(), JobError> {
        let from = self.phase.name();
        if self.phase.is_terminal() {
            return Err(JobError::Terminal { phase: from });
        }
        let invalid = || JobError::InvalidTransition {
            from,
            event: event.name(),
        };
        let next = match (&self.phase, event) {
            (_, JobEvent::Fail { reason }) => JobPhase::Failed {
                reason: reason.clone(),
                phase: from.to_string(),
                at: now,
            },
            (_, JobEvent::Cancel) => JobPhase::Failed {
                reason: FailReason::Cancelled,
                phase: from.to_string(),
                at: now,
            },
            (JobPhase::Pending { .. }, JobEvent::NodesReady { ring_version }) => {
                JobPhase::Provisioning {
                    ring_version: *ring_version,
                }
            }
            // A resumed job trains from its first unpublished epoch.
            (JobPhase::Provisioning { ring_version }, JobEvent::ModelDistributed) => {
                JobPhase::Running {
                    epoch: u32::try_from(self.checkpoints.len()).unwrap_or(u32::MAX),
                    ring_version: *ring_version,
                }
            }
            (phase, JobEvent::RingChanged { ring_version: got }) => {
                let current = phase.ring_version().ok_or_else(invalid)?;
                if *got <= current {
                    return Err(JobError::StaleRingVersion { current, got: *got });
                }
                let mut next = phase.clone();
                match &mut next {
                    JobPhase::Provisioning { ring_version }
                    | JobPhase::Running { ring_version, .. }
                    | JobPhase::Aggregating { ring_version, .. } => *ring_version = *got,
                    _ => return Err(invalid()),
                }
                next
            }
            (
                JobPhase::Running {
                    epoch,
                    ring_version,
                },
                JobEvent::EpochComplete { epoch: got },
            ) => {
                if got != epoch {
                    return Err(JobError::WrongEpoch {
                        expected: *epoch,
                        got: *got,
                    });
                }
                JobPhase::Aggregating {
                    epoch: *epoch,
                    ring_version: *ring_version,
                }
            }
            (
                JobPhase::Aggregating {
                    epoch,
                    ring_version,
                },
                JobEvent::CheckpointPublished {
                    epoch: got,
                    checkpoint,
                    summary,
                },
            ) => {
                if got != epoch {
                    return Err(JobError::WrongEpoch {
                        expected: *epoch,
                        got: *got,
                    });
                }
                let next_epoch = epoch.saturating_add(1);
                let next = if next_epoch >= self.spec.epochs {
                    JobPhase::Published {
                        epochs: next_epoch,
                        checkpoint: checkpoint.clone(),
                    }
                } else {
                    JobPhase::Running {
                        epoch: next_epoch,
                        ring_version: *ring_version,
                    }
                };
                self.checkpoints.push(checkpoint.clone());
                if let Some(summary) = summary {
                    self.summaries.insert(*epoch, (**summary).clone());
                }
                next
            }
            _ => return Err(invalid()),
        };
        self.phase = next;
        Ok(())
    }

    /// The event the passage of time calls for at `now`, if any: `Fail { DeadlinePassed }`
    /// when the job is Pending and `now ≥ deadline` (paper §3.1 `Pending { deadline }`).
    /// Pure: the caller applies the event and logs it.
    pub fn tick(&self, now: Timestamp) -> Option<JobEvent> {
        match &self.phase {
            JobPhase::Pending { deadline, .. } if now >= *deadline => Some(JobEvent::Fail {
                reason: FailReason::DeadlinePassed,
            }),
            _ => None,
        }
    }

    /// What the running epoch calls for (DESIGN §5, the epoch's completion rules), if
    /// anything; pure, the caller applies the event and logs it:
    ///
    /// | state | event |
    /// |---|---|
    /// | not Running | none |
    /// | every member of the current ring delivered | `EpochComplete` |
    /// | the epoch's deadline passed with at least one delta | `EpochComplete` (with those) |
    /// | the epoch's deadline passed, or every member delivered, without a single delta (an empty ring) | `Fail { DeadlinePassed }`: publishing an empty checkpoint would report progress that did not happen |
    /// | otherwise | none (wait) |
    ///
    /// `members` is the current ring (`None` before one formed), `delivered(m)` whether
    /// member `m` delivered this epoch, `deltas` how many deltas the epoch accepted, and
    /// `deadline_passed` whether `now ≥ epoch start + epoch_deadline_ms`.
    pub fn epoch_due(
        &self,
        members: Option<&[NodeId]>,
        delivered: impl Fn(&NodeId) -> bool,
        deltas: usize,
        deadline_passed: bool,
    ) -> Option<JobEvent> {
        let JobPhase::Running { epoch, .. } = self.phase else {
            return None;
        };
        let all_delivered = members.is_some_and(|m| m.iter().all(&delivered));
        if !(all_delivered || deadline_passed) {
            return None;
        }
        Some(if deltas > 0 {
            JobEvent::EpochComplete { epoch }
        } else {
            JobEvent::Fail {
                reason: FailReason::DeadlinePassed,
            }
        })
    }

    /// What a new ring of `size` live members calls for (DESIGN §5): `Fail { TooFewNodes }`
    /// when it has fewer than the spec's `min_nodes` and the job has not ended, else none.
    pub fn ring_due(&self, size: u32) -> Option<JobEvent> {
        let min = self.spec.min_nodes;
        (size < min && !self.is_terminal()).then_some(JobEvent::Fail {
            reason: FailReason::TooFewNodes { alive: size, min },
        })
    }

    /// Rebuilds a job from its event log: [`Job::new`] then [`Job::apply`] for each
    /// `(time, event)` in order. A log holds only accepted events, so an error means the log
    /// is corrupt; the first one is returned.
    pub fn replay(
        id: JobId,
        spec: JobSpec,
        submitted_at: Timestamp,
        events: impl IntoIterator<Item = (Timestamp, JobEvent)>,
    ) -> Result<Job, JobError> {
        let mut job = Job::new(id, spec, submitted_at);
        for (at, event) in events {
            job.apply(&event, at)?;
        }
        Ok(job)
    }

    /// True when the job is Published or Failed.
    pub fn is_terminal(&self) -> bool {
        self.phase.is_terminal()
    }

    /// The checkpoint `epoch` trains from ([`EpochAssignment::base`]): the reference
    /// published for `epoch − 1`, or in epoch 0 the spec's `training.base` (`None`: the
    /// recipe's initial weights). `None` too for an epoch whose predecessor is not
    /// published.
    pub fn base_of(&self, epoch: u32) -> Option<&str> {
        match epoch.checked_sub(1) {
            None => self.spec.training.base.as_deref(),
            Some(e) => self.checkpoints.get(e as usize).map(String::as_str),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A resumed job (rebuilt from the chain) trains from its first unpublished epoch, and
    /// one with every epoch published is Published.
    #[test]
    fn a_resumed_job_trains_from_its_first_unpublished_epoch() {
        let spec = spec(4);
        let cps = |n: usize| (0..n).map(|e| format!("cid-{e}")).collect::<Vec<_>>();
        let mut j = Job::resume(JobId(7), spec.clone(), Timestamp(0), cps(2));
        assert!(matches!(j.phase, JobPhase::Pending { .. }));
        j.apply(&JobEvent::NodesReady { ring_version: 1 }, Timestamp(1))
            .unwrap();
        j.apply(&JobEvent::ModelDistributed, Timestamp(2)).unwrap();
        assert!(
            matches!(j.phase, JobPhase::Running { epoch: 2, .. }),
            "{:?}",
            j.phase
        );
        j.apply(&JobEvent::EpochComplete { epoch: 2 }, Timestamp(3))
            .unwrap();
        j.apply(
            &JobEvent::CheckpointPublished {
                epoch: 2,
                checkpoint: "cid-2".into(),
                summary: None,
            },
            Timestamp(4),
        )
        .unwrap();
        assert_eq!(j.checkpoints, cps(3));
        let done = Job::resume(JobId(8), spec, Timestamp(0), cps(4));
        assert_eq!(
            done.phase,
            JobPhase::Published {
                epochs: 4,
                checkpoint: "cid-3".into()
            }
        );
    }
    /// Epoch 0 starts from the spec's base (or the seed's weights), every later epoch from
    /// the checkpoint published before it.
    #[test]
    fn each_epoch_trains_from_the_base_or_the_last_checkpoint() {
        let mut j = Job::new(JobId(1), spec(3), Timestamp(0));
        assert_eq!(j.base_of(0), None);
        j.spec.training.base = Some("bafkrei-base".into());
        assert_eq!(j.base_of(0), Some("bafkrei-base"));
        assert_eq!(j.base_of(1), None);
        j.checkpoints = vec!["cid-0".into(), "cid-1".into()];
        assert_eq!(j.base_of(0), Some("bafkrei-base"));
        assert_eq!(j.base_of(1), Some("cid-0"));
        assert_eq!(j.base_of(2), Some("cid-1"));
        assert_eq!(j.base_of(3), None);
        assert_eq!(j.base_of(u32::MAX), None);
    }

    use proptest::prelude::*;

    fn spec(epochs: u32) -> JobSpec {
        JobSpec {
            name: "llama-ft".into(),
            epochs,
            min_nodes: 2,
            max_nodes: 8,
            min_vram_bytes: 24 << 30,
            pending_deadline_ms: 60_000,
            epoch_deadline_ms: 3_600_000,
            utility: 1.5,
            submitter_stake: GymWei::gym(50_000),
            training: Default::default(),
        }
    }

    const T0: Timestamp = Timestamp(1_000_000);

    fn job(epochs: u32) -> Job {
        Job::new(JobId(7), spec(epochs), T0)
    }

    fn ok(j: &mut Job, e: JobEvent) {
        j.apply(&e, T0).expect("transition accepted");
    }

    fn running0(epochs: u32) -> Job {
        let mut j = job(epochs);
        ok(&mut j, JobEvent::NodesReady { ring_version: 1 });
        ok(&mut j, JobEvent::ModelDistributed);
        j
    }

    fn published_event(epoch: u32) -> JobEvent {
        JobEvent::CheckpointPublished {
            epoch,
            checkpoint: format!("cid-{epoch}"),
            summary: None,
        }
    }

    // ---- the epoch's completion rules ----

    fn nodes(n: u8) -> Vec<NodeId> {
        (1..=n).map(|i| NodeId([i; 32])).collect()
    }

    #[test]
    fn epoch_completes_when_every_member_delivered() {
        let j = running0(3);
        let ring = nodes(3);
        let due = j.epoch_due(Some(&ring), |_| true, 3, false);
        assert_eq!(due, Some(JobEvent::EpochComplete { epoch: 0 }));
    }

    #[test]
    fn epoch_waits_for_a_missing_member_before_its_deadline() {
        let j = running0(3);
        let ring = nodes(3);
        let missing = ring[2];
        assert_eq!(j.epoch_due(Some(&ring), |m| *m != missing, 2, false), None);
        // Without a ring, nothing is complete until the deadline.
        assert_eq!(j.epoch_due(None, |_| true, 2, false), None);
    }

    #[test]
    fn epoch_at_its_deadline_completes_with_the_deltas_it_has() {
        let j = running0(3);
        let ring = nodes(3);
        let first = ring[0];
        let due = j.epoch_due(Some(&ring), |m| *m == first, 1, true);
        assert_eq!(due, Some(JobEvent::EpochComplete { epoch: 0 }));
    }

    #[test]
    fn empty_epoch_at_its_deadline_fails_the_job() {
        let j = running0(3);
        let ring = nodes(3);
        let due = j.epoch_due(Some(&ring), |_| false, 0, true);
        assert_eq!(
            due,
            Some(JobEvent::Fail {
                reason: FailReason::DeadlinePassed
            })
        );
        let mut failed = j.clone();
        failed.apply(&due.unwrap(), T0).unwrap();
        assert!(failed.is_terminal());
    }

    /// An empty ring (every member removed) with no delta fails the job rather than
    /// publish an empty checkpoint, as before the rules moved into the core.
    #[test]
    fn an_empty_ring_without_a_delta_fails_rather_than_publish() {
        let j = running0(3);
        assert_eq!(
            j.epoch_due(Some(&[]), |_| false, 0, false),
            Some(JobEvent::Fail {
                reason: FailReason::DeadlinePassed
            })
        );
        assert_eq!(
            j.epoch_due(Some(&[]), |_| false, 2, false),
            Some(JobEvent::EpochComplete { epoch: 0 })
        );
    }

    #[test]
    fn epoch_rules_only_apply_while_running() {
        let ring = nodes(2);
        let pending = job(3);
        assert_eq!(pending.epoch_due(Some(&ring), |_| true, 2, true), None);
        let mut aggregating = running0(3);
        ok(&mut aggregating, JobEvent::EpochComplete { epoch: 0 });
        assert_eq!(aggregating.epoch_due(Some(&ring), |_| true, 2, true), None);
    }

    #[test]
    fn ring_below_min_nodes_fails_the_job() {
        let j = running0(3);
        assert_eq!(
            j.ring_due(1),
            Some(JobEvent::Fail {
                reason: FailReason::TooFewNodes { alive: 1, min: 2 }
            })
        );
        assert_eq!(j.ring_due(2), None);
        let mut cancelled = j.clone();
        ok(&mut cancelled, JobEvent::Cancel);
        assert_eq!(
            cancelled.ring_due(0),
            None,
            "an ended job is not failed again"
        );
    }

    proptest! {
        /// Completion never comes early: `EpochComplete` only when every member delivered
        /// or the deadline passed, with at least one delta, and always for the running
        /// epoch; an epoch without a delta fails the job instead; a job whose deadline
        /// passed is never left waiting.
        #[test]
        fn epoch_due_matches_its_rules(
            members in 0u8..6,
            delivered_mask in any::<u8>(),
            deadline_passed in any::<bool>(),
            epoch_published in 0u32..3,
        ) {
            let mut j = running0(5);
            for e in 0..epoch_published {
                ok(&mut j, JobEvent::EpochComplete { epoch: e });
                ok(&mut j, published_event(e));
            }
            let ring = nodes(members);
            let delivered = |m: &NodeId| delivered_mask & (1 << (m.0[0] - 1)) != 0;
            let count = ring.iter().filter(|m| delivered(m)).count();
            let all = ring.iter().all(delivered);
            match j.epoch_due(Some(&ring), delivered, count, deadline_passed) {
                Some(JobEvent::EpochComplete { epoch }) => {
                    prop_assert_eq!(epoch, epoch_published);
                    prop_assert!((all || deadline_passed) && count > 0);
                }
                Some(JobEvent::Fail { reason }) => {
                    prop_assert_eq!(reason, FailReason::DeadlinePassed);
                    prop_assert!((all || deadline_passed) && count == 0);
                }
                Some(other) => prop_assert!(false, "unexpected {:?}", other),
                None => prop_assert!(!deadline_passed && !all),
            }
        }
    }

    // ---- JobSpec ----

    #[test]
    fn spec_valid() {
        assert_eq!(spec(3).validate(), Ok(()));
    }

    #[test]
    fn spec_each_bad_field() {
        type Mutation = Box<dyn Fn(&mut JobSpec)>;
        let cases: Vec<(Mutation, JobSpecError)> = vec![
            (Box::new(|s| s.name = "  ".into()), JobSpecError::EmptyName),
            (Box::new(|s| s.epochs = 0), JobSpecError::ZeroEpochs),
            (Box::new(|s| s.min_nodes = 0), JobSpecError::ZeroMinNodes),
            (
                Box::new(|s| s.max_nodes = 1),
                JobSpecError::MaxBelowMin { min: 2, max: 1 },
            ),
            (
                Box::new(|s| s.pending_deadline_ms = 0),
                JobSpecError::ZeroPendingDeadline,
            ),
            (
                Box::new(|s| s.epoch_deadline_ms = 0),
                JobSpecError::ZeroEpochDeadline,
            ),
            (
                Box::new(|s| s.utility = f64::INFINITY),
                JobSpecError::NonFiniteUtility(f64::INFINITY),
            ),
            (
                Box::new(|s| s.utility = 0.0),
                JobSpecError::NonPositiveUtility(0.0),
            ),
            (
                Box::new(|s| s.utility = -1.0),
                JobSpecError::NonPositiveUtility(-1.0),
            ),
        ];
        for (mutate, want) in cases {
            let mut s = spec(3);
            mutate(&mut s);
            assert_eq!(s.validate(), Err(want));
        }
        let mut s = spec(3);
        s.utility = f64::NAN;
        assert!(matches!(
            s.validate(),
            Err(JobSpecError::NonFiniteUtility(u)) if u.is_nan()
        ));
    }

    #[test]
    fn spec_serde_roundtrip_and_unknown_fields() {
        let s = spec(3);
        let text = serde_json::to_string(&s).expect("serialise");
        let back: JobSpec = serde_json::from_str(&text).expect("deserialise");
        assert_eq!(back, s);
        let mut v: serde_json::Value = serde_json::from_str(&text).expect("json");
        v["surprise"] = serde_json::json!(1);
        assert!(serde_json::from_value::<JobSpec>(v).is_err());
    }

    // ---- transitions ----

    #[test]
    fn new_is_pending_with_deadline() {
        let j = job(1);
        assert_eq!(
            j.phase,
            JobPhase::Pending {
                submitted_at: T0,
                deadline: T0.plus_ms(60_000)
            }
        );
        assert_eq!(j.phase.name(), "Pending");
        assert!(!j.is_terminal());
        assert!(j.checkpoints.is_empty());
    }

    #[test]
    fn pending_to_provisioning() {
        let mut j = job(1);
        ok(&mut j, JobEvent::NodesReady { ring_version: 4 });
        assert_eq!(j.phase, JobPhase::Provisioning { ring_version: 4 });
    }

    #[test]
    fn provisioning_to_running0() {
        let j = running0(2);
        assert_eq!(
            j.phase,
            JobPhase::Running {
                epoch: 0,
                ring_version: 1
            }
        );
    }

    #[test]
    fn running_to_aggregating() {
        let mut j = running0(2);
        ok(&mut j, JobEvent::EpochComplete { epoch: 0 });
        assert_eq!(
            j.phase,
            JobPhase::Aggregating {
                epoch: 0,
                ring_version: 1
            }
        );
    }

    #[test]
    fn aggregating_loops_then_publishes() {
        let mut j = running0(2);
        ok(&mut j, JobEvent::EpochComplete { epoch: 0 });
        ok(&mut j, published_event(0));
        assert_eq!(
            j.phase,
            JobPhase::Running {
                epoch: 1,
                ring_version: 1
            }
        );
        ok(&mut j, JobEvent::EpochComplete { epoch: 1 });
        ok(&mut j, published_event(1));
        assert_eq!(
            j.phase,
            JobPhase::Published {
                epochs: 2,
                checkpoint: "cid-1".into()
            }
        );
        assert_eq!(j.checkpoints, vec!["cid-0".to_string(), "cid-1".into()]);
        assert!(j.is_terminal());
    }

    #[test]
    fn ring_changed_in_each_ring_phase() {
        let mut j = job(2);
        ok(&mut j, JobEvent::NodesReady { ring_version: 1 });
        ok(&mut j, JobEvent::RingChanged { ring_version: 2 });
        assert_eq!(j.phase, JobPhase::Provisioning { ring_version: 2 });
        ok(&mut j, JobEvent::ModelDistributed);
        ok(&mut j, JobEvent::RingChanged { ring_version: 5 });
        assert_eq!(
            j.phase,
            JobPhase::Running {
                epoch: 0,
                ring_version: 5
            }
        );
        ok(&mut j, JobEvent::EpochComplete { epoch: 0 });
        ok(&mut j, JobEvent::RingChanged { ring_version: 6 });
        assert_eq!(
            j.phase,
            JobPhase::Aggregating {
                epoch: 0,
                ring_version: 6
            }
        );
        ok(&mut j, published_event(0));
        assert_eq!(
            j.phase,
            JobPhase::Running {
                epoch: 1,
                ring_version: 6
            }
        );
    }

    #[test]
    fn fail_and_cancel_from_every_non_terminal_phase() {
        let builders: Vec<fn() -> Job> = vec![
            || job(2),
            || {
                let mut j = job(2);
                ok(&mut j, JobEvent::NodesReady { ring_version: 1 });
                j
            },
            || running0(2),
            || {
                let mut j = running0(2);
                ok(&mut j, JobEvent::EpochComplete { epoch: 0 });
                j
            },
        ];
        for build in builders {
            let mut j = build();
            let name = j.phase.name();
            let at = Timestamp(42);
            j.apply(
                &JobEvent::Fail {
                    reason: FailReason::TooFewNodes { alive: 1, min: 2 },
                },
                at,
            )
            .expect("fail accepted");
            assert_eq!(
                j.phase,
                JobPhase::Failed {
                    reason: FailReason::TooFewNodes { alive: 1, min: 2 },
                    phase: name.into(),
                    at
                }
            );
            let mut j = build();
            j.apply(&JobEvent::Cancel, at).expect("cancel accepted");
            assert_eq!(
                j.phase,
                JobPhase::Failed {
                    reason: FailReason::Cancelled,
                    phase: name.into(),
                    at
                }
            );
        }
    }

    // ---- errors ----

    #[test]
    fn invalid_transition_errors() {
        let mut j = job(1);
        let before = j.clone();
        assert_eq!(
            j.apply(&JobEvent::ModelDistributed, T0),
            Err(JobError::InvalidTransition {
                from: "Pending",
                event: "ModelDistributed"
            })
        );
        assert_eq!(
            j.apply(&JobEvent::RingChanged { ring_version: 9 }, T0),
            Err(JobError::InvalidTransition {
                from: "Pending",
                event: "RingChanged"
            })
        );
        assert_eq!(j, before);
        ok(&mut j, JobEvent::NodesReady { ring_version: 1 });
        assert_eq!(
            j.apply(&JobEvent::NodesReady { ring_version: 2 }, T0),
            Err(JobError::InvalidTransition {
                from: "Provisioning",
                event: "NodesReady"
            })
        );
        assert_eq!(
            j.apply(&JobEvent::EpochComplete { epoch: 0 }, T0),
            Err(JobError::InvalidTransition {
                from: "Provisioning",
                event: "EpochComplete"
            })
        );
        ok(&mut j, JobEvent::ModelDistributed);
        assert_eq!(
            j.apply(&published_event(0), T0),
            Err(JobError::InvalidTransition {
                from: "Running",
                event: "CheckpointPublished"
            })
        );
        ok(&mut j, JobEvent::EpochComplete { epoch: 0 });
        assert_eq!(
            j.apply(&JobEvent::EpochComplete { epoch: 0 }, T0),
            Err(JobError::InvalidTransition {
                from: "Aggregating",
                event: "EpochComplete"
            })
        );
    }

    #[test]
    fn wrong_epoch_errors() {
        let mut j = running0(3);
        let before = j.clone();
        assert_eq!(
            j.apply(&JobEvent::EpochComplete { epoch: 1 }, T0),
            Err(JobError::WrongEpoch {
                expected: 0,
                got: 1
            })
        );
        assert_eq!(j, before);
        ok(&mut j, JobEvent::EpochComplete { epoch: 0 });
        let before = j.clone();
        assert_eq!(
            j.apply(&published_event(2), T0),
            Err(JobError::WrongEpoch {
                expected: 0,
                got: 2
            })
        );
        assert_eq!(j, before);
    }

    #[test]
    fn stale_ring_version_errors() {
        let mut j = running0(1);
        let before = j.clone();
        for got in [0, 1] {
            assert_eq!(
                j.apply(&JobEvent::RingChanged { ring_version: got }, T0),
                Err(JobError::StaleRingVersion { current: 1, got })
            );
        }
        assert_eq!(j, before);
    }

    #[test]
    fn terminal_errors() {
        let mut j = running0(1);
        ok(&mut j, JobEvent::EpochComplete { epoch: 0 });
        ok(&mut j, published_event(0));
        assert_eq!(
            j.apply(&JobEvent::Cancel, T0),
            Err(JobError::Terminal { phase: "Published" })
        );
        let mut j = job(1);
        ok(&mut j, JobEvent::Cancel);
        assert_eq!(
            j.apply(&JobEvent::NodesReady { ring_version: 1 }, T0),
            Err(JobError::Terminal { phase: "Failed" })
        );
    }

    #[test]
    fn tick_deadline() {
        let j = job(1);
        assert_eq!(j.tick(T0.plus_ms(59_999)), None);
        let ev = j.tick(T0.plus_ms(60_000)).expect("deadline reached");
        assert_eq!(
            ev,
            JobEvent::Fail {
                reason: FailReason::DeadlinePassed
            }
        );
        let mut j2 = j.clone();
        j2.apply(&ev, T0.plus_ms(60_000)).expect("fail accepted");
        assert_eq!(j2.tick(T0.plus_ms(1_000_000)), None);
        assert_eq!(running0(1).tick(Timestamp(u64::MAX)), None);
    }

    #[test]
    fn names_and_display() {
        assert_eq!(
            FailReason::TooFewNodes { alive: 1, min: 3 }.to_string(),
            "too few nodes: 1 alive, 3 needed"
        );
        assert_eq!(
            FailReason::PublicationFailed("ipfs down".into()).to_string(),
            "publication failed: ipfs down"
        );
        assert_eq!(FailReason::Cancelled.to_string(), "cancelled");
        assert_eq!(FailReason::DeadlinePassed.to_string(), "deadline passed");
        assert_eq!(FailReason::Other("x".into()).to_string(), "x");
        assert_eq!(JobEvent::Cancel.name(), "Cancel");
    }

    #[test]
    fn event_and_phase_serde_roundtrip() {
        let events = vec![
            JobEvent::NodesReady { ring_version: 1 },
            JobEvent::ModelDistributed,
            JobEvent::RingChanged { ring_version: 2 },
            JobEvent::EpochComplete { epoch: 0 },
            published_event(0),
            JobEvent::Fail {
                reason: FailReason::PublicationFailed("x".into()),
            },
            JobEvent::Cancel,
        ];
        for e in events {
            let text = serde_json::to_string(&e).expect("serialise");
            assert_eq!(serde_json::from_str::<JobEvent>(&text).expect("parse"), e);
        }
        let j = running0(2);
        let text = serde_json::to_string(&j).expect("serialise");
        assert_eq!(serde_json::from_str::<Job>(&text).expect("parse"), j);
    }

    // ---- properties ----

    fn arb_reason() -> impl Strategy<Value = FailReason> {
        prop_oneof![
            Just(FailReason::DeadlinePassed),
            (0u32..5, 0u32..5).prop_map(|(alive, min)| FailReason::TooFewNodes { alive, min }),
            "[a-z]{0,4}".prop_map(FailReason::PublicationFailed),
            Just(FailReason::Cancelled),
            "[a-z]{0,4}".prop_map(FailReason::Other),
        ]
    }

    /// Events biased towards valid ones (small epochs and ring versions), with rare failures.
    fn arb_event() -> impl Strategy<Value = JobEvent> {
        prop_oneof![
            3 => (0u64..6).prop_map(|ring_version| JobEvent::NodesReady { ring_version }),
            3 => Just(JobEvent::ModelDistributed),
            3 => (0u64..12).prop_map(|ring_version| JobEvent::RingChanged { ring_version }),
            6 => (0u32..5).prop_map(|epoch| JobEvent::EpochComplete { epoch }),
            6 => (0u32..5, "[a-f0-9]{2}")
                .prop_map(|(epoch, checkpoint)| JobEvent::CheckpointPublished {
                    epoch,
                    checkpoint,
                    summary: None,
                }),
            1 => arb_reason().prop_map(|reason| JobEvent::Fail { reason }),
            1 => Just(JobEvent::Cancel),
        ]
    }

    fn epoch_of(p: &JobPhase) -> Option<u32> {
        match p {
            JobPhase::Running { epoch, .. } | JobPhase::Aggregating { epoch, .. } => Some(*epoch),
            _ => None,
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn random_sequences_keep_invariants(
            epochs in 1u32..4,
            events in prop::collection::vec((0u64..10_000, arb_event()), 0..60),
        ) {
            let mut j = Job::new(JobId(1), spec(epochs), T0);
            let mut accepted: Vec<(Timestamp, JobEvent)> = Vec::new();
            let mut published_epochs: Vec<u32> = Vec::new();
            for (dt, ev) in events {
                let now = T0.plus_ms(dt);
                let before = j.clone();
                let was_terminal = j.is_terminal();
                match j.apply(&ev, now) {
                    Ok(()) => {
                        prop_assert!(!was_terminal, "terminal job accepted {:?}", ev);
                        // Epochs only move forward, by exactly 1.
                        if let (Some(a), Some(b)) = (epoch_of(&before.phase), epoch_of(&j.phase)) {
                            prop_assert!(b == a || b == a + 1);
                        }
                        // Ring versions strictly increase on RingChanged.
                        if let JobEvent::RingChanged { ring_version } = &ev {
                            prop_assert!(Some(*ring_version) > before.phase.ring_version());
                            prop_assert_eq!(j.phase.ring_version(), Some(*ring_version));
                        }
                        if let JobEvent::CheckpointPublished { epoch, .. } = &ev {
                            published_epochs.push(*epoch);
                        }
                        accepted.push((now, ev));
                    }
                    Err(e) => {
                        prop_assert_eq!(&j, &before, "error {} changed the job", e);
                        if was_terminal {
                            let is_terminal_err = matches!(e, JobError::Terminal { .. });
                            prop_assert!(is_terminal_err);
                        }
                    }
                }
                // Published iff exactly `epochs` checkpoints, published in epoch order.
                let expected: Vec<u32> = (0..published_epochs.len() as u32).collect();
                prop_assert_eq!(&published_epochs, &expected);
                prop_assert_eq!(j.checkpoints.len(), published_epochs.len());
                let is_published = matches!(j.phase, JobPhase::Published { .. });
                prop_assert_eq!(is_published, published_epochs.len() as u32 == epochs);
                if let JobPhase::Published { epochs: n, .. } = &j.phase {
                    prop_assert_eq!(*n, epochs);
                }
                prop_assert!(published_epochs.len() as u32 <= epochs);
            }
            // Replay of the accepted events gives the live job.
            let replayed = Job::replay(JobId(1), spec(epochs), T0, accepted.clone());
            prop_assert_eq!(replayed, Ok(j.clone()));
            // Once terminal, every event errs with Terminal.
            if j.is_terminal() {
                for ev in [JobEvent::Cancel, JobEvent::ModelDistributed, published_event(0)] {
                    let mut k = j.clone();
                    let is_terminal_err =
                        matches!(k.apply(&ev, T0), Err(JobError::Terminal { .. }));
                    prop_assert!(is_terminal_err);
                    prop_assert_eq!(&k, &j);
                }
            } else {
                // Failed (via Fail or Cancel) is reachable from every non-terminal phase.
                let mut k = j.clone();
                prop_assert!(k.apply(&JobEvent::Cancel, T0).is_ok());
                let is_cancelled =
                    matches!(&k.phase, JobPhase::Failed { reason: FailReason::Cancelled, .. });
                prop_assert!(is_cancelled);
                let mut k = j.clone();
                let fail = JobEvent::Fail { reason: FailReason::DeadlinePassed };
                prop_assert!(k.apply(&fail, T0).is_ok());
                let is_failed = matches!(&k.phase, JobPhase::Failed { .. });
                prop_assert!(is_failed);
            }
        }

        #[test]
        fn happy_path_publishes_after_exactly_epochs(epochs in 1u32..20) {
            let mut j = running0(epochs);
            for e in 0..epochs {
                prop_assert!(!j.is_terminal());
                j.apply(&JobEvent::EpochComplete { epoch: e }, T0).map_err(|e| TestCaseError::fail(e.to_string()))?;
                j.apply(&published_event(e), T0).map_err(|e| TestCaseError::fail(e.to_string()))?;
            }
            let is_published = matches!(j.phase, JobPhase::Published { epochs: n, .. } if n == epochs);
            prop_assert!(is_published);
            prop_assert_eq!(j.checkpoints.len() as u32, epochs);
        }
    }
}
