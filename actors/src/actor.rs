//! The supervised actors: thin shells around the pure cores.
//!
//! ```text
//! Orchestrator (root supervisor; routes every cross-subsystem message, so a restarted child
//! │             is reachable at once; owns the ports through Deps)
//! ├── NodeRegistry ── NodeActor per registered node (heartbeat watchdog, uptime)
//! ├── Scheduler (pending queue, node allocation, standbys)
//! └── JobSupervisor ── JobActor per job ── RingActor per job ring
//! ```
//!
//! - Every supervisor overrides `handle_supervisor_evt` and keeps its children in one
//!   [`children::Children`] map: the failed child's actor id maps back to the key it is
//!   rebuilt from, which is rebuilt after a backoff unless its [`RestartBudget`] is spent.
//! - A NodeActor that fails is a node failure for its ring. A JobActor or RingActor that
//!   fails is rebuilt from the event log ([`crate::replay`]) with nothing lost.
//! - Actors share no mutable state: they own their state and talk by typed messages; the
//!   ports in [`Deps`] are thread-safe adapters, not state of any actor. Every call carries a
//!   deadline ([`CoreConfig::call_timeout_ms`]).
//! - Actors are spawned without names, so two orchestrators in one process never collide.
//!
//! [`RestartBudget`]: crate::supervision::RestartBudget
//! [`CoreConfig::call_timeout_ms`]: crate::config::CoreConfig

pub mod children;
pub mod job;
pub mod jobs;
pub mod msg;
pub mod node;
pub mod orchestrator;
pub mod registry;
pub mod ring;
pub mod scheduler;
mod standing;

use std::sync::Arc;
use std::time::Duration;

use ractor::rpc::CallResult;
use ractor::{ActorRef, RpcReplyPort};
use serde::Serialize;
use tokio::sync::broadcast;

use crate::config::CoreConfig;
use crate::events::{Event, FailureKind};
use crate::job::JobPhase;
use crate::ports::{
    ChainReader, CheckpointSink, Clock, Metrics, NodeLink, RingView, StateStore, StoreError,
};
use crate::ring::RingBuilder;
use crate::sched::SchedulingPolicy;
use crate::types::{JobId, NodeId, Timestamp};

use self::msg::OrchestratorMsg;

/// Something observable that happened, broadcast to watchers (CLI `watch`, tests, metrics).
/// Watchers that fall behind lose old notices; the event log remains the source of truth.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum Notice {
    /// A node was admitted (first time or again).
    NodeRegistered {
        /// The node.
        node: NodeId,
    },
    /// A node was declared failed.
    NodeFailed {
        /// The node.
        node: NodeId,
        /// Why.
        kind: FailureKind,
        /// When.
        at: Timestamp,
    },
    /// A job entered a new phase.
    JobPhase {
        /// The job.
        job: JobId,
        /// Its new phase.
        phase: JobPhase,
    },
    /// A ring was formed or reconfigured.
    RingChanged {
        /// The new ring.
        ring: RingView,
        /// Members removed as failed.
        removed: Vec<NodeId>,
        /// Standbys inserted.
        added: Vec<NodeId>,
        /// For a repair: ms from the first failure this ring repairs to its being recorded
        /// (a lone failure is applied at once; one held by an open coalescing window waits
        /// up to the window); `None` for a first ring.
        repair_ms: Option<u64>,
    },
    /// A supervisor rebuilt a failed child.
    ActorRestarted {
        /// Which child, e.g. `ring job-3`.
        what: String,
    },
}

/// The ports and policies every actor may use. Immutable once built; cloning is cheap.
#[derive(Clone)]
pub struct Deps {
    /// The event log.
    pub store: Arc<dyn StateStore>,
    /// Time.
    pub clock: Arc<dyn Clock>,
    /// Stakes and penalties.
    pub chain: Arc<dyn ChainReader>,
    /// Commands to nodes.
    pub link: Arc<dyn NodeLink>,
    /// Validate, merge, publish.
    pub sink: Arc<dyn CheckpointSink>,
    /// The ring construction policy.
    pub ring_builder: Arc<dyn RingBuilder>,
    /// The scheduling policy.
    pub policy: Arc<dyn SchedulingPolicy>,
    /// Counters and timings.
    pub metrics: Arc<dyn Metrics>,
    /// Settings.
    pub cfg: Arc<CoreConfig>,
    /// Observers.
    pub notices: broadcast::Sender<Notice>,
}

