//! Full-node recovery (paper §10, the "full node failure" row; paper §1.1 "deterministic
//! state: the orchestrator's state is a pure function of the on-chain event log plus
//! submitted deltas"): an orchestrator that starts on an **empty** state store rebuilds each
//! job's progress from the chain and the object store, and resumes every unfinished job
//! from its last published epoch.
//!
//! From the chain: the publication records signed by this orchestrator's key (records by
//! any other key are ignored: anyone holding the orchestrator stake can record), and the
//! reward batches (which epochs were paid). From the object store: the `config.json` of
//! the last published epoch, whose `hanzod_job` names the job's spec
//! ([`crate::sink::model_config_json`]). Each job becomes one
//! `JobSubmitted { resumed }` event in the store: its published checkpoints in epoch
//! order, from epoch 0 up to the first gap; the job trains from the next epoch, its nodes
//! and the validator starting from the last checkpoint's weights, fetched by CID.
//!
//! What is lost is what the paper's table says: the epoch in flight (its deltas are
//! trained again). A settlement the crash cut short (an epoch recorded but not yet paid)
//! is reported, not repaid: its scores were in the lost store. A job found on chain that
//! cannot be rebuilt (its `config.json` unreachable) is logged as failed, keeping its id.
//! The chain does not know a job was cancelled or failed: such a job, if it published an
//! epoch, is resumed.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hanzod_actors::events::Event;
use hanzod_actors::job::JobSpec;
use hanzod_actors::ports::{Ledger, StateStore};
use hanzod_actors::publication::SignedPublication;
use hanzod_actors::types::{JobId, Timestamp};
use hanzod_store::ObjectStore;

/// One job rebuilt from the chain.
#[derive(Debug, Clone, PartialEq)]
pub struct RecoveredJob {
    /// The job.
    pub job: JobId,
    /// Its spec, from the last checkpoint's `config.json`.
    pub spec: JobSpec,
    /// The checkpoints (CIDs) of epochs `0..checkpoints.len()`, in order.
    pub checkpoints: Vec<String>,
    /// The epochs the chain shows paid.
    pub paid: Vec<u32>,
    /// Epochs recorded but not paid (their settlement was cut short).
    pub unpaid: Vec<u32>,
}

impl RecoveredJob {
    /// The epoch the job trains next (`checkpoints.len()`); at or past `spec.epochs` the
    /// job is Published.
    pub fn next_epoch(&self) -> u32 {
        u32::try_from(self.checkpoints.len()).unwrap_or(u32::MAX)
    }
}

/// What [`rebuild`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct Recovery {
    /// The jobs written to the store, by id.
    pub jobs: Vec<RecoveredJob>,
    /// Jobs whose records were found but could not be rebuilt, and why.
    pub skipped: Vec<(JobId, String)>,
    /// How long reading the chain and the object store and writing the store took.
    pub took: Duration,
}

