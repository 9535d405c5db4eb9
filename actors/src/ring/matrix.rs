//! The directed bandwidth matrix (DESIGN §4).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::types::LinkProfile;

/// Directed link bandwidths between `n` nodes, in Mbit/s (DESIGN §4).
///
/// `get(i, j)` is the bandwidth of the link *from* node `i` *to* node `j`; the matrix may be
/// asymmetric. Storage is a row-major `Vec<f32>` of `n * n` entries (4 bytes each, so
/// 10,000 nodes take 400 MB) plus one "estimated" bit per pair. A pair is *estimated* when
/// its value is not a measurement: either a placeholder (see [`BandwidthMatrix::new`]) or
/// the profile-based estimate of [`BandwidthMatrix::estimate_from_profiles`].
///
/// Values are sanitised on the way in: NaN, negative values and `-0.0` are stored as `0.0`;
/// `+inf` is kept. The diagonal (`i -> i`) is always 0 and never estimated.
#[derive(Clone, PartialEq)]
pub struct BandwidthMatrix {
    n: usize,
    mbps: Vec<f32>,
    estimated: Vec<u64>,
}

/// Parameters of the profile-based estimate for unmeasured pairs (ours, DESIGN §4).
///
/// `estimate(i -> j) = min(up_mbps[i], down_mbps[j]) * factor`, where `factor` is
/// `same_region` when both nodes declare the same region label and `cross_region`
/// otherwise (including when a label is missing).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LinkEstimate {
    /// Multiplier for two nodes in the same region (default 1.0).
    pub same_region: f32,
    /// Multiplier for two nodes in different (or unknown) regions (default 0.5).
    pub cross_region: f32,
}

impl Default for LinkEstimate {
    fn default() -> Self {
        LinkEstimate {
            same_region: 1.0,
            cross_region: 0.5,
        }
    }
}

impl LinkEstimate {
    /// The estimated bandwidth in Mbit/s of the link `from -> to`:
    /// `min(from.up_mbps, to.down_mbps) * factor` (ours, DESIGN §4), sanitised (NaN or
    /// negative becomes 0).
    pub fn estimate(&self, from: &LinkProfile, to: &LinkProfile, same_region: bool) -> f32 {
        let factor = if same_region {
            self.same_region
        } else {
            self.cross_region
        };
        sanitize(from.up_mbps.min(to.down_mbps) * factor)
    }
}

/// NaN, negative and `-0.0` become `0.0`; everything else is kept.
pub(crate) fn sanitize(x: f32) -> f32 {
    if x > 0.0 {
        x
    } else {
        0.0
    }
}

impl BandwidthMatrix {
    /// An `n x n` matrix with every link at 0 Mbit/s and every off-diagonal pair flagged
    /// estimated (nothing measured yet). Fill it with [`set`](Self::set) and
    /// [`fill_estimates`](Self::fill_estimates).
    pub fn new(n: usize) -> Self {
        let mut m = BandwidthMatrix {
            n,
            mbps: vec![0.0; n * n],
            estimated: vec![0; (n * n).div_ceil(64)],
        };
        for i in 0..n {
            for j in 0..n {
                if i != j {
                    m.set_flag(i, j, true);
                }
            }
        }
        m
    }

    /// An `n x n` matrix of measured links: entry `(i, j)` is `f(i, j)` Mbit/s for `i != j`
    /// (sanitised); `f` is not called for the diagonal, which is 0. Calls `f` row by row.
    pub fn from_fn(n: usize, mut f: impl FnMut(usize, usize) -> f32) -> Self {
        let mut mbps = Vec::with_capacity(n * n);
        for i in 0..n {
            for j in 0..n {
                mbps.push(if i == j { 0.0 } else { sanitize(f(i, j)) });
            }
        }
        BandwidthMatrix {
            n,
            mbps,
            estimated: vec![0; (n * n).div_ceil(64)],
        }
    }

