//! The messages of every supervised actor (DESIGN §2), and what their requests carry and
//! answer, in one leaf module: each actor module re-exports its own enum, and any actor may
//! address its parent, the root or (through the root) another subsystem without importing
//! that actor's module, so the actor modules form a tree (a parent spawns its children;
//! nothing imports a sibling) and the drawing of their imports has no cycle.
//!
//! ```text
//! OrchestratorMsg ── RegistryMsg ── NodeMsg
//!                 ├─ SchedulerMsg
//!                 └─ JobSupervisorMsg ── JobMsg ── RingMsg
//! ```

use std::collections::BTreeMap;

use ractor::{ActorId, RpcReplyPort};
use serde::{Deserialize, Serialize};

use crate::events::FailureKind;
use crate::job::{EpochSummary, Job, JobError, JobPhase, JobSpec, JobSpecError, NodeShortage};
use crate::node::{Heartbeat, HeartbeatError};
use crate::ports::{DeltaReceipt, PublishedEpoch, RingView, StoreError};
use crate::sched::{NodeView, PendingJob};
use crate::types::{GymWei, JobId, LinkProfile, NodeId, NodeInfo, Timestamp};

// ---- The root (`actor::orchestrator`) ----

/// One of the root's children.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Subsystem {
    /// The node registry.
    Registry,
    /// The scheduler.
    Scheduler,
    /// The job supervisor.
    Jobs,
}

/// Messages of the root: routed messages for each subsystem, and its own.
pub enum OrchestratorMsg {
    /// For the node registry.
    Registry(RegistryMsg),
    /// For the scheduler.
    Scheduler(SchedulerMsg),
    /// For the job supervisor.
    Jobs(JobSupervisorMsg),
    /// Rebuild a failed subsystem (after the backoff).
    Respawn(Subsystem),
    #[cfg(feature = "fault-injection")]
    /// Fault injection: make a subsystem panic (it is rebuilt from the log).
    InjectPanic {
        /// Which.
        which: Subsystem,
        /// Whether it was running.
        reply: ractor::RpcReplyPort<bool>,
    },
}

// ---- The node registry and its node actors (`actor::registry`) ----

