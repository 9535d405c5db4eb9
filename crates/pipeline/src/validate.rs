//! The delta validator (DESIGN §6, paper §5): signature, format, quality score and the
//! commit–reveal spot-check, for one delta of one epoch; and [`ValidatorPool`], the
//! supervised actor pool that runs it off the async runtime.
//!
//! Per epoch the caller builds one [`EpochContext`]: the checkpoint the epoch trained from,
//! its validation loss (the "loss before", computed **once per epoch**, DESIGN §6), the
//! running norm average and the last merged delta as of the epoch's start, and the revealed
//! epoch secret. Every delta is then judged against that same context by [`validate`], so
//! verdicts do not depend on the order in which deltas arrive or on how many workers run.
//!
//! The checks, cheapest first; the first failure rejects the delta:
//! 1. the signed statement (job, epoch, step, claimed loss, payload hash; Ed25519 by the
//!    node key, DESIGN §6) — [`Rejection::Signature`];
//! 2. the step: a node's local run of epoch `e` starts at global step `e × local_steps`
//!    — [`Rejection::WrongStep`];
//! 3. the format check against the job's delta layout ([`Trainer::delta_layout`]: the
//!    model's tensors, or for a LoRA job the adapter's PEFT-named factors; DESIGN §6) and
//!    the base checkpoint version — [`Rejection::Format`], [`Rejection::StaleBase`];
//! 4. quality (paper §5.1 with DESIGN §12): loss after applying the delta to the base on the
//!    validation shard, stability against the running norm average, convergence against
//!    the last merged delta, the composite. A LoRA delta is judged by the update it stands
//!    for, `ΔW = (alpha/r)·B·A` per adapted module (Hu et al. 2022, eq. 3; [`crate::lora`]):
//!    the loss after is that of `base + ΔW`, the norm is `‖ΔW‖₂`, the convergence compares
//!    `ΔW` with the last merged update, so the score sees what it sees for a full delta;
//! 5. when selected by the epoch secret (DESIGN §6: `SHA-256(secret ‖ delta hash)` as a
//!    big-endian u64 below `rate × 2⁶⁴`): the claimed loss against the pre-delta weights on
//!    the step's batch (within 5 % relative), then a deterministic re-run of the node's
//!    local steps ([`Trainer::local_delta`]) compared with the delta (for LoRA, the
//!    factors: the same `A` initialisation and batches replay them) —
//!    [`Rejection::SpotCheckLoss`], [`Rejection::SpotCheckReplay`]. These failures carry
//!    [`SlashEvidence`].

use hanzod_actors::ports::Counter;
use std::collections::VecDeque;
use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use serde::{Deserialize, Serialize};

use crate::lora::{add_adapter_update, LoraPlan, LORA_A_SUFFIX, LORA_B_SUFFIX};
use crate::score::{
    convergence_of_parts, is_spot_checked, l2_norm, loss_matches, selection_value, EpochSecret,
    NormTracker, QualityScore,
};
use hanzod_actors::ports::{DeltaReceipt, Metrics};
use hanzod_actors::types::NodeId;
use hanzod_protocol::hzdl::{
    payload_hash, verify_claimed_statement, DeltaDtype, DeltaKind, DeltaView, Statement,
};
use hanzod_protocol::identity::verifying_key;
use hanzod_train::{Layout, Trainer, Weights};

/// Tunables of the validator (DESIGN §6 defaults).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ValidationConfig {
    /// Fraction of deltas spot-checked (DESIGN §6: 0.1).
    pub spot_check_rate: f64,
    /// Relative tolerance of the claimed-loss comparison (paper §5.2: 0.05).
    pub loss_rel_tol: f64,
    /// Relative L2 distance `‖submitted − replayed‖ / ‖replayed‖` allowed between a delta and
    /// its deterministic re-run ([`replay_distance`]: for a LoRA adapter, of its `A` and of
    /// its `B` factors, the larger), on top of the rounding of the delta's dtype (f16: 2⁻¹¹,
    /// bf16: 2⁻⁸). Default 1e-2: a re-run on the same build is bit-identical, but between
    /// CPU families (gemm picks SSE/AVX2/NEON kernels at run time) low-order bits differ,
    /// and one ReLU flipped by such a difference moves a small model's delta by ~5e-4; a
    /// failed check slashes, so the bound sits well above that. Cheating by a percent or
    /// more (skipped steps, scaling, sign flips: distance ≥ 0.5) is still caught.
    pub replay_rel_tol: f64,
    /// Whether selected deltas are re-run (the recipes hanzod ships are deterministic).
    pub replay: bool,
}

impl Default for ValidationConfig {
    fn default() -> Self {
        ValidationConfig {
            spot_check_rate: crate::score::DEFAULT_SPOT_CHECK_RATE,
            loss_rel_tol: crate::score::DEFAULT_LOSS_REL_TOL,
            replay_rel_tol: 1e-2,
            replay: true,
        }
    }
}

/// Everything the deltas of one epoch are judged against; built once per epoch.
#[derive(Debug)]
pub struct EpochContext {
    /// The job.
    pub job: u64,
    /// The epoch, 0-based.
    pub epoch: u32,
    /// The job's training math (model, recipe and data: what the node ran and the
    /// spot-check replays).
    pub trainer: Trainer,
    /// The checkpoint the epoch trained from.
    pub base: Arc<Weights>,
    /// Its version: the number of checkpoints published before this epoch (= `epoch`).
    pub base_version: u64,
    /// Validation loss of `base` (the "loss before" of paper §5.1, once per epoch).
    pub loss_before: f64,
    /// The lowest validation loss of any checkpoint of the job so far (its starting
    /// checkpoint's and every published one's; `None`: `loss_before`). The merge is
    /// checked against it so the checkpoint cannot drift upwards epoch after epoch
    /// ([`crate::epoch::DRIFT_TOLERANCE`]).
    pub best_loss: Option<f64>,
    /// Accepted-norm average as of the epoch's start.
    pub norms: NormTracker,
    /// The update merged at the end of the previous epoch, flattened in the model's (full)
    /// layout, [`Trainer::layout`]; for a LoRA job the merged `ΔW` on the adapted modules
    /// and zero elsewhere (`None` in epoch 0, or after a kept checkpoint).
    pub last_merged: Option<Arc<Vec<f32>>>,
    /// The revealed epoch secret (DESIGN §6).
    pub secret: EpochSecret,
    /// Tunables.
    pub config: ValidationConfig,
}

impl EpochContext {
    /// The global step at which every node's local run of this epoch starts:
    /// `epoch × local_steps`.
    pub fn first_step(&self) -> u64 {
        u64::from(self.epoch) * u64::from(self.trainer.local_steps())
    }
}

/// A stored delta and its receipt, as handed to [`validate`].
#[derive(Debug, Clone)]
pub struct Submission {
    /// The receipt the core recorded (node, step, claimed loss, signature, hash).
    pub receipt: DeltaReceipt,
    /// The HZDL payload, as stored.
    pub payload: Arc<[u8]>,
}

/// What a spot-check found (DESIGN §6).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpotCheck {
    /// The selection value `x` (first 8 bytes of `SHA-256(secret ‖ delta hash)`, big
    /// endian), so anyone can recompute the choice.
    pub selection_value: u64,
    /// The node's claimed loss.
    pub claimed_loss: f64,
    /// The loss the validator measured: pre-delta weights on the step's batch.
    pub measured_loss: f64,
    /// Relative L2 distance between the delta and its re-run ([`replay_distance`]), when
    /// re-run.
    pub replay_distance: Option<f64>,
    /// Whether every comparison passed.
    pub passed: bool,
}

