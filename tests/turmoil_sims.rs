//! Whole-system simulations over turmoil's simulated network: the real daemon
//! ([`Daemon::start_with_incoming`]) on host `orch`, six real node agents
//! ([`Agent::with_transport`]) on hosts `node-0` … `node-5`, and a client host `ctl` that
//! drives the scenario over gRPC (JobService, AdminService). Time is simulated: each host
//! runs on a paused tokio runtime that turmoil advances tick by tick.
//!
//! Seeded: `HANZOD_SEED` (default [`DEFAULT_SEED`]) seeds turmoil (message latencies) and
//! every key (orchestrator and nodes). Printed at the start of each run.
//!
//! What is not seeded, because it comes from the operating system inside `src/`: the
//! event log id and session tokens (`rand::random`), and the agents' reconnect jitter
//! (`rand::thread_rng`). Sequences of events that do not depend on reconnect timing are
//! compared across two runs of the same seed; see each test for which.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt;
use hanzod::agent::{Agent, AgentEvent, AgentSettings};
use hanzod::client::{ClientOptions, Dial, Io};
use hanzod::config::Config;
use hanzod::core::ports::Clock;
use hanzod::core::types::Timestamp;
use hanzod::identity::Identity;
use hanzod::serve::Daemon;
use hanzod_proto::v1 as pb;
use hanzod_proto::v1::admin_service_client::AdminServiceClient;
use hanzod_proto::v1::job_service_client::JobServiceClient;
use rand::{RngCore, SeedableRng};
use tokio::sync::{broadcast, mpsc, watch};

const DEFAULT_SEED: u64 = 0x4841_4e5a_4f44;
const ORCH: &str = "orch";
const CTL: &str = "ctl";
const NODES: usize = 6;
const REGIONS: [&str; 3] = ["us-east", "eu-west", "ap-south"];

const HEARTBEAT_MS: u64 = 1_000;
const HEARTBEAT_TIMEOUT_MS: u64 = 3_000;
const KEEPALIVE_MS: u64 = 2_000;
const CALL_TIMEOUT_MS: u64 = 3_000;
const CONNECT_TIMEOUT_MS: u64 = 1_000;
const BACKOFF_MIN_MS: u64 = 200;
const BACKOFF_MAX_MS: u64 = 2_000;

type SimResult<T = ()> = Result<T, Box<dyn std::error::Error>>;

fn seed() -> u64 {
    std::env::var("HANZOD_SEED")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(DEFAULT_SEED)
}

fn node_name(i: usize) -> String {
    format!("node-{i}")
}

/// Simulated ms since the simulation started (inside a host).
fn sim_ms() -> u64 {
    turmoil::sim_elapsed().map_or(0, |d| d.as_millis() as u64)
}

/// Keys derived from the seed: the orchestrator's, then one per node.
struct Keys {
    orchestrator: [u8; 32],
    nodes: Vec<[u8; 32]>,
}

impl Keys {
    fn new(seed: u64) -> Keys {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut key = || {
            let mut k = [0u8; 32];
            rng.fill_bytes(&mut k);
            k
        };
        let orchestrator = key();
        let nodes = (0..NODES).map(|_| key()).collect();
        Keys {
            orchestrator,
            nodes,
        }
    }

    fn node_hex(&self, i: usize) -> String {
        Identity::from_seed(self.nodes[i]).node_id().to_string()
    }
}

/// What the agents reported, per host, stamped with simulated ms; plus the requests the
/// scenario makes of the driver (which alone can crash and restart hosts).
#[derive(Default)]
struct Shared {
    events: Mutex<BTreeMap<String, Vec<(u64, AgentEvent)>>>,
    crash: AtomicBool,
    bounce: AtomicBool,
    /// Lines the scenario reports (timings), printed at the end.
    notes: Mutex<Vec<String>>,
}

impl Shared {
    fn events_of(&self, host: &str) -> Vec<(u64, AgentEvent)> {
        self.events
            .lock()
            .unwrap()
            .get(host)
            .cloned()
            .unwrap_or_default()
    }

    /// How many events each node has reported so far: a point to look from.
    fn mark(&self) -> Vec<usize> {
        (0..NODES)
            .map(|i| self.events_of(&node_name(i)).len())
            .collect()
    }

