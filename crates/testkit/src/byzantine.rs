//! `hanzod bench byzantine` (issue 19 item 4): how far each attack of the suite
//! ([`hanzod_node::attack`]) moves training under each aggregator, and what the attackers
//! earn and lose.
//!
//! Each run is one star-mode job on in-process nodes, epoch by epoch, through the daemon's
//! own decision functions: every node's local run ([`Trainer::local_delta`], what
//! `hanzod node` trains), the Byzantine nodes' forgeries ([`Attack::forge`]), signed HZDL
//! uploads, [`validate`] (signature, step, format, quality score, spot-check at the
//! configured rate with the epoch's secret), [`star_epoch`] (copies, suspects, the
//! aggregator, the loss check that keeps the base), the report's reward shares
//! ([`reward_shares`]) and slashing evidence. What the bench leaves out is transport and
//! actors: no gRPC, no ledger, no object store. A node slashed in an epoch stays in the
//! job, as in a star job of the daemon, but its reward shares are withheld while its
//! penalty lasts (the whole job: the penalty outlasts it), and it may be slashed again.
//!
//! Each row compares the final validation loss with the honest-only run (the same seed,
//! the same aggregator, the cell's honest nodes alone: what the network would have
//! trained had the Byzantine nodes stayed away), and reports the Byzantine nodes' share of the
//! epochs' reward pools and the fraction of their stake slashed. The nodes are picked and
//! the forgeries' noise drawn from the run's seed: the same arguments give the same table.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::demo::LM_RECIPE;
use hanzod_actors::job::{Aggregation, TrainingSpec};
use hanzod_actors::ports::DeltaReceipt;
use hanzod_actors::types::{JobId, NodeId};
use hanzod_node::attack::{Attack, Forge};
use hanzod_pipeline::epoch::{fold_norms, star_epoch, star_norms, StarPolicy};
use hanzod_pipeline::merge::RobustAggregator;
use hanzod_pipeline::score::{EpochSecret, NormTracker};
use hanzod_pipeline::sink::{epoch_report, reward_shares};
use hanzod_pipeline::validate::{validate, EpochContext, Submission, ValidationConfig};
use hanzod_protocol::hzdl::{payload_hash, sign_statement, Statement};
use hanzod_protocol::identity::Identity;
use hanzod_train::{Trainer, Weights};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use sha2::{Digest, Sha256};

/// The models the bench trains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum BenchModel {
    /// The wine-quality MLP (1,537 parameters; SGD).
    WineMlp,
    /// The tiny Qwen3 language model on Jane Austen (full-parameter AdamW).
    Qwen3Tiny,
}

impl BenchModel {
    /// The catalog name.
    pub fn name(self) -> &'static str {
        match self {
            BenchModel::WineMlp => hanzod_train::MODEL_NAME,
            BenchModel::Qwen3Tiny => hanzod_train::lm::QWEN3_TINY,
        }
    }

    /// The job's training spec (the demo's recipe for the model, star aggregation), with
    /// `local_steps` when given.
    pub fn training(self, seed: u64, local_steps: Option<u32>) -> TrainingSpec {
        let d = TrainingSpec::default();
        match self {
            BenchModel::WineMlp => TrainingSpec {
                seed,
                local_steps: local_steps.unwrap_or(d.local_steps),
                aggregation: Aggregation::Star,
                ..d
            },
            BenchModel::Qwen3Tiny => TrainingSpec {
                model: hanzod_train::lm::QWEN3_TINY.into(),
                dataset: hanzod_train::text::AUSTEN.into(),
                local_steps: local_steps.unwrap_or(LM_RECIPE.local_steps),
                batch_size: LM_RECIPE.batch_size,
                local_lr: LM_RECIPE.local_lr,
                seq_len: LM_RECIPE.seq_len,
                validation_tokens: LM_RECIPE.validation_tokens,
                seed,
                aggregation: Aggregation::Star,
                ..d
            },
        }
    }
}

/// How an epoch's deltas are merged in a run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum AggregatorChoice {
    /// The daemon's policy ([`StarPolicy`]): the weighted mean by score × agreement
    /// (suspects weigh 0) with the robust aggregator as the fallback of a merge the loss
    /// check refuses (`validation.robust_aggregator`); the robust aggregator alone when
    /// more than 30 % of an epoch without an agreement is suspect.
    Policy {
        /// The robust aggregator of the policy.
        robust: RobustAggregator,
    },
    /// The robust aggregator on every epoch, every accepted delta with weight 1.
    Alone {
        /// The aggregator.
        robust: RobustAggregator,
    },
}

impl AggregatorChoice {
    /// The daemon's default: the policy with the coordinate median.
    pub const DEFAULT: AggregatorChoice = AggregatorChoice::Policy {
        robust: RobustAggregator::Median,
    };

    /// A short label: `policy(median)`, `krum`, …
    pub fn label(&self) -> String {
        match self {
            AggregatorChoice::Policy { robust } => format!("policy({})", robust.name()),
            AggregatorChoice::Alone { robust } => robust.name().to_string(),
        }
    }

    fn star_policy(&self, outer_lr: f32) -> StarPolicy {
        match *self {
            AggregatorChoice::Policy { robust } => StarPolicy {
                outer_lr,
                suspect_threshold: 0.30,
                robust_aggregator: robust,
                robust_alone: false,
            },
            AggregatorChoice::Alone { robust } => StarPolicy {
                outer_lr,
                suspect_threshold: 0.30,
                robust_aggregator: robust,
                robust_alone: true,
            },
        }
    }
}

