//! `NodeService.UploadDelta`: receiving one model delta (DESIGN §6).
//!
//! An upload is a header, data chunks and a trailer. [`DeltaUploads::upload`] checks, in
//! order, and answers the first failure (each refusal is logged once and counted in
//! `deltas{outcome}` with the bytes received in `delta_bytes_received{outcome}`):
//!
//! | step | refusal | code | outcome label |
//! |---|---|---|---|
//! | first chunk | not a header | `INVALID_ARGUMENT` | `no_header` |
//! | header | `session` over 16 bytes ([`limits::delta_header`]), `total_bytes` < 24 (an HZDL header alone is 24), `claimed_loss` not finite or negative | `INVALID_ARGUMENT` | `invalid` |
//! | session | token not a live session | `UNAUTHENTICATED` | `unknown_session` |
//! | job | unknown job | `NOT_FOUND` | `unknown_job` |
//! | job | not Running, or Running another epoch | `FAILED_PRECONDITION` | `not_running`, `wrong_epoch` |
//! | job | `step` ≠ `epoch × spec.training.local_steps` (the validator would reject the delta) | `INVALID_ARGUMENT` | `wrong_step` |
//! | job | its model is not in the catalog | `FAILED_PRECONDITION` | `unknown_model` |
//! | job | the node is not in its ring | `PERMISSION_DENIED` | `not_member` |
//! | job | the node already delivered its delta this epoch (the message names its hash) | `ALREADY_EXISTS` | `already_delivered` |
//! | size | `total_bytes` > the job's delta spec's `max_delta_bytes(F32)` (the model's, or its LoRA adapter's: `ModelCatalog::delta_spec`) | `RESOURCE_EXHAUSTED` | `too_large` |
//! | capacity | this node already uploads, or `max_concurrent_uploads` are in flight | `RESOURCE_EXHAUSTED` | `busy` |
//! | data | no chunk within `upload_idle_ms` | `DEADLINE_EXCEEDED` | `timeout` |
//! | data | the data not complete within `upload_idle_ms + total_bytes / min_upload_bytes_per_s` of its start | `DEADLINE_EXCEEDED` | `too_slow` |
//! | data | more bytes than declared, fewer at the trailer, a second header, an empty or unset chunk | `INVALID_ARGUMENT` | `overflow`, `short`, `out_of_order` |
//! | data | the stream ends without a trailer | `INVALID_ARGUMENT` | `no_trailer` |
//! | data | a message over the size limit; the transport failed | `RESOURCE_EXHAUSTED`; as received | `too_large_message`, `transport` |
//! | trailer | `sha256` over 32 bytes or `signature` over 64 ([`limits::delta_trailer`], before either is compared, quoted or verified) | `INVALID_ARGUMENT` | `invalid` |
//! | trailer | `sha256` is not the SHA-256 of the bytes received | `DATA_LOSS` | `hash_mismatch` |
//! | trailer | the statement signature (job, epoch, step, claimed loss, hash) does not verify under the session's node key | `UNAUTHENTICATED` | `bad_signature` |
//! | format | [`DeltaView::parse`] + [`check_against`] the job's delta spec (off the runtime) | `INVALID_ARGUMENT` (the [`DeltaError`]'s message) | per error: `bad_header`, `truncated`, `bad_safetensors`, `wrong_dtype`, `wrong_kind`, `unknown_tensor`, `wrong_shape`, `missing_tensor`, `duplicate_tensor`, `non_finite` |
//! | base | the HZDL `base_version` ≠ checkpoints published so far | `FAILED_PRECONDITION` | `stale_base` |
//! | store | [`BlobStore::put`] failed | `UNAVAILABLE` (I/O), `INTERNAL` (other) | `store_failed` |
//! | record | `submit_delta`: epoch moved on / job ended | `FAILED_PRECONDITION` | `wrong_epoch`, `not_running` |
//! | record | left the ring meanwhile | `PERMISSION_DENIED` | `not_member` |
//! | record | another receipt of this node this epoch | `ALREADY_EXISTS` | `conflicting` |
//! | record | event log or job actor unavailable | `UNAVAILABLE` | `unavailable` |
//! | any | the daemon failed (a check or the store task did not finish, an unexpected core error) | `INTERNAL` | `internal` |
//!
//! Everything up to "capacity" happens before a single data byte is accepted, and nothing
//! is allocated from the declared size: the buffer grows with the data that arrives (at
//! most doubling, never past `total_bytes`; its last growth allocates the shared buffer
//! the blob store keeps, so the payload is not copied once more at the end). The blob is
//! stored durably *before* the receipt is recorded in the event log, and the ack is sent
//! only after both; that last step runs as a task of its own, so a client that goes away
//! meanwhile cannot leave it half done.
//!
//! A node delivers one delta per epoch: once its receipt is recorded, any further upload of
//! it in that epoch is refused at the header (`already_delivered`, naming the delivered
//! hash), so a node whose ack was lost learns that its delta arrived without sending it
//! again. Behind that, recording stays idempotent: the identical receipt is acked again,
//! any other one is `conflicting`.
//!
//! A delta refused after its blob was stored (the `record` rows: the job moved on, ended,
//! or changed its ring meanwhile) does not stay behind: its blob is removed again unless
//! it was in the store before this upload or the job's current receipts name it. Uploads
//! of the same payload store and record one at a time, so a removal never takes a blob
//! that another upload just stored. When the outcome is unknown (`unavailable`: the event
//! log write failed or the job did not answer in time, and the receipt may be recorded
//! all the same) the blob is kept.

