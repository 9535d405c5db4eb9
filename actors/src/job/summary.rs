//! [`EpochSummary`]: what one epoch's aggregation did, in the few numbers an operator reads
//! in `hanzod job status` and `job watch` (DESIGN §5, §6). The full per-delta report, with
//! the revealed spot-check secret and the slashing evidence, stays with the sink
//! (`hanzod_pipeline::sink::EpochReport`); this is the part the job records in the event
//! log with its checkpoint, so it survives a restart and a failover.
//!
//! [`progress`] reads a job's summaries as a whole: whether its training improved the
//! model, stopped improving, got worse or never trained ([`Progress`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::types::GymWei;

/// Whether an epoch moved the model (DESIGN §6, §12).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum EpochOutcome {
    /// The merged delta was applied: the checkpoint advanced.
    Advanced {
        /// The aggregator that merged it (`weighted-mean`, `coordinate-median`, …).
        aggregator: String,
    },
    /// Nothing was applied: the epoch republished its base checkpoint (same CID).
    Kept {
        /// Why, in words (no deltas, every delta rejected, every weight zero, the merge
        /// would raise the validation loss, …).
        reason: String,
    },
}

impl Default for EpochOutcome {
    fn default() -> Self {
        EpochOutcome::Kept {
            reason: "not reported".into(),
        }
    }
}

/// One epoch's aggregation, as recorded with its checkpoint
/// ([`crate::job::JobEvent::CheckpointPublished`]).
///
/// Counts are of the epoch's delivered deltas: `accepted + rejected` is every delta
/// validated; `suspect ⊆ accepted`. Losses are the job's validation loss (the recipe's own
/// unit: mean squared error for `wine-mlp`, nats/token for language models). Rewards and
/// slashes are those recorded when the checkpoint was published; a settlement that failed
/// then (see `settlement_error`) is retried by the sink and shows on the ledger.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EpochSummary {
    /// Advanced, or kept and why.
    pub outcome: EpochOutcome,
    /// Validation loss of the base checkpoint.
    pub loss_before: f64,
    /// Validation loss of the published checkpoint (`loss_before` when kept).
    pub loss_after: f64,
    /// Deltas that passed validation (signature, step, format, spot-check).
    pub accepted: u32,
    /// Accepted deltas marked suspect by their quality score (weight 0 in the weighted
    /// mean; they count towards the robust-merge threshold).
    pub suspect: u32,
    /// Deltas rejected.
    pub rejected: u32,
    /// Deltas selected for a spot-check (re-execution).
    pub spot_checked: u32,
    /// Spot-checks failed (each is slashing evidence).
    pub spot_checks_failed: u32,
    /// Nodes paid for the epoch.
    pub rewarded_nodes: u32,
    /// Rewards paid, in total, GYM wei.
    pub rewards: GymWei,
    /// Nodes whose stake was slashed for the epoch.
    pub slashed_nodes: u32,
    /// Stake slashed, in total, GYM wei.
    pub slashed: GymWei,
    /// The Hugging Face repo id the checkpoint was published as, when a registry is set.
    pub repo: Option<String>,
    /// Why the model registry refused the checkpoint (it is published by CID either way).
    pub registry_error: Option<String>,
    /// Why recording the rewards, slashes or the publication record failed (retried).
    pub settlement_error: Option<String>,
}

impl EpochSummary {
    /// True when the epoch applied a merged delta.
    pub fn advanced(&self) -> bool {
        matches!(self.outcome, EpochOutcome::Advanced { .. })
    }

    /// The outcome in a few words ([`EpochOutcome`]'s display).
    pub fn outcome_line(&self) -> String {
        self.outcome.to_string()
    }
}

/// `advanced (weighted-mean)` or `kept the previous checkpoint: <reason>`: the one
/// wording of an epoch's outcome (the daemon's log, the demo and the CLI).
impl std::fmt::Display for EpochOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EpochOutcome::Advanced { aggregator } => write!(f, "advanced ({aggregator})"),
            EpochOutcome::Kept { reason } => write!(f, "kept the previous checkpoint: {reason}"),
        }
    }
}

