//! Verifying a published checkpoint (DESIGN §7, paper §7.2 "Cross-Verification"): the
//! checks behind `hanzod verify`.
//!
//! Given the files of a published repo (a folder, a Hub repo, or one fetched by the CID of
//! its weights from an object store: [`fetch_published`] follows the signed record to
//! `config.json` and the card, and the card to the files it declares) and the signed
//! publication record the ledger holds for it, [`check`] recomputes every CID and compares:
//!
//! | check | passes when |
//! |---|---|
//! | `files` | a repo target (folder or Hub repo) holds exactly its declared files: `README.md`, `config.json`, `model.safetensors` and those the card declares under `hanzod.files` (the Hub's `.gitattributes` aside); `found` names each file missing and each undeclared one |
//! | `card` | `README.md` parses as a hanzod model card, is byte for byte the card those fields render to, and declares only files a repo can hold |
//! | `weights CID` | the CID of `model.safetensors` equals the card's `hanzod.cid` |
//! | `tokenizer.json CID`, … | the CID of each declared file the target holds equals the one the card declares (`{file} CID`: `tokenizer.json`, `tokenizer_config.json`, `generation_config.json`; `declared file CID` for any other name) |
//! | `record` | the ledger holds a record for these weights |
//! | `signature` | the record's Ed25519 signature verifies (and its signer is the trusted orchestrator key, when one is given) |
//! | `record: weights` | the record's `cid` equals the weights' CID |
//! | `record: config` | the record's `config_cid` equals the CID of `config.json` |
//! | `record: card` | the record's `card_cid` equals the CID of `README.md` |
//! | `record: card fields` | the record's job, epoch and quality equal the card's |
//! | `record: repo` | the record's `hf_repo` equals the repo the files came from (Hub targets) |
//!
//! Every file is covered by a CID in the signed record, itself or through the card (whose
//! CID the record names, and which declares the CIDs of the files beyond the three core
//! ones), so one flipped byte anywhere fails at least one check. A repo of the three core
//! files (the wine-mlp's, and every repo published before cards declared files) declares
//! nothing more, and verifies as it always did.

use std::collections::BTreeMap;

use serde::Serialize;

use hanzod_protocol::cid::cid_of;
use hanzod_protocol::record::{check_signature, SignedPublication};
use hanzod_store::registry::{
    validate_file_name, ModelCard, GENERATION_CONFIG_FILE, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE,
};

/// The files of a published checkpoint, as fetched or read.
#[derive(Debug, Clone, Default)]
pub struct Files {
    /// The bytes of `model.safetensors`.
    pub weights: Vec<u8>,
    /// The bytes of `config.json`, when the target has one (for a CID: when a record was
    /// found to name it).
    pub config: Option<Vec<u8>>,
    /// The bytes of `README.md`, when the target has one (for a CID: when a record was
    /// found to name it).
    pub readme: Option<Vec<u8>>,
    /// The Hub repo id the files came from, when they came from the Hub.
    pub repo: Option<String>,
    /// Every file the target holds (a folder's entries, a Hub repo's tree, less the Hub's
    /// `.gitattributes`), when the target is a repo; `None` for a CID.
    pub listing: Option<Vec<String>>,
    /// The bytes of the files the card declares beyond the three core ones
    /// ([`ModelCard::files`]), by name, for those the target holds (for a CID: those the
    /// card fetched declares).
    pub others: BTreeMap<String, Vec<u8>>,
}

/// The files of a published repo of the three core files (a wine-mlp's), sorted:
/// `README.md`, `config.json`, `model.safetensors`. A card that declares more files
/// extends the list ([`ModelCard::repo_files`]).
pub fn repo_files() -> Vec<String> {
    use hanzod_store::registry::{CARD_FILE, CONFIG_FILE, WEIGHTS_FILE};
    let mut files = vec![
        CARD_FILE.to_string(),
        CONFIG_FILE.to_string(),
        WEIGHTS_FILE.to_string(),
    ];
    files.sort();
    files
}

/// One check's outcome.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Check {
    /// What was checked (the first column of the module's table).
    pub name: &'static str,
    /// Whether it passed.
    pub passed: bool,
    /// What was expected (the reference value), when there is one.
    pub expected: Option<String>,
    /// What was found, or why the check could not be made.
    pub found: String,
}

/// The verdict of [`check`]: every check, in the module table's order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    /// The weights' CID, as recomputed.
    pub cid: String,
    /// The checks made.
    pub checks: Vec<Check>,
    /// Why the verdict is incomplete: the ledger could not be read or holds no record (the
    /// `record` check failed), or no orchestrator key is trusted (the `signature` check
    /// failed for that reason, not because of what the record holds).
    pub incomplete: Option<String>,
}

impl Verdict {
    /// Whether every check passed.
    pub fn verified(&self) -> bool {
        !self.checks.is_empty() && self.checks.iter().all(|c| c.passed)
    }

    /// The checks that failed.
    pub fn failures(&self) -> impl Iterator<Item = &Check> {
        self.checks.iter().filter(|c| !c.passed)
    }

    /// Whether a check failed on what the files or the record hold (as opposed to the
    /// ledger being unreachable, holding no record, or no key being trusted): the files are
    /// not what was published.
    pub fn refuted(&self) -> bool {
        self.failures().any(|c| {
            !(self.incomplete.is_some()
                && (c.name == "record" || (c.name == "signature" && c.expected.is_none())))
        })
    }
}

fn pass(name: &'static str, found: impl Into<String>) -> Check {
    Check {
        name,
        passed: true,
        expected: None,
        found: found.into(),
    }
}

fn fail(name: &'static str, found: impl Into<String>) -> Check {
    Check {
        name,
        passed: false,
        expected: None,
        found: found.into(),
    }
}

/// Compares `expected` with `found`: passes when equal.
fn compare(name: &'static str, expected: &str, found: &str) -> Check {
    Check {
        name,
        passed: expected == found,
        expected: Some(expected.to_string()),
        found: found.to_string(),
    }
}

/// The `files` check: `listing` against `declared` (both file names), naming each declared
/// file missing and each file not declared.
fn files_check(declared: &[String], listing: &[String]) -> Check {
    let mut found = listing.to_vec();
    found.sort();
    let missing: Vec<&str> = declared
        .iter()
        .filter(|d| !found.contains(d))
        .map(String::as_str)
        .collect();
    let undeclared: Vec<&str> = found
        .iter()
        .filter(|f| !declared.contains(f))
        .map(String::as_str)
        .collect();
    let mut text = found.join(", ");
    let mut why = Vec::new();
    if !missing.is_empty() {
        why.push(format!("missing {}", missing.join(", ")));
    }
    if !undeclared.is_empty() {
        why.push(format!(
            "undeclared extra file{} {}",
            if undeclared.len() == 1 { "" } else { "s" },
            undeclared.join(", ")
        ));
    }
    if !why.is_empty() {
        text = format!("{text} ({})", why.join("; "));
    }
    Check {
        name: "files",
        passed: missing.is_empty() && undeclared.is_empty(),
        expected: Some(declared.join(", ")),
        found: text,
    }
}

