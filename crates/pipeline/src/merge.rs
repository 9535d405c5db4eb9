//! Merging an epoch's accepted deltas into one (DESIGN §6 "Merge", paper §6 "Checkpoint
//! Aggregation", DESIGN §12).
//!
//! Every aggregator works on contiguous `f32` buffers: one flattened delta per node, all of
//! the same length `len` (parameters, not bytes), written into a caller-provided `out` of
//! that same length. Nothing of size N×len is allocated per call: the order-statistic
//! aggregators gather N rows of 16 or 32 coordinates at a time, Krum holds an N×N distance
//! matrix per thread, centered clipping N distances.
//!
//! - [`WeightedMean`]: the paper's `merge_deltas`, `out = Σ wᵢ·dᵢ / Σ wᵢ`, weights = the
//!   composite scores (DESIGN §6). When `Σ wᵢ = 0` the epoch keeps the previous checkpoint
//!   and says so ([`MergeOutcome::KeepPrevious`], DESIGN §12) instead of dividing by zero.
//! - [`CoordinateMedian`] and [`TrimmedMean`]: the Byzantine-robust replacements the paper
//!   names ("coordinate-wise median can replace weighted average when >30 % of nodes are
//!   suspected adversarial"); [`RobustPolicy`] makes that choice.
//! - [`Krum`] (and Multi-Krum): selects the deltas closest to their neighbours (Blanchard et
//!   al. 2017) and averages them.
//! - [`CenteredClipping`]: moves a robust centre by the clipped differences to it
//!   (Karimireddy, He, Jaggi 2021).
//! - [`RobustAggregator`]: the configurable choice of the robust aggregator.
//!
//! Merging is coordinate-wise for the mean, the median and the trimmed mean, so a caller may
//! split the buffers into disjoint ranges and merge them on several threads. The median, the
//! trimmed mean, Krum's distances and centered clipping's passes also split large inputs
//! over [`std::thread::available_parallelism`] threads themselves (scoped threads, at least
//! [`PAR_MIN_FLOATS`] input floats each; a process pinned to one core runs them inline).
//!
//! Conventions shared by all aggregators:
//! - `weights[i]` belongs to `deltas[i]`; weights must be finite and `>= 0`.
//! - A delta with weight `0` takes no part in the merge (for the median and the trimmed mean
//!   too, which otherwise ignore the weights).
//! - No deltas at all, or no delta with a non-zero weight, is not an error: the outcome is
//!   [`MergeOutcome::KeepPrevious`] and `out` is left untouched.
//! - Inputs are expected to be free of NaN/Inf (the format check of DESIGN §6 rejects them);
//!   if some slip through, the result for those coordinates is unspecified but nothing panics
//!   (Krum ranks a delta whose score is NaN last).

use std::fmt::{self, Debug};

mod clipping;
mod krum;
mod mean;
mod order;
mod par;
mod policy;
#[cfg(test)]
mod tests;

pub use clipping::CenteredClipping;
pub use krum::Krum;
pub use mean::WeightedMean;
pub use order::{CoordinateMedian, TrimmedMean};
pub use policy::{RobustAggregator, RobustPolicy};

/// The least input (`N × len` floats) worth one more thread: below `2 × PAR_MIN_FLOATS`
/// every aggregator runs on the calling thread.
pub const PAR_MIN_FLOATS: usize = 1 << 22;

/// Why an aggregator could not merge.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MergeError {
    /// `deltas` and `weights` have different lengths.
    #[error("{deltas} deltas but {weights} weights")]
    WeightCount {
        /// Number of deltas.
        deltas: usize,
        /// Number of weights.
        weights: usize,
    },
    /// A delta's length differs from the output's.
    #[error("delta {index} has {found} parameters, expected {expected} (the output length)")]
    LengthMismatch {
        /// Index of the offending delta.
        index: usize,
        /// The output length, in parameters.
        expected: usize,
        /// The delta's length, in parameters.
        found: usize,
    },
    /// A weight is negative, NaN or infinite.
    #[error("weight {index} is {weight}: weights must be finite and non-negative")]
    BadWeight {
        /// Index of the offending weight.
        index: usize,
        /// Its value.
        weight: f32,
    },
    /// A [`TrimmedMean`] fraction outside `[0, 0.5)`.
    #[error("trim fraction {0} is outside [0, 0.5)")]
    BadTrim(f32),
    /// An aggregator parameter outside its domain (e.g. a [`CenteredClipping`] radius that
    /// is not finite and positive, a Byzantine fraction outside `[0, 1)`).
    #[error("{name} is {value}: {expected}")]
    BadParameter {
        /// The parameter.
        name: &'static str,
        /// Its value.
        value: f64,
        /// What it must be.
        expected: &'static str,
    },
}

/// Why an epoch keeps the previous checkpoint instead of merging.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeepReason {
    /// The epoch has no accepted deltas.
    NoDeltas,
    /// Every delta's weight (composite score) is zero (DESIGN §12).
    AllWeightsZero,
}

impl fmt::Display for KeepReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KeepReason::NoDeltas => "no deltas to merge",
            KeepReason::AllWeightsZero => "every delta's weight is zero",
        })
    }
}

/// What a merge did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MergeOutcome {
    /// `out` holds the merged delta.
    Merged {
        /// The aggregator's name ([`Aggregator::name`]).
        aggregator: &'static str,
        /// How many deltas took part (those with a non-zero weight).
        used: usize,
    },
    /// Nothing was merged and `out` was not touched: the epoch keeps the previous checkpoint
    /// (DESIGN §12) and reports the reason.
    KeepPrevious {
        /// Why.
        reason: KeepReason,
    },
}

/// Merges N flattened deltas of equal length into `out`.
pub trait Aggregator: Send + Sync + Debug {
    /// A short stable name for logs and metrics (`"weighted_mean"`, `"median"`, …).
    fn name(&self) -> &'static str;

    /// Merges `deltas` (N slices of `out.len()` parameters each) with per-delta `weights`
    /// (length N, finite, `>= 0`) into `out`. On [`MergeOutcome::KeepPrevious`] and on error
    /// `out` is left untouched.
    fn merge(
        &self,
        deltas: &[&[f32]],
        weights: &[f32],
        out: &mut [f32],
    ) -> Result<MergeOutcome, MergeError>;
}

/// Checks shapes and weights; returns the indices of the deltas that take part (non-zero
/// weight) and the weight sum in `f64`, or the reason to keep the previous checkpoint.
fn validate(
    deltas: &[&[f32]],
    weights: &[f32],
    len: usize,
) -> Result<Result<(Vec<usize>, f64), KeepReason>, MergeError> {
    if deltas.len() != weights.len() {
        return Err(MergeError::WeightCount {
            deltas: deltas.len(),
            weights: weights.len(),
        });
    }
    for (index, d) in deltas.iter().enumerate() {
        if d.len() != len {
            return Err(MergeError::LengthMismatch {
                index,
                expected: len,
                found: d.len(),
            });
        }
    }
    let mut sum = 0.0f64;
    let mut used = Vec::with_capacity(weights.len());
    for (index, &weight) in weights.iter().enumerate() {
        if !weight.is_finite() || weight < 0.0 {
            return Err(MergeError::BadWeight { index, weight });
        }
        if weight > 0.0 {
            used.push(index);
            sum += f64::from(weight);
        }
    }
    if deltas.is_empty() {
        return Ok(Err(KeepReason::NoDeltas));
    }
    if used.is_empty() {
        return Ok(Err(KeepReason::AllWeightsZero));
    }
    Ok(Ok((used, sum)))
}
