//! Tests of the aggregators against naive references.
use super::krum::pairwise_sq_dists;
use super::order::{OrderNetwork, LANES};
use super::par::{for_each_chunk, map_ranges};
use super::*;
use proptest::prelude::*;

/// One of each aggregator, with default parameters.
fn all_aggregators() -> [&'static dyn Aggregator; 6] {
    [
        &WeightedMean,
        &CoordinateMedian,
        &TrimmedMean { trim: 0.2 },
        &Krum { f: 1, m: 1 },
        &Krum { f: 1, m: 3 },
        &CenteredClipping {
            iterations: 3,
            tau: None,
        },
    ]
}

fn refs(v: &[Vec<f32>]) -> Vec<&[f32]> {
    v.iter().map(|d| d.as_slice()).collect()
}

fn naive_weighted(deltas: &[Vec<f32>], w: &[f32]) -> Vec<f64> {
    let sum: f64 = w.iter().map(|&x| f64::from(x)).sum();
    (0..deltas[0].len())
        .map(|j| {
            deltas
                .iter()
                .zip(w)
                .map(|(d, &w)| f64::from(w) * f64::from(d[j]))
                .sum::<f64>()
                / sum
        })
        .collect()
}

/// Sort-based reference over the values of one coordinate.
fn sorted_column(deltas: &[Vec<f32>], j: usize) -> Vec<f64> {
    let mut c: Vec<f64> = deltas.iter().map(|d| f64::from(d[j])).collect();
    c.sort_by(|a, b| a.total_cmp(b));
    c
}

fn ref_median(deltas: &[Vec<f32>], j: usize) -> f64 {
    let c = sorted_column(deltas, j);
    let n = c.len();
    (c[(n - 1) / 2] + c[n / 2]) / 2.0
}

fn ref_trimmed(deltas: &[Vec<f32>], j: usize, trim: f32) -> f64 {
    let c = sorted_column(deltas, j);
    let n = c.len();
    let k = (f64::from(trim) * n as f64).floor() as usize;
    c[k..n - k].iter().sum::<f64>() / (n - 2 * k) as f64
}

fn close(a: f32, b: f64, tol: f64) -> bool {
    (f64::from(a) - b).abs() <= tol * (1.0 + b.abs())
}

fn deltas_strategy() -> impl Strategy<Value = (Vec<Vec<f32>>, Vec<f32>)> {
    (1usize..20, 0usize..300).prop_flat_map(|(n, len)| {
        (
            prop::collection::vec(prop::collection::vec(-1e3f32..1e3, len), n),
            prop::collection::vec(0.01f32..10.0, n),
        )
    })
}

proptest! {
    #[test]
    fn weighted_mean_matches_f64_reference((d, w) in deltas_strategy()) {
        let mut out = vec![0.0; d[0].len()];
        let r = WeightedMean.merge(&refs(&d), &w, &mut out).unwrap();
        prop_assert_eq!(r, MergeOutcome::Merged { aggregator: "weighted_mean", used: d.len() });
        for (j, e) in naive_weighted(&d, &w).into_iter().enumerate() {
            prop_assert!(close(out[j], e, 1e-4), "j={} got {} want {}", j, out[j], e);
        }
    }

    #[test]
    fn weighted_mean_scale_invariant((d, w) in deltas_strategy(), s in 0.001f32..1000.0) {
        let len = d[0].len();
        let (mut a, mut b) = (vec![0.0; len], vec![0.0; len]);
        WeightedMean.merge(&refs(&d), &w, &mut a).unwrap();
        let ws: Vec<f32> = w.iter().map(|x| x * s).collect();
        WeightedMean.merge(&refs(&d), &ws, &mut b).unwrap();
        for j in 0..len {
            prop_assert!(close(a[j], f64::from(b[j]), 1e-4), "{} vs {}", a[j], b[j]);
        }
    }

    #[test]
    fn median_matches_sort_reference((d, w) in deltas_strategy()) {
        let mut out = vec![0.0; d[0].len()];
        CoordinateMedian.merge(&refs(&d), &w, &mut out).unwrap();
        for (j, &o) in out.iter().enumerate() {
            prop_assert!(close(o, ref_median(&d, j), 1e-6), "j={} {} vs {}", j, o, ref_median(&d, j));
        }
    }

    #[test]
    fn trimmed_mean_matches_sort_reference((d, w) in deltas_strategy(), trim in 0.0f32..0.49) {
        let mut out = vec![0.0; d[0].len()];
        TrimmedMean { trim }.merge(&refs(&d), &w, &mut out).unwrap();
        for (j, &o) in out.iter().enumerate() {
            let e = ref_trimmed(&d, j, trim);
            prop_assert!(close(o, e, 1e-4), "j={} {} vs {}", j, o, e);
        }
    }

    #[test]
    fn never_panics(
        d in prop::collection::vec(prop::collection::vec(any::<f32>(), 0..5), 0..6),
        w in prop::collection::vec(any::<f32>(), 0..6),
        len in 0usize..5,
        trim in any::<f32>(),
        f in 0usize..8,
        m in 0usize..8,
        it in 0usize..4,
        tau in proptest::option::of(any::<f32>()),
    ) {
        let d = refs(&d);
        let aggs: [&dyn Aggregator; 6] = [
            &WeightedMean,
            &CoordinateMedian,
            &TrimmedMean { trim },
            &Krum::multi(f, m),
            &CenteredClipping { iterations: it, tau },
            &CenteredClipping::default(),
        ];
        for a in aggs {
            let mut out = vec![0.0; len];
            let _ = a.merge(&d, &w, &mut out);
        }
    }
}

