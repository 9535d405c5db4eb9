//! `NodeService.UploadDelta`: receiving one model delta (DESIGN §6).
//!
//! An upload is a header, data chunks and a trailer. [`DeltaUploads::upload`] checks, in
//! order, and answers the first failure (each refusal is logged once and counted in
//! `deltas{outcome}` with the bytes received in `delta_bytes_received{outcome}`):
//!
//! | step | refusal | code | outcome label |
//! |---|---|---|---|
//! | first chunk | not a header | `INVALID_ARGUMENT` | `no_header` |
//! | header | `total_bytes` < 24 (an HZDL header alone is 24), `claimed_loss` not finite | `INVALID_ARGUMENT` | `invalid` |
//! | session | token not a live session | `UNAUTHENTICATED` | `unknown_session` |
//! | job | unknown job | `NOT_FOUND` | `unknown_job` |
//! | job | not Running, or Running another epoch | `FAILED_PRECONDITION` | `not_running`, `wrong_epoch` |
//! | job | its model is not in the catalog | `FAILED_PRECONDITION` | `unknown_model` |
//! | job | the node is not in its ring | `PERMISSION_DENIED` | `not_member` |
//! | size | `total_bytes` > the model's `max_delta_bytes(F32)` | `RESOURCE_EXHAUSTED` | `too_large` |
//! | capacity | this node already uploads, or `max_concurrent_uploads` are in flight | `RESOURCE_EXHAUSTED` | `busy` |
//! | data | no chunk within `upload_idle_ms` | `DEADLINE_EXCEEDED` | `timeout` |
//! | data | more bytes than declared, fewer at the trailer, a second header, an empty or unset chunk | `INVALID_ARGUMENT` | `overflow`, `short`, `out_of_order` |
//! | data | the stream ends without a trailer | `INVALID_ARGUMENT` | `no_trailer` |
//! | data | a message over the size limit; the transport failed | `RESOURCE_EXHAUSTED`; as received | `too_large_message`, `transport` |
//! | trailer | `sha256` is not the SHA-256 of the bytes received | `DATA_LOSS` | `hash_mismatch` |
//! | trailer | the statement signature (job, epoch, step, claimed loss, hash) does not verify under the session's node key | `UNAUTHENTICATED` | `bad_signature` |
//! | format | [`DeltaView::parse`] + [`check_against`] the job's model (off the runtime) | `INVALID_ARGUMENT` (the [`DeltaError`]'s message) | per error: `bad_header`, `truncated`, `bad_safetensors`, `wrong_dtype`, `wrong_kind`, `unknown_tensor`, `wrong_shape`, `missing_tensor`, `duplicate_tensor`, `non_finite` |
//! | base | the HZDL `base_version` ≠ checkpoints published so far | `FAILED_PRECONDITION` | `stale_base` |
//! | store | [`BlobStore::put`] failed | `UNAVAILABLE` (I/O), `INTERNAL` (other) | `store_failed` |
//! | record | `submit_delta`: epoch moved on / job ended | `FAILED_PRECONDITION` | `wrong_epoch`, `not_running` |
//! | record | left the ring meanwhile | `PERMISSION_DENIED` | `not_member` |
//! | record | a different delta of this node this epoch | `ALREADY_EXISTS` | `conflicting` |
//! | record | event log or job actor unavailable | `UNAVAILABLE` | `unavailable` |
//!
//! Everything up to "capacity" happens before a single data byte is accepted, and nothing
//! is allocated from the declared size: the buffer grows with the data that arrives (at
//! most doubling, never past `total_bytes`). The blob is stored durably *before* the
//! receipt is recorded in the event log, and the ack is sent only after both. The same
//! delta uploaded again is acked again (both steps are idempotent).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use hanzod_actors::actor::job::{JobRequestError, JobView};
use hanzod_actors::job::JobPhase;
use hanzod_actors::ports::{DeltaReceipt, Metrics};
use hanzod_actors::types::{JobId, NodeId};
use hanzod_actors::{OrchestratorError, OrchestratorHandle};
use hanzod_proto::v1 as pb;
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;
use tonic::Status;

