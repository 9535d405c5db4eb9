//! What SubmitJob checks once the spec's fields and recipe are valid (DESIGN §5, §6): that
//! validating an epoch of the job fits the daemon's budget
//! ([`hanzod_pipeline::budget`]), and that a `training.base` checkpoint is in the object
//! store, is what its CID names and loads as the job model's weights.
//!
//! Each refusal is an [`AdmissionError`] with its own gRPC status
//! ([`AdmissionError::status`]):
//!
//! | refusal | code |
//! |---|---|
//! | the epoch's validation cost is above `validation.validation_budget_flops` | `RESOURCE_EXHAUSTED` |
//! | `base` is not a CID | `INVALID_ARGUMENT` |
//! | `base` is not in the object store | `NOT_FOUND` |
//! | the store's blocks for `base` are damaged | `DATA_LOSS` |
//! | the bytes `base` resolves to have another CID (as Kubo's `ipfs add --cid-version=1` names them) | `FAILED_PRECONDITION` |
//! | the bytes do not load as the job model's checkpoint | `INVALID_ARGUMENT` |
//! | the object store failed | `UNAVAILABLE` |
//!
//! Why these: a base that is absent is an entity the request names and this orchestrator
//! does not have, the status `FetchCheckpoint` gives nodes for the same condition
//! (`NOT_FOUND`; `FAILED_PRECONDITION` stays the "not in a state to do this" of a
//! non-leader or an ended job). A base whose stored blocks no longer hash to their names is
//! corruption of the daemon's own data (`DATA_LOSS`: an operator's matter, not the
//! client's). A base the store resolves to bytes whose canonical CID is another (a CIDv0,
//! another chunking) is intact, but nodes check every checkpoint against its reference by
//! recomputing that CID and would refuse it; the request can only succeed once it names
//! the bytes by their canonical CID (`FAILED_PRECONDITION`, the message gives that CID).

use std::sync::{Arc, OnceLock};

use hanzod_actors::job::JobSpec;
use hanzod_pipeline::budget::{self, EpochValidation, OverBudget};
use hanzod_protocol::cid::CidError;
use hanzod_store::{ObjectError, ObjectStore};
use hanzod_train::{Layout, Trainer, Weights};
use tonic::Status;

/// SubmitJob's admission settings (from `[validation]`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdmissionSettings {
    /// The most FLOPs validating one epoch of a job may cost
    /// (`validation.validation_budget_flops`).
    pub validation_budget_flops: f64,
    /// The fraction of deltas spot-checked (`validation.spot_check_rate`), which the
    /// estimate counts replays with.
    pub spot_check_rate: f64,
}

/// Characters of a `training.base` string quoted in a message or log line, at most (a
/// CIDv1 in base32 is 59).
pub const CID_QUOTE_CHARS: usize = 100;

/// `cid` cut to [`CID_QUOTE_CHARS`] characters (with `…` when cut): the spec's strings are
/// bounded at 256 bytes without control characters on the wire, and cut again here before
/// they are echoed.
pub fn quote_cid(cid: &str) -> String {
    hanzod_protocol::status::quote_bounded(cid, CID_QUOTE_CHARS)
}

/// What is wrong with a string that is not a CID, without the string (which
/// [`CidError`]'s message quotes whole).
fn cid_reason(e: &CidError) -> String {
    match e {
        CidError::Malformed { message, .. } => quote_cid(message),
        CidError::NotSha256 { code, .. } => format!("multihash {code:#x} is not sha2-256"),
        CidError::Codec { codec, .. } => format!("codec {codec:#x} is neither raw nor dag-pb"),
    }
}

