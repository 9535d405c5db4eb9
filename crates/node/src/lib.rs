//! # hanzod-node
//!
//! `hanzod node`: the node agent (DESIGN §3, paper §4.1 and §4.4). It depends on no chain
//! client, no state store and no HTTP server: a GPU node needs none of them.
//!
//! It registers with its Ed25519 key (challenge–response), keeps one session stream open,
//! heartbeats at the interval the orchestrator gives, answers probe requests with a timed
//! TCP transfer to the named peer, follows ring updates (ignoring versions lower than one it
//! holds), and reconnects with exponential backoff and full jitter when the orchestrator
//! goes away. What happens is reported as [`AgentEvent`]s.
//!
//! In ring aggregation (an `EpochStart` with seed commitments) it commits to its delta
//! instead of uploading it, and sketches, all-reduces and uploads as the orchestrator asks
//! ([`ring`]); its peer endpoint then carries ring links as well as probes
//! ([`probe::serve_peers`] with [`Agent::ring_router`]).
#![warn(missing_docs)]

pub mod attack;
pub mod collude;
pub mod probe;
pub mod protocol;
pub mod ring;
pub mod trainer;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use hanzod_actors::ports::{Clock, SystemClock};
use hanzod_actors::types::{JobId, NodeId};
use hanzod_proto::v1 as pb;
use hanzod_proto::v1::node_service_client::NodeServiceClient;
use rand::Rng;
use serde::Serialize;
use tokio::sync::{broadcast, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use hanzod_protocol::client::{tcp_dial, ClientOptions, Dial};
use hanzod_protocol::identity::Identity;

/// What the node declares and how it behaves.
#[derive(Debug, Clone)]
pub struct AgentSettings {
    /// How to reach the orchestrator.
    pub orchestrator: ClientOptions,
    /// GPU model, e.g. `NVIDIA A100-SXM4-80GB`.
    pub gpu_model: String,
    /// GPU memory, bytes.
    pub vram_bytes: u64,
    /// CUDA compute capability.
    pub compute_cap: (u8, u8),
    /// Attestation signature (empty in development mode).
    pub driver_sig: Vec<u8>,
    /// Declared upload capacity, Mbit/s.
    pub up_mbps: f32,
    /// Declared download capacity, Mbit/s.
    pub down_mbps: f32,
    /// Region label, `[a-z0-9-]`.
    pub region: String,
    /// `host:port` where peers reach this node's probe listener.
    pub advertise: String,
    /// First reconnect delay, ms; doubles per failed attempt up to `backoff_max_ms`, with
    /// jitter (a delay drawn uniformly in [cap/2, cap], so a fleet that lost the
    /// orchestrator at once does not come back at once, yet none retries too early).
    pub backoff_min_ms: u64,
    /// See `backoff_min_ms`.
    pub backoff_max_ms: u64,
    /// How it trains: honestly, or Byzantine for fault injection.
    pub behaviour: trainer::Behaviour,
    /// How it takes part in ring aggregation: honestly, or Byzantine for fault injection.
    pub ring_fault: trainer::RingFault,
    /// The side channel it shares with its colluders (`--collude`, `--colluders`), read by
    /// the colluding attacks ([`attack::Attack::colludes`]); `None`: they forge from their
    /// own delta alone.
    pub collusion: Option<collude::Collusion>,
    /// How it runs ring all-reduce rounds.
    pub round: ring::RoundSettings,
    /// Train the epochs it is assigned (`false`: ignore assignments, a node that only
    /// holds its session; for simulated networks, whose virtual clock cannot time real
    /// computation on blocking threads).
    pub train: bool,
}

impl AgentSettings {
    /// A node reaching the orchestrator through `orchestrator`, in `region`, reachable by
    /// peers at `advertise`, declaring one NVIDIA A100-SXM4-80GB (80 GiB, compute
    /// capability 8.0, no attestation), 1,000 Mbit/s each way, reconnect backoff from
    /// 500 ms to 30 s: a test and simulation default, since nothing is detected (`hanzod
    /// node` declares no GPU memory it is not given with `--vram-gib`).
    pub fn new(
        orchestrator: ClientOptions,
        region: impl Into<String>,
        advertise: impl Into<String>,
    ) -> AgentSettings {
        AgentSettings {
            orchestrator,
            gpu_model: "NVIDIA A100-SXM4-80GB".into(),
            vram_bytes: 80 << 30,
            compute_cap: (8, 0),
            driver_sig: Vec::new(),
            up_mbps: 1000.0,
            down_mbps: 1000.0,
            region: region.into(),
            advertise: advertise.into(),
            backoff_min_ms: 500,
            backoff_max_ms: 30_000,
            behaviour: trainer::Behaviour::Honest,
            ring_fault: trainer::RingFault::Honest,
            collusion: None,
            round: ring::RoundSettings::default(),
            train: true,
        }
    }
}

/// Something the agent did or saw. Printed by `hanzod node` (one JSON object per line with
/// `--json`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum AgentEvent {
    /// Registered and opened a session.
    Registered {
        /// This node's id.
        node: String,
        /// Registrations of this key so far (1 the first time).
        registrations: u32,
        /// Heartbeat interval, ms.
        heartbeat_interval_ms: u64,
    },
    /// Applied a ring version.
    RingApplied {
        /// The job.
        job: u64,
        /// The version.
        version: u64,
        /// Members in ring order (hex ids).
        members: Vec<String>,
    },
    /// Ignored a ring version lower than the one held.
    RingIgnored {
        /// The job.
        job: u64,
        /// The version received.
        version: u64,
        /// The version held.
        have: u64,
    },
    /// Released from a job.
    Released {
        /// The job.
        job: u64,
    },
    /// Was assigned an epoch and started on it.
    EpochAssigned {
        /// The job.
        job: u64,
        /// The epoch.
        epoch: u32,
        /// The checkpoint it trains from (`None`: the recipe's initial weights).
        base: Option<String>,
    },
    /// Trained an epoch and the daemon accepted the delta.
    DeltaUploaded {
        /// The job.
        job: u64,
        /// The epoch.
        epoch: u32,
        /// The claimed loss sent.
        claimed_loss: f64,
        /// The last local step's batch loss.
        last_loss: f64,
        /// SHA-256 of the delta (hex).
        delta_hash: String,
        /// Size of the delta, bytes.
        bytes: usize,
        /// Checkpoint download, ms.
        fetch_ms: u64,
        /// Local steps, ms.
        train_ms: u64,
        /// Upload, ms.
        upload_ms: u64,
    },
    /// An epoch's work failed; the node waits for the assignment to be resent.
    EpochFailed {
        /// The job.
        job: u64,
        /// The epoch.
        epoch: u32,
        /// Why.
        reason: String,
    },
    /// Measured a link.
    Probed {
        /// The peer (hex id).
        peer: String,
        /// Throughput, Mbit/s (0 when failed).
        mbps: f32,
        /// Why it failed, if it did.
        error: Option<String>,
    },
    /// The orchestrator refused a message.
    Rejected {
        /// The message's sequence number.
        seq: u64,
        /// The gRPC code.
        code: i32,
        /// Why.
        reason: String,
    },
    /// The session ended.
    Disconnected {
        /// Why.
        reason: String,
    },
    /// Committed to its epoch delta (ring aggregation, `CommitDelta`).
    DeltaCommitted {
        /// The job.
        job: u64,
        /// The epoch.
        epoch: u32,
        /// SHA-256 of the delta (hex).
        delta_hash: String,
        /// Size of the delta, bytes.
        bytes: usize,
        /// The claimed loss stated.
        claimed_loss: f64,
    },
    /// Submitted a sketch of its committed delta (`SubmitSketch`).
    SketchSubmitted {
        /// The job.
        job: u64,
        /// The epoch.
        epoch: u32,
        /// Under the check seed (`true`) or the scoring seed.
        check: bool,
        /// Counters of the sketch.
        rows: u32,
        /// The spot-check selected it: the delta is uploaded too.
        delta_upload: bool,
    },
    /// Started an all-reduce round.
    RoundStarted {
        /// The job.
        job: u64,
        /// The epoch.
        epoch: u32,
        /// The round's ring version.
        ring_version: u64,
        /// Members of the round.
        members: usize,
        /// This node's position in the ring (0-based).
        position: usize,
        /// This node's weight w_i.
        weight: f32,
    },
    /// Finished an all-reduce round and reported its result (`ReportReduction`).
    RoundFinished {
        /// The job.
        job: u64,
        /// The epoch.
        epoch: u32,
        /// The round's ring version.
        ring_version: u64,
        /// From the links being up to the result, ms.
        elapsed_ms: u64,
        /// Payload bytes sent to the successor.
        bytes_sent: u64,
        /// Payload bytes received from the predecessor.
        bytes_received: u64,
        /// SHA-256 of the result's HZDL payload (hex).
        result_hash: String,
    },
    /// A round failed; the node waits for the next `ReduceStart` or `UploadRequest`.
    RoundFailed {
        /// The job.
        job: u64,
        /// The epoch.
        epoch: u32,
        /// The round's ring version.
        ring_version: u64,
        /// The member the data plane suspects (hex id), if any.
        suspect: Option<String>,
        /// Why.
        reason: String,
    },
    /// A newer ring version aborted a running round.
    RoundAborted {
        /// The job.
        job: u64,
        /// The epoch.
        epoch: u32,
        /// The aborted round's ring version.
        ring_version: u64,
        /// The version that replaced it.
        superseded_by: u64,
    },
    /// Uploaded what ring aggregation asked for (`UploadDelta`).
    RingUploaded {
        /// The job.
        job: u64,
        /// The epoch.
        epoch: u32,
        /// The round the request was about (0 for a spot-check upload).
        ring_version: u64,
        /// `delta` (its own delta) or `merged` (the round's result).
        kind: String,
        /// SHA-256 of the payload (hex).
        hash: String,
        /// Size of the payload, bytes.
        bytes: usize,
        /// Upload, ms.
        upload_ms: u64,
    },
    /// Submitted a round's evidence (`SubmitEvidence`).
    EvidenceSubmitted {
        /// The job.
        job: u64,
        /// The epoch.
        epoch: u32,
        /// The round's ring version.
        ring_version: u64,
        /// Signed piece headers sent.
        pieces: usize,
    },
    /// A ring-aggregation message was refused or its step failed.
    RingRefused {
        /// The job.
        job: u64,
        /// The epoch.
        epoch: u32,
        /// The step: `commit`, `sketch`, `check sketch`, `reduce` or `upload`.
        step: String,
        /// Why.
        reason: String,
    },
    /// Gave up: retrying cannot help (see [`Agent::run`]).
    Stopped {
        /// Why.
        reason: String,
    },
    /// Waiting before the next attempt.
    Reconnecting {
        /// Delay, ms.
        delay_ms: u64,
        /// Failed attempts in a row.
        attempt: u32,
    },
}

