//! Publishing one epoch's checkpoint, idempotently and resumably (DESIGN §7, paper §7.1).
//!
//! A publication has three durable effects besides the core's own record: the weights in
//! the object store (IPFS), the repo in the model registry (the Hub), and the signed record
//! on the ledger (the chain). A crash can fall between any two. The [`Publisher`] makes the
//! sequence safe to repeat by staging it in a journal first:
//!
//! 1. **Stage** ([`Publisher::stage`]): the weights, `config.json`, the repo's other files
//!    (a language model's tokenizer and generation files) and the card are added to the
//!    object store (unpinned, as `ipfs add --pin=false`), the model card (declaring the
//!    other files by CID) and the signed [`PublicationRecord`] are made, and all of it (with the caller's epoch report) is written to the journal under
//!    `publication/{job}/{epoch}` in the [`StateStore`]. The first staging of an epoch wins:
//!    a later one (a resumed epoch whose merge came out different, say) returns the staged
//!    one instead.
//! 2. **Complete** ([`Publisher::complete`]): pin every file, publish the repo. Both are
//!    idempotent for the same bytes, so a completion retried after a crash writes nothing
//!    twice.
//! 3. The caller records the signed publication on its ledger (idempotent per job and
//!    epoch) with its rewards.
//!
//! A publication that crashed after staging resumes from the journal
//! ([`Publisher::staged`]): the same CID, the same card, the same signed record (same
//! timestamp), so no second checkpoint, repo commit or record appears for the epoch. One
//! that crashed before staging left at most an unpinned object, which a garbage collection
//! may drop, and is redone.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use bytes::Bytes;
use hanzod_actors::ports::{Clock, Snapshot, StateStore, StoreError};
use hanzod_actors::types::JobId;
use serde::{Deserialize, Serialize};

use hanzod_protocol::cid::cid_of;
use hanzod_protocol::identity::Identity;
use hanzod_protocol::record::{sign, PublicationRecord, SignedPublication};
use hanzod_store::objects::{ObjectError, ObjectStore};
use hanzod_store::registry::{
    validate_file_name, ModelCard, ModelRegistry, ModelUpload, Published, RegistryError,
};

/// Retries of a transient object-store, journal or registry failure: exponential from
/// 100 ms, 4 retries (≈ 1.5 s in all).
pub fn store_backoff() -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_times(4)
        .with_jitter()
}

/// Why staging or completing a publication failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PublishError {
    /// The object store failed (after retries).
    #[error("object store: {0}")]
    Objects(#[from] ObjectError),
    /// The journal (the state store) failed, or refused a deposed leader's write.
    #[error("publication journal: {0}")]
    Journal(#[from] StoreError),
    /// A journal entry does not decode, or the checkpoint cannot be staged as given (a
    /// `config.json` or other file that is not UTF-8, a file name a repo cannot hold).
    /// Carries the reason.
    #[error("publication journal entry {key}: {why}")]
    Invalid {
        /// The journal key.
        key: String,
        /// What is wrong.
        why: String,
    },
}

/// One epoch's checkpoint, as the caller hands it to [`Publisher::stage`].
#[derive(Debug, Clone)]
pub struct Checkpoint {
    /// The job.
    pub job: JobId,
    /// The epoch, 0-based.
    pub epoch: u32,
    /// The weights: the bytes of `model.safetensors`.
    pub weights: Bytes,
    /// The bytes of `config.json` (UTF-8 JSON).
    pub config_json: Vec<u8>,
    /// The repo's other files, by name (UTF-8 text each, names as
    /// [`validate_file_name`] allows): a language model's `tokenizer.json`,
    /// `tokenizer_config.json` and `generation_config.json`; empty for the wine-mlp.
    pub files: BTreeMap<String, Vec<u8>>,
    /// The model card; its `cid` and `files` are set by the publisher.
    pub card: ModelCard,
    /// The Hugging Face repo id, or `None` to publish by CID only.
    pub repo: Option<String>,
    /// The caller's report of the epoch, kept in the journal and handed back on resume.
    pub report: serde_json::Value,
}

/// A staged publication: everything needed to complete it, as kept in the journal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Staged {
    /// The signed record (the weights' CID is `publication.record.cid`).
    pub publication: SignedPublication,
    /// The `config.json` published.
    pub config_json: String,
    /// The model card, `README.md`, as rendered.
    pub readme: String,
    /// The repo's other files, by name, as published (the card declares each one's CID).
    /// Absent from entries staged before repos held other files: those publish the three
    /// core files only.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub files: BTreeMap<String, String>,
    /// The caller's report.
    pub report: serde_json::Value,
}

