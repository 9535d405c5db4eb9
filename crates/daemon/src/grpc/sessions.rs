//! The session table: one entry per node with a live registration, and the [`NodeLink`]
//! adapter that delivers the core's commands on the nodes' session streams.
//!
//! The table is the transport's routing state, not actor state: the core never reads it.
//! Critical sections are a hash lookup and a non-blocking channel send.

use hanzod_actors::ports::Counter;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use ed25519_dalek::VerifyingKey;
use hanzod_actors::ports::{LinkError, Metrics, NodeCommand, NodeLink, RoundUpload};
use hanzod_actors::types::NodeId;
use hanzod_proto::v1 as pb;
use tokio::sync::{mpsc, oneshot, Notify};
use tonic::Status;

use hanzod_protocol::convert;

/// What a session stream yields to the node.
pub type Outbound = Result<pb::OrchestratorMessage, Status>;

/// A 16-byte session token.
pub type Token = [u8; 16];

struct Slot {
    token: Token,
    core_session: u32,
    key: VerifyingKey,
    endpoint: String,
    tx: mpsc::Sender<Outbound>,
    rx: Option<mpsc::Receiver<Outbound>>,
    out_seq: Arc<AtomicU64>,
    /// Dropped when the slot is replaced: the attached stream then ends ABORTED.
    _superseded: oneshot::Sender<()>,
    superseded_rx: Option<oneshot::Receiver<()>>,
    /// Notified when the node's queue overflows (it does not read its stream).
    overflow: Arc<Notify>,
}

#[derive(Debug, Clone, Copy)]
struct Probe {
    from: NodeId,
    to: NodeId,
    sent: Instant,
}

#[derive(Default)]
struct Inner {
    by_node: HashMap<NodeId, Slot>,
    by_token: HashMap<Token, NodeId>,
    /// Outstanding probe requests by id; ids grow with time, so the oldest come first.
    probes: std::collections::BTreeMap<u64, Probe>,
    next_probe: u64,
}

/// What a stream gets when it attaches to its session.
pub struct Attached {
    /// The node.
    pub node: NodeId,
    /// The core's session number (for `session_closed`).
    pub core_session: u32,
    /// The node's key.
    pub key: VerifyingKey,
    /// Messages for the node (the response stream).
    pub rx: mpsc::Receiver<Outbound>,
    /// A sender into the same stream, for rejections and the closing status.
    pub tx: mpsc::Sender<Outbound>,
    /// Numbers outgoing messages.
    pub out_seq: Arc<AtomicU64>,
    /// Resolves (with an error) when a newer registration replaced this session.
    pub superseded: oneshot::Receiver<()>,
    /// Notified when the node's queue overflowed: the session must end.
    pub overflow: Arc<Notify>,
}

/// Why a stream could not attach.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttachError {
    /// No live registration has this token (never issued, replaced or closed).
    #[error("{}", hanzod_protocol::status::UNKNOWN_SESSION)]
    Unknown,
    /// Another stream already serves this session.
    #[error("session already has a stream; register again to open a new one")]
    Taken,
}

/// The session table (shared by the NodeService and the [`GrpcNodeLink`]).
pub struct Sessions {
    inner: Mutex<Inner>,
    queue: usize,
    probe_bytes: u64,
    probe_ttl_ms: u64,
    metrics: Arc<dyn Metrics>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("queue", &self.queue)
            .finish()
    }
}