    /// An `n x n` matrix (`n = profiles.len()`) where every pair is estimated from the two
    /// nodes' declared up/down capacities and regions (ours, DESIGN §4):
    /// `B(i -> j) = min(up_i, down_j) * (est.same_region | est.cross_region)` Mbit/s, and
    /// flagged estimated. `regions[i]` is node `i`'s region; missing labels count as a
    /// different region from every node.
    pub fn estimate_from_profiles(
        profiles: &[LinkProfile],
        regions: &[String],
        est: &LinkEstimate,
    ) -> BandwidthMatrix {
        let mut m = BandwidthMatrix::new(profiles.len());
        m.fill_estimates(profiles, regions, est);
        m
    }

    /// Replaces every pair still flagged estimated with the profile-based estimate of
    /// [`estimate_from_profiles`](Self::estimate_from_profiles); measured pairs are kept.
    /// Pairs involving a node without a profile (`profiles.len() < n`) are set to 0 Mbit/s.
    pub fn fill_estimates(
        &mut self,
        profiles: &[LinkProfile],
        regions: &[String],
        est: &LinkEstimate,
    ) {
        let n = self.n;
        for i in 0..n {
            for j in 0..n {
                if i == j || !self.is_estimated(i, j) {
                    continue;
                }
                let v = match (profiles.get(i), profiles.get(j)) {
                    (Some(a), Some(b)) => {
                        let same = matches!((regions.get(i), regions.get(j)), (Some(x), Some(y)) if x == y);
                        est.estimate(a, b, same)
                    }
                    _ => 0.0,
                };
                self.mbps[i * n + j] = v;
            }
        }
    }

    /// The number of nodes `n`.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Bandwidth of the directed link `i -> j` in Mbit/s; 0 on the diagonal and for indices
    /// out of range.
    #[inline]
    pub fn get(&self, i: usize, j: usize) -> f32 {
        if i < self.n && j < self.n {
            self.mbps[i * self.n + j]
        } else {
            0.0
        }
    }

    /// Sets the directed link `i -> j` to `mbps` Mbit/s (sanitised) and its estimated flag.
    /// Returns `false`, changing nothing, for the diagonal or indices out of range.
    pub fn set(&mut self, i: usize, j: usize, mbps: f32, estimated: bool) -> bool {
        if i >= self.n || j >= self.n || i == j {
            return false;
        }
        self.mbps[i * self.n + j] = sanitize(mbps);
        self.set_flag(i, j, estimated);
        true
    }

    /// Whether the value of `i -> j` is an estimate rather than a measurement; `false` for
    /// the diagonal and indices out of range.
    pub fn is_estimated(&self, i: usize, j: usize) -> bool {
        if i >= self.n || j >= self.n || i == j {
            return false;
        }
        let bit = i * self.n + j;
        self.estimated[bit / 64] >> (bit % 64) & 1 == 1
    }

    /// The number of ordered off-diagonal pairs `(i, j)` whose value is an estimate.
    pub fn estimated_pairs(&self) -> usize {
        self.estimated.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Row `i` (out-links of node `i`), `n` entries; caller guarantees `i < n`.
    #[inline]
    pub(crate) fn row(&self, i: usize) -> &[f32] {
        &self.mbps[i * self.n..(i + 1) * self.n]
    }

    fn set_flag(&mut self, i: usize, j: usize, on: bool) {
        let bit = i * self.n + j;
        if on {
            self.estimated[bit / 64] |= 1 << (bit % 64);
        } else {
            self.estimated[bit / 64] &= !(1 << (bit % 64));
        }
    }
}

impl fmt::Debug for BandwidthMatrix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("BandwidthMatrix");
        d.field("n", &self.n)
            .field("estimated_pairs", &self.estimated_pairs());
        if self.n <= 16 {
            let rows: Vec<&[f32]> = (0..self.n).map(|i| self.row(i)).collect();
            d.field("mbps", &rows);
        }
        d.finish()
    }
}
