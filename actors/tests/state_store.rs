//! The [`StateStore`]/[`LeaderLease`] conformance suite on the embedded in-memory store,
//! under paused tokio time (lease expiry costs nothing). The Valkey adapter runs the same
//! suite against a real server in `tests/valkey.rs`.
//!
//! [`StateStore`]: hanzod_actors::ports::StateStore
//! [`LeaderLease`]: hanzod_actors::ports::LeaderLease

use hanzod_actors::ports::conformance;
use hanzod_actors::ports::memory::MemoryStateStore;

#[tokio::test(start_paused = true)]
async fn memory_store_conforms() {
    conformance::state_store(|| async { MemoryStateStore::new() }).await;
}