/// What a job's training has done so far, over its summarised epochs ([`progress`]): the
/// one line `hanzod job status`, the end of `job watch` and the demo print.
///
/// Losses are the job's validation loss, in the recipe's own unit (mean squared error for
/// `wine-mlp`, nats/token for a language model), as in [`EpochSummary`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Progress {
    /// No epoch has been summarised yet (none published, or a job recorded before
    /// summaries existed).
    NotStarted,
    /// Every summarised epoch kept its base checkpoint: no merged delta was ever applied,
    /// the model is the initial one.
    NotTrained {
        /// The epochs summarised (all of them kept).
        epochs: u32,
    },
    /// At least one epoch applied a merged delta.
    Trained {
        /// Validation loss of the first summarised epoch's base checkpoint
        /// (its `loss_before`).
        start_loss: f64,
        /// The lowest `loss_after` of the summarised epochs (a NaN is never the best
        /// unless every loss is NaN).
        best_loss: f64,
        /// The epoch that published `best_loss`; the earliest one on a tie.
        best_epoch: u32,
        /// `loss_after` of the last summarised epoch.
        last_loss: f64,
        /// The last summarised epoch.
        last_epoch: u32,
        /// `best_epoch + 1` when epochs were summarised after the best one (training
        /// stopped improving after `best_epoch`: those epochs published nothing better);
        /// `None` when the last epoch is the best.
        stalled_since: Option<u32>,
    },
}

/// A job's [`Progress`] from its epoch summaries (`JobState::summaries`,
/// `JobView::summaries`: epoch → summary). Pure: the same summaries give the same answer
/// in the daemon, the CLI and the demo.
///
/// [`Progress::NotTrained`] when no epoch [advanced](EpochSummary::advanced); otherwise
/// [`Progress::Trained`], with the best epoch over every summarised epoch's `loss_after`
/// (kept epochs included: a kept epoch republishes its base, whose loss it measured).
pub fn progress(summaries: &BTreeMap<u32, EpochSummary>) -> Progress {
    let (Some((&first_epoch, first)), Some((&last_epoch, last))) =
        (summaries.first_key_value(), summaries.last_key_value())
    else {
        return Progress::NotStarted;
    };
    if !summaries.values().any(EpochSummary::advanced) {
        return Progress::NotTrained {
            epochs: u32::try_from(summaries.len()).unwrap_or(u32::MAX),
        };
    }
    // A NaN loss (a diverged evaluation) ranks last; ties keep the earliest epoch.
    let rank = |x: f64| if x.is_nan() { f64::INFINITY } else { x };
    let (mut best_epoch, mut best_loss) = (first_epoch, first.loss_after);
    for (&epoch, s) in summaries {
        if rank(s.loss_after) < rank(best_loss) {
            (best_epoch, best_loss) = (epoch, s.loss_after);
        }
    }
    Progress::Trained {
        start_loss: first.loss_before,
        best_loss,
        best_epoch,
        last_loss: last.loss_after,
        last_epoch,
        stalled_since: (last_epoch > best_epoch).then(|| best_epoch + 1),
    }
}

/// The validation loss of the job's best checkpoint among the epochs before `epoch`, from
/// its summaries: the lowest of every earlier summary's `loss_before` (each the loss of a
/// checkpoint the job published, or of the one it started from) and every advanced
/// epoch's `loss_after` (a kept epoch republished its base, already counted); NaN and ±∞
/// losses are not checkpoints anyone would keep. `None` when no earlier epoch is
/// summarised. The merge of `epoch` is bounded by it
/// (`hanzod_pipeline::epoch::merge_limit`, DESIGN §6); the summaries are in the event log,
/// so the bound survives a daemon restart and a failover, and an epoch missing from them
/// (a job recorded before summaries existed) still has its checkpoint counted through the
/// next epoch's `loss_before`.
pub fn best_loss_before(summaries: &BTreeMap<u32, EpochSummary>, epoch: u32) -> Option<f64> {
    summaries
        .range(..epoch)
        .flat_map(|(_, s)| [Some(s.loss_before), s.advanced().then_some(s.loss_after)])
        .flatten()
        .filter(|l| l.is_finite())
        .min_by(f64::total_cmp)
}

impl Progress {
    /// True when at least one epoch applied a merged delta.
    pub fn trained(&self) -> bool {
        matches!(self, Progress::Trained { .. })
    }
}

/// A loss as printed: 3 decimals, or 3 significant digits below 0.1 (`2.042`, `0.601`,
/// `0.0123`).
fn loss(x: f64) -> String {
    if !x.is_finite() || x == 0.0 || x.abs() >= 0.1 {
        return format!("{x:.3}");
    }
    // 0.0123: log10 = -1.9, so 4 decimals. At most 12 (a loss below 1e-10 reads 0.000…).
    let decimals = (2 - x.abs().log10().floor() as i64).clamp(3, 12) as usize;
    format!("{x:.decimals$}")
}

