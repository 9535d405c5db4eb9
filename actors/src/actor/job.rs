//! `JobActor`: one per job. Drives the job state machine ([`crate::job::Job`]) through the
//! per-epoch loop, owns the job's [`RingActor`], collects the epoch's delta receipts, and
//! hands a complete epoch to the [`CheckpointSink`](crate::ports::CheckpointSink).
//!
//! Every transition is made durable before it is applied, so a rebuilt actor replays the
//! log ([`crate::replay`]) and resumes in the same phase with the same receipts.

use crate::ports::Counter;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};

mod round;

use super::children::{schedule_respawn, Children};
use super::msg::JobSupervisorMsg;
use super::msg::OrchestratorMsg;
use super::msg::RingMsg;
use super::msg::RoundMsg;
use super::msg::SchedulerMsg;
use super::ring::{RingActor, RingActorArgs};
use super::{answer, Deps, Notice};
use crate::events::Event;
use crate::job::{EpochAssignment, FailReason, Job, JobEvent, JobPhase};
use crate::ports::{DeltaReceipt, EpochInput, NodeCommand, PublishedEpoch, RingView};
use crate::sched::standing_leavers;
use crate::types::{JobId, NodeId, Timestamp};

pub use super::msg::{JobMsg, JobRequestError, JobView, PublishFailure, StandingReads};

/// Spawn arguments of a [`JobActor`].
pub struct JobActorArgs {
    /// The job (its spec and history are read from the log).
    pub id: JobId,
    /// The root, for routing.
    pub root: ActorRef<OrchestratorMsg>,
    /// The supervisor, told when the job ends.
    pub supervisor: ActorRef<JobSupervisorMsg>,
    /// Ports.
    pub deps: Deps,
}

/// State of a [`JobActor`].
pub struct JobState {
    job: Job,
    placed: Option<Vec<NodeId>>,
    ring: Option<RingView>,
    receipts: BTreeMap<NodeId, DeltaReceipt>,
    /// When the current phase (and epoch) began; timers count from here.
    phase_since: Timestamp,
    ring_actor: Option<ActorRef<RingMsg>>,
    /// The ring actor, the one child (keyed by the job).
    children: Children<JobId>,
    /// The epoch whose publication task is running, if any: at most one at a time.
    publishing: Option<u32>,
    /// A failure or cancel that arrived while a publication ran: applied once its outcome
    /// is recorded ([`JobState::transition_or_hold`]).
    held: Option<JobEvent>,
    /// The running epoch's ring aggregation (ring jobs only; [`round`]).
    round: Option<round::RoundState>,
    /// Members found out of standing at the last epoch boundary whose removal the ring
    /// actor has not recorded yet: given no work, their deltas refused.
    leaving: BTreeSet<NodeId>,
    root: ActorRef<OrchestratorMsg>,
    supervisor: ActorRef<JobSupervisorMsg>,
    deps: Deps,
}

/// The per-job actor.
pub struct JobActor;

/// Whether `event` waits for a running publication (`publishing`) before it is applied:
/// a failure or a cancel would end the job while the sink may be publishing, paying for
/// and recording its epoch, leaving a published, paid checkpoint the job never shows. Pure.
pub fn holds_for_publication(publishing: bool, event: &JobEvent) -> bool {
    publishing && matches!(event, JobEvent::Fail { .. } | JobEvent::Cancel)
}

impl JobState {
    fn view(&self) -> JobView {
        JobView::with_receipts(&self.job, self.ring.clone(), &self.receipts)
    }

    /// Validates `event` against the state machine, makes it durable, then applies it.
    async fn transition(
        &mut self,
        myself: &ActorRef<JobMsg>,
        event: JobEvent,
    ) -> Result<(), JobRequestError> {
        let now = self.deps.now();
        let mut next = self.job.clone();
        next.apply(&event, now)?;
        if let Err(e) = self
            .deps
            .persist(Event::Job {
                job: self.job.id,
                event: event.clone(),
            })
            .await
        {
            // Nothing changed; whatever this transition was owed is re-derived later.
            tracing::warn!(job = %self.job.id, error = %e, "job transition not recorded; will reconcile");
            let wait = Duration::from_millis(self.deps.cfg.supervision.backoff_max_ms);
            myself.send_after(wait, || JobMsg::Reconcile);
            return Err(JobRequestError::Store(e.to_string()));
        }
        let entered_epoch = !matches!(self.job.phase, JobPhase::Running { .. })
            && matches!(next.phase, JobPhase::Running { .. });
        if next.phase.name() != self.job.phase.name() || entered_epoch {
            self.phase_since = now;
        }
        self.job = next;
        tracing::info!(job = %self.job.id, phase = self.job.phase.name(), "job transition");
        self.deps
            .metrics
            .incr(Counter::JobTransitions, self.job.phase.name(), 1);
        self.deps.notify(Notice::JobPhase {
            job: self.job.id,
            phase: self.job.phase.clone(),
        });
        if entered_epoch {
            self.receipts.clear();
            if let JobPhase::Running { epoch, .. } = self.job.phase {
                self.begin_round(epoch);
            }
            self.arm_timers(myself);
            self.assign().await;
        }
        if self.job.phase.is_terminal() {
            self.finish(myself).await;
        }
        Ok(())
    }

