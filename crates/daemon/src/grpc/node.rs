//! `hanzod.v1.NodeService`: challenge–response registration and the per-node session
//! stream (DESIGN §3, paper §4.1 and §4.4).
//!
//! Every request's fields are held to their size limits ([`limits`]) before anything
//! decodes, verifies, hashes or logs them: `Challenge` and `Register` right after their
//! per-IP rate limit (a `Register`'s `info` before it is decoded), a session's first message
//! before it is decoded. A field over its limit is `INVALID_ARGUMENT`, counted as
//! `rejected_messages{reason="too_large"}`.
//!
//! Checks on every session message, cheapest first: per-session rate limit, field sizes
//! ([`limits::signed_node_message`]), decoding, session token, Ed25519 signature over
//! `"hanzod.v1.session" || payload`, sequence number strictly above the last accepted one,
//! timestamp within the replay window. A bad signature ends the stream `UNAUTHENTICATED`;
//! other refusals answer a `Reject` and keep the stream, until `max_violations` refusals end
//! it `RESOURCE_EXHAUSTED`.
//!
//! Refusals are logged through one [`RefusalLog`], shared by the service and its session
//! tasks: at most one line per reason per interval, with the count of those not logged; the
//! metric counts every one, and a session's node still gets its `Reject` for each.
//!
//! `UploadDelta` is served by [`super::upload::DeltaUploads`].

use hanzod_actors::ports::{Counter, Histogram};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ed25519_dalek::VerifyingKey;
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota, RateLimiter};
use hanzod_actors::node::HeartbeatError;
use hanzod_actors::ports::{Clock, Metrics};
use hanzod_actors::types::NodeId;
use hanzod_actors::{OrchestratorError, OrchestratorHandle};
use hanzod_proto::v1 as pb;
use hanzod_proto::v1::node_service_server::NodeService;
use prost::Message;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::refusal_log::{Logged, RefusalLog};
use super::sessions::{AttachError, Attached, Outbound, Sessions, Token};
use super::status_of;
use super::upload::DeltaUploads;
use hanzod_protocol::convert;
use hanzod_protocol::identity::{self, gpu_attestation_bytes};
use hanzod_protocol::limits;

/// Limits and timings of the node service.
#[derive(Debug, Clone)]
pub struct NodeServiceSettings {
    /// A registration nonce is refused after this many ms.
    pub challenge_ttl_ms: u64,
    /// At most this many unanswered nonces are kept (RESOURCE_EXHAUSTED beyond).
    pub max_pending_challenges: usize,
    /// Registrations per node key per minute (charged after the signature verifies, so
    /// nobody can use up another key's budget).
    pub registrations_per_min: u32,
    /// Challenge calls per client IP address per minute (also the burst).
    pub challenges_per_ip_per_min: u32,
    /// Register calls per client IP address (IPv6: per /64) per minute (also the burst),
    /// charged before its `NodeInfo` is decoded or its signature verified.
    pub registrations_per_ip_per_min: u32,
    /// Session messages per node per second (sustained).
    pub messages_per_s: u32,
    /// Session messages a node may send in a burst.
    pub burst: u32,
    /// Refused session messages before the stream is ended `RESOURCE_EXHAUSTED`.
    pub max_violations: u32,
    /// A new stream must send its first message within this many ms.
    pub first_message_timeout_ms: u64,
    /// Message timestamps must be within ± this many ms of the orchestrator's clock.
    pub replay_window_ms: u64,
    /// Keys trusted to sign GPU attestations; empty is development mode (not checked).
    pub attesters: Vec<VerifyingKey>,
    /// Identifies the event log (see `RegisterResponse.log_id`).
    pub log_id: [u8; 16],
    /// The orchestrator's public key.
    pub orchestrator_key: [u8; 32],
}

/// Outstanding registration nonces, with their expiry times in issue order (the TTL is
/// fixed, so the oldest expire first and pruning is amortised O(1)).
#[derive(Default)]
struct Pending {
    by_nonce: std::collections::HashMap<[u8; 32], (NodeId, u64)>,
    order: std::collections::VecDeque<([u8; 32], u64)>,
}

struct Challenges {
    pending: std::sync::Mutex<Pending>,
    max: usize,
}

impl Challenges {
    fn issue(&self, node: NodeId, now: u64, ttl: u64) -> Result<([u8; 32], u64), Status> {
        let mut g = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(&(nonce, exp)) = g.order.front() {
            if exp > now {
                break;
            }
            g.order.pop_front();
            g.by_nonce.remove(&nonce);
        }
        if g.by_nonce.len() >= self.max {
            return Err(Status::resource_exhausted(
                "too many registrations in progress; retry later",
            ));
        }
        let nonce: [u8; 32] = rand::random();
        let expires = now + ttl;
        g.by_nonce.insert(nonce, (node, expires));
        g.order.push_back((nonce, expires));
        Ok((nonce, expires))
    }

