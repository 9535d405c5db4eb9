//! `NodeService.UploadDelta` against a real daemon on loopback (DESIGN §6): the happy path
//! (ack, blob stored, receipt recorded with the claimed loss and signature), every refusal
//! with its exact code, refusals of the header arriving before any data is sent (a wrong
//! step, a node that already delivered its delta this epoch), nothing stored or recorded
//! for an incomplete upload, no blob left behind by a delta refused after it was stored,
//! the catalog check at Submit, SubmitJob's validation budget and `training.base` checks
//! (and a job that starts from another job's checkpoint), a `qwen3` architecture given as
//! the CID of a stored `config.json`, and heartbeats served while a large delta is uploaded
//! and parsed.
//!
//! Each test starts its own daemon on `127.0.0.1:0`; every wait on the server is bounded.
//! Nothing here sleeps: waits follow the core's notices, the session stream and the
//! responses; the one timeout under test (`deltas.upload_idle_ms`) is also unit-tested in
//! paused time (`grpc::upload`), as is the overall allowance (`min_upload_bytes_per_s`).

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use hanzod::agent::protocol::{delta_upload_parts, upload_delta};
use hanzod::config::Config;
use hanzod::core::domain;
use hanzod::core::events::Event;
use hanzod::core::job::{JobPhase, TrainingSpec};
use hanzod::core::ports::DeltaReceipt;
use hanzod::core::types::JobId;
use hanzod::delta::catalog::ModelCatalog;
use hanzod::delta::format::{
    payload_hash, verify_statement, write_delta, DeltaDtype, DeltaKind, Statement,
};
use hanzod::delta::model::ModelSpec;
use hanzod::identity::{verifying_key, Identity};
use hanzod::serve::{Daemon, DaemonParts};
use hanzod_proto::v1 as pb;
use hanzod_proto::v1::job_service_client::JobServiceClient;
use hanzod_proto::v1::node_service_client::NodeServiceClient;
use hanzod_proto::v1::orchestrator_message::Body as Out;
use prost::Message;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Status, Streaming};

/// The longest any single wait on the server may take before the test fails.
const WAIT: Duration = Duration::from_secs(60);

async fn within<F: Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(WAIT, f)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// The step every delta of `epoch` is taken at: the global step the epoch's local run
/// starts at, `epoch × local_steps` (the jobs here use the default recipe).
fn step_of(epoch: u32) -> u64 {
    u64::from(epoch) * u64::from(TrainingSpec::default().local_steps)
}

// ---------------------------------------------------------------------------------------
// Daemon, nodes, jobs
// ---------------------------------------------------------------------------------------

fn config() -> Config {
    let mut cfg = Config::load(None, |_| None).expect("default configuration");
    cfg.data_dir.clear(); // memory-only: nothing written into the working directory
    cfg.server.grpc_addr = "127.0.0.1:0".into();
    cfg.server.metrics_addr = "127.0.0.1:0".into();
    // No probe listeners here; jobs are placed at once; nobody fails for silence.
    cfg.core.probe.peers_per_node = 0;
    cfg.core.scheduler.tick_ms = 20;
    cfg.core.heartbeat.timeout_ms = 3_600_000;
    // The heartbeat round trips below send duplicates on purpose.
    cfg.server.limits.messages_per_s = 10_000;
    cfg.server.limits.burst = 10_000;
    cfg.server.limits.max_violations = 100_000;
    // The deltas here are made up, not a node's run: a spot-check (10 % by default, chosen by
    // the daemon's random secret) would reject one and slash its node, which then leaves its
    // ring under the penalty and fails a two-node job. Tests of spot-checks set their rate.
    cfg.validation.spot_check_rate = 0.0;
    cfg
}

async fn start_with(cfg: &Config, parts: DaemonParts) -> Daemon {
    within("the daemon to start", Daemon::start_with(cfg, parts))
        .await
        .expect("daemon starts")
}

async fn start() -> Daemon {
    start_with(&config(), DaemonParts::default()).await
}

async fn channel(d: &Daemon) -> Channel {
    let ep = Channel::from_shared(format!("http://{}", d.grpc_addr)).expect("uri");
    within("connect", ep.connect()).await.expect("connect")
}

fn now_ms(d: &Daemon) -> u64 {
    d.core.clock().now().as_millis()
}

/// Every sample of one scrape of `/metrics`.
async fn scrape(d: &Daemon) -> HashMap<String, f64> {
    let addr = d.metrics_addr.expect("metrics exporter bound").to_string();
    let body = within("a metrics scrape", hanzod::metrics::scrape(&addr))
        .await
        .expect("scrape");
    hanzod::metrics::parse_samples(&body)
}

fn deltas(outcome: &str) -> String {
    format!("hanzod_deltas_total{{outcome=\"{outcome}\"}}")
}

fn delta_bytes(outcome: &str) -> String {
    format!("hanzod_delta_bytes_received_total{{outcome=\"{outcome}\"}}")
}

/// The value of `series` now (absent counts as 0).
async fn counter(d: &Daemon, series: &str) -> f64 {
    scrape(d).await.get(series).copied().unwrap_or(0.0)
}

fn node_info(id: &Identity) -> pb::NodeInfo {
    pb::NodeInfo {
        node_id: id.node_id().0.to_vec(),
        gpu: Some(pb::GpuInfo {
            model: "NVIDIA A100-SXM4-80GB".into(),
            vram_bytes: 80 << 30,
            compute_cap_major: 8,
            compute_cap_minor: 0,
            driver_sig: Vec::new(),
        }),
        bandwidth: Some(pb::BandwidthProbe {
            up_mbps: 1000.0,
            down_mbps: 1000.0,
        }),
        region: "eu-west".into(),
        endpoint: "127.0.0.1:7000".into(),
    }
}

/// A heartbeat numbered `seq` on the session `token`, signed by `id`.
fn heartbeat(d: &Daemon, id: &Identity, token: &[u8], seq: u64) -> pb::SignedNodeMessage {
    let payload = pb::NodeMessage {
        session: token.to_vec(),
        seq,
        timestamp_ms: now_ms(d),
        body: Some(pb::node_message::Body::Heartbeat(pb::Heartbeat::default())),
    }
    .encode_to_vec();
    let signature = id.sign(domain::SESSION, &[&payload]).to_vec();
    pb::SignedNodeMessage { payload, signature }
}

/// A registered node with its session stream attached.
struct Node {
    id: Identity,
    token: Vec<u8>,
    chunk_bytes: usize,
    tx: mpsc::Sender<pb::SignedNodeMessage>,
    inbound: Streaming<pb::OrchestratorMessage>,
    seq: u64,
    client: NodeServiceClient<Channel>,
}

impl Node {
    async fn join(d: &Daemon, seed: u8) -> Node {
        let id = Identity::from_seed([seed; 32]);
        let mut client = NodeServiceClient::new(channel(d).await);
        let opts = hanzod::client::ClientOptions::default();
        let reg = within(
            "Register",
            hanzod::agent::protocol::register(&mut client, &opts, &id, &node_info(&id)),
        )
        .await
        .expect("registered");
        // The first message attaches the stream: it is queued before the call, which
        // answers once the daemon has read it.
        let (tx, rx) = mpsc::channel(64);
        let first = heartbeat(d, &id, &reg.session, 1);
        tx.try_send(first).expect("queue the first heartbeat");
        let inbound = within("the Session call", client.session(ReceiverStream::new(rx)))
            .await
            .expect("session attached")
            .into_inner();
        Node {
            id,
            token: reg.session,
            chunk_bytes: reg.delta_chunk_bytes as usize,
            tx,
            inbound,
            seq: 1,
            client,
        }
    }

    /// The next heartbeat (or a copy of message `seq`, a replay).
    fn heartbeat_message(&mut self, d: &Daemon, seq: Option<u64>) -> pb::SignedNodeMessage {
        let seq = seq.unwrap_or_else(|| {
            self.seq += 1;
            self.seq
        });
        heartbeat(d, &self.id, &self.token, seq)
    }

    /// Sends a heartbeat and proves the daemon accepted it: a replay of it is the next thing
    /// refused, as a replay of exactly that sequence number.
    async fn heartbeat_round_trip(&mut self, d: &Daemon) {
        let hb = self.heartbeat_message(d, None);
        let replay = self.heartbeat_message(d, Some(self.seq));
        within("a heartbeat send", self.tx.send(hb))
            .await
            .expect("session open");
        within("a replay send", self.tx.send(replay))
            .await
            .expect("session open");
        loop {
            match within("a Reject", self.inbound.message()).await {
                Ok(Some(pb::OrchestratorMessage {
                    body: Some(Out::Reject(r)),
                    ..
                })) => {
                    assert_eq!(r.seq, self.seq, "an earlier heartbeat was refused: {r:?}");
                    assert!(
                        r.reason
                            .contains(&format!("seq {} is not above {}", self.seq, self.seq)),
                        "{r:?}"
                    );
                    return;
                }
                Ok(Some(_)) => continue,
                Ok(None) => panic!("the session ended"),
                Err(s) => panic!("the session ended {s:?}"),
            }
        }
    }

    /// The statement of `job`'s `epoch` at the epoch's step (see [`step_of`]).
    fn at_epoch(job: u64, epoch: u32, claimed_loss: f64) -> Statement {
        Node::statement(job, epoch, step_of(epoch), claimed_loss)
    }

    fn statement(job: u64, epoch: u32, step: u64, claimed_loss: f64) -> Statement {
        Statement {
            job,
            epoch,
            step,
            claimed_loss,
        }
    }

