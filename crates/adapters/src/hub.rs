//! The Hugging Face Hub adapter of the model-registry port (DESIGN §7, §11): [`HubRegistry`]
//! publishes a checkpoint as a Hub model repo through the Hub's HTTP API at `HF_ENDPOINT`
//! (default `https://huggingface.co`) with the token `HF_TOKEN`, and [`HubClient`] reads
//! published repos back (`hanzod verify`).
//!
//! The calls are those `huggingface_hub` (Python) makes for `create_repo` and
//! `upload_folder`, in this order:
//!
//! 1. `POST /api/repos/create` `{"name","organization","type":"model","private"}`: 200
//!    creates the repo (the Hub makes an initial commit holding `.gitattributes`), 409 means
//!    it exists;
//! 2. `GET /api/models/{repo}/tree/main` (pages followed through `Link: <…>; rel="next"`):
//!    entries `{"type","path","oid" (git blob sha1),"size","lfs":{"oid" (sha256),"size"}}`;
//!    when main already holds exactly the publication's files (the three core files and
//!    those the card declares) with the same content, the publication is done (no new
//!    commit); other content is a [`RegistryError::Conflict`];
//! 3. `POST /api/models/{repo}/preupload/main` `{"files":[{"path","size","sample"}]}`
//!    (`sample`: base64 of the first 512 bytes) answers each file's `uploadMode`
//!    (`"lfs"` or `"regular"`);
//! 4. for the LFS files, the Git LFS batch API `POST /{repo}.git/info/lfs/objects/batch`
//!    (`application/vnd.git-lfs+json`, operation `upload`, transfer `basic`, sha256 oids,
//!    ref `main`): an object without `actions` is already stored; otherwise `PUT` its bytes
//!    to `actions.upload.href` (with `actions.upload.header`, without the token), then
//!    `POST` `{"oid","size"}` to `actions.verify.href` when there is one;
//! 5. `POST /api/models/{repo}/commit/main` (`application/x-ndjson`): a `header` line
//!    (`summary`, `description`), a `file` line (base64 content) per regular file and an
//!    `lfsFile` line (`path`, `algo: sha256`, `oid`, `size`) per LFS file: all the files
//!    in one commit, so the repo holds all of them or none.
//!
//! Reading: `GET /{repo}/resolve/main/{file}` (redirects followed: the Hub sends LFS files
//! from its CDN) and the tree above. Every request carries `Authorization: Bearer <token>`
//! when a token is set (never to an LFS upload URL, which is pre-signed).
//!
//! Retries: each request is retried with exponential, jittered backoff ([`RetryPolicy`])
//! on HTTP 408, 429 (honouring `Retry-After` in seconds, capped), 5xx other than 501,
//! connection errors and timeouts, at most [`RetryPolicy::max_attempts`] tries within
//! [`RetryPolicy::max_elapsed`]. 401/403 are [`RegistryError::Unauthorized`] (naming
//! `HF_TOKEN`), 404 and the Hub's `X-Error-Code: RepoNotFound` are
//! [`RegistryError::NotFound`]; every error message names the repo, the step and the URL.
//!
//! Resuming: a publication that stopped part-way (the repo created but nothing committed,
//! or the weights uploaded to LFS but not committed) completes on the next call: the repo
//! creation answers 409, the tree holds only `.gitattributes`, the LFS batch answers no
//! actions for stored weights (nothing is uploaded twice), and the one commit follows. A
//! commit whose answer is lost is not repeated: before retrying a commit, the tree is read
//! again, and a tree already holding the files ends the publication.
//!
//! TLS ([`super::tls`], ALPN `h2` then `http/1.1`): the client is built on a rustls
//! configuration made with ring (`rustls::crypto::ring::default_provider()`), never a
//! process-wide default provider; the trusted roots are read from [`HubOptions::ca_file`],
//! else `SSL_CERT_FILE`, else the system bundle (`/etc/ssl/certs/ca-certificates.crt` and
//! the other usual places, [`super::tls::SYSTEM_BUNDLES`]).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::{ExponentialBuilder, Retryable};
use base64::Engine as _;
use bytes::Bytes;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use reqwest::{Method, StatusCode, Url};
use serde::{Deserialize, Serialize};
use sha1::Sha1;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use crate::tls::{self, Alpn};
use hanzod_store::registry::{
    validate_repo, validate_upload, Location, ModelRegistry, ModelUpload, Published, RegistryError,
    CARD_FILE, CONFIG_FILE, WEIGHTS_FILE,
};

/// The Hub's public endpoint, used when `HF_ENDPOINT` is unset.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
/// The environment variable naming the Hub endpoint (as `huggingface_hub` reads it).
pub const ENDPOINT_ENV: &str = "HF_ENDPOINT";
/// The environment variable holding the Hub access token (as `huggingface_hub` reads it).
pub const TOKEN_ENV: &str = "HF_TOKEN";
/// The branch every publication commits to and every read resolves.
pub const REVISION: &str = "main";
/// The file the Hub writes into every new repo's initial commit; ignored when comparing a
/// repo's content.
pub const GITATTRIBUTES: &str = ".gitattributes";
/// The largest file [`HubClient::fetch_small`] reads into memory, in bytes (16 MiB).
pub const MAX_SMALL_FILE: u64 = 16 * 1024 * 1024;
/// Bytes of each file sent as the preupload `sample` (the Hub's rule).
pub const SAMPLE_LEN: usize = 512;
/// The Git LFS media type of the batch API's requests and answers.
pub const LFS_MEDIA_TYPE: &str = "application/vnd.git-lfs+json";
/// The media type of a commit's body.
pub const NDJSON_MEDIA_TYPE: &str = "application/x-ndjson";

/// The largest JSON answer read, in bytes.
const MAX_JSON: u64 = 16 * 1024 * 1024;
/// The most tree pages followed.
const MAX_TREE_PAGES: usize = 100;
/// How much of an error body a message quotes, in characters.
const MAX_ERROR_QUOTE: usize = 300;
/// The slowest upload rate a weights `PUT` is given time for, in bytes a second: its
/// timeout is [`HubOptions::timeout`] plus the size at this rate.
const MIN_UPLOAD_RATE: u64 = 1024 * 1024;

/// How the Hub adapter retries one HTTP request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Tries of one request, the first included; at least 1 (0 counts as 1).
    pub max_attempts: u32,
    /// Time budget of one request and its retries, from the first try: no retry starts
    /// whose wait would end after it.
    pub max_elapsed: Duration,
    /// The first backoff delay (doubled each retry, plus jitter up to the delay itself).
    pub min_delay: Duration,
    /// The longest backoff delay.
    pub max_delay: Duration,
    /// The longest wait a 429's or 503's `Retry-After` may ask for; longer asks are cut to
    /// this.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    /// 5 tries within 2 minutes, delays from 250 ms up to 8 s, `Retry-After` capped at 30 s.
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            max_elapsed: Duration::from_secs(120),
            min_delay: Duration::from_millis(250),
            max_delay: Duration::from_secs(8),
            max_retry_after: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    fn backoff(&self) -> ExponentialBuilder {
        ExponentialBuilder::default()
            .with_jitter()
            .with_min_delay(self.min_delay)
            .with_max_delay(self.max_delay.max(self.min_delay))
            .with_max_times(self.max_attempts.max(1).saturating_sub(1) as usize)
    }
}

/// How to reach the Hub.
#[derive(Clone)]
pub struct HubOptions {
    /// The Hub's base URL, `http(s)://host[:port][/prefix]` (default
    /// [`DEFAULT_ENDPOINT`]).
    pub endpoint: String,
    /// The access token sent as `Authorization: Bearer <token>`; publishing needs one with
    /// write access to the organisation. `None` reads anonymously.
    pub token: Option<String>,
    /// The limit of one API call (connect, send, answer), of waiting for a download's
    /// headers and of each of its reads; a weights upload gets this plus its size at
    /// 1 MiB/s. Default 60 s.
    pub timeout: Duration,
    /// Retries of each request.
    pub retry: RetryPolicy,
    /// Whether new repos are created private (default `false`: public).
    pub private: bool,
    /// A PEM bundle of the CAs trusted for `https`, instead of `SSL_CERT_FILE` or the
    /// system bundle.
    pub ca_file: Option<PathBuf>,
}

