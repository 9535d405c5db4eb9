//! The decisions of a star-mode epoch once every delta is judged (DESIGN §6, paper §5–§6),
//! as pure functions: copies and empty updates rejected ([`crate::copies`]), the norm
//! average seeded in a job's first epoch, the suspect deltas counted, the aggregator chosen
//! ([`RobustPolicy`]) and the merge applied and checked against the validation loss
//! (`merge_epoch`). The sink runs them on its blocking pool; `hanzod bench byzantine`
//! runs the same functions on in-process epochs, so what it measures is what the daemon
//! decides.

use std::sync::Arc;

use crate::copies::Copying;
use crate::copies::{find_copies, CopyConfig, CopyInput};
use crate::lora::{apply_lora_merge_with_update, FlatAdapter, LoraError, LoraPlan};
use crate::merge::{
    Aggregator, CoordinateMedian, KeepReason, MergeOutcome, RobustAggregator, RobustPolicy,
    WeightedMean,
};
use crate::score::{cosine_similarity, l2_norm, NormTracker};
use crate::validate::{seed_norms, EpochContext, Rejection, Verdict};
use hanzod_train::{Layout, Trainer, Weights};

/// How a star epoch merges: the job's outer learning rate and the robust-merge policy
/// ([`crate::sink::SinkConfig`]'s `suspect_threshold` and `robust_aggregator`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StarPolicy {
    /// The outer learning rate applied to the merged update (the job's `outer_lr`).
    pub outer_lr: f32,
    /// Fraction of suspect deltas above which the robust aggregator is used alone, in an
    /// epoch whose deltas have no agreement ([`agreements`]: fewer than
    /// [`AGREEMENT_MIN_DELTAS`] of them). An epoch with an agreement merges with the
    /// agreement-weighted mean first whatever its suspects, and falls back to the robust
    /// aggregator when the loss check refuses it (`hanzod bench byzantine`: at 40 %
    /// Byzantine nodes scaling their deltas by −10, switching to the median alone ended
    /// 6 % above the honest-only loss, the weighted mean first within 0.5 %).
    pub suspect_threshold: f32,
    /// The robust aggregator (above the threshold, and the weighted mean's fallback).
    pub robust_aggregator: RobustAggregator,
    /// The robust aggregator alone on every epoch, whatever the suspects and agreements (a
    /// benchmark's baseline; `false` in the daemon).
    pub robust_alone: bool,
}

/// How far above the job's best checkpoint so far a merged checkpoint's validation loss
/// may be and still be published (2 %): a merge may be a little worse than the last
/// checkpoint (a noisy epoch on a plateau), but the rises cannot compound. The bound was a
/// 10 % rise over the base alone, and a 40-epoch demo job drifted from 0.656 to 1.056 in
/// steps of under 10 % (issue 19).
pub const DRIFT_TOLERANCE: f64 = 0.02;

/// The highest validation loss a merge may have and be published:
/// `min(loss_before, best) · (1 + 2 %)` ([`DRIFT_TOLERANCE`]), `best` the job's best
/// checkpoint's loss so far (`None`: the base's). The best is at most the base, so this is
/// also at most a 2 % rise over the base.
pub fn merge_limit(loss_before: f64, best_loss: Option<f64>) -> f64 {
    best_loss.map_or(loss_before, |b| b.min(loss_before)) * (1.0 + DRIFT_TOLERANCE)
}

/// Why a merge whose validation loss is `loss` (above [`merge_limit`]) is not published.
pub fn refused_loss(name: &str, loss_before: f64, best_loss: Option<f64>, loss: f64) -> String {
    let limit = merge_limit(loss_before, best_loss);
    match best_loss {
        Some(best) if best < loss_before => format!(
            "the {name} merge would give a validation loss of {loss:.6}, above {limit:.6} \
             (the job's best checkpoint has {best:.6}; the base {loss_before:.6})"
        ),
        _ => format!(
            "the {name} merge would raise the validation loss from {loss_before:.6} to {loss:.6}"
        ),
    }
}

/// What [`star_epoch`] decided.
#[derive(Debug)]
pub struct StarEpoch {
    /// The verdicts, with copies rejected and stability rescored in a first epoch.
    pub judged: Vec<Verdict>,
    /// The norm average the epoch was scored against (seeded from the epoch itself in a
    /// job's first epoch).
    pub norm_average: NormTracker,
    /// Suspect verdicts (rejected ones included: they count towards the threshold).
    pub suspect: usize,
    /// Each verdict's agreement with the epoch ([`agreements`]), in `judged`'s order.
    pub agreement: Vec<Option<f64>>,
    /// Each verdict's weight in the merge, in `judged`'s order: [`star_weight`] under the
    /// weighted mean, 1 for every merged delta under a robust aggregator, 0 for a delta
    /// not merged and for every delta of an epoch that kept its base. A group of copies
    /// ([`copy_groups`]) is merged once, under its representative's line.
    pub weights: Vec<f64>,
    /// The merge.
    pub merged: Merged,
}

