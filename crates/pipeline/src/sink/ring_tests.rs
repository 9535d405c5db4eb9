//! Ring aggregation through [`TrainingSink`] (DESIGN §6.4): the seeds, the reduction
//! check, the sketch scoring in the job's keeper, and the ring branch of the publication
//! (the round's merge applied, corrected for rejected spot-checked members).

use super::*;
use crate::epoch::DRIFT_TOLERANCE;
use hanzod_actors::ports::memory::MemoryMetrics;
use hanzod_protocol::hzdl::{payload_hash, sign_statement, Statement};
use hanzod_protocol::sketch::{sketch, DEFAULT_ROWS};
use hanzod_store::MemoryBlobStore;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const SEED: [u8; 32] = [42; 32];

fn spec() -> JobSpec {
    JobSpec {
        name: "wine".into(),
        epochs: 3,
        min_nodes: 1,
        max_nodes: 8,
        min_vram_bytes: 0,
        pending_deadline_ms: 1_000,
        epoch_deadline_ms: 1_000,
        utility: 1.0,
        submitter_stake: GymWei::gym(1),
        training: TrainingSpec::default(),
    }
}

struct Fixture {
    sink: TrainingSink,
    blobs: Arc<MemoryBlobStore>,
    publication: Publication,
    trainer: Trainer,
}

async fn fixture(rate: f64) -> Fixture {
    fixture_with(rate, None).await
}

async fn fixture_with(rate: f64, economics: Option<Economics>) -> Fixture {
    let blobs = Arc::new(MemoryBlobStore::new());
    let publication = Publication::memory();
    let config = SinkConfig {
        validation: ValidationConfig {
            spot_check_rate: rate,
            ..ValidationConfig::default()
        },
        workers: 1,
        ..SinkConfig::default()
    };
    let sink = TrainingSink::start(
        blobs.clone(),
        Arc::new(ModelCatalog::builtin()),
        SEED,
        config,
        Arc::new(MemoryMetrics::new()),
        economics,
        publication.clone(),
    )
    .await
    .expect("sink");
    let trainer = trainer_of(&TrainingSpec::default(), JobId(1)).expect("wine-mlp");
    Fixture {
        sink,
        blobs,
        publication,
        trainer,
    }
}

fn node(i: u8) -> Identity {
    Identity::from_seed([i; 32])
}

/// The model's tensors (name, shape), for [`round::result_payload`].
fn layout_of(trainer: &Trainer) -> Vec<(String, Vec<usize>)> {
    trainer
        .layout()
        .entries()
        .iter()
        .map(|e| (e.name.clone(), e.shape.clone()))
        .collect()
}

/// `n` deltas sharing a direction (`common`) with their own noise, scale about `1e-3`.
fn deltas(seed: u64, n: usize, len: usize) -> Vec<Vec<f32>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut gauss = move || {
        let (u, v): (f64, f64) = (rng.gen_range(1e-12..1.0), rng.gen_range(0.0..1.0));
        ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
    };
    let common: Vec<f32> = (0..len).map(|_| gauss()).collect();
    (0..n)
        .map(|_| {
            common
                .iter()
                .map(|c| 1e-3 * (c + 0.5 * gauss()))
                .collect::<Vec<f32>>()
        })
        .collect()
}

/// `Σ wᵢ·δᵢ` as a ring reduces it: each product rounded to f32, summed in f32 in ring
/// order.
fn reduce(weights: &[f32], deltas: &[Vec<f32>]) -> Vec<f32> {
    let mut out = vec![0.0f32; deltas[0].len()];
    for (w, d) in weights.iter().zip(deltas) {
        for (o, x) in out.iter_mut().zip(d) {
            *o += w * x;
        }
    }
    out
}

fn data_of(s: &Sketch) -> SketchData {
    SketchData {
        rows: s.rows.clone(),
        abs_rows: s.abs_rows.clone(),
        len: s.len,
    }
}

