//! One all-reduce round of one member over its two links.
//!
//! The member runs a *writer task* (it hashes, signs and writes pieces to the successor)
//! and a *reader loop* (it reads pieces from the predecessor, verifies them, adds or copies
//! them into `data`, and queues what the schedule forwards next). The two overlap: the next
//! piece is written while the following one is read.
//!
//! # Memory bound
//!
//! A member holds its vector (`data`, which becomes the result in place), one receive
//! buffer of at most `piece_elems` elements, and at most `max_in_flight` outgoing pieces
//! (copied out of `data`, queued for or being written by the writer): a semaphore of
//! `max_in_flight` permits is taken before a piece is copied and released after it is
//! written. Pieces due to be sent but not yet copied are kept as (step, piece) indices, not
//! bytes. [`RoundOutcome::peak_in_flight`] reports the largest number held at once.
//!
//! # Failure
//!
//! On EOF or an I/O error of a link, a missed per-piece deadline ([`deadline_for`]), a
//! refused handshake or piece, the round stops with a [`RoundError`] naming the suspected
//! peer, and the member sends a signed [`AbortNotice`] downstream naming the same suspect,
//! so members further along stop with [`RoundError::Aborted`] instead of timing out and
//! suspecting their own (innocent) predecessor. The restart (a new ring version) is the
//! orchestrator's.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ed25519_dalek::VerifyingKey;
use hanzod_actors::types::NodeId;
use hanzod_protocol::identity::{self, Identity};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use crate::links::RingLinks;
use crate::schedule::{Phase, Schedule};
use crate::wire::{
    self, AbortNotice, AbortReason, Frame, FrameError, HandshakeError, PieceError, PieceHeader,
    Role, RoundParams, SignedPiece, PIECE_FRAME_HEAD,
};

/// The per-piece deadline: `max(floor, slack × piece_bytes × 8 / (mbps × 10⁶) s)`, the time
/// the piece takes on a link of `measured_mbps` Mbit/s (the ring matrix's measurement,
/// DESIGN §4) stretched by `slack`. It bounds the wait for each next piece from the
/// predecessor and each write to the successor. The floor covers what the bandwidth term
/// does not: latency, the pipeline filling (a piece can wait for up to `n` hops before its
/// first arrival) and scheduling noise; it should be seconds on a WAN. An unknown or
/// nonsensical bandwidth (≤ 0, NaN) or slack gives the floor; the result is capped at one
/// hour.
pub fn deadline_for(piece_bytes: u64, measured_mbps: f64, slack: f64, floor: Duration) -> Duration {
    const CAP: Duration = Duration::from_secs(3600);
    let usable = |x: f64| x.is_finite() && x > 0.0;
    if !usable(measured_mbps) || !usable(slack) {
        return floor.min(CAP);
    }
    let secs = slack * (piece_bytes as f64) * 8.0 / (measured_mbps * 1e6);
    let t = Duration::try_from_secs_f64(secs).unwrap_or(CAP);
    t.max(floor).min(CAP)
}

/// A round's configuration (the same on every member, except nothing: all members must
/// agree on every field that reaches [`RoundParams`]; the handshake checks they do).
#[derive(Debug, Clone)]
pub struct RoundConfig {
    /// The job.
    pub job: u64,
    /// The epoch.
    pub epoch: u32,
    /// The ring's version; pieces of another version are refused.
    pub ring_version: u64,
    /// The ring in order: member `k` sends to member `(k + 1) mod n`.
    pub ring: Vec<NodeId>,
    /// Maximum elements (f32) per piece, the unit signed and forwarded (≥ 1).
    pub piece_elems: u32,
    /// Maximum outgoing pieces held at once (≥ 1).
    pub max_in_flight: usize,
    /// The link's measured bandwidth in Mbit/s (0 = unknown), for [`deadline_for`].
    pub link_mbps: f64,
    /// The slack factor of [`deadline_for`].
    pub deadline_slack: f64,
    /// The floor of [`deadline_for`].
    pub deadline_floor: Duration,
}

