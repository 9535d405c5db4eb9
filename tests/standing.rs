//! Penalties that bite (issue 19 item 5, DESIGN §3 "Standing"): a ring member's stake and
//! penalty are read again at each epoch boundary; a member slashed, or whose stake fell
//! below the minimum, leaves its ring there (a reconfiguration with a standby), gets no
//! more work, and is not placed in a new job. The embedded ledger is the chain here; the
//! EVM adapter's one-call read is checked against anvil by the ledger conformance suite.

use std::time::Duration;

use hanzod::core::events::Event;
use hanzod::core::job::JobPhase;
use hanzod::core::ports::Ledger;
use hanzod::core::types::{GymWei, NodeId, Timestamp};
use hanzod::testkit::{Harness, HarnessConfig};

const MIN: Duration = Duration::from_secs(60);

/// The epoch `phase` is running, if it is running one.
fn running(phase: &JobPhase) -> Option<u32> {
    match phase {
        JobPhase::Running { epoch, .. } => Some(*epoch),
        _ => None,
    }
}

/// Starts `nodes` nodes, a 4-node job of 6 epochs, and waits until epoch 0 runs.
async fn four_of(nodes: usize, seed: u64) -> (Harness, hanzod::core::types::JobId, Vec<NodeId>) {
    let h = Harness::start(HarnessConfig::new(nodes).seed_from_env_or(seed)).await;
    let (job, v1) = h.submit_and_form(h.job_spec("standing", 4, 6)).await;
    h.await_phase(job, MIN, "epoch 0", |p| running(p) == Some(0))
        .await
        .unwrap();
    (h, job, v1.members)
}

