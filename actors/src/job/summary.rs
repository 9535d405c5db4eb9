//! [`EpochSummary`]: what one epoch's aggregation did, in the few numbers an operator reads
//! in `hanzod job status` and `job watch` (DESIGN §5, §6). The full per-delta report, with
//! the revealed spot-check secret and the slashing evidence, stays with the sink
//! (`hanzod_pipeline::sink::EpochReport`); this is the part the job records in the event
//! log with its checkpoint, so it survives a restart and a failover.

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
}