impl RoundConfig {
    /// A configuration with the defaults: 65 536-element (256 KiB) pieces, 4 in flight,
    /// unknown bandwidth, slack 4, floor 10 s.
    pub fn new(job: u64, epoch: u32, ring_version: u64, ring: Vec<NodeId>) -> RoundConfig {
        RoundConfig {
            job,
            epoch,
            ring_version,
            ring,
            piece_elems: 65_536,
            max_in_flight: 4,
            link_mbps: 0.0,
            deadline_slack: 4.0,
            deadline_floor: Duration::from_secs(10),
        }
    }

    /// The per-piece deadline of this configuration (a full piece's frame).
    pub fn piece_deadline(&self) -> Duration {
        deadline_for(
            u64::from(self.piece_elems) * 4 + PIECE_FRAME_HEAD as u64,
            self.link_mbps,
            self.deadline_slack,
            self.deadline_floor,
        )
    }
}

/// What a member has after a round.
#[derive(Debug, Clone)]
pub struct RoundOutcome {
    /// SHA-256 of the result (`data` as little-endian f32 bytes); equal on every member.
    pub result_sha256: [u8; 32],
    /// Every piece header received, with its sender's (the predecessor's) signature, in
    /// arrival order: at most `2(n − 1) × ceil(ceil(len / n) / piece_elems)` entries of 169
    /// bytes, no payloads.
    pub evidence: Vec<SignedPiece>,
    /// The predecessor that signed the evidence (`None` for a lone member).
    pub evidence_signer: Option<NodeId>,
    /// The most outgoing pieces held at once (≤ `max_in_flight`).
    pub peak_in_flight: usize,
    /// Payload bytes sent to the successor.
    pub bytes_sent: u64,
    /// Payload bytes received from the predecessor.
    pub bytes_received: u64,
}

/// Why a round failed. Every variant but [`RoundError::Config`] and
/// [`RoundError::Internal`] names a suspected member ([`RoundError::suspect`]).
#[derive(Debug, thiserror::Error)]
pub enum RoundError {
    /// The configuration or the arguments are inconsistent (nobody is suspected).
    #[error("round configuration: {0}")]
    Config(String),
    /// A neighbour failed the handshake.
    #[error("handshake with {peer:?}: {source}")]
    Handshake {
        /// The neighbour.
        peer: NodeId,
        /// Why.
        source: HandshakeError,
    },
    /// A neighbour's link closed or failed.
    #[error("link with {peer:?} lost: {detail}")]
    PeerLost {
        /// The neighbour.
        peer: NodeId,
        /// The I/O error.
        detail: String,
    },
    /// A neighbour missed the per-piece deadline.
    #[error("{peer:?} missed the per-piece deadline of {deadline:?}")]
    Timeout {
        /// The neighbour.
        peer: NodeId,
        /// The deadline.
        deadline: Duration,
    },
    /// The predecessor sent a frame that was refused.
    #[error("refused a frame from {peer:?}: {reason}")]
    BadPiece {
        /// The predecessor.
        peer: NodeId,
        /// Why.
        reason: PieceError,
    },
    /// The predecessor aborted the round (signed notice), naming `suspect`.
    #[error("{from:?} aborted the round: {suspect:?} suspected ({reason:?})")]
    Aborted {
        /// The predecessor that relayed the notice.
        from: NodeId,
        /// Whom the first member to abort suspected.
        suspect: NodeId,
        /// Why.
        reason: AbortReason,
    },
    /// A task of the round failed (a bug, not a peer).
    #[error("internal: {0}")]
    Internal(String),
}

impl RoundError {
    /// The member suspected of causing the failure.
    pub fn suspect(&self) -> Option<NodeId> {
        match self {
            RoundError::Handshake { peer, .. }
            | RoundError::PeerLost { peer, .. }
            | RoundError::Timeout { peer, .. }
            | RoundError::BadPiece { peer, .. } => Some(*peer),
            RoundError::Aborted { suspect, .. } => Some(*suspect),
            RoundError::Config(_) | RoundError::Internal(_) => None,
        }
    }

