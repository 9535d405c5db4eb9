//! Ports: the traits through which the core reaches the outside world.
//!
//! The core never names a concrete client (no Redis, no HTTP, no EVM library): it talks to
//! these traits, and the daemon (`hanzod-daemon`, with `hanzod-adapters` and
//! `hanzod-pipeline`) or an embedder plugs adapters in. Each port has an in-memory
//! implementation in [`memory`]; they are the embedded defaults and the test doubles.
//!
//! | port | in-memory | real adapter |
//! |---|---|---|
//! | [`Clock`] | [`TokioClock`] (follows paused tokio time), [`SystemClock`] | — |
//! | [`StateStore`] | [`memory::MemoryStateStore`] | Valkey stream + snapshots (`hanzod_adapters::valkey`) |
//! | [`LeaderLease`] | [`memory::MemoryStateStore`] | Valkey lease + fencing token (`hanzod_adapters::valkey`) |
//! | [`ChainReader`] | [`memory::MemoryChain`] | EVM JSON-RPC, `GYMToken` (`hanzod_adapters::chain::EvmChain`) |
//! | [`Ledger`] (chain writes: rewards, slashing) | [`memory::MemoryChain`] | EVM transactions, `MiningPool` and `GYMToken` (`hanzod_adapters::chain::EvmChain`) |
//! | [`NodeLink`] | [`memory::ChannelNodeLink`] | gRPC session streams (`hanzod_daemon::grpc::sessions::GrpcNodeLink`) |
//! | [`CheckpointSink`] | [`memory::MemoryCheckpointSink`] | validate, merge, publish, settle (`hanzod_pipeline::sink::TrainingSink`) |
//! | [`Metrics`] | [`memory::MemoryMetrics`] | Prometheus registry on :9551 (`hanzod_daemon::metrics`) |

pub mod conformance;
pub mod ledger_conformance;
pub mod memory;

use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::events::{Event, Record};
use crate::job::{EpochSummary, JobSpec};
use crate::publication::{PublicationReceipt, SignedPublication};
use crate::types::{GymWei, JobId, NodeId, Timestamp};

pub use crate::aggregation::{RingResult, RoundAudit, RoundEvidence};
pub use crate::types::{DeltaReceipt, RingView};
pub use memory::TokioClock;

/// A source of wall-clock time. Every time the core reasons about comes from here, so tests
/// inject their own (DESIGN §2: time is an input).
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    /// Now, in milliseconds since the Unix epoch.
    fn now(&self) -> Timestamp;
}

/// The operating system's clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        Timestamp(ms)
    }
}

/// Errors of a [`StateStore`].
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum StoreError {
    /// The store could not be reached or timed out; the write may be retried.
    #[error("state store unavailable: {message}")]
    Unavailable {
        /// Why, in the store client's words (a foreign error the core does not know).
        message: String,
    },
    /// This writer's fencing token is no longer the leader's: it must stop writing.
    #[error("fenced: token {token} is stale (leader holds {current})")]
    Fenced {
        /// The writer's token.
        token: u64,
        /// The token of the current leader.
        current: u64,
    },
    /// A stored record could not be decoded.
    #[error("corrupt record at seq {seq}: {reason}")]
    Corrupt {
        /// Its sequence number.
        seq: u64,
        /// What was wrong.
        reason: String,
    },
}

/// A snapshot: a serialized fold of the log up to and including `seq`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Last sequence number folded into `state`.
    pub seq: u64,
    /// Opaque state bytes (JSON by convention).
    pub state: Vec<u8>,
}

/// The event log: the source of truth of the orchestrator (DESIGN §9, paper §1.1).
///
/// Appends are ordered and durable when they return; actor state is a fold over the log,
/// so a restarted actor (or a standby orchestrator) replays it and resumes.
///
/// **Fencing.** A handle made by [`StateStore::fenced`] writes under a leader's fencing
/// token (see [`LeaderLease`]): once a newer lease has been granted, every write through it
/// (appends and snapshots) is refused with [`StoreError::Fenced`] and changes nothing, so a
/// deposed leader that wakes up cannot write. A handle that is not fenced writes
/// unconditionally (a single orchestrator with no replicas).
#[async_trait]
pub trait StateStore: Send + Sync + std::fmt::Debug + 'static {
    /// Appends one event stamped `at`; returns its sequence number (1, 2, … with no gaps).
    /// Returns only once the event is durable (as durable as the implementation can be);
    /// an append retried after a lost reply is recorded once.
    ///
    /// Errors: [`StoreError::Unavailable`] (nothing or the whole event was written, and a
    /// retry is safe), [`StoreError::Fenced`] (nothing was written).
    async fn append(&self, at: Timestamp, event: Event) -> Result<u64, StoreError>;

    /// Appends like [`StateStore::append`], deduplicated by the caller's `id`: an id already
    /// recorded (within an hour at least) returns the sequence number it got and writes nothing. A
    /// caller that retries after [`StoreError::Unavailable`] passes the same id, so an
    /// attempt that landed late (a paused server runs it when it wakes) is not recorded
    /// twice; an event that may only ever be recorded once (a delta receipt) takes an id
    /// derived from its content. A repeated id is answered even when this handle has been
    /// fenced since: the event was written under a valid token.
    async fn append_once(&self, id: u128, at: Timestamp, event: Event) -> Result<u64, StoreError>;

    /// Every record with `seq > after`, in order.
    async fn read_after(&self, after: u64) -> Result<Vec<Record>, StoreError>;

    /// The last sequence number written (0 when the log is empty).
    async fn last_seq(&self) -> Result<u64, StoreError>;

    /// Stores a snapshot under `key`, replacing an older one; a snapshot older (lower
    /// `seq`) than the stored one is ignored. Fenced like [`StateStore::append`].
    async fn put_snapshot(&self, key: &str, snapshot: Snapshot) -> Result<(), StoreError>;

    /// The latest snapshot under `key`, if any.
    async fn get_snapshot(&self, key: &str) -> Result<Option<Snapshot>, StoreError>;

    /// The identity of this log (16 random bytes chosen when the log was created): node
    /// agents compare it across reconnects to tell a failover (same log, same job ids)
    /// from a fresh orchestrator (job ids restart).
    async fn log_id(&self) -> Result<[u8; 16], StoreError>;

    /// A handle to the same log whose writes carry the fencing `token`.
    fn fenced(&self, token: u64) -> std::sync::Arc<dyn StateStore>;
}

