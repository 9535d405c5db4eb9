//! Property tests for the ring module.

use proptest::prelude::*;

use super::*;
use crate::types::LinkProfile;

/// An `n x n` matrix from a flat list of values; some entries are NaN, negative or tied.
fn matrix(n: usize, vals: &[f32]) -> BandwidthMatrix {
    BandwidthMatrix::from_fn(n, |i, j| vals[(i * n + j) % vals.len()])
}

fn value() -> impl Strategy<Value = f32> {
    prop_oneof![
        8 => 0.0f32..1000.0,
        1 => Just(f32::NAN),
        1 => Just(-5.0f32),
        2 => prop::sample::select(vec![10.0f32, 100.0, 500.0]),
    ]
}

fn instance(max_n: usize) -> impl Strategy<Value = (BandwidthMatrix, Vec<String>)> {
    (
        0..=max_n,
        prop::collection::vec(value(), 1..200),
        prop::collection::vec(0u8..3, 0..16),
    )
        .prop_map(|(n, vals, regs)| {
            let regions = regs.iter().map(|r| format!("r{r}")).collect();
            (matrix(n, &vals), regions)
        })
}

fn builders() -> Vec<Box<dyn RingBuilder>> {
    vec![
        Box::new(Algorithm1::default()),
        Box::new(ThresholdRingBuilder::default()),
        Box::new(ThresholdRingBuilder {
            search_budget: 0,
            candidates: 3,
            compare_algorithm1: false,
            ..ThresholdRingBuilder::default()
        }),
    ]
}

fn brute_bottleneck(bw: &BandwidthMatrix, order: &[usize]) -> f32 {
    if order.len() < 2 {
        return f32::INFINITY;
    }
    (0..order.len())
        .map(|k| bw.get(order[k], order[(k + 1) % order.len()]))
        .fold(f32::INFINITY, f32::min)
}

/// The best ring by enumerating every permutation that starts at node 0.
fn brute_optimum(bw: &BandwidthMatrix) -> f32 {
    fn rec(
        bw: &BandwidthMatrix,
        path: &mut Vec<usize>,
        used: &mut [bool],
        cur: f32,
        best: &mut f32,
    ) {
        let n = used.len();
        if path.len() == n {
            *best = best.max(cur.min(bw.get(path[n - 1], path[0])));
            return;
        }
        for v in 0..n {
            if !used[v] {
                used[v] = true;
                let c = cur.min(bw.get(*path.last().unwrap(), v));
                path.push(v);
                rec(bw, path, used, c, best);
                path.pop();
                used[v] = false;
            }
        }
    }
    let n = bw.n();
    if n < 2 {
        return f32::INFINITY;
    }
    let mut used = vec![false; n];
    used[0] = true;
    let mut best = f32::NEG_INFINITY;
    rec(bw, &mut vec![0], &mut used, f32::INFINITY, &mut best);
    best
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn builders_return_permutations((bw, regions) in instance(14)) {
        for b in builders() {
            let order = b.build(&bw, &regions);
            prop_assert!(is_permutation(&order, bw.n()), "{} gave {:?}", b.name(), order);
        }
    }

    #[test]
    fn bottleneck_matches_brute_force((bw, _r) in instance(10), seed in any::<u64>()) {
        use rand::seq::SliceRandom;
        use rand::SeedableRng;
        let mut order: Vec<usize> = (0..bw.n()).collect();
        order.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(seed));
        prop_assert_eq!(bottleneck(&bw, &order).to_bits(), brute_bottleneck(&bw, &order).to_bits());
    }

    #[test]
    fn exact_dominates_builders_and_matches_brute_force((bw, regions) in instance(8)) {
        let (opt, order) = exact_max_bottleneck(&bw).unwrap();
        prop_assert!(is_permutation(&order, bw.n()));
        prop_assert_eq!(bottleneck(&bw, &order).to_bits(), opt.to_bits());
        prop_assert_eq!(opt.to_bits(), brute_optimum(&bw).to_bits());
        for b in builders() {
            let got = bottleneck(&bw, &b.build(&bw, &regions));
            prop_assert!(got <= opt, "{} got {} > optimum {}", b.name(), got, opt);
        }
    }

    #[test]
    fn default_is_at_least_algorithm1((bw, regions) in instance(30)) {
        let a = bottleneck(&bw, &Algorithm1::default().build(&bw, &regions));
        let d = bottleneck(&bw, &default_builder().build(&bw, &regions));
        prop_assert!(d >= a, "default {} < algorithm1 {}", d, a);
    }

    #[test]
    fn recovery_invariants(
        (bw, _r) in instance(14),
        perm_seed in any::<u64>(),
        members in 0usize..15,
        failed in prop::collection::vec(0usize..16, 0..6),
        standby in prop::collection::vec(0usize..16, 0..4),
    ) {
        use rand::seq::SliceRandom;
        use rand::SeedableRng;
        let n = bw.n();
        let mut all: Vec<usize> = (0..n).collect();
        all.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(perm_seed));
        let ring: Vec<usize> = all[..members.min(n)].to_vec();
        let plan = recover(&ring, &failed, &standby, &bw);
        // No failed node survives.
        prop_assert!(plan.order.iter().all(|v| !failed.contains(v)));
        // Survivors keep their relative order.
        let survivors: Vec<usize> = ring.iter().copied().filter(|v| !failed.contains(v)).collect();
        let kept: Vec<usize> = plan.order.iter().copied().filter(|v| ring.contains(v)).collect();
        prop_assert_eq!(&kept, &survivors);
        // Each usable standby exactly once.
        let mut usable = Vec::new();
        for &s in &standby {
            if s < n && !ring.contains(&s) && !failed.contains(&s) && !usable.contains(&s) {
                usable.push(s);
            }
        }
        for &s in &usable {
            prop_assert_eq!(plan.order.iter().filter(|&&v| v == s).count(), 1);
        }
        prop_assert_eq!(plan.order.len(), survivors.len() + usable.len());
        for &(s, p) in &plan.inserted {
            prop_assert_eq!(plan.order[p], s);
        }
        prop_assert_eq!(plan.bottleneck.to_bits(), bottleneck(&bw, &plan.order).to_bits());
        // Never worse than appending the standbys at the end.
        let mut appended = survivors.clone();
        appended.extend_from_slice(&usable);
        prop_assert!(plan.bottleneck >= bottleneck(&bw, &appended));
        // Removed = failed members, in ring order; ignored = failed non-members.
        let removed: Vec<usize> = ring.iter().copied().filter(|v| failed.contains(v)).collect();
        prop_assert_eq!(&plan.removed, &removed);
        prop_assert!(plan.ignored_failed.iter().all(|v| !ring.contains(v)));
    }
}