/// 0/1 principle: a network that orders every 0/1 input orders every input. Checks the
/// full (unpruned) network for every n up to 12 exhaustively.
#[test]
fn network_sorts_all_zero_one_inputs() {
    for n in 1..=12usize {
        let net = OrderNetwork::new(n, 0, n);
        for base in (0u32..(1 << n)).step_by(LANES) {
            // One input per lane: lane l holds the bits of `base + l`.
            let mut rows = vec![[0.0f32; LANES]; n];
            for (i, row) in rows.iter_mut().enumerate() {
                for (l, x) in row.iter_mut().enumerate() {
                    *x = (((base + l as u32) >> i) & 1) as f32;
                }
            }
            net.apply_portable(&mut rows);
            assert!(
                rows.windows(2)
                    .all(|w| w[0].iter().zip(&w[1]).all(|(x, y)| x <= y)),
                "n={n} bits from {base:b}"
            );
        }
    }
}

/// The portable path (presorted blocks through memory, then the rest) sorts every lane, for
/// counts with several presorted blocks and a partial one.
#[test]
fn portable_network_sorts_large_counts() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    for n in [32usize, 33, 64, 100, 256] {
        let net = OrderNetwork::new(n, 0, n);
        let mut rows: Vec<[f32; LANES]> = (0..n)
            .map(|_| std::array::from_fn(|_| rng.gen_range(-1.0..1.0)))
            .collect();
        let mut want: Vec<Vec<f32>> = (0..LANES)
            .map(|l| rows.iter().map(|r| r[l]).collect())
            .collect();
        want.iter_mut().for_each(|c| c.sort_by(f32::total_cmp));
        net.apply_portable(&mut rows);
        for (l, col) in want.iter().enumerate() {
            assert!((0..n).all(|i| rows[i][l] == col[i]), "n={n} lane={l}");
        }
    }
}

#[test]
fn median_odd_and_even_exact() {
    let d = vec![vec![5.0, -1.0], vec![1.0, 7.0], vec![3.0, 2.0]];
    let mut out = [0.0; 2];
    CoordinateMedian
        .merge(&refs(&d), &[1.0; 3], &mut out)
        .unwrap();
    assert_eq!(out, [3.0, 2.0]);
    let d = vec![vec![5.0], vec![1.0], vec![3.0], vec![10.0]];
    let mut out = [0.0; 1];
    CoordinateMedian
        .merge(&refs(&d), &[1.0; 4], &mut out)
        .unwrap();
    assert_eq!(out, [4.0]);
}

#[test]
fn median_large_n_and_long_buffers_match_reference() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    for n in [2usize, 8, 33, 64] {
        let len = 10_000;
        let d: Vec<Vec<f32>> = (0..n)
            .map(|_| (0..len).map(|_| rng.gen_range(-1.0..1.0)).collect())
            .collect();
        let mut out = vec![0.0; len];
        CoordinateMedian
            .merge(&refs(&d), &vec![1.0; n], &mut out)
            .unwrap();
        for (j, &o) in out.iter().enumerate() {
            assert!(close(o, ref_median(&d, j), 1e-6), "n={n} j={j}");
        }
    }
}

