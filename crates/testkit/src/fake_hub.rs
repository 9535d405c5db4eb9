//! Test doubles for the Hugging Face Hub adapter ([`hanzod_adapters::hub`]).
//!
//! - [`FakeHub`]: a **fake** Hub, an in-memory HTTP server on a free loopback port that
//!   implements the endpoints [`hanzod_adapters::hub::HubRegistry`] and [`hanzod_adapters::hub::HubClient`]
//!   call, following the Hub's published API as `huggingface_hub` (Python) uses it: repo
//!   creation, tree listing, preupload, the Git LFS batch API with basic transfers
//!   (upload and verify), ndjson commits and `resolve` downloads. It is a test double, not
//!   the Hub: it keeps repos in memory, knows one write token, and adds fault injection and
//!   counters. It enforces what the Hub enforces on these paths: the bearer token, LFS
//!   objects uploaded (with the size and sha256 the commit names) before a commit refers
//!   to them, and the preupload's upload mode (an LFS-pattern or large file committed
//!   inline is refused).
//! - [`OlahServer`]: a real Hub-compatible server, PyPI's `olah` ([`OLAH_VERSION`]), run
//!   offline on a free loopback port over git mirrors that [`write_git_mirror`] creates, to
//!   check the download path against an implementation other than ours.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use base64::Engine as _;
use bytes::Bytes;

use crate::process::{on_free_ports, on_path, LaunchError, RequiredUnderCi, ServerProcess};
use hanzod_adapters::hub::{git_blob_oid, sha256_hex, LFS_MEDIA_TYPE, NDJSON_MEDIA_TYPE};
use hanzod_store::registry::validate_repo;

/// The write token a [`FakeHub`] accepts (`Authorization: Bearer hf_fake_write_token`).
pub const FAKE_TOKEN: &str = "hf_fake_write_token";

/// The `.gitattributes` of a new repo's initial commit (the Hub's default, abridged): the
/// extensions whose files go through LFS.
pub const DEFAULT_GITATTRIBUTES: &str = "\
*.bin filter=lfs diff=lfs merge=lfs -text
*.ckpt filter=lfs diff=lfs merge=lfs -text
*.gguf filter=lfs diff=lfs merge=lfs -text
*.h5 filter=lfs diff=lfs merge=lfs -text
*.msgpack filter=lfs diff=lfs merge=lfs -text
*.npz filter=lfs diff=lfs merge=lfs -text
*.onnx filter=lfs diff=lfs merge=lfs -text
*.pt filter=lfs diff=lfs merge=lfs -text
*.pth filter=lfs diff=lfs merge=lfs -text
*.safetensors filter=lfs diff=lfs merge=lfs -text
";

/// Files from this size on (bytes) must go through LFS (the Hub's 10 MiB rule).
pub const LFS_THRESHOLD: u64 = 10 * 1024 * 1024;

/// The largest request body the fake reads, in bytes.
const MAX_BODY: usize = 512 * 1024 * 1024;

/// Whether the fake (like the Hub with its default `.gitattributes`) wants `path` of
/// `size` bytes uploaded through LFS.
pub fn is_lfs_path(path: &str, size: u64) -> bool {
    if size >= LFS_THRESHOLD {
        return true;
    }
    let Some((_, ext)) = path.rsplit_once('.') else {
        return false;
    };
    DEFAULT_GITATTRIBUTES
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .any(|pattern| pattern.strip_prefix("*.") == Some(ext))
}

/// The Git LFS pointer file of an object (what git stores in place of the content).
pub fn lfs_pointer(oid: &str, size: u64) -> String {
    format!("version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {size}\n")
}

/// A fault the fake answers instead of serving a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    /// The HTTP status answered, e.g. 429 or 503.
    pub status: u16,
    /// A `Retry-After` header value to send, e.g. `"0"` or `"1"`.
    pub retry_after: Option<String>,
    /// Only requests whose path contains this are hit (`None`: any request).
    pub path_contains: Option<String>,
}

/// One request the fake served, in order of arrival.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedRequest {
    /// The method, e.g. `"POST"`.
    pub method: String,
    /// The path (without the query).
    pub path: String,
    /// The status answered.
    pub status: u16,
}

/// A file at the head of a fake repo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadFile {
    /// Whether it is stored through LFS.
    pub lfs: bool,
    /// Its content (an LFS file's object; empty when the object is missing).
    pub bytes: Vec<u8>,
}

#[derive(Debug, Clone)]
enum FakeFile {
    Regular(Bytes),
    Lfs { oid: String, size: u64 },
}

impl FakeFile {
    /// The git blob: the content, or the LFS pointer.
    fn blob(&self) -> Bytes {
        match self {
            FakeFile::Regular(b) => b.clone(),
            FakeFile::Lfs { oid, size } => Bytes::from(lfs_pointer(oid, *size)),
        }
    }

    fn size(&self) -> u64 {
        match self {
            FakeFile::Regular(b) => b.len() as u64,
            FakeFile::Lfs { size, .. } => *size,
        }
    }
}

#[derive(Debug, Clone)]
struct FakeCommit {
    oid: String,
    summary: String,
    files: BTreeMap<String, FakeFile>,
    /// Made through the commit endpoint (not the creation's initial commit or a seed).
    via_api: bool,
}

#[derive(Debug, Default)]
struct FakeRepo {
    private: bool,
    commits: Vec<FakeCommit>,
    lfs: HashMap<String, Bytes>,
}

impl FakeRepo {
    fn head(&self) -> Option<&FakeCommit> {
        self.commits.last()
    }
}

#[derive(Debug)]
struct Hub {
    repos: BTreeMap<String, FakeRepo>,
    faults: Vec<(usize, Fault)>,
    log: Vec<LoggedRequest>,
    halt_armed: bool,
    halted: bool,
    held: usize,
    lfs_puts: usize,
    tree_page_size: usize,
    commit_counter: u64,
}

impl Hub {
    fn next_commit_oid(&mut self, repo: &str, summary: &str) -> String {
        self.commit_counter += 1;
        git_blob_oid(format!("{repo}\n{summary}\n{}", self.commit_counter).as_bytes())
    }