#[test]
fn trivial_sizes_do_not_panic() {
    for n in 0..=3 {
        let bw = BandwidthMatrix::new(n);
        for b in builders() {
            assert!(is_permutation(&b.build(&bw, &[]), n));
        }
        assert!(exact_max_bottleneck(&bw).is_some());
    }
    assert_eq!(bottleneck(&BandwidthMatrix::new(1), &[0]), f32::INFINITY);
    assert_eq!(bottleneck(&BandwidthMatrix::new(0), &[]), f32::INFINITY);
    assert!(exact_max_bottleneck(&BandwidthMatrix::new(13)).is_none());
    let bw = random_uniform(5, 1);
    let plan = recover(&[], &[], &[], &bw);
    assert!(plan.order.is_empty());
    let plan = recover(&[0, 1, 2], &[0, 1, 2, 2, 9], &[3, 3, 4, 99, 0], &bw);
    assert_eq!(plan.order.len(), 2);
    assert_eq!(plan.removed, vec![0, 1, 2]);
    assert_eq!(plan.ignored_failed, vec![9]);
    assert_eq!(plan.skipped_standby, vec![3, 99, 0]);
    let plan = recover(&[0, 0, 1], &[], &[], &bw);
    assert_eq!(plan.order, vec![0, 1]);
}

#[test]
fn matrix_flags_and_estimates() {
    let mut m = BandwidthMatrix::new(3);
    assert_eq!(m.estimated_pairs(), 6);
    assert!(m.set(0, 1, 250.0, false));
    assert!(!m.set(1, 1, 5.0, false));
    assert!(!m.set(3, 0, 5.0, false));
    assert!(m.set(1, 0, f32::NAN, false));
    assert_eq!(m.get(1, 0), 0.0);
    assert_eq!(m.estimated_pairs(), 4);
    let profiles = [
        LinkProfile {
            up_mbps: 100.0,
            down_mbps: 1000.0,
        },
        LinkProfile {
            up_mbps: 300.0,
            down_mbps: 50.0,
        },
        LinkProfile {
            up_mbps: 800.0,
            down_mbps: 400.0,
        },
    ];
    let regions = vec!["eu".to_string(), "eu".to_string(), "us".to_string()];
    let est = LinkEstimate::default();
    m.fill_estimates(&profiles, &regions, &est);
    assert_eq!(m.get(0, 1), 250.0); // measured, kept
    assert_eq!(m.get(1, 2), 300.0_f32.min(400.0) * 0.5); // cross-region
    assert_eq!(m.get(2, 1), 800.0_f32.min(50.0) * 0.5);
    assert!(m.is_estimated(1, 2) && !m.is_estimated(0, 1));
    let e = BandwidthMatrix::estimate_from_profiles(&profiles, &regions, &est);
    assert_eq!(e.get(1, 0), 300.0_f32.min(1000.0)); // same region
    assert_eq!(e.estimated_pairs(), 6);
    assert_eq!(e.get(7, 0), 0.0);
    assert!(!e.is_estimated(0, 0));
    let f = BandwidthMatrix::from_fn(2, |_, _| -1.0);
    assert_eq!(f.get(0, 1), 0.0);
    assert_eq!(f.estimated_pairs(), 0);
}

#[test]
fn deterministic() {
    let (bw, regions) = random_clustered(200, 4, 9);
    let b = default_builder();
    assert_eq!(b.build(&bw, &regions), b.build(&bw, &regions));
}
