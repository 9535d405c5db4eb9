//! `Scheduler`: the pending queue and the allocator of nodes. It matches pending jobs with
//! eligible, unassigned nodes through the [`SchedulingPolicy`](crate::sched::SchedulingPolicy),
//! records each placement, and hands out standbys to rings that lost members.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};

use super::msg::JobSupervisorMsg;
use super::msg::OrchestratorMsg;
use super::msg::RegistryMsg;
use super::{answer, ask, Deps};
use crate::events::Event;
use crate::sched::{check_eligibility, shortage, NodeView, PendingJob};
use crate::types::{JobId, NodeId, Timestamp};

pub use super::msg::SchedulerMsg;
use crate::sched::pending_of;

/// Spawn arguments of the [`Scheduler`].
pub struct SchedulerArgs {
    /// The root, for routing.
    pub root: ActorRef<OrchestratorMsg>,
    /// Ports.
    pub deps: Deps,
}

/// State of the [`Scheduler`].
pub struct SchedulerState {
    pending: BTreeMap<JobId, PendingJob>,
    assigned: HashMap<NodeId, JobId>,
    root: ActorRef<OrchestratorMsg>,
    deps: Deps,
    /// A match is queued (coalesces bursts of NodesChanged).
    match_queued: bool,
    placements: u64,
    /// The last shortage logged for each job still pending: logged again only when the
    /// reasons change, so a job waiting for hours is one line per change, not per tick.
    explained: HashMap<JobId, String>,
}

/// The scheduler actor.
pub struct Scheduler;

/// Most pending jobs whose shortage one match logs (`explain_waiting`).
const EXPLAINED_PER_MATCH: usize = 32;

impl SchedulerState {
    async fn nodes(&self) -> Vec<NodeView> {
        match ask(&self.root, &self.deps, |reply| {
            OrchestratorMsg::Registry(RegistryMsg::Snapshot { reply })
        })
        .await
        {
            Ok(mut nodes) => {
                for n in &mut nodes {
                    n.assigned = self.assigned.get(&n.id).copied();
                }
                nodes
            }
            Err(e) => {
                tracing::warn!(error = %e, "scheduler could not read the node registry");
                vec![]
            }
        }
    }

    async fn run_match(&mut self) {
        self.match_queued = false;
        if self.pending.is_empty() {
            return;
        }
        let nodes = self.nodes().await;
        let now = self.deps.now();
        let jobs: Vec<PendingJob> = self.pending.values().cloned().collect();
        let rules = self.deps.cfg.eligibility.rules();
        let placements = self.deps.policy.schedule(&jobs, &nodes, &rules, now);
        for p in placements {
            if !self.pending.contains_key(&p.job)
                || p.nodes.iter().any(|n| self.assigned.contains_key(n))
            {
                tracing::error!(job = %p.job, "policy returned an invalid placement; ignored");
                continue;
            }
            if let Err(e) = self
                .deps
                .persist(Event::JobPlaced {
                    job: p.job,
                    nodes: p.nodes.clone(),
                })
                .await
            {
                tracing::warn!(job = %p.job, error = %e, "could not record placement; will retry");
                continue;
            }
            self.pending.remove(&p.job);
            for n in &p.nodes {
                self.assigned.insert(*n, p.job);
            }
            self.placements += 1;
            self.explained.remove(&p.job);
            tracing::info!(job = %p.job, nodes = p.nodes.len(), "job placed");
            let _ = self
                .root
                .cast(OrchestratorMsg::Jobs(JobSupervisorMsg::Place {
                    job: p.job,
                    nodes: p.nodes,
                }));
        }
        self.explain_waiting(&nodes, now);
    }

    /// Says, for each job still pending after a match, which rules left the nodes out
    /// ([`shortage`]: the nodes counted by the first rule each fails: penalty, stake, VRAM,
    /// uptime, …), once per change of the reasons.
    fn explain_waiting(&mut self, nodes: &[NodeView], now: Timestamp) {
        let rules = self.deps.cfg.eligibility.rules();
        self.explained
            .retain(|job, _| self.pending.contains_key(job));
        // The oldest ids first, a bounded number per match: each costs a pass over the nodes.
        for (id, job) in self.pending.iter().take(EXPLAINED_PER_MATCH) {
            let why = shortage(&rules, job, nodes, now).to_string();
            if self.explained.get(id) != Some(&why) {
                tracing::info!(job = %id, shortage = %why, "job waits for nodes");
                self.explained.insert(*id, why);
            }
        }
    }

