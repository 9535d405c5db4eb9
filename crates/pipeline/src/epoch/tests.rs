//! Tests of the star epoch's decisions ([`super`]) and of the sink's report functions they
//! feed ([`crate::sink::best_loss`], [`crate::sink::reward_shares`]).

use super::*;
use crate::copies::Copying;
use crate::merge::RobustAggregator;
use crate::score::{EpochSecret, QualityScore};
use crate::sink::{best_loss, epoch_report, reward_shares, DeltaReport, EpochReport};
use crate::validate::{validate, Submission, ValidationConfig};
use hanzod_actors::job::TrainingSpec;
use hanzod_actors::ports::DeltaReceipt;
use hanzod_actors::types::{JobId, NodeId};
use hanzod_protocol::hzdl::DeltaDtype;
use hanzod_protocol::identity::Identity;
use proptest::prelude::*;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// A standard normal draw (Box–Muller).
pub(crate) fn gaussian(rng: &mut ChaCha8Rng) -> f32 {
    let u1: f64 = rng.gen_range(f64::MIN_POSITIVE..1.0);
    let u2: f64 = rng.gen::<f64>();
    ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
}

pub(crate) fn gaussian_vec(rng: &mut ChaCha8Rng, len: usize) -> Vec<f32> {
    (0..len).map(|_| gaussian(rng)).collect()
}

fn norm(v: &[f32]) -> f64 {
    v.iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt()
}

fn scaled(v: &[f32], c: f32) -> Vec<f32> {
    v.iter().map(|x| c * x).collect()
}

/// `n` honest-like deltas of `len` coordinates: one common direction (standard normal)
/// plus per-delta standard normal noise times `noise`, drawn from `seed`.
fn honest_like(seed: u64, n: usize, len: usize, noise: f32) -> Vec<Vec<f32>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let common = gaussian_vec(&mut rng, len);
    (0..n)
        .map(|_| {
            common
                .iter()
                .map(|&c| c + noise * gaussian(&mut rng))
                .collect()
        })
        .collect()
}

fn agreements_of(deltas: &[Vec<f32>]) -> Vec<Option<f64>> {
    let views: Vec<Option<&[f32]>> = deltas.iter().map(|d| Some(d.as_slice())).collect();
    agreements(&views)
}

fn some(a: Option<f64>) -> f64 {
    a.expect("an agreement")
}

/// A verdict of `node` (`[node; 32]`) for a delta hashed `[hash; 32]`, with a plain score.
fn verdict(node: u8, hash: u8, outcome: Result<Arc<Vec<f32>>, Rejection>) -> Verdict {
    Verdict {
        node: NodeId([node; 32]),
        delta_hash: [hash; 32],
        loss_before: 1.0,
        norm: Some(1.0),
        loss_after: Some(0.9),
        score: Some(QualityScore::new(0.1, 1.0, None).expect("score")),
        spot_check: None,
        outcome,
    }
}

/// `node`'s verdict rejected as `copying`, and its set-aside entry at `index`.
fn copy(index: usize, node: u8, hash: u8, copying: Copying) -> (Verdict, SetAside) {
    // Never empty: an empty update's group is not merged.
    let delta = Arc::new(vec![f32::from(node) + 1.0; 4]);
    (
        verdict(node, hash, Err(Rejection::Copy(copying.clone()))),
        SetAside {
            index,
            copying,
            delta,
        },
    )
}

/// `merged` is `want` within 1e-4 of `want`'s L2 norm (f32 merge against an f64 reference).
fn assert_close(merged: &[f32], want: &[f64]) {
    let err: f64 = merged
        .iter()
        .zip(want)
        .map(|(&m, &x)| (f64::from(m) - x).powi(2))
        .sum::<f64>()
        .sqrt();
    let scale: f64 = want.iter().map(|x| x * x).sum::<f64>().sqrt();
    assert!(err <= 1e-4 * scale, "{err} vs {scale}");
}

/// The report of a star epoch `star` of `ctx` with its `receipts`, as the sink makes it.
fn star_report(ctx: &EpochContext, receipts: &[DeltaReceipt], star: &StarEpoch) -> EpochReport {
    epoch_report(
        ctx,
        receipts,
        &star.judged,
        (&star.agreement, &star.weights),
        None,
        ("", star.merged.loss_after, star.merged.aggregator),
    )
}

fn node(n: u8) -> NodeId {
    NodeId([n; 32])
}

fn sorted(mut v: Vec<usize>) -> Vec<usize> {
    v.sort_unstable();
    v
}

// ---------------------------------------------------------------------------------------
// agreements
// ---------------------------------------------------------------------------------------

#[test]
fn honest_like_deltas_agree_and_a_sign_flipped_one_does_not() {
    let deltas = honest_like(11, 7, 512, 0.3);
    let honest = agreements_of(&deltas);
    for (k, a) in honest.iter().enumerate() {
        let a = some(*a);
        // cos ≈ 1/√(1 + 0.3²) ≈ 0.96 with the median, norms within a few % of each other.
        assert!(a > 0.8 && a <= 1.0, "delta {k}: {a}");
    }

    let mut flipped = deltas.clone();
    flipped[3] = scaled(&deltas[3], -1.0);
    let a = agreements_of(&flipped);
    assert_eq!(a[3], Some(0.0), "{a:?}");
    for (k, a) in a.iter().enumerate().filter(|(k, _)| *k != 3) {
        assert!(
            some(*a) > 0.8,
            "honest delta {k} next to a flipped one: {a:?}"
        );
    }
}

#[test]
fn pure_noise_of_the_same_norm_agrees_zero() {
    let mut deltas = honest_like(12, 7, 512, 0.3);
    let mut rng = ChaCha8Rng::seed_from_u64(99);
    let noise = gaussian_vec(&mut rng, 512);
    let c = (norm(&deltas[6]) / norm(&noise)) as f32;
    deltas[6] = scaled(&noise, c);
    let a = agreements_of(&deltas);
    assert_eq!(a[6], Some(0.0), "{a:?}");
    assert!(a[..6].iter().all(|x| some(*x) > 0.8), "{a:?}");
}

#[test]
fn a_delta_scaled_up_ten_times_agrees_zero_and_twice_about_half() {
    let deltas = honest_like(13, 7, 512, 0.3);
    let unscaled = some(agreements_of(&deltas)[2]);
    assert!(unscaled > 0.8, "{unscaled}");

    let mut ten = deltas.clone();
    ten[2] = scaled(&deltas[2], 10.0);
    let a = agreements_of(&ten);
    assert_eq!(a[2], Some(0.0), "10 × beyond AGREEMENT_NORM_RATIO: {a:?}");
    assert!(a.iter().filter(|x| some(**x) > 0.8).count() == 6, "{a:?}");

    let mut two = deltas.clone();
    two[2] = scaled(&deltas[2], 2.0);
    let doubled = some(agreements_of(&two)[2]);
    let ratio = doubled / unscaled;
    assert!(
        (ratio - 0.5).abs() < 0.05,
        "{doubled} / {unscaled} = {ratio}"
    );

    // A lazy delta (a tenth of the typical norm) is beyond the ratio too.
    let mut lazy = deltas.clone();
    lazy[2] = scaled(&deltas[2], 0.1);
    assert_eq!(agreements_of(&lazy)[2], Some(0.0));
}

/// On identical directions everything is exact: the median is the common vector, every
/// cosine is 1 and the agreement is the norm term `min(r, 1/r)`, 0 beyond a ratio of 3
/// (the bound itself included in the range).
#[test]
fn agreement_is_the_norm_ratio_on_a_common_direction() {
    let v = vec![1.0f32; 100];
    let cases: [(f32, f64); 7] = [
        (1.0, 1.0),
        (2.0, 0.5),
        (0.5, 0.5),
        (3.0, 1.0 / 3.0),
        (3.5, 0.0),
        (0.25, 0.0),
        (-1.0, 0.0),
    ];
    for (c, want) in cases {
        let deltas = vec![v.clone(), v.clone(), v.clone(), scaled(&v, c)];
        let a = agreements_of(&deltas);
        assert_eq!(a[..3], [Some(1.0); 3], "×{c}: {a:?}");
        let got = some(a[3]);
        assert!((got - want).abs() < 1e-12, "×{c}: {got} vs {want}");
    }
}

