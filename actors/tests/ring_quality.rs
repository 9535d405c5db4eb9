//! Quality bounds of the default ring builder (DESIGN §4) against the exact optimum on
//! small seeded random instances, and against the paper's Algorithm 1 on larger ones.
//! Every failure message carries the kind, `n` and seed needed to reproduce it.

use hanzod_actors::ring::*;

const INSTANCES_PER_KIND: u64 = 300;

fn instance(kind: &str, n: usize, seed: u64) -> (BandwidthMatrix, Vec<String>) {
    match kind {
        "uniform" => (random_uniform(n, seed), Vec::new()),
        _ => random_clustered(n, 4, seed),
    }
}

#[test]
fn default_builder_is_near_optimal_for_small_rings() {
    let builder = default_builder();
    for kind in ["uniform", "clustered"] {
        let mut ratios: Vec<(f64, usize, u64)> = Vec::new();
        for i in 0..INSTANCES_PER_KIND {
            let n = 4 + (i % 9) as usize; // 4..=12
            let seed = 0x5eed_0000 + i;
            let (bw, regions) = instance(kind, n, seed);
            let (opt, _) = exact_max_bottleneck(&bw).expect("n <= 12");
            let order = builder.build(&bw, &regions);
            let got = bottleneck(&bw, &order);
            assert!(
                got <= opt,
                "{kind} n={n} seed={seed}: {got} above the optimum {opt}"
            );
            let ratio = if opt > 0.0 {
                f64::from(got) / f64::from(opt)
            } else {
                1.0
            };
            ratios.push((ratio, n, seed));
        }
        ratios.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (worst, wn, wseed) = ratios[0];
        let median = ratios[ratios.len() / 2].0;
        println!("{kind}: worst {worst:.3} (n={wn} seed={wseed}), median {median:.3}");
        assert!(median >= 0.97, "{kind}: median ratio {median:.3} < 0.97");
        assert!(
            worst >= 0.90,
            "{kind}: worst ratio {worst:.3} < 0.90 at n={wn} seed={wseed}"
        );
    }
}

#[test]
fn default_builder_never_loses_to_algorithm1_on_large_rings() {
    let (default, alg1) = (default_builder(), Algorithm1::default());
    for kind in ["uniform", "clustered"] {
        for n in [64usize, 256] {
            for seed in 0..4u64 {
                let seed = 0xb16_0000 + seed;
                let (bw, regions) = instance(kind, n, seed);
                let d = bottleneck(&bw, &default.build(&bw, &regions));
                let a = bottleneck(&bw, &alg1.build(&bw, &regions));
                assert!(
                    d >= a,
                    "{kind} n={n} seed={seed}: default {d} < algorithm1 {a}"
                );
            }
        }
    }
}

/// The threshold heuristic on its own (no depth-first search, not seeded with
/// Algorithm 1's ring) must hold the median bound and beat Algorithm 1 in the median, so a
/// regression in the heuristic cannot hide behind the exact search or the comparison.
#[test]
fn threshold_heuristic_alone_holds_the_median_and_beats_algorithm1() {
    let heuristic = ThresholdRingBuilder {
        search_budget: 0,
        search_max_nodes: 0,
        compare_algorithm1: false,
        ..ThresholdRingBuilder::default()
    };
    let alg1 = Algorithm1::default();
    for kind in ["uniform", "clustered"] {
        let mut ratios = Vec::new();
        for i in 0..INSTANCES_PER_KIND {
            let n = 4 + (i % 9) as usize;
            let seed = 0x0de1_0000 + i;
            let (bw, regions) = instance(kind, n, seed);
            let (opt, _) = exact_max_bottleneck(&bw).expect("n <= 12");
            let got = bottleneck(&bw, &heuristic.build(&bw, &regions));
            ratios.push(if opt > 0.0 {
                f64::from(got) / f64::from(opt)
            } else {
                1.0
            });
        }
        ratios.sort_by(f64::total_cmp);
        let (p10, median) = (ratios[ratios.len() / 10], ratios[ratios.len() / 2]);
        println!(
            "{kind} heuristic alone: worst {:.3} p10 {p10:.3} median {median:.3}",
            ratios[0]
        );
        assert!(
            median >= 0.97,
            "{kind}: heuristic median {median:.3} < 0.97"
        );
        assert!(p10 >= 0.90, "{kind}: heuristic p10 {p10:.3} < 0.90");
        for n in [64usize, 256] {
            let mut wins = 0;
            for s in 0..5u64 {
                let seed = 0xa1_0000 + s;
                let (bw, regions) = instance(kind, n, seed);
                let h = bottleneck(&bw, &heuristic.build(&bw, &regions));
                let a = bottleneck(&bw, &alg1.build(&bw, &regions));
                wins += usize::from(h >= a);
            }
            assert!(
                wins >= 3,
                "{kind} n={n}: heuristic beat algorithm1 on only {wins}/5"
            );
        }
    }
}
