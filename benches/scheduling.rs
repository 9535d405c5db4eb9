//! Scheduling benchmarks (paper §3.2, §3.3; DESIGN §12): one `AgingPolicy` decision over
//! 1,000 registered nodes and 100 pending jobs, and the eligibility check over 1,000 nodes.
//! Inputs are random with a fixed seed, so every run measures the same decision.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use hanzod_actors::{sched::*, types::*};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const SEED: u64 = 0x6a6f_6273; // "jobs"
const GIB: u64 = 1 << 30;
const NOW: Timestamp = Timestamp(1_700_000_000_000);
const REGIONS: [&str; 6] = [
    "eu-west",
    "eu-central",
    "us-east",
    "us-west",
    "ap-south",
    "ap-northeast",
];
const VRAM_GIB: [u64; 5] = [16, 24, 40, 48, 80];

/// 1,000 nodes: stakes 5k–100k GYM (≈95 % above the 10k minimum), VRAM 16–80 GiB, uptime
/// mostly ≥ 0.95, 5 % dead, 10 % already assigned, 2 % under a slashing penalty.
fn nodes(rng: &mut ChaCha8Rng, n: usize) -> Vec<NodeView> {
    (0..n)
        .map(|_| {
            let mut id = [0u8; 32];
            rng.fill(&mut id);
            NodeView {
                id: NodeId(id),
                stake: GymWei::gym(rng.gen_range(5_000..100_000)),
                vram_bytes: VRAM_GIB[rng.gen_range(0..VRAM_GIB.len())] * GIB,
                uptime: if rng.gen_bool(0.85) {
                    rng.gen_range(0.95..=1.0)
                } else {
                    rng.gen_range(0.7..0.95)
                },
                penalty_until: rng.gen_bool(0.02).then(|| NOW.plus_ms(3_600_000)),
                region: REGIONS[rng.gen_range(0..REGIONS.len())].to_string(),
                alive: rng.gen_bool(0.95),
                assigned: rng
                    .gen_bool(0.10)
                    .then(|| JobId(rng.gen_range(1_000..2_000))),
                standing_read_at: NOW,
            }
        })
        .collect()
}

/// 100 jobs: submitter stakes 100–1M GYM, utility 0.1–10, waiting 0–2 h, 2–16 to 2–32 nodes,
/// 16–80 GiB VRAM.
fn jobs(rng: &mut ChaCha8Rng, n: usize) -> Vec<PendingJob> {
    (0..n)
        .map(|i| {
            let min_nodes = rng.gen_range(2..=16);
            PendingJob {
                id: JobId(i as u64 + 1),
                submitter_stake: GymWei::gym(rng.gen_range(100..1_000_000)),
                utility: rng.gen_range(0.1..10.0),
                submitted_at: Timestamp(NOW.0 - rng.gen_range(0..7_200_000)),
                min_nodes,
                max_nodes: min_nodes + rng.gen_range(0..=16),
                min_vram_bytes: VRAM_GIB[rng.gen_range(0..VRAM_GIB.len())] * GIB,
            }
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let mut rng = ChaCha8Rng::seed_from_u64(SEED);
    let nodes = nodes(&mut rng, 1_000);
    let jobs = jobs(&mut rng, 100);
    let rules = EligibilityRules::default();
    let policy = AgingPolicy::default();

    let placed = policy.schedule(&jobs, &nodes, &rules, NOW);
    eprintln!(
        "scheduling: {} of {} jobs placed on {} nodes",
        placed.len(),
        jobs.len(),
        placed.iter().map(|p| p.nodes.len()).sum::<usize>()
    );

    c.bench_function("schedule/aging/1000_nodes_100_jobs", |b| {
        b.iter(|| {
            policy.schedule(
                black_box(&jobs),
                black_box(&nodes),
                black_box(&rules),
                black_box(NOW),
            )
        })
    });

    c.bench_function("eligibility/1000_nodes", |b| {
        b.iter(|| {
            black_box(&nodes)
                .iter()
                .filter(|n| check_eligibility(&rules, n, black_box(24 * GIB), NOW).is_ok())
                .count()
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
