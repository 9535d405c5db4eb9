//! # hanzod-testkit
//!
//! The fault-injection test kit (DESIGN §2, §11); never a dependency of the product binary
//! (the `hanzod` binary's `testkit` feature adds `demo`, `sim` and `bench` on top of it):
//!
//! - the harness (this module): an orchestrator plus N simulated nodes in one process,
//!   scripted faults, and helpers to await conditions with a deadline;
//! - [`sim`]: the harness as a command (`hanzod sim`), in simulated time;
//! - [`demo`]: the main job (`hanzod demo`): a daemon and real node processes on loopback;
//! - [`bench`](mod@bench): the transport measurements of `hanzod bench`;
//! - the real servers tests start on loopback ([`process`]): Valkey ([`valkey_server`]), an
//!   IPFS node ([`ipfs_node`]), a Hub mirror and a fake Hub ([`fake_hub`]), anvil
//!   ([`anvil`]).
//!
//! One seed makes a run repeatable: it draws the nodes' regions, link capacities, compute
//! times and delta hashes, and [`FaultScript::random`] draws faults from it. The seed is
//! printed when a test using the harness panics, and `HANZOD_SEED` replays a given one.
//!
//! ```no_run
//! # async fn t() {
//! use hanzod_testkit::{Harness, HarnessConfig};
//! let h = Harness::start(HarnessConfig::new(8).seed_from_env_or(42)).await;
//! h.crash(3);
//! # }
//! ```
//!
//! Run tests that use it under `#[tokio::test(start_paused = true)]`: the heartbeat timeouts
//! (30 s) then pass in microseconds of real time, exactly and repeatably.

#![warn(missing_docs)]

pub mod anvil;
pub mod bench;
pub mod byzantine;
pub mod demo;
pub mod fake_hub;
pub mod ipfs_node;
pub mod process;
pub mod sim;
pub mod testbed;
pub mod valkey_server;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hanzod_actors::config::CoreConfig;
use hanzod_actors::job::{JobPhase, JobSpec};
use hanzod_actors::node::Heartbeat;
use hanzod_actors::orchestrator::ActorFault;
use hanzod_actors::ports::memory::{
    ChannelNodeLink, MemoryChain, MemoryCheckpointSink, MemoryMetrics, MemoryStateStore, TokioClock,
};
use hanzod_actors::ports::{
    CheckpointSink, Clock, DeltaReceipt, NodeCommand, RingView, StateStore, SystemClock,
};
use hanzod_actors::types::{GpuInfo, GymWei, JobId, LinkProfile, NodeId, NodeInfo, Timestamp};
use hanzod_actors::{Orchestrator, OrchestratorError, OrchestratorHandle};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::sync::{mpsc, watch};

/// Settings of a harness run.
#[derive(Debug, Clone)]
pub struct HarnessConfig {
    /// Number of simulated nodes.
    pub nodes: usize,
    /// The seed of everything random in the run.
    pub seed: u64,
    /// The orchestrator's settings.
    pub core: CoreConfig,
    /// Regions the nodes are spread over (round-robin after a seeded shuffle).
    pub regions: Vec<String>,
    /// Each node's stake.
    pub stake: GymWei,
    /// Each node's VRAM, bytes.
    pub vram_bytes: u64,
    /// Simulated nodes submit a delta receipt for each epoch of their job after a seeded
    /// compute time in this range, ms.
    pub compute_ms: (u64, u64),
    /// Whether simulated nodes submit deltas at all.
    pub auto_deltas: bool,
    /// The orchestrator clock's start (default: the wall clock). Fix it for output that
    /// is identical across runs of one seed.
    pub start_at: Option<Timestamp>,
    /// Print the seed to stderr at start and when a test panics (default true).
    pub print_seed: bool,
    /// The checkpoint sink the orchestrator publishes through, instead of the harness's
    /// [`MemoryCheckpointSink`] (which then stays empty): to run real publication ports
    /// under the harness's faults.
    pub checkpoint_sink: Option<Arc<dyn CheckpointSink>>,
}

impl HarnessConfig {
    /// `nodes` nodes, seed 0, default core settings but job ids from 1, 4 regions, 50,000
    /// GYM, 80 GiB.
    pub fn new(nodes: usize) -> Self {
        HarnessConfig {
            nodes,
            seed: 0,
            // The harness's log is its own and starts empty: its jobs are 1, 2, … (the
            // default, 0, would draw the first id from the clock).
            core: CoreConfig {
                first_job_id: 1,
                ..CoreConfig::default()
            },
            regions: ["us-east", "us-west", "eu-west", "ap-south"]
                .map(String::from)
                .to_vec(),
            stake: GymWei::gym(50_000),
            vram_bytes: 80 << 30,
            compute_ms: (2_000, 8_000),
            auto_deltas: true,
            start_at: None,
            print_seed: true,
            checkpoint_sink: None,
        }
    }

