//! Ring-mode scores and merge weights from sketches alone (DESIGN §4b, issue 18): pure,
//! deterministic, no I/O.
//!
//! In ring mode the orchestrator never holds most members' deltas. Each member commits to
//! its delta (the signed statement of DESIGN §6: job, epoch, step, claimed loss, SHA-256 of
//! the payload), the orchestrator then reveals the epoch's sketch seed, and each member
//! reports the CountSketch `Sᵢ = S(δᵢ)` of its delta ([`hanzod_protocol::sketch`]: `k` rows,
//! Charikar, Chen & Farach-Colton 2002). [`score_sketches`] turns those sketches into one
//! [`SketchVerdict`] per member and the weights `wᵢ` of the ring's reduction `Σ wᵢ·δᵢ`,
//! mirroring the star-mode rules of [`crate::score`], [`crate::validate`] and
//! [`crate::merge`] (DESIGN §6 "Validation" and "Merge", §12) as far as a sketch allows.
//!
//! # The rules, in the order they are applied
//!
//! Members are taken in **commitment order** ([`MemberSketch::commit_seq`], ties by
//! [`NodeId`]), never in input order, so the verdicts do not depend on how the caller lists
//! the members (every sum and median below is also taken in a canonical order: the result
//! is bit-for-bit permutation invariant).
//!
//! 1. **Exact duplicates** ([`Exclusion::Duplicate`]): a member whose committed delta hash
//!    equals an earlier commitment's. The hash is signed and the delta bytes are secret
//!    until every commitment is in (members commit before they send anything, DESIGN §4b),
//!    so a copy cannot be committed before its original unless the original's owner gave
//!    it away: the earliest commitment keeps its weight and every later one gets none.
//!    An honest member who is copied loses nothing (the copies are removed before anything
//!    else is computed, so its verdict is exactly what it would be without them), and a
//!    free-rider and its colluder share one member's weight between them: they gain
//!    nothing over the colluder alone. One caveat: a node's local run is deterministic
//!    and its batch seeds are public (DESIGN §6), so a node willing to spend another's
//!    compute can reproduce that node's delta and commit it first. Rule 1 then pays the
//!    copier, but only the original's own replay reproduces the delta, so the caller must
//!    spot-check both sides of every pair [`SketchScores::copy_pairs`] lists.
//! 2. **Well-formedness** ([`Exclusion::Malformed`]): `k` rows as the epoch's
//!    [`SketchContext::rows`], `len` equal to the job's delta element count
//!    [`SketchContext::len`] (the layout's, not a reported count), [`Sketch::well_formed`],
//!    a finite `‖S δ‖²` below `f64::MAX / 16` (so no derived quantity overflows), and the
//!    plausibility bound of [`check_reduction`](hanzod_protocol::sketch::check_reduction)
//!    `‖δ‖₁ ≤ 2·√(len·‖S δ‖²)` (an honest sketch always passes it; one that fails would make
//!    the reduction check refuse the whole ring). A malformed member is excluded, the set
//!    is still scored.
//! 3. **Free-riding and near-copies.** A zero sketch is no update ([`Exclusion::NoUpdate`]);
//!    a sketch whose cosine with the last merged delta's (sketched by the orchestrator under
//!    the same seed) is at least [`SketchScoreConfig::copy_cosine`] is the previous global
//!    update committed as the member's own, which every node can compute from the public
//!    checkpoints ([`Exclusion::CopiesLastMerged`]). Then ([`Exclusion::NearCopy`]), taken
//!    in commitment order, a member whose
//!    sketch's cosine with an earlier *kept* member's sketch is at least
//!    [`SketchScoreConfig::copy_cosine`] (0.995) is a copy of that member. For unit
//!    directions `‖Sᵢ/‖Sᵢ‖ − Sⱼ/‖Sⱼ‖‖² = 2(1 − cos)`, so this is the brief's distance rule
//!    applied to directions, `2(1 − cos) ≤ τ` with `τ = 0.01`: it catches the exact copy,
//!    the rescaled copy `c·δ` (cosine `1 − O(2⁻²⁴)`, sketch module docs) and the copy with
//!    added noise of up to `√τ` = 10 % of its norm (`1 − cos ≈ ε²/2`). Two honest deltas
//!    are flagged only when their true cosine is above ≈ 0.99 (bound below): the same
//!    update, which adds no information to the merge. Comparing only with *kept* members
//!    means a member is never excluded because it resembles an excluded copy.
//! 4. **Norm and stability** (as star mode, [`crate::score::stability`]): `‖δ‖ ≈ √‖S δ‖²`,
//!    `s = exp(−2 |‖δ‖ / avg − 1|)` against [`SketchContext::norms`]. With no average yet
//!    (a job's first epoch) the average is seeded with the median of the estimated norms
//!    of the members that survived rules 1–3, as [`crate::validate::seed_norms`] does in
//!    star mode (DESIGN §12), and returned in [`SketchScores::norms`]. A member whose
//!    stability is at most [`SUSPECT_STABILITY`] (`e⁻⁴`: a norm at least 3× the average)
//!    is suspect in star mode and gets no weight there: here it is excluded
//!    ([`Exclusion::NormOutlier`]).
//! 5. **Robust centre and distance** ([`Exclusion::Outlier`]): the centre `m` is the
//!    row-wise (coordinate-wise) median of the sketches of the members that survived rules
//!    1–3. A median does not commute with the projection (`med(S δᵢ) ≠ S med(δᵢ)`): `m` is
//!    the coordinate median *in sketch space*, an approximation of star mode's coordinate
//!    median (DESIGN §6, [`crate::merge::CoordinateMedian`]) with the same breakdown point
//!    (fewer than half of the members may be adversarial), and the seed is revealed after
//!    the commitments, so no delta was shaped against it. With `dᵢ = ‖Sᵢ − m‖`, a member is
//!    an outlier when `dᵢ > L = max(φ·median(d), ‖m‖ + ρ·median(‖S‖))`, `φ` =
//!    [`SketchScoreConfig::distance_factor`] (3), `ρ` =
//!    [`SketchScoreConfig::distance_norm_floor`] (2), medians over the same members. By the
//!    triangle inequality `dᵢ ≤ ‖Sᵢ‖ + ‖m‖`, so **no member whose sketch norm is at most
//!    `ρ` times the median is ever excluded by distance**, however tightly the others
//!    cluster (star mode measured honest norms up to 2.5× the median, and calls 3× suspect);
//!    the `φ·median(d)` term widens the limit when the members are spread. Conversely
//!    `dᵢ ≥ ‖Sᵢ‖ − ‖m‖`, so a member is certainly excluded once `‖Sᵢ‖ > ‖m‖ + L`: when the
//!    floor sets `L` and `‖m‖` is about the median norm, a norm above about `ρ + 2` = 4×
//!    the median (rule 4 has by then excluded anything 3× the running average). The limit is
//!    a multiple of a median rather than `median + c·MAD`: with a handful of members the MAD
//!    of the distances can be near 0 and would exclude honest spread.
//! 6. **Direction** ([`Exclusion::Opposed`]): a member whose sketch's cosine with the centre
//!    is below `−z/√k`, `z` = [`SketchScoreConfig::opposed_sigmas`] (4: `−0.25` at
//!    `k` = 256), points against the members' consensus. This stands in for star mode's
//!    agreement with the epoch's coordinate median ([`crate::epoch::agreements`]; no loss
//!    after is measurable without the delta either): to first order a step against the consensus direction
//!    raises the loss the consensus lowers. `1/√k` is the largest standard deviation of a
//!    sketched cosine (below), so an honest member whose true cosine with the centre is not
//!    negative is excluded only by a `z`-standard-deviation error (4σ: about 3·10⁻⁵). It
//!    catches the sign-flipped delta `−c·δ` (any `c > 0`) whenever `δ` had a cosine above
//!    `z/√k` with the centre, i.e. whenever the honest members share a direction at all.
//!    With `k` ≤ 16 the limit is `−1` and the rule is off.
//! 7. **Score and weight**: the composite of [`crate::score::composite`] without its loss
//!    term (DESIGN §6; the loss after needs the full delta), renormalised over the other two
//!    as §12 renormalises epoch 0: `q = (W_S·s + W_C·c) / (W_S + W_C)` with
//!    [`W_STABILITY`] = 0.3, [`W_CONVERGENCE`] = 0.2 (`q = s` when there is no convergence
//!    term), `c = max(0, cos(S δ, S δ_last))` with `S δ_last` the last merged delta
//!    sketched under this epoch's seed ([`SketchContext::last_merged`]; `None` in epoch 0).
//!    Every excluded member's weight is 0 (star mode gives suspect deltas no weight); the
//!    others get `wᵢ = qᵢ / Σⱼ qⱼ`, f64, summing to 1. A kept member has `s > e⁻⁴`, so
//!    `q > 0.6·e⁻⁴` and the sum is positive. When no member is kept the result is
//!    [`SketchScoreError::NoUsableMember`].
//!
//! Star mode judges every delta in full, weighs it by its agreement with the epoch and can
//! fall back to the coordinate median ([`crate::epoch::star_epoch`]); a ring computes only
//! weighted sums of what its members hold, so when more than 30 % of the members are
//! excluded, [`SketchScores::robust_needed`] tells the caller to fall back to the star (full
//! uploads) for that epoch instead (DESIGN §4b), counting every excluded member as suspect. With
//! one or two usable members the centre cannot tell an attacker from an honest member
//! (the median of two is their mean): only the stability rule then applies.
//!
//! # Error bounds (`k` rows; 256 by default)
//!
//! The sketch hashes one 64-bit value per group of four coordinates and gives each lane 16
//! disjoint bits (row: the low `log₂ k`, sign: the top one; [`Sketcher`]). Disjoint bits of
//! one uniform 64-bit value are independent, so *if* the group hashes behave as independent
//! uniform values, every coordinate gets an independent uniform row and sign, exactly as in
//! the analysis of a fully random CountSketch; grouping costs nothing in variance. The
//! keyed SplitMix64 is not provably such a family, so the bounds below are derived for an
//! ideal hash and **measured** on seeded data by this module's tests
//! (`sketched_estimates_have_the_stated_deviation`: over 200 seeds, on Gaussian vectors of
//! 40,000 values with flat and with two-decade block magnitudes, at cosines 0 and 0.6, the
//! measured standard deviations of the norm, inner-product and cosine errors must stay
//! within 1.25× of the stated ones (they measured between 0.91× and 1.10×; the sampling
//! error of a standard deviation over 200 seeds is about 5 %); and the proptest
//! `sketched_stability_and_convergence_track_star_mode`, which compares the sketched
//! stability and convergence with star mode's exact ones on the full vectors within 6
//! standard deviations per case).
//!
//! Writing `ĝ = ⟨S x, S y⟩ = ⟨x, y⟩ + Σ_{i≠j} [h(i) = h(j)]·σ(i)σ(j)·xᵢyⱼ`, the cross terms
//! have mean 0 and are uncorrelated unless they share their pair, which gives exactly
//! - `Var ĝ = (‖x‖²‖y‖² + ⟨x, y⟩² − 2 Σᵢ xᵢ²yᵢ²) / k` (Weinberger et al. 2009, Theorem 2),
//!   so `‖S x‖²` has relative standard deviation at most `√(2/k)` (8.8 % at 256);
//! - the norm estimate `√‖S x‖²`, by the delta method, relative sd `√(1/(2k))` (4.4 %),
//!   bias `−1/(4k)` (0.1 %);
//! - the stability is 2-Lipschitz in `r = ‖δ‖/avg`, so `|ŝ − s| ≤ 2·|r̂ − r|`: standard
//!   deviation at most `2·r·√(1/(2k))` (8.8 %·r; near `r = 1` the kink of `|r − 1|` biases
//!   `ŝ` down by about `0.8·2·4.4 %` ≈ 7 %);
//! - the cosine: the estimates `(‖S x‖², ‖S y‖², ⟨S x, S y⟩)` have the same variances and
//!   covariances as under a Gaussian projection with `k` rows (`2/k`, `2ρ²/k`,
//!   `(1 + ρ²)/k`, `2ρ/k` for unit vectors of cosine `ρ`, less the `Σ xᵢ²yᵢ²`-type terms,
//!   which only shrink them), so to first order the sketched cosine has the standard
//!   deviation of a sample correlation over `k` samples, `(1 − ρ²)/√k` (1/16 at most at
//!   256); the convergence `max(0, cos)` is 1-Lipschitz in it;
//! - the score: `q` moves by `0.6·Δs + 0.4·Δc`, standard deviation at most
//!   `0.6·2·r·√(1/(2k)) + 0.4·(1 − ρ²)/√k` (≈ 0.078 at `r` = 1, `ρ` = 0, `k` = 256);
//! - near-copies: for `ρ` near 1, `1 − ĉ` has relative standard deviation about
//!   `2/√k` (12.5 %), so an honest pair at `ρ` ≤ 0.99 (`1 − ρ ≥ 0.01`) is read as a copy
//!   (`1 − ĉ ≤ 0.005`) only 4 standard deviations out, and a copy with 7 % noise
//!   (`1 − ρ` = 0.0025) is missed only 8 out.
//!
//! These are per-seed deviations: a member cannot improve its odds by choosing its delta,
//! because it committed before the seed was drawn (sketch module docs, "protocol order").
//!
//! [`Sketcher`]: hanzod_protocol::sketch::Sketcher
//! [`SUSPECT_STABILITY`]: crate::validate::SUSPECT_STABILITY
//! [`W_STABILITY`]: crate::score::W_STABILITY
//! [`W_CONVERGENCE`]: crate::score::W_CONVERGENCE

