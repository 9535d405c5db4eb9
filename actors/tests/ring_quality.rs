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