    /// Consumes the nonce (single use, even if the signature then fails). Its entry in
    /// `order` goes when it would have expired.
    fn take(&self, nonce: &[u8; 32], node: NodeId, now: u64) -> bool {
        let mut g = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        matches!(g.by_nonce.remove(nonce), Some((n, exp)) if n == node && exp > now)
    }
}

/// The NodeService implementation.
pub struct NodeServiceImpl {
    core: OrchestratorHandle,
    sessions: Arc<Sessions>,
    challenges: Challenges,
    per_key: DefaultKeyedRateLimiter<NodeId>,
    per_ip: DefaultKeyedRateLimiter<std::net::IpAddr>,
    register_per_ip: DefaultKeyedRateLimiter<std::net::IpAddr>,
    /// Which refusals are logged; shared with the session tasks.
    refusals: Arc<RefusalLog>,
    /// Calls since the keyed limiters were last pruned.
    limiter_calls: std::sync::atomic::AtomicU64,
    settings: NodeServiceSettings,
    metrics: Arc<dyn Metrics>,
    clock: Arc<dyn Clock>,
    shutdown: watch::Receiver<bool>,
    uploads: Arc<DeltaUploads>,
}

fn nz(v: u32) -> NonZeroU32 {
    NonZeroU32::new(v.max(1)).unwrap_or(NonZeroU32::MIN)
}

impl NodeServiceImpl {
    /// A service over `core`, delivering through `sessions` and receiving deltas through
    /// `uploads`; streams end `UNAVAILABLE` when `shutdown` turns true.
    pub fn new(
        core: OrchestratorHandle,
        sessions: Arc<Sessions>,
        settings: NodeServiceSettings,
        uploads: Arc<DeltaUploads>,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        let per_key = RateLimiter::keyed(
            Quota::per_minute(nz(settings.registrations_per_min))
                .allow_burst(nz(settings.registrations_per_min)),
        );
        let per_ip = RateLimiter::keyed(
            Quota::per_minute(nz(settings.challenges_per_ip_per_min))
                .allow_burst(nz(settings.challenges_per_ip_per_min)),
        );
        let register_per_ip = RateLimiter::keyed(
            Quota::per_minute(nz(settings.registrations_per_ip_per_min))
                .allow_burst(nz(settings.registrations_per_ip_per_min)),
        );
        NodeServiceImpl {
            per_ip,
            register_per_ip,
            refusals: Arc::new(RefusalLog::default()),
            limiter_calls: Default::default(),
            metrics: core.metrics(),
            clock: core.clock(),
            core,
            sessions,
            challenges: Challenges {
                pending: Default::default(),
                max: settings.max_pending_challenges.max(1),
            },
            per_key,
            settings,
            shutdown,
            uploads,
        }
    }

    /// Counts a refusal and logs it if [`RefusalLog`] lets it through (its message cut by
    /// [`convert::bounded_message`]).
    fn reject(&self, reason: &'static str, status: Status) -> Status {
        self.metrics.incr(Counter::RejectedMessages, reason, 1);
        match self
            .refusals
            .judge(reason, status.code(), self.clock.now().as_millis())
        {
            Logged::Failure => {
                tracing::warn!(reason, code = ?status.code(), "refused: {}", convert::bounded_message(status.message()))
            }
            Logged::Refusal { unlogged } => {
                tracing::info!(reason, code = ?status.code(), unlogged, "refused: {}", convert::bounded_message(status.message()))
            }
            Logged::Suppressed => {}
        }
        status
    }

    /// A field over its size limit ([`limits`]): `INVALID_ARGUMENT`, reason `too_large`.
    fn too_large(&self, e: convert::FieldError) -> Status {
        self.reject("too_large", e.into())
    }

    /// A refusal that the core already logged and counted as a registration outcome:
    /// counted here as a rejected message, not logged again.
    fn reject_quietly(&self, reason: &'static str, status: Status) -> Status {
        self.metrics.incr(Counter::RejectedMessages, reason, 1);
        status
    }

    /// Prunes the keyed limiters' idle entries every 4,096 calls, so their memory follows
    /// the keys and addresses seen in the last minute.
    fn prune_limiters(&self) {
        let n = self
            .limiter_calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if n % 4096 == 4095 {
            self.per_key.retain_recent();
            self.per_ip.retain_recent();
            self.register_per_ip.retain_recent();
        }
    }

    fn limit_key(&self, node: &NodeId) -> Result<(), Status> {
        self.prune_limiters();
        if self.per_key.check_key(node).is_err() {
            return Err(self.reject(
                "rate_limited",
                Status::resource_exhausted(format!(
                    "more than {} registrations per minute for this key",
                    self.settings.registrations_per_min
                )),
            ));
        }
        Ok(())
    }

