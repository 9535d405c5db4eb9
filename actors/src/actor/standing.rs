//! Reading ring members' standing from the chain (DESIGN §3, "Standing"): used by the job
//! actor at each epoch boundary and by the ring actor before it forms a ring.

use super::msg::StandingReads;
use super::Deps;
use crate::ports::ChainError;
use crate::types::NodeId;

/// Reads the standing of each of `members` from the chain, concurrently, each read
/// bounded by the call deadline (a read past it counts as [`ChainError::Unavailable`]).
pub(super) async fn read_standing(deps: &Deps, members: &[NodeId]) -> StandingReads {
    let read_at = deps.now();
    let limit = deps.call_timeout();
    let mut reads = tokio::task::JoinSet::new();
    for (i, node) in members.iter().copied().enumerate() {
        let chain = deps.chain.clone();
        reads.spawn(async move {
            let read = match tokio::time::timeout(limit, chain.standing(&node)).await {
                Ok(r) => r,
                Err(_) => Err(ChainError::Unavailable("standing read timed out".into())),
            };
            (i, node, read)
        });
    }
    let mut out = Vec::with_capacity(members.len());
    while let Some(done) = reads.join_next().await {
        if let Ok(r) = done {
            out.push(r);
        }
    }
    out.sort_by_key(|(i, _, _)| *i);
    StandingReads {
        read_at,
        reads: out.into_iter().map(|(_, n, r)| (n, r)).collect(),
    }
}