impl Default for HubOptions {
    fn default() -> Self {
        HubOptions {
            endpoint: DEFAULT_ENDPOINT.to_string(),
            token: None,
            timeout: Duration::from_secs(60),
            retry: RetryPolicy::default(),
            private: false,
            ca_file: None,
        }
    }
}

/// The fields [`HubOptions`] and [`HubClient`] show, the token redacted.
fn debug_hub<'a, 'b>(
    f: &'a mut std::fmt::Formatter<'b>,
    name: &str,
    endpoint: &str,
    token: bool,
    timeout: &Duration,
    retry: &RetryPolicy,
) -> std::fmt::DebugStruct<'a, 'b> {
    let mut d = f.debug_struct(name);
    d.field("endpoint", &endpoint)
        .field("token", &token.then_some("<redacted>"))
        .field("timeout", timeout)
        .field("retry", retry);
    d
}

impl std::fmt::Debug for HubOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let token = self.token.is_some();
        debug_hub(
            f,
            "HubOptions",
            &self.endpoint,
            token,
            &self.timeout,
            &self.retry,
        )
        .field("private", &self.private)
        .field("ca_file", &self.ca_file)
        .finish()
    }
}

impl HubOptions {
    /// The defaults with `endpoint` from `HF_ENDPOINT` and `token` from `HF_TOKEN` (empty
    /// values count as unset).
    pub fn from_env() -> HubOptions {
        HubOptions::from_lookup(|k| std::env::var(k).ok())
    }

    /// As [`HubOptions::from_env`], reading the variables through `lookup`.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> HubOptions {
        let set = |k: &str| lookup(k).filter(|v| !v.trim().is_empty());
        HubOptions {
            endpoint: set(ENDPOINT_ENV).unwrap_or_else(|| DEFAULT_ENDPOINT.to_string()),
            token: set(TOKEN_ENV).map(|t| t.trim().to_string()),
            ..HubOptions::default()
        }
    }
}

/// One entry of a repo's tree (`GET /api/models/{repo}/tree/{rev}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeEntry {
    /// `"file"` or `"directory"`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The path in the repo.
    pub path: String,
    /// The git object id: for a file, the blob's sha1 (of the LFS pointer for LFS files),
    /// 40 hex digits.
    pub oid: String,
    /// The size in bytes (of the real content for LFS files).
    #[serde(default)]
    pub size: u64,
    /// The LFS object, for LFS files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lfs: Option<LfsPointer>,
}

/// The LFS object behind a tree entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LfsPointer {
    /// The sha256 of the content, 64 hex digits.
    pub oid: String,
    /// The content's size in bytes.
    pub size: u64,
}

/// The git blob id of `bytes`: sha1 of `"blob {len}\0"` followed by the bytes, 40 lowercase
/// hex digits (what `git hash-object` prints and the Hub's tree calls `oid`).
pub fn git_blob_oid(bytes: &[u8]) -> String {
    let mut h = Sha1::new();
    h.update(format!("blob {}\0", bytes.len()).as_bytes());
    h.update(bytes);
    hex::encode(h.finalize())
}

/// The sha256 of `bytes`, 64 lowercase hex digits (a Git LFS oid).
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The delay a `Retry-After` value asks for: whole or fractional non-negative seconds,
/// capped at `cap`. `None` for an HTTP date or anything else (the backoff then decides).
pub fn parse_retry_after(value: &str, cap: Duration) -> Option<Duration> {
    let secs: f64 = value.trim().parse().ok()?;
    if !secs.is_finite() || secs < 0.0 {
        return None;
    }
    Some(Duration::from_secs_f64(secs.min(cap.as_secs_f64())))
}

/// The `next` URL of a `Link` header (`<url>; rel="next", …`), as GitHub and the Hub
/// paginate.
pub fn next_link(value: &str) -> Option<String> {
    value.split(',').find_map(|part| {
        let mut pieces = part.split(';');
        let url = pieces.next()?.trim();
        let url = url.strip_prefix('<')?.strip_suffix('>')?;
        pieces
            .any(|p| {
                let p = p.trim().replace(' ', "");
                p == "rel=\"next\"" || p == "rel=next"
            })
            .then(|| url.to_string())
    })
}

/// One line of a commit body.
#[derive(Serialize)]
struct NdjsonLine<'a, T: Serialize> {
    key: &'a str,
    value: T,
}

/// A file to commit, as the commit body names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommitFile<'a> {
    /// A regular git blob, sent inline.
    Regular {
        /// The path in the repo.
        path: &'a str,
        /// The content.
        content: &'a [u8],
    },
    /// An LFS file whose object was uploaded before.
    Lfs {
        /// The path in the repo.
        path: &'a str,
        /// The content's sha256, 64 hex digits.
        oid: &'a str,
        /// The content's size in bytes.
        size: u64,
    },
}

/// The body of `POST /api/models/{repo}/commit/{rev}` (`application/x-ndjson`): a
/// `{"key":"header","value":{"summary","description"}}` line, then per file either
/// `{"key":"file","value":{"content" (base64),"path","encoding":"base64"}}` or
/// `{"key":"lfsFile","value":{"path","algo":"sha256","oid","size"}}`; lines end in `\n`.
pub fn commit_body(summary: &str, description: &str, files: &[CommitFile<'_>]) -> String {
    let mut lines = Vec::with_capacity(files.len() + 1);
    lines.push(line(
        "header",
        serde_json::json!({"summary": summary, "description": description}),
    ));
    for file in files {
        lines.push(match file {
            CommitFile::Regular { path, content } => line(
                "file",
                serde_json::json!({
                    "content": base64::engine::general_purpose::STANDARD.encode(content),
                    "path": path,
                    "encoding": "base64",
                }),
            ),
            CommitFile::Lfs { path, oid, size } => line(
                "lfsFile",
                serde_json::json!({"path": path, "algo": "sha256", "oid": oid, "size": size}),
            ),
        });
    }
    let mut body = lines.join("\n");
    body.push('\n');
    body
}

fn line(key: &str, value: serde_json::Value) -> String {
    // Serialising a JSON value built from strings and numbers cannot fail.
    serde_json::to_string(&NdjsonLine { key, value }).unwrap_or_default()
}

/// Why one HTTP attempt failed (before it is named by its step).
#[derive(Debug)]
struct Failure {
    kind: FailureKind,
    /// The wait a 429 or 503 asked for.
    retry_after: Option<Duration>,
}

#[derive(Debug)]
enum FailureKind {
    /// The server answered an error status.
    Status {
        status: StatusCode,
        /// The Hub's `X-Error-Code`.
        code: Option<String>,
        /// The Hub's `X-Error-Message`, the JSON body's `error`, or the body's start.
        message: String,
    },
    /// No answer: connection refused or reset, timeout, a body cut short.
    Transport(String),
    /// An answer that is not what the API documents.
    Malformed(String),
    /// A local failure (writing the download).
    Local(String),
}

impl Failure {
    fn transport(e: impl std::fmt::Display) -> Failure {
        Failure {
            kind: FailureKind::Transport(e.to_string()),
            retry_after: None,
        }
    }

    fn from_reqwest(e: reqwest::Error) -> Failure {
        let mut text = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            text.push_str(": ");
            text.push_str(&s.to_string());
            source = s.source();
        }
        Failure::transport(text)
    }

    fn malformed(e: impl std::fmt::Display) -> Failure {
        Failure {
            kind: FailureKind::Malformed(e.to_string()),
            retry_after: None,
        }
    }

    fn local(e: impl std::fmt::Display) -> Failure {
        Failure {
            kind: FailureKind::Local(e.to_string()),
            retry_after: None,
        }
    }

    fn status(&self) -> Option<StatusCode> {
        match &self.kind {
            FailureKind::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    fn code(&self) -> Option<&str> {
        match &self.kind {
            FailureKind::Status { code, .. } => code.as_deref(),
            _ => None,
        }
    }

    fn retryable(&self) -> bool {
        match &self.kind {
            FailureKind::Transport(_) => true,
            FailureKind::Status {
                status, message, ..
            } => {
                let s = status.as_u16();
                matches!(s, 408 | 429)
                    || (status.is_server_error() && s != 501)
                    // The Hub's answer to concurrent creations in one namespace.
                    || (s == 409 && message.contains("conflicting operation is in progress"))
            }
            FailureKind::Malformed(_) | FailureKind::Local(_) => false,
        }
    }

    /// Reads an error answer.
    async fn from_response(resp: reqwest::Response, cap: Duration) -> Failure {
        let status = resp.status();
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let code = header("x-error-code");
        let header_message = header("x-error-message");
        let retry_after = if matches!(status.as_u16(), 429 | 503) {
            header("retry-after").and_then(|v| parse_retry_after(&v, cap))
        } else {
            None
        };
        let body = read_limited(resp, 64 * 1024).await.unwrap_or_default();
        let message = header_message.unwrap_or_else(|| error_message(&body));
        Failure {
            kind: FailureKind::Status {
                status,
                code,
                message,
            },
            retry_after,
        }
    }
}

/// The `error` field of a JSON error body, or the body's start.
fn error_message(body: &[u8]) -> String {
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) {
        if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
            return quote(e);
        }
    }
    quote(String::from_utf8_lossy(body).trim())
}