/// Messages of the [`NodeRegistry`](super::registry::NodeRegistry).
pub enum RegistryMsg {
    /// Admit a node (or re-admit one already known).
    Register {
        /// What it declares.
        info: NodeInfo,
        /// The outcome.
        reply: RpcReplyPort<Result<Registration, RegisterError>>,
    },
    /// The chain facts of a registration were read: admit the node.
    Admit {
        /// What it declares.
        info: NodeInfo,
        /// Its stake, GYM wei (already checked against the minimum).
        stake: GymWei,
        /// Its active penalty, if any.
        penalty: Option<Timestamp>,
        /// The outcome.
        reply: RpcReplyPort<Result<Registration, RegisterError>>,
    },
    /// A heartbeat, forwarded to the node's actor.
    Heartbeat {
        /// The heartbeat.
        hb: Heartbeat,
        /// Accepted → heartbeat interval in ms.
        reply: RpcReplyPort<Result<u64, HeartbeatError>>,
    },
    /// The node's session closed.
    SessionClosed {
        /// The node.
        node: NodeId,
        /// Which registration session closed ([`Registration::sessions`]).
        session: u32,
    },
    /// A probe measured the link `from → to`.
    ReportLink {
        /// Sender.
        from: NodeId,
        /// Receiver.
        to: NodeId,
        /// Measured Mbit/s.
        mbps: f32,
        /// Accepted or why not.
        reply: RpcReplyPort<Result<(), RegisterError>>,
    },
    /// The standing of some nodes, read from the chain at `read_at` (a job's epoch
    /// boundary, DESIGN §3 "Standing"): the registry updates their views and records
    /// changes. Answered once applied, so that a ring reconfiguration asked for after it
    /// sees the new standing.
    StandingRead {
        /// Each node with what the chain said.
        reads: Vec<(NodeId, crate::ports::Standing)>,
        /// When it was read (ms since the Unix epoch).
        read_at: Timestamp,
        /// Acknowledged once applied.
        reply: RpcReplyPort<()>,
    },
    /// A node actor's latest liveness (the registry owns the rest of the node's view:
    /// its standing, region and VRAM).
    Status {
        /// The node.
        node: NodeId,
        /// Its uptime over the window, a fraction in [0, 1].
        uptime: f64,
        /// False once declared failed.
        alive: bool,
        /// The reporting actor: reports of a replaced (crashed) actor are ignored.
        from: ActorId,
    },
    /// A node actor declared its node failed.
    NodeDown {
        /// The node.
        node: NodeId,
        /// Why.
        kind: FailureKind,
        /// The reporting actor: reports of a replaced (crashed) actor are ignored.
        from: ActorId,
    },
    /// Every node's latest status.
    Snapshot {
        /// The views, ordered by node id.
        reply: RpcReplyPort<Vec<NodeView>>,
    },
    /// What is known about the links among `nodes`.
    Links {
        /// The nodes, in the order the answer uses.
        nodes: Vec<NodeId>,
        /// The answer.
        reply: RpcReplyPort<LinkSnapshot>,
    },
    /// Rebuild a crashed node actor (sent after the backoff).
    Respawn {
        /// The node.
        node: NodeId,
    },
    #[cfg(feature = "fault-injection")]
    /// Fault injection: panic in the registry itself (its node actors go with it).
    Panic,
    #[cfg(feature = "fault-injection")]
    /// Fault injection: make the node's actor panic. Replies whether the node exists.
    InjectPanic {
        /// The node.
        node: NodeId,
        /// Whether it was found.
        reply: RpcReplyPort<bool>,
    },
}

/// A successful registration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registration {
    /// The node.
    pub node: NodeId,
    /// Stake read from the chain, GYM wei.
    pub stake: GymWei,
    /// The heartbeat interval the node must keep, ms.
    pub heartbeat_interval_ms: u64,
    /// 1 for a first registration, more for re-registrations of the same key.
    pub sessions: u32,
}

/// Why a registration (or a report) was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum RegisterError {
    /// Stake below the minimum (paper §3.3: 10,000 GYM).
    #[error("stake {have} is below the minimum {need}")]
    InsufficientStake {
        /// The node's stake.
        have: GymWei,
        /// The minimum.
        need: GymWei,
    },
    /// The node is not known (for reports from unregistered nodes).
    #[error("node {0} is not registered")]
    UnknownNode(NodeId),
    /// The node key is not bound to an operator on chain.
    #[error("node key is not bound to an operator on chain")]
    Unbound,
    /// The chain could not be read.
    #[error("chain unavailable: {0}")]
    ChainUnavailable(String),
    /// The event could not be made durable.
    #[error("state store: {0}")]
    Store(String),
    /// A field is malformed.
    #[error("invalid {field}: {reason}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
}

impl RegisterError {
    /// A short snake_case label for metrics and logs.
    pub fn reason(&self) -> &'static str {
        match self {
            RegisterError::InsufficientStake { .. } => "insufficient_stake",
            RegisterError::UnknownNode(_) => "unknown_node",
            RegisterError::Unbound => "unbound",
            RegisterError::ChainUnavailable(_) => "chain_unavailable",
            RegisterError::Store(_) => "store",
            RegisterError::Invalid { .. } => "invalid",
        }
    }
}

impl From<StoreError> for RegisterError {
    fn from(e: StoreError) -> Self {
        RegisterError::Store(e.to_string())
    }
}

/// What the registry knows about the links among some nodes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LinkSnapshot {
    /// Declared capacities, one per requested node (default for unknown nodes).
    pub profiles: Vec<LinkProfile>,
    /// Regions, one per requested node.
    pub regions: Vec<String>,
    /// Whether each requested node is alive (unknown nodes are not).
    pub alive: Vec<bool>,
    /// Measured links as (from index, to index, Mbit/s).
    pub measured: Vec<(usize, usize, f32)>,
}