/// Why SubmitJob refused a job whose spec and recipe are otherwise valid. CIDs are quoted
/// with [`quote_cid`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AdmissionError {
    /// Validating one epoch would cost more than the budget (both figures, FLOPs).
    #[error("{0}")]
    OverBudget(#[from] OverBudget),
    /// `training.base` is not a CID this store can hold.
    #[error("invalid spec.training.base {cid:?}: {reason}")]
    BaseMalformed {
        /// The string (cut).
        cid: String,
        /// Why ([`CidError`] without the string, or the store's refusal, cut).
        reason: String,
    },
    /// `training.base` is not in the orchestrator's object store.
    #[error(
        "spec.training.base {cid} is not in this orchestrator's object store: name a \
         checkpoint it published, or add the file to the store first"
    )]
    BaseNotFound {
        /// The CID (cut).
        cid: String,
    },
    /// The store's blocks for `training.base` are damaged.
    #[error("spec.training.base {cid}: the stored checkpoint is damaged ({detail})")]
    BaseCorrupt {
        /// The CID (cut).
        cid: String,
        /// The store's words.
        detail: String,
    },
    /// The bytes `training.base` resolves to have another canonical CID.
    #[error(
        "spec.training.base {cid} resolves to bytes whose CID is {found} (as `ipfs add \
         --cid-version=1` computes it), and nodes check a checkpoint against that CID: \
         submit base = \"{found}\""
    )]
    BaseMismatch {
        /// The CID asked for (cut).
        cid: String,
        /// The bytes' CID.
        found: String,
    },
    /// The bytes do not load as the job model's weights.
    #[error("spec.training.base {cid} is not a checkpoint of model {model:?}: {reason}")]
    BaseNotThisModel {
        /// The CID (cut).
        cid: String,
        /// The job's model (cut).
        model: String,
        /// Why ([`hanzod_train::TrainError`]).
        reason: String,
    },
    /// The object store failed.
    #[error("spec.training.base {cid}: the object store failed: {message}")]
    BaseStore {
        /// The CID (cut).
        cid: String,
        /// The store's words.
        message: String,
    },
    /// The check itself failed (its thread panicked): a daemon bug, not the caller's.
    #[error("spec.training.base {cid}: the check failed: {message}")]
    Internal {
        /// The CID (cut).
        cid: String,
        /// What failed.
        message: String,
    },
}

impl AdmissionError {
    /// The gRPC status of the refusal ([module docs](self)), with the error as message.
    pub fn status(&self) -> Status {
        let msg = self.to_string();
        match self {
            AdmissionError::OverBudget(_) => Status::resource_exhausted(msg),
            AdmissionError::BaseMalformed { .. } | AdmissionError::BaseNotThisModel { .. } => {
                Status::invalid_argument(msg)
            }
            AdmissionError::BaseNotFound { .. } => Status::not_found(msg),
            AdmissionError::BaseCorrupt { .. } => Status::data_loss(msg),
            AdmissionError::BaseMismatch { .. } => Status::failed_precondition(msg),
            AdmissionError::BaseStore { .. } => Status::unavailable(msg),
            AdmissionError::Internal { .. } => Status::internal(msg),
        }
    }
}

/// Samples in the `wine-mlp`'s validation set (320; read once from the built-in data).
///
/// Errors: the data set does not load (then no MLP recipe resolves either).
fn mlp_validation_samples() -> Result<u64, String> {
    static SAMPLES: OnceLock<Result<u64, String>> = OnceLock::new();
    SAMPLES
        .get_or_init(|| {
            hanzod_train::Dataset::wine_quality()
                .map(|d| d.validation_len() as u64)
                .map_err(|e| e.to_string())
        })
        .clone()
}

/// One epoch's validation work for `spec`, whose recipe resolved to `trainer`, with
/// `spot_check_rate`: a language model's in tokens ([`EpochValidation::lm`]), the MLP's in
/// samples of its validation set ([`EpochValidation::mlp`]); `P` is the model's parameter
/// count (`trainer.layout().len()`). Loads the MLP's data set once (blocking).
///
/// Errors: the MLP's data set does not load.
pub fn validation_work(
    trainer: &Trainer,
    spec: &JobSpec,
    spot_check_rate: f64,
) -> Result<EpochValidation, String> {
    let params = trainer.layout().len() as u64;
    Ok(match trainer {
        Trainer::Lm(_) => {
            EpochValidation::lm(params, &spec.training, spec.max_nodes, spot_check_rate)
        }
        Trainer::Mlp(_) => EpochValidation::mlp(
            params,
            mlp_validation_samples()?,
            &spec.training,
            spec.max_nodes,
            spot_check_rate,
        ),
    })
}

/// [`AdmissionError::OverBudget`] when `work` costs more than the settings' budget.
pub fn check_budget(
    work: &EpochValidation,
    settings: &AdmissionSettings,
) -> Result<(), AdmissionError> {
    budget::check_budget(work, settings.validation_budget_flops).map_err(AdmissionError::from)
}