#[test]
fn too_few_deltas_or_mismatched_lengths_give_no_agreement() {
    let deltas = honest_like(14, 4, 64, 0.3);
    let (a, b, c, d) = (&deltas[0], &deltas[1], &deltas[2], &deltas[3]);
    // Two given, whatever the padding.
    assert_eq!(agreements(&[Some(a), Some(b)]), vec![None, None]);
    assert_eq!(agreements(&[Some(a), None, Some(b), None]), vec![None; 4]);
    assert_eq!(agreements(&[]), Vec::<Option<f64>>::new());
    // Three given: measured.
    assert!(agreements(&[Some(a), Some(b), Some(c)])
        .iter()
        .all(|x| x.is_some()));
    // One of another length.
    let short = &d[..63];
    assert_eq!(
        agreements(&[Some(a), Some(b), Some(c), Some(short)]),
        vec![None; 4]
    );
    // Empty deltas.
    let empty: &[f32] = &[];
    assert_eq!(agreements(&[Some(empty); 3]), vec![None; 3]);
    // A zero median: two opposite deltas and a zero one.
    let neg = scaled(a, -1.0);
    let zero = vec![0.0f32; 64];
    assert_eq!(
        agreements(&[Some(a), Some(&neg), Some(&zero)]),
        vec![None; 3]
    );
}

#[test]
fn none_inputs_stay_none() {
    let deltas = honest_like(15, 4, 256, 0.3);
    let views = [
        Some(deltas[0].as_slice()),
        None,
        Some(deltas[1].as_slice()),
        Some(deltas[2].as_slice()),
        None,
        Some(deltas[3].as_slice()),
    ];
    let a = agreements(&views);
    assert_eq!(a.len(), 6);
    assert_eq!(a[1], None);
    assert_eq!(a[4], None);
    for k in [0, 2, 3, 5] {
        assert!(some(a[k]) > 0.8, "{a:?}");
    }
}

/// Deltas for the properties: `n` of `len` coordinates, each `scale[i]·u + noise`, some
/// absent.
fn mixed_deltas(seed: u64, len: usize, spec: &[(f32, f32, bool)]) -> Vec<Option<Vec<f32>>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let common = gaussian_vec(&mut rng, len);
    spec.iter()
        .map(|&(scale, noise, present)| {
            let d: Vec<f32> = common
                .iter()
                .map(|&c| scale * c + noise * gaussian(&mut rng))
                .collect();
            present.then_some(d)
        })
        .collect()
}

proptest! {
    #[test]
    fn every_agreement_is_in_the_unit_interval(
        seed in any::<u64>(),
        len in 1usize..200,
        spec in proptest::collection::vec((-4.0f32..4.0, 0.0f32..2.0, proptest::bool::weighted(0.85)), 0..9),
    ) {
        let deltas = mixed_deltas(seed, len, &spec);
        let views: Vec<Option<&[f32]>> = deltas.iter().map(|d| d.as_deref()).collect();
        let a = agreements(&views);
        prop_assert_eq!(a.len(), views.len());
        let given = views.iter().filter(|v| v.is_some()).count();
        for (x, v) in a.iter().zip(&views) {
            if v.is_none() {
                prop_assert_eq!(*x, None);
            }
            if let Some(x) = x {
                prop_assert!((0.0..=1.0).contains(x), "{}", x);
            }
        }
        if given < AGREEMENT_MIN_DELTAS {
            prop_assert!(a.iter().all(Option::is_none));
        }
        // Either every given delta is measured or none is.
        let measured = a.iter().filter(|x| x.is_some()).count();
        prop_assert!(measured == 0 || measured == given, "{} of {}", measured, given);
    }

    #[test]
    fn permuting_the_deltas_permutes_their_agreements(
        seed in any::<u64>(),
        len in 16usize..200,
        spec in proptest::collection::vec((-1.0f32..3.0, 0.0f32..1.0, proptest::bool::weighted(0.85)), 3..9),
        shuffle in any::<u64>(),
    ) {
        let deltas = mixed_deltas(seed, len, &spec);
        let views: Vec<Option<&[f32]>> = deltas.iter().map(|d| d.as_deref()).collect();
        let a = agreements(&views);
        let mut order: Vec<usize> = (0..views.len()).collect();
        order.shuffle(&mut ChaCha8Rng::seed_from_u64(shuffle));
        let permuted: Vec<Option<&[f32]>> = order.iter().map(|&k| views[k]).collect();
        let b = agreements(&permuted);
        for (i, &k) in order.iter().enumerate() {
            prop_assert_eq!(b[i], a[k], "position {} (was {})", i, k);
        }
    }
}

// ---------------------------------------------------------------------------------------
// copy_groups, reject_copies
// ---------------------------------------------------------------------------------------

#[test]
fn a_chain_of_copies_is_one_group_represented_by_its_smallest_hash() {
    // 0: accepted; 1 → 2 → 3 (1 duplicates 2, 2 and 3 near copies of each other).
    let (v1, s1) = copy(1, 1, 30, Copying::Duplicate { of: node(2) });
    let (v2, s2) = copy(
        2,
        2,
        20,
        Copying::NearCopy {
            of: node(3),
            cosine: 0.999,
        },
    );
    let (v3, s3) = copy(
        3,
        3,
        10,
        Copying::NearCopy {
            of: node(2),
            cosine: 0.999,
        },
    );
    let judged = vec![verdict(0, 0, Ok(Arc::new(vec![1.0; 4]))), v1, v2, v3];
    let set_aside = vec![s1.clone(), s2.clone(), s3.clone()];
    assert_eq!(copy_groups(&judged, &set_aside, None), vec![3]);
    // The representative is the smallest hash, wherever it sits.
    let mut judged2 = judged.clone();
    judged2[1].delta_hash = [5; 32];
    assert_eq!(copy_groups(&judged2, &set_aside, None), vec![1]);
    // The set-aside order does not matter.
    assert_eq!(copy_groups(&judged, &[s3, s1, s2], None), vec![3]);
}

#[test]
fn empty_updates_and_re_uploads_of_the_last_merge_form_no_group() {
    let (v1, s1) = copy(1, 1, 1, Copying::NoUpdate);
    let (v2, s2) = copy(2, 2, 2, Copying::CopiesLastMerged { cosine: 0.999 });
    let (v3, s3) = copy(3, 3, 3, Copying::NoUpdate);
    let judged = vec![verdict(0, 0, Ok(Arc::new(vec![1.0; 4]))), v1, v2, v3];
    assert!(copy_groups(&judged, &[s1, s2, s3], None).is_empty());
    assert!(copy_groups(&judged, &[], None).is_empty());
}

#[test]
fn two_separate_pairs_give_two_representatives() {
    let (v0, s0) = copy(0, 10, 40, Copying::Duplicate { of: node(11) });
    let (v1, s1) = copy(1, 11, 40, Copying::Duplicate { of: node(10) });
    let (v2, s2) = copy(
        2,
        12,
        70,
        Copying::NearCopy {
            of: node(13),
            cosine: 0.998,
        },
    );
    let (v3, s3) = copy(
        3,
        13,
        60,
        Copying::NearCopy {
            of: node(12),
            cosine: 0.998,
        },
    );
    let (v4, s4) = copy(4, 14, 1, Copying::NoUpdate);
    let judged = vec![v0, v1, v2, v3, v4];
    let groups = copy_groups(&judged, &[s0, s1, s2, s3, s4], None);
    // A duplicate pair shares its hash: one of the two (the first), and 3 (hash 60 < 70).
    assert_eq!(sorted(groups), vec![0, 3]);
}

#[test]
fn a_copy_of_a_node_not_set_aside_forms_no_group() {
    // Node 2's delta was rejected for another reason (or never accepted): nothing to link.
    let (v1, s1) = copy(1, 1, 9, Copying::Duplicate { of: node(2) });
    let judged = vec![
        verdict(0, 0, Ok(Arc::new(vec![1.0; 4]))),
        v1,
        verdict(2, 9, Err(Rejection::Format("bad".into()))),
    ];
    assert!(copy_groups(&judged, &[s1], None).is_empty());
}

