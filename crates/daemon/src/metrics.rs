//! Prometheus metrics: the [`Metrics`] port backed by a `prometheus-client` registry, and
//! the HTTP exporter that serves it.
//!
//! [`PrometheusMetrics`] owns one [`Registry`] per instance (never a process-global), so two
//! orchestrators in one process, or two tests, keep separate figures. Every metric name is
//! prefixed with `hanzod_`.
//!
//! # Counters
//!
//! Each counter the core or the gRPC transport reports (`incr(name, label, by)`, `name` one
//! of the closed set [`CounterName`], `hanzod_actors::ports::Counter`) is a family with one
//! label, whose key depends on the counter:
//!
//! | exposed series | label values | meaning |
//! |---|---|---|
//! | `hanzod_heartbeats_total{outcome}` | `accepted` or the refusal reason (`unknown_node`, `failed`, `stale_sequence`, `outside_window`, `invalid`) | heartbeats handled |
//! | `hanzod_registrations_total{outcome}` | `accepted` or the refusal reason (`insufficient_stake`, `unknown_node`, `unbound`, `chain_unavailable`, `store`, `invalid`) | registrations handled |
//! | `hanzod_node_failures_total{kind}` | `heartbeat_timeout`, `session_closed`, `actor_crashed` | nodes declared failed |
//! | `hanzod_ring_changes_total{change}` | `formed`, `reconfigured` | ring versions recorded |
//! | `hanzod_job_transitions_total{phase}` | the phase entered (`Pending`, `Provisioning`, `Running`, `Aggregating`, `Published`, `Failed`) | job state-machine transitions |
//! | `hanzod_actor_restarts_total{actor}` | `node`, `job`, `ring` or the subsystem | supervisor rebuilds |
//! | `hanzod_rejected_messages_total{reason}` | the rejection reason | gRPC messages refused by the transport |
//! | `hanzod_session_messages_total{kind}` | the message kind | messages received on node sessions |
//! | `hanzod_sessions_total{event}` | `opened`, `closed` | node sessions opened and closed |
//! | `hanzod_deltas_total{outcome}` | `accepted` or the refusal reason (`timeout`, `hash_mismatch`, `bad_signature`, `non_finite`, `stale_base`, `conflicting`, …; see `grpc::upload`) | delta uploads handled |
//! | `hanzod_delta_bytes_received_total{outcome}` | as `hanzod_deltas_total` | payload bytes received by delta uploads, by the upload's outcome |
//! | `hanzod_deltas_validated_total{outcome}` | `accepted` or the rejection reason (`signature`, `wrong_step`, `format`, `stale_base`, `spot_check_loss`, `spot_check_replay`, …; see `delta::validate::Rejection::label`) | deltas judged at aggregation |
//! | `hanzod_spot_checks_total{outcome}` | `passed`, `failed` | spot-checks run (DESIGN §6) |
//! | `hanzod_merges_total{aggregator}` | `weighted_mean`, `median`, `kept` | epochs merged, by aggregator |
//! | `hanzod_rewards_milli_gym_total{outcome}` | `paid` | epoch rewards paid, thousandths of a GYM |
//! | `hanzod_slashes_total{outcome}` | `applied` | slashes for failed spot-checks |
//! | `hanzod_registry_refusals_total{outcome}` | `refused` | checkpoints the model registry refused |
//! | `hanzod_registry_failures_total{outcome}` | `transient` | repo pushes that failed transiently (retried from the journal) |
//! | `hanzod_metrics_errors_total{kind}` | `non_finite_observation`, `sample_timeout` | misuse of this sink and slow scrapes (see below) |
//!
//! Every counter is declared: a name outside [`CounterName`] cannot be reported.
//!
//! # Histograms (seconds; the closed set [`HistogramName`])
//!
//! * `hanzod_ring_repair_seconds`: first failure reported to the ring actor → new ring
//!   recorded (a lone failure at once; one held by an open coalescing window up to the
//!   window more). Buckets 1 ms … 60 s.
//! * `hanzod_heartbeat_handling_seconds`: time the transport spends handling one heartbeat.
//!   Buckets 10 µs … 10 s.
//!
//! * `hanzod_publish_stage_seconds`, `hanzod_publish_push_seconds`,
//!   `hanzod_publish_record_seconds`: one epoch's publication (DESIGN §7, paper Table
//!   "Publication"): adding the checkpoint to the object store (IPFS) and staging it; pinning
//!   it and pushing the repo (the Hub); recording the signed record on the ledger.
//!   Decade buckets from 1 µs to 100 000 s.
//!
//! NaN and infinite samples are dropped and counted in
//! `hanzod_metrics_errors_total{kind="non_finite_observation"}`.
//!
//! # Gauges (counts, sampled at scrape time)
//!
//! * `hanzod_nodes{state}`: `alive`, `failed`, `assigned` (see [`PrometheusMetrics::set_nodes`]).
//! * `hanzod_jobs{state}`: `pending`, `provisioning`, `running`, `aggregating`, `published`,
//!   `failed` (see [`PrometheusMetrics::set_jobs`]).
//!
//! * `hanzod_leader`: 1 while this replica serves nodes, 0 on a standby.
//! * `hanzod_lease_token`: the fencing token it writes under (0 without a lease).
//! * `hanzod_state_store_up`: 1 while the state store answers.
//! * `hanzod_state_store_errors_total`, `hanzod_state_store_retries_total` (counters):
//!   failed and retried state store commands (DESIGN §9).
//!
//! Every state is always exported, zeros included, so series never vanish.
//!
//! # Exporter
//!
//! [`serve`] answers `GET /metrics` (OpenMetrics text, after refreshing the gauges through
//! the `sample` callback) and `GET /healthz`.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use futures_util::future::BoxFuture;
use hanzod_actors::ports::{Counter as CounterName, Histogram as HistogramName, Metrics};

