//! The harness example of the README, verbatim (keep the two in step), and the
//! missed-update case a new user found: a member that is hung while the ring changes.

use std::time::Duration;

use hanzod::testkit::{survivors, FaultScript, Harness, HarnessConfig};

#[tokio::test(start_paused = true)]
async fn my_chaos_test() {
    let mut h = Harness::start(HarnessConfig::new(64).seed_from_env_or(7)).await;
    let (job, _ring) = h.submit_and_form(h.job_spec("chaos", 32, 1_000)).await;
    let script = FaultScript::random(h.seed(), 64, 10, 300_000);
    h.run_script(&script).await.unwrap();
    tokio::time::sleep(Duration::from_secs(300)).await; // flapping nodes settle
    let ring = h
        .await_members_agree(job, Duration::from_secs(60))
        .await
        .unwrap();
    let nodes = h.orch.nodes().await.unwrap();
    assert!(ring
        .members
        .iter()
        .all(|m| nodes.iter().any(|n| n.id == *m && n.alive)));
}

#[tokio::test(start_paused = true)]
async fn member_hung_during_a_ring_change_converges_after_it_resumes() {
    let h = Harness::start(
        HarnessConfig::new(6)
            .seed_from_env_or(11)
            .auto_deltas(false),
    )
    .await;
    let (job, v1) = h.submit_and_form(h.job_spec("resync", 6, 10)).await;
    let (a, b) = (
        h.index_of(&v1.members[0]).unwrap(),
        h.index_of(&v1.members[3]).unwrap(),
    );
    h.crash(b);
    tokio::time::sleep(Duration::from_secs(15)).await;
    // A hangs (drops what it is sent) while the ring drops B, and resumes before its own
    // timeout: it is still a member, but missed version 2.
    h.hang(a);
    let v2 = h
        .await_ring_version(
            job,
            2,
            &survivors(&v1, &[v1.members[3]]),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    h.resume(a);
    assert_ne!(h.status(a).ring.as_ref().map(|r| r.version), Some(2));
    // The ring actor resends the current ring every `core.ring.resync_ms`: A converges.
    let agreed = h
        .await_members_agree(job, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(agreed, v2);
}