impl std::str::FromStr for AggregatorChoice {
    type Err = String;

    /// `default` (= `policy:median`), `policy:<robust>`, or a robust aggregator alone:
    /// `median`, `trimmed-mean[:trim]` (0.2), `krum[:fraction]`, `multi-krum[:fraction]`
    /// (0.3), `centered-clipping[:iterations]` (3, τ from the data).
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "default" {
            return Ok(AggregatorChoice::DEFAULT);
        }
        let (policy, rest) = match s.strip_prefix("policy:") {
            Some(r) => (true, r),
            None => (false, s),
        };
        let (kind, arg) = match rest.split_once(':') {
            Some((k, a)) => (k, Some(a)),
            None => (rest, None),
        };
        let num = |default: f32| -> Result<f32, String> {
            arg.map_or(Ok(default), |a| {
                a.parse::<f32>()
                    .map_err(|_| format!("{a:?} is not a number"))
            })
        };
        let robust = match kind {
            "median" if arg.is_none() => RobustAggregator::Median,
            "trimmed-mean" => RobustAggregator::TrimmedMean { trim: num(0.2)? },
            "krum" => RobustAggregator::Krum {
                byzantine_fraction: num(0.3)?,
            },
            "multi-krum" => RobustAggregator::MultiKrum {
                byzantine_fraction: num(0.3)?,
                select: None,
            },
            "centered-clipping" => RobustAggregator::CenteredClipping {
                iterations: arg
                    .map_or(Ok(3), str::parse::<usize>)
                    .map_err(|e| format!("iterations: {e}"))?,
                tau: None,
            },
            _ => {
                return Err(format!(
                    "unknown aggregator {s:?} (default, policy:<robust>, median, \
                     trimmed-mean[:trim], krum[:fraction], multi-krum[:fraction], \
                     centered-clipping[:iterations])"
                ))
            }
        };
        robust.check().map_err(|e| format!("{s}: {e}"))?;
        Ok(if policy {
            AggregatorChoice::Policy { robust }
        } else {
            AggregatorChoice::Alone { robust }
        })
    }
}

/// One job of the bench.
#[derive(Debug, Clone, Serialize)]
pub struct RunSpec {
    /// The model.
    pub model: BenchModel,
    /// Nodes at the start (honest and Byzantine).
    pub nodes: usize,
    /// Byzantine nodes among them (picked from the seed).
    pub byzantine: usize,
    /// Their attack; `None`: they take no part (the honest-only run of the same nodes).
    pub attack: Option<Attack>,
    /// The aggregator.
    pub aggregator: AggregatorChoice,
    /// Epochs.
    pub epochs: u32,
    /// Local steps per epoch (`None`: the recipe's).
    pub local_steps: Option<u32>,
    /// Fraction of deltas spot-checked (DESIGN §6 default 0.1).
    pub spot_check_rate: f64,
    /// The seed: the recipe's, the node keys, the Byzantine nodes, the epoch secrets, the
    /// forgeries' noise.
    pub seed: u64,
}

/// What one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    /// Validation loss of each epoch's checkpoint, from the initial weights' (index 0) on.
    pub losses: Vec<f64>,
    /// Epochs that kept their base (nothing merged).
    pub kept_epochs: u32,
    /// Fraction of the epochs' reward pools paid to Byzantine nodes (each epoch's pool
    /// counts equally; an epoch that paid nobody counts 0).
    pub byzantine_reward_share: f64,
    /// Byzantine nodes slashed at least once.
    pub byzantine_slashed: usize,
    /// Slashes of each Byzantine node, in node order (a slashed node stays in a star job,
    /// unpaid under its penalty, and may be slashed again).
    pub byzantine_slashes: Vec<u32>,
    /// Honest nodes slashed (a false accusation; should be 0).
    pub honest_slashed: usize,
    /// Byzantine deltas accepted (not rejected, whatever their weight).
    pub byzantine_accepted: usize,
    /// Byzantine deltas uploaded.
    pub byzantine_deltas: usize,
    /// Honest deltas marked suspect or rejected (the policy's false positives).
    pub honest_flagged: usize,
    /// Honest deltas uploaded.
    pub honest_deltas: usize,
}

impl RunResult {
    /// The final checkpoint's validation loss.
    pub fn final_loss(&self) -> f64 {
        self.losses.last().copied().unwrap_or(f64::NAN)
    }
}

/// Why a run could not be made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BenchError {
    /// The recipe does not resolve.
    #[error("recipe: {0}")]
    Recipe(String),
    /// A local run or a loss evaluation failed.
    #[error("training: {0}")]
    Training(String),
}

/// The key of node `i` of a run seeded `seed`.
fn identity(seed: u64, i: usize) -> Identity {
    let mut h = Sha256::new();
    h.update(b"hanzod.bench.byzantine.node");
    h.update(seed.to_le_bytes());
    h.update((i as u64).to_le_bytes());
    Identity::from_seed(h.finalize().into())
}

/// The epoch secret of a run (what the orchestrator commits to and reveals).
fn secret(seed: u64, epoch: u32) -> EpochSecret {
    let mut h = Sha256::new();
    h.update(b"hanzod.bench.byzantine.secret");
    h.update(seed.to_le_bytes());
    EpochSecret::derive(&h.finalize().into(), seed, epoch)
}