fn quote(s: &str) -> String {
    hanzod_protocol::status::quote_bounded(s, MAX_ERROR_QUOTE)
}

/// Reads a body of at most `limit` bytes.
async fn read_limited(mut resp: reqwest::Response, limit: u64) -> Result<Vec<u8>, Failure> {
    if let Some(len) = resp.content_length() {
        if len > limit {
            return Err(Failure::malformed(format!(
                "the answer is {len} bytes, more than the {limit} read"
            )));
        }
    }
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(Failure::from_reqwest)? {
        if out.len() as u64 + chunk.len() as u64 > limit {
            return Err(Failure::malformed(format!(
                "the answer is more than the {limit} bytes read"
            )));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

async fn read_json<T: serde::de::DeserializeOwned>(resp: reqwest::Response) -> Result<T, Failure> {
    let body = read_limited(resp, MAX_JSON).await?;
    serde_json::from_slice(&body).map_err(|e| {
        Failure::malformed(format!(
            "unexpected JSON ({e}): {}",
            quote(&String::from_utf8_lossy(&body))
        ))
    })
}

/// What a request is for, to name it in errors.
struct Step<'a> {
    /// E.g. `"creating repo"`.
    what: &'static str,
    /// The repo, or `repo/file`.
    subject: &'a str,
    method: Method,
    url: String,
}

impl<'a> Step<'a> {
    fn new(what: &'static str, subject: &'a str, method: Method, url: &dyn ToString) -> Step<'a> {
        Step {
            what,
            subject,
            method,
            url: url.to_string(),
        }
    }

    fn error(&self, failure: Failure, attempts: u32) -> RegistryError {
        let ctx = format!(
            "{} {} ({} {})",
            self.what, self.subject, self.method, self.url
        );
        let tries = if attempts > 1 {
            format!(", after {attempts} attempts")
        } else {
            String::new()
        };
        match failure.kind {
            FailureKind::Status {
                status,
                code,
                message,
            } => {
                let s = status.as_u16();
                let message = if message.is_empty() {
                    String::new()
                } else {
                    format!(": {message}")
                };
                let code_text = code.as_deref().map(|c| format!(" {c}")).unwrap_or_default();
                if code.as_deref() == Some("RepoNotFound") {
                    RegistryError::NotFound {
                        what: format!(
                            "{ctx}: HTTP {s}{code_text}{message} (the repo does not exist, or \
                         {TOKEN_ENV} cannot see it)"
                        ),
                    }
                } else if matches!(s, 401 | 403) {
                    RegistryError::Unauthorized {
                        message: format!(
                            "{ctx}: HTTP {s}{message}; check {TOKEN_ENV} (publishing needs a \
                         token with write access to the organisation)"
                        ),
                    }
                } else if s == 404 {
                    RegistryError::NotFound {
                        what: format!("{ctx}: HTTP 404{code_text}{message}"),
                    }
                } else {
                    RegistryError::Io {
                        message: format!("{ctx}: HTTP {status}{message}{tries}"),
                    }
                }
            }
            FailureKind::Transport(e) => RegistryError::Io {
                message: format!("{ctx}: {e}{tries}"),
            },
            FailureKind::Malformed(e) => RegistryError::Io {
                message: format!("{ctx}: unexpected answer: {e}"),
            },
            FailureKind::Local(e) => RegistryError::Io {
                message: format!("{ctx}: {e}"),
            },
        }
    }
}

/// The Hub's answer to a preupload, per file.
#[derive(Debug, Deserialize)]
struct PreuploadAnswer {
    files: Vec<PreuploadFile>,
}

#[derive(Debug, Deserialize)]
struct PreuploadFile {
    path: String,
    #[serde(rename = "uploadMode")]
    upload_mode: String,
    #[serde(default, rename = "shouldIgnore")]
    should_ignore: bool,
}

/// The LFS batch API's answer.
#[derive(Debug, Deserialize)]
struct BatchAnswer {
    #[serde(default)]
    transfer: Option<String>,
    objects: Vec<BatchObject>,
}

#[derive(Debug, Deserialize)]
struct BatchObject {
    oid: String,
    #[serde(default)]
    actions: Option<BatchActions>,
    #[serde(default)]
    error: Option<BatchError>,
}

#[derive(Debug, Deserialize)]
struct BatchActions {
    #[serde(default)]
    upload: Option<BatchAction>,
    #[serde(default)]
    verify: Option<BatchAction>,
}

#[derive(Debug, Clone, Deserialize)]
struct BatchAction {
    href: String,
    #[serde(default)]
    header: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
struct BatchError {
    #[serde(default)]
    code: i64,
    #[serde(default)]
    message: String,
}

/// The commit endpoint's answer.
#[derive(Debug, Deserialize)]
struct CommitAnswer {
    #[serde(default, rename = "commitOid")]
    commit_oid: Option<String>,
    #[serde(default, rename = "commitUrl")]
    commit_url: Option<String>,
}

/// Parses and checks an endpoint: `http` or `https`, a host, no query or fragment.
fn parse_endpoint(endpoint: &str) -> Result<Url, RegistryError> {
    let bad = |why: String| RegistryError::Config {
        reason: format!("{ENDPOINT_ENV}={endpoint:?} is not a usable Hub endpoint: {why}"),
    };
    let url = Url::parse(endpoint.trim()).map_err(|e| bad(e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(bad(format!(
            "scheme {:?} is not http or https",
            url.scheme()
        )));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(bad("no host".to_string()));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(bad("it has a query or fragment".to_string()));
    }
    if url.cannot_be_a_base() {
        return Err(bad("it cannot be a base URL".to_string()));
    }
    Ok(url)
}

/// `base` with `segments` appended as path segments (each percent-encoded).
pub(crate) fn join_segments<'s>(base: &Url, segments: impl IntoIterator<Item = &'s str>) -> Url {
    let mut url = base.clone();
    if let Ok(mut path) = url.path_segments_mut() {
        path.pop_if_empty();
        path.extend(segments);
    }
    url
}

/// Checks a file path inside a repo: non-empty `/`-separated parts, none empty, `.` or
/// `..`.
fn validate_file(file: &str) -> Result<(), RegistryError> {
    if file.is_empty()
        || file
            .split('/')
            .any(|p| p.is_empty() || p == "." || p == "..")
    {
        return Err(RegistryError::BadRepo {
            reason: format!("file path {file:?} is not a relative path inside a repo"),
        });
    }
    Ok(())
}

/// `dest` with `.part` appended to its file name: where a download is written before it
/// is renamed into place.
fn part_path(dest: &Path) -> PathBuf {
    let mut name = dest
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_else(|| "download".into());
    name.push(".part");
    dest.with_file_name(name)
}

/// A Hub HTTP client: the read side (`hanzod verify`: [`HubClient::download`],
/// [`HubClient::fetch_small`], [`HubClient::tree`]) and the calls [`HubRegistry`] makes.
/// Cheap to clone.
#[derive(Clone)]
pub struct HubClient {
    http: reqwest::Client,
    endpoint: Url,
    /// The endpoint as configured, without a trailing `/` (for repo URLs).
    base: String,
    token: Option<HeaderValue>,
    timeout: Duration,
    retry: RetryPolicy,
}

impl std::fmt::Debug for HubClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let token = self.token.is_some();
        debug_hub(
            f,
            "HubClient",
            &self.base,
            token,
            &self.timeout,
            &self.retry,
        )
        .finish()
    }
}

