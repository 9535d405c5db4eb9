//! The fold over the event log that every actor rebuilds itself from (paper §1.1: state is a
//! pure function of the log). One fold serves the scheduler, the job supervisor, each job
//! actor and each ring actor, so they can never disagree about what the log says.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use crate::events::{Event, Record};
use crate::job::{Job, JobPhase};
use crate::ports::{DeltaReceipt, RingView, Snapshot, StateStore, StoreError};
use crate::types::{GymWei, JobId, NodeId, NodeInfo, Timestamp};

/// The key snapshots of the fold are stored under ([`StateStore::put_snapshot`]).
pub const SNAPSHOT_KEY: &str = "fold";

/// The snapshot format's version: a snapshot of another version is ignored (the log is
/// folded from the start instead), so an upgrade never misreads an old one.
const SNAPSHOT_VERSION: u32 = 1;

/// What the log says about one job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// The current epoch's accepted ring round, if the job aggregates over the ring and one
    /// was accepted (DESIGN §6.4).
    #[serde(default)]
    pub ring_result: Option<(u32, crate::aggregation::RingResult)>,
}

/// What the log says about one node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeFold {
    /// Its latest declared info.
    pub info: NodeInfo,
    /// Its stake at its latest admission or standing change, in GYM wei.
    pub stake: GymWei,
    /// Its slashing penalty at its latest admission or standing change.
    pub penalty_until: Option<Timestamp>,
    /// When its stake and penalty were read: its latest admission or standing change
    /// (the record's time, ms since the Unix epoch).
    #[serde(default)]
    pub standing_read_at: Timestamp,
    /// Whether its latest event is a failure.
    pub failed: bool,
}

/// The whole fold.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LogFold {
    /// Every job, by id.
    pub jobs: BTreeMap<JobId, JobFold>,
    /// Every node ever admitted, by id.
    pub nodes: BTreeMap<NodeId, NodeFold>,
    /// Measured links (from, to) → Mbit/s, latest measurement.
    #[serde(with = "link_list")]
    pub links: HashMap<(NodeId, NodeId), f32>,
    /// The last sequence number folded.
    pub last_seq: u64,
}

impl LogFold {
    /// The next job id to assign (1 + the highest seen), or 1 on an empty log.
    pub fn next_job_id(&self) -> JobId {
        self.next_job_id_or(JobId(1))
    }

    /// The next job id to assign: 1 + the highest the log holds, or `first` on an empty log
    /// (`core.first_job_id`, resolved). A pure function of the log once it holds a job, so a
    /// replica that replays it (or a rebuilt supervisor) goes on where the last left off.
    pub fn next_job_id_or(&self, first: JobId) -> JobId {
        self.jobs
            .keys()
            .next_back()
            .map_or(first, |j| JobId(j.0 + 1))
    }
}

/// 2025-01-01T00:00:00Z in ms since the Unix epoch: where clock-drawn job ids count from.
pub const JOB_ID_EPOCH_MS: u64 = 1_735_689_600_000;

/// The first job id of a fresh log when `core.first_job_id` is 0 (the default): the whole
/// seconds from 2025-01-01 UTC to `now` (the orchestrator's start), at least 1. An
/// orchestrator restarted on a fresh log (the in-memory one) so numbers its jobs after
/// every id an earlier run handed out, as long as that run handed out fewer ids than the
/// seconds it ran (it started at least that many seconds earlier); ids stay 8 digits
/// until 2028. A clock before 2025 gives 1.
pub fn first_job_id_from_clock(now: Timestamp) -> JobId {
    JobId((now.0.saturating_sub(JOB_ID_EPOCH_MS) / 1_000).max(1))
}

