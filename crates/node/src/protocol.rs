//! The node side of the NodeService protocol, in one place: challenge–response
//! registration, signing session messages (DESIGN §3) and uploading deltas (DESIGN §6).
//! The agent, the load generator and tests build their messages here.

use std::sync::Arc;

use hanzod_proto::v1 as pb;
use hanzod_proto::v1::node_service_client::NodeServiceClient;
use prost::Message;
use tonic::transport::Channel;
use tonic::Status;

use hanzod_protocol::client::ClientOptions;
use hanzod_protocol::hzdl::{payload_hash, sign_statement, Statement};
use hanzod_protocol::identity::Identity;

/// Registers `info` (whose `node_id` must be `identity`'s): asks for a nonce, signs
/// `"hanzod.v1.register" || nonce || info bytes`, and sends the registration.
///
/// Errors: the daemon's status (`UNAUTHENTICATED`, `INVALID_ARGUMENT`, `PERMISSION_DENIED`,
/// `RESOURCE_EXHAUSTED`, `UNAVAILABLE`, …) or a transport failure.
pub async fn register(
    client: &mut NodeServiceClient<Channel>,
    opts: &ClientOptions,
    identity: &Identity,
    info: &pb::NodeInfo,
) -> Result<pb::RegisterResponse, Status> {
    let challenge = client
        .challenge(opts.request(pb::ChallengeRequest {
            node_id: identity.node_id().0.to_vec(),
        }))
        .await?
        .into_inner();
    let info = info.encode_to_vec();
    let signature = identity.sign(hanzod_actors::domain::REGISTER, &[&challenge.nonce, &info]);
    Ok(client
        .register(opts.request(pb::RegisterRequest {
            info,
            nonce: challenge.nonce,
            signature: signature.to_vec(),
        }))
        .await?
        .into_inner())
}

/// Numbers, stamps and signs one session's messages: sequence numbers 1, 2, … and
/// signatures over `"hanzod.v1.session" || payload`.
#[derive(Debug, Clone)]
pub struct SessionSigner {
    identity: Identity,
    session: Vec<u8>,
    seq: u64,
}

impl SessionSigner {
    /// A signer for the session token `session` (from `RegisterResponse.session`).
    pub fn new(identity: Identity, session: Vec<u8>) -> SessionSigner {
        SessionSigner {
            identity,
            session,
            seq: 0,
        }
    }

    /// The next message: `body` stamped `timestamp_ms` (ms since the Unix epoch).
    pub fn sign(
        &mut self,
        timestamp_ms: u64,
        body: pb::node_message::Body,
    ) -> pb::SignedNodeMessage {
        self.seq += 1;
        let payload = pb::NodeMessage {
            session: self.session.clone(),
            seq: self.seq,
            timestamp_ms,
            body: Some(body),
        }
        .encode_to_vec();
        let signature = self
            .identity
            .sign(hanzod_actors::domain::SESSION, &[&payload])
            .to_vec();
        pb::SignedNodeMessage { payload, signature }
    }

    /// The sequence number of the last message signed (0 before the first).
    pub fn seq(&self) -> u64 {
        self.seq
    }
}

/// An empty heartbeat body (utilisation, memory and step at 0).
pub fn heartbeat() -> pb::node_message::Body {
    pb::node_message::Body::Heartbeat(pb::Heartbeat::default())
}

