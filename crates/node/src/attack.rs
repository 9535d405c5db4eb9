//! Byzantine training attacks (fault injection, issue 19): what a Byzantine node uploads
//! instead of its honest delta, and the loss it claims.
//!
//! Every attack is a pure function of what the node can see ([`Forge`]: its own honest
//! delta, the honest deltas of the nodes it colludes with, a peer's delta it obtained, the
//! previous epoch's merged update) and of a random-number generator; none reads the
//! orchestrator's secrets (spot-check seeds, sketch seeds). The node agent wires them to
//! `hanzod node --byzantine` (see `crate::trainer`).
//!
//! Deltas are flat `f32` vectors in the trainer's delta layout. Means and norms are
//! accumulated in `f64` in a fixed order, so colluders that see the same deltas in the same
//! order forge bit-identical results. A source whose length differs from `own` (a peer's
//! delta, a colluder's, the last merged update) is ignored, as if absent: a forged delta
//! always has `own`'s length.

use std::fmt;
use std::ops::Range;

use rand::Rng;

/// A Byzantine training attack (fault injection).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Attack {
    /// Uploads −δ.
    SignFlip,
    /// Uploads k·δ (k finite, k ∉ {0, 1}; negative allowed).
    Scale {
        /// The factor (dimensionless).
        k: f32,
    },
    /// Uploads Gaussian noise (i.i.d. per coordinate) scaled to L2 norm sigma·‖δ‖ instead of δ.
    Noise {
        /// The noise's L2 norm relative to ‖δ‖ (> 0, dimensionless).
        sigma: f32,
    },
    /// "A little is enough" (Baruch et al., NeurIPS 2019): every colluder uploads the coordinate-wise mean
    /// plus z·std of the colluders' honest deltas; None → z_max of the paper from (n, f): s = floor(n/2 + 1) − f, z = Φ⁻¹((n − s)/n).
    ///
    /// The std is the population one (divided by the number of colluders, so one colluder
    /// alone uploads its own delta); `n` is [`Forge::nodes`] and `f` the number of
    /// colluders ([`alie_z_max`]).
    Alie {
        /// The number of standard deviations (finite), or `None` for the paper's z_max.
        z: Option<f32>,
    },
    /// Inner-product manipulation (Xie, Koyejo, Gupta, UAI 2019 "Fall of empires"): uploads −eps × the mean of the colluders' honest deltas.
    Ipm {
        /// The factor (> 0, dimensionless); the paper's "small" ε is e.g. 0.1–0.5.
        eps: f32,
    },
    /// Free-riding: uploads another node's delta (`Forge::peer`) under its own signature, times `rescale`, plus Gaussian noise of norm `noise`·‖peer‖ (0: none).
    CopyPeer {
        /// Multiplies the copied delta (finite, ≠ 0).
        rescale: f32,
        /// The added noise's L2 norm relative to ‖peer‖ (finite, ≥ 0).
        noise: f32,
    },
    /// Free-riding: uploads the previous epoch's merged update (`Forge::last_merged`, zeros when None), times `rescale`, plus noise as above.
    CopyLastMerged {
        /// Multiplies the copied update (finite, ≠ 0).
        rescale: f32,
        /// The added noise's L2 norm relative to ‖last merged‖ (finite, ≥ 0).
        noise: f32,
    },
    /// Lazy: uploads scale·δ (0: a zero delta; e.g. 1e-3: a tiny one).
    Lazy {
        /// The factor (finite, 0 ≤ scale < 1).
        scale: f32,
    },
    /// Stale: trains from the checkpoint `epochs` epochs older than the assigned base (the forge itself returns `own`, which the caller computed from the old base).
    Stale {
        /// How many epochs older (≥ 1).
        epochs: u32,
    },
    /// Uploads the honest delta but claims factor × the measured loss (factor > 0, ≠ 1).
    LieLoss {
        /// The factor (finite, > 0, ≠ 1).
        factor: f64,
    },
    /// Colluding nodes all upload the same delta: the mean of the colluders' honest deltas.
    Identical,
}

/// What a Byzantine node sees when it forges its upload. Colluders may read each other's deltas; none may read the orchestrator's secrets.
pub struct Forge<'a> {
    /// This node's honest delta (flat, the trainer's delta layout).
    pub own: &'a [f32],
    /// The honest deltas of every colluder this epoch, this node's included, in node-id order (may be just `[own]`).
    pub colluders: &'a [&'a [f32]],
    /// Another node's delta this node obtained (for CopyPeer); None → falls back to a colluder's other than own, else own.
    pub peer: Option<&'a [f32]>,
    /// The previous epoch's merged update in the same layout, when known.
    pub last_merged: Option<&'a [f32]>,
    /// Deltas expected in the epoch (n of ALIE's z_max).
    pub nodes: usize,
    /// Ranges of `own` that are LoRA B factors (empty for a full-parameter delta): SignFlip/Scale/Lazy act only on these for a LoRA adapter (scaling both factors would scale B·A by k²), as the existing `poison` in trainer.rs does.
    pub lora_b: &'a [std::ops::Range<usize>],
}