impl HubClient {
    /// A client for `options.endpoint` (token optional).
    ///
    /// Errors: [`RegistryError::Config`] when the endpoint is not an `http(s)` URL with a
    /// host (and no query or fragment), the token is not a valid header value, or `https`
    /// has no CA certificates.
    pub fn new(options: &HubOptions) -> Result<HubClient, RegistryError> {
        let endpoint = parse_endpoint(&options.endpoint)?;
        let token = match options.token.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(t) => {
                let mut v = HeaderValue::from_str(&format!("Bearer {t}")).map_err(|_| {
                    RegistryError::Config {
                        reason: format!(
                            "{TOKEN_ENV} holds characters not allowed in an HTTP header"
                        ),
                    }
                })?;
                v.set_sensitive(true);
                Some(v)
            }
        };
        let mut builder = tls::client_builder(
            endpoint.scheme() == "https",
            options.ca_file.as_deref(),
            Alpn::H2OrHttp1,
        )
        .map_err(|e| RegistryError::Config {
            reason: format!("TLS for {ENDPOINT_ENV} {endpoint}: {e}"),
        })?
        .connect_timeout(options.timeout)
        .redirect(reqwest::redirect::Policy::limited(10))
        .user_agent(concat!("hanzod/", env!("CARGO_PKG_VERSION")));
        let host = endpoint.host_str().unwrap_or_default();
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let loopback = host == "localhost"
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        if loopback {
            builder = builder.no_proxy();
        }
        let http = builder.build().map_err(|e| RegistryError::Config {
            reason: format!("building the HTTP client: {e}"),
        })?;
        let base = endpoint.as_str().trim_end_matches('/').to_string();
        Ok(HubClient {
            http,
            endpoint,
            base,
            token,
            timeout: options.timeout,
            retry: options.retry,
        })
    }

    /// The endpoint, without a trailing `/`.
    pub fn endpoint(&self) -> &str {
        &self.base
    }

    /// The web URL of `repo`: `{endpoint}/{repo}`.
    pub fn repo_url(&self, repo: &str) -> String {
        format!("{}/{repo}", self.base)
    }

    /// The download URL of `file` in `repo` at `main`: `{endpoint}/{repo}/resolve/main/{file}`
    /// (each path part percent-encoded).
    pub fn file_url(&self, repo: &str, file: &str) -> String {
        self.resolve_url(repo, file).to_string()
    }

    /// Checks `repo` and `file`: the file's resolve URL and `repo/file` (for messages).
    fn resolve_target(&self, repo: &str, file: &str) -> Result<(Url, String), RegistryError> {
        validate_repo(repo)?;
        validate_file(file)?;
        Ok((self.resolve_url(repo, file), format!("{repo}/{file}")))
    }

    fn resolve_url(&self, repo: &str, file: &str) -> Url {
        let segments = repo
            .split('/')
            .chain(["resolve", REVISION])
            .chain(file.split('/'));
        join_segments(&self.endpoint, segments)
    }

    fn api_url(&self, repo: &str, action: &str) -> Url {
        let segments = ["api", "models"]
            .into_iter()
            .chain(repo.split('/'))
            .chain([action, REVISION]);
        join_segments(&self.endpoint, segments)
    }

    fn lfs_batch_url(&self, repo: &str) -> Url {
        let (org, name) = repo.split_once('/').unwrap_or(("", repo));
        let dot_git = format!("{name}.git");
        join_segments(
            &self.endpoint,
            [org, dot_git.as_str(), "info", "lfs", "objects", "batch"],
        )
    }

    fn request(&self, method: Method, url: Url) -> reqwest::RequestBuilder {
        let req = self.http.request(method, url);
        match &self.token {
            Some(t) => req.header(AUTHORIZATION, t.clone()),
            None => req,
        }
    }

    /// Sends `req`; a non-2xx answer is a [`Failure`].
    async fn execute(&self, req: reqwest::RequestBuilder) -> Result<reqwest::Response, Failure> {
        let resp = req.send().await.map_err(Failure::from_reqwest)?;
        if resp.status().is_success() {
            Ok(resp)
        } else {
            Err(Failure::from_response(resp, self.retry.max_retry_after).await)
        }
    }

    /// Runs `op` under the retry policy and names its final failure by `step`.
    async fn retrying<T, F, Fut>(&self, step: &Step<'_>, mut op: F) -> Result<T, RegistryError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Failure>>,
    {
        let attempts = AtomicU32::new(0);
        let started = Instant::now();
        let policy = self.retry;
        let outcome = (|| {
            attempts.fetch_add(1, Ordering::Relaxed);
            op()
        })
        .retry(policy.backoff())
        .when(Failure::retryable)
        .adjust(|failure, delay| {
            // `None` from the backoff: the tries are spent.
            let delay = delay?;
            let wait = failure.retry_after.unwrap_or(delay);
            (started.elapsed() + wait <= policy.max_elapsed).then_some(wait)
        })
        .notify(|failure, wait| {
            tracing::warn!(
                step = step.what,
                subject = step.subject,
                url = %step.url,
                failure = ?failure.kind,
                retry_in = ?wait,
                "Hub request failed; retrying"
            )
        })
        .await;
        outcome.map_err(|f| step.error(f, attempts.load(Ordering::Relaxed)))
    }

    /// The entries of `repo`'s tree at `main` (top level; pages followed).
    ///
    /// Endpoint: `GET /api/models/{repo}/tree/main`. Errors: [`RegistryError::BadRepo`],
    /// [`RegistryError::NotFound`] (no such repo or no `main`),
    /// [`RegistryError::Unauthorized`], [`RegistryError::Io`].
    pub async fn tree(&self, repo: &str) -> Result<Vec<TreeEntry>, RegistryError> {
        validate_repo(repo)?;
        self.tree_of(repo)
            .await?
            .ok_or_else(|| RegistryError::NotFound {
                what: format!(
                    "reading the tree of {repo} ({}): no revision {REVISION}",
                    self.api_url(repo, "tree")
                ),
            })
    }

    /// The tree at `main`, `None` when the repo has no `main` yet.
    async fn tree_of(&self, repo: &str) -> Result<Option<Vec<TreeEntry>>, RegistryError> {
        let mut url = self.api_url(repo, "tree");
        let mut entries = Vec::new();
        for _ in 0..MAX_TREE_PAGES {
            let step = Step::new("reading the tree of", repo, Method::GET, &url);
            let page = self
                .retrying(&step, || async {
                    let req = self.request(Method::GET, url.clone()).timeout(self.timeout);
                    let resp = match self.execute(req).await {
                        Ok(resp) => resp,
                        Err(f)
                            if f.status() == Some(StatusCode::NOT_FOUND)
                                && f.code() == Some("RevisionNotFound") =>
                        {
                            return Ok(None)
                        }
                        Err(f) => return Err(f),
                    };
                    let next = resp
                        .headers()
                        .get(reqwest::header::LINK)
                        .and_then(|v| v.to_str().ok())
                        .and_then(next_link);
                    let page: Vec<TreeEntry> = read_json(resp).await?;
                    Ok(Some((page, next)))
                })
                .await?;
            let Some((page, next)) = page else {
                return Ok(None);
            };
            entries.extend(page);
            match next {
                None => return Ok(Some(entries)),
                Some(next) => {
                    let next = url.join(&next).map_err(|e| {
                        step.error(
                            Failure::malformed(format!("bad next page {next:?}: {e}")),
                            1,
                        )
                    })?;
                    if next.origin() != self.endpoint.origin() {
                        return Err(step.error(
                            Failure::malformed(format!(
                                "next page {next} is not on the endpoint's origin"
                            )),
                            1,
                        ));
                    }
                    url = next;
                }
            }
        }
        Err(RegistryError::Io {
            message: format!(
                "reading the tree of {repo} ({}): more than {MAX_TREE_PAGES} pages",
                self.api_url(repo, "tree")
            ),
        })
    }

    /// Downloads `file` of `repo` at `main` to `dest`, streaming (nothing is held in
    /// memory but one chunk): written to `dest` + `.part`, synced, then renamed onto
    /// `dest`, so `dest` is the whole file or untouched. `progress`, when given, gets the
    /// length (when the server sends one) and each chunk. A transfer cut short is retried
    /// from the start. Returns the bytes written.
    ///
    /// Endpoint: `GET /{repo}/resolve/main/{file}` (redirects followed). Errors:
    /// [`RegistryError::BadRepo`] (bad repo id or file path), [`RegistryError::NotFound`]
    /// naming the repo and file, [`RegistryError::Unauthorized`], [`RegistryError::Io`]
    /// (including writing `dest`).
    pub async fn download(
        &self,
        repo: &str,
        file: &str,
        dest: &Path,
        progress: Option<&indicatif::ProgressBar>,
    ) -> Result<u64, RegistryError> {
        let (url, subject) = self.resolve_target(repo, file)?;
        let step = Step::new("downloading", &subject, Method::GET, &url);
        let part = part_path(dest);
        let written = self
            .retrying(&step, || self.download_once(url.clone(), &part, progress))
            .await;
        match written {
            Ok(n) => match tokio::fs::rename(&part, dest).await {
                Ok(()) => Ok(n),
                Err(e) => {
                    let _ = tokio::fs::remove_file(&part).await;
                    Err(step.error(
                        Failure::local(format!(
                            "renaming {} to {}: {e}",
                            part.display(),
                            dest.display()
                        )),
                        1,
                    ))
                }
            },
            Err(e) => {
                let _ = tokio::fs::remove_file(&part).await;
                Err(e)
            }
        }
    }

    async fn download_once(
        &self,
        url: Url,
        part: &Path,
        progress: Option<&indicatif::ProgressBar>,
    ) -> Result<u64, Failure> {
        let req = self.request(Method::GET, url);
        let mut resp = tokio::time::timeout(self.timeout, self.execute(req))
            .await
            .map_err(|_| Failure::transport(format!("no answer within {:?}", self.timeout)))??;
        let expected = resp.content_length();
        if let Some(pb) = progress {
            pb.set_position(0);
            if let Some(len) = expected {
                pb.set_length(len);
            }
        }
        let mut out = tokio::fs::File::create(part)
            .await
            .map_err(|e| Failure::local(format!("creating {}: {e}", part.display())))?;
        let mut written: u64 = 0;
        loop {
            let chunk = tokio::time::timeout(self.timeout, resp.chunk())
                .await
                .map_err(|_| {
                    Failure::transport(format!(
                        "no data for {:?} after {written} bytes",
                        self.timeout
                    ))
                })?
                .map_err(Failure::from_reqwest)?;
            let Some(chunk) = chunk else { break };
            out.write_all(&chunk)
                .await
                .map_err(|e| Failure::local(format!("writing {}: {e}", part.display())))?;
            written += chunk.len() as u64;
            if let Some(pb) = progress {
                pb.inc(chunk.len() as u64);
            }
        }
        if let Some(len) = expected {
            if len != written {
                return Err(Failure::transport(format!(
                    "the body ended after {written} of {len} bytes"
                )));
            }
        }
        out.flush()
            .await
            .and(out.sync_all().await)
            .map_err(|e| Failure::local(format!("syncing {}: {e}", part.display())))?;
        Ok(written)
    }

    /// The bytes of a small file (`README.md`, `config.json`) of `repo` at `main`, at most
    /// [`MAX_SMALL_FILE`] bytes.
    ///
    /// Endpoint: `GET /{repo}/resolve/main/{file}`. Errors: as [`HubClient::download`];
    /// [`RegistryError::Io`] when the file is larger than [`MAX_SMALL_FILE`].
    pub async fn fetch_small(&self, repo: &str, file: &str) -> Result<Vec<u8>, RegistryError> {
        let (url, subject) = self.resolve_target(repo, file)?;
        let step = Step::new("fetching", &subject, Method::GET, &url);
        self.retrying(&step, || async {
            let req = self.request(Method::GET, url.clone()).timeout(self.timeout);
            let resp = self.execute(req).await?;
            read_limited(resp, MAX_SMALL_FILE).await
        })
        .await
    }
}

