//! The real [`ObjectStore`] adapter: a thin typed client of the Kubo HTTP RPC API
//! (`IPFS_URL`, e.g. `http://127.0.0.1:5001`), as served by Kubo (go-ipfs) and js-ipfs
//! (DESIGN §7, §11).
//!
//! Every call is a `POST {IPFS_URL}/api/v0/<command>?<arguments>` (the RPC API refuses other
//! methods). The node is trusted for nothing: what it stores is checked against the CIDs
//! computed here ([`hanzod_protocol::cid`]).
//!
//! | port call | RPC command(s) |
//! |---|---|
//! | [`KuboObjectStore::connect`] | `version` |
//! | [`ObjectStore::put`] | `add?cid-version=1&raw-leaves=true&chunker=size-262144&hash=sha2-256&pin=false` — the node's CID must equal [`cid_of`] |
//! | [`ObjectStore::get`] | `block/get` of the root (hash-checked: gives the file size), `refs?recursive=true` (every block present), `cat` (streamed, bounded by the size, then [`cid_of`] checked) |
//! | [`ObjectStore::contains`] | `refs?recursive=true&unique=true` |
//! | [`ObjectStore::pin`] | `refs` as `contains`, then `pin/add?recursive=true` |
//! | [`ObjectStore::is_pinned`], [`ObjectStore::pins`] | `pin/ls?type=recursive` |
//!
//! **Lookups that may miss never hang.** A node asked for a block it lacks looks for it on
//! the network, without end. Every lookup therefore carries `offline=true` (Kubo's global
//! option: a missing block is an error at once) *and* `timeout=<ms>ms`
//! ([`KuboOptions::lookup_timeout`]; both Kubo and js-ipfs honour it). js-ipfs ignores
//! `offline` even when the node runs offline (it waits on its "want" list), so against it
//! the node-side timeout is what ends the wait: a lookup the node itself reports as timed
//! out counts as *absent*. A node that does not answer at all (the client-side deadline,
//! the node's timeout plus [`LOOKUP_GRACE`]) is an [`ObjectError::Io`], not an absence.
//!
//! Errors: a refused connection, a timeout or a broken reply is [`ObjectError::Io`] naming
//! the URL (credentials in the URL are never shown); the node's error JSON
//! `{"Message": …, "Code": …}` becomes [`ObjectError::NotFound`] when it says the block is
//! missing ("not found", "could not find", "timed out", "aborted", "not pinned"),
//! [`ObjectError::BadCid`] when the node refuses a CID argument as a client error
//! (HTTP 400 / `Code` 1), else [`ObjectError::Io`] quoting the message. CID strings are
//! checked locally ([`parse_cid`]) before any request.
//!
//! CIDs are asked for and compared as CIDs, not strings: js-ipfs answers in base58btc
//! (`zdj7…`) unless told `cid-base=base32`, which every call sends.
//!
//! TLS ([`super::tls`], ALPN `http/1.1`): an `https://` URL is verified against the PEM roots
//! of [`KuboOptions::ca_file`], or else of `SSL_CERT_FILE` or the system bundle, using rustls
//! with the `ring` provider chosen there (no process-wide provider is needed or installed).
//! `http://` needs none (a `ca_file`, when given, must still be readable).
//! `user:password@` in the URL is sent as HTTP basic auth (Kubo's `API.Authorizations`).
//! Proxies from the environment (`HTTP_PROXY`, …) are not used: the node is reached directly.
//! Redirects are not followed (an RPC API does not redirect; a 3xx is an error).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ipld_dagpb::PbNode;
use reqwest::{Response, StatusCode, Url};
use serde::Deserialize;

use crate::tls::{self, Alpn};
use hanzod_protocol::cid::{block_cid, cid_of, Cid, DAG_PB, RAW};
use hanzod_store::objects::{parse_cid, ObjectError, ObjectStore};

/// Default of [`KuboOptions::timeout`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Default of [`KuboOptions::connect_timeout`].
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Default of [`KuboOptions::lookup_timeout`].
pub const DEFAULT_LOOKUP_TIMEOUT: Duration = Duration::from_secs(30);

/// How much longer than [`KuboOptions::lookup_timeout`] the client waits for a lookup's
/// answer, so that the node's own timeout (an absence) arrives before the client's (an
/// [`ObjectError::Io`]).
pub const LOOKUP_GRACE: Duration = Duration::from_secs(5);

/// The largest block `block/get` may return, in bytes (Kubo refuses blocks over 2 MiB;
/// a file's blocks are at most 262,144 bytes of data or ~8.7 KB of links).
const MAX_BLOCK: usize = 4 << 20;

/// The largest JSON reply read whole (`version`, `add`, `pin/add`, `pin/ls`), in bytes: a
/// `pin/ls` of ~300,000 pins.
const MAX_REPLY: usize = 32 << 20;

/// The longest line of a streamed `refs` reply, in bytes.
const MAX_LINE: usize = 64 << 10;

/// At most this much of a file is allocated before its bytes arrive, in bytes.
const MAX_PREALLOC: u64 = 256 << 20;

/// The query arguments of `add` that make the node import as [`hanzod_protocol::cid`] does.
const ADD_ARGS: &[(&str, &str)] = &[
    ("cid-version", "1"),
    ("raw-leaves", "true"),
    ("chunker", "size-262144"),
    ("hash", "sha2-256"),
    ("pin", "false"),
    ("progress", "false"),
    ("cid-base", "base32"),
];