    /// Uses `HANZOD_SEED` from the environment when set, else `seed`.
    pub fn seed_from_env_or(mut self, seed: u64) -> Self {
        self.seed = std::env::var("HANZOD_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(seed);
        self
    }

    /// Whether simulated nodes submit deltas (off: jobs stay in their first epoch, for
    /// tests about membership only).
    pub fn auto_deltas(mut self, on: bool) -> Self {
        self.auto_deltas = on;
        self
    }

    /// Sets the core settings.
    pub fn core(mut self, core: CoreConfig) -> Self {
        self.core = core;
        self
    }

    /// Publishes through `sink` (see [`HarnessConfig::checkpoint_sink`]).
    pub fn checkpoint_sink(mut self, sink: Arc<dyn CheckpointSink>) -> Self {
        self.checkpoint_sink = Some(sink);
        self
    }
}

/// A scripted fault, addressed by node index (0-based, in the harness's node order).
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// The node dies silently (power loss, kernel hang): no more heartbeats and no closed
    /// session; the orchestrator notices at the heartbeat timeout.
    Crash(usize),
    /// The node process is killed and its session closes (the transport sees the stream
    /// end): the orchestrator notices at once.
    Disconnect(usize),
    /// The node stops heartbeating but keeps its session (a hung process).
    Hang(usize),
    /// A hung node resumes heartbeating (it re-registers if it was declared failed).
    Resume(usize),
    /// The node alternates `down_ms` of silence and `up_ms` of heartbeats, `cycles` times.
    Flap {
        /// The node.
        node: usize,
        /// Silence per cycle, ms.
        down_ms: u64,
        /// Heartbeating per cycle, ms.
        up_ms: u64,
        /// Cycles.
        cycles: u32,
    },
    /// The node heartbeats every `interval_ms` from now on.
    SlowHeartbeats {
        /// The node.
        node: usize,
        /// The new interval, ms.
        interval_ms: u64,
    },
    /// A crashed node comes back: registers again and heartbeats.
    Rejoin(usize),
    /// The node registers again while live (a duplicate registration of its key).
    DuplicateRegistration(usize),
    /// The orchestrator's actor for the node panics.
    PanicNodeActor(usize),
    /// The ring actor of the job panics.
    PanicRingActor(JobId),
    /// The job actor panics.
    PanicJobActor(JobId),
}

impl Fault {
    /// The node index the fault targets, if it targets a node.
    pub fn node(&self) -> Option<usize> {
        match self {
            Fault::Crash(i)
            | Fault::Disconnect(i)
            | Fault::Hang(i)
            | Fault::Resume(i)
            | Fault::Rejoin(i)
            | Fault::DuplicateRegistration(i)
            | Fault::PanicNodeActor(i)
            | Fault::Flap { node: i, .. }
            | Fault::SlowHeartbeats { node: i, .. } => Some(*i),
            Fault::PanicRingActor(_) | Fault::PanicJobActor(_) => None,
        }
    }
}

/// Why the harness refused a step.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HarnessError {
    /// The fault names a node index the harness does not have.
    #[error("no node {index}: the harness has {nodes} nodes")]
    NoSuchNode {
        /// The index given.
        index: usize,
        /// How many nodes there are.
        nodes: usize,
    },
    /// The orchestrator refused or did not answer.
    #[error(transparent)]
    Orchestrator(#[from] OrchestratorError),
}

/// Faults at times (ms after the script starts), applied in time order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FaultScript {
    /// (offset ms, fault), sorted by offset.
    pub steps: Vec<(u64, Fault)>,
}