proptest! {
    /// The groups are the connected components of the copy links (between set-aside
    /// deltas), each represented by its smallest hash, in whatever order the set-aside
    /// entries come.
    #[test]
    fn copy_groups_are_the_components_of_the_links(
        kinds in proptest::collection::vec((0u8..5, any::<prop::sample::Index>()), 2..12),
        hash_seed in any::<u64>(),
        shuffle in any::<u64>(),
    ) {
        let n = kinds.len();
        // Distinct hashes, in a random order relative to the indices.
        let mut hashes: Vec<u8> = (0..n as u8).collect();
        hashes.shuffle(&mut ChaCha8Rng::seed_from_u64(hash_seed));
        let mut judged = Vec::new();
        let mut set_aside = Vec::new();
        let mut links: Vec<(usize, usize)> = Vec::new();
        for (k, (kind, other)) in kinds.iter().enumerate() {
            let of = {
                let j = other.index(n - 1);
                if j >= k { j + 1 } else { j }
            };
            let copying = match kind {
                0 => None,
                1 => Some(Copying::NoUpdate),
                2 => Some(Copying::CopiesLastMerged { cosine: 0.999 }),
                3 => Some(Copying::Duplicate { of: node(of as u8) }),
                _ => Some(Copying::NearCopy { of: node(of as u8), cosine: 0.999 }),
            };
            match copying {
                None => judged.push(verdict(k as u8, hashes[k], Ok(Arc::new(vec![1.0; 4])))),
                Some(c) => {
                    if *kind >= 3 {
                        links.push((k, of));
                    }
                    let (v, s) = copy(k, k as u8, hashes[k], c);
                    judged.push(v);
                    set_aside.push(s);
                }
            }
        }
        let aside: BTreeSet<usize> = set_aside.iter().map(|s| s.index).collect();
        // Components by a plain graph search over the links between set-aside deltas.
        let mut adjacent: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for &(a, b) in links.iter().filter(|(_, b)| aside.contains(b)) {
            adjacent.entry(a).or_default().push(b);
            adjacent.entry(b).or_default().push(a);
        }
        let mut seen = BTreeSet::new();
        let mut want = Vec::new();
        for &start in adjacent.keys() {
            if !seen.insert(start) {
                continue;
            }
            let (mut stack, mut best) = (vec![start], start);
            while let Some(k) = stack.pop() {
                if hashes[k] < hashes[best] {
                    best = k;
                }
                for &j in &adjacent[&k] {
                    if seen.insert(j) {
                        stack.push(j);
                    }
                }
            }
            want.push(best);
        }
        prop_assert_eq!(sorted(copy_groups(&judged, &set_aside, None)), sorted(want.clone()));
        set_aside.shuffle(&mut ChaCha8Rng::seed_from_u64(shuffle));
        prop_assert_eq!(sorted(copy_groups(&judged, &set_aside, None)), sorted(want));
    }
}

#[test]
fn reject_copies_sets_aside_duplicates_and_empty_updates_with_their_deltas() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let a = Arc::new(gaussian_vec(&mut rng, 64));
    let b = Arc::new(gaussian_vec(&mut rng, 64));
    let c = Arc::new(gaussian_vec(&mut rng, 64));
    let mut judged = vec![
        verdict(1, 1, Ok(a.clone())),
        verdict(2, 1, Ok(a.clone())),
        verdict(3, 3, Ok(b.clone())),
        verdict(4, 4, Ok(Arc::new(vec![0.0; 64]))),
        verdict(5, 5, Err(Rejection::Format("bad".into()))),
        verdict(6, 6, Ok(c.clone())),
    ];
    let set_aside = reject_copies(&mut judged, None);
    let flagged: Vec<usize> = set_aside.iter().map(|s| s.index).collect();
    assert_eq!(sorted(flagged), vec![0, 1, 3]);
    for s in &set_aside {
        assert_eq!(
            judged[s.index].outcome,
            Err(Rejection::Copy(s.copying.clone()))
        );
        match s.index {
            0 => {
                assert_eq!(s.copying, Copying::Duplicate { of: node(2) });
                assert_eq!(s.delta, a);
            }
            1 => assert_eq!(s.copying, Copying::Duplicate { of: node(1) }),
            _ => assert_eq!(s.copying, Copying::NoUpdate),
        }
    }
    assert_eq!(judged[2].outcome, Ok(b));
    assert_eq!(judged[5].outcome, Ok(c));
    assert!(matches!(judged[4].outcome, Err(Rejection::Format(_))));
    // The duplicate pair is one group (hash tie: the first); the empty update none.
    assert_eq!(copy_groups(&judged, &set_aside, None), vec![0]);
}

// ---------------------------------------------------------------------------------------
// merge_limit, refused_loss
// ---------------------------------------------------------------------------------------

#[test]
fn the_merge_limit_is_2_percent_over_the_best_or_the_base() {
    let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
    // No best yet: the base is the best, 2 % over it.
    assert!(close(merge_limit(1.0, None), 1.02));
    assert!(close(merge_limit(2.0, None), 2.04));
    // A better checkpoint earlier: 2 % over it.
    assert!(close(merge_limit(1.0, Some(0.5)), 0.51));
    assert!(close(merge_limit(1.0, Some(0.9)), 0.918));
    // A "best" above the base is ignored.
    assert!(close(merge_limit(1.0, Some(2.0)), 1.02));
    assert!(close(merge_limit(1.0, Some(1.0)), 1.02));
}

#[test]
fn a_refused_merge_says_which_bound_it_broke() {
    assert_eq!(
        refused_loss("median", 1.0, None, 1.2),
        "the median merge would raise the validation loss from 1.000000 to 1.200000"
    );
    // A best above the base is the base's own bound.
    assert_eq!(
        refused_loss("median", 1.0, Some(3.0), 1.2),
        "the median merge would raise the validation loss from 1.000000 to 1.200000"
    );
    let why = refused_loss("weighted_mean", 1.0, Some(0.5), 0.6);
    assert_eq!(
        why,
        "the weighted_mean merge would give a validation loss of 0.600000, above 0.510000 \
         (the job's best checkpoint has 0.500000; the base 1.000000)"
    );
}