#[test]
fn zero_weight_deltas_are_excluded() {
    let d = vec![vec![1.0], vec![2.0], vec![1000.0]];
    let w = [1.0, 1.0, 0.0];
    let mut out = [0.0];
    let r = CoordinateMedian.merge(&refs(&d), &w, &mut out).unwrap();
    assert_eq!(
        r,
        MergeOutcome::Merged {
            aggregator: "median",
            used: 2
        }
    );
    assert_eq!(out, [1.5]);
    WeightedMean.merge(&refs(&d), &w, &mut out).unwrap();
    assert_eq!(out, [1.5]);
}

#[test]
fn all_zero_weights_keep_previous_and_leave_out_untouched() {
    let d = vec![vec![1.0, 2.0], vec![3.0, 4.0]];
    let aggs = all_aggregators();
    for a in aggs {
        let mut out = [42.0, -7.0];
        let r = a.merge(&refs(&d), &[0.0, 0.0], &mut out).unwrap();
        assert_eq!(
            r,
            MergeOutcome::KeepPrevious {
                reason: KeepReason::AllWeightsZero
            }
        );
        assert_eq!(out, [42.0, -7.0], "{}", a.name());
    }
}

#[test]
fn no_deltas_keep_previous() {
    let aggs = all_aggregators();
    for a in aggs {
        let mut out = [9.0; 3];
        let r = a.merge(&[], &[], &mut out).unwrap();
        assert_eq!(
            r,
            MergeOutcome::KeepPrevious {
                reason: KeepReason::NoDeltas
            }
        );
        assert_eq!(out, [9.0; 3]);
    }
}

#[test]
fn trimmed_mean_trim_zero_is_plain_mean_and_drops_outliers() {
    let d = vec![vec![1.0, 10.0], vec![2.0, 20.0], vec![6.0, 30.0]];
    let mut out = [0.0; 2];
    TrimmedMean { trim: 0.0 }
        .merge(&refs(&d), &[1.0, 5.0, 9.0], &mut out)
        .unwrap();
    assert_eq!(out, [3.0, 20.0]);
    let d = vec![vec![-1e9], vec![1.0], vec![2.0], vec![3.0], vec![1e9]];
    TrimmedMean { trim: 0.2 }
        .merge(&refs(&d), &[1.0; 5], &mut out[..1])
        .unwrap();
    assert_eq!(out[0], 2.0);
}

#[test]
fn byzantine_outliers_move_the_mean_but_not_the_median() {
    let x = 0.5f32;
    let len = 1000;
    let mut d: Vec<Vec<f32>> = (0..3)
        .map(|k| (0..len).map(|j| x + 1e-3 * ((j + k) % 7) as f32).collect())
        .collect();
    d.push(vec![1e6; len]);
    d.push(vec![-3e5; len]);
    let w = [1.0; 5];
    let (mut med, mut mean, mut trim) = (vec![0.0; len], vec![0.0; len], vec![0.0; len]);
    CoordinateMedian.merge(&refs(&d), &w, &mut med).unwrap();
    WeightedMean.merge(&refs(&d), &w, &mut mean).unwrap();
    TrimmedMean { trim: 0.2 }
        .merge(&refs(&d), &w, &mut trim)
        .unwrap();
    assert!(med.iter().all(|&v| (v - x).abs() < 0.01));
    assert!(trim.iter().all(|&v| (v - x).abs() < 0.01));
    assert!(mean.iter().all(|&v| (v - x).abs() > 1e4));
}

#[test]
fn shape_and_weight_errors() {
    let d = vec![vec![1.0, 2.0], vec![3.0]];
    let mut out = [0.0; 2];
    let aggs = all_aggregators();
    for a in aggs {
        assert_eq!(
            a.merge(&refs(&d), &[1.0, 1.0], &mut out),
            Err(MergeError::LengthMismatch {
                index: 1,
                expected: 2,
                found: 1
            })
        );
        let ok = vec![vec![1.0, 2.0], vec![3.0, 4.0]];
        assert_eq!(
            a.merge(&refs(&ok), &[1.0], &mut out),
            Err(MergeError::WeightCount {
                deltas: 2,
                weights: 1
            })
        );
        for bad in [-1.0, f32::NAN, f32::INFINITY] {
            match a.merge(&refs(&ok), &[1.0, bad], &mut out) {
                Err(MergeError::BadWeight { index: 1, .. }) => {}
                other => panic!("{}: {other:?}", a.name()),
            }
        }
        assert_eq!(out, [0.0; 2]);
    }
    for trim in [-0.1, 0.5, f32::NAN] {
        assert!(matches!(
            TrimmedMean { trim }.merge(&refs(&d), &[1.0; 2], &mut out),
            Err(MergeError::BadTrim(_))
        ));
    }
}

