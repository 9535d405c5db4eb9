//! Delta validation math (DESIGN §6) on the built-in `wine-mlp` (hidden 32, 1,473
//! parameters, burn flex CPU backend): the validation loss on the 320-sample shard (loss
//! after, once per delta), the spot-check's batch loss replay (32 samples), a node's
//! `train_local` with the default recipe (20 SGD steps × batch 32), and the delta round trip
//! (`to_delta_bytes` + `DeltaView::parse` + `from_delta_view`, which runs the format check);
//! and the whole validation of one delta as the validator pool runs it (`validate`: hash,
//! signature, step, format, quality score), without and with the spot-check (claimed-loss
//! replay plus the deterministic re-run of the node's 20 steps).

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use hanzod::core::job::TrainingSpec;
use hanzod::core::ports::DeltaReceipt;
use hanzod::core::types::JobId;
use hanzod::delta::format::{payload_hash, sign_statement, DeltaView, Statement};
use hanzod::delta::score::{EpochSecret, NormTracker};
use hanzod::delta::validate::{validate, EpochContext, Submission, ValidationConfig};
use hanzod::identity::Identity;
use hanzod::train::{
    batch_loss, init, train_local, trainer_of, validation_loss, Dataset, Recipe, Weights,
};
use std::hint::black_box;

fn validation(c: &mut Criterion) {
    let data = Dataset::wine_quality().expect("wine quality");
    let recipe = Recipe::default();
    let global = init(&recipe);
    let node = [7u8; 32];
    let trained = train_local(&global, &data, &recipe, &node, 0).expect("train");
    let delta = trained.weights.sub(&global).expect("delta");

    let mut group = c.benchmark_group("validation");
    group.bench_function("validation_loss_320", |b| {
        b.iter(|| validation_loss(black_box(&trained.weights), &data).expect("loss"))
    });
    group.bench_function("batch_loss_32", |b| {
        b.iter(|| batch_loss(black_box(&global), &data, &recipe, &node, 0).expect("loss"))
    });
    group.bench_function("train_local_20x32", |b| {
        b.iter(|| train_local(black_box(&global), &data, &recipe, &node, 0).expect("train"))
    });
    group.bench_function("delta_bytes_parse_from_view", |b| {
        b.iter(|| {
            let bytes = black_box(&delta).to_delta_bytes(1).expect("write");
            let view = DeltaView::parse(&bytes).expect("parse");
            Weights::from_delta_view(&view, delta.layout.clone()).expect("read")
        })
    });

    // The full pipeline of one delta, as a pool worker runs it.
    let id = Identity::from_seed([7; 32]);
    let run = train_local(&global, &data, &recipe, &id.node_id().0, 0).expect("train");
    let payload = run
        .weights
        .sub(&global)
        .expect("delta")
        .to_delta_bytes(0)
        .expect("write");
    let hash = payload_hash(&payload);
    let statement = Statement {
        job: 1,
        epoch: 0,
        step: 0,
        claimed_loss: run.claimed_loss,
    };
    let sub = Submission {
        receipt: DeltaReceipt {
            job: JobId(1),
            node: id.node_id(),
            epoch: 0,
            step: 0,
            delta_hash: hash,
            claimed_loss: run.claimed_loss,
            signature: sign_statement(&id, &statement, &hash).to_vec(),
        },
        payload: payload.into(),
    };
    let context = |rate: f64| EpochContext {
        job: 1,
        epoch: 0,
        trainer: trainer_of(&TrainingSpec::default(), JobId(recipe.job)).expect("trainer"),
        base: Arc::new(global.clone()),
        base_version: 0,
        loss_before: validation_loss(&global, &data).expect("loss"),
        best_loss: None,
        norms: NormTracker::new(),
        last_merged: None,
        secret: EpochSecret::from_bytes([9; 32]),
        config: ValidationConfig {
            spot_check_rate: rate,
            ..ValidationConfig::default()
        },
    };
    for (name, rate) in [
        ("validate_delta", 0.0),
        ("validate_delta_spot_checked", 1.0),
    ] {
        let ctx = context(rate);
        assert!(validate(&ctx, &sub).outcome.is_ok(), "{name}");
        group.bench_function(name, |b| b.iter(|| validate(black_box(&ctx), &sub)));
    }
    group.finish();
}

criterion_group!(benches, validation);
criterion_main!(benches);
