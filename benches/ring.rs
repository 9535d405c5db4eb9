//! Ring construction and recovery benchmarks (DESIGN §4): the default builder and the
//! paper's Algorithm 1 on 64, 1,000 and 10,000 nodes (uniform and 4-region clustered
//! random bandwidths; each matrix is built once, outside the timed loop), and recovery
//! from 1 and 3 simultaneous failures in a 64-node ring with 2 standbys.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use hanzod_actors::ring::*;

fn construction(c: &mut Criterion) {
    let builders: Vec<Box<dyn RingBuilder>> =
        vec![Box::new(default_builder()), Box::new(Algorithm1::default())];
    let cases = [
        ("uniform", 64usize),
        ("clustered", 64),
        ("uniform", 1_000),
        ("clustered", 1_000),
        ("uniform", 10_000),
    ];
    for (kind, n) in cases {
        let (bw, regions) = match kind {
            "uniform" => (random_uniform(n, 42), Vec::new()),
            _ => random_clustered(n, 4, 42),
        };
        let mut group = c.benchmark_group(format!("ring_build_{kind}_{n}"));
        if n >= 10_000 {
            group
                .sample_size(10)
                .measurement_time(Duration::from_secs(20));
        }
        for b in &builders {
            group.bench_with_input(BenchmarkId::new(b.name(), n), &bw, |bench, bw| {
                bench.iter(|| b.build(bw, &regions))
            });
        }
        group.finish();
    }
}

fn recovery(c: &mut Criterion) {
    // Nodes 0..64 form the ring, 64 and 65 are the standbys.
    let bw = random_uniform(66, 7);
    let ring_bw = BandwidthMatrix::from_fn(64, |i, j| bw.get(i, j));
    let order = default_builder().build(&ring_bw, &[]);
    let standby = [64usize, 65];
    let mut group = c.benchmark_group("ring_recover_64");
    for failed in [vec![order[10]], vec![order[3], order[4], order[40]]] {
        group.bench_with_input(
            BenchmarkId::new("failures", failed.len()),
            &failed,
            |bench, failed| bench.iter(|| recover(&order, failed, &standby, &bw)),
        );
    }
    group.finish();
}

criterion_group!(benches, construction, recovery);
criterion_main!(benches);
