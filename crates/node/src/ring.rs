//! Ring aggregation, the node's side (DESIGN §6.4; `node.proto`, "Ring aggregation").
//!
//! Per job-epoch in ring mode (an `EpochStart` with seed commitments) a member:
//!
//! 1. trains, keeps the HZDL payload in memory and commits to it ([`RingParticipant::commit`],
//!    `CommitDelta`: the DESIGN §6 statement without the bytes);
//! 2. answers the scoring seed's reveal with a signed sketch of the committed delta, and
//!    uploads the delta when the spot-check selected it ([`RingParticipant::on_sketch_request`]);
//! 3. all-reduces `Σ w_i · δ_i` with the other members over TCP
//!    ([`RingParticipant::on_reduce_start`], `hanzod_allreduce::round::all_reduce`), encodes
//!    the result as the f32 HZDL payload an upload of kind MERGED carries
//!    ([`hanzod_protocol::round::result_payload`]) and commits to its SHA-256
//!    (`ReportReduction`);
//! 4. answers the check seed's reveal with the committed delta's sketch under it, and uploads
//!    what it is asked for: the result (MERGED), its delta (DELTA, the star fallback) or the
//!    signed piece headers it received (EVIDENCE) ([`RingParticipant::on_upload_request`]).
//!
//! # Links
//!
//! A member connects to its successor's advertised endpoint (the one that also answers link
//! probes, `crate::probe::serve_peers`) and writes a *link preamble* ([`LINK_MAGIC`], the
//! round it is for, its id and the successor's id); the successor's listener reads it and
//! hands the stream to the round waiting for that predecessor ([`RingRouter`]). Only then
//! does the allreduce handshake (which proves both keys) start. The preamble is needed
//! because the handshake's first bytes are written only once a member holds *both* its
//! links: a listener that waited for them before handing a stream over would wait in a
//! circle. A link that arrives before its round waits (the neighbour heard `ReduceStart`
//! first) is parked for [`PARK_TIMEOUT`] (at most [`MAX_PARKED`] at once), then closed.
//!
//! # Versions and memory
//!
//! A round runs in a spawned task. A `RingUpdate` of a higher version for the job, or a
//! `ReduceStart` of a higher `ring_version`, aborts it (pieces of two versions are never
//! mixed: the handshake and every piece carry the version); a `ReduceStart` of a lower
//! version than one seen is ignored. Per job the participant holds one committed payload,
//! one f32 working vector while a round runs and one result payload, all dropped when the
//! next epoch of the job starts ([`RingParticipant::on_epoch_start`]) or the job is
//! released ([`RingParticipant::on_release`]).
//!
//! The orchestrator calls go through [`RingRpc`], so tests drive a participant without
//! gRPC.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use hanzod_actors::ports::Clock;
use hanzod_actors::types::NodeId;
use hanzod_allreduce::links::RingLinks;
use hanzod_allreduce::round::{all_reduce, RoundConfig, RoundError};
use hanzod_allreduce::schedule::weight_in_place;
use hanzod_allreduce::wire::SignedPiece;
use hanzod_proto::v1 as pb;
use hanzod_protocol::hzdl::{self, DeltaView, Statement};
use hanzod_protocol::identity::Identity;
use hanzod_protocol::round::{self as shared, SeedPurpose};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{broadcast, oneshot, watch};
use tonic::Status;

use crate::trainer::{RingFault, WorkerSession};
use crate::AgentEvent;

/// Members of a round at most (a `ReduceStart` with more is refused).
pub const MAX_MEMBERS: usize = 4096;
/// Bytes of a member's peer endpoint at most (`NodeInfo.endpoint`).
pub const MAX_ENDPOINT_BYTES: usize = 255;
/// Pieces of evidence one `RoundEvidence` carries at most: 28 672 pieces of 137 bytes
/// (3.75 MiB) fit the orchestrator's default 4 MiB message limit (`server.max_message_bytes`)
/// with room for framing (`node.proto` allows 65 536). A longer evidence keeps its first
/// pieces, the earliest steps, where a wrong piece is proved from the sender's own delta.
pub const MAX_EVIDENCE_PIECES: usize = 28_672;
/// The first bytes of a ring link, before the allreduce handshake (module docs).
pub const LINK_MAGIC: &[u8; 8] = b"HZRLINK1";
/// Bytes of a link preamble: magic, job (u64 LE), epoch (u32 LE), ring version (u64 LE),
/// sender id (32), receiver id (32).
pub const LINK_PREAMBLE_LEN: usize = 8 + 8 + 4 + 8 + 32 + 32;
/// Links parked at once at most, waiting for their round.
pub const MAX_PARKED: usize = 16;
/// How long a link that arrived before its round is kept.
pub const PARK_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the calls to the orchestrator are retried (transient failures, a session
/// being replaced), ms.
pub const RPC_RETRY_MS: u64 = 120_000;

/// Which round a ring link is for, and who sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LinkKey {
    /// The job.
    pub job: u64,
    /// The epoch.
    pub epoch: u32,
    /// The ring version of the round.
    pub ring_version: u64,
    /// The sender: the receiver's predecessor in the round.
    pub from: NodeId,
}

/// The preamble a member writes on the link to its successor `to` (module docs).
pub fn link_preamble(key: &LinkKey, to: &NodeId) -> [u8; LINK_PREAMBLE_LEN] {
    let mut b = [0u8; LINK_PREAMBLE_LEN];
    b[..8].copy_from_slice(LINK_MAGIC);
    b[8..16].copy_from_slice(&key.job.to_le_bytes());
    b[16..20].copy_from_slice(&key.epoch.to_le_bytes());
    b[20..28].copy_from_slice(&key.ring_version.to_le_bytes());
    b[28..60].copy_from_slice(key.from.as_bytes());
    b[60..92].copy_from_slice(to.as_bytes());
    b
}

/// Reads a preamble: the link's key and the receiver it names; `None` without
/// [`LINK_MAGIC`].
pub fn parse_link_preamble(b: &[u8; LINK_PREAMBLE_LEN]) -> Option<(LinkKey, NodeId)> {
    if &b[..8] != LINK_MAGIC {
        return None;
    }
    let take = |r: std::ops::Range<usize>| &b[r];
    let u64_at = |r| u64::from_le_bytes(take(r).try_into().unwrap_or([0; 8]));
    let id_at = |r| NodeId(take(r).try_into().unwrap_or([0; 32]));
    Some((
        LinkKey {
            job: u64_at(8..16),
            epoch: u32::from_le_bytes(take(16..20).try_into().unwrap_or([0; 4])),
            ring_version: u64_at(20..28),
            from: id_at(28..60),
        },
        id_at(60..92),
    ))
}

/// What became of a link offered to the router.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offered {
    /// Handed to the round waiting for it.
    Delivered,
    /// Kept for [`PARK_TIMEOUT`] until its round waits for it.
    Parked,
    /// Closed: too many parked.
    Refused,
}

/// Hands incoming ring links to the rounds waiting for them (module docs). Cheap to clone;
/// the peer listener and the participant share one.
#[derive(Debug, Clone, Default)]
pub struct RingRouter {
    inner: Arc<Mutex<RouterState>>,
}

#[derive(Debug, Default)]
struct RouterState {
    /// Per job, the one round waiting for its predecessor's link.
    waiting: HashMap<u64, (LinkKey, oneshot::Sender<TcpStream>)>,
    /// Links that arrived first, with an id for their expiry.
    parked: Vec<(u64, LinkKey, TcpStream)>,
    next_id: u64,
}

impl RingRouter {
    /// A router with nothing waiting.
    pub fn new() -> RingRouter {
        RingRouter::default()
    }

    fn state(&self) -> MutexGuard<'_, RouterState> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands `stream` (its preamble read) to the round waiting for `key`, or parks it for
    /// [`PARK_TIMEOUT`]. Must be called within a tokio runtime (parking starts a timer).
    pub fn offer(&self, key: LinkKey, stream: TcpStream) -> Offered {
        let mut st = self.state();
        if st.waiting.get(&key.job).is_some_and(|(k, _)| *k == key) {
            if let Some((_, tx)) = st.waiting.remove(&key.job) {
                match tx.send(stream) {
                    Ok(()) => return Offered::Delivered,
                    // The round is gone (aborted): its link is of no use.
                    Err(_) => return Offered::Refused,
                }
            }
        }
        if st.parked.len() >= MAX_PARKED {
            drop(stream);
            return Offered::Refused;
        }
        let id = st.next_id;
        st.next_id += 1;
        st.parked.push((id, key, stream));
        drop(st);
        let me = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(PARK_TIMEOUT).await;
            me.state().parked.retain(|(i, _, _)| *i != id);
        });
        Offered::Parked
    }

    /// Registers the round `key` waiting for its predecessor's link (replacing the job's
    /// previous wait, whose receiver then yields nothing); a parked link is handed over at
    /// once.
    pub fn expect(&self, key: LinkKey) -> oneshot::Receiver<TcpStream> {
        let (tx, rx) = oneshot::channel();
        let mut st = self.state();
        if let Some(i) = st.parked.iter().position(|(_, k, _)| *k == key) {
            let (_, _, stream) = st.parked.swap_remove(i);
            let _ = tx.send(stream);
            st.waiting.remove(&key.job);
            return rx;
        }
        st.waiting.insert(key.job, (key, tx));
        rx
    }

    /// Links parked now.
    pub fn parked(&self) -> usize {
        self.state().parked.len()
    }
}