    /// Charges one call of `what` (`"registration challenges"` or `"registrations"`) to
    /// `ip` on `limiter`, which allows `per_min` per minute.
    fn limit_ip(
        &self,
        limiter: &DefaultKeyedRateLimiter<std::net::IpAddr>,
        per_min: u32,
        what: &str,
        ip: Option<std::net::IpAddr>,
    ) -> Result<(), Status> {
        self.prune_limiters();
        if let Some(ip) = ip {
            if limiter.check_key(&rate_key(ip)).is_err() {
                return Err(self.reject(
                    "rate_limited",
                    Status::resource_exhausted(format!(
                        "more than {per_min} {what} per minute from {ip}"
                    )),
                ));
            }
        }
        Ok(())
    }

    fn verify_attestation(&self, info: &hanzod_actors::types::NodeInfo) -> Result<(), Status> {
        if self.settings.attesters.is_empty() {
            return Ok(());
        }
        let bytes = gpu_attestation_bytes(
            &info.id,
            &info.gpu.model,
            info.gpu.vram_bytes,
            info.gpu.compute_cap,
        );
        let ok = self.settings.attesters.iter().any(|k| {
            identity::verify(
                k,
                hanzod_actors::domain::GPU,
                &[&bytes],
                &info.gpu.driver_sig,
            )
            .is_ok()
        });
        if ok {
            Ok(())
        } else {
            Err(self.reject(
                "bad_attestation",
                Status::permission_denied("GPU attestation is not signed by a trusted attester"),
            ))
        }
    }
}

/// The key a client address is rate limited under: an IPv4 address itself, an IPv6 address
/// by its /64 prefix (one host commonly holds a whole /64, so a key per address would give
/// it 2^64 budgets). An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`, how a dual-stack
/// listener sees IPv4 clients) is keyed as its IPv4 address, not as the /64 every IPv4
/// client shares.
fn rate_key(ip: std::net::IpAddr) -> std::net::IpAddr {
    use std::net::{IpAddr, Ipv6Addr};
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        },
    }
}

fn token_of(bytes: &[u8]) -> Option<Token> {
    bytes.try_into().ok()
}

#[tonic::async_trait]
impl NodeService for NodeServiceImpl {
    async fn challenge(
        &self,
        request: Request<pb::ChallengeRequest>,
    ) -> Result<Response<pb::ChallengeResponse>, Status> {
        self.limit_ip(
            &self.per_ip,
            self.settings.challenges_per_ip_per_min,
            "registration challenges",
            request.remote_addr().map(|a| a.ip()),
        )?;
        limits::challenge(request.get_ref()).map_err(|e| self.too_large(e))?;
        let node = convert::node_id("node_id", &request.get_ref().node_id)
            .map_err(|e| self.reject("invalid", e.into()))?;
        identity::verifying_key(&node).map_err(|_| {
            self.reject(
                "invalid",
                Status::invalid_argument("invalid node_id: not an Ed25519 public key"),
            )
        })?;
        let (nonce, expires) = self.challenges.issue(
            node,
            self.clock.now().as_millis(),
            self.settings.challenge_ttl_ms,
        )?;
        Ok(Response::new(pb::ChallengeResponse {
            nonce: nonce.to_vec(),
            expires_at_ms: expires,
        }))
    }