use crate::health::Health;
use prometheus_client::encoding::text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use tokio::net::TcpListener;

/// The prefix of every metric name (`hanzod_heartbeats_total`, …).
pub const PREFIX: &str = "hanzod";

/// The content type of [`PrometheusMetrics::encode`]'s output, as served on `/metrics`.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// How long `GET /metrics` waits for the `sample` callback of [`serve`] before answering
/// with the gauges it already has (and counting `hanzod_metrics_errors_total{kind="sample_timeout"}`).
pub const SAMPLE_TIMEOUT: Duration = Duration::from_secs(5);

/// Upper bounds of `hanzod_ring_repair_seconds`, in seconds (1 ms … 60 s).
pub const RING_REPAIR_BUCKETS: [f64; 15] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Upper bounds of `hanzod_heartbeat_handling_seconds`, in seconds (10 µs … 10 s).
pub const HEARTBEAT_HANDLING_BUCKETS: [f64; 19] = [
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.0025, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Upper bounds of the publication histograms (`publish_*_seconds`), seconds: decades from
/// 1 µs to 100 000 s.
pub const GENERIC_BUCKETS: [f64; 12] = [
    1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0, 1e3, 1e4, 1e5,
];

/// The `state` values of `hanzod_nodes`, in export order.
pub const NODE_STATES: [&str; 3] = ["alive", "failed", "assigned"];

/// The `state` values of `hanzod_jobs`, in export order (the job phases, lowercase).
pub const JOB_STATES: [&str; 6] = [
    "pending",
    "provisioning",
    "running",
    "aggregating",
    "published",
    "failed",
];

/// One label `key="value"`: every counter family here has exactly one.
type Labels = [(&'static str, String); 1];
/// The `state` label of the gauges.
type StateLabels = [(&'static str, &'static str); 1];

/// Fetches `http://{addr}/metrics` (HTTP/1.0, no client library needed) and returns the
/// body. `addr` is `host:port`.
pub async fn scrape(addr: &str) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut text = String::new();
    s.read_to_string(&mut text).await?;
    Ok(text
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or(text))
}

/// The samples of an OpenMetrics text: `name{labels}` → value (comments skipped).
pub fn parse_samples(text: &str) -> std::collections::HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// This process's resident memory in bytes (`VmRSS` of `/proc/self/status`); `None` where
/// that file does not exist (not Linux).
pub fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Job counts by state, for [`PrometheusMetrics::set_jobs`]: `hanzod_jobs{state}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JobCounts {
    /// Jobs waiting for nodes.
    pub pending: u64,
    /// Jobs whose nodes are being prepared (model distributed, ring formed).
    pub provisioning: u64,
    /// Jobs training.
    pub running: u64,
    /// Jobs merging an epoch's deltas.
    pub aggregating: u64,
    /// Jobs finished with a published checkpoint.
    pub published: u64,
    /// Jobs that failed or were cancelled.
    pub failed: u64,
}

impl JobCounts {
    /// Counts one job in phase `phase` (a [`JOB_STATES`] value, in any case, e.g. the core's
    /// `JobPhase::name()` "Running"). Returns false, counting nothing, for another name.
    pub fn add_phase(&mut self, phase: &str) -> bool {
        let slot = match phase.to_ascii_lowercase().as_str() {
            "pending" => &mut self.pending,
            "provisioning" => &mut self.provisioning,
            "running" => &mut self.running,
            "aggregating" => &mut self.aggregating,
            "published" => &mut self.published,
            "failed" => &mut self.failed,
            _ => return false,
        };
        *slot += 1;
        true
    }

    /// The counts in [`JOB_STATES`] order.
    pub fn by_state(&self) -> [(&'static str, u64); 6] {
        [
            ("pending", self.pending),
            ("provisioning", self.provisioning),
            ("running", self.running),
            ("aggregating", self.aggregating),
            ("published", self.published),
            ("failed", self.failed),
        ]
    }
}

/// The [`Metrics`] port backed by a Prometheus registry of its own (see the module docs
/// for every metric, its unit and its labels).
///
/// [`Metrics::incr`] and [`Metrics::observe`] take no lock of this type: a counter family
/// takes its own read lock (a write lock only the first time a label value is seen), a
/// histogram a short mutex.
pub struct PrometheusMetrics {
    registry: Mutex<Registry>,
    /// Indexed by [`CounterName`] (`as usize`), in the order of [`CounterName::ALL`].
    counters: Vec<Family<Labels, Counter>>,
    /// Indexed by [`HistogramName`] (`as usize`), in the order of [`HistogramName::ALL`].
    histograms: Vec<Histogram>,
    nodes: Family<StateLabels, Gauge>,
    jobs: Family<StateLabels, Gauge>,
    rss: Gauge,
    errors: Family<Labels, Counter>,
    replica: ReplicaGauges,
}

/// The replica's role and its state store's health, sampled at scrape time.
#[derive(Default)]
struct ReplicaGauges {
    leader: Gauge,
    token: Gauge,
    store_up: Gauge,
    store_errors: Counter,
    store_retries: Counter,
}

impl std::fmt::Debug for PrometheusMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrometheusMetrics")
            .field("prefix", &PREFIX)
            .finish_non_exhaustive()
    }
}

impl Default for PrometheusMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl PrometheusMetrics {
    /// Refreshes the `hanzod_nodes` and `hanzod_jobs` gauges from a running orchestrator
    /// (what the daemon's exporter runs before each scrape). A failed read keeps the previous
    /// values.
    pub async fn sample_from(&self, orch: &hanzod_actors::OrchestratorHandle) {
        if let Ok(nodes) = orch.nodes().await {
            let alive = nodes.iter().filter(|n| n.alive).count() as u64;
            let assigned = nodes.iter().filter(|n| n.assigned.is_some()).count() as u64;
            self.set_nodes(alive, nodes.len() as u64 - alive, assigned);
        }
        if let Ok(jobs) = orch.jobs().await {
            let mut counts = JobCounts::default();
            for job in &jobs {
                counts.add_phase(job.phase.name());
            }
            self.set_jobs(&counts);
        }
        if let Some(rss) = resident_bytes() {
            self.rss.set(gauge(rss));
        }
    }

    /// A fresh registry with every declared metric registered (counters at no series yet,
    /// histograms empty, every gauge state at 0).
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix(PREFIX);

        let counters = CounterName::ALL
            .iter()
            .map(|c| {
                let family = Family::<Labels, Counter>::default();
                registry.register(c.name(), c.help(), family.clone());
                family
            })
            .collect();

        let histograms = HistogramName::ALL
            .iter()
            .map(|h| {
                let histogram = match h {
                    HistogramName::RingRepairSeconds => Histogram::new(RING_REPAIR_BUCKETS),
                    HistogramName::HeartbeatHandlingSeconds => {
                        Histogram::new(HEARTBEAT_HANDLING_BUCKETS)
                    }
                    _ => Histogram::new(GENERIC_BUCKETS),
                };
                let stem = h.name().strip_suffix("_seconds").unwrap_or(h.name());
                registry.register_with_unit(stem, h.help(), Unit::Seconds, histogram.clone());
                histogram
            })
            .collect();
        let rss = Gauge::default();
        registry.register_with_unit(
            "process_resident_memory",
            "Resident memory of the daemon process (Linux: VmRSS of /proc/self/status), sampled at scrape",
            Unit::Bytes,
            rss.clone(),
        );

        let nodes = Family::<StateLabels, Gauge>::default();
        registry.register(
            "nodes",
            "Registered nodes by state, sampled at scrape time: alive, failed (declared \
             failed), assigned (working for a job; overlaps alive)",
            nodes.clone(),
        );
        let jobs = Family::<StateLabels, Gauge>::default();
        registry.register(
            "jobs",
            "Jobs by phase, sampled at scrape time",
            jobs.clone(),
        );

        let errors = Family::<Labels, Counter>::default();
        registry.register(
            "metrics_errors",
            "Metric reports dropped (non_finite_observation) and scrapes \
             answered with stale gauges (sample_timeout)",
            errors.clone(),
        );

        let replica = ReplicaGauges::default();
        registry.register(
            "leader",
            "1 while this replica serves nodes (the leader, or a daemon without replicas), 0 \
             on a standby",
            replica.leader.clone(),
        );
        registry.register(
            "lease_token",
            "The fencing token this replica writes under (0 without a lease)",
            replica.token.clone(),
        );
        registry.register(
            "state_store_up",
            "1 while the state store answers, 0 while it is unreachable",
            replica.store_up.clone(),
        );
        registry.register(
            "state_store_errors",
            "State store commands that failed (connection refused, timeout), since start",
            replica.store_errors.clone(),
        );
        registry.register(
            "state_store_retries",
            "State store commands retried after a failure, since start",
            replica.store_retries.clone(),
        );

        let this = PrometheusMetrics {
            registry: Mutex::new(registry),
            counters,
            histograms,
            nodes,
            jobs,
            rss,
            errors,
            replica,
        };
        this.set_nodes(0, 0, 0);
        this.set_jobs(&JobCounts::default());
        this
    }

    /// Sets `hanzod_nodes{state}`: `alive` nodes (not declared failed), `failed` nodes
    /// (declared failed: heartbeat timeout, session closed, actor crashed) and `assigned`
    /// nodes (working for a job; they are counted in `alive` too, so don't sum the three).
    pub fn set_nodes(&self, alive: u64, failed: u64, assigned: u64) {
        for (state, value) in NODE_STATES.into_iter().zip([alive, failed, assigned]) {
            self.nodes
                .get_or_create(&[("state", state)])
                .set(gauge(value));
        }
    }

    /// Sets `hanzod_leader`, `hanzod_lease_token`, `hanzod_state_store_up` and the state
    /// store's error and retry counters from `health` (the counters follow the adapter's
    /// totals; they never go down).
    pub fn set_replica(&self, health: &Health) {
        let r = &self.replica;
        r.leader.set(i64::from(health.role().serves()));
        r.token.set(gauge(health.token()));
        let store = health.store().unwrap_or(crate::health::StoreHealth {
            reachable: true,
            ..Default::default()
        });
        r.store_up.set(i64::from(store.reachable));
        let bump = |c: &Counter, total: u64| {
            let seen = c.get();
            if total > seen {
                c.inc_by(total - seen);
            }
        };
        bump(&r.store_errors, store.errors_total);
        bump(&r.store_retries, store.retries_total);
    }

    /// Sets `hanzod_jobs{state}` for every job state (a state at 0 is exported as 0).
    pub fn set_jobs(&self, counts: &JobCounts) {
        for (state, value) in counts.by_state() {
            self.jobs
                .get_or_create(&[("state", state)])
                .set(gauge(value));
        }
    }

    /// Every metric in the OpenMetrics text format (ending with `# EOF`), served with
    /// [`CONTENT_TYPE`].
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(8 * 1024);
        let registry = self.registry.lock().unwrap_or_else(PoisonError::into_inner);
        // Writing into a String cannot fail; on an encoder error the partial text is
        // still the best answer a scrape can get.
        let _ = text::encode(&mut out, &registry);
        out
    }

    fn error(&self, kind: &'static str) {
        self.errors
            .get_or_create(&[("kind", kind.to_owned())])
            .inc();
    }
}

