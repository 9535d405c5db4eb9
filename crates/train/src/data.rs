//! The training data: Wine Quality (red), 1,599 samples × 11 physico-chemical features, the
//! quality score (0–10, integers 3–8 here) as the regression target. Source: P. Cortez,
//! A. Cerdeira, F. Almeida, T. Matos and J. Reis, "Modeling wine preferences by data mining
//! from physicochemical properties", Decision Support Systems 47(4), 2009 (UCI ML
//! repository); the copy compiled into the `linfa-datasets` crate (feature `winequality`),
//! so nothing is downloaded at run time.
//!
//! The split and the standardisation are fixed (independent of any recipe) so every node,
//! validator and auditor sees the same shards:
//! - a permutation of the samples by ChaCha20 seeded with SHA-256(`"hanzod-wine-split-v1"`)
//!   (Fisher–Yates, [`uniform_index`] draws); the first `round(n / 5)` samples of it are the
//!   validation shard, the rest the training shard; both are then sorted by original index;
//! - every feature and the target are standardised, `z = (v − μ) / σ`, with the mean and the
//!   population standard deviation of the **training** shard (computed in f64, stored in f32).
//!
//! Losses are therefore in standardised-target units: an MSE of 1.0 is the training-set
//! variance of the quality score (predicting the training mean scores ≈ 1.0);
//! `mse × target_std²` is the MSE in quality points².

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use sha2::{Digest, Sha256};

use super::TrainError;

/// Number of input features.
pub const FEATURES: usize = 11;

/// A uniform index in `0..n` from `rng` (`n ≥ 1`): 32-bit draws `r` (ChaCha `next_u32`),
/// rejecting `r ≥ 2³² − (2³² mod n)`, then `r mod n`. Unbiased, and written out so that an
/// auditor can replay it without this crate's `rand` version.
pub(crate) fn uniform_index(rng: &mut ChaCha20Rng, n: usize) -> usize {
    debug_assert!(n >= 1 && n as u64 <= u64::from(u32::MAX));
    let n = n as u64;
    let zone = (1u64 << 32) - ((1u64 << 32) % n);
    loop {
        let r = u64::from(rng.next_u32());
        if r < zone {
            return (r % n) as usize;
        }
    }
}

/// Standardised training and validation shards.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// Training features, `[train_len, FEATURES]` row-major, standardised.
    x_train: Vec<f32>,
    /// Training targets, `[train_len]`, standardised.
    y_train: Vec<f32>,
    /// Validation features, `[validation_len, FEATURES]`.
    x_val: Vec<f32>,
    /// Validation targets, `[validation_len]`.
    y_val: Vec<f32>,
    feature_mean: [f64; FEATURES],
    feature_std: [f64; FEATURES],
    target_mean: f64,
    target_std: f64,
}

impl Dataset {
    /// The red Wine Quality data set (1,599 samples): 1,279 training and 320 validation
    /// samples, split and standardised as the module documentation says.
    pub fn wine_quality() -> Result<Dataset, TrainError> {
        let ds = linfa_datasets::winequality();
        let records = ds.records();
        let targets = ds.targets();
        if records.ncols() != FEATURES || records.nrows() != targets.len() {
            return Err(TrainError::Dataset(format!(
                "wine quality: {} × {} features for {} targets, want {FEATURES} features",
                records.nrows(),
                records.ncols(),
                targets.len()
            )));
        }
        let rows: Vec<[f64; FEATURES]> = records
            .rows()
            .into_iter()
            .map(|r| std::array::from_fn(|j| r[j]))
            .collect();
        let y: Vec<f64> = targets.iter().map(|&q| q as f64).collect();
        Dataset::from_rows(&rows, &y)
    }

    /// Splits and standardises arbitrary samples (`features[i]` → `targets[i]`) as
    /// [`Dataset::wine_quality`] does. Needs at least 10 samples, finite values, and a
    /// non-zero training spread of every feature and of the target.
    pub fn from_rows(features: &[[f64; FEATURES]], targets: &[f64]) -> Result<Dataset, TrainError> {
        let n = features.len();
        if n != targets.len() {
            return Err(TrainError::Dataset(format!(
                "{n} feature rows for {} targets",
                targets.len()
            )));
        }
        if n < 10 || n as u64 > u64::from(u32::MAX) {
            return Err(TrainError::Dataset(format!(
                "{n} samples (need 10 to 2^32 − 1)"
            )));
        }
        if let Some(i) =
            (0..n).find(|&i| !targets[i].is_finite() || features[i].iter().any(|v| !v.is_finite()))
        {
            return Err(TrainError::Dataset(format!("sample {i} is not finite")));
        }
        // Fixed permutation (Fisher–Yates, from the end).
        let seed: [u8; 32] = Sha256::digest(hanzod_actors::domain::WINE_SPLIT).into();
        let mut rng = ChaCha20Rng::from_seed(seed);
        let mut perm: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            let j = uniform_index(&mut rng, i + 1);
            perm.swap(i, j);
        }
        let n_val = (n + 2) / 5; // round(n / 5)
        let mut val = perm[..n_val].to_vec();
        let mut train = perm[n_val..].to_vec();
        val.sort_unstable();
        train.sort_unstable();

