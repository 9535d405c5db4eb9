//! Centered clipping (Karimireddy, He, Jaggi 2021, "Learning from History for Byzantine
//! Robust Optimization", ICML).

use super::krum::add_sq_dists;
use super::mean::MEAN_BLOCK;
use super::par::{for_each_chunk, map_ranges, threads_for};
use super::{validate, Aggregator, CoordinateMedian, MergeError, MergeOutcome};

/// Centered clipping (Karimireddy et al. 2021, the "Centered Clipping" aggregator, CC):
/// starting from a centre `v₀`, repeat `L` times
///
/// `v ← v + Σᵢ pᵢ · (dᵢ − v) · min(1, τ / ‖dᵢ − v‖)`
///
/// over the N deltas of non-zero weight, with `pᵢ = wᵢ / Σ w` (equal weights give the
/// paper's `1/N`); `out = v`. Each delta moves the centre by at most `pᵢ·τ` per iteration,
/// so a few huge (Byzantine) deltas cannot drag it far.
///
/// Choices where the paper leaves room (it clips around the previous round's momentum,
/// which a single merge does not have):
/// - `v₀` is the coordinate-wise [`CoordinateMedian`] of the participating deltas (a robust
///   start, so one iteration already suffices against a minority of outliers).
/// - `τ` is [`tau`](Self::tau) when given (same unit as the deltas: an L2 norm over all
///   `len` coordinates), else the median of the distances `‖dᵢ − v₀‖` (mean of the two
///   middle ones for even N), fixed for all iterations: at least half the deltas are not
///   clipped in the first step. `τ = 0` (half the deltas equal the median) keeps `v₀`.
/// - A distance of 0 (or not above τ) means no clipping.
///
/// Distances are accumulated in `f32` per chunk of coordinates and in `f64` across chunks;
/// the centre is kept in `f32` in `out`. Cost: the median plus `2L` passes over the deltas
/// (the first distances are shared with the derivation of τ), split over threads.
///
/// # Errors
///
/// [`MergeError::BadParameter`] for a given `τ` that is not finite and `> 0`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CenteredClipping {
    /// Iterations `L` (default 3; 0 returns `v₀`, the median).
    pub iterations: usize,
    /// The clipping radius `τ` (L2 norm, the deltas' unit), or `None` to derive it per
    /// merge as the median distance to `v₀`.
    pub tau: Option<f32>,
}

impl Default for CenteredClipping {
    fn default() -> Self {
        CenteredClipping {
            iterations: 3,
            tau: None,
        }
    }
}

/// Coordinates per chunk of the distance pass.
const DIST_CHUNK: usize = 4096;

/// `‖rowsᵢ − v‖²` over the coordinates `range`, for every row.
#[inline(always)]
fn dists_range_portable(rows: &[&[f32]], v: &[f32], range: std::ops::Range<usize>) -> Vec<f64> {
    let n = rows.len();
    let mut d = vec![0.0f64; n];
    let mut s = range.start;
    while s < range.end {
        let e = (s + DIST_CHUNK).min(range.end);
        add_sq_dists(&v[s..e], rows, s, e, &mut d);
        s = e;
    }
    d
}