/// A file of a publication with its local ids.
#[derive(Debug, Clone)]
struct LocalFile {
    path: String,
    bytes: Bytes,
    sha256: String,
    blob_oid: String,
}

impl LocalFile {
    fn new(path: impl Into<String>, bytes: Bytes) -> LocalFile {
        LocalFile {
            path: path.into(),
            sha256: sha256_hex(&bytes),
            blob_oid: git_blob_oid(&bytes),
            bytes,
        }
    }

    /// Whether `entry` holds this file's content (as an LFS object or a regular blob).
    fn matches(&self, entry: &TreeEntry) -> bool {
        entry.kind == "file"
            && match &entry.lfs {
                Some(lfs) => {
                    lfs.oid.eq_ignore_ascii_case(&self.sha256)
                        && lfs.size == self.bytes.len() as u64
                }
                None => entry.oid.eq_ignore_ascii_case(&self.blob_oid),
            }
    }
}

/// What a repo's `main` holds compared with a publication.
#[derive(Debug, Clone, PartialEq, Eq)]
enum TreeState {
    /// Nothing but `.gitattributes` (or no `main` at all).
    Empty,
    /// Exactly the publication's files, same content.
    Same,
    /// Something else; carries what differs.
    Different(String),
}

fn compare_tree(entries: &[TreeEntry], files: &[LocalFile]) -> TreeState {
    let entries: Vec<&TreeEntry> = entries.iter().filter(|e| e.path != GITATTRIBUTES).collect();
    if entries.is_empty() {
        return TreeState::Empty;
    }
    for entry in &entries {
        match files.iter().find(|f| f.path == entry.path) {
            None => return TreeState::Different(format!("it holds {:?}", entry.path)),
            Some(f) if !f.matches(entry) => {
                return TreeState::Different(format!("its {:?} has other content", entry.path))
            }
            Some(_) => {}
        }
    }
    match files
        .iter()
        .find(|f| !entries.iter().any(|e| e.path == f.path))
    {
        Some(missing) => TreeState::Different(format!("it lacks {:?}", missing.path)),
        None => TreeState::Same,
    }
}

/// [`ModelRegistry`] on the Hugging Face Hub (see the module docs for the calls, retries,
/// idempotency and resumption).
#[derive(Debug, Clone)]
pub struct HubRegistry {
    client: HubClient,
    private: bool,
}

impl HubRegistry {
    /// A registry publishing to `options.endpoint` with `options.token`.
    ///
    /// Errors: as [`HubClient::new`]. A missing token is not an error here: publishing
    /// then fails with [`RegistryError::Unauthorized`].
    pub fn new(options: HubOptions) -> Result<HubRegistry, RegistryError> {
        Ok(HubRegistry {
            client: HubClient::new(&options)?,
            private: options.private,
        })
    }

    /// The client this registry publishes with (also good for reading back).
    pub fn client(&self) -> &HubClient {
        &self.client
    }

    /// `POST /api/repos/create`: `Ok(true)` created, `Ok(false)` it exists, `Err` the
    /// failure (a refusal is decided by the caller).
    async fn create_repo(&self, repo: &str) -> Result<bool, (RegistryError, bool)> {
        let c = &self.client;
        let (org, name) = repo.split_once('/').unwrap_or(("", repo));
        let url = join_segments(&c.endpoint, ["api", "repos", "create"]);
        let step = Step::new("creating repo", repo, Method::POST, &url);
        let body = serde_json::json!({
            "name": name,
            "organization": org,
            "type": "model",
            "private": self.private,
        });
        let refused = std::sync::atomic::AtomicBool::new(false);
        let outcome = c
            .retrying(&step, || async {
                let req = c
                    .request(Method::POST, url.clone())
                    .timeout(c.timeout)
                    .json(&body);
                match c.execute(req).await {
                    Ok(_) => Ok(true),
                    Err(f) if f.status() == Some(StatusCode::CONFLICT) && !f.retryable() => {
                        Ok(false)
                    }
                    Err(f) => {
                        refused.store(
                            matches!(f.status().map(|s| s.as_u16()), Some(401 | 403)),
                            Ordering::Relaxed,
                        );
                        Err(f)
                    }
                }
            })
            .await;
        outcome.map_err(|e| (e, refused.load(Ordering::Relaxed)))
    }

