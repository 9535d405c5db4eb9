//! [`TrainingSink`]: the [`CheckpointSink`] that turns an epoch's accepted deltas into the
//! next checkpoint (DESIGN §6, paper §5–§6): fetch each delta from the blob store, judge it
//! on the [`ValidatorPool`], choose the aggregator ([`crate::merge::RobustPolicy`]), merge
//! with the composite scores times the deltas' agreement as weights
//! ([`crate::epoch::star_epoch`]), apply the merged delta with the job's outer learning rate,
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
//! **Ring aggregation** (DESIGN §6.4). The sink gives the core the epoch's two sketch
//! seeds (from the spot-check secret, [`hanzod_protocol::round::epoch_seed`]), the
//! spot-check selection, the members' weights from their sketches (scored in the job's
//! keeper, against its norm average and last merged delta, [`crate::sketch_score`]; more
//! than [`SinkConfig::suspect_threshold`] excluded is an error, so the core falls back to
//! the star, where every delta is judged in full and merged by agreement, the exact
//! coordinate median being the fallback), and the check of the round's uploaded
//! result against the members' check sketches. The publication then applies the round's
//! merged delta as star mode applies its merge ([`RING_AGGREGATOR`]), after taking out the
//! share of every spot-checked member whose upload the validator rejected, and pays the
//! round's members by their merge weights. LoRA jobs merge in star mode only (a ring would
//! sum the factors).
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

use crate::epoch::{
    fold_norms, kept_base, merge_limit, refused_loss, seed_epoch_norms, star_epoch, star_norms,
    star_weight, DeltaForm, Merged, Merit, StarPolicy,
};
use crate::merge::{Aggregator, RobustAggregator, WeightedMean};
use crate::publisher::{Checkpoint, Publisher, Staged};
use crate::ring_audit::{self, RoundAuditReport};
use crate::score::{is_spot_checked, Commitment, EpochSecret, NormTracker};
use crate::sketch_score::{
    score_sketches, Exclusion, MemberSketch, SketchContext, SketchScoreConfig, SketchScoreError,
    SketchScores,
};
use crate::validate::{
    EpochContext, Rejection, SlashEvidence, SpotCheck, Submission, ValidationConfig, ValidatorPool,
    Verdict,
};
use hanzod_actors::aggregation::{Commit, RoundAudit};
use hanzod_actors::job::{EpochOutcome, EpochSummary, JobSpec, TrainingSpec};
use hanzod_actors::ports::memory::MemoryStateStore;
use hanzod_actors::ports::{
    ChainError, CheckRefusal, CheckpointError, CheckpointSink, Clock, DeltaReceipt, EpochInput,
    Ledger, LedgerError, Metrics, PublishedEpoch, RingCheckInput, RingResult, RingScoreInput,
    RingScores, RingSeeds, SketchData, StateStore, SystemClock,
};
use hanzod_actors::rewards::split_rewards;
use hanzod_actors::types::{GymWei, JobId, NodeId};
use hanzod_protocol::hzdl::DeltaView;
use hanzod_protocol::identity::Identity;
use hanzod_protocol::model::{check_against, ModelSpec};
use hanzod_protocol::record::SignedPublication;
use hanzod_protocol::round::{self, SeedPurpose};
use hanzod_protocol::sketch::{check_reduction, Sketch, SketchError};
use hanzod_store::blobs::BlobStore;
use hanzod_store::registry::Location;
use hanzod_store::{MemoryObjectStore, ModelCard, ModelRegistry, ModelUpload, ObjectStore};
use hanzod_train::catalog::ModelCatalog;
use hanzod_train::{Trainer, Weights};

/// Tunables of the sink.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SinkConfig {
    /// The validator's tunables.
    pub validation: ValidationConfig,
    /// Fraction of suspect deltas above which the robust aggregator is used alone in a
    /// star epoch without an agreement ([`crate::epoch::StarPolicy::suspect_threshold`]),
    /// and of excluded ring members above which a ring epoch falls back to the star
    /// (DESIGN §6: 0.30).
    pub suspect_threshold: f32,
    /// The robust aggregator used above the threshold and as the weighted mean's fallback
    /// ([`RobustAggregator`]; default the coordinate median).
    pub robust_aggregator: RobustAggregator,
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
            robust_aggregator: RobustAggregator::default(),
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
    /// The weight the merge gave it: composite × agreement under the weighted mean
    /// ([`crate::epoch::star_weight`]; 0 when suspect), 1 under a robust aggregator, 0 when
    /// rejected or when the epoch kept its base; a copy group's representative is rejected
    /// (unpaid) but carries the group's one weight. In
    /// ring aggregation the member's weight in the applied merge (the round's `wᵢ`,
    /// renormalised when rejected members were taken out; 0 when excluded or rejected).
    pub weight: f32,
    /// Suspect (counts towards the robust-merge threshold).
    pub suspect: bool,
    /// Star aggregation: agreement with the epoch's coordinate median in `[0, 1]`
    /// ([`crate::epoch::agreements`]), a factor of the weight and of the reward share;
    /// `None` when rejected (but for a copy group's representative), when too few deltas
    /// were merged, for a LoRA adapter and in ring aggregation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agreement: Option<f64>,
    /// The spot-check, when selected.
    pub spot_check: Option<SpotCheck>,
    /// Why rejected (`None`: accepted).
    pub rejected: Option<Rejection>,
    /// Ring aggregation: why the member got no weight (excluded by the sketch scoring, or
    /// no part in the accepted round); `None` in star aggregation and for merged members.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub excluded: Option<String>,
}

/// What a ring-aggregated epoch's report adds (DESIGN §6.4): the round the merge came
/// from, and the correction made for spot-checked members whose uploads were rejected.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RingReport {
    /// SHA-256 (hex) of the round's merged delta `Σ wᵢ·δᵢ` as uploaded; `None` when the
    /// scoring excluded every member.
    pub merged: Option<String>,
    /// The round's members (hex keys) with the weights the round ran with (summing to 1
    /// within `n·2⁻²⁴`).
    pub weights: Vec<(String, f32)>,
    /// Spot-checked members whose uploads were rejected and taken out of the merge (hex
    /// keys): `merged' = (merged − Σ wᵢ·δᵢ) / (1 − Σ wᵢ)` over them.
    pub removed: Vec<String>,
    /// `Σ wᵢ` over [`RingReport::removed`] (dimensionless, in `[0, 1]`).
    pub removed_weight: f64,
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
    /// The aggregator used (`weighted_mean`, `median`, or [`RING_AGGREGATOR`] for a ring
    /// round's merge), or `None` when the epoch kept the base checkpoint.
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
    /// Ring aggregation: the round the epoch merged (`None` in star aggregation). Rewards
    /// then follow the merge weights ([`DeltaReport::weight`]), not the composite scores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring: Option<RingReport>,
    /// Ring aggregation fallen back to the star after a round ran: what the attribution of
    /// the round found; each member proved to have tampered is rejected and slashed with
    /// its [`TamperEvidence`](ring_audit::TamperEvidence).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round_audit: Option<RoundAuditReport>,
    /// The job's best checkpoint after this epoch ([`best_loss`]): its validation loss.
    /// Absent in reports written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_loss: Option<f64>,
    /// The epoch whose checkpoint is the best (`None` with a `best_loss`: the checkpoint
    /// the job started from, or, after a restart, that of an earlier epoch the job's
    /// summaries record and this keeper has no report of). An epoch later than it has not
    /// improved on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_epoch: Option<u32>,
}

