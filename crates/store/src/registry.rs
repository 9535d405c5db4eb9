//! The model-registry port (DESIGN §7, §11): each epoch's merged checkpoint published as a
//! Hugging Face model repository `{org}/{name}-epoch-{epoch}` (the sink names them
//! `{org}/{model}-job-{job}-epoch-{epoch}`) holding `model.safetensors`,
//! `config.json` and a `README.md` model card whose YAML front matter carries the
//! checkpoint's IPFS CID, plus the files the card declares by CID under `hanzod.files`
//! (a language model's `tokenizer.json`, `tokenizer_config.json` and
//! `generation_config.json`; none for the wine-mlp).
//!
//! | implementation | where |
//! |---|---|
//! | [`FolderRegistry`] | the HF repo layout in a local folder (the embedded default) |
//! | `hanzod_adapters::hub::HubRegistry` | the Hugging Face Hub HTTP API (`HF_ENDPOINT`, `HF_TOKEN`) |
//!
//! The card's YAML is written and read with `serde_yaml_ng` (the maintained fork of the
//! archived `serde_yaml`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use hanzod_protocol::cid::cid_of;

/// The longest part (organisation or model name) of a repo id, in characters (HF's limit).
pub const MAX_REPO_PART: usize = 96;

/// The `library_name` of every card hanzod writes.
pub const LIBRARY_NAME: &str = "hanzod";

/// The weights file of a published repo (safetensors).
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// The model configuration file of a published repo.
pub const CONFIG_FILE: &str = "config.json";
/// The model card of a published repo.
pub const CARD_FILE: &str = "README.md";
/// A language model's tokenizer (Hugging Face `tokenizers` JSON).
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// A language model's `transformers` tokenizer settings.
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";
/// A causal language model's `transformers` generation defaults.
pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";
/// The files every published repo holds, whose CIDs the signed publication record names
/// itself (`cid`, `config_cid`, `card_cid`); any other file of a repo is declared, with
/// its CID, by the card ([`ModelCard::files`]).
pub const CORE_FILES: [&str; 3] = [WEIGHTS_FILE, CONFIG_FILE, CARD_FILE];
/// The longest name of a declared file, in characters.
pub const MAX_FILE_NAME: usize = 128;

/// Why a registry call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// The repo id is not `{org}/{name}` under HF's rules (each part 1..=96 characters of
    /// `[A-Za-z0-9._-]`, no `..` or `--`, not starting or ending with `.` or `-`), or its
    /// name does not end in `-epoch-{card.epoch}`. Carries the reason.
    #[error("bad repo id: {reason}")]
    BadRepo {
        /// Why.
        reason: String,
    },
    /// The card is unusable: a non-finite quality, an empty field, or a `cid` that is not
    /// the CID of the weights. Carries the reason.
    #[error("bad model card: {reason}")]
    BadCard {
        /// Why.
        reason: String,
    },
    /// A README could not be parsed as a hanzod model card. Carries the reason.
    #[error("unparsable model card: {reason}")]
    Parse {
        /// Why (the YAML reader's words, when it was the YAML).
        reason: String,
    },
    /// The repo already exists with different content (published repos are immutable).
    #[error("repo {repo} already exists with different content")]
    Conflict {
        /// The repo id.
        repo: String,
    },
    /// The backing storage or service failed.
    #[error("registry I/O: {message}")]
    Io {
        /// What failed: the step, and the file system's or the service's words.
        message: String,
    },
    /// The service refused the credentials (HTTP 401/403 from the Hub: `HF_TOKEN` missing,
    /// invalid, or without write access to the namespace). Carries the repo, the step and
    /// the service's message. Not transient: retrying does not help.
    #[error("registry refused the credentials: {message}")]
    Unauthorized {
        /// The repo, the step and the service's message.
        message: String,
    },
    /// The repo, revision or file does not exist (HTTP 404, or the Hub's `X-Error-Code:
    /// RepoNotFound`/`RevisionNotFound`/`EntryNotFound`). Carries what was missing and
    /// where.
    #[error("not found in the registry: {what}")]
    NotFound {
        /// What was missing, and where.
        what: String,
    },
    /// The registry adapter is misconfigured (an endpoint that is not an `http(s)` URL, a
    /// token that is not a valid header value, no CA certificates for `https`). Carries the
    /// reason.
    #[error("registry configuration: {reason}")]
    Config {
        /// Why.
        reason: String,
    },
}

