//! `hanzod bench`: measurements of the transport that the closing notes report.
//!
//! * [`recovery`]: an in-process daemon and N in-process node agents over loopback gRPC;
//!   per run, one ring member's agent is killed (its connection drops) and the time until
//!   every survivor has applied the same new ring is measured. Reports p50/p99.
//! * [`load`]: a load generator against a running daemon: registers N node keys, opens N
//!   session streams over a few HTTP/2 connections, sends signed heartbeats at a fixed
//!   rate, and reads the daemon's own counters and latency histogram from `/metrics`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hanzod_actors::job::JobSpec;
use hanzod_actors::types::GymWei;
use hanzod_proto::v1 as pb;
use hanzod_proto::v1::node_service_client::NodeServiceClient;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use hanzod_daemon::config::Config;
use hanzod_daemon::metrics::{parse_samples, scrape};
use hanzod_daemon::serve::Daemon;
use hanzod_node::protocol::{self, SessionSigner};
use hanzod_node::{Agent, AgentEvent, AgentSettings};
use hanzod_protocol::client::ClientOptions;
use hanzod_protocol::identity::Identity;

/// Quantile `q` in [0, 1] of `samples` (nearest rank on the sorted samples).
pub fn quantile(samples: &[f64], q: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut s = samples.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let rank = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len());
    s[rank - 1]
}

/// The result of [`recovery`].
#[derive(Debug, Clone, Serialize)]
pub struct RecoveryReport {
    /// Agents per run.
    pub nodes: usize,
    /// Runs measured.
    pub runs: usize,
    /// The seed that picked the killed members.
    pub seed: u64,
    /// Kill → every survivor on the new ring, ms, per run.
    pub samples_ms: Vec<f64>,
    /// Median, ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// The configured coalescing window, ms. Not part of a sample: a lone crash is applied
    /// at once (leading edge); the window only holds failures that follow it.
    pub coalesce_ms: u64,
}

fn agent_settings(endpoint: String, advertise: String, region: &str) -> AgentSettings {
    let orchestrator = ClientOptions {
        endpoint,
        ..ClientOptions::default()
    };
    AgentSettings {
        backoff_min_ms: 100,
        backoff_max_ms: 1000,
        ..AgentSettings::new(orchestrator, region, advertise)
    }
}