/// Probe requests an agent holds (queued or running) before it answers new ones "busy".
pub const MAX_QUEUED_PROBES: usize = 8;

/// The node agent.
pub struct Agent {
    settings: AgentSettings,
    identity: Identity,
    dial: Dial,
    clock: Arc<dyn Clock>,
    events: broadcast::Sender<AgentEvent>,
    /// Ring versions held, per job, on the current orchestrator log.
    rings: HashMap<JobId, u64>,
    log_id: Vec<u8>,
    /// Which of the orchestrator's endpoints (replicas) the next session tries.
    endpoint_index: usize,
    /// The current attempt registered.
    registered: bool,
    /// Epochs trained or in progress (across sessions): an assignment resent is ignored.
    epochs: HashSet<(JobId, u32)>,
    /// The live session, for work that outlives the session it started in.
    live: watch::Sender<Option<trainer::WorkerSession>>,
    /// Ring aggregation, every job.
    ring: Arc<ring::RingParticipant<ring::LiveRingRpc>>,
    /// The bases assigned per job, by epoch: the last [`trainer::MAX_STALE_EPOCHS`] + 1
    /// epochs' (a free rider's previous base, a stale node's older one).
    bases: HashMap<JobId, BTreeMap<u32, Option<String>>>,
    /// The member count of each job's last ring applied (ALIE's `n`).
    ring_sizes: HashMap<JobId, usize>,
}

