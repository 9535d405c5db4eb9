//! Active–passive replicas (DESIGN §9, paper §1.1 and §9.2): every replica campaigns for
//! one lease in the state store; the winner serves nodes, writing under its lease's fencing
//! token, and the others wait.
//!
//! * **Standby.** Campaigns every `state.campaign_ms`; serves `/metrics`, `/healthz` and
//!   `/readyz` (503) on the metrics listener; does not bind the gRPC port, so node agents
//!   given several endpoints move on to the next one at once.
//! * **Promotion.** On winning, it starts the daemon ([`Daemon::start_with`]) on the store
//!   fenced with its token: the actors load the latest snapshot, replay the log after it
//!   and resume every job where it stood; nodes reconnect and get their ring and epoch
//!   assignment back as soon as their session opens.
//! * **Leading.** Renews the lease every `state.campaign_ms` (from the moment it is won,
//!   while the log is replayed too). While the store cannot be reached it keeps serving and
//!   retrying, but only as long as the lease is surely its own: once no renewal has
//!   succeeded for `lease_ttl_ms - campaign_ms`, it steps down before the lease can lapse.
//! * **Stepping down.** A renewal that finds the lease taken, a write refused as fenced, or
//!   a lease it can no longer confirm stops the daemon at once (its nodes move to the other
//!   endpoints) and the replica stands by again; a lone replica whose store comes back
//!   wins a new lease, replays and resumes.
//! * **Clean shutdown.** On `stop`, the leader stops the daemon, then resigns the lease, so
//!   a standby takes over without waiting for the TTL.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use hanzod_actors::events::{Event, Record};
use hanzod_actors::ports::{LeaderLease, Lease, Ledger, Snapshot, StateStore, StoreError};
use hanzod_actors::types::{NodeId, Timestamp};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::config::Config;
use crate::health::{Health, Role};
use crate::metrics::PrometheusMetrics;
use crate::serve::{Daemon, DaemonParts, StartError};
use hanzod_protocol::identity::Identity;

/// This replica's lease holder name: `state.replica_id` (or the host name) plus a
/// per-process nonce, so a restarted replica never mistakes an old lease for its own.
pub fn holder_name(cfg: &Config) -> String {
    let base = if cfg.state.replica_id.is_empty() {
        host_name()
    } else {
        cfg.state.replica_id.clone()
    };
    format!("{base}#{:08x}", rand::random::<u32>())
}

/// The endpoint nodes reach this replica at: `state.advertise`, else
/// `http://<host name>:<gRPC port>`.
pub fn advertised_endpoint(cfg: &Config) -> String {
    if !cfg.state.advertise.is_empty() {
        return cfg.state.advertise.clone();
    }
    let port = cfg
        .server
        .grpc_addr
        .rsplit(':')
        .next()
        .unwrap_or("9550")
        .to_string();
    format!("http://{}:{port}", host_name())
}

fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "hanzod".into())
}

