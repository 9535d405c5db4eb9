//! The Valkey adapter of the [`StateStore`] and [`LeaderLease`] ports (DESIGN §9).
//!
//! [`ValkeyStateStore`] implements the core's
//! [`StateStore`] and
//! [`LeaderLease`] ports on one Valkey (or Redis 7.2+)
//! server, with the semantics of the embedded
//! [`MemoryStateStore`](hanzod_actors::ports::memory::MemoryStateStore): the same
//! conformance suite ([`hanzod_actors::ports::conformance::state_store`]) runs against both.
//!
//! # Key layout
//!
//! Every key of one deployment sits under one hash tag, `{<namespace>}` (`[state]
//! namespace`), so all of them live in one hash slot and each Lua script may touch several
//! of them (Valkey Cluster included). `<ns>` below is the namespace.
//!
//! | key | type | holds |
//! |---|---|---|
//! | `hanzod:{<ns>}:log` | stream | the event log: one entry per event, entry id `<seq>-0` (the sequence number is the id's millisecond part, so `XRANGE log <n> +` reads from seq `n`); fields `e` = the [`Event`] as JSON, `at` = its timestamp (ms since the Unix epoch), `tok` = the writer's fencing token (`0`: unfenced), `id` = the append's event id (32 hex digits) |
//! | `hanzod:{<ns>}:seq` | string (integer) | the last sequence number written (absent: 0) |
//! | `hanzod:{<ns>}:eid:<id>` | string (integer) | deduplication: the sequence number event id `<id>` got; expires 1 h after the last append that carried it (`append_once` ids), or twice the retry budget (the adapter's own ids of plain appends) |
//! | `hanzod:{<ns>}:snap:<key>` | hash | the snapshot under `<key>`: fields `seq` (decimal) and `state` (bytes) |
//! | `hanzod:{<ns>}:lease` | hash, with a `PX` time to live | the live leader lease: fields `holder`, `token` (decimal), `endpoint`; absent when nobody leads |
//! | `hanzod:{<ns>}:token` | string (integer) | the last fencing token granted (absent: 0); fenced writes must carry exactly this token |
//! | `hanzod:{<ns>}:log_id` | string (16 bytes) | the log's identity, set once (`SET NX`) |
//!
//! # Atomicity, durability, retries
//!
//! Every state transition (append, snapshot, campaign, renew, resign) is one Lua script,
//! loaded once and called by SHA (`EVALSHA`, reloaded on `NOSCRIPT`, e.g. after a Valkey
//! restart). A fenced write compares its token with the `token` key inside the script, so a
//! lease grant and a fenced write are ordered.
//!
//! An append draws a random 128-bit event id once and retries (jittered exponential
//! backoff, within `[state] retry_budget_ms`) on connection errors and timeouts; the script
//! returns the first sequence number of an id it has already seen, so a retry after a lost
//! reply is recorded once. With `[state] wait_fsync`, every append (and every campaign,
//! which draws a fencing token that must not be handed out twice) is followed by
//! `WAITAOF 1 0 <ms>` on the same connection: it is acknowledged only once Valkey has
//! fsync'd it to its append-only file.
//!
//! Connect with [`ValkeyStateStore::connect`]; clones and [`StateStore::fenced`] handles
//! share one connection pool and one set of health counters ([`ValkeyStateStore::health`]).

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use backon::{BackoffBuilder, ExponentialBuilder};
use deadpool_redis::redis::{
    self, AsyncConnectionConfig, ErrorKind, RedisError, Script, ServerErrorKind, Value,
};
use deadpool_redis::{Manager, Pool, PoolError, Runtime, Timeouts};
use hanzod_actors::events::{Event, Record};
use hanzod_actors::ports::{LeaderLease, Lease, Snapshot, StateStore, StoreError};
use hanzod_actors::types::Timestamp;

use serde::{Deserialize, Serialize};

/// How long the deduplication key of a caller's event id
/// ([`StateStore::append_once`]) lives after the last append that carried it, ms (1 h: a
/// node retries a delta upload within its epoch). An append retried later than this would
/// be recorded twice. The random ids of plain appends, retried only inside the adapter,
/// live twice the retry budget (at least a minute): one key per event for a day would
/// fill a Valkey that must not evict.
pub const EVENT_ID_TTL_MS: u64 = 3_600_000;

/// Records fetched per `XRANGE` by [`StateStore::read_after`].
pub const READ_PAGE: usize = 1000;

/// Why [`ValkeyStateStore::connect`] failed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ValkeyError {
    /// `state.valkey_url` does not parse as a `redis://` / `rediss://` / `unix://` URL.
    #[error("state.valkey_url {url:?} is not a Valkey URL: {reason}")]
    InvalidUrl {
        /// The URL, credentials redacted.
        url: String,
        /// What was wrong.
        reason: String,
    },
    /// `state.namespace` is not 1 to 64 characters of `[A-Za-z0-9._-]`.
    #[error("state.namespace {namespace:?}: 1 to 64 characters of [A-Za-z0-9._-]")]
    InvalidNamespace {
        /// The namespace given.
        namespace: String,
    },
    /// Valkey did not answer within `state.connect_timeout_ms` / `command_timeout_ms`, or
    /// refused the connection.
    #[error("Valkey at {url} is unreachable: {reason}")]
    Unreachable {
        /// The URL, credentials redacted.
        url: String,
        /// The underlying error.
        reason: String,
    },
    /// `state.require_aof` is set and the server runs without an append-only file.
    #[error(
        "Valkey at {url} runs with appendonly no: an acknowledged event would not survive a \
         Valkey restart. Set `appendonly yes` in valkey.conf (or run `CONFIG SET appendonly \
         yes` and `CONFIG REWRITE`), or set `state.require_aof = false` for a throwaway setup"
    )]
    AofDisabled {
        /// The URL, credentials redacted.
        url: String,
    },
    /// `state.wait_fsync` is set and the server has no `WAITAOF` (Redis/Valkey < 7.2).
    #[error(
        "Valkey at {url} ({version}) has no WAITAOF (it needs Valkey or Redis 7.2+): \
         upgrade it, or set `state.wait_fsync = false` (appends are then acknowledged \
         before they are fsync'd unless the server runs `appendfsync always`)"
    )]
    WaitAofUnsupported {
        /// The URL, credentials redacted.
        url: String,
        /// The server's version as `INFO server` reports it.
        version: String,
    },
    /// The server answered a setup command with an error.
    #[error("Valkey at {url} refused {what}: {reason}")]
    Refused {
        /// The URL, credentials redacted.
        url: String,
        /// The command.
        what: &'static str,
        /// The server's error.
        reason: String,
    },
}