    /// The events node `i` reported after `mark`.
    fn since(&self, i: usize, mark: &[usize]) -> Vec<(u64, AgentEvent)> {
        let mut e = self.events_of(&node_name(i));
        e.drain(..mark[i].min(e.len()));
        e
    }

    fn note(&self, line: String) {
        println!("  {line}");
        self.notes.lock().unwrap().push(line);
    }
}

fn turmoil_dial() -> Dial {
    Arc::new(|addr: String| {
        async move {
            let s = turmoil::net::TcpStream::connect(addr.as_str()).await?;
            Ok(Box::new(s) as Box<dyn Io>)
        }
        .boxed()
    })
}

fn client_options() -> ClientOptions {
    ClientOptions {
        endpoint: format!("http://{ORCH}:9550"),
        call_timeout_ms: CALL_TIMEOUT_MS,
        connect_timeout_ms: CONNECT_TIMEOUT_MS,
        keepalive_ms: KEEPALIVE_MS,
        ..ClientOptions::default()
    }
}

/// Wall-clock time in the simulation: a fixed epoch plus the simulated time elapsed, the
/// same on every host and across restarts (a restarted host must not jump back to the
/// machine's real clock, or its replay window would refuse every heartbeat).
#[derive(Debug)]
struct SimClock;

impl Clock for SimClock {
    fn now(&self) -> Timestamp {
        const EPOCH_MS: u64 = 1_800_000_000_000;
        Timestamp(EPOCH_MS + turmoil::sim_elapsed().unwrap_or_default().as_millis() as u64)
    }
}

fn daemon_config(keys: &Keys, replay_window_ms: u64) -> Config {
    let mut cfg = Config::load(None, |_| None).expect("embedded defaults");
    cfg.data_dir.clear(); // memory-only: nothing written into the working directory
                          // Each orchestrator here starts on a fresh log numbering jobs from 1, so a restarted
                          // one hands out the ids its predecessor did (a pinned first_job_id can): the agents
                          // must tell the two apart by the log id.
    cfg.core.first_job_id = 1;
    cfg.orchestrator.key = hex::encode(keys.orchestrator);
    cfg.core.heartbeat.interval_ms = HEARTBEAT_MS;
    cfg.core.heartbeat.timeout_ms = HEARTBEAT_TIMEOUT_MS;
    cfg.core.heartbeat.replay_window_ms = replay_window_ms;
    // Link probes need a probe listener on every node; none here.
    cfg.core.probe.peers_per_node = 0;
    cfg.server.metrics_addr = String::new();
    cfg.server.keepalive_interval_ms = KEEPALIVE_MS;
    cfg.server.keepalive_timeout_ms = 2 * KEEPALIVE_MS;
    cfg.server.first_message_timeout_ms = CALL_TIMEOUT_MS;
    // The server's rate limiters (governor) count real time, not simulated time: a
    // simulation runs many simulated seconds per real second, so they are opened wide.
    cfg.server.limits.messages_per_s = 100_000;
    cfg.server.limits.burst = 100_000;
    cfg.server.limits.registrations_per_min = 100_000;
    cfg
}