/// The model card of one published checkpoint, rendered as the repo's `README.md`.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelCard {
    /// The CID of the weights file (`model.safetensors`) as [`hanzod_protocol::cid::cid_of`] computes it.
    pub cid: String,
    /// The epoch that produced the checkpoint, 0-based.
    pub epoch: u32,
    /// The job that trained it.
    pub job: u64,
    /// The checkpoint's validation loss (lower is better); must be finite.
    pub quality: f64,
    /// The CID of the checkpoint this one was trained from, if any (HF `base_model`): the
    /// previous epoch's, or in epoch 0 the job's `base`.
    pub base_model: Option<String>,
    /// An HF license identifier, e.g. `apache-2.0`.
    pub license: String,
    /// The model's name (the repo name's prefix before `-epoch-{epoch}`).
    pub model: String,
    /// The training data set's name (HF `datasets`).
    pub dataset: String,
    /// The repo's files besides [`CORE_FILES`], by name, each with its CID
    /// ([`hanzod_protocol::cid::cid_of`]): a language model's tokenizer and generation
    /// files. Empty for a repo of the three core files only (the wine-mlp's), whose card
    /// then renders as it did before the list existed. The card's CID is in the signed
    /// record, so these CIDs are signed too.
    pub files: BTreeMap<String, String>,
}

impl RegistryError {
    /// Whether a later attempt may succeed ([`RegistryError::Io`]: the service or storage
    /// failed); every other error is a refusal that repeats.
    pub fn is_transient(&self) -> bool {
        matches!(self, RegistryError::Io { message: _ })
    }
}

/// The `hanzod:` map of the front matter.
#[derive(Debug, Serialize, Deserialize)]
struct HanzodMeta {
    cid: String,
    epoch: u32,
    job: u64,
    quality: f64,
    model: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    files: BTreeMap<String, String>,
}

/// The YAML front matter, in the order the keys are written.
#[derive(Debug, Serialize, Deserialize)]
struct FrontMatter {
    license: String,
    #[serde(default)]
    library_name: Option<String>,
    #[serde(default)]
    tags: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    base_model: Option<String>,
    #[serde(default)]
    datasets: Vec<String>,
    hanzod: HanzodMeta,
}

impl ModelCard {
    /// The card as a Hugging Face `README.md`: YAML front matter between `---` lines (keys
    /// `license`, `library_name: hanzod`, `tags`, `base_model` when set, `datasets`, and a
    /// `hanzod:` map with `cid`, `epoch`, `job`, `quality`, `model`, and `files` (name →
    /// CID, sorted by name) when the card declares files), then a short markdown body.
    /// Deterministic: the same card renders to the same bytes.
    pub fn render(&self) -> String {
        let front = FrontMatter {
            license: self.license.clone(),
            library_name: Some(LIBRARY_NAME.to_string()),
            tags: vec![
                LIBRARY_NAME.to_string(),
                "decentralized-training".to_string(),
                "safetensors".to_string(),
            ],
            base_model: self.base_model.clone(),
            datasets: vec![self.dataset.clone()],
            hanzod: HanzodMeta {
                cid: self.cid.clone(),
                epoch: self.epoch,
                job: self.job,
                quality: self.quality,
                model: self.model.clone(),
                files: self.files.clone(),
            },
        };
        // Serialising plain strings and numbers into YAML cannot fail.
        let yaml = serde_yaml_ng::to_string(&front).unwrap_or_default();
        let previous = match &self.base_model {
            Some(cid) => format!("It continues from the checkpoint `{cid}`."),
            None => "It is the first checkpoint of its job.".to_string(),
        };
        let others = if self.files.is_empty() {
            String::new()
        } else {
            let names: Vec<String> = self.files.keys().map(|n| format!("`{n}`")).collect();
            format!(
                "\nThe repo's other files ({}) are on IPFS too, each under the CID the front \
                 matter gives it (`hanzod.files`).\n",
                names.join(", ")
            )
        };
        format!(
            "---\n{yaml}---\n\n\
             # {model}, epoch {epoch}\n\n\
             The checkpoint of epoch {epoch} of hanzod job {job}, trained on `{dataset}`: \
             validation loss {quality}. {previous}\n\n\
             The weights (`{WEIGHTS_FILE}`) are on IPFS as `{cid}`; recompute that CID \
             (`ipfs add --only-hash --cid-version=1`) to check this copy.\n{others}",
            model = self.model,
            epoch = self.epoch,
            job = self.job,
            dataset = self.dataset,
            quality = self.quality,
            cid = self.cid,
        )
    }

