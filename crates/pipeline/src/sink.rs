//! [`TrainingSink`]: the [`CheckpointSink`] that turns an epoch's accepted deltas into the
//! next checkpoint (DESIGN §6, paper §5–§6): fetch each delta from the blob store, judge it
//! on the [`ValidatorPool`], choose the aggregator ([`RobustPolicy`]), merge with the
//! composite scores as weights, apply the merged delta with the job's outer learning rate,
//! publish the new checkpoint (safetensors) through the [`Publication`] ports, and settle
//! the epoch on the ledger ([`Economics`]: rewards by score, slashes for failed spot-checks).
//!
//! The sink is a handle to the model keeper, an actor that routes each job's calls to that
//! job's keeper, an actor it spawns on the job's first call and supervises. A job's keeper
//! owns the job's model state (the current weights, the running norm average, the last
//! merged delta), its epoch reports and the epochs whose settlement or repo push is still
//! owed; the model keeper holds a copy of every job's reports, from which it answers
//! [`TrainingSink::report`] at once, even while that job aggregates.
//!
//! ```text
//! Keeper (routes by job, every job's reports, the retry ticker)
//! └── JobKeeper per job (its model, reports, settlements and pushes owed)
//! ```
//!
//! **Concurrency.** Publications of different jobs run concurrently: a job's aggregation
//! (fetching its deltas, validating them on the shared [`ValidatorPool`], merging on the
//! blocking thread pool, staging, pushing, settling) occupies only its own keeper, so a
//! slow epoch of one job neither delays another job's publication nor counts against its
//! `publish_deadline_ms`. Calls for one job are served one after the other in the order
//! they came: a second call for an epoch (a rebuilt job actor asking again while the first
//! call still runs) waits for the first and gets the same checkpoint back, without merging
//! again. An epoch's settlement and repo push are made and retried by its own job's keeper
//! only, so no two calls for the same epoch reach the ledger or the registry at once;
//! ledger calls of different jobs may overlap (they name different epochs, and the chain
//! adapter serialises its transactions). A job keeper that fails is counted as
//! `actor_restarts{keeper}` and rebuilt on the job's next call from the reports the model
//! keeper holds (what is owed is retried) and the publication journal (an epoch it was
//! staging is finished as staged).
//!
//! **LoRA jobs.** Nodes upload adapters (the factors `A`, `B` in the trainer's delta layout);
//! the validator judges each by its update `ΔW = (alpha/r)·B·A` on the full model, and the
//! merge aggregates the nodes' `ΔWᵢ` module by module ([`crate::lora`]), never the factors.
//! Every checkpoint is a full model (`base + outer_lr·ΔW`), and the last merged update kept
//! for the next epoch's convergence score is `ΔW` in the full layout.
//!
//! Checkpoint references are the IPFS CIDs of the safetensors bytes (Kubo's
//! `ipfs add --cid-version=1`). Idempotent per (job, epoch): a second call returns the
//! first reference, and a publication staged in the journal before a crash
//! ([`crate::publisher`]) is finished as staged, not merged again. Each checkpoint's
//! signed publication record is recorded on the ledger with the epoch's rewards; a repo push
//! or a settlement that failed transiently is retried at the job's next publication and
//! every [`RETRY_EVERY`]. After a daemon restart the keeper reloads a job's weights from the base
//! checkpoint the core names; the norm average and the last merged delta restart empty
//! (stability then scores 1 and convergence drops out, as in epoch 0), until the state
//! store keeps them.

use hanzod_actors::ports::{Counter, Histogram};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use std::time::Duration;

use async_trait::async_trait;
use ractor::{Actor, ActorProcessingErr, ActorRef, MessagingErr, RpcReplyPort, SupervisionEvent};
use serde::{Deserialize, Serialize};

use crate::lora::{apply_lora_merge_with_update, FlatAdapter, LoraError, LoraPlan};
use crate::merge::{
    Aggregator, CoordinateMedian, KeepReason, MergeOutcome, RobustPolicy, WeightedMean,
};
use crate::publisher::{Checkpoint, Publisher, Staged};
use crate::score::{Commitment, EpochSecret, NormTracker};
use crate::validate::{
    seed_norms, EpochContext, Rejection, SlashEvidence, SpotCheck, Submission, ValidationConfig,
    ValidatorPool, Verdict, SUSPECT_LOSS_RISE,
};
use hanzod_actors::job::{EpochOutcome, EpochSummary, JobSpec, TrainingSpec};
use hanzod_actors::ports::memory::MemoryStateStore;
use hanzod_actors::ports::{
    ChainError, CheckpointError, CheckpointSink, Clock, DeltaReceipt, EpochInput, Ledger,
    LedgerError, Metrics, PublishedEpoch, StateStore, SystemClock,
};
use hanzod_actors::rewards::split_rewards;
use hanzod_actors::types::{GymWei, JobId, NodeId};
use hanzod_protocol::identity::Identity;
use hanzod_protocol::model::ModelSpec;
use hanzod_protocol::record::SignedPublication;
use hanzod_store::blobs::BlobStore;
use hanzod_store::registry::Location;
use hanzod_store::{MemoryObjectStore, ModelCard, ModelRegistry, ModelUpload, ObjectStore};
use hanzod_train::catalog::ModelCatalog;
use hanzod_train::{Layout, Trainer, Weights};

/// Tunables of the sink.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SinkConfig {
    /// The validator's tunables.
    pub validation: ValidationConfig,
    /// Fraction of suspect deltas above which the robust aggregator is used (DESIGN §6:
    /// 0.30).
    pub suspect_threshold: f32,
    /// Validator workers.
    pub workers: usize,
    /// Keep every delta blob (`false`: an epoch's deltas are removed once the next epoch
    /// is published, except those that are slashing evidence).
    pub retain_deltas: bool,
}

impl Default for SinkConfig {
    fn default() -> Self {
        SinkConfig {
            validation: ValidationConfig::default(),
            suspect_threshold: 0.30,
            workers: std::thread::available_parallelism().map_or(2, |n| n.get()),
            retain_deltas: false,
        }
    }
}

/// The license the model cards name unless an embedder sets another (SPDX id).
pub const DEFAULT_LICENSE: &str = "apache-2.0";

/// How long one epoch's settlement (all its ledger calls) may take before it counts as
/// failed (and is retried at the job's next publication).
pub const LEDGER_TIMEOUT: Duration = Duration::from_secs(10);

/// The epoch's economics (paper §8): where rewards are paid and stakes slashed, and how
/// much.
#[derive(Debug, Clone)]
pub struct Economics {
    /// The ledger (the embedded one, or the chain adapter).
    pub ledger: Arc<dyn Ledger>,
    /// The reward pool of one epoch, GYM wei.
    pub epoch_pool: GymWei,
    /// Percent of stake slashed per failed spot-check (1..=100).
    pub slash_pct: u8,
    /// The stake a node's operator must still hold at settlement for its share to be paid
    /// (paper §3.3: 10,000 GYM), GYM wei. Nodes below it, or under an active slashing
    /// penalty, are left out of the epoch's batch.
    pub min_stake: GymWei,
    /// The bound of one epoch's whole settlement ([`LEDGER_TIMEOUT`] for the embedded
    /// ledger; on a chain, several transactions' worth).
    pub settle_timeout: Duration,
}

impl Economics {
    /// Economics on `ledger` with a pool of `epoch_pool` GYM wei per epoch, slashing
    /// `slash_pct` % per failed spot-check, a minimum stake of 10,000 GYM and
    /// [`LEDGER_TIMEOUT`].
    pub fn new(ledger: Arc<dyn Ledger>, epoch_pool: GymWei, slash_pct: u8) -> Economics {
        Economics {
            ledger,
            epoch_pool,
            slash_pct,
            min_stake: GymWei::gym(10_000),
            settle_timeout: LEDGER_TIMEOUT,
        }
    }
}

/// A reward paid for an epoch.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RewardLine {
    /// The node (hex key).
    pub node: String,
    /// The composite score the share was computed from.
    pub score: f64,
    /// GYM wei, as a decimal string (u128 does not fit JSON numbers).
    pub amount_wei: String,
}

/// A slash applied for an epoch.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SlashLine {
    /// The node (hex key).
    pub node: String,
    /// Percent of its stake.
    pub pct: u8,
    /// GYM wei removed, as a decimal string.
    pub slashed_wei: String,
    /// The stake left, GYM wei, as a decimal string.
    pub stake_after_wei: String,
}

/// One delta's line in an [`EpochReport`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeltaReport {
    /// The node (hex key).
    pub node: String,
    /// The delta hash (hex).
    pub delta_hash: String,
    /// Claimed loss.
    pub claimed_loss: f64,
    /// Validation loss of base + delta.
    pub loss_after: Option<f64>,
    /// L2 norm.
    pub norm: Option<f64>,
    /// Loss improvement, stability, convergence, composite.
    pub score: Option<crate::score::QualityScore>,
    /// The weight the merge gave it: the composite under the weighted mean (0 when
    /// suspect), 1 under the median, 0 when rejected or when the epoch kept its base.
    pub weight: f32,
    /// Suspect (counts towards the robust-merge threshold).
    pub suspect: bool,
    /// The spot-check, when selected.
    pub spot_check: Option<SpotCheck>,
    /// Why rejected (`None`: accepted).
    pub rejected: Option<Rejection>,
}

/// What one epoch's aggregation did: every number needed to audit it (DESIGN §6: anyone
/// holding the revealed secret recomputes the spot-check choice).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EpochReport {
    /// Job id.
    pub job: u64,
    /// Epoch.
    pub epoch: u32,
    /// The base checkpoint reference (`None`: the recipe's initial weights).
    pub base: Option<String>,
    /// The new checkpoint reference.
    pub checkpoint: String,
    /// Validation loss of the base.
    pub loss_before: f64,
    /// Validation loss of the new checkpoint.
    pub loss_after: f64,
    /// `SHA-256(secret)` (hex), committed at epoch start.
    pub commitment: String,
    /// The revealed secret (hex).
    pub secret: String,
    /// Spot-check rate.
    pub spot_check_rate: f64,
    /// The aggregator used, or `None` when the epoch kept the base checkpoint.
    pub aggregator: Option<String>,
    /// Why the base checkpoint was kept, when it was.
    pub kept: Option<String>,
    /// Suspect deltas / all deltas.
    pub suspect: usize,
    /// Every delta, in node order.
    pub deltas: Vec<DeltaReport>,
    /// Evidence for slashing, one per failed spot-check.
    pub slashes: Vec<SlashEvidence>,
    /// Rewards paid for the epoch (empty without [`Economics`], or when nothing was
    /// merged: an epoch that kept its base pays nobody).
    pub rewards: Vec<RewardLine>,
    /// Slashes applied for the epoch's evidence.
    pub slashed: Vec<SlashLine>,
    /// The Hugging Face repo the checkpoint was published as, when a registry is set.
    pub repo: Option<String>,
    /// Where that repo is (a folder, or a URL).
    pub location: Option<String>,
    /// Why the registry refused the checkpoint, when it did (the checkpoint is published
    /// by CID in the object store either way).
    pub registry_error: Option<String>,
    /// Why paying or slashing failed, when it did (the checkpoint is published anyway;
    /// the ledger is idempotent per epoch and per evidence, so a retry pays nothing twice).
    pub settlement_error: Option<String>,
    /// The signed publication record of the checkpoint (DESIGN §7), recorded on the ledger
    /// with the epoch's rewards.
    #[serde(default)]
    pub publication: Option<SignedPublication>,
}