/// Runs one replica on `store` until `stop` resolves (see the module docs): stands by,
/// leads when it wins the lease, steps back to standing by when it loses the lease or
/// cannot confirm it, and on `stop` stops its daemon and resigns. `parts` are handed to
/// the daemon each time this replica leads (its `store` and `health` are set here);
/// `health` is this replica's, shown on the metrics listener in both roles.
///
/// Errors: those of [`Daemon::start_with`] on promotion (the lease is resigned first), and
/// a metrics listener that cannot be bound while standing by.
pub async fn run<S>(
    cfg: &Config,
    store: Arc<S>,
    parts: DaemonParts,
    health: Health,
    stop: impl Future<Output = ()>,
) -> Result<(), StartError>
where
    S: StateStore + LeaderLease,
{
    tokio::pin!(stop);
    // A standby that takes over needs what the leader accepted and signed.
    for (key, v) in [
        ("deltas.store_dir", &cfg.deltas.store_dir),
        (
            "publish.object_dir or publish.ipfs_url (IPFS_URL)",
            if cfg.publish.ipfs_url.is_empty() {
                &cfg.publish.object_dir
            } else {
                &cfg.publish.ipfs_url
            },
        ),
        ("orchestrator.key (ORCHESTRATOR_KEY)", &cfg.orchestrator.key),
    ] {
        if v.is_empty() {
            return Err(StartError::Unsupported(format!(
                "{key} must be set for replicas: they share the event log, so a standby that \
                 takes over needs the same directories (shared storage) and the same \
                 orchestrator key"
            )));
        }
    }
    let identity = crate::serve::orchestrator_identity(&cfg.orchestrator.key)?;
    let me = identity.node_id();
    // One ledger for every term as leader: the stake is checked before each campaign.
    let ledger = match &parts.ledger {
        Some(l) => l.clone(),
        None => crate::serve::ledger(cfg, &identity, None).await?,
    };
    let holder = holder_name(cfg);
    let endpoint = advertised_endpoint(cfg);
    let ttl = cfg.state.lease_ttl_ms;
    let every = Duration::from_millis(cfg.state.campaign_ms);
    loop {
        health.set_role(Role::Standby, 0);
        tracing::info!(%holder, %endpoint, lease_ttl_ms = ttl, "replica standing by");
        let standby = StandbyExporter::start(cfg, health.clone()).await?;
        let won = tokio::select! {
            won = campaign(&*store, &*ledger, &identity, &holder, &endpoint, ttl, every) => won,
            _ = &mut stop => None,
        };
        standby.stop().await;
        let Some((lease, sent)) = won else {
            return Ok(());
        };
        let since_won = Instant::now();

        // The lease is renewed from now on, while the daemon replays the log too.
        let (lost_tx, mut lost_rx) = watch::channel(None::<String>);
        let keeper = tokio::spawn(keep_lease(
            store.clone(),
            lease.clone(),
            ttl,
            every,
            sent,
            lost_tx,
        ));
        let fenced = store.fenced(lease.token);
        if let Err(e) = same_orchestrator(&*fenced, me).await {
            keeper.abort();
            health.set_role(Role::Stopping, lease.token);
            if let Err(r) = store.resign(&lease).await {
                tracing::warn!(error = %r, "could not resign the lease");
            }
            if let StartError::Store(reason) = &e {
                // The store failed under us: stand by and campaign again.
                tracing::warn!(%reason, "could not check the log's orchestrator; standing by");
                continue;
            }
            return Err(e);
        }
        let (fenced_tx, mut fenced_rx) = watch::channel(None::<u64>);
        let mut leader_parts = parts.clone();
        leader_parts.ledger = Some(ledger.clone());
        leader_parts.store = Some(Arc::new(Watched {
            inner: fenced,
            fenced: fenced_tx,
        }));
        leader_parts.health = Some(health.clone());
        let daemon = match Daemon::start_with(cfg, leader_parts).await {
            Ok(d) => d,
            Err(e) => {
                keeper.abort();
                health.set_role(Role::Stopping, lease.token);
                if let Err(r) = store.resign(&lease).await {
                    tracing::warn!(error = %r, "could not resign the lease after a failed start");
                }
                return Err(e);
            }
        };
        health.set_role(Role::Leader, lease.token);
        tracing::info!(
            token = lease.token,
            %holder,
            took_ms = since_won.elapsed().as_millis() as u64,
            "leading: won the lease, replayed the log, serving nodes"
        );
        let stopping = tokio::select! {
            why = lost_rx.wait_for(Option::is_some) => {
                let why = why.map(|w| w.clone().unwrap_or_default()).unwrap_or_else(|_| "the lease keeper stopped".into());
                tracing::error!(token = lease.token, "stepping down: {why}");
                false
            }
            _ = fenced_rx.changed() => {
                let current = *fenced_rx.borrow();
                tracing::error!(token = lease.token, ?current, "stepping down: a write was refused as fenced (a newer leader exists)");
                false
            }
            _ = &mut stop => true,
        };
        keeper.abort();
        health.set_role(Role::Stopping, lease.token);
        daemon.stop().await;
        if stopping {
            match store.resign(&lease).await {
                Ok(()) => tracing::info!(token = lease.token, "lease resigned"),
                Err(e) => {
                    tracing::warn!(error = %e, "could not resign the lease; a standby takes over when it expires")
                }
            }
            return Ok(());
        }
    }
}