/// Which nodes of a run are Byzantine: the first `byzantine` of the seed's shuffle.
pub fn byzantine_nodes(nodes: usize, byzantine: usize, seed: u64) -> BTreeSet<usize> {
    let mut order: Vec<usize> = (0..nodes).collect();
    order.shuffle(&mut ChaCha8Rng::seed_from_u64(seed ^ 0xB42));
    order.into_iter().take(byzantine).collect()
}

/// Runs one job (module docs) on `trainer` (the recipe of `spec.model` and `spec.seed`,
/// [`hanzod_train::trainer_of`]).
///
/// Errors: [`BenchError::Training`] when a local run or a loss evaluation fails.
pub fn run(spec: &RunSpec, trainer: &Trainer) -> Result<RunResult, BenchError> {
    let training = spec.model.training(spec.seed, spec.local_steps);
    let job = JobId(spec.seed);
    let dtype = hanzod_train::recipe::delta_dtype(&training)
        .map_err(|e| BenchError::Recipe(e.to_string()))?;
    let ids: Vec<Identity> = (0..spec.nodes).map(|i| identity(spec.seed, i)).collect();
    let byz = byzantine_nodes(spec.nodes, spec.byzantine, spec.seed);
    let training_err = |e: hanzod_train::TrainError| BenchError::Training(e.to_string());
    let policy = spec.aggregator.star_policy(training.outer_lr as f32);
    let mut rng = ChaCha8Rng::seed_from_u64(spec.seed ^ 0xF0F0);
    let mut bases: Vec<Arc<Weights>> = vec![Arc::new(trainer.init())];
    let mut losses = vec![trainer.validation_loss(&bases[0]).map_err(training_err)?];
    let mut norms = NormTracker::new();
    let mut last_merged: Option<Arc<Vec<f32>>> = None;
    // Without an attack the Byzantine nodes are absent: the honest nodes alone.
    let live: Vec<usize> = (0..spec.nodes)
        .filter(|i| spec.attack.is_some() || !byz.contains(i))
        .collect();
    let mut out = RunResult {
        losses: Vec::new(),
        kept_epochs: 0,
        byzantine_reward_share: 0.0,
        byzantine_slashed: 0,
        byzantine_slashes: Vec::new(),
        honest_slashed: 0,
        byzantine_accepted: 0,
        byzantine_deltas: 0,
        honest_flagged: 0,
        honest_deltas: 0,
    };
    let mut reward_share_sum = 0.0;
    let mut penalised: BTreeSet<NodeId> = BTreeSet::new();
    let mut slashes: std::collections::BTreeMap<usize, u32> = Default::default();
    for epoch in 0..spec.epochs {
        let base = bases.last().expect("one base at least").clone();
        let first_step = u64::from(epoch) * u64::from(trainer.local_steps());
        // Every node's honest local run (a stale node's from an older checkpoint).
        let mut honest: Vec<(usize, Vec<f32>, f64)> = Vec::with_capacity(live.len());
        for &i in &live {
            let from = match spec.attack {
                Some(Attack::Stale { epochs }) if byz.contains(&i) => {
                    let back = (epochs as usize).min(bases.len() - 1);
                    bases[bases.len() - 1 - back].clone()
                }
                _ => base.clone(),
            };
            let node = ids[i].node_id().0;
            let run = trainer
                .local_delta(&from, &node, first_step)
                .map_err(training_err)?;
            honest.push((i, run.delta.data, run.claimed_loss));
        }
        let colluders: Vec<&[f32]> = honest
            .iter()
            .filter(|(i, ..)| byz.contains(i))
            .map(|(_, d, _)| d.as_slice())
            .collect();
        let honest_only: Vec<&[f32]> = honest
            .iter()
            .filter(|(i, ..)| !byz.contains(i))
            .map(|(_, d, _)| d.as_slice())
            .collect();
        // The uploads: honest nodes upload their run; Byzantine ones forge.
        let mut receipts = Vec::with_capacity(honest.len());
        let mut payloads = Vec::with_capacity(honest.len());
        for (k, (i, delta, measured)) in honest.iter().enumerate() {
            let (data, claimed) = match spec.attack.filter(|_| byz.contains(i)) {
                None => (delta.clone(), *measured),
                Some(attack) => {
                    // A free-rider copies an honest node's delta (the next one in order).
                    let peer =
                        (!honest_only.is_empty()).then(|| honest_only[k % honest_only.len()]);
                    let view = Forge {
                        own: delta,
                        colluders: &colluders,
                        peer,
                        last_merged: last_merged.as_deref().map(Vec::as_slice),
                        nodes: honest.len(),
                        lora_b: &[],
                    };
                    (attack.forge(&view, &mut rng), attack.claim(*measured))
                }
            };
            let weights = Weights {
                layout: trainer.delta_layout(),
                data,
            };
            let payload = weights
                .to_delta_bytes_as(u64::from(epoch), dtype)
                .map_err(|e| BenchError::Training(e.to_string()))?;
            let hash = payload_hash(&payload);
            let statement = Statement {
                job: job.0,
                epoch,
                step: first_step,
                claimed_loss: claimed,
            };
            receipts.push(DeltaReceipt {
                job,
                node: ids[*i].node_id(),
                epoch,
                step: first_step,
                delta_hash: hash,
                claimed_loss: claimed,
                signature: sign_statement(&ids[*i], &statement, &hash).to_vec(),
            });
            payloads.push(Arc::<[u8]>::from(payload));
        }
        let ctx = EpochContext {
            job: job.0,
            epoch,
            trainer: trainer.clone(),
            base: base.clone(),
            base_version: u64::from(epoch),
            loss_before: *losses.last().expect("one loss at least"),
            best_loss: losses.iter().copied().reduce(f64::min),
            norms,
            last_merged: last_merged.clone(),
            secret: secret(spec.seed, epoch),
            config: ValidationConfig {
                spot_check_rate: spec.spot_check_rate,
                ..ValidationConfig::default()
            },
        };
        let judged = receipts
            .iter()
            .zip(&payloads)
            .map(|(r, p)| {
                validate(
                    &ctx,
                    &Submission {
                        receipt: r.clone(),
                        payload: p.clone(),
                    },
                )
            })
            .collect();
        let star = star_epoch(&ctx, judged, &policy);
        let merged = &star.merged;
        let report = epoch_report(
            &ctx,
            &receipts,
            &star.judged,
            (&star.agreement, &star.weights),
            None,
            ("", merged.loss_after, merged.aggregator),
        );
        // Rewards: this epoch's pool split by the report's shares, less those of nodes
        // under a slashing penalty (the settlement withholds them).
        let shares: Vec<(NodeId, f64)> = reward_shares(&report)
            .into_iter()
            .filter(|(n, _)| !penalised.contains(n))
            .collect();
        let total: f64 = shares.iter().map(|(_, s)| s).filter(|s| **s > 0.0).sum();
        let is_byz = |n: &NodeId| {
            live.iter()
                .any(|&i| byz.contains(&i) && ids[i].node_id() == *n)
        };
        if total > 0.0 {
            let byz_paid: f64 = shares
                .iter()
                .filter(|(n, s)| *s > 0.0 && is_byz(n))
                .map(|(_, s)| s)
                .sum();
            reward_share_sum += byz_paid / total;
        }
        // Deltas judged, flagged; who is slashed is under a penalty from now on.
        let mut slashed: BTreeSet<NodeId> = BTreeSet::new();
        for (k, ((i, ..), v)) in honest.iter().zip(&star.judged).enumerate() {
            let byzantine = byz.contains(i);
            tracing::debug!(
                epoch,
                node = i,
                byzantine,
                rejected = v.outcome.as_ref().err().map(|r| r.label()),
                rise = v.loss_after.map(|l| l / ctx.loss_before - 1.0),
                loss_improvement = v.score.map(|s| s.loss_improvement),
                stability = v.score.map(|s| s.stability),
                convergence = v.score.and_then(|s| s.convergence),
                composite = v.score.map(|s| s.composite),
                agreement = star.agreement[k],
                suspect = v.suspect(),
                aggregator = merged.aggregator,
                "delta"
            );
            if byzantine {
                out.byzantine_deltas += 1;
                out.byzantine_accepted += usize::from(v.outcome.is_ok());
            } else {
                out.honest_deltas += 1;
                out.honest_flagged += usize::from(v.outcome.is_err() || v.suspect());
            }
        }
        for e in &report.slashes {
            if let Ok(n) = e.node.parse::<NodeId>() {
                slashed.insert(n);
            }
        }
        for n in &slashed {
            match live.iter().find(|&&i| ids[i].node_id() == *n) {
                Some(i) if byz.contains(i) => *slashes.entry(*i).or_insert(0) += 1,
                _ => out.honest_slashed += 1,
            }
        }
        penalised.extend(slashed);
        // The job's model state for the next epoch, as the sink keeps it.
        norms = fold_norms(star.norm_average, star_norms(&star.judged, &star.agreement));
        if merged.aggregator.is_none() {
            out.kept_epochs += 1;
        }
        if let Some(d) = &merged.delta {
            last_merged = Some(d.clone());
        }
        losses.push(merged.loss_after);
        bases.push(merged.next.clone());
    }
    out.byzantine_reward_share = reward_share_sum / f64::from(spec.epochs.max(1));
    if spec.attack.is_some() {
        out.byzantine_slashes = byz
            .iter()
            .map(|i| slashes.get(i).copied().unwrap_or(0))
            .collect();
        out.byzantine_slashed = out.byzantine_slashes.iter().filter(|&&k| k > 0).count();
    }
    out.losses = losses;
    Ok(out)
}