    fn push_commit(
        &mut self,
        repo: &str,
        summary: &str,
        files: BTreeMap<String, FakeFile>,
        via_api: bool,
    ) -> String {
        let oid = self.next_commit_oid(repo, summary);
        if let Some(r) = self.repos.get_mut(repo) {
            r.commits.push(FakeCommit {
                oid: oid.clone(),
                summary: summary.to_string(),
                files,
                via_api,
            });
        }
        oid
    }

    fn create(&mut self, repo: &str, private: bool) {
        self.repos.insert(
            repo.to_string(),
            FakeRepo {
                private,
                ..FakeRepo::default()
            },
        );
        let mut files = BTreeMap::new();
        files.insert(
            ".gitattributes".to_string(),
            FakeFile::Regular(Bytes::from_static(DEFAULT_GITATTRIBUTES.as_bytes())),
        );
        self.push_commit(repo, "initial commit", files, false);
    }
}

struct Shared {
    hub: Mutex<Hub>,
    base: String,
    token: String,
    resume: tokio::sync::watch::Sender<bool>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Hub> {
        // A panic while holding the lock cannot leave the maps half-updated in a way that
        // matters to a test double: keep serving.
        self.hub.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A fake Hugging Face Hub (see the module docs) on `127.0.0.1`, serving until dropped.
pub struct FakeHub {
    shared: Arc<Shared>,
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for FakeHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeHub").field("addr", &self.addr).finish()
    }
}

impl Drop for FakeHub {
    fn drop(&mut self) {
        self.task.abort();
        // Release requests held by a halt, so their connections end.
        self.shared.resume.send_replace(true);
    }
}

impl FakeHub {
    /// Starts a fake Hub on a free loopback port (on the current tokio runtime), accepting
    /// [`FAKE_TOKEN`]. Errors: binding the port.
    pub async fn start() -> std::io::Result<FakeHub> {
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let (resume, _) = tokio::sync::watch::channel(true);
        let shared = Arc::new(Shared {
            hub: Mutex::new(Hub {
                repos: BTreeMap::new(),
                faults: Vec::new(),
                log: Vec::new(),
                halt_armed: false,
                halted: false,
                held: 0,
                lfs_puts: 0,
                tree_page_size: 1000,
                commit_counter: 0,
            }),
            base: format!("http://{addr}"),
            token: FAKE_TOKEN.to_string(),
            resume,
        });
        let app = Router::new()
            .fallback(handle)
            .with_state(Arc::clone(&shared));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(FakeHub { shared, addr, task })
    }

    /// The endpoint, `http://127.0.0.1:{port}` (an `HF_ENDPOINT`).
    pub fn url(&self) -> String {
        self.shared.base.clone()
    }

    /// The write token it accepts.
    pub fn token(&self) -> &str {
        &self.shared.token
    }

    /// The next `n` requests whose path matches `fault.path_contains` are answered with
    /// `fault` instead of being served. Faults queue in order.
    pub fn inject(&self, n: usize, fault: Fault) {
        if n > 0 {
            self.shared.lock().faults.push((n, fault));
        }
    }

    /// The next `n` requests (any path) are answered with `status`; a 429 carries
    /// `Retry-After: 0`.
    pub fn fail_next(&self, n: usize, status: u16) {
        self.inject(
            n,
            Fault {
                status,
                retry_after: (status == 429).then(|| "0".to_string()),
                path_contains: None,
            },
        );
    }

    /// Drops the faults not yet answered.
    pub fn clear_faults(&self) {
        self.shared.lock().faults.clear();
    }

    /// Simulates a crash right after the next successful LFS upload: the upload is stored
    /// and answered, then every later request is held unanswered (and nothing it asks is
    /// done) until [`FakeHub::resume`], which answers the held ones 503.
    pub fn halt_after_lfs_upload(&self) {
        self.shared.lock().halt_armed = true;
    }

    /// Whether a halt ([`FakeHub::halt_after_lfs_upload`]) is in force.
    pub fn halted(&self) -> bool {
        self.shared.lock().halted
    }

    /// How many requests a halt has held so far.
    pub fn held_requests(&self) -> usize {
        self.shared.lock().held
    }

    /// Ends a halt: held requests are answered 503 (without effect) and new ones served.
    pub fn resume(&self) {
        self.shared.lock().halted = false;
        self.shared.resume.send_replace(true);
    }

    /// Entries per tree page (default 1000); smaller values make clients follow `Link`.
    pub fn set_tree_page_size(&self, n: usize) {
        self.shared.lock().tree_page_size = n.max(1);
    }

    /// Creates `repo` if missing (with the initial `.gitattributes` commit) and commits
    /// `files` to it directly (LFS for [`is_lfs_path`] files), as another publisher
    /// would. Not counted by [`FakeHub::commits`].
    pub fn seed(&self, repo: &str, files: &[(&str, &[u8])]) {
        let mut hub = self.shared.lock();
        if !hub.repos.contains_key(repo) {
            hub.create(repo, false);
        }
        let Some(r) = hub.repos.get_mut(repo) else {
            return;
        };
        let mut snapshot = r.head().map(|c| c.files.clone()).unwrap_or_default();
        for (path, bytes) in files {
            let bytes = Bytes::copy_from_slice(bytes);
            let file = if is_lfs_path(path, bytes.len() as u64) {
                let oid = sha256_hex(&bytes);
                let size = bytes.len() as u64;
                r.lfs.insert(oid.clone(), bytes);
                FakeFile::Lfs { oid, size }
            } else {
                FakeFile::Regular(bytes)
            };
            snapshot.insert(path.to_string(), file);
        }
        hub.push_commit(repo, "seed", snapshot, false);
    }

    /// Whether `repo` exists.
    pub fn exists(&self, repo: &str) -> bool {
        self.shared.lock().repos.contains_key(repo)
    }

