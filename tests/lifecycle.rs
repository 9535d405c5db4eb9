//! Jobs from submission to Published or Failed, and admission errors, through the handle.

use std::time::Duration;

use hanzod::core::actor::job::JobRequestError;
use hanzod::core::actor::registry::RegisterError;
use hanzod::core::job::{FailReason, JobPhase};
use hanzod::core::node::{Heartbeat, HeartbeatError};
use hanzod::core::ports::DeltaReceipt;
use hanzod::core::types::{GymWei, NodeId, NodeInfo};
use hanzod::testkit::{Harness, HarnessConfig};
use hanzod::OrchestratorError;

const MIN: Duration = Duration::from_secs(60);

fn assert_deadline_passed(phase: &JobPhase) {
    assert!(
        matches!(
            phase,
            JobPhase::Failed {
                reason: FailReason::DeadlinePassed,
                ..
            }
        ),
        "{phase:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn job_runs_every_epoch_to_published() {
    let h = Harness::start(HarnessConfig::new(5).seed_from_env_or(21)).await;
    let job = h
        .orch
        .submit_job(h.job_spec("five-epochs", 5, 5))
        .await
        .unwrap();
    let mut notices = h.orch.subscribe();
    let phase = h.await_end(job, 10 * MIN).await.unwrap();
    let JobPhase::Published { epochs, checkpoint } = phase else {
        panic!("{phase:?}")
    };
    assert_eq!(epochs, 5);
    let published = h.sink.checkpoints(job);
    assert_eq!(published.len(), 5);
    // Every epoch merged all five members' deltas (no deadline cut one short).
    assert!(
        published.iter().all(|(_, _, deltas)| *deltas == 5),
        "{published:?}"
    );
    assert_eq!(checkpoint, published[4].1);
    // The loop of DESIGN §5: Running(e) → Aggregating(e) → Running(e+1) … → Published.
    let mut phases = vec![];
    while let Ok(n) = notices.try_recv() {
        if let hanzod::core::actor::Notice::JobPhase { phase, .. } = n {
            phases.push(phase.name());
        }
    }
    let tail: Vec<&str> = phases.iter().rev().take(3).rev().copied().collect();
    assert_eq!(tail, ["Running", "Aggregating", "Published"]);
    // The nodes are released.
    let nodes = h.orch.nodes().await.unwrap();
    assert!(nodes.iter().all(|n| n.assigned.is_none()));
    // Every member was assigned every epoch, each from the checkpoint of the one before
    // (epoch 0 from the initial weights).
    for i in 0..5 {
        let mut got = h.status(i).assignments;
        got.dedup();
        let want: Vec<_> = (0..5u32)
            .map(|e| {
                let base = e.checked_sub(1).map(|p| published[p as usize].1.clone());
                (job, e, base)
            })
            .collect();
        assert_eq!(got, want, "node {i}");
    }
}

#[tokio::test(start_paused = true)]
async fn an_assignment_is_resent_until_the_member_delivers() {
    let mut cfg = HarnessConfig::new(3)
        .seed_from_env_or(23)
        .auto_deltas(false);
    cfg.core.ring.resync_ms = 10_000;
    let h = Harness::start(cfg).await;
    let mut spec = h.job_spec("resend", 3, 1);
    spec.epoch_deadline_ms = 600_000;
    let (job, _) = h.submit_and_form(spec).await;
    let count = |i: usize| {
        h.status(i)
            .assignments
            .iter()
            .filter(|(j, e, base)| *j == job && *e == 0 && base.is_none())
            .count()
    };
    // Nobody delivered: every member is reminded every resync interval.
    tokio::time::sleep(Duration::from_secs(35)).await;
    for i in 0..3 {
        assert!(count(i) >= 3, "node {i}: {}", count(i));
    }
    // Node 0 delivers: it is not reminded again; the others still are.
    h.orch
        .submit_delta(DeltaReceipt {
            job,
            node: h.node_id(0),
            epoch: 0,
            step: 0,
            delta_hash: [9; 32],
            claimed_loss: 1.0,
            signature: Vec::new(),
        })
        .await
        .unwrap();
    let before = (count(0), count(1));
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(
        count(0),
        before.0,
        "a member that delivered is not reminded"
    );
    assert!(count(1) >= before.1 + 2, "{} → {}", before.1, count(1));
}

#[tokio::test(start_paused = true)]
async fn epoch_deadline_completes_an_epoch_without_the_silent_node() {
    let mut cfg = HarnessConfig::new(3).seed_from_env_or(22);
    cfg.core.heartbeat.timeout_ms = 3_600_000; // the hung node is not failed in this test
    cfg.core.heartbeat.replay_window_ms = 3_600_000;
    let h = Harness::start(cfg).await;
    let mut spec = h.job_spec("deadline", 3, 2);
    spec.epoch_deadline_ms = 60_000;
    let (job, _) = h.submit_and_form(spec).await;
    h.hang(1);
    h.await_end(job, 10 * MIN).await.unwrap();
    let published = h.sink.checkpoints(job);
    assert!(published.iter().all(|(_, _, d)| *d == 2), "{published:?}");
}

#[tokio::test(start_paused = true)]
async fn job_without_enough_nodes_fails_at_its_pending_deadline() {
    let h = Harness::start(HarnessConfig::new(2).seed_from_env_or(23)).await;
    let mut spec = h.job_spec("too-big", 4, 1);
    spec.min_nodes = 4;
    spec.pending_deadline_ms = 90_000;
    let job = h.orch.submit_job(spec).await.unwrap();
    tokio::time::sleep(Duration::from_secs(89)).await;
    assert!(matches!(
        h.orch.job(job).await.unwrap().phase,
        JobPhase::Pending { .. }
    ));
    let phase = h.await_end(job, MIN).await.unwrap();
    // The reason names the shortage: 4 needed, 2 alive (both eligible).
    let JobPhase::Failed {
        reason: FailReason::NotPlaced(s),
        ..
    } = &phase
    else {
        panic!("{phase:?}")
    };
    assert_eq!((s.needed, s.registered, s.alive, s.eligible), (4, 2, 2, 2));
    assert_eq!(
        phase_reason(&phase),
        "deadline passed while pending: needs 4 nodes with at least 16.0 GiB of VRAM; 2 registered, \
         2 alive, 2 eligible and free"
    );
}

fn phase_reason(phase: &JobPhase) -> String {
    match phase {
        JobPhase::Failed { reason, .. } => reason.to_string(),
        other => panic!("not failed: {other:?}"),
    }
}

/// Regression (a job no node could serve failed as a bare "deadline passed"): the reason
/// says the nodes' VRAM is below the job's minimum.
#[tokio::test(start_paused = true)]
async fn a_job_that_fails_pending_names_the_vram_minimum_no_node_meets() {
    let h = Harness::start(HarnessConfig::new(3).seed_from_env_or(29)).await;
    let mut spec = h.job_spec("too-hungry", 2, 1);
    spec.min_vram_bytes = 1 << 50;
    spec.pending_deadline_ms = 30_000;
    let job = h.orch.submit_job(spec).await.unwrap();
    let phase = h.await_end(job, MIN).await.unwrap();
    let reason = phase_reason(&phase);
    assert!(
        reason.contains("0 eligible and free (3: VRAM below the job's minimum)"),
        "{reason}"
    );
}

#[tokio::test(start_paused = true)]
async fn ring_below_min_nodes_fails_the_job_and_frees_its_nodes() {
    let h = Harness::start(
        HarnessConfig::new(3)
            .seed_from_env_or(24)
            .auto_deltas(false),
    )
    .await;
    let mut spec = h.job_spec("fragile", 3, 10);
    spec.min_nodes = 3;
    let (job, _) = h.submit_and_form(spec).await;
    h.crash(0);
    let phase = h.await_end(job, 2 * MIN).await.unwrap();
    assert!(
        matches!(
            phase,
            JobPhase::Failed {
                reason: FailReason::TooFewNodes { alive: 2, min: 3 },
                ..
            }
        ),
        "{phase:?}"
    );
    let nodes = h.orch.nodes().await.unwrap();
    assert!(nodes.iter().all(|n| n.assigned.is_none()));
}

#[tokio::test(start_paused = true)]
async fn cancel_ends_the_job_and_later_requests_get_typed_errors() {
    let h = Harness::start(
        HarnessConfig::new(3)
            .seed_from_env_or(25)
            .auto_deltas(false),
    )
    .await;
    let (job, _) = h.submit_and_form(h.job_spec("cancel-me", 3, 10)).await;
    h.orch.cancel_job(job).await.unwrap();
    let phase = h.await_end(job, MIN).await.unwrap();
    assert!(matches!(
        phase,
        JobPhase::Failed {
            reason: FailReason::Cancelled,
            ..
        }
    ));
    let err = h.orch.cancel_job(job).await.unwrap_err();
    assert_eq!(err, OrchestratorError::Job(JobRequestError::Ended(job)));
    let err = h
        .orch
        .job(hanzod::core::types::JobId(99))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        OrchestratorError::Job(JobRequestError::NotFound(hanzod::core::types::JobId(99)))
    );
}