/// A held (or observed) leadership lease (DESIGN §9).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The holder: a replica id plus a per-process nonce, so a restarted replica with the
    /// same name is a new holder.
    pub holder: String,
    /// The fencing token: 1, 2, … one per acquisition, never reused.
    pub token: u64,
    /// Where the holder serves nodes (`http(s)://host:port`), for replicas and tooling.
    pub endpoint: String,
}

/// Leader election among orchestrator replicas (active–passive, DESIGN §9, paper §9.2):
/// one lease with a time to live; each acquisition draws a new fencing token, which the
/// winner then writes under ([`StateStore::fenced`]).
#[async_trait]
pub trait LeaderLease: Send + Sync + std::fmt::Debug + 'static {
    /// Takes the lease for `ttl_ms` if nobody holds it (or its holder let it expire), with
    /// a fresh fencing token. `Ok(None)` while another holder's lease is live. A candidate
    /// that already holds the lease gets it back, extended, with its token.
    async fn campaign(
        &self,
        holder: &str,
        endpoint: &str,
        ttl_ms: u64,
    ) -> Result<Option<Lease>, StoreError>;

    /// Extends `lease` by `ttl_ms`. `Ok(false)` when it is lost: another holder took it,
    /// or a newer token was granted. A lease that expired without being taken by anyone is
    /// renewed (its token is still the newest, so nothing was written by anyone else).
    async fn renew(&self, lease: &Lease, ttl_ms: u64) -> Result<bool, StoreError>;

    /// Gives `lease` up at once (clean shutdown), so a standby wins without waiting for
    /// the TTL. Does nothing when `lease` is no longer held.
    async fn resign(&self, lease: &Lease) -> Result<(), StoreError>;

    /// The live lease, if any.
    async fn leader(&self) -> Result<Option<Lease>, StoreError>;
}

/// Errors of a [`ChainReader`].
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ChainError {
    /// The chain endpoint could not be reached or timed out.
    #[error("chain unavailable: {0}")]
    Unavailable(String),
    /// The node key is not bound to an operator (`GYMToken.nodeOperator(key) == 0`).
    #[error("node {0} is not bound to an operator on chain")]
    Unbound(NodeId),
}

/// Read access to stakes and penalties on the chain (DESIGN §3, §8).
///
/// A node's stake is its operator's stake: `stakes(nodeOperator(key))`.
#[async_trait]
pub trait ChainReader: Send + Sync + std::fmt::Debug + 'static {
    /// The stake behind `node`, in GYM wei.
    async fn stake_of(&self, node: &NodeId) -> Result<GymWei, ChainError>;

    /// The end of `node`'s slashing penalty, if it was ever slashed (the caller compares it
    /// with now; on chain, `GYMToken.penaltyUntil(key)` in unix seconds, here in ms).
    async fn penalty_until(&self, node: &NodeId) -> Result<Option<Timestamp>, ChainError>;

    /// Both facts the orchestrator judges a node's standing by ([`Standing`]): its stake
    /// and its penalty, read together. Read at admission and, for every ring member, at
    /// each epoch boundary (DESIGN §3, "Standing"). The default reads
    /// [`ChainReader::stake_of`] then [`ChainReader::penalty_until`]; a chain that can
    /// answer both in one call overrides it (on the EVM chain, `GYMToken.nodeStake(key)`
    /// returns the operator, the stake and the penalty).
    ///
    /// # Errors
    /// [`ChainError::Unbound`] when the key has no operator; [`ChainError::Unavailable`]
    /// when the chain does not answer.
    async fn standing(&self, node: &NodeId) -> Result<Standing, ChainError> {
        let stake = self.stake_of(node).await?;
        let penalty_until = self.penalty_until(node).await?;
        Ok(Standing {
            stake,
            penalty_until,
        })
    }

    /// The stake of the account this ledger writes with: the orchestrator's own, in GYM
    /// wei (on chain, `GYMToken.stakes(account)`). An orchestrator must hold at least
    /// 50,000 GYM to lead, pay rewards and slash (paper §1.1).
    async fn orchestrator_stake(&self) -> Result<GymWei, ChainError>;
}

/// A node's standing on chain, as one read of [`ChainReader::standing`] gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Standing {
    /// Its operator's stake, in GYM wei.
    pub stake: GymWei,
    /// The end of its latest slashing penalty (ms since the Unix epoch), if it was ever
    /// slashed; the penalty is active while `now < penalty_until`.
    pub penalty_until: Option<Timestamp>,
}