    /// `POST /api/models/{repo}/preupload/main`: the upload mode of each file (`true` for
    /// LFS).
    async fn preupload(&self, repo: &str, files: &[LocalFile]) -> Result<Vec<bool>, RegistryError> {
        let c = &self.client;
        let url = c.api_url(repo, "preupload");
        let step = Step::new("preuploading to", repo, Method::POST, &url);
        let body = serde_json::json!({
            "files": files.iter().map(|f| serde_json::json!({
                "path": &f.path,
                "size": f.bytes.len(),
                "sample": base64::engine::general_purpose::STANDARD
                    .encode(&f.bytes[..f.bytes.len().min(SAMPLE_LEN)]),
            })).collect::<Vec<_>>(),
        });
        let answer: PreuploadAnswer = c
            .retrying(&step, || async {
                let req = c
                    .request(Method::POST, url.clone())
                    .timeout(c.timeout)
                    .json(&body);
                read_json(c.execute(req).await?).await
            })
            .await?;
        files
            .iter()
            .map(|f| {
                let found = answer.files.iter().find(|a| a.path == f.path);
                match found {
                    None => Err(step.error(
                        Failure::malformed(format!("no upload mode for {:?}", f.path)),
                        1,
                    )),
                    Some(a) if a.should_ignore => Err(step.error(
                        Failure::malformed(format!(
                            "the Hub would ignore {:?} (a .gitignore in the repo)",
                            f.path
                        )),
                        1,
                    )),
                    // Empty files cannot go through LFS (as huggingface_hub does).
                    Some(_) if f.bytes.is_empty() => Ok(false),
                    Some(a) => match a.upload_mode.as_str() {
                        "lfs" => Ok(true),
                        "regular" => Ok(false),
                        other => Err(step.error(
                            Failure::malformed(format!(
                                "upload mode {other:?} for {:?} (want lfs or regular)",
                                f.path
                            )),
                            1,
                        )),
                    },
                }
            })
            .collect()
    }

    /// The LFS batch, upload and verify of `files` (skipping objects the Hub has).
    async fn upload_lfs(&self, repo: &str, files: &[&LocalFile]) -> Result<(), RegistryError> {
        if files.is_empty() {
            return Ok(());
        }
        let c = &self.client;
        let url = c.lfs_batch_url(repo);
        let step = Step::new("LFS batch for", repo, Method::POST, &url);
        let body = serde_json::json!({
            "operation": "upload",
            "transfers": ["basic"],
            "objects": files.iter().map(|f| serde_json::json!({
                "oid": f.sha256,
                "size": f.bytes.len(),
            })).collect::<Vec<_>>(),
            "hash_algo": "sha256",
            "ref": {"name": REVISION},
        });
        let body = Bytes::from(serde_json::to_vec(&body).unwrap_or_default());
        let answer: BatchAnswer = c
            .retrying(&step, || async {
                let req = c
                    .request(Method::POST, url.clone())
                    .timeout(c.timeout)
                    .header(ACCEPT, LFS_MEDIA_TYPE)
                    .header(CONTENT_TYPE, LFS_MEDIA_TYPE)
                    .body(body.clone());
                read_json(c.execute(req).await?).await
            })
            .await?;
        if let Some(t) = answer.transfer.as_deref() {
            if t != "basic" {
                return Err(step.error(
                    Failure::malformed(format!(
                        "the Hub chose transfer {t:?}; only basic is supported"
                    )),
                    1,
                ));
            }
        }
        for file in files {
            let Some(object) = answer
                .objects
                .iter()
                .find(|o| o.oid.eq_ignore_ascii_case(&file.sha256))
            else {
                return Err(step.error(
                    Failure::malformed(format!("no answer for {} ({})", file.path, file.sha256)),
                    1,
                ));
            };
            if let Some(e) = &object.error {
                let failure = Failure {
                    kind: FailureKind::Status {
                        status: StatusCode::from_u16(u16::try_from(e.code).unwrap_or(500))
                            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                        code: None,
                        message: format!("object {} of {}: {}", file.sha256, file.path, e.message),
                    },
                    retry_after: None,
                };
                return Err(step.error(failure, 1));
            }
            let Some(actions) = &object.actions else {
                tracing::info!(repo, file = file.path, oid = %file.sha256, "LFS object already on the Hub");
                continue;
            };
            let Some(upload) = &actions.upload else {
                // Only a verify action: the object is stored; verifying is harmless.
                if let Some(verify) = &actions.verify {
                    self.lfs_verify(repo, file, verify).await?;
                }
                continue;
            };
            self.lfs_put(repo, file, upload).await?;
            if let Some(verify) = &actions.verify {
                self.lfs_verify(repo, file, verify).await?;
            }
        }
        Ok(())
    }

    fn action_headers(step: &Step<'_>, action: &BatchAction) -> Result<HeaderMap, RegistryError> {
        let mut headers = HeaderMap::new();
        for (name, value) in &action.header {
            if name.eq_ignore_ascii_case("chunk_size") {
                return Err(step.error(
                    Failure::malformed("a multipart upload (chunk_size): only basic is supported"),
                    1,
                ));
            }
            let name = HeaderName::from_bytes(name.as_bytes());
            let value = HeaderValue::from_str(value);
            match (name, value) {
                (Ok(n), Ok(v)) => {
                    headers.insert(n, v);
                }
                _ => {
                    return Err(step.error(
                        Failure::malformed("an action header that is not a valid HTTP header"),
                        1,
                    ))
                }
            }
        }
        Ok(headers)
    }

    fn action_url(step: &Step<'_>, base: &Url, href: &str) -> Result<Url, RegistryError> {
        let url = base
            .join(href)
            .map_err(|e| step.error(Failure::malformed(format!("bad href {href:?}: {e}")), 1))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(step.error(
                Failure::malformed(format!("href {href:?} is not http(s)")),
                1,
            ));
        }
        Ok(url)
    }

    /// Runs one batch action of `file` under the retry policy: the request `build` makes
    /// from the action's URL (its href joined to the endpoint, http(s) only) and headers.
    /// Errors name the step as `what` the file, with the URL without its query (pre-signed
    /// URLs carry credentials there).
    async fn lfs_action<F>(
        &self,
        what: &'static str,
        method: Method,
        repo: &str,
        file: &LocalFile,
        action: &BatchAction,
        build: F,
    ) -> Result<(), RegistryError>
    where
        F: Fn(Url, HeaderMap) -> reqwest::RequestBuilder,
    {
        let c = &self.client;
        let subject = format!("{repo}/{}", file.path);
        let mut step = Step::new(what, &subject, method, &action.href);
        let url = Self::action_url(&step, &c.endpoint, &action.href)?;
        let mut shown = url.clone();
        shown.set_query(None);
        step.url = shown.to_string();
        let headers = Self::action_headers(&step, action)?;
        c.retrying(&step, || async {
            let req = build(url.clone(), headers.clone());
            c.execute(req).await.map(drop)
        })
        .await
    }

    /// `PUT` the object to the upload href, with the action's headers and no token.
    async fn lfs_put(
        &self,
        repo: &str,
        file: &LocalFile,
        action: &BatchAction,
    ) -> Result<(), RegistryError> {
        let c = &self.client;
        let timeout = c.timeout + Duration::from_secs(file.bytes.len() as u64 / MIN_UPLOAD_RATE);
        tracing::info!(
            repo,
            file = file.path,
            bytes = file.bytes.len(),
            "uploading to LFS"
        );
        let what = "uploading the LFS object of";
        self.lfs_action(what, Method::PUT, repo, file, action, |url, headers| {
            c.http
                .put(url)
                .headers(headers)
                .timeout(timeout)
                .body(file.bytes.clone())
        })
        .await
    }

    /// `POST {"oid","size"}` to the verify href with the token and the action's headers.
    async fn lfs_verify(
        &self,
        repo: &str,
        file: &LocalFile,
        action: &BatchAction,
    ) -> Result<(), RegistryError> {
        let c = &self.client;
        let body = Bytes::from(
            serde_json::to_vec(&serde_json::json!({"oid": file.sha256, "size": file.bytes.len()}))
                .unwrap_or_default(),
        );
        let what = "verifying the LFS object of";
        self.lfs_action(what, Method::POST, repo, file, action, |url, headers| {
            c.request(Method::POST, url)
                .headers(headers)
                .header(ACCEPT, LFS_MEDIA_TYPE)
                .header(CONTENT_TYPE, LFS_MEDIA_TYPE)
                .timeout(c.timeout)
                .body(body.clone())
        })
        .await
    }

    /// `POST /api/models/{repo}/commit/main` with all files; before a retry, the tree is
    /// read again and a tree already holding the files counts as committed.
    async fn commit(
        &self,
        repo: &str,
        files: &[LocalFile],
        lfs: &[bool],
        summary: &str,
        description: &str,
    ) -> Result<(), RegistryError> {
        let c = &self.client;
        let url = c.api_url(repo, "commit");
        let step = Step::new("committing to", repo, Method::POST, &url);
        let commit_files: Vec<CommitFile<'_>> = files
            .iter()
            .zip(lfs)
            .map(|(f, &lfs)| {
                if lfs {
                    CommitFile::Lfs {
                        path: &f.path,
                        oid: &f.sha256,
                        size: f.bytes.len() as u64,
                    }
                } else {
                    CommitFile::Regular {
                        path: &f.path,
                        content: &f.bytes[..],
                    }
                }
            })
            .collect();
        let body = Bytes::from(commit_body(summary, description, &commit_files));
        let tries = AtomicU32::new(0);
        let conflict = std::sync::atomic::AtomicBool::new(false);
        let answer = c
            .retrying(&step, || async {
                if tries.fetch_add(1, Ordering::Relaxed) > 0 {
                    // The previous attempt may have committed before its answer was lost;
                    // or another publisher may have committed meanwhile.
                    // Never commit again without knowing: a tree that cannot be read is
                    // retried like the commit itself.
                    match c.tree_of(repo).await {
                        Ok(Some(entries)) => match compare_tree(&entries, files) {
                            TreeState::Same => return Ok(None),
                            TreeState::Different(why) => {
                                conflict.store(true, Ordering::Relaxed);
                                return Err(Failure::malformed(why));
                            }
                            TreeState::Empty => {}
                        },
                        Ok(None) => {}
                        Err(e) => {
                            return Err(Failure::transport(format!(
                                "re-reading the tree before committing again: {e}"
                            )))
                        }
                    }
                }
                let req = c
                    .request(Method::POST, url.clone())
                    .timeout(c.timeout)
                    .header(CONTENT_TYPE, NDJSON_MEDIA_TYPE)
                    .body(body.clone());
                let answer: CommitAnswer = read_json(c.execute(req).await?).await?;
                Ok(Some(answer))
            })
            .await;
        match answer {
            Ok(Some(a)) => {
                tracing::info!(
                    repo,
                    commit = a.commit_oid.as_deref().unwrap_or("?"),
                    url = a.commit_url.as_deref().unwrap_or("?"),
                    "committed to the Hub"
                );
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(_) if conflict.load(Ordering::Relaxed) => Err(RegistryError::Conflict {
                repo: repo.to_string(),
            }),
            Err(e) => Err(e),
        }
    }
}

