//! The [`Ledger`] conformance suite (`hanzod_actors::ports::ledger_conformance`) on the
//! embedded `MemoryChain`, and checks of what only the embedded ledger has (genesis
//! stakes, overflow, concurrency). `tests/chain.rs` runs the same suite on a real EVM node.
//!
//! The fixture: a ledger whose clock reads [`NOW`], with a penalty window of
//! [`WINDOW_MS`], where [`staked`] nodes are bound with [`STAKE`] and every other node is
//! unbound.

use std::sync::Arc;

use hanzod_actors::ports::ledger_conformance::*;
use hanzod_actors::ports::memory::{MemoryChain, DEFAULT_PENALTY_WINDOW_MS};
use hanzod_actors::ports::{ChainError, ChainReader, Clock, Ledger, LedgerError};
use hanzod_actors::types::{GymWei, JobId, Timestamp};

/// The fixture's penalty window: 1 h.
const WINDOW_MS: u64 = 3_600_000;

/// A clock that stands still.
#[derive(Debug)]
struct FixedClock(Timestamp);

impl Clock for FixedClock {
    fn now(&self) -> Timestamp {
        self.0
    }
}

fn memory_chain() -> MemoryChain {
    let chain = MemoryChain::new()
        .with_clock(Arc::new(FixedClock(NOW)))
        .with_penalty_window_ms(WINDOW_MS);
    for i in 1..=4 {
        chain.set_stake(staked(i), STAKE);
    }
    chain
}

// ---- run against MemoryChain ----

#[tokio::test]
async fn memory_rewards_are_credited() {
    rewards_are_credited(&memory_chain()).await;
}

#[tokio::test]
async fn memory_same_epoch_pays_once() {
    same_epoch_pays_once(&memory_chain()).await;
}

#[tokio::test]
async fn memory_other_epochs_and_jobs_pay() {
    other_epochs_and_jobs_pay(&memory_chain()).await;
}

#[tokio::test]
async fn memory_batch_with_unbound_node_pays_nothing() {
    batch_with_unbound_node_pays_nothing(&memory_chain()).await;
}

#[tokio::test]
async fn memory_slash_reduces_stake_and_sets_penalty() {
    slash_reduces_stake_and_sets_penalty(&memory_chain(), NOW, WINDOW_MS).await;
}

#[tokio::test]
async fn memory_slash_rounds_down() {
    slash_rounds_down(&memory_chain()).await;
}

#[tokio::test]
async fn memory_same_evidence_slashes_once() {
    same_evidence_slashes_once(&memory_chain()).await;
}

#[tokio::test]
async fn memory_bad_pct_is_refused() {
    bad_pct_is_refused(&memory_chain()).await;
}

#[tokio::test]
async fn memory_empty_evidence_is_refused() {
    empty_evidence_is_refused(&memory_chain()).await;
}

#[tokio::test]
async fn memory_unbound_slash_is_refused() {
    unbound_slash_is_refused(&memory_chain()).await;
}

#[tokio::test]
async fn memory_history_is_listed_in_order() {
    history_is_listed_in_order(&memory_chain()).await;
}

// ---- MemoryChain specifics ----

#[tokio::test]
async fn memory_default_stake_node_gets_explicit_reduced_entry() {
    let chain = MemoryChain::with_default_stake(GymWei(1_000))
        .with_clock(Arc::new(FixedClock(NOW)))
        .with_penalty_window_ms(WINDOW_MS);
    let a = staked(9);
    let r = chain.slash(&a, 25, b"e").await.expect("slash");
    assert_eq!((r.slashed, r.stake_after), (GymWei(250), GymWei(750)));
    assert_eq!(chain.stake_of(&a).await, Ok(GymWei(750)));
    // Others keep the default.
    assert_eq!(chain.stake_of(&staked(10)).await, Ok(GymWei(1_000)));
    // Default-staked nodes are bound: they can be paid.
    let p = chain
        .distribute_epoch_rewards(JobId(1), 0, &[(staked(10), GymWei(5))])
        .await
        .expect("pay");
    assert_eq!(p.total, GymWei(5));
}

#[tokio::test]
async fn memory_defaults_and_existing_api() {
    let chain = MemoryChain::new();
    assert_eq!(chain.penalty_window_ms(), DEFAULT_PENALTY_WINDOW_MS);
    assert_eq!(DEFAULT_PENALTY_WINDOW_MS, 86_400_000);
    let a = staked(1);
    assert_eq!(chain.stake_of(&a).await, Err(ChainError::Unbound(a)));
    chain.set_stake(a, GymWei(100));
    chain.set_penalty(a, Some(Timestamp(5)));
    assert_eq!(chain.penalty_until(&a).await, Ok(Some(Timestamp(5))));
    chain.set_penalty(a, None);
    // With the system clock, the penalty ends about a day from now.
    let r = chain.slash(&a, 1, b"e").await.expect("slash");
    let now = hanzod_actors::ports::SystemClock.now();
    assert!(r.penalty_until.0 > now.0 + DEFAULT_PENALTY_WINDOW_MS - 60_000);
    assert!(r.penalty_until.0 <= now.0 + DEFAULT_PENALTY_WINDOW_MS);
}

#[tokio::test]
async fn memory_slash_keeps_a_later_penalty() {
    let chain = memory_chain();
    let a = staked(1);
    let later = NOW.plus_ms(10 * WINDOW_MS);
    chain.set_penalty(a, Some(later));
    let r = chain.slash(&a, 10, b"e").await.expect("slash");
    assert_eq!(r.penalty_until, later);
    assert_eq!(chain.penalty_until(&a).await, Ok(Some(later)));
}

#[tokio::test]
async fn memory_overflowing_batch_is_refused() {
    let chain = memory_chain();
    let a = staked(1);
    let e = chain
        .distribute_epoch_rewards(JobId(1), 0, &[(a, GymWei(u128::MAX)), (a, GymWei(1))])
        .await;
    assert!(matches!(e, Err(LedgerError::Invalid(_))), "{e:?}");
    assert_eq!(chain.balance_of(&a).await, Ok(GymWei(0)));
    assert_eq!(chain.reward_batches().await, Ok(vec![]));
}

#[tokio::test]
async fn memory_concurrent_distribution_pays_once() {
    let chain = Arc::new(memory_chain());
    let a = staked(1);
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let c = Arc::clone(&chain);
        tasks.push(tokio::spawn(async move {
            c.distribute_epoch_rewards(JobId(3), 4, &[(a, GymWei(100))])
                .await
        }));
    }
    let mut fresh = 0;
    for t in tasks {
        let r = t.await.expect("join").expect("distribute");
        if !r.duplicate {
            fresh += 1;
        }
    }
    assert_eq!(fresh, 1);
    assert_eq!(chain.balance_of(&a).await, Ok(GymWei(100)));
}

#[tokio::test]
async fn memory_publication_is_recorded_once_per_epoch() {
    publication_is_recorded_once_per_epoch(&memory_chain()).await;
}