#[tokio::test(start_paused = true)]
async fn deltas_are_checked_against_epoch_membership_and_duplicates() {
    let h = Harness::start(
        HarnessConfig::new(3)
            .seed_from_env_or(26)
            .auto_deltas(false),
    )
    .await;
    let (job, ring) = h.submit_and_form(h.job_spec("deltas", 2, 3)).await;
    h.await_phase(job, MIN, "running", |p| {
        matches!(p, JobPhase::Running { .. })
    })
    .await
    .unwrap();
    let outsider = h
        .node_ids()
        .into_iter()
        .find(|n| !ring.members.contains(n))
        .unwrap();
    let receipt = |node: NodeId, epoch: u32, b: u8| DeltaReceipt {
        job,
        node,
        epoch,
        step: 1,
        delta_hash: [b; 32],
        claimed_loss: 1.0,
        signature: Vec::new(),
    };
    let e = h
        .orch
        .submit_delta(receipt(outsider, 0, 1))
        .await
        .unwrap_err();
    assert_eq!(
        e,
        OrchestratorError::Job(JobRequestError::NotMember(outsider))
    );
    let e = h
        .orch
        .submit_delta(receipt(ring.members[0], 1, 1))
        .await
        .unwrap_err();
    assert_eq!(
        e,
        OrchestratorError::Job(JobRequestError::WrongEpoch {
            expected: 0,
            got: 1
        })
    );
    h.orch
        .submit_delta(receipt(ring.members[0], 0, 1))
        .await
        .unwrap();
    h.orch
        .submit_delta(receipt(ring.members[0], 0, 1))
        .await
        .unwrap(); // retried upload
    let e = h
        .orch
        .submit_delta(receipt(ring.members[0], 0, 2))
        .await
        .unwrap_err();
    assert_eq!(
        e,
        OrchestratorError::Job(JobRequestError::Conflicting(ring.members[0]))
    );
    assert_eq!(h.orch.job(job).await.unwrap().deltas_this_epoch, 1);
    h.orch
        .submit_delta(receipt(ring.members[1], 0, 3))
        .await
        .unwrap();
    h.await_phase(job, MIN, "epoch 1", |p| {
        matches!(p, JobPhase::Running { epoch: 1, .. })
    })
    .await
    .unwrap();
}