/// The name of the check of declared file `name`'s CID: `{name} CID` for the files hanzod
/// publishes, `declared file CID` for any other.
fn file_check_name(name: &str) -> Option<&'static str> {
    match name {
        TOKENIZER_FILE => Some("tokenizer.json CID"),
        TOKENIZER_CONFIG_FILE => Some("tokenizer_config.json CID"),
        GENERATION_CONFIG_FILE => Some("generation_config.json CID"),
        _ => None,
    }
}

/// The check of declared file `name`: its CID `found` against the `declared` one.
fn declared_file_check(name: &str, declared: &str, found: &str) -> Check {
    match file_check_name(name) {
        Some(check) => compare(check, declared, found),
        None => compare(
            "declared file CID",
            &format!("{name} {declared}"),
            &format!("{name} {found}"),
        ),
    }
}

/// The names a card declares that a repo can hold ([`validate_file_name`]): the files a
/// reader may fetch or open.
fn declared_names(card: &ModelCard) -> impl Iterator<Item = &String> {
    card.files
        .keys()
        .filter(|name| validate_file_name(name).is_ok())
}

/// Runs the checks of the module table on `files` against `record` (the ledger's record for
/// these weights: `Ok(None)` when it holds none, `Err` when it could not be asked, with the
/// reason). `cid` is the weights' CID ([`cid_of`] of `files.weights`, computed once by the
/// caller, who needs it to find the record). `trusted` is the orchestrator key the reader
/// trusts, if any. The other CIDs are computed on the calling thread.
pub fn check(
    files: &Files,
    cid: &str,
    record: Result<Option<SignedPublication>, String>,
    trusted: Option<[u8; 32]>,
) -> Verdict {
    let cid = cid.to_string();
    let mut checks = Vec::new();
    let card = files
        .readme
        .as_ref()
        .map(|readme| -> Result<ModelCard, String> {
            let text = std::str::from_utf8(readme).map_err(|e| format!("not UTF-8: {e}"))?;
            let card = ModelCard::parse(text).map_err(|e| e.to_string())?;
            if card.render().as_bytes() != readme.as_slice() {
                return Err("README.md differs from the card its front matter renders to".into());
            }
            for name in card.files.keys() {
                validate_file_name(name).map_err(|e| e.to_string())?;
            }
            Ok(card)
        });
    if let Some(listing) = &files.listing {
        // The files the card declares (the three core ones when there is no card to read).
        let declared = match &card {
            Some(Ok(card)) => card.repo_files(),
            _ => repo_files(),
        };
        checks.push(files_check(&declared, listing));
    }
    match &card {
        None => {}
        Some(Ok(card)) => {
            checks.push(pass(
                "card",
                format!("job {}, epoch {}", card.job, card.epoch),
            ));
            checks.push(compare("weights CID", &card.cid, &cid));
            // A declared file the target lacks is the `files` check's to report.
            for (name, declared) in &card.files {
                let Some(bytes) = files.others.get(name) else {
                    continue;
                };
                checks.push(declared_file_check(
                    name,
                    declared,
                    &cid_of(bytes).to_string(),
                ));
            }
        }
        Some(Err(why)) => checks.push(fail("card", why.clone())),
    }
    let publication = match record {
        Ok(Some(p)) => {
            checks.push(pass(
                "record",
                format!(
                    "job {}, epoch {}, signed at {} ms",
                    p.record.job.0, p.record.epoch, p.record.timestamp.0
                ),
            ));
            p
        }
        Ok(None) => {
            // No record is not proof of tampering (a ledger that lost its records, a
            // checkpoint not yet recorded): the verdict is incomplete.
            let why = format!("the ledger holds no record of {cid}");
            checks.push(fail("record", why.clone()));
            return Verdict {
                cid,
                checks,
                incomplete: Some(why),
            };
        }
        Err(why) => {
            checks.push(fail("record", format!("could not read the ledger: {why}")));
            return Verdict {
                cid,
                checks,
                incomplete: Some(why),
            };
        }
    };
    let signer = hex::encode(publication.signer);
    let mut incomplete = None;
    checks.push(match (check_signature(&publication), trusted) {
        (Err(e), _) => fail("signature", format!("{e} (signer {signer})")),
        (Ok(()), Some(key)) => compare("signature", &hex::encode(key), &signer),
        (Ok(()), None) => {
            // Anyone can sign a record: a valid signature proves nothing without the key
            // of the orchestrator the reader trusts.
            let why = format!("valid, by {signer}, but no orchestrator key is trusted");
            incomplete = Some(why.clone());
            fail("signature", why)
        }
    });
    let r = &publication.record;
    checks.push(compare("record: weights", &r.cid, &cid));
    if let Some(config) = &files.config {
        checks.push(compare(
            "record: config",
            &r.config_cid,
            &cid_of(config).to_string(),
        ));
    }
    if let Some(readme) = &files.readme {
        checks.push(compare(
            "record: card",
            &r.card_cid,
            &cid_of(readme).to_string(),
        ));
    }
    if let Some(Ok(card)) = &card {
        let fields = |job: u64, epoch: u32, quality: f64| {
            format!("job {job}, epoch {epoch}, quality {quality}")
        };
        checks.push(compare(
            "record: card fields",
            &fields(r.job.0, r.epoch, r.quality),
            &fields(card.job, card.epoch, card.quality),
        ));
    }
    if let Some(repo) = &files.repo {
        checks.push(compare("record: repo", &r.hf_repo, repo));
    }
    Verdict {
        cid,
        checks,
        incomplete,
    }
}

/// What `hanzod verify` was pointed at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A folder of a published repo: `model.safetensors`, `config.json`, `README.md` and
    /// the files the card declares (all but the weights are checked when present; the
    /// `files` check reports those missing).
    Folder(std::path::PathBuf),
    /// A Hugging Face repo id, `{org}/{name}`, downloaded from the Hub.
    Repo(String),
    /// The weights' CID, fetched from an object store (IPFS).
    Cid(String),
}