/// The standing of a job's ring members read at an epoch boundary (DESIGN §3,
/// "Standing"), one [`crate::ports::ChainReader::standing`] call per member, each bounded
/// by the call deadline.
#[derive(Debug, Clone, Default)]
pub struct StandingReads {
    /// When the reads were made (ms since the Unix epoch).
    pub read_at: Timestamp,
    /// Each member with what the chain answered.
    pub reads: Vec<(
        NodeId,
        Result<crate::ports::Standing, crate::ports::ChainError>,
    )>,
}

// ---- A node actor (`actor::node`) ----

/// Messages of a [`NodeActor`](super::node::NodeActor).
pub enum NodeMsg {
    /// A heartbeat from the node (already authenticated by the transport).
    Heartbeat {
        /// The heartbeat.
        hb: Heartbeat,
        /// Accepted → the interval the node should keep, in ms.
        reply: RpcReplyPort<Result<u64, HeartbeatError>>,
    },
    /// The node registered again (restart, reconnect, or a duplicate registration).
    Reregister {
        /// New info.
        info: NodeInfo,
        /// Acknowledged once applied.
        reply: RpcReplyPort<()>,
    },
    /// The node's session closed: fail it now rather than at the timeout.
    SessionClosed,
    /// The watchdog timer fired (there is at most one outstanding at a time).
    Watchdog,
    /// Report the uptime of the node, failed since its `failure`-th failure, and re-arm
    /// (every [`FAILED_REPORT_MS`](super::node::FAILED_REPORT_MS) while it stays failed
    /// and its uptime is above 0).
    ReportFailed {
        /// Which failure armed it.
        failure: u64,
    },
    #[cfg(feature = "fault-injection")]
    /// Fault injection: panic inside the handler (tests supervision).
    InjectPanic,
}

// ---- The scheduler (`actor::scheduler`) ----

/// Messages of the [`Scheduler`](super::scheduler::Scheduler).
pub enum SchedulerMsg {
    /// A job to place.
    Enqueue(PendingJob),
    /// Periodic matching.
    Tick,
    /// Nodes joined, failed or came back: match soon.
    NodesChanged,
    /// A job ended or was rebuilt without its nodes: free them and forget it.
    Release {
        /// The job.
        job: JobId,
    },
    /// Nodes left a job's ring: free them.
    ReleaseNodes {
        /// The job.
        job: JobId,
        /// The nodes.
        nodes: Vec<NodeId>,
    },
    /// A ring lost members: give it up to `count` eligible free nodes.
    RequestStandby {
        /// The job.
        job: JobId,
        /// How many it wants.
        count: usize,
        /// Its VRAM minimum, bytes.
        min_vram_bytes: u64,
        /// The nodes given (possibly fewer, possibly none).
        reply: RpcReplyPort<Vec<NodeId>>,
    },
    /// Why `job` finds too few nodes now ([`crate::sched::shortage`]).
    Explain {
        /// The pending job.
        job: PendingJob,
        /// What the registered nodes lack.
        reply: RpcReplyPort<NodeShortage>,
    },
    #[cfg(feature = "fault-injection")]
    /// Fault injection: panic in the scheduler.
    Panic,
    /// Current assignments and queue (observability).
    Inspect {
        /// (pending job ids, node → job).
        reply: RpcReplyPort<(Vec<JobId>, BTreeMap<NodeId, JobId>)>,
    },
}

// ---- The job supervisor (`actor::jobs`) ----