impl EpochReport {
    /// The few numbers the job records with its checkpoint (`hanzod job status`): advanced
    /// or kept and why, the losses, the deltas accepted / suspect / rejected, the
    /// spot-checks, and the rewards and slashes recorded so far.
    pub fn summary(&self) -> EpochSummary {
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let wei = |s: &str| s.parse::<u128>().unwrap_or(0);
        let rejected = self.deltas.iter().filter(|d| d.rejected.is_some()).count();
        let checks = self.deltas.iter().filter_map(|d| d.spot_check.as_ref());
        let outcome = match (&self.aggregator, &self.kept) {
            (Some(aggregator), None) => EpochOutcome::Advanced {
                aggregator: aggregator.clone(),
            },
            (_, Some(reason)) => EpochOutcome::Kept {
                reason: reason.clone(),
            },
            (None, None) => EpochOutcome::Kept {
                reason: "nothing was merged".into(),
            },
        };
        EpochSummary {
            outcome,
            loss_before: self.loss_before,
            loss_after: self.loss_after,
            accepted: count(self.deltas.len() - rejected),
            // Of the accepted deltas (the report's `suspect` also counts rejected ones,
            // which count towards the robust-merge threshold).
            suspect: count(
                self.deltas
                    .iter()
                    .filter(|d| d.suspect && d.rejected.is_none())
                    .count(),
            ),
            rejected: count(rejected),
            spot_checked: count(checks.clone().count()),
            spot_checks_failed: count(checks.filter(|c| !c.passed).count()),
            rewarded_nodes: count(self.rewards.len()),
            rewards: GymWei(self.rewards.iter().map(|r| wei(&r.amount_wei)).sum()),
            slashed_nodes: count(self.slashed.len()),
            slashed: GymWei(self.slashed.iter().map(|s| wei(&s.slashed_wei)).sum()),
            repo: self.repo.clone(),
            registry_error: self.registry_error.clone(),
            settlement_error: self.settlement_error.clone(),
        }
    }
}

/// The model state of one job.
struct JobModel {
    trainer: Trainer,
    current: Arc<Weights>,
    current_ref: Option<String>,
    norms: NormTracker,
    /// The last merged update, in the model's (full) layout ([`Merged::delta`]).
    last_merged: Option<Arc<Vec<f32>>>,
    /// Blobs of the previous epoch's deltas, removed once the next epoch is published.
    collectable: Vec<[u8; 32]>,
}

/// The model keeper's messages (module docs).
enum KeeperMsg {
    /// Publish a job's epoch: handed to the job's keeper.
    Publish {
        /// The job.
        job: JobId,
        /// The epoch.
        epoch: u32,
        /// The job's spec (its recipe).
        spec: Box<JobSpec>,
        /// The base checkpoint (`None`: the recipe's initial weights).
        base: Option<String>,
        /// The epoch's accepted deltas.
        deltas: Vec<DeltaReceipt>,
        /// The checkpoint, or why there is none.
        reply: RpcReplyPort<Result<PublishedEpoch, CheckpointError>>,
    },
    /// The report of a job's epoch, from the copy the model keeper holds.
    Report {
        /// The job.
        job: JobId,
        /// The epoch.
        epoch: u32,
        /// The report, when the epoch was published.
        reply: RpcReplyPort<Option<EpochReport>>,
    },
    /// From a job's keeper: an epoch's report, new or updated by a retry (sent before the
    /// publication is answered, so a report asked for after it finds it).
    Reported(Box<EpochReport>),
    /// Settle and push again what failed transiently (sent every [`RETRY_EVERY`]; handed
    /// to every job's keeper).
    Retry,
    /// Test hook: fails the job's keeper, as a panic in it would.
    CrashJob(JobId),
}

/// A job keeper's messages.
enum JobKeeperMsg {
    /// Publish an epoch of the keeper's job ([`KeeperMsg::Publish`]).
    Publish {
        /// The epoch.
        epoch: u32,
        /// The job's spec.
        spec: Box<JobSpec>,
        /// The base checkpoint.
        base: Option<String>,
        /// The epoch's accepted deltas.
        deltas: Vec<DeltaReceipt>,
        /// The checkpoint, or why there is none.
        reply: RpcReplyPort<Result<PublishedEpoch, CheckpointError>>,
    },
    /// Settle and push again what this job still owes.
    Retry,
    /// Test hook ([`KeeperMsg::CrashJob`]).
    Crash,
}

/// How often the keeper retries failed settlements and repo pushes between publications.
pub const RETRY_EVERY: Duration = Duration::from_secs(30);

/// The model keeper: routes by job, holds every job's reports, ticks the retries.
struct Keeper;

struct KeeperState {
    deps: Arc<KeeperDeps>,
    /// Each job's keeper, spawned on the job's first call.
    jobs: HashMap<JobId, ActorRef<JobKeeperMsg>>,
    /// Every job's reports, as their keepers last sent them.
    reports: BTreeMap<(JobId, u32), EpochReport>,
}

/// One job's keeper (module docs).
struct JobKeeper;

struct JobKeeperArgs {
    job: JobId,
    deps: Arc<KeeperDeps>,
    keeper: ActorRef<KeeperMsg>,
    /// The job's reports the model keeper holds (a rebuilt keeper's history).
    reports: BTreeMap<u32, EpochReport>,
}

struct JobKeeperState {
    job: JobId,
    deps: Arc<KeeperDeps>,
    /// The model keeper, sent every report this keeper makes or updates.
    keeper: ActorRef<KeeperMsg>,
    /// The job's model, once loaded.
    model: Option<JobModel>,
    reports: BTreeMap<u32, EpochReport>,
    /// Epochs whose rewards or slashes could not be recorded yet.
    unsettled: BTreeSet<u32>,
    /// Epochs whose repo push failed transiently (the Hub down); pushed again with the
    /// pending settlements.
    unpushed: BTreeSet<u32>,
    /// When what is owed was last tried.
    retried: Option<tokio::time::Instant>,
}

/// What every keeper shares: the ports and the tunables.
struct KeeperDeps {
    blobs: Arc<dyn BlobStore>,
    catalog: Arc<ModelCatalog>,
    pool: ValidatorPool,
    seed: [u8; 32],
    config: SinkConfig,
    metrics: Arc<dyn Metrics>,
    economics: Option<Economics>,
    publication: Publication,
}

fn failed(what: impl std::fmt::Display) -> CheckpointError {
    CheckpointError::Failed {
        message: what.to_string(),
    }
}

/// Where each epoch's checkpoint is published (DESIGN §7): the object store names it by
/// its CID (the checkpoint reference the core records), the registry writes it as the
/// Hugging Face repo `{org}/{model}-job-{job}-epoch-{epoch}`.
#[derive(Debug, Clone)]
pub struct Publication {
    /// The object store (embedded: memory or a local block store; or an IPFS node's Kubo
    /// RPC, `hanzod_adapters::kubo`).
    pub objects: Arc<dyn ObjectStore>,
    /// The model registry, when checkpoints are published as repos.
    pub registry: Option<Arc<dyn ModelRegistry>>,
    /// The organisation of the repos.
    pub org: String,
    /// The license named in the model cards (SPDX id).
    pub license: String,
    /// The publication journal (module docs of [`crate::publisher`]): the
    /// orchestrator's state store.
    pub journal: Arc<dyn StateStore>,
    /// The orchestrator key that signs the publication records.
    pub signer: Identity,
    /// The clock of the records' timestamps.
    pub clock: Arc<dyn Clock>,
}

impl Publication {
    /// An in-memory object store and no registry (tests and embedders).
    pub fn memory() -> Publication {
        Publication {
            objects: Arc::new(MemoryObjectStore::new()),
            registry: None,
            org: "hanzo-gym".into(),
            license: DEFAULT_LICENSE.into(),
            journal: Arc::new(MemoryStateStore::new()),
            signer: Identity::generate(),
            clock: Arc::new(SystemClock),
        }
    }

    /// The [`Publisher`] over these ports.
    pub fn publisher(&self) -> Publisher {
        Publisher {
            objects: self.objects.clone(),
            registry: self.registry.clone(),
            journal: self.journal.clone(),
            signer: self.signer.clone(),
            clock: self.clock.clone(),
        }
    }
}

/// The Hugging Face repo of `job`'s checkpoint of `epoch`: `{org}/{model}-job-{job}-epoch-{epoch}`
/// (the job id keeps two jobs training one model apart).
pub fn repo_of(org: &str, model: &str, job: JobId, epoch: u32) -> String {
    ModelUpload::repo_id(org, &format!("{model}-job-{}", job.0), epoch)
}

