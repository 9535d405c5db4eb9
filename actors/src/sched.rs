//! Scheduling policy and node eligibility: paper §3.2 ("Scheduling Policy") and §3.3
//! ("Node Eligibility"), with the aging priority of DESIGN §12.
//!
//! Everything here is pure: the scheduler actor passes in a snapshot of the pending jobs and
//! the registered nodes, and the current time, and gets placements back. Nothing is kept
//! between calls, so a decision is a function of its inputs and a standby that replays the
//! log decides the same way.
//!
//! # How [`SchedulingPolicy::schedule`] decides
//!
//! 1. **Pool.** Nodes that are alive, unassigned and pass [`check_eligibility`] with no VRAM
//!    requirement, ordered by stake (whole GYM) × uptime, descending, then by id ascending.
//!    A node id that appears twice is used once.
//! 2. **Order.** A job that has waited at least [`SchedulingPolicy::starvation_after_ms`] is
//!    *starving*. Starving jobs come first, oldest first (then smaller id); the others follow
//!    by [`SchedulingPolicy::priority`] descending, ties broken by older `submitted_at`, then
//!    smaller id. A NaN priority counts as the lowest.
//! 3. **Placement.** Each job in turn gets up to `max_nodes` of the free pool nodes with
//!    `vram_bytes ≥ min_vram_bytes`, best first, but only when at least `min_nodes` are free;
//!    otherwise it gets nothing this round.
//! 4. **Backfill with one reservation.** A job that cannot be placed does not block the jobs
//!    after it (backfill), with one exception: the *first starving job that cannot be placed*
//!    reserves every free node it could use, and no later job may take them. Nodes that free
//!    up later accumulate to it until it reaches `min_nodes`. Only the oldest such job can
//!    hold a reservation, and a newer job can never become older than it, so it cannot be
//!    overtaken forever: the oldest big job is not starved (so long as enough eligible nodes
//!    exist at all; otherwise its pending deadline fails it). Before the threshold, pure
//!    backfill keeps utilisation high. One reservation at a time bounds the idle capacity.
//!
//! A job with `min_nodes = 0` is treated as needing 1 node (a placement always has a node);
//! a job with `max_nodes < min_nodes` is never placed and never reserves. A job id that
//! appears twice is considered once (its first occurrence in the order above).

use std::cmp::Ordering;
use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use crate::job::{Job, JobPhase, NodeShortage};
use crate::ports::{ChainError, Standing};
use crate::types::{GymWei, JobId, NodeId, Timestamp};

/// Thresholds of paper §3.3 that do not depend on the job (VRAM does, and comes with it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EligibilityRules {
    /// Minimum operator stake, in GYM wei; default 10,000 GYM (paper §3.3 rule 1).
    pub min_stake: GymWei,
    /// Minimum uptime over the last 24 h, a fraction in [0, 1]; default 0.95 (paper §3.3
    /// rule 3).
    pub min_uptime: f64,
}

impl Default for EligibilityRules {
    fn default() -> Self {
        EligibilityRules {
            min_stake: GymWei::gym(10_000),
            min_uptime: 0.95,
        }
    }
}

/// What the scheduler knows about a registered node at decision time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeView {
    /// The node's identity (its public key).
    pub id: NodeId,
    /// Its operator's stake on chain, in GYM wei (DESIGN §3).
    pub stake: GymWei,
    /// GPU memory, in bytes.
    pub vram_bytes: u64,
    /// Uptime over the last 24 h, a fraction in [0, 1] (see [`crate::uptime`]).
    pub uptime: f64,
    /// End of an active slashing penalty, if any: ineligible while `now < penalty_until`.
    pub penalty_until: Option<Timestamp>,
    /// Region label, e.g. `eu-west`.
    pub region: String,
    /// False once the node has been declared failed (heartbeat timeout or stream closed).
    pub alive: bool,
    /// The job the node is working for, if any.
    pub assigned: Option<JobId>,
    /// When `stake` and `penalty_until` were last read from the chain (ms since the Unix
    /// epoch): at admission, then at each epoch boundary of the job the node works for
    /// (DESIGN §3, "Standing"). 0 where unknown (a view rebuilt from a log written before
    /// re-reads were recorded).
    #[serde(default)]
    pub standing_read_at: Timestamp,
}

/// Why a node is not eligible (paper §3.3), checked in the order of the variants.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Ineligible {
    /// The node has been declared failed.
    #[error("node is not alive")]
    NotAlive,
    /// The node already works for this job.
    #[error("node is assigned to {0}")]
    Assigned(JobId),
    /// A slashing penalty is active until the given time (paper §3.3 rule 4).
    #[error("slashing penalty active until {until}")]
    Slashed {
        /// When the penalty ends (ms since the Unix epoch).
        until: Timestamp,
    },
    /// Stake below the minimum (paper §3.3 rule 1).
    #[error("stake {have} below the minimum {need}")]
    Stake {
        /// The operator's stake, in GYM wei.
        have: GymWei,
        /// The minimum, in GYM wei.
        need: GymWei,
    },
    /// GPU memory below the job's minimum (paper §3.3 rule 2).
    #[error("VRAM {have} bytes below the job's minimum {need} bytes")]
    Vram {
        /// The node's VRAM, in bytes.
        have: u64,
        /// The job's minimum, in bytes.
        need: u64,
    },
    /// Uptime over the last 24 h below the minimum, or not a number (paper §3.3 rule 3; the
    /// downtime budget of [`crate::uptime`]: 72 min per 24 h at 95 %).
    #[error("uptime {:.2} % below the minimum {:.2} % (too much downtime in the window)", have * 100.0, need * 100.0)]
    Uptime {
        /// The node's uptime fraction.
        have: f64,
        /// The minimum fraction.
        need: f64,
    },
}

