//! What validating one epoch of a job costs the orchestrator, in floating-point operations
//! (DESIGN §6), so that SubmitJob can refuse a job whose validation the daemon could not
//! afford.
//!
//! Per epoch the validator scores the base checkpoint once and every delta once on the
//! job's validation set (a forward pass over it each: `max_nodes + 1` passes at most), and
//! re-runs the local steps of the spot-checked deltas (a forward and a backward pass over
//! one node's whole local run each, for `⌈spot_check_rate × max_nodes⌉` deltas). With the
//! standard estimates of J. Kaplan et al., "Scaling Laws for Neural Language Models"
//! (2020), §2.1: a forward pass costs about `2·P` FLOPs per token and a forward plus
//! backward pass `6·P`, for `P` parameters, so
//!
//! ```text
//! cost = 2·P·V·(N + 1) + ⌈rate·N⌉·6·P·R
//! ```
//!
//! with `V` the validation set's items, `N` the job's `max_nodes` and `R` the items of one
//! node's local run: tokens for a language model (`V = validation_tokens`,
//! `R = local_steps × batch_size × (seq_len + 1)`), samples for the `wine-mlp` (its
//! validation set, and `local_steps × batch_size`). The claimed-loss check of a spot-check
//! (one batch, forward only) is within the replay's estimate and not counted apart.
//!
//! Everything here is pure arithmetic in `f64` (the products overflow `u64` for large
//! models long before they overflow `f64`).

use hanzod_actors::job::TrainingSpec;

/// Forward-pass FLOPs per parameter per item (Kaplan et al. 2020, §2.1).
pub const FORWARD_FLOPS_PER_PARAM: f64 = 2.0;

/// Forward-and-backward FLOPs per parameter per item (Kaplan et al. 2020, §2.1).
pub const TRAIN_FLOPS_PER_PARAM: f64 = 6.0;

/// One epoch's validation work for a job ([module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EpochValidation {
    /// `P`: the model's parameter count.
    pub params: u64,
    /// `V`: items (tokens, or samples for the MLP) of the validation set, scored once for
    /// the base and once per delta.
    pub validation_items: u64,
    /// `R`: items of one node's local run, which a spot-check replays forward and
    /// backward.
    pub replay_items: u64,
    /// `N`: the most deltas an epoch can have (the job's `max_nodes`).
    pub deltas: u32,
    /// The fraction of deltas spot-checked (`validation.spot_check_rate`); clamped to
    /// `[0, 1]`, NaN counting as 1.
    pub spot_check_rate: f64,
}

impl EpochValidation {
    /// A language-model job's epoch: `V = validation_tokens`,
    /// `R = local_steps × batch_size × (seq_len + 1)` tokens ([`lm_replay_tokens`]),
    /// `N = max_nodes`, with `params` the model's parameter count.
    pub fn lm(
        params: u64,
        training: &TrainingSpec,
        max_nodes: u32,
        spot_check_rate: f64,
    ) -> EpochValidation {
        EpochValidation {
            params,
            validation_items: training.validation_tokens,
            replay_items: lm_replay_tokens(training),
            deltas: max_nodes,
            spot_check_rate,
        }
    }

    /// The `wine-mlp`'s epoch: `V = validation_samples` (its validation set),
    /// `R = local_steps × batch_size` samples, `N = max_nodes`.
    pub fn mlp(
        params: u64,
        validation_samples: u64,
        training: &TrainingSpec,
        max_nodes: u32,
        spot_check_rate: f64,
    ) -> EpochValidation {
        EpochValidation {
            params,
            validation_items: validation_samples,
            replay_items: u64::from(training.local_steps) * u64::from(training.batch_size),
            deltas: max_nodes,
            spot_check_rate,
        }
    }

    /// The deltas spot-checked per epoch at most in expectation: `⌈rate × N⌉`. A product
    /// that rounding put less than one part in 10¹² above an integer counts as that integer
    /// (0.7 × 90 is 63 checks, although its `f64` product is 63.00000000000001).
    pub fn spot_checks(&self) -> u64 {
        let rate = if self.spot_check_rate.is_nan() {
            1.0
        } else {
            self.spot_check_rate.clamp(0.0, 1.0)
        };
        let x = rate * f64::from(self.deltas);
        // At most N: the clamp keeps the tolerance from rounding 0 or N the wrong way.
        ((x * (1.0 - 1e-12)).ceil() as u64).min(u64::from(self.deltas))
    }