/// Errors of a [`Ledger`]: the chain's own errors, plus requests the ledger refuses.
///
/// Kept apart from [`ChainError`] so that readers matching every [`ChainError`] variant
/// stay exhaustive; `?` converts a [`ChainError`] into [`LedgerError::Chain`].
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum LedgerError {
    /// The chain failed or refused ([`ChainError::Unavailable`], [`ChainError::Unbound`]).
    #[error(transparent)]
    Chain(#[from] ChainError),
    /// The request is malformed (a slashing percentage outside 1..=100, an amount that
    /// would overflow); nothing was written. Retrying the same request fails the same way.
    #[error("invalid ledger request: {0}")]
    Invalid(InvalidRequest),
}

/// What is wrong with a request a [`Ledger`] refused ([`LedgerError::Invalid`]).
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum InvalidRequest {
    /// A slashing percentage outside 1..=100.
    #[error("slashing percentage {pct} is outside 1..=100")]
    SlashPercentage {
        /// The percentage asked for.
        pct: u8,
    },
    /// Slashing without evidence.
    #[error("slashing evidence is empty")]
    EmptyEvidence,
    /// A reward batch whose running total no longer fits (u128 GYM wei).
    #[error("reward batch overflows at {node}")]
    RewardOverflow {
        /// The node whose amount overflowed it.
        node: NodeId,
    },
    /// The chain reverted the request as malformed.
    #[error("{message} ({revert})")]
    Reverted {
        /// What the call was and how it failed.
        message: String,
        /// The contract's revert, decoded (as the chain adapter prints it).
        revert: String,
    },
}

/// The checks every [`Ledger::slash`] makes before touching the chain: `pct` within
/// 1..=100 and non-empty evidence.
///
/// Errors: [`LedgerError::Invalid`] naming what is wrong.
pub fn check_slash(pct: u8, evidence: &[u8]) -> Result<(), LedgerError> {
    if !(1..=100).contains(&pct) {
        return Err(LedgerError::Invalid(InvalidRequest::SlashPercentage {
            pct,
        }));
    }
    if evidence.is_empty() {
        return Err(LedgerError::Invalid(InvalidRequest::EmptyEvidence));
    }
    Ok(())
}

/// The outcome of one [`Ledger::distribute_epoch_rewards`] batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RewardReceipt {
    /// The job whose epoch was paid.
    pub job: JobId,
    /// The epoch paid, 0-based.
    pub epoch: u32,
    /// The sum of `paid`, in GYM wei.
    pub total: GymWei,
    /// Each node paid and its amount in GYM wei, in the order the batch listed them.
    pub paid: Vec<(NodeId, GymWei)>,
    /// `true` when this (job, epoch) had already been paid: nothing was paid by this call
    /// and the other fields are the first batch's.
    pub duplicate: bool,
}

/// The outcome of one [`Ledger::slash`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlashReceipt {
    /// The node slashed (its operator's stake was hit).
    pub node: NodeId,
    /// The percentage of the stake removed, 1..=100.
    pub pct: u8,
    /// The amount removed, in GYM wei: `stake × pct / 100`, rounded down.
    pub slashed: GymWei,
    /// The stake left, in GYM wei.
    pub stake_after: GymWei,
    /// SHA-256 of the evidence bytes: the slash's idempotency key.
    pub evidence_hash: [u8; 32],
    /// The end of the node's active penalty after this slash.
    pub penalty_until: Timestamp,
    /// `true` when this evidence had already slashed: nothing was slashed by this call and
    /// the other fields are the first slash's.
    pub duplicate: bool,
}

/// Write access to the chain: epoch rewards and slashing (DESIGN §8, paper §8 "Reward
/// Distribution" and "Slashing").
///
/// Amounts are in GYM wei (10^-18 GYM). Rewards go to, and slashing hits, the node's
/// operator (`nodeOperator(key)`); the embedded ledger keeps both per node key.
///
/// Both writes are idempotent, so a job actor rebuilt while a write was in flight can
/// repeat it safely:
/// - rewards at most once per (job, epoch), mirroring `MiningPool.distributeEpochRewards`
///   paying an epoch once;
/// - a slash at most once per SHA-256 of its evidence, mirroring `GYMToken.slash` refusing
///   reused evidence.
///
/// A repeated call pays or slashes nothing and returns the first call's receipt with
/// `duplicate: true`, whatever its other arguments.
#[async_trait]
pub trait Ledger: ChainReader {
    /// Pays each node's operator its amount (paper §8 `distribute_rewards`, contract
    /// `MiningPool.distributeEpochRewards(epoch, workers[], amounts[])`), in GYM wei.
    ///
    /// All or nothing: if any node is unbound ([`ChainError::Unbound`]) or an amount
    /// would overflow ([`LedgerError::Invalid`]), nothing is paid and the epoch stays
    /// unpaid. A node listed twice is paid both amounts. An empty batch records the epoch
    /// as paid with a total of 0.
    ///
    /// Idempotent per (`job`, `epoch`): a second call pays nothing and returns the first
    /// receipt with `duplicate: true`.
    async fn distribute_epoch_rewards(
        &self,
        job: JobId,
        epoch: u32,
        rewards: &[(NodeId, GymWei)],
    ) -> Result<RewardReceipt, LedgerError>;