/// Reads a link preamble from `stream` (an accepted connection whose first 8 bytes were
/// [`LINK_MAGIC`]) within `timeout` and offers the link to `router`, when it is addressed to
/// `me`. Returns what became of it, or why it was closed.
pub async fn accept_link(
    mut stream: TcpStream,
    me: NodeId,
    router: &RingRouter,
    timeout: Duration,
) -> Result<Offered, String> {
    let mut pre = [0u8; LINK_PREAMBLE_LEN];
    match tokio::time::timeout(timeout, stream.read_exact(&mut pre)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => return Err(format!("preamble: {e}")),
        Err(_) => return Err(format!("no preamble within {timeout:?}")),
    }
    let Some((key, to)) = parse_link_preamble(&pre) else {
        return Err("not a ring link".into());
    };
    if to != me {
        return Err(format!("a link for {to}, not this node"));
    }
    let _ = stream.set_nodelay(true);
    Ok(router.offer(key, stream))
}

/// The orchestrator calls of ring aggregation (`NodeService`), behind a trait so tests can
/// capture them. Implementations fill in `session` (left empty by the participant) and
/// retry what is worth retrying.
pub trait RingRpc: Send + Sync + 'static {
    /// `CommitDelta`.
    fn commit_delta(
        &self,
        m: pb::DeltaCommitment,
    ) -> impl Future<Output = Result<pb::RoundAck, Status>> + Send;
    /// `SubmitSketch`.
    fn submit_sketch(
        &self,
        m: pb::SketchSubmission,
    ) -> impl Future<Output = Result<pb::RoundAck, Status>> + Send;
    /// `ReportReduction`.
    fn report_reduction(
        &self,
        m: pb::ReductionReport,
    ) -> impl Future<Output = Result<pb::RoundAck, Status>> + Send;
    /// `SubmitEvidence`.
    fn submit_evidence(
        &self,
        m: pb::RoundEvidence,
    ) -> impl Future<Output = Result<pb::RoundAck, Status>> + Send;
    /// `UploadDelta` of `payload` with `header` and `trailer` (already signed).
    fn upload_delta(
        &self,
        header: pb::DeltaHeader,
        trailer: pb::DeltaTrailer,
        payload: Arc<[u8]>,
    ) -> impl Future<Output = Result<pb::DeltaAck, Status>> + Send;
}

/// Whether `status` is the orchestrator's refusal of a ring call because the epoch merges
/// as a star (`JobRequestError::NotRing`: FAILED_PRECONDITION "… does not aggregate over
/// the ring …"): the member uploads its delta instead.
pub fn is_not_ring(status: &Status) -> bool {
    status.code() == tonic::Code::FailedPrecondition
        && (status
            .message()
            .contains("does not aggregate over the ring")
            || status.message().contains("aggregates in star mode"))
}

/// [`RingRpc`] over the agent's live session: each call uses whichever session is live and
/// is retried on transient failures for up to [`RPC_RETRY_MS`].
#[derive(Debug, Clone)]
pub struct LiveRingRpc {
    live: watch::Receiver<Option<WorkerSession>>,
    clock: Arc<dyn Clock>,
}

impl LiveRingRpc {
    /// Calls over the sessions `live` publishes; `clock` bounds the retries.
    pub fn new(live: watch::Receiver<Option<WorkerSession>>, clock: Arc<dyn Clock>) -> Self {
        LiveRingRpc { live, clock }
    }

    async fn call<T, F, Fut>(&self, f: F) -> Result<T, Status>
    where
        F: Fn(WorkerSession) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let mut live = self.live.clone();
        let until = self.clock.now().plus_ms(RPC_RETRY_MS);
        crate::trainer::with_live_session(&mut live, &self.clock, until, f).await
    }
}

impl RingRpc for LiveRingRpc {
    async fn commit_delta(&self, m: pb::DeltaCommitment) -> Result<pb::RoundAck, Status> {
        self.call(|s| {
            let mut m = m.clone();
            async move {
                m.session = s.session.clone();
                Ok(s.client.clone().commit_delta(m).await?.into_inner())
            }
        })
        .await
    }

    async fn submit_sketch(&self, m: pb::SketchSubmission) -> Result<pb::RoundAck, Status> {
        self.call(|s| {
            let mut m = m.clone();
            async move {
                m.session = s.session.clone();
                Ok(s.client.clone().submit_sketch(m).await?.into_inner())
            }
        })
        .await
    }

    async fn report_reduction(&self, m: pb::ReductionReport) -> Result<pb::RoundAck, Status> {
        self.call(|s| {
            let mut m = m.clone();
            async move {
                m.session = s.session.clone();
                Ok(s.client.clone().report_reduction(m).await?.into_inner())
            }
        })
        .await
    }

    async fn submit_evidence(&self, m: pb::RoundEvidence) -> Result<pb::RoundAck, Status> {
        self.call(|s| {
            let mut m = m.clone();
            async move {
                m.session = s.session.clone();
                Ok(s.client.clone().submit_evidence(m).await?.into_inner())
            }
        })
        .await
    }

    async fn upload_delta(
        &self,
        header: pb::DeltaHeader,
        trailer: pb::DeltaTrailer,
        payload: Arc<[u8]>,
    ) -> Result<pb::DeltaAck, Status> {
        self.call(|s| {
            let mut header = header.clone();
            let (trailer, payload) = (trailer.clone(), payload.clone());
            async move {
                header.session = s.session.clone();
                let chunks = crate::protocol::delta_chunks(header, payload, trailer, s.chunk_bytes);
                Ok(s.client.clone().upload_delta(chunks).await?.into_inner())
            }
        })
        .await
    }
}

/// How rounds are run (the parts of [`RoundConfig`] that are the node's choice; every
/// member of a round must use the same `piece_elems`, which the handshake checks).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoundSettings {
    /// Elements (f32) per signed piece.
    pub piece_elems: u32,
    /// Outgoing pieces held at once.
    pub max_in_flight: usize,
    /// Slack factor of the per-piece deadline (`hanzod_allreduce::round::deadline_for`).
    pub deadline_slack: f64,
    /// Floor of the per-piece deadline; also bounds connecting to the successor and waiting
    /// for the predecessor's link.
    pub deadline_floor: Duration,
}

impl Default for RoundSettings {
    /// `RoundConfig::new`'s: 65,536-element pieces, 4 in flight, slack 4, floor 10 s.
    fn default() -> Self {
        let c = RoundConfig::new(0, 0, 0, Vec::new());
        RoundSettings {
            piece_elems: c.piece_elems,
            max_in_flight: c.max_in_flight,
            deadline_slack: c.deadline_slack,
            deadline_floor: c.deadline_floor,
        }
    }
}

/// Why a ring-aggregation step was refused or failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RingError {
    /// No delta committed for this job and epoch here.
    #[error("job {job}: no delta committed for epoch {epoch}")]
    NoDelta {
        /// The job.
        job: u64,
        /// The epoch asked about.
        epoch: u32,
    },
    /// The revealed seed does not hash to the epoch's commitment.
    #[error("job {job} epoch {epoch}: the revealed {} seed does not match its commitment", if *.check { "check" } else { "scoring" })]
    BadReveal {
        /// The job.
        job: u64,
        /// The epoch.
        epoch: u32,
        /// Which seed.
        check: bool,
    },
    /// A malformed or out-of-bound field of the orchestrator's message.
    #[error("{field}: {reason}")]
    BadField {
        /// The field.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// This node is not a member of the round.
    #[error("job {job}: not a member of the round at ring version {ring_version}")]
    NotMember {
        /// The job.
        job: u64,
        /// The round's version.
        ring_version: u64,
    },
    /// A message about an older ring version than one already seen (ignored).
    #[error("job {job}: ring version {got} is older than v{have}")]
    Stale {
        /// The job.
        job: u64,
        /// The version received.
        got: u64,
        /// The version held.
        have: u64,
    },
    /// No result of the round asked about is held.
    #[error("job {job} epoch {epoch}: no result of a round at ring version {ring_version}")]
    NoResult {
        /// The job.
        job: u64,
        /// The epoch.
        epoch: u32,
        /// The round asked about.
        ring_version: u64,
    },
    /// The round failed; `suspect` is the member the data plane suspects.
    #[error("round failed{}: {reason}", .suspect.map(|s| format!(" (suspect {s})")).unwrap_or_default())]
    Round {
        /// The suspected member.
        suspect: Option<NodeId>,
        /// Why.
        reason: String,
    },
    /// The round was aborted by a newer ring version (or the job ended).
    #[error("round aborted")]
    Aborted,
    /// The delta could not be read or written.
    #[error("delta: {0}")]
    Delta(String),
    /// The orchestrator refused a call (its status).
    #[error("{call}: {status}")]
    Rpc {
        /// The call.
        call: &'static str,
        /// The status, as one line.
        status: String,
    },
    /// A task of this node failed.
    #[error("internal: {0}")]
    Internal(String),
}

impl RingError {
    fn rpc(call: &'static str) -> impl FnOnce(Status) -> RingError {
        move |s| RingError::Rpc {
            call,
            status: hanzod_protocol::status::status_line(&s),
        }
    }

    fn field(field: &'static str, reason: impl Into<String>) -> RingError {
        RingError::BadField {
            field,
            reason: reason.into(),
        }
    }
}

