//! Supervision: failed actors are rebuilt from the event log with nothing lost.

use std::sync::Arc;
use std::time::Duration;

use hanzod::core::events::{Event, FailureKind};
use hanzod::core::job::JobPhase;
use hanzod::core::orchestrator::ActorFault;
use hanzod::core::ports::memory::MemoryStateStore;
use hanzod::core::ports::StateStore;
use hanzod::testkit::{survivors, Harness, HarnessConfig};

const MIN: Duration = Duration::from_secs(60);

fn quiet(n: usize, seed: u64) -> HarnessConfig {
    HarnessConfig::new(n)
        .seed_from_env_or(seed)
        .auto_deltas(false)
}

#[tokio::test(start_paused = true)]
async fn node_actor_panic_is_a_node_failure_and_its_ring_recovers() {
    let h = Harness::start(quiet(6, 11)).await;
    let (job, v1) = h.submit_and_form(h.job_spec("panic-node", 6, 10)).await;
    let victim = v1.members[3];
    assert!(h
        .orch
        .inject(ActorFault::PanicNodeActor(victim))
        .await
        .unwrap());
    let survivors = survivors(&v1, &[victim]);
    // Recovery within the coalescing window, long before any heartbeat timeout.
    let v2 = h
        .await_ring_version(job, 2, &survivors, Duration::from_secs(2))
        .await
        .unwrap();
    h.await_members_agree(job, MIN).await.unwrap();
    let failures: Vec<_> = h
        .records()
        .await
        .into_iter()
        .filter_map(|r| match r.event {
            Event::NodeFailed { node, kind } => Some((node, kind)),
            _ => None,
        })
        .collect();
    assert_eq!(failures, vec![(victim, FailureKind::ActorCrashed)]);
    // The rebuilt node actor waits for the node to register again: its next heartbeat is
    // refused, it re-registers, and it is alive (idle) again — not back in the ring.
    let i = h.index_of(&victim).unwrap();
    h.wait_for("victim re-registered", MIN, || async {
        (h.status(i).registrations >= 2).then_some(())
    })
    .await
    .unwrap();
    let nodes = h.orch.nodes().await.unwrap();
    let n = nodes.iter().find(|n| n.id == victim).unwrap();
    assert!(n.alive && n.assigned.is_none(), "{n:?}");
    assert_eq!(h.orch.ring(job).await.unwrap().unwrap(), v2);
}