/// The sim: `orch` running the daemon on 9550 (run again from scratch on bounce), and six
/// agent hosts whose events land in `shared`.
fn build_sim(
    seed: u64,
    keys: &Arc<Keys>,
    cfg: Config,
    shared: &Arc<Shared>,
) -> turmoil::Sim<'static> {
    let mut sim = turmoil::Builder::new()
        .rng_seed(seed)
        .simulation_duration(Duration::from_secs(120))
        .build();

    sim.host(ORCH, move || {
        let cfg = cfg.clone();
        async move {
            let listener = turmoil::net::TcpListener::bind("0.0.0.0:9550").await?;
            let (tx, rx) = mpsc::channel::<std::io::Result<Box<dyn Io>>>(64);
            tokio::task::spawn_local(async move {
                loop {
                    let item = listener
                        .accept()
                        .await
                        .map(|(s, _)| Box::new(s) as Box<dyn Io>);
                    if tx.send(item).await.is_err() {
                        return;
                    }
                }
            });
            let incoming = tokio_stream::wrappers::ReceiverStream::new(rx);
            let _daemon = Daemon::start_with_incoming(&cfg, incoming, Arc::new(SimClock)).await?;
            std::future::pending::<()>().await;
            Ok(())
        }
    });

    for i in 0..NODES {
        let name = node_name(i);
        let keys = keys.clone();
        let shared = shared.clone();
        sim.host(node_name(i), move || {
            let name = name.clone();
            let key = keys.nodes[i];
            let shared = shared.clone();
            async move {
                let settings = AgentSettings {
                    backoff_min_ms: BACKOFF_MIN_MS,
                    backoff_max_ms: BACKOFF_MAX_MS,
                    // Training runs on real threads the simulated clock cannot time: these
                    // transport scenarios are compared event by event, so nodes only hold
                    // their sessions (training end to end: tests/demo.rs).
                    train: false,
                    ..AgentSettings::new(
                        client_options(),
                        REGIONS[i % REGIONS.len()],
                        format!("{name}:9560"),
                    )
                };
                let agent = Agent::with_transport(
                    settings,
                    Identity::from_seed(key),
                    turmoil_dial(),
                    Arc::new(SimClock),
                );
                let mut events = agent.subscribe();
                tokio::task::spawn_local(async move {
                    loop {
                        match events.recv().await {
                            Ok(e) => shared
                                .events
                                .lock()
                                .unwrap()
                                .entry(name.clone())
                                .or_default()
                                .push((sim_ms(), e)),
                            Err(broadcast::error::RecvError::Lagged(n)) => {
                                panic!("{name}: lost {n} events")
                            }
                            Err(broadcast::error::RecvError::Closed) => return,
                        }
                    }
                });
                let (_stop_tx, stop) = watch::channel(false);
                let _ = agent.run(stop).await;
                Ok(())
            }
        });
    }
    sim
}

/// Steps the sim until the `ctl` client finishes, crashing and restarting `orch` when the
/// scenario asks. Returns the simulated time it took.
fn drive(sim: &mut turmoil::Sim<'_>, shared: &Shared) -> SimResult<Duration> {
    loop {
        if sim.step()? {
            return Ok(sim.elapsed());
        }
        if shared.crash.swap(false, Ordering::SeqCst) {
            sim.crash(ORCH);
        }
        if shared.bounce.swap(false, Ordering::SeqCst) {
            sim.bounce(ORCH);
        }
    }
}

/// Polls `f` every 10 ms of simulated time for at most `limit`.
async fn wait_for<T>(
    what: &str,
    limit: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> SimResult<T> {
    let start = tokio::time::Instant::now();
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if start.elapsed() > limit {
            return Err(format!("t={} ms: {what}: not within {limit:?}", sim_ms()).into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!("t={} ms: {}", sim_ms(), format!($($fmt)+)).into());
        }
    };
}

fn job_spec(name: &str) -> pb::SubmitJobRequest {
    pb::SubmitJobRequest {
        spec: Some(pb::JobSpec {
            name: name.into(),
            epochs: 1,
            min_nodes: 3,
            max_nodes: NODES as u32,
            min_vram_bytes: 0,
            pending_deadline_ms: 60_000,
            // The agents train nothing: the epoch must not end during the simulation.
            epoch_deadline_ms: 3_600_000,
            utility: 1.0,
            submitter_stake_gym_wei: "10000000000000000000000".into(),
            training: None,
        }),
    }
}

async fn submit(name: &str) -> SimResult<u64> {
    let opts = client_options();
    let mut jobs = JobServiceClient::new(opts.connect_with(turmoil_dial()).await?);
    Ok(jobs
        .submit_job(opts.request(job_spec(name)))
        .await?
        .into_inner()
        .job_id)
}

/// (hex id, alive) of every node the orchestrator lists.
async fn list_nodes() -> SimResult<BTreeMap<String, bool>> {
    let opts = client_options();
    let mut admin = AdminServiceClient::new(opts.connect_with(turmoil_dial()).await?);
    let nodes = admin
        .list_nodes(opts.request(pb::ListNodesRequest {}))
        .await?
        .into_inner()
        .nodes;
    Ok(nodes
        .into_iter()
        .map(|n| (hex::encode(&n.node_id), n.alive))
        .collect())
}

fn registrations(events: &[(u64, AgentEvent)]) -> Vec<(u64, u32)> {
    events
        .iter()
        .filter_map(|(t, e)| match e {
            AgentEvent::Registered { registrations, .. } => Some((*t, *registrations)),
            _ => None,
        })
        .collect()
}

/// The rings applied for `job`: (version, members).
fn rings(events: &[(u64, AgentEvent)], job: u64) -> Vec<(u64, Vec<String>)> {
    events
        .iter()
        .filter_map(|(_, e)| match e {
            AgentEvent::RingApplied {
                job: j,
                version,
                members,
            } if *j == job => Some((*version, members.clone())),
            _ => None,
        })
        .collect()
}