/// Runs `specs` on up to `threads` threads (runs in parallel, each on one thread), with
/// one trainer per (model, seed) built once. Results in `specs` order.
///
/// Errors: the first run's error, or [`BenchError::Recipe`].
pub fn run_all(specs: &[RunSpec], threads: usize) -> Result<Vec<RunResult>, BenchError> {
    let mut trainers: std::collections::BTreeMap<(String, u64, Option<u32>), Trainer> =
        Default::default();
    for s in specs {
        let key = (s.model.name().to_string(), s.seed, s.local_steps);
        if let std::collections::btree_map::Entry::Vacant(slot) = trainers.entry(key) {
            let training = s.model.training(s.seed, s.local_steps);
            let t = hanzod_train::trainer_of(&training, JobId(s.seed))
                .map_err(|e| BenchError::Recipe(e.to_string()))?;
            slot.insert(t);
        }
    }
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<RunResult, BenchError>>>> =
        Mutex::new(vec![None; specs.len()]);
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                let Some(s) = specs.get(k) else { break };
                let t = &trainers[&(s.model.name().to_string(), s.seed, s.local_steps)];
                let r = run(s, t);
                results.lock().expect("no panics hold it")[k] = Some(r);
            });
        }
    });
    results
        .into_inner()
        .expect("no panics hold it")
        .into_iter()
        .map(|r| r.expect("every run ran"))
        .collect()
}

