//! Merging an epoch's accepted deltas into one (DESIGN §6 "Merge", paper §6 "Checkpoint
//! Aggregation", DESIGN §12).
//!
//! Every aggregator works on contiguous `f32` buffers: one flattened delta per node, all of
//! the same length `len` (parameters, not bytes), written into a caller-provided `out` of
//! that same length. Nothing of size N×len is allocated per call; the order-statistic
//! aggregators use one scratch block of at most [`SCRATCH_FLOATS`] floats (128 KiB).
//!
//! - [`WeightedMean`]: the paper's `merge_deltas`, `out = Σ wᵢ·dᵢ / Σ wᵢ`, weights = the
//!   composite scores (DESIGN §6). When `Σ wᵢ = 0` the epoch keeps the previous checkpoint
//!   and says so ([`MergeOutcome::KeepPrevious`], DESIGN §12) instead of dividing by zero.
//! - [`CoordinateMedian`] and [`TrimmedMean`]: the Byzantine-robust replacements the paper
//!   names ("coordinate-wise median can replace weighted average when >30 % of nodes are
//!   suspected adversarial"); [`RobustPolicy`] makes that choice.
//!
//! Merging is coordinate-wise, so a caller may split the buffers into disjoint ranges and
//! merge them on several threads; each aggregator itself is single-threaded.
//!
//! Conventions shared by all aggregators:
//! - `weights[i]` belongs to `deltas[i]`; weights must be finite and `>= 0`.
//! - A delta with weight `0` takes no part in the merge (for the median and the trimmed mean
//!   too, which otherwise ignore the weights).
//! - No deltas at all, or no delta with a non-zero weight, is not an error: the outcome is
//!   [`MergeOutcome::KeepPrevious`] and `out` is left untouched.
//! - Inputs are expected to be free of NaN/Inf (the format check of DESIGN §6 rejects them);
//!   if some slip through, the result for those coordinates is unspecified but nothing panics.

use std::fmt::{self, Debug};

/// Size of the scratch block the order-statistic aggregators gather into, in `f32`s
/// (128 KiB, sized to stay in L2 while the sorting network runs over it).
pub const SCRATCH_FLOATS: usize = 32 * 1024;

/// Coordinates per block for [`WeightedMean`]: 16 KiB of `out` that stays in L1 while every
/// delta streams over it once.
const MEAN_BLOCK: usize = 4096;

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

/// Score-weighted average, the paper's `merge_deltas` (paper §6; weights = composite
/// scores, DESIGN §6): `out[j] = Σᵢ wᵢ·dᵢ[j] / Σᵢ wᵢ`.
///
/// The normalised coefficients `wᵢ / Σ w` are computed in `f64` and applied in `f32`.
/// `out` is processed in L1-sized blocks; within a block the deltas are streamed one after
/// the other, four per pass, so each delta is read exactly once and `out` is written once
/// per block pass. `Σ w = 0` → [`MergeOutcome::KeepPrevious`] (DESIGN §12).
#[derive(Debug, Clone, Copy, Default)]
pub struct WeightedMean;

impl WeightedMean {
    /// `out = a·x`.
    fn scale(out: &mut [f32], x: &[f32], a: f32) {
        for (o, &x) in out.iter_mut().zip(x) {
            *o = a * x;
        }
    }

    /// `out += a·x + b·y + c·z + d·w`, element-wise; auto-vectorises (one load of `out`,
    /// four streams, one store per lane group).
    fn axpy4(out: &mut [f32], xs: [&[f32]; 4], cs: [f32; 4]) {
        const LANES: usize = 16;
        let n = out.len();
        let [x0, x1, x2, x3] = xs.map(|x| &x[..n]);
        let [c0, c1, c2, c3] = cs;
        let mut o = out.chunks_exact_mut(LANES);
        let mut it = x0
            .chunks_exact(LANES)
            .zip(x1.chunks_exact(LANES))
            .zip(x2.chunks_exact(LANES))
            .zip(x3.chunks_exact(LANES));
        for (oc, (((a, b), c), d)) in (&mut o).zip(&mut it) {
            for l in 0..LANES {
                oc[l] += c0 * a[l] + c1 * b[l] + c2 * c[l] + c3 * d[l];
            }
        }
        let done = n - o.into_remainder().len();
        for j in done..n {
            out[j] += c0 * x0[j] + c1 * x1[j] + c2 * x2[j] + c3 * x3[j];
        }
    }