#[test]
fn policy_switches_above_threshold() {
    let p = RobustPolicy::default();
    assert_eq!(p.choose(0, 10).name(), "weighted_mean");
    assert_eq!(p.choose(3, 10).name(), "weighted_mean");
    assert_eq!(p.choose(4, 10).name(), "median");
    assert_eq!(p.choose(0, 0).name(), "weighted_mean");
    let t = RobustPolicy {
        robust: Box::new(TrimmedMean { trim: 0.2 }),
        ..RobustPolicy::default()
    };
    assert_eq!(t.choose(10, 10).name(), "trimmed_mean");
}

// ---- Krum / Multi-Krum -------------------------------------------------------------------

/// Naive Krum (Blanchard et al. 2017) in `f64` over the deltas with a non-zero weight:
/// scores, the selected indices (into `deltas`), and the weighted mean of the selection.
fn naive_krum(deltas: &[Vec<f32>], w: &[f32], f: usize, m: usize) -> (Vec<usize>, Vec<f64>) {
    let used: Vec<usize> = (0..deltas.len()).filter(|&i| w[i] > 0.0).collect();
    let n = used.len();
    let dist = |a: usize, b: usize| -> f64 {
        deltas[a]
            .iter()
            .zip(&deltas[b])
            .map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2))
            .sum()
    };
    let k = if n < 2 {
        0
    } else {
        (n as i64 - f as i64 - 2).clamp(1, n as i64 - 1) as usize
    };
    let scores: Vec<f64> = used
        .iter()
        .map(|&i| {
            let mut ds: Vec<f64> = used
                .iter()
                .filter(|&&j| j != i)
                .map(|&j| dist(i, j))
                .collect();
            ds.sort_by(f64::total_cmp);
            ds[..k].iter().sum()
        })
        .collect();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| scores[a].total_cmp(&scores[b]).then(a.cmp(&b)));
    order.truncate(m.clamp(1, n));
    let sel: Vec<usize> = order.iter().map(|&s| used[s]).collect();
    let sw: f64 = sel.iter().map(|&i| f64::from(w[i])).sum();
    let mean = (0..deltas[0].len())
        .map(|j| {
            sel.iter()
                .map(|&i| f64::from(w[i]) * f64::from(deltas[i][j]))
                .sum::<f64>()
                / sw
        })
        .collect();
    (sel, mean)
}

/// Small-integer deltas: every squared distance is exact in `f32` (and `f64`), so the
/// selection must match the reference exactly, ties included.
fn integer_deltas() -> impl Strategy<Value = (Vec<Vec<f32>>, Vec<f32>)> {
    (1usize..12, 0usize..200).prop_flat_map(|(n, len)| {
        (
            prop::collection::vec(
                prop::collection::vec((-100i32..100).prop_map(|x| x as f32), len),
                n,
            ),
            prop::collection::vec(prop_oneof![1 => Just(0.0f32), 4 => 0.5f32..2.0], n),
        )
    })
}

fn permuted(d: &[Vec<f32>], w: &[f32], perm: &[usize]) -> (Vec<Vec<f32>>, Vec<f32>) {
    (
        perm.iter().map(|&p| d[p].clone()).collect(),
        perm.iter().map(|&p| w[p]).collect(),
    )
}

fn deltas_and_permutation() -> impl Strategy<Value = (Vec<Vec<f32>>, Vec<f32>, Vec<usize>)> {
    deltas_strategy().prop_flat_map(|(d, w)| {
        let n = d.len();
        (
            Just(d),
            Just(w),
            Just((0..n).collect::<Vec<usize>>()).prop_shuffle(),
        )
    })
}

// ---- centered clipping -------------------------------------------------------------------