/// The attacks of the default grid, as `--byzantine` spells them.
pub const DEFAULT_ATTACKS: &[&str] = &[
    "sign-flip",
    "scale:-10",
    "scale:10",
    "noise:1",
    "alie",
    "ipm:0.5",
    "copy-peer",
    "copy-peer:1:0.05",
    "copy-last",
    "lazy",
    "lazy:0.001",
    "stale:1",
    "lie-loss",
    "identical",
];

/// The aggregators of the default grid ([`AggregatorChoice`]'s syntax).
pub const DEFAULT_AGGREGATORS: &[&str] = &[
    "default",
    "median",
    "trimmed-mean",
    "krum",
    "multi-krum",
    "centered-clipping",
];

/// What to run (the `hanzod bench byzantine` flags).
#[derive(Debug, Clone, clap::Args)]
pub struct ByzantineArgs {
    /// Models (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "wine-mlp")]
    pub models: Vec<BenchModel>,
    /// Nodes per job.
    #[arg(long, default_value_t = 10)]
    pub nodes: usize,
    /// Epochs per job, 1..=1000 [default: 6 for the MLP, 2 for qwen3-tiny].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub epochs: Option<u32>,
    /// Local steps per epoch [default: the recipe's; 20 for qwen3-tiny].
    #[arg(long)]
    pub local_steps: Option<u32>,
    /// Byzantine fractions of the nodes (comma-separated, each in (0, 1)).
    #[arg(long, value_delimiter = ',', default_value = "0.1,0.2,0.3,0.4")]
    pub fractions: Vec<f64>,
    /// Attacks (comma-separated `--byzantine` values) [default: the whole suite].
    #[arg(long, value_delimiter = ',')]
    pub attacks: Vec<String>,
    /// Aggregators (comma-separated: `default`, `policy:<robust>`, `median`,
    /// `trimmed-mean[:trim]`, `krum[:fraction]`, `multi-krum[:fraction]`,
    /// `centered-clipping[:iterations]`)
    /// [default: all six].
    #[arg(long, value_delimiter = ',')]
    pub aggregators: Vec<String>,
    /// Seeds per cell (1, 2, …).
    #[arg(long, default_value_t = 3)]
    pub seeds: u64,
    /// Fraction of deltas spot-checked.
    #[arg(long, default_value_t = 0.1)]
    pub spot_check_rate: f64,
    /// Stake slashed per failed spot-check, % (the daemon's `chain.slash_pct`), 0..=100.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub slash_pct: u8,
    /// Runs in parallel [default: the machine's cores].
    #[arg(long)]
    pub threads: Option<usize>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// One cell of the table: an attack under an aggregator at a Byzantine fraction, over the
/// seeds.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The model.
    pub model: BenchModel,
    /// The attack (`--byzantine` syntax).
    pub attack: String,
    /// The aggregator ([`AggregatorChoice::label`]).
    pub aggregator: String,
    /// Byzantine nodes of the job's nodes.
    pub byzantine: usize,
    /// The job's nodes.
    pub nodes: usize,
    /// Mean over the seeds of final loss / the honest-only final loss − 1 (0.02 = 2 %
    /// worse), the honest-only run being the same job on its honest nodes alone.
    pub loss_rel_mean: f64,
    /// The worst seed's.
    pub loss_rel_max: f64,
    /// Mean Byzantine share of the epochs' reward pools (0..1).
    pub reward_share: f64,
    /// Mean fraction of the Byzantine nodes' stake slashed (0..1).
    pub stake_lost: f64,
    /// Byzantine deltas accepted / uploaded, over the seeds.
    pub accepted: (usize, usize),
    /// Honest deltas flagged (suspect or rejected) / uploaded, over the seeds.
    pub honest_flagged: (usize, usize),
    /// Honest nodes slashed, over the seeds (a false accusation).
    pub honest_slashed: usize,
    /// Epochs that kept their base, over the seeds.
    pub kept_epochs: u32,
}

/// The honest-only baseline of one (model, aggregator).
#[derive(Debug, Clone, Serialize)]
pub struct Baseline {
    /// The model.
    pub model: BenchModel,
    /// The aggregator.
    pub aggregator: String,
    /// Mean final validation loss over the seeds.
    pub final_loss: f64,
    /// Mean initial validation loss.
    pub initial_loss: f64,
    /// Honest deltas flagged (suspect or rejected) / uploaded, over the seeds: the
    /// suspicion rule's false positives on honest runs.
    pub honest_flagged: (usize, usize),
    /// Epochs that kept their base, over the seeds.
    pub kept_epochs: u32,
}

/// The whole table.
#[derive(Debug, Clone, Serialize)]
pub struct Table {
    /// The arguments' resolved values.
    pub nodes: usize,
    /// Seeds per cell.
    pub seeds: u64,
    /// Spot-check rate.
    pub spot_check_rate: f64,
    /// Honest-only runs.
    pub baselines: Vec<Baseline>,
    /// The cells.
    pub rows: Vec<Row>,
}