/// `v[j] += Σᵢ aᵢ·(rowsᵢ[start + j] − v[j])` over `v` (a chunk of the centre that starts
/// at coordinate `start`), in L1-sized blocks.
#[inline(always)]
fn update_portable(rows: &[&[f32]], a: &[f32], start: usize, v: &mut [f32]) {
    let mut acc = vec![0.0f32; MEAN_BLOCK.min(v.len())];
    for (b, blk) in v.chunks_mut(MEAN_BLOCK).enumerate() {
        let s = start + b * MEAN_BLOCK;
        let acc = &mut acc[..blk.len()];
        acc.fill(0.0);
        for (row, &c) in rows.iter().zip(a) {
            if c == 0.0 {
                continue;
            }
            let x = &row[s..s + blk.len()];
            for ((acc, &x), &v) in acc.iter_mut().zip(x).zip(blk.iter()) {
                *acc += c * (x - v);
            }
        }
        for (v, &acc) in blk.iter_mut().zip(acc.iter()) {
            *v += acc;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use super::*;

    #[target_feature(enable = "avx512f")]
    pub(super) fn dists_avx512(
        rows: &[&[f32]],
        v: &[f32],
        range: std::ops::Range<usize>,
    ) -> Vec<f64> {
        dists_range_portable(rows, v, range)
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn dists_avx2(
        rows: &[&[f32]],
        v: &[f32],
        range: std::ops::Range<usize>,
    ) -> Vec<f64> {
        dists_range_portable(rows, v, range)
    }

    #[target_feature(enable = "avx512f")]
    pub(super) fn update_avx512(rows: &[&[f32]], a: &[f32], start: usize, v: &mut [f32]) {
        update_portable(rows, a, start, v)
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn update_avx2(rows: &[&[f32]], a: &[f32], start: usize, v: &mut [f32]) {
        update_portable(rows, a, start, v)
    }
}

fn dists_range(rows: &[&[f32]], v: &[f32], range: std::ops::Range<usize>) -> Vec<f64> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports AVX-512F, checked just above.
            return unsafe { simd::dists_avx512(rows, v, range) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            return unsafe { simd::dists_avx2(rows, v, range) };
        }
    }
    dists_range_portable(rows, v, range)
}

fn update(rows: &[&[f32]], a: &[f32], start: usize, v: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports AVX-512F, checked just above.
            return unsafe { simd::update_avx512(rows, a, start, v) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            return unsafe { simd::update_avx2(rows, a, start, v) };
        }
    }
    update_portable(rows, a, start, v)
}

/// `‖rowsᵢ − v‖` for every row (L2 norms, `f64`), split over `threads`.
fn distances(rows: &[&[f32]], v: &[f32], threads: usize) -> Vec<f64> {
    let parts = map_ranges(v.len(), threads, DIST_CHUNK, |r| dists_range(rows, v, r));
    let mut d = vec![0.0f64; rows.len()];
    for p in parts {
        for (x, y) in d.iter_mut().zip(p) {
            *x += y;
        }
    }
    d.into_iter().map(f64::sqrt).collect()
}

/// The median of `xs` (mean of the two middle values for an even count; NaN ranks last).
fn median_of(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    0.5 * (xs[(n - 1) / 2] + xs[n / 2])
}

impl CenteredClipping {
    /// The clipping factor `min(1, τ / r)` (1 for `r <= τ`, including `r = 0`).
    fn factor(tau: f64, r: f64) -> f64 {
        if r <= tau {
            1.0
        } else {
            tau / r
        }
    }
}

impl Aggregator for CenteredClipping {
    fn name(&self) -> &'static str {
        "centered_clipping"
    }

    fn merge(
        &self,
        deltas: &[&[f32]],
        weights: &[f32],
        out: &mut [f32],
    ) -> Result<MergeOutcome, MergeError> {
        if let Some(tau) = self.tau {
            if !(tau.is_finite() && tau > 0.0) {
                return Err(MergeError::BadParameter {
                    name: "tau",
                    value: f64::from(tau),
                    expected: "must be finite and > 0",
                });
            }
        }
        let (used, sum) = match validate(deltas, weights, out.len())? {
            Ok(v) => v,
            Err(reason) => return Ok(MergeOutcome::KeepPrevious { reason }),
        };
        let n = used.len();
        let rows: Vec<&[f32]> = used.iter().map(|&i| deltas[i]).collect();
        let p: Vec<f64> = used.iter().map(|&i| f64::from(weights[i]) / sum).collect();
        CoordinateMedian.merge(&rows, &vec![1.0; n], out)?;
        if self.iterations == 0 {
            return Ok(MergeOutcome::Merged {
                aggregator: self.name(),
                used: n,
            });
        }
        let threads = threads_for(n, out.len());
        let mut r = distances(&rows, out, threads);
        let tau = match self.tau {
            Some(t) => f64::from(t),
            None => median_of(r.clone()),
        };
        for it in 0..self.iterations {
            if it > 0 {
                r = distances(&rows, out, threads);
            }
            let a: Vec<f32> = p
                .iter()
                .zip(&r)
                .map(|(&p, &r)| (p * Self::factor(tau, r)) as f32)
                .collect();
            for_each_chunk(out, threads, MEAN_BLOCK, |start, v| {
                update(&rows, &a, start, v)
            });
        }
        Ok(MergeOutcome::Merged {
            aggregator: self.name(),
            used: n,
        })
    }
}
