//! Conformance suites for adapter authors: run one against your implementation of a port
//! and it checks the contract the core relies on. The embedded in-memory implementations
//! and hanzod's own adapters (Valkey) run the same suites.
//!
//! Each check panics with a message saying which property failed.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::{DeltaReceipt, LeaderLease, Snapshot, StateStore, StoreError};
use crate::events::{Event, FailureKind};
use crate::types::{JobId, NodeId, Timestamp};

fn event(i: u64) -> Event {
    if i.is_multiple_of(2) {
        Event::NodeFailed {
            node: NodeId([i as u8; 32]),
            kind: FailureKind::SessionClosed,
        }
    } else {
        Event::DeltaAccepted(DeltaReceipt {
            job: JobId(i),
            node: NodeId([i as u8; 32]),
            epoch: i as u32,
            step: i,
            delta_hash: [i as u8; 32],
            claimed_loss: 0.25 + i as f64,
            signature: vec![i as u8; 64],
        })
    }
}

/// The [`StateStore`] and [`LeaderLease`] contract (DESIGN §9), on stores made by `fresh`
/// (each call: an empty log with no lease, e.g. a new key namespace). Lease expiry is
/// waited for with `tokio::time::sleep`, so under paused time it costs nothing; on a real
/// server it costs about a second in all.
///
/// Checks: gapless ordered appends that read back equal; `append_once` records an id
/// once (also when asked again after a newer lease); concurrent appends get distinct,
/// gapless sequence numbers; snapshots replace older ones and ignore stale ones; the log
/// id is stable across handles; one leader at a time, with growing fencing tokens; a
/// deposed leader's appends and snapshots are refused [`StoreError::Fenced`] and change
/// nothing; resignation and expiry free the lease; renewing an expired, untaken lease keeps
/// its token.
pub async fn state_store<S, F, Fut>(mut fresh: F)
where
    S: StateStore + LeaderLease,
    F: FnMut() -> Fut,
    Fut: Future<Output = S>,
{
    log_order(&fresh().await).await;
    append_once(&fresh().await).await;
    concurrent_appends(Arc::new(fresh().await)).await;
    snapshots(&fresh().await).await;
    leases_and_fencing(&fresh().await).await;
    lease_expiry(&fresh().await).await;
}

async fn log_order<S: StateStore>(s: &S) {
    assert_eq!(s.last_seq().await.unwrap(), 0, "a fresh log is empty");
    assert!(s.read_after(0).await.unwrap().is_empty());
    for i in 1..=5u64 {
        let seq = s.append(Timestamp(1_000 + i), event(i)).await.unwrap();
        assert_eq!(seq, i, "sequence numbers are 1, 2, … with no gaps");
    }
    assert_eq!(s.last_seq().await.unwrap(), 5);
    let all = s.read_after(0).await.unwrap();
    assert_eq!(all.len(), 5);
    for (i, r) in all.iter().enumerate() {
        let i = i as u64 + 1;
        assert_eq!(r.seq, i, "records come back in order");
        assert_eq!(r.at, Timestamp(1_000 + i), "the timestamp round-trips");
        assert_eq!(r.event, event(i), "the event round-trips");
    }
    let tail = s.read_after(3).await.unwrap();
    assert_eq!(
        tail.iter().map(|r| r.seq).collect::<Vec<_>>(),
        vec![4, 5],
        "read_after(n) starts after n"
    );
    assert!(s.read_after(5).await.unwrap().is_empty());
    assert!(s.read_after(99).await.unwrap().is_empty());
    let id = s.log_id().await.unwrap();
    assert_eq!(s.log_id().await.unwrap(), id, "the log id is stable");
    assert_eq!(
        s.fenced(7).log_id().await.unwrap(),
        id,
        "a fenced handle names the same log"
    );
}