/// Whether a node with `stake` (GYM wei) and `penalty_until` is in good standing at `now`
/// (paper §3.3 rules 4 and 1): no active slashing penalty (`now < penalty_until` is
/// active), then stake ≥ `rules.min_stake`. The first failing check is returned, in that
/// order. A ring member that fails it at an epoch boundary leaves its ring (DESIGN §3,
/// "Standing").
pub fn check_standing(
    rules: &EligibilityRules,
    stake: GymWei,
    penalty_until: Option<Timestamp>,
    now: Timestamp,
) -> Result<(), Ineligible> {
    if let Some(until) = penalty_until {
        if now < until {
            return Err(Ineligible::Slashed { until });
        }
    }
    if stake < rules.min_stake {
        return Err(Ineligible::Stake {
            have: stake,
            need: rules.min_stake,
        });
    }
    Ok(())
}

/// The members that leave their ring at an epoch boundary (DESIGN §3, "Standing"): each
/// node of `reads` (a member with what [`crate::ports::ChainReader::standing`] answered)
/// that fails [`check_standing`] at `now`, with why, in the order of `reads`. A key no
/// longer bound to an operator ([`ChainError::Unbound`]) has no stake: it leaves as
/// [`Ineligible::Stake`] with 0. A member whose read failed otherwise
/// ([`ChainError::Unavailable`]) stays: an unreachable chain is not evidence against it,
/// and the next boundary reads it again.
pub fn standing_leavers(
    rules: &EligibilityRules,
    reads: &[(NodeId, Result<Standing, ChainError>)],
    now: Timestamp,
) -> Vec<(NodeId, Ineligible)> {
    reads
        .iter()
        .filter_map(|(node, read)| {
            let why = match read {
                Ok(s) => check_standing(rules, s.stake, s.penalty_until, now).err()?,
                Err(ChainError::Unbound(_)) => Ineligible::Stake {
                    have: GymWei(0),
                    need: rules.min_stake,
                },
                Err(ChainError::Unavailable(_)) => return None,
            };
            Some((*node, why))
        })
        .collect()
}

/// The checks every node must pass whoever it would work for (paper §3.3 rules 1, 2, 3, 4).
fn check_common(
    rules: &EligibilityRules,
    node: &NodeView,
    min_vram_bytes: u64,
    now: Timestamp,
) -> Result<(), Ineligible> {
    check_standing(rules, node.stake, node.penalty_until, now)?;
    if node.vram_bytes < min_vram_bytes {
        return Err(Ineligible::Vram {
            have: node.vram_bytes,
            need: min_vram_bytes,
        });
    }
    // NaN uptime is refused: `partial_cmp` gives None.
    match node.uptime.partial_cmp(&rules.min_uptime) {
        Some(Ordering::Greater | Ordering::Equal) => Ok(()),
        _ => Err(Ineligible::Uptime {
            have: node.uptime,
            need: rules.min_uptime,
        }),
    }
}

/// Whether `node` may be given to a new job needing `min_vram_bytes` of VRAM at time `now`
/// (paper §3.3): alive, not assigned to any job, no active slashing penalty
/// (`now < penalty_until`), stake ≥ `rules.min_stake` (GYM wei), VRAM ≥ `min_vram_bytes`
/// (bytes), uptime ≥ `rules.min_uptime`. The first failing check is returned, in that order.
pub fn check_eligibility(
    rules: &EligibilityRules,
    node: &NodeView,
    min_vram_bytes: u64,
    now: Timestamp,
) -> Result<(), Ineligible> {
    if !node.alive {
        return Err(Ineligible::NotAlive);
    }
    if let Some(job) = node.assigned {
        return Err(Ineligible::Assigned(job));
    }
    check_common(rules, node, min_vram_bytes, now)
}

/// Why `node` could not be placed in a new job at `now` whatever the job needs, if it
/// could not: the rules of [`check_eligibility`] that do not depend on the job (alive,
/// penalty, stake, uptime), in that order; its current assignment and the job's VRAM
/// minimum are not judged. What `hanzod nodes` and `GetNode` show.
pub fn placement_blocker(
    rules: &EligibilityRules,
    node: &NodeView,
    now: Timestamp,
) -> Option<Ineligible> {
    if !node.alive {
        return Some(Ineligible::NotAlive);
    }
    check_common(rules, node, 0, now).err()
}

/// Whether `node` may serve as a standby (or stay a member) of `job`'s ring (paper §4.3):
/// the same checks as [`check_eligibility`], except that a node already assigned to `job`
/// itself is accepted; one assigned to another job is still refused.
pub fn eligible_for_standby(
    rules: &EligibilityRules,
    node: &NodeView,
    job: JobId,
    min_vram_bytes: u64,
    now: Timestamp,
) -> Result<(), Ineligible> {
    if !node.alive {
        return Err(Ineligible::NotAlive);
    }
    match node.assigned {
        Some(other) if other != job => Err(Ineligible::Assigned(other)),
        _ => check_common(rules, node, min_vram_bytes, now),
    }
}

/// A job waiting for nodes, as the scheduler sees it (from its [`crate::job::JobSpec`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PendingJob {
    /// The job's id.
    pub id: JobId,
    /// Submitter's stake `s_j`, in GYM wei (paper §3.2).
    pub submitter_stake: GymWei,
    /// Expected utility `u_j` (paper §3.2), > 0.
    pub utility: f64,
    /// Submission time `t_j` is measured from (ms since the Unix epoch).
    pub submitted_at: Timestamp,
    /// Fewest nodes it can start with.
    pub min_nodes: u32,
    /// Most nodes it will use.
    pub max_nodes: u32,
    /// Minimum VRAM per node, in bytes (paper §3.3 rule 2).
    pub min_vram_bytes: u64,
}