pub use hanzod_actors::ports::StoreHealth;

/// State store and leader election settings (`[state]`, DESIGN §9).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateConfig {
    /// Valkey URL (`VALKEY_URL`), e.g. `redis://kv:6379`; empty uses the in-memory store
    /// (one orchestrator, no failover).
    pub valkey_url: String,
    /// Prefix of every key, `[A-Za-z0-9._-]{1,64}`: several deployments can share one
    /// Valkey. Keys are `hanzod:{<namespace>}:…` (one hash slot: the Lua scripts touch
    /// several keys).
    pub namespace: String,
    /// Most pooled connections to Valkey.
    pub pool_size: usize,
    /// Deadline of connecting to Valkey, ms.
    pub connect_timeout_ms: u64,
    /// Deadline of one Valkey command, ms.
    pub command_timeout_ms: u64,
    /// How long an append keeps retrying an unreachable Valkey (jittered exponential
    /// backoff, each retry deduplicated by the event's id) before it reports the store
    /// unavailable, ms.
    pub retry_budget_ms: u64,
    /// Refuse a Valkey without `appendonly yes`: an acknowledged event must survive a
    /// Valkey restart (DESIGN §9). Turn off only for throwaway setups.
    pub require_aof: bool,
    /// After each append, wait until Valkey has fsync'd it (`WAITAOF 1 0`), so an event is
    /// acknowledged only once it is on disk even under `appendfsync everysec`.
    pub wait_fsync: bool,
    /// A snapshot of the log's fold is written every this many events (0: never); whether
    /// one is due is checked every `campaign_ms`.
    pub snapshot_every: u64,
    /// The leader's lease lives this long without renewal, ms: a crashed leader is replaced
    /// after at most this (plus one campaign interval).
    pub lease_ttl_ms: u64,
    /// The leader renews its lease, and standbys campaign, this often, ms (at most half of
    /// `lease_ttl_ms`).
    pub campaign_ms: u64,
    /// This replica's name in the lease (`HANZOD_REPLICA_ID`); empty uses the host name.
    /// A per-process nonce is appended, so a restarted replica is a new lease holder.
    pub replica_id: String,
    /// The gRPC endpoint nodes reach this replica at (`HANZOD_ADVERTISE`), recorded in the
    /// lease; empty derives `http://<host name>:<grpc port>`.
    pub advertise: String,
}

/// The event log and leader lease on Valkey. Cheap to clone; clones share the pool.
///
/// Every method is bounded in time: a command that gets no answer within
/// `state.command_timeout_ms` (a connection not made within `connect_timeout_ms`) fails
/// with [`StoreError::Unavailable`]; only [`StateStore::append`] retries, within
/// `state.retry_budget_ms`.
#[derive(Clone)]
pub struct ValkeyStateStore {
    shared: Arc<Shared>,
    /// The fencing token this handle writes under (`None`: unfenced).
    fence: Option<u64>,
}

struct Shared {
    pool: Pool,
    /// `hanzod:{<ns>}:`
    prefix: String,
    url: String,
    server_version: String,
    /// WAITAOF after appends and campaigns (`wait_fsync` and the server has an AOF).
    wait_fsync: bool,
    command_timeout: Duration,
    /// Backstop deadline of one attempt (pool checkout + every command of it).
    attempt_timeout: Duration,
    retry_budget: Duration,
    scripts: Scripts,
    health: Health,
}

struct Scripts {
    append: Script,
    snapshot: Script,
    campaign: Script,
    renew: Script,
    resign: Script,
}

impl std::fmt::Debug for ValkeyStateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ValkeyStateStore")
            .field("url", &self.shared.url)
            .field("prefix", &self.shared.prefix)
            .field("server", &self.shared.server_version)
            .field("fence", &self.fence)
            .field("wait_fsync", &self.shared.wait_fsync)
            .finish_non_exhaustive()
    }
}

// --- Lua -------------------------------------------------------------------------------
//
// Numbers cross the Lua boundary as decimal strings (`string.format('%d', n)`): Lua's
// `tostring` would print large numbers in exponent notation.

/// Fence check shared by the writing scripts: `ARGV[1]` is the writer's token ('' when
/// unfenced), `token_key` the key of the last token granted.
const FENCE_CHECK: &str = r"
local function fenced(token_key, fence)
  if fence == '' then return nil end
  local cur = redis.call('GET', token_key) or '0'
  if cur ~= fence then return redis.error_reply('FENCED ' .. cur) end
  return nil
end
";

