//! The framing on a ring link (one TCP stream from a member to its successor).
//!
//! # Handshake
//!
//! Each side sends a *hello* ([`HELLO_LEN`] bytes): `MAGIC ("HZRING01") || node id (32) ||
//! nonce (32 random bytes) || job u64 || epoch u32 || ring version u64 || total elements u64 ||
//! piece elements u32 || members u32` (integers little endian). Each side checks the
//! peer's id is the ring neighbour it expects and that every round parameter equals its own
//! (a different ring version is [`HandshakeError::RingVersion`]), then sends its Ed25519
//! signature (64 bytes) over [`HANDSHAKE_DOMAIN`] `|| role || transcript`, where `role` is
//! 0 for the upstream side (the sender of pieces) and 1 for the downstream side, and the
//! transcript is `MAGIC || upstream id || downstream id || upstream nonce || downstream
//! nonce || job || epoch || ring version || total elements || piece elements || members`.
//! Fresh nonces on both sides make a recorded handshake useless on another connection.
//!
//! # Frames
//!
//! After the handshake only the upstream side writes. A frame is a kind byte then:
//!
//! * [`KIND_PIECE`]: a [`PieceHeader`] ([`PIECE_HEADER_LEN`] bytes: job u64, epoch u32,
//!   ring version u64, phase u8, step u32, chunk u32, offset u64 (element index into the
//!   vector), len u32 (elements), SHA-256 of the payload bytes), the sender's signature (64)
//!   over [`PIECE_DOMAIN`] `||` header bytes, then the payload: `len` f32, little endian.
//!   The header commits to the payload through its hash, so a header and its signature
//!   (a [`SignedPiece`]) prove what the sender sent.
//! * [`KIND_ABORT`]: an [`AbortNotice`] ([`ABORT_BODY_LEN`] bytes: job u64, epoch u32, ring
//!   version u64, suspect node id (32), reason u8) and the sender's signature over
//!   [`ABORT_DOMAIN`] `||` body: the round is over and who is suspected.
//! * [`KIND_ALIVE`]: nothing more. A heartbeat the sender writes when it has had nothing to
//!   send for a quarter of the per-piece deadline (it is itself waiting for its
//!   predecessor): it restarts the receiver's deadline, so only the member right after a
//!   silent one times out, and the others learn of it from its abort notice instead of
//!   suspecting their own live predecessor. Unsigned: it proves nothing and only delays.
//!
//! A reader checks the job, epoch and ring version and bounds `len` by the configured piece
//! size *before* reading the payload: nothing is allocated from a peer's numbers, and a
//! piece of another ring version is never read into a round.

use ed25519_dalek::VerifyingKey;
use hanzod_actors::types::NodeId;
use hanzod_protocol::identity::{self, Identity};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::schedule::Phase;

/// The first bytes of a hello.
pub const MAGIC: &[u8; 8] = b"HZRING01";
/// Signature domain of the handshake (see the crate docs on domains).
pub const HANDSHAKE_DOMAIN: &[u8] = hanzod_actors::domain::RING_HANDSHAKE;
/// Signature domain of a piece header.
pub const PIECE_DOMAIN: &[u8] = hanzod_actors::domain::RING_PIECE;
/// Signature domain of an abort notice.
pub const ABORT_DOMAIN: &[u8] = hanzod_actors::domain::RING_ABORT;
/// Bytes in a hello.
pub const HELLO_LEN: usize = 8 + 32 + 32 + 8 + 4 + 8 + 8 + 4 + 4;
/// Bytes in an encoded [`PieceHeader`].
pub const PIECE_HEADER_LEN: usize = 8 + 4 + 8 + 1 + 4 + 4 + 8 + 4 + 32;
/// Bytes in an encoded [`AbortNotice`].
pub const ABORT_BODY_LEN: usize = 8 + 4 + 8 + 32 + 1;
/// Frame kind: a piece.
pub const KIND_PIECE: u8 = 1;
/// Frame kind: an abort notice.
pub const KIND_ABORT: u8 = 2;
/// Frame kind: a heartbeat (the kind byte alone).
pub const KIND_ALIVE: u8 = 3;
/// Bytes of a piece frame before its payload: kind, header, signature.
pub const PIECE_FRAME_HEAD: usize = 1 + PIECE_HEADER_LEN + 64;