    /// The epoch's validation cost, FLOPs:
    /// `2·P·V·(N + 1) + ⌈rate·N⌉·6·P·R` ([module docs](self)).
    pub fn flops(&self) -> f64 {
        let p = self.params as f64;
        let scoring = FORWARD_FLOPS_PER_PARAM
            * p
            * self.validation_items as f64
            * (f64::from(self.deltas) + 1.0);
        let replay =
            self.spot_checks() as f64 * TRAIN_FLOPS_PER_PARAM * p * self.replay_items as f64;
        scoring + replay
    }
}

/// Tokens of one node's local run of a language-model job:
/// `local_steps × batch_size × (seq_len + 1)` (each sequence is a window of `seq_len + 1`
/// tokens), saturating at `u64::MAX`.
pub fn lm_replay_tokens(training: &TrainingSpec) -> u64 {
    u64::from(training.local_steps)
        .saturating_mul(u64::from(training.batch_size))
        .saturating_mul(u64::from(training.seq_len) + 1)
}

/// A job whose epoch validation would cost more than the daemon's budget.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error(
    "validating one epoch of this job would take about {flops:.3e} FLOPs, above this \
     daemon's budget of {budget:.3e} FLOPs per epoch (validation.validation_budget_flops): \
     fewer validation tokens, fewer nodes, shorter local runs or a smaller model fit"
)]
pub struct OverBudget {
    /// The epoch's estimated validation cost, FLOPs ([`EpochValidation::flops`]).
    pub flops: f64,
    /// The budget, FLOPs per epoch.
    pub budget: f64,
}