/// KEYS: seq, log, token, eid. ARGV: fence, event JSON, at, event id, eid ttl (ms).
/// Returns the event's sequence number. A known event id returns the sequence number it
/// got (and refreshes the dedup key, a write, so a following WAITAOF covers the original
/// append): a retried append that was written is not fenced by a lease granted since.
const APPEND_LUA: &str = r"
local seen = redis.call('GET', KEYS[4])
if seen then
  redis.call('PEXPIRE', KEYS[4], ARGV[5])
  return tonumber(seen)
end
local refused = fenced(KEYS[3], ARGV[1])
if refused then return refused end
local seq = string.format('%d', redis.call('INCR', KEYS[1]))
local tok = ARGV[1]
if tok == '' then tok = '0' end
redis.call('XADD', KEYS[2], seq .. '-0', 'e', ARGV[2], 'at', ARGV[3], 'tok', tok, 'id', ARGV[4])
redis.call('SET', KEYS[4], seq, 'PX', ARGV[5])
return tonumber(seq)
";

/// KEYS: snap, token. ARGV: fence, seq (decimal), state. Returns 1 when stored, 0 when the
/// stored snapshot is newer (higher seq) and is kept. Sequence numbers are compared as
/// decimal strings (length, then digits), exact for any u64.
const SNAPSHOT_LUA: &str = r"
local refused = fenced(KEYS[2], ARGV[1])
if refused then return refused end
local old = redis.call('HGET', KEYS[1], 'seq')
if old and (#old > #ARGV[2] or (#old == #ARGV[2] and old > ARGV[2])) then return 0 end
redis.call('HSET', KEYS[1], 'seq', ARGV[2], 'state', ARGV[3])
return 1
";

/// KEYS: lease, token. ARGV: holder, endpoint, ttl (ms). Returns {holder, token,
/// endpoint} of the lease held, or nil while another holder's lease is live.
const CAMPAIGN_LUA: &str = r"
local h = redis.call('HMGET', KEYS[1], 'holder', 'token', 'endpoint')
if h[1] then
  if h[1] == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    return {h[1], h[2] or '0', h[3] or ''}
  end
  return false
end
local tok = string.format('%d', redis.call('INCR', KEYS[2]))
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'token', tok, 'endpoint', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {ARGV[1], tok, ARGV[2]}
";

/// KEYS: lease, token. ARGV: holder, token, endpoint, ttl (ms). Returns 1 when renewed.
const RENEW_LUA: &str = r"
if (redis.call('GET', KEYS[2]) or '0') ~= ARGV[2] then return 0 end
local h = redis.call('HMGET', KEYS[1], 'holder', 'token', 'endpoint')
if h[1] then
  if h[1] == ARGV[1] and h[2] == ARGV[2] and h[3] == ARGV[3] then
    redis.call('PEXPIRE', KEYS[1], ARGV[4])
    return 1
  end
  return 0
end
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'token', ARGV[2], 'endpoint', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
";

/// KEYS: lease. ARGV: holder, token, endpoint. Returns 1 when the lease was freed.
const RESIGN_LUA: &str = r"
local h = redis.call('HMGET', KEYS[1], 'holder', 'token', 'endpoint')
if h[1] == ARGV[1] and h[2] == ARGV[2] and h[3] == ARGV[3] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
";

impl Scripts {
    fn new() -> Self {
        let with_fence = |body: &str| Script::new(&format!("{FENCE_CHECK}{body}"));
        Scripts {
            append: with_fence(APPEND_LUA),
            snapshot: with_fence(SNAPSHOT_LUA),
            campaign: Script::new(CAMPAIGN_LUA),
            renew: Script::new(RENEW_LUA),
            resign: Script::new(RESIGN_LUA),
        }
    }

    fn all(&self) -> [&Script; 5] {
        [
            &self.append,
            &self.snapshot,
            &self.campaign,
            &self.renew,
            &self.resign,
        ]
    }
}

// --- health ----------------------------------------------------------------------------

struct Health {
    reachable: AtomicBool,
    errors: AtomicU64,
    retries: AtomicU64,
    last_error: Mutex<Option<String>>,
}

impl Health {
    fn new() -> Self {
        Health {
            reachable: AtomicBool::new(true),
            errors: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            last_error: Mutex::new(None),
        }
    }

    fn snapshot(&self) -> StoreHealth {
        StoreHealth {
            reachable: self.reachable.load(Ordering::SeqCst),
            errors_total: self.errors.load(Ordering::SeqCst),
            retries_total: self.retries.load(Ordering::SeqCst),
            last_error: self
                .last_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        }
    }
}

// --- errors ----------------------------------------------------------------------------

/// The outcome of one failed attempt.
#[derive(Debug)]
enum OpError {
    /// Connection error, timeout, server loading: worth retrying.
    Transient(String),
    /// Final: fenced, corrupt, or an error the server answered.
    Store(StoreError),
}

impl From<StoreError> for OpError {
    fn from(e: StoreError) -> Self {
        OpError::Store(e)
    }
}

fn corrupt(seq: u64, reason: impl Into<String>) -> OpError {
    OpError::Store(StoreError::Corrupt {
        seq,
        reason: reason.into(),
    })
}

fn redis_error(e: RedisError, fence: Option<u64>) -> OpError {
    if e.code() == Some("FENCED") {
        let current = e.detail().and_then(|d| d.trim().parse().ok()).unwrap_or(0);
        return OpError::Store(StoreError::Fenced {
            token: fence.unwrap_or(0),
            current,
        });
    }
    let transient = e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(
            e.kind(),
            ErrorKind::Server(
                ServerErrorKind::BusyLoading
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::ReadOnly
            )
        );
    match e.kind() {
        _ if transient => OpError::Transient(format!("Valkey: {e}")),
        ErrorKind::Parse | ErrorKind::UnexpectedReturnType => {
            corrupt(0, format!("unexpected reply from Valkey: {e}"))
        }
        _ => OpError::Store(StoreError::Unavailable {
            message: format!("Valkey refused: {e}"),
        }),
    }
}

fn pool_error(e: PoolError) -> OpError {
    match e {
        PoolError::Backend(e) => redis_error(e, None),
        PoolError::Timeout(t) => {
            OpError::Transient(format!("Valkey connection pool timed out ({t:?})"))
        }
        PoolError::Closed => OpError::Store(StoreError::Unavailable {
            message: "pool closed".into(),
        }),
        other => OpError::Transient(format!("Valkey connection pool: {other}")),
    }
}

/// `scheme://user:pw@host/…` → `scheme://<redacted>@host/…`.
fn redact(url: &str) -> String {
    if let Some((scheme, rest)) = url.split_once("://") {
        let authority_end = rest.find('/').unwrap_or(rest.len());
        if let Some(at) = rest[..authority_end].rfind('@') {
            return format!("{scheme}://<redacted>@{}", &rest[at + 1..]);
        }
    }
    url.to_string()
}

fn valid_namespace(ns: &str) -> bool {
    !ns.is_empty()
        && ns.len() <= 64
        && ns
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// `field:value` from an `INFO` reply.
fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|l| {
        l.strip_prefix(field)
            .and_then(|r| r.strip_prefix(':'))
            .map(str::trim)
    })
}

