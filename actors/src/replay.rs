//! The fold over the event log that every actor rebuilds itself from (paper §1.1: state is a
//! pure function of the log). One fold serves the scheduler, the job supervisor, each job
//! actor and each ring actor, so they can never disagree about what the log says.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::events::{Event, Record};
use crate::job::{Job, JobPhase};
use crate::ports::{DeltaReceipt, RingView};
use crate::types::{GymWei, JobId, NodeId, NodeInfo, Timestamp};

/// What the log says about one job.
#[derive(Debug, Clone)]
pub struct JobFold {
    /// The job state machine after every accepted transition.
    pub job: Job,
    /// The nodes the scheduler placed it on, if placed.
    pub placed: Option<Vec<NodeId>>,
    /// The latest ring and the sequence number of the record that set it.
    pub ring: Option<(u64, RingView)>,
    /// Accepted deltas of the job's current epoch (while `Running` or `Aggregating` it), by
    /// node.
    pub receipts: BTreeMap<NodeId, DeltaReceipt>,
    /// When the job entered its current phase (the `at` of the record), so timers resume
    /// where they stood: an epoch deadline counts from the epoch's start, not a rebuild.
    pub phase_since: Timestamp,
    /// Ring members declared failed after the latest ring was recorded: recovery owed.
    pub failed_since_ring: BTreeSet<NodeId>,
    /// Standbys granted after the latest ring was recorded (the next ring uses or returns
    /// them); they count as the job's until then.
    pub granted_since_ring: BTreeSet<NodeId>,
}

/// What the log says about one node.
#[derive(Debug, Clone)]
pub struct NodeFold {
    /// Its latest declared info.
    pub info: NodeInfo,
    /// Its stake at its latest admission.
    pub stake: GymWei,
    /// Its active slashing penalty at its latest admission.
    pub penalty_until: Option<Timestamp>,
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

/// The epoch a job is running or aggregating.
fn epoch_of(phase: &JobPhase) -> Option<u32> {
    match phase {
        JobPhase::Running { epoch, .. } | JobPhase::Aggregating { epoch, .. } => Some(*epoch),
        _ => None,
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
            Event::NodeRegistered {
                info,
                stake,
                penalty_until,
            } => {
                out.nodes.insert(
                    info.id,
                    NodeFold {
                        info: info.clone(),
                        stake: *stake,
                        penalty_until: *penalty_until,
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
                        phase_since: r.at,
                        failed_since_ring: BTreeSet::new(),
                        granted_since_ring: BTreeSet::new(),
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
                    let before = j.job.phase.name();
                    let epoch_before = epoch_of(&j.job.phase);
                    if let Err(e) = j.job.apply(event, r.at) {
                        tracing::warn!(seq = r.seq, %job, error = %e, "skipping unappliable job event in replay");
                    } else if j.job.phase.name() != before || epoch_of(&j.job.phase) != epoch_before
                    {
                        j.phase_since = r.at;
                    }
                }
            }
            Event::StandbysGranted { job, nodes } => {
                if let Some(j) = out.jobs.get_mut(job) {
                    j.granted_since_ring.extend(nodes.iter().copied());
                }
            }
            Event::RingChanged { ring, .. } => {
                if let Some(j) = out.jobs.get_mut(&ring.job) {
                    j.ring = Some((r.seq, ring.clone()));
                    j.granted_since_ring.clear();
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
        if let Some(epoch) = epoch_of(&j.job.phase) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{JobEvent, JobSpec};

    fn rec(seq: u64, event: Event) -> Record {
        Record {
            seq,
            at: Timestamp(1_000 * seq),
            event,
        }
    }

    /// Regression: a job actor rebuilt while its epoch is being published must publish it
    /// with the epoch's deltas, not with none.
    #[test]
    fn aggregating_epoch_keeps_its_receipts_and_start_time() {
        let job = JobId(1);
        let spec = JobSpec {
            name: "j".into(),
            epochs: 2,
            min_nodes: 1,
            max_nodes: 2,
            min_vram_bytes: 0,
            pending_deadline_ms: 1_000_000,
            epoch_deadline_ms: 1_000_000,
            utility: 1.0,
            submitter_stake: GymWei::gym(1),
            training: Default::default(),
        };
        let (a, b) = (NodeId([1; 32]), NodeId([2; 32]));
        let delta = |node, epoch| {
            Event::DeltaAccepted(DeltaReceipt {
                job,
                node,
                epoch,
                step: 1,
                delta_hash: [epoch as u8; 32],
                claimed_loss: 1.0,
                signature: Vec::new(),
            })
        };
        let ev = |event| Event::Job { job, event };
        let records = vec![
            rec(1, Event::JobSubmitted { job, spec }),
            rec(2, ev(JobEvent::NodesReady { ring_version: 1 })),
            rec(3, ev(JobEvent::ModelDistributed)),
            rec(4, delta(a, 0)),
            rec(5, delta(b, 0)),
            rec(6, ev(JobEvent::EpochComplete { epoch: 0 })),
        ];
        let fold = fold(&records);
        let j = &fold.jobs[&job];
        assert!(matches!(
            j.job.phase,
            JobPhase::Aggregating { epoch: 0, .. }
        ));
        assert_eq!(j.receipts.len(), 2);
        assert_eq!(j.phase_since, Timestamp(6_000));
        // Once published, the next epoch starts empty, timed from its own start.
        let mut more = records.clone();
        more.push(rec(
            7,
            ev(JobEvent::CheckpointPublished {
                epoch: 0,
                checkpoint: "c0".into(),
            }),
        ));
        let fold = super::fold(&more);
        let j = &fold.jobs[&job];
        assert!(matches!(j.job.phase, JobPhase::Running { epoch: 1, .. }));
        assert!(j.receipts.is_empty());
        assert_eq!(j.phase_since, Timestamp(7_000));

        // Standbys granted count as the job's until a ring is recorded after them.
        let c = NodeId([3; 32]);
        more.push(rec(
            8,
            Event::StandbysGranted {
                job,
                nodes: vec![c],
            },
        ));
        assert!(super::fold(&more).jobs[&job]
            .granted_since_ring
            .contains(&c));
        more.push(rec(
            9,
            Event::RingChanged {
                ring: RingView {
                    job,
                    version: 2,
                    members: vec![a, c],
                    bottleneck_mbps: 1.0,
                    estimated_links: 0,
                },
                removed: vec![b],
                added: vec![c],
            },
        ));
        assert!(super::fold(&more).jobs[&job].granted_since_ring.is_empty());
    }
}