    /// Reads a card back from a `README.md`: the YAML between a first line `---` and the
    /// next line `---` (CRLF tolerated); keys other than those [`ModelCard::render`] writes
    /// are ignored, as is the body. `dataset` is the first of `datasets`.
    ///
    /// Errors: [`RegistryError::Parse`] when there is no front matter, the YAML is invalid,
    /// or `license`, `hanzod` (with all its keys) or `datasets` is missing.
    pub fn parse(readme: &str) -> Result<ModelCard, RegistryError> {
        let yaml = front_matter(readme).ok_or_else(|| RegistryError::Parse {
            reason: "no `---` front matter".to_string(),
        })?;
        let front: FrontMatter =
            serde_yaml_ng::from_str(yaml).map_err(|e| RegistryError::Parse {
                reason: e.to_string(),
            })?;
        let dataset = front
            .datasets
            .into_iter()
            .next()
            .ok_or_else(|| RegistryError::Parse {
                reason: "`datasets` is empty".to_string(),
            })?;
        Ok(ModelCard {
            cid: front.hanzod.cid,
            epoch: front.hanzod.epoch,
            job: front.hanzod.job,
            quality: front.hanzod.quality,
            base_model: front.base_model,
            license: front.license,
            model: front.hanzod.model,
            dataset,
            files: front.hanzod.files,
        })
    }

    /// Checks what [`ModelRegistry::publish`] requires of a card besides its CIDs: a finite
    /// quality and non-empty `cid`, `license`, `model`, `dataset` (and `base_model` when
    /// set), and declared files with valid names ([`validate_file_name`]) and non-empty
    /// CIDs. Errors: [`RegistryError::BadCard`].
    pub fn validate(&self) -> Result<(), RegistryError> {
        if !self.quality.is_finite() {
            return Err(RegistryError::BadCard {
                reason: format!("quality {} is not finite", self.quality),
            });
        }
        for (field, value) in [
            ("cid", &self.cid),
            ("license", &self.license),
            ("model", &self.model),
            ("dataset", &self.dataset),
        ] {
            if value.trim().is_empty() {
                return Err(RegistryError::BadCard {
                    reason: format!("`{field}` is empty"),
                });
            }
        }
        if self
            .base_model
            .as_deref()
            .is_some_and(|b| b.trim().is_empty())
        {
            return Err(RegistryError::BadCard {
                reason: "`base_model` is empty".to_string(),
            });
        }
        for (name, cid) in &self.files {
            validate_file_name(name)?;
            if cid.trim().is_empty() {
                return Err(RegistryError::BadCard {
                    reason: format!("the CID of {name:?} is empty"),
                });
            }
        }
        Ok(())
    }

    /// Every file of the repo this card describes, sorted: [`CORE_FILES`] and the declared
    /// [`ModelCard::files`].
    pub fn repo_files(&self) -> Vec<String> {
        let mut names: Vec<String> = CORE_FILES
            .iter()
            .map(|n| n.to_string())
            .chain(self.files.keys().cloned())
            .collect();
        names.sort();
        names.dedup();
        names
    }
}