/// How far `x` is above `reference`: `+1.7 %` of it, or the difference in the loss's unit
/// when the reference is not positive.
fn above(x: f64, reference: f64) -> String {
    if reference > 0.0 {
        format!("{:+.1} %", (x - reference) / reference * 100.0)
    } else {
        format!("+{}", loss(x - reference))
    }
}

/// One line an operator understands:
///
/// ```text
/// not started: no epoch published yet
/// not trained: all 5 epochs kept their base checkpoint
/// trained: loss 2.042 → 0.601 (best, epoch 4)
/// trained: loss 2.042 → best 0.601 at epoch 4, no improvement since (last 0.611 at epoch 6, +1.7 % above the best)
/// trained but got worse: loss 2.042 → 2.310 at epoch 6 (+13.1 % above the start); best 1.950 at epoch 2, no improvement since
/// trained but got worse: loss 2.042 → 2.310 at epoch 6 (+13.1 % above the start); no epoch went below the start
/// ```
impl std::fmt::Display for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Progress::NotStarted => write!(f, "not started: no epoch published yet"),
            Progress::NotTrained { epochs: 1 } => {
                write!(f, "not trained: its one epoch kept its base checkpoint")
            }
            Progress::NotTrained { epochs } => {
                write!(
                    f,
                    "not trained: all {epochs} epochs kept their base checkpoint"
                )
            }
            Progress::Trained {
                start_loss,
                best_loss,
                best_epoch,
                last_loss,
                last_epoch,
                stalled_since,
            } => {
                let (start, best, last) = (loss(start_loss), loss(best_loss), loss(last_loss));
                if last_loss > start_loss {
                    write!(
                        f,
                        "trained but got worse: loss {start} → {last} at epoch {last_epoch} ({} \
                         above the start); ",
                        above(last_loss, start_loss)
                    )?;
                    return if best_loss < start_loss {
                        write!(f, "best {best} at epoch {best_epoch}, no improvement since")
                    } else {
                        write!(f, "no epoch went below the start")
                    };
                }
                match stalled_since {
                    None => write!(
                        f,
                        "trained: loss {start} → {last} (best, epoch {last_epoch})"
                    ),
                    Some(_) => write!(
                        f,
                        "trained: loss {start} → best {best} at epoch {best_epoch}, no improvement \
                         since (last {last} at epoch {last_epoch}, {} above the best)",
                        above(last_loss, best_loss)
                    ),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_written_before_a_field_existed_reads_with_its_default() {
        let s: EpochSummary = serde_json::from_str(r#"{"loss_before":1.5,"accepted":3}"#).unwrap();
        assert_eq!(s.loss_before, 1.5);
        assert_eq!(s.accepted, 3);
        assert!(!s.advanced());
        assert_eq!(s.rewards, GymWei(0));
    }

    #[test]
    fn outcome_lines_say_advanced_or_kept_and_why() {
        let mut s = EpochSummary {
            outcome: EpochOutcome::Advanced {
                aggregator: "coordinate-median".into(),
            },
            ..EpochSummary::default()
        };
        assert!(s.advanced());
        assert_eq!(s.outcome_line(), "advanced (coordinate-median)");
        s.outcome = EpochOutcome::Kept {
            reason: "every delta was rejected".into(),
        };
        assert!(!s.advanced());
        assert_eq!(
            s.outcome_line(),
            "kept the previous checkpoint: every delta was rejected"
        );
    }

    fn advanced(loss_before: f64, loss_after: f64) -> EpochSummary {
        EpochSummary {
            outcome: EpochOutcome::Advanced {
                aggregator: "weighted-mean".into(),
            },
            loss_before,
            loss_after,
            ..EpochSummary::default()
        }
    }

    fn kept(loss: f64) -> EpochSummary {
        EpochSummary {
            outcome: EpochOutcome::Kept {
                reason: "every delta was rejected".into(),
            },
            loss_before: loss,
            loss_after: loss,
            ..EpochSummary::default()
        }
    }

    fn job(epochs: Vec<EpochSummary>) -> BTreeMap<u32, EpochSummary> {
        (0..).zip(epochs).collect()
    }

    #[test]
    fn the_best_loss_before_an_epoch_counts_the_start_and_the_advanced_epochs_before_it() {
        let j = job(vec![
            advanced(1.0, 0.8),
            kept(0.8),
            advanced(0.8, 0.7),
            advanced(0.7, f64::NAN),
            advanced(0.7, 0.6),
        ]);
        assert_eq!(best_loss_before(&j, 0), None);
        assert_eq!(best_loss_before(&j, 1), Some(0.8));
        assert_eq!(best_loss_before(&j, 2), Some(0.8));
        assert_eq!(best_loss_before(&j, 3), Some(0.7));
        assert_eq!(best_loss_before(&j, 4), Some(0.7));
        assert_eq!(best_loss_before(&j, 5), Some(0.6));
        assert_eq!(best_loss_before(&j, 99), Some(0.6));
        // A merge that made things worse leaves the start as the best.
        let worse = job(vec![advanced(1.0, 1.01), advanced(1.01, 1.02)]);
        assert_eq!(best_loss_before(&worse, 2), Some(1.0));
        // Summaries that start late or miss an epoch: a checkpoint is still counted
        // through the next epoch's base (epoch 4's base is epoch 3's checkpoint, 1.2).
        let gaps: BTreeMap<u32, EpochSummary> =
            [(2, advanced(2.0, 1.5)), (4, advanced(1.2, 1.3))].into();
        assert_eq!(best_loss_before(&gaps, 2), None);
        assert_eq!(best_loss_before(&gaps, 3), Some(1.5));
        assert_eq!(best_loss_before(&gaps, 5), Some(1.2));
    }

    #[test]
    fn a_job_without_summaries_has_not_started() {
        let p = progress(&BTreeMap::new());
        assert_eq!(p, Progress::NotStarted);
        assert!(!p.trained());
        assert_eq!(p.to_string(), "not started: no epoch published yet");
    }

    #[test]
    fn a_job_whose_every_epoch_kept_its_base_was_not_trained() {
        let p = progress(&job(vec![kept(2.042); 5]));
        assert_eq!(p, Progress::NotTrained { epochs: 5 });
        assert!(!p.trained());
        assert_eq!(
            p.to_string(),
            "not trained: all 5 epochs kept their base checkpoint"
        );
        assert_eq!(
            progress(&job(vec![kept(2.042)])).to_string(),
            "not trained: its one epoch kept its base checkpoint"
        );
    }

    #[test]
    fn a_job_still_improving_ends_at_its_best() {
        let p = progress(&job(vec![
            advanced(2.042, 1.5),
            kept(1.5),
            advanced(1.5, 0.9),
            advanced(0.9, 0.7),
            advanced(0.7, 0.601),
        ]));
        assert_eq!(
            p,
            Progress::Trained {
                start_loss: 2.042,
                best_loss: 0.601,
                best_epoch: 4,
                last_loss: 0.601,
                last_epoch: 4,
                stalled_since: None,
            }
        );
        assert!(p.trained());
        assert_eq!(p.to_string(), "trained: loss 2.042 → 0.601 (best, epoch 4)");
    }

    #[test]
    fn a_job_that_stopped_improving_says_since_when_and_by_how_much() {
        let p = progress(&job(vec![
            advanced(2.042, 1.5),
            advanced(1.5, 1.1),
            advanced(1.1, 0.8),
            advanced(0.8, 0.7),
            advanced(0.7, 0.601),
            advanced(0.601, 0.62),
            advanced(0.62, 0.611),
        ]));
        assert_eq!(
            p,
            Progress::Trained {
                start_loss: 2.042,
                best_loss: 0.601,
                best_epoch: 4,
                last_loss: 0.611,
                last_epoch: 6,
                stalled_since: Some(5),
            }
        );
        assert_eq!(
            p.to_string(),
            "trained: loss 2.042 → best 0.601 at epoch 4, no improvement since \
             (last 0.611 at epoch 6, +1.7 % above the best)"
        );
    }

    #[test]
    fn kept_epochs_after_the_best_are_a_stall_and_ties_keep_the_earliest_epoch() {
        let p = progress(&job(vec![advanced(2.0, 1.0), kept(1.0), kept(1.0)]));
        assert_eq!(
            p,
            Progress::Trained {
                start_loss: 2.0,
                best_loss: 1.0,
                best_epoch: 0,
                last_loss: 1.0,
                last_epoch: 2,
                stalled_since: Some(1),
            }
        );
        assert_eq!(
            p.to_string(),
            "trained: loss 2.000 → best 1.000 at epoch 0, no improvement since \
             (last 1.000 at epoch 2, +0.0 % above the best)"
        );
    }

    #[test]
    fn a_job_that_ended_above_its_start_got_worse() {
        let p = progress(&job(vec![
            advanced(2.042, 1.95),
            advanced(1.95, 2.1),
            advanced(2.1, 2.31),
        ]));
        assert_eq!(
            p.to_string(),
            "trained but got worse: loss 2.042 → 2.310 at epoch 2 (+13.1 % above the start); \
             best 1.950 at epoch 0, no improvement since"
        );
        // Never below the start: the first merge already made it worse.
        let p = progress(&job(vec![advanced(2.042, 2.2), advanced(2.2, 2.31)]));
        assert_eq!(
            p.to_string(),
            "trained but got worse: loss 2.042 → 2.310 at epoch 1 (+13.1 % above the start); \
             no epoch went below the start"
        );
    }

    #[test]
    fn summaries_need_not_start_at_epoch_zero_nor_be_contiguous() {
        let map: BTreeMap<u32, EpochSummary> =
            [(3, advanced(0.04, 0.0123)), (7, advanced(0.0123, 0.0125))]
                .into_iter()
                .collect();
        let p = progress(&map);
        assert_eq!(
            p,
            Progress::Trained {
                start_loss: 0.04,
                best_loss: 0.0123,
                best_epoch: 3,
                last_loss: 0.0125,
                last_epoch: 7,
                stalled_since: Some(4),
            }
        );
        assert_eq!(
            p.to_string(),
            "trained: loss 0.0400 → best 0.0123 at epoch 3, no improvement since \
             (last 0.0125 at epoch 7, +1.6 % above the best)"
        );
    }

    #[test]
    fn a_nan_loss_is_never_the_best_and_a_zero_best_reads_as_a_difference() {
        let p = progress(&job(vec![
            advanced(1.0, f64::NAN),
            advanced(1.0, 0.5),
            advanced(0.5, f64::NAN),
        ]));
        assert!(matches!(
            p,
            Progress::Trained {
                best_epoch: 1,
                stalled_since: Some(2),
                ..
            }
        ));
        let p = progress(&job(vec![advanced(1.0, 0.0), advanced(0.0, 0.002)]));
        assert!(p
            .to_string()
            .ends_with("(last 0.00200 at epoch 1, +0.00200 above the best)"));
    }

    proptest::proptest! {
        #[test]
        fn progress_is_consistent_with_the_summaries(
            epochs in proptest::collection::btree_map(
                0u32..64,
                (proptest::bool::ANY, 0.0f64..10.0, 0.0f64..10.0),
                0..12,
            )
        ) {
            let map: BTreeMap<u32, EpochSummary> = epochs
                .iter()
                .map(|(&e, &(adv, before, after))| {
                    (e, if adv { advanced(before, after) } else { kept(before) })
                })
                .collect();
            let p = progress(&map);
            let any_advanced = map.values().any(EpochSummary::advanced);
            proptest::prop_assert_eq!(map.is_empty(), p == Progress::NotStarted);
            proptest::prop_assert_eq!(
                !map.is_empty() && !any_advanced,
                matches!(p, Progress::NotTrained { .. })
            );
            proptest::prop_assert_eq!(p.trained(), any_advanced);
            // The line is one line, never empty.
            let line = p.to_string();
            proptest::prop_assert!(!line.is_empty() && !line.contains('\n'));
            match p {
                Progress::NotStarted => {}
                Progress::NotTrained { epochs } => {
                    proptest::prop_assert_eq!(epochs as usize, map.len());
                }
                Progress::Trained {
                    start_loss,
                    best_loss,
                    best_epoch,
                    last_loss,
                    last_epoch,
                    stalled_since,
                } => {
                    let (first, last) = (map.first_key_value().unwrap(), map.last_key_value().unwrap());
                    proptest::prop_assert_eq!(start_loss, first.1.loss_before);
                    proptest::prop_assert_eq!((last_epoch, last_loss), (*last.0, last.1.loss_after));
                    proptest::prop_assert_eq!(map[&best_epoch].loss_after, best_loss);
                    proptest::prop_assert!(best_loss <= last_loss);
                    for (&e, s) in &map {
                        proptest::prop_assert!(best_loss <= s.loss_after);
                        // The earliest of the best.
                        if e < best_epoch {
                            proptest::prop_assert!(s.loss_after > best_loss);
                        }
                    }
                    proptest::prop_assert_eq!(
                        stalled_since,
                        (last_epoch != best_epoch).then_some(best_epoch + 1)
                    );
                    proptest::prop_assert_eq!(
                        line.starts_with("trained but got worse"),
                        last_loss > start_loss
                    );
                }
            }
        }
    }
}