/// The parameters both ends of a link must agree on (they fix the schedule).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoundParams {
    /// The job.
    pub job: u64,
    /// The epoch.
    pub epoch: u32,
    /// The ring's version (pieces of two versions are never mixed).
    pub ring_version: u64,
    /// Elements in the reduced vector.
    pub total_elems: u64,
    /// Maximum elements per piece.
    pub piece_elems: u32,
    /// Ring members.
    pub members: u32,
}

impl RoundParams {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.job.to_le_bytes());
        out.extend_from_slice(&self.epoch.to_le_bytes());
        out.extend_from_slice(&self.ring_version.to_le_bytes());
        out.extend_from_slice(&self.total_elems.to_le_bytes());
        out.extend_from_slice(&self.piece_elems.to_le_bytes());
        out.extend_from_slice(&self.members.to_le_bytes());
    }
}

/// Which end of a link this side is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The sender of pieces (the link goes to this side's successor).
    Upstream,
    /// The receiver of pieces (the link comes from this side's predecessor).
    Downstream,
}

/// Why a handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The stream failed or closed.
    #[error("link: {0}")]
    Io(#[from] std::io::Error),
    /// The peer's hello does not start with [`MAGIC`].
    #[error("not a ring link (bad magic)")]
    BadMagic,
    /// The peer is not the expected ring neighbour.
    #[error("peer is {got:?}, expected {expected:?}")]
    UnexpectedPeer {
        /// The neighbour the ring names.
        expected: NodeId,
        /// The id the peer presented.
        got: NodeId,
    },
    /// The peer runs another ring version.
    #[error("ring version {theirs}, ours is {ours}")]
    RingVersion {
        /// This side's version.
        ours: u64,
        /// The peer's version.
        theirs: u64,
    },
    /// Another round parameter differs.
    #[error("{field} is {theirs}, ours is {ours}")]
    Mismatch {
        /// Which parameter.
        field: &'static str,
        /// This side's value.
        ours: u64,
        /// The peer's value.
        theirs: u64,
    },
    /// The peer's signature does not verify under its id (or its id is not a key).
    #[error("handshake signature: {0}")]
    BadSignature(identity::SignatureError),
}

/// Why a piece or abort frame was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PieceError {
    /// Unknown frame kind byte.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// Unknown phase code.
    #[error("unknown phase {0}")]
    UnknownPhase(u8),
    /// Unknown abort reason code.
    #[error("unknown abort reason {0}")]
    UnknownReason(u8),
    /// The frame is for another job or epoch.
    #[error("frame for job {job} epoch {epoch}, round is job {want_job} epoch {want_epoch}")]
    WrongRound {
        /// The frame's job.
        job: u64,
        /// The frame's epoch.
        epoch: u32,
        /// The round's job.
        want_job: u64,
        /// The round's epoch.
        want_epoch: u32,
    },
    /// The frame is for another ring version (refused before its payload is read).
    #[error("frame for ring version {theirs}, round is version {ours}")]
    WrongRingVersion {
        /// The round's version.
        ours: u64,
        /// The frame's version.
        theirs: u64,
    },
    /// `len` exceeds the configured piece size (refused before allocating).
    #[error("piece of {len} elements, at most {max}")]
    TooLong {
        /// The header's length.
        len: u32,
        /// The configured bound.
        max: u32,
    },
    /// The payload's SHA-256 differs from the header's.
    #[error("payload hash differs from the header's")]
    HashMismatch,
    /// The signature does not verify under the expected sender's key.
    #[error("signature: {0}")]
    BadSignature(identity::SignatureError),
    /// The piece is not one the schedule expects from this peer now (wrong step, chunk,
    /// bounds, a duplicate, or a piece whose range is still to be forwarded).
    #[error("unexpected piece: {0}")]
    Unexpected(String),
}