/// A flagged copy's delta, set aside by [`reject_copies`] so that its group can still be
/// merged once ([`copy_groups`]).
#[derive(Debug, Clone)]
pub struct SetAside {
    /// Index of the verdict in the epoch's `judged`.
    pub index: usize,
    /// What it was found to be.
    pub copying: Copying,
    /// Its delta (what `outcome` held before the rejection).
    pub delta: Arc<Vec<f32>>,
}

/// Rejects, among the accepted full-parameter deltas of `judged`, the copies, re-uploads
/// of the last merged update (`last_merged`, the model's full layout) and empty updates
/// ([`find_copies`] with [`CopyConfig::default`]) as [`Rejection::Copy`], and returns them
/// with their deltas: [`reject_copies_by`] comparing the deltas themselves. Not for LoRA
/// adapters, whose factors share the job's initialisation of `A` (honest ones look alike):
/// [`star_epoch`] compares their updates' sketches ([`crate::lora_sketch`]) instead.
pub fn reject_copies(judged: &mut [Verdict], last_merged: Option<&[f32]>) -> Vec<SetAside> {
    let deltas: Vec<Option<Arc<Vec<f32>>>> = judged
        .iter()
        .map(|v| v.outcome.as_ref().ok().cloned())
        .collect();
    let views: Vec<Option<&[f32]>> = deltas
        .iter()
        .map(|d| d.as_deref().map(Vec::as_slice))
        .collect();
    reject_copies_by(judged, &views, last_merged)
}