    async fn register(
        &self,
        request: Request<pb::RegisterRequest>,
    ) -> Result<Response<pb::RegisterResponse>, Status> {
        self.limit_ip(
            &self.register_per_ip,
            self.settings.registrations_per_ip_per_min,
            "registrations",
            request.remote_addr().map(|a| a.ip()),
        )?;
        let req = request.into_inner();
        limits::register(&req).map_err(|e| self.too_large(e))?;
        let wire = pb::NodeInfo::decode(req.info.as_slice()).map_err(|e| {
            self.reject(
                "invalid",
                Status::invalid_argument(format!("invalid info: not a NodeInfo: {e}")),
            )
        })?;
        let (info, endpoint) =
            convert::node_info(&wire).map_err(|e| self.reject("invalid", e.into()))?;
        let key = identity::verifying_key(&info.id).map_err(|_| {
            self.reject(
                "invalid",
                Status::invalid_argument("invalid info.node_id: not an Ed25519 public key"),
            )
        })?;
        let nonce: [u8; 32] = req.nonce.as_slice().try_into().map_err(|_| {
            self.reject(
                "bad_nonce",
                Status::unauthenticated("missing or malformed nonce; call Challenge first"),
            )
        })?;
        if !self
            .challenges
            .take(&nonce, info.id, self.clock.now().as_millis())
        {
            return Err(self.reject(
                "bad_nonce",
                Status::unauthenticated("unknown, used or expired nonce; call Challenge again"),
            ));
        }
        identity::verify(
            &key,
            hanzod_actors::domain::REGISTER,
            &[&nonce, &req.info],
            &req.signature,
        )
        .map_err(|e| {
            self.reject(
                "bad_signature",
                Status::unauthenticated(format!("registration signature: {e}")),
            )
        })?;
        self.limit_key(&info.id)?;
        self.verify_attestation(&info)?;
        let node = info.id;
        let reg = self.core.register_node(info).await.map_err(|e| match &e {
            OrchestratorError::Register(r) => self.reject_quietly(r.reason(), status_of(&e)),
            _ => self.reject("unavailable", status_of(&e)),
        })?;
        let Some(token) = self.sessions.open(node, reg.sessions, key, endpoint) else {
            return Err(self.reject(
                "superseded",
                Status::aborted("a newer registration of this key won; use that one"),
            ));
        };
        // A registration whose session never attaches is closed (and its node failed at
        // once) rather than left advertising its endpoint.
        {
            let sessions = self.sessions.clone();
            let core = self.core.clone();
            let wait = Duration::from_millis(self.settings.first_message_timeout_ms);
            let core_session = reg.sessions;
            tokio::spawn(async move {
                tokio::time::sleep(wait).await;
                if sessions.close_if_unattached(&token) {
                    tracing::info!(node = %node.short(), "registered but never opened its session");
                    core.session_closed(node, core_session);
                }
            });
        }
        tracing::info!(node = %node.short(), registrations = reg.sessions, "node registered");
        let hb = &self.core.config().heartbeat;
        Ok(Response::new(pb::RegisterResponse {
            session: token.to_vec(),
            heartbeat_interval_ms: reg.heartbeat_interval_ms,
            heartbeat_timeout_ms: hb.timeout_ms,
            replay_window_ms: self.settings.replay_window_ms,
            stake_gym_wei: reg.stake.0.to_string(),
            registrations: reg.sessions,
            log_id: self.settings.log_id.to_vec(),
            orchestrator_key: self.settings.orchestrator_key.to_vec(),
            delta_chunk_bytes: u32::try_from(self.uploads.settings().chunk_bytes)
                .unwrap_or(u32::MAX),
        }))
    }

    type SessionStream =
        std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Outbound> + Send + 'static>>;

