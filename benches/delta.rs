//! Delta intake benchmarks (DESIGN §6): parse (zero-copy reader, bounds and offsets) +
//! SHA-256 of the payload + finite check + Ed25519 verification of the signed statement,
//! for 10 MB, 100 MB and 1 GB deltas (f32, 16 tensors). Throughput is in bytes of delta;
//! compare SHA-256 alone with `openssl dgst -sha256` on the same bytes
//! (`target/delta-bench-*.hzdl` are written for that).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use hanzod::delta::format::{
    payload_hash, sign_statement, verify_statement, write_delta, DeltaDtype, DeltaKind, DeltaView,
    Statement,
};
use hanzod::identity::{verifying_key, Identity};
use std::time::Duration;

fn delta_of(bytes: usize) -> Vec<u8> {
    let tensors = 16;
    let per = bytes / 4 / tensors;
    let data: Vec<Vec<f32>> = (0..tensors)
        .map(|t| {
            (0..per)
                .map(|i| ((i * 31 + t) % 1000) as f32 * 1e-4)
                .collect()
        })
        .collect();
    let names: Vec<String> = (0..tensors).map(|t| format!("layer.{t}.weight")).collect();
    let shapes: Vec<[usize; 1]> = (0..tensors).map(|_| [per]).collect();
    let parts: Vec<(&str, &[usize], &[f32])> = (0..tensors)
        .map(|t| (names[t].as_str(), &shapes[t][..], data[t].as_slice()))
        .collect();
    write_delta(DeltaKind::Full, 1, DeltaDtype::F32, &parts).expect("write")
}

fn intake(c: &mut Criterion) {
    let id = Identity::from_seed([5; 32]);
    let key = verifying_key(&id.node_id()).expect("key");
    let statement = Statement {
        job: 1,
        epoch: 0,
        step: 500,
        claimed_loss: 2.5,
    };
    let mut group = c.benchmark_group("delta_intake");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(8));
    for (label, size) in [
        ("10MB", 10usize << 20),
        ("100MB", 100 << 20),
        ("1GB", 1 << 30),
    ] {
        let bytes = delta_of(size);
        let _ = std::fs::write(format!("target/delta-bench-{label}.hzdl"), &bytes);
        let sig = sign_statement(&id, &statement, &payload_hash(&bytes));
        group.throughput(Throughput::Bytes(bytes.len() as u64));
        group.bench_with_input(BenchmarkId::new("sha256", label), &bytes, |b, bytes| {
            b.iter(|| payload_hash(bytes))
        });
        group.bench_with_input(
            BenchmarkId::new("parse_hash_check_verify", label),
            &bytes,
            |b, bytes| {
                b.iter(|| {
                    let view = DeltaView::parse(bytes).expect("parse");
                    view.check_finite().expect("finite");
                    let hash = payload_hash(bytes);
                    verify_statement(&key, &statement, &hash, &sig).expect("signature");
                    view.tensors.len()
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, intake);
criterion_main!(benches);
