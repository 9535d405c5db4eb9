//! `RingActor`: one per job ring. Builds the ring when the job is placed (paper
//! Algorithm 1 through the configured [`RingBuilder`](crate::ring::RingBuilder)), and
//! repairs it when members fail (paper Algorithm 2): failures reported within the
//! coalescing window are one reconfiguration, standbys come from the scheduler, every change
//! is recorded with a strictly higher version before it is broadcast to the members.
//!
//! A rebuilt RingActor replays the log: the latest ring, plus any member failure recorded
//! after it (recovery still owed), so nothing is lost when it crashes mid-reconfiguration.

use crate::ports::{Counter, Histogram};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef};

use super::msg::JobMsg;
use super::msg::OrchestratorMsg;
use super::msg::SchedulerMsg;
use super::msg::{LinkSnapshot, RegistryMsg};
use super::{answer, ask, Deps, Notice};
use crate::events::Event;
use crate::ports::{NodeCommand, RingView};
use crate::ring::{bottleneck, is_permutation, recover, BandwidthMatrix, LinkEstimate};
use crate::types::{JobId, NodeId};

pub use super::msg::RingMsg;

/// Spawn arguments of a [`RingActor`].
pub struct RingActorArgs {
    /// The job.
    pub job: JobId,
    /// The job's VRAM minimum for standbys, bytes.
    pub min_vram_bytes: u64,
    /// The job actor, told of every recorded change.
    pub parent: ActorRef<JobMsg>,
    /// The root, for routing.
    pub root: ActorRef<OrchestratorMsg>,
    /// Ports.
    pub deps: Deps,
}

/// State of a [`RingActor`].
pub struct RingState {
    job: JobId,
    min_vram_bytes: u64,
    ring: Option<RingView>,
    placed: Vec<NodeId>,
    pending_failures: BTreeSet<NodeId>,
    window_open: bool,
    /// When the oldest failure still owed a reconfiguration was reported (tokio time).
    first_failure: Option<tokio::time::Instant>,
    parent: ActorRef<JobMsg>,
    root: ActorRef<OrchestratorMsg>,
    deps: Deps,
}

/// The per-ring actor.
pub struct RingActor;

impl RingState {
    /// The bandwidth matrix among `nodes` (measured where probed, estimated elsewhere),
    /// their regions, and which are alive.
    async fn links(&self, nodes: &[NodeId]) -> (BandwidthMatrix, Vec<String>, Vec<bool>) {
        let snap = ask(&self.root, &self.deps, |reply| {
            OrchestratorMsg::Registry(RegistryMsg::Links {
                nodes: nodes.to_vec(),
                reply,
            })
        })
        .await
        .unwrap_or_else(|e| {
            tracing::warn!(job = %self.job, error = %e, "no link data; ring built on zero estimates");
            LinkSnapshot {
                profiles: vec![Default::default(); nodes.len()],
                regions: vec![String::new(); nodes.len()],
                alive: vec![true; nodes.len()],
                measured: vec![],
            }
        });
        let est = LinkEstimate {
            cross_region: self.deps.cfg.ring.cross_region_factor,
            ..LinkEstimate::default()
        };
        let mut bw = BandwidthMatrix::estimate_from_profiles(&snap.profiles, &snap.regions, &est);
        for (i, j, mbps) in snap.measured {
            bw.set(i, j, mbps, false);
        }
        (bw, snap.regions, snap.alive)
    }

    /// Records `ring`, broadcasts it to its members, tells the job.
    async fn commit(
        &mut self,
        ring: RingView,
        removed: Vec<NodeId>,
        added: Vec<NodeId>,
    ) -> Result<(), ActorProcessingErr> {
        self.deps
            .persist(Event::RingChanged {
                ring: ring.clone(),
                removed: removed.clone(),
                added: added.clone(),
            })
            .await?;
        let change = if ring.version == 1 {
            "formed"
        } else {
            "reconfigured"
        };
        self.deps.metrics.incr(Counter::RingChanges, change, 1);
        let repair = self.first_failure.take().map(|t| t.elapsed());
        if let Some(t) = repair {
            self.deps
                .metrics
                .observe(Histogram::RingRepairSeconds, t.as_secs_f64());
        }
        self.ring = Some(ring.clone());
        self.broadcast().await;
        // Released right after the record, by the actor that made it: a job actor that dies
        // before hearing of the change cannot leak them.
        self.release(removed.clone()).await;
        // The job hears of it before watchers do, so a watcher reading the job after the
        // notice sees this ring (usually: the job actor may still be busy).
        let _ = self.parent.cast(JobMsg::RingChanged { ring: ring.clone() });
        self.deps.notify(Notice::RingChanged {
            ring,
            removed,
            added,
            repair_ms: repair.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
        });
        Ok(())
    }