/// Messages of the [`JobSupervisor`](super::jobs::JobSupervisor).
pub enum JobSupervisorMsg {
    /// Accept a job.
    Submit {
        /// Its spec.
        spec: Box<JobSpec>,
        /// Its id, or why it was refused.
        reply: RpcReplyPort<Result<JobId, SubmitError>>,
    },
    /// The scheduler placed a job.
    Place {
        /// The job.
        job: JobId,
        /// Its nodes.
        nodes: Vec<NodeId>,
    },
    /// A node's session opened: jobs whose ring holds it resend the ring and the running
    /// epoch's assignment.
    NodeReturned {
        /// The node.
        node: NodeId,
    },
    /// A node failed: tell every live job (each checks membership).
    NodeFailed {
        /// The node.
        node: NodeId,
    },
    /// A node's delta receipt for a job's epoch.
    Delta {
        /// The receipt.
        receipt: DeltaReceipt,
        /// Accepted or why not.
        reply: RpcReplyPort<Result<(), JobRequestError>>,
    },
    /// A ring member's message for its job's ring aggregation (DESIGN §6.4).
    Round {
        /// The job.
        job: JobId,
        /// The member.
        node: NodeId,
        /// What it sent.
        msg: RoundMsg,
        /// The aggregation's step after it ([`crate::aggregation::Step::name`]), or why not.
        reply: RpcReplyPort<Result<&'static str, JobRequestError>>,
    },
    /// Cancel a job.
    Cancel {
        /// The job.
        job: JobId,
        /// Done or why not.
        reply: RpcReplyPort<Result<(), JobRequestError>>,
    },
    /// One job's view.
    Get {
        /// The job.
        job: JobId,
        /// The view or NotFound.
        reply: RpcReplyPort<Result<JobView, JobRequestError>>,
    },
    /// Every job's view, by id.
    List {
        /// The views.
        reply: RpcReplyPort<Vec<JobView>>,
    },
    /// A job's current ring.
    Ring {
        /// The job.
        job: JobId,
        /// The ring (None before it is formed) or NotFound.
        reply: RpcReplyPort<Result<Option<RingView>, JobRequestError>>,
    },
    /// A job actor reached a terminal phase and is stopping.
    Finished {
        /// Its final view.
        view: Box<JobView>,
    },
    /// Rebuild a failed job actor (after the backoff).
    Respawn {
        /// The job.
        job: JobId,
    },
    #[cfg(feature = "fault-injection")]
    /// Fault injection: panic in the job supervisor (its job actors go with it).
    Panic,
    #[cfg(feature = "fault-injection")]
    /// Fault injection: make the job's actor (`ring: false`) or its ring actor (`ring: true`)
    /// panic. Replies whether the target exists.
    InjectPanic {
        /// The job.
        job: JobId,
        /// Target the ring actor instead of the job actor.
        ring: bool,
        /// Whether the target was found.
        reply: RpcReplyPort<bool>,
    },
}

/// Why a job was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SubmitError {
    /// The spec is invalid.
    #[error("invalid job spec: {0}")]
    InvalidSpec(#[from] JobSpecError),
    /// The job could not be recorded durably.
    #[error("state store: {0}")]
    Store(String),
}

// ---- A job actor (`actor::job`) ----

