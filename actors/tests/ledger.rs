//! Conformance suite for the [`Ledger`] port (DESIGN §8, paper §8 "Reward Distribution" and
//! "Slashing"). Each check is generic over `L: Ledger`, so a chain adapter (an EVM node
//! under anvil) runs the same suite; here it runs against the embedded `MemoryChain`.
//!
//! A fixture provides: a ledger whose clock reads [`NOW`], with a penalty window of
//! [`WINDOW_MS`], where [`staked`] nodes are bound with [`STAKE`] and every other node is
//! unbound.

use std::sync::Arc;

use hanzod_actors::ports::memory::{MemoryChain, DEFAULT_PENALTY_WINDOW_MS};
use hanzod_actors::ports::{ChainError, ChainReader, Clock, Ledger, LedgerError};
use hanzod_actors::publication::{PublicationRecord, SignedPublication};
use hanzod_actors::types::{GymWei, JobId, NodeId, Timestamp};

/// The fixture clock's time.
const NOW: Timestamp = Timestamp(1_700_000_000_000);
/// The fixture's penalty window: 1 h.
const WINDOW_MS: u64 = 3_600_000;
/// Each staked node's stake.
const STAKE: GymWei = GymWei::gym(10_000);

/// A clock that stands still.
#[derive(Debug)]
struct FixedClock(Timestamp);

impl Clock for FixedClock {
    fn now(&self) -> Timestamp {
        self.0
    }
}

fn staked(i: u8) -> NodeId {
    NodeId([i; 32])
}