fn bytes_of(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

fn u64_of(v: &Value) -> Option<u64> {
    match v {
        Value::Int(i) => u64::try_from(*i).ok(),
        other => std::str::from_utf8(bytes_of(other)?).ok()?.parse().ok(),
    }
}

fn string_of(v: &Value) -> Option<String> {
    String::from_utf8(bytes_of(v)?.to_vec()).ok()
}

/// One `XRANGE` entry → a record.
fn decode_entry(entry: &Value) -> Result<Record, OpError> {
    let Value::Array(parts) = entry else {
        return Err(corrupt(
            0,
            format!("stream entry is not an array: {entry:?}"),
        ));
    };
    let [id, fields] = parts.as_slice() else {
        return Err(corrupt(0, "stream entry is not [id, fields]"));
    };
    let id = bytes_of(id)
        .and_then(|b| std::str::from_utf8(b).ok())
        .ok_or_else(|| corrupt(0, "stream entry id is not a string"))?;
    let seq: u64 = id
        .split_once('-')
        .and_then(|(ms, _)| ms.parse().ok())
        .ok_or_else(|| corrupt(0, format!("stream entry id {id:?} is not <seq>-0")))?;
    let Value::Array(fields) = fields else {
        return Err(corrupt(seq, "stream entry fields are not an array"));
    };
    let mut event = None;
    let mut at = None;
    for kv in fields.chunks(2) {
        let [k, v] = kv else {
            return Err(corrupt(seq, "odd number of stream fields"));
        };
        match bytes_of(k) {
            Some(b"e") => event = bytes_of(v),
            Some(b"at") => at = Some(v),
            _ => {}
        }
    }
    let event = event.ok_or_else(|| corrupt(seq, "no field `e` (the event)"))?;
    let event: Event = serde_json::from_slice(event)
        .map_err(|e| corrupt(seq, format!("the event does not decode: {e}")))?;
    let at = at
        .and_then(u64_of)
        .ok_or_else(|| corrupt(seq, "no field `at` (ms) or not a number"))?;
    Ok(Record {
        seq,
        at: Timestamp(at),
        event,
    })
}

// --- the adapter -------------------------------------------------------------------------

type Conn = deadpool_redis::Connection;

impl ValkeyStateStore {
    /// Connects to `cfg.valkey_url` and checks the server: it answers `PING`, runs with
    /// `appendonly yes` when `cfg.require_aof`, and has `WAITAOF` when `cfg.wait_fsync`
    /// (with `require_aof = false` and no append-only file, `WAITAOF` is skipped, with a
    /// warning). Loads the Lua scripts.
    ///
    /// Uses `valkey_url`, `namespace`, `pool_size` (connections), `connect_timeout_ms`,
    /// `command_timeout_ms`, `retry_budget_ms`, `require_aof` and `wait_fsync`.
    ///
    /// Errors: [`ValkeyError::InvalidUrl`], [`ValkeyError::InvalidNamespace`],
    /// [`ValkeyError::Unreachable`] (no answer within the timeouts),
    /// [`ValkeyError::AofDisabled`], [`ValkeyError::WaitAofUnsupported`],
    /// [`ValkeyError::Refused`].
    pub async fn connect(cfg: &StateConfig) -> Result<ValkeyStateStore, ValkeyError> {
        let url = redact(&cfg.valkey_url);
        if !valid_namespace(&cfg.namespace) {
            return Err(ValkeyError::InvalidNamespace {
                namespace: cfg.namespace.clone(),
            });
        }
        let connect_timeout = Duration::from_millis(cfg.connect_timeout_ms.max(1));
        let command_timeout = Duration::from_millis(cfg.command_timeout_ms.max(1));
        let conn_cfg = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(command_timeout));
        let manager = Manager::new_with_config(cfg.valkey_url.as_str(), conn_cfg).map_err(|e| {
            ValkeyError::InvalidUrl {
                url: url.clone(),
                reason: e.to_string(),
            }
        })?;
        let pool = Pool::builder(manager)
            .max_size(cfg.pool_size.max(1))
            .runtime(Runtime::Tokio1)
            .timeouts(Timeouts {
                wait: Some(connect_timeout + command_timeout),
                create: Some(connect_timeout),
                recycle: Some(command_timeout),
            })
            .build()
            .map_err(|e| ValkeyError::InvalidUrl {
                url: url.clone(),
                reason: e.to_string(),
            })?;

        let unreachable = |reason: String| ValkeyError::Unreachable {
            url: url.clone(),
            reason,
        };
        let refused = |what: &'static str, e: RedisError| ValkeyError::Refused {
            url: url.clone(),
            what,
            reason: e.to_string(),
        };
        let setup = async {
            let mut c = pool.get().await.map_err(|e| unreachable(e.to_string()))?;
            let mut query = async |cmd: &redis::Cmd, what: &'static str| {
                cmd.query_async::<Value>(&mut c).await.map_err(|e| {
                    if matches!(redis_error(e.clone(), None), OpError::Transient(_)) {
                        unreachable(e.to_string())
                    } else {
                        refused(what, e)
                    }
                })
            };
            query(&redis::cmd("PING"), "PING").await?;
            let info_text = |v: Value| match v {
                Value::VerbatimString { text, .. } => text,
                other => bytes_of(&other)
                    .map(|b| String::from_utf8_lossy(b).into_owned())
                    .unwrap_or_default(),
            };
            let server = info_text(query(redis::cmd("INFO").arg("server"), "INFO server").await?);
            let version = match (
                info_field(&server, "valkey_version"),
                info_field(&server, "redis_version"),
            ) {
                (Some(v), _) => format!("valkey {v}"),
                (None, Some(v)) => format!("redis {v}"),
                _ => "unknown version".to_string(),
            };
            let persistence =
                info_text(query(redis::cmd("INFO").arg("persistence"), "INFO persistence").await?);
            let aof = info_field(&persistence, "aof_enabled") == Some("1");
            let has_waitaof = if cfg.wait_fsync && aof {
                // [nil] for a command the server does not know.
                let v = query(
                    redis::cmd("COMMAND").arg("INFO").arg("WAITAOF"),
                    "COMMAND INFO",
                )
                .await?;
                matches!(&v, Value::Array(a) if a.first().is_some_and(|x| *x != Value::Nil))
            } else {
                false
            };
            let scripts = Scripts::new();
            for s in scripts.all() {
                s.load_async(&mut c)
                    .await
                    .map_err(|e| refused("SCRIPT LOAD", e))?;
            }
            Ok::<_, ValkeyError>((version, aof, has_waitaof, scripts))
        };
        let limit = connect_timeout + command_timeout * 8;
        let (version, aof, has_waitaof, scripts) = tokio::time::timeout(limit, setup)
            .await
            .map_err(|_| unreachable(format!("no answer within {} ms", limit.as_millis())))??;

        if cfg.require_aof && !aof {
            return Err(ValkeyError::AofDisabled { url });
        }
        if !aof {
            tracing::warn!(
                url,
                "Valkey runs with appendonly no (state.require_aof = false): acknowledged \
                 events are lost if Valkey restarts"
            );
        }
        if cfg.wait_fsync && aof && !has_waitaof {
            return Err(ValkeyError::WaitAofUnsupported { url, version });
        }
        let wait_fsync = cfg.wait_fsync && aof;
        tracing::info!(
            url,
            server = version,
            namespace = cfg.namespace,
            aof,
            wait_fsync,
            pool_size = cfg.pool_size,
            "connected to Valkey"
        );
        Ok(ValkeyStateStore {
            shared: Arc::new(Shared {
                pool,
                prefix: format!("hanzod:{{{}}}:", cfg.namespace),
                url,
                server_version: version,
                wait_fsync,
                command_timeout,
                attempt_timeout: connect_timeout + command_timeout * 4,
                retry_budget: Duration::from_millis(cfg.retry_budget_ms),
                scripts,
                health: Health::new(),
            }),
            fence: None,
        })
    }

    /// The counters of this store's connection to Valkey (shared by every clone and fenced
    /// handle).
    pub fn health(&self) -> StoreHealth {
        self.shared.health.snapshot()
    }

    /// The server's name and version, as `INFO server` reported it at connect, e.g.
    /// `valkey 9.1.2`.
    pub fn server_version(&self) -> &str {
        &self.shared.server_version
    }

    /// Whether appends wait for `WAITAOF` (`state.wait_fsync` and the server has an
    /// append-only file).
    pub fn waits_for_fsync(&self) -> bool {
        self.shared.wait_fsync
    }

    /// A handle to the same log whose writes carry the fencing `token`, as the concrete
    /// type ([`StateStore::fenced`] returns it boxed). Shares the pool and health counters.
    pub fn fenced_handle(&self, token: u64) -> ValkeyStateStore {
        ValkeyStateStore {
            shared: self.shared.clone(),
            fence: Some(token),
        }
    }

    /// The key prefix of this store, `hanzod:{<namespace>}:`.
    pub fn key_prefix(&self) -> &str {
        &self.shared.prefix
    }

    fn key(&self, suffix: &str) -> String {
        format!("{}{suffix}", self.shared.prefix)
    }

    fn fence_arg(&self) -> String {
        self.fence.map(|t| t.to_string()).unwrap_or_default()
    }

    async fn conn(&self) -> Result<Conn, OpError> {
        self.shared.pool.get().await.map_err(pool_error)
    }

    /// Runs one attempt under the attempt deadline and books its outcome in the health
    /// counters (logging an outage once when it starts and once when it ends).
    async fn guard<T>(
        &self,
        attempt: impl Future<Output = Result<T, OpError>>,
    ) -> Result<T, OpError> {
        let limit = self.shared.attempt_timeout;
        let out = match tokio::time::timeout(limit, attempt).await {
            Ok(out) => out,
            Err(_) => Err(OpError::Transient(format!(
                "Valkey did not answer within {} ms",
                limit.as_millis()
            ))),
        };
        let h = &self.shared.health;
        let failure = match &out {
            Ok(_) | Err(OpError::Store(StoreError::Fenced { .. } | StoreError::Corrupt { .. })) => {
                None
            }
            Err(OpError::Transient(m)) => Some((m.clone(), false)),
            Err(OpError::Store(e)) => Some((e.to_string(), true)),
        };
        match failure {
            None => {
                if !h.reachable.swap(true, Ordering::SeqCst) {
                    tracing::info!(url = self.shared.url, "Valkey is reachable again");
                }
            }
            Some((msg, answered)) => {
                h.errors.fetch_add(1, Ordering::SeqCst);
                *h.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(msg.clone());
                if !answered && h.reachable.swap(false, Ordering::SeqCst) {
                    tracing::warn!(
                        url = self.shared.url,
                        error = msg,
                        "Valkey is unreachable: state store calls fail (appends retry for up \
                         to {} ms)",
                        self.shared.retry_budget.as_millis()
                    );
                } else if answered {
                    h.reachable.store(true, Ordering::SeqCst);
                }
            }
        }
        out
    }

    /// One call of a non-retried operation: an attempt under [`Self::guard`], its transient
    /// failure reported as [`StoreError::Unavailable`].
    async fn once<T>(
        &self,
        attempt: impl Future<Output = Result<T, OpError>>,
    ) -> Result<T, StoreError> {
        match self.guard(attempt).await {
            Ok(v) => Ok(v),
            Err(OpError::Transient(m)) => Err(StoreError::Unavailable { message: m }),
            Err(OpError::Store(e)) => Err(e),
        }
    }

    /// `WAITAOF 1 0 <ms>` on `c` (the connection of the write it follows): `Ok` once the
    /// local AOF has fsync'd every write this connection made.
    async fn wait_fsync(&self, c: &mut Conn) -> Result<(), OpError> {
        if !self.shared.wait_fsync {
            return Ok(());
        }
        // The server gives up a little before the client does, so a slow fsync answers
        // "not yet" rather than timing the connection out. Never 0 (= wait forever).
        let ms = (self.shared.command_timeout.as_millis() as u64 * 3 / 4).max(1);
        let (local, _replicas): (i64, i64) = redis::cmd("WAITAOF")
            .arg(1)
            .arg(0)
            .arg(ms)
            .query_async(c)
            .await
            .map_err(|e| redis_error(e, self.fence))?;
        if local < 1 {
            return Err(OpError::Transient(format!(
                "not durable: Valkey did not fsync the write within {ms} ms (WAITAOF)"
            )));
        }
        Ok(())
    }

    /// Appends `event` under the event id `id`, retrying like [`StateStore::append`]. An id
    /// that was already appended (within [`EVENT_ID_TTL_MS`]) is not appended again: the
    /// sequence number it got is returned (even if a newer fencing token was granted since:
    /// the event was written under a valid one). For tests of the deduplication.
    ///
    /// Errors: as [`StateStore::append`]: [`StoreError::Unavailable`] once
    /// `state.retry_budget_ms` is spent (or the server refused the script),
    /// [`StoreError::Fenced`], [`StoreError::Corrupt`] (an event that does not serialize).
    #[doc(hidden)]
    pub async fn append_with_id(
        &self,
        id: u128,
        at: Timestamp,
        event: &Event,
    ) -> Result<u64, StoreError> {
        self.append_for(id, at, event, EVENT_ID_TTL_MS).await
    }

    /// [`ValkeyStateStore::append_with_id`], remembering `id` for `ttl_ms`.
    async fn append_for(
        &self,
        id: u128,
        at: Timestamp,
        event: &Event,
        ttl_ms: u64,
    ) -> Result<u64, StoreError> {
        let json = serde_json::to_string(event).map_err(|e| StoreError::Corrupt {
            seq: 0,
            reason: format!("the event does not serialize: {e}"),
        })?;
        let id = format!("{id:032x}");
        let keys = [
            self.key("seq"),
            self.key("log"),
            self.key("token"),
            self.key(&format!("eid:{id}")),
        ];
        let fence = self.fence_arg();
        let attempt = || async {
            let mut c = self.conn().await?;
            let seq: u64 = self
                .shared
                .scripts
                .append
                .key(&keys[0])
                .key(&keys[1])
                .key(&keys[2])
                .key(&keys[3])
                .arg(&fence)
                .arg(&json)
                .arg(at.0)
                .arg(&id)
                .arg(ttl_ms)
                .invoke_async(&mut c)
                .await
                .map_err(|e| redis_error(e, self.fence))?;
            self.wait_fsync(&mut c).await?;
            Ok(seq)
        };

        let budget = self.shared.retry_budget;
        let deadline = tokio::time::Instant::now() + budget;
        let mut backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(20))
            .with_max_delay(Duration::from_secs(1))
            .with_factor(2.0)
            .with_jitter()
            .without_max_times()
            .build();
        loop {
            match self.guard(attempt()).await {
                Ok(seq) => return Ok(seq),
                Err(OpError::Store(e)) => return Err(e),
                Err(OpError::Transient(msg)) => {
                    let now = tokio::time::Instant::now();
                    if now >= deadline {
                        return Err(StoreError::Unavailable {
                            message: format!(
                                "{msg} (gave up after retrying for {} ms)",
                                budget.as_millis()
                            ),
                        });
                    }
                    let delay = backoff
                        .next()
                        .unwrap_or(Duration::from_secs(1))
                        .min(deadline - now);
                    self.shared.health.retries.fetch_add(1, Ordering::SeqCst);
                    tracing::debug!(error = msg, ?delay, "retrying a Valkey append");
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    fn lease_reply(v: Value) -> Result<Option<Lease>, OpError> {
        match v {
            Value::Nil => Ok(None),
            Value::Array(parts) => match parts.as_slice() {
                [holder, token, endpoint] => {
                    let bad = |what: &str| corrupt(0, format!("lease {what} is malformed"));
                    Ok(Some(Lease {
                        holder: string_of(holder).ok_or_else(|| bad("holder"))?,
                        token: u64_of(token).ok_or_else(|| bad("token"))?,
                        endpoint: string_of(endpoint).ok_or_else(|| bad("endpoint"))?,
                    }))
                }
                _ => Err(corrupt(0, "lease reply is not [holder, token, endpoint]")),
            },
            other => Err(corrupt(0, format!("unexpected lease reply {other:?}"))),
        }
    }
}

#[async_trait]
impl StateStore for ValkeyStateStore {
    /// Appends under a fresh random event id, retrying connection errors and timeouts
    /// within `state.retry_budget_ms` (each retry deduplicated by the id); with
    /// `state.wait_fsync`, returns once Valkey has fsync'd the event.
    async fn append(&self, at: Timestamp, event: Event) -> Result<u64, StoreError> {
        let ttl = (2 * self.shared.retry_budget.as_millis() as u64).max(60_000);
        self.append_for(rand::random(), at, &event, ttl).await
    }

    async fn append_once(&self, id: u128, at: Timestamp, event: Event) -> Result<u64, StoreError> {
        self.append_with_id(id, at, &event).await
    }

    async fn read_after(&self, after: u64) -> Result<Vec<Record>, StoreError> {
        let key = self.key("log");
        let mut out = Vec::new();
        let Some(mut next) = after.checked_add(1) else {
            return Ok(out);
        };
        loop {
            let page = self
                .once(async {
                    let mut c = self.conn().await?;
                    let v: Value = redis::cmd("XRANGE")
                        .arg(&key)
                        .arg(next)
                        .arg("+")
                        .arg("COUNT")
                        .arg(READ_PAGE)
                        .query_async(&mut c)
                        .await
                        .map_err(|e| redis_error(e, None))?;
                    let Value::Array(entries) = v else {
                        return Err(corrupt(next, format!("XRANGE replied {v:?}")));
                    };
                    entries
                        .iter()
                        .map(decode_entry)
                        .collect::<Result<Vec<_>, _>>()
                })
                .await?;
            let full = page.len() == READ_PAGE;
            for r in page {
                if r.seq != next {
                    return Err(StoreError::Corrupt {
                        seq: r.seq,
                        reason: format!("gap in the log: expected seq {next}"),
                    });
                }
                next += 1;
                out.push(r);
            }
            if !full {
                return Ok(out);
            }
        }
    }

    async fn last_seq(&self) -> Result<u64, StoreError> {
        let key = self.key("seq");
        self.once(async {
            let mut c = self.conn().await?;
            let v: Option<Vec<u8>> = redis::cmd("GET")
                .arg(&key)
                .query_async(&mut c)
                .await
                .map_err(|e| redis_error(e, None))?;
            match v {
                None => Ok(0),
                Some(b) => std::str::from_utf8(&b)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| corrupt(0, format!("{key} is not a number"))),
            }
        })
        .await
    }

    async fn put_snapshot(&self, key: &str, snapshot: Snapshot) -> Result<(), StoreError> {
        let snap_key = self.key(&format!("snap:{key}"));
        let token_key = self.key("token");
        let fence = self.fence_arg();
        self.once(async {
            let mut c = self.conn().await?;
            let _stored: i64 = self
                .shared
                .scripts
                .snapshot
                .key(&snap_key)
                .key(&token_key)
                .arg(&fence)
                .arg(snapshot.seq)
                .arg(snapshot.state.as_slice())
                .invoke_async(&mut c)
                .await
                .map_err(|e| redis_error(e, self.fence))?;
            Ok(())
        })
        .await
    }

    async fn get_snapshot(&self, key: &str) -> Result<Option<Snapshot>, StoreError> {
        let snap_key = self.key(&format!("snap:{key}"));
        self.once(async {
            let mut c = self.conn().await?;
            let (seq, state): (Option<Vec<u8>>, Option<Vec<u8>>) = redis::cmd("HMGET")
                .arg(&snap_key)
                .arg("seq")
                .arg("state")
                .query_async(&mut c)
                .await
                .map_err(|e| redis_error(e, None))?;
            let Some(seq) = seq else { return Ok(None) };
            let seq = std::str::from_utf8(&seq)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| corrupt(0, format!("snapshot {snap_key}: seq is not a number")))?;
            let state =
                state.ok_or_else(|| corrupt(seq, format!("snapshot {snap_key} has no state")))?;
            Ok(Some(Snapshot { seq, state }))
        })
        .await
    }

    async fn log_id(&self) -> Result<[u8; 16], StoreError> {
        let key = self.key("log_id");
        self.once(async {
            let mut c = self.conn().await?;
            let fresh: [u8; 16] = rand::random();
            // SET NX GET: the id already there, or nil when ours was just set.
            let old: Option<Vec<u8>> = redis::cmd("SET")
                .arg(&key)
                .arg(&fresh[..])
                .arg("NX")
                .arg("GET")
                .query_async(&mut c)
                .await
                .map_err(|e| redis_error(e, None))?;
            match old {
                None => Ok(fresh),
                Some(b) => b
                    .as_slice()
                    .try_into()
                    .map_err(|_| corrupt(0, format!("{key} is {} bytes, not 16", b.len()))),
            }
        })
        .await
    }

    fn fenced(&self, token: u64) -> Arc<dyn StateStore> {
        Arc::new(self.fenced_handle(token))
    }
}