impl std::fmt::Debug for Deps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deps")
            .field("ring_builder", &self.ring_builder.name())
            .field("policy", &self.policy.name())
            .finish_non_exhaustive()
    }
}

impl Deps {
    /// Now, from the injected clock.
    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// The call deadline.
    pub fn call_timeout(&self) -> Duration {
        Duration::from_millis(self.cfg.call_timeout_ms)
    }

    /// Appends `event`, retrying an unavailable store up to three times with a short backoff,
    /// under one event id so a late attempt is not recorded twice
    /// ([`StateStore::append_once`]). Returns its sequence number once durable.
    pub async fn persist(&self, event: Event) -> Result<u64, StoreError> {
        self.persist_once(rand::random(), event).await
    }

    /// [`Deps::persist`] under the caller's event `id`: an event recorded under it already
    /// (by an earlier call whose outcome was lost) is not recorded again.
    pub async fn persist_once(&self, id: u128, event: Event) -> Result<u64, StoreError> {
        let mut delay = Duration::from_millis(20);
        let mut attempt = 0;
        loop {
            match self.store.append_once(id, self.now(), event.clone()).await {
                Ok(seq) => return Ok(seq),
                Err(StoreError::Unavailable { message: reason }) if attempt < 3 => {
                    tracing::warn!(%reason, attempt, "state store unavailable; retrying append");
                    tokio::time::sleep(delay).await;
                    delay *= 4;
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Broadcasts a notice (no receiver is fine).
    pub fn notify(&self, notice: Notice) {
        let _ = self.notices.send(notice);
    }
}

/// Why an actor-to-actor call failed (or, [`CallError::Start`], the actor tree could not
/// be started to take calls).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The callee did not answer within the deadline.
    #[error("no answer within {0} ms")]
    Timeout(u64),
    /// The callee took the call and dropped its reply (it failed while handling it).
    #[error("actor unavailable: reply dropped")]
    ReplyDropped,
    /// The callee is not running (stopped, or being rebuilt): its mailbox refused the call.
    #[error("actor unavailable: {message}")]
    Unavailable {
        /// What ractor said (its error is not `Clone`).
        message: String,
    },
    /// The actor tree could not be spawned.
    #[error("start: {message}")]
    Start {
        /// What ractor said (its error is not `Clone`).
        message: String,
    },
}

/// Calls through the root router with the configured deadline.
pub(crate) async fn ask<T: Send + 'static>(
    root: &ActorRef<OrchestratorMsg>,
    deps: &Deps,
    build: impl FnOnce(RpcReplyPort<T>) -> OrchestratorMsg,
) -> Result<T, CallError> {
    ask_with(root, deps.cfg.call_timeout_ms, build).await
}

/// Calls `actor` with a deadline of `timeout_ms`.
pub(crate) async fn ask_with<M: ractor::Message, T: Send + 'static>(
    actor: &ActorRef<M>,
    timeout_ms: u64,
    build: impl FnOnce(RpcReplyPort<T>) -> M,
) -> Result<T, CallError> {
    match actor
        .call(build, Some(Duration::from_millis(timeout_ms)))
        .await
    {
        Ok(CallResult::Success(v)) => Ok(v),
        Ok(CallResult::Timeout) => Err(CallError::Timeout(timeout_ms)),
        Ok(CallResult::SenderError) => Err(CallError::ReplyDropped),
        Err(e) => Err(CallError::Unavailable {
            message: e.to_string(),
        }),
    }
}

/// Replies on `reply` unless the caller has gone away (timed out).
pub(crate) fn answer<T: Send + 'static>(reply: RpcReplyPort<T>, value: T) {
    if !reply.is_closed() {
        let _ = reply.send(value);
    }
}