    /// `out += a·x`, element-wise.
    fn axpy(out: &mut [f32], x: &[f32], a: f32) {
        const LANES: usize = 16;
        let x = &x[..out.len()];
        let mut o = out.chunks_exact_mut(LANES);
        let mut xi = x.chunks_exact(LANES);
        for (oc, xc) in (&mut o).zip(&mut xi) {
            for l in 0..LANES {
                oc[l] += a * xc[l];
            }
        }
        for (o, &x) in o.into_remainder().iter_mut().zip(xi.remainder()) {
            *o += a * x;
        }
    }
}

impl Aggregator for WeightedMean {
    fn name(&self) -> &'static str {
        "weighted_mean"
    }

    fn merge(
        &self,
        deltas: &[&[f32]],
        weights: &[f32],
        out: &mut [f32],
    ) -> Result<MergeOutcome, MergeError> {
        let (used, sum) = match validate(deltas, weights, out.len())? {
            Ok(v) => v,
            Err(reason) => return Ok(MergeOutcome::KeepPrevious { reason }),
        };
        let coef: Vec<(&[f32], f32)> = used
            .iter()
            .map(|&i| (deltas[i], (f64::from(weights[i]) / sum) as f32))
            .collect();
        let (first, rest) = coef.split_first().expect("validate returns at least one");
        for (b, blk) in out.chunks_mut(MEAN_BLOCK).enumerate() {
            let s = b * MEAN_BLOCK;
            let e = s + blk.len();
            Self::scale(blk, &first.0[s..e], first.1);
            let mut quads = rest.chunks_exact(4);
            for q in &mut quads {
                Self::axpy4(
                    blk,
                    [&q[0].0[s..e], &q[1].0[s..e], &q[2].0[s..e], &q[3].0[s..e]],
                    [q[0].1, q[1].1, q[2].1, q[3].1],
                );
            }
            for &(d, c) in quads.remainder() {
                Self::axpy(blk, &d[s..e], c);
            }
        }
        Ok(MergeOutcome::Merged {
            aggregator: self.name(),
            used: used.len(),
        })
    }
}

/// A comparator network that leaves the order statistics `lo..hi` of `n` inputs in rows
/// `lo..hi` (Batcher's odd–even merge sort, with the comparators that cannot affect those
/// rows pruned). Applied row-wise over a block of coordinates, every comparator is an
/// element-wise min/max over two contiguous rows, which vectorises; no data-dependent
/// branches.
#[derive(Debug, Clone)]
struct OrderNetwork {
    comparators: Vec<(usize, usize)>,
}

impl OrderNetwork {
    fn new(n: usize, lo: usize, hi: usize) -> Self {
        let mut all = Vec::new();
        let mut p = 1;
        while p < n {
            let mut k = p;
            while k >= 1 {
                let mut j = k % p;
                while j + k < n {
                    for i in 0..k.min(n - j - k) {
                        if (i + j) / (2 * p) == (i + j + k) / (2 * p) {
                            all.push((i + j, i + j + k));
                        }
                    }
                    j += 2 * k;
                }
                k /= 2;
            }
            p *= 2;
        }
        // Walk backwards keeping only comparators that feed a needed row.
        let mut needed = vec![false; n];
        needed[lo..hi].iter_mut().for_each(|x| *x = true);
        let mut comparators: Vec<(usize, usize)> = all
            .into_iter()
            .rev()
            .filter(|&(a, b)| {
                let keep = needed[a] || needed[b];
                if keep {
                    needed[a] = true;
                    needed[b] = true;
                }
                keep
            })
            .collect();
        comparators.reverse();
        OrderNetwork { comparators }
    }

