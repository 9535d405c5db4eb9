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
use crate::types::{GymWei, NodeInfo, Timestamp};

pub use super::msg::NodeMsg;

/// Spawn arguments of a [`NodeActor`].
pub struct NodeActorArgs {
    /// The node's info.
    pub info: NodeInfo,
    /// Its stake at admission.
    pub stake: GymWei,
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
    registry: ActorRef<RegistryMsg>,
    deps: Deps,
}

/// The per-node actor.
pub struct NodeActor;

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
        let view = self.core.view(self.deps.now(), None);
        let _ = self.registry.cast(RegistryMsg::Status {
            view,
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
            args.stake,
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
            registry: args.registry,
            deps: args.deps,
        };
        if !args.start_failed {
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
            NodeMsg::Reregister { info, stake, reply } => {
                state.core.reregister(info, stake, now);
                state.arm_watchdog(&myself);
                state.report(&myself);
                answer(reply, ());
            }
            NodeMsg::SessionClosed => state.fail(&myself, FailureKind::SessionClosed, now),
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