impl Metrics for PrometheusMetrics {
    fn incr(&self, name: CounterName, label: &str, by: u64) {
        self.counters[name as usize]
            .get_or_create(&[(name.label_key(), label.to_owned())])
            .inc_by(by);
    }

    fn observe(&self, name: HistogramName, value: f64) {
        if !value.is_finite() {
            self.error("non_finite_observation");
            return;
        }
        self.histograms[name as usize].observe(value);
    }
}

fn gauge(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

type Sampler = dyn Fn() -> BoxFuture<'static, ()> + Send + Sync;

struct Exporter {
    metrics: Arc<PrometheusMetrics>,
    sample: Box<Sampler>,
    sample_timeout: Duration,
    health: Health,
}

/// Serves the metrics over HTTP/1.1 on `listener` until `shutdown` completes (then stops
/// accepting, lets open requests finish, and returns `Ok`).
///
/// * `GET /metrics`: awaits `sample()` (the daemon refreshes the gauges there, e.g. with
///   [`PrometheusMetrics::set_nodes`] and [`PrometheusMetrics::set_jobs`] from the
///   orchestrator), at most [`SAMPLE_TIMEOUT`], then answers 200 with
///   [`PrometheusMetrics::encode`] as [`CONTENT_TYPE`].
/// * `GET /healthz`: 200 with `health`'s JSON [`crate::health::Report`] (liveness).
/// * `GET /readyz`: 200 `ready` when the replica serves nodes and its state store answers,
///   else 503 with the reason (see [`crate::health`]).
/// * any other path: 404.
///
/// Taking a bound listener (not an address) lets the caller bind port 0 and read the port.
/// Errors: only those of accepting connections, as `axum::serve` reports them.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<PrometheusMetrics>,
    health: Health,
    sample: impl Fn() -> BoxFuture<'static, ()> + Send + Sync + 'static,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with_timeout(listener, metrics, health, sample, shutdown, SAMPLE_TIMEOUT).await
}