proptest! {
    #[test]
    fn the_merge_limit_is_within_both_bounds(
        before in 1e-6f64..1e3,
        best in proptest::option::of(1e-6f64..1e3),
    ) {
        let limit = merge_limit(before, best);
        prop_assert!(limit <= before * (1.0 + DRIFT_TOLERANCE) * (1.0 + 1e-12));
        if let Some(b) = best {
            prop_assert!(limit <= b * (1.0 + DRIFT_TOLERANCE));
            // Never below the best checkpoint itself: matching it is always allowed.
            prop_assert!(limit >= b.min(before));
        }
        prop_assert!(limit >= before.min(best.unwrap_or(before)));
        // A higher best never lowers the limit.
        if let Some(b) = best {
            prop_assert!(merge_limit(before, Some(b * 1.5)) >= limit);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Norms
// ---------------------------------------------------------------------------------------

#[test]
fn norms_are_folded_in_hash_order_and_non_finite_ones_skipped() {
    let start = NormTracker::from_average(Some(1.0)).expect("tracker");
    let got = fold_norms(
        start,
        vec![([2; 32], 3.0), ([9; 32], f64::NAN), ([1; 32], 2.0)],
    );
    // 2.0 first (hash 1), then 3.0: 0.95·(0.95·1 + 0.05·2) + 0.05·3.
    let want = 0.95 * (0.95 + 0.05 * 2.0) + 0.05 * 3.0;
    assert!(
        (got.average().expect("avg") - want).abs() < 1e-12,
        "{got:?}"
    );
    // Arrival order would give another value.
    let arrival = 0.95 * (0.95 + 0.05 * 3.0) + 0.05 * 2.0;
    assert!((want - arrival).abs() > 1e-6);
    assert_eq!(
        fold_norms(NormTracker::new(), Vec::new()),
        NormTracker::new()
    );
}

proptest! {
    #[test]
    fn folding_norms_does_not_depend_on_their_order(
        start in proptest::option::of(1e-3f64..1e3),
        norms in proptest::collection::btree_map(any::<[u8; 32]>(), 0.0f64..1e3, 0..24),
        shuffle in any::<u64>(),
    ) {
        let tracker = NormTracker::from_average(start).expect("tracker");
        let mut list: Vec<([u8; 32], f64)> = norms.into_iter().collect();
        let sorted_fold = fold_norms(tracker, list.clone());
        list.shuffle(&mut ChaCha8Rng::seed_from_u64(shuffle));
        prop_assert_eq!(fold_norms(tracker, list.clone()), sorted_fold);
        list.reverse();
        prop_assert_eq!(fold_norms(tracker, list), sorted_fold);
    }
}

#[test]
fn star_norms_are_the_accepted_not_suspect_deltas() {
    let mut outlier = verdict(3, 3, Ok(Arc::new(vec![1.0; 4])));
    outlier.norm = Some(10.0);
    outlier.rescore(&NormTracker::from_average(Some(1.0)).expect("tracker"));
    assert!(outlier.suspect());
    let mut unmeasured = verdict(4, 4, Ok(Arc::new(vec![1.0; 4])));
    unmeasured.norm = None;
    let judged = vec![
        verdict(1, 1, Ok(Arc::new(vec![1.0; 4]))),
        verdict(2, 2, Err(Rejection::Format("bad".into()))),
        outlier,
        unmeasured,
    ];
    assert_eq!(star_norms(&judged, &[]), vec![([1; 32], 1.0)]);
}

#[test]
fn a_first_epoch_seeds_its_norms_and_rescores_later_ones_do_not() {
    let mut judged: Vec<Verdict> = [1.0, 2.0, 40.0]
        .iter()
        .enumerate()
        .map(|(k, &n)| {
            let mut v = verdict(k as u8, k as u8, Ok(Arc::new(vec![1.0; 4])));
            v.norm = Some(n);
            v
        })
        .collect();
    // A running average: kept, nothing rescored.
    let running = NormTracker::from_average(Some(5.0)).expect("tracker");
    let before: Vec<_> = judged.iter().map(|v| v.score).collect();
    assert_eq!(seed_epoch_norms(running, None, &mut judged), running);
    assert_eq!(judged.iter().map(|v| v.score).collect::<Vec<_>>(), before);
    // A first epoch: the median norm, and the outlier now suspect.
    let seeded = seed_epoch_norms(NormTracker::new(), None, &mut judged);
    assert_eq!(seeded.average(), Some(2.0));
    assert!(judged[2].suspect());
    assert!(!judged[0].suspect() && !judged[1].suspect());
}

// ---------------------------------------------------------------------------------------
// star_epoch on the wine MLP
// ---------------------------------------------------------------------------------------

/// The wine MLP job, its initial weights, and eight nodes' honest local runs of epoch 0.
struct Wine {
    trainer: Trainer,
    base: Arc<Weights>,
    loss_before: f64,
    ids: Vec<Identity>,
    /// (delta, claimed loss) per node.
    runs: Vec<(Vec<f32>, f64)>,
}

/// A job's epoch 0 under `trainer`: its initial weights and their validation loss, the
/// nodes of key seeds `seeds`, and each one's honest local run (delta, claimed loss).
#[allow(clippy::type_complexity)] // the fixture's four parts, destructured at once
fn epoch_zero(
    trainer: &Trainer,
    seeds: std::ops::RangeInclusive<u8>,
) -> (Arc<Weights>, f64, Vec<Identity>, Vec<(Vec<f32>, f64)>) {
    let base = Arc::new(trainer.init());
    let loss_before = trainer.validation_loss(&base).expect("loss");
    let ids: Vec<Identity> = seeds.map(|i| Identity::from_seed([i; 32])).collect();
    let runs = ids
        .iter()
        .map(|id| {
            let run = trainer
                .local_delta(&base, &id.node_id().0, 0)
                .expect("local run");
            (run.delta.data, run.claimed_loss)
        })
        .collect();
    (base, loss_before, ids, runs)
}

fn wine() -> &'static Wine {
    static WINE: OnceLock<Wine> = OnceLock::new();
    WINE.get_or_init(|| {
        let trainer =
            hanzod_train::trainer_of(&TrainingSpec::default(), JobId(1)).expect("trainer");
        let (base, loss_before, ids, runs) = epoch_zero(&trainer, 1..=8);
        Wine {
            trainer,
            base,
            loss_before,
            ids,
            runs,
        }
    })
}

fn wine_context(w: &Wine) -> EpochContext {
    EpochContext {
        job: 1,
        epoch: 0,
        trainer: w.trainer.clone(),
        base: w.base.clone(),
        base_version: 0,
        loss_before: w.loss_before,
        best_loss: None,
        norms: NormTracker::new(),
        last_merged: None,
        secret: EpochSecret::from_bytes([9; 32]),
        config: ValidationConfig {
            spot_check_rate: 0.0,
            ..ValidationConfig::default()
        },
    }
}

/// `data` uploaded by `id` for job 1, epoch 0, step 0, signed, as f32 HZDL.
fn upload(w: &Wine, id: &Identity, data: Vec<f32>, claimed_loss: f64) -> Submission {
    let payload = Weights {
        layout: w.trainer.delta_layout(),
        data,
    }
    .to_delta_bytes_as(0, DeltaDtype::F32)
    .expect("payload");
    crate::validate::lora_tests::submit(id, payload, claimed_loss)
}

fn policy() -> StarPolicy {
    StarPolicy {
        outer_lr: TrainingSpec::default().outer_lr as f32,
        suspect_threshold: 0.30,
        robust_aggregator: RobustAggregator::Median,
        robust_alone: false,
    }
}

/// Validates `subs` and runs the star epoch on them; returns the receipts too.
fn run_star(ctx: &EpochContext, subs: &[Submission]) -> (Vec<DeltaReceipt>, StarEpoch) {
    run_star_with(ctx, subs, &policy())
}

/// [`run_star`] under `policy`.
fn run_star_with(
    ctx: &EpochContext,
    subs: &[Submission],
    policy: &StarPolicy,
) -> (Vec<DeltaReceipt>, StarEpoch) {
    let judged = subs.iter().map(|s| validate(ctx, s)).collect();
    let star = star_epoch(ctx, judged, policy);
    (subs.iter().map(|s| s.receipt.clone()).collect(), star)
}

/// Which aggregator merges a star epoch, and what it pays: `honest` honest wine deltas
/// and `scaled` ones scaled by −10 (norm outliers: suspect), under `policy`.
fn merge_choice(honest: usize, scaled: usize, policy: &StarPolicy) -> (StarEpoch, Vec<f64>) {
    let w = wine();
    let ctx = wine_context(w);
    let subs: Vec<Submission> = (0..honest + scaled)
        .map(|i| {
            let (own, claimed) = &w.runs[i];
            let data = if i < honest {
                own.clone()
            } else {
                self::scaled(own, -10.0)
            };
            upload(w, &w.ids[i], data, *claimed)
        })
        .collect();
    let (receipts, star) = run_star_with(&ctx, &subs, policy);
    let report = star_report(&ctx, &receipts, &star);
    let paid: BTreeMap<NodeId, f64> = reward_shares(&report).into_iter().collect();
    let shares = star
        .judged
        .iter()
        .map(|v| paid.get(&v.node).copied().unwrap_or(0.0))
        .collect();
    (star, shares)
}

/// The merge policy's branches (issue 19): with an agreement (3+ deltas) the weighted mean
/// goes first however many are suspect; `robust_alone` forces the median; without an
/// agreement (2 deltas) more than 30 % suspect switches to the median alone. In every
/// branch each delta is paid its merit (composite × agreement, 0 when suspect), never the
/// robust aggregator's weight of 1, so the scaled deltas earn nothing.
#[test]
fn the_weighted_mean_goes_first_when_the_epoch_has_an_agreement() {
    let check_pay = |star: &StarEpoch, shares: &[f64], honest: usize| {
        for (k, v) in star.judged.iter().enumerate() {
            let merit = star_weight(v, star.agreement[k]);
            assert!(
                (shares[k] - merit).abs() <= 1e-12,
                "delta {k}: paid {} merit {merit}",
                shares[k]
            );
            if k >= honest {
                assert_eq!(shares[k], 0.0, "a scaled delta was paid: {shares:?}");
            }
        }
    };
    // 3 of 8 suspect (37.5 % > 30 %), but the epoch has an agreement.
    let (star, shares) = merge_choice(5, 3, &policy());
    assert_eq!(
        star.suspect,
        3,
        "{:?}",
        star.judged.iter().map(Verdict::suspect).collect::<Vec<_>>()
    );
    assert_eq!(
        star.merged.aggregator,
        Some("weighted_mean"),
        "{:?}",
        star.merged.kept
    );
    assert!(
        star.weights[5..].iter().all(|&w| w == 0.0),
        "{:?}",
        star.weights
    );
    assert!(star.merged.loss_after < wine().loss_before);
    check_pay(&star, &shares, 5);
    // The same epoch with the robust aggregator forced: every merged delta weighs 1, and is
    // still paid by merit.
    let alone = StarPolicy {
        robust_alone: true,
        ..policy()
    };
    let (star, shares) = merge_choice(5, 3, &alone);
    assert_eq!(
        star.merged.aggregator,
        Some("median"),
        "{:?}",
        star.merged.kept
    );
    assert!(star.weights.iter().all(|&w| w == 1.0), "{:?}", star.weights);
    check_pay(&star, &shares, 5);
    // Two deltas, one suspect (50 % > 30 %): no agreement, the median alone.
    let (star, shares) = merge_choice(1, 1, &policy());
    assert!(
        star.agreement.iter().all(Option::is_none),
        "{:?}",
        star.agreement
    );
    assert_eq!(star.suspect, 1);
    assert_eq!(
        star.merged.aggregator.is_some_and(|a| a != "weighted_mean"),
        star.merged.kept.is_none(),
        "{:?}",
        star.merged
    );
    check_pay(&star, &shares, 1);
}

#[test]
fn a_sign_flipped_delta_gets_no_weight_and_the_honest_merge_advances() {
    let w = wine();
    let ctx = wine_context(w);
    let mut subs: Vec<Submission> = (0..5)
        .map(|i| upload(w, &w.ids[i], w.runs[i].0.clone(), w.runs[i].1))
        .collect();
    let (own, claimed) = &w.runs[5];
    subs.push(upload(w, &w.ids[5], scaled(own, -1.0), *claimed));
    let (_, star) = run_star(&ctx, &subs);

    assert_eq!(star.judged.len(), 6);
    assert!(
        star.judged.iter().all(|v| v.outcome.is_ok()),
        "every delta passes validation (no spot-check): {:?}",
        star.judged.iter().map(|v| &v.outcome).collect::<Vec<_>>()
    );
    assert_eq!(star.agreement[5], Some(0.0), "{:?}", star.agreement);
    assert_eq!(star.weights[5], 0.0, "{:?}", star.weights);
    for k in 0..5 {
        assert!(some(star.agreement[k]) > 0.0, "{:?}", star.agreement);
        assert!(star.weights[k] > 0.0, "{:?}", star.weights);
    }
    // Only the flipped delta may be suspect (it can double the loss on its own).
    assert!(star.judged[..5].iter().all(|v| !v.suspect()));
    assert!(star.suspect <= 1);
    assert_eq!(star.merged.aggregator, Some("weighted_mean"));
    assert!(star.merged.kept.is_none());
    assert!(
        star.merged.loss_after < w.loss_before,
        "{} vs {}",
        star.merged.loss_after,
        w.loss_before
    );
    // The merged update is the weighted mean of the honest deltas alone.
    let total: f64 = star.weights.iter().sum();
    let merged = star.merged.delta.as_ref().expect("a merged update");
    let mut want = vec![0.0f64; merged.len()];
    for k in 0..5 {
        for (o, &x) in want.iter_mut().zip(&w.runs[k].0) {
            *o += star.weights[k] / total * f64::from(x);
        }
    }
    assert_close(merged, &want);
}

#[test]
fn two_nodes_uploading_the_same_bytes_are_merged_once_and_neither_is_paid() {
    let w = wine();
    let ctx = wine_context(w);
    let mut subs: Vec<Submission> = (0..6)
        .map(|i| upload(w, &w.ids[i], w.runs[i].0.clone(), w.runs[i].1))
        .collect();
    // Node 6 uploads node 2's delta as its own (signed by itself: the same bytes).
    subs.push(upload(w, &w.ids[6], w.runs[2].0.clone(), w.runs[2].1));
    let (receipts, star) = run_star(&ctx, &subs);
    assert_eq!(receipts[2].delta_hash, receipts[6].delta_hash);

    let copies = [2usize, 6];
    for &k in &copies {
        assert!(
            matches!(
                star.judged[k].outcome,
                Err(Rejection::Copy(Copying::Duplicate { .. }))
            ),
            "{k}: {:?}",
            star.judged[k].outcome
        );
    }
    for k in [0, 1, 3, 4, 5] {
        assert!(
            star.judged[k].outcome.is_ok(),
            "{k}: {:?}",
            star.judged[k].outcome
        );
    }
    let weighed: Vec<usize> = copies
        .iter()
        .copied()
        .filter(|&k| star.weights[k] > 0.0)
        .collect();
    assert_eq!(
        weighed.len(),
        1,
        "the group is merged once: {:?}",
        star.weights
    );
    let rep = weighed[0];
    assert!(star.agreement[rep].is_some(), "{:?}", star.agreement);
    let other = if rep == 2 { 6 } else { 2 };
    assert_eq!(star.agreement[other], None, "{:?}", star.agreement);
    // Copies are not suspect: the weighted mean, whatever their number.
    assert_eq!(star.suspect, 0);
    assert_eq!(star.merged.aggregator, Some("weighted_mean"));
    assert!(star.merged.loss_after < w.loss_before);
    // The merge counts node 2's delta once: the weighted mean of six distinct deltas.
    let total: f64 = star.weights.iter().sum();
    let merged = star.merged.delta.as_ref().expect("a merged update");
    let mut want = vec![0.0f64; merged.len()];
    for (k, wk) in star.weights.iter().enumerate() {
        let data = if k == 6 { &w.runs[2].0 } else { &w.runs[k].0 };
        for (o, &x) in want.iter_mut().zip(data) {
            *o += wk / total * f64::from(x);
        }
    }
    assert_close(merged, &want);

    let report = star_report(&ctx, &receipts, &star);
    let shares = reward_shares(&report);
    let paid: BTreeSet<NodeId> = shares.iter().map(|(n, _)| *n).collect();
    for &k in &copies {
        assert!(!paid.contains(&w.ids[k].node_id()), "{k} paid: {shares:?}");
    }
    for k in [0, 1, 3, 4, 5] {
        assert!(paid.contains(&w.ids[k].node_id()), "{k} unpaid: {shares:?}");
    }
    assert!(shares.iter().all(|(_, s)| *s > 0.0), "{shares:?}");
}

// ---------------------------------------------------------------------------------------
// best_loss, reward_shares
// ---------------------------------------------------------------------------------------

/// A report of `epoch` from `loss_before` to `loss_after`, merged by `aggregator`
/// (`None`: kept), with `deltas`.
fn report(
    epoch: u32,
    loss_before: f64,
    loss_after: f64,
    aggregator: Option<&'static str>,
    deltas: Vec<DeltaReport>,
) -> EpochReport {
    let mut r = epoch_report(
        report_ctx(),
        &[],
        &[],
        (&[], &[]),
        None,
        ("", loss_after, aggregator),
    );
    r.epoch = epoch;
    r.loss_before = loss_before;
    r.deltas = deltas;
    r
}

/// The context of [`report`]'s epochs: job 1, epoch 0, the default recipe.
fn report_ctx() -> &'static EpochContext {
    static CTX: OnceLock<EpochContext> = OnceLock::new();
    CTX.get_or_init(|| {
        let trainer =
            hanzod_train::trainer_of(&TrainingSpec::default(), JobId(1)).expect("trainer");
        EpochContext {
            job: 1,
            epoch: 0,
            base: Arc::new(trainer.init()),
            trainer,
            base_version: 0,
            loss_before: 1.0,
            best_loss: None,
            norms: NormTracker::new(),
            last_merged: None,
            secret: EpochSecret::from_bytes([9; 32]),
            config: ValidationConfig::default(),
        }
    })
}

#[test]
fn the_best_loss_starts_from_the_first_base_and_skips_kept_epochs() {
    assert_eq!(best_loss(&[]), None);
    // The start counts: no merge below it.
    let rs = [report(0, 1.0, 1.01, Some("weighted_mean"), vec![])];
    assert_eq!(best_loss(&rs), Some((None, 1.0)));
    // A merge below it.
    let rs = [
        report(0, 1.0, 0.9, Some("weighted_mean"), vec![]),
        report(1, 0.9, 0.95, Some("weighted_mean"), vec![]),
        // A kept epoch does not count, whatever its loss says.
        report(2, 0.95, 0.5, None, vec![]),
        report(3, 0.95, 0.93, Some("median"), vec![]),
    ];
    assert_eq!(best_loss(&rs), Some((Some(0), 0.9)));
    // In any order: the earliest report's base is the start.
    let reversed: Vec<&EpochReport> = rs.iter().rev().collect();
    assert_eq!(best_loss(reversed), Some((Some(0), 0.9)));
    // Without epoch 0's report, epoch 1's base is the start.
    assert_eq!(best_loss(&rs[1..]), Some((None, 0.9)));
    // A later report's base does not count (only its checkpoint does).
    let rs = [
        report(0, 1.0, 0.9, Some("weighted_mean"), vec![]),
        report(1, 0.5, 0.95, Some("weighted_mean"), vec![]),
    ];
    assert_eq!(best_loss(&rs), Some((Some(0), 0.9)));
}

#[test]
fn best_loss_ties_go_to_the_earlier_epoch() {
    let rs = [
        report(0, 1.0, 0.9, Some("weighted_mean"), vec![]),
        report(1, 0.9, 0.9, Some("weighted_mean"), vec![]),
        report(2, 0.9, 0.9, Some("median"), vec![]),
    ];
    assert_eq!(best_loss(&rs), Some((Some(0), 0.9)));
    // A merge that only matches the start: the start.
    let rs = [report(0, 1.0, 1.0, Some("weighted_mean"), vec![])];
    assert_eq!(best_loss(&rs), Some((None, 1.0)));
    // A non-finite start is not a checkpoint.
    let rs = [report(0, f64::NAN, 2.0, Some("weighted_mean"), vec![])];
    assert_eq!(best_loss(&rs), Some((Some(0), 2.0)));
}

proptest! {
    /// The best is the lowest of the first base and the merged epochs' losses, at the
    /// earliest epoch that reached it, in any order of the reports.
    #[test]
    fn the_best_loss_is_the_earliest_lowest(
        start in 0.1f64..2.0,
        epochs in proptest::collection::vec((0.1f64..2.0, proptest::bool::ANY), 1..12),
        shuffle in any::<u64>(),
    ) {
        // Losses on a coarse grid so that ties happen.
        let grid = |x: f64| (x * 10.0).round() / 10.0;
        let mut before = grid(start);
        let mut rs = Vec::new();
        for (e, (after, merged)) in epochs.iter().enumerate() {
            let (after, agg) = if *merged { (grid(*after), Some("weighted_mean")) } else { (before, None) };
            rs.push(report(e as u32, before, after, agg, vec![]));
            before = after;
        }
        let mut want = (None, grid(start));
        for r in rs.iter().filter(|r| r.aggregator.is_some()) {
            if r.loss_after < want.1 {
                want = (Some(r.epoch), r.loss_after);
            }
        }
        let mut shuffled: Vec<&EpochReport> = rs.iter().collect();
        shuffled.shuffle(&mut ChaCha8Rng::seed_from_u64(shuffle));
        prop_assert_eq!(best_loss(shuffled), Some(want));
        prop_assert_eq!(best_loss(&rs), Some(want));
    }
}

/// A line of `node` (`[node; 32]` in hex) with the score of `dl`, stability 1, no
/// convergence.
fn line(node: u8, dl: f64) -> DeltaReport {
    DeltaReport {
        node: hex::encode([node; 32]),
        delta_hash: hex::encode([node; 32]),
        claimed_loss: 1.0,
        loss_after: Some(1.0 - dl),
        norm: Some(1.0),
        score: Some(QualityScore::new(dl, 1.0, None).expect("score")),
        weight: 0.0,
        suspect: false,
        agreement: None,
        spot_check: None,
        rejected: None,
        excluded: None,
    }
}

fn kept_and_merged_lines() -> Vec<DeltaReport> {
    let mut lines = vec![line(1, 0.2), line(2, 0.0), line(3, 0.3), line(4, 0.3)];
    lines[2].suspect = true;
    lines[3].rejected = Some(Rejection::Format("bad".into()));
    let mut low = line(5, 0.1);
    low.agreement = Some(0.25);
    lines.push(low);
    let mut excluded = line(6, 0.3);
    excluded.excluded = Some("left out".into());
    lines.push(excluded);
    let mut unparsable = line(7, 0.3);
    unparsable.node = "not hex".into();
    lines.push(unparsable);
    let mut unscored = line(8, 0.3);
    unscored.score = None;
    lines.push(unscored);
    lines
}

proptest! {
    /// A star epoch pays exactly what it weighs: for accepted deltas of any measurements
    /// (loss rise or fall, norm outlier or not, with or without an agreement), the share
    /// `reward_shares` reads from the epoch report is the delta's weight in the weighted
    /// mean (`star_weight`), and a delta of weight 0 is not paid. A kept epoch pays the
    /// same weights, only to the deltas that lowered the loss on their own.
    #[test]
    fn a_star_epoch_pays_each_delta_its_weight_in_the_merge(
        lines in proptest::collection::vec(
            (-0.5f64..1.5, prop_oneof![Just(1.0f64), 0.0f64..1.0], proptest::option::of(0.0f64..=1.0)),
            1..12,
        ),
        kept in any::<bool>(),
    ) {
        let loss_before = 1.0;
        let mut judged = Vec::new();
        let mut receipts = Vec::new();
        let mut agreement = Vec::new();
        for (k, (rise, stability, a)) in lines.iter().enumerate() {
            let node = node(k as u8 + 1);
            let loss_after = loss_before * (1.0 + rise);
            let dl = crate::score::loss_improvement(loss_before, loss_after).expect("dl");
            let score = QualityScore::new(dl, *stability, None).expect("score");
            judged.push(Verdict {
                node,
                delta_hash: [k as u8; 32],
                loss_before,
                norm: Some(1.0),
                loss_after: Some(loss_after),
                score: Some(score),
                spot_check: None,
                outcome: Ok(Arc::new(vec![0.5; 4])),
            });
            receipts.push(DeltaReceipt {
                job: JobId(1),
                node,
                epoch: 0,
                step: 0,
                delta_hash: [k as u8; 32],
                claimed_loss: 1.0,
                signature: vec![0; 64],
            });
            agreement.push(*a);
        }
        let weights: Vec<f64> = judged.iter().zip(&agreement).map(|(v, a)| star_weight(v, *a)).collect();
        let mut r = report(0, loss_before, loss_before, None, Vec::new());
        let aggregator = (!kept).then(|| WeightedMean.name());
        let real = epoch_report(
            report_ctx(),
            &receipts,
            &judged,
            (&agreement, &weights),
            None,
            ("", loss_before, aggregator),
        );
        r.deltas = real.deltas;
        r.aggregator = real.aggregator;
        let paid: BTreeMap<NodeId, f64> = reward_shares(&r).into_iter().collect();
        for (k, v) in judged.iter().enumerate() {
            let improved = v.score.expect("score").loss_improvement > 0.0;
            let want = if kept && !improved { 0.0 } else { weights[k] };
            let got = paid.get(&v.node).copied().unwrap_or(0.0);
            prop_assert!((got - want).abs() <= 1e-12 * want.max(1.0), "delta {}: paid {} weighs {}", k, got, want);
        }
    }
}

#[test]
fn a_kept_epoch_pays_the_accepted_not_suspect_deltas_that_improved_by_composite_and_agreement() {
    let lines = kept_and_merged_lines();
    let composite = |k: usize| lines[k].score.expect("score").composite;
    let r = report(0, 1.0, 1.0, None, lines.clone());
    let shares = reward_shares(&r);
    // 1 (dl 0.2) and 5 (dl 0.1, by its composite times its agreement); not 2 (no
    // improvement), 3 (suspect), 4 (rejected), 6 (excluded), 7 (no node), 8 (no score).
    assert_eq!(
        shares,
        vec![(node(1), composite(0)), (node(5), composite(4) * 0.25)]
    );
    assert!(composite(0) > 0.0 && composite(4) > 0.0);

    // The same lines in a merged epoch: every accepted, not suspect, scored delta, by its
    // composite times its agreement (none: 1).
    let r = report(0, 1.0, 0.9, Some("weighted_mean"), lines.clone());
    let shares = reward_shares(&r);
    assert_eq!(
        shares,
        vec![
            (node(1), composite(0)),
            (node(2), composite(1)),
            (node(5), composite(4) * 0.25),
        ]
    );
}

// ---------------------------------------------------------------------------------------
// star_epoch on a LoRA job: copies and agreement on the adapters' updates ΔW (sketched)
// ---------------------------------------------------------------------------------------

/// A LoRA job (`qwen3-tiny`, rank 4 on `q_proj` and `v_proj`: validate's LoRA test recipe),
/// its base, and six nodes' honest adapters of epoch 0. Every node starts from the job's
/// same `A` (and `B = 0`): their factors are alike (pairwise cosine ≈ 0.99), their updates
/// `ΔW` are not (≈ 0: two local steps of a random model on different batches share no
/// direction).
struct LoraJob {
    trainer: Trainer,
    plan: LoraPlan,
    base: Arc<Weights>,
    loss_before: f64,
    ids: Vec<Identity>,
    /// (adapter, claimed loss) per node.
    runs: Vec<(Vec<f32>, f64)>,
}

fn lora_job() -> &'static LoraJob {
    static JOB: OnceLock<LoraJob> = OnceLock::new();
    JOB.get_or_init(|| {
        let spec = crate::validate::lora_tests::lora_training(4);
        let trainer = hanzod_train::trainer_of(&spec, JobId(1)).expect("trainer");
        let plan = LoraPlan::of_trainer(&trainer)
            .expect("plan")
            .expect("a LoRA trainer");
        let (base, loss_before, ids, runs) = epoch_zero(&trainer, 21..=26);
        LoraJob {
            trainer,
            plan,
            base,
            loss_before,
            ids,
            runs,
        }
    })
}