/// Why a delta was rejected.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
pub enum Rejection {
    /// The payload is missing from, or corrupt in, the blob store.
    #[error("payload unavailable: {0}")]
    Unavailable(String),
    /// The payload does not hash to the receipt's delta hash.
    #[error("payload hash {found} differs from the receipt's {expected}")]
    HashMismatch {
        /// The receipt's hash (hex).
        expected: String,
        /// The payload's (hex).
        found: String,
    },
    /// The signed statement does not verify under the node key, or covers another job,
    /// epoch, step or loss.
    #[error("signature: {0}")]
    Signature(String),
    /// The statement's step is not where the epoch's local run starts.
    #[error("step {got}, the epoch's local run starts at {expected}")]
    WrongStep {
        /// `epoch × local_steps`.
        expected: u64,
        /// The statement's step.
        got: u64,
    },
    /// The payload fails the format check against the job's model (DESIGN §6).
    #[error("format: {0}")]
    Format(String),
    /// The delta was computed against another checkpoint version.
    #[error("delta is against checkpoint version {got}, the epoch trained from {expected}")]
    StaleBase {
        /// The epoch's base version.
        expected: u64,
        /// The delta header's.
        got: u64,
    },
    /// The base plus the delta is not a usable model (non-finite loss).
    #[error("quality: {0}")]
    Quality(String),
    /// Spot-check: the claimed loss is not the pre-delta loss on the step's batch.
    #[error("spot-check: claimed loss {claimed} but measured {measured} (tolerance {tol})")]
    SpotCheckLoss {
        /// Claimed.
        claimed: f64,
        /// Measured.
        measured: f64,
        /// Relative tolerance.
        tol: f64,
    },
    /// Spot-check: re-running the node's steps gives another delta.
    #[error("spot-check: re-run differs by {distance:.3e} (relative L2, tolerance {tol:.1e})")]
    SpotCheckReplay {
        /// Relative L2 distance.
        distance: f64,
        /// Tolerance.
        tol: f64,
    },
    /// The validator worker crashed twice on this delta.
    #[error("validator crashed while scoring this delta")]
    ValidatorCrashed,
    /// The node was proved to have sent a wrong partial sum in the epoch's ring round
    /// (`crate::ring_audit`): its delta stays out of the merge and the rewards, and it is
    /// slashed with the round's tamper evidence.
    #[error("sent a wrong partial sum in ring round {ring_version}")]
    RingTamper {
        /// The round's ring version.
        ring_version: u64,
    },
    /// The node's check or scoring sketch in the epoch's ring round was not the sketch of
    /// its committed delta (held by the orchestrator: spot-checked or audited), which made
    /// the round fall back: its delta stays out of the merge and the rewards.
    #[error("its sketch in ring round {ring_version} is not the sketch of its committed delta")]
    RingSketch {
        /// The round's ring version.
        ring_version: u64,
    },
    /// The node withheld its check sketch, or its delta when audited, in the epoch's ring
    /// round, which made the round fall back: its delta stays out of the merge and the
    /// rewards (it is not slashed: a crash looks the same).
    #[error("withheld its check sketch or audited delta in ring round {ring_version}")]
    RingWithheld {
        /// The round's ring version.
        ring_version: u64,
    },
    /// The delta is another node's, the last merged update, or no update
    /// ([`crate::copies`]): no weight, no reward, not slashed (no recomputable proof of who
    /// copied).
    #[error("copy: {0}")]
    Copy(crate::copies::Copying),
}

impl Rejection {
    /// A short stable label for metrics and reports.
    pub fn label(&self) -> &'static str {
        match self {
            Rejection::Unavailable(_) => "unavailable",
            Rejection::HashMismatch { .. } => "hash_mismatch",
            Rejection::Signature(_) => "signature",
            Rejection::WrongStep { .. } => "wrong_step",
            Rejection::Format(_) => "format",
            Rejection::StaleBase { .. } => "stale_base",
            Rejection::Quality(_) => "quality",
            Rejection::SpotCheckLoss { .. } => "spot_check_loss",
            Rejection::SpotCheckReplay { .. } => "spot_check_replay",
            Rejection::RingTamper { .. } => "ring_tamper",
            Rejection::RingSketch { .. } => "ring_sketch",
            Rejection::RingWithheld { .. } => "ring_withheld",
            Rejection::Copy(crate::copies::Copying::Duplicate { .. }) => "duplicate",
            Rejection::Copy(crate::copies::Copying::NearCopy { .. }) => "near_copy",
            Rejection::Copy(crate::copies::Copying::CopiesLastMerged { .. }) => {
                "copies_last_merged"
            }
            Rejection::Copy(crate::copies::Copying::NoUpdate) => "no_update",
            Rejection::ValidatorCrashed => "validator_crashed",
        }
    }

    /// Whether this rejection opens slashing (a failed spot-check, DESIGN §6).
    pub fn slashable(&self) -> bool {
        matches!(
            self,
            Rejection::SpotCheckLoss { .. } | Rejection::SpotCheckReplay { .. }
        )
    }
}

/// The evidence a failed spot-check leaves for slashing (paper §8, DESIGN §6): what the node
/// signed and what the validator measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SlashEvidence {
    /// The node (hex key).
    pub node: String,
    /// SHA-256 of the payload (hex).
    pub delta_hash: String,
    /// Job, epoch, step of the signed statement.
    pub job: u64,
    /// Epoch.
    pub epoch: u32,
    /// Step.
    pub step: u64,
    /// The claimed loss.
    pub claimed_loss: f64,
    /// The measured loss.
    pub measured_loss: f64,
    /// The re-run distance, when the replay failed.
    pub replay_distance: Option<f64>,
    /// The node's Ed25519 signature over the statement (hex, 64 bytes).
    pub signature: String,
}

impl SlashEvidence {
    /// The evidence as recorded with a slash (`GYMToken.slash(node, pct, reporter,
    /// evidence)`, DESIGN §8): canonical JSON with a domain tag holding the node's signed
    /// statement (job, epoch, step, claimed loss, delta hash) and its Ed25519 signature,
    /// which prove what the node claimed, and what the orchestrator measured (the loss, and
    /// the re-run distance when the replay failed), which anyone can recompute from the
    /// delta named by its hash. The ledger keys a slash by the SHA-256 of these bytes; the
    /// measured values are those of the epoch's staged report (DESIGN §7), which a resumed
    /// publication adopts rather than re-validates, so a retry after a restart sends the
    /// same bytes and slashes once.
    pub fn canonical_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "domain": std::str::from_utf8(hanzod_actors::domain::SLASH_EVIDENCE).expect("ASCII"),
            "node": self.node,
            "job": self.job,
            "epoch": self.epoch,
            "step": self.step,
            "claimed_loss": self.claimed_loss,
            "measured_loss": self.measured_loss,
            "replay_distance": self.replay_distance,
            "delta_hash": self.delta_hash,
            "signature": self.signature,
        }))
        .unwrap_or_default()
    }
}

/// The judgement of one delta.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// The node.
    pub node: NodeId,
    /// The delta hash.
    pub delta_hash: [u8; 32],
    /// Validation loss of the epoch's base (the context's loss before).
    pub loss_before: f64,
    /// L2 norm of the delta (all tensors flattened; for a LoRA delta of its update `ΔW`
    /// over every adapted module, not of the factors), when it was read.
    pub norm: Option<f64>,
    /// Validation loss of base + delta, when measured.
    pub loss_after: Option<f64>,
    /// The quality score, when measured.
    pub score: Option<QualityScore>,
    /// The spot-check, when the delta was selected and got that far.
    pub spot_check: Option<SpotCheck>,
    /// `Ok(delta)` when accepted: the delta as uploaded, decoded to f32 and flattened in
    /// the job's delta layout ([`Trainer::delta_layout`]): the model's tensors for a
    /// full-parameter job; for a LoRA job the adapter's factors `A`, `B` (PEFT names,
    /// layout order), not `ΔW`: the merge needs each node's factors
    /// ([`crate::lora::merge_lora`]), and they are `r·(in + out)` floats per module rather
    /// than `out·in`.
    pub outcome: Result<Arc<Vec<f32>>, Rejection>,
}