    /// Sends the current ring to `node`, if it is a member.
    async fn send_to(&self, node: NodeId) {
        let Some(ring) = &self.ring else { return };
        if !ring.members.contains(&node) {
            return;
        }
        if let Err(e) = self
            .deps
            .link
            .send(&node, NodeCommand::RingUpdate(ring.clone()))
            .await
        {
            tracing::debug!(node = %node.short(), error = %e, "ring update not delivered");
        }
    }

    async fn broadcast(&self) {
        let Some(ring) = &self.ring else { return };
        for m in &ring.members {
            if let Err(e) = self
                .deps
                .link
                .send(m, NodeCommand::RingUpdate(ring.clone()))
                .await
            {
                // The member's own failure detection will remove it if it is gone.
                tracing::debug!(node = %m.short(), error = %e, "ring update not delivered");
            }
        }
    }

    async fn form(&mut self) -> Result<(), ActorProcessingErr> {
        let started = Instant::now();
        // Nodes that failed between placement and formation are left out from the start.
        let (mut bw, mut regions, alive) = self.links(&self.placed).await;
        let (mut nodes, mut dead) = (vec![], vec![]);
        for (n, a) in self.placed.iter().zip(alive) {
            if a {
                nodes.push(*n);
            } else {
                dead.push(*n);
            }
        }
        if !dead.is_empty() {
            (bw, regions, _) = self.links(&nodes).await;
        }
        let mut order = self.deps.ring_builder.build(&bw, &regions);
        if !is_permutation(&order, nodes.len()) {
            // A custom builder broke its contract: never put a node in twice or index past
            // the members; fall back to placement order and say so.
            tracing::error!(job = %self.job, builder = self.deps.ring_builder.name(),
                "ring builder returned an invalid order; using placement order");
            order = (0..nodes.len()).collect();
        }
        let members: Vec<NodeId> = order.iter().map(|&i| nodes[i]).collect();
        let ring = RingView {
            job: self.job,
            version: 1,
            bottleneck_mbps: finite(bottleneck(&bw, &order)),
            estimated_links: estimated_links(&bw, &order),
            members,
        };
        tracing::info!(job = %self.job, members = ring.members.len(), bottleneck_mbps = ring.bottleneck_mbps,
            builder = self.deps.ring_builder.name(), elapsed_us = started.elapsed().as_micros() as u64, "ring formed");
        self.commit(ring, dead, vec![]).await
    }

    /// Repairs the ring for every pending failure, plus any member the registry reports
    /// dead (a failure whose record or notice was lost is still caught here). When the new
    /// ring cannot be recorded, the standbys are given back and it is tried again later.
    async fn reconfigure(&mut self, myself: &ActorRef<RingMsg>) {
        self.window_open = false;
        let Some(current) = self.ring.clone() else {
            return;
        };
        let (_, _, alive) = self.links(&current.members).await;
        let failed: Vec<NodeId> = current
            .members
            .iter()
            .zip(alive)
            .filter(|(m, alive)| self.pending_failures.contains(m) || !alive)
            .map(|(m, _)| *m)
            .collect();
        self.pending_failures.clear();
        if failed.is_empty() {
            self.first_failure = None;
            return;
        }
        let started = Instant::now();
        let standbys: Vec<NodeId> = ask(&self.root, &self.deps, |reply| {
            OrchestratorMsg::Scheduler(SchedulerMsg::RequestStandby {
                job: self.job,
                count: failed.len(),
                min_vram_bytes: self.min_vram_bytes,
                reply,
            })
        })
        .await
        .unwrap_or_else(|e| {
            tracing::warn!(job = %self.job, error = %e, "no standby: scheduler did not answer");
            vec![]
        });
        let mut nodes = current.members.clone();
        nodes.extend(standbys.iter().copied());
        let (bw, _, _) = self.links(&nodes).await;
        let order: Vec<usize> = (0..current.members.len()).collect();
        let failed_idx: Vec<usize> = order
            .iter()
            .copied()
            .filter(|&i| failed.contains(&nodes[i]))
            .collect();
        let standby_idx: Vec<usize> = (current.members.len()..nodes.len()).collect();
        let plan = recover(&order, &failed_idx, &standby_idx, &bw);
        let ring = RingView {
            job: self.job,
            version: current.version + 1,
            members: plan.order.iter().map(|&i| nodes[i]).collect(),
            bottleneck_mbps: finite(plan.bottleneck),
            estimated_links: estimated_links(&bw, &plan.order),
        };
        tracing::info!(job = %self.job, version = ring.version, removed = failed.len(), added = standbys.len(),
            members = ring.members.len(), elapsed_us = started.elapsed().as_micros() as u64, "ring reconfigured");
        if let Err(e) = self.commit(ring, failed.clone(), standbys.clone()).await {
            tracing::warn!(job = %self.job, error = %e, "new ring not recorded; retrying");
            self.release(standbys).await;
            self.pending_failures.extend(failed);
            self.window_open = true;
            let wait = Duration::from_millis(self.deps.cfg.supervision.backoff_max_ms);
            myself.send_after(wait, || RingMsg::Reconfigure);
        }
    }