    /// Commits made to `repo` through the commit endpoint (the creation's initial commit
    /// and seeds excluded); 0 for a missing repo.
    pub fn commits(&self, repo: &str) -> usize {
        self.shared
            .lock()
            .repos
            .get(repo)
            .map_or(0, |r| r.commits.iter().filter(|c| c.via_api).count())
    }

    /// The summaries of all of `repo`'s commits, oldest first (`"initial commit"` first).
    pub fn commit_summaries(&self, repo: &str) -> Vec<String> {
        self.shared
            .lock()
            .repos
            .get(repo)
            .map_or_else(Vec::new, |r| {
                r.commits.iter().map(|c| c.summary.clone()).collect()
            })
    }

    /// The files at the head of `repo`'s `main`, LFS objects resolved; `None` for a
    /// missing repo.
    pub fn head_files(&self, repo: &str) -> Option<BTreeMap<String, HeadFile>> {
        let hub = self.shared.lock();
        let r = hub.repos.get(repo)?;
        let head = r.head()?;
        Some(
            head.files
                .iter()
                .map(|(path, f)| {
                    let file = match f {
                        FakeFile::Regular(b) => HeadFile {
                            lfs: false,
                            bytes: b.to_vec(),
                        },
                        FakeFile::Lfs { oid, .. } => HeadFile {
                            lfs: true,
                            bytes: r.lfs.get(oid).map(|b| b.to_vec()).unwrap_or_default(),
                        },
                    };
                    (path.clone(), file)
                })
                .collect(),
        )
    }

    /// LFS objects stored for `repo`.
    pub fn lfs_objects(&self, repo: &str) -> usize {
        self.shared
            .lock()
            .repos
            .get(repo)
            .map_or(0, |r| r.lfs.len())
    }

    /// Successful LFS uploads (`PUT`s), all repos.
    pub fn lfs_uploads(&self) -> usize {
        self.shared.lock().lfs_puts
    }

    /// Every request served so far, in order.
    pub fn requests(&self) -> Vec<LoggedRequest> {
        self.shared.lock().log.clone()
    }

    /// Requests with `method` whose path contains `path_contains`.
    pub fn count(&self, method: &str, path_contains: &str) -> usize {
        self.shared
            .lock()
            .log
            .iter()
            .filter(|r| r.method == method && r.path.contains(path_contains))
            .count()
    }
}

/// A Hub-style error: `X-Error-Code`, `X-Error-Message` and `{"error": message}`.
fn hub_error(status: StatusCode, code: Option<&str>, message: &str) -> Response {
    let mut resp = (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::json!({ "error": message }).to_string(),
    )
        .into_response();
    if let Some(code) = code {
        if let Ok(v) = HeaderValue::from_str(code) {
            resp.headers_mut().insert("x-error-code", v);
        }
    }
    if let Ok(v) = HeaderValue::from_str(message) {
        resp.headers_mut().insert("x-error-message", v);
    }
    resp
}

fn bad_request(message: impl AsRef<str>) -> Response {
    hub_error(StatusCode::BAD_REQUEST, None, message.as_ref())
}

fn json(status: StatusCode, value: serde_json::Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
        .into_response()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Caller {
    Anonymous,
    Writer,
    Invalid,
}

fn caller(headers: &HeaderMap, token: &str) -> Caller {
    match headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        None => Caller::Anonymous,
        Some(v) if v.strip_prefix("Bearer ") == Some(token) => Caller::Writer,
        Some(_) => Caller::Invalid,
    }
}

fn invalid_credentials() -> Response {
    hub_error(
        StatusCode::UNAUTHORIZED,
        None,
        "Invalid credentials in Authorization header",
    )
}

fn write_refused() -> Response {
    hub_error(
        StatusCode::UNAUTHORIZED,
        None,
        "You must be authenticated with a write token",
    )
}

/// The Hub's answer for a repo the caller cannot see: 401 anonymous, 404 authenticated.
fn repo_not_found(who: Caller) -> Response {
    let status = if who == Caller::Writer {
        StatusCode::NOT_FOUND
    } else {
        StatusCode::UNAUTHORIZED
    };
    hub_error(status, Some("RepoNotFound"), "Repository not found")
}

fn signature(token: &str, repo: &str, oid: &str, size: u64) -> String {
    sha256_hex(format!("{token}\n{repo}\n{oid}\n{size}").as_bytes())
}

fn query_param<'q>(query: Option<&'q str>, name: &str) -> Option<&'q str> {
    query?.split('&').find_map(|kv| {
        kv.split_once('=')
            .filter(|(k, _)| *k == name)
            .map(|(_, v)| v)
    })
}

