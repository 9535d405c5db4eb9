//! `hanzod serve`: the daemon. Builds the orchestrator from the configuration with the
//! gRPC session link and the Prometheus metrics, serves gRPC (plaintext or TLS 1.3) and
//! `/metrics`, and shuts down gracefully.
//!
//! [`Daemon::start`] is also how tests and embedders run a daemon in-process: bind
//! `127.0.0.1:0` and read the bound addresses back. [`Daemon::start_with`] takes
//! [`DaemonParts`] in place of what the configuration would build (a model catalog with
//! the embedder's models, a blob store of its own).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use hanzod_actors::ports::memory::{MemoryChain, MemoryStateStore};
use hanzod_actors::ports::{Clock, Ledger, StateStore};
use hanzod_actors::types::GymWei;
use hanzod_actors::{Orchestrator, OrchestratorHandle};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::config::Config;
use crate::grpc::node::NodeServiceSettings;
use crate::grpc::server::{tls_acceptor, GrpcServer, ServeError, ServerPorts, ServerSettings};
use crate::grpc::sessions::{GrpcNodeLink, Sessions};
use crate::grpc::upload::UploadSettings;
use crate::health::{Health, Role};
use crate::metrics::PrometheusMetrics;
use hanzod_adapters::hub::{HubOptions, HubRegistry};
use hanzod_adapters::kubo::{KuboObjectStore, KuboOptions};
use hanzod_pipeline::sink::{Economics, Publication, TrainingSink};
use hanzod_protocol::client::Io;
use hanzod_protocol::identity::Identity;
use hanzod_store::blobs::{BlobError, BlobStore, FsBlobStore, MemoryBlobStore};
use hanzod_store::{FolderRegistry, FsObjectStore, MemoryObjectStore, ModelRegistry, ObjectStore};
use hanzod_train::catalog::ModelCatalog;
use sha2::{Digest, Sha256};

/// Connections from any transport.
type Incoming =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = std::io::Result<Box<dyn Io>>> + Send>>;

enum Serving {
    Tcp(TcpListener, Option<tokio_rustls::TlsAcceptor>),
    Incoming(Incoming),
}

/// A connection of any transport, for [`Daemon::start_with_incoming`].
struct AnyIo(Box<dyn Io>);

impl tonic::transport::server::Connected for AnyIo {
    type ConnectInfo = ();
    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl tokio::io::AsyncRead for AnyIo {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for AnyIo {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut *self.0).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut *self.0).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut *self.0).poll_shutdown(cx)
    }
}