    /// Sends the running epoch's [`EpochAssignment`] to every ring member that has not
    /// delivered its delta (members ignore an epoch they already trained). Undeliverable
    /// assignments are left to the next [`JobMsg::Reassign`].
    async fn assign(&self) {
        self.assign_to(None).await
    }

    /// [`JobState::assign`], to `only` that member when given.
    async fn assign_to(&self, only: Option<NodeId>) {
        let JobPhase::Running { epoch, .. } = self.job.phase else {
            return;
        };
        let Some(ring) = &self.ring else { return };
        let spec = &self.job.spec;
        let assignment = EpochAssignment {
            job: self.job.id,
            epoch,
            step: u64::from(epoch) * u64::from(spec.training.local_steps),
            base: self.job.base_of(epoch).map(str::to_string),
            training: spec.training.clone(),
            deadline: self.phase_since.plus_ms(spec.epoch_deadline_ms),
            seed_commitments: self.seed_commitments(),
        };
        for m in ring.members.iter().filter(|m| {
            !self.receipts.contains_key(*m)
                && !self.leaving.contains(*m)
                && only.is_none_or(|o| o == **m)
        }) {
            let command = NodeCommand::EpochStart(Box::new(assignment.clone()));
            if let Err(e) = self.deps.link.send(m, command).await {
                tracing::debug!(job = %self.job.id, epoch, node = %m, error = %e, "assignment not delivered; will resend");
            }
        }
    }

    /// Arms the timer of the current phase: the epoch deadline counts from the epoch's
    /// start and the pending deadline from submission, so a rebuild does not extend them.
    fn arm_timers(&self, myself: &ActorRef<JobMsg>) {
        let now = self.deps.now();
        match self.job.phase {
            JobPhase::Running { epoch, .. } => {
                let due = self.phase_since.plus_ms(self.job.spec.epoch_deadline_ms);
                let wait = Duration::from_millis(due.since(now));
                myself.send_after(wait, move || JobMsg::EpochDeadline { epoch });
            }
            JobPhase::Pending { deadline, .. } => {
                let wait = Duration::from_millis(deadline.since(now));
                myself.send_after(wait, || JobMsg::PendingDeadline);
            }
            _ => {}
        }
    }

    /// Fails a job still Pending at its deadline ([`Job::tick`]), saying what the nodes
    /// lacked ([`FailReason::explained`], from the scheduler's [`crate::sched::shortage`]).
    async fn pending_deadline(&mut self, myself: &ActorRef<JobMsg>) {
        let Some(event) = self.job.tick(self.deps.now()) else {
            return;
        };
        let event = match event {
            JobEvent::Fail { reason } => {
                let shortage = match crate::sched::pending_of(&self.job) {
                    Some(job) => super::ask(&self.root, &self.deps, |reply| {
                        OrchestratorMsg::Scheduler(SchedulerMsg::Explain { job, reply })
                    })
                    .await
                    .map_err(|e| tracing::debug!(job = %self.job.id, error = %e, "no shortage from the scheduler"))
                    .ok(),
                    None => None,
                };
                JobEvent::Fail {
                    reason: reason.explained(shortage),
                }
            }
            other => other,
        };
        if let Err(e) = self.transition(myself, event).await {
            tracing::warn!(job = %self.job.id, error = %e, "could not fail the pending job");
        }
    }

    /// See [`JobMsg::Reconcile`].
    async fn reconcile(&mut self, myself: &ActorRef<JobMsg>) {
        let now = self.deps.now();
        match self.job.phase.clone() {
            JobPhase::Pending { .. } => self.pending_deadline(myself).await,
            JobPhase::Provisioning { .. } => {
                if self.ring.is_some() {
                    let _ = self.transition(myself, JobEvent::ModelDistributed).await;
                }
            }
            JobPhase::Running { epoch, .. } => {
                self.resume_round_as_star(epoch).await;
                let due = self.phase_since.plus_ms(self.job.spec.epoch_deadline_ms);
                if now < due {
                    self.assign().await;
                }
                self.check_epoch(myself, now >= due).await;
            }
            JobPhase::Aggregating { epoch, .. } => self.publish(myself, epoch),
            JobPhase::Published { .. } | JobPhase::Failed { .. } => {}
        }
    }