impl FaultScript {
    /// Draws `count` node faults over `horizon_ms` for `nodes` nodes from `seed`: crashes,
    /// hangs (resumed later), flapping, slow heartbeats, duplicate registrations and
    /// node-actor panics. The same seed gives the same script.
    pub fn random(seed: u64, nodes: usize, count: usize, horizon_ms: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed_fa17);
        let mut steps = vec![];
        for _ in 0..count {
            if nodes == 0 {
                break;
            }
            let at = rng.gen_range(0..horizon_ms.max(1));
            let node = rng.gen_range(0..nodes);
            let fault = match rng.gen_range(0..7) {
                0 => Fault::Crash(node),
                6 => Fault::Disconnect(node),
                1 => {
                    let back = at + rng.gen_range(5_000..60_000);
                    steps.push((back, Fault::Resume(node)));
                    Fault::Hang(node)
                }
                2 => Fault::Flap {
                    node,
                    down_ms: rng.gen_range(5_000..45_000),
                    up_ms: rng.gen_range(5_000..30_000),
                    cycles: rng.gen_range(1..4),
                },
                3 => Fault::SlowHeartbeats {
                    node,
                    interval_ms: rng.gen_range(10_000..40_000),
                },
                4 => Fault::DuplicateRegistration(node),
                _ => Fault::PanicNodeActor(node),
            };
            steps.push((at, fault));
        }
        steps.sort_by_key(|(t, _)| *t);
        FaultScript { steps }
    }
}

/// What a simulated node has seen.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SimStatus {
    /// The ring it follows (the highest version it accepted).
    pub ring: Option<RingView>,
    /// Ring updates it rejected as stale (version not above its own).
    pub stale_rejected: u32,
    /// Successful registrations.
    pub registrations: u32,
    /// The session number of the latest registration (as the orchestrator counts them).
    pub session: u32,
    /// Heartbeats accepted by the orchestrator.
    pub heartbeats: u64,
    /// Heartbeats refused (any reason).
    pub heartbeats_refused: u64,
    /// Deltas accepted.
    pub deltas: u32,
    /// Whether the process is running (false after a crash).
    pub running: bool,
    /// Whether it is heartbeating (false while hung).
    pub heartbeating: bool,
    /// The epoch assignments it received, in order (resends included): (job, epoch, base
    /// checkpoint).
    pub assignments: Vec<(JobId, u32, Option<String>)>,
}

enum Control {
    Crash,
    Hang,
    Resume,
    Interval(u64),
    Reregister,
    Flap {
        down_ms: u64,
        up_ms: u64,
        cycles: u32,
    },
}

struct SimNode {
    id: NodeId,
    info: NodeInfo,
    control: Option<mpsc::UnboundedSender<Control>>,
    status: watch::Receiver<SimStatus>,
}

/// An orchestrator with simulated nodes. Dropping it after a panic prints the seed.
pub struct Harness {
    /// The orchestrator under test.
    pub orch: OrchestratorHandle,
    /// Its event log.
    pub store: Arc<MemoryStateStore>,
    /// Its ledger.
    pub chain: Arc<MemoryChain>,
    /// Its checkpoint sink.
    pub sink: Arc<MemoryCheckpointSink>,
    /// Its node link.
    pub link: ChannelNodeLink,
    /// Its metrics.
    pub metrics: Arc<MemoryMetrics>,
    cfg: HarnessConfig,
    nodes: Vec<SimNode>,
    rng: ChaCha8Rng,
}

impl Drop for Harness {
    fn drop(&mut self) {
        if std::thread::panicking() && self.cfg.print_seed {
            eprintln!(
                "hanzod testkit: run seed = {} (replay with HANZOD_SEED={})",
                self.cfg.seed, self.cfg.seed
            );
        }
    }
}

/// A condition that did not hold by its deadline, or can no longer hold.
#[derive(Debug, Clone, thiserror::Error)]
#[error("gave up after {waited_ms} ms waiting for {what} (seed {seed})")]
pub struct WaitError {
    /// What was awaited.
    pub what: String,
    /// How long, ms.
    pub waited_ms: u64,
    /// The run's seed.
    pub seed: u64,
}

impl Harness {
    /// Starts an orchestrator on fresh in-memory ports and registers `cfg.nodes` nodes,
    /// each heartbeating. Prints the seed.
    pub async fn start(cfg: HarnessConfig) -> Harness {
        Self::start_on(cfg, Arc::new(MemoryStateStore::new())).await
    }

