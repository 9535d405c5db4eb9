//! Abuse of the daemon's gRPC surface over real loopback sockets: every bad input gets a
//! precise status (or a `Reject` on the session stream), refusals are counted in
//! `hanzod_rejected_messages_total{reason}`, and the daemon keeps serving.
//!
//! Each test starts its own daemon on `127.0.0.1:0`; every wait on the server is bounded.

use std::cell::Cell;
use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hanzod::agent::error_chain;
use hanzod::client::ClientOptions;
use hanzod::config::Config;
use hanzod::core::domain;
use hanzod::identity::Identity;
use hanzod::serve::Daemon;
use hanzod_proto::v1 as pb;
use hanzod_proto::v1::admin_service_client::AdminServiceClient;
use hanzod_proto::v1::job_service_client::JobServiceClient;
use hanzod_proto::v1::node_service_client::NodeServiceClient;
use hanzod_proto::v1::orchestrator_message::Body as Out;
use prost::Message;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_rustls::rustls;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status, Streaming};

/// The longest any single wait on the server may take before the test fails.
const WAIT: Duration = Duration::from_secs(20);

async fn within<F: Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(WAIT, f)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

// ---------------------------------------------------------------------------------------
// Daemon, channels, metrics
// ---------------------------------------------------------------------------------------

fn config() -> Config {
    let mut cfg = Config::load(None, |_| None).expect("default configuration");
    cfg.data_dir.clear(); // memory-only: nothing written into the working directory
    cfg.server.grpc_addr = "127.0.0.1:0".into();
    cfg.server.metrics_addr = "127.0.0.1:0".into();
    cfg
}

async fn start(cfg: &Config) -> Daemon {
    within("the daemon to start", Daemon::start(cfg))
        .await
        .expect("daemon starts")
}

async fn channel(d: &Daemon) -> Channel {
    let ep = Channel::from_shared(format!("http://{}", d.grpc_addr)).expect("uri");
    within("connect", ep.connect()).await.expect("connect")
}