/// Where the log keeps the orchestrator id it is written under (a [`Snapshot`] slot whose
/// `state` is the 32-byte public key).
pub const ORCHESTRATOR_SLOT: &str = "orchestrator";

/// Checks that `me` is the orchestrator the log was written under, recording it when the
/// log has none yet. Replicas must share `ORCHESTRATOR_KEY`: the spot-check secrets and the
/// commitments nodes already hold derive from it.
async fn same_orchestrator(store: &dyn StateStore, me: NodeId) -> Result<(), StartError> {
    let store_err = |e: StoreError| StartError::Store(e.to_string());
    match store
        .get_snapshot(ORCHESTRATOR_SLOT)
        .await
        .map_err(store_err)?
    {
        Some(s) if s.state == me.0 => Ok(()),
        Some(s) => Err(StartError::Material(format!(
            "this replica's orchestrator key (id {me}) is not the one the event log was \
             written under (id {}): replicas must share ORCHESTRATOR_KEY; refusing to lead",
            hex::encode(&s.state)
        ))),
        None => store
            .put_snapshot(
                ORCHESTRATOR_SLOT,
                Snapshot {
                    seq: 0,
                    state: me.0.to_vec(),
                },
            )
            .await
            .map_err(store_err),
    }
}

/// Campaigns every `every` until this replica wins; returns the lease and when the
/// winning campaign was sent (the lease runs from then at the latest). Logs changes of
/// who leads and of the store's reachability, not every attempt.
async fn campaign<S: LeaderLease + ?Sized>(
    store: &S,
    ledger: &dyn Ledger,
    identity: &Identity,
    holder: &str,
    endpoint: &str,
    ttl: u64,
    every: Duration,
) -> Option<(Lease, Instant)> {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seen: Option<Result<Option<Lease>, String>> = None;
    let mut short: Option<String> = None;
    loop {
        tick.tick().await;
        // Only an orchestrator holding the minimum stake may lead (paper §1.1).
        match crate::serve::check_orchestrator_stake(ledger, identity).await {
            Ok(_) => short = None,
            Err(e) => {
                let why = e.to_string();
                if short.as_ref() != Some(&why) {
                    tracing::warn!(%why, "not campaigning for leadership");
                    short = Some(why);
                }
                continue;
            }
        }
        let sent = Instant::now();
        let outcome = store.campaign(holder, endpoint, ttl).await;
        let summary = match &outcome {
            Ok(Some(lease)) => return Some((lease.clone(), sent)),
            Ok(None) => Ok(store.leader().await.ok().flatten()),
            Err(e) => Err(e.to_string()),
        };
        if Some(&summary) != seen.as_ref() {
            match &summary {
                Ok(Some(l)) => tracing::info!(
                    leader = %l.holder,
                    endpoint = %l.endpoint,
                    token = l.token,
                    "another replica leads; standing by"
                ),
                Ok(None) => tracing::info!("the lease is free; campaigning"),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot campaign: state store unreachable; retrying")
                }
            }
            seen = Some(summary);
        }
    }
}

/// Renews `lease` every `every` until it is lost, then says why on `lost`. A lease is lost
/// when a renewal finds it taken, or when no renewal has succeeded for `ttl - every` since
/// the last successful one was sent: past that the lease may have lapsed and another
/// replica may lead, so this one must stop serving before that can happen (a leader cut
/// off from the store would otherwise keep its nodes from the new leader). `won_sent` is
/// when the winning campaign was sent. Each renewal is bounded by `every`.
async fn keep_lease<S: LeaderLease + ?Sized>(
    store: Arc<S>,
    lease: Lease,
    ttl: u64,
    every: Duration,
    won_sent: Instant,
    lost: watch::Sender<Option<String>>,
) {
    let budget = Duration::from_millis(ttl).saturating_sub(every);
    let mut last_ok = won_sent;
    let mut failing: Option<String> = None;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let sent = Instant::now();
        let result = match tokio::time::timeout(every, store.renew(&lease, ttl)).await {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err(format!("no answer within {} ms", every.as_millis())),
        };
        match result {
            Ok(true) => {
                if failing.take().is_some() {
                    tracing::info!(
                        after_ms = sent.duration_since(last_ok).as_millis() as u64,
                        "lease renewed again"
                    );
                }
                last_ok = sent;
            }
            Ok(false) => {
                lost.send_replace(Some("the lease was taken by another replica".into()));
                return;
            }
            Err(e) => {
                if failing.is_none() {
                    tracing::warn!(error = %e, "cannot renew the lease; stepping down if it cannot be renewed within {} ms", budget.as_millis());
                }
                if Instant::now().duration_since(last_ok) >= budget {
                    lost.send_replace(Some(format!(
                        "the lease could not be renewed for {} ms (it may have lapsed): {e}",
                        Instant::now().duration_since(last_ok).as_millis()
                    )));
                    return;
                }
                failing = Some(e);
            }
        }
    }
}

