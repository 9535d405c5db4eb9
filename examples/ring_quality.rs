//! Ring quality report (DESIGN §4): bottleneck / exact optimum for the paper's Algorithm 1
//! and the default builder on seeded random instances (uniform i.i.d. bandwidths, and 4
//! clustered regions with asymmetric noise), N = 8..=12; then default / Algorithm 1 and
//! build times for N = 64 and 1,000 (10,000 with `RING_10K=1`). `RING_INSTANCES` sets the
//! number of instances per row (default 500). Build in release mode.
use std::time::Instant;

use hanzod_actors::ring::*;

fn stats(mut v: Vec<f64>) -> (f64, f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let mean = v.iter().sum::<f64>() / n as f64;
    (v[0], v[n / 10], v[n / 2], mean)
}

fn instance(kind: &str, n: usize, seed: u64) -> (BandwidthMatrix, Vec<String>) {
    match kind {
        "uniform" => (random_uniform(n, seed), vec![String::new(); n]),
        _ => random_clustered(n, 4, seed),
    }
}

fn main() {
    let instances: u64 = std::env::var("RING_INSTANCES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(500);
    let alg1 = Algorithm1::default();
    let default = default_builder();
    let heur = ThresholdRingBuilder {
        search_budget: 0,
        ..default
    };
    println!(
        "bottleneck / exact optimum over {instances} instances per row (min / p10 / median / mean)"
    );
    println!(
        "{:<10} {:>3} | {:^31} | {:^31} | {:^31}",
        "kind", "N", "algorithm1", "threshold (default)", "threshold, no DFS"
    );
    for kind in ["uniform", "clustered"] {
        for n in 8..=12 {
            let (mut a, mut d, mut h) = (Vec::new(), Vec::new(), Vec::new());
            for i in 0..instances {
                let seed = 1_000_000 * n as u64 + i;
                let (bw, regions) = instance(kind, n, seed);
                let (opt, _) = exact_max_bottleneck(&bw).expect("n <= 12");
                let r = |o: Vec<usize>| f64::from(bottleneck(&bw, &o)) / f64::from(opt);
                a.push(r(alg1.build(&bw, &regions)));
                d.push(r(default.build(&bw, &regions)));
                h.push(r(heur.build(&bw, &regions)));
            }
            let f =
                |s: (f64, f64, f64, f64)| format!("{:.3} {:.3} {:.3} {:.3}", s.0, s.1, s.2, s.3);
            println!(
                "{kind:<10} {n:>3} | {:^31} | {:^31} | {:^31}",
                f(stats(a)),
                f(stats(d)),
                f(stats(h))
            );
        }
    }
    println!();
    println!("large N: default / algorithm1 bottleneck ratio (min / p10 / median / mean), median build ms");
    for kind in ["uniform", "clustered"] {
        for (n, reps) in [(64usize, 50u64), (1000, 10), (10_000, 1)] {
            let reps = if n == 10_000 && std::env::var("RING_10K").is_err() {
                0
            } else {
                reps
            };
            if reps == 0 {
                continue;
            }
            let (mut ratio, mut ta, mut td) = (Vec::new(), Vec::new(), Vec::new());
            for i in 0..reps {
                let (bw, regions) = instance(kind, n, 7_000_000 + i);
                let t0 = Instant::now();
                let oa = alg1.build(&bw, &regions);
                ta.push(t0.elapsed().as_secs_f64() * 1e3);
                let t0 = Instant::now();
                let od = default.build(&bw, &regions);
                td.push(t0.elapsed().as_secs_f64() * 1e3);
                ratio.push(f64::from(bottleneck(&bw, &od)) / f64::from(bottleneck(&bw, &oa)));
            }
            let s = stats(ratio);
            println!("{kind:<10} {n:>5} | ratio {:.3} {:.3} {:.3} {:.3} | alg1 {:.2} ms | default {:.2} ms",
                s.0, s.1, s.2, s.3, stats(ta).2, stats(td).2);
        }
    }
}