fn lora_job_context(j: &LoraJob, last_merged: Option<Arc<Vec<f32>>>) -> EpochContext {
    EpochContext {
        job: 1,
        epoch: 0,
        trainer: j.trainer.clone(),
        base: j.base.clone(),
        base_version: 0,
        loss_before: j.loss_before,
        best_loss: None,
        norms: NormTracker::new(),
        last_merged,
        secret: EpochSecret::from_bytes([9; 32]),
        config: ValidationConfig {
            spot_check_rate: 0.0,
            ..ValidationConfig::default()
        },
    }
}

/// `adapter` uploaded by `id` for job 1, epoch 0, step 0, signed, as f32 HZDL.
fn lora_upload(j: &LoraJob, id: &Identity, adapter: Vec<f32>, claimed_loss: f64) -> Submission {
    let payload = Weights {
        layout: j.trainer.delta_layout(),
        data: adapter,
    }
    .to_delta_bytes_as(0, DeltaDtype::F32)
    .expect("payload");
    crate::validate::lora_tests::submit(id, payload, claimed_loss)
}

/// The first `n` nodes upload `adapters[i]` (with their own claimed losses).
fn lora_uploads(j: &LoraJob, adapters: &[Vec<f32>], n: usize) -> Vec<Submission> {
    (0..n)
        .map(|i| lora_upload(j, &j.ids[i], adapters[i].clone(), j.runs[i].1))
        .collect()
}