use super::sessions::Sessions;
use crate::delta::catalog::ModelCatalog;
use crate::delta::format::{
    check_against, verify_statement, DeltaDtype, DeltaError, DeltaView, Statement, HEADER_LEN,
};
use crate::delta::model::ModelSpec;
use crate::delta::store::{BlobError, BlobStore};

/// Limits of delta uploads (config section `[deltas]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadSettings {
    /// Uploads received at once, over all nodes; more are refused `RESOURCE_EXHAUSTED`.
    pub max_concurrent: usize,
    /// An upload whose next chunk does not arrive within this many ms ends
    /// `DEADLINE_EXCEEDED`.
    pub idle_ms: u64,
    /// The data chunk size nodes are asked to use, bytes (`RegisterResponse`).
    pub chunk_bytes: usize,
}

impl Default for UploadSettings {
    /// 4 concurrent uploads, 30 s idle timeout, 1 MiB chunks (as `config/default.toml`).
    fn default() -> Self {
        UploadSettings {
            max_concurrent: 4,
            idle_ms: 30_000,
            chunk_bytes: 1 << 20,
        }
    }
}

/// A refused upload: the metric label and the status the node gets.
#[derive(Debug)]
struct Refusal {
    reason: &'static str,
    status: Status,
}

fn refusal(reason: &'static str, status: Status) -> Refusal {
    Refusal { reason, status }
}

/// What the data phase produced: the payload, its SHA-256, and the trailer.
#[derive(Debug)]
struct Received {
    bytes: Vec<u8>,
    sha256: [u8; 32],
    trailer: pb::DeltaTrailer,
}

/// Who is uploading what (logged with a refusal).
#[derive(Debug, Clone, Copy, Default)]
struct Context {
    node: Option<NodeId>,
    job: u64,
    epoch: u32,
}

/// Removes the node from the in-flight set when its upload ends, however it ends.
struct InFlight<'a> {
    set: &'a Mutex<HashSet<NodeId>>,
    node: NodeId,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.set
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.node);
    }
}

/// The delta upload service: session and job checks, bounded receiving, verification,
/// durable storage and the receipt (see the module docs for every refusal).
pub struct DeltaUploads {
    core: OrchestratorHandle,
    sessions: Arc<Sessions>,
    blobs: Arc<dyn BlobStore>,
    catalog: Arc<ModelCatalog>,
    settings: UploadSettings,
    permits: Arc<Semaphore>,
    in_flight: Mutex<HashSet<NodeId>>,
    metrics: Arc<dyn Metrics>,
}

impl std::fmt::Debug for DeltaUploads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeltaUploads")
            .field("settings", &self.settings)
            .field("available_permits", &self.permits.available_permits())
            .finish_non_exhaustive()
    }
}

impl DeltaUploads {
    /// Uploads for `core`'s jobs by the nodes of `sessions`, checked against `catalog`,
    /// stored in `blobs`.
    pub fn new(
        core: OrchestratorHandle,
        sessions: Arc<Sessions>,
        blobs: Arc<dyn BlobStore>,
        catalog: Arc<ModelCatalog>,
        settings: UploadSettings,
    ) -> DeltaUploads {
        DeltaUploads {
            metrics: core.metrics(),
            core,
            sessions,
            blobs,
            catalog,
            permits: Arc::new(Semaphore::new(settings.max_concurrent.max(1))),
            settings,
            in_flight: Mutex::new(HashSet::new()),
        }
    }

    /// The limits in force.
    pub fn settings(&self) -> &UploadSettings {
        &self.settings
    }