    /// Uploads `payload` for (`job`, `epoch`), signed by this node, at the epoch's step,
    /// loss 0.5.
    async fn upload(
        &mut self,
        job: u64,
        epoch: u32,
        payload: &[u8],
    ) -> Result<pb::DeltaAck, Status> {
        let (token, chunk) = (self.token.clone(), self.chunk_bytes);
        within(
            "UploadDelta",
            upload_delta(
                &mut self.client,
                &token,
                &self.id,
                job,
                epoch,
                step_of(epoch),
                0.5,
                payload,
                chunk,
            ),
        )
        .await
    }

    /// Streams exactly `chunks` (no more) and keeps the stream open until the answer comes:
    /// the daemon answers without waiting for anything the client did not send.
    async fn send_and_hold(&mut self, chunks: Vec<pb::DeltaChunk>) -> Result<pb::DeltaAck, Status> {
        let (tx, rx) = mpsc::channel(chunks.len().max(1));
        for c in chunks {
            tx.try_send(c).expect("queue a chunk");
        }
        let r = within(
            "an UploadDelta answered while the stream is open",
            self.client.upload_delta(ReceiverStream::new(rx)),
        )
        .await;
        drop(tx);
        r.map(|r| r.into_inner())
    }

    /// Streams `chunks` and then ends the stream.
    async fn send_and_close(
        &mut self,
        chunks: Vec<pb::DeltaChunk>,
    ) -> Result<pb::DeltaAck, Status> {
        within(
            "UploadDelta",
            self.client.upload_delta(tokio_stream::iter(chunks)),
        )
        .await
        .map(|r| r.into_inner())
    }
}

fn header_chunk(h: pb::DeltaHeader) -> pb::DeltaChunk {
    pb::DeltaChunk {
        part: Some(pb::delta_chunk::Part::Header(h)),
    }
}

fn data_chunk(b: &[u8]) -> pb::DeltaChunk {
    pb::DeltaChunk {
        part: Some(pb::delta_chunk::Part::Data(b.to_vec())),
    }
}

fn trailer_chunk(t: pb::DeltaTrailer) -> pb::DeltaChunk {
    pb::DeltaChunk {
        part: Some(pb::delta_chunk::Part::Trailer(t)),
    }
}

/// A whole upload as chunks: header, data in 4 KiB pieces, trailer.
fn chunks(
    header: pb::DeltaHeader,
    payload: &[u8],
    trailer: pb::DeltaTrailer,
) -> Vec<pb::DeltaChunk> {
    let mut v = vec![header_chunk(header)];
    v.extend(payload.chunks(4096).map(data_chunk));
    v.push(trailer_chunk(trailer));
    v
}

fn job_spec(name: &str, nodes: u32, epochs: u32, model: Option<&str>) -> pb::JobSpec {
    pb::JobSpec {
        name: name.into(),
        epochs,
        min_nodes: nodes,
        max_nodes: nodes,
        min_vram_bytes: 1 << 30,
        pending_deadline_ms: 600_000,
        epoch_deadline_ms: 3_600_000,
        utility: 1.0,
        submitter_stake_gym_wei: "1000".into(),
        training: model.map(|m| pb::TrainingSpec {
            model: Some(m.into()),
            ..Default::default()
        }),
    }
}

async fn submit(d: &Daemon, spec: pb::JobSpec) -> Result<u64, Status> {
    let mut jobs = JobServiceClient::new(channel(d).await);
    within(
        "SubmitJob",
        jobs.submit_job(pb::SubmitJobRequest { spec: Some(spec) }),
    )
    .await
    .map(|r| r.into_inner().job_id)
}

/// Waits until job `id` is in a phase `pred` accepts; returns its view.
async fn await_phase(
    d: &Daemon,
    id: u64,
    what: &str,
    pred: impl Fn(&JobPhase) -> bool,
) -> hanzod::core::actor::job::JobView {
    let mut notices = d.core.subscribe();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let view = d.core.job(JobId(id)).await.expect("job view");
        if pred(&view.phase) {
            return view;
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match tokio::time::timeout(left, notices.recv()).await {
            Err(_) => panic!("job {id} never reached {what}; it is {:?}", view.phase),
            Ok(_) => continue,
        }
    }
}

/// A running job of `nodes` nodes (all of `members`) training `model`.
async fn running_job(d: &Daemon, members: usize, epochs: u32, model: Option<&str>) -> u64 {
    let id = submit(d, job_spec("deltas", members as u32, epochs, model))
        .await
        .expect("job accepted");
    let view = await_phase(d, id, "Running(0)", |p| {
        matches!(p, JobPhase::Running { epoch: 0, .. })
    })
    .await;
    assert_eq!(view.ring.expect("ring").members.len(), members);
    id
}

// ---------------------------------------------------------------------------------------
// Deltas
// ---------------------------------------------------------------------------------------

fn wine() -> ModelSpec {
    hanzod::train::builtin_model("wine-mlp").expect("the built-in model")
}

/// Deterministic small values for a tensor of `n` elements.
fn values(n: usize, salt: f32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i % 17) as f32 - 8.0) * 1e-3 + salt * 1e-4)
        .collect()
}

/// A full delta of `spec` against checkpoint `base`, with `edit` applied to its tensor list
/// (name, shape, values) before writing.
fn delta_with(
    spec: &ModelSpec,
    base: u64,
    salt: f32,
    edit: impl FnOnce(&mut Vec<(String, Vec<usize>, Vec<f32>)>),
) -> Vec<u8> {
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = spec
        .params
        .iter()
        .map(|(n, s)| (n.clone(), s.clone(), values(s.iter().product(), salt)))
        .collect();
    edit(&mut tensors);
    let refs: Vec<(&str, &[usize], &[f32])> = tensors
        .iter()
        .map(|(n, s, v)| (n.as_str(), s.as_slice(), v.as_slice()))
        .collect();
    write_delta(DeltaKind::Full, base, DeltaDtype::F32, &refs).expect("delta written")
}

fn delta(spec: &ModelSpec, base: u64, salt: f32) -> Vec<u8> {
    delta_with(spec, base, salt, |_| {})
}

/// The receipts recorded in the event log.
async fn receipts(d: &Daemon) -> Vec<DeltaReceipt> {
    d.core
        .state_store()
        .read_after(0)
        .await
        .expect("event log")
        .into_iter()
        .filter_map(|r| match r.event {
            Event::DeltaAccepted(receipt) => Some(receipt),
            _ => None,
        })
        .collect()
}