/// The metrics listener of a standby: `/metrics` (role and store gauges), `/healthz`,
/// `/readyz` (503). Stopped before the daemon binds the same address.
struct StandbyExporter {
    task: Option<(
        watch::Sender<bool>,
        tokio::task::JoinHandle<std::io::Result<()>>,
    )>,
}

impl StandbyExporter {
    async fn start(cfg: &Config, health: Health) -> Result<StandbyExporter, StartError> {
        if cfg.server.metrics_addr.is_empty() {
            return Ok(StandbyExporter { task: None });
        }
        let listener = TcpListener::bind(&cfg.server.metrics_addr)
            .await
            .map_err(|source| StartError::Bind {
                addr: cfg.server.metrics_addr.clone(),
                source,
            })?;
        let (tx, mut rx) = watch::channel(false);
        let task = tokio::spawn(crate::metrics::serve(
            listener,
            Arc::new(PrometheusMetrics::new()),
            health,
            || Box::pin(async {}),
            async move { hanzod_protocol::status::stopped(&mut rx).await },
        ));
        Ok(StandbyExporter {
            task: Some((tx, task)),
        })
    }

    async fn stop(self) {
        if let Some((tx, task)) = self.task {
            let _ = tx.send(true);
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
    }
}

/// The leader's store: forwards to the fenced handle and reports the first write refused
/// as fenced, so the replica stops serving at once instead of at its next renewal.
#[derive(Debug)]
struct Watched {
    inner: Arc<dyn StateStore>,
    fenced: watch::Sender<Option<u64>>,
}

impl Watched {
    fn check<T>(&self, r: Result<T, StoreError>) -> Result<T, StoreError> {
        if let Err(StoreError::Fenced { current, .. }) = &r {
            self.fenced.send_replace(Some(*current));
        }
        r
    }
}

#[async_trait]
impl StateStore for Watched {
    async fn append(&self, at: Timestamp, event: Event) -> Result<u64, StoreError> {
        let r = self.inner.append(at, event).await;
        self.check(r)
    }

    async fn append_once(&self, id: u128, at: Timestamp, event: Event) -> Result<u64, StoreError> {
        let r = self.inner.append_once(id, at, event).await;
        self.check(r)
    }

    async fn read_after(&self, after: u64) -> Result<Vec<Record>, StoreError> {
        self.inner.read_after(after).await
    }

    async fn last_seq(&self) -> Result<u64, StoreError> {
        self.inner.last_seq().await
    }

    async fn put_snapshot(&self, key: &str, snapshot: Snapshot) -> Result<(), StoreError> {
        let r = self.inner.put_snapshot(key, snapshot).await;
        self.check(r)
    }

    async fn get_snapshot(&self, key: &str) -> Result<Option<Snapshot>, StoreError> {
        self.inner.get_snapshot(key).await
    }

    async fn log_id(&self) -> Result<[u8; 16], StoreError> {
        self.inner.log_id().await
    }

