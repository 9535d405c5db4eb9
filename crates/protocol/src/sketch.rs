//! Linear sketches of deltas: what a ring member reports about its delta instead of the
//! delta itself, and how the orchestrator checks a ring's reduction with them (ring mode,
//! DESIGN §4 "ring all-reduce": commit, reveal the epoch seed, sketch, reduce, check).
//!
//! The sketch is a CountSketch (Charikar, Chen & Farach-Colton 2002, "Finding frequent
//! items in data streams"; as a random projection, the feature hashing of Weinberger et al.
//! 2009): coordinate `j` of a delta goes to one of `k` rows, `h(j)`, with a sign `σ(j) = ±1`,
//! both drawn from a seed, and row `r` holds `Σ_{h(j) = r} σ(j)·x_j` (accumulated in f64).
//! It is linear, so `S(Σ wᵢ·xᵢ) = Σ wᵢ·S(xᵢ)` up to rounding ([`check_reduction`]); it is
//! one pass over the delta with one add per coordinate and one 64-bit hash per four
//! coordinates, whatever `k` ([`Sketcher::update`]).
//!
//! What survives the projection, for a seed drawn independently of the vectors sketched:
//! - inner products, unbiased: `E[⟨S x, S y⟩] = ⟨x, y⟩`, with
//!   `Var[⟨S x, S y⟩] ≤ (‖x‖²‖y‖² + ⟨x, y⟩²) / k` (Weinberger et al. 2009, Theorem 2; the
//!   bound needs 4-wise independent signs and pairwise independent rows, which a keyed
//!   SplitMix64 is not provably: the bound is heuristic here, and the test
//!   `norms_are_estimated_within_the_stated_deviation` measures it over 200 seeds); for a
//!   norm, the relative standard deviation of `‖S x‖²` is at most `√(2/k)`: 8.8 % at the
//!   default `k` = 256, and a ratio of two independently estimated norms about
//!   `√2 · 8.8 % = 12.5 %`, so a norm ratio test ([`Sketch::norm_sq`]) should allow ±40 %
//!   (3.2 σ) before it calls a delta an outlier;
//! - identity: the same delta under the same seed gives the same sketch bit for bit, and a
//!   rescaled copy `c·x` (rounded to f32) gives `c·S x` up to f32 rounding (cosine
//!   `1 − O(2⁻²⁴)`), so a free-rider's copy of another member's delta is recognised without
//!   the delta ([`Sketch::cosine`]).
//!
//! The order the protocol must keep, because a sketch is blind to every change in the
//! `len − k`-dimensional null space of its seed's projection:
//! - members commit to their deltas (hashes) before the scoring seed is revealed, so no
//!   delta is shaped against the sketch that scores it;
//! - members commit to the reduction's result (its hash, and the signed pieces) before the
//!   seed of the reduction check ([`check_reduction`]) is revealed, a second seed: a
//!   reducer who knew that seed while reducing could add any change in its null space and
//!   pass the check exactly. Each member then re-sketches its committed delta under it;
//! - the result's sketch is computed by the orchestrator from the bytes it takes (the
//!   merged delta uploaded for publication, checked against the committed hash), never
//!   taken from a member's report.
//!
//! The hash is a keyed SplitMix64 finaliser (Steele, Lea & Flood 2014), not a cryptographic
//! PRF: its job is to be unpredictable before the seed is revealed and cheap after.

use serde::{Deserialize, Serialize};

/// The default number of rows `k` (the 64–256 range, at its top: the estimate's
/// relative standard deviation is `√(2/k)`).
pub const DEFAULT_ROWS: usize = 256;

/// The fewest rows a sketch may have.
pub const MIN_ROWS: usize = 16;

/// The most rows a sketch may have (a row index is 15 bits of the hash).
pub const MAX_ROWS: usize = 1 << 15;

/// The unit roundoff of f32, `2⁻²⁴`.
const F32_UNIT: f64 = 1.0 / 16_777_216.0;

/// The unit roundoff of f64, `2⁻⁵³`.
const F64_UNIT: f64 = 1.0 / 9_007_199_254_740_992.0;