/// The header of a piece frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PieceHeader {
    /// The job.
    pub job: u64,
    /// The epoch.
    pub epoch: u32,
    /// The ring version.
    pub ring_version: u64,
    /// The phase.
    pub phase: Phase,
    /// The step within the phase (`0..members-1`).
    pub step: u32,
    /// The chunk (`0..members`).
    pub chunk: u32,
    /// The piece's first element, an index into the whole vector.
    pub offset: u64,
    /// Elements in the payload.
    pub len: u32,
    /// SHA-256 of the payload bytes (`len` little-endian f32).
    pub payload_sha256: [u8; 32],
}

impl PieceHeader {
    /// The [`PIECE_HEADER_LEN`] bytes (little endian).
    pub fn encode(&self) -> [u8; PIECE_HEADER_LEN] {
        let mut b = [0u8; PIECE_HEADER_LEN];
        let mut w = Cursor(&mut b, 0);
        w.put(&self.job.to_le_bytes());
        w.put(&self.epoch.to_le_bytes());
        w.put(&self.ring_version.to_le_bytes());
        w.put(&[self.phase.code()]);
        w.put(&self.step.to_le_bytes());
        w.put(&self.chunk.to_le_bytes());
        w.put(&self.offset.to_le_bytes());
        w.put(&self.len.to_le_bytes());
        w.put(&self.payload_sha256);
        b
    }

    /// Parses [`PIECE_HEADER_LEN`] bytes.
    pub fn decode(b: &[u8; PIECE_HEADER_LEN]) -> Result<PieceHeader, PieceError> {
        let mut r = Reader(b, 0);
        let job = u64::from_le_bytes(r.take());
        let epoch = u32::from_le_bytes(r.take());
        let ring_version = u64::from_le_bytes(r.take());
        let [code] = r.take::<1>();
        let phase = Phase::from_code(code).ok_or(PieceError::UnknownPhase(code))?;
        Ok(PieceHeader {
            job,
            epoch,
            ring_version,
            phase,
            step: u32::from_le_bytes(r.take()),
            chunk: u32::from_le_bytes(r.take()),
            offset: u64::from_le_bytes(r.take()),
            len: u32::from_le_bytes(r.take()),
            payload_sha256: r.take(),
        })
    }

    /// Checks job, epoch, ring version and the length bound (what is checked before the
    /// payload is read).
    pub fn check_round(&self, params: &RoundParams) -> Result<(), PieceError> {
        check_round(self.job, self.epoch, self.ring_version, params)?;
        if self.len > params.piece_elems {
            return Err(PieceError::TooLong {
                len: self.len,
                max: params.piece_elems,
            });
        }
        Ok(())
    }
}

fn check_round(job: u64, epoch: u32, version: u64, params: &RoundParams) -> Result<(), PieceError> {
    if version != params.ring_version {
        return Err(PieceError::WrongRingVersion {
            ours: params.ring_version,
            theirs: version,
        });
    }
    if job != params.job || epoch != params.epoch {
        return Err(PieceError::WrongRound {
            job,
            epoch,
            want_job: params.job,
            want_epoch: params.epoch,
        });
    }
    Ok(())
}

/// A piece header and its sender's signature: the evidence of what was received (the
/// header commits to the payload by its hash).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SignedPiece {
    /// The header.
    pub header: PieceHeader,
    /// Ed25519 over [`PIECE_DOMAIN`] `||` header bytes.
    pub signature: [u8; 64],
}

/// Bytes of a [`SignedPiece`] as evidence carries it (`RoundEvidence.pieces`, `node.proto`):
/// the encoded header then the signature.
pub const SIGNED_PIECE_LEN: usize = PIECE_HEADER_LEN + 64;

impl SignedPiece {
    /// The [`SIGNED_PIECE_LEN`] bytes: header ([`PieceHeader::encode`]) then signature.
    pub fn to_bytes(&self) -> [u8; SIGNED_PIECE_LEN] {
        let mut b = [0u8; SIGNED_PIECE_LEN];
        b[..PIECE_HEADER_LEN].copy_from_slice(&self.header.encode());
        b[PIECE_HEADER_LEN..].copy_from_slice(&self.signature);
        b
    }