    /// Slashes `node`'s operator (paper §8 `slash_node`, contract
    /// `GYMToken.slash(node, pct, reporter, evidence)`): removes `pct` % of its current
    /// stake (rounded down, in GYM wei), records the evidence and sets an active penalty
    /// until now + the ledger's penalty window (an already later penalty is kept).
    ///
    /// `pct` outside 1..=100 and empty evidence are refused with [`LedgerError::Invalid`]; an unbound node
    /// with [`ChainError::Unbound`]. Idempotent per SHA-256(`evidence`): the same evidence
    /// never slashes twice; a repeat returns the first receipt with `duplicate: true`
    /// (evidence should therefore name the node and the offence).
    async fn slash(
        &self,
        node: &NodeId,
        pct: u8,
        evidence: &[u8],
    ) -> Result<SlashReceipt, LedgerError>;

    /// The rewards `node`'s operator has received, in GYM wei (0 when none yet);
    /// [`ChainError::Unbound`] for an unbound node that was never paid.
    async fn balance_of(&self, node: &NodeId) -> Result<GymWei, LedgerError>;

    /// Every slash applied, oldest first (none of them `duplicate`).
    async fn slashes(&self) -> Result<Vec<SlashReceipt>, LedgerError>;

    /// Every reward batch paid, oldest first (none of them `duplicate`).
    async fn reward_batches(&self) -> Result<Vec<RewardReceipt>, LedgerError>;

    /// Records a signed publication (paper §7.1 step 5, contract
    /// `MiningPool.recordPublication`), at most once per (job, epoch) of its record.
    ///
    /// The ledger stores the record and its signature as given; checking the signature is
    /// the reader's part (`hanzod verify`), against the orchestrator key it trusts.
    /// Idempotent per (job, epoch): a second call writes nothing and returns the first
    /// publication with `duplicate: true`, whatever its content.
    async fn record_publication(
        &self,
        publication: &SignedPublication,
    ) -> Result<PublicationReceipt, LedgerError>;

    /// Every publication recorded, oldest first.
    async fn publications(&self) -> Result<Vec<SignedPublication>, LedgerError>;
}

/// A command from the orchestrator to one node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum NodeCommand {
    /// You are a member of this job's ring (assignment, or a new ring version after recovery).
    /// Restart the current all-reduce round with these members.
    RingUpdate(RingView),
    /// You have been released from this job (it ended, or you were removed from its ring).
    Release {
        /// The job.
        job: JobId,
    },
    /// Measure your link to `peer` (you → `peer`) and report it in Mbit/s. Sent by the
    /// registry after a node's admission, per [`crate::ring::plan_probes`] (DESIGN §4).
    ProbeRequest {
        /// The peer to probe.
        peer: NodeId,
    },
    /// Train this epoch of a job (DESIGN §5, paper §3.1 Provisioning/Running): fetch the
    /// base checkpoint, run the recipe's local steps, upload the delta before the deadline.
    /// Sent to every ring member when the epoch starts, to members joining mid-epoch, and
    /// again periodically to members that have not delivered (a node that reconnected
    /// learns its work); a node ignores an epoch it already trained.
    EpochStart(Box<crate::job::EpochAssignment>),
    /// Ring aggregation: the revealed seed of `job`'s epoch (DESIGN §6.4): sketch your
    /// committed delta under it and send the sketch (and your delta when `upload_delta`).
    SketchRequest {
        /// The job.
        job: JobId,
        /// The epoch.
        epoch: u32,
        /// The seed.
        seed: [u8; 32],
        /// The sketch's rows.
        rows: u32,
        /// The spot-check selected you: upload your delta too.
        upload_delta: bool,
        /// `Some(version)`: the check seed of the round at that ring version; `None`: the
        /// scoring seed.
        check: Option<u64>,
    },
    /// Ring aggregation: all-reduce Σ wᵢ·δᵢ over these members now.
    ReduceStart {
        /// The job.
        job: JobId,
        /// The epoch.
        epoch: u32,
        /// The ring version the round runs on.
        version: u64,
        /// Members in ring order with their weights (the session layer adds each one's
        /// peer endpoint).
        members: Vec<(NodeId, f32)>,
        /// The round's weakest link, Mbit/s.
        bottleneck_mbps: f32,
    },
    /// Ring aggregation: upload something of the round.
    UploadRequest {
        /// The job.
        job: JobId,
        /// The epoch.
        epoch: u32,
        /// The round's ring version.
        version: u64,
        /// What.
        kind: RoundUpload,
        /// Why.
        reason: String,
    },
}

/// What a [`NodeCommand::UploadRequest`] asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RoundUpload {
    /// The member's own delta (the star fallback).
    Delta,
    /// The round's result.
    Merged,
    /// The round's evidence (the signed pieces received).
    Evidence,
}

/// Errors of a [`NodeLink`].
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum LinkError {
    /// No session is open to this node.
    #[error("no session to node {0}")]
    NotConnected(NodeId),
    /// The session exists but the command could not be delivered.
    #[error("delivery to node {node} failed: {reason}")]
    Delivery {
        /// The node.
        node: NodeId,
        /// Why.
        reason: String,
    },
}

/// The orchestrator's way of reaching nodes: one session per node (gRPC stream in the
/// daemon, a channel in tests). Sending must not block for long: implementations queue.
#[async_trait]
pub trait NodeLink: Send + Sync + std::fmt::Debug + 'static {
    /// Queues `command` for `node`.
    async fn send(&self, node: &NodeId, command: NodeCommand) -> Result<(), LinkError>;
}

/// Errors of a [`CheckpointSink`].
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum CheckpointError {
    /// Publication failed; the job fails with this reason when it cannot be retried.
    #[error("publication failed: {message}")]
    Failed {
        /// Why, in the sink's words (a sink wraps the errors of its own ports, which the
        /// core does not know).
        message: String,
    },
}