/// Waits until every node registered `n` times, then until all six hold ring v1 of `job`
/// (applied after `mark`) with the same six members; returns them.
async fn await_ring_v1(shared: &Shared, job: u64, mark: &[usize]) -> SimResult<Vec<String>> {
    let members = wait_for("all six apply ring v1", Duration::from_secs(5), || {
        let mut seen = BTreeSet::new();
        for i in 0..NODES {
            let r = rings(&shared.since(i, mark), job);
            let (v, m) = r.last()?;
            if *v != 1 {
                return None;
            }
            seen.insert(m.clone());
        }
        (seen.len() == 1).then(|| seen.into_iter().next().unwrap())
    })
    .await?;
    ensure!(
        members.len() == NODES,
        "ring v1 has {} members",
        members.len()
    );
    Ok(members)
}

async fn await_registered(shared: &Shared, times: usize, limit: Duration) -> SimResult {
    wait_for(
        &format!("every node registered {times} time(s)"),
        limit,
        || {
            (0..NODES)
                .all(|i| registrations(&shared.events_of(&node_name(i))).len() >= times)
                .then_some(())
        },
    )
    .await
}

/// An event with what the OS random source decides removed (reconnect delays), with its
/// simulated time when `timed`.
fn normalized(events: &[(u64, AgentEvent)], timed: bool) -> Vec<String> {
    events
        .iter()
        .map(|(t, e)| {
            let e = match e {
                AgentEvent::Reconnecting { attempt, .. } => format!("reconnecting #{attempt}"),
                AgentEvent::Disconnected { .. } => "disconnected".into(),
                other => format!("{other:?}"),
            };
            if timed {
                format!("{t} {e}")
            } else {
                e
            }
        })
        .collect()
}

/// Fails if the orchestrator refused any agent's message (e.g. a timestamp outside the
/// replay window: the scenario would still pass on liveness alone for a while).
fn ensure_nothing_refused(shared: &Shared) -> SimResult {
    for (host, events) in shared.events.lock().unwrap().iter() {
        let refused: Vec<_> = events
            .iter()
            .filter(|(_, e)| matches!(e, AgentEvent::Rejected { .. }))
            .collect();
        ensure!(refused.is_empty(), "{host}: refused {refused:?}");
    }
    Ok(())
}

fn print_events(shared: &Shared) {
    for (host, events) in shared.events.lock().unwrap().iter() {
        println!("  {host}:");
        for (t, e) in events {
            println!("    {t:>6} ms  {}", hanzod::agent::describe(e));
        }
    }
}

// ---------------------------------------------------------------------------------------
// 1. Partition one member from the orchestrator, then repair.
// ---------------------------------------------------------------------------------------