impl Sessions {
    /// A table whose streams buffer `queue` messages per node; probe requests ask for
    /// `probe_bytes` bytes and are answerable for `probe_ttl_ms`.
    pub fn new(
        queue: usize,
        probe_bytes: u64,
        probe_ttl_ms: u64,
        metrics: Arc<dyn Metrics>,
    ) -> Self {
        Sessions {
            inner: Mutex::new(Inner::default()),
            queue: queue.max(1),
            probe_bytes,
            probe_ttl_ms,
            metrics,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding this lock cannot leave it inconsistent (every critical
        // section is a few map operations), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens a session for a node just registered as the core's session `core_session`;
    /// replaces (and thereby closes) the node's previous session. Returns the new token, or
    /// `None` when the table already holds a newer registration of the node (two
    /// registrations raced and this one lost: the caller answers `ABORTED`).
    pub fn open(
        &self,
        node: NodeId,
        core_session: u32,
        key: VerifyingKey,
        endpoint: String,
    ) -> Option<Token> {
        let token: Token = rand::random();
        let (tx, rx) = mpsc::channel(self.queue);
        let (sup_tx, sup_rx) = oneshot::channel();
        let slot = Slot {
            token,
            core_session,
            key,
            endpoint,
            tx,
            rx: Some(rx),
            out_seq: Arc::new(AtomicU64::new(0)),
            _superseded: sup_tx,
            superseded_rx: Some(sup_rx),
            overflow: Arc::new(Notify::new()),
        };
        let mut g = self.lock();
        if g.by_node
            .get(&node)
            .is_some_and(|old| old.core_session > core_session)
        {
            return None;
        }
        if let Some(old) = g.by_node.insert(node, slot) {
            g.by_token.remove(&old.token);
        }
        g.by_token.insert(token, node);
        Some(token)
    }

    /// True while `token` is its node's current session.
    pub fn is_current(&self, token: &Token) -> bool {
        self.lock().by_token.contains_key(token)
    }

    /// Removes the session `token` if no stream ever attached to it; returns whether it did
    /// (the node registered but never opened its session).
    pub fn close_if_unattached(&self, token: &Token) -> bool {
        let mut g = self.lock();
        let Some(node) = g.by_token.get(token).copied() else {
            return false;
        };
        if g.by_node.get(&node).is_some_and(|s| s.rx.is_some()) {
            g.by_token.remove(token);
            g.by_node.remove(&node);
            return true;
        }
        false
    }

    /// The node and key a token names, if live.
    pub fn lookup(&self, token: &Token) -> Option<(NodeId, VerifyingKey)> {
        let g = self.lock();
        let node = g.by_token.get(token)?;
        g.by_node.get(node).map(|s| (*node, s.key))
    }

    /// [`Sessions::lookup`] of a token as it arrives on the wire: `None` when it is not 16
    /// bytes or not a live session.
    pub fn lookup_bytes(&self, token: &[u8]) -> Option<(NodeId, VerifyingKey)> {
        self.lookup(&<[u8; 16]>::try_from(token).ok()?)
    }

    /// Attaches the calling stream to the session `token` (once per session).
    pub fn attach(&self, token: &Token) -> Result<Attached, AttachError> {
        let mut g = self.lock();
        let node = *g.by_token.get(token).ok_or(AttachError::Unknown)?;
        let slot = g.by_node.get_mut(&node).ok_or(AttachError::Unknown)?;
        let rx = slot.rx.take().ok_or(AttachError::Taken)?;
        let superseded = slot.superseded_rx.take().ok_or(AttachError::Taken)?;
        Ok(Attached {
            node,
            core_session: slot.core_session,
            key: slot.key,
            rx,
            tx: slot.tx.clone(),
            out_seq: slot.out_seq.clone(),
            superseded,
            overflow: slot.overflow.clone(),
        })
    }

    /// Removes the session `token` if it is still the node's current one (a replaced
    /// session's close must not remove its successor). Returns whether it was.
    pub fn close(&self, token: &Token) -> bool {
        let mut g = self.lock();
        let Some(node) = g.by_token.remove(token) else {
            return false;
        };
        g.by_node.remove(&node);
        true
    }

    /// Closes every session (shutdown): the attached streams' tasks see their sessions
    /// end and close them with the shutdown status.
    pub fn close_all(&self) {
        let mut g = self.lock();
        g.by_node.clear();
        g.by_token.clear();
        g.probes.clear();
    }

    /// The peer endpoint of a node with a live session ("" when none).
    pub fn endpoint(&self, node: &NodeId) -> String {
        self.lock()
            .by_node
            .get(node)
            .map(|s| s.endpoint.clone())
            .unwrap_or_default()
    }

    /// Every live session's endpoint.
    pub fn endpoints(&self) -> HashMap<NodeId, String> {
        self.lock()
            .by_node
            .iter()
            .map(|(n, s)| (*n, s.endpoint.clone()))
            .collect()
    }

    /// Number of live sessions.
    pub fn len(&self) -> usize {
        self.lock().by_node.len()
    }

    /// True when no session is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Claims the answer to probe `probe_id` sent to `from` about `to`: true once, if the
    /// probe was asked for and has not expired.
    pub fn take_probe(&self, probe_id: u64, from: NodeId, to: NodeId) -> bool {
        let mut g = self.lock();
        match g.probes.get(&probe_id) {
            Some(p) if p.from == from && p.to == to => {
                let fresh = p.sent.elapsed().as_millis() as u64 <= self.probe_ttl_ms;
                g.probes.remove(&probe_id);
                fresh
            }
            _ => false,
        }
    }

    fn deliver(&self, node: &NodeId, command: NodeCommand) -> Result<(), LinkError> {
        let mut g = self.lock();
        let body = match command {
            NodeCommand::RingUpdate(view) => {
                let ring = convert::ring(&view, |m| {
                    g.by_node
                        .get(m)
                        .map(|s| s.endpoint.clone())
                        .unwrap_or_default()
                });
                pb::orchestrator_message::Body::RingUpdate(pb::RingUpdate { ring: Some(ring) })
            }
            NodeCommand::Release { job } => {
                pb::orchestrator_message::Body::Release(pb::Release { job_id: job.0 })
            }
            NodeCommand::EpochStart(a) => {
                pb::orchestrator_message::Body::EpochStart(convert::epoch_start_to_wire(&a))
            }
            NodeCommand::SketchRequest {
                job,
                epoch,
                seed,
                rows,
                upload_delta,
                check,
            } => pb::orchestrator_message::Body::SketchRequest(pb::SketchRequest {
                job_id: job.0,
                epoch,
                seed: seed.to_vec(),
                rows,
                upload_delta,
                check: check.is_some(),
                ring_version: check.unwrap_or(0),
            }),
            NodeCommand::ReduceStart {
                job,
                epoch,
                version,
                members,
                bottleneck_mbps,
            } => pb::orchestrator_message::Body::ReduceStart(pb::ReduceStart {
                job_id: job.0,
                epoch,
                ring_version: version,
                members: members
                    .into_iter()
                    .map(|(n, weight)| pb::RoundMember {
                        node_id: n.0.to_vec(),
                        endpoint: g
                            .by_node
                            .get(&n)
                            .map(|s| s.endpoint.clone())
                            .unwrap_or_default(),
                        weight,
                    })
                    .collect(),
                bottleneck_mbps,
            }),
            NodeCommand::UploadRequest {
                job,
                epoch,
                version,
                kind,
                reason,
            } => pb::orchestrator_message::Body::UploadRequest(pb::UploadRequest {
                job_id: job.0,
                epoch,
                ring_version: version,
                kind: match kind {
                    RoundUpload::Delta => pb::upload_request::Kind::Delta,
                    RoundUpload::Merged => pb::upload_request::Kind::Merged,
                    RoundUpload::Evidence => pb::upload_request::Kind::Evidence,
                } as i32,
                reason,
            }),
            NodeCommand::ProbeRequest { peer } => {
                let peer_endpoint = g
                    .by_node
                    .get(&peer)
                    .map(|s| s.endpoint.clone())
                    .ok_or(LinkError::NotConnected(peer))?;
                // Forget probes nobody answered in time: the oldest are first, so this
                // is amortised O(1) per request.
                let ttl = self.probe_ttl_ms;
                while let Some(entry) = g.probes.first_entry() {
                    if entry.get().sent.elapsed().as_millis() as u64 > ttl {
                        entry.remove();
                    } else {
                        break;
                    }
                }
                g.next_probe += 1;
                let probe_id = g.next_probe;
                g.probes.insert(
                    probe_id,
                    Probe {
                        from: *node,
                        to: peer,
                        sent: Instant::now(),
                    },
                );
                pb::orchestrator_message::Body::ProbeRequest(pb::ProbeRequest {
                    probe_id,
                    peer: peer.0.to_vec(),
                    peer_endpoint,
                    bytes: self.probe_bytes,
                })
            }
        };
        let slot = g.by_node.get(node).ok_or(LinkError::NotConnected(*node))?;
        let seq = slot.out_seq.fetch_add(1, Ordering::Relaxed) + 1;
        let msg = pb::OrchestratorMessage {
            seq,
            body: Some(body),
        };
        slot.tx.try_send(Ok(msg)).map_err(|e| LinkError::Delivery {
            node: *node,
            reason: match e {
                mpsc::error::TrySendError::Full(_) => {
                    // A node that does not read its stream would silently miss ring
                    // updates while its heartbeats keep it alive: end its session.
                    slot.overflow.notify_one();
                    "session queue full; closing the session".into()
                }
                mpsc::error::TrySendError::Closed(_) => "session stream closed".into(),
            },
        })
    }
}

/// The [`NodeLink`] of the daemon: commands go out on the nodes' session streams.
#[derive(Debug, Clone)]
pub struct GrpcNodeLink(pub Arc<Sessions>);

#[async_trait]
impl NodeLink for GrpcNodeLink {
    async fn send(&self, node: &NodeId, command: NodeCommand) -> Result<(), LinkError> {
        let kind = match &command {
            NodeCommand::RingUpdate(_) => "ring_update",
            NodeCommand::Release { .. } => "release",
            NodeCommand::ProbeRequest { .. } => "probe_request",
            NodeCommand::EpochStart(_) => "epoch_start",
            NodeCommand::SketchRequest { .. } => "sketch_request",
            NodeCommand::ReduceStart { .. } => "reduce_start",
            NodeCommand::UploadRequest { .. } => "upload_request",
        };
        let r = self.0.deliver(node, command);
        let outcome = if r.is_ok() { kind } else { "undeliverable" };
        self.0.metrics.incr(Counter::SessionMessagesOut, outcome, 1);
        r
    }
}