impl Forge<'_> {
    /// The colluders' deltas of `own`'s length, in the given order; `[own]` when none is.
    fn group(&self) -> Vec<&[f32]> {
        let group: Vec<&[f32]> = self
            .colluders
            .iter()
            .copied()
            .filter(|c| c.len() == self.own.len())
            .collect();
        if group.is_empty() {
            vec![self.own]
        } else {
            group
        }
    }

    /// The delta a copier copies: [`Forge::peer`] when it has `own`'s length, else the first
    /// colluder's that differs from `own`, else `own`.
    fn copied(&self) -> &[f32] {
        if let Some(peer) = self.peer.filter(|p| p.len() == self.own.len()) {
            return peer;
        }
        self.colluders
            .iter()
            .copied()
            .find(|c| c.len() == self.own.len() && *c != self.own)
            .unwrap_or(self.own)
    }
}

impl Attack {
    /// The delta to upload. Deterministic for a given rng state.
    ///
    /// The result has `view.own`'s length. SignFlip, Scale and Lazy multiply only the
    /// [`Forge::lora_b`] ranges when there are any (clamped to `own`'s length), every value
    /// otherwise; the other attacks act on every value.
    pub fn forge(&self, view: &Forge<'_>, rng: &mut impl rand::Rng) -> Vec<f32> {
        let own = view.own;
        match *self {
            Attack::SignFlip => scaled_b(own, view.lora_b, -1.0),
            Attack::Scale { k } => scaled_b(own, view.lora_b, k),
            Attack::Lazy { scale } => scaled_b(own, view.lora_b, scale),
            Attack::Noise { sigma } => {
                let target = f64::from(sigma) * l2(own);
                gaussian_of_norm(own.len(), target, rng)
            }
            Attack::Alie { z } => {
                let group = view.group();
                let z = z.unwrap_or_else(|| alie_z_max(view.nodes.max(group.len()), group.len()));
                let (mean, var) = mean_var(&group);
                mean.iter()
                    .zip(&var)
                    .map(|(m, v)| (m + f64::from(z) * v.sqrt()) as f32)
                    .collect()
            }
            Attack::Ipm { eps } => {
                let (mean, _) = mean_var(&view.group());
                mean.iter().map(|m| (-f64::from(eps) * m) as f32).collect()
            }
            Attack::Identical => {
                let (mean, _) = mean_var(&view.group());
                mean.iter().map(|m| *m as f32).collect()
            }
            Attack::CopyPeer { rescale, noise } => {
                copy_with_noise(view.copied(), rescale, noise, rng)
            }
            Attack::CopyLastMerged { rescale, noise } => {
                match view.last_merged.filter(|m| m.len() == own.len()) {
                    Some(last) => copy_with_noise(last, rescale, noise, rng),
                    None => vec![0.0; own.len()],
                }
            }
            Attack::Stale { .. } | Attack::LieLoss { .. } => own.to_vec(),
        }
    }

    /// The claimed loss to state, from the measured one (only LieLoss changes it).
    pub fn claim(&self, measured: f64) -> f64 {
        match *self {
            Attack::LieLoss { factor } => measured * factor,
            _ => measured,
        }
    }

    /// Whether this attack needs the colluders' deltas (Alie, Ipm, Identical, and CopyPeer without a peer).
    ///
    /// CopyPeer answers `true`: the node agent obtains no peer delta other than through the
    /// colluders' side channel.
    pub fn colludes(&self) -> bool {
        matches!(
            self,
            Attack::Alie { .. } | Attack::Ipm { .. } | Attack::Identical | Attack::CopyPeer { .. }
        )
    }
}

/// `own` with the values in `ranges` (every value when `ranges` is empty) multiplied by `k`.
fn scaled_b(own: &[f32], ranges: &[Range<usize>], k: f32) -> Vec<f32> {
    let mut out = own.to_vec();
    if ranges.is_empty() {
        out.iter_mut().for_each(|x| *x *= k);
    } else {
        for r in ranges {
            let (start, end) = (r.start.min(out.len()), r.end.min(out.len()));
            if start < end {
                out[start..end].iter_mut().for_each(|x| *x *= k);
            }
        }
    }
    out
}

/// The L2 norm of `v`, accumulated in `f64`.
fn l2(v: &[f32]) -> f64 {
    v.iter()
        .map(|x| f64::from(*x) * f64::from(*x))
        .sum::<f64>()
        .sqrt()
}

