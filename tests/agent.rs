//! The node agent against a real daemon over loopback: refusals that retrying cannot change
//! stop it, and a second process on the same key makes the first one stop rather than fight.

use std::time::Duration;

use hanzod::agent::{Agent, AgentError, AgentEvent, AgentSettings};
use hanzod::client::ClientOptions;
use hanzod::config::Config;
use hanzod::identity::Identity;
use hanzod::serve::Daemon;
use tokio::sync::watch;

async fn daemon() -> Daemon {
    let mut cfg = Config::load(None, |_| None).expect("defaults");
    cfg.data_dir.clear(); // memory-only: nothing written into the working directory
    cfg.server.grpc_addr = "127.0.0.1:0".into();
    cfg.server.metrics_addr = String::new();
    cfg.core.probe.peers_per_node = 0;
    Daemon::start(&cfg).await.expect("daemon starts")
}

fn settings(d: &Daemon, advertise: &str) -> AgentSettings {
    let orchestrator = ClientOptions {
        endpoint: format!("http://{}", d.grpc_addr),
        ..ClientOptions::default()
    };
    AgentSettings {
        backoff_min_ms: 50,
        backoff_max_ms: 200,
        ..AgentSettings::new(orchestrator, "eu-west", advertise)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declaration_the_daemon_refuses_stops_the_agent() {
    let d = daemon().await;
    let agent = Agent::new(settings(&d, "nohost"), Identity::from_seed([1; 32]));
    let (_stop_tx, stop) = watch::channel(false);
    let r = tokio::time::timeout(Duration::from_secs(20), agent.run(stop))
        .await
        .expect("the agent gives up instead of retrying forever");
    match r {
        Err(AgentError::Fatal(why)) => {
            assert!(
                why.contains("INVALID_ARGUMENT") && why.contains("endpoint"),
                "{why}"
            )
        }
        other => panic!("{other:?}"),
    }
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_agent_on_the_same_key_makes_the_first_stop() {
    let d = daemon().await;
    let key = Identity::from_seed([2; 32]);
    let first = Agent::new(settings(&d, "127.0.0.1:7001"), key.clone());
    let mut first_events = first.subscribe();
    let (_s1, stop1) = watch::channel(false);
    let first = tokio::spawn(first.run(stop1));
    let registered = |e: &AgentEvent| matches!(e, AgentEvent::Registered { .. });
    loop {
        let e = tokio::time::timeout(Duration::from_secs(20), first_events.recv())
            .await
            .expect("first registers")
            .expect("events");
        if registered(&e) {
            break;
        }
    }
    let second = Agent::new(settings(&d, "127.0.0.1:7002"), key.clone());
    let mut second_events = second.subscribe();
    let (stop2_tx, stop2) = watch::channel(false);
    let second = tokio::spawn(second.run(stop2));
    let r = tokio::time::timeout(Duration::from_secs(20), first)
        .await
        .expect("the replaced agent stops")
        .expect("task");
    match r {
        Err(AgentError::Fatal(why)) => assert!(why.contains("ABORTED"), "{why}"),
        other => panic!("{other:?}"),
    }
    // The second keeps its session: it registered once and was never disconnected.
    let mut seen = Vec::new();
    while let Ok(Ok(e)) =
        tokio::time::timeout(Duration::from_millis(300), second_events.recv()).await
    {
        seen.push(e);
    }
    assert_eq!(seen.iter().filter(|e| registered(e)).count(), 1, "{seen:?}");
    assert!(
        !seen
            .iter()
            .any(|e| matches!(e, AgentEvent::Disconnected { .. })),
        "{seen:?}"
    );
    let nodes = d.core.nodes().await.expect("nodes");
    assert_eq!(nodes.len(), 1);
    assert!(nodes[0].alive);
    assert_eq!(d.sessions.endpoint(&key.node_id()), "127.0.0.1:7002");
    let _ = stop2_tx.send(true);
    let _ = second.await;
    d.stop().await;
}