    /// As [`Harness::start`], on an existing event log (to test rebuilding from it).
    pub async fn start_on(cfg: HarnessConfig, store: Arc<MemoryStateStore>) -> Harness {
        if cfg.print_seed {
            eprintln!("hanzod testkit: seed = {}", cfg.seed);
        }
        let chain = Arc::new(MemoryChain::new());
        let sink = Arc::new(MemoryCheckpointSink::new());
        let link = ChannelNodeLink::new();
        let metrics = Arc::new(MemoryMetrics::new());
        // Time never runs backwards across a restart on the same log, even when the
        // previous run advanced paused tokio time far beyond the wall clock.
        let last = store
            .read_after(0)
            .await
            .ok()
            .and_then(|r| r.last().map(|r| r.at))
            .unwrap_or_default();
        let start = cfg.start_at.unwrap_or_else(|| SystemClock.now());
        let clock = TokioClock::starting_at(start.max(last.plus_ms(1)));
        let orch = Orchestrator::builder()
            .clock(Arc::new(clock))
            .metrics(metrics.clone())
            .config(cfg.core.clone())
            .state_store(store.clone())
            .chain(chain.clone())
            .checkpoint_sink(match &cfg.checkpoint_sink {
                Some(custom) => custom.clone(),
                None => sink.clone(),
            })
            .node_link(Arc::new(link.clone()))
            .start()
            .await
            .expect("orchestrator starts");
        let mut h = Harness {
            orch,
            store,
            chain,
            sink,
            link,
            metrics,
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            cfg,
            nodes: vec![],
        };
        for _ in 0..h.cfg.nodes {
            h.add_node().await;
        }
        h
    }

    /// The run's seed.
    pub fn seed(&self) -> u64 {
        self.cfg.seed
    }

    /// Adds and starts one more simulated node (a standby once jobs are placed); returns
    /// its index.
    pub async fn add_node(&mut self) -> usize {
        let index = self.nodes.len();
        let mut key = [0u8; 32];
        self.rng.fill(&mut key);
        let id = NodeId(key);
        let region = match self.cfg.regions.len() {
            0 => "default".to_string(),
            n => self.cfg.regions[self.rng.gen_range(0..n)].clone(),
        };
        let info = NodeInfo {
            id,
            gpu: GpuInfo {
                model: "NVIDIA H100 80GB HBM3".into(),
                vram_bytes: self.cfg.vram_bytes,
                compute_cap: (9, 0),
                driver_sig: vec![],
            },
            link: LinkProfile {
                up_mbps: self.rng.gen_range(100.0..10_000.0),
                down_mbps: self.rng.gen_range(100.0..10_000.0),
            },
            region,
        };
        self.chain.set_stake(id, self.cfg.stake);
        let node_seed = self.rng.gen::<u64>();
        let (status_tx, status_rx) = watch::channel(SimStatus::default());
        let (ctl_tx, ctl_rx) = mpsc::unbounded_channel();
        let commands = self.link.connect(id);
        let sim = Sim {
            info: info.clone(),
            orch: self.orch.clone(),
            clock: self.orch.clock(),
            status: status_tx,
            commands,
            control: ctl_rx,
            interval_ms: self.cfg.core.heartbeat.interval_ms,
            compute_ms: self.cfg.compute_ms,
            auto_deltas: self.cfg.auto_deltas,
            rng: ChaCha8Rng::seed_from_u64(node_seed),
            last_epoch: None,
        };
        // Registration is done before returning, so the node exists when the caller goes on.
        sim.register().await;
        tokio::spawn(sim.run());
        self.nodes.push(SimNode {
            id,
            info,
            control: Some(ctl_tx),
            status: status_rx,
        });
        index
    }

    /// The id of node `index`.
    ///
    /// # Panics
    /// When `index` is not below the number of nodes (a bug in the test).
    pub fn node_id(&self, index: usize) -> NodeId {
        self.nodes[index].id
    }

    /// All node ids, in index order.
    pub fn node_ids(&self) -> Vec<NodeId> {
        self.nodes.iter().map(|n| n.id).collect()
    }

    /// The index of `id`.
    pub fn index_of(&self, id: &NodeId) -> Option<usize> {
        self.nodes.iter().position(|n| n.id == *id)
    }

    /// What node `index` has seen.
    ///
    /// # Panics
    /// When `index` is not below the number of nodes (a bug in the test).
    pub fn status(&self, index: usize) -> SimStatus {
        self.nodes[index].status.borrow().clone()
    }

    fn control(&self, index: usize, c: Control) {
        if let Some(tx) = &self.nodes[index].control {
            let _ = tx.send(c);
        }
    }

    /// Kills node `index`'s process: it stops heartbeating and answering.
    pub fn crash(&self, index: usize) {
        self.control(index, Control::Crash);
    }

    /// Kills node `index`'s process and closes its session, as the transport would report.
    pub fn disconnect(&self, index: usize) {
        self.control(index, Control::Crash);
        let id = self.node_id(index);
        self.link.disconnect(&id);
        self.orch.session_closed(id, self.status(index).session);
    }

