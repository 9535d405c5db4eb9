//! LoRA merge benchmark (DESIGN §6 "Merge", `hanzod_pipeline::lora`): the merge of 8 and
//! 64 LoRA deltas of a Qwen3-0.6B-shaped adapter (r = 16, alpha = 32, on q/k/v/o/gate/up/down
//! of all 28 layers: 196 modules, 10.09 M adapter parameters per delta, bf16 on the wire)
//! with the score-weighted mean, applied with `outer_lr` to Qwen3-0.6B-shaped f32 base
//! weights (596 M parameters, 2.4 GB). Each merge computes `N × 440 M` elements of
//! `ΔWᵢ = (alpha/r)·Bᵢ·Aᵢ` (`N × 14.1 GFLOP`), aggregates them module by module and adds the
//! result to the base; throughput is reported in those `ΔWᵢ` elements.
//!
//! Before each criterion group one merge is run alone and timed, with its peak memory:
//! the kernel's resident-set high-water mark is reset (`/proc/self/clear_refs` ← `5`)
//! after the inputs are built, so `VmHWM − VmRSS` afterwards is what the merge itself
//! added (on Linux; elsewhere only the time is printed).
//!
//! The 64-delta merge takes tens of seconds on one core, so criterion's minimum of 10
//! samples would run for minutes: it is measured once, alone, unless
//! `HANZOD_BENCH_LORA_64=1` asks for the criterion run too.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use hanzod::delta::format::{write_delta, DeltaDtype, DeltaKind, DeltaView};
use hanzod::delta::merge::WeightedMean;
use hanzod::delta::model::ModelSpec;
use hanzod::train::{Layout, Weights};
use hanzod_pipeline::lora::{apply_lora_merge, LoraPlan};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The published Qwen/Qwen3-0.6B `config.json`.
const QWEN3_0_6B: &str = include_str!("../tests/data/qwen3-0.6b/config.json");

const TARGETS: [&str; 7] = hanzod::delta::model::LINEAR_MODULES;

/// Deterministic fill: a cheap integer hash of (stream, index) mapped to [-scale, scale).
fn fill(stream: u64, len: usize, scale: f32) -> impl Iterator<Item = f32> {
    (0..len).map(move |j| {
        let mut x = stream << 40 ^ j as u64;
        x = x.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        x ^= x >> 29;
        ((x >> 40) as f32 / (1u64 << 23) as f32 - 1.0) * scale
    })
}

/// One node's LoRA delta (bf16) for `plan`.
fn lora_delta(plan: &LoraPlan, node: u64) -> Vec<u8> {
    let r = plan.rank;
    let owned: Vec<(String, Vec<usize>, Vec<f32>)> = plan
        .modules
        .iter()
        .enumerate()
        .flat_map(|(i, m)| {
            let s = (node << 20) ^ ((i as u64) << 1);
            [
                (
                    m.lora_a.clone(),
                    vec![r, m.in_features],
                    fill(s, r * m.in_features, 0.05).collect(),
                ),
                (
                    m.lora_b.clone(),
                    vec![m.out_features, r],
                    fill(s | 1, m.out_features * r, 0.05).collect(),
                ),
            ]
        })
        .collect();
    let parts: Vec<(&str, &[usize], &[f32])> = owned
        .iter()
        .map(|(n, s, v)| (n.as_str(), s.as_slice(), v.as_slice()))
        .collect();
    write_delta(DeltaKind::Lora, 0, DeltaDtype::Bf16, &parts).expect("write delta")
}

/// `VmRSS` and `VmHWM` of this process in bytes (Linux), if readable.
fn rss_hwm() -> Option<(u64, u64)> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |k: &str| -> Option<u64> {
        let l = s.lines().find(|l| l.starts_with(k))?;
        let kb: u64 = l[k.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        Some(kb * 1024)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

fn lora_merge(c: &mut Criterion) {
    let base_spec = ModelSpec::from_hf_config(QWEN3_0_6B).expect("config");
    let plan = LoraPlan::from_spec(&base_spec.lora_spec(16, &TARGETS).expect("lora spec"), 32.0)
        .expect("plan");
    let layout = Arc::new(Layout::new(&base_spec).expect("layout"));
    let mut base = Weights::from_vec(
        layout.clone(),
        fill(u64::MAX >> 24, layout.len(), 0.05).collect(),
    )
    .expect("weights");
    let dw_elements: u64 = plan.modules.iter().map(|m| m.weight_len() as u64).sum();
    let full_64 = std::env::var_os("HANZOD_BENCH_LORA_64").is_some_and(|v| v == "1");
    eprintln!(
        "lora_merge: {} modules, {} adapter parameters per delta, {} ΔW elements per node, \
         base {} parameters",
        plan.modules.len(),
        plan.adapter_params(),
        dw_elements,
        layout.len()
    );

    let mut g = c.benchmark_group("lora_merge");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(20))
        .warm_up_time(Duration::from_secs(1));
    for n in [8usize, 64] {
        let t = Instant::now();
        let bytes: Vec<Vec<u8>> = (0..n as u64).map(|i| lora_delta(&plan, i)).collect();
        let views: Vec<DeltaView<'_>> = bytes
            .iter()
            .map(|b| DeltaView::parse(b).expect("parse"))
            .collect();
        let w: Vec<f32> = (0..n).map(|i| 0.5 + (i % 5) as f32 * 0.1).collect();
        eprintln!(
            "lora_merge/{n}: built {n} deltas ({:.0} MiB bf16) in {:.1} s",
            mib(bytes.iter().map(|b| b.len() as u64).sum()),
            t.elapsed().as_secs_f64()
        );

        // One merge alone: time and the memory it adds on top of the inputs.
        let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
        let before = rss_hwm();
        let t = Instant::now();
        apply_lora_merge(&mut base, &plan, &views, &w, &WeightedMean, 0.5).expect("merge");
        let secs = t.elapsed().as_secs_f64();
        let predicted = plan.scratch_floats(n).unwrap_or(0) as u64 * 4;
        match (reset, before, rss_hwm()) {
            (true, Some((rss0, _)), Some((_, hwm))) => eprintln!(
                "lora_merge/{n}: one merge {secs:.2} s; peak RSS {:.0} MiB, {:.0} MiB above \
                 the {:.0} MiB of inputs and base weights (scratch + merged buffer: {:.0} MiB)",
                mib(hwm),
                mib(hwm.saturating_sub(rss0)),
                mib(rss0),
                mib(predicted)
            ),
            _ => eprintln!("lora_merge/{n}: one merge {secs:.2} s (peak memory not readable)"),
        }

        if n == 64 && !full_64 {
            continue;
        }
        g.throughput(Throughput::Elements(n as u64 * dw_elements));
        g.bench_function(format!("weighted_mean/{n}x_qwen3_0.6b_r16"), |b| {
            b.iter(|| {
                apply_lora_merge(&mut base, &plan, &views, &w, &WeightedMean, 0.5).expect("merge")
            })
        });
    }
    g.finish();
}

criterion_group!(benches, lora_merge);
criterion_main!(benches);