#[async_trait::async_trait]
impl ModelRegistry for HubRegistry {
    /// Publishes `upload` (see the module docs for the calls in order). Idempotent: a repo
    /// whose `main` already holds exactly the upload's files (`model.safetensors`,
    /// `config.json`, `README.md` and `upload.files`) returns [`Published`] without a new
    /// commit. Errors: those of [`ModelRegistry::publish`], plus
    /// [`RegistryError::Unauthorized`] (401/403: `HF_TOKEN`) and
    /// [`RegistryError::NotFound`]; [`RegistryError::Io`] once a request's retries are
    /// spent (transient: calling again resumes).
    async fn publish(&self, upload: &ModelUpload) -> Result<Published, RegistryError> {
        validate_upload(upload).await?;
        let repo = upload.repo.as_str();
        let c = &self.client;
        let published = Published {
            repo: upload.repo.clone(),
            location: Location::Url(c.repo_url(repo)),
        };
        let weights = Arc::clone(&upload.weights);
        let config = Bytes::from(upload.config_json.clone());
        let card = Bytes::from(upload.card.render().into_bytes());
        let others = upload.files.clone();
        let files = tokio::task::spawn_blocking(move || {
            let mut files = vec![
                LocalFile::new(WEIGHTS_FILE, Bytes::from_owner(weights)),
                LocalFile::new(CONFIG_FILE, config),
                LocalFile::new(CARD_FILE, card),
            ];
            files.extend(
                others
                    .into_iter()
                    .map(|(name, bytes)| LocalFile::new(name, Bytes::from_owner(bytes))),
            );
            files
        })
        .await
        .map_err(|e| RegistryError::Io {
            message: format!("hashing task failed: {e}"),
        })?;

        let refused = match self.create_repo(repo).await {
            Ok(created) => {
                tracing::info!(repo, created, endpoint = c.endpoint(), "Hub repo ready");
                None
            }
            // A token that may not create repos in the namespace may still write to an
            // existing repo (as huggingface_hub's `exist_ok` does): the tree decides.
            Err((e, true)) => Some(e),
            Err((e, false)) => return Err(e),
        };
        let tree = match c.tree_of(repo).await {
            Ok(tree) => tree,
            Err(e) => return Err(refused.unwrap_or(e)),
        };
        let tree = tree.unwrap_or_default();
        match compare_tree(&tree, &files) {
            TreeState::Same => {
                tracing::info!(repo, "already published with the same content");
                return Ok(published);
            }
            TreeState::Different(why) => {
                tracing::warn!(
                    repo,
                    endpoint = c.endpoint(),
                    why,
                    "repo holds other content"
                );
                return Err(RegistryError::Conflict {
                    repo: upload.repo.clone(),
                });
            }
            TreeState::Empty => {}
        }
        if let Some(e) = refused {
            return Err(e);
        }
        let lfs = self.preupload(repo, &files).await?;
        let lfs_files: Vec<&LocalFile> = files
            .iter()
            .zip(&lfs)
            .filter_map(|(f, &l)| l.then_some(f))
            .collect();
        self.upload_lfs(repo, &lfs_files).await?;
        let summary = format!(
            "hanzod: {} epoch {} (job {})",
            upload.card.model, upload.card.epoch, upload.card.job
        );
        let description = format!(
            "{WEIGHTS_FILE}: IPFS CID {}, sha256 {}",
            upload.card.cid, files[0].sha256
        );
        self.commit(repo, &files, &lfs, &summary, &description)
            .await?;
        Ok(published)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_oids_are_gits() {
        // `git hash-object` of the empty file and of "hello\n".
        assert_eq!(
            git_blob_oid(b""),
            "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
        );
        assert_eq!(
            git_blob_oid(b"hello\n"),
            "ce013625030ba8dba906f756967f9e9ca394464a"
        );
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn commit_body_is_ndjson_in_the_hubs_shape() {
        let body = commit_body(
            "sum",
            "desc",
            &[
                CommitFile::Lfs {
                    path: "model.safetensors",
                    oid: "ab",
                    size: 7,
                },
                CommitFile::Regular {
                    path: "config.json",
                    content: b"{}",
                },
            ],
        );
        assert!(body.ends_with('\n'));
        let lines: Vec<serde_json::Value> = body
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(
            lines,
            vec![
                serde_json::json!({"key":"header","value":{"summary":"sum","description":"desc"}}),
                serde_json::json!({"key":"lfsFile","value":{"path":"model.safetensors","algo":"sha256","oid":"ab","size":7}}),
                serde_json::json!({"key":"file","value":{"content":"e30=","path":"config.json","encoding":"base64"}}),
            ]
        );
    }

    #[test]
    fn retry_after_is_seconds_capped() {
        let cap = Duration::from_secs(30);
        assert_eq!(parse_retry_after("0", cap), Some(Duration::ZERO));
        assert_eq!(parse_retry_after(" 2 ", cap), Some(Duration::from_secs(2)));
        assert_eq!(
            parse_retry_after("0.5", cap),
            Some(Duration::from_millis(500))
        );
        assert_eq!(parse_retry_after("3600", cap), Some(cap));
        assert_eq!(parse_retry_after("-1", cap), None);
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", cap),
            None
        );
        assert_eq!(parse_retry_after("NaN", cap), None);
    }

    #[test]
    fn link_headers_give_the_next_page() {
        assert_eq!(
            next_link(r#"<https://h/api/models/a/b/tree/main?cursor=x>; rel="next""#),
            Some("https://h/api/models/a/b/tree/main?cursor=x".to_string())
        );
        assert_eq!(
            next_link(r#"<https://h/p1>; rel="prev", <https://h/p3>; rel="next""#),
            Some("https://h/p3".to_string())
        );
        assert_eq!(next_link(r#"<https://h/p1>; rel="prev""#), None);
        assert_eq!(next_link("garbage"), None);
    }

    fn client(endpoint: &str) -> HubClient {
        HubClient::new(&HubOptions {
            endpoint: endpoint.to_string(),
            ..HubOptions::default()
        })
        .unwrap()
    }

    #[test]
    fn urls_follow_the_hub_layout() {
        for endpoint in ["http://127.0.0.1:9/", "http://127.0.0.1:9"] {
            let c = client(endpoint);
            assert_eq!(c.endpoint(), "http://127.0.0.1:9");
            assert_eq!(c.repo_url("o/m-epoch-1"), "http://127.0.0.1:9/o/m-epoch-1");
            assert_eq!(
                c.file_url("o/m-epoch-1", "model.safetensors"),
                "http://127.0.0.1:9/o/m-epoch-1/resolve/main/model.safetensors"
            );
            assert_eq!(
                c.api_url("o/m-epoch-1", "preupload").as_str(),
                "http://127.0.0.1:9/api/models/o/m-epoch-1/preupload/main"
            );
            assert_eq!(
                c.lfs_batch_url("o/m-epoch-1").as_str(),
                "http://127.0.0.1:9/o/m-epoch-1.git/info/lfs/objects/batch"
            );
        }
        // A prefix is kept; odd characters in a file name are escaped.
        let c = client("http://localhost:9/hub/");
        assert_eq!(
            c.file_url("o/m", "dir/a b#.json"),
            "http://localhost:9/hub/o/m/resolve/main/dir/a%20b%23.json"
        );
        assert_eq!(
            join_segments(
                &Url::parse("http://h/x").unwrap(),
                ["api", "repos", "create"]
            )
            .as_str(),
            "http://h/x/api/repos/create"
        );
    }

    #[test]
    fn bad_endpoints_and_tokens_are_config_errors() {
        for bad in [
            "",
            "huggingface.co",
            "ftp://h",
            "http://",
            "http://h/?q=1",
            "mailto:a@b",
        ] {
            let err = HubClient::new(&HubOptions {
                endpoint: bad.to_string(),
                ..HubOptions::default()
            })
            .unwrap_err();
            assert!(
                matches!(&err, RegistryError::Config { reason: m } if m.contains(ENDPOINT_ENV)),
                "{bad:?}: {err:?}"
            );
        }
        let err = HubClient::new(&HubOptions {
            endpoint: "http://127.0.0.1:9".into(),
            token: Some("a\nb".into()),
            ..HubOptions::default()
        })
        .unwrap_err();
        assert!(
            matches!(&err, RegistryError::Config { reason: m } if m.contains(TOKEN_ENV) && !m.contains("a\nb"))
        );
    }

    #[test]
    fn https_builds_with_ring_and_the_system_roots() {
        // The explicit ring configuration suffices, whatever the process-wide default.
        let c = HubClient::new(&HubOptions::default());
        if std::path::Path::new("/etc/ssl/certs/ca-certificates.crt").is_file() {
            let c = c.unwrap();
            assert_eq!(c.endpoint(), DEFAULT_ENDPOINT);
            assert!(!format!("{c:?}").contains("Bearer"));
        }
        let missing = HubClient::new(&HubOptions {
            ca_file: Some("/nonexistent/ca.pem".into()),
            ..HubOptions::default()
        });
        assert!(matches!(missing, Err(RegistryError::Config { reason: _ })));
    }

    #[test]
    fn options_from_the_environment() {
        let o = HubOptions::from_lookup(|k| match k {
            "HF_ENDPOINT" => Some("http://mirror:8090".into()),
            "HF_TOKEN" => Some(" hf_x ".into()),
            _ => None,
        });
        assert_eq!(o.endpoint, "http://mirror:8090");
        assert_eq!(o.token.as_deref(), Some("hf_x"));
        assert!(!format!("{o:?}").contains("hf_x"));
        let o = HubOptions::from_lookup(|k| (k == "HF_TOKEN").then(String::new));
        assert_eq!(o.endpoint, DEFAULT_ENDPOINT);
        assert_eq!(o.token, None);
    }

    fn entry(path: &str, oid: &str, lfs: Option<(&str, u64)>) -> TreeEntry {
        TreeEntry {
            kind: "file".into(),
            path: path.into(),
            oid: oid.into(),
            size: 0,
            lfs: lfs.map(|(oid, size)| LfsPointer {
                oid: oid.into(),
                size,
            }),
        }
    }

    #[test]
    fn trees_compare_by_blob_and_lfs_ids() {
        let files = vec![
            LocalFile::new("model.safetensors", Bytes::from_static(b"weights")),
            LocalFile::new("config.json", Bytes::from_static(b"{}")),
        ];
        let w = &files[0];
        let c = &files[1];
        let attrs = entry(".gitattributes", "x", None);
        assert_eq!(compare_tree(&[], &files), TreeState::Empty);
        assert_eq!(
            compare_tree(std::slice::from_ref(&attrs), &files),
            TreeState::Empty
        );
        let same = vec![
            attrs.clone(),
            entry(&w.path, "pointer-sha1", Some((&w.sha256, 7))),
            entry(&c.path, &c.blob_oid, None),
        ];
        assert_eq!(compare_tree(&same, &files), TreeState::Same);
        // The weights as a regular blob count too.
        let regular = vec![
            entry(&w.path, &w.blob_oid, None),
            entry(&c.path, &c.blob_oid, None),
        ];
        assert_eq!(compare_tree(&regular, &files), TreeState::Same);
        let other = vec![
            entry(&w.path, "p", Some((&w.sha256, 7))),
            entry(&c.path, "0000", None),
        ];
        assert!(matches!(
            compare_tree(&other, &files),
            TreeState::Different(_)
        ));
        let extra = [same.clone(), vec![entry("x.txt", "1", None)]].concat();
        assert_eq!(
            compare_tree(&extra, &files),
            TreeState::Different("it holds \"x.txt\"".into())
        );
        // A publication with a declared file (a tokenizer) is the same only with it.
        let with_tokenizer = [
            files.clone(),
            vec![LocalFile::new(
                "tokenizer.json",
                Bytes::from_static(b"{\"model\": {}}"),
            )],
        ]
        .concat();
        let t = &with_tokenizer[2];
        assert_eq!(
            compare_tree(&same, &with_tokenizer),
            TreeState::Different("it lacks \"tokenizer.json\"".into())
        );
        let same_with_tokenizer = [same.clone(), vec![entry(&t.path, &t.blob_oid, None)]].concat();
        assert_eq!(
            compare_tree(&same_with_tokenizer, &with_tokenizer),
            TreeState::Same
        );
        let missing = vec![entry(&c.path, &c.blob_oid, None)];
        assert!(matches!(
            compare_tree(&missing, &files),
            TreeState::Different(_)
        ));
        let wrong_size = vec![
            entry(&w.path, "p", Some((&w.sha256, 8))),
            entry(&c.path, &c.blob_oid, None),
        ];
        assert!(matches!(
            compare_tree(&wrong_size, &files),
            TreeState::Different(_)
        ));
    }

    #[test]
    fn errors_name_the_step_repo_and_url() {
        let step = Step::new(
            "creating repo",
            "o/m-epoch-1",
            Method::POST,
            &"http://h/api/repos/create",
        );
        let status = |s: u16, code: Option<&str>| Failure {
            kind: FailureKind::Status {
                status: StatusCode::from_u16(s).unwrap(),
                code: code.map(str::to_string),
                message: "nope".into(),
            },
            retry_after: None,
        };
        let e = step.error(status(401, None), 1);
        assert!(
            matches!(&e, RegistryError::Unauthorized { message: m } if m.contains("HF_TOKEN") && m.contains("o/m-epoch-1") && m.contains("POST http://h/api/repos/create")),
            "{e}"
        );
        let e = step.error(status(401, Some("RepoNotFound")), 1);
        assert!(matches!(e, RegistryError::NotFound { what: _ }));
        let e = step.error(status(404, Some("EntryNotFound")), 1);
        assert!(matches!(&e, RegistryError::NotFound { what: m } if m.contains("EntryNotFound")));
        let e = step.error(status(503, None), 4);
        assert!(
            matches!(&e, RegistryError::Io { message: m } if m.contains("after 4 attempts") && m.contains("creating repo o/m-epoch-1")),
            "{e}"
        );
        assert!(status(429, None).retryable());
        assert!(status(502, None).retryable());
        assert!(!status(501, None).retryable());
        assert!(!status(400, None).retryable());
        assert!(Failure::transport("reset").retryable());
    }

    #[test]
    fn download_paths() {
        assert_eq!(
            part_path(Path::new("/tmp/x/model.safetensors")),
            PathBuf::from("/tmp/x/model.safetensors.part")
        );
        assert!(validate_file("model.safetensors").is_ok());
        assert!(validate_file("a/b.json").is_ok());
        for bad in ["", "/a", "a//b", "../a", "a/./b", "a/"] {
            assert!(validate_file(bad).is_err(), "{bad:?}");
        }
    }
}
