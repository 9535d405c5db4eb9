//! Krum and Multi-Krum (Blanchard, El Mhamdi, Guerraoui, Stainer 2017, "Machine Learning
//! with Adversaries: Byzantine Tolerant Gradient Descent", NeurIPS), and the blocked
//! squared-distance kernels they and [`super::CenteredClipping`] share.

use std::ops::Range;

use super::par::{map_ranges, threads_for};
use super::{validate, Aggregator, MergeError, MergeOutcome, WeightedMean};

/// Lanes of the distance kernels' `f32` partial sums (one 512-bit vector).
const DIST_LANES: usize = 16;

/// Squared L2 distance of `a` to each of four slices of `a.len()` floats: `f32` differences
/// and squares, 16 partial sums per slice, reduced in `f64`. The caller keeps `a.len()` to a
/// few thousand so the `f32` partials stay accurate (each sums at most `len / 16` squares).
#[inline(always)]
pub(super) fn sq_dist4(a: &[f32], b: [&[f32]; 4]) -> [f64; 4] {
    let n = a.len();
    let b = b.map(|x| &x[..n]);
    let (ac, ar) = a.as_chunks::<DIST_LANES>();
    let [b0, b1, b2, b3] = b.map(|x| x.as_chunks::<DIST_LANES>().0);
    // Four named accumulators over zipped chunks: vectorises (one vector per lane group).
    let [mut s0, mut s1, mut s2, mut s3] = [[0.0f32; DIST_LANES]; 4];
    for ((((x, y0), y1), y2), y3) in ac.iter().zip(b0).zip(b1).zip(b2).zip(b3) {
        for l in 0..DIST_LANES {
            let d0 = x[l] - y0[l];
            let d1 = x[l] - y1[l];
            let d2 = x[l] - y2[l];
            let d3 = x[l] - y3[l];
            s0[l] += d0 * d0;
            s1[l] += d1 * d1;
            s2[l] += d2 * d2;
            s3[l] += d3 * d3;
        }
    }
    let s = [s0, s1, s2, s3];
    let done = n - ar.len();
    let mut out = [0.0f64; 4];
    for ((o, acc), bt) in out.iter_mut().zip(&s).zip(&b) {
        *o = acc.iter().map(|&v| f64::from(v)).sum();
        for (&x, &y) in a[done..].iter().zip(&bt[done..]) {
            let d = x - y;
            *o += f64::from(d * d);
        }
    }
    out
}

/// Squared L2 distance of two slices of equal length (as [`sq_dist4`]).
#[inline(always)]
pub(super) fn sq_dist1(a: &[f32], b: &[f32]) -> f64 {
    let n = a.len();
    let b = &b[..n];
    let (ac, ar) = a.as_chunks::<DIST_LANES>();
    let bc = b.as_chunks::<DIST_LANES>().0;
    let mut acc = [0.0f32; DIST_LANES];
    for (x, y) in ac.iter().zip(bc) {
        for l in 0..DIST_LANES {
            let d = x[l] - y[l];
            acc[l] += d * d;
        }
    }
    let done = n - ar.len();
    let mut s: f64 = acc.iter().map(|&v| f64::from(v)).sum();
    for (&x, &y) in a[done..].iter().zip(&b[done..]) {
        let d = x - y;
        s += f64::from(d * d);
    }
    s
}

/// Adds `‖a − rowsₖ[s..e]‖²` into `out[k]` for every `k` (`a` is `e − s` long), four rows
/// per pass: the one distance kernel of Krum's pairs and centered clipping's distances to
/// the centre. Inlined into its callers, so it takes their target features.
#[inline(always)]
pub(super) fn add_sq_dists(a: &[f32], rows: &[&[f32]], s: usize, e: usize, out: &mut [f64]) {
    let n = rows.len();
    let mut k = 0;
    while k + 4 <= n {
        let p = sq_dist4(
            a,
            [
                &rows[k][s..e],
                &rows[k + 1][s..e],
                &rows[k + 2][s..e],
                &rows[k + 3][s..e],
            ],
        );
        for (t, v) in p.into_iter().enumerate() {
            out[k + t] += v;
        }
        k += 4;
    }
    for k in k..n {
        out[k] += sq_dist1(a, &rows[k][s..e]);
    }
}

