//! Delta score math and the commit–reveal spot-check selection: pure, deterministic
//! functions and small state machines (no I/O, no model code).
//!
//! * Quality (paper §5.1, listing "Delta validation pipeline", with the DESIGN §12
//!   corrections): [`loss_improvement`], [`NormTracker`] (stability), [`convergence`],
//!   [`composite`] and [`QualityScore`].
//! * Spot-check selection (DESIGN §6, replacing the listing's `rand::random` per DESIGN §12):
//!   [`EpochSecret`], [`Commitment`], [`is_spot_checked`], [`verify_reveal`].
//! * Spot-check comparison (paper §5.2, DESIGN §6): [`loss_matches`].
//!
//! Every score is a dimensionless number in `[0, 1]`; losses are in the job's loss unit
//! (e.g. nats per token); norms are L2 norms of the delta flattened to one vector.

use rand::{CryptoRng, RngCore};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Errors of the score math and of the spot-check reveal.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScoreError {
    /// An input that must be finite was NaN or ±∞ (`what` names the input).
    #[error("{what} is not finite ({value})")]
    NonFinite {
        /// Which input.
        what: &'static str,
        /// The offending value.
        value: f64,
    },
    /// An input was outside its domain (a negative norm, a score outside `[0, 1]`).
    #[error("{what} = {value} is out of range {range}")]
    OutOfRange {
        /// Which input.
        what: &'static str,
        /// The offending value.
        value: f64,
        /// The accepted range, in words.
        range: &'static str,
    },
    /// The two vectors of a cosine have different lengths.
    #[error("vector lengths differ: {left} vs {right}")]
    LengthMismatch {
        /// Length of the first vector (elements).
        left: usize,
        /// Length of the second vector (elements).
        right: usize,
    },
    /// A revealed epoch secret does not hash to the commitment published at epoch start.
    #[error("revealed secret does not match commitment {commitment}")]
    RevealMismatch {
        /// The commitment, lower-case hex.
        commitment: String,
    },
}

fn finite(what: &'static str, value: f64) -> Result<f64, ScoreError> {
    if value.is_finite() {
        Ok(value)
    } else {
        Err(ScoreError::NonFinite { what, value })
    }
}

fn unit(what: &'static str, value: f64) -> Result<f64, ScoreError> {
    finite(what, value)?;
    if (0.0..=1.0).contains(&value) {
        Ok(value)
    } else {
        Err(ScoreError::OutOfRange {
            what,
            value,
            range: "[0, 1]",
        })
    }
}

// ---------------------------------------------------------------------------------------
// Quality (paper §5.1, DESIGN §6 and §12)
// ---------------------------------------------------------------------------------------

/// Weight of the loss improvement in the composite (paper §5.1 listing: `0.5 * delta_l`).
pub const W_LOSS: f64 = 0.5;
/// Weight of the stability in the composite (paper §5.1 listing: `0.3 * stability`).
pub const W_STABILITY: f64 = 0.3;
/// Weight of the convergence in the composite (paper §5.1 listing: `0.2 * convergence`).
pub const W_CONVERGENCE: f64 = 0.2;
/// Smoothing factor of the running norm average (paper §5.1 listing:
/// `running_norm_avg = 0.95 * running_norm_avg + 0.05 * norm`).
pub const NORM_EMA_ALPHA: f64 = 0.05;

/// Relative validation-loss improvement `dl`, dimensionless, in `[0, 1]`.
///
/// Paper §5.1 listing: `delta_l = ((loss_before - loss_after) / loss_before).max(0.0)`,
/// where both losses are measured on the validation shard (before: the epoch's checkpoint,
/// computed once per epoch per DESIGN §6; after: the checkpoint plus this delta).
/// The listing's value is already `≤ 1` for a non-negative `loss_after`; we also clamp to
/// `1` so that a negative loss (not a cross-entropy) cannot push the composite above 1.
/// `loss_before ≤ 0` leaves no room for a relative improvement (and the listing would
/// divide by zero): `dl = 0`.
///
/// Errors: [`ScoreError::NonFinite`] when either loss is NaN or ±∞.
pub fn loss_improvement(loss_before: f64, loss_after: f64) -> Result<f64, ScoreError> {
    finite("loss_before", loss_before)?;
    finite("loss_after", loss_after)?;
    if loss_before <= 0.0 {
        return Ok(0.0);
    }
    let dl = (loss_before - loss_after) / loss_before;
    // `dl` is finite here: both operands finite, divisor > 0; the quotient can only
    // overflow to +∞ for absurd magnitudes, which the clamp maps to 1.
    Ok(if dl.is_nan() { 0.0 } else { dl.clamp(0.0, 1.0) })
}

/// Stability `s = exp(-2 |norm / avg - 1|)`, dimensionless, in `(0, 1]` (paper §5.1).
///
/// `avg` is the running average of accepted delta norms ([`NormTracker::average`]);
/// `None` (no delta accepted yet) means the average is initialised with this norm
/// (DESIGN §12: the listing starts it at 0, a division by zero), so `s = 1`.
///
/// Errors: [`ScoreError::NonFinite`] for a NaN/∞ norm or average,
/// [`ScoreError::OutOfRange`] for a negative norm or a non-positive average.
pub fn stability(norm: f64, avg: Option<f64>) -> Result<f64, ScoreError> {
    check_norm(norm)?;
    let Some(avg) = avg else { return Ok(1.0) };
    finite("norm average", avg)?;
    if avg <= 0.0 {
        return Err(ScoreError::OutOfRange {
            what: "norm average",
            value: avg,
            range: "(0, ∞)",
        });
    }
    // norm / avg may overflow to +∞ for a subnormal average: exp(-∞) = 0, still finite.
    Ok((-2.0 * (norm / avg - 1.0).abs()).exp().clamp(0.0, 1.0))
}