/// Why [`Target::parse`] refused a target.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// A file was given where the folder holding it is wanted.
    #[error("{} is a file: pass the folder that holds model.safetensors", path.display())]
    IsAFile {
        /// The file.
        path: std::path::PathBuf,
    },
    /// What can only be a path names no folder.
    #[error("no such folder: {}", path.display())]
    NoSuchFolder {
        /// The path.
        path: std::path::PathBuf,
    },
    /// Neither a folder, a CID nor a repo id.
    #[error("{text:?} is neither a folder, a CID nor a Hub repo id ({repo})")]
    Unrecognised {
        /// The target as given.
        text: String,
        /// Why it is not a repo id.
        #[source]
        repo: hanzod_store::registry::RegistryError,
    },
}

impl Target {
    /// Reads `text` as a target: an existing folder, else a CID, else a repo id.
    ///
    /// Errors: the reason `text` is none of them.
    pub fn parse(text: &str) -> Result<Target, TargetError> {
        let path = std::path::Path::new(text);
        if path.is_dir() {
            return Ok(Target::Folder(path.to_path_buf()));
        }
        if path.is_file() {
            return Err(TargetError::IsAFile {
                path: path.to_path_buf(),
            });
        }
        // What can only be a path (a repo id is exactly `org/name`) is a folder not found,
        // not a repo to download.
        if text.starts_with(['/', '.', '~']) || text.matches('/').count() > 1 {
            return Err(TargetError::NoSuchFolder {
                path: path.to_path_buf(),
            });
        }
        if hanzod_store::objects::parse_cid(text).is_ok() {
            return Ok(Target::Cid(text.to_string()));
        }
        match hanzod_store::registry::validate_repo(text) {
            Ok(()) => Ok(Target::Repo(text.to_string())),
            Err(repo) => Err(TargetError::Unrecognised {
                text: text.to_string(),
                repo,
            }),
        }
    }
}

/// Why the files could not be read or fetched (the verdict could not be reached: exit 2).
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// A file of a folder could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// The Hub failed or has no such repo or file.
    #[error(transparent)]
    Hub(#[from] hanzod_store::registry::RegistryError),
    /// The object store failed or has no such CID.
    #[error(transparent)]
    Objects(#[from] hanzod_store::objects::ObjectError),
}

/// The files of the published repo in `dir`: `model.safetensors` is required, `config.json`
/// and `README.md` are read when present, and so are the files the card declares
/// ([`ModelCard::files`], names a repo can hold only).
pub async fn read_folder(dir: &std::path::Path) -> Result<Files, FetchError> {
    use hanzod_store::registry::{CARD_FILE, CONFIG_FILE, WEIGHTS_FILE};
    let read = |name: &str, required: bool| {
        let path = dir.join(name);
        async move {
            match tokio::fs::read(&path).await {
                Ok(bytes) => Ok(Some(bytes)),
                Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(source) => Err(FetchError::Read {
                    path: path.display().to_string(),
                    source,
                }),
            }
        }
    };
    let listing = std::fs::read_dir(dir)
        .and_then(|entries| {
            entries
                .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect::<Result<Vec<_>, _>>()
        })
        .map_err(|source| FetchError::Read {
            path: dir.display().to_string(),
            source,
        })?;
    let readme = read(CARD_FILE, false).await?;
    let mut others = BTreeMap::new();
    if let Some(card) = readme.as_deref().and_then(parse_card) {
        for name in declared_names(&card).filter(|n| listing.contains(n)) {
            if let Some(bytes) = read(name, false).await? {
                others.insert(name.clone(), bytes);
            }
        }
    }
    Ok(Files {
        weights: read(WEIGHTS_FILE, true).await?.unwrap_or_default(),
        config: read(CONFIG_FILE, false).await?,
        readme,
        repo: None,
        listing: Some(listing),
        others,
    })
}

/// `readme` as a model card, if it is one.
fn parse_card(readme: &[u8]) -> Option<ModelCard> {
    ModelCard::parse(std::str::from_utf8(readme).ok()?).ok()
}

/// Lists Hub repo `repo` and downloads its files into `dir` (the weights streamed to disk,
/// with a progress bar on `progress`), then reads them: the core files and those the card
/// declares. A missing `config.json`, `README.md` or declared file is left to the `files`
/// check; missing weights are an error.
pub async fn fetch_repo(
    hub: &hanzod_adapters::hub::HubClient,
    repo: &str,
    dir: &std::path::Path,
    progress: Option<&indicatif::ProgressBar>,
) -> Result<Files, FetchError> {
    use hanzod_store::registry::{CARD_FILE, CONFIG_FILE, WEIGHTS_FILE};
    let listing: Vec<String> = hub
        .tree(repo)
        .await?
        .into_iter()
        .filter(|e| e.kind == "file" && e.path != ".gitattributes")
        .map(|e| e.path)
        .collect();
    let has = |name: &str| listing.iter().any(|p| p == name);
    let config = match has(CONFIG_FILE) {
        true => Some(hub.fetch_small(repo, CONFIG_FILE).await?),
        false => None,
    };
    let readme = match has(CARD_FILE) {
        true => Some(hub.fetch_small(repo, CARD_FILE).await?),
        false => None,
    };
    let mut others = BTreeMap::new();
    if let Some(card) = readme.as_deref().and_then(parse_card) {
        for name in declared_names(&card).filter(|n| has(n)) {
            others.insert(name.clone(), hub.fetch_small(repo, name).await?);
        }
    }
    let weights_path = dir.join(WEIGHTS_FILE);
    hub.download(repo, WEIGHTS_FILE, &weights_path, progress)
        .await?;
    let weights = tokio::fs::read(&weights_path)
        .await
        .map_err(|source| FetchError::Read {
            path: weights_path.display().to_string(),
            source,
        })?;
    Ok(Files {
        weights,
        config,
        readme,
        repo: Some(repo.to_string()),
        listing: Some(listing),
        others,
    })
}

/// Most files a card may declare beyond the three core ones for [`fetch_published`] to
/// fetch them (a language model's repo declares three).
pub const MAX_DECLARED_FILES: usize = 16;

/// Longest CID (or other untrusted text from a record) quoted in an error, characters.
const MAX_QUOTED: usize = 100;

/// A published repo fetched by CID ([`fetch_published`]).
#[derive(Debug, Clone, Default)]
pub struct Fetched {
    /// The files read whole, each checked by the object store against the CID naming it.
    pub files: Files,
    /// A failed check for each file whose stored bytes do not hash to the CID naming it
    /// (the object store refused them), named as [`check`] names the check that covers
    /// the file (`weights CID`, `record: config`, `record: card`, `tokenizer.json CID`, …);
    /// such a file is absent from `files`.
    pub corrupt: Vec<Check>,
}

/// Why [`fetch_published`] could not fetch a published repo (the verdict cannot be
/// reached: exit 2).
#[derive(Debug, thiserror::Error)]
pub enum RepoFetchError {
    /// A file the record or the card names is not in the object store, or the store could
    /// not be read.
    #[error("{file} ({cid}): {source}")]
    Unavailable {
        /// The file's name in the repo.
        file: String,
        /// Its CID, as the record or the card names it (bounded).
        cid: String,
        /// What the object store said.
        #[source]
        source: hanzod_store::objects::ObjectError,
    },
    /// The card declares more files than [`MAX_DECLARED_FILES`].
    #[error(
        "README.md ({cid}) declares {declared} files, more than the {} fetched",
        MAX_DECLARED_FILES
    )]
    TooManyFiles {
        /// The card's CID.
        cid: String,
        /// How many files it declares.
        declared: usize,
    },
}