    /// The reason to put in an abort notice.
    pub fn reason(&self) -> Option<AbortReason> {
        Some(match self {
            RoundError::Handshake { .. } => AbortReason::Handshake,
            RoundError::PeerLost { .. } => AbortReason::PeerLost,
            RoundError::Timeout { .. } => AbortReason::Timeout,
            RoundError::BadPiece { .. } => AbortReason::BadPiece,
            RoundError::Aborted { reason, .. } => *reason,
            RoundError::Config(_) | RoundError::Internal(_) => return None,
        })
    }
}

/// Runs one round: on return `data` (this member's weighted input `w_i · δ_i`, the same
/// length on every member) holds `Σ w_i · δ_i` in the ring's summation order
/// (`crate::schedule`), bit-identical on every member. `links` must be `Some` for a ring
/// of two or more members (a lone member returns at once). On error `data` is partly
/// reduced and must be discarded.
pub async fn all_reduce(
    cfg: &RoundConfig,
    me: &Identity,
    links: Option<RingLinks>,
    data: &mut [f32],
) -> Result<RoundOutcome, RoundError> {
    let n = cfg.ring.len();
    let my_id = me.node_id();
    let rank = validate(cfg, &my_id)?;
    let params = RoundParams {
        job: cfg.job,
        epoch: cfg.epoch,
        ring_version: cfg.ring_version,
        total_elems: data.len() as u64,
        piece_elems: cfg.piece_elems,
        members: n as u32,
    };
    if n == 1 {
        return Ok(RoundOutcome {
            result_sha256: result_hash(data),
            evidence: Vec::new(),
            evidence_signer: None,
            peak_in_flight: 0,
            bytes_sent: 0,
            bytes_received: 0,
        });
    }
    let links = links.ok_or_else(|| RoundError::Config("a ring of 2+ needs links".into()))?;
    let succ = cfg.ring[(rank + 1) % n];
    let pred = cfg.ring[(rank + n - 1) % n];
    let deadline = cfg.piece_deadline();
    let RingLinks {
        mut send_to,
        mut recv_from,
    } = links;

    let (up, down) = tokio::join!(
        tokio::time::timeout(
            deadline,
            wire::handshake(&mut send_to, me, Role::Upstream, succ, &params)
        ),
        tokio::time::timeout(
            deadline,
            wire::handshake(&mut recv_from, me, Role::Downstream, pred, &params)
        ),
    );
    let hs = |peer: NodeId, r: Result<Result<(), HandshakeError>, _>| match r {
        Ok(Ok(())) => Ok(()),
        Ok(Err(source)) => Err(RoundError::Handshake { peer, source }),
        Err(_) => Err(RoundError::Timeout { peer, deadline }),
    };
    // The predecessor's failure is reported first: it is the one a downstream notice names.
    if let Err(e) = hs(pred, down).and(hs(succ, up)) {
        drain(recv_from, deadline);
        return Err(e);
    }
    let pred_key = identity::verifying_key(&pred)
        .map_err(|e| RoundError::Internal(format!("predecessor key after handshake: {e}")))?;

    let sched = Schedule::new(data.len(), n, cfg.piece_elems as usize);
    let sem = Arc::new(Semaphore::new(cfg.max_in_flight));
    let counters = Arc::new(InFlight::default());
    // One slot more than the permits: the abort notice always fits.
    let (tx, rx) = mpsc::channel(cfg.max_in_flight + 1);
    let writer = AbortOnDrop(tokio::spawn(writer(
        send_to,
        me.clone(),
        rx,
        deadline,
        counters.clone(),
    )));

    let mut member = Member {
        sched,
        rank,
        params,
        pred,
        pred_key,
        pending: VecDeque::new(),
        unsent: (0..n).map(|c| vec![false; sched.pieces(c)]).collect(),
        received: (0..sched.global_steps())
            .map(|g| vec![false; sched.pieces(sched.recv_chunk(rank, g))])
            .collect(),
        recvs_left: (0..sched.global_steps())
            .map(|g| sched.pieces(sched.recv_chunk(rank, g)))
            .sum(),
        evidence: Vec::new(),
        bytes_received: 0,
    };
    let first = sched.send_chunk(rank, 0);
    for p in 0..sched.pieces(first) {
        member.queue(0, p);
    }

    let result = member
        .run(
            data, recv_from, &tx, &sem, &counters, writer, succ, deadline,
        )
        .await;
    match result {
        Ok((writer, recv_from)) => {
            drop(tx);
            let sent = join_writer(writer, succ).await?;
            drop(recv_from);
            Ok(RoundOutcome {
                result_sha256: result_hash(data),
                evidence: member.evidence,
                evidence_signer: Some(pred),
                peak_in_flight: counters.peak.load(Ordering::Relaxed),
                bytes_sent: sent,
                bytes_received: member.bytes_received,
            })
        }
        Err(Failure {
            error,
            writer,
            recv_from,
        }) => {
            if let Some(recv_from) = recv_from {
                drain(recv_from, deadline);
            }
            if let (Some(writer), Some(suspect), Some(reason)) =
                (writer, error.suspect(), error.reason())
            {
                let notice = AbortNotice {
                    job: cfg.job,
                    epoch: cfg.epoch,
                    ring_version: cfg.ring_version,
                    suspect,
                    reason,
                };
                if tx.try_send(Outgoing::Abort(notice)).is_ok() {
                    drop(tx);
                    let _ = tokio::time::timeout(deadline, join_writer(writer, succ)).await;
                }
            }
            tracing::debug!(job = cfg.job, epoch = cfg.epoch, %error, "ring round aborted");
            Err(error)
        }
    }
}