impl Verdict {
    /// A rejection before anything was measured.
    pub fn rejected(receipt: &DeltaReceipt, loss_before: f64, why: Rejection) -> Verdict {
        Verdict {
            node: receipt.node,
            delta_hash: receipt.delta_hash,
            loss_before,
            norm: None,
            loss_after: None,
            score: None,
            spot_check: None,
            outcome: Err(why),
        }
    }

    /// Suspected adversarial (paper §6: the robust merge replaces the weighted mean when
    /// more than 30 % of nodes are suspected adversarial): rejected; or a norm that deviates
    /// from the running average by 200 % or more (stability `≤ e⁻⁴`,
    /// [`SUSPECT_STABILITY`]); or a validation loss more than [`SUSPECT_LOSS_JUMP`] (100 %)
    /// above the base's. A smaller rise is not a criterion: one node's delta, trained on its
    /// own batches, raised the loss by up to 22 % on honest runs of the wine MLP
    /// (`hanzod bench byzantine`: 17 of 180 honest deltas were suspect under the former
    /// 10 % rule, and the robust merge took over with no attack at all).
    /// A delta against the epoch's direction is given no weight by its agreement instead
    /// ([`crate::epoch::agreements`]), and the merged checkpoint's loss is still checked.
    ///
    /// Rejections that are the orchestrator's fault ([`Rejection::Unavailable`],
    /// [`Rejection::ValidatorCrashed`]) say nothing about the node and are not suspect;
    /// nor is a copy ([`Rejection::Copy`]: no weight and no reward already).
    pub fn suspect(&self) -> bool {
        match (&self.outcome, &self.score, self.loss_after) {
            (Err(Rejection::Unavailable(_) | Rejection::ValidatorCrashed), ..) => false,
            // A copy is handled (rejected, its group merged once: `crate::epoch`); one
            // copier must not switch a small epoch to the robust aggregator.
            (Err(Rejection::Copy(_)), ..) => false,
            (Ok(_), ..) => self.measured_suspect(),
            _ => true,
        }
    }

    /// Whether the delta's measurements alone make it suspect, whatever its outcome: a
    /// norm outlier (stability `≤ e⁻⁴`) or a validation loss more than
    /// [`SUSPECT_LOSS_JUMP`] above the base's; true when it was not measured. For an
    /// accepted delta this is [`Verdict::suspect`]; it also judges a group of copies merged
    /// once (`crate::epoch::copy_groups`).
    pub fn measured_suspect(&self) -> bool {
        match (&self.score, self.loss_after) {
            (Some(s), Some(after)) => {
                s.stability <= SUSPECT_STABILITY
                    || after > self.loss_before * (1.0 + SUSPECT_LOSS_JUMP)
                    || after.is_nan()
            }
            _ => true,
        }
    }

    /// Scores stability again against `norms` (and recomputes the composite). Used for the
    /// first epoch of a job, whose running average is seeded from the epoch's own norms
    /// (see [`seed_norms`]).
    pub fn rescore(&mut self, norms: &NormTracker) {
        let (Some(norm), Some(score)) = (self.norm, self.score) else {
            return;
        };
        let rescored = norms
            .stability(norm)
            .and_then(|s| QualityScore::new(score.loss_improvement, s, score.convergence));
        if let Ok(q) = rescored {
            self.score = Some(q);
        }
    }

    /// The slashing evidence, when the delta failed a spot-check.
    pub fn evidence(&self, receipt: &DeltaReceipt) -> Option<SlashEvidence> {
        let Err(why) = &self.outcome else { return None };
        let check = self.spot_check.as_ref()?;
        why.slashable().then(|| SlashEvidence {
            node: hex::encode(receipt.node.0),
            delta_hash: hex::encode(receipt.delta_hash),
            job: receipt.job.0,
            epoch: receipt.epoch,
            step: receipt.step,
            claimed_loss: receipt.claimed_loss,
            measured_loss: check.measured_loss,
            replay_distance: check.replay_distance,
            signature: hex::encode(&receipt.signature),
        })
    }
}

/// Stability at or below which a delta is suspect: `e⁻⁴`, a norm at least three times the
/// running average. (Honest deltas of one epoch were measured up to 2.5× the median norm on
/// the built-in model; a zero delta scores `e⁻²` and is not suspect by its norm alone.)
pub const SUSPECT_STABILITY: f64 = 0.018_315_638_888_734_18;

/// Relative rise of the validation loss above which a delta is suspect (100 %: the delta
/// alone doubles the loss). Honest deltas of the wine MLP raised it by at most 22 %
/// (`hanzod bench byzantine`, 10 nodes, 3 seeds).
pub const SUSPECT_LOSS_JUMP: f64 = 1.0;

/// The running norm average for an epoch with no accepted history (a job's first epoch):
/// the median of the norms of the deltas that passed every check, `None` when there are
/// none.
///
/// DESIGN §12 corrects the paper's listing (average initialised at 0, a division by zero)
/// by seeding it with the first accepted norm; with deltas judged concurrently "first" is
/// arrival order, which a node can race for. The median of the epoch's norms is the
/// order-free, robust version of the same seed: one outsized (e.g. scaled) delta cannot
/// move it.
pub fn seed_norms(verdicts: &[Verdict]) -> Option<NormTracker> {
    let mut norms: Vec<f64> = verdicts
        .iter()
        .filter(|v| v.outcome.is_ok())
        .filter_map(|v| v.norm)
        .filter(|n| *n > 0.0)
        .collect();
    if norms.is_empty() {
        return None;
    }
    norms.sort_by(f64::total_cmp);
    let mid = norms.len() / 2;
    let median = if norms.len() % 2 == 1 {
        norms[mid]
    } else {
        (norms[mid - 1] + norms[mid]) / 2.0
    };
    NormTracker::from_average(Some(median)).ok()
}

/// Judges one delta against its epoch (module docs give the order of the checks). Pure and
/// CPU-bound (a few burn forward passes; a re-run of the node's steps when spot-checked):
/// call it off the async runtime ([`ValidatorPool`] does).
pub fn validate(ctx: &EpochContext, sub: &Submission) -> Verdict {
    let r = &sub.receipt;
    let reject = |why| Verdict::rejected(r, ctx.loss_before, why);
    let hash = payload_hash(&sub.payload);
    if hash != r.delta_hash {
        return reject(Rejection::HashMismatch {
            expected: hex::encode(r.delta_hash),
            found: hex::encode(hash),
        });
    }
    // 1. The signed statement: under the node key, for this job and epoch.
    let claimed = Statement {
        job: r.job.0,
        epoch: r.epoch,
        step: r.step,
        claimed_loss: r.claimed_loss,
    };
    let expected = Statement {
        job: ctx.job,
        epoch: ctx.epoch,
        ..claimed
    };
    let signed = verifying_key(&r.node)
        .map_err(|e| Rejection::Signature(format!("node key: {e}")))
        .and_then(|key| {
            verify_claimed_statement(&key, &expected, &claimed, &hash, &r.signature)
                .map_err(|e| Rejection::Signature(e.to_string()))
        });
    if let Err(why) = signed {
        return reject(why);
    }
    // 2. The step.
    if r.step != ctx.first_step() {
        return reject(Rejection::WrongStep {
            expected: ctx.first_step(),
            got: r.step,
        });
    }
    // 3. Format (names, shapes, dtype, kind, offsets, NaN/Inf) and base version.
    let view = match DeltaView::parse(&sub.payload) {
        Ok(v) => v,
        Err(e) => return reject(Rejection::Format(e.to_string())),
    };
    if view.header.base_version != ctx.base_version {
        return reject(Rejection::StaleBase {
            expected: ctx.base_version,
            got: view.header.base_version,
        });
    }
    let delta = match Weights::from_delta_view(&view, ctx.trainer.delta_layout()) {
        Ok(d) => d,
        Err(e) => return reject(Rejection::Format(e.to_string())),
    };
    let plan = match LoraPlan::of_trainer(&ctx.trainer) {
        Ok(p) => p,
        Err(e) => return reject(Rejection::Format(format!("the job's LoRA adapter: {e}"))),
    };
    let dtype = view.header.dtype;
    drop(view);
    // 4. Quality.
    let selected = is_spot_checked(&ctx.secret, &r.delta_hash, ctx.config.spot_check_rate);
    let (norm, loss_after, score) = match measure(ctx, &delta, plan.as_ref()) {
        Ok(q) => q,
        Err(why) => {
            // A delta that breaks the model is still spot-checked when selected, so a
            // cheater whose delta is unusable is caught (and slashable), not just refused.
            let mut verdict = reject(why);
            if selected {
                let (check, failure) = spot_check(ctx, r, &delta.data, dtype);
                verdict.spot_check = Some(check);
                if let Some(f) = failure.filter(Rejection::slashable) {
                    verdict.outcome = Err(f);
                }
            }
            return verdict;
        }
    };
    let mut verdict = Verdict {
        node: r.node,
        delta_hash: r.delta_hash,
        loss_before: ctx.loss_before,
        norm: Some(norm),
        loss_after: Some(loss_after),
        score: Some(score),
        spot_check: None,
        outcome: Ok(Arc::new(Vec::new())),
    };
    // 5. Spot-check, when selected.
    if selected {
        let (check, failure) = spot_check(ctx, r, &delta.data, dtype);
        verdict.spot_check = Some(check);
        if let Some(why) = failure {
            verdict.outcome = Err(why);
            return verdict;
        }
    }
    verdict.outcome = Ok(Arc::new(delta.data));
    verdict
}