fn lora_runs(j: &LoraJob) -> Vec<Vec<f32>> {
    j.runs.iter().map(|(d, _)| d.clone()).collect()
}

/// `adapter` with every `B` factor times `c` (its update `ΔW` times `c`).
fn scale_b(j: &LoraJob, adapter: &[f32], c: f32) -> Vec<f32> {
    let layout = j.trainer.delta_layout();
    let mut out = adapter.to_vec();
    for m in &j.plan.modules {
        let e = layout.entry(&m.lora_b).expect("B");
        out[e.offset..e.offset + e.len]
            .iter_mut()
            .for_each(|b| *b *= c);
    }
    out
}

/// The update `ΔW` of `adapter` in the model's full layout (zeros off the adapted modules).
fn full_update(j: &LoraJob, adapter: &[f32]) -> Vec<f32> {
    let (layout, full) = (j.trainer.delta_layout(), j.trainer.layout());
    let mut out = vec![0.0f32; full.len()];
    crate::lora::for_each_update(
        &j.plan,
        &FlatAdapter::new(&layout, adapter),
        |m, dw| -> Result<(), std::convert::Infallible> {
            let e = full.entry(&m.base).expect("base tensor");
            out[e.offset..e.offset + e.len].copy_from_slice(dw);
            Ok(())
        },
    )
    .expect("update");
    out
}