/// [`reject_copies`] with the rules of [`find_copies`] run on `views[k]`, the vector that
/// stands for verdict `k`'s delta (for a LoRA adapter the sketch of its update
/// `ΔW = (α/r)·B·A`, [`crate::lora_sketch`]), and `last_merged` the last merged update in
/// the views' form; the set-aside copies still carry their deltas (what a copy group is
/// merged from). An accepted verdict without a view (`None`, or `views` too short: an
/// adapter that could not be sketched) is only checked for a shared delta hash (rule 1);
/// the others' rules compare the views alone.
pub fn reject_copies_by(
    judged: &mut [Verdict],
    views: &[Option<&[f32]>],
    last_merged: Option<&[f32]>,
) -> Vec<SetAside> {
    // Not finite, so `find_copies` leaves it out of every rule but the hash's.
    const UNCOMPARABLE: &[f32] = &[f32::NAN];
    let flagged: Vec<(usize, Copying)> = {
        let mut accepted: Vec<(usize, bool, CopyInput<'_>)> = judged
            .iter()
            .enumerate()
            .filter(|(_, v)| v.outcome.is_ok())
            .map(|(k, v)| {
                let view = views.get(k).copied().flatten();
                let input = CopyInput {
                    node: v.node,
                    hash: v.delta_hash,
                    delta: view.unwrap_or(UNCOMPARABLE),
                };
                (k, view.is_none(), input)
            })
            .collect();
        // The comparable views first: `find_copies` takes the length from the first input
        // (a stable sort: the order is unchanged when every verdict has a view).
        accepted.sort_by_key(|(_, uncomparable, _)| *uncomparable);
        let inputs: Vec<CopyInput<'_>> = accepted.iter().map(|(_, _, i)| *i).collect();
        let verdicts = find_copies(&inputs, last_merged, &CopyConfig::default());
        accepted
            .iter()
            .zip(verdicts)
            .filter_map(|((k, _, _), c)| Some((*k, c?)))
            .collect()
    };
    let mut set_aside = Vec::with_capacity(flagged.len());
    for (k, copying) in flagged {
        tracing::warn!(node = %judged[k].node, reason = %copying, "delta rejected as a copy or no update");
        let rejected = Err(Rejection::Copy(copying.clone()));
        if let Ok(delta) = std::mem::replace(&mut judged[k].outcome, rejected) {
            set_aside.push(SetAside {
                index: k,
                copying,
                delta,
            });
        }
    }
    set_aside
}

/// The groups of copies among `set_aside` (duplicates and near copies linked to the node
/// they copy, transitively), each as the index (into `judged`) of its representative: the
/// member with the smallest delta hash. In star mode nobody can tell the original from the
/// copy, so no member is paid; but one of them may be an honest node's work, so the group
/// is merged once, as one delta. Empty updates and re-uploads of the last merged update
/// (`last_merged`) form no group, even when several nodes upload the same bytes of one:
/// they carry nothing new.
pub fn copy_groups(
    judged: &[Verdict],
    set_aside: &[SetAside],
    last_merged: Option<&[f32]>,
) -> Vec<usize> {
    let mut views: Vec<Option<&[f32]>> = vec![None; judged.len()];
    for s in set_aside {
        if let Some(v) = views.get_mut(s.index) {
            *v = Some(s.delta.as_slice());
        }
    }
    copy_groups_by(judged, set_aside, &views, last_merged)
}

/// [`copy_groups`] with a representative's update read from `views[k]` (in `judged`'s
/// order; the form [`reject_copies_by`] compared, e.g. a LoRA adapter's sketch) and
/// `last_merged` in that form: a representative whose view is zero or the last merged
/// update forms no group, nor does one without a view (its update cannot be measured).
pub fn copy_groups_by(
    judged: &[Verdict],
    set_aside: &[SetAside],
    views: &[Option<&[f32]>],
    last_merged: Option<&[f32]>,
) -> Vec<usize> {
    let linked: Vec<(usize, usize)> = set_aside
        .iter()
        .filter_map(|s| {
            let of = match &s.copying {
                Copying::Duplicate { of } | Copying::NearCopy { of, .. } => *of,
                Copying::NoUpdate | Copying::CopiesLastMerged { .. } => return None,
            };
            let other = set_aside.iter().find(|t| judged[t.index].node == of)?.index;
            Some((s.index, other))
        })
        .collect();
    // Union-find over the linked indices.
    let mut parent: std::collections::BTreeMap<usize, usize> = Default::default();
    fn root(parent: &mut std::collections::BTreeMap<usize, usize>, k: usize) -> usize {
        let p = *parent.entry(k).or_insert(k);
        if p == k {
            return k;
        }
        let r = root(parent, p);
        parent.insert(k, r);
        r
    }
    for &(a, b) in &linked {
        let (ra, rb) = (root(&mut parent, a), root(&mut parent, b));
        if ra != rb {
            parent.insert(ra.max(rb), ra.min(rb));
        }
    }
    let members: Vec<usize> = parent.keys().copied().collect();
    let mut groups: std::collections::BTreeMap<usize, usize> = Default::default();
    for k in members {
        let r = root(&mut parent, k);
        let best = groups.entry(r).or_insert(k);
        if judged[k].delta_hash < judged[*best].delta_hash {
            *best = k;
        }
    }
    // A group that shares an empty update or the last merged update carries nothing new
    // (the duplicate rule flags it before the other rules look).
    let copy_cosine = CopyConfig::default().copy_cosine;
    groups
        .into_values()
        .filter(|&k| {
            if !set_aside.iter().any(|s| s.index == k) {
                return false;
            }
            let Some(d) = views.get(k).copied().flatten() else {
                return false;
            };
            let empty = !matches!(l2_norm(d), Ok(n) if n > 0.0);
            let last = last_merged
                .filter(|l| l.len() == d.len())
                .is_some_and(|l| cosine_similarity(d, l).is_ok_and(|c| c >= copy_cosine));
            !(empty || last)
        })
        .collect()
}

/// The sketches of a LoRA epoch's accepted adapters and of its last merged update
/// ([`crate::lora_sketch::sketch_epoch`] under the epoch's secret), in `judged`'s order.
/// None when the job's adapter cannot be sketched at all (logged): the copies are then
/// found by their hashes alone and no delta has an agreement.
fn lora_sketches(ctx: &EpochContext, judged: &[Verdict]) -> crate::lora_sketch::EpochSketches {
    let adapters: Vec<Option<&[f32]>> = judged
        .iter()
        .map(|v| v.outcome.as_ref().ok().map(|d| d.as_slice()))
        .collect();
    let last = ctx.last_merged.as_deref().map(Vec::as_slice);
    crate::lora_sketch::sketch_epoch(&ctx.trainer, &ctx.secret, &adapters, last).unwrap_or_else(
        |e| {
            tracing::warn!(error = %e, "LoRA adapters not sketched: copies found by hash alone, no agreement");
            crate::lora_sketch::EpochSketches::none(judged.len())
        },
    )
}

/// The norm average an epoch is scored against: `norms` (the job's running average) when
/// it has one; in a job's first epoch `seeded` when given (ring mode: the average the
/// members' sketches were scored against), else the epoch's own norms ([`seed_norms`]),
/// and then every verdict's stability is scored again against it.
pub fn seed_epoch_norms(
    norms: NormTracker,
    seeded: Option<NormTracker>,
    judged: &mut [Verdict],
) -> NormTracker {
    if norms.average().is_some() {
        return norms;
    }
    let seeded = match seeded {
        Some(n) if n.average().is_some() => Some(n),
        _ => seed_norms(judged),
    };
    match seeded {
        Some(seeded) => {
            judged.iter_mut().for_each(|v| v.rescore(&seeded));
            seeded
        }
        None => norms,
    }
}

/// Folds `norms` (delta hash, L2 norm) into `average`, in delta-hash order so the result
/// does not depend on arrival order (DESIGN §12). Norms the tracker refuses (not finite)
/// are skipped.
pub fn fold_norms(mut average: NormTracker, mut norms: Vec<([u8; 32], f64)>) -> NormTracker {
    norms.sort_by_key(|n| n.0);
    for (_, n) in norms {
        let _ = average.accept(n);
    }
    average
}

/// The norms a star epoch folds into the running average: the accepted, not suspect
/// deltas' whose agreement with the epoch (`agreement`, in `judged`'s order; absent:
/// unknown) is not 0: neither a suspect nor a disagreeing delta (sign-flipped, noise,
/// scaled beyond 3×) can drag the average.
pub fn star_norms(judged: &[Verdict], agreement: &[Option<f64>]) -> Vec<([u8; 32], f64)> {
    judged
        .iter()
        .enumerate()
        .filter(|(k, v)| {
            v.outcome.is_ok() && !v.suspect() && agreement.get(*k).copied().flatten() != Some(0.0)
        })
        .filter_map(|(_, v)| v.norm.map(|n| (v.delta_hash, n)))
        .collect()
}

/// Fewest deltas for which the epoch's medians are a reference ([`agreements`]): with two,
/// the median is their mean and says nothing about either.
pub const AGREEMENT_MIN_DELTAS: usize = 3;

/// Cosines at or below `AGREEMENT_NOISE_SIGMAS / √len` count as 0 in [`agreements`]: the
/// cosine of a random direction with a fixed one in `len` dimensions has standard
/// deviation `1/√len`, so below three of them a delta is indistinguishable from noise.
pub const AGREEMENT_NOISE_SIGMAS: f64 = 3.0;

/// Cosines with the epoch's median at or below this fraction of the epoch's median cosine
/// count as 0 in [`agreements`]. Measured on the wine MLP (10 nodes, 6 epochs, 3 seeds,
/// 30 % Gaussian-noise nodes): honest cosines 0.33–0.94 (median 0.60), the noise deltas'
/// 0.10–0.16 (the coordinate median is pulled towards them); a half keeps every honest
/// delta and drops the noise.
pub const AGREEMENT_COSINE_FLOOR: f64 = 0.5;

/// A delta whose norm is more than this factor from the epoch's median norm agrees 0 in
/// [`agreements`]: the same three times as the stability rule
/// ([`crate::validate::SUSPECT_STABILITY`]; honest deltas were measured within 2.5× of
/// the median).
pub const AGREEMENT_NORM_RATIO: f64 = 3.0;

/// The agreement of each delta of `deltas` (`None`: not merged) with the others:
/// `aᵢ = c(cos(δᵢ, m)) · min(‖δᵢ‖/ν, ν/‖δᵢ‖)` in `[0, 1]` (0 when that ratio is below
/// `1/3`, [`AGREEMENT_NORM_RATIO`]), with `m` the coordinate-wise median of the deltas,
/// `ν` the median of their L2 norms, and `c(x) = x` above the floor
/// `max(3/√len, ½ · the deltas' median cosine)` ([`AGREEMENT_NOISE_SIGMAS`],
/// [`AGREEMENT_COSINE_FLOOR`]), 0 at or below it. Suspects take part (medians
/// need no trust). A delta against the consensus (sign-flipped, inner-product
/// manipulation: `cos ≤ 0`) or orthogonal to it (noise) agrees 0; one `k` times the
/// typical norm (scaled up, or lazy with `k ≪ 1`) is weighed `k` or `1/k` times less, so
/// under the weighted mean its contribution `aᵢ·δᵢ` keeps the typical norm. The direction
/// term is FLTrust's trust score (Cao et al., NDSS 2021, "FLTrust: Byzantine-robust
/// Federated Learning via Trust Bootstrapping": `ReLU(cos(gᵢ, g₀))`) with the epoch's
/// coordinate median in place of a server update on root data; the norm term stands for
/// FLTrust's rescaling of every update to `‖g₀‖`.
///
/// Every entry is `None` when fewer than [`AGREEMENT_MIN_DELTAS`] deltas are given, when
/// their lengths differ, or when the median or the typical norm is zero.
pub fn agreements(deltas: &[Option<&[f32]>]) -> Vec<Option<f64>> {
    let given: Vec<&[f32]> = deltas.iter().flatten().copied().collect();
    let none = vec![None; deltas.len()];
    if given.len() < AGREEMENT_MIN_DELTAS {
        return none;
    }
    let len = given[0].len();
    if len == 0 || given.iter().any(|d| d.len() != len) {
        return none;
    }
    let mut centre = vec![0.0f32; len];
    let ones = vec![1.0f32; given.len()];
    if !matches!(
        CoordinateMedian.merge(&given, &ones, &mut centre),
        Ok(MergeOutcome::Merged { .. })
    ) {
        return none;
    }
    if !matches!(l2_norm(&centre), Ok(n) if n > 0.0) {
        return none;
    }
    let mut norms: Vec<f64> = given.iter().filter_map(|d| l2_norm(d).ok()).collect();
    norms.sort_by(f64::total_cmp);
    let typical = match norms.len() {
        0 => return none,
        n if n % 2 == 1 => norms[n / 2],
        n => 0.5 * (norms[n / 2 - 1] + norms[n / 2]),
    };
    if typical.is_nan() || typical <= 0.0 {
        return none;
    }
    let measured: Vec<Option<(f64, f64)>> = deltas
        .iter()
        .map(|d| {
            let d = (*d)?;
            let cos = cosine_similarity(d, &centre).ok()?;
            let ratio = l2_norm(d).ok()? / typical;
            let size = if (1.0 / AGREEMENT_NORM_RATIO..=AGREEMENT_NORM_RATIO).contains(&ratio) {
                ratio.min(1.0 / ratio)
            } else {
                0.0
            };
            Some((cos, size))
        })
        .collect();
    let mut cosines: Vec<f64> = measured.iter().flatten().map(|(c, _)| *c).collect();
    cosines.sort_by(f64::total_cmp);
    let typical_cos = cosines.get(cosines.len() / 2).copied().unwrap_or(0.0);
    let floor =
        (AGREEMENT_NOISE_SIGMAS / (len as f64).sqrt()).max(AGREEMENT_COSINE_FLOOR * typical_cos);
    measured
        .into_iter()
        .map(|m| m.map(|(cos, size)| if cos > floor { cos * size } else { 0.0 }))
        .collect()
}

/// Without an agreement (fewer than [`AGREEMENT_MIN_DELTAS`] deltas, or LoRA adapters that
/// could not be sketched), a delta that alone raises the validation loss by more than this
/// (10 %) weighs 0: the direction check the agreement makes is then missing, and a
/// sign-flipped delta would otherwise keep the weight of its stability term.
pub const UNCHECKED_LOSS_RISE: f64 = 0.10;

/// What a star-mode delta's weight in the weighted mean and its reward share are decided
/// from ([`Merit::weight`]): the measurements its verdict holds, or, for an auditor, the
/// same numbers as its line of the epoch report says them
/// ([`crate::sink::reward_shares`]). One rule for both, so that a delta that gets no
/// weight is not paid either.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Merit {
    /// Its composite quality score (`None`: not scored).
    pub composite: Option<f64>,
    /// Its measurements make it suspect ([`Verdict::measured_suspect`]).
    pub measured_suspect: bool,
    /// Its agreement with the epoch ([`agreements`]; `None`: not measured).
    pub agreement: Option<f64>,
    /// The base checkpoint's validation loss.
    pub loss_before: f64,
    /// The validation loss of base + this delta alone (`None`: not measured).
    pub loss_after: Option<f64>,
}