async fn node_client(d: &Daemon) -> NodeServiceClient<Channel> {
    NodeServiceClient::new(channel(d).await)
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

fn rejected(reason: &str) -> String {
    format!("hanzod_rejected_messages_total{{reason=\"{reason}\"}}")
}

/// Polls the scrape until `series` equals `want` (absent counts as 0), or fails.
async fn expect_counter(d: &Daemon, series: &str, want: f64) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let got = scrape(d).await.get(series).copied().unwrap_or(0.0);
        if got == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{series} = {got}, want {want}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Awaits a unary call that must fail with `code` and a message containing `mentions`.
async fn refused<T: std::fmt::Debug>(
    what: &str,
    call: impl Future<Output = Result<Response<T>, Status>>,
    code: Code,
    mentions: &str,
) -> Status {
    match within(what, call).await {
        Ok(r) => panic!("{what}: succeeded with {:?}", r.into_inner()),
        Err(s) => {
            assert_eq!(s.code(), code, "{what}: {s:?}");
            assert!(
                s.message().contains(mentions),
                "{what}: message {:?} does not mention {mentions:?}",
                s.message()
            );
            s
        }
    }
}

// ---------------------------------------------------------------------------------------
// Registration and sessions
// ---------------------------------------------------------------------------------------

/// A valid NodeInfo for `id`.
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

async fn challenge(c: &mut NodeServiceClient<Channel>, id: &Identity) -> Vec<u8> {
    within(
        "Challenge",
        c.challenge(pb::ChallengeRequest {
            node_id: id.node_id().0.to_vec(),
        }),
    )
    .await
    .expect("challenge accepted")
    .into_inner()
    .nonce
}

/// A RegisterRequest for `info`, signed by `id` over `REGISTER || nonce || info`.
fn register_request(id: &Identity, nonce: &[u8], info: &pb::NodeInfo) -> pb::RegisterRequest {
    let info = info.encode_to_vec();
    let signature = id.sign(domain::REGISTER, &[nonce, &info]).to_vec();
    pb::RegisterRequest {
        info,
        nonce: nonce.to_vec(),
        signature,
    }
}

/// Challenge + Register, which must succeed.
async fn register(c: &mut NodeServiceClient<Channel>, id: &Identity) -> pb::RegisterResponse {
    let nonce = challenge(c, id).await;
    within(
        "Register",
        c.register(register_request(id, &nonce, &node_info(id))),
    )
    .await
    .expect("registration accepted")
    .into_inner()
}

/// `msg` in its envelope, signed by `id` over `SESSION || payload`.
fn sign_message(id: &Identity, msg: &pb::NodeMessage) -> pb::SignedNodeMessage {
    let payload = msg.encode_to_vec();
    let signature = id.sign(domain::SESSION, &[&payload]).to_vec();
    pb::SignedNodeMessage { payload, signature }
}

/// A heartbeat with the given sequence number and timestamp, signed by `id`.
fn heartbeat(id: &Identity, token: &[u8], seq: u64, timestamp_ms: u64) -> pb::SignedNodeMessage {
    sign_message(
        id,
        &pb::NodeMessage {
            session: token.to_vec(),
            seq,
            timestamp_ms,
            body: Some(pb::node_message::Body::Heartbeat(pb::Heartbeat {
                gpu_utilization: 0.5,
                memory_used: 1 << 30,
                current_step: seq,
            })),
        },
    )
}

type Inbound = Streaming<pb::OrchestratorMessage>;

/// Opens a session stream whose first message is `first`.
async fn open_stream(
    c: &mut NodeServiceClient<Channel>,
    first: pb::SignedNodeMessage,
) -> Result<(mpsc::Sender<pb::SignedNodeMessage>, Inbound), Status> {
    let (tx, rx) = mpsc::channel(64);
    tx.try_send(first).expect("queue the first message");
    let inbound = within(
        "the Session call",
        c.session(Request::new(ReceiverStream::new(rx))),
    )
    .await?
    .into_inner();
    Ok((tx, inbound))
}

/// A registered node with an attached session stream.
struct Joined {
    tx: mpsc::Sender<pb::SignedNodeMessage>,
    inbound: Inbound,
    token: Vec<u8>,
    id: Identity,
}

impl Joined {
    async fn send(&self, m: pb::SignedNodeMessage) {
        within("a session send", self.tx.send(m))
            .await
            .expect("the session stream is open");
    }

    /// Sends a fresh heartbeat numbered `seq`.
    async fn heartbeat(&self, d: &Daemon, seq: u64) {
        self.send(heartbeat(&self.id, &self.token, seq, now_ms(d)))
            .await;
    }

    /// Proves that `seq` was the last accepted message and that nothing was refused since
    /// the last Reject read: a duplicate of `seq` must be the next thing refused, as a replay
    /// of exactly `seq`.
    async fn expect_last_accepted(&mut self, d: &Daemon, seq: u64) {
        self.heartbeat(d, seq).await;
        let r = next_reject(&mut self.inbound).await;
        assert_eq!(r.seq, seq, "an earlier message was refused: {r:?}");
        assert_eq!(r.code, Code::FailedPrecondition as i32, "{r:?}");
        assert!(
            r.reason.contains(&format!("seq {seq} is not above {seq}")),
            "{r:?}"
        );
    }
}

/// Registers `id` and opens its session with a heartbeat numbered `first_seq`.
async fn join(
    d: &Daemon,
    c: &mut NodeServiceClient<Channel>,
    id: Identity,
    first_seq: u64,
) -> Joined {
    let reg = register(c, &id).await;
    let token = reg.session;
    let (tx, inbound) = open_stream(c, heartbeat(&id, &token, first_seq, now_ms(d)))
        .await
        .expect("session attached");
    Joined {
        tx,
        inbound,
        token,
        id,
    }
}

/// The next Reject on a session stream (other messages are skipped).
async fn next_reject(inbound: &mut Inbound) -> pb::Reject {
    loop {
        match within("a Reject", inbound.message()).await {
            Ok(Some(pb::OrchestratorMessage {
                body: Some(Out::Reject(r)),
                ..
            })) => return r,
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the stream ended OK before a Reject"),
            Err(s) => panic!("the stream ended {s:?} before a Reject"),
        }
    }
}

/// Reads a session stream to its end: the Rejects on the way, and the closing status
/// (code OK for a clean end).
async fn drain(inbound: &mut Inbound) -> (Vec<pb::Reject>, Status) {
    let mut rejects = Vec::new();
    loop {
        match within("the stream to end", inbound.message()).await {
            Ok(Some(pb::OrchestratorMessage {
                body: Some(Out::Reject(r)),
                ..
            })) => rejects.push(r),
            Ok(Some(_)) => {}
            Ok(None) => return (rejects, Status::new(Code::Ok, "ended")),
            Err(s) => return (rejects, s),
        }
    }
}

fn job_spec() -> pb::JobSpec {
    pb::JobSpec {
        name: "abuse".into(),
        epochs: 1,
        min_nodes: 1,
        max_nodes: 2,
        min_vram_bytes: 1 << 30,
        pending_deadline_ms: 600_000,
        epoch_deadline_ms: 600_000,
        utility: 1.0,
        submitter_stake_gym_wei: "1000".into(),
        training: None,
    }
}

// ---------------------------------------------------------------------------------------
// 1. Registration: signatures and nonces
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_with_a_bad_signature_or_nonce_is_unauthenticated() {
    let d = start(&config()).await;
    let mut c = node_client(&d).await;
    let me = Identity::from_seed([1; 32]);
    let other = Identity::from_seed([2; 32]);
    let info = node_info(&me);

    // Signed by another key.
    let nonce = challenge(&mut c, &me).await;
    refused(
        "register signed by another key",
        c.register(register_request(&other, &nonce, &info)),
        Code::Unauthenticated,
        "signature",
    )
    .await;
    // 63 bytes.
    let nonce = challenge(&mut c, &me).await;
    let mut req = register_request(&me, &nonce, &info);
    req.signature.truncate(63);
    refused(
        "register with a 63-byte signature",
        c.register(req),
        Code::Unauthenticated,
        "63 bytes",
    )
    .await;
    // Missing.
    let nonce = challenge(&mut c, &me).await;
    let mut req = register_request(&me, &nonce, &info);
    req.signature.clear();
    refused(
        "register without a signature",
        c.register(req),
        Code::Unauthenticated,
        "signature",
    )
    .await;
    expect_counter(&d, &rejected("bad_signature"), 3.0).await;

    // A nonce never issued.
    let req = register_request(&me, &[7; 32], &info);
    refused(
        "register with a nonce never issued",
        c.register(req),
        Code::Unauthenticated,
        "nonce",
    )
    .await;
    // A nonce issued to another key.
    let nonce = challenge(&mut c, &other).await;
    refused(
        "register with another key's nonce",
        c.register(register_request(&me, &nonce, &info)),
        Code::Unauthenticated,
        "nonce",
    )
    .await;
    // A missing nonce.
    refused(
        "register without a nonce",
        c.register(register_request(&me, &[], &info)),
        Code::Unauthenticated,
        "nonce",
    )
    .await;
    // A nonce used twice: the first use succeeds, the second is refused.
    let nonce = challenge(&mut c, &me).await;
    let req = register_request(&me, &nonce, &info);
    within("register", c.register(req.clone()))
        .await
        .expect("first use of the nonce");
    refused(
        "register with a used nonce",
        c.register(req),
        Code::Unauthenticated,
        "nonce",
    )
    .await;
    expect_counter(&d, &rejected("bad_nonce"), 4.0).await;
    expect_counter(&d, &rejected("bad_signature"), 3.0).await;
    d.stop().await;
}

// ---------------------------------------------------------------------------------------
// 2. Session: authentication and attachment
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_refuses_bad_signatures_unknown_tokens_and_a_second_stream() {
    let d = start(&config()).await;
    let mut c = node_client(&d).await;
    let me = Identity::from_seed([10; 32]);
    let other = Identity::from_seed([11; 32]);
    let token = register(&mut c, &me).await.session;

    // First message signed by another key.
    let forged = heartbeat(&other, &token, 1, now_ms(&d));
    let s = open_stream(&mut c, forged)
        .await
        .expect_err("forged first message");
    assert_eq!(s.code(), Code::Unauthenticated, "{s:?}");
    // A bad signature length.
    let mut short = heartbeat(&me, &token, 1, now_ms(&d));
    short.signature.truncate(10);
    let s = open_stream(&mut c, short)
        .await
        .expect_err("short signature");
    assert_eq!(s.code(), Code::Unauthenticated, "{s:?}");
    expect_counter(&d, &rejected("bad_signature"), 2.0).await;

    // Unknown and malformed session tokens.
    let s = open_stream(&mut c, heartbeat(&me, &[9; 16], 1, now_ms(&d)))
        .await
        .expect_err("unknown token");
    assert_eq!(s.code(), Code::Unauthenticated, "{s:?}");
    let s = open_stream(&mut c, heartbeat(&me, &[9; 5], 1, now_ms(&d)))
        .await
        .expect_err("malformed token");
    assert_eq!(s.code(), Code::Unauthenticated, "{s:?}");
    expect_counter(&d, &rejected("unknown_session"), 2.0).await;

    // The refused attempts did not use up the session: a valid stream attaches.
    let (tx, inbound) = open_stream(&mut c, heartbeat(&me, &token, 1, now_ms(&d)))
        .await
        .expect("valid first message attaches");
    let mut a = Joined {
        tx,
        inbound,
        token: token.clone(),
        id: me.clone(),
    };
    // A second stream for the same session.
    let s = open_stream(&mut c, heartbeat(&me, &token, 2, now_ms(&d)))
        .await
        .expect_err("second stream");
    assert_eq!(s.code(), Code::AlreadyExists, "{s:?}");
    expect_counter(&d, &rejected("session_taken"), 1.0).await;
    // The first stream is unaffected.
    a.heartbeat(&d, 2).await;
    a.expect_last_accepted(&d, 2).await;
    d.stop().await;
}

// ---------------------------------------------------------------------------------------
// 3. Replay and freshness
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_and_stale_messages_get_rejects_and_the_stream_stays_open() {
    let d = start(&config()).await;
    let mut c = node_client(&d).await;
    let mut s = join(&d, &mut c, Identity::from_seed([20; 32]), 5).await;

    for seq in [5, 3] {
        s.heartbeat(&d, seq).await;
        let r = next_reject(&mut s.inbound).await;
        assert_eq!(r.seq, seq, "{r:?}");
        assert_eq!(r.code, Code::FailedPrecondition as i32, "{r:?}");
        assert!(r.reason.contains("replay"), "{r:?}");
    }
    expect_counter(&d, &rejected("replay"), 2.0).await;
    // The stream stays open: seq 6 is accepted without a Reject.
    s.heartbeat(&d, 6).await;
    s.expect_last_accepted(&d, 6).await;
    expect_counter(&d, &rejected("replay"), 3.0).await;

    // 60 s in the past and in the future: outside the ±30 s window.
    let id = s.id.clone();
    for (seq, ts) in [(7, now_ms(&d) - 60_000), (8, now_ms(&d) + 60_000)] {
        s.send(heartbeat(&id, &s.token, seq, ts)).await;
        let r = next_reject(&mut s.inbound).await;
        assert_eq!(r.seq, seq, "{r:?}");
        assert_eq!(r.code, Code::FailedPrecondition as i32, "{r:?}");
        assert!(r.reason.contains("window"), "{r:?}");
    }
    expect_counter(&d, &rejected("outside_window"), 2.0).await;
    // A refused message does not advance the sequence: 7 is still usable.
    s.heartbeat(&d, 7).await;
    s.expect_last_accepted(&d, 7).await;
    expect_counter(&d, "hanzod_session_messages_total{kind=\"heartbeat\"}", 3.0).await;
    d.stop().await;
}

// ---------------------------------------------------------------------------------------
// 4. Unknown nodes, probes and jobs
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_nodes_probes_and_jobs_are_not_found() {
    let d = start(&config()).await;
    let ch = channel(&d).await;
    let mut c = NodeServiceClient::new(ch.clone());
    let mut admin = AdminServiceClient::new(ch.clone());
    let mut jobs = JobServiceClient::new(ch);

    refused(
        "GetNode of an unregistered key",
        admin.get_node(pb::GetNodeRequest {
            node_id: Identity::from_seed([3; 32]).node_id().0.to_vec(),
        }),
        Code::NotFound,
        "not registered",
    )
    .await;

    let mut s = join(&d, &mut c, Identity::from_seed([30; 32]), 1).await;
    let probe = sign_message(
        &s.id,
        &pb::NodeMessage {
            session: s.token.clone(),
            seq: 2,
            timestamp_ms: now_ms(&d),
            body: Some(pb::node_message::Body::ProbeResult(pb::ProbeResult {
                probe_id: 42,
                peer: vec![4; 32],
                mbps: 100.0,
                bytes: 1 << 20,
                elapsed_us: 80_000,
                error: String::new(),
            })),
        },
    );
    s.send(probe).await;
    let r = next_reject(&mut s.inbound).await;
    assert_eq!(r.seq, 2, "{r:?}");
    assert_eq!(r.code, Code::NotFound as i32, "{r:?}");
    assert!(r.reason.contains("probe"), "{r:?}");
    expect_counter(&d, &rejected("unknown_probe"), 1.0).await;
    // Still open.
    s.heartbeat(&d, 3).await;
    s.expect_last_accepted(&d, 3).await;

    refused(
        "GetJob of an unknown job",
        jobs.get_job(pb::GetJobRequest { job_id: 999 }),
        Code::NotFound,
        "",
    )
    .await;
    refused(
        "GetRing of an unknown job",
        admin.get_ring(pb::GetRingRequest { job_id: 999 }),
        Code::NotFound,
        "",
    )
    .await;
    refused(
        "CancelJob of an unknown job",
        jobs.cancel_job(pb::CancelJobRequest { job_id: 999 }),
        Code::NotFound,
        "",
    )
    .await;
    refused(
        "WatchJob of an unknown job",
        jobs.watch_job(pb::WatchJobRequest { job_id: 999 }),
        Code::NotFound,
        "",
    )
    .await;
    d.stop().await;
}

// ---------------------------------------------------------------------------------------
// 5. Malformed fields
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_fields_are_invalid_argument_naming_the_field() {
    let d = start(&config()).await;
    let ch = channel(&d).await;
    let mut c = NodeServiceClient::new(ch.clone());
    let mut jobs = JobServiceClient::new(ch);
    let me = Identity::from_seed([40; 32]);

    refused(
        "Challenge with a 31-byte node id",
        c.challenge(pb::ChallengeRequest {
            node_id: vec![1; 31],
        }),
        Code::InvalidArgument,
        "node_id",
    )
    .await;

    refused(
        "Register with info that is not a NodeInfo",
        c.register(pb::RegisterRequest {
            info: vec![0xff, 0xff, 0xff],
            nonce: vec![0; 32],
            signature: vec![0; 64],
        }),
        Code::InvalidArgument,
        "info",
    )
    .await;
    type Spoil = fn(&mut pb::NodeInfo);
    let bad: [(&str, Spoil); 3] = [
        ("info.region", |i| i.region = "EU West".into()),
        ("info.gpu.vram_bytes", |i| {
            i.gpu.as_mut().expect("gpu").vram_bytes = 0
        }),
        ("info.endpoint", |i| i.endpoint = "nohost".into()),
    ];
    for (field, spoil) in bad {
        let mut info = node_info(&me);
        spoil(&mut info);
        let nonce = challenge(&mut c, &me).await;
        refused(
            field,
            c.register(register_request(&me, &nonce, &info)),
            Code::InvalidArgument,
            field,
        )
        .await;
    }
    expect_counter(&d, &rejected("invalid"), 5.0).await;

    let bad_specs = [
        (
            "epochs",
            Some(pb::JobSpec {
                epochs: 0,
                ..job_spec()
            }),
        ),
        ("spec", None),
        (
            "spec.submitter_stake_gym_wei",
            Some(pb::JobSpec {
                submitter_stake_gym_wei: "-1".into(),
                ..job_spec()
            }),
        ),
    ];
    for (field, spec) in bad_specs {
        refused(
            field,
            jobs.submit_job(pb::SubmitJobRequest { spec }),
            Code::InvalidArgument,
            field,
        )
        .await;
    }
    // The valid spec is accepted (the refusals above are about the fields).
    within(
        "SubmitJob",
        jobs.submit_job(pb::SubmitJobRequest {
            spec: Some(job_spec()),
        }),
    )
    .await
    .expect("valid spec accepted");
    d.stop().await;
}

// ---------------------------------------------------------------------------------------
// 6. Oversized messages
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_messages_are_resource_exhausted() {
    let mut cfg = config();
    cfg.server.max_message_bytes = 64 << 10;
    let d = start(&cfg).await;
    let mut c = node_client(&d).await;
    let me = Identity::from_seed([50; 32]);

    // Every case is observed before any is asserted, so one failure reports them all.
    let mut codes = Vec::new();
    let nonce = challenge(&mut c, &me).await;
    let mut info = node_info(&me);
    info.gpu.as_mut().expect("gpu").driver_sig = vec![0; 100 << 10];
    let r = within(
        "an oversized Register",
        c.register(register_request(&me, &nonce, &info)),
    )
    .await;
    codes.push((
        "an oversized Register",
        r.expect_err("oversized Register accepted"),
    ));

    // An oversized first session message.
    let token = register(&mut c, &me).await.session;
    let big = pb::SignedNodeMessage {
        payload: vec![0; 100 << 10],
        signature: vec![0; 64],
    };
    let s = open_stream(&mut c, big)
        .await
        .expect_err("oversized first message attached");
    codes.push(("an oversized first session message", s));

    // An oversized message on an attached session ends it.
    let (tx, inbound) = open_stream(&mut c, heartbeat(&me, &token, 1, now_ms(&d)))
        .await
        .expect("session attached");
    let mut s = Joined {
        tx,
        inbound,
        token,
        id: me,
    };
    let mut msg = heartbeat(&s.id, &s.token, 2, now_ms(&d));
    msg.payload.resize(100 << 10, 0);
    s.send(msg).await;
    let (rejects, end) = drain(&mut s.inbound).await;
    assert!(rejects.is_empty(), "{rejects:?}");
    codes.push(("an oversized message on a session", end));

    let wrong: Vec<String> = codes
        .iter()
        .filter(|(_, s)| s.code() != Code::ResourceExhausted)
        .map(|(what, s)| format!("{what}: {:?} {:?}", s.code(), s.message()))
        .collect();
    assert!(
        wrong.is_empty(),
        "not RESOURCE_EXHAUSTED:\n{}",
        wrong.join("\n")
    );
    // Both session refusals are counted.
    expect_counter(&d, &rejected("too_large"), 2.0).await;
    d.stop().await;
}

// ---------------------------------------------------------------------------------------
// 7. Rate limits
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limits_reject_then_close_and_cap_registrations() {
    let mut cfg = config();
    cfg.server.limits.messages_per_s = 1;
    cfg.server.limits.burst = 2;
    cfg.server.limits.max_violations = 3;
    cfg.server.limits.registrations_per_min = 2;
    let d = start(&cfg).await;
    let mut c = node_client(&d).await;

    let mut s = join(&d, &mut c, Identity::from_seed([60; 32]), 1).await;
    // The first message is not rate limited; the burst of 2 passes, then each message is
    // refused until the fourth refusal closes the stream. Ten are sent so that a token
    // refilled during the burst cannot change the outcome.
    for seq in 2..=11 {
        let m = heartbeat(&s.id, &s.token, seq, now_ms(&d));
        // Once the server has closed the stream, sends fail: that is the expected end.
        if within("a session send", s.tx.send(m)).await.is_err() {
            break;
        }
    }
    let (rejects, end) = drain(&mut s.inbound).await;
    assert_eq!(rejects.len(), 3, "{rejects:?}");
    for r in &rejects {
        assert_eq!(r.code, Code::ResourceExhausted as i32, "{r:?}");
        assert!(r.reason.contains("per second"), "{r:?}");
    }
    assert_eq!(end.code(), Code::ResourceExhausted, "{end:?}");
    assert!(end.message().contains("refused messages"), "{end:?}");
    expect_counter(&d, &rejected("rate_limited"), 4.0).await;

    // Challenges for a key do not spend its registration budget (anyone can ask for a
    // nonce naming any key): after three, the key still registers twice.
    let other = Identity::from_seed([61; 32]);
    for _ in 0..3 {
        challenge(&mut c, &other).await;
    }
    register(&mut c, &other).await;
    register(&mut c, &other).await;
    // The third registration of the key within a minute is refused, once its signature
    // has verified.
    let nonce = challenge(&mut c, &other).await;
    refused(
        "a third registration",
        c.register(register_request(&other, &nonce, &node_info(&other))),
        Code::ResourceExhausted,
        "per minute",
    )
    .await;
    expect_counter(&d, &rejected("rate_limited"), 5.0).await;
    d.stop().await;

    // Challenges per client address, on a fresh daemon: with a limit of 8, eight pass and
    // the ninth is refused.
    let mut cfg = config();
    cfg.server.limits.challenges_per_ip_per_min = 8;
    let d = start(&cfg).await;
    let mut c = node_client(&d).await;
    for i in 0..8u8 {
        challenge(&mut c, &Identity::from_seed([70 + i; 32])).await;
    }
    refused(
        "a ninth Challenge from one address",
        c.challenge(pb::ChallengeRequest {
            node_id: Identity::from_seed([90; 32]).node_id().0.to_vec(),
        }),
        Code::ResourceExhausted,
        "from 127.0.0.1",
    )
    .await;
    expect_counter(&d, &rejected("rate_limited"), 1.0).await;
    d.stop().await;

    // Register calls per client address, charged before the request is decoded: with a
    // limit of 3, three undecodable requests are refused as invalid, the fourth as rate
    // limited (a flood costs no NodeInfo decode and no signature check).
    let mut cfg = config();
    cfg.server.limits.registrations_per_ip_per_min = 3;
    let d = start(&cfg).await;
    let mut c = node_client(&d).await;
    let junk = || pb::RegisterRequest {
        info: vec![0xff; 64],
        nonce: vec![0; 32],
        signature: vec![0; 64],
    };
    for _ in 0..3 {
        refused(
            "an undecodable Register",
            c.register(junk()),
            Code::InvalidArgument,
            "not a NodeInfo",
        )
        .await;
    }
    refused(
        "a fourth Register from one address",
        c.register(junk()),
        Code::ResourceExhausted,
        "registrations per minute from 127.0.0.1",
    )
    .await;
    expect_counter(&d, &rejected("rate_limited"), 1.0).await;
    expect_counter(&d, &rejected("invalid"), 3.0).await;
    d.stop().await;
}

// ---------------------------------------------------------------------------------------
// 8. Re-registration of a live key
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registering_a_live_key_again_replaces_its_session_without_failing_the_node() {
    let d = start(&config()).await;
    let ch = channel(&d).await;
    let mut c = NodeServiceClient::new(ch.clone());
    let mut admin = AdminServiceClient::new(ch);
    let me = Identity::from_seed([80; 32]);

    let mut a = join(&d, &mut c, me.clone(), 1).await;
    let reg = register(&mut c, &me).await;
    assert_eq!(reg.registrations, 2);
    let (tx, inbound) = open_stream(&mut c, heartbeat(&me, &reg.session, 1, now_ms(&d)))
        .await
        .expect("session B attached");
    let mut b = Joined {
        tx,
        inbound,
        token: reg.session,
        id: me.clone(),
    };

    let (rejects, end) = drain(&mut a.inbound).await;
    assert!(rejects.is_empty(), "{rejects:?}");
    assert_eq!(end.code(), Code::Aborted, "{end:?}");
    // A's task has finished closing.
    expect_counter(&d, "hanzod_sessions_total{event=\"closed\"}", 1.0).await;

    // Heartbeats on B are accepted (1 already, then 2).
    b.heartbeat(&d, 2).await;
    b.expect_last_accepted(&d, 2).await;
    expect_counter(&d, "hanzod_heartbeats_total{outcome=\"accepted\"}", 3.0).await;

    let nodes = within("ListNodes", admin.list_nodes(pb::ListNodesRequest {}))
        .await
        .expect("ListNodes")
        .into_inner()
        .nodes;
    let mine: Vec<_> = nodes
        .iter()
        .filter(|n| n.node_id == me.node_id().0.to_vec())
        .collect();
    assert_eq!(mine.len(), 1, "{nodes:?}");
    assert!(mine[0].alive, "declared failed: {:?}", mine[0]);
    assert_eq!(mine[0].endpoint, "127.0.0.1:7000");
    expect_counter(&d, "hanzod_nodes{state=\"failed\"}", 0.0).await;
    expect_counter(&d, "hanzod_nodes{state=\"alive\"}", 1.0).await;
    d.stop().await;
}

/// A registration whose session stream never attaches is closed after
/// `first_message_timeout_ms`: the node is failed at once (not after the heartbeat timeout)
/// and no longer advertised.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_that_never_opens_its_session_is_failed() {
    let mut cfg = config();
    cfg.server.first_message_timeout_ms = 300;
    let d = start(&cfg).await;
    let mut c = node_client(&d).await;
    let me = Identity::from_seed([95; 32]);
    register(&mut c, &me).await;
    let mut admin = AdminServiceClient::new(channel(&d).await);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let n = within(
            "GetNode",
            admin.get_node(pb::GetNodeRequest {
                node_id: me.node_id().0.to_vec(),
            }),
        )
        .await
        .expect("GetNode")
        .into_inner();
        if !n.alive {
            assert_eq!(n.endpoint, "", "a failed node is not advertised: {n:?}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "still alive: {n:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Well before the 30 s heartbeat timeout: the close came from the transport.
    d.stop().await;
}

// ---------------------------------------------------------------------------------------
// 9. Admin token
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_token_guards_jobs_and_admin_but_not_nodes() {
    let mut cfg = config();
    cfg.server.admin_token = "s3cret".into();
    let d = start(&cfg).await;
    let ch = channel(&d).await;
    let mut jobs = JobServiceClient::new(ch.clone());
    let mut admin = AdminServiceClient::new(ch.clone());
    let mut c = NodeServiceClient::new(ch);

    let with = |auth: Option<&str>| {
        let mut r = Request::new(pb::ListJobsRequest {});
        if let Some(a) = auth {
            r.metadata_mut().insert(
                "authorization",
                MetadataValue::try_from(a).expect("ascii metadata"),
            );
        }
        r
    };
    refused(
        "ListJobs without a token",
        jobs.list_jobs(with(None)),
        Code::Unauthenticated,
        "Bearer",
    )
    .await;
    refused(
        "ListJobs with a wrong token",
        jobs.list_jobs(with(Some("Bearer wrong"))),
        Code::Unauthenticated,
        "wrong",
    )
    .await;
    refused(
        "ListJobs with the bare token",
        jobs.list_jobs(with(Some("s3cret"))),
        Code::Unauthenticated,
        "",
    )
    .await;
    refused(
        "ListJobs with a token prefix",
        jobs.list_jobs(with(Some("Bearer s3cre"))),
        Code::Unauthenticated,
        "",
    )
    .await;
    within("ListJobs", jobs.list_jobs(with(Some("Bearer s3cret"))))
        .await
        .expect("the right token is accepted");
    refused(
        "ListNodes without a token",
        admin.list_nodes(pb::ListNodesRequest {}),
        Code::Unauthenticated,
        "",
    )
    .await;
    let opts = ClientOptions {
        admin_token: Some("s3cret".into()),
        ..ClientOptions::default()
    };
    within(
        "ListNodes",
        admin.list_nodes(opts.request(pb::ListNodesRequest {})),
    )
    .await
    .expect("ClientOptions sends the token");

    // NodeService needs no token.
    let me = Identity::from_seed([90; 32]);
    let mut s = join(&d, &mut c, me, 1).await;
    s.expect_last_accepted(&d, 1).await;
    d.stop().await;
}

// ---------------------------------------------------------------------------------------
// 10. Health and reflection
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_reflection_are_served() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;

    let d = start(&config()).await;
    let ch = channel(&d).await;
    let mut health = HealthClient::new(ch.clone());
    for service in [
        "",
        "hanzod.v1.NodeService",
        "hanzod.v1.JobService",
        "hanzod.v1.AdminService",
    ] {
        let r = within(
            "health Check",
            health.check(HealthCheckRequest {
                service: service.into(),
            }),
        )
        .await
        .expect("health check")
        .into_inner();
        assert_eq!(r.status, ServingStatus::Serving as i32, "{service:?}");
    }
    refused(
        "health Check of an unknown service",
        health.check(HealthCheckRequest {
            service: "hanzod.v1.Nope".into(),
        }),
        Code::NotFound,
        "",
    )
    .await;

    let mut reflection = ServerReflectionClient::new(ch);
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream = within(
        "reflection",
        reflection.server_reflection_info(tokio_stream::iter(vec![req])),
    )
    .await
    .expect("reflection call")
    .into_inner();
    let first = within("a reflection answer", stream.message())
        .await
        .expect("reflection answer")
        .expect("one answer");
    let Some(MessageResponse::ListServicesResponse(list)) = first.message_response else {
        panic!("not a service list: {first:?}");
    };
    let names: Vec<&str> = list.service.iter().map(|s| s.name.as_str()).collect();
    for want in [
        "hanzod.v1.NodeService",
        "hanzod.v1.JobService",
        "hanzod.v1.AdminService",
        "grpc.health.v1.Health",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    d.stop().await;
}

// ---------------------------------------------------------------------------------------
// 11. TLS
// ---------------------------------------------------------------------------------------

/// A test CA, a server certificate for "localhost" and a client certificate, as PEM files
/// in a temporary folder (removed on drop).
struct Pki {
    dir: PathBuf,
    ca_der: Vec<u8>,
}

impl Pki {
    fn new(tag: &str) -> Pki {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
            KeyPair, KeyUsagePurpose,
        };
        let dir =
            std::env::temp_dir().join(format!("hanzod-grpc-abuse-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "hanzod test CA");
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_key = KeyPair::generate().expect("CA key");
        let ca_cert = ca.self_signed(&ca_key).expect("CA certificate");
        let issuer = Issuer::new(ca, ca_key);
        let write = |name: &str, text: String| {
            std::fs::write(dir.join(name), text).expect("write PEM");
        };
        write("ca.pem", ca_cert.pem());
        for (name, san, eku) in [
            ("server", "localhost", ExtendedKeyUsagePurpose::ServerAuth),
            ("client", "node.test", ExtendedKeyUsagePurpose::ClientAuth),
        ] {
            let mut p = CertificateParams::new(vec![san.to_string()]).expect("leaf params");
            p.distinguished_name.push(DnType::CommonName, san);
            p.extended_key_usages = vec![eku];
            p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
            p.use_authority_key_identifier_extension = true;
            let key = KeyPair::generate().expect("leaf key");
            let cert = p.signed_by(&key, &issuer).expect("leaf certificate");
            write(&format!("{name}.pem"), cert.pem());
            write(&format!("{name}.key"), key.serialize_pem());
        }
        Pki {
            ca_der: ca_cert.der().to_vec(),
            dir,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn path_str(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }

    /// A configuration serving TLS with the server certificate (and mTLS with `mutual`).
    fn config(&self, mutual: bool) -> Config {
        let mut cfg = config();
        cfg.server.tls.cert = self.path_str("server.pem");
        cfg.server.tls.key = self.path_str("server.key");
        if mutual {
            cfg.server.tls.client_ca = self.path_str("ca.pem");
        }
        cfg
    }

    /// Client options for `https://127.0.0.1:PORT`, checking the name "localhost".
    fn client(&self, d: &Daemon, with_cert: bool) -> ClientOptions {
        ClientOptions {
            endpoint: format!("https://127.0.0.1:{}", d.grpc_addr.port()),
            ca: Some(self.path("ca.pem")),
            domain: Some("localhost".into()),
            cert: with_cert.then(|| self.path("client.pem")),
            key: with_cert.then(|| self.path("client.key")),
            call_timeout_ms: 5_000,
            connect_timeout_ms: 5_000,
            ..ClientOptions::default()
        }
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Connects with `opts` and lists jobs; any failure as text.
async fn list_jobs_via(opts: &ClientOptions) -> Result<pb::ListJobsResponse, String> {
    let ch = within("connect", opts.connect())
        .await
        .map_err(|e| format!("connect: {}", error_chain(&e)))?;
    within(
        "ListJobs",
        JobServiceClient::new(ch).list_jobs(opts.request(pb::ListJobsRequest {})),
    )
    .await
    .map(Response::into_inner)
    .map_err(|s| format!("call: {s:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_serves_clients_that_trust_the_ca_and_refuses_plaintext() {
    let pki = Pki::new("tls");
    let d = start(&pki.config(false)).await;
    let opts = pki.client(&d, false);
    list_jobs_via(&opts).await.expect("TLS client with the CA");

    let plain = ClientOptions {
        endpoint: format!("http://{}", d.grpc_addr),
        call_timeout_ms: 5_000,
        connect_timeout_ms: 5_000,
        ..ClientOptions::default()
    };
    let r = list_jobs_via(&plain).await;
    assert!(r.is_err(), "a plaintext client was served: {r:?}");

    // A client that does not trust the CA (it trusts only itself, via a self-signed CA of
    // another PKI) is refused by its own verification.
    let stranger = Pki::new("tls-stranger");
    let mut untrusting = opts.clone();
    untrusting.ca = Some(stranger.path("ca.pem"));
    let r = list_jobs_via(&untrusting).await;
    assert!(r.is_err(), "a client with the wrong CA was served: {r:?}");
    // The server still serves the good client afterwards.
    list_jobs_via(&opts)
        .await
        .expect("TLS client after refusals");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_is_1_3_only() {
    use rustls::pki_types::{CertificateDer, ServerName};
    let pki = Pki::new("tls13");
    let d = start(&pki.config(false)).await;
    let handshake = |version: &'static rustls::SupportedProtocolVersion| {
        let ca = CertificateDer::from(pki.ca_der.clone());
        let addr = d.grpc_addr;
        async move {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(ca).expect("CA");
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
                .with_protocol_versions(&[version])
                .expect("protocol versions")
                .with_root_certificates(roots)
                .with_no_client_auth();
            cfg.alpn_protocols = vec![b"h2".to_vec()];
            let tcp = TcpStream::connect(addr).await.expect("tcp connect");
            let name = ServerName::try_from("localhost").expect("name");
            within(
                "a TLS handshake",
                tokio_rustls::TlsConnector::from(Arc::new(cfg)).connect(name, tcp),
            )
            .await
            .map(|tls| tls.get_ref().1.protocol_version())
        }
    };
    let r = handshake(&rustls::version::TLS12).await;
    let err = r.expect_err("a TLS 1.2-only client completed a handshake");
    let text = err.to_string();
    assert!(
        text.to_ascii_lowercase().contains("version"),
        "not refused for its version: {text}"
    );
    // Control: the same client restricted to TLS 1.3 succeeds.
    let v = handshake(&rustls::version::TLS13)
        .await
        .expect("TLS 1.3 handshake");
    assert_eq!(v, Some(rustls::ProtocolVersion::TLSv1_3));
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_requires_a_client_certificate() {
    let pki = Pki::new("mtls");
    let d = start(&pki.config(true)).await;
    let r = list_jobs_via(&pki.client(&d, false)).await;
    assert!(
        r.is_err(),
        "a client without a certificate was served: {r:?}"
    );
    // A certificate from another CA is refused too.
    let stranger = Pki::new("mtls-stranger");
    let mut foreign = pki.client(&d, true);
    foreign.cert = Some(stranger.path("client.pem"));
    foreign.key = Some(stranger.path("client.key"));
    let r = list_jobs_via(&foreign).await;
    assert!(
        r.is_err(),
        "a client with a foreign certificate was served: {r:?}"
    );
    list_jobs_via(&pki.client(&d, true))
        .await
        .expect("client with a certificate signed by the client CA");
    d.stop().await;
}

// ---------------------------------------------------------------------------------------
// 12. Random input never crashes the server
// ---------------------------------------------------------------------------------------

#[test]
fn random_bytes_get_a_status_and_the_daemon_keeps_serving() {
    use proptest::collection::vec;
    use proptest::prelude::*;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut cfg = config();
    // No limit may hide a deeper check from the random input.
    cfg.server.limits.registrations_per_min = 1_000_000;
    cfg.server.limits.messages_per_s = 1_000_000;
    cfg.server.limits.burst = 1_000_000;
    cfg.server.limits.max_violations = 1_000_000;
    let d = rt.block_on(start(&cfg));
    let mut c = rt.block_on(node_client(&d));
    // A long-lived session that receives correctly signed random payloads.
    let long =
        tokio::sync::Mutex::new(rt.block_on(join(&d, &mut c, Identity::from_seed([70; 32]), 1)));
    let seq = Cell::new(1u64);
    let client = tokio::sync::Mutex::new(c);
    let fuzzer = Identity::from_seed([71; 32]);

    let config = ProptestConfig {
        cases: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(
        info in vec(any::<u8>(), 0..600),
        nonce in vec(any::<u8>(), 0..40),
        signature in vec(any::<u8>(), 0..80),
        payload in vec(any::<u8>(), 0..600),
        probe_id in any::<u64>(),
        peer in vec(any::<u8>(), 0..40),
    )| {
        rt.block_on(async {
            let mut c = client.lock().await;
            // Random registration fields.
            let r = within(
                "Register",
                c.register(pb::RegisterRequest {
                    info: info.clone(),
                    nonce: nonce.clone(),
                    signature: signature.clone(),
                }),
            )
            .await;
            let s = r.expect_err("random registration accepted");
            assert!(
                matches!(s.code(), Code::InvalidArgument | Code::Unauthenticated),
                "random registration: {s:?}"
            );
            // A valid NodeInfo with a fresh nonce and a random signature.
            let n = challenge(&mut c, &fuzzer).await;
            let req = pb::RegisterRequest {
                signature: signature.clone(),
                ..register_request(&fuzzer, &n, &node_info(&fuzzer))
            };
            let s = within("Register", c.register(req))
                .await
                .expect_err("random signature accepted");
            // Over its 64-byte limit it is refused before the signature is checked.
            if signature.len() > hanzod_protocol::limits::SIGNATURE_BYTES {
                assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
                assert!(s.message().contains("signature"), "{s:?}");
            } else {
                assert_eq!(s.code(), Code::Unauthenticated, "{s:?}");
            }
            // A random first session message.
            let first = pb::SignedNodeMessage {
                payload: payload.clone(),
                signature: signature.clone(),
            };
            let s = open_stream(&mut c, first)
                .await
                .expect_err("random first message attached");
            assert!(
                matches!(s.code(), Code::InvalidArgument | Code::Unauthenticated),
                "random first message: {s:?}"
            );
            // Correctly signed random payloads on a live session: a Reject each, the stream
            // stays open.
            let mut long = long.lock().await;
            let env = pb::SignedNodeMessage {
                signature: long.id.sign(domain::SESSION, &[&payload]).to_vec(),
                payload: payload.clone(),
            };
            long.send(env).await;
            let r = next_reject(&mut long.inbound).await;
            assert!(
                r.code == Code::InvalidArgument as i32
                    || r.code == Code::FailedPrecondition as i32,
                "signed random payload: {r:?}"
            );
            // A probe result nobody asked for, with a random id and peer.
            seq.set(seq.get() + 1);
            let probe = sign_message(
                &long.id,
                &pb::NodeMessage {
                    session: long.token.clone(),
                    seq: seq.get(),
                    timestamp_ms: now_ms(&d),
                    body: Some(pb::node_message::Body::ProbeResult(pb::ProbeResult {
                        probe_id,
                        peer: peer.clone(),
                        mbps: 1.0,
                        ..Default::default()
                    })),
                },
            );
            long.send(probe).await;
            let r = next_reject(&mut long.inbound).await;
            assert_eq!(r.seq, seq.get(), "{r:?}");
            let want = if peer.len() == 32 {
                Code::NotFound
            } else {
                Code::InvalidArgument
            };
            assert_eq!(r.code, want as i32, "{r:?}");
        });
    });

    rt.block_on(async {
        // The long session survived, and a new node still registers and heartbeats.
        let mut long = long.into_inner();
        long.heartbeat(&d, seq.get() + 1).await;
        long.expect_last_accepted(&d, seq.get() + 1).await;
        let mut c = client.into_inner();
        let mut fresh = join(&d, &mut c, Identity::from_seed([72; 32]), 1).await;
        fresh.heartbeat(&d, 2).await;
        fresh.expect_last_accepted(&d, 2).await;
        drop((long, fresh));
        d.stop().await;
    });
}

// ---------------------------------------------------------------------------------------
// The CLI's `job watch` exit status
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn job_watch_fails_when_the_job_fails_and_names_the_reason() {
    let d = start(&config()).await;
    let opts = ClientOptions {
        endpoint: format!("http://{}", d.grpc_addr),
        ..ClientOptions::default()
    };
    // No node ever joins: the job fails when its pending deadline passes.
    let mut spec = job_spec();
    spec.pending_deadline_ms = 200;
    let mut jobs = JobServiceClient::new(channel(&d).await);
    let id = within(
        "SubmitJob",
        jobs.submit_job(pb::SubmitJobRequest { spec: Some(spec) }),
    )
    .await
    .expect("job accepted")
    .into_inner()
    .job_id;
    let mut cli = hanzod::cli::Clients::connect(opts).await.expect("connect");
    let e = within("job watch to end", cli.watch(id, true))
        .await
        .expect_err("a failed job is an error for scripts");
    assert!(e.to_string().contains("deadline"), "{e}");
    d.stop().await;
}

// ---------------------------------------------------------------------------------------
// 12. A flood of oversized, malformed registrations
// ---------------------------------------------------------------------------------------

/// Registrations signed correctly over oversized or malformed fields (a region of escape
/// sequences up to 1 MiB, an endpoint of 65..=255 bytes without a port, a region of control
/// characters) are refused
/// `INVALID_ARGUMENT` with a message that quotes at most a short escaped excerpt and the
/// length, and none of them changes the live node set. Seeded: the seed is printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_oversized_registrations_is_refused_briefly_and_admits_nobody() {
    use rand::{Rng, SeedableRng};
    let seed: u64 = rand::random();
    println!("flood seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let d = start(&config()).await;
    let ch = channel(&d).await;
    let mut c = NodeServiceClient::new(ch.clone());
    let mut admin = AdminServiceClient::new(ch);
    let live = |nodes: Vec<pb::Node>| {
        let mut ids: Vec<Vec<u8>> = nodes.into_iter().map(|n| n.node_id).collect();
        ids.sort();
        ids
    };
    register(&mut c, &Identity::from_seed([120; 32])).await;
    let before = live(
        within("ListNodes", admin.list_nodes(pb::ListNodesRequest {}))
            .await
            .expect("ListNodes")
            .into_inner()
            .nodes,
    );
    for i in 0..24u8 {
        let id = Identity::from_seed([121u8.wrapping_add(i); 32]);
        let mut info = node_info(&id);
        let len = rng.gen_range(65..(1usize << 20));
        match rng.gen_range(0..3) {
            0 => info.region = "\u{1b}[2J".repeat(len / 4 + 1),
            1 => info.endpoint = "h".repeat(len.min(255)),
            _ => {
                info.region = (0..len.min(4096))
                    .map(|k| char::from(k as u8 % 32))
                    .collect()
            }
        }
        let nonce = challenge(&mut c, &id).await;
        let status = refused(
            "an oversized registration",
            c.register(register_request(&id, &nonce, &info)),
            Code::InvalidArgument,
            "info",
        )
        .await;
        assert!(
            status.message().len() <= 256,
            "a {len}-byte field echoed in {} bytes: {:.300}",
            status.message().len(),
            status.message()
        );
        assert!(!status.message().chars().any(char::is_control));
    }
    let after = live(
        within("ListNodes", admin.list_nodes(pb::ListNodesRequest {}))
            .await
            .expect("ListNodes")
            .into_inner()
            .nodes,
    );
    assert_eq!(before, after);
    d.stop().await;
}

// ---------------------------------------------------------------------------------------
// 13. A flood of oversized and malformed requests: bounded logs, nobody admitted
// ---------------------------------------------------------------------------------------

/// What the daemon logged on the flood test's thread: bytes, events, newlines, the longest
/// event, and the text of every event at INFO and above (a bounded number: keeping them
/// costs little and names them when the bound fails).
#[derive(Debug, Default)]
struct LogTally {
    bytes: usize,
    events: usize,
    newlines: usize,
    longest: usize,
    loud: Vec<String>,
}

/// A `MakeWriter` that tallies what the fmt layer writes instead of printing it.
#[derive(Clone, Default)]
struct LogMeter(Arc<std::sync::Mutex<LogTally>>);

impl LogMeter {
    fn read<T>(&self, f: impl FnOnce(&LogTally) -> T) -> T {
        f(&self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// One event as the fmt layer writes it (it asks for a writer per event and writes the
/// formatted event whole); tallied when dropped.
struct MeteredEvent {
    meter: LogMeter,
    buf: Vec<u8>,
}

impl std::io::Write for MeteredEvent {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for MeteredEvent {
    fn drop(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        let mut t = self.meter.0.lock().unwrap_or_else(|p| p.into_inner());
        t.bytes += self.buf.len();
        t.events += 1;
        t.newlines += self.buf.iter().filter(|&&b| b == b'\n').count();
        t.longest = t.longest.max(self.buf.len());
        let text = String::from_utf8_lossy(&self.buf).into_owned();
        // "<timestamp> <LEVEL> <target>: …"
        if matches!(
            text.split_whitespace().nth(1),
            Some("INFO" | "WARN" | "ERROR")
        ) {
            t.loud.push(text);
        }
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogMeter {
    type Writer = MeteredEvent;

    fn make_writer(&'a self) -> MeteredEvent {
        MeteredEvent {
            meter: self.clone(),
            buf: Vec::new(),
        }
    }
}

/// Log bytes one refused request may cost. A refused request writes at most one line (its
/// refusal, or nothing when the throttle suppresses it; no refusal path logs at debug): a
/// timestamp (27 bytes), the level (5), the target (`hanzod_daemon::grpc::node`, 25), the
/// fields (`node`, `seq`, `reason`, `code`, `unlogged`: under 120) and the message, which
/// `convert::bounded_message` cuts to `MESSAGE_BYTES + 32` = 544 bytes: under 750, so 1 KiB.
const LOG_BYTES_PER_REQUEST: usize = 1024;

/// Longest gRPC status message or `Reject` reason a refusal may carry: the limits' errors
/// name a field and two lengths (under 80 bytes), a decode error names a message and a field
/// path (under 200).
const REFUSAL_MESSAGE_BYTES: usize = 300;

/// `len` pseudo-random bytes from `seed`.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    use rand::{RngCore, SeedableRng};
    let mut v = vec![0; len];
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

/// A refusal's message: short, without control characters.
fn assert_brief(what: &str, message: &str) {
    assert!(
        message.len() <= REFUSAL_MESSAGE_BYTES,
        "{what}: a {}-byte message: {:.400}",
        message.len(),
        message
    );
    assert!(
        !message.chars().any(char::is_control),
        "{what}: control characters in {message:?}"
    );
}

/// The issue 19 item 7 flood: oversized and malformed requests of every unauthenticated kind
/// (Challenge ids up to 1 MiB; Register info, nonce and signature up to 1 MiB; correctly
/// signed NodeInfos with a field up to 1 MiB; session first messages with oversized payloads
/// and signatures; correctly signed random payloads up to 1 MiB and oversized signatures on a
/// live session). The daemon runs on this thread's current-thread runtime, so everything it
/// logs reaches the thread-local subscriber (at debug for every hanzod crate), which counts
/// bytes and lines. Asserted: (a) at most [`LOG_BYTES_PER_REQUEST`] log bytes per request and
/// per line, one line per event, and at most (refusal reasons) × (intervals elapsed + 1)
/// lines over the flood, at INFO and above and at any level (the metric still counts every
/// refusal); (b) every refusal's message within
/// [`REFUSAL_MESSAGE_BYTES`] without control characters; (c) the live node set unchanged, the
/// live session still serving, and a fresh node registering afterwards. Seeded: the seed is
/// printed (`FLOOD_SEED=<n>` replays one).
#[test]
fn a_flood_of_oversized_requests_costs_bounded_log_bytes_and_changes_nothing() {
    use hanzod::grpc::refusal_log::DEFAULT_INTERVAL_MS;
    use hanzod_protocol::limits;
    use proptest::prelude::*;
    use proptest::test_runner::RngSeed;
    use tracing_subscriber::util::SubscriberInitExt;

    let seed: u64 = std::env::var("FLOOD_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("flood seed {seed}");
    let meter = LogMeter::default();
    // A second, silent dispatcher, installed first and kept alive (the second guard holds
    // it): with a single registered dispatcher, tracing-core computes a callsite's interest
    // from the default of whichever thread first reaches the callsite (another test's, with
    // no subscriber) and caches "never" for every thread (`Dispatchers::has_just_one`); with
    // two, from all of them, so this thread's events reach the meter.
    let _silent = tracing_subscriber::fmt()
        .with_max_level(tracing_subscriber::filter::LevelFilter::OFF)
        .with_writer(std::io::sink)
        .finish()
        .set_default();
    let _subscriber = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("hanzod=debug"))
        .with_writer(meter.clone())
        .with_ansi(false)
        .finish()
        .set_default();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut cfg = config();
    // Every request reaches the size checks: no rate limit or violation count intervenes.
    cfg.server.limits.challenges_per_ip_per_min = 1_000_000;
    cfg.server.limits.registrations_per_ip_per_min = 1_000_000;
    cfg.server.limits.messages_per_s = 1_000_000;
    cfg.server.limits.burst = 1_000_000;
    cfg.server.limits.max_violations = 1_000_000;
    let d = rt.block_on(start(&cfg));
    let ch = rt.block_on(channel(&d));
    let mut c = NodeServiceClient::new(ch.clone());
    let mut admin = AdminServiceClient::new(ch);
    let live_nodes = |admin: &mut AdminServiceClient<Channel>| {
        let nodes = rt
            .block_on(within(
                "ListNodes",
                admin.list_nodes(pb::ListNodesRequest {}),
            ))
            .expect("ListNodes")
            .into_inner()
            .nodes;
        let mut ids: Vec<(Vec<u8>, bool)> =
            nodes.into_iter().map(|n| (n.node_id, n.alive)).collect();
        ids.sort();
        ids
    };
    let long = rt.block_on(join(&d, &mut c, Identity::from_seed([130; 32]), 1));
    // Control: the daemon's lines reach the meter (else the bounds below would hold on
    // nothing).
    let registered = |meter: &LogMeter| {
        meter.read(|t| {
            t.loud
                .iter()
                .filter(|l| l.contains("hanzod_daemon::grpc::node: node registered"))
                .count()
        })
    };
    assert_eq!(
        registered(&meter),
        1,
        "{:?}",
        meter.read(|t| t.loud.clone())
    );
    let before = live_nodes(&mut admin);
    assert_eq!(before.len(), 1, "{before:?}");

    let long = tokio::sync::Mutex::new(long);
    let client = tokio::sync::Mutex::new(c);
    let fuzzer = Identity::from_seed([131; 32]);
    let requests = Cell::new(0usize);
    let refusals = Cell::new(0usize);
    let rejected_total = |samples: &HashMap<String, f64>| -> f64 {
        samples
            .iter()
            .filter(|(k, _)| k.starts_with("hanzod_rejected_messages_total{"))
            .map(|(_, v)| v)
            .sum()
    };
    let refused0 = rejected_total(&rt.block_on(scrape(&d)));
    let (bytes0, events0, loud0) = meter.read(|t| (t.bytes, t.events, t.loud.len()));
    let started_ms = now_ms(&d);
    let wall = std::time::Instant::now();

    const MIB: usize = 1 << 20;
    const CASES: u32 = 64;
    // A length: within the limit or over it, up to 1 MiB.
    let len = |limit: usize| prop_oneof![0..=limit, (limit + 1)..=MIB];
    let config = ProptestConfig {
        cases: CASES,
        failure_persistence: None,
        rng_seed: RngSeed::Fixed(seed),
        max_shrink_iters: 32,
        ..ProptestConfig::default()
    };
    proptest!(config, |(
        node_id_len in prop_oneof![0usize..limits::NODE_ID_BYTES, (limits::NODE_ID_BYTES + 1)..=MIB],
        info_len in len(limits::MAX_NODE_INFO_BYTES),
        nonce_len in len(limits::NONCE_BYTES),
        signature_len in len(limits::SIGNATURE_BYTES),
        field in 0usize..4,
        field_len in 256usize..=MIB,
        payload_len in len(limits::MAX_NODE_MESSAGE_BYTES),
        first_signature_len in len(limits::SIGNATURE_BYTES),
        live_payload_len in len(limits::MAX_NODE_MESSAGE_BYTES),
        extra_signature in 1usize..=4096,
        noise_seed in any::<u64>(),
    )| {
        rt.block_on(async {
            let mut c = client.lock().await;
            let mut long = long.lock().await;
            let bytes_before = meter.read(|t| t.bytes);
            let mut sent = 0usize;

            // Challenge with a node id that is not 32 bytes.
            sent += 1;
            let s = within(
                "Challenge",
                c.challenge(pb::ChallengeRequest {
                    node_id: noise(node_id_len, noise_seed),
                }),
            )
            .await
            .expect_err("a malformed Challenge accepted");
            assert_eq!(s.code(), Code::InvalidArgument, "Challenge: {s:?}");
            assert_brief("Challenge", s.message());

            // Register with random info, nonce and signature.
            sent += 1;
            let s = within(
                "Register",
                c.register(pb::RegisterRequest {
                    info: noise(info_len, noise_seed ^ 1),
                    nonce: noise(nonce_len, noise_seed ^ 2),
                    signature: noise(signature_len, noise_seed ^ 3),
                }),
            )
            .await
            .expect_err("a random Register accepted");
            assert!(
                matches!(s.code(), Code::InvalidArgument | Code::Unauthenticated),
                "random Register: {s:?}"
            );
            assert_brief("random Register", s.message());

            // A correctly signed NodeInfo with one field of 256 B..1 MiB (escape sequences),
            // with a fresh nonce.
            let mut info = node_info(&fuzzer);
            let junk = "\u{1b}[2J".repeat(field_len / 4 + 1);
            match field {
                0 => info.region = junk,
                1 => info.endpoint = junk,
                2 => info.gpu.as_mut().expect("gpu").model = junk,
                _ => info.gpu.as_mut().expect("gpu").driver_sig = junk.into_bytes(),
            }
            sent += 2;
            let nonce = challenge(&mut c, &fuzzer).await;
            let s = within("Register", c.register(register_request(&fuzzer, &nonce, &info)))
                .await
                .expect_err("an oversized NodeInfo accepted");
            assert_eq!(s.code(), Code::InvalidArgument, "oversized NodeInfo: {s:?}");
            assert!(s.message().contains("info"), "{s:?}");
            assert_brief("oversized NodeInfo", s.message());

            // A session's first message with a random payload and signature.
            sent += 1;
            let first = pb::SignedNodeMessage {
                payload: noise(payload_len, noise_seed ^ 4),
                signature: noise(first_signature_len, noise_seed ^ 5),
            };
            let s = open_stream(&mut c, first)
                .await
                .expect_err("a random first message attached");
            assert!(
                matches!(s.code(), Code::InvalidArgument | Code::Unauthenticated),
                "random first message: {s:?}"
            );
            assert_brief("random first message", s.message());

            // On the live session: a correctly signed random payload, then a heartbeat whose
            // signature carries extra bytes. A Reject each; the stream stays open.
            sent += 2;
            let payload = noise(live_payload_len, noise_seed ^ 6);
            let env = pb::SignedNodeMessage {
                signature: long.id.sign(domain::SESSION, &[&payload]).to_vec(),
                payload,
            };
            long.send(env).await;
            let r = next_reject(&mut long.inbound).await;
            assert!(
                r.code == Code::InvalidArgument as i32 || r.code == Code::FailedPrecondition as i32,
                "signed random payload: {r:?}"
            );
            assert_brief("signed random payload", &r.reason);
            let mut hb = heartbeat(&long.id, &long.token, 2, now_ms(&d));
            hb.signature.extend(noise(extra_signature, noise_seed ^ 7));
            long.send(hb).await;
            let r = next_reject(&mut long.inbound).await;
            assert_eq!(r.code, Code::InvalidArgument as i32, "oversized signature: {r:?}");
            assert!(r.reason.contains("signature"), "{r:?}");
            assert_brief("oversized signature", &r.reason);

            // (a) per request.
            let (written, longest, events, newlines) =
                meter.read(|t| (t.bytes - bytes_before, t.longest, t.events, t.newlines));
            assert!(
                written <= sent * LOG_BYTES_PER_REQUEST,
                "{sent} requests wrote {written} log bytes"
            );
            assert!(longest <= LOG_BYTES_PER_REQUEST, "a {longest}-byte log line");
            assert_eq!(events, newlines, "an event spanned more than one line");
            requests.set(requests.get() + sent);
            // Every request but the fresh nonce's Challenge was refused.
            refusals.set(refusals.get() + sent - 1);
        });
    });

    let elapsed_ms = now_ms(&d).saturating_sub(started_ms);
    let (written, events, loud) = meter.read(|t| {
        (
            t.bytes - bytes0,
            t.events - events0,
            t.loud[loud0..].to_vec(),
        )
    });
    let requests = requests.get();
    let samples = rt.block_on(scrape(&d));
    let reasons: Vec<&String> = samples
        .iter()
        .filter(|(k, v)| k.starts_with("hanzod_rejected_messages_total{") && **v > 0.0)
        .map(|(k, _)| k)
        .collect();
    let refused = rejected_total(&samples) - refused0;
    let intervals = elapsed_ms / DEFAULT_INTERVAL_MS + 1;
    println!(
        "flood: {requests} requests in {:?}, {refused} refusals counted, {written} log bytes ({:.1} per request) in {events} lines, {} at INFO and above, over {} reasons and {intervals} interval(s)",
        wall.elapsed(),
        written as f64 / requests.max(1) as f64,
        loud.len(),
        reasons.len(),
    );
    println!(
        "reasons: {reasons:?}; longest log line: {} bytes; lines at INFO+:\n{}",
        meter.read(|t| t.longest),
        loud.join("")
    );
    // The metric counts every refusal, logged or not.
    assert_eq!(refused, refusals.get() as f64, "refusals counted");
    // Every case sent a signature over its limit on the live session.
    assert!(
        samples.get(&rejected("too_large")).copied().unwrap_or(0.0) >= CASES as f64,
        "{samples:?}"
    );
    // (a) over the flood: the throttle's bound on lines at INFO and above, and on lines at
    // any level (no refusal is logged at debug behind the throttle's back).
    let bound = reasons.len() as u64 * intervals;
    assert!(
        loud.len() as u64 <= bound,
        "{} lines at INFO+ over {} reasons and {intervals} intervals:\n{}",
        loud.len(),
        reasons.len(),
        loud.join("")
    );
    assert!(
        events as u64 <= bound,
        "{events} lines over {} reasons and {intervals} intervals",
        reasons.len()
    );
    assert!(
        written <= requests * LOG_BYTES_PER_REQUEST,
        "{written} bytes"
    );
    // The refusals did reach the meter (the bounds above would hold for a log that lost
    // them): the first oversized request's line is there, with its reason.
    assert!(
        loud.iter()
            .any(|l| l.contains("too_large") && l.contains("refused")),
        "no refusal line was logged:\n{}",
        loud.join("")
    );

    // (c) nobody was admitted or failed; the live session still serves; a fresh node joins.
    assert_eq!(live_nodes(&mut admin), before);
    let mut long = long.into_inner();
    let mut c = client.into_inner();
    rt.block_on(async {
        long.heartbeat(&d, 2).await;
        long.expect_last_accepted(&d, 2).await;
    });
    let fresh = rt.block_on(join(&d, &mut c, Identity::from_seed([132; 32]), 1));
    assert_eq!(
        registered(&meter),
        2,
        "the fresh node's registration was not logged"
    );
    let after = live_nodes(&mut admin);
    assert_eq!(after.len(), 2, "{after:?}");
    assert!(after.iter().all(|(_, alive)| *alive), "{after:?}");
    assert!(
        before.iter().all(|n| after.contains(n)),
        "{before:?} {after:?}"
    );
    drop((long, fresh));
    rt.block_on(d.stop());
}