async fn append_once<S: StateStore + LeaderLease>(s: &S) {
    let id = 0x5eed_u128 << 64 | 7;
    assert_eq!(s.append_once(id, Timestamp(1), event(1)).await.unwrap(), 1);
    assert_eq!(
        s.append_once(id, Timestamp(2), event(1)).await.unwrap(),
        1,
        "a repeated id returns its sequence number"
    );
    assert_eq!(
        s.append_once(id + 1, Timestamp(3), event(2)).await.unwrap(),
        2
    );
    assert_eq!(s.last_seq().await.unwrap(), 2, "and writes nothing");
    // Written under a token that has since been superseded: still answered, not fenced.
    let a = s.campaign("a", "", 60_000).await.unwrap().expect("won");
    let writer = s.fenced(a.token);
    assert_eq!(
        writer
            .append_once(id + 2, Timestamp(4), event(3))
            .await
            .unwrap(),
        3
    );
    s.resign(&a).await.unwrap();
    s.campaign("b", "", 60_000).await.unwrap().expect("won");
    assert_eq!(
        writer
            .append_once(id + 2, Timestamp(4), event(3))
            .await
            .unwrap(),
        3,
        "a retry of a write that landed is answered after a newer lease"
    );
    assert!(
        matches!(
            writer.append_once(id + 3, Timestamp(5), event(4)).await,
            Err(StoreError::Fenced { .. })
        ),
        "a new write of a deposed leader is fenced"
    );
    assert_eq!(s.last_seq().await.unwrap(), 3);
}

async fn concurrent_appends<S: StateStore>(s: Arc<S>) {
    let writers = 16u64;
    let each = 8u64;
    let mut tasks = Vec::new();
    for w in 0..writers {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let mut seqs = Vec::new();
            for i in 0..each {
                seqs.push(s.append(Timestamp(w), event(w * each + i)).await.unwrap());
            }
            seqs
        }));
    }
    let mut seqs = Vec::new();
    for t in tasks {
        seqs.extend(t.await.expect("writer task"));
    }
    seqs.sort_unstable();
    let want: Vec<u64> = (1..=writers * each).collect();
    assert_eq!(
        seqs, want,
        "concurrent appends get each sequence number exactly once"
    );
    assert_eq!(s.read_after(0).await.unwrap().len() as u64, writers * each);
}

async fn snapshots<S: StateStore>(s: &S) {
    assert_eq!(s.get_snapshot("fold").await.unwrap(), None);
    let snap = |seq: u64, b: u8| Snapshot {
        seq,
        state: vec![b; 3],
    };
    s.put_snapshot("fold", snap(10, 1)).await.unwrap();
    s.put_snapshot("other", snap(1, 9)).await.unwrap();
    assert_eq!(s.get_snapshot("fold").await.unwrap(), Some(snap(10, 1)));
    s.put_snapshot("fold", snap(20, 2)).await.unwrap();
    assert_eq!(
        s.get_snapshot("fold").await.unwrap(),
        Some(snap(20, 2)),
        "a newer snapshot replaces the older"
    );
    s.put_snapshot("fold", snap(15, 3)).await.unwrap();
    assert_eq!(
        s.get_snapshot("fold").await.unwrap(),
        Some(snap(20, 2)),
        "a stale snapshot is ignored"
    );
    assert_eq!(
        s.get_snapshot("other").await.unwrap(),
        Some(snap(1, 9)),
        "keys are separate"
    );
}