use std::collections::HashMap;

use hanzod_actors::types::NodeId;
use hanzod_protocol::sketch::Sketch;
use serde::{Deserialize, Serialize};

use crate::score::{convergence_of_parts, NormTracker, ScoreError, W_CONVERGENCE, W_STABILITY};
use crate::validate::SUSPECT_STABILITY;

/// The largest accepted `‖S δ‖²`: `f64::MAX / 16`, so that distances (`≤ 4·max ‖S‖²`),
/// dot products and their sums stay finite.
const MAX_NORM_SQ: f64 = f64::MAX / 16.0;

/// What one ring member reported for the epoch.
#[derive(Debug, Clone, Copy)]
pub struct MemberSketch<'a> {
    /// The member.
    pub node: NodeId,
    /// Where its signed commitment stands in the orchestrator's log of the epoch (the order
    /// in which the commitments were received; smaller is earlier). Decides which of two
    /// copies keeps its weight (module docs, rules 1 and 3); equal values are ordered by
    /// [`NodeId`].
    pub commit_seq: u64,
    /// The delta hash of its signed commitment (SHA-256 of the payload, DESIGN §6).
    pub delta_hash: [u8; 32],
    /// The sketch it reported under the epoch's revealed seed.
    pub sketch: &'a Sketch,
}

/// The thresholds of [`score_sketches`] (module docs give each rule and its justification).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SketchScoreConfig {
    /// Cosine at or above which a member's sketch is a copy of an earlier kept member's
    /// (rule 3; default 0.995: `2(1 − cos) ≤ 0.01`, noise up to 10 % of the norm). In
    /// `(0, 1]`.
    pub copy_cosine: f64,
    /// `φ`: an outlier is farther from the centre than `φ` times the median distance (and
    /// than the norm floor; rule 5; default 3). At least 1.
    pub distance_factor: f64,
    /// `ρ`: no member within `‖m‖ + ρ·median(‖S‖)` of the centre is an outlier (rule 5;
    /// default 2: a sketch norm up to twice the median always passes). Non-negative.
    pub distance_norm_floor: f64,
    /// `z`: a member whose cosine with the centre is below `−z/√k` is opposed (rule 6;
    /// default 4). Non-negative.
    pub opposed_sigmas: f64,
}

impl Default for SketchScoreConfig {
    fn default() -> Self {
        SketchScoreConfig {
            copy_cosine: 0.995,
            distance_factor: 3.0,
            distance_norm_floor: 2.0,
            opposed_sigmas: 4.0,
        }
    }
}