/// Naive centered clipping in `f64`: v₀ = the coordinate median, τ = the given one or the
/// median distance to v₀, then `iterations` of `v += Σ pᵢ (dᵢ − v) min(1, τ/‖dᵢ − v‖)`.
fn naive_clipping(deltas: &[Vec<f32>], w: &[f32], iterations: usize, tau: Option<f32>) -> Vec<f64> {
    let used: Vec<Vec<f32>> = (0..deltas.len())
        .filter(|&i| w[i] > 0.0)
        .map(|i| deltas[i].clone())
        .collect();
    let uw: Vec<f64> = w
        .iter()
        .filter(|&&x| x > 0.0)
        .map(|&x| f64::from(x))
        .collect();
    let sum: f64 = uw.iter().sum();
    let len = deltas[0].len();
    let mut v: Vec<f64> = (0..len).map(|j| ref_median(&used, j)).collect();
    let dist = |v: &[f64], d: &[f32]| -> f64 {
        d.iter()
            .zip(v)
            .map(|(&x, &c)| (f64::from(x) - c).powi(2))
            .sum::<f64>()
            .sqrt()
    };
    let tau = tau.map(f64::from).unwrap_or_else(|| {
        let mut r: Vec<f64> = used.iter().map(|d| dist(&v, d)).collect();
        r.sort_by(f64::total_cmp);
        let n = r.len();
        (r[(n - 1) / 2] + r[n / 2]) / 2.0
    });
    for _ in 0..iterations {
        let r: Vec<f64> = used.iter().map(|d| dist(&v, d)).collect();
        let step: Vec<f64> = (0..len)
            .map(|j| {
                used.iter()
                    .zip(&uw)
                    .zip(&r)
                    .map(|((d, &w), &r)| {
                        let c = if r <= tau { 1.0 } else { tau / r };
                        w / sum * c * (f64::from(d[j]) - v[j])
                    })
                    .sum()
            })
            .collect();
        v.iter_mut().zip(step).for_each(|(v, s)| *v += s);
    }
    v
}

proptest! {
    #[test]
    fn krum_matches_naive_reference_exactly_on_integers(
        (d, w) in integer_deltas(),
        f in 0usize..5,
        m in 1usize..12,
    ) {
        let mut out = vec![f32::NAN; d[0].len()];
        let agg = Krum::multi(f, m);
        let r = agg.merge(&refs(&d), &w, &mut out).unwrap();
        if w.iter().all(|&x| x == 0.0) {
            let kept = matches!(r, MergeOutcome::KeepPrevious { .. });
            prop_assert!(kept);
            return Ok(());
        }
        let (_, mean) = naive_krum(&d, &w, f, m);
        for (j, &e) in mean.iter().enumerate() {
            prop_assert!(close(out[j], e, 1e-5), "j={} {} vs {}", j, out[j], e);
        }
    }

    #[test]
    fn krum_distances_match_f64_reference((d, _w) in deltas_strategy()) {
        let rows = refs(&d);
        let n = d.len();
        let got = pairwise_sq_dists(&rows, d[0].len());
        for i in 0..n {
            for j in 0..n {
                let e: f64 = d[i]
                    .iter()
                    .zip(&d[j])
                    .map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2))
                    .sum();
                prop_assert!((got[i * n + j] - e).abs() <= 1e-5 * (1.0 + e), "{} {}: {} vs {}", i, j, got[i * n + j], e);
            }
        }
    }

    #[test]
    fn centered_clipping_matches_naive_reference(
        (d, w) in deltas_strategy(),
        iterations in 0usize..4,
        tau in proptest::option::of(0.1f32..1e4),
    ) {
        let mut out = vec![0.0; d[0].len()];
        let r = CenteredClipping { iterations, tau }.merge(&refs(&d), &w, &mut out).unwrap();
        prop_assert_eq!(r, MergeOutcome::Merged { aggregator: "centered_clipping", used: d.len() });
        for (j, e) in naive_clipping(&d, &w, iterations, tau).into_iter().enumerate() {
            prop_assert!(close(out[j], e, 1e-4), "j={} {} vs {}", j, out[j], e);
        }
    }

    #[test]
    fn robust_aggregators_are_permutation_invariant((d, w, perm) in deltas_and_permutation()) {
        let (pd, pw) = permuted(&d, &w, &perm);
        let len = d[0].len();
        // Exact: the order statistics do not depend on the input order.
        let exact: [&dyn Aggregator; 2] = [&CoordinateMedian, &TrimmedMean { trim: 0.2 }];
        for a in exact {
            let (mut x, mut y) = (vec![0.0; len], vec![0.0; len]);
            a.merge(&refs(&d), &w, &mut x).unwrap();
            a.merge(&refs(&pd), &pw, &mut y).unwrap();
            prop_assert_eq!(&x, &y, "{}", a.name());
        }
        // Up to rounding (sums in a different order). Krum breaks score ties by index, so
        // it is only invariant when the selection boundary is not a tie.
        let dist = pairwise_sq_dists(&refs(&d), len);
        let untied = |k: &Krum| {
            let mut s = k.scores_from(&dist, d.len());
            s.sort_by(f64::total_cmp);
            let m = k.m.min(s.len());
            m == s.len() || s[m] - s[m - 1] > 1e-6 * (1.0 + s[m].abs())
        };
        let (k1, k3, cc) = (Krum::new(1), Krum::multi(1, 3), CenteredClipping::default());
        let mut summed: Vec<&dyn Aggregator> = vec![&cc];
        if untied(&k1) {
            summed.push(&k1);
        }
        if untied(&k3) {
            summed.push(&k3);
        }
        for a in summed {
            let (mut x, mut y) = (vec![0.0; len], vec![0.0; len]);
            a.merge(&refs(&d), &w, &mut x).unwrap();
            a.merge(&refs(&pd), &pw, &mut y).unwrap();
            for j in 0..len {
                prop_assert!(close(x[j], f64::from(y[j]), 1e-4), "{} j={} {} vs {}", a.name(), j, x[j], y[j]);
            }
        }
    }
}

