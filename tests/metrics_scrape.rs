//! The real actor core reporting through `PrometheusMetrics`, scraped over loopback HTTP
//! with gauges sampled from the orchestrator, as the daemon wires it.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use hanzod::metrics::{serve, PrometheusMetrics, CONTENT_TYPE};
use hanzod_actors::node::Heartbeat;
use hanzod_actors::ports::memory::MemoryChain;
use hanzod_actors::types::{GymWei, NodeId, NodeInfo};
use hanzod_actors::{Orchestrator, OrchestratorError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

async fn get(addr: std::net::SocketAddr, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    // HTTP/1.0: no chunked encoding, the server closes when done.
    let req = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    (head.to_ascii_lowercase(), body.to_owned())
}

#[tokio::test]
async fn core_counters_and_sampled_gauges_reach_the_scrape() {
    let metrics = Arc::new(PrometheusMetrics::new());
    let chain = MemoryChain::with_default_stake(GymWei::gym(50_000));
    let orch = Orchestrator::builder()
        .chain(Arc::new(chain))
        .metrics(metrics.clone())
        .start()
        .await
        .unwrap();

    let node = NodeId([1; 32]);
    let info = NodeInfo {
        id: node,
        region: "eu-west".into(),
        ..NodeInfo::default()
    };
    orch.register_node(info).await.unwrap();
    let hb = |node, seq| Heartbeat {
        node,
        seq,
        timestamp: orch.clock().now(),
        gpu_utilization: 0.5,
        memory_used: 1 << 30,
        current_step: seq,
    };
    orch.heartbeat(hb(node, 1)).await.unwrap();
    orch.heartbeat(hb(node, 2)).await.unwrap();
    assert!(matches!(
        orch.heartbeat(hb(NodeId([9; 32]), 1)).await,
        Err(OrchestratorError::Heartbeat(_))
    ));

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = {
        let (orch, m) = (orch.clone(), metrics.clone());
        let sampler = move || -> BoxFuture<'static, ()> {
            let (orch, metrics) = (orch.clone(), m.clone());
            Box::pin(async move { metrics.sample_from(&orch).await })
        };
        tokio::spawn(serve(
            listener,
            metrics.clone(),
            hanzod::health::Health::new(hanzod::health::Role::Single),
            sampler,
            async move {
                let _ = stopped.await;
            },
        ))
    };

    let (head, body) = get(addr, "/metrics").await;
    assert!(
        head.starts_with("http/1.0 200") || head.starts_with("http/1.1 200"),
        "{head}"
    );
    assert!(
        head.contains(&format!("content-type: {CONTENT_TYPE}")),
        "{head}"
    );
    let s = hanzod::metrics::parse_samples(&body);
    let v = |k: &str| *s.get(k).unwrap_or_else(|| panic!("no {k} in\n{body}"));
    assert_eq!(v(r#"hanzod_registrations_total{outcome="accepted"}"#), 1.0);
    assert_eq!(v(r#"hanzod_heartbeats_total{outcome="accepted"}"#), 2.0);
    assert_eq!(v(r#"hanzod_heartbeats_total{outcome="unknown_node"}"#), 1.0);
    assert_eq!(v(r#"hanzod_nodes{state="alive"}"#), 1.0);
    assert_eq!(v(r#"hanzod_nodes{state="failed"}"#), 0.0);
    assert_eq!(v(r#"hanzod_nodes{state="assigned"}"#), 0.0);
    assert_eq!(v(r#"hanzod_jobs{state="pending"}"#), 0.0);

    let (head, _) = get(addr, "/other").await;
    assert!(head.contains(" 404 "), "{head}");

    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    orch.shutdown().await;
}