impl Staged {
    /// The weights' CID.
    pub fn cid(&self) -> &str {
        &self.publication.record.cid
    }
}

/// The journal entry's format version, for an entry with other files
/// ([`Staged::files`]); entries of a version this build does not read are refused, not
/// guessed at.
const JOURNAL_VERSION: u64 = 2;

/// The format version of an entry without other files: the format of version 1, which
/// builds that predate other files read too (they refuse a version 2 entry rather than
/// publish part of its repo).
const JOURNAL_VERSION_CORE: u64 = 1;

/// Stages and completes publications (module docs).
#[derive(Debug, Clone)]
pub struct Publisher {
    /// Where the weights go (IPFS, or the embedded block store).
    pub objects: Arc<dyn ObjectStore>,
    /// Where the repo goes (the Hub, or a folder); `None` publishes by CID only.
    pub registry: Option<Arc<dyn ModelRegistry>>,
    /// The journal: the orchestrator's state store (fenced when it is a replica's).
    pub journal: Arc<dyn StateStore>,
    /// The orchestrator key that signs the records.
    pub signer: Identity,
    /// The clock of the records' timestamps.
    pub clock: Arc<dyn Clock>,
}

/// The journal key of (`job`, `epoch`): `publication/{job}/{epoch}`.
pub fn journal_key(job: JobId, epoch: u32) -> String {
    format!("publication/{}/{epoch}", job.0)
}

impl Publisher {
    /// The staged publication of (`job`, `epoch`), if one was staged.
    ///
    /// Errors: [`PublishError::Journal`] when the store fails; [`PublishError::Invalid`]
    /// for an entry that does not decode.
    pub async fn staged(&self, job: JobId, epoch: u32) -> Result<Option<Staged>, PublishError> {
        let key = journal_key(job, epoch);
        let entry = (|| self.journal.get_snapshot(&key))
            .retry(store_backoff())
            .when(|e| matches!(e, StoreError::Unavailable { .. }))
            .await?;
        let Some(entry) = entry else {
            return Ok(None);
        };
        if !(JOURNAL_VERSION_CORE..=JOURNAL_VERSION).contains(&entry.seq) {
            return Err(PublishError::Invalid {
                key,
                why: format!(
                    "format version {} (this build reads {JOURNAL_VERSION_CORE} to \
                     {JOURNAL_VERSION})",
                    entry.seq
                ),
            });
        }
        serde_json::from_slice(&entry.state)
            .map(Some)
            .map_err(|e| PublishError::Invalid {
                key,
                why: e.to_string(),
            })
    }