async fn partition_scenario(shared: Arc<Shared>, keys: Arc<Keys>) -> SimResult {
    let victim = 3;
    let victim_host = node_name(victim);
    let victim_id = keys.node_hex(victim);

    await_registered(&shared, 1, Duration::from_secs(5)).await?;
    shared.note(format!("all six registered by t={} ms", sim_ms()));
    let job = submit("partition").await?;
    ensure!(job == 1, "first job of a fresh log has id {job}");
    let v1 = await_ring_v1(&shared, job, &[0; NODES]).await?;
    ensure!(v1.contains(&victim_id), "{victim_host} is not in ring v1");
    shared.note(format!(
        "ring v1 of 6 applied everywhere by t={} ms",
        sim_ms()
    ));

    let cut = sim_ms();
    let at_cut = shared.mark();
    turmoil::partition(victim_host.as_str(), ORCH);
    shared.note(format!("t={cut} ms: partition {victim_host} | {ORCH}"));

    // The five others move to one new ring without the victim within the heartbeat
    // timeout plus slack (coalescing, scheduling, delivery).
    let limit = Duration::from_millis(HEARTBEAT_TIMEOUT_MS + 2_000);
    let others: Vec<usize> = (0..NODES).filter(|&i| i != victim).collect();
    let expected: BTreeSet<String> = v1.iter().filter(|m| **m != victim_id).cloned().collect();
    let (v2, members) = wait_for(
        "the five others apply a ring without the victim",
        limit,
        || {
            let mut seen = BTreeSet::new();
            for &i in &others {
                let r = rings(&shared.since(i, &at_cut), job);
                let (v, m) = r.last()?;
                if m.contains(&victim_id) {
                    return None;
                }
                seen.insert((*v, m.clone()));
            }
            (seen.len() == 1).then(|| seen.into_iter().next().unwrap())
        },
    )
    .await?;
    let took = sim_ms() - cut;
    shared.note(format!(
        "ring v{v2} of {} applied by the five others {took} ms after the cut",
        members.len()
    ));
    ensure!(v2 == 2, "the reconfigured ring is v{v2}, not v2");
    ensure!(
        members.iter().cloned().collect::<BTreeSet<_>>() == expected,
        "ring v2 {members:?} is not v1 less the victim"
    );
    for &i in &others {
        let r = rings(&shared.since(i, &at_cut), job);
        ensure!(
            r.len() == 1,
            "{}: applied {r:?} after the cut, not exactly v2",
            node_name(i)
        );
    }

    // The victim's agent notices (HTTP/2 keep-alive) and keeps retrying.
    wait_for(
        "the victim sees its session end",
        Duration::from_millis(4 * KEEPALIVE_MS),
        || {
            shared
                .since(victim, &at_cut)
                .iter()
                .any(|(_, e)| matches!(e, AgentEvent::Disconnected { .. }))
                .then_some(())
        },
    )
    .await?;
    wait_for(
        "the victim retries at least twice",
        Duration::from_secs(10),
        || {
            (shared
                .since(victim, &at_cut)
                .iter()
                .filter(|(_, e)| matches!(e, AgentEvent::Reconnecting { .. }))
                .count()
                >= 2)
                .then_some(())
        },
    )
    .await?;
    let during = rings(&shared.since(victim, &at_cut), job);
    ensure!(
        during.is_empty(),
        "the partitioned victim applied a ring: {during:?}"
    );
    let nodes = list_nodes().await?;
    ensure!(
        nodes.get(&victim_id) == Some(&false),
        "while cut off the victim is listed {nodes:?}"
    );

    let healed = sim_ms();
    turmoil::repair(victim_host.as_str(), ORCH);
    shared.note(format!("t={healed} ms: repair {victim_host} | {ORCH}"));
    let limit =
        Duration::from_millis(BACKOFF_MAX_MS + CONNECT_TIMEOUT_MS + CALL_TIMEOUT_MS + 1_000);
    let regs = wait_for("the victim registers again", limit, || {
        let r = registrations(&shared.events_of(&victim_host));
        (r.len() >= 2).then_some(r)
    })
    .await?;
    shared.note(format!(
        "victim registered again {} ms after the repair",
        regs[1].0 - healed
    ));
    ensure!(
        regs.iter().map(|r| r.1).collect::<Vec<_>>() == [1, 2],
        "victim registrations {regs:?}"
    );
    let nodes = wait_for_all_alive().await?;
    ensure!(nodes.len() == NODES, "listed {nodes:?}");
    // No ring moved for the others after v2.
    for &i in &others {
        let r = rings(&shared.since(i, &at_cut), job);
        ensure!(r.len() == 1, "{}: rings after the cut {r:?}", node_name(i));
    }
    ensure_nothing_refused(&shared)
}