/// Turns an epoch's accepted deltas into a published checkpoint (validate, merge, publish).
///
/// The core calls it once per epoch in `Aggregating(e)` and records the returned checkpoint
/// reference (the checkpoint's IPFS CID).
///
/// Must be idempotent per (job, epoch): a job actor rebuilt while a publication was in
/// flight calls it again for the same epoch with the same deltas, and must get the same
/// reference back, not a second checkpoint. The job actor runs each call as a task of its
/// own, so the second call may come while the first still runs: an implementation either
/// serializes calls (the daemon's `TrainingSink` does) or tolerates overlapping ones.
#[async_trait]
pub trait CheckpointSink: Send + Sync + std::fmt::Debug + 'static {
    /// Validates and merges the deltas of `input.job`'s epoch `input.epoch` onto
    /// `input.base`, publishes the result; returns the new checkpoint reference and, when
    /// the sink keeps one, what the aggregation did. In ring aggregation
    /// (`input.ring` set) the merged delta is the accepted round's result, and `deltas` are
    /// the spot-checked members' uploads.
    async fn publish(&self, input: EpochInput<'_>) -> Result<PublishedEpoch, CheckpointError>;

    /// Ring aggregation (DESIGN §6.4): the epoch's seeds, `None` from a sink that does not
    /// aggregate over rings (then SubmitJob refuses ring jobs).
    fn ring_seeds(&self, job: JobId, epoch: u32) -> Option<RingSeeds> {
        let _ = (job, epoch);
        None
    }

    /// Ring aggregation: whether the commit–reveal spot-check selects the delta of hash
    /// `delta_hash` in `job`'s epoch `epoch` (the same rule as in star mode, DESIGN §6).
    fn ring_selected(&self, job: JobId, epoch: u32, delta_hash: &[u8; 32]) -> bool {
        let _ = (job, epoch, delta_hash);
        false
    }

    /// Ring aggregation, step 5: whether the post-reduce audit selects the delta of hash
    /// `delta_hash` in `job`'s epoch `epoch` (a commit–reveal sample independent of the
    /// spot-check's, DESIGN §4b): its member uploads it before the check, which recomputes
    /// its sketches from it.
    fn ring_audited(&self, job: JobId, epoch: u32, delta_hash: &[u8; 32]) -> bool {
        let _ = (job, epoch, delta_hash);
        false
    }

    /// Ring aggregation, step 3: the weights of the members from their sketches under the
    /// scoring seed (member → weight ≥ 0; 0 or absent excludes it).
    ///
    /// Errors: [`CheckpointError`] when the sketches cannot be scored at all.
    async fn ring_score(&self, input: RingScoreInput<'_>) -> Result<RingScores, CheckpointError> {
        let _ = input;
        Err(CheckpointError::Failed {
            message: "this sink does not aggregate over rings".into(),
        })
    }

    /// Ring aggregation, step 6: checks the uploaded result (the blob of hash
    /// `input.result`) against Σ wᵢ·sketchᵢ under the check seed: `Ok(Err(refusal))` when
    /// it does not match, naming the members whose sketches are proved not to be their
    /// held delta's.
    ///
    /// Errors: [`CheckpointError`] when the check could not run (the blob is missing).
    async fn ring_check(
        &self,
        input: RingCheckInput<'_>,
    ) -> Result<Result<(), CheckRefusal>, CheckpointError> {
        let _ = input;
        Err(CheckpointError::Failed {
            message: "this sink does not aggregate over rings".into(),
        })
    }
}

/// Why [`CheckpointSink::ring_check`] refused a round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckRefusal {
    /// Why, for logs and the fallback's reason.
    pub why: String,
    /// Members whose delta the orchestrator holds and whose check or scoring sketch is not
    /// the sketch of its bytes (their delta is rejected in the star fallback).
    pub unbound: Vec<NodeId>,
}

impl From<String> for CheckRefusal {
    fn from(why: String) -> CheckRefusal {
        CheckRefusal {
            why,
            unbound: Vec::new(),
        }
    }
}

impl std::fmt::Display for CheckRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.why)
    }
}

/// The two seeds of a ring-aggregation epoch (DESIGN §6.4) and their commitments
/// (SHA-256 of each), published at epoch start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingSeeds {
    /// The scoring seed, revealed after the commitments.
    pub score: [u8; 32],
    /// The check seed, revealed after every round member committed to the result.
    pub check: [u8; 32],
    /// SHA-256 of `score`.
    pub score_commitment: [u8; 32],
    /// SHA-256 of `check`.
    pub check_commitment: [u8; 32],
}

/// A member's linear sketch as the core carries it (the data of `hanzod_protocol::sketch`'s
/// `Sketch`; the daemon checked its shape and signature).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SketchData {
    /// Row sums, `k` of them.
    pub rows: Vec<f64>,
    /// Row masses (sums of absolute values), `k` of them.
    pub abs_rows: Vec<f64>,
    /// Coordinates sketched.
    pub len: u64,
}