impl Merit {
    /// The merit of verdict `v` whose agreement with the epoch is `agreement`.
    pub fn of(v: &Verdict, agreement: Option<f64>) -> Merit {
        Merit {
            composite: v.score.map(|s| s.composite),
            measured_suspect: v.measured_suspect(),
            agreement,
            loss_before: v.loss_before,
            loss_after: v.loss_after,
        }
    }

    /// The delta's weight under the weighted mean, and its reward share in star mode: its
    /// composite score times its agreement with the epoch; 0 when its measurements make it
    /// suspect or it has no score. Without an agreement (a LoRA job whose sketches could
    /// not be compared, fewer than [`AGREEMENT_MIN_DELTAS`] deltas): its composite score,
    /// or 0 when it alone raises the validation loss by more than
    /// [`UNCHECKED_LOSS_RISE`].
    pub fn weight(&self) -> f64 {
        match (self.composite, self.agreement) {
            (Some(_), _) if self.measured_suspect => 0.0,
            (Some(c), Some(a)) => c * a,
            (Some(c), None) => match self.loss_after {
                Some(after) if after <= self.loss_before * (1.0 + UNCHECKED_LOSS_RISE) => c,
                _ => 0.0,
            },
            (None, _) => 0.0,
        }
    }
}

/// A delta's weight under the weighted mean, and its reward share in star mode:
/// [`Merit::weight`] of its verdict.
pub fn star_weight(v: &Verdict, agreement: Option<f64>) -> f64 {
    Merit::of(v, agreement).weight()
}