/// What one epoch's work ended with.
enum EpochDone {
    /// Star aggregation: the delta was uploaded.
    Uploaded(trainer::EpochWork),
    /// Ring aggregation: the delta was committed to (and is held by [`ring`]).
    Committed,
}

/// The outcome of one epoch's work, reported back to the session loop.
type WorkDone = (JobId, u32, Result<EpochDone, trainer::TrainError>);

/// Why the agent stopped on its own.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AgentError {
    /// A refusal that retrying cannot change.
    #[error("{0}")]
    Fatal(String),
}

/// Why one session ended.
#[derive(Debug, thiserror::Error)]
enum SessionEnd {
    #[error("{}: {}", hanzod_protocol::status::code_name(.0.code()), .0.message())]
    Status(#[from] Status),
    #[error("{}", error_chain(.0))]
    Connect(#[from] hanzod_protocol::client::ClientError),
    #[error("stopped")]
    Stopped,
}

/// An error and its sources, joined by ": ".
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

impl Agent {
    /// An agent with `identity`, dialing over TCP and reading the system clock.
    pub fn new(settings: AgentSettings, identity: Identity) -> Agent {
        Agent::with_transport(settings, identity, tcp_dial(), Arc::new(SystemClock))
    }

    /// An agent dialing through `dial` with time from `clock` (simulated networks).
    pub fn with_transport(
        settings: AgentSettings,
        identity: Identity,
        dial: Dial,
        clock: Arc<dyn Clock>,
    ) -> Agent {
        let events = broadcast::channel(1024).0;
        let live = watch::channel(None).0;
        let ring = ring::RingParticipant::new(
            identity.clone(),
            ring::LiveRingRpc::new(live.subscribe(), clock.clone()),
            ring::RingRouter::new(),
            settings.ring_fault,
            settings.round,
            events.clone(),
        );
        Agent {
            settings,
            identity,
            dial,
            clock,
            events,
            rings: HashMap::new(),
            log_id: Vec::new(),
            endpoint_index: 0,
            registered: false,
            epochs: HashSet::new(),
            live,
            ring,
            bases: HashMap::new(),
            ring_sizes: HashMap::new(),
        }
    }

    /// The router that hands ring links to this agent's rounds: pass it to
    /// [`probe::serve_peers`] on the listener behind `AgentSettings::advertise`.
    pub fn ring_router(&self) -> ring::RingRouter {
        self.ring.router().clone()
    }

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.identity.node_id()
    }

    /// A receiver of the agent's events (subscribe before [`Agent::run`]).
    pub fn subscribe(&self) -> broadcast::Receiver<AgentEvent> {
        self.events.subscribe()
    }

    fn emit(&self, e: AgentEvent) {
        let _ = self.events.send(e);
    }

    /// Runs until `stop` turns true: register, hold the session, reconnect on failure.
    ///
    /// Returns early with [`AgentError::Fatal`] when retrying cannot help: the orchestrator
    /// refused what this node declares (`INVALID_ARGUMENT`), refused its admission
    /// (`PERMISSION_DENIED`: stake, attestation), or another process registered with the
    /// same key (`ABORTED`: two agents on one key would otherwise replace each other
    /// forever).
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) -> Result<(), AgentError> {
        let mut attempt: u32 = 0;
        // Replicas (DESIGN §9): after a failed session the next endpoint is tried at once;
        // the backoff applies once every endpoint has failed in a row.
        let replicas = self.settings.orchestrator.endpoints().len();
        let mut failed_in_round = 0usize;
        // Work outlives a session: its outcome is reported on whichever session is live.
        let (work_tx, mut work_rx) = mpsc::channel::<WorkDone>(16);
        loop {
            self.registered = false;
            let end = tokio::select! {
                r = self.session(&work_tx, &mut work_rx) => r,
                _ = hanzod_protocol::status::stopped(&mut stop) => Err(SessionEnd::Stopped),
            };
            if *stop.borrow() {
                return Ok(());
            }
            if let Err(SessionEnd::Status(s)) = &end {
                let fatal = match s.code() {
                    tonic::Code::InvalidArgument | tonic::Code::PermissionDenied => true,
                    tonic::Code::Aborted => {
                        s.message().contains("superseded")
                            || s.message().contains("newer registration")
                    }
                    _ => false,
                };
                if fatal {
                    let reason = SessionEnd::Status(s.clone()).to_string();
                    self.emit(AgentEvent::Stopped {
                        reason: reason.clone(),
                    });
                    return Err(AgentError::Fatal(reason));
                }
            }
            let reason = match end {
                Ok(()) => "session ended".to_string(),
                Err(e) => e.to_string(),
            };
            self.emit(AgentEvent::Disconnected { reason });
            // A session that got as far as registering resets the backoff.
            if self.registered {
                attempt = 0;
                failed_in_round = 0;
            }
            if replicas > 1 {
                self.endpoint_index = (self.endpoint_index + 1) % replicas;
                failed_in_round += 1;
                if failed_in_round < replicas {
                    self.emit(AgentEvent::Reconnecting {
                        delay_ms: 0,
                        attempt,
                    });
                    continue;
                }
                failed_in_round = 0;
            }
            attempt = attempt.saturating_add(1);
            let cap = self
                .settings
                .backoff_min_ms
                .saturating_mul(1u64 << attempt.min(20).saturating_sub(1))
                .min(self.settings.backoff_max_ms)
                .max(1);
            let delay = rand::thread_rng().gen_range(cap / 2..=cap);
            self.emit(AgentEvent::Reconnecting {
                delay_ms: delay,
                attempt,
            });
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(delay)) => {}
                _ = hanzod_protocol::status::stopped(&mut stop) => return Ok(()),
            }
        }
    }

    async fn session(
        &mut self,
        work_tx: &mpsc::Sender<WorkDone>,
        work_rx: &mut mpsc::Receiver<WorkDone>,
    ) -> Result<(), SessionEnd> {
        let opts = &self.settings.orchestrator.pick(self.endpoint_index);
        let channel = opts.connect_with(self.dial.clone()).await?;
        let max = 16 << 20;
        let mut client = NodeServiceClient::new(channel)
            .max_decoding_message_size(max)
            .max_encoding_message_size(max);
        let me = self.identity.node_id();
        let info = pb::NodeInfo {
            node_id: me.0.to_vec(),
            gpu: Some(pb::GpuInfo {
                model: self.settings.gpu_model.clone(),
                vram_bytes: self.settings.vram_bytes,
                compute_cap_major: self.settings.compute_cap.0 as u32,
                compute_cap_minor: self.settings.compute_cap.1 as u32,
                driver_sig: self.settings.driver_sig.clone(),
            }),
            bandwidth: Some(pb::BandwidthProbe {
                up_mbps: self.settings.up_mbps,
                down_mbps: self.settings.down_mbps,
            }),
            region: self.settings.region.clone(),
            endpoint: self.settings.advertise.clone(),
        };
        let reg = protocol::register(&mut client, opts, &self.identity, &info).await?;
        if reg.log_id != self.log_id {
            // Another event log: versions and epochs held before are not comparable (a
            // restarted orchestrator numbers its jobs from 1 again).
            self.rings.clear();
            self.epochs.clear();
            self.bases.clear();
            self.ring_sizes.clear();
            self.ring.forget_all();
            self.log_id = reg.log_id.clone();
        }
        // Work in progress uploads through whichever session is live.
        self.live.send_replace(Some(trainer::WorkerSession {
            client: client.clone(),
            session: reg.session.clone(),
            chunk_bytes: reg.delta_chunk_bytes.max(1) as usize,
            identity: self.identity.clone(),
        }));
        let mut signer = protocol::SessionSigner::new(self.identity.clone(), reg.session.clone());
        let clock = self.clock.clone();
        let mut sign =
            move |body: pb::node_message::Body| signer.sign(clock.now().as_millis(), body);
        let heartbeat = protocol::heartbeat;
        let (out, rx) = mpsc::channel::<pb::SignedNodeMessage>(64);
        out.try_send(sign(heartbeat()))
            .map_err(|_| Status::internal("session queue"))?;
        let mut inbound = client
            .session(opts.stream_request(ReceiverStream::new(rx)))
            .await?
            .into_inner();
        self.registered = true;
        self.emit(AgentEvent::Registered {
            node: me.to_string(),
            registrations: reg.registrations,
            heartbeat_interval_ms: reg.heartbeat_interval_ms,
        });
        let interval = Duration::from_millis(reg.heartbeat_interval_ms.max(100));
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (probe_tx, mut probe_rx) = mpsc::channel::<pb::ProbeResult>(16);
        let probe_slot = Arc::new(tokio::sync::Semaphore::new(1));
        // Probes queued or running; beyond MAX_QUEUED_PROBES a request is answered "busy"
        // at once rather than late (the orchestrator accepts results for a limited time).
        let queued = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        loop {
            tokio::select! {
                _ = ticker.tick() => {
                    if out.send(sign(heartbeat())).await.is_err() {
                        return Err(Status::unavailable("session stream closed").into());
                    }
                }
                Some(result) = probe_rx.recv() => {
                    let _ = out.send(sign(pb::node_message::Body::ProbeResult(result))).await;
                }
                Some((job, epoch, result)) = work_rx.recv() => {
                    match result {
                        Ok(EpochDone::Committed) => {}
                        Ok(EpochDone::Uploaded(w)) => self.emit(AgentEvent::DeltaUploaded {
                            job: job.0,
                            epoch,
                            claimed_loss: w.claimed_loss,
                            last_loss: w.last_loss,
                            delta_hash: hex::encode(w.delta_hash),
                            bytes: w.delta_bytes,
                            fetch_ms: w.fetch_ms,
                            train_ms: w.train_ms,
                            upload_ms: w.upload_ms,
                        }),
                        Err(e) => {
                            // Tried again when the daemon resends the assignment.
                            self.epochs.remove(&(job, epoch));
                            self.emit(AgentEvent::EpochFailed { job: job.0, epoch, reason: e.to_string() });
                        }
                    }
                }
                m = inbound.message() => {
                    let Some(m) = m? else { return Ok(()) };
                    use pb::orchestrator_message::Body;
                    match m.body {
                        Some(Body::RingUpdate(u)) => {
                            let Some(ring) = u.ring else { continue };
                            let job = JobId(ring.job_id);
                            let have = self.rings.get(&job).copied().unwrap_or(0);
                            if ring.version < have {
                                self.emit(AgentEvent::RingIgnored { job: job.0, version: ring.version, have });
                                continue;
                            }
                            if ring.version == have {
                                // The periodic resync of the ring we hold: acknowledge it.
                                let _ = out.send(sign(pb::node_message::Body::RingAck(pb::RingAck {
                                    job_id: job.0,
                                    version: ring.version,
                                }))).await;
                                continue;
                            }
                            self.rings.insert(job, ring.version);
                            self.ring_sizes.insert(job, ring.members.len());
                            self.ring.on_ring_update(job.0, ring.version);
                            self.emit(AgentEvent::RingApplied {
                                job: job.0,
                                version: ring.version,
                                members: ring.members.iter().map(|m| hex::encode(&m.node_id)).collect(),
                            });
                            let _ = out.send(sign(pb::node_message::Body::RingAck(pb::RingAck {
                                job_id: job.0,
                                version: ring.version,
                            }))).await;
                        }
                        Some(Body::Release(r)) => {
                            self.ring.on_release(r.job_id);
                            self.bases.remove(&JobId(r.job_id));
                            self.ring_sizes.remove(&JobId(r.job_id));
                            self.emit(AgentEvent::Released { job: r.job_id });
                        }
                        Some(Body::ProbeRequest(p)) => {
                            use std::sync::atomic::Ordering::Relaxed;
                            if queued.fetch_add(1, Relaxed) >= MAX_QUEUED_PROBES {
                                queued.fetch_sub(1, Relaxed);
                                let busy = pb::ProbeResult {
                                    probe_id: p.probe_id,
                                    peer: p.peer.clone(),
                                    error: "busy: too many probes queued".into(),
                                    ..Default::default()
                                };
                                let _ = out.send(sign(pb::node_message::Body::ProbeResult(busy))).await;
                                continue;
                            }
                            let queued = queued.clone();
                            let dial = self.dial.clone();
                            let tx = probe_tx.clone();
                            let events = self.events.clone();
                            let slot = probe_slot.clone();
                            tokio::spawn(async move {
                                // One probe at a time, so probes do not measure each other.
                                let _permit = slot.acquire_owned().await;
                                let result = run_probe(dial, &p).await;
                                let _ = events.send(AgentEvent::Probed {
                                    peer: hex::encode(&p.peer),
                                    mbps: result.mbps,
                                    error: (!result.error.is_empty()).then(|| result.error.clone()),
                                });
                                queued.fetch_sub(1, Relaxed);
                                let _ = tx.send(result).await;
                            });
                        }
                        Some(Body::EpochStart(_)) if !self.settings.train => {}
                        Some(Body::EpochStart(e)) => {
                            let a = match hanzod_protocol::convert::epoch_start(&e) {
                                Ok(a) => a,
                                Err(err) => {
                                    self.emit(AgentEvent::EpochFailed { job: e.job_id, epoch: e.epoch, reason: format!("unusable assignment: {err}") });
                                    continue;
                                }
                            };
                            if !self.epochs.insert((a.job, a.epoch)) {
                                continue; // already trained or training
                            }
                            self.emit(AgentEvent::EpochAssigned { job: a.job.0, epoch: a.epoch, base: a.base.clone() });
                            // What ring aggregation holds for earlier epochs goes.
                            self.ring.on_epoch_start(a.job.0, a.epoch);
                            let bases = self.bases.entry(a.job).or_default();
                            let context = trainer::EpochContext {
                                bases: bases.range(..a.epoch).map(|(e, b)| (*e, b.clone())).collect(),
                                nodes: self.ring_sizes.get(&a.job).copied(),
                                collusion: self.settings.collusion.clone(),
                            };
                            bases.insert(a.epoch, a.base.clone());
                            let oldest = a.epoch.saturating_sub(trainer::MAX_STALE_EPOCHS);
                            bases.retain(|e, _| *e >= oldest);
                            let byzantine = trainer::Byzantine { behaviour: self.settings.behaviour, ring: self.settings.ring_fault };
                            let tx = work_tx.clone();
                            let (mut live, clock) = (self.live.subscribe(), self.clock.clone());
                            let (identity, participant) = (self.identity.clone(), self.ring.clone());
                            tokio::spawn(async move {
                                let result = match a.seed_commitments {
                                    None => trainer::work_epoch(live, &identity, clock, &a, byzantine, &context)
                                        .await
                                        .map(EpochDone::Uploaded),
                                    Some(commitments) => {
                                        match trainer::train_delta(&mut live, &identity, &clock, &a, byzantine, &context).await {
                                            Ok(t) => participant
                                                .commit(ring::CommitInput {
                                                    job: a.job.0,
                                                    epoch: a.epoch,
                                                    step: a.step,
                                                    claimed_loss: t.claimed_loss,
                                                    commitments,
                                                    payload: t.payload,
                                                })
                                                .await
                                                .map(|_| EpochDone::Committed)
                                                .map_err(|e| trainer::TrainError::Commit(e.to_string())),
                                            Err(e) => Err(e),
                                        }
                                    }
                                };
                                let _ = tx.send((a.job, a.epoch, result)).await;
                            });
                        }
                        Some(Body::Reject(r)) => {
                            self.emit(AgentEvent::Rejected { seq: r.seq, code: r.code, reason: r.reason });
                        }
                        // Ring aggregation: handled in spawned tasks, never blocking this loop.
                        Some(b @ (Body::SketchRequest(_) | Body::ReduceStart(_) | Body::UploadRequest(_))) => {
                            self.ring.dispatch(b);
                        }
                        None => {}
                    }
                }
            }
        }
    }
}

