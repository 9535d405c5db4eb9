//! Choosing the robust aggregator: [`RobustPolicy`] (when) and [`RobustAggregator`]
//! (which).

use serde::{Deserialize, Serialize};

use super::{
    Aggregator, CenteredClipping, CoordinateMedian, Krum, MergeError, MergeOutcome, TrimmedMean,
    WeightedMean,
};

/// Which Byzantine-robust aggregator an epoch uses when [`RobustPolicy`] asks for one, as
/// configured (serde: internally tagged by `kind`, snake_case, e.g.
/// `{ kind = "multi_krum", byzantine_fraction = 0.2 }`; the default is `median`, the
/// paper's choice).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", deny_unknown_fields)]
pub enum RobustAggregator {
    /// [`CoordinateMedian`].
    #[default]
    Median,
    /// [`TrimmedMean`].
    TrimmedMean {
        /// Fraction trimmed from each end, in `[0, 0.5)` (default 0.2).
        #[serde(default = "default_trim")]
        trim: f32,
    },
    /// [`Krum`] with one selected delta.
    Krum {
        /// Assumed Byzantine fraction of the epoch's deltas, in `[0, 1)`:
        /// `f = floor(fraction · N)`.
        byzantine_fraction: f32,
    },
    /// [`Krum`] with several selected deltas (Multi-Krum).
    MultiKrum {
        /// Assumed Byzantine fraction of the epoch's deltas, in `[0, 1)`.
        byzantine_fraction: f32,
        /// How many deltas to select and average; `None`: `N − f`.
        #[serde(default)]
        select: Option<usize>,
    },
    /// [`CenteredClipping`].
    CenteredClipping {
        /// Iterations `L` (default 3).
        #[serde(default = "default_iterations")]
        iterations: usize,
        /// Clipping radius `τ` (L2 norm of a delta), or `None` for the median distance to
        /// the coordinate median.
        #[serde(default)]
        tau: Option<f32>,
    },
}

fn default_trim() -> f32 {
    TrimmedMean::default().trim
}

fn default_iterations() -> usize {
    CenteredClipping::default().iterations
}

/// An aggregator built from parameters that [`RobustAggregator::check`] refuses: every merge
/// fails with that error (the sink then reports the failed merge and falls back).
#[derive(Debug)]
struct Refused {
    name: &'static str,
    error: MergeError,
}

impl Aggregator for Refused {
    fn name(&self) -> &'static str {
        self.name
    }

    fn merge(&self, _: &[&[f32]], _: &[f32], _: &mut [f32]) -> Result<MergeOutcome, MergeError> {
        Err(self.error.clone())
    }
}

impl RobustAggregator {
    /// The name of the aggregator this builds ([`Aggregator::name`]; `"krum"` for Multi-Krum
    /// with `select = Some(1)`).
    pub fn name(&self) -> &'static str {
        match self {
            RobustAggregator::Median => "median",
            RobustAggregator::TrimmedMean { .. } => "trimmed_mean",
            RobustAggregator::Krum { .. } => "krum",
            RobustAggregator::MultiKrum {
                select: Some(1), ..
            } => "krum",
            RobustAggregator::MultiKrum { .. } => "multi_krum",
            RobustAggregator::CenteredClipping { .. } => "centered_clipping",
        }
    }

    /// Checks the parameters (for configuration loading): the trim in `[0, 0.5)`, the
    /// Byzantine fraction in `[0, 1)`, `select >= 1`, `τ` finite and `> 0`.
    ///
    /// # Errors
    ///
    /// [`MergeError::BadTrim`] or [`MergeError::BadParameter`] naming the parameter.
    pub fn check(&self) -> Result<(), MergeError> {
        match *self {
            RobustAggregator::Median => Ok(()),
            RobustAggregator::TrimmedMean { trim } if !(0.0..0.5).contains(&trim) => {
                Err(MergeError::BadTrim(trim))
            }
            RobustAggregator::TrimmedMean { .. } => Ok(()),
            RobustAggregator::Krum { byzantine_fraction }
            | RobustAggregator::MultiKrum {
                byzantine_fraction, ..
            } if !(0.0..1.0).contains(&byzantine_fraction) => Err(MergeError::BadParameter {
                name: "byzantine_fraction",
                value: f64::from(byzantine_fraction),
                expected: "must be in [0, 1)",
            }),
            RobustAggregator::MultiKrum {
                select: Some(0), ..
            } => Err(MergeError::BadParameter {
                name: "select",
                value: 0.0,
                expected: "must be at least 1",
            }),
            RobustAggregator::Krum { .. } | RobustAggregator::MultiKrum { .. } => Ok(()),
            RobustAggregator::CenteredClipping { tau: Some(t), .. }
                if !(t.is_finite() && t > 0.0) =>
            {
                Err(MergeError::BadParameter {
                    name: "tau",
                    value: f64::from(t),
                    expected: "must be finite and > 0",
                })
            }
            RobustAggregator::CenteredClipping { .. } => Ok(()),
        }
    }

    /// The aggregator for an epoch of `n` deltas (`n` resolves Krum's Byzantine fraction
    /// into a count; the other kinds ignore it). Parameters that [`check`](Self::check)
    /// refuses give an aggregator whose every merge fails with that error.
    pub fn build(&self, n: usize) -> Box<dyn Aggregator> {
        if let Err(error) = self.check() {
            return Box::new(Refused {
                name: self.name(),
                error,
            });
        }
        match *self {
            RobustAggregator::Median => Box::new(CoordinateMedian),
            RobustAggregator::TrimmedMean { trim } => Box::new(TrimmedMean { trim }),
            RobustAggregator::Krum { byzantine_fraction } => {
                match Krum::from_fraction(byzantine_fraction, n, Some(1)) {
                    Ok(k) => Box::new(k),
                    Err(error) => Box::new(Refused {
                        name: self.name(),
                        error,
                    }),
                }
            }
            RobustAggregator::MultiKrum {
                byzantine_fraction,
                select,
            } => match Krum::from_fraction(byzantine_fraction, n, select) {
                Ok(k) => Box::new(k),
                Err(error) => Box::new(Refused {
                    name: self.name(),
                    error,
                }),
            },
            RobustAggregator::CenteredClipping { iterations, tau } => {
                Box::new(CenteredClipping { iterations, tau })
            }
        }
    }
}

/// Chooses the aggregator for an epoch (paper §6, DESIGN §6): the robust one when *more
/// than* `suspect_threshold` of the epoch's deltas are suspect, the weighted mean otherwise.
#[derive(Debug)]
pub struct RobustPolicy {
    /// Fraction of suspect deltas above which the robust aggregator is used (default 0.30).
    pub suspect_threshold: f32,
    /// The robust aggregator (default [`CoordinateMedian`]; see [`RobustAggregator::build`]).
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