/// A star epoch's decisions once every delta is judged (module docs): copies rejected and
/// each group of copies set aside to be merged once (a LoRA job's adapters compared on
/// their updates' sketches, [`crate::lora_sketch`], here and for the agreement), the norm
/// average seeded in a first epoch, suspects counted, agreements measured, and the merge
/// (`merge_epoch`): weighted by [`star_weight`] with `policy.robust_aggregator` as the
/// fallback, or by the robust aggregator alone when the epoch has no agreement and more
/// than `policy.suspect_threshold` of it is suspect ([`RobustPolicy::choose`]), or when
/// `policy.robust_alone`. CPU-bound (validation-loss passes of the merge): run it
/// off the async runtime.
pub fn star_epoch(ctx: &EpochContext, mut judged: Vec<Verdict>, policy: &StarPolicy) -> StarEpoch {
    // A LoRA job's adapters are compared on their updates `ΔWᵢ = (α/r)·Bᵢ·Aᵢ` through the
    // epoch's random projection of them (`crate::lora_sketch`), never on their factors
    // (which share the job's initialisation of `A`, so honest ones look alike).
    let sketches = ctx
        .trainer
        .lora()
        .is_some()
        .then(|| lora_sketches(ctx, &judged));
    let (set_aside, groups) = match &sketches {
        Some(s) => {
            let (views, last) = (s.views(), s.last_merged.as_deref());
            let set_aside = reject_copies_by(&mut judged, &views, last);
            let groups = copy_groups_by(&judged, &set_aside, &views, last);
            (set_aside, groups)
        }
        None => {
            let last = ctx.last_merged.as_deref().map(Vec::as_slice);
            let set_aside = reject_copies(&mut judged, last);
            let groups = copy_groups(&judged, &set_aside, last);
            (set_aside, groups)
        }
    };
    let norm_average = seed_epoch_norms(ctx.norms, None, &mut judged);
    // A copy group counts once, as its representative's measurements say: Sybil copies can
    // neither dilute the suspect fraction nor slip a suspect delta in.
    let suspect = judged.iter().filter(|v| v.suspect()).count()
        + groups
            .iter()
            .filter(|&&k| judged[k].measured_suspect())
            .count();
    let counted = judged.len() - set_aside.len() + groups.len();
    // What is merged, in `judged`'s order: the accepted deltas and one per copy group.
    let merged_delta: Vec<Option<Arc<Vec<f32>>>> = judged
        .iter()
        .enumerate()
        .map(|(k, v)| match &v.outcome {
            Ok(d) => Some(d.clone()),
            Err(_) if groups.contains(&k) => set_aside
                .iter()
                .find(|s| s.index == k)
                .map(|s| s.delta.clone()),
            Err(_) => None,
        })
        .collect();
    // What each merged delta is compared as: itself, or a LoRA adapter's sketch.
    let views: Vec<Option<&[f32]>> = match &sketches {
        Some(s) => merged_delta
            .iter()
            .zip(s.views())
            .map(|(d, v)| d.as_ref().and(v))
            .collect(),
        None => merged_delta
            .iter()
            .map(|d| d.as_deref().map(Vec::as_slice))
            .collect(),
    };
    let agreement = agreements(&views);
    let mut weights: Vec<f64> = judged
        .iter()
        .enumerate()
        .zip(&agreement)
        .map(|((k, v), a)| match (&v.outcome, v.score) {
            (Ok(_), _) => star_weight(v, *a),
            // A copy group's representative: weighed as its measurements say.
            (Err(_), Some(_)) if groups.contains(&k) => star_weight(v, *a),
            (Err(_), _) => 0.0,
        })
        .collect();
    let inputs: Vec<MergeInput> = judged
        .iter()
        .zip(&merged_delta)
        .zip(&weights)
        .filter_map(|((v, d), w)| {
            Some(MergeInput {
                delta: d.clone()?,
                weight: *w as f32,
                suspect: v.suspect() && v.outcome.is_ok(),
            })
        })
        .collect();
    // With an agreement, the weighted mean already gives a delta against the epoch no
    // weight, and the robust aggregator is its fallback (`StarPolicy::suspect_threshold`).
    let weighed = agreement.iter().any(Option::is_some);
    let robust = policy.robust_alone
        || (!weighed
            && RobustPolicy {
                suspect_threshold: policy.suspect_threshold,
                robust: policy.robust_aggregator.build(inputs.len()),
                ..RobustPolicy::default()
            }
            .choose(suspect, counted)
            .name()
                != WeightedMean.name());
    let rejected_all = !judged.is_empty() && judged.iter().all(|v| v.outcome.is_err());
    let merged = merge_epoch(
        &ctx.base,
        &ctx.trainer,
        ctx.loss_before,
        &inputs,
        robust,
        policy.robust_aggregator,
        policy.outer_lr,
        rejected_all,
        ctx.best_loss,
    );
    match merged.aggregator {
        None => weights.iter_mut().for_each(|w| *w = 0.0),
        Some(a) if a != WeightedMean.name() => weights
            .iter_mut()
            .zip(&merged_delta)
            .for_each(|(w, d)| *w = if d.is_some() { 1.0 } else { 0.0 }),
        Some(_) => {}
    }
    StarEpoch {
        judged,
        norm_average,
        suspect,
        agreement,
        weights,
        merged,
    }
}