/// The coordinate-wise mean and population variance (divided by the group's size) of
/// `group` (non-empty, every member of one length), in `f64`, summed in the given order.
fn mean_var(group: &[&[f32]]) -> (Vec<f64>, Vec<f64>) {
    let len = group.first().map_or(0, |g| g.len());
    let m = group.len().max(1) as f64;
    let mut mean = vec![0.0f64; len];
    for g in group {
        for (a, x) in mean.iter_mut().zip(g.iter()) {
            *a += f64::from(*x);
        }
    }
    mean.iter_mut().for_each(|a| *a /= m);
    let mut var = vec![0.0f64; len];
    for g in group {
        for ((v, x), mu) in var.iter_mut().zip(g.iter()).zip(&mean) {
            let d = f64::from(*x) - mu;
            *v += d * d;
        }
    }
    var.iter_mut().for_each(|v| *v /= m);
    (mean, var)
}

/// `rescale`·`source` plus i.i.d. Gaussian noise of L2 norm `noise`·‖source‖.
fn copy_with_noise(source: &[f32], rescale: f32, noise: f32, rng: &mut impl Rng) -> Vec<f32> {
    let mut out: Vec<f32> = source.iter().map(|x| x * rescale).collect();
    if noise != 0.0 {
        let n = gaussian_of_norm(source.len(), f64::from(noise) * l2(source), rng);
        out.iter_mut().zip(&n).for_each(|(o, e)| *o += e);
    }
    out
}

/// `len` i.i.d. standard normal draws (Box–Muller, from `rng`'s uniform `f64`s) rescaled to
/// L2 norm `norm` (zeros when `norm` is 0 or not finite, or every draw was 0).
fn gaussian_of_norm(len: usize, norm: f64, rng: &mut impl Rng) -> Vec<f32> {
    let mut draws = Vec::with_capacity(len);
    while draws.len() < len {
        // u1 in (0, 1] so that ln(u1) is finite.
        let u1 = 1.0 - rng.gen::<f64>();
        let u2 = rng.gen::<f64>();
        let r = (-2.0 * u1.ln()).sqrt();
        let t = std::f64::consts::TAU * u2;
        draws.push(r * t.cos());
        if draws.len() < len {
            draws.push(r * t.sin());
        }
    }
    let have = draws.iter().map(|x| x * x).sum::<f64>().sqrt();
    if !(norm.is_finite() && norm > 0.0 && have > 0.0) {
        return vec![0.0; len];
    }
    draws.iter().map(|x| (x * norm / have) as f32).collect()
}

/// ALIE's z_max (Baruch, Baruch, Goldberg, "A Little Is Enough: Circumventing Defenses For
/// Distributed Learning", NeurIPS 2019, §3): with `n` workers of which `f` collude,
/// s = ⌊n/2 + 1⌋ − f honest workers must be won over and z_max = Φ⁻¹((n − s)/n), the largest
/// number of standard deviations that keeps the colluders' value closer to the mean than
/// s honest workers. E.g. n = 50, f = 24: s = 2, z_max = Φ⁻¹(0.96) ≈ 1.751.
///
/// `n` is raised to `f` when smaller, and the probability is clamped to
/// [10⁻⁶, 1 − 10⁻⁶] (|z| ≤ 4.753): with f ≥ ⌊n/2 + 1⌋ the colluders are a majority and the
/// paper's bound is infinite. `n` = 0: 0.
pub fn alie_z_max(n: usize, f: usize) -> f32 {
    let n = n.max(f);
    if n == 0 {
        return 0.0;
    }
    let s = (n / 2 + 1) as i64 - f as i64;
    let p = (n as f64 - s as f64) / n as f64;
    inverse_normal_cdf(p.clamp(1e-6, 1.0 - 1e-6)) as f32
}

/// Φ⁻¹(p), the standard normal quantile, by Peter J. Acklam's rational approximation
/// ("An algorithm for computing the inverse normal cumulative distribution function",
/// 2003; relative error below 1.15·10⁻⁹ on (0, 1)). p ≤ 0: −∞; p ≥ 1: +∞; NaN: NaN.
pub fn inverse_normal_cdf(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    const P_LOW: f64 = 0.02425;
    if p.is_nan() {
        return f64::NAN;
    }
    if p <= 0.0 {
        return f64::NEG_INFINITY;
    }
    if p >= 1.0 {
        return f64::INFINITY;
    }
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < P_LOW {
        tail((-2.0 * p.ln()).sqrt())
    } else if p <= 1.0 - P_LOW {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    } else {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    }
}

/// The forms [`Attack`]'s `FromStr` accepts (defaults in parentheses).
pub const ATTACK_FORMS: &str = "sign-flip, scale:<k>, noise[:sigma] (1), alie[:z] (z_max), \
     ipm[:eps] (0.5), copy-peer[:rescale[:noise]] (1, 0), copy-last[:rescale[:noise]] (1, 0), \
     lazy[:scale] (0), stale[:epochs] (1), lie-loss[:factor] (0.5), identical";