fn check_norm(norm: f64) -> Result<f64, ScoreError> {
    finite("norm", norm)?;
    if norm < 0.0 {
        return Err(ScoreError::OutOfRange {
            what: "norm",
            value: norm,
            range: "[0, ∞)",
        });
    }
    Ok(norm)
}

/// Running average of the L2 norms of accepted deltas (paper §5.1 `running_norm_avg`).
///
/// Update rule (the listing's EMA): `avg ← 0.95 avg + 0.05 norm` ([`NORM_EMA_ALPHA`]).
/// Initialisation (DESIGN §12): the first accepted positive norm becomes the average
/// (the listing starts at 0 and divides by it). Zero norms accepted before that leave the
/// average unset, so it is never 0 and the stability never divides by zero.
///
/// Call [`NormTracker::stability`] while scoring a delta and [`NormTracker::accept`] once
/// it has passed validation (the listing updates after computing the score); rejected
/// deltas do not move the average. Serialisable so the state store can keep it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct NormTracker {
    avg: Option<f64>,
}

impl NormTracker {
    /// A tracker with no accepted delta yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A tracker restored from a stored average (`None` = nothing accepted yet).
    ///
    /// Errors: the stored average must be finite and positive.
    pub fn from_average(avg: Option<f64>) -> Result<Self, ScoreError> {
        if let Some(a) = avg {
            finite("norm average", a)?;
            if a <= 0.0 {
                return Err(ScoreError::OutOfRange {
                    what: "norm average",
                    value: a,
                    range: "(0, ∞)",
                });
            }
        }
        Ok(Self { avg })
    }

    /// The running average (L2-norm units), `None` until a positive norm is accepted.
    pub fn average(&self) -> Option<f64> {
        self.avg
    }

    /// Stability of a delta of L2 norm `norm` against the current average: see [`stability`].
    pub fn stability(&self, norm: f64) -> Result<f64, ScoreError> {
        stability(norm, self.avg)
    }

    /// Folds the norm of an accepted delta into the average (EMA, see the type's doc).
    ///
    /// Errors: a NaN/∞ or negative norm; the tracker is unchanged.
    pub fn accept(&mut self, norm: f64) -> Result<(), ScoreError> {
        check_norm(norm)?;
        self.avg = match self.avg {
            None if norm > 0.0 => Some(norm),
            None => None,
            Some(a) => {
                let next = (1.0 - NORM_EMA_ALPHA) * a + NORM_EMA_ALPHA * norm;
                // After a very long run of zero norms the EMA could underflow to 0; keep
                // the smallest positive value instead so the average stays a valid divisor.
                Some(if next > 0.0 { next } else { f64::MIN_POSITIVE })
            }
        };
        Ok(())
    }
}

/// L2 norm of an f32 vector (e.g. a delta flattened over all its tensors), accumulated in
/// f64 (no overflow: squares of finite f32 are below 1.2e77).
///
/// Errors: [`ScoreError::NonFinite`] when an element is NaN or ±∞.
pub fn l2_norm(v: &[f32]) -> Result<f64, ScoreError> {
    let mut sum = 0.0f64;
    for &x in v {
        let x = finite("vector element", f64::from(x))?;
        sum += x * x;
    }
    Ok(sum.sqrt())
}

/// Streaming cosine similarity over pairs of f32 chunks with f64 accumulation, so a delta
/// stored as many tensors can be compared with the last merged delta tensor by tensor
/// (feed the chunks of both in the same order).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CosineAccumulator {
    dot: f64,
    norm_a: f64,
    norm_b: f64,
    len: u64,
}

impl CosineAccumulator {
    /// An empty accumulator.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one pair of chunks (equal lengths, elements finite).
    ///
    /// Errors: [`ScoreError::LengthMismatch`], [`ScoreError::NonFinite`]; on error the
    /// accumulator is unchanged.
    pub fn update(&mut self, a: &[f32], b: &[f32]) -> Result<(), ScoreError> {
        if a.len() != b.len() {
            return Err(ScoreError::LengthMismatch {
                left: a.len(),
                right: b.len(),
            });
        }
        let (mut dot, mut na, mut nb) = (0.0f64, 0.0f64, 0.0f64);
        for (&x, &y) in a.iter().zip(b) {
            let x = finite("vector element", f64::from(x))?;
            let y = finite("vector element", f64::from(y))?;
            dot += x * y;
            na += x * x;
            nb += y * y;
        }
        self.dot += dot;
        self.norm_a += na;
        self.norm_b += nb;
        self.len += a.len() as u64;
        Ok(())
    }

    /// Number of element pairs seen.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether no element pair has been seen.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `cos(a, b) = a·b / (|a| |b|)` in `[-1, 1]`; `0` when either vector is zero (a zero
    /// delta has no direction, so it contributes nothing to convergence).
    pub fn cosine(&self) -> f64 {
        cosine_of(self.dot, self.norm_a.sqrt(), self.norm_b.sqrt())
    }
}

/// `a·b / (|a| |b|)` clamped to `[-1, 1]`, `0` when either norm is zero.
fn cosine_of(dot: f64, norm_a: f64, norm_b: f64) -> f64 {
    if norm_a == 0.0 || norm_b == 0.0 {
        return 0.0;
    }
    (dot / (norm_a * norm_b)).clamp(-1.0, 1.0)
}

/// Cosine similarity of two f32 vectors of equal length, f64 accumulation, in `[-1, 1]`;
/// `0` when either is the zero vector. See [`CosineAccumulator`].
pub fn cosine_similarity(a: &[f32], b: &[f32]) -> Result<f64, ScoreError> {
    let mut acc = CosineAccumulator::new();
    acc.update(a, b)?;
    Ok(acc.cosine())
}