async fn handle(State(s): State<Arc<Shared>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let method = parts.method.clone();
    let path = parts.uri.path().to_string();
    let log = |hub: &mut Hub, status: StatusCode| {
        hub.log.push(LoggedRequest {
            method: method.to_string(),
            path: path.clone(),
            status: status.as_u16(),
        })
    };
    let (halted, fault) = {
        let mut hub = s.lock();
        if hub.halted {
            hub.held += 1;
            (true, None)
        } else {
            let i = hub
                .faults
                .iter()
                .position(|(_, f)| f.path_contains.as_deref().is_none_or(|p| path.contains(p)));
            let fault = i.map(|i| {
                let fault = hub.faults[i].1.clone();
                hub.faults[i].0 -= 1;
                if hub.faults[i].0 == 0 {
                    hub.faults.remove(i);
                }
                fault
            });
            (false, fault)
        }
    };
    if halted {
        let mut rx = s.resume.subscribe();
        let _ = rx.wait_for(|resumed| *resumed).await;
        let mut hub = s.lock();
        log(&mut hub, StatusCode::SERVICE_UNAVAILABLE);
        return hub_error(
            StatusCode::SERVICE_UNAVAILABLE,
            None,
            "the fake Hub restarted",
        );
    }
    if let Some(fault) = fault {
        let status =
            StatusCode::from_u16(fault.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = hub_error(status, None, "injected fault");
        if let Some(v) = fault
            .retry_after
            .as_deref()
            .and_then(|v| HeaderValue::from_str(v).ok())
        {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
        log(&mut s.lock(), status);
        return resp;
    }
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(e) => {
            let resp = bad_request(format!("reading the body: {e}"));
            log(&mut s.lock(), resp.status());
            return resp;
        }
    };
    let query = parts.uri.query();
    let mut hub = s.lock();
    let resp = route(&s, &mut hub, &method, &path, query, &parts.headers, body);
    log(&mut hub, resp.status());
    resp
}

fn route(
    s: &Shared,
    hub: &mut Hub,
    method: &Method,
    path: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    body: Bytes,
) -> Response {
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let who = caller(headers, &s.token);
    let signed = matches!(segs.first(), Some(&"lfs-upload") | Some(&"lfs-cdn"));
    if who == Caller::Invalid && !signed {
        return invalid_credentials();
    }
    match (method.as_str(), segs.as_slice()) {
        ("POST", ["api", "repos", "create"]) => create(s, hub, who, &body),
        ("POST", ["api", "models", org, name, "preupload", rev]) => {
            preupload(hub, who, &format!("{org}/{name}"), rev, &body)
        }
        ("POST", ["api", "models", org, name, "commit", rev]) => {
            commit(s, hub, who, &format!("{org}/{name}"), rev, headers, &body)
        }
        ("GET", ["api", "models", org, name, "tree", rev])
        | ("GET", ["api", "models", org, name, "tree", rev, ""]) => {
            tree(s, hub, who, &format!("{org}/{name}"), rev, query)
        }
        ("POST", [org, name_git, "info", "lfs", "objects", "batch"])
            if name_git.ends_with(".git") =>
        {
            let name = name_git.trim_end_matches(".git");
            batch(s, hub, who, &format!("{org}/{name}"), headers, &body)
        }
        ("PUT", ["lfs-upload", org, name, oid]) => {
            lfs_put(s, hub, &format!("{org}/{name}"), oid, query, headers, body)
        }
        ("POST", ["lfs-verify", org, name, oid]) => {
            lfs_verify(hub, who, &format!("{org}/{name}"), oid, headers, &body)
        }
        ("GET", ["lfs-cdn", org, name, oid]) => {
            match hub
                .repos
                .get(&format!("{org}/{name}"))
                .and_then(|r| r.lfs.get(*oid))
            {
                Some(bytes) => (StatusCode::OK, bytes.clone()).into_response(),
                None => hub_error(StatusCode::NOT_FOUND, None, "no such object"),
            }
        }
        ("GET" | "HEAD", [org, name, "resolve", rev, file @ ..]) if !file.is_empty() => {
            resolve(s, hub, who, &format!("{org}/{name}"), rev, &file.join("/"))
        }
        _ => hub_error(
            StatusCode::NOT_FOUND,
            None,
            "not an endpoint of the fake Hub",
        ),
    }
}

/// A refusal, boxed (a [`Response`] is large).
type Refused = Box<Response>;

/// The `Ok` value of a `Result<_, Refused>`, or (from the handler) the refusal's response.
macro_rules! or_refuse {
    ($result:expr) => {
        match $result {
            Ok(v) => v,
            Err(refused) => return *refused,
        }
    };
}

/// `value[key]`, when it is a string.
fn str_field<'v>(value: &'v serde_json::Value, key: &str) -> Option<&'v str> {
    value.get(key).and_then(|v| v.as_str())
}

fn parse_json(body: &[u8]) -> Result<serde_json::Value, Refused> {
    serde_json::from_slice(body).map_err(|e| Box::new(bad_request(format!("invalid JSON: {e}"))))
}

/// `POST /api/repos/create`.
fn create(s: &Shared, hub: &mut Hub, who: Caller, body: &[u8]) -> Response {
    if who != Caller::Writer {
        return write_refused();
    }
    let v = or_refuse!(parse_json(body));
    let Some(name) = str_field(&v, "name") else {
        return bad_request("`name` is required");
    };
    let org = str_field(&v, "organization").unwrap_or("fake-user");
    if let Some(t) = str_field(&v, "type") {
        if t != "model" {
            return bad_request(format!("the fake Hub only has model repos, not {t:?}"));
        }
    }
    let private = v.get("private").and_then(|p| p.as_bool()).unwrap_or(false);
    let repo = format!("{org}/{name}");
    if let Err(e) = validate_repo(&repo) {
        return bad_request(e.to_string());
    }
    let url = format!("{}/{repo}", s.base);
    if hub.repos.contains_key(&repo) {
        return json(
            StatusCode::CONFLICT,
            serde_json::json!({"error": "You already created this model repo", "url": url}),
        );
    }
    hub.create(&repo, private);
    json(
        StatusCode::OK,
        serde_json::json!({"url": url, "name": repo, "id": repo}),
    )
}

/// The repo if `who` may read it, else the Hub's not-found answer.
fn readable<'h>(hub: &'h Hub, who: Caller, repo: &str) -> Result<&'h FakeRepo, Refused> {
    match hub.repos.get(repo) {
        Some(r) if !r.private || who == Caller::Writer => Ok(r),
        _ => Err(Box::new(repo_not_found(who))),
    }
}

fn writable<'h>(hub: &'h mut Hub, who: Caller, repo: &str) -> Result<&'h mut FakeRepo, Refused> {
    if who != Caller::Writer {
        return Err(Box::new(write_refused()));
    }
    hub.repos
        .get_mut(repo)
        .ok_or_else(|| Box::new(repo_not_found(who)))
}

fn check_revision(rev: &str) -> Result<(), Refused> {
    if rev == "main" {
        Ok(())
    } else {
        Err(Box::new(hub_error(
            StatusCode::NOT_FOUND,
            Some("RevisionNotFound"),
            &format!("Invalid rev id: {rev}"),
        )))
    }
}