/// Runs `runs` crash-and-repair rounds with `nodes` agents each (fresh daemon per run).
pub async fn recovery(
    cfg: &Config,
    nodes: usize,
    runs: usize,
    seed: u64,
) -> anyhow::Result<RecoveryReport> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut samples = Vec::with_capacity(runs);
    for run in 0..runs {
        let mut cfg = cfg.clone();
        cfg.server.grpc_addr = "127.0.0.1:0".into();
        cfg.server.metrics_addr = String::new();
        // Throwaway daemons: nothing of theirs is kept on disk.
        cfg.data_dir.clear();
        let daemon = Daemon::start(&cfg).await?;
        let endpoint = format!("http://{}", daemon.grpc_addr);
        let (events_tx, mut events) = mpsc::unbounded_channel::<(usize, AgentEvent)>();
        let mut agents = Vec::new();
        for i in 0..nodes {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let advertise = listener.local_addr()?.to_string();
            let identity = Identity::from_seed(rng.gen());
            let region = ["us-east", "eu-west", "ap-south"][i % 3];
            let agent = Agent::new(
                agent_settings(endpoint.clone(), advertise, region),
                identity,
            );
            let me = agent.node_id();
            let mut rx = agent.subscribe();
            let tx = events_tx.clone();
            let forward = tokio::spawn(async move {
                while let Ok(e) = rx.recv().await {
                    if tx.send((i, e)).is_err() {
                        return;
                    }
                }
            });
            let probes = tokio::spawn(hanzod_node::probe::serve(listener, me));
            let (_stop_tx, stop) = tokio::sync::watch::channel(false);
            let task = tokio::spawn(agent.run(stop));
            agents.push((task, probes, forward, _stop_tx));
        }
        let mut registered = std::collections::HashSet::new();
        wait(&mut events, Duration::from_secs(30), |i, e| {
            if matches!(e, AgentEvent::Registered { .. }) {
                registered.insert(i);
            }
            registered.len() == nodes
        })
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "run {run}: only {} of {nodes} agents registered",
                registered.len()
            )
        })?;
        // Let the probe requests of the last registrations settle before forming the ring.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let job = daemon
            .core
            .submit_job(JobSpec {
                name: format!("bench-{run}"),
                epochs: 1_000,
                min_nodes: 2,
                max_nodes: nodes as u32,
                min_vram_bytes: 0,
                pending_deadline_ms: 60_000,
                epoch_deadline_ms: 3_600_000,
                utility: 1.0,
                submitter_stake: GymWei::gym(10_000),
                training: Default::default(),
            })
            .await?;
        let mut on_ring: HashMap<usize, (u64, Vec<String>)> = HashMap::new();
        wait(&mut events, Duration::from_secs(30), |i, e| {
            if let Some((version, members)) = ring_applied(e, job.0) {
                on_ring.insert(i, (version, members.to_vec()));
            }
            on_ring.len() == nodes && on_ring.values().all(|r| r.1.len() == nodes)
        })
        .await
        .map_err(|_| anyhow::anyhow!("run {run}: the ring did not reach every agent"))?;
        let v1 = on_ring.values().map(|r| r.0).max().unwrap_or(0);
        let victim = rng.gen_range(0..nodes);
        let started = Instant::now();
        let (task, probes, _, _) = &agents[victim];
        task.abort();
        probes.abort();
        let mut after: HashMap<usize, Vec<String>> = HashMap::new();
        wait(&mut events, Duration::from_secs(30), |i, e| {
            if let Some((version, members)) = ring_applied(e, job.0) {
                if version > v1 && i != victim {
                    after.insert(i, members.to_vec());
                }
            }
            after.len() == nodes - 1 && {
                let first = after.values().next();
                after
                    .values()
                    .all(|m| Some(m) == first && m.len() == nodes - 1)
            }
        })
        .await
        .map_err(|_| anyhow::anyhow!("run {run}: survivors did not all apply one new ring"))?;
        samples.push(started.elapsed().as_secs_f64() * 1000.0);
        for (task, probes, forward, _) in agents {
            task.abort();
            probes.abort();
            forward.abort();
        }
        daemon.stop().await;
    }
    Ok(RecoveryReport {
        nodes,
        runs,
        seed,
        p50_ms: quantile(&samples, 0.5),
        p99_ms: quantile(&samples, 0.99),
        samples_ms: samples,
        coalesce_ms: cfg.core.ring.coalesce_ms,
    })
}

/// The version and members of `e` when it is a ring of `job` applied.
fn ring_applied(e: &AgentEvent, job: u64) -> Option<(u64, &[String])> {
    match e {
        AgentEvent::RingApplied {
            job: j,
            version,
            members,
        } if *j == job => Some((*version, members)),
        _ => None,
    }
}

async fn wait<F: FnMut(usize, &AgentEvent) -> bool>(
    events: &mut mpsc::UnboundedReceiver<(usize, AgentEvent)>,
    limit: Duration,
    mut done: F,
) -> Result<(), ()> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, events.recv()).await {
            Ok(Some((i, e))) => {
                if done(i, &e) {
                    return Ok(());
                }
            }
            _ => return Err(()),
        }
    }
}

/// The result of [`load`].
#[derive(Debug, Clone, Serialize)]
pub struct LoadReport {
    /// Sessions held open.
    pub sessions: usize,
    /// HTTP/2 connections they share.
    pub connections: usize,
    /// Time to register every key and open every session, s.
    pub setup_s: f64,
    /// Heartbeats sent per second, measured at the generator.
    pub offered_per_s: f64,
    /// Heartbeats the daemon accepted per second (its `hanzod_heartbeats_total{outcome="accepted"}`).
    pub accepted_per_s: f64,
    /// Refusals the generator received.
    pub rejected: u64,
    /// Daemon-side handling latency from its histogram, ms (interpolated inside the bucket;
    /// `null` in JSON when above the largest bucket, 10 s).
    pub p50_handling_ms: f64,
    /// See `p50_handling_ms`.
    pub p99_handling_ms: f64,
    /// The daemon's resident memory at the end, bytes (its `hanzod_process_resident_memory_bytes`).
    pub daemon_rss_bytes: Option<f64>,
}