/// The first job id of a fresh log for the setting `core.first_job_id` at `now`: the
/// setting itself, or, for 0, [`first_job_id_from_clock`].
pub fn resolve_first_job_id(setting: u64, now: Timestamp) -> JobId {
    match setting {
        0 => first_job_id_from_clock(now),
        n => JobId(n),
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
    out.apply(records);
    out
}

impl LogFold {
    /// Folds more `records` (those after [`LogFold::last_seq`], in log order) into this
    /// fold: `fold(a ++ b) == { let mut f = fold(a); f.apply(b); f }`, which is what lets a
    /// snapshot stand in for the records it covers.
    pub fn apply(&mut self, records: &[Record]) {
        for r in records {
            self.apply_one(r);
        }
    }

    fn apply_one(&mut self, r: &Record) {
        self.last_seq = r.seq;
        match &r.event {
            Event::NodeRegistered {
                info,
                stake,
                penalty_until,
            } => {
                self.nodes.insert(
                    info.id,
                    NodeFold {
                        info: info.clone(),
                        stake: *stake,
                        penalty_until: *penalty_until,
                        standing_read_at: r.at,
                        failed: false,
                    },
                );
            }
            Event::NodeStanding {
                node,
                stake,
                penalty_until,
            } => {
                if let Some(n) = self.nodes.get_mut(node) {
                    n.stake = *stake;
                    n.penalty_until = *penalty_until;
                    n.standing_read_at = r.at;
                }
            }
            Event::NodeFailed { node, .. } => {
                if let Some(n) = self.nodes.get_mut(node) {
                    n.failed = true;
                }
                for j in self.jobs.values_mut() {
                    if j.ring
                        .as_ref()
                        .is_some_and(|(_, v)| v.members.contains(node))
                    {
                        j.failed_since_ring.insert(*node);
                    }
                }
            }
            Event::LinkMeasured { from, to, mbps } => {
                self.links.insert((*from, *to), *mbps);
            }
            Event::JobSubmitted { job, spec, resumed } => {
                self.jobs.insert(
                    *job,
                    JobFold {
                        job: Job::resume(*job, (**spec).clone(), r.at, resumed.clone()),
                        placed: None,
                        ring: None,
                        receipts: BTreeMap::new(),
                        phase_since: r.at,
                        failed_since_ring: BTreeSet::new(),
                        granted_since_ring: BTreeSet::new(),
                        ring_result: None,
                    },
                );
            }
            Event::JobPlaced { job, nodes } => {
                if let Some(j) = self.jobs.get_mut(job) {
                    j.placed = Some(nodes.clone());
                }
            }
            Event::Job { job, event } => {
                if let Some(j) = self.jobs.get_mut(job) {
                    let before = j.job.phase.name();
                    let epoch_before = epoch_of(&j.job.phase);
                    if let Err(e) = j.job.apply(event, r.at) {
                        tracing::warn!(seq = r.seq, %job, error = %e, "skipping unappliable job event in replay");
                    } else {
                        let epoch = epoch_of(&j.job.phase);
                        if j.job.phase.name() != before || epoch != epoch_before {
                            j.phase_since = r.at;
                        }
                        // Receipts belong to the epoch being run or aggregated.
                        j.receipts.retain(|_, rc| Some(rc.epoch) == epoch);
                        if j.ring_result
                            .as_ref()
                            .is_some_and(|(e, _)| Some(*e) != epoch)
                        {
                            j.ring_result = None;
                        }
                    }
                }
            }
            Event::StandbysGranted { job, nodes } => {
                if let Some(j) = self.jobs.get_mut(job) {
                    j.granted_since_ring.extend(nodes.iter().copied());
                }
            }
            Event::RingChanged { ring, .. } => {
                if let Some(j) = self.jobs.get_mut(&ring.job) {
                    j.ring = Some((r.seq, ring.clone()));
                    j.granted_since_ring.clear();
                    j.failed_since_ring.clear();
                }
            }
            Event::DeltaAccepted(receipt) => {
                if let Some(j) = self.jobs.get_mut(&receipt.job) {
                    if epoch_of(&j.job.phase) == Some(receipt.epoch) {
                        j.receipts.insert(receipt.node, receipt.clone());
                    }
                }
            }
            Event::RingAccepted { job, epoch, result } => {
                if let Some(j) = self.jobs.get_mut(job) {
                    if epoch_of(&j.job.phase) == Some(*epoch) {
                        j.ring_result = Some((*epoch, result.clone()));
                    }
                }
            }
        }
    }
}

#[derive(Serialize, Deserialize)]
struct SnapshotBody {
    v: u32,
    fold: LogFold,
}

/// The fold of the whole log in `store`: the latest snapshot (when there is one of this
/// format), then the records after it. A snapshot that does not decode is logged and
/// ignored: the log alone is the source of truth.
pub async fn load(store: &dyn StateStore) -> Result<LogFold, StoreError> {
    let mut fold = match store.get_snapshot(SNAPSHOT_KEY).await? {
        Some(snap) => match serde_json::from_slice::<SnapshotBody>(&snap.state) {
            Ok(body) if body.v == SNAPSHOT_VERSION && body.fold.last_seq == snap.seq => body.fold,
            Ok(body) => {
                tracing::warn!(
                    version = body.v,
                    seq = snap.seq,
                    "ignoring a snapshot of another format; folding the whole log"
                );
                LogFold::default()
            }
            Err(e) => {
                tracing::warn!(seq = snap.seq, error = %e, "ignoring an unreadable snapshot; folding the whole log");
                LogFold::default()
            }
        },
        None => LogFold::default(),
    };
    let tail = store.read_after(fold.last_seq).await?;
    fold.apply(&tail);
    Ok(fold)
}

/// Writes a snapshot of the fold when at least `every` events were appended since the
/// stored one (`every` = 0: never). `known` caches the stored snapshot's sequence number
/// between calls (`None`: read it from the store), so a check that finds nothing due reads
/// only the log's length. Returns the sequence number snapshotted, if one was written.
/// Through a fenced handle, a deposed leader's snapshot is refused like its appends.
pub async fn snapshot(
    store: &dyn StateStore,
    every: u64,
    known: &mut Option<u64>,
) -> Result<Option<u64>, StoreError> {
    if every == 0 {
        return Ok(None);
    }
    let stored = match *known {
        Some(seq) => seq,
        None => {
            let seq = store.get_snapshot(SNAPSHOT_KEY).await?.map_or(0, |s| s.seq);
            *known = Some(seq);
            seq
        }
    };
    if store.last_seq().await?.saturating_sub(stored) < every {
        return Ok(None);
    }
    let fold = load(store).await?;
    let seq = fold.last_seq;
    let state = serde_json::to_vec(&SnapshotBody {
        v: SNAPSHOT_VERSION,
        fold,
    })
    .map_err(|e| StoreError::Corrupt {
        seq,
        reason: format!("snapshot does not serialize: {e}"),
    })?;
    store
        .put_snapshot(SNAPSHOT_KEY, Snapshot { seq, state })
        .await?;
    *known = Some(seq);
    Ok(Some(seq))
}

/// `links` as a list of `[from, to, mbps]`: JSON maps need string keys.
mod link_list {
    use std::collections::HashMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::types::NodeId;

    pub fn serialize<S: Serializer>(
        links: &HashMap<(NodeId, NodeId), f32>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let mut list: Vec<(NodeId, NodeId, f32)> =
            links.iter().map(|((a, b), m)| (*a, *b, *m)).collect();
        list.sort_by_key(|x| (x.0, x.1));
        list.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<HashMap<(NodeId, NodeId), f32>, D::Error> {
        let list = Vec::<(NodeId, NodeId, f32)>::deserialize(d)?;
        Ok(list.into_iter().map(|(a, b, m)| ((a, b), m)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{JobEvent, JobSpec};

    /// Regression (issue 16): a daemon restarted on a fresh in-memory log numbered its
    /// jobs from 1 again, so yesterday's job 1 and today's had one id. The first id of a
    /// fresh log now comes from the clock, later than any id a run that started earlier
    /// handed out (below one id a second), while a log that holds jobs goes on after its
    /// highest, whatever the clock says (a replica replaying it continues the same series).
    #[test]
    fn a_fresh_log_never_reuses_an_earlier_runs_job_ids() {
        let t = |secs: u64| Timestamp(JOB_ID_EPOCH_MS + secs * 1_000);
        // 2026-12-02T00:00:00Z.
        let dec_2026 = Timestamp(1_796_169_600_000);
        assert_eq!(first_job_id_from_clock(dec_2026), JobId(60_480_000));
        assert_eq!(
            first_job_id_from_clock(Timestamp(0)),
            JobId(1),
            "a clock before 2025"
        );
        assert_eq!(first_job_id_from_clock(t(0)), JobId(1));
        // Yesterday's run started at t(100) and handed out 50 ids; today's starts later.
        let yesterday = resolve_first_job_id(0, t(100));
        let today = resolve_first_job_id(0, t(100 + 86_400));
        assert!(
            today.0 > yesterday.0 + 50,
            "{today:?} after {yesterday:?} + 50"
        );
        // A run restarted 60 s later is past the ids of one that handed out 60 or fewer.
        assert!(resolve_first_job_id(0, t(160)).0 >= yesterday.0 + 60);
        // A fixed setting is taken as it is.
        assert_eq!(resolve_first_job_id(1, dec_2026), JobId(1));
        assert_eq!(resolve_first_job_id(7, t(5)), JobId(7));
        // An empty log starts at the first id; one with jobs continues after its highest.
        let empty = LogFold::default();
        assert_eq!(empty.next_job_id_or(yesterday), yesterday);
        assert_eq!(empty.next_job_id(), JobId(1));
        let log = fold(&[
            rec(
                1,
                Event::JobSubmitted {
                    job: JobId(41),
                    spec: Box::new(spec()),
                    resumed: Vec::new(),
                },
            ),
            rec(
                2,
                Event::JobSubmitted {
                    job: JobId(42),
                    spec: Box::new(spec()),
                    resumed: Vec::new(),
                },
            ),
        ]);
        assert_eq!(log.next_job_id_or(today), JobId(43));
        assert_eq!(log.next_job_id_or(JobId(1)), JobId(43));
    }

    /// A two-epoch job on one or two nodes, with deadlines no test reaches.
    fn spec() -> JobSpec {
        JobSpec {
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
        }
    }

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
        let spec = spec();
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
            rec(
                1,
                Event::JobSubmitted {
                    job,
                    spec: Box::new(spec),
                    resumed: vec![],
                },
            ),
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
                summary: None,
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

    fn arb_event() -> impl proptest::strategy::Strategy<Value = Event> {
        use crate::types::{GpuInfo, LinkProfile, NodeInfo};
        use proptest::prelude::*;
        let node = (1u8..5).prop_map(|b| NodeId([b; 32]));
        let job = (1u64..3).prop_map(JobId);
        let spec = JobSpec {
            name: "p".into(),
            epochs: 3,
            min_nodes: 1,
            max_nodes: 4,
            min_vram_bytes: 0,
            pending_deadline_ms: 1_000,
            epoch_deadline_ms: 1_000,
            utility: 1.0,
            submitter_stake: GymWei::gym(1),
            training: Default::default(),
        };
        let job_event = prop_oneof![
            (1u64..4).prop_map(|v| JobEvent::NodesReady { ring_version: v }),
            Just(JobEvent::ModelDistributed),
            (0u32..3).prop_map(|e| JobEvent::EpochComplete { epoch: e }),
            (0u32..3).prop_map(|e| JobEvent::CheckpointPublished {
                epoch: e,
                checkpoint: format!("c{e}"),
                summary: None,
            }),
            (1u64..4).prop_map(|v| JobEvent::RingChanged { ring_version: v }),
        ];
        prop_oneof![
            node.clone().prop_map(|id| Event::NodeRegistered {
                info: NodeInfo {
                    id,
                    gpu: GpuInfo {
                        model: "g".into(),
                        vram_bytes: 1,
                        compute_cap: (8, 0),
                        driver_sig: Vec::new(),
                    },
                    link: LinkProfile {
                        up_mbps: 1.0,
                        down_mbps: 1.0,
                    },
                    region: "r".into(),
                },
                stake: GymWei::gym(1),
                penalty_until: None,
            }),
            node.clone().prop_map(|node| Event::NodeFailed {
                node,
                kind: crate::events::FailureKind::SessionClosed,
            }),
            (node.clone(), 0u64..3, proptest::option::of(1u64..4)).prop_map(
                |(node, gym, penalty)| Event::NodeStanding {
                    node,
                    stake: GymWei::gym(gym),
                    penalty_until: penalty.map(Timestamp),
                }
            ),
            (node.clone(), node.clone(), 1u8..100).prop_map(|(from, to, m)| {
                Event::LinkMeasured {
                    from,
                    to,
                    mbps: m as f32,
                }
            }),
            job.clone().prop_map(move |job| Event::JobSubmitted {
                job,
                spec: Box::new(spec.clone()),
                resumed: vec![],
            }),
            (job.clone(), job_event).prop_map(|(job, event)| Event::Job { job, event }),
            (
                job.clone(),
                proptest::collection::vec(node.clone(), 1..4),
                1u64..4
            )
                .prop_map(|(job, members, version)| Event::RingChanged {
                    ring: RingView {
                        job,
                        version,
                        members,
                        bottleneck_mbps: 1.0,
                        estimated_links: 0,
                    },
                    removed: Vec::new(),
                    added: Vec::new(),
                }),
            (job.clone(), proptest::collection::vec(node.clone(), 1..3))
                .prop_map(|(job, nodes)| Event::StandbysGranted { job, nodes }),
            (job, node, 0u32..3).prop_map(|(job, node, epoch)| {
                Event::DeltaAccepted(DeltaReceipt {
                    job,
                    node,
                    epoch,
                    step: 1,
                    delta_hash: [epoch as u8; 32],
                    claimed_loss: 0.5,
                    signature: Vec::new(),
                })
            }),
        ]
    }

    proptest::proptest! {
        /// A snapshot stands in for the records it covers: folding a prefix, serializing
        /// it, reading it back and applying the rest equals folding everything at once.
        #[test]
        fn snapshot_then_tail_equals_whole_fold(
            events in proptest::collection::vec(arb_event(), 0..60),
            cut in 0usize..60,
        ) {
            let records: Vec<Record> = events
                .into_iter()
                .enumerate()
                .map(|(i, e)| rec(i as u64 + 1, e))
                .collect();
            let cut = cut.min(records.len());
            let whole = fold(&records);
            let snap = serde_json::to_vec(&fold(&records[..cut])).unwrap();
            let mut resumed: LogFold = serde_json::from_slice(&snap).unwrap();
            resumed.apply(&records[cut..]);
            proptest::prop_assert_eq!(&resumed, &whole);
        }
    }

    /// `load` reads the snapshot and the tail; `snapshot` writes only every `every` events.
    #[tokio::test]
    async fn load_uses_the_snapshot_and_the_tail() {
        use crate::ports::memory::MemoryStateStore;
        let store = MemoryStateStore::new();
        let job = JobId(1);
        let spec = spec();
        store
            .append(
                Timestamp(1),
                Event::JobSubmitted {
                    job,
                    spec: Box::new(spec),
                    resumed: vec![],
                },
            )
            .await
            .unwrap();
        let mut known = None;
        assert_eq!(
            snapshot(&store, 2, &mut known).await.unwrap(),
            None,
            "1 event < every"
        );
        store
            .append(
                Timestamp(2),
                Event::Job {
                    job,
                    event: JobEvent::NodesReady { ring_version: 1 },
                },
            )
            .await
            .unwrap();
        assert_eq!(snapshot(&store, 2, &mut known).await.unwrap(), Some(2));
        assert_eq!(known, Some(2));
        assert_eq!(
            snapshot(&store, 2, &mut known).await.unwrap(),
            None,
            "nothing new"
        );
        store
            .append(
                Timestamp(3),
                Event::Job {
                    job,
                    event: JobEvent::ModelDistributed,
                },
            )
            .await
            .unwrap();
        let loaded = load(&store).await.unwrap();
        assert_eq!(loaded.last_seq, 3);
        assert!(matches!(
            loaded.jobs[&job].job.phase,
            JobPhase::Running { epoch: 0, .. }
        ));
        // A snapshot the reader cannot use is ignored, not trusted.
        store
            .put_snapshot(
                SNAPSHOT_KEY,
                Snapshot {
                    seq: 3,
                    state: b"{not json".to_vec(),
                },
            )
            .await
            .unwrap();
        assert_eq!(load(&store).await.unwrap(), loaded);
    }
}