    async fn session(
        &self,
        request: Request<Streaming<pb::SignedNodeMessage>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let mut inbound = request.into_inner();
        let wait = Duration::from_millis(self.settings.first_message_timeout_ms);
        let mut stop = self.shutdown.clone();
        let first = tokio::select! {
            r = tokio::time::timeout(wait, inbound.message()) => r,
            _ = hanzod_protocol::status::stopped(&mut stop) => {
                return Err(Status::unavailable("orchestrator shutting down; reconnect later"));
            }
        };
        let first = match first {
            Err(_) => {
                return Err(self.reject(
                    "no_first_message",
                    Status::deadline_exceeded(format!(
                        "no session message within {} ms",
                        wait.as_millis()
                    )),
                ))
            }
            Ok(Err(status)) => {
                let status = resource_exhausted_if_too_large(status);
                return Err(self.reject(reason_of(&status), status));
            }
            Ok(Ok(None)) => {
                return Err(Status::cancelled("stream closed before its first message"))
            }
            Ok(Ok(Some(m))) => m,
        };
        limits::signed_node_message(&first).map_err(|e| self.too_large(e))?;
        let msg = pb::NodeMessage::decode(first.payload.as_slice()).map_err(|e| {
            self.reject(
                "invalid",
                Status::invalid_argument(format!("payload is not a NodeMessage: {e}")),
            )
        })?;
        let token = token_of(&msg.session).ok_or_else(|| {
            self.reject(
                "unknown_session",
                Status::unauthenticated("missing or malformed session token"),
            )
        })?;
        let (node, key) = self.sessions.lookup(&token).ok_or_else(|| {
            self.reject(
                "unknown_session",
                Status::unauthenticated(hanzod_protocol::status::UNKNOWN_SESSION),
            )
        })?;
        identity::verify(
            &key,
            hanzod_actors::domain::SESSION,
            &[&first.payload],
            &first.signature,
        )
        .map_err(|e| {
            self.reject(
                "bad_signature",
                Status::unauthenticated(format!("session message signature: {e}")),
            )
        })?;
        let attached = self.sessions.attach(&token).map_err(|e| match e {
            AttachError::Unknown => {
                self.reject("unknown_session", Status::unauthenticated(e.to_string()))
            }
            AttachError::Taken => {
                self.reject("session_taken", Status::already_exists(e.to_string()))
            }
        })?;
        self.metrics.incr(Counter::Sessions, "opened", 1);
        tracing::debug!(node = %node.short(), "session stream attached");
        self.core.session_opened(node);
        let Attached {
            rx,
            tx,
            out_seq,
            superseded,
            overflow,
            core_session,
            ..
        } = attached;
        // The closing status travels on a channel of its own, after whatever is queued, so
        // it reaches the node even when the queue is full.
        let (last_tx, last_rx) = tokio::sync::oneshot::channel::<Status>();
        let task = SessionTask {
            core: self.core.clone(),
            sessions: self.sessions.clone(),
            metrics: self.metrics.clone(),
            refusals: self.refusals.clone(),
            clock: self.clock.clone(),
            node,
            key,
            token,
            core_session,
            tx,
            out_seq,
            last_tx: Some(last_tx),
            stopping: self.shutdown.clone(),
            last_seq: 0,
            violations: 0,
            last_violation: Instant::now(),
            limiter: RateLimiter::direct(
                Quota::per_second(nz(self.settings.messages_per_s))
                    .allow_burst(nz(self.settings.burst)),
            ),
            settings: self.settings.clone(),
        };
        let shutdown = self.shutdown.clone();
        tokio::spawn(task.run(msg, first, inbound, superseded, overflow, shutdown));
        use futures_util::StreamExt;
        let last =
            futures_util::stream::once(last_rx).filter_map(|r| std::future::ready(r.ok().map(Err)));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx).chain(last))))
    }

    async fn upload_delta(
        &self,
        request: Request<Streaming<pb::DeltaChunk>>,
    ) -> Result<Response<pb::DeltaAck>, Status> {
        self.uploads
            .upload(request.into_inner())
            .await
            .map(Response::new)
    }

    async fn commit_delta(
        &self,
        request: Request<pb::DeltaCommitment>,
    ) -> Result<Response<pb::RoundAck>, Status> {
        self.uploads
            .commit_delta(request.into_inner())
            .await
            .map(Response::new)
    }

    async fn submit_sketch(
        &self,
        request: Request<pb::SketchSubmission>,
    ) -> Result<Response<pb::RoundAck>, Status> {
        self.uploads
            .submit_sketch(request.into_inner())
            .await
            .map(Response::new)
    }

    async fn report_reduction(
        &self,
        request: Request<pb::ReductionReport>,
    ) -> Result<Response<pb::RoundAck>, Status> {
        self.uploads
            .report_reduction(request.into_inner())
            .await
            .map(Response::new)
    }

    async fn submit_evidence(
        &self,
        request: Request<pb::RoundEvidence>,
    ) -> Result<Response<pb::RoundAck>, Status> {
        self.uploads
            .submit_evidence(request.into_inner())
            .await
            .map(Response::new)
    }

    type FetchCheckpointStream = super::upload::CheckpointStream;

    async fn fetch_checkpoint(
        &self,
        request: Request<pb::FetchCheckpointRequest>,
    ) -> Result<Response<Self::FetchCheckpointStream>, Status> {
        self.uploads
            .fetch_checkpoint(request.into_inner())
            .await
            .map(Response::new)
    }
}

/// tonic refuses an oversized message `OUT_OF_RANGE`; the gRPC specification's code for a
/// message over the configured limit is `RESOURCE_EXHAUSTED`.
fn resource_exhausted_if_too_large(status: Status) -> Status {
    if super::is_too_large(&status) {
        Status::resource_exhausted(status.message().to_string())
    } else {
        status
    }
}

fn reason_of(status: &Status) -> &'static str {
    match status.code() {
        tonic::Code::ResourceExhausted => "too_large",
        tonic::Code::InvalidArgument | tonic::Code::Internal => "invalid",
        _ => "transport",
    }
}

/// One attached session stream's inbound side.
struct SessionTask {
    core: OrchestratorHandle,
    sessions: Arc<Sessions>,
    metrics: Arc<dyn Metrics>,
    /// The service's refusal log: a flood of bad messages logs one line per reason per
    /// interval, whichever session it comes from.
    refusals: Arc<RefusalLog>,
    clock: Arc<dyn Clock>,
    node: NodeId,
    key: VerifyingKey,
    token: Token,
    core_session: u32,
    tx: mpsc::Sender<Outbound>,
    out_seq: Arc<std::sync::atomic::AtomicU64>,
    /// The closing status, sent once.
    last_tx: Option<tokio::sync::oneshot::Sender<Status>>,
    /// True once the daemon is shutting down.
    stopping: watch::Receiver<bool>,
    last_seq: u64,
    /// Refusals the node caused, forgiven after a minute without one.
    violations: u32,
    last_violation: Instant,
    limiter: DefaultDirectRateLimiter,
    settings: NodeServiceSettings,
}

/// What to do after one message.
enum Verdict {
    Continue,
    Close(Status),
}