/// The file named `file` stored under `cid` in `objects`: `Ok(None)`, with the failed
/// check `check(found)` pushed to `corrupt`, when the stored bytes do not hash to `cid`.
async fn fetch_file(
    objects: &dyn hanzod_store::objects::ObjectStore,
    file: &str,
    cid: &str,
    check: impl FnOnce(&str) -> Check,
    corrupt: &mut Vec<Check>,
) -> Result<Option<Vec<u8>>, RepoFetchError> {
    use hanzod_store::objects::ObjectError;
    match objects.get(cid).await {
        Ok(bytes) => Ok(Some(bytes.to_vec())),
        Err(ObjectError::Corrupt { expected, found }) => {
            // `expected` names the damaged block: the file's own CID for a file of one block.
            let found = if expected == cid {
                found
            } else {
                format!("{found} in its block {expected}")
            };
            corrupt.push(Check {
                passed: false,
                ..check(&found)
            });
            Ok(None)
        }
        Err(source) => Err(RepoFetchError::Unavailable {
            file: file.to_string(),
            cid: hanzod_protocol::status::quote_bounded(cid, MAX_QUOTED),
            source,
        }),
    }
}

/// The published repo of the weights `cid`, from `objects` (which checks every file
/// against the CID naming it as it reads it): `model.safetensors`, and, when `record` (the
/// signed record found for these weights) is given, `config.json` (`record.config_cid`),
/// `README.md` (`record.card_cid`) and each file the card declares under `hanzod.files`
/// whose name a repo can hold (a name [`validate_file_name`] refuses is not fetched:
/// [`check`] fails the card for it). A file whose stored bytes do not hash to its CID is
/// left out of the files and reported in [`Fetched::corrupt`]; pass the result to
/// [`check_fetched`].
///
/// Errors: [`RepoFetchError::Unavailable`] naming the first file the store lacks or could
/// not read; [`RepoFetchError::TooManyFiles`] when the card declares more than
/// [`MAX_DECLARED_FILES`].
pub async fn fetch_published(
    objects: &dyn hanzod_store::objects::ObjectStore,
    cid: &str,
    record: Option<&hanzod_protocol::record::PublicationRecord>,
) -> Result<Fetched, RepoFetchError> {
    use hanzod_store::registry::{CARD_FILE, CONFIG_FILE, WEIGHTS_FILE};
    let mut corrupt = Vec::new();
    let weights = fetch_file(
        objects,
        WEIGHTS_FILE,
        cid,
        |found| compare("weights CID", cid, found),
        &mut corrupt,
    )
    .await?;
    let mut files = Files {
        weights: weights.unwrap_or_default(),
        ..Files::default()
    };
    let Some(record) = record else {
        return Ok(Fetched { files, corrupt });
    };
    files.config = fetch_file(
        objects,
        CONFIG_FILE,
        &record.config_cid,
        |found| compare("record: config", &record.config_cid, found),
        &mut corrupt,
    )
    .await?;
    files.readme = fetch_file(
        objects,
        CARD_FILE,
        &record.card_cid,
        |found| compare("record: card", &record.card_cid, found),
        &mut corrupt,
    )
    .await?;
    if let Some(card) = files.readme.as_deref().and_then(parse_card) {
        if card.files.len() > MAX_DECLARED_FILES {
            return Err(RepoFetchError::TooManyFiles {
                cid: hanzod_protocol::status::quote_bounded(&record.card_cid, MAX_QUOTED),
                declared: card.files.len(),
            });
        }
        for name in declared_names(&card) {
            let declared = &card.files[name];
            let check = |found: &str| declared_file_check(name, declared, found);
            if let Some(bytes) = fetch_file(objects, name, declared, check, &mut corrupt).await? {
                files.others.insert(name.clone(), bytes);
            }
        }
    }
    Ok(Fetched { files, corrupt })
}

/// [`check`] of a repo fetched by CID ([`fetch_published`]): the checks of the files
/// fetched, with the failed check of each file the object store found corrupt in place of
/// the check of the same name (the `weights CID` the card declares) or added.
pub fn check_fetched(
    fetched: &Fetched,
    cid: &str,
    record: Result<Option<SignedPublication>, String>,
    trusted: Option<[u8; 32]>,
) -> Verdict {
    let mut verdict = check(&fetched.files, cid, record, trusted);
    for failed in &fetched.corrupt {
        match verdict.checks.iter_mut().find(|c| c.name == failed.name) {
            Some(c) => *c = failed.clone(),
            None => verdict.checks.push(failed.clone()),
        }
    }
    verdict
}

impl Files {
    /// Each file held, by its name in the repo: `model.safetensors`, `config.json` and
    /// `README.md` (those present), then the others.
    pub fn named(&self) -> impl Iterator<Item = (&str, &[u8])> {
        use hanzod_store::registry::{CARD_FILE, CONFIG_FILE, WEIGHTS_FILE};
        let core = [
            (WEIGHTS_FILE, Some(&self.weights)),
            (CONFIG_FILE, self.config.as_ref()),
            (CARD_FILE, self.readme.as_ref()),
        ];
        let others = self.others.iter().map(|(n, b)| (n.as_str(), Some(b)));
        core.into_iter()
            .chain(others)
            .filter_map(|(name, bytes)| Some((name, bytes?.as_slice())))
    }