/// Convergence `c = max(0, cos(delta, last merged delta))` in `[0, 1]` (paper §5.1).
///
/// `delta` and `last_merged` are the flattened deltas (same parameter order, same length).
/// `last_merged = None` (epoch 0: nothing merged yet) gives `Ok(None)`, and the composite
/// is then renormalised over the other two terms (DESIGN §12).
pub fn convergence(delta: &[f32], last_merged: Option<&[f32]>) -> Result<Option<f64>, ScoreError> {
    match last_merged {
        None => Ok(None),
        Some(prev) => Ok(Some(cosine_similarity(delta, prev)?.max(0.0))),
    }
}

/// Convergence `c = max(0, cos(delta, last merged))` (paper §5.1, as [`convergence`]) from
/// parts computed elsewhere: `dot = ⟨delta, last⟩`, `norm = ‖delta‖₂`,
/// `last_norm = ‖last‖₂` (e.g. a LoRA delta's update `ΔW`, streamed module by module by
/// [`crate::lora::add_adapter_update`], against the last merged update in the full layout).
/// `0` when either norm is zero; the ratio is clamped to `[-1, 1]` against rounding.
///
/// Errors: [`ScoreError::NonFinite`] for a NaN or ±∞ input, [`ScoreError::OutOfRange`] for
/// a negative norm.
pub fn convergence_of_parts(dot: f64, norm: f64, last_norm: f64) -> Result<f64, ScoreError> {
    finite("dot product", dot)?;
    for (what, n) in [("delta norm", norm), ("last merged norm", last_norm)] {
        if finite(what, n)? < 0.0 {
            return Err(ScoreError::OutOfRange {
                what,
                value: n,
                range: "[0, ∞)",
            });
        }
    }
    Ok(cosine_of(dot, norm, last_norm).max(0.0))
}

/// Composite quality `q = 0.5 dl + 0.3 s + 0.2 c` (paper §5.1); without a convergence term
/// (epoch 0) `q = (0.5 dl + 0.3 s) / 0.8` (DESIGN §12). For inputs in `[0, 1]` the result is
/// in `[0, 1]` (clamped against rounding). Inputs are not checked here: use
/// [`QualityScore::new`] for checked construction.
pub fn composite(loss_improvement: f64, stability: f64, convergence: Option<f64>) -> f64 {
    let q = match convergence {
        Some(c) => W_LOSS * loss_improvement + W_STABILITY * stability + W_CONVERGENCE * c,
        None => (W_LOSS * loss_improvement + W_STABILITY * stability) / (W_LOSS + W_STABILITY),
    };
    q.clamp(0.0, 1.0)
}

/// The quality of one delta (paper §5.1 `DeltaScore`): every field finite, in `[0, 1]`.
/// The composite is the merge weight of paper §6.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct QualityScore {
    /// Relative validation-loss improvement `dl` ([`loss_improvement`]).
    pub loss_improvement: f64,
    /// Norm stability `s` ([`stability`]).
    pub stability: f64,
    /// Convergence `c` ([`convergence`]); `None` in epoch 0 (no previous merged delta).
    pub convergence: Option<f64>,
    /// Composite `q` ([`composite`]).
    pub composite: f64,
}

impl QualityScore {
    /// Builds a score from its three terms and computes the composite.
    ///
    /// Errors: a term that is NaN/∞ ([`ScoreError::NonFinite`]) or outside `[0, 1]`
    /// ([`ScoreError::OutOfRange`]).
    pub fn new(
        loss_improvement: f64,
        stability: f64,
        convergence: Option<f64>,
    ) -> Result<Self, ScoreError> {
        let dl = unit("loss improvement", loss_improvement)?;
        let s = unit("stability", stability)?;
        let c = convergence.map(|c| unit("convergence", c)).transpose()?;
        Ok(Self {
            loss_improvement: dl,
            stability: s,
            convergence: c,
            composite: composite(dl, s, c),
        })
    }

    /// Scores a delta from its measurements (paper §5.1 listing, step 3):
    /// validation losses before/after applying it, its L2 norm, the tracker of accepted norms
    /// (not updated here: call [`NormTracker::accept`] once the delta is accepted), and its
    /// convergence (`None` in epoch 0, see [`convergence`]).
    ///
    /// Errors: any non-finite input, a negative norm, a convergence outside `[0, 1]`.
    pub fn evaluate(
        loss_before: f64,
        loss_after: f64,
        norm: f64,
        norms: &NormTracker,
        convergence: Option<f64>,
    ) -> Result<Self, ScoreError> {
        let dl = loss_improvement(loss_before, loss_after)?;
        let s = norms.stability(norm)?;
        Self::new(dl, s, convergence)
    }
}

// ---------------------------------------------------------------------------------------
// Commit–reveal spot-check selection (DESIGN §6, DESIGN §12)
// ---------------------------------------------------------------------------------------

/// Default fraction of deltas spot-checked (paper §5, DESIGN §6: 10 %).
pub const DEFAULT_SPOT_CHECK_RATE: f64 = 0.1;

/// The orchestrator's per-epoch secret `secret_e`: 32 bytes, committed at epoch start
/// ([`EpochSecret::commitment`]) and revealed at epoch end (DESIGN §6).
///
/// `Debug` does not print the bytes, so the secret cannot leak into logs before the reveal;
/// [`EpochSecret::as_bytes`] / [`EpochSecret::to_hex`] are the deliberate ways to reveal it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochSecret([u8; 32]);

impl std::fmt::Debug for EpochSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EpochSecret(<redacted>)")
    }
}

