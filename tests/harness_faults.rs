//! Seeded fault-injection runs of the whole actor tree under paused tokio time.

use hanzod::core::ports::{Counter, Histogram};
use std::time::Duration;

use hanzod::core::job::JobPhase;
use hanzod::testkit::{survivors, Fault, FaultScript, Harness, HarnessConfig};

const MIN: Duration = Duration::from_secs(60);

#[tokio::test(start_paused = true)]
async fn ring_of_64_survives_one_then_three_crashes() {
    let h = Harness::start(HarnessConfig::new(64).seed_from_env_or(64)).await;
    let (job, v1) = h.submit_and_form(h.job_spec("crash-64", 64, 1_000)).await;
    assert_eq!(v1.members.len(), 64);
    h.await_members_agree(job, MIN).await.unwrap();

    // One crash: the ring drops it at the 30 s timeout.
    let victim = h.index_of(&v1.members[17]).unwrap();
    h.crash(victim);
    let left = survivors(&v1, &[v1.members[17]]);
    let v2 = h.await_ring_version(job, 2, &left, MIN).await.unwrap();
    let agreed = h.await_members_agree(job, MIN).await.unwrap();
    assert_eq!(agreed, v2);

    // Three crashes at once: one reconfiguration, one new version.
    let victims = [v2.members[0], v2.members[30], v2.members[62]];
    for v in &victims {
        h.crash(h.index_of(v).unwrap());
    }
    let left = survivors(&v2, &victims);
    let v3 = h.await_ring_version(job, 3, &left, MIN).await.unwrap();
    let agreed = h.await_members_agree(job, MIN).await.unwrap();
    assert_eq!(agreed, v3);
    assert_eq!(v3.members.len(), 60);
    // Survivors keep their relative order (Algorithm 2 splices, it does not rebuild).
    let pos: Vec<usize> = v3
        .members
        .iter()
        .map(|m| v2.members.iter().position(|x| x == m).unwrap())
        .collect();
    let rot = pos
        .iter()
        .position(|&p| p == *pos.iter().min().unwrap())
        .unwrap();
    let rotated: Vec<usize> = pos[rot..].iter().chain(&pos[..rot]).copied().collect();
    assert!(
        rotated.windows(2).all(|w| w[0] < w[1]),
        "order changed: {pos:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn hung_node_fails_at_thirty_seconds_and_not_before() {
    let h = Harness::start(HarnessConfig::new(3).seed_from_env_or(3).auto_deltas(false)).await;
    // Let a heartbeat land, then hang right after it.
    tokio::time::sleep(Duration::from_millis(10)).await;
    let before = h.status(1).heartbeats;
    assert!(before >= 1);
    h.hang(1);
    let t0 = tokio::time::Instant::now();
    let mut notices = h.orch.subscribe();
    tokio::time::sleep(Duration::from_millis(29_900)).await;
    let alive = h
        .orch
        .nodes()
        .await
        .unwrap()
        .iter()
        .find(|n| n.id == h.node_id(1))
        .unwrap()
        .alive;
    assert!(alive, "failed before the 30 s timeout");
    let failed_at = loop {
        match notices.recv().await.unwrap() {
            hanzod::core::actor::Notice::NodeFailed { node, .. } if node == h.node_id(1) => {
                break tokio::time::Instant::now()
            }
            _ => {}
        }
    };
    let after = failed_at.duration_since(t0);
    // The last heartbeat was at most 10 ms before t0.
    assert!(
        after >= Duration::from_millis(29_990) && after <= Duration::from_millis(30_000),
        "{after:?}"
    );
    assert!(
        h.orch
            .nodes()
            .await
            .unwrap()
            .iter()
            .filter(|n| n.alive)
            .count()
            == 2
    );
    assert_eq!(
        h.metrics
            .counter(Counter::NodeFailures, "heartbeat_timeout"),
        1
    );
    assert_eq!(
        h.metrics.counter(Counter::Heartbeats, "accepted"),
        h.status(0).heartbeats + h.status(1).heartbeats + h.status(2).heartbeats
    );
}

#[tokio::test(start_paused = true)]
async fn slow_heartbeats_within_timeout_keep_the_node_and_beyond_fail_it() {
    let h = Harness::start(HarnessConfig::new(2).seed_from_env_or(5).auto_deltas(false)).await;
    h.slow_heartbeats(0, 25_000);
    h.slow_heartbeats(1, 35_000);
    h.await_node_failed(1, 2 * MIN).await.unwrap();
    let nodes = h.orch.nodes().await.unwrap();
    assert!(nodes.iter().find(|n| n.id == h.node_id(0)).unwrap().alive);
}

#[tokio::test(start_paused = true)]
async fn flapping_node_fails_and_rejoins_each_cycle() {
    let h = Harness::start(HarnessConfig::new(2).seed_from_env_or(6).auto_deltas(false)).await;
    h.flap(0, 40_000, 20_000, 2);
    tokio::time::sleep(Duration::from_secs(200)).await;
    let s = h.status(0);
    // First registration plus one re-registration per cycle in which it was declared failed.
    assert_eq!(s.registrations, 3, "{s:?}");
    let failures = h
        .records()
        .await
        .iter()
        .filter(|r| matches!(&r.event, hanzod::core::events::Event::NodeFailed { node, .. } if *node == h.node_id(0)))
        .count();
    assert_eq!(failures, 2);
    assert!(h.orch.nodes().await.unwrap().iter().all(|n| n.alive));
}

#[tokio::test(start_paused = true)]
async fn duplicate_registration_keeps_one_node_state() {
    let h = Harness::start(HarnessConfig::new(4).seed_from_env_or(7).auto_deltas(false)).await;
    let (job, ring) = h.submit_and_form(h.job_spec("dup", 4, 10)).await;
    h.duplicate_registration(2);
    tokio::time::sleep(Duration::from_secs(45)).await;
    let nodes = h.orch.nodes().await.unwrap();
    assert_eq!(nodes.len(), 4);
    assert!(nodes.iter().all(|n| n.alive && n.assigned == Some(job)));
    assert_eq!(
        h.orch.ring(job).await.unwrap().unwrap(),
        ring,
        "no spurious reconfiguration"
    );
    assert_eq!(h.status(2).registrations, 2);
}

#[tokio::test(start_paused = true)]
async fn crashed_node_rejoins_as_standby_for_the_next_failure() {
    let mut h = Harness::start(HarnessConfig::new(6).seed_from_env_or(8).auto_deltas(false)).await;
    let (job, v1) = h.submit_and_form(h.job_spec("standby", 5, 10)).await;
    let spare = (0..6)
        .find(|i| !v1.members.contains(&h.node_id(*i)))
        .unwrap();
    let victim = h.index_of(&v1.members[2]).unwrap();
    h.crash(victim);
    // The idle node is inserted as a standby in the same reconfiguration.
    let v2 = h
        .await_ring(job, MIN, "ring v2", |r| r.version == 2)
        .await
        .unwrap();
    assert_eq!(v2.members.len(), 5);
    assert!(v2.members.contains(&h.node_id(spare)));
    assert!(!v2.members.contains(&h.node_id(victim)));
    h.rejoin(victim).await;
    let other = h.index_of(&v2.members[0]).unwrap();
    h.crash(other);
    let v3 = h
        .await_ring(job, MIN, "ring v3", |r| r.version == 3)
        .await
        .unwrap();
    assert!(
        v3.members.contains(&h.node_id(victim)),
        "rejoined node used as standby"
    );
    h.await_members_agree(job, MIN).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn seeded_random_faults_keep_the_invariants() {
    let seed = std::env::var("HANZOD_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2024);
    let script = FaultScript::random(seed, 24, 12, 240_000);
    assert_eq!(
        script,
        FaultScript::random(seed, 24, 12, 240_000),
        "same seed, same script"
    );
    let mut h = Harness::start(HarnessConfig::new(24).seed_from_env_or(seed)).await;
    let (job, _) = h.submit_and_form(h.job_spec("chaos", 16, 1_000)).await;
    let mut versions = vec![];
    let mut notices = h.orch.subscribe();
    h.run_script(&script).await.unwrap();
    // Every hung node is resumed by the script; let the last timeouts play out.
    tokio::time::sleep(Duration::from_secs(120)).await;
    while let Ok(n) = notices.try_recv() {
        if let hanzod::core::actor::Notice::RingChanged { ring, .. } = n {
            versions.push(ring.version);
        }
    }
    assert!(
        versions.windows(2).all(|w| w[0] < w[1]),
        "versions not increasing: {versions:?}"
    );
    let phase = h.orch.job(job).await.unwrap().phase;
    if !matches!(phase, JobPhase::Failed { .. }) {
        let ring = h.await_members_agree(job, MIN).await.unwrap();
        // No member of the final ring is a node the orchestrator considers dead.
        let nodes = h.orch.nodes().await.unwrap();
        for m in &ring.members {
            assert!(
                nodes.iter().any(|n| n.id == *m && n.alive),
                "dead member {m:?}"
            );
        }
    }
    let crashed: Vec<usize> = script
        .steps
        .iter()
        .filter_map(|(_, f)| match f {
            Fault::Crash(i) => Some(*i),
            _ => None,
        })
        .collect();
    for i in crashed {
        assert!(!h.status(i).running);
    }
}

/// Three sessions closing at once: detected from the closed sessions (not the 30 s
/// heartbeat timeout) and repaired on the leading edge — the first failure at once, the
/// others with it if the registry already knows them, else together when the coalescing
/// window closes — so at most two reconfigurations, the first without waiting for the
/// window.
#[tokio::test(start_paused = true)]
async fn simultaneous_disconnects_are_at_most_two_reconfigurations_detected_at_once() {
    let h = Harness::start(
        HarnessConfig::new(16)
            .seed_from_env_or(9)
            .auto_deltas(false),
    )
    .await;
    let (job, v1) = h.submit_and_form(h.job_spec("disconnect", 16, 10)).await;
    let victims = [v1.members[1], v1.members[7], v1.members[8]];
    let mut notices = h.orch.subscribe();
    let t0 = tokio::time::Instant::now();
    for v in &victims {
        h.disconnect(h.index_of(v).unwrap());
    }
    let mut want = survivors(&v1, &victims);
    want.sort();
    let last = h
        .await_ring(job, MIN, "the ring without the three", |r| {
            let mut have = r.members.clone();
            have.sort();
            r.version >= 2 && have == want
        })
        .await
        .unwrap();
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    assert!(
        last.version <= 3,
        "more than two reconfigurations: {last:?}"
    );
    let mut failures = vec![];
    let mut removed = vec![];
    while let Ok(n) = notices.try_recv() {
        match n {
            hanzod::core::actor::Notice::NodeFailed { node, kind, .. } => {
                failures.push((node, kind))
            }
            hanzod::core::actor::Notice::RingChanged {
                removed: gone,
                ring,
                ..
            } => {
                assert!(ring.version <= last.version, "{ring:?}");
                removed.extend(gone);
            }
            _ => {}
        }
    }
    removed.sort();
    let mut victims_sorted = victims.to_vec();
    victims_sorted.sort();
    assert_eq!(removed, victims_sorted, "each victim removed exactly once");
    assert_eq!(failures.len(), 3);
    assert_eq!(
        h.metrics.counter(Counter::NodeFailures, "session_closed"),
        3
    );
    let changes = h.metrics.counter(Counter::RingChanges, "reconfigured");
    assert_eq!(changes, last.version - 1);
    let repair = h.metrics.samples(Histogram::RingRepairSeconds);
    assert_eq!(repair.len() as u64, changes);
    // The leading edge does not wait for the window (200 ms); a second reconfiguration,
    // if any, waits at most the window more.
    assert!(repair[0] < 0.1, "{repair:?}");
    assert!(repair.iter().all(|r| *r < 0.3), "{repair:?}");
    assert!(failures
        .iter()
        .all(|(_, k)| *k == hanzod::core::events::FailureKind::SessionClosed));
    h.await_members_agree(job, MIN).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn probed_links_replace_estimates_and_steer_the_ring() {
    let h = Harness::start(
        HarnessConfig::new(4)
            .seed_from_env_or(10)
            .auto_deltas(false),
    )
    .await;
    let ids = h.node_ids();
    // Measure every link: slow everywhere except the cycle 0 → 2 → 1 → 3 → 0.
    let fast = [(0, 2), (2, 1), (1, 3), (3, 0)];
    for i in 0..4 {
        for j in 0..4 {
            if i != j {
                let mbps = if fast.contains(&(i, j)) { 900.0 } else { 10.0 };
                h.orch.report_link(ids[i], ids[j], mbps).await.unwrap();
            }
        }
    }
    let err = h
        .orch
        .report_link(ids[0], ids[1], f32::NAN)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("mbps"), "{err}");
    let (_, ring) = h.submit_and_form(h.job_spec("probed", 4, 10)).await;
    assert_eq!(ring.estimated_links, 0);
    assert_eq!(ring.bottleneck_mbps, 900.0);
    let start = ring.members.iter().position(|m| *m == ids[0]).unwrap();
    let order: Vec<_> = (0..4).map(|k| ring.members[(start + k) % 4]).collect();
    assert_eq!(order, [ids[0], ids[2], ids[1], ids[3]]);
}

#[tokio::test(start_paused = true)]
async fn the_close_of_an_old_session_does_not_fail_a_reregistered_node() {
    let h = Harness::start(
        HarnessConfig::new(2)
            .seed_from_env_or(12)
            .auto_deltas(false),
    )
    .await;
    let id = h.node_id(0);
    h.duplicate_registration(0);
    h.wait_for("second session", MIN, || async {
        (h.status(0).session == 2).then_some(())
    })
    .await
    .unwrap();
    // The transport reports the first stream's end after the node registered again.
    h.orch.session_closed(id, 1);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let alive = |nodes: Vec<hanzod::core::sched::NodeView>| {
        nodes.iter().find(|n| n.id == id).unwrap().alive
    };
    assert!(
        alive(h.orch.nodes().await.unwrap()),
        "stale close failed the node"
    );
    h.orch.session_closed(id, 2);
    h.await_node_failed(0, MIN).await.unwrap();
    assert_eq!(
        h.metrics.counter(Counter::NodeFailures, "session_closed"),
        1
    );
}