/// Options of [`load`].
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// The daemon.
    pub client: ClientOptions,
    /// Its metrics endpoint, `host:port`.
    pub metrics: String,
    /// Sessions to open.
    pub sessions: usize,
    /// Sessions per HTTP/2 connection.
    pub per_connection: usize,
    /// Heartbeats per session per second.
    pub rate: f64,
    /// Measurement window, s (after setup).
    pub duration_s: u64,
    /// Seeds the node keys.
    pub seed: u64,
}

/// Quantile `q` of a histogram's delta between two scrapes, by linear interpolation inside
/// the bucket that holds it (the Prometheus `histogram_quantile` method), in the
/// histogram's unit.
pub fn histogram_quantile(
    name: &str,
    before: &HashMap<String, f64>,
    after: &HashMap<String, f64>,
    q: f64,
) -> f64 {
    let prefix = format!("{name}_bucket{{le=\"");
    let mut buckets: Vec<(f64, f64)> = after
        .iter()
        .filter_map(|(k, v)| {
            let le = k.strip_prefix(&prefix)?.strip_suffix("\"}")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, v - before.get(k).copied().unwrap_or(0.0)))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last().map(|b| b.1).unwrap_or(0.0);
    if total <= 0.0 {
        return f64::NAN;
    }
    let rank = q * total;
    let (mut lo, mut below) = (0.0, 0.0);
    for (le, count) in buckets {
        if count >= rank {
            if le.is_infinite() {
                // Above the largest finite bound: unknown, not that bound.
                return f64::INFINITY;
            }
            let inside = count - below;
            return if inside <= 0.0 {
                le
            } else {
                lo + (le - lo) * (rank - below) / inside
            };
        }
        lo = le;
        below = count;
    }
    lo
}

struct Session {
    signer: SessionSigner,
    out: mpsc::Sender<pb::SignedNodeMessage>,
}

fn heartbeat(s: &mut Session) -> pb::SignedNodeMessage {
    let now = hanzod_actors::ports::Clock::now(&hanzod_actors::ports::SystemClock).as_millis();
    s.signer.sign(now, protocol::heartbeat())
}