#[tokio::test(start_paused = true)]
async fn ring_actor_killed_mid_job_is_rebuilt_with_the_same_state() {
    let h = Harness::start(HarnessConfig::new(8).seed_from_env_or(12)).await;
    let (job, _) = h.submit_and_form(h.job_spec("panic-ring", 7, 50)).await;
    let victim = h.orch.ring(job).await.unwrap().unwrap().members[0];
    h.crash(h.index_of(&victim).unwrap());
    let v2 = h
        .await_ring(job, MIN, "ring v2", |r| r.version == 2)
        .await
        .unwrap();
    h.await_phase(
        job,
        MIN,
        "epoch 1",
        |p| matches!(p, JobPhase::Running { epoch, .. } if *epoch >= 1),
    )
    .await
    .unwrap();
    let before = h.orch.job(job).await.unwrap();
    let restarted = h
        .panic_and_await_restart(ActorFault::PanicRingActor(job))
        .await
        .unwrap();
    assert_eq!(restarted, format!("ring {job}"));
    // Same ring, same version: nothing re-decided, nothing lost.
    assert_eq!(h.orch.ring(job).await.unwrap().unwrap(), v2);
    let after = h.orch.job(job).await.unwrap();
    assert_eq!(
        after.checkpoints[..before.checkpoints.len()],
        before.checkpoints[..]
    );
    // And it still works: the next failure is repaired by the rebuilt actor as version 3.
    let next = v2.members[1];
    h.crash(h.index_of(&next).unwrap());
    let v3 = h
        .await_ring(job, MIN, "ring v3", |r| r.version == 3)
        .await
        .unwrap();
    assert!(!v3.members.contains(&next));
    h.await_members_agree(job, MIN).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn ring_actor_killed_during_recovery_owes_the_recovery_after_rebuild() {
    let h = Harness::start(quiet(5, 13)).await;
    let (job, v1) = h
        .submit_and_form(h.job_spec("panic-mid-recovery", 5, 10))
        .await;
    let victim = v1.members[1];
    // The failure is recorded, then the ring actor dies inside the coalescing window,
    // before it reconfigures. The rebuilt actor finds the failure in the log.
    assert!(h
        .orch
        .inject(ActorFault::PanicNodeActor(victim))
        .await
        .unwrap());
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(h
        .orch
        .inject(ActorFault::PanicRingActor(job))
        .await
        .unwrap());
    let survivors = survivors(&v1, &[victim]);
    h.await_ring_version(job, 2, &survivors, MIN).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn job_actor_killed_mid_epoch_resumes_and_publishes_every_epoch() {
    let h = Harness::start(HarnessConfig::new(6).seed_from_env_or(14)).await;
    let job = h
        .orch
        .submit_job(h.job_spec("panic-job", 6, 4))
        .await
        .unwrap();
    h.await_phase(job, MIN, "epoch 1", |p| {
        matches!(p, JobPhase::Running { epoch: 1, .. })
    })
    .await
    .unwrap();
    // Let some epoch-1 deltas be accepted, then kill the job actor.
    h.wait_for("a delta in epoch 1", MIN, || async {
        let v = h.orch.job(job).await.ok()?;
        (v.deltas_this_epoch > 0).then_some(())
    })
    .await
    .unwrap();
    let accepted = h.orch.job(job).await.unwrap().deltas_this_epoch;
    assert!(h.orch.inject(ActorFault::PanicJobActor(job)).await.unwrap());
    let view = h
        .wait_for("job actor back", MIN, || async {
            h.orch.job(job).await.ok()
        })
        .await
        .unwrap();
    assert!(
        view.deltas_this_epoch >= accepted,
        "accepted deltas lost in the rebuild"
    );
    let phase = h.await_end(job, 10 * MIN).await.unwrap();
    assert!(
        matches!(phase, JobPhase::Published { epochs: 4, .. }),
        "{phase:?}"
    );
    let published = h.sink.checkpoints(job);
    assert_eq!(
        published.iter().map(|c| c.0).collect::<Vec<_>>(),
        vec![0, 1, 2, 3]
    );
    assert_eq!(h.orch.job(job).await.unwrap().checkpoints.len(), 4);
}

#[tokio::test(start_paused = true)]
async fn a_new_orchestrator_on_the_same_log_resumes_the_job() {
    let store = Arc::new(MemoryStateStore::new());
    let first = Harness::start_on(HarnessConfig::new(4).seed_from_env_or(15), store.clone()).await;
    let job = first
        .orch
        .submit_job(first.job_spec("failover", 4, 3))
        .await
        .unwrap();
    first
        .await_phase(job, MIN, "epoch 1", |p| {
            matches!(p, JobPhase::Running { epoch: 1, .. })
        })
        .await
        .unwrap();
    let ring = first.orch.ring(job).await.unwrap().unwrap();
    first.orch.shutdown().await;
    drop(first);
    // A standby starts on the same log; the nodes (same seed, same keys) reconnect.
    let last_at = store.read_after(0).await.unwrap().last().unwrap().at;
    let second = Harness::start_on(HarnessConfig::new(4).seed_from_env_or(15), store).await;
    assert!(second.orch.clock().now() > last_at, "time ran backwards");
    let view = second.orch.job(job).await.unwrap();
    assert!(
        matches!(view.phase, JobPhase::Running { epoch: 1, .. }),
        "{:?}",
        view.phase
    );
    assert_eq!(view.ring.as_ref().unwrap().version, ring.version);
    let phase = second.await_end(job, 10 * MIN).await.unwrap();
    assert!(
        matches!(phase, JobPhase::Published { epochs: 3, .. }),
        "{phase:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn two_orchestrators_in_one_process_do_not_interfere() {
    let a = Harness::start(quiet(3, 16)).await;
    // Distinct seeds (distinct node keys) even when HANZOD_SEED overrides both.
    let mut cb = quiet(5, 17);
    cb.seed = a.seed().wrapping_add(1);
    let b = Harness::start(cb).await;
    let ja = a.orch.submit_job(a.job_spec("a", 3, 5)).await.unwrap();
    let jb = b.orch.submit_job(b.job_spec("b", 5, 5)).await.unwrap();
    assert_eq!(ja, jb, "each orchestrator numbers its own jobs");
    let ra = a
        .await_ring(ja, MIN, "ring a", |r| r.version == 1)
        .await
        .unwrap();
    let rb = b
        .await_ring(jb, MIN, "ring b", |r| r.version == 1)
        .await
        .unwrap();
    assert_eq!(ra.members.len(), 3);
    assert_eq!(rb.members.len(), 5);
    assert!(ra.members.iter().all(|m| !rb.members.contains(m)));
    a.crash(0);
    a.await_node_failed(0, MIN).await.unwrap();
    assert!(b.orch.nodes().await.unwrap().iter().all(|n| n.alive));
    assert_eq!(b.orch.ring(jb).await.unwrap().unwrap(), rb);
}

#[tokio::test(start_paused = true)]
async fn every_subsystem_panics_mid_job_and_the_job_still_publishes_every_epoch() {
    use hanzod::core::orchestrator::Subsystem;
    let h = Harness::start(HarnessConfig::new(6).seed_from_env_or(18)).await;
    let (job, v1) = h
        .submit_and_form(h.job_spec("panic-subsystems", 6, 6))
        .await;
    for (epoch, which) in [
        (1, Subsystem::Registry),
        (2, Subsystem::Scheduler),
        (3, Subsystem::Jobs),
    ] {
        h.await_phase(
            job,
            10 * MIN,
            "next epoch",
            |p| matches!(p, JobPhase::Running { epoch: e, .. } if *e == epoch),
        )
        .await
        .unwrap();
        let what = h
            .panic_and_await_restart(ActorFault::PanicSubsystem(which))
            .await
            .unwrap();
        assert_eq!(what, format!("{which:?}").to_lowercase());
    }
    let phase = h.await_end(job, 10 * MIN).await.unwrap();
    assert!(
        matches!(phase, JobPhase::Published { epochs: 6, .. }),
        "{phase:?}"
    );
    assert_eq!(h.sink.checkpoints(job).len(), 6);
    // Rebuilt registries did not declare live nodes failed: the ring never changed.
    assert_eq!(
        h.orch.job(job).await.unwrap().ring.unwrap().version,
        v1.version
    );
    assert!(h.orch.nodes().await.unwrap().iter().all(|n| n.alive));
}

#[tokio::test(start_paused = true)]
async fn a_state_store_outage_during_faults_loses_nothing_and_stops_nothing() {
    use hanzod::core::orchestrator::Subsystem;
    let h = Harness::start(HarnessConfig::new(6).seed_from_env_or(19)).await;
    let (job, v1) = h.submit_and_form(h.job_spec("outage", 5, 3)).await;
    // The store goes away; meanwhile a ring member dies and the scheduler is rebuilt
    // (its rebuild cannot read the log until the store is back).
    h.store.set_available(false);
    let victim = v1.members[2];
    h.disconnect(h.index_of(&victim).unwrap());
    assert!(h
        .orch
        .inject(ActorFault::PanicSubsystem(Subsystem::Scheduler))
        .await
        .unwrap());
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert!(h.orch.is_running(), "an outage stopped the orchestrator");
    h.store.set_available(true);
    // The repair that could not be recorded is recorded now, with a standby.
    let v2 = h
        .await_ring(job, MIN, "ring without the victim", |r| {
            r.version >= 2 && !r.members.contains(&victim)
        })
        .await
        .unwrap();
    assert_eq!(v2.members.len(), 5);
    let phase = h.await_end(job, 10 * MIN).await.unwrap();
    assert!(
        matches!(phase, JobPhase::Published { epochs: 3, .. }),
        "{phase:?}"
    );
    assert!(h.orch.is_running());
}