/// How a [`KuboObjectStore`] talks to its node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KuboOptions {
    /// The most one request may take, from sending to the last byte of the reply (an
    /// `add` or `cat` of a whole file included). Default [`DEFAULT_TIMEOUT`] (300 s).
    pub timeout: Duration,
    /// The most establishing a connection may take. Default [`DEFAULT_CONNECT_TIMEOUT`]
    /// (5 s).
    pub connect_timeout: Duration,
    /// The node-side bound (`timeout=` argument) on lookups that may miss: `block/get` of a
    /// root, `refs`, `pin/ls` of one CID. Past it the node answers "timed out" and the block
    /// counts as absent, so it must exceed the time the node needs to walk a stored DAG
    /// (Kubo: milliseconds per thousand blocks). Default [`DEFAULT_LOOKUP_TIMEOUT`] (30 s).
    pub lookup_timeout: Duration,
    /// PEM file of the root certificates trusted for an `https://` URL, instead of
    /// `SSL_CERT_FILE` or the system bundle ([`super::tls`]); when given it must be usable,
    /// even for `http://`. Default `None`.
    pub ca_file: Option<PathBuf>,
}

impl Default for KuboOptions {
    fn default() -> Self {
        KuboOptions {
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            lookup_timeout: DEFAULT_LOOKUP_TIMEOUT,
            ca_file: None,
        }
    }
}

/// An [`ObjectStore`] on an IPFS node's Kubo HTTP RPC API. Cheap to clone (one shared
/// connection pool).
///
/// `put` is `add` with CIDv1 raw-leaf settings, checked against [`cid_of`]; `get` streams
/// `cat` and checks the bytes against the CID; `pin` is a recursive `pin/add`. Files are
/// added unpinned, so the node's garbage collection may drop what was not [`pin`]ned.
///
/// [`pin`]: ObjectStore::pin
#[derive(Debug, Clone)]
pub struct KuboObjectStore {
    client: reqwest::Client,
    /// `…/api/v0/`, to which command names are joined.
    api: Url,
    /// The URL as given, without credentials: for messages.
    shown: Arc<str>,
    version: Arc<str>,
    options: KuboOptions,
}

/// A failed request, before it is mapped to an [`ObjectError`] for the call at hand.
#[derive(Debug)]
enum CallError {
    /// No (complete) answer: connection refused, timeout, broken reply. The message names
    /// the endpoint.
    Transport(String),
    /// The node answered with an error.
    Node(NodeError),
}

/// An error the node reported: its `{"Message", "Code"}` JSON (or text) and HTTP status,
/// or an in-band `Err` of a streamed reply (status 200).
#[derive(Debug, Clone, PartialEq, Eq)]
struct NodeError {
    /// `http://…/api/v0/<command>`, without credentials.
    endpoint: String,
    status: u16,
    /// go-ipfs-cmds error code: 0 normal, 1 client, 2 implementation, 3 not found, 4 fatal.
    code: Option<i64>,
    message: String,
}

impl NodeError {
    /// Whether the node says the object is not there (or it gave up looking).
    fn is_absent(&self) -> bool {
        let m = self.message.to_ascii_lowercase();
        self.code == Some(3)
            || [
                "not found",
                "could not find",
                "timed out",
                "deadline exceeded",
                "aborted",
                "not pinned",
                "no link named",
            ]
            .iter()
            .any(|needle| m.contains(needle))
    }

    /// Whether the node refused the request itself (HTTP 400, `Code` 1).
    fn is_client_error(&self) -> bool {
        self.status == 400 || self.code == Some(1)
    }

    /// The error for a call about `cid`, or about no CID (`put`, `pins`).
    fn into_object_error(self, cid: Option<&Cid>) -> ObjectError {
        match cid {
            Some(cid) if self.is_absent() => ObjectError::NotFound {
                cid: cid.to_string(),
            },
            Some(cid) if self.is_client_error() => ObjectError::BadCid {
                reason: format!("{cid}: the node refused it: {}", self.message),
            },
            _ => ObjectError::Io {
                message: self.to_string(),
            },
        }
    }
}

