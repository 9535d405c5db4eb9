//! Epoch reward split (paper §8 "Reward Distribution": the pool split by composite score
//! over accepted deltas). Pure: the epoch's settlement (`hanzod_pipeline::sink`) computes the
//! amounts here and pays them through [`crate::ports::Ledger::distribute_epoch_rewards`].
//!
//! Amounts are integers in GYM wei (10^-18 GYM); the split is exact: the amounts sum to
//! the pool, the rounding remainder going to the largest share.

use crate::types::{GymWei, NodeId};

/// Splits `pool` between nodes in proportion to their `shares` (composite scores).
///
/// - Shares that are not finite or are ≤ 0 get nothing and are omitted from the output.
/// - A node listed more than once has its shares added.
/// - Each amount is rounded down; the remainder goes to the largest share (ties broken by
///   the smaller [`NodeId`]), so the amounts sum to exactly `pool` whenever any share is
///   positive. With no positive share the result is empty.
/// - Deterministic: sorted by [`NodeId`], and independent of the input order.
///
/// Shares are first normalised to integer weights (the largest share gets 2^k, with
/// 2^k × the number of nodes < 2^64), so the proportions are exact to about 2^-(k) of the
/// largest share; the division is then exact integer arithmetic for any `pool` up to
/// `u128::MAX`. A node with at least twice another's share gets at least twice its amount.
pub fn split_rewards(pool: GymWei, shares: &[(NodeId, f64)]) -> Vec<(NodeId, GymWei)> {
    let mut valid: Vec<(NodeId, f64)> = shares
        .iter()
        .copied()
        .filter(|(_, s)| s.is_finite() && *s > 0.0)
        .collect();
    let Some(max) = valid.iter().map(|(_, s)| *s).reduce(f64::max) else {
        return Vec::new();
    };
    // A canonical order, so that float sums (duplicates) do not depend on the input order.
    valid.sort_by(|(a, x), (b, y)| a.cmp(b).then(x.total_cmp(y)));

    // Merge duplicates, scaled by the largest share first so no sum can overflow.
    let mut merged: Vec<(NodeId, f64)> = Vec::with_capacity(valid.len());
    for (node, share) in valid {
        let scaled = share / max;
        match merged.last_mut() {
            Some((last, sum)) if *last == node => *sum += scaled,
            _ => merged.push((node, scaled)),
        }
    }
    let top = merged.iter().map(|(_, s)| *s).fold(0.0, f64::max);
    if !(top.is_finite() && top > 0.0) {
        return Vec::new();
    }

    // Integer weights: the largest share gets 2^k, and n × 2^k < 2^64, so the total W
    // and every weight fit in 64 bits.
    let n = merged.len() as u64;
    let k = 64 - (u64::BITS - n.leading_zeros()) as i32;
    let scale = 2f64.powi(k);
    // `x ≤ 1`, so the cast is exact for the integer part and never saturates.
    let weights: Vec<u128> = merged
        .iter()
        .map(|(_, s)| u128::from(((s / top) * scale) as u64))
        .collect();
    let total_weight: u128 = weights.iter().sum();
    if total_weight == 0 {
        return Vec::new();
    }

    // pool × w / W without overflow: pool = q·W + r, so pool·w/W = q·w + r·w/W with
    // q·w ≤ pool and r·w < 2^64 · 2^64.
    let (q, r) = (pool.0 / total_weight, pool.0 % total_weight);
    let mut amounts: Vec<u128> = weights
        .iter()
        .map(|&w| q * w + r * w / total_weight)
        .collect();
    let paid: u128 = amounts.iter().sum();
    let remainder = pool.0 - paid;

    // The largest share (first in NodeId order among equals) takes the remainder.
    let mut largest = 0;
    for (i, (_, s)) in merged.iter().enumerate() {
        if *s > merged[largest].1 {
            largest = i;
        }
    }
    amounts[largest] += remainder;

    merged
        .into_iter()
        .zip(amounts)
        .map(|((node, _), a)| (node, GymWei(a)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn node(i: u8) -> NodeId {
        NodeId([i; 32])
    }

    fn total(v: &[(NodeId, GymWei)]) -> u128 {
        v.iter().map(|(_, a)| a.0).sum()
    }

    fn share() -> impl Strategy<Value = f64> {
        prop_oneof![
            6 => 1e-6f64..1e6,
            1 => Just(0.0),
            1 => -1e6f64..0.0,
            1 => Just(f64::NAN),
            1 => Just(f64::INFINITY),
            1 => Just(f64::NEG_INFINITY),
            1 => Just(f64::MAX),
            1 => Just(f64::MIN_POSITIVE),
        ]
    }

    fn pool() -> impl Strategy<Value = u128> {
        prop_oneof![
            0u128..1_000,
            0u128..=1_000_000_000_000_000_000_000_000_000_000,
            any::<u128>(),
        ]
    }

    fn entries() -> impl Strategy<Value = Vec<(NodeId, f64)>> {
        prop::collection::vec((any::<u8>().prop_map(node), share()), 0..24)
    }

    #[test]
    fn rewards_split_evenly_with_remainder_to_smallest_id_among_equals() {
        let out = split_rewards(
            GymWei(10),
            &[(node(3), 1.0), (node(1), 1.0), (node(2), 1.0)],
        );
        assert_eq!(
            out,
            vec![
                (node(1), GymWei(4)),
                (node(2), GymWei(3)),
                (node(3), GymWei(3))
            ]
        );
    }

    #[test]
    fn rewards_remainder_goes_to_largest_share() {
        let out = split_rewards(GymWei(100), &[(node(1), 1.0), (node(2), 2.0)]);
        assert_eq!(out, vec![(node(1), GymWei(33)), (node(2), GymWei(67))]);
    }

    #[test]
    fn rewards_no_positive_share_pays_nothing() {
        assert!(split_rewards(GymWei(100), &[]).is_empty());
        let bad = [
            (node(1), 0.0),
            (node(2), -1.0),
            (node(3), f64::NAN),
            (node(4), f64::INFINITY),
        ];
        assert!(split_rewards(GymWei(100), &bad).is_empty());
    }

    #[test]
    fn rewards_duplicates_are_merged() {
        let out = split_rewards(
            GymWei(90),
            &[(node(1), 1.0), (node(2), 1.0), (node(1), 1.0)],
        );
        assert_eq!(out, vec![(node(1), GymWei(60)), (node(2), GymWei(30))]);
    }

    #[test]
    fn rewards_huge_pool_and_extreme_shares() {
        let out = split_rewards(
            GymWei(u128::MAX),
            &[(node(1), f64::MAX), (node(2), f64::MAX), (node(3), 1e-300)],
        );
        assert_eq!(total(&out), u128::MAX);
        assert_eq!(out.len(), 3);
        assert_eq!(out[2].1, GymWei(0));
        assert!(out[0].1 .0.abs_diff(out[1].1 .0) <= 1);
    }

    proptest! {
        #[test]
        fn rewards_sum_to_pool_when_any_share_positive(pool in pool(), shares in entries()) {
            let out = split_rewards(GymWei(pool), &shares);
            let any = shares.iter().any(|(_, s)| s.is_finite() && *s > 0.0);
            if any {
                prop_assert_eq!(total(&out), pool);
            } else {
                prop_assert!(out.is_empty());
            }
            for (_, a) in &out {
                prop_assert!(a.0 <= pool);
            }
            // Sorted, unique, and only nodes with a positive share.
            prop_assert!(out.windows(2).all(|w| w[0].0 < w[1].0));
            for (n, _) in &out {
                prop_assert!(shares.iter().any(|(m, s)| m == n && s.is_finite() && *s > 0.0));
            }
        }

        #[test]
        fn rewards_order_independent(
            pool in pool(),
            (shares, perm) in entries().prop_flat_map(|v| {
                let n = v.len();
                (Just(v), Just((0..n).collect::<Vec<_>>()).prop_shuffle())
            }),
        ) {
            let shuffled: Vec<_> = perm.iter().map(|&i| shares[i]).collect();
            prop_assert_eq!(
                split_rewards(GymWei(pool), &shares),
                split_rewards(GymWei(pool), &shuffled)
            );
        }

        #[test]
        fn rewards_twice_the_share_gets_at_least_twice(
            pool in pool(),
            s in 1e-6f64..1e6,
            others in prop::collection::vec((3u8..=255, share()), 0..12),
        ) {
            let mut shares = vec![(node(1), s), (node(2), 2.0 * s)];
            let mut seen = std::collections::HashSet::new();
            for (i, sh) in others {
                if seen.insert(i) {
                    shares.push((node(i), sh));
                }
            }
            let out = split_rewards(GymWei(pool), &shares);
            let get = |n: NodeId| out.iter().find(|(m, _)| *m == n).map(|(_, a)| a.0);
            let (Some(one), Some(two)) = (get(node(1)), get(node(2))) else {
                return Err(TestCaseError::fail("both nodes must be paid"));
            };
            prop_assert!(two.saturating_add(1) >= one.saturating_mul(2));
        }

        #[test]
        fn rewards_invalid_shares_get_nothing(
            pool in pool(),
            good in 1e-6f64..1e6,
            bad in prop_oneof![Just(0.0), Just(-0.0), -1e9f64..0.0, Just(f64::NAN),
                               Just(f64::INFINITY), Just(f64::NEG_INFINITY)],
        ) {
            let out = split_rewards(GymWei(pool), &[(node(1), good), (node(2), bad)]);
            prop_assert_eq!(out, vec![(node(1), GymWei(pool))]);
        }
    }
}