    /// Terminal: release the nodes and stop.
    async fn finish(&mut self, myself: &ActorRef<JobMsg>) {
        if let Some(r) = self.ring_actor.take() {
            r.stop(Some("job ended".into()));
        }
        let members = self
            .ring
            .as_ref()
            .map(|r| r.members.clone())
            .or_else(|| self.placed.clone())
            .unwrap_or_default();
        for m in members {
            let _ = self
                .deps
                .link
                .send(&m, NodeCommand::Release { job: self.job.id })
                .await;
        }
        let _ = self
            .root
            .cast(OrchestratorMsg::Scheduler(SchedulerMsg::Release {
                job: self.job.id,
            }));
        let _ = self.supervisor.cast(JobSupervisorMsg::Finished {
            view: Box::new(self.view()),
        });
        myself.stop(Some("job ended".into()));
    }

    /// Spawns the ring actor; when it cannot start (its rebuild could not read the log),
    /// tries again after the longest backoff without spending the restart budget.
    async fn spawn_ring(&mut self, myself: &ActorRef<JobMsg>) {
        match self.try_spawn_ring(myself).await {
            Ok(actor) => {
                self.children.adopt(self.job.id, actor.get_id());
                self.ring_actor = Some(actor);
            }
            Err(e) => {
                tracing::warn!(job = %self.job.id, error = %e, "ring actor could not start; retrying");
                let wait = Duration::from_millis(self.deps.cfg.supervision.backoff_max_ms);
                myself.send_after(wait, || JobMsg::RespawnRing);
            }
        }
    }

    async fn try_spawn_ring(
        &mut self,
        myself: &ActorRef<JobMsg>,
    ) -> Result<ActorRef<RingMsg>, ActorProcessingErr> {
        let (actor, _) = Actor::spawn_linked(
            None,
            RingActor,
            RingActorArgs {
                job: self.job.id,
                min_vram_bytes: self.job.spec.min_vram_bytes,
                parent: myself.clone(),
                root: self.root.clone(),
                deps: self.deps.clone(),
            },
            myself.get_cell(),
        )
        .await?;
        Ok(actor)
    }

    /// Applies the epoch's completion rules ([`Job::epoch_due`]) and, when the epoch is
    /// complete, starts its publication.
    async fn check_epoch(&mut self, myself: &ActorRef<JobMsg>, deadline_passed: bool) {
        let event = if self.round.is_some() {
            // A ring epoch: its aggregation decides (`round::JobState::round_due`).
            self.round_due(self.deps.now())
        } else {
            let members = self.ring.as_ref().map(|r| r.members.as_slice());
            let receipts = &self.receipts;
            self.job.epoch_due(
                members,
                |m| receipts.contains_key(m),
                receipts.len(),
                deadline_passed,
            )
        };
        let Some(event) = event else {
            return;
        };
        match event {
            JobEvent::EpochComplete { epoch } => {
                if !self.record_round().await {
                    let wait = Duration::from_millis(self.deps.cfg.supervision.backoff_max_ms);
                    myself.send_after(wait, || JobMsg::Reconcile);
                    return;
                }
                if let Err(e) = self.transition(myself, event).await {
                    tracing::warn!(job = %self.job.id, error = %e, "could not complete epoch");
                    return;
                }
                self.publish(myself, epoch);
            }
            fail => {
                tracing::warn!(job = %self.job.id, phase = ?self.job.phase, "epoch deadline passed without a single delta");
                if let Err(e) = self.transition(myself, fail).await {
                    tracing::warn!(job = %self.job.id, error = %e, "could not fail the job");
                }
            }
        }
    }