#[async_trait]
impl LeaderLease for ValkeyStateStore {
    /// With `state.wait_fsync`, a won lease is returned once its fencing token is fsync'd
    /// (a token must never be granted twice, even across a Valkey crash).
    async fn campaign(
        &self,
        holder: &str,
        endpoint: &str,
        ttl_ms: u64,
    ) -> Result<Option<Lease>, StoreError> {
        let (lease_key, token_key) = (self.key("lease"), self.key("token"));
        self.once(async {
            let mut c = self.conn().await?;
            let v: Value = self
                .shared
                .scripts
                .campaign
                .key(&lease_key)
                .key(&token_key)
                .arg(holder)
                .arg(endpoint)
                .arg(ttl_ms)
                .invoke_async(&mut c)
                .await
                .map_err(|e| redis_error(e, None))?;
            let lease = Self::lease_reply(v)?;
            if lease.is_some() {
                self.wait_fsync(&mut c).await?;
            }
            Ok(lease)
        })
        .await
    }

    async fn renew(&self, lease: &Lease, ttl_ms: u64) -> Result<bool, StoreError> {
        let (lease_key, token_key) = (self.key("lease"), self.key("token"));
        self.once(async {
            let mut c = self.conn().await?;
            let renewed: i64 = self
                .shared
                .scripts
                .renew
                .key(&lease_key)
                .key(&token_key)
                .arg(&lease.holder)
                .arg(lease.token)
                .arg(&lease.endpoint)
                .arg(ttl_ms)
                .invoke_async(&mut c)
                .await
                .map_err(|e| redis_error(e, None))?;
            Ok(renewed == 1)
        })
        .await
    }

