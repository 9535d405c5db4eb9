//! `JobSupervisor`: accepts jobs, supervises one [`JobActor`] per live job, routes
//! requests to them, and keeps the final view of ended jobs.
//!
//! ```text
//! JobSupervisor
//! └── JobActor per job ── RingActor   (a failed JobActor is rebuilt from the log)
//! ```

use crate::ports::Counter;
use std::collections::BTreeMap;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};

use super::children::{schedule_respawn, Children};
use super::job::{JobActor, JobActorArgs};
use super::msg::OrchestratorMsg;
use super::msg::SchedulerMsg;
use super::msg::{JobMsg, JobRequestError, JobView};
use super::{answer, Deps, Notice};
use crate::events::Event;
use crate::job::{FailReason, Job, JobEvent};
use crate::sched::pending_of;
use crate::types::JobId;

pub use super::msg::{JobSupervisorMsg, SubmitError};

/// Spawn arguments of the [`JobSupervisor`].
pub struct JobSupervisorArgs {
    /// The root, for routing.
    pub root: ActorRef<OrchestratorMsg>,
    /// Ports.
    pub deps: Deps,
}

struct Live {
    actor: Option<ActorRef<JobMsg>>,
}

/// State of the [`JobSupervisor`].
pub struct JobSupervisorState {
    live: BTreeMap<JobId, Live>,
    children: Children<JobId>,
    finished: BTreeMap<JobId, JobView>,
    next_id: JobId,
    root: ActorRef<OrchestratorMsg>,
    deps: Deps,
}

/// The job supervisor actor.
pub struct JobSupervisor;

impl JobSupervisorState {
    /// Spawns `job`'s actor. When that fails (its rebuild could not read the log), the job
    /// stays live without an actor and a respawn is scheduled; requests meanwhile get
    /// `Restarting`.
    async fn spawn_job(&mut self, myself: &ActorRef<JobSupervisorMsg>, job: JobId) {
        self.live.entry(job).or_insert(Live { actor: None });
        match self.try_spawn_job(myself, job).await {
            Ok(actor) => {
                self.children.adopt(job, actor.get_id());
                if let Some(l) = self.live.get_mut(&job) {
                    l.actor = Some(actor);
                }
            }
            Err(e) => {
                tracing::warn!(%job, error = %e, "job actor could not start; retrying");
                let wait = Duration::from_millis(self.deps.cfg.supervision.backoff_max_ms);
                myself.send_after(wait, move || JobSupervisorMsg::Respawn { job });
            }
        }
    }

    async fn try_spawn_job(
        &mut self,
        myself: &ActorRef<JobSupervisorMsg>,
        job: JobId,
    ) -> Result<ActorRef<JobMsg>, ActorProcessingErr> {
        let (actor, _) = Actor::spawn_linked(
            None,
            JobActor,
            JobActorArgs {
                id: job,
                root: self.root.clone(),
                supervisor: myself.clone(),
                deps: self.deps.clone(),
            },
            myself.get_cell(),
        )
        .await?;
        Ok(actor)
    }

    fn actor(&self, job: JobId) -> Option<ActorRef<JobMsg>> {
        self.live.get(&job).and_then(|l| l.actor.clone())
    }

    /// Records a job as failed when its actor cannot be rebuilt.
    async fn give_up(&mut self, job: JobId, why: &str) {
        let reason = FailReason::Other(why.to_string());
        if let Err(e) = self
            .deps
            .persist(Event::Job {
                job,
                event: JobEvent::Fail {
                    reason: reason.clone(),
                },
            })
            .await
        {
            tracing::error!(%job, error = %e, "could not record job failure");
        }
        self.live.remove(&job);
        self.children.forget(&job);
        let _ = self
            .root
            .cast(OrchestratorMsg::Scheduler(SchedulerMsg::Release { job }));
        if let Ok(mut fold) = crate::replay::load(&*self.deps.store).await {
            if let Some(j) = fold.jobs.remove(&job) {
                let view = JobView::of(&j.job, j.ring.map(|(_, r)| r), 0);
                self.deps.notify(Notice::JobPhase {
                    job,
                    phase: view.phase.clone(),
                });
                self.finished.insert(job, view);
            }
        }
    }
}