/// Checks the name of a declared repo file ([`ModelCard::files`]): 1 to [`MAX_FILE_NAME`]
/// characters of `[A-Za-z0-9._-]` (a file at the repo's root: no `/`), not starting with
/// `.` (no `.gitattributes`, no `..`), and none of [`CORE_FILES`], which the record names
/// itself. Errors: [`RegistryError::BadCard`].
pub fn validate_file_name(name: &str) -> Result<(), RegistryError> {
    let bad = |why: &str| {
        Err(RegistryError::BadCard {
            reason: format!("declared file {name:?} {why}"),
        })
    };
    if name.is_empty() || name.chars().count() > MAX_FILE_NAME {
        return bad("is empty or longer than 128 characters");
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    {
        return bad("has a character outside [A-Za-z0-9._-]");
    }
    if name.starts_with('.') {
        return bad("starts with `.`");
    }
    // Case-insensitively: on a case-insensitive file system `Config.json` is `config.json`.
    if CORE_FILES
        .iter()
        .any(|core| core.eq_ignore_ascii_case(name))
    {
        return bad("is one of the files every repo holds");
    }
    Ok(())
}

/// The text between a first line `---` and the next line `---`.
fn front_matter(readme: &str) -> Option<&str> {
    let readme = readme.strip_prefix('\u{feff}').unwrap_or(readme);
    let rest = readme
        .strip_prefix("---\n")
        .or_else(|| readme.strip_prefix("---\r\n"))?;
    let mut offset = 0;
    for line in rest.split_inclusive('\n') {
        if line.trim_end_matches(['\r', '\n']) == "---" {
            return rest.get(..offset);
        }
        offset += line.len();
    }
    None
}

/// Checks a repo id `{org}/{name}` under HF's rules (see [`RegistryError::BadRepo`]).
pub fn validate_repo(repo: &str) -> Result<(), RegistryError> {
    let parts: Vec<&str> = repo.split('/').collect();
    let [org, name] = parts.as_slice() else {
        return Err(RegistryError::BadRepo {
            reason: format!("{repo:?} is not `{{org}}/{{name}}`"),
        });
    };
    for part in [org, name] {
        let bad = |why: &str| {
            Err(RegistryError::BadRepo {
                reason: format!("{repo:?}: {part:?} {why}"),
            })
        };
        if part.is_empty() {
            return bad("is empty");
        }
        if part.chars().count() > MAX_REPO_PART {
            return bad("is longer than 96 characters");
        }
        if !part
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        {
            return bad("has a character outside [A-Za-z0-9._-]");
        }
        if part.contains("..") || part.contains("--") {
            return bad("contains `..` or `--`");
        }
        if part.starts_with(['.', '-']) || part.ends_with(['.', '-']) {
            return bad("starts or ends with `.` or `-`");
        }
    }
    Ok(())
}

/// One checkpoint to publish.
#[derive(Debug, Clone)]
pub struct ModelUpload {
    /// The repo id, `{org}/{model}-epoch-{epoch}` (see [`ModelUpload::repo_id`]).
    pub repo: String,
    /// The weights, the bytes of `model.safetensors`; [`ModelCard::cid`] must be their CID.
    pub weights: Arc<[u8]>,
    /// The bytes of `config.json`.
    pub config_json: Vec<u8>,
    /// The model card, rendered as `README.md`.
    pub card: ModelCard,
    /// The repo's other files, by name: exactly those [`ModelCard::files`] declares, each
    /// with the CID declared (empty for a repo of the three core files).
    pub files: BTreeMap<String, Arc<[u8]>>,
}

impl ModelUpload {
    /// The repo id of `model`'s checkpoint of `epoch` under `org`:
    /// `{org}/{model}-epoch-{epoch}`.
    pub fn repo_id(org: &str, model: &str, epoch: u32) -> String {
        format!("{org}/{model}-epoch-{epoch}")
    }
}

/// Where a published repo is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A directory on this machine (the [`FolderRegistry`]).
    Path(PathBuf),
    /// A URL (a Hub adapter).
    Url(String),
}

/// The outcome of a [`ModelRegistry::publish`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// The repo id published, `{org}/{model}-epoch-{epoch}`.
    pub repo: String,
    /// Where it is.
    pub location: Location,
}

/// A place to publish checkpoints as Hugging Face model repos.
#[async_trait::async_trait]
pub trait ModelRegistry: Send + Sync + std::fmt::Debug + 'static {
    /// Publishes `upload` as repo `upload.repo` with the files `model.safetensors`,
    /// `config.json`, `README.md` (= `upload.card.render()`) and `upload.files`, all or
    /// nothing.
    ///
    /// Idempotent: publishing identical content again returns the same [`Published`].
    /// Errors: [`RegistryError::BadRepo`] (see [`validate_repo`]; also when the name does
    /// not end in `-epoch-{card.epoch}`), [`RegistryError::BadCard`] (see
    /// [`ModelCard::validate`]; also when `card.cid` is not the CID of `weights`, or
    /// `upload.files` are not exactly the files `card.files` declares, with those CIDs),
    /// [`RegistryError::Conflict`] when the repo exists with other content,
    /// [`RegistryError::Io`].
    async fn publish(&self, upload: &ModelUpload) -> Result<Published, RegistryError>;
}

