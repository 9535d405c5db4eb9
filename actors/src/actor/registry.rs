//! `NodeRegistry`: admits nodes (stake read from the chain), supervises one [`NodeActor`]
//! per node, keeps the latest status of each for the scheduler, and the link measurements.
//! After each admission it asks the node and some live peers to probe the links between
//! them ([`plan_probes`], `core.probe`; DESIGN §4), so measurements replace estimates.
//!
//! ```text
//! NodeRegistry
//! └── NodeActor per node   (a crash = a node failure; rebuilt as failed, awaiting re-registration)
//! ```

use crate::ports::Counter;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};

use super::children::{schedule_respawn, Children};
use super::msg::JobSupervisorMsg;
use super::msg::NodeMsg;
use super::msg::OrchestratorMsg;
use super::msg::SchedulerMsg;
use super::node::{NodeActor, NodeActorArgs};
use super::{answer, Deps, Notice};
use crate::events::{Event, FailureKind};
use crate::node::HeartbeatError;
use crate::ports::{ChainError, LinkError, NodeCommand, Standing};
use crate::ring::{plan_probes, ProbePair};
use crate::sched::{check_standing, NodeView};
use crate::types::{GymWei, NodeId, NodeInfo, Timestamp};

pub use super::msg::{LinkSnapshot, RegisterError, Registration, RegistryMsg};

/// Counts and logs a refused registration.
fn refused(deps: &Deps, e: &RegisterError) {
    tracing::info!(error = %e, "registration refused");
    deps.metrics.incr(Counter::Registrations, e.reason(), 1);
}

/// Spawn arguments of the [`NodeRegistry`].
pub struct RegistryArgs {
    /// The root, for routing to siblings.
    pub root: ActorRef<OrchestratorMsg>,
    /// Ports.
    pub deps: Deps,
}

struct Entry {
    actor: Option<ActorRef<NodeMsg>>,
    info: NodeInfo,
    /// What the scheduler sees. The registry owns it: the node's actor reports liveness
    /// and uptime ([`RegistryMsg::Status`]); standing comes from the chain.
    view: NodeView,
    /// The view's standing changed and its [`Event::NodeStanding`] could not be recorded.
    standing_unrecorded: bool,
    /// Registrations of this key (the first is 1).
    sessions: u32,
}

/// State of the [`NodeRegistry`].
pub struct RegistryState {
    nodes: BTreeMap<NodeId, Entry>,
    children: Children<NodeId>,
    links: HashMap<(NodeId, NodeId), f32>,
    root: ActorRef<OrchestratorMsg>,
    deps: Deps,
}

/// The node registry actor.
pub struct NodeRegistry;

fn validate(info: &NodeInfo) -> Result<(), RegisterError> {
    let link = &info.link;
    for (field, v) in [
        ("link.up_mbps", link.up_mbps),
        ("link.down_mbps", link.down_mbps),
    ] {
        if !(v.is_finite() && v >= 0.0) {
            return Err(RegisterError::Invalid {
                field,
                reason: format!("{v} is not a non-negative number of Mbit/s"),
            });
        }
    }
    if info.region.len() > 64 {
        return Err(RegisterError::Invalid {
            field: "region",
            reason: "longer than 64 bytes".into(),
        });
    }
    Ok(())
}

/// Reads the node's standing (stake and penalty, one [`ChainReader::standing`] call) from
/// the chain, off the registry's handler (a slow RPC endpoint must not stall heartbeats),
/// and checks the minimum stake (paper §3.3). A node under an active penalty is admitted
/// (it heartbeats and shows in views) but not placed until the penalty ends.
///
/// [`ChainReader::standing`]: crate::ports::ChainReader::standing
async fn chain_facts(deps: &Deps, node: NodeId) -> Result<Standing, RegisterError> {
    let limit = deps.call_timeout();
    let standing = match tokio::time::timeout(limit, deps.chain.standing(&node)).await {
        Err(_) => {
            return Err(RegisterError::ChainUnavailable(
                "stake read timed out".into(),
            ))
        }
        Ok(Ok(s)) => s,
        Ok(Err(ChainError::Unbound(_))) => return Err(RegisterError::Unbound),
        Ok(Err(ChainError::Unavailable(e))) => return Err(RegisterError::ChainUnavailable(e)),
    };
    let need = deps.cfg.eligibility.rules().min_stake;
    if standing.stake < need {
        return Err(RegisterError::InsufficientStake {
            have: standing.stake,
            need,
        });
    }
    Ok(standing)
}