/// Why a sketch cannot be made or compared.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SketchError {
    /// `k` is not a power of two within [`MIN_ROWS`]`..=`[`MAX_ROWS`].
    #[error("a sketch has a power of two of rows within {MIN_ROWS}..={MAX_ROWS}, not {0}")]
    Rows(usize),
    /// Two sketches that cannot be compared: different row counts or coordinate counts.
    #[error("sketches of {a_rows} rows over {a_len} values and {b_rows} rows over {b_len} values cannot be compared")]
    Mismatched {
        /// The first sketch's rows.
        a_rows: usize,
        /// The first sketch's coordinates.
        a_len: u64,
        /// The second sketch's rows.
        b_rows: usize,
        /// The second sketch's coordinates.
        b_len: u64,
    },
    /// A sketch that is not well formed (a value that is not finite, a row mass below its
    /// row's magnitude, or fewer masses than rows), or a weight that is not finite.
    #[error("a sketch is malformed or a weight is not finite")]
    NotFinite,
    /// A member's row masses (its `‖x‖₁`) are larger than its sketch's norm allows
    /// ([`check_reduction`]). Carries the member's index.
    #[error("member {member}'s sketch claims more mass than its norm allows")]
    Implausible {
        /// The member's index in the list checked.
        member: usize,
    },
}

/// The sketch of one vector (a delta's values in its layout's order, or a reduction's
/// result).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sketch {
    /// Row sums `Σ_{h(j) = r} σ(j)·x_j`, `k` of them.
    pub rows: Vec<f64>,
    /// Row masses `Σ_{h(j) = r} |x_j|`, `k` of them: the rounding tolerance of each row in
    /// [`check_reduction`] (their sum is `‖x‖₁`).
    pub abs_rows: Vec<f64>,
    /// Coordinates sketched.
    pub len: u64,
}

/// A streaming sketcher: feed a vector's values in order, in as many slices as convenient
/// (tensor by tensor), then [`Sketcher::finish`].
#[derive(Debug, Clone)]
pub struct Sketcher {
    keys: (u64, u64),
    mask: u64,
    rows: Vec<f64>,
    abs_rows: Vec<f64>,
    next: u64,
}

/// SplitMix64's finaliser (Steele, Lea & Flood 2014): a bijection of `u64` whose output
/// bits each depend on every input bit.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The hash of the group of four coordinates `4g .. 4g + 4`: 16 bits each, the low 15 a row
/// (masked to `k`), the top one the sign.
fn group_hash(keys: (u64, u64), group: u64) -> u64 {
    mix(mix(group ^ keys.0) ^ keys.1)
}

impl Sketcher {
    /// A sketcher of `rows` rows under the epoch's `seed` (32 bytes; the first 16 key the
    /// hash, the rest are folded in).
    ///
    /// Errors: [`SketchError::Rows`].
    pub fn new(seed: &[u8; 32], rows: usize) -> Result<Sketcher, SketchError> {
        if !(MIN_ROWS..=MAX_ROWS).contains(&rows) || !rows.is_power_of_two() {
            return Err(SketchError::Rows(rows));
        }
        let word = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&seed[i * 8..i * 8 + 8]);
            u64::from_le_bytes(b)
        };
        Ok(Sketcher {
            keys: (word(0) ^ mix(word(2)), word(1) ^ mix(word(3))),
            mask: rows as u64 - 1,
            rows: vec![0.0; rows],
            abs_rows: vec![0.0; rows],
            next: 0,
        })
    }

    /// Adds `values`, the next coordinates of the vector (numbered on from where the last
    /// call ended).
    pub fn update(&mut self, values: &[f32]) {
        let mut rest = values;
        // Up to the next group boundary, one coordinate at a time.
        while !self.next.is_multiple_of(4) {
            let Some((&x, tail)) = rest.split_first() else {
                return;
            };
            self.add(x);
            rest = tail;
        }
        let mut groups = rest.chunks_exact(4);
        let mut group = self.next / 4;
        for four in &mut groups {
            let h = group_hash(self.keys, group);
            for (lane, &x) in four.iter().enumerate() {
                let bits = h >> (16 * lane);
                let row = (bits & self.mask) as usize;
                let x = f64::from(x);
                self.rows[row] += if bits & 0x8000 == 0 { x } else { -x };
                self.abs_rows[row] += x.abs();
            }
            group += 1;
        }
        self.next = group * 4;
        for &x in groups.remainder() {
            self.add(x);
        }
    }

    /// Adds coordinate `self.next`.
    fn add(&mut self, x: f32) {
        let bits = group_hash(self.keys, self.next / 4) >> (16 * (self.next % 4));
        let row = (bits & self.mask) as usize;
        let x = f64::from(x);
        self.rows[row] += if bits & 0x8000 == 0 { x } else { -x };
        self.abs_rows[row] += x.abs();
        self.next += 1;
    }

    /// The sketch of everything fed.
    pub fn finish(self) -> Sketch {
        Sketch {
            rows: self.rows,
            abs_rows: self.abs_rows,
            len: self.next,
        }
    }
}