impl PendingJob {
    /// The scheduler's view of `job`, or `None` when it is not Pending (only Pending jobs are
    /// scheduled; paper §3.1).
    pub fn from_job(job: &Job) -> Option<PendingJob> {
        match job.phase {
            JobPhase::Pending { submitted_at, .. } => Some(PendingJob {
                id: job.id,
                submitter_stake: job.spec.submitter_stake,
                utility: job.spec.utility,
                submitted_at,
                min_nodes: job.spec.min_nodes,
                max_nodes: job.spec.max_nodes,
                min_vram_bytes: job.spec.min_vram_bytes,
            }),
            _ => None,
        }
    }
}

/// A scheduling decision: give `nodes` to `job` (ordered best first by stake × uptime).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// The job being started.
    pub job: JobId,
    /// The nodes it gets: between its `min_nodes` and `max_nodes`, none given to another job.
    pub nodes: Vec<NodeId>,
}

/// Default starving threshold for policies that do not set one: 30 minutes, in ms.
pub const DEFAULT_STARVATION_AFTER_MS: u64 = 30 * 60 * 1000;

/// A scheduling policy (paper §3.2, behind a trait per DESIGN §12 so embedders can swap it).
///
/// Implementors provide [`priority`](SchedulingPolicy::priority); the default
/// [`schedule`](SchedulingPolicy::schedule) is the backfill-with-one-reservation algorithm
/// described in the [module docs](self).
pub trait SchedulingPolicy: Send + Sync + std::fmt::Debug + 'static {
    /// Short name for logs and config, e.g. `aging`.
    fn name(&self) -> &'static str;

    /// The job's priority at `now`; higher is scheduled first. NaN counts as lowest.
    fn priority(&self, job: &PendingJob, now: Timestamp) -> f64;

    /// Waiting time, in ms, after which a job is *starving*: it goes ahead of every
    /// non-starving job and, if it cannot be placed and is the oldest such, reserves the
    /// nodes it could use (module docs, step 4). Default [`DEFAULT_STARVATION_AFTER_MS`].
    fn starvation_after_ms(&self) -> u64 {
        DEFAULT_STARVATION_AFTER_MS
    }

    /// One scheduling decision at `now` (module docs). Placements come in decision order.
    /// Deterministic; never gives a node to two jobs or an ineligible node to any.
    fn schedule(
        &self,
        jobs: &[PendingJob],
        nodes: &[NodeView],
        rules: &EligibilityRules,
        now: Timestamp,
    ) -> Vec<Placement> {
        schedule_with(self, jobs, nodes, rules, now)
    }
}

/// `f64::total_cmp` with NaN mapped to −∞, so a NaN priority sorts last and deterministically.
fn sane(p: f64) -> f64 {
    if p.is_nan() {
        f64::NEG_INFINITY
    } else {
        p
    }
}

/// The default scheduling algorithm, for policies that override `schedule` but want to
/// reuse it (module docs).
pub fn schedule_with<P: SchedulingPolicy + ?Sized>(
    policy: &P,
    jobs: &[PendingJob],
    nodes: &[NodeView],
    rules: &EligibilityRules,
    now: Timestamp,
) -> Vec<Placement> {
    // 1. Pool: eligible regardless of VRAM, best first, unique ids.
    let mut pool: Vec<(&NodeView, f64)> = nodes
        .iter()
        .filter(|n| check_eligibility(rules, n, 0, now).is_ok())
        .map(|n| (n, sane(n.stake.as_gym_f64() * n.uptime)))
        .collect();
    pool.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.id.cmp(&b.0.id)));
    let mut seen = HashSet::with_capacity(pool.len());
    pool.retain(|(n, _)| seen.insert(n.id));
    // taken[i]: pool[i] given to a job or reserved.
    let mut taken = vec![false; pool.len()];

    // 2. Order: starving jobs oldest first, then the rest by priority.
    let threshold = policy.starvation_after_ms();
    let mut order: Vec<(&PendingJob, bool, f64)> = jobs
        .iter()
        .map(|j| {
            let starving = now.since(j.submitted_at) >= threshold;
            (j, starving, sane(policy.priority(j, now)))
        })
        .collect();
    order.sort_by(|a, b| {
        let by_age = || {
            a.0.submitted_at
                .cmp(&b.0.submitted_at)
                .then_with(|| a.0.id.cmp(&b.0.id))
        };
        match (a.1, b.1) {
            (true, false) => Ordering::Less,
            (false, true) => Ordering::Greater,
            (true, true) => by_age(),
            (false, false) => b.2.total_cmp(&a.2).then_with(by_age),
        }
    });

    // 3–4. Place, backfill, reserve for the first starving job that cannot be placed.
    let mut placements = Vec::new();
    let mut placed_jobs = HashSet::new();
    let mut reserved = false;
    for (job, starving, _) in order {
        if !placed_jobs.insert(job.id) {
            continue; // duplicate job id
        }
        let min = job.min_nodes.max(1) as usize;
        let max = job.max_nodes as usize;
        if max < min {
            continue;
        }
        let usable: Vec<usize> = (0..pool.len())
            .filter(|&i| !taken[i] && pool[i].0.vram_bytes >= job.min_vram_bytes)
            .take(max)
            .collect();
        if usable.len() >= min {
            for &i in &usable {
                taken[i] = true;
            }
            placements.push(Placement {
                job: job.id,
                nodes: usable.iter().map(|&i| pool[i].0.id).collect(),
            });
        } else if starving && !reserved {
            reserved = true;
            for &i in &usable {
                taken[i] = true;
            }
        }
    }
    placements
}

/// Aging priority (DESIGN §12, departing from paper §3.2): `P = s · u · (1 + t/τ)`, with `s`
/// the submitter's stake in whole GYM, `u` the expected utility and `t` the waiting time in
/// ms. Priority rises linearly as a job waits and doubles after τ, so older jobs move up
/// (the paper's stated intent, "older jobs get priority"). A job that has waited τ is also
/// *starving* (see [`SchedulingPolicy::starvation_after_ms`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgingPolicy {
    /// The aging time constant τ, in ms (0 is treated as 1 ms). Default 10 minutes.
    pub tau_ms: u64,
}