async fn wait_for_all_alive() -> SimResult<BTreeMap<String, bool>> {
    let start = tokio::time::Instant::now();
    loop {
        let nodes = list_nodes().await?;
        if nodes.len() == NODES && nodes.values().all(|a| *a) {
            return Ok(nodes);
        }
        if start.elapsed() > Duration::from_secs(3) {
            return Err(format!("t={} ms: not all alive: {nodes:?}", sim_ms()).into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

struct Run {
    elapsed: Duration,
    events: BTreeMap<String, Vec<(u64, AgentEvent)>>,
}

fn run_partition(seed: u64) -> Run {
    println!("turmoil partition sim: HANZOD_SEED={seed}");
    let keys = Arc::new(Keys::new(seed));
    let shared = Arc::new(Shared::default());
    let mut sim = build_sim(seed, &keys, daemon_config(&keys, 30_000), &shared);
    let (s, k) = (shared.clone(), keys.clone());
    sim.client(CTL, async move { partition_scenario(s, k).await });
    let result = drive(&mut sim, &shared);
    if result.is_err() || std::env::var_os("HANZOD_SIM_EVENTS").is_some() {
        print_events(&shared);
    }
    let elapsed = result.expect("partition scenario");
    println!("  simulated {elapsed:?}");
    let events = shared.events.lock().unwrap().clone();
    Run { elapsed, events }
}

#[test]
fn partition_then_repair() {
    let seed = seed();
    let a = run_partition(seed);
    let b = run_partition(seed);
    // The five nodes that were never cut off see exactly the same events at exactly the
    // same simulated times. The victim's sequence depends on its reconnect jitter (OS
    // random), so only what it saw is compared, not when or how often it retried.
    for i in (0..NODES).filter(|&i| i != 3) {
        let h = node_name(i);
        assert_eq!(
            normalized(&a.events[&h], true),
            normalized(&b.events[&h], true),
            "{h}: the same seed gave another event sequence"
        );
    }
    let settled = |r: &Run| -> Vec<String> {
        normalized(&r.events[&node_name(3)], false)
            .into_iter()
            .filter(|e| !e.starts_with("reconnecting") && e != "disconnected")
            .collect()
    };
    assert_eq!(settled(&a), settled(&b), "node-3: another sequence");
    println!("  two runs: {:?} and {:?} simulated", a.elapsed, b.elapsed);
}

// ---------------------------------------------------------------------------------------
// 2. The orchestrator crashes and restarts with empty state.
// ---------------------------------------------------------------------------------------

async fn restart_scenario(shared: Arc<Shared>, keys: Arc<Keys>) -> SimResult {
    await_registered(&shared, 1, Duration::from_secs(5)).await?;
    let job = submit("before-crash").await?;
    ensure!(job == 1, "first job has id {job}");
    let v1 = await_ring_v1(&shared, job, &[0; NODES]).await?;
    shared.note(format!(
        "ring v1 of {} applied everywhere by t={} ms",
        v1.len(),
        sim_ms()
    ));

    let crashed = sim_ms();
    let at_crash = shared.mark();
    shared.crash.store(true, Ordering::SeqCst);
    wait_for("the driver crashes orch", Duration::from_secs(1), || {
        (!shared.crash.load(Ordering::SeqCst)).then_some(())
    })
    .await?;
    shared.note(format!("t={crashed} ms: crash {ORCH}"));
    wait_for(
        "every agent sees its session end",
        Duration::from_millis(4 * KEEPALIVE_MS),
        || {
            (0..NODES)
                .all(|i| {
                    shared
                        .since(i, &at_crash)
                        .iter()
                        .any(|(_, e)| matches!(e, AgentEvent::Disconnected { .. }))
                })
                .then_some(())
        },
    )
    .await?;
    shared.note(format!("all six disconnected by t={} ms", sim_ms()));
    // Down for 8 s: every agent keeps retrying, its delays growing as the backoff says.
    tokio::time::sleep(Duration::from_secs(8)).await;
    for i in 0..NODES {
        let h = node_name(i);
        let tries: Vec<(u64, u32)> = shared
            .since(i, &at_crash)
            .iter()
            .filter_map(|(_, e)| match e {
                AgentEvent::Reconnecting { delay_ms, attempt } => Some((*delay_ms, *attempt)),
                _ => None,
            })
            .collect();
        ensure!(
            tries.len() >= 4,
            "{h}: only {} retries in 8 s: {tries:?}",
            tries.len()
        );
        for (n, (delay, attempt)) in tries.iter().enumerate() {
            ensure!(*attempt as usize == n + 1, "{h}: attempts {tries:?}");
            let cap = (BACKOFF_MIN_MS << (attempt - 1).min(20)).min(BACKOFF_MAX_MS);
            ensure!(
                (cap / 2..=cap).contains(delay),
                "{h}: attempt {attempt} waited {delay} ms, not in [{}, {cap}]",
                cap / 2
            );
        }
        ensure!(
            registrations(&shared.events_of(&h)).len() == 1,
            "{h} registered while orch was down"
        );
    }

    let bounced = sim_ms();
    shared.bounce.store(true, Ordering::SeqCst);
    shared.note(format!("t={bounced} ms: restart {ORCH} (empty state)"));
    await_registered(&shared, 2, Duration::from_millis(BACKOFF_MAX_MS + 3_000)).await?;
    shared.note(format!(
        "all six registered again {} ms after the restart",
        sim_ms() - bounced
    ));
    for i in 0..NODES {
        let r = registrations(&shared.events_of(&node_name(i)));
        // A fresh orchestrator has never seen these keys.
        ensure!(
            r.len() == 2 && r[1].1 == 1,
            "{}: registrations {r:?}",
            node_name(i)
        );
    }
    let nodes = wait_for_all_alive().await?;
    let ids: BTreeSet<String> = (0..NODES).map(|i| keys.node_hex(i)).collect();
    ensure!(
        nodes.keys().cloned().collect::<BTreeSet<_>>() == ids,
        "the restarted orchestrator lists {nodes:?}"
    );

    // The new log numbers jobs and rings from 1 again: the same (job 1, v1) the agents held
    // before. They dropped what they held when log_id changed, so they apply it.
    let after = shared.mark();
    let job2 = submit("after-restart").await?;
    ensure!(
        job2 == job,
        "the fresh log's first job has id {job2}, not {job}"
    );
    let members = await_ring_v1(&shared, job2, &after).await?;
    shared.note(format!(
        "new job {job2}: ring v1 applied everywhere by t={} ms",
        sim_ms()
    ));
    ensure!(
        members.iter().cloned().collect::<BTreeSet<_>>() == ids,
        "new ring {members:?}"
    );
    for i in 0..NODES {
        let h = node_name(i);
        let ignored: Vec<_> = shared
            .since(i, &after)
            .into_iter()
            .filter(|(_, e)| matches!(e, AgentEvent::RingIgnored { .. }))
            .collect();
        ensure!(ignored.is_empty(), "{h} ignored {ignored:?}");
    }
    // Held two more heartbeat timeouts: the rejoined nodes stay alive and nothing they
    // send is refused.
    tokio::time::sleep(Duration::from_millis(2 * HEARTBEAT_TIMEOUT_MS)).await;
    let nodes = list_nodes().await?;
    ensure!(nodes.values().all(|a| *a), "after 6 s: {nodes:?}");
    ensure_nothing_refused(&shared)
}

fn run_restart(seed: u64) -> Run {
    println!("turmoil restart sim: HANZOD_SEED={seed}");
    let keys = Arc::new(Keys::new(seed));
    let shared = Arc::new(Shared::default());
    // Every host reads the simulation's clock (SimClock), so the restarted daemon's replay
    // window (the default ±30 s) accepts the agents' heartbeats at once.
    let mut sim = build_sim(seed, &keys, daemon_config(&keys, 30_000), &shared);
    let (s, k) = (shared.clone(), keys.clone());
    sim.client(CTL, async move { restart_scenario(s, k).await });
    let result = drive(&mut sim, &shared);
    if result.is_err() || std::env::var_os("HANZOD_SIM_EVENTS").is_some() {
        print_events(&shared);
    }
    let elapsed = result.expect("restart scenario");
    println!("  simulated {elapsed:?}");
    let events = shared.events.lock().unwrap().clone();
    Run { elapsed, events }
}

#[test]
fn crashed_orchestrator_restarts_empty_and_agents_rejoin() {
    let seed = seed();
    let a = run_restart(seed);
    let b = run_restart(seed);
    // Up to the crash every agent sees the same events at the same simulated times. After
    // it, timing is not reproducible: reconnect jitter comes from the OS random source, and
    // even the instant the crash reaches each agent varies by some ms between runs (how
    // the dying runtime's connections close depends on state the seed does not fix, such
    // as tokio's scheduling RNG, which turmoil seeds only under `--cfg tokio_unstable`). So
    // after the crash what is compared is the sequence of what each agent saw, without the
    // retries.
    for i in 0..NODES {
        let h = node_name(i);
        let until_crash = |r: &Run| -> Vec<String> {
            normalized(&r.events[&h], true)
                .into_iter()
                .take_while(|e| !e.ends_with("disconnected"))
                .collect()
        };
        assert_eq!(
            until_crash(&a),
            until_crash(&b),
            "{h}: the same seed gave another timed sequence before the crash"
        );
        let settled = |r: &Run| -> Vec<String> {
            normalized(&r.events[&h], false)
                .into_iter()
                .filter(|e| !e.starts_with("reconnecting") && e != "disconnected")
                .collect()
        };
        assert_eq!(
            settled(&a),
            settled(&b),
            "{h}: the same seed gave another sequence"
        );
    }
    println!("  two runs: {:?} and {:?} simulated", a.elapsed, b.elapsed);
}