/// What [`CheckpointSink::ring_score`] scores.
#[derive(Debug, Clone, Copy)]
pub struct RingScoreInput<'a> {
    /// The job.
    pub job: JobId,
    /// The epoch.
    pub epoch: u32,
    /// The job's spec.
    pub spec: &'a JobSpec,
    /// The checkpoint the epoch trained from.
    pub base: Option<&'a str>,
    /// The scoring seed the sketches were made under.
    pub seed: [u8; 32],
    /// Each member with its commitment and sketch, in the order the commitments were
    /// accepted (the earlier of two copies keeps its weight).
    pub members: &'a [(NodeId, crate::aggregation::Commit, SketchData)],
    /// The members whose delta the orchestrator holds (the spot-checked uploads), with its
    /// hash: their scoring sketches are recomputed from the bytes, and a member whose
    /// sketch is not its delta's is excluded.
    pub uploaded: &'a [(NodeId, [u8; 32])],
}

/// What [`CheckpointSink::ring_score`] decided.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RingScores {
    /// Member → weight (≥ 0; 0 excludes).
    pub weights: std::collections::BTreeMap<NodeId, f64>,
    /// Member → why it was excluded, for those with weight 0.
    pub excluded: std::collections::BTreeMap<NodeId, String>,
}

/// What [`CheckpointSink::ring_check`] checks.
#[derive(Debug, Clone, Copy)]
pub struct RingCheckInput<'a> {
    /// The job.
    pub job: JobId,
    /// The epoch.
    pub epoch: u32,
    /// The job's spec (its model bounds the result).
    pub spec: &'a JobSpec,
    /// SHA-256 of the uploaded result (a blob).
    pub result: [u8; 32],
    /// The check seed.
    pub seed: [u8; 32],
    /// The round's members with their weights and check sketches.
    pub members: &'a [(NodeId, f32, SketchData)],
    /// The members whose delta the orchestrator holds (the spot-checked and audited
    /// uploads), with its hash: their check sketches, and their scoring sketches in
    /// `scoring`, are recomputed from the bytes and must be equal.
    pub uploaded: &'a [(NodeId, [u8; 32])],
    /// The scoring seed.
    pub score_seed: [u8; 32],
    /// The round members' scoring sketches.
    pub scoring: &'a [(NodeId, SketchData)],
}

/// What a [`CheckpointSink`] returns for one published epoch.
#[derive(Debug, Clone, PartialEq)]
pub struct PublishedEpoch {
    /// The checkpoint reference (its CID, DESIGN §7).
    pub checkpoint: String,
    /// What the epoch's aggregation did (advanced or kept, losses, counts, rewards); `None`
    /// from a sink that does not report it. The job records it in the event log.
    pub summary: Option<EpochSummary>,
}

impl PublishedEpoch {
    /// A checkpoint reference without a summary.
    pub fn checkpoint(checkpoint: impl Into<String>) -> PublishedEpoch {
        PublishedEpoch {
            checkpoint: checkpoint.into(),
            summary: None,
        }
    }
}

/// What the core hands a [`CheckpointSink`] for one epoch.
#[derive(Debug, Clone, Copy)]
pub struct EpochInput<'a> {
    /// The job.
    pub job: JobId,
    /// The epoch being aggregated, 0-based.
    pub epoch: u32,
    /// The job's spec (its training recipe names the model and how to replay a node's steps).
    pub spec: &'a JobSpec,
    /// The checkpoint the epoch trained from ([`crate::job::Job::base_of`]): the reference
    /// published for epoch − 1; in epoch 0 the spec's `training.base`, or `None` (the
    /// recipe's initial weights).
    pub base: Option<&'a str>,
    /// The epoch's accepted receipts, one per node, in node order.
    pub deltas: &'a [DeltaReceipt],
    /// Ring aggregation: the accepted round (`None` in star aggregation and when a ring
    /// epoch fell back to the star).
    pub ring: Option<&'a RingResult>,
    /// Ring aggregation that fell back to the star after a round ran: the round and the
    /// evidence its members handed in, to attribute a wrong partial sum (`None` otherwise).
    pub audit: Option<&'a RoundAudit>,
    /// The validation loss of the job's best checkpoint before this epoch, from the job's
    /// recorded summaries ([`crate::job::best_loss_before`]; `None` before any):
    /// what the sink bounds the merge by when it holds no earlier report of its own (after
    /// a restart or a failover).
    pub best_loss: Option<f64>,
}

/// Every counter hanzod reports through [`Metrics::incr`] (DESIGN §10): an exporter
/// exposes each as `hanzod_<name>_total{<label key>="<label>"}`. A closed set: a counter
/// nobody declared cannot be reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Counter {
    /// `probe_requests{outcome}`: Link probe requests to nodes, by outcome: sent or undeliverable.
    ProbeRequests,
    /// `session_messages_out{kind}`: Messages queued to node sessions, by kind (ring_update, release, probe_request, epoch_start, sketch_request, reduce_start, upload_request) or undeliverable.
    SessionMessagesOut,
    /// `heartbeats{outcome}`: Heartbeats handled, by outcome: accepted or the refusal reason.
    Heartbeats,
    /// `registrations{outcome}`: Node registrations handled, by outcome: accepted or the refusal reason.
    Registrations,
    /// `node_failures{kind}`: Nodes declared failed, by failure kind.
    NodeFailures,
    /// `ring_changes{change}`: Ring versions recorded: formed (version 1) or reconfigured.
    RingChanges,
    /// `job_transitions{phase}`: Job state-machine transitions, by the phase entered.
    JobTransitions,
    /// `actor_restarts{actor}`: Actors rebuilt by their supervisor, by actor or subsystem.
    ActorRestarts,
    /// `rejected_messages{reason}`: Messages refused by the gRPC transport, by reason.
    RejectedMessages,
    /// `session_messages{kind}`: Messages received on node sessions, by kind.
    SessionMessages,
    /// `sessions{event}`: Node sessions opened and closed.
    Sessions,
    /// `deltas{outcome}`: Delta uploads handled, by outcome: accepted or the refusal reason.
    Deltas,
    /// `delta_bytes_received{outcome}`: Payload bytes received by delta uploads, by the upload's outcome.
    DeltaBytesReceived,
    /// `deltas_validated{outcome}`: Deltas judged at aggregation, by outcome: accepted or the rejection reason.
    DeltasValidated,
    /// `spot_checks{outcome}`: Spot-checks run (DESIGN §6), passed or failed.
    SpotChecks,
    /// `merges{aggregator}`: Epochs merged, by aggregator (weighted_mean, median) or kept.
    Merges,
    /// `rewards_milli_gym{outcome}`: Epoch rewards paid on the ledger, in thousandths of a GYM (paper §8).
    RewardsMilliGym,
    /// `slashes{outcome}`: Slashes applied on the ledger for failed spot-checks (paper §8).
    Slashes,
    /// `registry_refusals{outcome}`: Checkpoints the model registry refused (published by CID only).
    RegistryRefusals,
    /// `registry_failures{outcome}`: Publications the model registry failed transiently (retried from the journal).
    RegistryFailures,
}