/// Checks `bytes`, which the store returned for `cid`, against it and against `layout`, the
/// layout of `model`'s weights: their CID recomputed as Kubo's `ipfs add --cid-version=1`
/// (as nodes and `hanzod verify` do) must be `cid`, and they must load as a safetensors
/// checkpoint of every tensor of the layout ([`Weights::from_safetensors`]). CPU-bound
/// (hashing and parsing the whole file): call it off the async runtime.
///
/// Errors: [`AdmissionError::BaseMismatch`], [`AdmissionError::BaseNotThisModel`].
pub fn verify_base(
    cid: &str,
    bytes: &[u8],
    layout: Arc<Layout>,
    model: &str,
) -> Result<(), AdmissionError> {
    let found = hanzod_protocol::cid::cid_of(bytes).to_string();
    if found != cid {
        return Err(AdmissionError::BaseMismatch {
            cid: quote_cid(cid),
            found,
        });
    }
    Weights::from_safetensors(bytes, layout).map_err(|e| AdmissionError::BaseNotThisModel {
        cid: quote_cid(cid),
        model: quote_cid(model),
        // The reason may name a tensor of the file: bounded like a CID.
        reason: quote_cid(&e.to_string()),
    })?;
    Ok(())
}

/// Fetches checkpoint `cid` from `objects` and checks it ([`verify_base`], on a blocking
/// thread) against `layout`, the layout of `model`'s weights.
///
/// Errors: [`AdmissionError::BaseMalformed`] (not a CID), [`AdmissionError::BaseNotFound`],
/// [`AdmissionError::BaseCorrupt`], [`AdmissionError::BaseStore`], and those of
/// [`verify_base`].
pub async fn check_base(
    objects: &dyn ObjectStore,
    cid: &str,
    layout: Arc<Layout>,
    model: &str,
) -> Result<(), AdmissionError> {
    let quoted = quote_cid(cid);
    hanzod_protocol::cid::parse_cid(cid).map_err(|e| AdmissionError::BaseMalformed {
        cid: quoted.clone(),
        reason: cid_reason(&e),
    })?;
    let bytes = objects.get(cid).await.map_err(|e| match e {
        // The store's reason may quote the string whole: cut it.
        ObjectError::BadCid { reason } => AdmissionError::BaseMalformed {
            cid: quoted.clone(),
            reason: quote_cid(&reason),
        },
        ObjectError::NotFound { .. } => AdmissionError::BaseNotFound {
            cid: quoted.clone(),
        },
        e @ ObjectError::Corrupt { .. } => AdmissionError::BaseCorrupt {
            cid: quoted.clone(),
            detail: e.to_string(),
        },
        e @ ObjectError::Io { .. } => AdmissionError::BaseStore {
            cid: quoted.clone(),
            message: e.to_string(),
        },
    })?;
    let (cid, model) = (cid.to_string(), model.to_string());
    tokio::task::spawn_blocking(move || verify_base(&cid, &bytes, layout, &model))
        .await
        .map_err(|e| AdmissionError::Internal {
            cid: quoted,
            message: format!("the check's thread died: {e}"),
        })?
}

#[cfg(test)]
mod tests {
    use super::*;
    use hanzod_actors::job::TrainingSpec;
    use hanzod_store::MemoryObjectStore;
    use tonic::Code;

    fn mlp() -> Trainer {
        hanzod_train::trainer_of(&TrainingSpec::default(), hanzod_actors::types::JobId(1))
            .expect("the built-in MLP")
    }

    #[test]
    fn every_refusal_has_its_status() {
        let over = AdmissionError::OverBudget(OverBudget {
            flops: 3.2e14,
            budget: 1e14,
        });
        let s = over.status();
        assert_eq!(s.code(), Code::ResourceExhausted);
        assert!(s.message().contains("3.200e14") && s.message().contains("1.000e14"));
        let cid = || "bafk".to_string();
        for (e, code) in [
            (
                AdmissionError::BaseMalformed {
                    cid: cid(),
                    reason: "x".into(),
                },
                Code::InvalidArgument,
            ),
            (AdmissionError::BaseNotFound { cid: cid() }, Code::NotFound),
            (
                AdmissionError::BaseCorrupt {
                    cid: cid(),
                    detail: "x".into(),
                },
                Code::DataLoss,
            ),
            (
                AdmissionError::BaseMismatch {
                    cid: cid(),
                    found: "bafy".into(),
                },
                Code::FailedPrecondition,
            ),
            (
                AdmissionError::BaseNotThisModel {
                    cid: cid(),
                    model: "wine-mlp".into(),
                    reason: "x".into(),
                },
                Code::InvalidArgument,
            ),
            (
                AdmissionError::BaseStore {
                    cid: cid(),
                    message: "x".into(),
                },
                Code::Unavailable,
            ),
            (
                AdmissionError::Internal {
                    cid: cid(),
                    message: "x".into(),
                },
                Code::Internal,
            ),
        ] {
            let s = e.status();
            assert_eq!(s.code(), code, "{e}");
            assert!(
                s.message().contains("spec.training.base") && s.message().contains("bafk"),
                "{s:?}"
            );
        }
    }

