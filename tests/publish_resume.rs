//! Publication is idempotent and resumable (DESIGN §7): an orchestrator that crashes in the
//! middle of publishing an epoch — between the IPFS add and the Hub push, between the push
//! and the ledger record, or after the record but before the core logged the checkpoint —
//! is replaced by a new one on the same event log, which finishes the epoch with no second
//! checkpoint, repo or record, and no half-published epoch.
//!
//! Runs under the fault-injection harness (simulated nodes, paused time). The checkpoint
//! sink publishes through the real [`Publisher`] onto an object store, a folder registry
//! (the Hub's layout) and a ledger that outlive the crash. Its checkpoint bytes carry a
//! random nonce drawn per call, so a publication redone from scratch would get another CID:
//! only the journal makes the resumed one identical. The crash epoch is seeded
//! (`HANZOD_SEED`), and the seed printed.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use hanzod::core::job::JobPhase;
use hanzod::core::ports::memory::{MemoryChain, MemoryStateStore};
use hanzod::core::ports::{
    CheckpointError, CheckpointSink, EpochInput, Ledger, PublishedEpoch, SystemClock,
};
use hanzod::identity::Identity;
use hanzod::publish::publisher::{Checkpoint, Publisher};
use hanzod::publish::record::check_signature;
use hanzod::publish::registry::{CARD_FILE, CONFIG_FILE, WEIGHTS_FILE};
use hanzod::publish::verify;
use hanzod::publish::{FolderRegistry, MemoryObjectStore, ModelCard, ObjectStore};
use hanzod::testkit::{Harness, HarnessConfig};
use rand::{Rng, SeedableRng};
use tokio::sync::mpsc;

const MIN: Duration = Duration::from_secs(60);
const EPOCHS: u32 = 3;

/// Where the orchestrator dies: just after this step.
#[derive(Debug, Clone, Copy, PartialEq)]
enum CrashPoint {
    /// The weights are added to IPFS and the publication staged; the repo is not pushed.
    IpfsAdded,
    /// The repo is pushed; the record is not on the ledger.
    HubPushed,
    /// The record is on the ledger; the core has not logged the checkpoint.
    Recorded,
}

/// The ports that outlive the crash.
struct World {
    objects: Arc<MemoryObjectStore>,
    registry_dir: PathBuf,
    ledger: Arc<MemoryChain>,
    store: Arc<MemoryStateStore>,
    key: Identity,
}

/// A sink that publishes a made-up checkpoint per epoch through [`Publisher`], and "crashes"
/// (hangs forever, telling the test) at `crash` on `crash_epoch`.
#[derive(Debug)]
struct PublishingSink {
    publisher: Publisher,
    ledger: Arc<MemoryChain>,
    crash: Option<(CrashPoint, u32, mpsc::UnboundedSender<String>)>,
    rng: Mutex<rand_chacha::ChaCha8Rng>,
}

impl PublishingSink {
    /// At the crash point, sends the CID being published and never returns.
    async fn crash_here(&self, at: CrashPoint, epoch: u32, cid: &str) {
        if let Some((point, e, tx)) = &self.crash {
            if *point == at && *e == epoch {
                let _ = tx.send(cid.to_string());
                std::future::pending::<()>().await;
            }
        }
    }
}