    /// Hangs node `index`: no more heartbeats until [`Harness::resume`].
    pub fn hang(&self, index: usize) {
        self.control(index, Control::Hang);
    }

    /// Resumes a hung node.
    pub fn resume(&self, index: usize) {
        self.control(index, Control::Resume);
    }

    /// Sets node `index`'s heartbeat interval, ms.
    pub fn slow_heartbeats(&self, index: usize, interval_ms: u64) {
        self.control(index, Control::Interval(interval_ms));
    }

    /// Makes node `index` flap.
    pub fn flap(&self, index: usize, down_ms: u64, up_ms: u64, cycles: u32) {
        self.control(
            index,
            Control::Flap {
                down_ms,
                up_ms,
                cycles,
            },
        );
    }

    /// Registers node `index` again while it is live.
    pub fn duplicate_registration(&self, index: usize) {
        self.control(index, Control::Reregister);
    }

    /// Brings a crashed node back as a fresh process with the same key.
    pub async fn rejoin(&mut self, index: usize) {
        let (status_tx, status_rx) = watch::channel(SimStatus::default());
        let (ctl_tx, ctl_rx) = mpsc::unbounded_channel();
        let info = self.nodes[index].info.clone();
        let sim = Sim {
            commands: self.link.connect(info.id),
            info,
            orch: self.orch.clone(),
            clock: self.orch.clock(),
            status: status_tx,
            control: ctl_rx,
            interval_ms: self.cfg.core.heartbeat.interval_ms,
            compute_ms: self.cfg.compute_ms,
            auto_deltas: self.cfg.auto_deltas,
            rng: ChaCha8Rng::seed_from_u64(self.rng.gen()),
            last_epoch: None,
        };
        sim.register().await;
        tokio::spawn(sim.run());
        self.nodes[index].control = Some(ctl_tx);
        self.nodes[index].status = status_rx;
    }

    /// Applies one fault now. A fault naming a node index the harness does not have is
    /// refused with [`HarnessError::NoSuchNode`].
    pub async fn apply(&mut self, fault: &Fault) -> Result<(), HarnessError> {
        tracing::info!(?fault, "injecting fault");
        if let Some(index) = fault.node() {
            if index >= self.nodes.len() {
                return Err(HarnessError::NoSuchNode {
                    index,
                    nodes: self.nodes.len(),
                });
            }
        }
        match fault {
            Fault::Crash(i) => self.crash(*i),
            Fault::Disconnect(i) => self.disconnect(*i),
            Fault::Hang(i) => self.hang(*i),
            Fault::Resume(i) => self.resume(*i),
            Fault::Flap {
                node,
                down_ms,
                up_ms,
                cycles,
            } => self.flap(*node, *down_ms, *up_ms, *cycles),
            Fault::SlowHeartbeats { node, interval_ms } => {
                self.slow_heartbeats(*node, *interval_ms)
            }
            Fault::Rejoin(i) => self.rejoin(*i).await,
            Fault::DuplicateRegistration(i) => self.duplicate_registration(*i),
            Fault::PanicNodeActor(i) => {
                self.orch
                    .inject(ActorFault::PanicNodeActor(self.node_id(*i)))
                    .await?;
            }
            Fault::PanicRingActor(j) => {
                self.orch.inject(ActorFault::PanicRingActor(*j)).await?;
            }
            Fault::PanicJobActor(j) => {
                self.orch.inject(ActorFault::PanicJobActor(*j)).await?;
            }
        }
        Ok(())
    }

    /// Runs `script`, sleeping (tokio time) between steps; stops at the first refused step.
    pub async fn run_script(&mut self, script: &FaultScript) -> Result<(), HarnessError> {
        let start = tokio::time::Instant::now();
        for (at, fault) in &script.steps {
            tokio::time::sleep_until(start + Duration::from_millis(*at)).await;
            self.apply(fault).await?;
        }
        Ok(())
    }

    /// A job spec sized for this harness: `nodes` nodes, `epochs` epochs, generous deadlines.
    pub fn job_spec(&self, name: &str, nodes: u32, epochs: u32) -> JobSpec {
        JobSpec {
            name: name.into(),
            epochs,
            min_nodes: 2.min(nodes),
            max_nodes: nodes,
            min_vram_bytes: 16 << 30,
            pending_deadline_ms: 600_000,
            epoch_deadline_ms: 120_000,
            utility: 1.0,
            submitter_stake: GymWei::gym(100_000),
            training: Default::default(),
        }
    }