/// Coordinates per chunk of the pairwise kernel: all `n` rows of a chunk (≤ 256 KiB) stay
/// in L2 while every pair is formed; at most 8192 so the `f32` partials stay accurate.
fn pair_chunk(n: usize) -> usize {
    ((1usize << 16) / n.max(1)).clamp(256, 8192) / 64 * 64
}

/// Adds the squared distances of every pair `i < j` of `rows` over the coordinates `range`
/// into `d[i·n + j]`, chunk by chunk (every pair per chunk), each row against four others
/// per pass.
#[inline(always)]
fn pairwise_range_portable(rows: &[&[f32]], range: Range<usize>) -> Vec<f64> {
    let n = rows.len();
    let chunk = pair_chunk(n);
    let mut d = vec![0.0f64; n * n];
    let mut s = range.start;
    while s < range.end {
        let e = (s + chunk).min(range.end);
        for i in 0..n {
            let out = &mut d[i * n + i + 1..(i + 1) * n];
            add_sq_dists(&rows[i][s..e], &rows[i + 1..], s, e, out);
        }
        s = e;
    }
    d
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn pairwise_range_avx512(rows: &[&[f32]], range: Range<usize>) -> Vec<f64> {
    pairwise_range_portable(rows, range)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn pairwise_range_avx2(rows: &[&[f32]], range: Range<usize>) -> Vec<f64> {
    pairwise_range_portable(rows, range)
}

fn pairwise_range(rows: &[&[f32]], range: Range<usize>) -> Vec<f64> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports AVX-512F, checked just above.
            return unsafe { pairwise_range_avx512(rows, range) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            return unsafe { pairwise_range_avx2(rows, range) };
        }
    }
    pairwise_range_portable(rows, range)
}

/// Squared L2 distances `‖rowsᵢ − rowsⱼ‖²` of every pair, as a symmetric `n × n` row-major
/// matrix with a zero diagonal. Blocked over coordinates (see [`pair_chunk`]); `f32` within
/// a chunk, `f64` across chunks; split over threads by coordinate range.
pub(super) fn pairwise_sq_dists(rows: &[&[f32]], len: usize) -> Vec<f64> {
    let n = rows.len();
    let threads = threads_for(n, len);
    let parts = map_ranges(len, threads, pair_chunk(n), |r| pairwise_range(rows, r));
    let mut d = vec![0.0f64; n * n];
    for p in parts {
        for (x, y) in d.iter_mut().zip(p) {
            *x += y;
        }
    }
    for i in 0..n {
        for j in 0..i {
            d[i * n + j] = d[j * n + i];
        }
    }
    d
}

/// Krum and Multi-Krum (Blanchard et al. 2017: the Krum rule and its Multi-Krum variant).
///
/// Over the N deltas of non-zero weight, each delta's score is the sum of the squared L2
/// distances to its `k = N − f − 2` nearest other deltas,
/// `score(i) = Σ_{j ∈ nearest_k(i)} ‖dᵢ − dⱼ‖²` (the paper's Krum score); the `m` deltas
/// with the lowest scores (ties: lower index first; a NaN score ranks last) are selected and
/// `out` is their mean, **weighted by their given weights** renormalised over the selection
/// (`Σ_{sel} wᵢ·dᵢ / Σ_{sel} wᵢ`, as [`WeightedMean`]). With the sink's robust weights (all
/// 1) that is the paper's plain mean; `m = 1` (Krum) returns the selected delta exactly.
///
/// The paper's guarantee needs `N > 2f + 2`. Below that (or for `f ≥ N`) the rule still
/// runs with `k` clamped to `[1, N − 1]` — it then picks the deltas with the closest
/// neighbours, with no Byzantine guarantee; `N = 1` returns that delta. `m` is clamped to
/// `[1, N]`.
///
/// Cost: the pairwise distances read each delta once per chunk of coordinates, forming all
/// `N(N−1)/2` pairs on data in L2, `O(N²·len)` flops, split over threads.
/// [`MergeOutcome::Merged::used`] counts every delta that was scored (N), not only the
/// selected ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Krum {
    /// The assumed number of Byzantine deltas `f`.
    pub f: usize,
    /// How many deltas are selected and averaged: `1` is Krum, more is Multi-Krum.
    pub m: usize,
}