#[test]
fn order_statistics_match_reference_for_many_deltas() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    for n in [3usize, 31, 100, 255, 256] {
        let len = 200;
        let d: Vec<Vec<f32>> = (0..n)
            .map(|_| (0..len).map(|_| rng.gen_range(-1.0..1.0)).collect())
            .collect();
        let (mut med, mut trim) = (vec![0.0; len], vec![0.0; len]);
        CoordinateMedian
            .merge(&refs(&d), &vec![1.0; n], &mut med)
            .unwrap();
        TrimmedMean { trim: 0.2 }
            .merge(&refs(&d), &vec![1.0; n], &mut trim)
            .unwrap();
        for j in 0..len {
            assert!(close(med[j], ref_median(&d, j), 1e-6), "n={n} j={j}");
            assert!(close(trim[j], ref_trimmed(&d, j, 0.2), 1e-5), "n={n} j={j}");
        }
    }
}

#[test]
fn par_helpers_cover_every_coordinate_once() {
    for threads in [1usize, 2, 3, 7] {
        for len in [0usize, 1, 31, 32, 33, 1000] {
            let mut out = vec![0.0f32; len];
            for_each_chunk(&mut out, threads, 32, |start, chunk| {
                assert!(start % 32 == 0);
                for (j, x) in chunk.iter_mut().enumerate() {
                    *x += (start + j) as f32 + 1.0;
                }
            });
            assert!(out.iter().enumerate().all(|(j, &x)| x == j as f32 + 1.0));
            let parts = map_ranges(len, threads, 32, |r| r);
            let flat: Vec<usize> = parts.into_iter().flatten().collect();
            assert_eq!(
                flat,
                (0..len).collect::<Vec<_>>(),
                "threads={threads} len={len}"
            );
        }
    }
}

/// `n_honest` deltas near `center` (spread `0.01`), then `far` deltas far away in different
/// directions.
fn honest_and_far(n_honest: usize, far: usize, len: usize) -> (Vec<Vec<f32>>, Vec<f32>) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    let center: Vec<f32> = (0..len).map(|j| (j as f32 * 0.1).sin()).collect();
    let mut d: Vec<Vec<f32>> = (0..n_honest)
        .map(|_| {
            center
                .iter()
                .map(|&c| c + rng.gen_range(-0.01..0.01))
                .collect()
        })
        .collect();
    for b in 0..far {
        d.push(
            (0..len)
                .map(|j| if j % far.max(1) == b { 100.0 } else { -50.0 })
                .collect(),
        );
    }
    (d, center)
}

#[test]
fn krum_selects_an_honest_delta_when_byzantine_ones_are_far() {
    let (d, _) = honest_and_far(7, 3, 64);
    for f in [3usize, 1, 0] {
        let mut out = vec![0.0; 64];
        let r = Krum::new(f).merge(&refs(&d), &[1.0; 10], &mut out).unwrap();
        assert_eq!(
            r,
            MergeOutcome::Merged {
                aggregator: "krum",
                used: 10
            }
        );
        assert!(d[..7].contains(&out), "f={f}: an honest delta, exactly");
    }
}

#[test]
fn multi_krum_of_identical_honest_deltas_returns_them() {
    let honest: Vec<f32> = (0..100).map(|j| j as f32 * 0.25 - 3.0).collect();
    let mut d = vec![honest.clone(); 7];
    d.push(vec![1e4; 100]);
    d.push(vec![1e4; 100]);
    d.push(vec![-1e4; 100]);
    let (n, f) = (10, 3);
    let mut out = vec![0.0; 100];
    let agg = Krum::multi(f, n - f);
    assert_eq!(agg.name(), "multi_krum");
    agg.merge(&refs(&d), &[1.0; 10], &mut out).unwrap();
    for (o, h) in out.iter().zip(&honest) {
        assert!((o - h).abs() <= 1e-6 * (1.0 + h.abs()), "{o} vs {h}");
    }
    // The fraction constructor: f = floor(0.3·10) = 3, m = n − f = 7.
    assert_eq!(
        Krum::from_fraction(0.3, n, None).unwrap(),
        Krum { f: 3, m: 7 }
    );
}

