//! `Orchestrator`: the root supervisor. It spawns the three subsystems, routes every
//! message between them (so a rebuilt child is reachable at once, and no child holds a
//! stale reference to a sibling), and rebuilds a failed subsystem with a restart budget.
//!
//! ```text
//! Orchestrator
//! ├── NodeRegistry    (rebuilt: node actors respawned from the log, nodes re-heartbeat)
//! ├── Scheduler       (rebuilt: queue and allocation re-derived from the log)
//! └── JobSupervisor   (rebuilt: every live job actor respawned from the log)
//! ```

use crate::ports::Counter;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};

use super::children::{schedule_respawn, Children, Exit};
use super::jobs::{JobSupervisor, JobSupervisorArgs};
use super::msg::JobSupervisorMsg;
use super::msg::RegistryMsg;
use super::msg::SchedulerMsg;
use super::registry::{NodeRegistry, RegistryArgs};
use super::scheduler::{Scheduler, SchedulerArgs};
use super::{Deps, Notice};

pub use super::msg::{OrchestratorMsg, Subsystem};

/// State of the root.
pub struct OrchestratorState {
    registry: Option<ActorRef<RegistryMsg>>,
    scheduler: Option<ActorRef<SchedulerMsg>>,
    jobs: Option<ActorRef<JobSupervisorMsg>>,
    children: Children<Subsystem>,
    deps: Deps,
}

/// The root supervisor actor.
pub struct OrchestratorActor;

impl OrchestratorState {
    async fn spawn(
        &mut self,
        myself: &ActorRef<OrchestratorMsg>,
        which: Subsystem,
    ) -> Result<(), ActorProcessingErr> {
        let cell = myself.get_cell();
        let root = myself.clone();
        let deps = self.deps.clone();
        let id = match which {
            Subsystem::Registry => {
                let (a, _) =
                    Actor::spawn_linked(None, NodeRegistry, RegistryArgs { root, deps }, cell)
                        .await?;
                let id = a.get_id();
                self.registry = Some(a);
                id
            }
            Subsystem::Scheduler => {
                let (a, _) =
                    Actor::spawn_linked(None, Scheduler, SchedulerArgs { root, deps }, cell)
                        .await?;
                let id = a.get_id();
                self.scheduler = Some(a);
                id
            }
            Subsystem::Jobs => {
                let (a, _) = Actor::spawn_linked(
                    None,
                    JobSupervisor,
                    JobSupervisorArgs { root, deps },
                    cell,
                )
                .await?;
                let id = a.get_id();
                self.jobs = Some(a);
                id
            }
        };
        self.children.adopt(which, id);
        Ok(())
    }
}

impl Actor for OrchestratorActor {
    type Msg = OrchestratorMsg;
    type State = OrchestratorState;
    type Arguments = Deps;

    async fn pre_start(
        &self,
        _myself: ActorRef<OrchestratorMsg>,
        deps: Deps,
    ) -> Result<OrchestratorState, ActorProcessingErr> {
        Ok(OrchestratorState {
            registry: None,
            scheduler: None,
            jobs: None,
            children: Children::new(deps.cfg.supervision.clone()),
            deps,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<OrchestratorMsg>,
        state: &mut OrchestratorState,
    ) -> Result<(), ActorProcessingErr> {
        // Order matters: the registry answers the others' calls during their rebuild.
        state.spawn(&myself, Subsystem::Registry).await?;
        state.spawn(&myself, Subsystem::Scheduler).await?;
        state.spawn(&myself, Subsystem::Jobs).await?;
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<OrchestratorMsg>,
        msg: OrchestratorMsg,
        state: &mut OrchestratorState,
    ) -> Result<(), ActorProcessingErr> {
        // A message for a subsystem being rebuilt is dropped: its reply port closes and the
        // caller gets `Unavailable` at once instead of waiting for its deadline.
        match msg {
            OrchestratorMsg::Registry(m) => {
                if let Some(a) = &state.registry {
                    let _ = a.cast(m);
                }
            }
            OrchestratorMsg::Scheduler(m) => {
                if let Some(a) = &state.scheduler {
                    let _ = a.cast(m);
                }
            }
            OrchestratorMsg::Jobs(m) => {
                if let Some(a) = &state.jobs {
                    let _ = a.cast(m);
                }
            }
            #[cfg(feature = "fault-injection")]
            OrchestratorMsg::InjectPanic { which, reply } => {
                let sent = match which {
                    Subsystem::Registry => state
                        .registry
                        .as_ref()
                        .is_some_and(|a| a.cast(RegistryMsg::Panic).is_ok()),
                    Subsystem::Scheduler => state
                        .scheduler
                        .as_ref()
                        .is_some_and(|a| a.cast(SchedulerMsg::Panic).is_ok()),
                    Subsystem::Jobs => state
                        .jobs
                        .as_ref()
                        .is_some_and(|a| a.cast(JobSupervisorMsg::Panic).is_ok()),
                };
                super::answer(reply, sent);
            }
            OrchestratorMsg::Respawn(which) => {
                if let Err(e) = state.spawn(&myself, which).await {
                    // Its rebuild could not read the log (state store down): not the
                    // subsystem's fault, so retry without spending its restart budget.
                    tracing::warn!(subsystem = ?which, error = %e, "subsystem rebuild failed; retrying");
                    let wait = Duration::from_millis(state.deps.cfg.supervision.backoff_max_ms);
                    myself.send_after(wait, move || OrchestratorMsg::Respawn(which));
                    return Ok(());
                }
                let what = format!("{which:?}").to_lowercase();
                state.deps.metrics.incr(Counter::ActorRestarts, &what, 1);
                state.deps.notify(Notice::ActorRestarted { what });
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<OrchestratorMsg>,
        event: SupervisionEvent,
        state: &mut OrchestratorState,
    ) -> Result<(), ActorProcessingErr> {
        // A subsystem that stops, failed or not, is rebuilt: the orchestrator needs all three.
        let Some(Exit {
            key: which, why, ..
        }) = state.children.exited(&event)
        else {
            return Ok(());
        };
        match which {
            Subsystem::Registry => state.registry = None,
            Subsystem::Scheduler => state.scheduler = None,
            Subsystem::Jobs => state.jobs = None,
        }
        tracing::warn!(subsystem = ?which, %why, "subsystem stopped; rebuilding from the event log");
        let decision = state.children.on_failure(&which, state.deps.now());
        if !schedule_respawn(&myself, decision, move || OrchestratorMsg::Respawn(which)) {
            tracing::error!(subsystem = ?which, "restart budget spent; orchestrator stopping");
            myself.stop(Some(format!("{which:?} restart budget spent")));
        }
        Ok(())
    }
}