/// The sketch of `values` under `seed` with `rows` rows ([`Sketcher`] in one call).
///
/// Errors: [`SketchError::Rows`].
pub fn sketch(seed: &[u8; 32], rows: usize, values: &[f32]) -> Result<Sketch, SketchError> {
    let mut s = Sketcher::new(seed, rows)?;
    s.update(values);
    Ok(s.finish())
}

impl Sketch {
    /// `‖x‖₁`.
    pub fn l1(&self) -> f64 {
        self.abs_rows.iter().sum()
    }

    /// Whether the sketch is well formed: as many masses as rows, every value finite, every
    /// mass at least its row's magnitude (what a [`Sketcher`] makes; a member's report may
    /// be anything).
    pub fn well_formed(&self) -> bool {
        self.rows.len() == self.abs_rows.len()
            && self
                .rows
                .iter()
                .zip(&self.abs_rows)
                .all(|(r, a)| r.is_finite() && a.is_finite() && *a >= r.abs())
    }

    fn comparable(&self, other: &Sketch) -> Result<(), SketchError> {
        if self.rows.len() != other.rows.len() || self.len != other.len {
            return Err(SketchError::Mismatched {
                a_rows: self.rows.len(),
                a_len: self.len,
                b_rows: other.rows.len(),
                b_len: other.len,
            });
        }
        Ok(())
    }

    /// The estimate of `⟨x, y⟩` ([module docs](self): unbiased, variance at most
    /// `(‖x‖²‖y‖² + ⟨x, y⟩²)/k`).
    ///
    /// Errors: [`SketchError::Mismatched`].
    pub fn dot(&self, other: &Sketch) -> Result<f64, SketchError> {
        self.comparable(other)?;
        Ok(self.rows.iter().zip(&other.rows).map(|(a, b)| a * b).sum())
    }

    /// The estimate of `‖x‖²` (relative standard deviation at most `√(2/k)`).
    pub fn norm_sq(&self) -> f64 {
        self.rows.iter().map(|a| a * a).sum()
    }

    /// The estimate of `‖x − y‖²`.
    ///
    /// Errors: [`SketchError::Mismatched`].
    pub fn distance_sq(&self, other: &Sketch) -> Result<f64, SketchError> {
        self.comparable(other)?;
        Ok(self
            .rows
            .iter()
            .zip(&other.rows)
            .map(|(a, b)| (a - b) * (a - b))
            .sum())
    }

    /// The estimate of the cosine of `x` and `y`; `None` when either sketch is zero. A copy
    /// reads 1 (up to f64 rounding); a rescaled copy (rounded to f32) ±1 up to f32 rounding.
    ///
    /// Errors: [`SketchError::Mismatched`].
    pub fn cosine(&self, other: &Sketch) -> Result<Option<f64>, SketchError> {
        let dot = self.dot(other)?;
        let norms = (self.norm_sq() * other.norm_sq()).sqrt();
        Ok((norms > 0.0).then(|| dot / norms))
    }
}

/// Where a reduction's sketch and the members' weighted sketches disagree beyond rounding.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("row {row} of the reduction's sketch is {found}, the members' weighted sketches sum to {expected}: off by {} > the tolerance {tolerance}", (found - expected).abs())]
pub struct ReductionMismatch {
    /// The row.
    pub row: usize,
    /// The reduction's row.
    pub found: f64,
    /// `Σ wᵢ·Sᵢ` at that row.
    pub expected: f64,
    /// [`reduction_tolerance`].
    pub tolerance: f64,
}

