//! `RingActor`: one per job ring. Builds the ring when the job is placed (paper
//! Algorithm 1 through the configured [`RingBuilder`](crate::ring::RingBuilder)), and
//! repairs it when members fail (paper Algorithm 2), standbys coming from the scheduler.
//! Failures are coalesced on the leading edge ([`coalesce`]): a failure reported while no
//! coalescing window is open is applied at once and opens a window of
//! `core.ring.coalesce_ms`, re-opened when that reconfiguration finishes; the failures
//! reported within it (or while that reconfiguration ran) are applied together when it
//! closes. Every change is recorded with a strictly higher version before it is broadcast
//! to the members.
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
use coalesce::{Coalescer, OnFailure};

pub use super::msg::RingMsg;

pub mod coalesce;

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
    /// Failures the next reconfiguration applies (given by the coalescer, or replayed).
    pending_failures: BTreeSet<NodeId>,
    /// Which failures to apply now and which to hold for the coalescing window.
    coalescer: Coalescer<NodeId, tokio::time::Instant>,
    /// A new ring could not be recorded and a retry is scheduled: failures reported
    /// meanwhile wait for it.
    retry_scheduled: bool,
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
        // The placed nodes' standing as the chain has it now (an idle node's was read at
        // its admission): the registry takes it before the links are asked for, so a node
        // slashed meanwhile is left out like a dead one (DESIGN §3, "Standing").
        let standing = super::standing::read_standing(&self.deps, &self.placed).await;
        if let Err(e) = super::standing::record(&self.root, &self.deps, &standing).await {
            tracing::warn!(job = %self.job, error = %e, "registry did not take the placed nodes' standing");
        }
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
            if !self.retry_scheduled {
                self.retry_scheduled = true;
                let wait = Duration::from_millis(self.deps.cfg.supervision.backoff_max_ms);
                myself.send_after(wait, || RingMsg::Reconfigure);
            }
        }
    }

    /// `node` was reported failed: applied at once when no coalescing window is open (the
    /// leading edge), held until the open window closes otherwise.
    async fn on_failure(&mut self, myself: &ActorRef<RingMsg>, node: NodeId) {
        let member = self
            .ring
            .as_ref()
            .is_some_and(|r| r.members.contains(&node));
        if !member || self.pending_failures.contains(&node) {
            return;
        }
        let now = tokio::time::Instant::now();
        if self.retry_scheduled {
            // A new ring could not be recorded: the scheduled retry applies this one too.
            self.first_failure.get_or_insert(now);
            self.pending_failures.insert(node);
            return;
        }
        match self.coalescer.on_failure(node, now) {
            OnFailure::ApplyNow { batch, close_at } => {
                self.first_failure.get_or_insert(now);
                self.pending_failures.extend(batch);
                let wait = close_at.saturating_duration_since(now);
                myself.send_after(wait, || RingMsg::WindowClosed);
                self.reconfigure(myself).await;
                // Failures reported while it ran waited in the mailbox: the window re-opens
                // from its end, so they are held and batched rather than each a leading edge.
                let done = tokio::time::Instant::now();
                if let Some(close_at) = self.coalescer.on_applied(done) {
                    let wait = close_at.saturating_duration_since(done);
                    myself.send_after(wait, || RingMsg::WindowClosed);
                }
            }
            OnFailure::Held { .. } => {
                self.first_failure.get_or_insert(now);
            }
            OnFailure::AlreadyHeld => {}
        }
    }

    /// The coalescing window closed: the failures held during it are one reconfiguration.
    async fn on_window_closed(&mut self, myself: &ActorRef<RingMsg>) {
        let batch = self.coalescer.on_window_closed(tokio::time::Instant::now());
        if batch.is_empty() {
            return;
        }
        self.pending_failures.extend(batch);
        if !self.retry_scheduled {
            self.reconfigure(myself).await;
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
            coalescer: Coalescer::new(Duration::from_millis(args.deps.cfg.ring.coalesce_ms)),
            retry_scheduled: false,
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
            // Leaving for standing is repaired like a failure; the registry's link snapshot
            // also reports the member as gone, so a rebuilt ring actor removes it too.
            RingMsg::NodeFailed { node } | RingMsg::Leave { node } => {
                state.on_failure(&myself, node).await
            }
            RingMsg::WindowClosed => state.on_window_closed(&myself).await,
            RingMsg::Reconfigure => {
                state.retry_scheduled = false;
                state.reconfigure(&myself).await;
            }
            RingMsg::Resync => state.broadcast().await,
            RingMsg::ResyncTo { node } => state.send_to(node).await,
            RingMsg::Get { reply } => answer(reply, state.ring.clone()),
            #[cfg(feature = "fault-injection")]
            RingMsg::InjectPanic => panic!("injected fault: ring actor panic"),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! The ring actor's coalescing under paused tokio time: a lone failure is repaired
    //! without waiting for the window, a burst within the window is at most two new rings.

    use std::sync::Arc;
    use std::time::Duration;

    use tokio::sync::broadcast;
    use tokio::time::Instant;

    use crate::actor::Notice;
    use crate::config::CoreConfig;
    use crate::events::{Event, Record};
    use crate::job::JobSpec;
    use crate::ports::memory::{ChannelNodeLink, MemoryChain, MemoryStateStore};
    use crate::ports::{RingView, Snapshot, StateStore, StoreError};
    use crate::types::{GymWei, JobId, NodeId, NodeInfo, Timestamp};
    use crate::{Orchestrator, OrchestratorHandle};

    const NODES: usize = 12;

    fn id(i: usize) -> NodeId {
        NodeId([i as u8 + 1; 32])
    }

    /// A state store whose appends of a ring change (version 2 on, so a reconfiguration's
    /// commit) take `delay` of tokio time.
    #[derive(Debug)]
    struct SlowRingStore {
        inner: Arc<dyn StateStore>,
        delay: Duration,
    }

    impl SlowRingStore {
        async fn stall(&self, event: &Event) {
            if matches!(event, Event::RingChanged { ring, .. } if ring.version >= 2) {
                tokio::time::sleep(self.delay).await;
            }
        }
    }

    #[async_trait::async_trait]
    impl StateStore for SlowRingStore {
        async fn append(&self, at: Timestamp, event: Event) -> Result<u64, StoreError> {
            self.stall(&event).await;
            self.inner.append(at, event).await
        }
        async fn append_once(
            &self,
            id: u128,
            at: Timestamp,
            event: Event,
        ) -> Result<u64, StoreError> {
            self.stall(&event).await;
            self.inner.append_once(id, at, event).await
        }
        async fn read_after(&self, after: u64) -> Result<Vec<Record>, StoreError> {
            self.inner.read_after(after).await
        }
        async fn last_seq(&self) -> Result<u64, StoreError> {
            self.inner.last_seq().await
        }
        async fn put_snapshot(&self, key: &str, snapshot: Snapshot) -> Result<(), StoreError> {
            self.inner.put_snapshot(key, snapshot).await
        }
        async fn get_snapshot(&self, key: &str) -> Result<Option<Snapshot>, StoreError> {
            self.inner.get_snapshot(key).await
        }
        async fn log_id(&self) -> Result<[u8; 16], StoreError> {
            self.inner.log_id().await
        }
        fn fenced(&self, token: u64) -> Arc<dyn StateStore> {
            Arc::new(SlowRingStore {
                inner: self.inner.fenced(token),
                delay: self.delay,
            })
        }
    }

    /// An orchestrator with `NODES` registered nodes and one job on a ring of all of them;
    /// returns the notices after ring v1.
    async fn formed() -> (
        OrchestratorHandle,
        JobId,
        RingView,
        broadcast::Receiver<Notice>,
    ) {
        formed_with(Arc::new(MemoryStateStore::new())).await
    }

    /// [`formed`] on `store`.
    async fn formed_with(
        store: Arc<dyn StateStore>,
    ) -> (
        OrchestratorHandle,
        JobId,
        RingView,
        broadcast::Receiver<Notice>,
    ) {
        let orch = Orchestrator::builder()
            .config(CoreConfig::default())
            .state_store(store)
            .chain(Arc::new(MemoryChain::with_default_stake(GymWei::gym(
                20_000,
            ))))
            .node_link(Arc::new(ChannelNodeLink::new()))
            .start()
            .await
            .unwrap();
        let mut notices = orch.subscribe();
        for i in 0..NODES {
            let info = NodeInfo {
                id: id(i),
                region: ["eu", "us", "ap"][i % 3].into(),
                ..Default::default()
            };
            orch.register_node(info).await.unwrap();
        }
        let job = orch
            .submit_job(JobSpec {
                name: "coalesce".into(),
                epochs: 100,
                min_nodes: 2,
                max_nodes: NODES as u32,
                min_vram_bytes: 0,
                pending_deadline_ms: 600_000,
                epoch_deadline_ms: 3_600_000,
                utility: 1.0,
                submitter_stake: GymWei::gym(100_000),
                training: Default::default(),
            })
            .await
            .unwrap();
        let (v1, _) = next_ring(&mut notices, job).await;
        assert_eq!(v1.version, 1);
        assert_eq!(v1.members.len(), NODES);
        (orch, job, v1, notices)
    }

    /// The next ring of `job` recorded, and its repair time in ms (10 s of tokio time at
    /// most).
    async fn next_ring(
        notices: &mut broadcast::Receiver<Notice>,
        job: JobId,
    ) -> (RingView, Option<u64>) {
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match notices.recv().await.expect("notices") {
                    Notice::RingChanged {
                        ring, repair_ms, ..
                    } if ring.job == job => return (ring, repair_ms),
                    _ => {}
                }
            }
        })
        .await
        .expect("a new ring within 10 s (tokio time)")
    }

    /// Every ring of `job` recorded since the last look.
    fn rings_so_far(notices: &mut broadcast::Receiver<Notice>, job: JobId) -> Vec<RingView> {
        let mut rings = vec![];
        while let Ok(n) = notices.try_recv() {
            if let Notice::RingChanged { ring, .. } = n {
                if ring.job == job {
                    rings.push(ring);
                }
            }
        }
        rings
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_failure_is_repaired_without_waiting_for_the_window() {
        let (orch, job, v1, mut notices) = formed().await;
        let window = Duration::from_millis(orch.config().ring.coalesce_ms);
        assert!(window > Duration::ZERO);
        let victim = v1.members[3];
        let started = Instant::now();
        orch.session_closed(victim, 1);
        let (v2, repair_ms) = next_ring(&mut notices, job).await;
        // Paused time only moves when every task waits on a timer: a repair that waited
        // for the window would have let it advance by the window.
        assert!(
            started.elapsed() < window,
            "repaired after {:?}",
            started.elapsed()
        );
        assert!(repair_ms.is_some_and(|ms| ms < orch.config().ring.coalesce_ms));
        assert_eq!(v2.version, 2);
        assert_eq!(v2.members.len(), NODES - 1);
        assert!(!v2.members.contains(&victim));
        // The window closes with nothing held: no further ring.
        tokio::time::sleep(window * 5).await;
        assert!(rings_so_far(&mut notices, job).is_empty());
        assert_eq!(orch.ring(job).await.unwrap(), Some(v2));
        orch.shutdown().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_within_the_window_is_at_most_two_new_rings() {
        let (orch, job, v1, mut notices) = formed().await;
        let window = Duration::from_millis(orch.config().ring.coalesce_ms);
        let victims: Vec<NodeId> = v1.members[..5].to_vec();
        let started = Instant::now();
        for v in &victims {
            orch.session_closed(*v, 1);
        }
        // The first failure is applied at once.
        let (first, _) = next_ring(&mut notices, job).await;
        assert_eq!(first.version, 2);
        assert!(started.elapsed() < window, "{:?}", started.elapsed());
        tokio::time::sleep(window * 5).await;
        let mut rings = vec![first];
        rings.extend(rings_so_far(&mut notices, job));
        assert!(rings.len() <= 2, "{} new rings", rings.len());
        assert_consecutive_without(&orch, job, &rings, &victims).await;
        orch.shutdown().await;
    }

    /// A reconfiguration slower than the window: failures reported while it runs wait in
    /// the actor's mailbox and are seen only after it. The window re-opens from its end, so
    /// they (and those reported within the window after it) are one more ring, not a
    /// leading edge each. Staggered so the registry's own view of dead members cannot
    /// batch them instead: each arrives after the running reconfiguration asked it.
    #[tokio::test(start_paused = true)]
    async fn a_burst_behind_a_slow_reconfiguration_is_at_most_two_new_rings() {
        let window = Duration::from_millis(CoreConfig::default().ring.coalesce_ms);
        let slow = window * 3;
        let (orch, job, v1, mut notices) = formed_with(Arc::new(SlowRingStore {
            inner: Arc::new(MemoryStateStore::new()),
            delay: slow,
        }))
        .await;
        let victims: Vec<NodeId> = v1.members[..5].to_vec();
        let started = Instant::now();
        // The leading edge: its reconfiguration commits at `slow`.
        orch.session_closed(victims[0], 1);
        // While it runs (past the first window's deadline).
        tokio::time::sleep_until(started + window / 2).await;
        orch.session_closed(victims[1], 1);
        // After it, within a window of its end.
        tokio::time::sleep_until(started + slow + window / 2).await;
        for v in &victims[2..] {
            orch.session_closed(*v, 1);
        }
        tokio::time::sleep((window + slow) * 5).await;
        let rings = rings_so_far(&mut notices, job);
        assert!(
            (1..=2).contains(&rings.len()),
            "{} new rings: {:?}",
            rings.len(),
            rings.iter().map(|r| r.version).collect::<Vec<_>>()
        );
        assert_eq!(rings[0].version, 2);
        assert_consecutive_without(&orch, job, &rings, &victims).await;
        orch.shutdown().await;
    }

    /// `rings` (the new rings a burst gave) have consecutive versions, and the last, which
    /// is the orchestrator's current ring, holds every member but the `victims`.
    async fn assert_consecutive_without(
        orch: &OrchestratorHandle,
        job: JobId,
        rings: &[RingView],
        victims: &[NodeId],
    ) {
        let versions: Vec<u64> = rings.iter().map(|r| r.version).collect();
        assert!(
            versions.windows(2).all(|w| w[0] + 1 == w[1]),
            "{versions:?}"
        );
        let last = rings.last().unwrap();
        for v in victims {
            assert!(!last.members.contains(v), "{v:?} still on the ring");
        }
        assert_eq!(last.members.len(), NODES - victims.len());
        assert_eq!(orch.ring(job).await.unwrap().as_ref(), Some(last));
    }

    #[tokio::test(start_paused = true)]
    async fn failures_further_apart_than_the_window_are_each_repaired_at_once() {
        let (orch, job, v1, mut notices) = formed().await;
        let window = Duration::from_millis(orch.config().ring.coalesce_ms);
        for (k, victim) in v1.members[..3].iter().enumerate() {
            let started = Instant::now();
            orch.session_closed(*victim, 1);
            let (ring, _) = next_ring(&mut notices, job).await;
            assert!(started.elapsed() < window, "{:?}", started.elapsed());
            assert_eq!(ring.version, 2 + k as u64);
            assert!(!ring.members.contains(victim));
            tokio::time::sleep(window * 2).await;
        }
        orch.shutdown().await;
    }
}