impl AgingPolicy {
    /// Default τ: 10 minutes, in ms.
    pub const DEFAULT_TAU_MS: u64 = 10 * 60 * 1000;
}

impl Default for AgingPolicy {
    fn default() -> Self {
        AgingPolicy {
            tau_ms: Self::DEFAULT_TAU_MS,
        }
    }
}

impl SchedulingPolicy for AgingPolicy {
    fn name(&self) -> &'static str {
        "aging"
    }

    /// `s · u · (1 + t/τ)` (DESIGN §12); `s` in whole GYM, `t = now − submitted_at` in ms.
    fn priority(&self, job: &PendingJob, now: Timestamp) -> f64 {
        let t = now.since(job.submitted_at) as f64;
        let tau = self.tau_ms.max(1) as f64;
        job.submitter_stake.as_gym_f64() * job.utility * (1.0 + t / tau)
    }

    /// τ: a job whose priority has doubled through waiting is starving.
    fn starvation_after_ms(&self) -> u64 {
        self.tau_ms.max(1)
    }
}

/// The formula as printed in paper §3.2: `P = s · u / t`, with `s` the submitter's stake in
/// whole GYM, `u` the expected utility and `t` the waiting time in ms, floored at 1 ms.
///
/// Kept for comparison only: priority *falls* as a job waits, so among equal `s · u` the
/// newest job goes first — the inverse of FIFO and of the paper's own text (DESIGN §12).
/// The starvation reservation of the default `schedule` still protects the oldest job once
/// it has waited [`DEFAULT_STARVATION_AFTER_MS`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaperPolicy;

impl SchedulingPolicy for PaperPolicy {
    fn name(&self) -> &'static str {
        "paper"
    }

    /// `s · u / max(t, 1 ms)` (paper §3.2).
    fn priority(&self, job: &PendingJob, now: Timestamp) -> f64 {
        let t = now.since(job.submitted_at).max(1) as f64;
        job.submitter_stake.as_gym_f64() * job.utility / t
    }
}

/// The scheduler's entry for a job still `Pending`, `None` otherwise.
pub fn pending_of(job: &Job) -> Option<PendingJob> {
    let JobPhase::Pending { submitted_at, .. } = job.phase else {
        return None;
    };
    Some(PendingJob {
        id: job.id,
        submitter_stake: job.spec.submitter_stake,
        utility: job.spec.utility,
        submitted_at,
        min_nodes: job.spec.min_nodes,
        max_nodes: job.spec.max_nodes,
        min_vram_bytes: job.spec.min_vram_bytes,
    })
}

impl Ineligible {
    /// The reason in words without the node's numbers, for counting nodes by what they
    /// lack ([`shortage`]).
    pub fn kind(&self) -> &'static str {
        match self {
            Ineligible::NotAlive => "not alive",
            Ineligible::Assigned(_) => "assigned to another job",
            Ineligible::Slashed { .. } => "slashing penalty",
            Ineligible::Stake { .. } => "stake below the minimum",
            Ineligible::Vram { .. } => "VRAM below the job's minimum",
            Ineligible::Uptime { .. } => "uptime below the minimum",
        }
    }
}