/// `Ok` when `work` costs at most `budget` FLOPs per epoch, else [`OverBudget`] with both
/// figures. A NaN cost (impossible from finite inputs) is over any budget.
pub fn check_budget(work: &EpochValidation, budget: f64) -> Result<(), OverBudget> {
    let flops = work.flops();
    if flops <= budget {
        Ok(())
    } else {
        Err(OverBudget { flops, budget })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn lm(validation_tokens: u64, local_steps: u32, batch_size: u32, seq_len: u32) -> TrainingSpec {
        TrainingSpec {
            model: "qwen3-tiny".into(),
            dataset: "austen".into(),
            validation_tokens,
            local_steps,
            batch_size,
            seq_len,
            ..TrainingSpec::default()
        }
    }

    #[test]
    fn the_formula_by_hand() {
        // P = 1,000, V = 100, N = 4, rate 0.5 → 2 checks, R = 2 × 3 × 5 = 30.
        let w = EpochValidation::lm(1_000, &lm(100, 2, 3, 4), 4, 0.5);
        assert_eq!(w.replay_items, 30);
        assert_eq!(w.spot_checks(), 2);
        // 2·1000·100·5 + 2·6·1000·30 = 1,000,000 + 360,000.
        assert_eq!(w.flops(), 1_360_000.0);
        // The MLP: samples, no window.
        let m = EpochValidation::mlp(1_000, 320, &lm(0, 2, 3, 4), 4, 0.5);
        assert_eq!(m.replay_items, 6);
        assert_eq!(
            m.flops(),
            2.0 * 1000.0 * 320.0 * 5.0 + 2.0 * 6.0 * 1000.0 * 6.0
        );
    }

    #[test]
    fn spot_checks_round_up_but_not_past_rounding_noise() {
        let at = |rate: f64, n: u32| EpochValidation {
            params: 1,
            validation_items: 1,
            replay_items: 1,
            deltas: n,
            spot_check_rate: rate,
        };
        assert_eq!(at(0.1, 8).spot_checks(), 1); // 0.8 → 1
        assert_eq!(at(0.1, 30).spot_checks(), 3);
        assert_eq!(at(0.1, 64).spot_checks(), 7); // 6.4 → 7
        assert_eq!(at(0.7, 90).spot_checks(), 63); // 63.00000000000001 → 63
        assert_eq!(at(0.0, 64).spot_checks(), 0);
        assert_eq!(at(1.0, 64).spot_checks(), 64);
        assert_eq!(at(1e-9, 64).spot_checks(), 1);
        assert_eq!(at(2.0, 5).spot_checks(), 5);
        assert_eq!(at(-1.0, 5).spot_checks(), 0);
        assert_eq!(at(f64::NAN, 5).spot_checks(), 5);
        assert_eq!(at(0.5, 0).spot_checks(), 0);
    }

    /// The figures the daemon's default budget (1e14 FLOPs) is argued from.
    #[test]
    fn the_default_budget_examples() {
        let budget = 1e14;
        // qwen3-tiny (1.05 M parameters), config/job.lm.example.toml: V 2048, N 8, 8 × 8 × 65.
        let tiny = EpochValidation::lm(1_050_000, &lm(2048, 8, 8, 64), 8, 0.1);
        // 2·1.05e6·2048·9 + ⌈0.8⌉·6·1.05e6·4160 = 3.87e10 + 2.62e10.
        assert_eq!(tiny.flops(), 6.49152e10);
        // qwen3-tiny with the TrainingSpec defaults (V 4096, 20 × 32 × 129) on 64 nodes:
        // 5.6e11 + 7 × 5.2e11 = 4.2e12.
        let tiny64 = EpochValidation::lm(1_050_000, &lm(4096, 20, 32, 128), 64, 0.1);
        assert!(tiny64.flops() < budget / 20.0, "{}", tiny64.flops());
        // The wine-mlp of config/job.example.toml: 1,473 parameters, 320 validation samples,
        // 16 nodes, 10,000 steps of 1,024 samples.
        let t = TrainingSpec {
            local_steps: 10_000,
            batch_size: 1024,
            ..TrainingSpec::default()
        };
        let mlp = EpochValidation::mlp(1_473, 320, &t, 16, 0.1);
        assert!(mlp.flops() < budget / 100.0, "{}", mlp.flops());
        // Qwen3-0.6B (596 M parameters, tied embeddings): 4096 validation tokens on 64
        // nodes is 3.2e14 FLOPs of scoring alone, before any spot-check.
        let big = EpochValidation::lm(596_049_920, &lm(4096, 1, 1, 2), 64, 0.1);
        assert!(big.flops() > 3e14, "{}", big.flops());
        assert!(check_budget(&big, budget).is_err());
        assert!(check_budget(&tiny, budget).is_ok());
    }

    #[test]
    fn over_budget_names_both_figures() {
        let w = EpochValidation::lm(1_000_000, &lm(1000, 1, 1, 2), 9, 0.0);
        let e = check_budget(&w, 1e9).unwrap_err();
        assert_eq!(e.flops, 2e10); // 2·1e6·1000·10
        assert_eq!(e.budget, 1e9);
        let msg = e.to_string();
        assert!(msg.contains("2.000e10") && msg.contains("1.000e9"), "{msg}");
        assert_eq!(check_budget(&w, 2e10), Ok(()));
    }

    #[test]
    fn replay_tokens_saturate() {
        assert_eq!(lm_replay_tokens(&lm(1, 8, 8, 64)), 8 * 8 * 65);
        assert_eq!(
            lm_replay_tokens(&lm(1, u32::MAX, u32::MAX, u32::MAX)),
            u64::MAX
        );
    }

    proptest! {
        /// The cost is monotone in every input and never negative or NaN.
        #[test]
        fn cost_is_monotone(
            params in 1u64..1 << 40,
            v in 0u64..1 << 24,
            r in 0u64..1 << 40,
            n in 0u32..4096,
            rate in 0.0f64..=1.0,
        ) {
            let w = EpochValidation {
                params,
                validation_items: v,
                replay_items: r,
                deltas: n,
                spot_check_rate: rate,
            };
            let f = w.flops();
            prop_assert!(f.is_finite() && f >= 0.0);
            for more in [
                EpochValidation { params: params + 1, ..w },
                EpochValidation { validation_items: v + 1, ..w },
                EpochValidation { replay_items: r + 1, ..w },
                EpochValidation { deltas: n + 1, ..w },
                EpochValidation { spot_check_rate: (rate + 0.01).min(1.0), ..w },
            ] {
                prop_assert!(more.flops() >= f);
            }
            prop_assert!(w.spot_checks() <= u64::from(n));
            prop_assert!(w.spot_checks() as f64 >= rate * f64::from(n) - 1e-6);
        }
    }
}