/// Messages of a [`JobActor`](super::job::JobActor).
pub enum JobMsg {
    /// The scheduler placed the job on these nodes.
    Place {
        /// The nodes.
        nodes: Vec<NodeId>,
    },
    /// The ring actor recorded a new ring (formation or recovery).
    RingChanged {
        /// The ring.
        ring: RingView,
    },
    /// A node's session opened: if it is a member of this job's ring, the ring actor
    /// resends the ring and the running epoch's assignment goes out again (to members that
    /// have not delivered).
    NodeReturned {
        /// The node.
        node: NodeId,
    },
    /// A node failed somewhere; the job checks whether it is a member.
    NodeFailed {
        /// The node.
        node: NodeId,
    },
    /// A node's delta receipt.
    Delta {
        /// The receipt.
        receipt: DeltaReceipt,
        /// Accepted or why not.
        reply: RpcReplyPort<Result<(), JobRequestError>>,
    },
    /// A ring member's message for the ring aggregation (DESIGN §6.4).
    Round {
        /// The member.
        node: NodeId,
        /// What it sent.
        msg: RoundMsg,
        /// The aggregation's step after it, or why not.
        reply: RpcReplyPort<Result<&'static str, JobRequestError>>,
    },
    /// The sink scored epoch `epoch`'s sketches (answering [`crate::aggregation::Effect::Score`]).
    RoundScored {
        /// The epoch.
        epoch: u32,
        /// The weights, or why not.
        result: Result<crate::ports::RingScores, String>,
    },
    /// The sink checked a round's result (answering [`crate::aggregation::Effect::Check`]).
    RoundChecked {
        /// The epoch.
        epoch: u32,
        /// The round's ring version.
        version: u64,
        /// `Ok(Ok(()))` accepted, `Ok(Err(refusal))` refused, `Err(why)` the check could not
        /// run.
        result: Result<Result<(), crate::ports::CheckRefusal>, String>,
    },
    /// A ring-aggregation step's deadline may have passed.
    RoundTick {
        /// The epoch it was armed for.
        epoch: u32,
    },
    /// The epoch deadline armed for `epoch` passed.
    EpochDeadline {
        /// The epoch it was armed for.
        epoch: u32,
    },
    /// The pending deadline passed.
    PendingDeadline,
    /// Cancel the job.
    Cancel {
        /// Done or why not.
        reply: RpcReplyPort<Result<(), JobRequestError>>,
    },
    /// The job's view.
    Get {
        /// The view.
        reply: RpcReplyPort<Result<JobView, JobRequestError>>,
    },
    /// The job's ring.
    GetRing {
        /// The ring, None before formation.
        reply: RpcReplyPort<Result<Option<RingView>, JobRequestError>>,
    },
    /// Rebuild the ring actor (after the backoff).
    RespawnRing,
    /// Re-derive what is owed in the current phase and do it (after a rebuild, or after a
    /// write the state store refused): fail a pending job past its deadline, finish
    /// provisioning, complete an epoch that is complete or past its deadline, publish an
    /// aggregated epoch.
    Reconcile,
    /// The publication of `epoch` (run as its own task beside the actor) ended:
    /// the checkpoint's reference, or why it failed (including its deadline passing).
    Published {
        /// The epoch published.
        epoch: u32,
        /// The checkpoint reference with the epoch's summary, or the failure.
        result: Result<PublishedEpoch, PublishFailure>,
        /// The ring members' standing, read from the chain once the epoch's slashes were
        /// made (empty when the publication failed): who leaves the ring at this boundary.
        standing: StandingReads,
    },
    /// Resend the running epoch's assignment to the ring members that have not delivered
    /// (every `ring.resync_ms`: a node that reconnected, or missed the first one, learns
    /// its work).
    Reassign,
    #[cfg(feature = "fault-injection")]
    /// Fault injection: panic in this actor.
    InjectPanic,
    #[cfg(feature = "fault-injection")]
    /// Fault injection: make the ring actor panic; replies whether it exists.
    InjectRingPanic {
        /// Whether the ring actor exists.
        reply: RpcReplyPort<bool>,
    },
}

/// Why an epoch's publication task ended without a checkpoint (the job then fails with
/// [`crate::job::FailReason::PublicationFailed`], which keeps its text).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PublishFailure {
    /// The sink refused or failed.
    #[error(transparent)]
    Sink(#[from] crate::ports::CheckpointError),
    /// The sink gave no result within `publish_deadline_ms`.
    #[error("no result within publish_deadline_ms ({ms} ms)")]
    Deadline {
        /// The deadline, ms.
        ms: u64,
    },
    /// The sink panicked.
    #[error("the checkpoint sink panicked")]
    Panicked,
}