/// Norm, loss after and the composite score of `delta` (paper §5.1, DESIGN §12), a delta
/// in the job's delta layout. For a full delta: `‖delta‖₂`, the loss of `base + delta`,
/// `cos(delta, last merged)`. For a LoRA delta (`plan`) the same of its update
/// `ΔW = (alpha/r)·B·A` ([`add_adapter_update`], streamed module by module): `‖ΔW‖₂`, the
/// loss of `base + ΔW`, `cos(ΔW, last merged)` with the last merged update in the full
/// layout.
fn measure(
    ctx: &EpochContext,
    delta: &Weights,
    plan: Option<&LoraPlan>,
) -> Result<(f64, f64, QualityScore), Rejection> {
    let quality = |e: &dyn std::fmt::Display| Rejection::Quality(e.to_string());
    let last = ctx.last_merged.as_deref().map(|v| &v[..]);
    let mut after = (*ctx.base).clone();
    let (norm, convergence) = match plan {
        None => {
            let norm = l2_norm(&delta.data).map_err(|e| quality(&e))?;
            after
                .add_scaled(&delta.data, 1.0)
                .map_err(|e| quality(&e))?;
            let c = crate::score::convergence(&delta.data, last).map_err(|e| quality(&e))?;
            (norm, c)
        }
        Some(plan) => {
            let stats =
                add_adapter_update(&mut after, plan, delta, 1.0, last).map_err(|e| quality(&e))?;
            let c = match (last, stats.dot) {
                (Some(last), Some(dot)) => {
                    let last_norm = l2_norm(last).map_err(|e| quality(&e))?;
                    Some(
                        convergence_of_parts(dot, stats.norm, last_norm)
                            .map_err(|e| quality(&e))?,
                    )
                }
                _ => None,
            };
            (stats.norm, c)
        }
    };
    let loss_after = ctx
        .trainer
        .validation_loss(&after)
        .map_err(|e| quality(&e))?;
    let score = QualityScore::evaluate(ctx.loss_before, loss_after, norm, &ctx.norms, convergence)
        .map_err(|e| quality(&e))?;
    Ok((norm, loss_after, score))
}

/// The spot-check of DESIGN §6: the claimed loss of the pre-delta weights on the step's
/// batch (for LoRA too: the node's run starts from a fresh adapter, `B = 0`, so the base's
/// loss is the claim), then (when configured) a re-run of the node's local steps,
/// [`Trainer::local_delta`], compared with `delta` in the delta layout (for LoRA the
/// factors: the same `A` initialisation and batches give the same adapter).
fn spot_check(
    ctx: &EpochContext,
    r: &DeltaReceipt,
    delta: &[f32],
    dtype: DeltaDtype,
) -> (SpotCheck, Option<Rejection>) {
    let mut check = SpotCheck {
        selection_value: selection_value(&ctx.secret, &r.delta_hash),
        claimed_loss: r.claimed_loss,
        measured_loss: f64::NAN,
        replay_distance: None,
        passed: false,
    };
    let measured = ctx.trainer.batch_loss(&ctx.base, &r.node.0, r.step);
    let measured = match measured {
        Ok(m) => m,
        Err(e) => return (check, Some(Rejection::Quality(e.to_string()))),
    };
    check.measured_loss = measured;
    let tol = ctx.config.loss_rel_tol;
    if !loss_matches(r.claimed_loss, measured, tol) {
        return (
            check,
            Some(Rejection::SpotCheckLoss {
                claimed: r.claimed_loss,
                measured,
                tol,
            }),
        );
    }
    if ctx.config.replay {
        let rerun = ctx.trainer.local_delta(&ctx.base, &r.node.0, r.step);
        let replayed = match rerun {
            Ok(run) => run.delta.data,
            Err(e) => return (check, Some(Rejection::Quality(e.to_string()))),
        };
        let start = ctx.trainer.init_adapter(r.step);
        let distance = replay_distance(
            &ctx.trainer.delta_layout(),
            delta,
            &replayed,
            start.as_ref().map(|w| &w.data[..]),
        );
        check.replay_distance = Some(distance);
        let tol = ctx.config.replay_rel_tol + dtype_rounding(dtype);
        // NaN distances fail too.
        if distance.is_nan() || distance > tol {
            return (check, Some(Rejection::SpotCheckReplay { distance, tol }));
        }
    }
    check.passed = true;
    (check, None)
}

/// Unit roundoff of a delta dtype (f32 0: the comparison is then exact up to
/// `replay_rel_tol`).
fn dtype_rounding(dtype: DeltaDtype) -> f64 {
    match dtype {
        DeltaDtype::F32 => 0.0,
        DeltaDtype::F16 => 2f64.powi(-11),
        DeltaDtype::Bf16 => 2f64.powi(-8),
    }
}

/// The spot-check's re-run distance of `delta` from its re-run `replayed`, both flattened in
/// `layout` (the job's delta layout): [`relative_distance`] over the whole delta for a
/// full-parameter layout; for a LoRA adapter layout ([`Layout::delta_kind`] LoRA) the
/// larger of `‖delta − replayed‖ / ‖replayed − start‖` over its `A` factors
/// (`*.lora_A.weight`, all together) and over its `B` factors (`*.lora_B.weight`; any
/// other tensor a third group), `start` being the adapter every node of the epoch started
/// from (`Trainer::init_adapter`; `B = 0`; zeros when `None`). Per factor and against the
/// trained change, because the run starts from `B = 0` and a shared, public `A`: after a
/// local run `‖A‖` dwarfs `‖B‖` (qwen3-tiny, r = 4, 2 steps: 3.3 against 0.26) and mostly
/// is `A₀`, so one distance over both factors (or `A` against its own norm) would dilute
/// a tampered factor (`B × 0.9`, i.e. `ΔW × 0.9`, came to 0.008 over both, under the
/// default tolerance; per factor it is 0.1).
///
/// ∞ for different lengths or a buffer that does not fit `layout`; NaN inputs give NaN
/// (failing every `≤` comparison).
pub fn replay_distance(
    layout: &Layout,
    delta: &[f32],
    replayed: &[f32],
    start: Option<&[f32]>,
) -> f64 {
    if layout.delta_kind() != DeltaKind::Lora {
        return relative_distance(delta, replayed);
    }
    if delta.len() != replayed.len()
        || delta.len() != layout.len()
        || start.is_some_and(|s| s.len() != layout.len())
    {
        return f64::INFINITY;
    }
    // (‖a − b‖², ‖b − start‖²) of the A factors, the B factors, anything else.
    let mut groups = [(0.0f64, 0.0f64, false); 3];
    for e in layout.entries() {
        let g = if e.name.ends_with(LORA_A_SUFFIX) {
            0
        } else if e.name.ends_with(LORA_B_SUFFIX) {
            1
        } else {
            2
        };
        let range = e.offset..e.offset + e.len;
        for (k, (&x, &y)) in delta[range.clone()]
            .iter()
            .zip(&replayed[range.clone()])
            .enumerate()
        {
            let d = f64::from(x) - f64::from(y);
            let moved = f64::from(y) - start.map_or(0.0, |s| f64::from(s[range.start + k]));
            groups[g].0 += d * d;
            groups[g].1 += moved * moved;
        }
        groups[g].2 = true;
    }
    groups
        .iter()
        .filter(|g| g.2)
        .map(|&(diff, norm, _)| diff.sqrt() / norm.sqrt().max(1e-12))
        // NaN wins: `f64::max` would drop it.
        .fold(0.0f64, |m, d| {
            if d.is_nan() || m.is_nan() {
                f64::NAN
            } else {
                m.max(d)
            }
        })
}