/// Why a string is not an [`Attack`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseAttackError {
    /// No attack has this name.
    #[error("unknown attack {0:?} (one of: {forms})", forms = ATTACK_FORMS)]
    Unknown(String),
    /// The attack takes fewer arguments than were given, or needs one that is missing.
    #[error("{attack}: {why} (one of: {forms})", forms = ATTACK_FORMS)]
    Arity {
        /// The attack's name.
        attack: String,
        /// What is wrong.
        why: String,
    },
    /// An argument is not a number, or out of its range.
    #[error("{attack}: {value:?} is not {expected}")]
    BadValue {
        /// The attack's name.
        attack: String,
        /// The argument as given.
        value: String,
        /// What it must be.
        expected: &'static str,
    },
}

impl std::str::FromStr for Attack {
    type Err = ParseAttackError;

    /// `sign-flip`, `scale:<k>`, `noise[:sigma]` (1), `alie[:z]` (z_max), `ipm[:eps]` (0.5),
    /// `copy-peer[:rescale[:noise]]` (1, 0), `copy-last[:rescale[:noise]]` (1, 0),
    /// `lazy[:scale]` (0), `stale[:epochs]` (1), `lie-loss[:factor]` (0.5), `identical`.
    fn from_str(s: &str) -> Result<Attack, ParseAttackError> {
        let mut parts = s.split(':');
        let kind = parts.next().unwrap_or_default();
        let args: Vec<&str> = parts.collect();
        let arity = |max: usize, min: usize| -> Result<(), ParseAttackError> {
            if args.len() > max || args.len() < min {
                let why = match (min, max) {
                    (0, 0) => "takes no argument".to_string(),
                    (1, 1) => "takes exactly one argument".to_string(),
                    (_, m) => format!("takes at most {m} argument(s)"),
                };
                return Err(ParseAttackError::Arity {
                    attack: kind.to_string(),
                    why,
                });
            }
            Ok(())
        };
        let bad = |value: &str, expected: &'static str| ParseAttackError::BadValue {
            attack: kind.to_string(),
            value: value.to_string(),
            expected,
        };
        // The i-th argument as an f32 satisfying `ok`, or `default` when absent.
        let num = |i: usize, default: f32, ok: fn(f32) -> bool, expected: &'static str| match args
            .get(i)
        {
            None => Ok(default),
            Some(a) => a
                .parse::<f32>()
                .ok()
                .filter(|v| v.is_finite() && ok(*v))
                .ok_or_else(|| bad(a, expected)),
        };
        let attack = match kind {
            "sign-flip" => {
                arity(0, 0)?;
                Attack::SignFlip
            }
            "identical" => {
                arity(0, 0)?;
                Attack::Identical
            }
            "scale" => {
                arity(1, 1)?;
                Attack::Scale {
                    k: num(
                        0,
                        1.0,
                        |k| k != 0.0 && k != 1.0,
                        "a finite number other than 0 and 1",
                    )?,
                }
            }
            "noise" => {
                arity(1, 0)?;
                Attack::Noise {
                    sigma: num(0, 1.0, |v| v > 0.0, "a finite number > 0")?,
                }
            }
            "alie" => {
                arity(1, 0)?;
                let z = match args.first() {
                    None => None,
                    Some(_) => Some(num(0, 0.0, |_| true, "a finite number")?),
                };
                Attack::Alie { z }
            }
            "ipm" => {
                arity(1, 0)?;
                Attack::Ipm {
                    eps: num(0, 0.5, |v| v > 0.0, "a finite number > 0")?,
                }
            }
            "copy-peer" | "copy-last" => {
                arity(2, 0)?;
                let rescale = num(0, 1.0, |v| v != 0.0, "a finite number other than 0")?;
                let noise = num(1, 0.0, |v| v >= 0.0, "a finite number ≥ 0")?;
                if kind == "copy-peer" {
                    Attack::CopyPeer { rescale, noise }
                } else {
                    Attack::CopyLastMerged { rescale, noise }
                }
            }
            "lazy" => {
                arity(1, 0)?;
                Attack::Lazy {
                    scale: num(0, 0.0, |v| (0.0..1.0).contains(&v), "a number in [0, 1)")?,
                }
            }
            "stale" => {
                arity(1, 0)?;
                let epochs = match args.first() {
                    None => 1,
                    Some(a) => a
                        .parse::<u32>()
                        .ok()
                        .filter(|e| *e >= 1)
                        .ok_or_else(|| bad(a, "a whole number ≥ 1"))?,
                };
                Attack::Stale { epochs }
            }
            "lie-loss" => {
                arity(1, 0)?;
                let factor = match args.first() {
                    None => 0.5,
                    Some(a) => a
                        .parse::<f64>()
                        .ok()
                        .filter(|f| f.is_finite() && *f > 0.0 && *f != 1.0)
                        .ok_or_else(|| bad(a, "a finite number > 0 other than 1"))?,
                };
                Attack::LieLoss { factor }
            }
            _ => return Err(ParseAttackError::Unknown(s.to_string())),
        };
        Ok(attack)
    }
}