impl PublishFailure {
    /// The reason a failed job records ([`crate::job::FailReason::PublicationFailed`],
    /// whose display already says "publication failed").
    pub fn reason(&self) -> String {
        match self {
            PublishFailure::Sink(crate::ports::CheckpointError::Failed { message }) => {
                message.clone()
            }
            other => other.to_string(),
        }
    }
}

/// Why a request about a job was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum JobRequestError {
    /// No such job.
    #[error("{0} not found")]
    NotFound(JobId),
    /// The job has ended.
    #[error("{0} has ended")]
    Ended(JobId),
    /// The job's actor is being rebuilt; retry shortly.
    #[error("{0} is restarting; retry")]
    Restarting(JobId),
    /// The job is not collecting deltas now.
    #[error("job is {phase}, not running")]
    NotRunning {
        /// Its phase.
        phase: String,
    },
    /// The receipt is for another epoch.
    #[error("delta for epoch {got}, the job is in epoch {expected}")]
    WrongEpoch {
        /// The current epoch.
        expected: u32,
        /// The receipt's.
        got: u32,
    },
    /// The node is not in the job's ring.
    #[error("node {0} is not a member of the job's ring")]
    NotMember(NodeId),
    /// The node already submitted a different delta this epoch.
    #[error("node {0} already submitted a different delta this epoch")]
    Conflicting(NodeId),
    /// A ring-aggregation message for a job that aggregates in star mode (or an epoch that
    /// fell back to the star).
    #[error(
        "{0} does not aggregate over the ring in this epoch: upload the delta with UploadDelta"
    )]
    NotRing(JobId),
    /// A ring-aggregation message the epoch's aggregation is not at the step for.
    #[error("the epoch's ring aggregation is at step {at}, not {want}")]
    RoundStep {
        /// The step the message is for.
        want: &'static str,
        /// The step the aggregation is at.
        at: &'static str,
    },
    /// The state machine refused the transition.
    #[error(transparent)]
    Transition(#[from] JobError),
    /// The event could not be made durable.
    #[error("state store: {0}")]
    Store(String),
}

/// What a ring member sends for its job's ring aggregation (DESIGN §6.4), as the daemon
/// checked it (signatures, shapes, bounds).
#[derive(Debug, Clone, PartialEq)]
pub enum RoundMsg {
    /// Its commitment to its epoch delta (`CommitDelta`).
    Commit {
        /// The epoch.
        epoch: u32,
        /// The global step its local run started at.
        step: u64,
        /// What it commits to.
        commit: crate::aggregation::Commit,
        /// Its signature over the delta statement (DESIGN §6).
        signature: Vec<u8>,
    },
    /// Its sketch of its committed delta (`SubmitSketch`).
    Sketch {
        /// The epoch.
        epoch: u32,
        /// Under the check seed of the round being verified (`false`: the scoring seed).
        check: bool,
        /// The committed delta's hash the sketch is of.
        delta_hash: [u8; 32],
        /// The sketch.
        sketch: crate::ports::SketchData,
    },
    /// Its commitment to a round's result (`ReportReduction`).
    Report {
        /// The epoch.
        epoch: u32,
        /// The round's ring version.
        version: u64,
        /// SHA-256 of the result payload.
        result: [u8; 32],
    },
    /// Its upload of a round's result arrived and is stored as a blob (`UploadDelta` kind
    /// MERGED).
    Merged {
        /// The epoch.
        epoch: u32,
        /// SHA-256 of the uploaded payload.
        hash: [u8; 32],
    },
    /// Its round evidence (`SubmitEvidence`).
    Evidence {
        /// The epoch.
        epoch: u32,
        /// The round's ring version.
        version: u64,
        /// The predecessor that sent the pieces.
        sender: NodeId,
        /// Each piece: the 73-byte header followed by the sender's 64-byte signature.
        pieces: Vec<Vec<u8>>,
    },
}