    /// Stages `checkpoint` (module docs, step 1) and returns what was staged, and whether
    /// it is this checkpoint (`false`: the one staged before for the same (job, epoch),
    /// whose weights, card and record are the ones to publish).
    ///
    /// Errors: [`PublishError::Objects`] / [`PublishError::Journal`] after retries;
    /// [`PublishError::Invalid`] for a `config.json` or other file that is not UTF-8, or
    /// another file whose name [`validate_file_name`] refuses.
    pub async fn stage(&self, checkpoint: Checkpoint) -> Result<(Staged, bool), PublishError> {
        let key = journal_key(checkpoint.job, checkpoint.epoch);
        if let Some(staged) = self.staged(checkpoint.job, checkpoint.epoch).await? {
            return Ok((staged, false));
        }
        let config_json =
            String::from_utf8(checkpoint.config_json).map_err(|e| PublishError::Invalid {
                key: key.clone(),
                why: format!("config.json is not UTF-8: {e}"),
            })?;
        let mut files = BTreeMap::new();
        for (name, bytes) in checkpoint.files {
            validate_file_name(&name).map_err(|e| PublishError::Invalid {
                key: key.clone(),
                why: e.to_string(),
            })?;
            let text = String::from_utf8(bytes).map_err(|e| PublishError::Invalid {
                key: key.clone(),
                why: format!("{name} is not UTF-8: {e}"),
            })?;
            files.insert(name, text);
        }
        let weights = checkpoint.weights;
        let cid = (|| self.objects.put(weights.clone()))
            .retry(store_backoff())
            .when(|e| matches!(e, ObjectError::Io { message: _ }))
            .notify(|e, d| tracing::warn!(job = %checkpoint.job, epoch = checkpoint.epoch, error = %e, retry_in = ?d, "storing the checkpoint"))
            .await?;
        // The other files go to the object store too, and the card declares each one's CID
        // (the record signs the card's CID, so every file is covered by the signature).
        let mut declared = BTreeMap::new();
        for (name, text) in &files {
            declared.insert(name.clone(), self.put(Bytes::from(text.clone())).await?);
        }
        let card = ModelCard {
            cid: cid.clone(),
            files: declared,
            ..checkpoint.card
        };
        let readme = card.render();
        // config.json and the card go to the object store too: the record names their
        // CIDs, so anyone (and a recovering orchestrator, which reads the job's spec from
        // config.json) can fetch them by CID.
        let config_cid = self.put(Bytes::from(config_json.clone())).await?;
        let card_cid = self.put(Bytes::from(readme.clone())).await?;
        let record = PublicationRecord {
            job: checkpoint.job,
            epoch: checkpoint.epoch,
            cid,
            config_cid,
            card_cid,
            hf_repo: checkpoint.repo.unwrap_or_default(),
            quality: card.quality,
            timestamp: self.clock.now(),
        };
        let staged = Staged {
            publication: sign(record, &self.signer),
            config_json,
            readme,
            files,
            report: checkpoint.report,
        };
        let state = serde_json::to_vec(&staged).map_err(|e| PublishError::Invalid {
            key: key.clone(),
            why: e.to_string(),
        })?;
        let snapshot = Snapshot {
            seq: if staged.files.is_empty() {
                JOURNAL_VERSION_CORE
            } else {
                JOURNAL_VERSION
            },
            state,
        };
        (|| self.journal.put_snapshot(&key, snapshot.clone()))
            .retry(store_backoff())
            .when(|e| matches!(e, StoreError::Unavailable { .. }))
            .await?;
        // A concurrent stager of the same epoch (none in one orchestrator; a deposed
        // leader's write is fenced) would have replaced the entry: what the journal holds
        // is what is published.
        let held = self
            .staged(
                staged.publication.record.job,
                staged.publication.record.epoch,
            )
            .await?;
        // Ours when it carries our signed record (the report, a JSON value, need not
        // compare equal after the round trip through the store).
        Ok(match held {
            Some(held) if held.publication != staged.publication => (held, false),
            _ => (staged, true),
        })
    }

    /// The staged weights, read back from the object store and checked against their CID.
    pub async fn weights(&self, staged: &Staged) -> Result<Arc<[u8]>, PublishError> {
        Ok((|| self.objects.get(staged.cid()))
            .retry(store_backoff())
            .when(|e| matches!(e, ObjectError::Io { message: _ }))
            .await?)
    }

    /// Stores `bytes` in the object store, retrying transient failures; returns the CID.
    async fn put(&self, bytes: Bytes) -> Result<String, ObjectError> {
        (|| self.objects.put(bytes.clone()))
            .retry(store_backoff())
            .when(|e| matches!(e, ObjectError::Io { message: _ }))
            .await
    }

    /// Pins `cid`, retrying transient failures; when the store no longer has it (a garbage
    /// collection between the unpinned add and the pin), adds `bytes` again (they must hash
    /// to `cid`, which is checked) and pins them.
    async fn pin_or_add(&self, cid: &str, bytes: &[u8]) -> Result<(), PublishError> {
        let pin = || async {
            (|| self.objects.pin(cid))
                .retry(store_backoff())
                .when(|e| matches!(e, ObjectError::Io { message: _ }))
                .await
        };
        match pin().await {
            Err(ObjectError::NotFound { cid: missing }) => {
                tracing::warn!(%cid, %missing, "a staged file left the object store before it was pinned; adding it again");
                let again = self.put(Bytes::copy_from_slice(bytes)).await?;
                if again != cid {
                    return Err(PublishError::Objects(ObjectError::Corrupt {
                        expected: cid.to_string(),
                        found: again,
                    }));
                }
                pin().await?;
                Ok(())
            }
            other => Ok(other?),
        }
    }