/// What every member's sketch is judged against; one per epoch.
#[derive(Debug, Clone, Copy)]
pub struct SketchContext<'a> {
    /// `k`, the rows every sketch of the epoch must have (the job's sketch size).
    pub rows: usize,
    /// The job's delta element count (its layout's length in parameters, not bytes): every
    /// sketch must cover exactly this many values.
    pub len: u64,
    /// The last merged delta sketched by the orchestrator under **this epoch's** seed
    /// (`rows` rows over `len` values); `None` in epoch 0 or after a kept checkpoint (no
    /// convergence term, as in star mode).
    pub last_merged: Option<&'a Sketch>,
    /// The running norm average as of the epoch's start (L2-norm units; star mode's
    /// [`NormTracker`], not updated here).
    pub norms: NormTracker,
    /// Thresholds.
    pub config: SketchScoreConfig,
}

/// Why a member's sketch is unusable (rule 2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
pub enum Malformation {
    /// Its row count is not the epoch's.
    #[error("{found} rows, the epoch's sketches have {expected}")]
    Rows {
        /// The sketch's rows.
        found: usize,
        /// [`SketchContext::rows`].
        expected: usize,
    },
    /// It covers another number of values than the job's layout.
    #[error("sketches {found} values, the job's deltas have {expected}")]
    Len {
        /// The sketch's `len`.
        found: u64,
        /// [`SketchContext::len`].
        expected: u64,
    },
    /// Not [`Sketch::well_formed`] (a value not finite, a mass below its row's magnitude,
    /// or masses and rows of different counts), or `‖S δ‖²` not finite or above
    /// `f64::MAX / 16`.
    #[error("not well formed (a value not finite or out of range, or a mass below its row)")]
    NotWellFormed,
    /// Its row masses claim more `‖δ‖₁` than its norm allows: `l1 > bound =
    /// 2·√(len·‖S δ‖²)` (the plausibility check of the reduction check).
    #[error("row masses sum to {l1}, above the plausible {bound}")]
    Implausible {
        /// `Σ` of its row masses.
        l1: f64,
        /// `2·√(len·‖S δ‖²)`.
        bound: f64,
    },
}

/// Why a member gets no weight (module docs, rules 1–6). Every exclusion counts as suspect
/// for [`SketchScores::robust_needed`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Exclusion {
    /// Its committed delta hash equals an earlier commitment's (rule 1).
    Duplicate {
        /// The member whose commitment came first.
        of: NodeId,
    },
    /// Its sketch is unusable (rule 2).
    Malformed(Malformation),
    /// Its sketch is a (rescaled, or slightly noisy) copy of an earlier kept member's
    /// (rule 3).
    NearCopy {
        /// The earlier member.
        of: NodeId,
        /// The sketches' cosine.
        cosine: f64,
        /// [`SketchScoreConfig::copy_cosine`].
        limit: f64,
    },
    /// Its sketch is zero: no update at all (a free-rider that trained nothing; rule 3).
    NoUpdate,
    /// Its sketch is a (rescaled) copy of the last merged delta's, sketched by the
    /// orchestrator under the same seed: a free-rider committing the previous global update
    /// as its own (rule 3).
    CopiesLastMerged {
        /// The sketches' cosine.
        cosine: f64,
        /// [`SketchScoreConfig::copy_cosine`].
        limit: f64,
    },
    /// Its estimated norm is at least 3× the running average (rule 4, star mode's
    /// suspect stability).
    NormOutlier {
        /// Its stability.
        stability: f64,
        /// [`SUSPECT_STABILITY`].
        limit: f64,
    },
    /// Its sketch is too far from the robust centre (rule 5; sketch-norm units, i.e. the
    /// estimate of an L2 distance between deltas).
    Outlier {
        /// `‖Sᵢ − m‖`.
        distance: f64,
        /// `L`.
        limit: f64,
    },
    /// Its sketch points against the centre (rule 6).
    Opposed {
        /// Its cosine with the centre.
        cosine: f64,
        /// `−z/√k`.
        limit: f64,
    },
}

/// One member's ring-mode verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SketchVerdict {
    /// The member.
    pub node: NodeId,
    /// `√‖S δ‖²`, the estimate of `‖δ‖₂` (L2-norm units; relative sd `√(1/(2k))`); `None`
    /// when the sketch is malformed.
    pub norm_estimate: Option<f64>,
    /// Stability `exp(−2 |‖δ‖/avg − 1|)` from the estimated norm, in `(0, 1]`; `None` when
    /// malformed.
    pub stability: Option<f64>,
    /// Convergence `max(0, cos(S δ, S δ_last))` in `[0, 1]`; `None` when malformed or in
    /// epoch 0.
    pub convergence: Option<f64>,
    /// `‖S δ − m‖`, the distance to the robust centre; `None` when malformed.
    pub centre_distance: Option<f64>,
    /// `cos(S δ, m)`; `None` when malformed or either is zero.
    pub centre_cosine: Option<f64>,
    /// The composite `q` in `[0, 1]` (rule 7), computed for every well-formed member, kept
    /// or not; `None` when malformed.
    pub score: Option<f64>,
    /// The merge weight: `q / Σ q` over the kept members, 0 when excluded.
    pub weight: f64,
    /// Why the member gets no weight, `None` when kept.
    pub excluded: Option<Exclusion>,
}

/// The epoch's ring-mode scores.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SketchScores {
    /// One verdict per member, in the order the members were given.
    pub verdicts: Vec<SketchVerdict>,
    /// The norm average the stabilities were computed against: the context's, or in a
    /// job's first epoch the seeded median (rule 4). Call [`NormTracker::accept`] on it with
    /// the kept members' norm estimates once the epoch is merged, as star mode does.
    pub norms: NormTracker,
    /// `L`, the distance limit of rule 5 (sketch-norm units).
    pub distance_limit: f64,
    /// `−z/√k`, the cosine limit of rule 6.
    pub opposed_limit: f64,
}

impl SketchScores {
    /// How many members got no weight.
    pub fn excluded(&self) -> usize {
        self.verdicts
            .iter()
            .filter(|v| v.excluded.is_some())
            .count()
    }

    /// Whether more than `suspect_threshold` of the members are excluded (the rule of
    /// [`crate::merge::RobustPolicy::choose`], DESIGN §6: 0.30): star mode would merge by the
    /// coordinate median, which a ring cannot compute, so the caller should fall back to
    /// the star for the epoch (DESIGN §4b). A NaN threshold never asks for it.
    pub fn robust_needed(&self, suspect_threshold: f32) -> bool {
        let total = self.verdicts.len();
        total > 0 && self.excluded() as f64 > f64::from(suspect_threshold) * total as f64
    }

    /// Every `(copy, original)` pair of rules 1 and 3, in the members' order. Both members
    /// of each pair should be spot-checked (full upload and replay, DESIGN §6): a node's
    /// batches are seeded by its own id, so only the original's replay reproduces the
    /// delta, and a copier that committed first (having trained on another node's public
    /// seeds, or been handed the delta) is caught and slashed rather than paid.
    pub fn copy_pairs(&self) -> Vec<(NodeId, NodeId)> {
        self.verdicts
            .iter()
            .filter_map(|v| match v.excluded {
                Some(Exclusion::Duplicate { of } | Exclusion::NearCopy { of, .. }) => {
                    Some((v.node, of))
                }
                _ => None,
            })
            .collect()
    }

    /// The kept members and their weights rounded to f32, in the members' order: what the
    /// ring multiplies by and what the reduction check
    /// ([`check_reduction`](hanzod_protocol::sketch::check_reduction)) takes. Excluded
    /// members are left out (their weight is 0, and the check refuses an implausible
    /// member even at weight 0). The f32 weights sum to 1 within `n·2⁻²⁴`.
    pub fn ring_weights(&self) -> Vec<(NodeId, f32)> {
        self.verdicts
            .iter()
            .filter(|v| v.excluded.is_none())
            .map(|v| (v.node, v.weight as f32))
            .collect()
    }
}

/// Why an epoch could not be scored at all.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SketchScoreError {
    /// No member reported.
    #[error("no member to score")]
    NoMembers,
    /// A node is listed twice (a caller bug: one commitment per member and epoch).
    #[error("node {0} is listed twice")]
    DuplicateNode(NodeId),
    /// The orchestrator's own sketch of the last merged delta does not fit the epoch.
    #[error("the last merged delta's sketch is unusable: {0}")]
    LastMerged(Malformation),
    /// A threshold out of its range (see [`SketchScoreConfig`]) or a `rows` of 0.
    #[error("{what} = {value} is out of range")]
    Config {
        /// Which setting.
        what: &'static str,
        /// Its value.
        value: f64,
    },
    /// Every member was excluded: nothing to merge (the caller keeps the previous
    /// checkpoint or falls back to the star).
    #[error("all {excluded} members were excluded")]
    NoUsableMember {
        /// How many members there were.
        excluded: usize,
    },
    /// The score math refused an input (cannot happen for well-formed sketches; kept so a
    /// bug surfaces as an error, not a panic).
    #[error(transparent)]
    Score(#[from] ScoreError),
}