    /// Starts the publication of the aggregated `epoch` through the sink as its own task,
    /// with the `publish_deadline_ms` deadline; the outcome comes back as
    /// [`JobMsg::Published`]. The actor keeps answering meanwhile (status, ring, watch),
    /// and other jobs' actors are never held up by it; messages that would change the
    /// phase wait for the outcome ([`holds_for_publication`]). Whether two jobs'
    /// publications overlap is the sink's choice. The sink is idempotent per job and
    /// epoch, so a rebuilt actor may start it again.
    fn publish(&mut self, myself: &ActorRef<JobMsg>, epoch: u32) {
        if self.publishing == Some(epoch) {
            return;
        }
        self.publishing = Some(epoch);
        let deltas: Vec<DeltaReceipt> = self.receipts.values().cloned().collect();
        let ring = self.ring_result(epoch);
        let audit = self.round_audit(epoch);
        let spec = self.job.spec.clone();
        let base = self.job.base_of(epoch).map(str::to_string);
        let best_loss = crate::job::best_loss_before(&self.job.summaries, epoch);
        let sink = self.deps.sink.clone();
        let job = self.job.id;
        let deadline = Duration::from_millis(self.deps.cfg.publish_deadline_ms);
        let me = myself.clone();
        let members = self.ring.as_ref().map_or(vec![], |r| r.members.clone());
        let deps = self.deps.clone();
        tokio::spawn(async move {
            // The sink runs as a task of its own, so a sink that panics fails the
            // publication instead of leaving the job in Aggregating.
            let mut publishing = tokio::spawn(async move {
                let input = EpochInput {
                    job,
                    epoch,
                    spec: &spec,
                    base: base.as_deref(),
                    deltas: &deltas,
                    ring: ring.as_ref(),
                    audit: audit.as_ref(),
                    best_loss,
                };
                sink.publish(input).await
            });
            let result = match tokio::time::timeout(deadline, &mut publishing).await {
                Ok(Ok(r)) => r.map_err(PublishFailure::Sink),
                Ok(Err(e)) if e.is_panic() => Err(PublishFailure::Panicked),
                // Cancelled: the runtime is shutting down; nobody will read the outcome.
                Ok(Err(_)) => return,
                Err(_) => {
                    // A publication past its deadline must not go on to pay for a job that
                    // failed: stop it where it stands (a staged checkpoint stays staged).
                    publishing.abort();
                    Err(PublishFailure::Deadline {
                        ms: u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX),
                    })
                }
            };
            // Read after the sink: the epoch's own slashes are on chain by now.
            let standing = match &result {
                Ok(_) => super::standing::read_standing(&deps, &members).await,
                Err(_) => StandingReads::default(),
            };
            // The actor may have stopped meanwhile (cancelled, or rebuilt: the rebuilt
            // one publishes again, idempotently).
            let _ = me.cast(JobMsg::Published {
                epoch,
                result,
                standing,
            });
        });
    }

    /// Records the outcome of `epoch`'s publication, if the job still waits for it.
    async fn on_published(
        &mut self,
        myself: &ActorRef<JobMsg>,
        epoch: u32,
        result: Result<PublishedEpoch, PublishFailure>,
        standing: StandingReads,
    ) {
        if self.publishing == Some(epoch) {
            self.publishing = None;
        }
        if !matches!(self.job.phase, JobPhase::Aggregating { epoch: e, .. } if e == epoch) {
            return;
        }
        if result.is_ok() {
            // Before the next epoch starts, so that its work goes to the members in standing.
            self.apply_standing(standing).await;
        }
        let event = match result {
            Ok(PublishedEpoch {
                checkpoint,
                summary,
            }) => JobEvent::CheckpointPublished {
                epoch,
                checkpoint,
                summary: summary.map(Box::new),
            },
            Err(why) => JobEvent::Fail {
                reason: FailReason::PublicationFailed(why.reason()),
            },
        };
        if let Err(e) = self.transition(myself, event).await {
            tracing::warn!(job = %self.job.id, error = %e, "could not record publication");
        }
        if let Some(held) = self.held.take() {
            if !self.job.phase.is_terminal() {
                tracing::info!(job = %self.job.id, event = held.name(), "applying what arrived during the publication");
                if let Err(e) = self.transition(myself, held).await {
                    tracing::warn!(job = %self.job.id, error = %e, "could not apply a held event");
                }
            }
        }
    }

    /// Acts on the ring members' standing read at this epoch boundary (DESIGN §3,
    /// "Standing"): the registry records it (and waits for nothing slow: it only updates
    /// its views and the log) before the ring is asked to reconfigure, so the standbys it
    /// is given are judged on the new standing; every member [`standing_leavers`] names
    /// leaves the ring (a reconfiguration like a failure's, standbys inserted) and gets no
    /// work meanwhile.
    async fn apply_standing(&mut self, standing: StandingReads) {
        if standing.reads.is_empty() {
            return;
        }
        let StandingReads { read_at, reads } = standing;
        for (node, read) in &reads {
            if let Err(e) = read {
                tracing::warn!(job = %self.job.id, node = %node.short(), error = %e, "member standing not read; kept until the next epoch boundary");
            }
        }
        let rules = self.deps.cfg.eligibility.rules();
        let leavers = standing_leavers(&rules, &reads, read_at);
        let standing = StandingReads { read_at, reads };
        if let Err(e) = super::standing::record(&self.root, &self.deps, &standing).await {
            tracing::warn!(job = %self.job.id, error = %e, "registry did not take the members' standing");
        }
        // A member read in good standing again (its penalty ended) is no longer leaving.
        for (node, _) in standing.reads.iter().filter(|(_, r)| r.is_ok()) {
            if !leavers.iter().any(|(l, _)| l == node) {
                self.leaving.remove(node);
            }
        }
        // The last epoch is published: the job ends now and its ring with it, so nobody
        // is asked to reconfigure it (its standbys would stay granted to a finished job).
        let last = matches!(self.job.phase, JobPhase::Aggregating { epoch, .. }
            if epoch + 1 >= self.job.spec.epochs);
        let members = self.ring.as_ref().map_or(&[][..], |r| &r.members[..]);
        for (node, why) in leavers {
            if !members.contains(&node) || last {
                continue;
            }
            tracing::info!(job = %self.job.id, node = %node.short(), reason = %why, "member out of standing leaves the ring");
            self.leaving.insert(node);
            if let Some(r) = &self.ring_actor {
                let _ = r.cast(RingMsg::Leave { node });
            }
        }
    }

    /// Applies `event`, unless it would end the job while an epoch's publication runs: the
    /// sink may then be paying for and recording that epoch, so the job records the
    /// outcome first and applies the event after ([`holds_for_publication`]).
    async fn transition_or_hold(
        &mut self,
        myself: &ActorRef<JobMsg>,
        event: JobEvent,
    ) -> Result<(), JobRequestError> {
        if holds_for_publication(self.publishing.is_some(), &event) {
            tracing::info!(job = %self.job.id, event = event.name(), "held until the running publication ends");
            // A cancel outranks a failure; otherwise the first one is kept.
            if self.held.is_none() || matches!(event, JobEvent::Cancel) {
                self.held = Some(event);
            }
            return Ok(());
        }
        self.transition(myself, event).await
    }

    async fn on_ring(&mut self, myself: &ActorRef<JobMsg>, ring: RingView) {
        if self
            .ring
            .as_ref()
            .is_some_and(|r| r.version >= ring.version)
        {
            return;
        }
        // (The ring actor released the removed members when it recorded the ring.)
        self.leaving.retain(|n| ring.members.contains(n));
        let version = ring.version;
        let size = ring.members.len() as u32;
        self.ring = Some(ring);
        let result = if let Some(fail) = self.job.ring_due(size) {
            self.transition_or_hold(myself, fail).await
        } else {
            self.on_new_ring(myself, version).await
        };
        if let Err(e) = result {
            tracing::warn!(job = %self.job.id, error = %e, "ring change not applied to the job");
        }
        // The round restarts with the new membership; deltas already accepted are kept.
        self.round_ring_changed(myself).await;
        self.check_epoch(myself, false).await;
    }

    /// The transitions a new ring of version `version` (with enough members) calls for.
    async fn on_new_ring(
        &mut self,
        myself: &ActorRef<JobMsg>,
        version: u64,
    ) -> Result<(), JobRequestError> {
        match self.job.phase {
            JobPhase::Pending { .. } => {
                // The ring is formed and every member was sent it (its assignment): the
                // model is distributed by the members fetching the checkpoint it names.
                match self
                    .transition(
                        myself,
                        JobEvent::NodesReady {
                            ring_version: version,
                        },
                    )
                    .await
                {
                    Ok(()) => self.transition(myself, JobEvent::ModelDistributed).await,
                    Err(e) => Err(e),
                }
            }
            JobPhase::Provisioning { .. } => {
                self.transition(myself, JobEvent::ModelDistributed).await
            }
            _ if self.job.phase.is_terminal() => Ok(()),
            _ => {
                let changed = self
                    .transition(
                        myself,
                        JobEvent::RingChanged {
                            ring_version: version,
                        },
                    )
                    .await;
                // Members that joined mid-epoch learn the epoch's work.
                self.assign().await;
                changed
            }
        }
    }
}