/// Why the daemon could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A setting names something this build cannot use.
    #[error("{0}")]
    Unsupported(String),
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// TLS or key material could not be loaded.
    #[error("{0}")]
    Material(String),
    /// The orchestrator did not start.
    #[error(transparent)]
    Core(#[from] hanzod_actors::OrchestratorError),
    /// The gRPC server could not be built.
    #[error(transparent)]
    Serve(#[from] ServeError),
    /// The blob store (`deltas.store_dir`) could not be opened.
    #[error("deltas.store_dir: {0}")]
    BlobStore(#[from] BlobError),
    /// The validator pool or the model keeper did not start.
    #[error("validator: {0}")]
    Validator(String),
    /// The state store could not be read (its log id).
    #[error("state store: {0}")]
    Store(String),
}

/// Components an embedder (or a test) supplies in place of what the configuration builds.
#[derive(Debug, Default, Clone)]
pub struct DaemonParts {
    /// The models and datasets jobs may name (default: [`ModelCatalog::builtin`]).
    pub catalog: Option<ModelCatalog>,
    /// Where uploaded deltas are stored (default: per `deltas.store_dir`, an
    /// [`FsBlobStore`] there or a [`MemoryBlobStore`] when it is empty).
    pub blobs: Option<Arc<dyn BlobStore>>,
    /// Where checkpoints are published (default: per `publish.object_dir`, an
    /// [`FsObjectStore`] there or a [`MemoryObjectStore`] when it is empty).
    pub objects: Option<Arc<dyn ObjectStore>>,
    /// The event log (default: a fresh [`MemoryStateStore`]; with `state.valkey_url` set
    /// the daemon must be given one: [`crate::replica::run`] passes the Valkey store
    /// fenced with its lease's token).
    pub store: Option<Arc<dyn StateStore>>,
    /// The replica's health, shown on `/healthz` and `/readyz` (default: a single daemon).
    pub health: Option<Health>,
    /// The chain: stakes, rewards, slashing, publication records (default: per
    /// `chain.rpc_url`, an [`EvmChain`](hanzod_adapters::chain::EvmChain) on that endpoint, or the
    /// embedded [`MemoryChain`] when it is empty; see [`ledger`]).
    pub ledger: Option<Arc<dyn Ledger>>,
}

/// The ledger `cfg` names: with `chain.rpc_url` (`HANZO_RPC`) the EVM adapter, sending
/// from the orchestrator's account ([`hanzod_adapters::chain::account`], derived from `identity`),
/// after checking the chain id and the contracts; else the embedded ledger with every
/// operator holding `chain.dev_stake_gym` and the orchestrator 50,000 GYM, its penalties
/// timed by `clock`.
///
/// Errors: [`StartError::Material`] when the endpoint or the contracts fail the checks
/// (the URL is named redacted).
pub async fn ledger(
    cfg: &Config,
    identity: &Identity,
    clock: Option<Arc<dyn Clock>>,
) -> Result<Arc<dyn Ledger>, StartError> {
    if cfg.chain.rpc_url.is_empty() {
        let mut chain = MemoryChain::with_default_stake(GymWei::gym(cfg.chain.dev_stake_gym))
            .with_penalty_window_ms(cfg.chain.penalty_window_ms);
        if let Some(clock) = clock {
            chain = chain.with_clock(clock);
        }
        return Ok(Arc::new(chain));
    }
    if cfg.orchestrator.key.is_empty() {
        // A fresh key per start would be a fresh account per start, never staked.
        return Err(StartError::Material(
            "HANZO_RPC is set, so ORCHESTRATOR_KEY (orchestrator.key) must be too: the \
             orchestrator's EVM account, which holds its stake, derives from that key \
             (`hanzod chain account` prints it)"
                .into(),
        ));
    }
    let url = cfg.redacted().chain.rpc_url;
    let opts = cfg.chain.evm_options().map_err(StartError::Material)?;
    let signer = hanzod_adapters::chain::account::signer(identity);
    let chain = hanzod_adapters::chain::EvmChain::connect(&cfg.chain.rpc_url, signer, opts)
        .await
        .map_err(|e| StartError::Material(format!("HANZO_RPC {url}: {e}")))?;
    tracing::info!(
        %url,
        chain_id = cfg.chain.chain_id,
        account = %chain.account(),
        token = %cfg.chain.gym_token,
        pool = %cfg.chain.mining_pool,
        "stakes, rewards, slashing and publication records are on chain"
    );
    Ok(Arc::new(chain))
}

/// Checks that the orchestrator's own stake on `ledger` is at least 50,000 GYM
/// ([`hanzod_adapters::chain::ORCHESTRATOR_MIN_STAKE`], paper §1.1) before it leads; returns it, or
/// `None` when the chain cannot be reached: the check is then skipped with a warning
/// rather than keep every replica from leading through a chain outage (the contracts
/// refuse every payment, slash and record by an account below the minimum anyway).
///
/// Errors: [`StartError::Material`] naming the stake held and the account to stake from.
pub async fn check_orchestrator_stake(
    ledger: &dyn Ledger,
    identity: &Identity,
) -> Result<Option<GymWei>, StartError> {
    let need = hanzod_adapters::chain::ORCHESTRATOR_MIN_STAKE;
    let have = match ledger.orchestrator_stake().await {
        Ok(have) => have,
        Err(hanzod_actors::ports::ChainError::Unavailable(why)) => {
            tracing::warn!(%why, "cannot read the orchestrator's stake: the chain is unavailable; leading without the check");
            return Ok(None);
        }
        Err(e) => {
            return Err(StartError::Material(format!(
                "cannot read the orchestrator's stake: {e}"
            )))
        }
    };
    if have < need {
        return Err(StartError::Material(format!(
            "the orchestrator's stake is {} GYM wei, below the 50,000 GYM ({} GYM wei) an \
             orchestrator must hold to lead (paper §1.1): stake from its account {}",
            have.0,
            need.0,
            hanzod_adapters::chain::account::address(identity)
        )));
    }
    Ok(Some(have))
}

/// A running daemon.
pub struct Daemon {
    /// The bound gRPC address.
    pub grpc_addr: SocketAddr,
    /// The bound metrics address, when the exporter runs.
    pub metrics_addr: Option<SocketAddr>,
    /// The orchestrator.
    pub core: OrchestratorHandle,
    /// The live node sessions.
    pub sessions: Arc<Sessions>,
    /// The orchestrator's identity.
    pub identity: Identity,
    blobs: Arc<dyn BlobStore>,
    catalog: Arc<ModelCatalog>,
    sink: TrainingSink,
    ledger: Arc<dyn Ledger>,
    objects: Arc<dyn ObjectStore>,
    shutdown: watch::Sender<bool>,
    grpc: tokio::task::JoinHandle<Result<(), ServeError>>,
    exporter: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    snapshots: tokio::task::JoinHandle<()>,
    grace: Duration,
    /// The daemon made its own in-memory event log (no store was given): jobs that have
    /// not ended when it stops are lost, and it says so.
    memory_log: bool,
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon")
            .field("grpc_addr", &self.grpc_addr)
            .field("metrics_addr", &self.metrics_addr)
            .finish()
    }
}

fn read(path: &str, what: &str) -> Result<Vec<u8>, StartError> {
    std::fs::read(path).map_err(|e| StartError::Material(format!("{what} {path}: {e}")))
}

/// The orchestrator's identity from `orchestrator.key` (`ORCHESTRATOR_KEY`): 64 hex digits,
/// or the path of a key file; empty generates a fresh one.
///
/// Errors: [`StartError::Material`] for a key that does not parse or a file that cannot
/// be read.
pub fn orchestrator_identity(key: &str) -> Result<Identity, StartError> {
    if key.is_empty() {
        return Ok(Identity::generate());
    }
    if key.len() == 64 && key.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Identity::from_hex(key, "ORCHESTRATOR_KEY")
            .map_err(|e| StartError::Material(e.to_string()));
    }
    Identity::load(Path::new(key))
        .map_err(|e| StartError::Material(format!("orchestrator.key (ORCHESTRATOR_KEY): {e}")))
}