impl Krum {
    /// Krum (one selected delta) assuming `f` Byzantine deltas.
    pub fn new(f: usize) -> Self {
        Krum { f, m: 1 }
    }

    /// Multi-Krum: `m` selected deltas assuming `f` Byzantine.
    pub fn multi(f: usize, m: usize) -> Self {
        Krum { f, m }
    }

    /// Krum for `n` deltas of which a fraction `byzantine` (in `[0, 1)`) may be Byzantine:
    /// `f = floor(byzantine · n)`, `m` = `select`, or `n − f` (at least 1) when `None`
    /// (Multi-Krum's usual choice).
    ///
    /// # Errors
    ///
    /// [`MergeError::BadParameter`] for a fraction outside `[0, 1)` (NaN included).
    pub fn from_fraction(
        byzantine: f32,
        n: usize,
        select: Option<usize>,
    ) -> Result<Self, MergeError> {
        if !(0.0..1.0).contains(&byzantine) {
            return Err(MergeError::BadParameter {
                name: "byzantine_fraction",
                value: f64::from(byzantine),
                expected: "must be in [0, 1)",
            });
        }
        let f = (f64::from(byzantine) * n as f64).floor() as usize;
        Ok(Krum {
            f,
            m: select.unwrap_or(n.saturating_sub(f)).max(1),
        })
    }

    /// The neighbour count `k` for `n` scored deltas (see the type's doc).
    pub fn neighbours(&self, n: usize) -> usize {
        if n < 2 {
            return 0;
        }
        n.saturating_sub(self.f.saturating_add(2)).clamp(1, n - 1)
    }

    /// Scores from a pairwise squared-distance matrix (`n × n`, row-major): the sum of the
    /// `k` smallest off-diagonal entries of each row, NaN distances counted as `+∞`.
    pub(super) fn scores_from(&self, d: &[f64], n: usize) -> Vec<f64> {
        let k = self.neighbours(n);
        let mut row = Vec::with_capacity(n);
        (0..n)
            .map(|i| {
                row.clear();
                row.extend((0..n).filter(|&j| j != i).map(|j| {
                    let v = d[i * n + j];
                    if v.is_nan() {
                        f64::INFINITY
                    } else {
                        v
                    }
                }));
                if k == 0 {
                    return 0.0;
                }
                row.select_nth_unstable_by(k - 1, f64::total_cmp);
                row[..k].iter().sum()
            })
            .collect()
    }

    /// The indices (into `scores`) of the `m` lowest scores, ties by index.
    pub(super) fn select(&self, scores: &[f64]) -> Vec<usize> {
        let mut order: Vec<usize> = (0..scores.len()).collect();
        order.sort_by(|&a, &b| {
            let key = |s: f64| if s.is_nan() { f64::INFINITY } else { s };
            key(scores[a]).total_cmp(&key(scores[b])).then(a.cmp(&b))
        });
        order.truncate(self.m.clamp(1, scores.len().max(1)));
        order
    }
}

impl Aggregator for Krum {
    fn name(&self) -> &'static str {
        if self.m <= 1 {
            "krum"
        } else {
            "multi_krum"
        }
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
        let rows: Vec<&[f32]> = used.iter().map(|&i| deltas[i]).collect();
        let selected = if n == 1 {
            vec![0]
        } else {
            let d = pairwise_sq_dists(&rows, out.len());
            self.select(&self.scores_from(&d, n))
        };
        let chosen: Vec<&[f32]> = selected.iter().map(|&s| rows[s]).collect();
        let w: Vec<f32> = selected.iter().map(|&s| weights[used[s]]).collect();
        WeightedMean.merge(&chosen, &w, out)?;
        Ok(MergeOutcome::Merged {
            aggregator: self.name(),
            used: n,
        })
    }
}
