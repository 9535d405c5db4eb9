//! The state store adapters: the event log and the leader lease on Valkey (DESIGN §9).
//!
//! [`valkey::ValkeyStateStore`] implements the core's
//! [`StateStore`](hanzod_actors::ports::StateStore) and
//! [`LeaderLease`](hanzod_actors::ports::LeaderLease) ports on one Valkey (or Redis 7.2+)
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
//! | `hanzod:{<ns>}:log` | stream | the event log: one entry per event, entry id `<seq>-0` (the sequence number is the id's millisecond part, so `XRANGE log <n> +` reads from seq `n`); fields `e` = the [`Event`](hanzod_actors::events::Event) as JSON, `at` = its timestamp (ms since the Unix epoch), `tok` = the writer's fencing token (`0`: unfenced), `id` = the append's event id (32 hex digits) |
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

pub mod valkey;

#[cfg(feature = "testkit")]
pub mod server;