async fn run_probe(dial: Dial, p: &pb::ProbeRequest) -> pb::ProbeResult {
    let mut result = pb::ProbeResult {
        probe_id: p.probe_id,
        peer: p.peer.clone(),
        ..Default::default()
    };
    let peer = match <[u8; 32]>::try_from(p.peer.as_slice()) {
        Ok(b) => NodeId(b),
        Err(_) => {
            result.error = "malformed peer id".into();
            return result;
        }
    };
    let connect = tokio::time::timeout(Duration::from_secs(5), dial(p.peer_endpoint.clone()));
    let stream = match connect.await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            result.error = format!("connect {}: {e}", p.peer_endpoint);
            return result;
        }
        Err(_) => {
            result.error = format!("connect {}: timed out", p.peer_endpoint);
            return result;
        }
    };
    match probe::probe(stream, peer, p.bytes).await {
        Ok(m) => {
            result.mbps = m.mbps();
            result.bytes = m.bytes;
            result.elapsed_us = m.elapsed.as_micros() as u64;
        }
        Err(e) => result.error = e.to_string(),
    }
    result
}

/// One line of text for an event.
pub fn describe(e: &AgentEvent) -> String {
    let short = |s: &str| s.chars().take(8).collect::<String>();
    match e {
        AgentEvent::Registered {
            node,
            registrations,
            heartbeat_interval_ms,
        } => format!(
            "registered as {} (registration {registrations}); heartbeat every {} ms",
            short(node),
            heartbeat_interval_ms
        ),
        AgentEvent::RingApplied {
            job,
            version,
            members,
        } => format!(
            "job {job}: ring v{version} of {} nodes: {}",
            members.len(),
            members
                .iter()
                .map(|m| short(m))
                .collect::<Vec<_>>()
                .join(" → ")
        ),
        AgentEvent::RingIgnored { job, version, have } => {
            format!("job {job}: ignored stale ring v{version} (have v{have})")
        }
        AgentEvent::Released { job } => format!("released from job {job}"),
        AgentEvent::EpochAssigned { job, epoch, base } => format!(
            "job {job}: training epoch {epoch} from {}",
            base.as_deref().unwrap_or("the initial weights")
        ),
        AgentEvent::DeltaUploaded {
            job,
            epoch,
            claimed_loss,
            last_loss,
            delta_hash,
            bytes,
            train_ms,
            upload_ms,
            ..
        } => format!(
            "job {job}: epoch {epoch} delta {} ({bytes} bytes) accepted; loss {claimed_loss:.4} → {last_loss:.4}; trained in {train_ms} ms, uploaded in {upload_ms} ms",
            short(delta_hash)
        ),
        AgentEvent::EpochFailed { job, epoch, reason } => {
            format!("job {job}: epoch {epoch} failed: {reason}")
        }
        AgentEvent::Probed { peer, mbps, error } => match error {
            None => format!("probe to {}: {mbps:.1} Mbit/s", short(peer)),
            Some(e) => format!("probe to {} failed: {e}", short(peer)),
        },
        AgentEvent::Rejected { seq, code, reason } => {
            format!("message {seq} refused (code {code}): {reason}")
        }
        AgentEvent::DeltaCommitted {
            job,
            epoch,
            delta_hash,
            bytes,
            claimed_loss,
        } => format!(
            "job {job}: epoch {epoch} delta {} ({bytes} bytes, loss {claimed_loss:.4}) committed",
            short(delta_hash)
        ),
        AgentEvent::SketchSubmitted {
            job,
            epoch,
            check,
            rows,
            delta_upload,
        } => format!(
            "job {job}: epoch {epoch} {} sketch ({rows} rows) submitted{}",
            if *check { "check" } else { "scoring" },
            if *delta_upload {
                "; spot-checked: uploading the delta"
            } else {
                ""
            }
        ),
        AgentEvent::RoundStarted {
            job,
            epoch,
            ring_version,
            members,
            position,
            weight,
        } => format!(
            "job {job}: epoch {epoch} round v{ring_version} started: member {position} of {members}, weight {weight:.4}"
        ),
        AgentEvent::RoundFinished {
            job,
            epoch,
            ring_version,
            elapsed_ms,
            bytes_sent,
            result_hash,
            ..
        } => format!(
            "job {job}: epoch {epoch} round v{ring_version} done in {elapsed_ms} ms, {bytes_sent} bytes sent; result {}",
            short(result_hash)
        ),
        AgentEvent::RoundFailed {
            job,
            epoch,
            ring_version,
            suspect,
            reason,
        } => format!(
            "job {job}: epoch {epoch} round v{ring_version} failed{}: {reason}",
            suspect
                .as_deref()
                .map(|s| format!(" (suspect {})", short(s)))
                .unwrap_or_default()
        ),
        AgentEvent::RoundAborted {
            job,
            epoch,
            ring_version,
            superseded_by,
        } => format!(
            "job {job}: epoch {epoch} round v{ring_version} aborted for v{superseded_by}"
        ),
        AgentEvent::RingUploaded {
            job,
            epoch,
            kind,
            hash,
            bytes,
            upload_ms,
            ..
        } => format!(
            "job {job}: epoch {epoch} {kind} {} ({bytes} bytes) uploaded in {upload_ms} ms",
            short(hash)
        ),
        AgentEvent::EvidenceSubmitted {
            job,
            epoch,
            ring_version,
            pieces,
        } => format!(
            "job {job}: epoch {epoch} round v{ring_version} evidence submitted ({pieces} pieces)"
        ),
        AgentEvent::RingRefused {
            job,
            epoch,
            step,
            reason,
        } => format!("job {job}: epoch {epoch} {step} refused: {reason}"),
        AgentEvent::Disconnected { reason } => format!("disconnected: {reason}"),
        AgentEvent::Stopped { reason } => format!("stopped: {reason}"),
        AgentEvent::Reconnecting { delay_ms, attempt } => {
            format!("reconnecting in {delay_ms} ms (attempt {attempt})")
        }
    }
}