/// Queues one [`NodeCommand::ProbeRequest`] per planned pair on the node link (each send
/// bounded by the call deadline) and counts the outcomes per attempt round.
///
/// A pair refused with [`LinkError::NotConnected`] (the node, or the peer the request
/// names, has no session yet) is tried once more after one heartbeat interval: a transport
/// may open a node's session only once its registration has returned, and a live node
/// holds a session within an interval. Still refused then, or refused otherwise, it counts
/// as `undeliverable`; the pair is probed again at a later admission of either node.
async fn send_probes(deps: Deps, plan: Vec<ProbePair>) {
    let limit = deps.call_timeout();
    let mut pending = plan;
    for last in [false, true] {
        if last {
            if pending.is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(deps.cfg.heartbeat.interval_ms)).await;
        }
        let (mut sent, mut undeliverable) = (0u64, 0u64);
        let mut again = Vec::new();
        for pair in std::mem::take(&mut pending) {
            let ProbePair { from, to } = pair;
            let command = NodeCommand::ProbeRequest { peer: to };
            match tokio::time::timeout(limit, deps.link.send(&from, command)).await {
                Ok(Ok(())) => sent += 1,
                Ok(Err(LinkError::NotConnected(_))) if !last => again.push(pair),
                Ok(Err(e)) => {
                    tracing::debug!(node = %from.short(), peer = %to.short(), error = %e, "probe request not delivered");
                    undeliverable += 1;
                }
                Err(_) => {
                    tracing::warn!(node = %from.short(), peer = %to.short(), "probe request send timed out");
                    undeliverable += 1;
                }
            }
        }
        if sent > 0 {
            deps.metrics.incr(Counter::ProbeRequests, "sent", sent);
        }
        if undeliverable > 0 {
            deps.metrics
                .incr(Counter::ProbeRequests, "undeliverable", undeliverable);
        }
        if !again.is_empty() {
            tracing::debug!(
                pairs = again.len(),
                "probe requests without a session; retrying after one heartbeat interval"
            );
        }
        pending = again;
    }
}

impl RegistryState {
    async fn spawn_node(
        &mut self,
        myself: &ActorRef<RegistryMsg>,
        info: NodeInfo,
        start_failed: bool,
    ) -> Result<ActorRef<NodeMsg>, ActorProcessingErr> {
        let id = info.id;
        let (actor, _) = Actor::spawn_linked(
            None,
            NodeActor,
            NodeActorArgs {
                info,
                start_failed,
                registry: myself.clone(),
                deps: self.deps.clone(),
            },
            myself.get_cell(),
        )
        .await?;
        self.children.adopt(id, actor.get_id());
        Ok(actor)
    }