impl Actor for JobActor {
    type Msg = JobMsg;
    type State = JobState;
    type Arguments = JobActorArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<JobMsg>,
        args: JobActorArgs,
    ) -> Result<JobState, ActorProcessingErr> {
        let mut fold = crate::replay::load(&*args.deps.store).await?;
        let j = fold
            .jobs
            .remove(&args.id)
            .ok_or_else(|| format!("{} is not in the event log", args.id))?;
        Ok(JobState {
            job: j.job,
            placed: j.placed,
            ring: j.ring.map(|(_, r)| r),
            receipts: j.receipts,
            round: j
                .ring_result
                .map(|(epoch, result)| round::RoundState::recorded_round(epoch, result)),
            phase_since: j.phase_since,
            ring_actor: None,
            children: Children::new(args.deps.cfg.supervision.clone()),
            publishing: None,
            held: None,
            leaving: BTreeSet::new(),
            root: args.root,
            supervisor: args.supervisor,
            deps: args.deps,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<JobMsg>,
        state: &mut JobState,
    ) -> Result<(), ActorProcessingErr> {
        state.arm_timers(&myself);
        let every = state.deps.cfg.ring.resync_ms;
        if every > 0 {
            myself.send_interval(Duration::from_millis(every), || JobMsg::Reassign);
        }
        if state.placed.is_some() && !state.job.phase.is_terminal() {
            state.spawn_ring(&myself).await;
        }
        // Whatever a previous incarnation left half done (an aggregation in flight, a
        // deadline that passed while no actor ran) is done now.
        if !matches!(state.job.phase, JobPhase::Pending { .. }) {
            state.reconcile(&myself).await;
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<JobMsg>,
        msg: JobMsg,
        state: &mut JobState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            JobMsg::Place { nodes } => {
                if state.placed.is_none() && matches!(state.job.phase, JobPhase::Pending { .. }) {
                    state.placed = Some(nodes);
                    state.spawn_ring(&myself).await;
                } else {
                    // No longer pending, or placed already (a rebuilt actor read the same
                    // placement from the log): give back any node it does not use.
                    let mut nodes = nodes;
                    if let Some(placed) = &state.placed {
                        nodes.retain(|n| !placed.contains(n));
                    }
                    let _ =
                        state
                            .root
                            .cast(OrchestratorMsg::Scheduler(SchedulerMsg::ReleaseNodes {
                                job: state.job.id,
                                nodes,
                            }));
                }
            }
            JobMsg::RingChanged { ring } => state.on_ring(&myself, ring).await,
            JobMsg::NodeFailed { node } => {
                // The ring actor judges membership against its own (newest) ring: this
                // actor's copy may lag behind a standby just inserted.
                if let Some(r) = &state.ring_actor {
                    let _ = r.cast(RingMsg::NodeFailed { node });
                }
            }
            JobMsg::NodeReturned { node } => {
                if state
                    .ring
                    .as_ref()
                    .is_some_and(|r| r.members.contains(&node))
                {
                    // To that node only: after a failover every node returns, and a
                    // broadcast per return would send N² messages.
                    if let Some(r) = &state.ring_actor {
                        let _ = r.cast(RingMsg::ResyncTo { node });
                    }
                    state.assign_to(Some(node)).await;
                }
            }
            JobMsg::Delta { receipt, reply } => {
                let node = receipt.node;
                let result = if state.leaving.contains(&node) {
                    Err(JobRequestError::NotMember(node))
                } else {
                    match state.check_round_receipt(&node, &receipt.delta_hash) {
                        Ok(()) => accept_delta(state, receipt).await,
                        Err(e) => Err(e),
                    }
                };
                let accepted = result.is_ok();
                answer(reply, result);
                if accepted {
                    state.round_receipt_recorded(&myself, node).await;
                    state.check_epoch(&myself, false).await;
                }
            }
            JobMsg::Round { node, msg, reply } => {
                let evidence = matches!(msg, RoundMsg::Evidence { .. });
                let r = if state.leaving.contains(&node) {
                    Err(JobRequestError::NotMember(node))
                } else {
                    state.on_round_msg(&myself, node, msg).await
                };
                let accepted = r.is_ok();
                answer(reply, r);
                if evidence && accepted {
                    // The last evidence a fallback waits for may complete the epoch.
                    state.check_epoch(&myself, false).await;
                }
            }
            JobMsg::RoundScored { epoch, result } => {
                state.on_round_scored(&myself, epoch, result).await
            }
            JobMsg::RoundChecked {
                epoch,
                version,
                result,
            } => {
                state
                    .on_round_checked(&myself, epoch, version, result)
                    .await
            }
            JobMsg::RoundTick { epoch } => state.on_round_tick(&myself, epoch).await,
            JobMsg::EpochDeadline { epoch } => {
                if matches!(state.job.phase, JobPhase::Running { epoch: e, .. } if e == epoch) {
                    tracing::info!(job = %state.job.id, epoch, deltas = state.receipts.len(), "epoch deadline passed");
                    state.check_epoch(&myself, true).await;
                }
            }
            JobMsg::PendingDeadline => state.pending_deadline(&myself).await,
            JobMsg::Cancel { reply } => {
                // Accepted at once; applied after a running publication (which it does not
                // undo: that epoch is published and paid).
                let r = state.transition_or_hold(&myself, JobEvent::Cancel).await;
                answer(reply, r);
            }
            JobMsg::Get { reply } => answer(reply, Ok(state.view())),
            JobMsg::GetRing { reply } => answer(reply, Ok(state.ring.clone())),
            JobMsg::RespawnRing => {
                if state.ring_actor.is_none() && !state.job.phase.is_terminal() {
                    state.spawn_ring(&myself).await;
                    if state.ring_actor.is_some() {
                        state.deps.metrics.incr(Counter::ActorRestarts, "ring", 1);
                        state.deps.notify(Notice::ActorRestarted {
                            what: format!("ring {}", state.job.id),
                        });
                    }
                }
            }
            JobMsg::Reconcile => state.reconcile(&myself).await,
            JobMsg::Published {
                epoch,
                result,
                standing,
            } => state.on_published(&myself, epoch, result, standing).await,
            JobMsg::Reassign => state.assign().await,
            #[cfg(feature = "fault-injection")]
            JobMsg::InjectPanic => panic!("injected fault: job actor panic"),
            #[cfg(feature = "fault-injection")]
            JobMsg::InjectRingPanic { reply } => {
                let found = state.ring_actor.is_some();
                if let Some(r) = &state.ring_actor {
                    let _ = r.cast(RingMsg::InjectPanic);
                }
                answer(reply, found);
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<JobMsg>,
        event: SupervisionEvent,
        state: &mut JobState,
    ) -> Result<(), ActorProcessingErr> {
        let Some((job, why)) = state.children.failed(&event) else {
            return Ok(());
        };
        state.ring_actor = None;
        tracing::warn!(%job, error = %why, "ring actor failed; rebuilding from the event log");
        let decision = state.children.on_failure(&job, state.deps.now());
        if !schedule_respawn(&myself, decision, || JobMsg::RespawnRing) {
            let fail = JobEvent::Fail {
                reason: FailReason::Other("ring actor restart budget spent".into()),
            };
            let _ = state.transition(&myself, fail).await;
        }
        Ok(())
    }
}

/// What [`accept_delta`] does with a receipt that passed [`check_receipt`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReceiptCheck {
    /// A new receipt: record it.
    New,
    /// Exactly this receipt is recorded already (a retried upload): acknowledge it again.
    AlreadyRecorded,
}

/// The checks of a receipt against the job's `phase`, `ring` and the current epoch's
/// `receipts`: Running in the receipt's epoch, the node in the ring, and no other receipt
/// of the node this epoch. A second receipt is idempotent only when it is equal in every
/// field (delta hash, step, claimed loss, signature); one that differs in any is
/// [`JobRequestError::Conflicting`].
fn check_receipt(
    phase: &JobPhase,
    ring: Option<&RingView>,
    receipts: &BTreeMap<NodeId, DeltaReceipt>,
    receipt: &DeltaReceipt,
) -> Result<ReceiptCheck, JobRequestError> {
    let JobPhase::Running { epoch, .. } = *phase else {
        return Err(JobRequestError::NotRunning {
            phase: phase.name().to_string(),
        });
    };
    if receipt.epoch != epoch {
        return Err(JobRequestError::WrongEpoch {
            expected: epoch,
            got: receipt.epoch,
        });
    }
    if !ring.is_some_and(|r| r.members.contains(&receipt.node)) {
        return Err(JobRequestError::NotMember(receipt.node));
    }
    match receipts.get(&receipt.node) {
        None => Ok(ReceiptCheck::New),
        Some(prev) if prev == receipt => Ok(ReceiptCheck::AlreadyRecorded),
        Some(_) => Err(JobRequestError::Conflicting(receipt.node)),
    }
}

async fn accept_delta(state: &mut JobState, receipt: DeltaReceipt) -> Result<(), JobRequestError> {
    let check = check_receipt(
        &state.job.phase,
        state.ring.as_ref(),
        &state.receipts,
        &receipt,
    )?;
    if check == ReceiptCheck::AlreadyRecorded {
        return Ok(());
    }
    // One receipt per (job, node, epoch, delta): its id is its content, so a receipt whose
    // first append landed after its caller gave up is not recorded again on the retry.
    let id = {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        h.update(crate::domain::RECEIPT);
        h.update(receipt.job.0.to_be_bytes());
        h.update(receipt.node.0);
        h.update(receipt.epoch.to_be_bytes());
        h.update(receipt.delta_hash);
        let d = h.finalize();
        u128::from_be_bytes(d[..16].try_into().expect("16 bytes"))
    };
    state
        .deps
        .persist_once(id, Event::DeltaAccepted(receipt.clone()))
        .await
        .map_err(|e| JobRequestError::Store(e.to_string()))?;
    state.receipts.insert(receipt.node, receipt);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::JobSpec;
    use crate::types::GymWei;

    #[test]
    fn only_failures_and_cancels_wait_for_a_running_publication() {
        let fail = JobEvent::Fail {
            reason: FailReason::TooFewNodes { alive: 1, min: 2 },
        };
        assert!(holds_for_publication(true, &fail));
        assert!(holds_for_publication(true, &JobEvent::Cancel));
        assert!(!holds_for_publication(false, &fail));
        assert!(!holds_for_publication(false, &JobEvent::Cancel));
        assert!(!holds_for_publication(
            true,
            &JobEvent::RingChanged { ring_version: 3 }
        ));
    }

    fn node(b: u8) -> NodeId {
        NodeId([b; 32])
    }

    fn ring(members: &[u8]) -> RingView {
        RingView {
            job: JobId(7),
            version: 1,
            members: members.iter().map(|b| node(*b)).collect(),
            bottleneck_mbps: 100.0,
            estimated_links: 0,
        }
    }

    fn receipt(n: u8, epoch: u32, hash: u8) -> DeltaReceipt {
        DeltaReceipt {
            job: JobId(7),
            node: node(n),
            epoch,
            step: u64::from(epoch) * 20,
            delta_hash: [hash; 32],
            claimed_loss: 0.5,
            signature: vec![n; 64],
        }
    }

    fn running(epoch: u32) -> JobPhase {
        JobPhase::Running {
            epoch,
            ring_version: 1,
        }
    }

    #[test]
    fn a_receipt_is_checked_against_the_phase_the_epoch_and_the_ring() {
        let none = BTreeMap::new();
        let ring = ring(&[1, 2]);
        let r = receipt(1, 0, 9);
        assert_eq!(
            check_receipt(&running(0), Some(&ring), &none, &r),
            Ok(ReceiptCheck::New)
        );
        assert_eq!(
            check_receipt(&running(1), Some(&ring), &none, &r),
            Err(JobRequestError::WrongEpoch {
                expected: 1,
                got: 0
            })
        );
        assert_eq!(
            check_receipt(&running(0), None, &none, &r),
            Err(JobRequestError::NotMember(node(1)))
        );
        assert_eq!(
            check_receipt(&running(0), Some(&ring), &none, &receipt(3, 0, 9)),
            Err(JobRequestError::NotMember(node(3)))
        );
        let aggregating = JobPhase::Aggregating {
            epoch: 0,
            ring_version: 1,
        };
        assert!(matches!(
            check_receipt(&aggregating, Some(&ring), &none, &r),
            Err(JobRequestError::NotRunning { .. })
        ));
    }

    #[test]
    fn only_the_identical_receipt_is_idempotent() {
        let ring = ring(&[1, 2]);
        let first = receipt(1, 0, 9);
        let receipts = BTreeMap::from([(node(1), first.clone())]);
        let check = |r: &DeltaReceipt| check_receipt(&running(0), Some(&ring), &receipts, r);
        assert_eq!(check(&first), Ok(ReceiptCheck::AlreadyRecorded));
        // The same delta hash with anything else changed is another receipt.
        type Edit = fn(&mut DeltaReceipt);
        let edits: [(&str, Edit); 4] = [
            ("delta hash", |r| r.delta_hash[0] ^= 1),
            ("claimed loss", |r| r.claimed_loss = 0.25),
            ("signature", |r| r.signature[0] ^= 1),
            ("step", |r| r.step += 1),
        ];
        for (what, edit) in edits {
            let mut other = first.clone();
            edit(&mut other);
            assert_eq!(
                check(&other),
                Err(JobRequestError::Conflicting(node(1))),
                "{what}"
            );
        }
        // Another node's first receipt, even of the same delta, is new.
        let mut same_bytes = receipt(2, 0, 9);
        same_bytes.delta_hash = first.delta_hash;
        assert_eq!(check(&same_bytes), Ok(ReceiptCheck::New));
    }

    #[test]
    fn the_view_lists_the_hash_each_node_delivered_this_epoch() {
        let spec = JobSpec {
            name: "deltas".into(),
            epochs: 2,
            min_nodes: 2,
            max_nodes: 2,
            min_vram_bytes: 1 << 30,
            pending_deadline_ms: 60_000,
            epoch_deadline_ms: 60_000,
            utility: 1.0,
            submitter_stake: GymWei::gym(1_000),
            training: Default::default(),
        };
        let job = Job::new(JobId(7), spec, Timestamp(0));
        let receipts = BTreeMap::from([(node(1), receipt(1, 0, 9)), (node(2), receipt(2, 0, 8))]);
        let view = JobView::with_receipts(&job, Some(ring(&[1, 2])), &receipts);
        assert_eq!(view.deltas_this_epoch, 2);
        assert_eq!(
            view.delivered,
            BTreeMap::from([(node(1), [9; 32]), (node(2), [8; 32])])
        );
        let ended = JobView::of(&job, None, 0);
        assert!(ended.delivered.is_empty());
        // Views serialize with the node ids as keys and read back.
        let json = serde_json::to_string(&view).unwrap();
        assert_eq!(serde_json::from_str::<JobView>(&json).unwrap(), view);
    }
}