#[tokio::test(start_paused = true)]
async fn admission_and_heartbeat_errors_are_typed() {
    let h = Harness::start(HarnessConfig::new(1).seed_from_env_or(27)).await;
    let poor = NodeInfo {
        id: NodeId([1; 32]),
        region: "eu-west".into(),
        ..Default::default()
    };
    h.chain.set_stake(poor.id, GymWei::gym(9_999));
    let e = h.orch.register_node(poor.clone()).await.unwrap_err();
    assert_eq!(
        e,
        OrchestratorError::Register(RegisterError::InsufficientStake {
            have: GymWei::gym(9_999),
            need: GymWei::gym(10_000)
        })
    );
    let unbound = NodeInfo {
        id: NodeId([2; 32]),
        ..Default::default()
    };
    assert_eq!(
        h.orch.register_node(unbound).await.unwrap_err(),
        OrchestratorError::Register(RegisterError::Unbound)
    );
    let mut bad = poor.clone();
    h.chain.set_stake(bad.id, GymWei::gym(20_000));
    bad.link.up_mbps = f32::NAN;
    assert!(matches!(
        h.orch.register_node(bad).await.unwrap_err(),
        OrchestratorError::Register(RegisterError::Invalid {
            field: "link.up_mbps",
            ..
        })
    ));
    let now = h.orch.clock().now();
    let hb = |seq, ts| Heartbeat {
        node: poor.id,
        seq,
        timestamp: ts,
        gpu_utilization: 0.5,
        memory_used: 0,
        current_step: 0,
    };
    assert_eq!(
        h.orch.heartbeat(hb(1, now)).await.unwrap_err(),
        OrchestratorError::Heartbeat(HeartbeatError::UnknownNode)
    );
    h.orch.register_node(poor.clone()).await.unwrap();
    h.orch.heartbeat(hb(1, now)).await.unwrap();
    assert_eq!(
        h.orch.heartbeat(hb(1, now)).await.unwrap_err(),
        OrchestratorError::Heartbeat(HeartbeatError::StaleSequence { last: 1, got: 1 })
    );
    assert!(matches!(
        h.orch
            .heartbeat(hb(2, now.plus_ms(31_000)))
            .await
            .unwrap_err(),
        OrchestratorError::Heartbeat(HeartbeatError::OutsideWindow { .. })
    ));
    // Nothing refused was recorded: exactly the one admission of the poor node plus the harness node.
    let admitted = h
        .records()
        .await
        .iter()
        .filter(|r| matches!(r.event, hanzod::core::events::Event::NodeRegistered { .. }))
        .count();
    assert_eq!(admitted, 2);
}

