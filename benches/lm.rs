//! Language-model training math (issue 17): `qwen3-tiny` (1.05 M parameters, vocabulary
//! 2,048) on burn's flex CPU backend, one thread.
//!
//! - `forward_backward`: the next-token loss and its gradient of one batch of 8 × 128
//!   tokens ([`Qwen3::loss_and_grads`]); throughput in tokens (8 × 127 predicted). The
//!   peer: the same shapes in PyTorch on CPU with one thread,
//!   `python3 tools/lm/qwen3_reference.py bench --config <qwen3-tiny config.json> --batch 8
//!   --seq 128 --threads 1 --steps 20` (this bench writes the config to
//!   `target/qwen3-tiny/config.json`).
//! - `train_step`: one AdamW step on that batch, parameters and moments on the device
//!   ([`Qwen3::train`] with one batch; includes the upload and download of weights and
//!   moments, which a multi-step local run pays once).
//! - `lora_train_step`: one AdamW step of a LoRA adapter (rank 16, `lora_alpha` 32, on all
//!   seven linear modules of every layer; 155,648 adapter parameters) on that batch with
//!   the base frozen ([`Qwen3::train_lora`]). The peer: PEFT on PyTorch, the same shapes,
//!   `python3 tools/lm/qwen3_reference.py bench … --lora-rank 16`.
//! - `validate_delta`: the validation of one delta as the daemon runs it: the held-out loss
//!   of base + delta on the default shard (4,096 tokens in windows of 128).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use hanzod::train::lm::{qwen3_tiny, LmRecipe, LmTask};
use hanzod::train::qwen3::{AdamW, Batch, Qwen3};
use hanzod::train::text::TextData;

fn lm(c: &mut Criterion) {
    let cfg = qwen3_tiny();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/qwen3-tiny");
    std::fs::create_dir_all(&dir).expect("target dir");
    std::fs::write(dir.join("config.json"), cfg.to_json()).expect("config.json");
    let model = Qwen3::new(cfg.clone()).expect("qwen3-tiny");
    let w = model.init(0);
    let (batch, seq) = (8usize, 128usize);
    let tokens: Vec<u32> = (0..batch * seq)
        .map(|i| ((i * 7919 + 13) % cfg.vocab_size) as u32)
        .collect();
    let b = Batch {
        tokens: &tokens,
        batch,
    };

    let mut g = c.benchmark_group("qwen3_tiny");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(10));
    g.throughput(Throughput::Elements((batch * (seq - 1)) as u64));
    g.bench_function("forward_backward", |bench| {
        bench.iter(|| black_box(model.loss_and_grads(&w, b).expect("grads")))
    });
    g.bench_function("train_step", |bench| {
        bench.iter(|| {
            black_box(
                model
                    .train(&w, None, &AdamW::default(), [b])
                    .expect("one step"),
            )
        })
    });
    let targets = hanzod::delta::model::LINEAR_MODULES.map(String::from);
    let lora = model.lora(16, 32.0, &targets).expect("adapter");
    let adapter = model.init_lora(&lora, [7; 32]);
    g.bench_function("lora_train_step", |bench| {
        bench.iter(|| {
            black_box(
                model
                    .train_lora(&w, &lora, &adapter, None, &AdamW::default(), [b])
                    .expect("one step"),
            )
        })
    });

    let recipe = LmRecipe {
        seed: 0,
        job: 1,
        seq_len: 128,
        batch_size: 8,
        local_steps: 1,
        adamw: AdamW::default(),
        validation_tokens: 4096,
    };
    let task = LmTask::new(cfg, recipe, TextData::austen()).expect("task");
    let mut after = w.clone();
    after
        .add_scaled(&vec![1e-3; after.data.len()], 1.0)
        .expect("delta");
    g.throughput(Throughput::Elements(4096));
    g.bench_function("validate_delta", |bench| {
        bench.iter(|| black_box(task.validation_loss(&after).expect("loss")))
    });
    g.finish();
}

criterion_group!(benches, lm);
criterion_main!(benches);