fn assert_refused<T: std::fmt::Debug>(
    what: &str,
    r: Result<T, Status>,
    code: Code,
    mentions: &str,
) {
    match r {
        Ok(v) => panic!("{what}: accepted: {v:?}"),
        Err(s) => {
            assert_eq!(s.code(), code, "{what}: {s:?}");
            assert!(
                s.message().contains(mentions),
                "{what}: message {:?} does not mention {mentions:?}",
                s.message()
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepted_delta_is_stored_then_recorded_with_its_claimed_loss_and_signature() {
    let d = start().await;
    let mut a = Node::join(&d, 1).await;
    let _b = Node::join(&d, 2).await;
    assert_eq!(
        a.chunk_bytes,
        1 << 20,
        "RegisterResponse announces the chunk size"
    );
    let job = running_job(&d, 2, 2, None).await;

    let payload = delta(&wine(), 0, 1.0);
    let hash = payload_hash(&payload);
    let ack = a.upload(job, 0, &payload).await.expect("accepted");
    assert_eq!(ack.delta_hash, hash.to_vec());
    assert!(ack.accepted);
    assert!(ack.reason.is_empty());

    // Stored, content-addressed.
    let stored = d.blobs().get(&hash).await.expect("blob stored");
    assert_eq!(&*stored, payload.as_slice());
    // Counted by the job (the other member has not uploaded: the epoch is still open).
    let view = d.core.job(JobId(job)).await.unwrap();
    assert!(matches!(view.phase, JobPhase::Running { epoch: 0, .. }));
    assert_eq!(view.deltas_this_epoch, 1);
    // Recorded in the event log with what the node claimed and signed.
    let r = receipts(&d).await;
    assert_eq!(r.len(), 1, "{r:?}");
    let r = &r[0];
    assert_eq!(
        (r.job, r.node, r.epoch, r.step),
        (JobId(job), a.id.node_id(), 0, step_of(0))
    );
    assert_eq!(r.delta_hash, hash);
    assert_eq!(r.claimed_loss, 0.5);
    let key = verifying_key(&a.id.node_id()).unwrap();
    verify_statement(&key, &Node::at_epoch(job, 0, 0.5), &hash, &r.signature)
        .expect("the recorded signature is the node's statement");

    assert_eq!(counter(&d, &deltas("accepted")).await, 1.0);
    assert_eq!(
        counter(&d, &delta_bytes("accepted")).await,
        payload.len() as f64
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_delivered_is_refused_at_the_header_naming_its_delta() {
    let d = start().await;
    let mut a = Node::join(&d, 3).await;
    let _b = Node::join(&d, 4).await;
    let job = running_job(&d, 2, 1, None).await;

    let first = delta(&wine(), 0, 1.0);
    let hash = payload_hash(&first);
    a.upload(job, 0, &first).await.expect("first upload");
    let view = d.core.job(JobId(job)).await.unwrap();
    assert_eq!(
        view.delivered.into_iter().collect::<Vec<_>>(),
        vec![(a.id.node_id(), hash)]
    );

    // The same delta again (a retry after a lost ack), then a different one: both refused
    // at the header, naming what was delivered, so the node can tell it arrived.
    let delivered = format!(
        "already delivered its delta for epoch 0 (hash {})",
        hex::encode(hash)
    );
    assert_refused(
        "the same delta again",
        a.upload(job, 0, &first).await,
        Code::AlreadyExists,
        &delivered,
    );
    let other = delta(&wine(), 0, 2.0);
    assert_refused(
        "a different delta in the same epoch",
        a.upload(job, 0, &other).await,
        Code::AlreadyExists,
        &delivered,
    );
    // Neither was read, so nothing of the different one was stored.
    assert_eq!(counter(&d, &deltas("already_delivered")).await, 2.0);
    assert_eq!(counter(&d, &delta_bytes("already_delivered")).await, 0.0);
    assert!(!d.blobs().contains(&payload_hash(&other)).await.unwrap());
    assert!(d.blobs().contains(&hash).await.unwrap());
    assert_eq!(receipts(&d).await.len(), 1);
    assert_eq!(d.core.job(JobId(job)).await.unwrap().deltas_this_epoch, 1);
    assert_eq!(counter(&d, &deltas("accepted")).await, 1.0);
    assert_eq!(
        counter(&d, &delta_bytes("accepted")).await,
        first.len() as f64
    );
    d.stop().await;
}

/// An upload that sent its header and first 10 bytes and holds its stream open.
struct Held {
    header: pb::DeltaHeader,
    trailer: pb::DeltaTrailer,
    tx: mpsc::Sender<pb::DeltaChunk>,
    answer: JoinHandle<Result<tonic::Response<pb::DeltaAck>, Status>>,
}

/// Starts an upload of `payload` by `n` under `statement` and returns once the daemon is
/// receiving it: a probe (by `prober`, or by `n` itself) is refused for the upload in
/// progress. A probe that gets a slot itself ends at once (it sends one byte more than it
/// declares); should the upload's header have arrived while a probe held the slot it
/// needs, the upload was refused busy and is started again.
async fn hold_upload(
    n: &mut Node,
    mut prober: Option<&mut Node>,
    statement: &Statement,
    payload: &[u8],
) -> Held {
    let (header, trailer) = delta_upload_parts(&n.token, &n.id, statement, payload);
    let deadline = tokio::time::Instant::now() + WAIT;
    'start: loop {
        let (tx, rx) = mpsc::channel::<pb::DeltaChunk>(64);
        let mut client = n.client.clone();
        let answer =
            tokio::spawn(async move { client.upload_delta(ReceiverStream::new(rx)).await });
        tx.send(header_chunk(header.clone())).await.unwrap();
        tx.send(data_chunk(&payload[..10])).await.unwrap();
        loop {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the upload was never received"
            );
            let who: &mut Node = match prober.as_deref_mut() {
                Some(p) => p,
                None => &mut *n,
            };
            let mut probe = header.clone();
            probe.session = who.token.clone();
            probe.total_bytes = 24;
            let s = who
                .send_and_close(vec![header_chunk(probe), data_chunk(&[0; 25])])
                .await
                .expect_err("a probe is never accepted");
            match s.code() {
                Code::ResourceExhausted if s.message().contains("in progress") => {
                    return Held {
                        header,
                        trailer,
                        tx,
                        answer,
                    }
                }
                Code::InvalidArgument if s.message().contains("more data") => {
                    if answer.is_finished() {
                        let r = answer.await.expect("upload task");
                        let s = r.expect_err("an upload without its data is never accepted");
                        assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
                        continue 'start;
                    }
                }
                _ => panic!("{s:?}"),
            }
        }
    }
}

/// Sends the rest of `payload` (after the first 10 bytes) and the trailer; the answer.
async fn finish_upload(held: Held, payload: &[u8]) -> Result<pb::DeltaAck, Status> {
    for c in payload[10..].chunks(4096) {
        held.tx.send(data_chunk(c)).await.unwrap();
    }
    held.tx.send(trailer_chunk(held.trailer)).await.unwrap();
    within("the held upload's answer", held.answer)
        .await
        .expect("upload task")
        .map(|r| r.into_inner())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delta_refused_after_it_was_stored_is_removed_unless_it_was_stored_before() {
    let d = start().await;
    let mut a = Node::join(&d, 24).await;
    let _b = Node::join(&d, 25).await;
    let first = running_job(&d, 2, 1, None).await;
    let mut c = Node::join(&d, 26).await;
    let _e = Node::join(&d, 27).await;
    let second = running_job(&d, 2, 1, None).await;
    let ring = d.core.job(JobId(second)).await.unwrap().ring.unwrap();
    assert!(ring.members.contains(&c.id.node_id()), "{ring:?}");

    // A's upload passes the header while the job runs; the job is cancelled before the
    // trailer: the core refuses the receipt after the blob was stored, and the blob goes.
    let payload = delta(&wine(), 0, 1.0);
    let hash = payload_hash(&payload);
    let held = hold_upload(&mut a, None, &Node::at_epoch(first, 0, 0.5), &payload).await;
    within("CancelJob", d.core.cancel_job(JobId(first)))
        .await
        .expect("cancelled");
    assert_refused(
        "a delta for a job cancelled during its upload",
        finish_upload(held, &payload).await,
        Code::FailedPrecondition,
        "ended",
    );
    assert_eq!(counter(&d, &deltas("not_running")).await, 1.0);
    assert!(
        !d.blobs().contains(&hash).await.unwrap(),
        "blob left behind"
    );
    assert!(receipts(&d).await.is_empty());

    // C delivers the same bytes in the second job. A third job (on A and B, free again)
    // gets them too, and is cancelled during that upload: the blob was stored before it,
    // for the second job, and stays.
    c.upload(second, 0, &payload)
        .await
        .expect("C's delta for the second job");
    assert!(d.blobs().contains(&hash).await.unwrap());
    let third = running_job(&d, 2, 1, None).await;
    let ring = d.core.job(JobId(third)).await.unwrap().ring.unwrap();
    assert!(ring.members.contains(&a.id.node_id()), "{ring:?}");
    let held = hold_upload(&mut a, None, &Node::at_epoch(third, 0, 0.5), &payload).await;
    within("CancelJob", d.core.cancel_job(JobId(third)))
        .await
        .expect("cancelled");
    assert_refused(
        "bytes another job holds, refused after storing",
        finish_upload(held, &payload).await,
        Code::FailedPrecondition,
        "ended",
    );
    assert_eq!(counter(&d, &deltas("not_running")).await, 2.0);
    assert!(
        d.blobs().contains(&hash).await.unwrap(),
        "the second job's delta was removed"
    );
    assert_eq!(receipts(&d).await.len(), 1);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_refusals_come_before_any_data_is_sent() {
    let d = start().await;
    let mut a = Node::join(&d, 5).await;
    let _b = Node::join(&d, 6).await;
    let job = running_job(&d, 2, 1, None).await;
    // Joins after the ring formed: registered, live, but no member.
    let mut c = Node::join(&d, 7).await;
    // A job that stays Pending (it needs more nodes than there are).
    let pending = submit(&d, job_spec("pending", 9, 1, None)).await.unwrap();

    let max = wine().max_delta_bytes(DeltaDtype::F32);
    let header = |n: &Node, job: u64, epoch: u32, total: u64| pb::DeltaHeader {
        session: n.token.clone(),
        job_id: job,
        epoch,
        step: step_of(epoch),
        claimed_loss: 0.25,
        total_bytes: total,
        kind: pb::DeltaKind::Delta as i32,
    };

    // Each of these sends the header alone and holds the stream open.
    let h = header(&a, job, 0, max + 1);
    assert_refused(
        "declared size above the model's bound",
        a.send_and_hold(vec![header_chunk(h)]).await,
        Code::ResourceExhausted,
        &max.to_string(),
    );
    let h = header(&a, job, 0, 1u64 << 62);
    assert_refused(
        "declared size of 4 EiB",
        a.send_and_hold(vec![header_chunk(h)]).await,
        Code::ResourceExhausted,
        "exceeds",
    );
    let h = header(&a, job, 0, 23);
    assert_refused(
        "declared size below the HZDL header",
        a.send_and_hold(vec![header_chunk(h)]).await,
        Code::InvalidArgument,
        "total_bytes",
    );
    let mut h = header(&a, job, 0, 100);
    h.claimed_loss = f64::NAN;
    assert_refused(
        "a NaN claimed loss",
        a.send_and_hold(vec![header_chunk(h)]).await,
        Code::InvalidArgument,
        "claimed_loss",
    );
    let mut h = header(&a, job, 0, 100);
    h.claimed_loss = -0.25;
    assert_refused(
        "a negative claimed loss (cross-entropy and MSE are >= 0)",
        a.send_and_hold(vec![header_chunk(h)]).await,
        Code::InvalidArgument,
        "header.claimed_loss: -2.5e-1",
    );
    assert_refused(
        "data before the header",
        a.send_and_hold(vec![data_chunk(b"HZDL")]).await,
        Code::InvalidArgument,
        "header",
    );
    let mut h = header(&a, job, 0, 100);
    h.session = vec![9; 16];
    assert_refused(
        "an unknown session",
        a.send_and_hold(vec![header_chunk(h)]).await,
        Code::Unauthenticated,
        "session",
    );
    let mut h = header(&a, job, 0, 100);
    h.step = step_of(0) + 100;
    assert_refused(
        "a step other than the epoch's",
        a.send_and_hold(vec![header_chunk(h)]).await,
        Code::InvalidArgument,
        &format!("header.step: expected {}", step_of(0)),
    );
    let h = header(&a, 999, 0, 100);
    assert_refused(
        "an unknown job",
        a.send_and_hold(vec![header_chunk(h)]).await,
        Code::NotFound,
        "not found",
    );
    let h = header(&a, job, 1, 100);
    assert_refused(
        "the wrong epoch",
        a.send_and_hold(vec![header_chunk(h)]).await,
        Code::FailedPrecondition,
        "epoch 0",
    );
    let h = header(&a, pending, 0, 100);
    assert_refused(
        "a job that is not running",
        a.send_and_hold(vec![header_chunk(h)]).await,
        Code::FailedPrecondition,
        "not running",
    );
    let h = header(&c, job, 0, 100);
    assert_refused(
        "a node outside the ring",
        c.send_and_hold(vec![header_chunk(h)]).await,
        Code::PermissionDenied,
        "not a member",
    );

    for (outcome, n) in [
        ("too_large", 2.0),
        ("invalid", 3.0),
        ("no_header", 1.0),
        ("unknown_session", 1.0),
        ("unknown_job", 1.0),
        ("wrong_epoch", 1.0),
        ("wrong_step", 1.0),
        ("not_running", 1.0),
        ("not_member", 1.0),
    ] {
        assert_eq!(counter(&d, &deltas(outcome)).await, n, "{outcome}");
    }
    // Not a byte of data was taken from any of them.
    let total: f64 = scrape(&d)
        .await
        .iter()
        .filter(|(k, _)| k.starts_with("hanzod_delta_bytes_received_total"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(total, 0.0);
    assert!(receipts(&d).await.is_empty());
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_replayed_or_misattributed_deltas_are_refused() {
    let d = start().await;
    let mut a = Node::join(&d, 8).await;
    let mut b = Node::join(&d, 9).await;
    let job = running_job(&d, 2, 1, None).await;
    let payload = delta(&wine(), 0, 1.0);
    let statement = Node::at_epoch(job, 0, 0.5);

    // The trailer's hash is not the payload's.
    let (h, mut t) = delta_upload_parts(&a.token, &a.id, &statement, &payload);
    t.sha256[0] ^= 1;
    assert_refused(
        "a trailer hash that does not match",
        a.send_and_close(chunks(h, &payload, t)).await,
        Code::DataLoss,
        "sha256",
    );
    // A byte flipped in transit (the trailer describes the original).
    let (h, t) = delta_upload_parts(&a.token, &a.id, &statement, &payload);
    let mut flipped = payload.clone();
    flipped[100] ^= 0x40;
    assert_refused(
        "a payload altered in transit",
        a.send_and_close(chunks(h, &flipped, t)).await,
        Code::DataLoss,
        "sha256",
    );
    // Signed by a key that is not the session's.
    let stranger = Identity::from_seed([77; 32]);
    let (h, t) = {
        let (h, _) = delta_upload_parts(&a.token, &a.id, &statement, &payload);
        let (_, t) = delta_upload_parts(&a.token, &stranger, &statement, &payload);
        (h, t)
    };
    assert_refused(
        "a statement signed by another key",
        a.send_and_close(chunks(h, &payload, t)).await,
        Code::Unauthenticated,
        "signature",
    );
    // Node A's signed delta uploaded on node B's session.
    let (mut h, t) = delta_upload_parts(&a.token, &a.id, &statement, &payload);
    h.session = b.token.clone();
    assert_refused(
        "A's delta on B's session",
        b.send_and_close(chunks(h, &payload, t)).await,
        Code::Unauthenticated,
        "signature",
    );
    // A genuine statement for another step, epoch or job, replayed with this header.
    for (what, signed) in [
        ("step", Node::statement(job, 0, step_of(0) + 1, 0.5)),
        ("epoch", Node::at_epoch(job, 1, 0.5)),
        ("job", Node::at_epoch(job + 1, 0, 0.5)),
        ("claimed loss", Node::at_epoch(job, 0, 0.25)),
    ] {
        let (h, _) = delta_upload_parts(&a.token, &a.id, &statement, &payload);
        let (_, t) = delta_upload_parts(&a.token, &a.id, &signed, &payload);
        assert_refused(
            &format!("a statement for another {what}"),
            a.send_and_close(chunks(h, &payload, t)).await,
            Code::Unauthenticated,
            "signature",
        );
    }
    // A truncated signature.
    let (h, mut t) = delta_upload_parts(&a.token, &a.id, &statement, &payload);
    t.signature.truncate(63);
    assert_refused(
        "a 63-byte signature",
        a.send_and_close(chunks(h, &payload, t)).await,
        Code::Unauthenticated,
        "signature",
    );

    assert_eq!(counter(&d, &deltas("hash_mismatch")).await, 2.0);
    assert_eq!(counter(&d, &deltas("bad_signature")).await, 7.0);
    // Nothing stored or recorded; the genuine upload is still accepted afterwards.
    assert!(!d.blobs().contains(&payload_hash(&payload)).await.unwrap());
    assert!(receipts(&d).await.is_empty());
    a.upload(job, 0, &payload)
        .await
        .expect("the genuine upload");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deltas_that_fail_the_format_check_are_invalid_argument_with_the_reason() {
    let d = start().await;
    let mut a = Node::join(&d, 10).await;
    let _b = Node::join(&d, 11).await;
    let job = running_job(&d, 2, 1, None).await;
    let spec = wine();
    let (first, first_shape) = spec
        .params
        .iter()
        .find(|(_, s)| s.len() == 2)
        .map(|(n, s)| (n.clone(), s.clone()))
        .expect("a 2-D tensor");

    let unknown = delta_with(&spec, 0, 1.0, |t| {
        t.push(("fc9.weight".into(), vec![2, 2], vec![0.0; 4]))
    });
    assert_refused(
        "an unknown tensor",
        a.upload(job, 0, &unknown).await,
        Code::InvalidArgument,
        "unknown tensor \"fc9.weight\"",
    );
    let transposed = delta_with(&spec, 0, 1.0, |t| {
        let e = t.iter_mut().find(|(n, _, _)| *n == first).unwrap();
        e.1 = vec![first_shape[1], first_shape[0]];
    });
    assert_refused(
        "a tensor of the wrong shape",
        a.upload(job, 0, &transposed).await,
        Code::InvalidArgument,
        &format!("tensor {first:?} has shape"),
    );
    let nan = delta_with(&spec, 0, 1.0, |t| t[0].2[5] = f32::NAN);
    assert_refused(
        "a NaN",
        a.upload(job, 0, &nan).await,
        Code::InvalidArgument,
        "non-finite value at element 5",
    );
    let inf = delta_with(&spec, 0, 1.0, |t| t[1].2[0] = f32::INFINITY);
    assert_refused(
        "an infinity",
        a.upload(job, 0, &inf).await,
        Code::InvalidArgument,
        "non-finite",
    );
    let missing = delta_with(&spec, 0, 1.0, |t| {
        t.pop();
    });
    assert_refused(
        "a missing tensor",
        a.upload(job, 0, &missing).await,
        Code::InvalidArgument,
        "missing",
    );
    let mut garbage = delta(&spec, 0, 1.0);
    garbage[0] = b'X';
    assert_refused(
        "bad magic",
        a.upload(job, 0, &garbage).await,
        Code::InvalidArgument,
        "magic",
    );
    // A future base version (epoch 0 trains from version 0).
    let ahead = delta(&spec, 1, 1.0);
    assert_refused(
        "a base version the job has not reached",
        a.upload(job, 0, &ahead).await,
        Code::FailedPrecondition,
        "version 0",
    );

    for (outcome, n) in [
        ("unknown_tensor", 1.0),
        ("wrong_shape", 1.0),
        ("non_finite", 2.0),
        ("missing_tensor", 1.0),
        ("bad_header", 1.0),
        ("stale_base", 1.0),
    ] {
        assert_eq!(counter(&d, &deltas(outcome)).await, n, "{outcome}");
    }
    assert!(receipts(&d).await.is_empty());
    assert_eq!(d.core.job(JobId(job)).await.unwrap().deltas_this_epoch, 0);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delta_against_the_previous_checkpoint_is_a_stale_base() {
    let d = start().await;
    let mut a = Node::join(&d, 12).await;
    let mut b = Node::join(&d, 13).await;
    let job = running_job(&d, 2, 3, None).await;
    a.upload(job, 0, &delta(&wine(), 0, 1.0))
        .await
        .expect("a, epoch 0");
    b.upload(job, 0, &delta(&wine(), 0, 2.0))
        .await
        .expect("b, epoch 0");
    let view = await_phase(&d, job, "Running(1)", |p| {
        matches!(p, JobPhase::Running { epoch: 1, .. })
    })
    .await;
    assert_eq!(view.checkpoints.len(), 1);

    assert_refused(
        "a delta computed against checkpoint 0 in epoch 1",
        a.upload(job, 1, &delta(&wine(), 0, 3.0)).await,
        Code::FailedPrecondition,
        "computed against checkpoint version 0, the job is at version 1",
    );
    assert_refused(
        "last epoch's upload again",
        a.upload(job, 0, &delta(&wine(), 0, 1.0)).await,
        Code::FailedPrecondition,
        "epoch 1",
    );
    a.upload(job, 1, &delta(&wine(), 1, 3.0))
        .await
        .expect("a delta against checkpoint 1");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_that_ends_without_a_trailer_stores_and_records_nothing() {
    let d = start().await;
    let mut a = Node::join(&d, 14).await;
    let _b = Node::join(&d, 15).await;
    let job = running_job(&d, 2, 1, None).await;
    let payload = delta(&wine(), 0, 1.0);
    let (h, _) = delta_upload_parts(&a.token, &a.id, &Node::at_epoch(job, 0, 0.5), &payload);

    // Every byte, then the stream ends.
    let mut all = vec![header_chunk(h.clone())];
    all.extend(payload.chunks(1000).map(data_chunk));
    assert_refused(
        "every byte but no trailer",
        a.send_and_close(all).await,
        Code::InvalidArgument,
        "without a trailer",
    );
    // Half the bytes, then the stream ends.
    let half = vec![header_chunk(h), data_chunk(&payload[..payload.len() / 2])];
    assert_refused(
        "half the bytes",
        a.send_and_close(half).await,
        Code::InvalidArgument,
        "without a trailer",
    );
    assert_eq!(counter(&d, &deltas("no_trailer")).await, 2.0);
    assert_eq!(
        counter(&d, &delta_bytes("no_trailer")).await,
        (payload.len() + payload.len() / 2) as f64
    );
    assert!(!d.blobs().contains(&payload_hash(&payload)).await.unwrap());
    assert!(receipts(&d).await.is_empty());
    assert_eq!(d.core.job(JobId(job)).await.unwrap().deltas_this_epoch, 0);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_data_than_declared_or_a_stall_ends_the_upload() {
    let mut cfg = config();
    cfg.deltas.upload_idle_ms = 300;
    // Only the idle timer here: the overall allowance (300 ms + the payload at 1 byte/s)
    // is far off.
    cfg.deltas.min_upload_bytes_per_s = 1;
    let d = start_with(&cfg, DaemonParts::default()).await;
    let mut a = Node::join(&d, 16).await;
    let _b = Node::join(&d, 17).await;
    let job = running_job(&d, 2, 1, None).await;
    let payload = delta(&wine(), 0, 1.0);
    let statement = Node::at_epoch(job, 0, 0.5);

    // Declares one byte less than it sends.
    let (mut h, t) = delta_upload_parts(&a.token, &a.id, &statement, &payload);
    h.total_bytes -= 1;
    assert_refused(
        "more data than declared",
        a.send_and_close(chunks(h, &payload, t)).await,
        Code::InvalidArgument,
        "more data than",
    );
    // Declares one byte more than it sends.
    let (mut h, t) = delta_upload_parts(&a.token, &a.id, &statement, &payload);
    h.total_bytes += 1;
    assert_refused(
        "a trailer before the declared bytes",
        a.send_and_close(chunks(h, &payload, t)).await,
        Code::InvalidArgument,
        "total_bytes",
    );
    // Sends the header and some data, then nothing, with the stream open.
    let (h, _) = delta_upload_parts(&a.token, &a.id, &statement, &payload);
    assert_refused(
        "a stalled upload",
        a.send_and_hold(vec![header_chunk(h), data_chunk(&payload[..64])])
            .await,
        Code::DeadlineExceeded,
        "300 ms",
    );
    assert_eq!(counter(&d, &deltas("overflow")).await, 1.0);
    assert_eq!(counter(&d, &deltas("short")).await, 1.0);
    assert_eq!(counter(&d, &deltas("timeout")).await, 1.0);
    assert!(receipts(&d).await.is_empty());
    // The node may upload again: its failed uploads released their slots.
    a.upload(job, 0, &payload).await.expect("a complete upload");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_refuses_a_model_or_dataset_the_catalog_does_not_know() {
    let d = start().await;
    let e = submit(&d, job_spec("x", 1, 1, Some("gpt-9")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("spec.training.model"), "{e:?}");
    assert!(
        e.message().contains("gpt-9") && e.message().contains("wine-mlp"),
        "{e:?}"
    );

    let mut spec = job_spec("x", 1, 1, None);
    spec.training = Some(pb::TrainingSpec {
        dataset: Some("imagenet".into()),
        ..Default::default()
    });
    let e = submit(&d, spec).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("spec.training.dataset"), "{e:?}");
    assert!(e.message().contains("wine-quality-red"), "{e:?}");

    // The built-in pair is accepted.
    submit(&d, job_spec("x", 1, 1, Some("wine-mlp")))
        .await
        .expect("wine-mlp on wine-quality-red");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_are_accepted_while_a_large_delta_uploads_and_parses() {
    // An MLP 11 → 2048 → 2048 → 1: 4.2 M parameters, a 17 MB f32 delta.
    let big = hanzod::train::model_spec(2048);
    let mut catalog = ModelCatalog::builtin();
    catalog.insert("wide-mlp", big.clone());
    let parts = DaemonParts {
        catalog: Some(catalog),
        ..DaemonParts::default()
    };
    let d = start_with(&config(), parts).await;
    let mut a = Node::join(&d, 18).await;
    let _b = Node::join(&d, 19).await;
    let job = running_job(&d, 2, 1, Some("wide-mlp")).await;

    let payload = delta(&big, 0, 1.0);
    assert!(payload.len() > 16_000_000, "{}", payload.len());
    let (h, t) = delta_upload_parts(&a.token, &a.id, &Node::at_epoch(job, 0, 0.5), &payload);
    let (tx, rx) = mpsc::channel::<pb::DeltaChunk>(4);
    let mut client = a.client.clone();
    let upload = tokio::spawn(async move { client.upload_delta(ReceiverStream::new(rx)).await });
    tx.send(header_chunk(h)).await.unwrap();

    // A heartbeat round trip after every 1 MiB sent.
    let mut during = 0;
    for piece in payload.chunks(256 << 10).collect::<Vec<_>>().chunks(4) {
        for c in piece {
            within("a data chunk to be taken", tx.send(data_chunk(c)))
                .await
                .expect("the upload is open");
        }
        a.heartbeat_round_trip(&d).await;
        during += 1;
    }
    within("the trailer to be taken", tx.send(trailer_chunk(t)))
        .await
        .expect("the upload is open");
    // While the daemon hashes, verifies, parses and checks 17 MB: more round trips.
    while !upload.is_finished() {
        a.heartbeat_round_trip(&d).await;
        during += 1;
    }
    let ack = within("the ack", upload)
        .await
        .expect("upload task")
        .expect("the large delta is accepted")
        .into_inner();
    assert_eq!(ack.delta_hash, payload_hash(&payload).to_vec());
    assert!(
        during >= 16,
        "{during} heartbeat round trips during the upload"
    );
    // Every round trip's heartbeat reached the core and was accepted there.
    assert!(counter(&d, "hanzod_heartbeats_total{outcome=\"accepted\"}").await >= during as f64);
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_are_bounded_per_node_and_in_all() {
    let mut cfg = config();
    cfg.deltas.max_concurrent_uploads = 1;
    let d = start_with(&cfg, DaemonParts::default()).await;
    let mut a = Node::join(&d, 20).await;
    let mut b = Node::join(&d, 21).await;
    let job = running_job(&d, 2, 1, None).await;
    let payload = delta(&wine(), 0, 1.0);

    // A's upload sends its header and holds: it owns the only slot, so B's probe is busy.
    let held = hold_upload(&mut a, Some(&mut b), &Node::at_epoch(job, 0, 0.5), &payload).await;
    // Any upload by B is busy now, for the bound on all uploads.
    let mut bh = held.header.clone();
    bh.session = b.token.clone();
    assert_refused(
        "an upload by another node while the only slot is taken",
        b.send_and_hold(vec![header_chunk(bh)]).await,
        Code::ResourceExhausted,
        "1 delta uploads are in progress",
    );
    // A second upload by A itself is refused too, for A's own upload in flight.
    assert_refused(
        "a second upload by the same node",
        a.send_and_hold(vec![header_chunk(held.header.clone())])
            .await,
        Code::ResourceExhausted,
        "already has an upload",
    );
    // A finishes; its slot is free again and B's upload goes through.
    finish_upload(held, &payload)
        .await
        .expect("A's upload accepted");
    b.upload(job, 0, &delta(&wine(), 0, 2.0))
        .await
        .expect("B's upload after A's");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_with_a_store_dir_keeps_deltas_on_disk() {
    let dir = std::env::temp_dir().join(format!(
        "hanzod-delta-upload-{}-{:016x}",
        std::process::id(),
        rand::random::<u64>()
    ));
    let mut cfg = config();
    cfg.deltas.store_dir = dir.display().to_string();
    let d = start_with(&cfg, DaemonParts::default()).await;
    let mut a = Node::join(&d, 22).await;
    let _b = Node::join(&d, 23).await;
    let job = running_job(&d, 2, 1, None).await;
    let payload = delta(&wine(), 0, 1.0);
    a.upload(job, 0, &payload).await.expect("accepted");
    let hex = hex::encode(payload_hash(&payload));
    let on_disk = std::fs::read(dir.join(&hex[..2]).join(&hex[2..])).expect("the blob file");
    assert_eq!(on_disk, payload);
    d.stop().await;

    // A store directory that cannot be one refuses to start, naming the key.
    let file = dir.join("not-a-directory");
    std::fs::write(&file, b"x").unwrap();
    cfg.deltas.store_dir = file.display().to_string();
    let e = Daemon::start(&cfg).await.expect_err("a file as the store");
    assert!(e.to_string().contains("deltas.store_dir"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------------------
// Whole epochs: trained deltas over the wire → validator → merge → next epoch
// ---------------------------------------------------------------------------------------

/// The delta node `n` trains for `epoch` of `job` from `base` with the job's recipe, as
/// HZDL bytes, with the loss it measured (what it claims when honest).
fn trained_delta(n: &Node, job: u64, epoch: u32, base: &hanzod::train::Weights) -> (Vec<u8>, f64) {
    use hanzod::train;
    let recipe = hanzod::delta::sink::recipe_of(&Default::default(), JobId(job)).expect("recipe");
    let data = train::Dataset::wine_quality().expect("data");
    let step = u64::from(epoch) * u64::from(recipe.local_steps);
    let run = train::train_local(base, &data, &recipe, &n.id.node_id().0, step).expect("train");
    let payload = run
        .weights
        .sub(base)
        .expect("delta")
        .to_delta_bytes(u64::from(epoch))
        .expect("HZDL");
    (payload, run.claimed_loss)
}

/// Node `n` uploads `payload` as its delta for `epoch` of `job` (whose local run starts at
/// `epoch × local_steps`), claiming `claimed`, signed with its own key.
async fn upload_as(
    n: &mut Node,
    job: u64,
    epoch: u32,
    claimed: f64,
    payload: &[u8],
) -> pb::DeltaAck {
    let recipe = hanzod::delta::sink::recipe_of(&Default::default(), JobId(job)).expect("recipe");
    let step = u64::from(epoch) * u64::from(recipe.local_steps);
    let (token, chunk) = (n.token.clone(), n.chunk_bytes);
    within(
        "UploadDelta",
        upload_delta(
            &mut n.client,
            &token,
            &n.id,
            job,
            epoch,
            step,
            claimed,
            payload,
            chunk,
        ),
    )
    .await
    .expect("delta accepted at upload")
}

/// Node `n` trains its share of `epoch` from `base` with the job's recipe and uploads the
/// delta over gRPC, claiming `loss_factor ×` its true loss.
async fn train_and_upload(
    n: &mut Node,
    job: u64,
    epoch: u32,
    base: &hanzod::train::Weights,
    loss_factor: f64,
) -> pb::DeltaAck {
    let (payload, loss) = trained_delta(n, job, epoch, base);
    upload_as(n, job, epoch, loss * loss_factor, &payload).await
}

/// Issue 19 item 3: a node that uploads another node's delta bytes under its own signature
/// (free-riding with a colluder) is no longer accepted, merged and paid: both copies are
/// rejected as duplicates, get no weight and no reward, and nobody is slashed (a duplicate
/// does not prove who copied). The honest third node is paid alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delta_uploaded_by_two_nodes_is_rejected_for_both_without_a_slash() {
    use hanzod::train;
    let mut cfg = config();
    // No spot-check: the copy is caught without one.
    cfg.validation.spot_check_rate = 0.0;
    let d = start_with(&cfg, DaemonParts::default()).await;
    let mut nodes = Vec::new();
    for seed in 41..=43 {
        nodes.push(Node::join(&d, seed).await);
    }
    let job = running_job(&d, 3, 1, None).await;
    let recipe = hanzod::delta::sink::recipe_of(&Default::default(), JobId(job)).expect("recipe");
    let init = train::init(&recipe);
    // Node 0 and node 1 train honestly; node 2 uploads node 0's bytes as its own.
    let (payload, loss) = trained_delta(&nodes[0], job, 0, &init);
    for i in [0usize, 2] {
        let ack = upload_as(&mut nodes[i], job, 0, loss, &payload).await;
        assert!(ack.accepted, "the copy is judged with the epoch: {ack:?}");
    }
    let ack = train_and_upload(&mut nodes[1], job, 0, &init, 1.0).await;
    assert!(ack.accepted, "{ack:?}");
    await_phase(&d, job, "Published", |p| {
        matches!(p, JobPhase::Published { .. })
    })
    .await;
    let r = d
        .sink()
        .report(JobId(job), 0)
        .await
        .expect("epoch 0 report");
    let hex = |i: usize| hex::encode(nodes[i].id.node_id().0);
    for line in &r.deltas {
        let copied = line.node == hex(0) || line.node == hex(2);
        let label = line.rejected.as_ref().map(|w| w.label());
        assert_eq!(label, copied.then_some("duplicate"), "{line:?}");
    }
    assert!(r.slashes.is_empty(), "nobody is slashed: {:?}", r.slashes);
    let paid: Vec<_> = d
        .ledger()
        .reward_batches()
        .await
        .expect("batches")
        .into_iter()
        .flat_map(|b| b.paid)
        .collect();
    assert_eq!(paid.len(), 1, "{paid:?}");
    assert_eq!(paid[0].0, nodes[1].id.node_id());
    d.stop().await;
}

/// The checkpoint `reference` (its CID) read back from the daemon's object store.
async fn checkpoint(d: &Daemon, reference: &str) -> hanzod::train::Weights {
    let bytes = d.objects().get(reference).await.expect("checkpoint stored");
    assert_eq!(hanzod::publish::cid_of(&bytes).to_string(), reference);
    hanzod::train::Weights::from_safetensors(&bytes, hanzod::train::layout(32)).expect("loads")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trained_deltas_are_validated_merged_and_the_next_epoch_trains_from_the_checkpoint() {
    use hanzod::train;
    let mut cfg = config();
    // Spot-check everything, so the lying node is caught in this run.
    cfg.validation.spot_check_rate = 1.0;
    let d = start_with(&cfg, DaemonParts::default()).await;
    let mut nodes = Vec::new();
    for seed in 31..=33 {
        nodes.push(Node::join(&d, seed).await);
    }
    // The liar is slashed in epoch 0 and leaves the ring at its end: two nodes go on.
    let job = submit(
        &d,
        pb::JobSpec {
            min_nodes: 2,
            ..job_spec("deltas", 3, 2, None)
        },
    )
    .await
    .expect("job accepted");
    await_phase(&d, job, "Running(0)", |p| {
        matches!(p, JobPhase::Running { epoch: 0, .. })
    })
    .await;
    // The spot-check commitment is public while the epoch runs.
    let mut jobs = JobServiceClient::new(channel(&d).await);
    let wire = within("GetJob", jobs.get_job(pb::GetJobRequest { job_id: job }))
        .await
        .expect("GetJob")
        .into_inner();
    let commitment = wire.spot_check_commitment;
    assert_eq!(commitment.len(), 32);
    let data = train::Dataset::wine_quality().unwrap();
    let init =
        train::init(&hanzod::delta::sink::recipe_of(&Default::default(), JobId(job)).unwrap());
    let loss_init = train::validation_loss(&init, &data).unwrap();

    // Epoch 0: two honest nodes, one claiming twice its loss.
    for (i, n) in nodes.iter_mut().enumerate() {
        let factor = if i == 2 { 2.0 } else { 1.0 };
        let ack = train_and_upload(n, job, 0, &init, factor).await;
        assert!(ack.accepted, "{ack:?}");
    }
    let view = await_phase(&d, job, "Running(1)", |p| {
        matches!(p, JobPhase::Running { epoch: 1, .. })
    })
    .await;
    let cp0 = view.checkpoints[0].clone();
    let liar_id = nodes[2].id.node_id();
    let w0 = checkpoint(&d, &cp0).await;
    let loss0 = train::validation_loss(&w0, &data).unwrap();
    assert!(loss0 < loss_init, "{loss_init} → {loss0}");
    let r0 = d
        .sink()
        .report(JobId(job), 0)
        .await
        .expect("epoch 0 report");
    assert_eq!(r0.checkpoint, cp0);
    assert_eq!(r0.loss_after, loss0);
    let liar = hex::encode(nodes[2].id.node_id().0);
    for line in &r0.deltas {
        assert_eq!(line.rejected.is_some(), line.node == liar, "{line:?}");
    }
    assert_eq!(r0.slashes.len(), 1);
    assert_eq!(r0.slashes[0].node, liar);
    // The report reveals the secret the commitment bound before any delta arrived.
    let secret: [u8; 32] = hex::decode(&r0.secret).unwrap().try_into().unwrap();
    let commitment: [u8; 32] = commitment.try_into().unwrap();
    hanzod::delta::score::verify_reveal(
        &hanzod::delta::score::Commitment(commitment),
        &hanzod::delta::score::EpochSecret::from_bytes(secret),
    )
    .expect("the reveal opens the commitment");
    let m = scrape(&d).await;
    assert_eq!(
        m.get("hanzod_spot_checks_total{outcome=\"failed\"}"),
        Some(&1.0)
    );
    assert_eq!(
        m.get("hanzod_spot_checks_total{outcome=\"passed\"}"),
        Some(&2.0)
    );

    // Slashed and under its penalty, the liar left the ring at the epoch boundary.
    let ring = d.core.ring(JobId(job)).await.unwrap().expect("ring");
    assert!(!ring.members.contains(&liar_id), "{ring:?}");
    assert_eq!(ring.members.len(), 2);
    let views = d.core.nodes().await.unwrap();
    let liar_view = views.iter().find(|v| v.id == liar_id).unwrap();
    assert!(liar_view.penalty_until.is_some(), "{liar_view:?}");

    // Epoch 1 trains from the published checkpoint (base version 1, steps 20..40).
    for n in nodes.iter_mut().take(2) {
        let ack = train_and_upload(n, job, 1, &w0, 1.0).await;
        assert!(ack.accepted, "{ack:?}");
    }
    let view = await_phase(&d, job, "Published", |p| {
        matches!(p, JobPhase::Published { .. })
    })
    .await;
    let w1 = checkpoint(&d, &view.checkpoints[1]).await;
    let loss1 = train::validation_loss(&w1, &data).unwrap();
    let r1 = d
        .sink()
        .report(JobId(job), 1)
        .await
        .expect("epoch 1 report");
    assert!(loss1 < loss0, "{loss0} → {loss1}: {r1:#?}");
    assert!(r1.deltas.iter().all(|l| l.rejected.is_none()), "{r1:#?}");
    eprintln!("validation loss: {loss_init:.4} → {loss0:.4} → {loss1:.4}");
    d.stop().await;
}

/// The whole FetchCheckpoint stream for `checkpoint`, or the status it ended with.
async fn fetch(
    n: &mut Node,
    token: &[u8],
    checkpoint: &str,
) -> Result<Vec<pb::CheckpointChunk>, Status> {
    let mut stream = n
        .client
        .fetch_checkpoint(pb::FetchCheckpointRequest {
            session: token.to_vec(),
            checkpoint: checkpoint.into(),
        })
        .await?
        .into_inner();
    let mut parts = Vec::new();
    while let Some(c) = stream.message().await? {
        parts.push(c);
    }
    Ok(parts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_fetch_published_checkpoints_by_cid_and_bad_requests_get_precise_codes() {
    let mut cfg = config();
    cfg.deltas.chunk_bytes = 1000; // several data chunks for a 6 KB checkpoint
    let d = start_with(&cfg, DaemonParts::default()).await;
    let mut nodes = Vec::new();
    for seed in 41..=43 {
        nodes.push(Node::join(&d, seed).await);
    }
    let job = running_job(&d, 3, 2, None).await;
    let init = hanzod::train::init(
        &hanzod::delta::sink::recipe_of(&Default::default(), JobId(job)).unwrap(),
    );
    for n in nodes.iter_mut() {
        train_and_upload(n, job, 0, &init, 1.0).await;
    }
    let view = await_phase(&d, job, "Running(1)", |p| {
        matches!(p, JobPhase::Running { epoch: 1, .. })
    })
    .await;
    let cid = view.checkpoints[0].clone();
    let n = &mut nodes[0];
    let token = n.token.clone();

    // A header with the size and SHA-256, then the bytes in chunks of the configured size.
    let parts = within("FetchCheckpoint", fetch(n, &token, &cid))
        .await
        .expect("fetched");
    let Some(pb::checkpoint_chunk::Part::Header(h)) = &parts[0].part else {
        panic!("no header first: {:?}", parts[0]);
    };
    let bytes: Vec<u8> = parts[1..]
        .iter()
        .flat_map(|p| match &p.part {
            Some(pb::checkpoint_chunk::Part::Data(d)) => {
                assert!(d.len() <= 1000);
                d.clone()
            }
            other => panic!("not data: {other:?}"),
        })
        .collect();
    assert_eq!(
        (h.checkpoint.as_str(), h.total_bytes),
        (cid.as_str(), bytes.len() as u64)
    );
    assert_eq!(h.sha256, payload_hash(&bytes).to_vec());
    assert_eq!(hanzod::publish::cid_of(&bytes).to_string(), cid);
    assert!(parts.len() > 2, "{} parts", parts.len());
    // The agent's own fetch checks the same and loads the weights.
    let got = hanzod::agent::trainer::fetch_checkpoint(&mut n.client, &token, &cid)
        .await
        .expect("the agent fetches it");
    assert_eq!(got, bytes);

    assert_refused(
        "unknown session",
        fetch(n, &[7; 16], &cid).await,
        Code::Unauthenticated,
        "session",
    );
    assert_refused(
        "a malformed reference",
        fetch(n, &token, "sha256:abcd").await,
        Code::InvalidArgument,
        "checkpoint",
    );
    let absent = hanzod::publish::cid_of(b"never published").to_string();
    assert_refused(
        "a checkpoint never published",
        fetch(n, &token, &absent).await,
        Code::NotFound,
        &absent,
    );
    let err = hanzod::agent::trainer::fetch_checkpoint(&mut n.client, &token, &absent)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("NOT_FOUND"), "{err}");
    d.stop().await;
}

// ---------------------------------------------------------------------------------------
// What `job status` and `job watch` show of each epoch and each ring repair
// ---------------------------------------------------------------------------------------

/// Regression (`job watch` printed "Published epoch N" while the epoch kept the old
/// weights, and ring repairs without who left or how long it took): each published epoch
/// carries its summary (advanced or kept and why, the losses, the verdicts), and a ring
/// repair names the removed node and its repair time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_status_and_watch_show_each_epochs_outcome_and_who_a_repair_removed() {
    // No spot-checks: the deltas below claim a made-up loss, which a spot-check would catch.
    let mut cfg = config();
    cfg.validation.spot_check_rate = 0.0;
    let d = start_with(&cfg, DaemonParts::default()).await;
    let mut nodes = vec![
        Node::join(&d, 41).await,
        Node::join(&d, 42).await,
        Node::join(&d, 43).await,
    ];
    let spec = pb::JobSpec {
        min_nodes: 2,
        max_nodes: 3,
        ..job_spec("watched", 3, 3, None)
    };
    let job = submit(&d, spec).await.expect("job accepted");
    await_phase(&d, job, "Running(0)", |p| {
        matches!(p, JobPhase::Running { epoch: 0, .. })
    })
    .await;
    let mut jobs = JobServiceClient::new(channel(&d).await);
    let mut watch = within(
        "WatchJob",
        jobs.watch_job(pb::WatchJobRequest { job_id: job }),
    )
    .await
    .expect("watching")
    .into_inner();

    // Epoch 0: every member delivers a small honest-looking delta, each its own (three
    // copies of one pattern would be rejected as copies: `pipeline::copies`).
    for (i, n) in nodes.iter_mut().enumerate() {
        let own = delta_with(&wine(), 0, i as f32, |tensors| {
            for (_, _, v) in tensors.iter_mut() {
                for (k, x) in v.iter_mut().enumerate() {
                    *x += (((k + 1) * (i + 3) * 7919) % 23) as f32 * 1e-3 - 0.011;
                }
            }
        });
        n.upload(job, 0, &own).await.expect("accepted");
    }
    await_phase(&d, job, "Running(1)", |p| {
        matches!(p, JobPhase::Running { epoch: 1, .. })
    })
    .await;
    let status = within("GetJob", jobs.get_job(pb::GetJobRequest { job_id: job }))
        .await
        .expect("job")
        .into_inner();
    assert_eq!(status.epoch_summaries.len(), 1, "{status:?}");
    let s = &status.epoch_summaries[0];
    assert_eq!((s.epoch, s.accepted, s.rejected), (0, 3, 0), "{s:?}");
    assert_eq!(s.checkpoint, status.checkpoints[0]);
    assert!(s.loss_before > 0.0, "{s:?}");
    // Either the checkpoint advanced by a named aggregator, or it was kept and says why.
    assert_eq!(s.advanced, s.kept_reason.is_empty(), "{s:?}");
    assert_eq!(s.advanced, !s.aggregator.is_empty(), "{s:?}");

    // A member leaves: the repair names it and says how long it took.
    let gone = nodes.pop().expect("a member").id.node_id();
    let change = loop {
        let ev = within("a watch event", watch.message())
            .await
            .expect("the watch stream")
            .expect("the job has not ended");
        if let Some(c) = ev.ring_change {
            if c.repair_ms.is_some() {
                break c;
            }
        }
    };
    assert_eq!(change.removed, vec![gone.0.to_vec()], "{change:?}");
    assert_eq!(
        change.members, 2,
        "the repaired ring, not the old one: {change:?}"
    );
    assert!(change.version >= 2, "{change:?}");
    assert!(change.added.is_empty(), "no standby to add: {change:?}");
    assert!(change.repair_ms.expect("a repair") < 20_000, "{change:?}");
    d.stop().await;
}

// ---------------------------------------------------------------------------------------
// SubmitJob: the validation budget and `training.base`
// ---------------------------------------------------------------------------------------

/// A job spec of `nodes` nodes training `training`.
fn training_job(name: &str, nodes: u32, training: pb::TrainingSpec) -> pb::JobSpec {
    pb::JobSpec {
        max_nodes: nodes,
        min_nodes: 1,
        training: Some(training),
        ..job_spec(name, nodes, 1, None)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_refuses_a_job_whose_epoch_validation_is_over_budget() {
    use hanzod::delta::budget::EpochValidation;
    let d = start().await;
    // Qwen3-0.6B with 4096 validation tokens on 64 nodes: 3.2e14 FLOPs of scoring alone,
    // above the default budget of 1e14.
    let architecture = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/qwen3-0.6b/config.json"
    ))
    .expect("the Qwen3-0.6B config.json");
    let big = pb::TrainingSpec {
        model: Some("qwen3".into()),
        dataset: Some("austen".into()),
        architecture: Some(architecture.clone()),
        validation_tokens: Some(4096),
        ..Default::default()
    };
    let e = submit(&d, training_job("qwen3-0.6b", 64, big))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    // Both figures: the estimate (the pure function's, on the model's parameter count)
    // and the budget.
    let params = hanzod::train::qwen3::Qwen3Config::from_json(&architecture)
        .unwrap()
        .spec()
        .param_count();
    let training = hanzod::grpc::convert::job_spec(Some(&training_job(
        "x",
        64,
        pb::TrainingSpec {
            model: Some("qwen3".into()),
            dataset: Some("austen".into()),
            architecture: Some(architecture),
            validation_tokens: Some(4096),
            ..Default::default()
        },
    )))
    .unwrap()
    .training;
    let flops =
        EpochValidation::lm(params, &training, 64, config().validation.spot_check_rate).flops();
    assert!(flops > 3e14, "{flops}");
    assert!(
        e.message().contains(&format!("{flops:.3e}")) && e.message().contains("1.000e14"),
        "{e:?}"
    );
    assert_eq!(
        counter(
            &d,
            "hanzod_rejected_messages_total{reason=\"resource_exhausted\"}"
        )
        .await,
        1.0
    );
    // The built-in qwen3-tiny with the recipe defaults fits on as many nodes.
    let tiny = pb::TrainingSpec {
        model: Some("qwen3-tiny".into()),
        dataset: Some("austen".into()),
        ..Default::default()
    };
    submit(&d, training_job("qwen3-tiny", 64, tiny))
        .await
        .expect("qwen3-tiny is within the default budget");
    d.stop().await;

    // The MLP is budgeted too (in samples): a daemon with a tiny budget refuses it.
    let mut cfg = config();
    cfg.validation.validation_budget_flops = 1e6;
    let d = start_with(&cfg, DaemonParts::default()).await;
    let e = submit(&d, job_spec("mlp", 2, 1, None)).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("1.000e6"), "{e:?}");
    d.stop().await;
}

/// An object store that answers `alias` with the bytes stored under `target`, as a store
/// that resolves another form of a CID would (a CIDv0, another chunking); everything else
/// is the memory store's.
#[derive(Debug, Default)]
struct Aliasing {
    inner: hanzod::publish::MemoryObjectStore,
    alias: std::sync::Mutex<Option<(String, String)>>,
}

#[async_trait::async_trait]
impl hanzod::publish::ObjectStore for Aliasing {
    async fn put(&self, bytes: bytes::Bytes) -> Result<String, hanzod::publish::ObjectError> {
        self.inner.put(bytes).await
    }
    async fn get(&self, cid: &str) -> Result<std::sync::Arc<[u8]>, hanzod::publish::ObjectError> {
        let target = self
            .alias
            .lock()
            .unwrap()
            .clone()
            .filter(|(a, _)| a == cid)
            .map(|(_, t)| t);
        self.inner.get(target.as_deref().unwrap_or(cid)).await
    }
    async fn contains(&self, cid: &str) -> Result<bool, hanzod::publish::ObjectError> {
        self.inner.contains(cid).await
    }
    async fn pin(&self, cid: &str) -> Result<(), hanzod::publish::ObjectError> {
        self.inner.pin(cid).await
    }
    async fn is_pinned(&self, cid: &str) -> Result<bool, hanzod::publish::ObjectError> {
        self.inner.is_pinned(cid).await
    }
    async fn pins(&self) -> Result<Vec<String>, hanzod::publish::ObjectError> {
        self.inner.pins().await
    }
}

/// The next `EpochStart` of `job` on `n`'s session stream (other messages are skipped).
async fn epoch_start(n: &mut Node, job: u64) -> pb::EpochStart {
    loop {
        match within("an EpochStart", n.inbound.message()).await {
            Ok(Some(pb::OrchestratorMessage {
                body: Some(Out::EpochStart(s)),
                ..
            })) if s.job_id == job => return s,
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the session ended"),
            Err(s) => panic!("the session ended {s:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_starts_from_a_base_checkpoint_and_bad_bases_are_refused() {
    use hanzod::publish::ObjectStore;
    use hanzod::train;
    let mut cfg = config();
    // Spot-check everything: a replay from any other weights than the base would fail.
    cfg.validation.spot_check_rate = 1.0;
    let objects = std::sync::Arc::new(Aliasing::default());
    let parts = DaemonParts {
        objects: Some(objects.clone()),
        ..DaemonParts::default()
    };
    let d = start_with(&cfg, parts).await;
    let mut nodes = Vec::new();
    for seed in 71..=73 {
        nodes.push(Node::join(&d, seed).await);
    }

    // Job A trains one epoch from the seed's weights.
    let a = running_job(&d, 3, 1, None).await;
    let start = epoch_start(&mut nodes[0], a).await;
    assert_eq!(start.base_checkpoint, "", "epoch 0 of a job without a base");
    let init = train::init(&hanzod::delta::sink::recipe_of(&Default::default(), JobId(a)).unwrap());
    for n in nodes.iter_mut() {
        assert!(train_and_upload(n, a, 0, &init, 1.0).await.accepted);
    }
    let view = await_phase(&d, a, "Published", |p| {
        matches!(p, JobPhase::Published { .. })
    })
    .await;
    let base = view.checkpoints[0].clone();
    let w_a = checkpoint(&d, &base).await;
    let r_a = d.sink().report(JobId(a), 0).await.expect("job A's report");

    // Refused bases, each with its own code; the CID is echoed.
    let with_base = |b: &str| {
        let mut spec = job_spec("based", 3, 1, None);
        spec.training = Some(pb::TrainingSpec {
            base: Some(b.into()),
            ..Default::default()
        });
        spec
    };
    let refused = |what: &str, r: Result<u64, Status>, code: Code, mentions: &str| {
        assert_refused(what, r, code, mentions)
    };
    refused(
        "a base that is not a CID",
        submit(&d, with_base("sha256:abcd")).await,
        Code::InvalidArgument,
        "spec.training.base",
    );
    let absent = hanzod::publish::cid_of(b"never published").to_string();
    refused(
        "a base not in the object store",
        submit(&d, with_base(&absent)).await,
        Code::NotFound,
        &absent,
    );
    let not_weights = objects
        .put(b"not a checkpoint".to_vec().into())
        .await
        .unwrap();
    refused(
        "a base that is not this model's checkpoint",
        submit(&d, with_base(&not_weights)).await,
        Code::InvalidArgument,
        "is not a checkpoint of model \"wine-mlp\"",
    );
    let narrow = train::init(&train::Recipe {
        hidden: 8,
        ..hanzod::delta::sink::recipe_of(&Default::default(), JobId(a)).unwrap()
    });
    let other_width = objects.put(narrow.to_safetensors().into()).await.unwrap();
    refused(
        "a checkpoint of another model",
        submit(&d, with_base(&other_width)).await,
        Code::InvalidArgument,
        "is not a checkpoint of model",
    );
    // The store resolves `not_weights` to job A's checkpoint: bytes of another CID.
    *objects.alias.lock().unwrap() = Some((not_weights.clone(), base.clone()));
    refused(
        "a base whose bytes have another CID",
        submit(&d, with_base(&not_weights)).await,
        Code::FailedPrecondition,
        &format!("whose CID is {base}"),
    );
    let long = format!("bafk{}", "a".repeat(250));
    let e = submit(&d, with_base(&long)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().len() < 400, "the CID is cut: {e:?}");

    // Job B starts from job A's checkpoint: its first assignment names it, its nodes train
    // from those weights, and its epoch 0 scores the base at job A's last loss.
    let b = submit(&d, with_base(&base))
        .await
        .expect("a published checkpoint as base");
    let start = epoch_start(&mut nodes[0], b).await;
    assert_eq!(
        (start.epoch, start.base_checkpoint.as_str()),
        (0, base.as_str())
    );
    for n in nodes.iter_mut() {
        let ack = train_and_upload(n, b, 0, &w_a, 1.0).await;
        assert!(ack.accepted, "{ack:?}");
    }
    let view = await_phase(&d, b, "Published", |p| {
        matches!(p, JobPhase::Published { .. })
    })
    .await;
    let r_b = d.sink().report(JobId(b), 0).await.expect("job B's report");
    assert_eq!(r_b.base.as_deref(), Some(base.as_str()));
    assert_eq!(r_b.loss_before, r_a.loss_after);
    assert!(
        r_b.deltas.iter().all(|l| l.rejected.is_none()),
        "every replay from the base passes: {r_b:#?}"
    );
    let w_b = checkpoint(&d, &view.checkpoints[0]).await;
    let data = train::Dataset::wine_quality().unwrap();
    let (loss_a, loss_b) = (
        train::validation_loss(&w_a, &data).unwrap(),
        train::validation_loss(&w_b, &data).unwrap(),
    );
    assert_eq!(loss_a, r_a.loss_after);
    assert!(loss_b < loss_a, "{loss_a} → {loss_b}");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qwen3_architecture_given_as_a_cid_is_fetched_and_stored_as_its_text() {
    use hanzod::publish::ObjectStore;
    let objects = std::sync::Arc::new(hanzod::publish::MemoryObjectStore::new());
    let parts = DaemonParts {
        objects: Some(objects.clone()),
        ..DaemonParts::default()
    };
    let d = start_with(&config(), parts).await;
    let config_json = hanzod::train::lm::qwen3_tiny().to_json();
    let cid = objects
        .put(config_json.clone().into_bytes().into())
        .await
        .expect("the config.json stored");
    let qwen3 = |architecture: &str| {
        training_job(
            "qwen3-by-cid",
            2,
            pb::TrainingSpec {
                model: Some("qwen3".into()),
                dataset: Some("austen".into()),
                architecture: Some(architecture.into()),
                ..Default::default()
            },
        )
    };

    // Accepted: the job as the core holds it, and as the event log recorded it, carries
    // the config.json text, not the CID.
    let id = submit(&d, qwen3(&cid)).await.expect("a stored config.json");
    let view = d.core.job(JobId(id)).await.expect("the job");
    assert_eq!(view.spec.training.model, "qwen3");
    assert_eq!(
        view.spec.training.architecture.as_deref(),
        Some(config_json.as_str())
    );
    let logged = d
        .core
        .state_store()
        .read_after(0)
        .await
        .expect("event log")
        .into_iter()
        .find_map(|r| match r.event {
            Event::JobSubmitted { job, spec, .. } if job == JobId(id) => Some(spec),
            _ => None,
        })
        .expect("the job's JobSubmitted");
    assert_eq!(logged.training.architecture, Some(config_json.clone()));
    // GetJob answers for it.
    let mut jobs = JobServiceClient::new(channel(&d).await);
    let job = within("GetJob", jobs.get_job(pb::GetJobRequest { job_id: id }))
        .await
        .expect("GetJob")
        .into_inner();
    assert_eq!((job.job_id, job.name.as_str()), (id, "qwen3-by-cid"));

    // A CID the store does not hold is NOT_FOUND, naming it.
    let absent = hanzod::publish::cid_of(b"{\"model_type\": \"qwen3\"}").to_string();
    assert_refused(
        "an architecture CID not in the object store",
        submit(&d, qwen3(&absent)).await,
        Code::NotFound,
        &absent,
    );
    assert_eq!(
        counter(&d, "hanzod_rejected_messages_total{reason=\"not_found\"}").await,
        1.0
    );
    // Neither JSON nor a CID: the catalog's refusal, as before.
    assert_refused(
        "an architecture that is neither JSON nor a CID",
        submit(&d, qwen3("config.json")).await,
        Code::InvalidArgument,
        "invalid spec.training.architecture",
    );
    d.stop().await;
}