/// Checks `upload` as [`ModelRegistry::publish`] requires (the CID on a blocking thread).
pub async fn validate_upload(upload: &ModelUpload) -> Result<(), RegistryError> {
    validate_repo(&upload.repo)?;
    let suffix = format!("-epoch-{}", upload.card.epoch);
    if !upload.repo.ends_with(&suffix) {
        return Err(RegistryError::BadRepo {
            reason: format!(
                "{:?} does not end in {suffix:?} (the card's epoch)",
                upload.repo
            ),
        });
    }
    upload.card.validate()?;
    let weights = Arc::clone(&upload.weights);
    let others = upload.files.clone();
    let (found, others) = tokio::task::spawn_blocking(move || {
        let others: BTreeMap<String, String> = others
            .iter()
            .map(|(name, bytes)| (name.clone(), cid_of(bytes).to_string()))
            .collect();
        (cid_of(&weights).to_string(), others)
    })
    .await
    .map_err(|e| RegistryError::Io {
        message: format!("hashing task failed: {e}"),
    })?;
    if found != upload.card.cid {
        return Err(RegistryError::BadCard {
            reason: format!(
                "card cid {} is not the weights' CID {found}",
                upload.card.cid
            ),
        });
    }
    check_declared(&upload.card.files, &others)
}

/// Checks that `found` (the files at hand, name → CID) are exactly the files `declared`
/// declares, with the CIDs declared. Errors: [`RegistryError::BadCard`], naming the first
/// file missing, undeclared, or of another CID.
pub fn check_declared(
    declared: &BTreeMap<String, String>,
    found: &BTreeMap<String, String>,
) -> Result<(), RegistryError> {
    for (name, cid) in found {
        match declared.get(name) {
            None => {
                return Err(RegistryError::BadCard {
                    reason: format!("{name:?} is not declared by the card"),
                })
            }
            Some(d) if d != cid => {
                return Err(RegistryError::BadCard {
                    reason: format!("the card declares {name:?} as {d}, its CID is {cid}"),
                })
            }
            Some(_) => {}
        }
    }
    if let Some(name) = declared.keys().find(|n| !found.contains_key(*n)) {
        return Err(RegistryError::BadCard {
            reason: format!("the card declares {name:?}, which is not given"),
        });
    }
    Ok(())
}

/// The embedded default: repos in a local folder, in the Hub's layout,
/// `root/{org}/{model}-epoch-{epoch}/{model.safetensors, config.json, README.md, …}` (the
/// card's declared files beside them).
///
/// A repo is written into a temporary directory beside it (`root/{org}/.tmp-…`), each file
/// fsync'd, then renamed into place and the parent fsync'd: a reader sees a whole repo or
/// none. Published repos are never modified.
#[derive(Debug, Clone)]
pub struct FolderRegistry {
    root: PathBuf,
}

/// Distinguishes the temporary directories of concurrent publishers within one process.
static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

fn io_error(what: &str, path: &Path, e: std::io::Error) -> RegistryError {
    RegistryError::Io {
        message: format!("{what} {}: {e}", path.display()),
    }
}

impl FolderRegistry {
    /// A registry writing under `root` (created on first publish).
    pub fn new(root: impl Into<PathBuf>) -> FolderRegistry {
        FolderRegistry { root: root.into() }
    }

    /// The registry's root folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory of repo `repo` (valid or not; nothing is checked or read).
    pub fn repo_dir(&self, repo: &str) -> PathBuf {
        self.root.join(repo)
    }
}

/// The files of a repo, in write order: the three core files, then the declared ones by
/// name.
pub fn repo_files(upload: &ModelUpload) -> Vec<(String, Arc<[u8]>)> {
    let core = [
        (WEIGHTS_FILE, Arc::clone(&upload.weights)),
        (CONFIG_FILE, Arc::from(upload.config_json.as_slice())),
        (CARD_FILE, Arc::from(upload.card.render().into_bytes())),
    ];
    core.into_iter()
        .map(|(name, bytes)| (name.to_string(), bytes))
        .chain(
            upload
                .files
                .iter()
                .map(|(name, bytes)| (name.clone(), Arc::clone(bytes))),
        )
        .collect()
}

