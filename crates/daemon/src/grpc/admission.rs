//! What SubmitJob checks once the spec's fields are valid (DESIGN §5, §6): first, that a
//! `training.architecture` given as the CID of a `config.json` names one in the object
//! store, whose text then replaces the CID in the spec ([`resolve_architecture`]); once
//! the recipe is valid, that validating an epoch of the job fits the daemon's budget
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
//! | the `architecture` CID is not in the object store | `NOT_FOUND` |
//! | the store's blocks for it are damaged | `DATA_LOSS` |
//! | the bytes it resolves to have another CID | `FAILED_PRECONDITION` |
//! | the bytes are over [`MAX_ARCHITECTURE_BYTES`] or not UTF-8 (or the store refuses the CID) | `INVALID_ARGUMENT` |
//! | the object store failed | `UNAVAILABLE` |
//!
//! An `architecture` that is neither a CID nor JSON is left as it is, for the catalog's
//! check to refuse (`INVALID_ARGUMENT` "invalid spec.training.architecture").
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

use hanzod_actors::job::{JobSpec, TrainingSpec};
use hanzod_pipeline::budget::{self, EpochValidation, OverBudget};
use hanzod_protocol::cid::CidError;
pub use hanzod_protocol::convert::MAX_ARCHITECTURE_BYTES;
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
    /// `training.architecture` is a CID the object store refuses as one.
    #[error("invalid spec.training.architecture {cid:?}: {reason}")]
    ArchitectureMalformed {
        /// The CID (cut).
        cid: String,
        /// The store's refusal (cut).
        reason: String,
    },
    /// The `config.json` `training.architecture` names is not in the object store.
    #[error(
        "spec.training.architecture {cid} is not in this orchestrator's object store: name \
         a config.json it published, add the file to the store first, or give its text"
    )]
    ArchitectureNotFound {
        /// The CID (cut).
        cid: String,
    },
    /// The store's blocks for the `training.architecture` CID are damaged.
    #[error("spec.training.architecture {cid}: the stored config.json is damaged ({detail})")]
    ArchitectureCorrupt {
        /// The CID (cut).
        cid: String,
        /// The store's words.
        detail: String,
    },
    /// The bytes the `training.architecture` CID resolves to have another canonical CID.
    #[error(
        "spec.training.architecture {cid} resolves to bytes whose CID is {found} (as `ipfs \
         add --cid-version=1` computes it): submit architecture = \"{found}\""
    )]
    ArchitectureMismatch {
        /// The CID asked for (cut).
        cid: String,
        /// The bytes' CID.
        found: String,
    },
    /// The file the `training.architecture` CID names is larger than an architecture may
    /// be on the wire.
    #[error(
        "spec.training.architecture {cid} is {bytes} bytes, more than a config.json may be \
         ({max})"
    )]
    ArchitectureTooLarge {
        /// The CID (cut).
        cid: String,
        /// The file's size, bytes.
        bytes: usize,
        /// The bound, bytes ([`MAX_ARCHITECTURE_BYTES`]).
        max: usize,
    },
    /// The file the `training.architecture` CID names is not UTF-8 text.
    #[error("spec.training.architecture {cid} is not a config.json: {reason}")]
    ArchitectureNotText {
        /// The CID (cut).
        cid: String,
        /// Why (the UTF-8 decoder's words).
        reason: String,
    },
    /// The object store failed fetching the `training.architecture` CID.
    #[error("spec.training.architecture {cid}: the object store failed: {message}")]
    ArchitectureStore {
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
            AdmissionError::BaseMalformed { .. }
            | AdmissionError::BaseNotThisModel { .. }
            | AdmissionError::ArchitectureMalformed { .. }
            | AdmissionError::ArchitectureTooLarge { .. }
            | AdmissionError::ArchitectureNotText { .. } => Status::invalid_argument(msg),
            AdmissionError::BaseNotFound { .. } | AdmissionError::ArchitectureNotFound { .. } => {
                Status::not_found(msg)
            }
            AdmissionError::BaseCorrupt { .. } | AdmissionError::ArchitectureCorrupt { .. } => {
                Status::data_loss(msg)
            }
            AdmissionError::BaseMismatch { .. } | AdmissionError::ArchitectureMismatch { .. } => {
                Status::failed_precondition(msg)
            }
            AdmissionError::BaseStore { .. } | AdmissionError::ArchitectureStore { .. } => {
                Status::unavailable(msg)
            }
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

/// The CID `architecture` (a spec's `training.architecture`) names, when it is a reference
/// to a `config.json` in the object store rather than the text itself: `Some(architecture)`
/// when it does not start with `{` (after leading white space: JSON text) and parses as a
/// CID this store can hold ([`hanzod_protocol::cid::parse_cid`]: sha2-256 over `raw` or
/// `dag-pb`), exactly as given (no white space around it); `None` for anything else, which
/// the catalog then reads as the `config.json` text (and refuses if it is not).
pub fn architecture_cid(architecture: &str) -> Option<&str> {
    let json = architecture.trim_start().starts_with('{');
    (!json && hanzod_protocol::cid::parse_cid(architecture).is_ok()).then_some(architecture)
}

/// The `config.json` text of `bytes`, which the store returned for `cid` (a spec's
/// `training.architecture`): at most [`MAX_ARCHITECTURE_BYTES`] (the bound the text has when
/// sent inline), named by `cid` (recomputed as Kubo's `ipfs add --cid-version=1`, as for a
/// base: the stored bytes are those the CID names), and UTF-8.
/// Whether it is a Qwen3 `config.json` is the catalog's check, as for inline text. Hashes
/// at most [`MAX_ARCHITECTURE_BYTES`]: cheap enough for the async runtime.
///
/// A published checkpoint's `config.json` (its record's `config_cid`) also carries the
/// spec of the job that trained it under `hanzod_job`; that key is dropped, so a job
/// reusing a published architecture does not carry its ancestors' specs (which would grow
/// with every generation until the bound refused it). The text is then re-serialised (keys
/// in serde_json's order), so its own CID differs from the one submitted; the submission
/// is logged with that CID ("job submitted", `architecture`). Other text is returned as
/// stored.
///
/// Errors: [`AdmissionError::ArchitectureTooLarge`],
/// [`AdmissionError::ArchitectureMismatch`], [`AdmissionError::ArchitectureNotText`].
pub fn architecture_text(cid: &str, bytes: &[u8]) -> Result<String, AdmissionError> {
    let text = stored_text(cid, bytes)?;
    let Ok(mut config) = serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&text)
    else {
        return Ok(text);
    };
    if config.remove("hanzod_job").is_none() {
        return Ok(text);
    }
    Ok(serde_json::to_string_pretty(&config).unwrap_or(text))
}

