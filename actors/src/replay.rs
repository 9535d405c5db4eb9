//! The fold over the event log that every actor rebuilds itself from (paper §1.1: state is a
//! pure function of the log). One fold serves the scheduler, the job supervisor, each job
//! actor and each ring actor, so they can never disagree about what the log says.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::events::{Event, Record};
use crate::job::Job;
use crate::ports::{DeltaReceipt, RingView};
use crate::types::{GymWei, JobId, NodeId, NodeInfo};

/// What the log says about one job.
#[derive(Debug, Clone)]
pub struct JobFold {
    /// The job state machine after every accepted transition.
    pub job: Job,
    /// The nodes the scheduler placed it on, if placed.
    pub placed: Option<Vec<NodeId>>,
    /// The latest ring and the sequence number of the record that set it.
    pub ring: Option<(u64, RingView)>,
    /// Accepted deltas of the job's current epoch (empty unless `Running`), by node.
    pub receipts: BTreeMap<NodeId, DeltaReceipt>,
    /// Ring members declared failed after the latest ring was recorded: recovery owed.
    pub failed_since_ring: BTreeSet<NodeId>,
}

/// What the log says about one node.
#[derive(Debug, Clone)]
pub struct NodeFold {
    /// Its latest declared info.
    pub info: NodeInfo,
    /// Its stake at its latest admission.
    pub stake: GymWei,
    /// Whether its latest event is a failure.
    pub failed: bool,
}

/// The whole fold.
#[derive(Debug, Clone, Default)]
pub struct LogFold {
    /// Every job, by id.
    pub jobs: BTreeMap<JobId, JobFold>,
    /// Every node ever admitted, by id.
    pub nodes: BTreeMap<NodeId, NodeFold>,
    /// Measured links (from, to) → Mbit/s, latest measurement.
    pub links: HashMap<(NodeId, NodeId), f32>,
    /// The last sequence number folded.
    pub last_seq: u64,
}

impl LogFold {
    /// The next job id to assign (1 + the highest seen).
    pub fn next_job_id(&self) -> JobId {
        JobId(self.jobs.keys().next_back().map_or(1, |j| j.0 + 1))
    }
}

/// Folds `records` (in log order) into a [`LogFold`]. Events the fold cannot apply (which
/// the writers never produce) are skipped with a warning rather than aborting recovery.
pub fn fold(records: &[Record]) -> LogFold {
    let mut out = LogFold::default();
    let mut all_receipts: HashMap<JobId, Vec<DeltaReceipt>> = HashMap::new();
    let mut last_failure: HashMap<NodeId, u64> = HashMap::new();
    for r in records {
        out.last_seq = r.seq;
        match &r.event {
            Event::NodeRegistered { info, stake } => {
                out.nodes.insert(
                    info.id,
                    NodeFold {
                        info: info.clone(),
                        stake: *stake,
                        failed: false,
                    },
                );
            }
            Event::NodeFailed { node, .. } => {
                if let Some(n) = out.nodes.get_mut(node) {
                    n.failed = true;
                }
                last_failure.insert(*node, r.seq);
            }
            Event::LinkMeasured { from, to, mbps } => {
                out.links.insert((*from, *to), *mbps);
            }
            Event::JobSubmitted { job, spec } => {
                out.jobs.insert(
                    *job,
                    JobFold {
                        job: Job::new(*job, spec.clone(), r.at),
                        placed: None,
                        ring: None,
                        receipts: BTreeMap::new(),
                        failed_since_ring: BTreeSet::new(),
                    },
                );
            }
            Event::JobPlaced { job, nodes } => {
                if let Some(j) = out.jobs.get_mut(job) {
                    j.placed = Some(nodes.clone());
                }
            }
            Event::Job { job, event } => {
                if let Some(j) = out.jobs.get_mut(job) {
                    if let Err(e) = j.job.apply(event, r.at) {
                        tracing::warn!(seq = r.seq, %job, error = %e, "skipping unappliable job event in replay");
                    }
                }
            }
            Event::RingChanged { ring, .. } => {
                if let Some(j) = out.jobs.get_mut(&ring.job) {
                    j.ring = Some((r.seq, ring.clone()));
                }
            }
            Event::DeltaAccepted(receipt) => {
                all_receipts
                    .entry(receipt.job)
                    .or_default()
                    .push(receipt.clone());
            }
        }
    }
    for (id, j) in out.jobs.iter_mut() {
        if let crate::job::JobPhase::Running { epoch, .. } = j.job.phase {
            for r in all_receipts.remove(id).unwrap_or_default() {
                if r.epoch == epoch {
                    j.receipts.insert(r.node, r);
                }
            }
        }
        if let Some((seq, ring)) = &j.ring {
            j.failed_since_ring = ring
                .members
                .iter()
                .filter(|m| last_failure.get(m).is_some_and(|s| s > seq))
                .copied()
                .collect();
        }
    }
    out
}