    /// Gives `nodes` back to the scheduler and tells them they left the job.
    async fn release(&self, nodes: Vec<NodeId>) {
        if nodes.is_empty() {
            return;
        }
        for n in &nodes {
            let _ = self
                .deps
                .link
                .send(n, NodeCommand::Release { job: self.job })
                .await;
        }
        let _ = self
            .root
            .cast(OrchestratorMsg::Scheduler(SchedulerMsg::ReleaseNodes {
                job: self.job,
                nodes,
            }));
    }
}

/// Ring links `order[k] → order[k+1]` (and the closing one) whose bandwidth is estimated.
fn estimated_links(bw: &BandwidthMatrix, order: &[usize]) -> u32 {
    if order.len() < 2 {
        return 0;
    }
    let n = order.len();
    (0..n)
        .filter(|&k| bw.is_estimated(order[k], order[(k + 1) % n]))
        .count() as u32
}

fn finite(x: f32) -> f32 {
    if x.is_finite() {
        x
    } else {
        0.0
    }
}

impl Actor for RingActor {
    type Msg = RingMsg;
    type State = RingState;
    type Arguments = RingActorArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<RingMsg>,
        args: RingActorArgs,
    ) -> Result<RingState, ActorProcessingErr> {
        let mut fold = crate::replay::load(&*args.deps.store).await?;
        let j = fold
            .jobs
            .remove(&args.job)
            .ok_or_else(|| format!("{} is not in the event log", args.job))?;
        Ok(RingState {
            job: args.job,
            min_vram_bytes: args.min_vram_bytes,
            ring: j.ring.map(|(_, r)| r),
            placed: j.placed.unwrap_or_default(),
            first_failure: (!j.failed_since_ring.is_empty()).then(tokio::time::Instant::now),
            pending_failures: j.failed_since_ring,
            window_open: false,
            parent: args.parent,
            root: args.root,
            deps: args.deps,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<RingMsg>,
        state: &mut RingState,
    ) -> Result<(), ActorProcessingErr> {
        let every = state.deps.cfg.ring.resync_ms;
        if every > 0 {
            myself.send_interval(Duration::from_millis(every), || RingMsg::Resync);
        }
        match &state.ring {
            None => state.form().await?,
            Some(ring) => {
                // Rebuilt: resend the recorded ring (members ignore a version they have),
                // then owe any recovery the log shows.
                let ring = ring.clone();
                state.broadcast().await;
                let _ = state.parent.cast(JobMsg::RingChanged { ring });
                // Recovery owed by the log, or members that died while no ring actor ran.
                state.reconfigure(&myself).await;
            }
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<RingMsg>,
        msg: RingMsg,
        state: &mut RingState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            RingMsg::NodeFailed { node } => {
                let member = state
                    .ring
                    .as_ref()
                    .is_some_and(|r| r.members.contains(&node));
                if member && state.pending_failures.insert(node) && !state.window_open {
                    state
                        .first_failure
                        .get_or_insert_with(tokio::time::Instant::now);
                    state.window_open = true;
                    let wait = Duration::from_millis(state.deps.cfg.ring.coalesce_ms);
                    myself.send_after(wait, || RingMsg::Reconfigure);
                }
            }
            RingMsg::Reconfigure => state.reconfigure(&myself).await,
            RingMsg::Resync => state.broadcast().await,
            RingMsg::ResyncTo { node } => state.send_to(node).await,
            RingMsg::Get { reply } => answer(reply, state.ring.clone()),
            #[cfg(feature = "fault-injection")]
            RingMsg::InjectPanic => panic!("injected fault: ring actor panic"),
        }
        Ok(())
    }
}