impl SessionTask {
    async fn run(
        mut self,
        first: pb::NodeMessage,
        first_env: pb::SignedNodeMessage,
        mut inbound: Streaming<pb::SignedNodeMessage>,
        mut superseded: tokio::sync::oneshot::Receiver<()>,
        overflow: Arc<tokio::sync::Notify>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        // The first message was decoded and its signature checked while attaching.
        let mut verdict = self.accept(first, first_env.payload.len()).await;
        while let Verdict::Continue = verdict {
            verdict = tokio::select! {
                _ = &mut superseded => if *shutdown.borrow() {
                    Verdict::Close(Status::unavailable("orchestrator shutting down; reconnect later"))
                } else {
                    Verdict::Close(Status::aborted(
                        "superseded: this key registered again; this session is closed",
                    ))
                },
                _ = hanzod_protocol::status::stopped(&mut shutdown) => Verdict::Close(Status::unavailable(
                    "orchestrator shutting down; reconnect later",
                )),
                _ = overflow.notified() => {
                    self.metrics.incr(Counter::RejectedMessages, "not_reading", 1);
                    Verdict::Close(Status::resource_exhausted(
                        "this node does not read its session stream (queue full)",
                    ))
                }
                m = inbound.message() => match m {
                    Ok(Some(env)) => self.handle(env).await,
                    Ok(None) => break,
                    Err(status) => {
                        let status = resource_exhausted_if_too_large(status);
                        // A peer that vanished is not a refused message; an oversized or
                        // undecodable one is.
                        if matches!(status.code(), tonic::Code::ResourceExhausted | tonic::Code::InvalidArgument | tonic::Code::Internal) {
                            self.metrics.incr(Counter::RejectedMessages, reason_of(&status), 1);
                        }
                        Verdict::Close(status)
                    }
                },
            };
        }
        // Release the session and tell the core first: the closing status below must not
        // wait on a node that does not read.
        self.metrics.incr(Counter::Sessions, "closed", 1);
        // A session closed because this daemon is stopping is not the node's failure: a
        // standby that takes over must find the ring as it was (DESIGN §9).
        if self.sessions.close(&self.token) && !*self.stopping.borrow() {
            self.core.session_closed(self.node, self.core_session);
        }
        if let Verdict::Close(status) = verdict {
            tracing::info!(node = %self.node.short(), code = ?status.code(), "session closed: {}", status.message());
            if let Some(last) = self.last_tx.take() {
                let _ = last.send(status);
            }
        }
    }

    /// Answers a `Reject` for message `seq`, counted in `rejected_messages{reason}` and
    /// logged if the shared [`RefusalLog`] lets it through. `charged` refusals (the node's
    /// fault: rate, size, malformed, replayed, stale) count towards `max_violations`;
    /// refusals of ours (the core unavailable, a report refused, a probe answered late) do
    /// not.
    fn refuse(&mut self, seq: u64, reason: &'static str, status: Status, charged: bool) -> Verdict {
        self.metrics.incr(Counter::RejectedMessages, reason, 1);
        match self
            .refusals
            .judge(reason, status.code(), self.clock.now().as_millis())
        {
            Logged::Failure => {
                tracing::warn!(node = %self.node.short(), seq, reason, code = ?status.code(), "session message refused: {}", convert::bounded_message(status.message()))
            }
            Logged::Refusal { unlogged } => {
                tracing::info!(node = %self.node.short(), seq, reason, code = ?status.code(), unlogged, "session message refused: {}", convert::bounded_message(status.message()))
            }
            Logged::Suppressed => {}
        }
        if charged {
            if self.last_violation.elapsed() > Duration::from_secs(60) {
                self.violations = 0;
            }
            self.violations += 1;
            self.last_violation = Instant::now();
            if self.violations > self.settings.max_violations {
                return Verdict::Close(Status::resource_exhausted(format!(
                    "more than {} refused messages in this session",
                    self.settings.max_violations
                )));
            }
        }
        let out = pb::OrchestratorMessage {
            seq: self
                .out_seq
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                + 1,
            body: Some(pb::orchestrator_message::Body::Reject(pb::Reject {
                seq,
                code: status.code() as i32,
                reason: status.message().to_string(),
            })),
        };
        if self.tx.try_send(Ok(out)).is_err() {
            // The node does not read its stream: its queue is full.
            return Verdict::Close(Status::resource_exhausted("session queue full"));
        }
        Verdict::Continue
    }