/// The `config.json` published beside a model's weights, with, given `job`, the job that
/// trained it under `hanzod_job` (`{"id", "spec"}`, the [`JobSpec`] as submitted): the
/// recipe that reproduces the checkpoint, and what a new orchestrator reads back to resume
/// the job from its last published epoch ([`crate::recovery`]).
///
/// - A language model (`hf_config`: its Hugging Face `config.json`, as
///   [`hanzod_train::recipe::lm_config`] gives it): that config, every key kept, so
///   transformers loads the repo (`AutoModelForCausalLM`), plus `hanzod_job`.
/// - Any other model: its name, the trainer, the dtype and every tensor's shape (PyTorch
///   `[out, in]` order).
pub fn model_config_json(
    model: &str,
    spec: &ModelSpec,
    hf_config: Option<&str>,
    job: Option<(JobId, &JobSpec)>,
) -> Vec<u8> {
    // Serialised from structs, not a `serde_json::Value`: a spec's GYM wei amounts are
    // u128, which a `Value` cannot hold.
    #[derive(Serialize)]
    struct Config<'a> {
        #[serde(skip_serializing_if = "Option::is_none")]
        hanzod_job: Option<JobRef<'a>>,
        library_name: &'static str,
        model_type: &'a str,
        tensors: BTreeMap<&'a str, &'a Vec<usize>>,
        torch_dtype: &'static str,
    }
    #[derive(Serialize)]
    struct HfConfig<'a> {
        #[serde(flatten)]
        hf: serde_json::Map<String, serde_json::Value>,
        #[serde(skip_serializing_if = "Option::is_none")]
        hanzod_job: Option<JobRef<'a>>,
    }
    #[derive(Serialize)]
    struct JobRef<'a> {
        id: u64,
        spec: &'a JobSpec,
    }
    let hanzod_job = job.map(|(id, spec)| JobRef { id: id.0, spec });
    if let Some(hf) = hf_config.and_then(|t| serde_json::from_str(t).ok()) {
        return serde_json::to_vec_pretty(&HfConfig { hf, hanzod_job }).unwrap_or_default();
    }
    let config = Config {
        hanzod_job,
        library_name: "hanzod",
        model_type: model,
        tensors: spec.params.iter().map(|(k, v)| (k.as_str(), v)).collect(),
        torch_dtype: "float32",
    };
    serde_json::to_vec_pretty(&config).unwrap_or_default()
}

/// The `transformers` release whose `generation_config.json` [`generation_config_json`]
/// writes (its `transformers_version`), and that loaded the published repos in checking
/// them.
pub const TRANSFORMERS_VERSION: &str = "5.24.0";

/// The `generation_config.json` published beside a language model: what `transformers`
/// writes for a causal LM whose generation defaults come from its config
/// (`GenerationConfig.from_model_config`, then `save_pretrained`): `_from_model_config`
/// true, the config's `bos_token_id` and `eos_token_id` when set, and
/// `transformers_version`; the other keys transformers 5 writes (`output_attentions`,
/// `output_hidden_states`, `use_cache`) are its defaults and left out. Pretty-printed with
/// two spaces, keys sorted, a final newline (as transformers writes it).
pub fn generation_config_json(cfg: &hanzod_train::qwen3::Qwen3Config) -> String {
    let mut config = serde_json::Map::new();
    config.insert("_from_model_config".into(), true.into());
    if let Some(bos) = cfg.bos_token_id {
        config.insert("bos_token_id".into(), bos.into());
    }
    if let Some(eos) = cfg.eos_token_id {
        config.insert("eos_token_id".into(), eos.into());
    }
    config.insert("transformers_version".into(), TRANSFORMERS_VERSION.into());
    let mut text = serde_json::to_string_pretty(&config).unwrap_or_default();
    text.push('\n');
    text
}

/// The files a checkpoint's repo holds besides `model.safetensors`, `config.json` and the
/// card, by name (the card declares each one's CID, [`ModelCard::files`]):
///
/// - a language model: `tokenizer.json`, the job's tokenizer (the one its dataset was
///   encoded with, [`hanzod_train::text::Tokenizer::to_json`]); `tokenizer_config.json`
///   ([`hanzod_train::text::tokenizer_config_json`], `model_max_length` the model's
///   `max_position_embeddings`); `generation_config.json` ([`generation_config_json`]).
///   With them `transformers` loads the repo (`AutoModelForCausalLM`, `AutoTokenizer`).
/// - the wine-mlp: none.
pub fn repo_files_of(trainer: &Trainer) -> BTreeMap<String, Vec<u8>> {
    use hanzod_store::registry::{GENERATION_CONFIG_FILE, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE};
    match trainer {
        Trainer::Mlp(_) => BTreeMap::new(),
        Trainer::Lm(task) => {
            let cfg = task.model().config();
            let tokenizer = task.data().tokenizer();
            let positions = u64::try_from(cfg.max_position_embeddings).unwrap_or(u64::MAX);
            [
                (TOKENIZER_FILE, tokenizer.to_json()),
                (
                    TOKENIZER_CONFIG_FILE,
                    hanzod_train::text::tokenizer_config_json(tokenizer, positions),
                ),
                (GENERATION_CONFIG_FILE, generation_config_json(cfg)),
            ]
            .into_iter()
            .map(|(name, text)| (name.to_string(), text.into_bytes()))
            .collect()
        }
    }
}

/// The job a published `config.json` names (`hanzod_job`, see [`model_config_json`]), if
/// it names one that parses.
pub fn job_of_config(config_json: &[u8]) -> Option<(JobId, JobSpec)> {
    #[derive(Deserialize)]
    struct Config {
        hanzod_job: Option<JobBack>,
    }
    #[derive(Deserialize)]
    struct JobBack {
        id: u64,
        spec: JobSpec,
    }
    let c: Config = serde_json::from_slice(config_json).ok()?;
    c.hanzod_job.map(|j| (JobId(j.id), j.spec))
}

pub use hanzod_train::catalog::{recipe_of, trainer_of};
pub use hanzod_train::recipe::{trainer_for, RecipeError};

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, CheckpointError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| failed(format!("aggregation task: {e}")))
}

/// One accepted delta, as the merge sees it.
struct MergeInput {
    /// The delta as the verdict holds it, in the trainer's delta layout
    /// ([`Trainer::delta_layout`]): the model's tensors, or a LoRA adapter's factors.
    delta: Arc<Vec<f32>>,
    /// Its composite score.
    weight: f32,
    suspect: bool,
}

/// What [`merge_epoch`] produced.
struct Merged {
    next: Arc<Weights>,
    loss_after: f64,
    aggregator: Option<&'static str>,
    kept: Option<String>,
    /// The merged update (before `outer_lr`) in the model's (full) layout: for a LoRA job
    /// the merged `ΔW` on the adapted modules and zeros elsewhere, so the next epoch's
    /// convergence compares like with like.
    delta: Option<Arc<Vec<f32>>>,
    /// `next` as safetensors.
    bytes: Vec<u8>,
}

/// How an epoch's deltas become an update of the model.
enum DeltaForm {
    /// Full-parameter deltas, in the model's layout: merged coordinate-wise.
    Full,
    /// LoRA adapters in `layout` (the trainer's delta layout): merged on each node's
    /// `ΔWᵢ = (alpha/r)·Bᵢ·Aᵢ`, module by module ([`crate::lora`]).
    Lora {
        /// The adapted modules, rank and alpha.
        plan: LoraPlan,
        /// The adapters' layout.
        layout: Arc<Layout>,
    },
}

impl DeltaForm {
    /// The form of `trainer`'s deltas; an error names a LoRA adapter the merge cannot
    /// read (a trainer whose adapter layout is not PEFT-named).
    fn of(trainer: &Trainer) -> Result<DeltaForm, String> {
        match LoraPlan::of_trainer(trainer) {
            Ok(None) => Ok(DeltaForm::Full),
            Ok(Some(plan)) => Ok(DeltaForm::Lora {
                plan,
                layout: trainer.delta_layout(),
            }),
            Err(e) => Err(format!("the job's LoRA adapter cannot be merged: {e}")),
        }
    }
}

/// One aggregator's try at an epoch's update.
enum Attempt {
    /// The next checkpoint `base + outer_lr·update` and the update, in the model's layout.
    Applied {
        /// The next checkpoint.
        next: Weights,
        /// The merged update.
        update: Vec<f32>,
    },
    /// Nothing to merge.
    Keep(KeepReason),
    /// The aggregator (or the LoRA merge's input checks) refused the inputs.
    Failed(String),
    /// The merged update does not give a finite model.
    Unusable(String),
}

/// Merges `inputs` with `aggregator` and `weights` and applies the result to `base` with
/// `outer_lr`: a full-parameter update coordinate-wise ([`Aggregator::merge`], then
/// [`Weights::add_scaled`]); a LoRA epoch on the adapters' updates
/// ([`apply_lora_merge_with_update`]: one module at a time, besides `next` and the
/// full-layout update only the merge's module scratch is held).
fn attempt(
    base: &Weights,
    form: &DeltaForm,
    inputs: &[MergeInput],
    aggregator: &dyn Aggregator,
    weights: &[f32],
    outer_lr: f32,
) -> Attempt {
    match form {
        DeltaForm::Full => {
            let refs: Vec<&[f32]> = inputs.iter().map(|i| i.delta.as_slice()).collect();
            let mut out = vec![0.0f32; base.data.len()];
            match aggregator.merge(&refs, weights, &mut out) {
                Ok(MergeOutcome::Merged { .. }) => {}
                Ok(MergeOutcome::KeepPrevious { reason }) => return Attempt::Keep(reason),
                Err(e) => return Attempt::Failed(e.to_string()),
            }
            let mut next = base.clone();
            match next.add_scaled(&out, outer_lr) {
                Ok(()) => Attempt::Applied { next, update: out },
                Err(e) => Attempt::Unusable(e.to_string()),
            }
        }
        DeltaForm::Lora { plan, layout } => {
            let adapters: Vec<FlatAdapter<'_>> = inputs
                .iter()
                .map(|i| FlatAdapter::new(layout, &i.delta))
                .collect();
            let mut next = base.clone();
            let mut update = vec![0.0f32; base.data.len()];
            let merged = apply_lora_merge_with_update(
                &mut next,
                plan,
                &adapters,
                weights,
                aggregator,
                outer_lr,
                &mut update,
            );
            match merged {
                Ok(MergeOutcome::Merged { .. }) => Attempt::Applied { next, update },
                Ok(MergeOutcome::KeepPrevious { reason }) => Attempt::Keep(reason),
                Err(
                    e @ (LoraError::NonFiniteDelta { .. } | LoraError::NonFiniteWeights { .. }),
                ) => Attempt::Unusable(e.to_string()),
                Err(e) => Attempt::Failed(e.to_string()),
            }
        }
    }
}