async fn serve_with_timeout(
    listener: TcpListener,
    metrics: Arc<PrometheusMetrics>,
    health: Health,
    sample: impl Fn() -> BoxFuture<'static, ()> + Send + Sync + 'static,
    shutdown: impl Future<Output = ()> + Send + 'static,
    sample_timeout: Duration,
) -> std::io::Result<()> {
    let exporter = Arc::new(Exporter {
        metrics,
        sample: Box::new(sample),
        sample_timeout,
        health,
    });
    let app = Router::new()
        .route("/metrics", get(handle_scrape))
        .route(
            "/healthz",
            get(|State(e): State<Arc<Exporter>>| async move {
                (
                    [(header::CONTENT_TYPE, "application/json")],
                    serde_json::to_string(&e.health.report()).unwrap_or_default(),
                )
            }),
        )
        .route(
            "/readyz",
            get(|State(e): State<Arc<Exporter>>| async move {
                match e.health.ready() {
                    Ok(()) => (StatusCode::OK, "ready".to_string()),
                    Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, reason.to_string()),
                }
            }),
        )
        .fallback(|| async { (StatusCode::NOT_FOUND, "not found") })
        .with_state(exporter);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

async fn handle_scrape(State(exporter): State<Arc<Exporter>>) -> impl IntoResponse {
    if tokio::time::timeout(exporter.sample_timeout, (exporter.sample)())
        .await
        .is_err()
    {
        exporter.metrics.error("sample_timeout");
    }
    exporter.metrics.set_replica(&exporter.health);
    (
        [(header::CONTENT_TYPE, CONTENT_TYPE)],
        exporter.metrics.encode(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Every sample of an exposition: `series` (name plus labels as written) → value.
    fn samples(text: &str) -> HashMap<String, f64> {
        assert!(text.ends_with("# EOF\n"), "no EOF marker: {text}");
        text.lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| {
                let (series, value) = l.rsplit_once(' ').expect("sample line");
                let value = value.parse::<f64>().unwrap_or_else(|e| panic!("{l}: {e}"));
                (series.to_owned(), value)
            })
            .collect()
    }

    fn value(text: &str, series: &str) -> f64 {
        *samples(text)
            .get(series)
            .unwrap_or_else(|| panic!("no series {series} in\n{text}"))
    }

    /// Each `# TYPE` line names a distinct family (a duplicate breaks every scraper).
    fn assert_families_unique(text: &str) -> Vec<String> {
        let types: Vec<String> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| l.to_owned())
            .collect();
        let mut names: Vec<&str> = types.iter().map(|t| t.split(' ').next().unwrap()).collect();
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n, "duplicate families in\n{text}");
        types
    }

    #[test]
    fn counters_show_up_with_their_label_keys() {
        let m = PrometheusMetrics::new();
        m.incr(CounterName::Heartbeats, "accepted", 1);
        m.incr(CounterName::Heartbeats, "accepted", 2);
        m.incr(CounterName::Heartbeats, "stale_sequence", 1);
        m.incr(CounterName::Registrations, "unbound", 1);
        m.incr(CounterName::NodeFailures, "heartbeat_timeout", 4);
        m.incr(CounterName::RingChanges, "formed", 1);
        m.incr(CounterName::JobTransitions, "Running", 1);
        m.incr(CounterName::ActorRestarts, "ring", 1);
        m.incr(CounterName::RejectedMessages, "bad_signature", 7);
        m.incr(CounterName::SessionMessages, "heartbeat", 5);
        m.incr(CounterName::Sessions, "opened", 2);
        m.incr(CounterName::Sessions, "closed", 1);
        let t = m.encode();
        let types = assert_families_unique(&t);
        assert!(
            types.contains(&"hanzod_heartbeats counter".to_owned()),
            "{types:?}"
        );
        assert_eq!(
            value(&t, r#"hanzod_heartbeats_total{outcome="accepted"}"#),
            3.0
        );
        assert_eq!(
            value(&t, r#"hanzod_heartbeats_total{outcome="stale_sequence"}"#),
            1.0
        );
        assert_eq!(
            value(&t, r#"hanzod_registrations_total{outcome="unbound"}"#),
            1.0
        );
        assert_eq!(
            value(
                &t,
                r#"hanzod_node_failures_total{kind="heartbeat_timeout"}"#
            ),
            4.0
        );
        assert_eq!(
            value(&t, r#"hanzod_ring_changes_total{change="formed"}"#),
            1.0
        );
        assert_eq!(
            value(&t, r#"hanzod_job_transitions_total{phase="Running"}"#),
            1.0
        );
        assert_eq!(
            value(&t, r#"hanzod_actor_restarts_total{actor="ring"}"#),
            1.0
        );
        assert_eq!(
            value(
                &t,
                r#"hanzod_rejected_messages_total{reason="bad_signature"}"#
            ),
            7.0
        );
        assert_eq!(
            value(&t, r#"hanzod_session_messages_total{kind="heartbeat"}"#),
            5.0
        );
        assert_eq!(value(&t, r#"hanzod_sessions_total{event="opened"}"#), 2.0);
        assert_eq!(value(&t, r#"hanzod_sessions_total{event="closed"}"#), 1.0);
    }

    #[test]
    fn histograms_count_into_the_right_buckets() {
        let m = PrometheusMetrics::new();
        for v in [0.0005, 0.003, 0.2, 45.0, 120.0] {
            m.observe(HistogramName::RingRepairSeconds, v);
        }
        m.observe(HistogramName::HeartbeatHandlingSeconds, 0.000_02);
        m.observe(HistogramName::HeartbeatHandlingSeconds, 0.002);
        let t = m.encode();
        let types = assert_families_unique(&t);
        assert!(types.contains(&"hanzod_ring_repair_seconds histogram".to_owned()));
        assert!(
            t.contains("# UNIT hanzod_ring_repair_seconds seconds\n"),
            "{t}"
        );

        let s = samples(&t);
        let bucket = |name: &str, le: f64| -> f64 {
            // `le` is written as the encoder formats floats; compare numerically.
            s.iter()
                .find_map(|(k, v)| {
                    let rest = k.strip_prefix(&format!("{name}_bucket{{le=\""))?;
                    let bound = rest.strip_suffix("\"}")?;
                    let bound = if bound == "+Inf" {
                        f64::INFINITY
                    } else {
                        bound.parse::<f64>().ok()?
                    };
                    (bound == le).then_some(*v)
                })
                .unwrap_or_else(|| panic!("no bucket {name} le={le} in\n{t}"))
        };
        let rr = "hanzod_ring_repair_seconds";
        assert_eq!(bucket(rr, 0.001), 1.0);
        assert_eq!(bucket(rr, 0.005), 2.0);
        assert_eq!(bucket(rr, 0.25), 3.0);
        assert_eq!(bucket(rr, 30.0), 3.0);
        assert_eq!(bucket(rr, 60.0), 4.0);
        assert_eq!(bucket(rr, f64::INFINITY), 5.0);
        assert_eq!(value(&t, "hanzod_ring_repair_seconds_count"), 5.0);
        let sum = value(&t, "hanzod_ring_repair_seconds_sum");
        assert!((sum - 165.2035).abs() < 1e-9, "sum {sum}");

        let hb = "hanzod_heartbeat_handling_seconds";
        assert_eq!(bucket(hb, 0.000_01), 0.0);
        assert_eq!(bucket(hb, 0.000_025), 1.0);
        assert_eq!(bucket(hb, 0.0025), 2.0);
        assert_eq!(value(&t, "hanzod_heartbeat_handling_seconds_count"), 2.0);
        // Every finite bound + the +Inf bucket.
        assert_eq!(
            s.keys()
                .filter(|k| k.starts_with("hanzod_heartbeat_handling_seconds_bucket"))
                .count(),
            HEARTBEAT_HANDLING_BUCKETS.len() + 1
        );
    }

    #[test]
    fn gauges_export_every_state_including_zeros() {
        let m = PrometheusMetrics::new();
        let t = m.encode();
        for state in NODE_STATES {
            assert_eq!(
                value(&t, &format!("hanzod_nodes{{state=\"{state}\"}}")),
                0.0
            );
        }
        for state in JOB_STATES {
            assert_eq!(value(&t, &format!("hanzod_jobs{{state=\"{state}\"}}")), 0.0);
        }

        m.set_nodes(7, 2, 5);
        let mut jobs = JobCounts::default();
        for phase in ["Running", "running", "Pending", "Published"] {
            assert!(jobs.add_phase(phase));
        }
        assert!(!jobs.add_phase("Exploded"));
        m.set_jobs(&jobs);
        let t = m.encode();
        assert_eq!(value(&t, r#"hanzod_nodes{state="alive"}"#), 7.0);
        assert_eq!(value(&t, r#"hanzod_nodes{state="failed"}"#), 2.0);
        assert_eq!(value(&t, r#"hanzod_nodes{state="assigned"}"#), 5.0);
        assert_eq!(value(&t, r#"hanzod_jobs{state="running"}"#), 2.0);
        assert_eq!(value(&t, r#"hanzod_jobs{state="pending"}"#), 1.0);
        assert_eq!(value(&t, r#"hanzod_jobs{state="published"}"#), 1.0);
        assert_eq!(value(&t, r#"hanzod_jobs{state="provisioning"}"#), 0.0);
        assert_eq!(value(&t, r#"hanzod_jobs{state="failed"}"#), 0.0);

        // Going back to zero keeps the series, at 0.
        m.set_nodes(0, 0, 0);
        m.set_jobs(&JobCounts::default());
        let t = m.encode();
        assert_eq!(value(&t, r#"hanzod_nodes{state="alive"}"#), 0.0);
        assert_eq!(value(&t, r#"hanzod_jobs{state="running"}"#), 0.0);
        assert_eq!(value(&t, r#"hanzod_nodes{state="assigned"}"#), 0.0);

        // A count beyond i64 saturates instead of wrapping negative.
        m.set_nodes(u64::MAX, 0, 0);
        assert_eq!(
            value(&m.encode(), r#"hanzod_nodes{state="alive"}"#),
            i64::MAX as f64
        );
    }

    /// The exporter finds a family by `name as usize`: `ALL` lists every variant in
    /// declaration order.
    #[test]
    fn every_name_indexes_its_own_family() {
        for (i, c) in CounterName::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i, "{c:?}");
        }
        for (i, h) in HistogramName::ALL.iter().enumerate() {
            assert_eq!(*h as usize, i, "{h:?}");
        }
    }

    /// Every declared counter and histogram is exported once, with its label key and unit
    /// (including `registry_failures`, which was once counted without being declared), and
    /// non-finite samples are dropped and counted.
    #[test]
    fn every_declared_metric_is_exported_and_non_finite_samples_are_dropped() {
        let m = PrometheusMetrics::new();
        for c in CounterName::ALL {
            m.incr(c, "x", 2);
        }
        for h in HistogramName::ALL {
            m.observe(h, 0.5);
        }
        m.observe(HistogramName::PublishPushSeconds, f64::NAN);
        m.observe(HistogramName::RingRepairSeconds, f64::INFINITY);

        let t = m.encode();
        let types = assert_families_unique(&t);
        for c in CounterName::ALL {
            let series = format!("hanzod_{}_total{{{}=\"x\"}}", c.name(), c.label_key());
            assert_eq!(value(&t, &series), 2.0, "{series}");
        }
        for h in HistogramName::ALL {
            let family = format!("hanzod_{}", h.name());
            assert!(types.contains(&format!("{family} histogram")), "{types:?}");
            assert!(
                t.contains(&format!("# UNIT {family} seconds\n")),
                "{family}"
            );
            assert_eq!(value(&t, &format!("{family}_count")), 1.0, "{family}");
        }
        assert_eq!(
            value(&t, r#"hanzod_registry_failures_total{outcome="x"}"#),
            2.0
        );
        assert_eq!(
            value(
                &t,
                r#"hanzod_metrics_errors_total{kind="non_finite_observation"}"#
            ),
            2.0
        );
    }

    #[test]
    fn two_instances_keep_separate_figures() {
        let a = PrometheusMetrics::new();
        let b = PrometheusMetrics::new();
        a.incr(CounterName::Heartbeats, "accepted", 5);
        b.incr(CounterName::Heartbeats, "accepted", 1);
        a.incr(CounterName::Merges, "x", 1);
        b.observe(HistogramName::RingRepairSeconds, 1.0);
        let (ta, tb) = (a.encode(), b.encode());
        assert_eq!(
            value(&ta, r#"hanzod_heartbeats_total{outcome="accepted"}"#),
            5.0
        );
        assert_eq!(
            value(&tb, r#"hanzod_heartbeats_total{outcome="accepted"}"#),
            1.0
        );
        assert_eq!(value(&ta, r#"hanzod_merges_total{aggregator="x"}"#), 1.0);
        assert!(!samples(&tb)
            .keys()
            .any(|k| k.contains("hanzod_merges_total{")));
        assert_eq!(value(&ta, "hanzod_ring_repair_seconds_count"), 0.0);
        assert_eq!(value(&tb, "hanzod_ring_repair_seconds_count"), 1.0);
    }

    #[test]
    fn concurrent_increments_are_all_counted() {
        let m2 = Arc::new(PrometheusMetrics::new());
        // The core holds it as `Arc<dyn Metrics>`.
        let core: Arc<dyn Metrics> = m2.clone();
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let m = core.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        m.incr(
                            CounterName::Heartbeats,
                            if i % 2 == 0 { "accepted" } else { "failed" },
                            1,
                        );
                        m.incr(CounterName::Sessions, "x", 1);
                        m.observe(HistogramName::HeartbeatHandlingSeconds, 0.0001);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let t = m2.encode();
        assert_eq!(
            value(&t, r#"hanzod_heartbeats_total{outcome="accepted"}"#),
            4000.0
        );
        assert_eq!(
            value(&t, r#"hanzod_heartbeats_total{outcome="failed"}"#),
            4000.0
        );
        assert_eq!(value(&t, r#"hanzod_sessions_total{event="x"}"#), 8000.0);
        assert_eq!(value(&t, "hanzod_heartbeat_handling_seconds_count"), 8000.0);
    }

    /// One HTTP/1.1 GET over a fresh connection: (status, headers lowercased, body).
    async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String, String) {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.unwrap();
        let raw = String::from_utf8(raw).unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").expect("response head");
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .expect("status code");
        let headers = head.to_ascii_lowercase();
        let body = if headers.contains("transfer-encoding: chunked") {
            dechunk(body)
        } else {
            body.to_owned()
        };
        (status, headers, body)
    }

    fn dechunk(mut body: &str) -> String {
        let mut out = String::new();
        loop {
            let (size, rest) = body.split_once("\r\n").expect("chunk size");
            let size = usize::from_str_radix(size.trim(), 16).expect("hex chunk size");
            if size == 0 {
                return out;
            }
            out.push_str(&rest[..size]);
            body = &rest[size + 2..];
        }
    }

    #[tokio::test]
    async fn loopback_scrape_samples_then_serves_openmetrics() {
        let metrics = Arc::new(PrometheusMetrics::new());
        metrics.incr(CounterName::Heartbeats, "accepted", 3);
        metrics.observe(HistogramName::RingRepairSeconds, 0.5);
        let sampled = Arc::new(AtomicUsize::new(0));
        let sample = {
            let (metrics, sampled) = (metrics.clone(), sampled.clone());
            move || -> BoxFuture<'static, ()> {
                let (metrics, sampled) = (metrics.clone(), sampled.clone());
                Box::pin(async move {
                    let n = sampled.fetch_add(1, Ordering::SeqCst) as u64 + 1;
                    metrics.set_nodes(10 * n, 1, 4);
                    metrics.set_jobs(&JobCounts {
                        running: n,
                        ..JobCounts::default()
                    });
                })
            }
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let health = Health::new(crate::health::Role::Leader);
        health.set_role(crate::health::Role::Leader, 4);
        let store_up = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let up = store_up.clone();
        health.watch_store(move || crate::health::StoreHealth {
            reachable: up.load(Ordering::SeqCst),
            errors_total: 2,
            retries_total: 5,
            last_error: Some("refused".into()),
        });
        let server = tokio::spawn(serve(
            listener,
            metrics.clone(),
            health.clone(),
            sample,
            async move {
                let _ = stopped.await;
            },
        ));

        let (status, headers, body) = get(addr, "/metrics").await;
        assert_eq!(status, 200, "{headers}");
        assert!(
            headers.contains(&format!("content-type: {CONTENT_TYPE}")),
            "{headers}"
        );
        assert_eq!(sampled.load(Ordering::SeqCst), 1);
        assert_eq!(
            value(&body, r#"hanzod_heartbeats_total{outcome="accepted"}"#),
            3.0
        );
        assert_eq!(value(&body, "hanzod_ring_repair_seconds_count"), 1.0);
        // The gauges are the ones `sample` set for this very scrape.
        assert_eq!(value(&body, r#"hanzod_nodes{state="alive"}"#), 10.0);
        assert_eq!(value(&body, r#"hanzod_nodes{state="failed"}"#), 1.0);
        assert_eq!(value(&body, r#"hanzod_nodes{state="assigned"}"#), 4.0);
        assert_eq!(value(&body, r#"hanzod_jobs{state="running"}"#), 1.0);
        assert_eq!(value(&body, r#"hanzod_jobs{state="failed"}"#), 0.0);

        let (_, _, body) = get(addr, "/metrics").await;
        assert_eq!(sampled.load(Ordering::SeqCst), 2);
        assert_eq!(value(&body, r#"hanzod_nodes{state="alive"}"#), 20.0);

        assert_eq!(value(&body, "hanzod_leader"), 1.0);
        assert_eq!(value(&body, "hanzod_lease_token"), 4.0);
        assert_eq!(value(&body, "hanzod_state_store_up"), 1.0);
        assert_eq!(value(&body, "hanzod_state_store_errors_total"), 2.0);
        assert_eq!(value(&body, "hanzod_state_store_retries_total"), 5.0);

        let (status, _, body) = get(addr, "/healthz").await;
        assert_eq!(status, 200);
        let report: serde_json::Value = serde_json::from_str(&body).expect("JSON report");
        assert_eq!(report["role"], "leader");
        assert_eq!(report["state_store"]["errors_total"], 2);
        assert_eq!(get(addr, "/readyz").await.0, 200);
        store_up.store(false, Ordering::SeqCst);
        let (status, _, body) = get(addr, "/readyz").await;
        assert_eq!(status, 503);
        assert!(body.contains("state store unreachable: refused"), "{body}");
        assert_eq!(
            get(addr, "/healthz").await.0,
            200,
            "liveness holds while the store is down"
        );
        health.set_role(crate::health::Role::Standby, 0);
        store_up.store(true, Ordering::SeqCst);
        assert_eq!(get(addr, "/readyz").await.0, 503, "a standby is not ready");
        let (_, _, body) = get(addr, "/metrics").await;
        assert_eq!(value(&body, "hanzod_leader"), 0.0);
        assert_eq!(value(&body, "hanzod_state_store_up"), 1.0);
        let (status, _, _) = get(addr, "/nope").await;
        assert_eq!(status, 404);
        let (status, _, _) = get(addr, "/metrics/extra").await;
        assert_eq!(status, 404);
        assert_eq!(
            sampled.load(Ordering::SeqCst),
            3,
            "only /metrics samples (three scrapes)"
        );

        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("server stops on shutdown")
            .unwrap()
            .unwrap();
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    }

    #[tokio::test]
    async fn a_stuck_sample_does_not_stall_the_scrape() {
        let metrics = Arc::new(PrometheusMetrics::new());
        metrics.set_nodes(3, 0, 0);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve_with_timeout(
            listener,
            metrics.clone(),
            Health::new(crate::health::Role::Single),
            || -> BoxFuture<'static, ()> { Box::pin(std::future::pending()) },
            std::future::pending(),
            Duration::from_millis(50),
        ));
        let (status, _, body) = tokio::time::timeout(Duration::from_secs(5), get(addr, "/metrics"))
            .await
            .expect("answered despite the stuck sample");
        assert_eq!(status, 200);
        assert_eq!(value(&body, r#"hanzod_nodes{state="alive"}"#), 3.0);
        assert_eq!(
            value(
                &body,
                r#"hanzod_metrics_errors_total{kind="sample_timeout"}"#
            ),
            1.0
        );
        server.abort();
    }
}
