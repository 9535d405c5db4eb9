//! Ring all-reduce of 8 MB and 64 MB (f32) over 4 members on loopback TCP.
//!
//! Reports criterion's throughput as the *algorithmic bandwidth* (vector bytes / round
//! time) and prints the *bus bandwidth* (the bytes each member actually sends,
//! `2(n − 1)/n × size`, the lower bound of Patarasuk & Yuan 2009, "Bandwidth optimal
//! all-reduce algorithms for clusters of workstations", over the round time). Connection
//! setup is outside the timing; the handshake (two signatures per link) is inside.
//!
//! `ring_audit_4_members`: the orchestrator's attribution of a wrong round
//! (`hanzod_allreduce::audit`) from the evidence of a real loopback round in which member 2
//! tampered with its input, per vector size; throughput is the members' delta bytes judged
//! (n × size).

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use hanzod_actors::types::NodeId;
use hanzod_allreduce::audit::{audit, AuditInput};
use hanzod_allreduce::wire::SignedPiece;
use hanzod_allreduce::{all_reduce, loopback_ring, weight_in_place, RoundConfig};
use hanzod_protocol::identity::Identity;

const MEMBERS: usize = 4;

fn round_time(rt: &tokio::runtime::Runtime, elems: usize) -> Duration {
    rt.block_on(async {
        let ids: Vec<Identity> = (0..MEMBERS)
            .map(|i| Identity::from_seed([i as u8 + 1; 32]))
            .collect();
        let cfg = RoundConfig::new(1, 1, 1, ids.iter().map(Identity::node_id).collect());
        let links = loopback_ring(MEMBERS).await.expect("loopback ring");
        let mut datas: Vec<Vec<f32>> = (0..MEMBERS)
            .map(|m| {
                (0..elems)
                    .map(|j| (j % 1000) as f32 * 1e-3 + m as f32)
                    .collect()
            })
            .collect();
        let start = Instant::now();
        let mut tasks = Vec::new();
        for ((id, link), mut data) in ids.into_iter().zip(links).zip(datas.drain(..)) {
            let cfg = cfg.clone();
            tasks.push(tokio::spawn(async move {
                all_reduce(&cfg, &id, Some(link), &mut data)
                    .await
                    .expect("round")
                    .result_sha256
            }));
        }
        let mut hashes = Vec::new();
        for t in tasks {
            hashes.push(t.await.expect("member task"));
        }
        let took = start.elapsed();
        assert!(hashes.windows(2).all(|w| w[0] == w[1]), "members differ");
        took
    })
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut g = c.benchmark_group("ring_allreduce_4_members");
    g.sample_size(10);
    for mb in [8usize, 64] {
        let bytes = mb * 1_000_000;
        let elems = bytes / 4;
        g.throughput(Throughput::Bytes(bytes as u64));
        let mut total = Duration::ZERO;
        let mut rounds = 0u32;
        g.bench_with_input(
            BenchmarkId::from_parameter(format!("{mb}MB")),
            &elems,
            |b, &e| {
                b.iter_custom(|iters| {
                    let mut t = Duration::ZERO;
                    for _ in 0..iters {
                        t += round_time(&rt, e);
                    }
                    total += t;
                    rounds += iters as u32;
                    t
                })
            },
        );
        let per = total / rounds.max(1);
        let algo = bytes as f64 / per.as_secs_f64() / 1e9;
        let bus = algo * 2.0 * (MEMBERS as f64 - 1.0) / MEMBERS as f64;
        println!(
            "ring {MEMBERS} members, {mb} MB: {per:?}/round, algorithmic {algo:.3} GB/s, \
             bus (2(n-1)/n x size per member) {bus:.3} GB/s"
        );
    }
    g.finish();
}

/// The inputs of an attribution: the members' deltas, weights and evidence of a real round
/// where member 2 added 0.5 to its weighted input.
type Attribution = (
    Vec<(NodeId, f32)>,
    Vec<Vec<f32>>,
    Vec<(NodeId, Vec<SignedPiece>)>,
);

fn tampered_round(rt: &tokio::runtime::Runtime, elems: usize) -> Attribution {
    rt.block_on(async {
        let ids: Vec<Identity> = (0..MEMBERS)
            .map(|i| Identity::from_seed([i as u8 + 1; 32]))
            .collect();
        let ring: Vec<NodeId> = ids.iter().map(Identity::node_id).collect();
        let cfg = RoundConfig::new(1, 1, 1, ring.clone());
        let links = loopback_ring(MEMBERS).await.expect("loopback ring");
        let weight = 1.0 / MEMBERS as f32;
        let deltas: Vec<Vec<f32>> = (0..MEMBERS)
            .map(|m| {
                (0..elems)
                    .map(|j| (j % 997) as f32 * 1e-4 - m as f32 * 1e-3)
                    .collect()
            })
            .collect();
        let mut tasks = Vec::new();
        for (m, (id, link)) in ids.into_iter().zip(links).enumerate() {
            let (cfg, mut data) = (cfg.clone(), deltas[m].clone());
            weight_in_place(&mut data, weight);
            if m == 2 {
                data.iter_mut().for_each(|x| *x += 0.5);
            }
            tasks.push(tokio::spawn(async move {
                all_reduce(&cfg, &id, Some(link), &mut data)
                    .await
                    .expect("round")
                    .evidence
            }));
        }
        let mut evidence = Vec::new();
        for (m, t) in tasks.into_iter().enumerate() {
            evidence.push((ring[m], t.await.expect("member task")));
        }
        let members = ring.into_iter().map(|n| (n, weight)).collect();
        (members, deltas, evidence)
    })
}

fn bench_audit(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut g = c.benchmark_group("ring_audit_4_members");
    g.sample_size(10);
    for mb in [8usize, 64] {
        let elems = mb * 1_000_000 / 4;
        let (members, deltas, evidence) = tampered_round(&rt, elems);
        g.throughput(Throughput::Bytes((MEMBERS * mb * 1_000_000) as u64));
        g.bench_function(BenchmarkId::from_parameter(format!("{mb}MB")), |b| {
            b.iter_batched(
                || deltas.iter().cloned().map(Some).collect::<Vec<_>>(),
                |deltas| {
                    let found = audit(AuditInput {
                        job: 1,
                        epoch: 1,
                        ring_version: 1,
                        ring: &members,
                        deltas,
                        evidence: &evidence,
                    });
                    assert_eq!(found.guilty.len(), 1, "{found:?}");
                    found
                },
                BatchSize::LargeInput,
            )
        });
    }
    g.finish();
}

criterion_group!(benches, bench, bench_audit);
criterion_main!(benches);