async fn store(blobs: &MemoryBlobStore, payload: Vec<u8>) -> [u8; 32] {
    let hash = payload_hash(&payload);
    blobs.put(hash, payload.into()).await.expect("stored");
    hash
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ring_seeds_are_the_epochs_and_open_their_commitments() {
    let f = fixture(0.1).await;
    let a = f.sink.ring_seeds(JobId(3), 2).expect("a ring sink");
    assert_eq!(f.sink.ring_seeds(JobId(3), 2), Some(a));
    assert_ne!(
        f.sink.ring_seeds(JobId(3), 3).expect("seeds").score,
        a.score
    );
    assert_ne!(
        f.sink.ring_seeds(JobId(4), 2).expect("seeds").score,
        a.score
    );
    assert_ne!(a.score, a.check);
    assert_eq!(
        round::check_reveal(&a.score_commitment, &a.score),
        Some(a.score)
    );
    assert_eq!(
        round::check_reveal(&a.check_commitment, &a.check),
        Some(a.check)
    );
    // From the epoch's spot-check secret, which the report reveals.
    let secret = EpochSecret::derive(&SEED, 3, 2);
    assert_eq!(
        a.score,
        round::epoch_seed(secret.as_bytes(), SeedPurpose::Score)
    );
    assert_eq!(
        a.check,
        round::epoch_seed(secret.as_bytes(), SeedPurpose::Check)
    );
    // The selection is star mode's, at the configured rate.
    let mut selected = 0;
    for i in 0..200u8 {
        let hash = [i; 32];
        let s = f.sink.ring_selected(JobId(3), 2, &hash);
        assert_eq!(s, is_spot_checked(&secret, &hash, 0.1));
        selected += usize::from(s);
    }
    assert!((5..=40).contains(&selected), "{selected}");
    f.sink.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ring_check_accepts_the_honest_sum_and_refuses_a_tampered_one() {
    let f = fixture(0.1).await;
    let spec = spec();
    let layout = layout_of(&f.trainer);
    let len = f.trainer.layout().len();
    let seeds = f.sink.ring_seeds(JobId(1), 0).expect("seeds");
    let ds = deltas(1, 3, len);
    let w = [0.5f32, 0.3, 0.2];
    let members: Vec<(NodeId, f32, SketchData)> = ds
        .iter()
        .zip(w)
        .enumerate()
        .map(|(i, (d, w))| {
            let s = sketch(&seeds.check, DEFAULT_ROWS, d).expect("sketch");
            (node(i as u8 + 1).node_id(), w, data_of(&s))
        })
        .collect();
    let check = |result| RingCheckInput {
        job: JobId(1),
        epoch: 0,
        spec: &spec,
        result,
        seed: seeds.check,
        members: &members,
        uploaded: &[],
        score_seed: seeds.score,
        scoring: &[],
    };
    // Any summation order is within the tolerance.
    let mut honest = reduce(&w, &ds);
    let hash = store(
        &f.blobs,
        round::result_payload(&layout, 0, &honest).unwrap(),
    )
    .await;
    assert_eq!(f.sink.ring_check(check(hash)).await.expect("ran"), Ok(()));
    let reversed = reduce(
        &[w[2], w[1], w[0]],
        &[ds[2].clone(), ds[1].clone(), ds[0].clone()],
    );
    let hash = store(
        &f.blobs,
        round::result_payload(&layout, 0, &reversed).unwrap(),
    )
    .await;
    assert_eq!(f.sink.ring_check(check(hash)).await.expect("ran"), Ok(()));
    // One coordinate off by 1e-2.
    honest[5] += 1e-2;
    let hash = store(
        &f.blobs,
        round::result_payload(&layout, 0, &honest).unwrap(),
    )
    .await;
    let why = f
        .sink
        .ring_check(check(hash))
        .await
        .expect("ran")
        .expect_err("tampered");
    assert!(why.why.contains("not the members' weighted sum"), "{why}");
    assert!(
        why.unbound.is_empty(),
        "nobody's sketch is proved wrong: {why:?}"
    );
    // A result of another shape is refused; a missing or unparseable one is an error.
    let short = vec![("fc1.weight".to_string(), vec![2, 2])];
    let hash = store(
        &f.blobs,
        round::result_payload(&short, 0, &[0.0; 4]).unwrap(),
    )
    .await;
    let why = f.sink.ring_check(check(hash)).await.expect("ran");
    assert!(why.is_err(), "{why:?}");
    assert!(f.sink.ring_check(check([9; 32])).await.is_err());
    let hash = store(&f.blobs, b"not a delta".to_vec()).await;
    assert!(f.sink.ring_check(check(hash)).await.is_err());

    // A member whose delta the orchestrator holds (a spot-checked upload) must have sent the
    // check sketch of exactly that delta: one that reduced and sketched δ + p instead is
    // refused, though the sum itself matches its sketches.
    let tampered: Vec<f32> = ds[0].iter().map(|x| x + 0.25).collect();
    let held = store(&f.blobs, round::result_payload(&layout, 0, &ds[0]).unwrap()).await;
    let mut lying = members.clone();
    lying[0].2 = data_of(&sketch(&seeds.check, DEFAULT_ROWS, &tampered).expect("sketch"));
    let sum = reduce(&w, &[tampered, ds[1].clone(), ds[2].clone()]);
    let sum = store(&f.blobs, round::result_payload(&layout, 0, &sum).unwrap()).await;
    let uploaded = [(members[0].0, held)];
    let input = |members| RingCheckInput {
        job: JobId(1),
        epoch: 0,
        spec: &spec,
        result: sum,
        seed: seeds.check,
        members,
        uploaded: &uploaded,
        score_seed: seeds.score,
        scoring: &[],
    };
    let why = f
        .sink
        .ring_check(input(&lying))
        .await
        .expect("ran")
        .expect_err("a sketch that is not the held delta's");
    assert!(
        why.why.contains("not the sketch of its committed delta"),
        "{why}"
    );
    assert_eq!(why.unbound, vec![members[0].0]);
    // Without the held delta the lie passes: what the audit after the check must close.
    let unaudited = RingCheckInput {
        uploaded: &[],
        ..input(&lying)
    };
    assert_eq!(f.sink.ring_check(unaudited).await.expect("ran"), Ok(()));
    // The honest member's held delta matches its sketch.
    let honest_sum = store(
        &f.blobs,
        round::result_payload(&layout, 0, &reduce(&w, &ds)).unwrap(),
    )
    .await;
    let honest_input = RingCheckInput {
        result: honest_sum,
        ..input(&members)
    };
    assert_eq!(f.sink.ring_check(honest_input).await.expect("ran"), Ok(()));
    // An audited member's held delta binds its scoring sketch too: one scored on δ + p is
    // refused even though it reduced and check-sketched δ.
    let lying_score = [(
        members[0].0,
        data_of(&sketch(&seeds.score, DEFAULT_ROWS, &tampered_again(&ds[0])).expect("sketch")),
    )];
    let scored_on_a_lie = RingCheckInput {
        scoring: &lying_score,
        ..honest_input
    };
    let why = f
        .sink
        .ring_check(scored_on_a_lie)
        .await
        .expect("ran")
        .expect_err("a scoring sketch that is not the held delta's");
    assert!(why.why.contains("scoring sketch"), "{why}");
    assert_eq!(why.unbound, vec![members[0].0]);
    let honest_score = [(
        members[0].0,
        data_of(&sketch(&seeds.score, DEFAULT_ROWS, &ds[0]).expect("sketch")),
    )];
    let scored_honestly = RingCheckInput {
        scoring: &honest_score,
        ..honest_input
    };
    assert_eq!(
        f.sink.ring_check(scored_honestly).await.expect("ran"),
        Ok(())
    );
    f.sink.stop();
}

fn tampered_again(d: &[f32]) -> Vec<f32> {
    d.iter().map(|x| x - 0.5).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_post_reduce_audit_is_a_sample_of_its_own_at_the_spot_check_rate() {
    let hashes: Vec<[u8; 32]> = (0..200u8).map(|i| [i; 32]).collect();
    for (rate, lo, hi) in [(0.0, 0, 0), (1.0, 200, 200), (0.5, 70, 130)] {
        let f = fixture(rate).await;
        let audited: Vec<bool> = hashes
            .iter()
            .map(|h| f.sink.ring_audited(JobId(1), 2, h))
            .collect();
        let n = audited.iter().filter(|a| **a).count();
        assert!((lo..=hi).contains(&n), "rate {rate}: {n} of 200 audited");
        // Deterministic for the epoch, and not the spot-check's sample.
        assert!(hashes
            .iter()
            .zip(&audited)
            .all(|(h, a)| f.sink.ring_audited(JobId(1), 2, h) == *a));
        if rate == 0.5 {
            let differ = hashes
                .iter()
                .zip(&audited)
                .filter(|(h, a)| f.sink.ring_selected(JobId(1), 2, h) != **a)
                .count();
            assert!(differ > 40, "{differ} of 200 differ from the spot-check");
        }
        f.sink.stop();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ring_score_excludes_a_scaled_copy_in_the_jobs_keeper() {
    let f = fixture(0.1).await;
    let spec = spec();
    let len = f.trainer.layout().len();
    let seeds = f.sink.ring_seeds(JobId(1), 0).expect("seeds");
    let mut ds = deltas(2, 4, len);
    // Member 5 commits last a rescaled copy of member 2's delta.
    ds.push(ds[1].iter().map(|x| 0.7 * x).collect());
    let members: Vec<(NodeId, Commit, SketchData)> = ds
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let s = sketch(&seeds.score, DEFAULT_ROWS, d).expect("sketch");
            let commit = Commit {
                hash: [i as u8 + 1; 32],
                claimed_loss: 1.0,
                total_bytes: 4 * len as u64,
            };
            (node(i as u8 + 1).node_id(), commit, data_of(&s))
        })
        .collect();
    let input = RingScoreInput {
        job: JobId(1),
        epoch: 0,
        spec: &spec,
        base: None,
        seed: seeds.score,
        members: &members,
        uploaded: &[],
    };
    let scores = f.sink.ring_score(input).await.expect("scored");
    let copy = node(5).node_id();
    assert_eq!(scores.weights[&copy], 0.0);
    let why = &scores.excluded[&copy];
    assert!(why.contains("near-copy"), "{why}");
    assert_eq!(scores.excluded.len(), 1, "{:?}", scores.excluded);
    let sum: f64 = scores.weights.values().sum();
    assert!((sum - 1.0).abs() < 1e-9, "{sum}");
    assert!(members[..4].iter().all(|(n, ..)| scores.weights[n] > 0.0));

    // Two copies of five is more than 30 %: the epoch needs the robust aggregator.
    let mut two = members.clone();
    two[4].1.hash = two[0].1.hash;
    two[3] = (two[3].0, two[3].1, members[4].2.clone());
    let input = RingScoreInput {
        members: &two,
        ..input
    };
    let err = f.sink.ring_score(input).await.expect_err("robust needed");
    assert!(err.to_string().contains("robust"), "{err}");

    // A spot-checked member's upload binds its scoring sketch: member 1 uploaded δ₁ but
    // sketched δ₁ + p (what it would reduce) and is excluded; member 2's matches and keeps
    // its weight.
    let layout = layout_of(&f.trainer);
    let held: Vec<[u8; 32]> = futures_util::future::join_all(
        ds[..2]
            .iter()
            .map(|d| store(&f.blobs, round::result_payload(&layout, 0, d).unwrap())),
    )
    .await;
    let mut lying = members[..4].to_vec();
    let shifted: Vec<f32> = ds[0].iter().map(|x| x + 0.25).collect();
    lying[0].2 = data_of(&sketch(&seeds.score, DEFAULT_ROWS, &shifted).expect("sketch"));
    let uploaded = [(lying[0].0, held[0]), (lying[1].0, held[1])];
    let input = RingScoreInput {
        members: &lying,
        uploaded: &uploaded,
        ..input
    };
    let scores = f.sink.ring_score(input).await.expect("scored");
    let liar = lying[0].0;
    assert_eq!(scores.weights[&liar], 0.0);
    assert!(
        scores.excluded[&liar].contains("scoring sketch"),
        "{:?}",
        scores.excluded
    );
    assert!(scores.weights[&lying[1].0] > 0.0);
    assert_eq!(scores.excluded.len(), 1, "{:?}", scores.excluded);
    f.sink.stop();
}

/// A ring epoch's inputs: members 1–3 with their deltas and weights, the round's merged
/// delta stored.
struct Round {
    deltas: Vec<Vec<f32>>,
    weights: [f32; 3],
    merged: Vec<f32>,
    result: RingResult,
}

async fn round_of(f: &Fixture, seed: u64) -> Round {
    let len = f.trainer.layout().len();
    let ds = deltas(seed, 3, len);
    let weights = [0.5f32, 0.3, 0.2];
    let merged = reduce(&weights, &ds);
    let hash = store(
        &f.blobs,
        round::result_payload(&layout_of(&f.trainer), 0, &merged).unwrap(),
    )
    .await;
    let result = RingResult {
        merged: Some(hash),
        weights: (0..3)
            .map(|i| (node(i + 1).node_id(), weights[usize::from(i)]))
            .collect(),
        commits: ds
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let payload = round::result_payload(&layout_of(&f.trainer), 0, d).unwrap();
                let commit = Commit {
                    hash: payload_hash(&payload),
                    claimed_loss: 1.0,
                    total_bytes: payload.len() as u64,
                };
                (node(i as u8 + 1).node_id(), commit)
            })
            .collect(),
        excluded: vec![(node(4).node_id(), "its sketch is malformed".into())],
    };
    Round {
        deltas: ds,
        weights,
        merged,
        result,
    }
}

/// Publishes `job`'s epoch 0 with `ring` and `deltas`; returns the report and the weights
/// published.
async fn publish_ring(
    f: &Fixture,
    job: JobId,
    deltas: &[DeltaReceipt],
    ring: &RingResult,
) -> (EpochReport, Weights) {
    let spec = spec();
    let input = EpochInput {
        job,
        epoch: 0,
        spec: &spec,
        base: None,
        deltas,
        ring: Some(ring),
        audit: None,
        best_loss: None,
    };
    let published = f.sink.publish(input).await.expect("published");
    // Idempotent per (job, epoch).
    let again = f.sink.publish(input).await.expect("published");
    assert_eq!(again.checkpoint, published.checkpoint);
    let report = f.sink.report(job, 0).await.expect("report");
    let bytes = f
        .publication
        .objects
        .get(&published.checkpoint)
        .await
        .expect("checkpoint");
    let weights = Weights::from_safetensors(&bytes, f.trainer.layout()).expect("weights");
    (report, weights)
}

/// Asserts `got = base + lr·update` within f32 rounding.
fn assert_applied(got: &Weights, base: &Weights, lr: f32, update: &[f64]) {
    for (j, ((g, b), u)) in got.data.iter().zip(&base.data).zip(update).enumerate() {
        let want = f64::from(*b) + f64::from(lr) * u;
        let tol = 1e-6 * (f64::from(b.abs()) + (f64::from(lr) * u).abs()) + 1e-12;
        assert!(
            (f64::from(*g) - want).abs() <= tol,
            "[{j}] {g} vs {want} (tolerance {tol:e})"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ring_epoch_applies_the_rounds_merge_and_lists_every_member() {
    let f = fixture(0.0).await;
    let r = round_of(&f, 3).await;
    let (report, next) = publish_ring(&f, JobId(1), &[], &r.result).await;
    assert_eq!(
        report.aggregator.as_deref(),
        Some(RING_AGGREGATOR),
        "{:?}",
        report.kept
    );
    assert!(report.kept.is_none());
    assert!(report.loss_after <= report.loss_before * (1.0 + DRIFT_TOLERANCE));
    let lr = TrainingSpec::default().outer_lr as f32;
    let update: Vec<f64> = r.merged.iter().map(|&x| f64::from(x)).collect();
    assert_applied(&next, &f.trainer.init(), lr, &update);
    // Every member has a line, in node order: the round's three with their weights, the
    // excluded one with its reason and no weight.
    assert_eq!(report.deltas.len(), 4);
    for (i, w) in r.weights.iter().enumerate() {
        let line = report
            .deltas
            .iter()
            .find(|d| d.node == node(i as u8 + 1).node_id().to_string())
            .expect("a line");
        assert_eq!(line.weight, *w);
        assert!(line.excluded.is_none() && line.rejected.is_none());
    }
    let out = report
        .deltas
        .iter()
        .find(|d| d.node == node(4).node_id().to_string())
        .expect("the excluded member's line");
    assert_eq!(out.weight, 0.0);
    assert_eq!(out.excluded.as_deref(), Some("its sketch is malformed"));
    let summary = report.summary();
    assert!(matches!(summary.outcome, EpochOutcome::Advanced { .. }));
    assert_eq!((summary.accepted, summary.rejected), (3, 1));
    let ring = report.ring.expect("a ring report");
    assert!(ring.removed.is_empty());
    assert_eq!(ring.merged, r.result.merged.map(hex::encode));
    f.sink.stop();
}

/// Member 2's upload of its round delta, signed for `job`'s epoch 0 with a claimed loss it
/// did not have (a failed spot-check).
async fn cheaters_upload(f: &Fixture, r: &Round, job: JobId) -> DeltaReceipt {
    let receipt = upload_claiming(f, r, job, 1, 1e6).await;
    assert_eq!(receipt.delta_hash, r.result.commits[1].1.hash);
    receipt
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_spot_checked_member_is_taken_out_of_the_rings_merge() {
    let f = fixture(1.0).await;
    let r = round_of(&f, 4).await;
    // Member 2 was spot-checked and uploaded its delta, claiming a loss it did not have.
    let id = node(2);
    let receipt = cheaters_upload(&f, &r, JobId(2)).await;
    let (report, next) = publish_ring(&f, JobId(2), &[receipt], &r.result).await;
    assert_eq!(
        report.aggregator.as_deref(),
        Some(RING_AGGREGATOR),
        "{:?}",
        report.kept
    );
    // merged' = (merged − w₂·δ₂) / (1 − w₂).
    let w2 = f64::from(r.weights[1]);
    let update: Vec<f64> = r
        .merged
        .iter()
        .zip(&r.deltas[1])
        .map(|(&m, &d)| (f64::from(m) - w2 * f64::from(d)) / (1.0 - w2))
        .collect();
    let lr = TrainingSpec::default().outer_lr as f32;
    assert_applied(&next, &f.trainer.init(), lr, &update);
    // And it is not the uncorrected merge.
    let uncorrected: Vec<f64> = r.merged.iter().map(|&x| f64::from(x)).collect();
    let base = f.trainer.init();
    let differs = next
        .data
        .iter()
        .zip(&base.data)
        .zip(&uncorrected)
        .any(|((g, b), u)| (f64::from(*g) - (f64::from(*b) + f64::from(lr) * u)).abs() > 1e-6);
    assert!(differs);
    let ring = report.ring.as_ref().expect("a ring report");
    assert_eq!(ring.removed, vec![id.node_id().to_string()]);
    assert_eq!(ring.removed_weight, w2);
    // The cheater is slashed and gets no weight; the others' weights are renormalised.
    assert_eq!(report.slashes.len(), 1);
    assert_eq!(report.slashes[0].node, id.node_id().to_string());
    for d in &report.deltas {
        if d.node == id.node_id().to_string() {
            assert!(matches!(d.rejected, Some(Rejection::SpotCheckLoss { .. })));
            assert_eq!(d.weight, 0.0);
        }
    }
    let line = |i: u8| {
        report
            .deltas
            .iter()
            .find(|d| d.node == node(i).node_id().to_string())
            .expect("a line")
            .weight
    };
    assert!((f64::from(line(1)) - 0.5 / (1.0 - w2)).abs() < 1e-6);
    assert!((f64::from(line(3)) - 0.2 / (1.0 - w2)).abs() < 1e-6);
    f.sink.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ring_epoch_whose_members_were_all_excluded_keeps_the_base() {
    let f = fixture(0.0).await;
    let mut r = round_of(&f, 5).await;
    r.result.merged = None;
    r.result.weights.clear();
    let (report, next) = publish_ring(&f, JobId(3), &[], &r.result).await;
    assert!(report.aggregator.is_none());
    let why = report.kept.as_deref().expect("kept");
    assert!(why.contains("every ring member was excluded"), "{why}");
    assert!(why.contains("its sketch is malformed"), "{why}");
    assert_eq!(next, f.trainer.init());
    assert!(report.deltas.iter().all(|d| d.weight == 0.0));
    assert!(matches!(
        report.summary().outcome,
        EpochOutcome::Kept { .. }
    ));
    f.sink.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ring_epoch_pays_the_members_by_weight_and_slashes_only_the_failed_spot_check() {
    use hanzod_actors::ports::memory::MemoryChain;
    let chain = MemoryChain::new();
    for i in 1..=4u8 {
        chain.set_stake(node(i).node_id(), GymWei::gym(10_000));
    }
    let chain = Arc::new(chain);
    let pool = GymWei::gym(100);
    let f = fixture_with(1.0, Some(Economics::new(chain.clone(), pool, 10))).await;
    let r = round_of(&f, 6).await;
    let receipt = cheaters_upload(&f, &r, JobId(5)).await;
    let (report, _) = publish_ring(&f, JobId(5), &[receipt], &r.result).await;
    assert_eq!(report.settlement_error, None);
    // Members 1 and 3, by their (renormalised) weights 0.5 : 0.2; not the cheater, not the
    // excluded member 4.
    let paid: Vec<(&str, u128)> = report
        .rewards
        .iter()
        .map(|l| (l.node.as_str(), l.amount_wei.parse::<u128>().unwrap()))
        .collect();
    assert_eq!(paid.len(), 2, "{paid:?}");
    assert_eq!(paid.iter().map(|(_, w)| w).sum::<u128>(), pool.0);
    let of = |i: u8| {
        let key = node(i).node_id().to_string();
        paid.iter().find(|(n, _)| *n == key).map(|(_, w)| *w as f64)
    };
    let ratio = of(1).expect("member 1 paid") / of(3).expect("member 3 paid");
    assert!((ratio - 2.5).abs() < 1e-6, "{ratio}");
    assert_eq!(report.slashed.len(), 1);
    assert_eq!(report.slashed[0].node, node(2).node_id().to_string());
    f.sink.stop();
}

/// Member `i`'s (0-based) upload of its round delta for `job`'s epoch 0, claiming loss 1.
async fn upload_of(f: &Fixture, r: &Round, job: JobId, i: usize) -> DeltaReceipt {
    upload_claiming(f, r, job, i, 1.0).await
}

/// Member `i`'s (0-based) upload of its round delta, signed for `job`'s epoch 0 with
/// `claimed_loss`.
async fn upload_claiming(
    f: &Fixture,
    r: &Round,
    job: JobId,
    i: usize,
    claimed_loss: f64,
) -> DeltaReceipt {
    let id = node(i as u8 + 1);
    let payload = round::result_payload(&layout_of(&f.trainer), 0, &r.deltas[i]).unwrap();
    let hash = store(&f.blobs, payload).await;
    let statement = Statement {
        job: job.0,
        epoch: 0,
        step: 0,
        claimed_loss,
    };
    DeltaReceipt {
        job,
        node: id.node_id(),
        epoch: 0,
        step: 0,
        delta_hash: hash,
        claimed_loss,
        signature: sign_statement(&id, &statement, &hash).to_vec(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallback_rejects_the_members_the_round_named_and_merges_the_others() {
    let f = fixture(0.0).await;
    let r = round_of(&f, 6).await;
    let job = JobId(3);
    let mut receipts = Vec::new();
    for i in 0..3 {
        receipts.push(upload_of(&f, &r, job, i).await);
    }
    // The round fell back: member 2 withheld its check sketch, member 3's held delta was
    // not what it sketched; nobody handed in evidence.
    let audit = RoundAudit {
        version: 4,
        members: r.result.weights.clone(),
        commits: r.result.commits.clone(),
        evidence: Vec::new(),
        unbound: vec![node(3).node_id()],
        withheld: vec![node(2).node_id()],
    };
    let spec = spec();
    let input = EpochInput {
        job,
        epoch: 0,
        spec: &spec,
        base: None,
        deltas: &receipts,
        ring: None,
        audit: Some(&audit),
        best_loss: None,
    };
    f.sink.publish(input).await.expect("published");
    let report = f.sink.report(job, 0).await.expect("report");
    let rejected = |i: u8| {
        let hex = node(i).node_id().to_string();
        report
            .deltas
            .iter()
            .find(|d| d.node == hex)
            .and_then(|d| d.rejected.clone())
    };
    assert_eq!(rejected(1), None);
    assert_eq!(
        rejected(2),
        Some(Rejection::RingWithheld { ring_version: 4 })
    );
    assert_eq!(rejected(3), Some(Rejection::RingSketch { ring_version: 4 }));
    // Two of three rejected count as suspect: the merge of the one left is robust.
    assert_eq!(report.aggregator.as_deref(), Some("median"));
    let audit = report.round_audit.expect("the audit is reported");
    assert!(audit.tampered.is_empty() && audit.evidence_from == 0);
    assert_eq!(audit.withheld, vec![node(2).node_id().to_string()]);
    f.sink.stop();
}