/// Why [`rebuild`] could not run.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum RecoveryError {
    /// The store already holds events: it is not rebuilt over.
    #[error("the state store is not empty (last seq {0}); nothing is rebuilt over a log")]
    NotEmpty(u64),
    /// The chain could not be read.
    #[error("reading the chain: {0}")]
    Chain(#[source] hanzod_actors::ports::LedgerError),
    /// The store refused a write.
    #[error("writing the state store: {0}")]
    Store(#[source] hanzod_actors::ports::StoreError),
}

/// Rebuilds into the empty `store` every job that `signer` (the orchestrator's Ed25519
/// public key) published on `ledger` (see the module docs), stamping the events `at`.
///
/// Errors: [`RecoveryError::NotEmpty`] when `store` holds events; the chain or the store
/// failing. A job whose config cannot be fetched or parsed is skipped (in
/// [`Recovery::skipped`]), not fatal.
pub async fn rebuild(
    ledger: &dyn Ledger,
    objects: &dyn ObjectStore,
    store: &dyn StateStore,
    signer: [u8; 32],
    at: Timestamp,
) -> Result<Recovery, RecoveryError> {
    let started = Instant::now();
    let last = store.last_seq().await.map_err(RecoveryError::Store)?;
    if last > 0 {
        return Err(RecoveryError::NotEmpty(last));
    }
    let publications = ledger.publications().await.map_err(RecoveryError::Chain)?;
    // The batches only say which epochs were paid (reported, not acted on): a chain whose
    // log queries fail (a provider capping eth_getLogs ranges) does not stop the rebuild.
    let batches = ledger.reward_batches().await.unwrap_or_else(|e| {
        tracing::warn!(error = %e, "cannot read the reward batches; paid epochs unknown");
        Vec::new()
    });
    let mut by_job: BTreeMap<JobId, BTreeMap<u32, SignedPublication>> = BTreeMap::new();
    for p in publications {
        if p.signer != signer || hanzod_protocol::record::check_signature(&p).is_err() {
            continue;
        }
        by_job
            .entry(p.record.job)
            .or_default()
            .entry(p.record.epoch)
            .or_insert(p);
    }
    let mut out = Recovery {
        jobs: Vec::new(),
        skipped: Vec::new(),
        took: Duration::ZERO,
    };
    let mut skipped: Vec<(JobId, usize, String)> = Vec::new();
    for (job, epochs) in by_job {
        // Epochs 0, 1, … up to the first gap.
        let contiguous: Vec<&SignedPublication> = (0u32..).map_while(|e| epochs.get(&e)).collect();
        let Some(last) = contiguous.last() else {
            skipped.push((job, 0, "no record of epoch 0".into()));
            continue;
        };
        let config = match objects.get(&last.record.config_cid).await {
            Ok(c) => c,
            Err(e) => {
                out.skipped
                    .push((job, format!("config.json {}: {e}", last.record.config_cid)));
                continue;
            }
        };
        let spec = match crate::sink::job_of_config(&config) {
            Some((id, spec)) if id == job => spec,
            Some((id, _)) => {
                skipped.push((
                    job,
                    contiguous.len(),
                    format!("its config.json names job {id}"),
                ));
                continue;
            }
            None => {
                skipped.push((
                    job,
                    contiguous.len(),
                    "its config.json names no job spec".into(),
                ));
                continue;
            }
        };
        let checkpoints: Vec<String> = contiguous.iter().map(|p| p.record.cid.clone()).collect();
        let paid: Vec<u32> = batches
            .iter()
            .filter(|b| b.job == job)
            .map(|b| b.epoch)
            .collect();
        let unpaid = (0..checkpoints.len() as u32)
            .filter(|e| !paid.contains(e))
            .collect();
        store
            .append(
                at,
                Event::JobSubmitted {
                    job,
                    spec: Box::new(spec.clone()),
                    resumed: checkpoints.clone(),
                },
            )
            .await
            .map_err(RecoveryError::Store)?;
        out.jobs.push(RecoveredJob {
            job,
            spec,
            checkpoints,
            paid,
            unpaid,
        });
    }
    // A job found but not rebuilt still holds its id: it is logged as failed, so a new job
    // never reuses an id whose (job, epoch) records and payments are on chain.
    for (job, published, why) in skipped {
        let placeholder = JobSpec {
            name: format!("job {job}, found on chain but not rebuilt"),
            epochs: u32::try_from(published)
                .unwrap_or(u32::MAX)
                .saturating_add(1),
            min_nodes: 1,
            max_nodes: 1,
            min_vram_bytes: 0,
            pending_deadline_ms: 1,
            epoch_deadline_ms: 1,
            utility: 1.0,
            submitter_stake: hanzod_actors::types::GymWei(0),
            training: Default::default(),
        };
        for event in [
            Event::JobSubmitted {
                job,
                spec: Box::new(placeholder),
                resumed: Vec::new(),
            },
            Event::Job {
                job,
                event: hanzod_actors::job::JobEvent::Fail {
                    reason: hanzod_actors::job::FailReason::Other(format!(
                        "found on chain but not rebuilt: {why}"
                    )),
                },
            },
        ] {
            store
                .append(at, event)
                .await
                .map_err(RecoveryError::Store)?;
        }
        out.skipped.push((job, why));
    }
    out.took = started.elapsed();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use hanzod_actors::ports::memory::{MemoryChain, MemoryStateStore};
    use hanzod_actors::publication::PublicationRecord;
    use hanzod_protocol::identity::Identity;
    use hanzod_store::MemoryObjectStore;

    fn spec() -> JobSpec {
        JobSpec {
            name: "recovered".into(),
            epochs: 4,
            min_nodes: 1,
            max_nodes: 2,
            min_vram_bytes: 0,
            pending_deadline_ms: 60_000,
            epoch_deadline_ms: 60_000,
            utility: 1.0,
            submitter_stake: hanzod_actors::types::GymWei::gym(100_000),
            training: Default::default(),
        }
    }

    async fn publish(
        chain: &MemoryChain,
        objects: &MemoryObjectStore,
        key: &Identity,
        job: u64,
        epoch: u32,
        config_job: u64,
    ) -> String {
        let model = hanzod_train::catalog::ModelCatalog::builtin();
        let model_spec = model.get("wine-mlp").expect("built-in");
        let config = crate::sink::model_config_json(
            "wine-mlp",
            model_spec,
            None,
            Some((JobId(config_job), &spec())),
        );
        let config_cid = objects.put(Bytes::from(config)).await.expect("put");
        let cid = objects
            .put(Bytes::from(format!("weights {job} {epoch}")))
            .await
            .expect("put");
        let record = PublicationRecord {
            job: JobId(job),
            epoch,
            cid: cid.clone(),
            config_cid,
            card_cid: "bafkcard".into(),
            hf_repo: String::new(),
            quality: 0.5,
            timestamp: Timestamp(1),
        };
        chain
            .record_publication(&hanzod_protocol::record::sign(record, key))
            .await
            .expect("recorded");
        cid
    }

    #[tokio::test]
    async fn rebuilds_jobs_from_own_records_up_to_the_first_gap() {
        let (chain, objects, store) = (
            MemoryChain::with_default_stake(hanzod_actors::types::GymWei::gym(10_000)),
            MemoryObjectStore::new(),
            MemoryStateStore::new(),
        );
        let me = Identity::from_seed([1; 32]);
        let stranger = Identity::from_seed([2; 32]);
        let c0 = publish(&chain, &objects, &me, 1, 0, 1).await;
        let c1 = publish(&chain, &objects, &me, 1, 1, 1).await;
        // Epoch 3 without epoch 2: a gap; ignored past it.
        publish(&chain, &objects, &me, 1, 3, 1).await;
        // Another key's records are not ours.
        publish(&chain, &objects, &stranger, 2, 0, 2).await;
        // A config naming another job is refused.
        publish(&chain, &objects, &me, 3, 0, 9).await;
        chain
            .distribute_epoch_rewards(JobId(1), 0, &[])
            .await
            .expect("paid");
        let r = rebuild(&chain, &objects, &store, me.node_id().0, Timestamp(5))
            .await
            .expect("rebuilt");
        assert_eq!(r.jobs.len(), 1, "{r:?}");
        let j = &r.jobs[0];
        assert_eq!((j.job, j.next_epoch()), (JobId(1), 2));
        assert_eq!(j.checkpoints, vec![c0.clone(), c1.clone()]);
        assert_eq!((j.paid.clone(), j.unpaid.clone()), (vec![0], vec![1]));
        assert_eq!(j.spec, spec());
        assert_eq!(r.skipped.len(), 1, "{r:?}");
        assert_eq!(r.skipped[0].0, JobId(3));
        let log = store.read_after(0).await.expect("log");
        // Job 1 rebuilt; job 3 kept as failed so that its id is not reused.
        assert_eq!(log.len(), 3);
        assert_eq!(
            log[0].event,
            Event::JobSubmitted {
                job: JobId(1),
                spec: Box::new(spec()),
                resumed: vec![c0, c1],
            }
        );
        // The fold resumes the job at epoch 2: Pending, two checkpoints.
        let fold = hanzod_actors::replay::load(&store).await.expect("fold");
        assert_eq!(fold.jobs[&JobId(1)].job.checkpoints.len(), 2);
        assert!(matches!(
            fold.jobs[&JobId(3)].job.phase,
            hanzod_actors::job::JobPhase::Failed { .. }
        ));
        assert_eq!(fold.next_job_id(), JobId(4));
        // A store with events is never rebuilt over.
        assert_eq!(
            rebuild(&chain, &objects, &store, me.node_id().0, Timestamp(6)).await,
            Err(RecoveryError::NotEmpty(3))
        );
    }
}