    async fn handle(&mut self, env: pb::SignedNodeMessage) -> Verdict {
        if self.limiter.check().is_err() {
            return self.refuse(
                0,
                "rate_limited",
                Status::resource_exhausted(format!(
                    "more than {} messages per second",
                    self.settings.messages_per_s
                )),
                true,
            );
        }
        if let Err(e) = limits::signed_node_message(&env) {
            return self.refuse(0, "too_large", e.into(), true);
        }
        let msg = match pb::NodeMessage::decode(env.payload.as_slice()) {
            Ok(m) => m,
            Err(e) => {
                return self.refuse(
                    0,
                    "invalid",
                    Status::invalid_argument(format!("payload is not a NodeMessage: {e}")),
                    true,
                )
            }
        };
        if let Err(e) = identity::verify(
            &self.key,
            hanzod_actors::domain::SESSION,
            &[&env.payload],
            &env.signature,
        ) {
            self.metrics
                .incr(Counter::RejectedMessages, "bad_signature", 1);
            return Verdict::Close(Status::unauthenticated(format!(
                "session message signature: {e}"
            )));
        }
        if token_of(&msg.session) != Some(self.token) {
            return self.refuse(
                msg.seq,
                "replay",
                Status::failed_precondition("replay: message signed for another session"),
                true,
            );
        }
        self.accept(msg, env.payload.len()).await
    }