    /// Runs the network over `scratch`, `n` rows of `stride` floats of which the first `m`
    /// are live. Uses 8-lane AVX2 min/max where the CPU has it (the default x86-64 target
    /// only assumes SSE2), the portable loop otherwise; both give identical results.
    fn apply(&self, scratch: &mut [f32], stride: usize, m: usize) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            unsafe { self.apply_avx2(scratch, stride, m) };
            return;
        }
        self.apply_portable(scratch, stride, m);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn apply_avx2(&self, scratch: &mut [f32], stride: usize, m: usize) {
        self.apply_portable(scratch, stride, m);
    }

    #[inline(always)]
    fn apply_portable(&self, scratch: &mut [f32], stride: usize, m: usize) {
        for &(a, b) in &self.comparators {
            let (left, right) = scratch.split_at_mut(b * stride);
            let ra = &mut left[a * stride..a * stride + m];
            let rb = &mut right[..m];
            for (x, y) in ra.iter_mut().zip(rb.iter_mut()) {
                let (p, q) = (*x, *y);
                *x = if q < p { q } else { p };
                *y = if q < p { p } else { q };
            }
        }
    }
}

/// Shared driver of the order-statistic aggregators: gathers blocks of coordinates of the
/// used deltas into a row-major scratch (row i = delta i), runs `net`, and lets `emit` write
/// the block of `out` from the ordered rows.
fn order_statistic_merge(
    deltas: &[&[f32]],
    used: &[usize],
    out: &mut [f32],
    net: &OrderNetwork,
    mut emit: impl FnMut(&[f32], usize, &mut [f32]),
) {
    let n = used.len();
    // Block width: rows of `stride` floats, n rows within SCRATCH_FLOATS, multiple of 16.
    let stride = ((SCRATCH_FLOATS / n) & !15).clamp(16, 4096);
    let mut scratch = vec![0.0f32; n * stride];
    let mut s = 0;
    for blk in out.chunks_mut(stride) {
        let m = blk.len();
        for (row, &i) in used.iter().enumerate() {
            scratch[row * stride..row * stride + m].copy_from_slice(&deltas[i][s..s + m]);
        }
        net.apply(&mut scratch, stride, m);
        emit(&scratch, stride, blk);
        s += m;
    }
}

/// Coordinate-wise median (paper §6: the Byzantine-robust replacement for the weighted
/// average; DESIGN §6): `out[j] = median{dᵢ[j] : wᵢ > 0}`; for an even count, the mean of
/// the two middle values. Weights are otherwise ignored.
///
/// Selection runs on blocks of coordinates gathered into a scratch (one row per delta) with
/// a pruned sorting network, so each step is a vectorised min/max over a whole block.
#[derive(Debug, Clone, Copy, Default)]
pub struct CoordinateMedian;

impl Aggregator for CoordinateMedian {
    fn name(&self) -> &'static str {
        "median"
    }

    fn merge(
        &self,
        deltas: &[&[f32]],
        weights: &[f32],
        out: &mut [f32],
    ) -> Result<MergeOutcome, MergeError> {
        let used = match validate(deltas, weights, out.len())? {
            Ok((used, _)) => used,
            Err(reason) => return Ok(MergeOutcome::KeepPrevious { reason }),
        };
        let n = used.len();
        let (lo, hi) = ((n - 1) / 2, n / 2);
        let net = OrderNetwork::new(n, lo, hi + 1);
        order_statistic_merge(deltas, &used, out, &net, |scratch, stride, blk| {
            let m = blk.len();
            let a = &scratch[lo * stride..lo * stride + m];
            if lo == hi {
                blk.copy_from_slice(a);
            } else {
                let b = &scratch[hi * stride..hi * stride + m];
                for ((o, &x), &y) in blk.iter_mut().zip(a).zip(b) {
                    // Halving is exact, so this is the correctly rounded mean and cannot
                    // overflow.
                    *o = 0.5 * x + 0.5 * y;
                }
            }
        });
        Ok(MergeOutcome::Merged {
            aggregator: self.name(),
            used: n,
        })
    }
}

