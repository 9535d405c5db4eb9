//! The node side of the NodeService protocol, in one place: challenge–response
//! registration and signing session messages (DESIGN §3). The agent, the load generator
//! and tests build their messages here.

use hanzod_proto::v1 as pb;
use hanzod_proto::v1::node_service_client::NodeServiceClient;
use prost::Message;
use tonic::transport::Channel;
use tonic::Status;

use crate::client::ClientOptions;
use crate::identity::Identity;

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
    let signature = identity.sign(hanzod_proto::domain::REGISTER, &[&challenge.nonce, &info]);
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
            .sign(hanzod_proto::domain::SESSION, &[&payload])
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