/// Merges an epoch (paper §6, DESIGN §6) and applies it with the outer learning rate.
///
/// The weighted mean weighs each accepted delta by its composite score and gives suspect
/// ones weight 0 (a scaled delta in the right direction would otherwise still steer the
/// mean: its small weight times its large norm); the coordinate-wise median (`robust`, when
/// more than the threshold of the epoch is suspect) takes every accepted delta. A merge
/// whose checkpoint is not finite or raises the validation loss by more than
/// [`SUSPECT_LOSS_RISE`] is not published: the weighted mean falls back to the median, and
/// when that fails too the epoch keeps the base checkpoint and says why. Nothing here fails
/// the job.
///
/// A LoRA job's deltas (adapters) are merged on their updates `ΔWᵢ`, never on the factors
/// ([`crate::lora`]): the next checkpoint is the full model `base + outer_lr·ΔW` with every
/// unadapted tensor unchanged, and [`Merged::delta`] the merged `ΔW` in the full layout.
fn merge_epoch(
    base: &Arc<Weights>,
    trainer: &Trainer,
    loss_before: f64,
    inputs: &[MergeInput],
    robust: bool,
    outer_lr: f32,
    rejected_all: bool,
) -> Merged {
    let scored: Vec<f32> = inputs
        .iter()
        .map(|i| if i.suspect { 0.0 } else { i.weight })
        .collect();
    let every = vec![1.0f32; inputs.len()];
    let plans: Vec<(&dyn Aggregator, &[f32])> = if robust {
        vec![(&CoordinateMedian, &every)]
    } else {
        vec![(&WeightedMean, &scored), (&CoordinateMedian, &every)]
    };
    let keep = |reason: String| Merged {
        next: base.clone(),
        loss_after: loss_before,
        aggregator: None,
        kept: Some(reason),
        delta: None,
        bytes: base.to_safetensors(),
    };
    let form = match DeltaForm::of(trainer) {
        Ok(f) => f,
        Err(why) => {
            tracing::warn!(reason = %why, "merge refused");
            return keep(why);
        }
    };
    let mut why = if rejected_all {
        "every delta was rejected".to_string()
    } else {
        KeepReason::NoDeltas.to_string()
    };
    for (aggregator, weights) in plans {
        let name = aggregator.name();
        let loss = match attempt(base, &form, inputs, aggregator, weights, outer_lr) {
            Attempt::Applied { next, update } => match trainer.validation_loss(&next) {
                Ok(l) => Ok((l, next, update)),
                Err(e) => Err(e.to_string()),
            },
            Attempt::Keep(reason) => {
                if !(rejected_all && reason == KeepReason::NoDeltas) {
                    why = reason.to_string();
                }
                continue;
            }
            Attempt::Failed(e) => {
                why = format!("{name} merge failed: {e}");
                continue;
            }
            Attempt::Unusable(e) => Err(e),
        };
        let limit = loss_before * (1.0 + SUSPECT_LOSS_RISE);
        match loss {
            Ok((l, next, update)) if l <= limit => {
                return Merged {
                    bytes: next.to_safetensors(),
                    next: Arc::new(next),
                    loss_after: l,
                    aggregator: Some(name),
                    kept: None,
                    delta: Some(Arc::new(update)),
                };
            }
            Ok((l, ..)) => {
                why = format!(
                    "the {name} merge would raise the validation loss from {loss_before:.6} to {l:.6}"
                );
            }
            Err(e) => why = format!("the {name} merge is not a usable model: {e}"),
        }
        tracing::warn!(reason = %why, "merge refused");
    }
    keep(why)
}

/// Removes the delta blobs of an epoch already published (logged, never fatal).
async fn remove_blobs(blobs: &dyn BlobStore, job: JobId, hashes: Vec<[u8; 32]>) {
    for hash in hashes {
        if let Err(e) = blobs.remove(&hash).await {
            tracing::warn!(job = %job, delta = %hex::encode(hash), error = %e, "could not remove a delta blob");
        }
    }
}

impl JobKeeperState {
    /// The job's model as of `base`, loaded from the object store (by CID) when the keeper does not
    /// hold it (a restart) or holds another version.
    async fn model(
        &mut self,
        job: JobId,
        training: &TrainingSpec,
        base: Option<&str>,
    ) -> Result<&mut JobModel, CheckpointError> {
        let model = self.deps.catalog.check_training(training).map_err(failed)?;
        let trainer = trainer_for(training, &model, job).map_err(failed)?;
        let fresh = match &self.model {
            Some(m) => m.current_ref.as_deref() != base || m.trainer != trainer,
            None => true,
        };
        if fresh {
            let current = match base {
                None => trainer.init(),
                Some(r) => {
                    let bytes = self
                        .deps
                        .publication
                        .objects
                        .get(r)
                        .await
                        .map_err(|e| failed(format!("checkpoint {r}: {e}")))?;
                    Weights::from_safetensors(&bytes, trainer.layout()).map_err(failed)?
                }
            };
            let kept = self.model.take();
            self.model = Some(JobModel {
                trainer,
                current: Arc::new(current),
                current_ref: base.map(str::to_string),
                // A continuation of the same job keeps its history; a reload starts it
                // again (module docs).
                norms: kept.as_ref().map(|m| m.norms).unwrap_or_default(),
                last_merged: None,
                collectable: kept.map(|m| m.collectable).unwrap_or_default(),
            });
        }
        Ok(self.model.as_mut().expect("loaded above"))
    }

    async fn publish(
        &mut self,
        job: JobId,
        epoch: u32,
        spec: JobSpec,
        base: Option<String>,
        deltas: Vec<DeltaReceipt>,
    ) -> Result<PublishedEpoch, CheckpointError> {
        let training = spec.training.clone();
        self.retry().await;
        if let Some(r) = self.reports.get(&epoch) {
            return Ok(PublishedEpoch {
                checkpoint: r.checkpoint.clone(),
                summary: Some(r.summary()),
            });
        }
        let publisher = self.deps.publication.publisher();
        // A publication staged before a crash resumes as staged: the same checkpoint, card
        // and signed record (module docs of `publish::publisher`).
        let (staged, weights) = match publisher.staged(job, epoch).await.map_err(failed)? {
            Some(staged) => {
                tracing::info!(job = %job, epoch, checkpoint = %staged.cid(), "resuming a staged publication");
                self.adopt(job, &training, &deltas, &staged).await?;
                (staged, None)
            }
            None => {
                self.aggregate(job, epoch, &spec, base, &deltas, &publisher)
                    .await?
            }
        };
        let weights = match weights {
            Some(w) => w,
            None => publisher.weights(&staged).await.map_err(failed)?,
        };
        let started = std::time::Instant::now();
        let published = publisher.complete(&staged, weights).await.map_err(failed)?;
        self.deps.metrics.observe(
            Histogram::PublishPushSeconds,
            started.elapsed().as_secs_f64(),
        );
        let mut report: EpochReport = serde_json::from_value(staged.report.clone())
            .map_err(|e| failed(format!("the staged report of epoch {epoch}: {e}")))?;
        report.checkpoint = staged.cid().to_string();
        report.publication = Some(staged.publication.clone());
        if !self.pushed(&mut report, &staged, published) {
            self.unpushed.insert(epoch);
        }
        if !self.settle(&mut report).await {
            self.unsettled.insert(epoch);
        }
        self.count(&report);
        tracing::info!(
            job = %job,
            epoch,
            checkpoint = %report.checkpoint,
            loss_before = report.loss_before,
            loss_after = report.loss_after,
            deltas = report.deltas.len(),
            aggregator = report.aggregator.as_deref().unwrap_or("none (kept)"),
            "epoch aggregated"
        );
        let published = PublishedEpoch {
            checkpoint: report.checkpoint.clone(),
            summary: Some(report.summary()),
        };
        self.record(report);
        Ok(published)
    }

    /// Takes a staged publication's checkpoint as the job's model (a publication resumed
    /// after a crash): loads its weights and lets this epoch's deltas be collected next
    /// time, as [`JobKeeperState::aggregate`] would have.
    async fn adopt(
        &mut self,
        job: JobId,
        training: &TrainingSpec,
        deltas: &[DeltaReceipt],
        staged: &Staged,
    ) -> Result<(), CheckpointError> {
        let evidence: std::collections::HashSet<String> = staged
            .report
            .get("slashes")
            .and_then(|s| s.as_array())
            .into_iter()
            .flatten()
            .filter_map(|s| s.get("delta_hash")?.as_str().map(str::to_string))
            .collect();
        let this_epoch = deltas
            .iter()
            .map(|r| r.delta_hash)
            .filter(|h| !evidence.contains(&hex::encode(h)))
            .collect();
        let retain = self.deps.config.retain_deltas;
        let blobs = self.deps.blobs.clone();
        let model = self.model(job, training, Some(staged.cid())).await?;
        model.last_merged = None;
        let previous = std::mem::replace(&mut model.collectable, this_epoch);
        if !retain {
            remove_blobs(&*blobs, job, previous).await;
        }
        Ok(())
    }