#[tokio::test(start_paused = true)]
async fn invalid_job_spec_is_refused_with_the_field() {
    let h = Harness::start(HarnessConfig::new(1).seed_from_env_or(28)).await;
    let mut spec = h.job_spec("bad", 4, 1);
    spec.min_nodes = 5;
    let e = h.orch.submit_job(spec).await.unwrap_err();
    assert!(e.to_string().contains("max"), "{e}");
    assert!(h.orch.jobs().await.unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn an_epoch_without_any_delta_fails_the_job_at_its_deadline() {
    let mut cfg = HarnessConfig::new(3).seed_from_env_or(24);
    cfg.core.heartbeat.timeout_ms = 3_600_000; // hung nodes stay alive: only the deadline acts
    cfg.core.heartbeat.replay_window_ms = 3_600_000;
    let h = Harness::start(cfg).await;
    let mut spec = h.job_spec("idle", 3, 2);
    spec.epoch_deadline_ms = 60_000;
    let (job, _) = h.submit_and_form(spec).await;
    for i in 0..3 {
        h.hang(i);
    }
    let phase = h.await_end(job, 10 * MIN).await.unwrap();
    assert_deadline_passed(&phase);
    assert!(
        h.sink.checkpoints(job).is_empty(),
        "no empty checkpoint is published"
    );
}

/// Reads racing the end of a job get its final state, never "reply dropped".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_racing_a_cancel_see_the_final_state() {
    let h = Harness::start(HarnessConfig::new(2).seed_from_env_or(25)).await;
    for round in 0..20 {
        let mut spec = h.job_spec(&format!("race-{round}"), 4, 1);
        spec.min_nodes = 4; // never placed: it pends until cancelled
        let job = h.orch.submit_job(spec).await.unwrap();
        let mut reads = tokio::task::JoinSet::new();
        for _ in 0..20 {
            let orch = h.orch.clone();
            reads.spawn(async move { (orch.job(job).await, orch.ring(job).await) });
        }
        h.orch.cancel_job(job).await.unwrap();
        while let Some(r) = reads.join_next().await {
            let (view, ring) = r.unwrap();
            assert!(view.is_ok(), "round {round}: {view:?}");
            assert!(ring.is_ok(), "round {round}: {ring:?}");
        }
        let again = h.orch.cancel_job(job).await.unwrap_err();
        assert!(
            matches!(again, OrchestratorError::Job(JobRequestError::Ended(_))),
            "{again:?}"
        );
    }
}

/// A checkpoint sink that takes `delay` for every epoch of job `slow` (then publishes like
/// the harness's own sink), and publishes every other job's epochs at once.
#[derive(Debug)]
struct SlowSink {
    inner: std::sync::Arc<hanzod::core::ports::memory::MemoryCheckpointSink>,
    slow: hanzod::core::types::JobId,
    delay: Duration,
}

#[async_trait::async_trait]
impl hanzod::core::ports::CheckpointSink for SlowSink {
    async fn publish(
        &self,
        input: hanzod::core::ports::EpochInput<'_>,
    ) -> Result<hanzod::core::ports::PublishedEpoch, hanzod::core::ports::CheckpointError> {
        if input.job == self.slow {
            tokio::time::sleep(self.delay).await;
        }
        self.inner.publish(input).await
    }
}

/// Regression (the job actor awaited the sink inside its message handler): while a sink
/// takes 30 s over one job's epoch, that job's status is answered at once (it used to time
/// out after `call_timeout_ms`) and another job's epochs run to Published meanwhile.
#[tokio::test(start_paused = true)]
async fn a_slow_publication_blocks_neither_its_job_status_nor_other_jobs() {
    let sink = std::sync::Arc::new(hanzod::core::ports::memory::MemoryCheckpointSink::new());
    let slow = hanzod::core::types::JobId(1);
    let delay = Duration::from_secs(30);
    let h = Harness::start(HarnessConfig::new(8).seed_from_env_or(71).checkpoint_sink(
        std::sync::Arc::new(SlowSink {
            inner: sink.clone(),
            slow,
            delay,
        }),
    ))
    .await;
    let a = h.orch.submit_job(h.job_spec("slow", 4, 1)).await.unwrap();
    assert_eq!(a, slow, "the first job gets id 1");
    let b = h.orch.submit_job(h.job_spec("fast", 4, 3)).await.unwrap();
    h.await_phase(a, 2 * MIN, "job 1 aggregating", |p| {
        matches!(p, JobPhase::Aggregating { .. })
    })
    .await
    .unwrap();
    let aggregating_since = tokio::time::Instant::now();

    // The slow job's own status: answered without waiting for its sink.
    let asked = tokio::time::Instant::now();
    let view = h
        .orch
        .job(a)
        .await
        .expect("job status while its sink works");
    assert!(
        matches!(view.phase, JobPhase::Aggregating { .. }),
        "{:?}",
        view.phase
    );
    assert!(
        asked.elapsed() < Duration::from_secs(1),
        "{:?}",
        asked.elapsed()
    );

    // The other job publishes all its epochs while the first sink call still runs.
    let end = h.await_end(b, 2 * MIN).await.unwrap();
    assert!(
        matches!(end, JobPhase::Published { epochs: 3, .. }),
        "{end:?}"
    );
    assert!(
        aggregating_since.elapsed() < delay,
        "job 2 ended {:?} after job 1 began aggregating",
        aggregating_since.elapsed()
    );
    let still = h.orch.job(a).await.unwrap().phase;
    assert!(matches!(still, JobPhase::Aggregating { .. }), "{still:?}");

    // And the slow publication lands when the sink returns.
    let end = h.await_end(a, 2 * MIN).await.unwrap();
    assert!(
        matches!(end, JobPhase::Published { epochs: 1, .. }),
        "{end:?}"
    );
    assert_eq!(sink.checkpoints(a).len(), 1);
}

/// A sink that panics on every call.
#[derive(Debug)]
struct PanickingSink;

#[async_trait::async_trait]
impl hanzod::core::ports::CheckpointSink for PanickingSink {
    async fn publish(
        &self,
        _input: hanzod::core::ports::EpochInput<'_>,
    ) -> Result<hanzod::core::ports::PublishedEpoch, hanzod::core::ports::CheckpointError> {
        panic!("injected fault: the sink panics")
    }
}

/// Regression (a sink that panicked left its job in Aggregating for good): the job fails,
/// and says the sink panicked.
#[tokio::test(start_paused = true)]
async fn a_sink_that_panics_fails_the_publication_and_says_so() {
    let h = Harness::start(
        HarnessConfig::new(4)
            .seed_from_env_or(73)
            .checkpoint_sink(std::sync::Arc::new(PanickingSink)),
    )
    .await;
    let job = h.orch.submit_job(h.job_spec("doomed", 4, 2)).await.unwrap();
    let phase = h.await_end(job, 10 * MIN).await.unwrap();
    let JobPhase::Failed {
        reason: FailReason::PublicationFailed(why),
        phase: from,
        ..
    } = &phase
    else {
        panic!("{phase:?}")
    };
    assert_eq!(from, "Aggregating");
    assert!(why.contains("panicked"), "{why}");
}

/// Regression (found by a new user: two nodes killed while epoch 0 was being aggregated
/// failed the job at once, and the epoch was still published and paid; the failed job showed
/// no checkpoint): the failure waits for the publication, which the job records first.
#[tokio::test(start_paused = true)]
async fn a_ring_below_min_nodes_during_publication_fails_the_job_after_recording_the_epoch() {
    let sink = std::sync::Arc::new(hanzod::core::ports::memory::MemoryCheckpointSink::new());
    let h = Harness::start(HarnessConfig::new(4).seed_from_env_or(74).checkpoint_sink(
        std::sync::Arc::new(SlowSink {
            inner: sink.clone(),
            slow: hanzod::core::types::JobId(1),
            delay: Duration::from_secs(30),
        }),
    ))
    .await;
    let mut spec = h.job_spec("doomed-later", 4, 3);
    spec.min_nodes = 3;
    let job = h.orch.submit_job(spec).await.unwrap();
    assert_eq!(job.0, 1, "the slow sink slows job 1");
    h.await_phase(job, 2 * MIN, "aggregating", |p| {
        matches!(p, JobPhase::Aggregating { epoch: 0, .. })
    })
    .await
    .unwrap();
    let ring = h.orch.ring(job).await.unwrap().expect("a ring");
    for id in &ring.members[..2] {
        h.crash(h.index_of(id).expect("a harness node"));
    }
    let phase = h.await_end(job, 10 * MIN).await.unwrap();
    assert!(
        matches!(
            phase,
            JobPhase::Failed {
                reason: FailReason::TooFewNodes { .. },
                ..
            }
        ),
        "{phase:?}"
    );
    let view = h.orch.job(job).await.unwrap();
    assert_eq!(
        view.checkpoints.len(),
        1,
        "the epoch published while the ring failed is the job's"
    );
    assert_eq!(view.checkpoints[0], sink.checkpoints(job)[0].1);
}