/// The server settings a configuration asks for, for an orchestrator with key
/// `orchestrator_key` running on the event log `log_id`.
pub fn server_settings(
    cfg: &Config,
    log_id: [u8; 16],
    orchestrator_key: [u8; 32],
) -> ServerSettings {
    let s = &cfg.server;
    let attesters = cfg
        .nodes
        .attesters
        .iter()
        .filter_map(|k| {
            let mut b = [0u8; 32];
            hex::decode_to_slice(k, &mut b).ok()?;
            ed25519_dalek::VerifyingKey::from_bytes(&b).ok()
        })
        .collect();
    ServerSettings {
        max_message_bytes: s.max_message_bytes,
        keepalive_interval_ms: s.keepalive_interval_ms,
        keepalive_timeout_ms: s.keepalive_timeout_ms,
        max_concurrent_streams: s.max_concurrent_streams,
        admin_token: (!s.admin_token.is_empty()).then(|| s.admin_token.clone()),
        node: NodeServiceSettings {
            challenge_ttl_ms: s.limits.challenge_ttl_ms,
            max_pending_challenges: s.limits.max_pending_challenges,
            registrations_per_min: s.limits.registrations_per_min,
            challenges_per_ip_per_min: s.limits.challenges_per_ip_per_min,
            registrations_per_ip_per_min: s.limits.registrations_per_ip_per_min,
            messages_per_s: s.limits.messages_per_s,
            burst: s.limits.burst,
            max_violations: s.limits.max_violations,
            first_message_timeout_ms: s.first_message_timeout_ms,
            replay_window_ms: cfg.core.heartbeat.replay_window_ms,
            attesters,
            log_id,
            orchestrator_key,
        },
        uploads: UploadSettings {
            max_concurrent: cfg.deltas.max_concurrent_uploads,
            idle_ms: cfg.deltas.upload_idle_ms,
            min_bytes_per_s: cfg.deltas.min_upload_bytes_per_s,
            chunk_bytes: cfg.deltas.chunk_bytes,
        },
        admission: crate::grpc::admission::AdmissionSettings {
            validation_budget_flops: cfg.validation.validation_budget_flops,
            spot_check_rate: cfg.validation.spot_check_rate,
        },
    }
}

/// The blob store `deltas.store_dir` asks for: an [`FsBlobStore`] in that directory
/// (opened on a blocking thread: it lists the directory), or a [`MemoryBlobStore`] when it
/// is empty.
pub async fn blob_store(cfg: &Config) -> Result<Arc<dyn BlobStore>, BlobError> {
    let dir = cfg.deltas.store_dir.clone();
    if dir.is_empty() {
        tracing::info!("deltas are kept in memory (deltas.store_dir is empty)");
        return Ok(Arc::new(MemoryBlobStore::new()));
    }
    let store = tokio::task::spawn_blocking({
        let dir = dir.clone();
        move || FsBlobStore::open(dir)
    })
    .await
    .map_err(|e| BlobError::Io(format!("opening the store: {e}")))??;
    tracing::info!(%dir, "deltas are kept on disk");
    Ok(Arc::new(store))
}

/// The publication ports `publish` asks for: the object store (`objects` when given, else
/// the IPFS node at `ipfs_url` ([`KuboObjectStore`], checked at start), else an
/// [`FsObjectStore`] in [`Config::object_dir`] (`object_dir`, else `<data_dir>/ipfs`), else
/// in memory) and the model registry (the Hub at `hf_endpoint` when `hf_token` is set
/// ([`HubRegistry`]), else a [`FolderRegistry`] in [`Config::registry_dir`]
/// (`registry_dir`, else `<data_dir>/models`), else none).
///
/// Records are signed with `signer` and stamped by `clock`; publications are staged in
/// `journal` (the daemon's state store) so that one cut short by a crash resumes.
pub async fn publication(
    cfg: &Config,
    objects: Option<Arc<dyn ObjectStore>>,
    journal: Arc<dyn StateStore>,
    signer: Identity,
    clock: Arc<dyn Clock>,
) -> Result<Publication, StartError> {
    let p = &cfg.publish;
    let objects: Arc<dyn ObjectStore> = match objects {
        Some(o) => o,
        None if !p.ipfs_url.is_empty() => {
            let kubo = KuboObjectStore::connect(&p.ipfs_url, KuboOptions::default())
                .await
                .map_err(|e| {
                    // The URL may carry credentials: name it redacted.
                    let url = cfg.redacted().publish.ipfs_url;
                    StartError::Material(format!("IPFS_URL {url}: {e}"))
                })?;
            tracing::info!(url = %kubo.url(), version = %kubo.version(), "checkpoints are added to IPFS");
            Arc::new(kubo)
        }
        None => match cfg.object_dir() {
            None => {
                tracing::info!(
                    "checkpoints are kept in memory (data_dir and publish.object_dir are empty)"
                );
                Arc::new(MemoryObjectStore::new())
            }
            Some(dir) => Arc::new(FsObjectStore::open(dir.clone()).await.map_err(|e| {
                StartError::Material(format!(
                    "publish.object_dir (or data_dir) {}: {e}",
                    dir.display()
                ))
            })?),
        },
    };
    let registry: Option<Arc<dyn ModelRegistry>> = if !p.hf_token.is_empty() {
        let hub = HubRegistry::new(HubOptions {
            endpoint: p.hf_endpoint.clone(),
            token: Some(p.hf_token.clone()),
            ..HubOptions::default()
        })
        .map_err(|e| StartError::Material(format!("HF_ENDPOINT {}: {e}", p.hf_endpoint)))?;
        tracing::info!(endpoint = %p.hf_endpoint, org = %p.org, "checkpoints are pushed to the Hugging Face Hub");
        Some(Arc::new(hub))
    } else {
        cfg.registry_dir()
            .map(|dir| Arc::new(FolderRegistry::new(dir)) as Arc<dyn ModelRegistry>)
    };
    Ok(Publication {
        objects,
        registry,
        org: p.org.clone(),
        license: hanzod_pipeline::sink::DEFAULT_LICENSE.into(),
        journal,
        signer,
        clock,
    })
}

