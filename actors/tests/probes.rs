//! Link probing after admission (DESIGN §4): the registry asks nodes to measure the links
//! to their peers through the node link, capped by `core.probe.peers_per_node`.

use hanzod_actors::ports::Counter;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use hanzod_actors::config::CoreConfig;
use hanzod_actors::ports::memory::{ChannelNodeLink, MemoryChain, MemoryMetrics};
use hanzod_actors::ports::NodeCommand;
use hanzod_actors::types::{GymWei, NodeId, NodeInfo};
use hanzod_actors::{Orchestrator, OrchestratorHandle};
use tokio::sync::mpsc::UnboundedReceiver;

/// Four nodes: 0 and 2 in `eu`, 1 and 3 in `us`.
const REGIONS: [&str; 4] = ["eu", "us", "eu", "us"];

fn id(i: usize) -> NodeId {
    NodeId([i as u8 + 1; 32])
}

fn info(i: usize) -> NodeInfo {
    NodeInfo {
        id: id(i),
        region: REGIONS[i].into(),
        ..Default::default()
    }
}

struct Setup {
    orch: OrchestratorHandle,
    metrics: Arc<MemoryMetrics>,
    link: ChannelNodeLink,
}

async fn start(peers_per_node: u32) -> Setup {
    let mut cfg = CoreConfig::default();
    cfg.probe.peers_per_node = peers_per_node;
    let metrics = Arc::new(MemoryMetrics::new());
    let link = ChannelNodeLink::new();
    let orch = Orchestrator::builder()
        .config(cfg)
        .chain(Arc::new(MemoryChain::with_default_stake(GymWei::gym(
            20_000,
        ))))
        .node_link(Arc::new(link.clone()))
        .metrics(metrics.clone())
        .start()
        .await
        .unwrap();
    Setup {
        orch,
        metrics,
        link,
    }
}

/// The peers named by the next `n` commands on `rx`, which must all be probe requests.
async fn probes(rx: &mut UnboundedReceiver<NodeCommand>, n: usize) -> BTreeSet<NodeId> {
    let mut peers = BTreeSet::new();
    for _ in 0..n {
        let cmd = tokio::time::timeout(Duration::from_secs(1), rx.recv())
            .await
            .expect("a probe request within 1 s (tokio time)")
            .expect("session open");
        let NodeCommand::ProbeRequest { peer } = cmd else {
            panic!("expected a probe request, got {cmd:?}")
        };
        assert!(peers.insert(peer), "{peer:?} requested twice");
    }
    peers
}

/// Lets (paused) time pass well within the heartbeat timeout, then checks that nothing
/// more arrived on any of `rxs`.
async fn assert_quiet(rxs: &mut [UnboundedReceiver<NodeCommand>]) {
    tokio::time::advance(Duration::from_secs(1)).await;
    for (i, rx) in rxs.iter_mut().enumerate() {
        assert!(rx.try_recv().is_err(), "node {i} got an unexpected command");
    }
}

fn set(ids: &[usize]) -> BTreeSet<NodeId> {
    ids.iter().map(|&i| id(i)).collect()
}

