//! The event log's vocabulary. Every accepted fact is one [`Event`]; actor state is a fold
//! over the log (paper §1.1, DESIGN §9), so a restarted actor or a standby orchestrator
//! replays it and resumes where the old one stood.

use serde::{Deserialize, Serialize};

use crate::job::{JobEvent, JobSpec};
use crate::types::{DeltaReceipt, RingView};
use crate::types::{GymWei, JobId, NodeId, NodeInfo, Timestamp};

/// Why a node was declared failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailureKind {
    /// No heartbeat within the timeout (30 s by default).
    HeartbeatTimeout,
    /// The node's session (gRPC stream) closed.
    SessionClosed,
    /// The actor tracking the node crashed; the node is treated as failed until it re-registers.
    ActorCrashed,
}

impl FailureKind {
    /// A short snake_case label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            FailureKind::HeartbeatTimeout => "heartbeat_timeout",
            FailureKind::SessionClosed => "session_closed",
            FailureKind::ActorCrashed => "actor_crashed",
        }
    }
}

impl std::fmt::Display for FailureKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FailureKind::HeartbeatTimeout => "heartbeat timeout",
            FailureKind::SessionClosed => "session closed",
            FailureKind::ActorCrashed => "node actor crashed",
        })
    }
}

/// One fact accepted by the orchestrator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Event {
    /// A node was admitted (or re-admitted: a later registration of the same key replaces
    /// the info and opens a new heartbeat session).
    NodeRegistered {
        /// What the node declared.
        info: NodeInfo,
        /// Its stake read from the chain at admission, in GYM wei.
        stake: GymWei,
        /// Its active slashing penalty read at admission, if any.
        #[serde(default)]
        penalty_until: Option<Timestamp>,
    },
    /// A node's standing changed on chain, as read at an epoch boundary (DESIGN §3,
    /// "Standing"): its stake and penalty from now on.
    NodeStanding {
        /// The node.
        node: NodeId,
        /// Its operator's stake, in GYM wei.
        stake: GymWei,
        /// The end of its latest slashing penalty, if any (ms since the Unix epoch).
        penalty_until: Option<Timestamp>,
    },
    /// A node was declared failed.
    NodeFailed {
        /// The node.
        node: NodeId,
        /// Why.
        kind: FailureKind,
    },
    /// A link measurement reported by a node's probe.
    LinkMeasured {
        /// Sender side.
        from: NodeId,
        /// Receiver side.
        to: NodeId,
        /// Measured Mbit/s.
        mbps: f32,
    },
    /// A job was accepted.
    JobSubmitted {
        /// Its id.
        job: JobId,
        /// Its spec (boxed: the largest event by far).
        spec: Box<JobSpec>,
        /// The checkpoints (CIDs) of the epochs already published, in epoch order, when
        /// the job is resumed rather than new: a job rebuilt from the chain's publication
        /// records by an orchestrator that lost its state store (paper §10, "full node
        /// failure"; `hanzod::chain::recovery`). It trains from epoch `resumed.len()`.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        resumed: Vec<String>,
    },
    /// The scheduler gave nodes to a pending job.
    JobPlaced {
        /// The job.
        job: JobId,
        /// The nodes, unordered.
        nodes: Vec<NodeId>,
    },
    /// A job state machine transition (paper §3.1).
    Job {
        /// The job.
        job: JobId,
        /// The transition.
        event: JobEvent,
    },
    /// The scheduler gave standbys to a job's ring (before the ring that uses them is
    /// recorded), so a rebuilt scheduler does not give them to another job.
    StandbysGranted {
        /// The job.
        job: JobId,
        /// The standbys.
        nodes: Vec<NodeId>,
    },
    /// A ring was formed (version 1) or reconfigured (paper Algorithms 1 and 2).
    RingChanged {
        /// The new ring.
        ring: RingView,
        /// Members removed in this change: failed, or out of standing (DESIGN §3).
        removed: Vec<NodeId>,
        /// Standbys inserted in this change.
        added: Vec<NodeId>,
    },
    /// A node's delta for an epoch was accepted.
    DeltaAccepted(DeltaReceipt),
    /// A ring epoch's round was accepted (or every member excluded), recorded before the
    /// epoch completes so a rebuilt job actor publishes the same result (DESIGN §6.4).
    RingAccepted {
        /// The job.
        job: JobId,
        /// The epoch.
        epoch: u32,
        /// The round.
        result: crate::aggregation::RingResult,
    },
}

impl Event {
    /// The job this event concerns, if any.
    pub fn job(&self) -> Option<JobId> {
        match self {
            Event::JobSubmitted { job, .. }
            | Event::JobPlaced { job, .. }
            | Event::StandbysGranted { job, .. }
            | Event::Job { job, .. } => Some(*job),
            Event::RingChanged { ring, .. } => Some(ring.job),
            Event::DeltaAccepted(r) => Some(r.job),
            Event::RingAccepted { job, .. } => Some(*job),
            _ => None,
        }
    }
}

/// An event with its position in the log and the time it was accepted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// 1-based, gapless.
    pub seq: u64,
    /// When it was accepted.
    pub at: Timestamp,
    /// The event.
    pub event: Event,
}