/// Why the arguments describe no table.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ByzantineArgsError {
    /// An attack does not parse.
    #[error("--attacks {0}")]
    Attack(String),
    /// An aggregator does not parse.
    #[error("--aggregators {0}")]
    Aggregator(String),
    /// A fraction is out of range or gives no Byzantine node.
    #[error("--fractions: {0}")]
    Fraction(String),
    /// Too few nodes or seeds.
    #[error("{0}")]
    Size(String),
}

/// The runs of `args`: for each model, aggregator and seed the honest-only run, then every
/// attack × fraction. Returns (specs, the attack labels and aggregator choices in order).
#[allow(clippy::type_complexity)]
pub fn plan(
    args: &ByzantineArgs,
) -> Result<(Vec<RunSpec>, Vec<(String, Attack)>, Vec<AggregatorChoice>), ByzantineArgsError> {
    if args.nodes < 3 || args.nodes > 256 {
        return Err(ByzantineArgsError::Size(format!(
            "--nodes must be in 3..=256, got {}",
            args.nodes
        )));
    }
    if args.seeds == 0 || args.seeds > 100 {
        return Err(ByzantineArgsError::Size(format!(
            "--seeds must be in 1..=100, got {}",
            args.seeds
        )));
    }
    if !(0.0..=1.0).contains(&args.spot_check_rate) {
        return Err(ByzantineArgsError::Size(format!(
            "--spot-check-rate must be in [0, 1], got {}",
            args.spot_check_rate
        )));
    }
    if let Some(e) = args.epochs.filter(|e| !(1..=1000).contains(e)) {
        return Err(ByzantineArgsError::Size(format!(
            "--epochs must be in 1..=1000, got {e}"
        )));
    }
    if args.slash_pct > 100 {
        return Err(ByzantineArgsError::Size(format!(
            "--slash-pct must be in 0..=100, got {}",
            args.slash_pct
        )));
    }
    let names: Vec<String> = if args.attacks.is_empty() {
        DEFAULT_ATTACKS.iter().map(|s| s.to_string()).collect()
    } else {
        args.attacks.clone()
    };
    let mut attacks: Vec<(String, Attack)> = Vec::with_capacity(names.len());
    for a in &names {
        let x = a
            .parse::<Attack>()
            .map_err(|e| ByzantineArgsError::Attack(e.to_string()))?;
        // One row per attack, however it is spelled (`alie` twice, `scale:-10` and
        // `scale:-10.0`): a repeated attack would count twice in the table.
        if !attacks.iter().any(|(_, y)| *y == x) {
            attacks.push((a.clone(), x));
        }
    }
    let aggs: Vec<String> = if args.aggregators.is_empty() {
        DEFAULT_AGGREGATORS.iter().map(|s| s.to_string()).collect()
    } else {
        args.aggregators.clone()
    };
    let aggregators = aggs
        .iter()
        .map(|a| a.parse::<AggregatorChoice>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(ByzantineArgsError::Aggregator)?;
    let counts = args
        .fractions
        .iter()
        .map(|&f| {
            let k = (f * args.nodes as f64).round() as usize;
            if !(f > 0.0 && f < 1.0) || k == 0 || k >= args.nodes {
                Err(ByzantineArgsError::Fraction(format!(
                    "{f} of {} nodes is no Byzantine node or all of them",
                    args.nodes
                )))
            } else {
                Ok(k)
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut specs = Vec::new();
    for &model in &args.models {
        let epochs = args.epochs.unwrap_or(match model {
            BenchModel::WineMlp => 6,
            BenchModel::Qwen3Tiny => 2,
        });
        let local_steps = args.local_steps.or(match model {
            BenchModel::WineMlp => None,
            BenchModel::Qwen3Tiny => Some(20),
        });
        for &aggregator in &aggregators {
            for seed in 1..=args.seeds {
                let base = RunSpec {
                    model,
                    nodes: args.nodes,
                    byzantine: 0,
                    attack: None,
                    aggregator,
                    epochs,
                    local_steps,
                    spot_check_rate: args.spot_check_rate,
                    seed,
                };
                specs.push(base.clone());
                for &byzantine in &counts {
                    specs.push(RunSpec {
                        byzantine,
                        ..base.clone()
                    });
                    for (_, attack) in &attacks {
                        specs.push(RunSpec {
                            byzantine,
                            attack: Some(*attack),
                            ..base.clone()
                        });
                    }
                }
            }
        }
    }
    Ok((specs, attacks, aggregators))
}

/// Folds the runs of [`plan`] into the table (`slash_pct`: stake slashed per caught node,
/// %).
pub fn tabulate(
    args: &ByzantineArgs,
    specs: &[RunSpec],
    results: &[RunResult],
    attacks: &[(String, Attack)],
) -> Table {
    let runs: Vec<(&RunSpec, &RunResult)> = specs.iter().zip(results).collect();
    let mut baselines = Vec::new();
    let mut rows = Vec::new();
    let mut models: Vec<BenchModel> = Vec::new();
    let mut aggs: Vec<String> = Vec::new();
    for s in specs {
        if !models.contains(&s.model) {
            models.push(s.model);
        }
        if !aggs.contains(&s.aggregator.label()) {
            aggs.push(s.aggregator.label());
        }
    }
    let mut counts: Vec<usize> = specs
        .iter()
        .map(|s| s.byzantine)
        .filter(|&b| b > 0)
        .collect();
    counts.sort_unstable();
    counts.dedup();
    for &model in &models {
        for agg in &aggs {
            let of = |s: &RunSpec| s.model == model && s.aggregator.label() == *agg;
            let honest: Vec<(&RunSpec, &RunResult)> = runs
                .iter()
                .copied()
                .filter(|(s, _)| of(s) && s.attack.is_none() && s.byzantine == 0)
                .collect();
            if honest.is_empty() {
                continue;
            }
            let n = honest.len() as f64;
            baselines.push(Baseline {
                model,
                aggregator: agg.clone(),
                final_loss: honest.iter().map(|(_, r)| r.final_loss()).sum::<f64>() / n,
                initial_loss: honest.iter().map(|(_, r)| r.losses[0]).sum::<f64>() / n,
                honest_flagged: honest.iter().fold((0, 0), |(a, b), (_, r)| {
                    (a + r.honest_flagged, b + r.honest_deltas)
                }),
                kept_epochs: honest.iter().map(|(_, r)| r.kept_epochs).sum(),
            });
            // The honest nodes of the cell alone, same seed.
            let baseline_of = |seed: u64, byzantine: usize| {
                runs.iter()
                    .find(|(s, _)| {
                        of(s) && s.attack.is_none() && s.seed == seed && s.byzantine == byzantine
                    })
                    .map(|(_, r)| r.final_loss())
            };
            for (label, attack) in attacks {
                for &b in &counts {
                    let cell: Vec<(&RunSpec, &RunResult)> = runs
                        .iter()
                        .copied()
                        .filter(|(s, _)| of(s) && s.attack == Some(*attack) && s.byzantine == b)
                        .collect();
                    if cell.is_empty() {
                        continue;
                    }
                    let m = cell.len() as f64;
                    let rel: Vec<f64> = cell
                        .iter()
                        .map(|(s, r)| match baseline_of(s.seed, s.byzantine) {
                            Some(l) if l > 0.0 => r.final_loss() / l - 1.0,
                            _ => f64::NAN,
                        })
                        .collect();
                    rows.push(Row {
                        model,
                        attack: label.clone(),
                        aggregator: agg.clone(),
                        byzantine: b,
                        nodes: args.nodes,
                        loss_rel_mean: rel.iter().sum::<f64>() / m,
                        loss_rel_max: rel.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                        reward_share: cell
                            .iter()
                            .map(|(_, r)| r.byzantine_reward_share)
                            .sum::<f64>()
                            / m,
                        stake_lost: cell
                            .iter()
                            .map(|(_, r)| {
                                // Each slash takes slash_pct % of what is left.
                                let kept = 1.0 - f64::from(args.slash_pct) / 100.0;
                                let lost: f64 = r
                                    .byzantine_slashes
                                    .iter()
                                    .map(|&k| 1.0 - kept.powi(k as i32))
                                    .sum();
                                lost / b as f64
                            })
                            .sum::<f64>()
                            / m,
                        accepted: cell.iter().fold((0, 0), |(a, t), (_, r)| {
                            (a + r.byzantine_accepted, t + r.byzantine_deltas)
                        }),
                        honest_flagged: cell.iter().fold((0, 0), |(a, t), (_, r)| {
                            (a + r.honest_flagged, t + r.honest_deltas)
                        }),
                        honest_slashed: cell.iter().map(|(_, r)| r.honest_slashed).sum(),
                        kept_epochs: cell.iter().map(|(_, r)| r.kept_epochs).sum(),
                    });
                }
            }
        }
    }
    Table {
        nodes: args.nodes,
        seeds: args.seeds,
        spot_check_rate: args.spot_check_rate,
        baselines,
        rows,
    }
}

/// Plans, runs and tabulates `args` (module docs).
///
/// Errors: bad arguments, or a run that failed (its [`BenchError`] as text).
pub fn bench(args: &ByzantineArgs) -> Result<Table, String> {
    let (specs, attacks, _) = plan(args).map_err(|e| e.to_string())?;
    let threads = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let results = run_all(&specs, threads).map_err(|e| e.to_string())?;
    Ok(tabulate(args, &specs, &results, &attacks))
}

/// The table as text: the baselines, then one line per cell.
pub fn render(table: &Table) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{} nodes, {} seed(s) per cell, spot-check rate {}",
        table.nodes, table.seeds, table.spot_check_rate
    );
    let _ = writeln!(
        s,
        "\n{:<11} {:<26} {:>10} {:>10} {:>14} {:>5}",
        "MODEL", "AGGREGATOR", "LOSS0", "HONEST", "HONEST FLAGGED", "KEPT"
    );
    for b in &table.baselines {
        let _ = writeln!(
            s,
            "{:<11} {:<26} {:>10.4} {:>10.4} {:>8}/{:<5} {:>5}",
            b.model.name(),
            b.aggregator,
            b.initial_loss,
            b.final_loss,
            b.honest_flagged.0,
            b.honest_flagged.1,
            b.kept_epochs
        );
    }
    let _ = writeln!(
        s,
        "\n{:<11} {:<18} {:<26} {:>5} {:>9} {:>9} {:>7} {:>6} {:>9} {:>9} {:>4}",
        "MODEL",
        "ATTACK",
        "AGGREGATOR",
        "BYZ",
        "LOSS +%",
        "WORST +%",
        "REWARD",
        "STAKE",
        "ACCEPTED",
        "HON.FLAG",
        "KEPT"
    );
    for r in &table.rows {
        let _ = writeln!(
            s,
            "{:<11} {:<18} {:<26} {:>2}/{:<2} {:>9.2} {:>9.2} {:>6.1}% {:>5.1}% {:>4}/{:<4} {:>4}/{:<4} {:>4}",
            r.model.name(),
            r.attack,
            r.aggregator,
            r.byzantine,
            r.nodes,
            100.0 * r.loss_rel_mean,
            100.0 * r.loss_rel_max,
            100.0 * r.reward_share,
            100.0 * r.stake_lost,
            r.accepted.0,
            r.accepted.1,
            r.honest_flagged.0,
            r.honest_flagged.1,
            r.kept_epochs
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> ByzantineArgs {
        ByzantineArgs {
            models: vec![BenchModel::WineMlp],
            nodes: 6,
            epochs: Some(2),
            local_steps: Some(5),
            fractions: vec![0.34],
            attacks: vec!["sign-flip".into()],
            aggregators: vec!["default".into(), "krum:0.2".into()],
            seeds: 1,
            spot_check_rate: 0.0,
            slash_pct: 10,
            threads: Some(1),
            json: false,
        }
    }

    #[test]
    fn aggregator_choices_parse_and_refuse_bad_parameters() {
        assert_eq!(
            "default".parse::<AggregatorChoice>(),
            Ok(AggregatorChoice::DEFAULT)
        );
        assert_eq!(
            "policy:trimmed-mean:0.1".parse::<AggregatorChoice>(),
            Ok(AggregatorChoice::Policy {
                robust: RobustAggregator::TrimmedMean { trim: 0.1 }
            })
        );
        assert_eq!(
            "krum".parse::<AggregatorChoice>().map(|a| a.label()),
            Ok("krum".to_string())
        );
        assert!("trimmed-mean:0.7".parse::<AggregatorChoice>().is_err());
        assert!("krum:1.5".parse::<AggregatorChoice>().is_err());
        assert!("mean".parse::<AggregatorChoice>().is_err());
        assert!("median:3".parse::<AggregatorChoice>().is_err());
    }

    #[test]
    fn the_plan_has_an_honest_run_per_fraction_and_refuses_empty_cells() {
        let (specs, attacks, aggs) = plan(&args()).expect("a plan");
        assert_eq!((attacks.len(), aggs.len()), (1, 2));
        // Per aggregator and seed: all honest, the honest nodes alone, the attack.
        assert_eq!(specs.len(), 2 * 3);
        assert_eq!(specs.iter().filter(|s| s.attack.is_some()).count(), 2);
        assert!(specs.iter().all(|s| s.attack.is_none() || s.byzantine == 2));
        for bad in [vec![0.0], vec![1.0], vec![0.05]] {
            let a = ByzantineArgs {
                fractions: bad.clone(),
                ..args()
            };
            assert!(
                matches!(plan(&a), Err(ByzantineArgsError::Fraction(_))),
                "{bad:?}"
            );
        }
        let a = ByzantineArgs {
            attacks: vec!["sabotage".into()],
            ..args()
        };
        assert!(matches!(plan(&a), Err(ByzantineArgsError::Attack(_))));
        for bad in [
            ByzantineArgs {
                epochs: Some(0),
                ..args()
            },
            ByzantineArgs {
                slash_pct: 200,
                ..args()
            },
        ] {
            assert!(matches!(plan(&bad), Err(ByzantineArgsError::Size(_))));
        }
        // One row per attack however it is spelled.
        let a = ByzantineArgs {
            attacks: vec!["scale:-10".into(), "sign-flip".into(), "scale:-10.0".into()],
            ..args()
        };
        let (_, attacks, _) = plan(&a).expect("a plan");
        let names: Vec<&str> = attacks.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["scale:-10", "sign-flip"]);
    }

    #[test]
    fn byzantine_nodes_are_drawn_from_the_seed() {
        let a = byzantine_nodes(10, 3, 1);
        assert_eq!(a.len(), 3);
        assert_eq!(a, byzantine_nodes(10, 3, 1));
        assert!(a.iter().all(|&i| i < 10));
        assert!((1..20).any(|s| byzantine_nodes(10, 3, s) != a));
    }

    #[test]
    fn a_run_replays_and_the_honest_run_trains() {
        let (specs, attacks, _) = plan(&ByzantineArgs {
            aggregators: vec!["default".into()],
            ..args()
        })
        .expect("a plan");
        let results = run_all(&specs, 2).expect("runs");
        let again = run_all(&specs, 1).expect("runs");
        for (a, b) in results.iter().zip(&again) {
            assert_eq!(a.losses, b.losses, "the same spec gives the same run");
        }
        let honest = &results[0];
        assert!(
            honest.final_loss() < honest.losses[0],
            "{:?}",
            honest.losses
        );
        assert_eq!(honest.byzantine_deltas, 0);
        // The honest nodes alone upload 4 deltas per epoch; the attacked run 6.
        assert_eq!(results[1].honest_deltas, 2 * 4);
        assert_eq!(
            results[2].honest_deltas + results[2].byzantine_deltas,
            2 * 6
        );
        // Sign-flipped deltas weigh nothing and earn nothing.
        assert_eq!(results[2].byzantine_reward_share, 0.0);
        let table = tabulate(&args(), &specs, &results, &attacks);
        assert_eq!(table.rows.len(), 1);
        let row = &table.rows[0];
        let want = results[2].final_loss() / results[1].final_loss() - 1.0;
        assert!((row.loss_rel_mean - want).abs() < 1e-12);
        assert!(render(&table).contains("sign-flip"));
    }
}
