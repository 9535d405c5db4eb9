//! Delta sketches (ring mode's check of a reduction, `hanzod::delta::sketch`): the
//! CountSketch of 16 M f32 values (64 MiB, a 16 M-parameter delta) at k = 256, against a
//! pass that only reads the same values and sums their magnitudes in f64 (the memory-bound
//! floor any sketch pays), in one run. Throughput is over the values' bytes.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use hanzod::delta::sketch::{sketch, DEFAULT_ROWS};

fn sketches(c: &mut Criterion) {
    let len = 16 << 20;
    let mut x: u32 = 0x9E37_79B9;
    let values: Vec<f32> = (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x as f32 / u32::MAX as f32) - 0.5
        })
        .collect();
    let mut g = c.benchmark_group("sketch");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Bytes(len as u64 * 4));
    g.bench_function("read_abs_sum/64MiB", |b| {
        b.iter(|| {
            black_box(&values)
                .iter()
                .map(|v| f64::from(v.abs()))
                .sum::<f64>()
        })
    });
    g.bench_function("countsketch_k256/64MiB", |b| {
        b.iter(|| sketch(&[7; 32], DEFAULT_ROWS, black_box(&values)))
    });
    g.finish();
}

criterion_group!(benches, sketches);
criterion_main!(benches);
