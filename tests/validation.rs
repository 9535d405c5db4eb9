//! The validator and the merging sink (DESIGN §6): real burn training on the
//! built-in Wine Quality MLP, real signatures, the blob store, the supervised pool.
//!
//! Each scenario trains honest nodes with the job's recipe, adds dishonest ones (a node
//! that lies about its loss; a node that sends a sign-flipped, scaled delta with an honest
//! claim), and runs the epoch through [`TrainingSink`] exactly as the job actor does.

use hanzod::core::ports::Counter;
use std::sync::Arc;

use hanzod::core::job::JobSpec;
use hanzod::core::ports::memory::MemoryMetrics;
use hanzod::core::ports::{CheckpointSink, DeltaReceipt, EpochInput};
use hanzod::core::types::{GymWei, JobId};
use hanzod::delta::catalog::ModelCatalog;
use hanzod::delta::format::{payload_hash, sign_statement, Statement};
use hanzod::delta::score::{is_spot_checked, verify_reveal, Commitment, EpochSecret};
use hanzod::delta::sink::{recipe_of, Economics, SinkConfig, TrainingSink};
use hanzod::delta::store::{BlobStore, MemoryBlobStore};
use hanzod::delta::validate::{Rejection, ValidationConfig};
use hanzod::identity::Identity;
use hanzod::train::{self, Dataset, Weights};

const JOB: JobId = JobId(7);

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
        training: Default::default(),
    }
}

/// How a simulated node behaves.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Behaviour {
    Honest,
    /// Trains honestly, claims twice its loss.
    LiesAboutLoss,
    /// Sends `-5 ×` its honest delta with an honest claim.
    Poisons,
    /// Sends `1000 ×` its honest delta (the right direction, outsized) with an honest claim.
    Scales,
}

struct Fixture {
    publication: hanzod::delta::sink::Publication,
    blobs: Arc<MemoryBlobStore>,
    objects: Arc<dyn hanzod::publish::ObjectStore>,
    sink: TrainingSink,
    metrics: Arc<MemoryMetrics>,
    data: Dataset,
    seed: [u8; 32],
}

async fn fixture(rate: f64) -> Fixture {
    fixture_with(rate, None).await
}

async fn fixture_with(rate: f64, economics: Option<Economics>) -> Fixture {
    fixture_on(rate, economics, hanzod::delta::sink::Publication::memory()).await
}

async fn fixture_on(
    rate: f64,
    economics: Option<Economics>,
    publication: hanzod::delta::sink::Publication,
) -> Fixture {
    let blobs = Arc::new(MemoryBlobStore::new());
    let metrics = Arc::new(MemoryMetrics::new());
    let seed = [42u8; 32];
    let config = SinkConfig {
        validation: ValidationConfig {
            spot_check_rate: rate,
            ..ValidationConfig::default()
        },
        workers: 2,
        ..SinkConfig::default()
    };
    let sink = TrainingSink::start(
        blobs.clone(),
        Arc::new(ModelCatalog::builtin()),
        seed,
        config,
        metrics.clone(),
        economics,
        publication.clone(),
    )
    .await
    .unwrap();
    Fixture {
        blobs,
        objects: publication.objects.clone(),
        publication,
        sink,
        metrics,
        data: Dataset::wine_quality().unwrap(),
        seed,
    }
}

impl Fixture {
    /// Node `i` trains epoch `epoch` from `base` and stores its (possibly dishonest) delta.
    async fn submit(&self, i: u8, epoch: u32, base: &Weights, how: Behaviour) -> DeltaReceipt {
        let recipe = recipe_of(&spec().training, JOB).unwrap();
        let id = Identity::from_seed([i; 32]);
        let node = id.node_id();
        let step = u64::from(epoch) * u64::from(recipe.local_steps);
        let run = train::train_local(base, &self.data, &recipe, &node.0, step).unwrap();
        let mut delta = run.weights.sub(base).unwrap();
        let mut claimed = run.claimed_loss;
        match how {
            Behaviour::Honest => {}
            Behaviour::LiesAboutLoss => claimed *= 2.0,
            Behaviour::Poisons => delta.data.iter_mut().for_each(|v| *v *= -5.0),
            Behaviour::Scales => delta.data.iter_mut().for_each(|v| *v *= 1000.0),
        }
        let payload = delta.to_delta_bytes(u64::from(epoch)).unwrap();
        let hash = payload_hash(&payload);
        let statement = Statement {
            job: JOB.0,
            epoch,
            step,
            claimed_loss: claimed,
        };
        let signature = sign_statement(&id, &statement, &hash).to_vec();
        self.blobs.put(hash, payload.into()).await.unwrap();
        DeltaReceipt {
            job: JOB,
            node,
            epoch,
            step,
            delta_hash: hash,
            claimed_loss: claimed,
            signature,
        }
    }

    async fn publish(&self, epoch: u32, base: Option<&str>, deltas: &[DeltaReceipt]) -> String {
        self.published(epoch, base, deltas).await.checkpoint
    }

    /// The checkpoint with the summary the job records.
    async fn published(
        &self,
        epoch: u32,
        base: Option<&str>,
        deltas: &[DeltaReceipt],
    ) -> hanzod::core::ports::PublishedEpoch {
        self.published_after(epoch, base, deltas, None).await
    }

    /// [`Fixture::published`] for a job whose summaries say its best loss so far is
    /// `best_loss`.
    async fn published_after(
        &self,
        epoch: u32,
        base: Option<&str>,
        deltas: &[DeltaReceipt],
        best_loss: Option<f64>,
    ) -> hanzod::core::ports::PublishedEpoch {
        let spec = spec();
        let input = EpochInput {
            job: JOB,
            epoch,
            spec: &spec,
            base,
            deltas,
            ring: None,
            audit: None,
            best_loss,
        };
        self.sink.publish(input).await.unwrap()
    }