#[tokio::test(start_paused = true)]
async fn admissions_request_probes_of_every_new_pair() {
    let s = start(8).await;
    let mut rxs: Vec<_> = (0..4).map(|i| s.link.connect(id(i))).collect();
    for i in 0..4 {
        s.orch.register_node(info(i)).await.unwrap();
    }
    // With k = 8 ≥ 3 peers, each admission covers every pair with the earlier nodes, so
    // over the four admissions every node is asked to probe each of the three others.
    for (i, rx) in rxs.iter_mut().enumerate() {
        let others: Vec<usize> = (0..4).filter(|&j| j != i).collect();
        assert_eq!(probes(rx, 3).await, set(&others), "node {i}");
    }
    assert_quiet(&mut rxs).await;
    assert_eq!(s.metrics.counter(Counter::ProbeRequests, "sent"), 12);
    assert_eq!(
        s.metrics.counter(Counter::ProbeRequests, "undeliverable"),
        0
    );

    // A re-registration (the node may have moved) is probed again; measured pairs wait for
    // unmeasured ones. Node 3's links with its same-region peer 1 are measured, so with
    // k = 8 all its pairs are probed: unmeasured 0 and 2 and the refresh of 1.
    for (a, b) in [(3, 1), (1, 3)] {
        s.orch.report_link(id(a), id(b), 500.0).await.unwrap();
    }
    s.orch.register_node(info(3)).await.unwrap();
    assert_eq!(probes(&mut rxs[3], 3).await, set(&[0, 1, 2]));
    for peer in [0, 1, 2] {
        assert_eq!(probes(&mut rxs[peer], 1).await, set(&[3]), "node {peer}");
    }
    assert_quiet(&mut rxs).await;
    assert_eq!(s.metrics.counter(Counter::ProbeRequests, "sent"), 18);
    s.orch.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn peers_per_node_caps_probes_and_prefers_same_region_then_unmeasured() {
    let s = start(1).await;
    let mut rxs: Vec<_> = (0..4).map(|i| s.link.connect(id(i))).collect();
    for i in 0..4 {
        s.orch.register_node(info(i)).await.unwrap();
    }
    // One peer per admission, same region first:
    //   1 (us): only 0            → 1→0, 0→1
    //   2 (eu): 0 (eu) over 1     → 2→0, 0→2
    //   3 (us): 1 (us) over 0, 2  → 3→1, 1→3
    assert_eq!(probes(&mut rxs[0], 2).await, set(&[1, 2]));
    assert_eq!(probes(&mut rxs[1], 2).await, set(&[0, 3]));
    assert_eq!(probes(&mut rxs[2], 1).await, set(&[0]));
    assert_eq!(probes(&mut rxs[3], 1).await, set(&[1]));
    assert_quiet(&mut rxs).await;
    assert_eq!(s.metrics.counter(Counter::ProbeRequests, "sent"), 6);

    // Node 1 re-registers with both directions to its same-region peer 3 measured: its one
    // probed peer is now an unmeasured one from the other region.
    for (a, b) in [(3, 1), (1, 3)] {
        s.orch.report_link(id(a), id(b), 500.0).await.unwrap();
    }
    s.orch.register_node(info(1)).await.unwrap();
    let asked = probes(&mut rxs[1], 1).await;
    assert!(asked == set(&[0]) || asked == set(&[2]), "{asked:?}");
    let peer = (0..4).find(|&j| asked.contains(&id(j))).unwrap();
    assert_eq!(probes(&mut rxs[peer], 1).await, set(&[1]));
    assert_quiet(&mut rxs).await;
    assert_eq!(s.metrics.counter(Counter::ProbeRequests, "sent"), 8);
    assert_eq!(
        s.metrics.counter(Counter::ProbeRequests, "undeliverable"),
        0
    );
    s.orch.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn requests_without_a_session_are_retried_once_after_a_heartbeat_interval() {
    let s = start(8).await;
    let interval = Duration::from_millis(s.orch.config().heartbeat.interval_ms);
    // Only node 0 has a session when 1 and 2 register (a transport may open a node's
    // session after its registration returns).
    let mut rx0 = s.link.connect(id(0));
    for i in 0..3 {
        s.orch.register_node(info(i)).await.unwrap();
    }
    assert_eq!(probes(&mut rx0, 2).await, set(&[1, 2]));
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(s.metrics.counter(Counter::ProbeRequests, "sent"), 2);
    assert_eq!(
        s.metrics.counter(Counter::ProbeRequests, "undeliverable"),
        0
    );
    // Node 1 opens its session in time; node 2 never does.
    let mut rx1 = s.link.connect(id(1));
    tokio::time::advance(interval).await;
    // Retried: 1→0 and 1→2 reach node 1; 2→0 and 2→1 have no session to go to.
    assert_eq!(probes(&mut rx1, 2).await, set(&[0, 2]));
    assert_quiet(std::slice::from_mut(&mut rx0)).await;
    assert_eq!(s.metrics.counter(Counter::ProbeRequests, "sent"), 4);
    assert_eq!(
        s.metrics.counter(Counter::ProbeRequests, "undeliverable"),
        2
    );
    s.orch.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn zero_peers_per_node_disables_probing() {
    let s = start(0).await;
    let mut rxs: Vec<_> = (0..4).map(|i| s.link.connect(id(i))).collect();
    for i in 0..4 {
        s.orch.register_node(info(i)).await.unwrap();
    }
    s.orch.register_node(info(0)).await.unwrap();
    assert_quiet(&mut rxs).await;
    assert_eq!(s.metrics.counter(Counter::ProbeRequests, "sent"), 0);
    assert_eq!(
        s.metrics.counter(Counter::ProbeRequests, "undeliverable"),
        0
    );
    s.orch.shutdown().await;
}