    /// Submits `spec` and waits (60 s of tokio time at most) for its first ring.
    ///
    /// # Panics
    /// When the job is refused or no ring forms in time (the seed is printed).
    pub async fn submit_and_form(&self, spec: JobSpec) -> (JobId, RingView) {
        let job = match self.orch.submit_job(spec).await {
            Ok(job) => job,
            Err(e) => panic!("job refused: {e} (seed {})", self.cfg.seed),
        };
        match self
            .await_ring(job, Duration::from_secs(60), "ring v1", |r| r.version == 1)
            .await
        {
            Ok(ring) => (job, ring),
            Err(e) => panic!("{e}"),
        }
    }

    /// Injects an actor fault and waits (60 s of tokio time at most) until its supervisor
    /// reports the rebuild; returns what was rebuilt (e.g. `ring job-1`, `scheduler`).
    pub async fn panic_and_await_restart(&self, fault: ActorFault) -> Result<String, WaitError> {
        let mut notices = self.orch.subscribe();
        let gave_up = |what: &str| WaitError {
            what: format!("rebuild after {fault:?} ({what})"),
            waited_ms: 0,
            seed: self.cfg.seed,
        };
        if !self.orch.inject(fault).await.unwrap_or(false) {
            return Err(gave_up("no such actor"));
        }
        let wait = async {
            loop {
                match notices.recv().await {
                    Ok(hanzod_actors::actor::Notice::ActorRestarted { what }) => return Some(what),
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(_) => return None,
                }
            }
        };
        match tokio::time::timeout(Duration::from_secs(60), wait).await {
            Ok(Some(what)) => Ok(what),
            _ => Err(gave_up("no restart reported")),
        }
    }