impl Daemon {
    /// Starts the orchestrator and its listeners.
    pub async fn start(cfg: &Config) -> Result<Daemon, StartError> {
        Daemon::start_with(cfg, DaemonParts::default()).await
    }

    /// Starts the orchestrator and its listeners with `parts` in place of what `cfg` would
    /// build.
    pub async fn start_with(cfg: &Config, parts: DaemonParts) -> Result<Daemon, StartError> {
        if !cfg.state.valkey_url.is_empty() && parts.store.is_none() {
            return Err(StartError::Unsupported(
                "VALKEY_URL is set: a daemon on Valkey runs under leader election \
                 (hanzod::replica::run, which `hanzod serve` uses), which gives it the \
                 fenced store"
                    .into(),
            ));
        }
        for warning in startup_warnings(cfg, parts.store.is_some()) {
            tracing::warn!("{warning}");
        }
        let identity = orchestrator_identity(&cfg.orchestrator.key)?;
        let acceptor = if cfg.server.tls.cert.is_empty() {
            None
        } else {
            let ca = if cfg.server.tls.client_ca.is_empty() {
                None
            } else {
                Some(read(&cfg.server.tls.client_ca, "client CA")?)
            };
            Some(tls_acceptor(
                &read(&cfg.server.tls.cert, "certificate")?,
                &read(&cfg.server.tls.key, "key")?,
                ca.as_deref(),
            )?)
        };
        let grpc_listener = TcpListener::bind(&cfg.server.grpc_addr)
            .await
            .map_err(|source| StartError::Bind {
                addr: cfg.server.grpc_addr.clone(),
                source,
            })?;
        let metrics_listener = if cfg.server.metrics_addr.is_empty() {
            None
        } else {
            Some(
                TcpListener::bind(&cfg.server.metrics_addr)
                    .await
                    .map_err(|source| StartError::Bind {
                        addr: cfg.server.metrics_addr.clone(),
                        source,
                    })?,
            )
        };
        let grpc_addr = grpc_listener.local_addr().map_err(ServeError::Io)?;
        Daemon::assemble(
            cfg,
            identity,
            grpc_addr,
            Serving::Tcp(grpc_listener, acceptor),
            metrics_listener,
            None,
            parts,
        )
        .await
    }

    /// Starts the orchestrator serving gRPC (plaintext, no metrics exporter) on the
    /// connections `incoming` yields, reading time from `clock`: a simulated network in
    /// tests, whose hosts must share one notion of time across restarts.
    pub async fn start_with_incoming<S>(
        cfg: &Config,
        incoming: S,
        clock: Arc<dyn Clock>,
    ) -> Result<Daemon, StartError>
    where
        S: tokio_stream::Stream<Item = std::io::Result<Box<dyn Io>>> + Send + 'static,
    {
        let identity = orchestrator_identity(&cfg.orchestrator.key)?;
        let addr = SocketAddr::from(([0, 0, 0, 0], 0));
        Daemon::assemble(
            cfg,
            identity,
            addr,
            Serving::Incoming(Box::pin(incoming)),
            None,
            Some(clock),
            DaemonParts::default(),
        )
        .await
    }