/// The nodes' honest adapters with a common part added to every `B` (a fixed random
/// `B_c`, per module twice the norm of a typical node's `B`): updates
/// `ΔWᵢ = s·(Bᵢ + B_c)·Aᵢ` that share a direction (the `Aᵢ` all stay close to the job's
/// initial `A`), as nodes whose data teaches them something in common.
fn lora_consensus(j: &LoraJob) -> Vec<Vec<f32>> {
    let layout = j.trainer.delta_layout();
    let mut rng = ChaCha8Rng::seed_from_u64(41);
    let mut out = lora_runs(j);
    for m in &j.plan.modules {
        let e = layout.entry(&m.lora_b).expect("B");
        let typical = j
            .runs
            .iter()
            .map(|(d, _)| norm(&d[e.offset..e.offset + e.len]))
            .sum::<f64>()
            / j.runs.len() as f64;
        let common = gaussian_vec(&mut rng, e.len);
        let c = (2.0 * typical / norm(&common)) as f32;
        for adapter in &mut out {
            for (b, x) in adapter[e.offset..e.offset + e.len].iter_mut().zip(&common) {
                *b += c * x;
            }
        }
    }
    out
}

fn outcomes(star: &StarEpoch) -> Vec<Result<(), &Rejection>> {
    star.judged
        .iter()
        .map(|v| v.outcome.as_ref().map(|_| ()))
        .collect()
}

/// `star`'s merged update is the weighted mean (by `star.weights`) of the updates of
/// `adapters` (in `judged`'s order), within f32 rounding: each adapter counted once.
fn assert_lora_merge_is_the_weighted_mean(j: &LoraJob, star: &StarEpoch, adapters: &[Vec<f32>]) {
    let total: f64 = star.weights.iter().sum();
    let merged = star.merged.delta.as_ref().expect("a merged update");
    let mut want = vec![0.0f64; merged.len()];
    for (a, wk) in adapters.iter().zip(&star.weights) {
        if *wk == 0.0 {
            continue;
        }
        for (o, &x) in want.iter_mut().zip(&full_update(j, a)) {
            *o += wk / total * f64::from(x);
        }
    }
    assert_close(merged, &want);
}

#[test]
fn honest_lora_adapters_from_the_same_a_are_not_copies_and_all_agree() {
    let j = lora_job();
    let runs = lora_runs(j);
    let ctx = lora_job_context(j, None);
    // The factors look alike (the shared `A` dominates them); the updates do not.
    let sketches = crate::lora_sketch::sketch_epoch(
        &j.trainer,
        &ctx.secret,
        &runs.iter().map(|d| Some(d.as_slice())).collect::<Vec<_>>(),
        None,
    )
    .expect("sketches");
    for a in 0..runs.len() {
        for b in a + 1..runs.len() {
            let factors = cosine_similarity(&runs[a], &runs[b]).expect("cosine");
            let (sa, sb) = (&sketches.adapters[a], &sketches.adapters[b]);
            let updates = cosine_similarity(
                sa.as_deref().expect("sketch"),
                sb.as_deref().expect("sketch"),
            )
            .expect("cosine");
            assert!(factors > 0.98, "{a}, {b}: factors {factors}");
            assert!(updates.abs() < 0.2, "{a}, {b}: updates {updates}");
        }
    }

    let (_, star) = run_star(&ctx, &lora_uploads(j, &runs, 6));
    assert!(
        outcomes(&star).iter().all(Result::is_ok),
        "{:?}",
        outcomes(&star)
    );
    for (k, a) in star.agreement.iter().enumerate() {
        assert!(some(*a) > 0.0, "{k}: {:?}", star.agreement);
        assert!(star.weights[k] > 0.0, "{k}: {:?}", star.weights);
    }
    assert_eq!(star.merged.aggregator, Some("weighted_mean"));
    assert_lora_merge_is_the_weighted_mean(j, &star, &runs);
}

