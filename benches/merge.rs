//! Merge benchmarks (DESIGN §6 "Merge"): score-weighted merge of 8 and 64
//! deltas of 10 M f32 parameters, side by side with a plain memory copy of the same input
//! bytes into one buffer (the memory-bandwidth ceiling); the coordinate-wise median of
//! 8 × 10 M, 64 × 1 M and 256 × 1 M and the trimmed mean (trim 0.2) of 64 × 1 M and
//! 256 × 1 M; Krum, Multi-Krum (f = N/4, m = N − f) and centered clipping (L = 3, τ derived)
//! of 8 × 1 M and 64 × 1 M. Throughput is reported over the total input bytes (N × len × 4);
//! `benches/merge_numpy.py` measures numpy on the same shapes for the ratio.
//!
//! The robust aggregators use every core the process may run on
//! (`std::thread::available_parallelism`); `taskset -c 0 cargo bench …` measures one thread.
//! Filter by group entry, e.g. `cargo bench --bench merge -- 'median/256'`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use hanzod::delta::merge::{
    Aggregator, CenteredClipping, CoordinateMedian, Krum, TrimmedMean, WeightedMean,
};
use std::time::Duration;

/// Deterministic fill: a cheap integer hash of (delta, index) mapped to [-1, 1).
fn deltas(n: usize, len: usize) -> Vec<Vec<f32>> {
    (0..n)
        .map(|i| {
            (0..len)
                .map(|j| {
                    let mut x = (i as u64) << 40 ^ j as u64;
                    x = x.wrapping_mul(0x9E37_79B9_7F4A_7C15);
                    x ^= x >> 29;
                    (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
                })
                .collect()
        })
        .collect()
}

fn weights(n: usize) -> Vec<f32> {
    (0..n).map(|i| 0.5 + (i % 5) as f32 * 0.1).collect()
}

fn merge(c: &mut Criterion) {
    let mut g = c.benchmark_group("merge");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(5))
        .warm_up_time(Duration::from_secs(1));

    // Building the inputs takes a while (and up to 5 GB): only for the selected entries. A
    // filter selects an entry when one of its `|`-separated alternatives is a substring of
    // the entry's id (criterion's own filter is a regex; keep filters to plain alternations).
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-') && a.parse::<f64>().is_err())
        .collect();
    let wanted = |name: &str| {
        let id = format!("merge/{name}");
        filters.is_empty()
            || filters
                .iter()
                .any(|f| f.split('|').any(|alt| id.contains(alt)))
    };
    for n in [8usize, 64] {
        let len = 10_000_000;
        if !wanted(&format!("weighted_mean/{n}x10M")) && !wanted(&format!("memcpy/{n}x10M")) {
            continue;
        }
        let d = deltas(n, len);
        let r: Vec<&[f32]> = d.iter().map(|v| v.as_slice()).collect();
        let w = weights(n);
        let mut out = vec![0.0f32; len];
        let mut copy = vec![0.0f32; n * len];
        g.throughput(Throughput::Bytes((n * len * 4) as u64));
        g.bench_function(format!("weighted_mean/{n}x10M"), |b| {
            b.iter(|| WeightedMean.merge(&r, &w, &mut out).expect("merge"))
        });
        g.bench_function(format!("memcpy/{n}x10M"), |b| {
            b.iter(|| {
                for (dst, src) in copy.chunks_exact_mut(len).zip(&r) {
                    dst.copy_from_slice(src);
                }
                std::hint::black_box(&mut copy);
            })
        });
    }

    for (n, len, label) in [
        (8usize, 10_000_000usize, "8x10M"),
        (64, 1_000_000, "64x1M"),
        (256, 1_000_000, "256x1M"),
    ] {
        let names = [format!("median/{label}"), format!("trimmed_mean/{label}")];
        if !names.iter().any(|x| wanted(x)) {
            continue;
        }
        let d = deltas(n, len);
        let r: Vec<&[f32]> = d.iter().map(|v| v.as_slice()).collect();
        let w = weights(n);
        let mut out = vec![0.0f32; len];
        g.throughput(Throughput::Bytes((n * len * 4) as u64));
        g.bench_function(&names[0], |b| {
            b.iter(|| CoordinateMedian.merge(&r, &w, &mut out).expect("merge"))
        });
        if n > 8 {
            g.bench_function(&names[1], |b| {
                b.iter(|| {
                    TrimmedMean { trim: 0.2 }
                        .merge(&r, &w, &mut out)
                        .expect("merge")
                })
            });
        }
    }

    for n in [8usize, 64] {
        let len = 1_000_000;
        let names = [
            format!("krum/{n}x1M"),
            format!("multi_krum/{n}x1M"),
            format!("centered_clipping/{n}x1M"),
        ];
        if !names.iter().any(|x| wanted(x)) {
            continue;
        }
        let d = deltas(n, len);
        let r: Vec<&[f32]> = d.iter().map(|v| v.as_slice()).collect();
        let w = vec![1.0f32; n];
        let mut out = vec![0.0f32; len];
        let f = n / 4;
        g.throughput(Throughput::Bytes((n * len * 4) as u64));
        g.bench_function(&names[0], |b| {
            b.iter(|| Krum::new(f).merge(&r, &w, &mut out).expect("merge"))
        });
        g.bench_function(&names[1], |b| {
            b.iter(|| {
                Krum::multi(f, n - f)
                    .merge(&r, &w, &mut out)
                    .expect("merge")
            })
        });
        g.bench_function(&names[2], |b| {
            b.iter(|| {
                CenteredClipping::default()
                    .merge(&r, &w, &mut out)
                    .expect("merge")
            })
        });
    }
    g.finish();
}

criterion_group!(benches, merge);
criterion_main!(benches);