    async fn assemble(
        cfg: &Config,
        identity: Identity,
        grpc_addr: SocketAddr,
        serving: Serving,
        metrics_listener: Option<TcpListener>,
        clock: Option<Arc<dyn Clock>>,
        parts: DaemonParts,
    ) -> Result<Daemon, StartError> {
        // The process's training backend, chosen once (`validation.device`).
        cfg.validation
            .device
            .parse::<hanzod_train::backend::Backend>()
            .and_then(hanzod_train::backend::select)
            .map_err(|e| StartError::Unsupported(format!("validation.device: {e}")))?;
        tracing::info!(device = %hanzod_train::backend::selected(), "validation backend");
        let memory_log = parts.store.is_none();
        let own_objects = parts.objects.is_none();
        let store = parts
            .store
            .unwrap_or_else(|| Arc::new(MemoryStateStore::new()));
        let log_id = store
            .log_id()
            .await
            .map_err(|e| StartError::Store(e.to_string()))?;
        let health = parts.health.unwrap_or_else(|| Health::new(Role::Single));
        let settings = server_settings(cfg, log_id, identity.node_id().0);
        let blobs = match parts.blobs {
            Some(b) => b,
            None => blob_store(cfg).await?,
        };
        let catalog = Arc::new(parts.catalog.unwrap_or_else(ModelCatalog::builtin));
        let metrics = Arc::new(PrometheusMetrics::new());
        let sessions = Arc::new(Sessions::new(
            cfg.server.session_queue,
            cfg.nodes.probe_bytes,
            cfg.nodes.probe_ttl_ms,
            metrics.clone(),
        ));
        // The spot-check seed (DESIGN §6) comes from the orchestrator key, so the epoch
        // secrets (and the commitments published from them) survive a restart with the same
        // key: Ed25519 signatures are deterministic, and nobody without the key can make
        // this one.
        let seed: [u8; 32] =
            Sha256::digest(identity.sign(hanzod_actors::domain::SPOT_CHECK_SEED, &[])).into();
        let ledger = match parts.ledger {
            Some(l) => l,
            None => ledger(cfg, &identity, clock.clone()).await?,
        };
        // An orchestrator leads only on its own stake (paper §1.1); a replica checked it
        // before campaigning too.
        if let Some(own) = check_orchestrator_stake(&*ledger, &identity).await? {
            tracing::info!(stake_wei = %own.0, "orchestrator stake checked");
        }
        let chain: Arc<dyn hanzod_actors::ports::ChainReader> = ledger.clone();
        let publication = publication(
            cfg,
            parts.objects,
            store.clone(),
            identity.clone(),
            clock
                .clone()
                .unwrap_or_else(|| Arc::new(hanzod_actors::ports::SystemClock)),
        )
        .await?;
        let objects = publication.objects.clone();
        let sink = start_sink(
            cfg,
            blobs.clone(),
            catalog.clone(),
            seed,
            metrics.clone(),
            &ledger,
            publication,
        )
        .await?;
        recover_from_chain(&*store, &*ledger, &*objects, &identity, clock.as_deref()).await?;
        let mut builder = Orchestrator::builder()
            .config(cfg.core.clone())
            .checkpoint_sink(Arc::new(sink.clone()))
            .chain(chain)
            .node_link(Arc::new(GrpcNodeLink(sessions.clone())))
            .state_store(store.clone())
            .metrics(metrics.clone());
        if let Some(clock) = clock {
            builder = builder.clock(clock);
        }
        let core = builder.start().await?;
        let (shutdown, shutdown_rx) = watch::channel(false);
        let server = GrpcServer::new(
            core.clone(),
            sessions.clone(),
            &settings,
            ServerPorts {
                blobs: blobs.clone(),
                objects: objects.clone(),
                ledger: Some(ledger.clone()),
            },
            catalog.clone(),
            {
                let sink = sink.clone();
                Arc::new(move |job, epoch| sink.commitment(job, epoch).0)
            },
            shutdown_rx.clone(),
        )
        .await?;
        let grpc = spawn_grpc(server, serving, shutdown_rx.clone());
        let (metrics_addr, exporter) = match metrics_listener {
            None => (None, None),
            Some(l) => {
                let (addr, task) = spawn_exporter(l, &core, metrics, &health, shutdown_rx.clone());
                (addr, Some(task))
            }
        };
        let snapshots = spawn_snapshots(store.clone(), cfg, shutdown_rx.clone());
        tracing::info!(
            grpc = %grpc_addr,
            metrics = ?metrics_addr,
            orchestrator = %identity.node_id(),
            tls = !cfg.server.tls.cert.is_empty(),
            mtls = !cfg.server.tls.client_ca.is_empty(),
            "hanzod serving"
        );
        if own_objects {
            // Where the trained models end up (or that they do not), in the operator's words.
            let cwd = std::env::current_dir().ok();
            tracing::info!("{}", cfg.storage_line(cwd.as_deref()));
        }
        Ok(Daemon {
            grpc_addr,
            metrics_addr,
            core,
            sessions,
            identity,
            blobs,
            catalog,
            ledger,
            objects,
            sink,
            shutdown,
            grpc,
            exporter,
            snapshots,
            grace: Duration::from_millis(cfg.server.shutdown_grace_ms),
            memory_log,
        })
    }

    /// The ledger rewards are paid and stakes slashed on (the embedded one: its
    /// balances, reward batches and slashes).
    pub fn ledger(&self) -> Arc<dyn Ledger> {
        self.ledger.clone()
    }

    /// The validating, merging checkpoint sink (its epoch reports and spot-check
    /// commitments).
    pub fn sink(&self) -> &TrainingSink {
        &self.sink
    }

    /// The object store checkpoints are published to (by CID).
    pub fn objects(&self) -> Arc<dyn ObjectStore> {
        self.objects.clone()
    }

    /// The blob store uploaded deltas are kept in (content-addressed by SHA-256).
    pub fn blobs(&self) -> Arc<dyn BlobStore> {
        self.blobs.clone()
    }