        let stats = |f: &dyn Fn(usize) -> f64| -> (f64, f64) {
            let m = train.iter().map(|&i| f(i)).sum::<f64>() / train.len() as f64;
            let v = train.iter().map(|&i| (f(i) - m).powi(2)).sum::<f64>() / train.len() as f64;
            (m, v.sqrt())
        };
        let mut feature_mean = [0.0; FEATURES];
        let mut feature_std = [0.0; FEATURES];
        for j in 0..FEATURES {
            let (m, s) = stats(&|i| features[i][j]);
            if s <= 0.0 {
                return Err(TrainError::Dataset(format!("feature {j} is constant")));
            }
            feature_mean[j] = m;
            feature_std[j] = s;
        }
        let (target_mean, target_std) = stats(&|i| targets[i]);
        if target_std <= 0.0 {
            return Err(TrainError::Dataset("the target is constant".into()));
        }
        let xs = |idx: &[usize]| -> Vec<f32> {
            idx.iter()
                .flat_map(|&i| {
                    (0..FEATURES)
                        .map(move |j| ((features[i][j] - feature_mean[j]) / feature_std[j]) as f32)
                })
                .collect()
        };
        let ys = |idx: &[usize]| -> Vec<f32> {
            idx.iter()
                .map(|&i| ((targets[i] - target_mean) / target_std) as f32)
                .collect()
        };
        Ok(Dataset {
            x_train: xs(&train),
            y_train: ys(&train),
            x_val: xs(&val),
            y_val: ys(&val),
            feature_mean,
            feature_std,
            target_mean,
            target_std,
        })
    }

    /// Samples in the training shard.
    pub fn train_len(&self) -> usize {
        self.y_train.len()
    }

    /// Samples in the held-out validation shard.
    pub fn validation_len(&self) -> usize {
        self.y_val.len()
    }

    /// Training-shard mean of the raw target (quality points).
    pub fn target_mean(&self) -> f64 {
        self.target_mean
    }

    /// Training-shard population standard deviation of the raw target (quality points):
    /// a loss `l` in standardised units is `l × target_std²` quality points².
    pub fn target_std(&self) -> f64 {
        self.target_std
    }

    /// Training-shard means of the raw features.
    pub fn feature_mean(&self) -> &[f64; FEATURES] {
        &self.feature_mean
    }

    /// Training-shard population standard deviations of the raw features.
    pub fn feature_std(&self) -> &[f64; FEATURES] {
        &self.feature_std
    }

    /// Standardised validation features `[validation_len × FEATURES]` and targets.
    pub(crate) fn validation(&self) -> (&[f32], &[f32]) {
        (&self.x_val, &self.y_val)
    }

    /// Standardised training features and targets of the samples `idx` (gathered, in the
    /// order given): `[idx.len() × FEATURES]` and `[idx.len()]`.
    pub(crate) fn gather_train(&self, idx: &[usize]) -> (Vec<f32>, Vec<f32>) {
        let mut x = Vec::with_capacity(idx.len() * FEATURES);
        let mut y = Vec::with_capacity(idx.len());
        for &i in idx {
            x.extend_from_slice(&self.x_train[i * FEATURES..(i + 1) * FEATURES]);
            y.push(self.y_train[i]);
        }
        (x, y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wine_split_and_standardisation() {
        let d = Dataset::wine_quality().unwrap();
        assert_eq!(d.train_len() + d.validation_len(), 1599);
        assert_eq!(d.validation_len(), 320);
        // Published statistics of the red wine quality score: mean 5.636, sd 0.808.
        assert!(
            (d.target_mean() - 5.636).abs() < 0.05,
            "{}",
            d.target_mean()
        );
        assert!((d.target_std() - 0.808).abs() < 0.05, "{}", d.target_std());
        // Alcohol (feature 10): mean 10.42 % vol.
        assert!((d.feature_mean()[10] - 10.42).abs() < 0.1);
        // Standardised training features: mean 0, variance 1.
        let n = d.train_len() as f64;
        for j in 0..FEATURES {
            let col: Vec<f64> = (0..d.train_len())
                .map(|i| f64::from(d.x_train[i * FEATURES + j]))
                .collect();
            let m = col.iter().sum::<f64>() / n;
            let v = col.iter().map(|x| (x - m).powi(2)).sum::<f64>() / n;
            assert!(
                m.abs() < 1e-5 && (v - 1.0).abs() < 1e-4,
                "feature {j}: {m} {v}"
            );
        }
        let (x, y) = d.gather_train(&[3, 0]);
        assert_eq!(x.len(), 2 * FEATURES);
        assert_eq!(y, vec![d.y_train[3], d.y_train[0]]);
    }

    #[test]
    fn uniform_index_is_in_range_and_covers() {
        let mut rng = ChaCha20Rng::from_seed([7; 32]);
        let mut seen = [0u32; 7];
        for _ in 0..7000 {
            seen[uniform_index(&mut rng, 7)] += 1;
        }
        assert!(seen.iter().all(|&c| (800..1200).contains(&c)), "{seen:?}");
    }

    #[test]
    fn bad_samples_are_refused() {
        let rows = vec![[1.0; FEATURES]; 20];
        let y: Vec<f64> = (0..20).map(f64::from).collect();
        assert!(matches!(
            Dataset::from_rows(&rows, &y),
            Err(TrainError::Dataset(m)) if m.contains("constant")
        ));
        let mut rows: Vec<[f64; FEATURES]> = (0..20)
            .map(|i| std::array::from_fn(|j| (i * (j + 1)) as f64))
            .collect();
        assert!(Dataset::from_rows(&rows, &y).is_ok());
        rows[4][2] = f64::NAN;
        assert!(matches!(
            Dataset::from_rows(&rows, &y),
            Err(TrainError::Dataset(_))
        ));
        assert!(matches!(
            Dataset::from_rows(&rows[..5], &y[..5]),
            Err(TrainError::Dataset(_))
        ));
        assert!(matches!(
            Dataset::from_rows(&rows, &y[..3]),
            Err(TrainError::Dataset(_))
        ));
    }
}
