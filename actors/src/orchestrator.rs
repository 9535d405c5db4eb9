//! The library entry point: [`Orchestrator::builder`] → [`OrchestratorBuilder::start`] →
//! [`OrchestratorHandle`].
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use hanzod_actors::orchestrator::Orchestrator;
//! let orch = Orchestrator::builder().start().await?;
//! let nodes = orch.nodes().await?;
//! assert!(nodes.is_empty());
//! orch.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! Everything an orchestrator holds lives inside its actors and the ports given to the
//! builder; nothing is process-global, so several orchestrators can run in one process.

use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorRef, ActorStatus, RpcReplyPort};
use tokio::sync::broadcast;

use crate::actor::job::{JobRequestError, JobView};
use crate::actor::jobs::{JobSupervisorMsg, SubmitError};
pub use crate::actor::orchestrator::Subsystem;
use crate::actor::orchestrator::{OrchestratorActor, OrchestratorMsg};
use crate::actor::registry::{RegisterError, Registration, RegistryMsg};
use crate::actor::scheduler::SchedulerMsg;
use crate::actor::{ask_with, CallError, Deps, Notice};
use crate::config::{CoreConfig, RingBuilderKind};
use crate::job::JobSpec;
use crate::node::{Heartbeat, HeartbeatError};
use crate::ports::memory::{
    ChannelNodeLink, MemoryChain, MemoryCheckpointSink, MemoryMetrics, MemoryStateStore, TokioClock,
};
use crate::ports::{
    ChainReader, CheckpointSink, Clock, DeltaReceipt, Metrics, NodeLink, RingView, StateStore,
};
use crate::ring::{Algorithm1, RingBuilder, ThresholdRingBuilder};
use crate::sched::{AgingPolicy, NodeView, SchedulingPolicy};
use crate::types::{JobId, NodeId, NodeInfo};

/// Namespace of the entry point.
pub struct Orchestrator;

impl Orchestrator {
    /// A builder with the embedded defaults: in-memory state store, ledger, node link and
    /// checkpoint sink; tokio clock; the configured ring builder; aging scheduling.
    pub fn builder() -> OrchestratorBuilder {
        OrchestratorBuilder::default()
    }
}

/// Builds an orchestrator; every port and policy may be replaced.
#[derive(Default)]
pub struct OrchestratorBuilder {
    cfg: CoreConfig,
    store: Option<Arc<dyn StateStore>>,
    clock: Option<Arc<dyn Clock>>,
    chain: Option<Arc<dyn ChainReader>>,
    link: Option<Arc<dyn NodeLink>>,
    sink: Option<Arc<dyn CheckpointSink>>,
    metrics: Option<Arc<dyn Metrics>>,
    ring_builder: Option<Arc<dyn RingBuilder>>,
    policy: Option<Arc<dyn SchedulingPolicy>>,
}

impl OrchestratorBuilder {
    /// Settings (default: [`CoreConfig::default`]).
    pub fn config(mut self, cfg: CoreConfig) -> Self {
        self.cfg = cfg;
        self
    }
    /// The event log (default: a fresh [`MemoryStateStore`]).
    pub fn state_store(mut self, store: Arc<dyn StateStore>) -> Self {
        self.store = Some(store);
        self
    }
    /// The clock (default: [`TokioClock`], which follows paused tokio time).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }
    /// The chain reader (default: an empty [`MemoryChain`]: every node is unbound).
    pub fn chain(mut self, chain: Arc<dyn ChainReader>) -> Self {
        self.chain = Some(chain);
        self
    }
    /// The node link (default: a [`ChannelNodeLink`] nobody is connected to).
    pub fn node_link(mut self, link: Arc<dyn NodeLink>) -> Self {
        self.link = Some(link);
        self
    }
    /// The checkpoint sink (default: [`MemoryCheckpointSink`]).
    pub fn checkpoint_sink(mut self, sink: Arc<dyn CheckpointSink>) -> Self {
        self.sink = Some(sink);
        self
    }
    /// The metrics sink (default: a fresh [`MemoryMetrics`]).
    pub fn metrics(mut self, metrics: Arc<dyn Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }
    /// The ring builder (default: per `cfg.ring.builder`).
    pub fn ring_builder(mut self, b: Arc<dyn RingBuilder>) -> Self {
        self.ring_builder = Some(b);
        self
    }
    /// The scheduling policy (default: [`AgingPolicy`] with `cfg.scheduler.aging_tau_ms`).
    pub fn scheduling_policy(mut self, p: Arc<dyn SchedulingPolicy>) -> Self {
        self.policy = Some(p);
        self
    }

