//! The pure part of supervision: a restart budget with exponential backoff.
//!
//! ractor has no restart policy of its own; each supervisor keeps a [`RestartBudget`] per
//! child and asks it, on every failure, whether and when to rebuild the child.

use std::collections::VecDeque;

use crate::config::SupervisionConfig;
use crate::types::Timestamp;

/// What to do with a failed child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartDecision {
    /// Rebuild it after this many ms.
    RestartAfter(u64),
    /// The budget is spent: give the child up.
    GiveUp,
}

/// Restarts of one child within a sliding window; at most `max_restarts` per `window_ms`,
/// with backoff `min(base · 2^k, max)` where k is the number of restarts in the window.
#[derive(Debug, Clone)]
pub struct RestartBudget {
    cfg: SupervisionConfig,
    recent: VecDeque<Timestamp>,
}

impl RestartBudget {
    /// A fresh budget.
    pub fn new(cfg: SupervisionConfig) -> Self {
        RestartBudget {
            cfg,
            recent: VecDeque::new(),
        }
    }

    /// Records a failure at `now` and decides.
    pub fn on_failure(&mut self, now: Timestamp) -> RestartDecision {
        while let Some(first) = self.recent.front() {
            if now.since(*first) >= self.cfg.window_ms {
                self.recent.pop_front();
            } else {
                break;
            }
        }
        if self.recent.len() as u32 >= self.cfg.max_restarts {
            return RestartDecision::GiveUp;
        }
        let k = self.recent.len() as u32;
        self.recent.push_back(now);
        let delay = self
            .cfg
            .backoff_base_ms
            .saturating_mul(1u64 << k.min(32))
            .min(self.cfg.backoff_max_ms);
        RestartDecision::RestartAfter(delay)
    }

    /// Restarts counted in the current window.
    pub fn recent_restarts(&self) -> usize {
        self.recent.len()
    }
}

/// A budget of `max` restarts per second, backoff 10 ms doubling to 100 ms (for tests).
#[cfg(test)]
pub(crate) fn test_config(max: u32) -> SupervisionConfig {
    SupervisionConfig {
        max_restarts: max,
        window_ms: 1_000,
        backoff_base_ms: 10,
        backoff_max_ms: 100,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(max: u32) -> SupervisionConfig {
        test_config(max)
    }
    use proptest::prelude::*;

    #[test]
    fn gives_up_after_budget_then_recovers_after_window() {
        let mut b = RestartBudget::new(cfg(3));
        assert_eq!(
            b.on_failure(Timestamp(0)),
            RestartDecision::RestartAfter(10)
        );
        assert_eq!(
            b.on_failure(Timestamp(1)),
            RestartDecision::RestartAfter(20)
        );
        assert_eq!(
            b.on_failure(Timestamp(2)),
            RestartDecision::RestartAfter(40)
        );
        assert_eq!(b.on_failure(Timestamp(3)), RestartDecision::GiveUp);
        assert_eq!(
            b.on_failure(Timestamp(2_000)),
            RestartDecision::RestartAfter(10)
        );
    }

    proptest! {
        #[test]
        fn never_more_than_max_restarts_in_any_window(
            gaps in proptest::collection::vec(0u64..400, 1..60), max in 1u32..6
        ) {
            let mut b = RestartBudget::new(cfg(max));
            let mut t = 0u64;
            let mut granted: Vec<u64> = vec![];
            for g in gaps {
                t += g;
                if let RestartDecision::RestartAfter(d) = b.on_failure(Timestamp(t)) {
                    prop_assert!(d <= 100);
                    granted.push(t);
                }
            }
            for (i, &s) in granted.iter().enumerate() {
                let in_window = granted[i..].iter().take_while(|&&x| x < s + 1_000).count();
                prop_assert!(in_window as u32 <= max);
            }
        }
    }
}