impl From<RoundError> for RingError {
    fn from(e: RoundError) -> RingError {
        RingError::Round {
            suspect: e.suspect(),
            reason: e.to_string(),
        }
    }
}

/// A delta to commit (ring mode, step 1).
#[derive(Debug, Clone)]
pub struct CommitInput {
    /// The job.
    pub job: u64,
    /// The epoch.
    pub epoch: u32,
    /// The global step of the epoch (`epoch × local_steps`).
    pub step: u64,
    /// The claimed loss stated.
    pub claimed_loss: f64,
    /// `EpochStart.sketch_commitment` and `check_commitment`.
    pub commitments: ([u8; 32], [u8; 32]),
    /// The HZDL payload.
    pub payload: Vec<u8>,
}

/// A finished round's result, kept for the orchestrator's requests.
#[derive(Debug, Clone)]
pub struct RoundResult {
    /// The round's ring version.
    pub ring_version: u64,
    /// The result as an f32 HZDL payload (an upload of kind MERGED).
    pub payload: Arc<[u8]>,
    /// SHA-256 of `payload`: the reported result hash.
    pub hash: [u8; 32],
    /// The signed piece headers received from the predecessor.
    pub evidence: Vec<SignedPiece>,
    /// The predecessor that signed them (`None` for a lone member).
    pub evidence_signer: Option<NodeId>,
    /// Payload bytes sent to the successor.
    pub bytes_sent: u64,
    /// Payload bytes received from the predecessor.
    pub bytes_received: u64,
    /// From the links being up to the result's hash, ms.
    pub elapsed_ms: u64,
}

/// A round started by [`RingParticipant::on_reduce_start`].
#[derive(Debug)]
pub struct RoundHandle {
    join: tokio::task::JoinHandle<Result<Arc<RoundResult>, RingError>>,
}

impl RoundHandle {
    /// Waits for the round: its result (already reported), or why it failed
    /// ([`RingError::Aborted`] when a newer version replaced it).
    pub async fn outcome(self) -> Result<Arc<RoundResult>, RingError> {
        match self.join.await {
            Ok(r) => r,
            Err(e) if e.is_cancelled() => Err(RingError::Aborted),
            Err(e) => Err(RingError::Internal(format!("round task: {e}"))),
        }
    }
}

/// What a checked `ReduceStart` asks of this member.
#[derive(Debug, Clone)]
struct RoundPlan {
    job: u64,
    epoch: u32,
    ring_version: u64,
    ring: Vec<NodeId>,
    position: usize,
    weight: f32,
    successor_endpoint: String,
    link_mbps: f64,
}

struct RoundSlot {
    ring_version: u64,
    generation: u64,
    task: Option<tokio::task::AbortHandle>,
    result: Option<Arc<RoundResult>>,
    /// The round ended with an error (a `ReduceStart` of the same version restarts it).
    failed: bool,
}

struct EpochRing {
    epoch: u32,
    step: u64,
    claimed_loss: f64,
    commitments: ([u8; 32], [u8; 32]),
    delta: Arc<[u8]>,
    hash: [u8; 32],
    round: Option<RoundSlot>,
}

#[derive(Default)]
struct JobRing {
    /// The highest ring version seen (RingUpdate or ReduceStart).
    ring_version: u64,
    /// The lowest epoch still accepted (raised by a newer EpochStart).
    min_epoch: u32,
    current: Option<EpochRing>,
}

impl JobRing {
    fn abort_round(&mut self) -> Option<(u32, u64)> {
        let cur = self.current.as_mut()?;
        let slot = cur.round.as_mut()?;
        let task = slot.task.take()?;
        task.abort();
        Some((cur.epoch, slot.ring_version))
    }
}

/// A node's ring-aggregation state for every job it is in, and the handlers of the
/// orchestrator's ring messages (module docs).
pub struct RingParticipant<R> {
    identity: Identity,
    rpc: Arc<R>,
    router: RingRouter,
    fault: RingFault,
    settings: RoundSettings,
    events: broadcast::Sender<AgentEvent>,
    jobs: Mutex<HashMap<u64, JobRing>>,
    generation: std::sync::atomic::AtomicU64,
}