/// Why `job` found too few nodes at `now` (paper §3.3): every registered node in `nodes`
/// counted once (a repeated id is ignored), by [`check_eligibility`] against the job's VRAM
/// minimum; the alive nodes that fail are grouped by [`Ineligible::kind`], most common
/// first (ties by name). Pure: what a job that fails Pending reports
/// ([`crate::job::FailReason::NotPlaced`]).
pub fn shortage(
    rules: &EligibilityRules,
    job: &PendingJob,
    nodes: &[NodeView],
    now: Timestamp,
) -> NodeShortage {
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    let mut seen = HashSet::new();
    let nodes: Vec<&NodeView> = nodes.iter().filter(|n| seen.insert(n.id)).collect();
    let mut lacking: std::collections::BTreeMap<&'static str, u32> = Default::default();
    let mut eligible = 0;
    for n in nodes.iter().filter(|n| n.alive) {
        match check_eligibility(rules, n, job.min_vram_bytes, now) {
            Ok(()) => eligible += 1,
            Err(why) => *lacking.entry(why.kind()).or_default() += 1,
        }
    }
    let mut lacking: Vec<(String, u32)> = lacking
        .into_iter()
        .map(|(why, n)| (why.to_string(), n))
        .collect();
    lacking.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    NodeShortage {
        needed: job.min_nodes.max(1),
        min_vram_bytes: job.min_vram_bytes,
        registered: count(nodes.len()),
        alive: count(nodes.iter().filter(|n| n.alive).count()),
        eligible,
        lacking,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GIB: u64 = 1 << 30;
    const NOW: Timestamp = Timestamp(10_000_000_000);

    fn nid(i: u8) -> NodeId {
        let mut b = [0u8; 32];
        b[0] = i;
        NodeId(b)
    }

    fn node(i: u8) -> NodeView {
        NodeView {
            id: nid(i),
            stake: GymWei::gym(20_000),
            vram_bytes: 80 * GIB,
            uptime: 0.99,
            penalty_until: None,
            region: "eu-west".into(),
            alive: true,
            assigned: None,
            standing_read_at: NOW,
        }
    }

    fn pjob(id: u64, age_ms: u64, min: u32, max: u32) -> PendingJob {
        PendingJob {
            id: JobId(id),
            submitter_stake: GymWei::gym(1_000),
            utility: 1.0,
            submitted_at: Timestamp(NOW.0 - age_ms),
            min_nodes: min,
            max_nodes: max,
            min_vram_bytes: 24 * GIB,
        }
    }

    fn rules() -> EligibilityRules {
        EligibilityRules::default()
    }

    // ---- why a job was not placed ----

    #[test]
    fn a_job_no_node_can_serve_names_what_the_nodes_lack() {
        let mut nodes: Vec<NodeView> = (1..=5).map(node).collect();
        for n in &mut nodes[..3] {
            n.vram_bytes = 8 * GIB;
        }
        nodes[3].assigned = Some(JobId(9));
        nodes[4].alive = false;
        let job = PendingJob {
            min_vram_bytes: 24 * GIB,
            ..pjob(1, 0, 2, 4)
        };
        let s = shortage(&rules(), &job, &nodes, NOW);
        assert_eq!((s.registered, s.alive, s.eligible, s.needed), (5, 4, 0, 2));
        assert_eq!(
            s.lacking,
            [
                ("VRAM below the job's minimum".to_string(), 3),
                ("assigned to another job".to_string(), 1)
            ]
        );
        assert_eq!(
            s.to_string(),
            "needs 2 nodes with at least 24.0 GiB of VRAM; 5 registered, 4 alive, 0 eligible \
             and free (3: VRAM below the job's minimum, 1: assigned to another job)"
        );
    }

    #[test]
    fn a_job_asking_for_more_nodes_than_are_alive_says_how_many_there_are() {
        let nodes: Vec<NodeView> = (1..=3).map(node).collect();
        let job = PendingJob {
            min_vram_bytes: 0,
            ..pjob(1, 0, 5, 8)
        };
        let s = shortage(&rules(), &job, &nodes, NOW);
        assert_eq!(
            s.to_string(),
            "needs 5 nodes; 3 registered, 3 alive, 3 eligible and free"
        );
    }

    proptest! {
        /// A member leaves at the boundary exactly when, given the same standing, it could
        /// not be placed for a reason of standing (the stake and penalty rules of
        /// [`check_eligibility`]); a failed read never makes it leave.
        #[test]
        fn a_member_leaves_iff_its_standing_would_keep_it_from_placement(
            gym in 0u64..30_000,
            penalty in proptest::option::of(0u64..2_000),
            unread in any::<bool>(),
        ) {
            let standing = Standing {
                stake: GymWei::gym(gym),
                penalty_until: penalty.map(|d| Timestamp(NOW.0 - 1_000 + d)),
            };
            let read = if unread {
                Err(ChainError::Unavailable("no answer".into()))
            } else {
                Ok(standing)
            };
            let leaves = !standing_leavers(&rules(), &[(nid(1), read)], NOW).is_empty();
            let view = NodeView {
                stake: standing.stake,
                penalty_until: standing.penalty_until,
                ..node(1)
            };
            let placeable = check_eligibility(&rules(), &view, 0, NOW).is_ok();
            prop_assert_eq!(leaves, !unread && !placeable);
        }

        /// Every alive node is counted once, as eligible or under one reason.
        #[test]
        fn shortage_counts_every_alive_node_once(
            specs in proptest::collection::vec((0u8..6, any::<bool>(), 0u64..100, 0u32..30_000), 0..12)
        ) {
            let nodes: Vec<NodeView> = specs.iter().map(|&(i, alive, vram_gib, stake)| NodeView {
                alive,
                vram_bytes: vram_gib * GIB,
                stake: GymWei::gym(u64::from(stake)),
                ..node(i)
            }).collect();
            let s = shortage(&rules(), &pjob(1, 0, 2, 4), &nodes, NOW);
            let distinct: HashSet<NodeId> = nodes.iter().map(|n| n.id).collect();
            prop_assert_eq!(s.registered as usize, distinct.len());
            let lacking: u32 = s.lacking.iter().map(|(_, n)| n).sum();
            prop_assert_eq!(s.eligible + lacking, s.alive);
            prop_assert!(s.alive <= s.registered);
        }
    }

    // ---- eligibility ----

    #[test]
    fn default_rules_are_the_papers() {
        let r = rules();
        assert_eq!(r.min_stake, GymWei::gym(10_000));
        assert_eq!(r.min_uptime, 0.95);
        let parsed: EligibilityRules = serde_json::from_str("{}").expect("defaults");
        assert_eq!(parsed, r);
    }

    #[test]
    fn standing_leavers_name_the_slashed_the_poor_and_the_unbound_but_not_the_unread() {
        let r = rules();
        let ok = |gym| {
            Ok(Standing {
                stake: GymWei::gym(gym),
                penalty_until: None,
            })
        };
        let reads = vec![
            (nid(1), ok(20_000)),
            (
                nid(2),
                Ok(Standing {
                    stake: GymWei::gym(20_000),
                    penalty_until: Some(NOW.plus_ms(1)),
                }),
            ),
            (nid(3), ok(9_999)),
            (nid(4), Err(ChainError::Unbound(nid(4)))),
            (nid(5), Err(ChainError::Unavailable("down".into()))),
            // A penalty that ended exactly now is over.
            (
                nid(6),
                Ok(Standing {
                    stake: GymWei::gym(10_000),
                    penalty_until: Some(NOW),
                }),
            ),
        ];
        assert_eq!(
            standing_leavers(&r, &reads, NOW),
            vec![
                (
                    nid(2),
                    Ineligible::Slashed {
                        until: NOW.plus_ms(1)
                    }
                ),
                (
                    nid(3),
                    Ineligible::Stake {
                        have: GymWei::gym(9_999),
                        need: r.min_stake
                    }
                ),
                (
                    nid(4),
                    Ineligible::Stake {
                        have: GymWei(0),
                        need: r.min_stake
                    }
                ),
            ]
        );
    }

    #[test]
    fn eligible_node_passes() {
        assert_eq!(check_eligibility(&rules(), &node(1), 24 * GIB, NOW), Ok(()));
    }

    #[test]
    fn each_rule_refuses() {
        let r = rules();
        let mut n = node(1);
        n.alive = false;
        assert_eq!(check_eligibility(&r, &n, 0, NOW), Err(Ineligible::NotAlive));
        let mut n = node(1);
        n.assigned = Some(JobId(3));
        assert_eq!(
            check_eligibility(&r, &n, 0, NOW),
            Err(Ineligible::Assigned(JobId(3)))
        );
        let mut n = node(1);
        n.penalty_until = Some(NOW.plus_ms(1));
        assert_eq!(
            check_eligibility(&r, &n, 0, NOW),
            Err(Ineligible::Slashed {
                until: NOW.plus_ms(1)
            })
        );
        n.penalty_until = Some(NOW); // expired exactly now
        assert_eq!(check_eligibility(&r, &n, 0, NOW), Ok(()));
        let mut n = node(1);
        n.stake = GymWei(GymWei::gym(10_000).0 - 1);
        assert_eq!(
            check_eligibility(&r, &n, 0, NOW),
            Err(Ineligible::Stake {
                have: n.stake,
                need: GymWei::gym(10_000)
            })
        );
        n.stake = GymWei::gym(10_000);
        assert_eq!(check_eligibility(&r, &n, 0, NOW), Ok(()));
        let n = node(1);
        assert_eq!(
            check_eligibility(&r, &n, 81 * GIB, NOW),
            Err(Ineligible::Vram {
                have: 80 * GIB,
                need: 81 * GIB
            })
        );
        let mut n = node(1);
        n.uptime = 0.949;
        assert_eq!(
            check_eligibility(&r, &n, 0, NOW),
            Err(Ineligible::Uptime {
                have: 0.949,
                need: 0.95
            })
        );
        n.uptime = 0.95;
        assert_eq!(check_eligibility(&r, &n, 0, NOW), Ok(()));
        n.uptime = f64::NAN;
        assert!(matches!(
            check_eligibility(&r, &n, 0, NOW),
            Err(Ineligible::Uptime { .. })
        ));
    }

    #[test]
    fn standby_accepts_own_job_only() {
        let r = rules();
        let mut n = node(1);
        n.assigned = Some(JobId(3));
        assert_eq!(eligible_for_standby(&r, &n, JobId(3), 0, NOW), Ok(()));
        assert_eq!(
            eligible_for_standby(&r, &n, JobId(4), 0, NOW),
            Err(Ineligible::Assigned(JobId(3)))
        );
        n.assigned = None;
        assert_eq!(eligible_for_standby(&r, &n, JobId(4), 0, NOW), Ok(()));
        n.alive = false;
        assert_eq!(
            eligible_for_standby(&r, &n, JobId(4), 0, NOW),
            Err(Ineligible::NotAlive)
        );
    }

    #[test]
    fn pending_job_from_job() {
        let spec = crate::job::JobSpec {
            name: "j".into(),
            epochs: 1,
            min_nodes: 2,
            max_nodes: 4,
            min_vram_bytes: 24 * GIB,
            pending_deadline_ms: 1_000,
            epoch_deadline_ms: 1_000,
            utility: 2.0,
            submitter_stake: GymWei::gym(5),
            training: Default::default(),
        };
        let mut job = Job::new(JobId(9), spec, NOW);
        let pj = PendingJob::from_job(&job).expect("pending");
        assert_eq!(
            pj,
            PendingJob {
                id: JobId(9),
                submitter_stake: GymWei::gym(5),
                utility: 2.0,
                submitted_at: NOW,
                min_nodes: 2,
                max_nodes: 4,
                min_vram_bytes: 24 * GIB,
            }
        );
        job.apply(&crate::job::JobEvent::Cancel, NOW)
            .expect("cancel accepted");
        assert_eq!(PendingJob::from_job(&job), None);
    }

    // ---- priorities ----

    #[test]
    fn aging_formula() {
        let p = AgingPolicy { tau_ms: 1_000 };
        let j = pjob(1, 2_000, 1, 1);
        // s = 1000 GYM, u = 1, t = 2 τ → 1000 · 1 · 3
        assert_eq!(p.priority(&j, NOW), 3_000.0);
        assert_eq!(p.name(), "aging");
        assert_eq!(p.starvation_after_ms(), 1_000);
        assert_eq!(AgingPolicy::default().tau_ms, 600_000);
        let zero = AgingPolicy { tau_ms: 0 };
        assert!(zero.priority(&j, NOW).is_finite());
    }

    #[test]
    fn paper_formula_inverts_fifo() {
        let p = PaperPolicy;
        let old = pjob(1, 10_000, 1, 1);
        let young = pjob(2, 1_000, 1, 1);
        assert_eq!(p.priority(&old, NOW), 0.1); // 1000 GYM · 1 / 10,000 ms
        assert!(p.priority(&young, NOW) > p.priority(&old, NOW));
        // t floored at 1 ms
        let fresh = pjob(3, 0, 1, 1);
        assert_eq!(p.priority(&fresh, NOW), 1_000.0);
        assert_eq!(p.name(), "paper");
    }

    // ---- schedule ----

    #[test]
    fn places_best_nodes_up_to_max() {
        let mut nodes: Vec<NodeView> = (1..=5).map(node).collect();
        nodes[3].stake = GymWei::gym(90_000); // node 4 is best
        nodes[2].uptime = 0.5; // node 3 ineligible
        let out = AgingPolicy::default().schedule(&[pjob(1, 0, 2, 3)], &nodes, &rules(), NOW);
        assert_eq!(
            out,
            vec![Placement {
                job: JobId(1),
                nodes: vec![nid(4), nid(1), nid(2)]
            }]
        );
    }

    #[test]
    fn vram_and_min_nodes_respected() {
        let mut nodes: Vec<NodeView> = (1..=3).map(node).collect();
        nodes[0].vram_bytes = 16 * GIB;
        let out = AgingPolicy::default().schedule(&[pjob(1, 0, 3, 3)], &nodes, &rules(), NOW);
        assert!(out.is_empty());
        let out = AgingPolicy::default().schedule(&[pjob(1, 0, 2, 3)], &nodes, &rules(), NOW);
        assert_eq!(out[0].nodes, vec![nid(2), nid(3)]);
    }

    #[test]
    fn backfill_before_starvation() {
        // Job 1 (older, needs 4) cannot run on 3 nodes; job 2 (needs 2) backfills.
        let nodes: Vec<NodeView> = (1..=3).map(node).collect();
        let p = AgingPolicy { tau_ms: 60_000 };
        let jobs = [pjob(1, 30_000, 4, 4), pjob(2, 1_000, 2, 2)];
        let out = p.schedule(&jobs, &nodes, &rules(), NOW);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].job, JobId(2));
    }

    #[test]
    fn starving_job_reserves_its_nodes() {
        // Job 1 has waited past τ: it reserves the 3 nodes it could use; job 2 gets none.
        let nodes: Vec<NodeView> = (1..=3).map(node).collect();
        let p = AgingPolicy { tau_ms: 60_000 };
        let jobs = [pjob(1, 60_000, 4, 4), pjob(2, 1_000, 2, 2)];
        assert!(p.schedule(&jobs, &nodes, &rules(), NOW).is_empty());
        // A node job 1 cannot use (too little VRAM) is still backfilled.
        let mut nodes = nodes;
        let mut small = node(9);
        small.vram_bytes = 30 * GIB;
        nodes.push(small.clone());
        let mut j2 = pjob(2, 1_000, 1, 2);
        j2.min_vram_bytes = 16 * GIB;
        let mut j1 = pjob(1, 60_000, 5, 5);
        j1.min_vram_bytes = 40 * GIB;
        let out = p.schedule(&[j1, j2], &nodes, &rules(), NOW);
        assert_eq!(
            out,
            vec![Placement {
                job: JobId(2),
                nodes: vec![nid(9)]
            }]
        );
        // Once a fourth node frees up, job 1 runs.
        let nodes: Vec<NodeView> = (1..=4).map(node).collect();
        let out = p.schedule(&jobs, &nodes, &rules(), NOW);
        assert_eq!(out[0].job, JobId(1));
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn starving_jobs_go_first_oldest_first_even_with_low_stake() {
        let nodes: Vec<NodeView> = (1..=2).map(node).collect();
        let p = AgingPolicy { tau_ms: 60_000 };
        let mut rich = pjob(2, 1_000, 2, 2);
        rich.submitter_stake = GymWei::gym(1_000_000);
        let poor_old = pjob(1, 120_000, 2, 2);
        let out = p.schedule(&[rich.clone(), poor_old], &nodes, &rules(), NOW);
        assert_eq!(out[0].job, JobId(1));
        // Without starvation the rich job wins.
        let poor_young = pjob(1, 30_000, 2, 2);
        let out = p.schedule(&[rich, poor_young], &nodes, &rules(), NOW);
        assert_eq!(out[0].job, JobId(2));
    }

    #[test]
    fn big_old_job_is_not_starved_by_a_stream_of_rich_small_jobs() {
        // 10 nodes; every minute a rich 2-node job arrives; jobs run for 3 minutes. The poor
        // 10-node job must eventually run: once starving it reserves the nodes that free up.
        let p = AgingPolicy { tau_ms: 5 * 60_000 };
        let mut nodes: Vec<NodeView> = (1..=10).map(node).collect();
        let mut running: Vec<(JobId, Timestamp)> = Vec::new();
        let big = pjob(1, 0, 10, 10);
        let start = big.submitted_at;
        let mut pending = vec![PendingJob {
            submitted_at: start,
            ..big
        }];
        let mut big_started = None;
        for round in 0..60u64 {
            let now = start.plus_ms(round * 60_000);
            running.retain(|(job, until)| {
                let done = now >= *until;
                if done {
                    for n in nodes.iter_mut().filter(|n| n.assigned == Some(*job)) {
                        n.assigned = None;
                    }
                }
                !done
            });
            let mut rich = pjob(100 + round, 0, 2, 2);
            rich.submitted_at = now;
            rich.submitter_stake = GymWei::gym(1_000_000);
            pending.push(rich);
            for pl in p.schedule(&pending, &nodes, &rules(), now) {
                for n in nodes.iter_mut().filter(|n| pl.nodes.contains(&n.id)) {
                    n.assigned = Some(pl.job);
                }
                running.push((pl.job, now.plus_ms(3 * 60_000)));
                pending.retain(|j| j.id != pl.job);
                if pl.job == JobId(1) {
                    big_started.get_or_insert(round);
                }
            }
        }
        let round = big_started.expect("the big job ran");
        // Starving after 5 rounds; the running small jobs drain within 3 more.
        assert!(round <= 5 + 3, "big job started only in round {round}");
    }

    #[test]
    fn duplicates_and_degenerate_jobs() {
        let nodes = vec![node(1), node(1), node(2)];
        let jobs = [pjob(1, 0, 1, 3), pjob(1, 0, 1, 3), pjob(2, 0, 3, 2)];
        let out = AgingPolicy::default().schedule(&jobs, &nodes, &rules(), NOW);
        assert_eq!(
            out,
            vec![Placement {
                job: JobId(1),
                nodes: vec![nid(1), nid(2)]
            }]
        );
        let out = AgingPolicy::default().schedule(&[pjob(5, 0, 0, 0)], &nodes, &rules(), NOW);
        assert!(out.is_empty());
        let mut nan = pjob(6, 0, 0, 1);
        nan.utility = f64::NAN;
        let out = AgingPolicy::default().schedule(&[nan], &nodes, &rules(), NOW);
        assert_eq!(out[0].nodes.len(), 1);
    }

    // ---- properties ----

    fn arb_node() -> impl Strategy<Value = NodeView> {
        (
            0u8..40,
            0u64..40_000,
            prop::sample::select(vec![16u64, 24, 40, 80]),
            prop_oneof![Just(1.0), Just(0.95), 0.0f64..=1.0],
            prop::option::weighted(0.1, 0u64..2_000),
            prop::bool::weighted(0.9),
            prop::option::weighted(0.1, 1u64..5),
        )
            .prop_map(
                |(id, stake, vram, uptime, penalty, alive, assigned)| NodeView {
                    id: nid(id),
                    stake: GymWei::gym(stake),
                    vram_bytes: vram * GIB,
                    uptime,
                    penalty_until: penalty.map(|d| Timestamp(NOW.0 - 1_000 + d)),
                    region: "r".into(),
                    alive,
                    assigned: assigned.map(JobId),
                    standing_read_at: NOW,
                },
            )
    }

    fn arb_job() -> impl Strategy<Value = PendingJob> {
        (
            0u64..12,
            0u64..5_000,
            0.1f64..10.0,
            0u64..200_000,
            0u32..6,
            0u32..10,
            prop::sample::select(vec![0u64, 16, 24, 40, 80]),
        )
            .prop_map(|(id, stake, utility, age, min, extra, vram)| PendingJob {
                id: JobId(id),
                submitter_stake: GymWei::gym(stake),
                utility,
                submitted_at: Timestamp(NOW.0 - age),
                min_nodes: min,
                max_nodes: min + extra,
                min_vram_bytes: vram * GIB,
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn aging_non_decreasing_in_wait_and_stake(
            tau in 0u64..10_000_000,
            stake in 0u64..1_000_000_000,
            extra_stake in 0u64..1_000_000,
            utility in 0.0f64..1e6,
            age in 0u64..1_000_000_000,
            extra_age in 0u64..1_000_000_000,
        ) {
            let p = AgingPolicy { tau_ms: tau };
            let mut j = PendingJob {
                id: JobId(1),
                submitter_stake: GymWei::gym(stake),
                utility,
                submitted_at: Timestamp(0),
                min_nodes: 1,
                max_nodes: 1,
                min_vram_bytes: 0,
            };
            let a = p.priority(&j, Timestamp(age));
            let b = p.priority(&j, Timestamp(age + extra_age));
            prop_assert!(b >= a);
            j.submitter_stake = GymWei::gym(stake + extra_stake);
            let c = p.priority(&j, Timestamp(age));
            prop_assert!(c >= a);
        }

        #[test]
        fn schedule_invariants(
            jobs in prop::collection::vec(arb_job(), 0..8),
            nodes in prop::collection::vec(arb_node(), 0..40),
            tau in 1u64..300_000,
            paper in any::<bool>(),
        ) {
            // Unique job ids (duplicates are covered by a unit test).
            let mut jobs = jobs;
            for (i, j) in jobs.iter_mut().enumerate() {
                j.id = JobId(i as u64);
            }
            let r = rules();
            let policy: Box<dyn SchedulingPolicy> =
                if paper { Box::new(PaperPolicy) } else { Box::new(AgingPolicy { tau_ms: tau }) };
            let out = policy.schedule(&jobs, &nodes, &r, NOW);
            // Deterministic.
            prop_assert_eq!(&out, &policy.schedule(&jobs, &nodes, &r, NOW));
            let mut used = HashSet::new();
            let mut placed = HashSet::new();
            for pl in &out {
                prop_assert!(placed.insert(pl.job), "job placed twice");
                let job = jobs.iter().find(|j| j.id == pl.job).expect("placed job exists");
                let n = pl.nodes.len() as u32;
                prop_assert!(n >= job.min_nodes.max(1) && n <= job.max_nodes);
                for id in &pl.nodes {
                    prop_assert!(used.insert(*id), "node given twice");
                    // Some node with this id is eligible for this job.
                    let ok = nodes.iter().any(|nv| nv.id == *id
                        && check_eligibility(&r, nv, job.min_vram_bytes, NOW).is_ok());
                    prop_assert!(ok, "ineligible node placed");
                }
            }
        }

        #[test]
        fn older_job_never_loses_to_younger_twin(
            nodes in prop::collection::vec(arb_node(), 0..30),
            older_age in 1u64..200_000,
            gap in 1u64..100_000,
            (min_a, extra_a, min_b, extra_b) in (1u32..6, 0u32..4, 1u32..6, 0u32..4),
            (vram_a, vram_b) in (prop::sample::select(vec![0u64, 24, 80]), prop::sample::select(vec![0u64, 24, 80])),
            stake in 0u64..5_000,
            utility in 0.1f64..10.0,
            tau in 1u64..300_000,
        ) {
            let r = rules();
            let p = AgingPolicy { tau_ms: tau };
            let mk = |id, age, min, extra, vram: u64| PendingJob {
                id: JobId(id),
                submitter_stake: GymWei::gym(stake),
                utility,
                submitted_at: Timestamp(NOW.0 - age),
                min_nodes: min,
                max_nodes: min + extra,
                min_vram_bytes: vram * GIB,
            };
            // Ids chosen so that id order disagrees with age order.
            let older = mk(2, older_age + gap, min_a, extra_a, vram_a);
            let younger = mk(1, older_age, min_b, extra_b, vram_b);
            let out = p.schedule(&[younger.clone(), older.clone()], &nodes, &r, NOW);
            let pos = |id| out.iter().position(|pl| pl.job == JobId(id));
            match (pos(2), pos(1)) {
                (Some(a), Some(b)) => prop_assert!(a < b, "older placed after younger"),
                (None, Some(_)) => {
                    // Only if the older job could not have been placed even alone.
                    prop_assert!(p.schedule(&[older], &nodes, &r, NOW).is_empty());
                }
                _ => {}
            }
        }
    }
}