/// Whether the repo at `dir` holds exactly `files` (and nothing else).
fn same_repo(dir: &Path, files: &[(String, Arc<[u8]>)]) -> Result<bool, RegistryError> {
    let entries = std::fs::read_dir(dir).map_err(|e| io_error("listing", dir, e))?;
    let mut count = 0;
    for entry in entries {
        entry.map_err(|e| io_error("listing", dir, e))?;
        count += 1;
    }
    if count != files.len() {
        return Ok(false);
    }
    for (name, bytes) in files {
        let path = dir.join(name);
        match std::fs::read(&path) {
            Ok(found) if found[..] == bytes[..] => {}
            Ok(_) => return Ok(false),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(io_error("reading", &path, e)),
        }
    }
    Ok(true)
}

fn sync_dir(dir: &Path) -> Result<(), RegistryError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_error("syncing directory", dir, e))
}

/// Writes `files` into a fresh temporary directory in `parent` and returns it.
fn write_tmp_repo(
    parent: &Path,
    name: &str,
    files: &[(String, Arc<[u8]>)],
) -> Result<PathBuf, RegistryError> {
    let tmp = parent.join(format!(
        ".tmp-{name}-{}-{}",
        std::process::id(),
        TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir(&tmp).map_err(|e| io_error("creating", &tmp, e))?;
    let written = (|| {
        for (file, bytes) in files {
            let path = tmp.join(file);
            std::fs::write(&path, &bytes[..]).map_err(|e| io_error("writing", &path, e))?;
            std::fs::File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(|e| io_error("syncing", &path, e))?;
        }
        sync_dir(&tmp)
    })();
    match written {
        Ok(()) => Ok(tmp),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            Err(e)
        }
    }
}

/// The blocking body of [`FolderRegistry::publish`], after validation.
fn publish_blocking(root: &Path, upload: &ModelUpload) -> Result<Published, RegistryError> {
    let (org, name) = upload
        .repo
        .split_once('/')
        .ok_or_else(|| RegistryError::BadRepo {
            reason: upload.repo.clone(),
        })?;
    let parent = root.join(org);
    let dir = parent.join(name);
    let published = Published {
        repo: upload.repo.clone(),
        location: Location::Path(dir.clone()),
    };
    let files = repo_files(upload);
    let existing = |dir: &Path| -> Result<Published, RegistryError> {
        if same_repo(dir, &files)? {
            Ok(published.clone())
        } else {
            Err(RegistryError::Conflict {
                repo: upload.repo.clone(),
            })
        }
    };
    if dir.exists() {
        return existing(&dir);
    }
    std::fs::create_dir_all(&parent).map_err(|e| io_error("creating", &parent, e))?;
    let tmp = write_tmp_repo(&parent, name, &files)?;
    // `rename` of a directory onto an existing non-empty one fails: a concurrent publisher
    // of the same repo won the race, and its content decides.
    match std::fs::rename(&tmp, &dir) {
        Ok(()) => {
            sync_dir(&parent)?;
            Ok(published)
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            if dir.exists() {
                existing(&dir)
            } else {
                Err(io_error("renaming into", &dir, e))
            }
        }
    }
}

#[async_trait::async_trait]
impl ModelRegistry for FolderRegistry {
    async fn publish(&self, upload: &ModelUpload) -> Result<Published, RegistryError> {
        validate_upload(upload).await?;
        let root = self.root.clone();
        let upload = upload.clone();
        tokio::task::spawn_blocking(move || publish_blocking(&root, &upload))
            .await
            .map_err(|e| RegistryError::Io {
                message: format!("publishing task failed: {e}"),
            })?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn front_matter_is_found_between_the_fences() {
        assert_eq!(front_matter("---\na: 1\n---\nbody"), Some("a: 1\n"));
        assert_eq!(front_matter("---\r\na: 1\r\n---\r\n"), Some("a: 1\r\n"));
        assert_eq!(front_matter("---\na: 1\n"), None);
        assert_eq!(front_matter("a: 1\n---\n"), None);
    }

    #[test]
    fn repo_rules() {
        assert!(validate_repo("hanzo/gpt2-epoch-3").is_ok());
        assert!(validate_repo("h_a.n/m.v1_x-epoch-0").is_ok());
        for bad in [
            "gpt2",
            "a/b/c",
            "/b",
            "a/",
            "a/../b",
            "a/b..c",
            "a/b--c",
            "a/.b",
            "a/b-",
            "a/b c",
            "a/b\u{e9}",
        ] {
            assert!(
                matches!(
                    validate_repo(bad),
                    Err(RegistryError::BadRepo { reason: _ })
                ),
                "{bad:?} accepted"
            );
        }
        assert!(validate_repo(&format!("a/{}", "x".repeat(96))).is_ok());
        assert!(validate_repo(&format!("a/{}", "x".repeat(97))).is_err());
    }

    fn card(files: &[(&str, &str)]) -> ModelCard {
        ModelCard {
            cid: "bafyweights".into(),
            epoch: 1,
            job: 2,
            quality: 0.5,
            base_model: None,
            license: "apache-2.0".into(),
            model: "qwen3-tiny".into(),
            dataset: "austen".into(),
            files: files
                .iter()
                .map(|(n, c)| (n.to_string(), c.to_string()))
                .collect(),
        }
    }

    #[test]
    fn declared_files_render_under_hanzod_and_parse_back() {
        let lm = card(&[
            (TOKENIZER_FILE, "bafktok"),
            (GENERATION_CONFIG_FILE, "bafkgen"),
        ]);
        let readme = lm.render();
        assert!(
            readme.contains(
                "  files:\n    generation_config.json: bafkgen\n    tokenizer.json: bafktok\n---\n"
            ),
            "{readme}"
        );
        assert_eq!(ModelCard::parse(&readme), Ok(lm.clone()));
        assert_eq!(
            lm.repo_files(),
            [
                CARD_FILE,
                CONFIG_FILE,
                GENERATION_CONFIG_FILE,
                WEIGHTS_FILE,
                TOKENIZER_FILE
            ]
        );
        // No `files` key for a card of the three core files.
        let core = card(&[]);
        assert!(!core.render().contains("files"));
        assert_eq!(core.repo_files(), [CARD_FILE, CONFIG_FILE, WEIGHTS_FILE]);
        assert_eq!(lm.validate(), Ok(()));
        assert!(matches!(
            card(&[("../x", "bafk")]).validate(),
            Err(RegistryError::BadCard { reason: _ })
        ));
        assert!(matches!(
            card(&[(TOKENIZER_FILE, " ")]).validate(),
            Err(RegistryError::BadCard { reason: _ })
        ));
    }

    #[test]
    fn file_name_rules() {
        for good in [
            TOKENIZER_FILE,
            TOKENIZER_CONFIG_FILE,
            GENERATION_CONFIG_FILE,
            "a-b_c.d",
        ] {
            assert_eq!(validate_file_name(good), Ok(()), "{good:?}");
        }
        for bad in [
            "",
            ".gitattributes",
            "..",
            "a/b",
            "a\\b",
            "a b",
            WEIGHTS_FILE,
            CONFIG_FILE,
            CARD_FILE,
            "Config.json",
            "MODEL.SAFETENSORS",
            "readme.md",
            &"x".repeat(MAX_FILE_NAME + 1),
        ] {
            assert!(validate_file_name(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn declared_and_given_files_must_match_exactly() {
        let map = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(n, c)| (n.to_string(), c.to_string()))
                .collect()
        };
        let declared = map(&[("a.json", "bafka"), ("b.json", "bafkb")]);
        assert_eq!(check_declared(&declared, &declared), Ok(()));
        let reason = |found: &BTreeMap<String, String>| match check_declared(&declared, found) {
            Err(RegistryError::BadCard { reason }) => reason,
            other => panic!("{other:?}"),
        };
        assert!(reason(&map(&[("a.json", "bafka")])).contains("\"b.json\", which is not given"));
        assert!(reason(&map(&[("a.json", "bafka"), ("b.json", "bafkx")]))
            .contains("declares \"b.json\" as bafkb, its CID is bafkx"));
        assert!(reason(&map(&[
            ("a.json", "bafka"),
            ("b.json", "bafkb"),
            ("c.json", "x")
        ]))
        .contains("\"c.json\" is not declared"));
    }
}