    /// Parses [`SignedPiece::to_bytes`]'s form; the signature is not checked here.
    ///
    /// Errors: [`PieceError::Unexpected`] when `b` is not [`SIGNED_PIECE_LEN`] bytes,
    /// [`PieceError::UnknownPhase`] for an unknown phase code.
    pub fn from_bytes(b: &[u8]) -> Result<SignedPiece, PieceError> {
        if b.len() != SIGNED_PIECE_LEN {
            return Err(PieceError::Unexpected(format!(
                "signed piece of {} bytes, not {SIGNED_PIECE_LEN}",
                b.len()
            )));
        }
        let (h, sig) = b.split_at(PIECE_HEADER_LEN);
        Ok(SignedPiece {
            header: PieceHeader::decode(h.try_into().expect("split at the header length"))?,
            signature: sig.try_into().expect("the rest is 64 bytes"),
        })
    }

    /// Signs `header` with `key`.
    pub fn sign(header: PieceHeader, key: &Identity) -> SignedPiece {
        let signature = key.sign(PIECE_DOMAIN, &[&header.encode()]);
        SignedPiece { header, signature }
    }

    /// Verifies the signature under `sender`.
    pub fn verify(&self, sender: &VerifyingKey) -> Result<(), PieceError> {
        identity::verify(
            sender,
            PIECE_DOMAIN,
            &[&self.header.encode()],
            &self.signature,
        )
        .map_err(PieceError::BadSignature)
    }

    /// Verifies the signature under `sender` and that `payload` hashes to the header's hash.
    pub fn verify_with_payload(
        &self,
        sender: &VerifyingKey,
        payload: &[u8],
    ) -> Result<(), PieceError> {
        self.verify(sender)?;
        if sha256(payload) != self.header.payload_sha256 {
            return Err(PieceError::HashMismatch);
        }
        Ok(())
    }
}

/// Why a member gave up a round (the code in an [`AbortNotice`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AbortReason {
    /// The suspect's connection closed or failed.
    PeerLost = 1,
    /// The suspect missed the per-piece deadline.
    Timeout = 2,
    /// The suspect sent a piece that was refused.
    BadPiece = 3,
    /// The suspect failed the handshake.
    Handshake = 4,
}

impl AbortReason {
    /// The reason of a wire code.
    pub fn from_code(code: u8) -> Option<AbortReason> {
        Some(match code {
            1 => AbortReason::PeerLost,
            2 => AbortReason::Timeout,
            3 => AbortReason::BadPiece,
            4 => AbortReason::Handshake,
            _ => return None,
        })
    }
}

/// A signed "this round is over" passed downstream, naming the member suspected first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbortNotice {
    /// The job.
    pub job: u64,
    /// The epoch.
    pub epoch: u32,
    /// The ring version.
    pub ring_version: u64,
    /// The member suspected by whoever aborted first.
    pub suspect: NodeId,
    /// Why.
    pub reason: AbortReason,
}

impl AbortNotice {
    /// The [`ABORT_BODY_LEN`] bytes.
    pub fn encode(&self) -> [u8; ABORT_BODY_LEN] {
        let mut b = [0u8; ABORT_BODY_LEN];
        let mut w = Cursor(&mut b, 0);
        w.put(&self.job.to_le_bytes());
        w.put(&self.epoch.to_le_bytes());
        w.put(&self.ring_version.to_le_bytes());
        w.put(self.suspect.as_bytes());
        w.put(&[self.reason as u8]);
        b
    }

    /// Parses [`ABORT_BODY_LEN`] bytes.
    pub fn decode(b: &[u8; ABORT_BODY_LEN]) -> Result<AbortNotice, PieceError> {
        let mut r = Reader(b, 0);
        let job = u64::from_le_bytes(r.take());
        let epoch = u32::from_le_bytes(r.take());
        let ring_version = u64::from_le_bytes(r.take());
        let suspect = NodeId(r.take());
        let [code] = r.take::<1>();
        Ok(AbortNotice {
            job,
            epoch,
            ring_version,
            suspect,
            reason: AbortReason::from_code(code).ok_or(PieceError::UnknownReason(code))?,
        })
    }