    /// The models and datasets this daemon's jobs may name.
    pub fn catalog(&self) -> Arc<ModelCatalog> {
        self.catalog.clone()
    }

    /// Stops gracefully: health turns NOT_SERVING, session streams end `UNAVAILABLE` (nodes
    /// reconnect elsewhere or later), calls in flight get up to the grace period, then the
    /// orchestrator stops.
    pub async fn stop(self) {
        if self.memory_log {
            // Nothing will remember these jobs: name them while the core can still list them.
            match self.core.jobs().await {
                Ok(jobs) => {
                    if let Some(warning) = jobs_lost_at_stop(&jobs) {
                        tracing::warn!("{warning}");
                    }
                }
                Err(e) => tracing::warn!(
                    "stopping on the in-memory event log: could not list the jobs that will be lost: {e}"
                ),
            }
        }
        // Session streams end on this signal without telling the core: the nodes did not
        // fail, this daemon stops (a standby must find the rings as they were).
        let _ = self.shutdown.send(true);
        self.sessions.close_all();
        let abort = self.grpc.abort_handle();
        match tokio::time::timeout(self.grace, self.grpc).await {
            Ok(Ok(Err(e))) => tracing::warn!("gRPC server: {e}"),
            Err(_) => {
                tracing::warn!("calls still in flight after the grace period; closing them");
                abort.abort();
            }
            _ => {}
        }
        if let Some(e) = self.exporter {
            let _ = tokio::time::timeout(self.grace, e).await;
        }
        self.snapshots.abort();
        self.core.shutdown().await;
        self.sink.stop();
        tracing::info!("hanzod stopped");
    }
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
pub async fn termination() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// The epoch pipeline's sink: the validator pool and the model keeper, settling on
/// `ledger` with the configured rewards, slash and settlement deadline.
async fn start_sink(
    cfg: &Config,
    blobs: Arc<dyn BlobStore>,
    catalog: Arc<ModelCatalog>,
    seed: [u8; 32],
    metrics: Arc<PrometheusMetrics>,
    ledger: &Arc<dyn Ledger>,
    publication: Publication,
) -> Result<TrainingSink, StartError> {
    TrainingSink::start(
        blobs,
        catalog,
        seed,
        cfg.validation.sink_config(),
        metrics,
        Some(Economics {
            min_stake: cfg.core.eligibility.rules().min_stake,
            // On a chain a settlement is a few transactions, each awaited up to
            // chain.tx_timeout_ms.
            settle_timeout: if cfg.chain.rpc_url.is_empty() {
                hanzod_pipeline::sink::LEDGER_TIMEOUT
            } else {
                Duration::from_millis(cfg.chain.tx_timeout_ms.saturating_mul(4))
            },
            ..Economics::new(
                ledger.clone(),
                GymWei::gym(cfg.chain.epoch_reward_gym),
                cfg.chain.slash_pct,
            )
        }),
        publication,
    )
    .await
    .map_err(|e| StartError::Validator(e.to_string()))
}

/// An empty state store beside a chain that holds this orchestrator's publications is a
/// full-node failure: rebuilds each job from the chain and the object store, so that it
/// resumes from its last published epoch (paper §10). Nothing on a store that holds events.
async fn recover_from_chain(
    store: &dyn StateStore,
    ledger: &dyn Ledger,
    objects: &dyn ObjectStore,
    identity: &Identity,
    clock: Option<&dyn Clock>,
) -> Result<(), StartError> {
    if store
        .last_seq()
        .await
        .map_err(|e| StartError::Store(e.to_string()))?
        == 0
    {
        let now = clock.map_or_else(|| hanzod_actors::ports::SystemClock.now(), |c| c.now());
        let recovery =
            hanzod_pipeline::recovery::rebuild(ledger, objects, store, identity.node_id().0, now)
                .await
                .map_err(|e| StartError::Store(format!("rebuilding from the chain: {e}")))?;
        for j in &recovery.jobs {
            tracing::info!(
                job = %j.job,
                next_epoch = j.next_epoch(),
                epochs = j.spec.epochs,
                last_checkpoint = j.checkpoints.last().map(String::as_str).unwrap_or(""),
                unpaid_epochs = ?j.unpaid,
                "job rebuilt from the chain's publication records; it resumes from its last published epoch"
            );
        }
        for (job, why) in &recovery.skipped {
            tracing::warn!(job = %job, %why, "job found on the chain but not rebuilt");
        }
        if !recovery.jobs.is_empty() {
            tracing::info!(
                jobs = recovery.jobs.len(),
                took_ms = recovery.took.as_millis() as u64,
                "state rebuilt from the chain"
            );
        }
    }
    Ok(())
}

/// Serves gRPC on `serving` until `shutdown` turns true.
fn spawn_grpc(
    server: GrpcServer,
    serving: Serving,
    shutdown: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<Result<(), ServeError>> {
    let mut stop = shutdown;
    let signal = async move { hanzod_protocol::status::stopped(&mut stop).await };
    tokio::spawn(async move {
        match serving {
            Serving::Tcp(l, Some(a)) => server.serve_tls(l, a, signal).await,
            Serving::Tcp(l, None) => server.serve(l, signal).await,
            Serving::Incoming(s) => {
                use futures_util::StreamExt;
                server
                    .serve_with_incoming(s.map(|r| r.map(AnyIo)), signal)
                    .await
            }
        }
    })
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `l` until `shutdown` turns true,
/// sampling the gauges from `core` at most once a second.
fn spawn_exporter(
    l: TcpListener,
    core: &OrchestratorHandle,
    metrics: Arc<PrometheusMetrics>,
    health: &Health,
    shutdown: watch::Receiver<bool>,
) -> (
    Option<SocketAddr>,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let addr = l.local_addr().ok();
    let mut stop = shutdown;
    let core2 = core.clone();
    let m2 = metrics.clone();
    // One sample in flight at a time, at most one a second: a scrape flood must
    // not queue work on the actors that handle heartbeats.
    let gate = Arc::new(tokio::sync::Mutex::new(None::<std::time::Instant>));
    let sample = move || {
        let core = core2.clone();
        let m = m2.clone();
        let gate = gate.clone();
        async move {
            let Ok(mut last) = gate.try_lock() else {
                return;
            };
            if last.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
                return;
            }
            m.sample_from(&core).await;
            *last = Some(std::time::Instant::now());
        }
        .boxed()
    };
    let task = tokio::spawn(crate::metrics::serve(
        l,
        metrics,
        health.clone(),
        sample,
        async move { hanzod_protocol::status::stopped(&mut stop).await },
    ));
    (addr, task)
}

/// Writes a snapshot of the log's fold every `state.snapshot_every` events, so a standby
/// (or a rebuilt actor) replays only the tail; through a fenced store a deposed leader's
/// snapshot is refused like its events.
fn spawn_snapshots(
    store: Arc<dyn StateStore>,
    cfg: &Config,
    shutdown: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let every = cfg.state.snapshot_every;
    // As often as the lease is renewed: two reads per check when none is due.
    let check = Duration::from_millis(cfg.state.campaign_ms);
    let mut stop = shutdown;
    tokio::spawn(async move {
        if every == 0 {
            return;
        }
        let mut tick = tokio::time::interval(check);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut known = None;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = hanzod_protocol::status::stopped(&mut stop) => return,
            }
            match hanzod_actors::replay::snapshot(&*store, every, &mut known).await {
                Ok(Some(seq)) => tracing::debug!(seq, "snapshot of the event log written"),
                Ok(None) => {}
                Err(e) => tracing::debug!(error = %e, "snapshot not written; will retry"),
            }
        }
    })
}