/// Rule 2: why `s` is unusable against `ctx`, if it is.
fn malformation(s: &Sketch, rows: usize, len: u64) -> Option<Malformation> {
    if s.rows.len() != rows {
        return Some(Malformation::Rows {
            found: s.rows.len(),
            expected: rows,
        });
    }
    if s.len != len {
        return Some(Malformation::Len {
            found: s.len,
            expected: len,
        });
    }
    let norm_sq = s.norm_sq();
    let l1 = s.l1();
    if !s.well_formed() || !norm_sq.is_finite() || norm_sq > MAX_NORM_SQ || !l1.is_finite() {
        return Some(Malformation::NotWellFormed);
    }
    let bound = 2.0 * (len as f64 * norm_sq).sqrt();
    (l1 > bound).then_some(Malformation::Implausible { l1, bound })
}

/// `Σ aᵣ·bᵣ` over equal-length rows.
fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The median of `v` (sorted in place by `total_cmp`); the mean of the middle two for an
/// even count. `v` must not be empty.
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

/// `dot / (√a·√b)` clamped to `[−1, 1]`; `None` when either squared norm is 0.
fn cosine(dot: f64, a_sq: f64, b_sq: f64) -> Option<f64> {
    (a_sq > 0.0 && b_sq > 0.0).then(|| (dot / (a_sq.sqrt() * b_sq.sqrt())).clamp(-1.0, 1.0))
}

/// The composite of [`crate::score::composite`] without its loss term (rule 7):
/// `(W_S·s + W_C·c) / (W_S + W_C)`, or `s` without a convergence term; clamped to `[0, 1]`.
pub fn composite_without_loss(stability: f64, convergence: Option<f64>) -> f64 {
    let q = match convergence {
        Some(c) => (W_STABILITY * stability + W_CONVERGENCE * c) / (W_STABILITY + W_CONVERGENCE),
        None => stability,
    };
    q.clamp(0.0, 1.0)
}

fn check_config(ctx: &SketchContext) -> Result<(), SketchScoreError> {
    let c = &ctx.config;
    let bad = |what, value: f64| Err(SketchScoreError::Config { what, value });
    if ctx.rows == 0 {
        return bad("rows", 0.0);
    }
    if !(c.copy_cosine > 0.0 && c.copy_cosine <= 1.0) {
        return bad("copy_cosine", c.copy_cosine);
    }
    if !(c.distance_factor >= 1.0 && c.distance_factor.is_finite()) {
        return bad("distance_factor", c.distance_factor);
    }
    if !(c.distance_norm_floor >= 0.0 && c.distance_norm_floor.is_finite()) {
        return bad("distance_norm_floor", c.distance_norm_floor);
    }
    if !(c.opposed_sigmas >= 0.0 && c.opposed_sigmas.is_finite()) {
        return bad("opposed_sigmas", c.opposed_sigmas);
    }
    Ok(())
}