    /// Receives one upload from `chunks` (a header, data, a trailer) and answers its ack,
    /// or the status of the first check it fails (module docs).
    pub async fn upload<S>(&self, chunks: S) -> Result<pb::DeltaAck, Status>
    where
        S: Stream<Item = Result<pb::DeltaChunk, Status>> + Send,
    {
        let mut chunks = std::pin::pin!(chunks);
        let mut received = 0u64;
        let mut cx = Context::default();
        let r = self.run(&mut chunks, &mut received, &mut cx).await;
        let outcome = match &r {
            Ok(_) => "accepted",
            Err(f) => f.reason,
        };
        self.metrics.incr("deltas", outcome, 1);
        self.metrics.incr("delta_bytes_received", outcome, received);
        match r {
            Ok(ack) => {
                tracing::info!(
                    node = %cx.node.map(|n| n.short()).unwrap_or_default(),
                    job = cx.job,
                    epoch = cx.epoch,
                    bytes = received,
                    delta = %hex::encode(&ack.delta_hash[..8]),
                    "delta accepted"
                );
                Ok(ack)
            }
            Err(Refusal { reason, status }) => {
                let node = cx.node.map(|n| n.short()).unwrap_or_default();
                if matches!(
                    status.code(),
                    tonic::Code::Unavailable | tonic::Code::Internal
                ) {
                    tracing::warn!(%node, job = cx.job, epoch = cx.epoch, reason, code = ?status.code(), "delta not accepted: {}", status.message());
                } else {
                    tracing::info!(%node, job = cx.job, epoch = cx.epoch, reason, code = ?status.code(), "delta refused: {}", status.message());
                }
                Err(status)
            }
        }
    }

    async fn run<S>(
        &self,
        chunks: &mut S,
        received: &mut u64,
        cx: &mut Context,
    ) -> Result<pb::DeltaAck, Refusal>
    where
        S: Stream<Item = Result<pb::DeltaChunk, Status>> + Unpin,
    {
        let idle = Duration::from_millis(self.settings.idle_ms);
        let header = match next_chunk(chunks, idle).await? {
            Some(pb::DeltaChunk {
                part: Some(pb::delta_chunk::Part::Header(h)),
            }) => h,
            Some(_) => {
                return Err(refusal(
                    "no_header",
                    Status::invalid_argument("the first chunk of an upload must be its header"),
                ))
            }
            None => {
                return Err(refusal(
                    "no_header",
                    Status::invalid_argument("the upload ended before its header"),
                ))
            }
        };
        cx.job = header.job_id;
        cx.epoch = header.epoch;
        if header.total_bytes < HEADER_LEN as u64 {
            return Err(refusal(
                "invalid",
                Status::invalid_argument(format!(
                    "invalid header.total_bytes: {} is less than the {HEADER_LEN}-byte HZDL header",
                    header.total_bytes
                )),
            ));
        }
        if !header.claimed_loss.is_finite() {
            return Err(refusal(
                "invalid",
                Status::invalid_argument(format!(
                    "invalid header.claimed_loss: {} is not finite",
                    header.claimed_loss
                )),
            ));
        }
        let (node, key) = <[u8; 16]>::try_from(header.session.as_slice())
            .ok()
            .and_then(|t| self.sessions.lookup(&t))
            .ok_or_else(|| {
                refusal(
                    "unknown_session",
                    Status::unauthenticated("unknown or expired session; register again"),
                )
            })?;
        cx.node = Some(node);

        let view = self
            .core
            .job(JobId(header.job_id))
            .await
            .map_err(|e| core_refusal(&e))?;
        let model = self.admit(&header, node, &view)?;
        let total = usize::try_from(header.total_bytes).map_err(|_| {
            refusal(
                "too_large",
                Status::resource_exhausted("total_bytes does not fit in memory"),
            )
        })?;

        // Capacity, the last check before data: one upload per node, a bounded number in all.
        let _in_flight = {
            let mut set = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
            if !set.insert(node) {
                return Err(refusal(
                    "busy",
                    Status::resource_exhausted(
                        "this node already has an upload in progress; finish or cancel it first",
                    ),
                ));
            }
            InFlight {
                set: &self.in_flight,
                node,
            }
        };
        let _permit = self.permits.clone().try_acquire_owned().map_err(|_| {
            refusal(
                "busy",
                Status::resource_exhausted(format!(
                    "{} delta uploads are in progress; retry later",
                    self.settings.max_concurrent
                )),
            )
        })?;

        let Received {
            bytes,
            sha256,
            trailer,
        } = receive(chunks, total, idle, received).await?;

        if trailer.sha256.as_slice() != sha256.as_slice() {
            return Err(refusal(
                "hash_mismatch",
                Status::data_loss(format!(
                    "trailer.sha256 {} is not the SHA-256 of the {} bytes received ({})",
                    hex::encode(&trailer.sha256),
                    bytes.len(),
                    hex::encode(sha256)
                )),
            ));
        }
        let statement = Statement {
            job: header.job_id,
            epoch: header.epoch,
            step: header.step,
            claimed_loss: header.claimed_loss,
        };
        verify_statement(&key, &statement, &sha256, &trailer.signature).map_err(|_| {
            refusal(
                "bad_signature",
                Status::unauthenticated(format!(
                    "the delta statement signature does not verify under node {}'s key for job {}, epoch {}, step {}, claimed loss {} and this payload",
                    node.short(),
                    header.job_id,
                    header.epoch,
                    header.step,
                    header.claimed_loss
                )),
            )
        })?;

        let bytes: Arc<[u8]> = Arc::from(bytes);
        let base_version = check_off_runtime(bytes.clone(), model).await?;
        let current = view.checkpoints.len() as u64;
        if base_version != current {
            return Err(refusal(
                "stale_base",
                Status::failed_precondition(format!(
                    "the delta was computed against checkpoint version {base_version}, the job is at version {current}"
                )),
            ));
        }

        self.blobs.put(sha256, bytes).await.map_err(|e| {
            let status = match &e {
                BlobError::Io(_) => Status::unavailable(format!("delta not stored: {e}")),
                _ => Status::internal(format!("delta not stored: {e}")),
            };
            refusal("store_failed", status)
        })?;
        let receipt = DeltaReceipt {
            job: JobId(header.job_id),
            node,
            epoch: header.epoch,
            step: header.step,
            delta_hash: sha256,
            claimed_loss: header.claimed_loss,
            signature: trailer.signature,
        };
        self.core
            .submit_delta(receipt)
            .await
            .map_err(|e| core_refusal(&e))?;
        Ok(pb::DeltaAck {
            delta_hash: sha256.to_vec(),
            accepted: true,
            reason: String::new(),
        })
    }