    fn fenced(&self, token: u64) -> Arc<dyn StateStore> {
        self.inner.fenced(token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hanzod_actors::ports::memory::MemoryStateStore;

    fn cfg(name: &str) -> Config {
        let mut cfg = Config::load(None, |_| None).expect("defaults load");
        cfg.server.grpc_addr = "127.0.0.1:0".into();
        cfg.server.metrics_addr = String::new();
        cfg.state.lease_ttl_ms = 60_000;
        cfg.state.campaign_ms = 50;
        cfg.state.replica_id = name.into();
        cfg.state.advertise = format!("http://{name}:9550");
        cfg.orchestrator.key = "11".repeat(32);
        let dir =
            std::env::temp_dir().join(format!("hanzod-replica-{}-{name}", std::process::id()));
        cfg.data_dir = dir.display().to_string();
        cfg.deltas.store_dir = dir.join("deltas").display().to_string();
        cfg.publish.object_dir = dir.join("objects").display().to_string();
        cfg
    }

    async fn until(what: &str, mut f: impl FnMut() -> bool) {
        let start = Instant::now();
        while !f() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "timed out: {what}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// One leader at a time; a clean stop resigns, and the standby takes over without
    /// waiting for the lease to expire, on the same log.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn clean_stop_hands_the_lease_to_the_standby() {
        let store = Arc::new(MemoryStateStore::new());
        let (ha, hb) = (Health::new(Role::Standby), Health::new(Role::Standby));
        let (stop_a, rx_a) = tokio::sync::oneshot::channel::<()>();
        let a = {
            let (store, h) = (store.clone(), ha.clone());
            tokio::spawn(async move {
                run(&cfg("a"), store, DaemonParts::default(), h, async {
                    let _ = rx_a.await;
                })
                .await
            })
        };
        until("a leads", || ha.role() == Role::Leader).await;
        let (_stop_b, rx_b) = tokio::sync::oneshot::channel::<()>();
        let b = {
            let (store, h) = (store.clone(), hb.clone());
            tokio::spawn(async move {
                run(&cfg("b"), store, DaemonParts::default(), h, async {
                    let _ = rx_b.await;
                })
                .await
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(hb.role(), Role::Standby, "one leader at a time");
        let lease_a = store.leader().await.unwrap().expect("a's lease");
        assert!(lease_a.holder.starts_with("a#"), "{lease_a:?}");
        assert_eq!(lease_a.endpoint, "http://a:9550");
        assert_eq!(ha.token(), lease_a.token);

        let t = Instant::now();
        stop_a.send(()).unwrap();
        a.await.unwrap().unwrap();
        until("b leads", || hb.role() == Role::Leader).await;
        let handover = t.elapsed();
        assert!(
            handover < Duration::from_secs(30),
            "the standby must not wait for the 60 s TTL: took {handover:?}"
        );
        let lease_b = store.leader().await.unwrap().expect("b's lease");
        assert!(lease_b.token > lease_a.token);
        b.abort();
    }

    /// A leader whose lease is taken stops serving and stands by again; its handle can no
    /// longer write.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_leader_whose_lease_is_taken_steps_down() {
        let store = Arc::new(MemoryStateStore::new());
        let h = Health::new(Role::Standby);
        let a = {
            let (store, h) = (store.clone(), h.clone());
            tokio::spawn(async move {
                run(
                    &cfg("a"),
                    store,
                    DaemonParts::default(),
                    h,
                    std::future::pending(),
                )
                .await
            })
        };
        until("a leads", || h.role() == Role::Leader).await;
        let lease = store.leader().await.unwrap().expect("a's lease");
        // Another replica takes the lease (as after a's lease expired while it was
        // paused). a renews every 50 ms and may re-take its untaken lease in between.
        let intruder = loop {
            store.resign(&lease).await.unwrap();
            if let Some(l) = store.campaign("intruder", "", 60_000).await.unwrap() {
                break l;
            }
        };
        until("a stands by", || h.role() == Role::Standby).await;
        assert!(h.ready().is_err());
        assert_eq!(h.token(), 0);
        assert!(!a.is_finished(), "a keeps campaigning");
        // Its old handle can no longer write.
        assert!(matches!(
            store
                .fenced(lease.token)
                .append(Timestamp(1), hanzod_actors::events::Event::NodeFailed {
                    node: hanzod_actors::types::NodeId([1; 32]),
                    kind: hanzod_actors::events::FailureKind::SessionClosed,
                })
                .await,
            Err(StoreError::Fenced { current, .. }) if current == intruder.token
        ));
        // When the intruder resigns, a leads again under a newer token.
        store.resign(&intruder).await.unwrap();
        until("a leads again", || h.role() == Role::Leader).await;
        assert!(h.token() > intruder.token);
        a.abort();
    }

    /// A leader that cannot reach its store steps down before its lease can lapse, and leads
    /// again once the store is back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_leader_cut_off_from_its_store_steps_down_then_returns() {
        let store = Arc::new(MemoryStateStore::new());
        let h = Health::new(Role::Standby);
        let mut c = cfg("a");
        c.state.lease_ttl_ms = 1_000;
        let a = {
            let (store, h) = (store.clone(), h.clone());
            tokio::spawn(async move {
                run(&c, store, DaemonParts::default(), h, std::future::pending()).await
            })
        };
        until("a leads", || h.role() == Role::Leader).await;
        let first = h.token();
        store.set_available(false);
        let cut = Instant::now();
        until("a steps down", || h.role() != Role::Leader).await;
        // Its lease lapses at most 1 s after the cut (the last renewal was before it).
        assert!(
            cut.elapsed() < Duration::from_millis(1_000 + 200),
            "stepped down around the lease's end: {:?}",
            cut.elapsed()
        );
        store.set_available(true);
        until("a leads again", || h.role() == Role::Leader).await;
        assert!(h.token() >= first);
        a.abort();
    }

    /// A replica whose orchestrator key is not the log's refuses to lead.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_replica_with_another_key_refuses_to_lead() {
        let store = Arc::new(MemoryStateStore::new());
        let h = Health::new(Role::Standby);
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let a = {
            let (store, h) = (store.clone(), h.clone());
            tokio::spawn(async move {
                run(&cfg("a"), store, DaemonParts::default(), h, async {
                    let _ = rx.await;
                })
                .await
            })
        };
        until("a leads", || h.role() == Role::Leader).await;
        stop.send(()).unwrap();
        a.await.unwrap().unwrap();
        let mut other = cfg("b");
        other.orchestrator.key = "22".repeat(32);
        let err = run(
            &other,
            store.clone(),
            DaemonParts::default(),
            Health::new(Role::Standby),
            std::future::pending(),
        )
        .await
        .expect_err("another key must not lead");
        assert!(err.to_string().contains("ORCHESTRATOR_KEY"), "{err}");
        assert_eq!(store.leader().await.unwrap(), None, "it resigned");
    }

    /// A replica whose orchestrator holds less than 50,000 GYM of stake does not campaign
    /// (paper §1.1); once its stake reaches the minimum it leads.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_replica_without_the_orchestrator_stake_does_not_campaign() {
        use hanzod_actors::ports::memory::MemoryChain;
        use hanzod_actors::types::GymWei;
        let store = Arc::new(MemoryStateStore::new());
        let h = Health::new(Role::Standby);
        let short =
            Arc::new(MemoryChain::new().with_orchestrator_stake(GymWei(
                hanzod_adapters::chain::ORCHESTRATOR_MIN_STAKE.0 - 1,
            )));
        let parts = DaemonParts {
            ledger: Some(short),
            ..DaemonParts::default()
        };
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let a = {
            let (store, h) = (store.clone(), h.clone());
            tokio::spawn(async move {
                run(&cfg("short"), store, parts, h, async {
                    let _ = rx.await;
                })
                .await
            })
        };
        // Many campaign intervals (50 ms) pass: it never takes the free lease.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(h.role(), Role::Standby);
        assert_eq!(store.leader().await.unwrap(), None, "the lease stays free");
        stop.send(()).unwrap();
        a.await.unwrap().unwrap();
        // With the minimum it leads.
        let parts = DaemonParts {
            ledger: Some(Arc::new(MemoryChain::new().with_orchestrator_stake(
                hanzod_adapters::chain::ORCHESTRATOR_MIN_STAKE,
            ))),
            ..DaemonParts::default()
        };
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let h2 = Health::new(Role::Standby);
        let b = {
            let (store, h) = (store.clone(), h2.clone());
            tokio::spawn(async move {
                run(&cfg("staked"), store, parts, h, async {
                    let _ = rx.await;
                })
                .await
            })
        };
        until("the staked replica leads", || h2.role() == Role::Leader).await;
        stop.send(()).unwrap();
        b.await.unwrap().unwrap();
    }
}
