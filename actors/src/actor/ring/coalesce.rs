//! Leading-edge coalescing of ring failures (DESIGN §4): the rule the
//! [`RingActor`](super::RingActor) follows to turn failure reports into reconfigurations.
//!
//! Pure: no clock, no I/O, no async. Time is whatever the caller passes (tokio's
//! `Instant` in the actor, a `Duration` since an origin in the tests).
//!
//! # The rule
//!
//! * A failure reported while no window is open is a *leading edge*: it is applied at once
//!   (one reconfiguration) and opens a window of `core.ring.coalesce_ms`. The window is
//!   re-opened when that reconfiguration finishes ([`Coalescer::on_applied`]): it closes a
//!   full window after the leading edge's reconfiguration completed. The actor applies a
//!   failure inside the handler that received it, so failures reported during a slow
//!   reconfiguration (registry query, scheduler ask, store commit) wait in its mailbox and
//!   are seen only when it finishes; timed from the leading edge alone, a reconfiguration
//!   slower than the window would make each of them a leading edge of its own.
//! * Failures reported while the window is open are held, and applied together when it
//!   closes (one more reconfiguration). If none arrived, the window simply closes.
//! * A failure reported after the window closed is a leading edge again.
//!
//! So a lone failure is never delayed by the window: with the default 200 ms window one
//! crash reconfigures a 64-node ring in about 20 ms instead of the 240 ms of a
//! trailing-edge window (200 ms of which was waiting), while a burst of failures within
//! one window (counted from the end of the leading edge's reconfiguration) still gives at
//! most two reconfigurations. A held failure waits at most the window from when the actor
//! sees it, provided the close is delivered on time; measured from when it was reported, it
//! also waits out whatever the actor was busy with then (at least the rest of the leading
//! edge's reconfiguration).
//!
//! A window whose close is delivered late (its closing message queued behind other work)
//! is treated as closed from its deadline on: a failure reported past the deadline is a
//! leading edge that takes the held failures with it, and a stale close (one for a window
//! already replaced) is ignored.

use std::collections::BTreeSet;
use std::ops::Add;
use std::time::Duration;

/// What the caller does with a failure just reported to a [`Coalescer`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnFailure<T, I> {
    /// No window was open: apply `batch` now (the failure, plus any held by a window whose
    /// deadline has passed but whose close was not delivered yet) as one reconfiguration,
    /// and call [`Coalescer::on_window_closed`] at `close_at`, when the window it opened
    /// closes.
    ApplyNow {
        /// The failures to apply now.
        batch: Vec<T>,
        /// When the window this failure opened closes.
        close_at: I,
    },
    /// A window is open: the failure is held until it closes at `close_at` (the call to
    /// [`Coalescer::on_window_closed`] is already due then: scheduled by the caller after
    /// [`OnFailure::ApplyNow`] or [`Coalescer::on_applied`]).
    Held {
        /// When the open window closes.
        close_at: I,
    },
    /// The failure is already held: nothing to do.
    AlreadyHeld,
}

/// Leading-edge coalescing of failures of items `T` (node ids in the actor) at times `I`;
/// see the [module documentation](self).
#[derive(Debug, Clone)]
pub struct Coalescer<T, I> {
    window: Duration,
    /// The open window's deadline; `None` when no window is open.
    open_until: Option<I>,
    /// Failures reported while the window is open, applied when it closes.
    held: BTreeSet<T>,
}

