//! Probe planning: which links to measure when a node is admitted (DESIGN §4).
//!
//! DESIGN §4: "Nodes probe each other on the orchestrator's request and report
//! measurements; an unmeasured pair is estimated … and marked as estimated." The planner
//! decides which requests to send; the registry sends them and records the reports.

use std::cmp::Ordering;
use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use crate::types::NodeId;

/// One directed link to measure, `from → to`: node `from` receives
/// [`NodeCommand::ProbeRequest`]` { peer: to }` and reports the measured Mbit/s of its
/// link to `to`.
///
/// [`NodeCommand::ProbeRequest`]: crate::ports::NodeCommand::ProbeRequest
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ProbePair {
    /// The node that measures (the sender of the probe traffic).
    pub from: NodeId,
    /// The peer it measures its link to (the receiver of the probe traffic).
    pub to: NodeId,
}

/// The links to probe after `new` is admitted (first registration or re-registration).
///
/// Inputs:
/// - `new`, `new_region`: the admitted node and its region label.
/// - `live`: the live nodes as `(id, region)`, in any order. `new` itself, if present, is
///   skipped; a node listed twice counts once (its first entry's region is used).
/// - `is_measured(a, b)`: whether the directed link `a → b` already has a measurement.
/// - `k`: the most peers probed for `new` (`core.probe.peers_per_node`); 0 plans nothing.
/// - `seed`: breaks ties between equally ranked peers.
///
/// Policy (ours, serving DESIGN §4): each live peer `p ≠ new` is ranked by
/// 1. whether its pair with `new` still has an unmeasured direction (`new → p` or
///    `p → new`): such peers come first, so probing fills in estimates before it refreshes
///    measurements;
/// 2. whether it declares the same region as `new` (an empty label matches no one): same
///    region first, because ring builders start region-sorted and a ring's links are
///    mostly intra-region, so those are the links most likely to be used;
/// 3. a pseudo-random key mixed from `seed` and the peer's id (then the id itself), so ties
///    spread the probing load over peers, and the result does not depend on the order of
///    `live`.
///
/// The first `k` peers are chosen. For a chosen peer with an unmeasured direction only the
/// unmeasured directions are planned; a peer whose both directions are measured (chosen
/// only when fewer than `k` peers have an unmeasured direction) gets both re-probed, as a
/// re-registered node may have moved. Each direction is `new → p` then `p → new`, peers in
/// rank order.
///
/// Guarantees: every pair involves `new` and one peer from `live`; no self-pairs, no
/// duplicates, at most `2k` pairs; a measured pair is planned only when every unmeasured
/// pair between `new` and a live peer is planned too; with `k ≥` the number of live peers
/// every unmeasured pair involving `new` is planned. Deterministic in its inputs: the same
/// `seed` and the same sets give the same plan.
///
/// Cost: `O(m + k log k)` time and `O(m)` memory for `m = |live|` (one pass, one
/// linear-time selection of the top `k`, a sort of those), and at most `2m` calls of
/// `is_measured`.
pub fn plan_probes<'a>(
    new: NodeId,
    new_region: &str,
    live: impl IntoIterator<Item = (NodeId, &'a str)>,
    is_measured: impl Fn(NodeId, NodeId) -> bool,
    k: usize,
    seed: u64,
) -> Vec<ProbePair> {
    if k == 0 {
        return Vec::new();
    }
    let mut seen = HashSet::new();
    let mut candidates: Vec<Candidate> = Vec::new();
    for (peer, region) in live {
        if peer == new || !seen.insert(peer) {
            continue;
        }
        let out_measured = is_measured(new, peer);
        let in_measured = is_measured(peer, new);
        let same_region = !new_region.is_empty() && region == new_region;
        candidates.push(Candidate {
            rank: (
                u8::from(out_measured && in_measured),
                u8::from(!same_region),
                mix(seed, &peer),
            ),
            peer,
            out_measured,
            in_measured,
        });
    }
    if k < candidates.len() {
        candidates.select_nth_unstable_by(k, Candidate::cmp);
        candidates.truncate(k);
    }
    candidates.sort_unstable_by(Candidate::cmp);
    let mut plan = Vec::with_capacity(2 * candidates.len());
    for c in candidates {
        let refresh = c.out_measured && c.in_measured;
        if refresh || !c.out_measured {
            plan.push(ProbePair {
                from: new,
                to: c.peer,
            });
        }
        if refresh || !c.in_measured {
            plan.push(ProbePair {
                from: c.peer,
                to: new,
            });
        }
    }
    plan
}