/// What a daemon on the in-memory event log says when it stops while jobs are still
/// running (not Published or Failed): one line naming each (id, name, phase) and that it
/// is lost, since a restarted daemon starts on an empty log. `None` when every job ended.
pub fn jobs_lost_at_stop(jobs: &[hanzod_actors::actor::job::JobView]) -> Option<String> {
    let running: Vec<String> = jobs
        .iter()
        .filter(|j| !j.phase.is_terminal())
        .map(|j| {
            // As `job watch` says it: epochs from 0, then a count of those published.
            let epoch = match &j.phase {
                hanzod_actors::job::JobPhase::Running { epoch, .. }
                | hanzod_actors::job::JobPhase::Aggregating { epoch, .. } => {
                    format!(" epoch {epoch}")
                }
                _ => String::new(),
            };
            format!(
                "job {} {:?} ({}{epoch}, {}/{} published)",
                j.id.0,
                j.name,
                j.phase.name(),
                j.checkpoints.len(),
                j.epochs
            )
        })
        .collect();
    if running.is_empty() {
        return None;
    }
    let n = match running.len() {
        1 => "1 job has not ended and is".to_string(),
        n => format!("{n} jobs have not ended and are"),
    };
    Some(format!(
        "stopping on the in-memory event log (VALKEY_URL is not set): {n} lost, since a \
         restarted daemon starts on an empty log: {}",
        running.join(", ")
    ))
}

/// What a daemon started on `cfg` should warn its operator about, one line each (the
/// daemon logs them at start): development-mode attestation, plaintext TLS, a throwaway
/// orchestrator key, the job and admin API open beyond loopback without a token, and an
/// event log in memory (`own_store`: the caller brought its own state store).
pub fn startup_warnings(cfg: &Config, own_store: bool) -> Vec<String> {
    let mut out = Vec::new();
    if cfg.nodes.attesters.is_empty() {
        out.push("DEVELOPMENT MODE: no trusted GPU attesters configured (nodes.attesters); GPU attestations are NOT checked".to_string());
    }
    if cfg.server.tls.cert.is_empty() {
        out.push("TLS is off (server.tls.cert is empty): node traffic is plaintext".to_string());
    }
    if cfg.orchestrator.key.is_empty() {
        out.push(
            "ORCHESTRATOR_KEY is not set: signing with a throwaway key (records and \
             spot-check secrets change at every restart; set it to keep one identity)"
                .to_string(),
        );
    }
    let loopback = match cfg.server.grpc_addr.parse::<SocketAddr>() {
        Ok(a) => a.ip().is_loopback(),
        Err(_) => cfg.server.grpc_addr.starts_with("localhost:"),
    };
    if !loopback && cfg.server.admin_token.is_empty() {
        out.push(format!(
            "the job and admin API listens on {} beyond loopback without an admin token \
             (HANZOD_ADMIN_TOKEN): anyone who reaches it can submit and cancel jobs",
            cfg.server.grpc_addr
        ));
    }
    if cfg.state.valkey_url.is_empty() && !own_store {
        out.push(
            "the event log is in memory (VALKEY_URL is not set): jobs do not survive a \
             restart of this daemon"
                .to_string(),
        );
    }
    out
}