    /// The job-side checks of a header: Running in its epoch, a model we know, the node in
    /// the ring, the declared size within the model's bound. Returns the model.
    fn admit(
        &self,
        header: &pb::DeltaHeader,
        node: NodeId,
        view: &JobView,
    ) -> Result<ModelSpec, Refusal> {
        match view.phase {
            JobPhase::Running { epoch, .. } if epoch == header.epoch => {}
            JobPhase::Running { epoch, .. } => {
                return Err(refusal(
                    "wrong_epoch",
                    Status::failed_precondition(format!(
                        "delta for epoch {}, job {} is in epoch {epoch}",
                        header.epoch, header.job_id
                    )),
                ))
            }
            ref other => {
                return Err(refusal(
                    "not_running",
                    Status::failed_precondition(format!(
                        "job {} is {}, not running",
                        header.job_id,
                        other.name()
                    )),
                ))
            }
        }
        let model = self.catalog.get(&view.spec.training.model).map_err(|e| {
            refusal(
                "unknown_model",
                Status::failed_precondition(format!(
                    "job {}'s spec.training.model: {e}",
                    header.job_id
                )),
            )
        })?;
        let member = view
            .ring
            .as_ref()
            .is_some_and(|r| r.members.contains(&node));
        if !member {
            return Err(refusal(
                "not_member",
                Status::permission_denied(format!(
                    "node {} is not a member of job {}'s ring",
                    node.short(),
                    header.job_id
                )),
            ));
        }
        let max = model.max_delta_bytes(DeltaDtype::F32);
        if header.total_bytes > max {
            return Err(refusal(
                "too_large",
                Status::resource_exhausted(format!(
                    "total_bytes {} exceeds {max}, the largest delta of model {:?}",
                    header.total_bytes, view.spec.training.model
                )),
            ));
        }
        Ok(model.clone())
    }
}