    /// Starts the actor tree (rebuilding from the state store's log, if it has one).
    pub async fn start(self) -> Result<OrchestratorHandle, OrchestratorError> {
        let mut cfg = self.cfg;
        cfg.validate().map_err(OrchestratorError::Config)?;
        let clock = self.clock.unwrap_or_else(|| Arc::new(TokioClock::new()));
        // Drawn once per start: a supervisor rebuilt later numbers a still-empty log alike.
        cfg.first_job_id = crate::replay::resolve_first_job_id(cfg.first_job_id, clock.now()).0;
        let ring_builder = self.ring_builder.unwrap_or_else(|| match cfg.ring.builder {
            RingBuilderKind::Threshold => Arc::new(ThresholdRingBuilder::default()),
            RingBuilderKind::Algorithm1 => Arc::new(Algorithm1::default()),
        });
        let policy = self.policy.unwrap_or_else(|| {
            Arc::new(AgingPolicy {
                tau_ms: cfg.scheduler.aging_tau_ms,
            })
        });
        let (notices, _) = broadcast::channel(4096);
        let deps = Deps {
            store: self
                .store
                .unwrap_or_else(|| Arc::new(MemoryStateStore::new())),
            clock,
            chain: self.chain.unwrap_or_else(|| Arc::new(MemoryChain::new())),
            link: self
                .link
                .unwrap_or_else(|| Arc::new(ChannelNodeLink::new())),
            sink: self
                .sink
                .unwrap_or_else(|| Arc::new(MemoryCheckpointSink::new())),
            metrics: self
                .metrics
                .unwrap_or_else(|| Arc::new(MemoryMetrics::new())),
            ring_builder,
            policy,
            cfg: Arc::new(cfg),
            notices,
        };
        let (root, _) = Actor::spawn(None, OrchestratorActor, deps.clone())
            .await
            .map_err(|e| CallError::Start {
                message: e.to_string(),
            })?;
        Ok(OrchestratorHandle { root, deps })
    }
}

