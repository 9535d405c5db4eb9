//! The ring-aggregation calls of `NodeService` (`CommitDelta`, `SubmitSketch`,
//! `ReportReduction`, `SubmitEvidence`; `node.proto`, DESIGN §6.4): each is bounded first
//! (every field's size, [`hanzod_protocol::limits`]: `INVALID_ARGUMENT` before the session
//! is looked up), checked here (the session, the job's model, the signature under the
//! session's node key, the sketch's shape), then handed to the job's ring aggregation in
//! the core ([`OrchestratorHandle::round`]), which answers with the step it is at.

use hanzod_actors::actor::msg::RoundMsg;
use hanzod_actors::aggregation::Commit;
use hanzod_actors::job::Aggregation;
use hanzod_actors::ports::{Counter, SketchData};
use hanzod_actors::types::{JobId, NodeId};
use hanzod_proto::v1 as pb;
use hanzod_protocol::hzdl::{verify_statement, DeltaDtype, Statement, HEADER_LEN};
use hanzod_protocol::limits;
use hanzod_protocol::round::{self as ring, SeedPurpose};
use tonic::Status;

use super::DeltaUploads;

pub use hanzod_protocol::limits::{EVIDENCE_PIECE_BYTES, MAX_EVIDENCE_PIECES};

fn hash32(field: &'static str, v: &[u8]) -> Result<[u8; 32], Status> {
    v.try_into().map_err(|_| {
        Status::invalid_argument(format!("invalid {field}: {} bytes, not 32", v.len()))
    })
}

impl DeltaUploads {
    /// The calling session's node and key, and the job's view, for a ring call.
    async fn round_caller(
        &self,
        session: &[u8],
        job: u64,
    ) -> Result<
        (
            NodeId,
            ed25519_dalek::VerifyingKey,
            hanzod_actors::actor::job::JobView,
        ),
        Status,
    > {
        let (node, key) = self
            .sessions
            .lookup_bytes(session)
            .ok_or_else(|| Status::unauthenticated(hanzod_protocol::status::UNKNOWN_SESSION))?;
        let view = self
            .core
            .job(JobId(job))
            .await
            .map_err(|e| super::super::status_of(&e))?;
        if view.spec.training.aggregation != Aggregation::Ring {
            return Err(Status::failed_precondition(format!(
                "job {job} aggregates in star mode: upload the delta with UploadDelta"
            )));
        }
        Ok((node, key, view))
    }

    fn refused(&self, what: &'static str, status: Status) -> Status {
        self.metrics.incr(Counter::RejectedMessages, what, 1);
        use super::super::refusal_log::Logged;
        match self
            .refusals
            .judge(what, status.code(), self.core.clock().now().as_millis())
        {
            Logged::Failure => {
                tracing::warn!(call = what, code = ?status.code(), "ring call failed: {}", hanzod_protocol::convert::bounded_message(status.message()))
            }
            Logged::Refusal { unlogged } => {
                tracing::info!(call = what, code = ?status.code(), unlogged, "ring call refused: {}", hanzod_protocol::convert::bounded_message(status.message()))
            }
            Logged::Suppressed => {}
        }
        status
    }

    async fn to_core(&self, job: u64, node: NodeId, msg: RoundMsg) -> Result<pb::RoundAck, Status> {
        let step = self
            .core
            .round(JobId(job), node, msg)
            .await
            .map_err(|e| super::core_refusal(&e).status)?;
        Ok(pb::RoundAck {
            step: step.to_string(),
        })
    }

    /// `CommitDelta` (see `node.proto`).
    ///
    /// Errors, in order: INVALID_ARGUMENT (a field over its limit,
    /// [`limits::delta_commitment`]), UNAUTHENTICATED (session), NOT_FOUND (job),
    /// FAILED_PRECONDITION (star job), INVALID_ARGUMENT (sha256 not 32 bytes, claimed_loss not finite or negative, step not
    /// epoch × local_steps, total_bytes below the HZDL header or above the model's largest
    /// f32 delta, unknown model), UNAUTHENTICATED (the statement signature), then the
    /// core's: FAILED_PRECONDITION (not running in `epoch`, not at the commit step),
    /// PERMISSION_DENIED (not in the ring), ALREADY_EXISTS (a different commitment).
    pub async fn commit_delta(&self, r: pb::DeltaCommitment) -> Result<pb::RoundAck, Status> {
        let res = async {
            limits::delta_commitment(&r)?;
            let (node, key, view) = self.round_caller(&r.session, r.job_id).await?;
            let hash = hash32("sha256", &r.sha256)?;
            hanzod_protocol::convert::claimed_loss("claimed_loss", r.claimed_loss)?;
            let step = u64::from(r.epoch) * u64::from(view.spec.training.local_steps);
            if r.step != step {
                return Err(Status::invalid_argument(format!(
                    "invalid step: expected {step} (epoch × local_steps), got {}",
                    r.step
                )));
            }
            let model = self.catalog.delta_spec(&view.spec.training).map_err(|e| {
                Status::failed_precondition(format!("job {}'s model: {e}", r.job_id))
            })?;
            let max = model.max_delta_bytes(DeltaDtype::F32);
            if r.total_bytes < HEADER_LEN as u64 || r.total_bytes > max {
                return Err(Status::invalid_argument(format!(
                    "invalid total_bytes: {} is outside {HEADER_LEN}..={max}, the model's delta sizes",
                    r.total_bytes
                )));
            }
            let statement = Statement {
                job: r.job_id,
                epoch: r.epoch,
                step: r.step,
                claimed_loss: r.claimed_loss,
            };
            verify_statement(&key, &statement, &hash, &r.signature).map_err(|_| {
                Status::unauthenticated(format!(
                    "the commitment's signature does not verify under node {}'s key",
                    node.short()
                ))
            })?;
            let msg = RoundMsg::Commit {
                epoch: r.epoch,
                step: r.step,
                commit: Commit {
                    hash,
                    claimed_loss: r.claimed_loss,
                    total_bytes: r.total_bytes,
                },
                signature: r.signature.clone(),
            };
            self.to_core(r.job_id, node, msg).await
        }
        .await;
        res.map_err(|s| self.refused("commit_delta", s))
    }