#[test]
fn krum_with_too_few_deltas_clamps_the_neighbour_count() {
    // n = 3 <= 2f + 2 = 4: k clamps to 1; the two close deltas still win over the far one.
    let d = vec![vec![100.0, 100.0], vec![1.0, 1.0], vec![1.5, 1.0]];
    assert_eq!(Krum::new(1).neighbours(3), 1);
    assert_eq!(Krum::new(100).neighbours(3), 1);
    assert_eq!(Krum::new(0).neighbours(10), 8);
    let mut out = [0.0; 2];
    Krum::new(1).merge(&refs(&d), &[1.0; 3], &mut out).unwrap();
    assert_eq!(out, [1.0, 1.0], "tie between 1 and 2 broken by index");
    // n = 1: that delta; n = 2: both tie, the first wins.
    Krum::new(5)
        .merge(&refs(&d[..1]), &[2.0], &mut out)
        .unwrap();
    assert_eq!(out, [100.0, 100.0]);
    Krum::new(5)
        .merge(&refs(&d[1..]), &[1.0, 1.0], &mut out)
        .unwrap();
    assert_eq!(out, [1.0, 1.0]);
    // m larger than n selects everyone.
    Krum::multi(0, 99)
        .merge(&refs(&d), &[1.0; 3], &mut out)
        .unwrap();
    assert!(
        close(out[0], 102.5 / 3.0, 1e-6) && close(out[1], 34.0, 1e-6),
        "{out:?}"
    );
}

#[test]
fn krum_ranks_non_finite_deltas_last() {
    let d = vec![
        vec![f32::NAN, 0.0],
        vec![1.0, 1.0],
        vec![1.0, 1.5],
        vec![f32::INFINITY, 0.0],
    ];
    let mut out = [0.0; 2];
    Krum::new(1).merge(&refs(&d), &[1.0; 4], &mut out).unwrap();
    assert_eq!(out, [1.0, 1.0]);
}

#[test]
fn krum_and_clipping_exclude_zero_weight_deltas() {
    let d = vec![vec![1.0], vec![2.0], vec![1000.0]];
    let w = [1.0, 1.0, 0.0];
    let aggs: [&dyn Aggregator; 3] = [
        &Krum::new(0),
        &Krum::multi(0, 2),
        &CenteredClipping::default(),
    ];
    for a in aggs {
        let mut out = [0.0];
        let r = a.merge(&refs(&d), &w, &mut out).unwrap();
        assert!(
            matches!(r, MergeOutcome::Merged { used: 2, .. }),
            "{}",
            a.name()
        );
        assert!(out[0] <= 2.0, "{}: {}", a.name(), out[0]);
    }
}

#[test]
fn centered_clipping_stays_near_the_honest_mean_under_scaled_attack() {
    let len = 1000;
    let (mut d, _) = honest_and_far(8, 0, len);
    let honest_mean: Vec<f64> = (0..len)
        .map(|j| d.iter().map(|x| f64::from(x[j])).sum::<f64>() / 8.0)
        .collect();
    let dist = |v: &[f32]| -> f64 {
        v.iter()
            .zip(&honest_mean)
            .map(|(&x, &m)| (f64::from(x) - m).powi(2))
            .sum::<f64>()
            .sqrt()
    };
    let radius = d.iter().map(|x| dist(x)).fold(0.0, f64::max);
    // Two attackers send an honest delta scaled by 1e6, one by -1e6.
    for (k, s) in [(0usize, 1e6f32), (1, 1e6), (2, -1e6)] {
        let scaled: Vec<f32> = d[k].iter().map(|&x| x * s).collect();
        d.push(scaled);
    }
    let n = d.len();
    let (mut cc, mut mean) = (vec![0.0; len], vec![0.0; len]);
    CenteredClipping::default()
        .merge(&refs(&d), &vec![1.0; n], &mut cc)
        .unwrap();
    WeightedMean
        .merge(&refs(&d), &vec![1.0; n], &mut mean)
        .unwrap();
    assert!(
        dist(&cc) <= 2.0 * radius,
        "{} vs radius {radius}",
        dist(&cc)
    );
    assert!(dist(&mean) > 1e4 * radius);
    // A given τ bounds each attacker's pull per iteration by pᵢ·τ.
    let tau = 0.05f32;
    CenteredClipping {
        iterations: 3,
        tau: Some(tau),
    }
    .merge(&refs(&d), &vec![1.0; n], &mut cc)
    .unwrap();
    assert!(dist(&cc) <= 2.0 * radius + 3.0 * 3.0 / n as f64 * f64::from(tau));
}

