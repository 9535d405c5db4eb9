//! Reading nodes' standing from the chain (DESIGN §3, "Standing"): used by the job actor for
//! its ring members at each epoch boundary and by the ring actor for the placed nodes before
//! it forms a ring.

use std::sync::Arc;

use ractor::ActorRef;

use super::msg::{OrchestratorMsg, RegistryMsg, StandingReads};
use super::{ask, Deps};
use crate::ports::{ChainError, Standing};
use crate::types::{GymWei, NodeId};

/// Most standing reads in flight at once: a ring of hundreds of members must not open as
/// many requests to one RPC endpoint.
pub const READS_IN_FLIGHT: usize = 16;

/// Reads the standing of each of `nodes` from the chain, at most [`READS_IN_FLIGHT`] at a
/// time, each read bounded by the call deadline (a read past it counts as
/// [`ChainError::Unavailable`]). Reads that cannot be believed ([`implausible`]) are
/// turned into [`ChainError::Unavailable`].
pub(super) async fn read_standing(deps: &Deps, nodes: &[NodeId]) -> StandingReads {
    let read_at = deps.now();
    let limit = deps.call_timeout();
    let permits = Arc::new(tokio::sync::Semaphore::new(READS_IN_FLIGHT));
    let mut reads = tokio::task::JoinSet::new();
    for (i, node) in nodes.iter().copied().enumerate() {
        let (chain, permits) = (deps.chain.clone(), permits.clone());
        reads.spawn(async move {
            let _permit = permits.acquire_owned().await;
            let read = match tokio::time::timeout(limit, chain.standing(&node)).await {
                Ok(r) => r,
                Err(_) => Err(ChainError::Unavailable("standing read timed out".into())),
            };
            (i, node, read)
        });
    }
    let mut out = Vec::with_capacity(nodes.len());
    while let Some(done) = reads.join_next().await {
        if let Ok(r) = done {
            out.push(r);
        }
    }
    out.sort_by_key(|(i, _, _)| *i);
    let mut reads: Vec<_> = out.into_iter().map(|(_, n, r)| (n, r)).collect();
    if implausible(&reads) {
        tracing::warn!(
            nodes = reads.len(),
            "the chain says no node is bound to an operator: taken as a faulty endpoint, not as evidence"
        );
        for (_, r) in &mut reads {
            *r = Err(ChainError::Unavailable("every key read as unbound".into()));
        }
    }
    StandingReads { read_at, reads }
}

/// Whether a set of reads cannot be believed: two or more nodes, every one of them
/// unbound. Every node was bound at its admission and unbinding is its operator's act;
/// all of them at once is far likelier an RPC endpoint answering zeros (a pruned or
/// wrong-chain node) than a fact, and acting on it would empty the ring.
pub fn implausible(reads: &[(NodeId, Result<Standing, ChainError>)]) -> bool {
    reads.len() >= 2
        && reads
            .iter()
            .all(|(_, r)| matches!(r, Err(ChainError::Unbound(_))))
}

/// What the registry records of `reads`: each node's standing as read, an unbound key as
/// no stake (`stake` 0, no penalty: it cannot be placed until it registers again, which
/// reads it afresh); a read that failed otherwise records nothing.
pub fn as_recorded(reads: &[(NodeId, Result<Standing, ChainError>)]) -> Vec<(NodeId, Standing)> {
    reads
        .iter()
        .filter_map(|(n, r)| match r {
            Ok(s) => Some((*n, *s)),
            Err(ChainError::Unbound(_)) => Some((
                *n,
                Standing {
                    stake: GymWei(0),
                    penalty_until: None,
                },
            )),
            Err(ChainError::Unavailable(_)) => None,
        })
        .collect()
}

/// Gives the registry what `standing` says ([`as_recorded`]) and waits until it is applied,
/// so that what is asked of the scheduler or the registry next sees it.
///
/// # Errors
/// The registry did not answer within the call deadline (the reads are then not recorded;
/// the next boundary reads again).
pub(super) async fn record(
    root: &ActorRef<OrchestratorMsg>,
    deps: &Deps,
    standing: &StandingReads,
) -> Result<(), String> {
    let reads = as_recorded(&standing.reads);
    if reads.is_empty() {
        return Ok(());
    }
    let read_at = standing.read_at;
    ask(root, deps, |reply| {
        OrchestratorMsg::Registry(RegistryMsg::StandingRead {
            reads,
            read_at,
            reply,
        })
    })
    .await
    .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(i: u8) -> NodeId {
        NodeId([i; 32])
    }

    #[test]
    fn every_key_unbound_at_once_is_a_faulty_endpoint_and_an_unbound_key_records_no_stake() {
        let unbound = |i| (n(i), Err(ChainError::Unbound(n(i))));
        let ok = Standing {
            stake: GymWei::gym(20_000),
            penalty_until: None,
        };
        assert!(implausible(&[unbound(1), unbound(2)]));
        assert!(!implausible(&[unbound(1)]), "one unbound key is a fact");
        assert!(!implausible(&[unbound(1), (n(2), Ok(ok))]));
        assert!(!implausible(&[]));
        let recorded = as_recorded(&[
            unbound(1),
            (n(2), Ok(ok)),
            (n(3), Err(ChainError::Unavailable("down".into()))),
        ]);
        assert_eq!(
            recorded,
            vec![
                (
                    n(1),
                    Standing {
                        stake: GymWei(0),
                        penalty_until: None
                    }
                ),
                (n(2), ok)
            ]
        );
    }
}