/// One accepted delta, as the merge sees it.
pub(crate) struct MergeInput {
    /// The delta as the verdict holds it, in the trainer's delta layout
    /// ([`Trainer::delta_layout`]): the model's tensors, or a LoRA adapter's factors.
    pub(crate) delta: Arc<Vec<f32>>,
    /// Its composite score.
    pub(crate) weight: f32,
    /// Suspect: weight 0 under the weighted mean.
    pub(crate) suspect: bool,
}

/// An epoch's merge: the next checkpoint, or the base kept and why ([`star_epoch`], the
/// ring branch of the sink).
#[derive(Debug, Clone)]
pub struct Merged {
    /// The next checkpoint (the base when kept).
    pub next: Arc<Weights>,
    /// Its validation loss (nats/token for a language model; the recipe's loss otherwise).
    pub loss_after: f64,
    /// The aggregator that produced it (`None`: kept).
    pub aggregator: Option<&'static str>,
    /// Why the base was kept.
    pub kept: Option<String>,
    /// The merged update (before `outer_lr`) in the model's (full) layout: for a LoRA job
    /// the merged `ΔW` on the adapted modules and zeros elsewhere, so the next epoch's
    /// convergence compares like with like.
    pub delta: Option<Arc<Vec<f32>>>,
    /// `next` as safetensors.
    pub bytes: Vec<u8>,
}