impl fmt::Display for Attack {
    /// The canonical form [`Attack`]'s `FromStr` reads back to the same value (every
    /// argument written out).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Attack::SignFlip => write!(f, "sign-flip"),
            Attack::Scale { k } => write!(f, "scale:{k}"),
            Attack::Noise { sigma } => write!(f, "noise:{sigma}"),
            Attack::Alie { z: None } => write!(f, "alie"),
            Attack::Alie { z: Some(z) } => write!(f, "alie:{z}"),
            Attack::Ipm { eps } => write!(f, "ipm:{eps}"),
            Attack::CopyPeer { rescale, noise } => write!(f, "copy-peer:{rescale}:{noise}"),
            Attack::CopyLastMerged { rescale, noise } => write!(f, "copy-last:{rescale}:{noise}"),
            Attack::Lazy { scale } => write!(f, "lazy:{scale}"),
            Attack::Stale { epochs } => write!(f, "stale:{epochs}"),
            Attack::LieLoss { factor } => write!(f, "lie-loss:{factor}"),
            Attack::Identical => write!(f, "identical"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn rng() -> ChaCha8Rng {
        ChaCha8Rng::seed_from_u64(7)
    }

    fn view<'a>(own: &'a [f32], colluders: &'a [&'a [f32]]) -> Forge<'a> {
        Forge {
            own,
            colluders,
            peer: None,
            last_merged: None,
            nodes: colluders.len().max(1),
            lora_b: &[],
        }
    }

    fn dot(a: &[f32], b: &[f32]) -> f64 {
        a.iter()
            .zip(b)
            .map(|(x, y)| f64::from(*x) * f64::from(*y))
            .sum()
    }

    fn l2f(v: &[f32]) -> f64 {
        l2(v)
    }

    #[test]
    fn acklam_matches_known_quantiles() {
        for (p, z) in [
            (0.5, 0.0),
            (0.975, 1.959_963_984_540_054),
            (0.025, -1.959_963_984_540_054),
            (0.96, 1.750_686_071_252_17),
            (0.999, 3.090_232_306_167_813),
            (1e-6, -4.753_424_308_822_899),
        ] {
            let got = inverse_normal_cdf(p);
            assert!(
                (got - z).abs() < 1e-8 * z.abs().max(1.0),
                "Φ⁻¹({p}) = {got}, not {z}"
            );
        }
        assert_eq!(inverse_normal_cdf(0.0), f64::NEG_INFINITY);
        assert_eq!(inverse_normal_cdf(1.0), f64::INFINITY);
        assert!(inverse_normal_cdf(f64::NAN).is_nan());
    }

    #[test]
    fn alie_z_max_is_the_papers() {
        // The paper's example: n = 50, f = 24 → s = 2, z = Φ⁻¹(48/50) ≈ 1.75.
        assert!((alie_z_max(50, 24) - 1.750_686).abs() < 1e-5);
        // n = 6, f = 2: s = 4 − 2 = 2, z = Φ⁻¹(4/6) ≈ 0.4307.
        assert!((alie_z_max(6, 2) - 0.430_727_3).abs() < 1e-5);
        // A colluding majority: clamped, finite.
        let z = alie_z_max(4, 4);
        assert!(z.is_finite() && z > 4.7 && z < 4.8, "{z}");
        assert_eq!(alie_z_max(0, 0), 0.0);
        assert!(alie_z_max(2, 5).is_finite());
    }

    #[test]
    fn alie_is_mean_plus_z_std_on_a_hand_example() {
        let (a, b) = ([1.0f32, 0.0, 4.0], [3.0f32, 2.0, 4.0]);
        let group: [&[f32]; 2] = [&a, &b];
        // mean (2, 1, 4), population std (1, 1, 0).
        let got = Attack::Alie { z: Some(1.5) }.forge(&view(&a, &group), &mut rng());
        assert_eq!(got, vec![3.5, 2.5, 4.0]);
        let got = Attack::Alie { z: Some(-1.0) }.forge(&view(&b, &group), &mut rng());
        assert_eq!(got, vec![1.0, 0.0, 4.0]);
        // None: z_max(n = 6, f = 2) ≈ 0.4307.
        let mut v = view(&a, &group);
        v.nodes = 6;
        let got = Attack::Alie { z: None }.forge(&v, &mut rng());
        let z = f64::from(alie_z_max(6, 2));
        assert!((f64::from(got[0]) - (2.0 + z)).abs() < 1e-6, "{got:?}");
        // One colluder alone: std 0, its own delta.
        let alone: [&[f32]; 1] = [&a];
        assert_eq!(
            Attack::Alie { z: None }.forge(&view(&a, &alone), &mut rng()),
            a.to_vec()
        );
    }

    #[test]
    fn lora_attacks_touch_only_the_b_factors() {
        let own = [1.0f32, 2.0, 3.0, 4.0, 5.0];
        let group: [&[f32]; 1] = [&own];
        let ranges = [1..3, 4..99];
        let mut v = view(&own, &group);
        v.lora_b = &ranges;
        assert_eq!(
            Attack::SignFlip.forge(&v, &mut rng()),
            vec![1.0, -2.0, -3.0, 4.0, -5.0]
        );
        assert_eq!(
            Attack::Scale { k: 3.0 }.forge(&v, &mut rng()),
            vec![1.0, 6.0, 9.0, 4.0, 15.0]
        );
        assert_eq!(
            Attack::Lazy { scale: 0.0 }.forge(&v, &mut rng()),
            vec![1.0, 0.0, 0.0, 4.0, 0.0]
        );
    }

    #[test]
    fn copies_follow_peer_then_colluders_then_own() {
        let (own, other, peer) = ([1.0f32, 1.0], [2.0f32, 3.0], [5.0f32, 7.0]);
        let group: [&[f32]; 2] = [&own, &other];
        let copy = Attack::CopyPeer {
            rescale: 2.0,
            noise: 0.0,
        };
        assert_eq!(copy.forge(&view(&own, &group), &mut rng()), vec![4.0, 6.0]);
        let mut v = view(&own, &group);
        v.peer = Some(&peer);
        assert_eq!(copy.forge(&v, &mut rng()), vec![10.0, 14.0]);
        // A peer of another length is ignored.
        let short = [1.0f32];
        v.peer = Some(&short);
        assert_eq!(copy.forge(&v, &mut rng()), vec![4.0, 6.0]);
        let alone: [&[f32]; 1] = [&own];
        assert_eq!(copy.forge(&view(&own, &alone), &mut rng()), vec![2.0, 2.0]);
        // The last merged update, zeros without one.
        let last = Attack::CopyLastMerged {
            rescale: -1.0,
            noise: 0.0,
        };
        assert_eq!(last.forge(&view(&own, &alone), &mut rng()), vec![0.0, 0.0]);
        let mut v = view(&own, &alone);
        v.last_merged = Some(&peer);
        assert_eq!(last.forge(&v, &mut rng()), vec![-5.0, -7.0]);
    }

    #[test]
    fn claims_and_collusion() {
        assert_eq!(Attack::LieLoss { factor: 0.5 }.claim(3.0), 1.5);
        assert_eq!(Attack::SignFlip.claim(3.0), 3.0);
        let colluding: Vec<bool> = [
            Attack::Alie { z: None },
            Attack::Ipm { eps: 0.5 },
            Attack::Identical,
            Attack::CopyPeer {
                rescale: 1.0,
                noise: 0.0,
            },
            Attack::SignFlip,
            Attack::Stale { epochs: 1 },
            Attack::CopyLastMerged {
                rescale: 1.0,
                noise: 0.0,
            },
        ]
        .iter()
        .map(Attack::colludes)
        .collect();
        assert_eq!(colluding, [true, true, true, true, false, false, false]);
    }

    #[test]
    fn parsing_has_defaults_and_refuses_bad_values() {
        let p = |s: &str| s.parse::<Attack>();
        assert_eq!(p("sign-flip"), Ok(Attack::SignFlip));
        assert_eq!(p("scale:-3"), Ok(Attack::Scale { k: -3.0 }));
        assert_eq!(p("noise"), Ok(Attack::Noise { sigma: 1.0 }));
        assert_eq!(p("alie"), Ok(Attack::Alie { z: None }));
        assert_eq!(p("alie:-0.5"), Ok(Attack::Alie { z: Some(-0.5) }));
        assert_eq!(p("ipm"), Ok(Attack::Ipm { eps: 0.5 }));
        assert_eq!(
            p("copy-peer"),
            Ok(Attack::CopyPeer {
                rescale: 1.0,
                noise: 0.0
            })
        );
        assert_eq!(
            p("copy-peer:2:0.1"),
            Ok(Attack::CopyPeer {
                rescale: 2.0,
                noise: 0.1
            })
        );
        assert_eq!(
            p("copy-last:0.5"),
            Ok(Attack::CopyLastMerged {
                rescale: 0.5,
                noise: 0.0
            })
        );
        assert_eq!(p("lazy"), Ok(Attack::Lazy { scale: 0.0 }));
        assert_eq!(p("lazy:1e-3"), Ok(Attack::Lazy { scale: 1e-3 }));
        assert_eq!(p("stale"), Ok(Attack::Stale { epochs: 1 }));
        assert_eq!(p("stale:3"), Ok(Attack::Stale { epochs: 3 }));
        assert_eq!(p("lie-loss"), Ok(Attack::LieLoss { factor: 0.5 }));
        assert_eq!(p("identical"), Ok(Attack::Identical));
        for bad in [
            "",
            "evil",
            "sign-flip:2",
            "identical:1",
            "scale",
            "scale:1",
            "scale:0",
            "scale:inf",
            "scale:2:3",
            "noise:0",
            "noise:-1",
            "noise:nan",
            "alie:x",
            "alie:inf",
            "ipm:0",
            "ipm:-1",
            "copy-peer:0",
            "copy-peer:1:-1",
            "copy-peer:1:1:1",
            "copy-last:nan",
            "lazy:1",
            "lazy:-0.1",
            "stale:0",
            "stale:-1",
            "stale:1.5",
            "lie-loss:1",
            "lie-loss:0",
            "lie-loss:-2",
            "alie:",
        ] {
            assert!(p(bad).is_err(), "{bad:?} was accepted");
        }
        let e = p("evil").unwrap_err().to_string();
        assert!(
            e.contains("copy-peer[:rescale[:noise]]") && e.contains("alie[:z]"),
            "{e}"
        );
        let e = p("scale:1").unwrap_err().to_string();
        assert!(e.contains("other than 0 and 1"), "{e}");
    }

    fn delta(len: usize) -> impl Strategy<Value = Vec<f32>> {
        prop::collection::vec(-100.0f32..100.0, len)
    }

    fn attack() -> impl Strategy<Value = Attack> {
        let finite = -1e3f32..1e3;
        prop_oneof![
            Just(Attack::SignFlip),
            finite
                .clone()
                .prop_filter("k ∉ {0, 1}", |k| *k != 0.0 && *k != 1.0)
                .prop_map(|k| Attack::Scale { k }),
            (1e-3f32..10.0).prop_map(|sigma| Attack::Noise { sigma }),
            prop::option::of(finite.clone()).prop_map(|z| Attack::Alie { z }),
            (1e-3f32..10.0).prop_map(|eps| Attack::Ipm { eps }),
            (
                finite.clone().prop_filter("≠ 0", |v| *v != 0.0),
                0.0f32..10.0
            )
                .prop_map(|(rescale, noise)| Attack::CopyPeer { rescale, noise }),
            (finite.prop_filter("≠ 0", |v| *v != 0.0), 0.0f32..10.0)
                .prop_map(|(rescale, noise)| Attack::CopyLastMerged { rescale, noise }),
            (0.0f32..1.0).prop_map(|scale| Attack::Lazy { scale }),
            (1u32..1000).prop_map(|epochs| Attack::Stale { epochs }),
            (1e-3f64..100.0)
                .prop_filter("≠ 1", |f| *f != 1.0)
                .prop_map(|factor| Attack::LieLoss { factor }),
            Just(Attack::Identical),
        ]
    }

    proptest! {
        #[test]
        fn parsing_round_trips(a in attack()) {
            prop_assert_eq!(a.to_string().parse::<Attack>(), Ok(a));
        }

        #[test]
        fn sign_flip_negates_and_scale_scales(own in delta(17), k in -50.0f32..50.0) {
            let group: [&[f32]; 1] = [&own];
            let flipped = Attack::SignFlip.forge(&view(&own, &group), &mut rng());
            prop_assert!(flipped.iter().zip(&own).all(|(f, x)| *f == -*x));
            let scaled = Attack::Scale { k }.forge(&view(&own, &group), &mut rng());
            prop_assert!(scaled.iter().zip(&own).all(|(s, x)| *s == k * *x));
            let lazy = Attack::Lazy { scale: 0.0 }.forge(&view(&own, &group), &mut rng());
            prop_assert!(lazy.iter().all(|x| *x == 0.0));
        }

        #[test]
        fn noise_has_the_asked_norm_and_is_deterministic(
            own in delta(64), sigma in 0.01f32..10.0, seed in any::<u64>()
        ) {
            let group: [&[f32]; 1] = [&own];
            let a = Attack::Noise { sigma };
            let mut r1 = ChaCha8Rng::seed_from_u64(seed);
            let got = a.forge(&view(&own, &group), &mut r1);
            let want = f64::from(sigma) * l2f(&own);
            prop_assert_eq!(got.len(), own.len());
            prop_assert!((l2f(&got) - want).abs() <= 1e-4 * want.max(1e-6), "{} vs {}", l2f(&got), want);
            let again = a.forge(&view(&own, &group), &mut ChaCha8Rng::seed_from_u64(seed));
            prop_assert_eq!(got, again);
        }

        #[test]
        fn copy_noise_has_the_asked_norm(
            own in delta(32), peer in delta(32), noise in 0.01f32..5.0, rescale in 0.5f32..2.0
        ) {
            let group: [&[f32]; 1] = [&own];
            let mut v = view(&own, &group);
            v.peer = Some(&peer);
            let got = Attack::CopyPeer { rescale, noise }.forge(&v, &mut rng());
            let residual: Vec<f32> = got.iter().zip(&peer).map(|(g, p)| g - rescale * p).collect();
            let want = f64::from(noise) * l2f(&peer);
            prop_assert!((l2f(&residual) - want).abs() <= 1e-3 * want.max(1e-3));
        }

        #[test]
        fn ipm_points_against_the_honest_mean(
            deltas in prop::collection::vec(delta(16), 1..6), eps in 0.01f32..5.0
        ) {
            let group: Vec<&[f32]> = deltas.iter().map(Vec::as_slice).collect();
            let mean: Vec<f32> = (0..16)
                .map(|j| (deltas.iter().map(|d| f64::from(d[j])).sum::<f64>() / deltas.len() as f64) as f32)
                .collect();
            prop_assume!(l2f(&mean) > 1e-3);
            let got = Attack::Ipm { eps }.forge(&view(group[0], &group), &mut rng());
            prop_assert!(dot(&got, &mean) < 0.0);
        }

        #[test]
        fn colluders_forge_identically(
            deltas in prop::collection::vec(delta(16), 2..6), z in -3.0f32..3.0, seed in any::<u64>()
        ) {
            let group: Vec<&[f32]> = deltas.iter().map(Vec::as_slice).collect();
            for a in [Attack::Identical, Attack::Alie { z: Some(z) }, Attack::Alie { z: None }, Attack::Ipm { eps: 0.5 }] {
                let forged: Vec<Vec<f32>> = group
                    .iter()
                    .map(|own| a.forge(&view(own, &group), &mut ChaCha8Rng::seed_from_u64(seed)))
                    .collect();
                prop_assert!(forged.windows(2).all(|w| w[0] == w[1]), "{:?}", a);
            }
            // Identical is the mean.
            let got = Attack::Identical.forge(&view(group[0], &group), &mut rng());
            for (j, g) in got.iter().enumerate() {
                let m = deltas.iter().map(|d| f64::from(d[j])).sum::<f64>() / deltas.len() as f64;
                prop_assert!((f64::from(*g) - m).abs() <= 1e-4 * m.abs().max(1.0));
            }
        }

        #[test]
        fn alie_stays_within_z_std_of_the_mean(
            deltas in prop::collection::vec(delta(8), 1..6), z in -3.0f32..3.0
        ) {
            let group: Vec<&[f32]> = deltas.iter().map(Vec::as_slice).collect();
            let got = Attack::Alie { z: Some(z) }.forge(&view(group[0], &group), &mut rng());
            let (mean, var) = mean_var(&group);
            for j in 0..8 {
                let want = mean[j] + f64::from(z) * var[j].sqrt();
                prop_assert!((f64::from(got[j]) - want).abs() <= 1e-4 * want.abs().max(1.0));
            }
        }

        #[test]
        fn every_attack_keeps_the_length_and_never_panics(
            a in attack(), own in delta(12), other in prop::collection::vec(-1.0f32..1.0, 0..20),
            nodes in 0usize..100, r0 in 0usize..30, r1 in 0usize..30
        ) {
            let group: [&[f32]; 2] = [&own, &other];
            let ranges = vec![r0..r1, r1..r0];
            let v = Forge {
                own: &own,
                colluders: &group,
                peer: Some(&other),
                last_merged: Some(&other),
                nodes,
                lora_b: &ranges,
            };
            prop_assert_eq!(a.forge(&v, &mut rng()).len(), own.len());
            let empty: [&[f32]; 0] = [];
            let v = Forge { colluders: &empty, peer: None, last_merged: None, ..v };
            prop_assert_eq!(a.forge(&v, &mut rng()).len(), own.len());
        }

        #[test]
        fn stale_and_lie_loss_upload_the_honest_delta(own in delta(9), e in 1u32..5, f in 0.01f64..0.99) {
            let group: [&[f32]; 1] = [&own];
            prop_assert_eq!(Attack::Stale { epochs: e }.forge(&view(&own, &group), &mut rng()), own.clone());
            prop_assert_eq!(Attack::LieLoss { factor: f }.forge(&view(&own, &group), &mut rng()), own.clone());
        }
    }
}