fn unbound() -> NodeId {
    NodeId([0xee; 32])
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

// ---- the suite, generic over the port ----

async fn rewards_are_credited<L: Ledger>(l: &L) {
    let (a, b) = (staked(1), staked(2));
    let r = l
        .distribute_epoch_rewards(JobId(1), 0, &[(a, GymWei(700)), (b, GymWei(300))])
        .await
        .expect("distribute");
    assert!(!r.duplicate);
    assert_eq!((r.job, r.epoch, r.total), (JobId(1), 0, GymWei(1000)));
    assert_eq!(r.paid, vec![(a, GymWei(700)), (b, GymWei(300))]);
    assert_eq!(l.balance_of(&a).await, Ok(GymWei(700)));
    assert_eq!(l.balance_of(&b).await, Ok(GymWei(300)));
    assert_eq!(l.balance_of(&staked(3)).await, Ok(GymWei(0)));
}

async fn same_epoch_pays_once<L: Ledger>(l: &L) {
    let a = staked(1);
    let first = l
        .distribute_epoch_rewards(JobId(1), 0, &[(a, GymWei(500))])
        .await
        .expect("first");
    // A repeat, even with other amounts, pays nothing and returns the first receipt.
    let again = l
        .distribute_epoch_rewards(JobId(1), 0, &[(a, GymWei(9_999))])
        .await
        .expect("repeat");
    assert!(again.duplicate);
    assert_eq!(
        again,
        hanzod_actors::ports::RewardReceipt {
            duplicate: true,
            ..first
        }
    );
    assert_eq!(l.balance_of(&a).await, Ok(GymWei(500)));
    assert_eq!(l.reward_batches().await.map(|b| b.len()), Ok(1));
}

async fn other_epochs_and_jobs_pay<L: Ledger>(l: &L) {
    let a = staked(1);
    for (job, epoch) in [(1, 0), (1, 1), (2, 0), (2, 1)] {
        let r = l
            .distribute_epoch_rewards(JobId(job), epoch, &[(a, GymWei(10))])
            .await
            .expect("distribute");
        assert!(!r.duplicate, "job {job} epoch {epoch} paid as a duplicate");
    }
    assert_eq!(l.balance_of(&a).await, Ok(GymWei(40)));
}

async fn batch_with_unbound_node_pays_nothing<L: Ledger>(l: &L) {
    let a = staked(1);
    let e = l
        .distribute_epoch_rewards(JobId(1), 0, &[(a, GymWei(10)), (unbound(), GymWei(10))])
        .await;
    assert_eq!(e, Err(LedgerError::Chain(ChainError::Unbound(unbound()))));
    assert_eq!(l.balance_of(&a).await, Ok(GymWei(0)));
    // The epoch stays unpaid: a corrected batch goes through.
    let r = l
        .distribute_epoch_rewards(JobId(1), 0, &[(a, GymWei(10))])
        .await
        .expect("corrected batch");
    assert!(!r.duplicate);
    assert_eq!(l.balance_of(&a).await, Ok(GymWei(10)));
}

async fn slash_reduces_stake_and_sets_penalty<L: Ledger>(l: &L, now: Timestamp, window_ms: u64) {
    let a = staked(1);
    let before = l.stake_of(&a).await.expect("stake");
    let r = l
        .slash(&a, 10, b"bad delta, job 1 epoch 0")
        .await
        .expect("slash");
    assert!(!r.duplicate);
    assert_eq!((r.node, r.pct), (a, 10));
    assert_eq!(r.slashed, GymWei(before.0 / 10));
    assert_eq!(r.stake_after, GymWei(before.0 - before.0 / 10));
    assert_eq!(l.stake_of(&a).await, Ok(r.stake_after));
    assert_eq!(r.penalty_until, now.plus_ms(window_ms));
    assert_eq!(l.penalty_until(&a).await, Ok(Some(r.penalty_until)));
    assert_eq!(r.evidence_hash.len(), 32);
    // A second offence slashes the reduced stake.
    let r2 = l.slash(&a, 50, b"second offence").await.expect("slash 2");
    assert_eq!(r2.slashed, GymWei(r.stake_after.0 / 2));
    assert_eq!(l.stake_of(&a).await, Ok(r2.stake_after));
    // Other nodes are untouched.
    assert_eq!(l.stake_of(&staked(2)).await, Ok(before));
    assert_eq!(l.penalty_until(&staked(2)).await, Ok(None));
}

async fn slash_rounds_down<L: Ledger>(l: &L) {
    let a = staked(1);
    let stake = l.stake_of(&a).await.expect("stake").0;
    // Take it to an amount that does not divide by 100, then check the floor.
    let first = l.slash(&a, 1, b"one").await.expect("slash");
    assert_eq!(first.slashed.0, stake / 100);
    let left = first.stake_after.0;
    let r = l.slash(&a, 33, b"two").await.expect("slash");
    assert_eq!(r.slashed.0, left * 33 / 100);
    assert_eq!(r.stake_after.0, left - left * 33 / 100);
    let all = l.slash(&a, 100, b"three").await.expect("slash");
    assert_eq!(all.stake_after, GymWei(0));
}

async fn same_evidence_slashes_once<L: Ledger>(l: &L) {
    let a = staked(1);
    let first = l.slash(&a, 20, b"evidence").await.expect("first");
    let again = l.slash(&a, 20, b"evidence").await.expect("repeat");
    assert!(again.duplicate);
    assert_eq!(
        again,
        hanzod_actors::ports::SlashReceipt {
            duplicate: true,
            ..first.clone()
        }
    );
    assert_eq!(l.stake_of(&a).await, Ok(first.stake_after));
    assert_eq!(l.slashes().await.map(|s| s.len()), Ok(1));
}

async fn bad_pct_is_refused<L: Ledger>(l: &L) {
    let a = staked(1);
    let before = l.stake_of(&a).await.expect("stake");
    for pct in [0u8, 101, 255] {
        let e = l.slash(&a, pct, format!("pct {pct}").as_bytes()).await;
        assert!(
            matches!(e, Err(LedgerError::Invalid(_))),
            "pct {pct}: {e:?}"
        );
    }
    assert_eq!(l.stake_of(&a).await, Ok(before));
    assert_eq!(l.penalty_until(&a).await, Ok(None));
    assert_eq!(l.slashes().await, Ok(vec![]));
    // A refused evidence is not spent: it can slash later with a valid pct.
    let r = l.slash(&a, 5, b"pct 0").await.expect("valid slash");
    assert!(!r.duplicate);
}

async fn unbound_slash_is_refused<L: Ledger>(l: &L) {
    let e = l.slash(&unbound(), 10, b"who?").await;
    assert_eq!(e, Err(LedgerError::Chain(ChainError::Unbound(unbound()))));
    assert_eq!(
        l.balance_of(&unbound()).await,
        Err(LedgerError::Chain(ChainError::Unbound(unbound())))
    );
    assert_eq!(l.slashes().await, Ok(vec![]));
}

async fn history_is_listed_in_order<L: Ledger>(l: &L) {
    let (a, b) = (staked(1), staked(2));
    let r0 = l
        .distribute_epoch_rewards(JobId(7), 0, &[(a, GymWei(1))])
        .await
        .expect("e0");
    let r1 = l
        .distribute_epoch_rewards(JobId(7), 1, &[(b, GymWei(2))])
        .await
        .expect("e1");
    let _ = l
        .distribute_epoch_rewards(JobId(7), 0, &[(a, GymWei(1))])
        .await
        .expect("dup");
    let s0 = l.slash(&a, 10, b"x").await.expect("s0");
    let s1 = l.slash(&b, 20, b"y").await.expect("s1");
    let _ = l.slash(&a, 10, b"x").await.expect("dup");
    assert_eq!(l.reward_batches().await, Ok(vec![r0, r1]));
    assert_eq!(l.slashes().await, Ok(vec![s0, s1]));
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

async fn publication_is_recorded_once_per_epoch<L: Ledger>(l: &L) {
    let record = |job: u64, epoch: u32, cid: &str| SignedPublication {
        record: PublicationRecord {
            job: JobId(job),
            epoch,
            cid: cid.into(),
            config_cid: "bafkconfig".into(),
            card_cid: "bafkcard".into(),
            hf_repo: format!("org/m-job-{job}-epoch-{epoch}"),
            quality: 0.25,
            timestamp: NOW,
        },
        signer: [1; 32],
        signature: [2; 64],
    };
    let first = record(1, 0, "bafyfirst");
    let r = l.record_publication(&first).await.expect("record");
    assert!(!r.duplicate);
    assert_eq!(r.publication, first);
    // Another record for the same (job, epoch) writes nothing and answers the first.
    let again = l
        .record_publication(&record(1, 0, "bafysecond"))
        .await
        .expect("record again");
    assert!(again.duplicate);
    assert_eq!(again.publication, first);
    // Other epochs and jobs are recorded, in order.
    let (e1, j2) = (record(1, 1, "bafyepoch1"), record(2, 0, "bafyjob2"));
    assert!(!l.record_publication(&e1).await.expect("e1").duplicate);
    assert!(!l.record_publication(&j2).await.expect("j2").duplicate);
    assert_eq!(l.publications().await, Ok(vec![first, e1, j2]));
}

#[tokio::test]
async fn memory_publication_is_recorded_once_per_epoch() {
    publication_is_recorded_once_per_epoch(&memory_chain()).await;
}