#[async_trait]
impl CheckpointSink for PublishingSink {
    async fn publish(&self, input: EpochInput<'_>) -> Result<PublishedEpoch, CheckpointError> {
        let failed = |e: &dyn std::fmt::Display| CheckpointError::Failed {
            message: e.to_string(),
        };
        let (job, epoch) = (input.job, input.epoch);
        let staged = match self
            .publisher
            .staged(job, epoch)
            .await
            .map_err(|e| failed(&e))?
        {
            Some(staged) => staged,
            None => {
                let nonce: u64 = self.rng.lock().expect("rng").gen();
                let weights = format!(
                    "weights of job {} epoch {epoch} from {:?}, {} deltas, nonce {nonce}",
                    job.0,
                    input.base,
                    input.deltas.len()
                );
                let checkpoint = Checkpoint {
                    job,
                    epoch,
                    weights: Bytes::from(weights.into_bytes()),
                    config_json: br#"{"model_type": "made-up"}"#.to_vec(),
                    files: Default::default(),
                    card: ModelCard {
                        cid: String::new(),
                        epoch,
                        job: job.0,
                        quality: 1.0 / f64::from(epoch + 2),
                        base_model: input.base.map(str::to_string),
                        license: "apache-2.0".into(),
                        model: "made-up".into(),
                        dataset: "none".into(),
                        files: Default::default(),
                    },
                    repo: Some(format!("org/made-up-job-{}-epoch-{epoch}", job.0)),
                    report: serde_json::json!({ "nonce": nonce }),
                };
                self.publisher
                    .stage(checkpoint)
                    .await
                    .map_err(|e| failed(&e))?
                    .0
            }
        };
        self.crash_here(CrashPoint::IpfsAdded, epoch, staged.cid())
            .await;
        let weights = self
            .publisher
            .weights(&staged)
            .await
            .map_err(|e| failed(&e))?;
        match self.publisher.complete(&staged, weights).await {
            Ok(Some(Ok(_))) => {}
            other => return Err(failed(&format!("{other:?}"))),
        }
        self.crash_here(CrashPoint::HubPushed, epoch, staged.cid())
            .await;
        self.ledger
            .record_publication(&staged.publication)
            .await
            .map_err(|e| failed(&e))?;
        self.crash_here(CrashPoint::Recorded, epoch, staged.cid())
            .await;
        Ok(PublishedEpoch::checkpoint(staged.cid()))
    }
}

fn sink(
    w: &World,
    seed: u64,
    crash: Option<(CrashPoint, u32, mpsc::UnboundedSender<String>)>,
) -> Arc<PublishingSink> {
    Arc::new(PublishingSink {
        publisher: Publisher {
            objects: w.objects.clone(),
            registry: Some(Arc::new(FolderRegistry::new(&w.registry_dir))),
            journal: w.store.clone(),
            signer: w.key.clone(),
            clock: Arc::new(SystemClock),
        },
        ledger: w.ledger.clone(),
        crash,
        rng: Mutex::new(rand_chacha::ChaCha8Rng::seed_from_u64(seed)),
    })
}

/// The repo folders under the registry root (`org/name`), sorted.
fn repos(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for org in std::fs::read_dir(root).expect("registry root").flatten() {
        for repo in std::fs::read_dir(org.path()).expect("org").flatten() {
            out.push(format!(
                "{}/{}",
                org.file_name().to_string_lossy(),
                repo.file_name().to_string_lossy()
            ));
        }
    }
    out.sort();
    out
}