    /// Judges and merges an epoch, updates the job's model, and stages the publication of
    /// the new checkpoint with its report. Returns what was staged, with the weights when
    /// they are this merge's (`None`: another staging won and was adopted).
    async fn aggregate(
        &mut self,
        job: JobId,
        epoch: u32,
        spec: &JobSpec,
        base: Option<String>,
        deltas: &[DeltaReceipt],
        publisher: &Publisher,
    ) -> Result<(Staged, Option<Arc<[u8]>>), CheckpointError> {
        let training = &spec.training;
        let d = &self.deps;
        let (blobs, pool, config, seed) = (d.blobs.clone(), d.pool.clone(), d.config, d.seed);
        let outer_lr = training.outer_lr as f32;
        let model = self.model(job, training, base.as_deref()).await?;
        let base_weights = model.current.clone();
        let secret = EpochSecret::derive(&seed, job.0, epoch);
        let trainer = model.trainer.clone();
        let loss_before = {
            let (w, t) = (base_weights.clone(), trainer.clone());
            blocking(move || t.validation_loss(&w))
                .await?
                .map_err(failed)?
        };
        let ctx = Arc::new(EpochContext {
            job: job.0,
            epoch,
            trainer,
            base: base_weights.clone(),
            base_version: u64::from(epoch),
            loss_before,
            norms: model.norms,
            last_merged: model.last_merged.clone(),
            secret: secret.clone(),
            config: config.validation,
        });
        // Judge every delta concurrently on the pool.
        let judged = futures_util::future::join_all(deltas.iter().map(|r| {
            let (pool, blobs, ctx, receipt) = (pool.clone(), blobs.clone(), ctx.clone(), r.clone());
            async move {
                match blobs.get(&receipt.delta_hash).await {
                    Ok(payload) => pool.validate(ctx, Submission { receipt, payload }).await,
                    Err(e) => Verdict::rejected(
                        &receipt,
                        ctx.loss_before,
                        Rejection::Unavailable(e.to_string()),
                    ),
                }
            }
        }))
        .await;
        let mut judged = judged;
        // A job's first epoch: seed the norm average from the epoch itself (DESIGN §12).
        let mut norm_average = ctx.norms;
        if norm_average.average().is_none() {
            if let Some(seeded) = seed_norms(&judged) {
                judged.iter_mut().for_each(|v| v.rescore(&seeded));
                norm_average = seeded;
            }
        }

        // Merge the accepted ones (module docs: weighted by score, or by median).
        let suspect = judged.iter().filter(|v| v.suspect()).count();
        let inputs: Vec<MergeInput> = judged
            .iter()
            .filter_map(|v| {
                Some(MergeInput {
                    delta: v.outcome.as_ref().ok()?.clone(),
                    weight: v.score.map_or(0.0, |s| s.composite as f32),
                    suspect: v.suspect(),
                })
            })
            .collect();
        let robust = RobustPolicy {
            suspect_threshold: config.suspect_threshold,
            ..RobustPolicy::default()
        }
        .choose(suspect, judged.len())
        .name()
            != WeightedMean.name();
        let rejected_all = !judged.is_empty() && inputs.is_empty();
        let merged = {
            let (base, ctx) = (base_weights.clone(), ctx.clone());
            blocking(move || {
                merge_epoch(
                    &base,
                    &ctx.trainer,
                    loss_before,
                    &inputs,
                    robust,
                    outer_lr,
                    rejected_all,
                )
            })
            .await?
        };
        if let Some(reason) = &merged.kept {
            tracing::warn!(job = %job, epoch, %reason, "epoch keeps the previous checkpoint");
        }
        let Merged {
            next,
            loss_after,
            aggregator,
            kept,
            delta: merged,
            bytes,
        } = merged;
        let bytes = bytes::Bytes::from(bytes);
        // The report's checkpoint is the staged CID, filled in by `publish` (the object
        // store computes it while storing the weights).
        let report = EpochReport {
            kept,
            suspect,
            ..self.report(
                &ctx,
                deltas,
                &judged,
                base.clone(),
                ("", loss_after, aggregator),
            )
        };
        let publication = &self.deps.publication;
        let model_spec = self.deps.catalog.check_training(training).map_err(failed)?;
        let hf_config = hanzod_train::recipe::lm_config(training)
            .ok()
            .flatten()
            .map(|c| c.to_json());
        let checkpoint = Checkpoint {
            job,
            epoch,
            weights: bytes.clone(),
            config_json: model_config_json(
                &training.model,
                &model_spec,
                hf_config.as_deref(),
                Some((job, spec)),
            ),
            files: repo_files_of(&ctx.trainer),
            card: ModelCard {
                cid: String::new(),
                epoch,
                job: job.0,
                quality: loss_after,
                base_model: base,
                license: publication.license.clone(),
                model: training.model.clone(),
                dataset: training.dataset.clone(),
                files: BTreeMap::new(),
            },
            repo: publication
                .registry
                .as_ref()
                .map(|_| repo_of(&publication.org, &training.model, job, epoch)),
            report: serde_json::to_value(&report).map_err(failed)?,
        };
        let started = std::time::Instant::now();
        let (staged, ours) = publisher.stage(checkpoint).await.map_err(failed)?;
        self.deps.metrics.observe(
            Histogram::PublishStageSeconds,
            started.elapsed().as_secs_f64(),
        );
        if !ours {
            // Another staging of this epoch won (module docs of `publish::publisher`): its
            // checkpoint is the one published.
            self.adopt(job, training, deltas, &staged).await?;
            return Ok((staged, None));
        }

        // Fold the accepted norms into the running average, in delta-hash order so the
        // result does not depend on arrival order.
        let model = self.model.as_mut().expect("loaded above");
        // Suspect deltas stay out of it, so an outsized delta cannot drag the average.
        let mut norms: Vec<(&[u8; 32], f64)> = judged
            .iter()
            .filter(|v| v.outcome.is_ok() && !v.suspect())
            .filter_map(|v| v.norm.map(|n| (&v.delta_hash, n)))
            .collect();
        norms.sort_by(|a, b| a.0.cmp(b.0));
        model.norms = norm_average;
        for (_, n) in norms {
            let _ = model.norms.accept(n);
        }
        model.current = next;
        model.current_ref = Some(staged.cid().to_string());
        // Convergence compares with the last delta actually merged.
        if merged.is_some() {
            model.last_merged = merged;
        }
        // Delta blobs are kept one epoch: the core records epoch e's checkpoint before
        // epoch e + 1 can end, so once e + 1 is published nothing asks for e's deltas again
        // (a publication retried after a crash is for the epoch in flight). Deltas that are
        // slashing evidence stay.
        let evidence: std::collections::HashSet<[u8; 32]> = deltas
            .iter()
            .zip(&judged)
            .filter(|(r, v)| v.evidence(r).is_some())
            .map(|(r, _)| r.delta_hash)
            .collect();
        let this_epoch: Vec<[u8; 32]> = deltas
            .iter()
            .map(|r| r.delta_hash)
            .filter(|h| !evidence.contains(h))
            .collect();
        let previous = std::mem::replace(&mut model.collectable, this_epoch);
        if !config.retain_deltas {
            remove_blobs(&*blobs, job, previous).await;
        }
        Ok((staged, Some(Arc::from(bytes.as_ref()))))
    }

