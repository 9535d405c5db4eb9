//! The [`Ledger`] conformance suite (DESIGN §8, paper §8 "Reward Distribution" and
//! "Slashing"): each check is generic over `L: Ledger` and panics naming the property that
//! failed. The embedded `MemoryChain` and the EVM adapter (`hanzod::chain::EvmChain`, on a
//! real anvil) run the same suite.
//!
//! Each check takes a fresh fixture ledger on which the [`staked`] nodes 1..=4 are bound,
//! each with [`STAKE`], every other node (such as [`unbound`]) is unbound, and nothing has
//! been paid, slashed or recorded.

use crate::ports::{ChainError, Ledger, LedgerError, Standing};
use crate::publication::{PublicationRecord, SignedPublication};
use crate::types::{GymWei, JobId, NodeId, Timestamp};

/// The timestamp the publication records carry.
pub const NOW: Timestamp = Timestamp(1_700_000_000_000);
/// Each staked node's stake: 10,000 GYM.
pub const STAKE: GymWei = GymWei::gym(10_000);

/// The `i`-th staked node of the fixture (1..=4): the key `[i; 32]`.
pub fn staked(i: u8) -> NodeId {
    NodeId([i; 32])
}

/// A node the fixture never binds.
pub fn unbound() -> NodeId {
    NodeId([0xee; 32])
}

/// Rewards credit each node's operator and are listed on the receipt.
pub async fn rewards_are_credited<L: Ledger>(l: &L) {
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

/// A second batch for the same (job, epoch) pays nothing and answers the first.
pub async fn same_epoch_pays_once<L: Ledger>(l: &L) {
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
        crate::ports::RewardReceipt {
            duplicate: true,
            ..first
        }
    );
    assert_eq!(l.balance_of(&a).await, Ok(GymWei(500)));
    assert_eq!(l.reward_batches().await.map(|b| b.len()), Ok(1));
}

/// Other epochs and other jobs are paid.
pub async fn other_epochs_and_jobs_pay<L: Ledger>(l: &L) {
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

/// A batch naming an unbound node pays nobody and leaves the epoch unpaid.
pub async fn batch_with_unbound_node_pays_nothing<L: Ledger>(l: &L) {
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

/// A slash removes `pct` % of the stake and sets the penalty to `now + window_ms` (the
/// time of the ledger's next write).
pub async fn slash_reduces_stake_and_sets_penalty<L: Ledger>(
    l: &L,
    now: Timestamp,
    window_ms: u64,
) {
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
    // One standing read gives both facts (on the EVM chain, one `nodeStake` call).
    assert_eq!(
        l.standing(&a).await,
        Ok(Standing {
            stake: r2.stake_after,
            penalty_until: Some(r2.penalty_until),
        })
    );
    assert_eq!(
        l.standing(&staked(2)).await,
        Ok(Standing {
            stake: before,
            penalty_until: None,
        })
    );
}

/// Slashed amounts are rounded down.
pub async fn slash_rounds_down<L: Ledger>(l: &L) {
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

/// The same evidence slashes once.
pub async fn same_evidence_slashes_once<L: Ledger>(l: &L) {
    let a = staked(1);
    let first = l.slash(&a, 20, b"evidence").await.expect("first");
    let again = l.slash(&a, 20, b"evidence").await.expect("repeat");
    assert!(again.duplicate);
    assert_eq!(
        again,
        crate::ports::SlashReceipt {
            duplicate: true,
            ..first.clone()
        }
    );
    assert_eq!(l.stake_of(&a).await, Ok(first.stake_after));
    assert_eq!(l.slashes().await.map(|s| s.len()), Ok(1));
}

/// A percentage outside 1..=100 is refused and spends nothing.
pub async fn bad_pct_is_refused<L: Ledger>(l: &L) {
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

/// Empty evidence is refused and slashes nothing.
pub async fn empty_evidence_is_refused<L: Ledger>(l: &L) {
    let a = staked(1);
    let before = l.stake_of(&a).await.expect("stake");
    let e = l.slash(&a, 10, b"").await;
    assert!(
        matches!(e, Err(LedgerError::Invalid(_))),
        "empty evidence: {e:?}"
    );
    assert_eq!(l.stake_of(&a).await, Ok(before));
    assert_eq!(l.slashes().await, Ok(vec![]));
}

/// An unbound node cannot be slashed, and has no balance nor standing.
pub async fn unbound_slash_is_refused<L: Ledger>(l: &L) {
    let e = l.slash(&unbound(), 10, b"who?").await;
    assert_eq!(e, Err(LedgerError::Chain(ChainError::Unbound(unbound()))));
    assert_eq!(
        l.standing(&unbound()).await,
        Err(ChainError::Unbound(unbound()))
    );
    assert_eq!(
        l.balance_of(&unbound()).await,
        Err(LedgerError::Chain(ChainError::Unbound(unbound())))
    );
    assert_eq!(l.slashes().await, Ok(vec![]));
}

/// Batches and slashes are listed oldest first, without duplicates.
pub async fn history_is_listed_in_order<L: Ledger>(l: &L) {
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

/// A publication is recorded once per (job, epoch) and listed in order.
pub async fn publication_is_recorded_once_per_epoch<L: Ledger>(l: &L) {
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