fn validate(cfg: &RoundConfig, me: &NodeId) -> Result<usize, RoundError> {
    let n = cfg.ring.len();
    if n == 0 || u32::try_from(n).is_err() {
        return Err(RoundError::Config(format!("ring of {n} members")));
    }
    let mut sorted = cfg.ring.clone();
    sorted.sort();
    sorted.dedup();
    if sorted.len() != n {
        return Err(RoundError::Config(
            "a member appears twice in the ring".into(),
        ));
    }
    if cfg.piece_elems == 0 || cfg.max_in_flight == 0 {
        return Err(RoundError::Config(
            "piece_elems and max_in_flight must be ≥ 1".into(),
        ));
    }
    cfg.ring
        .iter()
        .position(|id| id == me)
        .ok_or_else(|| RoundError::Config(format!("{me:?} is not in the ring")))
}

fn result_hash(data: &[f32]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    let mut buf = Vec::with_capacity(64 * 1024);
    for block in data.chunks(16 * 1024) {
        buf.clear();
        wire::encode_f32s(block, &mut buf);
        h.update(&buf);
    }
    h.finalize().into()
}

/// Reads and discards what the predecessor still sends, for up to `grace`, in the
/// background: closing a socket with unread data makes the kernel reset the connection,
/// and the predecessor would then suspect this (innocent) member instead of learning the
/// real suspect from the abort notice travelling round the ring.
fn drain(mut stream: TcpStream, grace: Duration) {
    tokio::spawn(async move {
        let mut sink = tokio::io::sink();
        let _ = tokio::time::timeout(grace, tokio::io::copy(&mut stream, &mut sink)).await;
    });
}

#[derive(Default)]
struct InFlight {
    now: AtomicUsize,
    peak: AtomicUsize,
}

enum Outgoing {
    Piece {
        header: PieceHeader,
        frame: Vec<u8>,
        _permit: OwnedSemaphorePermit,
    },
    Abort(AbortNotice),
}

enum WriteFail {
    Io(std::io::Error),
    Timeout(Duration),
}