    async fn register(
        &mut self,
        myself: &ActorRef<RegistryMsg>,
        info: NodeInfo,
        stake: GymWei,
        penalty: Option<Timestamp>,
    ) -> Result<Registration, RegisterError> {
        self.deps
            .persist(Event::NodeRegistered {
                info: info.clone(),
                stake,
                penalty_until: penalty,
            })
            .await?;
        let id = info.id;
        let now = self.deps.now();
        let sessions = match self.nodes.get(&id).and_then(|e| e.actor.clone()) {
            Some(actor) => {
                // Same key again: one actor, one state; a new heartbeat session.
                super::ask_with(&actor, self.deps.cfg.call_timeout_ms, |reply| {
                    NodeMsg::Reregister {
                        info: info.clone(),
                        reply,
                    }
                })
                .await
                .map_err(|e| RegisterError::Store(format!("node actor: {e}")))?;
                match self.nodes.get_mut(&id) {
                    Some(e) => {
                        e.info = info.clone();
                        e.sessions += 1;
                        e.sessions
                    }
                    None => 1,
                }
            }
            None => {
                let actor = self
                    .spawn_node(myself, info.clone(), false)
                    .await
                    .map_err(|e| RegisterError::Store(format!("spawn node actor: {e}")))?;
                // A node whose actor crashed keeps its restart budget (in `children`) and
                // its session count.
                let prior = self.nodes.remove(&id);
                let sessions = prior.as_ref().map_or(0, |e| e.sessions) + 1;
                let view = NodeView {
                    id,
                    stake,
                    vram_bytes: info.gpu.vram_bytes,
                    uptime: 1.0,
                    penalty_until: penalty,
                    region: info.region.clone(),
                    alive: true,
                    assigned: None,
                    standing_read_at: now,
                };
                self.nodes.insert(
                    id,
                    Entry {
                        actor: Some(actor),
                        info: info.clone(),
                        view,
                        standing_unrecorded: false,
                        sessions,
                    },
                );
                sessions
            }
        };
        if let Some(e) = self.nodes.get_mut(&id) {
            e.view.alive = true;
            e.view.stake = stake;
            e.view.penalty_until = penalty;
            e.view.standing_read_at = now;
            e.view.vram_bytes = info.gpu.vram_bytes;
            e.view.region = info.region.clone();
        }
        tracing::info!(node = %id.short(), region = %info.region, sessions, at = now.0, "node registered");
        self.deps.notify(Notice::NodeRegistered { node: id });
        let _ = self
            .root
            .cast(OrchestratorMsg::Scheduler(SchedulerMsg::NodesChanged));
        Ok(Registration {
            node: id,
            stake,
            heartbeat_interval_ms: self.deps.cfg.heartbeat.interval_ms,
            sessions,
        })
    }

    /// Plans the link probes for `node`, just admitted (DESIGN §4; [`plan_probes`] with
    /// `k = core.probe.peers_per_node` over the live nodes and the measured links), and
    /// sends them from a task of their own ([`send_probes`]), so a slow link cannot stall
    /// the registry. Counts `probe_requests{sent|undeliverable}`.
    fn request_probes(&self, node: NodeId, sessions: u32) {
        let k = self.deps.cfg.probe.peers_per_node as usize;
        let Some(me) = self.nodes.get(&node) else {
            return;
        };
        if k == 0 {
            return;
        }
        // Deterministic per (node, registration), different on each re-registration.
        let mut first = [0u8; 8];
        first.copy_from_slice(&node.0[..8]);
        let seed = u64::from_le_bytes(first) ^ u64::from(sessions).rotate_left(32);
        // Plan over a bounded window of the live nodes, starting at a seeded position in
        // key order, so admitting a node costs O(k), not O(nodes): with 10,000 nodes a
        // full scan per registration made admission quadratic.
        let window = k.saturating_mul(32).max(256);
        let mut start = [0u8; 32];
        for (i, chunk) in start.chunks_exact_mut(8).enumerate() {
            chunk.copy_from_slice(&seed.rotate_left(16 * i as u32).to_le_bytes());
        }
        let start = NodeId(start);
        let live = self
            .nodes
            .range(start..)
            .chain(self.nodes.range(..start))
            .filter(|(_, e)| e.view.alive && e.actor.is_some())
            .take(window)
            .map(|(id, e)| (*id, e.info.region.as_str()));
        let plan = plan_probes(
            node,
            &me.info.region,
            live,
            |a, b| self.links.contains_key(&(a, b)),
            k,
            seed,
        );
        if plan.is_empty() {
            return;
        }
        tracing::debug!(node = %node.short(), pairs = plan.len(), "requesting link probes");
        tokio::spawn(send_probes(self.deps.clone(), plan));
    }