    fn report(
        &self,
        ctx: &EpochContext,
        deltas: &[DeltaReceipt],
        judged: &[Verdict],
        base: Option<String>,
        (checkpoint, loss_after, aggregator): (&str, f64, Option<&'static str>),
    ) -> EpochReport {
        let lines = deltas
            .iter()
            .zip(judged)
            .map(|(r, v)| DeltaReport {
                node: hex::encode(r.node.0),
                delta_hash: hex::encode(r.delta_hash),
                claimed_loss: r.claimed_loss,
                loss_after: v.loss_after,
                norm: v.norm,
                score: v.score,
                weight: match (&v.outcome, v.score, aggregator) {
                    (Err(_), ..) | (_, None, _) | (_, _, None) => 0.0,
                    (Ok(_), Some(_), Some("median")) => 1.0,
                    (Ok(_), Some(_), Some(_)) if v.suspect() => 0.0,
                    (Ok(_), Some(s), Some(_)) => s.composite as f32,
                },
                suspect: v.suspect(),
                spot_check: v.spot_check.clone(),
                rejected: v.outcome.as_ref().err().cloned(),
            })
            .collect();
        EpochReport {
            job: ctx.job,
            epoch: ctx.epoch,
            base,
            checkpoint: checkpoint.to_string(),
            loss_before: ctx.loss_before,
            loss_after,
            commitment: hex::encode(ctx.secret.commitment().0),
            secret: ctx.secret.to_hex(),
            spot_check_rate: ctx.config.spot_check_rate,
            aggregator: aggregator.map(str::to_string),
            kept: None,
            suspect: 0,
            deltas: lines,
            slashes: deltas
                .iter()
                .zip(judged)
                .filter_map(|(r, v)| v.evidence(r))
                .collect(),
            rewards: Vec::new(),
            slashed: Vec::new(),
            repo: None,
            location: None,
            registry_error: None,
            settlement_error: None,
            publication: None,
        }
    }

    /// Pays the epoch's rewards and slashes its evidence on the ledger (paper §8): the
    /// pool is split by composite score over the deltas that were accepted and not
    /// suspect, and only when the epoch merged something; each failed spot-check slashes
    /// `slash_pct` % of the node's stake with the evidence
    /// ([`SlashEvidence::canonical_bytes`]) attached. A node whose key is no longer bound
    /// to an operator is left out of the batch (its share is not paid) rather than hold up
    /// everyone's pay. The whole settlement is bounded by [`LEDGER_TIMEOUT`]; what fails is
    /// recorded in `report.settlement_error` and retried at the job's next publication (the
    /// ledger is idempotent per epoch and per evidence, so a retry pays nobody twice).
    /// Returns whether the epoch is fully settled.
    async fn settle(&self, report: &mut EpochReport) -> bool {
        let Some(econ) = &self.deps.economics else {
            return true;
        };
        let job = JobId(report.job);
        let node_of = |hex_key: &str| hex_key.parse::<NodeId>().ok();
        // One bound for the whole settlement, however many calls it takes.
        let limit = econ.settle_timeout;
        let deadline = tokio::time::Instant::now() + limit;
        let bounded = |what: String| format!("{what}: no answer within {limit:?}");
        let mut errors = Vec::new();
        if let Some(publication) = &report.publication {
            let started = std::time::Instant::now();
            let call = econ.ledger.record_publication(publication);
            let outcome = tokio::time::timeout_at(deadline, call).await;
            self.deps.metrics.observe(
                Histogram::PublishRecordSeconds,
                started.elapsed().as_secs_f64(),
            );
            match outcome {
                Ok(Ok(r)) if r.duplicate && r.publication != *publication => {
                    // Not an error to retry: the chain keeps the first record of an epoch,
                    // and the report shows what the chain holds.
                    tracing::warn!(job = %job, epoch = report.epoch, on_chain = %r.publication.record.cid, staged = %publication.record.cid, "the ledger holds another publication record for this epoch");
                    report.publication = Some(r.publication);
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => errors.push(format!("publication record: {e}")),
                Err(_) => errors.push(bounded("publication record".into())),
            }
        }
        let mut shares: Vec<(NodeId, f64)> = Vec::new();
        if report.aggregator.is_some() {
            for d in report
                .deltas
                .iter()
                .filter(|d| d.rejected.is_none() && !d.suspect)
            {
                let (Some(node), Some(score)) = (node_of(&d.node), d.score) else {
                    continue;
                };
                // Stake and penalty are checked again each epoch: an operator that
                // unstaked below the minimum, or was slashed, is not paid for it.
                let facts = async {
                    let stake = econ.ledger.stake_of(&node).await?;
                    let penalty = econ.ledger.penalty_until(&node).await?;
                    Ok::<_, ChainError>((stake, penalty))
                };
                match tokio::time::timeout_at(deadline, facts).await {
                    Ok(Ok((stake, _))) if stake < econ.min_stake => {
                        tracing::warn!(job = %job, epoch = report.epoch, node = %node, stake_wei = %stake.0, "stake below the minimum: its reward share is withheld");
                    }
                    Ok(Ok((_, Some(until)))) if until > self.deps.publication.clock.now() => {
                        tracing::warn!(job = %job, epoch = report.epoch, node = %node, penalty_until_ms = until.0, "under a slashing penalty: its reward share is withheld");
                    }
                    Ok(Ok(_)) => shares.push((node, score.composite)),
                    Ok(Err(ChainError::Unbound(_))) => {
                        tracing::warn!(job = %job, epoch = report.epoch, node = %node, "unbound node: its reward share is withheld");
                    }
                    Ok(Err(e)) => errors.push(format!("stake of {node}: {e}")),
                    Err(_) => errors.push(bounded(format!("stake of {node}"))),
                }
            }
        }
        if errors.is_empty() {
            let paid = split_rewards(econ.epoch_pool, &shares);
            let call = econ
                .ledger
                .distribute_epoch_rewards(job, report.epoch, &paid);
            match tokio::time::timeout_at(deadline, call).await {
                Ok(Ok(receipt)) => {
                    report.rewards = receipt
                        .paid
                        .iter()
                        .map(|(n, w)| RewardLine {
                            node: hex::encode(n.0),
                            score: shares.iter().filter(|(m, _)| m == n).map(|(_, s)| *s).sum(),
                            amount_wei: w.0.to_string(),
                        })
                        .collect();
                    if !receipt.duplicate {
                        let milli = receipt.total.0 / (GymWei::PER_GYM / 1000);
                        self.deps.metrics.incr(
                            Counter::RewardsMilliGym,
                            "paid",
                            u64::try_from(milli).unwrap_or(u64::MAX),
                        );
                    }
                }
                Ok(Err(e)) => errors.push(format!("rewards: {e}")),
                Err(_) => errors.push(bounded("rewards".into())),
            }
        }
        report.slashed.clear();
        for evidence in &report.slashes {
            let Some(node) = node_of(&evidence.node) else {
                continue;
            };
            let bytes = evidence.canonical_bytes();
            let call = econ.ledger.slash(&node, econ.slash_pct, &bytes);
            match tokio::time::timeout_at(deadline, call).await {
                Ok(Ok(r)) => {
                    if !r.duplicate {
                        self.deps.metrics.incr(Counter::Slashes, "applied", 1);
                    }
                    report.slashed.push(SlashLine {
                        node: evidence.node.clone(),
                        pct: r.pct,
                        slashed_wei: r.slashed.0.to_string(),
                        stake_after_wei: r.stake_after.0.to_string(),
                    });
                }
                // A refusal that repeats (the key was never bound, a malformed request) is
                // final: retrying it would hold up the epoch's settlement for ever.
                Ok(Err(
                    e @ (LedgerError::Chain(ChainError::Unbound(_)) | LedgerError::Invalid(_)),
                )) => {
                    tracing::warn!(job = %job, epoch = report.epoch, node = %evidence.node, error = %e, "slash refused for good; not retried");
                    self.deps.metrics.incr(Counter::Slashes, "refused", 1);
                }
                Ok(Err(e)) => errors.push(format!("slashing {}: {e}", evidence.node)),
                Err(_) => errors.push(bounded(format!("slashing {}", evidence.node))),
            }
        }
        if errors.is_empty() {
            report.settlement_error = None;
            return true;
        }
        let why = errors.join("; ");
        tracing::warn!(job = %job, epoch = report.epoch, error = %why, "epoch settlement incomplete; retried at the job's next publication");
        report.settlement_error = Some(why);
        false
    }

    /// Writes the registry's outcome for `staged` into `report`; returns `false` when the
    /// push failed transiently and should be tried again.
    fn pushed(
        &self,
        report: &mut EpochReport,
        staged: &Staged,
        outcome: Option<Result<hanzod_store::Published, hanzod_store::RegistryError>>,
    ) -> bool {
        let record = &staged.publication.record;
        match outcome {
            None => true,
            Some(Ok(p)) => {
                report.repo = Some(p.repo);
                report.location = Some(match p.location {
                    Location::Path(path) => path.display().to_string(),
                    Location::Url(url) => url,
                });
                report.registry_error = None;
                true
            }
            Some(Err(e)) => {
                let repo = &record.hf_repo;
                let transient = e.is_transient();
                if transient {
                    tracing::warn!(job = %record.job, epoch = record.epoch, %repo, error = %e, "pushing the repo failed; retried later");
                    self.deps
                        .metrics
                        .incr(Counter::RegistryFailures, "transient", 1);
                } else {
                    tracing::warn!(job = %record.job, epoch = record.epoch, %repo, error = %e, "the model registry refused the checkpoint");
                    self.deps
                        .metrics
                        .incr(Counter::RegistryRefusals, "refused", 1);
                }
                report.registry_error = Some(format!("{repo}: {e}"));
                !transient
            }
        }
    }

    /// Keeps `report` as its epoch's, and sends it to the model keeper (for
    /// [`TrainingSink::report`]; the cast is queued before any answer this keeper gives
    /// after it, so a report asked for after that answer finds it).
    fn record(&mut self, report: EpochReport) {
        let _ = self
            .keeper
            .cast(KeeperMsg::Reported(Box::new(report.clone())));
        self.reports.insert(report.epoch, report);
    }

    /// Settles and pushes again what this job still owes.
    async fn retry(&mut self) {
        self.settle_pending().await;
        self.push_pending().await;
        self.retried = Some(tokio::time::Instant::now());
    }

    /// Pushes again the repos whose push failed transiently ([`JobKeeperState::pushed`]),
    /// from their staged publications; stops at the first that fails again.
    async fn push_pending(&mut self) {
        let job = self.job;
        let publisher = self.deps.publication.publisher();
        let pending: Vec<u32> = self.unpushed.iter().copied().collect();
        for epoch in pending {
            let staged = match publisher.staged(job, epoch).await {
                Ok(Some(staged)) => staged,
                Ok(None) => {
                    self.unpushed.remove(&epoch);
                    continue;
                }
                Err(e) => {
                    tracing::warn!(job = %job, epoch, error = %e, "reading a staged publication to push it again");
                    break;
                }
            };
            let outcome = match publisher.weights(&staged).await {
                Ok(w) => publisher.complete(&staged, w).await,
                Err(e) => Err(e),
            };
            let outcome = match outcome {
                Ok(o) => o,
                Err(e) => {
                    tracing::warn!(job = %job, epoch, error = %e, "completing a staged publication again");
                    break;
                }
            };
            let Some(mut report) = self.reports.get(&epoch).cloned() else {
                self.unpushed.remove(&epoch);
                continue;
            };
            let done = self.pushed(&mut report, &staged, outcome);
            self.record(report);
            if !done {
                break;
            }
            self.unpushed.remove(&epoch);
        }
    }

    /// Settles again the epochs whose settlement failed ([`JobKeeperState::settle`]).
    async fn settle_pending(&mut self) {
        let pending: Vec<u32> = self.unsettled.iter().copied().collect();
        for epoch in pending {
            self.unsettled.remove(&epoch);
            let Some(mut report) = self.reports.get(&epoch).cloned() else {
                continue;
            };
            let settled = self.settle(&mut report).await;
            self.record(report);
            if !settled {
                // The ledger is still failing: keep the rest for the next publication
                // rather than wait out one timeout per epoch now.
                self.unsettled.insert(epoch);
                break;
            }
        }
    }

    fn count(&self, report: &EpochReport) {
        for d in &report.deltas {
            let label = d.rejected.as_ref().map_or("accepted", Rejection::label);
            self.deps.metrics.incr(Counter::DeltasValidated, label, 1);
            if let Some(c) = &d.spot_check {
                let outcome = if c.passed { "passed" } else { "failed" };
                self.deps.metrics.incr(Counter::SpotChecks, outcome, 1);
            }
        }
        let merge = report.aggregator.as_deref().unwrap_or("kept");
        self.deps.metrics.incr(Counter::Merges, merge, 1);
    }
}

impl KeeperState {
    /// Hands `msg` to `job`'s keeper, spawning one when the job has none (its first call,
    /// or its keeper failed). A message that cannot be delivered drops its reply port: the
    /// caller is told the keeper did not answer.
    async fn forward(&mut self, myself: &ActorRef<KeeperMsg>, job: JobId, msg: JobKeeperMsg) {
        let Some(keeper) = self.jobs.get(&job) else {
            return self.spawn_with(myself, job, msg).await;
        };
        let msg = match keeper.cast(msg) {
            Ok(()) => return,
            Err(MessagingErr::SendErr(msg)) => msg,
            Err(_) => return,
        };
        // The keeper stopped before its failure reached us: rebuild it now.
        self.jobs.remove(&job);
        self.spawn_with(myself, job, msg).await
    }

    /// Spawns `job`'s keeper with the job's reports held here, then hands it `msg`.
    async fn spawn_with(&mut self, myself: &ActorRef<KeeperMsg>, job: JobId, msg: JobKeeperMsg) {
        let reports = self
            .reports
            .range((job, 0)..=(job, u32::MAX))
            .map(|((_, epoch), r)| (*epoch, r.clone()))
            .collect();
        let args = JobKeeperArgs {
            job,
            deps: self.deps.clone(),
            keeper: myself.clone(),
            reports,
        };
        match Actor::spawn_linked(None, JobKeeper, args, myself.get_cell()).await {
            Ok((keeper, _)) => {
                let _ = keeper.cast(msg);
                self.jobs.insert(job, keeper);
            }
            Err(e) => {
                tracing::warn!(job = %job, error = %e, "a job's model keeper could not start");
                if let JobKeeperMsg::Publish { reply, .. } = msg {
                    let _ = reply.send(Err(failed(format!(
                        "the job's model keeper could not start: {e}"
                    ))));
                }
            }
        }
    }
}

impl Actor for Keeper {
    type Msg = KeeperMsg;
    type State = KeeperState;
    type Arguments = KeeperDeps;

    async fn pre_start(
        &self,
        myself: ActorRef<KeeperMsg>,
        deps: KeeperDeps,
    ) -> Result<KeeperState, ActorProcessingErr> {
        // Ends with the actor (the handle's task stops when a send fails).
        let _ticker = myself.send_interval(RETRY_EVERY, || KeeperMsg::Retry);
        Ok(KeeperState {
            deps: Arc::new(deps),
            jobs: HashMap::new(),
            reports: BTreeMap::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<KeeperMsg>,
        msg: KeeperMsg,
        state: &mut KeeperState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            KeeperMsg::Publish {
                job,
                epoch,
                spec,
                base,
                deltas,
                reply,
            } => {
                let msg = JobKeeperMsg::Publish {
                    epoch,
                    spec,
                    base,
                    deltas,
                    reply,
                };
                state.forward(&myself, job, msg).await;
            }
            KeeperMsg::Report { job, epoch, reply } => {
                let _ = reply.send(state.reports.get(&(job, epoch)).cloned());
            }
            KeeperMsg::Reported(report) => {
                state
                    .reports
                    .insert((JobId(report.job), report.epoch), *report);
            }
            KeeperMsg::Retry => {
                for keeper in state.jobs.values() {
                    let _ = keeper.cast(JobKeeperMsg::Retry);
                }
            }
            KeeperMsg::CrashJob(job) => {
                if let Some(keeper) = state.jobs.get(&job) {
                    let _ = keeper.cast(JobKeeperMsg::Crash);
                }
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<KeeperMsg>,
        event: SupervisionEvent,
        state: &mut KeeperState,
    ) -> Result<(), ActorProcessingErr> {
        let (dead, why) = match &event {
            SupervisionEvent::ActorFailed(cell, why) => (cell.get_id(), why.to_string()),
            SupervisionEvent::ActorTerminated(cell, _, why) => {
                (cell.get_id(), why.clone().unwrap_or_default())
            }
            _ => return Ok(()),
        };
        let Some(job) = state
            .jobs
            .iter()
            .find(|(_, k)| k.get_id() == dead)
            .map(|(job, _)| *job)
        else {
            return Ok(());
        };
        // Rebuilt on the job's next call (module docs); what it was answering is lost
        // with its reply ports, and the callers are told.
        state.jobs.remove(&job);
        tracing::warn!(job = %job, error = %why, "a job's model keeper stopped; rebuilt on the job's next call");
        state.deps.metrics.incr(Counter::ActorRestarts, "keeper", 1);
        Ok(())
    }
}

impl Actor for JobKeeper {
    type Msg = JobKeeperMsg;
    type State = JobKeeperState;
    type Arguments = JobKeeperArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<JobKeeperMsg>,
        a: JobKeeperArgs,
    ) -> Result<JobKeeperState, ActorProcessingErr> {
        // A rebuilt keeper tries again what its reports say is owed. A push the registry
        // refused for good is refused again, once, and then forgotten.
        let owed = |f: fn(&EpochReport) -> bool| -> BTreeSet<u32> {
            a.reports
                .iter()
                .filter(|(_, r)| f(r))
                .map(|(e, _)| *e)
                .collect()
        };
        Ok(JobKeeperState {
            unsettled: owed(|r| r.settlement_error.is_some()),
            unpushed: owed(|r| r.registry_error.is_some()),
            job: a.job,
            deps: a.deps,
            keeper: a.keeper,
            model: None,
            reports: a.reports,
            retried: None,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<JobKeeperMsg>,
        msg: JobKeeperMsg,
        state: &mut JobKeeperState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            JobKeeperMsg::Publish {
                epoch,
                spec,
                base,
                deltas,
                reply,
            } => {
                let job = state.job;
                let result = state.publish(job, epoch, *spec, base, deltas).await;
                if let Err(e) = &result {
                    tracing::warn!(job = %job, epoch, error = %e, "aggregation failed");
                }
                let _ = reply.send(result);
            }
            JobKeeperMsg::Retry => {
                // Ticks queue up behind a long aggregation, which retried on its way in:
                // one try per period is enough.
                let recent = state.retried.is_some_and(|t| t.elapsed() < RETRY_EVERY / 2);
                if !recent {
                    state.retry().await;
                }
            }
            JobKeeperMsg::Crash => return Err("job keeper crash injected".into()),
        }
        Ok(())
    }
}

/// The validating, merging [`CheckpointSink`] (module docs).
#[derive(Debug, Clone)]
pub struct TrainingSink {
    keeper: ActorRef<KeeperMsg>,
    pool: ValidatorPool,
    seed: [u8; 32],
}

impl std::fmt::Debug for KeeperMsg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KeeperMsg::Publish { .. } => "Publish",
            KeeperMsg::Report { .. } => "Report",
            KeeperMsg::Reported(_) => "Reported",
            KeeperMsg::Retry => "Retry",
            KeeperMsg::CrashJob(_) => "CrashJob",
        })
    }
}

/// Why a [`TrainingSink`] could not start.
#[derive(Debug, thiserror::Error)]
pub enum SinkStartError {
    /// The validator pool's actors could not be spawned.
    #[error("the validator pool could not start: {0}")]
    Validators(ractor::SpawnErr),
    /// The model keeper's actor could not be spawned.
    #[error("the model keeper could not start: {0}")]
    Keeper(ractor::SpawnErr),
}

impl TrainingSink {
    /// Starts the validator pool and the model keeper, which resolves jobs' models in
    /// `catalog` and keeps deltas and checkpoints in `blobs`. `seed` is the orchestrator's private
    /// spot-check seed ([`EpochSecret::derive`]): keep it secret and stable across restarts
    /// (the daemon derives it from the orchestrator key).
    pub async fn start(
        blobs: Arc<dyn BlobStore>,
        catalog: Arc<ModelCatalog>,
        seed: [u8; 32],
        config: SinkConfig,
        metrics: Arc<dyn Metrics>,
        economics: Option<Economics>,
        publication: Publication,
    ) -> Result<TrainingSink, SinkStartError> {
        let pool = ValidatorPool::start(config.workers, metrics.clone())
            .await
            .map_err(SinkStartError::Validators)?;
        let (keeper, _) = Actor::spawn(
            None,
            Keeper,
            KeeperDeps {
                blobs,
                catalog,
                pool: pool.clone(),
                seed,
                config,
                metrics,
                economics,
                publication,
            },
        )
        .await
        .map_err(SinkStartError::Keeper)?;
        Ok(TrainingSink { keeper, pool, seed })
    }