    /// Writes the files into the folder `dir` (which must exist) as a published repo
    /// ([`Files::named`]; a name a repo cannot hold, [`validate_file_name`], is refused).
    ///
    /// Errors: the file that could not be written, or the name refused.
    pub fn write_folder(&self, dir: &std::path::Path) -> std::io::Result<()> {
        for (name, bytes) in self.named() {
            if !hanzod_store::registry::CORE_FILES.contains(&name) {
                validate_file_name(name).map_err(std::io::Error::other)?;
            }
            let path = dir.join(name);
            std::fs::write(&path, bytes)
                .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        }
        Ok(())
    }
}

/// A fresh object store in `dir` holding each of `files` under its CID, as the publisher
/// stores a repo (for tests).
#[cfg(test)]
pub(crate) async fn stored_in(dir: &std::path::Path, files: &Files) -> hanzod_store::FsObjectStore {
    use hanzod_store::ObjectStore;
    let _ = std::fs::remove_dir_all(dir);
    let store = hanzod_store::FsObjectStore::open(dir).await.expect("store");
    for (name, bytes) in files.named() {
        let cid = store.put(bytes.to_vec().into()).await.expect("put");
        assert_eq!(cid, cid_of(bytes).to_string(), "{name}");
    }
    store
}

/// The job and epoch a model card names, if `readme` is one (to find the record of a
/// checkpoint whose weights no record names).
pub fn card_epoch(readme: &[u8]) -> Option<(u64, u32)> {
    let card = parse_card(readme)?;
    Some((card.job, card.epoch))
}

/// The records read from a file, and the entries skipped: (index in the array, why).
pub type ParsedRecords = (Vec<SignedPublication>, Vec<(usize, serde_json::Error)>);

/// Why a records file could not be read at all ([`parse_records`]).
#[derive(Debug, thiserror::Error)]
#[error("not a JSON array of records: {0}")]
pub struct RecordsError(#[source] pub serde_json::Error);

/// Reads a records file (a JSON array of signed publications, as `hanzod demo` writes
/// `publications.json`). Entries that are not well-formed records are skipped, with their
/// index and why, so that one damaged record does not hide the others (a skipped record
/// can only make a verdict fail, never pass). Errors: the bytes are not a JSON array.
pub fn parse_records(bytes: &[u8]) -> Result<ParsedRecords, RecordsError> {
    let entries: Vec<serde_json::Value> = serde_json::from_slice(bytes).map_err(RecordsError)?;
    let mut records = Vec::new();
    let mut skipped = Vec::new();
    for (i, entry) in entries.into_iter().enumerate() {
        match serde_json::from_value(entry) {
            Ok(r) => records.push(r),
            Err(e) => skipped.push((i, e)),
        }
    }
    Ok((records, skipped))
}

/// What [`find_record`] looks for.
#[derive(Debug, Clone, Copy, Default)]
pub struct Lookup<'a> {
    /// The weights' CID.
    pub cid: &'a str,
    /// The (job, epoch) the model card names, when there is a card.
    pub card: Option<(u64, u32)>,
    /// The Hub repo the files came from, when they did.
    pub repo: Option<&'a str>,
    /// The orchestrator key the reader trusts.
    pub trusted: Option<[u8; 32]>,
}