async fn open_session(
    client: &mut NodeServiceClient<tonic::transport::Channel>,
    opts: &ClientOptions,
    identity: Identity,
    index: usize,
    rejected: Arc<AtomicU64>,
) -> anyhow::Result<Session> {
    let me = identity.node_id();
    let info = pb::NodeInfo {
        node_id: me.0.to_vec(),
        gpu: Some(pb::GpuInfo {
            model: "load-generator".into(),
            vram_bytes: 24 << 30,
            compute_cap_major: 8,
            compute_cap_minor: 6,
            driver_sig: vec![],
        }),
        bandwidth: Some(pb::BandwidthProbe {
            up_mbps: 100.0,
            down_mbps: 100.0,
        }),
        region: format!("r{}", index % 8),
        endpoint: format!("127.0.0.1:{}", 20_000 + index % 40_000),
    };
    let reg = protocol::register(client, opts, &identity, &info).await?;
    let (out, rx) = mpsc::channel(8);
    let mut session = Session {
        signer: SessionSigner::new(identity, reg.session),
        out,
    };
    let first = heartbeat(&mut session);
    session
        .out
        .try_send(first)
        .map_err(|_| anyhow::anyhow!("queue"))?;
    let mut inbound = client
        .session(opts.stream_request(ReceiverStream::new(rx)))
        .await?
        .into_inner();
    tokio::spawn(async move {
        while let Ok(Some(m)) = inbound.message().await {
            if let Some(pb::orchestrator_message::Body::Reject(_)) = m.body {
                rejected.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    Ok(session)
}

/// Registers `sessions` keys, holds their sessions, sends heartbeats at `rate` per session
/// for `duration_s`, and reads the daemon's figures.
pub async fn load(o: &LoadOptions) -> anyhow::Result<LoadReport> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(o.seed);
    let setup = Instant::now();
    let rejected = Arc::new(AtomicU64::new(0));
    let connections = o.sessions.div_ceil(o.per_connection.max(1));
    let mut handles = Vec::new();
    for c in 0..connections {
        let channel = o.client.connect().await?;
        let n = o.per_connection.min(o.sessions - c * o.per_connection);
        let seeds: Vec<[u8; 32]> = (0..n).map(|_| rng.gen()).collect();
        let opts = o.client.clone();
        let rejected = rejected.clone();
        handles.push(tokio::spawn(async move {
            let mut client = NodeServiceClient::new(channel);
            let mut out = Vec::with_capacity(n);
            for (k, seed) in seeds.into_iter().enumerate() {
                out.push(
                    open_session(
                        &mut client,
                        &opts,
                        Identity::from_seed(seed),
                        c * 1000 + k,
                        rejected.clone(),
                    )
                    .await?,
                );
            }
            anyhow::Ok(out)
        }));
    }
    let mut sessions = Vec::with_capacity(o.sessions);
    for h in handles {
        sessions.extend(h.await??);
    }
    let setup_s = setup.elapsed().as_secs_f64();
    let before = parse_samples(&scrape(&o.metrics).await?);
    let sent = Arc::new(AtomicU64::new(0));
    let period = Duration::from_secs_f64(1.0 / o.rate.max(1e-3));
    let window = Duration::from_secs(o.duration_s);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (i, mut s) in sessions.into_iter().enumerate() {
        let sent = sent.clone();
        let phase = period.mul_f64((i as f64 * 0.618_033_988_75).fract());
        tasks.push(tokio::spawn(async move {
            let start = tokio::time::Instant::now() + phase;
            let mut tick = tokio::time::interval_at(start, period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tick.tick().await;
                if started.elapsed() >= window {
                    return s;
                }
                let hb = heartbeat(&mut s);
                if s.out.send(hb).await.is_err() {
                    return s;
                }
                sent.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let mut kept = Vec::new();
    for t in tasks {
        kept.push(t.await?);
    }
    let elapsed = started.elapsed().as_secs_f64();
    // Let the daemon drain what is queued before reading its counters.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = parse_samples(&scrape(&o.metrics).await?);
    let key = "hanzod_heartbeats_total{outcome=\"accepted\"}";
    let accepted = after.get(key).copied().unwrap_or(0.0) - before.get(key).copied().unwrap_or(0.0);
    let name = "hanzod_heartbeat_handling_seconds";
    let report = LoadReport {
        sessions: kept.len(),
        connections,
        setup_s,
        offered_per_s: sent.load(Ordering::Relaxed) as f64 / elapsed,
        accepted_per_s: accepted / elapsed,
        rejected: rejected.load(Ordering::Relaxed),
        p50_handling_ms: histogram_quantile(name, &before, &after, 0.5) * 1000.0,
        p99_handling_ms: histogram_quantile(name, &before, &after, 0.99) * 1000.0,
        daemon_rss_bytes: after.get("hanzod_process_resident_memory_bytes").copied(),
    };
    drop(kept);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let s: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&s, 0.5), 50.0);
        assert_eq!(quantile(&s, 0.99), 99.0);
        assert_eq!(quantile(&s, 1.0), 100.0);
        assert!(quantile(&[], 0.5).is_nan());
    }

    #[test]
    fn histogram_quantile_interpolates_inside_the_bucket() {
        let before = HashMap::new();
        let after: HashMap<String, f64> = [
            ("h_bucket{le=\"0.1\"}", 10.0),
            ("h_bucket{le=\"0.2\"}", 30.0),
            ("h_bucket{le=\"+Inf\"}", 40.0),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        // Rank 20 of 40 lies halfway through the (0.1, 0.2] bucket.
        assert!((histogram_quantile("h", &before, &after, 0.5) - 0.15).abs() < 1e-9);
        // Rank 39.6 is in +Inf: above every bound, so unknown.
        assert_eq!(
            histogram_quantile("h", &before, &after, 0.99),
            f64::INFINITY
        );
        assert!(histogram_quantile("x", &before, &after, 0.5).is_nan());
    }
}