#[cfg(test)]
mod startup_tests {
    use super::*;

    fn cfg(edit: impl FnOnce(&mut Config)) -> Config {
        let mut c = Config::load(None, |_| None).expect("the embedded defaults");
        edit(&mut c);
        c
    }

    /// Regression: a daemon open beyond loopback without an admin token, or signing with a
    /// throwaway key, or keeping its jobs only in memory, said nothing about it.
    #[test]
    fn serve_warns_about_an_open_api_a_throwaway_key_and_a_memory_log() {
        let has = |w: &[String], what: &str| w.iter().any(|l| l.contains(what));
        let open = startup_warnings(
            &cfg(|c| {
                c.server.grpc_addr = "0.0.0.0:9550".into();
                c.orchestrator.key.clear();
            }),
            false,
        );
        assert!(
            has(&open, "beyond loopback without an admin token"),
            "{open:?}"
        );
        assert!(has(&open, "throwaway key"), "{open:?}");
        assert!(has(&open, "jobs do not survive a restart"), "{open:?}");
        let closed = startup_warnings(
            &cfg(|c| {
                c.server.grpc_addr = "127.0.0.1:9550".into();
                c.orchestrator.key = "11".repeat(32);
                c.state.valkey_url = "redis://kv:6379".into();
            }),
            false,
        );
        assert!(!has(&closed, "admin token"), "{closed:?}");
        assert!(!has(&closed, "throwaway"), "{closed:?}");
        assert!(!has(&closed, "in memory"), "{closed:?}");
        let token = startup_warnings(
            &cfg(|c| {
                c.server.grpc_addr = "0.0.0.0:9550".into();
                c.server.admin_token = "s3cret".into();
            }),
            true,
        );
        assert!(!has(&token, "admin token"), "{token:?}");
        assert!(
            !has(&token, "in memory"),
            "an embedder's own store: {token:?}"
        );
    }

    /// Regression (issue 16): a daemon on the in-memory log stopped (SIGTERM) with jobs
    /// still training and said nothing; it now names each job it loses, and is quiet when
    /// every job has ended.
    #[test]
    fn sigterm_on_a_memory_log_names_the_running_jobs_it_loses() {
        use hanzod_actors::actor::job::JobView;
        use hanzod_actors::job::{FailReason, Job, JobPhase, JobSpec};
        use hanzod_actors::types::{JobId, Timestamp};
        let view = |id: u64, name: &str, phase: JobPhase| {
            let spec = JobSpec {
                name: name.into(),
                epochs: 5,
                min_nodes: 1,
                max_nodes: 4,
                min_vram_bytes: 0,
                pending_deadline_ms: 60_000,
                epoch_deadline_ms: 60_000,
                utility: 1.0,
                submitter_stake: GymWei::gym(1),
                training: Default::default(),
            };
            let mut v = JobView::of(&Job::new(JobId(id), spec, Timestamp(0)), None, 0);
            v.phase = phase;
            v
        };
        let published = view(
            60_480_000,
            "done",
            JobPhase::Published {
                epochs: 5,
                checkpoint: "bafy".into(),
            },
        );
        let failed = view(
            60_480_001,
            "broken",
            JobPhase::Failed {
                reason: FailReason::Cancelled,
                phase: "Running".into(),
                at: Timestamp(1),
            },
        );
        assert_eq!(
            jobs_lost_at_stop(&[published.clone(), failed.clone()]),
            None
        );
        assert_eq!(jobs_lost_at_stop(&[]), None);
        let mut running = view(
            60_480_002,
            "wine-quality-mlp",
            JobPhase::Running {
                epoch: 2,
                ring_version: 1,
            },
        );
        running.checkpoints = vec!["bafy0".into(), "bafy1".into()];
        let pending = view(
            60_480_003,
            "queued",
            JobPhase::Pending {
                submitted_at: Timestamp(0),
                deadline: Timestamp(60_000),
            },
        );
        let one = jobs_lost_at_stop(&[published.clone(), running.clone()]).unwrap();
        assert!(one.contains("in-memory event log"), "{one}");
        assert!(one.contains("1 job has not ended and is lost"), "{one}");
        assert!(
            one.contains("job 60480002 \"wine-quality-mlp\" (Running epoch 2, 2/5 published)"),
            "{one}"
        );
        assert!(!one.contains("60480000"), "an ended job is not lost: {one}");
        let two = jobs_lost_at_stop(&[running, failed, pending]).unwrap();
        assert!(two.contains("2 jobs have not ended and are lost"), "{two}");
        assert!(
            two.contains("job 60480003 \"queued\" (Pending, 0/5 published)"),
            "{two}"
        );
        assert!(!two.contains("60480001"), "{two}");
    }
}
