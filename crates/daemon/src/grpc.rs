//! The gRPC transport: `hanzod.v1` services over tonic (DESIGN §3, §10).
//!
//! * [`node::NodeServiceImpl`]: challenge–response registration and the signed session
//!   streams; [`sessions::GrpcNodeLink`] is the core's `NodeLink` over those streams.
//! * [`upload::DeltaUploads`]: `UploadDelta`, bounded, verified, stored, then recorded.
//! * [`jobs::JobServiceImpl`] and [`jobs::AdminServiceImpl`]: jobs, nodes and rings.
//! * [`server`]: assembles them with `grpc.health.v1`, reflection, TLS 1.3 and limits.
//! * [`convert`]: every wire ↔ domain conversion.
//!
//! Every refusal is a precise status (see [`status_of`]) and is counted in the metric
//! `rejected_messages{reason}` (delta uploads: in `deltas{outcome}`, see [`upload`]).

pub use hanzod_protocol::convert;
pub mod jobs;
pub mod node;
pub mod server;
pub mod sessions;
pub mod upload;

use hanzod_actors::actor::job::JobRequestError;
use hanzod_actors::actor::jobs::SubmitError;
use hanzod_actors::actor::registry::RegisterError;
use hanzod_actors::node::HeartbeatError;
use hanzod_actors::OrchestratorError;
use tonic::Status;

/// The gRPC status of a core error:
///
/// | error | code |
/// |---|---|
/// | orchestrator unavailable, store or chain unavailable, job restarting | `UNAVAILABLE` |
/// | malformed field, invalid job spec | `INVALID_ARGUMENT` |
/// | unknown node, unknown job | `NOT_FOUND` |
/// | stake too low, key not bound on chain | `PERMISSION_DENIED` |
/// | node declared failed, job ended or not running, wrong epoch, stale heartbeat | `FAILED_PRECONDITION` |
/// | conflicting delta | `ALREADY_EXISTS` |
pub fn status_of(e: &OrchestratorError) -> Status {
    let msg = e.to_string();
    match e {
        OrchestratorError::Unavailable(_) => Status::unavailable(msg),
        OrchestratorError::Config(_) => Status::internal(msg),
        OrchestratorError::Register(r) => match r {
            RegisterError::InsufficientStake { .. } | RegisterError::Unbound => {
                Status::permission_denied(msg)
            }
            RegisterError::UnknownNode(_) => Status::not_found(msg),
            RegisterError::ChainUnavailable(_) | RegisterError::Store(_) => {
                Status::unavailable(msg)
            }
            RegisterError::Invalid { .. } => Status::invalid_argument(msg),
        },
        OrchestratorError::Heartbeat(h) => match h {
            HeartbeatError::UnknownNode => Status::not_found(msg),
            HeartbeatError::Failed
            | HeartbeatError::StaleSequence { .. }
            | HeartbeatError::OutsideWindow { .. } => Status::failed_precondition(msg),
            HeartbeatError::Invalid { .. } => Status::invalid_argument(msg),
        },
        OrchestratorError::Submit(s) => match s {
            SubmitError::InvalidSpec(_) => Status::invalid_argument(msg),
            SubmitError::Store(_) => Status::unavailable(msg),
        },
        OrchestratorError::Job(j) => match j {
            JobRequestError::NotFound(_) | JobRequestError::NotMember(_) => Status::not_found(msg),
            JobRequestError::Restarting(_) | JobRequestError::Store(_) => Status::unavailable(msg),
            JobRequestError::Conflicting(_) => Status::already_exists(msg),
            JobRequestError::Ended(_)
            | JobRequestError::NotRunning { .. }
            | JobRequestError::WrongEpoch { .. }
            | JobRequestError::Transition(_) => Status::failed_precondition(msg),
        },
    }
}

/// True for tonic's "message too large" refusal.
pub fn is_too_large(status: &Status) -> bool {
    status.code() == tonic::Code::OutOfRange
        && status.message().contains("message length too large")
}