    /// Records the standing read from the chain at `read_at` for each node in `reads` (an
    /// epoch boundary's re-read of a job's ring members, DESIGN §3 "Standing"): every view
    /// gets the read time; a changed stake or penalty is recorded
    /// ([`Event::NodeStanding`]) so a rebuilt registry starts from it, and the scheduler is
    /// told (a node out of standing is no longer placed nor given as a standby).
    async fn standing_read(&mut self, reads: Vec<(NodeId, Standing)>, read_at: Timestamp) {
        let mut changed = false;
        for (node, standing) in reads {
            let Some(e) = self.nodes.get_mut(&node) else {
                continue;
            };
            if read_at < e.view.standing_read_at {
                continue; // a read overtaken by a newer one (another job's, an admission)
            }
            e.view.standing_read_at = read_at;
            let same =
                e.view.stake == standing.stake && e.view.penalty_until == standing.penalty_until;
            if same && !e.standing_unrecorded {
                continue;
            }
            tracing::info!(node = %node.short(), stake = %standing.stake,
                penalty_until = standing.penalty_until.map(|t| t.0), "node standing changed on chain");
            e.view.stake = standing.stake;
            e.view.penalty_until = standing.penalty_until;
            changed = true;
            let event = Event::NodeStanding {
                node,
                stake: standing.stake,
                penalty_until: standing.penalty_until,
            };
            // Acted on at once all the same (a slashed node must not be placed meanwhile);
            // recorded at its next read, changed or not.
            let recorded = self.deps.persist(event).await;
            if let Some(e) = self.nodes.get_mut(&node) {
                e.standing_unrecorded = recorded.is_err();
            }
            if let Err(e) = recorded {
                tracing::warn!(node = %node.short(), error = %e, "could not record node standing; recorded at its next read");
            }
        }
        if changed {
            let _ = self
                .root
                .cast(OrchestratorMsg::Scheduler(SchedulerMsg::NodesChanged));
        }
    }

    async fn node_down(&mut self, node: NodeId, kind: FailureKind) {
        let Some(entry) = self.nodes.get_mut(&node) else {
            return;
        };
        entry.view.alive = false;
        self.deps
            .metrics
            .incr(Counter::NodeFailures, kind.label(), 1);
        if let Err(e) = self.deps.persist(Event::NodeFailed { node, kind }).await {
            // The failure is still acted on; a rebuilt ring re-derives it from the timeout.
            tracing::error!(node = %node.short(), error = %e, "could not record node failure");
        }
        self.deps.notify(Notice::NodeFailed {
            node,
            kind,
            at: self.deps.now(),
        });
        let _ = self
            .root
            .cast(OrchestratorMsg::Jobs(JobSupervisorMsg::NodeFailed { node }));
        let _ = self
            .root
            .cast(OrchestratorMsg::Scheduler(SchedulerMsg::NodesChanged));
    }
}