    async fn resign(&self, lease: &Lease) -> Result<(), StoreError> {
        let lease_key = self.key("lease");
        self.once(async {
            let mut c = self.conn().await?;
            let _freed: i64 = self
                .shared
                .scripts
                .resign
                .key(&lease_key)
                .arg(&lease.holder)
                .arg(lease.token)
                .arg(&lease.endpoint)
                .invoke_async(&mut c)
                .await
                .map_err(|e| redis_error(e, None))?;
            Ok(())
        })
        .await
    }

    async fn leader(&self) -> Result<Option<Lease>, StoreError> {
        let lease_key = self.key("lease");
        self.once(async {
            let mut c = self.conn().await?;
            let v: Vec<Value> = redis::cmd("HMGET")
                .arg(&lease_key)
                .arg("holder")
                .arg("token")
                .arg("endpoint")
                .query_async(&mut c)
                .await
                .map_err(|e| redis_error(e, None))?;
            if v.first().is_none_or(|h| *h == Value::Nil) {
                return Ok(None);
            }
            Self::lease_reply(Value::Array(v))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_credentials() {
        assert_eq!(
            redact("redis://u:pw@kv:6379/0"),
            "redis://<redacted>@kv:6379/0"
        );
        assert_eq!(redact("redis://kv:6379"), "redis://kv:6379");
    }

    #[test]
    fn namespaces() {
        assert!(valid_namespace("hanzod"));
        assert!(valid_namespace("a.b_c-9"));
        assert!(!valid_namespace(""));
        assert!(!valid_namespace("a}b"));
        assert!(!valid_namespace(&"x".repeat(65)));
    }

    #[test]
    fn info_fields() {
        let info = "# Persistence\r\nloading:0\r\naof_enabled:1\r\naof_rewrite_in_progress:0\r\n";
        assert_eq!(info_field(info, "aof_enabled"), Some("1"));
        assert_eq!(info_field(info, "aof"), None);
    }

    #[test]
    fn decodes_entries_and_reports_corruption() {
        let entry = |id: &str, e: &[u8], at: &[u8]| {
            Value::Array(vec![
                Value::BulkString(id.into()),
                Value::Array(vec![
                    Value::BulkString(b"e".to_vec()),
                    Value::BulkString(e.to_vec()),
                    Value::BulkString(b"at".to_vec()),
                    Value::BulkString(at.to_vec()),
                ]),
            ])
        };
        let ev = Event::NodeFailed {
            node: hanzod_actors::types::NodeId([1; 32]),
            kind: hanzod_actors::events::FailureKind::SessionClosed,
        };
        let json = serde_json::to_vec(&ev).unwrap();
        let r = decode_entry(&entry("7-0", &json, b"42")).unwrap();
        assert_eq!((r.seq, r.at, r.event), (7, Timestamp(42), ev));
        match decode_entry(&entry("8-0", b"{not json", b"1")) {
            Err(OpError::Store(StoreError::Corrupt { seq: 8, .. })) => {}
            other => panic!("want Corrupt at 8, got {other:?}"),
        }
        match decode_entry(&entry("9-0", &json, b"x")) {
            Err(OpError::Store(StoreError::Corrupt { seq: 9, .. })) => {}
            other => panic!("want Corrupt at 9, got {other:?}"),
        }
    }
}