/// The most row `row` of the sketch of a ring's f32 reduction `r = Σ wᵢ·δᵢ` may differ
/// from `Σ wᵢ·S(δᵢ)` by rounding alone, for `members` = `(wᵢ, S(δᵢ))`, `N` = their count
/// and `len` coordinates:
///
/// `τ_row = (γ_N + (N + 1)·len·2⁻⁵³)·Σᵢ |wᵢ|·Aᵢ,row + N·len·2⁻¹⁴⁹`, with
/// `γ_N = N·u / (1 − N·u)`, `u = 2⁻²⁴`, and `Aᵢ,row` member `i`'s row mass
/// (`Σ_{h(j) = row} |δᵢⱼ|`).
///
/// Derivation (Higham 2002, "Accuracy and Stability of Numerical Algorithms", §2.2 and
/// §4.2, recursive summation): each member rounds `wᵢ·δᵢⱼ` to f32 once (error at most
/// `u|wᵢδᵢⱼ|`, `u = 2⁻²⁴`), and the ring adds the `N` products in f32 in ring order, `N − 1`
/// additions; so `|rⱼ − Σᵢ wᵢδᵢⱼ| ≤ γ_N·Σᵢ |wᵢδᵢⱼ|` (Higham's `γ_n`, exact, no first-order
/// truncation; `N·u < 1` holds for any ring), and a row, a signed sum of its coordinates,
/// is off by at most the sum of their bounds, `γ_N·Σᵢ|wᵢ|·Aᵢ,row`. Each sketch's f64
/// accumulation adds at most `len·2⁻⁵³` of its row mass (recursive summation of up to
/// `len` terms, first order), for the `N` members' sketches and the result's. The bound
/// assumes IEEE arithmetic with subnormals: the absolute term `N·len·2⁻¹⁴⁹` covers the
/// rounding of subnormal products (each off by at most half of `2⁻¹⁴⁹`); a reduction that
/// flushes subnormals to zero (some GPU kernels) may exceed it by up to the subnormals' own
/// size. Within the tolerance a change is rounding-sized relative to the row's mass;
/// outside the null space of the check's seed (module docs) nothing larger passes.
///
/// `row` must be below every member's row count.
pub fn reduction_tolerance(members: &[(f32, &Sketch)], len: u64, row: usize) -> f64 {
    let n = members.len() as f64;
    let mass: f64 = members
        .iter()
        .map(|(w, s)| f64::from(*w).abs() * s.abs_rows[row])
        .sum();
    let gamma = n * F32_UNIT / (1.0 - n * F32_UNIT);
    let subnormal = n * len as f64 * f64::from(f32::from_bits(1));
    (gamma + (n + 1.0) * len as f64 * F64_UNIT) * mass + subnormal
}