/// How an epoch's deltas become an update of the model.
pub(crate) enum DeltaForm {
    /// Full-parameter deltas, in the model's layout: merged coordinate-wise.
    Full,
    /// LoRA adapters in `layout` (the trainer's delta layout): merged on each node's
    /// `ΔWᵢ = (alpha/r)·Bᵢ·Aᵢ`, module by module ([`crate::lora`]).
    Lora {
        /// The adapted modules, rank and alpha.
        plan: LoraPlan,
        /// The adapters' layout.
        layout: Arc<Layout>,
    },
}

impl DeltaForm {
    /// The form of `trainer`'s deltas; an error names a LoRA adapter the merge cannot
    /// read (a trainer whose adapter layout is not PEFT-named).
    pub(crate) fn of(trainer: &Trainer) -> Result<DeltaForm, String> {
        match LoraPlan::of_trainer(trainer) {
            Ok(None) => Ok(DeltaForm::Full),
            Ok(Some(plan)) => Ok(DeltaForm::Lora {
                plan,
                layout: trainer.delta_layout(),
            }),
            Err(e) => Err(format!("the job's LoRA adapter cannot be merged: {e}")),
        }
    }
}

/// One aggregator's try at an epoch's update.
enum Attempt {
    /// The next checkpoint `base + outer_lr·update` and the update, in the model's layout.
    Applied {
        /// The next checkpoint.
        next: Weights,
        /// The merged update.
        update: Vec<f32>,
    },
    /// Nothing to merge.
    Keep(KeepReason),
    /// The aggregator (or the LoRA merge's input checks) refused the inputs.
    Failed(String),
    /// The merged update does not give a finite model.
    Unusable(String),
}

/// Merges `inputs` with `aggregator` and `weights` and applies the result to `base` with
/// `outer_lr`: a full-parameter update coordinate-wise ([`Aggregator::merge`], then
/// [`Weights::add_scaled`]); a LoRA epoch on the adapters' updates
/// ([`apply_lora_merge_with_update`]: one module at a time, besides `next` and the
/// full-layout update only the merge's module scratch is held).
fn attempt(
    base: &Weights,
    form: &DeltaForm,
    inputs: &[MergeInput],
    aggregator: &dyn Aggregator,
    weights: &[f32],
    outer_lr: f32,
) -> Attempt {
    match form {
        DeltaForm::Full => {
            let refs: Vec<&[f32]> = inputs.iter().map(|i| i.delta.as_slice()).collect();
            let mut out = vec![0.0f32; base.data.len()];
            match aggregator.merge(&refs, weights, &mut out) {
                Ok(MergeOutcome::Merged { .. }) => {}
                Ok(MergeOutcome::KeepPrevious { reason }) => return Attempt::Keep(reason),
                Err(e) => return Attempt::Failed(e.to_string()),
            }
            let mut next = base.clone();
            match next.add_scaled(&out, outer_lr) {
                Ok(()) => Attempt::Applied { next, update: out },
                Err(e) => Attempt::Unusable(e.to_string()),
            }
        }
        DeltaForm::Lora { plan, layout } => {
            let adapters: Vec<FlatAdapter<'_>> = inputs
                .iter()
                .map(|i| FlatAdapter::new(layout, &i.delta))
                .collect();
            let mut next = base.clone();
            let mut update = vec![0.0f32; base.data.len()];
            let merged = apply_lora_merge_with_update(
                &mut next,
                plan,
                &adapters,
                weights,
                aggregator,
                outer_lr,
                &mut update,
            );
            match merged {
                Ok(MergeOutcome::Merged { .. }) => Attempt::Applied { next, update },
                Ok(MergeOutcome::KeepPrevious { reason }) => Attempt::Keep(reason),
                Err(
                    e @ (LoraError::NonFiniteDelta { .. } | LoraError::NonFiniteWeights { .. }),
                ) => Attempt::Unusable(e.to_string()),
                Err(e) => Attempt::Failed(e.to_string()),
            }
        }
    }
}