impl Counter {
    /// Every counter, in declaration order.
    pub const ALL: [Counter; 20] = [
        Counter::ProbeRequests,
        Counter::SessionMessagesOut,
        Counter::Heartbeats,
        Counter::Registrations,
        Counter::NodeFailures,
        Counter::RingChanges,
        Counter::JobTransitions,
        Counter::ActorRestarts,
        Counter::RejectedMessages,
        Counter::SessionMessages,
        Counter::Sessions,
        Counter::Deltas,
        Counter::DeltaBytesReceived,
        Counter::DeltasValidated,
        Counter::SpotChecks,
        Counter::Merges,
        Counter::RewardsMilliGym,
        Counter::Slashes,
        Counter::RegistryRefusals,
        Counter::RegistryFailures,
    ];

    /// The family name, snake_case without prefix or suffix (`heartbeats`).
    pub fn name(self) -> &'static str {
        match self {
            Counter::ProbeRequests => "probe_requests",
            Counter::SessionMessagesOut => "session_messages_out",
            Counter::Heartbeats => "heartbeats",
            Counter::Registrations => "registrations",
            Counter::NodeFailures => "node_failures",
            Counter::RingChanges => "ring_changes",
            Counter::JobTransitions => "job_transitions",
            Counter::ActorRestarts => "actor_restarts",
            Counter::RejectedMessages => "rejected_messages",
            Counter::SessionMessages => "session_messages",
            Counter::Sessions => "sessions",
            Counter::Deltas => "deltas",
            Counter::DeltaBytesReceived => "delta_bytes_received",
            Counter::DeltasValidated => "deltas_validated",
            Counter::SpotChecks => "spot_checks",
            Counter::Merges => "merges",
            Counter::RewardsMilliGym => "rewards_milli_gym",
            Counter::Slashes => "slashes",
            Counter::RegistryRefusals => "registry_refusals",
            Counter::RegistryFailures => "registry_failures",
        }
    }

    /// The key of the counter's one label (`outcome`, `reason`, `kind`, …).
    pub fn label_key(self) -> &'static str {
        match self {
            Counter::ProbeRequests => "outcome",
            Counter::SessionMessagesOut => "kind",
            Counter::Heartbeats => "outcome",
            Counter::Registrations => "outcome",
            Counter::NodeFailures => "kind",
            Counter::RingChanges => "change",
            Counter::JobTransitions => "phase",
            Counter::ActorRestarts => "actor",
            Counter::RejectedMessages => "reason",
            Counter::SessionMessages => "kind",
            Counter::Sessions => "event",
            Counter::Deltas => "outcome",
            Counter::DeltaBytesReceived => "outcome",
            Counter::DeltasValidated => "outcome",
            Counter::SpotChecks => "outcome",
            Counter::Merges => "aggregator",
            Counter::RewardsMilliGym => "outcome",
            Counter::Slashes => "outcome",
            Counter::RegistryRefusals => "outcome",
            Counter::RegistryFailures => "outcome",
        }
    }

    /// The family's help text.
    pub fn help(self) -> &'static str {
        match self {
            Counter::ProbeRequests => "Link probe requests to nodes, by outcome: sent or undeliverable",
            Counter::SessionMessagesOut => "Messages queued to node sessions, by kind (ring_update, release, probe_request, epoch_start, sketch_request, reduce_start, upload_request) or undeliverable",
            Counter::Heartbeats => "Heartbeats handled, by outcome: accepted or the refusal reason",
            Counter::Registrations => "Node registrations handled, by outcome: accepted or the refusal reason",
            Counter::NodeFailures => "Nodes declared failed, by failure kind",
            Counter::RingChanges => "Ring versions recorded: formed (version 1) or reconfigured",
            Counter::JobTransitions => "Job state-machine transitions, by the phase entered",
            Counter::ActorRestarts => "Actors rebuilt by their supervisor, by actor or subsystem",
            Counter::RejectedMessages => "Messages refused by the gRPC transport, by reason",
            Counter::SessionMessages => "Messages received on node sessions, by kind",
            Counter::Sessions => "Node sessions opened and closed",
            Counter::Deltas => "Delta uploads handled, by outcome: accepted or the refusal reason",
            Counter::DeltaBytesReceived => "Payload bytes received by delta uploads, by the upload's outcome",
            Counter::DeltasValidated => "Deltas judged at aggregation, by outcome: accepted or the rejection reason",
            Counter::SpotChecks => "Spot-checks run (DESIGN §6), passed or failed",
            Counter::Merges => "Epochs merged, by aggregator (weighted_mean, median) or kept",
            Counter::RewardsMilliGym => "Epoch rewards paid on the ledger, in thousandths of a GYM (paper §8)",
            Counter::Slashes => "Slashes applied on the ledger for failed spot-checks (paper §8)",
            Counter::RegistryRefusals => "Checkpoints the model registry refused (published by CID only)",
            Counter::RegistryFailures => "Publications the model registry failed transiently (retried from the journal)",
        }
    }
}