    /// Polls `probe` every 50 ms (tokio time) until it returns `Some`, or fails after
    /// `deadline`.
    pub async fn wait_for<T, F, Fut>(
        &self,
        what: &str,
        deadline: Duration,
        mut probe: F,
    ) -> Result<T, WaitError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        let start = tokio::time::Instant::now();
        loop {
            if let Some(v) = probe().await {
                return Ok(v);
            }
            if start.elapsed() >= deadline {
                return Err(WaitError {
                    what: what.into(),
                    waited_ms: start.elapsed().as_millis() as u64,
                    seed: self.cfg.seed,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until `job`'s ring satisfies `pred`; returns it.
    pub async fn await_ring(
        &self,
        job: JobId,
        deadline: Duration,
        what: &str,
        pred: impl Fn(&RingView) -> bool,
    ) -> Result<RingView, WaitError> {
        let orch = self.orch.clone();
        self.wait_for(what, deadline, || {
            let orch = orch.clone();
            let pred = &pred;
            async move {
                match orch.ring(job).await {
                    Ok(Some(r)) if pred(&r) => Some(r),
                    _ => None,
                }
            }
        })
        .await
    }

    /// Waits until `job`'s ring has version `version` and exactly `members` (any order).
    pub async fn await_ring_version(
        &self,
        job: JobId,
        version: u64,
        members: &[NodeId],
        deadline: Duration,
    ) -> Result<RingView, WaitError> {
        let mut want = members.to_vec();
        want.sort();
        self.await_ring(job, deadline, &format!("{job} ring v{version}"), |r| {
            let mut have = r.members.clone();
            have.sort();
            r.version == version && have == want
        })
        .await
    }

    /// Waits until `job`'s phase satisfies `pred`; returns it.
    pub async fn await_phase(
        &self,
        job: JobId,
        deadline: Duration,
        what: &str,
        pred: impl Fn(&JobPhase) -> bool,
    ) -> Result<JobPhase, WaitError> {
        let orch = self.orch.clone();
        self.wait_for(what, deadline, || {
            let orch = orch.clone();
            let pred = &pred;
            async move {
                match orch.job(job).await {
                    Ok(v) if pred(&v.phase) => Some(v.phase),
                    _ => None,
                }
            }
        })
        .await
    }

    /// Waits until `job` ends (Published or Failed); returns its final phase.
    pub async fn await_end(&self, job: JobId, deadline: Duration) -> Result<JobPhase, WaitError> {
        self.await_phase(job, deadline, &format!("{job} to end"), |p| p.is_terminal())
            .await
    }

    /// Waits until node `index` is reported dead (`alive == false`) by the orchestrator.
    pub async fn await_node_failed(
        &self,
        index: usize,
        deadline: Duration,
    ) -> Result<(), WaitError> {
        let id = self.node_id(index);
        let orch = self.orch.clone();
        self.wait_for(&format!("node {index} failed"), deadline, || {
            let orch = orch.clone();
            async move {
                let nodes = orch.nodes().await.ok()?;
                nodes.iter().any(|n| n.id == id && !n.alive).then_some(())
            }
        })
        .await
    }

    /// Waits until every running member of `job`'s current ring follows exactly that ring
    /// (same version, same order); returns it.
    pub async fn await_members_agree(
        &self,
        job: JobId,
        deadline: Duration,
    ) -> Result<RingView, WaitError> {
        let what = format!("{job} members agree on the ring");
        let orch = self.orch.clone();
        let outcome = self
            .wait_for(&what, deadline, || {
                let orch = orch.clone();
                async move {
                    // A job that ended released its members: they will never agree.
                    if let Ok(v) = orch.job(job).await {
                        if v.phase.is_terminal() {
                            return Some(Err(v.phase.name()));
                        }
                    }
                    let ring = orch.ring(job).await.ok()??;
                    let agree = ring.members.iter().all(|m| {
                        self.index_of(m).is_some_and(|i| {
                            let s = self.status(i);
                            s.running && s.ring.as_ref() == Some(&ring)
                        })
                    });
                    agree.then_some(Ok(ring))
                }
            })
            .await?;
        outcome.map_err(|phase| WaitError {
            what: format!("{what}, but the job ended ({phase})"),
            waited_ms: 0,
            seed: self.cfg.seed,
        })
    }

    /// The recorded events of the log (for assertions on what was made durable).
    pub async fn records(&self) -> Vec<hanzod_actors::events::Record> {
        self.store.read_after(0).await.unwrap_or_default()
    }

    /// Per node: (index, id, status), for diagnostics.
    pub fn statuses(&self) -> BTreeMap<usize, SimStatus> {
        (0..self.nodes.len()).map(|i| (i, self.status(i))).collect()
    }
}

/// The members of `ring` other than `failed`, in ring order: what Algorithm 2 leaves.
pub fn survivors(ring: &RingView, failed: &[NodeId]) -> Vec<NodeId> {
    ring.members
        .iter()
        .copied()
        .filter(|m| !failed.contains(m))
        .collect()
}

/// One simulated node process.
struct Sim {
    info: NodeInfo,
    orch: OrchestratorHandle,
    clock: Arc<dyn Clock>,
    status: watch::Sender<SimStatus>,
    commands: mpsc::UnboundedReceiver<NodeCommand>,
    control: mpsc::UnboundedReceiver<Control>,
    interval_ms: u64,
    compute_ms: (u64, u64),
    auto_deltas: bool,
    rng: ChaCha8Rng,
    last_epoch: Option<(JobId, u32)>,
}

impl Sim {
    async fn register(&self) -> bool {
        match self.orch.register_node(self.info.clone()).await {
            Ok(reg) => {
                self.status.send_modify(|s| {
                    s.registrations += 1;
                    s.session = reg.sessions;
                    s.running = true;
                    s.heartbeating = true;
                });
                true
            }
            Err(e) => {
                tracing::warn!(node = %self.info.id.short(), error = %e, "simulated node could not register");
                false
            }
        }
    }

    async fn run(mut self) {
        use tokio::time::{sleep_until, Instant};
        let mut seq = 0u64;
        let mut heartbeating = true;
        let mut next_hb = Instant::now();
        let mut flap: Option<(u64, u64, u32)> = None;
        let mut flap_at = Instant::now();
        let mut delta_at: Option<Instant> = None;
        let far = Duration::from_secs(86_400 * 365);
        loop {
            let hb_at = if heartbeating {
                next_hb
            } else {
                Instant::now() + far
            };
            let flap_due = if flap.is_some() {
                flap_at
            } else {
                Instant::now() + far
            };
            let delta_due = delta_at.unwrap_or_else(|| Instant::now() + far);
            tokio::select! {
                _ = sleep_until(hb_at), if heartbeating => {
                    seq += 1;
                    let hb = Heartbeat {
                        node: self.info.id,
                        seq,
                        timestamp: self.clock.now(),
                        gpu_utilization: 0.9,
                        memory_used: 40 << 30,
                        current_step: seq,
                    };
                    match self.orch.heartbeat(hb).await {
                        Ok(_) => self.status.send_modify(|s| s.heartbeats += 1),
                        Err(OrchestratorError::Heartbeat(_)) => {
                            self.status.send_modify(|s| s.heartbeats_refused += 1);
                            // Declared failed (or forgotten): register again, new session.
                            if self.register().await {
                                seq = 0;
                            }
                        }
                        Err(_) => self.status.send_modify(|s| s.heartbeats_refused += 1),
                    }
                    next_hb = Instant::now() + Duration::from_millis(self.interval_ms);
                }
                _ = sleep_until(flap_due), if flap.is_some() => {
                    if let Some((down, up, cycles)) = flap {
                        if heartbeating {
                            heartbeating = false;
                            flap_at = Instant::now() + Duration::from_millis(down);
                        } else {
                            heartbeating = true;
                            next_hb = Instant::now();
                            flap = (cycles > 1).then_some((down, up, cycles - 1));
                            flap_at = Instant::now() + Duration::from_millis(up);
                        }
                        self.status.send_modify(|s| s.heartbeating = heartbeating);
                    }
                }
                _ = sleep_until(delta_due), if delta_at.is_some() => {
                    delta_at = None;
                    if heartbeating {
                        self.submit_delta().await;
                    }
                    // Keep training while in a ring: the next epoch's delta follows.
                    if self.status.borrow().ring.is_some() {
                        delta_at = Some(Instant::now() + self.compute_time());
                    }
                }
                cmd = self.commands.recv() => {
                    let Some(cmd) = cmd else { break };
                    if !heartbeating {
                        continue; // hung: not processing anything
                    }
                    match cmd {
                        NodeCommand::RingUpdate(ring) => {
                            let mut accepted = false;
                            self.status.send_modify(|s| match &s.ring {
                                Some(r) if r.job == ring.job && r.version >= ring.version => {
                                    if r.version > ring.version { s.stale_rejected += 1; }
                                }
                                _ => { s.ring = Some(ring.clone()); accepted = true; }
                            });
                            if accepted && self.auto_deltas {
                                delta_at = Some(Instant::now() + self.compute_time());
                            }
                        }
                        NodeCommand::Release { job } => {
                            self.status.send_modify(|s| if s.ring.as_ref().is_some_and(|r| r.job == job) { s.ring = None; });
                            delta_at = None;
                        }
                        NodeCommand::EpochStart(a) => {
                            self.status.send_modify(|s| s.assignments.push((a.job, a.epoch, a.base.clone())));
                        }
                        // A simulated node trains nothing and takes part in no round.
                        NodeCommand::ProbeRequest { .. }
                        | NodeCommand::SketchRequest { .. }
                        | NodeCommand::ReduceStart { .. }
                        | NodeCommand::UploadRequest { .. } => {}
                    }
                }
                ctl = self.control.recv() => {
                    match ctl {
                        None | Some(Control::Crash) => {
                            self.status.send_modify(|s| { s.running = false; s.heartbeating = false; });
                            return;
                        }
                        Some(Control::Hang) => heartbeating = false,
                        Some(Control::Resume) => { heartbeating = true; next_hb = Instant::now(); }
                        Some(Control::Interval(ms)) => self.interval_ms = ms,
                        Some(Control::Reregister) => { if self.register().await { seq = 0; } }
                        Some(Control::Flap { down_ms, up_ms, cycles }) => {
                            flap = Some((down_ms, up_ms, cycles));
                            flap_at = Instant::now();
                        }
                    }
                    self.status.send_modify(|s| s.heartbeating = heartbeating);
                }
            }
        }
    }

    fn compute_time(&mut self) -> Duration {
        let (lo, hi) = self.compute_ms;
        Duration::from_millis(if hi > lo {
            self.rng.gen_range(lo..hi)
        } else {
            lo
        })
    }

    /// Submits this node's delta for its job's current epoch, then schedules the next.
    async fn submit_delta(&mut self) {
        let Some(ring) = self.status.borrow().ring.clone() else {
            return;
        };
        let Ok(view) = self.orch.job(ring.job).await else {
            return;
        };
        let JobPhase::Running { epoch, .. } = view.phase else {
            // Between epochs: look again after another compute time.
            return;
        };
        if self.last_epoch == Some((ring.job, epoch)) {
            return; // already submitted this epoch's delta
        }
        let mut delta_hash = [0u8; 32];
        self.rng.fill(&mut delta_hash);
        let receipt = DeltaReceipt {
            job: ring.job,
            node: self.info.id,
            epoch,
            step: u64::from(epoch + 1) * 100,
            delta_hash,
            claimed_loss: 1.0,
            signature: Vec::new(),
        };
        if self.orch.submit_delta(receipt).await.is_ok() {
            self.last_epoch = Some((ring.job, epoch));
            self.status.send_modify(|s| s.deltas += 1);
        }
    }
}