use hanzod_actors::ports::Counter;
use std::collections::{HashMap, HashSet};
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
use tokio::time::Instant;
use tonic::Status;

use super::sessions::Sessions;

mod round;
use hanzod_protocol::hzdl::{
    verify_statement, DeltaDtype, DeltaError, DeltaView, Statement, HEADER_LEN,
};
use hanzod_protocol::limits;
use hanzod_protocol::model::{check_against, ModelSpec};
use hanzod_store::blobs::{BlobError, BlobStore};
use hanzod_train::catalog::ModelCatalog;
pub use round::{EVIDENCE_PIECE_BYTES, MAX_EVIDENCE_PIECES};

/// Limits of delta uploads (config section `[deltas]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadSettings {
    /// Uploads received at once, over all nodes; more are refused `RESOURCE_EXHAUSTED`.
    pub max_concurrent: usize,
    /// An upload whose next chunk does not arrive within this many ms ends
    /// `DEADLINE_EXCEEDED`.
    pub idle_ms: u64,
    /// The slowest upload accepted, bytes/s: the data of an upload of `total_bytes` must be
    /// complete within `idle_ms + total_bytes / min_bytes_per_s` of its start, or it ends
    /// `DEADLINE_EXCEEDED` (0 is taken as 1).
    pub min_bytes_per_s: u64,
    /// The data chunk size nodes are asked to use, bytes (`RegisterResponse`).
    pub chunk_bytes: usize,
}

impl Default for UploadSettings {
    /// 4 concurrent uploads, 30 s idle timeout, at least 1 MiB/s, 1 MiB chunks (as
    /// `config/default.toml`).
    fn default() -> Self {
        UploadSettings {
            max_concurrent: 4,
            idle_ms: 30_000,
            min_bytes_per_s: 1 << 20,
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
    bytes: Arc<[u8]>,
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

/// One lock per payload hash being stored and recorded, so that uploads of the same bytes
/// (by different nodes, or jobs) take that step one at a time: a refused upload that
/// removes the blob it stored cannot take one another upload has just stored.
#[derive(Debug, Default)]
struct HashLocks(Mutex<HashMap<[u8; 32], Arc<tokio::sync::Mutex<()>>>>);

/// Holds the lock of one hash; the last holder removes the entry.
struct HashGuard {
    locks: Arc<HashLocks>,
    hash: [u8; 32],
    held: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl HashLocks {
    async fn lock(self: &Arc<Self>, hash: [u8; 32]) -> HashGuard {
        let lock = self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(hash)
            .or_default()
            .clone();
        HashGuard {
            locks: self.clone(),
            hash,
            held: Some(lock.lock_owned().await),
        }
    }
}

impl Drop for HashGuard {
    fn drop(&mut self) {
        // Release first: then the entry's only other owners are the uploads waiting for it.
        self.held = None;
        let mut map = self.locks.0.lock().unwrap_or_else(|p| p.into_inner());
        if map
            .get(&self.hash)
            .is_some_and(|l| Arc::strong_count(l) == 1)
        {
            map.remove(&self.hash);
        }
    }
}

/// The delta upload service: session and job checks, bounded receiving, verification,
/// durable storage and the receipt (see the module docs for every refusal).
pub struct DeltaUploads {
    core: OrchestratorHandle,
    sessions: Arc<Sessions>,
    blobs: Arc<dyn BlobStore>,
    objects: Arc<dyn hanzod_store::ObjectStore>,
    catalog: Arc<ModelCatalog>,
    settings: UploadSettings,
    permits: Arc<Semaphore>,
    in_flight: Mutex<HashSet<NodeId>>,
    storing: Arc<HashLocks>,
    metrics: Arc<dyn Metrics>,
    /// Which refusals are logged (of uploads and of the ring calls).
    refusals: super::refusal_log::RefusalLog,
}

impl std::fmt::Debug for DeltaUploads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeltaUploads")
            .field("settings", &self.settings)
            .field("available_permits", &self.permits.available_permits())
            .finish_non_exhaustive()
    }
}

/// The stream of a checkpoint download (`FetchCheckpoint`).
pub type CheckpointStream =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::CheckpointChunk, Status>> + Send>>;

impl DeltaUploads {
    /// `FetchCheckpoint` (see `node.proto`): a live session may download any checkpoint
    /// the daemon stored, as a header and chunks of `chunk_bytes`.
    ///
    /// Errors: `INVALID_ARGUMENT` (a field over its limit, [`limits::fetch_checkpoint`],
    /// before anything else), `UNAUTHENTICATED` (no live session), `INVALID_ARGUMENT`
    /// (malformed reference), `NOT_FOUND` (not stored here), `UNAVAILABLE` (the store failed).
    pub async fn fetch_checkpoint(
        &self,
        request: pb::FetchCheckpointRequest,
    ) -> Result<CheckpointStream, Status> {
        limits::fetch_checkpoint(&request).map_err(|e| {
            self.metrics.incr(Counter::RejectedMessages, "too_large", 1);
            Status::from(e)
        })?;
        self.sessions
            .lookup_bytes(&request.session)
            .ok_or_else(|| Status::unauthenticated(hanzod_protocol::status::UNKNOWN_SESSION))?;
        // Downloads share the transfer slots of uploads: a node looping on fetches cannot
        // take more of the daemon than an upload could.
        let permit = self.permits.clone().try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(format!(
                "{} transfers are in progress; retry",
                self.settings.max_concurrent
            ))
        })?;
        use hanzod_store::ObjectError;
        let bytes = match self.objects.get(&request.checkpoint).await {
            Ok(b) => b,
            Err(ObjectError::BadCid { reason: why }) => {
                return Err(Status::invalid_argument(format!(
                    "invalid checkpoint {}: {}",
                    hanzod_protocol::convert::excerpt(request.checkpoint.as_bytes()),
                    hanzod_protocol::convert::excerpt(why.as_bytes())
                )))
            }
            Err(ObjectError::NotFound { cid: _ }) => {
                return Err(Status::not_found(format!(
                    "checkpoint {} is not stored here",
                    request.checkpoint
                )))
            }
            Err(e @ ObjectError::Corrupt { .. }) => {
                tracing::error!(checkpoint = %request.checkpoint, error = %e, "a stored checkpoint is damaged");
                return Err(Status::data_loss(format!("checkpoint store: {e}")));
            }
            Err(e) => return Err(Status::unavailable(format!("checkpoint store: {e}"))),
        };
        let hash: [u8; 32] = Sha256::digest(&bytes).into();
        let header = pb::CheckpointChunk {
            part: Some(pb::checkpoint_chunk::Part::Header(pb::CheckpointHeader {
                checkpoint: request.checkpoint,
                total_bytes: bytes.len() as u64,
                sha256: hash.to_vec(),
            })),
        };
        let chunks = hanzod_protocol::status::byte_chunks(bytes, self.settings.chunk_bytes);
        let data = futures_util::StreamExt::map(tokio_stream::iter(chunks), move |d| {
            let _slot = &permit; // held until the stream is dropped
            Ok(pb::CheckpointChunk {
                part: Some(pb::checkpoint_chunk::Part::Data(d)),
            })
        });
        Ok(Box::pin(futures_util::StreamExt::chain(
            tokio_stream::once(Ok(header)),
            data,
        )))
    }