/// `POST /api/models/{repo}/preupload/{rev}`.
fn preupload(hub: &mut Hub, who: Caller, repo: &str, rev: &str, body: &[u8]) -> Response {
    or_refuse!(writable(hub, who, repo).map(drop).and(check_revision(rev)));
    let v = or_refuse!(parse_json(body));
    let Some(files) = v.get("files").and_then(|f| f.as_array()) else {
        return bad_request("`files` is required");
    };
    let mut out = Vec::new();
    for f in files {
        let (Some(path), Some(size), Some(sample)) = (
            str_field(f, "path"),
            f.get("size").and_then(|p| p.as_u64()),
            str_field(f, "sample"),
        ) else {
            return bad_request("each file needs `path`, `size` and `sample`");
        };
        match base64::engine::general_purpose::STANDARD.decode(sample) {
            Ok(s) if s.len() <= 512 && s.len() as u64 <= size => {}
            _ => return bad_request(format!("bad sample for {path:?}")),
        }
        let mode = if is_lfs_path(path, size) {
            "lfs"
        } else {
            "regular"
        };
        out.push(serde_json::json!({"path": path, "uploadMode": mode, "shouldIgnore": false}));
    }
    json(StatusCode::OK, serde_json::json!({ "files": out }))
}

/// `POST /{repo}.git/info/lfs/objects/batch`.
fn batch(
    s: &Shared,
    hub: &mut Hub,
    who: Caller,
    repo: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let accepts = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains(LFS_MEDIA_TYPE));
    if !accepts {
        return hub_error(
            StatusCode::NOT_ACCEPTABLE,
            None,
            "Accept must be application/vnd.git-lfs+json",
        );
    }
    let r = or_refuse!(writable(hub, who, repo));
    let v = or_refuse!(parse_json(body));
    if str_field(&v, "operation") != Some("upload") {
        return bad_request("the fake Hub's batch API only does `upload`");
    }
    if let Some(t) = v.get("transfers").and_then(|t| t.as_array()) {
        if !t.iter().any(|t| t.as_str() == Some("basic")) {
            return hub_error(
                StatusCode::UNPROCESSABLE_ENTITY,
                None,
                "no supported transfer (basic)",
            );
        }
    }
    if let Some(a) = str_field(&v, "hash_algo") {
        if a != "sha256" {
            return hub_error(StatusCode::CONFLICT, None, "unsupported hash algorithm");
        }
    }
    let Some(objects) = v.get("objects").and_then(|o| o.as_array()) else {
        return bad_request("`objects` is required");
    };
    let mut out = Vec::new();
    for o in objects {
        let oid = str_field(o, "oid").unwrap_or_default();
        let size = o.get("size").and_then(|x| x.as_u64());
        let valid = oid.len() == 64 && oid.bytes().all(|b| b.is_ascii_hexdigit());
        let Some(size) = size.filter(|_| valid) else {
            out.push(serde_json::json!({"oid": oid, "error": {"code": 422, "message": "invalid oid or size"}}));
            continue;
        };
        if r.lfs.get(oid).is_some_and(|b| b.len() as u64 == size) {
            out.push(serde_json::json!({"oid": oid, "size": size, "authenticated": true}));
            continue;
        }
        let sig = signature(&s.token, repo, oid, size);
        out.push(serde_json::json!({
            "oid": oid,
            "size": size,
            "authenticated": true,
            "actions": {
                "upload": {
                    "href": format!("{}/lfs-upload/{repo}/{oid}?size={size}", s.base),
                    "header": {"X-Fake-Signature": sig},
                    "expires_in": 3600,
                },
                "verify": {
                    "href": format!("{}/lfs-verify/{repo}/{oid}", s.base),
                    "header": {"X-Fake-Verify": "1"},
                    "expires_in": 3600,
                },
            },
        }));
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, LFS_MEDIA_TYPE)],
        serde_json::json!({"transfer": "basic", "objects": out, "hash_algo": "sha256"}).to_string(),
    )
        .into_response()
}

/// `PUT` of an LFS object to the (signed) upload href the batch answered.
fn lfs_put(
    s: &Shared,
    hub: &mut Hub,
    repo: &str,
    oid: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    body: Bytes,
) -> Response {
    let Some(size) = query_param(query, "size").and_then(|v| v.parse::<u64>().ok()) else {
        return hub_error(StatusCode::FORBIDDEN, None, "unsigned upload URL");
    };
    let sig = headers
        .get("x-fake-signature")
        .and_then(|v| v.to_str().ok());
    if sig != Some(signature(&s.token, repo, oid, size).as_str()) {
        return hub_error(
            StatusCode::FORBIDDEN,
            None,
            "SignatureDoesNotMatch: send the action's header",
        );
    }
    if body.len() as u64 != size || sha256_hex(&body) != oid {
        return bad_request("the body is not the object the batch announced");
    }
    let Some(r) = hub.repos.get_mut(repo) else {
        return hub_error(StatusCode::NOT_FOUND, None, "no such repo");
    };
    r.lfs.insert(oid.to_string(), body);
    hub.lfs_puts += 1;
    if hub.halt_armed {
        hub.halt_armed = false;
        hub.halted = true;
        s.resume.send_replace(false);
    }
    StatusCode::OK.into_response()
}

/// `POST` to the verify href: the object is stored with the size.
fn lfs_verify(
    hub: &mut Hub,
    who: Caller,
    repo: &str,
    oid: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    if headers.get("x-fake-verify").is_none() {
        return bad_request("send the verify action's header");
    }
    let r = or_refuse!(writable(hub, who, repo));
    let v = or_refuse!(parse_json(body));
    let size = v.get("size").and_then(|x| x.as_u64());
    if str_field(&v, "oid") != Some(oid) {
        return bad_request("the body's oid is not the href's");
    }
    match r.lfs.get(oid) {
        Some(b) if Some(b.len() as u64) == size => {
            json(StatusCode::OK, serde_json::json!({"message": "verified"}))
        }
        _ => hub_error(
            StatusCode::NOT_FOUND,
            None,
            "object not found or wrong size",
        ),
    }
}