/// Every histogram hanzod records through [`Metrics::observe`], all in seconds (DESIGN
/// §10): an exporter exposes each as `hanzod_<name>` with `_bucket`, `_sum` and `_count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Histogram {
    /// `ring_repair_seconds`: Time from the first node failure reported to the ring actor until the new ring is recorded: about the repair itself for a lone failure (applied at once), up to the coalescing window for one held by a window a previous failure opened.
    RingRepairSeconds,
    /// `heartbeat_handling_seconds`: Time the gRPC transport spends handling one heartbeat.
    HeartbeatHandlingSeconds,
    /// `publish_stage_seconds`: One epoch's publication: adding the checkpoint to the object store and staging it.
    PublishStageSeconds,
    /// `publish_push_seconds`: One epoch's publication: pinning the checkpoint and pushing the repo to the model registry.
    PublishPushSeconds,
    /// `publish_record_seconds`: One epoch's publication: recording the signed record on the ledger.
    PublishRecordSeconds,
}

impl Histogram {
    /// Every histogram, in declaration order.
    pub const ALL: [Histogram; 5] = [
        Histogram::RingRepairSeconds,
        Histogram::HeartbeatHandlingSeconds,
        Histogram::PublishStageSeconds,
        Histogram::PublishPushSeconds,
        Histogram::PublishRecordSeconds,
    ];

    /// The family name, snake_case without prefix, ending in `_seconds`.
    pub fn name(self) -> &'static str {
        match self {
            Histogram::RingRepairSeconds => "ring_repair_seconds",
            Histogram::HeartbeatHandlingSeconds => "heartbeat_handling_seconds",
            Histogram::PublishStageSeconds => "publish_stage_seconds",
            Histogram::PublishPushSeconds => "publish_push_seconds",
            Histogram::PublishRecordSeconds => "publish_record_seconds",
        }
    }

    /// The family's help text.
    pub fn help(self) -> &'static str {
        match self {
            Histogram::RingRepairSeconds => "Time from the first node failure reported to the ring actor until the new ring is recorded: the repair itself for a lone failure, up to the coalescing window more for one held by a window a previous failure opened",
            Histogram::HeartbeatHandlingSeconds => "Time the gRPC transport spends handling one heartbeat",
            Histogram::PublishStageSeconds => "One epoch's publication: adding the checkpoint to the object store and staging it",
            Histogram::PublishPushSeconds => "One epoch's publication: pinning the checkpoint and pushing the repo to the model registry",
            Histogram::PublishRecordSeconds => "One epoch's publication: recording the signed record on the ledger",
        }
    }
}

/// Where the actors report what they count and time. One instance per orchestrator (not a
/// process-global registry), so two orchestrators in one process keep separate figures.
///
/// Names are the closed sets [`Counter`] and [`Histogram`]; each counter has one label
/// value (e.g. the refusal reason). Implementations must be cheap and must not block: they
/// are called from actor handlers.
///
/// | name | label | meaning |
/// |---|---|---|
/// | `heartbeats` | `accepted` or the refusal reason | heartbeats by outcome |
/// | `registrations` | `accepted` or the refusal reason | registrations by outcome |
/// | `node_failures` | failure kind | nodes declared failed |
/// | `ring_changes` | `formed` or `reconfigured` | rings recorded |
/// | `job_transitions` | phase entered | job state machine transitions |
/// | `actor_restarts` | `node`, `job`, `ring` or the subsystem | supervisor rebuilds |
/// | `probe_requests` | `sent` or `undeliverable` | [`NodeCommand::ProbeRequest`]s queued after admissions (DESIGN §4); `undeliverable`: no session (after one retry a heartbeat interval later), delivery failed or timed out |
///
/// The daemon's deltas pipeline adds `deltas`, `delta_bytes_received`, `deltas_validated`,
/// `spot_checks`, `merges` and `actor_restarts{validator|keeper}` (see `hanzod::metrics`).
///
/// Observations (histograms): `ring_repair_seconds` (first failure reported to the ring
/// actor → new ring recorded; a failure held by an open coalescing window waits for it).
pub trait Metrics: Send + Sync + std::fmt::Debug + 'static {
    /// Adds `by` to counter `name{label}`.
    fn incr(&self, name: Counter, label: &str, by: u64);
    /// Records one sample of histogram `name`, in seconds.
    fn observe(&self, name: Histogram, value: f64);
}

/// A state store's health as its adapter sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct StoreHealth {
    /// Whether the last command reached the store.
    pub reachable: bool,
    /// Commands that failed (connection refused, timeout, pool exhausted), since start.
    pub errors_total: u64,
    /// Commands retried after a failure, since start.
    pub retries_total: u64,
    /// The last failure, if any.
    pub last_error: Option<String>,
}