    /// Uploads for `core`'s jobs by the nodes of `sessions`, checked against `catalog`,
    /// stored in `blobs`; checkpoints are served from `objects`.
    pub fn new(
        core: OrchestratorHandle,
        sessions: Arc<Sessions>,
        blobs: Arc<dyn BlobStore>,
        objects: Arc<dyn hanzod_store::ObjectStore>,
        catalog: Arc<ModelCatalog>,
        settings: UploadSettings,
    ) -> DeltaUploads {
        DeltaUploads {
            metrics: core.metrics(),
            core,
            sessions,
            blobs,
            objects,
            catalog,
            permits: Arc::new(Semaphore::new(settings.max_concurrent.max(1))),
            settings,
            in_flight: Mutex::new(HashSet::new()),
            storing: Arc::default(),
            refusals: Default::default(),
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
        self.metrics.incr(Counter::Deltas, outcome, 1);
        self.metrics
            .incr(Counter::DeltaBytesReceived, outcome, received);
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
                use super::refusal_log::Logged;
                match self.refusals.judge(
                    reason,
                    status.code(),
                    self.core.clock().now().as_millis(),
                ) {
                    Logged::Failure => {
                        tracing::warn!(%node, job = cx.job, epoch = cx.epoch, reason, code = ?status.code(), "delta not accepted: {}", hanzod_protocol::convert::bounded_message(status.message()))
                    }
                    Logged::Refusal { unlogged } => {
                        tracing::info!(%node, job = cx.job, epoch = cx.epoch, reason, code = ?status.code(), unlogged, "delta refused: {}", hanzod_protocol::convert::bounded_message(status.message()))
                    }
                    Logged::Suppressed => {}
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
        let header = match next_chunk(chunks, idle, None).await? {
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
        limits::delta_header(&header).map_err(|e| refusal("invalid", e.into()))?;
        if header.total_bytes < HEADER_LEN as u64 {
            return Err(refusal(
                "invalid",
                Status::invalid_argument(format!(
                    "invalid header.total_bytes: {} is less than the {HEADER_LEN}-byte HZDL header",
                    header.total_bytes
                )),
            ));
        }
        hanzod_protocol::convert::claimed_loss("header.claimed_loss", header.claimed_loss)
            .map_err(|e| refusal("invalid", e.into()))?;
        let (node, key) = self.sessions.lookup_bytes(&header.session).ok_or_else(|| {
            refusal(
                "unknown_session",
                Status::unauthenticated(hanzod_protocol::status::UNKNOWN_SESSION),
            )
        })?;
        cx.node = Some(node);

        let view = self
            .core
            .job(JobId(header.job_id))
            .await
            .map_err(|e| core_refusal(&e))?;
        let model = admit(&header, node, &view, &self.catalog)?;
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

        let budget = Budget::new(
            Instant::now(),
            idle,
            header.total_bytes,
            self.settings.min_bytes_per_s,
        );
        let Received {
            bytes,
            sha256,
            trailer,
        } = receive(chunks, total, idle, &budget, received).await?;

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
        if header.kind == pb::DeltaKind::Merged as i32 {
            return self
                .finish_merged(&header, node, &key, &view, model, bytes, sha256, &trailer)
                .await;
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

        check_format_and_base(bytes.clone(), model, &view, "delta").await?;

        let receipt = DeltaReceipt {
            job: JobId(header.job_id),
            node,
            epoch: header.epoch,
            step: header.step,
            delta_hash: sha256,
            claimed_loss: header.claimed_loss,
            signature: trailer.signature,
        };
        // Its own task: a client that goes away now does not cancel it half done (a blob
        // stored, the refusal's removal not yet made).
        let task = store_and_record(
            self.blobs.clone(),
            self.core.clone(),
            self.storing.clone(),
            bytes,
            receipt,
        );
        tokio::spawn(task).await.map_err(|e| {
            refusal(
                "internal",
                Status::internal(format!("storing the delta did not finish: {e}")),
            )
        })??;
        Ok(pb::DeltaAck {
            delta_hash: sha256.to_vec(),
            accepted: true,
            reason: String::new(),
        })
    }
}

impl DeltaUploads {
    /// The rest of an upload of kind MERGED (a ring round's result, DESIGN §6.4): the
    /// uploader's signature over the merged statement, the format check (an f32 full delta
    /// of the job's model on the current checkpoint version), the blob stored, the core
    /// told ([`RoundMsg::Merged`](hanzod_actors::actor::msg::RoundMsg::Merged)), which
    /// compares it with the round's agreed hash. A refused result's blob is removed unless
    /// it was stored before.
    #[allow(clippy::too_many_arguments)]
    async fn finish_merged(
        &self,
        header: &pb::DeltaHeader,
        node: NodeId,
        key: &ed25519_dalek::VerifyingKey,
        view: &JobView,
        model: ModelSpec,
        bytes: Arc<[u8]>,
        sha256: [u8; 32],
        trailer: &pb::DeltaTrailer,
    ) -> Result<pb::DeltaAck, Refusal> {
        use hanzod_protocol::round::{merged_digest, verify_digest};
        let digest = merged_digest(header.job_id, header.epoch, &sha256);
        verify_digest(key, &digest, &trailer.signature).map_err(|_| {
            refusal(
                "bad_signature",
                Status::unauthenticated(format!(
                    "the merged statement's signature does not verify under node {}'s key",
                    node.short()
                )),
            )
        })?;
        if bytes.get(6) != Some(&DeltaDtype::F32.code()) {
            return Err(refusal(
                "wrong_dtype",
                Status::invalid_argument("a round's result is uploaded as f32"),
            ));
        }
        check_format_and_base(bytes.clone(), model, view, "result").await?;
        let _lock = self.storing.lock(sha256).await;
        let stored_before = self.blobs.contains(&sha256).await.unwrap_or(true);
        self.blobs.put(sha256, bytes).await.map_err(|e| {
            refusal(
                "unavailable",
                Status::unavailable(format!("result not stored: {e}")),
            )
        })?;
        let msg = hanzod_actors::actor::msg::RoundMsg::Merged {
            epoch: header.epoch,
            hash: sha256,
        };
        if let Err(e) = self.core.round(JobId(header.job_id), node, msg).await {
            if !stored_before {
                let _ = self.blobs.remove(&sha256).await;
            }
            return Err(core_refusal(&e));
        }
        Ok(pb::DeltaAck {
            delta_hash: sha256.to_vec(),
            accepted: true,
            reason: String::new(),
        })
    }
}

/// The job-side admission rules of an upload's header (the "job" and "size" rows of the
/// module docs), decided before a single data byte is accepted: the job Running in the
/// header's epoch, the header at that epoch's global step, the job's model in `catalog`,
/// `node` in the job's ring and not delivered yet this epoch, the declared size within the
/// model's bound. Pure: `view` is the job as the core reported it. Returns the model the
/// delta's format is checked against, or the first refusal.
fn admit(
    header: &pb::DeltaHeader,
    node: NodeId,
    view: &JobView,
    catalog: &ModelCatalog,
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
    let local_steps = view.spec.training.local_steps;
    let step = u64::from(header.epoch) * u64::from(local_steps);
    if header.step != step {
        return Err(refusal(
            "wrong_step",
            Status::invalid_argument(format!(
                "invalid header.step: expected {step} (epoch {} × local_steps {local_steps}, the global step this epoch's local run starts at), got {}",
                header.epoch, header.step
            )),
        ));
    }
    let model = catalog.delta_spec(&view.spec.training).map_err(|e| {
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
    let merged = header.kind == pb::DeltaKind::Merged as i32;
    if merged && view.spec.training.aggregation != hanzod_actors::job::Aggregation::Ring {
        return Err(refusal(
            "not_ring",
            Status::failed_precondition(format!(
                "job {} aggregates in star mode: there is no ring round result to upload",
                header.job_id
            )),
        ));
    }
    // A round's result is not the node's own delta: a member that delivered its delta (a
    // spot-checked one) may still be asked for the result.
    if let Some(hash) = view.delivered.get(&node).filter(|_| !merged) {
        return Err(refusal(
            "already_delivered",
            Status::already_exists(format!(
                "node {} already delivered its delta for epoch {} (hash {})",
                node.short(),
                header.epoch,
                hex::encode(hash)
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

/// Stores `bytes` (SHA-256 `receipt.delta_hash`) and records `receipt`, holding the hash's
/// lock. When the core refuses the receipt for certain, the blob is removed again, unless
/// it was stored before (by an earlier upload, for any job) or the job's current receipts
/// name it; when the outcome is unknown it is kept (module docs).
async fn store_and_record(
    blobs: Arc<dyn BlobStore>,
    core: OrchestratorHandle,
    locks: Arc<HashLocks>,
    bytes: Arc<[u8]>,
    receipt: DeltaReceipt,
) -> Result<(), Refusal> {
    let hash = receipt.delta_hash;
    let _lock = locks.lock(hash).await;
    // Unknown counts as stored: never remove what may be someone else's.
    let stored_before = blobs.contains(&hash).await.unwrap_or(true);
    blobs.put(hash, bytes).await.map_err(|e| {
        let status = match &e {
            BlobError::Io(_) => Status::unavailable(format!("delta not stored: {e}")),
            _ => Status::internal(format!("delta not stored: {e}")),
        };
        refusal("store_failed", status)
    })?;
    let (job, node, epoch) = (receipt.job, receipt.node, receipt.epoch);
    let Err(e) = core.submit_delta(receipt).await else {
        return Ok(());
    };
    let refused = core_refusal(&e);
    if stored_before || !certainly_not_recorded(&e) {
        if !stored_before {
            tracing::warn!(node = %node.short(), %job, epoch, delta = %hex::encode(&hash[..8]), error = %e, "receipt outcome unknown; its delta blob is kept");
        }
        return Err(refused);
    }
    let referenced = match core.job(job).await {
        Ok(view) => Ok(view.delivered.values().any(|h| *h == hash)),
        Err(OrchestratorError::Job(JobRequestError::NotFound(_) | JobRequestError::Ended(_))) => {
            Ok(false)
        }
        Err(e) => Err(e),
    };
    match referenced {
        Ok(true) => {}
        Ok(false) => match blobs.remove(&hash).await {
            Ok(()) => {
                tracing::info!(node = %node.short(), %job, epoch, delta = %hex::encode(&hash[..8]), reason = refused.reason, "refused delta removed from the blob store")
            }
            Err(re) => {
                tracing::warn!(node = %node.short(), %job, epoch, delta = %hex::encode(&hash[..8]), reason = refused.reason, error = %re, "refused delta could not be removed from the blob store")
            }
        },
        Err(ve) => {
            tracing::warn!(node = %node.short(), %job, epoch, delta = %hex::encode(&hash[..8]), reason = refused.reason, error = %ve, "refused delta kept: the job's receipts could not be read")
        }
    }
    Err(refused)
}

/// Whether `e`, an answer of `submit_delta`, says for certain that the receipt was not
/// recorded: a refusal by the job. Not so when the event log write failed (it may be
/// durable all the same and replayed) or the job did not answer in time (it may still
/// record it).
fn certainly_not_recorded(e: &OrchestratorError) -> bool {
    match e {
        OrchestratorError::Job(JobRequestError::Store(_)) => false,
        OrchestratorError::Job(_) => true,
        _ => false,
    }
}

/// How long the data phase of one upload may take in all: `idle + total_bytes /
/// min_bytes_per_s` from its start.
#[derive(Debug, Clone, Copy)]
struct Budget {
    deadline: Instant,
    allowance: Duration,
    total_bytes: u64,
    min_bytes_per_s: u64,
}

impl Budget {
    fn new(start: Instant, idle: Duration, total_bytes: u64, min_bytes_per_s: u64) -> Budget {
        let rate = min_bytes_per_s.max(1);
        let transfer_ms = (u128::from(total_bytes) * 1000).div_ceil(u128::from(rate));
        let allowance = idle.saturating_add(Duration::from_millis(
            u64::try_from(transfer_ms).unwrap_or(u64::MAX),
        ));
        let deadline = start
            .checked_add(allowance)
            .unwrap_or_else(|| start + Duration::from_secs(365 * 86_400));
        Budget {
            deadline,
            allowance,
            total_bytes,
            min_bytes_per_s: rate,
        }
    }

    fn exceeded(&self) -> Refusal {
        refusal(
            "too_slow",
            Status::deadline_exceeded(format!(
                "the upload's {} bytes did not arrive within {} ms (upload_idle_ms plus total_bytes at the minimum rate of {} bytes/s); nothing was stored",
                self.total_bytes,
                self.allowance.as_millis(),
                self.min_bytes_per_s
            )),
        )
    }
}

/// The next chunk, waiting at most `idle` and, with a `budget`, not past its deadline;
/// `None` when the client ended the stream.
async fn next_chunk<S>(
    chunks: &mut S,
    idle: Duration,
    budget: Option<&Budget>,
) -> Result<Option<pb::DeltaChunk>, Refusal>
where
    S: Stream<Item = Result<pb::DeltaChunk, Status>> + Unpin,
{
    let idle_at = Instant::now() + idle;
    let (until, overall) = match budget {
        Some(b) if b.deadline < idle_at => (b.deadline, Some(b)),
        _ => (idle_at, None),
    };
    match tokio::time::timeout_at(until, chunks.next()).await {
        Err(_) => Err(match overall {
            Some(b) => b.exceeded(),
            None => refusal(
                "timeout",
                Status::deadline_exceeded(format!(
                    "no upload chunk within {} ms; nothing was stored",
                    idle.as_millis()
                )),
            ),
        }),
        Ok(None) => Ok(None),
        Ok(Some(Ok(c))) => Ok(Some(c)),
        Ok(Some(Err(status))) if super::is_too_large(&status) => Err(refusal(
            "too_large_message",
            Status::resource_exhausted(status.message().to_string()),
        )),
        Ok(Some(Err(status))) => Err(refusal("transport", status)),
    }
}

/// Receives data chunks up to the trailer: exactly `total` bytes, hashed as they arrive,
/// in a [`Buffer`] that grows with the data, each chunk within `idle` of the last and all
/// of them within `budget`. Counts every data byte in `received`.
async fn receive<S>(
    chunks: &mut S,
    total: usize,
    idle: Duration,
    budget: &Budget,
    received: &mut u64,
) -> Result<Received, Refusal>
where
    S: Stream<Item = Result<pb::DeltaChunk, Status>> + Unpin,
{
    use pb::delta_chunk::Part;
    let mut buf = Buffer::new(total);
    let mut hasher = Sha256::new();
    loop {
        let part = match next_chunk(chunks, idle, Some(budget)).await? {
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
                buf.append(data);
            }
            Part::Trailer(trailer) => {
                limits::delta_trailer(&trailer).map_err(|e| refusal("invalid", e.into()))?;
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
                    bytes: buf.finish(),
                    sha256: hasher.finalize().into(),
                    trailer,
                });
            }
        }
    }
}

/// The payload of one upload as it arrives: a `Vec` that grows with the data (at most to
/// twice what it holds, never past `total`, never from the declared size alone). The
/// complete payload is copied once into the shared buffer the blob store keeps: safe code
/// cannot hand a `Vec`'s allocation to an `Arc<[u8]>`, and one copy of bytes that just
/// crossed the network is cheap next to hashing them.
#[derive(Debug)]
struct Buffer {
    bytes: Vec<u8>,
    total: usize,
}

impl Buffer {
    fn new(total: usize) -> Buffer {
        Buffer {
            bytes: Vec::new(),
            total,
        }
    }

    /// Bytes held.
    fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Bytes allocated.
    #[cfg(test)]
    fn allocated(&self) -> usize {
        self.bytes.capacity()
    }

    /// Appends `data` (the caller checked that it fits within `total`).
    fn append(&mut self, data: Vec<u8>) {
        if self.bytes.is_empty() {
            self.bytes = data;
            return;
        }
        let need = self.bytes.len() + data.len();
        if need > self.bytes.capacity() {
            let target = need
                .max(self.bytes.capacity().saturating_mul(2))
                .min(self.total.max(need));
            self.bytes.reserve_exact(target - self.bytes.len());
        }
        self.bytes.extend_from_slice(&data);
    }

    /// The payload, in the blob store's shared form.
    fn finish(self) -> Arc<[u8]> {
        Arc::from(self.bytes)
    }
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

/// The format check ([`check_off_runtime`]) and the base version: an upload (`what`:
/// "delta" or "result") computed against another checkpoint than the job's current one is
/// stale (`FAILED_PRECONDITION`).
async fn check_format_and_base(
    bytes: Arc<[u8]>,
    model: ModelSpec,
    view: &JobView,
    what: &str,
) -> Result<(), Refusal> {
    let base_version = check_off_runtime(bytes, model).await?;
    let current = view.checkpoints.len() as u64;
    if base_version != current {
        return Err(refusal(
            "stale_base",
            Status::failed_precondition(format!(
                "the {what} was computed against checkpoint version {base_version}, the job is at version {current}"
            )),
        ));
    }
    Ok(())
}

/// The metric label of a format-check failure.
fn delta_reason(e: &DeltaError) -> &'static str {
    use DeltaError as D;
    match e {
        D::Truncated { .. } | D::LengthMismatch { .. } => "truncated",
        D::BadMagic(_) | D::UnsupportedVersion(_) | D::UnknownDtype(_) | D::UnknownKind(_) => {
            "bad_header"
        }
        D::HeaderTooLarge { .. }
        | D::SafetensorsHeader { .. }
        | D::OverlappingOrOutOfRange { .. } => "bad_safetensors",
        D::DtypeMismatch { .. } => "wrong_dtype",
        D::KindMismatch { .. } => "wrong_kind",
        D::NonFinite { .. } => "non_finite",
        D::UnknownTensor { .. } => "unknown_tensor",
        D::WrongShape { .. } => "wrong_shape",
        D::MissingTensor { .. } => "missing_tensor",
        D::DuplicateTensor { .. } => "duplicate_tensor",
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
            JobRequestError::NotRing(_) | JobRequestError::RoundStep { .. } => {
                refusal("not_ring", Status::failed_precondition(msg))
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

    // ---- the admission rules (pure) ----

    fn running_view(epoch: u32, members: &[NodeId]) -> JobView {
        let spec = hanzod_actors::job::JobSpec {
            name: "t".into(),
            epochs: 5,
            min_nodes: 1,
            max_nodes: 8,
            min_vram_bytes: 0,
            pending_deadline_ms: 60_000,
            epoch_deadline_ms: 60_000,
            utility: 1.0,
            submitter_stake: hanzod_actors::types::GymWei::gym(10_000),
            training: Default::default(),
        };
        JobView {
            id: JobId(3),
            name: "t".into(),
            phase: JobPhase::Running {
                epoch,
                ring_version: 1,
            },
            epochs: 5,
            ring: Some(hanzod_actors::ports::RingView {
                job: JobId(3),
                version: 1,
                members: members.to_vec(),
                bottleneck_mbps: 100.0,
                estimated_links: 0,
            }),
            deltas_this_epoch: 0,
            delivered: Default::default(),
            checkpoints: vec!["cid-0".into(); epoch as usize],
            summaries: Default::default(),
            spec,
        }
    }

    fn header_for(view: &JobView, epoch: u32, total_bytes: u64) -> pb::DeltaHeader {
        pb::DeltaHeader {
            job_id: view.id.0,
            epoch,
            step: u64::from(epoch) * u64::from(view.spec.training.local_steps),
            total_bytes,
            claimed_loss: 0.5,
            ..Default::default()
        }
    }

    fn refused(r: Result<ModelSpec, Refusal>) -> (&'static str, tonic::Code) {
        let e = r.expect_err("refused");
        (e.reason, e.status.code())
    }

    #[test]
    fn admission_accepts_a_member_at_the_epoch_step_and_returns_the_model() {
        let catalog = ModelCatalog::builtin();
        let node = NodeId([1; 32]);
        let view = running_view(2, &[node, NodeId([2; 32])]);
        let model = admit(&header_for(&view, 2, 1_000), node, &view, &catalog).unwrap();
        assert_eq!(model, catalog.check_training(&view.spec.training).unwrap());
    }

    #[test]
    fn admission_refuses_each_rule_with_its_label_and_code() {
        use tonic::Code;
        let catalog = ModelCatalog::builtin();
        let node = NodeId([1; 32]);
        let view = running_view(2, &[node]);
        let ok = header_for(&view, 2, 1_000);

        let other_epoch = header_for(&view, 1, 1_000);
        assert_eq!(
            refused(admit(&other_epoch, node, &view, &catalog)),
            ("wrong_epoch", Code::FailedPrecondition)
        );
        let mut aggregating = view.clone();
        aggregating.phase = JobPhase::Aggregating {
            epoch: 2,
            ring_version: 1,
        };
        assert_eq!(
            refused(admit(&ok, node, &aggregating, &catalog)),
            ("not_running", Code::FailedPrecondition)
        );
        let wrong_step = pb::DeltaHeader {
            step: ok.step + 1,
            ..ok.clone()
        };
        assert_eq!(
            refused(admit(&wrong_step, node, &view, &catalog)),
            ("wrong_step", Code::InvalidArgument)
        );
        let mut unknown_model = view.clone();
        unknown_model.spec.training.model = "nosuch".into();
        assert_eq!(
            refused(admit(&ok, node, &unknown_model, &catalog)),
            ("unknown_model", Code::FailedPrecondition)
        );
        assert_eq!(
            refused(admit(&ok, NodeId([9; 32]), &view, &catalog)),
            ("not_member", Code::PermissionDenied)
        );
        let mut delivered = view.clone();
        delivered.delivered.insert(node, [7; 32]);
        let (reason, code) = refused(admit(&ok, node, &delivered, &catalog));
        assert_eq!((reason, code), ("already_delivered", Code::AlreadyExists));
        let max = catalog
            .get(&view.spec.training.model)
            .unwrap()
            .max_delta_bytes(DeltaDtype::F32);
        assert!(admit(&header_for(&view, 2, max), node, &view, &catalog).is_ok());
        assert_eq!(
            refused(admit(&header_for(&view, 2, max + 1), node, &view, &catalog)),
            ("too_large", Code::ResourceExhausted)
        );
    }

    #[test]
    fn admission_checks_run_in_the_documented_order() {
        // A header wrong in every way is refused for the first rule of the table.
        let catalog = ModelCatalog::builtin();
        let mut view = running_view(2, &[NodeId([2; 32])]);
        view.spec.training.model = "nosuch".into();
        let header = pb::DeltaHeader {
            step: 1,
            total_bytes: u64::MAX,
            ..header_for(&view, 1, 0)
        };
        assert_eq!(
            refused(admit(&header, NodeId([1; 32]), &view, &catalog)).0,
            "wrong_epoch"
        );
        let header = pb::DeltaHeader { epoch: 2, ..header };
        assert_eq!(
            refused(admit(&header, NodeId([1; 32]), &view, &catalog)).0,
            "wrong_step"
        );
    }

    const IDLE: Duration = Duration::from_millis(30_000);

    /// The budget of `total` bytes at 1 MiB/s from now.
    fn budget(idle: Duration, total: usize) -> Budget {
        Budget::new(Instant::now(), idle, total as u64, 1 << 20)
    }

    async fn run(chunks: Vec<Item>, total: usize) -> (Result<Received, Refusal>, u64) {
        let mut s = futures_util::stream::iter(chunks);
        let mut received = 0;
        let b = budget(IDLE, total);
        let r = receive(&mut s, total, IDLE, &b, &mut received).await;
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
        assert_eq!(&*r.bytes, payload.as_slice());
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

    /// A trailer's hash and signature are held to their sizes before the hash is compared
    /// (a mismatch quotes it in hex) or the signature verified.
    #[tokio::test]
    async fn an_oversized_trailer_is_refused_before_its_hash_is_compared_or_quoted() {
        let oversized = [
            (vec![0x1b; 1 << 20], vec![7; 64], "trailer.sha256"),
            (vec![0; 32], vec![7; 65], "trailer.signature"),
        ];
        for (sha256, signature, field) in oversized {
            let t = Ok(pb::DeltaChunk {
                part: Some(Part::Trailer(pb::DeltaTrailer { sha256, signature })),
            });
            let (r, _) = run(vec![data(&[1; 100]), t], 100).await;
            let f = r.expect_err(field);
            assert_eq!(
                (f.reason, f.status.code()),
                ("invalid", tonic::Code::InvalidArgument)
            );
            assert!(f.status.message().contains(field), "{f:?}");
            assert!(f.status.message().len() < 100, "{f:?}");
        }
        // At the limits, the trailer is received (its hash is compared later).
        let (r, _) = run(vec![data(&[1; 100]), trailer(&[0; 32])], 100).await;
        assert!(r.is_ok(), "{r:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_upload_ends_deadline_exceeded_after_the_idle_time() {
        // Two chunks, then silence (the stream never ends).
        let s = futures_util::stream::iter(vec![data(&[1; 10]), data(&[2; 10])])
            .chain(futures_util::stream::pending());
        let mut s = std::pin::pin!(s);
        let start = tokio::time::Instant::now();
        let mut received = 0;
        let idle = Duration::from_millis(250);
        let r = receive(&mut s, 100, idle, &budget(idle, 100), &mut received).await;
        let f = r.expect_err("stalled");
        assert_eq!(f.reason, "timeout");
        assert_eq!(f.status.code(), tonic::Code::DeadlineExceeded);
        assert_eq!(start.elapsed(), Duration::from_millis(250));
        assert_eq!(received, 20);
    }

    #[tokio::test(start_paused = true)]
    async fn the_idle_timer_restarts_with_every_chunk() {
        // A chunk every 200 ms with a 250 ms idle timeout: never idle long enough (and the
        // overall allowance, at 1 byte/s, is 100 s).
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
        let idle = Duration::from_millis(250);
        let r = receive(
            &mut s,
            100,
            idle,
            &Budget::new(Instant::now(), idle, 100, 1),
            &mut received,
        )
        .await;
        assert_eq!(r.unwrap().bytes.len(), 100);
    }

    /// 10 bytes every 200 ms, never idle for 250 ms: 100 bytes would take 2 s.
    fn trickle() -> impl Stream<Item = Item> {
        futures_util::stream::iter(0..11).then(|i| async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if i < 10 {
                data(&[i as u8; 10])
            } else {
                trailer(&[0; 32])
            }
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_trickling_upload_ends_deadline_exceeded_after_its_overall_allowance() {
        // At least 100 bytes/s: 250 ms + 100 bytes / 100 bytes/s = 1.25 s for the data.
        let idle = Duration::from_millis(250);
        let start = Instant::now();
        let b = Budget::new(start, idle, 100, 100);
        let mut s = std::pin::pin!(trickle());
        let mut received = 0;
        let f = receive(&mut s, 100, idle, &b, &mut received)
            .await
            .expect_err("too slow");
        assert_eq!(f.reason, "too_slow");
        assert_eq!(f.status.code(), tonic::Code::DeadlineExceeded);
        assert!(f.status.message().contains("within 1250 ms"), "{f:?}");
        assert!(f.status.message().contains("100 bytes/s"), "{f:?}");
        assert_eq!(start.elapsed(), Duration::from_millis(1250));
        // The chunks at 200, 400, …, 1200 ms arrived.
        assert_eq!(received, 60);

        // At least 50 bytes/s: 250 ms + 2 s is enough for the same trickle.
        let b = Budget::new(Instant::now(), idle, 100, 50);
        let mut s = std::pin::pin!(trickle());
        let mut received = 0;
        let r = receive(&mut s, 100, idle, &b, &mut received).await;
        assert_eq!(r.expect("in time").bytes.len(), 100);
    }

    #[test]
    fn the_allowance_is_the_idle_time_plus_the_transfer_at_the_minimum_rate() {
        let now = Instant::now();
        let idle = Duration::from_millis(30_000);
        let b = Budget::new(now, idle, 17 << 20, 1 << 20);
        assert_eq!(b.allowance, Duration::from_millis(30_000 + 17_000));
        assert_eq!(b.deadline, now + b.allowance);
        // Rounded up to the ms; a rate of 0 is taken as 1 byte/s; huge sizes saturate.
        let b = Budget::new(now, idle, 1, 3);
        assert_eq!(b.allowance, Duration::from_millis(30_334));
        assert_eq!(
            Budget::new(now, idle, 5, 0).allowance,
            Duration::from_millis(35_000)
        );
        assert!(Budget::new(now, idle, u64::MAX, 1).deadline > now);
    }

    #[test]
    fn the_buffer_never_grows_past_the_declared_total_nor_twice_the_data() {
        let total = 1000;
        let mut buf = Buffer::new(total);
        let mut payload = Vec::new();
        for i in 0..100u8 {
            buf.append(vec![i; 10]);
            payload.extend_from_slice(&[i; 10]);
            assert_eq!(buf.len(), payload.len());
            assert!(buf.allocated() <= total, "{} > {total}", buf.allocated());
            assert!(
                buf.allocated() <= 2 * payload.len().max(10),
                "{}",
                buf.allocated()
            );
        }
        assert_eq!(&*buf.finish(), payload.as_slice());
    }

    #[test]
    fn the_buffer_holds_exactly_the_data_however_it_is_chunked() {
        let payload: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
        for sizes in [
            vec![1000],
            vec![1, 999],
            vec![999, 1],
            vec![500, 500],
            vec![100, 150, 250, 499, 1],
            vec![3; 334],
        ] {
            let mut buf = Buffer::new(payload.len());
            let mut at = 0;
            for n in sizes.iter().copied() {
                let n = n.min(payload.len() - at);
                buf.append(payload[at..at + n].to_vec());
                at += n;
            }
            assert_eq!(at, payload.len());
            assert_eq!(&*buf.finish(), payload.as_slice(), "{sizes:?}");
        }
    }

    #[test]
    fn every_delta_error_has_a_label() {
        let e = DeltaError::NonFinite {
            tensor: "fc1.weight".into(),
            index: 3,
        };
        assert_eq!(delta_reason(&e), "non_finite");
        assert_eq!(
            delta_reason(&DeltaError::UnknownTensor { tensor: "x".into() }),
            "unknown_tensor"
        );
    }
}
