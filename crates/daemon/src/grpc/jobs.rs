//! `hanzod.v1.JobService` and `hanzod.v1.AdminService` (paper §3; DESIGN §5).

use hanzod_actors::ports::Counter;
use std::sync::Arc;

use hanzod_actors::actor::Notice;
use hanzod_actors::ports::Ledger;
use hanzod_actors::types::{JobId, NodeId};
use hanzod_actors::OrchestratorHandle;
use hanzod_proto::v1 as pb;
use hanzod_proto::v1::admin_service_server::AdminService;
use hanzod_proto::v1::job_service_server::JobService;
use tokio::sync::{broadcast, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::admission::{self, AdmissionSettings};
use super::sessions::Sessions;
use super::{job_request_status, status_of};
use hanzod_protocol::convert;
use hanzod_train::catalog::{CatalogError, ModelCatalog};

/// The spot-check commitment of a job's epoch (DESIGN §6): `SHA-256(secret)`, 32 bytes.
pub type Commitments = Arc<dyn Fn(JobId, u32) -> [u8; 32] + Send + Sync>;

/// The JobService implementation.
#[derive(Clone)]
pub struct JobServiceImpl {
    core: OrchestratorHandle,
    sessions: Arc<Sessions>,
    catalog: Arc<ModelCatalog>,
    objects: Arc<dyn hanzod_store::ObjectStore>,
    admission: AdmissionSettings,
    commitments: Commitments,
    shutdown: watch::Receiver<bool>,
}

/// What a [`JobServiceImpl`] checks submitted jobs against besides the core.
#[derive(Debug, Clone)]
pub struct JobChecks {
    /// The models and datasets jobs may name.
    pub catalog: Arc<ModelCatalog>,
    /// Where a job's `training.base` checkpoint, and the `config.json` a
    /// `training.architecture` CID names, must be (the daemon's object store).
    pub objects: Arc<dyn hanzod_store::ObjectStore>,
    /// The validation budget.
    pub admission: AdmissionSettings,
}

impl JobServiceImpl {
    /// A service over `core` accepting jobs whose model and dataset `checks.catalog` knows,
    /// whose epoch validation fits `checks.admission`'s budget and whose `training.base`,
    /// if any, is a checkpoint of the job's model in `checks.objects` (where a
    /// `training.architecture` CID is resolved to its `config.json` text); showing each running
    /// epoch's spot-check commitment from `commitments`; watch streams end `UNAVAILABLE`
    /// when `shutdown` turns true.
    pub fn new(
        core: OrchestratorHandle,
        sessions: Arc<Sessions>,
        checks: JobChecks,
        commitments: Commitments,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        JobServiceImpl {
            core,
            sessions,
            catalog: checks.catalog,
            objects: checks.objects,
            admission: checks.admission,
            commitments,
            shutdown,
        }
    }

    /// A job on the wire, with the spot-check commitment of the epoch it is in.
    fn wire(&self, view: &hanzod_actors::actor::job::JobView) -> pb::Job {
        let mut job = convert::job(view, |n| self.sessions.endpoint(n));
        use hanzod_actors::job::JobPhase;
        if let JobPhase::Running { epoch, .. } | JobPhase::Aggregating { epoch, .. } = view.phase {
            job.spot_check_commitment = (self.commitments)(view.id, epoch).to_vec();
        }
        job
    }

    async fn job(&self, id: u64) -> Result<pb::Job, Status> {
        let view = match self.core.job(JobId(id)).await {
            Ok(view) => view,
            // An unknown id says why (an earlier run's job, one not submitted yet).
            Err(e) => {
                return Err(refused(
                    &self.core,
                    job_request_status(&self.core, &e).await,
                ))
            }
        };
        Ok(self.wire(&view))
    }
}

#[tonic::async_trait]
impl JobService for JobServiceImpl {
    async fn submit_job(
        &self,
        request: Request<pb::SubmitJobRequest>,
    ) -> Result<Response<pb::SubmitJobResponse>, Status> {
        let mut spec = convert::job_spec(request.get_ref().spec.as_ref())
            .map_err(|e| refused(&self.core, e.into()))?;
        // An architecture given as the CID of a config.json in the object store becomes
        // its text: every check below, the job as stored and its nodes see only the text.
        let architecture = admission::resolve_architecture(&*self.objects, &mut spec.training)
            .await
            .map_err(|e| refused(&self.core, e.status()))?;
        // A job whose deltas nothing could check (or whose data nobody has) is refused now,
        // not when its first delta arrives.
        let model = self.catalog.check_training(&spec.training).map_err(|e| {
            let field = match e {
                CatalogError::UnknownModel { .. } => "spec.training.model",
                CatalogError::Architecture(_) => "spec.training.architecture",
                CatalogError::Lora(_) => "spec.training.lora",
                CatalogError::UnknownDataset { .. } => "spec.training.dataset",
            };
            refused(
                &self.core,
                Status::invalid_argument(format!("invalid {field}: {e}")),
            )
        })?;
        // And one the validator could not replay (no trainer for the model, steps or batch
        // beyond the bounds that keep a spot-check cheap, rates that are not f32), then one
        // whose validation would cost more than the budget (DESIGN §5).
        // A language model's first recipe tokenizes its corpus (seconds): off the runtime.
        let (job, rate) = (spec.clone(), self.admission.spot_check_rate);
        let resolved = tokio::task::spawn_blocking(move || {
            let trainer = hanzod_train::recipe::trainer_for(&job.training, &model, JobId(0))
                .map_err(|e| Status::invalid_argument(format!("invalid spec.training: {e}")))?;
            let work = admission::validation_work(&trainer, &job, rate)
                .map_err(|e| Status::internal(format!("validation budget: {e}")))?;
            Ok::<_, Status>((trainer.layout(), work))
        })
        .await
        .map_err(|e| refused(&self.core, Status::internal(format!("recipe check: {e}"))))?;
        let (layout, work) = resolved.map_err(|s| refused(&self.core, s))?;
        admission::check_budget(&work, &self.admission)
            .map_err(|e| refused(&self.core, e.status()))?;
        // A base checkpoint must be here, be what its CID names, and load as this model.
        if let Some(base) = &spec.training.base {
            admission::check_base(&*self.objects, base, layout, &spec.training.model)
                .await
                .map_err(|e| refused(&self.core, e.status()))?;
        }
        let (name, spec_base) = (spec.name.clone(), spec.training.base.clone());
        let id = self
            .core
            .submit_job(spec)
            .await
            .map_err(|e| refused(&self.core, status_of(&e)))?;
        tracing::info!(
            job = id.0,
            name,
            base = spec_base.as_deref().map(admission::quote_cid),
            architecture = architecture.as_deref().map(admission::quote_cid),
            "job submitted"
        );
        Ok(Response::new(pb::SubmitJobResponse { job_id: id.0 }))
    }

    async fn get_job(
        &self,
        request: Request<pb::GetJobRequest>,
    ) -> Result<Response<pb::Job>, Status> {
        self.job(request.get_ref().job_id).await.map(Response::new)
    }

    async fn list_jobs(
        &self,
        _request: Request<pb::ListJobsRequest>,
    ) -> Result<Response<pb::ListJobsResponse>, Status> {
        let jobs = self
            .core
            .jobs()
            .await
            .map_err(|e| refused(&self.core, status_of(&e)))?;
        Ok(Response::new(pb::ListJobsResponse {
            jobs: jobs.iter().map(|j| self.wire(j)).collect(),
        }))
    }

    type WatchJobStream = ReceiverStream<Result<pb::JobEvent, Status>>;

    async fn watch_job(
        &self,
        request: Request<pb::WatchJobRequest>,
    ) -> Result<Response<Self::WatchJobStream>, Status> {
        let id = request.get_ref().job_id;
        // Subscribe before the snapshot, so no change between the two is missed.
        let mut notices = self.core.subscribe();
        let first = self.job(id).await?;
        let (tx, rx) = mpsc::channel(64);
        let this = self.clone();
        let mut shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            let mut last = first.clone();
            if tx
                .send(Ok(pb::JobEvent {
                    job: Some(first),
                    change: "snapshot".into(),
                    ring_change: None,
                }))
                .await
                .is_err()
            {
                return;
            }
            loop {
                if is_terminal(&last) {
                    return;
                }
                let (change, ring_change) = tokio::select! {
                    _ = tx.closed() => return,
                    _ = hanzod_protocol::status::stopped(&mut shutdown) => {
                        let _ = tx.send(Err(Status::unavailable("orchestrator shutting down"))).await;
                        return;
                    }
                    n = notices.recv() => match n {
                        Ok(Notice::JobPhase { job, .. }) if job.0 == id => ("phase", None),
                        Ok(Notice::RingChanged { ring, removed, added, repair_ms }) if ring.job.0 == id => {
                            ("ring", Some(convert::ring_change(&ring, &removed, &added, repair_ms)))
                        }
                        Ok(_) => continue,
                        // Missed notices: resend the job as it is now.
                        Err(broadcast::error::RecvError::Lagged(_)) => ("snapshot", None),
                        Err(broadcast::error::RecvError::Closed) => {
                            let _ = tx.send(Err(Status::unavailable("orchestrator stopped"))).await;
                            return;
                        }
                    },
                };
                match this.job(id).await {
                    // A ring change is sent even when an earlier message already showed
                    // the new ring: who left and joined is only in this one.
                    Ok(job) if job != last || ring_change.is_some() => {
                        last = job.clone();
                        if tx
                            .send(Ok(pb::JobEvent {
                                job: Some(job),
                                change: change.into(),
                                ring_change,
                            }))
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(status) => {
                        let _ = tx.send(Err(status)).await;
                        return;
                    }
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn cancel_job(
        &self,
        request: Request<pb::CancelJobRequest>,
    ) -> Result<Response<pb::CancelJobResponse>, Status> {
        let id = request.get_ref().job_id;
        if let Err(e) = self.core.cancel_job(JobId(id)).await {
            return Err(refused(
                &self.core,
                job_request_status(&self.core, &e).await,
            ));
        }
        tracing::info!(job = id, "job cancelled");
        Ok(Response::new(pb::CancelJobResponse {}))
    }
}

/// Counts a refused job or admin request in `rejected_messages{reason}` (the reason is the
/// status code, e.g. `not_found`) and logs it at debug level; returns the status.
fn refused(core: &OrchestratorHandle, status: Status) -> Status {
    let reason = match status.code() {
        tonic::Code::InvalidArgument => "invalid",
        tonic::Code::NotFound => "not_found",
        tonic::Code::FailedPrecondition => "failed_precondition",
        tonic::Code::Unavailable => "unavailable",
        tonic::Code::PermissionDenied => "permission_denied",
        tonic::Code::AlreadyExists => "already_exists",
        tonic::Code::ResourceExhausted => "resource_exhausted",
        tonic::Code::DataLoss => "data_loss",
        _ => "other",
    };
    core.metrics().incr(Counter::RejectedMessages, reason, 1);
    // A message may quote the caller's input at second hand (a JSON error naming the value
    // it refused): bounded and escaped before it is logged or sent back.
    let message = convert::bounded_message(status.message());
    tracing::debug!(reason, "request refused: {message}");
    if message == status.message() {
        return status;
    }
    Status::new(status.code(), message)
}

fn is_terminal(job: &pb::Job) -> bool {
    use pb::job_phase::Kind;
    job.phase
        .as_ref()
        .is_some_and(|p| p.kind == Kind::Published as i32 || p.kind == Kind::Failed as i32)
}

/// The AdminService implementation.
#[derive(Clone)]
pub struct AdminServiceImpl {
    core: OrchestratorHandle,
    sessions: Arc<Sessions>,
    ledger: Option<Arc<dyn Ledger>>,
    orchestrator: [u8; 32],
}

impl AdminServiceImpl {
    /// A service over `core`, answering publication queries from `ledger` (none:
    /// `ListPublications` is UNIMPLEMENTED) with `orchestrator`, this orchestrator's public
    /// key.
    pub fn new(
        core: OrchestratorHandle,
        sessions: Arc<Sessions>,
        ledger: Option<Arc<dyn Ledger>>,
        orchestrator: [u8; 32],
    ) -> Self {
        AdminServiceImpl {
            core,
            sessions,
            ledger,
            orchestrator,
        }
    }
}

impl AdminServiceImpl {
    /// Why `n` cannot be placed in a new job now, in words (paper §3.3; None when it can).
    fn ineligible(&self, n: &hanzod_actors::sched::NodeView) -> Option<String> {
        let rules = self.core.config().eligibility.rules();
        hanzod_actors::sched::placement_blocker(&rules, n, self.core.clock().now())
            .map(|why| why.to_string())
    }
}

#[tonic::async_trait]
impl AdminService for AdminServiceImpl {
    async fn list_nodes(
        &self,
        _request: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::ListNodesResponse>, Status> {
        let nodes = self
            .core
            .nodes()
            .await
            .map_err(|e| refused(&self.core, status_of(&e)))?;
        let endpoints = self.sessions.endpoints();
        Ok(Response::new(pb::ListNodesResponse {
            nodes: nodes
                .iter()
                .map(|n| {
                    let endpoint = endpoints.get(&n.id).cloned().unwrap_or_default();
                    convert::node(n, endpoint, self.ineligible(n))
                })
                .collect(),
        }))
    }

    async fn get_node(
        &self,
        request: Request<pb::GetNodeRequest>,
    ) -> Result<Response<pb::Node>, Status> {
        let id: NodeId = convert::node_id("node_id", &request.get_ref().node_id)
            .map_err(|e| refused(&self.core, e.into()))?;
        let nodes = self
            .core
            .nodes()
            .await
            .map_err(|e| refused(&self.core, status_of(&e)))?;
        let n = nodes.iter().find(|n| n.id == id).ok_or_else(|| {
            refused(
                &self.core,
                Status::not_found(format!("node {id} is not registered")),
            )
        })?;
        Ok(Response::new(convert::node(
            n,
            self.sessions.endpoint(&id),
            self.ineligible(n),
        )))
    }

    async fn get_ring(
        &self,
        request: Request<pb::GetRingRequest>,
    ) -> Result<Response<pb::Ring>, Status> {
        let id = request.get_ref().job_id;
        let ring = self
            .core
            .ring(JobId(id))
            .await
            .map_err(|e| refused(&self.core, status_of(&e)))?
            .ok_or_else(|| {
                refused(
                    &self.core,
                    Status::not_found(format!("job {id} has no ring")),
                )
            })?;
        Ok(Response::new(convert::ring(&ring, |n| {
            self.sessions.endpoint(n)
        })))
    }

    async fn list_publications(
        &self,
        request: Request<pb::ListPublicationsRequest>,
    ) -> Result<Response<pb::ListPublicationsResponse>, Status> {
        let Some(ledger) = &self.ledger else {
            return Err(Status::unimplemented(
                "this orchestrator keeps no ledger of publications",
            ));
        };
        let q = request.into_inner();
        let all = ledger.publications().await.map_err(|e| {
            let status = Status::unavailable(format!("ledger: {e}"));
            tracing::warn!(error = %e, "listing publications");
            status
        })?;
        let publications = all
            .iter()
            .filter(|p| q.cid.is_empty() || p.record.cid == q.cid)
            .filter(|p| q.job_id.is_none_or(|j| p.record.job.0 == j))
            .filter(|p| q.epoch.is_none_or(|e| p.record.epoch == e))
            .map(convert::publication)
            .collect();
        Ok(Response::new(pb::ListPublicationsResponse {
            publications,
            orchestrator: self.orchestrator.to_vec(),
        }))
    }
}