impl EpochSecret {
    /// Draws 32 bytes from a cryptographically secure RNG (e.g. `OsRng`; a seeded ChaCha in
    /// tests and simulation, which keeps runs reproducible).
    pub fn generate<R: RngCore + CryptoRng>(rng: &mut R) -> Self {
        let mut bytes = [0u8; 32];
        rng.fill_bytes(&mut bytes);
        Self(bytes)
    }

    /// The secret of `job`'s epoch `epoch` derived from the orchestrator's private `seed`
    /// (32 bytes, e.g. a hash of its signing key): `SHA-256("hanzod-spot-check-v1" ‖ seed ‖
    /// job u64 LE ‖ epoch u32 LE)`. Fixed before any delta exists (so the orchestrator cannot
    /// pick it after seeing the deltas), unpredictable without the seed, and the same after
    /// a restart, so a commitment published at epoch start still opens at epoch end.
    pub fn derive(seed: &[u8; 32], job: u64, epoch: u32) -> Self {
        let mut h = Sha256::new();
        h.update(hanzod_actors::domain::SPOT_CHECK);
        h.update(seed);
        h.update(job.to_le_bytes());
        h.update(epoch.to_le_bytes());
        EpochSecret(h.finalize().into())
    }

    /// A secret from its bytes (e.g. a revealed secret, or one restored from the state store).
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The secret's bytes (revealing it).
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The secret as 64 lower-case hex characters (revealing it).
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// The commitment `SHA-256(secret)`, see [`commitment`].
    pub fn commitment(&self) -> Commitment {
        commitment(self)
    }
}

/// The published commitment to an epoch secret: `SHA-256(secret_e)` (DESIGN §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Commitment(pub [u8; 32]);

impl std::fmt::Display for Commitment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

/// `SHA-256(secret)` over the 32 secret bytes, nothing else (DESIGN §6).
pub fn commitment(secret: &EpochSecret) -> Commitment {
    Commitment(Sha256::digest(secret.0).into())
}

/// Checks a revealed secret against the commitment published at epoch start, so an auditor
/// can trust the secret before recomputing the selection with [`is_spot_checked`].
///
/// Errors: [`ScoreError::RevealMismatch`] when `SHA-256(secret) ≠ commitment`.
pub fn verify_reveal(commitment: &Commitment, secret: &EpochSecret) -> Result<(), ScoreError> {
    if self::commitment(secret) == *commitment {
        Ok(())
    } else {
        Err(ScoreError::RevealMismatch {
            commitment: commitment.to_string(),
        })
    }
}