    #[test]
    fn quotes_are_bounded() {
        assert_eq!(quote_cid("bafk"), "bafk");
        let long = "b".repeat(300);
        let q = quote_cid(&long);
        assert_eq!(q.chars().count(), CID_QUOTE_CHARS + 1);
        assert!(q.ends_with('…'));
    }

    #[test]
    fn the_mlp_is_budgeted_in_samples() {
        let spec = JobSpec {
            max_nodes: 16,
            ..job()
        };
        let w = validation_work(&mlp(), &spec, 0.1).unwrap();
        assert_eq!(w.params, 11 * 32 + 32 + 32 * 32 + 32 + 32 + 1);
        assert_eq!(w.validation_items, 320);
        let t = TrainingSpec::default();
        assert_eq!(
            w.replay_items,
            u64::from(t.local_steps) * u64::from(t.batch_size)
        );
        assert_eq!((w.deltas, w.spot_checks()), (16, 2));
        let settings = AdmissionSettings {
            validation_budget_flops: 1e14,
            spot_check_rate: 0.1,
        };
        assert_eq!(check_budget(&w, &settings), Ok(()));
        let tight = AdmissionSettings {
            validation_budget_flops: 1e3,
            ..settings
        };
        assert!(matches!(
            check_budget(&w, &tight),
            Err(AdmissionError::OverBudget(_))
        ));
    }

    pub(super) fn job() -> JobSpec {
        JobSpec {
            name: "t".into(),
            epochs: 1,
            min_nodes: 1,
            max_nodes: 2,
            min_vram_bytes: 0,
            pending_deadline_ms: 1000,
            epoch_deadline_ms: 1000,
            utility: 1.0,
            submitter_stake: hanzod_actors::types::GymWei(0),
            training: TrainingSpec::default(),
        }
    }

    #[tokio::test]
    async fn a_base_is_fetched_checked_against_its_cid_and_the_model() {
        let trainer = mlp();
        let store = MemoryObjectStore::new();
        let checkpoint = trainer.init().to_safetensors();
        let cid = store.put(checkpoint.clone().into()).await.unwrap();
        let layout = trainer.layout();
        check_base(&store, &cid, layout.clone(), "wine-mlp")
            .await
            .expect("the seed's weights are a wine-mlp checkpoint");

        // Not a CID; a long string is cut wherever it is quoted.
        let e = check_base(&store, "sha256:abcd", layout.clone(), "wine-mlp")
            .await
            .unwrap_err();
        assert!(matches!(e, AdmissionError::BaseMalformed { .. }), "{e}");
        for long in [format!("bafk{}", "a".repeat(250)), "z".repeat(256)] {
            let e = check_base(&store, &long, layout.clone(), "wine-mlp")
                .await
                .unwrap_err();
            assert!(matches!(e, AdmissionError::BaseMalformed { .. }), "{e}");
            assert!(e.to_string().len() < 2 * CID_QUOTE_CHARS + 100, "{e}");
        }
        // A CID of nothing stored.
        let absent = hanzod_protocol::cid::cid_of(b"never stored").to_string();
        let e = check_base(&store, &absent, layout.clone(), "wine-mlp")
            .await
            .unwrap_err();
        assert_eq!(
            e,
            AdmissionError::BaseNotFound {
                cid: absent.clone()
            }
        );
        // Stored, but not this model's weights: another width of the MLP.
        let other = hanzod_train::init(&hanzod_train::Recipe {
            hidden: 8,
            ..hanzod_train::recipe_of(&TrainingSpec::default(), hanzod_actors::types::JobId(1))
                .unwrap()
        });
        let wrong = store.put(other.to_safetensors().into()).await.unwrap();
        let e = check_base(&store, &wrong, layout.clone(), "wine-mlp")
            .await
            .unwrap_err();
        assert!(
            matches!(&e, AdmissionError::BaseNotThisModel { model, .. } if model == "wine-mlp"),
            "{e}"
        );
        let text = store.put(b"not safetensors".to_vec().into()).await.unwrap();
        let e = check_base(&store, &text, layout.clone(), "wine-mlp")
            .await
            .unwrap_err();
        assert!(matches!(e, AdmissionError::BaseNotThisModel { .. }), "{e}");

        // Bytes that are not what the CID names.
        let e = verify_base(&absent, &checkpoint, layout, "wine-mlp").unwrap_err();
        assert_eq!(
            e,
            AdmissionError::BaseMismatch {
                cid: absent,
                found: cid
            }
        );
    }
}