    /// `SubmitSketch` (see `node.proto`).
    ///
    /// Errors, in order: INVALID_ARGUMENT (a field over its limit,
    /// [`limits::sketch_submission`]), UNAUTHENTICATED (session), NOT_FOUND,
    /// FAILED_PRECONDITION (star job), INVALID_ARGUMENT (sha256, the sketch's shape: `core.aggregation.sketch_rows` rows
    /// and masses over the model's parameter count, finite, masses above magnitudes),
    /// UNAUTHENTICATED (signature), then the core's (not at the sketch or verify step,
    /// another hash than committed: ALREADY_EXISTS).
    pub async fn submit_sketch(&self, r: pb::SketchSubmission) -> Result<pb::RoundAck, Status> {
        let res = async {
            limits::sketch_submission(&r)?;
            let (node, key, view) = self.round_caller(&r.session, r.job_id).await?;
            let hash = hash32("sha256", &r.sha256)?;
            let model = self.catalog.delta_spec(&view.spec.training).map_err(|e| {
                Status::failed_precondition(format!("job {}'s model: {e}", r.job_id))
            })?;
            let rows = self.core.config().aggregation.sketch_rows as usize;
            let sketch = ring::sketch_from_wire(r.sketch.as_ref(), rows, model.param_count())
                .map_err(Status::from)?;
            let purpose = SeedPurpose::from_check(r.check);
            let digest = ring::sketch_digest(r.job_id, r.epoch, purpose, &hash, &sketch);
            ring::verify_digest(&key, &digest, &r.signature).map_err(|_| {
                Status::unauthenticated(format!(
                    "the sketch's signature does not verify under node {}'s key",
                    node.short()
                ))
            })?;
            let msg = RoundMsg::Sketch {
                epoch: r.epoch,
                check: r.check,
                delta_hash: hash,
                sketch: SketchData {
                    rows: sketch.rows,
                    abs_rows: sketch.abs_rows,
                    len: sketch.len,
                },
            };
            self.to_core(r.job_id, node, msg).await
        }
        .await;
        res.map_err(|s| self.refused("submit_sketch", s))
    }

    /// `ReportReduction` (see `node.proto`).
    ///
    /// Errors: INVALID_ARGUMENT (a field over its limit, [`limits::reduction_report`], first;
    /// result_sha256 not 32 bytes), UNAUTHENTICATED (session, signature), NOT_FOUND,
    /// FAILED_PRECONDITION (star job, not at the reduce step of `ring_version`).
    pub async fn report_reduction(&self, r: pb::ReductionReport) -> Result<pb::RoundAck, Status> {
        let res = async {
            limits::reduction_report(&r)?;
            let (node, key, _) = self.round_caller(&r.session, r.job_id).await?;
            let result = hash32("result_sha256", &r.result_sha256)?;
            let digest = ring::reduction_digest(r.job_id, r.epoch, r.ring_version, &result);
            ring::verify_digest(&key, &digest, &r.signature).map_err(|_| {
                Status::unauthenticated(format!(
                    "the report's signature does not verify under node {}'s key",
                    node.short()
                ))
            })?;
            let msg = RoundMsg::Report {
                epoch: r.epoch,
                version: r.ring_version,
                result,
            };
            self.to_core(r.job_id, node, msg).await
        }
        .await;
        res.map_err(|s| self.refused("report_reduction", s))
    }

    /// `SubmitEvidence` (see `node.proto`). The pieces' signatures are the sender's and are
    /// checked when the evidence is used.
    ///
    /// Errors: INVALID_ARGUMENT (a field over its limit, [`limits::round_evidence`], first:
    /// more than [`MAX_EVIDENCE_PIECES`] pieces, a piece over [`EVIDENCE_PIECE_BYTES`]),
    /// UNAUTHENTICATED (session), NOT_FOUND, FAILED_PRECONDITION (star job, the epoch did
    /// not fall back), INVALID_ARGUMENT (sender not 32 bytes, a piece shorter than
    /// [`EVIDENCE_PIECE_BYTES`]).
    pub async fn submit_evidence(&self, r: pb::RoundEvidence) -> Result<pb::RoundAck, Status> {
        let res = async {
            limits::round_evidence(&r)?;
            let (node, _, _) = self.round_caller(&r.session, r.job_id).await?;
            let sender = NodeId(hash32("sender", &r.sender)?);
            if let Some((i, p)) = r
                .pieces
                .iter()
                .enumerate()
                .find(|(_, p)| p.len() != EVIDENCE_PIECE_BYTES)
            {
                return Err(Status::invalid_argument(format!(
                    "invalid pieces[{i}]: {} bytes, not {EVIDENCE_PIECE_BYTES}",
                    p.len()
                )));
            }
            let msg = RoundMsg::Evidence {
                epoch: r.epoch,
                version: r.ring_version,
                sender,
                pieces: r.pieces,
            };
            self.to_core(r.job_id, node, msg).await
        }
        .await;
        res.map_err(|s| self.refused("submit_evidence", s))
    }
}