/// Why a request to the orchestrator failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OrchestratorError {
    /// The orchestrator (or the subsystem that serves the request) is not running, or did
    /// not answer within the call deadline. Retry later.
    #[error("orchestrator unavailable: {0}")]
    Unavailable(#[from] CallError),
    /// The settings are out of range (names the key).
    #[error("configuration: {0}")]
    Config(#[from] crate::config::ConfigError),
    /// Registration refused.
    #[error(transparent)]
    Register(#[from] RegisterError),
    /// Heartbeat refused.
    #[error(transparent)]
    Heartbeat(#[from] HeartbeatError),
    /// Job refused.
    #[error(transparent)]
    Submit(#[from] SubmitError),
    /// Job request refused.
    #[error(transparent)]
    Job(#[from] JobRequestError),
}

/// A fault to inject into a running orchestrator (the fault-injection harness uses these;
/// feature `fault-injection`, which the test kit turns on and the product binary leaves off).
#[cfg(feature = "fault-injection")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum ActorFault {
    /// Panic in the node's actor (the node counts as failed).
    PanicNodeActor(NodeId),
    /// Panic in the job's actor (rebuilt from the log).
    PanicJobActor(JobId),
    /// Panic in the job's ring actor (rebuilt from the log).
    PanicRingActor(JobId),
    /// Panic in a whole subsystem (rebuilt with its children from the log).
    PanicSubsystem(Subsystem),
}

/// A running orchestrator. Cheap to clone; every method has the configured call deadline.
#[derive(Clone)]
pub struct OrchestratorHandle {
    root: ActorRef<OrchestratorMsg>,
    deps: Deps,
}

impl std::fmt::Debug for OrchestratorHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OrchestratorHandle")
            .field("root", &self.root.get_id())
            .finish()
    }
}

impl OrchestratorHandle {
    async fn ask<T: Send + 'static>(
        &self,
        build: impl FnOnce(RpcReplyPort<T>) -> OrchestratorMsg,
    ) -> Result<T, OrchestratorError> {
        Ok(ask_with(&self.root, self.deps.cfg.call_timeout_ms, build).await?)
    }

    /// Admits a node: reads its stake on chain (≥ the minimum, 10,000 GYM by default),
    /// records it, starts its heartbeat watchdog. A second registration of the same key
    /// opens a new heartbeat session on the same state.
    pub async fn register_node(&self, info: NodeInfo) -> Result<Registration, OrchestratorError> {
        Ok(self
            .ask(|reply| OrchestratorMsg::Registry(RegistryMsg::Register { info, reply }))
            .await??)
    }

    /// Delivers a heartbeat; returns the interval to keep, in ms.
    pub async fn heartbeat(&self, hb: Heartbeat) -> Result<u64, OrchestratorError> {
        Ok(self
            .ask(|reply| OrchestratorMsg::Registry(RegistryMsg::Heartbeat { hb, reply }))
            .await??)
    }

    /// The node's session `session` (the [`Registration::sessions`] it was opened with)
    /// closed: the node is failed now rather than at the timeout. The close of an older
    /// session, delivered after the node registered again, is ignored.
    pub fn session_closed(&self, node: NodeId, session: u32) {
        let _ = self
            .root
            .cast(OrchestratorMsg::Registry(RegistryMsg::SessionClosed {
                node,
                session,
            }));
    }

    /// The node's session stream is open (commands to the node can be delivered now): every
    /// job whose ring holds the node resends it the ring and, while the node has not
    /// delivered the running epoch's delta, the epoch's assignment. A node that reconnects
    /// (after a failover, or its own restart) resumes at once, not at the next resync.
    pub fn session_opened(&self, node: NodeId) {
        let _ = self
            .root
            .cast(OrchestratorMsg::Jobs(JobSupervisorMsg::NodeReturned {
                node,
            }));
    }

    /// Records a probe's measurement of the link `from → to`, in Mbit/s.
    pub async fn report_link(
        &self,
        from: NodeId,
        to: NodeId,
        mbps: f32,
    ) -> Result<(), OrchestratorError> {
        Ok(self
            .ask(|reply| {
                OrchestratorMsg::Registry(RegistryMsg::ReportLink {
                    from,
                    to,
                    mbps,
                    reply,
                })
            })
            .await??)
    }

    /// Every node's status, ordered by id.
    pub async fn nodes(&self) -> Result<Vec<NodeView>, OrchestratorError> {
        let mut nodes = self
            .ask(|reply| OrchestratorMsg::Registry(RegistryMsg::Snapshot { reply }))
            .await?;
        let (_, assigned) = self
            .ask(|reply| OrchestratorMsg::Scheduler(SchedulerMsg::Inspect { reply }))
            .await?;
        for n in &mut nodes {
            n.assigned = assigned.get(&n.id).copied();
        }
        Ok(nodes)
    }

    /// Accepts a job; returns its id.
    pub async fn submit_job(&self, spec: JobSpec) -> Result<JobId, OrchestratorError> {
        Ok(self
            .ask(|reply| {
                OrchestratorMsg::Jobs(JobSupervisorMsg::Submit {
                    spec: Box::new(spec),
                    reply,
                })
            })
            .await??)
    }

    /// Cancels a job (it ends `Failed { Cancelled }`).
    pub async fn cancel_job(&self, job: JobId) -> Result<(), OrchestratorError> {
        Ok(self
            .ask(|reply| OrchestratorMsg::Jobs(JobSupervisorMsg::Cancel { job, reply }))
            .await??)
    }

    /// One job.
    pub async fn job(&self, job: JobId) -> Result<JobView, OrchestratorError> {
        Ok(self
            .ask(|reply| OrchestratorMsg::Jobs(JobSupervisorMsg::Get { job, reply }))
            .await??)
    }

    /// Every job, by id.
    pub async fn jobs(&self) -> Result<Vec<JobView>, OrchestratorError> {
        self.ask(|reply| OrchestratorMsg::Jobs(JobSupervisorMsg::List { reply }))
            .await
    }

    /// A job's current ring (None before it is formed).
    pub async fn ring(&self, job: JobId) -> Result<Option<RingView>, OrchestratorError> {
        Ok(self
            .ask(|reply| OrchestratorMsg::Jobs(JobSupervisorMsg::Ring { job, reply }))
            .await??)
    }

    /// Records a node's delta receipt for its job's current epoch.
    pub async fn submit_delta(&self, receipt: DeltaReceipt) -> Result<(), OrchestratorError> {
        Ok(self
            .ask(|reply| OrchestratorMsg::Jobs(JobSupervisorMsg::Delta { receipt, reply }))
            .await??)
    }

    /// Hands a ring member's message to its job's ring aggregation (DESIGN §6.4); returns
    /// the aggregation's step after it ([`crate::aggregation::Step::name`]).
    pub async fn round(
        &self,
        job: JobId,
        node: NodeId,
        msg: crate::actor::msg::RoundMsg,
    ) -> Result<&'static str, OrchestratorError> {
        Ok(self
            .ask(|reply| {
                OrchestratorMsg::Jobs(JobSupervisorMsg::Round {
                    job,
                    node,
                    msg,
                    reply,
                })
            })
            .await??)
    }

    /// Injects a fault into an actor; returns whether the target existed (feature
    /// `fault-injection`).
    #[cfg(feature = "fault-injection")]
    pub async fn inject(&self, fault: ActorFault) -> Result<bool, OrchestratorError> {
        self.ask(|reply| match fault {
            ActorFault::PanicNodeActor(node) => {
                OrchestratorMsg::Registry(RegistryMsg::InjectPanic { node, reply })
            }
            ActorFault::PanicJobActor(job) => {
                OrchestratorMsg::Jobs(JobSupervisorMsg::InjectPanic {
                    job,
                    ring: false,
                    reply,
                })
            }
            ActorFault::PanicRingActor(job) => {
                OrchestratorMsg::Jobs(JobSupervisorMsg::InjectPanic {
                    job,
                    ring: true,
                    reply,
                })
            }
            ActorFault::PanicSubsystem(which) => OrchestratorMsg::InjectPanic { which, reply },
        })
        .await
    }

    /// A stream of notices (node failures, ring changes, job phases, restarts).
    pub fn subscribe(&self) -> broadcast::Receiver<Notice> {
        self.deps.notices.subscribe()
    }

    /// The settings in force (`first_job_id` resolved: the id a fresh log starts at).
    pub fn config(&self) -> &CoreConfig {
        &self.deps.cfg
    }

    /// The event log.
    pub fn state_store(&self) -> Arc<dyn StateStore> {
        self.deps.store.clone()
    }

    /// The metrics sink.
    pub fn metrics(&self) -> Arc<dyn Metrics> {
        self.deps.metrics.clone()
    }

    /// The clock.
    pub fn clock(&self) -> Arc<dyn Clock> {
        self.deps.clock.clone()
    }

    /// Whether the actor tree is running.
    pub fn is_running(&self) -> bool {
        matches!(self.root.get_status(), ActorStatus::Running)
    }

    /// Stops every actor and waits for them (at most 10 s). What was recorded stays in the
    /// state store; a new orchestrator on the same store resumes from it.
    pub async fn shutdown(&self) {
        let _ = self
            .root
            .stop_and_wait(Some("shutdown".into()), Some(Duration::from_secs(10)))
            .await;
    }
}