#[test]
fn two_lora_nodes_uploading_the_same_adapter_are_merged_once_and_neither_is_paid() {
    let j = lora_job();
    let ctx = lora_job_context(j, None);
    let mut adapters = lora_runs(j);
    // Node 5 uploads node 2's adapter as its own (signed by itself: the same bytes).
    adapters[5] = adapters[2].clone();
    let (receipts, star) = run_star(&ctx, &lora_uploads(j, &adapters, 6));
    assert_eq!(receipts[2].delta_hash, receipts[5].delta_hash);

    let copies = [2usize, 5];
    for &k in &copies {
        assert!(
            matches!(
                star.judged[k].outcome,
                Err(Rejection::Copy(Copying::Duplicate { .. }))
            ),
            "{k}: {:?}",
            star.judged[k].outcome
        );
    }
    for k in [0, 1, 3, 4] {
        assert!(star.judged[k].outcome.is_ok(), "{k}: {:?}", outcomes(&star));
        assert!(some(star.agreement[k]) > 0.0, "{:?}", star.agreement);
    }
    let weighed: Vec<usize> = copies
        .iter()
        .copied()
        .filter(|&k| star.weights[k] > 0.0)
        .collect();
    assert_eq!(
        weighed,
        vec![2],
        "the group is merged once: {:?}",
        star.weights
    );
    assert!(some(star.agreement[2]) > 0.0, "{:?}", star.agreement);
    assert_eq!(star.agreement[5], None, "{:?}", star.agreement);
    assert_eq!(star.suspect, 0);
    assert_eq!(star.merged.aggregator, Some("weighted_mean"));
    assert_lora_merge_is_the_weighted_mean(j, &star, &adapters);

    let report = star_report(&ctx, &receipts, &star);
    let shares = reward_shares(&report);
    let paid: BTreeSet<NodeId> = shares.iter().map(|(n, _)| *n).collect();
    for &k in &copies {
        assert!(!paid.contains(&j.ids[k].node_id()), "{k} paid: {shares:?}");
    }
}

#[test]
fn a_rescaled_lora_copy_is_a_near_copy_and_its_group_is_merged_once() {
    let j = lora_job();
    let ctx = lora_job_context(j, None);
    let mut adapters = lora_runs(j);
    // Node 5 uploads node 2's adapter with `B` 1 % larger: other bytes, the same update.
    adapters[5] = scale_b(j, &adapters[2], 1.01);
    let (_, star) = run_star(&ctx, &lora_uploads(j, &adapters, 6));
    for (k, of) in [(2usize, 5usize), (5, 2)] {
        match &star.judged[k].outcome {
            Err(Rejection::Copy(Copying::NearCopy { of: o, cosine })) => {
                assert_eq!(*o, j.ids[of].node_id());
                assert!(*cosine > 0.9999, "{cosine}");
            }
            other => panic!("{k}: {other:?}"),
        }
    }
    for k in [0, 1, 3, 4] {
        assert!(star.judged[k].outcome.is_ok(), "{k}: {:?}", outcomes(&star));
    }
    // Merged once, under the representative's line (the smaller delta hash).
    let weighed: Vec<usize> = [2usize, 5]
        .into_iter()
        .filter(|&k| star.weights[k] > 0.0)
        .collect();
    assert_eq!(weighed.len(), 1, "{:?}", star.weights);
    assert_eq!(star.merged.aggregator, Some("weighted_mean"));
    assert_lora_merge_is_the_weighted_mean(j, &star, &adapters);
}

#[test]
fn a_sign_flipped_lora_adapter_agrees_zero_among_honest_ones() {
    let j = lora_job();
    let ctx = lora_job_context(j, None);
    let mut adapters = lora_consensus(j);
    adapters[5] = scale_b(j, &adapters[5], -1.0);
    let (_, star) = run_star(&ctx, &lora_uploads(j, &adapters, 6));
    assert!(
        outcomes(&star).iter().all(Result::is_ok),
        "not copies: {:?}",
        outcomes(&star)
    );
    assert_eq!(star.agreement[5], Some(0.0), "{:?}", star.agreement);
    assert_eq!(star.weights[5], 0.0, "{:?}", star.weights);
    for k in 0..5 {
        assert!(some(star.agreement[k]) > 0.5, "{k}: {:?}", star.agreement);
        assert!(star.weights[k] > 0.0, "{k}: {:?}", star.weights);
    }
    assert_eq!(
        star.merged.aggregator,
        Some("weighted_mean"),
        "{:?}",
        star.merged.kept
    );
    assert_lora_merge_is_the_weighted_mean(j, &star, &adapters);
}

#[test]
fn a_lora_adapter_of_the_last_merged_update_or_of_no_update_is_rejected() {
    let j = lora_job();
    let mut adapters = lora_runs(j);
    // Node 0 re-uploads the last merged update (here: its own adapter's, in the full
    // layout, as `Merged::delta` holds it); node 5 the job's initial adapter (`B = 0`).
    let last = Arc::new(full_update(j, &adapters[0]));
    adapters[5] = j.trainer.init_adapter(0).expect("a LoRA job").data;
    let ctx = lora_job_context(j, Some(last));
    let (_, star) = run_star(&ctx, &lora_uploads(j, &adapters, 6));
    assert!(
        matches!(
            star.judged[0].outcome,
            Err(Rejection::Copy(Copying::CopiesLastMerged { cosine })) if cosine > 0.9999
        ),
        "{:?}",
        star.judged[0].outcome
    );
    assert_eq!(
        star.judged[5].outcome,
        Err(Rejection::Copy(Copying::NoUpdate))
    );
    for k in 1..5 {
        assert!(star.judged[k].outcome.is_ok(), "{k}: {:?}", outcomes(&star));
    }
    // Neither forms a group: nothing of theirs is merged.
    assert_eq!((star.weights[0], star.weights[5]), (0.0, 0.0));
}

#[test]
fn reject_copies_by_compares_the_views_and_checks_hashes_without_one() {
    let mut rng = ChaCha8Rng::seed_from_u64(17);
    let (a, b) = (gaussian_vec(&mut rng, 8), gaussian_vec(&mut rng, 8));
    // The deltas (what the set-aside copies carry) differ from the views compared.
    let deltas: Vec<Arc<Vec<f32>>> = (0..5).map(|i| Arc::new(vec![i as f32 + 1.0; 3])).collect();
    let mut judged = vec![
        verdict(1, 1, Ok(deltas[0].clone())),
        verdict(2, 2, Ok(deltas[1].clone())),
        verdict(3, 3, Ok(deltas[2].clone())),
        verdict(4, 4, Ok(deltas[3].clone())),
        verdict(5, 4, Ok(deltas[4].clone())),
    ];
    let scaled_a = scaled(&a, 3.0);
    // 0 and 1: the same view up to scale; 2: another; 3 and 4 (one hash): no view.
    let views = [Some(a.as_slice()), Some(&scaled_a), Some(&b), None, None];
    let set_aside = reject_copies_by(&mut judged, &views, None);
    let flagged: BTreeMap<usize, &SetAside> = set_aside.iter().map(|s| (s.index, s)).collect();
    assert_eq!(
        flagged.keys().copied().collect::<Vec<_>>(),
        vec![0, 1, 3, 4]
    );
    assert!(matches!(flagged[&0].copying, Copying::NearCopy { of, .. } if of == node(2)));
    assert!(matches!(flagged[&1].copying, Copying::NearCopy { of, .. } if of == node(1)));
    assert_eq!(flagged[&3].copying, Copying::Duplicate { of: node(5) });
    assert_eq!(flagged[&4].copying, Copying::Duplicate { of: node(4) });
    for (k, s) in &flagged {
        assert_eq!(s.delta, deltas[*k], "the set-aside copy carries its delta");
    }
    assert!(judged[2].outcome.is_ok());
    // Groups by the views: {0, 1} (hash 1 the smaller); {3, 4} has no view to measure.
    assert_eq!(copy_groups_by(&judged, &set_aside, &views, None), vec![0]);
    // Without any view only the hashes count.
    let mut judged2: Vec<Verdict> = (0..3)
        .map(|i| verdict(i + 1, 7, Ok(deltas[0].clone())))
        .collect();
    judged2.push(verdict(9, 9, Ok(deltas[1].clone())));
    let set_aside = reject_copies_by(&mut judged2, &[None; 4], None);
    assert_eq!(set_aside.len(), 3);
    assert!(set_aside
        .iter()
        .all(|s| matches!(s.copying, Copying::Duplicate { .. })));
    assert!(judged2[3].outcome.is_ok());
}