impl EpochReport {
    /// The few numbers the job records with its checkpoint (`hanzod job status`): advanced
    /// or kept and why, the losses, the deltas accepted / suspect / rejected, the
    /// spot-checks, and the rewards and slashes recorded so far.
    pub fn summary(&self) -> EpochSummary {
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let wei = |s: &str| s.parse::<u128>().unwrap_or(0);
        // Members the ring's scoring excluded count as rejected: they got nothing.
        let refused = |d: &DeltaReport| d.rejected.is_some() || d.excluded.is_some();
        let rejected = self.deltas.iter().filter(|d| refused(d)).count();
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
                    .filter(|d| d.suspect && !refused(d))
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
        /// Ring aggregation: the accepted round ([`EpochInput::ring`]).
        ring: Option<Box<RingResult>>,
        /// Ring aggregation fallen back to the star: the round to attribute
        /// ([`EpochInput::audit`]).
        audit: Option<Box<RoundAudit>>,
        /// The job's best loss before the epoch, as its summaries say
        /// ([`EpochInput::best_loss`]).
        best_loss: Option<f64>,
        /// The checkpoint, or why there is none.
        reply: RpcReplyPort<Result<PublishedEpoch, CheckpointError>>,
    },
    /// Score a job's ring members from their sketches: handed to the job's keeper, which
    /// holds the job's norm average and last merged delta.
    RingScore {
        /// The job.
        job: JobId,
        /// What to score.
        request: Box<RingScoreRequest>,
        /// The weights, or why there are none.
        reply: RpcReplyPort<Result<RingScores, CheckpointError>>,
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
        /// Ring aggregation: the accepted round.
        ring: Option<Box<RingResult>>,
        /// Ring aggregation fallen back to the star: the round to attribute.
        audit: Option<Box<RoundAudit>>,
        /// The job's best loss before the epoch, as its summaries say.
        best_loss: Option<f64>,
        /// The checkpoint, or why there is none.
        reply: RpcReplyPort<Result<PublishedEpoch, CheckpointError>>,
    },
    /// Score the ring members of an epoch of the keeper's job ([`KeeperMsg::RingScore`]).
    RingScore {
        /// What to score.
        request: Box<RingScoreRequest>,
        /// The weights, or why there are none.
        reply: RpcReplyPort<Result<RingScores, CheckpointError>>,
    },
    /// Settle and push again what this job still owes.
    Retry,
    /// Test hook ([`KeeperMsg::CrashJob`]).
    Crash,
}