/// A peer and its rank (lower ranks first).
struct Candidate {
    /// (both directions measured, not same region, seeded tie-break).
    rank: (u8, u8, u64),
    peer: NodeId,
    out_measured: bool,
    in_measured: bool,
}

impl Candidate {
    /// A total order: rank, then id (ids are unique among candidates).
    fn cmp(a: &Candidate, b: &Candidate) -> Ordering {
        a.rank.cmp(&b.rank).then_with(|| a.peer.cmp(&b.peer))
    }
}

/// A 64-bit key from `seed` and `id` (splitmix64 over the id's four words).
fn mix(seed: u64, id: &NodeId) -> u64 {
    let mut h = seed;
    for word in id.0.chunks_exact(8) {
        let mut w = [0u8; 8];
        w.copy_from_slice(word);
        h = splitmix64(h ^ u64::from_le_bytes(w));
    }
    h
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    fn id(i: u8) -> NodeId {
        let mut b = [0u8; 32];
        b[0] = i;
        b[31] = i.wrapping_mul(37);
        NodeId(b)
    }

    /// The new node is `id(0)`; peers are `id(1..)`.
    #[derive(Debug, Clone)]
    struct Case {
        new_region: String,
        live: Vec<(NodeId, String)>,
        measured: HashSet<(NodeId, NodeId)>,
        k: usize,
        seed: u64,
    }

    impl Case {
        fn plan(&self) -> Vec<ProbePair> {
            plan_probes(
                id(0),
                &self.new_region,
                self.live.iter().map(|(n, r)| (*n, r.as_str())),
                |a, b| self.measured.contains(&(a, b)),
                self.k,
                self.seed,
            )
        }

        /// Distinct live peers other than the new node.
        fn peers(&self) -> BTreeSet<NodeId> {
            self.live
                .iter()
                .map(|(n, _)| *n)
                .filter(|n| *n != id(0))
                .collect()
        }

        /// Unmeasured directed pairs between the new node and a live peer.
        fn unmeasured(&self) -> BTreeSet<ProbePair> {
            let n = id(0);
            self.peers()
                .into_iter()
                .flat_map(|p| [ProbePair { from: n, to: p }, ProbePair { from: p, to: n }])
                .filter(|q| !self.measured.contains(&(q.from, q.to)))
                .collect()
        }
    }

    fn region() -> impl Strategy<Value = String> {
        prop::sample::select(vec!["", "eu", "us", "ap"]).prop_map(String::from)
    }

    fn case() -> impl Strategy<Value = Case> {
        (
            region(),
            // Peer numbers 0..24 (0 is the new node itself, listed sometimes; repeats too).
            prop::collection::vec((0u8..24, region()), 0..30),
            prop::collection::vec((0u8..24, 0u8..24), 0..120),
            0usize..30,
            any::<u64>(),
        )
            .prop_map(|(new_region, live, measured, k, seed)| Case {
                new_region,
                live: live.into_iter().map(|(i, r)| (id(i), r)).collect(),
                measured: measured.into_iter().map(|(a, b)| (id(a), id(b))).collect(),
                k,
                seed,
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn plans_are_well_formed(c in case()) {
            let plan = c.plan();
            let peers = c.peers();
            prop_assert!(plan.len() <= 2 * c.k, "{} pairs for k = {}", plan.len(), c.k);
            let distinct: BTreeSet<_> = plan.iter().copied().collect();
            prop_assert_eq!(distinct.len(), plan.len(), "duplicates in {:?}", plan);
            let mut probed = BTreeSet::new();
            for q in &plan {
                prop_assert_ne!(q.from, q.to);
                let peer = if q.from == id(0) { q.to } else { q.from };
                prop_assert!(q.from == id(0) || q.to == id(0), "{:?} misses the new node", q);
                prop_assert!(peers.contains(&peer), "{:?} names a node not live", q);
                probed.insert(peer);
            }
            prop_assert!(probed.len() <= c.k);
        }

        #[test]
        fn plans_are_deterministic_per_seed_and_ignore_input_order(c in case(), rot in 0usize..30) {
            let plan = c.plan();
            prop_assert_eq!(&plan, &c.plan());
            // Reordering `live` changes nothing, as long as each node keeps its first region.
            let mut firsts: Vec<(NodeId, String)> = Vec::new();
            for (n, r) in &c.live {
                if !firsts.iter().any(|(m, _)| m == n) {
                    firsts.push((*n, r.clone()));
                }
            }
            let mut shuffled = c.clone();
            if !firsts.is_empty() {
                let len = firsts.len();
                firsts.rotate_left(rot % len);
            }
            shuffled.live = firsts;
            prop_assert_eq!(plan, shuffled.plan());
        }

        #[test]
        fn measured_pairs_wait_for_unmeasured_ones(c in case()) {
            let plan: BTreeSet<_> = c.plan().into_iter().collect();
            let unmeasured = c.unmeasured();
            if plan.iter().any(|q| c.measured.contains(&(q.from, q.to))) {
                prop_assert!(unmeasured.is_subset(&plan), "measured planned before {:?}", unmeasured.difference(&plan).collect::<Vec<_>>());
            }
        }

        #[test]
        fn enough_budget_plans_every_unmeasured_pair(mut c in case()) {
            c.k = c.k.max(c.peers().len());
            let plan: BTreeSet<_> = c.plan().into_iter().collect();
            prop_assert!(c.unmeasured().is_subset(&plan));
        }
    }

    #[test]
    fn same_region_peers_come_first_and_k_caps_them() {
        let live = [
            (id(1), "us"),
            (id(2), "eu"),
            (id(3), "us"),
            (id(4), "eu"),
            (id(5), ""),
        ];
        for seed in 0..50 {
            let plan = plan_probes(id(0), "eu", live, |_, _| false, 2, seed);
            let peers: BTreeSet<_> = plan.iter().map(|q| q.to).filter(|p| *p != id(0)).collect();
            assert_eq!(peers, BTreeSet::from([id(2), id(4)]), "seed {seed}");
            assert_eq!(plan.len(), 4);
            assert_eq!(plan[0].from, id(0));
            assert_eq!(plan[1].to, id(0));
        }
        // An empty region label matches no one, not even another empty label.
        let plan = plan_probes(id(0), "", [(id(1), ""), (id(2), "eu")], |_, _| false, 1, 7);
        assert_eq!(plan.len(), 2);
        assert!(plan_probes(id(0), "eu", live, |_, _| false, 0, 1).is_empty());
    }

    #[test]
    fn unmeasured_outrank_same_region_and_only_missing_directions_are_planned() {
        let n = id(0);
        // id(1): same region, fully measured. id(2): other region, only 2 → new missing.
        let measured = HashSet::from([(n, id(1)), (id(1), n), (n, id(2))]);
        let is = |a, b| measured.contains(&(a, b));
        let live = [(id(1), "eu"), (id(2), "us")];
        let plan = plan_probes(n, "eu", live, is, 1, 3);
        assert_eq!(plan, [ProbePair { from: id(2), to: n }]);
        // With room for both, the measured peer is refreshed in both directions, after.
        let plan = plan_probes(n, "eu", live, is, 2, 3);
        assert_eq!(
            plan,
            [
                ProbePair { from: id(2), to: n },
                ProbePair { from: n, to: id(1) },
                ProbePair { from: id(1), to: n },
            ]
        );
    }

    #[test]
    fn seeds_spread_the_choice_among_equal_peers() {
        let live: Vec<(NodeId, &str)> = (1..=20).map(|i| (id(i), "eu")).collect();
        let chosen: BTreeSet<NodeId> = (0..64)
            .flat_map(|seed| plan_probes(id(0), "eu", live.iter().copied(), |_, _| false, 1, seed))
            .map(|q| q.to)
            .collect();
        assert!(
            chosen.len() > 5,
            "only {} distinct peers over 64 seeds",
            chosen.len()
        );
    }
}