impl<R: RingRpc> RingParticipant<R> {
    /// A participant signing with `identity`, calling the orchestrator through `rpc`,
    /// receiving links through `router` and reporting to `events`.
    pub fn new(
        identity: Identity,
        rpc: R,
        router: RingRouter,
        fault: RingFault,
        settings: RoundSettings,
        events: broadcast::Sender<AgentEvent>,
    ) -> Arc<Self> {
        Arc::new(RingParticipant {
            identity,
            rpc: Arc::new(rpc),
            router,
            fault,
            settings,
            events,
            jobs: Mutex::new(HashMap::new()),
            generation: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// The router whose links this participant's rounds take.
    pub fn router(&self) -> &RingRouter {
        &self.router
    }

    fn jobs(&self) -> MutexGuard<'_, HashMap<u64, JobRing>> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn emit(&self, e: AgentEvent) {
        let _ = self.events.send(e);
    }

    /// The committed delta of (`job`, `epoch`): payload, hash, step, claimed loss and seed
    /// commitments.
    fn committed(&self, job: u64, epoch: u32) -> Result<Committed, RingError> {
        let jobs = self.jobs();
        let cur = jobs
            .get(&job)
            .and_then(|j| j.current.as_ref())
            .filter(|c| c.epoch == epoch)
            .ok_or(RingError::NoDelta { job, epoch })?;
        Ok(Committed {
            delta: cur.delta.clone(),
            hash: cur.hash,
            step: cur.step,
            claimed_loss: cur.claimed_loss,
            commitments: cur.commitments,
        })
    }

    /// The result of (`job`, `epoch`)'s round at `ring_version`, when finished.
    pub fn result(&self, job: u64, epoch: u32, ring_version: u64) -> Option<Arc<RoundResult>> {
        let jobs = self.jobs();
        let cur = jobs.get(&job)?.current.as_ref()?;
        let slot = cur.round.as_ref()?;
        (cur.epoch == epoch && slot.ring_version == ring_version)
            .then(|| slot.result.clone())
            .flatten()
    }

    /// An epoch of `job` started: what is held for earlier epochs is dropped (a running
    /// round aborted).
    pub fn on_epoch_start(&self, job: u64, epoch: u32) {
        let mut jobs = self.jobs();
        let j = jobs.entry(job).or_default();
        j.min_epoch = j.min_epoch.max(epoch);
        if j.current.as_ref().is_some_and(|c| c.epoch < epoch) {
            j.abort_round();
            j.current = None;
        }
    }

    /// Released from `job`: everything held for it is dropped (a running round aborted).
    pub fn on_release(&self, job: u64) {
        if let Some(mut j) = self.jobs().remove(&job) {
            j.abort_round();
        }
    }

    /// A ring version was applied for `job`: a running round of a lower version is aborted
    /// (a `ReduceStart` for the new version follows).
    pub fn on_ring_update(&self, job: u64, version: u64) {
        let aborted = {
            let mut jobs = self.jobs();
            let j = jobs.entry(job).or_default();
            if version <= j.ring_version {
                return;
            }
            j.ring_version = version;
            let running_older = j
                .current
                .as_ref()
                .and_then(|c| c.round.as_ref())
                .is_some_and(|s| s.ring_version < version && s.task.is_some());
            if running_older {
                j.abort_round()
            } else {
                None
            }
        };
        if let Some((epoch, ring_version)) = aborted {
            self.emit(AgentEvent::RoundAborted {
                job,
                epoch,
                ring_version,
                superseded_by: version,
            });
        }
    }

    /// Step 1: keeps `input`'s payload (dropping what was held for earlier epochs of the
    /// job) and commits to it (`CommitDelta`, the DESIGN §6 statement).
    ///
    /// Errors: [`RingError::Delta`] for a payload that does not parse, [`RingError::Stale`]
    /// for an epoch older than one started, [`RingError::Rpc`].
    pub async fn commit(&self, input: CommitInput) -> Result<[u8; 32], RingError> {
        DeltaView::parse(&input.payload).map_err(|e| RingError::Delta(e.to_string()))?;
        let hash = hzdl::payload_hash(&input.payload);
        let bytes = input.payload.len();
        let statement = Statement {
            job: input.job,
            epoch: input.epoch,
            step: input.step,
            claimed_loss: input.claimed_loss,
        };
        {
            let mut jobs = self.jobs();
            let j = jobs.entry(input.job).or_default();
            if input.epoch < j.min_epoch
                || j.current.as_ref().is_some_and(|c| c.epoch > input.epoch)
            {
                return Err(RingError::Stale {
                    job: input.job,
                    got: u64::from(input.epoch),
                    have: u64::from(j.min_epoch),
                });
            }
            j.min_epoch = input.epoch;
            if j.current
                .as_ref()
                .is_some_and(|c| c.epoch == input.epoch && c.hash == hash)
            {
                // The same delta again (a retry): keep the round state.
            } else {
                j.abort_round();
                j.current = Some(EpochRing {
                    epoch: input.epoch,
                    step: input.step,
                    claimed_loss: input.claimed_loss,
                    commitments: input.commitments,
                    delta: Arc::from(input.payload),
                    hash,
                    round: None,
                });
            }
        }
        let signature = hzdl::sign_statement(&self.identity, &statement, &hash);
        let committed = self
            .rpc
            .commit_delta(pb::DeltaCommitment {
                session: Vec::new(),
                job_id: input.job,
                epoch: input.epoch,
                step: input.step,
                claimed_loss: input.claimed_loss,
                total_bytes: bytes as u64,
                sha256: hash.to_vec(),
                signature: signature.to_vec(),
            })
            .await;
        match committed {
            Ok(_) => {}
            // The orchestrator merges this epoch as a star (it lost the round, or cannot
            // aggregate over rings): upload the delta kept above instead.
            Err(s) if is_not_ring(&s) => {
                self.upload_own(input.job, input.epoch, None).await?;
                return Ok(hash);
            }
            Err(s) => return Err(RingError::rpc("CommitDelta")(s)),
        }
        self.emit(AgentEvent::DeltaCommitted {
            job: input.job,
            epoch: input.epoch,
            delta_hash: hex::encode(hash),
            bytes,
            claimed_loss: input.claimed_loss,
        });
        Ok(hash)
    }

    /// Steps 2 and 4: checks the revealed seed against the epoch's commitment (refused
    /// otherwise), sketches the committed delta under it (`req.rows` rows), signs and
    /// submits the sketch; with `upload_delta` (the spot-check under the scoring seed, the
    /// post-reduce audit under the check seed) also uploads the delta (kind DELTA).
    ///
    /// Errors: [`RingError::NoDelta`], [`RingError::BadReveal`], [`RingError::BadField`]
    /// (`rows`), [`RingError::Rpc`].
    pub async fn on_sketch_request(&self, req: pb::SketchRequest) -> Result<(), RingError> {
        let (job, epoch) = (req.job_id, req.epoch);
        let c = self.committed(job, epoch)?;
        let purpose = SeedPurpose::from_check(req.check);
        let commitment = if req.check {
            c.commitments.1
        } else {
            c.commitments.0
        };
        let seed = shared::check_reveal(&commitment, &req.seed).ok_or(RingError::BadReveal {
            job,
            epoch,
            check: req.check,
        })?;
        let rows = req.rows as usize;
        let delta = c.delta.clone();
        let fault = self.fault;
        let sketch = tokio::task::spawn_blocking(move || {
            let view = DeltaView::parse(&delta).map_err(|e| RingError::Delta(e.to_string()))?;
            let sketch = match fault {
                // Sketches what it reduces, not what it committed to.
                RingFault::Substitute { perturbation } => {
                    let mut values = shared::flat_values(&view);
                    values.iter_mut().for_each(|x| *x += perturbation);
                    hanzod_protocol::sketch::Sketcher::new(&seed, rows).map(|mut s| {
                        s.update(&values);
                        s.finish()
                    })
                }
                _ => shared::sketch_delta(&view, &seed, rows),
            };
            sketch.map_err(|e| RingError::field("rows", e.to_string()))
        })
        .await
        .map_err(|e| RingError::Internal(format!("sketch task: {e}")))??;
        let digest = shared::sketch_digest(job, epoch, purpose, &c.hash, &sketch);
        let signature = shared::sign_digest(&self.identity, &digest);
        self.rpc
            .submit_sketch(pb::SketchSubmission {
                session: Vec::new(),
                job_id: job,
                epoch,
                sha256: c.hash.to_vec(),
                sketch: Some(shared::sketch_to_wire(&sketch)),
                signature: signature.to_vec(),
                check: req.check,
            })
            .await
            .map_err(RingError::rpc("SubmitSketch"))?;
        // Uploaded for the spot-check (scoring seed) or the post-reduce audit (check seed).
        let upload = req.upload_delta;
        self.emit(AgentEvent::SketchSubmitted {
            job,
            epoch,
            check: req.check,
            rows: req.rows,
            delta_upload: upload,
        });
        if upload {
            self.upload_own(job, epoch, None).await?;
        }
        Ok(())
    }

    /// Uploads the committed delta of (`job`, `epoch`) (kind DELTA, its statement).
    async fn upload_own(
        &self,
        job: u64,
        epoch: u32,
        ring_version: Option<u64>,
    ) -> Result<(), RingError> {
        let c = self.committed(job, epoch)?;
        let statement = Statement {
            job,
            epoch,
            step: c.step,
            claimed_loss: c.claimed_loss,
        };
        let (header, trailer) =
            crate::protocol::delta_upload_parts(&[], &self.identity, &statement, &c.delta);
        let started = Instant::now();
        match self
            .rpc
            .upload_delta(header, trailer, c.delta.clone())
            .await
        {
            Ok(_) => {}
            // Delivered before (a retry after a lost ack): the daemon names the hash.
            Err(s)
                if s.code() == tonic::Code::AlreadyExists
                    && s.message().contains(&hex::encode(c.hash)) => {}
            Err(s) => return Err(RingError::rpc("UploadDelta")(s)),
        }
        self.emit(AgentEvent::RingUploaded {
            job,
            epoch,
            ring_version: ring_version.unwrap_or(0),
            kind: "delta".into(),
            hash: hex::encode(c.hash),
            bytes: c.delta.len(),
            upload_ms: started.elapsed().as_millis() as u64,
        });
        Ok(())
    }

    /// Step 4 (and the fallback): uploads what `req` asks for: the round's result (MERGED:
    /// claimed loss 0, the trailer signed over the merged statement), the committed delta
    /// (DELTA) or the round's evidence (EVIDENCE, `SubmitEvidence`).
    ///
    /// Errors: [`RingError::BadField`] (`kind`), [`RingError::NoDelta`],
    /// [`RingError::NoResult`], [`RingError::Rpc`].
    pub async fn on_upload_request(&self, req: pb::UploadRequest) -> Result<(), RingError> {
        use pb::upload_request::Kind;
        let (job, epoch, version) = (req.job_id, req.epoch, req.ring_version);
        let kind = Kind::try_from(req.kind)
            .ok()
            .filter(|k| *k != Kind::Unspecified)
            .ok_or_else(|| RingError::field("kind", format!("unknown kind {}", req.kind)))?;
        if kind == Kind::Delta {
            return self.upload_own(job, epoch, Some(version)).await;
        }
        let c = self.committed(job, epoch)?;
        let result = self
            .result(job, epoch, version)
            .ok_or(RingError::NoResult {
                job,
                epoch,
                ring_version: version,
            })?;
        if kind == Kind::Evidence {
            let mut pieces: Vec<Vec<u8>> = result
                .evidence
                .iter()
                .take(MAX_EVIDENCE_PIECES)
                .map(|p| p.to_bytes().to_vec())
                .collect();
            if result.evidence.len() > MAX_EVIDENCE_PIECES {
                tracing::warn!(
                    job,
                    epoch,
                    held = result.evidence.len(),
                    "round evidence cut to {MAX_EVIDENCE_PIECES} pieces"
                );
            }
            pieces.shrink_to_fit();
            let n = pieces.len();
            let sender = result
                .evidence_signer
                .unwrap_or_else(|| self.identity.node_id());
            self.rpc
                .submit_evidence(pb::RoundEvidence {
                    session: Vec::new(),
                    job_id: job,
                    epoch,
                    ring_version: version,
                    sender: sender.0.to_vec(),
                    pieces,
                })
                .await
                .map_err(RingError::rpc("SubmitEvidence"))?;
            self.emit(AgentEvent::EvidenceSubmitted {
                job,
                epoch,
                ring_version: version,
                pieces: n,
            });
            return Ok(());
        }
        let header = pb::DeltaHeader {
            session: Vec::new(),
            job_id: job,
            epoch,
            step: c.step,
            claimed_loss: 0.0,
            total_bytes: result.payload.len() as u64,
            kind: pb::DeltaKind::Merged as i32,
        };
        let digest = shared::merged_digest(job, epoch, &result.hash);
        let trailer = pb::DeltaTrailer {
            sha256: result.hash.to_vec(),
            signature: shared::sign_digest(&self.identity, &digest).to_vec(),
        };
        let started = Instant::now();
        self.rpc
            .upload_delta(header, trailer, result.payload.clone())
            .await
            .map_err(RingError::rpc("UploadDelta"))?;
        self.emit(AgentEvent::RingUploaded {
            job,
            epoch,
            ring_version: version,
            kind: "merged".into(),
            hash: hex::encode(result.hash),
            bytes: result.payload.len(),
            upload_ms: started.elapsed().as_millis() as u64,
        });
        Ok(())
    }

    /// Step 3: checks `rs` (members ≤ [`MAX_MEMBERS`], distinct 32-byte ids, weights finite
    /// in [0, 1], endpoints ≤ [`MAX_ENDPOINT_BYTES`], this node among them), aborts a
    /// running round of a lower version and starts the round in a spawned task. Returns
    /// `None` for a repeat of the round already started (nothing to do).
    ///
    /// Errors: [`RingError::Stale`] (a version lower than one seen: ignored),
    /// [`RingError::NoDelta`], [`RingError::BadField`], [`RingError::NotMember`].
    pub fn on_reduce_start(
        self: &Arc<Self>,
        rs: pb::ReduceStart,
    ) -> Result<Option<RoundHandle>, RingError> {
        let plan = self.plan(&rs)?;
        let (job, epoch, version) = (plan.job, plan.epoch, plan.ring_version);
        let generation = 1 + self
            .generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (aborted, delta) = {
            let mut jobs = self.jobs();
            let j = jobs.entry(job).or_default();
            if version < j.ring_version {
                return Err(RingError::Stale {
                    job,
                    got: version,
                    have: j.ring_version,
                });
            }
            let cur = j
                .current
                .as_ref()
                .filter(|c| c.epoch == epoch)
                .ok_or(RingError::NoDelta { job, epoch })?;
            if let Some(slot) = &cur.round {
                if slot.ring_version > version {
                    return Err(RingError::Stale {
                        job,
                        got: version,
                        have: slot.ring_version,
                    });
                }
                // A repeat of the round running or done; a failed one is run again.
                if slot.ring_version == version && !slot.failed {
                    return Ok(None);
                }
            }
            let delta = cur.delta.clone();
            j.ring_version = version;
            let aborted = j.abort_round();
            if let Some(cur) = j.current.as_mut() {
                cur.round = Some(RoundSlot {
                    ring_version: version,
                    generation,
                    task: None,
                    result: None,
                    failed: false,
                });
            }
            (aborted, delta)
        };
        if let Some((e, v)) = aborted {
            self.emit(AgentEvent::RoundAborted {
                job,
                epoch: e,
                ring_version: v,
                superseded_by: version,
            });
        }
        self.emit(AgentEvent::RoundStarted {
            job,
            epoch,
            ring_version: version,
            members: plan.ring.len(),
            position: plan.position,
            weight: plan.weight,
        });
        let me = self.clone();
        let join = tokio::spawn(async move {
            let r = me.run_round(&plan, delta, generation).await;
            match &r {
                Ok(_) | Err(RingError::Aborted) => {}
                Err(e) => {
                    let suspect = match e {
                        RingError::Round { suspect, .. } => suspect.map(|s| s.to_string()),
                        _ => None,
                    };
                    tracing::warn!(job, epoch, ring_version = version, "round failed: {e}");
                    me.mark_failed(job, generation);
                    me.emit(AgentEvent::RoundFailed {
                        job,
                        epoch,
                        ring_version: version,
                        suspect,
                        reason: e.to_string(),
                    });
                }
            }
            r
        });
        {
            let mut jobs = self.jobs();
            let slot = jobs
                .get_mut(&job)
                .and_then(|j| j.current.as_mut())
                .and_then(|c| c.round.as_mut())
                .filter(|s| s.generation == generation);
            match slot {
                // Finished already (a lone member): nothing to abort.
                Some(s) if s.result.is_none() && !s.failed => s.task = Some(join.abort_handle()),
                Some(_) => {}
                // Replaced meanwhile by a newer round.
                None => join.abort(),
            }
        }
        Ok(Some(RoundHandle { join }))
    }

    /// Checks a `ReduceStart` (see [`RingParticipant::on_reduce_start`]).
    fn plan(&self, rs: &pb::ReduceStart) -> Result<RoundPlan, RingError> {
        let n = rs.members.len();
        if n == 0 || n > MAX_MEMBERS {
            return Err(RingError::field(
                "members",
                format!("{n} members, not 1..={MAX_MEMBERS}"),
            ));
        }
        let me = self.identity.node_id();
        let mut ring = Vec::with_capacity(n);
        let mut seen = HashSet::with_capacity(n);
        let mut position = None;
        for (i, m) in rs.members.iter().enumerate() {
            let id = <[u8; 32]>::try_from(m.node_id.as_slice())
                .map(NodeId)
                .map_err(|_| {
                    RingError::field(
                        "members.node_id",
                        format!("member {i}: {} bytes, not 32", m.node_id.len()),
                    )
                })?;
            if !seen.insert(id) {
                return Err(RingError::field(
                    "members.node_id",
                    format!("member {i}: {id} appears twice"),
                ));
            }
            if !(m.weight.is_finite() && (0.0..=1.0).contains(&m.weight)) {
                return Err(RingError::field(
                    "members.weight",
                    format!("member {i}: {} is not in [0, 1]", m.weight),
                ));
            }
            if m.endpoint.is_empty() || m.endpoint.len() > MAX_ENDPOINT_BYTES {
                return Err(RingError::field(
                    "members.endpoint",
                    format!(
                        "member {i}: {} bytes, not 1..={MAX_ENDPOINT_BYTES}",
                        m.endpoint.len()
                    ),
                ));
            }
            if id == me {
                position = Some(i);
            }
            ring.push(id);
        }
        let position = position.ok_or(RingError::NotMember {
            job: rs.job_id,
            ring_version: rs.ring_version,
        })?;
        let mbps = f64::from(rs.bottleneck_mbps);
        Ok(RoundPlan {
            job: rs.job_id,
            epoch: rs.epoch,
            ring_version: rs.ring_version,
            ring,
            position,
            weight: rs.members[position].weight,
            successor_endpoint: rs.members[(position + 1) % n].endpoint.clone(),
            link_mbps: if mbps.is_finite() && mbps > 0.0 {
                mbps
            } else {
                0.0
            },
        })
    }

    fn mark_failed(&self, job: u64, generation: u64) {
        let mut jobs = self.jobs();
        if let Some(s) = jobs
            .get_mut(&job)
            .and_then(|j| j.current.as_mut())
            .and_then(|c| c.round.as_mut())
            .filter(|s| s.generation == generation)
        {
            s.task = None;
            s.failed = true;
        }
    }

    /// Forgets every job (the orchestrator's event log changed: its versions and job ids are
    /// not comparable with those held); running rounds are aborted.
    pub fn forget_all(&self) {
        let mut jobs = self.jobs();
        for j in jobs.values_mut() {
            j.abort_round();
        }
        jobs.clear();
    }

    /// The round itself (module docs): weighted input, links, all-reduce, result payload,
    /// report.
    async fn run_round(
        &self,
        plan: &RoundPlan,
        delta: Arc<[u8]>,
        generation: u64,
    ) -> Result<Arc<RoundResult>, RingError> {
        let (job, epoch, version) = (plan.job, plan.epoch, plan.ring_version);
        let (weight, fault) = (plan.weight, self.fault);
        // The working vector: w_i · δ_i in the shared flat order.
        let (mut data, layout, base_version) = tokio::task::spawn_blocking(move || {
            let view = DeltaView::parse(&delta).map_err(|e| RingError::Delta(e.to_string()))?;
            let mut data = shared::flat_values(&view);
            if let RingFault::Substitute { perturbation } = fault {
                data.iter_mut().for_each(|x| *x += perturbation);
            }
            weight_in_place(&mut data, weight);
            if let RingFault::TamperAllreduce { perturbation } = fault {
                for x in &mut data {
                    *x += perturbation;
                }
            }
            let layout: Vec<(String, Vec<usize>)> = view
                .tensors
                .iter()
                .map(|t| (t.name.clone(), t.shape.clone()))
                .collect();
            Ok::<_, RingError>((data, layout, view.header.base_version))
        })
        .await
        .map_err(|e| RingError::Internal(format!("input task: {e}")))??;

        let mut cfg = RoundConfig::new(job, epoch, version, plan.ring.clone());
        cfg.piece_elems = self.settings.piece_elems;
        cfg.max_in_flight = self.settings.max_in_flight;
        cfg.deadline_slack = self.settings.deadline_slack;
        cfg.deadline_floor = self.settings.deadline_floor;
        cfg.link_mbps = plan.link_mbps;
        let links = self.links(plan, cfg.piece_deadline()).await?;
        let started = Instant::now();
        let outcome = all_reduce(&cfg, &self.identity, links, &mut data).await?;
        let values = std::mem::take(&mut data);
        let payload = tokio::task::spawn_blocking(move || {
            shared::result_payload(&layout, base_version, &values)
        })
        .await
        .map_err(|e| RingError::Internal(format!("result task: {e}")))?
        .map_err(|e| RingError::Delta(e.to_string()))?;
        let hash = hzdl::payload_hash(&payload);
        let result = Arc::new(RoundResult {
            ring_version: version,
            payload: Arc::from(payload),
            hash,
            evidence: outcome.evidence,
            evidence_signer: outcome.evidence_signer,
            bytes_sent: outcome.bytes_sent,
            bytes_received: outcome.bytes_received,
            elapsed_ms: started.elapsed().as_millis() as u64,
        });
        {
            let mut jobs = self.jobs();
            let slot = jobs
                .get_mut(&job)
                .and_then(|j| j.current.as_mut())
                .and_then(|c| c.round.as_mut())
                .filter(|s| s.generation == generation)
                .ok_or(RingError::Aborted)?;
            slot.result = Some(result.clone());
            slot.task = None;
        }
        let digest = shared::reduction_digest(job, epoch, version, &hash);
        self.rpc
            .report_reduction(pb::ReductionReport {
                session: Vec::new(),
                job_id: job,
                epoch,
                ring_version: version,
                result_sha256: hash.to_vec(),
                signature: shared::sign_digest(&self.identity, &digest).to_vec(),
            })
            .await
            .map_err(RingError::rpc("ReportReduction"))?;
        self.emit(AgentEvent::RoundFinished {
            job,
            epoch,
            ring_version: version,
            elapsed_ms: result.elapsed_ms,
            bytes_sent: result.bytes_sent,
            bytes_received: result.bytes_received,
            result_hash: hex::encode(hash),
        });
        Ok(result)
    }

    /// Connects to the successor (writing the link preamble) while waiting for the
    /// predecessor's link from the router, each within `deadline`. `None` for a lone member.
    async fn links(
        &self,
        plan: &RoundPlan,
        deadline: Duration,
    ) -> Result<Option<RingLinks>, RingError> {
        let n = plan.ring.len();
        if n == 1 {
            return Ok(None);
        }
        let me = self.identity.node_id();
        let succ = plan.ring[(plan.position + 1) % n];
        let pred = plan.ring[(plan.position + n - 1) % n];
        let key = |from| LinkKey {
            job: plan.job,
            epoch: plan.epoch,
            ring_version: plan.ring_version,
            from,
        };
        let incoming = self.router.expect(key(pred));
        let lost = |peer: NodeId, detail: String| RingError::Round {
            suspect: Some(peer),
            reason: detail,
        };
        let connect = async {
            let mut s =
                tokio::time::timeout(deadline, TcpStream::connect(&plan.successor_endpoint))
                    .await
                    .map_err(|_| {
                        lost(
                            succ,
                            format!("connecting to {} timed out", plan.successor_endpoint),
                        )
                    })?
                    .map_err(|e| {
                        lost(
                            succ,
                            format!("connecting to {}: {e}", plan.successor_endpoint),
                        )
                    })?;
            let _ = s.set_nodelay(true);
            tokio::time::timeout(deadline, s.write_all(&link_preamble(&key(me), &succ)))
                .await
                .map_err(|_| lost(succ, "writing the link preamble timed out".into()))?
                .map_err(|e| lost(succ, format!("writing the link preamble: {e}")))?;
            Ok::<_, RingError>(s)
        };
        let accept = async {
            match tokio::time::timeout(deadline, incoming).await {
                Ok(Ok(s)) => Ok(s),
                Ok(Err(_)) => Err(RingError::Aborted),
                Err(_) => Err(lost(
                    pred,
                    format!("no link from the predecessor within {deadline:?}"),
                )),
            }
        };
        let (send_to, recv_from) = tokio::join!(connect, accept);
        // The predecessor's failure first, as the data plane reports it.
        let recv_from = recv_from?;
        let send_to = send_to?;
        Ok(Some(RingLinks { send_to, recv_from }))
    }

    /// Runs the handler of a ring message of the session (`SketchRequest`, `ReduceStart`,
    /// `UploadRequest`) in a spawned task, reporting a refusal or failure as
    /// [`AgentEvent::RingRefused`]. Other messages are ignored.
    pub fn dispatch(self: &Arc<Self>, body: pb::orchestrator_message::Body) {
        use pb::orchestrator_message::Body;
        let me = self.clone();
        match body {
            Body::SketchRequest(r) => {
                let (job, epoch) = (r.job_id, r.epoch);
                let step = if r.check { "check sketch" } else { "sketch" };
                tokio::spawn(async move {
                    let res = me.on_sketch_request(r).await;
                    me.refused(job, epoch, step, res);
                });
            }
            Body::UploadRequest(r) => {
                let (job, epoch) = (r.job_id, r.epoch);
                tokio::spawn(async move {
                    let res = me.on_upload_request(r).await;
                    me.refused(job, epoch, "upload", res);
                });
            }
            Body::ReduceStart(r) => {
                let (job, epoch) = (r.job_id, r.epoch);
                let res = self.on_reduce_start(r).map(|_| ());
                self.refused(job, epoch, "reduce", res);
            }
            _ => {}
        }
    }

    fn refused(&self, job: u64, epoch: u32, step: &str, res: Result<(), RingError>) {
        if let Err(e) = res {
            tracing::warn!(job, epoch, step, "ring aggregation: {e}");
            self.emit(AgentEvent::RingRefused {
                job,
                epoch,
                step: step.to_string(),
                reason: e.to_string(),
            });
        }
    }
}

struct Committed {
    delta: Arc<[u8]>,
    hash: [u8; 32],
    step: u64,
    claimed_loss: f64,
    commitments: ([u8; 32], [u8; 32]),
}

#[cfg(test)]
mod tests {
    use super::*;
    use hanzod_allreduce::schedule::{reference_sum, simulate, Schedule};
    use hanzod_allreduce::wire::{PieceHeader, PIECE_HEADER_LEN};
    use hanzod_protocol::hzdl::{DeltaDtype, DeltaKind};
    use hanzod_protocol::identity::verifying_key;
    use hanzod_protocol::round::{seed_commitment, verify_digest};
    use rand::{Rng, SeedableRng};
    use tokio::net::TcpListener;

    const JOB: u64 = 7;
    const EPOCH: u32 = 2;
    const STEP: u64 = 40;
    const PIECE: u32 = 7;
    const SCORE_SEED: [u8; 32] = [11; 32];
    const CHECK_SEED: [u8; 32] = [12; 32];

    #[derive(Default)]
    struct Captured {
        commits: Vec<pb::DeltaCommitment>,
        sketches: Vec<pb::SketchSubmission>,
        reports: Vec<pb::ReductionReport>,
        evidence: Vec<pb::RoundEvidence>,
        uploads: Vec<(pb::DeltaHeader, pb::DeltaTrailer, Arc<[u8]>)>,
    }

    /// Captures every call and acks it.
    #[derive(Clone, Default)]
    struct FakeRpc(Arc<Mutex<Captured>>);

    impl FakeRpc {
        fn with<T>(&self, f: impl FnOnce(&mut Captured) -> T) -> T {
            f(&mut self.0.lock().unwrap())
        }
    }

    fn ack() -> std::future::Ready<Result<pb::RoundAck, Status>> {
        std::future::ready(Ok(pb::RoundAck { step: "ok".into() }))
    }

    impl RingRpc for FakeRpc {
        fn commit_delta(
            &self,
            m: pb::DeltaCommitment,
        ) -> impl Future<Output = Result<pb::RoundAck, Status>> + Send {
            self.with(|c| c.commits.push(m));
            ack()
        }
        fn submit_sketch(
            &self,
            m: pb::SketchSubmission,
        ) -> impl Future<Output = Result<pb::RoundAck, Status>> + Send {
            self.with(|c| c.sketches.push(m));
            ack()
        }
        fn report_reduction(
            &self,
            m: pb::ReductionReport,
        ) -> impl Future<Output = Result<pb::RoundAck, Status>> + Send {
            self.with(|c| c.reports.push(m));
            ack()
        }
        fn submit_evidence(
            &self,
            m: pb::RoundEvidence,
        ) -> impl Future<Output = Result<pb::RoundAck, Status>> + Send {
            self.with(|c| c.evidence.push(m));
            ack()
        }
        fn upload_delta(
            &self,
            header: pb::DeltaHeader,
            trailer: pb::DeltaTrailer,
            payload: Arc<[u8]>,
        ) -> impl Future<Output = Result<pb::DeltaAck, Status>> + Send {
            let hash = hzdl::payload_hash(&payload).to_vec();
            self.with(|c| c.uploads.push((header, trailer, payload)));
            std::future::ready(Ok(pb::DeltaAck {
                delta_hash: hash,
                accepted: true,
                reason: String::new(),
            }))
        }
    }

    struct Member {
        identity: Identity,
        p: Arc<RingParticipant<FakeRpc>>,
        rpc: FakeRpc,
        endpoint: String,
        delta: Vec<u8>,
        server: tokio::task::JoinHandle<()>,
    }

    impl Drop for Member {
        fn drop(&mut self) {
            self.server.abort();
        }
    }

    impl Member {
        fn id(&self) -> NodeId {
            self.identity.node_id()
        }
        fn key(&self) -> ed25519_dalek::VerifyingKey {
            verifying_key(&self.id()).unwrap()
        }
    }

    const LAYOUT: [(&str, &[usize]); 3] =
        [("c", &[3, 5, 7]), ("a.weight", &[8, 16]), ("b.bias", &[37])];

    /// A seeded random f32 delta of [`LAYOUT`] (270 values), base version 3.
    fn random_delta(seed: u64) -> Vec<u8> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let values: Vec<Vec<f32>> = LAYOUT
            .iter()
            .map(|(_, s)| {
                (0..s.iter().product::<usize>())
                    .map(|_| rng.gen_range(-1.0f32..1.0))
                    .collect()
            })
            .collect();
        let tensors: Vec<(&str, &[usize], &[f32])> = LAYOUT
            .iter()
            .zip(&values)
            .map(|((n, s), v)| (*n, *s, v.as_slice()))
            .collect();
        hzdl::write_delta(DeltaKind::Full, 3, DeltaDtype::F32, &tensors).unwrap()
    }

    async fn member(seed: u8, fault: RingFault) -> Member {
        let identity = Identity::from_seed([seed; 32]);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = listener.local_addr().unwrap().to_string();
        let router = RingRouter::new();
        let server = tokio::spawn(crate::probe::serve_peers(
            listener,
            identity.node_id(),
            Some(router.clone()),
            Duration::from_secs(30),
        ));
        let rpc = FakeRpc::default();
        let settings = RoundSettings {
            piece_elems: PIECE,
            max_in_flight: 2,
            deadline_slack: 4.0,
            // Long: a round here ends by finishing or by being aborted, never by a timeout.
            deadline_floor: Duration::from_secs(120),
        };
        let p = RingParticipant::new(
            identity.clone(),
            rpc.clone(),
            router,
            fault,
            settings,
            broadcast::channel(256).0,
        );
        Member {
            identity,
            p,
            rpc,
            endpoint,
            delta: random_delta(u64::from(seed)),
            server,
        }
    }

    async fn committed_members(seeds: &[(u8, RingFault)]) -> Vec<Member> {
        let mut out = Vec::new();
        for &(seed, fault) in seeds {
            let m = member(seed, fault).await;
            m.p.commit(CommitInput {
                job: JOB,
                epoch: EPOCH,
                step: STEP,
                claimed_loss: 1.5,
                commitments: (seed_commitment(&SCORE_SEED), seed_commitment(&CHECK_SEED)),
                payload: m.delta.clone(),
            })
            .await
            .unwrap();
            out.push(m);
        }
        out
    }

    fn reduce_start(version: u64, ring: &[&Member], weights: &[f32]) -> pb::ReduceStart {
        pb::ReduceStart {
            job_id: JOB,
            epoch: EPOCH,
            ring_version: version,
            members: ring
                .iter()
                .zip(weights)
                .map(|(m, w)| pb::RoundMember {
                    node_id: m.id().0.to_vec(),
                    endpoint: m.endpoint.clone(),
                    weight: *w,
                })
                .collect(),
            bottleneck_mbps: 1000.0,
        }
    }

    /// The result hash an honest ring computes: `result_payload` of the weighted inputs'
    /// sum in the schedule's order, `extra[i]` added to member i's weighted input.
    fn expected_hash(ring: &[&Member], weights: &[f32], extra: &[f32]) -> [u8; 32] {
        let views: Vec<DeltaView<'_>> = ring
            .iter()
            .map(|m| DeltaView::parse(&m.delta).unwrap())
            .collect();
        let mut inputs: Vec<Vec<f32>> = views
            .iter()
            .zip(weights)
            .zip(extra)
            .map(|((v, w), e)| {
                let mut x = shared::flat_values(v);
                weight_in_place(&mut x, *w);
                x.iter_mut().for_each(|x| *x += *e);
                x
            })
            .collect();
        let refs: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
        let sum = reference_sum(&refs);
        // The schedule run piece by piece gives the same bits.
        simulate(&mut inputs, PIECE as usize);
        for x in &inputs {
            assert!(x.iter().zip(&sum).all(|(a, b)| a.to_bits() == b.to_bits()));
        }
        let layout: Vec<(String, Vec<usize>)> = views[0]
            .tensors
            .iter()
            .map(|t| (t.name.clone(), t.shape.clone()))
            .collect();
        hzdl::payload_hash(&shared::result_payload(&layout, 3, &sum).unwrap())
    }

    async fn run_round(ring: &[&Member], version: u64, weights: &[f32]) -> Vec<Arc<RoundResult>> {
        let handles: Vec<RoundHandle> = ring
            .iter()
            .map(|m| {
                m.p.on_reduce_start(reduce_start(version, ring, weights))
                    .unwrap()
                    .expect("a new round starts")
            })
            .collect();
        let mut out = Vec::new();
        for h in handles {
            out.push(h.outcome().await.unwrap());
        }
        out
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn four_members_commit_sketch_reduce_and_upload_over_loopback() {
        let honest = RingFault::Honest;
        let ms = committed_members(&[(1, honest), (2, honest), (3, honest), (4, honest)]).await;
        let ring: Vec<&Member> = ms.iter().collect();

        // Commitments: the DESIGN §6 statement over the kept payload.
        for m in &ms {
            let c = m.rpc.with(|c| c.commits[0].clone());
            let hash = hzdl::payload_hash(&m.delta);
            assert_eq!(c.sha256, hash);
            assert_eq!(c.total_bytes, m.delta.len() as u64);
            let st = Statement {
                job: JOB,
                epoch: EPOCH,
                step: STEP,
                claimed_loss: 1.5,
            };
            hzdl::verify_statement(&m.key(), &st, &hash, &c.signature).unwrap();
        }

        // A seed that is not the committed one is refused; nothing is sent.
        let wrong = pb::SketchRequest {
            job_id: JOB,
            epoch: EPOCH,
            seed: CHECK_SEED.to_vec(),
            rows: 64,
            ..Default::default()
        };
        assert_eq!(
            ms[0].p.on_sketch_request(wrong).await,
            Err(RingError::BadReveal {
                job: JOB,
                epoch: EPOCH,
                check: false
            })
        );
        assert!(ms[0].rpc.with(|c| c.sketches.is_empty()));
        // Another epoch: nothing committed.
        let other = pb::SketchRequest {
            job_id: JOB,
            epoch: EPOCH + 1,
            seed: SCORE_SEED.to_vec(),
            rows: 64,
            ..Default::default()
        };
        assert!(matches!(
            ms[0].p.on_sketch_request(other).await,
            Err(RingError::NoDelta { .. })
        ));

        // Scoring sketches; member 1 is spot-checked and uploads its delta too.
        for (i, m) in ms.iter().enumerate() {
            let req = pb::SketchRequest {
                job_id: JOB,
                epoch: EPOCH,
                seed: SCORE_SEED.to_vec(),
                rows: 64,
                upload_delta: i == 1,
                ..Default::default()
            };
            m.p.on_sketch_request(req).await.unwrap();
            let s = m.rpc.with(|c| c.sketches[0].clone());
            let hash: [u8; 32] = hzdl::payload_hash(&m.delta);
            let view = DeltaView::parse(&m.delta).unwrap();
            let want = shared::sketch_delta(&view, &SCORE_SEED, 64).unwrap();
            let got = shared::sketch_from_wire(s.sketch.as_ref(), 64, 270).unwrap();
            assert_eq!(got, want);
            assert!(!s.check);
            let digest = shared::sketch_digest(JOB, EPOCH, SeedPurpose::Score, &hash, &got);
            verify_digest(&m.key(), &digest, &s.signature).unwrap();
            // Not under another member's key.
            assert!(verify_digest(&ms[(i + 1) % 4].key(), &digest, &s.signature).is_err());
            let uploads = m.rpc.with(|c| c.uploads.clone());
            if i == 1 {
                assert_eq!(uploads.len(), 1);
                let (h, t, payload) = &uploads[0];
                assert_eq!(h.kind, pb::DeltaKind::Delta as i32);
                assert_eq!(&payload[..], &m.delta[..]);
                assert_eq!(t.sha256, hash);
            } else {
                assert!(uploads.is_empty());
            }
        }

        // The round.
        let weights = [0.1f32, 0.2, 0.3, 0.4];
        let results = run_round(&ring, 1, &weights).await;
        let want = expected_hash(&ring, &weights, &[0.0; 4]);
        for (m, r) in ms.iter().zip(&results) {
            assert_eq!(r.hash, want, "every member holds the reference result");
            assert_eq!(hzdl::payload_hash(&r.payload), want);
            let rep = m.rpc.with(|c| c.reports[0].clone());
            assert_eq!(rep.result_sha256, want);
            assert_eq!(rep.ring_version, 1);
            verify_digest(
                &m.key(),
                &shared::reduction_digest(JOB, EPOCH, 1, &want),
                &rep.signature,
            )
            .unwrap();
        }
        // A repeated ReduceStart of the same round does nothing.
        assert!(ms[0]
            .p
            .on_reduce_start(reduce_start(1, &ring, &weights))
            .unwrap()
            .is_none());

        // MERGED: the result, claimed loss 0, signed over the merged statement.
        let merged = pb::UploadRequest {
            job_id: JOB,
            epoch: EPOCH,
            ring_version: 1,
            kind: pb::upload_request::Kind::Merged as i32,
            reason: String::new(),
        };
        ms[0].p.on_upload_request(merged.clone()).await.unwrap();
        let (h, t, payload) = ms[0].rpc.with(|c| c.uploads[0].clone());
        assert_eq!(h.kind, pb::DeltaKind::Merged as i32);
        assert_eq!(
            (h.claimed_loss, h.step, h.total_bytes),
            (0.0, STEP, payload.len() as u64)
        );
        assert_eq!(hzdl::payload_hash(&payload), want);
        assert_eq!(t.sha256, want);
        verify_digest(
            &ms[0].key(),
            &shared::merged_digest(JOB, EPOCH, &want),
            &t.signature,
        )
        .unwrap();
        // Of a round that did not run here: refused.
        let mut other = merged.clone();
        other.ring_version = 9;
        assert!(matches!(
            ms[0].p.on_upload_request(other).await,
            Err(RingError::NoResult {
                ring_version: 9,
                ..
            })
        ));

        // EVIDENCE: every piece member 2 received, signed by its predecessor (member 1).
        let mut ev = merged.clone();
        ev.kind = pb::upload_request::Kind::Evidence as i32;
        ms[2].p.on_upload_request(ev).await.unwrap();
        let e = ms[2].rpc.with(|c| c.evidence[0].clone());
        assert_eq!(e.sender, ms[1].id().0.to_vec());
        assert_eq!(
            e.pieces.len(),
            Schedule::new(270, 4, PIECE as usize).pieces_per_round(1)
        );
        for piece in &e.pieces {
            assert_eq!(piece.len(), PIECE_HEADER_LEN + 64);
            let header =
                PieceHeader::decode(piece[..PIECE_HEADER_LEN].try_into().unwrap()).unwrap();
            assert_eq!((header.job, header.ring_version), (JOB, 1));
            let signed = SignedPiece {
                header,
                signature: piece[PIECE_HEADER_LEN..].try_into().unwrap(),
            };
            signed.verify(&ms[1].key()).unwrap();
        }

        // The check seed: the committed delta (not the result) sketched under it.
        let check = pb::SketchRequest {
            job_id: JOB,
            epoch: EPOCH,
            seed: CHECK_SEED.to_vec(),
            rows: 32,
            check: true,
            ring_version: 1,
            upload_delta: false,
        };
        ms[3].p.on_sketch_request(check).await.unwrap();
        let s = ms[3].rpc.with(|c| c.sketches[1].clone());
        assert!(s.check);
        let view = DeltaView::parse(&ms[3].delta).unwrap();
        let got = shared::sketch_from_wire(s.sketch.as_ref(), 32, 270).unwrap();
        assert_eq!(got, shared::sketch_delta(&view, &CHECK_SEED, 32).unwrap());
        let hash = hzdl::payload_hash(&ms[3].delta);
        verify_digest(
            &ms[3].key(),
            &shared::sketch_digest(JOB, EPOCH, SeedPurpose::Check, &hash, &got),
            &s.signature,
        )
        .unwrap();

        // DELTA (the star fallback): the committed delta.
        let mut d = merged;
        d.kind = pb::upload_request::Kind::Delta as i32;
        ms[3].p.on_upload_request(d).await.unwrap();
        let (h, _, payload) = ms[3].rpc.with(|c| c.uploads[0].clone());
        assert_eq!(h.kind, pb::DeltaKind::Delta as i32);
        assert_eq!(&payload[..], &ms[3].delta[..]);

        // The next epoch drops what the job held.
        ms[0].p.on_epoch_start(JOB, EPOCH + 1);
        assert!(ms[0].p.result(JOB, EPOCH, 1).is_none());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_newer_version_aborts_the_round_and_the_next_excludes_the_dropped_member() {
        let honest = RingFault::Honest;
        let ms = committed_members(&[(21, honest), (22, honest), (23, honest), (24, honest)]).await;
        let all: Vec<&Member> = ms.iter().collect();
        // Version 1 reaches members 0..=2 only: member 3 (alive, but lost to the
        // orchestrator) never joins, so the round cannot finish.
        let v1 = [0.25f32; 4];
        let old: Vec<RoundHandle> = ms[..3]
            .iter()
            .map(|m| {
                m.p.on_reduce_start(reduce_start(1, &all, &v1))
                    .unwrap()
                    .unwrap()
            })
            .collect();
        // Member 0 hears of ring v2 first (RingUpdate), the others from ReduceStart v2.
        ms[0].p.on_ring_update(JOB, 2);
        let ring: Vec<&Member> = ms[..3].iter().collect();
        let v2 = [0.5f32, 0.25, 0.25];
        let new: Vec<RoundHandle> = ring
            .iter()
            .map(|m| {
                m.p.on_reduce_start(reduce_start(2, &ring, &v2))
                    .unwrap()
                    .unwrap()
            })
            .collect();
        for h in old {
            assert_eq!(h.outcome().await.unwrap_err(), RingError::Aborted);
        }
        let want = expected_hash(&ring, &v2, &[0.0; 3]);
        for h in new {
            assert_eq!(h.outcome().await.unwrap().hash, want);
        }
        assert_ne!(want, expected_hash(&all, &v1, &[0.0; 4]));
        // A ReduceStart of the old version now is ignored.
        assert!(matches!(
            ms[1].p.on_reduce_start(reduce_start(1, &all, &v1)),
            Err(RingError::Stale {
                got: 1,
                have: 2,
                ..
            })
        ));
        // Only the finished round's result is reported and kept.
        for m in &ms[..3] {
            let reports = m.rpc.with(|c| c.reports.clone());
            assert_eq!(reports.len(), 1);
            assert_eq!(
                (reports[0].ring_version, reports[0].result_sha256.clone()),
                (2, want.to_vec())
            );
            assert!(m.p.result(JOB, EPOCH, 1).is_none());
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tampering_member_changes_the_result_every_member_agrees_on() {
        let honest = RingFault::Honest;
        let tamper = RingFault::TamperAllreduce { perturbation: 1.0 };
        let ms = committed_members(&[(31, honest), (32, honest), (33, tamper), (34, honest)]).await;
        let ring: Vec<&Member> = ms.iter().collect();
        let weights = [0.25f32; 4];
        let results = run_round(&ring, 1, &weights).await;
        let honest_hash = expected_hash(&ring, &weights, &[0.0; 4]);
        let tampered = expected_hash(&ring, &weights, &[0.0, 0.0, 1.0, 0.0]);
        assert_ne!(honest_hash, tampered);
        for r in &results {
            assert_eq!(r.hash, tampered);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reduce_starts_out_of_bounds_are_refused() {
        let ms = committed_members(&[(41, RingFault::Honest), (42, RingFault::Honest)]).await;
        let ring: Vec<&Member> = ms.iter().collect();
        let p = &ms[0].p;
        let base = reduce_start(1, &ring, &[0.5, 0.5]);
        let refused = |f: &dyn Fn(&mut pb::ReduceStart)| {
            let mut rs = base.clone();
            f(&mut rs);
            p.on_reduce_start(rs).unwrap_err()
        };
        let field = |e: RingError| match e {
            RingError::BadField { field, .. } => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field(refused(&|rs| rs.members.clear())), "members");
        assert_eq!(
            field(refused(&|rs| rs.members[0].weight = f32::NAN)),
            "members.weight"
        );
        assert_eq!(
            field(refused(&|rs| rs.members[0].weight = 1.5)),
            "members.weight"
        );
        assert_eq!(
            field(refused(&|rs| {
                rs.members[1].node_id.pop();
            })),
            "members.node_id"
        );
        assert_eq!(
            field(refused(
                &|rs| rs.members[1].node_id = rs.members[0].node_id.clone()
            )),
            "members.node_id"
        );
        assert_eq!(
            field(refused(&|rs| rs.members[1].endpoint = "x".repeat(256))),
            "members.endpoint"
        );
        let too_many = |rs: &mut pb::ReduceStart| {
            rs.members = (0..=MAX_MEMBERS as u32)
                .map(|i| pb::RoundMember {
                    node_id: [i.to_le_bytes().to_vec(), vec![0; 28]].concat(),
                    endpoint: "h:1".into(),
                    weight: 0.0,
                })
                .collect()
        };
        assert_eq!(field(refused(&too_many)), "members");
        assert!(matches!(
            refused(&|rs| {
                rs.members.remove(0);
            }),
            RingError::NotMember { .. }
        ));
        assert!(matches!(
            refused(&|rs| rs.epoch += 1),
            RingError::NoDelta { .. }
        ));
        // An unknown upload kind and a bad row count are refused too.
        let bad_kind = pb::UploadRequest {
            job_id: JOB,
            epoch: EPOCH,
            kind: 9,
            ..Default::default()
        };
        assert!(matches!(
            p.on_upload_request(bad_kind).await,
            Err(RingError::BadField { field: "kind", .. })
        ));
        let bad_rows = pb::SketchRequest {
            job_id: JOB,
            epoch: EPOCH,
            seed: SCORE_SEED.to_vec(),
            rows: 100,
            ..Default::default()
        };
        assert!(matches!(
            p.on_sketch_request(bad_rows).await,
            Err(RingError::BadField { field: "rows", .. })
        ));
    }

    #[tokio::test]
    async fn the_router_parks_early_links_and_hands_them_to_their_round() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let me = NodeId([5; 32]);
        let key = LinkKey {
            job: 1,
            epoch: 0,
            ring_version: 3,
            from: NodeId([6; 32]),
        };
        let router = RingRouter::new();
        // Early: the link arrives before its round waits.
        let mut client = TcpStream::connect(addr).await.unwrap();
        client.write_all(&link_preamble(&key, &me)).await.unwrap();
        client.write_all(b"after").await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let mut magic = [0u8; 8];
        server.peek(&mut magic).await.unwrap();
        assert_eq!(
            crate::probe::classify(&magic),
            crate::probe::PeerKind::RingLink
        );
        assert_eq!(
            accept_link(server, me, &router, Duration::from_secs(5)).await,
            Ok(Offered::Parked)
        );
        assert_eq!(router.parked(), 1);
        // Another version's round does not get it.
        let other = router.expect(LinkKey {
            ring_version: 4,
            ..key
        });
        let mut got = router.expect(key).await.unwrap();
        assert_eq!(router.parked(), 0);
        let mut rest = [0u8; 5];
        got.read_exact(&mut rest).await.unwrap();
        assert_eq!(&rest, b"after", "the preamble is consumed, nothing more");
        drop(other);
        // A link for another node is closed.
        let mut client = TcpStream::connect(addr).await.unwrap();
        client
            .write_all(&link_preamble(&key, &NodeId([9; 32])))
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        assert!(accept_link(server, me, &router, Duration::from_secs(5))
            .await
            .is_err());
        assert_eq!(client.read(&mut rest).await.unwrap_or(0), 0);
    }

    #[test]
    fn a_preamble_round_trips_and_needs_its_magic() {
        let key = LinkKey {
            job: u64::MAX,
            epoch: 9,
            ring_version: 12,
            from: NodeId([1; 32]),
        };
        let b = link_preamble(&key, &NodeId([2; 32]));
        assert_eq!(parse_link_preamble(&b), Some((key, NodeId([2; 32]))));
        let mut bad = b;
        bad[0] ^= 1;
        assert_eq!(parse_link_preamble(&bad), None);
    }
}