/// Scores an epoch's ring members from their sketches and picks their merge weights
/// (module docs: rules 1–7, thresholds and error bounds).
///
/// `members`: one entry per member that committed and reported a sketch, in any order
/// (the verdicts come back in the same order and do not otherwise depend on it).
///
/// Errors: [`SketchScoreError::NoMembers`], [`SketchScoreError::DuplicateNode`],
/// [`SketchScoreError::Config`], [`SketchScoreError::LastMerged`] (the caller's inputs);
/// [`SketchScoreError::NoUsableMember`] when every member is excluded. A malformed or
/// adversarial member is a verdict, never an error.
pub fn score_sketches(
    members: &[MemberSketch],
    ctx: &SketchContext,
) -> Result<SketchScores, SketchScoreError> {
    check_config(ctx)?;
    if members.is_empty() {
        return Err(SketchScoreError::NoMembers);
    }
    let n = members.len();
    // Canonical order: commitment order, ties by node.
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| (members[i].commit_seq, members[i].node));
    let mut nodes: Vec<NodeId> = members.iter().map(|m| m.node).collect();
    nodes.sort_unstable();
    if let Some(w) = nodes.windows(2).find(|w| w[0] == w[1]) {
        return Err(SketchScoreError::DuplicateNode(w[0]));
    }
    let last = match ctx.last_merged {
        Some(l) => match malformation(l, ctx.rows, ctx.len) {
            // The plausibility bound is about members' masses; the orchestrator's own
            // sketch only has to be well formed and of the epoch's shape.
            Some(Malformation::Implausible { .. }) | None => Some((l, l.norm_sq())),
            Some(m) => return Err(SketchScoreError::LastMerged(m)),
        },
        None => None,
    };
    let cfg = ctx.config;

    let mut excluded: Vec<Option<Exclusion>> = vec![None; n];
    // Rule 1: exact duplicates by committed hash.
    let mut first_of: HashMap<[u8; 32], NodeId> = HashMap::new();
    for &i in &order {
        let m = &members[i];
        match first_of.get(&m.delta_hash) {
            Some(&of) => excluded[i] = Some(Exclusion::Duplicate { of }),
            None => {
                first_of.insert(m.delta_hash, m.node);
            }
        }
    }
    // Rule 2: well-formedness (every member: a duplicate's sketch is still reported on).
    let usable: Vec<bool> = members
        .iter()
        .zip(excluded.iter_mut())
        .map(|(m, ex)| match malformation(m.sketch, ctx.rows, ctx.len) {
            Some(bad) => {
                ex.get_or_insert(Exclusion::Malformed(bad));
                false
            }
            None => true,
        })
        .collect();
    let norm_sq: Vec<f64> = members
        .iter()
        .zip(&usable)
        .map(|(m, &u)| if u { m.sketch.norm_sq() } else { 0.0 })
        .collect();
    // Rule 3: no update, copies of the last merged delta (free-riding on the public
    // checkpoints), near-copies of earlier kept members, in commitment order.
    let mut contenders: Vec<usize> = Vec::with_capacity(n);
    for &i in &order {
        if excluded[i].is_some() {
            continue;
        }
        let rows = &members[i].sketch.rows;
        if norm_sq[i] == 0.0 {
            excluded[i] = Some(Exclusion::NoUpdate);
            continue;
        }
        let of_last = last.and_then(|(l, l_sq)| cosine(dot(rows, &l.rows), norm_sq[i], l_sq));
        if let Some(c) = of_last.filter(|c| *c >= cfg.copy_cosine) {
            excluded[i] = Some(Exclusion::CopiesLastMerged {
                cosine: c,
                limit: cfg.copy_cosine,
            });
            continue;
        }
        let copy = contenders.iter().find_map(|&j| {
            let c = cosine(dot(rows, &members[j].sketch.rows), norm_sq[i], norm_sq[j])?;
            (c >= cfg.copy_cosine).then_some((j, c))
        });
        match copy {
            Some((j, cosine)) => {
                excluded[i] = Some(Exclusion::NearCopy {
                    of: members[j].node,
                    cosine,
                    limit: cfg.copy_cosine,
                })
            }
            None => contenders.push(i),
        }
    }
    if contenders.is_empty() {
        return Err(SketchScoreError::NoUsableMember { excluded: n });
    }

    // Rule 4: norms, seeded in a job's first epoch from the contenders' median.
    let mut norms = ctx.norms;
    if norms.average().is_none() {
        let mut seeds: Vec<f64> = contenders
            .iter()
            .map(|&i| norm_sq[i].sqrt())
            .filter(|v| *v > 0.0)
            .collect();
        if !seeds.is_empty() {
            norms = NormTracker::from_average(Some(median(&mut seeds)))?;
        }
    }

    // Rule 5: the robust centre, row-wise median over the contenders.
    let centre: Vec<f64> = (0..ctx.rows)
        .map(|r| {
            let mut col: Vec<f64> = contenders
                .iter()
                .map(|&i| members[i].sketch.rows[r])
                .collect();
            median(&mut col)
        })
        .collect();
    let centre_sq = dot(&centre, &centre);

    // Per-member measurements (every usable member, kept or not).
    let mut verdicts: Vec<SketchVerdict> = Vec::with_capacity(n);
    for (i, m) in members.iter().enumerate() {
        let mut v = SketchVerdict {
            node: m.node,
            norm_estimate: None,
            stability: None,
            convergence: None,
            centre_distance: None,
            centre_cosine: None,
            score: None,
            weight: 0.0,
            excluded: excluded[i].clone(),
        };
        if usable[i] {
            let rows = &m.sketch.rows;
            let norm = norm_sq[i].sqrt();
            let stability = norms.stability(norm)?;
            let convergence = last
                .map(|(l, l_sq)| convergence_of_parts(dot(rows, &l.rows), norm, l_sq.sqrt()))
                .transpose()?;
            let dist_sq: f64 = rows
                .iter()
                .zip(&centre)
                .map(|(a, b)| (a - b) * (a - b))
                .sum();
            v.norm_estimate = Some(norm);
            v.stability = Some(stability);
            v.convergence = convergence;
            v.centre_distance = Some(dist_sq.sqrt());
            v.centre_cosine = cosine(dot(rows, &centre), norm_sq[i], centre_sq);
            v.score = Some(composite_without_loss(stability, convergence));
        }
        verdicts.push(v);
    }

    // Rules 4–6 on the contenders.
    let mut dists: Vec<f64> = contenders
        .iter()
        .map(|&i| verdicts[i].centre_distance.unwrap_or(0.0))
        .collect();
    let mut sizes: Vec<f64> = contenders.iter().map(|&i| norm_sq[i].sqrt()).collect();
    let distance_limit = (cfg.distance_factor * median(&mut dists))
        .max(centre_sq.sqrt() + cfg.distance_norm_floor * median(&mut sizes));
    let opposed_limit = (-cfg.opposed_sigmas / (ctx.rows as f64).sqrt()).max(-1.0);
    for &i in &contenders {
        let v = &mut verdicts[i];
        let stability = v.stability.unwrap_or(0.0);
        let distance = v.centre_distance.unwrap_or(0.0);
        v.excluded = if stability <= SUSPECT_STABILITY {
            Some(Exclusion::NormOutlier {
                stability,
                limit: SUSPECT_STABILITY,
            })
        } else if distance > distance_limit {
            Some(Exclusion::Outlier {
                distance,
                limit: distance_limit,
            })
        } else {
            match v.centre_cosine {
                Some(cosine) if cosine < opposed_limit => Some(Exclusion::Opposed {
                    cosine,
                    limit: opposed_limit,
                }),
                _ => None,
            }
        };
    }

    // Rule 7: weights over the kept members, summed in commitment order.
    let kept: Vec<usize> = order
        .iter()
        .copied()
        .filter(|&i| verdicts[i].excluded.is_none())
        .collect();
    let total: f64 = kept.iter().map(|&i| verdicts[i].score.unwrap_or(0.0)).sum();
    if kept.is_empty() || !(total.is_finite() && total > 0.0) {
        return Err(SketchScoreError::NoUsableMember { excluded: n });
    }
    for &i in &kept {
        verdicts[i].weight = verdicts[i].score.unwrap_or(0.0) / total;
    }
    Ok(SketchScores {
        verdicts,
        norms,
        distance_limit,
        opposed_limit,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::score::{convergence as star_convergence, l2_norm, stability as star_stability};
    use hanzod_protocol::sketch::{check_reduction, sketch, DEFAULT_ROWS};
    use proptest::prelude::*;
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    const K: usize = DEFAULT_ROWS;
    const SEED: [u8; 32] = [3; 32];

    fn node(i: usize) -> NodeId {
        NodeId([i as u8 + 1; 32])
    }

    fn hash_of(i: usize) -> [u8; 32] {
        let mut h = [0xa5; 32];
        h[..8].copy_from_slice(&(i as u64).to_le_bytes());
        h
    }

    /// A standard normal draw (Box–Muller).
    fn gauss(rng: &mut ChaCha8Rng) -> f32 {
        let u: f64 = rng.gen_range(f64::EPSILON..1.0);
        let v: f64 = rng.gen();
        ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
    }

    /// Per-"tensor" magnitudes: blocks of 256 coordinates scaled over two decades, so a few
    /// blocks dominate the norm as a few layers do in a real delta.
    fn profile(rng: &mut ChaCha8Rng, len: usize) -> Vec<f32> {
        (0..len.div_ceil(256))
            .map(|_| 10f32.powf(rng.gen_range(-1.0..1.0)))
            .collect()
    }

    /// `n + 1` honest deltas of realistic spread: a common direction `g` (block profile
    /// above) and per member `αᵢ·g + βᵢ·nᵢ`, `α ∈ [0.7, 1.3]`, `β ∈ [0.5, 1.2]`, `nᵢ` noise of
    /// the same profile: pairwise cosines ≈ 0.25–0.87, norms over a 2× range. The last one
    /// stands for the previous epoch's merged delta.
    fn honest(seed: u64, n: usize, len: usize) -> Vec<Vec<f32>> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let scale = profile(&mut rng, len);
        let g: Vec<f32> = (0..len).map(|j| scale[j / 256] * gauss(&mut rng)).collect();
        (0..=n)
            .map(|_| {
                let a = rng.gen_range(0.7f32..1.3);
                let b = rng.gen_range(0.5f32..1.2);
                (0..len)
                    .map(|j| a * g[j] + b * scale[j / 256] * gauss(&mut rng))
                    .collect()
            })
            .collect()
    }

    fn sk(v: &[f32]) -> Sketch {
        sketch(&SEED, K, v).unwrap()
    }

    fn ctx(len: usize, last: Option<&Sketch>, avg: Option<f64>) -> SketchContext<'_> {
        SketchContext {
            rows: K,
            len: len as u64,
            last_merged: last,
            norms: NormTracker::from_average(avg).unwrap(),
            config: SketchScoreConfig::default(),
        }
    }

    fn members(sketches: &[Sketch]) -> Vec<MemberSketch<'_>> {
        sketches
            .iter()
            .enumerate()
            .map(|(i, s)| MemberSketch {
                node: node(i),
                commit_seq: i as u64,
                delta_hash: hash_of(i),
                sketch: s,
            })
            .collect()
    }

    fn median_norm(deltas: &[Vec<f32>]) -> f64 {
        let mut v: Vec<f64> = deltas.iter().map(|d| l2_norm(d).unwrap()).collect();
        median(&mut v)
    }

    fn weight_sum(s: &SketchScores) -> f64 {
        s.verdicts.iter().map(|v| v.weight).sum()
    }

    fn assert_weights(s: &SketchScores) {
        assert!((weight_sum(s) - 1.0).abs() < 1e-12, "{}", weight_sum(s));
        for v in &s.verdicts {
            assert_eq!(v.excluded.is_some(), v.weight == 0.0, "{v:?}");
            assert!((0.0..=1.0).contains(&v.weight));
        }
    }

    #[test]
    fn an_honest_set_keeps_everyone_and_weights_follow_the_scores() {
        let len = 12_000;
        let d = honest(1, 8, len);
        let sketches: Vec<Sketch> = d.iter().map(|x| sk(x)).collect();
        let (last, own) = sketches.split_last().unwrap();
        let s = score_sketches(&members(own), &ctx(len, Some(last), None)).unwrap();
        assert_eq!(s.excluded(), 0, "{:#?}", s.verdicts);
        assert_weights(&s);
        assert!(!s.robust_needed(0.30));
        // First epoch: the norm average is seeded with the median of the estimates.
        let mut est: Vec<f64> = s
            .verdicts
            .iter()
            .map(|v| v.norm_estimate.unwrap())
            .collect();
        assert_eq!(s.norms.average(), Some(median(&mut est)));
        let total: f64 = s.verdicts.iter().map(|v| v.score.unwrap()).sum();
        for v in &s.verdicts {
            let q = composite_without_loss(v.stability.unwrap(), v.convergence);
            assert_eq!(v.score, Some(q));
            assert!((v.weight - q / total).abs() < 1e-15);
            assert!(v.convergence.unwrap() > 0.2, "{v:?}");
        }
        // Epoch 0: no convergence term, the score is the stability.
        let s0 = score_sketches(&members(own), &ctx(len, None, None)).unwrap();
        for v in &s0.verdicts {
            assert_eq!(v.convergence, None);
            assert_eq!(v.score, v.stability);
        }
        // The ring's f32 reduction with these weights passes the reduction check.
        let ring = s.ring_weights();
        let f32_sum: f64 = ring.iter().map(|(_, w)| f64::from(*w)).sum();
        assert!((f32_sum - 1.0).abs() <= ring.len() as f64 / 16_777_216.0);
        let mut reduced = vec![0f32; len];
        for ((_, w), x) in ring.iter().zip(&d) {
            reduced.iter_mut().zip(x).for_each(|(r, v)| *r += w * v);
        }
        let pairs: Vec<(f32, &Sketch)> = ring.iter().map(|(_, w)| *w).zip(own).collect();
        assert_eq!(
            check_reduction(&sk(&reduced), &pairs, len as u64),
            Ok(Ok(()))
        );
    }

    #[test]
    fn composite_without_loss_renormalises_like_epoch_zero() {
        assert_eq!(composite_without_loss(1.0, Some(1.0)), 1.0);
        assert_eq!(composite_without_loss(0.0, Some(0.0)), 0.0);
        assert!((composite_without_loss(0.5, Some(0.25)) - (0.15 + 0.05) / 0.5).abs() < 1e-15);
        assert_eq!(composite_without_loss(0.7, None), 0.7);
    }

    #[test]
    fn exact_copies_the_earliest_commitment_keeps_and_the_original_loses_nothing() {
        let len = 8_000;
        let d = honest(2, 5, len);
        let sketches: Vec<Sketch> = d[..5].iter().map(|x| sk(x)).collect();
        let last = sk(&d[5]);
        let c = ctx(len, Some(&last), Some(median_norm(&d[..5])));
        let base = score_sketches(&members(&sketches), &c).unwrap();
        assert_eq!(base.excluded(), 0);

        // A later copy of member 2 (same committed hash; even a forged sketch).
        let mut forged = sketches[2].clone();
        forged.rows[0] += 1.0;
        for copy in [&sketches[2], &forged] {
            let mut m = members(&sketches);
            m.push(MemberSketch {
                node: node(9),
                commit_seq: 99,
                delta_hash: hash_of(2),
                sketch: copy,
            });
            let s = score_sketches(&m, &c).unwrap();
            assert_eq!(
                s.verdicts[..5],
                base.verdicts[..],
                "the original loses nothing"
            );
            assert_eq!(
                s.verdicts[5].excluded,
                Some(Exclusion::Duplicate { of: node(2) })
            );
            assert_eq!(s.verdicts[5].weight, 0.0);
        }

        assert_eq!(
            score_sketches(
                &[
                    members(&sketches)[2],
                    MemberSketch {
                        node: node(9),
                        commit_seq: 9,
                        delta_hash: hash_of(2),
                        sketch: &sketches[2],
                    },
                ],
                &c,
            )
            .unwrap()
            .copy_pairs(),
            vec![(node(9), node(2))]
        );

        // A colluder given the delta before its owner committed: the pair shares one
        // member's weight, exactly what the owner alone would get.
        let mut m = members(&sketches);
        m.push(MemberSketch {
            node: node(9),
            commit_seq: 0,
            delta_hash: hash_of(2),
            sketch: &sketches[2],
        });
        m[0].commit_seq = 1; // still before member 1 (seq 1 ties broken by node)
        let s = score_sketches(&m, &c).unwrap();
        assert_eq!(
            s.verdicts[2].excluded,
            Some(Exclusion::Duplicate { of: node(9) })
        );
        // (Equal up to the order of the weight sum, which follows the commitments.)
        assert!((s.verdicts[5].weight - base.verdicts[2].weight).abs() < 1e-15);
        assert_eq!(s.verdicts[2].weight, 0.0);
    }

    #[test]
    fn rescaled_and_noisy_copies_are_near_copies() {
        let len = 8_000;
        let d = honest(3, 5, len);
        let mut rng = ChaCha8Rng::seed_from_u64(33);
        let norm = l2_norm(&d[1]).unwrap() as f32;
        let noise: Vec<f32> = (0..len).map(|_| gauss(&mut rng)).collect();
        let noise_norm = l2_norm(&noise).unwrap() as f32;
        let copies: Vec<Vec<f32>> = vec![
            d[1].iter().map(|v| v * 0.5).collect(),
            d[1].iter().map(|v| v * 1.7).collect(),
            d[1].iter()
                .zip(&noise)
                .map(|(v, e)| v + 0.05 * norm / noise_norm * e)
                .collect(),
        ];
        let sketches: Vec<Sketch> = d[..5].iter().map(|x| sk(x)).collect();
        let last = sk(&d[5]);
        let c = ctx(len, Some(&last), None);
        let base = score_sketches(&members(&sketches), &c).unwrap();
        for copy in &copies {
            let copy = sk(copy);
            let mut m = members(&sketches);
            m.push(MemberSketch {
                node: node(9),
                commit_seq: 9,
                delta_hash: hash_of(9),
                sketch: &copy,
            });
            let s = score_sketches(&m, &c).unwrap();
            assert!(
                matches!(s.verdicts[5].excluded, Some(Exclusion::NearCopy { of, .. }) if of == node(1)),
                "{:?}",
                s.verdicts[5]
            );
            assert_eq!(s.verdicts[..5], base.verdicts[..]);
        }
    }

    #[test]
    fn a_member_resembling_only_an_excluded_copy_is_kept() {
        // A; B = A + 8 % noise (a copy of A); C = A + 16 % along the same noise: C is
        // within the copy tolerance of B (excluded) but not of A.
        let len = 16_000;
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        let a: Vec<f32> = (0..len).map(|_| gauss(&mut rng)).collect();
        let e: Vec<f32> = (0..len).map(|_| gauss(&mut rng)).collect();
        let at = |t: f32| -> Vec<f32> { a.iter().zip(&e).map(|(x, y)| x + t * y).collect() };
        let sketches = vec![sk(&a), sk(&at(0.08)), sk(&at(0.16))];
        let s = score_sketches(&members(&sketches), &ctx(len, None, None)).unwrap();
        assert!(matches!(
            s.verdicts[1].excluded,
            Some(Exclusion::NearCopy { of, .. }) if of == node(0)
        ));
        assert_eq!(s.verdicts[2].excluded, None, "{:?}", s.verdicts[2]);
        assert_eq!(s.verdicts[0].excluded, None);
    }

    #[test]
    fn the_copy_tolerance_separates_close_honest_pairs_from_noisy_copies() {
        // Over 100 seeds: a pair at true cosine 0.98 (20 % independent noise) is never read
        // as a copy, a copy with 7 % noise (cosine 0.9976) always is.
        let len = 8_000;
        for seed in 0..100u64 {
            let mut rng = ChaCha8Rng::seed_from_u64(1000 + seed);
            let a: Vec<f32> = (0..len).map(|_| gauss(&mut rng)).collect();
            let e: Vec<f32> = (0..len).map(|_| gauss(&mut rng)).collect();
            let s_seed = [seed as u8; 32];
            let sa = sketch(&s_seed, K, &a).unwrap();
            for (t, copy) in [(0.203f32, false), (0.07, true)] {
                let b: Vec<f32> = a.iter().zip(&e).map(|(x, y)| x + t * y).collect();
                let sb = sketch(&s_seed, K, &b).unwrap();
                let pair = [sa.clone(), sb];
                let c = SketchContext {
                    rows: K,
                    len: len as u64,
                    last_merged: None,
                    norms: NormTracker::new(),
                    config: SketchScoreConfig::default(),
                };
                let s = score_sketches(&members(&pair), &c).unwrap();
                assert_eq!(
                    matches!(s.verdicts[1].excluded, Some(Exclusion::NearCopy { .. })),
                    copy,
                    "seed {seed}, noise {t}: {:?}",
                    s.verdicts[1]
                );
            }
        }
    }

    #[test]
    fn malformed_sketches_are_excluded_and_the_rest_scored() {
        let len = 8_000;
        let d = honest(5, 4, len);
        let good: Vec<Sketch> = d[..4].iter().map(|x| sk(x)).collect();
        let mut bad = Vec::new();
        bad.push(sketch(&SEED, K / 2, &d[0]).unwrap());
        bad.push(sk(&d[0][..len - 1]));
        let mut nan = good[0].clone();
        nan.rows[3] = f64::NAN;
        bad.push(nan);
        let mut light = good[0].clone();
        light.abs_rows[3] = light.rows[3].abs() / 2.0;
        bad.push(light);
        let mut inflated = good[0].clone();
        inflated.abs_rows.iter_mut().for_each(|a| *a *= 1e6);
        bad.push(inflated);
        let mut huge = good[0].clone();
        huge.rows.iter_mut().for_each(|r| *r = 1e200);
        huge.abs_rows.iter_mut().for_each(|r| *r = 1e200);
        bad.push(huge);
        let mut all = good.clone();
        all.extend(bad);
        let s = score_sketches(&members(&all), &ctx(len, None, None)).unwrap();
        assert_weights(&s);
        for v in &s.verdicts[..4] {
            assert_eq!(v.excluded, None);
        }
        let reasons: Vec<&Exclusion> = s.verdicts[4..]
            .iter()
            .map(|v| v.excluded.as_ref().unwrap())
            .collect();
        assert!(matches!(
            reasons[0],
            Exclusion::Malformed(Malformation::Rows {
                found: 128,
                expected: 256
            })
        ));
        assert!(matches!(
            reasons[1],
            Exclusion::Malformed(Malformation::Len { .. })
        ));
        assert!(matches!(
            reasons[2],
            Exclusion::Malformed(Malformation::NotWellFormed)
        ));
        assert!(matches!(
            reasons[3],
            Exclusion::Malformed(Malformation::NotWellFormed)
        ));
        assert!(matches!(
            reasons[4],
            Exclusion::Malformed(Malformation::Implausible { .. })
        ));
        assert!(matches!(
            reasons[5],
            Exclusion::Malformed(Malformation::NotWellFormed)
        ));
        for v in &s.verdicts[4..] {
            assert_eq!((v.score, v.norm_estimate), (None, None));
        }
        assert!(s.robust_needed(0.30), "6 of 10 excluded");
    }

    #[test]
    fn inputs_the_caller_owns_are_errors() {
        let len = 4_000;
        let d = honest(6, 3, len);
        let sk3: Vec<Sketch> = d[..3].iter().map(|x| sk(x)).collect();
        let c = ctx(len, None, None);
        assert_eq!(score_sketches(&[], &c), Err(SketchScoreError::NoMembers));
        let mut m = members(&sk3);
        m[2].node = node(0);
        assert_eq!(
            score_sketches(&m, &c),
            Err(SketchScoreError::DuplicateNode(node(0)))
        );
        let wrong = sketch(&SEED, 64, &d[3]).unwrap();
        assert!(matches!(
            score_sketches(&members(&sk3), &ctx(len, Some(&wrong), None)),
            Err(SketchScoreError::LastMerged(Malformation::Rows { .. }))
        ));
        let mut bad_cfg = c;
        bad_cfg.config.copy_cosine = f64::NAN;
        assert!(matches!(
            score_sketches(&members(&sk3), &bad_cfg),
            Err(SketchScoreError::Config {
                what: "copy_cosine",
                ..
            })
        ));
        // Every member unusable: a typed error, not an empty merge.
        let short: Vec<Sketch> = d[..3].iter().map(|x| sk(&x[..10])).collect();
        assert_eq!(
            score_sketches(&members(&short), &c),
            Err(SketchScoreError::NoUsableMember { excluded: 3 })
        );
        // One member, and two: kept (nothing to compare them with but the norm average).
        for n in [1, 2] {
            let s = score_sketches(&members(&sk3[..n]), &c).unwrap();
            assert_eq!(s.excluded(), 0);
            assert_weights(&s);
        }
        // A zero delta (a free-rider that trained nothing): excluded, never a division by 0.
        let zero = sk(&vec![0.0; len]);
        let mut with_zero = sk3.clone();
        with_zero.push(zero);
        let s = score_sketches(&members(&with_zero), &c).unwrap();
        assert_eq!(s.verdicts[3].centre_cosine, None);
        assert_eq!(s.verdicts[3].excluded, Some(Exclusion::NoUpdate));
        assert_eq!(s.verdicts[3].weight, 0.0);
        assert_weights(&s);
    }

    #[test]
    fn a_free_rider_committing_the_last_merged_update_gets_no_weight() {
        let len = 8_000;
        let d = honest(11, 5, len);
        // The last global update: the mean of another epoch's honest deltas.
        let last: Vec<f32> = (0..len)
            .map(|j| d.iter().map(|x| x[j]).sum::<f32>() / d.len() as f32)
            .collect();
        let last_sketch = sk(&last);
        let mut all: Vec<Sketch> = honest(12, 4, len).iter().map(|x| sk(x)).collect();
        // Committed as is, and rescaled (a free-rider hiding the copy by its norm).
        all.push(sk(&last));
        all.push(sk(&last.iter().map(|v| 0.8 * v).collect::<Vec<_>>()));
        let s = score_sketches(&members(&all), &ctx(len, Some(&last_sketch), None)).unwrap();
        for v in &s.verdicts[5..] {
            assert!(
                matches!(v.excluded, Some(Exclusion::CopiesLastMerged { .. })),
                "{v:?}"
            );
            assert_eq!(v.weight, 0.0);
        }
        assert!(
            s.verdicts[..5].iter().all(|v| v.excluded.is_none()),
            "{:#?}",
            s.verdicts
        );
        assert_weights(&s);
    }

    #[test]
    fn a_third_of_attackers_asks_for_the_star() {
        let len = 8_000;
        let d = honest(7, 7, len);
        let mut all: Vec<Sketch> = d[..5].iter().map(|x| sk(x)).collect();
        all.push(sk(&d[5].iter().map(|v| -v).collect::<Vec<_>>()));
        all.push(sk(&d[6].iter().map(|v| 20.0 * v).collect::<Vec<_>>()));
        let s = score_sketches(&members(&all), &ctx(len, None, None)).unwrap();
        assert_eq!(s.excluded(), 2, "{:#?}", s.verdicts);
        assert!(s.robust_needed(0.25));
        assert!(!s.robust_needed(0.30), "2/7 = 0.286");
        assert!(!s.robust_needed(f32::NAN));
    }

    /// Sample standard deviation.
    fn sd(v: &[f64]) -> f64 {
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (v.len() - 1) as f64).sqrt()
    }

    #[test]
    fn sketched_estimates_have_the_stated_deviation() {
        // Over 200 seeds, for uniform and for block-profiled (heavy-tailed) vectors at
        // cosines 0 and 0.6: the measured sd of the norm, inner product and cosine errors
        // stays within 1.25× of the module docs' `√(1/(2k))`, `√((1 + ρ²)/k)` and
        // `(1 − ρ²)/√k`.
        let len = 40_000;
        let k = K as f64;
        for (profiled, rho) in [(false, 0.0), (false, 0.6), (true, 0.0), (true, 0.6)] {
            let mut rng = ChaCha8Rng::seed_from_u64(77);
            let scale = if profiled {
                profile(&mut rng, len)
            } else {
                vec![1.0; len.div_ceil(256)]
            };
            let x: Vec<f32> = (0..len).map(|j| scale[j / 256] * gauss(&mut rng)).collect();
            let z: Vec<f32> = (0..len).map(|j| scale[j / 256] * gauss(&mut rng)).collect();
            // Make z exactly orthogonal to x, then y = ρ·x + √(1 − ρ²)·z at equal norms.
            let (nx, xz) = (
                l2_norm(&x).unwrap(),
                x.iter()
                    .zip(&z)
                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                    .sum::<f64>(),
            );
            let z: Vec<f32> = z
                .iter()
                .zip(&x)
                .map(|(b, a)| b - (xz / (nx * nx)) as f32 * a)
                .collect();
            let nz = l2_norm(&z).unwrap();
            let y: Vec<f32> = x
                .iter()
                .zip(&z)
                .map(|(a, b)| {
                    (rho * f64::from(*a) + (1.0 - rho * rho).sqrt() * nx / nz * f64::from(*b))
                        as f32
                })
                .collect();
            let ny = l2_norm(&y).unwrap();
            let exact_cos = crate::score::cosine_similarity(&x, &y).unwrap();
            let exact_dot = exact_cos * nx * ny;
            let (mut norm_err, mut dot_err, mut cos_err) = (vec![], vec![], vec![]);
            for seed in 0..200u8 {
                let s = [seed; 32];
                let (sx, sy) = (sketch(&s, K, &x).unwrap(), sketch(&s, K, &y).unwrap());
                norm_err.push(sx.norm_sq().sqrt() / nx - 1.0);
                dot_err.push((sx.dot(&sy).unwrap() - exact_dot) / (nx * ny));
                cos_err.push(sx.cosine(&sy).unwrap().unwrap() - exact_cos);
            }
            let rho2 = exact_cos * exact_cos;
            let bounds = [
                ("norm", sd(&norm_err), (1.0 / (2.0 * k)).sqrt()),
                ("dot", sd(&dot_err), ((1.0 + rho2) / k).sqrt()),
                ("cosine", sd(&cos_err), (1.0 - rho2) / k.sqrt()),
            ];
            for (what, measured, stated) in bounds {
                println!(
                    "profiled {profiled} ρ {rho}: {what} sd {measured:.4} (stated {stated:.4})"
                );
                assert!(
                    measured <= 1.25 * stated,
                    "profiled {profiled} ρ {rho}: {what} sd {measured} > 1.25 × {stated}"
                );
            }
        }
    }

    /// An honest set of `n`, an optional attacker (last), the last merged delta's sketch and
    /// the honest median norm.
    fn scenario(
        seed: u64,
        n: usize,
        len: usize,
        attack: Option<f32>,
    ) -> (Vec<Sketch>, Sketch, f64) {
        let d = honest(seed, n + 1, len);
        let mut sketches: Vec<Sketch> = d[..n].iter().map(|x| sk(x)).collect();
        let med = median_norm(&d[..n]);
        if let Some(c) = attack {
            // A scaling makes the attacker's norm `c` times the honest median; a flip
            // (`c < 0`) negates and rescales the attacker's own honest delta.
            let f = if c > 0.0 {
                c * (med / l2_norm(&d[n]).unwrap()) as f32
            } else {
                c
            };
            sketches.push(sk(&d[n].iter().map(|v| f * v).collect::<Vec<_>>()));
        }
        (sketches, sk(&d[n + 1]), med)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        /// Honest members of realistic spread are never excluded, whatever the epoch.
        #[test]
        fn honest_sets_are_never_excluded(
            seed in any::<u64>(),
            n in 3usize..10,
            len in 4_096usize..16_384,
            epoch0 in any::<bool>(),
            avg in proptest::option::of(0.8f64..1.25),
        ) {
            let (sketches, last, med) = scenario(seed, n, len, None);
            let c = ctx(len, (!epoch0).then_some(&last), avg.map(|f| f * med));
            let s = score_sketches(&members(&sketches), &c).unwrap();
            prop_assert_eq!(s.excluded(), 0, "seed {}: {:#?}", seed, s.verdicts);
            prop_assert!((weight_sum(&s) - 1.0).abs() < 1e-12, "seed {}", seed);
            prop_assert!(s.verdicts.iter().all(|v| v.weight > 0.0));
        }

        /// A scaled delta (norm 5 to 1000 times the honest median, i.e. at least 4× the
        /// running average: star mode's suspect norm is 3×) or a sign-flipped one (−0.3 to
        /// −3 times an honest delta) is excluded, and no honest member is.
        #[test]
        fn scaled_and_flipped_deltas_are_excluded(
            seed in any::<u64>(),
            n in 4usize..10,
            len in 4_096usize..12_000,
            scale in 5f32..1000.0,
            flip in -3f32..-0.3,
            flipped in any::<bool>(),
            avg in proptest::option::of(0.8f64..1.25),
            at in any::<prop::sample::Index>(),
        ) {
            let c = if flipped { flip } else { scale };
            let (sketches, last, med) = scenario(seed, n, len, Some(c));
            let mut m = members(&sketches);
            // The attacker commits anywhere in the order.
            m[n].commit_seq = at.index(n + 1) as u64;
            let ctx = ctx(len, Some(&last), avg.map(|f| f * med));
            let s = score_sketches(&m, &ctx).unwrap();
            prop_assert!(s.verdicts[n].excluded.is_some(), "seed {} c {}: {:?}", seed, c, s.verdicts[n]);
            prop_assert!(
                s.verdicts[..n].iter().all(|v| v.excluded.is_none()),
                "seed {} c {}: {:#?}", seed, c, s.verdicts
            );
            prop_assert!((weight_sum(&s) - 1.0).abs() < 1e-12);
        }

        /// The verdicts do not depend on the order the members are listed in, bit for bit.
        #[test]
        fn verdicts_are_permutation_invariant(
            seed in any::<u64>(),
            n in 2usize..9,
            attack in proptest::option::of(prop_oneof![Just(-1.0f32), Just(10.0f32)]),
            copy in any::<bool>(),
            shuffle in any::<u64>(),
        ) {
            let len = 4_096;
            let (mut sketches, last, _) = scenario(seed, n, len, attack);
            if copy {
                sketches.push(sketches[0].clone());
            }
            let m = members(&sketches);
            let c = ctx(len, Some(&last), None);
            let base = score_sketches(&m, &c).unwrap();
            let mut perm: Vec<usize> = (0..m.len()).collect();
            perm.shuffle(&mut ChaCha8Rng::seed_from_u64(shuffle));
            let pm: Vec<MemberSketch> = perm.iter().map(|&i| m[i]).collect();
            let s = score_sketches(&pm, &c).unwrap();
            for (v, &i) in s.verdicts.iter().zip(&perm) {
                prop_assert_eq!(v, &base.verdicts[i]);
            }
            prop_assert_eq!((s.norms, s.distance_limit, s.opposed_limit),
                (base.norms, base.distance_limit, base.opposed_limit));
        }

        /// The sketched stability and convergence are star mode's (on the full vectors)
        /// within 6 of the module docs' standard deviations.
        #[test]
        fn sketched_stability_and_convergence_track_star_mode(
            seed in any::<u64>(),
            sketch_seed in any::<[u8; 32]>(),
            len in 2_000usize..20_000,
            avg_factor in 0.5f64..2.0,
            // Below about 0.1 the delta is a copy of the last merged one (cosine ≥ 0.995),
            // which rule 3 excludes as free-riding.
            mix in 0.2f32..3.0,
        ) {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let scale = profile(&mut rng, len);
            let x: Vec<f32> = (0..len).map(|j| scale[j / 256] * gauss(&mut rng)).collect();
            let last: Vec<f32> = x
                .iter()
                .enumerate()
                .map(|(j, v)| v + mix * scale[j / 256] * gauss(&mut rng))
                .collect();
            let norm = l2_norm(&x).unwrap();
            let avg = norm * avg_factor;
            let s_exact = star_stability(norm, Some(avg)).unwrap();
            let c_exact = star_convergence(&x, Some(&last)).unwrap().unwrap();
            let sx = sketch(&sketch_seed, K, &x).unwrap();
            let sl = sketch(&sketch_seed, K, &last).unwrap();
            let m = [MemberSketch { node: node(0), commit_seq: 0, delta_hash: hash_of(0), sketch: &sx }];
            let c = SketchContext {
                rows: K,
                len: len as u64,
                last_merged: Some(&sl),
                norms: NormTracker::from_average(Some(avg)).unwrap(),
                config: SketchScoreConfig::default(),
            };
            let v = &score_sketches(&m, &c).unwrap().verdicts[0];
            let k = K as f64;
            let r = norm / avg;
            let s_bound = 6.0 * 2.0 * r * (1.0 / (2.0 * k)).sqrt();
            let c_bound = 6.0 * (1.0 - c_exact * c_exact) / k.sqrt() + 2.0 / k;
            let (s, conv) = (v.stability.unwrap(), v.convergence.unwrap());
            prop_assert!((s - s_exact).abs() <= s_bound,
                "seed {}: stability {} vs exact {} (bound {})", seed, s, s_exact, s_bound);
            prop_assert!((conv - c_exact).abs() <= c_bound,
                "seed {}: convergence {} vs exact {} (bound {})", seed, conv, c_exact, c_bound);
        }
    }
}