/// The next chunk, waiting at most `idle`; `None` when the client ended the stream.
async fn next_chunk<S>(chunks: &mut S, idle: Duration) -> Result<Option<pb::DeltaChunk>, Refusal>
where
    S: Stream<Item = Result<pb::DeltaChunk, Status>> + Unpin,
{
    match tokio::time::timeout(idle, chunks.next()).await {
        Err(_) => Err(refusal(
            "timeout",
            Status::deadline_exceeded(format!(
                "no upload chunk within {} ms; nothing was stored",
                idle.as_millis()
            )),
        )),
        Ok(None) => Ok(None),
        Ok(Some(Ok(c))) => Ok(Some(c)),
        Ok(Some(Err(status))) if super::server::is_too_large(&status) => Err(refusal(
            "too_large_message",
            Status::resource_exhausted(status.message().to_string()),
        )),
        Ok(Some(Err(status))) => Err(refusal("transport", status)),
    }
}

/// Receives data chunks up to the trailer: exactly `total` bytes, hashed as they arrive,
/// in a buffer that grows with the data (at most doubling, never past `total`). Counts
/// every data byte in `received`.
async fn receive<S>(
    chunks: &mut S,
    total: usize,
    idle: Duration,
    received: &mut u64,
) -> Result<Received, Refusal>
where
    S: Stream<Item = Result<pb::DeltaChunk, Status>> + Unpin,
{
    use pb::delta_chunk::Part;
    let mut buf: Vec<u8> = Vec::new();
    let mut hasher = Sha256::new();
    loop {
        let part = match next_chunk(chunks, idle).await? {
            None => {
                return Err(refusal(
                    "no_trailer",
                    Status::invalid_argument(format!(
                        "the upload ended after {} of {total} bytes without a trailer; nothing was stored",
                        buf.len()
                    )),
                ))
            }
            Some(pb::DeltaChunk { part: None }) => {
                return Err(refusal(
                    "out_of_order",
                    Status::invalid_argument("a chunk with no part set"),
                ))
            }
            Some(pb::DeltaChunk { part: Some(p) }) => p,
        };
        match part {
            Part::Header(_) => {
                return Err(refusal(
                    "out_of_order",
                    Status::invalid_argument("a second header in one upload"),
                ))
            }
            Part::Data(data) => {
                *received += data.len() as u64;
                if data.is_empty() {
                    return Err(refusal(
                        "out_of_order",
                        Status::invalid_argument("an empty data chunk"),
                    ));
                }
                if data.len() > total - buf.len() {
                    return Err(refusal(
                        "overflow",
                        Status::invalid_argument(format!(
                            "more data than the {total} bytes declared in total_bytes"
                        )),
                    ));
                }
                hasher.update(&data);
                append(&mut buf, data, total);
            }
            Part::Trailer(trailer) => {
                if buf.len() != total {
                    return Err(refusal(
                        "short",
                        Status::invalid_argument(format!(
                            "trailer after {} bytes, but total_bytes declared {total}",
                            buf.len()
                        )),
                    ));
                }
                return Ok(Received {
                    bytes: buf,
                    sha256: hasher.finalize().into(),
                    trailer,
                });
            }
        }
    }
}

/// Appends `data` to `buf`, growing its capacity at most to twice what it holds and never
/// past `total` (the caller checked that `buf.len() + data.len() <= total`).
fn append(buf: &mut Vec<u8>, data: Vec<u8>, total: usize) {
    if buf.is_empty() {
        *buf = data;
        return;
    }
    let need = buf.len() + data.len();
    if need > buf.capacity() {
        let target = need.max(buf.capacity().saturating_mul(2)).min(total);
        buf.reserve_exact(target - buf.len());
    }
    buf.extend_from_slice(&data);
}