    fn queue_match(&mut self, myself: &ActorRef<SchedulerMsg>) {
        if !self.match_queued {
            self.match_queued = true;
            let _ = myself.cast(SchedulerMsg::Tick);
        }
    }
}

impl Actor for Scheduler {
    type Msg = SchedulerMsg;
    type State = SchedulerState;
    type Arguments = SchedulerArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<SchedulerMsg>,
        args: SchedulerArgs,
    ) -> Result<SchedulerState, ActorProcessingErr> {
        // Rebuild the queue and the allocation from the log.
        let fold = crate::replay::load(&*args.deps.store).await?;
        let mut pending = BTreeMap::new();
        let mut assigned = HashMap::new();
        for (id, j) in &fold.jobs {
            if j.job.phase.is_terminal() {
                continue;
            }
            match (&j.ring, &j.placed) {
                (Some((_, ring)), _) => {
                    for m in ring.members.iter().chain(&j.granted_since_ring) {
                        assigned.insert(*m, *id);
                    }
                }
                (None, Some(nodes)) => {
                    for m in nodes {
                        assigned.insert(*m, *id);
                    }
                }
                (None, None) => {
                    if let Some(p) = pending_of(&j.job) {
                        pending.insert(*id, p);
                    }
                }
            }
        }
        let tick = Duration::from_millis(args.deps.cfg.scheduler.tick_ms.max(1));
        myself.send_interval(tick, || SchedulerMsg::Tick);
        Ok(SchedulerState {
            pending,
            assigned,
            root: args.root,
            deps: args.deps,
            match_queued: false,
            placements: 0,
            explained: HashMap::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<SchedulerMsg>,
        msg: SchedulerMsg,
        state: &mut SchedulerState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SchedulerMsg::Enqueue(job) => {
                // A late enqueue of a job a rebuilt scheduler already placed from the log
                // must not place it twice.
                if !state.assigned.values().any(|j| *j == job.id) {
                    state.pending.insert(job.id, job);
                    state.queue_match(&myself);
                }
            }
            SchedulerMsg::Tick => state.run_match().await,
            SchedulerMsg::NodesChanged => state.queue_match(&myself),
            SchedulerMsg::Release { job } => {
                state.pending.remove(&job);
                state.assigned.retain(|_, j| *j != job);
                state.queue_match(&myself);
            }
            SchedulerMsg::ReleaseNodes { job, nodes } => {
                for n in nodes {
                    if state.assigned.get(&n) == Some(&job) {
                        state.assigned.remove(&n);
                    }
                }
                state.queue_match(&myself);
            }
            SchedulerMsg::RequestStandby {
                job,
                count,
                min_vram_bytes,
                reply,
            } => {
                let mut nodes = state.nodes().await;
                let now = state.deps.now();
                let rules = state.deps.cfg.eligibility.rules();
                nodes.retain(|n| check_eligibility(&rules, n, min_vram_bytes, now).is_ok());
                // Best first: larger stake × uptime, then id (deterministic).
                nodes.sort_by(|a, b| {
                    let ka = a.stake.as_gym_f64() * a.uptime;
                    let kb = b.stake.as_gym_f64() * b.uptime;
                    kb.total_cmp(&ka).then(a.id.cmp(&b.id))
                });
                let mut given: Vec<NodeId> = nodes.into_iter().take(count).map(|n| n.id).collect();
                if reply.is_closed() {
                    given.clear(); // the ring actor gave up waiting: grant nothing
                }
                if !given.is_empty() {
                    // Durable before it is answered: a rebuilt scheduler keeps them the job's.
                    let event = Event::StandbysGranted {
                        job,
                        nodes: given.clone(),
                    };
                    if let Err(e) = state.deps.persist(event).await {
                        tracing::warn!(%job, error = %e, "standby grant not recorded; none given");
                        given.clear();
                    }
                }
                for n in &given {
                    state.assigned.insert(*n, job);
                }
                answer(reply, given);
            }
            #[cfg(feature = "fault-injection")]
            SchedulerMsg::Panic => panic!("injected fault: scheduler panic"),
            SchedulerMsg::Explain { job, reply } => {
                let nodes = state.nodes().await;
                let rules = state.deps.cfg.eligibility.rules();
                answer(reply, shortage(&rules, &job, &nodes, state.deps.now()));
            }
            SchedulerMsg::Inspect { reply } => {
                let assigned = state.assigned.iter().map(|(n, j)| (*n, *j)).collect();
                answer(reply, (state.pending.keys().copied().collect(), assigned));
            }
        }
        Ok(())
    }
}
