//! Which refusals are logged (issue 19 item 7): a flood of bad requests must not turn into a
//! flood of log lines. The metric `rejected_messages{reason}` (or `deltas{outcome}`) counts
//! every refusal; the log gets the first refusal of each reason in every interval, and that
//! line carries how many of the same reason were refused, unlogged, since the last one.
//!
//! Keyed by reason, not by peer address: a key per address would let a caller with many
//! addresses (a /64 of IPv6) buy a log line per address; per reason, the log volume is
//! bounded by the number of reasons (a few dozen `&'static str`s) whatever the callers do.
//! Refusals for the daemon's own failures (`UNAVAILABLE`, `INTERNAL`) are not throttled.

use std::collections::HashMap;
use std::sync::Mutex;

/// The default interval between two log lines of one refusal reason: 10 s, in ms.
pub const DEFAULT_INTERVAL_MS: u64 = 10_000;

/// How one refusal is to be logged ([`RefusalLog::judge`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logged {
    /// The daemon's own failure (`UNAVAILABLE`, `INTERNAL`): always logged, as a warning,
    /// never throttled behind a flood of bad input.
    Failure,
    /// Logged; `unlogged` refusals of the same reason were suppressed since the last line.
    Refusal {
        /// Refusals of this reason counted but not logged since the last logged one.
        unlogged: u64,
    },
    /// Counted only.
    Suppressed,
}

/// The throttle's state for one reason: when its current interval began (ms) and how many
/// refusals were suppressed in it.
#[derive(Debug, Clone, Copy)]
struct Window {
    start_ms: u64,
    suppressed: u64,
}

/// Decides, per refusal reason, which refusals are logged (module docs). Thread-safe; the
/// decision is O(1) under a short lock.
#[derive(Debug)]
pub struct RefusalLog {
    interval_ms: u64,
    windows: Mutex<HashMap<&'static str, Window>>,
}

impl Default for RefusalLog {
    fn default() -> Self {
        RefusalLog::new(DEFAULT_INTERVAL_MS)
    }
}

impl RefusalLog {
    /// A throttle that logs each reason at most once per `interval_ms` (ms; 0 logs all).
    pub fn new(interval_ms: u64) -> RefusalLog {
        RefusalLog {
            interval_ms,
            windows: Mutex::new(HashMap::new()),
        }
    }

    /// A refusal for `reason` at `now_ms` (ms on the daemon's clock): `Some(n)` when it is
    /// to be logged, `n` being how many refusals of that reason were suppressed since the
    /// last logged one; `None` when it is to be counted only. A clock that went backwards
    /// starts a new interval.
    pub fn admit(&self, reason: &'static str, now_ms: u64) -> Option<u64> {
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        match windows.get_mut(reason) {
            Some(w) if now_ms >= w.start_ms && now_ms - w.start_ms < self.interval_ms => {
                w.suppressed += 1;
                None
            }
            Some(w) => {
                let suppressed = w.suppressed;
                *w = Window {
                    start_ms: now_ms,
                    suppressed: 0,
                };
                Some(suppressed)
            }
            None => {
                windows.insert(
                    reason,
                    Window {
                        start_ms: now_ms,
                        suppressed: 0,
                    },
                );
                Some(0)
            }
        }
    }

    /// How a refusal of `reason` with status `code` at `now_ms` is logged: a daemon failure
    /// always ([`Logged::Failure`]), a refusal as [`RefusalLog::admit`] decides.
    pub fn judge(&self, reason: &'static str, code: tonic::Code, now_ms: u64) -> Logged {
        if matches!(code, tonic::Code::Unavailable | tonic::Code::Internal) {
            return Logged::Failure;
        }
        match self.admit(reason, now_ms) {
            Some(unlogged) => Logged::Refusal { unlogged },
            None => Logged::Suppressed,
        }
    }

    /// Refusals of `reason` suppressed in its current interval (not yet in a logged line).
    pub fn suppressed(&self, reason: &str) -> u64 {
        let windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        windows.get(reason).map_or(0, |w| w.suppressed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_first_of_each_reason_per_interval_is_logged_with_the_count_since() {
        let log = RefusalLog::new(1_000);
        assert_eq!(log.admit("invalid", 0), Some(0));
        assert_eq!(log.admit("rate_limited", 10), Some(0));
        for t in 1..=999 {
            assert_eq!(log.admit("invalid", t), None);
        }
        assert_eq!(log.admit("invalid", 1_000), Some(999));
        assert_eq!(log.admit("invalid", 1_001), None);
        assert_eq!(log.admit("rate_limited", 5_000), Some(0));
        // A clock that steps back starts over rather than suppressing for ever.
        assert_eq!(log.admit("invalid", 10), Some(1));
        assert_eq!(RefusalLog::new(0).admit("x", 0), Some(0));
    }

    #[test]
    fn daemon_failures_are_never_suppressed() {
        let log = RefusalLog::new(1_000);
        assert_eq!(
            log.judge("invalid", tonic::Code::InvalidArgument, 0),
            Logged::Refusal { unlogged: 0 }
        );
        assert_eq!(
            log.judge("invalid", tonic::Code::InvalidArgument, 1),
            Logged::Suppressed
        );
        for code in [tonic::Code::Unavailable, tonic::Code::Internal] {
            assert_eq!(log.judge("invalid", code, 2), Logged::Failure);
        }
        // Failures do not use up the reason's line.
        assert_eq!(log.suppressed("invalid"), 1);
    }

    proptest! {
        /// Over any sequence of refusals, every refusal is either logged or counted in the
        /// next logged line of its reason, and at most one line per reason per interval
        /// (plus the first) is written.
        #[test]
        fn nothing_is_lost_and_lines_are_bounded(
            steps in proptest::collection::vec((0usize..3, 0u64..50), 1..400),
            interval in 1u64..200,
        ) {
            const REASONS: [&str; 3] = ["a", "b", "c"];
            let log = RefusalLog::new(interval);
            let mut now = 0u64;
            let mut seen = [0u64; 3];
            let mut accounted = [0u64; 3];
            let mut lines = [0u64; 3];
            for (r, dt) in steps {
                now += dt;
                seen[r] += 1;
                if let Some(n) = log.admit(REASONS[r], now) {
                    accounted[r] += n + 1;
                    lines[r] += 1;
                }
            }
            for r in 0..3 {
                // What is not yet accounted is the current interval's suppressed count.
                prop_assert_eq!(accounted[r] + log.suppressed(REASONS[r]), seen[r]);
                prop_assert!(lines[r] <= 1 + now / interval, "{} lines in {} ms", lines[r], now);
                if seen[r] > 0 {
                    prop_assert!(lines[r] >= 1);
                }
            }
        }
    }
}