/// Checks a ring's reduction against its members: every row of `result` (the sketch the
/// orchestrator computed of the reduced vector it took, of `len` values: the job's layout,
/// not a reported count) is within [`reduction_tolerance`] of `Σ wᵢ·Sᵢ`.
///
/// A member's row masses set the tolerance, so they are bounded first: a member whose
/// `‖x‖₁` is above `2·√(len·‖S x‖²)` is refused ([`SketchError::Implausible`]). An honest
/// one never is: `‖x‖₁ ≤ √len·‖x‖₂` (Cauchy–Schwarz), and `‖S x‖²` below a quarter of
/// `‖x‖²` is more than 8 standard deviations from its mean at `k` = 256. Masses inflated
/// within that bound loosen the tolerance by at most `2·√len·‖x‖₂` worth of rounding, and
/// the spot-checked members' uploads are compared with their reported sketches bit for bit.
///
/// Errors: [`SketchError`] when the sketches cannot be compared (or do not cover `len`
/// values), one is not [`Sketch::well_formed`] or a weight is not finite, or a member's
/// masses are implausible; `Ok(Err(mismatch))` naming the first row that is off.
pub fn check_reduction(
    result: &Sketch,
    members: &[(f32, &Sketch)],
    len: u64,
) -> Result<Result<(), ReductionMismatch>, SketchError> {
    if result.len != len {
        return Err(SketchError::Mismatched {
            a_rows: result.rows.len(),
            a_len: result.len,
            b_rows: result.rows.len(),
            b_len: len,
        });
    }
    for (_, s) in members {
        result.comparable(s)?;
    }
    if !result.well_formed()
        || members
            .iter()
            .any(|(w, s)| !w.is_finite() || !s.well_formed())
    {
        return Err(SketchError::NotFinite);
    }
    let plausible = |s: &Sketch| s.l1() <= 2.0 * (len as f64 * s.norm_sq()).sqrt();
    if let Some(member) = members.iter().position(|(_, s)| !plausible(s)) {
        return Err(SketchError::Implausible { member });
    }
    for (row, &found) in result.rows.iter().enumerate() {
        let expected: f64 = members
            .iter()
            .map(|(w, s)| f64::from(*w) * s.rows[row])
            .sum();
        let tolerance = reduction_tolerance(members, result.len, row);
        if (found - expected).abs() > tolerance {
            return Ok(Err(ReductionMismatch {
                row,
                found,
                expected,
                tolerance,
            }));
        }
    }
    Ok(Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};

    fn values(seed: u64, n: usize) -> Vec<f32> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
    }

    const SEED: [u8; 32] = [7; 32];

    #[test]
    fn rows_must_be_a_power_of_two_in_range() {
        for bad in [0, 8, 100, 1 << 16] {
            assert_eq!(
                Sketcher::new(&SEED, bad).unwrap_err(),
                SketchError::Rows(bad)
            );
        }
        assert!(Sketcher::new(&SEED, DEFAULT_ROWS).is_ok());
    }

    #[test]
    fn a_copy_and_a_rescaled_copy_are_recognised_exactly() {
        let x = values(1, 10_001);
        let y = values(2, 10_001);
        let sx = sketch(&SEED, DEFAULT_ROWS, &x).unwrap();
        assert_eq!(sketch(&SEED, DEFAULT_ROWS, &x).unwrap(), sx);
        assert!((sx.cosine(&sx).unwrap().unwrap() - 1.0).abs() < 1e-12);
        let scaled: Vec<f32> = x.iter().map(|v| v * 0.3).collect();
        let ss = sketch(&SEED, DEFAULT_ROWS, &scaled).unwrap();
        assert!((sx.cosine(&ss).unwrap().unwrap() - 1.0).abs() < 1e-6);
        let sy = sketch(&SEED, DEFAULT_ROWS, &y).unwrap();
        // Two independent random vectors: cosine near 0 (its sd is about 1/√k).
        assert!(sx.cosine(&sy).unwrap().unwrap().abs() < 0.3);
        // Another seed, another sketch.
        assert_ne!(sketch(&[8; 32], DEFAULT_ROWS, &x).unwrap().rows, sx.rows);
        let short = sketch(&SEED, DEFAULT_ROWS, &x[..100]).unwrap();
        assert!(matches!(
            sx.dot(&short),
            Err(SketchError::Mismatched { .. })
        ));
    }

    #[test]
    fn norms_are_estimated_within_the_stated_deviation() {
        // Over 200 seeds, ‖Sx‖²/‖x‖² has mean ≈ 1 and sd ≤ √(2/k).
        let x = values(3, 50_000);
        let exact: f64 = x.iter().map(|v| f64::from(*v).powi(2)).sum();
        let ratios: Vec<f64> = (0..200u8)
            .map(|i| sketch(&[i; 32], DEFAULT_ROWS, &x).unwrap().norm_sq() / exact)
            .collect();
        let mean = ratios.iter().sum::<f64>() / ratios.len() as f64;
        let sd = (ratios.iter().map(|r| (r - mean).powi(2)).sum::<f64>()
            / (ratios.len() - 1) as f64)
            .sqrt();
        let bound = (2.0 / DEFAULT_ROWS as f64).sqrt();
        assert!(
            (mean - 1.0).abs() < 3.0 * bound / (200f64).sqrt(),
            "mean {mean}"
        );
        assert!(sd < 1.2 * bound, "sd {sd} vs bound {bound}");
    }

    #[test]
    fn a_tampered_reduction_is_caught_and_an_honest_one_passes() {
        let n = 8;
        let len = 40_000;
        let deltas: Vec<Vec<f32>> = (0..n).map(|i| values(10 + i as u64, len)).collect();
        let weights: Vec<f32> = (0..n).map(|i| 0.5 + i as f32 / 16.0).collect();
        // The ring's reduction: f32 products, added in ring order.
        let mut result = vec![0f32; len];
        for (d, w) in deltas.iter().zip(&weights) {
            for (r, v) in result.iter_mut().zip(d) {
                *r += w * v;
            }
        }
        let sketches: Vec<Sketch> = deltas
            .iter()
            .map(|d| sketch(&SEED, DEFAULT_ROWS, d).unwrap())
            .collect();
        let members: Vec<(f32, &Sketch)> = weights.iter().copied().zip(&sketches).collect();
        let honest = sketch(&SEED, DEFAULT_ROWS, &result).unwrap();
        assert_eq!(check_reduction(&honest, &members, len as u64), Ok(Ok(())));
        // One coordinate of one partial sum changed by 1e-2 (of values up to ±4): caught.
        let mut tampered = result.clone();
        tampered[12_345] += 1e-2;
        let bad = sketch(&SEED, DEFAULT_ROWS, &tampered).unwrap();
        let mismatch = check_reduction(&bad, &members, len as u64)
            .unwrap()
            .unwrap_err();
        assert!(mismatch.to_string().contains("tolerance"), "{mismatch}");
        // A member left out (its weight not renormalised away): caught.
        assert!(check_reduction(&honest, &members[1..], len as u64)
            .unwrap()
            .is_err());
        // A member inflating its masses to loosen the tolerance: refused.
        let mut inflated = sketches[3].clone();
        inflated.abs_rows.iter_mut().for_each(|a| *a *= 1e6);
        let mut cheating = members.clone();
        cheating[3].1 = &inflated;
        assert_eq!(
            check_reduction(&bad, &cheating, len as u64),
            Err(SketchError::Implausible { member: 3 })
        );
        // A result over another length (a reported count, not the layout's): refused.
        assert!(matches!(
            check_reduction(&honest, &members, len as u64 + 1),
            Err(SketchError::Mismatched { .. })
        ));
    }

    proptest! {
        /// Streaming in any split gives the same sketch as one call.
        #[test]
        fn streaming_in_any_split_is_one_sketch(len in 0usize..600, cuts in proptest::collection::vec(0usize..600, 0..6), seed in any::<u64>()) {
            let x = values(seed, len);
            let whole = sketch(&SEED, 64, &x).unwrap();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(len)).collect();
            cuts.sort_unstable();
            let mut s = Sketcher::new(&SEED, 64).unwrap();
            let mut at = 0;
            for c in cuts.into_iter().chain([len]) {
                s.update(&x[at..c]);
                at = c;
            }
            prop_assert_eq!(s.finish(), whole);
        }

        /// Linearity within the tolerance, for any weights and member count.
        #[test]
        fn honest_reductions_pass(n in 1usize..12, len in 1usize..3000, seed in any::<u64>(), scale in -3.0f32..3.0) {
            let deltas: Vec<Vec<f32>> = (0..n).map(|i| values(seed.wrapping_add(i as u64), len)).collect();
            let weights: Vec<f32> = (0..n).map(|i| scale * (1.0 + i as f32) / n as f32).collect();
            let mut result = vec![0f32; len];
            for (d, w) in deltas.iter().zip(&weights) {
                for (r, v) in result.iter_mut().zip(d) {
                    *r += w * v;
                }
            }
            let sketches: Vec<Sketch> = deltas.iter().map(|d| sketch(&SEED, 64, d).unwrap()).collect();
            let members: Vec<(f32, &Sketch)> = weights.iter().copied().zip(&sketches).collect();
            let s = sketch(&SEED, 64, &result).unwrap();
            prop_assert_eq!(check_reduction(&s, &members, len as u64), Ok(Ok(())));
        }
    }
}