/// `POST /api/models/{repo}/commit/{rev}` (ndjson), atomic: checked whole, then applied.
fn commit(
    s: &Shared,
    hub: &mut Hub,
    who: Caller,
    repo: &str,
    rev: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    or_refuse!(check_revision(rev));
    let r = or_refuse!(writable(hub, who, repo));
    let ndjson = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with(NDJSON_MEDIA_TYPE));
    if !ndjson {
        return bad_request("Content-Type must be application/x-ndjson");
    }
    let Ok(text) = std::str::from_utf8(body) else {
        return bad_request("the body is not UTF-8");
    };
    let mut summary = None;
    let mut changes: Vec<(String, FakeFile)> = Vec::new();
    for (i, line) in text.lines().filter(|l| !l.trim().is_empty()).enumerate() {
        let v: serde_json::Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(e) => return bad_request(format!("line {}: {e}", i + 1)),
        };
        let key = str_field(&v, "key").unwrap_or_default();
        let value = v.get("value").cloned().unwrap_or_default();
        let path = str_field(&value, "path");
        match (i, key) {
            (0, "header") => {
                let Some(s) = str_field(&value, "summary") else {
                    return bad_request("the header needs a `summary`");
                };
                if s.trim().is_empty() {
                    return bad_request("empty commit summary");
                }
                if let Some(parent) = str_field(&value, "parentCommit") {
                    if r.head().map(|c| c.oid.as_str()) != Some(parent) {
                        return hub_error(
                            StatusCode::PRECONDITION_FAILED,
                            None,
                            "parentCommit is not the head of main",
                        );
                    }
                }
                summary = Some(s.to_string());
            }
            (0, _) => return bad_request("the first line must be the header"),
            (_, "file") => {
                let Some(path) = path else {
                    return bad_request("a file needs a `path`");
                };
                if str_field(&value, "encoding") != Some("base64") {
                    return bad_request(format!("{path}: encoding must be base64"));
                }
                let content = str_field(&value, "content")
                    .and_then(|c| base64::engine::general_purpose::STANDARD.decode(c).ok());
                let Some(content) = content else {
                    return bad_request(format!("{path}: content is not base64"));
                };
                // Empty files cannot go through LFS: they are always regular.
                if !content.is_empty() && is_lfs_path(path, content.len() as u64) {
                    return bad_request(format!(
                        "Your push was rejected: {path} must be uploaded with LFS \
                         (the preupload answered uploadMode lfs)"
                    ));
                }
                changes.push((path.to_string(), FakeFile::Regular(Bytes::from(content))));
            }
            (_, "lfsFile") => {
                let Some(path) = path else {
                    return bad_request("an lfsFile needs a `path`");
                };
                if str_field(&value, "algo") != Some("sha256") {
                    return bad_request(format!("{path}: algo must be sha256"));
                }
                let oid = str_field(&value, "oid").unwrap_or_default();
                let Some(stored) = r.lfs.get(oid) else {
                    return bad_request(format!(
                        "{path}: LFS object {oid} was not uploaded to {repo}"
                    ));
                };
                let size = stored.len() as u64;
                if let Some(claimed) = value.get("size") {
                    if claimed.as_u64() != Some(size) {
                        return bad_request(format!(
                            "{path}: LFS object {oid} is {size} bytes, not {claimed}"
                        ));
                    }
                }
                changes.push((
                    path.to_string(),
                    FakeFile::Lfs {
                        oid: oid.to_string(),
                        size,
                    },
                ));
            }
            (_, other) => {
                return bad_request(format!("the fake Hub does not support {other:?} lines"))
            }
        }
    }
    let Some(summary) = summary else {
        return bad_request("an empty body");
    };
    if changes.is_empty() {
        return bad_request("no files in the commit");
    }
    let mut snapshot = r.head().map(|c| c.files.clone()).unwrap_or_default();
    snapshot.extend(changes);
    let oid = hub.push_commit(repo, &summary, snapshot, true);
    json(
        StatusCode::OK,
        serde_json::json!({
            "commitUrl": format!("{}/{repo}/commit/{oid}", s.base),
            "commitOid": oid,
            "success": true,
            "hookOutput": "",
        }),
    )
}

/// `GET /api/models/{repo}/tree/{rev}`, paginated with `cursor` and `Link`.
fn tree(
    s: &Shared,
    hub: &Hub,
    who: Caller,
    repo: &str,
    rev: &str,
    query: Option<&str>,
) -> Response {
    let r = or_refuse!(readable(hub, who, repo));
    or_refuse!(check_revision(rev));
    let entries: Vec<serde_json::Value> = r
        .head()
        .map(|c| {
            c.files
                .iter()
                .map(|(path, f)| {
                    let mut e = serde_json::json!({
                        "type": "file",
                        "oid": git_blob_oid(&f.blob()),
                        "size": f.size(),
                        "path": path,
                    });
                    if let FakeFile::Lfs { oid, size } = f {
                        e["lfs"] = serde_json::json!({
                            "oid": oid,
                            "size": size,
                            "pointerSize": f.blob().len(),
                        });
                    }
                    e
                })
                .collect()
        })
        .unwrap_or_default();
    let start = query_param(query, "cursor")
        .and_then(|c| c.parse::<usize>().ok())
        .unwrap_or(0)
        .min(entries.len());
    let end = (start + hub.tree_page_size).min(entries.len());
    let mut resp = json(
        StatusCode::OK,
        serde_json::Value::from(entries[start..end].to_vec()),
    );
    if end < entries.len() {
        let link = format!(
            "<{}/api/models/{repo}/tree/{rev}?cursor={end}>; rel=\"next\"",
            s.base
        );
        if let Ok(v) = HeaderValue::from_str(&link) {
            resp.headers_mut().insert(header::LINK, v);
        }
    }
    resp
}