async fn leases_and_fencing<S: StateStore + LeaderLease>(s: &S) {
    const TTL: u64 = 60_000;
    assert_eq!(
        s.leader().await.unwrap(),
        None,
        "nobody leads a fresh store"
    );
    let a = s
        .campaign("a", "http://a:9550", TTL)
        .await
        .unwrap()
        .expect("a free lease is won");
    assert_eq!(a.holder, "a");
    assert_eq!(a.endpoint, "http://a:9550");
    assert!(a.token >= 1);
    assert_eq!(s.leader().await.unwrap(), Some(a.clone()));
    assert_eq!(
        s.campaign("b", "http://b:9550", TTL).await.unwrap(),
        None,
        "a live lease is not taken"
    );
    assert_eq!(
        s.campaign("a", "http://a:9550", TTL).await.unwrap(),
        Some(a.clone()),
        "the holder gets its own lease back, same token"
    );
    assert!(s.renew(&a, TTL).await.unwrap(), "the holder renews");

    let writer_a = s.fenced(a.token);
    assert_eq!(writer_a.append(Timestamp(1), event(1)).await.unwrap(), 1);
    writer_a
        .put_snapshot(
            "fold",
            Snapshot {
                seq: 1,
                state: b"a".to_vec(),
            },
        )
        .await
        .unwrap();

    s.resign(&a).await.unwrap();
    assert_eq!(s.leader().await.unwrap(), None, "resigning frees the lease");
    let b = s
        .campaign("b", "http://b:9550", TTL)
        .await
        .unwrap()
        .expect("a resigned lease is won at once");
    assert!(b.token > a.token, "every acquisition draws a newer token");
    assert!(
        !s.renew(&a, TTL).await.unwrap(),
        "a deposed leader cannot renew"
    );
    s.resign(&a).await.unwrap();
    assert_eq!(
        s.leader().await.unwrap(),
        Some(b.clone()),
        "a deposed leader's resignation does not free the new lease"
    );

    // The deposed leader wakes up and writes: refused, and nothing changes.
    match writer_a.append(Timestamp(2), event(2)).await {
        Err(StoreError::Fenced { token, current }) => {
            assert_eq!((token, current), (a.token, b.token));
        }
        other => panic!("a deposed leader's append must be fenced, got {other:?}"),
    }
    assert!(matches!(
        writer_a
            .put_snapshot(
                "fold",
                Snapshot {
                    seq: 99,
                    state: b"stale".to_vec()
                }
            )
            .await,
        Err(StoreError::Fenced { .. })
    ));
    assert_eq!(
        s.last_seq().await.unwrap(),
        1,
        "a fenced append wrote nothing"
    );
    assert_eq!(
        s.get_snapshot("fold").await.unwrap().map(|x| x.state),
        Some(b"a".to_vec()),
        "a fenced snapshot wrote nothing"
    );
    let writer_b = s.fenced(b.token);
    assert_eq!(writer_b.append(Timestamp(3), event(3)).await.unwrap(), 2);
    assert_eq!(
        s.read_after(0).await.unwrap()[1].event,
        event(3),
        "the new leader writes"
    );
}

async fn lease_expiry<S: StateStore + LeaderLease>(s: &S) {
    const SHORT: u64 = 300;
    let a = s.campaign("a", "", SHORT).await.unwrap().expect("won");
    tokio::time::sleep(Duration::from_millis(SHORT + 200)).await;
    assert_eq!(s.leader().await.unwrap(), None, "the lease expired");
    assert!(
        s.renew(&a, SHORT).await.unwrap(),
        "an expired lease nobody took is renewed"
    );
    assert_eq!(
        s.leader().await.unwrap().map(|l| l.token),
        Some(a.token),
        "with its token"
    );
    s.fenced(a.token)
        .append(Timestamp(1), event(1))
        .await
        .expect("and its writes still count");
    tokio::time::sleep(Duration::from_millis(SHORT + 200)).await;
    assert_eq!(
        s.leader().await.unwrap(),
        None,
        "an unrenewed lease expires"
    );
    let b = s
        .campaign("b", "", 60_000)
        .await
        .unwrap()
        .expect("an expired lease is won");
    assert!(b.token > a.token);
    assert!(!s.renew(&a, SHORT).await.unwrap(), "taken: lost for good");
    assert!(matches!(
        s.fenced(a.token).append(Timestamp(2), event(2)).await,
        Err(StoreError::Fenced { .. })
    ));
}