impl std::fmt::Display for NodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: HTTP {}", self.endpoint, self.status)?;
        if let Some(code) = self.code {
            write!(f, ", code {code}")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl CallError {
    fn into_object_error(self, cid: Option<&Cid>) -> ObjectError {
        match self {
            CallError::Transport(m) => ObjectError::Io { message: m },
            CallError::Node(e) => e.into_object_error(cid),
        }
    }
}

/// `e` and its sources, joined by ": ".
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// A transport failure of a request to `endpoint`, as an [`ObjectError::Io`] message.
fn transport_error(endpoint: &str, limit: Duration, e: reqwest::Error) -> String {
    let what = if e.is_timeout() {
        format!("no complete answer within {limit:?}")
    } else if e.is_connect() {
        "cannot connect".to_string()
    } else if e.is_body() || e.is_decode() {
        "the reply broke off".to_string()
    } else {
        "request failed".to_string()
    };
    let e = e.without_url();
    format!("IPFS node {endpoint}: {what}: {}", error_chain(&e))
}

/// `url` without user name and password, for messages.
fn redacted(url: &Url) -> String {
    let mut shown = url.clone();
    if !shown.username().is_empty() || shown.password().is_some() {
        let _ = shown.set_username("");
        let _ = shown.set_password(None);
    }
    shown.to_string()
}

/// The node's error reply `body` (JSON `{"Message", "Code"}` or text) with its `status`.
fn parse_node_error(endpoint: &str, status: StatusCode, body: &[u8]) -> NodeError {
    #[derive(Deserialize)]
    struct ErrorReply {
        #[serde(rename = "Message")]
        message: String,
        #[serde(rename = "Code", default)]
        code: Option<i64>,
    }
    let (message, code) = match serde_json::from_slice::<ErrorReply>(body) {
        Ok(reply) => (reply.message, reply.code),
        Err(_) => {
            let text = String::from_utf8_lossy(body);
            let text = text.trim();
            let text = if text.is_empty() {
                status
                    .canonical_reason()
                    .unwrap_or("no message")
                    .to_string()
            } else {
                text.chars().take(500).collect()
            };
            (text, None)
        }
    };
    NodeError {
        endpoint: endpoint.to_string(),
        status: status.as_u16(),
        code,
        message,
    }
}

/// A file's CID and size as `add` reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
struct AddReply {
    cid: Cid,
    /// Kubo's `Size`: the file's cumulative DAG size in bytes (a string in Kubo, a number
    /// in js-ipfs); `None` when absent or unparsable.
    size: Option<u64>,
}

/// A number, or a string holding one (Kubo renders `Size` as a string, js-ipfs as a number).
fn lenient_u64(value: Option<&serde_json::Value>) -> Option<u64> {
    match value? {
        serde_json::Value::Number(n) => n.as_u64(),
        serde_json::Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// Parses `add`'s NDJSON reply: the last object with a `Hash` is the file (progress lines
/// `{"Bytes": n}` and others are skipped); an in-band `{"Message", "Type": "error"}` is the
/// node's error. Errors: the reply's problem, as text.
fn parse_add_reply(body: &[u8]) -> Result<AddReply, String> {
    let mut last = None;
    for line in body.split(|&b| b == b'\n') {
        let line = line.trim_ascii();
        if line.is_empty() {
            continue;
        }
        let value: serde_json::Value = serde_json::from_slice(line).map_err(|e| {
            format!(
                "add replied a line that is not JSON ({e}): {:?}",
                String::from_utf8_lossy(&line[..line.len().min(200)])
            )
        })?;
        if value.get("Type").and_then(|t| t.as_str()) == Some("error") {
            let message = value
                .get("Message")
                .and_then(|m| m.as_str())
                .unwrap_or("unspecified error");
            return Err(format!("add failed: {message}"));
        }
        if let Some(hash) = value.get("Hash").and_then(|h| h.as_str()) {
            let cid = Cid::try_from(hash)
                .map_err(|e| format!("add replied Hash {hash:?}, not a CID: {e}"))?;
            last = Some(AddReply {
                cid,
                size: lenient_u64(value.get("Size")),
            });
        }
    }
    last.ok_or_else(|| "add replied no Hash".to_string())
}

/// One line of a `refs` reply: `Ok(Some(cid))`, `Ok(None)` for an empty `Ref`, or the
/// node's in-band `Err` message.
fn parse_refs_line(line: &[u8]) -> Result<Result<Option<Cid>, String>, String> {
    #[derive(Deserialize)]
    struct RefLine {
        #[serde(rename = "Ref", default)]
        reference: String,
        #[serde(rename = "Err", default)]
        err: String,
    }
    let parsed: RefLine = serde_json::from_slice(line).map_err(|e| {
        format!(
            "refs replied a line that is not a ref ({e}): {:?}",
            String::from_utf8_lossy(&line[..line.len().min(200)])
        )
    })?;
    if !parsed.err.is_empty() {
        return Ok(Err(parsed.err));
    }
    if parsed.reference.is_empty() {
        return Ok(Ok(None));
    }
    Cid::try_from(parsed.reference.as_str())
        .map(|c| Ok(Some(c)))
        .map_err(|e| format!("refs replied {:?}, not a CID: {e}", parsed.reference))
}

/// The CIDs of a `pin/ls` reply: `{"Keys": {"<cid>": {"Type": …}}}` (Kubo and js-ipfs) or
/// NDJSON lines `{"Cid": "<cid>", "Type": …}` (`stream=true`).
fn parse_pin_ls(body: &[u8]) -> Result<Vec<Cid>, String> {
    fn cid(s: &str) -> Result<Cid, String> {
        Cid::try_from(s).map_err(|e| format!("pin/ls replied {s:?}, not a CID: {e}"))
    }
    let mut out = Vec::new();
    for line in body.split(|&b| b == b'\n') {
        let line = line.trim_ascii();
        if line.is_empty() {
            continue;
        }
        let value: serde_json::Value = serde_json::from_slice(line)
            .map_err(|e| format!("pin/ls replied something that is not JSON: {e}"))?;
        if let Some(keys) = value.get("Keys").and_then(|k| k.as_object()) {
            for key in keys.keys() {
                out.push(cid(key)?);
            }
        } else if let Some(c) = value.get("Cid").and_then(|c| c.as_str()) {
            out.push(cid(c)?);
        } else if value.get("Keys").is_some_and(|k| k.is_null()) {
            // Kubo renders an empty pin set as `{"Keys": null}`.
        } else {
            return Err(format!("pin/ls replied an unexpected object: {value}"));
        }
    }
    Ok(out)
}

/// The `Version` of a `version` reply.
fn parse_version(body: &[u8]) -> Result<String, String> {
    #[derive(Deserialize)]
    struct VersionReply {
        #[serde(rename = "Version")]
        version: String,
    }
    serde_json::from_slice::<VersionReply>(body)
        .map(|v| v.version)
        .map_err(|e| {
            format!(
                "the version reply is not an IPFS node's ({e}): {:?}",
                String::from_utf8_lossy(&body[..body.len().min(200)])
            )
        })
}

/// The first CID named in `message` (e.g. js-ipfs's "Want for bafk… aborted", Kubo's
/// "ipld: could not find bafk…").
fn cid_in_message(message: &str) -> Option<Cid> {
    message
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| w.len() >= 46)
        .find_map(|w| Cid::try_from(w).ok())
}

/// A protobuf varint at the front of `buf`, advancing it.
fn take_varint(buf: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = buf.split_first()?;
        *buf = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// The `filesize` of a UnixFS `Data` message of type `File` (2) or `Raw` (0); `Err` says
/// why there is none.
fn unixfs_file_size(mut data: &[u8]) -> Result<u64, String> {
    let mut kind = None;
    let mut size = None;
    while !data.is_empty() {
        let key = take_varint(&mut data).ok_or("a truncated field key")?;
        match key & 7 {
            0 => {
                let v = take_varint(&mut data).ok_or("a truncated varint")?;
                match key >> 3 {
                    1 => kind = Some(v),
                    3 => size = Some(v),
                    _ => {}
                }
            }
            1 | 5 => {
                let n = if key & 7 == 1 { 8 } else { 4 };
                data = data.get(n..).ok_or("a truncated fixed field")?;
            }
            2 => {
                let len = take_varint(&mut data).ok_or("a truncated length")?;
                let len = usize::try_from(len).map_err(|_| "an oversized field")?;
                data = data.get(len..).ok_or("a truncated bytes field")?;
            }
            other => return Err(format!("wire type {other}")),
        }
    }
    match kind {
        Some(0 | 2) => size.ok_or_else(|| "no filesize".to_string()),
        Some(other) => Err(format!("UnixFS type {other}, not a file")),
        None => Err("no UnixFS type".to_string()),
    }
}

/// The file size a verified dag-pb root declares.
fn root_file_size(root: &Cid, block: Bytes) -> Result<u64, ObjectError> {
    let corrupt = |why: String| ObjectError::Corrupt {
        expected: root.to_string(),
        found: format!("a root that is not a UnixFS file node ({why})"),
    };
    let node = PbNode::from_bytes(block).map_err(|e| corrupt(e.to_string()))?;
    let data = node.data.ok_or_else(|| corrupt("no Data".into()))?;
    unixfs_file_size(&data).map_err(corrupt)
}

/// Why a body could not be read whole.
enum BodyError {
    /// It is longer than allowed.
    TooLong,
    /// The transfer failed.
    Transport(reqwest::Error),
}

/// Reads `resp`'s body, failing once it exceeds `limit` bytes; `expect` preallocates.
async fn read_limited(mut resp: Response, limit: u64, expect: u64) -> Result<Vec<u8>, BodyError> {
    let mut out = Vec::with_capacity(usize::try_from(expect.min(MAX_PREALLOC)).unwrap_or(0));
    while let Some(chunk) = resp.chunk().await.map_err(BodyError::Transport)? {
        if (out.len() + chunk.len()) as u64 > limit {
            return Err(BodyError::TooLong);
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// `url` as the RPC API's base `…/api/v0/`: a URL ending in `/api/v0` (or a proxy's path
/// prefix) is accepted as given.
fn api_base(url: &str) -> Result<Url, ObjectError> {
    let bad = |why: String| ObjectError::Io {
        message: format!("IPFS_URL {url:?} is not usable: {why}"),
    };
    let mut parsed = Url::parse(url.trim()).map_err(|e| bad(e.to_string()))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(bad(format!(
            "scheme {:?}: http or https expected (e.g. http://127.0.0.1:5001)",
            parsed.scheme()
        )));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(bad("no host".into()));
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(bad("a query or fragment".into()));
    }
    let path = parsed.path().trim_end_matches('/');
    let path = path.strip_suffix("/api/v0").unwrap_or(path);
    let base = format!("{path}/api/v0/");
    parsed.set_path(&base);
    Ok(parsed)
}

/// The `timeout=` argument for `d` (milliseconds, at least 1).
fn timeout_arg(d: Duration) -> String {
    format!("{}ms", d.as_millis().max(1))
}

impl KuboObjectStore {
    /// Connects to the node at `url` (`http://host:port` or `https://…`, optionally with a
    /// path prefix or a trailing `/api/v0`) and checks that it answers `POST /api/v0/version`.
    ///
    /// Errors: [`ObjectError::Io`] for a URL that does not parse or is not http(s) (the
    /// message quotes it), an https URL without usable root certificates, a
    /// [`KuboOptions::ca_file`] that is not a usable PEM bundle ([`super::tls::root_store`]),
    /// or a node that cannot be reached or does not answer as an IPFS node.
    pub async fn connect(url: &str, options: KuboOptions) -> Result<KuboObjectStore, ObjectError> {
        let api = api_base(url)?;
        let shown: Arc<str> = redacted(&api).trim_end_matches("/api/v0/").into();
        let http_error = |e: &dyn std::fmt::Display| ObjectError::Io {
            message: format!("HTTP client for {shown}: {e}"),
        };
        let client = tls::client_builder(
            api.scheme() == "https",
            options.ca_file.as_deref(),
            Alpn::Http1,
        )
        .map_err(|e| http_error(&e))?
        .connect_timeout(options.connect_timeout)
        .timeout(options.timeout)
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .build()
        .map_err(|e| http_error(&error_chain(&e)))?;
        let mut store = KuboObjectStore {
            client,
            api,
            shown,
            version: Arc::from(""),
            options,
        };
        let resp = store
            .call(
                "version",
                &[],
                None,
                store.options.connect_timeout + store.options.lookup_timeout,
            )
            .await
            .map_err(|e| e.into_object_error(None))?;
        let endpoint = store.endpoint_shown("version");
        let body = store.read_reply(resp, &endpoint).await?;
        store.version = parse_version(&body)
            .map_err(|e| ObjectError::Io {
                message: format!("{endpoint}: {e}"),
            })?
            .into();
        Ok(store)
    }

    /// The node's version, as `/api/v0/version` reported it at [`KuboObjectStore::connect`]
    /// (e.g. Kubo's `0.32.1`; js-ipfs reports its `ipfs-core` version, e.g. `0.18.1`).
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The node's URL, without credentials.
    pub fn url(&self) -> &str {
        &self.shown
    }

    /// The options it was connected with.
    pub fn options(&self) -> &KuboOptions {
        &self.options
    }

    fn endpoint_shown(&self, command: &str) -> String {
        format!("{}/api/v0/{command}", self.shown)
    }

    /// `POST /api/v0/<command>?<args>` with an optional body, answering within `limit`.
    /// A non-2xx answer is the node's error.
    async fn call(
        &self,
        command: &str,
        args: &[(&str, &str)],
        body: Option<(reqwest::Body, String, u64)>,
        limit: Duration,
    ) -> Result<Response, CallError> {
        let endpoint = self.endpoint_shown(command);
        let url = self
            .api
            .join(command)
            .map_err(|e| CallError::Transport(format!("{endpoint}: {e}")))?;
        let mut req = self.client.post(url).query(args).timeout(limit);
        if let Some((body, content_type, len)) = body {
            req = req
                .header(reqwest::header::CONTENT_TYPE, content_type)
                .header(reqwest::header::CONTENT_LENGTH, len)
                .body(body);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| CallError::Transport(transport_error(&endpoint, limit, e)))?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let body = match read_limited(resp, 1 << 20, 0).await {
            Ok(body) => body,
            Err(BodyError::TooLong) => b"(an error reply over 1 MiB)".to_vec(),
            Err(BodyError::Transport(e)) => {
                return Err(CallError::Transport(transport_error(&endpoint, limit, e)))
            }
        };
        Err(CallError::Node(parse_node_error(&endpoint, status, &body)))
    }

    /// A whole JSON reply, at most [`MAX_REPLY`] bytes.
    async fn read_reply(&self, resp: Response, endpoint: &str) -> Result<Vec<u8>, ObjectError> {
        let limit = self.options.timeout;
        read_limited(resp, MAX_REPLY as u64, 0)
            .await
            .map_err(|e| match e {
                BodyError::TooLong => ObjectError::Io {
                    message: format!("{endpoint}: a reply over {MAX_REPLY} bytes"),
                },
                BodyError::Transport(e) => ObjectError::Io {
                    message: transport_error(endpoint, limit, e),
                },
            })
    }

    /// The client-side deadline of a lookup.
    fn lookup_limit(&self) -> Duration {
        self.options.lookup_timeout + LOOKUP_GRACE
    }

    /// `block/get` of `cid`, checked against it. `NotFound(cid)` when the node lacks it.
    async fn block(&self, cid: &Cid) -> Result<Bytes, ObjectError> {
        let arg = cid.to_string();
        let timeout = timeout_arg(self.options.lookup_timeout);
        let resp = self
            .call(
                "block/get",
                &[
                    ("arg", arg.as_str()),
                    ("offline", "true"),
                    ("timeout", timeout.as_str()),
                ],
                None,
                self.lookup_limit(),
            )
            .await
            .map_err(|e| e.into_object_error(Some(cid)))?;
        let endpoint = self.endpoint_shown("block/get");
        let bytes = read_limited(resp, MAX_BLOCK as u64, 0)
            .await
            .map_err(|e| match e {
                BodyError::TooLong => ObjectError::Corrupt {
                    expected: arg.clone(),
                    found: format!("a block over {MAX_BLOCK} bytes"),
                },
                BodyError::Transport(e) => ObjectError::Io {
                    message: transport_error(&endpoint, self.lookup_limit(), e),
                },
            })?;
        let found = block_cid(cid.codec(), &bytes);
        if found != *cid {
            return Err(ObjectError::Corrupt {
                expected: arg,
                found: found.to_string(),
            });
        }
        Ok(Bytes::from(bytes))
    }

    /// Whether every block of `root`'s DAG is on the node: `Ok(None)` when so, else the
    /// first missing block the node names (`root` when it names none).
    async fn missing_block(&self, root: &Cid) -> Result<Option<Cid>, ObjectError> {
        let arg = root.to_string();
        let timeout = timeout_arg(self.options.lookup_timeout);
        let args = [
            ("arg", arg.as_str()),
            ("recursive", "true"),
            ("unique", "true"),
            ("offline", "true"),
            ("timeout", timeout.as_str()),
            ("cid-base", "base32"),
        ];
        let limit = self.lookup_limit();
        let mut resp = match self.call("refs", &args, None, limit).await {
            Ok(resp) => resp,
            Err(CallError::Node(e)) if e.is_absent() => {
                return Ok(Some(cid_in_message(&e.message).unwrap_or(*root)))
            }
            Err(e) => return Err(e.into_object_error(Some(root))),
        };
        let endpoint = self.endpoint_shown("refs");
        let mut pending: Vec<u8> = Vec::new();
        loop {
            let chunk = resp.chunk().await.map_err(|e| ObjectError::Io {
                message: transport_error(&endpoint, limit, e),
            })?;
            let done = chunk.is_none();
            if let Some(chunk) = chunk {
                pending.extend_from_slice(&chunk);
            } else if !pending.is_empty() {
                pending.push(b'\n');
            }
            while let Some(end) = pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = pending.drain(..=end).collect();
                let line = line.trim_ascii();
                if line.is_empty() {
                    continue;
                }
                match parse_refs_line(line).map_err(|e| ObjectError::Io {
                    message: format!("{endpoint}: {e}"),
                })? {
                    Ok(_) => {}
                    Err(message) => {
                        let e = NodeError {
                            endpoint: endpoint.clone(),
                            status: 200,
                            code: None,
                            message,
                        };
                        if e.is_absent() {
                            return Ok(Some(cid_in_message(&e.message).unwrap_or(*root)));
                        }
                        return Err(ObjectError::Io {
                            message: e.to_string(),
                        });
                    }
                }
            }
            if pending.len() > MAX_LINE {
                return Err(ObjectError::Io {
                    message: format!("{endpoint}: a reply line over {MAX_LINE} bytes"),
                });
            }
            if done {
                return Ok(None);
            }
        }
    }

    /// `add` of `bytes` with the importer settings of [`hanzod_protocol::cid`]: the node's CID.
    async fn add(&self, bytes: Bytes) -> Result<AddReply, ObjectError> {
        let boundary = format!("hanzod-{:032x}", rand::random::<u128>());
        let head = Bytes::from(format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"file\"\r\n\
             Content-Type: application/octet-stream\r\n\r\n"
        ));
        let tail = Bytes::from(format!("\r\n--{boundary}--\r\n"));
        let len = (head.len() + bytes.len() + tail.len()) as u64;
        let parts = [head, bytes, tail].map(Ok::<Bytes, std::io::Error>);
        let body = reqwest::Body::wrap_stream(futures_util::stream::iter(parts));
        let content_type = format!("multipart/form-data; boundary={boundary}");
        let resp = self
            .call(
                "add",
                ADD_ARGS,
                Some((body, content_type, len)),
                self.options.timeout,
            )
            .await
            .map_err(|e| e.into_object_error(None))?;
        let endpoint = self.endpoint_shown("add");
        let reply = self.read_reply(resp, &endpoint).await?;
        parse_add_reply(&reply).map_err(|e| ObjectError::Io {
            message: format!("{endpoint}: {e}"),
        })
    }

    /// `pin/ls?type=recursive`, of `arg` only when given.
    async fn pin_ls(&self, arg: Option<&Cid>) -> Result<Vec<Cid>, ObjectError> {
        let arg_text = arg.map(Cid::to_string);
        let timeout = timeout_arg(self.options.lookup_timeout);
        let mut args = vec![("type", "recursive"), ("cid-base", "base32")];
        let limit = match &arg_text {
            Some(a) => {
                args.extend([
                    ("arg", a.as_str()),
                    ("offline", "true"),
                    ("timeout", timeout.as_str()),
                ]);
                self.lookup_limit()
            }
            None => self.options.timeout,
        };
        let resp = match self.call("pin/ls", &args, None, limit).await {
            Ok(resp) => resp,
            Err(CallError::Node(e)) if arg.is_some() && e.is_absent() => return Ok(Vec::new()),
            Err(e) => return Err(e.into_object_error(arg)),
        };
        let endpoint = self.endpoint_shown("pin/ls");
        let body = self.read_reply(resp, &endpoint).await?;
        parse_pin_ls(&body).map_err(|e| ObjectError::Io {
            message: format!("{endpoint}: {e}"),
        })
    }
}

#[async_trait::async_trait]
impl ObjectStore for KuboObjectStore {
    /// `POST /api/v0/add?cid-version=1&raw-leaves=true&chunker=size-262144&hash=sha2-256&pin=false`
    /// (a one-part multipart body), while [`cid_of`] runs on a blocking thread. A node whose
    /// CID differs (other importer settings: CIDv0, another chunker or layout, inlining) is
    /// [`ObjectError::Corrupt`] `{expected: ours, found: the node's}`.
    async fn put(&self, bytes: Bytes) -> Result<String, ObjectError> {
        let local = {
            let bytes = bytes.clone();
            tokio::task::spawn_blocking(move || cid_of(&bytes))
        };
        let (local, remote) = tokio::join!(local, self.add(bytes));
        let local = local.map_err(|e| ObjectError::Io {
            message: format!("hashing task failed: {e}"),
        })?;
        let remote = remote?;
        if remote.cid != local {
            return Err(ObjectError::Corrupt {
                expected: local.to_string(),
                found: remote.cid.to_string(),
            });
        }
        Ok(local.to_string())
    }

    /// `block/get` of the root (hash-checked; a raw root is the whole file), `refs` for the
    /// rest of the DAG ([`ObjectError::NotFound`] names the first missing block the node
    /// reports), then `cat` streamed, at most the root's `filesize` bytes, and [`cid_of`]
    /// of the result checked against `cid` ([`ObjectError::Corrupt`] otherwise).
    async fn get(&self, cid: &str) -> Result<Arc<[u8]>, ObjectError> {
        let root = parse_cid(cid)?;
        let block = self.block(&root).await?;
        if root.codec() == RAW {
            let found = cid_of(&block);
            if found != root {
                return Err(ObjectError::Corrupt {
                    expected: root.to_string(),
                    found: found.to_string(),
                });
            }
            return Ok(Arc::from(block.to_vec()));
        }
        debug_assert_eq!(root.codec(), DAG_PB);
        let size = root_file_size(&root, block)?;
        if let Some(missing) = self.missing_block(&root).await? {
            return Err(ObjectError::NotFound {
                cid: missing.to_string(),
            });
        }
        let arg = root.to_string();
        let timeout = timeout_arg(self.options.timeout);
        let resp = self
            .call(
                "cat",
                &[
                    ("arg", arg.as_str()),
                    ("offline", "true"),
                    ("timeout", timeout.as_str()),
                ],
                None,
                self.options.timeout,
            )
            .await
            .map_err(|e| e.into_object_error(Some(&root)))?;
        let endpoint = self.endpoint_shown("cat");
        let bytes = match read_limited(resp, size, size).await {
            Ok(bytes) => bytes,
            Err(BodyError::TooLong) => {
                return Err(ObjectError::Corrupt {
                    expected: arg,
                    found: format!("more than the root's {size} bytes"),
                })
            }
            Err(BodyError::Transport(e)) => {
                return Err(ObjectError::Io {
                    message: transport_error(&endpoint, self.options.timeout, e),
                })
            }
        };
        tokio::task::spawn_blocking(move || {
            let found = cid_of(&bytes);
            if found == root {
                Ok(Arc::from(bytes))
            } else {
                Err(ObjectError::Corrupt {
                    expected: root.to_string(),
                    found: found.to_string(),
                })
            }
        })
        .await
        .map_err(|e| ObjectError::Io {
            message: format!("hashing task failed: {e}"),
        })?
    }

    /// `refs?recursive=true&unique=true&offline=true&timeout=…` of `cid`: true when the node
    /// walks the whole DAG without a missing block (blocks are not re-hashed).
    async fn contains(&self, cid: &str) -> Result<bool, ObjectError> {
        let root = parse_cid(cid)?;
        Ok(self.missing_block(&root).await?.is_none())
    }

    /// [`ObjectStore::contains`], then `pin/add?recursive=true&offline=true`.
    async fn pin(&self, cid: &str) -> Result<(), ObjectError> {
        let root = parse_cid(cid)?;
        if self.missing_block(&root).await?.is_some() {
            return Err(ObjectError::NotFound {
                cid: root.to_string(),
            });
        }
        let arg = root.to_string();
        let timeout = timeout_arg(self.options.timeout);
        let resp = self
            .call(
                "pin/add",
                &[
                    ("arg", arg.as_str()),
                    ("recursive", "true"),
                    ("offline", "true"),
                    ("timeout", timeout.as_str()),
                    ("progress", "false"),
                ],
                None,
                self.options.timeout,
            )
            .await
            .map_err(|e| e.into_object_error(Some(&root)))?;
        let endpoint = self.endpoint_shown("pin/add");
        self.read_reply(resp, &endpoint).await?;
        Ok(())
    }

    /// `pin/ls?arg=<cid>&type=recursive`: "not pinned" is `false`.
    async fn is_pinned(&self, cid: &str) -> Result<bool, ObjectError> {
        let root = parse_cid(cid)?;
        Ok(self.pin_ls(Some(&root)).await?.contains(&root))
    }

    /// `pin/ls?type=recursive`: the node's recursive pins (including any made by others),
    /// as base32 CIDv1 strings (CIDv0 `Qm…` pins as they are), sorted, without duplicates.
    async fn pins(&self) -> Result<Vec<String>, ObjectError> {
        let mut pins: Vec<String> = self
            .pin_ls(None)
            .await?
            .iter()
            .map(Cid::to_string)
            .collect();
        pins.sort();
        pins.dedup();
        Ok(pins)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1: &str = "bafybeicuke3dzucg3s3hsmn4pgu5m7yxm6d4l4fv5as3ofsinrzaqfn56e";
    /// The same CID in base58btc, as js-ipfs renders it by default.
    const V1_B58: &str = "zdj7Wb739eNGt1P9MAGdrpVuqPyuUfUWKvtugpiHN4rYGhhP6";

    #[test]
    fn add_reply_takes_size_as_string_or_number_and_any_base() {
        let kubo = format!("{{\"Name\":\"file\",\"Hash\":\"{V1}\",\"Size\":\"300108\"}}\n");
        let js = format!(
            "{{\"Name\":\"file\",\"Hash\":\"{V1_B58}\",\"Size\":300108,\"Mode\":\"0644\"}}\n"
        );
        for body in [kubo, js] {
            let reply = parse_add_reply(body.as_bytes()).expect("parses");
            assert_eq!(reply.cid.to_string(), V1);
            assert_eq!(reply.size, Some(300_108));
        }
        // Progress lines are skipped; the last Hash wins; a missing Size is None.
        let body = format!("{{\"Name\":\"\",\"Bytes\":262144}}\n{{\"Hash\":\"{V1}\"}}\n\n");
        assert_eq!(parse_add_reply(body.as_bytes()).expect("parses").size, None);
        assert!(parse_add_reply(b"").is_err());
        assert!(parse_add_reply(b"{\"Hash\":\"nope\"}").is_err());
        assert!(parse_add_reply(b"<html>").is_err());
        let err = parse_add_reply(b"{\"Message\":\"disk full\",\"Code\":0,\"Type\":\"error\"}")
            .expect_err("an error");
        assert!(err.contains("disk full"), "{err}");
    }

    #[test]
    fn refs_lines() {
        let ok = format!("{{\"Ref\":\"{V1_B58}\",\"Err\":\"\"}}");
        assert_eq!(
            parse_refs_line(ok.as_bytes()),
            Ok(Ok(Some(Cid::try_from(V1).expect("cid"))))
        );
        assert_eq!(
            parse_refs_line(b"{\"Ref\":\"\",\"Err\":\"Want for x aborted\"}"),
            Ok(Err("Want for x aborted".to_string()))
        );
        assert_eq!(parse_refs_line(b"{\"Ref\":\"\"}"), Ok(Ok(None)));
        assert!(parse_refs_line(b"{\"Ref\":\"zzz\"}").is_err());
        assert!(parse_refs_line(b"42").is_err());
    }

    #[test]
    fn pin_ls_replies() {
        let v1 = Cid::try_from(V1).expect("cid");
        let keys = format!("{{\"Keys\":{{\"{V1_B58}\":{{\"Type\":\"recursive\"}}}}}}");
        assert_eq!(parse_pin_ls(keys.as_bytes()), Ok(vec![v1]));
        let stream = format!("{{\"Cid\":\"{V1}\",\"Type\":\"recursive\"}}\n");
        assert_eq!(parse_pin_ls(stream.as_bytes()), Ok(vec![v1]));
        assert_eq!(parse_pin_ls(b"{\"Keys\":{}}"), Ok(vec![]));
        assert_eq!(parse_pin_ls(b"{\"Keys\":null}"), Ok(vec![]));
        assert!(parse_pin_ls(b"{\"Keys\":{\"nope\":{}}}").is_err());
        assert!(parse_pin_ls(b"{\"Other\":1}").is_err());
    }

    #[test]
    fn node_errors_map_to_variants() {
        let cid = Cid::try_from(V1).expect("cid");
        let e = |status: u16, body: &str| {
            parse_node_error(
                "http://n/api/v0/x",
                StatusCode::from_u16(status).expect("status"),
                body.as_bytes(),
            )
        };
        let js_timeout = e(
            500,
            r#"{"Message":"Failed to cat file: request timed out","Code":0,"Type":"error"}"#,
        );
        assert!(js_timeout.is_absent());
        assert_eq!(
            js_timeout.into_object_error(Some(&cid)),
            ObjectError::NotFound { cid: V1.into() }
        );
        let kubo_offline = e(
            500,
            &format!(
                r#"{{"Message":"block was not found locally (offline): ipld: could not find {V1}","Code":0,"Type":"error"}}"#
            ),
        );
        assert!(kubo_offline.is_absent());
        assert_eq!(cid_in_message(&kubo_offline.message), Some(cid));
        assert_eq!(
            cid_in_message(&format!("Want for {V1_B58} aborted")),
            Some(cid)
        );
        assert!(e(500, r#"{"Message":"path 'x' is not pinned","Code":0}"#).is_absent());
        let client = e(
            400,
            r#"{"Message":"invalid path \"x\"","Code":1,"Type":"error"}"#,
        );
        assert!(matches!(
            client.clone().into_object_error(Some(&cid)),
            ObjectError::BadCid { reason: m } if m.contains("invalid path")
        ));
        assert!(matches!(
            client.into_object_error(None),
            ObjectError::Io { message: m } if m.contains("HTTP 400, code 1: invalid path")
        ));
        let other = e(500, r#"{"Message":"disk full","Code":0}"#);
        assert!(!other.is_absent());
        assert!(matches!(
            other.into_object_error(Some(&cid)),
            ObjectError::Io { message: m } if m == "http://n/api/v0/x: HTTP 500, code 0: disk full"
        ));
        // Not JSON: the text (or the status's reason) is the message.
        assert_eq!(e(502, "bad gateway\n").message, "bad gateway");
        assert_eq!(e(404, "").message, "Not Found");
        assert!(e(404, "").is_absent());
    }

    #[test]
    fn version_reply() {
        assert_eq!(
            parse_version(br#"{"Version":"0.18.1","Commit":"","Repo":"12"}"#),
            Ok("0.18.1".to_string())
        );
        assert!(parse_version(b"<html>").is_err());
    }

    #[test]
    fn unixfs_sizes() {
        // {Type: File, filesize: 300000, blocksizes: [262144, 37856]}
        let data = hanzod_protocol::cid::unixfs_file_data(&[262_144, 37_856]);
        assert_eq!(unixfs_file_size(&data), Ok(300_000));
        // A directory (type 1) is not a file.
        assert!(unixfs_file_size(&[0x08, 0x01]).is_err());
        assert!(unixfs_file_size(&[0x08, 0x02]).is_err());
        assert!(unixfs_file_size(&[0x08]).is_err());
        assert!(unixfs_file_size(&[0x18, 0xff]).is_err());
        // Unknown length-delimited and fixed fields are skipped.
        assert_eq!(
            unixfs_file_size(&[0x12, 0x01, 0xaa, 0x08, 0x02, 0x18, 0x05, 0x2d, 1, 2, 3, 4]),
            Ok(5)
        );
    }

    #[test]
    fn urls() {
        for (given, base) in [
            ("http://127.0.0.1:5001", "http://127.0.0.1:5001/api/v0/"),
            ("http://127.0.0.1:5001/", "http://127.0.0.1:5001/api/v0/"),
            (
                "http://127.0.0.1:5001/api/v0",
                "http://127.0.0.1:5001/api/v0/",
            ),
            (
                "https://ipfs.example/rpc/",
                "https://ipfs.example/rpc/api/v0/",
            ),
        ] {
            assert_eq!(api_base(given).expect(given).as_str(), base);
        }
        for bad in [
            "",
            "127.0.0.1:5001",
            "ftp://x",
            "http://",
            "http://x/?a=b",
            "not a url",
        ] {
            assert!(
                matches!(api_base(bad), Err(ObjectError::Io { message: m }) if m.contains("IPFS_URL")),
                "{bad}"
            );
        }
        let url = Url::parse("https://user:secret@ipfs.example/").expect("url");
        assert_eq!(redacted(&url), "https://ipfs.example/");
        assert_eq!(timeout_arg(Duration::from_millis(1500)), "1500ms");
        assert_eq!(timeout_arg(Duration::ZERO), "1ms");
    }
}