/// `GET /{repo}/resolve/{rev}/{file}`: a regular file's bytes, or a 302 to the object
/// for an LFS file (as the Hub redirects to its CDN).
fn resolve(s: &Shared, hub: &Hub, who: Caller, repo: &str, rev: &str, file: &str) -> Response {
    let r = or_refuse!(readable(hub, who, repo));
    or_refuse!(check_revision(rev));
    let Some(head) = r.head() else {
        return hub_error(
            StatusCode::NOT_FOUND,
            Some("RevisionNotFound"),
            "empty repo",
        );
    };
    let commit = head.oid.clone();
    match head.files.get(file) {
        None => hub_error(
            StatusCode::NOT_FOUND,
            Some("EntryNotFound"),
            &format!("{file} does not exist on \"main\""),
        ),
        Some(FakeFile::Regular(bytes)) => (
            StatusCode::OK,
            [
                ("x-repo-commit", commit),
                ("etag", format!("\"{}\"", git_blob_oid(bytes))),
            ],
            bytes.clone(),
        )
            .into_response(),
        Some(FakeFile::Lfs { oid, size }) => (
            StatusCode::FOUND,
            [
                ("location", format!("{}/lfs-cdn/{repo}/{oid}", s.base)),
                ("x-repo-commit", commit),
                ("x-linked-size", size.to_string()),
                ("x-linked-etag", format!("\"{oid}\"")),
            ],
        )
            .into_response(),
    }
}

// ---------------------------------------------------------------------------------------
// olah: a real Hub-compatible server, offline over local git mirrors.
// ---------------------------------------------------------------------------------------

/// The olah version the tests were written against.
pub const OLAH_VERSION: &str = "0.5.4";

/// The command that installs it.
pub const OLAH_INSTALL_HINT: &str = "python3 -m pip install olah==0.5.4";

/// How long [`OlahServer::start`] waits for olah to accept connections.
pub const OLAH_START_DEADLINE: Duration = Duration::from_secs(45);