/// A [`RingScoreInput`], owned (it crosses to the job's keeper).
struct RingScoreRequest {
    epoch: u32,
    spec: JobSpec,
    base: Option<String>,
    seed: [u8; 32],
    members: Vec<(NodeId, Commit, SketchData)>,
    /// The deltas the orchestrator holds (spot-checked uploads): node and payload.
    held: Vec<(NodeId, Arc<[u8]>)>,
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
    /// The last ring scoring (epoch, scores): its norm estimates and norm average are
    /// folded into the job's when that epoch is published.
    ring_scored: Option<(u32, SketchScores)>,
    /// The job's best loss before the epoch being published, as the job's summaries in
    /// the event log say ([`EpochInput::best_loss`]): after a restart the keeper's
    /// `reports` are empty, and the merge is still bounded by the job's best.
    recorded_best: Option<f64>,
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

/// The report of a judged epoch (`deltas` and their verdicts `judged`, in the same
/// order) before publication and settlement: one line per delta (its weight in the merge:
/// the composite score under the weighted mean, 0 when suspect; 1 under a robust
/// aggregator; 0 when rejected or when the epoch kept its base), and the slashing
/// evidence of its failed spot-checks. `checkpoint`, `loss_after` and `aggregator` are the
/// merge's; rewards, slashes paid and publication are filled in later.
pub fn epoch_report(
    ctx: &EpochContext,
    deltas: &[DeltaReceipt],
    judged: &[Verdict],
    (agreement, weights): (&[Option<f64>], &[f64]),
    base: Option<String>,
    (checkpoint, loss_after, aggregator): (&str, f64, Option<&'static str>),
) -> EpochReport {
    let lines = deltas
        .iter()
        .zip(judged)
        .enumerate()
        .map(|(k, (r, v))| DeltaReport {
            node: hex::encode(r.node.0),
            delta_hash: hex::encode(r.delta_hash),
            claimed_loss: r.claimed_loss,
            loss_after: v.loss_after,
            norm: v.norm,
            score: v.score,
            weight: match (weights.get(k), &v.outcome, v.score, aggregator) {
                (Some(w), ..) => *w as f32,
                (None, Err(_), ..) | (None, _, None, _) | (None, _, _, None) => 0.0,
                // Every robust aggregator takes each accepted delta with weight 1.
                (None, Ok(_), Some(_), Some(a)) if a != WeightedMean.name() => 1.0,
                (None, Ok(_), Some(_), Some(_)) => star_weight(v, None) as f32,
            },
            suspect: v.suspect(),
            agreement: agreement.get(k).copied().flatten(),
            spot_check: v.spot_check.clone(),
            rejected: v.outcome.as_ref().err().cloned(),
            excluded: None,
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
        ring: None,
        round_audit: None,
        best_loss: None,
        best_epoch: None,
    }
}

/// Who an epoch pays, before stake and penalty are checked (paper §8). In star mode every
/// accepted delta's node by [`Merit::weight`], the rule that weighed it in the weighted
/// mean (composite score × agreement with the epoch, 0 when suspect; without an agreement
/// 0 when it alone raised the validation loss by more than 10 %), so a delta the merge
/// gives no weight is not paid; under a robust aggregator too, whose own weights are 1
/// for every delta it took. When the epoch kept its base in star mode, only the deltas
/// that lowered the validation loss on their own (`dl > 0`, measured by the validator)
/// are paid, by the same rule: their work was checked and useful, and an epoch that
/// Byzantine nodes kept from merging must not leave the honest ones unpaid (issue 19: two
/// poisoners of three kept every epoch and the honest node, which passed every
/// spot-check, earned nothing). In ring mode every round member by its merge weight (0
/// for the excluded and the rejected, who are left out); a kept ring epoch pays nobody
/// (only its spot-checked members were scored). Returns (node, share > 0) pairs,
/// unnormalised ([`split_rewards`] normalises); nodes whose hex id does not parse are
/// left out.
pub fn reward_shares(report: &EpochReport) -> Vec<(NodeId, f64)> {
    let ring = report.ring.is_some();
    let kept = report.aggregator.is_none();
    if kept && ring {
        // Only spot-checked members have a score: paying them alone would be a lottery.
        return Vec::new();
    }
    report
        .deltas
        .iter()
        .filter(|d| d.rejected.is_none() && d.excluded.is_none())
        .filter_map(|d| {
            let node = d.node.parse::<NodeId>().ok()?;
            let share = if ring {
                f64::from(d.weight)
            } else {
                let score = d.score?;
                if kept && score.loss_improvement <= 0.0 {
                    return None;
                }
                // The rule that weighed it in the merge (an accepted delta's `suspect` is
                // what its measurements say).
                Merit {
                    composite: Some(score.composite),
                    measured_suspect: d.suspect,
                    agreement: d.agreement,
                    loss_before: report.loss_before,
                    loss_after: d.loss_after,
                }
                .weight()
            };
            (share > 0.0).then_some((node, share))
        })
        .collect()
}

/// The job's best checkpoint so far from its epoch `reports`: the lowest validation loss
/// among the earliest report's base (`None` epoch: the checkpoint the job started from)
/// and every report's checkpoint (an epoch that kept its base repeats the base's loss;
/// ties go to the earlier). `None` without reports.
pub fn best_loss<'a>(
    reports: impl IntoIterator<Item = &'a EpochReport>,
) -> Option<(Option<u32>, f64)> {
    let mut best: Option<(Option<u32>, f64)> = None;
    let mut first = true;
    let mut by_epoch: Vec<&EpochReport> = reports.into_iter().collect();
    by_epoch.sort_by_key(|r| r.epoch);
    for r in by_epoch {
        if first {
            first = false;
            if r.loss_before.is_finite() {
                best = Some((None, r.loss_before));
            }
        }
        if r.aggregator.is_some() && r.loss_after.is_finite() {
            match best {
                Some((_, b)) if b <= r.loss_after => {}
                _ => best = Some((Some(r.epoch), r.loss_after)),
            }
        }
    }
    best
}

/// The aggregator name a ring-aggregated epoch reports (`EpochReport::aggregator`, the
/// `merges{aggregator}` counter).
pub const RING_AGGREGATOR: &str = "ring";

/// What the ring branch did to the round's weights.
struct RingMerge {
    /// Member → its weight in the applied merge: the round's `wᵢ / (1 − Σ removed wⱼ)`, 0
    /// for a removed member; empty when nothing was merged.
    weights: BTreeMap<NodeId, f32>,
    /// Members taken out of the merge (spot-checked, rejected).
    removed: Vec<NodeId>,
    /// `Σ wᵢ` over `removed`.
    removed_weight: f64,
}

/// A ring epoch's update (DESIGN §6.4), applied as star mode applies its merge: the round's
/// merged delta `m = Σ wᵢ·δᵢ` (`merged_payload`, an f32 HZDL delta of the job's model,
/// tensors in name order), less each rejected member's share and renormalised,
/// `m' = (m − Σ_removed wᵢ·δᵢ) / (1 − Σ_removed wᵢ)` (f64 per coordinate, then f32; `δᵢ`
/// the member's upload as [`round::flat_values`] reads it, which is what it reduced), then
/// `base + outer_lr·m'`. Like [`merge_epoch`], a merge that is not a usable model or whose
/// validation loss is above [`merge_limit`] (2 % over the job's best checkpoint so far,
/// `best_loss`, at most the base's) keeps the base and says why; nothing here fails the job.
fn ring_epoch(
    base: &Arc<Weights>,
    trainer: &Trainer,
    (loss_before, best_loss): (f64, Option<f64>),
    outer_lr: f32,
    merged_payload: &[u8],
    removed: &[(NodeId, f32, &[u8])],
) -> Merged {
    let keep = |why: String| {
        tracing::warn!(reason = %why, "ring merge refused");
        kept_base(base, loss_before, why)
    };
    let merged = match DeltaView::parse(merged_payload)
        .map_err(|e| e.to_string())
        .and_then(|view| {
            Weights::from_delta_view(&view, trainer.layout()).map_err(|e| e.to_string())
        }) {
        Ok(w) => w.data,
        Err(e) => {
            return keep(format!(
                "the round's merged delta is not a delta of the model: {e}"
            ))
        }
    };
    let update = if removed.is_empty() {
        merged
    } else {
        let mut acc: Vec<f64> = merged.iter().map(|&x| f64::from(x)).collect();
        let mut removed_weight = 0.0f64;
        for (node, w, payload) in removed {
            let values = match DeltaView::parse(payload) {
                Ok(view) => round::flat_values(&view),
                Err(e) => {
                    return keep(format!(
                        "the merge cannot be corrected for {node}'s rejected delta: {e}"
                    ))
                }
            };
            if values.len() != acc.len() {
                return keep(format!(
                    "the merge cannot be corrected for {node}'s rejected delta: {} values, the model has {}",
                    values.len(),
                    acc.len()
                ));
            }
            let w = f64::from(*w);
            for (a, d) in acc.iter_mut().zip(&values) {
                *a -= w * f64::from(*d);
            }
            removed_weight += w;
        }
        let denominator = 1.0 - removed_weight;
        // NaN included: the weights are finite, so this only guards a caller's bug.
        if denominator.is_nan() || denominator <= 0.0 {
            return keep("every member of the round was rejected".into());
        }
        acc.iter().map(|a| (a / denominator) as f32).collect()
    };
    let mut next = (**base).clone();
    if let Err(e) = next.add_scaled(&update, outer_lr) {
        return keep(format!("the ring merge is not a usable model: {e}"));
    }
    let loss_after = match trainer.validation_loss(&next) {
        Ok(l) => l,
        Err(e) => return keep(format!("the ring merge is not a usable model: {e}")),
    };
    // A NaN loss is refused too.
    if loss_after.is_nan() || loss_after > merge_limit(loss_before, best_loss) {
        return keep(refused_loss(
            RING_AGGREGATOR,
            loss_before,
            best_loss,
            loss_after,
        ));
    }
    Merged {
        bytes: next.to_safetensors(),
        next: Arc::new(next),
        loss_after,
        aggregator: Some(RING_AGGREGATOR),
        kept: None,
        delta: Some(Arc::new(update)),
    }
}

/// The norms a ring epoch folds into the running average (by committed delta hash): each
/// member merged with a weight, its upload's exact norm when it was uploaded (and not
/// suspect, as in star mode), else its sketch's estimate when this keeper scored the epoch.
/// None when nothing was merged.
fn ring_norms(
    r: &RingResult,
    rm: &RingMerge,
    judged: &[Verdict],
    scored: Option<&SketchScores>,
    advanced: bool,
) -> Vec<([u8; 32], f64)> {
    if !advanced {
        return Vec::new();
    }
    let commits: BTreeMap<NodeId, &Commit> = r.commits.iter().map(|(n, c)| (*n, c)).collect();
    rm.weights
        .iter()
        .filter(|(_, w)| **w > 0.0)
        .filter_map(|(node, _)| {
            let hash = commits.get(node)?.hash;
            if let Some(v) = judged.iter().find(|v| v.node == *node) {
                return (v.outcome.is_ok() && !v.suspect())
                    .then_some(v.norm)
                    .flatten()
                    .map(|n| (hash, n));
            }
            let v = scored?.verdicts.iter().find(|v| v.node == *node)?;
            v.norm_estimate.map(|n| (hash, n))
        })
        .collect()
}

/// Completes a ring epoch's report: every committed member gets a line (the uploads'
/// lines as judged; the others from their commitments), in node order, with its weight in
/// the applied merge (0 when nothing was merged, when removed or excluded) and why it was
/// excluded; and the round's [`RingReport`].
fn ring_report(
    report: &mut EpochReport,
    r: &RingResult,
    rm: &RingMerge,
    scored: Option<&SketchScores>,
    advanced: bool,
) {
    let excluded_set: BTreeMap<NodeId, &String> = r.excluded.iter().map(|(n, w)| (*n, w)).collect();
    let weight_of = |node: &NodeId| {
        if advanced {
            rm.weights.get(node).copied().unwrap_or(0.0)
        } else {
            0.0
        }
    };
    let why_not = |node: &NodeId| -> Option<String> {
        if let Some(why) = excluded_set.get(node) {
            return Some((*why).clone());
        }
        (!r.weights.iter().any(|(n, _)| n == node))
            .then(|| "took no part in the accepted round".to_string())
    };
    let mut lines: BTreeMap<NodeId, DeltaReport> = BTreeMap::new();
    for mut line in std::mem::take(&mut report.deltas) {
        let Ok(node) = line.node.parse::<NodeId>() else {
            continue;
        };
        line.weight = if line.rejected.is_some() {
            0.0
        } else {
            weight_of(&node)
        };
        line.excluded = why_not(&node);
        line.suspect |= excluded_set.contains_key(&node);
        lines.insert(node, line);
    }
    let nodes: BTreeSet<NodeId> = r
        .commits
        .iter()
        .map(|(n, _)| *n)
        .chain(r.weights.iter().map(|(n, _)| *n))
        .chain(r.excluded.iter().map(|(n, _)| *n))
        .collect();
    for node in nodes {
        if lines.contains_key(&node) {
            continue;
        }
        let commit = r.commits.iter().find(|(n, _)| *n == node).map(|(_, c)| c);
        let estimate = scored
            .and_then(|s| s.verdicts.iter().find(|v| v.node == node))
            .and_then(|v| v.norm_estimate);
        let excluded = why_not(&node);
        lines.insert(
            node,
            DeltaReport {
                node: node.to_string(),
                delta_hash: commit.map(|c| hex::encode(c.hash)).unwrap_or_default(),
                claimed_loss: commit.map_or(0.0, |c| c.claimed_loss),
                loss_after: None,
                norm: estimate,
                score: None,
                weight: weight_of(&node),
                suspect: excluded_set.contains_key(&node),
                agreement: None,
                spot_check: None,
                rejected: None,
                excluded,
            },
        );
    }
    report.deltas = lines.into_values().collect();
    report.suspect = report.deltas.iter().filter(|d| d.suspect).count();
    report.ring = Some(RingReport {
        merged: r.merged.map(hex::encode),
        weights: r.weights.iter().map(|(n, w)| (n.to_string(), *w)).collect(),
        removed: rm.removed.iter().map(NodeId::to_string).collect(),
        removed_weight: rm.removed_weight,
    });
}

/// The deltas tamper evidence is checked against: every member's of a round with a
/// proved tamperer (none when nobody was).
fn tamper_inputs(audit: Option<&RoundAuditReport>) -> impl Iterator<Item = [u8; 32]> + '_ {
    audit
        .into_iter()
        .flat_map(|a| a.tampered.first())
        .flat_map(|t| &t.delta_hashes)
        .filter_map(|h| <[u8; 32]>::try_from(hex::decode(h).ok()?).ok())
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

    /// Scores an epoch's ring members ([`CheckpointSink::ring_score`]) against the job's
    /// model state as of `request.base`, and keeps the scores for the epoch's publication.
    async fn ring_score(
        &mut self,
        request: RingScoreRequest,
    ) -> Result<RingScores, CheckpointError> {
        let job = self.job;
        let training = &request.spec.training;
        if training.mode == hanzod_actors::job::TrainMode::Lora {
            return Err(failed(LORA_RING));
        }
        let threshold = self.deps.config.suspect_threshold;
        let model = self.model(job, training, request.base.as_deref()).await?;
        if !matches!(DeltaForm::of(&model.trainer), Ok(DeltaForm::Full)) {
            return Err(failed(LORA_RING));
        }
        let len = model.trainer.layout().len() as u64;
        let (last, norms) = (model.last_merged.clone(), model.norms);
        let RingScoreRequest {
            epoch,
            seed,
            members,
            held,
            ..
        } = request;
        let (scored, members, unbound) = blocking(move || {
            // A held delta binds its member's scoring sketch: one that is not its delta's
            // is excluded before scoring (it would score something it does not reduce).
            let unbound = unbound_sketches(&held, &members, &seed);
            let bound: Vec<(NodeId, Commit, SketchData)> = members
                .iter()
                .filter(|(n, ..)| !unbound.iter().any(|(u, _)| u == n))
                .cloned()
                .collect();
            let scored = score_ring(&bound, &seed, len, last.as_deref().map(|v| &v[..]), norms);
            (scored, members, unbound)
        })
        .await?;
        for (node, why) in &unbound {
            tracing::warn!(job = %job, epoch, node = %node, %why, "ring member excluded: its scoring sketch is not its committed delta's");
        }
        let unbound_of = |weights: &mut BTreeMap<NodeId, f64>,
                          excluded: &mut BTreeMap<NodeId, String>| {
            for (node, why) in &unbound {
                weights.insert(*node, 0.0);
                excluded.insert(*node, why.clone());
            }
        };
        let scores = match scored {
            Ok(Some(scores)) => scores,
            Ok(None) => {
                let why = format!(
                    "the sketch scoring excluded all {} members of the epoch",
                    members.len()
                );
                let mut weights: BTreeMap<NodeId, f64> =
                    members.iter().map(|(n, ..)| (*n, 0.0)).collect();
                let mut excluded: BTreeMap<NodeId, String> =
                    members.iter().map(|(n, ..)| (*n, why.clone())).collect();
                unbound_of(&mut weights, &mut excluded);
                return Ok(RingScores { weights, excluded });
            }
            Err(e) => return Err(failed(format!("the ring's sketches cannot be scored: {e}"))),
        };
        if scores.robust_needed(threshold) {
            return Err(failed(format!(
                "the sketch scoring excluded {} of {} members, more than {:.0} %: the epoch \
                 needs the robust aggregator (the coordinate median), which a ring cannot \
                 compute",
                scores.excluded(),
                scores.verdicts.len(),
                f64::from(threshold) * 100.0
            )));
        }
        for (copy, of) in scores.copy_pairs() {
            tracing::info!(job = %job, epoch, copy = %copy, original = %of, "ring member excluded as a copy");
        }
        let mut result = RingScores {
            weights: scores.verdicts.iter().map(|v| (v.node, v.weight)).collect(),
            excluded: scores
                .verdicts
                .iter()
                .filter_map(|v| Some((v.node, exclusion_text(v.excluded.as_ref()?))))
                .collect(),
        };
        unbound_of(&mut result.weights, &mut result.excluded);
        self.ring_scored = Some((epoch, scores));
        Ok(result)
    }

    async fn publish(
        &mut self,
        job: JobId,
        epoch: u32,
        spec: JobSpec,
        base: Option<String>,
        deltas: Vec<DeltaReceipt>,
        (ring, audit): (Option<RingResult>, Option<RoundAudit>),
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
                let merged = ring.as_ref().and_then(|r| r.merged);
                self.adopt(job, &training, &deltas, merged, &staged).await?;
                (staged, None)
            }
            None => {
                let rounds = (ring.as_ref(), audit.as_ref());
                self.aggregate(job, epoch, &spec, base, &deltas, rounds, &publisher)
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
        ring_merged: Option<[u8; 32]>,
        staged: &Staged,
    ) -> Result<(), CheckpointError> {
        let evidence: std::collections::HashSet<String> = staged
            .report
            .get("slashes")
            .and_then(|s| s.as_array())
            .into_iter()
            .flatten()
            .filter_map(|s| s.get("delta_hash")?.as_str().map(str::to_string))
            .chain(
                staged
                    .report
                    .get("round_audit")
                    .and_then(|a| serde_json::from_value::<RoundAuditReport>(a.clone()).ok())
                    .map(|a| tamper_inputs(Some(&a)).map(hex::encode).collect::<Vec<_>>())
                    .unwrap_or_default(),
            )
            .collect();
        let this_epoch = deltas
            .iter()
            .map(|r| r.delta_hash)
            .filter(|h| !evidence.contains(&hex::encode(h)))
            .chain(ring_merged)
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
    ///
    /// In ring aggregation (`ring`) the merge is the round's result, corrected for the
    /// spot-checked members whose uploads (`deltas`) were rejected ([`ring_epoch`]), and
    /// the report lists every member of the round with its merge weight.
    #[allow(clippy::too_many_arguments)]
    async fn aggregate(
        &mut self,
        job: JobId,
        epoch: u32,
        spec: &JobSpec,
        base: Option<String>,
        deltas: &[DeltaReceipt],
        (ring, audit): (Option<&RingResult>, Option<&RoundAudit>),
        publisher: &Publisher,
    ) -> Result<(Staged, Option<Arc<[u8]>>), CheckpointError> {
        let training = &spec.training;
        let d = &self.deps;
        let (blobs, pool, config, seed) = (d.blobs.clone(), d.pool.clone(), d.config, d.seed);
        let outer_lr = training.outer_lr as f32;
        // The ring scoring of this epoch, when this keeper ran it.
        let scored = match self.ring_scored.take() {
            Some((e, s)) if e == epoch && ring.is_some() => Some(s),
            _ => None,
        };
        // Reports of earlier epochs only (a publication retried for this epoch has none),
        // and what the job recorded (the keeper's reports start again after a restart).
        let best = best_loss(self.reports.range(..epoch).map(|(_, r)| r))
            .map(|(_, l)| l)
            .into_iter()
            .chain(self.recorded_best.filter(|l| l.is_finite()))
            .min_by(f64::total_cmp);
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
            best_loss: best,
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
        // A ring round that fell back: attribute a wrong partial sum, and keep the members
        // proved to have tampered out of the merge and the rewards.
        let round_audit = match (ring, audit) {
            (None, Some(a)) => Some(self.attribute(job, epoch, a, deltas).await),
            _ => None,
        };
        if let Some(found) = &round_audit {
            let ring_version = found.ring_version;
            for node in found.withheld() {
                for v in judged.iter_mut().filter(|v| v.node == node) {
                    v.outcome = Err(Rejection::RingWithheld { ring_version });
                }
            }
            for node in found.unbound() {
                for v in judged.iter_mut().filter(|v| v.node == node) {
                    v.outcome = Err(Rejection::RingSketch { ring_version });
                }
            }
            for node in found.guilty() {
                for v in judged.iter_mut().filter(|v| v.node == node) {
                    v.outcome = Err(Rejection::RingTamper { ring_version });
                }
            }
        }
        // Star mode (and a ring epoch that fell back to it): copies, re-uploads of the last
        // merged update and empty updates among the accepted deltas are rejected, the norm
        // average seeded in a first epoch, the suspects counted and the accepted deltas
        // merged ([`crate::epoch::star_epoch`]). Ring mode applies the same copy rules to
        // sketches and seeds with the average the members were scored against.
        let (judged, agreement, norm_average, suspect, merged, ring_merge) = match ring {
            None => {
                let policy = StarPolicy {
                    outer_lr,
                    suspect_threshold: config.suspect_threshold,
                    robust_aggregator: config.robust_aggregator,
                    robust_alone: false,
                };
                let ctx = ctx.clone();
                let star = blocking(move || star_epoch(&ctx, judged, &policy)).await?;
                (
                    star.judged,
                    (star.agreement, star.weights),
                    star.norm_average,
                    star.suspect,
                    star.merged,
                    None,
                )
            }
            Some(r) => {
                let mut judged = judged;
                let seeded = scored.as_ref().map(|s| s.norms);
                let norm_average = seed_epoch_norms(ctx.norms, seeded, &mut judged);
                let suspect = judged.iter().filter(|v| v.suspect()).count();
                let rm = self.ring_merge(r, deltas, &judged, &ctx, outer_lr).await?;
                (
                    judged,
                    (Vec::new(), Vec::new()),
                    norm_average,
                    suspect,
                    rm.0,
                    Some(rm.1),
                )
            }
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
        let mut report = EpochReport {
            kept,
            suspect,
            round_audit: round_audit.clone(),
            ..epoch_report(
                &ctx,
                deltas,
                &judged,
                (&agreement.0, &agreement.1),
                base.clone(),
                ("", loss_after, aggregator),
            )
        };
        if let Some((best_epoch, best)) = best_loss(
            self.reports
                .range(..epoch)
                .map(|(_, r)| r)
                .chain(std::iter::once(&report)),
        ) {
            report.best_loss = Some(best);
            report.best_epoch = best_epoch;
        }
        // What the job recorded, when lower (the keeper's reports start again after a
        // restart): the checkpoint of an epoch this keeper has no report of.
        if let Some(recorded) = self.recorded_best.filter(|l| l.is_finite()) {
            if report.best_loss.is_none_or(|b| recorded < b) {
                report.best_loss = Some(recorded);
                report.best_epoch = None;
            }
        }
        // The norms folded into the running average once staged: the accepted, not suspect
        // deltas (star); the merged members' (ring: exact for an upload, else the sketch's
        // estimate).
        let norms: Vec<([u8; 32], f64)> = match (ring, &ring_merge) {
            (Some(r), Some(rm)) => {
                let folded = ring_norms(r, rm, &judged, scored.as_ref(), merged.is_some());
                ring_report(&mut report, r, rm, scored.as_ref(), merged.is_some());
                folded
            }
            _ => star_norms(&judged, &agreement.0),
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
        let ring_blob = ring.and_then(|r| r.merged);
        if !ours {
            // Another staging of this epoch won (module docs of `publish::publisher`): its
            // checkpoint is the one published.
            self.adopt(job, training, deltas, ring_blob, &staged)
                .await?;
            return Ok((staged, None));
        }

        // Fold the norms into the running average, in delta-hash order so the result does
        // not depend on arrival order. Suspect deltas stay out of it, so an outsized delta
        // cannot drag the average.
        let model = self.model.as_mut().expect("loaded above");
        model.norms = fold_norms(norm_average, norms);
        model.current = next;
        model.current_ref = Some(staged.cid().to_string());
        // Convergence compares with the last delta actually merged.
        if merged.is_some() {
            model.last_merged = merged;
        }
        // Delta blobs are kept one epoch: the core records epoch e's checkpoint before
        // epoch e + 1 can end, so once e + 1 is published nothing asks for e's deltas again
        // (a publication retried after a crash is for the epoch in flight). Deltas that are
        // slashing evidence stay. A ring's merged delta goes with its epoch's deltas.
        let mut evidence: std::collections::HashSet<[u8; 32]> = deltas
            .iter()
            .zip(&judged)
            .filter(|(r, v)| v.evidence(r).is_some())
            .map(|(r, _)| r.delta_hash)
            .collect();
        // Tamper evidence is checked against every member's delta of the round.
        evidence.extend(tamper_inputs(round_audit.as_ref()));
        let this_epoch: Vec<[u8; 32]> = deltas
            .iter()
            .map(|r| r.delta_hash)
            .filter(|h| !evidence.contains(h))
            .chain(ring_blob)
            .collect();
        let previous = std::mem::replace(&mut model.collectable, this_epoch);
        if !config.retain_deltas {
            remove_blobs(&*blobs, job, previous).await;
        }
        Ok((staged, Some(Arc::from(bytes.as_ref()))))
    }

    /// Attributes a ring round that fell back to the star ([`ring_audit::attribute`]) from
    /// the round members' star uploads among `deltas` (fetched again from the blob store)
    /// and their evidence, on a blocking thread. Nothing here fails the epoch: an upload
    /// that cannot be read counts as not held.
    async fn attribute(
        &self,
        job: JobId,
        epoch: u32,
        audit: &RoundAudit,
        deltas: &[DeltaReceipt],
    ) -> RoundAuditReport {
        let blobs = self.deps.blobs.clone();
        let payloads = futures_util::future::join_all(audit.members.iter().map(|(n, _)| {
            let hash = deltas.iter().find(|r| r.node == *n).map(|r| r.delta_hash);
            let blobs = blobs.clone();
            async move { blobs.get(&hash?).await.ok().map(|b| Arc::from(b.as_ref())) }
        }))
        .await;
        let audit = audit.clone();
        let found = blocking(move || ring_audit::attribute(job.0, epoch, &audit, payloads))
            .await
            .unwrap_or_else(|e| {
                tracing::warn!(job = %job, epoch, error = %e, "ring round attribution failed");
                RoundAuditReport::default()
            });
        for t in &found.tampered {
            tracing::warn!(job = %job, epoch, node = %t.node, ring_version = t.ring_version, receiver = %t.receiver, "ring member proved to have sent a wrong partial sum: rejected and slashed");
        }
        if !found.undetermined.is_empty() {
            tracing::warn!(job = %job, epoch, members = ?found.undetermined, "ring members sent a wrong partial sum but withheld the evidence of their input: not slashed");
        }
        tracing::info!(job = %job, epoch, ring_version = found.ring_version, checked = found.checked, wrong = found.wrong, unverifiable = found.unverifiable, refused = found.refused, "ring round attributed");
        found
    }

    /// The ring branch of [`JobKeeperState::aggregate`]: fetches the round's merged delta
    /// and the uploads of the spot-checked members whose verdicts reject them (that had a
    /// weight in the round), and applies the corrected merge ([`ring_epoch`]). Nothing
    /// here fails the job: a merge that cannot be had or corrected keeps the base.
    async fn ring_merge(
        &self,
        r: &RingResult,
        deltas: &[DeltaReceipt],
        judged: &[Verdict],
        ctx: &Arc<EpochContext>,
        outer_lr: f32,
    ) -> Result<(Merged, RingMerge), CheckpointError> {
        let blobs = self.deps.blobs.clone();
        let weights: BTreeMap<NodeId, f32> = r.weights.iter().copied().collect();
        let mut rm = RingMerge {
            weights: weights.clone(),
            removed: Vec::new(),
            removed_weight: 0.0,
        };
        let base = ctx.base.clone();
        let keep = |why: String| kept_base(&base, ctx.loss_before, why);
        if !matches!(DeltaForm::of(&ctx.trainer), Ok(DeltaForm::Full)) {
            return Ok((keep(LORA_RING.into()), rm));
        }
        let Some(merged_hash) = r.merged else {
            let why = if r.excluded.is_empty() {
                "no ring member had a weight".to_string()
            } else {
                let each: Vec<String> = r
                    .excluded
                    .iter()
                    .map(|(n, why)| format!("{n}: {why}"))
                    .collect();
                format!("every ring member was excluded ({})", each.join("; "))
            };
            rm.weights.clear();
            return Ok((keep(why), rm));
        };
        let merged = match blobs.get(&merged_hash).await {
            Ok(p) => p,
            Err(e) => {
                let why = format!(
                    "the round's merged delta {} is unavailable: {e}",
                    hex::encode(merged_hash)
                );
                return Ok((keep(why), rm));
            }
        };
        // The members to take out: a weight in the round, an upload the validator rejected.
        let mut removed: Vec<(NodeId, f32, Arc<[u8]>)> = Vec::new();
        for (receipt, verdict) in deltas.iter().zip(judged) {
            let Some(&w) = weights.get(&receipt.node) else {
                continue;
            };
            let Err(why) = &verdict.outcome else { continue };
            if w == 0.0 {
                continue;
            }
            tracing::warn!(job = %receipt.job, epoch = receipt.epoch, node = %receipt.node, reason = %why, "a spot-checked ring member was rejected: taken out of the merge");
            match blobs.get(&receipt.delta_hash).await {
                Ok(p) => removed.push((receipt.node, w, p)),
                Err(e) => {
                    let why = format!(
                        "the merge cannot be corrected for {}'s rejected delta: {e}",
                        receipt.node
                    );
                    return Ok((keep(why), rm));
                }
            }
        }
        // The core has every selected member upload before the reduce; one merged without
        // its upload here was not spot-checked (logged: its share cannot be judged).
        let commits: BTreeMap<NodeId, &Commit> = r.commits.iter().map(|(n, c)| (*n, c)).collect();
        let rate = ctx.config.spot_check_rate;
        for (node, w) in &weights {
            let selected = commits
                .get(node)
                .is_some_and(|c| is_spot_checked(&ctx.secret, &c.hash, rate));
            if *w > 0.0 && selected && !deltas.iter().any(|d| d.node == *node) {
                tracing::warn!(job = ctx.job, epoch = ctx.epoch, node = %node, "a spot-check-selected ring member was merged without its upload");
            }
        }
        rm.removed = removed.iter().map(|(n, ..)| *n).collect();
        rm.removed_weight = removed.iter().map(|(_, w, _)| f64::from(*w)).sum();
        let kept_left = weights
            .iter()
            .any(|(n, w)| *w > 0.0 && !rm.removed.contains(n));
        if !kept_left {
            return Ok((keep("every member of the round was rejected".into()), rm));
        }
        let denominator = 1.0 - rm.removed_weight;
        for (n, w) in rm.weights.iter_mut() {
            *w = if rm.removed.contains(n) {
                0.0
            } else {
                (f64::from(*w) / denominator) as f32
            };
        }
        let ctx = ctx.clone();
        let merged = blocking(move || {
            let removed: Vec<(NodeId, f32, &[u8])> =
                removed.iter().map(|(n, w, p)| (*n, *w, &p[..])).collect();
            ring_epoch(
                &ctx.base,
                &ctx.trainer,
                (ctx.loss_before, ctx.best_loss),
                outer_lr,
                &merged,
                &removed,
            )
        })
        .await?;
        Ok((merged, rm))
    }

    /// Pays the epoch's rewards and slashes its evidence on the ledger (paper §8): the
    /// pool is split by the shares of [`reward_shares`] (each accepted star delta by
    /// [`Merit::weight`], in a kept star epoch only those that lowered the loss on their
    /// own; ring members by merge weight); each failed spot-check slashes
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
        {
            for (node, score) in reward_shares(report) {
                // Stake and penalty are checked again each epoch: an operator that
                // unstaked below the minimum, or was slashed, is not paid for it (one
                // `standing` read: on the EVM chain one `nodeStake` call).
                let facts = async {
                    let s = econ.ledger.standing(&node).await?;
                    Ok::<_, ChainError>((s.stake, s.penalty_until))
                };
                match tokio::time::timeout_at(deadline, facts).await {
                    Ok(Ok((stake, _))) if stake < econ.min_stake => {
                        tracing::warn!(job = %job, epoch = report.epoch, node = %node, stake_wei = %stake.0, "stake below the minimum: its reward share is withheld");
                    }
                    Ok(Ok((_, Some(until)))) if until > self.deps.publication.clock.now() => {
                        tracing::warn!(job = %job, epoch = report.epoch, node = %node, penalty_until_ms = until.0, "under a slashing penalty: its reward share is withheld");
                    }
                    Ok(Ok(_)) => shares.push((node, score)),
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
        let tampered = report.round_audit.iter().flat_map(|a| &a.tampered);
        let evidences: Vec<(String, Vec<u8>)> = report
            .slashes
            .iter()
            .map(|e| (e.node.clone(), e.canonical_bytes()))
            .chain(tampered.map(|t| (t.node.clone(), t.canonical_bytes())))
            .collect();
        for (hex_node, bytes) in &evidences {
            let Some(node) = node_of(hex_node) else {
                continue;
            };
            let call = econ.ledger.slash(&node, econ.slash_pct, bytes);
            match tokio::time::timeout_at(deadline, call).await {
                Ok(Ok(r)) => {
                    if !r.duplicate {
                        self.deps.metrics.incr(Counter::Slashes, "applied", 1);
                    }
                    report.slashed.push(SlashLine {
                        node: hex_node.clone(),
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
                    tracing::warn!(job = %job, epoch = report.epoch, node = %hex_node, error = %e, "slash refused for good; not retried");
                    self.deps.metrics.incr(Counter::Slashes, "refused", 1);
                }
                Ok(Err(e)) => errors.push(format!("slashing {}: {e}", hex_node)),
                Err(_) => errors.push(bounded(format!("slashing {}", hex_node))),
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
                let why = || failed(format!("the job's model keeper could not start: {e}"));
                match msg {
                    JobKeeperMsg::Publish { reply, .. } => {
                        let _ = reply.send(Err(why()));
                    }
                    JobKeeperMsg::RingScore { reply, .. } => {
                        let _ = reply.send(Err(why()));
                    }
                    JobKeeperMsg::Retry | JobKeeperMsg::Crash => {}
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
                ring,
                audit,
                best_loss,
                reply,
            } => {
                let msg = JobKeeperMsg::Publish {
                    epoch,
                    spec,
                    base,
                    deltas,
                    ring,
                    audit,
                    best_loss,
                    reply,
                };
                state.forward(&myself, job, msg).await;
            }
            KeeperMsg::RingScore {
                job,
                request,
                reply,
            } => {
                let msg = JobKeeperMsg::RingScore { request, reply };
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
            ring_scored: None,
            recorded_best: None,
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
                ring,
                audit,
                best_loss,
                reply,
            } => {
                let job = state.job;
                state.recorded_best = best_loss;
                let rounds = (ring.map(|r| *r), audit.map(|a| *a));
                let result = state.publish(job, epoch, *spec, base, deltas, rounds).await;
                if let Err(e) = &result {
                    tracing::warn!(job = %job, epoch, error = %e, "aggregation failed");
                }
                let _ = reply.send(result);
            }
            JobKeeperMsg::RingScore { request, reply } => {
                let (job, epoch) = (state.job, request.epoch);
                let result = state.ring_score(*request).await;
                if let Err(e) = &result {
                    tracing::warn!(job = %job, epoch, error = %e, "ring scoring refused");
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
    /// The spot-check rate ([`ValidationConfig::spot_check_rate`]), for
    /// [`CheckpointSink::ring_selected`].
    spot_check_rate: f64,
    /// Where the rounds' results are ([`CheckpointSink::ring_check`]).
    blobs: Arc<dyn BlobStore>,
    /// The jobs' models ([`CheckpointSink::ring_check`]).
    catalog: Arc<ModelCatalog>,
}

impl std::fmt::Debug for KeeperMsg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KeeperMsg::Publish { .. } => "Publish",
            KeeperMsg::RingScore { .. } => "RingScore",
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
                blobs: blobs.clone(),
                catalog: catalog.clone(),
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
        Ok(TrainingSink {
            keeper,
            pool,
            seed,
            spot_check_rate: config.validation.spot_check_rate,
            blobs,
            catalog,
        })
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
            ring: input.ring.map(|r| Box::new(r.clone())),
            audit: input.audit.map(|a| Box::new(a.clone())),
            best_loss: input.best_loss,
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

    /// The epoch's two seeds from its spot-check secret ([`EpochSecret::derive`]):
    /// [`round::epoch_seed`] for [`SeedPurpose::Score`] and [`SeedPurpose::Check`], and
    /// their SHA-256 commitments ([`round::seed_commitment`]).
    fn ring_seeds(&self, job: JobId, epoch: u32) -> Option<RingSeeds> {
        let secret = EpochSecret::derive(&self.seed, job.0, epoch);
        let score = round::epoch_seed(secret.as_bytes(), SeedPurpose::Score);
        let check = round::epoch_seed(secret.as_bytes(), SeedPurpose::Check);
        Some(RingSeeds {
            score,
            check,
            score_commitment: round::seed_commitment(&score),
            check_commitment: round::seed_commitment(&check),
        })
    }

    /// Star mode's commit–reveal selection ([`is_spot_checked`]) at the configured rate.
    fn ring_selected(&self, job: JobId, epoch: u32, delta_hash: &[u8; 32]) -> bool {
        let secret = EpochSecret::derive(&self.seed, job.0, epoch);
        is_spot_checked(&secret, delta_hash, self.spot_check_rate)
    }

    /// The post-reduce audit: [`is_spot_checked`] at the spot-check rate under the secret
    /// [`round::epoch_seed`]`(spot-check secret, Audit)`, so the sample is independent of
    /// the spot-check's and recomputable by anyone once the epoch's secret is revealed.
    fn ring_audited(&self, job: JobId, epoch: u32, delta_hash: &[u8; 32]) -> bool {
        let secret = EpochSecret::derive(&self.seed, job.0, epoch);
        let audit = round::epoch_seed(secret.as_bytes(), SeedPurpose::Audit);
        is_spot_checked(
            &EpochSecret::from_bytes(audit),
            delta_hash,
            self.spot_check_rate,
        )
    }

    /// Scores the members' sketches in the job's keeper ([`score_sketches`] against the
    /// job's norm average and its last merged delta sketched under the scoring seed).
    /// Every member gets a weight (0 when excluded, with the reason); when the scoring
    /// excluded them all, every weight is 0 (the epoch keeps its base).
    ///
    /// Errors: a LoRA job (a ring would sum the adapters' factors, not their updates); more
    /// than [`SinkConfig::suspect_threshold`] of the members excluded (star mode judges
    /// every delta in full, measures its agreement and can fall back to the coordinate
    /// median, which a ring cannot compute: the core falls back to the star for the
    /// epoch); inputs that cannot be scored; a keeper that did not answer.
    async fn ring_score(&self, input: RingScoreInput<'_>) -> Result<RingScores, CheckpointError> {
        let mut held = Vec::with_capacity(input.uploaded.len());
        for (node, hash) in input.uploaded {
            let bytes = self.blobs.get(hash).await.map_err(|e| {
                failed(format!(
                    "the delta of {node} the orchestrator holds cannot be read: {e}"
                ))
            })?;
            held.push((*node, bytes));
        }
        let request = Box::new(RingScoreRequest {
            epoch: input.epoch,
            spec: input.spec.clone(),
            base: input.base.map(str::to_string),
            seed: input.seed,
            members: input.members.to_vec(),
            held,
        });
        let job = input.job;
        match self
            .keeper
            .call(
                |reply| KeeperMsg::RingScore {
                    job,
                    request,
                    reply,
                },
                None,
            )
            .await
        {
            Ok(ractor::rpc::CallResult::Success(r)) => r,
            Ok(_) => Err(failed(
                "the job's model keeper did not answer the ring scoring",
            )),
            Err(e) => Err(failed(format!("the model keeper is gone: {e}"))),
        }
    }

    /// Sketches the uploaded result (the blob `input.result`) under the check seed with
    /// the members' row count ([`round::sketch_delta`]) and compares it with `Σ wᵢ·Sᵢ`
    /// ([`check_reduction`], its rounding tolerance): `Ok(Err(why))` when a row is off, the
    /// result does not fit the job's model, a member's sketch is refused, or a held delta's
    /// (spot-checked or audited) check or scoring sketch is not the sketch of its bytes.
    ///
    /// Errors: the blob is missing or is not an HZDL delta; the job's model is unknown.
    async fn ring_check(
        &self,
        input: RingCheckInput<'_>,
    ) -> Result<Result<(), CheckRefusal>, CheckpointError> {
        let payload = self.blobs.get(&input.result).await.map_err(|e| {
            failed(format!(
                "the round's result {}: {e}",
                hex::encode(input.result)
            ))
        })?;
        if input.spec.training.mode == hanzod_actors::job::TrainMode::Lora {
            return Ok(Err(CheckRefusal::from(LORA_RING.to_string())));
        }
        let model = self
            .catalog
            .check_training(&input.spec.training)
            .map_err(failed)?;
        let members: Vec<(NodeId, f32, Sketch)> = input
            .members
            .iter()
            .map(|(n, w, s)| (*n, *w, sketch_of(s)))
            .collect();
        // The deltas the orchestrator holds bind their members' check sketches.
        let mut held = Vec::with_capacity(input.uploaded.len());
        for (node, hash) in input.uploaded {
            match self.blobs.get(hash).await {
                Ok(bytes) => held.push((*node, bytes)),
                Err(e) => {
                    return Ok(Err(CheckRefusal::from(format!(
                        "the delta of {node} the orchestrator holds cannot be read: {e}"
                    ))))
                }
            }
        }
        let (seed, score_seed) = (input.seed, input.score_seed);
        let scoring: Vec<(NodeId, Sketch)> = input
            .scoring
            .iter()
            .map(|(n, s)| (*n, sketch_of(s)))
            .collect();
        blocking(move || {
            let claimed = members.iter().map(|(n, _, s)| (*n, s.clone()));
            let mut unbound = sketches_not_of_held(&held, claimed, &seed, "check");
            unbound.extend(sketches_not_of_held(
                &held,
                scoring.into_iter(),
                &score_seed,
                "scoring",
            ));
            if let Some((_, why)) = unbound.first() {
                let mut nodes: Vec<NodeId> = unbound.iter().map(|(n, _)| *n).collect();
                nodes.sort();
                nodes.dedup();
                return Ok(Err(CheckRefusal {
                    why: why.clone(),
                    unbound: nodes,
                }));
            }
            Ok(check_result(&payload, &model, &seed, &members)?.map_err(CheckRefusal::from))
        })
        .await?
    }
}

/// The members whose scoring sketch (under `seed`) is not the sketch of the delta the
/// orchestrator holds for them, with why ([`sketches_not_of_held`] for the scoring seed).
fn unbound_sketches(
    held: &[(NodeId, Arc<[u8]>)],
    members: &[(NodeId, Commit, SketchData)],
    seed: &[u8; 32],
) -> Vec<(NodeId, String)> {
    let claimed = members.iter().map(|(n, _, s)| (*n, sketch_of(s)));
    sketches_not_of_held(held, claimed, seed, "scoring")
}

/// Every member of `claimed` with a held delta (`held`: node and payload, the spot-checked
/// and audited uploads, whose hashes are their commitments) whose sketch under `seed` (with
/// the claimed row count) is not the claimed one, or whose delta cannot be sketched, with
/// why: a member that reduced or was scored on something other than its committed delta. A
/// sketch is a deterministic function of the bytes (f64 sums in a fixed order), so equality
/// is exact.
fn sketches_not_of_held(
    held: &[(NodeId, Arc<[u8]>)],
    claimed: impl Iterator<Item = (NodeId, Sketch)>,
    seed: &[u8; 32],
    which: &str,
) -> Vec<(NodeId, String)> {
    let mut out = Vec::new();
    for (node, claimed) in claimed {
        let Some((_, bytes)) = held.iter().find(|(n, _)| *n == node) else {
            continue;
        };
        let recomputed = DeltaView::parse(bytes)
            .map_err(|e| e.to_string())
            .and_then(|v| {
                round::sketch_delta(&v, seed, claimed.rows.len()).map_err(|e| e.to_string())
            });
        match recomputed {
            Ok(s) if s == claimed => {}
            Ok(_) => out.push((
                node,
                format!("the {which} sketch of {node} is not the sketch of its committed delta"),
            )),
            Err(e) => out.push((node, format!("the delta of {node} cannot be sketched: {e}"))),
        }
    }
    out
}

/// Why a LoRA job does not aggregate over a ring.
const LORA_RING: &str = "a ring sums the adapters' factors, which is not the merge of their \
                         updates ΔW = (α/r)·B·A: a LoRA epoch merges in star mode";

/// A sketch as the core carries it, as the protocol's type.
fn sketch_of(s: &SketchData) -> Sketch {
    Sketch {
        rows: s.rows.clone(),
        abs_rows: s.abs_rows.clone(),
        len: s.len,
    }
}

/// The row count most of `rows` have (ties: the larger); `None` when empty. The daemon
/// checks every sketch has the round's rows, so this is that count.
fn common_rows(rows: impl Iterator<Item = usize>) -> Option<usize> {
    let mut counts: BTreeMap<usize, usize> = BTreeMap::new();
    for r in rows {
        *counts.entry(r).or_default() += 1;
    }
    counts
        .into_iter()
        .max_by_key(|&(rows, count)| (count, rows))
        .map(|(rows, _)| rows)
}

/// The element count of `model`'s parameters (the length of its deltas' flat values).
fn element_count(model: &ModelSpec) -> u64 {
    model
        .params
        .values()
        .map(|s| hanzod_protocol::hzdl::elements(s))
        .fold(0u64, u64::saturating_add)
}

/// [`CheckpointSink::ring_check`] on the result's bytes (CPU-bound: parse, format check,
/// one sketching pass).
fn check_result(
    payload: &[u8],
    model: &ModelSpec,
    seed: &[u8; 32],
    members: &[(NodeId, f32, Sketch)],
) -> Result<Result<(), String>, CheckpointError> {
    let view = DeltaView::parse(payload)
        .map_err(|e| failed(format!("the round's result is not an HZDL delta: {e}")))?;
    if let Err(e) = check_against(&view, model) {
        return Ok(Err(format!(
            "the round's result does not fit the job's model: {e}"
        )));
    }
    let Some(rows) = common_rows(members.iter().map(|(_, _, s)| s.rows.len())) else {
        return Ok(Err("no check sketch to compare the result with".into()));
    };
    let result = match round::sketch_delta(&view, seed, rows) {
        Ok(s) => s,
        Err(e) => return Ok(Err(format!("the check sketches: {e}"))),
    };
    let refs: Vec<(f32, &Sketch)> = members.iter().map(|(_, w, s)| (*w, s)).collect();
    Ok(
        match check_reduction(&result, &refs, element_count(model)) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(m)) => Err(format!("the result is not the members' weighted sum: {m}")),
            Err(SketchError::Implausible { member }) => Err(format!(
                "the check sketch of {} claims more mass than its norm allows",
                members
                    .get(member)
                    .map_or_else(String::new, |m| m.0.to_string())
            )),
            Err(e) => Err(format!("the reduction cannot be checked: {e}")),
        },
    )
}

/// Why the sketch scoring excluded a member, in words (for the core's log and the report).
fn exclusion_text(e: &Exclusion) -> String {
    match e {
        Exclusion::Duplicate { of } => format!("its committed delta is {of}'s (a duplicate)"),
        Exclusion::Malformed(m) => format!("its sketch is malformed: {m}"),
        Exclusion::NearCopy { of, cosine, limit } => {
            format!("its delta is a near-copy of {of}'s (sketch cosine {cosine:.5} ≥ {limit})")
        }
        Exclusion::NoUpdate => "its delta is zero (no update)".into(),
        Exclusion::CopiesLastMerged { cosine, limit } => format!(
            "its delta is a copy of the last merged update (sketch cosine {cosine:.5} ≥ {limit})"
        ),
        Exclusion::NormOutlier { stability, limit } => format!(
            "its norm is at least 3× the running average (stability {stability:.3e} ≤ {limit:.3e})"
        ),
        Exclusion::Outlier { distance, limit } => {
            format!("its sketch is too far from the members' centre ({distance:.4e} > {limit:.4e})")
        }
        Exclusion::Opposed { cosine, limit } => format!(
            "its delta points against the members' centre (cosine {cosine:.3} < {limit:.3})"
        ),
    }
}

/// Scores ring members (CPU-bound): [`score_sketches`] with `members` in commitment order
/// (their index), `rows` the sketches' common row count, the last merged update (flat, in
/// the model's layout = [`round::flat_values`]' order) sketched under `seed`. `Ok(None)`:
/// every member was excluded ([`SketchScoreError::NoUsableMember`]).
///
/// Errors: the scoring's other errors (the inputs are unusable).
fn score_ring(
    members: &[(NodeId, Commit, SketchData)],
    seed: &[u8; 32],
    len: u64,
    last_merged: Option<&[f32]>,
    norms: NormTracker,
) -> Result<Option<SketchScores>, SketchScoreError> {
    let sketches: Vec<Sketch> = members.iter().map(|(_, _, s)| sketch_of(s)).collect();
    let rows = common_rows(sketches.iter().map(|s| s.rows.len())).unwrap_or(0);
    let last = last_merged
        .filter(|l| l.len() as u64 == len)
        .and_then(|l| hanzod_protocol::sketch::sketch(seed, rows, l).ok());
    let input: Vec<MemberSketch<'_>> = members
        .iter()
        .zip(&sketches)
        .enumerate()
        .map(|(i, ((node, commit, _), sketch))| MemberSketch {
            node: *node,
            commit_seq: i as u64,
            delta_hash: commit.hash,
            sketch,
        })
        .collect();
    let ctx = SketchContext {
        rows,
        len,
        last_merged: last.as_ref(),
        norms,
        config: SketchScoreConfig::default(),
    };
    match score_sketches(&input, &ctx) {
        Ok(s) => Ok(Some(s)),
        Err(SketchScoreError::NoUsableMember { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod ring_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::epoch::{merge_epoch, MergeInput};
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
            RobustAggregator::Median,
            lr,
            false,
            None,
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
        let merged = merge_epoch(
            &f.base,
            &f.trainer,
            f.loss_before,
            &inputs,
            true,
            RobustAggregator::Median,
            lr,
            false,
            None,
        );
        assert_eq!(merged.aggregator, Some("median"), "{:?}", merged.kept);
        check_lora_merge(&merged, [0.5, 0.5], lr);

        let inputs = lora_inputs([0.3, 0.7], [false, true]);
        let merged = merge_epoch(
            &f.base,
            &f.trainer,
            f.loss_before,
            &inputs,
            false,
            RobustAggregator::Median,
            lr,
            false,
            None,
        );
        assert_eq!(
            merged.aggregator,
            Some("weighted_mean"),
            "{:?}",
            merged.kept
        );
        check_lora_merge(&merged, [1.0, 0.0], lr);

        // Nothing accepted: the base is kept, with no update.
        let merged = merge_epoch(
            &f.base,
            &f.trainer,
            f.loss_before,
            &[],
            false,
            RobustAggregator::Median,
            lr,
            true,
            None,
        );
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
            RobustAggregator::Median,
            1.0,
            false,
            None,
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