/// Coordinate-wise trimmed mean (a Byzantine-robust alternative named in DESIGN §6): with
/// N deltas of non-zero weight and `k = floor(trim·N)`, drop the k smallest and k largest
/// values of each coordinate and average the remaining `N − 2k` (unweighted). `trim` is the
/// fraction cut from *each* end, in `[0, 0.5)`; `trim = 0` is the plain mean.
#[derive(Debug, Clone, Copy)]
pub struct TrimmedMean {
    /// Fraction trimmed from each end, in `[0, 0.5)` (e.g. `0.2`).
    pub trim: f32,
}

impl Default for TrimmedMean {
    fn default() -> Self {
        TrimmedMean { trim: 0.2 }
    }
}

impl Aggregator for TrimmedMean {
    fn name(&self) -> &'static str {
        "trimmed_mean"
    }

    fn merge(
        &self,
        deltas: &[&[f32]],
        weights: &[f32],
        out: &mut [f32],
    ) -> Result<MergeOutcome, MergeError> {
        if !(0.0..0.5).contains(&self.trim) {
            return Err(MergeError::BadTrim(self.trim));
        }
        let used = match validate(deltas, weights, out.len())? {
            Ok((used, _)) => used,
            Err(reason) => return Ok(MergeOutcome::KeepPrevious { reason }),
        };
        let n = used.len();
        let k = ((f64::from(self.trim) * n as f64).floor() as usize).min((n - 1) / 2);
        let kept = n - 2 * k;
        let net = if k == 0 {
            OrderNetwork {
                comparators: Vec::new(),
            }
        } else {
            OrderNetwork::new(n, k, n - k)
        };
        let scale = (1.0 / kept as f64) as f32;
        order_statistic_merge(deltas, &used, out, &net, |scratch, stride, blk| {
            let m = blk.len();
            blk.copy_from_slice(&scratch[k * stride..k * stride + m]);
            for r in k + 1..n - k {
                let row = &scratch[r * stride..r * stride + m];
                for (o, &x) in blk.iter_mut().zip(row) {
                    *o += x;
                }
            }
            for o in blk.iter_mut() {
                *o *= scale;
            }
        });
        Ok(MergeOutcome::Merged {
            aggregator: self.name(),
            used: n,
        })
    }
}

/// Chooses the aggregator for an epoch (paper §6, DESIGN §6): the robust one when *more
/// than* `suspect_threshold` of the epoch's deltas are suspect, the weighted mean otherwise.
#[derive(Debug)]
pub struct RobustPolicy {
    /// Fraction of suspect deltas above which the robust aggregator is used (default 0.30).
    pub suspect_threshold: f32,
    /// The robust aggregator (default [`CoordinateMedian`]).
    pub robust: Box<dyn Aggregator>,
    /// The normal aggregator.
    pub normal: WeightedMean,
}

impl Default for RobustPolicy {
    fn default() -> Self {
        RobustPolicy {
            suspect_threshold: 0.30,
            robust: Box::new(CoordinateMedian),
            normal: WeightedMean,
        }
    }
}