/// `‖a − b‖₂ / max(‖b‖₂, 1e-12)`, accumulated in f64 (∞ for different lengths, NaN
/// inputs give NaN, which fails every `≤` comparison).
pub fn relative_distance(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        let d = f64::from(x) - f64::from(y);
        diff += d * d;
        norm += f64::from(y) * f64::from(y);
    }
    diff.sqrt() / norm.sqrt().max(1e-12)
}

// ---------------------------------------------------------------------------------------
// The supervised pool
// ---------------------------------------------------------------------------------------

/// A validation request travelling through the pool.
struct Task {
    ctx: Arc<EpochContext>,
    sub: Submission,
    reply: RpcReplyPort<Verdict>,
}

/// Messages of the pool's supervisor.
enum PoolMsg {
    /// Validate a delta; the verdict goes to `reply`.
    Validate {
        /// The epoch.
        ctx: Arc<EpochContext>,
        /// The delta.
        sub: Submission,
        /// Where the verdict goes.
        reply: RpcReplyPort<Verdict>,
    },
    /// A worker finished its task and is idle again.
    Idle(usize),
    /// Test hook: makes worker `usize` fail (as a panicking validation would).
    #[doc(hidden)]
    CrashWorker(usize),
}

/// Messages of a worker.
enum WorkerMsg {
    /// Run one validation.
    Run(Box<Task>),
    /// Fail now (test hook for supervision).
    Crash,
}

/// The pool's supervisor: owns the workers, queues tasks, restarts failed workers.
struct PoolSupervisor;

struct PoolState {
    workers: Vec<(ActorRef<WorkerMsg>, bool)>,
    queue: VecDeque<Task>,
    metrics: Arc<dyn Metrics>,
}

struct Worker;

struct WorkerArgs {
    id: usize,
    supervisor: ActorRef<PoolMsg>,
}

impl Actor for Worker {
    type Msg = WorkerMsg;
    type State = WorkerArgs;
    type Arguments = WorkerArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<WorkerMsg>,
        args: WorkerArgs,
    ) -> Result<WorkerArgs, ActorProcessingErr> {
        Ok(args)
    }

    async fn handle(
        &self,
        _myself: ActorRef<WorkerMsg>,
        msg: WorkerMsg,
        state: &mut WorkerArgs,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            WorkerMsg::Crash => Err("validator worker crash injected".into()),
            WorkerMsg::Run(task) => {
                let Task { ctx, sub, reply } = *task;
                // CPU-bound: off the runtime's worker threads, so heartbeats never wait.
                let verdict = tokio::task::spawn_blocking(move || validate(&ctx, &sub)).await;
                match verdict {
                    Ok(v) => {
                        let _ = reply.send(v);
                        let _ = state.supervisor.cast(PoolMsg::Idle(state.id));
                        Ok(())
                    }
                    // A panic in the validation: fail the worker (the supervisor restarts
                    // it); the dropped reply tells the caller, who retries once.
                    Err(e) => Err(format!("validation panicked: {e}").into()),
                }
            }
        }
    }
}

async fn spawn_worker(
    id: usize,
    supervisor: &ActorRef<PoolMsg>,
) -> Result<ActorRef<WorkerMsg>, ActorProcessingErr> {
    let (worker, _) = Actor::spawn_linked(
        None,
        Worker,
        WorkerArgs {
            id,
            supervisor: supervisor.clone(),
        },
        supervisor.get_cell(),
    )
    .await?;
    Ok(worker)
}

impl PoolState {
    fn dispatch(&mut self) {
        while let Some(idle) = self.workers.iter().position(|(_, busy)| !busy) {
            let Some(task) = self.queue.pop_front() else {
                return;
            };
            let (worker, busy) = &mut self.workers[idle];
            match worker.cast(WorkerMsg::Run(Box::new(task))) {
                Ok(()) => *busy = true,
                // The worker is gone; its failure restarts it. The task's reply port was
                // moved into the failed message and is dropped: the caller retries.
                Err(_) => *busy = true,
            }
        }
    }
}

impl Actor for PoolSupervisor {
    type Msg = PoolMsg;
    type State = PoolState;
    type Arguments = (usize, Arc<dyn Metrics>);

    async fn pre_start(
        &self,
        myself: ActorRef<PoolMsg>,
        (workers, metrics): (usize, Arc<dyn Metrics>),
    ) -> Result<PoolState, ActorProcessingErr> {
        let mut list = Vec::with_capacity(workers);
        for id in 0..workers.max(1) {
            list.push((spawn_worker(id, &myself).await?, false));
        }
        Ok(PoolState {
            workers: list,
            queue: VecDeque::new(),
            metrics,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<PoolMsg>,
        msg: PoolMsg,
        state: &mut PoolState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            PoolMsg::Validate { ctx, sub, reply } => {
                state.queue.push_back(Task { ctx, sub, reply });
            }
            PoolMsg::Idle(id) => {
                if let Some((_, busy)) = state.workers.get_mut(id) {
                    *busy = false;
                }
            }
            PoolMsg::CrashWorker(id) => {
                if let Some((w, _)) = state.workers.get(id) {
                    let _ = w.cast(WorkerMsg::Crash);
                }
            }
        }
        state.dispatch();
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<PoolMsg>,
        event: SupervisionEvent,
        state: &mut PoolState,
    ) -> Result<(), ActorProcessingErr> {
        let dead = match &event {
            SupervisionEvent::ActorFailed(cell, _)
            | SupervisionEvent::ActorTerminated(cell, ..) => cell.get_id(),
            _ => return Ok(()),
        };
        let Some(id) = state.workers.iter().position(|(w, _)| w.get_id() == dead) else {
            return Ok(());
        };
        if let SupervisionEvent::ActorFailed(_, why) = &event {
            tracing::warn!(worker = id, error = %why, "validator worker failed; restarting it");
        }
        state.metrics.incr(Counter::ActorRestarts, "validator", 1);
        state.workers[id] = (spawn_worker(id, &myself).await?, false);
        state.dispatch();
        Ok(())
    }
}

/// A supervised pool of validator workers (ractor actors). Each worker runs one
/// [`validate`] at a time on tokio's blocking thread pool; a worker that fails (a panic in
/// the validation) is restarted by the pool's supervisor, counted as
/// `actor_restarts{validator}`, and the delta is tried once more before it is rejected
/// with [`Rejection::ValidatorCrashed`].
#[derive(Debug, Clone)]
pub struct ValidatorPool {
    supervisor: ActorRef<PoolMsg>,
}

impl ValidatorPool {
    /// Starts `workers` workers (at least 1) under a fresh supervisor.
    pub async fn start(
        workers: usize,
        metrics: Arc<dyn Metrics>,
    ) -> Result<ValidatorPool, ractor::SpawnErr> {
        let (supervisor, _) = Actor::spawn(None, PoolSupervisor, (workers, metrics)).await?;
        Ok(ValidatorPool { supervisor })
    }