/// Why olah could not be found or started, or a git mirror written.
#[derive(Debug, thiserror::Error)]
pub enum OlahError {
    /// `OLAH_CLI` names no file.
    #[error("OLAH_CLI={} is not a file", path.display())]
    NotAFile {
        /// What it names.
        path: PathBuf,
    },
    /// olah is not installed.
    #[error(
        "olah (a Hub-compatible mirror server) is not installed: run `{}`",
        OLAH_INSTALL_HINT
    )]
    NotInstalled,
    /// git is not installed.
    #[error("git is not installed")]
    NoGit,
    /// A file or folder could not be written.
    #[error("{doing} {}: {source}", path.display())]
    Io {
        /// `creating` or `writing`.
        doing: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// git could not be run.
    #[error("running git {args:?}: {source}")]
    GitRun {
        /// Its arguments.
        args: Vec<String>,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// git failed.
    #[error("git {args:?} in {}: {stderr}", dir.display())]
    Git {
        /// Its arguments.
        args: Vec<String>,
        /// Where it ran.
        dir: PathBuf,
        /// What it printed on stderr.
        stderr: String,
    },
    /// The mirror's repo id is not one.
    #[error(transparent)]
    BadRepo(#[from] hanzod_store::RegistryError),
    /// olah's configuration could not be written as TOML.
    #[error("writing olah's config: {0}")]
    Config(#[source] toml::ser::Error),
    /// `OLAH_CLI` or the found command is empty.
    #[error("empty olah command")]
    EmptyCommand,
    /// The process did not start or accept connections.
    #[error(transparent)]
    Launch(#[from] LaunchError),
}

/// An [`OlahError::Io`] `doing` something to `path`.
fn io(doing: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> OlahError {
    let path = path.to_path_buf();
    move |source| OlahError::Io {
        doing,
        path,
        source,
    }
}

/// The command line that runs olah: `$OLAH_CLI`, else `olah-cli` on `PATH`, else
/// `python3 -m olah.server` when `python3` can import `olah`.
///
/// Errors: none of them (the message names [`OLAH_INSTALL_HINT`]).
pub fn find_olah() -> Result<Vec<OsString>, OlahError> {
    if let Some(p) = std::env::var_os("OLAH_CLI").filter(|p| !p.is_empty()) {
        if Path::new(&p).is_file() {
            return Ok(vec![p]);
        }
        return Err(OlahError::NotAFile { path: p.into() });
    }
    if let Some(p) = on_path("olah-cli") {
        return Ok(vec![p.into_os_string()]);
    }
    let importable = Command::new("python3")
        .args(["-c", "import olah.server"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if importable {
        return Ok(vec!["python3".into(), "-m".into(), "olah.server".into()]);
    }
    Err(OlahError::NotInstalled)
}

/// Whether a test may skip for want of olah ([`find_olah`]) or git ([`git_available`]):
/// only when one is missing *and* the environment variable `CI` is unset. `Ok(None)`: run
/// olah; `Ok(Some(reason))`: skip, saying why; `Err`: fail (under `CI` a missing olah is an
/// error, not a skip).
pub fn olah_skip_reason() -> Result<Option<String>, RequiredUnderCi<OlahError>> {
    let found = find_olah().and_then(|_| {
        if git_available() {
            Ok(())
        } else {
            Err(OlahError::NoGit)
        }
    });
    crate::process::skip_reason(found)
}

/// Whether `git` runs.
pub fn git_available() -> bool {
    Command::new("git")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A file of a git mirror.
#[derive(Debug, Clone, Copy)]
pub struct MirrorFile<'a> {
    /// The path in the repo.
    pub path: &'a str,
    /// The content.
    pub bytes: &'a [u8],
    /// Stored through LFS: the commit holds the pointer, the object lies in
    /// `.git/lfs/objects/{oid[0..2]}/{oid[2..4]}/{oid}` (where olah serves it from).
    pub lfs: bool,
}

fn git(dir: &Path, args: &[&str]) -> Result<(), OlahError> {
    let owned = || args.iter().map(|a| a.to_string()).collect();
    let out = Command::new("git")
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .args([
            "-c",
            "user.name=hanzod test",
            "-c",
            "user.email=hanzod@localhost",
            "-c",
            "commit.gpgsign=false",
        ])
        .args(args)
        .output()
        .map_err(|source| OlahError::GitRun {
            args: owned(),
            source,
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(OlahError::Git {
            args: owned(),
            dir: dir.to_path_buf(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}

/// Writes repo `repo` (`{org}/{name}`) as a git repository at
/// `mirrors/models/{org}/{name}` (olah's mirror layout) with one commit on `main` holding
/// `files`, and returns its directory.
///
/// Errors: a bad repo id, file system or git failures.
pub fn write_git_mirror(
    mirrors: &Path,
    repo: &str,
    files: &[MirrorFile<'_>],
) -> Result<PathBuf, OlahError> {
    validate_repo(repo)?;
    let dir = mirrors.join("models").join(repo);
    std::fs::create_dir_all(&dir).map_err(io("creating", &dir))?;
    git(&dir, &["init", "-q"])?;
    git(&dir, &["symbolic-ref", "HEAD", "refs/heads/main"])?;
    for f in files {
        let path = dir.join(f.path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io("creating", parent))?;
        }
        let write = |p: &Path, b: &[u8]| std::fs::write(p, b).map_err(io("writing", p));
        if f.lfs {
            let oid = sha256_hex(f.bytes);
            let objects = dir
                .join(".git/lfs/objects")
                .join(&oid[..2])
                .join(&oid[2..4]);
            std::fs::create_dir_all(&objects).map_err(io("creating", &objects))?;
            write(&objects.join(&oid), f.bytes)?;
            write(&path, lfs_pointer(&oid, f.bytes.len() as u64).as_bytes())?;
        } else {
            write(&path, f.bytes)?;
        }
    }
    git(&dir, &["add", "-A"])?;
    git(&dir, &["commit", "-q", "-m", "hanzod test mirror"])?;
    Ok(dir)
}

/// An olah process serving `mirrors` offline on a free `127.0.0.1` port; killed when
/// dropped.
#[derive(Debug)]
pub struct OlahServer {
    process: ServerProcess,
    port: u16,
}

#[derive(serde::Serialize)]
struct OlahBasic {
    host: String,
    port: u16,
    #[serde(rename = "repos-path")]
    repos_path: String,
    #[serde(rename = "mirrors-path")]
    mirrors_path: Vec<String>,
}

#[derive(serde::Serialize)]
struct OlahAccessibility {
    offline: bool,
}

#[derive(serde::Serialize)]
struct OlahConfigFile {
    basic: OlahBasic,
    accessibility: OlahAccessibility,
}

impl OlahServer {
    /// Starts olah ([`find_olah`]) with its files (`olah.toml`, `olah.out`, `logs/`,
    /// `repos/`) in `dir` (created if missing), serving the git mirrors under `mirrors`
    /// (see [`write_git_mirror`]) with `offline = true`, on a free loopback port (up to three
    /// tried, as one found free may be taken before olah binds it), and waits (at most
    /// [`OLAH_START_DEADLINE`]) until it accepts connections. Its output is appended to
    /// `olah.out`.
    ///
    /// The configuration (`olah -c olah.toml --log-path logs`):
    ///
    /// ```toml
    /// [basic]
    /// host = "127.0.0.1"
    /// port = 12345
    /// repos-path = "<dir>/repos"
    /// mirrors-path = ["<mirrors>"]
    ///
    /// [accessibility]
    /// offline = true
    /// ```
    ///
    /// Errors: olah not installed, no free port, the process exits or does not listen in
    /// time (the message quotes its output).
    pub async fn start(mirrors: &Path, dir: &Path) -> Result<OlahServer, OlahError> {
        let argv = find_olah()?;
        std::fs::create_dir_all(dir).map_err(io("creating", dir))?;
        let (program, args) = argv.split_first().ok_or(OlahError::EmptyCommand)?;
        let program = Path::new(program);
        on_free_ports(3, |port, _| async move {
            let config = OlahConfigFile {
                basic: OlahBasic {
                    host: "127.0.0.1".to_string(),
                    port,
                    repos_path: dir.join("repos").display().to_string(),
                    mirrors_path: vec![mirrors.display().to_string()],
                },
                accessibility: OlahAccessibility { offline: true },
            };
            let toml_text = toml::to_string(&config).map_err(OlahError::Config)?;
            let toml_path = dir.join("olah.toml");
            std::fs::write(&toml_path, toml_text).map_err(io("writing", &toml_path))?;
            let mut cmd = Command::new(program);
            cmd.args(args)
                .arg("-c")
                .arg(&toml_path)
                .arg("--log-path")
                .arg(dir.join("logs"))
                .current_dir(dir)
                .stdin(Stdio::null());
            let shown = format!("olah ({})", program.display());
            let process = ServerProcess::spawn(&mut cmd, &dir.join("olah.out"), &shown)?;
            let ready = process.wait_ready(
                OLAH_START_DEADLINE,
                Duration::from_millis(100),
                "TCP connections",
                || async move {
                    let tcp = tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await;
                    tcp.ok().map(drop)
                },
            );
            let (process, ()) = ready.await.map_err(|e| e.on(&shown, port))?;
            Ok(OlahServer { process, port })
        })
        .await
    }

    /// Its endpoint, `http://127.0.0.1:{port}` (an `HF_ENDPOINT`).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The end of its output (`olah.out`), for error messages.
    pub fn output_tail(&self) -> String {
        self.process.log_tail()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lfs_rules_follow_the_default_gitattributes() {
        assert!(is_lfs_path("model.safetensors", 10));
        assert!(is_lfs_path("x/pytorch_model.bin", 10));
        assert!(!is_lfs_path("config.json", 10));
        assert!(!is_lfs_path("README.md", 10));
        assert!(is_lfs_path("README.md", LFS_THRESHOLD));
        assert!(!is_lfs_path("Makefile", 1));
    }

    #[test]
    fn pointers_are_git_lfs_v1() {
        let p = lfs_pointer(&"a".repeat(64), 3000);
        assert!(p.starts_with("version https://git-lfs.github.com/spec/v1\noid sha256:aaaa"));
        assert!(p.ends_with("\nsize 3000\n"));
    }

    #[test]
    fn query_params() {
        assert_eq!(query_param(Some("a=1&size=42"), "size"), Some("42"));
        assert_eq!(query_param(Some("a=1"), "size"), None);
        assert_eq!(query_param(None, "size"), None);
    }
}
