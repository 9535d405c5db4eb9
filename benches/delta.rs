//! Delta intake benchmarks (DESIGN §6): the one-pass [`intake`] (parse, format check
//! against the model spec, SHA-256 of the payload and finite check together block by
//! block, then Ed25519 verification of the signed statement) against SHA-256 alone
//! ([`payload_hash`], the `sha2` crate) on the same bytes, and the multi-pass path it
//! replaces (parse, [`check_against`], [`payload_hash`], verify). Two deltas, f32:
//!
//! - `lora-qwen3-0.6b-r16`: a Qwen3-0.6B LoRA adapter, rank 16 on all seven projection
//!   modules (392 tensors, 10.1 M parameters, 40.4 MB), random weights;
//! - `full-1GB`: a 1 GiB full-parameter delta of 16 tensors.
//!
//! Throughput is in bytes of delta. The bytes are written to `target/delta-bench-*.hzdl`
//! so that OpenSSL can be timed on exactly them: `openssl dgst -sha256` over several runs
//! (subtract the process start, `openssl dgst -sha256 /dev/null`), or
//! `openssl speed -evp sha256 -bytes 16384` for its in-cache rate. The goal (DESIGN §6):
//! intake ≥ 0.9 × OpenSSL's SHA-256 on the same bytes.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use hanzod::delta::format::{
    check_against, intake, payload_hash, sign_statement, verify_statement, write_delta, DeltaDtype,
    DeltaKind, DeltaView, Statement,
};
use hanzod::delta::model::ModelSpec;
use hanzod::identity::{verifying_key, Identity};
use std::time::Duration;

/// Qwen/Qwen3-0.6B's `config.json`, as released on the Hub.
const QWEN3_0_6B: &str = include_str!("../tests/data/qwen3-0.6b/config.json");

/// The seven projection modules of a Qwen3 block.
const ALL_PROJECTIONS: [&str; 7] = hanzod::delta::model::LINEAR_MODULES;

/// Writes a delta of `kind` holding every tensor of `spec`, values from `value(i)`.
fn delta_for(spec: &ModelSpec, kind: DeltaKind, mut value: impl FnMut(usize) -> f32) -> Vec<u8> {
    let data: Vec<(&str, &[usize], Vec<f32>)> = spec
        .params
        .iter()
        .map(|(name, shape)| {
            let n = shape.iter().product::<usize>();
            (
                name.as_str(),
                shape.as_slice(),
                (0..n).map(&mut value).collect(),
            )
        })
        .collect();
    let parts: Vec<(&str, &[usize], &[f32])> = data
        .iter()
        .map(|(n, s, v)| (*n, *s, v.as_slice()))
        .collect();
    write_delta(kind, 1, DeltaDtype::F32, &parts).expect("write")
}

/// The Qwen3-0.6B LoRA r=16 adapter on all projections, random weights (xorshift, in
/// ±0.01).
fn lora_qwen3() -> (ModelSpec, Vec<u8>) {
    let spec = ModelSpec::from_hf_config(QWEN3_0_6B)
        .expect("config")
        .lora_spec(16, &ALL_PROJECTIONS)
        .expect("lora spec");
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let bytes = delta_for(&spec, DeltaKind::Lora, |_| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.02
    });
    (spec, bytes)
}

/// A full-parameter delta of about `bytes` bytes: 16 tensors `layer.{t}.weight`.
fn full_of(bytes: usize) -> (ModelSpec, Vec<u8>) {
    let per = bytes / 4 / 16;
    let spec = ModelSpec {
        name: format!("16 × {per}"),
        params: (0..16)
            .map(|t| (format!("layer.{t}.weight"), vec![per]))
            .collect(),
        lora: None,
    };
    let bytes = delta_for(&spec, DeltaKind::Full, |i| ((i * 31) % 1000) as f32 * 1e-4);
    (spec, bytes)
}

fn intake_bench(c: &mut Criterion) {
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
    type Case = (&'static str, fn() -> (ModelSpec, Vec<u8>));
    let cases: [Case; 2] = [
        ("lora-qwen3-0.6b-r16", lora_qwen3),
        ("full-1GB", || full_of(1 << 30)),
    ];
    for (label, make) in cases {
        let (spec, bytes) = make();
        let _ = std::fs::write(format!("target/delta-bench-{label}.hzdl"), &bytes);
        let sig = sign_statement(&id, &statement, &payload_hash(&bytes));
        group.throughput(Throughput::Bytes(bytes.len() as u64));
        group.bench_with_input(BenchmarkId::new("sha256", label), &bytes, |b, bytes| {
            b.iter(|| payload_hash(bytes))
        });
        group.bench_with_input(BenchmarkId::new("intake", label), &bytes, |b, bytes| {
            b.iter(|| {
                let intake = intake(bytes, &spec).expect("intake");
                intake
                    .verify_statement(&key, &statement, &sig)
                    .expect("signature");
                intake.view.tensors.len()
            })
        });
        group.bench_with_input(BenchmarkId::new("multi_pass", label), &bytes, |b, bytes| {
            b.iter(|| {
                let view = DeltaView::parse(bytes).expect("parse");
                check_against(&view, &spec).expect("format");
                let hash = payload_hash(bytes);
                verify_statement(&key, &statement, &hash, &sig).expect("signature");
                view.tensors.len()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, intake_bench);
criterion_main!(benches);