    /// Completes `staged` (module docs, step 2): pins the weights, config.json, the other
    /// files and the card, then publishes the repo
    /// when the record names one and a registry is set. Returns the registry's outcome
    /// (`None` when there is no repo or no registry), which is returned, not raised, since
    /// the checkpoint is published by CID either way: the caller retries a transient failure
    /// ([`RegistryError::is_transient`]) later and reports a refusal. The registry call is
    /// not retried here: the Hub adapter retries each request itself.
    ///
    /// `weights` are the staged weights: when the object store no longer has them (a
    /// garbage collection between the unpinned add and the pin), they are added again
    /// (they have the staged CID, which the store checks) and pinned.
    ///
    /// Errors: [`PublishError::Objects`] when the weights cannot be pinned after retries.
    pub async fn complete(
        &self,
        staged: &Staged,
        weights: Arc<[u8]>,
    ) -> Result<Option<Result<Published, RegistryError>>, PublishError> {
        let record = &staged.publication.record;
        self.pin_or_add(&record.cid, &weights).await?;
        self.pin_or_add(&record.config_cid, staged.config_json.as_bytes())
            .await?;
        for text in staged.files.values() {
            let cid = cid_of(text.as_bytes()).to_string();
            self.pin_or_add(&cid, text.as_bytes()).await?;
        }
        self.pin_or_add(&record.card_cid, staged.readme.as_bytes())
            .await?;
        let record = &staged.publication.record;
        let Some(registry) = self
            .registry
            .as_ref()
            .filter(|_| !record.hf_repo.is_empty())
        else {
            return Ok(None);
        };
        let card = match ModelCard::parse(&staged.readme) {
            Ok(card) => card,
            Err(e) => return Ok(Some(Err(e))),
        };
        let upload = ModelUpload {
            repo: record.hf_repo.clone(),
            weights,
            config_json: staged.config_json.clone().into_bytes(),
            card,
            files: staged
                .files
                .iter()
                .map(|(name, text)| (name.clone(), Arc::from(text.as_bytes())))
                .collect(),
        };
        Ok(Some(registry.publish(&upload).await))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Every finite f64 reads back from JSON with the bits written (serde_json's
        /// `float_roundtrip`): a staged record's quality, signed over its bits, and slashing
        /// evidence, hashed over its text, survive the journal unchanged.
        #[test]
        fn an_f64_survives_the_journal_json(x in proptest::num::f64::NORMAL | proptest::num::f64::SUBNORMAL | proptest::num::f64::ZERO) {
            let back: f64 = serde_json::from_str(&serde_json::to_string(&x).unwrap()).unwrap();
            proptest::prop_assert_eq!(back.to_bits(), x.to_bits());
        }
    }
    use hanzod_actors::ports::memory::MemoryStateStore;
    use hanzod_actors::types::Timestamp;
    use hanzod_protocol::record::check_signature;
    use hanzod_store::{FolderRegistry, MemoryObjectStore};

    #[derive(Debug)]
    struct Fixed(u64);
    impl Clock for Fixed {
        fn now(&self) -> Timestamp {
            Timestamp(self.0)
        }
    }

    fn checkpoint(weights: &[u8]) -> Checkpoint {
        Checkpoint {
            job: JobId(4),
            epoch: 1,
            weights: Bytes::copy_from_slice(weights),
            config_json: br#"{"model_type":"wine"}"#.to_vec(),
            files: BTreeMap::new(),
            card: ModelCard {
                cid: String::new(),
                epoch: 1,
                job: 4,
                quality: 0.75,
                base_model: None,
                license: "apache-2.0".into(),
                model: "wine".into(),
                dataset: "wine-quality-red".into(),
                files: BTreeMap::new(),
            },
            repo: Some("org/wine-job-4-epoch-1".into()),
            report: serde_json::json!({"epoch": 1}),
        }
    }

    fn publisher(dir: &std::path::Path, journal: Arc<MemoryStateStore>, now: u64) -> Publisher {
        Publisher {
            objects: Arc::new(MemoryObjectStore::new()),
            registry: Some(Arc::new(FolderRegistry::new(dir))),
            journal,
            signer: Identity::from_seed([5; 32]),
            clock: Arc::new(Fixed(now)),
        }
    }

    #[tokio::test]
    async fn the_first_staging_wins_and_completes_idempotently() {
        let dir = std::env::temp_dir().join(format!("hanzod-publisher-{}", std::process::id()));
        let journal = Arc::new(MemoryStateStore::new());
        let p = publisher(&dir, journal.clone(), 1_000);
        let (first, fresh) = p.stage(checkpoint(b"weights one")).await.expect("stage");
        assert!(fresh);
        assert_eq!(first.cid(), cid_of(b"weights one").to_string());
        assert_eq!(check_signature(&first.publication), Ok(()));
        assert_eq!(
            first.publication.record.card_cid,
            cid_of(first.readme.as_bytes()).to_string()
        );

        // A second staging of the same epoch (other bytes, later clock) returns the first.
        let later = Publisher {
            clock: Arc::new(Fixed(2_000)),
            ..p.clone()
        };
        let (again, fresh) = later
            .stage(checkpoint(b"weights two"))
            .await
            .expect("stage again");
        assert!(!fresh, "the first staging wins");
        assert_eq!(again, first);
        assert_eq!(later.staged(JobId(4), 1).await, Ok(Some(first.clone())));

        let weights = p.weights(&first).await.expect("weights");
        assert_eq!(&weights[..], b"weights one");
        let outcome = p.complete(&first, weights.clone()).await.expect("complete");
        assert!(matches!(outcome, Some(Ok(_))), "{outcome:?}");
        assert!(p.objects.is_pinned(first.cid()).await.expect("pinned"));
        // Completing again writes nothing new and succeeds.
        let outcome = p.complete(&first, weights).await.expect("complete again");
        assert!(matches!(outcome, Some(Ok(_))), "{outcome:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn weights_collected_before_the_pin_are_added_again() {
        let dir = std::env::temp_dir().join(format!("hanzod-publisher-gc-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let objects = hanzod_store::FsObjectStore::open(dir.join("objects"))
            .await
            .expect("open");
        let p = Publisher {
            objects: Arc::new(objects.clone()),
            registry: None,
            ..publisher(&dir, Arc::new(MemoryStateStore::new()), 1)
        };
        let weights = vec![3u8; 300_000];
        let (staged, _) = p.stage(checkpoint(&weights)).await.expect("stage");
        // A garbage collection between the unpinned add and the pin.
        for block in std::fs::read_dir(dir.join("objects/blocks"))
            .expect("blocks")
            .flatten()
        {
            std::fs::remove_file(block.path()).expect("collect");
        }
        assert!(!p.objects.contains(staged.cid()).await.expect("contains"));
        p.complete(&staged, Arc::from(weights.as_slice()))
            .await
            .expect("complete");
        assert!(p.objects.is_pinned(staged.cid()).await.expect("pinned"));
        assert_eq!(
            &p.weights(&staged).await.expect("weights")[..],
            &weights[..]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_journal_entry_of_another_version_is_refused() {
        let dir = std::env::temp_dir().join(format!("hanzod-publisher-v-{}", std::process::id()));
        let journal = Arc::new(MemoryStateStore::new());
        journal
            .put_snapshot(
                &journal_key(JobId(4), 1),
                Snapshot {
                    seq: 9,
                    state: b"{}".to_vec(),
                },
            )
            .await
            .expect("put");
        let p = publisher(&dir, journal, 1);
        assert!(matches!(
            p.stage(checkpoint(b"w")).await,
            Err(PublishError::Invalid { .. })
        ));
    }

    fn lm_files() -> BTreeMap<String, Vec<u8>> {
        [
            ("tokenizer.json", br#"{"model": {"type": "BPE"}}"#.to_vec()),
            (
                "tokenizer_config.json",
                br#"{"eos_token": "<|endoftext|>"}"#.to_vec(),
            ),
            ("generation_config.json", br#"{"eos_token_id": 0}"#.to_vec()),
        ]
        .into_iter()
        .map(|(n, b)| (n.to_string(), b))
        .collect()
    }

    #[tokio::test]
    async fn other_files_are_stored_declared_by_the_card_and_published() {
        let dir =
            std::env::temp_dir().join(format!("hanzod-publisher-files-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let journal = Arc::new(MemoryStateStore::new());
        let p = publisher(&dir, journal.clone(), 1_000);
        let (staged, fresh) = p
            .stage(Checkpoint {
                files: lm_files(),
                ..checkpoint(b"lm weights")
            })
            .await
            .expect("stage");
        assert!(fresh);
        // The card declares every other file by its CID; the record signs the card.
        let card = ModelCard::parse(&staged.readme).expect("card");
        let expected: BTreeMap<String, String> = lm_files()
            .iter()
            .map(|(n, b)| (n.clone(), cid_of(b).to_string()))
            .collect();
        assert_eq!(card.files, expected);
        assert_eq!(
            staged.publication.record.card_cid,
            cid_of(staged.readme.as_bytes()).to_string()
        );
        for (name, bytes) in lm_files() {
            assert_eq!(staged.files[&name].as_bytes(), &bytes[..]);
        }
        // The entry carries the files: version 2, which builds without them refuse.
        let entry = journal
            .get_snapshot(&journal_key(JobId(4), 1))
            .await
            .expect("get")
            .expect("staged");
        assert_eq!(entry.seq, JOURNAL_VERSION);
        assert_eq!(p.staged(JobId(4), 1).await, Ok(Some(staged.clone())));

        let weights = p.weights(&staged).await.expect("weights");
        let outcome = p.complete(&staged, weights).await.expect("complete");
        let Some(Ok(published)) = outcome else {
            panic!("{outcome:?}")
        };
        for cid in expected.values() {
            assert!(p.objects.is_pinned(cid).await.expect("pinned"), "{cid}");
        }
        let hanzod_store::registry::Location::Path(repo) = published.location else {
            panic!("a folder")
        };
        let mut names: Vec<String> = std::fs::read_dir(&repo)
            .expect("repo")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, card.repo_files());
        assert_eq!(names.len(), 6);
        for (name, bytes) in lm_files() {
            assert_eq!(std::fs::read(repo.join(&name)).expect("file"), bytes);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_core_only_entry_stays_version_1_and_entries_without_files_read() {
        let dir = std::env::temp_dir().join(format!("hanzod-publisher-v1-{}", std::process::id()));
        let journal = Arc::new(MemoryStateStore::new());
        let p = publisher(&dir, journal.clone(), 1);
        let (staged, _) = p.stage(checkpoint(b"w")).await.expect("stage");
        let key = journal_key(JobId(4), 1);
        let entry = journal
            .get_snapshot(&key)
            .await
            .expect("get")
            .expect("entry");
        assert_eq!(entry.seq, JOURNAL_VERSION_CORE);
        // Byte for byte what a build without other files wrote: no `files` key.
        let json: serde_json::Value = serde_json::from_slice(&entry.state).expect("json");
        assert!(json.get("files").is_none(), "{json}");
        assert!(staged.files.is_empty());
        // An entry such a build staged reads back, with no other files.
        journal
            .put_snapshot(
                &journal_key(JobId(5), 0),
                Snapshot {
                    seq: 1,
                    state: entry.state.clone(),
                },
            )
            .await
            .expect("put");
        let back = p.staged(JobId(5), 0).await.expect("read").expect("entry");
        assert!(back.files.is_empty());
        assert_eq!(back.publication, staged.publication);
    }

    #[tokio::test]
    async fn a_file_a_repo_cannot_hold_is_refused_at_staging() {
        let dir = std::env::temp_dir().join(format!("hanzod-publisher-bad-{}", std::process::id()));
        let p = publisher(&dir, Arc::new(MemoryStateStore::new()), 1);
        for (name, bytes) in [
            ("../escape.json", b"{}".to_vec()),
            ("config.json", b"{}".to_vec()),
            (".gitattributes", b"x".to_vec()),
            ("tokenizer.json", vec![0xff, 0xfe]),
        ] {
            let outcome = p
                .stage(Checkpoint {
                    files: [(name.to_string(), bytes)].into_iter().collect(),
                    ..checkpoint(b"w")
                })
                .await;
            assert!(
                matches!(outcome, Err(PublishError::Invalid { .. })),
                "{name}: {outcome:?}"
            );
        }
    }
}
