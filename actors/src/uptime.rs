//! A node's uptime over a sliding window, measured from its heartbeats (DESIGN §3; paper §3.3
//! rule 3: "uptime in last 24 h ≥ 95 %").
//!
//! # What counts as up
//!
//! - The node's registration (`first_seen`) counts as its first heartbeat.
//! - After a heartbeat at `h`, the node is up from `h` until the next heartbeat `n` if
//!   `n − h ≤ timeout_ms`; if the gap is longer, only `[h, h + timeout_ms)` is up and the rest
//!   of the gap is down. This matches the failure detector: a silent node is presumed alive
//!   until its heartbeat timeout expires (DESIGN §3: heartbeats every 10 s, failure after
//!   30 s). The timeout used for a gap is the one given with the heartbeat that ends it.
//! - [`UptimeTracker::record_down`] at `d` (the node was declared failed, e.g. its stream
//!   closed) ends the current up stretch at `min(d, h + timeout_ms)`; the node is down from
//!   then until its next heartbeat.
//! - Since the last heartbeat, while not declared down, the node is up for at most the
//!   timeout given with that heartbeat ([`DEFAULT_TIMEOUT_MS`] before any heartbeat).
//! - A heartbeat or failure dated before the latest event recorded is out of order and
//!   ignored; so is a second `record_down` without a heartbeat in between.
//!
//! # The ratio: a downtime budget
//!
//! `uptime(now) = 1 − down time / window`, where down time is the observed time of
//! `[max(first_seen, now − window), now)` that is not up. Paper §3.3's rule "uptime in the
//! last 24 h ≥ 95 %" so reads as a budget of 72 min of downtime per 24 h; time before the
//! node joined is neither up nor down. An outage costs its length, whenever it happened:
//! a node back from a 15-s outage loses 15 s of its budget (0.02 %), not a share of the
//! few minutes it has been known, and the outage stops counting once it slides out of the
//! window. (The ratio over observed time alone, `up / observed`, which this replaced, made a
//! node seen 5 min ago with a 15-s outage 95 % up and one seen 1 min ago 75 %, excluded
//! until it had been up 20 times as long as it was down.) A node that is new and down
//! often is caught by the failure detector, which removes it from its ring at each outage.
//! With nothing observed yet (`now ≤ first_seen`) the uptime is 1.0.
//!
//! # Memory
//!
//! Up time is kept as disjoint, sorted intervals; adjacent ones are merged (regular
//! heartbeats make one interval), and intervals that ended before `latest event − window`
//! are pruned. At most [`MAX_INTERVALS`] are kept: beyond that the two closest are merged,
//! which can only overstate uptime by the (smallest) gap between them. Queries are expected
//! with `now` ≥ the latest recorded event; earlier queries may miss pruned history.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::types::Timestamp;

/// The default window: 24 hours, in ms (paper §3.3).
pub const DEFAULT_WINDOW_MS: u64 = 24 * 60 * 60 * 1000;

/// The heartbeat timeout assumed before the first [`UptimeTracker::record_heartbeat`]:
/// 30 s, in ms (DESIGN §3).
pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;

/// Most up-intervals a tracker keeps (see the module docs, "Memory").
pub const MAX_INTERVALS: usize = 4096;

/// Measures one node's uptime over a sliding window from its heartbeats (module docs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UptimeTracker {
    /// Window length, in ms.
    window_ms: u64,
    /// When the node was first seen (registered).
    first_seen: Timestamp,
    /// Closed up-intervals `[start, end)` in ms since the Unix epoch: sorted, disjoint,
    /// non-adjacent, all ending at or before `last_heartbeat`.
    intervals: VecDeque<(u64, u64)>,
    /// The latest accepted heartbeat (or `first_seen`): start of the current stretch.
    last_heartbeat: Timestamp,
    /// True while the node has not been declared down since `last_heartbeat`.
    open: bool,
    /// Timeout given with `last_heartbeat`, in ms.
    timeout_ms: u64,
    /// Latest accepted heartbeat or failure; earlier ones are out of order.
    last_event: Timestamp,
}

impl UptimeTracker {
    /// A tracker with a window of `window_ms` (ms; see [`DEFAULT_WINDOW_MS`]) for a node first
    /// seen at `first_seen`, which counts as its first heartbeat.
    pub fn new(window_ms: u64, first_seen: Timestamp) -> UptimeTracker {
        UptimeTracker {
            window_ms,
            first_seen,
            intervals: VecDeque::new(),
            last_heartbeat: first_seen,
            open: true,
            timeout_ms: DEFAULT_TIMEOUT_MS,
            last_event: first_seen,
        }
    }