#[test]
fn centered_clipping_with_no_iterations_is_the_median() {
    let (d, _) = honest_and_far(5, 2, 50);
    let (mut cc, mut med) = (vec![0.0; 50], vec![0.0; 50]);
    CenteredClipping {
        iterations: 0,
        tau: None,
    }
    .merge(&refs(&d), &[1.0; 7], &mut cc)
    .unwrap();
    CoordinateMedian
        .merge(&refs(&d), &[1.0; 7], &mut med)
        .unwrap();
    assert_eq!(cc, med);
}

#[test]
fn bad_parameters_are_errors_and_leave_out_untouched() {
    let d = vec![vec![1.0, 2.0], vec![3.0, 4.0]];
    for tau in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        let mut out = [7.0; 2];
        let a = CenteredClipping {
            iterations: 1,
            tau: Some(tau),
        };
        assert!(matches!(
            a.merge(&refs(&d), &[1.0; 2], &mut out),
            Err(MergeError::BadParameter { name: "tau", .. })
        ));
        assert_eq!(out, [7.0; 2]);
    }
    for frac in [-0.1, 1.0, f32::NAN] {
        assert!(Krum::from_fraction(frac, 10, None).is_err());
        let r = RobustAggregator::Krum {
            byzantine_fraction: frac,
        };
        assert!(r.check().is_err());
        let mut out = [7.0; 2];
        let a = r.build(2);
        assert_eq!(a.name(), "krum");
        assert!(matches!(
            a.merge(&refs(&d), &[1.0; 2], &mut out),
            Err(MergeError::BadParameter {
                name: "byzantine_fraction",
                ..
            })
        ));
        assert_eq!(out, [7.0; 2]);
    }
}

#[test]
fn robust_aggregator_config_round_trips_and_builds() {
    assert_eq!(RobustAggregator::default(), RobustAggregator::Median);
    let cases = [
        (r#"{"kind":"median"}"#, RobustAggregator::Median, "median"),
        (
            r#"{"kind":"trimmed_mean"}"#,
            RobustAggregator::TrimmedMean { trim: 0.2 },
            "trimmed_mean",
        ),
        (
            r#"{"kind":"krum","byzantine_fraction":0.25}"#,
            RobustAggregator::Krum {
                byzantine_fraction: 0.25,
            },
            "krum",
        ),
        (
            r#"{"kind":"multi_krum","byzantine_fraction":0.2}"#,
            RobustAggregator::MultiKrum {
                byzantine_fraction: 0.2,
                select: None,
            },
            "multi_krum",
        ),
        (
            r#"{"kind":"centered_clipping","tau":1.5}"#,
            RobustAggregator::CenteredClipping {
                iterations: 3,
                tau: Some(1.5),
            },
            "centered_clipping",
        ),
    ];
    for (json, want, name) in cases {
        let got: RobustAggregator = serde_json::from_str(json).unwrap();
        assert_eq!(got, want, "{json}");
        let back: RobustAggregator =
            serde_json::from_str(&serde_json::to_string(&got).unwrap()).unwrap();
        assert_eq!(back, want);
        assert!(got.check().is_ok());
        assert_eq!(got.build(10).name(), name);
        assert_eq!(got.name(), name);
    }
    assert!(serde_json::from_str::<RobustAggregator>(r#"{"kind":"krum"}"#).is_err());
    assert!(serde_json::from_str::<RobustAggregator>(
        r#"{"kind":"krum","byzantine_fraction":0.1,"f":2}"#
    )
    .is_err());
    // The policy with a configured robust aggregator.
    let p = RobustPolicy {
        robust: RobustAggregator::MultiKrum {
            byzantine_fraction: 0.3,
            select: None,
        }
        .build(10),
        ..RobustPolicy::default()
    };
    assert_eq!(p.choose(4, 10).name(), "multi_krum");
    assert_eq!(p.choose(3, 10).name(), "weighted_mean");
}