/// Merges an epoch (paper §6, DESIGN §6) and applies it with the outer learning rate.
///
/// The weighted mean weighs each accepted delta by its input weight ([`star_weight`]) and
/// gives suspect ones weight 0 (a scaled delta in the right direction would otherwise still
/// steer the mean: its small weight times its large norm); the robust aggregator
/// (`robust_aggregator`, by default the coordinate-wise median; used alone when `robust`,
/// as [`star_epoch`] decides) takes every accepted delta with weight 1. A merge
/// whose checkpoint is not finite or raises the validation loss by more than
/// [`merge_limit`] (2 % above the job's best checkpoint, at most the base) is not
/// published: the weighted mean falls back to the robust one, and
/// when that fails too the epoch keeps the base checkpoint and says why. Nothing here fails
/// the job.
///
/// A LoRA job's deltas (adapters) are merged on their updates `ΔWᵢ`, never on the factors
/// ([`crate::lora`]): the next checkpoint is the full model `base + outer_lr·ΔW` with every
/// unadapted tensor unchanged, and [`Merged::delta`] the merged `ΔW` in the full layout.
#[allow(clippy::too_many_arguments)] // the epoch's inputs; a struct would only rename them
pub(crate) fn merge_epoch(
    base: &Arc<Weights>,
    trainer: &Trainer,
    loss_before: f64,
    inputs: &[MergeInput],
    robust: bool,
    robust_aggregator: RobustAggregator,
    outer_lr: f32,
    rejected_all: bool,
    best_loss: Option<f64>,
) -> Merged {
    let scored: Vec<f32> = inputs
        .iter()
        .map(|i| if i.suspect { 0.0 } else { i.weight })
        .collect();
    let every = vec![1.0f32; inputs.len()];
    let fallback = robust_aggregator.build(inputs.len());
    let plans: Vec<(&dyn Aggregator, &[f32])> = if robust {
        vec![(fallback.as_ref(), &every)]
    } else {
        vec![(&WeightedMean, &scored), (fallback.as_ref(), &every)]
    };
    let keep = |reason: String| Merged {
        next: base.clone(),
        loss_after: loss_before,
        aggregator: None,
        kept: Some(reason),
        delta: None,
        bytes: base.to_safetensors(),
    };
    let form = match DeltaForm::of(trainer) {
        Ok(f) => f,
        Err(why) => {
            tracing::warn!(reason = %why, "merge refused");
            return keep(why);
        }
    };
    let mut why = if rejected_all {
        "every delta was rejected".to_string()
    } else {
        KeepReason::NoDeltas.to_string()
    };
    for (aggregator, weights) in plans {
        let name = aggregator.name();
        let loss = match attempt(base, &form, inputs, aggregator, weights, outer_lr) {
            Attempt::Applied { next, update } => match trainer.validation_loss(&next) {
                Ok(l) => Ok((l, next, update)),
                Err(e) => Err(e.to_string()),
            },
            Attempt::Keep(reason) => {
                if !(rejected_all && reason == KeepReason::NoDeltas) {
                    why = reason.to_string();
                }
                continue;
            }
            Attempt::Failed(e) => {
                why = format!("{name} merge failed: {e}");
                continue;
            }
            Attempt::Unusable(e) => Err(e),
        };
        let limit = merge_limit(loss_before, best_loss);
        match loss {
            Ok((l, next, update)) if l <= limit => {
                return Merged {
                    bytes: next.to_safetensors(),
                    next: Arc::new(next),
                    loss_after: l,
                    aggregator: Some(name),
                    kept: None,
                    delta: Some(Arc::new(update)),
                };
            }
            Ok((l, ..)) => why = refused_loss(name, loss_before, best_loss, l),
            Err(e) => why = format!("the {name} merge is not a usable model: {e}"),
        }
        tracing::warn!(reason = %why, "merge refused");
    }
    keep(why)
}

/// The epoch keeps `base`: nothing merged, the loss unchanged, `why` reported.
pub(crate) fn kept_base(base: &Arc<Weights>, loss_before: f64, why: String) -> Merged {
    Merged {
        next: base.clone(),
        loss_after: loss_before,
        aggregator: None,
        kept: Some(why),
        delta: None,
        bytes: base.to_safetensors(),
    }
}

#[cfg(test)]
pub(crate) mod tests;