    /// The window length, in ms.
    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }

    /// When the node was first seen.
    pub fn first_seen(&self) -> Timestamp {
        self.first_seen
    }

    /// How many closed up-intervals are held (for tests and metrics; ≤ [`MAX_INTERVALS`]).
    pub fn interval_count(&self) -> usize {
        self.intervals.len()
    }

    /// A heartbeat received at `at`, with the heartbeat timeout `timeout_ms` (ms) in force.
    /// The gap since the previous heartbeat is up when ≤ `timeout_ms`, else only its first
    /// `timeout_ms` are (module docs). Ignored when `at` is before the latest recorded event.
    pub fn record_heartbeat(&mut self, at: Timestamp, timeout_ms: u64) {
        if at < self.last_event {
            return;
        }
        if self.open {
            let start = self.last_heartbeat.0;
            let end = start.saturating_add(at.since(self.last_heartbeat).min(timeout_ms));
            self.push_up(start, end);
        }
        self.last_heartbeat = at;
        self.open = true;
        self.timeout_ms = timeout_ms;
        self.last_event = at;
        self.prune();
    }

    /// The node was declared failed at `at`: its current up stretch ends at
    /// `min(at, last heartbeat + timeout)` and it is down until its next heartbeat. Ignored
    /// when `at` is before the latest recorded event or the node is already down.
    pub fn record_down(&mut self, at: Timestamp) {
        if at < self.last_event || !self.open {
            return;
        }
        let start = self.last_heartbeat.0;
        let end = start.saturating_add(at.since(self.last_heartbeat).min(self.timeout_ms));
        self.push_up(start, end);
        self.open = false;
        self.last_event = at;
        self.prune();
    }

    /// True when the node has been declared down and not heard from since.
    pub fn is_down(&self) -> bool {
        !self.open
    }

    /// Uptime at `now`: `1 − down / window`, the down time being the part of
    /// `[max(first_seen, now − window), now)` that is not up; a fraction in [0, 1], 1.0 when
    /// nothing has been observed (module docs, "The ratio: a downtime budget").
    pub fn uptime(&self, now: Timestamp) -> f64 {
        let down = self.downtime_ms(now);
        if self.window_ms == 0 {
            return if down == 0 { 1.0 } else { 0.0 };
        }
        (1.0 - down as f64 / self.window_ms as f64).clamp(0.0, 1.0)
    }

    /// Down time within the window at `now`, in ms: the part of
    /// `[max(first_seen, now − window), now)` that is not up (module docs).
    pub fn downtime_ms(&self, now: Timestamp) -> u64 {
        let start = self.first_seen.0.max(now.0.saturating_sub(self.window_ms));
        let observed = now.0.saturating_sub(start);
        if observed == 0 {
            return 0;
        }
        let overlap = |s: u64, e: u64| e.min(now.0).saturating_sub(s.max(start));
        let mut up: u64 = self.intervals.iter().map(|&(s, e)| overlap(s, e)).sum();
        if self.open {
            let s = self.last_heartbeat.0;
            up = up.saturating_add(overlap(s, s.saturating_add(self.timeout_ms)));
        }
        observed.saturating_sub(up)
    }

    /// Appends the up-interval `[start, end)`, merging it with the last one when they touch.
    fn push_up(&mut self, start: u64, end: u64) {
        if end <= start {
            return;
        }
        if let Some(last) = self.intervals.back_mut() {
            if last.1 >= start {
                last.1 = last.1.max(end);
                return;
            }
        }
        self.intervals.push_back((start, end));
        if self.intervals.len() > MAX_INTERVALS {
            self.merge_closest();
        }
    }

    /// Drops intervals that ended before `last_event − window`: no query at or after the
    /// latest event can see them.
    fn prune(&mut self) {
        let cutoff = self.last_event.0.saturating_sub(self.window_ms);
        while self.intervals.front().is_some_and(|&(_, e)| e <= cutoff) {
            self.intervals.pop_front();
        }
    }

    /// Merges the two consecutive intervals with the smallest gap between them.
    fn merge_closest(&mut self) {
        let best = (1..self.intervals.len())
            .min_by_key(|&i| self.intervals[i].0.saturating_sub(self.intervals[i - 1].1));
        if let Some(i) = best {
            if let Some((_, end)) = self.intervals.remove(i) {
                if let Some(prev) = self.intervals.get_mut(i - 1) {
                    prev.1 = prev.1.max(end);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const T0: Timestamp = Timestamp(1_700_000_000_000);
    const HOUR: u64 = 3_600_000;
    const TO: u64 = 30_000;

    fn at(ms: u64) -> Timestamp {
        T0.plus_ms(ms)
    }

    #[test]
    fn nothing_observed_is_full() {
        let t = UptimeTracker::new(DEFAULT_WINDOW_MS, T0);
        assert_eq!(t.uptime(T0), 1.0);
        assert_eq!(t.uptime(Timestamp(0)), 1.0);
        assert_eq!(t.window_ms(), DEFAULT_WINDOW_MS);
        assert_eq!(t.first_seen(), T0);
    }

    #[test]
    fn new_node_not_penalised_for_before_it_joined() {
        let mut t = UptimeTracker::new(DEFAULT_WINDOW_MS, T0);
        for i in 1..=360 {
            t.record_heartbeat(at(i * 10_000), TO);
        }
        assert_eq!(t.uptime(at(HOUR)), 1.0);
        assert_eq!(t.interval_count(), 1);
    }

    /// A 200-s window keeps the fractions readable.
    const W: u64 = 200_000;

    #[test]
    fn silence_counts_up_only_until_timeout() {
        let t = UptimeTracker::new(W, T0);
        // No heartbeat for 60 s: up 30 s (default timeout), down 30 s of a 200-s window.
        assert_eq!(t.downtime_ms(at(60_000)), 30_000);
        assert_eq!(t.uptime(at(60_000)), 1.0 - 30.0 / 200.0);
        assert_eq!(t.uptime(at(20_000)), 1.0);
    }

    #[test]
    fn long_gap_counts_only_first_timeout() {
        let mut t = UptimeTracker::new(W, T0);
        t.record_heartbeat(at(100_000), TO); // gap 100 s: 30 s up, 70 s down
        assert_eq!(t.uptime(at(100_000)), 1.0 - 70.0 / 200.0);
        // A later heartbeat within timeout restores continuous uptime from 100 s.
        t.record_heartbeat(at(200_000), 100_000);
        assert_eq!(t.uptime(at(200_000)), 1.0 - 70.0 / 200.0);
    }

    #[test]
    fn record_down_then_back() {
        let mut t = UptimeTracker::new(W, T0);
        t.record_heartbeat(at(10_000), TO);
        t.record_down(at(15_000)); // stream closed: down from 15 s
        assert!(t.is_down());
        assert_eq!(t.downtime_ms(at(20_000)), 5_000);
        t.record_down(at(18_000)); // already down: ignored
        t.record_heartbeat(at(25_000), TO); // back at 25 s
        assert!(!t.is_down());
        assert_eq!(t.downtime_ms(at(35_000)), 10_000);
        assert_eq!(t.uptime(at(35_000)), 1.0 - 10.0 / 200.0);
    }

    #[test]
    fn a_short_outage_costs_its_length_and_a_long_one_is_forgiven_once_it_slides_out() {
        let rule = 0.95;
        // Known for one minute, then a 15-s outage (its stream closed): still eligible.
        let mut young = UptimeTracker::new(DEFAULT_WINDOW_MS, T0);
        for s in (10..=60).step_by(10) {
            young.record_heartbeat(at(s * 1_000), TO);
        }
        young.record_down(at(60_000));
        young.record_heartbeat(at(75_000), TO);
        assert_eq!(young.downtime_ms(at(80_000)), 15_000);
        assert!(young.uptime(at(80_000)) >= rule);
        // A node down for 2 h of the last 24 is over the 72-min budget...
        let mut old = UptimeTracker::new(DEFAULT_WINDOW_MS, T0);
        let mut now = 0;
        while now < 30 * HOUR {
            now += 10_000;
            if !(10 * HOUR..12 * HOUR).contains(&now) {
                old.record_heartbeat(at(now), TO);
            }
        }
        assert!(old.uptime(at(now)) < rule, "{}", old.uptime(at(now)));
        // ...until the outage is more than a window ago.
        while now < 37 * HOUR {
            now += 10_000;
            old.record_heartbeat(at(now), TO);
        }
        assert_eq!(old.uptime(at(now)), 1.0);
    }

    #[test]
    fn out_of_order_ignored() {
        let mut t = UptimeTracker::new(DEFAULT_WINDOW_MS, T0);
        t.record_heartbeat(at(20_000), TO);
        let before = t.clone();
        t.record_heartbeat(at(10_000), TO);
        t.record_down(at(5_000));
        assert_eq!(t, before);
    }

    #[test]
    fn window_slides_and_prunes() {
        let window = 10 * 60_000;
        let mut t = UptimeTracker::new(window, T0);
        t.record_heartbeat(at(120_000), TO); // 90 s down
        assert_eq!(t.uptime(at(120_000)), 1.0 - 90.0 / 600.0);
        let mut now = 120_000;
        while now < 20 * 60_000 {
            now += 10_000;
            t.record_heartbeat(at(now), TO);
        }
        // The gap (30 s .. 120 s) is more than a window ago.
        assert_eq!(t.uptime(at(now)), 1.0);
        assert_eq!(t.interval_count(), 1);
    }

    #[test]
    fn memory_bounded() {
        let mut t = UptimeTracker::new(u64::MAX, T0);
        for i in 0..(MAX_INTERVALS as u64 + 100) {
            t.record_heartbeat(at(i * 100_000), TO);
        }
        assert!(t.interval_count() <= MAX_INTERVALS);
        let u = t.uptime(at((MAX_INTERVALS as u64 + 100) * 100_000));
        assert!((0.0..=1.0).contains(&u));
    }

    #[test]
    fn serde_roundtrip() {
        let mut t = UptimeTracker::new(DEFAULT_WINDOW_MS, T0);
        t.record_heartbeat(at(100_000), TO);
        let text = serde_json::to_string(&t).expect("serialise");
        assert_eq!(
            serde_json::from_str::<UptimeTracker>(&text).expect("parse"),
            t
        );
    }

    #[derive(Clone, Debug)]
    enum Op {
        Beat(u64, u64),
        Down(u64),
    }

    fn arb_op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u64..200_000, 0u64..60_000).prop_map(|(dt, to)| Op::Beat(dt, to)),
            1 => (0u64..200_000).prop_map(Op::Down),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn always_in_unit_interval(
            window in 0u64..2_000_000,
            ops in prop::collection::vec((any::<bool>(), arb_op()), 0..80),
            queries in prop::collection::vec(0u64..20_000_000, 1..8),
        ) {
            let mut t = UptimeTracker::new(window, T0);
            let mut clock = 0u64;
            for (backwards, op) in ops {
                match op {
                    Op::Beat(dt, to) => {
                        let when = if backwards { clock.saturating_sub(dt) } else { clock + dt };
                        t.record_heartbeat(at(when), to);
                        clock = clock.max(when);
                    }
                    Op::Down(dt) => {
                        let when = if backwards { clock.saturating_sub(dt) } else { clock + dt };
                        t.record_down(at(when));
                        clock = clock.max(when);
                    }
                }
                for q in &queries {
                    let u = t.uptime(Timestamp(T0.0.saturating_sub(1_000_000) + q));
                    prop_assert!((0.0..=1.0).contains(&u), "uptime {}", u);
                }
            }
        }

        #[test]
        fn regular_heartbeats_give_full_uptime(
            period in 1u64..60_000,
            slack in 0u64..10_000,
            n in 1usize..500,
            window in 1u64..100_000_000,
        ) {
            let timeout = period + slack;
            let mut t = UptimeTracker::new(window, T0);
            for i in 1..=n as u64 {
                t.record_heartbeat(at(i * period), timeout);
            }
            let last = n as u64 * period;
            prop_assert_eq!(t.uptime(at(last)), 1.0);
            // Within the timeout after the last heartbeat, still 1.0.
            prop_assert_eq!(t.uptime(at(last + timeout)), 1.0);
        }

        #[test]
        fn one_gap_lowers_uptime_by_its_excess(
            period in 1_000u64..10_000,
            before in 1u64..200,
            after in 1u64..200,
            gap_extra in 1u64..1_000_000,
        ) {
            let timeout = 3 * period;
            let gap = timeout + gap_extra;
            let mut t = UptimeTracker::new(DEFAULT_WINDOW_MS, T0);
            let mut now = 0;
            for _ in 0..before {
                now += period;
                t.record_heartbeat(at(now), timeout);
            }
            now += gap;
            t.record_heartbeat(at(now), timeout);
            for _ in 0..after {
                now += period;
                t.record_heartbeat(at(now), timeout);
            }
            // The whole history fits in the window: the gap's excess is its down time.
            prop_assert!(now < DEFAULT_WINDOW_MS);
            let expected = 1.0 - (gap - timeout) as f64 / DEFAULT_WINDOW_MS as f64;
            let got = t.uptime(at(now));
            prop_assert!((got - expected).abs() < 1e-9, "got {} expected {}", got, expected);
        }

        #[test]
        fn monotone_in_the_set_of_heartbeats(
            beats in prop::collection::btree_set(1u64..2_000_000, 0..60),
            keep in prop::collection::vec(any::<bool>(), 60),
            timeout in 0u64..100_000,
            window in 1u64..3_000_000,
            extra in 0u64..500_000,
        ) {
            let all: Vec<u64> = beats.iter().copied().collect();
            let subset: Vec<u64> = all
                .iter()
                .zip(keep.iter())
                .filter(|(_, k)| **k)
                .map(|(b, _)| *b)
                .collect();
            let build = |hb: &[u64]| {
                let mut t = UptimeTracker::new(window, T0);
                t.record_heartbeat(T0, timeout); // same timeout from the start in both
                for &b in hb {
                    t.record_heartbeat(at(b), timeout);
                }
                t
            };
            let small = build(&subset);
            let big = build(&all);
            let now = at(all.last().copied().unwrap_or(0) + extra);
            prop_assert!(big.uptime(now) >= small.uptime(now));
        }
    }
}