impl<T, I> Coalescer<T, I>
where
    T: Ord + Clone,
    I: Copy + Ord + Add<Duration, Output = I>,
{
    /// A coalescer with a window of `window` (`core.ring.coalesce_ms`). With a zero window
    /// every failure is applied at once.
    pub fn new(window: Duration) -> Self {
        Coalescer {
            window,
            open_until: None,
            held: BTreeSet::new(),
        }
    }

    /// `item` failed at `now`: apply it now (a leading edge), or hold it for the open
    /// window.
    pub fn on_failure(&mut self, item: T, now: I) -> OnFailure<T, I> {
        match self.open_until {
            Some(close_at) if now < close_at => {
                if self.held.insert(item) {
                    OnFailure::Held { close_at }
                } else {
                    OnFailure::AlreadyHeld
                }
            }
            // No window, or one past its deadline whose close is still on its way.
            _ => {
                self.held.insert(item);
                let close_at = now + self.window;
                self.open_until = Some(close_at);
                OnFailure::ApplyNow {
                    batch: std::mem::take(&mut self.held).into_iter().collect(),
                    close_at,
                }
            }
        }
    }

    /// The reconfiguration an [`OnFailure::ApplyNow`] asked for finished at `now`: the
    /// open window is re-opened to close a full window from `now` (never earlier than it
    /// would have), so failures reported while that reconfiguration ran are held and
    /// applied together rather than each becoming a leading edge. Returns the new deadline
    /// when it moved: the caller then calls [`Coalescer::on_window_closed`] at it (the close
    /// due at the earlier deadline becomes stale and changes nothing). `None`: no window is
    /// open, or its deadline is unchanged (a reconfiguration that took no time).
    pub fn on_applied(&mut self, now: I) -> Option<I> {
        let close_at = self.open_until.as_mut()?;
        let reopened = now + self.window;
        if reopened > *close_at {
            *close_at = reopened;
            Some(reopened)
        } else {
            None
        }
    }

    /// The close of a window, due at the `close_at` an [`OnFailure::ApplyNow`] gave,
    /// delivered at `now`: when the open window's deadline has passed it closes and the
    /// failures it held are returned, to apply as one reconfiguration (empty: nothing to
    /// do). A close delivered before the deadline of the open window (a stale one, for a
    /// window since replaced) changes nothing and returns nothing.
    pub fn on_window_closed(&mut self, now: I) -> Vec<T> {
        match self.open_until {
            Some(close_at) if now >= close_at => {
                self.open_until = None;
                std::mem::take(&mut self.held).into_iter().collect()
            }
            _ => vec![],
        }
    }

    /// Whether a window is open (its close not delivered yet).
    pub fn is_open(&self) -> bool {
        self.open_until.is_some()
    }

    /// Whether `item` is held for the open window.
    pub fn holds(&self, item: &T) -> bool {
        self.held.contains(item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const W: Duration = Duration::from_millis(200);

    fn ms(x: u64) -> Duration {
        Duration::from_millis(x)
    }

    /// One reconfiguration: when it was applied and which failures (indices) it applied.
    type Applied = (Duration, Vec<usize>);

    /// Runs failures `i` at `times[i]` (sorted) through a coalescer whose window closes are
    /// delivered exactly at their deadline; on a tie, the close first when `close_first`.
    /// Reconfigurations take no time.
    fn simulate(window: Duration, times: &[Duration], close_first: bool) -> Vec<Applied> {
        simulate_slow(window, times, close_first, Duration::ZERO).0
    }

    /// Like [`simulate`], but every reconfiguration takes `apply` and, like the actor, is
    /// run inside the handler: failures and closes due meanwhile queue (in order) and are
    /// handled when it finishes. The leading edge's completion is reported with
    /// [`Coalescer::on_applied`]. `Applied` records when a reconfiguration started; also
    /// returns when each failure was handled (seen by the coalescer).
    fn simulate_slow(
        window: Duration,
        times: &[Duration],
        close_first: bool,
        apply: Duration,
    ) -> (Vec<Applied>, Vec<Duration>) {
        let mut seen_at = vec![];
        let mut c: Coalescer<usize, Duration> = Coalescer::new(window);
        let mut timers: Vec<Duration> = vec![];
        let mut applied = vec![];
        let mut next = 0;
        // When the handler running now finishes.
        let mut busy_until = Duration::ZERO;
        loop {
            timers.sort();
            let timer = timers.first().copied();
            let failure = times.get(next).copied();
            let fire_timer = match (timer, failure) {
                (None, None) => break,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (Some(t), Some(f)) => t < f || (t == f && close_first),
            };
            if fire_timer {
                let now = timers.remove(0).max(busy_until);
                let batch = c.on_window_closed(now);
                if !batch.is_empty() {
                    applied.push((now, batch));
                    busy_until = now + apply;
                }
            } else {
                let now = failure.unwrap().max(busy_until);
                seen_at.push(now);
                match c.on_failure(next, now) {
                    OnFailure::ApplyNow { batch, close_at } => {
                        assert!(batch.contains(&next));
                        assert_eq!(close_at, now + window);
                        timers.push(close_at);
                        applied.push((now, batch));
                        busy_until = now + apply;
                        if let Some(close_at) = c.on_applied(busy_until) {
                            assert_eq!(close_at, busy_until + window);
                            timers.push(close_at);
                        }
                    }
                    OnFailure::Held { close_at } => {
                        assert!(close_at > now && close_at <= now + window);
                        assert!(c.holds(&next));
                    }
                    OnFailure::AlreadyHeld => panic!("each index fails once"),
                }
                next += 1;
            }
        }
        assert!(!c.is_open(), "every window closes");
        (applied, seen_at)
    }

    fn sorted_times(max_gap_ms: u64, len: usize) -> impl Strategy<Value = Vec<Duration>> {
        prop::collection::vec(0..=max_gap_ms, 0..len).prop_map(|gaps| {
            let mut t = 0;
            gaps.into_iter()
                .map(|g| {
                    t += g;
                    ms(t)
                })
                .collect()
        })
    }

    #[test]
    fn a_lone_failure_is_applied_at_once_and_its_window_closes_empty() {
        let mut c: Coalescer<&str, Duration> = Coalescer::new(W);
        assert_eq!(
            c.on_failure("a", ms(1_000)),
            OnFailure::ApplyNow {
                batch: vec!["a"],
                close_at: ms(1_200)
            }
        );
        assert!(c.is_open());
        assert!(c.on_window_closed(ms(1_200)).is_empty());
        assert!(!c.is_open());
        // After the window, a failure is a leading edge again.
        assert!(matches!(
            c.on_failure("b", ms(1_300)),
            OnFailure::ApplyNow { .. }
        ));
    }

    #[test]
    fn failures_within_the_window_are_held_and_applied_together_when_it_closes() {
        let mut c: Coalescer<&str, Duration> = Coalescer::new(W);
        assert!(matches!(
            c.on_failure("a", ms(0)),
            OnFailure::ApplyNow { .. }
        ));
        assert_eq!(
            c.on_failure("c", ms(50)),
            OnFailure::Held { close_at: ms(200) }
        );
        assert_eq!(
            c.on_failure("b", ms(199)),
            OnFailure::Held { close_at: ms(200) }
        );
        assert_eq!(c.on_failure("b", ms(199)), OnFailure::AlreadyHeld);
        // A stale close (before the deadline) changes nothing.
        assert!(c.on_window_closed(ms(100)).is_empty());
        assert!(c.holds(&"b"));
        assert_eq!(c.on_window_closed(ms(200)), vec!["b", "c"]);
        assert!(!c.is_open() && !c.holds(&"b"));
    }

    #[test]
    fn a_failure_past_a_late_close_takes_the_held_failures_with_it() {
        let mut c: Coalescer<&str, Duration> = Coalescer::new(W);
        assert!(matches!(
            c.on_failure("a", ms(0)),
            OnFailure::ApplyNow { .. }
        ));
        assert!(matches!(c.on_failure("b", ms(10)), OnFailure::Held { .. }));
        // The close due at 200 ms has not been delivered yet.
        assert_eq!(
            c.on_failure("c", ms(250)),
            OnFailure::ApplyNow {
                batch: vec!["b", "c"],
                close_at: ms(450)
            }
        );
        // The late close of the first window is stale for the second.
        assert!(c.on_window_closed(ms(260)).is_empty());
        assert!(c.is_open());
        assert!(c.on_window_closed(ms(450)).is_empty());
        assert!(!c.is_open());
    }

    #[test]
    fn the_window_reopens_when_the_leading_edge_reconfiguration_finishes() {
        let mut c: Coalescer<&str, Duration> = Coalescer::new(W);
        assert!(matches!(
            c.on_failure("a", ms(0)),
            OnFailure::ApplyNow { close_at, .. } if close_at == ms(200)
        ));
        // The reconfiguration took 500 ms, longer than the window.
        assert_eq!(c.on_applied(ms(500)), Some(ms(700)));
        // Failures queued meanwhile are seen after it: held, not leading edges.
        assert_eq!(
            c.on_failure("b", ms(500)),
            OnFailure::Held { close_at: ms(700) }
        );
        assert_eq!(
            c.on_failure("c", ms(500)),
            OnFailure::Held { close_at: ms(700) }
        );
        // The close due at 200 ms, delivered after the reconfiguration, is stale.
        assert!(c.on_window_closed(ms(500)).is_empty());
        assert!(c.is_open() && c.holds(&"b"));
        assert_eq!(c.on_window_closed(ms(700)), vec!["b", "c"]);
        assert!(!c.is_open());
        // No window open: nothing to re-open.
        assert_eq!(c.on_applied(ms(800)), None);
        assert!(!c.is_open());
    }

    #[test]
    fn a_reconfiguration_that_took_no_time_leaves_the_deadline_alone() {
        let mut c: Coalescer<&str, Duration> = Coalescer::new(W);
        assert!(matches!(
            c.on_failure("a", ms(0)),
            OnFailure::ApplyNow { .. }
        ));
        assert_eq!(c.on_applied(ms(0)), None);
        // Never earlier than it was.
        assert_eq!(
            c.on_failure("b", ms(10)),
            OnFailure::Held { close_at: ms(200) }
        );
        assert_eq!(c.on_window_closed(ms(200)), vec!["b"]);
    }

    #[test]
    fn a_zero_window_applies_every_failure_at_once() {
        let times: Vec<Duration> = [0, 0, 0, 5].map(ms).to_vec();
        for close_first in [false, true] {
            let applied = simulate(Duration::ZERO, &times, close_first);
            assert!(applied.iter().all(|(at, b)| *at == times[b[0]]));
            assert_eq!(applied.iter().map(|(_, b)| b.len()).sum::<usize>(), 4);
        }
    }

    proptest! {
        /// Every failure is applied exactly once, and never later than the window after it
        /// was reported.
        #[test]
        fn every_failure_is_applied_once_within_the_window(
            window_ms in 0u64..500,
            times in sorted_times(400, 40),
            close_first in any::<bool>(),
        ) {
            let window = ms(window_ms);
            let applied = simulate(window, &times, close_first);
            let mut seen = vec![0; times.len()];
            for (at, batch) in &applied {
                for &i in batch {
                    seen[i] += 1;
                    prop_assert!(*at >= times[i]);
                    prop_assert!(*at - times[i] <= window, "failure {i} waited {:?}", *at - times[i]);
                }
            }
            prop_assert!(seen.iter().all(|&n| n == 1), "{seen:?}");
        }

        /// A burst of failures within one window is at most two reconfigurations: the first
        /// failure at once, the rest when the window closes.
        #[test]
        fn a_burst_within_one_window_is_at_most_two_reconfigurations(
            start in 0u64..10_000,
            offsets in prop::collection::vec(0u64..200, 1..64),
            close_first in any::<bool>(),
        ) {
            let mut times: Vec<Duration> = offsets.iter().map(|o| ms(start + o)).collect();
            times.sort();
            let applied = simulate(W, &times, close_first);
            prop_assert!(applied.len() <= 2, "{applied:?}");
            // The first failure is applied with no delay, on its own.
            prop_assert_eq!(&applied[0], &(times[0], vec![0]));
            if times.len() > 1 {
                prop_assert_eq!(applied.len(), 2);
                prop_assert_eq!(applied[1].0, times[0] + W);
            }
        }

        /// With reconfigurations slower (or faster) than the window, a burst of failures
        /// within one window of the first is still at most two reconfigurations: the
        /// failures queued behind the leading edge's reconfiguration are held, not each a
        /// leading edge of its own.
        #[test]
        fn a_burst_is_at_most_two_reconfigurations_however_slow_they_are(
            start in 0u64..10_000,
            offsets in prop::collection::vec(0u64..200, 1..64),
            apply_ms in 0u64..2_000,
            close_first in any::<bool>(),
        ) {
            let apply = ms(apply_ms);
            let mut times: Vec<Duration> = offsets.iter().map(|o| ms(start + o)).collect();
            times.sort();
            let (applied, _) = simulate_slow(W, &times, close_first, apply);
            prop_assert!(applied.len() <= 2, "{applied:?}");
            prop_assert_eq!(&applied[0], &(times[0], vec![0]));
            if times.len() > 1 {
                prop_assert_eq!(applied.len(), 2);
                prop_assert_eq!(applied[1].0, times[0] + apply + W);
            }
        }

        /// With slow reconfigurations every failure is still applied exactly once, at most
        /// the window after the coalescer saw it (once the handlers queued before it
        /// finished).
        #[test]
        fn every_failure_is_applied_once_however_slow_reconfigurations_are(
            window_ms in 0u64..500,
            times in sorted_times(400, 40),
            apply_ms in 0u64..1_000,
            close_first in any::<bool>(),
        ) {
            let (window, apply) = (ms(window_ms), ms(apply_ms));
            let (applied, seen_at) = simulate_slow(window, &times, close_first, apply);
            let mut seen = vec![0; times.len()];
            for (at, batch) in &applied {
                for &i in batch {
                    seen[i] += 1;
                    prop_assert!(*at >= seen_at[i] && seen_at[i] >= times[i]);
                    prop_assert!(*at - seen_at[i] <= window, "failure {i} waited {:?}", *at - seen_at[i]);
                }
            }
            prop_assert!(seen.iter().all(|&n| n == 1), "{seen:?}");
        }

        /// A lone failure (none other within a window of it) is one reconfiguration, applied
        /// with zero delay.
        #[test]
        fn a_lone_failure_is_one_reconfiguration_with_no_delay(
            at in 0u64..1_000_000,
            window_ms in 0u64..10_000,
            close_first in any::<bool>(),
        ) {
            let applied = simulate(ms(window_ms), &[ms(at)], close_first);
            prop_assert_eq!(applied, vec![(ms(at), vec![0])]);
        }

        /// Failures spaced wider than the window are each a leading edge: applied at once,
        /// one reconfiguration each.
        #[test]
        fn failures_further_apart_than_the_window_are_each_applied_at_once(
            gaps in prop::collection::vec(201u64..2_000, 1..20),
            close_first in any::<bool>(),
        ) {
            let mut t = 0;
            let times: Vec<Duration> = gaps.iter().map(|g| { t += g; ms(t) }).collect();
            let applied = simulate(W, &times, close_first);
            let expected: Vec<Applied> = times.iter().enumerate().map(|(i, at)| (*at, vec![i])).collect();
            prop_assert_eq!(applied, expected);
        }
    }
}