    async fn weights(&self, reference: &str) -> Weights {
        // The reference is the checkpoint's CID, as Kubo computes it.
        assert!(reference.starts_with("bafk"), "{reference}");
        let bytes = self.objects.get(reference).await.unwrap();
        assert_eq!(hanzod::publish::cid_of(&bytes).to_string(), reference);
        Weights::from_safetensors(&bytes, train::layout(32)).unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn honest_epochs_lower_the_validation_loss_and_cheaters_are_caught() {
    // Every delta spot-checked, so both cheaters must be caught.
    let f = fixture(1.0).await;
    let recipe = recipe_of(&spec().training, JOB).unwrap();
    let init = train::init(&recipe);
    let mut deltas = Vec::new();
    for i in 1..=4 {
        deltas.push(f.submit(i, 0, &init, Behaviour::Honest).await);
    }
    deltas.push(f.submit(5, 0, &init, Behaviour::LiesAboutLoss).await);
    deltas.push(f.submit(6, 0, &init, Behaviour::Poisons).await);
    let cp0 = f.publish(0, None, &deltas).await;
    let r0 = f.sink.report(JOB, 0).await.unwrap();
    eprintln!("epoch 0: {} → {}", r0.loss_before, r0.loss_after);
    assert!(r0.loss_after < r0.loss_before, "{r0:#?}");
    assert_eq!(r0.checkpoint, cp0);
    let rejected: Vec<_> = r0.deltas.iter().map(|d| d.rejected.clone()).collect();
    assert!(rejected[..4].iter().all(Option::is_none), "{rejected:?}");
    assert!(
        matches!(rejected[4], Some(Rejection::SpotCheckLoss { .. })),
        "{rejected:?}"
    );
    assert!(
        matches!(rejected[5], Some(Rejection::SpotCheckReplay { .. })),
        "{rejected:?}"
    );
    for d in &r0.deltas {
        eprintln!("{:?} {:?} suspect {}", d.loss_after, d.score, d.suspect);
    }
    // Two of six are suspect (rejected by their spot-checks, 33 % > 30 %), but the four
    // accepted deltas agree with each other: the agreement-weighted mean merged the epoch
    // (the robust aggregator is its fallback), and the rejected weigh nothing.
    assert_eq!(r0.suspect, 2);
    assert_eq!(r0.aggregator.as_deref(), Some("weighted_mean"));
    assert!(r0.deltas[4..].iter().all(|d| d.weight == 0.0), "{r0:#?}");
    // Slashing evidence names the cheaters and carries their signatures.
    assert_eq!(r0.slashes.len(), 2);
    assert_eq!(r0.slashes[0].node, hex::encode(deltas[4].node.0));
    assert_eq!(r0.slashes[0].signature, hex::encode(&deltas[4].signature));
    assert!(r0.slashes[0].claimed_loss > r0.slashes[0].measured_loss * 1.5);
    assert_eq!(f.metrics.counter(Counter::SpotChecks, "failed"), 2);
    assert_eq!(f.metrics.counter(Counter::DeltasValidated, "accepted"), 4);

    // The checkpoint is stored and loads; epoch 1 trains from it and improves again.
    let w0 = f.weights(&cp0).await;
    let loss0 = train::validation_loss(&w0, &f.data).unwrap();
    assert_eq!(loss0, r0.loss_after);
    let epoch0 = deltas;
    let mut deltas = Vec::new();
    for i in 1..=4 {
        deltas.push(f.submit(i, 1, &w0, Behaviour::Honest).await);
    }
    let cp1 = f.publish(1, Some(&cp0), &deltas).await;
    // Epoch 0's delta blobs went when epoch 1 was published, but for the slashing evidence;
    // epoch 1's stay until epoch 2.
    for (i, r) in epoch0.iter().enumerate() {
        let kept = f.blobs.contains(&r.delta_hash).await.unwrap();
        assert_eq!(kept, i >= 4, "delta of node {i}");
    }
    for r in &deltas {
        assert!(f.blobs.contains(&r.delta_hash).await.unwrap());
    }
    let r1 = f.sink.report(JOB, 1).await.unwrap();
    eprintln!("epoch 1: {} → {}", r1.loss_before, r1.loss_after);
    assert_eq!(r1.loss_before, r0.loss_after);
    assert!(r1.loss_after < r1.loss_before);
    assert_eq!(r1.aggregator.as_deref(), Some("weighted_mean"));
    // Epoch 1 has a previous merged delta: convergence is scored.
    assert!(r1
        .deltas
        .iter()
        .all(|d| d.score.unwrap().convergence.is_some()));
    // Idempotent: the same epoch again gives the same checkpoint.
    assert_eq!(f.publish(1, Some(&cp0), &deltas).await, cp1);
    f.sink.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anyone_can_recompute_the_spot_check_choice_after_the_reveal() {
    let f = fixture(0.5).await;
    let init = train::init(&recipe_of(&spec().training, JOB).unwrap());
    let commitment = f.sink.commitment(JOB, 0);
    let mut deltas = Vec::new();
    for i in 1..=8 {
        deltas.push(f.submit(i, 0, &init, Behaviour::Honest).await);
    }
    f.publish(0, None, &deltas).await;
    let report = f.sink.report(JOB, 0).await.unwrap();
    // The revealed secret opens the commitment published at epoch start.
    assert_eq!(report.commitment, hex::encode(commitment.0));
    let secret: [u8; 32] = hex::decode(&report.secret).unwrap().try_into().unwrap();
    let secret = EpochSecret::from_bytes(secret);
    verify_reveal(&Commitment(commitment.0), &secret).unwrap();
    assert_eq!(secret, EpochSecret::derive(&f.seed, JOB.0, 0));
    // An auditor's recomputation selects exactly the deltas the validator checked.
    let mut checked = 0;
    for (d, r) in report.deltas.iter().zip(&deltas) {
        let selected = is_spot_checked(&secret, &r.delta_hash, report.spot_check_rate);
        assert_eq!(d.spot_check.is_some(), selected, "{}", d.node);
        checked += usize::from(selected);
        assert!(d.rejected.is_none());
    }
    eprintln!("spot-checked {checked} of {}", deltas.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_deltas_are_rejected_with_their_reason_and_an_empty_epoch_keeps_the_base() {
    let f = fixture(0.0).await;
    let init = train::init(&recipe_of(&spec().training, JOB).unwrap());
    let good = f.submit(1, 0, &init, Behaviour::Honest).await;
    // Another node's signature on the same delta (a replay from another node).
    let mut stolen = f.submit(2, 0, &init, Behaviour::Honest).await;
    stolen.node = Identity::from_seed([3; 32]).node_id();
    // A receipt for a payload that is not in the store.
    let mut missing = f.submit(4, 0, &init, Behaviour::Honest).await;
    f.blobs.remove(&missing.delta_hash).await.unwrap();
    missing.node = Identity::from_seed([4; 32]).node_id();
    // A delta taken at the wrong step (signed, so only the step check can catch it).
    let id = Identity::from_seed([5; 32]);
    let payload = init.sub(&init).unwrap().to_delta_bytes(0).unwrap();
    let hash = payload_hash(&payload);
    let statement = Statement {
        job: JOB.0,
        epoch: 0,
        step: 3,
        claimed_loss: 1.0,
    };
    f.blobs.put(hash, payload.into()).await.unwrap();
    let wrong_step = DeltaReceipt {
        job: JOB,
        node: id.node_id(),
        epoch: 0,
        step: 3,
        delta_hash: hash,
        claimed_loss: 1.0,
        signature: sign_statement(&id, &statement, &hash).to_vec(),
    };
    let published = f
        .published(0, None, &[good.clone(), stolen, missing, wrong_step])
        .await;
    let cp = published.checkpoint;
    let r = f.sink.report(JOB, 0).await.unwrap();
    // The summary the job records says the same as the report, in numbers.
    let summary = published
        .summary
        .expect("the training sink reports a summary");
    assert_eq!((summary.accepted, summary.rejected), (1, 3));
    // The report's suspect count includes rejected deltas (they count towards the robust
    // threshold); the summary's suspects are a subset of its accepted ones.
    assert!(summary.suspect <= summary.accepted, "{summary:?}");
    assert!(summary.suspect as usize <= r.suspect, "{summary:?}");
    assert_eq!(summary.outcome_line(), "advanced (median)");
    assert_eq!(
        (summary.loss_before, summary.loss_after),
        (r.loss_before, r.loss_after)
    );
    let labels: Vec<_> = r
        .deltas
        .iter()
        .map(|d| d.rejected.as_ref().map_or("accepted", Rejection::label))
        .collect();
    assert_eq!(
        labels,
        ["accepted", "signature", "unavailable", "wrong_step"]
    );
    // 3 of 4 suspect: the median of the one accepted delta is that delta.
    assert_eq!(r.aggregator.as_deref(), Some("median"));
    assert!(r.loss_after < r.loss_before);
    // Published once per (job, epoch): a repeated call returns the first checkpoint.
    assert_eq!(cp, f.publish(0, None, &[]).await);

    // Epoch 1 with no delta at all keeps the base checkpoint and says so.
    let f2 = fixture(0.0).await;
    let base = f2.publish(0, None, &[good]).await;
    let kept = f2.published(1, Some(&base), &[]).await;
    let r = f2.sink.report(JOB, 1).await.unwrap();
    assert_eq!(kept.checkpoint, base);
    assert_eq!(
        kept.summary.expect("summary").outcome_line(),
        "kept the previous checkpoint: no deltas to merge"
    );
    assert_eq!(r.kept.as_deref(), Some("no deltas to merge"));
    assert_eq!(r.aggregator, None);
    assert_eq!(r.loss_after, r.loss_before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_validator_worker_is_restarted_and_the_pool_keeps_serving() {
    let f = fixture(0.0).await;
    let init = train::init(&recipe_of(&spec().training, JOB).unwrap());
    for id in 0..2 {
        f.sink.pool().crash_worker(id);
    }
    // Both restarts are observed before the epoch is judged (bounded wait, no fixed sleep).
    for _ in 0..500 {
        if f.metrics.counter(Counter::ActorRestarts, "validator") == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let deltas = vec![
        f.submit(1, 0, &init, Behaviour::Honest).await,
        f.submit(2, 0, &init, Behaviour::Honest).await,
    ];
    f.publish(0, None, &deltas).await;
    let r = f.sink.report(JOB, 0).await.unwrap();
    assert!(r.deltas.iter().all(|d| d.rejected.is_none()), "{r:#?}");
    assert_eq!(f.metrics.counter(Counter::ActorRestarts, "validator"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unchecked_poisoned_deltas_are_suspect_weigh_nothing_and_the_merge_still_improves() {
    // No spot-check at all: only the quality score, the agreement and the merge's loss
    // check stand in the way.
    let f = fixture(0.0).await;
    let init = train::init(&recipe_of(&spec().training, JOB).unwrap());
    let mut deltas = Vec::new();
    for i in 1..=4 {
        deltas.push(f.submit(i, 0, &init, Behaviour::Honest).await);
    }
    for i in 5..=6 {
        deltas.push(f.submit(i, 0, &init, Behaviour::Poisons).await);
    }
    f.publish(0, None, &deltas).await;
    let r = f.sink.report(JOB, 0).await.unwrap();
    for d in &r.deltas[4..] {
        let s = d.score.unwrap();
        // A 5× norm against the epoch's median norm: low stability, no improvement.
        assert!(s.stability < 0.1 && s.loss_improvement == 0.0, "{s:?}");
        assert!(d.suspect && d.rejected.is_none(), "{d:#?}");
        // Against the epoch's direction: no agreement, no weight.
        assert_eq!((d.agreement, d.weight), (Some(0.0), 0.0), "{d:#?}");
    }
    // 2 of 6 suspect (33 % > 30 %), but the epoch has an agreement: the weighted mean
    // goes first, the poisoned deltas weighing 0.
    assert_eq!(r.suspect, 2);
    assert_eq!(r.aggregator.as_deref(), Some("weighted_mean"));
    assert!(
        r.loss_after < r.loss_before,
        "{} → {}",
        r.loss_before,
        r.loss_after
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_outsized_delta_below_the_robust_threshold_gets_no_weight() {
    // 1 of 10 (10 % < 30 %): the weighted mean runs; the outsized delta is suspect and must
    // not steer it (its small composite times its huge norm would).
    let f = fixture(0.0).await;
    let init = train::init(&recipe_of(&spec().training, JOB).unwrap());
    let mut deltas = Vec::new();
    for i in 1..=9 {
        deltas.push(f.submit(i, 0, &init, Behaviour::Honest).await);
    }
    deltas.push(f.submit(10, 0, &init, Behaviour::Scales).await);
    f.publish(0, None, &deltas).await;
    let r = f.sink.report(JOB, 0).await.unwrap();
    assert_eq!(r.aggregator.as_deref(), Some("weighted_mean"));
    assert_eq!(r.suspect, 1);
    let attacker = &r.deltas[9];
    assert!(
        attacker.suspect && attacker.rejected.is_none(),
        "{attacker:?}"
    );
    assert!(
        r.loss_after < r.loss_before,
        "{} → {}",
        r.loss_before,
        r.loss_after
    );
    assert_eq!(attacker.weight, 0.0);
    assert!(r.deltas[..9].iter().all(|d| d.weight > 0.0));
    // The same epoch without the attacker lands close by (the weights of the others differ
    // slightly: the norm average is seeded from the epoch's norms).
    let g = fixture(0.0).await;
    for d in &deltas[..9] {
        let bytes = f.blobs.get(&d.delta_hash).await.unwrap();
        g.blobs.put(d.delta_hash, bytes).await.unwrap();
    }
    g.publish(0, None, &deltas[..9]).await;
    let honest = g.sink.report(JOB, 0).await.unwrap();
    let gap = (r.loss_after - honest.loss_after).abs() / honest.loss_after;
    assert!(gap < 0.02, "{} vs {}", r.loss_after, honest.loss_after);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merge_that_would_raise_the_loss_keeps_the_base_and_says_why() {
    // 4 of 6 unchecked poisoned deltas: the median is poisoned too, and is not published.
    let f = fixture(0.0).await;
    let init = train::init(&recipe_of(&spec().training, JOB).unwrap());
    let mut deltas = Vec::new();
    for i in 1..=2 {
        deltas.push(f.submit(i, 0, &init, Behaviour::Honest).await);
    }
    for i in 3..=6 {
        deltas.push(f.submit(i, 0, &init, Behaviour::Poisons).await);
    }
    let cp = f.publish(0, None, &deltas).await;
    let r = f.sink.report(JOB, 0).await.unwrap();
    assert_eq!(r.aggregator, None);
    let why = r.kept.as_deref().unwrap();
    assert!(
        why.contains("median merge would raise the validation loss"),
        "{why}"
    );
    assert_eq!(r.loss_after, r.loss_before);
    assert_eq!(f.weights(&cp).await, init);
}

/// A ledger whose reward batches fail while `down` is set (the chain unreachable).
#[derive(Debug)]
struct FlakyLedger {
    inner: hanzod::core::ports::memory::MemoryChain,
    down: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl hanzod::core::ports::ChainReader for FlakyLedger {
    async fn stake_of(
        &self,
        node: &hanzod::core::types::NodeId,
    ) -> Result<GymWei, hanzod::core::ports::ChainError> {
        self.inner.stake_of(node).await
    }
    async fn penalty_until(
        &self,
        node: &hanzod::core::types::NodeId,
    ) -> Result<Option<hanzod::core::types::Timestamp>, hanzod::core::ports::ChainError> {
        self.inner.penalty_until(node).await
    }
    async fn orchestrator_stake(&self) -> Result<GymWei, hanzod::core::ports::ChainError> {
        self.inner.orchestrator_stake().await
    }
}

#[async_trait::async_trait]
impl hanzod::core::ports::Ledger for FlakyLedger {
    async fn distribute_epoch_rewards(
        &self,
        job: JobId,
        epoch: u32,
        rewards: &[(hanzod::core::types::NodeId, GymWei)],
    ) -> Result<hanzod::core::ports::RewardReceipt, hanzod::core::ports::LedgerError> {
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(hanzod::core::ports::ChainError::Unavailable("rpc down".into()).into());
        }
        self.inner
            .distribute_epoch_rewards(job, epoch, rewards)
            .await
    }
    async fn slash(
        &self,
        node: &hanzod::core::types::NodeId,
        pct: u8,
        evidence: &[u8],
    ) -> Result<hanzod::core::ports::SlashReceipt, hanzod::core::ports::LedgerError> {
        self.inner.slash(node, pct, evidence).await
    }
    async fn balance_of(
        &self,
        node: &hanzod::core::types::NodeId,
    ) -> Result<GymWei, hanzod::core::ports::LedgerError> {
        self.inner.balance_of(node).await
    }
    async fn slashes(
        &self,
    ) -> Result<Vec<hanzod::core::ports::SlashReceipt>, hanzod::core::ports::LedgerError> {
        self.inner.slashes().await
    }
    async fn reward_batches(
        &self,
    ) -> Result<Vec<hanzod::core::ports::RewardReceipt>, hanzod::core::ports::LedgerError> {
        self.inner.reward_batches().await
    }
    async fn record_publication(
        &self,
        publication: &hanzod::publish::record::SignedPublication,
    ) -> Result<hanzod::publish::record::PublicationReceipt, hanzod::core::ports::LedgerError> {
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(hanzod::core::ports::ChainError::Unavailable("rpc down".into()).into());
        }
        self.inner.record_publication(publication).await
    }
    async fn publications(
        &self,
    ) -> Result<Vec<hanzod::publish::record::SignedPublication>, hanzod::core::ports::LedgerError>
    {
        self.inner.publications().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewards_follow_scores_slashes_follow_failed_spot_checks_and_a_failed_settlement_is_retried(
) {
    use hanzod::core::ports::{ChainReader, Ledger};
    use std::sync::atomic::Ordering;
    let pool = GymWei::gym(100);
    let stake = GymWei::gym(10_000);
    let chain = hanzod::core::ports::memory::MemoryChain::new();
    // Nodes 1–3 are bound; node 4 (honest) is not: its share is withheld, not the batch.
    for i in 1..=3u8 {
        chain.set_stake(Identity::from_seed([i; 32]).node_id(), stake);
    }
    let ledger = Arc::new(FlakyLedger {
        inner: chain,
        down: true.into(),
    });
    let econ = Economics::new(ledger.clone(), pool, 10);
    let f = fixture_with(1.0, Some(econ)).await;
    let init = train::init(&recipe_of(&spec().training, JOB).unwrap());
    let mut deltas = Vec::new();
    for (i, how) in [
        (1, Behaviour::Honest),
        (2, Behaviour::Honest),
        (3, Behaviour::LiesAboutLoss),
        (4, Behaviour::Honest),
    ] {
        deltas.push(f.submit(i, 0, &init, how).await);
    }
    let node = |i: u8| Identity::from_seed([i; 32]).node_id();
    let cp0 = f.publish(0, None, &deltas).await;
    // The reward batch failed (the chain was down): nothing paid, the report says why; the
    // liar is slashed all the same (slashes are separate calls).
    let r0 = f.sink.report(JOB, 0).await.unwrap();
    assert!(
        r0.settlement_error.as_deref().unwrap().contains("rpc down"),
        "{r0:?}"
    );
    assert!(r0.rewards.is_empty());
    assert_eq!(ledger.balance_of(&node(1)).await.unwrap(), GymWei(0));
    assert_eq!(ledger.publications().await.unwrap(), vec![]);
    assert_eq!(r0.slashed.len(), 1);
    assert_eq!(ledger.stake_of(&node(3)).await.unwrap(), GymWei::gym(9_000));

    // The chain is back: the next publication settles epoch 0 first, then epoch 1.
    ledger.down.store(false, Ordering::SeqCst);
    let w0 = f.weights(&cp0).await;
    let mut deltas = Vec::new();
    for (i, how) in [
        (1, Behaviour::Honest),
        (2, Behaviour::Honest),
        (3, Behaviour::LiesAboutLoss),
    ] {
        deltas.push(f.submit(i, 1, &w0, how).await);
    }
    f.publish(1, Some(&cp0), &deltas).await;
    for epoch in [0, 1] {
        let r = f.sink.report(JOB, epoch).await.unwrap();
        assert_eq!(r.settlement_error, None, "epoch {epoch}");
        // Paid to the accepted, bound nodes, in proportion to their scores.
        let paid: u128 = r
            .rewards
            .iter()
            .map(|l| l.amount_wei.parse::<u128>().unwrap())
            .sum();
        assert_eq!(paid, pool.0, "epoch {epoch}");
        let payees: Vec<&str> = r.rewards.iter().map(|l| l.node.as_str()).collect();
        assert_eq!(payees.len(), 2, "epoch {epoch}: {payees:?}");
        assert!(!payees.contains(&hex::encode(node(3).0).as_str()));
        assert!(!payees.contains(&hex::encode(node(4).0).as_str()));
        let (a, b) = (&r.rewards[0], &r.rewards[1]);
        let ratio = a.amount_wei.parse::<f64>().unwrap() / b.amount_wei.parse::<f64>().unwrap();
        assert!(
            (ratio - a.score / b.score).abs() < 1e-9,
            "{ratio} vs {}",
            a.score / b.score
        );
    }
    // Each epoch's signed publication record is on the ledger once, naming its checkpoint.
    let records = ledger.publications().await.unwrap();
    assert_eq!(records.len(), 2);
    for (epoch, p) in records.iter().enumerate() {
        let r = f.sink.report(JOB, epoch as u32).await.unwrap();
        assert_eq!(r.publication.as_ref(), Some(p));
        assert_eq!(p.record.cid, r.checkpoint);
        assert_eq!(hanzod::publish::record::check_signature(p), Ok(()));
    }
    let total =
        ledger.balance_of(&node(1)).await.unwrap().0 + ledger.balance_of(&node(2)).await.unwrap().0;
    assert_eq!(total, 2 * pool.0);
    // Two lies, two slashes of 10 %; retrying epoch 0's settlement did not slash it again.
    assert_eq!(ledger.stake_of(&node(3)).await.unwrap(), GymWei::gym(8_100));
    assert_eq!(
        ledger
            .slashes()
            .await
            .unwrap()
            .iter()
            .filter(|s| !s.duplicate)
            .count(),
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publication_staged_before_a_crash_is_adopted_not_merged_again() {
    use hanzod::publish::publisher::Checkpoint;
    let f = fixture(0.0).await;
    let recipe = recipe_of(&spec().training, JOB).unwrap();
    let init = train::init(&recipe);
    let mut deltas = Vec::new();
    for i in 1..=3 {
        deltas.push(f.submit(i, 0, &init, Behaviour::Honest).await);
    }
    // What a crashed orchestrator staged for epoch 0: a checkpoint the deltas would not
    // give (the initial weights, nudged), with its report.
    let mut staged_weights = init.clone();
    staged_weights.data.iter_mut().for_each(|v| *v += 0.001);
    // Its report holds the losses as the crashed orchestrator measured them (the next
    // epoch's merge is checked against the job's best checkpoint so far).
    let loss_before = train::validation_loss(&init, &f.data).unwrap();
    let loss_after = train::validation_loss(&staged_weights, &f.data).unwrap();
    let publisher = f.publication.publisher();
    let (staged, _) = publisher
        .stage(Checkpoint {
            job: JOB,
            epoch: 0,
            weights: staged_weights.to_safetensors().into(),
            config_json: b"{}".to_vec(),
            files: Default::default(),
            card: hanzod::publish::ModelCard {
                cid: String::new(),
                epoch: 0,
                job: JOB.0,
                quality: 0.5,
                base_model: None,
                license: "apache-2.0".into(),
                model: spec().training.model,
                dataset: spec().training.dataset,
                files: Default::default(),
            },
            repo: None,
            report: serde_json::json!({
                "job": JOB.0, "epoch": 0, "base": null, "checkpoint": "", "loss_before": loss_before,
                "loss_after": loss_after, "commitment": "", "secret": "", "spot_check_rate": 0.0,
                "aggregator": "weighted_mean", "kept": null, "suspect": 0, "deltas": [],
                "slashes": [], "rewards": [], "slashed": [], "repo": null, "location": null,
                "registry_error": null, "settlement_error": null
            }),
        })
        .await
        .unwrap();
    // The new orchestrator's sink publishes epoch 0: the staged checkpoint, as staged.
    let cp0 = f.publish(0, None, &deltas).await;
    assert_eq!(cp0, staged.cid());
    let r0 = f.sink.report(JOB, 0).await.unwrap();
    assert_eq!(r0.publication.as_ref(), Some(&staged.publication));
    assert_eq!(r0.loss_after, loss_after);
    assert!(f.objects.is_pinned(&cp0).await.unwrap());
    // Epoch 1 continues from the staged weights.
    let w0 = f.weights(&cp0).await;
    assert_eq!(w0.data, staged_weights.data);
    let mut deltas = Vec::new();
    for i in 1..=3 {
        deltas.push(f.submit(i, 1, &w0, Behaviour::Honest).await);
    }
    let cp1 = f.publish(1, Some(&cp0), &deltas).await;
    let r1 = f.sink.report(JOB, 1).await.unwrap();
    assert_eq!(r1.base.as_deref(), Some(cp0.as_str()));
    assert_ne!(cp1, cp0);
    assert!(r1.loss_after < r1.loss_before, "{r1:#?}");
}

/// A folder registry that fails with an I/O error while `down` is set (the Hub down).
#[derive(Debug)]
struct FlakyRegistry {
    inner: hanzod::publish::FolderRegistry,
    down: std::sync::atomic::AtomicBool,
    calls: std::sync::atomic::AtomicUsize,
}

#[async_trait::async_trait]
impl hanzod::publish::ModelRegistry for FlakyRegistry {
    async fn publish(
        &self,
        upload: &hanzod::publish::ModelUpload,
    ) -> Result<hanzod::publish::Published, hanzod::publish::RegistryError> {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(hanzod::publish::RegistryError::Io {
                message: "503 from the Hub".into(),
            });
        }
        self.inner.publish(upload).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repo_push_that_failed_transiently_is_pushed_again_later() {
    use std::sync::atomic::Ordering;
    let dir = std::env::temp_dir().join(format!("hanzod-flaky-registry-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let registry = Arc::new(FlakyRegistry {
        inner: hanzod::publish::FolderRegistry::new(&dir),
        down: true.into(),
        calls: 0.into(),
    });
    let mut publication = hanzod::delta::sink::Publication::memory();
    publication.registry = Some(registry.clone());
    let f = fixture_on(0.0, None, publication).await;
    let init = train::init(&recipe_of(&spec().training, JOB).unwrap());
    let mut deltas = Vec::new();
    for i in 1..=2 {
        deltas.push(f.submit(i, 0, &init, Behaviour::Honest).await);
    }
    let cp0 = f.publish(0, None, &deltas).await;
    // The push failed: the epoch is published by CID, and the report says why.
    let r0 = f.sink.report(JOB, 0).await.unwrap();
    assert!(
        r0.registry_error.as_deref().unwrap().contains("503"),
        "{r0:?}"
    );
    assert_eq!(r0.repo, None);
    assert!(f.objects.is_pinned(&cp0).await.unwrap());
    // The Hub is back: the next publication pushes epoch 0's repo first, as staged.
    registry.down.store(false, Ordering::SeqCst);
    let w0 = f.weights(&cp0).await;
    let deltas = vec![f.submit(1, 1, &w0, Behaviour::Honest).await];
    f.publish(1, Some(&cp0), &deltas).await;
    let r0 = f.sink.report(JOB, 0).await.unwrap();
    assert_eq!(r0.registry_error, None, "{r0:?}");
    let repo = r0.repo.expect("pushed");
    assert!(repo.ends_with("-epoch-0"), "{repo}");
    let card = std::fs::read_to_string(dir.join(&repo).join("README.md")).unwrap();
    assert_eq!(hanzod::publish::ModelCard::parse(&card).unwrap().cid, cp0);
    let r1 = f.sink.report(JOB, 1).await.unwrap();
    assert!(r1.repo.is_some() && r1.registry_error.is_none(), "{r1:?}");
    // One failed call, then one call per epoch: nothing pushed twice.
    assert_eq!(registry.calls.load(Ordering::SeqCst), 3);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A blob store whose `get` of one blob waits until the test opens the gate: a job whose
/// deltas are slow to fetch (or, as it looks from outside, slow to aggregate).
#[derive(Debug)]
struct GatedBlobs {
    inner: MemoryBlobStore,
    gated: [u8; 32],
    /// Set once the gated blob is asked for.
    asked: tokio::sync::Notify,
    open: tokio::sync::watch::Sender<bool>,
    gets: std::sync::atomic::AtomicUsize,
    /// Panic at the next fetch of the gated blob (once), as a failing keeper would.
    panic_once: std::sync::atomic::AtomicBool,
}

impl GatedBlobs {
    fn new(gated: [u8; 32]) -> GatedBlobs {
        GatedBlobs {
            inner: MemoryBlobStore::new(),
            gated,
            asked: tokio::sync::Notify::new(),
            open: tokio::sync::watch::channel(false).0,
            gets: 0.into(),
            panic_once: false.into(),
        }
    }
}

#[async_trait::async_trait]
impl BlobStore for GatedBlobs {
    async fn put(
        &self,
        hash: [u8; 32],
        bytes: Arc<[u8]>,
    ) -> Result<(), hanzod::delta::store::BlobError> {
        self.inner.put(hash, bytes).await
    }
    async fn get(&self, hash: &[u8; 32]) -> Result<Arc<[u8]>, hanzod::delta::store::BlobError> {
        if *hash == self.gated {
            self.gets.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.asked.notify_one();
            let _ = self.open.subscribe().wait_for(|open| *open).await;
            if self
                .panic_once
                .swap(false, std::sync::atomic::Ordering::SeqCst)
            {
                panic!("injected fault: the keeper fails mid-publication");
            }
        }
        self.inner.get(hash).await
    }
    async fn contains(&self, hash: &[u8; 32]) -> Result<bool, hanzod::delta::store::BlobError> {
        self.inner.contains(hash).await
    }
    async fn remove(&self, hash: &[u8; 32]) -> Result<(), hanzod::delta::store::BlobError> {
        self.inner.remove(hash).await
    }
}

/// A sink over [`GatedBlobs`], and job 8's epoch 0 with one delta behind the gate (never
/// stored: once the gate opens, it is rejected as unavailable and the epoch keeps its base).
async fn gated_sink() -> (TrainingSink, Arc<GatedBlobs>, DeltaReceipt) {
    let slow = DeltaReceipt {
        job: JobId(8),
        node: Identity::from_seed([9; 32]).node_id(),
        epoch: 0,
        step: 0,
        delta_hash: [0xee; 32],
        claimed_loss: 1.0,
        signature: vec![0; 64],
    };
    let blobs = Arc::new(GatedBlobs::new(slow.delta_hash));
    let config = SinkConfig {
        workers: 2,
        ..SinkConfig::default()
    };
    let sink = TrainingSink::start(
        blobs.clone(),
        Arc::new(ModelCatalog::builtin()),
        [42u8; 32],
        config,
        Arc::new(MemoryMetrics::new()),
        None,
        hanzod::delta::sink::Publication::memory(),
    )
    .await
    .unwrap();
    (sink, blobs, slow)
}

/// Publishes `job`'s epoch `epoch` on `sink` (the job actor's call).
async fn publish_on(
    sink: &TrainingSink,
    job: JobId,
    epoch: u32,
    deltas: &[DeltaReceipt],
) -> hanzod::core::ports::PublishedEpoch {
    let spec = spec();
    let input = EpochInput {
        job,
        epoch,
        spec: &spec,
        base: None,
        deltas,
        ring: None,
        audit: None,
        best_loss: None,
    };
    sink.publish(input).await.unwrap()
}

/// Regression (the model keeper served every job's publication from one mailbox, so one
/// job's slow aggregation held up all the others, and counted against their
/// `publish_deadline_ms`): while job 8's epoch waits on its delta, job 7's epoch is
/// published; job 8's lands once its delta comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_aggregation_of_one_job_does_not_delay_another_jobs_publication() {
    use std::time::Duration;
    let (sink, blobs, delta) = gated_sink().await;
    let slow = tokio::spawn({
        let (sink, delta) = (sink.clone(), delta.clone());
        async move { publish_on(&sink, delta.job, 0, &[delta]).await }
    });
    tokio::time::timeout(Duration::from_secs(60), blobs.asked.notified())
        .await
        .expect("job 8's aggregation asks for its delta");

    let fast = tokio::time::timeout(Duration::from_secs(60), publish_on(&sink, JOB, 0, &[]))
        .await
        .expect("job 7's publication waited for job 8's aggregation");
    assert!(fast.checkpoint.starts_with("bafk"), "{fast:?}");
    assert!(sink.report(JOB, 0).await.is_some());
    assert!(
        !slow.is_finished(),
        "job 8's delta is still behind the gate"
    );
    assert!(sink.report(delta.job, 0).await.is_none());

    // The gate opens: job 8's epoch is published (its delta is not there, so it keeps
    // the base).
    blobs.open.send_replace(true);
    let published = tokio::time::timeout(Duration::from_secs(60), slow)
        .await
        .expect("job 8's publication ends")
        .unwrap();
    let r = sink.report(delta.job, 0).await.unwrap();
    assert_eq!(r.checkpoint, published.checkpoint);
    assert!(
        matches!(r.deltas[0].rejected, Some(Rejection::Unavailable(_))),
        "{r:?}"
    );
    assert_eq!(blobs.gets.load(std::sync::atomic::Ordering::SeqCst), 1);
    sink.stop();
}

/// A second call for an epoch whose publication is still running (a rebuilt job actor
/// asking again) waits for the first, gets the same checkpoint, and merges nothing again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_call_for_an_epoch_in_flight_gets_the_first_ones_checkpoint() {
    use std::time::Duration;
    let (sink, blobs, delta) = gated_sink().await;
    let call = |sink: &TrainingSink| {
        let (sink, delta) = (sink.clone(), delta.clone());
        tokio::spawn(async move { publish_on(&sink, delta.job, 0, &[delta]).await })
    };
    let first = call(&sink);
    tokio::time::timeout(Duration::from_secs(60), blobs.asked.notified())
        .await
        .expect("the first call asks for the delta");
    let second = call(&sink);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!first.is_finished() && !second.is_finished());

    blobs.open.send_replace(true);
    let (first, second) = tokio::time::timeout(Duration::from_secs(60), async {
        (first.await.unwrap(), second.await.unwrap())
    })
    .await
    .expect("both calls end");
    assert_eq!(first.checkpoint, second.checkpoint);
    assert_eq!(first.summary, second.summary);
    // The delta was fetched once: the epoch was aggregated once.
    assert_eq!(blobs.gets.load(std::sync::atomic::Ordering::SeqCst), 1);
    sink.stop();
}

/// Regression (a job keeper that died mid-publication dropped the caller's reply, and the
/// job failed with "the model keeper did not answer"): the call is made again to the
/// rebuilt keeper, and the job gets its checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keeper_that_dies_mid_publication_is_called_again_and_the_epoch_is_published() {
    use std::time::Duration;
    let (sink, blobs, delta) = gated_sink().await;
    blobs
        .panic_once
        .store(true, std::sync::atomic::Ordering::SeqCst);
    blobs.open.send_replace(true);
    let published = tokio::time::timeout(
        Duration::from_secs(60),
        publish_on(&sink, delta.job, 0, std::slice::from_ref(&delta)),
    )
    .await
    .expect("the publication ends");
    assert_eq!(
        sink.report(delta.job, 0).await.unwrap().checkpoint,
        published.checkpoint
    );
    // The first keeper died at its fetch; the rebuilt one fetched again.
    assert_eq!(blobs.gets.load(std::sync::atomic::Ordering::SeqCst), 2);
    sink.stop();
}

/// A job keeper that fails is rebuilt on the job's next call: its reports survive (a
/// second call for a published epoch gets the same checkpoint, merged once), and the next
/// epoch continues from the last checkpoint, reloaded by CID.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_job_keeper_is_rebuilt_with_its_reports_and_the_job_continues() {
    let f = fixture(0.0).await;
    let init = train::init(&recipe_of(&spec().training, JOB).unwrap());
    let mut deltas = Vec::new();
    for i in 1..=2 {
        deltas.push(f.submit(i, 0, &init, Behaviour::Honest).await);
    }
    let cp0 = f.publish(0, None, &deltas).await;
    f.sink.crash_job_keeper(JOB);
    for _ in 0..200 {
        if f.metrics.counter(Counter::ActorRestarts, "keeper") == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(f.metrics.counter(Counter::ActorRestarts, "keeper"), 1);
    assert_eq!(f.sink.report(JOB, 0).await.unwrap().checkpoint, cp0);
    // Asked again (a rebuilt job actor): the same checkpoint, not a second merge.
    assert_eq!(f.publish(0, None, &deltas).await, cp0);
    assert_eq!(f.metrics.counter(Counter::Merges, "weighted_mean"), 1);
    let w0 = f.weights(&cp0).await;
    let deltas = vec![f.submit(1, 1, &w0, Behaviour::Honest).await];
    let cp1 = f.publish(1, Some(&cp0), &deltas).await;
    let r1 = f.sink.report(JOB, 1).await.unwrap();
    assert_eq!(r1.base.as_deref(), Some(cp0.as_str()));
    assert_eq!(r1.checkpoint, cp1);
    assert!(r1.loss_after < r1.loss_before, "{r1:#?}");
}

/// The job's best loss as its summaries record it bounds the merge even when the sink has
/// no report of the earlier epochs (a restarted daemon's keeper starts with none): a merge
/// that improves on its base but stays above the recorded best × 1.02 is not published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_recorded_best_loss_bounds_a_merge_the_sink_has_no_reports_for() {
    let f = fixture(0.0).await;
    let init = train::init(&recipe_of(&spec().training, JOB).unwrap());
    // Epoch 3 of a job whose summaries say it once reached half this base's loss.
    let free = fixture(0.0).await;
    let mut deltas = Vec::new();
    for i in 1..=4 {
        let receipt = f.submit(i, 3, &init, Behaviour::Honest).await;
        free.submit(i, 3, &init, Behaviour::Honest).await;
        deltas.push(receipt);
    }
    free.published_after(3, None, &deltas, None).await;
    let advanced = free.sink.report(JOB, 3).await.unwrap();
    assert!(
        advanced.aggregator.is_some() && advanced.loss_after < advanced.loss_before,
        "without a recorded best the epoch advances: {advanced:#?}"
    );
    let best = advanced.loss_after * 0.5;
    let kept = f.published_after(3, None, &deltas, Some(best)).await;
    let r = f.sink.report(JOB, 3).await.unwrap();
    assert_eq!(r.aggregator, None, "{r:#?}");
    assert!(
        r.kept
            .as_deref()
            .is_some_and(|k| k.contains("best checkpoint")),
        "{:?}",
        r.kept
    );
    assert_eq!(
        kept.summary.expect("summary").outcome_line(),
        format!("kept the previous checkpoint: {}", r.kept.unwrap())
    );
    // The report's best is the job's, not only what this keeper saw.
    assert_eq!((r.best_loss, r.best_epoch), (Some(best), None));
}