impl RobustPolicy {
    /// The aggregator for an epoch with `suspect` suspect deltas out of `total`:
    /// robust iff `total > 0` and `suspect / total > suspect_threshold`. A NaN threshold
    /// never selects the robust aggregator.
    pub fn choose(&self, suspect: usize, total: usize) -> &dyn Aggregator {
        if total > 0 && suspect as f64 > f64::from(self.suspect_threshold) * total as f64 {
            self.robust.as_ref()
        } else {
            &self.normal
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn refs(v: &[Vec<f32>]) -> Vec<&[f32]> {
        v.iter().map(|d| d.as_slice()).collect()
    }

    fn naive_weighted(deltas: &[Vec<f32>], w: &[f32]) -> Vec<f64> {
        let sum: f64 = w.iter().map(|&x| f64::from(x)).sum();
        (0..deltas[0].len())
            .map(|j| {
                deltas
                    .iter()
                    .zip(w)
                    .map(|(d, &w)| f64::from(w) * f64::from(d[j]))
                    .sum::<f64>()
                    / sum
            })
            .collect()
    }

    /// Sort-based reference over the values of one coordinate.
    fn sorted_column(deltas: &[Vec<f32>], j: usize) -> Vec<f64> {
        let mut c: Vec<f64> = deltas.iter().map(|d| f64::from(d[j])).collect();
        c.sort_by(|a, b| a.total_cmp(b));
        c
    }

    fn ref_median(deltas: &[Vec<f32>], j: usize) -> f64 {
        let c = sorted_column(deltas, j);
        let n = c.len();
        (c[(n - 1) / 2] + c[n / 2]) / 2.0
    }

    fn ref_trimmed(deltas: &[Vec<f32>], j: usize, trim: f32) -> f64 {
        let c = sorted_column(deltas, j);
        let n = c.len();
        let k = (f64::from(trim) * n as f64).floor() as usize;
        c[k..n - k].iter().sum::<f64>() / (n - 2 * k) as f64
    }

    fn close(a: f32, b: f64, tol: f64) -> bool {
        (f64::from(a) - b).abs() <= tol * (1.0 + b.abs())
    }

    fn deltas_strategy() -> impl Strategy<Value = (Vec<Vec<f32>>, Vec<f32>)> {
        (1usize..20, 0usize..300).prop_flat_map(|(n, len)| {
            (
                prop::collection::vec(prop::collection::vec(-1e3f32..1e3, len), n),
                prop::collection::vec(0.01f32..10.0, n),
            )
        })
    }

    proptest! {
        #[test]
        fn weighted_mean_matches_f64_reference((d, w) in deltas_strategy()) {
            let mut out = vec![0.0; d[0].len()];
            let r = WeightedMean.merge(&refs(&d), &w, &mut out).unwrap();
            prop_assert_eq!(r, MergeOutcome::Merged { aggregator: "weighted_mean", used: d.len() });
            for (j, e) in naive_weighted(&d, &w).into_iter().enumerate() {
                prop_assert!(close(out[j], e, 1e-4), "j={} got {} want {}", j, out[j], e);
            }
        }

        #[test]
        fn weighted_mean_scale_invariant((d, w) in deltas_strategy(), s in 0.001f32..1000.0) {
            let len = d[0].len();
            let (mut a, mut b) = (vec![0.0; len], vec![0.0; len]);
            WeightedMean.merge(&refs(&d), &w, &mut a).unwrap();
            let ws: Vec<f32> = w.iter().map(|x| x * s).collect();
            WeightedMean.merge(&refs(&d), &ws, &mut b).unwrap();
            for j in 0..len {
                prop_assert!(close(a[j], f64::from(b[j]), 1e-4), "{} vs {}", a[j], b[j]);
            }
        }

        #[test]
        fn median_matches_sort_reference((d, w) in deltas_strategy()) {
            let mut out = vec![0.0; d[0].len()];
            CoordinateMedian.merge(&refs(&d), &w, &mut out).unwrap();
            for (j, &o) in out.iter().enumerate() {
                prop_assert!(close(o, ref_median(&d, j), 1e-6), "j={} {} vs {}", j, o, ref_median(&d, j));
            }
        }

        #[test]
        fn trimmed_mean_matches_sort_reference((d, w) in deltas_strategy(), trim in 0.0f32..0.49) {
            let mut out = vec![0.0; d[0].len()];
            TrimmedMean { trim }.merge(&refs(&d), &w, &mut out).unwrap();
            for (j, &o) in out.iter().enumerate() {
                let e = ref_trimmed(&d, j, trim);
                prop_assert!(close(o, e, 1e-4), "j={} {} vs {}", j, o, e);
            }
        }

        #[test]
        fn never_panics(
            d in prop::collection::vec(prop::collection::vec(any::<f32>(), 0..5), 0..6),
            w in prop::collection::vec(any::<f32>(), 0..6),
            len in 0usize..5,
            trim in any::<f32>(),
        ) {
            let d = refs(&d);
            let aggs: [&dyn Aggregator; 3] = [&WeightedMean, &CoordinateMedian, &TrimmedMean { trim }];
            for a in aggs {
                let mut out = vec![0.0; len];
                let _ = a.merge(&d, &w, &mut out);
            }
        }
    }

    /// 0/1 principle: a network that orders every 0/1 input orders every input. Checks the
    /// full (unpruned) network for every n up to 12 exhaustively.
    #[test]
    fn network_sorts_all_zero_one_inputs() {
        for n in 1..=12usize {
            let net = OrderNetwork::new(n, 0, n);
            for bits in 0u32..(1 << n) {
                let mut v: Vec<f32> = (0..n).map(|i| ((bits >> i) & 1) as f32).collect();
                net.apply(&mut v, 1, 1);
                assert!(v.windows(2).all(|w| w[0] <= w[1]), "n={n} bits={bits:b}");
            }
        }
    }

    #[test]
    fn median_odd_and_even_exact() {
        let d = vec![vec![5.0, -1.0], vec![1.0, 7.0], vec![3.0, 2.0]];
        let mut out = [0.0; 2];
        CoordinateMedian
            .merge(&refs(&d), &[1.0; 3], &mut out)
            .unwrap();
        assert_eq!(out, [3.0, 2.0]);
        let d = vec![vec![5.0], vec![1.0], vec![3.0], vec![10.0]];
        let mut out = [0.0; 1];
        CoordinateMedian
            .merge(&refs(&d), &[1.0; 4], &mut out)
            .unwrap();
        assert_eq!(out, [4.0]);
    }

    #[test]
    fn median_large_n_and_long_buffers_match_reference() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for n in [2usize, 8, 33, 64] {
            let len = 10_000;
            let d: Vec<Vec<f32>> = (0..n)
                .map(|_| (0..len).map(|_| rng.gen_range(-1.0..1.0)).collect())
                .collect();
            let mut out = vec![0.0; len];
            CoordinateMedian
                .merge(&refs(&d), &vec![1.0; n], &mut out)
                .unwrap();
            for (j, &o) in out.iter().enumerate() {
                assert!(close(o, ref_median(&d, j), 1e-6), "n={n} j={j}");
            }
        }
    }

    #[test]
    fn zero_weight_deltas_are_excluded() {
        let d = vec![vec![1.0], vec![2.0], vec![1000.0]];
        let w = [1.0, 1.0, 0.0];
        let mut out = [0.0];
        let r = CoordinateMedian.merge(&refs(&d), &w, &mut out).unwrap();
        assert_eq!(
            r,
            MergeOutcome::Merged {
                aggregator: "median",
                used: 2
            }
        );
        assert_eq!(out, [1.5]);
        WeightedMean.merge(&refs(&d), &w, &mut out).unwrap();
        assert_eq!(out, [1.5]);
    }

    #[test]
    fn all_zero_weights_keep_previous_and_leave_out_untouched() {
        let d = vec![vec![1.0, 2.0], vec![3.0, 4.0]];
        let aggs: [&dyn Aggregator; 3] =
            [&WeightedMean, &CoordinateMedian, &TrimmedMean::default()];
        for a in aggs {
            let mut out = [42.0, -7.0];
            let r = a.merge(&refs(&d), &[0.0, 0.0], &mut out).unwrap();
            assert_eq!(
                r,
                MergeOutcome::KeepPrevious {
                    reason: KeepReason::AllWeightsZero
                }
            );
            assert_eq!(out, [42.0, -7.0], "{}", a.name());
        }
    }

    #[test]
    fn no_deltas_keep_previous() {
        let aggs: [&dyn Aggregator; 3] =
            [&WeightedMean, &CoordinateMedian, &TrimmedMean::default()];
        for a in aggs {
            let mut out = [9.0; 3];
            let r = a.merge(&[], &[], &mut out).unwrap();
            assert_eq!(
                r,
                MergeOutcome::KeepPrevious {
                    reason: KeepReason::NoDeltas
                }
            );
            assert_eq!(out, [9.0; 3]);
        }
    }

    #[test]
    fn trimmed_mean_trim_zero_is_plain_mean_and_drops_outliers() {
        let d = vec![vec![1.0, 10.0], vec![2.0, 20.0], vec![6.0, 30.0]];
        let mut out = [0.0; 2];
        TrimmedMean { trim: 0.0 }
            .merge(&refs(&d), &[1.0, 5.0, 9.0], &mut out)
            .unwrap();
        assert_eq!(out, [3.0, 20.0]);
        let d = vec![vec![-1e9], vec![1.0], vec![2.0], vec![3.0], vec![1e9]];
        TrimmedMean { trim: 0.2 }
            .merge(&refs(&d), &[1.0; 5], &mut out[..1])
            .unwrap();
        assert_eq!(out[0], 2.0);
    }

    #[test]
    fn byzantine_outliers_move_the_mean_but_not_the_median() {
        let x = 0.5f32;
        let len = 1000;
        let mut d: Vec<Vec<f32>> = (0..3)
            .map(|k| (0..len).map(|j| x + 1e-3 * ((j + k) % 7) as f32).collect())
            .collect();
        d.push(vec![1e6; len]);
        d.push(vec![-3e5; len]);
        let w = [1.0; 5];
        let (mut med, mut mean, mut trim) = (vec![0.0; len], vec![0.0; len], vec![0.0; len]);
        CoordinateMedian.merge(&refs(&d), &w, &mut med).unwrap();
        WeightedMean.merge(&refs(&d), &w, &mut mean).unwrap();
        TrimmedMean { trim: 0.2 }
            .merge(&refs(&d), &w, &mut trim)
            .unwrap();
        assert!(med.iter().all(|&v| (v - x).abs() < 0.01));
        assert!(trim.iter().all(|&v| (v - x).abs() < 0.01));
        assert!(mean.iter().all(|&v| (v - x).abs() > 1e4));
    }

    #[test]
    fn shape_and_weight_errors() {
        let d = vec![vec![1.0, 2.0], vec![3.0]];
        let mut out = [0.0; 2];
        let aggs: [&dyn Aggregator; 3] =
            [&WeightedMean, &CoordinateMedian, &TrimmedMean::default()];
        for a in aggs {
            assert_eq!(
                a.merge(&refs(&d), &[1.0, 1.0], &mut out),
                Err(MergeError::LengthMismatch {
                    index: 1,
                    expected: 2,
                    found: 1
                })
            );
            let ok = vec![vec![1.0, 2.0], vec![3.0, 4.0]];
            assert_eq!(
                a.merge(&refs(&ok), &[1.0], &mut out),
                Err(MergeError::WeightCount {
                    deltas: 2,
                    weights: 1
                })
            );
            for bad in [-1.0, f32::NAN, f32::INFINITY] {
                match a.merge(&refs(&ok), &[1.0, bad], &mut out) {
                    Err(MergeError::BadWeight { index: 1, .. }) => {}
                    other => panic!("{}: {other:?}", a.name()),
                }
            }
            assert_eq!(out, [0.0; 2]);
        }
        for trim in [-0.1, 0.5, f32::NAN] {
            assert!(matches!(
                TrimmedMean { trim }.merge(&refs(&d), &[1.0; 2], &mut out),
                Err(MergeError::BadTrim(_))
            ));
        }
    }

    #[test]
    fn policy_switches_above_threshold() {
        let p = RobustPolicy::default();
        assert_eq!(p.choose(0, 10).name(), "weighted_mean");
        assert_eq!(p.choose(3, 10).name(), "weighted_mean");
        assert_eq!(p.choose(4, 10).name(), "median");
        assert_eq!(p.choose(0, 0).name(), "weighted_mean");
        let t = RobustPolicy {
            robust: Box::new(TrimmedMean { trim: 0.2 }),
            ..RobustPolicy::default()
        };
        assert_eq!(t.choose(10, 10).name(), "trimmed_mean");
    }
}