    /// Freshness checks and dispatch of a decoded, authenticated message.
    async fn accept(&mut self, msg: pb::NodeMessage, _bytes: usize) -> Verdict {
        if msg.seq <= self.last_seq {
            return self.refuse(
                msg.seq,
                "replay",
                Status::failed_precondition(format!(
                    "replay: seq {} is not above {}",
                    msg.seq, self.last_seq
                )),
                true,
            );
        }
        let now = self.clock.now().as_millis();
        let skew = msg.timestamp_ms as i128 - now as i128;
        if skew.unsigned_abs() > self.settings.replay_window_ms as u128 {
            return self.refuse(
                msg.seq,
                "outside_window",
                Status::failed_precondition(format!(
                    "timestamp is {skew} ms from the orchestrator's clock (window ±{} ms)",
                    self.settings.replay_window_ms
                )),
                true,
            );
        }
        self.last_seq = msg.seq;
        use pb::node_message::Body;
        match msg.body {
            None => self.refuse(
                msg.seq,
                "invalid",
                Status::invalid_argument("empty message body"),
                true,
            ),
            Some(Body::Heartbeat(hb)) => {
                let hb = match convert::heartbeat(self.node, msg.seq, msg.timestamp_ms, &hb) {
                    Ok(hb) => hb,
                    Err(e) => return self.refuse(msg.seq, "invalid", e.into(), true),
                };
                // A heartbeat of a session already replaced must not reach the core: the
                // new session restarted the node's sequence numbers there.
                if !self.sessions.is_current(&self.token) {
                    return Verdict::Close(if *self.stopping.borrow() {
                        // Shutdown empties the table too: that is not a replacement.
                        Status::unavailable("orchestrator shutting down; reconnect later")
                    } else {
                        Status::aborted(
                            "superseded: this key registered again; this session is closed",
                        )
                    });
                }
                let started = Instant::now();
                let r = self.core.heartbeat(hb).await;
                self.metrics.observe(
                    Histogram::HeartbeatHandlingSeconds,
                    started.elapsed().as_secs_f64(),
                );
                match r {
                    Ok(_) => {
                        self.metrics.incr(Counter::SessionMessages, "heartbeat", 1);
                        Verdict::Continue
                    }
                    Err(OrchestratorError::Heartbeat(HeartbeatError::Failed)) => {
                        Verdict::Close(Status::failed_precondition(
                            "this node was declared failed; register again",
                        ))
                    }
                    Err(OrchestratorError::Heartbeat(HeartbeatError::UnknownNode)) => {
                        Verdict::Close(Status::not_found("node is not registered; register again"))
                    }
                    Err(e) => {
                        let reason = match &e {
                            OrchestratorError::Heartbeat(h) => h.reason(),
                            _ => "unavailable",
                        };
                        let charged = matches!(
                            e,
                            OrchestratorError::Heartbeat(HeartbeatError::Invalid { .. })
                        );
                        self.refuse(msg.seq, reason, status_of(&e), charged)
                    }
                }
            }
            Some(Body::ProbeResult(p)) => {
                let peer = match convert::node_id("probe_result.peer", &p.peer) {
                    Ok(p) => p,
                    Err(e) => return self.refuse(msg.seq, "invalid", e.into(), true),
                };
                if !self.sessions.take_probe(p.probe_id, self.node, peer) {
                    return self.refuse(
                        msg.seq,
                        "unknown_probe",
                        Status::not_found(format!(
                            "no outstanding probe request {} to {}",
                            p.probe_id,
                            peer.short()
                        )),
                        false,
                    );
                }
                self.metrics
                    .incr(Counter::SessionMessages, "probe_result", 1);
                if !p.error.is_empty() {
                    tracing::info!(node = %self.node.short(), peer = %peer.short(), "probe failed: {}", convert::excerpt(p.error.as_bytes()));
                    return Verdict::Continue;
                }
                if !(p.mbps.is_finite() && p.mbps >= 0.0) {
                    return self.refuse(
                        msg.seq,
                        "invalid",
                        Status::invalid_argument(format!(
                            "probe_result.mbps {} is not ≥ 0",
                            p.mbps
                        )),
                        true,
                    );
                }
                match self.core.report_link(self.node, peer, p.mbps).await {
                    Ok(()) => Verdict::Continue,
                    Err(e) => self.refuse(msg.seq, "report_refused", status_of(&e), false),
                }
            }
            Some(Body::RingAck(a)) => {
                self.metrics.incr(Counter::SessionMessages, "ring_ack", 1);
                tracing::debug!(node = %self.node.short(), job = a.job_id, version = a.version, "ring applied");
                Verdict::Continue
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::rate_key;
    use hanzod_proto::v1 as pb;
    use hanzod_protocol::limits::*;
    use prost::Message;
    use std::net::IpAddr;

    /// The limits of encoded messages are derived from their fields: the longest valid
    /// `NodeInfo` and `NodeMessage` (every field at its bound, varints at their longest)
    /// encode to exactly the derived sizes (which the limits round up: a const assertion in
    /// `limits`), and a valid registration passes the limits.
    #[test]
    fn the_longest_valid_messages_encode_to_the_derived_sizes() {
        let info = pb::NodeInfo {
            node_id: vec![1; NODE_ID_BYTES],
            gpu: Some(pb::GpuInfo {
                model: "m".repeat(MAX_GPU_MODEL_BYTES),
                vram_bytes: u64::MAX,
                compute_cap_major: u32::MAX,
                compute_cap_minor: u32::MAX,
                driver_sig: vec![2; MAX_DRIVER_SIG_BYTES],
            }),
            bandwidth: Some(pb::BandwidthProbe {
                up_mbps: 1.0,
                down_mbps: 1.0,
            }),
            region: "r".repeat(MAX_REGION_BYTES),
            endpoint: format!("{}:9", "h".repeat(MAX_ENDPOINT_BYTES - 2)),
        };
        assert_eq!(info.encoded_len(), NODE_INFO_ENCODED_MAX);
        let probe = pb::NodeMessage {
            session: vec![3; SESSION_TOKEN_BYTES],
            seq: u64::MAX,
            timestamp_ms: u64::MAX,
            body: Some(pb::node_message::Body::ProbeResult(pb::ProbeResult {
                probe_id: u64::MAX,
                peer: vec![4; NODE_ID_BYTES],
                mbps: 1.0,
                bytes: u64::MAX,
                elapsed_us: u64::MAX,
                error: "e".repeat(MAX_PROBE_ERROR_BYTES),
            })),
        };
        assert_eq!(probe.encoded_len(), NODE_MESSAGE_ENCODED_MAX);
        // The other bodies are smaller.
        for body in [
            pb::node_message::Body::Heartbeat(pb::Heartbeat {
                gpu_utilization: 1.0,
                memory_used: u64::MAX,
                current_step: u64::MAX,
            }),
            pb::node_message::Body::RingAck(pb::RingAck {
                job_id: u64::MAX,
                version: u64::MAX,
            }),
        ] {
            let m = pb::NodeMessage {
                body: Some(body),
                ..probe.clone()
            };
            assert!(m.encoded_len() < NODE_MESSAGE_ENCODED_MAX, "{m:?}");
        }
        // A valid registration passes the limits whole.
        let req = pb::RegisterRequest {
            info: info.encode_to_vec(),
            nonce: vec![5; NONCE_BYTES],
            signature: vec![6; SIGNATURE_BYTES],
        };
        assert_eq!(register(&req), Ok(()));
    }

    #[test]
    fn ipv6_addresses_share_their_slash_64_budget_and_ipv4_keep_their_own() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff:1:2:3".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(rate_key(a), rate_key(b));
        assert_ne!(rate_key(a), rate_key(c));
        assert_eq!(rate_key(a), "2001:db8:1:2::".parse::<IpAddr>().unwrap());
        let v4: IpAddr = "10.0.0.7".parse().unwrap();
        assert_eq!(rate_key(v4), v4);
        assert_ne!(rate_key(v4), rate_key("10.0.0.8".parse().unwrap()));
        // IPv4 clients seen by a dual-stack listener keep their own budgets.
        let mapped: IpAddr = "::ffff:10.0.0.7".parse().unwrap();
        assert_eq!(rate_key(mapped), v4);
        assert_ne!(
            rate_key(mapped),
            rate_key("::ffff:10.0.0.8".parse().unwrap())
        );
    }
}