struct AbortOnDrop(tokio::task::JoinHandle<Result<u64, WriteFail>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn join_writer(mut w: AbortOnDrop, succ: NodeId) -> Result<u64, RoundError> {
    let r = (&mut w.0).await;
    writer_result(r, succ)
}

fn writer_result(
    r: Result<Result<u64, WriteFail>, tokio::task::JoinError>,
    succ: NodeId,
) -> Result<u64, RoundError> {
    match r {
        Ok(Ok(sent)) => Ok(sent),
        Ok(Err(WriteFail::Io(e))) => Err(RoundError::PeerLost {
            peer: succ,
            detail: e.to_string(),
        }),
        Ok(Err(WriteFail::Timeout(deadline))) => Err(RoundError::Timeout {
            peer: succ,
            deadline,
        }),
        Err(e) => Err(RoundError::Internal(format!("writer task: {e}"))),
    }
}

/// The writer task: hashes, signs and writes each queued piece, then releases its permit.
/// Writes a heartbeat ([`wire::KIND_ALIVE`]) after a quarter of the deadline with nothing to
/// send. Ends when the queue is closed (Ok: payload bytes written) or a write fails.
async fn writer(
    mut stream: TcpStream,
    me: Identity,
    mut rx: mpsc::Receiver<Outgoing>,
    deadline: Duration,
    counters: Arc<InFlight>,
) -> Result<u64, WriteFail> {
    let mut sent = 0u64;
    let beat = deadline / 4;
    loop {
        let out = match tokio::time::timeout(beat, rx.recv()).await {
            Ok(Some(out)) => out,
            Ok(None) => break,
            Err(_) => {
                write(&mut stream, &[wire::KIND_ALIVE], deadline).await?;
                continue;
            }
        };
        let payload = match out {
            Outgoing::Piece {
                header,
                mut frame,
                _permit,
            } => {
                wire::seal_piece_frame(&mut frame, header, &me);
                let r = write(&mut stream, &frame, deadline).await;
                counters.now.fetch_sub(1, Ordering::Relaxed);
                r?;
                (frame.len() - PIECE_FRAME_HEAD) as u64
            }
            Outgoing::Abort(notice) => {
                write(&mut stream, &notice.frame(&me), deadline).await?;
                0
            }
        };
        sent += payload;
    }
    let _ = tokio::time::timeout(deadline, stream.shutdown()).await;
    Ok(sent)
}

async fn write(stream: &mut TcpStream, bytes: &[u8], deadline: Duration) -> Result<(), WriteFail> {
    match tokio::time::timeout(deadline, stream.write_all(bytes)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(WriteFail::Io(e)),
        Err(_) => Err(WriteFail::Timeout(deadline)),
    }
}

/// The inbound side: the stream and the one receive buffer travel with each read, so a read
/// in progress survives the other branches of the loop's `select!`.
struct Inbound {
    stream: TcpStream,
    buf: Vec<u8>,
}

type ReadFut = Pin<Box<dyn Future<Output = (Inbound, Result<Frame, ReadFail>)> + Send>>;

enum ReadFail {
    Frame(FrameError),
    Timeout,
}

fn read_next(
    mut inb: Inbound,
    params: RoundParams,
    key: VerifyingKey,
    deadline: Duration,
) -> ReadFut {
    Box::pin(async move {
        let r = tokio::time::timeout(
            deadline,
            wire::read_frame(&mut inb.stream, &params, &key, &mut inb.buf),
        )
        .await;
        let r = match r {
            Ok(Ok(f)) => Ok(f),
            Ok(Err(e)) => Err(ReadFail::Frame(e)),
            Err(_) => Err(ReadFail::Timeout),
        };
        (inb, r)
    })
}

struct Failure {
    error: RoundError,
    /// The writer, when it is still alive (the abort notice goes through it).
    writer: Option<AbortOnDrop>,
    /// The inbound stream, when the read side is still open (to be drained).
    recv_from: Option<TcpStream>,
}

struct Member {
    sched: Schedule,
    rank: usize,
    params: RoundParams,
    pred: NodeId,
    pred_key: VerifyingKey,
    /// (global step, piece) due to be sent, not yet copied out of `data`.
    pending: VecDeque<(usize, usize)>,
    /// `unsent[chunk][piece]`: the range is queued in `pending` (it must not be overwritten).
    unsent: Vec<Vec<bool>>,
    /// `received[g][piece]`.
    received: Vec<Vec<bool>>,
    recvs_left: usize,
    evidence: Vec<SignedPiece>,
    bytes_received: u64,
}

impl Member {
    fn queue(&mut self, g: usize, p: usize) {
        let c = self.sched.send_chunk(self.rank, g);
        self.unsent[c][p] = true;
        self.pending.push_back((g, p));
    }

    #[allow(clippy::too_many_arguments)]
    async fn run(
        &mut self,
        data: &mut [f32],
        recv_from: TcpStream,
        tx: &mpsc::Sender<Outgoing>,
        sem: &Arc<Semaphore>,
        counters: &Arc<InFlight>,
        mut writer: AbortOnDrop,
        succ: NodeId,
        deadline: Duration,
    ) -> Result<(AbortOnDrop, Option<TcpStream>), Failure> {
        let inb = Inbound {
            stream: recv_from,
            buf: Vec::with_capacity(self.sched.piece_elems.min(self.sched.len.max(1)) * 4),
        };
        let mut inbound: Option<Inbound> = None;
        let mut read: ReadFut = if self.recvs_left > 0 {
            read_next(inb, self.params, self.pred_key, deadline)
        } else {
            inbound = Some(inb);
            Box::pin(std::future::pending())
        };
        while self.recvs_left > 0 || !self.pending.is_empty() {
            tokio::select! {
                biased;
                r = &mut writer.0 => {
                    // The writer ends early only on failure.
                    let error = match writer_result(r, succ) {
                        Err(e) => e,
                        Ok(_) => RoundError::Internal("writer ended early".into()),
                    };
                    // A read may be in progress: let it finish, then drain, in the
                    // background (dropping the stream would reset the predecessor's link).
                    let recv_from = inbound.take().map(|i| i.stream);
                    if recv_from.is_none() {
                        tokio::spawn(async move {
                            let (inb, _) = read.await;
                            drain(inb.stream, deadline);
                        });
                    }
                    return Err(Failure { error, writer: None, recv_from });
                }
                (inb, r) = &mut read => {
                    let handled = match r {
                        Ok(Frame::Alive) => {
                            // The predecessor is alive but waiting: restart the deadline.
                            read = read_next(inb, self.params, self.pred_key, deadline);
                            continue;
                        }
                        Ok(frame) => self.handle(frame, &inb.buf, data),
                        Err(ReadFail::Timeout) => Err(RoundError::Timeout { peer: self.pred, deadline }),
                        Err(ReadFail::Frame(FrameError::Io(e))) => Err(RoundError::PeerLost {
                            peer: self.pred,
                            detail: e.to_string(),
                        }),
                        Err(ReadFail::Frame(FrameError::Refused(reason))) => {
                            Err(RoundError::BadPiece { peer: self.pred, reason })
                        }
                    };
                    if let Err(error) = handled {
                        return Err(Failure { error, writer: Some(writer), recv_from: Some(inb.stream) });
                    }
                    if self.recvs_left > 0 {
                        read = read_next(inb, self.params, self.pred_key, deadline);
                    } else {
                        inbound = Some(inb);
                        read = Box::pin(std::future::pending());
                    }
                }
                permit = sem.clone().acquire_owned(), if !self.pending.is_empty() => {
                    let Ok(permit) = permit else {
                        return Err(Failure {
                            error: RoundError::Internal("semaphore closed".into()),
                            writer: Some(writer),
                            recv_from: inbound.take().map(|i| i.stream),
                        });
                    };
                    let out = self.materialize(data, permit, counters);
                    if tx.send(out).await.is_err() {
                        // The writer is gone; its result says why on the next turn.
                        continue;
                    }
                }
            }
        }
        Ok((writer, inbound.map(|i| i.stream)))
    }

    /// Copies the next pending piece out of `data` into a frame for the writer.
    fn materialize(
        &mut self,
        data: &[f32],
        permit: OwnedSemaphorePermit,
        counters: &InFlight,
    ) -> Outgoing {
        // Only called with a non-empty queue.
        let (g, p) = self.pending.pop_front().unwrap_or((0, 0));
        let c = self.sched.send_chunk(self.rank, g);
        self.unsent[c][p] = false;
        let range = self.sched.piece(c, p);
        let (phase, step) = self.sched.phase_of(g);
        let mut frame = Vec::with_capacity(PIECE_FRAME_HEAD + range.len() * 4);
        frame.resize(PIECE_FRAME_HEAD, 0);
        wire::encode_f32s(&data[range.clone()], &mut frame);
        let now = counters.now.fetch_add(1, Ordering::Relaxed) + 1;
        counters.peak.fetch_max(now, Ordering::Relaxed);
        Outgoing::Piece {
            header: PieceHeader {
                job: self.params.job,
                epoch: self.params.epoch,
                ring_version: self.params.ring_version,
                phase,
                step: step as u32,
                chunk: c as u32,
                offset: range.start as u64,
                len: range.len() as u32,
                payload_sha256: [0; 32],
            },
            frame,
            _permit: permit,
        }
    }

    /// Verifies a frame from the predecessor against the schedule and applies it.
    fn handle(&mut self, frame: Frame, payload: &[u8], data: &mut [f32]) -> Result<(), RoundError> {
        let bad = |reason| RoundError::BadPiece {
            peer: self.pred,
            reason,
        };
        let piece = match frame {
            Frame::Abort(n) => {
                return Err(RoundError::Aborted {
                    from: self.pred,
                    suspect: n.suspect,
                    reason: n.reason,
                })
            }
            Frame::Piece(p) => p,
            Frame::Alive => return Ok(()),
        };
        piece
            .verify_with_payload(&self.pred_key, payload)
            .map_err(bad)?;
        let h = piece.header;
        let unexpected = |what: String| bad(PieceError::Unexpected(what));
        let g = self
            .sched
            .global_step(h.phase, u64::from(h.step))
            .ok_or_else(|| unexpected(format!("{:?} step {}", h.phase, h.step)))?;
        let c = self.sched.recv_chunk(self.rank, g);
        if h.chunk as usize != c {
            return Err(unexpected(format!(
                "chunk {} at {:?} step {}, want chunk {c}",
                h.chunk, h.phase, h.step
            )));
        }
        let p = self
            .sched
            .piece_index(c, h.offset, u64::from(h.len))
            .ok_or_else(|| unexpected(format!("bounds {}+{} in chunk {c}", h.offset, h.len)))?;
        if self.received[g][p] {
            return Err(unexpected(format!(
                "duplicate piece {p} at global step {g}"
            )));
        }
        if self.unsent[c][p] {
            return Err(unexpected(format!(
                "piece {p} of chunk {c} arrived before this member forwarded it"
            )));
        }
        let range = self.sched.piece(c, p);
        match h.phase {
            Phase::ReduceScatter => wire::add_le_f32s(&mut data[range], payload),
            Phase::AllGather => wire::copy_le_f32s(&mut data[range], payload),
        }
        self.received[g][p] = true;
        self.recvs_left -= 1;
        self.bytes_received += payload.len() as u64;
        self.evidence.push(piece);
        if g + 1 < self.sched.global_steps() {
            self.queue(g + 1, p);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_rule() {
        let floor = Duration::from_millis(500);
        // 1 MB at 100 Mbit/s = 0.08 s; × 4 = 0.32 s < floor.
        assert_eq!(deadline_for(1_000_000, 100.0, 4.0, floor), floor);
        // 100 MB at 100 Mbit/s = 8 s; × 2 = 16 s.
        assert_eq!(
            deadline_for(100_000_000, 100.0, 2.0, floor),
            Duration::from_secs(16)
        );
        assert_eq!(deadline_for(1 << 30, 0.0, 4.0, floor), floor);
        assert_eq!(deadline_for(1 << 30, f64::NAN, 4.0, floor), floor);
        assert_eq!(deadline_for(1 << 30, 100.0, f64::NAN, floor), floor);
        assert_eq!(
            deadline_for(u64::MAX, 1e-300, 4.0, floor),
            Duration::from_secs(3600)
        );
    }

    #[test]
    fn errors_name_the_suspect() {
        let a = NodeId([1; 32]);
        let b = NodeId([2; 32]);
        let e = RoundError::Aborted {
            from: a,
            suspect: b,
            reason: AbortReason::Timeout,
        };
        assert_eq!(e.suspect(), Some(b));
        assert_eq!(e.reason(), Some(AbortReason::Timeout));
        assert_eq!(RoundError::Config("x".into()).suspect(), None);
    }
}
