//! The gRPC transport: `hanzod.v1` services over tonic (DESIGN §3, §10).
//!
//! * [`node::NodeServiceImpl`]: challenge–response registration and the signed session
//!   streams; [`sessions::GrpcNodeLink`] is the core's `NodeLink` over those streams.
//! * [`upload::DeltaUploads`]: `UploadDelta`, bounded, verified, stored, then recorded.
//! * [`jobs::JobServiceImpl`] and [`jobs::AdminServiceImpl`]: jobs, nodes and rings;
//!   [`admission`]: SubmitJob's validation budget and `training.base` checks.
//! * [`server`]: assembles them with `grpc.health.v1`, reflection, TLS 1.3 and limits.
//! * [`convert`]: every wire ↔ domain conversion.
//!
//! Every refusal is a precise status (see [`status_of`]) and is counted in the metric
//! `rejected_messages{reason}` (delta uploads: in `deltas{outcome}`, see [`upload`]). The
//! refusals of registration, uploads and ring calls are logged at most once per reason per
//! interval, with the count of those not logged ([`refusal_log`]); session refusals are
//! logged at debug level.

pub use hanzod_protocol::convert;
pub mod admission;
pub mod jobs;
pub mod node;
pub mod refusal_log;
pub mod server;
pub mod sessions;
pub mod upload;

use hanzod_actors::actor::job::JobRequestError;
use hanzod_actors::actor::jobs::SubmitError;
use hanzod_actors::actor::registry::RegisterError;
use hanzod_actors::node::HeartbeatError;
use hanzod_actors::{OrchestratorError, OrchestratorHandle};
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
            | JobRequestError::NotRing(_)
            | JobRequestError::RoundStep { .. }
            | JobRequestError::Transition(_) => Status::failed_precondition(msg),
        },
    }
}

/// Why job `id` is not found, in the operator's words (`hanzod job status` prints it):
/// `ids` is the lowest and the highest job id this orchestrator's log holds (`None`: no
/// job yet), `first` the id its log started (or will start) at (`core.first_job_id`,
/// resolved). An id below the log's first is no typo but a job of another log: an earlier
/// daemon's on a memory-only log (whose ids a fresh log never reuses), or another
/// orchestrator's.
pub fn unknown_job(id: u64, ids: Option<(u64, u64)>, first: u64) -> String {
    let lowest = ids.map_or(first, |(lowest, _)| lowest);
    match ids {
        _ if id < lowest => format!(
            "job {id} is not in this orchestrator's log (its ids start at {lowest}; the job \
             may belong to an earlier run on a memory-only log, or to another orchestrator)"
        ),
        None => format!(
            "job {id} does not exist: this orchestrator has no jobs yet (its first will be \
             job {first})"
        ),
        Some((_, highest)) if id > highest => {
            format!("job {id} does not exist yet (the latest job is {highest})")
        }
        Some((lowest, highest)) => format!(
            "job {id} is not in this orchestrator's log (it holds jobs {lowest} to \
             {highest}, but not this one)"
        ),
    }
}

/// The status of a failed job request (GetJob, WatchJob, CancelJob): for an unknown job,
/// `NOT_FOUND` saying why ([`unknown_job`], from the jobs `core` holds); anything else as
/// [`status_of`] says.
pub async fn job_request_status(core: &OrchestratorHandle, e: &OrchestratorError) -> Status {
    if let OrchestratorError::Job(JobRequestError::NotFound(job)) = e {
        if let Ok(jobs) = core.jobs().await {
            let ids = jobs.iter().map(|j| j.id.0);
            let range = ids.clone().min().zip(ids.max());
            return Status::not_found(unknown_job(job.0, range, core.config().first_job_id));
        }
    }
    status_of(e)
}

/// True for tonic's "message too large" refusal.
pub fn is_too_large(status: &Status) -> bool {
    status.code() == tonic::Code::OutOfRange
        && status.message().contains("message length too large")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression (issue 16): `hanzod job status 3` on a daemon restarted on a fresh
    /// memory log answered a bare NOT_FOUND, though job 3 was a job of the earlier run; it
    /// now says the id is below this log's first and why that can be.
    #[test]
    fn an_earlier_logs_job_id_is_named_as_such() {
        let first = 60_480_000;
        let earlier = unknown_job(3, None, first);
        assert!(
            earlier.contains("job 3 is not in this orchestrator's log (its ids start at 60480000;"),
            "{earlier}"
        );
        assert!(
            earlier.contains("earlier run on a memory-only log"),
            "{earlier}"
        );
        let earlier = unknown_job(3, Some((first, first + 4)), first);
        assert!(earlier.contains("its ids start at 60480000"), "{earlier}");
        // A log that started lower (replayed from Valkey, rebuilt from the chain) names
        // its own first id, not the one a fresh log would have drawn.
        let valkey = unknown_job(3, Some((5, 9)), first);
        assert!(valkey.contains("its ids start at 5"), "{valkey}");
        // Ids at or after the start are not an earlier run's.
        let none_yet = unknown_job(first + 2, None, first);
        assert!(none_yet.contains("has no jobs yet"), "{none_yet}");
        assert!(none_yet.contains("job 60480000"), "{none_yet}");
        let ahead = unknown_job(first + 9, Some((first, first + 4)), first);
        assert_eq!(
            ahead,
            "job 60480009 does not exist yet (the latest job is 60480004)"
        );
        let gap = unknown_job(7, Some((5, 9)), first);
        assert!(gap.contains("holds jobs 5 to 9, but not this one"), "{gap}");
    }
}