/// [`DeltaView::parse`] and [`check_against`] `model` on a blocking thread; returns the
/// delta's base checkpoint version.
async fn check_off_runtime(bytes: Arc<[u8]>, model: ModelSpec) -> Result<u64, Refusal> {
    let checked = tokio::task::spawn_blocking(move || {
        let view = DeltaView::parse(&bytes)?;
        check_against(&view, &model)?;
        Ok::<u64, DeltaError>(view.header.base_version)
    })
    .await
    .map_err(|e| {
        refusal(
            "internal",
            Status::internal(format!("the format check did not finish: {e}")),
        )
    })?;
    checked.map_err(|e| {
        refusal(
            delta_reason(&e),
            Status::invalid_argument(format!("invalid delta: {e}")),
        )
    })
}

/// The metric label of a format-check failure.
fn delta_reason(e: &DeltaError) -> &'static str {
    use DeltaError as D;
    match e {
        D::Truncated { .. } | D::LengthMismatch { .. } => "truncated",
        D::BadMagic(_) | D::UnsupportedVersion(_) | D::UnknownDtype(_) | D::UnknownKind(_) => {
            "bad_header"
        }
        D::HeaderTooLarge { .. } | D::SafetensorsHeader(_) | D::OverlappingOrOutOfRange { .. } => {
            "bad_safetensors"
        }
        D::DtypeMismatch { .. } => "wrong_dtype",
        D::KindMismatch { .. } => "wrong_kind",
        D::NonFinite { .. } => "non_finite",
        D::UnknownTensor(_) => "unknown_tensor",
        D::WrongShape { .. } => "wrong_shape",
        D::MissingTensor(_) => "missing_tensor",
        D::DuplicateTensor(_) => "duplicate_tensor",
        D::BadSignature | D::Replayed { .. } => "bad_signature",
    }
}