async fn crash_and_resume(point: CrashPoint) {
    let seed = HarnessConfig::new(4).seed_from_env_or(71).seed;
    let crash_epoch = (seed % u64::from(EPOCHS)) as u32;
    eprintln!(
        "crash {point:?} in epoch {crash_epoch} (seed {seed}; replay with HANZOD_SEED={seed})"
    );
    let registry_dir = std::env::temp_dir().join(format!(
        "hanzod-publish-resume-{}-{point:?}-{seed}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&registry_dir);
    let world = World {
        objects: Arc::new(MemoryObjectStore::new()),
        registry_dir: registry_dir.clone(),
        ledger: Arc::new(MemoryChain::new()),
        store: Arc::new(MemoryStateStore::new()),
        key: Identity::from_seed([seed as u8; 32]),
    };

    let (tx, mut crashed) = mpsc::unbounded_channel();
    let first = Harness::start_on(
        HarnessConfig::new(4)
            .seed_from_env_or(71)
            .checkpoint_sink(sink(&world, seed, Some((point, crash_epoch, tx)))),
        world.store.clone(),
    )
    .await;
    let job = first
        .orch
        .submit_job(first.job_spec("publish", 4, EPOCHS))
        .await
        .expect("submit");
    let in_flight = tokio::time::timeout(10 * MIN, crashed.recv())
        .await
        .expect("the publication reaches the crash point")
        .expect("crash signal");
    first.orch.shutdown().await;
    drop(first);

    // A new orchestrator on the same log and ports, whose sink draws other nonces.
    let second = Harness::start_on(
        HarnessConfig::new(4)
            .seed_from_env_or(71)
            .checkpoint_sink(sink(&world, seed ^ 0xdead_beef, None)),
        world.store.clone(),
    )
    .await;
    let phase = second.await_end(job, 20 * MIN).await.expect("job ends");
    assert!(
        matches!(phase, JobPhase::Published { epochs: EPOCHS, .. }),
        "{phase:?}"
    );
    let checkpoints = second.orch.job(job).await.expect("job").checkpoints;
    assert_eq!(checkpoints.len(), EPOCHS as usize);
    // The epoch cut short published the checkpoint it had staged, not a new merge.
    assert_eq!(checkpoints[crash_epoch as usize], in_flight);

    // One record per epoch, naming the checkpoint the core logged, signed by the key.
    let records = world.ledger.publications().await.expect("publications");
    assert_eq!(
        records.iter().map(|p| p.record.epoch).collect::<Vec<_>>(),
        (0..EPOCHS).collect::<Vec<_>>(),
        "{records:#?}"
    );
    for (p, cid) in records.iter().zip(&checkpoints) {
        assert_eq!(&p.record.cid, cid);
        assert_eq!(check_signature(p), Ok(()));
        assert_eq!(p.signer, world.key.node_id().0);
    }
    // Pinned: each epoch's three files (the checkpoint, config.json and the card, which
    // the record names), nothing else.
    let mut pins = world.objects.pins().await.expect("pins");
    pins.sort();
    let mut expected: Vec<String> = records
        .iter()
        .flat_map(|p| {
            [
                p.record.cid.clone(),
                p.record.config_cid.clone(),
                p.record.card_cid.clone(),
            ]
        })
        .collect();
    expected.sort();
    expected.dedup();
    assert_eq!(pins, expected);
    // One repo per epoch, each whole, and each verifies against its record.
    let repos = repos(&registry_dir);
    assert_eq!(
        repos,
        (0..EPOCHS)
            .map(|e| format!("org/made-up-job-{}-epoch-{e}", job.0))
            .collect::<Vec<_>>()
    );
    for (repo, p) in repos.iter().zip(&records) {
        let dir = registry_dir.join(repo);
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .expect("repo")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, [CARD_FILE, CONFIG_FILE, WEIGHTS_FILE]);
        let files = verify::read_folder(&dir).await.expect("read repo");
        let cid = hanzod::publish::cid_of(&files.weights).to_string();
        let verdict = verify::check(
            &verify::Files {
                repo: Some(repo.clone()),
                ..files
            },
            &cid,
            Ok(Some(p.clone())),
            Some(world.key.node_id().0),
        );
        assert!(verdict.verified(), "{repo}: {verdict:#?}");
    }
    let _ = std::fs::remove_dir_all(&registry_dir);
}

#[tokio::test(start_paused = true)]
async fn crash_between_ipfs_add_and_hub_push_resumes_without_duplicates() {
    crash_and_resume(CrashPoint::IpfsAdded).await;
}

#[tokio::test(start_paused = true)]
async fn crash_between_hub_push_and_ledger_record_resumes_without_duplicates() {
    crash_and_resume(CrashPoint::HubPushed).await;
}

#[tokio::test(start_paused = true)]
async fn crash_after_the_record_resumes_without_duplicates() {
    crash_and_resume(CrashPoint::Recorded).await;
}