/// The header and the signed trailer of an upload of `payload` (an HZDL delta) for `job`'s
/// epoch `epoch` on the session `session`, stating `step` (the global step the node's
/// local run of this epoch started at, `epoch × local_steps`) and `claimed_loss` (the loss
/// of the pre-delta weights, the epoch's checkpoint, on that step's batch; see
/// `DeltaHeader` in `node.proto`): the trailer carries SHA-256(`payload`) and `identity`'s
/// Ed25519 signature over the DESIGN §6 statement (job, epoch, step, claimed loss, that
/// hash).
pub fn delta_upload_parts(
    session: &[u8],
    identity: &Identity,
    statement: &Statement,
    payload: &[u8],
) -> (pb::DeltaHeader, pb::DeltaTrailer) {
    let hash = payload_hash(payload);
    let signature = sign_statement(identity, statement, &hash);
    (
        pb::DeltaHeader {
            session: session.to_vec(),
            job_id: statement.job,
            epoch: statement.epoch,
            step: statement.step,
            claimed_loss: statement.claimed_loss,
            total_bytes: payload.len() as u64,
            kind: pb::DeltaKind::Delta as i32,
        },
        pb::DeltaTrailer {
            sha256: hash.to_vec(),
            signature: signature.to_vec(),
        },
    )
}

/// The chunks of an upload, in order: `header`, `payload` in data chunks of at most
/// `chunk_bytes` bytes (at least 1), then `trailer`. Lazy: each data chunk is copied out of
/// `payload` when the transport asks for it.
pub fn delta_chunks(
    header: pb::DeltaHeader,
    payload: Arc<[u8]>,
    trailer: pb::DeltaTrailer,
    chunk_bytes: usize,
) -> impl tokio_stream::Stream<Item = pb::DeltaChunk> + Send + 'static {
    use pb::delta_chunk::Part;
    let head = tokio_stream::once(Part::Header(header));
    let data = tokio_stream::iter(hanzod_protocol::status::byte_chunks(payload, chunk_bytes))
        .map(Part::Data);
    let tail = tokio_stream::once(Part::Trailer(trailer));
    use tokio_stream::StreamExt;
    head.chain(data)
        .chain(tail)
        .map(|part| pb::DeltaChunk { part: Some(part) })
}

/// Uploads one delta (DESIGN §6): signs the statement for (`job`, `epoch`, `step`,
/// `claimed_loss`, SHA-256(`payload`)) with `identity`, and streams the header, `payload`
/// in chunks of `chunk_bytes` (`RegisterResponse.delta_chunk_bytes`), and the trailer, on
/// the session `session` (`RegisterResponse.session`).
///
/// `step` is the global step the node's local run of this epoch started at (`epoch ×` the
/// job's `local_steps`; any other is refused `INVALID_ARGUMENT`), and `claimed_loss` the
/// loss of the pre-delta weights (the epoch's checkpoint) on that step's batch, as in
/// `DeltaHeader` in `node.proto`.
///
/// Returns the daemon's ack once the delta passed the format check and is stored and
/// recorded: accepted for the epoch's merge (it is validated at aggregation). Errors: the
/// daemon's status (see `UploadDelta` in `node.proto`: `UNAUTHENTICATED`,
/// `INVALID_ARGUMENT`, `RESOURCE_EXHAUSTED`, `FAILED_PRECONDITION`, `PERMISSION_DENIED`,
/// `ALREADY_EXISTS`, `DATA_LOSS`, `DEADLINE_EXCEEDED`, `UNAVAILABLE`, …) or a transport
/// failure. `ALREADY_EXISTS` at the header means this node's delta for the epoch was
/// already recorded (a retry after a lost ack): its message names the delivered hash,
/// which the caller compares with SHA-256(`payload`) to treat the delta as delivered.
#[allow(clippy::too_many_arguments)]
pub async fn upload_delta(
    client: &mut NodeServiceClient<Channel>,
    session: &[u8],
    identity: &Identity,
    job: u64,
    epoch: u32,
    step: u64,
    claimed_loss: f64,
    payload: &[u8],
    chunk_bytes: usize,
) -> Result<pb::DeltaAck, Status> {
    let statement = Statement {
        job,
        epoch,
        step,
        claimed_loss,
    };
    let (header, trailer) = delta_upload_parts(session, identity, &statement, payload);
    let chunks = delta_chunks(header, Arc::from(payload), trailer, chunk_bytes);
    Ok(client.upload_delta(chunks).await?.into_inner())
}