/// The record among `records` that speaks for the checkpoint `lookup` describes.
///
/// Only records whose signature verifies and whose signer is the trusted key (when one is
/// given) are candidates, so a forged record listed first cannot shadow the genuine one;
/// when none is, the best of all records is returned, so that [`check`] says what is
/// wrong with it. Among candidates, one naming the CID and the card's (job, epoch) and the
/// repo beats one naming fewer of them: a kept epoch publishes the previous epoch's weights
/// again, so its CID alone names two records. A record must name the CID or the card's
/// (job, epoch) to be returned.
pub fn find_record(records: &[SignedPublication], lookup: Lookup<'_>) -> Option<SignedPublication> {
    let score = |p: &SignedPublication| {
        let r = &p.record;
        let cid = r.cid == lookup.cid;
        let epoch = lookup.card == Some((r.job.0, r.epoch));
        let repo = lookup.repo == Some(r.hf_repo.as_str());
        (cid || epoch).then_some(4 * u8::from(cid) + 2 * u8::from(epoch) + u8::from(repo))
    };
    let trusted = |p: &&SignedPublication| {
        check_signature(p).is_ok() && lookup.trusted.is_none_or(|k| p.signer == k)
    };
    let best = |candidates: &mut dyn Iterator<Item = &SignedPublication>| {
        candidates
            .filter_map(|p| Some((score(p)?, p)))
            // The first of equals: the oldest record.
            .fold(
                None::<(u8, &SignedPublication)>,
                |best, (s, p)| match best {
                    Some((b, _)) if b >= s => best,
                    _ => Some((s, p)),
                },
            )
            .map(|(_, p)| p.clone())
    };
    best(&mut records.iter().filter(trusted)).or_else(|| best(&mut records.iter()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hanzod_actors::types::{JobId, Timestamp};
    use hanzod_protocol::identity::Identity;
    use hanzod_protocol::record::{sign, PublicationRecord};
    use proptest::prelude::*;

    const REPO: &str = "org/wine-job-3-epoch-2";

    fn published(weights: &[u8]) -> (Files, SignedPublication, [u8; 32]) {
        published_with(weights, BTreeMap::new())
    }

    /// A language model's other files (small stand-ins).
    fn lm_files() -> BTreeMap<String, Vec<u8>> {
        [
            (
                TOKENIZER_FILE,
                br#"{"model": {"type": "BPE", "vocab": {}}}"#.to_vec(),
            ),
            (
                TOKENIZER_CONFIG_FILE,
                br#"{"model_max_length": 512}"#.to_vec(),
            ),
            (GENERATION_CONFIG_FILE, br#"{"eos_token_id": 0}"#.to_vec()),
        ]
        .into_iter()
        .map(|(n, b)| (n.to_string(), b))
        .collect()
    }

    /// A publication whose card declares `others` beside the three core files.
    fn published_with(
        weights: &[u8],
        others: BTreeMap<String, Vec<u8>>,
    ) -> (Files, SignedPublication, [u8; 32]) {
        let key = Identity::from_seed([7; 32]);
        let card = ModelCard {
            cid: cid_of(weights).to_string(),
            epoch: 2,
            job: 3,
            quality: 0.5,
            base_model: Some("bafkprevious".into()),
            license: "apache-2.0".into(),
            model: "wine".into(),
            dataset: "wine-quality-red".into(),
            files: others
                .iter()
                .map(|(n, b)| (n.clone(), cid_of(b).to_string()))
                .collect(),
        };
        let readme = card.render().into_bytes();
        let config = br#"{"model_type": "wine"}"#.to_vec();
        let record = PublicationRecord {
            job: JobId(3),
            epoch: 2,
            cid: card.cid.clone(),
            config_cid: cid_of(&config).to_string(),
            card_cid: cid_of(&readme).to_string(),
            hf_repo: REPO.into(),
            quality: 0.5,
            timestamp: Timestamp(1_700_000_000_000),
        };
        let files = Files {
            weights: weights.to_vec(),
            config: Some(config),
            readme: Some(readme),
            repo: Some(REPO.into()),
            listing: Some(card.repo_files()),
            others,
        };
        (files, sign(record, &key), key.node_id().0)
    }

    fn failed(v: &Verdict) -> Vec<&'static str> {
        v.failures().map(|c| c.name).collect()
    }

    #[test]
    fn a_language_models_declared_files_are_each_checked() {
        let (files, record, key) = published_with(&[1, 2, 3], lm_files());
        let cid = cid_of(&files.weights).to_string();
        let v = check(&files, &cid, Ok(Some(record.clone())), Some(key));
        assert!(v.verified(), "{v:#?}");
        assert_eq!(v.checks.len(), 13);
        assert_eq!(
            v.checks[0].expected.as_deref(),
            Some(
                "README.md, config.json, generation_config.json, model.safetensors, \
                 tokenizer.json, tokenizer_config.json"
            )
        );
        for name in lm_files().keys() {
            let check = format!("{name} CID");
            assert!(
                v.checks.iter().any(|c| c.name == check && c.passed),
                "{name}"
            );
        }

        // A tampered tokenizer: its CID is not the declared one.
        let mut tampered = files.clone();
        tampered.others.get_mut(TOKENIZER_FILE).expect("tokenizer")[3] ^= 1;
        let v = check(&tampered, &cid, Ok(Some(record.clone())), Some(key));
        assert_eq!(failed(&v), ["tokenizer.json CID"]);
        assert!(v.refuted());

        // A deleted tokenizer: the repo lacks a declared file.
        let mut deleted = files.clone();
        deleted.others.remove(TOKENIZER_FILE);
        deleted
            .listing
            .as_mut()
            .expect("listing")
            .retain(|f| f != TOKENIZER_FILE);
        let v = check(&deleted, &cid, Ok(Some(record.clone())), Some(key));
        assert_eq!(failed(&v), ["files"]);
        assert!(
            v.checks[0].found.ends_with("(missing tokenizer.json)"),
            "{v:#?}"
        );
        assert!(v.refuted());

        // An undeclared file beside them is reported by name.
        let mut extra = files.clone();
        extra
            .listing
            .as_mut()
            .expect("listing")
            .extend(["vocab.txt".to_string(), "merges.txt".to_string()]);
        let v = check(&extra, &cid, Ok(Some(record.clone())), Some(key));
        assert_eq!(failed(&v), ["files"]);
        assert!(
            v.checks[0]
                .found
                .ends_with("(undeclared extra files merges.txt, vocab.txt)"),
            "{v:#?}"
        );

        // The card of the three core files does not cover the tokenizer files: a repo that
        // holds them beside an older card's three is not that publication.
        let (core, core_record, _) = published(&[1, 2, 3]);
        let mut listing = core.listing.clone().expect("listing");
        listing.push(TOKENIZER_FILE.into());
        let v = check(
            &Files {
                listing: Some(listing),
                ..core
            },
            &cid,
            Ok(Some(core_record)),
            Some(key),
        );
        assert_eq!(failed(&v), ["files"]);
        assert!(v.checks[0]
            .found
            .contains("undeclared extra file tokenizer.json"));
    }

    #[test]
    fn a_file_of_another_name_is_checked_by_name_and_a_bad_name_fails_the_card() {
        let others: BTreeMap<String, Vec<u8>> =
            [("special_tokens_map.json".to_string(), b"{}".to_vec())].into();
        let (mut files, record, key) = published_with(&[9], others);
        let cid = cid_of(&files.weights).to_string();
        assert!(check(&files, &cid, Ok(Some(record.clone())), Some(key)).verified());
        files
            .others
            .insert("special_tokens_map.json".into(), b"{ }".to_vec());
        let v = check(&files, &cid, Ok(Some(record)), Some(key));
        assert_eq!(failed(&v), ["declared file CID"]);
        let c = v.failures().next().expect("a failure");
        assert!(c.found.starts_with("special_tokens_map.json "), "{c:?}");

        // A card declaring a path outside the repo is refused, and nothing is read for it.
        let traversal: BTreeMap<String, Vec<u8>> =
            [("../secret".to_string(), b"x".to_vec())].into();
        let (files, record, key) = published_with(&[9], traversal);
        let v = check(&files, &cid, Ok(Some(record)), Some(key));
        assert!(failed(&v).contains(&"card"), "{v:#?}");
        assert!(v.refuted());
    }

    #[tokio::test]
    async fn a_folder_is_read_with_the_files_its_card_declares() {
        let dir = std::env::temp_dir().join(format!("hanzod-verify-folder-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let (files, record, key) = published_with(&[4, 5, 6], lm_files());
        std::fs::write(dir.join("model.safetensors"), &files.weights).expect("write");
        std::fs::write(
            dir.join("config.json"),
            files.config.as_ref().expect("config"),
        )
        .expect("write");
        std::fs::write(dir.join("README.md"), files.readme.as_ref().expect("card")).expect("write");
        for (name, bytes) in &files.others {
            std::fs::write(dir.join(name), bytes).expect("write");
        }
        let read = read_folder(&dir).await.expect("read");
        assert_eq!(read.others, files.others);
        let cid = cid_of(&read.weights).to_string();
        let v = check(&read, &cid, Ok(Some(record.clone())), Some(key));
        assert!(v.verified(), "{v:#?}");
        std::fs::remove_file(dir.join(TOKENIZER_FILE)).expect("rm");
        let read = read_folder(&dir).await.expect("read");
        assert!(!read.others.contains_key(TOKENIZER_FILE));
        let v = check(&read, &cid, Ok(Some(record)), Some(key));
        assert_eq!(failed(&v), ["files"]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// `files` put into a fresh object store in the scratch folder `name`; the folder, to
    /// remove.
    async fn stored(
        name: &str,
        files: &Files,
    ) -> (std::path::PathBuf, hanzod_store::FsObjectStore) {
        let dir = std::env::temp_dir().join(format!("hanzod-fetch-{name}-{}", std::process::id()));
        let store = stored_in(&dir, files).await;
        (dir, store)
    }

    #[tokio::test]
    async fn a_repo_is_fetched_whole_by_its_weights_cid_and_verifies() {
        let weights: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + i / 11) as u8).collect();
        let (files, record, key) = published_with(&weights, lm_files());
        let (dir, store) = stored("whole", &files).await;
        let cid = cid_of(&files.weights).to_string();
        let fetched = fetch_published(&store, &cid, Some(&record.record))
            .await
            .expect("fetched");
        assert!(fetched.corrupt.is_empty(), "{:?}", fetched.corrupt);
        assert_eq!(fetched.files.weights, files.weights);
        assert_eq!(fetched.files.config, files.config);
        assert_eq!(fetched.files.readme, files.readme);
        assert_eq!(fetched.files.others, files.others);
        let v = check_fetched(&fetched, &cid, Ok(Some(record.clone())), Some(key));
        assert!(v.verified(), "{v:#?}");
        // Every one of the six files is covered by a check.
        for name in [
            "weights CID",
            "record: config",
            "record: card",
            "tokenizer.json CID",
            "tokenizer_config.json CID",
            "generation_config.json CID",
        ] {
            assert!(
                v.checks.iter().any(|c| c.name == name && c.passed),
                "{name}: {v:#?}"
            );
        }
        // Written out, it is the folder it was published as.
        let out = dir.join("repo");
        std::fs::create_dir_all(&out).expect("dir");
        fetched.files.write_folder(&out).expect("written");
        let read = read_folder(&out).await.expect("read");
        assert_eq!(read.others, files.others);
        let v = check(&read, &cid, Ok(Some(record.clone())), Some(key));
        assert!(v.verified(), "{v:#?}");
        // Without a record only the weights are known.
        let alone = fetch_published(&store, &cid, None).await.expect("weights");
        assert_eq!(alone.files.weights, files.weights);
        assert!(alone.files.config.is_none() && alone.files.others.is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_file_missing_from_the_store_is_unverifiable_naming_it() {
        let (files, record, _) = published_with(&[1, 2, 3], lm_files());
        let tokenizer_cid = cid_of(&files.others[TOKENIZER_FILE]).to_string();
        let mut without = files.clone();
        without.others.remove(TOKENIZER_FILE);
        let (dir, store) = stored("missing", &without).await;
        let cid = cid_of(&files.weights).to_string();
        let e = fetch_published(&store, &cid, Some(&record.record))
            .await
            .expect_err("the tokenizer is missing");
        assert!(
            matches!(&e, RepoFetchError::Unavailable { file, cid, .. }
                if file == TOKENIZER_FILE && *cid == tokenizer_cid),
            "{e:?}"
        );
        let text = e.to_string();
        assert!(
            text.contains(TOKENIZER_FILE) && text.contains(&tokenizer_cid),
            "{text}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_tampered_object_is_refuted_naming_its_file() {
        let (files, record, key) = published_with(&[4, 5, 6], lm_files());
        let (dir, store) = stored("tampered", &files).await;
        let cid = cid_of(&files.weights).to_string();
        let config_cid = &record.record.config_cid;
        // Another config.json stored under the signed config's CID.
        let forged = br#"{"model_type": "evil"}"#;
        let block = store.block_path(&hanzod_store::objects::parse_cid(config_cid).expect("cid"));
        std::fs::write(&block, forged).expect("write");
        let fetched = fetch_published(&store, &cid, Some(&record.record))
            .await
            .expect("fetched");
        assert!(fetched.files.config.is_none());
        let v = check_fetched(&fetched, &cid, Ok(Some(record.clone())), Some(key));
        assert_eq!(failed(&v), ["record: config"], "{v:#?}");
        assert!(v.refuted());
        let c = v.failures().next().expect("a failure");
        assert_eq!(c.expected.as_deref(), Some(config_cid.as_str()));
        assert_eq!(c.found, cid_of(forged).to_string());

        // Damaged weights replace the card's `weights CID` check with a failed one.
        let block = store.block_path(&hanzod_store::objects::parse_cid(&cid).expect("cid"));
        std::fs::write(&block, [9, 9]).expect("write");
        let fetched = fetch_published(&store, &cid, Some(&record.record))
            .await
            .expect("fetched");
        let v = check_fetched(&fetched, &cid, Ok(Some(record)), Some(key));
        assert_eq!(failed(&v), ["weights CID", "record: config"], "{v:#?}");
        assert_eq!(
            v.checks.iter().filter(|c| c.name == "weights CID").count(),
            1
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_card_declaring_too_many_files_is_refused() {
        let many: BTreeMap<String, Vec<u8>> = (0..=MAX_DECLARED_FILES)
            .map(|i| {
                (
                    format!("extra-{i}.json"),
                    format!("{{\"i\": {i}}}").into_bytes(),
                )
            })
            .collect();
        let (files, record, _) = published_with(&[7], many);
        let (dir, store) = stored("many", &files).await;
        let e = fetch_published(
            &store,
            &cid_of(&files.weights).to_string(),
            Some(&record.record),
        )
        .await
        .expect_err("too many");
        assert!(
            matches!(e, RepoFetchError::TooManyFiles { declared, .. } if declared == MAX_DECLARED_FILES + 1),
            "{e:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_untouched_publication_verifies() {
        let (files, record, key) = published(&[1, 2, 3, 4]);
        let v = check(
            &files,
            &cid_of(&files.weights).to_string(),
            Ok(Some(record)),
            Some(key),
        );
        assert!(v.verified(), "{v:#?}");
        assert_eq!(v.checks.len(), 10);
    }

    #[test]
    fn a_damaged_entry_of_a_records_file_is_skipped_not_fatal() {
        let (_, record, _) = published(&[1]);
        let mut damaged = serde_json::to_value(&record).expect("json");
        damaged["signature"] = serde_json::json!("zz");
        let file = serde_json::to_vec(&serde_json::json!([damaged, record, {"hello": "world"}]))
            .expect("json");
        let (records, skipped) = parse_records(&file).expect("an array");
        assert_eq!(records, vec![record]);
        assert_eq!(skipped.iter().map(|s| s.0).collect::<Vec<_>>(), [0, 2]);
        assert!(parse_records(b"{}").is_err());
    }

    #[test]
    fn a_missing_or_extra_file_fails() {
        let (files, record, key) = published(&[1, 2]);
        let cid = cid_of(&files.weights).to_string();
        let without_config = Files {
            config: None,
            listing: Some(vec!["README.md".into(), "model.safetensors".into()]),
            ..files.clone()
        };
        let v = check(&without_config, &cid, Ok(Some(record.clone())), Some(key));
        assert_eq!(v.failures().map(|c| c.name).collect::<Vec<_>>(), ["files"]);
        assert!(
            v.checks[0].found.ends_with("(missing config.json)"),
            "{v:#?}"
        );
        assert!(v.refuted());
        let mut listing = repo_files();
        listing.push("pytorch_model.bin".into());
        let extra = Files {
            listing: Some(listing),
            ..files
        };
        let v = check(&extra, &cid, Ok(Some(record)), Some(key));
        assert_eq!(v.failures().map(|c| c.name).collect::<Vec<_>>(), ["files"]);
        assert!(
            v.checks[0]
                .found
                .ends_with("(undeclared extra file pytorch_model.bin)"),
            "{v:#?}"
        );
    }

    #[test]
    fn a_missing_record_or_unreachable_ledger_is_not_verified_nor_refuted() {
        let (files, _, key) = published(&[1]);
        let v = check(
            &files,
            &cid_of(&files.weights).to_string(),
            Ok(None),
            Some(key),
        );
        assert!(!v.verified());
        assert_eq!(v.failures().next().map(|c| c.name), Some("record"));
        assert!(!v.refuted(), "no record is not proof of tampering");
        // Weights that do not match their card are, record or not.
        let mut tampered = files.clone();
        tampered.weights[0] ^= 1;
        let v = check(
            &tampered,
            &cid_of(&tampered.weights).to_string(),
            Ok(None),
            Some(key),
        );
        assert!(v.refuted(), "{v:#?}");
        let v = check(
            &files,
            &cid_of(&files.weights).to_string(),
            Err("connection refused".into()),
            Some(key),
        );
        assert!(v
            .failures()
            .any(|c| c.name == "record" && c.found.contains("connection refused")));
        assert!(!v.verified() && !v.refuted(), "unreachable is not tampered");
    }

    #[test]
    fn another_signer_fails_when_a_key_is_trusted_and_no_key_is_incomplete() {
        let (files, record, _) = published(&[1]);
        let cid = cid_of(&files.weights).to_string();
        let other = Identity::from_seed([8; 32]).node_id().0;
        let v = check(&files, &cid, Ok(Some(record.clone())), Some(other));
        assert_eq!(
            v.failures().map(|c| c.name).collect::<Vec<_>>(),
            ["signature"]
        );
        assert!(v.refuted());
        // Without a trusted key a valid signature proves nothing: not verified, not refuted.
        let v = check(&files, &cid, Ok(Some(record)), None);
        assert!(!v.verified() && !v.refuted(), "{v:#?}");
    }

    fn lookup<'a>(cid: &'a str, card: Option<(u64, u32)>, trusted: [u8; 32]) -> Lookup<'a> {
        Lookup {
            cid,
            card,
            repo: Some(REPO),
            trusted: Some(trusted),
        }
    }

    #[test]
    fn a_forged_record_listed_first_does_not_shadow_the_genuine_one() {
        let (files, genuine, key) = published(&[1, 2]);
        let cid = cid_of(&files.weights).to_string();
        let forger = Identity::from_seed([66; 32]);
        let mut forged_record = genuine.record.clone();
        forged_record.quality = 0.01;
        let forged = sign(forged_record, &forger);
        let records = [forged.clone(), genuine.clone()];
        let found = find_record(&records, lookup(&cid, Some((3, 2)), key));
        assert_eq!(found.as_ref(), Some(&genuine));
        assert!(check(&files, &cid, Ok(found), Some(key)).verified());
        // With only the forgery, it is returned and its signer refuted.
        let found = find_record(&[forged], lookup(&cid, Some((3, 2)), key));
        assert!(check(&files, &cid, Ok(found), Some(key)).refuted());
    }

    #[test]
    fn a_kept_epoch_finds_its_own_record_not_the_previous_epochs() {
        let (files, kept, key) = published(&[1, 2, 3]);
        let cid = cid_of(&files.weights).to_string();
        // Epoch 1 published the same weights; its record comes first.
        let mut previous = kept.record.clone();
        previous.epoch = 1;
        previous.hf_repo = "org/wine-job-3-epoch-1".into();
        let previous = sign(previous, &Identity::from_seed([7; 32]));
        let found = find_record(&[previous, kept.clone()], lookup(&cid, Some((3, 2)), key));
        assert_eq!(found, Some(kept));
        // A record that names neither the CID nor the card's epoch is not returned.
        assert_eq!(
            find_record(
                &[sign(
                    PublicationRecord {
                        cid: "other".into(),
                        epoch: 9,
                        ..published(&[1]).1.record
                    },
                    &Identity::from_seed([7; 32])
                )],
                lookup(&cid, Some((3, 2)), key)
            ),
            None
        );
    }

    #[test]
    fn a_record_of_another_repo_fails() {
        let (mut files, record, key) = published(&[1]);
        files.repo = Some("org/other-job-3-epoch-2".into());
        let v = check(
            &files,
            &cid_of(&files.weights).to_string(),
            Ok(Some(record)),
            Some(key),
        );
        assert_eq!(
            v.failures().map(|c| c.name).collect::<Vec<_>>(),
            ["record: repo"]
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// One flipped bit in any byte of any file (a language model's six), or of the
        /// record's signature, fails.
        #[test]
        fn one_flipped_byte_anywhere_fails(
            len in 1usize..600_000,
            file in 0usize..7,
            at in any::<prop::sample::Index>(),
            bit in 0u8..8,
        ) {
            let weights: Vec<u8> = (0..len).map(|i| (i * 7 + i / 13) as u8).collect();
            let (mut files, mut record, key) = published_with(&weights, lm_files());
            let target: &mut Vec<u8> = match file {
                0 => &mut files.weights,
                1 => files.config.as_mut().expect("config"),
                2 => files.readme.as_mut().expect("readme"),
                3 => files.others.get_mut(TOKENIZER_FILE).expect("tokenizer"),
                4 => files.others.get_mut(TOKENIZER_CONFIG_FILE).expect("tokenizer config"),
                5 => files.others.get_mut(GENERATION_CONFIG_FILE).expect("generation config"),
                _ => {
                    let i = at.index(64);
                    record.signature[i] ^= 1 << bit;
                    let v = check(&files, &cid_of(&files.weights).to_string(), Ok(Some(record)), Some(key));
                    prop_assert!(!v.verified());
                    return Ok(());
                }
            };
            let i = at.index(target.len());
            target[i] ^= 1 << bit;
            let v = check(&files, &cid_of(&files.weights).to_string(), Ok(Some(record)), Some(key));
            prop_assert!(!v.verified(), "flipping bit {} of byte {} of file {} went unnoticed", bit, i, file);
        }
    }
}