/// The selection value `x`: the first 8 bytes of `SHA-256(secret ‖ delta_hash)` read as a
/// **big-endian** u64 (i.e. the number the first 16 hex digits of the digest spell).
/// `delta_hash` is the delta hash of DESIGN §6 (SHA-256 of the payload).
pub fn selection_value(secret: &EpochSecret, delta_hash: &[u8; 32]) -> u64 {
    let mut h = Sha256::new();
    h.update(secret.0);
    h.update(delta_hash);
    let digest = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

/// Whether the delta with hash `delta_hash` is spot-checked in the epoch of `secret`
/// (DESIGN §6): `x < rate × 2^64` with `x` = [`selection_value`] (big-endian).
///
/// The comparison is exact (u128 integer arithmetic against `ceil(rate × 2^64)`, with
/// `rate` the f64 value as given: 0.1 gives the bound `0x1999_9999_9999_9A00`), so
/// `rate = 0` selects nothing and `rate = 1` selects everything. `rate` is a fraction:
/// values below 0 (and NaN) select nothing, values above 1 select everything. The usual
/// rate is [`DEFAULT_SPOT_CHECK_RATE`]. Deterministic: anyone holding the revealed secret
/// recomputes the same answer; no node can predict it before the reveal.
pub fn is_spot_checked(secret: &EpochSecret, delta_hash: &[u8; 32], rate: f64) -> bool {
    let x = selection_value(secret, delta_hash);
    u128::from(x) < selection_bound(rate)
}

/// `ceil(rate × 2^64)` clamped to `[0, 2^64]` (NaN → 0). `rate × 2^64` is exact in f64.
fn selection_bound(rate: f64) -> u128 {
    const TWO_64: f64 = 18_446_744_073_709_551_616.0;
    if rate.is_nan() || rate <= 0.0 {
        return 0;
    }
    if rate >= 1.0 {
        return 1u128 << 64;
    }
    // 0 < rate < 1 ⇒ 0 < t < 2^64; `as` is exact for an integral f64 in range.
    (rate * TWO_64).ceil() as u128
}

// ---------------------------------------------------------------------------------------
// Spot-check comparison (paper §5.2, DESIGN §6)
// ---------------------------------------------------------------------------------------

/// Default relative tolerance of the spot-check loss comparison (paper §5.2: ε = 0.05).
pub const DEFAULT_LOSS_REL_TOL: f64 = 0.05;

/// Floor of the denominator in [`loss_matches`] (loss units). Below it the comparison is
/// absolute (`rel_tol × 1e-3`, i.e. 5e-5 at 5 %): f32 cross-entropy near 0 carries an
/// absolute rounding error of order 1e-6, which a pure relative test would punish.
pub const LOSS_MATCH_FLOOR: f64 = 1e-3;

/// Whether a node's claimed loss agrees with the orchestrator's recomputation (paper §5.2,
/// DESIGN §6: pre-delta weights on the claimed step's batch):
/// `|claimed − recomputed| ≤ rel_tol × max(|recomputed|, LOSS_MATCH_FLOOR)`.
///
/// The denominator is the **recomputed** loss (the orchestrator's measurement is the
/// reference, so a node cannot widen its own tolerance by inflating the claim); when the
/// recomputed loss is ≈ 0 (below [`LOSS_MATCH_FLOOR`]) the floor makes the test absolute.
/// Any NaN/∞ input, or a negative or NaN `rel_tol`, is a mismatch (`false`).
pub fn loss_matches(claimed: f64, recomputed: f64, rel_tol: f64) -> bool {
    if !(claimed.is_finite() && recomputed.is_finite() && rel_tol.is_finite()) || rel_tol < 0.0 {
        return false;
    }
    (claimed - recomputed).abs() <= rel_tol * recomputed.abs().max(LOSS_MATCH_FLOOR)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::{RngCore, SeedableRng};
    use rand_chacha::ChaCha20Rng;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12
    }

    proptest! {
        /// The convergence from parts is the convergence of the vectors the parts come
        /// from, and refuses what is not a norm.
        #[test]
        fn convergence_of_parts_is_the_convergence_of_the_vectors(
            pairs in proptest::collection::vec((-1e3f32..1e3, -1e3f32..1e3), 0..48),
            zero_a in any::<bool>(),
        ) {
            let a: Vec<f32> = pairs.iter().map(|p| if zero_a { 0.0 } else { p.0 }).collect();
            let b: Vec<f32> = pairs.iter().map(|p| p.1).collect();
            let dot: f64 = a.iter().zip(&b).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum();
            let got = convergence_of_parts(dot, l2_norm(&a).unwrap(), l2_norm(&b).unwrap()).unwrap();
            let want = convergence(&a, Some(&b)).unwrap().unwrap();
            prop_assert!((got - want).abs() <= 1e-12, "{} vs {}", got, want);
            prop_assert!((0.0..=1.0).contains(&got));
        }
    }

    #[test]
    fn convergence_of_parts_refuses_bad_inputs() {
        assert!(matches!(
            convergence_of_parts(f64::NAN, 1.0, 1.0),
            Err(ScoreError::NonFinite { .. })
        ));
        assert!(matches!(
            convergence_of_parts(1.0, f64::INFINITY, 1.0),
            Err(ScoreError::NonFinite { .. })
        ));
        assert!(matches!(
            convergence_of_parts(1.0, 1.0, -1.0),
            Err(ScoreError::OutOfRange { .. })
        ));
        assert_eq!(convergence_of_parts(0.0, 0.0, 2.0).unwrap(), 0.0);
        assert_eq!(convergence_of_parts(-3.0, 1.0, 3.0).unwrap(), 0.0);
        // Rounding past ±1 is clamped.
        assert_eq!(convergence_of_parts(2.0 + 1e-15, 1.0, 2.0).unwrap(), 1.0);
    }

    // ---- loss improvement ----

    #[test]
    fn loss_improvement_formula() {
        assert!(close(
            loss_improvement(2.0, 1.5).unwrap(),
            (2.0 - 1.5) / 2.0
        ));
        assert!(close(loss_improvement(4.0, 1.0).unwrap(), 0.75));
        // Worse after: clamped to 0 (listing `.max(0.0)`).
        assert_eq!(loss_improvement(2.0, 3.0).unwrap(), 0.0);
        // Perfect: 1; negative after: clamped to 1.
        assert_eq!(loss_improvement(2.0, 0.0).unwrap(), 1.0);
        assert_eq!(loss_improvement(2.0, -5.0).unwrap(), 1.0);
        // loss_before ≤ 0: no relative improvement, no division by zero.
        assert_eq!(loss_improvement(0.0, 0.0).unwrap(), 0.0);
        assert_eq!(loss_improvement(-1.0, -2.0).unwrap(), 0.0);
    }

    #[test]
    fn loss_improvement_rejects_non_finite() {
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            assert!(matches!(
                loss_improvement(bad, 1.0),
                Err(ScoreError::NonFinite {
                    what: "loss_before",
                    ..
                })
            ));
            assert!(matches!(
                loss_improvement(1.0, bad),
                Err(ScoreError::NonFinite {
                    what: "loss_after",
                    ..
                })
            ));
        }
    }

    // ---- stability and the norm tracker ----

    #[test]
    fn stability_formula() {
        // norm/avg = 1.5 → exp(-2 · 0.5)
        assert!(close(
            stability(3.0, Some(2.0)).unwrap(),
            (-2.0f64 * 0.5).exp()
        ));
        // norm/avg = 0.5 → exp(-2 · 0.5)
        assert!(close(stability(1.0, Some(2.0)).unwrap(), (-1.0f64).exp()));
        // norm/avg = 3 → exp(-4)
        assert!(close(stability(6.0, Some(2.0)).unwrap(), (-4.0f64).exp()));
        assert_eq!(stability(2.0, Some(2.0)).unwrap(), 1.0);
        // zero norm against a positive average: ratio 0 → exp(-2)
        assert!(close(stability(0.0, Some(2.0)).unwrap(), (-2.0f64).exp()));
        // huge ratio: 0, finite
        let s = stability(1e300, Some(f64::MIN_POSITIVE)).unwrap();
        assert!(s.is_finite() && s == 0.0);
    }

    #[test]
    fn stability_rejects_bad_inputs() {
        assert!(matches!(
            stability(f64::NAN, None),
            Err(ScoreError::NonFinite { .. })
        ));
        assert!(matches!(
            stability(-1.0, None),
            Err(ScoreError::OutOfRange { .. })
        ));
        assert!(matches!(
            stability(1.0, Some(0.0)),
            Err(ScoreError::OutOfRange { .. })
        ));
        assert!(matches!(
            stability(1.0, Some(f64::INFINITY)),
            Err(ScoreError::NonFinite { .. })
        ));
    }

    #[test]
    fn norm_tracker_first_norm_initialises_average() {
        let mut t = NormTracker::new();
        assert_eq!(t.average(), None);
        // First delta: compared with itself, no NaN (the listing would divide by 0).
        let s = t.stability(5.0).unwrap();
        assert_eq!(s, 1.0);
        t.accept(5.0).unwrap();
        assert_eq!(t.average(), Some(5.0));
        // Second delta: EMA 0.95·5 + 0.05·10 = 5.25, stability against the old average 5.
        let s2 = t.stability(10.0).unwrap();
        assert!(close(s2, (-2.0f64 * (10.0 / 5.0 - 1.0)).exp()));
        t.accept(10.0).unwrap();
        assert!(close(t.average().unwrap(), 0.95 * 5.0 + 0.05 * 10.0));
    }

    #[test]
    fn norm_tracker_zero_and_bad_norms() {
        let mut t = NormTracker::new();
        // Zero norms before the first positive one keep the average unset (never 0).
        t.accept(0.0).unwrap();
        assert_eq!(t.average(), None);
        assert_eq!(t.stability(0.0).unwrap(), 1.0);
        // Bad norms are refused and leave the tracker unchanged.
        assert!(t.accept(f64::NAN).is_err());
        assert!(t.accept(-1.0).is_err());
        assert_eq!(t.average(), None);
        t.accept(2.0).unwrap();
        // A long run of zeros never drives the average to 0.
        for _ in 0..100_000 {
            t.accept(0.0).unwrap();
        }
        let a = t.average().unwrap();
        assert!(a > 0.0);
        assert!(t.stability(1.0).unwrap().is_finite());
        // Restore from the state store.
        assert_eq!(
            NormTracker::from_average(Some(3.0)).unwrap().average(),
            Some(3.0)
        );
        assert!(NormTracker::from_average(Some(0.0)).is_err());
        assert!(NormTracker::from_average(Some(f64::NAN)).is_err());
        assert_eq!(NormTracker::from_average(None).unwrap(), NormTracker::new());
    }

    // ---- cosine / convergence ----

    #[test]
    fn cosine_identical_opposite_orthogonal() {
        let a = [1.0f32, 2.0, 3.0];
        let neg = [-1.0f32, -2.0, -3.0];
        let scaled = [2.0f32, 4.0, 6.0];
        assert!(close(cosine_similarity(&a, &a).unwrap(), 1.0));
        assert!(close(cosine_similarity(&a, &scaled).unwrap(), 1.0));
        assert!(close(cosine_similarity(&a, &neg).unwrap(), -1.0));
        assert_eq!(cosine_similarity(&[1.0, 0.0], &[0.0, 1.0]).unwrap(), 0.0);
        // Hand-computed: (1·4 + 2·5 + 3·6) / (√14 · √77)
        let b = [4.0f32, 5.0, 6.0];
        let expect = 32.0 / (14.0f64.sqrt() * 77.0f64.sqrt());
        assert!(close(cosine_similarity(&a, &b).unwrap(), expect));
        // convergence = max(0, cos)
        assert!(close(convergence(&a, Some(&a)).unwrap().unwrap(), 1.0));
        assert_eq!(convergence(&a, Some(&neg)).unwrap(), Some(0.0));
        assert_eq!(
            convergence(&[1.0, 0.0], Some(&[0.0, 1.0])).unwrap(),
            Some(0.0)
        );
        // epoch 0
        assert_eq!(convergence(&a, None).unwrap(), None);
    }

    #[test]
    fn cosine_edge_cases() {
        assert_eq!(cosine_similarity(&[0.0, 0.0], &[1.0, 2.0]).unwrap(), 0.0);
        assert_eq!(cosine_similarity(&[], &[]).unwrap(), 0.0);
        assert!(matches!(
            cosine_similarity(&[1.0], &[1.0, 2.0]),
            Err(ScoreError::LengthMismatch { left: 1, right: 2 })
        ));
        assert!(matches!(
            cosine_similarity(&[f32::NAN], &[1.0]),
            Err(ScoreError::NonFinite { .. })
        ));
        assert!(matches!(
            cosine_similarity(&[1.0], &[f32::INFINITY]),
            Err(ScoreError::NonFinite { .. })
        ));
        // f32::MAX squared does not overflow in f64.
        assert!(close(
            cosine_similarity(&[f32::MAX, f32::MAX], &[f32::MAX, f32::MAX]).unwrap(),
            1.0
        ));
        // Chunked accumulation equals the one-shot cosine.
        let a = [1.0f32, -2.0, 3.0, 0.5];
        let b = [0.5f32, 1.0, -1.0, 2.0];
        let mut acc = CosineAccumulator::new();
        assert!(acc.is_empty());
        acc.update(&a[..1], &b[..1]).unwrap();
        acc.update(&a[1..], &b[1..]).unwrap();
        assert_eq!(acc.len(), 4);
        assert!(close(acc.cosine(), cosine_similarity(&a, &b).unwrap()));
        // A failed chunk leaves the accumulator unchanged.
        let before = acc;
        assert!(acc.update(&[1.0, f32::NAN], &[1.0, 1.0]).is_err());
        assert_eq!(acc, before);
    }

    #[test]
    fn l2_norm_values() {
        assert!(close(l2_norm(&[3.0, 4.0]).unwrap(), 5.0));
        assert_eq!(l2_norm(&[]).unwrap(), 0.0);
        assert!(l2_norm(&[1.0, f32::NAN]).is_err());
    }

    // ---- composite ----

    #[test]
    fn composite_formula_and_epoch0_renormalisation() {
        let q = QualityScore::new(0.4, 0.6, Some(0.9)).unwrap();
        assert!(close(q.composite, 0.5 * 0.4 + 0.3 * 0.6 + 0.2 * 0.9));
        let q0 = QualityScore::new(0.4, 0.6, None).unwrap();
        assert!(close(q0.composite, (0.5 * 0.4 + 0.3 * 0.6) / 0.8));
        assert_eq!(q0.convergence, None);
        // Bounds: all-ones → 1 with or without convergence, all-zeros → 0.
        assert!(close(
            QualityScore::new(1.0, 1.0, Some(1.0)).unwrap().composite,
            1.0
        ));
        assert!(close(
            QualityScore::new(1.0, 1.0, None).unwrap().composite,
            1.0
        ));
        assert_eq!(
            QualityScore::new(0.0, 0.0, Some(0.0)).unwrap().composite,
            0.0
        );
        assert_eq!(QualityScore::new(0.0, 0.0, None).unwrap().composite, 0.0);
    }

    #[test]
    fn quality_score_rejects_bad_terms() {
        assert!(matches!(
            QualityScore::new(f64::NAN, 0.5, None),
            Err(ScoreError::NonFinite { .. })
        ));
        assert!(matches!(
            QualityScore::new(0.5, 1.5, None),
            Err(ScoreError::OutOfRange { .. })
        ));
        assert!(matches!(
            QualityScore::new(0.5, 0.5, Some(-0.1)),
            Err(ScoreError::OutOfRange { .. })
        ));
        assert!(matches!(
            QualityScore::new(0.5, 0.5, Some(f64::INFINITY)),
            Err(ScoreError::NonFinite { .. })
        ));
    }

    #[test]
    fn evaluate_end_to_end() {
        let mut t = NormTracker::new();
        t.accept(2.0).unwrap();
        let q = QualityScore::evaluate(2.0, 1.5, 3.0, &t, Some(0.5)).unwrap();
        let dl = 0.25;
        let s = (-2.0f64 * 0.5).exp();
        assert!(close(q.loss_improvement, dl));
        assert!(close(q.stability, s));
        assert!(close(q.composite, 0.5 * dl + 0.3 * s + 0.2 * 0.5));
        // Epoch 0, first delta: s = 1, composite renormalised.
        let q0 = QualityScore::evaluate(2.0, 1.0, 7.0, &NormTracker::new(), None).unwrap();
        assert!(close(q0.composite, (0.5 * 0.5 + 0.3 * 1.0) / 0.8));
        assert!(QualityScore::evaluate(f64::NAN, 1.0, 1.0, &t, None).is_err());
        assert!(QualityScore::evaluate(1.0, 1.0, f64::INFINITY, &t, None).is_err());
    }

    // ---- spot-check selection ----

    fn secret(seed: u64) -> EpochSecret {
        EpochSecret::generate(&mut ChaCha20Rng::seed_from_u64(seed))
    }

    #[test]
    fn commitment_is_sha256_of_secret() {
        let s = EpochSecret::from_bytes([7u8; 32]);
        let expect: [u8; 32] = Sha256::digest([7u8; 32]).into();
        assert_eq!(commitment(&s).0, expect);
        assert_eq!(s.commitment().to_string(), hex::encode(expect));
        assert!(verify_reveal(&commitment(&s), &s).is_ok());
        // Debug does not leak the secret.
        assert!(!format!("{s:?}").contains("0707"));
        assert_eq!(s.to_hex(), hex::encode([7u8; 32]));
    }

    #[test]
    fn wrong_reveal_is_refused() {
        let s = secret(1);
        let c = s.commitment();
        let mut other = *s.as_bytes();
        other[31] ^= 1;
        assert!(matches!(
            verify_reveal(&c, &EpochSecret::from_bytes(other)),
            Err(ScoreError::RevealMismatch { .. })
        ));
        assert!(verify_reveal(&c, &secret(2)).is_err());
    }

    #[test]
    fn selection_value_is_big_endian_prefix() {
        let s = EpochSecret::from_bytes([1u8; 32]);
        let h = [2u8; 32];
        let mut buf = [1u8; 32].to_vec();
        buf.extend_from_slice(&[2u8; 32]);
        let d = Sha256::digest(&buf);
        let expect = u64::from_str_radix(&hex::encode(&d[..8]), 16).unwrap();
        assert_eq!(selection_value(&s, &h), expect);
        // Threshold: selected iff x < rate · 2^64.
        let rate_just_above = (expect as f64 + 4096.0) / 18_446_744_073_709_551_616.0;
        assert!(is_spot_checked(&s, &h, rate_just_above.min(1.0)));
    }

    #[test]
    fn selection_bound_edges() {
        assert_eq!(selection_bound(0.0), 0);
        assert_eq!(selection_bound(-0.5), 0);
        assert_eq!(selection_bound(f64::NAN), 0);
        assert_eq!(selection_bound(1.0), 1u128 << 64);
        assert_eq!(selection_bound(2.0), 1u128 << 64);
        assert_eq!(selection_bound(f64::INFINITY), 1u128 << 64);
        assert_eq!(selection_bound(0.5), 1u128 << 63);
        assert_eq!(selection_bound(f64::MIN_POSITIVE), 1);
        // The f64 nearest 0.1 is 0x1.999999999999Ap-4, so 0.1 × 2^64 is exactly
        // 0x1999_9999_9999_9A00 (slightly above 2^64 / 10).
        assert_eq!(selection_bound(0.1), 0x1999_9999_9999_9A00);
        assert_eq!(selection_bound(0.1), 1_844_674_407_370_955_264);
    }

    #[test]
    fn selected_fraction_close_to_rate() {
        const SEED: u64 = 0x5EED_0006_2024;
        const N: u64 = 200_000;
        println!("selected_fraction_close_to_rate seed = {SEED:#x}");
        let mut rng = ChaCha20Rng::seed_from_u64(SEED);
        let s = EpochSecret::generate(&mut rng);
        for rate in [DEFAULT_SPOT_CHECK_RATE, 0.01, 0.5, 0.9] {
            let mut k = 0u64;
            for _ in 0..N {
                let mut h = [0u8; 32];
                rng.fill_bytes(&mut h);
                k += u64::from(is_spot_checked(&s, &h, rate));
            }
            let mean = N as f64 * rate;
            let sd = (N as f64 * rate * (1.0 - rate)).sqrt();
            // 6 σ binomial bound: a false failure has probability < 1e-8.
            assert!(
                (k as f64 - mean).abs() <= 6.0 * sd,
                "seed {SEED:#x} rate {rate}: selected {k} of {N}, expected {mean} ± {}",
                6.0 * sd
            );
        }
    }

    #[test]
    fn rate_zero_selects_none_rate_one_selects_all() {
        let mut rng = ChaCha20Rng::seed_from_u64(3);
        let s = EpochSecret::generate(&mut rng);
        let mut edge = [[0u8; 32], [0xff; 32]].to_vec();
        for _ in 0..10_000 {
            let mut h = [0u8; 32];
            rng.fill_bytes(&mut h);
            edge.push(h);
        }
        for h in &edge {
            assert!(!is_spot_checked(&s, h, 0.0));
            assert!(is_spot_checked(&s, h, 1.0));
        }
    }

    // ---- spot-check comparison ----

    #[test]
    fn loss_matches_relative_to_recomputed() {
        let t = DEFAULT_LOSS_REL_TOL;
        assert!(loss_matches(2.0, 2.0, t));
        assert!(loss_matches(2.09, 2.0, t)); // |0.09| ≤ 0.05 · 2
        assert!(loss_matches(1.91, 2.0, t));
        assert!(!loss_matches(2.11, 2.0, t));
        assert!(!loss_matches(1.89, 2.0, t));
        // Denominator is the recomputed loss, not the claim: 2.0 vs 1.9 → 0.1 > 0.095.
        assert!(!loss_matches(2.0, 1.9, t));
        // recomputed ≈ 0: absolute tolerance t · LOSS_MATCH_FLOOR.
        assert!(loss_matches(0.0, 0.0, t));
        assert!(loss_matches(4e-5, 0.0, t));
        assert!(!loss_matches(1e-4, 0.0, t));
        // Non-finite or bad tolerance: never a match.
        assert!(!loss_matches(f64::NAN, 2.0, t));
        assert!(!loss_matches(2.0, f64::INFINITY, t));
        assert!(!loss_matches(f64::INFINITY, f64::INFINITY, t));
        assert!(!loss_matches(2.0, 2.0, -0.1));
        assert!(!loss_matches(2.0, 2.0, f64::NAN));
    }

    // ---- properties ----

    proptest! {
        #[test]
        fn composite_in_unit_interval_for_finite_inputs(
            before in -1e6f64..1e6,
            after in -1e6f64..1e6,
            avg in proptest::option::of(1e-30f64..1e30),
            norm in 0f64..1e30,
            a in proptest::collection::vec(-1e30f32..1e30, 1..16),
            b_seed in proptest::collection::vec(-1e30f32..1e30, 16),
            epoch0 in any::<bool>(),
        ) {
            let tracker = NormTracker::from_average(avg).unwrap();
            let b = &b_seed[..a.len()];
            let c = convergence(&a, if epoch0 { None } else { Some(b) }).unwrap();
            let q = QualityScore::evaluate(before, after, norm, &tracker, c).unwrap();
            for v in [q.loss_improvement, q.stability, q.composite] {
                prop_assert!(v.is_finite() && (0.0..=1.0).contains(&v), "{q:?}");
            }
            if let Some(c) = q.convergence {
                prop_assert!((0.0..=1.0).contains(&c));
            }
        }

        #[test]
        fn composite_fn_in_unit_interval(
            dl in 0f64..=1.0, s in 0f64..=1.0, c in proptest::option::of(0f64..=1.0)
        ) {
            let q = composite(dl, s, c);
            prop_assert!((0.0..=1.0).contains(&q));
        }

        #[test]
        fn selection_is_deterministic(secret in any::<[u8; 32]>(), hash in any::<[u8; 32]>(), rate in 0f64..=1.0) {
            let s = EpochSecret::from_bytes(secret);
            let first = is_spot_checked(&s, &hash, rate);
            // An auditor with the revealed secret recomputes the same choice.
            let revealed = EpochSecret::from_bytes(*s.as_bytes());
            prop_assert!(verify_reveal(&s.commitment(), &revealed).is_ok());
            prop_assert_eq!(first, is_spot_checked(&revealed, &hash, rate));
            // Monotone in the rate.
            if first {
                prop_assert!(is_spot_checked(&s, &hash, (rate + 0.25).min(1.0)));
            }
            prop_assert!(!is_spot_checked(&s, &hash, 0.0));
            prop_assert!(is_spot_checked(&s, &hash, 1.0));
        }

        #[test]
        fn mismatched_reveal_refused(a in any::<[u8; 32]>(), b in any::<[u8; 32]>()) {
            prop_assume!(a != b);
            let c = EpochSecret::from_bytes(a).commitment();
            prop_assert!(verify_reveal(&c, &EpochSecret::from_bytes(b)).is_err());
        }

        #[test]
        fn selected_fraction_close_to_rate_any_seed(seed in any::<u64>(), rate in 0.01f64..0.99) {
            const N: u64 = 20_000;
            let mut rng = ChaCha20Rng::seed_from_u64(seed);
            let s = EpochSecret::generate(&mut rng);
            let mut k = 0u64;
            for _ in 0..N {
                let mut h = [0u8; 32];
                rng.fill_bytes(&mut h);
                k += u64::from(is_spot_checked(&s, &h, rate));
            }
            let mean = N as f64 * rate;
            let sd = (N as f64 * rate * (1.0 - rate)).sqrt();
            prop_assert!((k as f64 - mean).abs() <= 6.0 * sd,
                "seed {seed:#x} rate {rate}: {k} of {N}");
        }
    }
}