/// The refusal of a core error, for uploads: as [`super::status_of`], except that a node
/// outside the ring is `PERMISSION_DENIED` (it is known, just not allowed).
fn core_refusal(e: &OrchestratorError) -> Refusal {
    let msg = e.to_string();
    match e {
        OrchestratorError::Job(j) => match j {
            JobRequestError::NotFound(_) => refusal("unknown_job", Status::not_found(msg)),
            JobRequestError::NotMember(_) => refusal("not_member", Status::permission_denied(msg)),
            JobRequestError::Conflicting(_) => refusal("conflicting", Status::already_exists(msg)),
            JobRequestError::WrongEpoch { .. } => {
                refusal("wrong_epoch", Status::failed_precondition(msg))
            }
            JobRequestError::NotRunning { .. }
            | JobRequestError::Ended(_)
            | JobRequestError::Transition(_) => {
                refusal("not_running", Status::failed_precondition(msg))
            }
            JobRequestError::Restarting(_) | JobRequestError::Store(_) => {
                refusal("unavailable", Status::unavailable(msg))
            }
        },
        OrchestratorError::Unavailable(_) => refusal("unavailable", Status::unavailable(msg)),
        other => refusal("internal", super::status_of(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pb::delta_chunk::Part;

    /// What a client sends: one item of the request stream.
    type Item = Result<pb::DeltaChunk, Status>;

    fn data(b: &[u8]) -> Item {
        Ok(pb::DeltaChunk {
            part: Some(Part::Data(b.to_vec())),
        })
    }

    fn trailer(sha256: &[u8]) -> Item {
        Ok(pb::DeltaChunk {
            part: Some(Part::Trailer(pb::DeltaTrailer {
                sha256: sha256.to_vec(),
                signature: vec![7; 64],
            })),
        })
    }

    const IDLE: Duration = Duration::from_millis(30_000);

    async fn run(chunks: Vec<Item>, total: usize) -> (Result<Received, Refusal>, u64) {
        let mut s = futures_util::stream::iter(chunks);
        let mut received = 0;
        let r = receive(&mut s, total, IDLE, &mut received).await;
        (r, received)
    }

    #[tokio::test]
    async fn receives_exactly_the_declared_bytes_and_hashes_them() {
        let payload: Vec<u8> = (0..100u8).collect();
        let (r, n) = run(
            vec![
                data(&payload[..10]),
                data(&payload[10..60]),
                data(&payload[60..]),
                trailer(&[0; 32]),
            ],
            100,
        )
        .await;
        let r = r.unwrap();
        assert_eq!(r.bytes, payload);
        assert_eq!(r.sha256, <[u8; 32]>::from(Sha256::digest(&payload)));
        assert_eq!(r.trailer.signature, vec![7; 64]);
        assert_eq!(n, 100);
    }

    #[tokio::test]
    async fn protocol_violations_are_refused_with_their_reason() {
        let cases: Vec<(Vec<Item>, &str, tonic::Code)> = vec![
            (
                vec![data(&[1; 60]), data(&[1; 41])],
                "overflow",
                tonic::Code::InvalidArgument,
            ),
            (
                vec![data(&[1; 99]), trailer(&[0; 32])],
                "short",
                tonic::Code::InvalidArgument,
            ),
            (
                vec![data(&[1; 50])],
                "no_trailer",
                tonic::Code::InvalidArgument,
            ),
            (
                vec![data(&[])],
                "out_of_order",
                tonic::Code::InvalidArgument,
            ),
            (
                vec![Ok(pb::DeltaChunk {
                    part: Some(Part::Header(pb::DeltaHeader::default())),
                })],
                "out_of_order",
                tonic::Code::InvalidArgument,
            ),
            (
                vec![Ok(pb::DeltaChunk { part: None })],
                "out_of_order",
                tonic::Code::InvalidArgument,
            ),
            (
                vec![Err(Status::cancelled("gone"))],
                "transport",
                tonic::Code::Cancelled,
            ),
        ];
        for (chunks, reason, code) in cases {
            let (r, _) = run(chunks, 100).await;
            let f = r.expect_err(reason);
            assert_eq!((f.reason, f.status.code()), (reason, code), "{f:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_upload_ends_deadline_exceeded_after_the_idle_time() {
        // Two chunks, then silence (the stream never ends).
        let s = futures_util::stream::iter(vec![data(&[1; 10]), data(&[2; 10])])
            .chain(futures_util::stream::pending());
        let mut s = std::pin::pin!(s);
        let start = tokio::time::Instant::now();
        let mut received = 0;
        let r = receive(&mut s, 100, Duration::from_millis(250), &mut received).await;
        let f = r.expect_err("stalled");
        assert_eq!(f.reason, "timeout");
        assert_eq!(f.status.code(), tonic::Code::DeadlineExceeded);
        assert_eq!(start.elapsed(), Duration::from_millis(250));
        assert_eq!(received, 20);
    }

    #[tokio::test(start_paused = true)]
    async fn the_idle_timer_restarts_with_every_chunk() {
        // A chunk every 200 ms with a 250 ms idle timeout: never idle long enough.
        let slow = futures_util::stream::iter(0..5).then(|i| async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if i < 4 {
                data(&[i as u8; 25])
            } else {
                trailer(&[0; 32])
            }
        });
        let mut s = std::pin::pin!(slow);
        let mut received = 0;
        let r = receive(&mut s, 100, Duration::from_millis(250), &mut received).await;
        assert_eq!(r.unwrap().bytes.len(), 100);
    }

    #[test]
    fn the_buffer_never_grows_past_the_declared_total_nor_twice_the_data() {
        let total = 1000;
        let mut buf = Vec::new();
        let mut held = 0;
        for _ in 0..100 {
            append(&mut buf, vec![0u8; 10], total);
            held += 10;
            assert_eq!(buf.len(), held);
            assert!(buf.capacity() <= total, "{} > {total}", buf.capacity());
            assert!(buf.capacity() <= 2 * held.max(10), "{}", buf.capacity());
        }
        assert_eq!(buf.len(), total);
    }

    #[test]
    fn every_delta_error_has_a_label() {
        let e = DeltaError::NonFinite {
            tensor: "fc1.weight".into(),
            index: 3,
        };
        assert_eq!(delta_reason(&e), "non_finite");
        assert_eq!(
            delta_reason(&DeltaError::UnknownTensor("x".into())),
            "unknown_tensor"
        );
    }
}