    /// The commitment `SHA-256(secret_e)` for `job`'s epoch `epoch` (DESIGN §6), publishable
    /// at epoch start; the secret itself is revealed in the epoch's [`EpochReport`].
    pub fn commitment(&self, job: JobId, epoch: u32) -> Commitment {
        EpochSecret::derive(&self.seed, job.0, epoch).commitment()
    }

    /// The report of an aggregated epoch (answered at once, even while the job aggregates
    /// another epoch).
    pub async fn report(&self, job: JobId, epoch: u32) -> Option<EpochReport> {
        self.keeper
            .call(|reply| KeeperMsg::Report { job, epoch, reply }, None)
            .await
            .ok()
            .and_then(|r| match r {
                ractor::rpc::CallResult::Success(r) => r,
                _ => None,
            })
    }

    /// Test hook: fails `job`'s keeper, as a panic in it would (module docs: it is rebuilt
    /// on the job's next call).
    #[doc(hidden)]
    pub fn crash_job_keeper(&self, job: JobId) {
        let _ = self.keeper.cast(KeeperMsg::CrashJob(job));
    }

    /// The validator pool (for fault injection in tests).
    pub fn pool(&self) -> &ValidatorPool {
        &self.pool
    }

    /// Stops the keepers and the pool.
    pub fn stop(&self) {
        self.keeper.stop(None);
        self.pool.stop();
    }
}

#[async_trait]
impl CheckpointSink for TrainingSink {
    async fn publish(&self, input: EpochInput<'_>) -> Result<PublishedEpoch, CheckpointError> {
        let msg = |reply| KeeperMsg::Publish {
            job: input.job,
            epoch: input.epoch,
            spec: Box::new(input.spec.clone()),
            base: input.base.map(str::to_string),
            deltas: input.deltas.to_vec(),
            reply,
        };
        // A job keeper that died mid-call drops the reply; the call is idempotent per
        // (job, epoch) (reports and the publication journal), so it is made again to the
        // keeper rebuilt for it, rather than fail the job. The pause lets the dying
        // keeper's failure reach the router first (otherwise the call may be handed to it).
        for attempt in 1..=3u32 {
            match self.keeper.call(msg, None).await {
                Ok(ractor::rpc::CallResult::Success(r)) => return r,
                Ok(_) => {}
                Err(e) => return Err(failed(format!("the model keeper is gone: {e}"))),
            }
            tracing::warn!(job = %input.job, epoch = input.epoch, attempt, "the job's keeper dropped a publication; calling again");
            tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt))).await;
        }
        Err(failed("the model keeper did not answer (3 attempts)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hanzod_store::registry::{GENERATION_CONFIG_FILE, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE};
    use hanzod_train::text::Tokenizer;

    fn lm_spec() -> TrainingSpec {
        TrainingSpec {
            model: hanzod_train::lm::QWEN3_TINY.into(),
            dataset: hanzod_train::text::AUSTEN.into(),
            local_lr: 3e-3,
            seq_len: 32,
            validation_tokens: 256,
            ..TrainingSpec::default()
        }
    }

    #[test]
    fn a_language_models_repo_holds_its_tokenizer_and_generation_files() {
        let trainer = trainer_of(&lm_spec(), JobId(2)).expect("qwen3-tiny trains here");
        let files = repo_files_of(&trainer);
        assert_eq!(
            files.keys().map(String::as_str).collect::<Vec<_>>(),
            [
                GENERATION_CONFIG_FILE,
                TOKENIZER_FILE,
                TOKENIZER_CONFIG_FILE
            ]
        );
        let text = |name: &str| {
            std::str::from_utf8(&files[name])
                .expect("UTF-8")
                .to_string()
        };
        // The job's tokenizer: the one its dataset was encoded with.
        let tokenizer = Tokenizer::from_json(&text(TOKENIZER_FILE)).expect("tokenizer.json");
        assert_eq!(text(TOKENIZER_FILE), Tokenizer::austen().to_json());
        // The ids transformers 5.24 gives for this sample on a published repo
        // (`AutoTokenizer.from_pretrained(folder)(sample)["input_ids"]`).
        let sample = "It is a truth universally acknowledged, that a single man in possession \
                      of a good fortune, must be in want of a wife.\n\nMr. Darcy's £10,000 a year!";
        let transformers: [u32; 52] = [
            1030, 364, 259, 1911, 470, 73, 1191, 557, 1816, 740, 785, 12, 335, 259, 261, 280, 296,
            532, 293, 893, 1974, 282, 259, 563, 1731, 12, 475, 287, 293, 757, 282, 259, 1420, 14,
            199, 199, 897, 14, 1074, 373, 221, 127, 97, 17, 16, 12, 16, 16, 16, 259, 1729, 1,
        ];
        assert_eq!(tokenizer.encode(sample), transformers);
        assert_eq!(tokenizer.decode(&transformers), sample);
        let config: serde_json::Value =
            serde_json::from_str(&text(TOKENIZER_CONFIG_FILE)).expect("JSON");
        assert_eq!(config["model_max_length"], 512);
        assert_eq!(config["eos_token"], "<|endoftext|>");
        assert_eq!(
            text(GENERATION_CONFIG_FILE),
            "{\n  \"_from_model_config\": true,\n  \"eos_token_id\": 0,\n  \
             \"transformers_version\": \"5.24.0\"\n}\n"
        );
        // The wine-mlp's repo holds the three core files only.
        let mlp = trainer_of(&TrainingSpec::default(), JobId(2)).expect("wine-mlp");
        assert!(repo_files_of(&mlp).is_empty());
    }

    #[test]
    fn a_bos_token_is_written_when_the_config_has_one() {
        let cfg = hanzod_train::qwen3::Qwen3Config {
            bos_token_id: Some(5),
            eos_token_id: Some(6),
            ..hanzod_train::lm::qwen3_tiny()
        };
        let v: serde_json::Value =
            serde_json::from_str(&generation_config_json(&cfg)).expect("JSON");
        assert_eq!(
            v,
            serde_json::json!({
                "_from_model_config": true,
                "bos_token_id": 5,
                "eos_token_id": 6,
                "transformers_version": TRANSFORMERS_VERSION,
            })
        );
    }

    /// f32 products (rank 4) and the aggregation carry about `(r + N + 2)·2⁻²⁴` relative
    /// error with respect to the sum of absolute terms; `1e-5` leaves margin.
    const LORA_REL_TOL: f64 = 1e-5;

    /// The merge inputs of the LoRA fixture's two honest adapters.
    fn lora_inputs(weights: [f32; 2], suspect: [bool; 2]) -> Vec<MergeInput> {
        let f = crate::validate::lora_tests::lora_fixture();
        f.deltas
            .iter()
            .zip(weights.into_iter().zip(suspect))
            .map(|(d, (weight, suspect))| MergeInput {
                delta: Arc::new(d.delta.data.clone()),
                weight,
                suspect,
            })
            .collect()
    }

    /// Checks a LoRA epoch's merge against `(c₁ΔW₁ + c₂ΔW₂)` (f64 reference): the update in
    /// the full layout (zeros on unadapted tensors, exactly), and the checkpoint
    /// `base + lr·update` with every unadapted tensor bit-identical to the base. Returns the
    /// largest tolerance used on the checkpoint.
    fn check_lora_merge(merged: &Merged, c: [f64; 2], lr: f32) -> f64 {
        use crate::validate::lora_tests::{dense_update, lora_fixture};
        let f = lora_fixture();
        let full = f.trainer.layout();
        let (d1, m1) = dense_update(&f.plan, &f.deltas[0].delta, &full);
        let (d2, m2) = dense_update(&f.plan, &f.deltas[1].delta, &full);
        let update = merged.delta.as_ref().expect("an update");
        assert_eq!(update.len(), full.len());
        let (base, next) = (&f.base.data, &merged.next.data);
        let adapted: BTreeSet<&str> = f.plan.modules.iter().map(|m| m.base.as_str()).collect();
        assert_eq!(adapted.len(), 8);
        let mut bound = 0.0f64;
        for e in full.entries() {
            let range = e.offset..e.offset + e.len;
            if !adapted.contains(e.name.as_str()) {
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&next[range.clone()]),
                    bits(&base[range.clone()]),
                    "{}",
                    e.name
                );
                assert!(
                    update[range].iter().all(|&u| u.to_bits() == 0),
                    "{}",
                    e.name
                );
                continue;
            }
            for j in range {
                let want = c[0] * d1[j] + c[1] * d2[j];
                let mag = c[0] * m1[j] + c[1] * m2[j];
                let err = (f64::from(update[j]) - want).abs();
                assert!(
                    err <= LORA_REL_TOL * mag + 1e-30,
                    "{}: {} vs {want}",
                    e.name,
                    update[j]
                );
                let want_next = f64::from(base[j]) + f64::from(lr) * want;
                let tol = LORA_REL_TOL * (f64::from(lr) * mag + f64::from(base[j].abs()));
                let err = (f64::from(next[j]) - want_next).abs();
                assert!(err <= tol + 1e-30, "{}: {} vs {want_next}", e.name, next[j]);
                bound = bound.max(tol);
            }
        }
        // The checkpoint is the full model, as published.
        let back = Weights::from_safetensors(&merged.bytes, full).expect("safetensors");
        assert_eq!(back, *merged.next);
        bound
    }

    /// Two honest LoRA deltas merged with the weighted mean give
    /// `base + lr·(w₁ΔW₁ + w₂ΔW₂)/(w₁ + w₂)` on the adapted modules and leave every other
    /// tensor bit-identical; averaging the factors instead gives another checkpoint.
    #[test]
    fn a_lora_epoch_merges_the_nodes_updates_into_a_full_checkpoint() {
        let f = crate::validate::lora_tests::lora_fixture();
        let (w, lr) = ([0.3f32, 0.7], 0.7f32);
        let inputs = lora_inputs(w, [false; 2]);
        let merged = merge_epoch(
            &f.base,
            &f.trainer,
            f.loss_before,
            &inputs,
            false,
            lr,
            false,
        );
        assert_eq!(
            merged.aggregator,
            Some("weighted_mean"),
            "{:?}",
            merged.kept
        );
        assert!(merged.kept.is_none());
        assert_eq!(
            merged.loss_after,
            f.trainer.validation_loss(&merged.next).expect("loss")
        );
        let sum = f64::from(w[0]) + f64::from(w[1]);
        let c = [f64::from(w[0]) / sum, f64::from(w[1]) / sum];
        let bound = check_lora_merge(&merged, c, lr);

        // Averaging the factors: mean A, mean B (same weights), then one product.
        let mut mean = f.deltas[0].delta.clone();
        for (x, y) in mean.data.iter_mut().zip(&f.deltas[1].delta.data) {
            *x = ((c[0] * f64::from(*x)) + c[1] * f64::from(*y)) as f32;
        }
        let full = f.trainer.layout();
        let (dm, _) = crate::validate::lora_tests::dense_update(&f.plan, &mean, &full);
        let diff = f
            .base
            .data
            .iter()
            .zip(&merged.next.data)
            .zip(&dm)
            .map(|((&b, &n), &d)| (f64::from(b) + f64::from(lr) * d - f64::from(n)).abs())
            .fold(0.0f64, f64::max);
        assert!(
            diff > 10.0 * bound,
            "factor averaging differs by {diff:e}, rounding allows {bound:e}"
        );
    }

    /// The median (robust) takes both adapters' updates unweighted; a suspect adapter has
    /// weight 0 in the weighted mean.
    #[test]
    fn a_lora_epochs_median_and_suspect_weights_act_on_the_updates() {
        let f = crate::validate::lora_tests::lora_fixture();
        let lr = 1.0f32;
        let inputs = lora_inputs([0.3, 0.7], [false; 2]);
        let merged = merge_epoch(&f.base, &f.trainer, f.loss_before, &inputs, true, lr, false);
        assert_eq!(merged.aggregator, Some("median"), "{:?}", merged.kept);
        check_lora_merge(&merged, [0.5, 0.5], lr);

        let inputs = lora_inputs([0.3, 0.7], [false, true]);
        let merged = merge_epoch(
            &f.base,
            &f.trainer,
            f.loss_before,
            &inputs,
            false,
            lr,
            false,
        );
        assert_eq!(
            merged.aggregator,
            Some("weighted_mean"),
            "{:?}",
            merged.kept
        );
        check_lora_merge(&merged, [1.0, 0.0], lr);

        // Nothing accepted: the base is kept, with no update.
        let merged = merge_epoch(&f.base, &f.trainer, f.loss_before, &[], false, lr, true);
        assert_eq!(merged.kept.as_deref(), Some("every delta was rejected"));
        assert!(merged.delta.is_none());
        assert_eq!(*merged.next, *f.base);
    }

    /// A merged update that overflows is not published: both aggregators refuse it and the
    /// epoch keeps its base (the loss-rise guard after a finite merge is the full path's).
    #[test]
    fn a_lora_merge_that_is_not_a_usable_model_is_refused() {
        let f = crate::validate::lora_tests::lora_fixture();
        let mut inputs = lora_inputs([1.0, 1.0], [false; 2]);
        // B = f32::MAX / 2: (alpha/r)·B overflows, so does every ΔW.
        let layout = f.trainer.delta_layout();
        for input in &mut inputs {
            let mut d = (*input.delta).clone();
            for m in &f.plan.modules {
                let e = layout.entry(&m.lora_b).expect("B");
                d[e.offset..e.offset + e.len].fill(f32::MAX / 2.0);
            }
            input.delta = Arc::new(d);
        }
        let merged = merge_epoch(
            &f.base,
            &f.trainer,
            f.loss_before,
            &inputs,
            false,
            1.0,
            false,
        );
        assert!(merged.aggregator.is_none());
        let why = merged.kept.expect("kept");
        assert!(
            why.starts_with("the median merge is not a usable model"),
            "{why}"
        );
        assert!(merged.delta.is_none());
        assert_eq!(*merged.next, *f.base);
    }

    /// A language model's config.json is its Hugging Face config plus `hanzod_job`, which
    /// recovery reads back (the other files change nothing there).
    #[test]
    fn a_language_models_config_names_its_job_for_recovery() {
        let training = lm_spec();
        let spec = JobSpec {
            name: "austen-lm".into(),
            epochs: 3,
            min_nodes: 1,
            max_nodes: 2,
            min_vram_bytes: 0,
            pending_deadline_ms: 60_000,
            epoch_deadline_ms: 60_000,
            utility: 1.0,
            submitter_stake: GymWei::gym(100_000),
            training: training.clone(),
        };
        let model = ModelCatalog::builtin()
            .check_training(&training)
            .expect("built in");
        let hf = hanzod_train::recipe::lm_config(&training)
            .expect("config")
            .expect("a language model")
            .to_json();
        let config = model_config_json(&training.model, &model, Some(&hf), Some((JobId(7), &spec)));
        let v: serde_json::Value = serde_json::from_slice(&config).expect("JSON");
        assert_eq!(v["model_type"], "qwen3");
        assert_eq!(v["architectures"][0], "Qwen3ForCausalLM");
        assert_eq!(job_of_config(&config), Some((JobId(7), spec)));
    }
}