    /// Judges `sub` against `ctx` on a worker.
    pub async fn validate(&self, ctx: Arc<EpochContext>, sub: Submission) -> Verdict {
        for _attempt in 0..2 {
            let call = self.supervisor.call(
                |reply| PoolMsg::Validate {
                    ctx: ctx.clone(),
                    sub: sub.clone(),
                    reply,
                },
                None,
            );
            if let Ok(ractor::rpc::CallResult::Success(v)) = call.await {
                return v;
            }
        }
        Verdict::rejected(&sub.receipt, ctx.loss_before, Rejection::ValidatorCrashed)
    }

    /// Test hook: fails worker `id` as a panicking validation would.
    #[doc(hidden)]
    pub fn crash_worker(&self, id: usize) {
        let _ = self.supervisor.cast(PoolMsg::CrashWorker(id));
    }

    /// Stops the supervisor and its workers.
    pub fn stop(&self) {
        self.supervisor.stop(None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hanzod_actors::types::JobId;
    use proptest::prelude::*;

    fn verdict(norm: f64, ok: bool) -> Verdict {
        let receipt = DeltaReceipt {
            job: JobId(1),
            node: NodeId([1; 32]),
            epoch: 0,
            step: 0,
            delta_hash: [0; 32],
            claimed_loss: 1.0,
            signature: Vec::new(),
        };
        let mut v = Verdict::rejected(&receipt, 1.0, Rejection::Format("test".into()));
        v.norm = Some(norm);
        v.loss_after = Some(0.9);
        v.score = Some(QualityScore::new(0.1, 1.0, None).unwrap());
        if ok {
            v.outcome = Ok(Arc::new(Vec::new()));
        }
        v
    }

    proptest! {
        #[test]
        fn relative_distance_is_zero_to_itself_and_two_to_its_negation(
            v in proptest::collection::vec(-1e3f32..1e3, 1..64)
        ) {
            prop_assume!(v.iter().any(|x| *x != 0.0));
            prop_assert_eq!(relative_distance(&v, &v), 0.0);
            let neg: Vec<f32> = v.iter().map(|x| -x).collect();
            prop_assert!((relative_distance(&neg, &v) - 2.0).abs() < 1e-9);
            prop_assert_eq!(relative_distance(&v[1..], &v), f64::INFINITY);
        }

        #[test]
        fn the_norm_seed_is_the_median_of_accepted_norms_in_any_order(
            norms in proptest::collection::vec(1e-3f64..1e3, 1..16),
            rejected in proptest::collection::vec(1e-3f64..1e6, 0..4),
            rotate in 0usize..16,
        ) {
            let mut vs: Vec<Verdict> = norms.iter().map(|&n| verdict(n, true)).collect();
            vs.extend(rejected.iter().map(|&n| verdict(n, false)));
            let seed = seed_norms(&vs).unwrap().average().unwrap();
            let k = rotate % vs.len();
            vs.rotate_left(k);
            prop_assert_eq!(seed_norms(&vs).unwrap().average().unwrap(), seed);
            // At least half of the accepted norms on each side (the median).
            let below = norms.iter().filter(|&&n| n <= seed).count();
            let above = norms.iter().filter(|&&n| n >= seed).count();
            prop_assert!(2 * below >= norms.len() && 2 * above >= norms.len());
        }
    }

    #[test]
    fn suspect_means_rejected_or_an_outlying_norm_not_a_worse_loss() {
        assert!(!verdict(1.0, true).suspect());
        assert!(verdict(1.0, false).suspect());
        // The orchestrator's own faults say nothing about the node.
        let mut crashed = verdict(1.0, false);
        crashed.outcome = Err(Rejection::ValidatorCrashed);
        assert!(!crashed.suspect());
        // An honest node's delta alone may raise the validation loss well past 10 % (one
        // node's batches; measured up to +22 % on the wine MLP): not suspect by itself.
        let mut worse = verdict(1.0, true);
        worse.loss_after = Some(1.25);
        assert!(!worse.suspect());
        // One that doubles it is.
        let mut doubled = verdict(1.0, true);
        doubled.loss_after = Some(1.0 + SUSPECT_LOSS_JUMP * 1.01);
        assert!(doubled.suspect());
        doubled.loss_after = Some(1.0 + SUSPECT_LOSS_JUMP * 0.99);
        assert!(!doubled.suspect());
        let mut outlier = verdict(3.5, true);
        outlier.rescore(&NormTracker::from_average(Some(1.0)).unwrap());
        assert!(outlier.suspect(), "{:?}", outlier.score);
        let mut near = verdict(2.5, true);
        near.rescore(&NormTracker::from_average(Some(1.0)).unwrap());
        assert!(!near.suspect(), "{:?}", near.score);
        assert!(seed_norms(&[verdict(2.0, false)]).is_none());
    }
}

/// LoRA jobs (issue 17): a `qwen3-tiny` adapter of rank 4 on `q_proj`, `v_proj`, judged as
/// the update it stands for. The fixture (trainer, base, two nodes' honest adapters) is
/// built once per test binary and shared with the sink's merge tests.
#[cfg(test)]
pub(crate) mod lora_tests {
    use super::*;
    use hanzod_actors::job::{LoraSpec, TrainMode, TrainingSpec};
    use hanzod_actors::types::JobId;
    use hanzod_protocol::hzdl::sign_statement;
    use hanzod_protocol::identity::Identity;
    use hanzod_train::lm::LocalDelta;
    use proptest::prelude::*;
    use std::sync::OnceLock;

    /// The job's training spec: `qwen3-tiny` on the corpus, tiny shapes (the debug-build
    /// forward is slow), a rank-`rank` adapter with alpha 8 on `q_proj` and `v_proj`.
    pub(crate) fn lora_training(rank: u32) -> TrainingSpec {
        TrainingSpec {
            model: hanzod_train::lm::QWEN3_TINY.into(),
            dataset: hanzod_train::text::AUSTEN.into(),
            local_lr: 3e-3,
            seq_len: 16,
            batch_size: 2,
            local_steps: 2,
            validation_tokens: 64,
            mode: TrainMode::Lora,
            lora: LoraSpec {
                rank,
                alpha: 8.0,
                target_modules: vec!["q_proj".into(), "v_proj".into()],
                dropout: 0.0,
            },
            ..TrainingSpec::default()
        }
    }

    /// A LoRA job, its base, and two nodes' honest deltas of epoch 0.
    pub(crate) struct LoraFixture {
        pub trainer: Trainer,
        pub plan: LoraPlan,
        pub base: Arc<Weights>,
        pub loss_before: f64,
        pub nodes: [Identity; 2],
        pub deltas: [LocalDelta; 2],
    }

    pub(crate) fn lora_fixture() -> &'static LoraFixture {
        static FIXTURE: OnceLock<LoraFixture> = OnceLock::new();
        FIXTURE.get_or_init(|| {
            let trainer = hanzod_train::trainer_of(&lora_training(4), JobId(1)).expect("trainer");
            let plan = LoraPlan::of_trainer(&trainer)
                .expect("plan")
                .expect("a LoRA trainer");
            let base = Arc::new(trainer.init());
            let loss_before = trainer.validation_loss(&base).expect("loss");
            let nodes = [Identity::from_seed([7; 32]), Identity::from_seed([8; 32])];
            let deltas = nodes.clone().map(|id| {
                trainer
                    .local_delta(&base, &id.node_id().0, 0)
                    .expect("local run")
            });
            LoraFixture {
                trainer,
                plan,
                base,
                loss_before,
                nodes,
                deltas,
            }
        })
    }

    /// Epoch 0's context for the fixture's job.
    pub(crate) fn lora_context(
        f: &LoraFixture,
        spot_check_rate: f64,
        norms: NormTracker,
        last_merged: Option<Arc<Vec<f32>>>,
    ) -> EpochContext {
        EpochContext {
            job: 1,
            epoch: 0,
            trainer: f.trainer.clone(),
            base: f.base.clone(),
            base_version: 0,
            loss_before: f.loss_before,
            best_loss: None,
            norms,
            last_merged,
            secret: EpochSecret::from_bytes([9; 32]),
            config: ValidationConfig {
                spot_check_rate,
                ..ValidationConfig::default()
            },
        }
    }

    /// `payload` signed by `id` for job 1, epoch 0, step 0.
    pub(crate) fn submit(id: &Identity, payload: Vec<u8>, claimed_loss: f64) -> Submission {
        let hash = payload_hash(&payload);
        let statement = Statement {
            job: 1,
            epoch: 0,
            step: 0,
            claimed_loss,
        };
        Submission {
            receipt: DeltaReceipt {
                job: hanzod_actors::types::JobId(1),
                node: id.node_id(),
                epoch: 0,
                step: 0,
                delta_hash: hash,
                claimed_loss,
                signature: sign_statement(id, &statement, &hash).to_vec(),
            },
            payload: payload.into(),
        }
    }

    /// Independent reference: `(alpha/r)·B·A` of every module of `adapter` in f64, laid out
    /// in `full` (zeros elsewhere), with the sum of absolute products per element (the
    /// scale of the f32 rounding).
    pub(crate) fn dense_update(
        plan: &LoraPlan,
        adapter: &Weights,
        full: &Layout,
    ) -> (Vec<f64>, Vec<f64>) {
        let (mut dw, mut mag) = (vec![0.0; full.len()], vec![0.0; full.len()]);
        let (r, s) = (plan.rank, f64::from(plan.alpha) / plan.rank as f64);
        for m in &plan.modules {
            let a = adapter.tensor(&m.lora_a).expect("A");
            let b = adapter.tensor(&m.lora_b).expect("B");
            let e = full.entry(&m.base).expect("base tensor");
            for o in 0..m.out_features {
                for j in 0..m.in_features {
                    for k in 0..r {
                        let p = s * f64::from(b[o * r + k]) * f64::from(a[k * m.in_features + j]);
                        dw[e.offset + o * m.in_features + j] += p;
                        mag[e.offset + o * m.in_features + j] += p.abs();
                    }
                }
            }
        }
        (dw, mag)
    }

    fn norm64(v: &[f64]) -> f64 {
        v.iter().map(|x| x * x).sum::<f64>().sqrt()
    }

    #[test]
    fn lora_plan_of_the_trainer_is_its_adapter() {
        let f = lora_fixture();
        let lora = f.trainer.lora().expect("LoRA");
        assert_eq!(f.plan.rank, 4);
        assert_eq!(f.plan.scaling() as f64, lora.scaling());
        // 4 layers × (q_proj, v_proj), base-name order.
        assert_eq!(f.plan.modules.len(), 8);
        assert!(f.plan.modules.windows(2).all(|p| p[0].base < p[1].base));
        let full = f.trainer.layout();
        for m in &f.plan.modules {
            assert_eq!(
                full.entry(&m.base).expect("in the model").shape,
                [m.out_features, m.in_features]
            );
        }
        assert_eq!(
            f.deltas[0].delta.layout.len() as u64,
            f.plan.adapter_params()
        );
        let mlp = hanzod_train::trainer_of(&TrainingSpec::default(), JobId(1)).expect("mlp");
        assert!(LoraPlan::of_trainer(&mlp).expect("plan").is_none());
    }

    /// An honest adapter is accepted and judged by its update: the norm is `‖ΔW‖₂`, the
    /// loss after is that of `base + ΔW`, the verdict keeps the factors; selected, its
    /// claimed loss and its re-run both pass.
    #[test]
    fn an_honest_lora_delta_is_accepted_and_passes_its_spot_check() {
        let f = lora_fixture();
        let honest = &f.deltas[0];
        let payload = honest.delta.to_delta_bytes(0).expect("write");
        let sub = submit(&f.nodes[0], payload, honest.claimed_loss);
        let ctx = lora_context(f, 1.0, NormTracker::new(), None);
        let v = validate(&ctx, &sub);
        let kept = v.outcome.as_ref().expect("accepted");
        assert_eq!(**kept, honest.delta.data, "the verdict keeps the factors");
        let check = v.spot_check.as_ref().expect("selected at rate 1");
        assert!(check.passed, "{check:?}");
        let distance = check.replay_distance.expect("re-run");
        assert!(
            distance <= 1e-6,
            "a re-run on one machine replays: {distance:e}"
        );
        assert!(loss_matches(
            honest.claimed_loss,
            check.measured_loss,
            ctx.config.loss_rel_tol
        ));

        let full = f.trainer.layout();
        let (dw, _) = dense_update(&f.plan, &honest.delta, &full);
        let norm = v.norm.expect("norm");
        assert!(
            (norm - norm64(&dw)).abs() <= 1e-5 * norm64(&dw),
            "{norm} vs {}",
            norm64(&dw)
        );
        assert!(norm > 0.0);
        let mut after = (*f.base).clone();
        let dw32: Vec<f32> = dw.iter().map(|&x| x as f32).collect();
        after.add_scaled(&dw32, 1.0).expect("add");
        let want = f.trainer.validation_loss(&after).expect("loss");
        let got = v.loss_after.expect("loss after");
        assert!((got - want).abs() <= 1e-4 * want, "{got} vs {want}");
        assert!(!v.suspect());
    }

    /// Convergence compares `ΔW` with the last merged update in the full layout.
    #[test]
    fn lora_convergence_compares_the_update_with_the_last_merged_update() {
        let f = lora_fixture();
        let honest = &f.deltas[0];
        let sub = submit(
            &f.nodes[0],
            honest.delta.to_delta_bytes(0).expect("write"),
            honest.claimed_loss,
        );
        let full = f.trainer.layout();
        let (dw, _) = dense_update(&f.plan, &honest.delta, &full);
        let same: Vec<f32> = dw.iter().map(|&x| (3.0 * x) as f32).collect();
        let opposite: Vec<f32> = same.iter().map(|x| -x).collect();
        for (last, want) in [(same, 1.0), (opposite, 0.0)] {
            let ctx = lora_context(f, 0.0, NormTracker::new(), Some(Arc::new(last)));
            let v = validate(&ctx, &sub);
            assert!(v.outcome.is_ok(), "{:?}", v.outcome);
            let c = v
                .score
                .expect("score")
                .convergence
                .expect("a last merged update");
            assert!((c - want).abs() <= 1e-6, "{c} vs {want}");
        }
        // A last merged update of another length is a quality failure, not a panic.
        let ctx = lora_context(f, 0.0, NormTracker::new(), Some(Arc::new(vec![1.0; 3])));
        assert!(matches!(
            validate(&ctx, &sub).outcome,
            Err(Rejection::Quality(_))
        ));
    }

    /// A scaled, sign-flipped adapter (`B × −10`: `ΔW × −10`) is suspect by its norm, and
    /// rejected with slashing evidence when spot-checked.
    #[test]
    fn a_lora_delta_with_b_scaled_by_minus_ten_is_suspect_or_rejected() {
        let f = lora_fixture();
        let honest = &f.deltas[0];
        let mut poisoned = honest.delta.clone();
        for m in &f.plan.modules {
            for b in poisoned.tensor_mut(&m.lora_b).expect("B") {
                *b *= -10.0;
            }
        }
        let sub = submit(
            &f.nodes[0],
            poisoned.to_delta_bytes(0).expect("write"),
            honest.claimed_loss,
        );
        let honest_norm = {
            let ctx = lora_context(f, 0.0, NormTracker::new(), None);
            let sub = submit(
                &f.nodes[0],
                honest.delta.to_delta_bytes(0).expect("write"),
                honest.claimed_loss,
            );
            validate(&ctx, &sub).norm.expect("norm")
        };
        let norms = NormTracker::from_average(Some(honest_norm)).expect("norms");
        let v = validate(&lora_context(f, 0.0, norms, None), &sub);
        let norm = v.norm.expect("norm");
        assert!(
            (norm / honest_norm - 10.0).abs() < 1e-4,
            "{norm} vs {honest_norm}"
        );
        assert!(v.suspect(), "{:?}", v.score);

        let v = validate(&lora_context(f, 1.0, norms, None), &sub);
        assert!(
            matches!(v.outcome, Err(Rejection::SpotCheckReplay { .. })),
            "{:?}",
            v.outcome
        );
        assert!(v.evidence(&sub.receipt).is_some());
        assert!(v.suspect());
    }

    /// A quieter tampering: `B × 0.9` (`ΔW × 0.9`) fails the re-run, which compares the
    /// `B` factors on their own (one distance over `A` and `B` would be 0.008 here).
    #[test]
    fn a_lora_delta_with_b_shrunk_by_a_tenth_fails_its_replay() {
        let f = lora_fixture();
        let honest = &f.deltas[0];
        let mut shrunk = honest.delta.clone();
        for m in &f.plan.modules {
            for b in shrunk.tensor_mut(&m.lora_b).expect("B") {
                *b *= 0.9;
            }
        }
        let whole = relative_distance(&shrunk.data, &honest.delta.data);
        let tol = ValidationConfig::default().replay_rel_tol;
        assert!(whole < tol, "one distance over A and B dilutes B: {whole}");
        let sub = submit(
            &f.nodes[0],
            shrunk.to_delta_bytes(0).expect("write"),
            honest.claimed_loss,
        );
        let v = validate(&lora_context(f, 1.0, NormTracker::new(), None), &sub);
        match v.outcome {
            Err(Rejection::SpotCheckReplay { distance, .. }) => {
                assert!((distance - 0.1).abs() < 1e-3, "{distance}")
            }
            other => panic!("{other:?}"),
        }
    }

    /// An adapter layout of `modules` `(out, in)` at rank `r` (names `layers.i.proj`).
    fn adapter_layout(r: usize, modules: &[(usize, usize)]) -> Layout {
        let mut params = std::collections::BTreeMap::new();
        for (i, &(o, n)) in modules.iter().enumerate() {
            params.insert(
                format!("base_model.model.layers.{i}.proj.lora_A.weight"),
                vec![r, n],
            );
            params.insert(
                format!("base_model.model.layers.{i}.proj.lora_B.weight"),
                vec![o, r],
            );
        }
        Layout::new(&hanzod_protocol::model::ModelSpec {
            name: "adapter".into(),
            params,
            lora: Some(hanzod_protocol::model::LoraConfig {
                rank: r,
                target_modules: vec!["proj".into()],
            }),
        })
        .expect("layout")
    }

    proptest! {
        /// The LoRA re-run distance is the larger of the factors' distances: zero to
        /// itself, at least the distance over the whole adapter, exactly `|1 − c|` when
        /// only the `B` factors are scaled by `c`, and exactly `|1 − c|` when the `A`
        /// factors' change from the shared start is scaled by `c` (which measured against
        /// `‖A‖` alone would read as small as the start is large).
        #[test]
        fn replay_distance_takes_each_factor_on_its_own(
            r in 1usize..=3,
            modules in proptest::collection::vec((1usize..=5, 1usize..=5), 1..=3),
            seed in any::<u64>(),
            c in 0.5f32..1.5,
        ) {
            use rand::{Rng, SeedableRng};
            let layout = adapter_layout(r, &modules);
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let a: Vec<f32> = (0..layout.len()).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
            let b: Vec<f32> = (0..layout.len()).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
            prop_assert_eq!(replay_distance(&layout, &a, &a, None), 0.0);
            let d = replay_distance(&layout, &a, &b, None);
            prop_assert!(d >= relative_distance(&a, &b) * (1.0 - 1e-12), "{}", d);
            prop_assert_eq!(replay_distance(&layout, &a[1..], &b[1..], None), f64::INFINITY);
            let is_b = |name: &str| name.ends_with(LORA_B_SUFFIX);
            let mut scaled = a.clone();
            for e in layout.entries().iter().filter(|e| is_b(&e.name)) {
                scaled[e.offset..e.offset + e.len].iter_mut().for_each(|x| *x *= c);
            }
            let want = (1.0 - f64::from(c)).abs();
            prop_assert!((replay_distance(&layout, &scaled, &a, None) - want).abs() < 1e-6);
            // A start with large A factors (B = 0): the replay moved A by a small step.
            let mut start = vec![0.0f32; layout.len()];
            let mut replayed = vec![0.0f32; layout.len()];
            let mut tampered = vec![0.0f32; layout.len()];
            for e in layout.entries() {
                for k in e.offset..e.offset + e.len {
                    // A step of at least 0.005 so that f32 rounding at |start| <= 10
                    // (ulp ~1e-6) stays far below the 1e-3 tolerance.
                    let step = 0.01 * (0.5 + 0.5 * a[k].abs()) * a[k].signum();
                    if is_b(&e.name) {
                        replayed[k] = b[k];
                        tampered[k] = b[k];
                    } else {
                        start[k] = 10.0 * b[k];
                        replayed[k] = start[k] + step;
                        tampered[k] = start[k] + c * step;
                    }
                }
            }
            let d = replay_distance(&layout, &tampered, &replayed, Some(&start));
            prop_assert!((d - want).abs() < 1e-3, "{} vs {}", d, want);
            prop_assert_eq!(
                replay_distance(&layout, &tampered, &replayed, Some(&start[1..])),
                f64::INFINITY
            );
        }
    }

    /// The format check is against the adapter's layout: a rank-8 adapter for a rank-4
    /// job, or a full delta for a LoRA job, is a format rejection that names the problem.
    #[test]
    fn a_delta_of_the_wrong_adapter_shape_is_a_format_rejection() {
        let f = lora_fixture();
        let ctx = lora_context(f, 1.0, NormTracker::new(), None);
        let full = f.trainer.layout();
        let rank8 = full
            .spec()
            .lora_spec(8, &["q_proj", "v_proj"])
            .expect("rank-8 spec");
        let mut wrong =
            Weights::zeros(Arc::new(hanzod_train::Layout::new(&rank8).expect("layout")));
        wrong.data.iter_mut().for_each(|x| *x = 0.01);
        let v = validate(
            &ctx,
            &submit(
                &f.nodes[0],
                wrong.to_delta_bytes(0).expect("write"),
                f.deltas[0].claimed_loss,
            ),
        );
        match &v.outcome {
            Err(Rejection::Format(why)) => {
                // The first adapter tensor in name order: layer 0's q_proj A, [8, 128].
                assert!(
                    why.contains("layers.0.self_attn.q_proj.lora_A.weight"),
                    "{why}"
                );
                assert!(
                    why.contains("[8, 128]") && why.contains("[4, 128]"),
                    "{why}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(
            v.spot_check.is_none(),
            "format failures are not spot-checked"
        );

        let full_delta = Weights::zeros(full);
        let v = validate(
            &ctx,
            &submit(
                &f.nodes[0],
                full_delta.to_delta_bytes(0).expect("write"),
                f.deltas[0].claimed_loss,
            ),
        );
        match &v.outcome {
            Err(Rejection::Format(why)) => {
                assert!(why.contains("kind"), "{why}");
                assert!(why.contains("lora") || why.contains("LoRA"), "{why}");
            }
            other => panic!("{other:?}"),
        }
    }
}