/// [`architecture_text`]'s checks: bounded, named by `cid`, UTF-8.
fn stored_text(cid: &str, bytes: &[u8]) -> Result<String, AdmissionError> {
    if bytes.len() > MAX_ARCHITECTURE_BYTES {
        return Err(AdmissionError::ArchitectureTooLarge {
            cid: quote_cid(cid),
            bytes: bytes.len(),
            max: MAX_ARCHITECTURE_BYTES,
        });
    }
    let found = hanzod_protocol::cid::cid_of(bytes).to_string();
    if found != cid {
        return Err(AdmissionError::ArchitectureMismatch {
            cid: quote_cid(cid),
            found,
        });
    }
    String::from_utf8(bytes.to_vec()).map_err(|e| AdmissionError::ArchitectureNotText {
        cid: quote_cid(cid),
        reason: e.to_string(),
    })
}

/// Replaces `training.architecture`, when it is the CID of a `config.json`
/// ([`architecture_cid`]), by that file's text fetched from `objects` and checked
/// ([`architecture_text`]), so that every later check, the job as stored and its nodes see
/// the text exactly as if it had been sent inline. Returns the CID it resolved (for the
/// log), `None` when the architecture is absent or not a CID (left as it is).
///
/// The store's port has no way to learn an object's size before reading it: the file is
/// read whole, then bounded (a `config.json` is a few KiB).
///
/// Errors: [`AdmissionError::ArchitectureMalformed`] (the store refuses the CID),
/// [`AdmissionError::ArchitectureNotFound`], [`AdmissionError::ArchitectureCorrupt`],
/// [`AdmissionError::ArchitectureStore`], and those of [`architecture_text`]; `training`
/// is unchanged then.
pub async fn resolve_architecture(
    objects: &dyn ObjectStore,
    training: &mut TrainingSpec,
) -> Result<Option<String>, AdmissionError> {
    let Some(cid) = training
        .architecture
        .as_deref()
        .and_then(architecture_cid)
        .map(str::to_string)
    else {
        return Ok(None);
    };
    let quoted = quote_cid(&cid);
    let bytes = objects.get(&cid).await.map_err(|e| match e {
        ObjectError::BadCid { reason } => AdmissionError::ArchitectureMalformed {
            cid: quoted.clone(),
            reason: quote_cid(&reason),
        },
        ObjectError::NotFound { .. } => AdmissionError::ArchitectureNotFound {
            cid: quoted.clone(),
        },
        e @ ObjectError::Corrupt { .. } => AdmissionError::ArchitectureCorrupt {
            cid: quoted.clone(),
            detail: e.to_string(),
        },
        e @ ObjectError::Io { .. } => AdmissionError::ArchitectureStore {
            cid: quoted.clone(),
            message: e.to_string(),
        },
    })?;
    training.architecture = Some(architecture_text(&cid, &bytes)?);
    Ok(Some(cid))
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
        for (e, code) in [
            (
                AdmissionError::ArchitectureMalformed {
                    cid: cid(),
                    reason: "x".into(),
                },
                Code::InvalidArgument,
            ),
            (
                AdmissionError::ArchitectureNotFound { cid: cid() },
                Code::NotFound,
            ),
            (
                AdmissionError::ArchitectureCorrupt {
                    cid: cid(),
                    detail: "x".into(),
                },
                Code::DataLoss,
            ),
            (
                AdmissionError::ArchitectureMismatch {
                    cid: cid(),
                    found: "bafy".into(),
                },
                Code::FailedPrecondition,
            ),
            (
                AdmissionError::ArchitectureTooLarge {
                    cid: cid(),
                    bytes: MAX_ARCHITECTURE_BYTES + 1,
                    max: MAX_ARCHITECTURE_BYTES,
                },
                Code::InvalidArgument,
            ),
            (
                AdmissionError::ArchitectureNotText {
                    cid: cid(),
                    reason: "x".into(),
                },
                Code::InvalidArgument,
            ),
            (
                AdmissionError::ArchitectureStore {
                    cid: cid(),
                    message: "x".into(),
                },
                Code::Unavailable,
            ),
        ] {
            let s = e.status();
            assert_eq!(s.code(), code, "{e}");
            assert!(
                s.message().contains("spec.training.architecture") && s.message().contains("bafk"),
                "{s:?}"
            );
        }
    }

    /// The built-in qwen3-tiny's `config.json`.
    fn tiny_config() -> String {
        hanzod_train::lm::qwen3_tiny().to_json()
    }

    #[test]
    fn an_architecture_is_a_cid_reference_only_when_it_parses_as_one() {
        let config = tiny_config();
        let cid = hanzod_protocol::cid::cid_of(config.as_bytes()).to_string();
        assert_eq!(architecture_cid(&cid), Some(cid.as_str()));
        // A CIDv1 over dag-pb (a file of more than one block) too.
        let big = hanzod_protocol::cid::cid_of(&vec![7u8; 300 * 1024]).to_string();
        assert!(big.starts_with("bafy"), "{big}");
        assert_eq!(architecture_cid(&big), Some(big.as_str()));
        // The text itself, and anything else, is inline text for the catalog to check:
        // white space around a CID, and a CID of another codec (dag-cbor) than this store's.
        let spaced = format!(" {cid}");
        let raw = hanzod_protocol::cid::block_cid(hanzod_protocol::cid::RAW, b"x");
        let cbor = hanzod_protocol::cid::Cid::new_v1(0x71, *raw.hash()).to_string();
        for inline in [
            config.as_str(),
            "  \n{\"model_type\": \"qwen3\"}",
            "{",
            "",
            "config.json",
            "sha256:abcd",
            spaced.as_str(),
            cbor.as_str(),
        ] {
            assert_eq!(architecture_cid(inline), None, "{inline:?}");
        }
    }

    #[test]
    fn fetched_architecture_bytes_are_bounded_named_by_their_cid_and_text() {
        let config = tiny_config();
        let cid = hanzod_protocol::cid::cid_of(config.as_bytes()).to_string();
        assert_eq!(
            architecture_text(&cid, config.as_bytes()),
            Ok(config.clone())
        );

        // Over the wire's bound: refused before it is hashed, with both sizes.
        let big = vec![b' '; MAX_ARCHITECTURE_BYTES + 1];
        let e = architecture_text(&cid, &big).unwrap_err();
        assert_eq!(
            e,
            AdmissionError::ArchitectureTooLarge {
                cid: cid.clone(),
                bytes: MAX_ARCHITECTURE_BYTES + 1,
                max: MAX_ARCHITECTURE_BYTES
            }
        );
        assert!(e.to_string().contains("65537 bytes"), "{e}");
        // At the bound exactly is accepted.
        let edge = vec![b' '; MAX_ARCHITECTURE_BYTES];
        let edge_cid = hanzod_protocol::cid::cid_of(&edge).to_string();
        assert_eq!(
            architecture_text(&edge_cid, &edge).map(|t| t.len()),
            Ok(MAX_ARCHITECTURE_BYTES)
        );

        // Bytes another CID names.
        let other = b"{\"model_type\": \"qwen3\"}";
        let found = hanzod_protocol::cid::cid_of(other).to_string();
        assert_eq!(
            architecture_text(&cid, other),
            Err(AdmissionError::ArchitectureMismatch {
                cid: cid.clone(),
                found
            })
        );

        // Not UTF-8.
        let binary = [0xff, 0xfe, b'{'];
        let binary_cid = hanzod_protocol::cid::cid_of(&binary).to_string();
        let e = architecture_text(&binary_cid, &binary).unwrap_err();
        assert!(
            matches!(&e, AdmissionError::ArchitectureNotText { cid, .. } if *cid == binary_cid),
            "{e}"
        );

        // A published config.json: its `hanzod_job` (the spec that trained it, which
        // holds that job's own architecture) is dropped, the architecture kept key by key.
        let mut published: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(&config).unwrap();
        published.insert(
            "hanzod_job".into(),
            serde_json::json!({"id": 7, "spec": {"training": {"architecture": config}}}),
        );
        let bytes = serde_json::to_vec(&published).unwrap();
        let published_cid = hanzod_protocol::cid::cid_of(&bytes).to_string();
        let text = architecture_text(&published_cid, &bytes).unwrap();
        let kept: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&text).unwrap();
        published.remove("hanzod_job");
        assert_eq!(kept, published);
    }

    /// A store whose every call fails as `error`.
    #[derive(Debug)]
    struct Failing(ObjectError);

    #[async_trait::async_trait]
    impl ObjectStore for Failing {
        async fn put(&self, _: bytes::Bytes) -> Result<String, ObjectError> {
            Err(self.0.clone())
        }
        async fn get(&self, _: &str) -> Result<Arc<[u8]>, ObjectError> {
            Err(self.0.clone())
        }
        async fn contains(&self, _: &str) -> Result<bool, ObjectError> {
            Err(self.0.clone())
        }
        async fn pin(&self, _: &str) -> Result<(), ObjectError> {
            Err(self.0.clone())
        }
        async fn is_pinned(&self, _: &str) -> Result<bool, ObjectError> {
            Err(self.0.clone())
        }
        async fn pins(&self) -> Result<Vec<String>, ObjectError> {
            Err(self.0.clone())
        }
    }

    fn with_architecture(architecture: Option<&str>) -> TrainingSpec {
        TrainingSpec {
            model: hanzod_train::lm::QWEN3.into(),
            dataset: hanzod_train::text::AUSTEN.into(),
            architecture: architecture.map(str::to_string),
            ..TrainingSpec::default()
        }
    }

    #[tokio::test]
    async fn an_architecture_cid_is_replaced_by_the_stored_config_text() {
        let store = MemoryObjectStore::new();
        let config = tiny_config();
        let cid = store.put(config.clone().into_bytes().into()).await.unwrap();

        let mut t = with_architecture(Some(&cid));
        assert_eq!(
            resolve_architecture(&store, &mut t).await,
            Ok(Some(cid.clone()))
        );
        assert_eq!(t, with_architecture(Some(&config)), "only the text changed");
        // The catalog then reads it as if it had been sent inline.
        let model = hanzod_train::catalog::ModelCatalog::builtin()
            .check_training(&t)
            .expect("the stored config.json is a qwen3 architecture");
        assert_eq!(model.param_count(), 1_049_984);

        // Inline text, other strings and no architecture are left as they are, unfetched.
        let down = Failing(ObjectError::Io {
            message: "down".into(),
        });
        for a in [None, Some(config.as_str()), Some("config.json"), Some("{")] {
            let mut t = with_architecture(a);
            assert_eq!(resolve_architecture(&down, &mut t).await, Ok(None), "{a:?}");
            assert_eq!(t, with_architecture(a));
        }

        // A CID of nothing stored.
        let absent = hanzod_protocol::cid::cid_of(b"{\"never\": \"stored\"}").to_string();
        let mut t = with_architecture(Some(&absent));
        let e = resolve_architecture(&store, &mut t).await.unwrap_err();
        assert_eq!(
            e,
            AdmissionError::ArchitectureNotFound {
                cid: absent.clone()
            }
        );
        assert_eq!(e.status().code(), Code::NotFound);
        assert_eq!(
            t,
            with_architecture(Some(&absent)),
            "unchanged when refused"
        );

        // Stored, but too large for a config.json: INVALID_ARGUMENT.
        let huge = store
            .put(vec![b' '; MAX_ARCHITECTURE_BYTES + 1].into())
            .await
            .unwrap();
        let e = resolve_architecture(&store, &mut with_architecture(Some(&huge)))
            .await
            .unwrap_err();
        assert!(
            matches!(e, AdmissionError::ArchitectureTooLarge { .. }),
            "{e}"
        );
        assert_eq!(e.status().code(), Code::InvalidArgument);
        // Not UTF-8: INVALID_ARGUMENT.
        let binary = store.put(vec![0xff, 0xfe].into()).await.unwrap();
        let e = resolve_architecture(&store, &mut with_architecture(Some(&binary)))
            .await
            .unwrap_err();
        assert!(
            matches!(e, AdmissionError::ArchitectureNotText { .. }),
            "{e}"
        );
        assert_eq!(e.status().code(), Code::InvalidArgument);
        // Stored text that is not a qwen3 config.json is the catalog's to refuse.
        let other = store
            .put(b"{\"model_type\": \"llama\"}".to_vec().into())
            .await
            .unwrap();
        let mut t = with_architecture(Some(&other));
        resolve_architecture(&store, &mut t).await.unwrap();
        assert!(hanzod_train::catalog::ModelCatalog::builtin()
            .check_training(&t)
            .is_err());

        // The store's failures, each with its status.
        for (error, code) in [
            (
                ObjectError::BadCid {
                    reason: "refused".into(),
                },
                Code::InvalidArgument,
            ),
            (
                ObjectError::Corrupt {
                    expected: cid.clone(),
                    found: "bafkother".into(),
                },
                Code::DataLoss,
            ),
            (
                ObjectError::Io {
                    message: "down".into(),
                },
                Code::Unavailable,
            ),
            (ObjectError::NotFound { cid: cid.clone() }, Code::NotFound),
        ] {
            let e = resolve_architecture(&Failing(error), &mut with_architecture(Some(&cid)))
                .await
                .unwrap_err();
            let s = e.status();
            assert_eq!(s.code(), code, "{e}");
            assert!(s.message().contains(&cid), "{s:?}");
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