impl Actor for NodeRegistry {
    type Msg = RegistryMsg;
    type State = RegistryState;
    type Arguments = RegistryArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<RegistryMsg>,
        args: RegistryArgs,
    ) -> Result<RegistryState, ActorProcessingErr> {
        Ok(RegistryState {
            nodes: BTreeMap::new(),
            children: Children::new(args.deps.cfg.supervision.clone()),
            links: HashMap::new(),
            root: args.root,
            deps: args.deps,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<RegistryMsg>,
        state: &mut RegistryState,
    ) -> Result<(), ActorProcessingErr> {
        // Rebuild from the log: every node admitted and not failed since gets a fresh actor
        // with a full timeout to heartbeat again (after a failover, nodes reconnect).
        let fold = crate::replay::load(&*state.deps.store).await?;
        state.links = fold.links;
        for (id, n) in fold.nodes {
            let actor = state.spawn_node(&myself, n.info.clone(), n.failed).await?;
            let view = NodeView {
                id,
                stake: n.stake,
                vram_bytes: n.info.gpu.vram_bytes,
                uptime: 1.0,
                penalty_until: n.penalty_until,
                region: n.info.region.clone(),
                alive: !n.failed,
                assigned: None,
                standing_read_at: n.standing_read_at,
            };
            state.nodes.insert(
                id,
                Entry {
                    actor: Some(actor),
                    info: n.info,
                    view,
                    standing_unrecorded: false,
                    sessions: 1,
                },
            );
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<RegistryMsg>,
        msg: RegistryMsg,
        state: &mut RegistryState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            RegistryMsg::Register { info, reply } => {
                if let Err(e) = validate(&info) {
                    refused(&state.deps, &e);
                    answer(reply, Err(e));
                    return Ok(());
                }
                let deps = state.deps.clone();
                let registry = myself.clone();
                tokio::spawn(async move {
                    match chain_facts(&deps, info.id).await {
                        Ok(standing) => {
                            let _ = registry.cast(RegistryMsg::Admit {
                                info,
                                stake: standing.stake,
                                penalty: standing.penalty_until,
                                reply,
                            });
                        }
                        Err(e) => {
                            refused(&deps, &e);
                            answer(reply, Err(e));
                        }
                    }
                });
            }
            RegistryMsg::Admit {
                info,
                stake,
                penalty,
                reply,
            } => {
                let result = state.register(&myself, info, stake, penalty).await;
                match &result {
                    Ok(reg) => {
                        state
                            .deps
                            .metrics
                            .incr(Counter::Registrations, "accepted", 1);
                        state.request_probes(reg.node, reg.sessions);
                    }
                    Err(e) => refused(&state.deps, e),
                }
                answer(reply, result);
            }
            RegistryMsg::Heartbeat { hb, reply } => {
                match state.nodes.get(&hb.node).and_then(|e| e.actor.clone()) {
                    Some(actor) => {
                        let _ = actor.cast(NodeMsg::Heartbeat { hb, reply });
                    }
                    None => {
                        state
                            .deps
                            .metrics
                            .incr(Counter::Heartbeats, "unknown_node", 1);
                        answer(reply, Err(HeartbeatError::UnknownNode));
                    }
                }
            }
            RegistryMsg::SessionClosed { node, session } => {
                let current = state.nodes.get(&node).filter(|e| e.sessions == session);
                if let Some(actor) = current.and_then(|e| e.actor.clone()) {
                    let _ = actor.cast(NodeMsg::SessionClosed);
                }
            }
            RegistryMsg::ReportLink {
                from,
                to,
                mbps,
                reply,
            } => {
                let result = if !state.nodes.contains_key(&from) {
                    Err(RegisterError::UnknownNode(from))
                } else if !state.nodes.contains_key(&to) {
                    Err(RegisterError::UnknownNode(to))
                } else if !(mbps.is_finite() && mbps >= 0.0) {
                    Err(RegisterError::Invalid {
                        field: "mbps",
                        reason: format!("{mbps} is not a non-negative number"),
                    })
                } else {
                    match state
                        .deps
                        .persist(Event::LinkMeasured { from, to, mbps })
                        .await
                    {
                        Ok(_) => {
                            state.links.insert((from, to), mbps);
                            Ok(())
                        }
                        Err(e) => Err(e.into()),
                    }
                };
                answer(reply, result);
            }
            RegistryMsg::Status {
                node,
                uptime,
                alive,
                from,
            } => {
                if let Some(e) = state.nodes.get_mut(&node) {
                    if e.actor.as_ref().map(|a| a.get_id()) == Some(from) {
                        e.view.uptime = uptime;
                        e.view.alive = alive;
                    }
                }
            }
            RegistryMsg::StandingRead {
                reads,
                read_at,
                reply,
            } => {
                state.standing_read(reads, read_at).await;
                answer(reply, ());
            }
            RegistryMsg::NodeDown { node, kind, from } => {
                let current = state.nodes.get(&node).and_then(|e| e.actor.as_ref());
                if current.map(|a| a.get_id()) == Some(from) {
                    state.node_down(node, kind).await;
                }
            }
            RegistryMsg::Snapshot { reply } => {
                answer(
                    reply,
                    state.nodes.values().map(|e| e.view.clone()).collect(),
                );
            }
            RegistryMsg::Links { nodes, reply } => {
                // A member out of standing counts as gone: any reconfiguration (including a
                // rebuilt ring actor's) removes it, like a dead one (DESIGN §3, "Standing").
                let (rules, now) = (state.deps.cfg.eligibility.rules(), state.deps.now());
                let in_standing = |e: &Entry| {
                    check_standing(&rules, e.view.stake, e.view.penalty_until, now).is_ok()
                };
                let index: HashMap<NodeId, usize> =
                    nodes.iter().enumerate().map(|(i, n)| (*n, i)).collect();
                let mut snap = LinkSnapshot::default();
                for n in &nodes {
                    let e = state.nodes.get(n);
                    snap.profiles
                        .push(e.map(|e| e.info.link.clone()).unwrap_or_default());
                    snap.regions
                        .push(e.map(|e| e.info.region.clone()).unwrap_or_default());
                    snap.alive
                        .push(e.is_some_and(|e| e.view.alive && in_standing(e)));
                }
                for ((from, to), mbps) in &state.links {
                    if let (Some(&i), Some(&j)) = (index.get(from), index.get(to)) {
                        snap.measured.push((i, j, *mbps));
                    }
                }
                snap.measured.sort_by_key(|m| (m.0, m.1));
                answer(reply, snap);
            }
            RegistryMsg::Respawn { node } => {
                // Skipped when the node registered again during the backoff (it has an
                // actor already) or was removed.
                let Some(info) = state
                    .nodes
                    .get(&node)
                    .filter(|e| e.actor.is_none())
                    .map(|e| e.info.clone())
                else {
                    return Ok(());
                };
                let actor = match state.spawn_node(&myself, info, true).await {
                    Ok(a) => a,
                    Err(e) => {
                        // Not the node's fault: try again later, without spending its budget.
                        tracing::warn!(node = %node.short(), error = %e, "node actor respawn failed; retrying");
                        let wait = Duration::from_millis(state.deps.cfg.supervision.backoff_max_ms);
                        myself.send_after(wait, move || RegistryMsg::Respawn { node });
                        return Ok(());
                    }
                };
                if let Some(e) = state.nodes.get_mut(&node) {
                    e.actor = Some(actor);
                }
                state.deps.metrics.incr(Counter::ActorRestarts, "node", 1);
                state.deps.notify(Notice::ActorRestarted {
                    what: format!("node {}", node.short()),
                });
            }
            #[cfg(feature = "fault-injection")]
            RegistryMsg::Panic => panic!("injected fault: node registry panic"),
            #[cfg(feature = "fault-injection")]
            RegistryMsg::InjectPanic { node, reply } => {
                let actor = state.nodes.get(&node).and_then(|e| e.actor.clone());
                let found = actor.is_some();
                if let Some(a) = actor {
                    let _ = a.cast(NodeMsg::InjectPanic);
                }
                answer(reply, found);
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<RegistryMsg>,
        event: SupervisionEvent,
        state: &mut RegistryState,
    ) -> Result<(), ActorProcessingErr> {
        let Some((node, why)) = state.children.failed(&event) else {
            return Ok(());
        };
        tracing::warn!(node = %node.short(), error = %why, "node actor failed; treating as node failure");
        match state.nodes.get_mut(&node) {
            Some(e) => e.actor = None,
            None => return Ok(()),
        }
        let decision = state.children.on_failure(&node, state.deps.now());
        state.node_down(node, FailureKind::ActorCrashed).await;
        if !schedule_respawn(&myself, decision, move || RegistryMsg::Respawn { node }) {
            tracing::error!(node = %node.short(), "node actor restart budget spent; node removed until it registers again");
            state.nodes.remove(&node);
            state.children.forget(&node);
        }
        Ok(())
    }
}