impl Actor for JobSupervisor {
    type Msg = JobSupervisorMsg;
    type State = JobSupervisorState;
    type Arguments = JobSupervisorArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<JobSupervisorMsg>,
        args: JobSupervisorArgs,
    ) -> Result<JobSupervisorState, ActorProcessingErr> {
        Ok(JobSupervisorState {
            live: BTreeMap::new(),
            children: Children::new(args.deps.cfg.supervision.clone()),
            finished: BTreeMap::new(),
            next_id: JobId(args.deps.cfg.first_job_id),
            root: args.root,
            deps: args.deps,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<JobSupervisorMsg>,
        state: &mut JobSupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        // Rebuild: every job that has not ended gets its actor back; ended jobs keep their view.
        let fold = crate::replay::load(&*state.deps.store).await?;
        state.next_id = fold.next_job_id_or(JobId(state.deps.cfg.first_job_id));
        for (id, j) in fold.jobs {
            if j.job.phase.is_terminal() {
                let view = JobView::of(&j.job, j.ring.map(|(_, r)| r), 0);
                state.finished.insert(id, view);
            } else {
                state.spawn_job(&myself, id).await;
            }
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<JobSupervisorMsg>,
        msg: JobSupervisorMsg,
        state: &mut JobSupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            JobSupervisorMsg::Submit { spec, reply } => {
                if let Err(e) = spec.validate() {
                    tracing::info!(error = %e, "job refused");
                    answer(reply, Err(SubmitError::InvalidSpec(e)));
                    return Ok(());
                }
                let id = state.next_id;
                if let Err(e) = state
                    .deps
                    .persist(Event::JobSubmitted {
                        job: id,
                        spec: spec.clone(),
                        resumed: Vec::new(),
                    })
                    .await
                {
                    answer(reply, Err(SubmitError::Store(e.to_string())));
                    return Ok(());
                }
                state.next_id = JobId(id.0 + 1);
                // The job is durable from here: it is accepted even if its actor has to be
                // started again later.
                state.spawn_job(&myself, id).await;
                let job = Job::new(id, *spec, state.deps.now());
                if let Some(p) = pending_of(&job) {
                    let _ = state
                        .root
                        .cast(OrchestratorMsg::Scheduler(SchedulerMsg::Enqueue(p)));
                }
                tracing::info!(job = %id, name = %job.spec.name, "job submitted");
                answer(reply, Ok(id));
            }
            JobSupervisorMsg::Place { job, nodes } => match state.live.get(&job) {
                Some(Live { actor: Some(a), .. }) => {
                    let _ = a.cast(JobMsg::Place { nodes });
                }
                // Being rebuilt: the placement is in the log, the rebuilt actor forms the ring.
                Some(_) => {}
                None => {
                    let _ = state
                        .root
                        .cast(OrchestratorMsg::Scheduler(SchedulerMsg::Release { job }));
                }
            },
            JobSupervisorMsg::NodeFailed { node } => {
                for l in state.live.values() {
                    if let Some(a) = &l.actor {
                        let _ = a.cast(JobMsg::NodeFailed { node });
                    }
                }
            }
            JobSupervisorMsg::NodeReturned { node } => {
                for l in state.live.values() {
                    if let Some(a) = &l.actor {
                        let _ = a.cast(JobMsg::NodeReturned { node });
                    }
                }
            }
            JobSupervisorMsg::Delta { receipt, reply } => match state.actor(receipt.job) {
                Some(a) => {
                    let _ = a.cast(JobMsg::Delta { receipt, reply });
                }
                None => answer(reply, Err(state.missing(receipt.job))),
            },
            JobSupervisorMsg::Round {
                job,
                node,
                msg,
                reply,
            } => match state.actor(job) {
                Some(a) => {
                    let _ = a.cast(JobMsg::Round { node, msg, reply });
                }
                None => answer(reply, Err(state.missing(job))),
            },
            JobSupervisorMsg::Cancel { job, reply } => match state.actor(job) {
                Some(a) => forward(
                    &myself,
                    &a,
                    reply,
                    |reply| JobMsg::Cancel { reply },
                    move |reply| JobSupervisorMsg::Cancel { job, reply },
                ),
                None => answer(reply, Err(state.missing(job))),
            },
            JobSupervisorMsg::Get { job, reply } => match state.actor(job) {
                Some(a) => forward(
                    &myself,
                    &a,
                    reply,
                    |reply| JobMsg::Get { reply },
                    move |reply| JobSupervisorMsg::Get { job, reply },
                ),
                None => answer(
                    reply,
                    state
                        .finished
                        .get(&job)
                        .cloned()
                        .ok_or(JobRequestError::NotFound(job)),
                ),
            },
            JobSupervisorMsg::List { reply } => {
                // Asked concurrently, off this handler: a job busy publishing must not
                // stall the routing of every other job's messages.
                let mut views: Vec<JobView> = state.finished.values().cloned().collect();
                let timeout = state.deps.cfg.call_timeout_ms;
                let mut asks = tokio::task::JoinSet::new();
                for (id, l) in &state.live {
                    let Some(a) = l.actor.clone() else { continue };
                    let id = *id;
                    asks.spawn(async move {
                        let r = super::ask_with(&a, timeout, |reply| JobMsg::Get { reply }).await;
                        (id, r)
                    });
                }
                tokio::spawn(async move {
                    while let Some(Ok((id, r))) = asks.join_next().await {
                        match r {
                            Ok(Ok(v)) => views.push(v),
                            _ => {
                                tracing::warn!(job = %id, "job actor did not answer a list request")
                            }
                        }
                    }
                    views.sort_by_key(|v| v.id);
                    answer(reply, views);
                });
            }
            JobSupervisorMsg::Ring { job, reply } => match state.actor(job) {
                Some(a) => forward(
                    &myself,
                    &a,
                    reply,
                    |reply| JobMsg::GetRing { reply },
                    move |reply| JobSupervisorMsg::Ring { job, reply },
                ),
                None => answer(
                    reply,
                    state
                        .finished
                        .get(&job)
                        .map(|v| v.ring.clone())
                        .ok_or(JobRequestError::NotFound(job)),
                ),
            },
            JobSupervisorMsg::Finished { view } => {
                let job = view.id;
                state.live.remove(&job);
                state.children.forget(&job);
                state.finished.insert(job, *view);
            }
            JobSupervisorMsg::Respawn { job } => {
                if state.live.get(&job).is_some_and(|l| l.actor.is_none()) {
                    state.spawn_job(&myself, job).await;
                    state.deps.metrics.incr(Counter::ActorRestarts, "job", 1);
                    state.deps.notify(Notice::ActorRestarted {
                        what: format!("job {job}"),
                    });
                }
            }
            #[cfg(feature = "fault-injection")]
            JobSupervisorMsg::Panic => panic!("injected fault: job supervisor panic"),
            #[cfg(feature = "fault-injection")]
            JobSupervisorMsg::InjectPanic { job, ring, reply } => match state.actor(job) {
                Some(a) if ring => {
                    let _ = a.cast(JobMsg::InjectRingPanic { reply });
                }
                Some(a) => {
                    let _ = a.cast(JobMsg::InjectPanic);
                    answer(reply, true);
                }
                None => answer(reply, false),
            },
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<JobSupervisorMsg>,
        event: SupervisionEvent,
        state: &mut JobSupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        let Some((job, why)) = state.children.failed(&event) else {
            return Ok(());
        };
        tracing::warn!(%job, error = %why, "job actor failed; rebuilding from the event log");
        match state.live.get_mut(&job) {
            Some(l) => l.actor = None,
            None => return Ok(()),
        }
        let decision = state.children.on_failure(&job, state.deps.now());
        if !schedule_respawn(&myself, decision, move || JobSupervisorMsg::Respawn { job }) {
            state.give_up(job, "job actor restart budget spent").await;
        }
        Ok(())
    }
}

impl JobSupervisorState {
    fn missing(&self, job: JobId) -> JobRequestError {
        if self.finished.contains_key(&job) {
            JobRequestError::Ended(job)
        } else if self.live.contains_key(&job) {
            JobRequestError::Restarting(job)
        } else {
            JobRequestError::NotFound(job)
        }
    }
}

/// Forwards a caller's request to a job actor. A job actor that reaches a terminal phase
/// reports `Finished` and stops, dropping what is still in its mailbox; a request dropped
/// that way is asked of this supervisor again (`retry`), which has the final view by then
/// (`Finished` was sent before the drop), instead of failing the caller with "reply
/// dropped".
fn forward<T: Send + 'static>(
    myself: &ActorRef<JobSupervisorMsg>,
    actor: &ActorRef<JobMsg>,
    reply: RpcReplyPort<T>,
    ask: impl FnOnce(RpcReplyPort<T>) -> JobMsg,
    retry: impl FnOnce(RpcReplyPort<T>) -> JobSupervisorMsg + Send + 'static,
) {
    let (tx, rx) = ractor::concurrency::oneshot();
    if actor.cast(ask(tx.into())).is_err() {
        let _ = myself.cast(retry(reply));
        return;
    }
    let myself = myself.clone();
    tokio::spawn(async move {
        match rx.await {
            Ok(v) => answer(reply, v),
            Err(_) => {
                let _ = myself.cast(retry(reply));
            }
        }
    });
}
