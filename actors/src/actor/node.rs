//! `NodeActor`: one per registered node. Owns the node's [`NodeCore`]: accepts heartbeats,
//! runs the watchdog (a node silent for the timeout is failed, exactly at the deadline), and
//! reports status changes to the registry.

use crate::ports::Counter;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};

use super::msg::RegistryMsg;
use super::{answer, Deps};
use crate::events::FailureKind;
use crate::node::{Liveness, NodeCore};
use crate::types::{NodeInfo, Timestamp};

pub use super::msg::NodeMsg;

/// Spawn arguments of a [`NodeActor`].
pub struct NodeActorArgs {
    /// The node's info.
    pub info: NodeInfo,
    /// Start as failed (a rebuilt actor after a crash: the node must register again).
    pub start_failed: bool,
    /// The registry to report to.
    pub registry: ActorRef<RegistryMsg>,
    /// Ports.
    pub deps: Deps,
}

/// State of a [`NodeActor`].
pub struct NodeState {
    core: NodeCore,
    watchdog_armed: bool,
    /// Failures so far: a [`NodeMsg::ReportFailed`] of an earlier one is stale (the node
    /// came back and failed again meanwhile).
    failures: u64,
    registry: ActorRef<RegistryMsg>,
    deps: Deps,
}

/// The per-node actor.
pub struct NodeActor;

/// How often a failed node's uptime is reported while it stays failed, ms: its downtime
/// grows, and views (`hanzod nodes`, the scheduler's) follow it rather than freeze at the
/// failure. A minute moves the 24-h uptime by at most 0.07 %.
pub const FAILED_REPORT_MS: u64 = 60_000;

impl NodeState {
    /// Makes sure one timer is due at (or before) the failure deadline. One timer per
    /// node however fast it heartbeats: when it fires early (heartbeats moved the
    /// deadline), it is re-armed for the remainder.
    fn arm_watchdog(&mut self, myself: &ActorRef<NodeMsg>) {
        if self.watchdog_armed {
            return;
        }
        self.watchdog_armed = true;
        let wait = self.core.deadline().since(self.deps.now());
        myself.send_after(Duration::from_millis(wait), || NodeMsg::Watchdog);
    }

    fn report(&self, myself: &ActorRef<NodeMsg>) {
        let _ = self.registry.cast(RegistryMsg::Status {
            node: self.core.id(),
            uptime: self.core.uptime(self.deps.now()),
            alive: self.core.liveness() == Liveness::Alive,
            from: myself.get_id(),
        });
    }

    fn fail(&mut self, myself: &ActorRef<NodeMsg>, kind: FailureKind, now: Timestamp) {
        if self.core.mark_failed(now) {
            tracing::info!(node = %self.core.id().short(), %kind, "node failed");
            let _ = self.registry.cast(RegistryMsg::NodeDown {
                node: self.core.id(),
                kind,
                from: myself.get_id(),
            });
            self.report(myself);
            self.failures += 1;
            let failure = self.failures;
            myself.send_after(Duration::from_millis(FAILED_REPORT_MS), move || {
                NodeMsg::ReportFailed { failure }
            });
        }
    }
}

impl Actor for NodeActor {
    type Msg = NodeMsg;
    type State = NodeState;
    type Arguments = NodeActorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<NodeMsg>,
        args: NodeActorArgs,
    ) -> Result<NodeState, ActorProcessingErr> {
        let now = args.deps.now();
        let cfg = &args.deps.cfg;
        let mut core = NodeCore::new(
            args.info,
            cfg.heartbeat.clone(),
            cfg.eligibility.uptime_window_ms,
            now,
        );
        if args.start_failed {
            core.mark_failed(now);
        }
        let mut state = NodeState {
            core,
            watchdog_armed: false,
            failures: 0,
            registry: args.registry,
            deps: args.deps,
        };
        if args.start_failed {
            // Rebuilt as failed: its uptime is reported falling from now, like any failure.
            state.failures = 1;
            state.report(&myself);
            myself.send_after(Duration::from_millis(FAILED_REPORT_MS), || {
                NodeMsg::ReportFailed { failure: 1 }
            });
        } else {
            state.arm_watchdog(&myself);
        }
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<NodeMsg>,
        msg: NodeMsg,
        state: &mut NodeState,
    ) -> Result<(), ActorProcessingErr> {
        let now = state.deps.now();
        match msg {
            NodeMsg::Heartbeat { hb, reply } => {
                let result = state.core.on_heartbeat(&hb, now);
                let label = match &result {
                    Ok(()) => {
                        state.arm_watchdog(&myself);
                        state.report(&myself);
                        "accepted"
                    }
                    Err(e) => e.reason(),
                };
                state.deps.metrics.incr(Counter::Heartbeats, label, 1);
                answer(reply, result.map(|()| state.deps.cfg.heartbeat.interval_ms));
            }
            NodeMsg::Reregister { info, reply } => {
                state.core.reregister(info, now);
                state.arm_watchdog(&myself);
                state.report(&myself);
                answer(reply, ());
            }
            NodeMsg::SessionClosed => state.fail(&myself, FailureKind::SessionClosed, now),
            NodeMsg::ReportFailed { failure } => {
                if failure == state.failures && state.core.liveness() == Liveness::Failed {
                    state.report(&myself);
                    // Down for the whole window, its uptime is 0 and stays there: no more
                    // reports until it comes back.
                    if state.core.uptime(now) > 0.0 {
                        myself.send_after(Duration::from_millis(FAILED_REPORT_MS), move || {
                            NodeMsg::ReportFailed { failure }
                        });
                    }
                }
            }
            NodeMsg::Watchdog => {
                state.watchdog_armed = false;
                if state.core.is_overdue(now) {
                    state.fail(&myself, FailureKind::HeartbeatTimeout, now);
                } else if state.core.liveness() == Liveness::Alive {
                    state.arm_watchdog(&myself);
                }
            }
            #[cfg(feature = "fault-injection")]
            NodeMsg::InjectPanic => panic!("injected fault: node actor panic"),
        }
        Ok(())
    }
}