impl RoundMsg {
    /// The epoch the message is for.
    pub fn epoch(&self) -> u32 {
        match self {
            RoundMsg::Commit { epoch, .. }
            | RoundMsg::Sketch { epoch, .. }
            | RoundMsg::Report { epoch, .. }
            | RoundMsg::Merged { epoch, .. }
            | RoundMsg::Evidence { epoch, .. } => *epoch,
        }
    }
}

/// A job as reported to callers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobView {
    /// The id.
    pub id: JobId,
    /// The spec's name.
    pub name: String,
    /// The phase.
    pub phase: JobPhase,
    /// Epochs the spec asks for.
    pub epochs: u32,
    /// The current ring.
    pub ring: Option<RingView>,
    /// Deltas accepted in the current epoch.
    pub deltas_this_epoch: usize,
    /// The current epoch's receipts: each node that delivered its delta this epoch, with
    /// that delta's hash (empty outside Running, and in the views of ended jobs). An upload
    /// checks it at the header, so a node that already delivered is refused before sending
    /// its data again.
    #[serde(default)]
    pub delivered: BTreeMap<NodeId, [u8; 32]>,
    /// Published checkpoint references, one per finished epoch.
    pub checkpoints: Vec<String>,
    /// What each published epoch's aggregation did, by epoch (epochs whose sink reported
    /// one).
    #[serde(default)]
    pub summaries: BTreeMap<u32, EpochSummary>,
    /// The spec as submitted (its training recipe names the model every delta is checked
    /// against).
    pub spec: JobSpec,
}

impl JobView {
    /// The view of `job` with `ring` and `deltas` receipts this epoch, without the receipts
    /// themselves (`delivered` is empty): for ended jobs, whose epoch is over.
    pub fn of(job: &Job, ring: Option<RingView>, deltas: usize) -> Self {
        JobView {
            id: job.id,
            name: job.spec.name.clone(),
            phase: job.phase.clone(),
            epochs: job.spec.epochs,
            ring,
            deltas_this_epoch: deltas,
            delivered: BTreeMap::new(),
            checkpoints: job.checkpoints.clone(),
            summaries: job.summaries.clone(),
            spec: job.spec.clone(),
        }
    }

    /// The view of `job` with `ring` and the current epoch's `receipts`.
    pub fn with_receipts(
        job: &Job,
        ring: Option<RingView>,
        receipts: &BTreeMap<NodeId, DeltaReceipt>,
    ) -> Self {
        JobView {
            delivered: receipts
                .iter()
                .map(|(node, r)| (*node, r.delta_hash))
                .collect(),
            ..JobView::of(job, ring, receipts.len())
        }
    }
}

// ---- A ring actor (`actor::ring`) ----

/// Messages of a [`RingActor`](super::ring::RingActor).
pub enum RingMsg {
    /// A member failed.
    NodeFailed {
        /// The node.
        node: NodeId,
    },
    /// A member leaves the ring though it is alive: it is out of standing (slashed, or
    /// its stake fell below the minimum) at an epoch boundary (DESIGN §3, "Standing").
    /// Applied like a failure: coalesced, then one reconfiguration with standbys.
    Leave {
        /// The node.
        node: NodeId,
    },
    /// The coalescing window closed: the failures reported within it are applied as one
    /// reconfiguration (none: nothing to do). The first failure of a window was applied
    /// when it was reported (leading edge).
    WindowClosed,
    /// Reconfigure now: the retry after a new ring could not be recorded.
    Reconfigure,
    /// Periodic resend of the current ring to its members, so a member that missed an
    /// update (hung, reconnected) converges; members ignore a version they already have.
    Resync,
    /// Resend the current ring to one member whose session just opened.
    ResyncTo {
        /// The member.
        node: NodeId,
    },
    /// The current ring.
    Get {
        /// The ring, None before formation.
        reply: RpcReplyPort<Option<RingView>>,
    },
    #[cfg(feature = "fault-injection")]
    /// Fault injection: panic in the handler.
    InjectPanic,
}