/// Waits until `job`'s ring no longer holds `node` and has `size` members; returns it.
async fn await_without(
    h: &Harness,
    job: hanzod::core::types::JobId,
    node: NodeId,
    size: usize,
) -> hanzod::core::types::RingView {
    h.await_ring(job, MIN, "ring without the member", |r| {
        !r.members.contains(&node) && r.members.len() == size
    })
    .await
    .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_slashed_member_leaves_its_ring_at_the_epoch_boundary_and_is_not_placed_again() {
    // One node more than the job: the one standby there is.
    let (h, job, members) = four_of(5, 31).await;
    let victim = members[1];
    let victim_index = h.index_of(&victim).unwrap();
    let admitted = h.orch.nodes().await.unwrap();
    let read_at_admission = admitted
        .iter()
        .find(|n| n.id == victim)
        .unwrap()
        .standing_read_at;
    // Slashed by another job (or orchestrator) while this epoch runs: 90 % of 50,000 GYM
    // leaves 5,000, under the 10,000 minimum, with a penalty.
    let receipt = h
        .chain
        .slash(&victim, 90, b"evidence from elsewhere")
        .await
        .unwrap();
    assert_eq!(receipt.stake_after, GymWei::gym(5_000));
    // Nothing happens mid-epoch: the member keeps its place until the boundary.
    assert!(h
        .orch
        .ring(job)
        .await
        .unwrap()
        .unwrap()
        .members
        .contains(&victim));

    h.await_phase(job, MIN * 5, "epoch 1", |p| running(p) == Some(1))
        .await
        .unwrap();
    let ring = await_without(&h, job, victim, 4).await;
    assert!(ring.version >= 2, "a reconfiguration, not a new ring");
    // The one free node took its place.
    let standby = ring
        .members
        .iter()
        .find(|m| !members.contains(m))
        .copied()
        .expect("a standby was inserted");
    assert_ne!(standby, victim);

    // Views show the standing as read, and when.
    let nodes = h.orch.nodes().await.unwrap();
    let v = nodes.iter().find(|n| n.id == victim).unwrap();
    assert_eq!(v.stake, GymWei::gym(5_000));
    assert_eq!(v.penalty_until, Some(receipt.penalty_until));
    assert!(v.standing_read_at > read_at_admission);
    assert!(v.alive, "a slashed node is not a dead one");
    // The change is recorded, so a rebuilt registry starts from it.
    let recorded = h.records().await.into_iter().any(|r| {
        matches!(r.event, Event::NodeStanding { node, stake, .. }
            if node == victim && stake == GymWei::gym(5_000))
    });
    assert!(recorded, "NodeStanding recorded");

    // A delta it sends all the same is refused.
    let late = h
        .orch
        .submit_delta(hanzod::core::types::DeltaReceipt {
            job,
            node: victim,
            epoch: 1,
            step: 0,
            delta_hash: [9; 32],
            claimed_loss: 1.0,
            signature: vec![],
        })
        .await;
    assert!(late.is_err(), "{late:?}");
    // It was given no work for epoch 1 (nor later).
    let given: Vec<u32> = h
        .status(victim_index)
        .assignments
        .iter()
        .filter(|(j, _, _)| *j == job)
        .map(|(_, e, _)| *e)
        .collect();
    assert!(given.iter().all(|&e| e == 0), "assignments {given:?}");

    // And it is not placed in a new job: the only other node free is the victim.
    let second = h
        .orch
        .submit_job(hanzod::core::job::JobSpec {
            min_nodes: 1,
            max_nodes: 1,
            ..h.job_spec("after", 1, 1)
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    let placed = h.orch.ring(second).await.unwrap();
    assert!(
        placed.is_none(),
        "the slashed node was placed in a new job: {placed:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_member_whose_stake_fell_below_the_minimum_leaves_too_and_an_ended_penalty_does_not() {
    let (h, job, members) = four_of(6, 32).await;
    let (poor, kept) = (members[0], members[2]);
    // Its operator withdrew most of the stake: no penalty, just under the minimum.
    h.chain.set_stake(poor, GymWei(GymWei::gym(10_000).0 - 1));
    h.await_phase(job, MIN * 5, "epoch 1", |p| running(p) == Some(1))
        .await
        .unwrap();
    let ring = await_without(&h, job, poor, 4).await;
    assert!(ring.members.contains(&kept));
    let nodes = h.orch.nodes().await.unwrap();
    let v = nodes.iter().find(|n| n.id == poor).unwrap();
    assert_eq!(v.penalty_until, None);
    assert!(v.stake < GymWei::gym(10_000));
    // A penalty that has already ended is no reason to leave.
    h.chain.set_penalty(kept, Some(Timestamp(1)));
    h.await_phase(job, MIN * 5, "epoch 2", |p| running(p) == Some(2))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let ring = h.orch.ring(job).await.unwrap().unwrap();
    assert!(
        ring.members.contains(&kept),
        "an ended penalty evicted a member"
    );
}

#[tokio::test(start_paused = true)]
async fn an_idle_node_slashed_since_its_admission_is_left_out_of_a_new_ring() {
    let h = Harness::start(HarnessConfig::new(5).seed_from_env_or(33)).await;
    let idle = h.node_id(2);
    // Slashed elsewhere after its admission: the registry's view still has 50,000 GYM.
    h.chain
        .slash(&idle, 90, b"evidence from elsewhere")
        .await
        .unwrap();
    let before = h.orch.nodes().await.unwrap();
    assert_eq!(
        before.iter().find(|n| n.id == idle).unwrap().stake,
        GymWei::gym(50_000)
    );
    let (_, ring) = h.submit_and_form(h.job_spec("fresh", 5, 2)).await;
    assert_eq!(ring.members.len(), 4, "{ring:?}");
    assert!(!ring.members.contains(&idle));
    let after = h.orch.nodes().await.unwrap();
    let v = after.iter().find(|n| n.id == idle).unwrap();
    assert_eq!(v.stake, GymWei::gym(5_000));
    assert!(v.penalty_until.is_some());
}

/// Uptime, eligibility that explains itself (issue 19 item 6): a failed node's uptime keeps
/// falling in views while it is away, and a node back from a few minutes' outage has spent
/// only those minutes of its 72-min daily downtime budget: it is placed at once.
#[tokio::test(start_paused = true)]
async fn a_failed_nodes_uptime_keeps_falling_and_a_short_outage_leaves_it_placeable() {
    let mut h = Harness::start(
        HarnessConfig::new(3)
            .seed_from_env_or(34)
            .auto_deltas(false),
    )
    .await;
    let node = h.node_id(0);
    let uptime = |nodes: &[hanzod::core::sched::NodeView]| {
        nodes.iter().find(|n| n.id == node).unwrap().uptime
    };
    h.crash(0);
    h.await_node_failed(0, MIN).await.unwrap();
    let at_failure = uptime(&h.orch.nodes().await.unwrap());
    tokio::time::sleep(Duration::from_secs(4 * 60)).await;
    let later = uptime(&h.orch.nodes().await.unwrap());
    assert!(later < at_failure, "{at_failure} → {later}: frozen");
    let rules = h.orch.config().eligibility.rules();
    let views = h.orch.nodes().await.unwrap();
    let v = views.iter().find(|n| n.id == node).unwrap();
    assert_eq!(
        hanzod::core::sched::placement_blocker(&rules, v, h.orch.clock().now()),
        Some(hanzod::core::sched::Ineligible::NotAlive)
    );

    h.rejoin(0).await;
    tokio::time::sleep(Duration::from_secs(15)).await;
    let back = uptime(&h.orch.nodes().await.unwrap());
    assert!(
        (0.95..1.0).contains(&back),
        "uptime {back} after a ~4-min outage"
    );
    let views = h.orch.nodes().await.unwrap();
    let v = views.iter().find(|n| n.id == node).unwrap();
    assert_eq!(
        hanzod::core::sched::placement_blocker(&rules, v, h.orch.clock().now()),
        None
    );
    let (_, ring) = h.submit_and_form(h.job_spec("back", 3, 1)).await;
    assert!(ring.members.contains(&node), "{ring:?}");
}