    /// The whole frame (kind, body, signature) signed by `key`.
    pub fn frame(&self, key: &Identity) -> Vec<u8> {
        let body = self.encode();
        let sig = key.sign(ABORT_DOMAIN, &[&body]);
        let mut f = Vec::with_capacity(1 + ABORT_BODY_LEN + 64);
        f.push(KIND_ABORT);
        f.extend_from_slice(&body);
        f.extend_from_slice(&sig);
        f
    }
}

/// A frame read from a link. A piece's payload is left in the caller's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame {
    /// A piece (header checked against the round, payload read but not yet verified).
    Piece(SignedPiece),
    /// A verified abort notice.
    Abort(AbortNotice),
    /// A heartbeat.
    Alive,
}

/// Why reading a frame failed.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The stream failed or was closed (EOF included).
    #[error("link: {0}")]
    Io(#[from] std::io::Error),
    /// The frame was refused.
    #[error(transparent)]
    Refused(#[from] PieceError),
}

/// SHA-256 of `bytes`.
pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// Appends `values` as little-endian f32 bytes.
pub fn encode_f32s(values: &[f32], out: &mut Vec<u8>) {
    out.reserve(values.len() * 4);
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// Adds little-endian f32 `bytes` into `dst` (`dst[j] = dst[j] + x[j]`, the ring's order).
pub fn add_le_f32s(dst: &mut [f32], bytes: &[u8]) {
    for (d, b) in dst.iter_mut().zip(bytes.chunks_exact(4)) {
        *d += f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

/// Overwrites `dst` with little-endian f32 `bytes`.
pub fn copy_le_f32s(dst: &mut [f32], bytes: &[u8]) {
    for (d, b) in dst.iter_mut().zip(bytes.chunks_exact(4)) {
        *d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

/// Fills the first [`PIECE_FRAME_HEAD`] bytes of `frame` (whose remaining bytes are the
/// payload) with the kind, the header (its hash computed here) and `key`'s signature, and
/// returns the signed header. `frame` must be at least [`PIECE_FRAME_HEAD`] long.
pub fn seal_piece_frame(frame: &mut [u8], mut header: PieceHeader, key: &Identity) -> SignedPiece {
    let (head, payload) = frame.split_at_mut(PIECE_FRAME_HEAD);
    header.payload_sha256 = sha256(payload);
    let signed = SignedPiece::sign(header, key);
    head[0] = KIND_PIECE;
    head[1..1 + PIECE_HEADER_LEN].copy_from_slice(&signed.header.encode());
    head[1 + PIECE_HEADER_LEN..].copy_from_slice(&signed.signature);
    signed
}

/// A whole piece frame for `values` (tests and tools; the round builds frames in place).
pub fn piece_frame(header: PieceHeader, values: &[f32], key: &Identity) -> Vec<u8> {
    let mut f = vec![0u8; PIECE_FRAME_HEAD];
    encode_f32s(values, &mut f);
    seal_piece_frame(&mut f, header, key);
    f
}

/// Reads one frame. The piece header is checked against `params` (job, epoch, ring version,
/// `len ≤ piece_elems`) before the payload is read into `payload` (resized to the payload's
/// bytes); the piece's signature and hash are *not* checked here
/// ([`SignedPiece::verify_with_payload`]). An abort notice is verified under `sender`.
pub async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    params: &RoundParams,
    sender: &VerifyingKey,
    payload: &mut Vec<u8>,
) -> Result<Frame, FrameError> {
    let kind = r.read_u8().await?;
    match kind {
        KIND_PIECE => {
            let mut hb = [0u8; PIECE_HEADER_LEN];
            r.read_exact(&mut hb).await?;
            let header = PieceHeader::decode(&hb)?;
            header.check_round(params)?;
            let mut signature = [0u8; 64];
            r.read_exact(&mut signature).await?;
            // Bounded by piece_elems (checked above).
            payload.resize(header.len as usize * 4, 0);
            r.read_exact(payload).await?;
            Ok(Frame::Piece(SignedPiece { header, signature }))
        }
        KIND_ABORT => {
            let mut body = [0u8; ABORT_BODY_LEN];
            r.read_exact(&mut body).await?;
            let mut sig = [0u8; 64];
            r.read_exact(&mut sig).await?;
            let notice = AbortNotice::decode(&body)?;
            check_round(notice.job, notice.epoch, notice.ring_version, params)?;
            identity::verify(sender, ABORT_DOMAIN, &[&body], &sig)
                .map_err(PieceError::BadSignature)?;
            Ok(Frame::Abort(notice))
        }
        KIND_ALIVE => Ok(Frame::Alive),
        k => Err(PieceError::UnknownKind(k).into()),
    }
}

/// Runs the handshake on `stream` as `role`, expecting the peer `expected` and the same
/// `params` (module docs). Returns once both sides have proved their keys.
pub async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    me: &Identity,
    role: Role,
    expected: NodeId,
    params: &RoundParams,
) -> Result<(), HandshakeError> {
    let my_id = me.node_id();
    let my_nonce: [u8; 32] = rand::random();
    let mut hello = Vec::with_capacity(HELLO_LEN);
    hello.extend_from_slice(MAGIC);
    hello.extend_from_slice(my_id.as_bytes());
    hello.extend_from_slice(&my_nonce);
    params.encode(&mut hello);
    stream.write_all(&hello).await?;
    stream.flush().await?;

    let mut theirs = [0u8; HELLO_LEN];
    stream.read_exact(&mut theirs).await?;
    let mut r = Reader(&theirs, 0);
    if &r.take::<8>() != MAGIC {
        return Err(HandshakeError::BadMagic);
    }
    let peer = NodeId(r.take());
    let peer_nonce: [u8; 32] = r.take();
    if peer != expected {
        return Err(HandshakeError::UnexpectedPeer {
            expected,
            got: peer,
        });
    }
    let job = u64::from_le_bytes(r.take());
    let epoch = u32::from_le_bytes(r.take());
    let version = u64::from_le_bytes(r.take());
    let total = u64::from_le_bytes(r.take());
    let piece = u32::from_le_bytes(r.take());
    let members = u32::from_le_bytes(r.take());
    if version != params.ring_version {
        return Err(HandshakeError::RingVersion {
            ours: params.ring_version,
            theirs: version,
        });
    }
    for (field, ours, theirs) in [
        ("job", params.job, job),
        ("epoch", u64::from(params.epoch), u64::from(epoch)),
        ("total elements", params.total_elems, total),
        (
            "piece elements",
            u64::from(params.piece_elems),
            u64::from(piece),
        ),
        ("members", u64::from(params.members), u64::from(members)),
    ] {
        if ours != theirs {
            return Err(HandshakeError::Mismatch {
                field,
                ours,
                theirs,
            });
        }
    }

    let (up, down, up_nonce, down_nonce) = match role {
        Role::Upstream => (my_id, peer, my_nonce, peer_nonce),
        Role::Downstream => (peer, my_id, peer_nonce, my_nonce),
    };
    let mut transcript = Vec::with_capacity(HELLO_LEN + 32);
    transcript.extend_from_slice(MAGIC);
    transcript.extend_from_slice(up.as_bytes());
    transcript.extend_from_slice(down.as_bytes());
    transcript.extend_from_slice(&up_nonce);
    transcript.extend_from_slice(&down_nonce);
    params.encode(&mut transcript);
    let (my_role, peer_role) = match role {
        Role::Upstream => (0u8, 1u8),
        Role::Downstream => (1u8, 0u8),
    };
    let sig = me.sign(HANDSHAKE_DOMAIN, &[&[my_role], &transcript]);
    stream.write_all(&sig).await?;
    stream.flush().await?;
    let mut peer_sig = [0u8; 64];
    stream.read_exact(&mut peer_sig).await?;
    let key = identity::verifying_key(&peer).map_err(HandshakeError::BadSignature)?;
    identity::verify(
        &key,
        HANDSHAKE_DOMAIN,
        &[&[peer_role], &transcript],
        &peer_sig,
    )
    .map_err(HandshakeError::BadSignature)
}

struct Cursor<'a>(&'a mut [u8], usize);

impl Cursor<'_> {
    fn put(&mut self, b: &[u8]) {
        self.0[self.1..self.1 + b.len()].copy_from_slice(b);
        self.1 += b.len();
    }
}

struct Reader<'a>(&'a [u8], usize);

impl Reader<'_> {
    /// Takes the next `N` bytes; callers size their buffers so this never runs past the end.
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        out.copy_from_slice(&self.0[self.1..self.1 + N]);
        self.1 += N;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> RoundParams {
        RoundParams {
            job: 7,
            epoch: 3,
            ring_version: 2,
            total_elems: 100,
            piece_elems: 8,
            members: 2,
        }
    }

    fn header(len: u32) -> PieceHeader {
        PieceHeader {
            job: 7,
            epoch: 3,
            ring_version: 2,
            phase: Phase::AllGather,
            step: 1,
            chunk: 1,
            offset: 50,
            len,
            payload_sha256: [0; 32],
        }
    }

    #[test]
    fn header_and_abort_round_trip() {
        let h = header(5);
        assert_eq!(PieceHeader::decode(&h.encode()).unwrap(), h);
        let mut bad = h.encode();
        bad[20] = 9;
        assert_eq!(PieceHeader::decode(&bad), Err(PieceError::UnknownPhase(9)));
        let a = AbortNotice {
            job: 1,
            epoch: 2,
            ring_version: 3,
            suspect: NodeId([5; 32]),
            reason: AbortReason::Timeout,
        };
        assert_eq!(AbortNotice::decode(&a.encode()).unwrap(), a);
    }

    #[tokio::test]
    async fn frames_are_checked_before_the_payload_is_read() {
        let key = Identity::from_seed([1; 32]);
        let vk = identity::verifying_key(&key.node_id()).unwrap();
        let mut buf = Vec::new();

        let f = piece_frame(header(3), &[1.0, 2.0, 3.0], &key);
        let Frame::Piece(p) = read_frame(&mut &f[..], &params(), &vk, &mut buf)
            .await
            .unwrap()
        else {
            panic!("want a piece")
        };
        p.verify_with_payload(&vk, &buf).unwrap();

        // Too long: refused from the header alone (the frame has no payload at all).
        let mut long = header(9);
        long.len = 9;
        let f = piece_frame(long, &[], &key);
        let e = read_frame(&mut &f[..], &params(), &vk, &mut buf).await;
        assert!(matches!(
            e,
            Err(FrameError::Refused(PieceError::TooLong { len: 9, max: 8 }))
        ));
        // A length near u32::MAX never allocates.
        let mut huge = header(3);
        huge.len = u32::MAX;
        let f = piece_frame(huge, &[], &key);
        let e = read_frame(&mut &f[..], &params(), &vk, &mut buf).await;
        assert!(matches!(
            e,
            Err(FrameError::Refused(PieceError::TooLong { .. }))
        ));

        let mut other = header(3);
        other.ring_version = 3;
        let f = piece_frame(other, &[1.0, 2.0, 3.0], &key);
        let e = read_frame(&mut &f[..], &params(), &vk, &mut buf).await;
        assert!(matches!(
            e,
            Err(FrameError::Refused(PieceError::WrongRingVersion {
                ours: 2,
                theirs: 3
            }))
        ));

        let e = read_frame(&mut &[9u8][..], &params(), &vk, &mut buf).await;
        assert!(matches!(
            e,
            Err(FrameError::Refused(PieceError::UnknownKind(9)))
        ));
        let e = read_frame(&mut &[KIND_PIECE, 1, 2][..], &params(), &vk, &mut buf).await;
        assert!(matches!(e, Err(FrameError::Io(_))));
    }

    #[test]
    fn tampered_payload_and_wrong_signer_are_refused() {
        let key = Identity::from_seed([1; 32]);
        let other = Identity::from_seed([2; 32]);
        let vk = identity::verifying_key(&key.node_id()).unwrap();
        let mut f = piece_frame(header(2), &[1.0, 2.0], &key);
        let hb: [u8; PIECE_HEADER_LEN] = f[1..1 + PIECE_HEADER_LEN].try_into().unwrap();
        let sp = SignedPiece {
            header: PieceHeader::decode(&hb).unwrap(),
            signature: f[1 + PIECE_HEADER_LEN..PIECE_FRAME_HEAD]
                .try_into()
                .unwrap(),
        };
        sp.verify_with_payload(&vk, &f[PIECE_FRAME_HEAD..]).unwrap();
        f[PIECE_FRAME_HEAD] ^= 1;
        assert_eq!(
            sp.verify_with_payload(&vk, &f[PIECE_FRAME_HEAD..]),
            Err(PieceError::HashMismatch)
        );
        let forged = SignedPiece::sign(sp.header, &other);
        assert!(matches!(
            forged.verify(&vk),
            Err(PieceError::BadSignature(_))
        ));
    }

    #[tokio::test]
    async fn handshake_proves_both_keys_and_refuses_strangers() {
        let a = Identity::from_seed([1; 32]);
        let b = Identity::from_seed([2; 32]);
        let c = Identity::from_seed([3; 32]);
        let p = params();

        let (mut x, mut y) = tokio::io::duplex(4096);
        let (ra, rb) = tokio::join!(
            handshake(&mut x, &a, Role::Upstream, b.node_id(), &p),
            handshake(&mut y, &b, Role::Downstream, a.node_id(), &p)
        );
        ra.unwrap();
        rb.unwrap();

        // c pretends to be b's predecessor a.
        let (mut x, mut y) = tokio::io::duplex(4096);
        let (_, rb) = tokio::join!(
            // c waits for b's signature, which never comes: bound its wait.
            tokio::time::timeout(
                std::time::Duration::from_millis(200),
                handshake(&mut x, &c, Role::Upstream, b.node_id(), &p)
            ),
            handshake(&mut y, &b, Role::Downstream, a.node_id(), &p)
        );
        assert!(
            matches!(rb, Err(HandshakeError::UnexpectedPeer { got, .. }) if got == c.node_id())
        );

        // Another ring version.
        let mut q = p;
        q.ring_version = 5;
        let (mut x, mut y) = tokio::io::duplex(4096);
        let (_, rb) = tokio::join!(
            handshake(&mut x, &a, Role::Upstream, b.node_id(), &q),
            handshake(&mut y, &b, Role::Downstream, a.node_id(), &p)
        );
        assert!(matches!(
            rb,
            Err(HandshakeError::RingVersion { ours: 2, theirs: 5 })
        ));

        // A hello claiming a's id, but the signature is not a's (c signs).
        let (mut x, mut y) = tokio::io::duplex(4096);
        let impostor = async {
            let mut hello = Vec::new();
            hello.extend_from_slice(MAGIC);
            hello.extend_from_slice(a.node_id().as_bytes());
            hello.extend_from_slice(&[0; 32]);
            p.encode(&mut hello);
            x.write_all(&hello).await.unwrap();
            let mut theirs = [0u8; HELLO_LEN];
            x.read_exact(&mut theirs).await.unwrap();
            x.write_all(&c.sign(HANDSHAKE_DOMAIN, &[b"anything"]))
                .await
                .unwrap();
            let mut sig = [0u8; 64];
            let _ = x.read_exact(&mut sig).await;
        };
        let (_, rb) = tokio::join!(
            impostor,
            handshake(&mut y, &b, Role::Downstream, a.node_id(), &p)
        );
        assert!(matches!(rb, Err(HandshakeError::BadSignature(_))));
    }
}
